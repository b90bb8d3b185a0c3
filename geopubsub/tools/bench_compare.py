"""``geopubsub bench compare``: indexes side by side on the same subscriptions and messages.

Every chosen index (``--index``, default all of ``shard.indexes`` but brute force) is built in
this one process from the same parsed subscriptions, one after another (each freed before the
next), and measured the same way:

* **build**: seconds to index the loaded columns (``rebuild``; parsing and the columns are
  shared work and not counted), median of ``--repeat``, after a warm-up on a few hundred
  subscriptions (``warm``: numba compiles a kernel at its first call, which no figure counts);
* **memory**: bytes of every array and container the built index holds, its subscription
  columns included (``deep_nbytes``: a walk over the object, each array counted once);
* **µs per message**: every message matched in batches of 1,024 (encode, compiled match, ids),
  after a warm-up pass (numba compiles on first use), median of ``--repeat`` passes;
* **subscribe / unsubscribe**: µs each for ``--updates`` subscriptions of the file added one by
  one under new ids, then removed (the index holds the same set afterwards), after one untimed
  subscribe and unsubscribe (the first regrows the columns a bulk load sized exactly: a
  doubling amortised over as many subscribes as the index holds, not over these); ``—`` for a
  static index (``invlist``);
* **exact**: the pairs of the first ``--check-sample`` messages equal brute force's, pair for
  pair (brute force runs on that sample and its µs per message is reported beside).

``--sweep`` repeats this over one parameter of the papers' figures: ``subs`` (the first N
subscriptions, ``--values 100000,300000,1000000``), ``msg-length`` (``short``: each message
padded or cut to 6-20 terms, ``long``: 100-1,000, the added terms drawn from the subscriptions'
terms by their frequency), ``region`` (each message a square of side V degrees around its
centre; 0: points), ``keywords`` (each subscription's clauses cut to their first K terms).
``--choice`` also times every index on chunks of 64 messages and reports what an oracle choosing
the fastest index per chunk would take against the best single index (the gain an LFilter-like
per-message choice could have at most).

The report: a Markdown table on stdout (``--json``: the rows as JSON) and, with ``--out-dir``,
``report.md`` plus PNG plots (``us_per_msg.png`` over the sweep, ``costs.png``: build, memory,
subscribe). The last line names the index to pick for this workload: the fastest exact one.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from geopubsub.tools.bench_warmup import warm_up
from shard.aptree import APTree
from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.indexes import INDEX_NAMES, RIVAL_NAMES, index_class
from shard.model import Message, Point, Rect, Subscription
from shard.residual import StaticChecker
from shard.workload import read_messages, read_subscriptions, without_topk

MATCH_BATCH = 1024
CHOICE_CHUNK = 64
WARM_SUBS = 300
DEFAULT_INDEXES = ("aptree", "invlist", *RIVAL_NAMES)
SWEEPS = ("none", "subs", "msg-length", "region", "keywords")
DEFAULT_VALUES = {
    "subs": "100000,300000,1000000",
    "msg-length": "short,long",
    "region": "0,0.01,0.1,1",
    "keywords": "1,2,3,5",
    "none": "-",
}
LENGTHS = {"short": (6, 20), "long": (100, 1000)}


def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "compare",
        help="run several indexes on the same subscriptions and messages; report and plots",
    )
    p.add_argument("--subs", required=True, type=Path, help="subscriptions, JSON Lines")
    p.add_argument("--msgs", required=True, type=Path, help="messages, JSON Lines")
    p.add_argument(
        "--index",
        default=",".join(DEFAULT_INDEXES),
        help=f"comma-separated indexes (default: all but brute): {', '.join(INDEX_NAMES)}; "
        "options after @, e.g. rt+@strategy=idf",
    )
    p.add_argument("--sweep", choices=SWEEPS, default="none", help="the parameter to vary")
    p.add_argument("--values", help="the sweep's values, comma-separated (defaults in --help)")
    p.add_argument("--sample", type=int, default=0, help="only the first N messages (0: all)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes (median)")
    p.add_argument("--updates", type=int, default=2000, help="subscribes/unsubscribes timed")
    p.add_argument(
        "--check-sample", type=int, default=200, help="messages checked against brute force"
    )
    p.add_argument("--choice", action="store_true", help="measure a per-chunk oracle choice")
    p.add_argument("--seed", type=int, default=1, help="the sweeps' random choices")
    p.add_argument("--out-dir", type=Path, help="write report.md and the PNG plots here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


@dataclass
class Row:
    index: str
    setting: str
    n_subs: int
    n_msgs: int
    build_s: float = 0.0
    memory_mb: float | None = 0.0
    us_per_msg: float = 0.0
    subscribe_us: float | None = None
    unsubscribe_us: float | None = None
    pairs: int = 0
    exact: bool | None = None
    chunk_s: list[float] = field(default_factory=list, repr=False)


# ---- sizes -------------------------------------------------------------------------------------
def deep_nbytes(obj: Any) -> int:
    """Bytes held by ``obj``: every numpy array reachable through attributes, slots, tuples,
    lists and dicts counted once (a view by its base), plus the containers and strings.

    >>> deep_nbytes({"a": np.zeros(10)}) >= 80
    True
    """
    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if id(x) in seen or x is None or isinstance(x, int | float | bool | type):
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen or base is x:
                seen.add(id(base))
                total += base.nbytes if base.dtype != object else 8 * base.size
                if base.dtype == object:
                    stack.extend(v for v in base.ravel().tolist() if isinstance(v, str))
            continue
        total += sys.getsizeof(x)
        if isinstance(x, str | bytes):
            continue
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list | tuple | set):
            stack.extend(x)
        else:
            if hasattr(x, "__dict__"):
                stack.extend(vars(x).values())
            for name in getattr(type(x), "__slots__", ()):
                stack.append(getattr(x, name, None))
    return total


# ---- workloads of the sweeps -------------------------------------------------------------------
def _values(args) -> list[str]:
    raw = args.values or DEFAULT_VALUES[args.sweep]
    vals = [v.strip() for v in raw.split(",") if v.strip()]
    if not vals:
        raise ValidationError("--values", raw, "must name at least one value")
    for v in vals:
        if args.sweep == "msg-length" and v not in LENGTHS:
            raise ValidationError("--values", v, "must be short or long")
        if args.sweep in ("subs", "keywords") and (not v.isdigit() or int(v) < 1):
            raise ValidationError("--values", v, "must be an integer >= 1")
        if args.sweep == "region":
            try:
                ok = 0 <= float(v) <= 180
            except ValueError:
                ok = False
            if not ok:
                raise ValidationError("--values", v, "must be a side in degrees in [0, 180]")
    return vals


def _centre(m: Message) -> tuple[float, float]:
    loc = m.location
    if isinstance(loc, Point):
        return loc.lon, loc.lat
    return (loc.min_lon + loc.max_lon) / 2, (loc.min_lat + loc.max_lat) / 2


def square_messages(msgs: Sequence[Message], side: float) -> list[Message]:
    """Each message at its centre: a point (``side`` 0) or a square of ``side`` degrees,
    clamped to the world."""
    out = []
    for m in msgs:
        x, y = _centre(m)
        if side <= 0:
            loc: Point | Rect = Point(x, y)
        else:
            h = side / 2
            loc = Rect(max(x - h, -180), max(y - h, -90), min(x + h, 180), min(y + h, 90))
        out.append(Message(m.id, m.terms, loc))
    return out


def sized_messages(
    msgs: Sequence[Message], subs: Sequence[Subscription], length: str, seed: int
) -> list[Message]:
    """Each message padded (terms drawn from the subscriptions' terms, by frequency) or cut to
    a length drawn uniformly from ``LENGTHS[length]``."""
    lo, hi = LENGTHS[length]
    rng = random.Random(seed)
    pool = [t for s in subs[:200_000] for c in s.clauses for t in c] or ["x"]
    out = []
    for m in msgs:
        n = rng.randint(lo, hi)
        terms = list(dict.fromkeys(m.terms))[:n]
        have = set(terms)
        for _ in range(20 * n):
            if len(terms) >= n:
                break
            t = rng.choice(pool)
            if t not in have:
                have.add(t)
                terms.append(t)
        out.append(Message(m.id, tuple(terms), m.location))
    return out


def cut_keywords(subs: Sequence[Subscription], k: int) -> list[Subscription]:
    """Each subscription's clauses cut to their first ``k`` terms (repeated clauses merged)."""
    out = []
    for s in subs:
        clauses = tuple(dict.fromkeys(tuple(c[:k]) for c in s.clauses))
        out.append(Subscription(s.id, clauses, s.region, moving=s.moving))
    return out


# ---- one index ---------------------------------------------------------------------------------
def index_options(items: list[str]) -> dict[str, int | float | str]:
    """``--index-option KEY=VALUE`` items as keyword options: a value that reads as an integer
    or a float is one, else a string.

    >>> index_options(["strategy=idf", "capacity=16", "share=0.5"])
    {'strategy': 'idf', 'capacity': 16, 'share': 0.5}
    """
    out: dict[str, int | float | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValidationError("--index-option", item, "must be KEY=VALUE")
        value: int | float | str = raw
        for kind in (int, float):
            try:
                value = kind(raw)
                break
            except ValueError:
                continue
        out[key] = value
    return out


def _empty(spec: str):
    """A new empty index from a spec: a name of ``shard.indexes``, optionally with options
    ``NAME@KEY=VALUE@KEY=VALUE`` (e.g. ``rt+@strategy=idf``; values read as in ``bench match
    --index-option``)."""
    name, *items = spec.split("@")
    if name == "aptree":
        return APTree(**index_options(items))
    return index_class(name)(**index_options(items))


def _match_all(index, msgs: Sequence[Message], checker: StaticChecker) -> float:
    """Seconds to match every message in batches (encode, compiled match, the conditions the
    index does not check, ids)."""
    t0 = time.perf_counter()
    for i in range(0, len(msgs), MATCH_BATCH):
        batch = msgs[i : i + MATCH_BATCH]
        encoded = index.encode(batch)
        out_m, out_s = index.match_encoded(encoded)
        out_m, out_s = checker.filter(index.store, batch, out_m, out_s, encoded)
        index.ids_of(len(batch), out_m, out_s)
    return time.perf_counter() - t0


def _pairs(index, msgs: Sequence[Message], checker: StaticChecker) -> list[list[str]]:
    out: list[list[str]] = []
    for i in range(0, len(msgs), MATCH_BATCH):
        out += checker.match(index, msgs[i : i + MATCH_BATCH])
    return out


def warm(spec: str, subs: Sequence[Subscription], msgs: Sequence[Message]) -> None:
    """Compile (or load from numba's cache) the index's kernels before anything is timed: a
    throwaway index over a few hundred of the subscriptions, built, matched, changed. Without it
    the first build or the first subscribe would carry the compilation (seconds)."""
    index = _empty(spec)
    checker = StaticChecker()
    index.store.add_bulk(checker.cores(subs[:WARM_SUBS]))
    checker.bind(index.store)
    index.rebuild()
    checker.match(index, list(msgs[:20]))
    if not spec.startswith("invlist"):
        for i, s in enumerate(subs[:3]):
            index.subscribe(Subscription(f"{s.id}~w{i}", s.clauses, s.region))
        for i, s in enumerate(subs[:3]):
            index.unsubscribe(f"{s.id}~w{i}")
        index.match_batch(list(msgs[:20]))


def measure(
    name: str,
    setting: str,
    subs: Sequence[Subscription],
    msgs: Sequence[Message],
    expected: list[list[str]],
    args,
) -> Row:
    """Build ``name`` over ``subs`` and measure it (see the module docstring)."""
    row = Row(name, setting, 0, len(msgs))
    warm(name, subs, msgs)
    builds, passes = [], []
    index = None
    for _ in range(max(1, args.repeat)):
        del index
        gc.collect()
        index = _empty(name)
        checker = StaticChecker()  # NOT, polygons, predicates, ranked: checked on its pairs
        index.store.add_bulk(checker.cores(subs))
        checker.bind(index.store)
        t0 = time.perf_counter()
        index.rebuild()
        builds.append(time.perf_counter() - t0)
    row.n_subs = len(index)
    row.build_s = statistics.median(builds)
    row.memory_mb = deep_nbytes(index) / 2**20
    got = _pairs(index, msgs[: len(expected)], checker)
    row.exact = all(sorted(a) == sorted(b) for a, b in zip(got, expected, strict=True))
    _match_all(index, msgs, checker)  # warm: compiled kernels, stamps sized
    for _ in range(max(1, args.repeat)):
        passes.append(_match_all(index, msgs, checker))
    row.pairs = sum(len(ids) for ids in _pairs(index, msgs, checker))
    row.us_per_msg = statistics.median(passes) / max(len(msgs), 1) * 1e6
    if args.choice:
        for i in range(0, len(msgs), CHOICE_CHUNK):
            chunk = msgs[i : i + CHOICE_CHUNK]
            t0 = time.perf_counter()
            index.match_encoded(index.encode(chunk))
            row.chunk_s.append(time.perf_counter() - t0)
    if not name.startswith("invlist") and args.updates > 0 and subs:
        rng = random.Random(args.seed)
        picked = [subs[rng.randrange(len(subs))] for _ in range(args.updates)]
        fresh = [Subscription(f"{s.id}~u{i}", s.clauses, s.region) for i, s in enumerate(picked)]
        # untimed: the first subscribe after a bulk load regrows the store's columns, which the
        # load sized exactly (doubling, ~0.5 s at 1M: amortised over the next million, not these)
        first = Subscription(f"{picked[0].id}~first", picked[0].clauses, picked[0].region)
        index.subscribe(first)
        index.unsubscribe(first.id)
        t0 = time.perf_counter()
        for s in fresh:
            index.subscribe(s)
        row.subscribe_us = (time.perf_counter() - t0) / len(fresh) * 1e6
        t0 = time.perf_counter()
        for s in fresh:
            index.unsubscribe(s.id)
        row.unsubscribe_us = (time.perf_counter() - t0) / len(fresh) * 1e6
    del index
    gc.collect()
    return row


def brute_row(setting: str, subs, msgs, sample: int) -> tuple[Row, list[list[str]]]:
    """Brute force on the first ``sample`` messages: the expected pairs and its own figures."""
    t0 = time.perf_counter()
    brute = BruteMatcher(subs)
    brute.refresh(force=True)
    row = Row("brute", setting, len(brute), min(sample, len(msgs)))
    row.build_s = time.perf_counter() - t0
    row.memory_mb = None
    t0 = time.perf_counter()
    expected = brute.match_batch(list(msgs[:sample]))
    row.us_per_msg = (time.perf_counter() - t0) / max(len(expected), 1) * 1e6
    row.pairs = sum(map(len, expected))
    row.exact = True
    return row, expected


# ---- the run -----------------------------------------------------------------------------------
def _names(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for n in names:
        base = n.split("@")[0]
        if base not in INDEX_NAMES or base == "brute":
            raise ValidationError(
                "--index", n, f"must be among {', '.join(INDEX_NAMES)} (brute runs on the sample)"
            )
    if not names:
        raise ValidationError("--index", raw, "must name at least one index")
    return names


def _workloads(args, subs, msgs):
    """(setting, subscriptions, messages) of each value of the sweep."""
    for v in _values(args):
        if args.sweep == "subs":
            yield v, subs[: int(v)], msgs
        elif args.sweep == "msg-length":
            yield v, subs, sized_messages(msgs, subs, v, args.seed)
        elif args.sweep == "region":
            yield v, subs, square_messages(msgs, float(v))
        elif args.sweep == "keywords":
            yield v, cut_keywords(subs, int(v)), msgs
        else:
            yield "-", subs, msgs


def run(args) -> int:
    names = _names(args.index)
    for flag in ("repeat", "check_sample"):
        if getattr(args, flag) < 1:
            raise ValidationError(
                f"--{flag.replace('_', '-')}", getattr(args, flag), "must be >= 1"
            )
    for label, path in (("--subs", args.subs), ("--msgs", args.msgs)):
        if not path.exists():
            raise ValidationError(label, str(path), "no such file")
    warm_up()
    subs = list(without_topk(read_subscriptions(args.subs), [], strict=True))
    msgs = list(read_messages(args.msgs))
    if args.sample:
        msgs = msgs[: args.sample]
    rows: list[Row] = []
    choice: list[dict] = []
    workloads = list(_workloads(args, subs, msgs))
    bar = tqdm(total=len(workloads) * (len(names) + 1), unit="index", file=sys.stderr)
    for setting, w_subs, w_msgs in workloads:
        bar.set_description(f"{args.sweep}={setting} brute")
        brow, expected = brute_row(setting, w_subs, w_msgs, args.check_sample)
        rows.append(brow)
        bar.update()
        here: list[Row] = []
        for name in names:
            bar.set_description(f"{args.sweep}={setting} {name}")
            here.append(measure(name, setting, w_subs, w_msgs, expected, args))
            bar.update()
        rows += here
        if args.choice:
            choice.append(per_chunk_choice(setting, here))
    bar.close()
    report = render(args, rows, choice)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        plot(args, rows, args.out_dir)
        (args.out_dir / "report.md").write_text(report, encoding="utf-8")
    if args.json:
        out = {"rows": [_public(r) for r in rows], "choice": choice, "pick": pick(rows)}
        print(json.dumps(out, indent=1))
    else:
        print(report)
    return 0 if all(r.exact for r in rows) else 1


def _public(r: Row) -> dict:
    d = asdict(r)
    d.pop("chunk_s")
    for k in ("build_s", "memory_mb", "us_per_msg", "subscribe_us", "unsubscribe_us"):
        if d[k] is not None:
            d[k] = round(d[k], 3)
    return d


def per_chunk_choice(setting: str, rows: list[Row]) -> dict:
    """What the fastest index per chunk of messages (an oracle) would take, against the best
    single index, over the same chunks."""
    timed = [r for r in rows if r.chunk_s and r.exact]
    if not timed:
        return {"setting": setting}
    n = sum(r.n_msgs for r in timed[:1]) or 1
    best = min(timed, key=lambda r: sum(r.chunk_s))
    per_chunk = np.array([r.chunk_s for r in timed])
    oracle = float(per_chunk.min(axis=0).sum())
    wins = np.bincount(per_chunk.argmin(axis=0), minlength=len(timed))
    return {
        "setting": setting,
        "best_single": best.index,
        "best_single_us": round(sum(best.chunk_s) / n * 1e6, 2),
        "oracle_choice_us": round(oracle / n * 1e6, 2),
        "gain_pct": round((1 - oracle / sum(best.chunk_s)) * 100, 1),
        "chunks_won": {r.index: int(w) for r, w in zip(timed, wins, strict=True) if w},
    }


def pick(rows: list[Row]) -> dict:
    """The fastest exact index at the last setting (the largest of a sweep by subscriptions)."""
    last = rows[-1].setting if rows else "-"
    cands = [r for r in rows if r.setting == last and r.exact and r.index != "brute"]
    if not cands:
        return {}
    best = min(cands, key=lambda r: r.us_per_msg)
    dyn = [r for r in cands if r.subscribe_us is not None]
    best_dyn = min(dyn, key=lambda r: r.us_per_msg) if dyn else None
    return {
        "index": best.index,
        "us_per_msg": round(best.us_per_msg, 2),
        "dynamic": best_dyn.index if best_dyn else None,
    }


def _fmt(v, digits=2) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**NO**"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def render(args, rows: list[Row], choice: list[dict]) -> str:
    lines = [
        f"# bench compare: {_workload_name(args)} × {args.msgs.parent.name}/{args.msgs.name}",
        "",
        f"Sweep: {args.sweep}. Medians of {args.repeat} builds and matching passes; "
        f"subscribe / unsubscribe over {args.updates} subscriptions; exact = pairs equal to brute "
        f"force's on the first {args.check_sample} messages (brute force's µs per message on "
        "that sample).",
        "",
        "| setting | index | subscriptions | messages | build s | memory MB | µs / msg "
        "| subscribe µs | unsubscribe µs | pairs | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.setting} | {r.index} | {r.n_subs:,} | {r.n_msgs:,} | {_fmt(r.build_s)} | "
            f"{_fmt(r.memory_mb, 1)} | {_fmt(r.us_per_msg)} | {_fmt(r.subscribe_us, 1)} | "
            f"{_fmt(r.unsubscribe_us, 1)} | {r.pairs:,} | {_fmt(r.exact)} |"
        )
    if choice:
        lines += [
            "",
            "Per-chunk choice (an oracle picking the fastest index for each chunk of "
            f"{CHOICE_CHUNK} messages):",
            "",
        ]
        for c in choice:
            if "best_single" in c:
                lines.append(
                    f"- {c['setting']}: best single {c['best_single']} {c['best_single_us']} "
                    f"µs/msg, oracle choice {c['oracle_choice_us']} µs/msg "
                    f"({c['gain_pct']} % less); chunks won: {c['chunks_won']}"
                )
    p = pick(rows)
    if p:
        dyn = f"; with subscribes and unsubscribes: {p['dynamic']}" if p["dynamic"] else ""
        lines += ["", f"Pick: **{p['index']}** ({p['us_per_msg']} µs per message){dyn}."]
    return "\n".join(lines) + "\n"


def _workload_name(args) -> str:
    """The subscription file with its folder (``pl1m/subs.jsonl``): the folder names a workload."""
    return f"{args.subs.parent.name}/{args.subs.name}"


def plot(args, rows: list[Row], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.index for r in rows))
    settings = list(dict.fromkeys(r.setting for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = plt.get_cmap("tab20").colors
    if len(settings) == 1:  # one workload: the indexes as bars, fastest on top
        ranked = sorted(rows, key=lambda r: -r.us_per_msg)
        ax.barh([r.index for r in ranked], [r.us_per_msg for r in ranked], color=colours[0])
        for y, r in enumerate(ranked):
            ax.text(r.us_per_msg, y, f" {r.us_per_msg:,.1f}", va="center", fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("µs per message (log)")
        ax.set_title(f"{_workload_name(args)}: matching")
        ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "us_per_msg.png", dpi=110)
        plt.close(fig)
        return _plot_costs(args, rows, settings, out_dir)
    for i, name in enumerate(names):
        pts = [
            (s, r.us_per_msg) for s in settings for r in rows if r.index == name and r.setting == s
        ]
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="osD^v<>ph*"[i % 10],
                color=colours[(2 * i) % 20 + (i // 10) % 2],
                label=name,
            )
    ax.set_yscale("log")
    ax.set_xlabel(args.sweep if args.sweep != "none" else "workload")
    ax.set_ylabel("µs per message (log)")
    ax.set_title(f"{_workload_name(args)}: matching")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "us_per_msg.png", dpi=110)
    plt.close(fig)
    _plot_costs(args, rows, settings, out_dir)


def _plot_costs(args, rows: list[Row], settings: list[str], out_dir: Path) -> None:
    import matplotlib.pyplot as plt

    last = [r for r in rows if r.setting == settings[-1] and r.index != "brute"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, (key, label) in zip(
        axes,
        (("build_s", "build s"), ("memory_mb", "memory MB"), ("subscribe_us", "subscribe µs")),
        strict=True,
    ):
        vals = [getattr(r, key) or 0.0 for r in last]
        ax.bar([r.index for r in last], vals)
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.suptitle(f"{_workload_name(args)}, {last[0].n_subs:,} subscriptions" if last else "")
    fig.tight_layout()
    fig.savefig(out_dir / "costs.png", dpi=110)
    plt.close(fig)
