"""The operator's view of the cluster (admin calls, read only): where the subscriptions are
(``GetDensity``) and what happens as it happens (``Watch``), what the live map
(``geopubsub map``) draws.

``density``: every shard counts its subscriptions' centres on the grid (``shard.density``: only
those whose centre its own partition part owns, so each subscription counts once), the
coordinator adds the grids up.

``Watch``: the delivery writer hands every delivered round to ``Watch.on_round`` (after its
streams got it). With nobody watching that is one length check. Each watcher takes from a round
what it asked for into a batch of its own: the published messages up to its rate (the rest
counted as skipped), the expiries of the stored messages it was sent, the moves of the moving
subscriptions it follows; its stream sends the batch every ``BATCH_S``. A watcher never slows a
round: a batch is bounded (``MAX_BATCH``) and what does not fit is counted as skipped.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np

from coordinator.rounds import Round
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.density import grid_shape
from shard.errors import OverloadedError, ValidationError
from shard.model import Subscription, validate_rect
from shard.terms import check_term, normalize_term

BATCH_S = 0.1
"""A watcher's stream sends what gathered at most this often."""
MAX_BATCH = 20_000
"""Messages and moves one batch holds at most; more are counted as skipped."""
DEFAULT_RATE, MAX_RATE = 200, 10_000
"""Published messages a second a watcher is sent: when it asks 0, at most."""
DEFAULT_MOVERS, MAX_MOVERS = 1_000, 10_000
"""Moving subscriptions a watcher follows: when it asks 0, at most."""
MAX_WATCHERS = 64
"""Watch streams open at once at most (each costs the delivery writer a pass over every round);
one more is refused RESOURCE_EXHAUSTED."""
TRACKED_LIVE = 50_000
"""Stored messages a watcher was sent whose expiry it is told: the latest this many."""
WORLD = (-180.0, -90.0, 180.0, 90.0)


def density_view(request: pb.DensityRequest) -> tuple[tuple[float, ...], int, int, str]:
    """A DensityRequest checked: (view, cols, rows, keyword)."""
    view = WORLD
    if request.HasField("view"):
        v = request.view
        view = (v.min_lon, v.min_lat, v.max_lon, v.max_lat)
        validate_rect("view", view)
    cols, rows = grid_shape(request.cols, request.rows)
    return view, cols, rows, _keyword(request.keyword)


async def density(shards: Sequence, boxes: np.ndarray, request: pb.DensityRequest) -> pb.Density:
    """The Density the request asks for, the shards' grids added up."""
    view, cols, rows, keyword = density_view(request)
    grids = await asyncio.gather(
        *(
            s.density(tuple(map(float, boxes[k])), view, cols, rows, keyword)
            for k, s in enumerate(shards)
        )
    )
    total = np.zeros(rows * cols, np.uint64)
    for g in grids:
        total += np.frombuffer(g, "<u4")
    counts = total.astype(np.uint32)
    return pb.Density(
        view=pb.Rect(min_lon=view[0], min_lat=view[1], max_lon=view[2], max_lat=view[3]),
        cols=cols,
        rows=rows,
        counts=counts.tolist(),
        subscriptions=int(total.sum()),
    )


class Watcher:
    """One Watch stream: its filter, its rate, and the batch gathering for it."""

    def __init__(
        self,
        keyword: str,
        rate: int,
        movers: int,
        lookup: Callable[[str], Subscription | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keyword = keyword
        self.rate = rate
        self.max_movers = movers
        self.lookup = lookup
        self.clock = clock
        self.followed: set[str] = set()
        self.live: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.batch = pb.WatchEvents()
        self.ready = asyncio.Event()
        self._second = clock()
        self._sent_in_second = 0

    def _room(self) -> bool:
        """Whether one more published message may be sent now (``rate`` a second)."""
        now = self.clock()
        if now - self._second >= 1.0:
            self._second, self._sent_in_second = now, 0
        if self._sent_in_second >= self.rate or len(self.batch.published) >= MAX_BATCH:
            return False
        self._sent_in_second += 1
        return True

    def _names(self, sub_id: str) -> bool:
        sub = self.lookup(sub_id)
        return sub is not None and any(self.keyword in clause for clause in sub.clauses)

    def take(self, rnd: Round) -> None:
        """Add what this watcher wants of a delivered round to its batch."""
        b = self.batch
        kw = self.keyword
        for op, a, z in rnd.spans:
            if op.kind != "pub" or op.replay or not op.payload:
                continue
            if kw and kw not in op.arg.terms:
                continue
            b.published_count += 1
            if not self._room():
                b.skipped_messages += 1
                continue
            w = b.published.add(matched=z - a)
            w.message.MergeFromString(op.payload)
            if op.arg.ttl:
                self.live[op.arg.id] = None
                if len(self.live) > TRACKED_LIVE:
                    self.live.popitem(last=False)
        if rnd.expired and self.live:
            for mid in rnd.expired:
                if mid in self.live:
                    del self.live[mid]
                    b.expired.append(mid)
        if rnd.moved:
            b.moves_count += len(rnd.moved)
            followed = self.followed
            for sid, lon, lat in rnd.moved:
                if sid not in followed:
                    if len(followed) >= self.max_movers or (kw and not self._names(sid)):
                        continue
                    followed.add(sid)
                if len(b.moved) < MAX_BATCH:
                    m = b.moved.add(id=sid)
                    m.point.lon, m.point.lat = lon, lat
        if rnd.removed and self.followed:
            for sid in rnd.removed:
                if sid in self.followed:
                    self.followed.discard(sid)
                    b.unsubscribed.append(sid)
        self.ready.set()

    def flush(self, now: float) -> pb.WatchEvents:
        out, self.batch = self.batch, pb.WatchEvents()
        out.time = now
        self.ready.clear()
        return out


class Watch:
    """The open Watch streams, fed by the delivery writer (``on_round``)."""

    def __init__(self, lookup: Callable[[str], Subscription | None], clock=time.time) -> None:
        self.lookup = lookup
        self.clock = clock
        self.watchers: set[Watcher] = set()

    def on_round(self, rnd: Round, now: float) -> None:
        for w in self.watchers:
            w.take(rnd)

    async def stream(self, request: pb.WatchRequest) -> AsyncIterator[pb.WatchEvents]:
        keyword = _keyword(request.keyword)
        rate = _bounded("max_messages_per_s", request.max_messages_per_s, DEFAULT_RATE, MAX_RATE)
        movers = _bounded("max_movers", request.max_movers, DEFAULT_MOVERS, MAX_MOVERS)
        if len(self.watchers) >= MAX_WATCHERS:
            raise OverloadedError(
                f"{MAX_WATCHERS} Watch streams are open, at most {MAX_WATCHERS}; close one first"
            )
        w = Watcher(keyword, rate, movers, self.lookup)
        self.watchers.add(w)
        try:
            yield w.flush(self.clock())  # at once: the stream is open
            while True:
                await w.ready.wait()
                await asyncio.sleep(BATCH_S)
                yield w.flush(self.clock())
        finally:
            self.watchers.discard(w)


def _bounded(field: str, value: int, default: int, most: int) -> int:
    if value == 0:
        return default
    if value > most:
        raise ValidationError(field, value, f"must be at most {most:,} (0: {default:,})")
    return value


def _keyword(value: str) -> str:
    """A filter's keyword, normalized like a subscription's ("" stays: no filter)."""
    if not value:
        return ""
    term = normalize_term(value)
    if not term or any(c.isspace() for c in term):
        raise ValidationError("keyword", value, "must be one term (no spaces)")
    return check_term("keyword", term)
