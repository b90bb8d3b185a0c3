"""Protobuf <-> domain conversion: every converter round-trips, and an invalid request raises the
core's ValidationError naming a real field path of the request (``subscription.rect.min_lon``)."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geopubsub.convert import (
    _keywords_in_rect,
    _message_via_dict,
    _subscription_via_dict,
    from_proto_delivery,
    from_proto_location_request,
    from_proto_location_update,
    from_proto_message,
    from_proto_point,
    from_proto_subscription,
    proto_field,
    to_proto_delivery,
    to_proto_message,
    to_proto_point,
    to_proto_subscription,
)
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.errors import ExpressionError, ValidationError
from shard.limits import MAX_TTL_S
from shard.model import (
    ADD,
    Circle,
    Message,
    Point,
    Rect,
    Sign,
    Subscription,
    message_from_dict,
    subscription_from_dict,
)

# ---- strategies -----------------------------------------------------------------------------
lons = st.floats(-180, 180)
lats = st.floats(-90, 90)
words = st.sampled_from(["ipad", "Sale", "DISCOUNT", "straße", "ＩＰＡＤ", "café", "50"])
ids = st.text(st.characters(codec="utf-8", categories=["L", "N", "P"]), min_size=1, max_size=12)


@st.composite
def rects(draw):
    x0, x1 = sorted((draw(lons), draw(lons)))
    y0, y1 = sorted((draw(lats), draw(lats)))
    return [x0, y0, x1, y1]


circles = st.tuples(lons, lats, st.floats(0.5, 2e7)).map(list)
exprs = st.sampled_from(["ipad AND (sale OR discount)", "café 50", "ipad OR straße", "sale"])


@st.composite
def subscription_dicts(draw):
    d = {"id": draw(ids), "moving": draw(st.booleans())}
    if draw(st.booleans()):
        d["keywords"] = draw(st.lists(words, min_size=1, max_size=4))
    else:
        d["expr"] = draw(exprs)
    if draw(st.booleans()):
        d["rect"] = draw(rects())
    else:
        d["circle"] = draw(circles)
    return d


@st.composite
def message_dicts(draw):
    d = {"id": draw(ids), "keywords": draw(st.lists(words, max_size=4))}
    if not d["keywords"] or draw(st.booleans()):
        d["text"] = draw(st.sampled_from(["iPad sale today", "50% off", "café"]))
    if draw(st.booleans()):
        d["point"] = [draw(lons), draw(lats)]
    else:
        d["rect"] = draw(rects())
    if draw(st.booleans()):
        d["ttl"] = draw(st.floats(0.001, 1e6))
    return d


# Anything a client could send, valid or not.
any_double = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1.0, -1.0])
any_text = st.text(st.characters(codec="utf-8"), max_size=8) | words
any_rect = st.builds(pb.Rect, min_lon=any_double, min_lat=any_double, max_lon=any_double)
any_circle = st.builds(pb.Circle, lon=any_double, lat=any_double, radius_m=any_double)


@st.composite
def any_subscriptions(draw):
    sub = pb.Subscription(
        id=draw(ids | any_text),
        keywords=draw(st.lists(words, max_size=3) | st.lists(any_text, max_size=3)),
        expr=draw(st.sampled_from(["", "", "ipad OR", "NOT x", "a AND b"])),
        moving=draw(st.booleans()),
    )
    region = draw(st.sampled_from(["rect", "circle", None]))
    if region == "rect":
        sub.rect.CopyFrom(draw(any_rect))
    elif region == "circle":
        sub.circle.CopyFrom(draw(any_circle))
    return sub


@st.composite
def any_messages(draw):
    msg = pb.Message(
        id=draw(ids | any_text),
        keywords=draw(st.lists(words, max_size=3) | st.lists(any_text, max_size=3)),
        text=draw(any_text),
        ttl_s=draw(any_double),
    )
    location = draw(st.sampled_from(["point", "rect", None]))
    if location == "point":
        msg.point.CopyFrom(pb.Point(lon=draw(any_double), lat=draw(any_double)))
    elif location == "rect":
        msg.rect.CopyFrom(draw(any_rect))
    return msg


def field_exists(path: str, request) -> bool:
    """Whether ``path`` (``subscription.rect.min_lon``, ``message.keywords[0]``) is a field path of
    the request message type; an index only on a repeated field."""
    descriptor = request.DESCRIPTOR
    for part in path.split("."):
        if descriptor is None:
            return False
        m = re.fullmatch(r"(\w+)(\[\d+\])?", part)
        if m is None or m[1] not in descriptor.fields_by_name:
            return False
        field = descriptor.fields_by_name[m[1]]
        if m[2] and not field.is_repeated:
            return False
        descriptor = field.message_type
    return True


# ---- subscriptions --------------------------------------------------------------------------
@given(subscription_dicts())
def test_subscription_round_trips_domain_proto_domain(d):
    sub = subscription_from_dict(d)
    assert from_proto_subscription(to_proto_subscription(sub)) == sub


@given(any_subscriptions())
def test_any_proto_subscription_round_trips_or_names_a_real_field(sub):
    try:
        domain = from_proto_subscription(sub)
    except ValidationError as e:
        assert e.field.startswith("subscription.")
        assert field_exists(e.field, pb.SubscribeRequest), e.field
        assert str(e).startswith(f"{e.field}=")
    else:
        assert to_proto_subscription(domain) == sub


def test_subscription_fields():
    sub = from_proto_subscription(
        pb.Subscription(
            id="s1", keywords=["iPad", "Sale"], moving=True, rect=pb.Rect(max_lon=1, max_lat=2)
        )
    )
    assert sub == Subscription(
        "s1", (("ipad", "sale"),), Rect(0, 0, 1, 2), True, ("iPad", "Sale"), None
    )
    circle = from_proto_subscription(
        pb.Subscription(id="s2", expr="a OR b", circle=pb.Circle(lon=1, lat=2, radius_m=30))
    )
    assert (circle.clauses, circle.region, circle.expr) == (
        (("a",), ("b",)),
        Circle(1, 2, 30),
        "a OR b",
    )


def test_subscription_built_in_code_is_written_as_expr_or_keywords():
    dnf = Subscription("s", (("a", "b"), ("c",)), Circle(0, 0, 10))
    proto = to_proto_subscription(dnf)
    assert proto.expr and not proto.keywords and proto.WhichOneof("region") == "circle"
    assert from_proto_subscription(proto).clauses == dnf.clauses
    single = to_proto_subscription(Subscription("t", (("x", "y"),), Rect(0, 0, 1, 1)))
    assert list(single.keywords) == ["x", "y"] and single.expr == ""


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"id": ""}, "subscription.id", ""),
        ({"rect": pb.Rect(min_lon=-181, max_lon=1, max_lat=1)}, "subscription.rect.min_lon", -181),
        ({"rect": pb.Rect(min_lat=2, max_lon=1, max_lat=1)}, "subscription.rect.max_lat", 1),
        ({"rect": pb.Rect(min_lon=5, max_lon=1, max_lat=1)}, "subscription.rect.max_lon", 1),
        ({"circle": pb.Circle(lat=91, radius_m=5)}, "subscription.circle.lat", 91),
        ({"circle": pb.Circle(radius_m=0)}, "subscription.circle.radius_m", 0),
        ({"rect": None}, "subscription.rect", None),
        ({"keywords": ["ok", "  "]}, "subscription.keywords[1]", "  "),
        ({"keywords": ["k"] * 17}, "subscription.keywords", ["k"] * 17),
        ({"keywords": [], "expr": "a b"}, None, None),  # valid: expr instead of keywords
        ({"expr": "a b"}, "subscription.keywords", ["ipad"]),  # both given
        ({"keywords": []}, "subscription.keywords", None),  # neither given
    ],
)
def test_invalid_subscription_names_the_field_and_value(change, field, value):
    args = {"id": "s1", "keywords": ["ipad"], "rect": pb.Rect(max_lon=1, max_lat=1)} | change
    args = {k: v for k, v in args.items() if v is not None}
    if field is None:
        assert from_proto_subscription(pb.Subscription(**args)).expr == "a b"
        return
    with pytest.raises(ValidationError) as e:
        from_proto_subscription(pb.Subscription(**args))
    assert (e.value.field, e.value.value) == (field, value)
    assert str(e.value).startswith(f"{field}=")


def test_expression_errors_keep_their_class_and_get_the_prefix():
    with pytest.raises(ExpressionError) as e:
        from_proto_subscription(pb.Subscription(id="s", expr="ipad AND", rect=pb.Rect()))
    assert e.value.field == "subscription.expr" and e.value.value == "ipad AND"
    with pytest.raises(ExpressionError) as e:
        from_proto_subscription(
            pb.Subscription(id="s", expr="NOT x", rect=pb.Rect()), field="request.sub"
        )
    assert e.value.field == "request.sub.expr"


# ---- messages -------------------------------------------------------------------------------
@given(message_dicts(), st.floats(0, 2e9))
def test_message_round_trips_domain_proto_domain(d, time):
    msg = message_from_dict(d)
    proto = to_proto_message(msg, time=time)
    assert proto.time == time
    assert from_proto_message(proto, default_id="unused") == msg


@given(any_messages())
def test_any_proto_message_round_trips_or_names_a_real_field(msg):
    try:
        domain = from_proto_message(msg, default_id="m0")
    except ValidationError as e:
        assert e.field.startswith("message.")
        assert field_exists(e.field, pb.PublishRequest), e.field
    else:
        expected = pb.Message()
        expected.CopyFrom(msg)
        expected.id = msg.id or "m0"
        if math.isnan(expected.ttl_s) or expected.ttl_s == 0:  # -0.0 too
            expected.ttl_s = 0.0
        assert to_proto_message(domain) == expected


def test_message_defaults_id_ttl_and_text():
    proto = pb.Message(keywords=["iPad"], point=pb.Point(lon=1, lat=2), ttl_s=0, time=99)
    msg = from_proto_message(proto, default_id="m-1")
    assert msg == Message("m-1", ("ipad",), Point(1, 2), None, ("iPad",), None)
    assert (
        from_proto_message(pb.Message(id="own", text="x", rect=pb.Rect()), default_id="d").id
        == "own"
    )
    stored = from_proto_message(
        pb.Message(id="m", text="Sale!", rect=pb.Rect(max_lon=1, max_lat=1), ttl_s=2.5),
        default_id="d",
    )
    assert (stored.terms, stored.location, stored.ttl, stored.text) == (
        ("sale",),
        Rect(0, 0, 1, 1),
        2.5,
        "Sale!",
    )


def test_message_built_in_code_with_terms_only():
    proto = to_proto_message(Message("m", ("a", "b"), Point(0, 0)))
    assert list(proto.keywords) == ["a", "b"] and proto.text == "" and proto.ttl_s == 0


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"keywords": [" "]}, "message.keywords[0]", " "),
        ({"keywords": ["a", "x" * 65]}, "message.keywords[1]", "x" * 65),
        ({"keywords": []}, "message.keywords", []),
        ({"point": pb.Point(lon=181)}, "message.point.lon", 181),
        ({"point": pb.Point(lat=-90.5)}, "message.point.lat", -90.5),
        ({"point": None, "rect": pb.Rect(min_lon=2, max_lon=1)}, "message.rect.max_lon", 1),
        ({"point": None}, "message.point", None),
        ({"ttl_s": -1}, "message.ttl_s", -1),
        ({"ttl_s": math.inf}, "message.ttl_s", math.inf),
        ({"ttl_s": 1e308}, "message.ttl_s", 1e308),
        ({"ttl_s": MAX_TTL_S + 1}, "message.ttl_s", MAX_TTL_S + 1),
        ({"text": "a" * 16385, "keywords": []}, "message.text", "a" * 16385),
        ({"id": "\n"}, "message.id", "\n"),
    ],
)
def test_invalid_message_names_the_field_and_value(change, field, value):
    args = {"id": "m1", "keywords": ["ipad"], "point": pb.Point()} | change
    args = {k: v for k, v in args.items() if v is not None}
    with pytest.raises(ValidationError) as e:
        from_proto_message(pb.Message(**args), default_id="unused")
    assert (e.value.field, e.value.value) == (field, value)


@pytest.mark.parametrize("location", ["point", "rect"])  # the fast path and the long way
def test_the_clusters_max_ttl_names_the_field_and_value(location):
    def message(ttl_s):
        m = pb.Message(id="m", keywords=["x"], ttl_s=ttl_s)
        getattr(m, location).CopyFrom(pb.Point() if location == "point" else pb.Rect())
        return m

    assert from_proto_message(message(60.0), default_id="d", max_ttl_s=60.0).ttl == 60.0
    with pytest.raises(ValidationError) as e:
        from_proto_message(message(60.5), default_id="d", field="messages[2]", max_ttl_s=60.0)
    assert (e.value.field, e.value.value) == ("messages[2].ttl_s", 60.5)
    assert "at most 60 seconds (the max_ttl_s setting)" in str(e.value)
    with pytest.raises(ValidationError) as e:  # past MAX_TTL_S: the core's rule names it
        from_proto_message(message(1e308), default_id="d", max_ttl_s=60.0)
    assert (e.value.field, e.value.value) == ("message.ttl_s", 1e308)


def test_nan_ttl_is_rejected():
    with pytest.raises(ValidationError) as e:
        from_proto_message(
            pb.Message(id="m", text="x", point=pb.Point(), ttl_s=math.nan), default_id="d"
        )
    assert e.value.field == "message.ttl_s" and "finite" in e.value.reason


# ---- points, location updates, deliveries ----------------------------------------------------
@given(lons, lats)
def test_point_round_trips(lon, lat):
    point = from_proto_point(pb.Point(lon=lon, lat=lat))
    assert point == Point(lon, lat)
    assert to_proto_point(point) == pb.Point(lon=lon, lat=lat)


def test_point_errors_name_the_field():
    with pytest.raises(ValidationError) as e:
        from_proto_point(pb.Point(lon=0, lat=95))
    assert (e.value.field, e.value.value) == ("point.lat", 95)
    with pytest.raises(ValidationError) as e:
        from_proto_point(pb.Point(lon=math.nan), field="centre")
    assert e.value.field == "centre.lon"


def test_location_update():
    request = pb.UpdateLocationRequest(id="s1", point=pb.Point(lon=13.4, lat=52.5))
    assert from_proto_location_update(request) == ("s1", Point(13.4, 52.5))
    with pytest.raises(ValidationError) as e:
        from_proto_location_update(pb.UpdateLocationRequest(id="s1"))
    assert (e.value.field, e.value.value) == ("point", None)
    with pytest.raises(ValidationError) as e:
        from_proto_location_update(pb.UpdateLocationRequest(point=pb.Point()))
    assert (e.value.field, e.value.value) == ("id", "")
    with pytest.raises(ValidationError) as e:
        from_proto_location_update(pb.UpdateLocationRequest(id="s", point=pb.Point(lon=-200)))
    assert e.value.field == "point.lon"
    assert field_exists("point.lon", pb.UpdateLocationRequest)


@given(ids, st.integers(1, 2**64 - 1), st.sampled_from(Sign), message_dicts(), st.floats(0, 2e9))
def test_delivery_round_trips_to_the_core_update(sid, sequence, sign, d, time):
    message = to_proto_message(message_from_dict(d), time=time - 1)
    delivery = to_proto_delivery(sid, sequence, sign, message, time=time)
    got = from_proto_delivery(delivery)
    assert got == (sid, sign, d["id"]) and got[1] is sign
    assert (delivery.sequence, delivery.time, delivery.message) == (sequence, time, message)
    assert delivery.kind == (pb.Delivery.ADD if sign is ADD else pb.Delivery.REMOVE)
    assert pb.Delivery.FromString(delivery.SerializeToString()) == delivery


def test_the_core_sign_is_the_proto_kind():
    # one sign type end to end: the shards' updates, the rounds, the retention log and the
    # Delivery all carry the same values
    assert [(s.name, s.value) for s in Sign] == [
        (n, pb.Delivery.Kind.Value(n)) for n in ("ADD", "REMOVE")
    ]
    assert [str(s) for s in Sign] == ["+", "-"]


def test_delivery_rejects_an_unknown_sign():
    with pytest.raises(ValueError):
        to_proto_delivery("s", 1, "*", pb.Message(id="m"), time=0.0)
    with pytest.raises(ValueError):  # a gap is no update of the core's
        from_proto_delivery(pb.Delivery(subscription_id="s", kind=pb.Delivery.GAP))


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("rect[0]", "rect.min_lon"),
        ("circle[2]", "circle.radius_m"),
        ("point[1]", "point.lat"),
        ("keywords[3]", "keywords[3]"),
        ("ttl", "ttl_s"),
        ("expr", "expr"),
    ],
)
def test_proto_field(field, path):
    assert proto_field(field) == path


def _message_cases():
    """Point messages around every check of the fast path, valid and not."""
    rng = random.Random(5)
    ids = ["m1", "", "x" * 128, "x" * 129, "tab\there", "é"]
    keyword_sets = [[], ["iPad"], ["ＩＰＡＤ", "Straße"], [" "], ["a" * 65], ["A", "a"], ["x"] * 3]
    texts = ["", "iPad sale, today!", "x" * 16385, "   "]
    coords = [0.0, -0.0, 180.0, -180.0, 180.0001, 90.0, -90.0, 90.5, math.nan, math.inf]
    ttls = [0.0, 5.0, -1.0, math.nan, math.inf, 1e-9, 6.0, MAX_TTL_S, MAX_TTL_S + 1, 1e308]
    for _ in range(1500):  # valid ones, some with text and non-ASCII keywords
        m = pb.Message(
            id=f"m{rng.randrange(10**6)}",
            keywords=rng.choice(keyword_sets[1:3] + keyword_sets[5:]),
            text=rng.choice(texts[:2]),
            ttl_s=rng.choice([0.0, 5.0, 1e-9]),
        )
        m.point.CopyFrom(pb.Point(lon=rng.uniform(-180, 180), lat=rng.uniform(-90, 90)))
        yield m
    for _ in range(3000):
        m = pb.Message(
            id=rng.choice(ids),
            keywords=rng.choice(keyword_sets),
            text=rng.choice(texts),
            ttl_s=rng.choice(ttls),
        )
        if rng.random() < 0.9:
            m.point.CopyFrom(
                pb.Point(lon=rng.choice(coords), lat=rng.choice(coords[:4] + coords[5:]))
            )
        else:
            m.rect.CopyFrom(pb.Rect(min_lon=0, min_lat=0, max_lon=rng.choice(coords), max_lat=1))
        yield m


def _outcome(f, *args, **kwargs):
    """("ok", the result) or ("error", (the field named, the message))."""
    try:
        return "ok", f(*args, **kwargs)
    except ValidationError as e:
        return "error", (e.field, str(e))


def test_message_fast_path_equals_the_workload_form_validation():
    seen = {"ok": 0, "error": 0}
    for m in _message_cases():
        for max_ttl_s in (MAX_TTL_S, 5.0):
            fast = _outcome(
                from_proto_message, m, default_id="d", field="messages[3]", max_ttl_s=max_ttl_s
            )
            slow = _outcome(_message_via_dict, m, m.id or "d", "messages[3]", max_ttl_s)
            assert fast == slow, (m, max_ttl_s)
            seen[fast[0]] += 1
    assert seen["ok"] > 3000 and seen["error"] > 4000, seen


def _subscription_cases():
    """Subscriptions around every check of the fast path (ASCII keywords in a rect), valid and
    not, and ones it leaves to the general path."""
    rng = random.Random(6)
    ids = ["s1", "", "x" * 128, "x" * 129, "tab\there", "é"]
    keyword_sets = [
        [], ["iPad"], ["iPad", "Sale", "ipad"], ["ＩＰＡＤ", "Straße"], [" "], [" a "], ["a" * 64],
        ["a" * 65], ["x"] * 17, [f"k{i}" for i in range(16)], ["a\x1fb"], ["tab\tx"],
    ]  # fmt: skip
    coords = [0.0, -0.0, 180.0, -180.0, 180.0001, 90.0, -90.0, 90.5, math.nan, math.inf, 1.0]
    for i in range(6000):
        valid = i < 1500
        sub = pb.Subscription(
            id=f"s{i}" if valid else rng.choice(ids),
            keywords=rng.choice(keyword_sets[1:3] if valid else keyword_sets),
            moving=rng.random() < 0.3,
        )
        if not valid and rng.random() < 0.1:
            sub.expr = "a OR b"
        if rng.random() < 0.9:
            if valid:
                x, y = rng.uniform(-180, 179), rng.uniform(-90, 89)
                box = (x, y, x + rng.uniform(0, 1), y + rng.uniform(0, 1))
            else:
                box = tuple(rng.choice(coords) for _ in range(4))
            sub.rect.CopyFrom(
                pb.Rect(min_lon=box[0], min_lat=box[1], max_lon=box[2], max_lat=box[3])
            )
        else:
            sub.circle.CopyFrom(pb.Circle(lon=1, lat=2, radius_m=rng.choice([5.0, -1.0])))
        if not valid and rng.random() < 0.1:
            setattr(sub, rng.choice(["threshold", "alpha"]), 0.5)
        yield sub


def test_subscription_fast_path_equals_the_workload_form_validation():
    seen = {"ok": 0, "error": 0, "fast": 0}
    for sub in _subscription_cases():
        fast = _outcome(from_proto_subscription, sub, field="subscriptions[3]")
        slow = _outcome(_subscription_via_dict, sub, "subscriptions[3]")
        assert fast == slow, sub
        seen[fast[0]] += 1
        seen["fast"] += _keywords_in_rect(sub) is not None
    assert seen["ok"] > 1400 and seen["error"] > 4000 and seen["fast"] > 1200, seen


def test_location_requests_single_or_batched_name_the_bad_move():
    one = pb.UpdateLocationRequest(id="s", point=pb.Point(lon=1, lat=2))
    assert from_proto_location_request(one, 5) == ([("s", Point(1.0, 2.0))], [""])
    moves = [pb.LocationUpdate(id=f"s{i}", point=pb.Point(lon=i, lat=0)) for i in range(3)]
    got, fields = from_proto_location_request(pb.UpdateLocationRequest(moves=moves), 5)
    assert got == [(f"s{i}", Point(float(i), 0.0)) for i in range(3)]
    assert fields == ["moves[0].", "moves[1].", "moves[2]."]
    cases = [
        (
            pb.UpdateLocationRequest(moves=moves + [pb.LocationUpdate(id="", point=pb.Point())]),
            "moves[3].id",
        ),
        (pb.UpdateLocationRequest(moves=moves + [pb.LocationUpdate(id="x")]), "moves[3].point"),
        (
            pb.UpdateLocationRequest(moves=[pb.LocationUpdate(id="x", point=pb.Point(lon=200))]),
            "moves[0].point.lon",
        ),
        (pb.UpdateLocationRequest(id="s", moves=moves), "moves"),
        (pb.UpdateLocationRequest(moves=moves * 2), "moves"),
        (pb.UpdateLocationRequest(id="s"), "point"),
    ]
    for req, field in cases:
        with pytest.raises(ValidationError) as info:
            from_proto_location_request(req, 5)
        assert info.value.field == field, (req, info.value)
