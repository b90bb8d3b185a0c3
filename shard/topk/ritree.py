"""The R^I-tree of paper 001 (Hu, Cheng, Wu, Jin; Sect. 5): an R-tree over the subscriptions'
points whose nodes carry per-attribute interval summaries, searched best-first for the exact
top k with the upper bound of Eq. 5-8.

Layout (Sect. 5.1), all flat arrays, no Python object per node:

* nodes: ``level`` (0 = leaf), ``count``, ``child[node, 0:count]`` (child nodes, or
  subscription slots in a leaf), ``parent``, ``box`` (the MBR, the paper's *rectangle*),
  ``amin`` / ``amax`` (α_min, α_max);
* the **forest** F of a node: rows (attribute key, lo, hi, ω) sorted by key, one slice of the
  ``f_*`` pool per node. A leaf's rows are its subscriptions' predicate intervals (Table 2)
  with ω premultiplied by (1 − α) (Sect. 5.1); an internal node's rows are its children's
  aggregates Γ -- as in the paper, where ``T_attr`` of a non-leaf node holds ``U.Γ_attr`` of
  each child U;
* the **aggregate** Γ of a node: per attribute key (min lo, max hi, max ω) over its forest, one
  slice of the ``g_*`` pool: the paper's ``(attr_i, range, ω_max)``.

The paper's per-attribute *dynamic interval trees* (Kaplan et al., stabbing-max in O(log² n))
are replaced by this columnar equivalent: a stabbing-max query of key ``a`` at ``v`` binary
searches the node's key-sorted rows for ``a`` and scans that key's rows (at most one per child
or predicate) for the largest ω with lo ≤ v ≤ hi. The answer is the same maximum, so the bound
UB_t of Eq. 5 is the paper's, at O(log |F| + rows of a) per attribute; a row is updated in
place in O(log |F| + rows of its key), and a row added or removed rewrites the node's forest
(O(|F|), a merge) instead of O(log n) (see insert and delete below).

Search (Sect. 5.2, Algorithm 1) is one compiled kernel per batch: a max-priority queue of
nodes keyed by UB (Eq. 8), seeded with the root; a popped leaf has its subscriptions scored
exactly (``kernels.score_slot``), a popped internal node queues its children; the search stops
when the popped bound is below the k-th best score (Theorem 1: nothing queued can beat it).
A child is first queued by a cheap bound -- Eq. 8 with UB_t = +inf, i.e. only its MBR (Eq. 6)
and α range -- and when that entry comes to the top, its paper bound UB(e, child) (Eq. 8 with
Eq. 5's UB_t over its forest) is computed and the child re-queued with it, or dropped when
below τ. Both are upper bounds of every ψ below the child (Theorem 1 with ψ_t ≤ 1), so the
search is exact; the forest is only consulted for children the search gets to.

Insert and delete (the paper gives none; our design):

* **insert**: ChooseLeaf by the least MBR enlargement (as a share of the root's area) plus α
  widening, then least area, then first child (compiled, ``choose_leaf``; Guttman's
  enlargement-first rule grew slower trees); the point joins the leaf; an overflowing node (``fanout + 1`` entries) is split in half along x, y or α, whichever
  cut leaves the least normalised area plus α-range width (a root split grows a new root);
* **delete**: the slot leaves its leaf; a node left empty is unlinked from its parent (upwards);
  a root left with one child is replaced by it. Underfull nodes are kept (no
  condense-and-reinsert): they only cost pruning power, never correctness, and ``build``
  repacks;
* **the path re-summarised** (``patch_path``, compiled): a changed node's summaries are
  *patched*, not recomputed. The leaf's forest gains or loses the subscription's rows; what
  that changes in its Γ (keys gone, keys new, keys whose (lo, hi, ω) moved) is what changes in
  its parent's forest, and so on up. Above the leaves a change is mostly a key's values moving:
  the parent's row for it is found by binary search and overwritten in place, and only that
  key's Γ entry recomputed -- O(changes x (log |F| + rows of the key)), where recomputing the
  root's forest of ~16,000 rows took most of the 0.9 ms an insert used to cost. A node whose
  MBR, α range and Γ did not change stops the walk (its ancestors depend on nothing else). A
  leaf split is summarised whole (numpy), and its parent patched with the old leaf's Γ out and
  the two halves' in; a split that cascades re-summarises its path whole.

**Bulk load** (``build``) is its own path: Sort-Tile-Recursive packing of the points into full
leaves, level by level, summaries computed for a whole level at once; the entries of a level are
first cut into ``alpha_slabs`` slabs by α (``DEFAULT_ALPHA_SLABS``), so that nodes have narrow
[α_min, α_max] ranges, on which Eq. 8 depends.

Where the paper is ambiguous
----------------------------
* Dynamic interval trees -> a key-sorted columnar forest per node (same stabbing-max, see
  above); Γ as (min lo, max hi, max ω) per key over the node's forest.
* Strict ``<`` / ``>`` become closed intervals, ``in`` its hull, ``!=`` / ``not in`` the whole
  domain (Table 2, widened to ±inf): bounds only; scoring is exact.
* Algorithm 1's ``break`` sits in the leaf loop; we stop the whole search when the popped bound
  is below τ − ``BOUND_SLACK`` (the prose's rule), and keep every subscription tied with the
  k-th (``kernels``), so the tie rule is exact.
* Algorithm 1 computes UB(e, child) for every child of an expanded node; we queue a child by
  its spatial/α bound first and compute the forest bound when the child reaches the top
  (above): a node is still expanded only once its paper bound passed the test against τ,
  and the forests of children the search never reaches are not read.
* Insert/delete/split policy: see above (not in the paper). Node capacity 50 as in Sect. 6.1.
* The paper's R-tree is spatial and says nothing of packing: we pack by α slabs first and let
  ChooseLeaf weigh the α range with the MBR (an R-tree over the points still: MBRs, MinDist
  and Eq. 6 are unchanged; only which points share a node differs).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.sorted_arrays import lower_bound
from shard.topk.base import TopKIndex
from shard.topk.kernels import (
    BOUND_SLACK,
    batch_scratch,
    combined_bound,
    emit,
    offer,
    pq_pop,
    pq_push,
    pq_reserve,
    reserve,
    score_slot,
    spatial_bound,
    threshold,
)

DEFAULT_FANOUT = 50
"""Entries per node at most: the paper's setting ("the maximum number of children of a node in
the R^I-tree ... is 50", Sect. 6.1)."""

DEFAULT_ALPHA_SLABS = 8
"""α slabs of the bulk load (1: a purely spatial packing); see ``str_groups``. Eq. 8 is tight
only for a node whose [α_min, α_max] is narrow, and a purely spatial packing gives every node
about [0, 1] under the paper's default f_α = U(0, 1). Chosen on 100,000 generated subscriptions
(``gen_topk`` defaults, MaxDist = their bounding-box diagonal, k = 10, 300 events): fanout 50,
1 slab 3.6 ms/event, 4 slabs 1.9, 8 slabs 1.2, 16 slabs 1.9; fanout 16, 1 slab 4.3, 8 slabs 1.2,
32 slabs 1.8 -- measured with other processes loading the 2 cores, so +-30 %."""

_INF = np.inf
_G_FIELDS = ("key", "lo", "hi", "w")
_NO_ROWS = np.zeros((0, 4))


@njit(cache=True, inline="always")
def forest_ubt(u, f_start, f_len, f_key, f_lo, f_hi, f_w, e_key, e_val, e0, e1):
    """UB_t(e, u) of Eq. 5: for every event attribute, the stabbing-max of ``u``'s forest at the
    event's value (the largest ω of a row of that key with lo ≤ v ≤ hi), summed.
    O(attributes x (log |F| + rows of the key))."""
    a = f_start[u]
    b = a + f_len[u]
    total = 0.0
    for i in range(e0, e1):
        key = e_key[i]
        v = e_val[i]
        best = 0.0
        j = lower_bound(f_key, a, b, key)
        while j < b and f_key[j] == key:
            if f_lo[j] <= v and v <= f_hi[j] and f_w[j] > best:
                best = f_w[j]
            j += 1
        total += best
    return total


@njit(cache=True)
def ritree_kernel(tree, n_keys, e_off, e_key, e_val, e_x, e_y, k, max_dist, slack, cols):
    """Algorithm 1 (Sect. 5.2) for every event of a batch: best-first over the tree by UB
    (Eq. 8), leaves scored exactly, stop when the best queued bound is below τ − slack.
    Returns (offsets, slots, scores, subscriptions scored): per event the top k and the
    k-th's ties.
    O(visited nodes x fanout x (event attributes x log |F|) + scored subscriptions)."""
    root, level, count, child, box, amin, amax, f_start, f_len, f_key, f_lo, f_hi, f_w = tree
    ne = e_x.shape[0]
    ev_stamp, ev_val, top, out_off, out_slot, out_score, buf_slot, buf_score = batch_scratch(
        n_keys, k, ne
    )
    n_scored = 0
    nout = 0
    pq_key = np.empty(64)
    pq_val = np.empty(64, np.int64)
    for q in range(ne):
        stamp = q + 1
        e0 = e_off[q]
        e1 = e_off[q + 1]
        for i in range(e0, e1):
            ev_stamp[e_key[i]] = stamp
            ev_val[e_key[i]] = e_val[i]
        ex = e_x[q]
        ey = e_y[q]
        ntop = 0
        nbuf = 0
        npq = 0
        if count[root] > 0:
            npq = pq_push(pq_key, pq_val, npq, _INF, root)  # Alg. 1 line 3
        while npq > 0:
            ub, u, npq = pq_pop(pq_key, pq_val, npq)
            tau = threshold(top, ntop, k) - slack
            if ub < tau:  # Alg. 1 line 14: nothing left can win
                break
            if u < 0:  # a child queued by its cheap bound: now UB of Eq. 8 with Eq. 5's UB_t
                c = -u - 1
                ubs = spatial_bound(ex, ey, box[c, 0], box[c, 1], box[c, 2], box[c, 3], max_dist)
                ubt = forest_ubt(c, f_start, f_len, f_key, f_lo, f_hi, f_w, e_key, e_val, e0, e1)
                ubc = combined_bound(ubt, ubs, amin[c], amax[c])
                if ubc >= tau:
                    npq = pq_push(pq_key, pq_val, npq, ubc, c)
                continue
            if level[u] == 0:  # Alg. 1 lines 8-13: score the leaf's subscriptions exactly
                buf_slot, buf_score, nbuf = reserve(
                    buf_slot, buf_score, nbuf, count[u], threshold(top, ntop, k)
                )
                for i in range(count[u]):
                    s = child[u, i]
                    v = score_slot(s, ev_stamp, ev_val, stamp, ex, ey, max_dist, cols)
                    n_scored += 1
                    ntop = offer(top, ntop, k, v)
                    if v >= threshold(top, ntop, k):
                        buf_slot[nbuf] = s
                        buf_score[nbuf] = v
                        nbuf += 1
            else:  # Alg. 1 lines 17-18: push the children, first by a cheap bound
                pq_key, pq_val = pq_reserve(pq_key, pq_val, npq, count[u])
                for i in range(count[u]):
                    c = child[u, i]
                    ubs = spatial_bound(
                        ex, ey, box[c, 0], box[c, 1], box[c, 2], box[c, 3], max_dist
                    )
                    ubc = combined_bound(_INF, ubs, amin[c], amax[c])  # Eq. 8 with UB_t = inf
                    if ubc >= tau:
                        npq = pq_push(pq_key, pq_val, npq, ubc, -c - 1)
        out_slot, out_score, nout = emit(
            out_slot, out_score, nout, buf_slot, buf_score, nbuf, threshold(top, ntop, k)
        )
        out_off[q + 1] = nout
    return out_off, out_slot[:nout], out_score[:nout], n_scored


@njit(cache=True)
def choose_leaf(root, level, count, child, box, amin, amax, px, py, alpha):
    """ChooseLeaf for a point at (px, py) with ``alpha``: from the root, the child of least
    cost, its MBR's enlargement as a share of the root's area plus the widening of its α
    range (the measure ``SpatialTree._split`` cuts by), then of least area, then the first.
    Guttman's rule (enlargement first, α only to break ties) grew trees searched up to 2x
    slower than this one (docs/BENCHMARKS.md, [2.8]): Eq. 8 is tight only for nodes with a
    narrow α range. O(height x fanout)."""
    u = root
    norm = max((box[root, 2] - box[root, 0]) * (box[root, 3] - box[root, 1]), 1e-300)
    while level[u] > 0:
        best = child[u, 0]
        b_cost = b_area = _INF
        for i in range(count[u]):
            c = child[u, i]
            area = (box[c, 2] - box[c, 0]) * (box[c, 3] - box[c, 1])
            enl = (max(box[c, 2], px) - min(box[c, 0], px)) * (
                max(box[c, 3], py) - min(box[c, 1], py)
            ) - area
            wid = (max(amax[c], alpha) - min(amin[c], alpha)) - (amax[c] - amin[c])
            cost = enl / norm + wid
            if cost < b_cost or (cost == b_cost and area < b_area):
                best, b_cost, b_area = c, cost, area
        u = best
    return u


@njit(cache=True)
def _bounds_of(u, level, count, child, box, amin, amax, x, y, alpha):
    """Set ``u``'s MBR and α range from its children; whether they changed. O(fanout)."""
    x0 = y0 = a0 = _INF
    x1 = y1 = a1 = -_INF
    leaf = level[u] == 0
    for i in range(count[u]):
        c = child[u, i]
        if leaf:
            x0 = min(x0, x[c])
            x1 = max(x1, x[c])
            y0 = min(y0, y[c])
            y1 = max(y1, y[c])
            a0 = min(a0, alpha[c])
            a1 = max(a1, alpha[c])
        else:
            x0 = min(x0, box[c, 0])
            y0 = min(y0, box[c, 1])
            x1 = max(x1, box[c, 2])
            y1 = max(y1, box[c, 3])
            a0 = min(a0, amin[c])
            a1 = max(a1, amax[c])
    changed = not (
        box[u, 0] == x0 and box[u, 1] == y0 and box[u, 2] == x1 and box[u, 3] == y1
        and amin[u] == a0 and amax[u] == a1
    )  # fmt: skip
    box[u, 0] = x0
    box[u, 1] = y0
    box[u, 2] = x1
    box[u, 3] = y1
    amin[u] = a0
    amax[u] = a1
    return changed


@njit(cache=True, inline="always")
def _key_run(fk, flo, fhi, fw, i, b):
    """Γ's entry of the key of row ``i`` of a key-sorted forest ending at ``b``: (min lo,
    max hi, max ω) over that key's rows from ``i``, and the row after them."""
    key = fk[i]
    lo, hi, w = flo[i], fhi[i], fw[i]
    i += 1
    while i < b and fk[i] == key:
        lo = min(lo, flo[i])
        hi = max(hi, fhi[i])
        w = max(w, fw[i])
        i += 1
    return lo, hi, w, i


@njit(cache=True, inline="always")
def _is_row(fk, flo, fhi, fw, i, r, row, at):
    """Whether pool row ``i`` is the row ``r`` of ``row`` (columns from ``at``: lo, hi, ω)."""
    return (
        fk[i] == row[r, 0]
        and flo[i] == row[r, at]
        and fhi[i] == row[r, at + 1]
        and (fw[i] == row[r, at + 2])
    )


@njit(cache=True)
def _gamma_diff(gk, glo, ghi, gw, a0, a1, b0, b1):
    """From the old Γ rows ``[a0, a1)`` to the new ``[b0, b1)`` (unique keys, sorted): the rows
    gone (rem, n x 4: key, lo, hi, ω), the rows new (add) and the keys whose values changed
    (rep, n x 7: key, old lo, hi, ω, new lo, hi, ω). O(|Γ|)."""
    rem = np.empty((a1 - a0, 4))
    add = np.empty((b1 - b0, 4))
    rep = np.empty((min(a1 - a0, b1 - b0), 7))
    nr = nd = ne = 0
    i, j = a0, b0
    while i < a1 or j < b1:
        if j >= b1 or (i < a1 and gk[i] < gk[j]):
            rem[nr, 0], rem[nr, 1], rem[nr, 2], rem[nr, 3] = gk[i], glo[i], ghi[i], gw[i]
            nr += 1
            i += 1
        elif i >= a1 or gk[j] < gk[i]:
            add[nd, 0], add[nd, 1], add[nd, 2], add[nd, 3] = gk[j], glo[j], ghi[j], gw[j]
            nd += 1
            j += 1
        else:
            if not (glo[i] == glo[j] and ghi[i] == ghi[j] and gw[i] == gw[j]):
                rep[ne, 0] = gk[i]
                rep[ne, 1], rep[ne, 2], rep[ne, 3] = glo[i], ghi[i], gw[i]
                rep[ne, 4], rep[ne, 5], rep[ne, 6] = glo[j], ghi[j], gw[j]
                ne += 1
            i += 1
            j += 1
    return rem[:nr], add[:nd], rep[:ne]


@njit(cache=True)
def patch_path(
    u, add, rem, nodes, cols, with_forest,
    fk, flo, fhi, fw, f_used, gk, glo, ghi, gw, g_used,
):  # fmt: skip
    """Re-summarise ``u`` (non-empty) and its ancestors after ``u``'s entries changed by the
    forest rows ``add`` in and ``rem`` out (n x 4: key, lo, hi, ω; each sorted by key).

    Per node: its MBR and α range from its children; its forest patched; its Γ patched. What
    changed in its Γ is what changes in its parent's forest: keys gone (rows out), keys new
    (rows in), keys whose (lo, hi, ω) changed (one row replaced). A forest that only has rows
    replaced is patched in place: the row found by binary search on its key, overwritten, and
    the Γ of each such key recomputed from that key's rows -- O(changes x (log |F| + rows of
    the key)), the common case above the leaves. Otherwise the forest is rewritten, merged by
    key with what comes and goes, at the pool's end (O(|F|), which the caller made room for),
    and Γ recomputed from it. Stops at the first node whose MBR, α range and Γ did not change
    (its ancestors depend on nothing else).

    Returns (f_used, g_used, dead forest rows, dead Γ rows, missing): a ``missing`` > 0 counts
    rows to take out that the forest did not hold (a broken invariant)."""
    level, count, child, parent, box, amin, amax, f_start, f_len, g_start, g_len = nodes
    x, y, alpha = cols
    dead_f = 0
    dead_g = 0
    rep = np.empty((0, 7))
    while u != -1:
        changed = _bounds_of(u, level, count, child, box, amin, amax, x, y, alpha)
        na, nr, ne = add.shape[0], rem.shape[0], rep.shape[0]
        if not with_forest or na + nr + ne == 0:
            add, rem, rep = add[:0], rem[:0], rep[:0]
        elif na + nr == 0:  # replacements only: in place
            a = f_start[u]
            b = a + f_len[u]
            ga = g_start[u]
            gb = ga + g_len[u]
            out = np.empty((ne, 7))
            no = 0
            for t in range(ne):
                key = rep[t, 0]
                i = lower_bound(fk, a, b, key)
                while i < b and fk[i] == key and not _is_row(fk, flo, fhi, fw, i, t, rep, 1):
                    i += 1
                if i == b or fk[i] != key:
                    return f_used, g_used, dead_f, dead_g, ne - t
                flo[i], fhi[i], fw[i] = rep[t, 4], rep[t, 5], rep[t, 6]
                lo, hi, w, _ = _key_run(fk, flo, fhi, fw, lower_bound(fk, a, b, key), b)
                g = lower_bound(gk, ga, gb, key)  # (the key is in Γ: its rows are in F)
                if not (glo[g] == lo and ghi[g] == hi and gw[g] == w):
                    out[no, 0] = key
                    out[no, 1], out[no, 2], out[no, 3] = glo[g], ghi[g], gw[g]
                    out[no, 4], out[no, 5], out[no, 6] = lo, hi, w
                    no += 1
                    glo[g], ghi[g], gw[g] = lo, hi, w
            rep = out[:no]
            changed = changed or no > 0
        else:  # rows come or go: rewrite the forest, merged by key
            a = f_start[u]
            b = a + f_len[u]
            gone = np.zeros(nr, np.bool_)
            swapped = np.zeros(ne, np.bool_)
            o = f_used
            i = a
            j = r = e = 0
            while i < b or j < na:
                if j < na and (i >= b or add[j, 0] <= fk[i]):
                    fk[o], flo[o], fhi[o], fw[o] = add[j, 0], add[j, 1], add[j, 2], add[j, 3]
                    o += 1
                    j += 1
                    continue
                key = fk[i]
                while r < nr and rem[r, 0] < key:
                    r += 1
                while e < ne and rep[e, 0] < key:
                    e += 1
                q = r
                drop = False
                while q < nr and rem[q, 0] == key:
                    if not gone[q] and _is_row(fk, flo, fhi, fw, i, q, rem, 1):
                        gone[q] = drop = True
                        break
                    q += 1
                if not drop:
                    fk[o], flo[o], fhi[o], fw[o] = fk[i], flo[i], fhi[i], fw[i]
                    q = e
                    while q < ne and rep[q, 0] == key:
                        if not swapped[q] and _is_row(fk, flo, fhi, fw, i, q, rep, 1):
                            swapped[q] = True
                            flo[o], fhi[o], fw[o] = rep[q, 4], rep[q, 5], rep[q, 6]
                            break
                        q += 1
                    o += 1
                i += 1
            missing = (nr - gone.sum()) + (ne - swapped.sum())
            if missing > 0:
                return f_used, g_used, dead_f, dead_g, missing
            dead_f += f_len[u]
            f_start[u] = f_used
            f_len[u] = o - f_used
            f_used = o
            gout = g_used  # Γ of the new forest: per key (min lo, max hi, max ω)
            t = f_start[u]
            while t < f_used:
                key = fk[t]
                lo, hi, w, t = _key_run(fk, flo, fhi, fw, t, f_used)
                gk[gout], glo[gout], ghi[gout], gw[gout] = key, lo, hi, w
                gout += 1
            ga = g_start[u]
            rem, add, rep = _gamma_diff(gk, glo, ghi, gw, ga, ga + g_len[u], g_used, gout)
            if rem.shape[0] + add.shape[0] + rep.shape[0] > 0:  # else the old rows stay
                dead_g += g_len[u]
                g_start[u] = g_used
                g_len[u] = gout - g_used
                g_used = gout
                changed = True
        if not changed:
            break
        u = parent[u]
    return f_used, g_used, dead_f, dead_g, 0


def _grow(a: np.ndarray, need: int, fill=0) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.full((max(need, 2 * a.shape[0], 16),) + a.shape[1:], fill, a.dtype)
    b[: a.shape[0]] = a
    return b


def str_groups(
    x: np.ndarray, y: np.ndarray, cap: int, a: np.ndarray | None = None, a_slabs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Sort-Tile-Recursive packing: (order, group starts) putting the points in groups of ``cap``
    (the last of a slab may be short). With ``a`` and ``a_slabs`` > 1, the points are first cut
    into ``a_slabs`` equal slabs by ``a`` (α), each packed on its own. O(n log n).

    >>> order, starts = str_groups(np.array([0., 1, 2, 3]), np.array([0., 1, 0, 1]), 2)
    >>> [sorted(g.tolist()) for g in np.split(order, starts[1:])]  # one slab, cut by y
    [[0, 2], [1, 3]]
    """
    n = x.shape[0]
    if a is not None and a_slabs > 1 and n > cap:
        by_a = np.argsort(a, kind="stable")
        per = -(-n // a_slabs)
        per = -(-per // cap) * cap  # whole groups per α slab
        orders, starts = [], []
        for lo in range(0, n, per):
            part = by_a[lo : lo + per]
            o, st = str_groups(x[part], y[part], cap)
            orders.append(part[o])
            starts.append(st + lo)
        return np.concatenate(orders), np.concatenate(starts)
    n_groups = -(-n // cap)
    slabs = int(np.ceil(np.sqrt(n_groups)))
    per_slab = slabs * cap
    by_x = np.argsort(x, kind="stable")
    slab = np.arange(n) // per_slab
    order = by_x[np.lexsort((y[by_x], slab))]
    pos_in_slab = np.arange(n) - slab * per_slab
    first = pos_in_slab % cap == 0
    return order, np.flatnonzero(first)


class SpatialTree:
    """The R-tree of the R^I-tree (and of TAS, ``with_forest=False``): node columns, insert,
    delete, bulk load and the summaries of the module docstring."""

    def __init__(self, columns, fanout: int, with_forest: bool, alpha_slabs: int = 1) -> None:
        if not isinstance(fanout, int) or fanout < 2:
            raise ValueError(f"fanout must be an integer >= 2, got {fanout!r}")
        self.alpha_slabs = alpha_slabs
        self.cols = columns
        self.M = fanout
        self.with_forest = with_forest
        self.n_nodes = 0
        self.free: list[int] = []
        self.level = np.zeros(0, np.int32)
        self.count = np.zeros(0, np.int32)
        self.child = np.zeros((0, fanout + 1), np.int64)
        self.parent = np.zeros(0, np.int64)
        self.box = np.zeros((0, 4))
        self.amin = np.zeros(0)
        self.amax = np.zeros(0)
        self.f_start = np.zeros(0, np.int64)
        self.f_len = np.zeros(0, np.int64)
        self.g_start = np.zeros(0, np.int64)
        self.g_len = np.zeros(0, np.int64)
        self.pool = {"f": self._empty_pool(), "g": self._empty_pool()}
        self.used = {"f": 0, "g": 0}
        self.dead = {"f": 0, "g": 0}
        self.s_leaf = np.zeros(0, np.int64)
        self.root = self._new_node(0)
        self._set_empty(self.root)

    @staticmethod
    def _empty_pool() -> dict[str, np.ndarray]:
        return {
            "key": np.zeros(0, np.int32),
            "lo": np.zeros(0),
            "hi": np.zeros(0),
            "w": np.zeros(0),
        }

    # ---- nodes ---------------------------------------------------------------------------
    def _new_node(self, level: int) -> int:
        if self.free:
            u = self.free.pop()
        else:
            u = self.n_nodes
            self.n_nodes += 1
            n = self.n_nodes
            for name in ("level", "count", "parent", "amin", "amax"):
                setattr(self, name, _grow(getattr(self, name), n))
            for name in ("f_start", "f_len", "g_start", "g_len"):
                setattr(self, name, _grow(getattr(self, name), n))
            self.child = _grow(self.child, n, -1)
            self.box = _grow(self.box, n)
        self.level[u] = level
        self.count[u] = 0
        self.parent[u] = -1
        self.f_len[u] = self.g_len[u] = 0
        return u

    def _free_node(self, u: int) -> None:
        self.dead["f"] += int(self.f_len[u])
        self.dead["g"] += int(self.g_len[u])
        self.f_len[u] = self.g_len[u] = 0
        self.count[u] = 0
        self.level[u] = -1
        self.free.append(u)

    def _set_empty(self, u: int) -> None:
        self.box[u] = (_INF, _INF, -_INF, -_INF)
        self.amin[u], self.amax[u] = _INF, -_INF
        self.dead["f"] += int(self.f_len[u])
        self.dead["g"] += int(self.g_len[u])
        self.f_len[u] = self.g_len[u] = 0

    def _add_child(self, u: int, c: int) -> None:
        self.child[u, self.count[u]] = c
        self.count[u] += 1
        if self.level[u] == 0:
            self.s_leaf[c] = u
        else:
            self.parent[c] = u

    def _remove_child(self, u: int, c: int) -> None:
        n = int(self.count[u])
        row = self.child[u, :n]
        i = int(np.flatnonzero(row == c)[0])
        row[i : n - 1] = row[i + 1 : n].copy()
        self.child[u, n - 1] = -1
        self.count[u] = n - 1

    # ---- pools ---------------------------------------------------------------------------
    def _append(self, which: str, arrays: dict[str, np.ndarray]) -> int:
        n = len(arrays["key"])
        base = self.used[which]
        pool = self.pool[which]
        for f in _G_FIELDS:
            pool[f] = _grow(pool[f], base + n)
            pool[f][base : base + n] = arrays[f]
        self.used[which] = base + n
        return base

    def _maybe_compact(self) -> None:
        for which, start, length in (
            ("f", self.f_start, self.f_len),
            ("g", self.g_start, self.g_len),
        ):
            live = self.used[which] - self.dead[which]
            if self.dead[which] <= max(4096, live // 2):  # (a compacted pool has room for 2x)
                continue
            n = self.n_nodes
            ln = length[:n]
            idx = np.repeat(start[:n] - np.cumsum(ln) + ln, ln) + np.arange(ln.sum())
            pool = self.pool[which]
            for f in _G_FIELDS:  # with room to grow again (live inserts append)
                fresh = np.empty(2 * len(idx) + 16, pool[f].dtype)
                fresh[: len(idx)] = pool[f][idx]
                pool[f] = fresh
            start[:n] = np.cumsum(ln) - ln
            self.used[which] = int(ln.sum())
            self.dead[which] = 0

    # ---- summaries (Sect. 5.1) -----------------------------------------------------------
    def _summarize(self, nodes: np.ndarray, detect: bool = False) -> bool:
        """Recompute MBR, α range, forest and Γ of ``nodes`` (all non-empty, of one kind: all
        leaves or all internal) from their children. Returns whether anything changed (only
        meaningful with ``detect`` and one node)."""
        c = self.cols
        cnt = self.count[nodes].astype(np.int64)
        owner = np.repeat(np.arange(len(nodes)), cnt)
        mask = np.arange(self.M + 1)[None, :] < cnt[:, None]
        items = self.child[nodes][mask]
        starts = np.cumsum(cnt) - cnt
        leaf = self.level[nodes[0]] == 0
        if leaf:
            x0 = x1 = c.x[items]
            y0 = y1 = c.y[items]
            a0 = a1 = c.alpha[items]
        else:
            x0, y0, x1, y1 = (self.box[items, j] for j in range(4))
            a0, a1 = self.amin[items], self.amax[items]
        new_box = np.stack(
            [
                np.minimum.reduceat(x0, starts),
                np.minimum.reduceat(y0, starts),
                np.maximum.reduceat(x1, starts),
                np.maximum.reduceat(y1, starts),
            ],
            axis=1,
        )
        new_amin = np.minimum.reduceat(a0, starts)
        new_amax = np.maximum.reduceat(a1, starts)
        changed = True
        if detect:
            u = int(nodes[0])
            changed = not (
                np.array_equal(self.box[u], new_box[0])
                and self.amin[u] == new_amin[0]
                and self.amax[u] == new_amax[0]
            )
        self.box[nodes] = new_box
        self.amin[nodes] = new_amin
        self.amax[nodes] = new_amax
        if not self.with_forest:
            return changed
        if leaf:  # the subscriptions' predicate intervals, ω x (1 − α) (Sect. 5.1)
            sub_owner, rows = c.rows_of(items)
            row_owner = owner[sub_owner]
            key = c.p_key[rows]
            lo, hi = c.p_lo[rows], c.p_hi[rows]
            w = c.p_w[rows] * (1.0 - c.alpha[items][sub_owner])
        else:  # the children's Γ (Sect. 5.1, non-leaf node)
            gl = self.g_len[items]
            row_owner = np.repeat(owner, gl)
            rows = np.repeat(self.g_start[items] - np.cumsum(gl) + gl, gl) + np.arange(gl.sum())
            gp = self.pool["g"]
            key, lo, hi, w = gp["key"][rows], gp["lo"][rows], gp["hi"][rows], gp["w"][rows]
        order = np.lexsort((key, row_owner))
        row_owner, key, lo, hi, w = row_owner[order], key[order], lo[order], hi[order], w[order]
        n = len(nodes)
        self.dead["f"] += int(self.f_len[nodes].sum())
        f_count = np.bincount(row_owner, minlength=n)
        base = self._append("f", {"key": key, "lo": lo, "hi": hi, "w": w})
        self.f_start[nodes] = base + np.cumsum(f_count) - f_count
        self.f_len[nodes] = f_count
        if len(key):
            cut = np.flatnonzero(
                np.r_[True, (row_owner[1:] != row_owner[:-1]) | (key[1:] != key[:-1])]
            )
            g = {
                "key": key[cut],
                "lo": np.minimum.reduceat(lo, cut),
                "hi": np.maximum.reduceat(hi, cut),
                "w": np.maximum.reduceat(w, cut),
            }
            g_owner = row_owner[cut]
        else:
            g = {f: a[:0] for f, a in zip(_G_FIELDS, (key, lo, hi, w), strict=True)}
            g_owner = row_owner[:0]
        if detect and not changed:
            u = int(nodes[0])
            a, b = int(self.g_start[u]), int(self.g_start[u] + self.g_len[u])
            gp = self.pool["g"]
            changed = not (
                b - a == len(g["key"]) and all(np.array_equal(gp[f][a:b], g[f]) for f in _G_FIELDS)
            )
        self.dead["g"] += int(self.g_len[nodes].sum())
        g_count = np.bincount(g_owner, minlength=n)
        base = self._append("g", g)
        self.g_start[nodes] = base + np.cumsum(g_count) - g_count
        self.g_len[nodes] = g_count
        return changed

    def _resummarize_up(self, u: int) -> None:
        """Re-summarise ``u`` and its ancestors, stopping at the first unchanged summary."""
        while u != -1:
            if self.count[u] == 0:
                self._set_empty(u)
            elif not self._summarize(np.array([u]), detect=True):
                break
            u = int(self.parent[u])
        self._maybe_compact()

    # ---- bulk load -----------------------------------------------------------------------
    def bulk(self, slots: np.ndarray) -> None:
        """Sort-Tile-Recursive packing of ``slots`` into full leaves, then level by level up;
        replaces the current tree. O(n log n)."""
        self.__init__(self.cols, self.M, self.with_forest, self.alpha_slabs)  # type: ignore[misc]
        self.s_leaf = _grow(self.s_leaf, len(self.cols.ids), -1)
        if len(slots) == 0:
            return
        self._free_node(self.root)
        items = slots
        x, y = self.cols.x[items], self.cols.y[items]
        a = self.cols.alpha[items]
        level = 0
        while True:
            order, starts = str_groups(x, y, self.M, a, self.alpha_slabs)
            ends = np.r_[starts[1:], len(order)]
            nodes = np.array([self._new_node(level) for _ in range(len(starts))], np.int64)
            grouped = items[order]
            for u, a, b in zip(nodes.tolist(), starts.tolist(), ends.tolist(), strict=True):
                self.child[u, : b - a] = grouped[a:b]
                self.count[u] = b - a
            if level == 0:
                self.s_leaf[grouped] = np.repeat(nodes, ends - starts)
            else:
                self.parent[grouped] = np.repeat(nodes, ends - starts)
            self._summarize(nodes)
            if len(nodes) == 1:
                self.root = int(nodes[0])
                return
            items = nodes
            x = (self.box[nodes, 0] + self.box[nodes, 2]) / 2
            y = (self.box[nodes, 1] + self.box[nodes, 3]) / 2
            a = (self.amin[nodes] + self.amax[nodes]) / 2
            level += 1

    # ---- insert / delete -----------------------------------------------------------------
    def _split(self, u: int) -> int:
        """Move half of ``u``'s entries to a new sibling; returns it. The entries are sorted by
        x, by y and by α (centres) and cut in half; the cut with the least normalised sum of
        the halves' areas plus α-range widths wins. Both are re-summarised. O(fanout log)."""
        n = int(self.count[u])
        ch = self.child[u, :n].copy()
        if self.level[u] == 0:
            x0 = x1 = self.cols.x[ch]
            y0 = y1 = self.cols.y[ch]
            a0 = a1 = self.cols.alpha[ch]
        else:
            x0, y0, x1, y1 = (self.box[ch, j] for j in range(4))
            a0, a1 = self.amin[ch], self.amax[ch]

        def spread(idx):
            area = (x1[idx].max() - x0[idx].min()) * (y1[idx].max() - y0[idx].min())
            return area, a1[idx].max() - a0[idx].min()

        all_area, all_a = spread(np.arange(n))
        best_cost, order = np.inf, None
        for centre in ((x0 + x1) / 2, (y0 + y1) / 2, (a0 + a1) / 2):
            o = np.argsort(centre, kind="stable")
            (la, lr), (ra, rr) = spread(o[: n // 2]), spread(o[n // 2 :])
            cost = (la + ra) / max(all_area, 1e-300) + (lr + rr) / max(all_a, 1e-300)
            if cost < best_cost:
                best_cost, order = cost, o
        keep, move = ch[order[: n // 2]], ch[order[n // 2 :]]
        sib = self._new_node(int(self.level[u]))
        self.child[u, :] = -1
        self.count[u] = 0
        for c in keep.tolist():
            self._add_child(u, c)
        for c in move.tolist():
            self._add_child(sib, c)
        self._summarize(np.array([u]))
        self._summarize(np.array([sib]))
        return sib

    def _sub_rows(self, slot: int) -> np.ndarray:
        """A leaf's forest rows of ``slot`` (n x 4: key, lo, hi, ω x (1 − α)), by key."""
        c = self.cols
        rows = np.arange(c.pstart[slot], c.pstart[slot] + c.plen[slot])
        rows = rows[np.argsort(c.p_key[rows], kind="stable")]
        w = c.p_w[rows] * (1.0 - c.alpha[slot])  # as ``_summarize``
        return np.stack([c.p_key[rows].astype(np.float64), c.p_lo[rows], c.p_hi[rows], w], 1)

    def _gamma_rows(self, u: int) -> np.ndarray:
        """A copy of ``u``'s Γ rows (n x 4: key, lo, hi, ω), by key."""
        a, b = int(self.g_start[u]), int(self.g_start[u] + self.g_len[u])
        gp = self.pool["g"]
        return np.stack(
            [gp["key"][a:b].astype(np.float64), gp["lo"][a:b], gp["hi"][a:b], gp["w"][a:b]], 1
        )

    def _patch_up(self, u: int, add: np.ndarray, rem: np.ndarray) -> None:
        """``patch_path`` (compiled) from ``u``, whose entries gained the forest rows ``add``
        and lost ``rem``, after making room in the pools for the worst case (every node on the
        path rewritten, each gaining what the one below it gained)."""
        need, extra = 0, len(add)
        v = u
        while v != -1:
            extra += int(self.f_len[v])
            need += extra
            v = int(self.parent[v])
        fp, gp = self.pool["f"], self.pool["g"]
        if self.with_forest:
            for pool, which in ((fp, "f"), (gp, "g")):
                for f in _G_FIELDS:
                    pool[f] = _grow(pool[f], self.used[which] + need)
        nodes = (
            self.level, self.count, self.child, self.parent, self.box, self.amin, self.amax,
            self.f_start, self.f_len, self.g_start, self.g_len,
        )  # fmt: skip
        f_used, g_used, dead_f, dead_g, missing = patch_path(
            u, add, rem, nodes, (self.cols.x, self.cols.y, self.cols.alpha),
            self.with_forest,
            fp["key"], fp["lo"], fp["hi"], fp["w"], self.used["f"],
            gp["key"], gp["lo"], gp["hi"], gp["w"], self.used["g"],
        )  # fmt: skip
        assert missing == 0, f"node {u}: {missing} rows to remove not in its forest"
        self.used["f"], self.used["g"] = int(f_used), int(g_used)
        self.dead["f"] += int(dead_f)
        self.dead["g"] += int(dead_g)
        self._maybe_compact()

    def insert(self, slot: int) -> None:
        """ChooseLeaf, add; then the path re-summarised by ``patch_path`` (compiled) or, when
        the leaf overflows, split upwards and re-summarised node by node.
        O(height x (fanout + forest of the node)), a split O(its forests log)."""
        self.s_leaf = _grow(self.s_leaf, len(self.cols.ids), -1)
        c = self.cols
        u = choose_leaf(
            self.root, self.level, self.count, self.child, self.box, self.amin, self.amax,
            float(c.x[slot]), float(c.y[slot]), float(c.alpha[slot]),
        )  # fmt: skip
        self._add_child(u, slot)
        if self.count[u] <= self.M:
            self._patch_up(u, self._sub_rows(slot), _NO_ROWS)
            return
        p = int(self.parent[u])
        if p != -1 and self.count[p] < self.M:  # one split, its parent has room
            old = self._gamma_rows(u)  # (what the parent's forest holds of u)
            sib = self._split(u)
            self._add_child(p, sib)
            both = np.concatenate([self._gamma_rows(u), self._gamma_rows(sib)])
            self._patch_up(p, both[np.argsort(both[:, 0], kind="stable")], old)
            return
        while self.count[u] > self.M:
            sib = self._split(u)
            p = int(self.parent[u])
            if p == -1:
                p = self._new_node(int(self.level[u]) + 1)
                self._add_child(p, u)
                self.root = p
            self._add_child(p, sib)
            u = p
        self._resummarize_up(u)

    def delete(self, slot: int) -> None:
        """Remove ``slot`` from its leaf; the path re-summarised by ``patch_path`` (compiled)
        or, when the leaf empties, emptied nodes unlinked upwards and the path re-summarised node
        by node; a root of one child collapsed. O(height x (fanout + forest of the node))."""
        u = int(self.s_leaf[slot])
        self.s_leaf[slot] = -1
        self._remove_child(u, slot)
        if self.count[u] > 0:
            self._patch_up(u, _NO_ROWS, self._sub_rows(slot))
        else:
            while self.count[u] == 0 and u != self.root:
                p = int(self.parent[u])
                self._remove_child(p, u)
                self._free_node(u)
                u = p
            if self.count[u] == 0:  # the root emptied: an empty leaf
                self.level[u] = 0
            self._resummarize_up(u)
        while self.level[self.root] > 0 and self.count[self.root] == 1:
            old = self.root
            self.root = int(self.child[old, 0])
            self.parent[self.root] = -1
            self._free_node(old)

    def kernel_tree(self) -> tuple:
        fp = self.pool["f"]
        return (
            self.root,
            self.level,
            self.count,
            self.child,
            self.box,
            self.amin,
            self.amax,
            self.f_start,
            self.f_len,
            fp["key"],
            fp["lo"],
            fp["hi"],
            fp["w"],
        )

    # ---- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """Assert every structural invariant (slow; for tests); the message dumps the node."""
        c = self.cols
        seen: list[int] = []

        def dump(u: int) -> str:
            return (
                f"node {u}: level={self.level[u]} count={self.count[u]} "
                f"children={self.child[u, : self.count[u]].tolist()} box={self.box[u].tolist()} "
                f"alpha=[{self.amin[u]}, {self.amax[u]}] parent={self.parent[u]}"
            )

        def forest_rows(u: int) -> list[tuple]:
            a, n = int(self.f_start[u]), int(self.f_len[u])
            fp = self.pool["f"]
            return [
                (int(fp["key"][j]), float(fp["lo"][j]), float(fp["hi"][j]), float(fp["w"][j]))
                for j in range(a, a + n)
            ]

        def gamma_rows(u: int) -> list[tuple]:
            a, n = int(self.g_start[u]), int(self.g_len[u])
            gp = self.pool["g"]
            return [
                (int(gp["key"][j]), float(gp["lo"][j]), float(gp["hi"][j]), float(gp["w"][j]))
                for j in range(a, a + n)
            ]

        def visit(u: int, depth_level: int) -> None:
            n = int(self.count[u])
            assert self.level[u] == depth_level, dump(u)
            assert 0 <= n <= self.M, dump(u)
            assert n > 0 or u == self.root, "empty non-root " + dump(u)
            ch = self.child[u, :n].tolist()
            if n == 0:
                assert self.level[u] == 0 and self.f_len[u] == 0 and self.g_len[u] == 0, dump(u)
                return
            if self.level[u] == 0:
                seen.extend(ch)
                for s in ch:
                    assert c.live[s] and self.s_leaf[s] == u, f"slot {s}: " + dump(u)
                pts = [(c.x[s], c.y[s], c.x[s], c.y[s]) for s in ch]
                alphas = [c.alpha[s] for s in ch]
                want_f = []
                for s in ch:
                    for j in range(int(c.pstart[s]), int(c.pstart[s] + c.plen[s])):
                        want_f.append(
                            (
                                int(c.p_key[j]),
                                float(c.p_lo[j]),
                                float(c.p_hi[j]),
                                float(c.p_w[j] * (1.0 - c.alpha[s])),
                            )
                        )
            else:
                for v in ch:
                    assert self.parent[v] == u, f"child {v}: " + dump(u)
                    visit(v, depth_level - 1)
                pts = [tuple(self.box[v]) for v in ch]
                alphas = [self.amin[v] for v in ch] + [self.amax[v] for v in ch]
                want_f = [r for v in ch for r in gamma_rows(v)]
            want_box = (
                min(p[0] for p in pts),
                min(p[1] for p in pts),
                max(p[2] for p in pts),
                max(p[3] for p in pts),
            )
            assert tuple(self.box[u]) == want_box, dump(u)
            assert (self.amin[u], self.amax[u]) == (min(alphas), max(alphas)), dump(u)
            if not self.with_forest:
                return
            got_f = forest_rows(u)
            assert [r[0] for r in got_f] == sorted(r[0] for r in got_f), "forest unsorted " + dump(
                u
            )
            assert sorted(got_f) == sorted(want_f), "forest " + dump(u)
            want_g: dict[int, tuple] = {}
            for key, lo, hi, w in want_f:
                g = want_g.get(key)
                want_g[key] = (
                    (key, lo, hi, w)
                    if g is None
                    else (key, min(g[1], lo), max(g[2], hi), max(g[3], w))
                )
            assert gamma_rows(u) == [want_g[key] for key in sorted(want_g)], "gamma " + dump(u)

        assert self.parent[self.root] == -1
        visit(self.root, int(self.level[self.root]))
        live = np.flatnonzero(c.live[: len(c.ids)]).tolist()
        assert sorted(seen) == live, f"leaves hold {sorted(seen)[:20]}, live {live[:20]}"
        assert self.root not in self.free


class RITree(TopKIndex):
    """The R^I-tree (module docstring): exact top-k subscriptions of an event.

    >>> from shard.topk.model import subscription_from_dict, event_from_dict
    >>> subs = [subscription_from_dict({"id": f"s{i}", "predicates": [{"attr": "a", "op": "=",
    ...     "value": i}], "alpha": 0.5, "point": [i, 0]}) for i in range(5)]
    >>> t = RITree.build(subs, fanout=2, max_dist=4.0)
    >>> t.topk(event_from_dict({"id": "e", "attributes": {"a": 3}, "point": [3, 0]}), 2)
    [('s3', 1.0), ('s2', 0.375)]
    """

    name = "ritree"

    def __init__(
        self, *, fanout: int = DEFAULT_FANOUT, alpha_slabs: int = DEFAULT_ALPHA_SLABS, **options
    ) -> None:
        super().__init__(**options)
        self.tree = SpatialTree(self.columns, fanout, with_forest=True, alpha_slabs=alpha_slabs)

    def _bulk(self, slots: np.ndarray) -> None:
        self.tree.bulk(slots)

    def _on_add(self, slot: int) -> None:
        self.tree.insert(slot)

    def _on_remove(self, slot: int) -> None:
        self.tree.delete(slot)

    def _kernel(self, enc, k: int):
        e_off, e_key, e_val, e_x, e_y = enc
        return ritree_kernel(
            self.tree.kernel_tree(),
            len(self.columns.keys),
            e_off,
            e_key,
            e_val,
            e_x,
            e_y,
            k,
            self.max_dist,
            BOUND_SLACK,
            self.columns.kernel_columns(),
        )

    def _check(self) -> None:
        super()._check()
        self.tree.check()
