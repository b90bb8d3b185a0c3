"""The coordinator's Prometheus endpoint (``metrics_port``; off by default), with the official
``prometheus_client``: its text format, registry and HTTP(S) server are what every Prometheus
and Grafana expect, and it costs an observation a lock and an add.

What it measures, and where:

* **RPCs**: ``RpcMetrics``, a gRPC server interceptor around every method (the auth check's
  refusals included): calls and their duration (a streaming call's whole life) by method and
  status code.
* **Rounds per shard**: ``TimedShard`` wraps each shard handle; every round a shard is sent
  (``apply``) is timed, its items counted, and a failed one counted apart.
* **Publish to delivery**: from a publish's arrival at the engine (``Op.born``) to its
  deliveries handed to the open streams, after the round's write to the retention log
  (``Deliveries.on_delivered``), for every publish that matched; the log write itself
  (``log_write``), Redis's PING of the health check (``redis_ping``) and the coordinator's
  garbage-collector pauses by generation.
* **State**, read when scraped (``_StateCollector``, on the event loop, so nothing is read
  half-changed): subscriptions, live messages, the queue of operations waiting for a round,
  rounds at the shards, rounds waiting to be written and delivered, open streams, down
  shards, the engine's and the delivery stage's counts (published, deliveries, drops, moves,
  rounds, refusals, shard failures and reloads, gaps, log write failures), the retention log's
  size; and from every shard (one ``figures`` call each, bounded): its subscriptions, live
  messages, CPU seconds, resident memory and collections. A shard that does not answer in time
  has ``geopubsub_shard_up 0`` for that scrape.
* The coordinator process itself (CPU, memory, open files): ``ProcessCollector``.

The endpoint shows counts and timings only, never an id, a region or a term. It binds
``metrics_host`` (loopback by default; another address only with TLS on, or ``insecure``), and
serves HTTPS with the gRPC API's certificate when TLS is on.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from coordinator.rounds import Round

log = logging.getLogger(__name__)

LATENCY_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Histogram buckets of every latency (seconds): a round is ~1-10 ms, a slow one seconds."""
ITEMS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
"""Buckets of a round's items."""
GC_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Buckets of a garbage-collector pause."""
SCRAPE_S = 5.0
"""Longest a scrape waits for the event loop's snapshot and for each shard's figures."""


class Metrics:
    """The registry and every instrument; ``serve`` starts the HTTP(S) endpoint."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.rpcs = Counter(
            "geopubsub_rpc_handled",
            "gRPC calls completed, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "geopubsub_rpc_duration_seconds",
            "gRPC call duration (a streaming call: its whole life), by method and status code",
            ["method", "code"],
            buckets=LATENCY_S,
            registry=r,
        )
        self.round_seconds = Histogram(
            "geopubsub_shard_round_duration_seconds",
            "A round's call to a shard, sent to answered (failed ones included)",
            ["shard"],
            buckets=LATENCY_S,
            registry=r,
        )
        self.round_items = Histogram(
            "geopubsub_shard_round_items",
            "Items (publishes, subscribes, moves, ...) in a round's call to a shard",
            ["shard"],
            buckets=ITEMS,
            registry=r,
        )
        self.round_failures = Counter(
            "geopubsub_shard_round_failures",
            "Rounds a shard failed (down, dead or past its deadline)",
            ["shard"],
            registry=r,
        )
        self.publish_delivery = BulkHistogram(
            "geopubsub_publish_to_delivery_seconds",
            "A matching publish, from its arrival to its deliveries handed to the streams "
            "(after the round's write to the retention log)",
            LATENCY_S,
        )
        r.register(self.publish_delivery)
        self.log_write = Histogram(
            "geopubsub_log_write_duration_seconds",
            "A round's write to the retention log in Redis (one script call)",
            buckets=LATENCY_S,
            registry=r,
        )
        self.redis_ping = Histogram(
            "geopubsub_redis_ping_seconds",
            "The health check's PING of Redis",
            buckets=LATENCY_S,
            registry=r,
        )
        self.gc_pause = Histogram(
            "geopubsub_gc_pause_seconds",
            "The coordinator's garbage-collector pauses, by generation",
            ["generation"],
            buckets=GC_S,
            registry=r,
        )
        ProcessCollector(registry=r)
        self._gc_t0 = 0.0
        self._server: Any = None

    # ---- what the coordinator calls ------------------------------------------------------------
    def watch(self, app: Any) -> None:
        """Read ``app`` (a ``coordinator.server.Coordinator``) when scraped, and time the
        garbage collector from now on."""
        self.registry.register(_StateCollector(app, asyncio.get_running_loop()))
        gc.callbacks.append(self._gc)

    def delivered(self, rnd: Round, now: float) -> None:
        """A round's deliveries were handed to the streams at ``now`` (``perf_counter``): each
        publish of it that matched took ``now - op.born`` (one histogram update a round)."""
        born = [op.born for op, a, b in rnd.spans if b > a and op.kind == "pub"]
        if born:
            self.publish_delivery.observe_many(now - np.array(born))

    def timed(self, factory: Callable[[int], Any]) -> Callable[[int], Any]:
        """A shard factory whose handles time their rounds (``TimedShard``)."""
        return lambda k: TimedShard(factory(k), k, self)

    def serve(self, host: str, port: int, certfile: str = "", keyfile: str = "") -> int:
        """Start the endpoint (a thread of its own); returns its port."""
        tls = {"certfile": certfile, "keyfile": keyfile} if certfile else {}
        self._server, _ = _start_http_server(port, host, self.registry, **tls)
        return self._server.server_port

    def stop(self) -> None:
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            dt = time.perf_counter() - self._gc_t0
            self.gc_pause.labels(str(info["generation"])).observe(dt)


class BulkHistogram(Collector):
    """A histogram updated a batch at a time (``observe_many``: one ``searchsorted`` for a
    round's publishes, against ``prometheus_client``'s ~0.6 µs a call for each), exported as an
    ordinary Prometheus histogram."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(buckets, np.float64)
        self.counts = np.zeros(len(buckets) + 1, np.int64)  # the last: above every bound
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: np.ndarray) -> None:
        idx = np.searchsorted(self.bounds, values, side="left")  # value <= bound: that bucket
        add = np.bincount(idx, minlength=self.counts.shape[0])
        with self._lock:
            self.counts += add
            self.sum += float(values.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cum = np.cumsum(self.counts).tolist()
            total = self.sum
        buckets = [(repr(float(b)), c) for b, c in zip(self.bounds.tolist(), cum, strict=False)]
        buckets.append(("+Inf", cum[-1]))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)


class TimedShard:
    """A shard handle whose rounds (``apply``) are timed and counted; everything else is the
    handle's own."""

    def __init__(self, inner: Any, k: int, metrics: Metrics) -> None:
        self.inner = inner
        label = str(k)
        self._seconds = metrics.round_seconds.labels(label)
        self._items = metrics.round_items.labels(label)
        self._failures = metrics.round_failures.labels(label)

    async def apply(self, ops: list, now: float):
        t0 = time.perf_counter()
        try:
            return await self.inner.apply(ops, now)
        except BaseException:
            self._failures.inc()
            raise
        finally:
            self._seconds.observe(time.perf_counter() - t0)
            self._items.observe(len(ops))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every call of the server, by method (the last part of its path) and
    status code (OK unless the call ended aborted or raised)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        seconds = self.metrics.rpc_seconds
        count = self.metrics.rpcs

        def done(context, t0: float, failed: bool) -> None:
            code = _code(context, failed)
            seconds.labels(method, code).observe(time.perf_counter() - t0)
            count.labels(method, code).inc()

        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind)
            if behavior is not None:
                wrapped = _timed(behavior, done)
                return getattr(grpc, f"{kind}_rpc_method_handler")(
                    wrapped,
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler


def _code(context, failed: bool) -> str:
    """The status code a call ended with: what it was aborted with, else OK, or UNKNOWN for an
    exception that was not an abort (grpc's own answer to it), CANCELLED when the client
    went."""
    code = None
    try:
        code = context.code()
    except Exception:  # (older grpc: no code() on the aio context)
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for c in grpc.StatusCode:
            if c.value[0] == code:
                return c.name
    if context.cancelled() if hasattr(context, "cancelled") else False:
        return "CANCELLED"
    return "UNKNOWN" if failed else "OK"


def _timed(behavior, done):
    """``behavior`` (a coroutine function or an async generator function of (request or
    request iterator, context)) timed from call to end, ``done(context, t0, failed)`` at the
    end."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request, context):
            t0, failed = time.perf_counter(), True
            try:
                async for response in behavior(request, context):
                    yield response
                failed = False
            finally:
                done(context, t0, failed)

        return stream

    async def unary(request, context):
        t0, failed = time.perf_counter(), True
        try:
            out = await behavior(request, context)
            failed = False
            return out
        finally:
            done(context, t0, failed)

    return unary


class _StateCollector(Collector):
    """The figures read when scraped: a snapshot taken on the event loop, each shard's figures
    gathered there too."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        try:
            snap = asyncio.run_coroutine_threadsafe(self._snapshot(), self.loop).result(
                2 * SCRAPE_S
            )
        except Exception as exc:  # the loop is stopping, or stuck: the instruments still show
            log.warning("metrics: no state snapshot (%s)", type(exc).__name__)
            g = GaugeMetricFamily("geopubsub_state_up", "Whether the scrape read the state")
            g.add_metric([], 0)
            yield g
            return
        g = GaugeMetricFamily("geopubsub_state_up", "Whether the scrape read the state")
        g.add_metric([], 1)
        yield g
        for name, help_, value in snap["gauges"]:
            g = GaugeMetricFamily(f"geopubsub_{name}", help_)
            g.add_metric([], value)
            yield g
        for name, help_, value in snap["counters"]:
            c = CounterMetricFamily(f"geopubsub_{name}", help_)
            c.add_metric([], value)
            yield c
        yield from _shard_families(snap["shards"])

    async def _snapshot(self) -> dict[str, Any]:
        app = self.app
        eng = app.engine
        dl = app.deliveries
        gauges = [
            ("subscriptions", "Subscriptions", len(eng.subs)),
            ("live_messages", "Stored messages not yet expired", len(eng.live)),
            ("queued_operations", "Operations waiting for a round", len(eng.pending)),
            ("rounds_in_flight", "Rounds sent to the shards and not yet merged", len(eng.inflight)),
            (
                "rounds_to_deliver",
                "Rounds merged, waiting for their log write and delivery",
                dl.backlog,
            ),
            ("open_streams", "Open StreamResults calls", dl.open_streams),
            ("shards", "Shards", len(eng.shards)),
            ("shards_down", "Shards down (being reloaded)", len(eng.recovery.down_shards())),
            ("log_rounds", "Rounds kept in the retention log", len(app.log.kept)),
            ("log_bytes", "Bytes of the retention log in Redis", app.log.bytes),
            ("uptime_seconds", "Seconds since the coordinator started", app.clock() - app.started),
        ]
        st = eng.stats
        counters = [
            ("published", "Publishes routed (stored and one-shot)", st["published"]),
            ("deliveries", "Deliveries (+ and -) numbered", dl.delivered),
            ("dropped_deliveries", "Deliveries dropped from a stream's buffer", dl.dropped),
            ("gaps", "GAP deliveries served to resuming streams", dl.gaps),
            ("log_write_failures", "Retention log writes that failed (retried)", dl.log_failures),
            ("moves", "Location updates routed", st["moves"]),
            ("rounds", "Rounds merged", st["rounds"]),
            ("rejected_overload", "Operations refused: queue full", st["rejected_overload"]),
            (
                "rejected_live_cap",
                "Publishes refused: max_live_messages reached",
                st["rejected_live_cap"],
            ),
            ("shard_failures", "Shard calls that failed", st["shard_failures"]),
            ("shard_reloads", "Shards reloaded after a failure", st["shard_reloads"]),
        ]
        shards = await asyncio.gather(*(_figures(s) for s in eng.shards), return_exceptions=True)
        return {"gauges": gauges, "counters": counters, "shards": shards}


async def _figures(shard: Any) -> dict[str, Any]:
    return await asyncio.wait_for(shard.figures(), SCRAPE_S)


def _shard_families(per: list) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "geopubsub_shard_up", "Whether the shard answered the scrape", labels=["shard"]
    )
    info = GaugeMetricFamily(
        "geopubsub_shard_info", "The Ray node a shard runs on (always 1)", labels=["shard", "node"]
    )
    subs = GaugeMetricFamily(
        "geopubsub_shard_subscriptions", "Subscriptions on the shard", labels=["shard"]
    )
    live = GaugeMetricFamily(
        "geopubsub_shard_live_messages", "Live messages stored on the shard", labels=["shard"]
    )
    cpu = CounterMetricFamily(
        "geopubsub_shard_cpu_seconds", "CPU time of the shard's process", labels=["shard"]
    )
    rss = GaugeMetricFamily(
        "geopubsub_shard_resident_memory_bytes",
        "Resident memory of the shard's process",
        labels=["shard"],
    )
    gcs = CounterMetricFamily(
        "geopubsub_shard_gc_collections",
        "Garbage collections in the shard's process",
        labels=["shard", "generation"],
    )
    gcs_s = CounterMetricFamily(
        "geopubsub_shard_gc_pause_seconds",
        "Time the shard's process spent in garbage collections",
        labels=["shard", "generation"],
    )
    for k, f in enumerate(per):
        label = str(k)
        if isinstance(f, BaseException):
            up.add_metric([label], 0)
            continue
        up.add_metric([label], 1)
        if "node" in f:
            info.add_metric([label, f["node"]], 1)
        subs.add_metric([label], f["subscriptions"])
        live.add_metric([label], f["live_messages"])
        if "cpu_s" in f:
            cpu.add_metric([label], f["cpu_s"])
            rss.add_metric([label], f["rss_bytes"])
        for g, (n, s) in enumerate(
            zip(f.get("gc_collections", ()), f.get("gc_pause_s", ()), strict=False)
        ):
            gcs.add_metric([label, str(g)], n)
            gcs_s.add_metric([label, str(g)], s)
    yield from (up, info, subs, live, cpu, rss, gcs, gcs_s)
