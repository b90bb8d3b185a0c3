"""The AP+-Tree: the AP-Tree with m-lists of live messages, for moving subscriptions (Sect. 4)."""

from shard.applus.tree import APPlusTree, recentre

__all__ = ["APPlusTree", "recentre"]
