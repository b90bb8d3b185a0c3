"""The bytes a round and its answer travel as between the coordinator and a shard actor.

Nothing that arrives from a network is unpickled: a round (``shard.ops``' operations) and its
answer (``apply_ops``' result) are msgpack (plain values: strings, numbers, lists, bytes), so a
hostile peer can at worst send values the shard then refuses (``ValidationError``), never code.
Arrays travel as raw little-endian buffers of a fixed dtype.

A round is a list of operations, each a list whose first item says its kind:

    ["P", id, terms, location, ttl(, attributes)]
                                          publish (location: [lon, lat] or [x0, y0, x1, y1];
                                          attributes {name: number or string}, when any)
    ["S", id, clauses, region, moving, keywords, expr, tag(, extras)]
                                          subscribe (region: [0, x0, y0, x1, y1],
                                          [1, lon, lat, radius_m] or [2, rings, box], as
                                          ``subscriptions_to_rows``; extras for one that is
                                          not plain: {"negated": [[term]] or None,
                                          "predicates": [{"attr", "op", "value"}],
                                          "ranked": [threshold, alpha, weights or
                                          None] or None})
    ["U", id] / ["D", id]                 unsubscribe / detach
    ["M", id, lon, lat]                   move
    ["K", id, [lon, lat], attributes, k, terms]
                                          a top-k publish (its message's id, point,
                                          attributes and terms)

A top-k subscription (``Subscription.topk``) travels as an "S" whose region is
``[3, lon, lat]``, with extras ``{"topk": [predicates with weights, alpha]}``.

An answer is ``[expired ids, holders per id (int64), holders' tags (int32), per-operation
results, publishes' tags (int32)]``; a per-operation result is a count (publish), a list of
``[subscription, sign, message]`` updates (``shard.model.Sign``'s values, 0 or 1), a top-k
answer ``{"k": [tags (int32), scores (float64)]}``, or an error ``{"e": kind, "a": args}``.

>>> from shard.model import Message, Point, Rect, Subscription
>>> s = Subscription("s", (("x",),), Rect(0.0, 0.0, 1.0, 1.0), moving=True)
>>> ops = [("sub", s, 4), ("pub", Message("m", ("x",), Point(0.5, 0.5), 9.0)), ("unsub", "t")]
>>> loads_ops(dumps_ops(ops)) == ops
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from shard.attributes import attributes_from_mapping, predicates_from_list, predicates_to_list
from shard.errors import ExpressionError, NotFoundError, ValidationError
from shard.model import (
    Circle,
    Message,
    Point,
    Polygon,
    Rect,
    Region,
    Subscription,
    TopKAnswer,
    validate_rect,
)
from shard.polygon_rings import validate_polygon

_OP_CODES = {"pub": "P", "sub": "S", "unsub": "U", "detach": "D", "move": "M", "topk": "K"}
_ERRORS: dict[str, type] = {"V": ValidationError, "X": ExpressionError, "N": NotFoundError}
_I64 = np.dtype("<i8")
_I32 = np.dtype("<i4")
_F64 = np.dtype("<f8")


def _plain(value: Any) -> Any:
    """An error's value as msgpack can carry it (its text where it is no plain value)."""
    return value if isinstance(value, str | int | float | bool | None) else repr(value)


def _op(op: tuple) -> list:
    kind = op[0]
    if kind == "pub":
        m = op[1]
        loc = m.location
        out = ["P", m.id, m.terms, loc.__reduce__()[1], m.ttl]  # (lon, lat) or (x0, y0, x1, y1)
        if m.attributes:
            out.append(dict(m.attributes))
        return out
    if kind == "topk":
        m = op[1]
        point = [m.location.lon, m.location.lat]
        return ["K", m.id, point, dict(m.attributes), op[2], m.terms]
    if kind == "sub":
        s = op[1]
        r = s.region
        if type(r) is Point:
            ranked = [predicates_to_list(s.predicates, weighted=True), s.alpha]
            return ["S", s.id, (), [3, r.lon, r.lat], s.moving, None, None, op[2], {"topk": ranked}]
        if type(r) is Rect:
            region = [0, r.min_lon, r.min_lat, r.max_lon, r.max_lat]
        elif type(r) is Circle:
            region = [1, r.lon, r.lat, r.radius_m]
        else:
            region = [2, r.rings, r.box]
        tag = op[2] if len(op) > 2 else -1
        out = ["S", s.id, s.clauses, region, s.moving, s.keywords, s.expr, tag]
        if not s.plain:
            preds = predicates_to_list(s.predicates, weighted=False)
            ranked = None if s.threshold is None else [s.threshold, s.alpha, s.weights]
            out.append({"negated": s.negated, "predicates": preds, "ranked": ranked})
        return out
    if kind == "move":
        return ["M", op[1], op[2].lon, op[2].lat]
    return [_OP_CODES[kind], op[1]]


def dumps_ops(ops: Sequence[tuple]) -> bytes:
    """A round's operations as bytes (``loads_ops``). A publish travels as plain values: a shard
    needs nothing else of a message (the coordinator keeps what was published)."""
    return msgpack.packb([_op(op) for op in ops])


def _region(r: Any) -> Region:
    if not isinstance(r, tuple) or not r:
        raise ValidationError("region", r, "must be [0, x0, y0, x1, y1], [1, lon, lat, radius_m] or [2, rings, box]")  # fmt: skip
    if r[0] == 0 and len(r) == 5:
        return Rect(float(r[1]), float(r[2]), float(r[3]), float(r[4]))
    if r[0] == 1 and len(r) == 4:
        return Circle(float(r[1]), float(r[2]), float(r[3]))
    if r[0] == 2 and len(r) == 3:  # rings validated as from any client, the box as a rect
        poly = Polygon.of(validate_polygon("region.polygon", r[1]))
        box = validate_rect("region.box", r[2])
        return Polygon(poly.rings, poly.base, (box.min_lon, box.min_lat, box.max_lon, box.max_lat))
    raise ValidationError(
        "region", r, "must be [0, x0, y0, x1, y1], [1, lon, lat, radius_m] or [2, rings, box]"
    )


def _extras(i: int, x: Any, n_clauses: int, n_terms: int) -> tuple:
    """(negated, predicates, threshold, alpha, weights) of a subscription that is not plain,
    validated."""
    if not isinstance(x, dict) or set(x) != {"negated", "predicates", "ranked"}:
        raise ValidationError(f"ops[{i}].extras", x, "must be {negated, predicates, ranked}")
    neg = x["negated"]
    if neg is not None:
        if not isinstance(neg, tuple) or len(neg) != n_clauses:
            raise ValidationError(f"ops[{i}].negated", neg, "must hold a list per clause")
        neg = tuple(_strings(n, f"ops[{i}].negated") for n in neg)
    preds = x["predicates"]
    if preds:
        preds = predicates_from_list(f"ops[{i}].predicates", list(preds), weighted=False)
    ranked = x["ranked"]
    if ranked is None:
        return neg, tuple(preds), None, 0.5, None
    if not isinstance(ranked, tuple) or len(ranked) != 3:
        raise ValidationError(f"ops[{i}].ranked", ranked, "must be [threshold, alpha, weights]")
    theta, alpha, weights = ranked
    if weights is not None and (
        not isinstance(weights, tuple)
        or len(weights) != n_terms
        or not all(type(w) is float and w > 0 and math.isfinite(w) for w in weights)
    ):
        raise ValidationError(f"ops[{i}].weights", weights, "must be a weight > 0 per term")
    if type(theta) is not float or not 0.0 < theta <= 1.0:
        raise ValidationError(f"ops[{i}].threshold", theta, "must be a number in (0, 1]")
    if type(alpha) is not float or not 0.0 <= alpha < 1.0:
        raise ValidationError(f"ops[{i}].alpha", alpha, "must be a number in [0, 1)")
    return neg, tuple(preds), theta, alpha, weights


def _location(xy: Sequence) -> Point | Rect:
    if len(xy) == 2:
        return Point(*xy)
    if len(xy) == 4:
        return Rect(*xy)
    raise ValidationError("location", xy, "must be [lon, lat] or [x0, y0, x1, y1]")


def _strings(values: Any, field: str) -> tuple[str, ...]:
    if not isinstance(values, tuple) or not all(type(v) is str for v in values):
        raise ValidationError(field, values, "must be a list of strings")
    return values


def _decode_op(i: int, w: Any) -> tuple:
    if not isinstance(w, tuple) or not w or not isinstance(w[0], str):
        raise ValidationError(f"ops[{i}]", w, "must be a list starting with its kind")
    code, n = w[0], len(w)
    if code == "P" and n in (5, 6):  # (the shard checks every message's fields: ShardState)
        attrs = attributes_from_mapping(f"ops[{i}].attributes", w[5]) if n == 6 else ()
        return ("pub", Message(w[1], w[2], _location(w[3]), w[4], attributes=attrs))
    if code == "S" and n == 9 and isinstance(w[3], tuple) and w[3][:1] == (3,):
        return ("sub", _topk_sub(i, w), w[7])
    if code == "K" and n == 6:
        if not isinstance(w[2], tuple) or len(w[2]) != 2:
            raise ValidationError(f"ops[{i}].point", w[2], "must be [lon, lat]")
        attrs = attributes_from_mapping(f"ops[{i}].attributes", w[3])
        terms = _strings(w[5], f"ops[{i}].terms")
        if not all(terms):
            raise ValidationError(f"ops[{i}].terms", terms, "a term may not be empty")
        return ("topk", Message(w[1], terms, Point(*w[2]), None, attributes=attrs), w[4])
    if code == "S" and n in (8, 9):
        if not isinstance(w[2], tuple):
            raise ValidationError(f"ops[{i}].clauses", w[2], "must be a list of lists")
        clauses = tuple(_strings(c, f"ops[{i}].clauses") for c in w[2])
        keywords = None if w[5] is None else _strings(w[5], f"ops[{i}].keywords")
        extras = _extras(i, w[8], len(clauses), len(clauses[0])) if n == 9 else ()
        sub = Subscription(w[1], clauses, _region(w[3]), w[4], keywords, w[6], *extras)
        return ("sub", sub, w[7])
    if code == "M" and n == 4:
        return ("move", w[1], Point(float(w[2]), float(w[3])))
    if code == "U" and n == 2:
        return ("unsub", w[1])
    if code == "D" and n == 2:
        return ("detach", w[1])
    raise ValidationError(f"ops[{i}]", w, "unknown operation or wrong length")


def _topk_sub(i: int, w: tuple) -> Subscription:
    """A top-k subscription's "S" (region ``[3, lon, lat]``); the shard validates its fields
    (``ShardState``), weights included."""
    r, x = w[3], w[8]
    if len(r) != 3 or not isinstance(x, dict) or set(x) != {"topk"} or len(x["topk"]) != 2:
        raise ValidationError(f"ops[{i}]", w, "a top-k subscription is [3, lon, lat] + {topk}")
    if w[2] != () or w[5] is not None or w[6] is not None:
        raise ValidationError(f"ops[{i}]", w, "a top-k subscription has no clauses nor keywords")
    raw, alpha = x["topk"]
    preds = predicates_from_list(f"ops[{i}].predicates", list(raw), weighted=True)
    return Subscription(
        w[1], (), Point(float(r[1]), float(r[2])), w[4], predicates=preds, alpha=alpha
    )


def loads_ops(data: bytes) -> list[tuple]:
    """The operations ``dumps_ops`` wrote; values of the wrong shape raise ``ValidationError``
    (the shard validates the subscriptions and messages themselves as for any caller)."""
    try:
        wire = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ValidationError("ops", f"{len(data)} bytes", f"not a round: {exc}") from None
    if not isinstance(wire, tuple):
        raise ValidationError("ops", type(wire).__name__, "must be a list")
    try:
        return [_decode_op(i, w) for i, w in enumerate(wire)]
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError("ops", "...", f"malformed operation: {exc!r}") from None


def _error(exc: Exception) -> dict:
    if isinstance(exc, NotFoundError):
        return {"e": "N", "a": [exc.kind, exc.ident]}
    if isinstance(exc, ValidationError):
        code = "X" if isinstance(exc, ExpressionError) else "V"
        return {"e": code, "a": [exc.field, _plain(exc.value), exc.reason]}
    raise TypeError(f"cannot send {type(exc).__name__} as an operation's result")


def _result(r: Any) -> Any:
    if isinstance(r, int):
        return r
    if isinstance(r, Exception):
        return _error(r)
    if isinstance(r, TopKAnswer):
        tags = np.ascontiguousarray(r.tags, _I32).tobytes()
        return {"k": [tags, np.ascontiguousarray(r.scores, _F64).tobytes()]}
    return r  # a list of (subscription, sign, message) updates


def dumps_result(result: tuple) -> bytes:
    """``apply_ops``' answer as bytes (``loads_result``)."""
    (mids, counts, holders), out, tags = result
    return msgpack.packb(
        [
            mids,
            np.ascontiguousarray(counts, _I64).tobytes(),
            np.ascontiguousarray(holders, _I32).tobytes(),
            [_result(r) for r in out],
            np.ascontiguousarray(tags, _I32).tobytes(),
        ]
    )


def _array(buf: Any, dtype: np.dtype) -> np.ndarray:
    if not isinstance(buf, bytes) or len(buf) % dtype.itemsize:
        raise ValidationError("answer", type(buf).__name__, f"must be a buffer of {dtype}")
    return np.frombuffer(buf, dtype).astype(dtype.newbyteorder("="), copy=True)


def _decode_result(r: Any) -> Any:
    if isinstance(r, dict) and "k" in r:
        tags, scores = r["k"]
        answer = TopKAnswer(_array(tags, _I32), _array(scores, _F64))
        if answer.tags.shape != answer.scores.shape:
            raise ValidationError("answer", r, "a top-k answer's tags and scores differ in length")
        return answer
    if isinstance(r, dict):
        cls = _ERRORS.get(r.get("e"))
        if cls is None:
            raise ValidationError("answer", r, "unknown error kind")
        return cls(*r["a"])
    if isinstance(r, tuple):
        return list(r)  # of (subscription, sign, message) tuples, as ``apply_ops`` gives them
    return r


def loads_result(data: bytes) -> tuple:
    """The answer ``dumps_result`` wrote: ((ids, counts, tags), results, tags)."""
    try:
        mids, counts, holders, out, tags = msgpack.unpackb(data, use_list=False, raw=False)
        return (
            (list(mids), _array(counts, _I64), _array(holders, _I32)),
            [_decode_result(r) for r in out],
            _array(tags, _I32),
        )
    except (ValueError, TypeError, KeyError, msgpack.ExtraData, msgpack.FormatError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(
            "answer", f"{len(data)} bytes", f"not a round's answer: {exc}"
        ) from None
