"""Top-k subscriptions and events of paper 001 (Hu, Cheng, Wu, Jin: the R^I-tree), their
validation, their JSON Lines form, and the reference score ψ (Sect. 3.1, Definitions 1-3).

A subscription (Definition 1) is a conjunction of weighted predicates ``<attr, op, val, ω>``, a
point location and a per-subscription ``α``; an event (Definition 2) is attribute-value pairs
and a point. The score (Definition 3, Eq. 1-4) is

    ψ(e, s) = (1 − s.α)·ψ_t(e, s) + s.α·ψ_s(e, s)
    ψ_t(e, s) = Σ_{p ∈ s, p.attr ∈ e} p.ω · check(e[p.attr], p)           (Eq. 2-3)
    ψ_s(e, s) = max(0, 1 − dist(e.loc, s.loc) / MaxDist)                   (Eq. 4)

``dist`` is the Euclidean distance in degrees between the two (lon, lat) points, as the paper
says ("the Euclidian distance"); ``MaxDist`` is a parameter of an index (``DEFAULT_MAX_DIST``).

JSON Lines form::

    {"id": "s1", "predicates": [{"attr": "price", "op": "<=", "value": 5, "weight": 0.3},
                                {"attr": "category", "op": "in", "value": ["food", "drinks"],
                                 "weight": 0.7}], "alpha": 0.4, "point": [lon, lat]}
    {"id": "e1", "attributes": {"price": 4.5, "category": "food"}, "point": [lon, lat]}

``weight`` defaults to 1 (then normalised, see below), ``alpha`` to 0.5, ``attributes`` to
``{}``. Operators (the paper's Table 2): ``=`` (alias ``==``), ``!=``, ``<``, ``<=``, ``>``, ``>=``,
``in``, ``not in``, ``between`` (alias ``range``; ``[lo, hi]``, both ends included: the
paper's ``∈_i``). ``<, <=, >, >=, between`` take numbers; ``=, !=, in, not in`` take a number or
a string (an ``in`` list is all numbers or all strings). Numbers are float64 from parsing on (an
integer beyond 2^53 is rounded), so every implementation compares the same values.

Exact semantics of ``check`` (Eq. 3) used by every index:

* A predicate on an attribute the event lacks does not hold (Eq. 2 sums only over attributes
  the event has).
* A predicate holds only on a value of its own type: a string predicate never holds on a
  number and a number predicate never on a string -- ``!=`` and ``not in`` included (``price !=
  "x"`` does not hold on ``price = 5``).
* ``!=`` holds iff the value differs; ``not in`` iff it is not in the list. The paper turns
  both into the whole domain ``[v_min, v_max]`` (Table 2), i.e. scores them as always
  satisfied; we keep that interval only as the *bound* of the indexes (an over-approximation,
  so pruning stays safe) and every candidate is scored exactly.

Where the paper is ambiguous
----------------------------
* **Weights.** Definition 1 requires Σω = 1 but the paper's generator (Sect. 6.1) does not
  normalise. We accept any positive finite weights (default 1 each) and divide them by their
  sum when that sum differs from 1 by more than ``WEIGHT_SUM_TOLERANCE``; so serialised weights
  parse back to exactly the same floats.
* **MaxDist.** The paper's "maximum Euclidean distance between subscriptions" changes with every
  subscribe / unsubscribe (all scores would shift) and an event outside the subscriptions'
  extent would get ψ_s < 0, which breaks Eq. 8's monotonicity argument (f2 increasing needs
  UB_s ≥ 0). We fix MaxDist per index at construction (default the diagonal of the lon/lat
  domain, ``DEFAULT_MAX_DIST``, under which ψ_s ∈ [0, 1] always) and clamp ψ_s at 0 when a
  smaller MaxDist is chosen (``bbox_diagonal`` gives the paper's extent for a workload).
* **Several predicates on one attribute.** Eq. 5 takes one max-weight interval per attribute,
  which is not a bound when one subscription has two predicates on the same attribute (their
  weights add up in Eq. 2). We reject a repeated attribute (``between`` expresses a range).
* **Strings in intervals.** Strings are interned per attribute to ids (Table 2 needs an
  order); ``in`` becomes the hull of its ids, ``=`` a point. Ordering operators on strings are
  not offered (interning order is not lexicographic).
* **Subscription length.** At least one predicate (Σω = 1 needs one); at most
  ``MAX_PREDICATES``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shard.errors import ValidationError
from shard.model import Point, validate_id, validate_point
from shard.workload import iter_jsonl

MAX_PREDICATES = 32
"""Predicates in one subscription. The paper's longest subscriptions have 6 (Table 4, L_s)."""

MAX_SET_VALUES = 64
"""Values in an ``in`` / ``not in`` list (checked by a scan in the kernels)."""

MAX_ATTR_NAME_LEN = 64
"""Characters of an attribute name (1-64 printable characters)."""

MAX_STRING_VALUE_LEN = 256
"""Characters of a string value (predicate or event)."""

MAX_EVENT_ATTRS = 64
"""Attributes of one event. The paper's longest events have 14 (Table 4, L_e)."""

WEIGHT_SUM_TOLERANCE = 1e-9
"""Weights whose sum is within this of 1 are kept as given (see "Weights" above)."""

DEFAULT_MAX_DIST = math.sqrt(360.0 * 360.0 + 180.0 * 180.0)
"""MaxDist of Eq. 4 unless an index is given another: the diagonal of [-180, 180] x [-90, 90]
in degrees, the largest distance two valid points can have, so ψ_s never needs clamping."""

OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "between")
"""Canonical operator names; the index of each is its op code in the compiled columns."""

OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOT_IN, OP_BETWEEN = range(9)

_ALIASES = {"==": "=", "range": "between"}
_NUMERIC_ONLY = frozenset({"<", "<=", ">", ">=", "between"})
_SET_OPS = frozenset({"in", "not in"})

Scalar = float | str


@dataclass(frozen=True, slots=True)
class Predicate:
    """``<attr, op, value, weight>``; ``value`` is a float or str, a sorted tuple of distinct
    floats or strs (``in`` / ``not in``) or ``(lo, hi)`` floats (``between``); ``weight`` is the
    normalised ω."""

    attr: str
    op: str
    value: Scalar | tuple[Scalar, ...]
    weight: float

    @property
    def is_string(self) -> bool:
        v = self.value
        return isinstance(v[0] if isinstance(v, tuple) else v, str)


@dataclass(frozen=True, slots=True)
class TopKSubscription:
    """A validated top-k subscription (build it with ``subscription_from_dict``)."""

    id: str
    predicates: tuple[Predicate, ...]
    alpha: float
    point: Point


@dataclass(frozen=True, slots=True)
class TopKEvent:
    """A validated event: ``attributes`` sorted by name, values float or str."""

    id: str
    attributes: tuple[tuple[str, Scalar], ...]
    point: Point

    def as_dict(self) -> dict[str, Scalar]:
        return dict(self.attributes)


# ---- validation ------------------------------------------------------------------------------
def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number")
    try:
        x = float(value)
    except OverflowError:
        raise ValidationError(field, value, "must be finite") from None
    if not math.isfinite(x):
        raise ValidationError(field, value, "must be finite")
    return x


def _scalar(field: str, value: Any) -> Scalar:
    if isinstance(value, str):
        if len(value) > MAX_STRING_VALUE_LEN:
            raise ValidationError(field, value, f"longer than {MAX_STRING_VALUE_LEN} characters")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number or a string")
    return _number(field, value)


def validate_attr(field: str, value: Any) -> str:
    """1-64 printable characters."""
    if not isinstance(value, str):
        raise ValidationError(field, value, "must be a string")
    if not 1 <= len(value) <= MAX_ATTR_NAME_LEN:
        raise ValidationError(field, value, f"must be 1-{MAX_ATTR_NAME_LEN} characters")
    if not value.isprintable():
        raise ValidationError(field, value, "must contain printable characters only")
    return value


def _point(field: str, value: Any) -> Point:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValidationError(field, value, "must be a list [lon, lat]")
    return validate_point(field, value[0], value[1])


def _unknown(where: str, d: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for k in d:
        if k not in allowed:
            raise ValidationError(f"{where}{k}", d[k], "unknown field")


def _predicate_value(field: str, op: str, value: Any) -> Scalar | tuple[Scalar, ...]:
    if op == "between":
        if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
            raise ValidationError(field, value, "must be a list [lo, hi] of numbers")
        lo, hi = _number(f"{field}[0]", value[0]), _number(f"{field}[1]", value[1])
        if lo > hi:
            raise ValidationError(f"{field}[1]", value[1], f"hi < lo {value[0]}")
        return (lo, hi)
    if op in _SET_OPS:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ValidationError(field, value, "must be a list of numbers or of strings")
        if not 1 <= len(value) <= MAX_SET_VALUES:
            raise ValidationError(field, value, f"must hold 1-{MAX_SET_VALUES} values")
        items = [_scalar(f"{field}[{i}]", v) for i, v in enumerate(value)]
        is_str = isinstance(items[0], str)
        for i, v in enumerate(items):
            if isinstance(v, str) != is_str:
                raise ValidationError(
                    f"{field}[{i}]", value[i], "an in-list is all numbers or all strings"
                )
        return tuple(sorted(set(items)))  # type: ignore[type-var]
    if op in _NUMERIC_ONLY:
        return _number(field, value)
    return _scalar(field, value)


def subscription_from_dict(d: Mapping[str, Any]) -> TopKSubscription:
    """Validate the JSON form of a top-k subscription; weights normalised to sum to 1.

    >>> s = subscription_from_dict({"id": "s1", "predicates": [
    ...     {"attr": "price", "op": "<=", "value": 5, "weight": 1},
    ...     {"attr": "cat", "op": "in", "value": ["b", "a"], "weight": 3}],
    ...     "alpha": 0.4, "point": [1, 2]})
    >>> [(p.op, p.value, p.weight) for p in s.predicates]
    [('<=', 5.0, 0.25), ('in', ('a', 'b'), 0.75)]
    """
    if not isinstance(d, Mapping):
        raise ValidationError("subscription", d, "must be an object")
    _unknown("", d, frozenset({"id", "predicates", "alpha", "point"}))
    sid = validate_id("id", d.get("id"))
    preds = d.get("predicates")
    if isinstance(preds, str | bytes) or not isinstance(preds, Sequence):
        raise ValidationError("predicates", preds, "must be a list of predicates")
    if not 1 <= len(preds) <= MAX_PREDICATES:
        raise ValidationError("predicates", preds, f"must hold 1-{MAX_PREDICATES} predicates")
    seen: dict[str, int] = {}
    raw: list[tuple[str, str, Any, float]] = []
    for i, p in enumerate(preds):
        f = f"predicates[{i}]"
        if not isinstance(p, Mapping):
            raise ValidationError(f, p, "must be an object")
        _unknown(f"{f}.", p, frozenset({"attr", "op", "value", "weight"}))
        attr = validate_attr(f"{f}.attr", p.get("attr"))
        if attr in seen:
            raise ValidationError(
                f"{f}.attr",
                attr,
                f"attribute already constrained by predicates[{seen[attr]}] (use between)",
            )
        seen[attr] = i
        op = p.get("op")
        op = _ALIASES.get(op, op) if isinstance(op, str) else op
        if op not in OPS:
            raise ValidationError(f"{f}.op", p.get("op"), f"must be one of {', '.join(OPS)}")
        if "value" not in p:
            raise ValidationError(f"{f}.value", None, "missing")
        value = _predicate_value(f"{f}.value", op, p["value"])
        w = _number(f"{f}.weight", p.get("weight", 1.0))
        if w <= 0.0:
            raise ValidationError(f"{f}.weight", p.get("weight"), "must be > 0")
        raw.append((attr, op, value, w))
    total = math.fsum(r[3] for r in raw)
    if not math.isfinite(total):
        raise ValidationError("predicates", preds, "the weights' sum must be finite")
    scale = abs(total - 1.0) > WEIGHT_SUM_TOLERANCE
    predicates = tuple(Predicate(a, o, v, (w / total) if scale else w) for a, o, v, w in raw)
    alpha = _number("alpha", d.get("alpha", 0.5))
    if not 0.0 <= alpha <= 1.0:
        raise ValidationError("alpha", d.get("alpha"), "must be in [0, 1]")
    if "point" not in d:
        raise ValidationError("point", None, "missing")
    return TopKSubscription(sid, predicates, alpha, _point("point", d["point"]))


def event_from_dict(d: Mapping[str, Any]) -> TopKEvent:
    """Validate the JSON form of an event.

    >>> event_from_dict({"id": "e1", "attributes": {"price": 4, "cat": "a"}, "point": [0, 0]})
    TopKEvent(id='e1', attributes=(('cat', 'a'), ('price', 4.0)), point=Point(lon=0.0, lat=0.0))
    """
    if not isinstance(d, Mapping):
        raise ValidationError("event", d, "must be an object")
    _unknown("", d, frozenset({"id", "attributes", "point"}))
    eid = validate_id("id", d.get("id"))
    attrs = d.get("attributes", {})
    if not isinstance(attrs, Mapping):
        raise ValidationError("attributes", attrs, "must be an object")
    if len(attrs) > MAX_EVENT_ATTRS:
        raise ValidationError("attributes", attrs, f"at most {MAX_EVENT_ATTRS} attributes")
    items = []
    for name, value in attrs.items():
        validate_attr(f"attributes.{name}", name)
        items.append((name, _scalar(f"attributes.{name}", value)))
    if "point" not in d:
        raise ValidationError("point", None, "missing")
    return TopKEvent(eid, tuple(sorted(items)), _point("point", d["point"]))


def _json_value(v: Scalar | tuple[Scalar, ...]) -> Any:
    return list(v) if isinstance(v, tuple) else v


def subscription_to_dict(s: TopKSubscription) -> dict[str, Any]:
    """The JSON form; ``subscription_from_dict`` of it gives ``s`` back exactly."""
    return {
        "id": s.id,
        "predicates": [
            {"attr": p.attr, "op": p.op, "value": _json_value(p.value), "weight": p.weight}
            for p in s.predicates
        ],
        "alpha": s.alpha,
        "point": [s.point.lon, s.point.lat],
    }


def event_to_dict(e: TopKEvent) -> dict[str, Any]:
    """The JSON form; ``event_from_dict`` of it gives ``e`` back exactly."""
    return {"id": e.id, "attributes": dict(e.attributes), "point": [e.point.lon, e.point.lat]}


# ---- the reference score (Definition 3), plain Python -------------------------------------
def predicate_holds(p: Predicate, value: Scalar | None) -> bool:
    """``check`` of Eq. 3 with the exact semantics of the module docstring.

    >>> p = Predicate("a", "not in", ("x", "y"), 1.0)
    >>> predicate_holds(p, "z"), predicate_holds(p, "x"), predicate_holds(p, 3.0)
    (True, False, False)
    """
    if value is None or isinstance(value, str) != p.is_string:
        return False
    op, a = p.op, p.value
    if op == "=":
        return value == a
    if op == "!=":
        return value != a
    if op == "in":
        return value in a  # type: ignore[operator]
    if op == "not in":
        return value not in a  # type: ignore[operator]
    if op == "between":
        return a[0] <= value <= a[1]  # type: ignore[index,operator]
    if op == "<":
        return value < a  # type: ignore[operator]
    if op == "<=":
        return value <= a  # type: ignore[operator]
    if op == ">":
        return value > a  # type: ignore[operator]
    return value >= a  # type: ignore[operator]


def score(sub: TopKSubscription, event: TopKEvent, max_dist: float = DEFAULT_MAX_DIST) -> float:
    """ψ(e, s) of Eq. 1, summed in predicate order exactly as the compiled kernels do, so the
    floats are bit-identical.

    >>> s = subscription_from_dict({"id": "s", "predicates": [{"attr": "a", "op": "=",
    ...     "value": 1}], "alpha": 0.5, "point": [0, 0]})
    >>> score(s, event_from_dict({"id": "e", "attributes": {"a": 1}, "point": [0, 0]}))
    1.0
    """
    attrs = event.as_dict()
    psi_t = 0.0
    for p in sub.predicates:  # Eq. 2
        if predicate_holds(p, attrs.get(p.attr)):
            psi_t += p.weight
    dx = event.point.lon - sub.point.lon
    dy = event.point.lat - sub.point.lat
    psi_s = 1.0 - math.sqrt(dx * dx + dy * dy) / max_dist  # Eq. 4
    if psi_s < 0.0:
        psi_s = 0.0
    return (1.0 - sub.alpha) * psi_t + sub.alpha * psi_s  # Eq. 1


def bbox_diagonal(subs: Sequence[TopKSubscription]) -> float:
    """The diagonal of the subscriptions' bounding box: an upper bound of the paper's MaxDist
    ("the maximum Euclidean distance between subscriptions"); at least 1e-9.

    >>> s = subscription_from_dict({"id": "s", "predicates": [{"attr": "a", "op": "=",
    ...     "value": 1}], "point": [0, 0]})
    >>> bbox_diagonal([s, TopKSubscription("t", s.predicates, 0.5, Point(3.0, 4.0))])
    5.0
    """
    if not subs:
        return DEFAULT_MAX_DIST
    xs = [s.point.lon for s in subs]
    ys = [s.point.lat for s in subs]
    return max(math.hypot(max(xs) - min(xs), max(ys) - min(ys)), 1e-9)


def ranked(scored: Sequence[tuple[str, float]], k: int) -> list[tuple[str, float]]:
    """The tie rule of every index: score descending, then subscription id ascending; first k.

    >>> ranked([("b", 0.5), ("a", 0.5), ("c", 0.9)], 2)
    [('c', 0.9), ('a', 0.5)]
    """
    return sorted(scored, key=lambda t: (-t[1], t[0]))[:k]


def validate_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValidationError("k", k, "must be an integer >= 1")
    return k


def read_subscriptions(
    path: str | Path, *, strict: bool = False, errors: list[str] | None = None
) -> Iterator[TopKSubscription]:
    """Stream validated top-k subscriptions from a JSON Lines file (a bad line is skipped and
    reported in ``errors`` as ``path:line: reason``, or raised with ``strict``)."""
    return iter_jsonl(path, subscription_from_dict, strict=strict, errors=errors)


def read_events(
    path: str | Path, *, strict: bool = False, errors: list[str] | None = None
) -> Iterator[TopKEvent]:
    """Stream validated events from a JSON Lines file (as ``read_subscriptions``)."""
    return iter_jsonl(path, event_from_dict, strict=strict, errors=errors)
