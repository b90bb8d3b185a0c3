"""Shard faults against the engine, differentially: random publishes, subscribes, moves and
unsubscribes over several in-process shards, while shards fail calls (before applying a round,
after applying it — a hung shard whose caller gave up —, or for a while, loads included) and
are reloaded. Every subscriber's told set (its ADDs and REMOVEs in order) must never take an
ADD of a message it holds or a REMOVE of one it does not, and once the shards are back it must
equal, by brute force, the live messages its subscription matches now; at the end, after every
message expired, nothing may be held."""

from __future__ import annotations

import asyncio
import random

import pytest

from coordinator import recovery
from coordinator.engine import Engine
from coordinator.outages import Outage, told
from coordinator.shards import LocalShard
from shard.brute import subscription_matches
from shard.errors import UnavailableError
from shard.model import Message, Point, Rect, Subscription
from shard.partition_map import PartitionMap
from tests.clusters import settled

TERMS = ("a", "b", "c")


class FaultyShard(LocalShard):
    """A shard whose calls are answered in the order made, after a short random pause, and
    which fails on demand: ``fail("before")`` the next round without applying it,
    ``fail("after")`` the next round after applying it, ``dead = True`` every call."""

    def __init__(self, k: int, rng: random.Random) -> None:
        super().__init__(k)
        self.rng = rng
        self.lock = asyncio.Lock()
        self.mode: str | None = None
        self.dead = False

    def fail(self, mode: str) -> None:
        self.mode = mode

    async def apply(self, ops, now):
        async with self.lock:
            await asyncio.sleep(self.rng.random() * 0.002)
            if self.dead:
                raise UnavailableError(f"shard {self.shard_id} is dead")
            mode, self.mode = self.mode, None
            if mode == "before":
                raise UnavailableError(f"shard {self.shard_id} failed")
            out = await super().apply(ops, now)
            if mode == "after":
                raise UnavailableError(f"shard {self.shard_id} did not answer in time")
            return out

    async def load(self, subs, now, tags):
        async with self.lock:
            if self.dead:
                raise UnavailableError(f"shard {self.shard_id} is dead")
            return await super().load(subs, now, tags)


class Told:
    """What the subscribers were told, from the rounds the engine hands on."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.held: dict[str, set[str]] = {}
        self.errors: list[str] = []
        self.one_shot: set[str] = set()
        """Messages not stored (ttl 0): an ADD each, never held."""
        self.once_added: set[tuple[str, str]] = set()
        self.history: dict[str, list[tuple[int, str, str]]] = {}
        """Per subscription id, what it was told and when: (round, "+"/"-"/"unsub", message),
        shown when a check fails."""
        self.rounds = 0
        self.expiry: dict[str, float] = {}
        """When each stored message expires: its publish's round clock plus its ttl. (Not
        ``Round.stored``'s: a message stored again after it expired, on a shard back from a
        fault, is kept ``REPLAY_MIN_TTL_S`` past the clock of the round storing it, and a round
        still in flight reports the expiry a later round's routing gave it.)"""

    async def on_round(self, rnd) -> None:
        self.rounds += 1
        at = 0  # in order: an id unsubscribed and subscribed again in one round holds anew
        for op, _, end in rnd.spans:
            self._take(rnd, at, end)
            at = end
            if op.kind == "unsub":
                self.held.pop(op.arg, None)
                self.history.setdefault(op.arg, []).append((self.rounds, "unsub", ""))
            elif op.kind == "sub":
                self.history.setdefault(op.arg.id, []).append((self.rounds, "sub", str(op.arg)))
            elif op.kind == "pub":
                self.history.setdefault(op.arg.id, []).append((self.rounds, "pub", str(op.arg)))
            elif op.kind == "redo":
                self.history.setdefault("redo", []).append(
                    (self.rounds, "redo", repr(op.arg)[:200])
                )
        self._take(rnd, at, len(rnd.subs))
        for op, _, _ in rnd.spans:  # answered, as the delivery stage does
            if op.kind == "pub" and op.arg.ttl:
                self.expiry[op.arg.id] = rnd.now + op.arg.ttl
            if not op.future.done():
                op.future.set_result(None)

    def _take(self, rnd, start: int, end: int) -> None:
        ids = self.engine.slots.ids
        for slot, kind, i in zip(
            rnd.subs[start:end], rnd.kinds[start:end], rnd.midx[start:end], strict=True
        ):
            sid, mid = ids[slot], rnd.mids[i]
            held = self.held.setdefault(sid, set())
            self.history.setdefault(sid, []).append((self.rounds, "+-"[kind], mid))
            if mid in self.one_shot:
                if kind != 0:
                    self.errors.append(f"{sid}: - {mid}, a one-shot message")
                elif (sid, mid) in self.once_added:
                    self.errors.append(f"{sid}: + {mid} twice, a one-shot message")
                self.once_added.add((sid, mid))
            elif kind == 0:
                if mid in held:
                    self.errors.append(f"{sid}: + {mid} while held")
                held.add(mid)
            else:
                if mid not in held:
                    self.errors.append(f"{sid}: - {mid} not held")
                held.discard(mid)


def _region(rng: random.Random) -> Rect:
    x, y = rng.uniform(0, 9), rng.uniform(0, 9)
    return Rect(x, y, x + rng.uniform(0.5, 3), y + rng.uniform(0.5, 3))


def _message(rng: random.Random, n: int) -> Message:
    terms = tuple(sorted(set(rng.choices(TERMS, k=2))))
    if rng.random() < 0.3:
        x, y = rng.uniform(0, 9), rng.uniform(0, 9)
        loc = Rect(x, y, x + rng.uniform(0.1, 4), y + rng.uniform(0.1, 4))
    else:
        loc = Point(rng.uniform(0, 10), rng.uniform(0, 10))
    return Message(f"m{n}", terms, loc, ttl=rng.choice([0.0, 0.5, 2.0, 5.0]))


async def _answered(futs: list) -> None:
    """Every operation answered (a result or an error), within a bound."""
    done, pending = await asyncio.wait(futs, timeout=10) if futs else (set(), set())
    assert not pending, f"{len(pending)} operations never answered"
    futs.clear()


def _check(engine: Engine, told_: Told, now: float) -> None:
    """Every subscriber holds exactly the live messages it matches; a message past its expiry
    whose REMOVEs wait for a shard to be back is left to the final check (nothing held)."""
    assert told_.errors == [], told_.errors[:10]
    live = [m for m, _, _ in engine.live.values()]
    expired = {m.id for m in live if told_.expiry.get(m.id, now) <= now}
    for sid, sub in engine.subs.items():
        want = {m.id for m in live if m.id not in expired and subscription_matches(sub, m)}
        got = told_.held.get(sid, set()) - expired
        if got != want:
            wrong = sorted(got ^ want)
            facts = {
                m: (m in engine.live and engine.live[m][2], told_.expiry.get(m), now) for m in wrong
            }
            history = [
                h for h in told_.history.get(sid, []) if h[2] in wrong or h[1] in ("sub", "unsub")
            ]
            history += [h for m in wrong for h in told_.history.get(m, [])]
            history += [
                h
                for h in told_.history.get("redo", [])
                if sid in h[2] or any(m in h[2] for m in wrong)
            ]
            raise AssertionError(
                f"{sid} {sub}: held and not matched {sorted(got - want)}, matched and not held "
                f"{sorted(want - got)}; (live expiry, told expiry, now) {facts}; history {history}"
            )


@pytest.mark.parametrize("seed", range(12))
def test_subscribers_are_told_exactly_what_they_hold_through_shard_faults(seed, monkeypatch):
    monkeypatch.setattr("coordinator.recovery.RELOAD_PAUSE_S", (0.001, 0.004))
    monkeypatch.setattr("coordinator.recovery.PRUNE_MIN", 4)  # pruned often, never too much

    async def main():
        rng = random.Random(seed)
        pm = PartitionMap.build([(rng.uniform(0, 10), rng.uniform(0, 10)) for _ in range(200)], 3)
        shards = [FaultyShard(k, rng) for k in range(3)]
        clock = [1000.0]
        told_ = Told()
        engine = Engine(
            shards,
            pm,
            on_round=told_.on_round,
            batch_max=8,
            batch_delay_ms=0.5,
            clock=lambda: clock[0],
            tick_s=0.01,
        )
        told_.engine = engine
        engine.start()
        futs = []
        sent: list = []  # (future, message) of every publish: one that failed is sent again
        n_sub = n_msg = 0
        unsubscribed: list[str] = []  # ids that may be subscribed again, a new subscription
        for step in range(600):
            r = rng.random()
            subs = list(engine.subs)
            if r < 0.25 or not subs:
                if unsubscribed and rng.random() < 0.4:
                    sid = unsubscribed.pop(rng.randrange(len(unsubscribed)))
                else:
                    n_sub += 1
                    sid = f"s{n_sub}"
                sub = Subscription(
                    sid, ((rng.choice(TERMS),),), _region(rng), moving=rng.random() < 0.5
                )
                futs.append(engine.subscribe(sub))
            elif r < 0.55:
                n_msg += 1
                msg = _message(rng, n_msg)
                if not msg.ttl:
                    told_.one_shot.add(msg.id)
                fut = engine.publish_many([msg], [b"p"], ["message"])[0]
                futs.append(fut)
                sent.append((fut, msg))
            elif r < 0.85:
                movers = [s for s in subs if engine.subs[s].moving]
                if movers:
                    p = Point(rng.uniform(0, 10), rng.uniform(0, 10))
                    futs += engine.move_many([(rng.choice(movers), p)], [""])
            elif r < 0.9:
                unsubscribed.append(sid := rng.choice(subs))
                futs.append(engine.unsubscribe(sid))
            elif r < 0.95:
                rng.choice(shards).fail(rng.choice(["before", "after"]))
            else:
                shard = rng.choice(shards)
                shard.dead = True
                asyncio.get_running_loop().call_later(
                    rng.random() * 0.02, setattr, shard, "dead", False
                )
            if rng.random() < 0.1:
                clock[0] += rng.random() * 0.5
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.003)
            if step % 150 == 149:  # settled: exact
                for s in shards:
                    s.dead = False
                    s.mode = None
                await _answered(futs)
                await settled(engine)
                # a publish answered UNAVAILABLE is sent again with its id (as clients do): it
                # may have taken effect on some shards, and must not be delivered twice
                again = [m for f, m in sent if isinstance(f.exception(), UnavailableError)]
                sent.clear()
                futs += [engine.publish_many([m], [b"p"], ["message"])[0] for m in again]
                await _answered(futs)
                await settled(engine)
                _check(engine, told_, clock[0])
        for s in shards:
            s.dead = False
            s.mode = None
        await _answered(futs)
        await settled(engine)
        _check(engine, told_, clock[0])
        clock[0] += 10.0  # every message expires: nothing is held
        for _ in range(5):
            await asyncio.sleep(0.02)
        await settled(engine)
        assert told_.errors == [], told_.errors[:10]
        assert not engine.live
        held = {s: sorted(h) for s, h in told_.held.items() if h}
        assert held == {}, [f"{s}: {m} held" for s, h in held.items() for m in h][:10]
        assert engine.stats["shard_reloads"] > 0
        await engine.stop()

    asyncio.run(main())


class Gated(FaultyShard):
    """A shard whose load, once ``gate`` is set to an event, waits for it."""

    gate: asyncio.Event | None = None

    async def load(self, subs, now, tags):
        if self.gate is not None and not self.dead:
            await self.gate.wait()
        return await super().load(subs, now, tags)


def _two_gated_shards() -> tuple[Gated, Gated, Engine, Told, list]:
    """An engine started over shard 0 (around x = 1) and shard 1 (around x = 9), both
    ``Gated``, on a test clock; what its subscribers are told is kept."""
    rng = random.Random(0)
    a, b = Gated(0, rng), Gated(1, rng)
    clock = [1000.0]
    told_ = Told()
    engine = Engine(
        [a, b],
        PartitionMap.build([(1, 5), (9, 5)], 2),
        on_round=told_.on_round,
        batch_delay_ms=0.5,
        clock=lambda: clock[0],
        tick_s=0.01,
    )
    told_.engine = engine
    engine.start()
    return a, b, engine, told_, clock


async def _unsubscribed_during_its_old_shards_load() -> tuple[Gated, Engine, Told, list]:
    """A moving subscription ``s`` holding ``m`` leaves shard 0 while it is down (which is then
    loaded with it as its subscriber was told) and is unsubscribed, on shard 1 only, while
    that load waits at the gate (still closed)."""
    a, b, engine, told_, clock = _two_gated_shards()
    await engine.subscribe(Subscription("s", (("a",),), Rect(0, 0, 2, 2), moving=True))
    await engine.publish(Message("m", ("a",), Point(1, 1), ttl=5.0), b"p")
    a.dead = True  # down; its first load fails, the second waits at the gate
    await asyncio.gather(engine.move("s", Point(1.2, 1.2)), return_exceptions=True)
    await asyncio.gather(engine.move("s", Point(8.5, 8.5)), return_exceptions=True)
    a.gate, a.dead = asyncio.Event(), False
    await asyncio.sleep(0.05)
    await engine.unsubscribe("s")  # routed to b only
    return a, engine, told_, clock


async def _expire_all(engine: Engine, told_: Told, clock: list) -> None:
    """Every message expires; nobody was told anything wrong; the engine stops."""
    clock[0] += 10.0
    for _ in range(5):
        await asyncio.sleep(0.02)
    await settled(engine)
    assert told_.errors == []
    await engine.stop()


async def _old_one_off_shard_0(a: Gated, engine: Engine, told_: Told, clock: list, m: Message):
    """Shard 0's load goes on (its gate opens): the old ``s`` is not on it afterwards, ``m``
    published there (where the old one was) does not reach the new ``s``, and every message
    expires with nobody told anything wrong."""
    a.gate.set()
    await settled(engine)
    assert a.state.subscriptions(["s"]) == [None]
    await engine.publish(m, b"p")
    await settled(engine)
    assert m.id not in told_.held.get("s", set())
    await _expire_all(engine, told_, clock)


def test_a_subscription_gone_during_its_old_shards_load_leaves_that_shard(monkeypatch):
    """The reloaded shard drops the subscription unsubscribed during its load too, or it stays
    there under a slot the next subscription takes (which got the REMOVEs of the stale one's
    messages)."""
    monkeypatch.setattr("coordinator.recovery.RELOAD_PAUSE_S", (0.02, 0.02))

    async def main():
        a, engine, told_, clock = await _unsubscribed_during_its_old_shards_load()
        a.gate.set()
        await settled(engine)
        assert a.state.subscriptions(["s"]) == [None]
        await engine.subscribe(Subscription("s2", (("b",),), Rect(8, 8, 9, 9)))
        await _expire_all(engine, told_, clock)  # m expires on a: no REMOVE for s2

    asyncio.run(main())


def test_a_subscription_unsubscribed_and_made_again_during_its_old_shards_load_leaves_it(
    monkeypatch,
):
    """As above, but the id is subscribed again (elsewhere) before the load ends: the id
    exists, yet the one loaded is the old one; it leaves the reloaded shard, and its missed
    changes there (a detach, with the REMOVE of ``m``) reach nobody."""
    monkeypatch.setattr("coordinator.recovery.RELOAD_PAUSE_S", (0.02, 0.02))

    async def main():
        a, engine, told_, clock = await _unsubscribed_during_its_old_shards_load()
        await engine.subscribe(Subscription("s", (("a",),), Rect(8, 8, 9, 9)))  # on b
        # m and m2 expire on a: no REMOVE for s
        await _old_one_off_shard_0(a, engine, told_, clock, Message("m2", ("a",), Point(1, 1), 5.0))

    asyncio.run(main())


def test_a_subscription_moved_onto_a_down_shard_and_made_again_during_its_load_stays_off_it(
    monkeypatch,
):
    """A moving ``s`` moves onto shard 0 while it is down (an item it will apply again after
    its load), then, while that load waits, is unsubscribed and subscribed anew on shard 1: the
    old one's item is not applied after the load (it would put the old ``s`` back on shard 0
    under the id's slot, and its updates would reach the new ``s``)."""
    monkeypatch.setattr("coordinator.recovery.RELOAD_PAUSE_S", (0.02, 0.02))

    async def main():
        a, b, engine, told_, clock = _two_gated_shards()
        await engine.subscribe(Subscription("s", (("a",),), Rect(8, 8, 9, 9), moving=True))
        a.dead = True
        await asyncio.gather(engine.move("s", Point(1.2, 1.2)), return_exceptions=True)
        await asyncio.sleep(0.05)  # its first load failed; the next waits at the gate
        a.gate, a.dead = asyncio.Event(), False
        await asyncio.sleep(0.05)
        # (answered UNAVAILABLE: routed to shard 0, still down, and applied there after its load)
        await asyncio.gather(engine.unsubscribe("s"), return_exceptions=True)
        await engine.subscribe(Subscription("s", (("a",),), Rect(8, 8, 9, 9)))
        await _old_one_off_shard_0(
            a, engine, told_, clock, Message("m", ("a",), Point(1.2, 1.2), 5.0)
        )

    asyncio.run(main())


def test_unsubscribes_are_remembered_only_while_a_shard_may_miss_older_items():
    async def main():
        shards = [FaultyShard(k, random.Random(k)) for k in range(2)]
        told_ = Told()
        engine = Engine(shards, PartitionMap.build([(1, 5), (9, 5)], 2), on_round=told_.on_round)
        told_.engine = engine
        engine.start()
        subs = [Subscription(f"s{i}", (("a",),), Rect(0, 0, 2, 2)) for i in range(5000)]
        await asyncio.gather(*engine.subscribe_many(subs))
        for i in range(0, 5000, 100):  # nothing down: the old ones are pruned
            await asyncio.gather(*engine.unsubscribe_many([s.id for s in subs[i : i + 100]]))
        assert len(engine.recovery.unsubscribed) < 2 * recovery.PRUNE_MIN
        await engine.stop()

    asyncio.run(main())


def test_told_undoes_what_the_shard_missed():
    a = Subscription("a", (("x",),), Rect(0, 0, 1, 1), moving=True)
    a2 = Subscription("a", (("x",),), Rect(5, 5, 6, 6), moving=True)
    b = Subscription("b", (("y",),), Rect(0, 0, 1, 1))
    c = Subscription("c", (("y",),), Rect(0, 0, 1, 1))
    missed = [
        (("move", "a", Point(5.5, 5.5)), a, 1),
        (("sub", b, 7), None, 2),
        (("move", "a", Point(0.5, 0.5)), a2, 3),
        (("unsub", "c"), c, 4),
    ]
    share, redo = told({"a": a, "b": b}, missed, {"a", "b"}.__contains__)
    assert share == [a]  # a as it was before its first missed move; b not there yet; c gone
    assert [x[0][0] for x in redo] == ["move", "sub", "move"]


def test_an_outage_past_its_limit_keeps_nothing(monkeypatch):
    monkeypatch.setattr("coordinator.outages.MISSED_MAX", 2)
    o = Outage(UnavailableError("down"))
    o.note([(("unsub", "a"), None, 1)] * 2)
    assert not o.overflow and len(o.missed) == 2
    o.note([(("unsub", "b"), None, 2)])
    assert o.overflow and o.missed == []
    o.note([(("unsub", "c"), None, 3)])
    assert o.missed == []


def test_restore_places_every_subscription_past_the_first_slot_arrays():
    subs = [Subscription(f"s{i}", (("x",),), Rect(0, 0, 1, 1)) for i in range(3000)]
    pm = PartitionMap.build([(0.5, 0.5)], 1)
    engine = Engine([LocalShard(0)], pm, on_round=lambda rnd: None)
    engine.restore(subs)
    slots = [engine.slots.slot_of[s.id] for s in subs]
    assert engine.slots.placed[slots].all() and engine.slots.placed.sum() == 3000
