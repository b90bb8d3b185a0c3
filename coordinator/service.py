"""The GeoPubSub gRPC service: each RPC validated and converted (``geopubsub.convert``), its
caller's rights checked (``coordinator.access``), handed to the ``Engine`` and answered when its
round has been delivered (``coordinator.deliveries``), within the call's deadline; a Subscribe,
once Redis holds it and its round is queued (``Settings.subscribe_ack``). Errors are
raised as ``shard.errors`` and mapped to status codes by ``@grpc_errors`` only. The process
around it (loading, reloading, health, stopping) is ``coordinator.server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from coordinator import overview
from coordinator.access import check_owned
from coordinator.engine import Engine
from coordinator.status import grpc_errors
from geopubsub.convert import (
    from_proto_location_request,
    from_proto_message,
    from_proto_subscribe_request,
    from_proto_unsubscribe_request,
    to_proto_subscription,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import NotFoundError, UnavailableError, ValidationError
from shard.limits import MAX_MOVE_BATCH, MAX_PUBLISH_BATCH, MAX_TOP_K
from shard.model import Point, validate_id
from shard.partition_map import MAX_PARTS

if TYPE_CHECKING:
    from coordinator.server import Coordinator

log = logging.getLogger(__name__)

STREAM_WINDOW = 4096
"""Operations (messages, moves) of one PublishStream / LocationStream in flight before it reads
more requests (backpressure)."""


def _round_failed(fut: asyncio.Future) -> None:
    """The round of a subscribe answered before it (``Settings.subscribe_ack``) failed: said in
    the log. Redis holds the subscription: a shard that was down gets it when it is reloaded
    (UNAVAILABLE, not logged), as does a restarted coordinator."""
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None and not isinstance(exc, UnavailableError):
        log.warning("a subscribe answered before its round failed there: %s", exc)


def _check_batch_ids(msgs: Sequence) -> None:
    """A batch may not give one stored message's id twice (the second would be refused after
    the first was accepted)."""
    seen: set[str] = set()
    for i, m in enumerate(msgs):
        if m.ttl:
            if m.id in seen:
                raise ValidationError(f"messages[{i}].id", m.id, "given twice in the batch")
            seen.add(m.id)


def _check_topk_messages(msgs: Sequence, fields: Sequence[str]) -> None:
    """A top-k publish's messages: each at a point, none stored (paper 001's events)."""
    for m, f in zip(msgs, fields, strict=True):
        if type(m.location) is not Point:
            raise ValidationError(f"{f}.rect", "set", "a top-k publish (top_k > 0) takes a point")
        if m.ttl:
            raise ValidationError(
                f"{f}.ttl_s", m.ttl, "a top-k publish is delivered once, not stored: must be 0"
            )


async def within(fut, context, limit: float, why: Callable[[], str] | None = None):
    """Await ``fut`` no longer than the call's deadline (or ``limit``, the server's
    ``deadline_s``). Past the call's own deadline: DEADLINE_EXCEEDED; past ``limit``:
    UNAVAILABLE, with ``why()`` (a shard or Redis is slow or unreachable). A done future answers
    at once: ``wait_for`` would take a turn of the event loop for it (a batch's answers are
    read this way, one per message)."""
    if fut.done():
        return fut.result()
    remaining = context.time_remaining()
    timeout = limit if remaining is None else min(limit, max(remaining, 0.0))
    try:
        return await asyncio.wait_for(asyncio.shield(fut), timeout)
    except TimeoutError:
        if remaining is not None and remaining <= limit:
            raise  # the caller's own deadline
        reason = why() if why is not None else ""
        raise UnavailableError(
            f"not done within deadline_s={limit:g} s{': ' + reason if reason else ''}; it may "
            "still take effect (a publish retried with its message id is not delivered twice)"
        ) from None


class GeoPubSubService(pb_grpc.GeoPubSubServicer):
    def __init__(self, app: Coordinator) -> None:
        self.app = app

    @property
    def engine(self) -> Engine:
        """The running engine; UNAVAILABLE while the coordinator is still starting (it listens
        before its shards are loaded, so that health can say NOT_SERVING)."""
        eng = self.app.engine
        if eng is None:
            raise UnavailableError("the coordinator is starting (loading its shards); retry")
        return eng

    @grpc_errors
    async def Subscribe(self, request, context):
        subs, ephemeral, batch = from_proto_subscribe_request(request)
        router = self.engine.router
        weights = router.terms.weights
        subs = [weights(s) for s in subs]  # ranked: idf if none given
        check_owned("subscriptions[{i}].id" if batch else "subscription.id", (s.id for s in subs))
        self.app.deliveries.check_writable()
        # Redis first (the source of truth), the batch in one transaction: a call that times
        # out while its round still applies it must not leave a subscription a restart forgets
        placed = [router.shards_of_region(s) for s in subs]
        # (each marked untold until the round that tells its subscriber is written: a
        # coordinator killed before that tells it after its restart, coordinator.outages)
        md = self.app.md
        await md.put_subscriptions(
            list(zip(subs, placed, strict=True)),
            ephemeral=ephemeral,
            mark=True,
        )
        settings = self.app.settings
        try:
            engine = self.engine  # (a reload since brings another router: it places them)
            # answered now (Redis holds them; every later operation is queued after them)
            # or once their round is done (``Settings.subscribe_ack``)
            deferred = settings.subscribe_ack == "stored" and engine.may_defer(len(subs))
            futs = engine.subscribe_many(
                subs, placed if engine.router is router else None, deferred=deferred
            )
        except Exception:  # (queue full, stopping): no round will tell them
            with contextlib.suppress(Exception):
                await md.unmark([s.id for s in subs])
            raise
        if deferred:
            for fut in futs:
                fut.add_done_callback(_round_failed)
        else:
            for fut in futs:
                await within(fut, context, settings.deadline_s, self.app.stalled)
        slots = self.app.slots
        for s, e in zip(subs, ephemeral, strict=True):
            if e != (s.id in slots.ephemeral):
                slots.set_ephemeral(s.id, e)
        if batch:
            return pb.SubscribeResponse(ids=[s.id for s in subs])
        return pb.SubscribeResponse(id=subs[0].id)

    @grpc_errors
    async def Unsubscribe(self, request, context):
        ids, batch = from_proto_unsubscribe_request(request)
        check_owned("ids[{i}]" if batch else "id", ids)
        futs = self.engine.unsubscribe_many(ids)  # NotFoundError before anything changes
        await self.app.md.delete_subscriptions(ids)
        limit, why = self.app.settings.deadline_s, self.app.stalled
        for fut in futs:
            await within(fut, context, limit, why)
        for sub_id in ids:
            self.app.slots.set_ephemeral(sub_id, False)
        return pb.UnsubscribeResponse()

    @grpc_errors
    async def GetSubscription(self, request, context):
        check_owned("id", [validate_id("id", request.id)])
        sub = self.engine.subs.get(request.id)
        if sub is None:
            raise NotFoundError("subscription", request.id)
        out = to_proto_subscription(sub)
        out.ephemeral = request.id in self.app.slots.ephemeral
        return out

    def _submit_publish(self, request: pb.PublishRequest):
        """Validate a PublishRequest whole, then hand its message(s) to the engine. Returns
        (ids, futures, batch?)."""
        batch = len(request.messages) > 0
        self.app.deliveries.check_writable()
        if batch:
            if request.HasField("message"):
                raise ValidationError("message", "set", "give message or messages, not both")
            if len(request.messages) > MAX_PUBLISH_BATCH:
                raise ValidationError(
                    "messages", len(request.messages), f"at most {MAX_PUBLISH_BATCH} per request"
                )
            protos = list(request.messages)
            fields = [f"messages[{i}]" for i in range(len(protos))]
        elif request.HasField("message"):
            protos, fields = [request.message], ["message"]
        else:
            raise ValidationError("message", None, "required")
        top_k = request.top_k
        if top_k > MAX_TOP_K:
            raise ValidationError("top_k", top_k, f"must be at most {MAX_TOP_K} (0: every match)")
        msgs = [
            from_proto_message(
                m,
                default_id=m.id or Engine.new_message_id(),
                field=f,
                max_ttl_s=self.app.settings.max_ttl_s,
                need_terms=not top_k,
            )
            for m, f in zip(protos, fields, strict=True)
        ]
        if top_k:
            _check_topk_messages(msgs, fields)
        if batch:
            _check_batch_ids(msgs)
        # a client-given id published before (in the log) or on its way: not again (a retry)
        dedupe = self.app.dedupe
        given = [bool(mp.id) for mp in protos]
        seen = [dedupe.lookup(m.id) if g else None for m, g in zip(msgs, given, strict=True)]
        new = [i for i, x in enumerate(seen) if x is None]
        now = self.app.clock()
        payloads = []
        for i in new:  # the request's own messages, stamped
            mp = protos[i]
            mp.id = msgs[i].id
            mp.time = now
            payloads.append(mp.SerializeToString())
        futs = (
            self.engine.publish_many(
                [msgs[i] for i in new], payloads, [fields[i] for i in new], top_k
            )
            if new
            else []
        )
        out: list = list(seen)
        for i, fut in zip(new, futs, strict=True):
            out[i] = fut
            if given[i]:
                dedupe.begin(msgs[i].id, fut)
        return [m.id for m in msgs], out, batch

    async def _published(self, submitted, context) -> pb.PublishResponse:
        ids, futs, batch = submitted
        limit = self.app.settings.deadline_s
        # rounds finish in order: once the last message is answered, so is every other (a
        # duplicate is answered by its first publish, or was already: an int)
        pending = [f for f in futs if isinstance(f, asyncio.Future)]
        if pending:
            await within(pending[-1], context, limit, self.app.stalled)
        matches = [
            await within(f, context, limit, self.app.stalled)
            if isinstance(f, asyncio.Future)
            else f
            for f in futs
        ]
        if not batch:
            return pb.PublishResponse(id=ids[0], matched=matches[0])
        return pb.PublishResponse(matched=sum(matches), ids=ids, matches=matches)

    @grpc_errors
    async def Publish(self, request, context):
        return await self._published(self._submit_publish(request), context)

    @grpc_errors
    async def PublishStream(self, request_iterator, context):
        """One response per request, in order; a bad request ends the stream with
        INVALID_ARGUMENT after the responses of every request before it."""

        async def submit(req):
            return self._submit_publish(req)

        async for submitted in _pipelined(request_iterator, submit, lambda x: len(x[0])):
            yield await self._published(submitted, context)

    def _submit_moves(self, request: pb.UpdateLocationRequest) -> list[asyncio.Future]:
        """Validate an UpdateLocationRequest whole, then hand its move(s) to the engine."""
        moves, fields = from_proto_location_request(request, MAX_MOVE_BATCH)
        check_owned("moves[{i}].id" if request.moves else "id", (m[0] for m in moves))
        self.app.deliveries.check_writable()
        return self.engine.move_many(moves, fields)  # (positions are written with the round)

    async def _moved(self, futs: list[asyncio.Future], context) -> list[pb.Delivery]:
        limit = self.app.settings.deadline_s
        await within(futs[-1], context, limit, self.app.stalled)  # rounds finish in order
        return [d for f in futs for d in await within(f, context, limit, self.app.stalled)]

    @grpc_errors
    async def UpdateLocation(self, request, context):
        ups = await self._moved(self._submit_moves(request), context)
        return pb.UpdateLocationResponse(updates=ups)

    @grpc_errors
    async def LocationStream(self, request_iterator, context):
        async def submit(req):
            return self._submit_moves(req)

        async for futs in _pipelined(request_iterator, submit, len):
            for d in await self._moved(futs, context):
                yield d

    @grpc_errors
    async def StreamResults(self, request, context):
        check_owned("id", [validate_id("id", request.id)])
        if request.id not in self.engine.subs:
            raise NotFoundError("subscription", request.id)
        async for d in self.app.deliveries.stream(request.id, request.after_sequence):
            yield d

    @grpc_errors
    async def Reload(self, request, context):
        return pb.ReloadResponse(subscriptions=await self.app.reload())

    @grpc_errors
    async def Rebalance(self, request, context):
        n = request.shards
        if n > MAX_PARTS:
            raise ValidationError("shards", n, f"must be in [1, {MAX_PARTS}] (0: as many as now)")
        subs = await self.app.rebalance(n)
        return pb.RebalanceResponse(
            shards=len(self.engine.shards), subscriptions=subs, live_messages=len(self.engine.live)
        )

    @grpc_errors
    async def GetDensity(self, request, context):
        overview.density_view(request)  # INVALID_ARGUMENT before UNAVAILABLE
        eng = self.engine
        if down := eng.recovery.down_shards():
            raise UnavailableError("; ".join(down[k] for k in sorted(down)))
        return await overview.density(eng.shards, eng.pm.boxes, request)

    @grpc_errors
    async def Watch(self, request, context):
        async for events in self.app.watch.stream(request):
            yield events

    @grpc_errors
    async def GetStats(self, request, context):
        eng = self.engine
        if down := eng.recovery.down_shards():  # at once, not after a down shard's timeout
            raise UnavailableError("; ".join(down[k] for k in sorted(down)))
        per = await asyncio.gather(*(s.stats() for s in eng.shards))
        return pb.Stats(
            subscriptions=len(eng.subs),
            moving_subscriptions=sum(1 for s in eng.subs.values() if s.moving),
            live_messages=len(eng.live),
            published=eng.stats["published"],
            deliveries=self.app.deliveries.delivered,
            dropped_deliveries=self.app.deliveries.dropped,
            shards=[
                pb.ShardStats(
                    shard=k, subscriptions=st["subscriptions"], live_messages=st["live_messages"]
                )
                for k, st in enumerate(per)
            ],
            uptime_s=self.app.clock() - self.app.started,
            moves=eng.stats["moves"],
            rounds=eng.stats["rounds"],
            rejected_overload=eng.stats["rejected_overload"],
            shard_failures=eng.stats["shard_failures"],
            gaps=self.app.deliveries.gaps,
            log_write_failures=self.app.deliveries.log_failures,
            log_rounds=len(self.app.log.kept),
            log_bytes=self.app.log.bytes,
        )


async def _pipelined(request_iterator, submit, weight=lambda item: 1):
    """Submit requests as they arrive and yield each submission in order, with at most
    ``STREAM_WINDOW`` operations (``weight`` of a submission: a batch counts its messages)
    submitted and not yet yielded back; a request that fails to submit is raised after those
    before it."""
    window: asyncio.Queue = asyncio.Queue()
    room = asyncio.Condition()
    inflight = 0

    def has_room() -> bool:
        return inflight < STREAM_WINDOW

    async def reader():
        nonlocal inflight
        try:
            async for req in request_iterator:
                item = await submit(req)
                async with room:
                    inflight += weight(item)
                    window.put_nowait(("ok", item))
                    await room.wait_for(has_room)
        except Exception as exc:
            window.put_nowait(("error", exc))
            return
        window.put_nowait(("end", None))

    task = asyncio.get_running_loop().create_task(reader())
    try:
        while True:
            kind, item = await window.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
            async with room:
                inflight -= weight(item)
                room.notify()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
