"""``geopubsub token create|list|revoke``: the bearer tokens of a cluster with auth on.

They are written to the cluster's Redis directly (whoever can reach it runs the cluster): the
local cluster's from ``<data-dir>/cluster.json``, another's with ``--redis-url``. A new token is
printed once, on standard output; Redis keeps only its hash (``coordinator.tokens``).

    geopubsub token create --role admin
    geopubsub token create --role subscriber --owner app1/ --expires 86400
    geopubsub token list
    geopubsub token revoke 3f9a0c1d2e4b
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import redis
from redis.exceptions import RedisError

from coordinator import tokens
from coordinator.settings import Settings
from coordinator.tokens import ROLES
from deploy.local import CONFIG_FILE, read_manifest
from shard.errors import ValidationError


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir", default=".geopubsub", help="local cluster files (default .geopubsub)"
    )
    common.add_argument("--redis-url", help="the cluster's Redis (instead of the local cluster)")
    common.add_argument("--namespace", help="its key prefix (with --redis-url; default gps)")
    common.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("token", help="bearer tokens of a cluster with auth on")
    verbs = p.add_subparsers(dest="verb", required=True)
    c = verbs.add_parser("create", parents=[common], help="make a token and print it once")
    c.add_argument("--role", required=True, choices=ROLES)
    c.add_argument("--owner", help="subscriber: the prefix of the subscription ids it owns")
    c.add_argument("--expires", type=float, help="seconds until it expires (default: never)")
    c.set_defaults(func=run_create)
    ls = verbs.add_parser("list", parents=[common], help="the tokens (never their secrets)")
    ls.set_defaults(func=run_list)
    rv = verbs.add_parser("revoke", parents=[common], help="refuse a token from now on")
    rv.add_argument("id", help="the token's id (geopubsub token list)")
    rv.set_defaults(func=run_revoke)


def _redis(args: argparse.Namespace):
    """(a redis-py client, namespace) of ``--redis-url`` or the local cluster."""
    if args.redis_url:
        url, ns = args.redis_url, args.namespace or "gps"
    else:
        manifest = read_manifest(args.data_dir)
        if manifest is None:
            raise ValidationError(
                "--redis-url", None, f"give the cluster's Redis (no cluster in {args.data_dir})"
            )
        url = manifest["redis"]["url"]
        ns = Settings.load(file=Path(manifest["data_dir"]) / CONFIG_FILE).namespace
        if args.namespace and args.namespace != ns:
            raise ValidationError("--namespace", args.namespace, f"the cluster uses {ns}")
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10), ns


def _redis_errors(run):
    """A Redis that cannot be reached: one error line (its URL without the password), exit 1."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (RedisError, OSError) as exc:
            print(f"geopubsub: error: the cluster's Redis: {exc}", file=sys.stderr)
            return 1

    return wrapper


def _when(t: float | None) -> str:
    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@_redis_errors
def run_create(args: argparse.Namespace) -> int:
    tokens.check_request(args.role, args.owner, args.expires)
    r, ns = _redis(args)
    with r:
        text, tok = tokens.create(r, ns, args.role, args.owner, args.expires, time.time())
    if args.json:
        print(json.dumps({**tok.public(), "token": text}))
    else:
        owner = f" of ids starting with {tok.owner!r}" if tok.owner else ""
        print(
            f"token {tok.id}: {tok.role}{owner}, expires {_when(tok.public()['expires'])}; "
            "shown once, keep it secret:",
            file=sys.stderr,
        )
        print(text)
    return 0


@_redis_errors
def run_list(args: argparse.Namespace) -> int:
    r, ns = _redis(args)
    with r:
        toks = tokens.list_tokens(r, ns)
    if args.json:
        print(json.dumps([t.public() for t in toks]))
        return 0
    print(f"{'id':14s}{'role':12s}{'owner':20s}{'created':21s}expires")
    for t in toks:
        p = t.public()
        print(
            f"{t.id:14s}{t.role:12s}{t.owner or '-':20s}{_when(t.created):21s}{_when(p['expires'])}"
        )
    return 0


@_redis_errors
def run_revoke(args: argparse.Namespace) -> int:
    r, ns = _redis(args)
    with r:
        gone = tokens.revoke(r, ns, args.id)
    if not gone:
        print(f"geopubsub: error: no token {args.id!r}", file=sys.stderr)
        return 1
    print(f"token {args.id} revoked", file=sys.stderr)
    return 0
