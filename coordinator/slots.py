"""Every registered subscription as a small integer, its *slot*, and the delivery stage's
per-subscription state as arrays indexed by slot.

The shards report a publish's deliveries as slots (``ShardState.publish_tagged``: the slot is
the tag the engine gives each subscription it places), so the delivery stage numbers a round
with one compiled pass (``number``) and finds the durable and the followed deliveries with array
look-ups: nothing per delivery goes through a dictionary keyed by id. Ids are looked up only
where a delivery leaves as a message (a log entry, a stream, a move's answer).

A slot is taken when a subscription is placed (``slot``) and given back when its removal has
gone through the delivery stage (``release``); a freed slot is reused, its state reset.

>>> t = Slots()
>>> t.slot("a"), t.slot("b"), t.slot("a")
(0, 1, 0)
>>> t.release("a"); t.slot("c"), t.ids[0], int(t.seq[0])
(0, 'c', -1)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit

UNKNOWN = -1
"""``seq`` of a subscription whose numbering base is not known yet (ask the retention log)."""


class Slots:
    def __init__(self, capacity: int = 1024) -> None:
        self.slot_of: dict[str, int] = {}
        self.ids: list[str | None] = []
        self._free: list[int] = []
        self.ephemeral: set[str] = set()
        """Subscriptions whose deliveries skip the retention log (registered or not)."""
        self.followed_ids: set[str] = set()
        """Subscriptions with an open result stream (registered or not)."""
        self.seq = np.full(capacity, UNKNOWN, np.int64)
        """The last sequence number given to each slot's deliveries."""
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
        else:
            s = len(self.ids)
            self.ids.append(sub_id)
            if s >= self.seq.shape[0]:
                self._grow(2 * s)
        self.slot_of[sub_id] = s
        self.seq[s] = UNKNOWN
        self.durable[s] = sub_id not in self.ephemeral
        self.followed[s] = sub_id in self.followed_ids
        self.refreshed[s] = -np.inf
        return s

    def release(self, sub_id: str) -> None:
        s = self.slot_of.pop(sub_id, None)
        if s is not None:
            self.ids[s] = None
            self.durable[s] = self.followed[s] = False
            self._free.append(s)

    def keep_only(self, ids: Iterable[str]) -> None:
        """Release every slot whose subscription is not in ``ids`` (after a reload)."""
        keep = set(ids)
        for sid in [s for s in self.slot_of if s not in keep]:
            self.release(sid)

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
        for name, fill in (("seq", UNKNOWN), ("durable", False), ("followed", False)):
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
