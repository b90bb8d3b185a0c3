"""``Rebalance`` (``geopubsub rebalance --shards N``): a new partition map made from the
subscriptions as they are, shards added or removed, every shard rebuilt from Redis with it —
on a real cluster (Ray shard actors, redis-server, gRPC over loopback) with stored messages
live and moving subscriptions moved: afterwards every subscription matches as before (the
brute-force count of each new message), every live message is still live (a moving
subscription that enters it gets its ADD, its holders their REMOVE at expiry), and the map has
the new number of parts."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import uuid

import grpc
import pytest

from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.brute import subscription_matches
from shard.model import Circle, Message, Point, Subscription
from tests.clusters import Cluster, coordinator_settings, subscribe_all
from tests.workloads import as_moving, random_message, random_subscription

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


def test_rebalance_adds_and_removes_shards_without_losing_subscriptions_or_live_messages(
    ray_session, redis_url
):
    rng = random.Random(21)
    subs = [random_subscription(rng, f"s{i}") for i in range(300)]
    walker = as_moving(Subscription("walker", (("zz",),), Circle(100.0, 40.0, 10_000.0)))
    stored = [
        Message(f"live{i}", ("zz",), Point(-60.0 + 30 * i, -30.0 + 15 * i), ttl=600.0)
        for i in range(5)
    ]
    settings = coordinator_settings(redis_url, uuid.uuid4().hex)

    async def check_matching(stub, tag: str, everyone: list[Subscription]) -> None:
        msgs = [random_message(rng, f"{tag}{i}") for i in range(60)]
        resp = await stub.Publish(pb.PublishRequest(messages=[to_proto_message(m) for m in msgs]))
        want = [sum(subscription_matches(s, m) for s in everyone) for m in msgs]
        assert list(resp.matches) == want, tag

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            await subscribe_all(stub, subs)
            await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(walker)))
            await stub.Publish(pb.PublishRequest(messages=[to_proto_message(m) for m in stored]))
            everyone = [*subs, walker]
            await check_matching(stub, "before", everyone)
            assert c.app.engine.pm.boxes.shape[0] == 2

            for n, visit in ((3, 0), (1, 1), (2, 2)):
                r = await stub.Rebalance(pb.RebalanceRequest(shards=n))
                assert (r.shards, r.subscriptions, r.live_messages) == (n, 301, 5), n
                st = await stub.GetStats(pb.GetStatsRequest())
                assert len(st.shards) == n and st.subscriptions == 301 and st.live_messages == 5
                assert sum(s.subscriptions for s in st.shards) >= 301
                assert c.app.engine.pm.boxes.shape[0] == n
                await check_matching(stub, f"after{n}_", everyone)
                # the live message the walker now walks into is still live: its ADD
                m = stored[visit]
                moved = await stub.UpdateLocation(
                    pb.UpdateLocationRequest(
                        id="walker",
                        point=m.location and pb.Point(lon=m.location.lon, lat=m.location.lat),
                    )
                )
                adds = [d.message.id for d in moved.updates if d.kind == pb.Delivery.ADD]
                assert adds == [m.id], (n, [(d.kind, d.message.id) for d in moved.updates])
                walker_now = dataclasses.replace(
                    walker, region=Circle(m.location.lon, m.location.lat, 10_000.0)
                )
                everyone = [*subs, walker_now]

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Rebalance(pb.RebalanceRequest(shards=2000))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "shards=2000" in err.value.details()
            r = await stub.Rebalance(pb.RebalanceRequest())  # the same count, a fresh map
            assert r.shards == 2

            # the command
            async def cli(*argv: str) -> tuple[int, str, str]:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "geopubsub.tools.cli", "rebalance", *argv,
                    "--target", f"127.0.0.1:{c.port}",
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                out, err = await proc.communicate()
                return proc.returncode, out.decode(), err.decode()

            code, out, err = await cli("--shards", "3")
            assert code == 0, err
            assert out.startswith("rebalanced: 3 shards hold 301 subscriptions and 5 live messages")
            assert len((await stub.GetStats(pb.GetStatsRequest())).shards) == 3
            code, out, err = await cli("--shards", "5000")
            assert code == 2 and "--shards=5000: must be in [1, 1024]" in err, (code, err)

    asyncio.run(main())


def test_a_rebalance_under_traffic_loses_and_repeats_no_delivery(ray_session, redis_url):
    """Publishes with client-given ids go on while the shards go from 2 to 4 (those caught by
    it answer UNAVAILABLE and are retried with the same id): every followed subscription's
    stream holds each matching message exactly once."""
    rng = random.Random(8)
    subs = [random_subscription(rng, f"f{i}") for i in range(200)]
    msgs = [random_message(rng, f"t{i}") for i in range(400)]
    settings = coordinator_settings(redis_url, uuid.uuid4().hex)

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            await subscribe_all(stub, subs)
            retried = 0

            async def publisher():
                nonlocal retried
                for m in msgs:
                    while True:
                        try:
                            await stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
                            break
                        except grpc.aio.AioRpcError as exc:
                            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                            retried += 1
                            await asyncio.sleep(0.05)

            task = asyncio.create_task(publisher())
            await asyncio.sleep(0.3)
            r = await stub.Rebalance(pb.RebalanceRequest(shards=4))
            assert r.shards == 4
            await task
            assert c.app.engine.pm.boxes.shape[0] == 4

            async def stream(s: Subscription) -> None:
                want = [m.id for m in msgs if subscription_matches(s, m)]
                got = []
                call = stub.StreamResults(pb.StreamResultsRequest(id=s.id), timeout=3.0)
                with pytest.raises(grpc.aio.AioRpcError) as end:
                    async for d in call:
                        assert d.kind == pb.Delivery.ADD
                        got.append(d.message.id)
                assert end.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert got == want, s.id

            await asyncio.gather(*(stream(s) for s in subs[:60]))
            return retried

    print("publishes retried after UNAVAILABLE:", asyncio.run(main()))
