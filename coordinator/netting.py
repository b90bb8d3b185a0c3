"""Cross-shard netting: the shards' updates of one operation made into exact deliveries.

A subscription lives on every shard its region's box meets, and a region message is stored on
every shard its box meets, so several shards can report the same (subscription, message) pair.
For a message stored on several shards ``coordinator.live`` keeps how many shards hold each
pair; an operation's updates are netted over all shards and a delivery is made only when that
count crosses zero. An operation's REMOVEs come before its ADDs, so a move that crosses a shard
boundary gives exactly the ± difference the in-process AP+-Tree gives. A message on one shard
needs no counts: its updates are its deliveries.

>>> from coordinator.live import LiveMessages
>>> from coordinator.rounds import Round
>>> from shard.model import ADD, REMOVE, Message, Rect
>>> live = LiveMessages(tick_s=0.25)
>>> live.add(Message("m", ("a",), Rect(0, 0, 2, 1), 9.0), b"p", now=0.0, shards=2)
>>> r = Round(0.0)
>>> net([(7, ADD, "m"), (7, ADD, "m")], r, live)   # two shards reach slot 7: one ADD
>>> net([(7, REMOVE, "m")], r, live)               # one of them loses it: still held
>>> r.subs, r.kinds, live.holders["m"]
([7], [ADD], {7: 1})
"""

from __future__ import annotations

import numpy as np

from coordinator.live import LiveMessages
from coordinator.rounds import Round
from shard.model import ADD, REMOVE, Sign


def net(
    ups: list[tuple[int, Sign, str]],
    rnd: Round,
    live: LiveMessages,
    own: tuple[str, bytes] | None = None,
    deliver: bool = True,
) -> None:
    """Net one operation's updates (subscription slot, sign, message id) over the shards and
    append its deliveries to ``rnd`` (``deliver`` False: only count who holds what). ``own``:
    the operation's own message and payload, if it is a publish (an ADD of any other message
    takes its payload from ``live``)."""
    if not ups:
        return
    d_of: dict[tuple[int, str], int] = {}
    for s, g, m in ups:
        key = (s, m)
        d_of[key] = d_of.get(key, 0) + (1 if g == ADD else -1)
    holders = live.holders
    adds: list[tuple[int, str]] = []  # an operation's REMOVEs come before its ADDs
    for (s, m), d in d_of.items():
        counts = holders.get(m)
        if counts is not None:
            old = counts.get(s, 0)
            new = old + d
            if new:
                counts[s] = new
            else:
                counts.pop(s, None)
            if (old > 0) == (new > 0) or not deliver:
                continue
            add = new > 0
        elif d == 0:
            continue
        else:
            add = d > 0
        if add:
            if m not in rnd.payloads:
                rnd.payloads[m] = (
                    own[1] if own is not None and own[0] == m else live.get(m, (None, b"", 0.0))[1]
                )
            adds.append((s, m))
        else:
            rnd.add(s, REMOVE, m)
    for s, m in adds:
        rnd.add(s, ADD, m)


def expirations(
    parts: list[tuple[list[str], np.ndarray, np.ndarray]],
    rnd: Round,
    live: LiveMessages,
    placed: np.ndarray,
) -> None:
    """The shards' expirations (``shard.ops.Expired``: ids, holders per id, the holders'
    slots), first in a round: REMOVEs of each expired message from its holders still placed
    (``placed[slot]``; a shard may report one just unsubscribed); a message on several shards
    netted, the others added as they come."""
    holders = live.holders
    several: list[tuple[int, Sign, str]] = []
    for mids, counts, tags in parts:
        if not mids:
            continue
        keep = (tags >= 0) & placed[np.maximum(tags, 0)]
        ends = np.cumsum(counts).tolist()
        start = 0
        for mid, end in zip(mids, ends, strict=True):
            held = tags[start:end][keep[start:end]].tolist()
            start = end
            if not held:
                continue
            if mid in holders:
                several += [(s, REMOVE, mid) for s in held]
            else:
                rnd.extend_removes(held, mid)
    if several:
        net(several, rnd, live)
