"""Domain objects (subscriptions, messages, regions) and the validation every input path uses.

``subscription_from_dict`` / ``message_from_dict`` read the JSON workload form; the gRPC converter
and the Spark loader call the same functions, so a rule lives in exactly one place.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from shard.attributes import (
    Predicate,
    Scalar,
    attributes_from_mapping,
    attributes_to_mapping,
    predicates_from_list,
    predicates_to_list,
)
from shard.errors import ValidationError
from shard.expr import format_condition, parse_condition
from shard.limits import (
    BBOX_MARGIN_DEG,
    MAX_ID_LEN,
    MAX_KEYWORDS,
    MAX_RADIUS_M,
    MAX_TEXT_LEN,
    MAX_TTL_S,
)
from shard.polygon_rings import Rings, rings_bbox, validate_polygon
from shard.ranking import validate_ranking
from shard.terms import ascii_keyword_terms, check_term, message_terms, normalize_term


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
class Polygon:
    """A polygon region: ``rings`` as validated (``shard.polygon``: the exterior, then holes;
    closed rings of (lon, lat), straight edges in lon/lat, boundary included), indexed by a box.

    ``base`` is the rings' bounding box widened by ``BBOX_MARGIN_DEG`` (clamped to the world),
    ``box`` the same box where the region is now: a moving subscription's polygon moves as a
    rectangle of the base's size does (``shard.applus.recentre``), and the polygon where it is
    now is its rings translated by ``offset`` (the box's centre minus the base's). The index
    files it under ``box``, which holds the translated rings with the margin to spare, and the
    exact test (``shard.polygon``) runs on what the box lets through.

    >>> p = Polygon.of((((0.0, 0.0), (2.0, 0.0), (0.0, 2.0), (0.0, 0.0)),))
    >>> p.offset, p.box == p.base
    ((0.0, 0.0), True)
    """

    rings: Rings
    base: tuple[float, float, float, float]
    box: tuple[float, float, float, float]

    @staticmethod
    def of(rings: Rings) -> Polygon:
        x0, y0, x1, y1 = rings_bbox(rings)
        m = BBOX_MARGIN_DEG
        base = (max(x0 - m, -180.0), max(y0 - m, -90.0), min(x1 + m, 180.0), min(y1 + m, 90.0))
        return Polygon(rings, base, base)

    @property
    def offset(self) -> tuple[float, float]:
        """(dx, dy): where the rings are now, relative to where they were given."""
        return polygon_offset(self.base, self.box)

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (Polygon, (self.rings, self.base, self.box))


def polygon_offset(base, box) -> tuple[float, float]:
    """The translation of a polygon indexed by ``box`` whose rings' box is ``base``: the
    difference of their centres, computed as every index and the oracle compute it.

    >>> polygon_offset((0.0, 0.0, 2.0, 2.0), (10.0, 1.0, 12.0, 3.0))
    (10.0, 1.0)
    """
    return (
        (box[0] + box[2]) / 2 - (base[0] + base[2]) / 2,
        (box[1] + box[3]) / 2 - (base[1] + base[3]) / 2,
    )


Region = Rect | Circle | Polygon | Point
"""A ``Point`` is the location of a top-k subscription (``Subscription.topk``)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """``clauses`` is the normalized DNF (one clause for a ``keywords`` condition): the terms
    each clause needs; ``negated`` (None: no NOT) the terms each clause must not meet, aligned
    with ``clauses``. ``predicates`` must all hold on a message's attributes
    (``shard.attributes``). ``keywords`` / ``expr`` keep the condition as given, for round
    trips.

    A *top-k subscription* (paper 001, ``shard.topk``; ``topk``) has a ``Point`` for its
    region, no clauses, weighted ``predicates`` (weights summing to 1) and ``alpha``: it takes
    part in top-k publishes only, which score it (``shard.topk.model.score``)."""

    id: str
    clauses: tuple[tuple[str, ...], ...]
    region: Region
    moving: bool = False
    keywords: tuple[str, ...] | None = None
    expr: str | None = None
    negated: tuple[tuple[str, ...], ...] | None = None
    predicates: tuple[Predicate, ...] = ()
    threshold: float | None = None
    """A ranked subscription (``shard.ranking``): the similarity θ a message must reach; its one
    clause holds the terms scored (not all required)."""
    alpha: float = 0.5
    weights: tuple[float, ...] | None = None
    """A ranked subscription's term weights, aligned with its (sorted) terms; None: not given
    (the cluster gives idf weights, elsewhere 1 each)."""

    @property
    def plain(self) -> bool:
        """No NOT, no polygon, no predicate, not ranked: everything the indexes check
        themselves."""
        return (
            self.negated is None
            and not self.predicates
            and self.threshold is None
            and type(self.region) is not Polygon
            and type(self.region) is not Point
        )

    @property
    def topk(self) -> bool:
        """A top-k subscription (paper 001): located at a point, reached by top-k publishes."""
        return type(self.region) is Point

    @property
    def term_weights(self) -> tuple[float, ...]:
        """A ranked subscription's weights (1 each where none were given)."""
        return self.weights or (1.0,) * len(self.clauses[0])

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (
            Subscription,
            (
                self.id,
                self.clauses,
                self.region,
                self.moving,
                self.keywords,
                self.expr,
                self.negated,
                self.predicates,
                self.threshold,
                self.alpha,
                self.weights,
            ),
        )


class TopKAnswer(NamedTuple):
    """A shard's answer to a top-k publish (``shard.topk.hosted``): the tags and the scores
    (numpy arrays) of its best top-k subscriptions, best first."""

    tags: Any
    scores: Any


@dataclass(frozen=True, slots=True)
class Message:
    """``terms``: normalized keywords plus text tokens, sorted. ``ttl`` None: one-shot.
    ``attributes``: (name, number or string) sorted by name (``shard.attributes``)."""

    id: str
    terms: tuple[str, ...]
    location: Point | Rect
    ttl: float | None = None
    keywords: tuple[str, ...] = ()
    text: str | None = None
    attributes: tuple[tuple[str, Scalar], ...] = ()

    def __reduce__(self):  # pickled as a tuple (Ray ships these in every batch)
        return (
            Message,
            (self.id, self.terms, self.location, self.ttl, self.keywords, self.text,
             self.attributes),
        )  # fmt: skip


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
    fast = ascii_keyword_terms(value)  # (the common case, in a few calls)
    if fast is not None:
        return tuple(value), fast
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


_SUB_FIELDS = frozenset(
    {
        "id", "keywords", "expr", "rect", "circle", "polygon", "moving", "predicates",
        "threshold", "alpha", "weights", "point",
    }
)  # fmt: skip
_TOPK_FIELDS = frozenset({"id", "point", "predicates", "alpha", "moving"})
_MSG_FIELDS = frozenset({"id", "keywords", "text", "point", "rect", "ttl", "attributes"})
_REGIONS = ("rect", "circle", "polygon")


def subscription_from_dict(d: Mapping[str, Any]) -> Subscription:
    """Validate the workload form of a subscription.

    >>> subscription_from_dict({"id": "s1", "keywords": ["iPad"], "rect": [0, 0, 1, 1]}).clauses
    (('ipad',),)
    """
    if not isinstance(d, Mapping):
        raise ValidationError("subscription", d, "must be an object")
    _unknown(d, _SUB_FIELDS)
    if "point" in d:
        return _topk_from_dict(d)
    sid = validate_id("id", d.get("id"))
    has_kw, has_expr = "keywords" in d, "expr" in d
    if has_kw == has_expr:
        raise ValidationError(
            "keywords", d.get("keywords"), "give exactly one of 'keywords' and 'expr'"
        )
    keywords: tuple[str, ...] | None = None
    expr: str | None = None
    negated = None
    if has_kw:
        keywords, norm = validate_keywords("keywords", d["keywords"])
        clauses: tuple[tuple[str, ...], ...] = (norm,)
    else:
        expr = d["expr"]
        clauses, negated = parse_condition(expr)
    given = [k for k in _REGIONS if k in d]
    if len(given) != 1:
        raise ValidationError(
            given[0] if given else "rect",
            d.get(given[0]) if given else None,
            "give exactly one of 'rect', 'circle' and 'polygon'",
        )
    region: Region
    if given[0] == "rect":
        region = validate_rect("rect", d["rect"])
    elif given[0] == "circle":
        region = validate_circle("circle", d["circle"])
    else:
        region = Polygon.of(validate_polygon("polygon", d["polygon"]))
    moving = d.get("moving", False)
    if not isinstance(moving, bool):
        raise ValidationError("moving", moving, "must be true or false")
    predicates: tuple[Predicate, ...] = ()
    if "predicates" in d:
        predicates = predicates_from_list("predicates", d["predicates"], weighted=False)
    if "threshold" not in d:
        for k in ("alpha", "weights"):
            if k in d:
                raise ValidationError(k, d[k], "only a ranked subscription (threshold) has it")
        return Subscription(sid, clauses, region, moving, keywords, expr, negated, predicates)
    if not has_kw:
        raise ValidationError("expr", expr, "a ranked subscription (threshold) takes keywords")
    if type(region) is not Rect:
        raise ValidationError(given[0], d[given[0]], "a ranked subscription takes a rect")
    theta, alpha, weights = validate_ranking(d, clauses[0])
    return Subscription(
        sid, clauses, region, moving, keywords, expr, negated, predicates, theta, alpha,
        weights if "weights" in d else None,
    )  # fmt: skip


def _topk_from_dict(d: Mapping[str, Any]) -> Subscription:
    """A top-k subscription's workload form (``shard.topk.model``'s, plus ``moving``):
    ``{"id", "point": [lon, lat], "predicates": [... "weight": w], "alpha"}``.

    >>> s = _topk_from_dict({"id": "t", "point": [1, 2], "alpha": 0.2, "predicates": [
    ...     {"attr": "a", "op": "=", "value": 1, "weight": 3}, {"attr": "b", "op": "<", "value": 2}]})
    >>> s.topk, s.region, [p.weight for p in s.predicates], s.alpha
    (True, Point(lon=1.0, lat=2.0), [0.75, 0.25], 0.2)
    """
    for k in d:
        if k not in _TOPK_FIELDS:
            raise ValidationError(
                str(k), d[k], "a top-k subscription (point) takes id, predicates, alpha, moving"
            )
    sid = validate_id("id", d.get("id"))
    p = _seq("point", d["point"], 2)
    point = validate_point("point", p[0], p[1])
    if "predicates" not in d:
        raise ValidationError("predicates", None, "a top-k subscription needs 1 or more")
    predicates = predicates_from_list("predicates", d["predicates"], weighted=True)
    alpha = _number("alpha", d.get("alpha", 0.5))
    if not 0.0 <= alpha <= 1.0:
        raise ValidationError("alpha", d.get("alpha"), "must be in [0, 1]")
    moving = d.get("moving", False)
    if not isinstance(moving, bool):
        raise ValidationError("moving", moving, "must be true or false")
    return Subscription(sid, (), point, moving, predicates=predicates, alpha=alpha)


def message_from_dict(
    d: Mapping[str, Any], *, allow_empty_id: bool = False, need_terms: bool = True
) -> Message:
    """Validate the workload form of a message (``need_terms`` False: it may have none, as
    a top-k publish's message, scored on its attributes and point).

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
    if not terms and need_terms:
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
    attributes: tuple[tuple[str, Scalar], ...] = ()
    if "attributes" in d:
        attributes = attributes_from_mapping("attributes", d["attributes"])
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
    return Message(mid, terms, location, ttl, tuple(kws), text, attributes)


def region_to_dict(region: Region) -> dict[str, list]:
    """The workload form of a region; a moved polygon is written where it is now (its rings
    translated by its offset)."""
    if isinstance(region, Rect):
        return {"rect": [region.min_lon, region.min_lat, region.max_lon, region.max_lat]}
    if isinstance(region, Polygon):
        dx, dy = region.offset
        return {"polygon": [[[x + dx, y + dy] for x, y in ring] for ring in region.rings]}
    if isinstance(region, Point):
        return {"point": [region.lon, region.lat]}
    return {"circle": [region.lon, region.lat, region.radius_m]}


def subscription_to_dict(s: Subscription) -> dict[str, Any]:
    """Inverse of ``subscription_from_dict`` (a DNF built in code is written as ``keywords`` when it
    has one clause, else as an ``expr``)."""
    d: dict[str, Any] = {"id": s.id}
    if s.topk:
        d.update(region_to_dict(s.region))
        d["predicates"] = predicates_to_list(s.predicates, weighted=True)
        d["alpha"] = s.alpha
        if s.moving:
            d["moving"] = True
        return d
    if s.expr is not None:
        d["expr"] = s.expr
    elif s.keywords is not None:
        d["keywords"] = list(s.keywords)
    elif len(s.clauses) == 1 and not s.negated:
        d["keywords"] = list(s.clauses[0])
    else:
        d["expr"] = format_condition(s.clauses, s.negated)
    d.update(region_to_dict(s.region))
    if s.moving:
        d["moving"] = True
    if s.predicates:
        d["predicates"] = predicates_to_list(s.predicates, weighted=False)
    if s.threshold is not None:
        d["threshold"] = s.threshold
        d["alpha"] = s.alpha
        if s.weights is not None:
            d["weights"] = dict(zip(s.clauses[0], s.weights, strict=True))
    return d


SubscriptionRow = tuple
"""(id, clauses, region, moving, keywords, expr) and, for a subscription that is not ``plain``,
(negated, predicates as (attr, op, value, weight) tuples, threshold, alpha, weights) after
them."""


def _region_row(r: Region) -> tuple:
    if type(r) is Rect:
        return (0, r.min_lon, r.min_lat, r.max_lon, r.max_lat)
    if type(r) is Circle:
        return (1, r.lon, r.lat, r.radius_m)
    if type(r) is Point:
        return (3, r.lon, r.lat)
    return (2, r.rings, r.base, r.box)


def _region_of_row(r: tuple) -> Region:
    if r[0] == 0:
        return Rect(r[1], r[2], r[3], r[4])
    if r[0] == 1:
        return Circle(r[1], r[2], r[3])
    if r[0] == 3:
        return Point(r[1], r[2])
    return Polygon(r[1], r[2], r[3])


def subscriptions_to_rows(subs: Sequence[Subscription]) -> list[SubscriptionRow]:
    """Subscriptions as plain tuples (id, clauses, region, moving, keywords, expr[, negated,
    predicates]), the region as ``(0, min_lon, min_lat, max_lon, max_lat)``, ``(1, lon, lat,
    radius_m)``, ``(2, rings, base, box)`` or ``(3, lon, lat)`` (a top-k subscription): what the coordinator sends a shard actor to load.
    Pickling tuples of builtins takes ~4 µs a subscription here, the dataclasses ~15 µs (and as
    long again to unpickle). O(n).

    >>> rows = subscriptions_to_rows([Subscription("a", (("x",),), Rect(0.0, 0.0, 1.0, 1.0))])
    >>> rows, subscriptions_from_rows(rows)[0].region
    ([('a', (('x',),), (0, 0.0, 0.0, 1.0, 1.0), False, None, None)], Rect(min_lon=0.0, min_lat=0.0, max_lon=1.0, max_lat=1.0))
    """
    out = []
    for s in subs:
        row = (s.id, s.clauses, _region_row(s.region), s.moving, s.keywords, s.expr)
        if not s.plain:
            preds = tuple((p.attr, p.op, p.value, p.weight) for p in s.predicates)
            row = (*row, s.negated, preds, s.threshold, s.alpha, s.weights)
        out.append(row)
    return out


def subscriptions_from_rows(rows: Sequence[SubscriptionRow]) -> list[Subscription]:
    """Inverse of ``subscriptions_to_rows`` (trusted input: the rows came from Subscriptions).
    O(n)."""
    out = []
    for row in rows:
        sid, clauses, r, moving, keywords, expr = row[:6]
        region = _region_of_row(r)
        if len(row) == 6:
            out.append(Subscription(sid, clauses, region, moving, keywords, expr))
        else:
            preds = tuple(Predicate(*p) for p in row[7])
            out.append(
                Subscription(sid, clauses, region, moving, keywords, expr, row[6], preds, *row[8:])
            )
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
    if m.attributes:
        d["attributes"] = attributes_to_mapping(m.attributes)
    return d
