"""``geopubsub register``: register a workload file's subscriptions through the gRPC API.

One asyncio client keeps many Subscribe calls in flight, so that the coordinator micro-batches them
into rounds (one Ray call per shard for hundreds of subscriptions). This is the online path; the
bulk loader (``geopubsub load``) replaces it for large loads. Lines are validated here with the rules the
server applies (``shard.model``), so a bad line is reported as ``file:line: reason`` and skipped
without a call; a subscription the server rejects is counted with its reason.

    geopubsub register --subs work/subs.jsonl            # the cluster of .geopubsub/cluster.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from geopubsub.client import CHANNEL_OPTIONS, Endpoint, Tls, open_channel, request_reload
from geopubsub.convert import to_proto_subscription
from geopubsub.tools.cluster_cli import client_connection, remote_parent
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from loader.job import run as load_run
from loader.job import spark_session
from shard.errors import UnavailableError, ValidationError
from shard.limits import MAX_SUBSCRIBE_BATCH
from shard.model import Subscription
from shard.workload import read_subscriptions

DEFAULT_IN_FLIGHT = 1024
"""Subscriptions in flight: two full rounds of the default ``batch_max`` (512 per shard, 2
shards), so that one round fills while the other runs. More only lengthens the queue (1,024
calls of 500 each had 100,000 top-k subscriptions wait past the server's deadline_s)."""
DEFAULT_BATCH = 1
"""Subscriptions per Subscribe call (``SubscribeRequest.subscriptions`` when > 1)."""
RETRY_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Codes after which a Subscribe is retried (it is idempotent): backpressure, and a round that
took longer than the server's deadline (the first rounds of a cold shard can)."""
RETRY_PAUSE_S = 0.05
MAX_RETRIES = 20
"""Retries of one subscription before its error is raised."""
CALL_TIMEOUT_S = 60.0
"""Deadline of one Subscribe: generous, the coordinator queues many at once."""
PROGRESS_EVERY_S = 2.0


@dataclass
class RegisterReport:
    """What ``register_subscriptions`` did."""

    registered: int = 0
    moving: int = 0
    rejected: int = 0
    """Refused by the server (INVALID_ARGUMENT) or by the client's validation (bad lines)."""
    retries: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    """The first few rejections, ``where: reason``."""

    @property
    def per_s(self) -> float:
        return self.registered / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "registered": self.registered,
            "moving": self.moving,
            "rejected": self.rejected,
            "retries": self.retries,
            "seconds": round(self.seconds, 2),
            "subscribe_per_s": round(self.per_s, 1),
        }


MAX_ERRORS_KEPT = 10


async def register_subscriptions(
    target: str,
    subs: Iterable[Subscription],
    *,
    in_flight: int | None = None,
    batch: int = 1,
    ephemeral: bool = False,
    on_progress: Callable[[RegisterReport], None] | None = None,
    tls: Tls | None = None,
    token: str | None = None,
) -> RegisterReport:
    """Subscribe every subscription of ``subs`` at ``target`` with ``in_flight`` calls pending
    (default: ``DEFAULT_IN_FLIGHT`` subscriptions' worth, at least 2 calls), ``batch``
    subscriptions a call (``SubscribeRequest.subscriptions`` when > 1; ``ephemeral``:
    their deliveries skip the retention log); returns counts and the rate. RESOURCE_EXHAUSTED and
    DEADLINE_EXCEEDED are retried; INVALID_ARGUMENT is counted and skipped (a batch refused so is
    sent again one by one, to keep the others); any other failure is raised. ``on_progress`` is
    called every few seconds. ``tls``: for a coordinator serving TLS. With a cluster running::

        asyncio.run(register_subscriptions("127.0.0.1:50051", read_subscriptions("subs.jsonl")))
    """
    if in_flight is None:
        in_flight = max(2, -(-DEFAULT_IN_FLIGHT // max(1, batch)))
    if in_flight < 1:
        raise ValidationError("in_flight", in_flight, "must be >= 1")
    if not 1 <= batch <= MAX_SUBSCRIBE_BATCH:
        raise ValidationError("batch", batch, f"must be 1-{MAX_SUBSCRIBE_BATCH}")
    report = RegisterReport()
    it = iter(subs)
    t0 = time.perf_counter()
    last = t0

    async with open_channel(target, tls, aio=True, options=CHANNEL_OPTIONS, token=token) as channel:
        stub = pb_grpc.GeoPubSubStub(channel)

        async def call(part: list[Subscription]) -> None:
            protos = [to_proto_subscription(s) for s in part]
            for p in protos:
                p.ephemeral = ephemeral
            if len(protos) == 1:
                request = pb.SubscribeRequest(subscription=protos[0])
            else:
                request = pb.SubscribeRequest(subscriptions=protos)
            attempts = 0
            while True:
                try:
                    await stub.Subscribe(request, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in RETRY_CODES and attempts < MAX_RETRIES:
                        attempts += 1
                        report.retries += 1
                        await asyncio.sleep(RETRY_PAUSE_S)
                        continue
                    if exc.code() is not grpc.StatusCode.INVALID_ARGUMENT:
                        raise
                    if len(part) > 1:  # find the bad ones; the others are registered
                        for s in part:
                            await call([s])
                        return
                    _reject(report, f"{part[0].id}: {exc.details()}")
                    return
                report.registered += len(part)
                report.moving += sum(s.moving for s in part)
                return

        async def worker() -> None:
            nonlocal last
            while True:
                # one iterator shared by every worker (one thread: no races)
                part = list(itertools.islice(it, batch))
                if not part:
                    return
                await call(part)
                now = time.perf_counter()
                if on_progress is not None and now - last >= PROGRESS_EVERY_S:
                    last = now
                    report.seconds = now - t0
                    on_progress(report)

        workers = [asyncio.ensure_future(worker()) for _ in range(in_flight)]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
    report.seconds = time.perf_counter() - t0
    return report


def _reject(report: RegisterReport, text: str) -> None:
    report.rejected += 1
    if len(report.errors) < MAX_ERRORS_KEPT:
        report.errors.append(text)


def read_file(path: Path, report: RegisterReport) -> Iterable[Subscription]:
    """The file's valid subscriptions; a bad line is counted in ``report`` and skipped."""
    if not path.exists():
        raise ValidationError("--subs", str(path), "no such file")
    bad: list[str] = []
    yield from read_subscriptions(path, errors=bad)
    for text in bad:
        _reject(report, text)


# ---- the command ----------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "register",
        parents=[remote_parent()],
        help="subscribe every subscription of a workload file (many calls in flight)",
    )
    p.add_argument("--subs", required=True, type=Path, help="subscriptions, JSON Lines")
    p.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help=f"Subscribe calls pending at once (default: {DEFAULT_IN_FLIGHT} subscriptions' worth,"
        " at least 2 calls)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        help=f"subscriptions per Subscribe call, 1-{MAX_SUBSCRIBE_BATCH} (default {DEFAULT_BATCH})",
    )
    p.add_argument(
        "--ephemeral",
        action="store_true",
        help="their deliveries skip the Redis retention log (no resume after a disconnect)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target, tls, token = client_connection(args)
    bad = RegisterReport()

    def progress(r: RegisterReport) -> None:
        print(f"  registered {r.registered:,} ({r.per_s:,.0f}/s)", file=sys.stderr, flush=True)

    try:
        report = asyncio.run(
            register_subscriptions(
                target,
                read_file(args.subs, bad),
                in_flight=args.in_flight,
                batch=args.batch,
                ephemeral=args.ephemeral,
                on_progress=progress,
                tls=tls,
                token=token,
            )
        )
    except grpc.aio.AioRpcError as exc:
        print(f"geopubsub: error: {exc.code().name}: {exc.details()} ({target})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    report.rejected += bad.rejected
    report.errors = (bad.errors + report.errors)[:MAX_ERRORS_KEPT]
    for text in report.errors:
        print(f"  rejected {text}", file=sys.stderr)
    print(
        f"registered {report.registered:,} subscriptions ({report.moving:,} moving) at {target} "
        f"in {report.seconds:.1f} s ({report.per_s:,.0f}/s); {report.rejected:,} rejected"
    )
    return 0 if report.rejected == 0 else 2


def bulk_load(
    subs_file: Path, cluster, say: Callable[[str], None], *, ephemeral: bool = False
) -> dict:
    """Register a workload file with the bulk loader: Spark ``local[2]`` into the Redis of
    ``cluster`` (a ``deploy.local`` cluster), then the coordinator's ``Reload``."""
    say(f"registration  bulk load of {subs_file} with Spark local[2] ...")
    t0 = time.perf_counter()
    sigint = signal.getsignal(signal.SIGINT)  # SparkContext installs its own and leaves it
    spark = spark_session("local[2]")
    try:
        summary = load_run(
            spark,
            [str(subs_file)],
            redis_url=cluster.redis_url,
            namespace=cluster.settings.namespace,
            shards=cluster.settings.shards,
            fmt="jsonl",
            ephemeral=ephemeral,
            progress=lambda line: say("              " + line.replace("\n", "\n  ")),
        )
    finally:
        spark.stop()
        signal.signal(signal.SIGINT, sigint)
    loaded_s = time.perf_counter() - t0
    say("              the coordinator reloads its shards from Redis ...")
    if not request_reload(Endpoint(cluster.target, cluster.tls)):
        raise UnavailableError(f"the coordinator at {cluster.target} has no Reload RPC")
    seconds = time.perf_counter() - t0
    say(
        f"              {summary.loaded:,} loaded in {loaded_s:.1f} s, serving after "
        f"{seconds:.1f} s ({summary.loaded / seconds:,.0f}/s)"
    )
    return {
        "via": "loader",
        "registered": summary.loaded,
        "rejected": summary.rejected,
        "per_shard": {str(k): v for k, v in summary.per_shard.items()},
        "load_s": round(loaded_s, 2),
        "seconds": round(seconds, 2),
        "subscribe_per_s": round(summary.loaded / seconds, 1) if seconds > 0 else 0.0,
    }
