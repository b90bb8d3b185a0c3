"""The shard through real Ray actors: the same operations give the same updates as the in-process
``ShardState``; snapshot / restore, errors and a restart cross the actor boundary intact."""

from __future__ import annotations

import random
import time

import pytest

from shard.errors import NotFoundError, UnavailableError, ValidationError
from shard.host.actor import ShardActor, make_shard_actor
from shard.model import Message, Point, Rect, Subscription
from shard.state import ShardState
from tests.workloads import apply_op, as_moving, canonical, random_ops, random_subscription

pytestmark = pytest.mark.ray

OPTIONS = {"theta_p": 8, "fanout": 16, "dup_limit": 3, "purge_interval": 2.0}


def _workload(seed: int, n_subs: int = 300, n_ops: int = 40):
    rng = random.Random(seed)
    t0 = 1.7e9 + rng.random()
    subs = [as_moving(random_subscription(rng, f"s{i}"), i % 5 != 0) for i in range(n_subs)]
    movers = [s.id for s in subs if s.moving]
    return subs, t0, random_ops(rng, movers, n_ops, t0, 0), rng, movers


def _remote(actor, op):
    """The ``_apply`` of an operation as a remote call (moves filtered the same way, by ``has``)."""
    kind, payload, now = op
    if kind == "publish":
        return actor.publish_batch.remote(payload, now)
    if kind == "move":
        return ("move", payload, now)  # needs ``has`` first: resolved in ``_run``
    if kind == "subscribe":
        return actor.subscribe_batch.remote(payload, now)
    if kind == "detach":
        return actor.detach_batch.remote(payload, now)
    return actor.advance.remote(now)


def _run(ray, actor, ops) -> list[list]:
    out = []
    for op in ops:
        ref = _remote(actor, op)
        if isinstance(ref, tuple):
            _, payload, now = ref
            held = ray.get(actor.has.remote([sid for sid, _ in payload]))
            moves = [m for m, h in zip(payload, held, strict=True) if h]
            ref = actor.move_batch.remote(moves, now)
        out.append(ref)
    return ray.get(out)


def test_actor_gives_the_updates_of_the_in_process_state(ray_session):
    ray = ray_session
    subs, t0, ops, _, _ = _workload(1)
    actor = make_shard_actor(3, OPTIONS)
    assert ray.get(actor.load.remote(subs, t0)) == len({s.id for s in subs})
    local = ShardState.build(3, subs, t0, **OPTIONS)
    got = _run(ray, actor, ops)
    want = [apply_op(local, op) for op in ops]
    assert got == want  # same code, same order of calls: identical, not just equivalent
    assert sum(map(len, got)) > 50
    stats = ray.get(actor.stats.remote())
    assert {k: stats[k] for k in ("subscriptions", "moving", "live_messages", "now")} == {
        k: local.stats()[k] for k in ("subscriptions", "moving", "live_messages", "now")
    }
    ray.kill(actor)


def test_snapshot_and_restore_through_actors(ray_session):
    ray = ray_session
    subs, t0, ops, rng, movers = _workload(2)
    first = make_shard_actor(5, OPTIONS)
    ray.get(first.load.remote(subs, t0))
    _run(ray, first, ops)
    data = ray.get(first.snapshot.remote())
    second = make_shard_actor(5)  # options come with the snapshot
    assert ray.get(second.restore.remote(data)) == ray.get(first.info.remote())["subscriptions"]
    local = ShardState.restore(data)
    later = random_ops(rng, movers, 40, ray.get(first.info.remote())["now"], 10_000)
    a, b = _run(ray, first, later), _run(ray, second, later)
    c = [apply_op(local, op) for op in later]
    assert [canonical(x) for x in a] == [canonical(x) for x in b] == [canonical(x) for x in c]
    assert sum(map(len, a)) > 20
    with pytest.raises(ValidationError) as e:  # a snapshot of another shard is refused
        ray.get(make_shard_actor(6).restore.remote(data))
    assert e.value.cause.field == "snapshot.shard_id"
    for h in (first, second):
        ray.kill(h)


def test_errors_cross_the_actor_boundary_and_change_nothing(ray_session):
    ray = ray_session
    actor = make_shard_actor(0)
    sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
    ray.get(actor.subscribe_batch.remote([sub], 0.0))
    ray.get(actor.publish_batch.remote([Message("m", ("x",), Point(0.5, 0.5), ttl=1.0)], 0.0))
    with pytest.raises(NotFoundError) as nf:
        ray.get(actor.move_batch.remote([("s", Point(5, 5)), ("ghost", Point(0, 0))], 3.0))
    assert nf.value.cause.ident == "ghost"
    with pytest.raises(ValidationError) as ve:
        ray.get(actor.move_batch.remote([("s", Point(5, 95))], 3.0))
    assert (ve.value.cause.field, ve.value.cause.value) == ("moves[0].point[1]", 95)
    assert ray.get(actor.subscriptions.remote(["s"])) == [sub]
    assert ray.get(actor.advance.remote(3.0)) == [("s", "-", "m")]  # the expiry was not lost
    ray.kill(actor)


def test_a_restarted_actor_refuses_work_until_rebuilt(ray_session):
    ray = ray_session
    actor = make_shard_actor(9, {"theta_p": 4})
    sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
    ray.get(actor.subscribe_batch.remote([sub], 0.0))
    ray.get(actor.publish_batch.remote([Message("m", ("x",), Point(2.5, 0.5), ttl=9.0)], 1.0))
    data = ray.get(actor.snapshot.remote())
    before = ray.get(actor.info.remote())
    assert before["needs_rebuild"] is False
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
    with pytest.raises(UnavailableError):
        ray.get(actor.publish_batch.remote([Message("n", ("x",), Point(0.5, 0.5))], 2.0))
    with pytest.raises(UnavailableError):  # an empty snapshot must not overwrite a good one
        ray.get(actor.snapshot.remote())
    assert ray.get(actor.restore.remote(data)) == 1
    assert ray.get(actor.move_batch.remote([("s", Point(2.5, 0.5))], 2.0)) == [("s", "+", "m")]
    ray.kill(actor)


def test_actor_body_is_the_plain_state_outside_ray():
    """The class under the decorator runs without Ray: a first start needs no rebuild."""
    body = ShardActor(1, {"theta_p": 4})
    assert body.info()["needs_rebuild"] is False
    assert body.load([Subscription("a", (("x",),), Rect(0, 0, 1, 1))], 0.0) == 1
    assert body.publish_batch([Message("m", ("x",), Point(0, 0))], 1.0) == [("a", "+", "m")]


def test_a_slow_round_is_logged_with_what_it_did(monkeypatch, caplog):
    """A round over ``SLOW_ROUND_S`` is logged with its operations by kind and the subtrees it
    rebuilt; a quick one is not."""
    import logging

    import shard.host.actor

    body = ShardActor(2, {"theta_p": 4})
    subs = [Subscription(f"s{i}", ((f"t{i % 7}",),), Rect(i, 0, i + 1, 1)) for i in range(40)]
    body.load(subs[:1], 0.0)
    ops = [("sub", s, i) for i, s in enumerate(subs[1:])] + [
        ("pub", Message("m", ("t1",), Point(1.5, 0.5)))
    ]
    with caplog.at_level(logging.WARNING, logger="shard.host.actor"):
        body.apply([("unsub", "s0")], 1.0)
        assert caplog.records == []
        monkeypatch.setattr(shard.host.actor, "SLOW_ROUND_S", 0.0)
        body.apply(ops, 2.0)
    (rec,) = caplog.records
    text = rec.getMessage()
    when, rest = text[:19], text[20:]  # the round's start, to line it up with other logs
    assert abs(time.mktime(time.strptime(when, "%Y-%m-%d %H:%M:%S")) - time.time()) < 60
    assert rest.startswith("shard 2: a round took ") and "ms: 1 pub, 39 sub; " in rest, text
    rebuilt = int(text.split("; ")[1].split()[0])
    assert rebuilt > 0 and text.endswith("subtrees rebuilt; 0 live messages"), text
