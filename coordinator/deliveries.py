"""The delivery stage: sequence numbers, the Redis retention log and the live result streams.

For every round (in order) it numbers each subscription's deliveries 1, 2, 3, … (continuing
from the log after a restart) and answers the round's callers; a writer task behind it (at most
``WRITE_QUEUE`` rounds behind: backpressure) writes each round's deliveries to the log in one
script call and only then offers them to the open streams. Numbering works on arrays indexed by
the subscriptions' slots (``coordinator.slots``): nothing per delivery goes through a dictionary.
A stream registers, waits until the rounds numbered before it are logged, then reads the log; a
round numbered later offers it its deliveries. So a delivery is either in the log when the
stream reads it or reaches the stream's buffer: a resumed stream misses nothing and, skipping
sequences it has seen, repeats nothing. A stream's buffer is bounded; when a slow consumer lets it fill, new deliveries are
dropped from the buffer (counted) and the stream catches up from the log: publishing never
waits for a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

import numpy as np

from coordinator.convert import to_proto_delivery
from coordinator.engine import Round
from coordinator.metadata import Metadata
from coordinator.slots import UNKNOWN, Slots, number
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
        slots: Slots | None = None,
    ) -> None:
        self.md = md
        self.clock = clock
        self.retention_max = retention_max
        self.retention_s = retention_s
        self.stream_buffer = stream_buffer
        self.slots = slots if slots is not None else Slots()
        """Per-subscription numbering, durability and stream flags, by slot (the engine's)."""
        self.streams: dict[str, set[_Stream]] = defaultdict(set)
        self.delivered = 0
        self.dropped = 0
        self.unlogged = 0
        """Deliveries the log could not take (Redis unreachable)."""
        self._written: asyncio.Queue = asyncio.Queue(WRITE_QUEUE)
        self._writer: asyncio.Task | None = None
        self._numbered = 0
        """Rounds numbered and handed to the writer."""
        self._handled = 0
        """Rounds the writer has logged and offered."""
        self._waiting: list[tuple[int, asyncio.Future]] = []

    @property
    def ephemeral(self) -> set[str]:
        """Subscriptions whose deliveries skip the retention log."""
        return self.slots.ephemeral

    def prime(self, ids: Iterable[str], logged: dict[str, int]) -> None:
        """Know where each placed subscription's numbering continues (its log's last sequence,
        else 0) before any round needs it; a subscription numbered already keeps its number. A
        round that meets an unknown one (placed since) asks the log itself."""
        slot_of, seq = self.slots.slot_of, self.slots.seq
        for sid in ids:
            s = slot_of.get(sid)
            if s is not None and seq[s] == UNKNOWN:
                seq[s] = logged.get(sid, 0)

    async def on_round(self, rnd: Round) -> None:
        tab = self.slots
        kinds, mids, now = rnd.kinds, rnd.msgs, rnd.now
        slots = np.array(rnd.subs, np.int64)
        unknown = slots[tab.seq[slots] == UNKNOWN]
        if unknown.size:  # first delivery since start: continue the log's numbering (an
            # ephemeral subscription may have been durable before: its old log's numbers stay
            # used). Slots do not change meanwhile: the engine waits for this round.
            u = np.unique(unknown).tolist()
            for s, last in zip(
                u, await self.md.last_sequences([tab.ids[s] for s in u]), strict=True
            ):
                if tab.seq[s] == UNKNOWN:
                    tab.seq[s] = last
        seqs = number(tab.seq, slots)
        ids = tab.ids
        log = []
        d = np.flatnonzero(tab.durable[slots])
        if d.size:
            ds = slots[d]
            first_of, first = np.unique(ds, return_index=True)
            due = tab.refreshed[first_of] < now - self.retention_s * REFRESH_SHARE
            refresh = np.zeros(d.size, np.bool_)
            refresh[first[due]] = True
            tab.refreshed[first_of[due]] = now
            log = [
                (ids[s], n, kinds[i], mids[i], r)
                for i, s, n, r in zip(
                    d.tolist(), ds.tolist(), seqs[d].tolist(), refresh.tolist(), strict=True
                )
            ]
        # who follows a delivery is settled now, with the numbering (a stream that opens later
        # waits for this round's log: ``_caught_up``)
        f = np.flatnonzero(tab.followed[slots]) if tab.followed_ids else ()
        followed = (
            [(i, ids[s]) for i, s in zip(f.tolist(), slots[f].tolist(), strict=True)]
            if len(f)
            else []
        )
        # Delivery messages are built only where someone takes them: a move's caller, a stream
        msgs: dict[str, pb.Message] = {}
        built: dict[int, pb.Delivery] = {}

        def delivery(i: int, sid: str) -> pb.Delivery:
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
                x = built[i] = to_proto_delivery(sid, int(seqs[i]), _SIGN[kind], m, time=now)
            return x

        for op, a, b in rnd.spans:
            if op.future.done():
                continue
            if op.kind == "pub":
                op.future.set_result(b - a - sum(kinds[a:b]))
            elif op.kind == "move":
                op.future.set_result([delivery(i, ids[rnd.subs[i]]) for i in range(a, b)])
            else:
                op.future.set_result(None)
        self.delivered += len(slots)
        self._numbered += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        await self._written.put((now, followed, log, rnd.payloads, delivery))

    async def _write_loop(self) -> None:
        """Rounds in order: the retention log first, then the open streams."""
        while True:
            now, followed, log, payloads, delivery = await self._written.get()
            try:
                await self.md.append_log(
                    log, payloads, now, self.retention_max, self.retention_s * (1 + REFRESH_SHARE)
                )
            except Exception:  # Redis away: these deliveries are not retained (counted)
                self.unlogged += len(log)
                _log.warning("could not log %d deliveries", len(log), exc_info=True)
            finally:
                self._offer(followed, delivery)
                self._handled += 1
                if self._waiting:
                    ready = [w for w in self._waiting if w[0] <= self._handled]
                    self._waiting = [w for w in self._waiting if w[0] > self._handled]
                    for _, fut in ready:
                        if not fut.done():
                            fut.set_result(None)
                self._written.task_done()

    def _offer(self, followed: list[tuple[int, str]], delivery) -> None:
        streams = self.streams
        for i, sid in followed:
            for st in streams.get(sid, ()):
                if st.overflowed:
                    continue
                try:
                    st.queue.put_nowait(delivery(i, sid))
                except asyncio.QueueFull:
                    st.overflowed = True
                    self.dropped += 1

    async def _caught_up(self) -> None:
        """Wait until every round numbered so far is logged and offered."""
        mark = self._numbered
        if self._handled >= mark:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((mark, fut))
        await fut

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
        self.slots.set_followed(sub_id, True)
        last = after
        try:
            # rounds numbered before the stream was known may still be on their way to the
            # log: read it once they are there
            await self._caught_up()
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
                self.slots.set_followed(sub_id, False)
