"""``geopubsub bench``: benchmarks as commands (never timed tests).

* ``bench match``    build an index over a subscription file and match a message file;
                     the brute-force baseline runs beside it on a sample, with both hit counts;
                     beside the AP-Tree, the keyword-first inverted list (``shard.invlist``)
                     matches every message in the same run.
* ``bench update``   subscribe / unsubscribe throughput on a built tree.
* ``bench maintain`` the paper's Fig. 17 case: build on a share, insert the rest, compare
                     matching speed with a fresh build.
* ``bench moving``   replay an event stream through the AP+-Tree or the grid baseline.
* ``bench e2e``      the cluster through gRPC (``geopubsub.tools.bench_e2e``).
* ``bench chaos``    faults injected under traffic (kill -9, SIGSTOP of shards, coordinator,
                     redis-server); every followed stream checked for lost, duplicated and
                     out-of-order deliveries (``geopubsub.tools.bench_chaos``).
* ``bench soak``     a long run at a fixed rate: the RSS of every process of the cluster and
                     publish->delivery latency per minute (``geopubsub.tools.bench_soak``).
* ``bench grpc``     Python gRPC's own ceiling: a no-op PublishStream server
                     (``geopubsub.tools.bench_grpc``).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from geopubsub.tools import (
    bench_chaos,
    bench_compare,
    bench_e2e,
    bench_grpc,
    bench_soak,
    bench_subscribe,
    bench_topk,
)
from geopubsub.tools.bench_compare import index_options
from geopubsub.tools.bench_warmup import warm_up, warm_up_moving
from shard.applus import APPlusTree
from shard.aptree import APTree
from shard.aptree.tree import KEYWORD_ORDERS
from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.events import read_events
from shard.indexes import INDEX_NAMES, index_class
from shard.invlist import InvertedList
from shard.model import Message, Subscription
from shard.naive_moving import DEFAULT_CELL_DEG, NaiveMoving
from shard.residual import StaticChecker
from shard.rivals.base import RivalIndex
from shard.workload import read_messages, read_subscriptions, without_topk

MATCH_BATCH = 1024
"""Messages per ``match_batch`` call in the benchmark, like the shard's micro-batches."""


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (see docs/BENCHMARKS.md)")
    kinds = bench.add_subparsers(dest="bench", required=True)

    m = kinds.add_parser("match", help="build an index and match every message")
    _common(m)
    m.add_argument("--msgs", required=True, type=Path, help="messages, JSON Lines")
    m.add_argument("--index", choices=INDEX_NAMES, default="aptree")
    m.add_argument(
        "--index-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a rival index (e.g. strategy=idf for rt+; repeatable)",
    )
    m.add_argument("--out", type=Path, help="write msg_id<TAB>sub_id per match")
    m.add_argument("--sample", type=int, default=0, help="match only the first N messages (0: all)")
    m.add_argument(
        "--baseline-sample",
        type=int,
        default=200,
        help="with --index aptree or invlist, also run brute force on the first N messages "
        "(0: skip)",
    )
    m.add_argument(
        "--invlist-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --index aptree, also build the keyword-first inverted list over the same "
        "subscriptions and match every message with it, in the same run (the two matched in "
        "turn, twice, each timed on its second pass)",
    )
    m.add_argument("--repeat", type=int, default=1, help="build and match N times; report medians")
    m.add_argument(
        "--message-sample",
        type=int,
        default=0,
        help="build with hit probabilities from the first N messages",
    )
    m.set_defaults(func=run_match)

    u = kinds.add_parser("update", help="subscribe/unsubscribe throughput on a built tree")
    _common(u)
    u.add_argument("--ops", type=int, default=20000, help="operations of each kind")
    u.add_argument("--seed", type=int, default=1)
    u.set_defaults(func=run_update)

    f = kinds.add_parser(
        "maintain", help="Fig. 17: build on a share, insert the rest, compare with a fresh build"
    )
    _common(f)
    f.add_argument("--msgs", required=True, type=Path)
    f.add_argument("--initial-share", type=float, default=0.2)
    f.add_argument("--sample", type=int, default=0)
    f.add_argument(
        "--tree",
        choices=("applus", "aptree"),
        default="applus",
        help="applus (the default): the AP+-Tree every shard runs, new keywords of a k-node to "
        "its dummy cut; aptree: the stationary AP-Tree, new keywords widen a cut",
    )
    f.add_argument(
        "--repeat", type=int, default=5, help="matching runs of each tree, in turn (median)"
    )
    f.add_argument(
        "--batch",
        type=int,
        default=1,
        help="subscriptions inserted a call (applus: subscribe_many, as a shard does a round's)",
    )
    f.set_defaults(func=run_maintain)

    mv = kinds.add_parser("moving", help="replay an event stream (AP+-Tree or the grid baseline)")
    mv.add_argument("--events", required=True, type=Path, help="events, JSON Lines")
    mv.add_argument("--subs", type=Path, help="initial subscriptions, built in bulk first")
    mv.add_argument("--index", choices=["applus", "naive"], default="applus")
    mv.add_argument("--out", type=Path, help="write t<TAB>sub_id<TAB>+|-<TAB>msg_id per update")
    mv.add_argument("--json", action="store_true")
    mv.add_argument("--strict", action="store_true")
    mv.add_argument("--naive-cell", type=float, default=None, help="grid cell in degrees")
    mv.add_argument("--dup-limit", type=int, default=None)
    mv.add_argument(
        "--naive-sample",
        type=int,
        default=1,
        help="naive: compute the updates of every K-th batch of moves only (the others just move "
        "the subscriptions); msp_us and updates then cover the sampled batches",
    )
    mv.add_argument(
        "--batch", type=int, default=256, help="publishes / moves of one time per batch call"
    )
    mv.add_argument(
        "--rebuild-at",
        type=float,
        default=None,
        help="rebuild the index at this event time (velocities known by then) and time only "
        "the events after it",
    )
    mv.add_argument(
        "--no-move-cost",
        action="store_true",
        help="AP+-Tree without the moving penalty (Cslu + Circ) in its cost model",
    )
    mv.set_defaults(func=run_moving)

    bench_e2e.register(kinds)
    bench_chaos.register(kinds)
    bench_soak.register(kinds)
    bench_grpc.register(kinds)
    bench_subscribe.register(kinds)
    bench_compare.register(kinds)
    bench_topk.register(kinds)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--subs", required=True, type=Path, help="subscriptions, JSON Lines")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    p.add_argument("--strict", action="store_true", help="a bad input line is fatal")
    p.add_argument("--fanout", type=int, default=None)
    p.add_argument("--theta-p", type=int, default=None)
    p.add_argument("--keyword-partition", choices=["heuristic", "optimal"], default="heuristic")
    p.add_argument(
        "--keyword-fanout",
        type=int,
        default=None,
        help="cuts per k-node at most (0: one per keyword, the default; the paper: --fanout)",
    )
    p.add_argument(
        "--keyword-order",
        choices=KEYWORD_ORDERS,
        default=None,
        help="global keyword order (default rare-first; the paper's: frequency)",
    )


def _tree_options(args) -> dict:
    opts: dict = {"keyword_partition": args.keyword_partition}
    if args.fanout is not None:
        opts["fanout"] = args.fanout
    if args.theta_p is not None:
        opts["theta_p"] = args.theta_p
    if args.keyword_fanout is not None:
        opts["keyword_fanout"] = args.keyword_fanout
    if args.keyword_order is not None:
        opts["keyword_order"] = args.keyword_order
    return opts


def _log(args, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _progress(items: Iterator, args, what: str, every: int = 250_000) -> Iterator:
    t0 = time.perf_counter()
    n = 0
    for n, item in enumerate(items, 1):
        if n % every == 0:
            dt = time.perf_counter() - t0
            _log(args, f"  {what}: {n:,} ({n / dt:,.0f}/s)")
        yield item


def _read_subs(args, errors: list[str]) -> Iterator[Subscription]:
    if not args.subs.exists():
        raise ValidationError("--subs", str(args.subs), "no such file")
    subs = read_subscriptions(args.subs, strict=args.strict, errors=errors)
    return _progress(without_topk(subs, errors, args.strict), args, "subscriptions read")


def _read_msgs(args, errors: list[str], limit: int = 0) -> list[Message]:
    if not args.msgs.exists():
        raise ValidationError("--msgs", str(args.msgs), "no such file")
    out = []
    for m in read_messages(args.msgs, strict=args.strict, errors=errors):
        out.append(m)
        if limit and len(out) >= limit:
            break
    return out


def _report_bad(args, errors: list[str]) -> None:
    for e in errors[:10]:
        _log(args, f"  skipped {e}")
    if len(errors) > 10:
        _log(args, f"  ... and {len(errors) - 10} more bad lines")


def _match_all(
    index, msgs: list[Message], args, checker: StaticChecker | None = None
) -> tuple[float, list[tuple[str, str]] | int]:
    """Match in batches; returns (seconds, pairs list if --out else count). An index with the
    encoded path (``encode`` / ``match_encoded``) is timed by phase too: ``index.phase_s`` holds
    the seconds spent encoding messages, in the compiled match and turning slots into ids
    (``match_batch`` is exactly those three). ``checker``: the conditions the index does not
    check (NOT, polygons, predicates), tested on its pairs, timed with the match."""
    want_pairs = getattr(args, "out", None) is not None
    pairs: list[tuple[str, str]] = []
    count = 0
    phased = hasattr(index, "match_encoded")
    phase = [0.0, 0.0, 0.0, 0.0]
    untimed = 0.0
    t0 = time.perf_counter()
    last = t0
    for i in range(0, len(msgs), MATCH_BATCH):
        batch = msgs[i : i + MATCH_BATCH]
        if phased:
            a = time.perf_counter()
            encoded = index.encode(batch)
            b = time.perf_counter()
            out_m, out_s = index.match_encoded(encoded)
            if checker is not None:
                out_m, out_s = checker.filter(index.store, batch, out_m, out_s, encoded)
            c = time.perf_counter()
            result = index.ids_of(len(batch), out_m, out_s)
            d = time.perf_counter()
            _answer_tags(index, len(batch), out_m, out_s)
            e = time.perf_counter()
            phase[0] += b - a
            phase[1] += c - b
            phase[2] += d - c
            phase[3] += e - d
            untimed += e - d
        else:
            result = index.match_batch(batch)
        for m, ids in zip(batch, result, strict=True):
            count += len(ids)
            if want_pairs:
                pairs.extend((m.id, s) for s in ids)
        now = time.perf_counter()
        if now - last > 5:
            _log(args, f"  matched {i + len(batch):,}/{len(msgs):,} messages")
            last = now
    if phased:
        index.phase_s = phase
    return time.perf_counter() - t0 - untimed, (pairs if want_pairs else count)


def _answer_tags(index, n: int, out_m: np.ndarray, out_s: np.ndarray) -> tuple:
    """The batch's matches as a shard answers the coordinator (``ShardState.publish_tagged``):
    the tag of every subscription reached and how many each message reached, two integer
    arrays. Timed as its own phase (``tags``), outside the match's total."""
    return index.store.tag[out_s], np.bincount(out_m, minlength=n)


def _phases_us(runs: list[list[float]], n: int) -> dict[str, float]:
    """Median µs per message of each phase over the runs (encode, match, ids, tags), and
    ``answer_us``: encode + match + tags, a message as a shard answers it (tags, not ids)."""
    out = {
        name: round(statistics.median(r[k] for r in runs) / max(n, 1) * 1e6, 2)
        for k, name in enumerate(("encode_us", "kernel_us", "ids_us", "tags_us"))
    }
    out["answer_us"] = round(out["encode_us"] + out["kernel_us"] + out["tags_us"], 2)
    return out


def run_match(args) -> int:
    errors: list[str] = []
    warm_up()
    t0 = time.perf_counter()
    msgs = _read_msgs(args, errors, args.sample)
    sample_msgs = msgs[: args.message_sample] if args.message_sample else None
    if args.repeat < 1:
        raise ValidationError("--repeat", args.repeat, "must be >= 1")
    builds: list[float] = []
    matches: list[float] = []
    phases: list[list[float]] = []
    index: APTree | InvertedList | BruteMatcher | RivalIndex
    checker = StaticChecker()  # NOT, polygons, predicates: tested on the index's pairs
    if args.index != "brute":
        if args.index == "aptree":
            index = APTree(**_tree_options(args))
        elif args.index == "invlist":
            index = InvertedList()
        else:
            index = index_class(args.index)(**index_options(args.index_option))
        index.store.add_bulk(checker.cores(_read_subs(args, errors)))
        checker.bind(index.store)
        load_s = time.perf_counter() - t0
        _log(args, f"loaded {len(index):,} subscriptions, {len(msgs):,} messages in {load_s:.1f} s")
        beside = isinstance(index, APTree) and args.invlist_baseline
        lists: list[tuple[float, float, list[float], object]] = []
        for run in range(args.repeat):
            t1 = time.perf_counter()
            if isinstance(index, APTree):
                index.rebuild(message_sample=sample_msgs)
            else:
                index.rebuild()
            builds.append(time.perf_counter() - t1)
            _log(args, f"run {run + 1}: built {args.index} in {builds[-1]:.2f} s; matching")
            if beside:  # both, in turn, twice; the second pass of each timed (see _in_turn)
                (match_s, result, phase), listed = _in_turn(index, msgs, args, checker)
                lists.append(listed)
            else:
                match_s, result = _match_all(index, msgs, args, checker)
                phase = index.phase_s
            matches.append(match_s)
            phases.append(phase)
        n_subs = len(index)
    else:
        index = BruteMatcher(_read_subs(args, errors))
        load_s = time.perf_counter() - t0
        n_subs = len(index)
        for run in range(args.repeat):
            t1 = time.perf_counter()
            index.refresh(force=True)
            builds.append(time.perf_counter() - t1)
            _log(
                args,
                f"run {run + 1}: built brute force over {n_subs:,} in {builds[-1]:.2f} s; matching",
            )
            match_s, result = _match_all(index, msgs, args)
            matches.append(match_s)
    _report_bad(args, errors)
    build_s = statistics.median(builds)
    match_s = statistics.median(matches)
    pairs = len(result) if isinstance(result, list) else result
    if args.out is not None:
        with open(args.out, "w", encoding="utf-8") as fh:
            for m, s in result:  # type: ignore[union-attr]
                fh.write(f"{m}\t{s}\n")
    n = max(len(msgs), 1)
    report = {
        "index": args.index,
        "n_subs": n_subs,
        "with_conditions": len(checker),
        "n_msgs": len(msgs),
        "build_s": round(build_s, 3),
        "load_s": round(load_s, 3),
        "match_s": round(match_s, 4),
        "us_per_msg": round(match_s / n * 1e6, 2),
        "msgs_per_s": round(len(msgs) / match_s, 1) if match_s > 0 else None,
        "pairs": pairs,
        "bad_lines": len(errors),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "runs": args.repeat,
        "build_s_runs": [round(b, 3) for b in builds],
        "match_s_runs": [round(m, 4) for m in matches],
    }
    if phases:
        report["phases"] = _phases_us(phases, len(msgs))
    invlist = None
    if isinstance(index, APTree) and args.invlist_baseline:
        report["invlist"], invlist = _invlist_beside(args, msgs, report, result, lists)
    if args.index != "brute" and args.baseline_sample > 0 and msgs:
        report["baseline"] = _baseline(
            args, index, msgs[: args.baseline_sample], report, invlist, checker
        )
    if args.json:
        print(json.dumps(report))
    else:
        _print_summary(report)
    return 0


def _in_turn(tree: APTree, msgs: list[Message], args, checker: StaticChecker):
    """The keyword-first inverted list built over the tree's own store (no second load), then
    both matched on every message in turn, tree, list, tree, list: each index's second pass is
    the one timed, so that each follows the other's pass (the subscription ids both turn slots
    into are then equally warm, and neither is timed straight after its own build). Returns
    the tree's (seconds, result, phases) and the list's (build seconds, seconds, phases, the
    list and its result)."""
    t0 = time.perf_counter()
    invlist = InvertedList.from_store(tree.store)
    build_s = time.perf_counter() - t0
    _match_all(tree, msgs, args, checker)
    _match_all(invlist, msgs, args, checker)
    tree_s, tree_result = _match_all(tree, msgs, args, checker)
    tree_phases = tree.phase_s
    list_s, list_result = _match_all(invlist, msgs, args, checker)
    return (tree_s, tree_result, tree_phases), (
        build_s,
        list_s,
        invlist.phase_s,
        (invlist, list_result),
    )


def _invlist_beside(
    args, msgs: list[Message], report: dict, tree_result, runs: list
) -> tuple[dict, InvertedList]:
    """The inverted list's figures from the runs of ``_in_turn``: medians, pair counts of both
    (and, with ``--out``, whether the pairs themselves are identical)."""
    builds = [r[0] for r in runs]
    matches = [r[1] for r in runs]
    phases = [r[2] for r in runs]
    invlist, result = runs[-1][3]
    match_s = statistics.median(matches)
    us = match_s / max(len(msgs), 1) * 1e6
    pairs = len(result) if isinstance(result, list) else result
    out = {
        "build_s": round(statistics.median(builds), 3),
        "match_s": round(match_s, 4),
        "us_per_msg": round(us, 2),
        "pairs": pairs,
        "aptree_pairs": report["pairs"],
        "aptree_speedup": round(us / report["us_per_msg"], 2) if report["us_per_msg"] else None,
        "aptree_answer_speedup": _ratio(_phases_us(phases, len(msgs)), report.get("phases")),
        "match_s_runs": [round(m, 4) for m in matches],
        "phases": _phases_us(phases, len(msgs)),
        "stats": invlist.stats(),
    }
    if isinstance(result, list):
        out["identical"] = sorted(result) == sorted(tree_result)
    return out, invlist


def _ratio(listed: dict, tree: dict | None) -> float | None:
    """The list's ``answer_us`` over the tree's (both phased), else None."""
    if not tree or not tree.get("answer_us"):
        return None
    return round(listed["answer_us"] / tree["answer_us"], 2)


def _baseline(
    args,
    index,
    msgs: list[Message],
    report: dict,
    invlist: InvertedList | None = None,
    checker: StaticChecker | None = None,
) -> dict:
    """Brute force on a sample in the same run, with hit counts of each index on that sample
    (the inverted list's too when it ran beside the AP-Tree)."""
    _log(args, f"brute-force baseline on {len(msgs)} messages")
    brute = BruteMatcher(_read_subs(args, []))
    brute.refresh()
    t0 = time.perf_counter()
    expected = brute.match_batch(msgs)
    brute_s = time.perf_counter() - t0
    checker = checker or StaticChecker()
    results = {args.index: checker.match(index, msgs)}
    if invlist is not None:
        results["invlist"] = checker.match(invlist, msgs)
    agree = all(
        sorted(a) == sorted(b)
        for got in results.values()
        for a, b in zip(expected, got, strict=True)
    )
    brute_us = brute_s / len(msgs) * 1e6
    out = {
        "n_msgs": len(msgs),
        "brute_us_per_msg": round(brute_us, 1),
        "brute_pairs": sum(map(len, expected)),
    }
    for name, got in results.items():
        out[f"{name}_pairs"] = sum(map(len, got))
    out["identical"] = agree
    out["speedup"] = round(brute_us / report["us_per_msg"], 1) if report["us_per_msg"] else None
    return out


def _print_summary(r: dict) -> None:
    print(f"index          {r['index']}")
    print(f"subscriptions  {r['n_subs']:,}   messages {r['n_msgs']:,}   bad lines {r['bad_lines']}")
    print(f"load           {r['load_s']:.2f} s (read + validate + columns)")
    runs = f" (median of {r['runs']} runs)" if r["runs"] > 1 else ""
    print(f"build          {r['build_s']:.2f} s{runs}")
    print(
        f"match          {r['match_s']:.3f} s   {r['us_per_msg']:.1f} us/msg   {r['msgs_per_s'] or 0:,.0f} msgs/s"
    )
    if "phases" in r:
        print(f"  per message  {_phases_text(r['phases'])}")
    print(f"matches        {r['pairs']:,} pairs")
    name = {"aptree": "AP-Tree", "invlist": "inverted list"}.get(r["index"], r["index"])
    if "invlist" in r:
        v = r["invlist"]
        same = {True: ", identical", False: ", DIFFERENT"}.get(v.get("identical"), "")
        x = v["aptree_speedup"] or 0.0
        ratio = f"{x}x faster" if x >= 1 or not x else f"{1 / x:.2f}x slower"
        print(
            f"inverted list  {v['us_per_msg']:.1f} us/msg on all {r['n_msgs']:,} msgs (built in {v['build_s']:.2f} s) -> "
            f"AP-Tree is {ratio}; pairs {v['pairs']:,} / aptree {v['aptree_pairs']:,}{same}"
        )
        print(f"  per message  {_phases_text(v['phases'])}")
        if v.get("aptree_answer_speedup"):
            print(
                f"  as a shard answers (encode + match + tags): AP-Tree {r['phases']['answer_us']:.1f}"
                f" us, inverted list {v['phases']['answer_us']:.1f} us -> {v['aptree_answer_speedup']}x"
            )
    if "baseline" in r:
        b = r["baseline"]
        counts = " / ".join(
            f"{k.removesuffix('_pairs')} {v}" for k, v in b.items() if k.endswith("_pairs")
        )
        print(
            f"brute force    {b['brute_us_per_msg']:,.0f} us/msg on {b['n_msgs']} msgs -> {name} is {b['speedup']}x faster; "
            f"pairs {counts} ({'identical' if b['identical'] else 'DIFFERENT'})"
        )
    print(f"peak RSS       {r['peak_rss_mb']:,.0f} MB")


def _phases_text(p: dict[str, float]) -> str:
    return (
        f"encode {p['encode_us']:.1f} us + match {p['kernel_us']:.1f} us + ids {p['ids_us']:.1f} us"
        f" (or tags {p['tags_us']:.2f} us)"
    )


def run_update(args) -> int:
    errors: list[str] = []
    warm_up()
    subs = list(_read_subs(args, errors))
    if not subs:
        raise ValidationError("--subs", str(args.subs), "holds no valid subscription")
    rng = random.Random(args.seed)
    tree = APTree(**_tree_options(args))
    tree.store.add_bulk(iter(subs))
    t0 = time.perf_counter()
    tree.rebuild()
    build_s = time.perf_counter() - t0
    k = min(args.ops, len(subs))
    victims = rng.sample(subs, k)
    t0 = time.perf_counter()
    for s in victims:
        tree.unsubscribe(s.id)
    unsub_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in victims:
        tree.subscribe(s)
    sub_s = time.perf_counter() - t0
    report = {
        "n_subs": len(tree),
        "ops": k,
        "build_s": round(build_s, 2),
        "unsubscribe_per_s": round(k / unsub_s, 0),
        "subscribe_per_s": round(k / sub_s, 0),
        "unsubscribe_us": round(unsub_s / k * 1e6, 1),
        "subscribe_us": round(sub_s / k * 1e6, 1),
        "stats": tree.stats(),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"tree of {report['n_subs']:,} subscriptions (built in {build_s:.1f} s)")
        print(
            f"unsubscribe    {report['unsubscribe_per_s']:,.0f} ops/s ({report['unsubscribe_us']} us each, {k:,} ops)"
        )
        print(
            f"subscribe      {report['subscribe_per_s']:,.0f} ops/s ({report['subscribe_us']} us each, {k:,} ops)"
        )
        print(f"peak RSS       {report['peak_rss_mb']:,.0f} MB")
    return 0


def run_maintain(args) -> int:
    if not 0 < args.initial_share <= 1:
        raise ValidationError("--initial-share", args.initial_share, "must be in (0, 1]")
    errors: list[str] = []
    warm_up()
    subs = list(_read_subs(args, errors))
    msgs = _read_msgs(args, errors, args.sample)
    if args.repeat < 1:
        raise ValidationError("--repeat", args.repeat, "must be >= 1")
    if args.batch < 1 or (args.batch > 1 and args.tree != "applus"):
        raise ValidationError("--batch", args.batch, "must be >= 1 (> 1 with --tree applus)")
    kind = APPlusTree if args.tree == "applus" else APTree
    k = max(1, int(len(subs) * args.initial_share))
    t0 = time.perf_counter()
    grown = kind.build(iter(subs[:k]), **_tree_options(args))
    build_part_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.batch > 1:
        for i in range(k, len(subs), args.batch):
            grown.subscribe_many(subs[i : i + args.batch])
    else:
        for s in subs[k:]:
            grown.subscribe(s)
    insert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh = kind.build(iter(subs), **_tree_options(args))
    fresh_s = time.perf_counter() - t0
    # both trees in memory, matched in turn --repeat times (medians): one measured before the
    # other was built ran faster or slower by up to 30 % with where its arrays happened to lie
    grown_runs, fresh_runs = [], []
    verified0 = (grown.verified, fresh.verified)
    for _ in range(args.repeat):
        secs, grown_pairs = _match_all(grown, msgs, args)
        grown_runs.append(secs)
        secs, fresh_pairs = _match_all(fresh, msgs, args)
        fresh_runs.append(secs)
    # leaf entries verified a message (the paper's cost measure; the same on every pass)
    grown_verified = (grown.verified - verified0[0]) / args.repeat
    fresh_verified = (fresh.verified - verified0[1]) / args.repeat
    grown_match_s = statistics.median(grown_runs)
    fresh_match_s = statistics.median(fresh_runs)
    n = max(len(msgs), 1)
    report = {
        "tree": args.tree,
        "batch": args.batch,
        "n_subs": len(subs),
        "initial": k,
        "inserted": len(subs) - k,
        "build_initial_s": round(build_part_s, 2),
        "insert_s": round(insert_s, 2),
        "insert_per_s": round((len(subs) - k) / insert_s, 0) if insert_s else None,
        "grown_us_per_msg": round(grown_match_s / n * 1e6, 2),
        "fresh_build_s": round(fresh_s, 2),
        "fresh_us_per_msg": round(fresh_match_s / n * 1e6, 2),
        "grown_verified_per_msg": round(grown_verified / n, 1),
        "fresh_verified_per_msg": round(fresh_verified / n, 1),
        "grown_pairs": grown_pairs,
        "fresh_pairs": fresh_pairs,
        "grown_stats": grown.stats(),
        "fresh_stats": fresh.stats(),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"built on {k:,}, inserted {len(subs) - k:,} in {insert_s:.1f} s ({report['insert_per_s']:,.0f}/s)"
        )
        print(
            f"grown tree     {report['grown_us_per_msg']} us/msg  ({grown_pairs:,} pairs, "
            f"{grown.stats()['rebuilds']} rebuilds, {grown.stats()['promotions']} promotions, "
            f"{report['grown_verified_per_msg']} entries verified a message)"
        )
        print(
            f"fresh build    {report['fresh_us_per_msg']} us/msg  ({fresh_pairs:,} pairs, built in {fresh_s:.1f} s, "
            f"{report['fresh_verified_per_msg']} entries verified a message)"
        )
    return 0


def run_moving(args) -> int:
    """Replay events; publishes and moves of one time are applied in batches of ``--batch``
    (the shard's micro-batches); the updates are the same as one by one."""
    errors: list[str] = []
    warm_up()
    warm_up_moving()
    t0 = time.perf_counter()
    subs = iter(())
    if args.subs is not None:
        if not args.subs.exists():
            raise ValidationError("--subs", str(args.subs), "no such file")
        subs = _read_subs(args, errors)
    if not args.events.exists():
        raise ValidationError("--events", str(args.events), "no such file")
    if args.index == "applus":
        opts: dict = {"move_cost": not args.no_move_cost}
        if args.dup_limit is not None:
            opts["dup_limit"] = args.dup_limit
        index = APPlusTree.build(subs, **opts)
    else:
        index = NaiveMoving(APTree.build(subs), cell_deg=args.naive_cell or DEFAULT_CELL_DEG)
    build_s = time.perf_counter() - t0
    _log(args, f"built {args.index} in {build_s:.1f} s; replaying {args.events}")
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115
    imm = msp = other = adv = 0.0
    n_pub = n_move = n_events = n_updates = 0
    pending: list = []
    pending_t = 0.0

    def emit(t: float, ups) -> None:
        nonlocal n_updates
        n_updates += len(ups)
        if out is not None:
            for s, g, m in ups:
                out.write(f"{t}\t{s}\t{g}\t{m}\n")

    def flush_batch(call, batch: list, t: float) -> tuple[float, int]:
        """Apply one batch; returns (seconds, size)."""
        if not batch:
            return 0.0, 0
        nonlocal adv
        a = time.perf_counter()
        # expirations up to t are their own work, not the batch's (timed as advance_s)
        emit(t, index.advance(t))
        adv += time.perf_counter() - a
        a = time.perf_counter()
        ups = call(batch, t)
        dt = time.perf_counter() - a
        emit(t, ups)
        n = len(batch)
        batch.clear()
        return dt, n

    def flush() -> None:
        nonlocal imm, n_pub
        dt, n = flush_batch(index.publish_batch, pending, pending_t)
        imm += dt
        n_pub += n

    moves: list = []
    moves_t = 0.0
    n_batches = n_unsampled = 0
    sample = args.naive_sample if args.index == "naive" else 1
    if sample < 1:
        raise ValidationError("--naive-sample", sample, "must be >= 1")

    def flush_moves() -> None:
        nonlocal msp, n_move, n_batches, n_unsampled
        if not moves:
            return
        n_batches += 1
        if n_batches % sample:
            emit(moves_t, index.move_batch(moves, moves_t, diff=False))  # expirations only
            n_unsampled += len(moves)
            moves.clear()
            return
        dt, n = flush_batch(index.move_batch, moves, moves_t)
        msp += dt
        n_move += n

    rebuild_s = None
    last_log = time.perf_counter()
    for ev in read_events(args.events, strict=args.strict, errors=errors):
        if args.rebuild_at is not None and rebuild_s is None and ev.t >= args.rebuild_at:
            flush()
            flush_moves()
            a = time.perf_counter()
            index.rebuild()
            rebuild_s = time.perf_counter() - a
            _log(args, f"rebuilt at t={ev.t} in {rebuild_s:.1f} s; timing from here")
            imm = msp = other = adv = 0.0
            n_pub = n_move = n_events = 0
        n_events += 1
        if ev.op == "publish":
            flush_moves()
            if pending and (ev.t != pending_t or len(pending) >= args.batch):
                flush()
            pending.append(ev.msg)
            pending_t = ev.t
            continue
        flush()
        if ev.op == "move":
            if moves and (ev.t != moves_t or len(moves) >= args.batch):
                flush_moves()
            moves.append((ev.id, ev.point))
            moves_t = ev.t
            continue
        flush_moves()
        a = time.perf_counter()
        if ev.op == "subscribe":
            ups = index.subscribe(ev.sub, ev.t)
        else:
            index.advance(ev.t)
            index.unsubscribe(ev.id)
            ups = []
        other += time.perf_counter() - a
        emit(ev.t, ups)
        if time.perf_counter() - last_log > 5:
            _log(args, f"  {n_events:,} events, t={ev.t}")
            last_log = time.perf_counter()
    flush_moves()
    flush()
    if out is not None:
        out.close()
    _report_bad(args, errors)
    report = {
        "index": args.index,
        "events": n_events,
        "publishes": n_pub,
        "moves": n_move,
        "moves_unsampled": n_unsampled,
        "naive_cell_deg": index.cell if args.index == "naive" else None,
        "imm_us": round(imm / max(n_pub, 1) * 1e6, 2),
        "msp_us": round(msp / max(n_move, 1) * 1e6, 2),
        "moves_per_s": round(n_move / msp, 1) if msp else None,
        "updates": n_updates,
        "build_s": round(build_s, 2),
        "rebuild_s": None if rebuild_s is None else round(rebuild_s, 2),
        "other_s": round(other, 3),
        "advance_s": round(adv, 2),
        "live_messages": len(index.msgs),
        "bad_lines": len(errors),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    tree = index.tree if args.index == "naive" else index
    report["tree"] = {k: tree.stats()[k] for k in ("k_nodes", "s_nodes", "leaves", "depth")}
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:14} {v}")
    return 0
