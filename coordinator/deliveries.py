"""The delivery stage: sequence numbers, the Redis retention log and the live result streams.

For every round (in order) it numbers each subscription's deliveries 1, 2, 3, … (continuing
from the log after a restart) and answers the round's callers; a writer task behind it (at most
``WRITE_QUEUE`` rounds behind: backpressure) writes each round's deliveries to the log in one
script call and only then offers them to the open streams. A stream registers before it reads
the log, so a delivery is either in the log when the stream reads it or reaches the stream's
buffer afterwards: a resumed stream misses nothing and, skipping sequences it has seen, repeats
nothing. A stream's buffer is bounded; when a slow consumer lets it fill, new deliveries are
dropped from the buffer (counted) and the stream catches up from the log: publishing never
waits for a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

from coordinator.convert import to_proto_delivery
from coordinator.engine import Round
from coordinator.metadata import Metadata
from geopubsub.v1 import geopubsub_pb2 as pb

_log = logging.getLogger(__name__)
LOG_READ_BATCH = 1000
WRITE_QUEUE = 4
"""Rounds numbered and answered but not yet logged; a full queue holds up the next round."""
REFRESH_SHARE = 0.25
"""A log's expiry is set again only once this share of the retention time has passed since it was
last set, not on every write; it is set to (1 + this share) x the retention time, so a log (and a
logged message) outlives its last entry's retention by up to this share."""
_SIGN = ("+", "-")


class _Stream:
    __slots__ = ("queue", "overflowed")

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue = asyncio.Queue(size)
        self.overflowed = False


class Deliveries:
    def __init__(
        self,
        md: Metadata,
        *,
        retention_max: int,
        retention_s: float,
        stream_buffer: int,
        clock=time.time,
    ) -> None:
        self.md = md
        self.clock = clock
        self.retention_max = retention_max
        self.retention_s = retention_s
        self.stream_buffer = stream_buffer
        self.seq: dict[str, int] = {}
        self.ephemeral: set[str] = set()
        """Subscriptions whose deliveries skip the retention log."""
        self.streams: dict[str, set[_Stream]] = defaultdict(set)
        self.delivered = 0
        self.dropped = 0
        self.unlogged = 0
        """Deliveries the log could not take (Redis unreachable)."""
        self._written: asyncio.Queue = asyncio.Queue(WRITE_QUEUE)
        self._writer: asyncio.Task | None = None
        self._refreshed: dict[str, float] = {}
        """When each log's expiry was last set (by this process)."""

    def prime(self, ids: Iterable[str], logged: dict[str, int]) -> None:
        """Know where each subscription's numbering continues (its log's last sequence, else 0)
        before any round needs it; a subscription numbered already keeps its number. A round
        that meets an unknown subscription (one registered since) asks the log itself."""
        seq = self.seq
        for sid in ids:
            if sid not in seq:
                seq[sid] = logged.get(sid, 0)

    def forget(self, sub_id: str) -> None:
        self.seq.pop(sub_id, None)
        self._refreshed.pop(sub_id, None)

    async def on_round(self, rnd: Round) -> None:
        subs, kinds, mids, now = rnd.subs, rnd.kinds, rnd.msgs, rnd.now
        seq = self.seq
        ephemeral = self.ephemeral
        reached = set(subs)
        unknown = list(reached.difference(seq))
        if unknown:  # first delivery since start: continue the log's numbering (an ephemeral
            # subscription may have been durable before: its old log's numbers stay used)
            for s, last in zip(unknown, await self.md.last_sequences(unknown), strict=True):
                seq.setdefault(s, last)
        seqs: list[int] = []
        append = seqs.append
        for sid in subs:
            n = seq[sid] + 1
            seq[sid] = n
            append(n)
        log = []
        if not ephemeral.issuperset(reached):
            refreshed = self._refreshed
            stale = now - self.retention_s * REFRESH_SHARE
            for sid, n, kind, mid in zip(subs, seqs, kinds, mids, strict=True):
                if sid not in ephemeral:
                    refresh = refreshed.get(sid, -math.inf) < stale
                    if refresh:
                        refreshed[sid] = now
                    log.append((sid, n, kind, mid, refresh))
        # Delivery messages are built only where someone takes them: a move's caller, a stream
        msgs: dict[str, pb.Message] = {}
        built: dict[int, pb.Delivery] = {}

        def delivery(i: int) -> pb.Delivery:
            x = built.get(i)
            if x is None:
                mid, kind = mids[i], kinds[i]
                m = msgs.get(mid) if kind == 0 else None
                if m is None:
                    m = (
                        pb.Message.FromString(rnd.payloads[mid])
                        if kind == 0
                        else pb.Message(id=mid)
                    )
                    if kind == 0:
                        msgs[mid] = m
                x = built[i] = to_proto_delivery(subs[i], seqs[i], _SIGN[kind], m, time=now)
            return x

        for op, a, b in rnd.spans:
            if op.future.done():
                continue
            if op.kind == "pub":
                op.future.set_result(b - a - sum(kinds[a:b]))
            elif op.kind == "move":
                op.future.set_result([delivery(i) for i in range(a, b)])
            else:
                op.future.set_result(None)
        self.delivered += len(subs)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        await self._written.put((now, subs, reached, log, rnd.payloads, delivery))

    async def _write_loop(self) -> None:
        """Rounds in order: the retention log first, then the open streams."""
        while True:
            now, subs, reached, log, payloads, delivery = await self._written.get()
            try:
                await self.md.append_log(
                    log, payloads, now, self.retention_max, self.retention_s * (1 + REFRESH_SHARE)
                )
            except Exception:  # Redis away: these deliveries are not retained (counted)
                self.unlogged += len(log)
                _log.warning("could not log %d deliveries", len(log), exc_info=True)
            finally:
                self._offer(subs, reached, delivery)
                self._written.task_done()

    def _offer(self, subs: list[str], reached: set[str], delivery) -> None:
        streams = self.streams
        followed = reached.intersection(streams) if streams else None
        if not followed:
            return
        for i, sid in enumerate(subs):
            if sid not in followed:
                continue
            for st in streams[sid]:
                if st.overflowed:
                    continue
                try:
                    st.queue.put_nowait(delivery(i))
                except asyncio.QueueFull:
                    st.overflowed = True
                    self.dropped += 1

    async def drain(self) -> None:
        """Wait until every round handed over is logged and offered, then stop the writer."""
        if self._writer is not None and not self._writer.done():
            await self._written.join()
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        self._writer = None

    async def stream(self, sub_id: str, after: int) -> AsyncIterator[pb.Delivery]:
        """Deliveries of ``sub_id`` with sequence > ``after``: the retained ones from the log,
        then live ones as they come. Never repeats a sequence."""
        st = _Stream(self.stream_buffer)
        self.streams[sub_id].add(st)
        last = after
        try:
            while True:
                while True:
                    rows = await self.md.read_log(sub_id, last, LOG_READ_BATCH)
                    oldest = self.clock() - self.retention_s
                    for n, kind, payload, t in rows:
                        if n <= last:
                            continue
                        last = n
                        if t < oldest:  # past the retention window
                            continue
                        m = pb.Message.FromString(payload)
                        yield to_proto_delivery(sub_id, n, _SIGN[kind], m, time=t)
                    if len(rows) < LOG_READ_BATCH:
                        break
                while not st.overflowed:
                    x = await st.queue.get()
                    if x.sequence <= last:
                        continue
                    yield x
                    last = x.sequence
                # the buffer filled up: drop it and catch up from the log
                while not st.queue.empty():
                    st.queue.get_nowait()
                st.overflowed = False
        finally:
            self.streams[sub_id].discard(st)
            if not self.streams[sub_id]:
                del self.streams[sub_id]
