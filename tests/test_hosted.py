"""A shard on each rival index (the shard setting ``index``; ``shard.rivals.hosted``): the
shard's state machine of ``tests/test_shard_state.py`` (every batch operation interleaved, moves,
replacements, detaches, expiry, snapshot / restore, rejected batches) with the shard built on
the rival, a client applying the updates in order holding exactly the oracle's result sets after
every step."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from geopubsub.convert import to_proto_message
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.brute import subscription_matches
from shard.errors import ValidationError
from shard.host.warmup import warm_up_shard
from shard.indexes import RIVAL_NAMES
from shard.model import Circle, Message, Point, Rect, Subscription
from shard.state import ShardState
from tests.clusters import Cluster, coordinator_settings, subscribe_all
from tests.test_shard_state import ShardVersusOracle
from tests.workloads import Mirror, as_moving, random_message, random_subscription


def _machine(name: str):
    class HostedVersusOracle(ShardVersusOracle):
        @initialize(t0=st.sampled_from([0.0, 1.7e9 + 0.1]), cell=st.sampled_from([0.5, 7.0, 180]))
        def setup(self, t0, cell):
            self.state = ShardState(7, index=name, cell_deg=float(cell))
            self.mirror = Mirror()
            self.now = t0
            self.n = 0

    HostedVersusOracle.__name__ = f"Hosted_{name}"
    return HostedVersusOracle


for _name in RIVAL_NAMES:
    _case = _machine(_name).TestCase
    _case.settings = settings(max_examples=10, stateful_step_count=30, deadline=None)
    globals()[f"TestHosted_{_name.replace('+', 'plus')}"] = _case


@pytest.mark.parametrize("name", RIVAL_NAMES)
def test_a_built_shard_on_a_rival_delivers_moves_and_expires(name):
    subs = [
        Subscription("a", (("x",),), Rect(0, 0, 1, 1), moving=True),
        Subscription("b", (("x", "y"), ("z",)), Rect(-10, -10, 10, 10)),
    ]
    s = ShardState.build(0, subs, 0.0, tags=[5, 6], index=name)
    assert s.tree.stats()["index"] == name
    ups = s.publish_batch([Message("m", ("x", "y"), Point(5, 5), ttl=10.0)], 1.0)
    assert sorted(ups) == [("b", 0, "m")]
    assert s.move_batch([("a", Point(5, 5))], 2.0) == [("a", 0, "m")]
    _, tags, counts = s.publish_tagged([Message("n", ("z",), Point(0.5, 0.5))], 3.0)
    assert tags.tolist() == [6] and counts.tolist() == [1]
    assert sorted(s.advance(11.0)) == [("a", 1, "m"), ("b", 1, "m")]


def test_an_unknown_index_is_named():
    with pytest.raises(ValidationError, match="index='kd'"):
        ShardState(0, index="kd")


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.parametrize("name", ["lfilter", "rt++"])
def test_a_cluster_whose_shards_run_a_rival_delivers_as_the_oracle(ray_session, redis_url, name):
    """The shard setting ``index`` through the real cluster (Ray shard actors, redis-server,
    gRPC): every publish reaches the oracle's matches, a moving subscription walking into a
    live message gets its ADD, and the shards report the rival."""
    warm_up_shard({"index": name})  # compiled here first: the actors then load the kernels
    rng = random.Random(5)
    subs = [random_subscription(rng, f"s{i}") for i in range(300)]
    walker = as_moving(Subscription("walker", (("zz",),), Circle(100.0, 40.0, 10_000.0)))
    live = Message("live", ("zz", "t1"), Point(-60.0, -30.0), ttl=600.0)
    settings = coordinator_settings(redis_url, uuid.uuid4().hex, index=name)

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            await subscribe_all(stub, [*subs, walker])
            await stub.Publish(pb.PublishRequest(messages=[to_proto_message(live)]))
            msgs = [random_message(rng, f"m{i}") for i in range(80)]
            resp = await stub.Publish(
                pb.PublishRequest(messages=[to_proto_message(m) for m in msgs])
            )
            want = [sum(subscription_matches(s, m) for s in subs) for m in msgs]
            assert list(resp.matches) == want and sum(want) > 0
            moved = await stub.UpdateLocation(
                pb.UpdateLocationRequest(id="walker", point=pb.Point(lon=-60.0, lat=-30.0))
            )
            assert [(d.kind, d.message.id) for d in moved.updates] == [(pb.Delivery.ADD, "live")]
            stats = [await a.stats.remote() for a in c.actors]
            assert all(s["tree"]["index"] == name for s in stats), stats

    asyncio.run(main())


@pytest.mark.parametrize("name", RIVAL_NAMES)
def test_a_shard_actor_warms_up_its_own_index(name):
    """The actor's start-up warm-up runs every operation kind on the index the shard is made
    with, so that a cold kernel cache is paid there and not by the first round (deadlines)."""
    warm_up_shard({"index": name})
