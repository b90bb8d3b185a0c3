"""``geopubsub load INPUT...``: the bulk loader (``loader.job``) on the command line.

Where the subscriptions go: ``--redis-url URL`` (with ``--namespace`` and ``--shards``), or
``--coordinator HOST:PORT`` of a cluster started by ``geopubsub up`` (its Redis, namespace and
shard count are read from ``<data-dir>/coordinator.toml``); without either, the local cluster of
``--data-dir``. After the load, a coordinator given (or found) is asked to rebuild its shards
from Redis with the admin RPC ``Reload``; a coordinator without it serves the loaded
subscriptions from its next start (``geopubsub down && geopubsub up``), as the command says.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from coordinator.settings import Settings
from deploy import spark_standalone
from deploy.local import CONFIG_FILE, read_manifest, sigterm_as_interrupt
from geopubsub.client import add_client_flags, request_reload
from geopubsub.tools.cluster_cli import client_access
from loader.job import add_arguments, run, spark_conf, spark_session
from shard.errors import GeoPubSubError, ValidationError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "load",
        help="bulk-load subscriptions (JSON Lines, Parquet, CSV) into the cluster with Spark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.add_argument("--coordinator", metavar="HOST:PORT", help="the running cluster to load into")
    p.add_argument("--redis-url", help="the cluster's Redis (instead of --coordinator)")
    add_client_flags(p)  # for the Reload: --ca --cert --key, --token (an admin's)
    p.add_argument(
        "--data-dir", default=".geopubsub", help="local cluster files (default .geopubsub)"
    )
    p.set_defaults(func=run_load)

    sp = sub.add_parser(
        "spark",
        help="run a Spark standalone master and worker(s) here for `load --master` (Ctrl-C stops)",
    )
    sp.add_argument("--workers", type=int, default=1, help="workers (default 1)")
    sp.add_argument("--cores", type=int, default=2, help="cores per worker (default 2)")
    sp.add_argument("--memory", default="2g", help="memory per worker (default 2g)")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sp.add_argument(
        "--data-dir",
        default=".geopubsub",
        help="its logs go to <data-dir>/spark (default .geopubsub)",
    )
    sp.set_defaults(func=run_spark)


def resolve(args: argparse.Namespace) -> tuple[str, str, int | None, str | None]:
    """(Redis URL, namespace, shards, coordinator target or None) from the flags and, for a
    local cluster, its ``cluster.json`` and ``coordinator.toml``."""
    manifest = read_manifest(args.data_dir)
    local_target = manifest["coordinator"]["target"] if manifest else None
    target = args.coordinator or (None if args.redis_url else local_target)
    if args.redis_url:
        return args.redis_url, args.namespace or "gps", args.shards, target
    if target is None:
        raise ValidationError(
            "--redis-url",
            None,
            f"give --redis-url or --coordinator (no cluster in {args.data_dir})",
        )
    if target != local_target:
        raise ValidationError(
            "--coordinator",
            target,
            f"is not the local cluster of {args.data_dir}; give its Redis with --redis-url",
        )
    settings = Settings.load(file=Path(manifest["data_dir"]) / CONFIG_FILE)
    if args.namespace and args.namespace != settings.namespace:
        raise ValidationError(
            "--namespace", args.namespace, f"the cluster uses {settings.namespace}"
        )
    if args.shards and args.shards != settings.shards:
        raise ValidationError("--shards", args.shards, f"the cluster has {settings.shards}")
    return manifest["redis"]["url"], settings.namespace, settings.shards, target


def run_load(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    redis_url, namespace, shards, target = resolve(args)
    ours = SparkSession.getActiveSession() is None  # else a caller's session: leave it running
    spark = spark_session(args.master, spark_conf(args.conf))
    try:
        run(
            spark,
            args.inputs,
            redis_url=redis_url,
            namespace=namespace,
            shards=shards,
            fmt=args.format,
            rejects=args.rejects,
            ephemeral=args.ephemeral,
            progress=lambda line: print(line, flush=True),
        )
    finally:
        if ours:
            spark.stop()
    if target is None:
        print("the cluster serves them from its next start (geopubsub up)")
    elif request_reload(client_access(args, target)):
        print(f"the coordinator at {target} reloaded its shards and serves them")
    else:
        print(
            f"the coordinator at {target} has no Reload RPC: it serves them after a restart "
            "(geopubsub down && geopubsub up)",
            file=sys.stderr,
        )
    return 0


def run_spark(args: argparse.Namespace) -> int:
    """A standalone master and workers in the foreground, until Ctrl-C or SIGTERM."""
    with sigterm_as_interrupt():
        return _spark_foreground(args)


def _spark_foreground(args: argparse.Namespace) -> int:
    try:
        cluster = spark_standalone.start(
            Path(args.data_dir) / "spark",
            workers=args.workers,
            cores=args.cores,
            memory=args.memory,
            host=args.host,
        )
    except GeoPubSubError as exc:
        print(f"geopubsub spark: {exc}", file=sys.stderr)
        return 2
    print(
        f"Spark master {cluster.url} with {args.workers} worker(s) of {args.cores} cores; "
        f"status {cluster.webui}\n  load with: geopubsub load --master {cluster.url} INPUT...\n"
        "  Ctrl-C (or SIGTERM) stops it",
        flush=True,
    )
    try:
        while all(p.poll() is None for p in cluster.procs):
            time.sleep(1.0)
        print("geopubsub spark: a Spark process exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()
