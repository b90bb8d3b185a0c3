"""Top-k publishes through the cluster (paper 001; ``coordinator.topk``, ``shard.topk.hosted``):
real Ray shard actors (three), redis-server and gRPC over loopback. Every top-k subscription
receives exactly the deliveries the brute-force oracle gives it (same messages, same order,
bit-identical scores) -- after subscribing, replacing, moving and unsubscribing some, and after a
Reload that rebuilds every shard from Redis -- and bad requests are refused naming the field."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import pytest

from geopubsub.convert import from_proto_subscription, to_proto_message, to_proto_subscription
from geopubsub.tools.gen_topk import generate_topk
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.model import (
    Message,
    Point,
    Rect,
    Subscription,
    message_from_dict,
    subscription_from_dict,
)
from shard.topk.hosted import as_event
from shard.topk.model import TopKSubscription
from shard.topk.oracle import reference_topk
from tests.clusters import Cluster, coordinator_settings, settled, subscribe_all

pytestmark = pytest.mark.e2e


def _oracle(subs: dict[str, Subscription], msgs: list[Message], k: int) -> dict[str, list]:
    """Each subscription's expected deliveries (message id, score), in publish order."""
    tk = [TopKSubscription(s.id, s.predicates, s.alpha, s.region) for s in subs.values()]
    out: dict[str, list] = {}
    for m in msgs:  # (terms count as "#term" attributes: shard.topk.hosted.as_event)
        for sid, score in reference_topk(tk, as_event(m), k):
            out.setdefault(sid, []).append((m.id, score))
    return out


async def _received(stub, sid: str, after: int, n: int) -> list[pb.Delivery]:
    """The next ``n`` deliveries of ``sid`` after sequence ``after`` (at most 10 s)."""
    if not n:
        return []
    stream = stub.StreamResults(pb.StreamResultsRequest(id=sid, after_sequence=after))
    try:
        it = aiter(stream)
        return [await asyncio.wait_for(anext(it), 10) for _ in range(n)]
    finally:
        stream.cancel()


def test_topk_publishes_reach_the_oracles_k_best(ray_session, redis_url, tmp_path):
    rng = random.Random(5)
    paths = generate_topk(300, 60, tmp_path, seed=4, n_attrs=12, cardinality=6, clusters=5)
    raw = [json.loads(x) for x in Path(paths["subs"]).read_text().splitlines()]
    for i, d in enumerate(raw):  # spread over the world (the shards' partitions)
        d["moving"] = i % 4 == 0
        d["point"] = [rng.uniform(-179, 179), rng.uniform(-89, 89)]
        if i % 3 == 0:  # a keyword scored as the attribute "#coffee"
            d["predicates"].append({"attr": "#coffee", "op": "=", "value": 1, "weight": 1})
    subs = {s.id: s for s in map(subscription_from_dict, raw)}
    events = [
        message_from_dict({**json.loads(x), "keywords": ["coffee"] * (i % 2)}, need_terms=False)
        for i, x in enumerate(Path(paths["events"]).read_text().splitlines())
    ]
    plain = [Subscription(f"p{i}", (("x",),), Rect(-180, -90, 180, 90)) for i in range(20)]
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, shards=3)
    seqs: dict[str, int] = {}

    async def publish(stub, msgs, k) -> list[int]:
        resp = await stub.Publish(
            pb.PublishRequest(messages=[to_proto_message(m) for m in msgs], top_k=k)
        )
        return list(resp.matches)

    async def check(stub, msgs, k) -> None:
        got = await publish(stub, msgs, k)
        want = _oracle(subs, msgs, k)
        assert got == [min(k, len(subs))] * len(msgs)
        assert sum(map(len, want.values())) == sum(got)
        for sid, expected in want.items():
            ds = await _received(stub, sid, seqs.get(sid, 0), len(expected))
            assert [(d.message.id, d.score) for d in ds] == expected, sid
            assert all(d.kind == pb.Delivery.ADD for d in ds)
            seqs[sid] = ds[-1].sequence

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            await subscribe_all(stub, [*subs.values(), *plain])
            await settled(c.app.engine)  # (routed: a Subscribe may be answered before)
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="s0"))
            assert from_proto_subscription(got) == subs["s0"]
            placed = c.app.engine.placement
            assert {placed[s][0] for s in subs} == {0, 1, 2}  # spread over the shards
            assert all(len(placed[s]) == 1 for s in subs)
            await check(stub, events[:20], 5)
            await check(stub, events[20:30], 1)
            # a plain publish does not reach a top-k subscription, nor a top-k one a plain one
            resp = await stub.Publish(
                pb.PublishRequest(message=to_proto_message(Message("plain", ("x",), Point(0, 0))))
            )
            assert resp.matched == len(plain)
            # moves, a replacement, an unsubscription
            movers = [s for s in subs.values() if s.moving][:10]
            for s in movers:
                p = Point(rng.uniform(-170, 170), rng.uniform(-80, 80))
                moved = await stub.UpdateLocation(
                    pb.UpdateLocationRequest(id=s.id, point=pb.Point(lon=p.lon, lat=p.lat))
                )
                assert not moved.updates
                subs[s.id] = Subscription(s.id, (), p, True, predicates=s.predicates, alpha=s.alpha)
            d = {**raw[1], "alpha": 0.9}
            subs["s1"] = subscription_from_dict(d)
            await stub.Subscribe(
                pb.SubscribeRequest(subscription=to_proto_subscription(subs["s1"]))
            )
            await stub.Unsubscribe(pb.UnsubscribeRequest(id="s2"))
            del subs["s2"]
            await check(stub, events[30:45], 10)
            await stub.Reload(pb.ReloadRequest(), timeout=120)
            await check(stub, events[45:], 7)
            # bad requests, each refused naming its field
            top = to_proto_message(events[0])
            for req, field in (
                (pb.PublishRequest(message=top, top_k=1001), "top_k"),
                (
                    pb.PublishRequest(
                        message=to_proto_message(
                            Message("r", (), Rect(0, 0, 1, 1), attributes=events[0].attributes)
                        ),
                        top_k=3,
                    ),
                    "message.rect",
                ),  # fmt: skip
                (
                    pb.PublishRequest(
                        message=to_proto_message(Message("t", (), Point(0, 0), 5.0)), top_k=3
                    ),
                    "message.ttl_s",
                ),  # fmt: skip
            ):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Publish(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
                assert field in e.value.details(), e.value.details()
            bad = to_proto_subscription(subs["s0"])
            bad.keywords.append("x")
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Subscribe(pb.SubscribeRequest(subscription=bad))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "subscription.keywords" in e.value.details(), e.value.details()

    asyncio.run(main())


def test_gen_topk_and_bench_topk_through_a_local_cluster(tmp_path):
    """``geopubsub gen-topk`` then ``geopubsub bench topk --cluster`` (a local cluster started
    and stopped: redis-server, Ray, the coordinator process): every top-k publish counted k."""
    root = Path(__file__).resolve().parent.parent
    cli = [sys.executable, "-m", "geopubsub.tools.cli"]
    gen = [*cli, "gen-topk", "--out", str(tmp_path), "--subs", "500", "--events", "60"]
    proc = subprocess.run([*gen, "--attrs", "20"], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    argv = [*cli, "bench", "topk", "--subs", str(tmp_path / "subs.jsonl"), "--msgs"]
    argv += [str(tmp_path / "events.jsonl"), "--k", "5", "--cluster", "--serial", "20"]
    argv += ["--batch", "16", "--data-dir", str(tmp_path / "cluster"), "--json"]
    argv += ["--register", "grpc"]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    e = r["cluster"]
    assert e["registration"]["registered"] == 500 and e["stream_events"] == 60
    assert e["wrong_counts"] == 0 and e["serial_calls"] == 20 and e["p50_ms"] > 0
    assert r["check"]["identical"]
