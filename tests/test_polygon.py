"""Polygon regions: validation names the bad field; the compiled exact tests agree with shapely
(GEOS) away from the boundary and are exact on vertices and axis-parallel edges;
``PolygonColumns`` keeps its answers through removals and compaction."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import shapely
from hypothesis import assume, given
from hypothesis import strategies as st

from shard.errors import ValidationError
from shard.limits import MAX_POLYGON_RINGS, MAX_POLYGON_VERTICES
from shard.polygon import (
    MSG_POINT,
    MSG_RECT,
    PolygonColumns,
    check_pairs,
    point_in_polygon,
    polygon_hits,
    polygon_hits_rect,
    rings_bbox,
    validate_polygon,
)

# --------------------------------------------------------------------------------------------
# random simple polygons: star-shaped around a centre (sorted angles, every gap < pi), with
# optional star-shaped holes well inside the disc the exterior surely contains


@st.composite
def _star(draw, cx, cy, rmin, rmax, min_n=3, max_n=40):
    n = draw(st.integers(min_n, max_n))
    weights = draw(st.lists(st.floats(1.0, 1.9), min_size=n, max_size=n))
    start = draw(st.floats(0.0, 2 * math.pi))
    radii = draw(st.lists(st.floats(rmin, rmax), min_size=n, max_size=n))
    total = sum(weights)
    ring, angle = [], start
    for w, r in zip(weights, radii, strict=True):
        ring.append([cx + r * math.cos(angle), cy + r * math.sin(angle)])
        angle += 2 * math.pi * w / total
    return ring + [list(ring[0])]


@st.composite
def polygons(draw):
    """A valid polygon (lists, as a client sends it): an exterior of 6+ corners (its widest gap
    is under 1.73 rad, so it holds the disc of 0.65 * rmin around the centre) and 0-2 holes of
    radius under 0.1 * rmin, 0.3 * rmin apart."""
    cx = draw(st.floats(-170.0, 170.0))
    cy = draw(st.floats(-80.0, 80.0))
    rmin = draw(st.floats(0.01, 4.0))
    rmax = rmin * draw(st.floats(1.0, 2.5))
    rings = [draw(_star(cx, cy, rmin, rmax, min_n=6))]
    for k in range(draw(st.integers(0, 2))):
        hx = cx + (0.15 if k == 0 else -0.15) * rmin
        rings.append(draw(_star(hx, cy, 0.02 * rmin, 0.09 * rmin, max_n=12)))
    return rings


def _shapely(rings) -> shapely.Polygon:
    return shapely.Polygon(rings[0], rings[1:])


def _probes(rnd: random.Random, rings, count: int):
    x0, y0, x1, y1 = rings_bbox(rings)
    w, h = x1 - x0, y1 - y0
    for _ in range(count):
        yield rnd.uniform(x0 - 0.2 * w, x1 + 0.2 * w), rnd.uniform(y0 - 0.2 * h, y1 + 0.2 * h)


@given(polygons(), st.integers(0, 2**32))
def test_points_agree_with_shapely_away_from_the_boundary(value, seed):
    rnd = random.Random(seed)
    rings = validate_polygon("polygon", value)
    geom = _shapely(rings)
    cols = PolygonColumns()
    row = cols.add(rings)
    # probes about the polygon, and about each hole (the first rarely land in a small hole)
    pts = list(_probes(rnd, rings, 200))
    for hole in rings[1:]:
        pts += _probes(rnd, (hole,), 30)
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    want = shapely.intersects_xy(geom, xs, ys)
    clear = shapely.distance(geom.boundary, shapely.points(xs, ys)) > 1e-9
    n = len(pts)
    got = check_pairs(
        *cols.columns(),
        np.full(n, row),
        np.zeros(n),
        np.zeros(n),
        np.full(n, MSG_POINT),
        np.column_stack([xs, ys, xs, ys]),
    )
    assert (got[clear] == want[clear]).all(), [p for p, c in zip(pts, clear, strict=True) if c][:3]
    assert want[clear].any() and not want[clear].all()  # the probes meet both sides
    for x, y in pts[:10]:
        assert polygon_hits(rings, 0.0, 0.0, MSG_POINT, (x, y, x, y)) == point_in_polygon(
            *cols.columns(), row, x, y
        )


@given(polygons(), st.integers(0, 2**32))
def test_rects_agree_with_shapely_when_a_nudge_does_not_change_the_answer(value, seed):
    rnd = random.Random(seed)
    rings = validate_polygon("polygon", value)
    geom = _shapely(rings)
    cols = PolygonColumns()
    row = cols.add(rings)
    x0, y0, x1, y1 = rings_bbox(rings)
    span = max(x1 - x0, y1 - y0)
    e = 1e-9
    checked = hits = 0
    for x, y in _probes(rnd, rings, 60):
        w, h = (rnd.choice([1e-3, 0.05, 0.3, 1.5]) * span * rnd.random() + 1e-6 for _ in "wh")
        grown = shapely.intersects(geom, shapely.box(x - e, y - e, x + w + e, y + h + e))
        shrunk = shapely.intersects(geom, shapely.box(x + e, y + e, x + w - e, y + h - e))
        if grown != shrunk:
            continue
        checked += 1
        hits += grown
        assert polygon_hits_rect(*cols.columns(), row, x, y, x + w, y + h) == grown, (x, y, w, h)
        assert polygon_hits(rings, 0.0, 0.0, MSG_RECT, (x, y, x + w, y + h)) == grown
    assert checked >= 40 and 0 < hits < checked


@given(polygons())
def test_every_vertex_is_in_the_polygon_and_touching_rects_hit(value):
    rings = validate_polygon("polygon", value)
    cols = PolygonColumns()
    row = cols.add(rings)
    for ring in rings:
        for x, y in ring:
            assert point_in_polygon(*cols.columns(), row, x, y), (x, y)
            assert polygon_hits_rect(*cols.columns(), row, x, y, x + 1.0, y + 1.0), (x, y)
            assert polygon_hits_rect(*cols.columns(), row, x - 1.0, y - 1.0, x, y), (x, y)


coord = st.floats(-50.0, 50.0, allow_nan=False)


@given(
    st.lists(coord, min_size=4, max_size=4, unique=True),
    st.lists(coord, min_size=4, max_size=4, unique=True),
    st.floats(0.0, 1.0),
)
def test_points_on_axis_parallel_edges_are_exactly_inside(xs, ys, t):
    assume(min(np.diff(sorted(xs))) > 1e-6 and min(np.diff(sorted(ys))) > 1e-6)  # area > 0
    # a rectilinear polygon (a frame with a square hole), whose every edge is axis-parallel
    a, b, c, d = sorted(xs)
    p, q, r, s = sorted(ys)
    outer = [[a, p], [d, p], [d, s], [a, s], [a, p]]
    hole = [[b, q], [b, r], [c, r], [c, q], [b, q]]
    rings = validate_polygon("polygon", [outer, hole])
    cols = PolygonColumns()
    row = cols.add(rings)
    for ring in rings:
        for (x1, y1), (x2, y2) in zip(ring[:-1], ring[1:], strict=True):
            # a point on the edge, found along the axis the edge runs on: exact
            x = min(max(x1 + t * (x2 - x1), min(x1, x2)), max(x1, x2))
            y = min(max(y1 + t * (y2 - y1), min(y1, y2)), max(y1, y2))
            assert point_in_polygon(*cols.columns(), row, x, y), (x, y)
            # a rect touching the edge from either side, and one just clear of the outer edges
            assert polygon_hits_rect(*cols.columns(), row, x, y, x + 0.5, y + 0.5)
            assert polygon_hits_rect(*cols.columns(), row, x - 0.5, y - 0.5, x, y)
    assert not point_in_polygon(*cols.columns(), row, math.nextafter(a, -math.inf), p)
    assert not point_in_polygon(*cols.columns(), row, a, math.nextafter(s, math.inf))
    inf = math.inf
    assert not polygon_hits_rect(*cols.columns(), row, a - 1, p, math.nextafter(a, -inf), s)
    # strictly inside the hole: out; on its boundary: in
    mx, my = (b + c) / 2, (q + r) / 2
    if b < mx < c and q < my < r:
        assert not point_in_polygon(*cols.columns(), row, mx, my)
        assert not polygon_hits_rect(*cols.columns(), row, mx, my, mx, my)
        assert polygon_hits_rect(*cols.columns(), row, mx, my, c, my)


SQUARE = [[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]
HOLE = [[4, 4], [6, 4], [6, 6], [4, 6], [4, 4]]


def test_holes_rects_and_translation_exact_cases():
    rings = validate_polygon("polygon", [SQUARE, HOLE])
    cols = PolygonColumns()
    row = cols.add(rings)
    c = cols.columns()
    assert not point_in_polygon(*c, row, 5.0, 5.0)  # in the hole
    assert point_in_polygon(*c, row, 4.0, 5.0)  # on the hole's boundary
    assert point_in_polygon(*c, row, 2.0, 5.0)
    assert not polygon_hits_rect(*c, row, 4.5, 4.5, 5.5, 5.5)  # inside the hole
    assert polygon_hits_rect(*c, row, 4.5, 4.5, 6.0, 5.5)  # touches the hole's edge
    assert polygon_hits_rect(*c, row, -1.0, -1.0, 11.0, 11.0)  # holds the whole polygon
    assert polygon_hits_rect(*c, row, 1.0, 1.0, 2.0, 2.0)  # inside the polygon
    assert not polygon_hits_rect(*c, row, 10.5, 1.0, 12.0, 2.0)
    # a triangle with a slanted edge: a rect beside the hypotenuse, clear of it, misses
    tri = validate_polygon("polygon", [[[0, 0], [10, 0], [0, 10], [0, 0]]])
    trow = cols.add(tri)
    c = cols.columns()
    assert not polygon_hits_rect(*c, trow, 6.0, 6.0, 9.0, 9.0)
    assert polygon_hits_rect(*c, trow, 4.0, 4.0, 9.0, 9.0)
    # translation: the message is moved back by (dx, dy) and tested against the stored polygon
    rows = np.array([row, row, row, trow, trow])
    dx = np.array([100.0, 100.0, 0.0, -20.0, -20.0])
    dy = np.array([50.0, 50.0, 0.0, 0.0, 0.0])
    kind = np.array([MSG_POINT, MSG_POINT, MSG_POINT, MSG_RECT, MSG_RECT])
    geom = np.array(
        [
            [102.0, 55.0, 102.0, 55.0],  # (2, 5) in the polygon
            [105.0, 55.0, 105.0, 55.0],  # (5, 5) in the hole
            [102.0, 55.0, 102.0, 55.0],  # untranslated: far away
            [-30.0, 11.0, -5.0, 20.0],  # (-10, 11)-(15, 20): above the triangle
            [-30.0, 9.0, -5.0, 20.0],  # reaches down to (0, 10), the apex
        ]
    )
    got = check_pairs(*c, rows, dx, dy, kind, geom)
    assert got.tolist() == [True, False, False, False, True]
    for i in range(len(rows)):
        r = rings if rows[i] == row else tri
        assert polygon_hits(r, dx[i], dy[i], int(kind[i]), tuple(geom[i])) == got[i]


# --------------------------------------------------------------------------------------------
# PolygonColumns


def _ring_around(rnd: random.Random, n: int) -> list[list[float]]:
    cx, cy = rnd.uniform(-100, 100), rnd.uniform(-60, 60)
    step = 2 * math.pi / n
    radii = [rnd.uniform(1, 2) for _ in range(n)]
    pts = [[cx + r * math.cos(k * step), cy + r * math.sin(k * step)] for k, r in enumerate(radii)]
    return pts + [list(pts[0])]


def test_columns_keep_their_answers_through_removals_and_compaction():
    rnd = random.Random(7)
    cols = PolygonColumns()
    stored: dict[int, tuple] = {}
    compacted = False
    for step in range(400):
        if stored and rnd.random() < 0.45:
            row = rnd.choice(sorted(stored))
            before = len(cols.columns()[5])
            cols.remove(row)
            del stored[row]
            compacted |= len(cols.columns()[5]) < before
        else:
            n = rnd.choice([4, 8, 60, 300])
            rings = validate_polygon("polygon", [_ring_around(rnd, n)])
            row = cols.add(rings)
            assert row not in stored
            stored[row] = rings
        cols._check()
        assert len(cols) == len(stored)
        if step % 20 == 0 and stored:
            rows = np.array(sorted(stored) * 20)
            pts = np.array([[rnd.uniform(-102, 102), rnd.uniform(-62, 62)] for _ in rows])
            for r in stored:  # the rows give their rings back
                assert cols.rings(r) == stored[r]
            geom = np.column_stack([pts, pts + rnd.uniform(0, 3)])
            kind = np.array([rnd.choice([MSG_POINT, MSG_RECT]) for _ in rows])
            geom[kind == MSG_POINT, 2:] = geom[kind == MSG_POINT, :2]
            got = check_pairs(
                *cols.columns(), rows, np.zeros(len(rows)), np.zeros(len(rows)), kind, geom
            )
            want = [
                polygon_hits(stored[int(r)], 0.0, 0.0, int(k), tuple(g))
                for r, k, g in zip(rows, kind, geom, strict=True)
            ]
            assert got.tolist() == want
    assert compacted
    with pytest.raises(KeyError):
        cols.remove(10_000)
    free = next(r for r in range(10_000) if r not in stored)
    with pytest.raises(KeyError):
        cols.remove(free)


def test_free_rows_hold_nothing_and_are_reused():
    cols = PolygonColumns()
    rings = validate_polygon("polygon", [SQUARE])
    a, b = cols.add(rings), cols.add(rings)
    cols.remove(a)
    assert not point_in_polygon(*cols.columns(), a, 5.0, 5.0)
    assert not polygon_hits_rect(*cols.columns(), a, -1.0, -1.0, 20.0, 20.0)
    assert point_in_polygon(*cols.columns(), b, 5.0, 5.0)
    assert cols.add(rings) == a


# --------------------------------------------------------------------------------------------
# validation


def test_valid_polygons_come_back_as_float_tuples():
    out = validate_polygon("polygon", [SQUARE, HOLE])
    assert out[1][0] == (4.0, 4.0) and type(out[1][0][0]) is float and len(out) == 2
    # a hole touching the exterior at one point is valid (OGC), and so is a clockwise exterior
    touching = [[0, 0], [3, 1], [1, 3], [0, 0]]
    assert len(validate_polygon("polygon", [SQUARE, touching])) == 2
    assert validate_polygon("p", [SQUARE[::-1]])[0][1] == (0.0, 10.0)
    assert validate_polygon("p", [[(0, 0), (1.5, 0), (np.float64(1), 1), (0, 0)]])[0][2] == (
        1.0,
        1.0,
    )


def _bad(value, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_polygon("polygon", value)
    assert caught.value.field == field, str(caught.value)
    assert words in caught.value.reason, str(caught.value)
    assert str(caught.value).startswith(f"{field}=")


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ([], "polygon", "1-64 rings"),
        ("square", "polygon", "list of rings"),
        ([SQUARE] * (MAX_POLYGON_RINGS + 1), "polygon", "1-64 rings"),
        ([[[0, 0], [1, 0], [1, 1], [0, 1]]], "polygon[0]", "ring is not closed: first position"),
        ([[[0, 0], [1, 0], [0, 0]]], "polygon[0]", "at least 4 positions"),
        ([SQUARE, 5], "polygon[1]", "a ring must be a list"),
        ([[[0, 0], [1, 0], [2, 0], [0, 0]]], "polygon[0]", "lie on one line"),
        ([SQUARE, [[1, 1], [2, 2], [3, 3], [1, 1]]], "polygon[1]", "lie on one line"),
        ([[[0, 0], [1e-200, 0], [1e-200, 1e-200], [0, 0]]], "polygon[0]", "area is 0"),
        ([[[0, 0], [2, 2], [2, 0], [0, 2], [0, 0]]], "polygon[0]", "crosses itself at (1, 1)"),
        ([[[0, 0], [4, 0], [4, 4], [2, 0], [0, 4], [0, 0]]], "polygon[0]", "touches itself"),
        (
            [SQUARE, [[20, 20], [21, 20], [21, 21], [20, 20]]],
            "polygon[1]",
            "not inside the exterior",
        ),
        (
            [SQUARE, [[5, 5], [15, 5], [15, 6], [5, 5]]],
            "polygon[1]",
            "crosses itself, the exterior",
        ),
        (
            [SQUARE, HOLE, [[4.5, 4.5], [5.5, 4.5], [5.5, 5.5], [4.5, 4.5]]],
            "polygon[2]",
            "inside another hole",
        ),
        (
            [SQUARE, HOLE, [[5, 5], [8, 5], [8, 8], [5, 5]]],
            "polygon[2]",
            "crosses itself, the exterior or another hole",
        ),
        ([SQUARE, [[0, 5], [5, 0], [10, 5], [5, 10], [0, 5]]], "polygon[1]", "interior in parts"),
        (
            [[[0, 0], [200, 0], [0, 1], [0, 0]]],
            "polygon[0][1][0]",
            "longitude must be in [-180, 180]",
        ),
        ([[[0, 0], [1, 0], [1, "1"], [0, 0]]], "polygon[0][2][1]", "must be a number"),
        ([[[0, 0], [True, 0], [1, 1], [0, 0]]], "polygon[0][1][0]", "must be a number"),
        ([[[0, 0], [1, 0], [1, 91], [0, 0]]], "polygon[0][2][1]", "latitude must be in [-90, 90]"),
        ([[[0, 0], [1, 0], [1, math.nan], [0, 0]]], "polygon[0][2][1]", "must be finite"),
        ([[[0, 0], [1, 0], [1, 10**400], [0, 0]]], "polygon[0][2][1]", "must be finite"),
        ([[[0, 0], [1, 0, 5], [1, 1], [0, 0]]], "polygon[0][1]", "must be [lon, lat]"),
        ([SQUARE, [[0, 0], 7, [1, 1], [0, 0]]], "polygon[1][1]", "must be [lon, lat]"),
        ([[[-170, 0], [170, 0], [170, 1], [-170, 0]]], "polygon[0][0]", "crosses the antimeridian"),
        ([[[0, 0], [1, 0]] * 600 + [[0, 0]]], "polygon", "at most 1024"),
    ],
)
def test_invalid_polygons_name_the_field(value, field, words):
    _bad(value, field, words)


def test_the_vertex_limit_counts_every_ring():
    n = MAX_POLYGON_VERTICES // 2
    big = [
        [math.cos(2 * math.pi * k / (n - 1)) * 10, math.sin(2 * math.pi * k / (n - 1)) * 10]
        for k in range(n - 1)
    ]
    small = [
        [math.cos(2 * math.pi * k / (n - 1)), math.sin(2 * math.pi * k / (n - 1))]
        for k in range(n - 1)
    ]
    value = [big + [big[0]], small + [small[0]]]
    assert sum(map(len, validate_polygon("polygon", value))) == MAX_POLYGON_VERTICES
    _bad([big + [big[0]], small + [small[-1], small[0]]], "polygon", "1025 positions")
