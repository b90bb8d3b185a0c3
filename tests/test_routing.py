"""The coordinator's pure parts on their own: routing, the live-message table and the netting."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.live import REPLAY_MIN_TTL_S, LiveMessages
from coordinator.netting import expirations, net
from coordinator.ops import Op
from coordinator.rounds import Round
from coordinator.routing import Router
from coordinator.slots import Slots
from shard.errors import NotFoundError, ValidationError
from shard.model import ADD, REMOVE, Message, Point, Rect, Subscription
from shard.partition_map import PartitionMap


def _router() -> Router:
    return Router(PartitionMap.build([], 2), Slots(), LiveMessages(tick_s=0.25))  # west | east


def _op(kind: str, arg, **kw) -> Op:
    return Op(kind, arg, None, **kw)  # (the router never touches the future)


def _sent(r: Router, op: Op, now: float = 0.0) -> list[tuple[int, tuple]]:
    out: list[tuple[int, tuple]] = []
    route = {"pub": lambda s: r.route_pub(op, s, now), "sub": lambda s: r.route_sub(op.arg, s, op)}
    route["unsub"] = lambda s: r.route_unsub(op, s)
    route["move"] = lambda s: r.route_move(op, s)
    route[op.kind](lambda k, item: out.append((k, item)))
    return out


def test_a_move_across_the_boundary_detaches_where_it_leaves_and_subscribes_where_it_arrives():
    r = _router()
    s = Subscription("w", (("a",),), Rect(-3.0, 0.0, -1.0, 1.0), moving=True)
    assert [k for k, _ in _sent(r, _op("sub", s))] == [0]
    tag = r.slots.slot_of["w"]
    # straddling: stays on 0 (move), arrives on 1 (sub, same slot)
    got = _sent(r, _op("move", "w", point=Point(0.5, 0.5)))
    assert [(k, item[0]) for k, item in got] == [(0, "move"), (1, "sub")]
    assert got[1][1][1].region == Rect(-0.5, 0.0, 1.5, 1.0) and got[1][1][2] == tag
    assert r.placement["w"] == (0, 1) and r.stats["moves"] == 1
    # all east: leaves 0
    got = _sent(r, _op("move", "w", point=Point(5.0, 0.5)))
    assert [(k, item[0]) for k, item in got] == [(0, "detach"), (1, "move")]
    assert r.placement["w"] == (1,)


def test_a_move_of_a_subscription_gone_or_static_sends_nothing():
    r = _router()
    with pytest.raises(NotFoundError):
        _sent(r, _op("move", "nobody", point=Point(0, 0)))
    _sent(r, _op("sub", Subscription("s", (("a",),), Rect(1, 1, 2, 2))))
    with pytest.raises(ValidationError, match="no longer moving"):
        _sent(r, _op("move", "s", point=Point(0, 0)))
    assert r.placement["s"] == (1,) and r.stats["moves"] == 0


def test_a_changed_subscription_leaves_the_shards_it_no_longer_meets_and_unsubscribe_frees_it():
    r = _router()
    old = Subscription("s", (("a",),), Rect(-2, 0, 2, 1))
    op = _op("sub", old)
    assert [k for k, _ in _sent(r, op)] == [0, 1] and op.prev is None
    new = Subscription("s", (("b",),), Rect(3, 0, 4, 1))
    op = _op("sub", new)
    assert [(k, i[0]) for k, i in _sent(r, op)] == [(0, "detach"), (1, "sub")]
    assert (op.prev, op.prev_at) == (old, (0, 1))
    slot = r.slots.slot_of["s"]
    op = _op("unsub", "s")
    assert [(k, i[0]) for k, i in _sent(r, op)] == [(1, "unsub")]
    assert "s" not in r.subs and not r.slots.placed[slot] and op.prev == new


def test_a_region_message_on_two_shards_is_counted_and_a_replayed_one_only_where_owed():
    r = _router()
    m = Message("m", ("a",), Rect(-1, 0, 1, 1), ttl=5.0)
    assert [k for k, _ in _sent(r, _op("pub", m), now=10.0)] == [0, 1]
    assert r.live["m"][2] == 15.0 and r.live.holders == {"m": {}}
    assert r.stats["published"] == 1
    r.live.forget("m")
    r.live.owed["m"] = frozenset({1})
    op = _op("pub", m, replay=True, expiry=9.0)  # past its expiry: stored a moment, only on 1
    assert [k for k, _ in _sent(r, op, now=10.0)] == [1]
    assert op.arg.ttl == REPLAY_MIN_TTL_S and r.stats["published"] == 1


def test_a_message_whose_shard_did_not_answer_is_owed_and_put_off_until_it_does():
    live = LiveMessages(tick_s=0.25)
    m = Message("m", ("a",), Rect(-1, 0, 1, 1), ttl=1.0)
    live.add(m, b"p", now=0.0, shards=2)
    changes: list = []
    assert live.expire(1.0, {0}, 2, lambda _: [0, 1], changes) == []
    assert live.owed == {"m": frozenset({1})} and changes == [("m", frozenset({1}))]
    assert live["m"][2] == 1.25 and live.stored_in(0, lambda _: [0, 1]) == []
    assert live.stored_in(1, lambda _: [0, 1]) == [live["m"]]
    assert live.expire(1.25, {1}, 2, lambda _: [0, 1], changes) == ["m"]
    assert not live and live.owed == {} and live.holders == {}


def test_netting_delivers_when_the_count_of_holding_shards_crosses_zero():
    live = LiveMessages(tick_s=0.25)
    live.add(Message("m", ("a",), Rect(-1, 0, 1, 1), ttl=9.0), b"p", now=0.0, shards=2)
    rnd = Round(0.0)
    net([(3, ADD, "m"), (3, ADD, "m"), (4, ADD, "m")], rnd, live, own=("m", b"own"))
    assert (
        list(zip(rnd.subs, rnd.kinds, strict=True)) == [(3, ADD), (4, ADD)]
        and rnd.payloads["m"] == b"own"
    )
    net([(3, REMOVE, "m")], rnd, live)  # one of two shards lost it: still held
    net([(4, REMOVE, "m"), (4, ADD, "m")], rnd, live)  # nets to nothing
    assert len(rnd) == 2 and live.holders["m"] == {3: 1, 4: 1}
    # the expiry of a message on several shards nets too; one on one shard is a REMOVE each
    live.add(Message("n", ("a",), Point(5, 0), ttl=9.0), b"q", now=0.0, shards=1)
    placed = np.ones(8, bool)
    placed[4] = False  # unsubscribed: no REMOVE
    tags = np.array([3, 3, 4, 4], np.int32)
    expirations([(["m", "n"], np.array([2, 2]), tags)], rnd, live, placed)
    assert list(
        zip(rnd.subs[2:], rnd.kinds[2:], [rnd.mids[i] for i in rnd.midx[2:]], strict=True)
    ) == [(3, REMOVE, "m")]
