"""A coordinator killed while a shard is down, differentially: random subscribes (some under ids
unsubscribed before), moves, publishes and unsubscribes through gRPC (a real redis-server,
in-process shards), a shard taken down, more traffic (answered UNAVAILABLE where it touches that
shard), the coordinator then stopped the way a killed process is (no final write), and a new one
started on the same Redis (with the shard back, or still down for a while). At the end every
durable subscription's whole stream, read back from the log, must never ADD a message it holds
or REMOVE one it does not, and must hold exactly the live messages its subscription now
matches, by brute force (an id subscribed again may start with one GAP: its earlier
subscription's range)."""

from __future__ import annotations

import asyncio
import random
import uuid

import grpc
import pytest

from coordinator.shards import LocalShard
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.brute import subscription_matches
from shard.model import Message, Point, Rect, Subscription
from shard.state import ShardState
from tests.clusters import DownShard, Node, coordinator_settings, settled

pytestmark = pytest.mark.redis

TERMS = ("a", "b", "c")
EXPECTED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND}
"""What an operation may be answered while a shard is down (NOT_FOUND: a move of a
subscription whose subscribe was cut short)."""


class SwitchedShard(DownShard):
    """A shard that is down (its calls and loads fail, its state lost) while its number is in
    ``SwitchedShard.down``."""

    down: set[int] = set()

    def _check(self) -> None:
        if self.shard_id in SwitchedShard.down:
            self.state = ShardState(self.shard_id)
            raise RuntimeError(f"shard {self.shard_id} process is down")


def _region(rng: random.Random) -> Rect:
    x, y = rng.uniform(-9, 8), rng.uniform(-9, 8)
    return Rect(x, y, x + rng.uniform(0.5, 3), y + rng.uniform(0.5, 3))


def _subscription(rng: random.Random, sid: str, moving: bool) -> pb.SubscribeRequest:
    terms = tuple(sorted(set(rng.choices(TERMS, k=rng.choice([1, 2])))))
    s = to_proto_subscription(Subscription(sid, (terms,), _region(rng), moving))
    return pb.SubscribeRequest(subscription=s)


def _message(rng: random.Random, n: int) -> pb.PublishRequest:
    terms = tuple(sorted(set(rng.choices(TERMS, k=2))))
    if rng.random() < 0.3:  # a region: stored on every shard it overlaps
        x, y = rng.uniform(-9, 8), rng.uniform(-9, 8)
        loc = Rect(x, y, x + rng.uniform(0.1, 4), y + rng.uniform(0.1, 4))
    else:
        loc = Point(rng.uniform(-10, 10), rng.uniform(-10, 10))
    m = Message(f"m{n}", terms, loc, ttl=rng.choice([600.0, 600.0, 1.5]))
    return pb.PublishRequest(message=to_proto_message(m))


async def _traffic(stub, rng: random.Random, n_ops: int, state: dict) -> None:
    """``n_ops`` random operations, one at a time; an answer other than OK must be one of
    ``EXPECTED``."""
    for _ in range(n_ops):
        r = rng.random()
        try:
            if r < 0.45:  # (a publish answered UNAVAILABLE is sent again once, as a client would)
                state["n"] += 1
                req = _message(rng, state["n"])
                try:
                    await stub.Publish(req, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() in EXPECTED, (exc.code(), exc.details())
                    await stub.Publish(req, timeout=10)
                if req.message.ttl_s > 60:  # acknowledged: live until the end
                    state["acked"].add(req.message.id)
            elif r < 0.75 and state["moving"]:
                sid = rng.choice(sorted(state["moving"]))
                p = pb.Point(lon=rng.uniform(-10, 10), lat=rng.uniform(-10, 10))
                await stub.UpdateLocation(pb.UpdateLocationRequest(id=sid, point=p), timeout=10)
            elif r < 0.96:  # a new subscription (some under an id unsubscribed), or a change
                if state["subs"] and rng.random() < 0.4:
                    sid = rng.choice(sorted(state["subs"]))
                else:
                    if state["gone"] and rng.random() < 0.3:
                        sid = rng.choice(sorted(state["gone"]))
                        state["gone"].discard(sid)
                        state["again"].add(sid)
                    else:
                        state["made"] += 1
                        sid = f"s{state['made']}"
                    state["subs"].add(sid)
                    if rng.random() < 0.5:
                        state["moving"].add(sid)
                await stub.Subscribe(_subscription(rng, sid, sid in state["moving"]), timeout=10)
            elif state["subs"]:
                sid = rng.choice(sorted(state["subs"]))
                state["subs"].discard(sid)
                state["gone"].add(sid)
                state["moving"].discard(sid)
                await stub.Unsubscribe(pb.UnsubscribeRequest(id=sid), timeout=10)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in EXPECTED, (exc.code(), exc.details())


async def _stream(stub, sid: str) -> list[pb.Delivery]:
    out = []
    call = stub.StreamResults(pb.StreamResultsRequest(id=sid, after_sequence=0))
    try:
        while True:
            out.append(await asyncio.wait_for(call.read(), 0.3))
    except TimeoutError:
        pass
    finally:
        call.cancel()
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.slow
def test_a_coordinator_killed_while_a_shard_is_down_leaves_no_subscriber_mistold(
    redis_url, seed, monkeypatch
):
    monkeypatch.setattr("coordinator.recovery.RELOAD_PAUSE_S", (0.01, 0.05))
    rng = random.Random(seed)
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, shards=2)
    state = {
        "n": 0,
        "made": 0,
        "subs": set(),
        "moving": set(),
        "acked": set(),
        "gone": set(),
        "again": set(),
    }

    async def main():
        SwitchedShard.down = set()
        node = Node(settings, SwitchedShard)
        await node.__aenter__()
        try:
            for i in range(8):
                state["made"] += 1
                state["subs"].add(sid := f"s{state['made']}")
                if i % 2:
                    state["moving"].add(sid)
                await node.stub.Subscribe(_subscription(rng, sid, sid in state["moving"]))
            await _traffic(node.stub, rng, 60, state)
            for _ in range(3):
                SwitchedShard.down = {rng.randrange(2)}
                await _traffic(node.stub, rng, 40, state)
                await node.crash()
                if rng.random() < 0.5:  # back before the new coordinator starts, or later
                    SwitchedShard.down = set()
                node = Node(settings, SwitchedShard)
                await node.__aenter__()
                await _traffic(node.stub, rng, 10, state)
                SwitchedShard.down = set()
                await settled(node.app.engine, step=0.01, tries=1500)
                await _traffic(node.stub, rng, 20, state)
            await settled(node.app.engine, step=0.01, tries=1500)
            await asyncio.sleep(2.0)  # the short-lived messages expire
            await settled(node.app.engine, step=0.01, tries=1500)
            eng = node.app.engine
            live = {m.id: m for m, _, _ in eng.live.values()}
            wrong = []
            for sid, sub in sorted(eng.subs.items()):
                held: set[str] = set()
                for i, d in enumerate(await _stream(node.stub, sid)):
                    mid = d.message.id
                    if d.kind == pb.Delivery.GAP and i == 0 and d.gap_from == 1:
                        # what an earlier subscription under the id was given (only there)
                        if sid not in state["again"]:
                            wrong.append((sid, "GAP", d.gap_from, d.sequence))
                    elif d.kind == pb.Delivery.GAP:
                        wrong.append((sid, "GAP", d.gap_from, d.sequence))
                    elif d.kind == pb.Delivery.ADD:
                        if mid in held:
                            wrong.append((sid, "ADD of a message it holds", mid, d.sequence))
                        held.add(mid)
                    else:
                        if mid not in held:
                            wrong.append((sid, "REMOVE of one it does not hold", mid, d.sequence))
                        held.discard(mid)
                want = {m.id for m in live.values() if subscription_matches(sub, m)}
                for mid in sorted(held - want):
                    wrong.append((sid, "holds", mid, "live" if mid in live else "gone"))
                for mid in sorted(want - held):
                    wrong.append((sid, "was not told of", mid))
            for mid in sorted(state["acked"] - live.keys()):
                wrong.append(("acknowledged", mid, "not live"))
            assert wrong == []
            assert len(eng.subs) >= 5 and len(state["acked"]) >= 20 and state["again"]
        finally:
            SwitchedShard.down = set()
            if not node.crashed:
                await node.__aexit__(None, None, None)

    asyncio.run(main())


class HangingShard(LocalShard):
    """A shard whose rounds never come back while ``HangingShard.hang`` is set."""

    hang = False

    async def apply(self, ops, now):
        while HangingShard.hang:
            await asyncio.sleep(0.05)
        return await super().apply(ops, now)


@pytest.mark.parametrize("ack", ["stored", "applied"])
def test_a_subscribe_cut_short_by_a_crash_is_told_after_the_restart(redis_url, ack):
    """Redis has a subscription the moment Subscribe writes it; its ADDs come in a round. A
    coordinator killed in between leaves it marked untold, and the next one tells it (and
    clears the mark); a subscribe that went through leaves no mark. Answered once stored, the
    call succeeds before the round; answered once applied, it times out."""
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, shards=1, subscribe_ack=ack)
    m = Message("L", ("a",), Point(0.2, 0.2), ttl=60.0)
    req = pb.SubscribeRequest(
        subscription=to_proto_subscription(Subscription("late", (("a",),), Rect(0, 0, 1, 1)))
    )

    async def main():
        HangingShard.hang = False
        async with Node(settings, HangingShard) as a:
            await a.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            await a.stub.Subscribe(_subscription(random.Random(1), "early", False))
            await settled(a.app.engine)
            assert await a.app.md.untold() == {}  # told in its round: no mark left
            HangingShard.hang = True
            if ack == "stored":
                await a.stub.Subscribe(req, timeout=0.5)
            else:
                with pytest.raises(grpc.aio.AioRpcError):
                    await a.stub.Subscribe(req, timeout=0.5)
            assert list(await a.app.md.untold()) == ["late"]
            await a.crash()
        HangingShard.hang = False
        async with Node(settings, HangingShard) as b:
            got = await _stream(b.stub, "late")
            assert [(d.sequence, d.kind, d.message.id) for d in got] == [(1, pb.Delivery.ADD, "L")]
            assert await b.app.md.untold() == {}
            assert await b.app.md.hgetall(b.app.log.outage_key(0)) == {}

    asyncio.run(main())


async def _near_and_far(settings) -> Node:
    """A started node (every shard up) with subscription ``near`` on shard 0 and ``far`` on
    shard 1, both of keyword "a"."""
    SwitchedShard.down = set()
    node = Node(settings, SwitchedShard)
    await node.__aenter__()
    for s in (
        Subscription("near", (("a",),), Rect(-9, -9, -8, -8)),
        Subscription("far", (("a",),), Rect(8, 8, 9, 9)),
    ):
        await node.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(s)))
    await settled(node.app.engine)  # (routed: a Subscribe may be answered before)
    assert node.app.engine.placement == {"near": (0,), "far": (1,)}
    return node


def test_a_one_shot_message_cut_short_reaches_the_down_shard_after_a_crash(redis_url):
    """A one-shot message over both shards while one is down: the other's subscriber gets it,
    the publish's retry is answered; the coordinator is killed before the shard is back. The
    next coordinator delivers it to the down shard's subscriber, and not again to the other."""
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, shards=2)
    req = pb.PublishRequest(
        message=to_proto_message(Message("once", ("a",), Rect(-8.5, -8.5, 8.5, 8.5)))
    )

    async def main():
        node = await _near_and_far(settings)
        try:
            SwitchedShard.down = {1}
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await node.stub.Publish(req)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (await node.stub.Publish(req)).matched == 1  # the retry: answered
            await node.crash()
            SwitchedShard.down = set()
            node = Node(settings, SwitchedShard)
            await node.__aenter__()
            await settled(node.app.engine, step=0.01, tries=1500)
            shape = {
                sid: [(d.kind, d.message.id) for d in await _stream(node.stub, sid)]
                for sid in ("near", "far")
            }
            assert shape == {
                "near": [(pb.Delivery.ADD, "once")],
                "far": [(pb.Delivery.ADD, "once")],
            }
        finally:
            SwitchedShard.down = set()
            if not node.crashed:
                await node.__aexit__(None, None, None)

    asyncio.run(main())


@pytest.mark.parametrize("back_first", [False, True])
def test_a_message_expired_on_one_shard_while_its_other_is_down_is_removed_once_after_a_crash(
    redis_url, back_first
):
    """A stored message over both shards expires while one is down: the other's subscriber
    gets its REMOVE, the down one's waits for its shard. The coordinator is killed (the shard
    back before the next one starts, or after); the next one stores the message again only in
    the shard that had not expired it: each subscriber gets exactly one REMOVE."""
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, shards=2)
    brief = Message("brief", ("a",), Rect(-8.5, -8.5, 8.5, 8.5), ttl=1.0)
    once = [(pb.Delivery.ADD, "brief"), (pb.Delivery.REMOVE, "brief")]

    async def shape(stub, sid):
        return [(d.kind, d.message.id) for d in await _stream(stub, sid)]

    async def main():
        node = await _near_and_far(settings)
        try:
            pub = await node.stub.Publish(pb.PublishRequest(message=to_proto_message(brief)))
            assert pub.matched == 2
            SwitchedShard.down = {1}
            for _ in range(40):  # until shard 0 expires it
                if await shape(node.stub, "near") == once:
                    break
            assert await shape(node.stub, "near") == once
            assert await shape(node.stub, "far") == once[:1]
            assert node.app.engine.live.owed == {"brief": frozenset({1})}
            await node.crash()
            if back_first:
                SwitchedShard.down = set()
            node = Node(settings, SwitchedShard)
            await node.__aenter__()
            SwitchedShard.down = set()
            await settled(node.app.engine, step=0.01, tries=1500)
            await asyncio.sleep(1.0)
            await settled(node.app.engine, step=0.01, tries=1500)
            assert {s: await shape(node.stub, s) for s in ("near", "far")} == {
                "near": once,
                "far": once,
            }
            assert "brief" not in node.app.engine.live and node.app.engine.live.owed == {}
            assert await node.app.md.hgetall(node.app.log.owed_key) == {}
        finally:
            SwitchedShard.down = set()
            if not node.crashed:
                await node.__aexit__(None, None, None)

    asyncio.run(main())
