"""Shards that fail, and how the engine heals them: the engine routes and merges rounds; this
module is what happens when a shard's call fails.

A shard whose call fails (its actor died, or did not answer within the deadline its handle
enforces) is *down*: that round's operations on it, and its parts of the rounds still in flight,
fail with UNAVAILABLE, and until it is back the operations routed to it fail at once, without a
call, while the other shards' rounds go on. A task reloads it in the background (retried with
back-off; a shard whose actor is dead for good is first given a new actor by ``replace_shard``)
to what its subscribers were *told* (``coordinator.outages``): the subscriptions as they were
before the first failed round, and the live messages it had, stored again without deliveries.
What it missed since (moves, subscribes, publishes of messages live on the others or waiting
for it) is then applied again in the next round as "redo" operations, with deliveries, so that
every holder ends up with exactly the ADDs and REMOVEs of what it holds.

Publishes that failed only because some of their shards were down took effect on the others:
``partial`` remembers them (a retry is answered, not published again), and ``once`` the one-shot
ones, whose missing shards later add only the subscriptions not reached yet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from coordinator.netting import net
from coordinator.ops import Op, ShardHandle
from coordinator.outages import (
    MISSED_MAX,
    Missed,
    Outage,
    alive,
    dead,
    from_record,
    one_shot_value,
    parse_one_shot,
    record,
    record_field,
    subject,
    told,
)
from coordinator.rounds import Round
from shard.errors import ShardDeadError, UnavailableError
from shard.model import ADD, Message

if TYPE_CHECKING:
    from coordinator.engine import Engine

log = logging.getLogger(__name__)

RELOAD_PAUSE_S = (0.25, 10.0)
"""First and longest pause between two attempts to reload a shard that is down (doubling): a
stopped shard is tried again soon, one that stays away is not called in a tight loop."""
PRUNE_MIN = 1024
"""Unsubscribes remembered (``Recovery.unsubscribed``) before the old ones are first pruned."""
PARTIAL_MAX = 100_000
"""Ids of publishes that failed on some shards and took effect on the others, kept so that a
retry is answered, not published again (the retention log's dedupe keeps them too)."""


class Recovery:
    """The down shards of ``engine``, their reloads, and the publishes they cut short."""

    def __init__(
        self, engine: Engine, replace_shard: Callable[[int], ShardHandle] | None = None
    ) -> None:
        self.engine = engine
        self.replace_shard = replace_shard
        """Makes a new handle for shard k when its actor is dead for good (the factory that
        made the first one)."""
        # the outage records' changes since the last round was merged, which that round's
        # write makes (``take_notes``): in this order, whole records deleted, fields deleted,
        # fields added (the first value kept)
        self.reset: set[int] = set()
        self.settled: set[tuple[int, bytes]] = set()
        self.unsaved: dict[tuple[int, bytes], bytes] = {}
        self.unsubscribed: dict[str, int] = {}
        """Subscriptions unsubscribed -> the sequence number (``Op.seq``) of the last
        unsubscribe, while a shard may still miss something older (``forget``)."""
        self._prune_at = PRUNE_MIN
        self.uncounted: set[int] = set()
        """Shards down from the start (their load failed): the netting counts have none of
        their holders of the live messages (``LiveMessages.holders``) until their reload stores them
        again."""
        self.restarted: dict[int, tuple[list[Missed], dict[bytes, int]]] = {}
        """At start: what the shards that had an outage record apply again once loaded
        (``restart``), with each record field's last item."""
        self.down: dict[int, Outage] = {}
        """Shards being reloaded -> the error their operations get, what they missed."""
        self.reloads: dict[int, asyncio.Task] = {}
        self.generation = [0] * len(engine.shards)
        """Each shard's reload count: a failure of a round sent before a reload says nothing
        about the reloaded shard."""
        self.partial: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Publishes that failed on some of their shards because they were down, and took
        effect on the others (the rest follow once they are back): id -> subscriptions reached
        then, a retry's answer (the newest ``PARTIAL_MAX``)."""
        self.once: dict[str, tuple[Message, bytes, set[int], set[int]]] = {}
        """One-shot messages (ttl 0) whose publish failed on some of their shards because they
        were down, and reached subscriptions on the others: the message, its payload, the
        slots it reached so far, and the shards still to reach (once they are back: ADDs to
        the subscriptions not reached yet)."""

    def note(self, k: int, items: Sequence[Missed]) -> None:
        """Down shard ``k`` missed ``items``: kept to apply again, and for its outage record
        (not those of a subscription unsubscribed since: ``forget``)."""
        outage = self.down[k]
        outage.note(items)
        if outage.overflow:
            return
        unsaved = self.unsaved
        for f, v in record(alive(items, self.unsubscribed)).items():
            unsaved.setdefault((k, f), v)

    def forget(self, sid: str, seq: int) -> None:
        """Subscription ``sid`` is unsubscribed by operation ``seq``: what a shard missed of it
        before, down now or in a round still in flight that fails later, and the unsubscribe,
        are applied again to nobody (``outages.alive``): its subscriber hears no more of it,
        and the id may be subscribed anew, a new subscription that must not get the old one's
        updates. The down shards' outage records lose its field."""
        self._prune()
        self.unsubscribed[sid] = seq
        f = b"s" + sid.encode()
        for k in self.down:
            self.settle(k, {f})

    def _prune(self) -> None:
        """Forget the unsubscribes older than anything a shard may still miss (nothing down,
        no "redo" waiting; the rounds in flight and the one being routed from their lowest
        sequence number on): ``unsubscribed`` stays small. Every time it has doubled."""
        eng = self.engine
        if len(self.unsubscribed) < self._prune_at:
            return
        if not self.down and not (eng.pending and eng.pending[0].kind == "redo"):
            floor = min((sent.floor for sent in eng.inflight), default=eng.floor)
            floor = min(floor, eng.floor)
            self.unsubscribed = {s: q for s, q in self.unsubscribed.items() if q >= floor}
        self._prune_at = max(PRUNE_MIN, 2 * len(self.unsubscribed))

    def settle(self, k: int, fields: set[bytes] | None) -> None:
        """Shard ``k``'s outage record loses ``fields`` (None: all of it) in the next round's
        write: nothing is left to apply again for them."""
        if fields is None:
            self.reset.add(k)
            self.unsaved = {x: v for x, v in self.unsaved.items() if x[0] != k}
            return
        for f in fields:
            self.settled.add((k, f))
            self.unsaved.pop((k, f), None)

    def take_notes(self, rnd: Round) -> None:
        """Give the round being merged the outage records' changes since the last one: its
        write makes them before any of its updates is answered."""
        if self.reset:
            rnd.outage_reset, self.reset = sorted(self.reset), set()
        if self.settled:
            rnd.outage_done.extend(self.settled)
            self.settled = set()
        if self.unsaved:
            rnd.outage_noted = [(k, f, v) for (k, f), v in self.unsaved.items()]
            self.unsaved = {}

    # ---- a coordinator that starts where a killed one left shards down -----------------------
    def restart(
        self,
        records: dict[int, dict[bytes, bytes]],
        per: dict[int, list],
        live: Sequence[tuple[Message, bytes, float]],
        one_shot: Callable[[bytes], Message] | None = None,
    ) -> dict[str, frozenset[int]]:
        """At start, after ``Engine.restore`` and before the loads: the outage records the
        coordinator before left (shard -> fields) turn each such shard's share in ``per`` back
        to what its subscribers were told; what it then applies again with deliveries waits
        in ``restarted`` (``resume``; a shard whose load fails takes it into its outage).
        Returns the ``live`` messages some shards missed: id -> those shards (they get them
        as a "redo", not stored again silently); the one-shot messages they missed are
        ``once`` again (``one_shot`` reads a payload)."""
        eng = self.engine
        skip: dict[str, set[int]] = collections.defaultdict(set)
        for k, fields in records.items():
            on_k = {m.id: m for m, _, _ in live if k in eng.shards_of(m)}
            items = from_record(
                k, fields, eng.router.subs, eng.placement, eng.slots.slot_of, on_k, one_shot
            )
            share, redo = told(
                {s.id: s for s in per.get(k, ())}, items, eng.router.subs.__contains__
            )
            per[k] = share
            last = {record_field(x[0]): i for i, x in enumerate(redo)}
            self.settle(k, set(fields) - last.keys())
            self.restarted[k] = (redo, last)
            slot_of = eng.slots.slot_of
            for x, *_ in redo:
                if x[0] != "pub":
                    continue
                mid = x[1].id
                value = fields.get(b"m" + mid.encode(), b"")
                if value[:1] != b"o":
                    skip[mid].add(k)
                    continue
                payload, ids = parse_one_shot(value)
                got = self.once.setdefault(mid, (x[1], payload, set(), set()))
                got[2].update(slot_of[i] for i in ids if i in slot_of)
                got[3].add(k)
            log.warning(
                "shard %d was down when the coordinator before stopped: loaded as its "
                "subscribers were told, %d changes and messages it missed applied again",
                k,
                len(redo),
            )
        return {m: frozenset(ks) for m, ks in skip.items()}

    def resume(self) -> None:
        """After the loads at start (the engine started): queue what ``restart`` kept for the
        shards that are up, ahead of everything (the live messages stored again go first)."""
        ops = []
        for k, (redo, last) in self.restarted.items():
            if k not in self.down and redo:
                ops += self.redo_ops(k, redo, last)
        self.restarted.clear()
        if ops:
            self.engine.queue_first(ops)

    def down_shards(self) -> dict[int, str]:
        """The shards that are down (being reloaded), with why."""
        return {k: str(o.error) for k, o in self.down.items()}

    async def stop(self) -> None:
        for task in self.reloads.values():
            task.cancel()
        for task in list(self.reloads.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.reloads.clear()

    # ---- a shard fails, is reloaded, and applies what it missed ------------------------------
    def failed(self, k: int, err: BaseException, items: Sequence[Missed] = ()) -> None:
        """Shard ``k`` failed a call (``items``: its part of that round), or its load: it is
        down, its parts of the rounds still in flight fail too, and a task reloads it to what
        its subscribers were told and applies what it missed again."""
        eng = self.engine
        if eng.stopped:
            return
        if k in self.down:
            self.note(k, items)
            return
        why = (str(err).splitlines() or [type(err).__name__])[0]
        outage = self.down[k] = Outage(
            UnavailableError(f"shard {k} is down, being reloaded ({why})")
        )
        self.note(k, items)
        for sent in eng.inflight:  # sent to it before it failed: their parts are lost
            if k in sent.ks and k not in sent.lost:
                sent.lost[k] = outage.error
                self.note(k, items_on(sent.ops, sent.where, sent.per, k))
        # what a reload before gave it to apply again and it has not yet been sent: after those
        stale = eng.take_pending(lambda op: op.kind == "redo" and op.shard == k)
        if stale:
            self.note(k, [op.arg for op in stale])
        log.warning("shard %d is down (%s); reloading it", k, why)
        self.reloads[k] = asyncio.get_running_loop().create_task(
            self._reload(k), name=f"reload-shard-{k}"
        )

    async def _reload(self, k: int) -> None:
        """Load down shard ``k`` until a load succeeds (pausing ``RELOAD_PAUSE_S`` between
        attempts), replacing a dead actor first: with its subscriptions as their subscribers
        were told them and, without deliveries, the live messages it had; then, in the next
        round, what it missed, with deliveries; then it takes rounds again."""
        eng = self.engine
        pause = RELOAD_PAUSE_S[0]
        outage = self.down[k]
        try:
            while not eng.stopped:
                share = {sid: s for sid, s in eng.router.subs.items() if k in eng.placement[sid]}
                if outage.overflow:  # too much missed: loaded as things are now
                    outage.overflow = False
                    outage.missed.clear()
                    self.settle(k, None)
                    log.warning(
                        "shard %d missed more than %d changes: loaded from the current state "
                        "(its moving subscribers' holdings there may differ from what they "
                        "were told)",
                        k,
                        MISSED_MAX,
                    )
                n, since = len(outage.missed), eng.seq
                subs, redo = told(
                    share, alive(outage.missed[:n], self.unsubscribed), eng.router.subs.__contains__
                )
                try:
                    await eng.load_shard(k, subs, eng.tick())
                except Exception as exc:
                    if isinstance(exc, ShardDeadError) and self.replace_shard is not None:
                        try:
                            await self._replace(k, exc)
                        except Exception:  # Ray itself away, say: tried again after the pause
                            log.warning("shard %d: no new actor", k, exc_info=True)
                    log.warning(
                        "shard %d could not be reloaded (%s); trying again in %g s",
                        k,
                        (str(exc).splitlines() or [type(exc).__name__])[0],
                        pause,
                    )
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, RELOAD_PAUSE_S[1])
                    continue
                if outage.overflow:
                    continue
                # routed to it during the load: applied again after what it missed before;
                # a subscription loaded and gone since leaves the shard before anything else
                # (its tag may be another's by now), its other items dropped: every one, not
                # only those whose unsubscribe was routed here (one loaded as it was before it
                # moved away is unsubscribed on its new shards only), and one subscribed anew
                # since is a new one (``Outage.alive``); of the publishes, those of messages
                # still live (the first time each)
                live, exists = eng.live, eng.router.subs.__contains__
                unsubscribed = self.unsubscribed
                gone = {
                    x.id for x in subs if not exists(x.id) or unsubscribed.get(x.id, -1) >= since
                }
                again: set[str] = set()
                items: list[Missed] = []
                for x in alive(redo + outage.missed[n:], unsubscribed):
                    if x[0][0] == "pub":
                        mid = x[0][1].id
                        if mid in again:
                            continue
                        again.add(mid)
                        got = live.get(mid) or self.once.get(mid)
                        if got is None or k not in eng.shards_of(got[0]):
                            continue
                    elif not exists(subject(x[0])):
                        continue
                    items.append(x)
                # the record keeps what is applied again, each field until its last item's
                # round is written
                last = {record_field(x[0]): i for i, x in enumerate(items)}
                self.settle(k, {record_field(x[0]) for x in outage.missed} - last.keys())
                del self.down[k]
                self.generation[k] += 1
                now = eng.tick()
                had = [
                    ("pub", dataclasses.replace(e[0], ttl=eng.live.stored_again(e[0].id, now)))
                    for e in eng.live_in(k)
                    if e[0].id not in again
                ]
                count = k in self.uncounted
                self.uncounted.discard(k)
                if had or gone:  # (one gone since its load leaves first: its tag may be reused)
                    self._replay(k, [("unsub", sid) for sid in gone] + had, now, count)
                if items:
                    eng.queue_first(self.redo_ops(k, items, last))
                eng.stats["shard_reloads"] += 1
                log.warning(
                    "shard %d reloaded with %d subscriptions (%d live messages stored again, "
                    "%d missed changes and %d missed messages applied again)",
                    k,
                    len(subs),
                    len(had),
                    sum(x[0][0] != "pub" for x in items),
                    sum(x[0][0] == "pub" for x in items),
                )
                return
        finally:
            self.reloads.pop(k, None)

    def redo_ops(self, k: int, items: Sequence[Missed], last: dict[bytes, int]) -> list[Op]:
        """The "redo" operations of ``items`` on shard ``k``; ``last``: the index of each
        outage record field's last item (its round deletes the field)."""
        ops = [self.engine.redo_op(x, k) for x in items]
        for f, i in last.items():
            ops[i].clears = f
        return ops

    async def _replace(self, k: int, exc: Exception) -> None:
        """Give shard ``k`` a new actor: Ray gave the old one up for good."""
        eng = self.engine
        old = eng.shards[k]
        eng.shards[k] = self.replace_shard(k)
        eng.stats["shard_replacements"] += 1
        log.warning("shard %d: %s; a new actor replaces it", k, str(exc).splitlines()[0])
        for name in ("kill", "close"):
            end = getattr(old, name, None)
            if end is not None:
                with contextlib.suppress(Exception):
                    result = end()
                    if asyncio.iscoroutine(result):
                        await result

    def _replay(self, k: int, items: list[tuple], now: float, count: bool) -> None:
        """Send the changes missed by reloaded shard ``k`` and its live messages ahead of its
        next round (a handle answers calls in the order made); their updates are nobody's (the
        operations were answered UNAVAILABLE; the live messages' holders were told before,
        and the netting counts still hold them; ``count``: they do not, the shard was down
        from the start, ``uncounted``). If it fails, the shard is down again."""
        eng = self.engine
        generation = self.generation[k]
        call = asyncio.ensure_future(eng.shards[k].apply(items, now))

        def done(task: asyncio.Task) -> None:
            exc = None if task.cancelled() else task.exception()
            if exc is not None and generation == self.generation[k] and not eng.stopped:
                if count:  # (counted when a reload stores them again)
                    self.uncounted.add(k)
                self.failed(k, exc)
            elif exc is None and count:  # who holds what, learnt now
                self._count(items, task.result())

        call.add_done_callback(done)

    def _count(self, items: list[tuple], answer) -> None:
        """Add the holders a shard reports for the messages it stored again (``items``, its
        ``answer``) to the netting counts of the messages stored on several shards."""
        multi = self.engine.live.holders
        parts, tags = answer[1], answer[2]
        tl = tags.tolist() if len(tags) else []
        pos = 0
        for item, n in zip(items, parts, strict=True):
            if type(n) is not int:
                continue
            counts = multi.get(item[1].id) if item[0] == "pub" else None
            if counts is not None:
                for s in tl[pos : pos + n]:
                    counts[s] = counts.get(s, 0) + 1
            pos += n

    # ---- "redo" operations: routed to their shard again, their updates delivered -------------
    def route_redo(self, op: Op, now: float) -> tuple | None:
        """The item a "redo" operation sends its shard now (None: nothing: the message gone, or
        the subscription unsubscribed since the reload listed the item, in a round before this
        one, perhaps subscribed anew: the old one's item would put it back on the shard, under
        the id's slot, and its updates would reach the new one)."""
        eng = self.engine
        item = op.arg[0]
        if item[0] != "pub":
            return None if dead(op.arg, self.unsubscribed) else item
        mid = item[1].id
        if mid in self.once:  # one-shot, as it was
            op.payload = self.once[mid][1]
            return item
        got = eng.live.get(mid)  # stored until its expiry (not at all if it is gone)
        if got is None:
            return None
        op.payload = got[1]
        return ("pub", dataclasses.replace(got[0], ttl=eng.live.stored_again(mid, now)))

    def merge_redo(self, op: Op, part, reached: list, rnd: Round) -> None:
        """Deliver the updates of an item a reloaded shard missed, netted like any other
        (``reached``: the slots a publish reached on that shard)."""
        if isinstance(part, Exception):  # noted missed again
            return
        if op.clears:
            rnd.outage_done.append((op.shard, op.clears))
        eng = self.engine
        item = op.arg[0]
        if item[0] == "pub":
            mid = item[1].id  # (stored: its expiry brings the REMOVEs, even if it is this round's)
            once = self.once.get(mid)
            if once is not None:  # one-shot: ADDs to those the other shards did not reach
                new = [s for s in reached if s not in once[2]]
                once[2].update(new)
                once[3].discard(op.shard)
                if not once[3]:
                    del self.once[mid]
                rnd.extend_adds(new, mid)
                rnd.payloads.setdefault(mid, op.payload)
                return
            rnd.payloads.setdefault(mid, op.payload)
            net([(s, ADD, mid) for s in reached], rnd, eng.live)
            got = eng.live.get(mid)
            if got is not None:  # (a restart stores it again)
                rnd.stored.append((mid, got[2], op.payload))
            return
        # (every update, as for any operation: one unsubscribed later in this round gets its
        # updates up to then; one gone before the reload has no items left to apply)
        slot_of = eng.slots.slot_of
        net([(slot_of[s], g, m) for s, g, m in part if s in slot_of], rnd, eng.live)

    # ---- publishes cut short -----------------------------------------------------------------
    def answered_before(self, msg_id: str) -> int | None:
        """A retry's answer, if ``msg_id`` was published already and took effect on some of its
        shards (the rest follow once they are back)."""
        return self.partial.get(msg_id)

    def failed_publish(
        self,
        op: Op,
        errors: list[Exception],
        reached: int,
        ups: Sequence[tuple] = (),
        down: Sequence[int] = (),
    ) -> None:
        """A publish failed on some shards (``errors``; it reached ``reached`` subscriptions on
        the others). A stored message that failed only because shards are down stays live:
        they get it when they are back, and their holders their ADDs; a retry is answered as
        one (``Engine.publish_many``). Otherwise, if it failed everywhere, it is stored nowhere
        and forgotten (a retry publishes it)."""
        eng = self.engine
        mid = op.arg.id
        outage = all(isinstance(e, UnavailableError) for e in errors)
        if outage and (op.arg.ttl or reached):
            op.partial = True
            self.partial[mid] = reached
            if len(self.partial) > PARTIAL_MAX:
                self.partial.popitem(last=False)
            if not op.arg.ttl:  # delivered by the others: the failed shards add the rest
                reached_ = {u[0] for u in ups}
                self.once[mid] = (op.arg, op.payload, reached_, set(down))
                ids = eng.slots.ids
                value = one_shot_value(op.payload, [ids[s] for s in sorted(reached_)])
                for k in down:  # (it is stored nowhere: its record keeps it)
                    if k in self.down and not self.down[k].overflow:
                        self.unsaved[(k, b"m" + mid.encode())] = value
        elif not reached and len(errors) == len(eng.shards_of(op.arg)):
            eng.live.forget(mid)


def items_on(ops: Sequence[Op], where, per, k: int) -> list[Missed]:
    """Shard ``k``'s items of a round, each with its subscription as it was on ``k`` before it
    (``coordinator.outages``); a message stored again at start is not among them (its holders
    were told)."""
    out: list[Missed] = []
    share = per[k]
    for op, places in zip(ops, where, strict=True):
        for kk, i in places:
            if kk != k:
                continue
            if op.kind == "redo":
                out.append((share[i], op.arg[1], op.seq))
            elif op.kind == "pub":
                if not op.replay:
                    out.append((share[i], None, op.seq))
            elif op.kind == "topk":  # nothing stored: a shard that missed it owes nothing
                continue
            else:
                out.append((share[i], op.prev if k in op.prev_at else None, op.seq))
    return out
