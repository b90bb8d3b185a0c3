"""The coordinator's server: ``create_server`` builds the gRPC server (the service of
``coordinator.service``, health, reflection, TLS, the auth interceptor) around a ``Coordinator``,
which holds what the service needs (Redis metadata, the engine, the delivery stage) and runs its
life: loading the shards from Redis at start (a restart rebuilds from the retention log what
was live and what the shards that were down missed), reloading them after a bulk load, the
health statuses, and stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.access import Access, AuthInterceptor
from coordinator.dedupe import Dedupe
from coordinator.deliveries import Deliveries
from coordinator.engine import Engine
from coordinator.handlers import add_service
from coordinator.health import REDIS_HEALTH, SERVICE, shard_health_name
from coordinator.metadata import Metadata
from coordinator.metrics import Metrics, RpcMetrics
from coordinator.ops import ShardHandle
from coordinator.outages import untold_records
from coordinator.overview import Watch
from coordinator.ranking import delivery_score
from coordinator.retention import RoundLog
from coordinator.service import GeoPubSubService
from coordinator.settings import Settings
from coordinator.slots import Slots
from coordinator.slots import warm_up as warm_up_slots
from geopubsub.convert import (
    from_proto_message,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.applus.tree import recentre
from shard.errors import UnavailableError, ValidationError
from shard.geometry import region_bbox
from shard.host.heap import freeze_long_lived, loading
from shard.model import Message, Point, Subscription
from shard.partition_map import DEFAULT_SAMPLE, PartitionMap, bbox_centre
from shard.residual import index_box

log = logging.getLogger(__name__)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

HEALTH_CHECK_S = 1.0
"""How often the coordinator pings Redis and looks at its shards for the health service (its
names: ``coordinator.health``)."""


ShardFactory = Callable[[int], ShardHandle]


class Coordinator:
    """Everything the service needs: Redis metadata, the engine, the delivery stage."""

    def __init__(self, settings: Settings, shard_factory: ShardFactory, *, clock=time.time) -> None:
        self.settings = settings
        self.shard_factory = shard_factory
        self.clock = clock
        self.md = Metadata(settings.redis_url, settings.namespace, timeout_s=settings.deadline_s)
        self.slots = Slots()
        """The subscriptions' slots, shared by every engine (over reloads) and the deliveries."""
        self.log = RoundLog(
            self.md, retention_s=settings.retention_s, max_bytes=settings.log_max_mb << 20
        )
        self.dedupe = Dedupe()
        self._recovered = False
        self.deliveries = Deliveries(
            self.log,
            retention_max=settings.retention_max,
            retention_s=settings.retention_s,
            stream_buffer=settings.stream_buffer,
            stream_buffer_bytes=settings.stream_buffer_bytes,
            max_streams=settings.max_streams,
            clock=clock,
            slots=self.slots,
            dedupe=self.dedupe,
        )
        self.engine: Engine | None = None
        self.watch = Watch(self._subscription)
        """The open Watch streams (``coordinator.overview``), fed each delivered round."""
        self.deliveries.on_delivered.append(self.watch.on_round)
        self.deliveries.scorer = lambda sid, m: delivery_score(self._subscription(sid), m)
        self.started = clock()
        self._reload_lock = asyncio.Lock()
        self.health: health.aio.HealthServicer | None = None
        """The health service (``create_server`` sets it)."""
        self._unhealthy: asyncio.Task | None = None
        self._health_task: asyncio.Task | None = None
        self._stopping = False
        self._health_now: dict[str, int] = {}
        """The status last set per health service name."""
        self._loop_failed = False
        self.access: Access | None = None
        """Token checks (``create_server`` sets it when ``Settings.auth_on``)."""
        self.metrics: Metrics | None = None
        """The Prometheus endpoint (``create_server`` sets it when ``metrics_port`` is given)."""
        self.metrics_port = 0
        """The metrics endpoint's port once it serves."""
        self.replaying: list[asyncio.Future] = []
        """The live messages the last load stores in the shards again (their operations)."""

    async def start(self) -> None:
        """Connect to Redis, load or build the partition map, rebuild every shard from the
        subscriptions in Redis, then start routing."""
        await self.md.ping()
        shards = [self.shard_factory(k) for k in range(self.settings.shards)]
        n = await self._load(shards)
        log.info("loaded %d subscriptions into %d shards", n, len(shards))

    def _subscription(self, sub_id: str) -> Subscription | None:
        return None if self.engine is None else self.engine.subs.get(sub_id)

    @staticmethod
    def _one_shot(payload: bytes) -> Message:
        mp = pb.Message.FromString(payload)
        return from_proto_message(mp, default_id=mp.id, field="one_shot")

    def _live_entry(self, payload: bytes, expiry: float):
        mp = pb.Message.FromString(payload)
        return from_proto_message(mp, default_id=mp.id, field="live"), payload, expiry

    async def _load(
        self,
        shards: list[ShardHandle],
        live=(),
        positions=None,
        owed=None,
        *,
        new_map: bool = False,
        settle: int = 0,
    ) -> int:
        """Read the subscriptions, the ephemeral set and the partition map from Redis (a new
        map with ``new_map``), bulk-load every shard and start a fresh engine over ``shards``;
        the outage records of the first ``settle`` shards (at least ``shards``) dropped at a
        reload. Returns the subscriptions."""
        with loading():  # (no garbage collection until its end: shard.host.heap)
            return await self._load_all(shards, live, positions, owed or {}, new_map, settle)

    async def _load_all(
        self, shards: list[ShardHandle], live, positions, owed, new_map=False, settle=0
    ) -> int:
        s = self.settings
        subs: list[Subscription] = []
        async for batch in self.md.iter_subscriptions():
            subs.extend(batch)
        got = None
        if not self._recovered:  # numbering, log chains, positions, live messages: the log
            got = await self.log.recover(s.shards)
            positions = got.positions
        if positions:  # moving subscriptions where their last move put them
            subs = [_placed(s, positions.get(s.id)) for s in subs]
        self.slots.replace_ephemeral(await self.md.ephemeral_ids())
        pm = await self.md.load_partition_map()
        rebuilt = new_map or pm is None or len(pm) != s.shards
        if rebuilt:
            pm = PartitionMap.build(_centres(subs), s.shards)
            await self.md.save_partition_map(pm)
        self.engine = Engine(
            shards,
            pm,
            on_round=self.deliveries.on_round,
            batch_max=s.batch_max,
            batch_delay_ms=s.batch_delay_ms,
            defer_ms=s.subscribe_defer_ms if s.subscribe_ack == "stored" else 0.0,
            queue_max=s.queue_max,
            max_live_messages=s.max_live_messages,
            clock=self.clock,
            slots=self.slots,
            on_failure=self._engine_failed,
            replace_shard=self.shard_factory,
        )
        per = self.engine.restore(subs)
        recovery = self.engine.recovery
        replayed, skip = list(live), {}
        if got is not None:
            self.slots.restore(got.heads, got.leases, got.cuts)
            self.dedupe.restore(got.published)
            self._recovered = True
            log.info(
                "retention log: %d rounds (%d bytes), %d subscriptions with records",
                len(got.rounds),
                self.log.bytes,
                len(got.heads),
            )
            replayed = [self._live_entry(p, e) for p, e in got.live]
            owed = got.owed
            records = got.outages
            if rebuilt:  # other shards than the records speak of: dropped
                for k in records:
                    recovery.settle(k, None)
                records = {}
            # subscriptions written to Redis whose rounds were not: their shards' records
            # say what their subscribers were told (the older record first)
            untold = await self.md.untold()
            if untold:
                extra = untold_records(
                    untold,
                    lambda x: pm.overlapping(index_box(x)),
                    self.engine.placement,
                )
                await self.log.adopt(extra, list(untold))
                # new ones: what their ids were given before is an earlier subscription's
                self.deliveries.cut(sid for sid, told in untold.items() if told is None)
                for k, rec in extra.items():
                    records[k] = {**rec, **records.get(k, {})}
            if records:  # shards down, or changes untold, when the coordinator before died
                skip = recovery.restart(records, per, replayed, self._one_shot)
        else:  # a reload: every shard is loaded as things are now (the first round's write
            for k in range(max(s.shards, settle)):  # deletes the records the engine before
                recovery.settle(k, None)  # left)
        now = self.clock()
        loaded = await asyncio.gather(
            *(self.engine.load_shard(k, per.get(k, []), now) for k in range(s.shards)),
            return_exceptions=True,
        )
        await self.deliveries.extend_leases()
        del subs, per
        freeze_long_lived()  # 1M subscriptions out of every later collection (shard.host.heap)
        for k, result in enumerate(loaded):  # served without it until a reload succeeds
            if isinstance(result, Exception):
                recovery.uncounted.add(k)
                recovery.failed(k, result, recovery.restarted.pop(k, ([], {}))[0])
            elif isinstance(result, BaseException):
                raise result
        # a message past its expiry goes back only where it was not expired yet
        self.engine.live.owed = {e[0].id: owed[e[0].id] for e in replayed if e[0].id in owed}
        self.engine.start()
        # what shards missed before a crash, with deliveries, after (queued first) the live
        # messages going back into the shards without deliveries: from the log at start, from
        # the engine before at a reload
        recovery.resume()
        self.replaying = self.engine.replay(replayed, skip)
        return len(self.engine.subs)

    def _engine_failed(self, exc: BaseException) -> None:
        """The round loop died (a bug; the engine logged it): the health check says so."""
        self._loop_failed = True
        if self.health is not None:
            names = ("", pb.DESCRIPTOR.services_by_name["GeoPubSub"].full_name)
            self._unhealthy = asyncio.gather(  # (scheduled as it is made)
                *(self.health.set(n, health_pb2.HealthCheckResponse.NOT_SERVING) for n in names)
            )

    async def reload(self) -> int:
        """Rebuild every shard from Redis (after a bulk load) with the same shard actors:
        operations waiting answer UNAVAILABLE; the live messages are stored in the shards
        again (a subscription the bulk load added that matches one gets its REMOVE at expiry
        without an ADD before)."""
        async with self._reload_lock:
            old = self.engine
            await old.send_waiting_subscribes(self.settings.deadline_s)  # (to be told)
            await old.stop()
            await self.deliveries.drain()  # every round written: the positions are current
            n = await self._load(
                old.shards, list(old.live.values()), await self.log.positions(), old.live.owed
            )
            log.info("reloaded %d subscriptions", n)
            return n

    async def rebalance(self, n: int = 0) -> int:
        """A new partition map for ``n`` shards (0: as many as now) from the subscriptions as
        they are, shards added (``shard_factory``) or the last ones removed, and every shard
        rebuilt from Redis with it, the live messages stored again (``reload`` with a new map).
        Refused while a shard is down (what it missed is kept by its old index). The count
        holds until the coordinator starts again with another ``shards`` setting."""
        async with self._reload_lock:
            old = self.engine
            if down := old.recovery.down_shards():
                raise UnavailableError(
                    "rebalance once every shard serves: " + "; ".join(down[k] for k in sorted(down))
                )
            before = len(old.shards)
            n = n or before
            await old.send_waiting_subscribes(self.settings.deadline_s)  # (to be told)
            await old.stop()
            await self.deliveries.drain()
            shards = list(old.shards[:n]) + [self.shard_factory(k) for k in range(before, n)]
            self.settings = dataclasses.replace(self.settings, shards=n)
            count = await self._load(
                shards,
                list(old.live.values()),
                await self.log.positions(),
                None,
                new_map=True,
                settle=max(before, n),
            )
            if self.replaying:  # answered once the live messages are in the shards again
                await asyncio.wait(self.replaying, timeout=self.settings.deadline_s)
            for s in old.shards[n:]:
                with contextlib.suppress(Exception):
                    await s.close()
                if hasattr(s, "kill"):
                    s.kill()
            log.info("rebalanced %d subscriptions over %d shards (were %d)", count, n, before)
            return count

    async def watch_health(self, health_servicer: health.aio.HealthServicer) -> None:
        """Set the health statuses now, and keep them current from now on: every
        ``HEALTH_CHECK_S`` a PING of Redis (bounded by ``deadline_s``) and a look at the
        shards. Overall (``""`` and the GeoPubSub service): SERVING while Redis answers, the
        round loop runs and at least one shard serves; each shard and Redis under a name of
        its own (``shard_health_name``, ``REDIS_HEALTH``)."""
        self.health = health_servicer
        await self._check_health()
        self._health_task = asyncio.get_running_loop().create_task(self._watch_health())

    async def _watch_health(self) -> None:
        # ends on ``_stopping`` too: a cancellation can be lost inside a library call (it was:
        # the CI run that hung 80 minutes in ``stop``, waiting for this task)
        while not self._stopping:
            await asyncio.sleep(HEALTH_CHECK_S)
            if self._stopping:
                return
            try:
                await self._check_health()
            except Exception:  # a bug: the watch goes on
                log.exception("health check failed")

    async def _check_health(self) -> None:
        try:
            t0 = time.perf_counter()
            await self.md.ping()
            if self.metrics is not None:
                self.metrics.redis_ping.observe(time.perf_counter() - t0)
            redis_ok = True
        except UnavailableError as exc:
            redis_ok = False
            if self._health_now.get(REDIS_HEALTH) != NOT_SERVING:
                log.warning("health: %s", exc)
        await self._set_health(redis_ok)

    async def _set_health(self, redis_ok: bool) -> None:
        down = self.engine.recovery.down_shards() if self.engine is not None else {}
        want = {REDIS_HEALTH: SERVING if redis_ok else NOT_SERVING}
        for k in range(self.settings.shards):
            want[shard_health_name(k)] = NOT_SERVING if k in down else SERVING
        overall = redis_ok and not self._loop_failed and len(down) < self.settings.shards
        want[""] = want[SERVICE] = SERVING if overall else NOT_SERVING
        for name, status in want.items():
            if self._health_now.get(name) != status:
                if name in self._health_now:
                    log.warning(
                        "health: %s is %s",
                        name or "the coordinator",
                        health_pb2.HealthCheckResponse.ServingStatus.Name(status),
                    )
                self._health_now[name] = status
                await self.health.set(name, status)

    async def stop(self) -> None:
        self._stopping = True
        if self._health_task is not None:
            self._health_task.cancel()
            # bounded: it also ends by itself within HEALTH_CHECK_S now that _stopping is set
            done, _ = await asyncio.wait({self._health_task}, timeout=2 * HEALTH_CHECK_S + 1)
            if not done:
                log.warning("the health watch did not stop; going on without it")
        if self.engine is not None:
            await self.engine.stop()
        await self.deliveries.drain()
        await self.md.close()
        if self.access is not None:
            await self.access.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self.engine is not None:
            for shard in self.engine.shards:
                close = getattr(shard, "close", None)  # a RayShard's channel
                if close is not None:
                    await close()

    def stalled(self) -> str:
        """Why operations may be waiting: the retention log failing to write, shards down."""
        parts = []
        if self.deliveries.log_failing is not None:
            parts.append(f"the retention log cannot be written ({self.deliveries.log_failing})")
        if self.engine is not None:
            parts += self.engine.recovery.down_shards().values()
        return "; ".join(parts)


def _placed(sub: Subscription, pos: tuple[float, float] | None) -> Subscription:
    """A moving subscription where its last move put it (``pos``: lon, lat)."""
    if pos is None or not sub.moving:
        return sub
    return dataclasses.replace(sub, region=recentre(sub.region, Point(*pos)))


def _centres(subs: Sequence[Subscription]) -> list[tuple[float, float]]:
    step = max(1, len(subs) // DEFAULT_SAMPLE)
    return [bbox_centre(region_bbox(s.region)) for s in subs[::step]]


def _read(field: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValidationError(field, path, f"cannot be read: {exc.strerror}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials of the gRPC API from ``tls_cert`` / ``tls_key`` (and ``tls_client_ca``:
    clients must present a certificate it signed), or None (plaintext)."""
    if not settings.tls_cert:
        return None
    client_ca = _read("tls_client_ca", settings.tls_client_ca) if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(_read("tls_key", settings.tls_key), _read("tls_cert", settings.tls_cert))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


async def create_server(
    settings: Settings, shard_factory: ShardFactory, *, clock=time.time
) -> tuple[grpc.aio.Server, int, Coordinator]:
    """Build, load and start the service on ``settings.host:settings.port`` (port 0: any free
    port); health (SERVING once the shards are loaded) and reflection on. Returns (server, port,
    coordinator); stop with ``await stop_server(server, coordinator)``."""
    metrics = Metrics() if settings.metrics_port else None
    if metrics is not None:  # every round of every shard timed, the replacements' too
        shard_factory = metrics.timed(shard_factory)
    app = Coordinator(settings, shard_factory, clock=clock)
    app.metrics = metrics
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if metrics is not None:  # first: it sees the auth check's refusals too
        interceptors.append(RpcMetrics(metrics))
    if settings.auth_on:
        app.access = Access(
            settings.redis_url, settings.namespace, timeout_s=settings.deadline_s, clock=clock
        )
        await app.access.start()
        interceptors.append(AuthInterceptor(app.access))
    server = grpc.aio.server(interceptors=interceptors)
    add_service(GeoPubSubService(app), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        pb.DESCRIPTOR.services_by_name["GeoPubSub"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    address = f"{settings.host}:{settings.port}"
    credentials = server_credentials(settings)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise ValidationError("port", settings.port, f"cannot bind {settings.host}")
    await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    warm_up_slots()  # the first round does not wait for numba
    await server.start()
    await app.start()
    await app.watch_health(health_servicer)
    if metrics is not None:
        app.deliveries.on_delivered.append(metrics.delivered)
        app.deliveries.on_log_write = metrics.log_write.observe
        metrics.watch(app)
        app.metrics_port = metrics.serve(
            settings.metrics_host, settings.metrics_port, settings.tls_cert, settings.tls_key
        )
        log.info(
            "metrics on %s://%s:%d/metrics",
            "https" if settings.tls_cert else "http",
            settings.metrics_host,
            app.metrics_port,
        )
    return server, port, app


async def stop_server(server: grpc.aio.Server, app: Coordinator, grace: float = 2.0) -> None:
    await app.health.enter_graceful_shutdown()
    await server.stop(grace)
    await app.stop()
