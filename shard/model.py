"""Domain objects (subscriptions, messages, regions) and the validation every input path uses.

``subscription_from_dict`` / ``message_from_dict`` read the JSON workload form; the gRPC converter
and the Spark loader call the same functions, so a rule lives in exactly one place.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shard.errors import ValidationError
from shard.expr import format_dnf, parse_expr
from shard.limits import MAX_ID_LEN, MAX_KEYWORDS, MAX_RADIUS_M, MAX_TEXT_LEN, MAX_TTL_S
from shard.terms import check_term, message_terms, normalize_term


class Sign(enum.IntEnum):
    """The sign of a change of a subscription's result set, one type end to end: the shards'
    updates, the coordinator's rounds and retention log, ``pb.Delivery.Kind`` (same values) and
    the client's deliveries. Printed as ``+`` / ``-``.

    >>> str(Sign.ADD), str(Sign.REMOVE), int(Sign.REMOVE), Sign(0) is ADD, [("s", Sign(1), "m")]
    ('+', '-', 1, True, [('s', REMOVE, 'm')])
    """

    ADD = 0
    """The message matches the subscription (published into it, or entered by a move)."""
    REMOVE = 1
    """A message that matched no longer does (it expired, or a move left it)."""

    def __str__(self) -> str:
        return "+" if self is Sign.ADD else "-"

    def __repr__(self) -> str:  # an update reads ('s', ADD, 'm')
        return self.name


ADD, REMOVE = Sign.ADD, Sign.REMOVE

Update = tuple[str, Sign, str]
"""One change of a subscription's result set: (subscription id, sign, message id)."""


@dataclass(frozen=True, slots=True)
class Point:
    lon: float
    lat: float

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (Point, (self.lon, self.lat))


@dataclass(frozen=True, slots=True)
class Rect:
    """Closed rectangle in degrees; min <= max on both axes (no antimeridian crossing)."""

    min_lon: float
    min_lat: float
    max_lon: float
    max_lat: float

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (Rect, (self.min_lon, self.min_lat, self.max_lon, self.max_lat))


@dataclass(frozen=True, slots=True)
class Circle:
    """Points within ``radius_m`` metres (haversine) of (lon, lat)."""

    lon: float
    lat: float
    radius_m: float

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (Circle, (self.lon, self.lat, self.radius_m))


@dataclass(frozen=True, slots=True)
class Subscription:
    """``clauses`` is the normalized DNF (one clause for a ``keywords`` condition); ``keywords`` /
    ``expr`` keep the condition as given, for round trips."""

    id: str
    clauses: tuple[tuple[str, ...], ...]
    region: Rect | Circle
    moving: bool = False
    keywords: tuple[str, ...] | None = None
    expr: str | None = None

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (
            Subscription,
            (self.id, self.clauses, self.region, self.moving, self.keywords, self.expr),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """``terms``: normalized keywords plus text tokens, sorted. ``ttl`` None: one-shot."""

    id: str
    terms: tuple[str, ...]
    location: Point | Rect
    ttl: float | None = None
    keywords: tuple[str, ...] = ()
    text: str | None = None

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (Message, (self.id, self.terms, self.location, self.ttl, self.keywords, self.text))


# ---- field validators -----------------------------------------------------------------------
def validate_id(field: str, value: Any, *, allow_empty: bool = False) -> str:
    """1-128 printable characters (or "" when ``allow_empty``)."""
    if not isinstance(value, str):
        raise ValidationError(field, value, "must be a string")
    if value == "" and allow_empty:
        return value
    if not 1 <= len(value) <= MAX_ID_LEN:
        raise ValidationError(field, value, f"must be 1-{MAX_ID_LEN} characters")
    if not value.isprintable():
        raise ValidationError(field, value, "must contain printable characters only")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number")
    x = float(value)
    if not math.isfinite(x):
        raise ValidationError(field, value, "must be finite")
    return x


def _lon(field: str, value: Any) -> float:
    x = _number(field, value)
    if not -180.0 <= x <= 180.0:
        raise ValidationError(field, value, "longitude must be in [-180, 180]")
    return x


def _lat(field: str, value: Any) -> float:
    x = _number(field, value)
    if not -90.0 <= x <= 90.0:
        raise ValidationError(field, value, "latitude must be in [-90, 90]")
    return x


def _seq(field: str, value: Any, n: int) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != n:
        raise ValidationError(field, value, f"must be a list of {n} numbers")
    return value


def validate_point(field: str, lon: Any, lat: Any) -> Point:
    return Point(_lon(f"{field}[0]", lon), _lat(f"{field}[1]", lat))


def validate_rect(field: str, value: Any) -> Rect:
    """[min_lon, min_lat, max_lon, max_lat], min <= max; antimeridian-crossing rects are rejected."""
    v = _seq(field, value, 4)
    x0, y0 = _lon(f"{field}[0]", v[0]), _lat(f"{field}[1]", v[1])
    x1, y1 = _lon(f"{field}[2]", v[2]), _lat(f"{field}[3]", v[3])
    if x0 > x1:
        raise ValidationError(
            f"{field}[2]",
            v[2],
            f"max_lon < min_lon {v[0]}: rectangles crossing the antimeridian are not supported; "
            "split it into two subscriptions",
        )
    if y0 > y1:
        raise ValidationError(f"{field}[3]", v[3], f"max_lat < min_lat {v[1]}")
    return Rect(x0, y0, x1, y1)


def validate_circle(field: str, value: Any) -> Circle:
    """[lon, lat, radius_m] with 0 < radius_m <= 20,000 km."""
    v = _seq(field, value, 3)
    r = _number(f"{field}[2]", v[2])
    if not 0.0 < r <= MAX_RADIUS_M:
        raise ValidationError(
            f"{field}[2]", v[2], f"radius must be in (0, {MAX_RADIUS_M:.0f}] metres"
        )
    return Circle(_lon(f"{field}[0]", v[0]), _lat(f"{field}[1]", v[1]), r)


def validate_keywords(field: str, value: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(as given, normalized sorted unique) for a list of 1-16 keywords."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValidationError(field, value, "must be a list of strings")
    if not 1 <= len(value) <= MAX_KEYWORDS:
        raise ValidationError(field, value, f"must hold 1-{MAX_KEYWORDS} keywords")
    norm = set()
    for i, kw in enumerate(value):
        if not isinstance(kw, str):
            raise ValidationError(f"{field}[{i}]", kw, "must be a string")
        t = normalize_term(kw)
        if not t:
            raise ValidationError(f"{field}[{i}]", kw, "empty after normalization")
        norm.add(check_term(f"{field}[{i}]", t))
    return tuple(value), tuple(sorted(norm))


def _unknown(d: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for k in d:
        if k not in allowed:
            raise ValidationError(str(k), d[k], "unknown field")


_SUB_FIELDS = frozenset({"id", "keywords", "expr", "rect", "circle", "moving"})
_MSG_FIELDS = frozenset({"id", "keywords", "text", "point", "rect", "ttl"})


def subscription_from_dict(d: Mapping[str, Any]) -> Subscription:
    """Validate the workload form of a subscription.

    >>> subscription_from_dict({"id": "s1", "keywords": ["iPad"], "rect": [0, 0, 1, 1]}).clauses
    (('ipad',),)
    """
    if not isinstance(d, Mapping):
        raise ValidationError("subscription", d, "must be an object")
    _unknown(d, _SUB_FIELDS)
    sid = validate_id("id", d.get("id"))
    has_kw, has_expr = "keywords" in d, "expr" in d
    if has_kw == has_expr:
        raise ValidationError(
            "keywords", d.get("keywords"), "give exactly one of 'keywords' and 'expr'"
        )
    keywords: tuple[str, ...] | None = None
    expr: str | None = None
    if has_kw:
        keywords, norm = validate_keywords("keywords", d["keywords"])
        clauses: tuple[tuple[str, ...], ...] = (norm,)
    else:
        expr = d["expr"]
        clauses = parse_expr(expr)
    has_rect, has_circle = "rect" in d, "circle" in d
    if has_rect == has_circle:
        raise ValidationError("rect", d.get("rect"), "give exactly one of 'rect' and 'circle'")
    region: Rect | Circle = (
        validate_rect("rect", d["rect"]) if has_rect else validate_circle("circle", d["circle"])
    )
    moving = d.get("moving", False)
    if not isinstance(moving, bool):
        raise ValidationError("moving", moving, "must be true or false")
    return Subscription(sid, clauses, region, moving, keywords, expr)


def message_from_dict(d: Mapping[str, Any], *, allow_empty_id: bool = False) -> Message:
    """Validate the workload form of a message.

    >>> message_from_dict({"id": "m1", "text": "iPad sale", "point": [0.5, 0.5]}).terms
    ('ipad', 'sale')
    """
    if not isinstance(d, Mapping):
        raise ValidationError("message", d, "must be an object")
    _unknown(d, _MSG_FIELDS)
    mid = validate_id("id", d.get("id"), allow_empty=allow_empty_id)
    kws = d.get("keywords", [])
    if isinstance(kws, str) or not isinstance(kws, Sequence):
        raise ValidationError("keywords", kws, "must be a list of strings")
    text = d.get("text")
    if text is not None:
        if not isinstance(text, str):
            raise ValidationError("text", text, "must be a string")
        if len(text) > MAX_TEXT_LEN:
            raise ValidationError("text", text, f"longer than {MAX_TEXT_LEN} characters")
    terms = message_terms(kws, text)
    if not terms:
        raise ValidationError(
            "keywords", kws, "a message needs at least one term (keywords or text)"
        )
    has_point, has_rect = "point" in d, "rect" in d
    if has_point == has_rect:
        raise ValidationError("point", d.get("point"), "give exactly one of 'point' and 'rect'")
    if has_point:
        p = _seq("point", d["point"], 2)
        location: Point | Rect = validate_point("point", p[0], p[1])
    else:
        location = validate_rect("rect", d["rect"])
    ttl = d.get("ttl")
    if ttl is not None:
        ttl = _number("ttl", ttl)
        if ttl < 0:
            raise ValidationError("ttl", d["ttl"], "must be >= 0 seconds")
        if ttl > MAX_TTL_S:
            raise ValidationError(
                "ttl",
                d["ttl"],
                f"must be at most {MAX_TTL_S:.0f} seconds ({MAX_TTL_S / 86400:g} days)",
            )
    return Message(mid, terms, location, ttl, tuple(kws), text)


def region_to_dict(region: Rect | Circle) -> dict[str, list[float]]:
    if isinstance(region, Rect):
        return {"rect": [region.min_lon, region.min_lat, region.max_lon, region.max_lat]}
    return {"circle": [region.lon, region.lat, region.radius_m]}


def subscription_to_dict(s: Subscription) -> dict[str, Any]:
    """Inverse of ``subscription_from_dict`` (a DNF built in code is written as ``keywords`` when it
    has one clause, else as an ``expr``)."""
    d: dict[str, Any] = {"id": s.id}
    if s.expr is not None:
        d["expr"] = s.expr
    elif s.keywords is not None:
        d["keywords"] = list(s.keywords)
    elif len(s.clauses) == 1:
        d["keywords"] = list(s.clauses[0])
    else:
        d["expr"] = format_dnf(s.clauses)
    d.update(region_to_dict(s.region))
    if s.moving:
        d["moving"] = True
    return d


SubscriptionRow = tuple[str, tuple, tuple, bool, tuple | None, str | None]


def subscriptions_to_rows(subs: Sequence[Subscription]) -> list[SubscriptionRow]:
    """Subscriptions as plain tuples (id, clauses, region, moving, keywords, expr), the region as
    ``(0, min_lon, min_lat, max_lon, max_lat)`` or ``(1, lon, lat, radius_m)``: what the
    coordinator sends a shard actor to load. Pickling tuples of builtins takes ~4 µs a
    subscription here, the dataclasses ~15 µs (and as long again to unpickle). O(n).

    >>> rows = subscriptions_to_rows([Subscription("a", (("x",),), Rect(0.0, 0.0, 1.0, 1.0))])
    >>> rows, subscriptions_from_rows(rows)[0].region
    ([('a', (('x',),), (0, 0.0, 0.0, 1.0, 1.0), False, None, None)], Rect(min_lon=0.0, min_lat=0.0, max_lon=1.0, max_lat=1.0))
    """
    out = []
    for s in subs:
        r = s.region
        region = (
            (0, r.min_lon, r.min_lat, r.max_lon, r.max_lat)
            if type(r) is Rect
            else (1, r.lon, r.lat, r.radius_m)
        )
        out.append((s.id, s.clauses, region, s.moving, s.keywords, s.expr))
    return out


def subscriptions_from_rows(rows: Sequence[SubscriptionRow]) -> list[Subscription]:
    """Inverse of ``subscriptions_to_rows`` (trusted input: the rows came from Subscriptions).
    O(n)."""
    out = []
    for sid, clauses, r, moving, keywords, expr in rows:
        region = Rect(r[1], r[2], r[3], r[4]) if r[0] == 0 else Circle(r[1], r[2], r[3])
        out.append(Subscription(sid, clauses, region, moving, keywords, expr))
    return out


def message_to_dict(m: Message) -> dict[str, Any]:
    """Inverse of ``message_from_dict``."""
    d: dict[str, Any] = {"id": m.id}
    d["keywords"] = list(m.keywords) if (m.keywords or m.text) else list(m.terms)
    if m.text is not None:
        d["text"] = m.text
    if isinstance(m.location, Point):
        d["point"] = [m.location.lon, m.location.lat]
    else:
        r = m.location
        d["rect"] = [r.min_lon, r.min_lat, r.max_lon, r.max_lat]
    if m.ttl is not None:
        d["ttl"] = m.ttl
    return d
