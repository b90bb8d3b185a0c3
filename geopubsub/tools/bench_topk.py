"""``geopubsub bench topk``: top-k subscription matching (paper 001) -- the R^I-tree, TAS or the
brute-force scan over a subscription file, every event of an event file, exact.

    geopubsub bench topk --subs subs.jsonl --msgs events.jsonl --k 10 --index ritree \\
        [--json] [--out FILE] [--check-sample 50] [--max-dist auto|domain|DEGREES]

Reports the build seconds and µs per event of the index; the brute-force scan (the oracle,
``shard.topk.oracle.BruteTopK``) is built beside it and run on the first ``--check-sample``
events, whose results must be identical (ids, order and scores); its µs per event is printed
next to the index's. ``--out`` writes ``msg_id<TAB>rank<TAB>sub_id<TAB>score`` (rank from 1,
score as Python's ``repr``). Exit status 1 when the check finds a difference.

Workloads come from ``geopubsub.tools.gen_topk.generate_topk``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from geopubsub.tools.bench_topk_cluster import run_cluster
from shard.errors import ValidationError
from shard.topk.model import (
    DEFAULT_MAX_DIST,
    TopKEvent,
    TopKSubscription,
    bbox_diagonal,
    read_events,
    read_subscriptions,
)
from shard.topk.oracle import BruteTopK
from shard.topk.ritree import DEFAULT_ALPHA_SLABS, DEFAULT_FANOUT, RITree
from shard.topk.tas import TAS

INDEXES = {"ritree": RITree, "tas": TAS, "brute": BruteTopK}
"""``--index`` names."""

TOPK_BATCH = 1024
"""Events per ``topk_batch`` call."""


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``topk`` to the ``bench`` subcommands."""
    p = kinds.add_parser(
        "topk", help="top-k subscription matching: R^I-tree, TAS, brute (paper 001)"
    )
    p.add_argument("--subs", required=True, type=Path, help="top-k subscriptions, JSON Lines")
    p.add_argument("--msgs", required=True, type=Path, help="events, JSON Lines")
    p.add_argument("--k", type=int, default=10, help="results per event (default 10)")
    p.add_argument("--index", choices=tuple(INDEXES), default="ritree")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    p.add_argument("--out", type=Path, help="write msg_id<TAB>rank<TAB>sub_id<TAB>score")
    p.add_argument(
        "--check-sample",
        type=int,
        default=50,
        help="check the first N events against the brute-force oracle (0: skip)",
    )
    p.add_argument(
        "--max-dist",
        default="auto",
        help="MaxDist of Eq. 4: 'auto' (the subscriptions' bounding-box diagonal, the paper's "
        "'maximum distance between subscriptions' bound), 'domain' (the lon/lat diagonal) or "
        "degrees",
    )
    p.add_argument("--fanout", type=int, default=DEFAULT_FANOUT, help="ritree / tas node capacity")
    p.add_argument(
        "--alpha-slabs",
        type=int,
        default=DEFAULT_ALPHA_SLABS,
        help="ritree / tas: α slabs of the bulk load (1: purely spatial)",
    )
    p.add_argument("--sample", type=int, default=0, help="only the first N events (0: all)")
    p.add_argument("--repeat", type=int, default=1, help="matching passes; the median is reported")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="then end to end: an empty local cluster, the subscriptions registered, the events "
        "published with top_k through gRPC (geopubsub/tools/bench_topk_cluster.py)",
    )
    p.add_argument("--shards", type=int, default=2, help="--cluster: shards")
    p.add_argument(
        "--register",
        choices=("load", "grpc"),
        default="load",
        help="--cluster: load: the Spark bulk loader, then Reload (default); grpc: Subscribe calls",
    )
    p.add_argument("--serial", type=int, default=200, help="--cluster: unary calls timed")
    p.add_argument("--batch", type=int, default=100, help="--cluster: events a stream request")
    p.add_argument("--data-dir", type=Path, default=Path(".geopubsub/bench-topk"))
    p.add_argument("--strict", action="store_true", help="a bad input line is fatal")
    p.set_defaults(func=run)


def _log(args, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def _max_dist(args, subs: list[TopKSubscription]) -> float:
    raw = str(args.max_dist)
    if raw == "auto":
        return bbox_diagonal(subs)
    if raw == "domain":
        return DEFAULT_MAX_DIST
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError("--max-dist", raw, "must be auto, domain or a number") from None
    if not value > 0 or value == float("inf"):
        raise ValidationError("--max-dist", raw, "must be a finite number > 0")
    return value


def _options(name: str, args, max_dist: float) -> dict:
    opts: dict = {"max_dist": max_dist}
    if name != "brute":
        opts["fanout"] = args.fanout
        opts["alpha_slabs"] = args.alpha_slabs
    return opts


def _match(index, events: list[TopKEvent], k: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    out: list = []
    for i in range(0, len(events), TOPK_BATCH):
        out.extend(index.topk_batch(events[i : i + TOPK_BATCH], k))
    return time.perf_counter() - t0, out


def _warm_up(name: str, subs: list[TopKSubscription], events: list[TopKEvent], opts: dict) -> None:
    """Compile (or load from numba's cache) the kernels before anything is timed."""
    if subs and events:
        INDEXES[name].build(subs[:64], **opts).topk_batch(events[:2], 3)


def run(args) -> int:
    """The ``bench topk`` command; 0 when the check found no difference."""
    if isinstance(args.k, bool) or args.k < 1:
        raise ValidationError("--k", args.k, "must be >= 1")
    if args.check_sample < 0:
        raise ValidationError("--check-sample", args.check_sample, "must be >= 0")
    for flag, path in (("--subs", args.subs), ("--msgs", args.msgs)):
        if not path.exists():
            raise ValidationError(flag, str(path), "no such file")
    errors: list[str] = []
    t0 = time.perf_counter()
    subs = list(read_subscriptions(args.subs, strict=args.strict, errors=errors))
    events = list(read_events(args.msgs, strict=args.strict, errors=errors))
    if args.sample:
        events = events[: args.sample]
    load_s = time.perf_counter() - t0
    for e in errors[:10]:
        _log(args, f"  skipped {e}")
    max_dist = _max_dist(args, subs)
    opts = _options(args.index, args, max_dist)
    _log(args, f"loaded {len(subs):,} subscriptions, {len(events):,} events in {load_s:.1f} s")
    _warm_up(args.index, subs, events, opts)
    t1 = time.perf_counter()
    index = INDEXES[args.index].build(subs, **opts)
    build_s = time.perf_counter() - t1
    _log(args, f"built {args.index} over {len(index):,} in {build_s:.2f} s; matching")
    if args.repeat < 1:
        raise ValidationError("--repeat", args.repeat, "must be >= 1")
    runs = []
    for _ in range(args.repeat):
        index.scored = 0
        secs, results = _match(index, events, args.k)
        runs.append(secs)
    match_s = statistics.median(runs)
    n = max(len(events), 1)
    report: dict = {
        "index": args.index,
        "n_subs": len(index),
        "n_events": len(events),
        "k": args.k,
        "max_dist": max_dist,
        "fanout": args.fanout if args.index != "brute" else None,
        "alpha_slabs": args.alpha_slabs if args.index != "brute" else None,
        "load_s": round(load_s, 3),
        "build_s": round(build_s, 3),
        "match_s": round(match_s, 4),
        "match_s_runs": [round(x, 4) for x in runs],
        "us_per_event": round(match_s / n * 1e6, 2),
        "events_per_s": round(len(events) / match_s, 1) if match_s > 0 else None,
        "results": sum(len(r) for r in results),
        "scored_per_event": round(index.scored / n, 1),
        "bad_lines": len(errors),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    }
    if args.out is not None:
        with open(args.out, "w", encoding="utf-8") as fh:
            for e, ranked in zip(events, results, strict=True):
                for rank, (sid, score) in enumerate(ranked, 1):
                    fh.write(f"{e.id}\t{rank}\t{sid}\t{score!r}\n")
    ok = True
    if args.check_sample > 0 and events:
        report["check"] = _check(args, subs, events[: args.check_sample], results, max_dist)
        ok = report["check"]["identical"]
    if args.cluster:
        report["cluster"] = run_cluster(args, events, args.k, lambda t: _log(args, t))
        ok = ok and report["cluster"]["wrong_counts"] == 0
    if args.json:
        print(json.dumps(report))
    else:
        _print_summary(report)
    return 0 if ok else 1


def _check(args, subs, sample: list[TopKEvent], results: list, max_dist: float) -> dict:
    """The brute-force oracle over the same subscriptions, on ``sample``: its timing and whether
    every result is identical."""
    _warm_up("brute", subs, sample, {"max_dist": max_dist})
    t0 = time.perf_counter()
    brute = BruteTopK.build(subs, max_dist=max_dist)
    brute_build_s = time.perf_counter() - t0
    brute_s, want = _match(brute, sample, args.k)
    bad = [e.id for e, w, g in zip(sample, want, results, strict=False) if w != g]
    return {
        "sample": len(sample),
        "brute_build_s": round(brute_build_s, 3),
        "brute_us_per_event": round(brute_s / max(len(sample), 1) * 1e6, 2),
        "brute_results": sum(len(w) for w in want),
        "brute_scored_per_event": round(brute.scored / max(len(sample), 1), 1),
        "index_results": sum(len(g) for g in results[: len(sample)]),
        "identical": not bad,
        "mismatched_events": bad[:10],
    }


def _print_summary(r: dict) -> None:
    print(
        f"{r['index']}: {r['n_subs']:,} subscriptions, {r['n_events']:,} events, k={r['k']}, "
        f"MaxDist={r['max_dist']:.4g}"
    )
    print(
        f"  build {r['build_s']:.3f} s; {r['us_per_event']:.1f} µs/event; "
        f"{r['scored_per_event']:,.0f} subscriptions scored/event; {r['results']:,} results"
    )
    e = r.get("cluster")
    if e:
        print(
            f"  through the cluster ({e['shards']} shards): Publish p50 {e['p50_ms']} ms, p99 "
            f"{e['p99_ms']} ms; {e['events_per_s']:,.0f} events/s through a PublishStream "
            f"({e['stream_batch']} a request); {e['wrong_counts']} wrong counts"
        )
    c = r.get("check")
    if c:
        verdict = "identical" if c["identical"] else f"DIFFERENT on {c['mismatched_events']}"
        print(
            f"  brute force on {c['sample']} events: {c['brute_us_per_event']:.1f} µs/event, "
            f"{c['brute_scored_per_event']:,.0f} scored/event "
            f"(build {c['brute_build_s']:.3f} s); {c['brute_results']:,} vs "
            f"{c['index_results']:,} results: {verdict}"
        )
