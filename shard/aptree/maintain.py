"""Dynamic maintenance of the AP-Tree (Sect. 3.3.5), compiled.

``insert_clauses`` / ``delete_clauses`` route clauses down exactly as construction placed them
(k-node: the cut holding the clause's L-th keyword, or the dummy cut when it has none; s-node: the
dummy cell when the region contains the node, else every overlapping cell), update s-lists, subtree
sizes and the current cut/cell weights, and report nodes that need work:

* a leaf above θp (and above twice its size at its last build) is split;
* an internal node holding at least ``P_KL_MIN_SIZE`` entries whose cut/cell weights drifted from
  those at construction by more than θKL (KL divergence) beyond what sampling alone explains
  (``kl_noise``) is reconstructed;
* the topmost node whose subtree fell below θp is collapsed into a leaf.

All three are done by ``rebuild_node``: collect the node's distinct clauses, recycle its
descendants, run construction (Alg. 4) at the node again.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from shard.aptree.build import (
    MIN_LEAF_CAP,
    alloc_leaf,
    alloc_node,
    build_subtree,
    collect_and_free,
    ensure_ch,
    ensure_li,
    ensure_nodes,
    init_node,
    leaf_cap,
    leaf_child,
    leaf_slice,
    set_leaf_entry,
)
from shard.aptree.layout import (
    C_CH,
    C_FREE,
    C_GARBAGE,
    C_LI,
    C_PROMOTIONS,
    C_REBUILDS,
    C_ROOT,
    F_BOFF,
    F_CHOFF,
    F_DEPTH,
    F_DUMMY,
    F_KP,
    F_L,
    F_LCAP,
    F_LLEN,
    F_LOFF,
    F_NBUILT,
    F_NCH,
    F_NUPD,
    F_NX,
    F_NY,
    F_PARENT,
    F_SIZE,
    F_SP,
    F_TYPE,
    F_WD_CUR,
    F_WD_OLD,
    FREED,
    KNODE,
    LEAF,
    P_DUMMY_SHARE,
    P_GAP_TO_DUMMY,
    P_GROWTH,
    P_KEYWORD_FANOUT,
    P_KL_CHECK_FRACTION,
    P_KL_MIN_SIZE,
    P_MAX_DEPTH,
    P_MAX_SPAN,
    P_THETA_KL,
    P_THETA_P,
    T_BND,
    T_CH,
    T_CHI,
    T_CLO,
    T_CNT,
    T_LB,
    T_LI,
    T_NF,
    T_NI,
    T_WCUR,
    T_WOLD,
)
from shard.aptree.partition import cell_range

KL_SMOOTHING = 0.5
"""Pseudo-count added to every cut/cell weight before the KL divergence, so that an empty cell
(weight 0 at construction or now) gives a finite divergence."""


@njit(cache=True)
def kl_divergence(T, u):
    """D_KL(w_old || w_cur) over the cuts/cells and the dummy of internal node ``u``. O(f)."""
    NI = T[T_NI]
    off = NI[u, F_CHOFF]
    n = NI[u, F_NCH]
    WOLD = T[T_WOLD]
    WCUR = T[T_WCUR]
    so = NI[u, F_WD_OLD] + KL_SMOOTHING
    sc = NI[u, F_WD_CUR] + KL_SMOOTHING
    for k in range(off, off + n):
        so += WOLD[k] + KL_SMOOTHING
        sc += WCUR[k] + KL_SMOOTHING
    po = (NI[u, F_WD_OLD] + KL_SMOOTHING) / so
    pc = (NI[u, F_WD_CUR] + KL_SMOOTHING) / sc
    d = po * np.log(po / pc)
    for k in range(off, off + n):
        po = (WOLD[k] + KL_SMOOTHING) / so
        pc = (WCUR[k] + KL_SMOOTHING) / sc
        d += po * np.log(po / pc)
    return d


@njit(cache=True)
def _new_leaf_child(T, parent, l, kp, sp, x0, y0, x1, y1):
    T = ensure_nodes(T, 1)
    child = alloc_node(T)
    init_node(T, child, parent, l, kp, sp, T[T_NI][parent, F_DEPTH] + 1, x0, y0, x1, y1)
    T = alloc_leaf(T, child, 0)
    return T, child


@njit(cache=True)
def _note_update(T, params, u, todo):
    """Count an update at internal node u; queue it for reconstruction when its KL check fires."""
    NI = T[T_NI]
    NI[u, F_NUPD] += 1
    if NI[u, F_SIZE] < params[P_KL_MIN_SIZE]:
        return
    every = max(params[P_THETA_P], params[P_KL_CHECK_FRACTION] * NI[u, F_NBUILT])
    if NI[u, F_NUPD] >= every:
        NI[u, F_NUPD] = 0
        if NI[u, F_KP] == 0 and params[P_GAP_TO_DUMMY] > 0.5 and params[P_KEYWORD_FANOUT] == 0:
            # below a dummy cut (space only), where the clauses of keywords without a cut wait
            # for their k-node's promotion (``promote_dummy``): rebuilt when doubled, not for
            # drift, or a fast-growing dummy would be rebuilt every 5 % of its growth
            if NI[u, F_SIZE] >= 2 * NI[u, F_NBUILT]:
                todo.append(u)
        elif kl_divergence(T, u) > params[P_THETA_KL] + kl_noise(T, u):
            todo.append(u)


@njit(cache=True)
def _dummy_due(NI, params, u):
    """Whether k-node ``u`` (one cut per keyword, gaps to the dummy) should promote its dummy
    now: ``P_DUMMY_SHARE`` of its cut count (θp at least) of clauses came to it since its
    baseline (layout.DEFAULT_DUMMY_SHARE)."""
    return (
        params[P_GAP_TO_DUMMY] > 0.5
        and params[P_KEYWORD_FANOUT] == 0
        and NI[u, F_WD_CUR] - NI[u, F_WD_OLD]
        >= max(params[P_THETA_P], params[P_DUMMY_SHARE] * NI[u, F_NCH])
    )


@njit(cache=True)
def kl_noise(T, u):
    """The divergence that sampling alone gives node ``u``: if the entries added since its build
    followed the built distribution over its k cuts/cells exactly, the counts would still
    drift by about (k - 1) / 2 * dN / N^2 (the multinomial's expected KL, dN new of N entries).
    θKL is a threshold on drift *beyond* that. With the paper's f = 200 cuts it is ~1e-5 at
    5 % growth, nothing beside θKL = 0.001; with one cut per keyword (~90,000 at the root of
    1M real place names) it is ~0.01, and the root was rebuilt after every 5 % of growth
    (docs/BENCHMARKS.md)."""
    NI = T[T_NI]
    off = NI[u, F_CHOFF]
    k = NI[u, F_NCH] + 1  # and the dummy
    n_old = NI[u, F_WD_OLD] + 0.0
    n_cur = NI[u, F_WD_CUR] + 0.0
    for j in range(off, off + NI[u, F_NCH]):
        n_old += T[T_WOLD][j]
        n_cur += T[T_WCUR][j]
    grown = abs(n_cur - n_old)
    n = max(n_cur, 1.0)
    return (k - 1) / 2.0 * grown / (n * n)


@njit(cache=True)
def _route(T, S, params, c, delta, todo, touched, created):
    """Route clause c from the root; delta=+1 inserts it into every leaf it belongs to, -1 removes
    it. Appends each leaf it reaches to ``touched`` and each leaf it had to create (under a node
    that had no such child) to ``created``."""
    b = S[1][S[3][c]]
    return _route_from(
        T, S, params, c, delta, todo, touched, created, T[T_CNT][C_ROOT], b[0], b[1], b[2], b[3]
    )


@njit(cache=True)
def _route_from(T, S, params, c, delta, todo, touched, created, start, b0, b1, b2, b3):
    """``_route`` from node ``start`` with the region's box given (b0, b1, b2, b3): a move
    removes a clause under the old box while the store holds the new one."""
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    theta_p = params[P_THETA_P]
    stack = List()
    stack.append(np.int64(start))  # int64 whatever the caller passes (child ids are int32)
    while len(stack) > 0:
        u = stack.pop()
        NI = T[T_NI]
        typ = NI[u, F_TYPE]
        if typ == LEAF:
            touched.append(u)
            if delta > 0:
                T = _leaf_append(T, u, c, S)
                NI = T[T_NI]
                if (
                    NI[u, F_LLEN] > theta_p
                    and NI[u, F_LLEN] > 2 * NI[u, F_NBUILT]
                    and (NI[u, F_KP] == 1 or NI[u, F_SP] == 1)
                ):
                    todo.append(u)
            else:
                _leaf_remove(T, u, c)
            p = u
            while p >= 0:
                NI[p, F_SIZE] += delta
                p = NI[p, F_PARENT]
            if delta < 0:
                # collapse the topmost ancestor that fell below θp
                top = -1
                p = NI[u, F_PARENT]
                while p >= 0:
                    if NI[p, F_SIZE] < theta_p:
                        top = p
                    p = NI[p, F_PARENT]
                if top >= 0:
                    todo.append(top)
            continue
        NF = T[T_NF]
        off = NI[u, F_CHOFF]
        if typ == KNODE:
            l = NI[u, F_L]
            lo = -1
            w = -1
            if cl_len[c] > l:
                w = terms[cl_off[c] + l]
                lo = _cut_for(T, params, u, w)
            if lo < 0:
                NI[u, F_WD_CUR] += delta
                if delta > 0 and _dummy_due(NI, params, u):
                    todo.append(u)  # rebuild_nodes promotes it (``_promotable``)
                d = NI[u, F_DUMMY]
                if d < 0:
                    T, d = _new_leaf_child(
                        T, u, l + 1, 0, NI[u, F_SP], NF[u, 0], NF[u, 1], NF[u, 2], NF[u, 3]
                    )
                    NI = T[T_NI]
                    NI[u, F_DUMMY] = d
                    created.append(d)
                stack.append(d)
            else:
                # a keyword between two cuts joins the cut before it (or the first cut)
                CLO = T[T_CLO]
                CHI = T[T_CHI]
                if w < CLO[off + lo]:
                    CLO[off + lo] = w
                elif w > CHI[off + lo]:
                    CHI[off + lo] = w
                T[T_WCUR][off + lo] += delta
                child = T[T_CH][off + lo]
                if child < 0:
                    child_l = l if CLO[off + lo] != CHI[off + lo] else l + 1
                    T, child = _new_leaf_child(
                        T,
                        u,
                        child_l,
                        NI[u, F_KP],
                        NI[u, F_SP],
                        NF[u, 0],
                        NF[u, 1],
                        NF[u, 2],
                        NF[u, 3],
                    )
                    NI = T[T_NI]
                    T[T_CH][off + lo] = child
                    created.append(child)
                stack.append(child)
        else:
            boff = NI[u, F_BOFF]
            nx = NI[u, F_NX]
            ny = NI[u, F_NY]
            BND = T[T_BND]
            x0, x1, y0, y1, to_dummy = _cells_of(T, params, u, b0, b1, b2, b3)
            if to_dummy:
                NI[u, F_WD_CUR] += delta
                d = NI[u, F_DUMMY]
                if d < 0:
                    T, d = _new_leaf_child(
                        T, u, NI[u, F_L], NI[u, F_KP], 0, NF[u, 0], NF[u, 1], NF[u, 2], NF[u, 3]
                    )
                    NI = T[T_NI]
                    NI[u, F_DUMMY] = d
                    created.append(d)
                stack.append(d)
            else:
                for a in range(x0, x1 + 1):
                    for b in range(y0, y1 + 1):
                        k = off + a * ny + b
                        T[T_WCUR][k] += delta
                        child = T[T_CH][k]
                        if child < 0:
                            BND = T[T_BND]
                            T, child = _new_leaf_child(
                                T,
                                u,
                                NI[u, F_L],
                                NI[u, F_KP],
                                1,
                                BND[boff + a],
                                BND[boff + nx + 1 + b],
                                BND[boff + a + 1],
                                BND[boff + nx + 2 + b],
                            )
                            NI = T[T_NI]
                            T[T_CH][k] = child
                            created.append(child)
                        stack.append(np.int64(child))
        _note_update(T, params, u, todo)
    return T


@njit(cache=True)
def _cells_of(T, params, u, b0, b1, b2, b3):
    """Where a region with box (b0, b1, b2, b3) goes at s-node u: (x0, x1, y0, y1, to dummy)."""
    NI = T[T_NI]
    NF = T[T_NF]
    BND = T[T_BND]
    boff = NI[u, F_BOFF]
    nx = NI[u, F_NX]
    ny = NI[u, F_NY]
    x0, x1 = cell_range(BND, boff, nx, max(b0, NF[u, 0]), min(b2, NF[u, 2]))
    y0, y1 = cell_range(BND, boff + nx + 1, ny, max(b1, NF[u, 1]), min(b3, NF[u, 3]))
    contains = b0 <= NF[u, 0] and b1 <= NF[u, 1] and b2 >= NF[u, 2] and b3 >= NF[u, 3]
    dummy = contains or (x1 - x0 + 1) * (y1 - y0 + 1) > params[P_MAX_SPAN]
    return x0, x1, y0, y1, dummy


@njit(cache=True)
def _k_child(T, params, u, c, cl_off, cl_len, terms):
    """The child of k-node u that holds clause c (which is in the tree): -1 for the dummy."""
    NI = T[T_NI]
    l = NI[u, F_L]
    if cl_len[c] <= l:
        return -1
    return _cut_for(T, params, u, terms[cl_off[c] + l])


@njit(cache=True)
def _cut_for(T, params, u, w):
    """The cut of k-node u that keyword w joins: the last whose low keyword is <= w (or the
    first), or -1 for the dummy when the tree sends keywords between cuts there (see layout)."""
    off = T[T_NI][u, F_CHOFF]
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    lo = 0
    hi = T[T_NI][u, F_NCH] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if CLO[off + mid] <= w:
            lo = mid
        else:
            hi = mid - 1
    if params[P_GAP_TO_DUMMY] > 0.5 and (w < CLO[off + lo] or w > CHI[off + lo]):
        return -1
    return lo


@njit(cache=True)
def _move_route(T, S, params, c, ob, todo, touched_old, touched_new, created):
    """Move clause c from the old box ``ob`` to the box the store now holds: where both boxes
    lead to the same child the clause stays (its leaves only get the new box); where they part,
    it is removed under the old box and inserted under the new one (``_route_from``). Far less
    work than delete + insert when a region moves by a fraction of its size."""
    bbox = S[1]
    s = S[3][c]
    nb = bbox[s]
    stack = List()
    stack.append(T[T_CNT][C_ROOT])
    while len(stack) > 0:
        u = stack.pop()
        NI = T[T_NI]
        typ = NI[u, F_TYPE]
        if typ == LEAF:
            touched_old.append(u)
            touched_new.append(u)
            _leaf_set_box(T, u, c, S)
            continue
        off = NI[u, F_CHOFF]
        if typ == KNODE:
            lo = _k_child(T, params, u, c, S[4], S[5], S[6])
            stack.append(NI[u, F_DUMMY] if lo < 0 else T[T_CH][off + lo])
            continue
        ny = NI[u, F_NY]
        ox0, ox1, oy0, oy1, o_dummy = _cells_of(T, params, u, ob[0], ob[1], ob[2], ob[3])
        nx0, nx1, ny0, ny1, n_dummy = _cells_of(T, params, u, nb[0], nb[1], nb[2], nb[3])
        if o_dummy and n_dummy:
            stack.append(NI[u, F_DUMMY])
            continue
        if not o_dummy and not n_dummy and ox0 == nx0 and ox1 == nx1 and oy0 == ny0 and oy1 == ny1:
            for a in range(ox0, ox1 + 1):  # the same cells: the clause stays in each
                for b in range(oy0, oy1 + 1):
                    stack.append(np.int64(T[T_CH][off + a * ny + b]))
            continue
        if o_dummy:
            T = _route_from(
                T, S, params, c, -1, todo, touched_old, created, NI[u, F_DUMMY],
                ob[0], ob[1], ob[2], ob[3],
            )  # fmt: skip
            NI = T[T_NI]
            NI[u, F_WD_CUR] -= 1
        if n_dummy:
            NI[u, F_WD_CUR] += 1
            d = NI[u, F_DUMMY]
            if d < 0:
                NF = T[T_NF]
                T, d = _new_leaf_child(
                    T, u, NI[u, F_L], NI[u, F_KP], 0, NF[u, 0], NF[u, 1], NF[u, 2], NF[u, 3]
                )
                NI = T[T_NI]
                NI[u, F_DUMMY] = d
                created.append(d)
            T = _route_from(
                T, S, params, c, 1, todo, touched_new, created, d, nb[0], nb[1], nb[2], nb[3]
            )
            NI = T[T_NI]
        if not o_dummy:
            for a in range(ox0, ox1 + 1):
                for b in range(oy0, oy1 + 1):
                    k = off + a * ny + b
                    child = T[T_CH][k]
                    if not n_dummy and nx0 <= a <= nx1 and ny0 <= b <= ny1:
                        stack.append(np.int64(child))
                        continue
                    T[T_WCUR][k] -= 1
                    T = _route_from(
                        T, S, params, c, -1, todo, touched_old, created, child,
                        ob[0], ob[1], ob[2], ob[3],
                    )  # fmt: skip
        if not n_dummy:
            for a in range(nx0, nx1 + 1):
                for b in range(ny0, ny1 + 1):
                    if not o_dummy and ox0 <= a <= ox1 and oy0 <= b <= oy1:
                        continue
                    NI = T[T_NI]
                    k = off + a * ny + b
                    T[T_WCUR][k] += 1
                    child = T[T_CH][k]
                    if child < 0:
                        BND = T[T_BND]
                        boff = NI[u, F_BOFF]
                        gx = NI[u, F_NX]
                        T, child = _new_leaf_child(
                            T, u, NI[u, F_L], NI[u, F_KP], 1,
                            BND[boff + a], BND[boff + gx + 1 + b],
                            BND[boff + a + 1], BND[boff + gx + 2 + b],
                        )  # fmt: skip
                        T[T_CH][k] = child
                        created.append(child)
                    T = _route_from(
                        T, S, params, c, 1, todo, touched_new, created, child,
                        nb[0], nb[1], nb[2], nb[3],
                    )  # fmt: skip
        _note_update(T, params, u, todo)
    return T


@njit(cache=True)
def move_clauses(T, S, params, clauses, ob):
    """Move clause ids of one subscription from old box ``ob`` to the box now in the store.
    Returns (tree, nodes to rebuild, leaves of the old placement, leaves of the new one, leaves
    created)."""
    todo = int_list()
    t_old = int_list()
    t_new = int_list()
    created = int_list()
    for c in clauses:
        T = _move_route(T, S, params, c, ob, todo, t_old, t_new, created)
    return (
        T,
        _unique_todo(todo),
        _unique_todo(t_old),
        _unique_todo(t_new),
        _unique_todo(created),
    )


@njit(cache=True)
def _leaf_set_box(T, u, c, S):
    NI = T[T_NI]
    LI = T[T_LI]
    off = NI[u, F_LOFF]
    for i in range(off, off + NI[u, F_LLEN]):
        if LI[i] == c:
            set_leaf_entry(T[T_LB], i, S, c)
            return
    raise AssertionError("clause missing from the leaf it routes to")


@njit(cache=True)
def _leaf_append(T, u, c, S):
    NI = T[T_NI]
    n = NI[u, F_LLEN]
    if n == NI[u, F_LCAP]:
        cap = max(MIN_LEAF_CAP, 2 * n)
        T = ensure_li(T, cap)
        NI = T[T_NI]
        LI = T[T_LI]
        off = T[T_CNT][C_LI]
        T[T_CNT][C_LI] += cap
        old = NI[u, F_LOFF]
        LI[off : off + n] = LI[old : old + n]
        T[T_LB][off : off + n] = T[T_LB][old : old + n]
        T[T_CNT][C_GARBAGE] += NI[u, F_LCAP]
        NI[u, F_LOFF] = off
        NI[u, F_LCAP] = cap
    T[T_LI][NI[u, F_LOFF] + n] = c
    set_leaf_entry(T[T_LB], NI[u, F_LOFF] + n, S, c)
    NI[u, F_LLEN] = n + 1
    return T


@njit(cache=True)
def _leaf_remove(T, u, c):
    NI = T[T_NI]
    LI = T[T_LI]
    off = NI[u, F_LOFF]
    n = NI[u, F_LLEN]
    for i in range(off, off + n):
        if LI[i] == c:
            LI[i] = LI[off + n - 1]
            LI[off + n - 1] = -1
            T[T_LB][i] = T[T_LB][off + n - 1]
            NI[u, F_LLEN] = n - 1
            return
    raise AssertionError("clause missing from the leaf it routes to")


@njit(cache=True)
def int_list():
    """An empty typed list of int64 (numba needs the element type up front)."""
    out = List()
    out.append(np.int64(0))
    out.pop()
    return out


@njit(cache=True)
def insert_clauses(T, S, params, clauses):
    """Insert clause ids. Returns (tree, nodes to rebuild, leaves reached, leaves created).
    O(depth + cells touched) per clause."""
    todo = int_list()
    touched = int_list()
    created = int_list()
    for c in clauses:
        T = _route(T, S, params, c, 1, todo, touched, created)
    return T, _unique_todo(todo), _unique_todo(touched), _unique_todo(created)


@njit(cache=True)
def insert_clause_groups(T, S, params, clauses, group_off):
    """Insert the clauses of several subscriptions: group g is ``clauses[group_off[g] :
    group_off[g + 1]]``. Returns (tree, nodes to rebuild, leaves reached in order with their
    offsets per group (``reached[reached_off[g] : reached_off[g + 1]]``), leaves created): one
    compiled call for a batch of subscribes, each one's leaves kept apart for its ± updates."""
    todo = int_list()
    touched = int_list()
    created = int_list()
    n = group_off.shape[0] - 1
    reached_off = np.zeros(n + 1, np.int64)
    for g in range(n):
        for i in range(group_off[g], group_off[g + 1]):
            T = _route(T, S, params, clauses[i], 1, todo, touched, created)
        reached_off[g + 1] = len(touched)
    reached = np.empty(len(touched), np.int64)
    for i in range(len(touched)):
        reached[i] = touched[i]
    return T, _unique_todo(todo), reached, reached_off, _unique_todo(created)


@njit(cache=True)
def delete_clauses(T, S, params, clauses):
    """Delete clause ids. Returns (tree, nodes to rebuild or collapse, leaves reached)."""
    todo = int_list()
    touched = int_list()
    created = int_list()
    for c in clauses:
        T = _route(T, S, params, c, -1, todo, touched, created)
    return T, _unique_todo(todo), _unique_todo(touched)


@njit(cache=True)
def _unique_todo(todo):
    a = np.empty(len(todo), np.int64)
    for i in range(len(todo)):
        a[i] = todo[i]
    return np.unique(a)


@njit(cache=True)
def rebuild_nodes(T, S, PW, SPX, SPY, params, nodes):
    """Rebuild each still-live node of ``nodes``, shallowest first, skipping nodes under one
    already rebuilt (their ids may have been recycled). Returns (tree, rebuilt count)."""
    NI = T[T_NI]
    depth = np.empty(nodes.shape[0], np.int64)
    for i in range(nodes.shape[0]):
        depth[i] = NI[nodes[i], F_DEPTH] if NI[nodes[i], F_TYPE] != FREED else 1 << 40
    order = np.argsort(depth, kind="mergesort")
    skip = np.zeros(nodes.shape[0], np.bool_)
    done = List()
    done.append(np.int64(0))
    done.pop()
    for i in order:
        u = nodes[i]
        NI = T[T_NI]
        if skip[i] or NI[u, F_TYPE] == FREED or NI[u, F_DEPTH] != depth[i]:
            continue
        covered = False
        p = NI[u, F_PARENT]
        while p >= 0 and not covered:
            for v in done:
                if v == p:
                    covered = True
                    break
            p = NI[p, F_PARENT]
        if covered:
            continue
        if _promotable(T, params, u):
            _skip_under(T, nodes, NI[u, F_DUMMY], skip)
            T = promote_dummy(T, S, PW, SPX, SPY, params, u)
            continue
        old = NI[u, F_SIZE]
        T, items = collect_and_free(T, u)
        T, new = build_subtree(T, S, PW, SPX, SPY, params, u, items)
        NI = T[T_NI]
        p = NI[u, F_PARENT]
        while p >= 0:
            NI[p, F_SIZE] += new - old
            p = NI[p, F_PARENT]
        done.append(u)
    T[T_CNT][C_REBUILDS] += len(done)
    return T, len(done)


@njit(cache=True)
def _promotable(T, params, u):
    """Whether the reconstruction of node ``u`` can be a promotion of its dummy cut
    (``promote_dummy``): a k-node with one cut per keyword whose gaps go to the dummy that has
    not doubled since it was last built (then it is rebuilt whole, so that the
    cost model chooses its kind and offset again over what it holds now)."""
    NI = T[T_NI]
    return (
        NI[u, F_TYPE] == KNODE
        and params[P_GAP_TO_DUMMY] > 0.5
        and params[P_KEYWORD_FANOUT] == 0
        and NI[u, F_SIZE] >= params[P_THETA_P]  # else it collapses into a leaf
        and NI[u, F_SIZE] < params[P_GROWTH] * NI[u, F_NBUILT]
    )


@njit(cache=True)
def _skip_under(T, nodes, top, skip):
    """Mark the nodes of ``nodes`` that lie in the subtree of ``top`` (about to be recycled, so
    their ids may be handed out again before they come up)."""
    NI = T[T_NI]
    if top < 0:
        return
    for j in range(nodes.shape[0]):
        v = nodes[j]
        while v >= 0:
            if v == top:
                skip[j] = True
                break
            v = NI[v, F_PARENT]


@njit(cache=True)
def promote_dummy(T, S, PW, SPX, SPY, params, u):
    """Reconstruct k-node ``u`` (one cut per keyword, gaps to the dummy) by promoting its dummy
    cut: the clauses that went to the dummy because their L-th keyword had no cut get a cut of
    their own per keyword, built like a fresh build would (Alg. 4 below each new cut); the
    clauses without an L-th keyword stay in a rebuilt dummy; the existing cuts and their
    subtrees are kept, their weights taken as the new baseline. This is what rebuilding ``u``
    would make of its cuts (one per keyword, Eq. 1) at the cost of the dummy's subtree and a copy
    of the cut list, instead of the whole subtree: a tree growing from empty no longer rebuilds
    its root every 5 % of growth (docs/BENCHMARKS.md). The caller carries the AP+-Tree's
    messages over as for a rebuild."""
    NI = T[T_NI]
    d = NI[u, F_DUMMY]
    if d < 0:  # the cuts' weights drifted: the same cuts again, with a new baseline
        off = NI[u, F_CHOFF]
        for k in range(off, off + NI[u, F_NCH]):
            T[T_WOLD][k] = T[T_WCUR][k]
        NI[u, F_WD_OLD] = NI[u, F_WD_CUR]
        NI[u, F_NUPD] = 0
        T[T_CNT][C_PROMOTIONS] += 1
        return T
    l = NI[u, F_L]
    kp = NI[u, F_KP]
    sp = NI[u, F_SP]
    depth = NI[u, F_DEPTH]
    x0 = T[T_NF][u, 0]
    y0 = T[T_NF][u, 1]
    x1 = T[T_NF][u, 2]
    y1 = T[T_NF][u, 3]
    old_size = NI[d, F_SIZE]
    T, items = collect_and_free(T, d)
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    n = items.shape[0]
    keys = np.empty(n, np.int64)
    for i in range(n):
        c = items[i]
        keys[i] = terms[cl_off[c] + l] if cl_len[c] > l else -1
    order = np.argsort(keys, kind="mergesort")
    nd = 0
    while nd < n and keys[order[nd]] < 0:
        nd += 1
    m_new = 0
    for i in range(nd, n):
        if i == nd or keys[order[i]] != keys[order[i - 1]]:
            m_new += 1
    m_old = NI[u, F_NCH]
    T = ensure_ch(T, m_old + m_new)
    T = ensure_nodes(T, m_new)
    # a new cut of fewer than θp clauses (nearly every one: a keyword new to the k-node) is
    # made a leaf here, its room asked for once, as ``build._make_knode`` does
    leaf_below = params[P_THETA_P]
    max_depth = params[P_MAX_DEPTH]
    room = 0
    i = nd
    while i < n:
        e = i
        while e < n and keys[order[e]] == keys[order[i]]:
            e += 1
        if leaf_child(e - i, leaf_below, kp, sp, depth, max_depth):
            room += leaf_cap(e - i)
        i = e
    T = ensure_li(T, room)
    LI = T[T_LI]
    LB = T[T_LB]
    NI = T[T_NI]
    CH = T[T_CH]
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    WOLD = T[T_WOLD]
    WCUR = T[T_WCUR]
    CNT = T[T_CNT]
    off_old = NI[u, F_CHOFF]
    off = CNT[C_CH]
    CNT[C_CH] += m_old + m_new
    CNT[C_GARBAGE] += m_old
    new_nodes = List()
    new_items = List()
    added = 0
    k = off
    a = 0  # next old cut
    i = nd  # next new keyword's first item
    while a < m_old or i < n:
        if i >= n or (a < m_old and CLO[off_old + a] < keys[order[i]]):
            CH[k] = CH[off_old + a]
            CLO[k] = CLO[off_old + a]
            CHI[k] = CHI[off_old + a]
            WCUR[k] = WCUR[off_old + a]
            WOLD[k] = WCUR[off_old + a]
            a += 1
        else:
            w = keys[order[i]]
            e = i
            while e < n and keys[order[e]] == w:
                e += 1
            child = alloc_node(T)
            init_node(T, child, u, l + 1, kp, sp, depth + 1, x0, y0, x1, y1)
            CH[k] = child
            CLO[k] = w
            CHI[k] = w
            WCUR[k] = e - i
            WOLD[k] = e - i
            if leaf_child(e - i, leaf_below, kp, sp, depth, max_depth):
                loff = leaf_slice(NI, CNT, child, e - i)
                for j in range(i, e):
                    LI[loff + j - i] = items[order[j]]
                    set_leaf_entry(LB, loff + j - i, S, items[order[j]])
                added += e - i
            else:
                sub = np.empty(e - i, np.int32)
                for j in range(i, e):
                    sub[j - i] = items[order[j]]
                new_nodes.append(child)
                new_items.append(sub)
            i = e
        k += 1
    NI[u, F_CHOFF] = off
    NI[u, F_NCH] = m_old + m_new
    for j in range(len(new_nodes)):
        T, size = build_subtree(T, S, PW, SPX, SPY, params, new_nodes[j], new_items[j])
        added += size
    NI = T[T_NI]
    if nd > 0:
        rest = np.empty(nd, np.int32)
        for j in range(nd):
            rest[j] = items[order[j]]
        init_node(T, d, u, l + 1, 0, sp, depth + 1, x0, y0, x1, y1)
        T, size = build_subtree(T, S, PW, SPX, SPY, params, d, rest)
        NI = T[T_NI]
        added += size
    else:
        NI[u, F_DUMMY] = -1
        T = _free_node(T, d)
        NI = T[T_NI]
    NI[u, F_WD_OLD] = nd
    NI[u, F_WD_CUR] = nd
    NI[u, F_NUPD] = 0
    p = u
    while p >= 0:
        NI[p, F_SIZE] += added - old_size
        p = NI[p, F_PARENT]
    T[T_CNT][C_PROMOTIONS] += 1
    return T


@njit(cache=True)
def _free_node(T, nid):
    """Recycle node id ``nid`` (its subtree already freed)."""
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    if CNT[C_FREE] == FREE.shape[0]:
        F2 = np.zeros(2 * FREE.shape[0] + 16, np.int32)
        F2[: FREE.shape[0]] = FREE
        FREE = F2
        T = (NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, F2, CNT, LB)
    T[T_NI][nid, F_TYPE] = FREED
    FREE[CNT[C_FREE]] = nid
    CNT[C_FREE] += 1
    return T
