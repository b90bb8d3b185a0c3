"""What one round produced, as the engine hands it to the delivery stage.

A round's deliveries are columns, before they get sequence numbers: delivery ``i`` goes to the
subscription in slot ``subs[i]`` (``coordinator.slots``), is an ADD or a REMOVE (``kinds[i]``, a
``shard.model.Sign``) of message ``mids[midx[i]]``. ``mids`` lists each message of the round
once, so the retention log and the streams refer to a message by a small integer, and ``payloads`` holds the
serialized Message of every message ADDed. ``spans`` pairs each operation with the index range
of its deliveries; ``removed`` lists the subscriptions the round removed (their slots are given
back once it is delivered); ``stored``, ``expired`` and ``moved`` are what the round changed of
the live messages and the moving subscriptions' positions (written with the round, so that a
restart rebuilds them exactly).

>>> r = Round(1.0)
>>> r.add(3, ADD, "m"); r.add(4, REMOVE, "n"); r.add(5, ADD, "m")
>>> r.mids, r.midx, len(r)
(['m', 'n'], [0, 1, 0], 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shard.model import ADD, REMOVE, Sign


@dataclass(slots=True)
class Round:
    now: float
    subs: list[int] = field(default_factory=list)
    kinds: list[Sign] = field(default_factory=list)
    midx: list[int] = field(default_factory=list)
    mids: list[str] = field(default_factory=list)
    payloads: dict[str, bytes] = field(default_factory=dict)
    spans: list[tuple[Any, int, int]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    stored: list[tuple[str, float, bytes]] = field(default_factory=list)
    """Messages stored by the round (ttl > 0): id, expiry, payload."""
    expired: list[str] = field(default_factory=list)
    """Stored messages the round expired."""
    owed: list[tuple[str, frozenset[int]]] = field(default_factory=list)
    """Stored messages past their expiry that some shards did not expire yet (down): the
    shards that still hold them, as changed by the round (``LiveMessages.owed``)."""
    moved: list[tuple[str, float, float]] = field(default_factory=list)
    """Where the round put moving subscriptions: subscription id, lon, lat (the new centre of
    a move, or of a moving subscription registered anew)."""
    outage_reset: list[int] = field(default_factory=list)
    """Shards whose outage record the round deletes whole (before its other changes)."""
    outage_noted: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    """What shards that are down missed, for their outage records in Redis (written with the
    round, first value kept): shard, field, value (``coordinator.outages``)."""
    outage_done: list[tuple[int, bytes]] = field(default_factory=list)
    """Outage record fields whose redo the round delivers (deleted with the round): shard,
    field."""
    told: list[str] = field(default_factory=list)
    """Subscriptions whose change (a Subscribe) the round tells: their untold marks in Redis
    count one change less (``Metadata.unmark``)."""
    _index: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.subs)

    def message(self, msg_id: str) -> int:
        """The index of ``msg_id`` in ``mids``, added if new."""
        k = self._index.get(msg_id)
        if k is None:
            k = self._index[msg_id] = len(self.mids)
            self.mids.append(msg_id)
        return k

    def add(self, slot: int, kind: Sign, msg_id: str) -> None:
        self.subs.append(slot)
        self.kinds.append(kind)
        self.midx.append(self.message(msg_id))

    def extend_removes(self, slots: list[int], msg_id: str) -> None:
        """REMOVEs of one message from ``slots`` (an expiry's deliveries)."""
        self._extend(slots, REMOVE, msg_id)

    def extend_adds(self, slots: list[int], msg_id: str) -> None:
        """ADDs of one message to ``slots`` (a publish's deliveries)."""
        self._extend(slots, ADD, msg_id)

    def _extend(self, slots: list[int], kind: Sign, msg_id: str) -> None:
        k = self.message(msg_id)
        n = len(slots)
        self.subs.extend(slots)
        self.kinds.extend([kind] * n)
        self.midx.extend([k] * n)
