"""The delivery stage: sequence numbers, the retention log and the live result streams.

For every round (in order) it numbers each subscription's deliveries (``slots.number``: arrays
by slot, one compiled pass) and builds the round's blob of durable deliveries
(``coordinator.retention``). A writer task behind it (at most ``WRITE_QUEUE`` rounds behind:
backpressure) writes each round in one script call, and only then answers the round's callers
and offers its deliveries to the open streams: an acknowledged delivery to a durable
subscription is in Redis. A write that fails (Redis away) is retried until it succeeds; meanwhile
the rounds behind it wait, callers time out, and ``log_failing`` says so (health NOT_SERVING).

Numbers never repeat. A durable subscription's are in the log; an ephemeral one's are covered by
a *lease* in Redis, extended by ``LEASE_STEP`` in the round's own write before its deliveries go
past it, so a restart continues above anything given out.

A stream takes a *mark* (the subscription's last sequence and newest log record) when it opens,
waits until the rounds numbered before are written, reads the log up to the mark and then what
rounds numbered later offer it. What it cannot serve (not retained, never logged) it reports as
a ``GAP`` delivery naming the range, in place; it never skips silently and never repeats a
sequence. A stream's buffer is bounded; when a slow consumer lets it fill, new deliveries are
dropped from the buffer (counted) and the stream takes a new mark and catches up from the log:
publishing never waits for a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import numpy as np

from coordinator.dedupe import Dedupe
from coordinator.retention import SREC, RoundLog, encode_round, message_record, to_message
from coordinator.rounds import Round
from coordinator.slots import Slots, directory, number
from geopubsub.convert import to_proto_delivery
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.errors import OverloadedError, UnavailableError
from shard.model import ADD

_log = logging.getLogger(__name__)
WRITE_QUEUE = 4
"""Rounds numbered but not yet written; a full queue holds up the next round."""
LEASE_STEP = 1024
"""How far an ephemeral subscription's lease is extended past the sequence that needed it."""
RETRY_S = (0.05, 1.0)
"""Back-off between attempts to write a round while Redis fails (first, most)."""
_EXPIRY = struct.Struct("<d")
_POINT = struct.Struct("<dd")


class _Stream:
    """An open stream's buffer: bounded in deliveries and in bytes (serialized size)."""

    __slots__ = ("queue", "overflowed", "bytes", "max_items", "max_bytes", "epoch")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        """Deliveries, and None last when the subscription it follows is unsubscribed."""
        self.epoch = 0
        """The epoch of the subscription it follows (``Slots.epoch``)."""
        self.overflowed = False
        self.bytes = 0
        self.max_items = max_items
        self.max_bytes = max_bytes

    def offer(self, d: pb.Delivery) -> bool:
        """Buffer ``d``; False (and overflowed from now on) if the buffer is full."""
        size = d.ByteSize()
        if self.queue.qsize() >= self.max_items or self.bytes + size > self.max_bytes:
            self.overflowed = True
            return False
        self.bytes += size
        self.queue.put_nowait(d)
        return True

    async def take(self) -> pb.Delivery | None:
        d = await self.queue.get()
        if d is not None:
            self.bytes -= d.ByteSize()
        return d

    def clear(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()
        self.bytes = 0
        self.overflowed = False


@dataclass(slots=True)
class _Written:
    """A numbered round on its way to the writer."""

    rnd: Round
    n: int
    """Its round number in the log (0: nothing to write)."""
    blob: bytes
    pub_ids: list[str]
    leases: list[tuple[bytes, int]]
    state: tuple[list, list, list]
    """The live messages it stored and expired, the positions it moved to
    (``RoundLog.append``)."""
    followed: list[tuple[int, str]]
    delivery: Callable[[int, str], pb.Delivery]
    matched: dict[str, int]
    answers: list[tuple[asyncio.Future, object]]
    """Each operation's answer: a publish's matched count, a move's deliveries."""
    ends: dict[str, tuple[int, int]]
    """The subscriptions the round unsubscribed -> the index of their first delivery after
    the unsubscribe and the epoch it began (their streams from before end there)."""


class Deliveries:
    def __init__(
        self,
        log: RoundLog,
        *,
        retention_max: int,
        retention_s: float,
        stream_buffer: int,
        stream_buffer_bytes: int = 16 << 20,
        max_streams: int = 10_000,
        clock=time.time,
        slots: Slots | None = None,
        dedupe: Dedupe | None = None,
    ) -> None:
        self.log = log
        self.clock = clock
        self.retention_max = retention_max
        self.retention_s = retention_s
        self.stream_buffer = stream_buffer
        self.stream_buffer_bytes = stream_buffer_bytes
        self.max_streams = max_streams
        self.open_streams = 0
        self.slots = slots if slots is not None else Slots()
        """Per-subscription numbering, durability and stream flags, by slot (the engine's)."""
        self.dedupe = dedupe if dedupe is not None else Dedupe()
        self.scorer: Callable[[str, pb.Message], float | None] | None = None
        """The score an ADD to a subscription carries (``coordinator.ranking``: ranked ones)."""
        self.streams: dict[str, set[_Stream]] = defaultdict(set)
        self.delivered = 0
        self.dropped = 0
        self.gaps = 0
        """GAP deliveries sent (ranges a stream could not serve)."""
        self._cuts_at_start: list[tuple[str, int]] = []
        self.log_failures = 0
        self.log_failing: UnavailableError | None = None
        """Why the last attempt to write a round failed (Redis unreachable or full), while it
        has not succeeded since: new operations are refused with it (``check_writable``)."""
        self._written: asyncio.Queue = asyncio.Queue(WRITE_QUEUE)
        self._writer: asyncio.Task | None = None
        self._numbered = 0
        """Rounds numbered and handed to the writer."""
        self._handled = 0
        """Rounds the writer has written, answered and offered."""
        self._waiting: list[tuple[int, asyncio.Future]] = []
        self.on_delivered: list[Callable[[Round, float], None]] = []
        """Each called with a round and ``perf_counter()`` once its deliveries are handed to
        the streams (``coordinator.metrics``, ``coordinator.overview``)."""
        self.on_log_write: Callable[[float], None] | None = None
        """Called with the seconds each successful write of a round to the log took."""

    @property
    def backlog(self) -> int:
        """Rounds numbered and not yet written, answered and offered."""
        return self._numbered - self._handled

    @property
    def ephemeral(self) -> set[str]:
        """Subscriptions whose deliveries skip the retention log."""
        return self.slots.ephemeral

    async def on_round(self, rnd: Round) -> None:
        tab = self.slots
        now = rnd.now
        slots = np.array(rnd.subs, np.int64)
        seqs = number(tab.seq, slots)
        ends, cuts = self._cuts(rnd, slots) if rnd.removed else ({}, [])
        if self._cuts_at_start:
            cuts = self._cuts_at_start + cuts
            self._cuts_at_start = []
        kinds = np.array(rnd.kinds, np.uint8)
        durable = tab.durable[slots]
        # ephemeral subscriptions past their lease: extend it in this round's write
        e = slots[~durable]
        leases: list[tuple[bytes, int]] = []
        if e.size:
            over = np.unique(e[tab.seq[e] > tab.lease[e]])
            if over.size:
                tab.lease[over] = tab.seq[over] + LEASE_STEP
                ib = tab.id_bytes
                leases = list(
                    zip([ib(s) for s in over.tolist()], tab.lease[over].tolist(), strict=True)
                )
        # the round's durable deliveries, grouped by subscription (a record each)
        matched = {}
        pub_ids: list[str] = []
        if self.dedupe.ids:
            pending = self.dedupe.pending
            for op, a, b in rnd.spans:
                if op.kind in ("pub", "topk") and pending(op.arg.id, op.future):
                    if op.future.done() and not op.partial:  # failed: not published, a
                        self.dedupe.forget(op.arg.id)  # retry must publish it
                    else:
                        pub_ids.append(op.arg.id)
                        matched[op.arg.id] = b - a  # a publish's deliveries are ADDs
        d = np.flatnonzero(durable)
        n, blob = 0, b""
        state = (
            [(m.encode(), _EXPIRY.pack(e) + p) for m, e, p in rnd.stored],
            [m.encode() for m in rnd.expired],
            [(sid.encode(), _POINT.pack(x, y)) for sid, x, y in rnd.moved],
            (rnd.outage_reset, rnd.outage_done, rnd.outage_noted),
            rnd.told,
            [(m.encode(), ",".join(map(str, sorted(ks))).encode()) for m, ks in rnd.owed],
        )
        if (
            d.size
            or pub_ids
            or leases
            or rnd.stored
            or rnd.expired
            or rnd.moved
            or rnd.outage_reset
            or rnd.outage_done
            or rnd.outage_noted
            or rnd.told
            or rnd.owed
            or cuts
        ):
            n = self.log.next_round()
            pub_matched = [matched[i] for i in pub_ids]
            blob = self._blob(n, rnd, slots, seqs, kinds, d, pub_matched, pub_ids, cuts)
        # who follows a delivery is settled now, with the numbering (a stream that opens later
        # takes its mark after this round: ``stream``)
        ids = tab.ids
        f = np.flatnonzero(tab.followed[slots]) if tab.followed_ids else ()
        followed = (
            [(i, ids[s]) for i, s in zip(f.tolist(), slots[f].tolist(), strict=True)]
            if len(f)
            else []
        )
        # Delivery messages are built only where someone takes them: a move's caller, a stream
        msgs: dict[int, pb.Message] = {}
        built: dict[int, pb.Delivery] = {}
        mids, midx = rnd.mids, rnd.midx

        def delivery(i: int, sid: str) -> pb.Delivery:
            x = built.get(i)
            if x is None:
                k, kind = midx[i], rnd.kinds[i]
                m = msgs.get(k) if kind == ADD else None
                if m is None:
                    if kind == ADD:
                        m = msgs[k] = pb.Message.FromString(rnd.payloads[mids[k]])
                    else:
                        m = pb.Message(id=mids[k])
                x = built[i] = to_proto_delivery(sid, int(seqs[i]), kind, m, time=now)
                if kind == ADD and self.scorer is not None:
                    score = self.scorer(sid, m)
                    if score is not None:
                        x.score = score
            return x

        answers = []
        for op, a, b in rnd.spans:
            if op.kind in ("pub", "topk"):
                answers.append((op.future, b - a))  # its ADDs
            elif op.kind == "move":
                answers.append((op.future, [delivery(i, ids[slots[i]]) for i in range(a, b)]))
            else:
                answers.append((op.future, None))
        self.delivered += len(slots)
        self._numbered += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        await self._written.put(
            _Written(
                rnd, n, blob, pub_ids, leases, state, followed, delivery, matched, answers, ends
            )
        )

    def cut(self, ids: Iterable[str]) -> None:
        """At start, before any round: these subscriptions are new ones whose Subscribe was
        never told (``Metadata.untold``), so what was numbered under their ids before is an
        earlier subscription's (their floor, written with the first round)."""
        tab = self.slots
        for sid in ids:
            s = tab.slot_of.get(sid)
            if s is not None:
                tab.floor[s] = q = int(tab.seq[s])
                self._cuts_at_start.append((sid, q))

    def _cuts(self, rnd: Round, slots: np.ndarray) -> tuple[dict[str, tuple[int, int]], list]:
        """Where each subscription the round unsubscribed ended: the last sequence numbered
        to it up to its unsubscribe becomes its slot's ``floor`` (an id subscribed again later
        in the round, or after, is a new subscription numbered on from there). Returns the
        index of each one's first delivery after its unsubscribe with the epoch begun there,
        and (id, floor) for the blob."""
        tab = self.slots
        at = [(op.arg, b, tab.slot_of.get(op.arg)) for op, _, b in rnd.spans if op.kind == "unsub"]
        at = [x for x in at if x[2] is not None]
        if not at:
            return {}, []
        hit = np.flatnonzero(np.isin(slots, [s for _, _, s in at]))
        ends, cuts = {}, []
        for sid, b, s in at:
            later = hit[(hit >= b) & (slots[hit] == s)]
            q = int(tab.seq[s]) - later.size
            tab.floor[s] = q
            tab.epoch[s] = e = tab.new_epoch()
            ends[sid] = (int(later[0]) if later.size else len(slots), e)
            cuts.append((sid, q))
        return ends, cuts

    def _blob(self, n, rnd, slots, seqs, kinds, d, pub_matched, pub_ids, cuts) -> bytes:
        """Round ``n``'s blob: the durable deliveries ``d`` grouped by subscription (each
        record chained to the subscription's previous one), the messages they name."""
        tab = self.slots
        ds = slots[d]
        # by subscription, in delivery order within each: the position breaks ties, so a plain
        # sort of unique keys does what a stable one would (numpy's stable sort of ints was
        # ~5x slower on a round's ~10,000)
        if ds.size < 1 << 24:  # slots < 2**39
            order = np.argsort((ds << 24) | np.arange(ds.size), kind="quicksort")
        else:
            order = np.argsort(ds, kind="stable")
        ds = ds[order]
        # runs of one subscription in the sorted slots (np.unique would sort them again)
        starts = np.empty(ds.size, bool)
        starts[:1] = True
        np.not_equal(ds[1:], ds[:-1], out=starts[1:])
        first = np.flatnonzero(starts)
        u = ds[first]
        counts = np.diff(first, append=ds.size)
        recs = np.empty(u.size, SREC)
        recs["prev"] = tab.head[u]
        recs["first"] = seqs[d[order[first]]]
        recs["count"] = counts
        recs["start"] = first
        tab.head[u] = n
        midx = np.asarray(rnd.midx, np.int64)[d[order]]
        # the round's messages these deliveries name, renumbered densely (no sort: midx < mids)
        mids, payloads = rnd.mids, rnd.payloads
        present = np.zeros(len(mids), bool)
        present[midx] = True
        used = np.flatnonzero(present)
        local = (np.cumsum(present) - 1)[midx]
        msgs = [message_record(mids[k], payloads.get(mids[k], b"")) for k in used.tolist()]
        dir_, doff = directory(tab.pool, tab.poff, tab.plen, u)
        return encode_round(
            n,
            rnd.now,
            dir_.tobytes(),
            doff,
            recs,
            kinds[d][order],
            local,
            msgs,
            pub_ids,
            pub_matched,
            cuts,
        )

    async def _write_loop(self) -> None:
        """Rounds in order: written to the log (retried until it takes them), then answered,
        then offered to the open streams."""
        while True:
            w: _Written = await self._written.get()
            try:
                if w.n:
                    await self._write(w)
                self._answer(w)
                self._offer(w.followed, w.delivery, w.ends)
                if self.on_delivered:
                    t = time.perf_counter()
                    for listener in self.on_delivered:
                        listener(w.rnd, t)
            except Exception as exc:  # a bug: this round's callers hear of it, the writer goes
                # on (a writer that died would leave every later round waiting for it)
                _log.critical("the delivery writer failed on a round", exc_info=True)
                err = UnavailableError(f"delivering a round failed ({type(exc).__name__}: {exc})")
                for fut, _ in w.answers:
                    if not fut.done():
                        fut.set_exception(err)
                        fut.exception()
            finally:
                self._handled += 1
                if self._waiting:
                    ready = [x for x in self._waiting if x[0] <= self._handled]
                    self._waiting = [x for x in self._waiting if x[0] > self._handled]
                    for _, fut in ready:
                        if not fut.done():
                            fut.set_result(None)
                self._written.task_done()

    async def _write(self, w: _Written) -> None:
        pause = RETRY_S[0]
        while True:
            try:
                t0 = time.perf_counter()
                dropped = await self.log.append(
                    w.n, w.rnd.now, w.blob, w.pub_ids, w.leases, *w.state
                )
                if self.on_log_write is not None:
                    self.on_log_write(time.perf_counter() - t0)
            except UnavailableError as exc:
                self.log_failures += 1
                if not self.log_failing:
                    _log.warning("the retention log cannot write round %d; retrying: %s", w.n, exc)
                self.log_failing = exc
                await asyncio.sleep(pause)
                pause = min(2 * pause, RETRY_S[1])
                continue
            if self.log_failing:
                _log.warning("the retention log writes again (round %d)", w.n)
            self.log_failing = None
            self.dedupe.logged(w.matched, dropped)
            return

    def check_writable(self) -> None:
        """Refuse a new operation while the log cannot be written: it would only wait behind
        the round being retried (UNAVAILABLE, or RESOURCE_EXHAUSTED when Redis is full)."""
        err = self.log_failing
        if err is not None:
            raise type(err)(f"the retention log cannot be written, retrying: {err}")

    @staticmethod
    def _answer(w: _Written) -> None:
        for fut, value in w.answers:
            if not fut.done():
                fut.set_result(value)

    def _offer(self, followed: list[tuple[int, str]], delivery, ends: dict) -> None:
        """Offer the round's followed deliveries to their streams; a stream whose subscription
        the round unsubscribed gets what came before and then ends (one opened since follows
        the next subscription under the id, and has its mark past these)."""
        streams = self.streams
        for i, sid in followed:
            if sid in ends and i >= ends[sid][0]:
                continue
            for st in streams.get(sid, ()):
                if st.overflowed or not st.offer(delivery(i, sid)):
                    self.dropped += 1  # the stream catches up from the log
        for sid, (_, e) in ends.items():
            for st in streams.get(sid, ()):
                if st.epoch < e:
                    st.queue.put_nowait(None)

    async def _caught_up(self) -> None:
        """Wait until every round numbered so far is written and offered."""
        mark = self._numbered
        if self._handled >= mark:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((mark, fut))
        await fut

    async def drain(self) -> None:
        """Wait until every round handed over is written and offered, stop the writer, and
        set every ephemeral lease to its exact sequence (a clean restart skips no number)."""
        if self._writer is not None and not self._writer.done():
            await self._written.join()
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        self._writer = None
        tab = self.slots
        n = len(tab.ids)
        ahead = np.flatnonzero(tab.lease[:n] > tab.seq[:n]).tolist()
        exact = [(tab.id_bytes(s), int(tab.seq[s])) for s in ahead if tab.ids[s] is not None]
        if exact:
            await self.log.write_leases(exact)
            tab.lease[ahead] = tab.seq[ahead]

    async def extend_leases(self) -> int:
        """Extend the lease of every ephemeral subscription that is at its lease, in bulk (at
        start and after a reload, before rounds run: a round then seldom has one to write).
        Returns how many were written."""
        tab = self.slots
        n = len(tab.ids)
        at = np.flatnonzero(~tab.durable[:n] & (tab.lease[:n] <= tab.seq[:n])).tolist()
        at = [s for s in at if tab.ids[s] is not None]
        if at:
            tab.lease[at] = tab.seq[at] + LEASE_STEP
            await self.log.write_leases([(tab.id_bytes(s), int(tab.lease[s])) for s in at])
        return len(at)

    def _gap(self, sub_id: str, first: int, last: int) -> pb.Delivery:
        self.gaps += 1
        return pb.Delivery(
            subscription_id=sub_id,
            sequence=last,
            kind=pb.Delivery.GAP,
            gap_from=first,
            time=self.clock(),
        )

    async def stream(self, sub_id: str, after: int) -> AsyncIterator[pb.Delivery]:
        """Deliveries of ``sub_id`` with sequence > ``after``: the retained ones from the log,
        then live ones as they come; a GAP in place of what cannot be served. Never repeats a
        sequence. At most ``max_streams`` are open at once (RESOURCE_EXHAUSTED past that).

        A stream follows the subscription under ``sub_id`` when it opens: what an earlier one
        under the id was given (up to ``Slots.floor``) is a GAP to it, and it ends when that
        subscription is unsubscribed."""
        if self.open_streams >= self.max_streams:
            raise OverloadedError(
                f"streams={self.open_streams}: at most max_streams={self.max_streams} result "
                "streams are open at once; close one or retry later"
            )
        st = _Stream(self.stream_buffer, self.stream_buffer_bytes)
        self.open_streams += 1
        self.streams[sub_id].add(st)
        tab = self.slots
        tab.set_followed(sub_id, True)
        last = after
        try:
            while True:
                # the mark: rounds numbered before it are in the log (once written), later ones
                # come to the buffer
                s = tab.slot_of.get(sub_id)
                if s is None:  # removed meanwhile: nothing more comes
                    return
                if not st.epoch:
                    st.epoch = int(tab.epoch[s])
                elif st.epoch != tab.epoch[s]:  # unsubscribed (and maybe made again) meanwhile
                    return
                mark, head, floor = int(tab.seq[s]), int(tab.head[s]), int(tab.floor[s])
                st.clear()
                await self._caught_up()
                if last < floor:  # an earlier subscription's: never read back to this one
                    yield self._gap(sub_id, last + 1, floor)
                    last = floor
                if last < mark:
                    entries = (
                        await self.log.read(
                            sub_id, head, last, keep=self.retention_max, now=self.clock()
                        )
                        if head
                        else []
                    )
                    for e in entries:
                        if e.sequence > mark:
                            break
                        if e.sequence > last + 1:
                            yield self._gap(sub_id, last + 1, e.sequence - 1)
                        d = to_proto_delivery(
                            sub_id, e.sequence, e.kind, to_message(e), time=e.time
                        )
                        if e.kind == ADD and self.scorer is not None:
                            score = self.scorer(sub_id, d.message)
                            if score is not None:
                                d.score = score
                        yield d
                        last = e.sequence
                    if last < mark:
                        yield self._gap(sub_id, last + 1, mark)
                        last = mark
                while not st.overflowed:
                    x = await st.take()
                    if x is None:  # its subscription was unsubscribed
                        return
                    if x.sequence <= last:
                        continue
                    if x.sequence > last + 1:
                        yield self._gap(sub_id, last + 1, x.sequence - 1)
                    yield x
                    last = x.sequence
        finally:
            self.open_streams -= 1
            self.streams[sub_id].discard(st)
            if not self.streams[sub_id]:
                del self.streams[sub_id]
                tab.set_followed(sub_id, False)
