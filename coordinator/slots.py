"""Every registered subscription as a small integer, its *slot*, and the delivery stage's
per-subscription state as arrays indexed by slot.

The shards report a publish's deliveries as slots (``ShardState.publish_tagged``: the slot is
the tag the engine gives each subscription it places), so the delivery stage numbers a round
with one compiled pass (``number``) and finds the durable and the followed deliveries with array
look-ups: nothing per delivery goes through a dictionary keyed by id. Ids are looked up only
where a delivery leaves as a message (a log entry, a stream, a move's answer).

A slot is taken when a subscription is placed (``slot``) and given back when its removal has
gone through the delivery stage (``release``); a freed slot is reused, its state reset.

Numbering never goes back: a subscription placed again (after an unsubscribe, or a restart)
continues from the sequence it had (``bases``), and a new one starts at 0; its chain in the
retention log (``head``) starts afresh when it is placed anew. An id unsubscribed and subscribed
again is a new subscription: the sequence its unsubscribe ended at is its ``floor``, and what
was numbered up to it (the old subscription's deliveries) is never read back to it.

>>> t = Slots()
>>> t.slot("a"), t.slot("b"), t.slot("a")
(0, 1, 0)
>>> t.seq[0] = 5; t.release("a"); t.slot("c"), t.ids[0], int(t.seq[0])
(0, 'c', 0)
>>> int(t.seq[t.slot("a")])
5
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit


class Slots:
    def __init__(self, capacity: int = 1024) -> None:
        self.slot_of: dict[str, int] = {}
        self.ids: list[str | None] = []
        self.pool = np.zeros(1 << 16, np.uint8)
        """Every slot's id, encoded, back to back (``directory`` copies them into a round's
        blob without a Python object per id); ``poff`` / ``plen`` by slot locate them."""
        self._pool_end = 0
        self._pool_dead = 0
        self.bases: dict[str, int] = {}
        """Where numbering continues for subscriptions without a slot (unsubscribed, or known
        from the log at start but not placed)."""
        self._free: list[int] = []
        self.ephemeral: set[str] = set()
        """Subscriptions whose deliveries skip the retention log (registered or not)."""
        self.followed_ids: set[str] = set()
        """Subscriptions with an open result stream (registered or not)."""
        self.seq = np.zeros(capacity, np.int64)
        """The last sequence number given to each slot's deliveries."""
        self.head = np.zeros(capacity, np.int64)
        """The round of the slot's newest record in the retention log (0: none)."""
        self.floor = np.zeros(capacity, np.int64)
        """The last sequence number of an earlier subscription under the slot's id (the one
        it had when that subscription was unsubscribed; 0: none)."""
        self.epoch = np.zeros(capacity, np.int64)
        """Which subscription under the slot's id this is: a number given out anew (``new_epoch``)
        when the slot is taken and when its subscription is unsubscribed (a stream follows one)."""
        self._epochs = 0
        self.lease = np.zeros(capacity, np.int64)
        """The highest sequence an ephemeral slot may reach before its lease is extended in
        Redis (``coordinator.retention``)."""
        self.poff = np.zeros(capacity, np.int64)
        self.plen = np.zeros(capacity, np.int64)
        self.durable = np.zeros(capacity, np.bool_)
        self.followed = np.zeros(capacity, np.bool_)
        self.placed = np.zeros(capacity, np.bool_)
        """Whether the slot's subscription is in the routing (the engine sets it): the shards'
        expirations are kept only for these (a shard may report one just unsubscribed)."""
        self.refreshed = np.full(capacity, -np.inf)
        """When the slot's log expiry was last set (by this process)."""

    def __len__(self) -> int:
        return len(self.slot_of)

    def slot(self, sub_id: str) -> int:
        """The subscription's slot, taken now if it has none."""
        s = self.slot_of.get(sub_id)
        if s is not None:
            return s
        if self._free:
            s = self._free.pop()
            self.ids[s] = sub_id
        else:
            s = len(self.ids)
            self.ids.append(sub_id)
            if s >= self.seq.shape[0]:
                self._grow(2 * s)
        self.slot_of[sub_id] = s
        self._pool_put(s, sub_id.encode())
        self.seq[s] = self.lease[s] = self.floor[s] = self.bases.pop(sub_id, 0)
        self.head[s] = 0
        self.epoch[s] = self.new_epoch()
        self.durable[s] = sub_id not in self.ephemeral
        self.followed[s] = sub_id in self.followed_ids
        self.refreshed[s] = -np.inf
        return s

    def new_epoch(self) -> int:
        self._epochs += 1
        return self._epochs

    def release(self, sub_id: str) -> None:
        s = self.slot_of.pop(sub_id, None)
        if s is not None:
            self.bases[sub_id] = int(max(self.seq[s], self.lease[s]))
            self._pool_dead += int(self.plen[s])
            self.plen[s] = 0
            self.ids[s] = None
            self.durable[s] = self.followed[s] = self.placed[s] = False
            self._free.append(s)

    def keep_only(self, ids: Iterable[str]) -> None:
        """Release every slot whose subscription is not in ``ids`` (after a reload)."""
        keep = set(ids)
        for sid in [s for s in self.slot_of if s not in keep]:
            self.release(sid)

    def id_bytes(self, s: int) -> bytes:
        """Slot ``s``'s id, encoded."""
        o = int(self.poff[s])
        return self.pool[o : o + int(self.plen[s])].tobytes()

    def _pool_put(self, s: int, b: bytes) -> None:
        end = self._pool_end
        if end + len(b) > self.pool.shape[0]:
            if self._pool_dead > end // 2:  # mostly released ids: compact instead of growing
                self._compact()
                end = self._pool_end
            if end + len(b) > self.pool.shape[0]:
                grown = np.zeros(max(2 * self.pool.shape[0], end + len(b)), np.uint8)
                grown[:end] = self.pool[:end]
                self.pool = grown
        self.pool[end : end + len(b)] = np.frombuffer(b, np.uint8)
        self.poff[s] = end
        self.plen[s] = len(b)
        self._pool_end = end + len(b)

    def _compact(self) -> None:
        live = [s for s, sid in enumerate(self.ids) if sid is not None and self.plen[s]]
        pool = np.zeros_like(self.pool)
        end = 0
        for s in live:
            o, n = int(self.poff[s]), int(self.plen[s])
            pool[end : end + n] = self.pool[o : o + n]
            self.poff[s] = end
            end += n
        self.pool, self._pool_end, self._pool_dead = pool, end, 0

    def restore(
        self,
        heads: dict[str, tuple[int, int]],
        leases: dict[str, int],
        cuts: dict[str, int] | None = None,
    ) -> None:
        """Continue every subscription's numbering and log chain from what the retention log
        held at start: (newest round, last sequence), the ephemeral leases and where the last
        unsubscribe of each id ended (``cuts``: its floor, if the id is placed again)."""
        slot_of = self.slot_of
        for sid, q in (cuts or {}).items():
            s = slot_of.get(sid)
            if s is None:
                self.bases[sid] = max(q, self.bases.get(sid, 0))
            else:
                self.floor[s] = max(self.floor[s], q)
                self.seq[s] = max(self.seq[s], q)
        for sid, (round_, seq) in heads.items():
            s = slot_of.get(sid)
            if s is None:
                self.bases[sid] = max(seq, self.bases.get(sid, 0))
            else:
                self.head[s] = round_
                self.seq[s] = max(self.seq[s], seq)
        for sid, q in leases.items():
            s = slot_of.get(sid)
            if s is None:
                self.bases[sid] = max(q, self.bases.get(sid, 0))
            else:
                self.seq[s] = max(self.seq[s], q)
                self.lease[s] = self.seq[s]

    def set_ephemeral(self, sub_id: str, ephemeral: bool) -> None:
        (self.ephemeral.add if ephemeral else self.ephemeral.discard)(sub_id)
        s = self.slot_of.get(sub_id)
        if s is not None:
            self.durable[s] = not ephemeral

    def replace_ephemeral(self, ids: set[str]) -> None:
        self.ephemeral = set(ids)
        for sid, s in self.slot_of.items():
            self.durable[s] = sid not in self.ephemeral

    def set_followed(self, sub_id: str, followed: bool) -> None:
        (self.followed_ids.add if followed else self.followed_ids.discard)(sub_id)
        s = self.slot_of.get(sub_id)
        if s is not None:
            self.followed[s] = followed

    def _grow(self, cap: int) -> None:
        for name, fill in (
            ("seq", 0),
            ("head", 0),
            ("floor", 0),
            ("epoch", 0),
            ("lease", 0),
            ("poff", 0),
            ("plen", 0),
            ("durable", False),
            ("followed", False),
            ("placed", False),
        ):
            old = getattr(self, name)
            new = np.full(cap, fill, old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        old = self.refreshed
        self.refreshed = np.full(cap, -np.inf)
        self.refreshed[: old.shape[0]] = old


@njit(cache=True)
def number(seq: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Give each delivery the next sequence number of its slot, in order (``seq`` advances).

    >>> seq = np.zeros(3, np.int64)
    >>> number(seq, np.array([2, 0, 2])).tolist(), seq.tolist()
    ([1, 1, 2], [1, 0, 2])
    """
    out = np.empty(slots.shape[0], np.int64)
    for i in range(slots.shape[0]):
        s = slots[i]
        n = seq[s] + 1
        seq[s] = n
        out[i] = n
    return out


@njit(cache=True)
def directory(pool, poff, plen, slots):
    """A round blob's DIR for ``slots`` ("\n" id "\n" id ... "\n", ids from ``pool``) and
    each id's offset in it (of the "\n" before it)."""
    total = 1
    for s in slots:
        total += plen[s] + 1
    out = np.empty(total, np.uint8)
    doff = np.empty(slots.shape[0], np.uint32)
    p = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        doff[i] = p
        out[p] = 10
        p += 1
        o = poff[s]
        n = plen[s]
        out[p : p + n] = pool[o : o + n]
        p += n
    out[p] = 10
    return out, doff


def warm_up() -> None:
    """Load the delivery stage's compiled kernels (from numba's on-disk cache, or compile them)
    with the types a round calls them with. numba's first call in a process also sets its
    compiler up: the first Subscribe into a fresh coordinator waited 140-570 ms for it here,
    and the calls behind it queued (docs/BENCHMARKS.md, twenty-second session)."""
    table = Slots()
    none = np.zeros(0, np.int64)
    number(table.seq.copy(), none)
    directory(table.pool, table.poff, table.plen, none)
