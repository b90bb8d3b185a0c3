"""Validation rules of the domain model: every bad input raises one ValidationError naming the
field and the value; good input round-trips."""

from __future__ import annotations

import pickle
import random

import pytest

from shard.errors import ExpressionError, ValidationError
from shard.limits import MAX_TTL_S
from shard.model import (
    Circle,
    Point,
    Rect,
    message_from_dict,
    message_to_dict,
    subscription_from_dict,
    subscription_to_dict,
    subscriptions_from_rows,
    subscriptions_to_rows,
)
from tests.workloads import random_subscription

GOOD_SUB = {"id": "s1", "keywords": ["iPad", "Discount"], "rect": [0, 0, 1, 1]}
GOOD_MSG = {"id": "m1", "keywords": ["ipad"], "point": [0.5, 0.5]}


def sub(**changes):
    d = dict(GOOD_SUB)
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def msg(**changes):
    d = dict(GOOD_MSG)
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def test_good_subscription_normalizes_terms():
    s = subscription_from_dict(sub(keywords=["ＩＰＡＤ", "ipad", "Straße"]))
    assert s.clauses == (("ipad", "strasse"),)
    assert s.region == Rect(0.0, 0.0, 1.0, 1.0)
    assert not s.moving


def test_expr_and_circle_and_moving():
    s = subscription_from_dict(
        {"id": "s", "expr": "ipad AND (discount OR sale)", "circle": [1, 2, 300], "moving": True}
    )
    assert s.clauses == (("discount", "ipad"), ("ipad", "sale"))
    assert s.region == Circle(1.0, 2.0, 300.0) and s.moving


@pytest.mark.parametrize(
    ("d", "field", "value"),
    [
        (sub(id=""), "id", ""),
        (sub(id="x" * 129), "id", "x" * 129),
        (sub(id="a\nb"), "id", "a\nb"),
        (sub(id=5), "id", 5),
        (sub(keywords=[]), "keywords", []),
        (sub(keywords="ipad"), "keywords", "ipad"),
        (sub(keywords=[f"k{i}" for i in range(17)]), "keywords", [f"k{i}" for i in range(17)]),
        (sub(keywords=["ok", "  "]), "keywords[1]", "  "),
        (sub(keywords=["ok", 3]), "keywords[1]", 3),
        (sub(keywords=["x" * 65]), "keywords[0]", "x" * 65),
        (sub(expr="a"), "keywords", ["iPad", "Discount"]),
        (sub(keywords=..., rect=[0, 0, 1, 1]), "keywords", None),
        (sub(rect=[0, 0, 1]), "rect", [0, 0, 1]),
        (sub(rect="0,0,1,1"), "rect", "0,0,1,1"),
        (sub(rect=[-181, 0, 1, 1]), "rect[0]", -181),
        (sub(rect=[0, -91, 1, 1]), "rect[1]", -91),
        (sub(rect=[0, 0, 181, 1]), "rect[2]", 181),
        (sub(rect=[0, 0, 1, 90.5]), "rect[3]", 90.5),
        (sub(rect=[10, 0, 5, 1]), "rect[2]", 5),
        (sub(rect=[0, 5, 1, 1]), "rect[3]", 1),
        (sub(rect=[0, 0, 1, float("nan")]), "rect[3]", None),
        (sub(rect=[0, 0, float("inf"), 1]), "rect[2]", float("inf")),
        (sub(rect=[0, 0, True, 1]), "rect[2]", True),
        (sub(rect=[0, 0, "1", 1]), "rect[2]", "1"),
        (sub(rect=..., circle=[0, 0, 0]), "circle[2]", 0),
        (sub(rect=..., circle=[0, 0, -5]), "circle[2]", -5),
        (sub(rect=..., circle=[0, 0, 20_000_001]), "circle[2]", 20_000_001),
        (sub(rect=..., circle=[200, 0, 5]), "circle[0]", 200),
        (sub(rect=..., circle=[0, 0]), "circle", [0, 0]),
        (sub(circle=[0, 0, 5]), "rect", [0, 0, 1, 1]),
        (sub(rect=...), "rect", None),
        (sub(moving="yes"), "moving", "yes"),
        (sub(colour="red"), "colour", "red"),
    ],
)
def test_bad_subscription_names_field_and_value(d, field, value):
    with pytest.raises(ValidationError) as e:
        subscription_from_dict(d)
    assert e.value.field == field
    if value is not None and value == value:  # NaN has no equality
        assert e.value.value == value


def test_bad_expression_is_expression_error():
    with pytest.raises(ExpressionError) as e:
        subscription_from_dict(sub(keywords=..., expr="a OR NOT b"))
    assert e.value.field == "expr" and "'NOT b' has no positive term" in str(e.value)
    with pytest.raises(ExpressionError, match="can never hold"):
        subscription_from_dict(sub(keywords=..., expr="a AND NOT a"))


def test_good_message_terms_from_keywords_and_text():
    m = message_from_dict(
        {
            "id": "m",
            "keywords": ["Sale"],
            "text": "iPad sale, today!",
            "rect": [0, 0, 1, 1],
            "ttl": 5,
        }
    )
    assert m.terms == ("ipad", "sale", "today")
    assert m.location == Rect(0.0, 0.0, 1.0, 1.0) and m.ttl == 5.0
    assert (
        message_from_dict(GOOD_MSG).location == Point(0.5, 0.5)
        and message_from_dict(GOOD_MSG).ttl is None
    )


@pytest.mark.parametrize(
    ("d", "field", "value"),
    [
        (msg(id=""), "id", ""),
        (msg(keywords=[]), "keywords", []),
        (msg(keywords=["", "a"]), "keywords[0]", ""),
        (msg(keywords="a"), "keywords", "a"),
        (msg(text=5), "text", 5),
        (msg(text="x" * 16385), "text", "x" * 16385),
        (msg(keywords=[f"k{i}" for i in range(257)]), "keywords", 257),
        (msg(point=[0, 91]), "point[1]", 91),
        (msg(point=[181, 0]), "point[0]", 181),
        (msg(point=[0]), "point", [0]),
        (msg(point=..., rect=[1, 0, 0, 1]), "rect[2]", 0),
        (msg(rect=[0, 0, 1, 1]), "point", [0.5, 0.5]),
        (msg(point=...), "point", None),
        (msg(ttl=-1), "ttl", -1),
        (msg(ttl=float("inf")), "ttl", float("inf")),
        (msg(ttl="5"), "ttl", "5"),
        (msg(ttl=1e308), "ttl", 1e308),  # a message live forever
        (msg(ttl=MAX_TTL_S + 1), "ttl", MAX_TTL_S + 1),
        (msg(extra=1), "extra", 1),
    ],
)
def test_bad_message_names_field_and_value(d, field, value):
    with pytest.raises(ValidationError) as e:
        message_from_dict(d)
    assert e.value.field == field
    if value is not None:
        assert e.value.value == value


def test_the_longest_ttl_is_thirty_days_and_the_error_says_so():
    assert MAX_TTL_S == 30 * 86400
    assert message_from_dict(msg(ttl=MAX_TTL_S)).ttl == MAX_TTL_S
    with pytest.raises(ValidationError, match=r"ttl=2592001: must be at most 2592000 seconds"):
        message_from_dict(msg(ttl=2592001))


def test_message_empty_id_allowed_only_when_asked():
    assert message_from_dict(msg(id=""), allow_empty_id=True).id == ""


@pytest.mark.parametrize(
    "d",
    [
        GOOD_SUB,
        {"id": "s", "expr": "a AND (b OR c)", "circle": [1.5, 2.5, 300.0], "moving": True},
    ],
)
def test_subscription_round_trip(d):
    s = subscription_from_dict(d)
    assert subscription_from_dict(subscription_to_dict(s)) == s


@pytest.mark.parametrize(
    "d", [GOOD_MSG, {"id": "m", "text": "free text", "rect": [0, 0, 1, 1], "ttl": 3.0}]
)
def test_message_round_trip(d):
    m = message_from_dict(d)
    assert message_from_dict(message_to_dict(m)) == m


def test_subscriptions_survive_the_rows_sent_to_shard_actors():
    rng = random.Random(12)
    subs = [random_subscription(rng, f"s{i}") for i in range(300)]
    subs.append(subscription_from_dict({"id": "k", "keywords": ["iPad"], "circle": [1, 2, 3]}))
    subs.append(subscription_from_dict({"id": "e", "expr": "a OR b", "rect": [0, 0, 1, 1]}))
    rows = pickle.loads(pickle.dumps(subscriptions_to_rows(subs)))
    assert subscriptions_from_rows(rows) == subs
