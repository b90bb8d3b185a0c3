"""The coordinator's own rules, with in-process shards (``LocalShard``) and a real redis-server."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from coordinator.convert import to_proto_subscription
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard
from deploy.redis_local import RedisServer
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.model import Rect, Subscription


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


class SlowShard(LocalShard):
    async def apply(self, ops, now):
        await asyncio.sleep(0.3)  # one slow round (a cold or busy shard)
        return await super().apply(ops, now)


def test_a_subscribe_past_its_deadline_is_still_kept_across_a_restart(redis_url):
    """The call times out but its round still applies it: Redis must have it too."""

    async def main():
        s = Settings.load(
            flags={
                "port": 0,
                "redis_url": redis_url,
                "namespace": uuid.uuid4().hex,
                "deadline_s": 0.1,
            }
        )
        server, port, app = await create_server(s, lambda k: SlowShard(k))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GeoPubSubStub(ch)
            sub = Subscription("late", (("x",),), Rect(0, 0, 1, 1))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.5)
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="late"))
            assert got.id == "late"
        await stop_server(server, app)
        server, port, app = await create_server(s, lambda k: LocalShard(k))  # a restart
        assert "late" in app.engine.subs
        await stop_server(server, app)

    asyncio.run(main())
