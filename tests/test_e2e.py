"""The cluster end to end: a real ``redis-server``, real Ray shard actors, the coordinator's gRPC
service on 127.0.0.1, real gRPC clients. Deliveries are compared with the brute-force oracle
and with the in-process AP+-Tree."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.metadata import Metadata
from geopubsub.client import Endpoint, request_reload
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.applus import APPlusTree
from shard.brute import subscription_matches
from shard.model import ADD, REMOVE, Message, Point, Rect, Sign, Subscription
from tests.clusters import Cluster, coordinator_settings
from tests.workloads import random_message, random_subscription

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


def run(coro):
    return asyncio.run(coro)


async def _collect(stub, sub_id: str, after: int = 0, quiet_s: float = 0.5) -> list[pb.Delivery]:
    """Read a result stream until nothing new arrives for ``quiet_s``."""
    out: list[pb.Delivery] = []
    call = stub.StreamResults(pb.StreamResultsRequest(id=sub_id, after_sequence=after))
    try:
        while True:
            d = await asyncio.wait_for(call.read(), quiet_s)
            if d is grpc.aio.EOF:
                break
            out.append(d)
    except TimeoutError:
        pass
    finally:
        call.cancel()
    return out


async def _subscribe_all(stub, subs: list[Subscription]) -> None:
    for s in subs:
        await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(s)))


async def _assert_streams_equal_the_oracle(
    stub, subs: list[Subscription], msgs, quiet_s: float = 0.5
) -> None:
    """Each subscription's stream holds exactly the ADDs of the (one-shot) messages it
    matches, in publish order, numbered 1, 2, 3, ..."""
    streams = await asyncio.gather(*(_collect(stub, s.id, quiet_s=quiet_s) for s in subs))
    for s, got in zip(subs, streams, strict=True):
        want = [m.id for m in msgs if subscription_matches(s, m)]
        assert [d.message.id for d in got] == want, s
        assert [d.kind for d in got] == [pb.Delivery.ADD] * len(got)
        assert [d.sequence for d in got] == list(range(1, len(got) + 1))


def test_publish_and_stream_equal_the_oracle(ray_session, redis_url):
    rng = random.Random(11)
    subs = [random_subscription(rng, f"s{i}") for i in range(120)]
    msgs = [random_message(rng, f"m{i}") for i in range(150)]

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await _subscribe_all(c.stub, subs)

            async def requests():
                for m in msgs:
                    yield pb.PublishRequest(message=to_proto_message(m))

            responses = [r async for r in c.stub.PublishStream(requests())]
            assert [r.id for r in responses] == [m.id for m in msgs]
            for r, m in zip(responses, msgs, strict=True):
                want = sum(subscription_matches(s, m) for s in subs)
                assert r.matched == want, m
            await _assert_streams_equal_the_oracle(c.stub, subs, msgs)

    run(main())


def test_moving_across_the_shard_boundary_equals_the_in_process_tree(ray_session, redis_url):
    """Two shards split at longitude 0 (empty map sample); a subscriber walks back and forth
    across it among point and region messages (some spanning both shards)."""
    rng = random.Random(5)
    words = ["a", "b", "c"]
    msgs = []
    for i in range(80):
        kws = tuple(sorted(set(rng.choices(words, k=2))))
        if i % 4 == 0:
            x0 = rng.uniform(-3, 2)
            loc = Rect(x0, rng.uniform(-2, 0), x0 + rng.uniform(0, 2), rng.uniform(0, 2))
        else:
            loc = Point(round(rng.uniform(-3, 3), 2), round(rng.uniform(-2, 2), 2))
        msgs.append(Message(f"m{i}", kws, loc, ttl=3600.0, keywords=kws))
    mover = Subscription("walker", (("a",), ("b", "c")), Rect(-3.5, -0.5, -2.5, 0.5), moving=True)
    path = [
        Point(x, rng.uniform(-1, 1))
        for x in [-2.0, -1.0, -0.4, 0.0, 0.3, 1.2, 2.5, 0.2, -0.1, -2.8]
    ]

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            ref = APPlusTree()
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(mover)))
            ref.subscribe(mover, 0.0)
            for m in msgs:
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            ref.publish_batch(msgs, 0.0)
            for t, p in enumerate(path, start=1):
                r = await c.stub.UpdateLocation(
                    pb.UpdateLocationRequest(id="walker", point=pb.Point(lon=p.lon, lat=p.lat))
                )
                got = sorted((Sign(d.kind), d.message.id) for d in r.updates)
                want = sorted((g, m) for _, g, m in ref.move("walker", p, float(t)))
                assert got == want, (t, p)
            assert c.app.engine.placement["walker"] == (0,)

    run(main())


def test_resume_after_a_disconnect_loses_and_repeats_nothing(ray_session, redis_url):
    sub = Subscription("r", (("x",),), Rect(-1, -1, 1, 1))

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            for i in range(30):
                msg = Message(f"a{i}", ("x",), Point(0.5, 0.5))
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(msg)))
            call = c.stub.StreamResults(pb.StreamResultsRequest(id="r"))
            first = [await call.read() for _ in range(12)]
            call.cancel()  # the client goes away
            for i in range(30, 50):
                msg = Message(f"a{i}", ("x",), Point(0.5, 0.5))
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(msg)))
            rest = await _collect(c.stub, "r", after=first[-1].sequence)
            seen = [d.message.id for d in first + rest]
            assert seen == [f"a{i}" for i in range(50)]
            assert [d.sequence for d in first + rest] == list(range(1, 51))

    run(main())


def test_a_new_subscription_in_a_freed_slot_starts_afresh(ray_session, redis_url):
    """Unsubscribed subscriptions give their slots back and new ones take them: each new one
    gets exactly its own deliveries numbered from 1, a live stream of a removed one gets
    nothing more, and the others' numbering goes on."""
    rng = random.Random(12)
    first = [random_subscription(rng, f"a{i}") for i in range(40)]
    second = [random_subscription(rng, f"b{i}") for i in range(25)]

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await _subscribe_all(c.stub, first)
            before = [random_message(rng, f"p{i}") for i in range(60)]
            for m in before:
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            gone, kept = first[:25], first[25:]
            watch = c.stub.StreamResults(pb.StreamResultsRequest(id=gone[0].id))
            for s in gone:
                await c.stub.Unsubscribe(pb.UnsubscribeRequest(id=s.id))
            await _subscribe_all(c.stub, second)
            after = [random_message(rng, f"q{i}") for i in range(60)]
            for m in after:
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            # (a Subscribe is answered before its round: slots are taken when it is routed,
            # which the publishes queued after it waited for)
            assert len(c.app.slots) == len(kept) + len(second)
            assert len(c.app.slots.ids) == len(first)  # every new one took a freed slot
            await _assert_streams_equal_the_oracle(c.stub, second, after)
            await _assert_streams_equal_the_oracle(c.stub, kept, before + after)
            old = {m.id for m in before if subscription_matches(gone[0], m)}
            seen = []
            with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError):
                while (d := await asyncio.wait_for(watch.read(), 1.0)) != grpc.aio.EOF:
                    seen.append(d.message.id)
            watch.cancel()
            assert set(seen) <= old  # (its log was deleted: maybe read before, maybe not)

    run(main())


def test_restart_keeps_subscriptions_and_sequences(ray_session, redis_url):
    ns = uuid.uuid4().hex
    rng = random.Random(3)
    subs = [random_subscription(rng, f"k{i}") for i in range(40)]
    probe = Message("p", ("t1", "t2", "t3"), Point(0.5, 0.5))

    async def main():
        async with Cluster(coordinator_settings(redis_url, ns)) as c:
            await _subscribe_all(c.stub, subs)
            await c.stub.Publish(pb.PublishRequest(message=to_proto_message(probe)))
        async with Cluster(coordinator_settings(redis_url, ns)) as c:
            for s in subs:
                got = await c.stub.GetSubscription(pb.GetSubscriptionRequest(id=s.id))
                assert got == to_proto_subscription(s)
            r = await c.stub.Publish(
                pb.PublishRequest(
                    message=to_proto_message(Message("p2", probe.terms, probe.location))
                )
            )
            matching = [s for s in subs if subscription_matches(s, probe)]
            assert r.matched == len(matching)
            for s in matching:  # sequences continue after the restart
                got = await _collect(c.stub, s.id)
                assert [(d.sequence, d.message.id) for d in got] == [(1, "p"), (2, "p2")]

    run(main())


def test_invalid_requests_name_the_field_and_health_says_serving(ray_session, redis_url):
    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            health = health_pb2_grpc.HealthStub(c.channel)
            h = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert h.status == health_pb2.HealthCheckResponse.SERVING
            bad = pb.Subscription(
                id="b", keywords=["x"], rect=pb.Rect(min_lon=0, min_lat=95, max_lon=1, max_lat=96)
            )
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.stub.Subscribe(pb.SubscribeRequest(subscription=bad))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "subscription.rect.min_lat=95.0" in e.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.stub.UpdateLocation(
                    pb.UpdateLocationRequest(id="nobody", point=pb.Point(lon=0, lat=0))
                )
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.stub.Publish(
                    pb.PublishRequest(message=pb.Message(keywords=["x"], point=pb.Point(lon=181)))
                )
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "message.point.lon=181.0" in e.value.details()
            # nothing accepted before was lost
            stats = await c.stub.GetStats(pb.GetStatsRequest())
            assert stats.subscriptions == 0

    run(main())


def test_a_dead_round_loop_answers_unavailable_and_health_says_not_serving(ray_session, redis_url):
    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:

            async def broken(rnd):
                raise RuntimeError("a bug in the delivery stage")

            c.app.engine.on_round = broken
            m = pb.PublishRequest(message=pb.Message(keywords=["x"], point=pb.Point(lon=1)))
            for _ in range(2):  # the round that fails, then one after
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.stub.Publish(m, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "a bug in the delivery stage" in e.value.details()
            health = health_pb2_grpc.HealthStub(c.channel)
            h = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert h.status == health_pb2.HealthCheckResponse.NOT_SERVING

    run(main())


def test_moving_deliveries_reach_the_stream_in_order(ray_session, redis_url):
    sub = Subscription("w", (("x",),), Rect(-1, -1, 1, 1), moving=True)

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            for i, x in enumerate([-5, 0, 5]):
                m = Message(f"q{i}", ("x",), Point(x, 0), ttl=3600.0)
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))

            async def moves():
                for x in [-5, 5, 0]:
                    yield pb.UpdateLocationRequest(id="w", point=pb.Point(lon=x, lat=0))

            got = [(d.kind, d.message.id) async for d in c.stub.LocationStream(moves())]
            add, rem = pb.Delivery.ADD, pb.Delivery.REMOVE
            assert got == [
                (rem, "q1"),
                (add, "q0"),
                (rem, "q0"),
                (add, "q2"),
                (rem, "q2"),
                (add, "q1"),
            ]
            stream = await _collect(c.stub, "w")
            assert [(d.kind, d.message.id) for d in stream] == [(add, "q1"), *got]
            assert list(itertools.accumulate(1 for _ in stream)) == [d.sequence for d in stream]

    run(main())


def test_a_crashed_shard_is_reloaded_from_the_subscriptions(ray_session, redis_url):
    import ray

    rng = random.Random(8)
    subs = [random_subscription(rng, f"c{i}") for i in range(60)]
    probes = [random_message(rng, f"p{i}") for i in range(20)]

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await _subscribe_all(c.stub, subs)
            ray.kill(c.actors[0], no_restart=False)  # the process dies; Ray restarts it empty
            failures = 0
            for m in probes:
                while True:
                    try:
                        r = await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
                        break
                    except grpc.aio.AioRpcError as e:
                        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                        failures += 1
                        assert failures < 100  # (20 s for the shard to be reloaded)
                        await asyncio.sleep(0.2)
                assert r.matched == sum(subscription_matches(s, m) for s in subs), m
            assert c.app.engine.stats["shard_failures"] >= 1
            stats = await c.stub.GetStats(pb.GetStatsRequest())
            assert stats.shard_failures == c.app.engine.stats["shard_failures"]

    run(main())


def test_the_retention_log_keeps_retention_max_deliveries_and_says_what_it_dropped(
    ray_session, redis_url
):
    sub = Subscription("keep", (("x",),), Rect(-1, -1, 1, 1))

    async def main():
        async with Cluster(
            coordinator_settings(redis_url, uuid.uuid4().hex, retention_max=10)
        ) as c:
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            for i in range(300):
                m = Message(f"k{i}", ("x",), Point(0, 0))
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            got = await _collect(c.stub, "keep")
            assert (got[0].kind, got[0].gap_from, got[0].sequence) == (pb.Delivery.GAP, 1, 290)
            assert [(d.sequence, d.message.id) for d in got[1:]] == [
                (i + 1, f"k{i}") for i in range(290, 300)
            ]

    run(main())


def test_an_ephemeral_subscription_streams_live_but_keeps_no_log(ray_session, redis_url):
    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            sub = to_proto_subscription(Subscription("e", (("x",),), Rect(-1, -1, 1, 1)))
            sub.ephemeral = True
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=sub))
            got = await c.stub.GetSubscription(pb.GetSubscriptionRequest(id="e"))
            assert got.ephemeral
            m = Message("before", ("x",), Point(0, 0))
            r = await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            assert r.matched == 1
            (gap,) = await _collect(c.stub, "e")  # nothing was logged: said so
            assert (gap.kind, gap.gap_from, gap.sequence) == (pb.Delivery.GAP, 1, 1)
            call = c.stub.StreamResults(pb.StreamResultsRequest(id="e"))
            await asyncio.sleep(0.3)  # the stream is open before the next publish
            m = Message("live", ("x",), Point(0, 0))
            await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            gap = await asyncio.wait_for(call.read(), 5)
            d = await asyncio.wait_for(call.read(), 5)
            call.cancel()
            assert (gap.kind, gap.gap_from, gap.sequence) == (pb.Delivery.GAP, 1, 1)
            assert (d.sequence, d.message.id) == (2, "live")

    run(main())


def test_a_durable_subscription_made_ephemeral_keeps_numbering_after_its_log(
    ray_session, redis_url
):
    ns = uuid.uuid4().hex
    sub = to_proto_subscription(Subscription("d", (("x",),), Rect(-1, -1, 1, 1)))

    async def publish(c, mid):
        m = Message(mid, ("x",), Point(0, 0))
        await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))

    async def main():
        async with Cluster(coordinator_settings(redis_url, ns)) as c:
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=sub))
            for i in range(3):
                await publish(c, f"old{i}")
            sub.ephemeral = True
            await c.stub.Subscribe(pb.SubscribeRequest(subscription=sub))
        async with Cluster(
            coordinator_settings(redis_url, ns)
        ) as c:  # restarted: numbering from Redis
            call = c.stub.StreamResults(pb.StreamResultsRequest(id="d"))
            got = [await asyncio.wait_for(call.read(), 5) for _ in range(3)]
            await publish(c, "new")
            got.append(await asyncio.wait_for(call.read(), 5))
            call.cancel()
            assert [(d.sequence, d.message.id) for d in got] == [
                (1, "old0"),
                (2, "old1"),
                (3, "old2"),
                (4, "new"),
            ]

    run(main())


def test_reload_serves_subscriptions_written_to_redis_behind_its_back(ray_session, redis_url):
    """What ``geopubsub load --coordinator`` does: subscriptions land in Redis, Reload rebuilds."""
    rng = random.Random(21)
    subs = [random_subscription(rng, f"L{i}") for i in range(50)]
    probe = random_message(rng, "probe")
    ns = uuid.uuid4().hex

    async def main():
        async with Cluster(coordinator_settings(redis_url, ns)) as c:
            md = Metadata(redis_url, ns)
            await md.put_subscriptions([(s, (0,)) for s in subs])  # placement is recomputed
            await md.close()
            assert await asyncio.to_thread(request_reload, Endpoint(f"127.0.0.1:{c.port}"))
            r = await c.stub.Publish(pb.PublishRequest(message=to_proto_message(probe)))
            assert r.matched == sum(subscription_matches(s, probe) for s in subs)
            stats = await c.stub.GetStats(pb.GetStatsRequest())
            assert stats.subscriptions == len(subs)

    run(main())


def test_batched_publish_equals_the_oracle_and_a_bad_batch_publishes_nothing(
    ray_session, redis_url
):
    rng = random.Random(23)
    subs = [random_subscription(rng, f"s{i}") for i in range(80)]
    msgs = [random_message(rng, f"m{i}") for i in range(120)]

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            await _subscribe_all(c.stub, subs)

            async def requests():  # batches of 1..40, and single messages between them
                i = 0
                while i < len(msgs):
                    k = rng.randint(1, 40)
                    if k == 1:
                        yield pb.PublishRequest(message=to_proto_message(msgs[i]))
                    else:
                        yield pb.PublishRequest(
                            messages=[to_proto_message(m) for m in msgs[i : i + k]]
                        )
                    i += k

            responses = [r async for r in c.stub.PublishStream(requests())]
            ids = [i for r in responses for i in (r.ids or [r.id])]
            matches = [x for r in responses for x in (r.matches if r.ids else [r.matched])]
            assert ids == [m.id for m in msgs]
            want = [sum(subscription_matches(s, m) for s in subs) for m in msgs]
            assert matches == want
            assert sum(r.matched for r in responses) == sum(want)
            await _assert_streams_equal_the_oracle(c.stub, subs, msgs)

            before = (await c.stub.GetStats(pb.GetStatsRequest())).published
            good = to_proto_message(Message("g", ("x",), Point(0, 0)))
            bad = pb.Message(id="b", keywords=["x"], point=pb.Point(lon=200, lat=0))
            cases = [
                (
                    pb.PublishRequest(messages=[good, good, good, bad]),
                    "messages[3].point.lon=200.0",
                ),
                (pb.PublishRequest(message=good, messages=[good]), "not both"),
                (pb.PublishRequest(messages=[good] * 10_001), "messages=10001"),
                (pb.PublishRequest(), "message=None"),
            ]
            for req, field in cases:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.stub.Publish(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in e.value.details()
            stored = to_proto_message(Message("dup", ("x",), Point(0, 0), ttl=60.0))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.stub.Publish(pb.PublishRequest(messages=[stored, stored]))
            assert "messages[1].id=" in e.value.details()
            assert (await c.stub.GetStats(pb.GetStatsRequest())).published == before

    run(main())


def _applied(updates: list[tuple[Sign, str]], held: set[str]) -> set[str]:
    """The result set after ``updates`` in order, from ``held``; each must add a message not
    held or remove one held."""
    held = set(held)
    for g, m in updates:
        assert (m in held) == (g == REMOVE), (g, m)
        (held.add if g == ADD else held.remove)(m)
    return held


def test_batched_moves_equal_the_in_process_tree_and_a_bad_batch_moves_nothing(
    ray_session, redis_url
):
    """Moving subscriptions walk across the shard boundary in batches of moves (LocationStream
    and UpdateLocation, a subscription twice in one batch too); each gets exactly the updates
    the in-process AP+-Tree gives for the same moves in the same order."""
    rng = random.Random(8)
    words = ["a", "b"]
    msgs = []
    for i in range(60):
        kws = tuple(sorted(set(rng.choices(words, k=2))))
        if i % 5 == 0:
            x0 = rng.uniform(-3, 2)
            loc = Rect(x0, -1, x0 + rng.uniform(0, 2), 1)
        else:
            loc = Point(round(rng.uniform(-3, 3), 2), round(rng.uniform(-2, 2), 2))
        msgs.append(Message(f"m{i}", kws, loc, ttl=3600.0, keywords=kws))
    movers = [
        Subscription(f"w{k}", ((rng.choice(words),),), Rect(-3, -0.5, -2, 0.5), moving=True)
        for k in range(5)
    ]
    moves = [
        (rng.choice(movers).id, Point(round(rng.uniform(-3, 3), 2), round(rng.uniform(-1, 1), 2)))
        for _ in range(70)
    ]

    def request(part):
        return pb.UpdateLocationRequest(
            moves=[pb.LocationUpdate(id=s, point=pb.Point(lon=p.lon, lat=p.lat)) for s, p in part]
        )

    async def main():
        async with Cluster(coordinator_settings(redis_url, uuid.uuid4().hex)) as c:
            ref = APPlusTree()
            for s in movers:
                await c.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(s)))
                ref.subscribe(s, 0.0)
            for m in msgs:
                await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
            first = {s.id: set() for s in movers}
            for s, _, m in ref.publish_batch(msgs, 0.0):
                first[s].add(m)
            want = {s.id: [] for s in movers}
            for t, (sid, p) in enumerate(moves, start=1):
                for s, g, m in ref.move(sid, p, float(t)):
                    want[s].append((g, m))

            async def requests():
                for a in range(0, 50, 7):
                    yield request(moves[a : min(a + 7, 50)])

            got = {s.id: [] for s in movers}
            async for d in c.stub.LocationStream(requests()):
                got[d.subscription_id].append((Sign(d.kind), d.message.id))
            r = await c.stub.UpdateLocation(request(moves[50:]))
            for d in r.updates:
                got[d.subscription_id].append((Sign(d.kind), d.message.id))
            for s in movers:
                assert sorted(got[s.id]) == sorted(want[s.id]), s.id
                held = first[s.id]  # in order, too
                assert _applied(got[s.id], held) == _applied(want[s.id], held), s.id
            assert sum(map(len, got.values())) > 20

            before = {s.id: c.app.engine.subs[s.id].region for s in movers}
            bad = [
                (request([moves[0], ("nobody", Point(0, 0))]), grpc.StatusCode.NOT_FOUND, "nobody"),
                (
                    pb.UpdateLocationRequest(
                        moves=[
                            pb.LocationUpdate(id="w0", point=pb.Point(lon=1, lat=0)),
                            pb.LocationUpdate(id="w1", point=pb.Point(lon=1, lat=95)),
                        ]
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "moves[1].point.lat",
                ),
                (
                    pb.UpdateLocationRequest(
                        id="w0", moves=[pb.LocationUpdate(id="w1", point=pb.Point())]
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "moves",
                ),
                (
                    request([("w0", Point(0, 0))] * 10_001),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "10000",
                ),
            ]
            for req, code, text in bad:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await c.stub.UpdateLocation(req)
                assert info.value.code() == code and text in info.value.details(), info.value
            assert {s.id: c.app.engine.subs[s.id].region for s in movers} == before
            stats = await c.stub.GetStats(pb.GetStatsRequest())
            assert (stats.moves, stats.published) == (len(moves), len(msgs))
            # micro-batched: a batch of moves is one round, not one per move
            assert len(movers) < stats.rounds < len(movers) + len(msgs) + len(moves)
            assert (stats.rejected_overload, stats.shard_failures) == (0, 0)
            assert stats.unlogged_deliveries == 0

    run(main())
