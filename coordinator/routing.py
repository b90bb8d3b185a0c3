"""Routing: which shards an operation goes to, and what each of them is sent.

The partition map (``shard.partition_map``) splits the world into one region per shard. A point
message goes to the shard owning the point, a region message to every shard its box meets; a
subscription lives on every shard its region's box meets. A change of a subscription sends
``detach`` (−m for all it held there) to the shards it leaves and ``sub`` to those it is on now.
A move goes to the shards of the old and the new region: ``move`` where it stays, ``sub`` where
it arrives, ``detach`` where it leaves; its new region is the old one re-centred on the new
point (``shard.applus.tree.recentre``, the function the shards' own moves are checked against).

The router owns the coordinator's picture of where everything is: the subscriptions, the shards
each is placed on, and (through ``coordinator.live``) the stored messages. It is pure (no I/O,
no event loop): the engine calls ``route`` for every operation of a round, in order.

>>> from coordinator.live import LiveMessages
>>> from coordinator.slots import Slots
>>> from shard.model import Rect, Subscription
>>> from shard.partition_map import PartitionMap
>>> r = Router(PartitionMap.build([], 2), Slots(), LiveMessages(0.25))  # west | east
>>> sent = []
>>> s = Subscription("s", (("a",),), Rect(-10.0, 0.0, 10.0, 1.0))
>>> r.route_sub(s, lambda k, item: sent.append((k, item[0])))
>>> sent, r.placement["s"]
([(0, 'sub'), (1, 'sub')], (0, 1))
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence

from coordinator import topk
from coordinator.live import REPLAY_MIN_TTL_S, LiveMessages
from coordinator.ops import Op
from coordinator.ranking import TermCounts
from coordinator.slots import Slots
from shard.applus.tree import recentre
from shard.errors import NotFoundError, ValidationError
from shard.geometry import location_bbox
from shard.model import Message, Point, Subscription
from shard.partition_map import PartitionMap
from shard.residual import index_box

Send = Callable[[int, tuple], None]
"""``send(k, item)``: item for shard ``k`` in the round being routed."""


class Router:
    """The subscriptions, their placements and the partition map; routes every operation."""

    def __init__(
        self, pm: PartitionMap, slots: Slots, live: LiveMessages, stats: dict | None = None
    ) -> None:
        self.pm = pm
        self.slots = slots
        self.live = live
        self.stats: dict[str, int] = stats if stats is not None else defaultdict(int)
        self.subs: dict[str, Subscription] = {}
        self.placement: dict[str, tuple[int, ...]] = {}
        """Subscription id -> the shards it is placed on."""
        self.terms = TermCounts()
        """How many subscriptions name each term: ranked subscriptions' idf weights."""

    def shards_of(self, m: Message) -> list[int]:
        """The shards a message is stored in (routed to)."""
        if isinstance(m.location, Point):
            return [self.pm.owner(m.location.lon, m.location.lat)]
        return self.pm.overlapping(location_bbox(m.location))

    def shards_of_region(self, s: Subscription) -> tuple[int, ...]:
        """The shards a subscription is placed on (a top-k one: the owner of its point)."""
        p = s.region
        if type(p) is Point:
            return (self.pm.owner(p.lon, p.lat),)
        return tuple(self.pm.overlapping(index_box(s)))

    def restore(self, subs: Sequence[Subscription]) -> dict[int, list[Subscription]]:
        """Register subscriptions loaded from Redis (before the first round), each in a slot (a
        slot of a subscription that is gone is given back); returns each shard's share."""
        per: dict[int, list[Subscription]] = defaultdict(list)
        slot = self.slots.slot
        for s in subs:
            where = self.shards_of_region(s)
            old = self.subs.get(s.id)
            if old is not None:
                self.terms.remove(old)
            self.terms.add(s)
            self.subs[s.id] = s
            self.placement[s.id] = where
            x = slot(s.id)  # (first: taking a slot may grow the arrays)
            self.slots.placed[x] = True
            for k in where:
                per[k].append(s)
        self.slots.keep_only(self.subs)
        return per

    # ---- one operation each ------------------------------------------------------------------
    def route_pub(self, op: Op, send: Send, now: float) -> None:
        """A publish: stored (ttl > 0) in ``live`` from now; a replayed one (``op.replay``) until
        its expiry, and only where it was not expired already."""
        m: Message = op.arg
        targets = self.shards_of(m)
        live = self.live
        if op.replay:
            m = op.arg = dataclasses.replace(m, ttl=max(op.expiry - now, REPLAY_MIN_TTL_S))
            if m.id in live.owed:
                targets = [k for k in targets if k in live.owed[m.id]]
        if not op.replay:
            self.stats["published"] += 1
        if m.ttl:
            live.add(m, op.payload, now, len(targets))
        for k in targets:
            if k not in op.skip:
                send(k, ("pub", m))

    def route_topk(self, op: Op, send: Send) -> None:
        """A top-k publish: to every shard (``coordinator.topk``)."""
        self.stats["published"] += 1
        topk.route(op, send, len(self.pm))

    def route_sub(self, s: Subscription, send: Send, op: Op | None = None) -> None:
        """A subscription, new or changed (``op.prev`` / ``op.prev_at``: what it was)."""
        old = self.placement.get(s.id, ())
        if op is not None:
            op.prev, op.prev_at = self.subs.get(s.id), old
        new = op.placed if op is not None and op.placed is not None else self.shards_of_region(s)
        for k in old:
            if k not in new:
                send(k, ("detach", s.id))
        tag = self.slots.slot(s.id)
        self.slots.placed[tag] = True
        for k in new:
            send(k, ("sub", s, tag))
        old_sub = self.subs.get(s.id)
        if old_sub is not None:
            self.terms.remove(old_sub)
        self.terms.add(s)
        self.subs[s.id] = s
        self.placement[s.id] = new

    def route_unsub(self, op: Op, send: Send) -> None:
        sub_id = op.arg
        op.prev_at = self.placement.pop(sub_id, ())
        for k in op.prev_at:
            send(k, ("unsub", sub_id))
        op.prev = self.subs.pop(sub_id, None)
        if op.prev is not None:
            self.terms.remove(op.prev)
        gone = self.slots.slot_of.get(sub_id)
        if gone is not None:
            self.slots.placed[gone] = False

    def route_move(self, op: Op, send: Send) -> None:
        """A move; NotFoundError / ValidationError if its subscription was unsubscribed (or
        made static) since the move was queued (nothing is sent)."""
        sub_id = op.arg
        s = self.subs.get(sub_id)
        if s is None:
            raise NotFoundError("subscription", sub_id)
        if not s.moving:
            raise ValidationError("id", sub_id, "the subscription is no longer moving")
        moved = dataclasses.replace(s, region=recentre(s.region, op.point))
        old = self.placement[sub_id]
        op.prev, op.prev_at = s, old
        new = self.shards_of_region(moved)
        for k in old:
            if k in new:
                send(k, ("move", sub_id, op.point))
            else:
                send(k, ("detach", sub_id))
        for k in new:
            if k not in old:
                send(k, ("sub", moved, self.slots.slot_of[sub_id]))
        self.subs[sub_id] = moved
        self.placement[sub_id] = new
        self.stats["moves"] += 1
