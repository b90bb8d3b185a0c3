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

The predicates, the attributes, their validation, limits and ``predicate_holds`` are
``shard.attributes`` (boolean subscriptions use them too, without weights); this module adds the
weights, α, the point and the score. Exact semantics of ``check`` (Eq. 3) used by every index:

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
* **Text.** The paper's events have attributes only. In the cluster a top-k publish's message
  terms count as attributes ``#<term>`` = 1 (``shard.topk.hosted.as_event``), so keywords are
  scored by predicates on those names.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shard.attributes import (
    MAX_ATTR_NAME_LEN,
    MAX_ATTRIBUTES,
    MAX_PREDICATES,
    MAX_SET_VALUES,
    MAX_STRING_VALUE_LEN,
    OP_BETWEEN,
    OP_EQ,
    OP_GE,
    OP_GT,
    OP_IN,
    OP_LE,
    OP_LT,
    OP_NE,
    OP_NOT_IN,
    OPS,
    WEIGHT_SUM_TOLERANCE,
    Predicate,
    Scalar,
    attributes_from_mapping,
    attributes_to_mapping,
    predicate_holds,
    predicates_from_list,
    predicates_to_list,
    reject_unknown,
    validate_attr,
    validate_number,
)
from shard.errors import ValidationError
from shard.model import Point, validate_id, validate_point
from shard.workload import iter_jsonl

__all__ = [
    "DEFAULT_MAX_DIST",
    "MAX_ATTR_NAME_LEN",
    "MAX_EVENT_ATTRS",
    "MAX_PREDICATES",
    "MAX_SET_VALUES",
    "MAX_STRING_VALUE_LEN",
    "OPS",
    "OP_BETWEEN",
    "OP_EQ",
    "OP_GE",
    "OP_GT",
    "OP_IN",
    "OP_LE",
    "OP_LT",
    "OP_NE",
    "OP_NOT_IN",
    "WEIGHT_SUM_TOLERANCE",
    "Predicate",
    "Scalar",
    "TopKEvent",
    "TopKSubscription",
    "bbox_diagonal",
    "event_from_dict",
    "event_to_dict",
    "predicate_holds",
    "ranked",
    "read_events",
    "read_subscriptions",
    "score",
    "subscription_from_dict",
    "subscription_to_dict",
    "validate_attr",
    "validate_k",
]
"""The predicate model lives in ``shard.attributes`` (shared with boolean subscriptions); its
names are re-exported here for the top-k code."""

MAX_EVENT_ATTRS = MAX_ATTRIBUTES
"""Attributes of one event (``shard.attributes.MAX_ATTRIBUTES``, the name kept for callers)."""

DEFAULT_MAX_DIST = math.sqrt(360.0 * 360.0 + 180.0 * 180.0)
"""MaxDist of Eq. 4 unless an index is given another: the diagonal of [-180, 180] x [-90, 90]
in degrees, the largest distance two valid points can have, so ψ_s never needs clamping."""


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
def _point(field: str, value: Any) -> Point:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValidationError(field, value, "must be a list [lon, lat]")
    return validate_point(field, value[0], value[1])


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
    reject_unknown("", d, frozenset({"id", "predicates", "alpha", "point"}))
    sid = validate_id("id", d.get("id"))
    predicates = predicates_from_list("predicates", d.get("predicates"), weighted=True)
    alpha = validate_number("alpha", d.get("alpha", 0.5))
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
    reject_unknown("", d, frozenset({"id", "attributes", "point"}))
    eid = validate_id("id", d.get("id"))
    attrs = attributes_from_mapping("attributes", d.get("attributes", {}))
    if "point" not in d:
        raise ValidationError("point", None, "missing")
    return TopKEvent(eid, attrs, _point("point", d["point"]))


def subscription_to_dict(s: TopKSubscription) -> dict[str, Any]:
    """The JSON form; ``subscription_from_dict`` of it gives ``s`` back exactly."""
    return {
        "id": s.id,
        "predicates": predicates_to_list(s.predicates, weighted=True),
        "alpha": s.alpha,
        "point": [s.point.lon, s.point.lat],
    }


def event_to_dict(e: TopKEvent) -> dict[str, Any]:
    """The JSON form; ``event_from_dict`` of it gives ``e`` back exactly."""
    return {
        "id": e.id,
        "attributes": attributes_to_mapping(e.attributes),
        "point": [e.point.lon, e.point.lat],
    }


# ---- the reference score (Definition 3), plain Python -------------------------------------
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
