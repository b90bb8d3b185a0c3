"""Top-k publishes in the cluster (paper 001, ``shard.topk``): a message delivered to the k
top-k subscriptions (``Subscription.topk``) that score it highest, over every shard.

A top-k subscription lives on one shard, the owner of its point (``Router.shards_of_region``).
A top-k publish goes to every shard (``route``); each answers with its own k best, tags and
scores (``shard.topk.hosted``), and the coordinator merges those lists into the global k
(``merge``): the k best over all shards are among the union of each shard's k best, so the
merge is exact. The rule of every index decides ties: score descending, then subscription id.
A bound-driven exchange (asking the shards again only for what can still beat the k-th) would
send fewer scores back, but each shard's answer is at most k pairs of 12 bytes in the round
trip every publish makes anyway, so one exchange it is.

A top-k publish needs every shard: while one is down its answer is missing and the publish
fails with UNAVAILABLE (nothing is delivered, nothing stored: a retry is safe).

>>> from shard.model import TopKAnswer
>>> import numpy as np
>>> ids = ["a", "b", "c", "d"]
>>> parts = [TopKAnswer(np.array([0, 1], np.int32), np.array([0.9, 0.5])),
...          TopKAnswer(np.array([3, 2], np.int32), np.array([0.9, 0.7]))]
>>> merge(parts, 3, ids)
[0, 3, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shard.model import TopKAnswer


def route(op, send: Callable[[int, tuple], None], n_shards: int) -> None:
    """A top-k publish (``op.arg`` the message, ``op.k``) to every shard."""
    for k in range(n_shards):
        send(k, ("topk", op.arg, op.k))


def merge(parts: Sequence[TopKAnswer], k: int, ids: Sequence[str | None]) -> list[int]:
    """The tags (slots) of the global ``k`` best over the shards' answers, best first: score
    descending, then subscription id (``ids[tag]``); a subscription answered by two shards
    counts once. O(shards · k log)."""
    if not parts:
        return []
    tags = np.concatenate([p.tags for p in parts]).tolist()
    scores = np.concatenate([p.scores for p in parts]).tolist()
    best = sorted(zip(scores, tags, strict=True), key=lambda st: (-st[0], ids[st[1]] or ""))
    out: list[int] = []
    seen: set[int] = set()
    for _, tag in best:
        if tag in seen or ids[tag] is None:
            continue
        seen.add(tag)
        out.append(tag)
        if len(out) == k:
            break
    return out
