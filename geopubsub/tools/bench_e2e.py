"""``geopubsub bench e2e``: the cluster end to end through gRPC.

Starts an empty local cluster (or joins ``--target``), registers the subscriptions of ``--subs``
(Subscribe calls, many in flight; ``--no-register`` when they are there already), then measures:

(a) **throughput** — the most messages/s published through PublishStream (``--publishers``
    streams, unpaced, for ``--duration`` s) while the result streams of ``--streams`` busy
    subscriptions are read; the summed ``matched`` is compared with the in-process count;
(b) **latency** — publish→delivery at a fixed offered rate (``--rate``, default 5,000 msgs/s):
    from the publisher's schedule (when the message was due) to the subscriber's receipt, p50 /
    p99, and the part spent in the coordinator (Message.time → Delivery.time);
(c) **location updates** — moves/s through one LocationStream over the moving subscriptions
    (random walks), after ``--live`` messages with a long ttl were published for them to meet.

There is no brute-force baseline end to end; the reference beside the figures is the in-process
AP+-Tree on the same data (bulk build, ``publish_batch`` in the engine's batch size, one core),
with its hit count, which must equal the cluster's. Prints a summary (stderr) and one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis

from coordinator.settings import Settings
from deploy import local
from deploy.local import sigterm_as_interrupt
from deploy.redis_local import redis_dir
from geopubsub.client import Endpoint, add_client_flags
from geopubsub.tools.bench_warmup import warm_up, warm_up_moving
from geopubsub.tools.cluster_cli import client_access
from geopubsub.tools.register import DEFAULT_IN_FLIGHT, bulk_load, register_subscriptions
from geopubsub.tools.traffic import (
    Crowd,
    Latencies,
    Publisher,
    ResultStream,
    Stubs,
    busiest,
    schedule,
    stats,
    stop_traffic,
    wait_quiet,
)
from shard.applus import APPlusTree
from shard.errors import ValidationError
from shard.geometry import region_centre
from shard.host.heap import freeze_long_lived
from shard.host.runtime import hand_over_promptly
from shard.model import ADD, Message, Point, Subscription
from shard.workload import read_messages, read_subscriptions

MAX_RATE = 100_000
"""Messages/s an unpaced publisher of phase (a) is given ids for (it stops at --duration)."""
REFERENCE_BATCH = 512
"""Messages per ``publish_batch`` in the in-process reference: the engine's ``batch_max``."""
LONG_TTL_S = 3600.0
"""The ttl of the ``--live`` messages: live through phase (c)."""
QUIET_S = 1.0


STAGES = ("client pacing", "to coordinator", "waiting for a round", "round to client")
"""Phase (b)'s latency, split where the client and the coordinator stamp a message."""


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "e2e", help="through gRPC: publish throughput, publish->delivery latency, moves/s"
    )
    p.add_argument("--subs", required=True, type=Path, help="subscriptions, JSON Lines")
    p.add_argument("--msgs", required=True, type=Path, help="messages, JSON Lines (cycled)")
    p.add_argument("--target", help="a running cluster at HOST:PORT (else one is started)")
    add_client_flags(p)  # --ca --cert --key --token for a --target serving TLS / with auth on
    p.add_argument("--data-dir", type=Path, default=Path(".geopubsub/bench-e2e"))
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--no-register", action="store_true", help="the subscriptions are registered")
    p.add_argument(
        "--register",
        choices=("grpc", "load"),
        default="grpc",
        help="grpc: Subscribe calls; load: the bulk loader (Spark local[2]) then Reload "
        "(the started cluster only)",
    )
    p.add_argument("--in-flight", type=int, default=None, help="Subscribe calls in flight")
    p.add_argument(
        "--ephemeral",
        action="store_true",
        help="register the subscriptions ephemeral: deliveries skip the Redis retention log",
    )
    p.add_argument("--duration", type=float, default=10.0, help="(a): seconds of publishing")
    p.add_argument("--publishers", type=int, default=1, help="(a): parallel PublishStreams")
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="(a), (b): messages per PublishRequest (PublishRequest.messages when > 1); (c): moves "
        "per UpdateLocationRequest (its moves when > 1)",
    )
    p.add_argument("--streams", type=int, default=200, help="result streams read")
    p.add_argument("--rate", type=float, default=5000.0, help="(b): messages/s offered")
    p.add_argument("--latency-duration", type=float, default=10.0, help="(b): seconds")
    p.add_argument("--ttl", type=float, default=0.0, help="(a), (b): message ttl (0: one-shot)")
    p.add_argument("--live", type=int, default=10_000, help="(c): live messages to move among")
    p.add_argument("--moves-duration", type=float, default=10.0, help="(c): seconds of moving")
    p.add_argument("--step-deg", type=float, default=0.05, help="(c): random-walk step")
    p.add_argument("--no-reference", action="store_true", help="skip the in-process AP+-Tree")
    p.add_argument(
        "--profile",
        action="store_true",
        help="record each phase of the coordinator with py-spy (raw stacks) under --data-dir",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="only the JSON object on stdout")
    p.set_defaults(func=run)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- the in-process reference ------------------------------------------------------------------
def reference(
    subs: Sequence[Subscription], msgs: Sequence[Message], moving: Sequence[Subscription], args
) -> tuple[dict[str, Any], list[int]]:
    """The AP+-Tree in this process on the same data: bulk build, publish every message once in
    batches of ``REFERENCE_BATCH`` (the messages as phase (a) sends them), then ``--live``
    messages with a long ttl and random-walk moves like phase (c)'s. Returns the rates and the hit
    count of each message."""
    warm_up()
    warm_up_moving()
    t0 = time.perf_counter()
    tree = APPlusTree.build(iter(subs))
    build_s = time.perf_counter() - t0
    batch = schedule(msgs, len(msgs), ttl=args.ttl, prefix="r")
    t0 = time.perf_counter()
    updates = []
    for i in range(0, len(batch), REFERENCE_BATCH):
        updates.append(tree.publish_batch(batch[i : i + REFERENCE_BATCH], 0.0))
    publish_s = time.perf_counter() - t0
    hits = [0] * len(batch)
    for ups in updates:
        for _, sign, mid in ups:
            if sign == ADD:
                hits[int(mid[1:])] += 1
    pairs = sum(hits)
    out: dict[str, Any] = {
        "build_s": round(build_s, 2),
        "msgs": len(batch),
        "publish_s": round(publish_s, 3),
        "msgs_per_s": round(len(batch) / publish_s, 1) if publish_s else None,
        "pairs": pairs,
    }
    if moving:
        if args.live:  # as phase (c): live messages for the moves to meet
            tree.publish_batch(schedule(msgs, args.live, ttl=LONG_TTL_S, prefix="l"), 0.5)
        rng = np.random.default_rng(args.seed)
        n = min(len(moving) * 4, 200_000)
        centres = {s.id: Point(*region_centre(s.region)) for s in moving}
        ids = [moving[i % len(moving)].id for i in range(n)]
        steps = rng.normal(0, args.step_deg, (n, 2))
        moves = []
        for sid, (dx, dy) in zip(ids, steps.tolist(), strict=True):
            c = centres[sid]
            c = Point(min(max(c.lon + dx, -180.0), 180.0), min(max(c.lat + dy, -90.0), 90.0))
            centres[sid] = c
            moves.append((sid, c))
        t0 = time.perf_counter()
        for i in range(0, n, REFERENCE_BATCH):
            tree.move_batch(moves[i : i + REFERENCE_BATCH], 1.0)
        move_s = time.perf_counter() - t0
        out |= {"moves": n, "moves_per_s": round(n / move_s, 1) if move_s else None}
    return out, hits


# ---- the phases ---------------------------------------------------------------------------------
class _Profiler:
    """py-spy recording the coordinator during a phase (``--profile``)."""

    def __init__(self, pid: int | None, out_dir: Path, enabled: bool) -> None:
        self.pid = pid
        self.out_dir = out_dir
        self.exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.enabled = enabled and pid is not None
        if self.enabled and not Path(self.exe).exists():
            raise ValidationError("--profile", "py-spy", "not installed (pip install py-spy)")
        self.proc: subprocess.Popen | None = None

    def start(self, phase: str) -> None:
        if not self.enabled:
            return
        out = self.out_dir / f"profile-{phase}.txt"
        self.proc = subprocess.Popen(
            [self.exe, "record", "-p", str(self.pid), "-r", "50", "-f", "raw", "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
            self.proc.wait(timeout=30)
            self.proc = None


async def phases(
    endpoint: Endpoint,
    subs: Sequence[Subscription],
    msgs: Sequence[Message],
    args,
    profiler: _Profiler,
) -> dict[str, Any]:
    """Phases (a), (b), (c) against the cluster at ``endpoint``."""
    stub = Stubs(endpoint)
    channels = stub.channels

    control = stub()
    followed = busiest(subs, msgs, args.streams, seed=args.seed)
    # message ids of this run: <phase><run>-<index>, so that deliveries of earlier runs on the
    # same cluster (replayed from the retention log) are neither counted nor timed
    run_id = uuid.uuid4().hex[:6]
    prefix = {phase: f"{phase}{run_id}-" for phase in "abc"}
    streamed: dict[str, int] = dict.fromkeys("abc", 0)
    timing: list[Publisher] = []  # the publisher whose deliveries are timed
    latency = Latencies()
    # where the time goes: the client's pacing lag (due -> handed to gRPC), the way to the
    # coordinator (-> publish received), waiting there for a round (-> round sent to the
    # shards), and the round's way back out (-> delivery read by the client)
    stages = {name: Latencies() for name in STAGES}

    def timed(r) -> None:
        phase = r.message_id[:1]
        if r.message_id.startswith(prefix.get(phase, "\0")):
            streamed[phase] += 1
        if r.kind == "+" and timing:
            due, sent = timing[0].times_of(r.message_id)
            if due < math.inf:
                latency.add(r.received - due)
                for name, t0, t1 in zip(
                    STAGES,
                    (due, sent, r.message_time, r.time),
                    (sent, r.message_time, r.time, r.received),
                    strict=True,
                ):
                    stages[name].add(t1 - t0)

    reader = stub()
    streams = [ResultStream(s.id, keep=False, on_delivery=timed) for s in followed]
    tasks = [asyncio.ensure_future(st.run(reader)) for st in streams]
    out: dict[str, Any] = {"streams": len(streams)}
    try:
        await asyncio.sleep(0.5)

        # (a) throughput: unpaced publishers until --duration, then every answer
        _log(f"(a) throughput: {args.publishers} unpaced PublishStream(s) for {args.duration:g} s")
        per = math.ceil(MAX_RATE * args.duration / args.publishers)
        pubs = [
            Publisher(
                msgs,
                per,
                ttl=args.ttl,
                rate=None,
                prefix=prefix["a"],
                start=k * per,
                batch=args.batch,
            )
            for k in range(args.publishers)
        ]
        stop = asyncio.Event()
        s0 = await stats(control)
        profiler.start("a-throughput")
        runs = [asyncio.ensure_future(p.run(stub(), stop)) for p in pubs]
        await asyncio.sleep(args.duration)
        stop.set()
        await asyncio.gather(*runs)
        profiler.stop()
        t0, t1 = min(p.started for p in pubs), max(p.finished for p in pubs)
        await wait_quiet(streams, QUIET_S, 60.0)
        s1 = await stats(control)
        n = sum(p.answered for p in pubs)
        out["a"] = {
            "publishers": args.publishers,
            "published": n,
            "seconds": round(t1 - t0, 2),
            "msgs_per_s": round(n / (t1 - t0), 1),
            "deliveries": s1.deliveries - s0.deliveries,
            "deliveries_per_s": round((s1.deliveries - s0.deliveries) / (t1 - t0), 1),
            "stream_deliveries": streamed["a"],
            "dropped_deliveries": s1.dropped_deliveries - s0.dropped_deliveries,
            "matched": sum(p.matched for p in pubs),
            "published_indices": [(p.start, p.answered) for p in pubs],
        }
        _log(
            f"    {n:,} messages in {t1 - t0:.1f} s: {out['a']['msgs_per_s']:,.0f} msgs/s, "
            f"{out['a']['deliveries_per_s']:,.0f} deliveries/s"
        )

        # (b) latency at a fixed offered rate
        _log(f"(b) latency: {args.rate:,g} msgs/s offered for {args.latency_duration:g} s")
        nb = max(1, round(args.rate * args.latency_duration))
        pub = Publisher(
            msgs, nb, ttl=args.ttl, rate=args.rate, prefix=prefix["b"], batch=args.batch
        )
        timing.append(pub)
        s0 = await stats(control)
        profiler.start("b-latency")
        await pub.run(stub())
        profiler.stop()
        await wait_quiet(streams, QUIET_S, 60.0)
        s1 = await stats(control)
        secs = pub.finished - pub.started
        out["b"] = {
            "offered_msgs_per_s": args.rate,
            "published": pub.answered,
            "seconds": round(secs, 2),
            "msgs_per_s": round(pub.answered / secs, 1),
            "deliveries": s1.deliveries - s0.deliveries,
            "stream_deliveries": streamed["b"],
            "matched": pub.matched,
            "published_indices": [(0, pub.answered)],
            "latency": Latencies.summary(latency.samples),
            "latency_stages": {n: Latencies.summary(x.samples) for n, x in stages.items()},
        }
        lat = out["b"]["latency"]
        _log(
            f"    {pub.answered:,} messages at {out['b']['msgs_per_s']:,.0f}/s; latency "
            f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms ({lat['n']:,} deliveries timed)"
        )

        # (c) location updates through LocationStream
        moving = [s for s in subs if s.moving]
        if not moving:
            out["c"] = None
            _log("(c) skipped: no moving subscriptions in --subs")
        else:
            if args.live:
                _log(f"(c) publishing {args.live:,} messages live for {LONG_TTL_S:g} s first")
                live = Publisher(msgs, args.live, ttl=LONG_TTL_S, rate=None, prefix=prefix["c"])
                await live.run(stub())
            _log(
                f"(c) moves: one LocationStream over {len(moving):,} moving subscriptions "
                f"for {args.moves_duration:g} s"
            )
            crowd = Crowd(
                moving, rate=None, step_deg=args.step_deg, seed=args.seed, batch=args.batch
            )
            stop = asyncio.Event()
            profiler.start("c-moves")
            run = asyncio.ensure_future(crowd.run(stub(), stop))
            await asyncio.sleep(args.moves_duration)
            stop.set()
            await run
            profiler.stop()
            s1 = await stats(control)
            secs = crowd.finished - crowd.started
            out["c"] = {
                "moving_subscriptions": len(moving),
                "live_messages": s1.live_messages,
                "moves": crowd.sent,
                "seconds": round(secs, 2),
                "moves_per_s": round(crowd.sent / secs, 1),
                "updates": crowd.updates,
                "batch": args.batch,
            }
            _log(
                f"    {crowd.sent:,} moves in {secs:.1f} s: {out['c']['moves_per_s']:,.0f} "
                f"moves/s, {crowd.updates:,} updates"
            )
        out["dropped_deliveries"] = s1.dropped_deliveries
    finally:
        profiler.stop()
        await stop_traffic(tasks, channels)
    return out


# ---- the command --------------------------------------------------------------------------------
def _validate(args) -> None:
    for name in ("duration", "rate", "latency_duration", "moves_duration", "step_deg"):
        if not getattr(args, name) > 0:
            raise ValidationError(f"--{name.replace('_', '-')}", getattr(args, name), "must be > 0")
    for name in ("publishers", "shards", "batch"):
        if getattr(args, name) < 1:
            raise ValidationError(f"--{name}", getattr(args, name), "must be >= 1")
    for name in ("streams", "live"):
        if getattr(args, name) < 0:
            raise ValidationError(f"--{name}", getattr(args, name), "must be >= 0")
    if not args.ttl >= 0:
        raise ValidationError("--ttl", args.ttl, "must be >= 0")
    if args.register == "load" and args.target:
        raise ValidationError("--register", "load", "loads a cluster it starts (no --target)")
    for name in ("subs", "msgs"):
        if not getattr(args, name).exists():
            raise ValidationError(f"--{name}", str(getattr(args, name)), "no such file")


def _expected(hits: Sequence[int], indices: Sequence[tuple[int, int]]) -> int:
    """The in-process hit count of the scheduled messages ``start .. start+count-1``."""
    return sum(hits[j % len(hits)] for start, count in indices for j in range(start, start + count))


def run(args) -> int:
    _validate(args)
    subs = list(read_subscriptions(args.subs))
    msgs = list(read_messages(args.msgs))
    if not subs or not msgs:
        raise ValidationError("--subs/--msgs", f"{len(subs)}/{len(msgs)}", "need both non-empty")
    # this process is a client: keep the workload (1M objects) out of its collections, or its
    # own pauses (measured ~0.5 s) would count as publish->delivery latency
    freeze_long_lived()
    hand_over_promptly()  # read deliveries as they come, not after a 5 ms GIL wait (shard.host.runtime)
    moving = [s for s in subs if s.moving]
    _log(f"read {len(subs):,} subscriptions ({len(moving):,} moving), {len(msgs):,} messages")
    report: dict[str, Any] = {
        "n_subs": len(subs),
        "n_moving": len(moving),
        "n_msgs": len(msgs),
        "ephemeral": args.ephemeral,
    }
    hits: list[int] | None = None
    if not args.no_reference:
        _log("reference: the in-process AP+-Tree on the same data ...")
        ref, hits = reference(subs, msgs, moving, args)
        report["reference"] = ref
        _log(
            f"    built in {ref['build_s']} s; publish {ref['msgs_per_s']:,.0f} msgs/s "
            f"({ref['pairs']:,} matches)"
            + (f"; moves {ref['moves_per_s']:,.0f}/s" if "moves_per_s" in ref else "")
        )
    cluster = None
    with sigterm_as_interrupt():
        try:
            if args.target:
                endpoint = client_access(args, args.target)
            else:
                cluster = start_cluster(args.data_dir, args.shards)
                endpoint = Endpoint(cluster.target)
            report["target"] = endpoint.target
            if not args.no_register and args.register == "load":
                report["registration"] = bulk_load(
                    args.subs, cluster, _log, ephemeral=args.ephemeral
                )
            elif not args.no_register:
                in_flight = args.in_flight or DEFAULT_IN_FLIGHT
                _log(f"registering {len(subs):,} subscriptions ({in_flight} calls in flight) ...")
                reg = asyncio.run(
                    register_subscriptions(
                        endpoint.target,
                        subs,
                        tls=endpoint.tls,
                        token=endpoint.token,
                        in_flight=in_flight,
                        ephemeral=args.ephemeral,
                        on_progress=lambda r: _log(f"    {r.registered:,} ({r.per_s:,.0f}/s)"),
                    )
                )
                report["registration"] = reg.as_dict()
                _log(f"    {reg.registered:,} in {reg.seconds:.1f} s ({reg.per_s:,.0f}/s)")
            if cluster is not None:
                settle(cluster.redis_url)
            profiler = _Profiler(
                cluster.coordinator.pid if cluster else None, Path(args.data_dir), args.profile
            )
            report |= asyncio.run(phases(endpoint, subs, msgs, args, profiler))
        finally:
            if cluster is not None:
                _log("stopping the cluster ...")
                cluster.stop()
    for phase in ("a", "b"):
        part = report[phase]
        indices = part.pop("published_indices")
        if hits is not None:
            part["matched_in_process"] = _expected(hits, indices)
            part["matched_equal"] = part["matched_in_process"] == part["matched"]
    print(json.dumps(report))
    if not args.json:
        _summary(report)
    ok = all(report[p].get("matched_equal", True) for p in ("a", "b"))
    return 0 if ok else 1


def settle(redis_url: str, timeout_s: float = 120.0) -> None:
    """Wait until Redis has no append-only-file rewrite running or scheduled: loading 1M
    subscriptions triggers rewrites (a forked child busy for ~10 s), which would otherwise
    overlap the first phase in some runs and not in others."""
    r = redis.Redis.from_url(redis_url)
    deadline, quiet_since = time.time() + timeout_s, None
    try:
        while time.time() < deadline:
            p = r.info("persistence")
            if p.get("aof_rewrite_in_progress") or p.get("aof_rewrite_scheduled"):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.time()
            elif time.time() - quiet_since >= 2.0:
                return
            time.sleep(0.2)
        _log(f"    Redis still rewriting its append-only file after {timeout_s:g} s; going on")
    finally:
        r.close()


def start_cluster(data_dir: Path | str, shards: int):
    """An empty local cluster in ``data_dir`` (one left there is stopped, its Redis data
    removed): ``deploy.local.start``'s handle."""
    data_dir = Path(data_dir)
    if local.read_manifest(data_dir) is not None:
        local.down(data_dir, out=io.StringIO())
    shutil.rmtree(redis_dir(data_dir), ignore_errors=True)
    settings = Settings.load(
        env=os.environ, flags={"data_dir": str(data_dir), "port": 0, "shards": shards}
    )
    _log(f"starting an empty cluster ({settings.shards} shards) in {data_dir} ...")
    cluster = local.start(settings)
    _log(f"    SERVING at {cluster.target}")
    return cluster


def _summary(r: dict) -> None:
    a, b, c = r["a"], r["b"], r.get("c")
    ref = r.get("reference")
    lines = [
        f"subscriptions   {r['n_subs']:,} ({r['n_moving']:,} moving), messages {r['n_msgs']:,} (cycled)",
    ]
    if "registration" in r:
        g = r["registration"]
        lines.append(
            f"registration    {g['registered']:,} in {g['seconds']} s ({g['subscribe_per_s']:,.0f}/s)"
        )
    lines.append(
        f"(a) throughput  {a['msgs_per_s']:,.0f} msgs/s through {a['publishers']} PublishStream(s), "
        f"{a['deliveries_per_s']:,.0f} deliveries/s ({a['stream_deliveries']:,} read on "
        f"{r['streams']} streams, {a['dropped_deliveries']:,} dropped)"
    )
    lat = b["latency"]
    lines.append(
        f"(b) latency     at {b['msgs_per_s']:,.0f} of {b['offered_msgs_per_s']:,g} msgs/s offered: "
        f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms "
        f"({lat['n']:,} deliveries)"
    )
    lines.append(
        "    stages p50/p99 ms: "
        + ", ".join(
            f"{name} {x['p50_ms']}/{x['p99_ms']}" for name, x in b["latency_stages"].items()
        )
    )
    if c:
        lines.append(
            f"(c) moves       {c['moves_per_s']:,.0f} location updates/s through LocationStream, "
            f"{c['batch']} per request ({c['moves']:,} moves, {c['updates']:,} updates, "
            f"{c['live_messages']:,} live messages)"
        )
    if ref:
        lines.append(
            f"reference       in-process AP+-Tree, one core: publish {ref['msgs_per_s']:,.0f} msgs/s"
            + (f", moves {ref['moves_per_s']:,.0f}/s" if "moves_per_s" in ref else "")
            + f" (no brute-force baseline end to end; build {ref['build_s']} s)"
        )
        for p in ("a", "b"):
            part = r[p]
            lines.append(
                f"matches ({p})     cluster {part['matched']:,} / in-process "
                f"{part['matched_in_process']:,} "
                f"({'identical' if part['matched_equal'] else 'DIFFERENT'})"
            )
    for line in lines:
        print(line, file=sys.stderr)
