"""The Prometheus endpoint of a real cluster (Ray shard actors, redis-server, gRPC over loopback)
under traffic: the figures it shows are the traffic's, they move as the traffic does, and the
Grafana dashboard in ``deploy/grafana`` asks for nothing else."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import random
import socket
import urllib.request
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from coordinator.metrics import LATENCY_S, BulkHistogram
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.brute import subscription_matches
from shard.errors import ValidationError
from tests.clusters import Cluster, coordinator_settings
from tests.workloads import random_message, random_subscription

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DASHBOARD = Path(__file__).parent.parent / "deploy" / "grafana" / "geopubsub.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels) -> float:
    """The sum of ``name`` over every label set that has ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


async def _publish(stub, msgs) -> list[int]:
    async def requests():
        for m in msgs:
            yield pb.PublishRequest(message=to_proto_message(m))

    return [r.matched async for r in stub.PublishStream(requests())]


def test_the_endpoint_shows_the_traffic_of_a_real_cluster(ray_session, redis_url):
    rng = random.Random(3)
    subs = [random_subscription(rng, f"s{i}") for i in range(60)]
    msgs = [dataclasses.replace(random_message(rng, f"m{i}"), ttl=600.0) for i in range(100)]
    port = _free_port()
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, metrics_port=port)

    async def main():
        async with Cluster(settings) as c:
            for s in subs:
                await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(s)))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await c.stub.Subscribe(pb.SubscribeRequest())
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            matched = await _publish(c.stub, msgs[:80])
            assert matched == [sum(subscription_matches(s, m) for s in subs) for m in msgs[:80]]
            gc.collect()  # (the coordinator runs in this process: a pause it times)
            await asyncio.sleep(1.5)  # a health check (and its PING of Redis) has run
            before = await asyncio.to_thread(scrape, port)

            assert value(before, "geopubsub_state_up") == 1
            assert value(before, "geopubsub_rpc_handled_total", method="Subscribe", code="OK") == 60
            assert (
                value(
                    before,
                    "geopubsub_rpc_handled_total",
                    method="Subscribe",
                    code="INVALID_ARGUMENT",
                )
                == 1
            )
            assert (
                value(before, "geopubsub_rpc_handled_total", method="PublishStream", code="OK") == 1
            )
            assert total(before, "geopubsub_rpc_duration_seconds_count", method="Subscribe") == 61
            assert value(before, "geopubsub_published_total") == 80
            assert value(before, "geopubsub_deliveries_total") == sum(matched)
            assert value(before, "geopubsub_subscriptions") == 60
            assert value(before, "geopubsub_live_messages") == 80
            assert value(before, "geopubsub_publish_to_delivery_seconds_count") == sum(
                1 for n in matched if n
            )
            placed = sum(len(p) for p in c.app.engine.placement.values())
            assert total(before, "geopubsub_shard_subscriptions") == placed >= 60
            for k in ("0", "1"):
                assert value(before, "geopubsub_shard_up", shard=k) == 1
                assert value(before, "geopubsub_shard_round_duration_seconds_count", shard=k) > 0
                assert value(before, "geopubsub_shard_cpu_seconds_total", shard=k) > 0
                assert value(before, "geopubsub_shard_resident_memory_bytes", shard=k) > 10e6
            assert value(before, "geopubsub_log_write_duration_seconds_count") > 0
            assert value(before, "geopubsub_redis_ping_seconds_count") > 0
            assert value(before, "geopubsub_gc_pause_seconds_count", generation="2") > 0
            assert value(before, "process_resident_memory_bytes") > 0

            # more traffic: the figures move by what it was
            await c.stub.Unsubscribe(pb.UnsubscribeRequest(id="s0"))
            more = await _publish(c.stub, msgs[80:])
            after = await asyncio.to_thread(scrape, port)
            assert value(after, "geopubsub_published_total") == 100
            assert value(after, "geopubsub_deliveries_total") == sum(matched) + sum(more)
            assert value(after, "geopubsub_subscriptions") == 59
            assert value(after, "geopubsub_live_messages") == 100
            assert (
                value(after, "geopubsub_rpc_handled_total", method="PublishStream", code="OK") == 2
            )
            assert value(after, "geopubsub_rpc_handled_total", method="Unsubscribe", code="OK") == 1
            rounds = "geopubsub_shard_round_duration_seconds_count"
            assert total(after, rounds) > total(before, rounds)
            assert total(after, "geopubsub_shard_round_items_sum") > total(
                before, "geopubsub_shard_round_items_sum"
            )
            assert_dashboard_asks_only_for({name for name, _ in after})
        # stopped: the endpoint is gone with the coordinator
        with pytest.raises(OSError):
            await asyncio.to_thread(scrape, port)

    asyncio.run(main())


def assert_dashboard_asks_only_for(names: set[str]) -> None:
    """Every metric a panel of the Grafana dashboard queries is one the endpoint exports
    (``names``: its samples' names, a histogram's and a counter's series included)."""
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["uid"]
    queried = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            queried |= {
                w for w in _words(target["expr"]) if w.startswith(("geopubsub_", "process_"))
            }
    assert len(queried) > 20, queried
    missing = sorted(q for q in queried if q not in names)
    assert missing == [], missing


def _words(expr: str) -> list[str]:
    out, word = [], []
    for ch in expr + " ":
        if ch.isalnum() or ch == "_":
            word.append(ch)
        elif word:
            out.append("".join(word))
            word = []
    return out


@pytest.mark.parametrize(
    "flags, field",
    [
        ({"metrics_port": 70000}, "metrics_port"),
        ({"metrics_port": 9464, "metrics_host": "0.0.0.0"}, "metrics_host"),
        ({"metrics_port": 50051, "port": 50051}, "metrics_port"),
    ],
)
def test_bad_metrics_settings_name_the_field(flags, field):
    with pytest.raises(ValidationError, match=field):
        Settings.load(flags=flags)


def test_calls_the_auth_check_refuses_are_counted_with_their_code(redis_url):
    """The metrics interceptor comes before the token check: a call without a token is
    counted UNAUTHENTICATED (in-process shards; the endpoint is the same)."""
    port = _free_port()
    flags = {"port": 0, "redis_url": redis_url, "namespace": uuid.uuid4().hex}
    settings = Settings.load(flags={**flags, "auth": "on", "metrics_port": port})

    async def main():
        server, grpc_port, app = await create_server(settings, LocalShard)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                stub = pb_grpc.GeoPubSubStub(ch)
                for _ in range(3):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.GetStats(pb.GetStatsRequest(), timeout=60)
                    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            got = await asyncio.to_thread(scrape, port)
            refused = {"method": "GetStats", "code": "UNAUTHENTICATED"}
            assert value(got, "geopubsub_rpc_handled_total", **refused) == 3
            assert value(got, "geopubsub_rpc_duration_seconds_count", **refused) == 3
            assert value(got, "geopubsub_rpc_handled_total", method="GetStats", code="OK") == 0
        finally:
            await stop_server(server, app)

    asyncio.run(main())


def test_the_bulk_histogram_exports_what_prometheus_client_s_own_would():
    """Publish-to-delivery latencies are added a round at a time (``BulkHistogram``): the same
    buckets, counts and sum as ``prometheus_client.Histogram`` fed one value at a time, the
    values on a bucket's bound and past the last one included."""
    values = np.random.default_rng(1).exponential(0.01, 5000)
    values[:5] = [0.0005, 0.001, 10.0, 11.0, 0.0]
    own = CollectorRegistry()
    one = Histogram("x", "x", buckets=LATENCY_S, registry=own)
    for v in values:
        one.observe(float(v))
    bulk = CollectorRegistry()
    many = BulkHistogram("x", "x", LATENCY_S)
    bulk.register(many)
    for part in np.array_split(values, 7):
        many.observe_many(part)

    def samples(registry):
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in registry.collect()
            for s in f.samples
            if not s.name.endswith("_created")
        }

    a, b = samples(own), samples(bulk)
    assert a.keys() == b.keys()
    assert all(a[k] == pytest.approx(b[k], rel=1e-12) for k in a)
