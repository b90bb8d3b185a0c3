"""The AP-Tree (paper 002, Sect. 3): adaptive keyword/spatial partition tree over subscriptions."""

from shard.aptree.tree import APTree, EncodedMessages, encode_messages

__all__ = ["APTree", "EncodedMessages", "encode_messages"]
