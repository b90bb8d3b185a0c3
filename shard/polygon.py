"""Polygon subscription regions: their validation, and compiled exact tests over vertex columns.

A polygon is given GeoJSON-style, ``[[[lon, lat], ...], [hole ...], ...]``: the first ring is the
exterior, the others are holes; every ring is closed (its last position repeats its first).
Coordinates are planar (lon, lat) degrees and edges are straight lines in (lon, lat), so a polygon
may not cross the antimeridian (split it in two). A polygon is a closed set: its boundary, holes'
boundaries included, belongs to it, like the project's closed rectangles.

The index stores a polygon by its bounding box (``rings_bbox``); candidates are then tested
exactly by the kernels here, which run over the columns of a ``PolygonColumns``, many pairs in
one compiled call (``check_pairs``). ``polygon_hits`` runs the same kernels on one polygon for
the brute-force oracle.

Floating point: a point exactly on a vertex, or exactly on an axis-parallel edge, is on the
boundary (inside) exactly, and a rectangle touching such an edge or vertex meets the polygon
exactly. Against a slanted edge the side of a point (or of a rectangle's corner) is the sign of
a cross product computed in float64, not exactly: a point within rounding distance of the edge
(about 1e-16 of the coordinates' magnitude, ~1e-14 degrees at lon 100) may be classed on
either side, a point exactly on it included. Products that underflow (coordinates within
~1e-160 of each other) count as 0, i.e. as on the line.

Validity (rings that do not cross, holes inside the exterior) is GEOS's, through shapely 2
(``shapely.is_valid_reason``): a kept library, 7-80 us a polygon of up to 1,000 positions
(~1 ms if very spiky). A compiled all-pairs crossing test of our own took 0.5-0.8 ms at 1,000
positions for the self-crossing rule alone, without the rules for holes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

import numpy as np
from numba import njit

from shard.polygon_rings import Rings, rings_bbox, validate_polygon  # noqa: F401 - re-exported

MSG_POINT = 0
"""``check_pairs``' message kind of a point, geometry ``(x, y, x, y)``."""
MSG_RECT = 1
"""``check_pairs``' message kind of a closed rectangle, geometry ``(x0, y0, x1, y1)``."""

DEFAULT_COMPACT_MIN_DEAD = 4096
"""``PolygonColumns`` compacts its ring and vertex pools when the dead vertices outnumber the
live ones and are at least this many (64 KiB of coordinates): below it a pass is not worth its
call, however small the table."""

# ---------------------------------------------------------------------------------------------
# columns


class PolygonColumns:
    """The vertices of many polygons as columns, each polygon under an int row.

    Per row: first ring and ring count (0: a free row), and its box. Per ring: first vertex and
    vertex count (closing position included, so a ring's edges are its consecutive vertex
    pairs). Per vertex: x and y. ``columns()`` gives them to the kernels. Rows are reused after
    ``remove``; the ring and vertex pools are compacted when dead vertices outnumber live ones
    (and are at least ``DEFAULT_COMPACT_MIN_DEAD``), O(live) a pass, so O(1) amortised per vertex
    removed. Rows never move.

    >>> cols = PolygonColumns()
    >>> row = cols.add((((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (0.0, 4.0), (0.0, 0.0)),))
    >>> bool(point_in_polygon(*cols.columns(), row, 4.0, 2.0)), len(cols)
    (True, 1)
    """

    def __init__(self) -> None:
        self._row_ring0 = np.zeros(16, dtype=np.int64)
        self._row_nring = np.zeros(16, dtype=np.int64)
        self._row_bbox = np.empty((16, 4), dtype=np.float64)
        self._row_bbox[:] = _EMPTY_BOX
        self._ring_v0 = np.zeros(16, dtype=np.int64)
        self._ring_nv = np.zeros(16, dtype=np.int64)
        self._vx = np.zeros(64, dtype=np.float64)
        self._vy = np.zeros(64, dtype=np.float64)
        self._rows = 0  # rows ever handed out (the high-water mark)
        self._free: list[int] = []
        self._rings = 0  # ring slots used, dead ones included
        self._verts = 0  # vertex slots used, dead ones included
        self._live_rings = 0
        self._live_verts = 0

    def __len__(self) -> int:
        """Polygons stored. O(1)."""
        return self._rows - len(self._free)

    def add(self, rings: Rings) -> int:
        """Store a validated polygon; its row (a free one if any). O(n) amortised.

        >>> PolygonColumns().add((((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)),))
        0
        """
        counts = np.fromiter(map(len, rings), dtype=np.int64, count=len(rings))
        total = int(counts.sum())
        flat = np.fromiter(
            chain.from_iterable(chain.from_iterable(rings)), dtype=np.float64, count=2 * total
        )
        xs, ys = flat[0::2], flat[1::2]
        if self._free:
            row = self._free.pop()
        else:
            row = self._rows
            self._rows += 1
            if row == len(self._row_nring):
                self._row_ring0 = _grown(self._row_ring0, row + 1)
                self._row_nring = _grown(self._row_nring, row + 1)
                old = len(self._row_bbox)
                self._row_bbox = _grown(self._row_bbox, row + 1)
                self._row_bbox[old:] = _EMPTY_BOX
        r0, v0 = self._rings, self._verts
        if r0 + len(counts) > len(self._ring_nv):
            self._ring_v0 = _grown(self._ring_v0, r0 + len(counts))
            self._ring_nv = _grown(self._ring_nv, r0 + len(counts))
        if v0 + total > len(self._vx):
            self._vx = _grown(self._vx, v0 + total)
            self._vy = _grown(self._vy, v0 + total)
        self._ring_nv[r0 : r0 + len(counts)] = counts
        self._ring_v0[r0 : r0 + len(counts)] = v0 + np.cumsum(counts) - counts
        self._vx[v0 : v0 + total] = xs
        self._vy[v0 : v0 + total] = ys
        self._row_ring0[row] = r0
        self._row_nring[row] = len(counts)
        n0 = int(counts[0])
        self._row_bbox[row] = (xs[:n0].min(), ys[:n0].min(), xs[:n0].max(), ys[:n0].max())
        self._rings += len(counts)
        self._verts += total
        self._live_rings += len(counts)
        self._live_verts += total
        return row

    def remove(self, row: int) -> None:
        """Drop the polygon of ``row`` (KeyError if none); the row is free for the next ``add``.
        O(1) amortised (a compaction now and then).

        >>> cols = PolygonColumns()
        >>> cols.remove(cols.add((((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)),)))
        >>> len(cols)
        0
        """
        if not 0 <= row < self._rows or self._row_nring[row] == 0:
            raise KeyError(f"no polygon at row {row}")
        r0, nr = int(self._row_ring0[row]), int(self._row_nring[row])
        self._live_rings -= nr
        self._live_verts -= int(self._ring_nv[r0 : r0 + nr].sum())
        self._row_nring[row] = 0
        self._row_ring0[row] = 0
        self._row_bbox[row] = _EMPTY_BOX
        self._free.append(row)
        dead = self._verts - self._live_verts
        if dead > self._live_verts and dead >= DEFAULT_COMPACT_MIN_DEAD:
            self.compact()

    def compact(self) -> None:
        """Move the live rings and vertices to the front of new pools (sized twice the live
        ones), row by row; rows keep their numbers. O(rows + live vertices).

        >>> cols = PolygonColumns()
        >>> rows = [cols.add((((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)),)) for _ in range(3)]
        >>> cols.remove(rows[0]); cols.compact(); cols.rings(rows[2])[0][2]
        (1.0, 1.0)
        """
        ring_cap = max(16, 2 * self._live_rings)
        vert_cap = max(64, 2 * self._live_verts)
        ring_v0 = np.zeros(ring_cap, dtype=np.int64)
        ring_nv = np.zeros(ring_cap, dtype=np.int64)
        vx = np.zeros(vert_cap, dtype=np.float64)
        vy = np.zeros(vert_cap, dtype=np.float64)
        rings, verts = _compact_pools(
            self._row_ring0[: self._rows],
            self._row_nring[: self._rows],
            self._ring_v0,
            self._ring_nv,
            self._vx,
            self._vy,
            ring_v0,
            ring_nv,
            vx,
            vy,
        )
        self._ring_v0, self._ring_nv, self._vx, self._vy = ring_v0, ring_nv, vx, vy
        self._rings, self._verts = rings, verts

    def columns(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(row_ring0, row_nring, row_bbox, ring_v0, ring_nv, vx, vy)``, views the kernels take
        as their first arguments. Views: take them again after an ``add`` or ``remove``. O(1).

        >>> [len(c) for c in PolygonColumns().columns()]
        [0, 0, 0, 0, 0, 0, 0]
        """
        return (
            self._row_ring0[: self._rows],
            self._row_nring[: self._rows],
            self._row_bbox[: self._rows],
            self._ring_v0[: self._rings],
            self._ring_nv[: self._rings],
            self._vx[: self._verts],
            self._vy[: self._verts],
        )

    def rings(self, row: int) -> Rings:
        """The polygon stored at ``row`` (KeyError if none). O(n).

        >>> cols = PolygonColumns()
        >>> cols.rings(cols.add((((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)),)))[0][1]
        (1.0, 0.0)
        """
        if not 0 <= row < self._rows or self._row_nring[row] == 0:
            raise KeyError(f"no polygon at row {row}")
        r0, nr = int(self._row_ring0[row]), int(self._row_nring[row])
        out = []
        for r in range(r0, r0 + nr):
            v0, nv = int(self._ring_v0[r]), int(self._ring_nv[r])
            xs = self._vx[v0 : v0 + nv].tolist()
            ys = self._vy[v0 : v0 + nv].tolist()
            out.append(tuple(zip(xs, ys, strict=True)))
        return tuple(out)

    def _check(self) -> None:
        """Assert every invariant: free rows empty, live rows' rings and vertices in disjoint
        ranges inside the used pools, counts and boxes matching, rings closed."""
        free = set(self._free)
        assert len(free) == len(self._free), f"a row freed twice: {self._free}"
        assert all(0 <= r < self._rows for r in free), f"free rows out of range: {self._free}"
        ring_used = np.zeros(self._rings, dtype=np.int64)
        vert_used = np.zeros(self._verts, dtype=np.int64)
        live_rings = live_verts = 0
        for row in range(self._rows):
            nr = int(self._row_nring[row])
            box = self._row_bbox[row].tolist()
            if row in free:
                assert nr == 0 and box == list(_EMPTY_BOX), f"free row {row}: {nr} rings {box}"
                continue
            assert nr > 0, f"live row {row} without rings"
            r0 = int(self._row_ring0[row])
            assert r0 >= 0 and r0 + nr <= self._rings, f"row {row}: rings {r0}+{nr}"
            ring_used[r0 : r0 + nr] += 1
            for r in range(r0, r0 + nr):
                v0, nv = int(self._ring_v0[r]), int(self._ring_nv[r])
                assert nv >= 4 and v0 >= 0 and v0 + nv <= self._verts, f"ring {r}: {v0}+{nv}"
                vert_used[v0 : v0 + nv] += 1
                a, b = v0, v0 + nv - 1
                assert (self._vx[a], self._vy[a]) == (self._vx[b], self._vy[b]), f"ring {r} open"
                live_verts += nv
            live_rings += nr
            v0, nv = int(self._ring_v0[r0]), int(self._ring_nv[r0])
            xs, ys = self._vx[v0 : v0 + nv], self._vy[v0 : v0 + nv]
            want = [xs.min(), ys.min(), xs.max(), ys.max()]
            assert box == want, f"row {row}: box {box} != {want}"
        assert ring_used.max(initial=0) <= 1 and vert_used.max(initial=0) <= 1, "pools overlap"
        assert (live_rings, live_verts) == (self._live_rings, self._live_verts), (
            f"live counts {self._live_rings}, {self._live_verts} != {live_rings}, {live_verts}"
        )


_EMPTY_BOX = (math.inf, math.inf, -math.inf, -math.inf)
"""A free row's box: every box test rejects it."""


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` copied into an array at least twice as long (and ``need`` long)."""
    out = np.zeros((max(need, 2 * len(a)),) + a.shape[1:], dtype=a.dtype)
    out[: len(a)] = a
    return out


@njit(cache=True)
def _compact_pools(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, new_v0, new_nv, new_x, new_y):
    """Copy the live rows' rings and vertices, row by row, into the new pools; rewrite
    ``row_ring0`` in place. (rings used, vertices used). O(rows + live vertices)."""
    r_out = 0
    v_out = 0
    for row in range(len(row_nring)):
        nr = row_nring[row]
        if nr == 0:
            continue
        r_in = row_ring0[row]
        row_ring0[row] = r_out
        for r in range(r_in, r_in + nr):
            v, n = ring_v0[r], ring_nv[r]
            new_v0[r_out] = v_out
            new_nv[r_out] = n
            new_x[v_out : v_out + n] = vx[v : v + n]
            new_y[v_out : v_out + n] = vy[v : v + n]
            r_out += 1
            v_out += n
    return r_out, v_out


# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True)
def _crosses(x1, y1, x2, y2, px, py) -> bool:
    """Does the edge, which spans py half-open ((y1 > py) != (y2 > py)), cross the ray from
    (px, py) towards +x? Vertical edges by comparison, others by the side of the point (a float64
    cross product; > 0: left of the edge, which is east of the point for an upward edge)."""
    if x1 == x2:
        return px < x1
    side = (x2 - x1) * (py - y1) - (y2 - y1) * (px - x1)
    return (side > 0.0) == (y2 > y1)


@njit(cache=True)
def _scan_point(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, px, py) -> int:
    """2 if (px, py) is on a ring of ``row``, else 1 if an odd number of ring edges cross the ray
    from it towards +x (inside: in the exterior and in no hole), else 0. Edges are half-open in
    y, so a vertex on the ray counts once; each edge's end vertex is checked (the first is the
    last, rings being closed). O(n)."""
    inside = False
    r0 = row_ring0[row]
    for r in range(r0, r0 + row_nring[row]):
        a = ring_v0[r]
        x1 = vx[a]
        y1 = vy[a]
        above1 = y1 > py
        for k in range(a + 1, a + ring_nv[r]):
            x2 = vx[k]
            y2 = vy[k]
            above2 = y2 > py
            if above1 != above2:  # the edge spans the ray's line: p is on it, or it is crossed
                if x1 == x2:
                    if px == x1:
                        return 2
                elif (x2 - x1) * (py - y1) - (y2 - y1) * (px - x1) == 0.0:
                    return 2  # exact at a vertex: both products are of the same two factors
                if _crosses(x1, y1, x2, y2, px, py):
                    inside = not inside
            elif y2 == py:  # ends on the line, or runs along it
                if y1 == py:
                    if min(x1, x2) <= px <= max(x1, x2):
                        return 2
                elif x2 == px:
                    return 2
            x1 = x2
            y1 = y2
            above1 = above2
    return 1 if inside else 0


@njit(cache=True)
def _outside_box(row_bbox, row, x0, y0, x1, y1) -> bool:
    """Is the rectangle (a point when x0 == x1 and y0 == y1) clear of ``row``'s box? O(1)."""
    return (
        x1 < row_bbox[row, 0]
        or x0 > row_bbox[row, 2]
        or y1 < row_bbox[row, 1]
        or y0 > row_bbox[row, 3]
    )


@njit(cache=True)
def point_in_polygon(row_ring0, row_nring, row_bbox, ring_v0, ring_nv, vx, vy, row, px, py):
    """Is the point (px, py) in the closed polygon of ``row``: in its exterior ring or on it, and
    in none of its holes (a hole's boundary belongs to the polygon)? A free row holds nothing.
    Exact on vertices and axis-parallel edges; a slanted edge's side is a float64 cross product
    (module docs). O(n) in the row's vertices, O(1) outside its box.

    >>> ring = (((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (0.0, 4.0), (0.0, 0.0)),)
    >>> cols = PolygonColumns(); row = cols.add(ring)
    >>> bool(point_in_polygon(*cols.columns(), row, 0.0, 4.0)), bool(point_in_polygon(*cols.columns(), row, 5.0, 1.0))
    (True, False)
    """
    if _outside_box(row_bbox, row, px, py, px, py):
        return False
    return _scan_point(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, px, py) != 0


@njit(cache=True)
def _segment_hits_rect(x1, y1, x2, y2, x0, y0, xr, yr) -> bool:
    """Does the closed segment meet the closed rectangle [x0, xr] x [y0, yr]? Separating axes:
    the two boxes' axes (exact), then the segment's normal: the rectangle's four corners all
    strictly on one side of the segment's line (a float64 cross product each). O(1)."""
    if max(x1, x2) < x0 or min(x1, x2) > xr or max(y1, y2) < y0 or min(y1, y2) > yr:
        return False
    if x1 == x2 or y1 == y2:  # axis-parallel: the segment is its own box
        return True
    ex = x2 - x1
    ey = y2 - y1
    s0 = ex * (y0 - y1) - ey * (x0 - x1)
    s1 = ex * (y0 - y1) - ey * (xr - x1)
    s2 = ex * (yr - y1) - ey * (x0 - x1)
    s3 = ex * (yr - y1) - ey * (xr - x1)
    if s0 > 0.0 and s1 > 0.0 and s2 > 0.0 and s3 > 0.0:
        return False
    return not (s0 < 0.0 and s1 < 0.0 and s2 < 0.0 and s3 < 0.0)


@njit(cache=True)
def polygon_hits_rect(
    row_ring0, row_nring, row_bbox, ring_v0, ring_nv, vx, vy, row, x0, y0, x1, y1
):
    """Does the closed polygon of ``row`` meet the closed rectangle (x0, y0, x1, y1)? Yes if the
    rectangle holds the polygon's box, or some ring edge meets the rectangle; otherwise no
    boundary point is in the rectangle, so it lies wholly inside the polygon or wholly outside
    (or in a hole), which its corner (x0, y0) tells (crossings counted in the same pass). Exact
    for axis-parallel edges and vertices; a slanted edge is separated from the rectangle by
    float64 cross products (module docs). O(n), O(1) outside the box.

    >>> ring = (((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (0.0, 0.0)),)
    >>> cols = PolygonColumns(); row = cols.add(ring)
    >>> bool(polygon_hits_rect(*cols.columns(), row, 3.0, 1.0, 3.5, 1.5)), bool(polygon_hits_rect(*cols.columns(), row, 0.0, 1.0, 0.9, 3.0))
    (True, False)
    """
    if _outside_box(row_bbox, row, x0, y0, x1, y1):
        return False
    if _holds_box(row_bbox, row, x0, y0, x1, y1):
        return True
    return _scan_rect(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, x0, y0, x1, y1) != 0


@njit(cache=True)
def _holds_box(row_bbox, row, x0, y0, x1, y1) -> bool:
    """Does the rectangle hold ``row``'s whole box? O(1)."""
    return (
        x0 <= row_bbox[row, 0]
        and row_bbox[row, 2] <= x1
        and y0 <= row_bbox[row, 1]
        and row_bbox[row, 3] <= y1
    )


@njit(cache=True)
def _scan_rect(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, x0, y0, x1, y1) -> int:
    """``polygon_hits_rect`` after its box tests: 1 if it meets, else 0. O(n)."""
    inside = False  # does the corner (x0, y0) lie in the polygon: counted in the same pass
    r0 = row_ring0[row]
    for r in range(r0, r0 + row_nring[row]):
        a = ring_v0[r]
        ax = vx[a]
        ay = vy[a]
        for k in range(a + 1, a + ring_nv[r]):
            bx = vx[k]
            by = vy[k]
            if _segment_hits_rect(ax, ay, bx, by, x0, y0, x1, y1):
                return 1
            if (ay > y0) != (by > y0) and _crosses(ax, ay, bx, by, x0, y0):
                inside = not inside
            ax = bx
            ay = by
    return 1 if inside else 0


@njit(cache=True)
def check_pairs(
    row_ring0, row_nring, row_bbox, ring_v0, ring_nv, vx, vy, rows, dx, dy, mkind, mgeom
):
    """For each pair i, does message i meet polygon ``rows[i]`` translated by (dx[i], dy[i])?

    The message meets the translated polygon iff the message moved back by (dx, dy) meets the
    stored one, and that is what is computed, in float64: the point (x - dx, y - dy), the
    rectangle (x0 - dx, y0 - dy, x1 - dx, y1 - dy). ``mkind[i]`` is ``MSG_POINT`` (``mgeom[i]`` =
    (x, y, x, y)) or ``MSG_RECT`` (``mgeom[i]`` = (x0, y0, x1, y1)). ``rows``, ``mkind``: int64;
    ``dx``, ``dy``: float64; ``mgeom``: (n, 4) float64 (other dtypes compile another
    specialisation). One compiled call for the batch; O(sum of the pairs' polygon sizes).

    >>> ring = (((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (0.0, 0.0)),)
    >>> cols = PolygonColumns(); row = cols.add(ring)
    >>> check_pairs(*cols.columns(), np.array([row, row]), np.array([10.0, 0.0]), np.zeros(2),
    ...             np.array([MSG_POINT, MSG_POINT]), np.array([[13.0, 1.0, 13.0, 1.0]] * 2))
    array([ True, False])
    """
    n = len(rows)
    out = np.empty(n, dtype=np.bool_)
    for i in range(n):
        # scalars, not row views; box tests here, the scans called directly: calling
        # ``point_in_polygon`` or
        # ``polygon_hits_rect`` (which call a scan in turn) from this loop cost 50-75 ns a pair
        # more (measured; 23 ns in all for a point against an 8-vertex polygon, this way)
        row = rows[i]
        x0 = mgeom[i, 0] - dx[i]
        y0 = mgeom[i, 1] - dy[i]
        if mkind[i] == MSG_POINT:
            x1 = x0
            y1 = y0
        else:
            x1 = mgeom[i, 2] - dx[i]
            y1 = mgeom[i, 3] - dy[i]
        if _outside_box(row_bbox, row, x0, y0, x1, y1):
            out[i] = False
        elif mkind[i] == MSG_POINT:
            out[i] = _scan_point(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, x0, y0) != 0
        elif _holds_box(row_bbox, row, x0, y0, x1, y1):
            out[i] = True
        else:
            out[i] = (
                _scan_rect(row_ring0, row_nring, ring_v0, ring_nv, vx, vy, row, x0, y0, x1, y1) != 0
            )
    return out


@lru_cache(maxsize=1024)  # at most 16 MB of vertices
def _one_polygon(rings: Rings) -> tuple[np.ndarray, ...]:
    """The columns of a table holding just ``rings`` (row 0), kept for the oracle's next call."""
    cols = PolygonColumns()
    cols.add(rings)
    return cols.columns()


_ROW0 = np.zeros(1, dtype=np.int64)


def polygon_hits(rings: Rings, dx: float, dy: float, kind: int, geom: Sequence[float]) -> bool:
    """Does the message (``kind`` ``MSG_POINT`` or ``MSG_RECT``, ``geom`` its 4 floats as in
    ``check_pairs``) meet the polygon ``rings`` translated by (dx, dy)? The brute-force oracle's
    entry: the same compiled ``check_pairs`` on a one-polygon table (cached per polygon).
    O(n) (a table build, O(n), on a polygon's first call).

    >>> square = (((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.0, 0.0)),)
    >>> polygon_hits(square, 0.0, 0.0, MSG_POINT, (1.0, 0.5, 1.0, 0.5))
    True
    >>> polygon_hits(square, 5.0, 0.0, MSG_RECT, (2.0, 0.0, 4.9, 1.0))
    False
    """
    out = check_pairs(
        *_one_polygon(rings),
        _ROW0,
        np.array([dx], dtype=np.float64),
        np.array([dy], dtype=np.float64),
        np.array([kind], dtype=np.int64),
        np.array([geom], dtype=np.float64).reshape(1, 4),
    )
    return bool(out[0])
