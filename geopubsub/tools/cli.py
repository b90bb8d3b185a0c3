"""The ``geopubsub`` console script: one argparse tree, each sub-command registered by its module."""

from __future__ import annotations

import argparse
import sys

from shard.errors import GeoPubSubError


def build_parser() -> argparse.ArgumentParser:
    from geopubsub.tools import bench, cluster_cli, demo, gen, load_cli, register, token_cli

    parser = argparse.ArgumentParser(prog="geopubsub", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen.register(sub)
    bench.register(sub)
    cluster_cli.register(sub)
    register.register(sub)
    demo.register(sub)
    load_cli.register(sub)
    token_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import grpc

    parser = build_parser()
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
