"""The AP-Tree (paper 002, Sect. 3): adaptive keyword/spatial partition tree over subscriptions."""

from shard.aptree.tree import APTree, EncodedMessages

__all__ = ["APTree", "EncodedMessages"]
