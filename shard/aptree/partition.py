"""Cost model (Eq. 1) and the two partition methods of the AP-Tree (Sect. 3.3.1-3.3.3), compiled.

Keyword partition: the distinct l-th keywords ``V`` of a node (ascending in the global order) with
weights ``w`` (subscriptions per keyword) and hit probabilities ``p`` are cut into at most f ordered
cuts; the cost of a cut is ``w(B) * p(B)`` with both summed over its keywords (Eq. 3).
``keyword_partition_heuristic`` is Alg. 3 (even split by weight, then one pass of local
improvement of each boundary), ``keyword_partition_optimal`` Alg. 2 (dynamic programming).

Spatial partition: each axis is cut independently into k intervals, first so that subscription
centres are even, then by local improvement of each boundary over the subscription edges
(Sect. 3.3.3); the grid's cost is the sum over cells of (subscriptions overlapping the cell) x
(hit probability of the cell).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.aptree.layout import DEFAULT_DP_MAX_KEYWORDS, DEFAULT_SPATIAL_CANDIDATES

SAMPLE_SMOOTHING = 1.0
"""Pseudo-count spread uniformly by area when hit probabilities come from a message sample, so a
cell no sample message fell into still has a small, non-zero probability."""


@njit(cache=True)
def _cut_cost(W, P, i, j, absolute):
    p = P[j] - P[i]
    if absolute and p > 1.0:
        p = 1.0
    return (W[j] - W[i]) * p


@njit(cache=True)
def keyword_partition_heuristic(W, P, f, absolute):
    """Alg. 3 over prefix sums ``W``/``P`` (length n+1) of weights / probabilities.

    Returns (starts, cost): cut k covers keywords ``starts[k] .. starts[k+1]-1``. O(f + n).
    With ``absolute`` a cut's probability is a real hit probability (message sample) capped at 1;
    otherwise probabilities are the paper's normalised subscription frequencies.
    """
    n = W.shape[0] - 1
    if n <= f:
        starts = np.arange(n).astype(np.int64)
        cost = 0.0
        for k in range(n):
            cost += _cut_cost(W, P, k, k + 1, absolute)
        return starts, cost
    total = W[n]
    starts_l = np.empty(f, np.int64)
    m = 1
    starts_l[0] = 0
    for k in range(1, f):
        target = total * k / f
        idx = np.searchsorted(W, target)  # first prefix reaching the target
        if idx <= starts_l[m - 1]:
            idx = starts_l[m - 1] + 1
        if idx >= n:
            break
        starts_l[m] = idx
        m += 1
    starts = starts_l[:m].copy()
    # local improvement: move each boundary to its best position between its neighbours
    for k in range(1, m):
        a = starts[k - 1]
        b = starts[k + 1] if k + 1 < m else n
        best_s = starts[k]
        best = _cut_cost(W, P, a, best_s, absolute) + _cut_cost(W, P, best_s, b, absolute)
        for s in range(a + 1, b):
            c = _cut_cost(W, P, a, s, absolute) + _cut_cost(W, P, s, b, absolute)
            if c < best:
                best = c
                best_s = s
        starts[k] = best_s
    cost = 0.0
    for k in range(m):
        e = starts[k + 1] if k + 1 < m else n
        cost += _cut_cost(W, P, starts[k], e, absolute)
    return starts, cost


@njit(cache=True)
def keyword_partition_optimal(W, P, f, absolute):
    """Alg. 2: the partition into at most f ordered cuts of minimum cost. O(f n^2) time, O(f n) space.

    Falls back to the heuristic beyond ``DEFAULT_DP_MAX_KEYWORDS`` distinct keywords.
    """
    n = W.shape[0] - 1
    if n <= f:
        return keyword_partition_heuristic(W, P, f, absolute)
    if n > DEFAULT_DP_MAX_KEYWORDS:
        return keyword_partition_heuristic(W, P, f, absolute)
    inf = np.inf
    # best[c, i]: min cost of V[i:] in exactly c cuts; nxt[c, i] where the first cut ends
    best = np.full((f + 1, n + 1), inf)
    nxt = np.zeros((f + 1, n + 1), np.int64)
    best[0, n] = 0.0
    for c in range(1, f + 1):
        for i in range(n - 1, -1, -1):
            bv = inf
            bj = -1
            for j in range(i + 1, n - c + 2):
                rest = best[c - 1, j]
                if rest == inf:
                    continue
                v = _cut_cost(W, P, i, j, absolute) + rest
                if v < bv:
                    bv = v
                    bj = j
            best[c, i] = bv
            nxt[c, i] = bj
    bc = 1
    for c in range(1, f + 1):
        if best[c, 0] < best[bc, 0]:
            bc = c
    starts = np.empty(bc, np.int64)
    i = 0
    for k in range(bc):
        starts[k] = i
        i = nxt[bc - k, i]
    return starts, best[bc, 0]


@njit(cache=True)
def _overlap_count(slo, shi, a, b):
    """Intervals [lo, hi] (sorted los ``slo``, sorted his ``shi``) meeting the closed [a, b]. O(log n)."""
    return np.searchsorted(slo, b, side="right") - np.searchsorted(shi, a, side="left")


@njit(cache=True)
def _interval_prob(pts, a, b, rlo, rhi):
    frac = (b - a) / (rhi - rlo)
    if pts.shape[0] == 0:
        return frac
    cnt = np.searchsorted(pts, b, side="right") - np.searchsorted(pts, a, side="left")
    return (cnt + SAMPLE_SMOOTHING * frac) / (pts.shape[0] + SAMPLE_SMOOTHING)


@njit(cache=True)
def axis_partition(lo, hi, rlo, rhi, k, pts):
    """Cut the axis range [rlo, rhi] into at most k intervals for intervals [lo_i, hi_i] (clipped to
    the range). ``pts`` are sorted sample coordinates (empty: uniform). Returns the boundaries
    (rlo, b1, ..., rhi), strictly increasing. O(n log n)."""
    slo, shi, centres, cand = axis_sorted(lo, hi)
    return axis_partition_sorted(slo, shi, centres, cand, rlo, rhi, k, pts)


@njit(cache=True)
def axis_sorted(lo, hi):
    """What ``axis_partition_sorted`` takes for intervals [lo_i, hi_i]: their los, his and centres
    sorted, and all their ends sorted. O(n log n), once for every grid size tried at a node
    (sorting again for each was most of a build's time: docs/BENCHMARKS.md)."""
    slo = np.sort(lo)
    shi = np.sort(hi)
    centres = np.sort((lo + hi) * 0.5)
    cand = np.concatenate((slo, shi))
    cand.sort()
    return slo, shi, centres, cand


@njit(cache=True)
def axis_partition_sorted(slo, shi, centres, cand, rlo, rhi, k, pts):
    """``axis_partition`` of intervals given by ``axis_sorted``. O(k · candidates)."""
    n = slo.shape[0]
    b = np.empty(k + 1)
    b[0] = rlo
    m = 1
    for j in range(1, k):
        c = centres[(j * n) // k]
        if c > b[m - 1] and c < rhi:
            b[m] = c
            m += 1
    b[m] = rhi
    m += 1
    bounds = b[:m].copy()
    if m <= 2:
        # the centres give no split (all equal): split at the first edge strictly inside
        found = False
        split = rlo
        for c in cand:
            if c > rlo and c < rhi:
                found = True
                split = c
                break
        if not found:
            return bounds
        bounds = np.array([rlo, split, rhi])
        m = 3
    for j in range(1, m - 1):
        a = bounds[j - 1]
        e = bounds[j + 1]
        i0 = np.searchsorted(cand, a, side="right")
        i1 = np.searchsorted(cand, e, side="left")
        step = max(1, (i1 - i0) // DEFAULT_SPATIAL_CANDIDATES)
        cur = bounds[j]
        best = _overlap_count(slo, shi, a, cur) * _interval_prob(pts, a, cur, rlo, rhi) + (
            _overlap_count(slo, shi, cur, e) * _interval_prob(pts, cur, e, rlo, rhi)
        )
        # _overlap_count(a, c) = #(lo <= c) - #(hi < a) and _overlap_count(c, e) = #(lo <= e) -
        # #(hi < c): as c walks up the sorted candidates only #(lo <= c) and #(hi < c) change,
        # and only grow; two pointers follow them (four binary searches a candidate were most of
        # a build's time: docs/BENCHMARKS.md). The same counts, so the same boundaries.
        hi_lt_a = np.searchsorted(shi, a, side="left")
        lo_le_e = np.searchsorted(slo, e, side="right")
        lo_le_c = np.searchsorted(slo, a, side="right")
        hi_lt_c = hi_lt_a
        prev = a
        for t in range(i0, i1, step):
            c = cand[t]
            if c <= prev or c <= a or c >= e:
                continue
            prev = c
            while lo_le_c < n and slo[lo_le_c] <= c:
                lo_le_c += 1
            while hi_lt_c < n and shi[hi_lt_c] < c:
                hi_lt_c += 1
            v = (lo_le_c - hi_lt_a) * _interval_prob(pts, a, c, rlo, rhi) + (
                (lo_le_e - hi_lt_c) * _interval_prob(pts, c, e, rlo, rhi)
            )
            if v < best:
                best = v
                cur = c
        bounds[j] = cur
    return bounds


@njit(cache=True)
def cell_range(bnd, off, n, a, b):
    """Cells i in [0, n) of the axis boundaries ``bnd[off: off + n + 1]`` whose closed interval
    meets [a, b]: returns (first, last), empty when first > last. O(log n)."""
    first = 0
    lo = 0
    hi = n  # find first i with bnd[off + i + 1] >= a
    while lo < hi:
        mid = (lo + hi) // 2
        if bnd[off + mid + 1] >= a:
            hi = mid
        else:
            lo = mid + 1
    first = lo
    lo = -1
    hi = n - 1  # find last i with bnd[off + i] <= b
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bnd[off + mid] <= b:
            lo = mid
        else:
            hi = mid - 1
    return first, lo


@njit(cache=True)
def cell_of(bnd, off, n, x):
    """The one cell i in [0, n) with bnd[off+i] <= x <= bnd[off+i+1] (x clamped into range). O(log n)."""
    lo = 0
    hi = n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bnd[off + mid] <= x:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True)
def grid_cost(minx, miny, maxx, maxy, bx, by, region, px, py):
    """Eq. 1 over an x-by-y grid: sum of cell weight x cell hit probability, plus the per-cell counts.

    ``minx..maxy`` are the non-dummy subscriptions' boxes; ``px/py`` sample points inside the
    region (empty: uniform by area). O(n * cells touched + points)."""
    nx = bx.shape[0] - 1
    ny = by.shape[0] - 1
    counts = np.zeros((nx, ny), np.int64)
    for i in range(minx.shape[0]):
        x0, x1 = cell_range(bx, 0, nx, minx[i], maxx[i])
        y0, y1 = cell_range(by, 0, ny, miny[i], maxy[i])
        for a in range(x0, x1 + 1):
            for b in range(y0, y1 + 1):
                counts[a, b] += 1
    return _counts_cost(counts, bx, by, region, px, py), counts


@njit(cache=True)
def grid_cost_spanned(minx, miny, maxx, maxy, bx, by, max_span, region, px, py):
    """``grid_cost`` of the boxes that meet at most ``max_span`` cells (the others go to the dummy
    cell): (cost, counts, keep), ``keep`` false for a box sent to the dummy. Each box's cells
    are found once (the build searched them once to drop it, once to count it). O(n log cells +
    points)."""
    nx = bx.shape[0] - 1
    ny = by.shape[0] - 1
    counts = np.zeros((nx, ny), np.int64)
    keep = np.ones(minx.shape[0], np.bool_)
    for i in range(minx.shape[0]):
        x0, x1 = cell_range(bx, 0, nx, minx[i], maxx[i])
        y0, y1 = cell_range(by, 0, ny, miny[i], maxy[i])
        if (x1 - x0 + 1) * (y1 - y0 + 1) > max_span:
            keep[i] = False
            continue
        for a in range(x0, x1 + 1):
            for b in range(y0, y1 + 1):
                counts[a, b] += 1
    return _counts_cost(counts, bx, by, region, px, py), counts, keep


@njit(cache=True)
def _counts_cost(counts, bx, by, region, px, py):
    """Eq. 1 of a grid whose cells hold ``counts``: each cell's count × its hit probability."""
    nx = bx.shape[0] - 1
    ny = by.shape[0] - 1
    area = (region[2] - region[0]) * (region[3] - region[1])
    npts = px.shape[0]
    pcnt = np.zeros((nx, ny), np.float64)
    for t in range(npts):
        pcnt[cell_of(bx, 0, nx, px[t]), cell_of(by, 0, ny, py[t])] += 1.0
    cost = 0.0
    for a in range(nx):
        for b in range(ny):
            if counts[a, b] == 0:
                continue
            frac = (bx[a + 1] - bx[a]) * (by[b + 1] - by[b]) / area
            if npts == 0:
                p = frac
            else:
                p = (pcnt[a, b] + SAMPLE_SMOOTHING * frac) / (npts + SAMPLE_SMOOTHING)
            cost += counts[a, b] * p
    return cost


@njit(cache=True)
def moving_penalty(bbox, vel, upd_dt, slots, r, gx, gy, depth, f, theta_p, theta_kl, steps):
    """Cslu + Circ of an s-node (Sect. 4.3.1) in verifications per second, for the subscriptions
    ``slots`` at a node with region r cut into a uniform gx x gy grid (the paper's assumption).

    Cslu (Eq. 9): each subscription with a known update interval T_upd and velocity v crosses
    ζ = |vx| T_upd / cell width + |vy| T_upd / cell height cells per update, each crossing costing
    a deletion and an insertion along the path: sum of 2 min(1, ζ) (depth + 1) log2 f / T_upd.
    Circ (Eq. 10-13): the subtree's reconstruction cost |S| (log2 f + sqrt f + f) (h + 1) over TΔ,
    the time until the cell distribution drifts past θKL (Alg. 8, simulated ``steps`` update
    intervals ahead; never within them: no reconstruction cost). 0 when nothing moves."""
    n = slots.shape[0]
    wx = (r[2] - r[0]) / gx
    wy = (r[3] - r[1]) / gy
    logf = np.log2(max(f, 2.0))
    cslu = 0.0
    movers = 0
    dt_sum = 0.0
    for i in range(n):
        s = slots[i]
        t = upd_dt[s]
        if t <= 0.0:
            continue
        movers += 1
        dt_sum += t
        zeta = abs(vel[s, 0]) * t / max(wx, 1e-12) + abs(vel[s, 1]) * t / max(wy, 1e-12)
        cslu += 2.0 * min(1.0, zeta) * (depth + 1) * logf / t
    if movers == 0:
        return 0.0
    # Alg. 8 on the uniform grid, one step = the mean update interval
    step = dt_sum / movers
    w0 = np.full(gx * gy, 0.5)
    cx = np.empty(n)
    cy = np.empty(n)
    for i in range(n):
        s = slots[i]
        cx[i] = (bbox[s, 0] + bbox[s, 2]) * 0.5
        cy[i] = (bbox[s, 1] + bbox[s, 3]) * 0.5
        a = min(max(int((cx[i] - r[0]) / max(wx, 1e-12)), 0), gx - 1)
        b = min(max(int((cy[i] - r[1]) / max(wy, 1e-12)), 0), gy - 1)
        w0[a * gy + b] += 1.0
    tdelta = np.inf
    for k in range(1, steps + 1):
        w = np.full(gx * gy, 0.5)
        for i in range(n):
            s = slots[i]
            x = cx[i] + vel[s, 0] * step * k
            y = cy[i] + vel[s, 1] * step * k
            a = min(max(int((x - r[0]) / max(wx, 1e-12)), 0), gx - 1)
            b = min(max(int((y - r[1]) / max(wy, 1e-12)), 0), gy - 1)
            w[a * gy + b] += 1.0
        so = w0.sum()
        sc = w.sum()
        d = 0.0
        for c in range(gx * gy):
            po = w0[c] / so
            d += po * np.log(po / (w[c] / sc))
        if d > theta_kl:
            tdelta = step * k
            break
    circ = 0.0
    if tdelta < np.inf:
        h = max(1.0, np.log(max(n / theta_p, 1.0)) / np.log(max(f, 2.0)))
        circ = n * (logf + np.sqrt(f) + f) * (h + 1.0) / tdelta
    return cslu + circ
