"""Top-k subscription matching (paper 001): the R^I-tree and TAS against the brute-force oracle.

The oracle is ``shard.topk.oracle.reference_topk``, plain Python over the model objects (no
interning, no columns); every index must return exactly its answer -- the same ids in the same
order with bit-identical scores -- under the tie rule (score descending, id ascending). The
domains are tiny so that ties, shared points, equal weights and events lacking attributes are
common.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from geopubsub.tools import bench_topk
from geopubsub.tools.gen_topk import generate_topk
from shard.errors import NotFoundError, ValidationError
from shard.topk.kernels import combined_bound
from shard.topk.model import (
    DEFAULT_MAX_DIST,
    MAX_ATTR_NAME_LEN,
    MAX_PREDICATES,
    MAX_SET_VALUES,
    OPS,
    bbox_diagonal,
    event_from_dict,
    event_to_dict,
    predicate_holds,
    read_events,
    read_subscriptions,
    score,
    subscription_from_dict,
    subscription_to_dict,
)
from shard.topk.oracle import BruteTopK, reference_topk
from shard.topk.ritree import RITree
from shard.topk.tas import TAS

INDEXES = (RITree, TAS, BruteTopK)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- strategies: tiny domains, so that ties are everywhere ------------------------------------
ATTRS = ("a", "b", "c")
NUMBERS = st.sampled_from([0, 1, 2, 2.5, 3])
STRINGS = st.sampled_from(["x", "y", "z"])
SUB_IDS = st.sampled_from([f"s{i}" for i in range(12)])


@st.composite
def predicate(draw, attr: str) -> dict:
    op = draw(st.sampled_from(OPS))
    if op in ("<", "<=", ">", ">="):
        value = draw(NUMBERS)
    elif op == "between":
        lo, hi = sorted(draw(st.lists(NUMBERS, min_size=2, max_size=2)))
        value = [lo, hi]
    elif op in ("in", "not in"):
        value = draw(
            st.lists(STRINGS, min_size=1, max_size=3) | st.lists(NUMBERS, min_size=1, max_size=3)
        )
    else:
        value = draw(NUMBERS | STRINGS)
    return {"attr": attr, "op": op, "value": value, "weight": draw(st.sampled_from([1, 2, 0.5]))}


@st.composite
def subscription(draw, ids=SUB_IDS) -> dict:
    attrs = draw(st.lists(st.sampled_from(ATTRS), min_size=1, max_size=3, unique=True))
    return {
        "id": draw(ids),
        "predicates": [draw(predicate(a)) for a in attrs],
        "alpha": draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        "point": [draw(st.integers(0, 3)), draw(st.integers(0, 3))],
    }


@st.composite
def event(draw) -> dict:
    attrs = draw(
        st.dictionaries(
            st.sampled_from((*ATTRS, "d")), NUMBERS | STRINGS | st.just("w"), max_size=4
        )
    )
    point = draw(
        st.tuples(st.integers(0, 3), st.integers(0, 3)) | st.sampled_from([(60, 30), (-5, 2)])
    )
    return {"id": "e", "attributes": attrs, "point": list(point)}


MAX_DISTS = st.sampled_from([DEFAULT_MAX_DIST, 1.0, 3.0, 4.5])


def _subs(dicts: list[dict]):
    out = {}
    for d in dicts:  # a later id replaces an earlier one, as build does
        s = subscription_from_dict(d)
        out[s.id] = s
    return list(out.values())


def _assert_same(index, subs, events, k, max_dist):
    got = index.topk_batch(events, k)
    for e, g in zip(events, got, strict=True):
        want = reference_topk(subs, e, k, max_dist)
        assert g == want, f"{type(index).__name__} k={k} event={e}: {g} != {want}"


# ---- differential: bulk builds ---------------------------------------------------------------
@SETTINGS
@given(
    sub_dicts=st.lists(subscription(), min_size=0, max_size=25),
    event_dicts=st.lists(event(), min_size=1, max_size=4),
    k_extra=st.integers(0, 2) | st.integers(0, 30),
    fanout=st.sampled_from([2, 3, 4, 50]),
    alpha_slabs=st.sampled_from([1, 3, 8]),
    max_dist=MAX_DISTS,
)
def test_bulk_build_matches_oracle(sub_dicts, event_dicts, k_extra, fanout, alpha_slabs, max_dist):
    subs = _subs(sub_dicts)
    events = [event_from_dict(e) for e in event_dicts]
    k = 1 + k_extra  # from 1 to beyond the number of subscriptions
    for cls in INDEXES:
        tree = {"fanout": fanout, "alpha_slabs": alpha_slabs}
        opts = {"max_dist": max_dist} | ({} if cls is BruteTopK else tree)
        index = cls.build(sub_dicts_to_subs(sub_dicts), **opts)
        index._check()
        assert len(index) == len(subs)
        _assert_same(index, subs, events, k, max_dist)


def sub_dicts_to_subs(dicts):
    return [subscription_from_dict(d) for d in dicts]


@SETTINGS
@given(sub_dicts=st.lists(subscription(), min_size=1, max_size=40), e=event())
def test_every_k_from_one_to_more_than_n(sub_dicts, e):
    subs = _subs(sub_dicts)
    ev = event_from_dict(e)
    indexes = [cls.build(subs, max_dist=3.0) for cls in INDEXES]
    for k in range(1, len(subs) + 3):
        want = reference_topk(subs, ev, k, 3.0)
        assert len(want) == min(k, len(subs))
        for index in indexes:
            assert index.topk(ev, k) == want, (type(index).__name__, k)


# ---- differential: interleaved subscribe / unsubscribe ---------------------------------------
class TopKMachine(RuleBasedStateMachine):
    """Every index through the same subscribe / unsubscribe / query sequence as a dict of
    subscriptions (the model), checked structurally after every change and against the oracle
    on every query."""

    @initialize(
        fanout=st.sampled_from([2, 3, 5]),
        max_dist=MAX_DISTS,
        bulk=st.lists(subscription(), max_size=12),
    )
    def start(self, fanout, max_dist, bulk):
        self.max_dist = max_dist
        self.model = {s.id: s for s in _subs(bulk)}
        self.indexes = [
            RITree.build(self.model.values(), fanout=fanout, max_dist=max_dist),
            TAS.build(self.model.values(), fanout=fanout, max_dist=max_dist),
            BruteTopK.build(self.model.values(), max_dist=max_dist),
        ]

    @rule(d=subscription(ids=st.sampled_from([f"s{i}" for i in range(30)])))
    def subscribe(self, d):
        s = subscription_from_dict(d)
        self.model[s.id] = s
        for index in self.indexes:
            index.subscribe(s)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def unsubscribe(self, data):
        sid = data.draw(st.sampled_from(sorted(self.model)))
        del self.model[sid]
        for index in self.indexes:
            index.unsubscribe(sid)

    @rule(
        events=st.lists(event(), min_size=1, max_size=3),
        k=st.integers(1, 3) | st.integers(1, 35),
    )
    def query(self, events, k):
        evs = [event_from_dict(e) for e in events]
        for index in self.indexes:
            _assert_same(index, list(self.model.values()), evs, k, self.max_dist)

    @invariant()
    def structure(self):
        for index in getattr(self, "indexes", []):
            index._check()
            assert len(index) == len(self.model)


TopKMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_interleaved_changes_match_oracle = TopKMachine.TestCase


def test_seeded_stress_deep_trees():
    """Hundreds of changes on trees of fanout 2-4 (splits, emptied nodes, root collapses), the
    structure checked after each, the answers against the oracle every 25 changes."""
    rnd = random.Random(7)
    dicts = [_random_sub(rnd, f"s{i}") for i in range(400)]
    subs = [subscription_from_dict(d) for d in dicts]
    events = [event_from_dict(_random_event(rnd)) for _ in range(6)]
    for fanout in (2, 4):
        live = {s.id: s for s in subs[:100]}
        indexes = [cls.build(live.values(), fanout=fanout, max_dist=4.0) for cls in (RITree, TAS)]
        for step in range(300):
            if rnd.random() < 0.45 and live:
                sid = rnd.choice(sorted(live))
                del live[sid]
                for index in indexes:
                    index.unsubscribe(sid)
            else:
                s = rnd.choice(subs)
                live[s.id] = s
                for index in indexes:
                    index.subscribe(s)
            for index in indexes:
                index._check()
            if step % 25 == 0:
                for index in indexes:
                    _assert_same(index, list(live.values()), events, rnd.choice([1, 5, 500]), 4.0)
        while live:  # down to empty and back
            sid = live.popitem()[0]
            for index in indexes:
                index.unsubscribe(sid)
                index._check()
        for index in indexes:
            assert index.topk(events[0], 3) == []
            index.subscribe(subs[0])
            index._check()
            assert index.topk(events[0], 3) == reference_topk([subs[0]], events[0], 3, 4.0)


def _random_sub(rnd, sid):
    ops = list(OPS)
    preds = []
    for a in rnd.sample(ATTRS + ("d",), rnd.randint(1, 3)):
        op = rnd.choice(ops)
        if op == "between":
            v = sorted([rnd.randint(0, 5), rnd.randint(0, 5)])
        elif op in ("in", "not in"):
            v = rnd.sample(["x", "y", "z"] if rnd.random() < 0.5 else [1, 2, 3], 2)
        elif op in ("=", "!="):
            v = rnd.choice([1, 2, "x", "y"])
        else:
            v = rnd.randint(0, 5)
        preds.append({"attr": a, "op": op, "value": v, "weight": rnd.randint(1, 3)})
    return {
        "id": sid,
        "predicates": preds,
        "alpha": rnd.choice([0, 0.25, 0.5, 1]),
        "point": [rnd.randint(0, 5), rnd.randint(0, 5)],
    }


def _random_event(rnd):
    attrs = {a: rnd.choice([0, 1, 2, 3, "x", "y", "w"]) for a in rnd.sample("abcde", 3)}
    return {"id": "e", "attributes": attrs, "point": [rnd.randint(0, 5), rnd.randint(0, 5)]}


def test_pruning_happens(tmp_path):
    """The indexes are exact *and* prune: on a generated workload they score a fraction of what
    the scan scores (a bound that pruned nothing would pass every differential test)."""
    info = generate_topk(3000, 30, tmp_path, seed=3)  # 400 attributes: ~20 % scored
    subs = list(read_subscriptions(info["subs"]))
    events = list(read_events(info["events"]))
    max_dist = bbox_diagonal(subs)
    brute = BruteTopK.build(subs, max_dist=max_dist)
    want = brute.topk_batch(events, 5)
    for cls in (RITree, TAS):
        index = cls.build(subs, max_dist=max_dist)
        assert index.topk_batch(events, 5) == want
        assert index.scored < brute.scored / 3, (cls.__name__, index.scored, brute.scored)


# ---- the model: semantics, scores, bounds ----------------------------------------------------
@pytest.mark.parametrize(
    ("op", "value", "holds_on", "fails_on"),
    [
        ("=", 2, [2, 2.0], [3, "2", None]),
        ("=", "x", ["x"], ["y", 1, None]),
        ("!=", 2, [3, 1.5], [2, "x", None]),  # a string never satisfies a number predicate
        ("!=", "x", ["y", "unseen"], ["x", 5, None]),
        ("<", 2, [1, 1.999], [2, 3, "a"]),
        ("<=", 2, [2, -7], [2.001, "a"]),
        (">", 2, [2.5], [2, 1]),
        (">=", 2, [2, 9], [1.5]),
        ("in", ["x", "z"], ["x", "z"], ["y", 0]),
        ("in", [1, 3], [1, 3.0], [2, "1"]),
        ("not in", ["x", "z"], ["y"], ["x", 3, None]),
        ("not in", [1, 3], [2, 0], [1, "q"]),
        ("between", [1, 3], [1, 2, 3], [0.5, 3.5, "2"]),
        ("range", [1, 3], [1, 3], [4]),
    ],
)
def test_every_operator_exact(op, value, holds_on, fails_on):
    sub = subscription_from_dict(
        {
            "id": "s",
            "predicates": [{"attr": "a", "op": op, "value": value}],
            "alpha": 0.0,
            "point": [0, 0],
        }
    )
    p = sub.predicates[0]
    for v in holds_on:
        assert predicate_holds(p, float(v) if isinstance(v, int) else v), (op, value, v)
    for v in fails_on:
        assert not predicate_holds(p, float(v) if isinstance(v, int) else v), (op, value, v)
    # and every index agrees: ψ = 1 exactly when it holds, 0 otherwise (α = 0)
    for v in holds_on + fails_on:
        attrs = {} if v is None else {"a": v}
        ev = event_from_dict({"id": "e", "attributes": attrs, "point": [0, 0]})
        want = [("s", 1.0 if v in holds_on else 0.0)]
        for cls in INDEXES:
            assert cls.build([sub]).topk(ev, 1) == want, (cls.__name__, op, value, v)


def test_paper_table_3_style_score():
    """Eq. 1-4 by hand: α = 0.5, two of three predicates hold (ω 0.3 + 0.4), the event at
    distance 1 with MaxDist 4: ψ = 0.5·0.7 + 0.5·0.75."""
    sub = subscription_from_dict(
        {
            "id": "s",
            "predicates": [
                {"attr": "age", "op": "between", "value": [15, 30], "weight": 0.3},
                {"attr": "income", "op": ">", "value": 5000, "weight": 0.4},
                {"attr": "credit", "op": ">", "value": 80, "weight": 0.3},
            ],
            "alpha": 0.5,
            "point": [0, 0],
        }
    )
    ev = event_from_dict(
        {"id": "e", "attributes": {"age": 25, "income": 5001, "credit": 10}, "point": [0, 1]}
    )
    assert score(sub, ev, 4.0) == pytest.approx(0.5 * 0.7 + 0.5 * 0.75)
    assert score(sub, event_from_dict({"id": "e", "point": [0, 9]}), 4.0) == 0.0  # ψ_s clamped


def test_weights_normalised_and_round_trip():
    s = subscription_from_dict(
        {
            "id": "s",
            "predicates": [
                {"attr": "a", "op": "=", "value": 1, "weight": 1},
                {"attr": "b", "op": "in", "value": ["y", "x", "y"], "weight": 3},
            ],
            "point": [1, 2],
        }
    )
    assert [p.weight for p in s.predicates] == [0.25, 0.75] and s.alpha == 0.5
    assert s.predicates[1].value == ("x", "y")
    assert subscription_from_dict(json.loads(json.dumps(subscription_to_dict(s)))) == s


@SETTINGS
@given(d=subscription(), e=event())
def test_json_round_trip(d, e):
    s = subscription_from_dict(d)
    assert subscription_from_dict(json.loads(json.dumps(subscription_to_dict(s)))) == s
    assert math.isclose(math.fsum(p.weight for p in s.predicates), 1.0, abs_tol=1e-12)
    ev = event_from_dict(e)
    assert event_from_dict(json.loads(json.dumps(event_to_dict(ev)))) == ev


@settings(max_examples=300, deadline=None)
@given(
    ubt=st.floats(0, 3),
    ubs=st.floats(0, 1),
    a=st.floats(0, 1),
    b=st.floats(0, 1),
    t=st.floats(0, 1),
)
def test_eq8_closed_form_bounds_eq7(ubt, ubs, a, b, t):
    """Eq. 8 is at least min(1 − α, UB_t) + α·UB_s for every α in [α_min, α_max] (Eq. 7)."""
    amin, amax = min(a, b), max(a, b)
    alpha = amin + t * (amax - amin)
    assert combined_bound(ubt, ubs, amin, amax) >= min(1 - alpha, ubt) + alpha * ubs - 1e-12


# ---- validation names the field --------------------------------------------------------------
GOOD = {
    "id": "s",
    "predicates": [{"attr": "a", "op": "=", "value": 1, "weight": 1}],
    "alpha": 0.5,
    "point": [0, 0],
}


def _with(**changes):
    d = json.loads(json.dumps(GOOD))
    d.update(changes)
    return d


def _pred(**changes):
    p = dict(GOOD["predicates"][0])
    p.update(changes)
    return p


@pytest.mark.parametrize(
    ("d", "field"),
    [
        (_with(id=""), "id"),
        (_with(id=5), "id"),
        (_with(predicates=[]), "predicates"),
        (_with(predicates="a = 1"), "predicates"),
        (_with(predicates=[_pred()] * (MAX_PREDICATES + 1)), "predicates"),
        (_with(predicates=[_pred(), _pred(attr="b"), _pred(attr="c", op="~")]), "predicates[2].op"),
        (_with(predicates=[_pred(attr="")]), "predicates[0].attr"),
        (_with(predicates=[_pred(attr="x" * (MAX_ATTR_NAME_LEN + 1))]), "predicates[0].attr"),
        (_with(predicates=[_pred(), _pred()]), "predicates[1].attr"),
        (_with(predicates=[_pred(op="<", value="x")]), "predicates[0].value"),
        (_with(predicates=[_pred(value=True)]), "predicates[0].value"),
        (_with(predicates=[_pred(value=None)]), "predicates[0].value"),
        (_with(predicates=[_pred(op="in", value=[])]), "predicates[0].value"),
        (
            _with(predicates=[_pred(op="in", value=list(range(MAX_SET_VALUES + 1)))]),
            "predicates[0].value",
        ),
        (_with(predicates=[_pred(op="in", value=[1, "x"])]), "predicates[0].value[1]"),
        (_with(predicates=[_pred(op="between", value=[3, 1])]), "predicates[0].value[1]"),
        (_with(predicates=[_pred(op="between", value=[1])]), "predicates[0].value"),
        (_with(predicates=[_pred(value=float("nan"))]), "predicates[0].value"),
        (_with(predicates=[_pred(weight=0)]), "predicates[0].weight"),
        (_with(predicates=[_pred(weight=-1)]), "predicates[0].weight"),
        (_with(predicates=[_pred(weight="1")]), "predicates[0].weight"),
        (_with(predicates=[_pred(extra=1)]), "predicates[0].extra"),
        (_with(alpha=1.5), "alpha"),
        (_with(alpha=None), "alpha"),
        (_with(point=[200, 0]), "point[0]"),
        (_with(point=[0, 91]), "point[1]"),
        (_with(point=[0]), "point"),
        (_with(region=[0, 0]), "region"),
    ],
)
def test_subscription_validation_names_the_field(d, field):
    with pytest.raises(ValidationError) as err:
        subscription_from_dict(d)
    assert err.value.field == field, str(err.value)


@pytest.mark.parametrize(
    ("d", "field"),
    [
        ({"id": "e", "attributes": {"a": [1]}, "point": [0, 0]}, "attributes.a"),
        ({"id": "e", "attributes": {"a": True}, "point": [0, 0]}, "attributes.a"),
        ({"id": "e", "attributes": {"a": float("inf")}, "point": [0, 0]}, "attributes.a"),
        ({"id": "e", "attributes": {"": 1}, "point": [0, 0]}, "attributes."),
        ({"id": "e", "attributes": [], "point": [0, 0]}, "attributes"),
        ({"id": "e", "attributes": {f"a{i}": 1 for i in range(65)}, "point": [0, 0]}, "attributes"),
        ({"id": "e", "attributes": {}}, "point"),
        ({"id": "e", "point": [0, -100]}, "point[1]"),
        ({"attributes": {}, "point": [0, 0]}, "id"),
    ],
)
def test_event_validation_names_the_field(d, field):
    with pytest.raises(ValidationError) as err:
        event_from_dict(d)
    assert err.value.field == field, str(err.value)


def test_index_errors():
    s = subscription_from_dict(GOOD)
    for cls in INDEXES:
        index = cls.build([s])
        with pytest.raises(NotFoundError):
            index.unsubscribe("nope")
        with pytest.raises(ValidationError) as err:
            index.topk(event_from_dict({"id": "e", "point": [0, 0]}), 0)
        assert err.value.field == "k"
        assert index.topk_batch([], 3) == []
    with pytest.raises(ValidationError) as err:
        RITree(max_dist=0)
    assert err.value.field == "max_dist"


def test_core_imports_no_process_edge():
    code = (
        "import sys, shard.topk.ritree, shard.topk.tas, shard.topk.oracle;"
        "bad = [m for m in ('ray', 'grpc', 'redis', 'pyspark') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---- the workload generator and the benchmark ------------------------------------------------
def test_generator_deterministic_and_valid(tmp_path):
    a = generate_topk(300, 40, tmp_path / "a", seed=4, n_attrs=20, cardinality=10, dist="uniform")
    generate_topk(300, 40, tmp_path / "b", seed=4, n_attrs=20, cardinality=10, dist="uniform")
    assert (tmp_path / "a" / "subs.jsonl").read_text() == (
        tmp_path / "b" / "subs.jsonl"
    ).read_text()
    errors: list[str] = []
    subs = list(read_subscriptions(a["subs"], errors=errors))
    events = list(read_events(a["events"], errors=errors))
    assert errors == [] and len(subs) == 300 and len(events) == 40
    ops = {p.op for s in subs for p in s.predicates}
    assert ops == set(OPS)
    assert all(8 <= len(e.attributes) <= 12 for e in events)
    alphas = generate_topk(50, 1, tmp_path / "c", seed=1, n_attrs=5, alpha="normal:0.9")
    assert all(0.6 < s.alpha <= 1.0 for s in read_subscriptions(alphas["subs"]))
    with pytest.raises(ValidationError):
        generate_topk(5, 5, tmp_path / "d", dist="pareto")


def _bench_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kinds = parser.add_subparsers(dest="bench")
    bench_topk.register(kinds)
    return parser.parse_args(["topk", *argv])


@pytest.mark.parametrize("index", ["ritree", "tas", "brute"])
def test_bench_topk_run(tmp_path, capsys, index):
    info = generate_topk(400, 30, tmp_path, seed=9, n_attrs=12, cardinality=8)
    out = tmp_path / "top.tsv"
    args = _bench_args(
        [
            "--subs",
            info["subs"],
            "--msgs",
            info["events"],
            "--k",
            "7",
            "--index",
            index,
            "--json",
            "--out",
            str(out),
            "--fanout",
            "4",
            "--check-sample",
            "10",
        ]
    )
    assert bench_topk.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["index"] == index and report["n_subs"] == 400 and report["n_events"] == 30
    assert report["results"] == 30 * 7 and report["build_s"] >= 0 and report["us_per_event"] > 0
    assert report["check"]["identical"] and report["check"]["sample"] == 10
    subs = list(read_subscriptions(info["subs"]))
    events = list(read_events(info["events"]))
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    got: dict[str, list[tuple[str, float]]] = {}
    for mid, rank, sid, sc in rows:
        got.setdefault(mid, []).append((sid, float(sc)))
        assert int(rank) == len(got[mid])
    for e in events:
        assert got[e.id] == reference_topk(subs, e, 7, report["max_dist"])


def test_bench_topk_summary_and_bad_input(tmp_path, capsys):
    info = generate_topk(50, 5, tmp_path, seed=1, n_attrs=5, cardinality=4)
    args = _bench_args(["--subs", info["subs"], "--msgs", info["events"], "--max-dist", "domain"])
    assert bench_topk.run(args) == 0
    text = capsys.readouterr().out
    assert "ritree: 50 subscriptions, 5 events, k=10" in text and "identical" in text
    with pytest.raises(ValidationError) as err:
        bench_topk.run(_bench_args(["--subs", str(tmp_path / "none"), "--msgs", info["events"]]))
    assert err.value.field == "--subs"
    with pytest.raises(ValidationError) as err:
        bench_topk.run(
            _bench_args(["--subs", info["subs"], "--msgs", info["events"], "--max-dist", "-1"])
        )
    assert err.value.field == "--max-dist"
