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
retention log (``head``) starts afresh when it is placed anew.

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
        self.idb: list[bytes] = []
        """Each slot's id, encoded (the retention log writes it)."""
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
        self.lease = np.zeros(capacity, np.int64)
        """The highest sequence an ephemeral slot may reach before its lease is extended in
        Redis (``coordinator.retention``)."""
        self.durable = np.zeros(capacity, np.bool_)
        self.followed = np.zeros(capacity, np.bool_)
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
            self.idb[s] = sub_id.encode()
        else:
            s = len(self.ids)
            self.ids.append(sub_id)
            self.idb.append(sub_id.encode())
            if s >= self.seq.shape[0]:
                self._grow(2 * s)
        self.slot_of[sub_id] = s
        self.seq[s] = self.lease[s] = self.bases.pop(sub_id, 0)
        self.head[s] = 0
        self.durable[s] = sub_id not in self.ephemeral
        self.followed[s] = sub_id in self.followed_ids
        self.refreshed[s] = -np.inf
        return s

    def release(self, sub_id: str) -> None:
        s = self.slot_of.pop(sub_id, None)
        if s is not None:
            self.bases[sub_id] = int(max(self.seq[s], self.lease[s]))
            self.ids[s] = None
            self.durable[s] = self.followed[s] = False
            self._free.append(s)

    def keep_only(self, ids: Iterable[str]) -> None:
        """Release every slot whose subscription is not in ``ids`` (after a reload)."""
        keep = set(ids)
        for sid in [s for s in self.slot_of if s not in keep]:
            self.release(sid)

    def restore(self, heads: dict[str, tuple[int, int]], leases: dict[str, int]) -> None:
        """Continue every subscription's numbering and log chain from what the retention log
        held at start: (newest round, last sequence) and the ephemeral leases."""
        slot_of = self.slot_of
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
            ("lease", 0),
            ("durable", False),
            ("followed", False),
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
