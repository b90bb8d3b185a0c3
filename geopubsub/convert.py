"""The one module converting between ``geopubsub.v1`` protobuf messages and domain objects.

Protobuf → domain goes through the workload dict form and ``shard.model``'s validators, so every
input rule lives in one place; their ``ValidationError`` fields (``rect[0]``, ``ttl``) are renamed to
paths into the request (``subscription.rect.min_lon``, ``message.ttl_s``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from geopubsub.v1 import geopubsub_pb2 as pb
from shard.errors import ValidationError
from shard.limits import MAX_ID_LEN, MAX_KEYWORDS, MAX_SUBSCRIBE_BATCH, MAX_TEXT_LEN, MAX_TTL_S
from shard.model import (
    Circle,
    Message,
    Point,
    Rect,
    Sign,
    Subscription,
    message_from_dict,
    message_to_dict,
    subscription_from_dict,
    subscription_to_dict,
    validate_id,
    validate_keywords,
    validate_point,
)
from shard.terms import ascii_keyword_terms, message_terms

_COORDINATES = {
    "rect": ("min_lon", "min_lat", "max_lon", "max_lat"),
    "circle": ("lon", "lat", "radius_m"),
    "point": ("lon", "lat"),
}
"""The proto field of each position of a region list in the dict form."""
_RENAMED = {"ttl": "ttl_s"}
_INDEXED = re.compile(r"(\w+)\[(\d+)\]")
_POLYGON = re.compile(r"polygon(?:\[(\d+)\])?(?:\[(\d+)\])?(?:\[(\d+)\])?")
_LIST_VALUE = re.compile(r"(predicates\[\d+\])\.value\[(\d+)\]")


def proto_field(field: str) -> str:
    """The proto path of a dict-form field name.

    >>> proto_field("rect[2]"), proto_field("keywords[0]"), proto_field("ttl")
    ('rect.max_lon', 'keywords[0]', 'ttl_s')
    >>> proto_field("polygon[1][3][0]"), proto_field("predicates[2].value[1]")
    ('polygon.rings[1].points[3].lon', 'predicates[2].values[1]')
    """
    m = _INDEXED.fullmatch(field)
    if m and m[1] in _COORDINATES:
        return f"{m[1]}.{_COORDINATES[m[1]][int(m[2])]}"
    m = _POLYGON.fullmatch(field)
    if m:
        ring, point, axis = m.groups()
        out = "polygon" if ring is None else f"polygon.rings[{ring}]"
        if point is not None:
            out += f".points[{point}]"
        if axis is not None:
            out += "." + ("lon", "lat")[int(axis)] if axis in "01" else f"[{axis}]"
        return out
    m = _LIST_VALUE.fullmatch(field)
    if m:
        return f"{m[1]}.values[{m[2]}]"
    return _RENAMED.get(field, field)


def _value(v: pb.AttributeValue) -> Any:
    """An AttributeValue as the dict form has it: a number, a string, or None when unset."""
    kind = v.WhichOneof("kind")
    return v.number if kind == "number" else v.text if kind == "text" else None


def _to_value(x: Any) -> pb.AttributeValue:
    return pb.AttributeValue(text=x) if isinstance(x, str) else pb.AttributeValue(number=x)


def _predicates_list(preds: Sequence[pb.Predicate]) -> list[dict[str, Any]]:
    out = []
    for p in preds:
        d: dict[str, Any] = {"attr": p.attr, "op": p.op}
        if p.values:
            d["value"] = [_value(v) for v in p.values]
        elif p.HasField("value"):
            d["value"] = _value(p.value)
        if p.weight != 0.0:  # (NaN included: validation names it)
            d["weight"] = p.weight
        out.append(d)
    return out


def _to_proto_predicate(d: dict[str, Any]) -> pb.Predicate:
    out = pb.Predicate(attr=d["attr"], op=d["op"], weight=d.get("weight", 0.0))
    v = d["value"]
    if isinstance(v, list):
        out.values.extend(_to_value(x) for x in v)
    else:
        out.value.CopyFrom(_to_value(v))
    return out


def _under(prefix: str, e: ValidationError) -> ValidationError:
    """The same error (same class) with its field as ``prefix.<proto path>``."""
    return type(e)(f"{prefix}.{proto_field(e.field)}", e.value, e.reason)


# ---- points and regions ---------------------------------------------------------------------
def from_proto_point(point: pb.Point, *, field: str = "point") -> Point:
    """Validate a Point; errors name ``{field}.lon`` / ``{field}.lat``.

    >>> from_proto_point(pb.Point(lon=13.4, lat=52.5))
    Point(lon=13.4, lat=52.5)
    """
    try:
        return validate_point("point", point.lon, point.lat)
    except ValidationError as e:
        raise type(e)(field + proto_field(e.field).removeprefix("point"), e.value, e.reason) from e


def to_proto_point(point: Point) -> pb.Point:
    return pb.Point(lon=point.lon, lat=point.lat)


def _to_proto_rect(rect: Rect) -> pb.Rect:
    return pb.Rect(
        min_lon=rect.min_lon, min_lat=rect.min_lat, max_lon=rect.max_lon, max_lat=rect.max_lat
    )


def _rect_list(rect: pb.Rect) -> list[float]:
    return [rect.min_lon, rect.min_lat, rect.max_lon, rect.max_lat]


# ---- subscriptions --------------------------------------------------------------------------
def from_proto_subscription(sub: pb.Subscription, *, field: str = "subscription") -> Subscription:
    """Validate a Subscription (rules: docs/LIMITS.md). An empty ``expr`` and empty ``keywords``
    count as absent. Raises ValidationError naming ``{field}.<path>``. O(size of the subscription).

    >>> s = from_proto_subscription(
    ...     pb.Subscription(id="s1", expr="ipad AND (sale OR discount)", circle=pb.Circle(radius_m=9))
    ... )
    >>> s.clauses, s.region
    ((('discount', 'ipad'), ('ipad', 'sale')), Circle(lon=0.0, lat=0.0, radius_m=9.0))
    """
    plain = _keywords_in_rect(sub)
    if plain is not None:
        return plain
    return _subscription_via_dict(sub, field)


def _subscription_via_dict(sub: pb.Subscription, field: str) -> Subscription:
    """``from_proto_subscription`` by the general path: the proto's workload form, validated
    (``subscription_from_dict``)."""
    d: dict[str, Any] = {"id": sub.id, "moving": sub.moving}
    if sub.keywords:
        d["keywords"] = list(sub.keywords)
    if sub.expr:
        d["expr"] = sub.expr
    region = sub.WhichOneof("region")
    if region == "rect":
        d["rect"] = _rect_list(sub.rect)
    elif region == "circle":
        d["circle"] = [sub.circle.lon, sub.circle.lat, sub.circle.radius_m]
    elif region == "polygon":
        d["polygon"] = [[[p.lon, p.lat] for p in r.points] for r in sub.polygon.rings]
    elif region == "point":  # a top-k subscription
        d["point"] = [sub.point.lon, sub.point.lat]
    if sub.predicates:
        d["predicates"] = _predicates_list(sub.predicates)
    if region == "point" and sub.threshold == 0.0:
        if sub.HasField("alpha"):
            d["alpha"] = sub.alpha
        if sub.weights:
            d["weights"] = dict(sub.weights)
    elif sub.threshold != 0.0:  # NaN included, so that validation rejects it
        d["threshold"] = sub.threshold
        if sub.HasField("alpha"):
            d["alpha"] = sub.alpha
        if sub.weights:
            d["weights"] = dict(sub.weights)
    elif sub.HasField("alpha") or sub.weights:
        d["alpha" if sub.HasField("alpha") else "weights"] = (
            sub.alpha if sub.HasField("alpha") else dict(sub.weights)
        )
    try:
        return subscription_from_dict(d)
    except ValidationError as e:
        raise _under(field, e) from e


def _keywords_in_rect(sub: pb.Subscription) -> Subscription | None:
    """The common subscription, keywords in a rectangle and nothing else, when it is valid:
    what ``subscription_from_dict`` makes of it, without the dict (a third of the coordinator's
    CPU in batched Subscribes went to the general path; docs/BENCHMARKS.md). None for anything
    else, invalid input included, which the general path then checks and names."""
    if (
        sub.WhichOneof("region") != "rect"
        or sub.expr
        or not sub.keywords
        or sub.predicates
        or sub.threshold != 0.0
        or sub.weights
        or sub.HasField("alpha")
    ):
        return None
    r = sub.rect
    x0, y0, x1, y1 = r.min_lon, r.min_lat, r.max_lon, r.max_lat
    if not (-180.0 <= x0 <= x1 <= 180.0 and -90.0 <= y0 <= y1 <= 90.0):  # (NaN: False)
        return None
    sid = sub.id
    if not (1 <= len(sid) <= MAX_ID_LEN and sid.isprintable()):
        return None
    keywords = tuple(sub.keywords)
    if len(keywords) > MAX_KEYWORDS:
        return None
    terms = ascii_keyword_terms(keywords)
    if terms is None:  # other scripts: normalized one by one
        try:
            _, terms = validate_keywords("keywords", keywords)
        except ValidationError:
            return None
    return Subscription(sid, (terms,), Rect(x0, y0, x1, y1), sub.moving, keywords)


def from_proto_subscribe_request(
    request: pb.SubscribeRequest,
) -> tuple[list[Subscription], list[bool], bool]:
    """The subscriptions of a SubscribeRequest (its ``subscription`` or its ``subscriptions``,
    checked as a whole: each id once), their ``ephemeral`` flags, and whether it was a batch.

    >>> one = pb.Subscription(id="a", keywords=["x"], rect=pb.Rect(max_lon=1.0, max_lat=1.0))
    >>> from_proto_subscribe_request(pb.SubscribeRequest(subscriptions=[one, one]))
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: subscriptions[1].id='a': given twice in the batch
    """
    if not request.subscriptions:
        if not request.HasField("subscription"):
            raise ValidationError("subscription", None, "required")
        one = request.subscription
        return [from_proto_subscription(one)], [one.ephemeral], False
    if request.HasField("subscription"):
        raise ValidationError("subscription", "set", "give subscription or subscriptions, not both")
    n = len(request.subscriptions)
    if n > MAX_SUBSCRIBE_BATCH:
        raise ValidationError("subscriptions", n, f"at most {MAX_SUBSCRIBE_BATCH} per request")
    subs = [
        from_proto_subscription(p, field=f"subscriptions[{i}]")
        for i, p in enumerate(request.subscriptions)
    ]
    _check_distinct("subscriptions[{}].id", [s.id for s in subs])
    return subs, [p.ephemeral for p in request.subscriptions], True


def from_proto_unsubscribe_request(request: pb.UnsubscribeRequest) -> tuple[list[str], bool]:
    """The ids of an UnsubscribeRequest (``id``, or ``ids``: at most ``MAX_SUBSCRIBE_BATCH``,
    each once) and whether it was a batch.

    >>> from_proto_unsubscribe_request(pb.UnsubscribeRequest(ids=["a", "b"]))
    (['a', 'b'], True)
    """
    if not request.ids:
        return [validate_id("id", request.id)], False
    if request.id:
        raise ValidationError("id", request.id, "give id or ids, not both")
    if len(request.ids) > MAX_SUBSCRIBE_BATCH:
        raise ValidationError("ids", len(request.ids), f"at most {MAX_SUBSCRIBE_BATCH} per request")
    ids = [validate_id(f"ids[{i}]", x) for i, x in enumerate(request.ids)]
    _check_distinct("ids[{}]", ids)
    return ids, True


def _check_distinct(field: str, ids: Sequence[str]) -> None:
    seen: set[str] = set()
    for i, x in enumerate(ids):
        if x in seen:
            raise ValidationError(field.format(i), x, "given twice in the batch")
        seen.add(x)


def to_proto_subscription(sub: Subscription) -> pb.Subscription:
    """The Subscription as registered (its ``keywords`` or ``expr`` as given)."""
    d = subscription_to_dict(sub)
    out = pb.Subscription(
        id=sub.id, keywords=d.get("keywords", ()), expr=d.get("expr", ""), moving=sub.moving
    )
    if isinstance(sub.region, Rect):
        out.rect.CopyFrom(_to_proto_rect(sub.region))
    elif isinstance(sub.region, Circle):
        c: Circle = sub.region
        out.circle.CopyFrom(pb.Circle(lon=c.lon, lat=c.lat, radius_m=c.radius_m))
    elif isinstance(sub.region, Point):  # a top-k subscription
        out.point.CopyFrom(to_proto_point(sub.region))
        out.alpha = sub.alpha
    else:  # a polygon, where it is now
        for ring in d["polygon"]:
            out.polygon.rings.add().points.extend(pb.Point(lon=x, lat=y) for x, y in ring)
    for p in d.get("predicates", ()):
        out.predicates.append(_to_proto_predicate(p))
    if sub.threshold is not None:
        out.threshold = sub.threshold
        out.alpha = sub.alpha
        for t, w in d.get("weights", {}).items():
            out.weights[t] = w
    return out


# ---- messages -------------------------------------------------------------------------------
def from_proto_message(
    msg: pb.Message,
    *,
    default_id: str,
    field: str = "message",
    max_ttl_s: float = MAX_TTL_S,
    need_terms: bool = True,
) -> Message:
    """Validate a Message; an empty ``id`` becomes ``default_id``, an empty ``text`` None,
    ``ttl_s`` 0 one-shot (ttl None), at most ``max_ttl_s`` (the cluster's ``max_ttl_s``, itself
    at most ``MAX_TTL_S``). ``time`` is ignored. ``need_terms`` False: it may have no terms (a
    top-k publish's). Raises ValidationError naming ``{field}.<path>``. O(size of the
    message).

    >>> m = from_proto_message(
    ...     pb.Message(text="iPad sale", point=pb.Point(lon=1, lat=2)), default_id="m7"
    ... )
    >>> m.id, m.terms, m.location, m.ttl
    ('m7', ('ipad', 'sale'), Point(lon=1.0, lat=2.0), None)
    """
    mid = msg.id or default_id
    if (
        msg.WhichOneof("location") == "point"
        and 0 < len(mid) <= MAX_ID_LEN
        and mid.isprintable()
        and not msg.attributes
    ):
        # the common case, checked here without the workload form; anything it does not
        # accept goes the long way, which names what is wrong
        lon, lat, ttl = msg.point.lon, msg.point.lat, msg.ttl_s
        if -180.0 <= lon <= 180.0 and -90.0 <= lat <= 90.0 and 0.0 <= ttl <= max_ttl_s:
            kws = tuple(msg.keywords)
            text = msg.text or None
            if text is None or len(text) <= MAX_TEXT_LEN:
                try:
                    terms = message_terms(kws, text)
                except ValidationError as e:
                    raise _under(field, e) from e
                if terms:
                    return Message(mid, terms, Point(lon, lat), ttl or None, kws, text)
    return _message_via_dict(msg, mid, field, max_ttl_s, need_terms)


def _message_via_dict(
    msg: pb.Message, mid: str, field: str, max_ttl_s: float = MAX_TTL_S, need_terms: bool = True
) -> Message:
    """``from_proto_message`` through the workload form's validation (every case)."""
    d: dict[str, Any] = {"id": mid, "keywords": list(msg.keywords)}
    if msg.text:
        d["text"] = msg.text
    location = msg.WhichOneof("location")
    if location == "point":
        d["point"] = [msg.point.lon, msg.point.lat]
    elif location == "rect":
        d["rect"] = _rect_list(msg.rect)
    if msg.ttl_s != 0.0:  # NaN included, so that validation rejects it
        d["ttl"] = msg.ttl_s
    if msg.attributes:
        d["attributes"] = {k: _value(v) for k, v in msg.attributes.items()}
    try:
        out = message_from_dict(d, need_terms=need_terms)
    except ValidationError as e:
        raise _under(field, e) from e
    if out.ttl is not None and out.ttl > max_ttl_s:
        raise ValidationError(
            f"{field}.ttl_s",
            msg.ttl_s,
            f"must be at most {max_ttl_s:g} seconds (the max_ttl_s setting)",
        )
    return out


def to_proto_message(msg: Message, *, time: float = 0.0) -> pb.Message:
    """The Message as published; ``time`` is its publish time (Unix seconds)."""
    out = pb.Message(
        id=msg.id,
        keywords=message_to_dict(msg)["keywords"],
        text=msg.text or "",
        ttl_s=msg.ttl or 0.0,
        time=time,
    )
    if isinstance(msg.location, Point):
        out.point.CopyFrom(to_proto_point(msg.location))
    else:
        out.rect.CopyFrom(_to_proto_rect(msg.location))
    for k, v in msg.attributes:
        out.attributes[k].CopyFrom(_to_value(v))
    return out


# ---- location updates and deliveries ---------------------------------------------------------
def from_proto_location_update(
    request: pb.UpdateLocationRequest | pb.LocationUpdate, *, field: str = ""
) -> tuple[str, Point]:
    """(subscription id, new centre) of an UpdateLocationRequest or one of its ``moves``; the
    point is required (an unset point would read as (0, 0)). Errors name ``{field}id`` /
    ``{field}point...``.

    >>> from_proto_location_update(pb.UpdateLocationRequest(id="s1", point=pb.Point(lon=1, lat=2)))
    ('s1', Point(lon=1.0, lat=2.0))
    """
    sid = validate_id(f"{field}id", request.id)
    if not request.HasField("point"):
        raise ValidationError(f"{field}point", None, "required")
    return sid, from_proto_point(request.point, field=f"{field}point")


def from_proto_location_request(
    request: pb.UpdateLocationRequest, max_moves: int
) -> tuple[list[tuple[str, Point]], list[str]]:
    """The moves of an UpdateLocationRequest, its ``id``/``point`` or its ``moves`` (at most
    ``max_moves``), each checked, with the field that names each in errors.

    >>> req = pb.UpdateLocationRequest(moves=[pb.LocationUpdate(id="a", point=pb.Point(lon=1))])
    >>> from_proto_location_request(req, 10)
    ([('a', Point(lon=1.0, lat=0.0))], ['moves[0].'])
    """
    if not request.moves:
        return [from_proto_location_update(request)], [""]
    if request.id or request.HasField("point"):
        raise ValidationError("moves", len(request.moves), "give id and point, or moves, not both")
    if len(request.moves) > max_moves:
        raise ValidationError("moves", len(request.moves), f"at most {max_moves} per request")
    fields = [f"moves[{i}]." for i in range(len(request.moves))]
    moves = [
        from_proto_location_update(m, field=f) for m, f in zip(request.moves, fields, strict=True)
    ]
    return moves, fields


def to_proto_delivery(
    subscription_id: str, sequence: int, sign: Sign, message: pb.Message, *, time: float
) -> pb.Delivery:
    """A Delivery of the core's update ``(subscription_id, sign, message id)`` (``sign`` goes
    as it is: ``Sign`` has ``pb.Delivery.Kind``'s values). ``message`` is already converted (``to_proto_message``) so that a message
    delivered to many subscriptions is converted once; it is copied into the Delivery.
    """
    return pb.Delivery(
        subscription_id=subscription_id,
        sequence=sequence,
        kind=sign,
        message=message,
        time=time,
    )


def from_proto_delivery(delivery: pb.Delivery) -> tuple[str, Sign, str]:
    """The core's update triple ``(subscription id, sign, message id)`` of an ADD or REMOVE.

    >>> from_proto_delivery(
    ...     pb.Delivery(subscription_id="s", kind=pb.Delivery.REMOVE, message=pb.Message(id="m"))
    ... )
    ('s', REMOVE, 'm')
    """
    return delivery.subscription_id, Sign(delivery.kind), delivery.message.id
