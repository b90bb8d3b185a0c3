"""``geopubsub bench soak``: a long run at a fixed rate, watching memory and latency.

Starts an empty, detached, supervised local cluster in ``--data-dir`` (as ``bench chaos`` does) or
joins ``--target`` (its processes found through the ``cluster.json`` of ``--data-dir``), registers
the workload (``--subs`` / ``--msgs``, or generated; ``--register load``: the bulk loader, like
``bench e2e --register load``), then for ``--duration`` s, at once: a publisher at ``--rate``
msgs/s over PublishStream (``--batch`` due messages a request, stored for ``--ttl`` s), the result
streams of ``--streams`` busy static subscriptions (each delivery timed from when its message was
due to its receipt), and the moving subscriptions random-walking over LocationStream
(``--crowd-rate``).

Every ``--sample-every`` s it reads from /proc the resident set size of every process of the
cluster: the coordinator, each shard actor, redis-server, the supervisor. After ``--warmup`` s
each must stay within ±``--tolerance`` of its value at the end of the warm-up (``rss_flat``; a
process replaced or appearing later is not flat either). The publish->delivery p99 of every whole
minute after the warm-up must stay within ``--p99-spread`` times their median (``p99_steady``: no
minute spikes). Prints publish->delivery p50 / p99 and the RSS of each process per minute, and
the verdicts (``--json``: one JSON object). Exit code 1 if an RSS is not flat or the p99 is not
steady; the cluster it started is stopped, on error and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy import local
from deploy.local import sigterm_as_interrupt
from geopubsub.client import add_client_flags
from geopubsub.tools.bench_chaos import (
    CHANNEL_OPTIONS,
    check_files,
    read_workload,
    register_workload,
    say,
    shard_actor_pids,
    start_supervised,
)
from geopubsub.tools.bench_e2e import settle
from geopubsub.tools.cluster_cli import client_access
from geopubsub.tools.demo import warm_up
from geopubsub.tools.traffic import (
    Crowd,
    Latencies,
    Publisher,
    ResultStream,
    busiest,
    channel,
    stop_traffic,
    wait_quiet,
)
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import ValidationError
from shard.host.heap import freeze_long_lived
from shard.host.runtime import hand_over_promptly

if TYPE_CHECKING:
    from geopubsub.client import Endpoint

MINUTE_S = 60.0
"""Latency is reported per minute of the publisher's schedule."""
QUIET_S = 1.0
"""After the last publish, the streams are read until quiet this long."""


# ---- memory -------------------------------------------------------------------------------------
def rss_mb(pid: int) -> float | None:
    """The resident set size of ``pid`` in MB (``VmRSS`` of ``/proc/<pid>/status``); None when
    it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class ClusterProcesses:
    """The processes of the local cluster of ``data_dir`` by role: ``coordinator``,
    ``redis-server``, ``supervisor`` (pids from ``cluster.json``) and the shard actors of the
    coordinator's session, named ``shard-actor-1``, ``-2``, … in the order their pids were first
    seen (a replaced actor's process gets the next name)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._actor_names: dict[int, str] = {}

    def now(self) -> dict[str, int]:
        m = local.read_manifest(self.data_dir) or {}
        out = {}
        for role, key in (("coordinator", "coordinator"), ("redis-server", "redis")):
            if (m.get(key) or {}).get("pid"):
                out[role] = m[key]["pid"]
        if (m.get("supervisor") or {}).get("pid"):
            out["supervisor"] = m["supervisor"]["pid"]
        for pid in sorted(shard_actor_pids(out.get("coordinator", 0))):
            name = self._actor_names.setdefault(pid, f"shard-actor-{len(self._actor_names) + 1}")
            out[name] = pid
        return out


@dataclass
class Sample:
    t: float
    """Seconds since the traffic started."""
    pids: dict[str, int]
    rss_mb: dict[str, float]


def sample(processes: ClusterProcesses, t: float) -> Sample:
    pids = processes.now()
    rss = {name: rss_mb(pid) for name, pid in pids.items()}
    return Sample(
        round(t, 1),
        {n: p for n, p in pids.items() if rss[n] is not None},
        {n: round(v, 1) for n, v in rss.items() if v is not None},
    )


def rss_flat(samples: Sequence[Sample], warmup_s: float, tolerance: float) -> dict[str, Any]:
    """Whether every process's RSS stayed flat after the warm-up: all its samples from
    ``warmup_s`` on within ±``tolerance`` (a share) of one level, the middle of their range (a
    process whose RSS swings with its allocator, as a shard's does between purges, is flat if
    the swing fits; one that grows by more than twice the tolerance is not). A process absent
    from the first sample after the warm-up (appeared later), gone from a later one, or with
    another pid later (replaced) is not flat. Returns ``{"flat": bool, "processes": {name:
    {...}}}`` (``at_warmup_mb``: its first sample after the warm-up, for the record).

    >>> s = [Sample(0, {"c": 1}, {"c": 50.0}), Sample(10, {"c": 1}, {"c": 100.0}),
    ...      Sample(20, {"c": 1}, {"c": 124.0})]
    >>> rss_flat(s, 10, 0.1)["flat"], rss_flat(s, 10, 0.15)["flat"]
    (False, True)
    >>> rss_flat(s, 10, 0.15)["processes"]["c"]["level_mb"]  # the middle of 100 .. 124
    112.0
    """
    after = [s for s in samples if s.t >= warmup_s]
    if not after:
        raise ValueError(f"no sample at or after the warm-up ({warmup_s:g} s)")
    ref = after[0]
    names = sorted({n for s in after for n in s.rss_mb})
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in ref.rss_mb:
            out[name] = {"flat": False, "note": "appeared after the warm-up"}
            continue
        pid = ref.pids[name]
        values = [s.rss_mb.get(name) for s in after]
        note = ""
        if any(v is None for v in values):
            note = "gone before the end"
        elif any(s.pids[name] != pid for s in after):
            note = "replaced by another process"
        seen = [v for v in values if v is not None]
        level = (min(seen) + max(seen)) / 2
        deviation = (max(seen) - level) / level if level else math.inf
        out[name] = {
            "at_warmup_mb": ref.rss_mb[name],
            "level_mb": level,
            "min_mb": min(seen),
            "max_mb": max(seen),
            "last_mb": seen[-1],
            "deviation_pct": round(100 * deviation, 1),
            "flat": not note and deviation <= tolerance,
            "note": note,
        }
    return {"flat": all(p["flat"] for p in out.values()), "processes": out}


# ---- latency per minute -------------------------------------------------------------------------
@dataclass
class PerMinute:
    """Publish->delivery latencies by minute of the message's due time since ``started`` (the
    first message's)."""

    started: float
    samples: dict[int, list[float]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    """The slowest delivery of each second (of due time), to find when a stall happened."""

    def add(self, due: float, latency: float) -> None:
        self.samples.setdefault(int((due - self.started) // MINUTE_S), []).append(latency)
        sec = int(due - self.started)
        if latency > self.seconds.get(sec, 0.0):
            self.seconds[sec] = latency

    def slowest(self, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` seconds with the slowest delivery: second since the start, wall-clock
        time (UTC; the due times are ``time.time()``), the slowest latency.

        >>> pm = PerMinute(1000.0); pm.add(1001.5, 0.2); pm.add(1003.1, 0.9); pm.add(1003.2, 0.1)
        >>> [(r["second"], r["max_ms"]) for r in pm.slowest(2)]
        [(3, 900.0), (1, 200.0)]
        """
        top = sorted(self.seconds.items(), key=lambda x: -x[1])[:k]
        return [
            {
                "second": sec,
                "utc": time.strftime("%H:%M:%S", time.gmtime(self.started + sec)),
                "max_ms": round(1000 * lat, 1),
            }
            for sec, lat in top
        ]

    def table(self) -> list[dict[str, Any]]:
        return [
            {"minute": m + 1, **Latencies.summary(self.samples[m])} for m in sorted(self.samples)
        ]


def p99_steady(minutes: Sequence[dict[str, Any]], warmup_s: float, spread: float) -> dict:
    """Whether the p99 of every minute that starts at or after ``warmup_s`` is at most
    ``spread`` times the median of those minutes' p99 (steady when there is none to judge).

    >>> rows = [{"minute": m, "p99_ms": p} for m, p in enumerate([600, 110, 160, 140, 150], 1)]
    >>> v = p99_steady(rows, 120, 2.0); v["steady"], v["median_ms"], v["worst_minute"]
    (True, 150, 3)
    >>> p99_steady(rows + [{"minute": 6, "p99_ms": 434}], 120, 2.0)["steady"]
    False
    """
    after = [r for r in minutes if (r["minute"] - 1) * MINUTE_S >= warmup_s and r["p99_ms"]]
    if not after:
        return {
            "steady": True,
            "minutes": 0,
            "median_ms": None,
            "max_ms": None,
            "worst_minute": None,
            "spread": spread,
        }
    p99s = sorted(r["p99_ms"] for r in after)
    k = len(p99s)
    median = p99s[k // 2] if k % 2 else (p99s[k // 2 - 1] + p99s[k // 2]) / 2
    worst = max(after, key=lambda r: r["p99_ms"])
    return {
        "steady": worst["p99_ms"] <= spread * median,
        "minutes": k,
        "median_ms": median,
        "max_ms": worst["p99_ms"],
        "worst_minute": worst["minute"],
        "spread": spread,
    }


# ---- the run ------------------------------------------------------------------------------------
@dataclass
class SoakResult:
    published: int
    publish_s: float
    matched: int
    deliveries_timed: int
    minutes: list[dict[str, Any]]
    samples: list[Sample]
    crowd_moves: int
    slowest: list[dict[str, Any]] = field(default_factory=list)


async def _sample_every(
    processes: ClusterProcesses, t0: float, every_s: float, out: list[Sample], say
) -> None:
    while True:
        s = await asyncio.to_thread(sample, processes, time.time() - t0)
        out.append(s)
        say(f"  {s.t:6.0f} s  RSS MB " + ", ".join(f"{n} {v:,.0f}" for n, v in s.rss_mb.items()))
        await asyncio.sleep(max(0.0, t0 + (len(out)) * every_s - time.time()))


async def run_traffic(endpoint: Endpoint | str, processes: ClusterProcesses, subs, msgs, args, say):
    """Publisher, followed streams, crowd and the sampler at once, for ``--duration`` s."""
    channels: list = []

    def stub():
        ch = channel(endpoint, CHANNEL_OPTIONS)
        channels.append(ch)
        return pb_grpc.GeoPubSubStub(ch)

    n = max(1, round(args.rate * args.duration))
    publisher = Publisher(msgs, n, ttl=args.ttl, rate=args.rate, batch=args.batch)
    per_minute = PerMinute(0.0)

    def timed(r) -> None:
        if r.kind == "+":
            due = publisher.due_of(r.message_id)
            if due < math.inf:
                per_minute.started = per_minute.started or float(publisher.due[0])
                per_minute.add(due, r.received - due)

    followed = busiest(subs, msgs, args.streams, seed=args.seed)
    streams = [ResultStream(s.id, keep=False, on_delivery=timed) for s in followed]
    moving = [s for s in subs if s.moving]
    crowd = Crowd(moving, rate=args.crowd_rate, seed=args.seed) if moving else None
    samples: list[Sample] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task] = []
    try:
        reader = stub()
        tasks += [asyncio.ensure_future(s.run(reader)) for s in streams]
        await warm_up(stub(), msgs)
        await asyncio.sleep(0.5)
        t0 = time.time()
        say(
            f"traffic       {n:,} messages at {args.rate:,g}/s (ttl {args.ttl:g} s), "
            f"{len(streams)} streams followed, {len(moving):,} moving at {args.crowd_rate:,g} "
            f"moves/s; RSS every {args.sample_every:g} s"
        )
        tasks.append(
            asyncio.ensure_future(_sample_every(processes, t0, args.sample_every, samples, say))
        )
        crowd_task = None
        if crowd is not None and args.crowd_rate > 0:
            crowd_task = asyncio.ensure_future(crowd.run(stub(), stop))
            tasks.append(crowd_task)
        await publisher.run(stub())
        stop.set()
        if crowd_task is not None:
            await crowd_task
        await wait_quiet(streams, QUIET_S, timeout_s=60.0)
        samples.append(await asyncio.to_thread(sample, processes, time.time() - t0))
    finally:
        await stop_traffic(tasks, channels)
    return SoakResult(
        publisher.answered,
        publisher.finished - publisher.started,
        publisher.matched,
        sum(len(v) for v in per_minute.samples.values()),
        per_minute.table(),
        samples,
        crowd.sent if crowd is not None else 0,
        per_minute.slowest(),
    )


def _minute_rows(res: SoakResult) -> list[dict[str, Any]]:
    """Per minute: latency and the RSS of each process at the minute's last sample."""
    rss_by_minute: dict[int, dict[str, float]] = {}
    for s in res.samples:
        rss_by_minute[max(1, math.ceil(s.t / MINUTE_S))] = s.rss_mb
    return [{**row, "rss_mb": rss_by_minute.get(row["minute"], {})} for row in res.minutes]


def report(res: SoakResult, verdict: dict, reg: dict | None, n_subs: int, args) -> dict:
    return {
        "subscriptions": n_subs,
        "registration": reg,
        "offered_msgs_per_s": args.rate,
        "published": res.published,
        "published_per_s": round(res.published / res.publish_s, 1) if res.publish_s else 0.0,
        "matched": res.matched,
        "deliveries_timed": res.deliveries_timed,
        "streams": args.streams,
        "crowd_moves": res.crowd_moves,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "tolerance_pct": round(100 * args.tolerance, 1),
        "minutes": _minute_rows(res),
        "rss": verdict,
        "rss_samples": [asdict(s) for s in res.samples],
        "flat": verdict["flat"],
        "p99_steady": p99_steady(res.minutes, args.warmup, args.p99_spread),
        "slowest_seconds": res.slowest,
    }


def print_report(r: dict, out) -> None:
    names = list(r["rss"]["processes"])
    head = f"{'minute':>6} {'p50 ms':>8} {'p99 ms':>8} {'timed':>9}  " + "  ".join(
        f"{n:>14}" for n in names
    )
    lines = [
        f"geopubsub bench soak: {r['subscriptions']:,} subscriptions, {r['published']:,} messages "
        f"in {r['duration_s']:g} s ({r['published_per_s']:,.0f}/s of {r['offered_msgs_per_s']:,g}"
        f" offered), {r['streams']} streams followed, {r['crowd_moves']:,} crowd moves",
        "  publish->delivery latency per minute and RSS (MB) at its end:",
        "  " + head,
    ]
    for row in r["minutes"]:
        rss = "  ".join(f"{row['rss_mb'].get(n, float('nan')):>14,.0f}" for n in names)
        lines.append(
            f"  {row['minute']:>6} {row['p50_ms'] or 0:>8.1f} {row['p99_ms'] or 0:>8.1f} "
            f"{row['n']:>9,}  {rss}"
        )
    lines.append(
        f"  RSS after the {r['warmup_s']:g} s warm-up, within ±{r['tolerance_pct']:g} % of one "
        f"level: {'FLAT' if r['flat'] else 'NOT FLAT'}"
    )
    for name, p in r["rss"]["processes"].items():
        if "at_warmup_mb" in p:
            lines.append(
                f"    {name:14s} {p['at_warmup_mb']:8,.0f} MB at the warm-up's end, "
                f"{p['min_mb']:,.0f}..{p['max_mb']:,.0f} after, {p['last_mb']:,.0f} last: "
                f"{p['level_mb']:,.0f} ±{p['deviation_pct']:.1f} %"
                f"{' ' + p['note'] if p['note'] else ''}"
                f"{'' if p['flat'] else '  NOT FLAT'}"
            )
        else:
            lines.append(f"    {name:14s} {p['note']}  NOT FLAT")
    q = r["p99_steady"]
    if q["minutes"]:
        lines.append(
            f"  p99 of the {q['minutes']} minutes after the warm-up: median {q['median_ms']:.1f} ms,"
            f" worst {q['max_ms']:.1f} ms (minute {q['worst_minute']}), within {q['spread']:g}x"
            f" the median: {'STEADY' if q['steady'] else 'NOT STEADY'}"
        )
    else:
        lines.append("  p99 per minute: no whole minute after the warm-up to judge")
    if r["slowest_seconds"]:
        lines.append(
            "  slowest seconds (of due time; UTC): "
            + ", ".join(
                f"{x['second']} s ({x['utc']}) {x['max_ms']:,.0f} ms" for x in r["slowest_seconds"]
            )
        )
    print("\n".join(lines), file=out)


# ---- the command --------------------------------------------------------------------------------
def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "soak", help="a long run at a fixed rate: RSS of every process and latency per minute"
    )
    p.add_argument("--subs", type=Path, help="subscriptions, JSON Lines (else generated)")
    p.add_argument("--msgs", type=Path, help="messages, JSON Lines (with --subs)")
    p.add_argument("--gen-subs", type=int, default=100_000, help="subscriptions generated")
    p.add_argument("--gen-msgs", type=int, default=20_000, help="messages generated")
    p.add_argument("--moving-share", type=float, default=0.1, help="of the generated ones")
    p.add_argument("--target", help="a running cluster at HOST:PORT (else one is started)")
    add_client_flags(p)  # --ca --cert --key --token for a --target serving TLS / with auth on
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".geopubsub/bench-soak"),
        help="the started cluster's (with --target: the running one's, for its processes)",
    )
    p.add_argument("--shards", type=int, default=2)
    p.add_argument(
        "--register",
        choices=("load", "grpc", "none"),
        default="load",
        help="load: the bulk loader, then Reload (a started cluster); grpc: Subscribe calls; "
        "none: registered already",
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of publishing")
    p.add_argument("--rate", type=float, default=5000.0, help="messages/s offered")
    p.add_argument("--batch", type=int, default=16, help="due messages per PublishRequest")
    p.add_argument("--ttl", type=float, default=10.0, help="seconds a message is live")
    p.add_argument("--streams", type=int, default=100, help="static result streams followed")
    p.add_argument("--crowd-rate", type=float, default=500.0, help="moves/s of moving subs")
    p.add_argument("--warmup", type=float, default=120.0, help="seconds before RSS must be flat")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--tolerance", type=float, default=0.10, help="RSS band after the warm-up")
    p.add_argument(
        "--p99-spread",
        type=float,
        default=2.0,
        help="a minute's p99 after the warm-up may be at most this times their median",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)


def _validate(args) -> None:
    for name in ("duration", "rate", "ttl", "sample_every", "tolerance", "p99_spread"):
        if not getattr(args, name) > 0:
            raise ValidationError(f"--{name.replace('_', '-')}", getattr(args, name), "must be > 0")
    if not 0 <= args.warmup < args.duration - args.sample_every:
        raise ValidationError(
            "--warmup", args.warmup, "must leave a sample after it (< duration - sample-every)"
        )
    for name in ("streams", "crowd_rate"):
        if getattr(args, name) < 0:
            raise ValidationError(
                f"--{name.replace('_', '-')}", getattr(args, name), "must be >= 0"
            )
    if args.batch < 1 or args.shards < 1:
        raise ValidationError("--batch/--shards", f"{args.batch}/{args.shards}", "must be >= 1")
    if args.target and args.register == "load":
        raise ValidationError("--register", "load", "loads a cluster it starts (no --target)")
    if args.target and args.subs is None:
        raise ValidationError("--subs", None, "required with --target")
    if (args.subs is None) != (args.msgs is None):
        raise ValidationError("--subs/--msgs", str(args.subs or args.msgs), "give both or neither")

    check_files("--subs/--msgs", (args.subs, args.msgs))


def run(args) -> int:
    _validate(args)
    data_dir = Path(args.data_dir)
    started = False
    try:
        with sigterm_as_interrupt():
            try:
                w = read_workload(args, say)
                freeze_long_lived()  # the client's own pauses would count as latency
                hand_over_promptly()
                reg = None
                if args.target:
                    target = client_access(args, args.target)
                    if local.read_manifest(data_dir) is None:
                        raise ValidationError(
                            "--data-dir", str(data_dir), "no cluster.json: its processes unknown"
                        )
                    if args.register == "grpc":
                        reg = register_workload(w, "grpc", say, target=target)
                else:
                    say(f"cluster       starting in {data_dir} (supervised, detached) ...")
                    started = True
                    cluster = start_supervised(data_dir, args.shards)
                    target = cluster.target
                    say(f"              SERVING at {target}")
                    if args.register != "none":
                        reg = register_workload(
                            w, args.register, say, target=target, cluster=cluster
                        )
                    if args.register == "load":
                        settle(cluster.redis_url)
                processes = ClusterProcesses(data_dir)
                res = asyncio.run(run_traffic(target, processes, w.subs, w.msgs, args, say))
            except KeyboardInterrupt:
                say("interrupted")
                return 130
            finally:
                if started:
                    say("cluster       stopping ...")
                    local.down(data_dir, out=io.StringIO())
    except KeyboardInterrupt:
        return 130
    verdict = rss_flat(res.samples, args.warmup, args.tolerance)
    r = report(res, verdict, reg, len(w.subs), args)
    if args.json:
        print(json.dumps(r))
    else:
        print_report(r, sys.stdout)
    return 0 if r["flat"] and r["p99_steady"]["steady"] else 1
