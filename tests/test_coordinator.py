"""The coordinator's own rules, with in-process shards (``LocalShard``) and a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc
import pytest
import redis

from coordinator import server as server_mod
from coordinator.engine import ROUNDS_IN_FLIGHT, Engine
from coordinator.metadata import Metadata
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard
from coordinator.topk import TOPK_PER_ROUND
from deploy.redis_local import RedisServer
from geopubsub.client import GeoPubSubClient
from geopubsub.convert import to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import OverloadedError, StoreFullError, UnavailableError, ValidationError
from shard.limits import MAX_SUBSCRIBE_BATCH
from shard.model import Message, Point, Rect, Subscription, subscription_from_dict
from shard.partition_map import PartitionMap


def _settings(redis_url: str, **kw) -> Settings:
    """Settings for a coordinator on any free port, in a namespace of its own."""
    return Settings.load(
        flags={"port": 0, "redis_url": redis_url, "namespace": uuid.uuid4().hex, **kw}
    )


class SlowShard(LocalShard):
    async def apply(self, ops, now):
        await asyncio.sleep(0.3)  # one slow round (a cold or busy shard)
        return await super().apply(ops, now)


def test_a_subscribe_past_its_deadline_is_still_kept_across_a_restart(redis_url):
    """Answered once applied (``subscribe_ack="applied"``): the call times out but its round
    still applies it: Redis must have it too."""

    async def main():
        s = _settings(redis_url, deadline_s=0.1, subscribe_ack="applied")
        server, port, app = await create_server(s, lambda k: SlowShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            sub = Subscription("late", (("x",),), Rect(0, 0, 1, 1))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the server's deadline_s
            assert "deadline_s=0.1" in e.value.details()
            await asyncio.sleep(0.5)
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="late"))
            assert got.id == "late"
        await stop_server(server, app)
        server, port, app = await create_server(s, lambda k: LocalShard(k))  # a restart
        assert "late" in app.engine.subs
        await stop_server(server, app)

    asyncio.run(main())


def test_a_subscribe_answered_once_stored_is_found_and_matched_at_once(redis_url):
    """Answered once Redis holds it (``subscribe_ack="stored"``, the default), before a slow
    round: GetSubscription finds it at once, a publish sent after the answer reaches it (its
    round comes after the subscribe's), an Unsubscribe finds it, and a restart keeps it."""

    async def main():
        s = _settings(redis_url, deadline_s=5.0, subscribe_defer_ms=200.0)
        assert s.subscribe_ack == "stored"
        server, port, app = await create_server(s, lambda k: SlowShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            subs = [Subscription(f"early{i}", (("x",),), Rect(0, 0, 1, 1)) for i in range(3)]
            t0 = time.perf_counter()
            for sub in subs:
                req = pb.SubscribeRequest(subscription=to_proto_subscription(sub))
                assert (await stub.Subscribe(req)).id == sub.id
            assert time.perf_counter() - t0 < 0.25  # no round waited for (each takes 0.3 s)
            assert "early0" in app.engine.waiting  # (its round has not been routed yet)
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="early0"))
            assert got.id == "early0"
            stream = stub.StreamResults(pb.StreamResultsRequest(id="early0"))  # before its round
            msg = pb.Message(id="m", keywords=["x"], point=pb.Point(lon=0.5, lat=0.5))
            reached = await stub.Publish(pb.PublishRequest(message=msg))
            assert reached.matched == 3
            assert not app.engine.waiting
            first = await asyncio.wait_for(stream.read(), 5.0)
            assert (first.sequence, first.kind, first.message.id) == (1, pb.Delivery.ADD, "m")
            stream.cancel()
            await stub.Unsubscribe(pb.UnsubscribeRequest(id="early2"))
        await stop_server(server, app)
        server, port, app = await create_server(s, lambda k: LocalShard(k))  # a restart
        assert {"early0", "early1"} <= set(app.engine.subs) and "early2" not in app.engine.subs
        await stop_server(server, app)

    asyncio.run(main())


async def _first(stub, sub_id: str, n: int, wait_s: float) -> list[tuple]:
    """(sequence, kind, message id) of the first ``n`` deliveries of ``sub_id``'s stream, or of
    as many as came before one was ``wait_s`` late."""
    call = stub.StreamResults(pb.StreamResultsRequest(id=sub_id))
    got = []
    with contextlib.suppress(TimeoutError):
        while len(got) < n:
            got.append(await asyncio.wait_for(call.read(), wait_s))
    call.cancel()
    return [(d.sequence, d.kind, d.message.id) for d in got]


def test_subscribes_answered_before_a_reload_are_loaded_and_told(redis_url):
    """Subscribes answered once stored and waiting for their round when a Reload comes: their
    round goes first (a reload loads the shards as Redis has them and would not tell them),
    so each is told its ADD for the message live before it, once; a publish after reaches
    them. (Before the fix: only "A" came.)"""

    async def main():
        s = _settings(redis_url, subscribe_defer_ms=1000.0)
        server, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            live = pb.Message(id="L", keywords=["x"], point=pb.Point(lon=0.5, lat=0.5), ttl_s=60)
            await stub.Publish(pb.PublishRequest(message=live))
            for i in range(3):
                sub = Subscription(f"w{i}", (("x",),), Rect(0, 0, 1, 1))
                await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            assert len(app.engine.waiting) == 3  # (the reload comes before their round)
            await stub.Reload(pb.ReloadRequest(), timeout=60)
            assert not app.engine.waiting and len(app.engine.subs) == 3
            after = pb.Message(id="A", keywords=["x"], point=pb.Point(lon=0.5, lat=0.5))
            assert (await stub.Publish(pb.PublishRequest(message=after))).matched == 3
            for i in range(3):
                assert await _first(stub, f"w{i}", 2, 2.0) == [
                    (1, pb.Delivery.ADD, "L"),
                    (2, pb.Delivery.ADD, "A"),
                ]
            assert await app.md.untold() == {}
        await stop_server(server, app)

    asyncio.run(main())


def test_subscribes_waiting_for_their_round_when_a_reload_comes_are_told(redis_url):
    """``subscribe_ack = "applied"``: Subscribes still queued for their round when a Reload
    comes go in a round first and are answered OK; each is told its ADD for the message live
    before it, once. (Before the fix: they were answered UNAVAILABLE, loaded from Redis by the
    reload and never told "L"; sent again, an unchanged subscription had nothing new to tell.)"""

    async def main():
        s = _settings(redis_url, subscribe_ack="applied", batch_delay_ms=2000.0)
        server, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            live = pb.Message(id="L", keywords=["x"], point=pb.Point(lon=0.5, lat=0.5), ttl_s=60)
            await stub.Publish(pb.PublishRequest(message=live))
            calls = [
                asyncio.ensure_future(
                    stub.Subscribe(
                        pb.SubscribeRequest(
                            subscription=to_proto_subscription(
                                Subscription(f"w{i}", (("x",),), Rect(0, 0, 1, 1))
                            )
                        )
                    )
                )
                for i in range(3)
            ]
            while sum(op.kind == "sub" for op in app.engine.pending) < 3:
                await asyncio.sleep(0.01)
            await stub.Reload(pb.ReloadRequest(), timeout=60)
            for c in calls:
                await c  # OK: their round went before the reload
            assert len(app.engine.subs) == 3
            for i in range(3):
                assert await _first(stub, f"w{i}", 2, 1.0) == [(1, pb.Delivery.ADD, "L")]
            assert await app.md.untold() == {}
        await stop_server(server, app)

    asyncio.run(main())


class CountingShard(LocalShard):
    """Records every round's share and how many rounds are at the shard at once."""

    def __init__(self, k: int, delay_s: float) -> None:
        super().__init__(k)
        self.delay_s = delay_s
        self.sizes: list[int] = []
        self.busy = 0
        self.most_busy = 0

    async def apply(self, ops, now):
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            await asyncio.sleep(self.delay_s)
            self.sizes.append(len(ops))
            return await super().apply(ops, now)
        finally:
            self.busy -= 1


def _engine(shards, **kw):
    async def on_round(rnd):
        for op, a, b in rnd.spans:
            if not op.future.done():
                op.future.set_result(b - a)

    pm = PartitionMap.build([(-10.0, 0.0), (10.0, 0.0)], len(shards))
    return Engine(shards, pm, on_round=on_round, **kw)


def _messages(n: int, prefix: str):
    return [Message(f"{prefix}{i}", ("x",), Point(-10.0 + (i % 2) * 20.0, 0.0)) for i in range(n)]


def test_a_light_load_gathers_into_few_rounds_and_a_heavy_one_keeps_shards_busy():
    """While a round is at the shards, what trickles in waits for it and goes out together;
    a full round's worth goes out at once, up to ROUNDS_IN_FLIGHT rounds at a shard."""

    async def main():
        shards = [CountingShard(k, 0.03) for k in range(2)]
        eng = _engine(shards, batch_max=16, batch_delay_ms=2.0)
        eng.start()
        futs = []
        for m in _messages(60, "a"):  # ~2 ms apart: 15 per 30 ms round trip
            futs += eng.publish_many([m], [b""], ["m"])
            await asyncio.sleep(0.002)
        await asyncio.gather(*futs)
        light = eng.stats["rounds"]
        assert light <= 8, light  # one round per round trip, not one per 2 ms (before: 13)
        assert max(sh.most_busy for sh in shards) == 1
        futs = eng.publish_many(_messages(200, "b"), [b""] * 200, ["m"] * 200)  # a burst
        await asyncio.gather(*futs)
        assert max(sh.most_busy for sh in shards) == ROUNDS_IN_FLIGHT
        assert max(max(sh.sizes) for sh in shards) <= 16  # batch_max per shard
        await eng.stop()

    asyncio.run(main())


def test_answered_subscribes_wait_for_their_round_until_another_operation_comes():
    """Subscribes answered before their round (``deferred``) go to the shards together, at
    the latest ``defer_ms`` after the first; a publish queued after them is not held for that:
    it takes them along in a round that goes after ``batch_delay_ms``, in arrival order."""

    async def main():
        shards = [CountingShard(k, 0.0) for k in range(2)]
        eng = _engine(shards, batch_max=64, batch_delay_ms=2.0, defer_ms=10_000.0)
        eng.start()
        subs = [Subscription(f"d{i}", (("x",),), Rect(-20, -5, 20, 5)) for i in range(20)]
        futs = []
        for sub in subs:  # arriving 1 ms apart
            assert eng.may_defer(1)
            futs += eng.subscribe_many([sub], deferred=True)
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        assert eng.stats["rounds"] == 0 and set(eng.waiting) == {s.id for s in subs}
        assert "d3" in eng.subs and len(eng.subs) == 20  # found before they are routed
        t0 = time.perf_counter()
        (reached,) = eng.publish_many(_messages(1, "p"), [b""], ["m"])
        assert await reached == 20  # the round took the subscribes first
        assert time.perf_counter() - t0 < 2.0  # (not the 10 s they could have waited)
        assert all(f.done() for f in futs) and not eng.waiting
        assert eng.stats["rounds"] == 1 and sorted(n for sh in shards for n in sh.sizes) == [20, 21]
        (late,) = eng.subscribe_many([Subscription("z", (("x",),), Rect(0, 0, 1, 1))])
        await late  # not deferred: its round goes after batch_delay_ms
        assert not eng.may_defer(65)  # (past batch_max with those waiting: answered once applied)
        await eng.stop()

    asyncio.run(main())


def test_a_burst_of_top_k_publishes_is_spread_over_rounds_of_a_few():
    """Each top-k publish is a search at every shard: a round carries at most TOPK_PER_ROUND of
    them (a full round of 1,024 had 1M-subscription shards search past their call limit), the
    plain publishes beside them go as before, and every one is answered."""

    async def main():
        shards = [CountingShard(k, 0.001) for k in range(2)]
        topk_per_round: list[int] = []
        for sh in shards:
            plain_apply = sh.apply

            async def apply(ops, now, plain_apply=plain_apply):
                topk_per_round.append(sum(op[0] == "topk" for op in ops))
                return await plain_apply(ops, now)

            sh.apply = apply
        eng = _engine(shards, batch_max=512)
        eng.start()
        point = [Message(f"k{i}", (), Point(-10.0 + (i % 2) * 20.0, 0.0)) for i in range(100)]
        futs = eng.publish_many(point, [b""] * 100, ["m"] * 100, top_k=3)
        futs += eng.publish_many(_messages(300, "p"), [b""] * 300, ["m"] * 300)
        await asyncio.gather(*futs)
        assert max(topk_per_round) == TOPK_PER_ROUND, topk_per_round
        assert sum(topk_per_round) == 2 * 100  # every top-k publish at both shards, once
        assert max(max(sh.sizes) for sh in shards) > TOPK_PER_ROUND  # plain ones still batch
        await eng.stop()

    asyncio.run(main())


def test_a_round_loop_that_dies_answers_unavailable_and_says_so():
    """A bug in the delivery stage must not leave callers waiting for their deadlines: the
    round's callers, the waiting ones and every later one get UNAVAILABLE naming the error,
    and ``on_failure`` hears of it (the server's health check)."""

    async def main():
        failures = []

        async def on_round(rnd):
            raise RuntimeError("numbering broke")

        pm = PartitionMap.build([(-10.0, 0.0), (10.0, 0.0)], 2)
        shards = [CountingShard(k, 0.01) for k in range(2)]
        eng = Engine(shards, pm, on_round=on_round, on_failure=failures.append)
        eng.start()
        first = eng.publish_many(_messages(3, "a"), [b""] * 3, ["m"] * 3)
        for f in first:
            with pytest.raises(UnavailableError, match="numbering broke"):
                await asyncio.wait_for(f, 5)
        await asyncio.sleep(0.05)
        assert len(failures) == 1 and "numbering broke" in str(failures[0])
        with pytest.raises(UnavailableError, match="round loop failed.*numbering broke"):
            eng.publish_many(_messages(1, "b"), [b""], ["m"])
        await eng.stop()

    asyncio.run(main())


def test_stored_messages_past_max_live_messages_are_refused_whole_until_some_expire():
    """Stored messages count while they wait for their round and while live; a batch that
    would pass the cap queues nothing; one-shot messages never count; an expiry frees room."""

    async def main():
        t = [1000.0]
        shards = [LocalShard(k) for k in range(2)]
        eng = _engine(shards, max_live_messages=3, clock=lambda: t[0])
        eng.start()
        stored = [
            Message(f"s{i}", ("x",), Point(-10.0 + 20 * (i % 2), 0), ttl=10.0) for i in range(5)
        ]
        one_shot = _messages(4, "o")
        fields = [f"messages[{i}]" for i in range(3)]
        first = eng.publish_many(stored[:2], [b""] * 2, fields[:2])  # waiting, not yet live
        with pytest.raises(OverloadedError) as e:
            eng.publish_many([one_shot[0], stored[2], stored[3]], [b""] * 3, fields)
        assert str(e.value) == (
            "messages[2].ttl_s=10.0: 2 stored messages live or waiting, at most "
            "max_live_messages=3; retry once some expire"
        )
        assert eng.stats["rejected_live_cap"] == 1
        await asyncio.gather(*first)
        assert sorted(eng.live) == ["s0", "s1"]  # the refused batch queued nothing
        await asyncio.gather(*eng.publish_many(one_shot, [b""] * 4, ["m"] * 4))
        await asyncio.gather(*eng.publish_many([stored[2]], [b""], ["message"]))
        with pytest.raises(OverloadedError, match=r"^message\.ttl_s=10\.0: 3 stored .*=3;"):
            eng.publish_many([stored[3]], [b""], ["message"])
        assert eng.stats["rejected_live_cap"] == 2 and len(eng.live) == 3
        t[0] += 10.0  # all three expire; the next round drops them
        await asyncio.gather(*eng.publish_many(one_shot[:1], [b""], ["message"]))
        assert eng.live == {}
        await asyncio.gather(*eng.publish_many(stored[3:], [b""] * 2, fields[:2]))
        assert sorted(eng.live) == ["s3", "s4"]
        await eng.stop()

    asyncio.run(main())


async def _refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


def _msg(ttl_s: float, **kw) -> pb.Message:
    return pb.Message(keywords=["x"], point=pb.Point(lon=0.5, lat=0.5), ttl_s=ttl_s, **kw)


def test_deep_expressions_long_ttls_and_the_live_cap_are_answered_by_name(redis_url):
    """Through gRPC: 400 nested parentheses are INVALID_ARGUMENT (they were a RecursionError,
    INTERNAL), a ttl past ``max_ttl_s`` (or MAX_TTL_S) INVALID_ARGUMENT, a stored message past
    ``max_live_messages`` RESOURCE_EXHAUSTED; each names the field and the value, and a refused
    request publishes nothing."""
    invalid, exhausted = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED

    async def main():
        s = _settings(redis_url, max_ttl_s=60.0, max_live_messages=2)
        server, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            deep = pb.Subscription(
                id="deep", expr="(" * 400 + "x" + ")" * 400, rect=pb.Rect(max_lon=1, max_lat=1)
            )
            e = await _refused(stub.Subscribe(pb.SubscribeRequest(subscription=deep)))
            assert e.code() == invalid, e.details()
            assert e.details().startswith("subscription.expr='((((")
            assert e.details().endswith(": parentheses nested more than 32 deep at position 32")

            e = await _refused(stub.Publish(pb.PublishRequest(message=_msg(60.5))))
            assert (e.code(), e.details()) == (
                invalid,
                "message.ttl_s=60.5: must be at most 60 seconds (the max_ttl_s setting)",
            )
            batch = [_msg(0.0), _msg(1e308)]
            e = await _refused(stub.Publish(pb.PublishRequest(messages=batch)))
            assert e.code() == invalid
            assert e.details().startswith("messages[1].ttl_s=1e+308: must be at most 2592000")

            ok = await stub.Publish(pb.PublishRequest(message=_msg(60.0, id="a")))
            assert ok.id == "a"
            batch = [_msg(0.0), _msg(5.0, id="b"), _msg(5.0, id="c")]
            e = await _refused(stub.Publish(pb.PublishRequest(messages=batch)))
            assert (e.code(), e.details()) == (
                exhausted,
                "messages[2].ttl_s=5.0: 1 stored messages live or waiting, at most "
                "max_live_messages=2; retry once some expire",
            )
            await stub.Publish(pb.PublishRequest(message=_msg(5.0, id="b")))
            e = await _refused(stub.Publish(pb.PublishRequest(message=_msg(5.0, id="c"))))
            assert e.code() == exhausted and e.details().startswith("message.ttl_s=5.0: 2 stored")
            await stub.Publish(pb.PublishRequest(message=_msg(0.0)))  # one-shot: not counted
            stats = await stub.GetStats(pb.GetStatsRequest())
            assert (stats.published, stats.live_messages) == (3, 2)
            assert app.engine.stats["rejected_live_cap"] == 2
        await stop_server(server, app)

    asyncio.run(main())


@pytest.fixture
def small_redis(tmp_path):
    """A private redis-server capped at 2 MB (about 1 MB above an empty one), and a client."""
    server = RedisServer(tmp_path, maxmemory_mb=2).start()
    raw = redis.Redis.from_url(server.url)
    yield server, raw
    raw.close()
    server.stop()


def _fill(raw: redis.Redis) -> list[str]:
    """Write values until Redis refuses even the smallest (its maxmemory: a refused write's
    arguments count until it is refused, so large values alone leave room); their keys."""
    keys: list[str] = []
    for size in (65536, 4096, 256, 16, 1):
        while len(keys) < 10_000:
            try:
                raw.set(f"filler:{len(keys)}", b"x" * size)
            except redis.exceptions.OutOfMemoryError:
                break
            keys.append(f"filler:{len(keys)}")
    assert keys and len(keys) < 10_000, "Redis did not fill up"
    return keys


def test_a_full_redis_answers_resource_exhausted_and_keeps_nothing_of_the_subscribe(small_redis):
    """At its maxmemory (noeviction) Redis refuses writes: a Subscribe answers
    RESOURCE_EXHAUSTED naming maxmemory (it was UNAVAILABLE), neither Redis nor the engine keeps
    any of it, and once there is room again the same Subscribe succeeds."""
    server, raw = small_redis
    config = raw.config_get("maxmemory*")
    assert (config["maxmemory"], config["maxmemory-policy"]) == (str(2 * 2**20), "noeviction")
    ns = uuid.uuid4().hex
    sub = pb.SubscribeRequest(
        subscription=pb.Subscription(id="s1", keywords=["x"], rect=pb.Rect(max_lon=1, max_lat=1))
    )

    async def main():
        s = Settings.load(flags={"port": 0, "redis_url": server.url, "namespace": ns})
        srv, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            filler = _fill(raw)
            e = await _refused(stub.Subscribe(sub))
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
            assert f"redis at {server.url} is full" in e.details()
            assert "maxmemory (policy noeviction)" in e.details()
            e = await _refused(stub.GetSubscription(pb.GetSubscriptionRequest(id="s1")))
            assert e.code() == grpc.StatusCode.NOT_FOUND
            assert raw.keys(f"{ns}:sub*") == []
            raw.delete(*filler)
            await stub.Subscribe(sub)
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="s1"))
            assert list(got.keywords) == ["x"]
            assert raw.smembers(f"{ns}:subs") == {b"s1"}
        await stop_server(srv, app)

    asyncio.run(main())


def test_a_full_redis_still_lets_subscriptions_go(small_redis):
    """At its maxmemory Redis refuses writes, but an Unsubscribe frees memory: it succeeds and
    forgets the subscription whole (its hash, position, and membership of the id and ephemeral
    sets: one script that runs under ``allow-oom``)."""
    server, raw = small_redis
    ns = uuid.uuid4().hex
    subs = [
        pb.Subscription(id=f"s{i}", keywords=["x"], rect=pb.Rect(max_lon=1, max_lat=1))
        for i in range(3)
    ]
    subs[1].ephemeral = True

    async def main():
        s = Settings.load(flags={"port": 0, "redis_url": server.url, "namespace": ns})
        srv, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            await stub.Subscribe(pb.SubscribeRequest(subscriptions=subs))
            assert raw.smembers(f"{ns}:ephemeral") == {b"s1"}
            for sid in ("s0", "s1", "s2"):  # as if they had moved (rounds write these)
                raw.hset(app.md.pos_key, sid, b"\0" * 16)
            filler = _fill(raw)
            await stub.Unsubscribe(pb.UnsubscribeRequest(ids=["s0", "s1"]))
            assert raw.smembers(f"{ns}:subs") == {b"s2"}
            assert raw.smembers(f"{ns}:ephemeral") == set()
            assert not raw.exists(f"{ns}:sub:s0", f"{ns}:sub:s1")
            assert not raw.hexists(app.md.pos_key, "s0") and not raw.hexists(app.md.pos_key, "s1")
            assert raw.exists(f"{ns}:sub:s2") and raw.hexists(app.md.pos_key, "s2")
            raw.delete(*filler)
        await stop_server(srv, app)

    asyncio.run(main())


def test_one_subscription_is_written_whole_or_not_at_all_at_the_maxmemory_border(small_redis):
    """Swept across the border of Redis's maxmemory, ``put_subscriptions`` of one subscription
    (a Subscribe) leaves all of it or none (a pipeline left parts: the hash without the id in
    the set, or the reverse)."""
    server, raw = small_redis
    ns = uuid.uuid4().hex
    big = subscription_from_dict(  # ~2.5 kB written: the border falls inside it
        {"id": "s" * 128, "expr": " OR ".join(f"t{i:08d}" for i in range(60)), "rect": [0, 0, 1, 1]}
    )
    fields = {b"created", b"sub", b"shards", b"updated"}

    async def main():
        md = Metadata(server.url, ns)
        await md.ping()
        seen = set()
        for margin in range(0, 8000, 200):
            raw.delete(f"{ns}:sub:{big.id}", f"{ns}:subs")
            raw.config_set("maxmemory", int(raw.info("memory")["used_memory"]) + margin)
            try:
                await md.put_subscriptions([(big, (0,))])
                written = True
            except StoreFullError:
                written = False
            finally:
                raw.config_set("maxmemory", 2 * 2**20)
            state = (set(raw.hkeys(f"{ns}:sub:{big.id}")), raw.smembers(f"{ns}:subs"))
            assert state == ((fields, {big.id.encode()}) if written else (set(), set())), margin
            seen.add(written)
        assert seen == {True, False}  # the sweep crossed the border
        await md.close()

    asyncio.run(main())


def _psub(i, **kw) -> pb.Subscription:
    return pb.Subscription(
        id=f"b{i}", keywords=["x"], rect=pb.Rect(min_lon=-20, max_lon=20, max_lat=1), **kw
    )


def test_subscribe_and_unsubscribe_batches_are_checked_and_applied_whole(redis_url):
    """``SubscribeRequest.subscriptions`` and ``UnsubscribeRequest.ids``: a bad item, an id given
    twice, both forms at once or too many is INVALID_ARGUMENT naming it and registers (removes)
    nothing; an unknown id in an Unsubscribe batch is NOT_FOUND and removes none; a good batch
    reaches Redis (ephemeral flags included), the engine and the shards; the client's
    ``subscribe_many`` / ``unsubscribe_many`` send such batches."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    raw = redis.Redis.from_url(redis_url)

    async def main():
        s = _settings(redis_url)
        ns = s.namespace
        server, port, app = await create_server(s, lambda k: LocalShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            bad = [_psub(0), _psub(1), _psub(2)]
            bad[1].rect.max_lat = 91
            e = await _refused(stub.Subscribe(pb.SubscribeRequest(subscriptions=bad)))
            assert e.code() == invalid and e.details().startswith(
                "subscriptions[1].rect.max_lat=91"
            )
            twice = [_psub(0), _psub(1), _psub(0)]
            e = await _refused(stub.Subscribe(pb.SubscribeRequest(subscriptions=twice)))
            assert (e.code(), e.details()) == (
                invalid,
                "subscriptions[2].id='b0': given twice in the batch",
            )
            both = pb.SubscribeRequest(subscription=_psub(9), subscriptions=[_psub(0)])
            e = await _refused(stub.Subscribe(both))
            assert e.code() == invalid and e.details().startswith("subscription='set'")
            many = [_psub(i) for i in range(MAX_SUBSCRIBE_BATCH + 1)]
            e = await _refused(stub.Subscribe(pb.SubscribeRequest(subscriptions=many)))
            assert e.code() == invalid and e.details().startswith(
                f"subscriptions={MAX_SUBSCRIBE_BATCH + 1}: at most {MAX_SUBSCRIBE_BATCH}"
            )
            assert not app.engine.subs and not raw.exists(f"{ns}:subs")

            batch = [_psub(0), _psub(1, ephemeral=True), _psub(2)]
            got = await stub.Subscribe(pb.SubscribeRequest(subscriptions=batch))
            assert (got.id, list(got.ids)) == ("", ["b0", "b1", "b2"])
            assert raw.smembers(f"{ns}:subs") == {b"b0", b"b1", b"b2"}
            assert raw.smembers(f"{ns}:ephemeral") == {b"b1"}
            assert app.slots.ephemeral == {"b1"}
            pub = await stub.Publish(pb.PublishRequest(message=_msg(0.0)))
            assert pub.matched == 3  # every shard has its share
            again = [_psub(1), _psub(3)]  # b1 replaced (durable now), b3 new
            await stub.Subscribe(pb.SubscribeRequest(subscriptions=again))
            assert raw.smembers(f"{ns}:ephemeral") == set() and app.slots.ephemeral == set()

            e = await _refused(stub.Unsubscribe(pb.UnsubscribeRequest(ids=["b0", "nope", "b2"])))
            assert (e.code(), e.details()) == (
                grpc.StatusCode.NOT_FOUND,
                "subscription 'nope' not found",
            )
            e = await _refused(stub.Unsubscribe(pb.UnsubscribeRequest(ids=["b0", "b0"])))
            assert (e.code(), e.details()) == (invalid, "ids[1]='b0': given twice in the batch")
            assert set(app.engine.subs) == {"b0", "b1", "b2", "b3"}
            await stub.Unsubscribe(pb.UnsubscribeRequest(ids=["b0", "b2"]))
            assert set(app.engine.subs) == {"b1", "b3"}
            assert raw.smembers(f"{ns}:subs") == {b"b1", b"b3"}
            assert not raw.exists(f"{ns}:sub:b0", f"{ns}:sub:b2")
            pub = await stub.Publish(pb.PublishRequest(message=_msg(0.0)))
            assert pub.matched == 2

            def with_client():
                with GeoPubSubClient(f"127.0.0.1:{port}") as c:
                    subs = [
                        {"id": f"c{i}", "keywords": ["x"], "rect": [0, 0, 1, 1]} for i in range(25)
                    ]
                    ids = c.subscribe_many(subs, batch=10, ephemeral=True)
                    assert ids == [f"c{i}" for i in range(25)]
                    assert c.publish(["x"], point=(0.5, 0.5)).matched == 27
                    c.unsubscribe_many(ids[5:], batch=7)
                    assert c.publish(["x"], point=(0.5, 0.5)).matched == 7
                    with pytest.raises(ValidationError):
                        c.subscribe_many(subs, batch=MAX_SUBSCRIBE_BATCH + 1)

            await asyncio.to_thread(with_client)
            assert app.slots.ephemeral == {f"c{i}" for i in range(5)}
        await stop_server(server, app)

    asyncio.run(main())
    raw.close()


def test_a_subscribe_batch_is_written_whole_or_not_at_all_at_the_maxmemory_border(small_redis):
    """The same sweep for a batch of five (with ephemeral flags): one transaction."""
    server, raw = small_redis
    ns = uuid.uuid4().hex
    batch = [
        subscription_from_dict({"id": f"s{i}", "expr": f"a{i} OR b", "rect": [0, 0, 1, 1]})
        for i in range(5)
    ]
    ids = {f"s{i}".encode() for i in range(5)}

    async def main():
        md = Metadata(server.url, ns)
        await md.ping()
        seen = set()
        for margin in range(0, 20_000, 250):
            raw.delete(*(f"{ns}:sub:{s.id}" for s in batch), f"{ns}:subs", f"{ns}:ephemeral")
            raw.config_set("maxmemory", int(raw.info("memory")["used_memory"]) + margin)
            try:
                await md.put_subscriptions(
                    [(s, (0,)) for s in batch], ephemeral=[i % 2 == 0 for i in range(5)]
                )
                written = True
            except StoreFullError:
                written = False
            finally:
                raw.config_set("maxmemory", 2 * 2**20)
            hashes = sum(raw.exists(f"{ns}:sub:{s.id}") for s in batch)
            state = (hashes, raw.smembers(f"{ns}:subs"), len(raw.smembers(f"{ns}:ephemeral")))
            assert state == ((5, ids, 3) if written else (0, set(), 0)), margin
            seen.add(written)
        assert seen == {True, False}
        await md.close()

    asyncio.run(main())


def test_stop_returns_even_if_the_health_watch_loses_its_cancellation(redis_url, monkeypatch):
    """What hung a CI run for 80 minutes: ``stop`` awaited the health watch task, whose
    cancellation a library call swallowed (simulated here), so it slept and looped forever."""
    real = server_mod.Coordinator._check_health

    async def swallowing(self):
        with contextlib.suppress(asyncio.CancelledError):  # the cancellation lands here, lost
            await asyncio.sleep(0.2)
        await real(self)

    monkeypatch.setattr(server_mod.Coordinator, "_check_health", swallowing)
    monkeypatch.setattr(server_mod, "HEALTH_CHECK_S", 0.05)

    async def main():
        server, _, app = await create_server(_settings(redis_url), lambda k: LocalShard(k))
        await asyncio.sleep(0.3)  # the watch is running, in a check now and then
        t0 = time.monotonic()
        await asyncio.wait_for(stop_server(server, app), 30)
        assert time.monotonic() - t0 < 10
        assert app._health_task.done()

    asyncio.run(main())
