"""``TopKHold``: a shard's top-k subscriptions (paper 001) in an R^I-tree, beside its
spatial-keyword index.

A top-k subscription (``Subscription.topk``: a point, weighted predicates, α) has no result set:
it only takes part in top-k publishes, which ask every shard for its own k best
(``topk_batch``); the coordinator merges those lists into the global k
(``coordinator.topk``). So subscribing, replacing, detaching and moving one give no updates;
a move re-files its point (delete and insert in the tree, the design of ``shard.topk.ritree``).

Each subscription keeps the tag the coordinator gave it (``shard.ops``): an answer is the tags
and scores of the k best, ties by subscription id (``shard.topk.model.ranked``).

>>> from shard.model import Message, Point, subscription_from_dict
>>> hold = TopKHold()
>>> hold.add([subscription_from_dict({"id": "t", "point": [0, 0], "alpha": 0.5,
...     "predicates": [{"attr": "a", "op": "=", "value": 1}]})], [7])
>>> [(a.tags.tolist(), a.scores.tolist()) for a in hold.topk_batch(
...     [Message("e", (), Point(0, 0), attributes=(("a", 1.0),))], [3])]
[([7], [1.0])]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from shard.model import Message, Point, Subscription, TopKAnswer
from shard.topk.model import TopKEvent, TopKSubscription
from shard.topk.ritree import RITree


def as_topk(sub: Subscription) -> TopKSubscription:
    """The R^I-tree's form of a top-k subscription (``Subscription.topk``)."""
    assert type(sub.region) is Point
    return TopKSubscription(sub.id, sub.predicates, sub.alpha, sub.region)


TERM_ATTR = "#"
"""A top-k publish's message terms count as attributes ``#<term>`` = 1 (unless it has an
attribute of that name), so a top-k subscription scores keywords with predicates like
``{"attr": "#coffee", "op": "=", "value": 1, "weight": 2}``."""


def as_event(msg: Message) -> TopKEvent:
    """The R^I-tree's form of a top-k publish's message (a point: checked by the caller): its
    attributes, and its terms as ``TERM_ATTR`` attributes.

    >>> as_event(Message("e", ("tea",), Point(0, 0), attributes=(("p", 2.0),))).attributes
    (('#tea', 1.0), ('p', 2.0))
    """
    assert type(msg.location) is Point
    if not msg.terms:
        return TopKEvent(msg.id, msg.attributes, msg.location)
    attrs = dict(msg.attributes)
    for t in msg.terms:
        attrs.setdefault(TERM_ATTR + t, 1.0)
    return TopKEvent(msg.id, tuple(sorted(attrs.items())), msg.location)


class TopKHold:
    """The top-k subscriptions of one shard, their tags, and where the moving ones are."""

    def __init__(self) -> None:
        self.tree: RITree | None = None
        """Created with the first subscription (a shard without any pays nothing)."""
        self.subs: dict[str, Subscription] = {}
        self.tag: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.subs)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.subs

    def add(self, subs: Sequence[Subscription], tags: Sequence[int]) -> None:
        """File (or replace) top-k subscriptions with their tags. A batch of at least a
        quarter of what the hold has (a first one, a bulk registration) rebuilds the tree with
        the bulk path (``RITree.build``, ~15 µs a subscription); a smaller one is inserted one
        by one (``RITree.subscribe``: its path patched by a compiled kernel, ~0.1-0.25 ms
        each at 100K-520K, up to ~1 ms while it splits the full leaves of a bulk build)."""
        if not subs:
            return
        if self.tree is None or 4 * len(subs) >= len(self.subs):
            for s, t in zip(subs, tags, strict=True):
                self.subs[s.id] = s
                self.tag[s.id] = t
            self.tree = RITree.build([as_topk(s) for s in self.subs.values()])
            return
        for s, t in zip(subs, tags, strict=True):
            self.tree.subscribe(as_topk(s))  # a known id is replaced
            self.subs[s.id] = s
            self.tag[s.id] = t

    def remove(self, sub_id: str) -> None:
        if self.subs.pop(sub_id, None) is not None:
            del self.tag[sub_id]
            assert self.tree is not None
            self.tree.unsubscribe(sub_id)

    def move(self, moves: Sequence[tuple[str, Point]]) -> None:
        """Re-file moving subscriptions at new points, in order."""
        assert self.tree is not None or not moves
        for sid, p in moves:
            sub = self.subs[sid] = dataclasses.replace(self.subs[sid], region=p)
            self.tree.subscribe(as_topk(sub))  # type: ignore[union-attr]

    def topk_batch(self, messages: Sequence[Message], ks: Sequence[int]) -> list[TopKAnswer]:
        """Each message's ``ks[i]`` best subscriptions here, as tags and scores (score
        descending, ties by id). One compiled search for the batch (with the largest k: the
        tie rule makes a smaller k's answer a prefix of it)."""
        if not messages:
            return []
        if self.tree is None or not self.subs:
            empty = TopKAnswer(np.zeros(0, np.int32), np.zeros(0, np.float64))
            return [empty] * len(messages)
        found = self.tree.topk_batch([as_event(m) for m in messages], max(ks))
        tag = self.tag
        return [
            TopKAnswer(
                np.fromiter((tag[sid] for sid, _ in best[:k]), np.int32, min(k, len(best))),
                np.fromiter((s for _, s in best[:k]), np.float64, min(k, len(best))),
            )
            for best, k in zip(found, ks, strict=True)
        ]

    def check_invariants(self) -> None:
        if self.tree is not None:
            self.tree._check()
            assert set(self.tree.columns.slot_of) == set(self.subs)
        assert set(self.tag) == set(self.subs)
