"""AP-Tree construction (Alg. 4) and the array plumbing shared by all tree kernels.

A tree is a tuple of arrays (see ``layout``); every kernel that may grow a pool returns the new
tuple. ``build_subtree`` (re)builds the subtree at one node from a set of clause ids: it serves the
bulk load, leaf splits, KL-triggered reconstruction and collapses alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from shard.aptree.layout import (
    C_BND,
    C_CH,
    C_FREE,
    C_GARBAGE,
    C_LI,
    C_NODES,
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
    LB_INLINE_TERMS,
    LB_WIDTH,
    LB_X0,
    LB_X1,
    LB_Y0,
    LB_Y1,
    LBI_KIND,
    LBI_NT,
    LBI_SLOT,
    LBI_T,
    LBK_MULTI,
    LEAF,
    MOVE_SIM_STEPS,
    N_COUNTERS,
    N_FIELDS,
    P_FANOUT,
    P_KEYWORD_DP,
    P_KEYWORD_FANOUT,
    P_MAX_DEPTH,
    P_MAX_SPAN,
    P_MOVE_COST,
    P_MSG_RATE,
    P_MSG_SAMPLE,
    P_THETA_KL,
    P_THETA_P,
    SNODE,
    T_BND,
    T_CH,
    T_CHI,
    T_CLO,
    T_CNT,
    T_FREE,
    T_LB,
    T_LI,
    T_NF,
    T_NI,
    T_WCUR,
    T_WOLD,
)
from shard.aptree.partition import (
    axis_partition_sorted,
    axis_sorted,
    cell_range,
    grid_cost_spanned,
    keyword_partition_heuristic,
    keyword_partition_optimal,
    moving_penalty,
)

# subscription tuple indices: (kind, bbox[n,4], circle[n,3], cl_sub, cl_off, cl_len, terms)
S_KIND, S_BBOX, S_CIRC, S_CLSUB, S_CLOFF, S_CLLEN, S_TERMS = range(7)
MIN_LEAF_CAP = 4
GRID_SIZES = (2, 3, 4, 6, 9, 14, 20, 28)
"""Cells per axis an s-node may use (up to floor(sqrt(f))); the cost model picks one per node."""


def new_tree(node_cap: int = 1024, ch_cap: int = 4096, li_cap: int = 4096):
    """An empty tree tuple with one leaf root covering the world (node 0)."""
    NI = np.full((node_cap, N_FIELDS), -1, np.int64)
    NF = np.zeros((node_cap, 4), np.float64)
    CH = np.full(ch_cap, -1, np.int32)
    CLO = np.zeros(ch_cap, np.int32)
    CHI = np.zeros(ch_cap, np.int32)
    WOLD = np.zeros(ch_cap, np.float64)
    WCUR = np.zeros(ch_cap, np.float64)
    BND = np.zeros(ch_cap, np.float64)
    LI = np.full(li_cap, -1, np.int32)
    FREE = np.zeros(64, np.int32)
    CNT = np.zeros(N_COUNTERS, np.int64)
    LB = np.zeros((li_cap, LB_WIDTH), np.float64)
    T = (NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB)
    root = 0
    CNT[C_NODES] = 1
    init_node(T, root, -1, 0, 1, 1, 0, -180.0, -90.0, 180.0, 90.0)
    NI[root, F_TYPE] = LEAF
    NI[root, F_LOFF] = 0
    NI[root, F_LLEN] = 0
    NI[root, F_LCAP] = MIN_LEAF_CAP
    CNT[C_LI] = MIN_LEAF_CAP
    return T


# ---- pool growth -----------------------------------------------------------------------
POOL_HEADROOM = 8
"""A pool grown to hold ``need`` gets ``need // POOL_HEADROOM`` more, or doubles, whichever is
more (as the store's columns, ``store.HEADROOM``). Without it a bulk build that asked for the
root's cuts at once left the node pool exactly full, and the first leaf split after a load
copied it (~45 ms of a round at 510,000 subscriptions; docs/BENCHMARKS.md, twenty-ninth
session)."""


@njit(cache=True)
def grown(need, have):
    """The capacity a pool of ``have`` rows gets to hold ``need`` (``POOL_HEADROOM``)."""
    return max(need + need // POOL_HEADROOM, 2 * have)


@njit(cache=True)
def ensure_nodes(T, extra):
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    need = T[T_CNT][C_NODES] + extra
    if need <= NI.shape[0]:
        return T
    cap = grown(need, NI.shape[0])
    NI2 = np.full((cap, NI.shape[1]), -1, np.int64)
    NI2[: NI.shape[0]] = NI
    NF2 = np.zeros((cap, 4), np.float64)
    NF2[: NI.shape[0]] = NF
    return (NI2, NF2, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB)


@njit(cache=True)
def ensure_ch(T, extra):
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    need = T[T_CNT][C_CH] + extra
    if need <= CH.shape[0]:
        return T
    cap = grown(need, CH.shape[0])
    n = CH.shape[0]
    CH2 = np.full(cap, -1, np.int32)
    CH2[:n] = CH
    CLO2 = np.zeros(cap, np.int32)
    CLO2[:n] = CLO
    CHI2 = np.zeros(cap, np.int32)
    CHI2[:n] = CHI
    W1 = np.zeros(cap, np.float64)
    W1[:n] = WOLD
    W2 = np.zeros(cap, np.float64)
    W2[:n] = WCUR
    return (NI, NF, CH2, CLO2, CHI2, W1, W2, BND, LI, FREE, CNT, LB)


@njit(cache=True)
def ensure_bnd(T, extra):
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    B = BND
    need = T[T_CNT][C_BND] + extra
    if need <= B.shape[0]:
        return T
    B2 = np.zeros(grown(need, B.shape[0]), np.float64)
    B2[: B.shape[0]] = B
    return (NI, NF, CH, CLO, CHI, WOLD, WCUR, B2, LI, FREE, CNT, LB)


@njit(cache=True)
def ensure_li(T, extra):
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    need = T[T_CNT][C_LI] + extra
    if need <= LI.shape[0]:
        return T
    L2 = np.full(grown(need, LI.shape[0]), -1, np.int32)
    L2[: LI.shape[0]] = LI
    B2 = np.zeros((L2.shape[0], LB_WIDTH), np.float64)
    B2[: LI.shape[0]] = LB
    return (NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, L2, FREE, CNT, B2)


@njit(cache=True)
def alloc_node(T):
    """Pop a recycled node id or hand out a new one (call ``ensure_nodes`` first)."""
    CNT = T[T_CNT]
    if CNT[C_FREE] > 0:
        CNT[C_FREE] -= 1
        return int(T[T_FREE][CNT[C_FREE]])
    nid = CNT[C_NODES]
    CNT[C_NODES] += 1
    return int(nid)


@njit(cache=True)
def init_node(T, nid, parent, l, kp, sp, depth, x0, y0, x1, y1):
    NI = T[T_NI]
    for f in range(NI.shape[1]):
        NI[nid, f] = -1
    NI[nid, F_TYPE] = LEAF
    NI[nid, F_L] = l
    NI[nid, F_KP] = kp
    NI[nid, F_SP] = sp
    NI[nid, F_PARENT] = parent
    NI[nid, F_DEPTH] = depth
    NI[nid, F_SIZE] = 0
    NI[nid, F_NUPD] = 0
    NI[nid, F_NBUILT] = 0
    NI[nid, F_LLEN] = 0
    NI[nid, F_LCAP] = 0
    NI[nid, F_DUMMY] = -1
    NF = T[T_NF]
    NF[nid, 0] = x0
    NF[nid, 1] = y0
    NF[nid, 2] = x1
    NF[nid, 3] = y1


@njit(cache=True)
def set_leaf_entry(LB, k, S, c):
    """Write leaf slot ``k``'s record for clause ``c`` (the ``LB_*`` / ``LBI_*`` columns)."""
    s = S[3][c]
    bbox = S[1]
    LB[k, LB_X0] = bbox[s, 0]
    LB[k, LB_Y0] = bbox[s, 1]
    LB[k, LB_X1] = bbox[s, 2]
    LB[k, LB_Y1] = bbox[s, 3]
    LBI = LB.view(np.int32)
    LBI[k, LBI_SLOT] = s
    LBI[k, LBI_KIND] = S[0][s] | (LBK_MULTI if S[9][s] > 1 else 0)
    a = S[4][c]
    n = S[5][c]
    LBI[k, LBI_NT] = n
    for j in range(min(n, LB_INLINE_TERMS)):
        LBI[k, LBI_T + j] = S[6][a + j]


@njit(cache=True)
def refresh_leaf_entries(T, S):
    """Rewrite the record of every used leaf slot from the store (after the store renumbered
    its slots and clause rows). O(pool)."""
    LI = T[T_LI]
    for k in range(T[T_CNT][C_LI]):
        if LI[k] >= 0:
            set_leaf_entry(T[T_LB], k, S, LI[k])


@njit(cache=True)
def leaf_cap(n):
    """Slots a leaf of ``n`` entries gets when it is made or compacted: a quarter more (most
    leaves are never appended to; one that is doubles, ``maintain._leaf_append``); an empty
    leaf ``MIN_LEAF_CAP``."""
    return n + n // 4 if n > 0 else MIN_LEAF_CAP


@njit(cache=True)
def alloc_leaf(T, nid, n):
    """Turn ``nid`` into a leaf with room for ``n`` entries and more (a fresh LI/LB slice); the
    caller writes the ``n`` entries."""
    T = ensure_li(T, leaf_cap(n))
    leaf_slice(T[T_NI], T[T_CNT], nid, n)
    return T


@njit(cache=True)
def leaf_child(n, leaf_below, kp, sp, depth, max_depth):
    """Whether a child of ``n`` clauses, ``kp`` and ``sp`` flags, under a node at ``depth``, is a
    leaf: ``build_subtree``'s own test, made by its parent before the child is pushed."""
    return (kp == 0 and sp == 0) or n < leaf_below or depth + 1 >= max_depth


@njit(cache=True)
def leaf_slice(NI, CNT, nid, n):
    """``alloc_leaf`` without the room check (the caller made room for it): the slice's offset."""
    cap = leaf_cap(n)
    off = CNT[C_LI]
    CNT[C_LI] += cap
    NI[nid, F_TYPE] = LEAF
    NI[nid, F_LOFF] = off
    NI[nid, F_LLEN] = n
    NI[nid, F_LCAP] = cap
    NI[nid, F_SIZE] = n
    NI[nid, F_NBUILT] = n
    NI[nid, F_DUMMY] = -1
    NI[nid, F_NCH] = 0
    return off


@njit(cache=True)
def make_leaf(T, nid, items, S):
    """Turn ``nid`` into a leaf whose s-list is ``items`` (a fresh LI slice)."""
    n = items.shape[0]
    T = alloc_leaf(T, nid, n)
    off = T[T_NI][nid, F_LOFF]
    T[T_LI][off : off + n] = items
    for i in range(n):
        set_leaf_entry(T[T_LB], off + i, S, items[i])
    return T


@njit(cache=True)
def contains_region(bbox, c, NF, nid):
    return (
        bbox[c, 0] <= NF[nid, 0]
        and bbox[c, 1] <= NF[nid, 1]
        and bbox[c, 2] >= NF[nid, 2]
        and bbox[c, 3] >= NF[nid, 3]
    )


@njit(cache=True)
def build_subtree(T, S, PW, SPX, SPY, params, root, items):
    """Alg. 4 from node ``root`` (its region, L, KP, SP, parent and depth already set) over the
    clause ids ``items``. Returns (tree, entries in the new subtree).

    Cost per node: O(n log n) for n clauses at the node; the total is that times the depth,
    plus replication across s-node cells.
    """
    f = int(params[P_FANOUT])
    kf = int(params[P_KEYWORD_FANOUT])
    theta_p = params[P_THETA_P]
    use_dp = params[P_KEYWORD_DP] > 0.5
    max_depth = params[P_MAX_DEPTH]
    absolute = params[P_MSG_SAMPLE] > 0.5
    max_span = params[P_MAX_SPAN]
    grid_k = max(2, int(np.sqrt(f)))
    move_cost = params[P_MOVE_COST] > 0.5 and params[P_MSG_RATE] > 0.0
    msg_rate = max(params[P_MSG_RATE], 1e-9)
    S[0]
    bbox = S[1]
    cl_sub = S[3]
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    n_pw = PW.shape[0]

    stack_node = List()
    stack_items = List()
    stack_node.append(root)
    stack_items.append(items)
    created = List()
    while len(stack_node) > 0:
        nid = stack_node.pop()
        its = stack_items.pop()
        created.append(nid)
        NI = T[T_NI]
        NF = T[T_NF]
        n = its.shape[0]
        l = NI[nid, F_L]
        kp = NI[nid, F_KP] == 1
        sp = NI[nid, F_SP] == 1
        depth = NI[nid, F_DEPTH]
        if (not kp and not sp) or n < theta_p or depth >= max_depth:
            T = make_leaf(T, nid, its, S)
            continue

        # ---- try keyword partition on the l-th keyword --------------------------------
        ck = np.inf
        k_nd = 0
        k_order = np.empty(0, np.int64)
        k_keys = np.empty(0, np.int32)
        k_vals = np.empty(0, np.int32)
        k_starts = np.empty(0, np.int64)
        k_pref = np.empty(0, np.int64)
        if kp:
            keys = np.empty(n, np.int32)
            for i in range(n):
                c = its[i]
                keys[i] = terms[cl_off[c] + l] if cl_len[c] > l else -1
            order = np.argsort(keys, kind="mergesort")
            sk = keys[order]
            nd = np.searchsorted(sk, 0)  # dummies (-1) sort first
            if nd < n:
                # distinct keywords, their weights and probabilities
                vals = np.empty(n - nd, np.int32)
                cnts = np.empty(n - nd, np.int64)
                m = 0
                for i in range(nd, n):
                    if m == 0 or sk[i] != vals[m - 1]:
                        vals[m] = sk[i]
                        cnts[m] = 0
                        m += 1
                    cnts[m - 1] += 1
                vals = vals[:m]
                W = np.zeros(m + 1)
                P = np.zeros(m + 1)
                psum = 0.0
                for j in range(m):
                    W[j + 1] = W[j] + cnts[j]
                    pw = PW[vals[j]] if vals[j] < n_pw else 0.0
                    P[j + 1] = P[j] + pw
                    psum += pw
                if not absolute and psum > 0.0:
                    P /= psum
                cuts = m if kf == 0 else kf
                if use_dp:
                    starts, cost = keyword_partition_optimal(W, P, cuts, absolute)
                else:
                    starts, cost = keyword_partition_heuristic(W, P, cuts, absolute)
                ck = cost + nd
                k_nd = nd
                k_order = order
                k_keys = sk
                k_vals = vals
                k_starts = starts
                pref = np.zeros(m + 1, np.int64)
                for j in range(m):
                    pref[j + 1] = pref[j] + cnts[j]
                k_pref = pref

        # ---- try spatial partition --------------------------------------------------
        cs = np.inf
        s_bx = np.empty(0)
        s_by = np.empty(0)
        s_isd = np.zeros(0, np.bool_)
        s_keep = np.zeros(0, np.bool_)
        s_nd = 0
        s_counts = np.zeros((0, 0), np.int64)
        if sp:
            isd = np.zeros(n, np.bool_)
            nd = 0
            for i in range(n):
                if contains_region(bbox, cl_sub[its[i]], NF, nid):
                    isd[i] = True
                    nd += 1
            if nd < n:
                r = NF[nid]
                mx0 = np.empty(n - nd)
                my0 = np.empty(n - nd)
                mx1 = np.empty(n - nd)
                my1 = np.empty(n - nd)
                j = 0
                for i in range(n):
                    if not isd[i]:
                        s = cl_sub[its[i]]
                        mx0[j] = max(bbox[s, 0], r[0])
                        my0[j] = max(bbox[s, 1], r[1])
                        mx1[j] = min(bbox[s, 2], r[2])
                        my1[j] = min(bbox[s, 3], r[3])
                        j += 1
                # sample points inside the node region
                npt = 0
                for t in range(SPX.shape[0]):
                    if SPX[t] >= r[0] and SPX[t] <= r[2] and SPY[t] >= r[1] and SPY[t] <= r[3]:
                        npt += 1
                px = np.empty(npt)
                py = np.empty(npt)
                npt = 0
                for t in range(SPX.shape[0]):
                    if SPX[t] >= r[0] and SPX[t] <= r[2] and SPY[t] >= r[1] and SPY[t] <= r[3]:
                        px[npt] = SPX[t]
                        py[npt] = SPY[t]
                        npt += 1
                spx = np.sort(px)
                spy = np.sort(py)
                nd0 = nd
                node_slots = np.empty(n, np.int64)
                if move_cost:
                    for i in range(n):
                        node_slots[i] = cl_sub[its[i]]
                # the grid resolution is chosen by the cost model too: a coarse grid keeps large
                # regions out of the dummy cell, a fine one filters small regions better
                xs = axis_sorted(mx0, mx1)
                ys = axis_sorted(my0, my1)
                for gk in GRID_SIZES:
                    if gk > grid_k:
                        break
                    bx = axis_partition_sorted(xs[0], xs[1], xs[2], xs[3], r[0], r[2], gk, spx)
                    by = axis_partition_sorted(ys[0], ys[1], ys[2], ys[3], r[1], r[3], gk, spy)
                    if bx.shape[0] <= 2 and by.shape[0] <= 2:
                        continue
                    # regions meeting too many cells join the dummy cell
                    cost, counts, keep = grid_cost_spanned(
                        mx0, my0, mx1, my1, bx, by, max_span, r, px, py
                    )
                    nd_k = nd0 + keep.shape[0] - np.count_nonzero(keep)
                    # replication without separation (two cells each receiving every clause) never
                    # terminates on degenerate regions: such a grid is no partition
                    if n - nd_k > 0 and (counts == n - nd_k).sum() >= 2:
                        continue
                    if move_cost:
                        # Eq. 15 in units of one message's verifications: (Cimm + Cslu + Circ) / r_m
                        cost += (
                            moving_penalty(
                                bbox,
                                S[7],
                                S[8],
                                node_slots,
                                r,
                                bx.shape[0] - 1,
                                by.shape[0] - 1,
                                depth,
                                f,
                                theta_p,
                                params[P_THETA_KL],
                                MOVE_SIM_STEPS,
                            )
                            / msg_rate
                        )
                    if cost + nd_k < cs:
                        cs = cost + nd_k
                        s_bx = bx
                        s_by = by
                        s_keep = keep
                        s_nd = nd_k
                        s_counts = counts
                if cs < np.inf:
                    s_isd = isd.copy()
                    j = 0
                    for i in range(n):
                        if not isd[i]:
                            if not s_keep[j]:
                                s_isd[i] = True
                            j += 1

        # ---- choose (Alg. 4 lines 9-10, plus: never replicate without a gain) ---------
        if ck == np.inf and cs == np.inf:
            T = make_leaf(T, nid, its, S)
            continue
        if cs < ck:
            if cs >= n:
                T = make_leaf(T, nid, its, S)
                continue
            T = _make_snode(
                T,
                S,
                nid,
                its,
                s_bx,
                s_by,
                s_isd,
                s_nd,
                s_counts,
                stack_node,
                stack_items,
                created,
                theta_p,
                max_depth,
            )
        else:
            if ck > n:
                T = make_leaf(T, nid, its, S)
                continue
            T = _make_knode(
                T,
                S,
                its,
                nid,
                k_order,
                k_keys,
                k_vals,
                k_starts,
                k_pref,
                k_nd,
                stack_node,
                stack_items,
                created,
                theta_p,
                max_depth,
            )

    # subtree sizes bottom-up (children are created after their parents)
    NI = T[T_NI]
    total = 0
    for k in range(len(created) - 1, -1, -1):
        nid = created[k]
        if nid != root:
            NI[NI[nid, F_PARENT], F_SIZE] += NI[nid, F_SIZE]
    for k in range(len(created)):
        nid = created[k]
        NI[nid, F_NBUILT] = NI[nid, F_SIZE]
        NI[nid, F_NUPD] = 0
    total = NI[root, F_SIZE]
    return T, total


@njit(cache=True)
def _make_knode(T, S, its, nid, order, sk, vals, starts, pref, nd, stack_node, stack_items, created, leaf_below, max_depth):  # fmt: skip
    """Make ``nid`` a k-node over its cuts: a child of fewer than ``leaf_below`` clauses (or at
    ``max_depth``) is made a leaf at once, written straight from ``its`` (on rare-term text
    nearly every child: 4,930 of 4,931 nodes of a 4,800-subscription tree), the others are
    pushed for the caller's loop."""
    m_cuts = starts.shape[0]
    m = vals.shape[0]
    T = ensure_ch(T, m_cuts)
    T = ensure_nodes(T, m_cuts + 1)
    kp = T[T_NI][nid, F_KP]
    sp = T[T_NI][nid, F_SP]
    depth = T[T_NI][nid, F_DEPTH]
    # room for every child made a leaf here, asked for once (not a call a leaf that returns
    # the tree's twelve arrays: their reference counts were a third of a 4,800-leaf build)
    room = 0
    for k in range(m_cuts):
        cnt = pref[starts[k + 1] if k + 1 < m_cuts else m] - pref[starts[k]]
        if leaf_child(cnt, leaf_below, kp, sp, depth, max_depth):
            room += leaf_cap(cnt)
    T = ensure_li(T, room)
    LI = T[T_LI]
    LB = T[T_LB]
    NI = T[T_NI]
    NF = T[T_NF]
    CH = T[T_CH]
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    WOLD = T[T_WOLD]
    WCUR = T[T_WCUR]
    CNT = T[T_CNT]
    off = CNT[C_CH]
    CNT[C_CH] += m_cuts
    l = NI[nid, F_L]
    r = NF[nid]
    NI[nid, F_TYPE] = KNODE
    NI[nid, F_CHOFF] = off
    NI[nid, F_NCH] = m_cuts
    NI[nid, F_SIZE] = 0
    for k in range(m_cuts):
        a = starts[k]
        e = starts[k + 1] if k + 1 < m_cuts else m
        CLO[off + k] = vals[a]
        CHI[off + k] = vals[e - 1]
        lo = nd + pref[a]
        hi = nd + pref[e]
        child = alloc_node(T)
        # a cut spanning several keywords is refined at the same offset below; a one-keyword
        # cut moves on to the next keyword
        child_l = l if vals[a] != vals[e - 1] else l + 1
        init_node(T, child, nid, child_l, kp, sp, NI[nid, F_DEPTH] + 1, r[0], r[1], r[2], r[3])
        CH[off + k] = child
        WOLD[off + k] = hi - lo
        WCUR[off + k] = hi - lo
        if leaf_child(hi - lo, leaf_below, kp, sp, depth, max_depth):
            loff = leaf_slice(NI, CNT, child, hi - lo)
            for i in range(lo, hi):
                LI[loff + i - lo] = its[order[i]]
                set_leaf_entry(LB, loff + i - lo, S, its[order[i]])
            created.append(child)
            continue
        sub = np.empty(hi - lo, np.int32)
        for i in range(lo, hi):
            sub[i - lo] = its[order[i]]
        stack_node.append(child)
        stack_items.append(sub)
    NI[nid, F_WD_OLD] = nd
    NI[nid, F_WD_CUR] = nd
    if nd > 0:
        child = alloc_node(T)
        init_node(T, child, nid, l + 1, 0, sp, depth + 1, r[0], r[1], r[2], r[3])
        NI[nid, F_DUMMY] = child
        sub = np.empty(nd, np.int32)
        for i in range(nd):
            sub[i] = its[order[i]]
        stack_node.append(child)
        stack_items.append(sub)
    else:
        NI[nid, F_DUMMY] = -1
    return T


@njit(cache=True)
def _make_snode(T, S, nid, its, bx, by, isd, nd, counts, stack_node, stack_items, created, leaf_below, max_depth):  # fmt: skip
    """Make ``nid`` an s-node over the grid ``bx`` × ``by``; children as in ``_make_knode``."""
    bbox = S[1]
    cl_sub = S[3]
    nx = bx.shape[0] - 1
    ny = by.shape[0] - 1
    ncell = nx * ny
    T = ensure_ch(T, ncell)
    T = ensure_bnd(T, nx + ny + 2)
    T = ensure_nodes(T, ncell + 1)
    kp = T[T_NI][nid, F_KP]
    depth = T[T_NI][nid, F_DEPTH]
    room = 0  # (for the leaves made here: ``_make_knode``)
    for a in range(nx):
        for b in range(ny):
            if counts[a, b] > 0 and leaf_child(counts[a, b], leaf_below, kp, 1, depth, max_depth):
                room += leaf_cap(counts[a, b])
    T = ensure_li(T, room)
    LI = T[T_LI]
    LB = T[T_LB]
    NI = T[T_NI]
    NF = T[T_NF]
    CH = T[T_CH]
    WOLD = T[T_WOLD]
    WCUR = T[T_WCUR]
    BND = T[T_BND]
    CNT = T[T_CNT]
    off = CNT[C_CH]
    CNT[C_CH] += ncell
    boff = CNT[C_BND]
    CNT[C_BND] += nx + ny + 2
    BND[boff : boff + nx + 1] = bx
    BND[boff + nx + 1 : boff + nx + ny + 2] = by
    l = NI[nid, F_L]
    r = NF[nid].copy()
    NI[nid, F_TYPE] = SNODE
    NI[nid, F_CHOFF] = off
    NI[nid, F_NCH] = ncell
    NI[nid, F_BOFF] = boff
    NI[nid, F_NX] = nx
    NI[nid, F_NY] = ny
    NI[nid, F_SIZE] = 0
    # bucket the non-dummy clauses by cell (counting sort)
    start = np.zeros(ncell + 1, np.int64)
    for a in range(nx):
        for b in range(ny):
            start[a * ny + b + 1] = counts[a, b]
    for k in range(ncell):
        start[k + 1] += start[k]
    fill = start[:-1].copy()
    buf = np.empty(start[ncell], np.int32)
    for i in range(its.shape[0]):
        if isd[i]:
            continue
        c = its[i]
        s = cl_sub[c]
        x0, x1 = cell_range(bx, 0, nx, max(bbox[s, 0], r[0]), min(bbox[s, 2], r[2]))
        y0, y1 = cell_range(by, 0, ny, max(bbox[s, 1], r[1]), min(bbox[s, 3], r[3]))
        for a in range(x0, x1 + 1):
            for b in range(y0, y1 + 1):
                k = a * ny + b
                buf[fill[k]] = c
                fill[k] += 1
    for a in range(nx):
        for b in range(ny):
            k = a * ny + b
            cnt = start[k + 1] - start[k]
            WOLD[off + k] = cnt
            WCUR[off + k] = cnt
            if cnt == 0:
                CH[off + k] = -1
                continue
            child = alloc_node(T)
            init_node(T, child, nid, l, kp, 1, depth + 1, bx[a], by[b], bx[a + 1], by[b + 1])
            CH[off + k] = child
            if leaf_child(cnt, leaf_below, kp, 1, depth, max_depth):
                loff = leaf_slice(NI, CNT, child, cnt)
                for i in range(cnt):
                    c = buf[start[k] + i]
                    LI[loff + i] = c
                    set_leaf_entry(LB, loff + i, S, c)
                created.append(child)
                continue
            stack_node.append(child)
            stack_items.append(buf[start[k] : start[k + 1]].copy())
    NI[nid, F_WD_OLD] = nd
    NI[nid, F_WD_CUR] = nd
    if nd > 0:
        child = alloc_node(T)
        init_node(T, child, nid, l, kp, 0, depth + 1, r[0], r[1], r[2], r[3])
        NI[nid, F_DUMMY] = child
        sub = np.empty(nd, np.int32)
        j = 0
        for i in range(its.shape[0]):
            if isd[i]:
                sub[j] = its[i]
                j += 1
        stack_node.append(child)
        stack_items.append(sub)
    else:
        NI[nid, F_DUMMY] = -1
    return T


@njit(cache=True)
def collect_and_free(T, nid):
    """Gather the distinct clause ids stored under ``nid`` and recycle every node below it
    (``nid`` itself stays allocated, its pools become garbage). O(subtree)."""
    NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, FREE, CNT, LB = T
    out = List()
    out.append(np.int32(0))
    out.pop()
    stack = List()
    stack.append(nid)
    freed = List()
    garbage = 0
    while len(stack) > 0:
        u = stack.pop()
        t = NI[u, F_TYPE]
        if t == LEAF:
            off = NI[u, F_LOFF]
            for i in range(NI[u, F_LLEN]):
                out.append(T[T_LI][off + i])
            garbage += NI[u, F_LCAP]
        else:
            off = NI[u, F_CHOFF]
            for k in range(NI[u, F_NCH]):
                if CH[off + k] >= 0:
                    stack.append(CH[off + k])
            if NI[u, F_DUMMY] >= 0:
                stack.append(NI[u, F_DUMMY])
            garbage += NI[u, F_NCH]
        if u != nid:
            freed.append(u)
    T[T_CNT][C_GARBAGE] += garbage
    # recycle ids
    nf = len(freed)
    FREE = T[T_FREE]
    need = T[T_CNT][C_FREE] + nf
    if need > FREE.shape[0]:
        F2 = np.zeros(grown(need, FREE.shape[0]), np.int32)
        F2[: FREE.shape[0]] = FREE
        FREE = F2
        T = (NI, NF, CH, CLO, CHI, WOLD, WCUR, BND, LI, F2, CNT, LB)
    for u in freed:
        NI[u, F_TYPE] = FREED
        FREE[T[T_CNT][C_FREE]] = u
        T[T_CNT][C_FREE] += 1
    arr = np.empty(len(out), np.int32)
    for i in range(len(out)):
        arr[i] = out[i]
    return T, np.unique(arr)


@njit(cache=True)
def compact(T):
    """Copy every live node's pool slices into fresh, dense pools (drops the garbage left by leaf
    moves and rebuilds; recycled node ids stay recycled). O(nodes + entries)."""
    NI = T[T_NI]
    CNT = T[T_CNT]
    n_nodes = CNT[C_NODES]
    n_ch = 0
    n_b = 0
    n_li = 0
    for u in range(n_nodes):
        t = NI[u, F_TYPE]
        if t == LEAF:
            n_li += leaf_cap(NI[u, F_LLEN])
        elif t != FREED:
            n_ch += NI[u, F_NCH]
            if t == SNODE:
                n_b += NI[u, F_NX] + NI[u, F_NY] + 2
    CH = np.full(max(n_ch, 16), -1, np.int32)
    CLO = np.zeros(CH.shape[0], np.int32)
    CHI = np.zeros(CH.shape[0], np.int32)
    WOLD = np.zeros(CH.shape[0], np.float64)
    WCUR = np.zeros(CH.shape[0], np.float64)
    BND = np.zeros(max(n_b, 16), np.float64)
    LI = np.full(max(n_li, 16), -1, np.int32)
    LB = np.zeros((LI.shape[0], LB_WIDTH), np.float64)
    pc = 0
    pb = 0
    pl = 0
    for u in range(n_nodes):
        t = NI[u, F_TYPE]
        if t == LEAF:
            n = NI[u, F_LLEN]
            cap = leaf_cap(n)
            o = NI[u, F_LOFF]
            LI[pl : pl + n] = T[T_LI][o : o + n]
            LB[pl : pl + n] = T[T_LB][o : o + n]
            NI[u, F_LOFF] = pl
            NI[u, F_LCAP] = cap
            pl += cap
        elif t != FREED:
            n = NI[u, F_NCH]
            o = NI[u, F_CHOFF]
            CH[pc : pc + n] = T[T_CH][o : o + n]
            CLO[pc : pc + n] = T[T_CLO][o : o + n]
            CHI[pc : pc + n] = T[T_CHI][o : o + n]
            WOLD[pc : pc + n] = T[T_WOLD][o : o + n]
            WCUR[pc : pc + n] = T[T_WCUR][o : o + n]
            NI[u, F_CHOFF] = pc
            pc += n
            if t == SNODE:
                nb = NI[u, F_NX] + NI[u, F_NY] + 2
                o = NI[u, F_BOFF]
                BND[pb : pb + nb] = T[T_BND][o : o + nb]
                NI[u, F_BOFF] = pb
                pb += nb
    CNT[C_CH] = pc
    CNT[C_BND] = pb
    CNT[C_LI] = pl
    CNT[C_GARBAGE] = 0
    return (T[T_NI], T[T_NF], CH, CLO, CHI, WOLD, WCUR, BND, LI, T[T_FREE], CNT, LB)
