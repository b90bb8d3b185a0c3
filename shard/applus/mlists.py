"""The m-lists of the AP+-Tree (Sect. 4.2), compiled.

Live messages hang on tree nodes in one int32 pool of message slots. Each node has two lists:

* its **m-list** (``M``): the messages a moving subscription stored below must be checked against.
  A leaf's m-list holds the messages whose matching traversal reached it (Sect. 4.2.4); an
  internal node's holds those whose traversal reached more leaves than the duplicate limit, which
  stop at the deepest level of their traversal with at most that many nodes (so a subscription
  checks its leaves' ancestors too);
* its **parking list** (``D``): the messages whose traversal reached the node and wanted to enter
  a child that does not exist (a missing dummy, an empty cell). When a subscription later creates
  that child, its m-list is filled from here (:func:`repair_created`); moves never scan it.

Together these keep the invariant the exact ± updates rest on: every live message whose traversal
of the current tree reaches a leaf is on the m-list of that leaf or of one of its ancestors.
Entries of expired messages are dropped lazily by :func:`purge`.

``MT = (ML, MP, MC)``: ``ML[node]`` = (M offset, M length, M capacity, D offset, D length, D capacity),
``MP`` the pool, ``MC`` = (pool slots used, pool slots orphaned). A pool entry ``MP[k]`` is
(message slot, lon, lat) in int32, the point's coordinates in fixed point (units of ``FIX_DEG``;
``NO_POINT`` for a region message): a move tests its candidates' locations reading the pool in
order, in the cache lines it reads the slots from, not the message columns at random, and goes to
the exact float64 location only where the rounded one cannot decide (:func:`_hits_rounded`). A
message slot is reused only after :func:`purge` has dropped its entries, so the copy never goes
stale.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.aptree.layout import (
    F_BOFF,
    F_CHOFF,
    F_DEPTH,
    F_DUMMY,
    F_NCH,
    F_NX,
    F_NY,
    F_PARENT,
    F_TYPE,
    FREED,
    KNODE,
    LEAF,
    T_BND,
    T_CH,
    T_NF,
    T_NI,
)
from shard.aptree.match import grown
from shard.aptree.partition import cell_of, cell_range
from shard.geometry import KIND_CIRCLE, haversine_m, region_hits_point, region_hits_rect

M_LIST = 0
D_LIST = 3
MIN_CAP = 4
FIX_DEG = 1e-7
"""The unit of a pool entry's fixed-point coordinates (|180 / FIX_DEG| fits in an int32)."""
NO_POINT = -(2**31)
"""The longitude of a pool entry whose message is a region: always tested exactly."""
ROUND_DEG = 2e-7
"""Bound on |FIX_DEG * round(v / FIX_DEG) - v| (half a unit, plus the float rounding), doubled."""
ROUND_M = 1.0
"""Bound on the change of a great-circle distance when both coordinates of a point move by
ROUND_DEG (0.03 m) plus the haversine's own rounding, with room to spare."""

# message store tuple (see messages.py): alive, kind, geom, toff, tlen, terms
MS_ALIVE, MS_KIND, MS_GEOM, MS_TOFF, MS_TLEN, MS_TERMS = range(6)


def new_mlists(node_cap: int = 1024, pool_cap: int = 4096):
    ML = np.zeros((node_cap, 6), np.int64)
    MP = np.full((pool_cap, 3), -1, np.int32)
    MC = np.zeros(2, np.int64)
    return (ML, MP, MC)


@njit(cache=True)
def ensure_rows(MT, n):
    """At least ``n`` node rows (the tree's node array may have grown)."""
    ML = MT[0]
    if n <= ML.shape[0]:
        return MT
    ML2 = np.zeros((max(n, 2 * ML.shape[0]), 6), np.int64)
    ML2[: ML.shape[0]] = ML
    return (ML2, MT[1], MT[2])


@njit(cache=True)
def _append(MT, u, which, x, geom):
    """Append message slot x (location ``geom[x]``) to list ``which`` of node u."""
    ML = MT[0]
    n = ML[u, which + 1]
    if n == ML[u, which + 2]:
        cap = max(MIN_CAP, 2 * n)
        MP = MT[1]
        MC = MT[2]
        if MC[0] + cap > MP.shape[0]:
            MP2 = np.full((max(MC[0] + cap, 2 * MP.shape[0]), 3), -1, np.int32)
            MP2[: MP.shape[0]] = MP
            MP = MP2
            MT = (ML, MP, MC)
        old = ML[u, which]
        off = MC[0]
        MP[off : off + n] = MP[old : old + n]
        MC[0] += cap
        MC[1] += ML[u, which + 2]
        ML[u, which] = off
        ML[u, which + 2] = cap
    e = MT[1][ML[u, which] + n]
    e[0] = x
    if geom[x, 0] == geom[x, 2] and geom[x, 1] == geom[x, 3]:
        e[1] = np.int32(round(geom[x, 0] / FIX_DEG))
        e[2] = np.int32(round(geom[x, 1] / FIX_DEG))
    else:
        e[1] = NO_POINT
        e[2] = NO_POINT
    ML[u, which + 1] = n + 1
    return MT


@njit(cache=True)
def store_traces(T, MT, tr_m, tr_n, tr_d, slot_of_q, dup_limit, geom):
    """Hang each traced message on the nodes of its traversal (Sect. 4.2.4): on every leaf it
    reached, or, past ``dup_limit`` leaves, on the nodes of the deepest level of its traversal
    that has at most ``dup_limit`` nodes (leaves above that level count at their own depth); and
    on the parking list of every node where it met a dead end. Trace entries of one message are
    contiguous; ``geom`` holds the messages' boxes by slot. O(trace length)."""
    NI = T[T_NI]
    n = tr_m.shape[0]
    i = 0
    while i < n:
        q = tr_m[i]
        j = i
        while j < n and tr_m[j] == q:
            j += 1
        x = slot_of_q[q]
        if x >= 0:
            n_leaves = 0
            dmin = 1 << 40
            dmax = 0
            for k in range(i, j):
                u = tr_n[k]
                if NI[u, F_TYPE] == LEAF:
                    n_leaves += 1
                dd = NI[u, F_DEPTH]
                dmin = min(dmin, dd)
                dmax = max(dmax, dd)
                if tr_d[k]:
                    MT = _append(MT, u, D_LIST, x, geom)
            if n_leaves <= dup_limit:
                for k in range(i, j):
                    u = tr_n[k]
                    if NI[u, F_TYPE] == LEAF:
                        MT = _append(MT, u, M_LIST, x, geom)
            else:
                # count(d) = nodes at depth d + leaves above d; non-decreasing in d
                width = dmax - dmin + 1
                at = np.zeros(width, np.int64)
                leaves_at = np.zeros(width, np.int64)
                for k in range(i, j):
                    u = tr_n[k]
                    at[NI[u, F_DEPTH] - dmin] += 1
                    if NI[u, F_TYPE] == LEAF:
                        leaves_at[NI[u, F_DEPTH] - dmin] += 1
                best = 0
                above = 0
                for d in range(width):
                    if at[d] + above <= dup_limit:
                        best = d
                    else:
                        break
                    above += leaves_at[d]
                for k in range(i, j):
                    u = tr_n[k]
                    dd = NI[u, F_DEPTH] - dmin
                    if dd == best or (dd < best and NI[u, F_TYPE] == LEAF):
                        MT = _append(MT, u, M_LIST, x, geom)
        i = j
    return MT


@njit(cache=True)
def gather_subtrees(T, MT, tops, alive):
    """The distinct live messages on the M and D lists of every node below (and at) ``tops``;
    the lists are emptied (their slices stay with the node rows for reuse). Call before those
    subtrees are rebuilt. O(subtree + entries)."""
    NI = T[T_NI]
    CH = T[T_CH]
    ML = MT[0]
    MP = MT[1]
    seen = np.zeros(alive.shape[0], np.bool_)
    out = np.empty(64, np.int32)
    n = 0
    stack = np.empty(64, np.int64)
    for r in range(tops.shape[0]):
        top = 1
        stack[0] = tops[r]
        while top > 0:
            top -= 1
            u = stack[top]
            for which in (M_LIST, D_LIST):
                off = ML[u, which]
                for k in range(off, off + ML[u, which + 1]):
                    x = MP[k, 0]
                    if alive[x] and not seen[x]:
                        seen[x] = True
                        if n == out.shape[0]:
                            o2 = np.empty(2 * n, np.int32)
                            o2[:n] = out
                            out = o2
                        out[n] = x
                        n += 1
                ML[u, which + 1] = 0
            if NI[u, F_TYPE] != LEAF:
                off = NI[u, F_CHOFF]
                need = top + NI[u, F_NCH] + 1
                if need > stack.shape[0]:
                    s2 = np.empty(2 * need, np.int64)
                    s2[:top] = stack[:top]
                    stack = s2
                for k in range(NI[u, F_NCH]):
                    if CH[off + k] >= 0:
                        stack[top] = CH[off + k]
                        top += 1
                if NI[u, F_DUMMY] >= 0:
                    stack[top] = NI[u, F_DUMMY]
                    top += 1
    return out[:n].copy()


@njit(cache=True)
def repair_created(T, MT, MS, created):
    """Fill the m-list of each leaf just created under a node that had no such child, from the
    parent's parking list: the messages that wanted to enter that child. O(parking list)."""
    NI = T[T_NI]
    CH = T[T_CH]
    BND = T[T_BND]
    ML = MT[0]
    alive = MS[MS_ALIVE]
    kind = MS[MS_KIND]
    geom = MS[MS_GEOM]
    for i in range(created.shape[0]):
        c = created[i]
        u = NI[c, F_PARENT]
        if u < 0:
            continue
        is_dummy = NI[u, F_DUMMY] == c
        slot = -1
        if not is_dummy and NI[u, F_TYPE] != KNODE:
            off = NI[u, F_CHOFF]
            for k in range(NI[u, F_NCH]):
                if CH[off + k] == c:
                    slot = k
        off = ML[u, D_LIST]
        n = ML[u, D_LIST + 1]
        for k in range(off, off + n):
            x = MT[1][k, 0]
            if not alive[x]:
                continue
            enters = is_dummy or NI[u, F_TYPE] == KNODE
            if not enters:
                # s-node cell: does the message's location reach the cell (as matching does)?
                boff = NI[u, F_BOFF]
                nx = NI[u, F_NX]
                ny = NI[u, F_NY]
                a_c = slot // ny
                b_c = slot - a_c * ny
                if kind[x] == 0:
                    enters = (
                        cell_of(BND, boff, nx, geom[x, 0]) == a_c
                        and cell_of(BND, boff + nx + 1, ny, geom[x, 1]) == b_c
                    )
                else:
                    x0, x1 = cell_range(BND, boff, nx, geom[x, 0], geom[x, 2])
                    y0, y1 = cell_range(BND, boff + nx + 1, ny, geom[x, 1], geom[x, 3])
                    enters = x0 <= a_c <= x1 and y0 <= b_c <= y1
            if enters:
                MT = _append(MT, c, M_LIST, x, geom)
    return MT


@njit(cache=True)
def _covers(kind, bbox, circ, r):
    """Does the subscription region contain the node region r (x0, y0, x1, y1)?"""
    if bbox[0] > r[0] or bbox[1] > r[1] or bbox[2] < r[2] or bbox[3] < r[3]:
        return False
    if kind != KIND_CIRCLE:
        return True
    # the farthest point of a lon/lat rectangle from a point is one of its corners
    for cx in (r[0], r[2]):
        for cy in (r[1], r[3]):
            if haversine_m(circ[0], circ[1], cx, cy) > circ[2]:
                return False
    return True


UNSURE = 2


@njit(cache=True)
def _hits_rounded(kind, bbox, circ, lon_fix, lat_fix):
    """Does a subscription region hold a message point known only in fixed point (within
    ROUND_DEG of the exact one)? 1 yes, 0 no, UNSURE when the rounding could change the answer
    or the message is a region (mirrors ``region_hits_point``)."""
    if lon_fix == NO_POINT:
        return UNSURE
    d = ROUND_DEG
    px = lon_fix * FIX_DEG
    py = lat_fix * FIX_DEG
    if px < bbox[0] - d or px > bbox[2] + d or py < bbox[1] - d or py > bbox[3] + d:
        return 0
    inside = px >= bbox[0] + d and px <= bbox[2] - d and py >= bbox[1] + d and py <= bbox[3] - d
    if kind != KIND_CIRCLE:
        return 1 if inside else UNSURE
    dist = haversine_m(circ[0], circ[1], px, py)
    if dist > circ[2] + ROUND_M:
        return 0
    if dist <= circ[2] - ROUND_M and inside:
        return 1
    return UNSURE


@njit(cache=True)
def _hits(MS, x, kind, bbox, circ):
    """Does live message x's location meet the subscription region?"""
    geom = MS[MS_GEOM]
    if MS[MS_KIND][x] == 0:
        return region_hits_point(kind, bbox, circ, geom[x, 0], geom[x, 1])
    return region_hits_rect(kind, bbox, circ, geom[x])


@njit(cache=True)
def _text_matches(TM, tstamp, cl_off, cl_terms):
    """Does some clause (CSR) have all its terms marked ``TM[term] == tstamp``?"""
    for c in range(cl_off.shape[0] - 1):
        ok = True
        for j in range(cl_off[c], cl_off[c + 1]):
            t = cl_terms[j]
            if t >= TM.shape[0] or TM[t] != tstamp:
                ok = False
                break
        if ok:
            return True
    return False


@njit(cache=True)
def _mark_terms(MS, x, TM, ts):
    """Mark message x's terms in ``TM`` with a fresh stamp; returns it."""
    ts += 1
    terms = MS[MS_TERMS]
    t0 = MS[MS_TOFF][x]
    for j in range(t0, t0 + MS[MS_TLEN][x]):
        TM[terms[j]] = ts
    return ts


@njit(cache=True)
def _matches(MS, x, TM, tstamp, cl_off, cl_terms, kind, bbox, circ):
    """Does live message x match the subscription (clauses as CSR, region)? TM[term] == tstamp
    marks x's terms (set by the caller)."""
    return _hits(MS, x, kind, bbox, circ) and _text_matches(TM, tstamp, cl_off, cl_terms)


@njit(cache=True)
def change_of(MS, x, TM, ts, has_old, oo, ot, ok, ob, oc, has_new, no, nt, nk, nb, nc):
    """How message x's membership changes when a subscription goes from its old form (clause
    offsets, clause terms, kind, bbox, circle) to its new one: +1 gained, -1 lost, 0 same.
    Marks x's terms in ``TM`` with a fresh stamp; returns (sign, that stamp)."""
    ts = _mark_terms(MS, x, TM, ts)
    was = has_old and _matches(MS, x, TM, ts, oo, ot, ok, ob, oc)
    now = has_new and _matches(MS, x, TM, ts, no, nt, nk, nb, nc)
    if was == now:
        return 0, ts
    return (1 if now else -1), ts


@njit(cache=True)
def move_change_of(MS, x, TM, ts, cl_off, cl_terms, ok, ob, oc, nk, nb, nc):
    """``change_of`` when only the region changes (a move; clauses ``cl_off``/``cl_terms`` in
    both forms): the regions are tested first and the text only where they disagree."""
    was = _hits(MS, x, ok, ob, oc)
    if was == _hits(MS, x, nk, nb, nc):
        return 0, ts
    ts = _mark_terms(MS, x, TM, ts)
    if not _text_matches(TM, ts, cl_off, cl_terms):
        return 0, ts
    return (-1 if was else 1), ts


@njit(cache=True)
def push_update(out_x, out_g, n, x, g):
    """Append (message slot, sign) to growable output arrays; returns them and the new count."""
    if n == out_x.shape[0]:
        out_x = grown(out_x, n)
        out_g = grown(out_g, n)
    out_x[n] = x
    out_g[n] = g
    return out_x, out_g, n + 1


@njit(cache=True)
def diff_results(
    T,
    MT,
    MS,
    leaves,
    NSTAMP,
    MSTAMP,
    stamp,
    TM,
    ts,
    has_old,
    o_cl_off,
    o_cl_terms,
    o_kind,
    o_bbox,
    o_circ,
    has_new,
    n_cl_off,
    n_cl_terms,
    n_kind,
    n_bbox,
    n_circ,
):
    """The ± updates of one subscription going from its old form (clauses, region) to its new one
    (Alg. 6 with Alg. 7's verification): every live message on the m-lists of ``leaves`` and their
    ancestors is checked once against both forms; +1 where only the new matches, -1 where only
    the old did. When the clauses are unchanged (a move), a node whose region both regions contain
    is skipped (case 1: every message there meets both regions, so nothing changes). ``NSTAMP``/``MSTAMP`` (per node / message slot) hold
    ``stamp`` once seen; ``TM`` marks a message's terms with a running counter from ``ts``.
    Returns (message slots, signs, last term stamp)."""
    NI = T[T_NI]
    NF = T[T_NF]
    ML = MT[0]
    MP = MT[1]
    alive = MS[MS_ALIVE]
    out_x = np.empty(64, np.int32)
    out_g = np.empty(64, np.int8)
    n = 0
    # case 1 holds only when the keyword condition is the same in both forms (a move); a
    # replacement that changes the clauses must check every message even where regions agree
    same_terms = (
        has_old
        and has_new
        and o_cl_off.shape[0] == n_cl_off.shape[0]
        and o_cl_terms.shape[0] == n_cl_terms.shape[0]
        and np.all(o_cl_off == n_cl_off)
        and np.all(o_cl_terms == n_cl_terms)
    )
    for i in range(leaves.shape[0]):
        v = leaves[i]
        while v >= 0 and NSTAMP[v] != stamp:
            NSTAMP[v] = stamp
            r = NF[v]
            if not (
                same_terms
                and _covers(o_kind, o_bbox, o_circ, r)
                and _covers(n_kind, n_bbox, n_circ, r)
            ):
                off = ML[v, M_LIST]
                for k in range(off, off + ML[v, M_LIST + 1]):
                    x = MP[k, 0]
                    if same_terms:
                        # a move: the regions first, on the rounded box copied into the pool
                        # (read in order; the exact one where that cannot decide), and only
                        # where they disagree whether the message is live, new to this move,
                        # and matches the text: most candidates stop at the box
                        a = _hits_rounded(o_kind, o_bbox, o_circ, MP[k, 1], MP[k, 2])
                        b = _hits_rounded(n_kind, n_bbox, n_circ, MP[k, 1], MP[k, 2])
                        if a == b and a != UNSURE:
                            continue
                        was = a == 1 if a != UNSURE else _hits(MS, x, o_kind, o_bbox, o_circ)
                        now = b == 1 if b != UNSURE else _hits(MS, x, n_kind, n_bbox, n_circ)
                        if was == now:
                            continue
                        if not alive[x] or MSTAMP[x] == stamp:
                            continue
                        MSTAMP[x] = stamp
                        ts = _mark_terms(MS, x, TM, ts)
                        if not _text_matches(TM, ts, n_cl_off, n_cl_terms):
                            continue
                        g = -1 if was else 1
                    else:
                        if not alive[x] or MSTAMP[x] == stamp:
                            continue
                        MSTAMP[x] = stamp
                        g, ts = change_of(
                            MS, x, TM, ts,
                            has_old, o_cl_off, o_cl_terms, o_kind, o_bbox, o_circ,
                            has_new, n_cl_off, n_cl_terms, n_kind, n_bbox, n_circ,
                        )  # fmt: skip
                    if g != 0:
                        out_x, out_g, n = push_update(out_x, out_g, n, x, g)
            v = NI[v, F_PARENT]
    return out_x[:n].copy(), out_g[:n].copy(), ts


@njit(cache=True)
def purge(T, MT, alive, n_nodes):
    """Drop the entries of dead messages from every list and copy the live ones into a fresh,
    dense pool (the lazy deletion of Sect. 4.2.3). O(nodes + entries)."""
    NI = T[T_NI]
    ML = MT[0]
    MP = MT[1]
    total = 0
    for u in range(n_nodes):
        if NI[u, F_TYPE] == FREED:
            ML[u, 1] = 0
            ML[u, 4] = 0
            continue
        for which in (M_LIST, D_LIST):
            off = ML[u, which]
            live = 0
            for k in range(off, off + ML[u, which + 1]):
                if alive[MP[k, 0]]:
                    live += 1
            total += max(MIN_CAP, live + live // 2) if live else 0
    MP2 = np.full((max(total, 16), 3), -1, np.int32)
    pos = 0
    for u in range(ML.shape[0]):
        for which in (M_LIST, D_LIST):
            if u >= n_nodes or NI[u, F_TYPE] == FREED:
                ML[u, which] = 0
                ML[u, which + 1] = 0
                ML[u, which + 2] = 0
                continue
            off = ML[u, which]
            live = 0
            for k in range(off, off + ML[u, which + 1]):
                if alive[MP[k, 0]]:
                    MP2[pos + live] = MP[k]
                    live += 1
            cap = max(MIN_CAP, live + live // 2) if live else 0
            ML[u, which] = pos
            ML[u, which + 1] = live
            ML[u, which + 2] = cap
            pos += cap
    MC = MT[2]
    MC[0] = pos
    MC[1] = 0
    return (ML, MP2, MC)


@njit(cache=True)
def count_entries(MT, n_nodes):
    """(m-list entries, parking entries) over all nodes."""
    ML = MT[0]
    m = 0
    d = 0
    for u in range(min(n_nodes, ML.shape[0])):
        m += ML[u, 1]
        d += ML[u, 4]
    return m, d
