"""Typed attributes and attribute predicates, shared by boolean subscriptions (a conjunction
that must hold on a message's attributes) and the top-k subscriptions of ``shard.topk`` (the
same predicates, weighted): the predicate model, its validation and JSON form, its limits and
the reference semantics ``predicate_holds`` / ``all_hold``. Plain Python, no numba (the client
validates with it); the compiled check over columns is ``shard.predicates``.

JSON form: predicates are a list of ``{"attr": "price", "op": "<=", "value": 5}`` objects
(top-k ones add ``"weight": 0.3``), attributes an object ``{"price": 4.5, "category": "food"}``.
Operators (paper 001's Table 2): ``=`` (alias ``==``), ``!=``, ``<``, ``<=``, ``>``, ``>=``,
``in``, ``not in``, ``between`` (alias ``range``; ``[lo, hi]``, both ends included).
``<, <=, >, >=, between`` take numbers; ``=, !=, in, not in`` take a number or a string (an
``in`` list is all numbers or all strings). Numbers are float64 from parsing on (an integer
beyond 2^53 is rounded), so every implementation compares the same values; a bool, NaN or an
infinity is refused.

Exact semantics of a predicate, used by every matcher:

* A predicate on an attribute the message (event) lacks does not hold.
* A predicate holds only on a value of its own type: a string predicate never holds on a
  number and a number predicate never on a string -- ``!=`` and ``not in`` included (``price !=
  "x"`` does not hold on ``price = 5``).
* ``!=`` holds iff the value differs; ``not in`` iff it is not in the list.

One attribute per subscription: a repeated attribute is refused (``between`` expresses a
range, an ``in`` list several values); top-k's bounds need it (``shard.topk.model``), and one
rule serves both kinds of subscription.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shard.errors import ValidationError

MAX_PREDICATES = 32
"""Predicates in one subscription. Paper 001's longest subscriptions have 6 (Table 4, L_s)."""

MAX_SET_VALUES = 64
"""Values in an ``in`` / ``not in`` list (a binary search in the kernels)."""

MAX_ATTR_NAME_LEN = 64
"""Characters of an attribute name (1-64 printable characters)."""

MAX_STRING_VALUE_LEN = 256
"""Characters of a string value (predicate or attribute)."""

MAX_ATTRIBUTES = 64
"""Attributes of one message or event. Paper 001's longest events have 14 (Table 4, L_e)."""

WEIGHT_SUM_TOLERANCE = 1e-9
MIN_WEIGHT_SHARE = 1e-9
"""The smallest share of its subscription's weights a predicate's weight may have: below it,
normalising would round it towards nothing (or to 0.0)."""
"""Weights whose sum is within this of 1 are kept as given (``predicates_from_list``)."""

OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "between")
"""Canonical operator names; the index of each is its op code in the compiled columns."""

OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOT_IN, OP_BETWEEN = range(9)

ALIASES = {"==": "=", "range": "between"}
"""Other spellings accepted on input; a predicate always carries the canonical name."""

NUMERIC_ONLY_OPS = frozenset({"<", "<=", ">", ">=", "between"})
SET_OPS = frozenset({"in", "not in"})

Scalar = float | str


@dataclass(frozen=True, slots=True)
class Predicate:
    """``<attr, op, value, weight>``; ``value`` is a float or str, a sorted tuple of distinct
    floats or strs (``in`` / ``not in``) or ``(lo, hi)`` floats (``between``); ``weight`` is the
    normalised ω of a top-k subscription (1.0 and unused in a boolean one)."""

    attr: str
    op: str
    value: Scalar | tuple[Scalar, ...]
    weight: float = 1.0

    @property
    def is_string(self) -> bool:
        v = self.value
        return isinstance(v[0] if isinstance(v, tuple) else v, str)


# ---- validation ------------------------------------------------------------------------------
def validate_number(field: str, value: Any) -> float:
    """A finite int or float (not a bool) as a float.

    >>> validate_number("x", 3)
    3.0
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number")
    try:
        x = float(value)
    except OverflowError:
        raise ValidationError(field, value, "must be finite") from None
    if not math.isfinite(x):
        raise ValidationError(field, value, "must be finite")
    return x


def validate_scalar(field: str, value: Any) -> Scalar:
    """A string of at most ``MAX_STRING_VALUE_LEN`` characters or a number (as a float).

    >>> validate_scalar("x", 2), validate_scalar("x", "food")
    (2.0, 'food')
    """
    if isinstance(value, str):
        if len(value) > MAX_STRING_VALUE_LEN:
            raise ValidationError(field, value, f"longer than {MAX_STRING_VALUE_LEN} characters")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number or a string")
    return validate_number(field, value)


def validate_attr(field: str, value: Any) -> str:
    """An attribute name: 1-64 printable characters."""
    if not isinstance(value, str):
        raise ValidationError(field, value, "must be a string")
    if not 1 <= len(value) <= MAX_ATTR_NAME_LEN:
        raise ValidationError(field, value, f"must be 1-{MAX_ATTR_NAME_LEN} characters")
    if not value.isprintable():
        raise ValidationError(field, value, "must contain printable characters only")
    return value


def reject_unknown(where: str, d: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Raise on the first key of ``d`` not in ``allowed`` (field ``where`` + key)."""
    for k in d:
        if k not in allowed:
            raise ValidationError(f"{where}{k}", d[k], "unknown field")


def _predicate_value(field: str, op: str, value: Any) -> Scalar | tuple[Scalar, ...]:
    if op == "between":
        if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
            raise ValidationError(field, value, "must be a list [lo, hi] of numbers")
        lo = validate_number(f"{field}[0]", value[0])
        hi = validate_number(f"{field}[1]", value[1])
        if lo > hi:
            raise ValidationError(f"{field}[1]", value[1], f"hi < lo {value[0]}")
        return (lo, hi)
    if op in SET_OPS:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ValidationError(field, value, "must be a list of numbers or of strings")
        if not 1 <= len(value) <= MAX_SET_VALUES:
            raise ValidationError(field, value, f"must hold 1-{MAX_SET_VALUES} values")
        items = [validate_scalar(f"{field}[{i}]", v) for i, v in enumerate(value)]
        is_str = isinstance(items[0], str)
        for i, v in enumerate(items):
            if isinstance(v, str) != is_str:
                raise ValidationError(
                    f"{field}[{i}]", value[i], "an in-list is all numbers or all strings"
                )
        return tuple(sorted(set(items)))  # type: ignore[type-var]
    if op in NUMERIC_ONLY_OPS:
        return validate_number(field, value)
    return validate_scalar(field, value)


def predicates_from_list(field: str, value: Any, *, weighted: bool) -> tuple[Predicate, ...]:
    """Validate a list of 1-``MAX_PREDICATES`` predicate objects (errors name
    ``f"{field}[i].op"`` etc.). ``weighted``: each may carry a positive finite ``weight``
    (default 1), and the weights are divided by their sum unless it is within
    ``WEIGHT_SUM_TOLERANCE`` of 1 (so serialised weights parse back to the same floats);
    otherwise a ``weight`` is an unknown field and every weight is 1.0. A boolean
    subscription without predicates leaves the field out. O(predicates · values).

    >>> ps = predicates_from_list("where", [{"attr": "price", "op": "<=", "value": 5},
    ...     {"attr": "cat", "op": "in", "value": ["b", "a"]}], weighted=False)
    >>> [(p.attr, p.op, p.value) for p in ps]
    [('price', '<=', 5.0), ('cat', 'in', ('a', 'b'))]
    >>> predicates_from_list("where", [{"attr": "a", "op": "=", "value": 1, "weight": 2}],
    ...     weighted=False)
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: where[0].weight=2: unknown field
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValidationError(field, value, "must be a list of predicates")
    if not 1 <= len(value) <= MAX_PREDICATES:
        raise ValidationError(field, value, f"must hold 1-{MAX_PREDICATES} predicates")
    allowed = frozenset({"attr", "op", "value", "weight"} if weighted else {"attr", "op", "value"})
    seen: dict[str, int] = {}
    raw: list[tuple[str, str, Any, float]] = []
    for i, p in enumerate(value):
        f = f"{field}[{i}]"
        if not isinstance(p, Mapping):
            raise ValidationError(f, p, "must be an object")
        reject_unknown(f"{f}.", p, allowed)
        attr = validate_attr(f"{f}.attr", p.get("attr"))
        if attr in seen:
            raise ValidationError(
                f"{f}.attr",
                attr,
                f"attribute already constrained by {field}[{seen[attr]}] (use between)",
            )
        seen[attr] = i
        op = p.get("op")
        op = ALIASES.get(op, op) if isinstance(op, str) else op
        if op not in OPS:
            raise ValidationError(f"{f}.op", p.get("op"), f"must be one of {', '.join(OPS)}")
        if "value" not in p:
            raise ValidationError(f"{f}.value", None, "missing")
        v = _predicate_value(f"{f}.value", op, p["value"])
        w = 1.0
        if weighted:
            w = validate_number(f"{f}.weight", p.get("weight", 1.0))
            if w <= 0.0:
                raise ValidationError(f"{f}.weight", p.get("weight"), "must be > 0")
        raw.append((attr, op, v, w))
    if not weighted:
        return tuple(Predicate(a, o, v) for a, o, v, _ in raw)
    try:
        total = math.fsum(r[3] for r in raw)
    except OverflowError:  # fsum raises where sum would give inf
        total = math.inf
    if not math.isfinite(total):
        raise ValidationError(field, value, "the weights' sum must be finite")
    scale = abs(total - 1.0) > WEIGHT_SUM_TOLERANCE
    out = tuple(Predicate(a, o, v, (w / total) if scale else w) for a, o, v, w in raw)
    for i, p in enumerate(out):
        if not p.weight >= MIN_WEIGHT_SHARE:
            raise ValidationError(
                f"{field}[{i}].weight",
                raw[i][3],
                f"below {MIN_WEIGHT_SHARE:g} of the weights' sum (it would count as nothing)",
            )
    return out


def attributes_from_mapping(field: str, value: Any) -> tuple[tuple[str, Scalar], ...]:
    """Validate an attributes object (at most ``MAX_ATTRIBUTES`` names, values numbers or
    strings; errors name ``f"{field}.{name}"``); the pairs sorted by name. O(n log n).

    >>> attributes_from_mapping("attributes", {"price": 4, "cat": "a"})
    (('cat', 'a'), ('price', 4.0))
    """
    if not isinstance(value, Mapping):
        raise ValidationError(field, value, "must be an object")
    if len(value) > MAX_ATTRIBUTES:
        raise ValidationError(field, value, f"at most {MAX_ATTRIBUTES} attributes")
    items = []
    for name, v in value.items():
        validate_attr(f"{field}.{name}", name)
        items.append((name, validate_scalar(f"{field}.{name}", v)))
    items.sort(key=lambda t: t[0])
    return tuple(items)


def _json_value(v: Scalar | tuple[Scalar, ...]) -> Any:
    return list(v) if isinstance(v, tuple) else v


def predicates_to_list(preds: Sequence[Predicate], *, weighted: bool) -> list[dict[str, Any]]:
    """The JSON form; ``predicates_from_list`` of it (same ``weighted``) gives ``preds`` back.

    >>> predicates_to_list([Predicate("a", "between", (1.0, 2.0))], weighted=False)
    [{'attr': 'a', 'op': 'between', 'value': [1.0, 2.0]}]
    """
    if weighted:
        return [
            {"attr": p.attr, "op": p.op, "value": _json_value(p.value), "weight": p.weight}
            for p in preds
        ]
    return [{"attr": p.attr, "op": p.op, "value": _json_value(p.value)} for p in preds]


def attributes_to_mapping(attrs: Sequence[tuple[str, Scalar]]) -> dict[str, Scalar]:
    """The JSON form; ``attributes_from_mapping`` of it gives ``attrs`` back."""
    return dict(attrs)


# ---- the reference semantics, plain Python ---------------------------------------------------
def predicate_holds(p: Predicate, value: Scalar | None) -> bool:
    """Whether ``p`` holds on ``value`` (``None``: the attribute is missing), with the exact
    semantics of the module docstring. O(1), O(list) for ``in``.

    >>> p = Predicate("a", "not in", ("x", "y"))
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


def all_hold(preds: Sequence[Predicate], attrs: Mapping[str, Scalar]) -> bool:
    """Whether every predicate holds on the attributes ``attrs`` (name -> value); true for no
    predicates. The oracle of ``shard.predicates.check_pairs``. O(predicates).

    >>> ps = (Predicate("price", "<", 5.0), Predicate("cat", "!=", "x"))
    >>> all_hold(ps, {"price": 4.5, "cat": "food"}), all_hold(ps, {"price": 4.5})
    (True, False)
    """
    return all(predicate_holds(p, attrs.get(p.attr)) for p in preds)
