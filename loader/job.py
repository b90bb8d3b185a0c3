"""The bulk load job: extract (``loader.extract``) -> transform (``loader.transform``, pure) ->
load (``loader.load``), with progress per stage and a final summary.

Stages (each one Spark action; rows/s printed as it ends):

1. ``validate``: read every input row, validate it with the core's ``subscription_from_dict``;
   rejects go to ``--rejects`` as ``file:line: reason`` (Parquet: ``file:row: reason``).
2. ``duplicates``: one record per id, the later row's (``loader.transform.repeated_hashes``:
   no shuffle unless some id hash repeats).
3. ``partition map``: the map already in Redis when it has ``shards`` parts and subscriptions
   are placed by it (the coordinator would keep it too), else (a cluster that started empty
   split the world evenly) ``PartitionMap.build`` from a seeded random sample of
   ``DEFAULT_SAMPLE`` subscription centres (collected in step 1, 16 bytes each), stored under
   ``{ns}:partition_map``.
4. ``load``: each subscription placed on every part its region's box meets, upserted into
   Redis from the executors (idempotent: an unchanged subscription is not written); the global
   keyword frequencies (the AP-Tree's keyword order) counted on the way.

The shards' indexes are then built by the coordinator from Redis, as on every start (see
``loader/README.md`` for the measurements behind that choice). Run it with ``geopubsub load``
or ``spark-submit loader/job.py INPUT... --redis-url URL`` (``--help`` lists the options).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script (spark-submit loader/job.py): the repo's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from geopubsub.client import add_client_flags, endpoint_from_flags, request_reload  # noqa: E402
from loader import extract, load, transform  # noqa: E402
from shard.errors import ValidationError  # noqa: E402
from shard.partition_map import DEFAULT_SAMPLE, PartitionMap  # noqa: E402

DEFAULT_MASTER = "local[*]"
MAP_SEED = 7
"""Seed of the partition map's sample, so that a re-run builds the same map."""
TOP_KEYWORDS = 10
"""Keywords shown in the summary."""
SPARK_DEFAULTS = {
    "spark.app.name": "geopubsub-load",
    "spark.driver.memory": "4g",
    "spark.sql.files.maxPartitionBytes": str(32 * 1024 * 1024),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
}
"""Session settings (``--conf`` / ``spark-submit`` ones win). 32 MB input splits give a 1M-line
file ~5 tasks, so two cores stay busy to the end of a stage; the driver (which runs the
executors in local mode) gets 4 GB for the persisted records of ~10M rows."""


@dataclass
class Stage:
    name: str
    rows: int
    seconds: float

    def line(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else float("inf")
        return f"{self.name:<14} {self.rows:>12,} rows {self.seconds:8.1f} s {rate:>12,.0f} rows/s"


@dataclass
class Summary:
    """What a load did. ``loaded`` = distinct valid subscriptions now in Redis as given."""

    read: int = 0
    loaded: int = 0
    rejected: int = 0
    duplicates: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    shards: int = 0
    per_shard: dict[int, int] = field(default_factory=dict)
    map_reused: bool = False
    keywords: int = 0
    top_keywords: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0
    stages: list[Stage] = field(default_factory=list)

    def text(self) -> str:
        per = ", ".join(f"{k}: {self.per_shard.get(k, 0):,}" for k in range(self.shards))
        top = ", ".join(f"{t} {n:,}" for t, n in self.top_keywords)
        return "\n".join(
            [
                f"loaded {self.loaded:,} subscriptions ({self.new:,} new, {self.changed:,} "
                f"changed, {self.unchanged:,} unchanged), rejected {self.rejected:,}, "
                f"{self.duplicates:,} duplicate ids (later row kept), {self.read:,} rows read",
                f"per shard ({self.shards}, map {'kept' if self.map_reused else 'built'}): {per}",
                f"keywords: {self.keywords:,} distinct; most frequent: {top}",
                f"seconds: {self.seconds:.1f}",
            ]
        )


def spark_session(master: str | None = None, conf: dict[str, str] | None = None):
    """A SparkSession with ``SPARK_DEFAULTS`` (an existing session is reused as it is). The
    Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for k, v in {**SPARK_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(k, v)
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(
    spark,
    inputs: Sequence[str],
    *,
    redis_url: str,
    namespace: str = "gps",
    shards: int | None = None,
    fmt: str | None = None,
    rejects: str | None = None,
    progress: Callable[[str], None] = print,
    stamp: float | None = None,
    ephemeral: bool = False,
) -> Summary:
    """Load subscription files into the cluster's Redis (see the module docstring).
    ``shards``: the cluster's shard count (None: the stored map's, else 2). ``stamp``: the
    ``created``/``updated`` time written (default: now)."""
    from pyspark import StorageLevel

    t0 = time.perf_counter()
    stamp = time.time() if stamp is None else stamp
    fmt = fmt or extract.guess_format(inputs)
    load.ping(redis_url)
    stored_map = load.read_partition_map(redis_url, namespace)
    stored_subs = load.count_subscriptions(redis_url, namespace)
    if shards is None:
        shards = len(stored_map) if stored_map is not None else 2
    if not isinstance(shards, int) or shards < 1:
        raise ValidationError("shards", shards, "must be an integer >= 1")
    summary = Summary(shards=shards)
    sc = spark.sparkContext

    def stage(name: str, rows: int, since: float) -> None:
        s = Stage(name, rows, time.perf_counter() - since)
        summary.stages.append(s)
        progress(s.line())

    progress(f"loading {', '.join(inputs)} ({fmt}) into {namespace} ({shards} shards)")

    # 1. validate
    t = time.perf_counter()
    rows = extract.read_rows(spark, inputs, fmt)
    records = rows.mapPartitions(
        partial(transform.validate_rows, payload=transform.PAYLOADS[fmt])
    ).persist(StorageLevel.MEMORY_AND_DISK)
    side = records.filter(lambda r: r[0] != transform.OK).collect()
    blocks = [r[1:] for r in side if r[0] == transform.BLOCK]
    bad = [r for r in side if r[0] == transform.BAD]
    summaries = [r for r in side if r[0] == transform.SUMMARY]
    hashes = np.concatenate([r[1] for r in summaries])
    centres = np.concatenate([r[2] for r in summaries])
    summary.read = sum(b[2] for b in blocks)
    summary.rejected = len(bad)
    stage("validate", summary.read, t)
    offsets = transform.line_offsets(blocks)
    bad.sort(key=lambda r: (r[1], offsets[(r[1], r[2])] + r[3]))
    _write_rejects(bad, offsets, rejects, progress)

    # 2. duplicate ids: only the records whose id hash repeats are compared
    t = time.perf_counter()
    repeated, once = transform.repeated_hashes(hashes)
    repeated_set = frozenset(repeated.tolist())
    winners: dict = {}
    if repeated_set:
        rep_b = sc.broadcast(repeated_set)
        winners = dict(
            records.filter(
                lambda r: r[0] == transform.OK and transform.id_hash(r[1]) in rep_b.value
            )
            .map(lambda r: (r[1], r[2]))
            .reduceByKey(transform.later)
            .collect()
        )
    summary.duplicates = int((~once).sum()) - len(winners)
    summary.loaded = len(hashes) - summary.duplicates
    stage("duplicates", int((~once).sum()), t)

    # 3. partition map
    t = time.perf_counter()
    if stored_map is not None and len(stored_map) == shards and stored_subs:
        pm, summary.map_reused = stored_map, True
        sampled = 0
    else:
        pool = centres[once]  # a repeated id's centres are left out: the map is a sample
        rng = np.random.default_rng(MAP_SEED)
        take = min(DEFAULT_SAMPLE, pool.shape[0])
        sample = pool[np.sort(rng.choice(pool.shape[0], take, replace=False))] if take else pool
        sampled = sample.shape[0]
        pm = PartitionMap.build(sample, shards)
        load.write_partition_map(redis_url, namespace, pm)
    stage("partition map", sampled, t)

    # 4. load
    t = time.perf_counter()
    pm_b = sc.broadcast(pm)
    final_b = sc.broadcast((repeated_set, winners))
    out = records.mapPartitions(
        lambda it: _load_partition(
            it, pm_b.value, *final_b.value, redis_url, namespace, stamp, ephemeral
        )
    ).collect()
    records.unpersist()
    counts = transform.merge_counts(c for c, _ in out)
    freq = transform.merge_counts(f for _, f in out)
    summary.new, summary.changed = counts.get("new", 0), counts.get("changed", 0)
    summary.unchanged = counts.get("unchanged", 0)
    summary.per_shard = {k: counts.get(("shard", k), 0) for k in range(shards)}
    summary.keywords = len(freq)
    summary.top_keywords = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_KEYWORDS]
    stage("load", summary.loaded, t)
    summary.seconds = time.perf_counter() - t0
    progress(summary.text())
    return summary


def _load_partition(records, pm, repeated, winners, url, ns, stamp, ephemeral):
    """One partition's final records, placed and upserted; yields (load counts, keyword counts)."""
    freq: dict[str, int] = {}

    def counted():
        for r in transform.final_records(records, repeated, winners):
            for term in r[5]:
                freq[term] = freq.get(term, 0) + 1
            yield r

    placed = transform.place(counted(), pm)
    for counts in load.upsert_subscriptions(placed, url, ns, stamp, ephemeral=ephemeral):
        yield counts, freq


def _write_rejects(bad, offsets, path: str | None, progress: Callable[[str], None]) -> None:
    lines = (transform.reject_line(r, offsets) for r in bad)
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        progress(f"rejects: {len(bad):,} written to {path}")
        return
    for i, line in enumerate(lines):
        if i == 10:
            progress(f"... {len(bad) - 10:,} more (give --rejects PATH to keep them all)")
            break
        progress(f"rejected {line}")


# ---- command line (spark-submit loader/job.py ...; geopubsub load adds the cluster options) ----
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs")
    p.add_argument("--format", choices=extract.FORMATS, help="default: from the extension")
    p.add_argument("--master", help=f"Spark master (default {DEFAULT_MASTER}, or spark-submit's)")
    p.add_argument("--rejects", metavar="PATH", help="write every rejected row here")
    p.add_argument("--namespace", default=None, help="Redis key prefix (default gps)")
    p.add_argument("--shards", type=int, help="the cluster's shards (default: the stored map's)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting")
    p.add_argument(
        "--ephemeral",
        action="store_true",
        help="the loaded subscriptions' deliveries skip the retention log (not resumable)",
    )


def spark_conf(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValidationError("--conf", pair, "must be KEY=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="loader/job.py", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--redis-url", required=True)
    p.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="a running coordinator on that Redis: ask it to reload its shards after the load",
    )
    add_client_flags(p)  # for the Reload of --coordinator: --ca --cert --key, --token
    args = p.parse_args(argv)
    endpoint = endpoint_from_flags(args.coordinator, args) if args.coordinator else None
    spark = spark_session(args.master, spark_conf(args.conf))  # None: spark-submit's, or local[*]
    try:
        run(
            spark,
            args.inputs,
            redis_url=args.redis_url,
            namespace=args.namespace or "gps",
            shards=args.shards,
            fmt=args.format,
            rejects=args.rejects,
            ephemeral=args.ephemeral,
        )
    finally:
        spark.stop()
    if endpoint is not None:
        if not request_reload(endpoint):
            print(f"{args.coordinator} has no Reload RPC: restart it to serve the load")
            return 1
        print(f"the coordinator at {args.coordinator} reloaded its shards and serves them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
