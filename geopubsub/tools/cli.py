"""The ``geopubsub`` console script: one argparse tree, each sub-command registered by its module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import grpc

from shard.errors import GeoPubSubError

COMMANDS: dict[str, tuple[str, str]] = {
    "gen": ("geopubsub.tools.gen", "write a synthetic workload (subs.jsonl, msgs.jsonl)"),
    "gen-topk": (
        "geopubsub.tools.gen_topk",
        "write a top-k workload (paper 001's BE-Gen settings): subs.jsonl, events.jsonl",
    ),
    "bench": ("geopubsub.tools.bench", "benchmarks (see docs/BENCHMARKS.md)"),
    "up": ("geopubsub.tools.cluster_cli", "start the local cluster (Redis, Ray, coordinator)"),
    "down": ("geopubsub.tools.cluster_cli", "stop the local cluster"),
    "status": ("geopubsub.tools.cluster_cli", "is the cluster running and serving"),
    "subscribe": ("geopubsub.tools.cluster_cli", "create or replace a subscription"),
    "unsubscribe": ("geopubsub.tools.cluster_cli", "remove a subscription"),
    "publish": ("geopubsub.tools.cluster_cli", "publish one message"),
    "move": ("geopubsub.tools.cluster_cli", "move a moving subscription"),
    "rebalance": (
        "geopubsub.tools.cluster_cli",
        "a new partition map for N shards (adding or removing shards), every shard rebuilt",
    ),
    "stats": ("geopubsub.tools.cluster_cli", "cluster figures"),
    "register": (
        "geopubsub.tools.register",
        "subscribe every subscription of a workload file (many calls in flight)",
    ),
    "demo": (
        "geopubsub.tools.demo",
        "start a local cluster, register a workload, publish and move with live clients, report, "
        "stop (make run)",
    ),
    "load": (
        "geopubsub.tools.load_cli",
        "bulk-load subscriptions (JSON Lines, Parquet, CSV) into the cluster with Spark",
    ),
    "spark": (
        "geopubsub.tools.load_cli",
        "run a Spark standalone master and worker(s) here for `load --master` (Ctrl-C stops)",
    ),
    "token": ("geopubsub.tools.token_cli", "bearer tokens of a cluster with auth on"),
    "map": (
        "geopubsub.tools.livemap.server",
        "the live map: a web page of the cluster's subscriptions, messages and movers",
    ),
}
"""Every command, in the order of ``geopubsub --help``: the module whose ``register(sub)`` adds
it (the commands of one module stand together, in the order it adds them) and its help line
(the one the module gives it: a test compares them)."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command. Given ``argv``, only the module of the command it names is
    imported; every other command is a stub with its help line, so that ``geopubsub --help``
    imports no command's module."""
    wanted = None
    if argv is not None:
        named = next((a for a in argv if not a.startswith("-")), None)
        wanted = COMMANDS[named][0] if named in COMMANDS else ""
    parser = argparse.ArgumentParser(prog="geopubsub", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    registered: set[str] = set()
    for name, (module, help_line) in COMMANDS.items():
        if wanted is not None and module != wanted:
            sub.add_parser(name, help=help_line)
        elif module not in registered:
            importlib.import_module(module).register(sub)
            registered.add(module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GeoPubSubError as exc:
        print(f"geopubsub: error: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:  # a call the command could not do without (a bench's, say)
        code = exc.code()
        print(f"geopubsub: error: {code.name}: {exc.details()}", file=sys.stderr)
        return 2 if code is grpc.StatusCode.INVALID_ARGUMENT else 1


if __name__ == "__main__":
    sys.exit(main())
