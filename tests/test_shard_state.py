"""``ShardState`` against the from-scratch oracle: batches, detach, bad batches that must leave the
shard untouched, and snapshot / restore that must reproduce every future update."""

from __future__ import annotations

import dataclasses
import math
import pickle
import random

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import shard.state
from shard.applus import recentre
from shard.brute import subscription_matches
from shard.errors import NotFoundError, ValidationError
from shard.geometry import region_centre
from shard.model import ADD, REMOVE, Circle, Message, Point, Rect, Subscription
from shard.state import SNAPSHOT_VERSION, ShardState, _publish_time
from tests.workloads import (
    Mirror,
    apply_op,
    as_moving,
    canonical,
    random_message,
    random_ops,
    random_point,
    random_subscription,
)


def _sub(sid, kw, region, moving=True):
    return Subscription(sid, (tuple(kw),), region, moving=moving)


class ShardVersusOracle(RuleBasedStateMachine):
    """Every batch operation interleaved, plus snapshot/restore and rejected batches; after every
    step a client applying the updates in order holds exactly the oracle's result sets."""

    extras = 0.0
    """The share of subscriptions with each of NOT, a polygon, predicates (and messages then
    carry attributes): ``tests/test_conditions.py``."""

    @initialize(
        theta_p=st.sampled_from([2, 4, 40]),
        fanout=st.sampled_from([4, 9, 200]),
        dup_limit=st.sampled_from([1, 3, 64]),
        t0=st.sampled_from([0.0, 1.7e9 + 0.1]),
    )
    def setup(self, theta_p, fanout, dup_limit, t0):
        self.state = ShardState(
            7, theta_p=theta_p, fanout=fanout, dup_limit=dup_limit, purge_interval=5.0
        )
        self.mirror = Mirror()
        self.now = t0
        self.n = 0

    def _tick(self, dt: float) -> float:
        self.now += dt
        self.mirror.expire(self.now)
        return self.now

    def _pick(self, rng: random.Random, k: int) -> list[str]:
        return [rng.choice(sorted(self.mirror.subs)) for _ in range(k)] if self.mirror.subs else []

    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 8), dt=st.sampled_from([0.0, 0.5, 3.0]))
    def subscribe_batch(self, seed, k, dt):
        rng = random.Random(seed)
        subs = []
        for _ in range(k):
            if self.mirror.subs and rng.random() < 0.3:  # a replacement
                sid = rng.choice(sorted(self.mirror.subs))
            elif subs and rng.random() < 0.15:  # an id new to the shard, given again
                sid = rng.choice(subs).id
            else:
                sid = f"s{self.n}"
                self.n += 1
            sub = random_subscription(rng, sid, extras=self.extras)
            subs.append(as_moving(sub, rng.random() < 0.85))
        now = self._tick(dt)
        self.mirror.apply(self.state.subscribe_batch(subs, now))
        for sub in subs:
            self.mirror.subs[sub.id] = sub

    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 3), dt=st.sampled_from([0.0, 1.0]))
    def unsubscribe_batch(self, seed, k, dt):
        rng = random.Random(seed)
        ids = self._pick(rng, k) + ["never-subscribed"]
        now = self._tick(dt)
        updates = self.state.unsubscribe_batch(ids, now)
        assert all(sign == REMOVE for _, sign, _ in updates)  # expirations only
        self.mirror.apply(updates)
        for sid in ids:
            self.mirror.subs.pop(sid, None)
            self.mirror.held.pop(sid, None)
        assert not any(self.state.has(ids))

    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 3), dt=st.sampled_from([0.0, 1.0]))
    def detach_batch(self, seed, k, dt):
        rng = random.Random(seed)
        holders = sorted(sid for sid in self.mirror.subs if self.mirror.held.get(sid))
        ids = self._pick(rng, k) + ["never-subscribed"]
        if holders:  # mostly subscriptions that hold messages: the interesting case
            ids += rng.sample(holders, min(k, len(holders)))
        now = self._tick(dt)
        self.mirror.apply(self.state.detach_batch(ids, now))
        for sid in ids:
            # the -m updates must have emptied exactly what the client held
            assert not self.mirror.held.get(sid), f"{sid} still holds {self.mirror.held[sid]}"
            self.mirror.subs.pop(sid, None)
        assert not any(self.state.has(ids))

    @rule(
        seed=st.integers(0, 2**32 - 1),
        dt=st.sampled_from([0.0, 0.5, 2.0]),
        ttl=st.sampled_from([None, 0.0, 0.5, 1.0, 2.0, 4.0, 30.0, 0.1]),
        k=st.integers(1, 6),
    )
    def publish_batch(self, seed, dt, ttl, k):
        rng = random.Random(seed)
        msgs = []
        for _ in range(k):
            m = random_message(rng, f"m{self.n}", attributes=self.extras > 0)
            self.n += 1
            if self.mirror.subs and rng.random() < 0.6:  # aimed at a subscription: a match
                target = self.mirror.subs[rng.choice(sorted(self.mirror.subs))]
                terms = tuple(sorted(set(rng.choice(target.clauses)) | set(m.terms[:2])))
                m = Message(
                    m.id, terms, Point(*region_centre(target.region)), attributes=m.attributes
                )
            msgs.append(Message(m.id, m.terms, m.location, ttl=ttl, attributes=m.attributes))
        now = self._tick(dt)
        updates = self.state.publish_batch(msgs, now)
        self.mirror.apply([u for u in updates if u[1] == REMOVE])
        adds = [u for u in updates if u[1] == ADD]
        for m in msgs:
            want = {sid for sid, s in self.mirror.subs.items() if subscription_matches(s, m)}
            assert {sid for sid, _, mid in adds if mid == m.id} == want
        self.mirror.apply([u for u in adds if ttl])  # one-shot messages are not held
        for m in msgs:
            if ttl:
                self.mirror.live[m.id] = (m, now + ttl)

    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 6), dt=st.sampled_from([0.0, 1.0]))
    def move_batch(self, seed, k, dt):
        rng = random.Random(seed)
        movers = sorted(sid for sid, s in self.mirror.subs.items() if s.moving)
        if not movers:
            return
        moves = []
        for _ in range(k):
            live = [m.location for m, _ in self.mirror.live.values()]
            p = rng.choice(live) if live and rng.random() < 0.5 else random_point(rng)
            moves.append(
                (rng.choice(movers), p if isinstance(p, Point) else Point(p.min_lon, p.max_lat))
            )
        now = self._tick(dt)
        self.mirror.apply(self.state.move_batch(moves, now))
        for sid, p in moves:
            old = self.mirror.subs[sid]
            self.mirror.subs[sid] = dataclasses.replace(old, region=recentre(old.region, p))

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 5.0]))
    def advance(self, dt):
        self.mirror.apply(self.state.advance(self._tick(dt)))

    @rule()
    def snapshot_restore(self):
        """The restored shard continues the run: every later step is checked against it."""
        data = self.state.snapshot()
        restored = ShardState.restore(data)
        assert restored.shard_id == 7 and restored.options == self.state.options
        assert restored.now == self.state.now
        ids = sorted(self.mirror.subs)
        assert restored.subscriptions(ids) == self.state.subscriptions(ids)
        live = sorted(self.mirror.live)
        assert restored.messages(live) == self.state.messages(live)
        self.state = restored

    @rule(seed=st.integers(0, 2**32 - 1), dt=st.sampled_from([0.5, 2.0]), which=st.integers(0, 5))
    def rejected_batch(self, seed, dt, which):
        """A batch with one bad item (after good ones) raises and changes nothing, not even the
        clock: the expirations it would have reported come with the next call."""
        rng = random.Random(seed)
        s = self.state
        now = self.now + dt  # the mirror's clock stays: nothing happens
        good = Message(f"m{self.n}", ("t1",), Point(0.5, 0.5), ttl=9.0)
        movers = sorted(sid for sid, sub in self.mirror.subs.items() if sub.moving)
        still = sorted(sid for sid, sub in self.mirror.subs.items() if not sub.moving)
        live = sorted(mid for mid, (_, expiry) in self.mirror.live.items() if expiry > now)
        good_moves = [(rng.choice(movers), random_point(rng)) for _ in range(2)] if movers else []
        if which == 0:
            bad = Message("bad", ("t1",), Point(0, 0), ttl=-1.0)
            call, args, error = s.publish_batch, [good, bad], ValidationError
        elif which == 1 and live:
            dup = Message(rng.choice(live), ("t1",), Point(0, 0), ttl=1.0)
            call, args, error = s.publish_batch, [good, dup], ValidationError
        elif which == 2 and still:
            call, args = s.move_batch, [*good_moves, (rng.choice(still), Point(1, 1))]
            error = ValidationError
        elif which == 3:
            call, args, error = s.move_batch, [*good_moves, ("nobody", Point(0, 0))], NotFoundError
        elif which == 4:
            subs = [_sub(f"s{self.n}", ["a"], Rect(0, 0, 1, 1)), _sub("x", ["a"], Rect(5, 5, 4, 6))]
            call, args, error = s.subscribe_batch, subs, ValidationError
        else:
            call, args, error = (
                s.detach_batch,
                [*(sid for sid, _ in good_moves), 3],
                ValidationError,
            )
        before = (s.now, len(s), s.stats()["live_messages"], s.has(sorted(self.mirror.subs)))
        with pytest.raises(error):
            call(args, now)
        assert (
            s.now,
            len(s),
            s.stats()["live_messages"],
            s.has(sorted(self.mirror.subs)),
        ) == before
        with pytest.raises(ValidationError):
            s.advance(s.now - 1.0)

    @invariant()
    def exact(self):
        self.mirror.assert_exact()
        assert len(self.state) == len(self.mirror.subs)
        self.state.check_invariants()


TestShardVersusOracle = ShardVersusOracle.TestCase
TestShardVersusOracle.settings = settings(max_examples=30, stateful_step_count=35, deadline=None)


# ---- snapshot / restore ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_restore_reproduces_every_future_update(seed):
    """Build, publish ttl messages, move, snapshot; then the same operations on the original and
    on the restored shard give the same updates, call by call."""
    rng = random.Random(seed)
    t0 = 1.7e9 + rng.random()
    subs = [as_moving(random_subscription(rng, f"s{i}"), i % 5 != 0) for i in range(300)]
    movers = [s.id for s in subs if s.moving]
    original = ShardState.build(2, subs, t0, theta_p=8, fanout=16, dup_limit=3, purge_interval=2.0)
    for op in random_ops(rng, movers, 25, t0, 0):
        apply_op(original, op)
    data = original.snapshot()
    restored = ShardState.restore(data)
    assert restored.stats()["live_messages"] == original.stats()["live_messages"] > 0
    ops = random_ops(rng, movers, 60, original.now, 10_000)
    total = 0
    for i, op in enumerate(ops):
        a, b = apply_op(original, op), apply_op(restored, op)
        assert canonical(a) == canonical(b), f"op {i} {op[0]}: {a} != {b}"
        total += len(a)
    assert total > 50  # the comparison saw real traffic
    restored.check_invariants()


def test_restore_keeps_expiry_to_the_float():
    """A restored message expires at the very same ``now``: at 0.1 + 0.2, not at 0.3 (the
    replay time 0.1 + 0.2 - 0.2 is not 0.1, but it gives back the same expiry)."""
    p, ttl = 0.1, 0.2
    assert p + ttl != 0.3 and (p + ttl) - ttl != p
    s = ShardState(0)
    s.subscribe_batch([_sub("s", ["a"], Rect(0, 0, 1, 1))], p)
    s.publish_batch([Message("m", ("a",), Point(0.5, 0.5), ttl)], p)
    r = ShardState.restore(s.snapshot())
    assert r.messages(["m"]) == s.messages(["m"])
    assert s.advance(0.3) == r.advance(0.3) == []
    assert s.advance(p + ttl) == r.advance(p + ttl) == [("s", REMOVE, "m")]


@settings(max_examples=300, deadline=None)
@given(
    p=st.floats(-1e12, 1e12, allow_nan=False),
    ttl=st.floats(1e-9, 1e9, allow_nan=False),
    lag=st.floats(0, 1e6),
)
def test_publish_time_reproduces_the_expiry(p, ttl, lag):
    expiry = p + ttl
    now = p + lag
    if not now < expiry:
        return  # not live at ``now``: never in a snapshot
    q = _publish_time(expiry, ttl, now)
    assert q + ttl == expiry and q <= now


def test_snapshot_is_versioned_and_compact():
    subs = [_sub(f"s{i}", ["a", f"b{i % 7}"], Rect(i % 50, 0, i % 50 + 1, 1)) for i in range(2000)]
    s = ShardState.build(0, subs, 0.0)
    data = s.snapshot()
    assert data[:4] == b"GPSS" and int.from_bytes(data[4:6], "little") == SNAPSHOT_VERSION
    assert len(data) < 120 * len(subs)  # columns, not an object per subscription
    assert len(pickle.dumps(s)) < len(data) + 200
    assert set(s.__getstate__()) == {"snapshot"}  # the tree is derived: not pickled


def test_pickle_round_trip_rebuilds_the_tree():
    s = ShardState(4, theta_p=4)
    s.subscribe_batch(
        [_sub("a", ["x"], Circle(0.5, 0.5, 5e4)), _sub("b", ["x", "y"], Rect(-1, -1, 2, 2), False)],
        1.0,
    )
    s.publish_batch([Message("m", ("x", "y"), Point(0.5, 0.5), ttl=3.0)], 1.0)
    s.move_batch([("a", Point(0.6, 0.6))], 1.5)
    t = pickle.loads(pickle.dumps(s))
    assert (t.shard_id, t.options, t.now) == (4, {"theta_p": 4}, 1.5)
    assert t.subscriptions(["a", "b", "c"]) == [
        Subscription("a", (("x",),), Circle(0.6, 0.6, 5e4), True),
        Subscription("b", (("x", "y"),), Rect(-1, -1, 2, 2), False),
        None,
    ]
    assert canonical(t.advance(4.0)) == [("a", REMOVE, "m"), ("b", REMOVE, "m")]


def test_restore_rejects_foreign_bytes_without_running_them():
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('ran')",))

    s = ShardState(0)
    good = s.snapshot()
    with pytest.raises(ValidationError, match="builtins only"):
        ShardState.restore(good[:6] + pickle.dumps({"x": Boom()}))
    with pytest.raises(ValidationError) as e:
        ShardState.restore(b"GPSS" + (SNAPSHOT_VERSION + 1).to_bytes(2, "little") + good[6:])
    assert e.value.field == "snapshot.version"
    for bad in (b"", b"nope, not a snapshot", good[:-3]):
        with pytest.raises(ValidationError):
            ShardState.restore(bad)
    assert len(ShardState.restore(good)) == 0


def test_empty_shard_round_trip_keeps_an_unset_clock():
    r = ShardState.restore(ShardState(9).snapshot())
    assert (r.shard_id, len(r), r.now) == (9, 0, -math.inf)


# ---- detach, unsubscribe, errors --------------------------------------------------------------
def test_detach_reports_exactly_the_held_messages():
    s = ShardState(0, theta_p=2, fanout=4, dup_limit=1)
    s.subscribe_batch(
        [
            _sub("c", ["a"], Circle(0.0, 0.0, 120_000.0)),
            _sub("r", ["a"], Rect(-1, -1, 1, 1)),
            Subscription("d", (("a", "b"), ("z",)), Rect(-1, -1, 1, 1), moving=True),
        ],
        0.0,
    )
    msgs = [
        Message("in", ("a",), Point(0.5, 0.5), ttl=10),
        Message("corner", ("a",), Point(1.0, 1.0), ttl=10),  # in the rect, outside the circle
        Message("area", ("a", "b"), Rect(0.9, 0.9, 5, 5), ttl=10),
        Message("far", ("a",), Point(3, 3), ttl=10),
        Message("z", ("z",), Point(0, 0), ttl=10),
        Message("once", ("a",), Point(0, 0)),  # one-shot: never held
        Message("soon", ("a",), Point(0, 0), ttl=1),
    ]
    s.publish_batch(msgs, 0.0)
    got = s.detach_batch(["c", "r", "d", "c", "ghost"], 2.0)
    expired = [u for u in got if u[2] == "soon"]
    assert got[: len(expired)] == expired and {u[0] for u in expired} == {"c", "r"}
    # c: 120 km around (0, 0) reaches (0.5, 0.5) (79 km), not (1, 1) nor the area (141 km)
    assert canonical(got[len(expired) :]) == [
        ("c", REMOVE, "in"),
        ("d", REMOVE, "area"),
        ("d", REMOVE, "z"),
        ("r", REMOVE, "area"),
        ("r", REMOVE, "corner"),
        ("r", REMOVE, "in"),
    ]
    assert s.has(["c", "r", "d"]) == [False, False, False] and len(s) == 0
    s.check_invariants()


def test_unsubscribe_is_idempotent_and_reports_only_expirations():
    s = ShardState(0)
    s.subscribe_batch([_sub("a", ["x"], Rect(0, 0, 1, 1)), _sub("b", ["x"], Rect(0, 0, 1, 1))], 0)
    s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)], 0.0)
    assert s.unsubscribe_batch(["a", "a", "nobody"], 0.5) == []
    assert s.unsubscribe_batch(["a"], 1.0) == [("b", REMOVE, "m")]
    assert s.has(["a", "b"]) == [False, True]


def test_rejected_batches_keep_pending_expirations():
    """APPlusTree advances before it validates; the shard validates first, so a rejected batch
    loses no expiration."""
    s = ShardState(0)
    subs = [_sub("a", ["x"], Rect(0, 0, 1, 1)), _sub("still", ["x"], Rect(0, 0, 1, 1), False)]
    s.subscribe_batch(subs, 0.0)
    s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)], 0.0)
    with pytest.raises(ValidationError) as e:
        s.move_batch([("a", Point(3, 3)), ("still", Point(1, 1))], 5.0)
    assert (e.value.field, e.value.value) == ("moves[1].id", "still")
    with pytest.raises(ValidationError) as e:
        s.move_batch([("a", Point(200, 0))], 5.0)
    assert (e.value.field, e.value.value) == ("moves[0].point[0]", 200)
    with pytest.raises(NotFoundError):
        s.move_batch([("a", Point(3, 3)), ("nobody", Point(1, 1))], 5.0)
    with pytest.raises(ValidationError) as e:
        s.publish_batch(
            [Message("n", ("x",), Point(0, 0), ttl=2.0), Message("n", ("x",), Point(1, 0), ttl=2)],
            5.0,
        )
    assert e.value.field == "messages[1].id"
    with pytest.raises(ValidationError) as e:
        s.publish_batch([Message("n", ("x",), Rect(1, 0, 0, 1))], 5.0)
    assert e.value.field == "messages[0].location[2]"
    with pytest.raises(ValidationError) as e:
        s.subscribe_batch(
            [_sub("b", ["x"], Rect(0, 0, 1, 1)), _sub("", ["x"], Rect(0, 1, 2, 3))], 5.0
        )
    assert e.value.field == "subs[1].id"
    with pytest.raises(ValidationError) as e:
        s.detach_batch(["a", 3], 5.0)
    assert e.value.field == "ids[1]"
    with pytest.raises(ValidationError) as e:
        s.advance(math.nan)
    assert e.value.field == "now"
    assert s.now == 0.0 and s.has(["a", "b"]) == [True, False]
    assert s.subscriptions(["a"])[0].region == Rect(0, 0, 1, 1)  # no move was applied
    assert canonical(s.advance(5.0)) == [("a", REMOVE, "m"), ("still", REMOVE, "m")]


def test_a_message_id_may_be_reused_once_expired():
    s = ShardState(0)
    s.subscribe_batch([_sub("a", ["x"], Rect(0, 0, 1, 1))], 0.0)
    s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)], 0.0)
    assert s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)], 1.0) == [
        ("a", REMOVE, "m"),
        ("a", ADD, "m"),
    ]


def test_stats_and_lookups():
    s = ShardState.build(
        5,
        [_sub("a", ["x"], Rect(0, 0, 1, 1)), _sub("b", ["x"], Rect(0, 0, 1, 1), False)],
        0.0,
    )
    s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=4.0)], 1.0)
    st_ = s.stats()
    assert {k: st_[k] for k in ("shard_id", "now", "subscriptions", "moving", "live_messages")} == {
        "shard_id": 5,
        "now": 1.0,
        "subscriptions": 2,
        "moving": 1,
        "live_messages": 1,
    }
    assert st_["tree"]["subscriptions"] == 2
    assert s.messages(["m", "x"]) == [Message("m", ("x",), Point(0.5, 0.5), ttl=4.0), None]


def test_options_must_be_plain_values():
    with pytest.raises(ValidationError) as e:
        ShardState(0, theta_p=object())
    assert e.value.field == "theta_p"
    with pytest.raises(ValidationError):
        ShardState(-1)


@pytest.mark.parametrize("seed", range(3))
def test_publish_tagged_reports_the_tags_of_publish_grouped_ids(seed):
    """Tags given at build and at subscribe (replacements, removals and moves in between,
    slots recycled) are what publish_tagged reports for exactly the subscriptions
    publish_grouped names; snapshots keep them."""
    rng = random.Random(seed)
    subs = [random_subscription(rng, f"s{i}") for i in range(150)]
    tag = {s.id: 1000 + i for i, s in enumerate(subs)}
    st = ShardState.build(0, subs, 0.0, tags=[tag[s.id] for s in subs])
    now, reached = 1.0, 0
    for r in range(6):
        gone = rng.sample(sorted(tag), 10)
        st.unsubscribe_batch(gone, now)
        for sid in gone:
            del tag[sid]
        again = rng.sample(sorted(tag), 3)  # replaced, tagged anew
        fresh = [random_subscription(rng, f"n{r}-{i}") for i in range(12)]
        for i, s in enumerate(fresh):
            tag[s.id] = 5000 + 100 * r + i
        for sid in again:
            tag[sid] += 7
        st.subscribe_batch(
            fresh + [st.subscriptions([sid])[0] for sid in again],
            now,
            [tag[s.id] for s in fresh] + [tag[sid] for sid in again],
        )
        if r == 3:
            st = ShardState.restore(st.snapshot())
        msgs = [random_message(rng, f"m{r}-{i}") for i in range(40)]
        twin = ShardState.restore(st.snapshot())
        _, groups = twin.publish_grouped(msgs, now)
        _, tags, counts = st.publish_tagged(msgs, now)
        assert counts.tolist() == [len(g) for g in groups]
        ends = np.cumsum(counts).tolist()
        for g, a, b in zip(groups, [0, *ends[:-1]], ends, strict=True):
            assert sorted(tags[a:b].tolist()) == sorted(tag[sid] for sid in g)
        reached += int(counts.sum())
        now += 1.0
    assert reached > 50


def test_tags_are_checked_and_an_untagged_subscription_reports_minus_one():
    s = _sub("a", ["x"], Rect(0, 0, 1, 1))
    with pytest.raises(ValidationError, match="tags"):
        ShardState.build(0, [s], 0.0, tags=[1, 2])
    st = ShardState(0)
    with pytest.raises(ValidationError, match=r"tags\[0\]"):
        st.subscribe_batch([s], 0.0, ["7"])
    assert len(st) == 0  # nothing applied
    st.subscribe_batch([s], 0.0)
    _, tags, counts = st.publish_tagged([Message("m", ("x",), Point(0.5, 0.5))], 0.0)
    assert tags.tolist() == [-1] and counts.tolist() == [1]


def test_a_version_1_snapshot_is_still_read_without_tags():
    st = ShardState.build(0, [_sub("a", ["x"], Rect(0, 0, 1, 1))], 0.0, tags=[3])
    data = st.snapshot()
    payload = pickle.loads(data[6:])
    del payload["subs"]["tags"]
    old = b"GPSS" + (1).to_bytes(2, "little") + pickle.dumps(payload, protocol=5)
    back = ShardState.restore(old)
    assert back.publish_tagged([Message("m", ("x",), Point(0.5, 0.5))], 1.0)[1].tolist() == [-1]
    assert ShardState.restore(data).publish_tagged([Message("m", ("x",), Point(0.5, 0.5))], 1.0)[
        1
    ].tolist() == [3]


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-300, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(
    mid=st.one_of(st.text(max_size=140), _ANY),
    terms=st.one_of(st.lists(st.one_of(st.text(max_size=4), _ANY), max_size=3).map(tuple), _ANY),
    coords=st.lists(st.one_of(st.floats(-200, 200), _ANY), min_size=4, max_size=4),
    rect=st.booleans(),
    ttl=_ANY,
)
@example(mid="m", terms=("a",), coords=[1.0, 2.0, 3.0, 4.0], rect=True, ttl=5.0)
@example(mid="m", terms=("a",), coords=[1.0, 2.0, 0.0, 0.0], rect=False, ttl=None)
def test_the_fast_message_check_passes_only_what_the_full_check_passes(
    mid, terms, coords, rect, ttl
):
    loc = Rect(*coords) if rect else Point(*coords[:2])
    m = Message(mid, terms, loc, ttl)
    if shard.state._plain_message(m):
        shard.state._check_message("m", m)  # must not raise


def test_what_the_coordinator_sends_takes_the_fast_check():
    for loc in (Point(1.5, -2.0), Rect(-1.0, -1.0, 2.0, 0.5)):
        for ttl in (None, 0.0, 30.0):
            assert shard.state._plain_message(Message("m1", ("a", "b"), loc, ttl))
    assert not shard.state._plain_message(Message("m1", ("a",), Point(1, 2)))  # ints: long way
    assert not shard.state._plain_message(Message("m1", ("a",), Rect(2.0, 0.0, 1.0, 1.0)))
