"""``geopubsub bench topk --cluster``: top-k publishes end to end through gRPC (paper 001 in the
cluster: ``coordinator.topk``).

Starts an empty local cluster (``--shards``, Redis, Ray, the coordinator), registers the top-k
subscriptions of ``--subs`` (``--register load``: the Spark bulk loader, then Reload, the
default; ``grpc``: Subscribe calls, many in flight -- a top-k subscription inserted live
costs its shard ~0.1-0.25 ms, ``shard.topk.hosted``), then measures

* **latency**: unary ``Publish`` calls with ``top_k`` = ``--k``, one at a time, on the first
  ``--serial`` events: p50 / p99 ms a call (the round through every shard and the merge);
* **throughput**: every event published through one ``PublishStream``, ``--batch`` events a
  request, the stream's window full: events/s;

and checks that every answer counted min(k, subscriptions) deliveries. The cluster scores with
MaxDist = the lon/lat domain's diagonal (``shard.topk.model.DEFAULT_MAX_DIST``); which
subscriptions receive each event is checked against the oracle by ``tests/test_topk_cluster.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from geopubsub.client import open_channel
from geopubsub.convert import to_proto_message
from geopubsub.tools.bench_e2e import settle, start_cluster
from geopubsub.tools.register import bulk_load, register_subscriptions
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.model import Message
from shard.topk.model import TopKEvent
from shard.workload import read_subscriptions


def _messages(events: Sequence[TopKEvent], tag: str) -> list[Message]:
    """The events as top-k publish messages, with ids of their own per phase (a client-given id
    is published once)."""
    return [Message(f"{e.id}~{tag}", (), e.point, None, attributes=e.attributes) for e in events]


async def _phases(target: str, events: Sequence[TopKEvent], k: int, args) -> dict[str, Any]:
    want = min(k, args.n_subs)
    bad = 0
    async with open_channel(target, None, aio=True) as channel:
        stub = pb_grpc.GeoPubSubStub(channel)
        serial = _messages(events[: args.serial], "s")
        lat = []
        for m in serial:
            t0 = time.perf_counter()
            r = await stub.Publish(pb.PublishRequest(message=to_proto_message(m), top_k=k))
            lat.append(time.perf_counter() - t0)
            bad += r.matched != want
        msgs = _messages(events, "t")
        reqs = [
            pb.PublishRequest(
                messages=[to_proto_message(m) for m in msgs[i : i + args.batch]], top_k=k
            )
            for i in range(0, len(msgs), args.batch)
        ]
        t0 = time.perf_counter()
        done = 0
        async for r in stub.PublishStream(iter(reqs)):
            bad += sum(x != want for x in r.matches)
            done += len(r.matches)
        secs = time.perf_counter() - t0
    lat.sort()
    return {
        "serial_calls": len(lat),
        "p50_ms": round(statistics.median(lat) * 1e3, 3) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3, 3) if lat else None,
        "stream_events": done,
        "stream_batch": args.batch,
        "events_per_s": round(done / secs, 1) if secs > 0 else None,
        "wrong_counts": bad,
    }


def run_cluster(args, events: Sequence[TopKEvent], k: int, log) -> dict[str, Any]:
    """The end-to-end figures (module docstring) of the subscriptions in ``args.subs``."""
    subs = list(read_subscriptions(args.subs))  # the top-k form is a subscription's too
    args.n_subs = len(subs)
    cluster = start_cluster(args.data_dir, args.shards)
    try:
        if args.register == "load":
            reg = bulk_load(args.subs, cluster, log)
        else:
            log(f"registering {len(subs):,} top-k subscriptions at {cluster.target} ...")
            done = asyncio.run(register_subscriptions(cluster.target, subs, batch=500))
            log(f"    {done.registered:,} in {done.seconds:.1f} s ({done.per_s:,.0f}/s)")
            reg = done.as_dict()
        settle(cluster.redis_url)
        out = asyncio.run(_phases(cluster.target, events, k, args))
    finally:
        log("stopping the cluster ...")
        cluster.stop()
    return {"shards": args.shards, "registration": reg, **out}
