"""Top-k publishes in the cluster (paper 001, ``shard.topk``): a message delivered to the k
top-k subscriptions (``Subscription.topk``) that score it highest, over every shard.

A top-k subscription lives on one shard, the owner of its point (``Router.shards_of_region``).
A top-k publish goes to every shard (``route``); each answers with its own k best, tags and
scores (``shard.topk.hosted``), and the coordinator merges those lists into the global k
(``merge``): the k best over all shards are among the union of each shard's k best, so the
merge is exact. The rule of every index decides ties: score descending, then subscription id.
A bound-driven exchange (asking the shards again only for what can still beat the k-th) would
send fewer scores back, but each shard's answer is at most k pairs of 12 bytes in the round
trip every publish makes anyway: encoding, decoding and merging them took 16 µs at k = 5 and
0.23 ms at k = 1,000 over 2 shards (0.46 ms over 8) (docs/BENCHMARKS.md, "[2.8] The 1M failure ..."), against
7-19 ms for a round trip, which a second exchange would add. So one exchange it is.

A top-k publish needs every shard: while one is down its answer is missing and the publish
fails with UNAVAILABLE (nothing is delivered, nothing stored: a retry is safe).

Each top-k publish is a search of its own at every shard (1-20 ms at 100K-500K top-k
subscriptions a shard, measured), against microseconds for a plain one, so a round takes at most
``TOPK_PER_ROUND`` of them (``round_cut``): a full round of top-k publishes (the 1,024 of a
2-shard cluster) had each shard search for ~20 s, past the shard call limit, and the
coordinator took both shards for dead.

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

TOPK_PER_ROUND = 16
"""Top-k publishes in one round at most: 16 searches of 20 ms keep a shard's call at ~0.3 s,
far below its limit (``deadline_s`` x ``coordinator.shards.SHARD_CALL_SHARE``) also with
``ROUNDS_IN_FLIGHT`` rounds queued at it; more a round would not answer them sooner (each is
searched on its own)."""


def round_cut(pending: Sequence, cap: int, per_round: int = TOPK_PER_ROUND) -> int:
    """How many of the waiting operations ``pending`` the next round takes: ``cap`` (or all),
    cut before the top-k publish (``op.kind == "topk"``) one past ``per_round``. O(cap).

    >>> from types import SimpleNamespace as Op
    >>> ops = [Op(kind=k) for k in ["pub", "topk", "topk", "pub", "topk"]]
    >>> round_cut(ops, 10, per_round=2), round_cut(ops, 3, per_round=2), round_cut(ops, 10)
    (4, 3, 5)
    """
    n = min(cap, len(pending))
    seen = 0
    for i in range(n):
        if pending[i].kind == "topk":
            seen += 1
            if seen > per_round:
                return i
    return n


def route(op, send: Callable[[int, tuple], None], n_shards: int) -> None:
    """A top-k publish (``op.arg`` the message, ``op.k``) to every shard."""
    for k in range(n_shards):
        send(k, ("topk", op.arg, op.k))


def merge(parts: Sequence[TopKAnswer], k: int, ids: Sequence[str | None]) -> list[int]:
    """The tags (slots) of the global ``k`` best over the shards' answers, best first: score
    descending, then subscription id (``ids[tag]``); a subscription answered by two shards
    counts once. The pairs are ordered by score in numpy; only runs of equal scores are
    ordered by id, and only until k are taken. O(shards · k log)."""
    if not parts:
        return []
    scores = np.concatenate([p.scores for p in parts])
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order].tolist()
    tags = np.concatenate([p.tags for p in parts])[order].tolist()
    out: list[int] = []
    seen: set[int] = set()
    i, n = 0, len(tags)
    while i < n and len(out) < k:
        j = i + 1
        while j < n and ranked[j] == ranked[i]:
            j += 1
        run = tags[i:j]
        if j - i > 1:  # a tie: the smaller id first
            run.sort(key=lambda t: ids[t] or "")
        for tag in run:
            if tag in seen or ids[tag] is None:
                continue
            seen.add(tag)
            out.append(tag)
            if len(out) == k:
                break
        i = j
    return out
