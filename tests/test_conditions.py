"""Subscriptions that say more than terms in a rectangle or circle (NOT, polygons, attribute
predicates; ``shard.residual``) in a shard on every index: the shard's state machine of
``tests/test_shard_state.py`` with half of the subscriptions carrying each condition and the
messages carrying attributes, a client applying the updates in order holding exactly the
oracle's result sets after every step (moves of polygons, replacements between plain and not,
expiry, detach, snapshot / restore included)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import uuid

import grpc
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize

from geopubsub.convert import from_proto_subscription, to_proto_message, to_proto_subscription
from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from geopubsub.tools.gen_shapes import ConditionShares
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.applus import recentre
from shard.brute import BruteMatcher, subscription_matches
from shard.indexes import RIVAL_NAMES
from shard.model import ADD, REMOVE, Message, Point, subscription_from_dict
from shard.state import ShardState
from shard.workload import read_messages, read_subscriptions
from tests.clusters import Cluster, coordinator_settings, settled, subscribe_all
from tests.test_shard_state import ShardVersusOracle
from tests.workloads import (
    Mirror,
    apply_op,
    as_moving,
    random_message,
    random_ops,
    random_subscription,
)


class ConditionsVersusOracle(ShardVersusOracle):
    extras = 0.5


TestConditionsVersusOracle = ConditionsVersusOracle.TestCase
TestConditionsVersusOracle.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)


def _hosted(name: str):
    class HostedConditions(ConditionsVersusOracle):
        @initialize(t0=st.sampled_from([0.0, 1.7e9 + 0.1]))
        def setup(self, t0):
            self.state = ShardState(7, index=name)
            self.mirror = Mirror()
            self.now = t0
            self.n = 0

    HostedConditions.__name__ = f"HostedConditions_{name}"
    return HostedConditions


for _name in RIVAL_NAMES:
    _case = _hosted(_name).TestCase
    _case.settings = settings(max_examples=4, stateful_step_count=25, deadline=None)
    globals()[f"TestHostedConditions_{_name.replace('+', 'plus')}"] = _case


# ---- through the cluster ---------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.ray
def test_a_cluster_delivers_not_polygons_and_predicates_as_the_oracle(ray_session, redis_url):
    """NOT, polygons and attribute predicates through the real cluster (gRPC, the coordinator,
    Ray shard actors, redis-server): every publish reaches the oracle's matches, a moving
    polygon gets the ADD and REMOVE its shape (not its box) calls for, GetSubscription gives
    the subscription back, bad ones are refused naming the field, and after a Reload (every
    shard rebuilt from Redis) the matches are still the oracle's."""
    rng = random.Random(11)
    subs = [random_subscription(rng, f"s{i}", extras=0.5) for i in range(300)]
    # an L: its box holds (4, 4), the L does not; (0.5, 4) is in its upright arm
    ell = subscription_from_dict(
        {
            "id": "walker",
            "expr": "zz AND NOT spam",
            "polygon": [[[0, 0], [5, 0], [5, 1], [1, 1], [1, 5], [0, 5], [0, 0]]],
            "predicates": [{"attr": "price", "op": "<=", "value": 5}],
            "moving": True,
        }
    )
    notch = Message("notch", ("zz",), Point(104.0, 44.0), 600.0, attributes=(("price", 3.0),))
    arm = Message("arm", ("zz",), Point(100.5, 44.0), 600.0, attributes=(("price", 3.0),))
    spam = Message("spam", ("spam", "zz"), Point(100.5, 43.0), 600.0, (), None, (("price", 1.0),))
    settings = coordinator_settings(redis_url, uuid.uuid4().hex)
    n_idf = [0]

    async def publish_checked(stub, msgs):
        resp = await stub.Publish(pb.PublishRequest(messages=[to_proto_message(m) for m in msgs]))
        want = [sum(subscription_matches(s, m) for s in subs) for m in msgs]
        assert list(resp.matches) == want and sum(want) > 0

    async def main():
        async with Cluster(settings) as c:
            stub = c.stub
            # the ranked ones after the others: their idf weights count those
            await subscribe_all(stub, [*(s for s in subs if s.threshold is None), ell])
            await settled(c.app.engine)  # (routed: a Subscribe may be answered before)
            await subscribe_all(stub, [s for s in subs if s.threshold is not None])
            got = await stub.GetSubscription(pb.GetSubscriptionRequest(id="walker"))
            assert from_proto_subscription(got) == ell
            # ranked ones subscribed without weights got the cluster's idf weights: the oracle
            # scores with what the cluster holds
            for i, s in enumerate(subs):
                if s.threshold is not None:
                    got = await stub.GetSubscription(pb.GetSubscriptionRequest(id=s.id))
                    subs[i] = from_proto_subscription(got)
                    if s.weights is None:
                        assert subs[i].weights is not None
                        n_idf[0] += subs[i].weights != (1.0,) * len(subs[i].weights)
            for bad, field in (
                ({"expr": "zz OR NOT a"}, "subscription.expr"),
                ({"polygon": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}, "subscription.polygon"),
                ({"predicates": [{"attr": "p", "op": "~", "value": 1}]}, "op"),
            ):
                d = {"id": "bad", "keywords": ["x"], "rect": [0, 0, 1, 1], **bad}
                if "expr" in bad:
                    del d["keywords"]
                if "polygon" in bad:
                    del d["rect"]
                p = pb.Subscription(id="bad", keywords=d.get("keywords", []))
                p.expr = d.get("expr", "")
                if "rect" in d:
                    p.rect.CopyFrom(pb.Rect(min_lon=0, min_lat=0, max_lon=1, max_lat=1))
                else:
                    for ring in d["polygon"]:
                        p.polygon.rings.add().points.extend(pb.Point(lon=x, lat=y) for x, y in ring)
                for q in d.get("predicates", ()):
                    p.predicates.add(attr=q["attr"], op=q["op"]).value.number = q["value"]
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Subscribe(pb.SubscribeRequest(subscription=p))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in e.value.details(), e.value.details()
            await stub.Publish(
                pb.PublishRequest(messages=[to_proto_message(m) for m in (notch, arm, spam)])
            )
            await publish_checked(
                stub, [random_message(rng, f"m{i}", attributes=True) for i in range(100)]
            )
            # the L's corner to (100, 40): its box holds all three, its arm only "arm", and
            # "spam" fails the NOT
            moved = await stub.UpdateLocation(
                pb.UpdateLocationRequest(id="walker", point=pb.Point(lon=102.5, lat=42.5))
            )
            assert [(d.kind, d.message.id) for d in moved.updates] == [(pb.Delivery.ADD, "arm")]
            moved = await stub.UpdateLocation(
                pb.UpdateLocationRequest(id="walker", point=pb.Point(lon=100.5, lat=42.5))
            )  # two degrees west: "arm" (100.5, 44) is off the L (upright arm x 98-99, bottom
            # bar y 40-41) but still in its box (98-103, 40-45)
            assert [(d.kind, d.message.id) for d in moved.updates] == [(pb.Delivery.REMOVE, "arm")]
            await stub.Reload(pb.ReloadRequest(), timeout=120)
            await publish_checked(
                stub, [random_message(rng, f"r{i}", attributes=True) for i in range(100)]
            )
            # a ranked subscription's delivery carries its score
            ranked = subscription_from_dict(
                {"id": "ranked", "keywords": ["Cafe", "Latte", "Bagel"], "rect": [10, 10, 12, 12],
                 "threshold": 0.6, "alpha": 0.3, "weights": {"cafe": 2, "latte": 1, "bagel": 1}}
            )  # fmt: skip
            await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(ranked)))
            near = Message("near", ("cafe", "latte"), Point(11, 11))  # 0.3 + 0.7 * 3/4
            far = Message("far", ("cafe", "latte", "bagel"), Point(50, 50))  # 0.7
            weak = Message("weak", ("bagel",), Point(11, 11))  # 0.3 + 0.7 / 4 = 0.475
            resp = await stub.Publish(
                pb.PublishRequest(messages=[to_proto_message(m) for m in (near, far, weak)])
            )
            assert list(resp.matches)[0] >= 1 and list(resp.matches)[2] == sum(
                subscription_matches(s, weak) for s in subs
            )
            stream = stub.StreamResults(pb.StreamResultsRequest(id="ranked", after_sequence=0))
            got = [await anext(aiter(stream)) for _ in range(2)]
            stream.cancel()
            assert [(d.message.id, round(d.score, 9)) for d in got] == [
                ("near", round(0.3 + 0.7 * 0.75, 9)),
                ("far", 0.7),
            ]
            assert n_idf[0] > 0
            # θ <= α: a message with none of its keywords matches inside its rectangle
            local = subscription_from_dict(
                {"id": "local", "keywords": ["cafe"], "rect": [20, 20, 22, 22],
                 "threshold": 0.4, "alpha": 0.5, "moving": True}
            )  # fmt: skip
            await stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(local)))
            here = Message("here", ("news",), Point(21, 21), 600.0)
            there = Message("there", ("news",), Point(31, 31), 600.0)
            resp = await stub.Publish(
                pb.PublishRequest(messages=[to_proto_message(m) for m in (here, there)])
            )
            stream = stub.StreamResults(pb.StreamResultsRequest(id="local", after_sequence=0))
            got = [await anext(aiter(stream))]
            assert [(d.message.id, d.score) for d in got] == [("here", 0.5)]
            moved = await stub.UpdateLocation(
                pb.UpdateLocationRequest(id="local", point=pb.Point(lon=31, lat=31))
            )  # its rectangle onto "there": -here, +there
            assert [(d.kind, d.message.id) for d in moved.updates] == [
                (pb.Delivery.REMOVE, "here"),
                (pb.Delivery.ADD, "there"),
            ]
            stream.cancel()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("seed", "index"), [(1, "aptree"), (2, "aptree"), (3, "rt++"), (4, "lfilter")]
)
def test_seeded_stress_with_conditions(seed, index):
    """300 subscriptions (half of them with each condition, two thirds moving) and 150 random
    operations (publishes with attributes, moves aimed at live messages, replacements,
    detaches, expiry): after every one a client applying the updates holds exactly the
    oracle's result sets, and a snapshot restored halfway continues identically."""
    rng = random.Random(seed)
    t0 = 100.0
    subs = [
        as_moving(random_subscription(rng, f"s{i}", extras=0.5), i % 3 != 0) for i in range(300)
    ]
    movers = [s.id for s in subs if s.moving]
    state = ShardState.build(1, subs, t0, index=index)
    mirror = Mirror()
    mirror.subs = {s.id: s for s in subs}
    ops = random_ops(rng, movers, 150, t0, 0, extras=0.5)
    checked = 0
    ranked_adds = 0
    ranked = {s.id for s in subs if s.threshold is not None}
    located = {s.id for s in subs if s.threshold is not None and s.threshold <= s.alpha}
    located_adds = 0
    for i, op in enumerate(ops):
        kind, payload, now = op
        if kind == "move":  # half the moves onto a live message: the interesting case
            live = [m.location for m, _ in mirror.live.values()]
            payload = [
                (sid, rng.choice(live) if live and rng.random() < 0.5 else p) for sid, p in payload
            ]
            payload = [
                (sid, p if isinstance(p, Point) else Point(p.min_lon, p.max_lat))
                for sid, p in payload
                if sid in mirror.subs
            ]
            op = (kind, payload, now)
        mirror.expire(now)
        updates = apply_op(state, op)
        if kind == "publish":
            stored = {m.id for m in payload if m.ttl}
            mirror.apply([u for u in updates if u[1] == REMOVE or u[2] in stored])
            for m in payload:  # every message, one-shot ones too, reached the oracle's matches
                want = {sid for sid, s in mirror.subs.items() if subscription_matches(s, m)}
                assert {u[0] for u in updates if u[1] == ADD and u[2] == m.id} == want
                if m.ttl:
                    mirror.live[m.id] = (m, now + m.ttl)
            checked += len([u for u in updates if u[1] == ADD])
            ranked_adds += len([u for u in updates if u[1] == ADD and u[0] in ranked])
            located_adds += len([u for u in updates if u[1] == ADD and u[0] in located])
        else:
            mirror.apply(updates)
        if kind == "move":
            for sid, p in payload:
                old = mirror.subs[sid]
                mirror.subs[sid] = dataclasses.replace(old, region=recentre(old.region, p))
        elif kind == "subscribe":
            for s in payload:
                mirror.subs[s.id] = s
        elif kind == "detach":
            for sid in payload:
                mirror.subs.pop(sid, None)
                mirror.held.pop(sid, None)
        mirror.assert_exact()
        if i == len(ops) // 2:
            state = ShardState.restore(state.snapshot())
    state.check_invariants()
    assert checked > 100 and len(state.tree.subs) > 100  # it saw conditions at work
    assert ranked_adds > 5, ranked_adds
    assert located_adds > 0, located_adds  # θ <= α ones matched on location (shard.side)


@pytest.fixture(scope="module")
def condition_workload(tmp_path_factory):
    d = tmp_path_factory.mktemp("cond")
    shares = ConditionShares(0.1, 0.1, 0.1, True, 0.2)
    generate(4000, 300, d, seed=3, dnf_share=0.2, region_msg_share=0.2, conditions=shares)
    return d / "subs.jsonl", d / "msgs.jsonl"


def test_bench_match_and_compare_check_every_condition_exactly(
    condition_workload, tmp_path, capsys
):
    """``bench match`` (the AP-Tree with its checker, ``shard.residual.StaticChecker``) and
    ``bench compare`` (two rivals) give brute force's pairs on a workload with every kind of
    condition, ranked subscriptions matching on location alone (θ <= α) among them."""
    subs, msgs = condition_workload
    parsed = list(read_subscriptions(subs))
    assert sum(s.threshold is not None and s.threshold <= s.alpha for s in parsed) > 100
    brute = BruteMatcher(parsed)
    want = {(m.id, s) for m in read_messages(msgs) for s in brute.match(m)}
    out = tmp_path / "pairs.tsv"
    argv = ["bench", "match", "--subs", str(subs), "--msgs", str(msgs), "--json"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    got = {tuple(line.split("\t")) for line in out.read_text().splitlines()}
    assert got == want and report["pairs"] == len(want) > 0
    assert report["baseline"]["identical"]
    argv = ["bench", "compare", "--subs", str(subs), "--msgs", str(msgs), "--repeat", "1"]
    argv += ["--index", "aptree,lfilter,rt++", "--updates", "20", "--check-sample", "300"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["index"] for r in rows} >= {"aptree", "lfilter", "rt++"}
    for r in rows:
        assert r["exact"] is True, r["index"]
        assert r["index"] == "brute" or r["pairs"] == len(want), r["index"]
