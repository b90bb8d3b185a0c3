"""The cluster commands of ``geopubsub``: ``up`` / ``down`` / ``status`` run the local cluster
(``deploy.local``); ``subscribe``, ``unsubscribe``, ``publish``, ``move`` and ``stats`` talk to a
coordinator through ``geopubsub.client``.

The Settings are built here, once, from ``--config``, the ``GEOPUBSUB_*`` environment and the
flags. Client commands dial ``--target``, else the address in ``<data_dir>/cluster.json``, else
127.0.0.1:50051. Exit codes: 0 ok; 2 bad input (argparse, a ValidationError, INVALID_ARGUMENT,
the field and value named); 1 anything else (not reachable, not found, not serving).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from coordinator.settings import Settings
from deploy import local, supervise
from deploy.local import manifest_target, manifest_tls
from geopubsub.client import (
    DEFAULT_TARGET,
    Endpoint,
    GeoPubSubClient,
    Tls,
    add_client_flags,
    describe_stats,
)
from shard.errors import GeoPubSubError, ValidationError
from shard.indexes import RIVAL_NAMES
from shard.partition_map import MAX_PARTS

SETTING_FLAGS = (
    "shards",
    "host",
    "port",
    "redis_url",
    "ray_address",
    "data_dir",
    "metrics_port",
    "metrics_host",
    "index",
    "tls",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "insecure",
    "auth",
    "ca",
    "client_cert",
    "client_key",
    "token",
)
"""Flags that are Settings fields (None when not given, so that file and environment apply)."""


def common_parent() -> argparse.ArgumentParser:
    """The flags every cluster command takes: ``--config``, ``--data-dir``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", type=Path, help="TOML settings file (see coordinator/settings.py)"
    )
    common.add_argument("--data-dir", dest="data_dir", help="cluster files (default .geopubsub)")
    return common


def remote_parent() -> argparse.ArgumentParser:
    """The flags of a command that talks to a coordinator: ``common_parent()`` + ``--target``
    (resolved by ``client_target``) and the client's TLS files (``client_tls``)."""
    remote = argparse.ArgumentParser(add_help=False, parents=[common_parent()])
    remote.add_argument(
        "--target",
        help="coordinator HOST:PORT (default: from <data-dir>/cluster.json, else 127.0.0.1:50051)",
    )
    add_client_flags(remote)
    return remote


def register(sub: argparse._SubParsersAction) -> None:
    common = common_parent()
    remote = remote_parent()

    up = sub.add_parser(
        "up", parents=[common], help="start the local cluster (Redis, Ray, coordinator)"
    )
    up.add_argument("--shards", type=int, help="shard actors (default 2)")
    up.add_argument("--host", help="coordinator bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, help="coordinator port (default 50051; 0: any free one)")
    up.add_argument("--redis-url", dest="redis_url", help="use this Redis instead of a private one")
    up.add_argument(
        "--ray-address", dest="ray_address", help="join this Ray cluster instead of a local Ray"
    )
    up.add_argument(
        "--index",
        help="the shards' index: aptree (default) or a rival to measure the cluster on: "
        + ", ".join(RIVAL_NAMES),
    )
    up.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        help="serve Prometheus metrics on this port (http(s)://HOST:PORT/metrics; default off)",
    )
    up.add_argument(
        "--metrics-host",
        dest="metrics_host",
        help="the metrics endpoint's bind address (default 127.0.0.1; another needs TLS on)",
    )
    up.add_argument(
        "--tls",
        choices=["auto"],
        help="auto: serve TLS with a local CA and certificate made under <data-dir>/tls",
    )
    up.add_argument("--tls-cert", dest="tls_cert", help="serve TLS with this PEM certificate")
    up.add_argument("--tls-key", dest="tls_key", help="...and this PEM private key")
    up.add_argument(
        "--tls-client-ca",
        dest="tls_client_ca",
        help="mutual TLS: clients must present a certificate this PEM CA signed",
    )
    up.add_argument(
        "--auth",
        choices=["auto", "on", "off"],
        help="bearer tokens on every call but health (auto, the default: on unless --host is a "
        "loopback address; make them with: geopubsub token create)",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without TLS or without auth (anyone on the network can "
        "then read and change every subscription)",
    )
    up.add_argument(
        "--cert", dest="client_cert", help="with --tls-client-ca: the launcher's own certificate"
    )
    up.add_argument("--key", dest="client_key", help="...and its private key")
    up.add_argument(
        "--detach", action="store_true", help="return once SERVING (stop: geopubsub down)"
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for SERVING (default {local.READY_TIMEOUT_S:g})",
    )
    up.set_defaults(func=run_up)

    down = sub.add_parser("down", parents=[common], help="stop the local cluster")
    down.set_defaults(func=run_down)

    status = sub.add_parser("status", parents=[remote], help="is the cluster running and serving")
    status.set_defaults(func=run_status)

    s = sub.add_parser("subscribe", parents=[remote], help="create or replace a subscription")
    s.add_argument("--id", required=True)
    cond = s.add_mutually_exclusive_group()  # (a top-k subscription, --point, has none)
    cond.add_argument("--keywords", nargs="+", metavar="KEYWORD", help="all of these keywords")
    cond.add_argument("--expr", help="a keyword expression: 'ipad AND (sale OR discount)'")
    region = s.add_mutually_exclusive_group(required=True)
    region.add_argument(
        "--rect", nargs=4, type=float, metavar=("MIN_LON", "MIN_LAT", "MAX_LON", "MAX_LAT")
    )
    region.add_argument("--circle", nargs=3, type=float, metavar=("LON", "LAT", "RADIUS_M"))
    region.add_argument(
        "--polygon",
        metavar="JSON",
        help="rings as JSON, the exterior first, each closed: '[[[0,0],[2,0],[0,2],[0,0]]]'",
    )
    region.add_argument(
        "--point",
        nargs=2,
        type=float,
        metavar=("LON", "LAT"),
        help="a top-k subscription (paper 001) at this point: no keywords, --predicate with "
        'weights as JSON (\'{"attr": "price", "op": "<=", "value": 5, '
        '"weight": 2}\'), --alpha; reached by publish --top-k',
    )
    s.add_argument(
        "--predicate",
        action="append",
        default=[],
        metavar="COND",
        help="a condition on the messages' attributes, all must hold (repeat): 'price<=5', "
        "'category in food,drinks', 'price between 1,5', 'rating>=4', or a JSON object",
    )
    s.add_argument(
        "--threshold",
        type=float,
        help="ranked: deliver when alpha*spatial + (1-alpha)*textual similarity >= this "
        "(the keywords are scored, not all required; docs/LIMITS.md)",
    )
    s.add_argument(
        "--alpha", type=float, help="ranked or top-k: the weight of spatial similarity (0.5)"
    )
    s.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="KEYWORD=W",
        help="ranked: a keyword's weight (repeat; default: the cluster's idf)",
    )
    s.add_argument("--moving", action="store_true", help="a moving subscription (geopubsub move)")
    s.add_argument(
        "--follow",
        action="store_true",
        help="then print its deliveries as they stream (Ctrl-C ends)",
    )
    s.set_defaults(func=run_subscribe)

    u = sub.add_parser("unsubscribe", parents=[remote], help="remove a subscription")
    u.add_argument("--id", required=True)
    u.set_defaults(func=run_unsubscribe)

    p = sub.add_parser("publish", parents=[remote], help="publish one message")
    p.add_argument("--keywords", nargs="+", default=[], metavar="KEYWORD")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--point", nargs=2, type=float, metavar=("LON", "LAT"))
    where.add_argument(
        "--rect", nargs=4, type=float, metavar=("MIN_LON", "MIN_LAT", "MAX_LON", "MAX_LAT")
    )
    p.add_argument("--text", default="", help="free text; its words are terms too")
    p.add_argument(
        "--ttl", type=float, default=0.0, help="seconds the message stays live (0: one-shot)"
    )
    p.add_argument("--id", default="", help="message id (default: assigned by the server)")
    p.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="deliver to the K top-k subscriptions (subscribe --point) scoring it highest, "
        "instead of every match (a --point message, no --ttl; keywords optional)",
    )
    p.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an attribute (repeat): price=4.5 (a number), category=food (a string; quote a "
        "number to make it one: code='\"7\"')",
    )
    p.set_defaults(func=run_publish)

    m = sub.add_parser("move", parents=[remote], help="move a moving subscription")
    m.add_argument("--id", required=True)
    m.add_argument("--point", nargs=2, type=float, required=True, metavar=("LON", "LAT"))
    m.set_defaults(func=run_move)

    rb = sub.add_parser(
        "rebalance",
        parents=[remote],
        help="a new partition map for N shards (adding or removing shards), every shard rebuilt",
    )
    rb.add_argument(
        "--shards", type=int, default=0, help="the number of shards, 1-1024 (default: as now)"
    )
    rb.set_defaults(func=run_rebalance)

    st = sub.add_parser("stats", parents=[remote], help="cluster figures")
    st.add_argument("--json", action="store_true", help="print the Stats message as JSON")
    st.set_defaults(func=run_stats)


def load_settings(args: argparse.Namespace) -> Settings:
    """The one Settings of this command: ``--config`` < environment < flags."""
    flags = {name: getattr(args, name, None) for name in SETTING_FLAGS}
    return Settings.load(file=args.config, env=os.environ, flags=flags)


def _target(args: argparse.Namespace, settings: Settings) -> str:
    return args.target or manifest_target(settings.data_dir) or DEFAULT_TARGET


def client_tls(args: argparse.Namespace, settings: Settings, target: str):
    """How a client command reaches ``target``: the ``ca`` / ``client_cert`` / ``client_key``
    given (flags, environment, settings file), else what cluster.json says of the local cluster
    when ``target`` is its address, else plaintext (None)."""
    if settings.ca or settings.client_cert:
        return Tls(settings.ca or None, settings.client_cert or None, settings.client_key or None)
    if target == manifest_target(settings.data_dir):
        return manifest_tls(settings.data_dir)
    return None


def client_connection(args: argparse.Namespace) -> tuple[str, Any, str | None]:
    """(target, ``geopubsub.client.Tls`` or None, bearer token or None) of a command of
    ``remote_parent()``."""
    settings = load_settings(args)
    target = _target(args, settings)
    return target, client_tls(args, settings, target), settings.token or None


def client_access(args: argparse.Namespace, target: str):
    """A ``geopubsub.client.Endpoint`` for ``target`` from the ``add_client_flags`` of a command
    that has no ``remote_parent()`` (the bench and load commands): those flags, else the
    ``GEOPUBSUB_*`` environment and ``--config``, else the local cluster's CA of ``--data-dir``
    when ``target`` is its address."""
    names = ("ca", "client_cert", "client_key", "token", "data_dir")
    flags = {
        n: (str(v) if v is not None else None) for n in names for v in [getattr(args, n, None)]
    }
    settings = Settings.load(file=getattr(args, "config", None), env=os.environ, flags=flags)
    return Endpoint(target, client_tls(args, settings, target), settings.token or None)


def client_target(args: argparse.Namespace) -> str:
    """The coordinator a command of ``remote_parent()`` dials: ``--target``, else the address in
    ``<data-dir>/cluster.json``, else 127.0.0.1:50051."""
    return _target(args, load_settings(args))


def _reports_errors(
    run: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Print a failure as ``geopubsub: error: ...`` and turn it into the exit code."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except ValidationError:
            raise  # cli.main prints it and exits 2
        except GeoPubSubError as exc:
            _error(str(exc))
            return 1
        except grpc.RpcError as exc:
            code = exc.code()
            hint = ""
            if code is grpc.StatusCode.UNAVAILABLE:
                hint = f" (is a cluster running at {getattr(args, 'target_used', '?')}? start one with: geopubsub up)"
            _error(f"{code.name}: {exc.details()}{hint}")
            return 2 if code is grpc.StatusCode.INVALID_ARGUMENT else 1
        except KeyboardInterrupt:
            return 130

    return wrapper


def _error(text: str) -> None:
    print(f"geopubsub: error: {text}", file=sys.stderr)


def _client(args: argparse.Namespace):
    args.target_used, tls, token = client_connection(args)
    return GeoPubSubClient(args.target_used, tls=tls, token=token)


# ---- local cluster --------------------------------------------------------------------------
@_reports_errors
def run_up(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    timeout = local.READY_TIMEOUT_S if args.timeout is None else args.timeout
    if not timeout > 0:
        raise ValidationError("timeout", args.timeout, "must be > 0 seconds")
    return supervise.up(settings, detach=args.detach, timeout_s=timeout)


@_reports_errors
def run_down(args: argparse.Namespace) -> int:
    return local.down(load_settings(args).data_dir)


@_reports_errors
def run_status(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    target = _target(args, settings)
    return local.status(
        settings.data_dir,
        target=args.target,
        tls=client_tls(args, settings, target),
        token=settings.token or None,
    )


# ---- attribute syntax of the CLI ------------------------------------------------------------
_PREDICATE = re.compile(
    r"\s*([^\s<>=!]+?)\s*(<=|>=|!=|==|=|<|>|\bnot\s+in\b|\bin\b|\bbetween\b|\brange\b)\s*(.*?)\s*$",
    re.IGNORECASE,
)


def _json_arg(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(flag, text, f"not JSON: {exc}") from None


def _scalar(text: str) -> float | str:
    """A number where the text is one, else the text (quotes taken off: '"7"' is a string)."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
        return t[1:-1]
    try:
        return float(t)
    except ValueError:
        return t


def parse_predicate(text: str) -> dict[str, Any]:
    """A ``--predicate``: a JSON object, or ``ATTR OP VALUE`` with OP one of ``< <= > >= = !=
    in, not in, between`` and a comma-separated list after the last three. The value is checked
    by the core (``shard.attributes``), which names what is wrong.

    >>> parse_predicate("price<=5"), parse_predicate("category not in food, drinks")
    ({'attr': 'price', 'op': '<=', 'value': 5.0}, {'attr': 'category', 'op': 'not in', 'value': ['food', 'drinks']})
    """
    if text.lstrip().startswith("{"):
        return _json_arg("--predicate", text)
    m = _PREDICATE.fullmatch(text)
    if m is None or not m[3]:
        raise ValidationError(
            "--predicate", text, "expected ATTR OP VALUE, e.g. 'price<=5' or 'category in a,b'"
        )
    op = " ".join(m[2].lower().split())
    value: Any = m[3]
    if op in ("in", "not in", "between", "range"):
        value = [_scalar(v) for v in value.split(",")]
    else:
        value = _scalar(value)
    return {"attr": m[1], "op": op, "value": value}


def parse_attribute(text: str) -> tuple[str, float | str]:
    """An ``--attr NAME=VALUE``.

    >>> parse_attribute("price=4.5"), parse_attribute('code="7"')
    (('price', 4.5), ('code', '7'))
    """
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValidationError("--attr", text, "expected NAME=VALUE, e.g. price=4.5")
    return name.strip(), _scalar(value)


# ---- client commands ------------------------------------------------------------------------
@_reports_errors
def run_subscribe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sid = client.subscribe(
            args.id,
            keywords=args.keywords,
            expr=args.expr,
            rect=args.rect,
            circle=args.circle,
            polygon=_json_arg("--polygon", args.polygon) if args.polygon else None,
            point=args.point,
            predicates=[parse_predicate(t) for t in args.predicate] or None,
            threshold=args.threshold,
            alpha=args.alpha,
            weights=dict(parse_attribute(t) for t in args.weight) or None,
            moving=args.moving,
        )
        print(f"subscribed {sid}", flush=True)
        if not args.follow:
            return 0
        try:
            for delivery in client.stream_results(sid):
                print(delivery, flush=True)
        except KeyboardInterrupt:
            return 0
    return 0


@_reports_errors
def run_unsubscribe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.unsubscribe(args.id)
    print(f"unsubscribed {args.id}")
    return 0


@_reports_errors
def run_publish(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.publish(
            args.keywords,
            point=args.point,
            rect=args.rect,
            text=args.text,
            ttl_s=args.ttl,
            id=args.id,
            attributes=dict(parse_attribute(t) for t in args.attr),
            top_k=args.top_k,
        )
    print(f"published {result.id}: {result.matched} matched")
    return 0


@_reports_errors
def run_move(args: argparse.Namespace) -> int:
    lon, lat = args.point
    with _client(args) as client:
        updates = client.update_location(args.id, lon, lat)
    for delivery in updates:
        print(delivery)
    print(f"moved {args.id} to {lon:g},{lat:g}: {len(updates)} updates")
    return 0


@_reports_errors
def run_rebalance(args: argparse.Namespace) -> int:
    if not 0 <= args.shards <= MAX_PARTS:
        raise ValidationError("--shards", args.shards, f"must be in [1, {MAX_PARTS}] (0: as now)")
    with _client(args) as client:
        r = client.rebalance(args.shards)
    print(
        f"rebalanced: {r.shards} shards hold {r.subscriptions:,} subscriptions and "
        f"{r.live_messages:,} live messages (a new partition map); a coordinator started again "
        "with another --shards makes the map for that number"
    )
    return 0


@_reports_errors
def run_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        stats = client.stats()
    if args.json:
        data: dict[str, Any] = json_format.MessageToDict(
            stats, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(describe_stats(stats)))
    return 0
