"""The coordinator's table of live messages: every stored message (ttl > 0) not yet expired,
its expiry, and for a message stored on several shards who holds it.

A stored message is live from the round that routes it (``add``) to the round whose answers
from all its shards brought its REMOVEs (``expire``). A message on several shards (a region
message whose box meets more than one) is reported by each of them for the same subscription,
so for those the table keeps, per subscription slot, how many shards hold the pair
(``holders``): ``coordinator.netting`` delivers only when a count crosses zero. A message past
its expiry that some of its shards expired while others did not answer is *owed* by the
others: kept, its expiry put off a tick at a time, until they have expired it too.

Pure bookkeeping (no I/O, no event loop): the engine calls it from its round loop.

>>> live = LiveMessages(tick_s=0.25)
>>> from shard.model import Message, Point
>>> live.add(Message("m", ("a",), Point(1.0, 2.0), 5.0), b"p", now=10.0, shards=1)
>>> live["m"][2], len(live), "m" in live
(15.0, 1, True)
>>> live.expire(14.0, {0}, 1, shards_of=lambda m: [0])
[]
>>> live.expire(15.0, {0}, 1, shards_of=lambda m: [0])
['m']
>>> len(live)
0
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence

from shard.model import Message

Entry = tuple[Message, bytes, float]
"""A live message: the message, its serialized payload, its expiry."""

REPLAY_MIN_TTL_S = 1e-3
"""A message stored again after its expiry has passed is stored this long, so that the next
round expires it and its holders get their REMOVEs."""


class LiveMessages(Mapping[str, Entry]):
    """Message id -> (message, payload, expiry) of the stored messages not yet expired, with
    their expiry heap, the shard counts of the messages on several shards and what is owed."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        """How far an owed message's expiry is put off at a time."""
        self._entries: dict[str, Entry] = {}
        self._heap: list[tuple[float, str]] = []
        self.holders: dict[str, dict[int, int]] = {}
        """A message stored on several shards -> subscription slot -> shards holding the pair."""
        self.owed: dict[str, frozenset[int]] = {}
        """Messages past their expiry that some of their shards have expired (and told their
        holders) while others did not answer: the shards still to expire them."""

    # ---- the mapping -------------------------------------------------------------------------
    def __getitem__(self, msg_id: str) -> Entry:
        return self._entries[msg_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._entries

    def get(self, msg_id: str, default=None):  # (faster than Mapping's, on the hot path)
        return self._entries.get(msg_id, default)

    # ---- changes -----------------------------------------------------------------------------
    def add(self, m: Message, payload: bytes, now: float, shards: int) -> None:
        """Message ``m`` (ttl > 0) stored at ``now`` on ``shards`` shards."""
        expiry = now + m.ttl
        self._entries[m.id] = (m, payload, expiry)
        heapq.heappush(self._heap, (expiry, m.id))
        if shards > 1:
            self.holders[m.id] = {}

    def stored_again(self, msg_id: str, now: float) -> float:
        """The ttl live message ``msg_id`` is stored again with at ``now`` (a reloaded shard):
        until its expiry, or if that has passed, ``REPLAY_MIN_TTL_S``, its expiry put off to
        match (so that it is forgotten in the round where the shard expires it)."""
        m, payload, e = self._entries[msg_id]
        ttl = e - now
        if ttl < REPLAY_MIN_TTL_S:
            ttl = REPLAY_MIN_TTL_S
            self._entries[msg_id] = (m, payload, now + ttl)
            heapq.heappush(self._heap, (now + ttl, msg_id))
        return ttl

    def forget(self, msg_id: str) -> None:
        """A stored message that failed wherever it went is not live (its heap entry is
        skipped when it comes up)."""
        self._entries.pop(msg_id, None)
        self.holders.pop(msg_id, None)
        self.owed.pop(msg_id, None)

    def drop_slot(self, slot: int | None) -> None:
        """An unsubscribed subscription's slot holds nothing any more (its counts go)."""
        for counts in self.holders.values():
            counts.pop(slot, None)

    def expire(
        self,
        now: float,
        answered: set[int],
        n_shards: int,
        shards_of: Callable[[Message], Sequence[int]],
        owed_changes: list[tuple[str, frozenset[int]]] | None = None,
    ) -> list[str]:
        """Forget the messages expired by ``now`` and return their ids. A message is forgotten
        in the round whose answers from its shards brought its REMOVEs: one stored in a shard
        not in ``answered`` (down, failed, or lost) is kept, its expiry put off by ``tick_s``
        at a time, and the reloaded shard gets it back (``stored_in``) and expires it; the
        shards that did answer have expired it and told its holders, so neither a reload nor
        a restart stores it there again (``owed``; each change appended to ``owed_changes``,
        written with the round). ``n_shards``: how many shards there are."""
        out: list[str] = []
        later: list[tuple[str, Entry]] = []
        entries, heap, owed = self._entries, self._heap, self.owed
        everyone = len(answered) >= n_shards
        while heap and heap[0][0] <= now:
            t, m = heapq.heappop(heap)
            got = entries.get(m)
            if got is None or got[2] != t:  # (an entry left behind)
                continue
            if not everyone:
                held = owed[m] if m in owed else shards_of(got[0])
                left = frozenset(k for k in held if k not in answered)
                if left:
                    if owed.get(m) != left:
                        owed[m] = left
                        if owed_changes is not None:
                            owed_changes.append((m, left))
                    later.append((m, got))
                    continue
            del entries[m]
            self.holders.pop(m, None)
            owed.pop(m, None)
            out.append(m)
        for m, (msg, payload, _) in later:
            t = now + self.tick_s
            entries[m] = (msg, payload, t)
            heapq.heappush(heap, (t, m))
        return out

    def stored_in(self, k: int, shards_of: Callable[[Message], Sequence[int]]) -> list[Entry]:
        """The live messages shard ``k`` stores (not those past their expiry that it has
        expired already: ``owed``)."""
        owed = self.owed
        return [
            e
            for e in self._entries.values()
            if k in (owed[e[0].id] if e[0].id in owed else shards_of(e[0]))
        ]
