"""``geopubsub bench chaos``: what clients receive while the cluster's processes are killed and
stopped.

1. **cluster** — a detached, supervised local cluster (private redis-server, local Ray,
   ``--shards``, the coordinator on 127.0.0.1) in ``--data-dir``, started empty
   (``start_supervised``);
2. **registration** — a generated workload (``--gen-subs``, 10 % moving) or ``--subs`` /
   ``--msgs``, every subscription durable, through Subscribe calls (``--register load``: the
   bulk loader);
3. **traffic**, for ``--duration`` s, at once:

   * a publisher at ``--rate`` msgs/s, one Publish call per message with a client-given id
     (``p<index>``), a share ``--one-shot-share`` without ttl and the others stored for
     ``--ttl`` s; a call that fails is sent again with the same id until acknowledged or
     ``--give-up`` s after its first attempt (``RetryingPublisher``);
   * the result streams of ``--streams`` busy static subscriptions and of ``--movers`` tracked
     moving subscribers, each reconnecting after any error and resuming after the last sequence
     it got (``traffic.ResumingStream``);
   * the tracked movers (UpdateLocation, sent again likewise with the same point) and the other
     moving subscriptions as a crowd over LocationStream (``--crowd-rate``; a new stream after
     an error);
   * ``--faults`` faults at seeded moments, at least ``--min-gap`` s apart, each once the cluster
     answered SERVING again (overall, Redis and every shard): kill -9 of a shard actor's
     process, SIGSTOP of one for ``--stop`` s then SIGCONT, kill -9 of the coordinator or of
     redis-server (the supervisor restarts them), SIGSTOP / SIGCONT of redis-server, and a
     double fault: a shard actor stopped and, once the coordinator reports it down and the
     traffic went on for a moment, the coordinator killed (its successor has to tell what the
     down shard missed; ``coordinator.outages``). Only
     processes of the cluster it started: the pids of its ``cluster.json`` and the shard actors
     (``ray::ShardActor``) of its coordinator's session;

4. **check** — once every stored message expired and the streams fell quiet, every followed
   stream (``check_static``, ``check_mover``): lost, duplicated, out of order, unexpected; GAPs
   counted apart;
5. the report (``--json``: one JSON object on stdout); the cluster is stopped, on error and
   Ctrl-C too.

Exit code 1 if anything was lost, duplicated, out of order or unexpected, the cluster did not
answer SERVING again after a fault, or the streams did not fall quiet; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.health import REDIS_HEALTH, shard_health_name
from coordinator.settings import Settings
from deploy import local, supervise
from deploy.local import sigterm_as_interrupt
from deploy.processes import alive, session_members
from deploy.redis_local import redis_dir
from geopubsub.client import Endpoint
from geopubsub.convert import to_proto_message
from geopubsub.tools.demo import Progress, mover_targets, pick_movers, warm_up
from geopubsub.tools.gen import generate
from geopubsub.tools.oracle_check import keyword_match
from geopubsub.tools.register import bulk_load, register_subscriptions
from geopubsub.tools.traffic import (
    Crowd,
    ResumingStream,
    TrackedMover,
    busiest,
    message_index,
    stop_traffic,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.host.heap import freeze_long_lived
from shard.model import Message, Subscription
from shard.workload import read_messages, read_subscriptions

DOUBLE = "shard-down-coordinator-kill"
KINDS = ("shard-kill", "shard-stop", "coordinator-kill", "redis-kill", "redis-stop", DOUBLE)
"""The faults, as ``--kinds`` names them."""
MAX_EXAMPLES = 10
"""Findings described per stream and kind (all are counted)..."""
MAX_REPORTED = 25
"""...and per kind in the report, rarer kinds first (``FINDING_ORDER``)."""
FINDING_ORDER = ("duplicated", "out_of_order", "unexpected", "lost", "lost REMOVE")
LEAD_S = 3.0
"""No fault in the first seconds of the traffic (the streams open, the shards warm up)..."""
TAIL_S = 3.0
"""...nor in its last ones."""
CALL_TIMEOUT_S = 10.0
"""Deadline of one Publish / UpdateLocation attempt."""
RETRY_PAUSE_S = (0.05, 1.0)
"""First and longest pause before a failed call is made again (doubling, with jitter)."""
IN_FLIGHT = 1000
"""Publish calls (with their retries) pending at once; the pace waits beyond."""
POLL_S = 0.25
"""How often a wait for recovery looks at the cluster."""
EXPIRY_MARGIN_S = 2.0
"""After the last publish, the movers move on for its ttl plus this (a round every 0.25 s)."""
QUIET_S = 2.0
"""The streams are checked once none has received or reconnected for this long."""
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""Reconnect within a second of a restarted coordinator answering (gRPC's default backs off to
120 s)."""


REGISTER_IN_FLIGHT = 256
"""Subscribe calls in flight: rounds small enough for a cold shard to answer within the short
``--deadline``..."""
REGISTER_ATTEMPTS = 5
REGISTER_PAUSE_S = 3.0
"""...and if one did not (UNAVAILABLE: its shard is being reloaded), everything is sent again
after this pause, at most ``REGISTER_ATTEMPTS`` times."""


# ---- the check ---------------------------------------------------------------------------------
Arrival = tuple[int, int, str, str]
"""``(first sequence, last sequence, kind, message id)`` as a stream received it: kind ``+`` or
``-`` (first = last), or ``gap`` (the range a GAP delivery names, no message)."""


@dataclass
class StreamCheck:
    """What the check of one followed stream found; ``examples`` describes the first few of
    each kind (``FINDING_ORDER``)."""

    subscription: str
    deliveries: int = 0
    adds: int = 0
    removes: int = 0
    gaps: int = 0
    gap_sequences: int = 0
    lost: int = 0
    lost_removes: int = 0
    """Of ``lost``: stored messages still held at the end (their REMOVE never came)."""
    duplicated: int = 0
    out_of_order: int = 0
    unexpected: int = 0
    examples: list[str] = field(default_factory=list)
    describe: Callable[[str], str] | None = field(default=None, repr=False)
    """Says more of a message id in an example (when it was published, ...)."""
    shown: collections.Counter = field(default_factory=collections.Counter, repr=False)

    def found(self, what: str, text: str, mid: str = "", *, removal: bool = False) -> None:
        """Count a finding of kind ``what`` (``removal``: a lost REMOVE) and describe it."""
        setattr(self, what, getattr(self, what) + 1)
        self.lost_removes += removal
        kind = "lost REMOVE" if removal else what
        self.shown[kind] += 1
        if self.shown[kind] <= MAX_EXAMPLES:
            more = f" [{self.describe(mid)}]" if mid and self.describe is not None else ""
            self.examples.append(f"{kind}: {self.subscription}: {text}{more}")


def _check_order(c: StreamCheck, arrivals: Sequence[Arrival]) -> list[tuple[int, int]]:
    """Sequences must increase: one received again is duplicated, one below the highest before
    (and new) out of order. Counts the GAPs; returns their ranges."""
    delivered: set[int] = set()
    spans: list[tuple[int, int]] = []
    top = 0
    for first, last, kind, mid in arrivals:
        what = f"#{first}..#{last} (gap)" if kind == "gap" else f"#{first} ({kind} {mid})"
        if first <= top:
            if kind == "gap":
                again = any(first <= s <= last for s in delivered)
            else:
                again = first in delivered
            again = again or any(a <= last and first <= b for a, b in spans)
            if again:
                c.found("duplicated", f"sequence {what} received again")
            else:
                c.found("out_of_order", f"sequence {what} after #{top}")
        if kind == "gap":
            spans.append((first, last))
            c.gaps += 1
            c.gap_sequences += last - first + 1
        else:
            delivered.add(first)
        top = max(top, last)
    return spans


def _gaps_text(spans: Sequence[tuple[int, int]]) -> str:
    return (
        f" (the stream got GAPs {', '.join(f'#{a}..#{b}' for a, b in spans[:5])})" if spans else ""
    )


def check_static(
    sub_id: str,
    arrivals: Sequence[Arrival],
    expected: set[str],
    acked: Callable[[str], bool],
    one_shot: Callable[[str], bool],
    *,
    all_expired: bool,
    describe: Callable[[str], str] | None = None,
) -> StreamCheck:
    """Check the stream of a subscription that never moved. ``expected``: the published messages
    it matches (brute force); ``acked(id)``: the publish was acknowledged; ``one_shot(id)``: it
    had no ttl.

    * lost: an acknowledged expected message never added (a GAP over it included); a REMOVE
      without its ADD; with ``all_expired``, a stored message still held (its REMOVE missing);
    * duplicated: a message added twice or removed twice, a sequence received twice;
    * out of order: a sequence below one received before;
    * unexpected: an ADD of a message it does not match, a REMOVE of a one-shot message.

    An unacknowledged message may be missing, but not added twice. ``describe(id)`` adds to
    the examples what is known of a message.

    >>> c = check_static("s", [(1, 1, "+", "p1"), (2, 2, "+", "p1")], {"p1", "p2"},
    ...                  lambda m: True, lambda m: True, all_expired=True)
    >>> c.lost, c.duplicated
    (1, 1)
    """
    c = StreamCheck(sub_id, describe=describe)
    spans = _check_order(c, arrivals)
    added: dict[str, int] = {}
    removed: dict[str, int] = {}
    for first, _, kind, mid in arrivals:
        if kind == "gap":
            continue
        c.deliveries += 1
        if kind == "+":
            c.adds += 1
            if mid not in expected:
                c.found(
                    "unexpected", f"+ {mid} (#{first}): not a published message it matches", mid
                )
            if mid in added:
                c.found("duplicated", f"+ {mid} (#{first}) again, first as #{added[mid]}", mid)
            else:
                added[mid] = first
        else:
            c.removes += 1
            if one_shot(mid):
                c.found("unexpected", f"- {mid} (#{first}): a one-shot message is never held", mid)
            elif mid in removed:
                c.found("duplicated", f"- {mid} (#{first}) again, first as #{removed[mid]}", mid)
            else:
                removed[mid] = first
                if mid not in added:
                    c.found("lost", f"- {mid} (#{first}) without its +{_gaps_text(spans)}", mid)
    for mid in sorted(expected - added.keys() - removed.keys()):
        if acked(mid):
            c.found(
                "lost", f"+ {mid} never received, its publish acknowledged{_gaps_text(spans)}", mid
            )
    if all_expired:
        for mid in sorted(added.keys() - removed.keys()):
            if not one_shot(mid):
                text = f"{mid} (+ #{added[mid]}) still held after it expired: no -"
                c.found("lost", text, mid, removal=True)
    return c


def check_mover(
    sub_id: str,
    arrivals: Sequence[Arrival],
    matches: Callable[[str], bool],
    one_shot: Callable[[str], bool],
    *,
    all_expired: bool,
    describe: Callable[[str], str] | None = None,
) -> StreamCheck:
    """Check a moving subscriber's stream by what it holds. ``matches(id)``: a published
    message whose keywords it matches (where it was is not checked: its moves were retried
    through faults).

    * duplicated: an ADD of a message held (or of a one-shot message added before), a REMOVE of
      one removed just before, a sequence received twice;
    * lost: a REMOVE of a message never added; with ``all_expired``, a stored message still held
      (its REMOVE missing);
    * out of order and unexpected (an ADD of a message it does not match, a REMOVE of a one-shot
      one) as in ``check_static``.

    >>> c = check_mover("m", [(1, 1, "+", "p1"), (2, 2, "-", "p1"), (3, 3, "-", "p1")],
    ...                 lambda m: True, lambda m: False, all_expired=True)
    >>> c.duplicated, c.lost
    (1, 0)
    """
    c = StreamCheck(sub_id, describe=describe)
    spans = _check_order(c, arrivals)
    held: set[str] = set()
    ever: set[str] = set()
    last: dict[str, tuple[str, int]] = {}
    for first, _, kind, mid in arrivals:
        if kind == "gap":
            continue
        c.deliveries += 1
        if kind == "+":
            c.adds += 1
            if not matches(mid):
                c.found(
                    "unexpected", f"+ {mid} (#{first}): not a published message it matches", mid
                )
            if mid in held or (one_shot(mid) and mid in ever):
                c.found("duplicated", f"+ {mid} (#{first}) while held since #{last[mid][1]}", mid)
            held.add(mid)
            ever.add(mid)
        else:
            c.removes += 1
            if one_shot(mid):
                c.found("unexpected", f"- {mid} (#{first}): a one-shot message is never held", mid)
            elif mid in held:
                held.discard(mid)
            elif mid in last:
                c.found("duplicated", f"- {mid} (#{first}) again, removed as #{last[mid][1]}", mid)
            else:
                c.found("lost", f"- {mid} (#{first}) without its +{_gaps_text(spans)}", mid)
        last[mid] = (kind, first)
    if all_expired:
        for mid in sorted(held):
            if not one_shot(mid):
                text = f"{mid} (+ #{last[mid][1]}) still held after it expired: no -"
                c.found("lost", text, mid, removal=True)
    return c


TOTALS = (
    "deliveries",
    "adds",
    "removes",
    "gaps",
    "gap_sequences",
    "lost",
    "lost_removes",
    "duplicated",
    "out_of_order",
    "unexpected",
)


def totals(checks: Sequence[StreamCheck]) -> dict[str, int]:
    return {k: sum(getattr(c, k) for c in checks) for k in TOTALS}


def findings(checks: Sequence[StreamCheck]) -> list[str]:
    """The streams' examples, ``MAX_REPORTED`` of each kind, in ``FINDING_ORDER``."""
    by_kind: dict[str, list[str]] = {k: [] for k in FINDING_ORDER}
    for c in checks:
        for e in c.examples:
            by_kind[e.split(":", 1)[0]].append(e)
    return [e for k in FINDING_ORDER for e in by_kind[k][:MAX_REPORTED]]


# ---- calls that are made again ------------------------------------------------------------------
async def with_retries(
    call: Callable[[], Any],
    *,
    give_up_s: float,
    codes: collections.Counter,
    on_attempt: Callable[[], None] | None = None,
) -> Any:
    """Await ``call()`` until it answers; after a failure with any status but INVALID_ARGUMENT
    (raised), pause and call again, until ``give_up_s`` after the first attempt. Returns the
    answer, None when given up. ``codes`` counts the failures by status name."""
    began = time.monotonic()
    pause = RETRY_PAUSE_S[0]
    while True:
        if on_attempt is not None:
            on_attempt()
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            codes[exc.code().name] += 1
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise
        if time.monotonic() - began + pause > give_up_s:
            return None
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2 * pause, RETRY_PAUSE_S[1])


ACKED, GAVE_UP, REJECTED = 1, 2, 3


class RetryingPublisher:
    """Publishes ``n`` messages, ``messages[j % len]`` with the id ``p<j>``, one Publish call
    each, paced at ``rate`` with up to ``IN_FLIGHT`` pending; message ``j`` is one-shot where
    ``one_shot_mask[j]``, else stored for ``ttl`` s. A failed call is made again with the same
    id (``with_retries``). Records per message its first and last attempt, the answer's time
    and ``matched``, and whether it was acknowledged, given up, or rejected (a retry answered
    INVALID_ARGUMENT: ``rejected`` keeps the first few answers)."""

    def __init__(
        self,
        messages: Sequence[Message],
        n: int,
        *,
        rate: float,
        ttl: float,
        one_shot_mask: np.ndarray,
        give_up_s: float,
    ) -> None:
        self.protos = {
            flag: [to_proto_message(replace(m, ttl=None if flag else ttl)) for m in messages]
            for flag in (False, True)
        }
        self.n = n
        self.rate = rate
        self.one_shot_mask = one_shot_mask
        self.give_up_s = give_up_s
        self.first_sent = np.full(n, math.inf)
        self.last_sent = np.full(n, math.inf)
        self.answered_at = np.full(n, math.inf)
        self.attempts = np.zeros(n, np.int32)
        self.matched = np.full(n, -1, np.int64)
        self.status = np.zeros(n, np.int8)
        self.codes: collections.Counter = collections.Counter()
        self.rejected: list[str] = []
        self.sent = 0
        self.started = 0.0
        self.finished = 0.0

    def index(self, message_id: str) -> int:
        """The index of ``p<j>`` if it was sent, else -1."""
        j = message_index(message_id)
        return j if 0 <= j < self.sent else -1

    def acked(self, message_id: str) -> bool:
        j = self.index(message_id)
        return j >= 0 and self.status[j] == ACKED

    def one_shot(self, message_id: str) -> bool:
        j = self.index(message_id)
        return j >= 0 and bool(self.one_shot_mask[j])

    async def run(self, stub) -> None:
        """Publish every message; returns once each is acknowledged or given up."""
        room = asyncio.Semaphore(IN_FLIGHT)
        tasks: set[asyncio.Task] = set()
        self.started = t0 = time.time()

        def done(task: asyncio.Task) -> None:
            tasks.discard(task)
            room.release()

        try:
            for j in range(self.n):
                delay = t0 + j / self.rate - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await room.acquire()
                task = asyncio.ensure_future(self._publish(stub, j))
                tasks.add(task)
                task.add_done_callback(done)
                self.sent = j + 1
            while tasks:  # a failed publish (INVALID_ARGUMENT: a harness bug) is raised
                await asyncio.gather(*list(tasks))
        finally:
            for t in list(tasks):
                t.cancel()
        self.finished = time.time()

    async def _publish(self, stub, j: int) -> None:
        req = pb.PublishRequest()
        req.message.CopyFrom(self.protos[bool(self.one_shot_mask[j])][j % len(self.protos[False])])
        req.message.id = f"p{j}"

        def attempt() -> None:
            self.attempts[j] += 1
            self.last_sent[j] = time.time()
            if self.attempts[j] == 1:
                self.first_sent[j] = self.last_sent[j]

        try:
            answer = await with_retries(
                lambda: stub.Publish(req, timeout=CALL_TIMEOUT_S),
                give_up_s=self.give_up_s,
                codes=self.codes,
                on_attempt=attempt,
            )
        except grpc.aio.AioRpcError as exc:  # INVALID_ARGUMENT
            self.status[j] = REJECTED
            if len(self.rejected) < MAX_EXAMPLES:
                self.rejected.append(
                    f"p{j} (attempt {self.attempts[j]}, {self.last_sent[j] - self.started:.1f} s "
                    f"into the traffic): {exc.details()}"
                )
            return
        if answer is None:
            self.status[j] = GAVE_UP
            return
        self.answered_at[j] = time.time()
        self.matched[j] = answer.matched
        self.status[j] = ACKED


class GaveUp(Exception):
    """A call was made again for ``--give-up`` seconds without an answer."""


class RetryingMoves:
    """What a ``traffic.TrackedMover`` calls (``UpdateLocation``), made again with the same point
    after a failure (a move applied twice moves nowhere the second time), until answered; raises
    ``GaveUp`` after ``give_up_s`` or an INVALID_ARGUMENT answer."""

    def __init__(self, stub, *, give_up_s: float, codes: collections.Counter) -> None:
        self.stub = stub
        self.give_up_s = give_up_s
        self.codes = codes
        self.attempts = 0
        self.gave_up = False

    def _attempt(self) -> None:
        self.attempts += 1

    async def UpdateLocation(self, request):
        try:
            answer = await with_retries(
                lambda: self.stub.UpdateLocation(request, timeout=CALL_TIMEOUT_S),
                give_up_s=self.give_up_s,
                codes=self.codes,
                on_attempt=self._attempt,
            )
        except grpc.aio.AioRpcError as exc:  # INVALID_ARGUMENT
            self.gave_up = True
            raise GaveUp(f"UpdateLocation of {request.id}: {exc.details()}") from None
        if answer is None:
            self.gave_up = True
            raise GaveUp(f"UpdateLocation of {request.id} unanswered for {self.give_up_s:g} s")
        return answer


@dataclass
class CrowdCounts:
    moves: int = 0
    updates: int = 0
    streams: int = 0
    codes: collections.Counter = field(default_factory=collections.Counter)


async def crowd_loop(
    stub,
    subs: Sequence[Subscription],
    counts: CrowdCounts,
    *,
    rate: float,
    seed: int,
    stop: asyncio.Event,
) -> None:
    """The moving subscriptions random-walking over LocationStream at ``rate`` moves/s until
    ``stop``, counted in ``counts``; a stream that fails is replaced by a new one (a new
    ``Crowd``, the next seed)."""
    while not stop.is_set():
        crowd = Crowd(subs, rate=rate, seed=seed + counts.streams)
        counts.streams += 1
        try:
            await crowd.run(stub, stop)
        except grpc.aio.AioRpcError as exc:
            counts.codes[exc.code().name] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_PAUSE_S[1])
        finally:
            counts.moves += crowd.sent
            counts.updates += crowd.updates


# ---- the cluster's processes ---------------------------------------------------------------------
def start_supervised(data_dir: Path, shards: int, **flags: Any):
    """Start an empty cluster in ``data_dir`` as ``geopubsub up --detach`` does (private
    redis-server, local Ray, ``shards``, the coordinator on 127.0.0.1 at a free port, a
    supervisor process) with the settings ``flags``; returns it as ``cluster.json`` describes it
    (a ``deploy.local.LocalCluster``). A cluster an earlier run left in ``data_dir`` is stopped
    and its Redis data removed first."""
    if local.read_manifest(data_dir) is not None:
        local.down(data_dir, out=io.StringIO())
    shutil.rmtree(redis_dir(data_dir), ignore_errors=True)
    settings = Settings.load(
        env=os.environ,
        flags={
            "data_dir": str(data_dir),
            "host": "127.0.0.1",
            "port": 0,
            "shards": shards,
            **flags,
        },
    )
    supervise.up(settings, detach=True, out=io.StringIO())
    data_dir = data_dir.resolve()
    resolved = Settings.load(file=data_dir / local.CONFIG_FILE)
    return local.LocalCluster.from_manifest(local.read_manifest(data_dir), resolved)


def shard_actor_pids(session: int) -> list[int]:
    """The live processes of session ``session`` whose command line starts with
    ``ray::ShardActor``: the shard actors of the local Ray of the coordinator whose pid it is."""
    out = []
    for pid in session_members(session):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"ray::ShardActor"):
            out.append(pid)
    return out


def health_names(shards: int) -> list[str]:
    """Every health service name the coordinator sets: overall, Redis, each shard."""
    return ["", REDIS_HEALTH, *(shard_health_name(k) for k in range(shards))]


async def serving(health_stub, names: Sequence[str]) -> bool:
    """Whether the coordinator answers SERVING for every one of ``names``."""
    for name in names:
        try:
            got = await health_stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        if got.status != health_pb2.HealthCheckResponse.SERVING:
            return False
    return True


# ---- faults ------------------------------------------------------------------------------------
def plan_faults(
    n: int, kinds: Sequence[str], duration: float, *, seed: int
) -> list[tuple[float, str]]:
    """``n`` faults as ``(seconds into the traffic, kind)``: the kinds in turn, each round of
    them in a seeded order (so ``n >= len(kinds)`` has each at least once), one in each of ``n``
    equal slots of ``[LEAD_S, duration - TAIL_S]``, in its first half.

    >>> [k for _, k in plan_faults(3, ["a", "b"], 30.0, seed=1)].count("a") >= 1
    True
    """
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < n:
        turn = list(kinds)
        rng.shuffle(turn)
        order += turn
    width = (duration - TAIL_S - LEAD_S) / max(n, 1)
    return [(LEAD_S + i * width + rng.uniform(0, width / 2), order[i]) for i in range(n)]


@dataclass
class Fault:
    kind: str
    at_s: float
    """Seconds into the traffic."""
    pid: int
    stopped_s: float = 0.0
    """SIGSTOP to SIGCONT (the stop kinds)."""
    noticed: bool = False
    """The coordinator's health showed it (not SERVING somewhere) before recovering."""
    recovered_s: float | None = None
    """From the signal (SIGCONT for a stop) to SERVING everywhere again; None: not within
    ``--recover``."""


class Injector:
    """Injects the planned faults into the cluster of ``data_dir`` (see the module docstring)
    and waits after each for the coordinator to answer SERVING for ``names`` again (and, after a
    kill, for the process to be replaced)."""

    def __init__(
        self,
        data_dir: Path,
        health_stub,
        shards: int,
        plan: Sequence[tuple[float, str]],
        *,
        min_gap_s: float,
        stop_s: tuple[float, float],
        notice_s: float,
        recover_s: float,
        seed: int,
        say: Callable[[str], None],
    ) -> None:
        self.data_dir = data_dir
        self.health = health_stub
        self.shards = shards
        self.names = health_names(shards)
        self.plan = list(plan)
        self.min_gap_s = min_gap_s
        self.stop_s = stop_s
        self.notice_s = notice_s
        self.recover_s = recover_s
        self.rng = random.Random(seed)
        self.say = say
        self.done: list[Fault] = []
        self.skipped: list[str] = []
        self.stopped: set[int] = set()
        """Pids under SIGSTOP right now (``resume_all`` continues them)."""
        self.shard_pids: set[int] = set()
        """Every shard actor process seen."""
        self.unrecovered = False

    def _manifest(self) -> dict:
        return local.read_manifest(self.data_dir) or {}

    def _shards_now(self) -> list[int]:
        pids = shard_actor_pids(self._manifest().get("coordinator", {}).get("pid", 0))
        self.shard_pids.update(pids)
        return pids

    def _process(self, name: str) -> tuple[int, int | None]:
        """The pid and start time ``cluster.json`` records for ``name``, checked alive."""
        proc = self._manifest().get(name) or {}
        pid, started = proc.get("pid"), proc.get("started")
        if not pid or not alive(pid, started=started):
            raise LookupError(f"no live {name} in {self.data_dir}/cluster.json")
        return pid, started

    def resume_all(self) -> None:
        """SIGCONT whatever this injector stopped (on the way out of an interrupted run)."""
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)

    async def run(self, t0: float, until: float) -> None:
        """Inject the plan (``t0``: the traffic's start, time.time()); a fault whose moment
        comes after ``until`` (or after a fault the cluster did not recover from) is skipped."""
        ready = -math.inf
        for i, (at, kind) in enumerate(self.plan):
            when = max(t0 + at, ready + self.min_gap_s)
            if when > until or self.unrecovered:
                self.skipped += [k for _, k in self.plan[i:]]
                return
            await asyncio.sleep(max(0.0, when - time.time()))
            fault = await self.inject(kind, time.time() - t0)
            if fault is None:
                self.skipped.append(kind)
                continue
            self.done.append(fault)
            self.say(
                f"fault {len(self.done):3d}  {kind:16s} pid {fault.pid} at {fault.at_s:6.1f} s"
                + (f", stopped {fault.stopped_s:.1f} s" if fault.stopped_s else "")
                + (
                    f", SERVING again after {fault.recovered_s:.1f} s"
                    if fault.recovered_s is not None
                    else f", NOT SERVING again within {self.recover_s:g} s"
                )
            )
            if fault.recovered_s is None:
                self.unrecovered = True
            ready = time.time()

    async def inject(self, kind: str, at_s: float) -> Fault | None:
        """One fault, then the wait for recovery; None if its process was not found."""
        try:
            if kind.startswith("shard"):
                pids = sorted(self._shards_now())
                if not pids:
                    raise LookupError("no shard actor process")
                pid = self.rng.choice(pids)
            else:
                pid, _ = self._process("coordinator" if kind.startswith("coordinator") else "redis")
        except LookupError as exc:
            self.say(f"fault {kind} skipped: {exc}")
            return None
        if kind == DOUBLE:
            return await self._double(pid, at_s)
        fault = Fault(kind, round(at_s, 2), pid)
        notice_s = self.notice_s
        if kind.endswith("-kill"):
            os.kill(pid, signal.SIGKILL)
        else:
            fault.stopped_s = round(self.rng.uniform(*self.stop_s), 2)
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)
            try:
                fault.noticed = await self._noticed(fault.stopped_s, until_noticed=False)
            finally:
                os.kill(pid, signal.SIGCONT)
                self.stopped.discard(pid)
            notice_s = POLL_S * 4  # after SIGCONT: a round under way may still fail
        began = time.monotonic()
        fault.noticed |= await self._noticed(notice_s, until_noticed=True)
        fault.recovered_s = await self._recovered(kind, pid, began)
        return fault

    async def _double(self, shard: int, at_s: float) -> Fault | None:
        """SIGSTOP of shard actor ``shard``; once the coordinator's health shows it down and the
        traffic went on for a moment, kill -9 of the coordinator (then SIGCONT: the dead
        coordinator's Ray goes with it); the wait for the new coordinator."""
        try:
            pid, _ = self._process("coordinator")
        except LookupError as exc:
            self.say(f"fault {DOUBLE} skipped: {exc}")
            return None
        fault = Fault(DOUBLE, round(at_s, 2), pid)
        began = time.monotonic()
        os.kill(shard, signal.SIGSTOP)
        self.stopped.add(shard)
        try:
            fault.noticed = await self._noticed(self.notice_s, until_noticed=True)
            await asyncio.sleep(self.rng.uniform(*self.stop_s) / 2)
            os.kill(pid, signal.SIGKILL)
        finally:
            fault.stopped_s = round(time.monotonic() - began, 2)
            os.kill(shard, signal.SIGCONT)
            self.stopped.discard(shard)
        fault.recovered_s = await self._recovered("coordinator-kill", pid, time.monotonic())
        return fault

    async def _noticed(self, seconds: float, *, until_noticed: bool) -> bool:
        """Whether the coordinator's health shows something not SERVING within ``seconds``
        (all of them, or until it does)."""
        end = time.monotonic() + seconds
        noticed = False
        while time.monotonic() < end and not (noticed and until_noticed):
            noticed |= not await serving(self.health, self.names)
            await asyncio.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
        return noticed

    async def _recovered(self, kind: str, pid: int, began: float) -> float | None:
        """Seconds from ``began`` until SERVING everywhere (and a killed process replaced); None
        if not within ``recover_s``."""
        while time.monotonic() - began < self.recover_s:
            if self._replaced(kind, pid) and await serving(self.health, self.names):
                return round(time.monotonic() - began, 2)
            await asyncio.sleep(POLL_S)
        return None

    def _replaced(self, kind: str, pid: int) -> bool:
        if kind == "shard-kill":
            now = self._shards_now()
            return pid not in now and len(now) >= self.shards
        if kind in ("coordinator-kill", "redis-kill"):
            try:
                return self._process(kind.split("-")[0])[0] != pid
            except LookupError:
                return False
        self._shards_now()
        return True


# ---- the run -----------------------------------------------------------------------------------
@dataclass
class Workload:
    subs: list[Subscription]
    msgs: list[Message]
    subs_file: Path


def read_workload(args, say: Callable[[str], None]) -> Workload:
    """``--subs`` / ``--msgs``, or a workload generated under ``<data-dir>/workload``."""
    if args.subs is None:
        out = Path(args.data_dir) / "workload"
        generate(
            args.gen_subs,
            args.gen_msgs,
            out,
            seed=args.seed,
            dnf_share=0.1,
            circle_share=0.1,
            region_msg_share=0.05,
            moving_share=args.moving_share,
        )
        args.subs, args.msgs = out / "subs.jsonl", out / "msgs.jsonl"
    subs = list(read_subscriptions(args.subs))
    msgs = list(read_messages(args.msgs))
    if not subs or not msgs:
        raise ValidationError("--subs/--msgs", f"{len(subs)}/{len(msgs)}", "need both non-empty")
    say(
        f"workload      {len(subs):,} subscriptions ({sum(s.moving for s in subs):,} moving), "
        f"{len(msgs):,} messages ({args.subs}, {args.msgs})"
    )
    return Workload(subs, msgs, Path(args.subs))


def register_workload(
    w: Workload, how: str, say: Callable[[str], None], *, target: str | Endpoint, cluster=None
) -> dict:
    """Every subscription, durable, at ``target`` (``host:port``, or an ``Endpoint`` with its TLS
    and token): Subscribe calls (``grpc``) or the bulk loader into ``cluster`` (``load``, a
    ``deploy.local.LocalCluster``)."""
    if how == "load":
        return bulk_load(w.subs_file, cluster, say)

    where = Endpoint(target) if isinstance(target, str) else target
    say(f"registration  {len(w.subs):,} Subscribe calls ...")
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        try:
            reg = asyncio.run(
                register_subscriptions(
                    where.target,
                    w.subs,
                    in_flight=REGISTER_IN_FLIGHT,
                    tls=where.tls,
                    token=where.token,
                )
            )
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == REGISTER_ATTEMPTS:
                raise
            say(f"              {exc.details()}; all again (a Subscribe replaces) ...")
            time.sleep(REGISTER_PAUSE_S)
    say(f"              {reg.registered:,} in {reg.seconds:.1f} s")
    if reg.rejected:
        raise ValidationError("--subs", str(w.subs_file), f"{reg.rejected} rejected: {reg.errors}")
    return {"via": "grpc", **reg.as_dict()}


@dataclass
class Traffic:
    """What the clients recorded."""

    publisher: RetryingPublisher
    followed: list[Subscription]
    streams: list
    movers: list[Subscription]
    mover_streams: list
    tracked: list
    move_calls: list[RetryingMoves]
    move_codes: collections.Counter
    crowd: CrowdCounts | None
    injector: Injector
    ttl: float
    drained: bool
    started: float
    finished: float


def _quiet_since(streams) -> float:
    return max((max(s.last_received, s.last_error) for s in streams), default=0.0)


async def run_traffic(cluster, w: Workload, args, progress) -> Traffic:
    """Step 3: every client and the faults at once, then the wait for expiry and quiet."""
    target = cluster.target
    channels: list = []

    def channel():
        ch = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        channels.append(ch)
        return ch

    n = max(1, round(args.rate * args.duration))
    mask = np.random.default_rng(args.seed).random(n) < args.one_shot_share
    publisher = RetryingPublisher(
        w.msgs, n, rate=args.rate, ttl=args.ttl, one_shot_mask=mask, give_up_s=args.give_up
    )
    followed = busiest(w.subs, w.msgs, args.streams, seed=args.seed)
    moving = [s for s in w.subs if s.moving]
    picked = pick_movers(moving, w.msgs, args.movers)
    movers = [s for s, _ in picked]
    tracked_ids = {s.id for s in movers}
    crowd_subs = [s for s in moving if s.id not in tracked_ids]
    give_up = args.give_up
    streams = [ResumingStream(s.id, give_up_s=give_up) for s in followed]
    mover_streams = [ResumingStream(s.id, give_up_s=give_up) for s in movers]
    codes: collections.Counter = collections.Counter()
    tracked = [
        TrackedMover(s, mover_targets(m, w.msgs, n), every_s=args.move_every, seed=args.seed + i)
        for i, (s, m) in enumerate(picked)
    ]
    control = channel()
    health = health_pb2_grpc.HealthStub(control)
    plan = plan_faults(args.faults, args.kinds, args.duration, seed=args.seed)
    injector = Injector(
        Path(cluster.data_dir),
        health,
        cluster.settings.shards,
        plan,
        min_gap_s=args.min_gap,
        stop_s=tuple(args.stop),
        notice_s=2 * cluster.settings.deadline_s + 2.0,
        recover_s=args.recover,
        seed=args.seed,
        say=progress.say,
    )
    stop_moving, stop_crowd = asyncio.Event(), asyncio.Event()
    tasks: list[asyncio.Task] = []
    crowd_task = None
    crowd = CrowdCounts() if crowd_subs and args.crowd_rate > 0 else None
    try:
        reader = pb_grpc.GeoPubSubStub(channel())
        tasks += [asyncio.ensure_future(s.run(reader)) for s in streams]
        mover_stubs = [pb_grpc.GeoPubSubStub(channel()) for _ in movers]
        tasks += [
            asyncio.ensure_future(s.run(stub))
            for s, stub in zip(mover_streams, mover_stubs, strict=True)
        ]
        await warm_up(pb_grpc.GeoPubSubStub(channel()), w.msgs)
        await asyncio.sleep(0.5)
        started = time.time()
        pub_task = asyncio.ensure_future(publisher.run(pb_grpc.GeoPubSubStub(channel())))
        move_calls = [RetryingMoves(s, give_up_s=give_up, codes=codes) for s in mover_stubs]
        mover_tasks = [
            asyncio.ensure_future(m.run(calls, lambda: publisher.sent, stop_moving))
            for m, calls in zip(tracked, move_calls, strict=True)
        ]
        if crowd is not None:
            crowd_task = asyncio.ensure_future(
                crowd_loop(
                    pb_grpc.GeoPubSubStub(channel()),
                    crowd_subs,
                    crowd,
                    rate=args.crowd_rate,
                    seed=args.seed,
                    stop=stop_crowd,
                )
            )
        fault_task = asyncio.ensure_future(injector.run(started, started + args.duration - TAIL_S))
        watch = asyncio.ensure_future(
            _watch(publisher, streams + mover_streams, injector, progress)
        )
        tasks += [pub_task, fault_task, watch, *mover_tasks]
        await pub_task
        await fault_task
        stop_crowd.set()
        progress.say("traffic       published; waiting for SERVING, expiry and quiet streams ...")
        names = health_names(cluster.settings.shards)
        deadline = time.monotonic() + args.recover
        while not await serving(health, names) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        tried = publisher.last_sent[np.isfinite(publisher.last_sent)]
        last = max(float(tried.max(initial=started)), time.time())
        await asyncio.sleep(max(0.0, last + args.ttl + EXPIRY_MARGIN_S - time.time()))
        stop_moving.set()
        for t in asyncio.as_completed(mover_tasks):
            with contextlib.suppress(GaveUp):
                await t
        if crowd_task is not None:
            await asyncio.wait([crowd_task], timeout=args.recover)
        every = streams + mover_streams
        deadline = time.time() + args.recover
        while time.time() - _quiet_since(every) < QUIET_S and time.time() < deadline:
            await asyncio.sleep(QUIET_S / 4)
        drained = time.time() - _quiet_since(every) >= QUIET_S
        finished = time.time()
    finally:
        injector.resume_all()
        await stop_traffic([*tasks, *([crowd_task] if crowd_task else [])], channels)
        progress.done()
    return Traffic(
        publisher,
        followed,
        streams,
        movers,
        mover_streams,
        tracked,
        move_calls,
        codes,
        crowd,
        injector,
        args.ttl,
        drained,
        started,
        finished,
    )


async def _watch(publisher: RetryingPublisher, streams, injector: Injector, progress) -> None:
    """The progress line."""
    t0 = time.time()
    while True:
        await asyncio.sleep(1.0)
        acked = int((publisher.status == ACKED).sum())
        pending = publisher.sent - int((publisher.status != 0).sum())
        progress.show(
            f"  {time.time() - t0:5.0f} s  published {acked:,} acknowledged, {pending:,} pending "
            f"({sum(publisher.codes.values()):,} failed attempts)  faults {len(injector.done)}  "
            f"stream deliveries {sum(s.count for s in streams):,}, "
            f"reconnects {sum(s.reconnects for s in streams):,}"
        )


def check(w: Workload, t: Traffic) -> tuple[list[StreamCheck], list[StreamCheck]]:
    """Step 4: every followed stream."""
    pub = t.publisher
    per_file = BruteMatcher(t.followed).match_batch(w.msgs) if t.followed else []
    matching: dict[str, list[int]] = {s.id: [] for s in t.followed}
    for i, ids in enumerate(per_file):
        for sid in ids:
            matching[sid].append(i)
    n_file = len(w.msgs)
    all_expired = t.drained
    t0 = t.started

    def describe(mid: str) -> str:
        j = pub.index(mid)
        if j < 0:
            return "never published"
        state = {ACKED: "acknowledged", GAVE_UP: "given up", REJECTED: "rejected"}
        text = (
            f"first sent at {pub.first_sent[j] - t0:.1f} s, {pub.attempts[j]} attempt(s), "
            f"{state.get(int(pub.status[j]), 'pending')}"
        )
        if pub.status[j] == ACKED:
            text += f" at {pub.answered_at[j] - t0:.1f} s"
        ttl = "one-shot" if pub.one_shot_mask[j] else f"ttl {t.ttl:g} s"
        return f"{text}, {ttl}, {w.msgs[j % n_file].location}"

    static = []
    for s, st in zip(t.followed, t.streams, strict=True):
        files = matching[s.id]
        expected = {
            f"p{c * n_file + i}"
            for c in range(math.ceil(pub.sent / n_file))
            for i in files
            if c * n_file + i < pub.sent
        }
        static.append(
            check_static(
                s.id,
                st.arrivals,
                expected,
                pub.acked,
                pub.one_shot,
                all_expired=all_expired,
                describe=describe,
            )
        )
    movers = []
    for s, st in zip(t.movers, t.mover_streams, strict=True):

        def matches(mid: str, s=s) -> bool:
            j = pub.index(mid)
            return j >= 0 and keyword_match(s, w.msgs[j % n_file])

        movers.append(
            check_mover(
                s.id, st.arrivals, matches, pub.one_shot, all_expired=all_expired, describe=describe
            )
        )
    return static, movers


def report(cluster, w: Workload, reg: dict, t: Traffic, static, movers, args) -> dict:
    pub = t.publisher
    manifest = local.read_manifest(cluster.data_dir) or {}
    inj = t.injector
    recovered = [f.recovered_s for f in inj.done if f.recovered_s is not None]
    every = totals(static + movers)
    retried = int((pub.attempts > 1).sum())
    crowd = t.crowd
    return {
        "subscriptions": len(w.subs),
        "moving_subscriptions": sum(s.moving for s in w.subs),
        "shards": cluster.settings.shards,
        "registration": reg,
        "duration_s": args.duration,
        "rate": args.rate,
        "ttl_s": args.ttl,
        "one_shot_share": args.one_shot_share,
        "faults": dict(collections.Counter(f.kind for f in inj.done)),
        "faults_injected": len(inj.done),
        "faults_skipped": inj.skipped,
        "faults_unrecovered": inj.unrecovered,
        "fault_log": [asdict(f) for f in inj.done],
        "recovery_s": {
            "p50": round(float(np.median(recovered)), 2) if recovered else None,
            "max": max(recovered, default=None),
        },
        "published": pub.sent,
        "acknowledged": int((pub.status == ACKED).sum()),
        "unacknowledged": int(pub.sent - (pub.status == ACKED).sum()),
        "retried_publishes": retried,
        "rejected_publishes": int((pub.status == REJECTED).sum()),
        "rejections": pub.rejected,
        "publish_failures": dict(pub.codes),
        "tracked_moves": sum(len(m.moves) for m in t.tracked),
        "move_failures": dict(t.move_codes),
        "movers_gave_up": sum(m.gave_up for m in t.move_calls),
        "crowd_moves": crowd.moves if crowd else 0,
        "crowd_streams": crowd.streams if crowd else 0,
        "restarts": {
            "coordinator": (manifest.get("coordinator") or {}).get("restarts", 0),
            "redis": (manifest.get("redis") or {}).get("restarts", 0),
            "shard_actor_processes_seen": len(inj.shard_pids),
        },
        "stream_reconnects": sum(s.reconnects for s in t.streams + t.mover_streams),
        "streams_gave_up": sum(s.gave_up for s in t.streams + t.mover_streams),
        "followed_streams": len(t.streams),
        "tracked_movers": len(t.mover_streams),
        "drained": t.drained,
        "deliveries_checked": every["deliveries"],
        "static": totals(static),
        "movers": totals(movers),
        "lost": every["lost"],
        "lost_removes": every["lost_removes"],
        "duplicated": every["duplicated"],
        "out_of_order": every["out_of_order"],
        "unexpected": every["unexpected"],
        "gaps": every["gaps"],
        "gap_sequences": every["gap_sequences"],
        "findings": findings(static + movers),
        "run_s": round(t.finished - t.started, 1),
    }


def failed(r: dict) -> bool:
    """Exit code 1: anything lost, duplicated, out of order or unexpected, a fault the cluster
    did not recover from, or streams that did not fall quiet (the check saw a partial run)."""
    bad = r["lost"] + r["duplicated"] + r["out_of_order"] + r["unexpected"]
    return bool(bad) or r["faults_unrecovered"] or not r["drained"]


def print_report(r: dict, out) -> None:
    faults = ", ".join(f"{k} {r['faults'].get(k, 0)}" for k in KINDS if k in r["faults"])
    rec = r["recovery_s"]
    st, mv = r["static"], r["movers"]
    codes = ", ".join(f"{k} {v:,}" for k, v in sorted(r["publish_failures"].items()))
    lines = [
        f"geopubsub bench chaos: {r['subscriptions']:,} subscriptions "
        f"({r['moving_subscriptions']:,} moving) on {r['shards']} shards, {r['duration_s']:g} s "
        f"at {r['rate']:,g} msgs/s (ttl {r['ttl_s']:g} s, {r['one_shot_share']:.0%} one-shot)",
        f"  faults         {r['faults_injected']} injected: {faults or 'none'}"
        + (f"; skipped {r['faults_skipped']}" if r["faults_skipped"] else "")
        + (f"; SERVING again after p50 {rec['p50']} s, max {rec['max']} s" if rec["p50"] else "")
        + ("; NOT RECOVERED from the last" if r["faults_unrecovered"] else ""),
        f"  restarts       coordinator {r['restarts']['coordinator']}, redis-server "
        f"{r['restarts']['redis']} (by the supervisor); "
        f"{r['restarts']['shard_actor_processes_seen']} shard actor processes seen",
        f"  publishes      {r['published']:,}: {r['acknowledged']:,} acknowledged, "
        f"{r['unacknowledged']:,} not ({r['rejected_publishes']:,} of them rejected); "
        f"{r['retried_publishes']:,} sent more than once"
        + (f" (failed attempts: {codes})" if codes else ""),
        f"  moves          {r['tracked_moves']:,} of {r['tracked_movers']} tracked movers, "
        f"{r['crowd_moves']:,} crowd moves over {r['crowd_streams']} LocationStream(s)",
        f"  streams        {r['followed_streams']} static + {r['tracked_movers']} movers, "
        f"{r['stream_reconnects']:,} reconnects, {r['streams_gave_up']} gave up"
        + ("" if r["drained"] else "; NOT quiet at the end (the check saw a partial run)"),
        f"  checked        {r['deliveries_checked']:,} deliveries (static + {st['adds']:,} "
        f"- {st['removes']:,}; movers + {mv['adds']:,} - {mv['removes']:,})",
        f"  lost {r['lost']} ({r['lost_removes']} of them REMOVEs)   duplicated {r['duplicated']}   out of order {r['out_of_order']}"
        f"   unexpected {r['unexpected']}   gaps {r['gaps']} ({r['gap_sequences']} sequences)",
    ]
    lines += [f"    rejected: {text}" for text in r["rejections"]]
    lines += [f"    {text}" for text in r["findings"]]
    if r["findings"] or r["rejections"]:
        lines.append("  faults (seconds into the traffic):")
        lines += [
            f"    {f['at_s']:7.1f} s  {f['kind']:16s} pid {f['pid']}"
            + (f", stopped {f['stopped_s']} s" if f["stopped_s"] else "")
            + f", SERVING again after {f['recovered_s']} s"
            for f in r["fault_log"]
        ]
    print("\n".join(lines), file=out)


# ---- the command -------------------------------------------------------------------------------
def register(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "chaos",
        help="kill and stop the cluster's processes under traffic; check every followed stream",
    )
    p.add_argument("--subs", type=Path, help="subscriptions, JSON Lines (else generated)")
    p.add_argument("--msgs", type=Path, help="messages, JSON Lines (with --subs)")
    p.add_argument("--gen-subs", type=int, default=20_000, help="subscriptions generated")
    p.add_argument("--gen-msgs", type=int, default=5_000, help="messages generated")
    p.add_argument("--moving-share", type=float, default=0.1, help="of the generated ones")
    p.add_argument("--data-dir", type=Path, default=Path(".geopubsub/bench-chaos"))
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--register", choices=("grpc", "load"), default="grpc")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of traffic")
    p.add_argument("--rate", type=float, default=200.0, help="messages/s published")
    p.add_argument("--ttl", type=float, default=5.0, help="seconds a stored message is live")
    p.add_argument("--one-shot-share", type=float, default=0.25, help="messages without ttl")
    p.add_argument("--streams", type=int, default=100, help="static result streams followed")
    p.add_argument("--movers", type=int, default=8, help="tracked moving subscribers")
    p.add_argument("--move-every", type=float, default=0.25, help="seconds between their moves")
    p.add_argument("--crowd-rate", type=float, default=50.0, help="moves/s of the others")
    p.add_argument("--faults", type=int, default=10, help="faults injected")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--min-gap", type=float, default=3.0, help="seconds between faults, at least")
    p.add_argument(
        "--stop", type=float, nargs=2, default=(1.0, 5.0), help="a SIGSTOP lasts MIN..MAX s"
    )
    p.add_argument(
        "--deadline", type=float, default=2.0, help="the cluster's deadline_s (default 2 s)"
    )
    p.add_argument(
        "--give-up", type=float, default=120.0, help="a call is retried for this long at most"
    )
    p.add_argument(
        "--recover", type=float, default=180.0, help="longest wait for SERVING after a fault"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)


def _validate(args) -> None:
    for name in ("duration", "rate", "ttl", "move_every", "deadline", "give_up", "recover"):
        if not getattr(args, name) > 0:
            raise ValidationError(f"--{name.replace('_', '-')}", getattr(args, name), "must be > 0")
    for name in ("faults", "streams", "movers", "crowd_rate", "min_gap"):
        if getattr(args, name) < 0:
            raise ValidationError(
                f"--{name.replace('_', '-')}", getattr(args, name), "must be >= 0"
            )
    if args.shards < 1 or args.gen_subs < 1 or args.gen_msgs < 1:
        raise ValidationError("--shards/--gen-subs/--gen-msgs", args.shards, "must be >= 1")
    if not 0 <= args.one_shot_share <= 1:
        raise ValidationError("--one-shot-share", args.one_shot_share, "must be in [0, 1]")
    if not 0 < args.stop[0] <= args.stop[1]:
        raise ValidationError("--stop", args.stop, "must be 0 < MIN <= MAX")
    if args.duration <= LEAD_S + TAIL_S:
        raise ValidationError("--duration", args.duration, f"must be > {LEAD_S + TAIL_S:g}")
    if (args.subs is None) != (args.msgs is None):
        raise ValidationError("--subs/--msgs", str(args.subs or args.msgs), "give both or neither")
    check_files("--subs/--msgs", (args.subs, args.msgs))


def check_files(flag: str, paths) -> None:
    """ValidationError naming ``flag`` for the first of ``paths`` given (not None) that does not
    exist."""
    for path in paths:
        if path is not None and not path.exists():
            raise ValidationError(flag, str(path), "no such file")


@contextlib.contextmanager
def stopped_at_exit(data_dir: Path, say: Callable[[str], None]):
    """Stop the local cluster of ``data_dir`` when the block ends, on error and Ctrl-C too (a
    cluster half started included)."""
    try:
        yield
    finally:
        say("cluster       stopping ...")
        local.down(data_dir, out=io.StringIO())


def say(text: str) -> None:
    """A bench's progress line, on stderr (stdout keeps the report)."""
    print(text, file=sys.stderr, flush=True)


def run(args) -> int:
    _validate(args)
    progress = Progress(sys.stderr)
    data_dir = Path(args.data_dir)
    started = False
    try:
        with sigterm_as_interrupt():
            try:
                w = read_workload(args, progress.say)
                progress.say(f"cluster       starting in {data_dir} (supervised, detached) ...")
                started = True
                cluster = start_supervised(data_dir, args.shards, deadline_s=args.deadline)
                progress.say(f"              SERVING at {cluster.target}")
                reg = register_workload(
                    w, args.register, progress.say, target=cluster.target, cluster=cluster
                )
                freeze_long_lived()
                progress.say(
                    f"traffic       {args.duration:g} s at {args.rate:g} msgs/s, {args.faults} "
                    f"faults ({', '.join(args.kinds)}) ..."
                )
                t = asyncio.run(run_traffic(cluster, w, args, progress))
                progress.say("check         every followed stream ...")
                static, movers = check(w, t)
                r = report(cluster, w, reg, t, static, movers, args)
            except KeyboardInterrupt:
                progress.say("interrupted")
                return 130
            finally:
                if started:
                    progress.say("cluster       stopping ...")
                    local.down(data_dir, out=io.StringIO())
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        return 130
    if args.json:
        print(json.dumps(r))
    else:
        print_report(r, sys.stdout)
    return 1 if failed(r) else 0
