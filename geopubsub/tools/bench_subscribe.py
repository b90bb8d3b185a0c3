"""``geopubsub bench subscribe``: live Subscribe / Unsubscribe through gRPC.

Starts an empty, detached, supervised local cluster in ``--data-dir`` (as ``bench soak`` does),
optionally bulk-loads ``--base`` first (so that the tree the subscriptions go into is large), then:

1. **throughput**, for each ``--batch`` size: the ``--count`` subscriptions of ``--subs`` (ids
   prefixed ``live-``, so that none replaces a base one) registered with ``--in-flight`` calls
   pending and ``batch`` subscriptions a call (``SubscribeRequest.subscriptions``), then removed
   the same way (``UnsubscribeRequest.ids``). Each phase prints its rate and the CPU it cost per
   subscription in the shard actors, the coordinator and redis-server (read before and after).
   The first phase grows the tree from its base (from empty without ``--base``).
2. **latency**: single Subscribe calls (one subscription each, fresh ids) at ``--rate`` a
   second, sent on schedule whatever the answers (open loop), for ``--latency-duration`` s:
   p50 / p99 / max of each call's time, the CPU per call of each kind of process, the rounds
   the coordinator made meanwhile and the shards' CPU per round (all shards together); they are
   removed afterwards (not timed). Before it, ``--idle-window`` s with no calls: the shards' CPU
   a second with nothing to do (Ray's own threads: its task loop checks for signals every 10
   ms), reported beside the phase's, and the phase's shard CPU a call net of it.

The cluster it started is stopped, on error and Ctrl-C too. ``--json``: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from deploy.local import sigterm_as_interrupt
from geopubsub.client import CHANNEL_OPTIONS
from geopubsub.convert import to_proto_subscription
from geopubsub.tools.bench_chaos import check_files, say, start_supervised, stopped_at_exit
from geopubsub.tools.bench_e2e import settle
from geopubsub.tools.bench_soak import ClusterProcesses
from geopubsub.tools.gen import generate
from geopubsub.tools.register import bulk_load, register_subscriptions
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import ValidationError
from shard.host.heap import freeze_long_lived
from shard.host.runtime import hand_over_promptly
from shard.limits import MAX_SUBSCRIBE_BATCH
from shard.workload import read_subscriptions

_CPUCLOCK_SCHED = 2
"""Linux's per-process CPU clock kind that counts scheduled run time (``CPUCLOCK_SCHED``)."""

LIVE_PREFIX = "live-"
"""Prefix of the ids the bench registers (a base subscription is never replaced)."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far, to the nanosecond (0.0 once it is gone).

    Read from the process's CPU-time clock (Linux's clock id for another process,
    ``clock_getcpuclockid``'s encoding), which counts every thread, exited ones too. The ticks of
    ``/proc/<pid>/stat`` (10 ms) are the fallback: a shard doing a few milliseconds of work
    between two readings would show none in them.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by the cluster's shard actors, its coordinator and its redis-server
    between ``start()`` and ``stop()``."""

    def __init__(self, data_dir: Path) -> None:
        self.processes = ClusterProcesses(data_dir)
        self._at: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        pids = self.processes.now()
        shards = sum(cpu_s(p) for n, p in pids.items() if n.startswith("shard-actor"))
        return {
            "shards": shards,
            "coordinator": cpu_s(pids.get("coordinator", 0)),
            "redis": cpu_s(pids.get("redis-server", 0)),
        }

    def start(self) -> None:
        self._at = self._now()

    def stop(self) -> dict[str, float]:
        now = self._now()
        return {k: now[k] - self._at[k] for k in now}


async def unregister(target: str, ids: Sequence[str], *, in_flight: int, batch: int) -> float:
    """Unsubscribe ``ids`` with ``in_flight`` calls pending, ``batch`` ids a call; seconds."""
    parts = [list(ids[a : a + batch]) for a in range(0, len(ids), batch)]
    it = iter(parts)
    t0 = time.perf_counter()
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.GeoPubSubStub(channel)

        async def worker() -> None:
            for part in it:
                if len(part) == 1:
                    request = pb.UnsubscribeRequest(id=part[0])
                else:
                    request = pb.UnsubscribeRequest(ids=part)
                await stub.Unsubscribe(request, timeout=60.0)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - t0


async def paced_latency(
    target: str, subs: Sequence, rate: float, duration_s: float
) -> tuple[list[float], int]:
    """Single Subscribe calls at ``rate``/s for ``duration_s`` (each sent at its scheduled time,
    answered or not); the seconds each took, and the rounds the coordinator made meanwhile."""
    n = min(len(subs), int(rate * duration_s))
    requests = [pb.SubscribeRequest(subscription=to_proto_subscription(s)) for s in subs[:n]]
    took: list[float] = []
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.GeoPubSubStub(channel)
        # connected before the clock starts
        rounds0 = (await stub.GetStats(pb.GetStatsRequest())).rounds

        async def one(request) -> None:
            t = time.perf_counter()
            await stub.Subscribe(request, timeout=60.0)
            took.append(time.perf_counter() - t)

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for i, request in enumerate(requests):
            delay = t0 + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(request)))
        await asyncio.gather(*tasks)
        # a Subscribe may be answered before its round (``subscribe_ack``): a publish queued
        # after them all returns once their rounds are done, so the CPU measured has them
        barrier = pb.Message(keywords=["geopubsub-bench-barrier"], point=pb.Point(lon=0, lat=0))
        await stub.Publish(pb.PublishRequest(message=barrier), timeout=60.0)
        rounds = (await stub.GetStats(pb.GetStatsRequest())).rounds - rounds0
    return took, rounds


def _ms(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else 0.0


def run_phases(target: str, data_dir: Path, subs: list, args, say: Callable[[str], None]) -> dict:
    meter = CpuMeter(data_dir)
    rows = []
    for batch in args.batch:
        meter.start()
        rep = asyncio.run(
            register_subscriptions(target, subs, in_flight=args.in_flight, batch=batch)
        )
        cpu = meter.stop()
        if rep.rejected or rep.registered != len(subs):
            raise ValidationError(
                "--subs", str(args.subs), f"{rep.rejected} rejected: {rep.errors}"
            )
        row = {
            "batch": batch,
            "in_flight": args.in_flight,
            "subscribe_per_s": round(len(subs) / rep.seconds, 1),
            "subscribe_shard_us": round(1e6 * cpu["shards"] / len(subs), 1),
            "subscribe_coordinator_us": round(1e6 * cpu["coordinator"] / len(subs), 1),
            "subscribe_redis_us": round(1e6 * cpu["redis"] / len(subs), 1),
        }
        meter.start()
        seconds = asyncio.run(
            unregister(target, [s.id for s in subs], in_flight=args.in_flight, batch=batch)
        )
        cpu = meter.stop()
        row |= {
            "unsubscribe_per_s": round(len(subs) / seconds, 1),
            "unsubscribe_shard_us": round(1e6 * cpu["shards"] / len(subs), 1),
            "unsubscribe_coordinator_us": round(1e6 * cpu["coordinator"] / len(subs), 1),
            "unsubscribe_redis_us": round(1e6 * cpu["redis"] / len(subs), 1),
        }
        say(
            f"  batch {batch:>5,} x {args.in_flight} in flight: subscribe {row['subscribe_per_s']:>9,.0f}/s "
            f"(shards {row['subscribe_shard_us']:,.1f} us, coordinator "
            f"{row['subscribe_coordinator_us']:,.1f} us, redis {row['subscribe_redis_us']:,.1f} us "
            f"each), unsubscribe {row['unsubscribe_per_s']:>9,.0f}/s (shards "
            f"{row['unsubscribe_shard_us']:,.1f} us, coordinator "
            f"{row['unsubscribe_coordinator_us']:,.1f} us, redis {row['unsubscribe_redis_us']:,.1f} us)"
        )
        rows.append(row)
    latency: dict[str, Any] = {}
    if args.latency_duration > 0:
        lat_subs = [dataclasses.replace(s, id="lat-" + s.id) for s in subs]
        idle_per_s = 0.0
        if args.idle_window > 0:
            meter.start()
            t0 = time.perf_counter()
            time.sleep(args.idle_window)
            idle_per_s = meter.stop()["shards"] / (time.perf_counter() - t0)
        meter.start()
        t0 = time.perf_counter()
        took, rounds = asyncio.run(
            paced_latency(target, lat_subs, args.rate, args.latency_duration)
        )
        wall = time.perf_counter() - t0
        cpu = meter.stop()
        net = cpu["shards"] - idle_per_s * wall
        latency = {
            "rate": args.rate,
            "calls": len(took),
            "p50_ms": _ms(took, 0.50),
            "p99_ms": _ms(took, 0.99),
            "max_ms": _ms(took, 1.0),
            "mean_ms": round(1000 * statistics.fmean(took), 2) if took else 0.0,
            "shard_us": round(1e6 * cpu["shards"] / max(1, len(took)), 1),
            "shard_idle_us_per_s": round(1e6 * idle_per_s, 1),  # (all shards)
            "shard_us_net_of_idle": round(1e6 * net / max(1, len(took)), 1),
            "coordinator_us": round(1e6 * cpu["coordinator"] / max(1, len(took)), 1),
            "redis_us": round(1e6 * cpu["redis"] / max(1, len(took)), 1),
            "rounds": rounds,
            "shard_us_per_round": round(1e6 * cpu["shards"] / max(1, rounds), 1),  # (all shards)
        }
        say(
            f"  single Subscribe at {args.rate:,.0f}/s: {len(took):,} calls, p50 "
            f"{latency['p50_ms']} ms, p99 {latency['p99_ms']} ms, max {latency['max_ms']} ms "
            f"(shards {latency['shard_us']} us, coordinator {latency['coordinator_us']} us, redis "
            f"{latency['redis_us']} us each; {rounds:,} rounds, shards "
            f"{latency['shard_us_per_round']} us a round; shards idle "
            f"{latency['shard_idle_us_per_s'] / 1000:,.1f} ms/s, net of it "
            f"{latency['shard_us_net_of_idle']} us a call)"
        )
        asyncio.run(
            unregister(target, [s.id for s in lat_subs[: len(took)]], in_flight=8, batch=1000)
        )
    return {"phases": rows, "latency": latency}


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "subscribe", help="live Subscribe / Unsubscribe through gRPC: rate, CPU, latency"
    )
    p.add_argument("--subs", type=Path, help="subscriptions, JSON Lines (else generated)")
    p.add_argument("--gen-subs", type=int, default=100_000, help="subscriptions generated")
    p.add_argument("--count", type=int, default=0, help="of them used (0: all)")
    p.add_argument("--base", type=Path, help="subscriptions bulk-loaded first (the tree they join)")
    p.add_argument(
        "--batch",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 100],
        help="subscriptions per call, comma-separated: one phase each (default 1,100)",
    )
    p.add_argument("--in-flight", type=int, default=64, help="calls pending at once")
    p.add_argument("--rate", type=float, default=1000.0, help="single Subscribes/s (latency)")
    p.add_argument("--latency-duration", type=float, default=10.0, help="seconds (0: skip)")
    p.add_argument(
        "--idle-window",
        type=float,
        default=3.0,
        help="seconds of no calls before the latency phase: the shards' idle CPU (0: skip)",
    )
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--data-dir", type=Path, default=Path(".geopubsub/bench-subscribe"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)


def _validate(args) -> None:
    for b in args.batch:
        if not 1 <= b <= MAX_SUBSCRIBE_BATCH:
            raise ValidationError("--batch", b, f"each must be 1-{MAX_SUBSCRIBE_BATCH}")
    if args.in_flight < 1 or args.shards < 1 or args.count < 0 or args.gen_subs < 1:
        raise ValidationError(
            "--in-flight/--shards/--count/--gen-subs",
            f"{args.in_flight}/{args.shards}/{args.count}/{args.gen_subs}",
            "must be >= 1 (--count >= 0)",
        )
    if not 0 <= args.idle_window <= 60:
        raise ValidationError("--idle-window", args.idle_window, "must be 0-60 seconds")
    if not args.rate > 0 or args.latency_duration < 0:
        raise ValidationError(
            "--rate/--latency-duration",
            f"{args.rate}/{args.latency_duration}",
            "must be > 0 / >= 0",
        )
    check_files("--subs/--base", (args.subs, args.base))


def run(args) -> int:
    _validate(args)
    data_dir = Path(args.data_dir)
    if args.subs is None:
        out = data_dir.parent / (data_dir.name + "-workload")
        generate(args.gen_subs, 1, out, seed=args.seed, dnf_share=0.1, circle_share=0.1)
        args.subs = out / "subs.jsonl"
    subs = list(read_subscriptions(args.subs))
    if args.count:
        subs = subs[: args.count]
    subs = [dataclasses.replace(s, id=LIVE_PREFIX + s.id) for s in subs]
    if not subs:
        raise ValidationError("--subs", str(args.subs), "no subscriptions")
    # this process is a client: keep the workload out of its collections, or its own pauses
    # (0.1-0.2 s for 100,000 subscriptions) would count as Subscribe latency, as in bench e2e
    freeze_long_lived()
    hand_over_promptly()  # read answers as they come, not after a 5 ms GIL wait (shard.host.runtime)
    say(f"workload      {len(subs):,} subscriptions ({args.subs}), base {args.base or 'none'}")
    try:
        with sigterm_as_interrupt(), stopped_at_exit(data_dir, say):
            say(f"cluster       starting in {data_dir} (supervised, detached) ...")
            cluster = start_supervised(data_dir, args.shards)
            say(f"              SERVING at {cluster.target}")
            base = None
            if args.base is not None:
                base = bulk_load(args.base, cluster, say)
                settle(cluster.redis_url)
            res = run_phases(cluster.target, data_dir, subs, args, say)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    r = {"subscriptions": len(subs), "base": base and base["registered"], **res}
    if args.json:
        print(json.dumps(r))
    else:
        print(f"geopubsub bench subscribe: {len(subs):,} subscriptions, base {r['base'] or 0:,}")
        for row in res["phases"]:
            print("  " + json.dumps(row))
        if res["latency"]:
            print("  latency " + json.dumps(res["latency"]))
    return 0
