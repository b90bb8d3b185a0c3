"""The shard through real Ray actors, on the surface the coordinator uses (``load_rows``,
``apply_wire``, ``info``, ``stats``): a round gives the very bytes the in-process ``ShardState``
gives; errors and a restart cross the actor boundary intact."""

from __future__ import annotations

import logging
import random
import time

import pytest

import shard.host.actor
from shard.errors import UnavailableError, ValidationError
from shard.host.actor import ShardActor, make_shard_actor
from shard.model import Message, Point, Rect, Subscription, subscriptions_to_rows
from shard.ops import apply_ops
from shard.state import ShardState
from shard.wire import dumps_ops, dumps_result, loads_ops, loads_result
from tests.workloads import as_moving, random_ops, random_subscription

pytestmark = pytest.mark.ray

OPTIONS = {"theta_p": 8, "fanout": 16, "dup_limit": 3, "purge_interval": 2.0}


def _workload(seed: int, n_subs: int = 300, n_ops: int = 40):
    rng = random.Random(seed)
    t0 = 1.7e9 + rng.random()
    subs = [as_moving(random_subscription(rng, f"s{i}"), i % 5 != 0) for i in range(n_subs)]
    movers = [s.id for s in subs if s.moving]
    return subs, t0, random_ops(rng, movers, n_ops, t0, 0)


def _round(op) -> tuple[list[tuple], float]:
    """A step of ``random_ops`` as a round's operations (``shard.ops``) and its clock."""
    kind, payload, now = op
    if kind == "publish":
        return [("pub", m) for m in payload], now
    if kind == "move":
        return [("move", sid, p) for sid, p in payload], now
    if kind == "subscribe":
        return [("sub", s, -1) for s in payload], now
    if kind == "detach":
        return [("detach", sid) for sid in payload], now
    return [], now


def _in_process(state: ShardState, ops: list[tuple], now: float) -> bytes:
    """What the actor answers, computed here: the same decode, round and encode."""
    return dumps_result(apply_ops(state, loads_ops(dumps_ops(ops)), now))


def test_actor_answers_each_round_with_the_bytes_of_the_in_process_state(ray_session):
    ray = ray_session
    subs, t0, steps = _workload(1)
    actor = make_shard_actor(3, OPTIONS)
    rows = subscriptions_to_rows(subs)
    assert ray.get(actor.load_rows.remote(rows, t0)) == len({s.id for s in subs})
    local = ShardState.build(3, subs, t0, **OPTIONS)
    rounds = [_round(op) for op in steps]
    got = ray.get([actor.apply_wire.remote(dumps_ops(ops), now) for ops, now in rounds])
    want = [_in_process(local, ops, now) for ops, now in rounds]
    assert got == want  # same code, same order of calls: identical bytes
    results = [loads_result(b)[1] for b in got]
    assert sum(x for out in results for x in out if isinstance(x, int)) > 20  # publishes matched
    assert sum(len(x) for out in results for x in out if isinstance(x, list)) > 0  # ± of moves
    stats = ray.get(actor.stats.remote())
    assert {k: stats[k] for k in ("subscriptions", "moving", "live_messages", "now")} == {
        k: local.stats()[k] for k in ("subscriptions", "moving", "live_messages", "now")
    }
    ray.kill(actor)


def test_errors_cross_the_actor_boundary_and_change_nothing(ray_session):
    ray = ray_session
    actor = make_shard_actor(0)
    sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
    msg = Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)
    ray.get(actor.load_rows.remote(subscriptions_to_rows([sub]), 0.0))
    ray.get(actor.apply_wire.remote(dumps_ops([("pub", msg)]), 0.0))
    # a run of moves naming an unknown subscription is refused whole: its operations get the
    # error, the shard is unchanged
    blob = ray.get(
        actor.apply_wire.remote(
            dumps_ops([("move", "s", Point(5, 5)), ("move", "ghost", Point(0, 0))]), 0.5
        )
    )
    _, out, _ = loads_result(blob)
    assert [type(x).__name__ for x in out] == ["NotFoundError", "NotFoundError"], out
    # bytes that are not a round are refused with the field named, across the boundary
    with pytest.raises(ValidationError) as ve:
        ray.get(actor.apply_wire.remote(b"\xc1 not msgpack", 1.0))
    assert ve.value.cause.field == "ops"
    expired, _, _ = loads_result(ray.get(actor.apply_wire.remote(dumps_ops([]), 3.0)))
    assert list(expired[0]) == ["m"] and list(expired[1]) == [1]  # s still held m
    ray.kill(actor)


def test_a_restarted_actor_refuses_rounds_until_loaded_again(ray_session):
    ray = ray_session
    actor = make_shard_actor(9, {"theta_p": 4})
    sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
    rows = subscriptions_to_rows([sub])
    ray.get(actor.load_rows.remote(rows, 0.0))
    before = ray.get(actor.info.remote())
    assert before["needs_rebuild"] is False and before["subscriptions"] == 1
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 120
    while True:
        try:
            info = ray.get(actor.info.remote(), timeout=30)
            if info["incarnation"] != before["incarnation"]:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the shard actor did not come back"
        time.sleep(0.2)
    assert info["needs_rebuild"] is True and info["subscriptions"] == 0
    pub = dumps_ops([("pub", Message("n", ("x",), Point(0.5, 0.5)))])
    with pytest.raises(UnavailableError):  # an empty shard must not answer "no match"
        ray.get(actor.apply_wire.remote(pub, 2.0))
    with pytest.raises(UnavailableError):
        ray.get(actor.stats.remote())
    assert ray.get(actor.load_rows.remote(rows, 2.0)) == 1
    _, out, _ = loads_result(ray.get(actor.apply_wire.remote(pub, 2.0)))
    assert out == [1]
    ray.kill(actor)


def test_actor_body_is_the_plain_state_outside_ray():
    """The class under the decorator runs without Ray: a first start needs no rebuild."""
    body = ShardActor(1, {"theta_p": 4})
    assert body.info()["needs_rebuild"] is False
    rows = subscriptions_to_rows([Subscription("a", (("x",),), Rect(0, 0, 1, 1))])
    assert body.load_rows(rows, 0.0) == 1
    blob = body.apply_wire(dumps_ops([("pub", Message("m", ("x",), Point(0, 0)))]), 1.0)
    assert loads_result(blob)[1] == [1]


def test_a_slow_round_is_logged_with_what_it_did(monkeypatch, caplog):
    """A round over ``SLOW_ROUND_S`` is logged with its operations by kind and the subtrees it
    rebuilt; a quick one is not."""
    body = ShardActor(2, {"theta_p": 4})
    subs = [Subscription(f"s{i}", ((f"t{i % 7}",),), Rect(i, 0, i + 1, 1)) for i in range(40)]
    body.load_rows(subscriptions_to_rows(subs[:1]), 0.0)
    ops = [("sub", s, i) for i, s in enumerate(subs[1:])] + [
        ("pub", Message("m", ("t1",), Point(1.5, 0.5)))
    ]
    with caplog.at_level(logging.WARNING, logger="shard.host.actor"):
        body.apply_wire(dumps_ops([("unsub", "s0")]), 1.0)
        assert caplog.records == []
        monkeypatch.setattr(shard.host.actor, "SLOW_ROUND_S", 0.0)
        body.apply_wire(dumps_ops(ops), 2.0)
    (rec,) = caplog.records
    text = rec.getMessage()
    when, rest = text[:19], text[20:]  # the round's start, to line it up with other logs
    assert abs(time.mktime(time.strptime(when, "%Y-%m-%d %H:%M:%S")) - time.time()) < 60
    assert rest.startswith("shard 2: a round took ") and "ms: 1 pub, 39 sub; " in rest, text
    rebuilt = int(text.split("; ")[1].split()[0])
    assert rebuilt > 0 and text.endswith("subtrees rebuilt; 0 live messages"), text
