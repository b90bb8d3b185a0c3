"""Asyncio gRPC traffic shared by ``geopubsub demo`` and ``geopubsub bench e2e``: a paced publisher
over PublishStream, followers of result streams that time every delivery, tracked moving
subscribers (one UpdateLocation at a time, each move and its updates recorded for the oracle
check), a crowd of moving subscribers over one LocationStream, and latency percentiles.

Times are wall-clock seconds (``time.time()``): the clock the coordinator stamps ``Message.time``
(publish received) and ``Delivery.time`` (the round) with, so that client and server times compare
on one machine. A scheduled message's id is ``<prefix><index>``, so a delivery names the publish it
came from without a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from geopubsub.client import Endpoint
from geopubsub.convert import to_proto_message
from geopubsub.tools.oracle_check import MoveRecord, Received
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.applus.tree import recentre
from shard.aptree import APTree
from shard.geometry import region_centre
from shard.model import Message, Point, Subscription

PACE_SLICE_S = 0.002
"""The paced publisher sleeps at least this long between bursts of due messages."""
UNPACED_BURST = 256
"""Messages an unpaced publisher hands to gRPC before it lets the event loop run."""
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 200),
)
_SIGN = {pb.Delivery.ADD: "+", pb.Delivery.REMOVE: "-"}


def channel(where: str | Endpoint, options=CHANNEL_OPTIONS) -> grpc.aio.Channel:
    """An asyncio channel to ``where``: ``host:port`` in plaintext, or an ``Endpoint`` with its
    TLS and token."""
    if isinstance(where, str):
        where = Endpoint(where)
    return where.channel(aio=True, options=options)


class Stubs:
    """``stubs()``: a GeoPubSub stub on a channel of its own to ``where`` (``channel``); a run
    closes them all with ``stop_traffic(tasks, stubs.channels)``."""

    def __init__(self, where: str | Endpoint) -> None:
        self.where = where
        self.channels: list[grpc.aio.Channel] = []

    def __call__(self) -> pb_grpc.GeoPubSubStub:
        ch = channel(self.where)
        self.channels.append(ch)
        return pb_grpc.GeoPubSubStub(ch)


CLOSE_WAIT_S = 2.0


async def stop_traffic(tasks: Sequence[asyncio.Task], channels: Sequence[grpc.aio.Channel]) -> None:
    """Cancel a run's client tasks, wait until they are done, then close its channels."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_channels(channels)


async def close_channels(channels: Sequence[grpc.aio.Channel]) -> None:
    """Close the channels, then let gRPC's own tasks of the calls they cancelled finish. A
    cancelled streaming call leaves a task that completes on the next turns of the loop; if
    ``asyncio.run`` has to cancel it at exit instead, gRPC's shutdown can deadlock."""
    for ch in channels:
        await ch.close()
    me = asyncio.current_task()
    deadline = time.monotonic() + CLOSE_WAIT_S
    while any(t is not me for t in asyncio.all_tasks()) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


# ---- what gets published ----------------------------------------------------------------------
def schedule(
    messages: Sequence[Message], n: int, *, ttl: float, prefix: str = "p"
) -> list[Message]:
    """``n`` messages to publish: the workload's messages in order (cycled when there are fewer),
    with ids ``<prefix>0 .. <prefix>{n-1}`` and the ``ttl`` (0: one-shot).

    >>> m = Message("m", ("a",), Point(0, 0))
    >>> [x.id for x in schedule([m], 3, ttl=5.0)], schedule([m], 1, ttl=5.0)[0].ttl
    (['p0', 'p1', 'p2'], 5.0)
    """
    if not messages and n:
        raise ValueError("no messages to schedule")
    return [
        dataclasses.replace(messages[j % len(messages)], id=f"{prefix}{j}", ttl=ttl or None)
        for j in range(n)
    ]


def message_index(message_id: str, prefix: str = "p") -> int:
    """The schedule index of ``<prefix><index>``, -1 for any other id.

    >>> message_index("p12"), message_index("x")
    (12, -1)
    """
    if message_id.startswith(prefix):
        tail = message_id[len(prefix) :]
        if tail.isdigit():
            return int(tail)
    return -1


def busiest(
    subs: Sequence[Subscription],
    msgs: Sequence[Message],
    k: int,
    *,
    seed: int = 0,
    candidates: int = 20_000,
    sample: int = 4000,
) -> list[Subscription]:
    """Up to ``k`` static subscriptions with the most matches among a random sample of
    ``candidates`` of them, on the first ``sample`` messages: result streams worth following.
    (Ranked with the AP-Tree; whoever checks the streams uses the brute-force oracle.)"""
    static = [s for s in subs if not s.moving]
    picked = random.Random(seed).sample(static, min(candidates, len(static)))
    if not picked:
        return []
    hits: dict[str, int] = {}
    for ids in APTree.build(picked).match_batch(list(msgs[:sample])):
        for i in ids:
            hits[i] = hits.get(i, 0) + 1
    return sorted((s for s in picked if s.id in hits), key=lambda s: (-hits[s.id], s.id))[:k]


# ---- latency ----------------------------------------------------------------------------------
class Latencies:
    """Latency samples in seconds; percentiles over all of them or over those since the last
    ``window()``."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._mark = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)

    def window(self) -> list[float]:
        out = self.samples[self._mark :]
        self._mark = len(self.samples)
        return out

    @staticmethod
    def summary(samples: Sequence[float]) -> dict[str, float | int | None]:
        """``{"n", "p50_ms", "p90_ms", "p99_ms", "max_ms"}`` (None without samples).

        >>> Latencies.summary([0.001, 0.002, 0.003])["p50_ms"]
        2.0
        """
        if not len(samples):
            return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
        a = np.asarray(samples) * 1000.0
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return {
            "n": len(a),
            "p50_ms": round(float(p50), 2),
            "p90_ms": round(float(p90), 2),
            "p99_ms": round(float(p99), 2),
            "max_ms": round(float(a.max()), 2),
        }


# ---- publishing -------------------------------------------------------------------------------
class Publisher:
    """Publishes ``n`` scheduled messages over one PublishStream: ``messages[j % len(messages)]``
    with the id ``<prefix><start + j>`` and the ``ttl``, paced at ``rate`` messages/s (None: as
    fast as the stream takes them). Requests are made as they are sent, from protobufs converted
    once per workload message. Records, per message, when it was due (the pace's intended time:
    latency measured from it includes queueing behind a slow server), when it was handed to gRPC
    and when its answer was read; counts answers and their ``matched``. ``batch`` > 1 sends up to
    that many messages per request (``PublishRequest.messages``); a paced publisher batches only
    the messages that are due together."""

    def __init__(
        self,
        messages: Sequence[Message],
        n: int,
        *,
        ttl: float,
        rate: float | None,
        prefix: str = "p",
        start: int = 0,
        batch: int = 1,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        if not messages and n:
            raise ValueError("no messages to publish")
        self.protos = [to_proto_message(dataclasses.replace(m, ttl=ttl or None)) for m in messages]
        self.n = n
        self.rate = rate
        self.prefix = prefix
        self.start = start
        self.due = np.full(n, math.inf)
        self.sent_at = np.full(n, math.inf)
        self.answered_at = np.full(n, math.inf)
        self.sent = 0
        self.answered = 0
        self.matched = 0
        self.started = 0.0
        self.finished = 0.0

    def _request(self, j: int) -> pb.PublishRequest:
        req = pb.PublishRequest()
        req.message.CopyFrom(self.protos[j % len(self.protos)])
        req.message.id = f"{self.prefix}{self.start + j}"
        return req

    def _batch_request(self, j: int, upto: int) -> pb.PublishRequest:
        req = pb.PublishRequest()
        protos, k = self.protos, len(self.protos)
        for i in range(j, upto):
            m = req.messages.add()
            m.CopyFrom(protos[i % k])
            m.id = f"{self.prefix}{self.start + i}"
        return req

    async def run(self, stub: pb_grpc.GeoPubSubStub, stop: asyncio.Event | None = None) -> None:
        """Publish until every message is answered, or until ``stop`` is set (then the ones sent
        so far are answered first)."""
        n = self.n
        self.started = time.time()

        async def requests():
            t0 = time.time()
            j = 0
            while j < n and not (stop is not None and stop.is_set()):
                now = time.time()
                if self.rate is None:
                    upto = min(n, j + UNPACED_BURST)
                else:
                    upto = min(n, int((now - t0) * self.rate) + 1)
                    if upto <= j:
                        await asyncio.sleep(max(PACE_SLICE_S, t0 + j / self.rate - now))
                        continue
                if self.batch > 1:
                    for a in range(j, upto, self.batch):
                        b = min(upto, a + self.batch)
                        req = self._batch_request(a, b)
                        self.due[a:b] = (
                            now if self.rate is None else t0 + np.arange(a, b) / self.rate
                        )
                        self.sent_at[a:b] = time.time()
                        self.sent = b
                        yield req
                else:
                    for k in range(j, upto):
                        req = self._request(k)
                        self.due[k] = now if self.rate is None else t0 + k / self.rate
                        self.sent_at[k] = time.time()
                        self.sent = k + 1
                        yield req
                j = upto
                if self.rate is None:
                    await asyncio.sleep(0)

        call = stub.PublishStream(requests())
        async for response in call:
            k = len(response.ids) or 1
            self.answered_at[self.answered : self.answered + k] = time.time()
            self.answered += k
            self.matched += response.matched
        self.finished = time.time()

    def due_of(self, message_id: str) -> float:
        """When the message ``<prefix><index>`` was due; inf for a message not from here."""
        return self.times_of(message_id)[0]

    def times_of(self, message_id: str) -> tuple[float, float]:
        """When the message ``<prefix><index>`` was due and when it was handed to gRPC; inf for
        a message not from here."""
        j = message_index(message_id, self.prefix) - self.start
        if 0 <= j < self.sent:
            return float(self.due[j]), float(self.sent_at[j])
        return math.inf, math.inf


# ---- result streams ---------------------------------------------------------------------------
class ResultStream:
    """Follows one subscription's StreamResults; keeps every delivery (``keep``) and calls
    ``on_delivery`` for each."""

    def __init__(
        self,
        sub_id: str,
        *,
        keep: bool = True,
        on_delivery: Callable[[Received], None] | None = None,
    ) -> None:
        self.sub_id = sub_id
        self.keep = keep
        self.on_delivery = on_delivery
        self.deliveries: list[Received] = []
        self.gaps: list[tuple[int, int]] = []
        """Ranges the server said it cannot serve (GAP deliveries): lost to this stream."""
        self.count = 0
        self.last_sequence = 0
        self.last_received = 0.0

    async def run(self, stub: pb_grpc.GeoPubSubStub) -> None:
        """Read until cancelled (cancel the task to stop)."""
        call = stub.StreamResults(
            pb.StreamResultsRequest(id=self.sub_id, after_sequence=self.last_sequence)
        )
        try:
            async for d in call:
                self._take(d)
        finally:
            call.cancel()

    def _take(self, d: pb.Delivery) -> None:
        now = time.time()
        if d.kind == pb.Delivery.GAP:
            self.gaps.append((d.gap_from, d.sequence))
            self.last_sequence = max(self.last_sequence, d.sequence)
            return
        msg = d.message
        r = Received(d.sequence, _SIGN[d.kind], msg.id, d.time, msg.time, now)
        self.count += 1
        self.last_sequence = max(self.last_sequence, d.sequence)
        self.last_received = now
        if self.keep:
            self.deliveries.append(r)
        if self.on_delivery is not None:
            self.on_delivery(r)


RESUME_PAUSE_S = (0.1, 1.0)
"""First and longest pause of a ``ResumingStream`` between reconnections (doubling)."""


class ResumingStream(ResultStream):
    """A ``ResultStream`` of a durable subscription that survives its server: after any error or
    end of its call it reconnects and resumes after the last sequence it got
    (``StreamResults(after_sequence)``). Records every arrival in order (``arrivals``:
    ``(first, last, kind, message id)``, a GAP spanning ``gap_from .. sequence``; ``record``) for
    the checks of loss, repetition and order. Gives up (returns) after ``give_up_s`` in which
    no call stayed open for ``CONNECTED_S``."""

    CONNECTED_S = 1.0

    def __init__(
        self,
        sub_id: str,
        *,
        give_up_s: float,
        record: bool = True,
        on_delivery: Callable[[Received], None] | None = None,
    ) -> None:
        super().__init__(sub_id, keep=False, on_delivery=on_delivery)
        self.give_up_s = give_up_s
        self.record = record
        self.arrivals: list[tuple[int, int, str, str]] = []
        self.reconnects = 0
        self.errors: dict[str, int] = {}
        """Status code name -> how many calls ended with it."""
        self.last_error = 0.0
        self.gave_up = False

    def _take(self, d: pb.Delivery) -> None:
        if self.record:
            if d.kind == pb.Delivery.GAP:
                self.arrivals.append((d.gap_from, d.sequence, "gap", ""))
            else:
                self.arrivals.append((d.sequence, d.sequence, _SIGN[d.kind], d.message.id))
        super()._take(d)

    async def run(self, stub: pb_grpc.GeoPubSubStub) -> None:
        """Read, reconnecting, until cancelled or given up."""
        pause = RESUME_PAUSE_S[0]
        failing_since: float | None = None
        while True:
            began = time.monotonic()
            try:
                await super().run(stub)
                code = "END"  # the server ended the stream (it is stopping)
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            now = time.monotonic()
            self.errors[code] = self.errors.get(code, 0) + 1
            self.last_error = time.time()
            if now - began >= self.CONNECTED_S:
                failing_since, pause = None, RESUME_PAUSE_S[0]
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= self.give_up_s:
                self.gave_up = True
                return
            await asyncio.sleep(pause)
            pause = min(2 * pause, RESUME_PAUSE_S[1])
            self.reconnects += 1


async def wait_quiet(streams: Sequence[ResultStream], quiet_s: float, timeout_s: float) -> bool:
    """Wait until no stream has received anything for ``quiet_s``; False after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        last = max((s.last_received for s in streams), default=0.0)
        if time.time() - last >= quiet_s:
            return True
        await asyncio.sleep(quiet_s / 4)
    return False


# ---- moving subscribers -----------------------------------------------------------------------
@dataclass
class TrackedMover:
    """A moving subscriber driven by a real client: every ``every_s`` it steps towards the location
    of the latest published message its keywords match (so that it keeps meeting messages, and
    leaving them), or wanders when there is none. Its result stream is followed separately."""

    sub: Subscription
    targets: list[tuple[int, Point]]
    """(schedule index, location) of the scheduled messages its keywords match, by index."""
    every_s: float
    seed: int
    step_share: float = 0.5
    """Share of the way to the goal covered by one move..."""
    max_step_deg: float = 8.0
    """...but at most this far: it travels, it does not jump."""
    moves: list[MoveRecord] = field(default_factory=list)

    async def run(
        self,
        stub: pb_grpc.GeoPubSubStub,
        published: Callable[[], int],
        stop: asyncio.Event,
    ) -> None:
        """Move until ``stop``; ``published()`` is how many scheduled messages were sent so far."""
        rng = random.Random(self.seed)
        region = self.sub.region
        here = Point(*region_centre(region))
        t = 0
        while not stop.is_set():
            sent_n = published()
            while t < len(self.targets) and self.targets[t][0] < sent_n:
                t += 1
            if t:
                goal = self.targets[t - 1][1]
                dx, dy = goal.lon - here.lon, goal.lat - here.lat
                scale = min(self.step_share, self.max_step_deg / max(math.hypot(dx, dy), 1e-9))
                lon = here.lon + dx * scale + rng.gauss(0, 0.2)
                lat = here.lat + dy * scale + rng.gauss(0, 0.2)
            else:
                lon = here.lon + rng.gauss(0, 1.0)
                lat = here.lat + rng.gauss(0, 1.0)
            here = Point(
                round(min(max(lon, -180.0), 180.0), 6), round(min(max(lat, -90.0), 90.0), 6)
            )
            sent = time.time()
            response = await stub.UpdateLocation(
                pb.UpdateLocationRequest(id=self.sub.id, point=pb.Point(lon=here.lon, lat=here.lat))
            )
            answered = time.time()
            region = recentre(region, here)
            updates = [
                Received(d.sequence, _SIGN[d.kind], d.message.id, d.time, d.message.time, answered)
                for d in response.updates
            ]
            self.moves.append(MoveRecord(here, region, sent, answered, updates))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)


class Crowd:
    """Many moving subscriptions random-walking over one LocationStream, ``rate`` moves/s (None: as
    fast as the stream takes them); each move shifts a subscription's centre by about
    ``step_deg``. ``batch`` > 1 sends up to that many moves per request (the moves due
    together). Counts the moves sent and the updates streamed back."""

    def __init__(
        self,
        subs: Sequence[Subscription],
        *,
        rate: float | None,
        step_deg: float = 0.05,
        seed: int = 0,
        batch: int = 1,
    ) -> None:
        if not subs:
            raise ValueError("a crowd needs moving subscriptions")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        self.ids = [s.id for s in subs]
        centres = [Point(*region_centre(s.region)) for s in subs]
        self.lon = np.array([c.lon for c in centres])
        self.lat = np.array([c.lat for c in centres])
        self.rate = rate
        self.step_deg = step_deg
        self.rng = np.random.default_rng(seed)
        self.sent = 0
        self.updates = 0
        self.started = 0.0
        self.finished = 0.0

    def _steps(self, n: int) -> list[pb.UpdateLocationRequest]:
        i = (self.sent + np.arange(n)) % len(self.ids)
        d = self.rng.normal(0.0, self.step_deg, (n, 2))
        self.lon[i] = np.clip(self.lon[i] + d[:, 0], -180.0, 180.0)
        self.lat[i] = np.clip(self.lat[i] + d[:, 1], -90.0, 90.0)
        return [
            pb.UpdateLocationRequest(id=self.ids[k], point=pb.Point(lon=x, lat=y))
            for k, x, y in zip(i.tolist(), self.lon[i].tolist(), self.lat[i].tolist(), strict=True)
        ]

    async def run(
        self, stub: pb_grpc.GeoPubSubStub, stop: asyncio.Event, limit: int | None = None
    ) -> None:
        """Move until ``stop`` (or ``limit`` moves), then wait for the stream to finish (every
        move applied)."""
        self.started = time.time()

        async def requests():
            t0 = time.time()
            while not stop.is_set() and (limit is None or self.sent < limit):
                now = time.time()
                due = (
                    UNPACED_BURST if self.rate is None else int((now - t0) * self.rate) - self.sent
                )
                if limit is not None:
                    due = min(due, limit - self.sent)
                if due <= 0:
                    await asyncio.sleep(PACE_SLICE_S)
                    continue
                steps = self._steps(due)
                self.sent += len(steps)
                if self.batch == 1:
                    for req in steps:
                        yield req
                else:
                    for a in range(0, len(steps), self.batch):
                        yield pb.UpdateLocationRequest(
                            moves=[
                                pb.LocationUpdate(id=r.id, point=r.point)
                                for r in steps[a : a + self.batch]
                            ]
                        )
                if self.rate is None:
                    await asyncio.sleep(0)

        async for _ in stub.LocationStream(requests()):
            self.updates += 1
        self.finished = time.time()


# ---- cluster counters -------------------------------------------------------------------------
async def stats(stub: pb_grpc.GeoPubSubStub) -> pb.Stats:
    return await stub.GetStats(pb.GetStatsRequest(), timeout=10.0)
