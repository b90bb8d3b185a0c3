"""``geopubsub demo`` (what ``make run`` runs): the cluster at work, from nothing to a report.

1. **workload** — ``geopubsub gen`` under ``--work-dir`` (reused while its parameters are unchanged);
2. **cluster** — ``geopubsub up``: a private redis-server, local Ray, the shards and the coordinator,
   in ``<work-dir>/cluster``, started empty (a demo cluster an earlier run left is stopped first);
3. **registration** — the bulk loader (``loader.job`` on Spark ``local[2]``) writes every
   subscription to the cluster's Redis and the coordinator reloads its shards (the ``Reload`` RPC);
   ``--register grpc`` sends one Subscribe call each instead, many in flight (``geopubsub.tools.register``);
4. **traffic** — real gRPC clients at once: a publisher (PublishStream, paced, messages with a
   ttl), tracked moving subscribers (each its own channel: its StreamResults, and UpdateLocation
   towards the messages it wants), a crowd of the other moving subscriptions random-walking over a
   LocationStream, and the result streams of static subscriptions (the latency sample), with a
   live progress line; after the last publish the movers keep moving until every message expired;
5. **report** — throughput, publish→delivery latency percentiles, sample deliveries, and the oracle
   check of every followed stream (``geopubsub.tools.oracle_check``);
6. everything started is stopped, on error and Ctrl-C too (``--keep``: not before Ctrl-C).

The live map (``geopubsub map``) of the cluster is served from step 2 on, its URL printed
(``--map-port``, 0: any free port, -1: no map).

Exit code 0; 1 when the oracle check found a violation; 130 on Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import grpc

from coordinator.settings import Settings
from deploy import local
from deploy.local import sigterm_as_interrupt
from deploy.redis_local import redis_dir
from geopubsub.client import Endpoint
from geopubsub.tools.gen import generate
from geopubsub.tools.livemap.server import DEFAULT_PORT as MAP_PORT
from geopubsub.tools.livemap.server import serve as serve_map
from geopubsub.tools.oracle_check import (
    PublishWindow,
    Verdict,
    check_mover,
    check_static,
)
from geopubsub.tools.register import DEFAULT_IN_FLIGHT, bulk_load, register_subscriptions
from geopubsub.tools.traffic import (
    Crowd,
    Latencies,
    Publisher,
    ResultStream,
    Stubs,
    TrackedMover,
    busiest,
    message_index,
    schedule,
    stats,
    stop_traffic,
    wait_quiet,
)
from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.geometry import location_centre
from shard.host.heap import freeze_long_lived
from shard.host.runtime import hand_over_promptly
from shard.host.warmup import warm_up_shard
from shard.model import Message, Point, Rect, Subscription
from shard.workload import read_messages, read_subscriptions

WORKLOAD_FILE = "workload.json"
"""The parameters the workload files under ``--work-dir`` were generated with."""
MOVER_MAX_SHARE = 0.02
"""A tracked mover's keywords match at most this share of the messages (busy, not flooded)."""
SAMPLE_LINES = 14
"""Lines of one mover's timeline in the report."""
QUIET_S = 1.0
"""The result streams are drained once none has received anything for this long."""
EXPIRY_MARGIN_S = 1.5
"""After the last publish's answer, the run lasts its ttl plus this (ticks of 0.25 s, a round)."""


# ---- progress display ---------------------------------------------------------------------------
class Progress:
    """One updating line on a terminal; a line every ``every_s`` otherwise."""

    def __init__(self, out: TextIO, *, every_s: float = 5.0) -> None:
        self.out = out
        self.tty = out.isatty()
        self.every_s = every_s
        self._last = -math.inf
        self._width = 0

    def show(self, text: str, *, force: bool = False) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            self.out.write("\r" + text + " " * pad)
            self.out.flush()
            self._width = len(text)
        elif force or time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            print(text, file=self.out, flush=True)

    def done(self) -> None:
        if self.tty and self._width:
            self.out.write("\n")
            self.out.flush()
        self._width = 0

    def say(self, text: str) -> None:
        self.done()
        print(text, file=self.out, flush=True)


# ---- 1. workload -------------------------------------------------------------------------------
def workload_params(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "subs": args.subs,
        "msgs": args.msgs,
        "seed": args.seed,
        "dnf_share": args.dnf_share,
        "circle_share": args.circle_share,
        "region_msg_share": args.region_msg_share,
        "moving_share": args.moving_share,
    }


def ensure_workload(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> Path:
    """Generate ``subs.jsonl`` / ``msgs.jsonl`` under ``work`` unless they exist with the same
    parameters."""
    params = workload_params(args)
    stamp = work / WORKLOAD_FILE
    have = (work / "subs.jsonl").exists() and (work / "msgs.jsonl").exists()
    if have and stamp.exists() and json.loads(stamp.read_text()) == params:
        say(f"workload      {work}/subs.jsonl, msgs.jsonl (generated before, same parameters)")
        return work
    t0 = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    counts = generate(
        args.subs,
        args.msgs,
        work,
        seed=args.seed,
        dnf_share=args.dnf_share,
        circle_share=args.circle_share,
        region_msg_share=args.region_msg_share,
        moving_share=args.moving_share,
    )
    stamp.write_text(json.dumps(params) + "\n")
    say(
        f"workload      generated {counts['subs']:,} subscriptions ({counts['moving']:,} moving, "
        f"{counts['dnf']:,} DNF, {counts['circle']:,} circles) and {counts['msgs']:,} messages "
        f"in {time.perf_counter() - t0:.1f} s -> {work}"
    )
    return work


# ---- 2. cluster --------------------------------------------------------------------------------
def start_cluster(args: argparse.Namespace, data_dir: Path, say: Callable[[str], None]):
    """Start an empty local cluster in ``data_dir`` (a demo cluster an earlier run left behind is
    stopped and its Redis data removed first)."""
    if local.read_manifest(data_dir) is not None:
        local.down(data_dir, out=io.StringIO())
    shutil.rmtree(redis_dir(data_dir), ignore_errors=True)
    settings = Settings.load(
        env=os.environ, flags={"data_dir": str(data_dir), "port": 0, "shards": args.shards}
    )
    # the shards' kernels into numba's on-disk cache once, here, before the actors start: on a
    # fresh checkout each actor compiled them all at once with the other (118 s on 2 cores)
    t0 = time.perf_counter()
    warm_up_shard(settings.shard_options())
    say(f"kernels       ready in {time.perf_counter() - t0:.1f} s (compiled on a first run)")
    say(
        f"cluster       starting {settings.shards} shards, a private redis-server and local Ray "
        f"in {data_dir} ..."
    )
    t0 = time.perf_counter()
    cluster = local.start(settings)
    say(
        f"              SERVING at {cluster.target} after {time.perf_counter() - t0:.1f} s "
        f"(coordinator log {cluster.log_path})"
    )
    return cluster


# ---- 3. what runs: the plan ---------------------------------------------------------------------
@dataclass
class Plan:
    subs: list[Subscription]
    schedule: list[Message]
    file_messages: list[Message]
    followed: list[Subscription]
    """Static subscriptions whose result streams are followed (latency, exact check)."""
    expected: dict[str, set[str]]
    """Their brute-force match sets among the scheduled messages."""
    movers: list[Subscription]
    mover_targets: dict[str, list[tuple[int, Point]]]
    crowd: list[Subscription]


def make_plan(subs: list[Subscription], msgs: list[Message], args: argparse.Namespace) -> Plan:
    """Which messages to publish, which streams to follow, who moves where. Deterministic for a
    seed. The followed static subscriptions are the busiest of a sample (brute force over a
    sample of messages), so that the latency sample is large; their expected sets are brute force
    over every message."""
    n = max(1, round(args.rate * args.duration))
    sched = schedule(msgs, n, ttl=args.ttl)
    moving = [s for s in subs if s.moving]

    followed = busiest(subs, msgs, args.streams, seed=args.seed)
    per_file = BruteMatcher(followed).match_batch(msgs) if followed else [[] for _ in msgs]
    expected: dict[str, set[str]] = {s.id: set() for s in followed}
    for j in range(n):
        for sid in per_file[j % len(msgs)]:
            expected[sid].add(f"p{j}")

    picked = pick_movers(moving, msgs, args.movers)
    movers = [s for s, _ in picked]
    targets = {s.id: mover_targets(matched, msgs, n) for s, matched in picked}
    tracked = {s.id for s in movers}
    crowd = [s for s in moving if s.id not in tracked]
    return Plan(subs, sched, msgs, followed, expected, movers, targets, crowd)


def pick_movers(
    moving: Sequence[Subscription], msgs: Sequence[Message], k: int
) -> list[tuple[Subscription, set[int]]]:
    """Up to ``k`` moving subscriptions whose keywords match the most workload messages, at most
    ``MOVER_MAX_SHARE`` of them, each with the indices of those messages. Deterministic."""
    terms: dict[str, set[int]] = defaultdict(set)
    for i, m in enumerate(msgs):
        for t in m.terms:
            terms[t].add(i)
    cap = max(1, int(MOVER_MAX_SHARE * len(msgs)))
    scored = []
    for s in moving:
        matched: set[int] = set()
        for clause in s.clauses:
            postings = [terms.get(t, set()) for t in clause]
            matched |= set.intersection(*postings) if postings else set()
        if 0 < len(matched) <= cap:
            scored.append((len(matched), s.id, s, matched))
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [(s, matched) for _, _, s, matched in scored[:k]]


def mover_targets(matched: set[int], msgs: Sequence[Message], n: int) -> list[tuple[int, Point]]:
    """``(schedule index, location)`` of the scheduled messages ``0 .. n-1`` (the workload's
    ``msgs`` cycled) whose workload index is in ``matched``, by index: a ``TrackedMover``'s goals."""
    order = sorted(matched)
    return [
        (c * len(msgs) + i, Point(*location_centre(msgs[i].location)))
        for c in range(math.ceil(n / len(msgs)))
        for i in order
        if c * len(msgs) + i < n
    ]


# ---- 4. traffic --------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What the clients of step 4 recorded."""

    publisher: Publisher
    streams: list[ResultStream]
    """Of ``Plan.followed``, in order."""
    mover_streams: list[ResultStream]
    movers: list[TrackedMover]
    crowd: Crowd | None
    latency: Latencies
    """Publish -> delivery: the publisher's schedule to the subscriber's receipt."""
    coordinator_latency: Latencies
    """Message.time -> Delivery.time."""
    started: float
    publish_done: float
    finished: float
    drained: bool
    """The streams fell quiet (every delivery was read) before the check."""
    stats_before: Any
    stats_after: Any


async def run_traffic(target: str, plan: Plan, args: argparse.Namespace, progress: Progress):
    """Steps 4: every client at once; returns what they recorded."""
    publisher = Publisher(plan.file_messages, len(plan.schedule), ttl=args.ttl, rate=args.rate)
    latency, in_coordinator = Latencies(), Latencies()

    def timed(r) -> None:
        if r.kind == "+":
            due = publisher.due_of(r.message_id)
            if due < math.inf:
                latency.add(r.received - due)
                in_coordinator.add(r.time - r.message_time)

    stub = Stubs(target)
    channels = stub.channels

    subscriber_app = stub()
    streams = [ResultStream(s.id, on_delivery=timed) for s in plan.followed]
    mover_streams = [ResultStream(s.id) for s in plan.movers]
    movers = [
        TrackedMover(s, plan.mover_targets[s.id], every_s=args.move_every, seed=args.seed + i)
        for i, s in enumerate(plan.movers)
    ]
    crowd = (
        Crowd(plan.crowd, rate=args.crowd_rate, seed=args.seed)
        if plan.crowd and args.crowd_rate > 0
        else None
    )
    moving = asyncio.Event()
    crowd_stop = asyncio.Event()
    tasks: list[asyncio.Task] = []
    try:
        control = stub()
        before = await stats(control)
        for st in streams:
            tasks.append(asyncio.ensure_future(st.run(subscriber_app)))
        mover_stubs = [stub() for _ in movers]
        for st, s in zip(mover_streams, mover_stubs, strict=True):
            tasks.append(asyncio.ensure_future(st.run(s)))
        await warm_up(stub(), plan.file_messages)
        await asyncio.sleep(0.5)  # the streams are open before anything is published
        started = time.time()
        pub_task = asyncio.ensure_future(publisher.run(stub()))
        mover_tasks = [
            asyncio.ensure_future(m.run(s, lambda: publisher.sent, moving))
            for m, s in zip(movers, mover_stubs, strict=True)
        ]
        crowd_task = asyncio.ensure_future(crowd.run(stub(), crowd_stop)) if crowd else None
        watch = asyncio.ensure_future(
            _watch(control, publisher, streams, mover_streams, movers, crowd, latency, progress)
        )
        tasks += [pub_task, *mover_tasks, watch] + ([crowd_task] if crowd_task else [])
        await pub_task
        publish_done = time.time()
        crowd_stop.set()
        if crowd_task is not None:
            await crowd_task
        # the movers keep moving while the last messages expire
        until = float(publisher.answered_at[: publisher.answered].max(initial=publish_done))
        await asyncio.sleep(max(0.0, until + args.ttl + EXPIRY_MARGIN_S - time.time()))
        moving.set()
        await asyncio.gather(*mover_tasks)
        drained = await wait_quiet(streams + mover_streams, QUIET_S, timeout_s=60.0)
        finished = time.time()
        watch.cancel()
        after = await stats(control)
    finally:
        await stop_traffic(tasks, channels)
    progress.done()
    return RunResult(
        publisher,
        streams,
        mover_streams,
        movers,
        crowd,
        latency,
        in_coordinator,
        started,
        publish_done,
        finished,
        drained,
        before,
        after,
    )


WARM_UP_MESSAGES = 2000
WARM_UP_TERM = "zzwarmupzz"
"""A term no generated subscription has: the warm-up messages match nobody."""


async def warm_up(stub, msgs: Sequence[Message]) -> None:
    """Publish ``WARM_UP_MESSAGES`` one-shot messages that match nobody (the shards load their
    compiled kernels, the channels connect) before anything is timed."""
    blank = [
        replace(m, terms=(WARM_UP_TERM,), keywords=(WARM_UP_TERM,), text=None) for m in msgs[:100]
    ]
    await Publisher(blank, WARM_UP_MESSAGES, ttl=0.0, rate=None, prefix="w").run(stub)


async def _watch(control, publisher, streams, mover_streams, movers, crowd, latency, progress):
    """The live progress line, from the cluster's counters and the clients' own."""
    t0 = time.time()
    last_t, last = t0, None
    while True:
        await asyncio.sleep(1.0)
        now = time.time()
        st = await stats(control)
        moves = sum(len(m.moves) for m in movers) + (crowd.sent if crowd else 0)
        cur = (publisher.answered, st.deliveries, moves)
        if last is not None:
            dt = now - last_t
            rates = [(c - p) / dt for c, p in zip(cur, last, strict=True)]
            lat = Latencies.summary(latency.window())
            pm = [sum(d.kind == k for s in mover_streams for d in s.deliveries) for k in "+-"]
            lat_text = (
                f"p50 {lat['p50_ms']:.1f} ms p99 {lat['p99_ms']:.1f} ms"
                if lat["n"]
                else "p50 - p99 -"
            )
            progress.show(
                f"  {now - t0:5.0f} s  published {publisher.answered:,} ({rates[0]:,.0f}/s)  "
                f"deliveries {rates[1]:,.0f}/s  moves {rates[2]:,.0f}/s  latency {lat_text}  "
                f"movers +{pm[0]} -{pm[1]}  live {st.live_messages:,}"
            )
        last_t, last = now, cur


# ---- 5. the oracle check and the report ---------------------------------------------------------
def check(
    plan: Plan, result: RunResult, args: argparse.Namespace
) -> tuple[list[Verdict], list[Verdict]]:
    """Check every followed stream: the static ones exactly, the tracked movers against their
    moves (``geopubsub.tools.oracle_check``)."""
    pub = result.publisher
    message_times: dict[str, float] = {}
    for st in [*result.streams, *result.mover_streams]:
        for d in st.deliveries:
            if d.kind == "+" and d.message_time:
                message_times[d.message_id] = d.message_time

    def published(message_id: str) -> PublishWindow | None:
        j = message_index(message_id)
        if not 0 <= j < pub.answered:
            return None
        lo = max(float(pub.sent_at[j]), message_times.get(message_id, 0.0))
        return PublishWindow(plan.schedule[j], lo, float(pub.answered_at[j]))

    sent = plan.schedule[: pub.answered]
    all_expired = result.drained
    static = [
        check_static(
            s,
            st.deliveries,
            {m for m in plan.expected[s.id] if message_index(m) < pub.answered},
            published,
            all_expired=all_expired,
        )
        for s, st in zip(plan.followed, result.streams, strict=True)
    ]
    moving = [
        check_mover(s, m.moves, st.deliveries, published, sent, all_expired=all_expired)
        for s, m, st in zip(plan.movers, result.movers, result.mover_streams, strict=True)
    ]
    return static, moving


def _total(verdicts: Sequence[Verdict]) -> dict[str, int]:
    keys = ("deliveries", "adds", "removes", "moves", "checked", "undecided", "violations")
    return {k: sum(getattr(v, k) for v in verdicts) for k in keys}


def report(
    plan: Plan,
    result: RunResult,
    registration: dict,
    static: list[Verdict],
    moving: list[Verdict],
    args: argparse.Namespace,
) -> dict:
    pub = result.publisher
    publish_s = max(pub.finished - pub.started, 1e-9)
    run_s = max(result.finished - result.started, 1e-9)
    deliveries = result.stats_after.deliveries - result.stats_before.deliveries
    crowd = result.crowd
    crowd_s = max(crowd.finished - crowd.started, 1e-9) if crowd else 0.0
    tracked_moves = sum(len(m.moves) for m in result.movers)
    return {
        "subscriptions": len(plan.subs),
        "moving_subscriptions": sum(s.moving for s in plan.subs),
        "shards": args.shards,
        "registration": registration,
        "published": pub.answered,
        "publish_s": round(publish_s, 2),
        "offered_msgs_per_s": args.rate,
        "published_per_s": round(pub.answered / publish_s, 1),
        "ttl_s": args.ttl,
        "matched": pub.matched,
        "deliveries": deliveries,
        "deliveries_per_s": round(deliveries / run_s, 1),
        "dropped_deliveries": result.stats_after.dropped_deliveries
        - result.stats_before.dropped_deliveries,
        "run_s": round(run_s, 2),
        "crowd_moves": crowd.sent if crowd else 0,
        "crowd_moves_per_s": round(crowd.sent / crowd_s, 1) if crowd else 0.0,
        "crowd_updates": crowd.updates if crowd else 0,
        "tracked_moves": tracked_moves,
        "followed_streams": len(result.streams),
        "tracked_movers": len(result.movers),
        "latency": Latencies.summary(result.latency.samples),
        "latency_in_coordinator": Latencies.summary(result.coordinator_latency.samples),
        "drained": result.drained,
        "check_static": _total(static),
        "check_movers": _total(moving),
        "violations": [e for v in [*static, *moving] for e in v.examples][:20],
    }


def sample_lines(plan: Plan, result: RunResult) -> list[str]:
    """A stretch of the busiest tracked mover's timeline: its moves and the + / - they and the
    publishes and expiries caused."""
    if not result.movers:
        return []
    k = max(range(len(result.movers)), key=lambda i: len(result.mover_streams[i].deliveries))
    mover, stream, sub = result.movers[k], result.mover_streams[k], plan.movers[k]
    if not stream.deliveries:
        return []
    by_move = {u.sequence: "move" for m in mover.moves for u in m.updates}
    events: list[tuple[float, int, str]] = []
    for m in mover.moves:
        events.append((m.sent, 0, f"moves to {m.point.lon:.3f},{m.point.lat:.3f}"))
    for d in stream.deliveries:
        msg = plan.schedule[message_index(d.message_id)]
        why = (
            "entered"
            if d.sequence in by_move and d.kind == "+"
            else (
                "left" if d.sequence in by_move else ("published" if d.kind == "+" else "expired")
            )
        )
        where = msg.location
        at = (
            f"@{where.lon:.3f},{where.lat:.3f}"
            if isinstance(where, Point)
            else f"@[{where.min_lon:.2f},{where.min_lat:.2f} {where.max_lon:.2f},{where.max_lat:.2f}]"
        )
        wanted = [t for t in msg.terms if any(t in c for c in sub.clauses)]
        terms = ",".join(
            wanted + [t for t in msg.terms if t not in wanted][: max(0, 3 - len(wanted))]
        )
        events.append((d.time, 1, f"{d.kind} {sub.id} {d.message_id} {terms} {at}  ({why})"))
    events.sort()
    first = next(i for i, e in enumerate(events) if e[1] == 1)
    first = max(0, first - 1)
    picked = events[first : first + SAMPLE_LINES]
    t0 = result.started
    cond = " OR ".join(" AND ".join(c) for c in sub.clauses)
    shape = sub.region
    size = (
        f"{shape.max_lon - shape.min_lon:.1f} x {shape.max_lat - shape.min_lat:.1f} deg rectangle"
        if isinstance(shape, Rect)
        else f"circle of {shape.radius_m / 1000:,.0f} km"
    )
    lines = [f"mover {sub.id} ({cond!r}, a {size}):"]
    lines += [f"  +{t - t0:7.3f} s  {text}" for t, _, text in picked]
    return lines


def print_report(r: dict, lines: list[str], out: TextIO) -> None:
    reg = r["registration"]
    lat, inc = r["latency"], r["latency_in_coordinator"]
    print(file=out)
    print(
        f"geopubsub demo: {r['subscriptions']:,} subscriptions ({r['moving_subscriptions']:,} "
        f"moving) on {r['shards']} shards",
        file=out,
    )
    if reg and reg.get("via") == "loader":
        print(
            f"  registration   {reg['registered']:,} bulk-loaded with Spark in {reg['load_s']:.1f} s, "
            f"serving after {reg['seconds']:.1f} s ({reg['subscribe_per_s']:,.0f}/s)",
            file=out,
        )
    elif reg:
        print(
            f"  registration   {reg['registered']:,} Subscribe calls in {reg['seconds']:.1f} s "
            f"({reg['subscribe_per_s']:,.0f}/s)",
            file=out,
        )
    print(
        f"  publishing     {r['published']:,} messages in {r['publish_s']:.1f} s through "
        f"PublishStream ({r['published_per_s']:,.0f}/s of {r['offered_msgs_per_s']:,g}/s offered), "
        f"ttl {r['ttl_s']:g} s, {r['matched']:,} matches",
        file=out,
    )
    print(
        f"  deliveries     {r['deliveries']:,} in {r['run_s']:.1f} s ({r['deliveries_per_s']:,.0f}/s), "
        f"{r['dropped_deliveries']:,} dropped by slow streams",
        file=out,
    )
    print(
        f"  moves          {r['crowd_moves']:,} crowd moves through LocationStream "
        f"({r['crowd_moves_per_s']:,.0f}/s, {r['crowd_updates']:,} updates) + "
        f"{r['tracked_moves']:,} moves of the tracked movers",
        file=out,
    )
    if lat["n"]:
        print(
            f"  latency        publish -> delivery (publisher's schedule -> subscriber's receipt), "
            f"{lat['n']:,} deliveries on {r['followed_streams']} streams:\n"
            f"                 p50 {lat['p50_ms']} ms   p90 {lat['p90_ms']} ms   "
            f"p99 {lat['p99_ms']} ms   max {lat['max_ms']} ms\n"
            f"                 in the coordinator (Message.time -> Delivery.time): "
            f"p50 {inc['p50_ms']} ms   p99 {inc['p99_ms']} ms",
            file=out,
        )
    if lines:
        print("  sample deliveries, " + lines[0], file=out)
        for line in lines[1:]:
            print("  " + line, file=out)
    cs, cm = r["check_static"], r["check_movers"]
    print(
        f"  oracle check   {r['followed_streams']} static streams, exact: {cs['deliveries']:,} "
        f"deliveries, {cs['checked']:,} checks, {cs['violations']} violations\n"
        f"                 {r['tracked_movers']} tracked movers: {cm['deliveries']:,} "
        f"deliveries over {cm['moves']:,} moves, {cm['checked']:,} checks, {cm['violations']} "
        f"violations ({cm['undecided']:,} undecided by timing)",
        file=out,
    )
    for text in r["violations"]:
        print(f"    VIOLATION {text}", file=out)
    if not r["drained"]:
        print(
            "  (the streams did not fall quiet within 60 s: the check saw a partial run)", file=out
        )


# ---- the command -------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="start a local cluster, register a workload, publish and move with live clients, "
        "report, stop (make run)",
    )
    p.add_argument("--work-dir", type=Path, default=Path(".geopubsub/demo"))
    p.add_argument("--subs", type=int, default=200_000, help="subscriptions (default 200,000)")
    p.add_argument("--msgs", type=int, default=20_000, help="messages in the workload file")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dnf-share", type=float, default=0.1)
    p.add_argument("--circle-share", type=float, default=0.1)
    p.add_argument("--region-msg-share", type=float, default=0.05)
    p.add_argument("--moving-share", type=float, default=0.1)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of publishing")
    p.add_argument("--rate", type=float, default=500.0, help="messages/s offered")
    p.add_argument("--ttl", type=float, default=10.0, help="seconds a message stays live")
    p.add_argument("--movers", type=int, default=8, help="tracked moving subscribers")
    p.add_argument("--move-every", type=float, default=0.25, help="seconds between their moves")
    p.add_argument(
        "--crowd-rate", type=float, default=200.0, help="moves/s of the other moving subscriptions"
    )
    p.add_argument("--streams", type=int, default=100, help="static result streams followed")
    p.add_argument(
        "--register",
        choices=("load", "grpc"),
        default="load",
        help="load: the Spark bulk loader, then Reload (default); grpc: Subscribe calls",
    )
    p.add_argument(
        "--in-flight", type=int, default=None, help="Subscribe calls in flight (--register grpc)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument(
        "--map-port",
        type=int,
        default=MAP_PORT,
        help=f"serve the live map on 127.0.0.1:PORT (default {MAP_PORT}; 0: any free port; -1: no map)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="after the report, keep the cluster and the map up until Ctrl-C",
    )
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    for name in ("duration", "rate", "ttl", "move_every"):
        if not getattr(args, name) > 0:
            raise ValidationError(f"--{name.replace('_', '-')}", getattr(args, name), "must be > 0")
    for name in ("subs", "msgs", "shards"):
        if getattr(args, name) < 1:
            raise ValidationError(f"--{name}", getattr(args, name), "must be >= 1")
    for name in ("movers", "streams"):
        if getattr(args, name) < 0:
            raise ValidationError(f"--{name}", getattr(args, name), "must be >= 0")
    if args.crowd_rate < 0:
        raise ValidationError("--crowd-rate", args.crowd_rate, "must be >= 0")


def run(args: argparse.Namespace) -> int:
    _validate(args)
    err = sys.stderr
    progress = Progress(err)
    cluster = livemap = None
    try:
        with sigterm_as_interrupt():
            try:
                t0 = time.perf_counter()
                work = ensure_workload(args, args.work_dir, progress.say)
                cluster = start_cluster(args, args.work_dir / "cluster", progress.say)
                started = {
                    "target": cluster.target,
                    "coordinator_pid": cluster.coordinator.pid,
                    "redis_pid": cluster.redis.pid if cluster.redis is not None else None,
                }
                livemap = start_map(args, cluster.target, progress.say)
                r, lines = _run(args, work, cluster, progress)
                _report(r, t0, started, args, lines)
                if args.keep:
                    _keep(cluster.target, livemap, progress.say)
            except KeyboardInterrupt:
                progress.say("interrupted")
                return 130
            except grpc.RpcError as exc:
                progress.say(f"geopubsub demo: error: {exc.code().name}: {exc.details()}")
                return 1
            finally:
                if livemap is not None:
                    livemap.close()
                if cluster is not None:
                    progress.say("cluster       stopping ...")
                    cluster.stop()
                    progress.say("              stopped")
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        return 130
    bad = r["check_static"]["violations"] + r["check_movers"]["violations"]
    return 1 if bad or r["registration"]["rejected"] else 0


def _report(r: dict, t0: float, started: dict, args, lines: list[str]) -> None:
    r["total_s"] = round(time.perf_counter() - t0, 1)
    r["cluster"] = started
    if args.json:
        print(json.dumps(r), flush=True)
    else:
        print_report(r, lines, sys.stdout)
        sys.stdout.flush()


def _keep(target: str, livemap, say: Callable[[str], None]) -> None:
    """``--keep``: wait for Ctrl-C (or SIGTERM) with the cluster and the map up."""
    where = f", the map at {livemap.url}" if livemap is not None else ""
    say(f"kept          the cluster at {target}{where}; Ctrl-C stops them")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        say("              Ctrl-C")


def start_map(args: argparse.Namespace, target: str, say: Callable[[str], None]):
    """The live map of the demo's cluster (``geopubsub.tools.livemap``), None with
    ``--map-port -1`` or when the port is taken (said, the demo goes on)."""
    if args.map_port < 0:
        return None
    try:
        server = serve_map(Endpoint(target), "127.0.0.1", args.map_port)
    except OSError as exc:
        say(f"map           not served: 127.0.0.1:{args.map_port}: {exc.strerror}")
        return None
    say(f"map           {server.url} (the live map; open it in a browser)")
    return server


def register_grpc(target: str, subs: list[Subscription], args, progress: Progress) -> dict:
    """Step 3 with one Subscribe call per subscription, many in flight."""
    in_flight = args.in_flight or DEFAULT_IN_FLIGHT

    def registering(r) -> None:
        left = (len(subs) - r.registered) / r.per_s if r.per_s else math.inf
        progress.show(
            f"registration  {r.registered:,} / {len(subs):,} ({r.per_s:,.0f}/s, ~{left:.0f} s left)"
        )

    progress.say(
        f"registration  {len(subs):,} subscriptions, {in_flight} Subscribe calls in flight"
    )
    reg = asyncio.run(
        register_subscriptions(target, subs, in_flight=in_flight, on_progress=registering)
    )
    progress.say(
        f"              {reg.registered:,} registered in {reg.seconds:.1f} s ({reg.per_s:,.0f}/s)"
        + (f", {reg.rejected} rejected: {reg.errors[:3]}" if reg.rejected else "")
    )
    return {"via": "grpc", **reg.as_dict()}


def _run(
    args: argparse.Namespace, work: Path, cluster, progress: Progress
) -> tuple[dict, list[str]]:
    """Steps 3-5: register, run the traffic, check; returns the report and the sample lines."""
    target = cluster.target
    subs = list(read_subscriptions(work / "subs.jsonl"))
    msgs = list(read_messages(work / "msgs.jsonl"))
    freeze_long_lived()
    hand_over_promptly()  # read deliveries as they come, not after a 5 ms GIL wait (shard.host.runtime)  # the clients' latency must not include this process's collections
    if args.register == "load":
        reg = bulk_load(work / "subs.jsonl", cluster, progress.say)
    else:
        reg = register_grpc(target, subs, args, progress)
    plan = make_plan(subs, msgs, args)
    progress.say(
        f"traffic       {len(plan.schedule):,} messages at {args.rate:,g}/s (ttl {args.ttl:g} s), "
        f"{len(plan.movers)} tracked movers, a crowd of {len(plan.crowd):,} moving at "
        f"{args.crowd_rate:,g} moves/s, {len(plan.followed)} static streams followed"
    )
    result = asyncio.run(run_traffic(target, plan, args, progress))
    progress.say("check         the followed streams against the brute-force oracle ...")
    static, moving = check(plan, result, args)
    return report(plan, result, reg, static, moving, args), sample_lines(plan, result)
