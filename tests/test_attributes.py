"""Attribute predicates (``shard.attributes``) and their compiled check (``shard.predicates``).

The oracle is ``all_hold``, plain Python over the predicate objects; ``check_pairs`` over the
columns must agree with it on every pair, through adds, removes, row reuse and pool
compaction. The domains are tiny so that equal values, unknown strings, missing attributes and
type mismatches (a string predicate meeting a number) are common.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import shard.predicates
from shard.attributes import (
    MAX_ATTR_NAME_LEN,
    MAX_ATTRIBUTES,
    MAX_PREDICATES,
    MAX_SET_VALUES,
    MAX_STRING_VALUE_LEN,
    OPS,
    Predicate,
    all_hold,
    attributes_from_mapping,
    attributes_to_mapping,
    predicate_holds,
    predicates_from_list,
    predicates_to_list,
)
from shard.errors import NotFoundError, ValidationError
from shard.predicates import PredicateColumns, check_pairs
from shard.topk import model as topk_model

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- strategies: tiny domains -----------------------------------------------------------------
ATTRS = ("a", "b", "c", "d")
NUMBERS = st.sampled_from([0, -0.0, 1, 2, 2.5, 3, -1e300])
STRINGS = st.sampled_from(["x", "y", "z"])
UNKNOWN_STRINGS = st.sampled_from(["w", "never"])  # no predicate mentions them
SPELLINGS = (*OPS, "==", "range")


@st.composite
def predicate(draw, attr: str) -> dict:
    op = draw(st.sampled_from(SPELLINGS))
    if op in ("<", "<=", ">", ">="):
        value = draw(NUMBERS)
    elif op in ("between", "range"):
        value = sorted(draw(st.lists(NUMBERS, min_size=2, max_size=2)))
    elif op in ("in", "not in"):
        value = draw(
            st.lists(STRINGS, min_size=1, max_size=3) | st.lists(NUMBERS, min_size=1, max_size=3)
        )
    else:
        value = draw(NUMBERS | STRINGS)
    return {"attr": attr, "op": op, "value": value}


@st.composite
def conjunction(draw) -> tuple[Predicate, ...]:
    attrs = draw(st.lists(st.sampled_from(ATTRS), max_size=4, unique=True))
    if not attrs:
        return ()
    return predicates_from_list("where", [draw(predicate(a)) for a in attrs], weighted=False)


MESSAGE = st.dictionaries(
    st.sampled_from((*ATTRS, "e")), NUMBERS | STRINGS | UNKNOWN_STRINGS, max_size=5
).map(lambda d: attributes_from_mapping("attributes", d))


def _assert_pairs(cols: PredicateColumns, rows: dict[int, tuple], messages: list, rng) -> None:
    """Every (row, message) pair, in a shuffled order with repeats, against ``all_hold``."""
    batch = cols.encode_messages(messages)
    pairs = [(r, m) for r in rows for m in range(len(messages))]
    pairs += rng.choices(pairs, k=len(pairs) // 2) if pairs else []
    rng.shuffle(pairs)
    got = check_pairs(cols, [r for r, _ in pairs], [m for _, m in pairs], batch)
    assert got.dtype == np.bool_ and got.shape == (len(pairs),)
    for (r, m), g in zip(pairs, got.tolist(), strict=True):
        want = all_hold(rows[r], dict(messages[m]))
        assert g == want, f"row {r} {rows[r]} on {messages[m]}: {g} != {want}"


# ---- differential ------------------------------------------------------------------------------
@SETTINGS
@given(
    conjs=st.lists(conjunction(), max_size=12),
    messages=st.lists(MESSAGE, min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_check_pairs_matches_all_hold(conjs, messages, seed):
    cols = PredicateColumns()
    rows = dict(zip(cols.add_many(conjs), conjs, strict=True))
    cols._check()
    _assert_pairs(cols, rows, messages, random.Random(seed))


class ColumnsMachine(RuleBasedStateMachine):
    """Adds, removes (rows reused) and checks against a dict row -> predicates, with a tiny
    compaction threshold so that the pools are rewritten often; ``_check`` after every
    change."""

    @initialize(min_dead=st.sampled_from([0, 3]), bulk=st.lists(conjunction(), max_size=6))
    def start(self, min_dead, bulk):
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(shard.predicates, "COMPACT_MIN_DEAD", min_dead)
        self.cols = PredicateColumns()
        self.model = dict(zip(self.cols.add_many(bulk), bulk, strict=True))
        self.rng = random.Random(len(bulk))

    def teardown(self):
        if hasattr(self, "patch"):
            self.patch.undo()

    @rule(preds=conjunction())
    def add(self, preds):
        free = set(self.cols.free)
        r = self.cols.add(preds)
        assert r not in self.model and (not free or r in free)
        self.model[r] = preds

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        r = data.draw(st.sampled_from(sorted(self.model)))
        del self.model[r]
        self.cols.remove(r)
        with pytest.raises(NotFoundError):
            self.cols.remove(r)

    @rule(messages=st.lists(MESSAGE, min_size=1, max_size=4))
    def check(self, messages):
        _assert_pairs(self.cols, self.model, messages, self.rng)

    @invariant()
    def consistent(self):
        if hasattr(self, "cols"):
            self.cols._check()
            assert len(self.cols) == len(self.model)


ColumnsMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_columns_machine = ColumnsMachine.TestCase


def test_stress_compaction_with_the_default_threshold():
    """Enough churn to pass ``COMPACT_MIN_DEAD`` several times; rows stay right throughout."""
    rng = random.Random(7)
    cols = PredicateColumns()
    model: dict[int, tuple] = {}
    compactions = 0
    for step in range(6000):
        if model and rng.random() < 0.5:
            r = rng.choice(list(model))
            dead = cols.dead_p
            cols.remove(r)
            compactions += cols.dead_p < dead
            del model[r]
        else:
            k = rng.randint(1, 4)
            attrs = rng.sample(ATTRS, k)
            preds = tuple(
                Predicate(a, "in", tuple(sorted(set(rng.choices("xyz", k=2)))))
                if rng.random() < 0.5
                else Predicate(a, rng.choice(["<", ">=", "!="]), float(rng.randint(0, 3)))
                for a in attrs
            )
            model[cols.add(preds)] = preds
        if step % 1500 == 0:
            cols._check()
    cols._check()
    assert compactions >= 2 and cols.n_p - cols.dead_p == sum(len(p) for p in model.values())
    messages = [
        attributes_from_mapping("m", {a: rng.choice([0, 1, 2, 3, "x", "y", "w"]) for a in ATTRS})
        for _ in range(20)
    ]
    _assert_pairs(cols, model, messages, rng)


# ---- the semantics, case by case ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "value", "message", "want"),
    [
        ("!=", "x", {"a": "w"}, True),  # a string no predicate mentions
        ("not in", ["x", "y"], {"a": "w"}, True),
        ("=", "x", {"a": "w"}, False),
        ("in", ["x", "y"], {"a": "w"}, False),
        ("!=", "x", {"a": 5}, False),  # a string predicate never holds on a number
        ("not in", [1, 2], {"a": "x"}, False),
        ("!=", 1, {}, False),  # nor on a missing attribute
        ("not in", [1], {"b": 3}, False),
        ("between", [1, 2], {"a": 2}, True),
        ("range", [1, 2], {"a": 2.0000001}, False),
        ("<", 0, {"a": -0.0}, False),
        ("==", 0, {"a": -0.0}, True),
    ],
)
def test_edge_cases(op, value, message, want):
    preds = predicates_from_list("where", [{"attr": "a", "op": op, "value": value}], weighted=False)
    attrs = attributes_from_mapping("attributes", message)
    assert all_hold(preds, dict(attrs)) is want
    cols = PredicateColumns()
    r = cols.add(preds)
    assert check_pairs(cols, [r], [0], cols.encode_messages([attrs])).tolist() == [want]


def test_no_predicates_always_hold_and_two_must_both_hold():
    cols = PredicateColumns()
    empty = cols.add(())
    both = cols.add((Predicate("a", ">", 1.0), Predicate("b", "=", "x")))
    batch = cols.encode_messages([(), (("a", 2.0),), (("a", 2.0), ("b", "x"))])
    got = check_pairs(cols, [empty, both, both, both], [0, 0, 1, 2], batch)
    assert got.tolist() == [True, False, False, True]
    assert check_pairs(cols, [], [], batch).tolist() == []


def test_misuse_is_refused():
    cols = PredicateColumns()
    r = cols.add((Predicate("a", "!=", "x"),))
    batch = cols.encode_messages([(("a", "y"),)])
    assert check_pairs(cols, [r], [0], batch).tolist() == [True]
    cols.add((Predicate("a", "=", "y"),))  # interns "y": the batch's −1 for it is stale
    with pytest.raises(ValueError, match="encoded before"):
        check_pairs(cols, [r], [0], batch)
    batch = cols.encode_messages([(("a", "y"),)])
    assert check_pairs(cols, [r], [0], batch).tolist() == [True]
    cols.add((Predicate("a", "=", "y"),))  # nothing new interned: still valid
    assert check_pairs(cols, [r], [0], batch).tolist() == [True]
    with pytest.raises(IndexError):
        check_pairs(cols, [r], [1], batch)
    with pytest.raises(IndexError):
        check_pairs(cols, [99], [0], batch)
    cols.remove(r)
    with pytest.raises(IndexError):
        check_pairs(cols, [r], [0], batch)
    with pytest.raises(ValueError, match="differ"):
        check_pairs(cols, [0, 1], [0], batch)
    with pytest.raises(NotFoundError):
        cols.remove(-1)


# ---- validation --------------------------------------------------------------------------------
def _preds(*ps, weighted=False):
    return predicates_from_list("where", list(ps), weighted=weighted)


def _p(op="=", value=1, attr="a", **extra):
    return {"attr": attr, "op": op, "value": value, **extra}


@pytest.mark.parametrize(
    ("call", "field", "reason"),
    [
        (lambda: _preds(_p(op="~")), "where[0].op", "must be one of"),
        (lambda: _preds(_p(op=None)), "where[0].op", "must be one of"),
        (lambda: _preds(_p(value=True)), "where[0].value", "number or a string"),
        (lambda: _preds(_p(op="<", value=math.nan)), "where[0].value", "finite"),
        (lambda: _preds(_p(op="<", value=10**400)), "where[0].value", "finite"),
        (lambda: _preds(_p(op="<", value="x")), "where[0].value", "must be a number"),
        (lambda: _preds(_p(op="in", value=["x", 1])), "where[0].value[1]", "all numbers or"),
        (lambda: _preds(_p(op="in", value=[math.inf])), "where[0].value[0]", "finite"),
        (
            lambda: _preds(_p(op="not in", value=list(range(MAX_SET_VALUES + 1)))),
            "where[0].value",
            f"1-{MAX_SET_VALUES} values",
        ),
        (lambda: _preds(_p(op="in", value=[])), "where[0].value", "values"),
        (lambda: _preds(_p(op="in", value="xy")), "where[0].value", "must be a list"),
        (lambda: _preds(_p(op="between", value=[2, 1])), "where[0].value[1]", "hi < lo"),
        (lambda: _preds(_p(op="between", value=[1])), "where[0].value", "[lo, hi]"),
        (lambda: _preds(_p(weight=1)), "where[0].weight", "unknown field"),
        (lambda: _preds(_p(unit="kg")), "where[0].unit", "unknown field"),
        (lambda: _preds(_p(), _p(op=">")), "where[1].attr", "already constrained by where[0]"),
        (lambda: _preds(_p(attr="a" * (MAX_ATTR_NAME_LEN + 1))), "where[0].attr", "characters"),
        (lambda: _preds(_p(attr="")), "where[0].attr", "characters"),
        (lambda: _preds(_p(attr=3)), "where[0].attr", "must be a string"),
        (lambda: _preds(_p(attr="a\n")), "where[0].attr", "printable"),
        (lambda: _preds(_p(value="x" * (MAX_STRING_VALUE_LEN + 1))), "where[0].value", "longer"),
        (lambda: _preds({"attr": "a", "op": "="}), "where[0].value", "missing"),
        (lambda: _preds("a = 1"), "where[0]", "must be an object"),
        (lambda: _preds(), "where", f"1-{MAX_PREDICATES} predicates"),
        (
            lambda: _preds(*(_p(attr=f"a{i}") for i in range(MAX_PREDICATES + 1))),
            "where",
            f"1-{MAX_PREDICATES} predicates",
        ),
        (lambda: predicates_from_list("where", "a=1", weighted=False), "where", "a list"),
        (lambda: _preds(_p(weight=0), weighted=True), "where[0].weight", "> 0"),
        (lambda: _preds(_p(weight=True), weighted=True), "where[0].weight", "a number"),
        (
            lambda: _preds(_p(weight=1e308), _p(attr="b", weight=1e308), weighted=True),
            "where",
            "sum must be finite",
        ),
        (lambda: attributes_from_mapping("attrs", [("a", 1)]), "attrs", "must be an object"),
        (lambda: attributes_from_mapping("attrs", "a=1"), "attrs", "must be an object"),
        (lambda: attributes_from_mapping("attrs", {"k": True}), "attrs.k", "number or a string"),
        (lambda: attributes_from_mapping("attrs", {"k": math.nan}), "attrs.k", "finite"),
        (lambda: attributes_from_mapping("attrs", {"k": None}), "attrs.k", "number or a string"),
        (lambda: attributes_from_mapping("attrs", {"k": [1]}), "attrs.k", "number or a string"),
        (
            lambda: attributes_from_mapping("attrs", {"n" * (MAX_ATTR_NAME_LEN + 1): 1}),
            "attrs." + "n" * (MAX_ATTR_NAME_LEN + 1),
            "characters",
        ),
        (lambda: attributes_from_mapping("attrs", {"": 1}), "attrs.", "characters"),
        (
            lambda: attributes_from_mapping(
                "attrs", {f"k{i}": i for i in range(MAX_ATTRIBUTES + 1)}
            ),
            "attrs",
            f"at most {MAX_ATTRIBUTES}",
        ),
    ],
)
def test_validation_names_the_field(call, field, reason):
    with pytest.raises(ValidationError) as err:
        call()
    assert err.value.field == field, str(err.value)
    assert reason in err.value.reason, str(err.value)


def test_validation_accepts_the_limits_and_normalises():
    many = [_p(op="in", value=list(range(MAX_SET_VALUES)), attr=f"a{i}") for i in range(32)]
    ps = predicates_from_list("where", many, weighted=False)
    assert len(ps) == MAX_PREDICATES and all(len(p.value) == MAX_SET_VALUES for p in ps)
    assert {p.weight for p in ps} == {1.0}
    ps = _preds(_p(op="==", value=2), _p(op="range", value=[1, 1], attr="b"))
    assert [(p.op, p.value) for p in ps] == [("=", 2.0), ("between", (1.0, 1.0))]
    ps = _preds(_p(op="in", value=["y", "x", "y"]))
    assert ps[0].value == ("x", "y") and ps[0].is_string
    ws = _preds(_p(weight=1), _p(attr="b", weight=3), weighted=True)
    assert [p.weight for p in ws] == [0.25, 0.75]
    attrs = {f"k{i}": i for i in range(MAX_ATTRIBUTES)} | {"k0": "v" * MAX_STRING_VALUE_LEN}
    got = attributes_from_mapping("attrs", attrs)
    assert [n for n, _ in got] == sorted(attrs) and dict(got)["k1"] == 1.0


def test_topk_uses_the_same_model():
    assert topk_model.Predicate is Predicate and topk_model.MAX_EVENT_ATTRS == MAX_ATTRIBUTES
    d = {"id": "s", "predicates": [_p(weight=2), _p(attr="b", op="in", value=["y"], weight=1)]}
    sub = topk_model.subscription_from_dict(d | {"point": [0, 0]})
    assert sub.predicates == predicates_from_list("predicates", d["predicates"], weighted=True)
    with pytest.raises(ValidationError) as err:
        topk_model.event_from_dict({"id": "e", "attributes": {"x": True}, "point": [0, 0]})
    assert err.value.field == "attributes.x"


def test_validators_load_no_numba_nor_the_indexes():
    """The client validates with ``shard.attributes``; the topk package imports it, not the
    other way round."""
    code = (
        "import sys, shard.attributes\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'ray', 'grpc',"
        " 'redis', 'pyspark') or m in ('shard.model', 'shard.topk', 'shard.predicates')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ---- round trips -------------------------------------------------------------------------------
@SETTINGS
@given(
    dicts=st.lists(st.sampled_from(ATTRS), min_size=1, max_size=4, unique=True).flatmap(
        lambda attrs: st.tuples(*(predicate(a) for a in attrs))
    ),
    weights=st.lists(st.sampled_from([1, 2, 0.5, 1e-3]), min_size=4, max_size=4),
    attrs=st.dictionaries(st.sampled_from((*ATTRS, "e")), NUMBERS | STRINGS, max_size=5),
)
def test_round_trips(dicts, weights, attrs):
    for weighted in (False, True):
        raw = (
            [d | {"weight": w} for d, w in zip(dicts, weights, strict=False)]
            if weighted
            else list(dicts)
        )
        ps = predicates_from_list("where", raw, weighted=weighted)
        back = json.loads(json.dumps(predicates_to_list(ps, weighted=weighted)))
        assert predicates_from_list("where", back, weighted=weighted) == ps
        assert all(p.op in OPS for p in ps)
    a = attributes_from_mapping("attrs", attrs)
    back = json.loads(json.dumps(attributes_to_mapping(a)))
    assert attributes_from_mapping("attrs", back) == a
    assert [n for n, _ in a] == sorted(attrs)


def test_predicate_holds_refuses_the_other_type():
    assert predicate_holds(Predicate("a", "!=", 1.0), 2.0)
    assert not predicate_holds(Predicate("a", "!=", 1.0), "2")
    assert not predicate_holds(Predicate("a", "!=", "x"), None)
