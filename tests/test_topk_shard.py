"""Top-k subscriptions in a shard (``shard.topk.hosted``, ``ShardState``, ``shard.ops`` and the
wire): seeded random operations -- subscribe, replace (also by and with other kinds), move,
unsubscribe, detach, snapshot / restore -- each round through the bytes a shard actor gets, and
every top-k publish answered exactly as the oracle (``shard.topk.oracle.reference_topk``), tags
and bit-identical scores; the conversions; bad input refused naming the field."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from coordinator.ranking import delivery_score
from coordinator.topk import merge
from geopubsub.convert import from_proto_subscription, to_proto_message, to_proto_subscription
from shard.errors import ValidationError
from shard.model import Message, Point, Rect, Subscription, TopKAnswer, subscription_from_dict
from shard.ops import apply_ops
from shard.state import ShardState
from shard.topk.hosted import as_event
from shard.topk.model import TopKSubscription
from shard.topk.oracle import reference_topk
from shard.wire import dumps_ops, dumps_result, loads_ops, loads_result

ATTRS = ("a", "b", "c", "d")


def random_topk(rng: random.Random, sid: str) -> Subscription:
    preds = []
    for attr in rng.sample(ATTRS, rng.randint(1, 3)):
        op = rng.choice(["=", "<=", ">", "!=", "in", "not in", "between"])
        if op in ("in", "not in"):
            value = rng.sample([1, 2, 3, 4], 2)
        elif op == "between":
            value = sorted(rng.sample([0, 1, 2, 3, 4, 5], 2))
        else:
            value = rng.randint(0, 4)
        preds.append({"attr": attr, "op": op, "value": value, "weight": rng.choice([1, 2, 0.5])})
    if rng.random() < 0.3:  # a keyword, scored as the attribute "#x" (shard.topk.hosted)
        preds.append({"attr": "#x", "op": "=", "value": 1, "weight": 2})
    point = [round(rng.uniform(-20, 20), 1), round(rng.uniform(-10, 10), 1)]
    return subscription_from_dict(
        {"id": sid, "point": point, "predicates": preds, "alpha": rng.choice([0.0, 0.3, 0.5, 1.0]),
         "moving": rng.random() < 0.5}
    )  # fmt: skip


def random_event(rng: random.Random, mid: str) -> Message:
    attrs = tuple(
        sorted((a, float(rng.randint(0, 4))) for a in rng.sample(ATTRS, rng.randint(0, 4)))
    )
    point = Point(round(rng.uniform(-20, 20), 1), round(rng.uniform(-10, 10), 1))
    terms = ("x",) if rng.random() < 0.5 else ()
    return Message(mid, terms, point, None, attributes=attrs)


def _round(state: ShardState, ops: list[tuple], now: float):
    """``apply_ops`` as a shard actor runs it: the operations and the answer through bytes."""
    result = apply_ops(state, loads_ops(dumps_ops(ops)), now)
    return loads_result(dumps_result(result))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_shard_answers_top_k_publishes_as_the_oracle(seed):
    rng = random.Random(seed)
    state = ShardState(0)
    held: dict[str, Subscription] = {}
    tag_of: dict[str, int] = {}
    now = 0.0
    plain = Subscription("p0", (("x",),), Rect(-1, -1, 1, 1))
    for step in range(120):
        now += 1.0
        r = rng.random()
        if r < 0.35 or not held:
            batch = [random_topk(rng, f"t{rng.randint(0, 40)}") for _ in range(rng.randint(1, 5))]
            ops = []
            for s in batch:
                tag_of[s.id] = tag_of.get(s.id, len(tag_of))
                ops.append(("sub", s, tag_of[s.id]))
                held[s.id] = s
            _round(state, ops, now)
        elif r < 0.45:
            sid = rng.choice(sorted(held))
            kind = rng.choice(["unsub", "detach"])
            _round(state, [(kind, sid)], now)
            del held[sid]
        elif r < 0.55:
            movers = [s for s in held.values() if s.moving]
            if movers:
                s = rng.choice(movers)
                p = Point(round(rng.uniform(-20, 20), 1), 0.0)
                _, out, _ = _round(state, [("move", s.id, p)], now)
                assert out == [[]]
                held[s.id] = dataclasses.replace(s, region=p)
        elif r < 0.6:  # a top-k id replaced by a plain subscription and back
            sid = rng.choice(sorted(held))
            _round(state, [("sub", dataclasses.replace(plain, id=sid), tag_of[sid])], now)
            assert state.has([sid]) == [True] and len(state.topk) == len(held) - 1
            _round(state, [("sub", held[sid], tag_of[sid])], now)
        elif r < 0.65:
            state = ShardState.restore(state.snapshot())
        else:
            events = [random_event(rng, f"e{step}.{i}") for i in range(rng.randint(1, 4))]
            ks = [rng.choice([1, 3, 10, 50]) for _ in events]
            _, out, _ = _round(
                state, [("topk", e, k) for e, k in zip(events, ks, strict=True)], now
            )
            subs = [TopKSubscription(s.id, s.predicates, s.alpha, s.region) for s in held.values()]
            for e, k, got in zip(events, ks, out, strict=True):
                assert isinstance(got, TopKAnswer)
                want = reference_topk(subs, as_event(e), k)
                assert got.tags.tolist() == [tag_of[sid] for sid, _ in want], (e, k)
                assert got.scores.tolist() == [score for _, score in want]
        state.check_invariants()
        assert len(state.topk) == len(held)


def test_conversions_round_trip():
    rng = random.Random(7)
    for i in range(50):
        s = random_topk(rng, f"t{i}")
        assert from_proto_subscription(to_proto_subscription(s)) == s
        rows = loads_ops(dumps_ops([("sub", s, 3)]))
        assert rows == [("sub", s, 3)]
    answer = TopKAnswer(np.array([4, 2], np.int32), np.array([0.75, 0.5]))
    none = ([], np.zeros(0, np.int64), np.zeros(0, np.int32))
    back = loads_result(dumps_result((none, [answer], np.zeros(0, np.int32))))
    assert back[1][0].tags.tolist() == [4, 2] and back[1][0].scores.tolist() == [0.75, 0.5]


@pytest.mark.parametrize(
    ("d", "field", "needle"),
    [
        ({"keywords": ["x"]}, "keywords", "a top-k subscription (point) takes"),
        ({"predicates": []}, "predicates", "must hold 1-"),
        ({"alpha": 1.5}, "alpha", "must be in [0, 1]"),
        ({"point": [200, 0]}, "point[0]", "longitude"),
        ({"predicates": [{"attr": "a", "op": "=", "value": 1, "weight": -1}]}, "weight", "> 0"),
    ],
)
def test_bad_top_k_subscriptions_name_the_field(d, field, needle):
    base = {"id": "t", "point": [0, 0], "predicates": [{"attr": "a", "op": "=", "value": 1}]}
    with pytest.raises(ValidationError) as e:
        subscription_from_dict({**base, **d})
    assert field in e.value.field and needle in str(e.value), str(e.value)


def test_a_shard_refuses_bad_top_k_operations_unchanged():
    state = ShardState(0)
    t = subscription_from_dict(
        {"id": "t", "point": [0, 0], "predicates": [{"attr": "a", "op": "=", "value": 1}]}
    )
    state.subscribe_batch([t], 0.0, [1])
    bad = dataclasses.replace(t, alpha=2.0)
    with pytest.raises(ValidationError, match="alpha"):
        state.subscribe_batch([bad], 1.0)
    with pytest.raises(ValidationError, match="a top-k publish takes a point"):
        state.topk_batch([Message("e", (), Rect(0, 0, 1, 1))], [1], 1.0)
    with pytest.raises(ValidationError, match=r"ks\[0\]"):
        state.topk_batch([Message("e", (), Point(0, 0))], [0], 1.0)
    with pytest.raises(ValidationError, match="ops"):
        loads_ops(dumps_ops([("sub", t, 1)])[:-3])
    assert state.topk_batch([Message("e", (), Point(0, 0))], [5], 1.0)[0].tags.tolist() == [1]


def test_a_weight_that_normalises_to_nothing_is_refused_before_any_shard():
    """(Found by a review: weights [1e-300, 1e300] normalised the first to 0.0, which the shard
    refused, failing its whole round.)"""
    preds = [
        {"attr": "a", "op": "=", "value": 1, "weight": 1e-300},
        {"attr": "b", "op": "=", "value": 1, "weight": 1e300},
    ]
    with pytest.raises(ValidationError) as e:
        subscription_from_dict({"id": "t", "point": [0, 0], "predicates": preds})
    assert e.value.field == "predicates[0].weight", str(e.value)


def test_a_delivery_is_scored_only_where_it_fits_the_subscription_now():
    """A delivery made before its subscription was replaced by another kind (replayed from the
    log) is not scored with the new one: no score rather than an error."""
    t = subscription_from_dict(
        {"id": "t", "point": [0, 0], "predicates": [{"attr": "a", "op": "=", "value": 1}]}
    )
    r = Subscription("t", (("x",),), Rect(0, 0, 1, 1), threshold=0.5, alpha=0.2)
    area = to_proto_message(Message("m", ("x",), Rect(0, 0, 1, 1)))
    bare = to_proto_message(Message("n", (), Point(0, 0), attributes=(("a", 1.0),)))
    assert delivery_score(t, area) is None and delivery_score(r, bare) is None
    assert delivery_score(t, bare) == 1.0


@pytest.mark.parametrize("seed", range(40))
def test_the_merge_of_shard_answers_is_the_global_k_best(seed):
    """``coordinator.topk.merge`` against the definition: the k best distinct live tags by
    (score descending, id ascending), over answers with many ties, one tag answered by two
    shards, and tags whose subscription is gone (id None)."""
    rng = random.Random(seed)
    ids: list[str | None] = [f"s{rng.randrange(10**6):06d}" for _ in range(60)]
    for t in rng.sample(range(60), 5):
        ids[t] = None
    parts = []
    for _ in range(rng.randint(1, 5)):
        tags = rng.sample(range(60), rng.randint(0, 12))
        scores = sorted(
            (rng.choice([0.25, 0.5, 0.75, 1.0, rng.random()]) for _ in tags), reverse=True
        )
        parts.append(TopKAnswer(np.array(tags, np.int32), np.array(scores, np.float64)))
    k = rng.randint(1, 20)
    best: dict[int, float] = {}
    for p in parts:
        for t, s in zip(p.tags.tolist(), p.scores.tolist(), strict=True):
            if ids[t] is not None:
                best[t] = max(best.get(t, -1.0), s)
    want = sorted(best, key=lambda t: (-best[t], ids[t]))[:k]
    assert merge(parts, k, ids) == want
