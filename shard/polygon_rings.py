"""Polygon regions as given: their validation and box, without any compiled code (the client
and the converter validate polygons too, and must not load numba; ``shard.polygon`` has the
compiled exact tests and re-exports these).

A polygon is given GeoJSON-style, ``[[[lon, lat], ...], [hole ...], ...]``: the first ring is the
exterior, the others are holes; every ring is closed (its last position repeats its first).
Coordinates are planar (lon, lat) degrees and edges are straight lines in (lon, lat), so a polygon
may not cross the antimeridian (split it in two).

Validity (rings that do not cross, holes inside the exterior) is GEOS's, through shapely 2
(``shapely.is_valid_reason``): a kept library, 7-80 us a polygon of up to 1,000 positions
(~1 ms if very spiky). A compiled all-pairs crossing test of our own took 0.5-0.8 ms at 1,000
positions for the self-crossing rule alone, without the rules for holes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import shapely

from shard.errors import ValidationError
from shard.limits import MAX_POLYGON_RINGS, MAX_POLYGON_VERTICES

Rings = tuple[tuple[tuple[float, float], ...], ...]
"""A validated polygon: its exterior ring, then its holes; each ring closed, positions floats."""

_VALID = "Valid Geometry"
_FINE_TYPES = frozenset({int, float})
_SEQ_TYPES = frozenset({list, tuple})


# ---------------------------------------------------------------------------------------------
# validation


def validate_polygon(field: str, value: Any) -> Rings:
    """The polygon ``value`` (``[[[lon, lat], ...], [hole ...], ...]``) checked and made of
    floats, or a ``ValidationError`` naming the exact position, ring or the whole (``field``,
    ``field[i]``, ``field[i][j]``, ``field[i][j][k]``).

    Checks: 1 to ``MAX_POLYGON_RINGS`` rings of at least 4 positions, ``MAX_POLYGON_VERTICES``
    positions in all; each position ``[lon, lat]`` of finite numbers in range; each ring closed,
    of nonzero area, with no edge spanning more than 180 degrees of longitude (the antimeridian);
    then OGC validity by GEOS: no ring crosses or touches itself, holes lie inside the exterior
    and cross neither it nor each other (touching at single points is allowed), and do not cut
    the interior in parts. O(n log n) in the positions n: ~0.3 ms at 1,000 for a plain outline
    (GEOS a third of it), ~1.2 ms for a very spiky one (GEOS's noding).

    >>> validate_polygon("polygon", [[[0, 0], [2, 0], [2, 2], [0, 0]]])
    (((0.0, 0.0), (2.0, 0.0), (2.0, 2.0), (0.0, 0.0)),)
    >>> validate_polygon("polygon", [[[0, 0], [2, 0], [2, 2], [0, 1]]])
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: polygon[0]=[[0, 0], [2, 0], [2, 2], [0, 1]]: ring is not closed: first position [0.0, 0.0] != last [0.0, 1.0]
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValidationError(
            field,
            value,
            "must be a list of rings [[[lon, lat], ...], ...]: the exterior, then holes",
        )
    if not 1 <= len(value) <= MAX_POLYGON_RINGS:
        raise ValidationError(
            field, value, f"must hold 1-{MAX_POLYGON_RINGS} rings (the exterior, then holes)"
        )
    for i, ring in enumerate(value):
        if isinstance(ring, str | bytes) or not isinstance(ring, Sequence):
            raise ValidationError(f"{field}[{i}]", ring, "a ring must be a list of [lon, lat]")
        if len(ring) < 4:
            raise ValidationError(
                f"{field}[{i}]",
                ring,
                "a ring needs at least 4 positions (3 corners, then the first again to close it)",
            )
    total = sum(len(ring) for ring in value)
    if total > MAX_POLYGON_VERTICES:
        raise ValidationError(
            field,
            value,
            f"{total} positions in all rings; at most {MAX_POLYGON_VERTICES} (closing ones included)",
        )
    arrays = []
    plain = True  # every coordinate a float already: the input's positions are the output's
    for i, ring in enumerate(value):
        xy, floats = _ring_array(f"{field}[{i}]", ring)
        arrays.append(xy)
        plain = plain and floats
    reason = shapely.is_valid_reason(shapely.Polygon(arrays[0], arrays[1:]))
    if reason != _VALID:
        _raise_invalid(field, value, arrays, reason)
    if plain:
        return tuple(tuple(map(tuple, ring)) for ring in value)
    return tuple(tuple(zip(xy[:, 0].tolist(), xy[:, 1].tolist(), strict=True)) for xy in arrays)


def _ring_array(field: str, ring: Sequence[Any]) -> tuple[np.ndarray, bool]:
    """The ring's positions as an (n, 2) float64 array, checked (``_ring_fault``), and whether
    they all were Python floats. A fast path for lists of plain numbers; the slow pass, position
    by position, names the first bad one."""
    xy = None
    floats = False
    try:
        if set(map(type, ring)) <= _SEQ_TYPES and set(map(len, ring)) == {2}:
            flat = list(chain.from_iterable(ring))
            types = set(map(type, flat))
            if types <= _FINE_TYPES:
                xy = np.array(flat, dtype=np.float64).reshape(-1, 2)
                floats = types == {float}
    except (TypeError, OverflowError):  # a position without a length, an int beyond float
        pass
    if xy is None:
        xy = _slow_ring_array(field, ring)
    fault, j = _ring_fault(xy)
    if fault == _BAD_COORDINATE:
        _slow_ring_array(field, ring)  # raises, naming it
    if fault == _NOT_CLOSED:
        first, last = xy[0].tolist(), xy[-1].tolist()
        raise ValidationError(
            field, ring, f"ring is not closed: first position {first} != last {last}"
        )
    if fault == _WIDE_EDGE:
        span = abs(xy[j + 1, 0] - xy[j, 0])
        raise ValidationError(
            f"{field}[{j}]",
            ring[j],
            f"the edge to position {j + 1} spans {span:g} degrees of longitude: crosses the "
            "antimeridian? polygons are planar in lon/lat; split it into two subscriptions",
        )
    if fault == _FLAT:
        raise ValidationError(
            field, ring, "ring is degenerate: its area is 0 (its positions lie on one line)"
        )
    return xy, floats


def _slow_ring_array(field: str, ring: Sequence[Any]) -> np.ndarray:
    out = np.empty((len(ring), 2), dtype=np.float64)
    for j, pos in enumerate(ring):
        if isinstance(pos, str | bytes) or not isinstance(pos, Sequence) or len(pos) != 2:
            raise ValidationError(f"{field}[{j}]", pos, "a position must be [lon, lat]")
        out[j, 0] = _coordinate(f"{field}[{j}][0]", pos[0], 180.0, "longitude")
        out[j, 1] = _coordinate(f"{field}[{j}][1]", pos[1], 90.0, "latitude")
    return out


def _coordinate(field: str, value: Any, limit: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, value, "must be a number")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ValidationError(field, value, "must be finite")
    if not -limit <= x <= limit:
        raise ValidationError(field, value, f"{name} must be in [{-limit:g}, {limit:g}]")
    return x


_BAD_COORDINATE = 1
_NOT_CLOSED = 2
_WIDE_EDGE = 3
_FLAT = 4


def _ring_fault(xy: np.ndarray) -> tuple[int, int]:
    """The first fault of a ring of (n, 2) positions, as (code, position): ``_BAD_COORDINATE``
    (not finite, or out of range: NaN fails every comparison), ``_NOT_CLOSED``, ``_WIDE_EDGE``
    (the edge from the position spans more than 180 degrees of longitude: the antimeridian), or
    ``_FLAT`` (every position on the line from the first to the farthest, so the area is 0; a
    signed area of 0 would also reject a symmetric bow-tie, which GEOS names better; products
    below ~1e-324 round to 0, so a ring a few 1e-162 degrees across is flat too); (0, 0) if
    none. A few vectorised passes (~20 us a ring). O(n).

    >>> _ring_fault(np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 0.0]]))
    (4, 0)
    """
    n = len(xy)
    bad = np.flatnonzero(~((np.abs(xy[:, 0]) <= 180.0) & (np.abs(xy[:, 1]) <= 90.0)))
    if bad.size:
        return _BAD_COORDINATE, int(bad[0])
    if xy[0, 0] != xy[n - 1, 0] or xy[0, 1] != xy[n - 1, 1]:
        return _NOT_CLOSED, n - 1
    wide = np.flatnonzero(np.abs(np.diff(xy[:, 0])) > 180.0)
    if wide.size:
        return _WIDE_EDGE, int(wide[0])
    rel = xy - xy[0]
    far = int(np.argmax(np.abs(rel[:-1, 0]) + np.abs(rel[:-1, 1])))
    fx, fy = rel[far, 0], rel[far, 1]
    if np.any(rel[:, 0] * fy - rel[:, 1] * fx != 0.0):
        return 0, 0
    return _FLAT, 0


def _raise_invalid(field: str, value: Sequence[Any], arrays: list[np.ndarray], reason: str):
    """Name the ring that makes the polygon invalid: the shortest invalid prefix of the rings
    (exterior, holes 1..j), found by bisection. Adding a hole never makes an invalid polygon
    valid, so the prefixes' validity is monotone; ~log2(rings) GEOS calls, on rejection only."""
    lo, hi = 0, len(arrays) - 1  # rings[:hi + 1] is invalid
    last = reason
    while lo < hi:
        mid = (lo + hi) // 2
        r = shapely.is_valid_reason(shapely.Polygon(arrays[0], arrays[1 : mid + 1]))
        if r == _VALID:
            lo = mid + 1
        else:
            hi, last = mid, r
    raise ValidationError(f"{field}[{hi}]", value[hi], _explain(last, hi))


_GEOS_REASONS = (
    ("Ring Self-intersection", "the ring touches itself"),
    ("Self-intersection", "the ring crosses itself"),
    ("Hole lies outside shell", "the hole is not inside the exterior ring"),
    ("Holes are nested", "the hole lies inside another hole"),
    ("Interior is disconnected", "the holes cut the polygon's interior in parts"),
    ("Too few", "the ring has fewer than 3 distinct corners"),
)


def _explain(reason: str, ring: int) -> str:
    """A GEOS validity reason (``Self-intersection[0.5 0.5]``) in words, its place kept.

    >>> _explain("Self-intersection[0.5 0.5]", 1)
    'the ring crosses itself, the exterior or another hole at (0.5, 0.5) (GEOS: Self-intersection)'
    """
    name, _, where = reason.partition("[")
    text = name
    for prefix, words in _GEOS_REASONS:
        if name.startswith(prefix):
            text = words
            break
    if ring > 0 and name == "Self-intersection":
        text += ", the exterior or another hole"
    if where:
        text += f" at ({', '.join(where.rstrip(']').split())})"
    return f"{text} (GEOS: {name})"


def rings_bbox(rings: Rings) -> tuple[float, float, float, float]:
    """The box (min_lon, min_lat, max_lon, max_lat) of a validated polygon: its exterior's (the
    holes lie inside it). The index stores and routes the polygon by it. O(n).

    >>> rings_bbox((((0.0, 1.0), (3.0, 1.0), (2.0, 5.0), (0.0, 1.0)),))
    (0.0, 1.0, 3.0, 5.0)
    """
    xs = [p[0] for p in rings[0]]
    ys = [p[1] for p in rings[0]]
    return min(xs), min(ys), max(xs), max(ys)
