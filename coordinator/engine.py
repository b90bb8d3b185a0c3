"""The coordinator's engine: routes operations to shards in micro-batched rounds and merges the
shards' updates into exact per-subscription deliveries.

A *round* takes the operations waiting (at most ``batch_max`` per shard, or whatever arrived
within ``batch_delay_ms`` of the first, or within ``defer_ms`` of the first of subscribes
answered before their round: ``coordinator.admission``; at most
``coordinator.topk.TOPK_PER_ROUND`` top-k publishes), reads the clock once (``now``) and sends every shard one
``apply(ops, now)`` call with its share, in arrival order. Each shard first advances to ``now``
(expirations) and then applies its ops, returning the updates of each. Rounds are finished
(merged, handed to ``on_round``) in the order they were sent. While a round is at the shards
the next one gathers what arrives meanwhile; only once a full round's worth waits (a busy
publisher) is it sent before the earlier one is back, up to ``ROUNDS_IN_FLIGHT`` at once
(routing the next while the shards work). So a light load makes few, fuller rounds (each call
costs CPU on both sides: ~1 ms as a Ray call, much less over the shard channel) and a heavy one
keeps the shards busy.

Routing is ``coordinator.routing`` (which shards each operation goes to), the live messages
``coordinator.live``, and the netting of a message reported by several shards for the same
subscription ``coordinator.netting``; the round's deliveries go to ``on_round`` (the delivery
stage, ``coordinator.deliveries``).

Shard faults: a shard whose call fails is *down* until ``coordinator.recovery`` has reloaded it
to what its subscribers were told; meanwhile its share of each round fails with UNAVAILABLE and
the other shards' rounds go on. A message's expiry is taken in the round where all its shards
answered, so its REMOVEs are never lost to a fault.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator import topk
from coordinator.admission import Admission, Admitted
from coordinator.live import LiveMessages
from coordinator.netting import expirations, net
from coordinator.ops import Op, ShardHandle, fail
from coordinator.outages import Missed
from coordinator.recovery import Recovery, items_on
from coordinator.rounds import Round
from coordinator.routing import Router
from coordinator.slots import Slots
from shard.errors import (
    NotFoundError,
    OverloadedError,
    UnavailableError,
    ValidationError,
)
from shard.geometry import region_centre
from shard.model import ADD, Message, Point, Subscription
from shard.partition_map import PartitionMap

log = logging.getLogger(__name__)

ROUNDS_IN_FLIGHT = 3
"""Rounds sent to the shards and not yet finished; later rounds are routed meanwhile."""
DEFAULT_TICK_S = 0.25
"""Longest time between rounds while messages are live, so that expirations are delivered."""


@dataclass(slots=True)
class _Sent:
    """A round sent to the shards: its operations, where each went (shard, index in that
    shard's share), the shares, the shards called, its clock and the calls' results."""

    ops: list[Op]
    where: list[list[tuple[int, int]]]
    per: list[list[tuple]]
    ks: list[int]
    now: float
    results: asyncio.Future
    generations: list[int]
    """Each shard's reload count when the round was sent (a failure of a round sent before a
    reload says nothing about the reloaded shard)."""
    skipped: dict[int, UnavailableError]
    """Shards that were down: not called, their share fails with the error."""
    floor: int = 0
    """The lowest sequence number of its operations (``Op.seq``)."""
    lost: dict[int, UnavailableError] = dataclasses.field(default_factory=dict)
    """Shards called that went down (in an earlier round) before this round was back: their
    share fails, whatever they answer (they are rebuilt to before it; ``coordinator.outages``)."""


class Engine:
    """Admits operations, runs the round loop and merges each round's answers; ``router``
    and ``live`` hold where everything is. ``on_round`` receives every finished ``Round`` in
    order (the delivery stage)."""

    def __init__(
        self,
        shards: Sequence[ShardHandle],
        pm: PartitionMap,
        *,
        on_round: Callable[[Round], Any],
        batch_max: int = 512,
        batch_delay_ms: float = 2.0,
        defer_ms: float = 0.0,
        queue_max: int = 100_000,
        max_live_messages: int = 1_000_000,
        clock: Callable[[], float] = time.time,
        tick_s: float = DEFAULT_TICK_S,
        slots: Slots | None = None,
        on_failure: Callable[[BaseException], Any] | None = None,
        replace_shard: Callable[[int], ShardHandle] | None = None,
    ) -> None:
        if len(shards) != len(pm):
            raise ValidationError("shards", len(shards), f"must equal the map's {len(pm)} parts")
        self.shards = list(shards)
        self.on_round = on_round
        self.batch_max = batch_max
        self.batch_delay = batch_delay_ms / 1000.0
        self.admission = Admission(self.batch_delay, defer_ms / 1000.0)
        """When the next round goes (``coordinator.admission``)."""
        self.queue_max = queue_max
        self.max_live_messages = max_live_messages
        """Stored messages (ttl > 0) live or waiting for their round at once (``publish_many``)."""
        self.clock = clock
        self.tick_s = tick_s
        self.slots = slots if slots is not None else Slots()
        """Every placed subscription's slot: the shards tag it with it (shared with the
        delivery stage, and kept over reloads)."""
        self.stats = defaultdict(int)
        self.live = LiveMessages(tick_s)
        """Stored messages not yet expired."""
        self.router = Router(pm, self.slots, self.live, self.stats)
        """The subscriptions and where each is placed."""
        self.waiting: dict[str, Subscription] = {}
        """Subscriptions answered before their round (``deferred``) and not routed yet."""
        self._admitted = Admitted(self.router.subs, self.waiting)
        self.pending: list[Op] = []
        self.seq = 0
        """The next operation's sequence number (``Op.seq``)."""
        self.floor = 0
        """The lowest sequence number in the round being routed (``_Sent.floor``)."""
        self._stored_waiting = 0
        """Stored messages among ``pending``: ``live`` has them only once their round is sent."""
        self._topk_seen = False
        """Whether a top-k publish was ever queued: from then on a round is cut after
        ``coordinator.topk.TOPK_PER_ROUND`` of them (``topk.round_cut``)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._last_now = -float("inf")
        self.inflight: collections.deque[_Sent] = collections.deque()
        """Rounds sent and not yet finished, oldest first."""
        self._stopped = False
        self._failure: str | None = None
        """Why the round loop died, if it did (``_loop_ended``)."""
        self.on_failure = on_failure
        self.recovery = Recovery(self, replace_shard)
        """The shards that are down, their reloads, the publishes they cut short."""

    @property
    def pm(self) -> PartitionMap:
        return self.router.pm

    @property
    def subs(self) -> Admitted:
        """The subscriptions: the router's, and those answered that wait for their round."""
        return self._admitted

    @property
    def placement(self) -> dict[str, tuple[int, ...]]:
        """Subscription id -> the shards it is placed on (the router's)."""
        return self.router.placement

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine")
        self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task) -> None:
        """The round loop ended without ``stop``: a bug. Say so loudly, answer every waiting and
        later operation UNAVAILABLE (instead of letting callers wait for their deadlines) and
        tell ``on_failure`` (the server turns its health check NOT_SERVING)."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.critical("the round loop stopped on an error", exc_info=exc)
        self._failure = (
            f"the coordinator's round loop failed ({type(exc).__name__}: {exc}); restart it"
        )
        self._stopped = True
        err = UnavailableError(self._failure)
        for op in self.pending:
            if not op.future.done():
                fail(op.future, err)
        self.pending.clear()
        self._stored_waiting = 0
        if self.on_failure is not None:
            self.on_failure(exc)

    async def stop(self) -> None:
        self._stopped = True
        await self.recovery.stop()
        if self._task is not None:
            if not self._task.done():  # (a loop that died was reported by ``_loop_ended``)
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        for op in self.pending:
            if not op.future.done():
                fail(op.future, UnavailableError("the coordinator is stopping"))
        self.pending.clear()
        self._stored_waiting = 0

    def restore(self, subs: Sequence[Subscription]) -> dict[int, list[Subscription]]:
        """Register subscriptions loaded from Redis (before ``start``); returns each shard's
        share for its bulk load (``load_shard``)."""
        return self.router.restore(subs)

    async def load_shard(self, k: int, share: Sequence[Subscription], now: float) -> int:
        """Bulk-load shard ``k`` with ``share``, each subscription tagged with its slot."""
        slot_of = self.slots.slot_of
        return await self.shards[k].load(share, now, [slot_of[s.id] for s in share])

    # ---- operations (each resolves when its round is done) ----------------------------------
    def publish(self, msg: Message, payload: bytes) -> asyncio.Future:
        """Returns a future of the number of subscriptions the message was delivered to."""
        return self.publish_many([msg], [payload], ["message"])[0]

    def publish_many(
        self,
        msgs: Sequence[Message],
        payloads: Sequence[bytes],
        fields: Sequence[str],
        top_k: int = 0,
    ) -> list[asyncio.Future]:
        """Publish a batch in order, all or nothing: every message is checked before any is
        queued. ``fields`` names each message in errors. A stored message (ttl > 0) that would
        make more than ``max_live_messages`` live or waiting is OverloadedError; a message
        counts from here until the first round at or after its expiry (while messages are live
        a round runs at least every ``tick_s``). A stored message whose id is live already is
        a retry of a publish that failed on some of its shards and was stored on the others
        (the rest reach it once they are back): it is answered with the subscriptions reached
        so far, and not published again. ``top_k`` > 0: top-k publishes (``coordinator.topk``;
        their messages are not stored). O(len(msgs))."""
        self._check_open()
        if len(self.pending) + len(msgs) > self.queue_max:
            self.stats["rejected_overload"] += 1
            raise OverloadedError(f"{len(self.pending)} operations waiting; retry later")
        room = self.max_live_messages - len(self.live) - self._stored_waiting
        stored = 0
        live = self.live
        for m, f in zip(msgs, fields, strict=True):
            if m.ttl:
                if m.id in live or m.id in self.recovery.partial:
                    continue
                stored += 1
                if stored > room:
                    self.stats["rejected_live_cap"] += 1
                    raise OverloadedError(
                        f"{f}.ttl_s={m.ttl!r}: {self.max_live_messages - room} stored messages "
                        f"live or waiting, at most max_live_messages={self.max_live_messages}; "
                        "retry once some expire"
                    )
        loop = asyncio.get_running_loop()
        ops = []
        out = []
        for m, p in zip(msgs, payloads, strict=True):
            fut = loop.create_future()
            out.append(fut)
            before = self.recovery.answered_before(m.id)
            if before is not None or (m.ttl and m.id in live):
                fut.set_result(before or 0)
            elif top_k:
                ops.append(Op("topk", m, fut, p, k=top_k))
                self._topk_seen = True
            else:
                ops.append(Op("pub", m, fut, p))
        self._stored_waiting += stored
        if ops:
            self._queued(ops)
        return out

    def subscribe(self, sub: Subscription) -> asyncio.Future:
        return self.subscribe_many([sub])[0]

    def subscribe_many(
        self,
        subs: Sequence[Subscription],
        placed: Sequence[tuple[int, ...]] | None = None,
        *,
        deferred: bool = False,
    ) -> list[asyncio.Future]:
        """Register a batch in order, all or nothing (OverloadedError queues none of it).
        ``placed``: each one's ``router.shards_of_region``, when the caller has them;
        ``deferred``: their caller does not wait for their round (``coordinator.admission``)."""
        future = self._future
        if placed is None:
            futs = self._submit_many([Op("sub", s, future(), deferred=deferred) for s in subs])
        else:
            futs = self._submit_many(
                [
                    Op("sub", s, future(), placed=p, deferred=deferred)
                    for s, p in zip(subs, placed, strict=True)
                ]
            )
        if deferred:
            self.waiting.update((s.id, s) for s in subs)
            slot = self.slots.slot  # (now: a stream opened before its round follows it)
            for s in subs:
                slot(s.id)
        return futs

    def may_defer(self, n: int) -> bool:
        """Whether ``n`` subscribes may be answered before their round (``deferred``): rounds
        may wait for them (``defer_ms`` > 0), and they keep up (fewer than ``batch_max``
        operations wait with them; a caller that outruns the shards waits for its round)."""
        return self.admission.defer > 0 and len(self.pending) + n <= self.batch_max

    async def send_waiting_subscribes(self, timeout: float) -> None:
        """Send the rounds of every subscribe waiting for one now (those answered before their
        round, and those whose caller waits), and wait (at most ``timeout`` s) until they are
        done: a reload stops the engine and loads the shards as Redis has them, and a
        subscription whose round was cut off would be loaded without ever being told its ADDs
        (its caller, told UNAVAILABLE, would send it again: an unchanged subscription, nothing
        new to tell)."""
        futs = [op.future for op in self.pending if op.kind == "sub"]
        if futs:
            self.admission.hurry()
            self._wake.set()
            await asyncio.wait(futs, timeout=timeout)

    def unsubscribe(self, sub_id: str) -> asyncio.Future:
        return self.unsubscribe_many([sub_id])[0]

    def unsubscribe_many(self, ids: Sequence[str]) -> list[asyncio.Future]:
        """Remove a batch, all or nothing: NotFoundError names the first id not registered
        before anything is queued."""
        for sub_id in ids:
            if sub_id not in self.subs:
                raise NotFoundError("subscription", sub_id)
        return self._submit_many([Op("unsub", i, self._future()) for i in ids])

    def move(self, sub_id: str, point: Point) -> asyncio.Future:
        """Future of the deliveries of this move."""
        return self.move_many([(sub_id, point)], [""])[0]

    def move_many(
        self, moves: Sequence[tuple[str, Point]], fields: Sequence[str]
    ) -> list[asyncio.Future]:
        """Move several subscriptions in order, all or nothing: every move is checked before
        any is queued. ``fields`` prefixes each move's ``id`` in errors."""
        for (sub_id, _), f in zip(moves, fields, strict=True):
            sub = self.subs.get(sub_id)
            if sub is None:
                raise NotFoundError("subscription", sub_id)
            if not sub.moving:
                raise ValidationError(
                    f"{f}id",
                    sub_id,
                    "the subscription is not moving (subscribe it with moving=true)",
                )
        self._check_open()
        if len(self.pending) + len(moves) > self.queue_max:
            self.stats["rejected_overload"] += 1
            raise OverloadedError(f"{len(self.pending)} operations waiting; retry later")
        loop = asyncio.get_running_loop()
        ops = [Op("move", sid, loop.create_future(), point=p) for sid, p in moves]
        self._queued(ops)
        return [op.future for op in ops]

    def replay(
        self,
        entries: Sequence[tuple[Message, bytes, float]],
        skip: Mapping[str, frozenset[int]] | None = None,
    ) -> list[asyncio.Future]:
        """Store live messages (message, payload, expiry) in the shards again, before every
        operation waiting, without delivering them again; the engine learns them, and which
        subscriptions hold each, anew (at start). ``skip``: message id -> shards that missed
        it (their outage record says so) and get it as a "redo" instead. Returns their
        operations' futures."""
        if not entries:
            return []
        loop = asyncio.get_running_loop()
        skip = skip or {}
        ops = [
            Op(
                "pub",
                m,
                loop.create_future(),
                p,
                replay=True,
                expiry=e,
                skip=skip.get(m.id, frozenset()),
            )
            for m, p, e in entries
        ]
        self.queue_first(ops)
        return [op.future for op in ops]

    def queue_first(self, ops: list[Op]) -> None:
        """Queue operations ahead of every operation waiting."""
        self.pending[:0] = ops
        self.admission.queued(ops)
        self._wake.set()

    def take_pending(self, which: Callable[[Op], bool]) -> list[Op]:
        """Take the waiting operations ``which`` picks out of the queue."""
        out = [op for op in self.pending if which(op)]
        if out:
            self.pending = [op for op in self.pending if not which(op)]
        return out

    @staticmethod
    def redo_op(item: Missed, k: int) -> Op:
        """A "redo" operation: ``item`` applied again on shard ``k``, its updates delivered;
        nobody waits for it (``coordinator.recovery``)."""
        op = Op("redo", item, asyncio.get_running_loop().create_future(), shard=k, seq=item[2])
        op.future.add_done_callback(_seen)
        return op

    @property
    def stopped(self) -> bool:
        return self._stopped

    def shards_of(self, m: Message) -> list[int]:
        """The shards a message is stored in (routed to)."""
        return self.router.shards_of(m)

    def live_in(self, k: int) -> list[tuple[Message, bytes, float]]:
        """The live messages shard ``k`` stores (``LiveMessages.stored_in``)."""
        return self.live.stored_in(k, self.router.shards_of)

    @staticmethod
    def new_message_id() -> str:
        return uuid.uuid4().hex

    def _queued(self, ops: list[Op]) -> None:
        """Queue operations; wake the loop when it may have something to do: the first ones
        (it may be idle), a full round (it may be waiting for one), or ones that make the next
        round due sooner (a publish after deferred subscribes)."""
        self.pending.extend(ops)
        n = len(self.pending)
        sooner = self.admission.queued(ops)
        if n == len(ops) or n >= self.batch_max or sooner:
            self._wake.set()

    def _check_open(self) -> None:
        if self._stopped:
            raise UnavailableError(
                self._failure or "the coordinator is reloading or stopping; retry"
            )

    def _future(self) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    def _submit_many(self, ops: list[Op]) -> list[asyncio.Future]:
        self._check_open()
        if len(self.pending) + len(ops) > self.queue_max:
            self.stats["rejected_overload"] += 1
            raise OverloadedError(f"{len(self.pending)} operations waiting; retry later")
        self._queued(ops)
        return [op.future for op in ops]

    # ---- the round loop --------------------------------------------------------------------
    async def _loop(self) -> None:
        """Route and send rounds, and finish them in order. With a round at the shards, the
        next is sent only once a full one waits, up to ``ROUNDS_IN_FLIGHT`` at once (a shard
        actor runs one caller's calls in order): the coordinator then routes round r+1 while
        the shards work on round r."""
        inflight = self.inflight
        try:
            while True:
                while inflight and inflight[0].results.done():
                    await self._finish(inflight.popleft())
                if inflight and (
                    len(inflight) >= ROUNDS_IN_FLIGHT or len(self.pending) < self.batch_max
                ):
                    # nothing to send yet: wait for the oldest round, or for a full round
                    if len(inflight) >= ROUNDS_IN_FLIGHT:
                        await asyncio.wait([inflight[0].results])
                    else:
                        self._wake.clear()
                        waker = asyncio.ensure_future(self._wake.wait())
                        await asyncio.wait(
                            [inflight[0].results, waker], return_when=asyncio.FIRST_COMPLETED
                        )
                        waker.cancel()
                    continue
                if not self.pending:
                    self._wake.clear()
                    timeout = self.tick_s if self.live else None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                if self.pending and len(self.pending) < self.batch_max:
                    # let a round fill until its deadline (``coordinator.admission``); an
                    # operation that brings it closer wakes the loop
                    wait = self.admission.deadline() - time.perf_counter()
                    if wait > 0:
                        self._wake.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), wait)
                        continue
                cap = self.batch_max * max(1, len(self.shards))
                n = topk.round_cut(self.pending, cap) if self._topk_seen else cap
                ops = self.pending[:n]
                del self.pending[: len(ops)]
                self.admission.taken(self.pending)
                inflight.append(self._send(ops))
        finally:
            for sent in inflight:
                sent.results.cancel()
                for op in sent.ops:
                    if not op.future.done():
                        fail(op.future, UnavailableError("the coordinator is stopping"))

    def _send(self, ops: list[Op]) -> _Sent:
        """Route a round and send every shard its share (one call each, not awaited)."""
        now = self.tick()
        per: list[list[tuple]] = [[] for _ in self.shards]
        self.floor = self.seq
        where = [self._route(op, per, now) for op in ops]
        down = self.recovery.down
        ks = [k for k in range(len(self.shards)) if (per[k] or self.live) and k not in down]
        skipped = {}
        for k, outage in down.items():
            if per[k]:
                skipped[k] = outage.error
                self.recovery.note(k, items_on(ops, where, per, k))
        results = asyncio.ensure_future(
            asyncio.gather(*(self.shards[k].apply(per[k], now) for k in ks), return_exceptions=True)
        )
        generations = list(self.recovery.generation)
        return _Sent(ops, where, per, ks, now, results, generations, skipped, self.floor)

    def tick(self) -> float:
        """The clock for the next call to the shards, never behind an earlier one."""
        now = max(self.clock(), self._last_now)
        self._last_now = now
        return now

    async def _finish(self, sent: _Sent) -> None:
        try:
            rnd = await self._merge_round(sent)
        except Exception as exc:  # cannot happen short of a bug: fail the round's callers
            log.exception("round failed")
            err = exc if isinstance(exc, UnavailableError) else UnavailableError(str(exc))
            for op in sent.ops:
                if not op.future.done():
                    fail(op.future, err)
            self.stats["failed_rounds"] += 1
            return
        try:
            await self.on_round(rnd)
        except BaseException as exc:  # a bug in the delivery stage (or a stop): its callers are
            # answered UNAVAILABLE, and the loop ends (``_loop_ended``)
            err = UnavailableError(
                "the coordinator is stopping"
                if isinstance(exc, asyncio.CancelledError)
                else f"delivering a round failed ({type(exc).__name__}: {exc})"
            )
            for op in sent.ops:
                if not op.future.done():
                    fail(op.future, err)
            raise
        for sid in rnd.removed:  # delivered: the slot may go to another subscription
            if sid not in self.router.subs:  # (routed: one answered since takes a slot when routed)
                self.slots.release(sid)

    async def _merge_round(self, sent: _Sent) -> Round:
        ops, where, per, ks, now = sent.ops, sent.where, sent.per, sent.ks, sent.now
        results = sent.results.result()
        by_shard = {}
        for k, r in zip(ks, results, strict=True):
            if k in sent.lost:  # the shard went down in an earlier round: rebuilt to before it
                by_shard[k] = (NO_EXPIRY, [sent.lost[k]] * len(per[k]), [])
            elif isinstance(r, BaseException):
                # the shard is gone, broken or hung: its share of the round fails with
                # UNAVAILABLE and it is down until a background task has reloaded it
                err = r if isinstance(r, UnavailableError) else UnavailableError(f"shard {k}: {r}")
                by_shard[k] = (NO_EXPIRY, [err] * len(per[k]), [])
                self.stats["shard_failures"] += 1
                self.recovery.failed(k, err, items_on(ops, where, per, k))
            else:
                by_shard[k] = r
        for k, err in sent.skipped.items():
            by_shard[k] = (NO_EXPIRY, [err] * len(per[k]), [])
        reached = {k: _reached(by_shard[k][1], by_shard[k][2]) for k in by_shard}
        slot = self.slots.slot
        rnd = Round(now)
        # expirations first (every shard advanced to now before its ops)
        live = self.live
        expirations([by_shard[k][0] for k in ks], rnd, live, self.slots.placed)
        answered = {
            k
            for k, r in zip(ks, results, strict=True)
            if k not in sent.lost and not isinstance(r, BaseException)
        }
        rnd.expired += live.expire(now, answered, len(self.shards), self.shards_of, rnd.owed)
        multi = live.holders
        for op, places in zip(ops, where, strict=True):
            start = len(rnd.subs)
            if op.kind == "topk":
                self._merge_topk(op, places, by_shard, rnd)
                rnd.spans.append((op, start, len(rnd.subs)))
                continue
            if op.kind == "redo":
                if places:
                    k, i = places[0]
                    self.recovery.merge_redo(op, by_shard[k][1][i], reached[k][i], rnd)
                elif op.clears:  # (nothing to apply: its message is gone)
                    rnd.outage_done.append((op.shard, op.clears))
                rnd.spans.append((op, start, len(rnd.subs)))
                continue
            if len(places) == 1 and op.kind == "pub" and op.arg.id not in multi:
                # the common case: a message on one shard, whose updates are ADDs to the
                # subscriptions it reached (each once); no netting needed
                k, i = places[0]
                part = by_shard[k][1][i]
                if isinstance(part, Exception):
                    if not op.future.done():
                        fail(op.future, part)
                    if not op.replay:
                        self.recovery.failed_publish(op, [part], 0, down=[k])
                        if op.partial:  # (its shard is down: live until it is back, and
                            self._note_stored(rnd, op)  # after a restart)
                    rnd.spans.append((op, start, len(rnd.subs)))
                    continue
                if part and not op.replay:
                    rnd.extend_adds(reached[k][i], op.arg.id)
                    rnd.payloads[op.arg.id] = op.payload
                if not op.replay:
                    self._note_stored(rnd, op)
                rnd.spans.append((op, start, len(rnd.subs)))
                continue
            parts = [by_shard[k][1][i] for k, i in places]
            failed = next((p for p in parts if isinstance(p, Exception)), None)
            if failed is not None and not op.future.done():  # the shard rejected it (and is
                fail(op.future, failed)  # unchanged by it)
            if op.kind == "pub":  # a shard answers a publish with the subscriptions it reached
                mid = op.arg.id
                got = [
                    reached[k][i] for k, i in places if not isinstance(by_shard[k][1][i], Exception)
                ]
                ups = [(s, ADD, mid) for p in got for s in p]
                net(ups, rnd, live, (mid, op.payload), deliver=not op.replay)
                if failed is not None and not op.replay:
                    down = [
                        k
                        for (k, _), p in zip(places, parts, strict=True)
                        if isinstance(p, Exception)
                    ]
                    self.recovery.failed_publish(
                        op, [p for p in parts if isinstance(p, Exception)], len(ups), ups, down
                    )
                if (got or op.partial) and not op.replay:
                    self._note_stored(rnd, op)
            else:
                if op.kind == "move":
                    rnd.moved.append((op.arg, op.point.lon, op.point.lat))
                elif op.kind == "sub":
                    rnd.told.append(op.arg.id)
                    if op.arg.moving:  # its own centre, after earlier moves
                        rnd.moved.append((op.arg.id, *region_centre(op.arg.region)))
                parts = [p for p in parts if not isinstance(p, Exception)]
                net([(slot(s), g, m) for p in parts for s, g, m in p], rnd, live)
                if op.kind == "unsub":  # (its counts go once the rounds before are merged)
                    rnd.removed.append(op.arg)
                    live.drop_slot(self.slots.slot_of.get(op.arg))
            rnd.spans.append((op, start, len(rnd.subs)))
        self.recovery.take_notes(rnd)
        self.stats["rounds"] += 1
        return rnd

    def _merge_topk(self, op: Op, places, by_shard, rnd: Round) -> None:
        """A top-k publish's deliveries: the global k best over every shard's answer
        (``coordinator.topk``); UNAVAILABLE when a shard did not answer (nothing delivered)."""
        parts = [by_shard[k][1][i] for k, i in places]
        failed = next((p for p in parts if isinstance(p, Exception)), None)
        if failed is None and len(parts) < len(self.shards):
            failed = UnavailableError("a shard is down: a top-k publish needs every shard")
        if failed is not None:
            if not op.future.done():
                fail(op.future, failed)
            return
        best = topk.merge(parts, op.k, self.slots.ids)
        if best:
            rnd.extend_adds(best, op.arg.id)
            rnd.payloads[op.arg.id] = op.payload

    def _note_stored(self, rnd: Round, op: Op) -> None:
        """Publish ``op``'s message, if stored (ttl > 0) and still live, goes into the round's
        ``stored`` (id, expiry, payload): the retention log keeps it for a restart."""
        entry = self.live.get(op.arg.id) if op.arg.ttl else None
        if entry is not None:
            rnd.stored.append((op.arg.id, entry[2], op.payload))

    def _route(self, op: Op, per: list[list[tuple]], now: float) -> list[tuple[int, int]]:
        """Route one operation into the round's shares ``per`` (``coordinator.routing``);
        returns where it went: (shard, index in that shard's share) each."""
        out: list[tuple[int, int]] = []

        def send(k: int, item: tuple) -> None:
            out.append((k, len(per[k])))
            per[k].append(item)

        kind = op.kind
        if kind == "redo":
            self.floor = min(self.floor, op.seq)
            item = self.recovery.route_redo(op, now)
            if item is not None:
                send(op.shard, item)
            return out
        op.seq = self.seq
        self.seq += 1
        router = self.router
        if kind == "pub":
            if op.arg.ttl and not op.replay:
                self._stored_waiting -= 1
            router.route_pub(op, send, now)
        elif kind == "topk":
            router.route_topk(op, send)
        elif kind == "sub":
            if op.deferred and self.waiting.get(op.arg.id) is op.arg:  # (not answered again since)
                del self.waiting[op.arg.id]
            router.route_sub(op.arg, send, op)
        elif kind == "unsub":
            self.recovery.forget(op.arg, op.seq)
            router.route_unsub(op, send)
        else:  # move
            try:
                router.route_move(op, send)
            except (NotFoundError, ValidationError) as err:  # gone (or made static) since
                fail(op.future, err)  # it was queued
        return out


NO_EXPIRY = ([], np.zeros(0, np.int64), np.zeros(0, np.int32))
"""A shard's expirations when it did not answer."""


def _seen(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _reached(out: list, tags) -> list:
    """Per operation of a shard's answer (``shard.ops.apply_ops``), for a publish the slots it
    reached (a list cut from the round's ``tags``), else None."""
    tl = tags.tolist() if len(tags) else []
    cut: list = [None] * len(out)
    pos = 0
    for i, n in enumerate(out):
        if type(n) is int:
            cut[i] = tl[pos : pos + n]
            pos += n
    return cut
