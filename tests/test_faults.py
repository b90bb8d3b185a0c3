"""Faults the coordinator survives, each with the real thing and a real signal: a redis-server
stopped with SIGSTOP (calls answer UNAVAILABLE within the deadline, health follows, all is well
after SIGCONT), a shard actor's process stopped with SIGSTOP (the other shard keeps serving, the
stopped one's operations answer UNAVAILABLE, it is reloaded after SIGCONT, over the channel and
over Ray calls), and a shard actor killed with SIGKILL past its Ray restarts (a new actor takes
its place). The launcher's supervision of Redis and the coordinator is tested in
``test_supervise.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.health import REDIS_HEALTH, shard_health_name
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import RayShard
from deploy.redis_local import RedisServer
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.brute import subscription_matches
from shard.host.actor import make_shard_actor
from shard.model import Message, Point, Rect, Subscription

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DEADLINE_S = 1.0
"""The clusters' ``deadline_s``: small, so that the faults show quickly."""
SLACK_S = 5.0
"""What an answer "within the deadline" may take on top of it on this busy machine."""
WEST, EAST = Point(-10.0, 1.0), Point(10.0, 1.0)
"""A point of each shard: two shards split the world at longitude 0 (empty map sample)."""


def _settings(redis_url: str, **kw) -> Settings:
    flags = {"port": 0, "redis_url": redis_url, "namespace": uuid.uuid4().hex, "shards": 2}
    return Settings.load(flags={**flags, "deadline_s": DEADLINE_S, **kw})


class Cluster:
    """The coordinator with two shard actors made as ``python -m coordinator`` makes them
    (restart policy and timeouts from the settings), a client channel, and every actor it
    made (a replaced shard has two)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.actors: dict[int, list] = {}

    async def __aenter__(self):
        s = self.settings

        def factory(k: int) -> RayShard:
            actor = make_shard_actor(k, max_restarts=s.shard_max_restarts)
            self.actors.setdefault(k, []).append(actor)
            return RayShard(k, actor, channel=s.shard_calls == "channel", deadline_s=s.deadline_s)

        self.server, self.port, self.app = await create_server(s, factory)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GeoPubSubStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        assert self.app.engine.pm.owner(WEST.lon, WEST.lat) == 0
        assert self.app.engine.pm.owner(EAST.lon, EAST.lat) == 1
        return self

    async def __aexit__(self, *exc):
        import ray

        await self.channel.close()
        await stop_server(self.server, self.app)
        for made in self.actors.values():
            for a in made:
                ray.kill(a)

    async def pid(self, k: int) -> int:
        """The process of shard ``k``'s current actor."""
        return (await self.actors[k][-1].info.remote())["pid"]

    async def subscribe(self, sub: Subscription) -> None:
        await self.stub.Subscribe(
            pb.SubscribeRequest(subscription=to_proto_subscription(sub)), timeout=30
        )

    async def publish(self, msg: Message) -> pb.PublishResponse:
        return await self.stub.Publish(pb.PublishRequest(message=to_proto_message(msg)), timeout=30)

    async def health_becomes(self, name: str, status: int, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while True:
            got = await self.health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            if got.status == status:
                return
            assert time.monotonic() < deadline, (name, got.status)
            await asyncio.sleep(0.1)


async def _unavailable(call, *, within_s: float) -> str:
    """Await ``call``: it must fail UNAVAILABLE within ``within_s``; returns the details."""
    began = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    took = time.monotonic() - began
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    assert took < within_s, (took, info.value.details())
    return info.value.details()


@contextlib.contextmanager
def _stopped(pid: int):
    """``pid`` stopped with SIGSTOP for the block, continued afterwards whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _run(coro):
    asyncio.run(coro)


def test_a_stopped_redis_answers_unavailable_within_the_deadline_and_health_follows(
    ray_session, tmp_path
):
    before = Subscription("before", (("x",),), Rect(-20, -5, 20, 5))
    fresh = Subscription("fresh", (("y",),), Rect(-20, -5, 20, 5))
    during = Subscription("during", (("x",),), Rect(-20, -5, 20, 5))
    server = RedisServer(tmp_path).start()

    async def main():
        async with Cluster(_settings(server.url)) as c:
            await c.subscribe(before)
            await c.subscribe(fresh)  # no delivery yet: its numbering is read from Redis
            assert (await c.publish(Message("m0", ("x",), WEST))).matched == 1
            with _stopped(server.pid):
                details = await _unavailable(
                    c.stub.Subscribe(
                        pb.SubscribeRequest(subscription=to_proto_subscription(during)),
                        timeout=60,
                    ),
                    within_s=DEADLINE_S + SLACK_S,
                )
                assert "redis" in details, details
                await _unavailable(  # the round cannot number its delivery to "fresh"
                    c.publish(Message("y0", ("y",), WEST)), within_s=DEADLINE_S + SLACK_S
                )
                await c.health_becomes(REDIS_HEALTH, NOT_SERVING)
                await c.health_becomes("", NOT_SERVING)
                for k in (0, 1):  # the shards themselves are fine
                    got = await c.health.Check(
                        health_pb2.HealthCheckRequest(service=shard_health_name(k)), timeout=5
                    )
                    assert got.status == SERVING
            await c.health_becomes("", SERVING)
            await c.health_becomes(REDIS_HEALTH, SERVING)
            await c.subscribe(during)  # the client reconnected by itself
            assert (await c.publish(Message("m1", ("x",), EAST))).matched == 2
            assert (await c.publish(Message("y1", ("y",), EAST))).matched == 1
            got = await c.stub.GetSubscription(pb.GetSubscriptionRequest(id="during"))
            assert got == to_proto_subscription(during)

    try:
        _run(main())
    finally:
        server.stop()


@pytest.mark.parametrize("shard_calls", ["channel", "ray"])
def test_a_stopped_shard_fails_its_operations_only_and_comes_back(
    ray_session, redis_url, shard_calls
):
    west = Subscription("west", (("x",),), Rect(-20, -5, -1, 5))
    east = Subscription("east", (("x",),), Rect(1, -5, 20, 5))
    both = Subscription("both", (("x",),), Rect(-20, -5, 20, 5))  # on both shards

    async def main():
        async with Cluster(_settings(redis_url, shard_calls=shard_calls)) as c:
            for s in (west, east):
                await c.subscribe(s)
            assert (await c.publish(Message("e0", ("x",), EAST))).matched == 1
            with _stopped(await c.pid(1)):
                # one round holds a message for each shard: the west one is answered, the
                # east one fails when shard 1 does not answer within the deadline
                w, e = await asyncio.gather(
                    c.publish(Message("w1", ("x",), WEST)),
                    _unavailable(
                        c.publish(Message("e1", ("x",), EAST)), within_s=DEADLINE_S + SLACK_S
                    ),
                )
                assert w.matched == 1
                assert "shard 1" in e, e
                await c.health_becomes(shard_health_name(1), NOT_SERVING)
                for name in ("", shard_health_name(0), REDIS_HEALTH):
                    got = await c.health.Check(health_pb2.HealthCheckRequest(service=name))
                    assert got.status == SERVING, name
                # while it is down: its operations fail at once, the other shard serves
                for i in range(3):
                    assert (await c.publish(Message(f"w{i + 2}", ("x",), WEST))).matched == 1
                    await _unavailable(
                        c.publish(Message(f"e{i + 2}", ("x",), EAST)),
                        within_s=DEADLINE_S + SLACK_S,
                    )
                details = await _unavailable(
                    c.stub.GetStats(pb.GetStatsRequest(), timeout=30), within_s=SLACK_S
                )
                assert "shard 1 is down" in details, details
                # a subscription that reaches the stopped shard is answered once Redis holds
                # it (subscribe_ack "stored"): shard 1 gets it when it is back (checked below)
                began = time.monotonic()
                await c.stub.Subscribe(
                    pb.SubscribeRequest(subscription=to_proto_subscription(both)), timeout=30
                )
                assert time.monotonic() - began < SLACK_S
            await c.health_becomes(shard_health_name(1), SERVING)
            subs = [west, east, both]
            for i, point in enumerate([EAST, WEST, EAST]):
                msg = Message(f"after{i}", ("x",), point)
                r = await c.publish(msg)
                assert r.matched == sum(subscription_matches(s, msg) for s in subs), msg
            assert c.app.engine.stats["shard_reloads"] >= 1
            assert c.app.engine.recovery.down_shards() == {}

    _run(main())


def test_a_shard_actor_dead_past_its_restarts_is_made_anew(ray_session, redis_url):
    import ray

    subs = [
        Subscription("west", (("x",),), Rect(-20, -5, -1, 5)),
        Subscription("east", (("x",),), Rect(1, -5, 20, 5)),
        Subscription("both", (("x",),), Rect(-20, -5, 20, 5)),
    ]

    async def main():
        async with Cluster(_settings(redis_url, shard_max_restarts=0)) as c:
            for s in subs:
                await c.subscribe(s)
            old = c.actors[1][0]
            os.kill(await c.pid(1), signal.SIGKILL)
            failures = 0
            deadline = time.monotonic() + 90
            for i, point in enumerate([EAST, WEST, EAST, EAST]):
                msg = Message(f"m{i}", ("x",), point)
                while True:
                    try:
                        r = await c.publish(msg)
                        break
                    except grpc.aio.AioRpcError as e:
                        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                        failures += 1
                        assert time.monotonic() < deadline, "shard 1 did not come back"
                        await asyncio.sleep(0.2)
                assert r.matched == sum(subscription_matches(s, msg) for s in subs), msg
            assert failures >= 1  # the first publish into shard 1 found it dead
            assert c.app.engine.stats["shard_replacements"] == 1
            assert len(c.actors[1]) == 2 and len(c.actors[0]) == 1
            with pytest.raises(ray.exceptions.RayActorError):
                await old.info.remote()
            assert await c.pid(1) != 0
            await c.health_becomes(shard_health_name(1), SERVING)

    _run(main())
