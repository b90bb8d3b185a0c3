"""Compiled kernels of the R^t-tree family (``shard.rivals.rtree``; papers 003 and 004): an
open-addressing hash of (node, token) summaries, the R-tree's insert / split / delete with the
summaries kept up to date (004 Sect. 3.1, 4.1, 5.1 "Updates"), STR packing for the bulk path,
the representative-token choices (004 Sect. 4.2) and the two filtering algorithms
(004 Fig. 3, filter-and-verify; Fig. 6, R^t++-TREE-PRUNE without verification).

Layout (flat arrays, one row per node / clause row / pool position):

* nodes: ``ni`` [N, 3] (parent, entry count, height above the leaves: 0 = leaf), ``nch``
  [N, B + 1] (entries: clause rows in a leaf, child nodes above; one spare for the overflow
  before a split), ``nbox`` [N, 4] (MBR of the entries), ``nfree`` (recycled node ids) and
  ``tr`` (root, high-water mark, free count, B, b, variant);
* clauses: ``cleaf`` (the leaf holding the clause row, -1: none), ``moff``/``mlen`` into the
  pool ``mtok`` of *summary tokens*: every term (R^t), the representative token (R^t+), or every
  term in the representative order (R^t++);
* R^t++ inverted lists ``I_n[t]``: doubly linked lists of *elements*, ``lk`` [P, 4] (``NXT``,
  ``PRV``, ``ECL`` the clause row, indexed by element; ``ELEM`` the element of a pool position,
  indexed by position), the hash holding each list's head. A bulk build numbers the elements list
  by list (``link_sorted``), so a list is one sequential run in memory; an insert takes the
  element of the same number as its pool position (beyond the bulk-built range);
* the hash ``ht`` [cap, 2] (key ``node << 32 | token``, value: a count for R^t / R^t+, the list
  head for R^t++) with ``hm`` = (slots used incl. tombstones, live keys). Kernels that add keys
  return the table (it may have been regrown).

The root carries no summary: it is no entry of any node (004 Sect. 3.1: level 1 is the root's
entries), so a tree of one leaf verifies its clauses directly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.rivals.base import hits_region, report, verify_clause

PAR, CNT, HGT = 0, 1, 2
"""Columns of ``ni``."""
ROOT, NHW, FTOP, CAP_B, MIN_B, VARIANT = 0, 1, 2, 3, 4, 5
"""Entries of ``tr``."""
COUNTS, POSTINGS = 0, 1
"""``tr[VARIANT]``: token counts per node (R^t, R^t+) or inverted lists per node (R^t++)."""
NXT, PRV, ELEM, ECL = 0, 1, 2, 3
"""Columns of ``lk``."""
EMPTY, TOMB = -1, -2
"""Hash keys of a never-used and of a deleted slot."""
SIZE_EPS = 1e-6
"""Degrees added to each side before an area is taken (``_size``), so point regions (zero area)
still differ in size by their spread; ~0.1 m, far below any real region."""


# ---- the (node, token) hash ------------------------------------------------------------------
@njit(cache=True)
def hkey(node, tok):
    return (np.int64(node) << 32) | np.int64(tok)


@njit(cache=True)
def _hslot(key, mask):
    h = key * np.int64(-7046029254386353131)
    h ^= h >> 29
    return h & mask


@njit(cache=True)
def hget(ht, key):
    """The value under ``key``, -1 when absent. O(1) expected."""
    mask = ht.shape[0] - 1
    i = _hslot(key, mask)
    while True:
        k = ht[i, 0]
        if k == key:
            return ht[i, 1]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def new_table(cap):
    """An empty table of at least ``cap`` slots (a power of two)."""
    size = 16
    while size < cap:
        size *= 2
    return np.full((size, 2), EMPTY, np.int64)


@njit(cache=True)
def _rehash(ht, hm):
    cap = ht.shape[0]
    new = new_table(2 * cap if hm[1] * 10 > cap * 3 else cap)
    mask = new.shape[0] - 1
    for i in range(cap):
        k = ht[i, 0]
        if k >= 0:
            j = _hslot(k, mask)
            while new[j, 0] != EMPTY:
                j = (j + 1) & mask
            new[j, 0] = k
            new[j, 1] = ht[i, 1]
    hm[0] = hm[1]
    return new


@njit(cache=True)
def hset(ht, hm, key, val):
    """Set ``key`` to ``val`` (>= 0). Returns the table (regrown past 60 % use)."""
    mask = ht.shape[0] - 1
    i = _hslot(key, mask)
    tomb = -1
    while True:
        k = ht[i, 0]
        if k == key:
            ht[i, 1] = val
            return ht
        if k == EMPTY:
            break
        if k == TOMB and tomb < 0:
            tomb = i
        i = (i + 1) & mask
    if tomb >= 0:
        i = tomb
    else:
        hm[0] += 1
    ht[i, 0] = key
    ht[i, 1] = val
    hm[1] += 1
    if hm[0] * 10 > ht.shape[0] * 6:
        ht = _rehash(ht, hm)
    return ht


@njit(cache=True)
def hdel(ht, hm, key):
    mask = ht.shape[0] - 1
    i = _hslot(key, mask)
    while True:
        k = ht[i, 0]
        if k == key:
            ht[i, 0] = TOMB
            hm[1] -= 1
            return
        if k == EMPTY:
            return
        i = (i + 1) & mask


@njit(cache=True)
def hadd(ht, hm, key, delta):
    """Add ``delta`` to the count under ``key``; a count reaching 0 drops the key (004 Sect. 3.1,
    Updates: "If the hash value is 0, we remove the token")."""
    v = hget(ht, key)
    v = (0 if v < 0 else v) + delta
    if v == 0:
        hdel(ht, hm, key)
        return ht
    return hset(ht, hm, key, v)


# ---- summaries ---------------------------------------------------------------------------------
@njit(cache=True)
def _link(ht, hm, n, p, mtok, lk):
    """Put pool position ``p`` (its element ``lk[p, ELEM]``) at the head of ``I_n[mtok[p]]``."""
    key = hkey(n, mtok[p])
    e = lk[p, ELEM]
    head = hget(ht, key)
    lk[e, NXT] = head
    lk[e, PRV] = -1
    if head >= 0:
        lk[head, PRV] = e
    return hset(ht, hm, key, e)


@njit(cache=True)
def _unlink(ht, hm, n, p, mtok, lk):
    e = lk[p, ELEM]
    nx, pv = lk[e, NXT], lk[e, PRV]
    if pv >= 0:
        lk[pv, NXT] = nx
    else:
        key = hkey(n, mtok[p])
        if nx >= 0:
            ht = hset(ht, hm, key, nx)
        else:
            hdel(ht, hm, key)
    if nx >= 0:
        lk[nx, PRV] = pv
    lk[e, NXT] = -1
    lk[e, PRV] = -1
    return ht


@njit(cache=True)
def contrib(ht, hm, variant, n, depth, height, c, sign, moff, mlen, mtok, lk):
    """Add (``sign`` 1) or take out (-1) clause row ``c``'s part of node ``n``'s summary, ``n``
    at ``depth`` (1 = an entry of the root) in a tree of ``height``: a count per summary token
    (004 Sect. 3.1 TokenSet as a count table; Sect. 4.1 the representative token), or, for
    R^t++, the positions of its tokens assigned to ``n``'s level in ``I_n[t]`` (Sect. 5.1: token
    i to the level-i ancestor, tokens from ``height`` on to the leaf). O(|c|)."""
    a = moff[c]
    if variant == COUNTS:
        for p in range(a, a + mlen[c]):
            ht = hadd(ht, hm, hkey(n, mtok[p]), sign)
        return ht
    for k in range(mlen[c]):
        if min(k + 1, height) == depth:
            if sign > 0:
                ht = _link(ht, hm, n, a + k, mtok, lk)
            else:
                ht = _unlink(ht, hm, n, a + k, mtok, lk)
    return ht


@njit(cache=True)
def subtree_clauses(n, ni, nch):
    """The clause rows under node ``n`` (depth-first). O(subtree)."""
    out = np.empty(64, np.int32)
    k = 0
    stack = np.empty(64, np.int32)
    stack[0] = n
    top = 1
    while top > 0:
        top -= 1
        m = stack[top]
        for e in range(ni[m, CNT]):
            x = nch[m, e]
            if ni[m, HGT] == 0:
                if k == out.shape[0]:
                    out = np.concatenate((out, np.empty(k, np.int32)))
                out[k] = x
                k += 1
            else:
                if top == stack.shape[0]:
                    stack = np.concatenate((stack, np.empty(top, np.int32)))
                stack[top] = x
                top += 1
    return out[:k]


@njit(cache=True)
def add_path(ht, hm, tr, ni, c, leaf, sign, moff, mlen, mtok, lk):
    """Clause ``c``'s summary entries on every non-root ancestor of ``leaf`` (itself included).
    O(H |c|) (004 Sect. 3.1 / 4.1 Updates; Sect. 5.1: O(H + |s|) links)."""
    root = tr[ROOT]
    height = ni[root, HGT]
    a = leaf
    while a != root:
        ht = contrib(
            ht, hm, tr[VARIANT], a, height - ni[a, HGT], height, c, sign, moff, mlen, mtok, lk
        )
        a = ni[a, PAR]
    return ht


@njit(cache=True)
def summarize_all(ht, hm, tr, ni, nch, cleaf, moff, mlen, mtok, lk):
    """Every clause's summary entries, into an empty table (after a bulk build, or when the
    height changed: an R^t++ token's level is counted from the root), clause by clause: each
    R^t++ position keeps its element (a clause waiting to be reinserted keeps its own). O(H *
    terms). (``link_sorted`` is the bulk path of R^t++.)"""
    for c in subtree_clauses(tr[ROOT], ni, nch):
        ht = add_path(ht, hm, tr, ni, c, cleaf[c], 1, moff, mlen, mtok, lk)
    return ht


@njit(cache=True)
def link_sorted(ht, hm, tr, ni, nch, cleaf, moff, mlen, mtok, lk):
    """R^t++ bulk: every clause's postings (Sect. 5.1 assignment) with the elements numbered list
    by list, in clause-row order within a list (a sequential scan when matching): the lists
    ``add_path`` would give clause by clause. O(terms log terms)."""
    root = tr[ROOT]
    height = ni[root, HGT]
    rows = subtree_clauses(root, ni, nch)
    if height == 0:  # the root carries no summary: no list, but every position keeps an
        e = 0  # element of its own, which the lists take once the root splits (add_path)
        for c in rows:
            for p in range(moff[c], moff[c] + mlen[c]):
                lk[p, ELEM] = e
                lk[e, ECL] = c
                e += 1
        return ht
    total = 0
    for c in rows:
        total += mlen[c]
    keys = np.empty(total, np.int64)
    pos = np.empty(total, np.int64)
    owner = np.empty(total, np.int64)
    path = np.empty(height + 1, np.int64)
    k = 0
    for c in rows:
        a, d = cleaf[c], height
        while a != root:  # path[d]: the ancestor at depth d
            path[d] = a
            a, d = ni[a, PAR], d - 1
        for j in range(mlen[c]):
            p = moff[c] + j
            keys[k] = hkey(path[min(j + 1, height)], mtok[p])
            pos[k] = p
            owner[k] = c
            k += 1
    order = np.argsort(keys, kind="mergesort")
    for i in range(total):
        e = i
        p = pos[order[i]]
        lk[p, ELEM] = e
        lk[e, ECL] = owner[order[i]]
    for i in range(total):
        p = pos[order[i]]
        e = lk[p, ELEM]
        first = i == 0 or keys[order[i - 1]] != keys[order[i]]
        last = i == total - 1 or keys[order[i + 1]] != keys[order[i]]
        lk[e, PRV] = -1 if first else e - 1
        lk[e, NXT] = -1 if last else e + 1
        if first:
            ht = hset(ht, hm, keys[order[i]], e)
    return ht


# ---- R-tree geometry ---------------------------------------------------------------------------
@njit(cache=True)
def _size(x0, y0, x1, y1):
    return (x1 - x0 + SIZE_EPS) * (y1 - y0 + SIZE_EPS)


@njit(cache=True)
def _entry_box(ni, nch, nbox, bbox, cl_sub, n, e):
    x = nch[n, e]
    if ni[n, HGT] == 0:
        s = cl_sub[x]
        return bbox[s, 0], bbox[s, 1], bbox[s, 2], bbox[s, 3]
    return nbox[x, 0], nbox[x, 1], nbox[x, 2], nbox[x, 3]


@njit(cache=True)
def tighten(ni, nch, nbox, bbox, cl_sub, n):
    """Node ``n``'s box as the MBR of its entries (an empty node: an empty box)."""
    x0, y0, x1, y1 = np.inf, np.inf, -np.inf, -np.inf
    for e in range(ni[n, CNT]):
        a0, b0, a1, b1 = _entry_box(ni, nch, nbox, bbox, cl_sub, n, e)
        x0, y0, x1, y1 = min(x0, a0), min(y0, b0), max(x1, a1), max(y1, b1)
    nbox[n, 0], nbox[n, 1], nbox[n, 2], nbox[n, 3] = x0, y0, x1, y1


@njit(cache=True)
def _choose_subtree(ni, nch, nbox, n, x0, y0, x1, y1):
    """Guttman's ChooseLeaf step: the entry needing the least area enlargement, ties to the
    smallest area."""
    best, best_grow, best_size = -1, np.inf, np.inf
    for e in range(ni[n, CNT]):
        ch = nch[n, e]
        size = _size(nbox[ch, 0], nbox[ch, 1], nbox[ch, 2], nbox[ch, 3])
        grow = (
            _size(
                min(nbox[ch, 0], x0),
                min(nbox[ch, 1], y0),
                max(nbox[ch, 2], x1),
                max(nbox[ch, 3], y1),
            )
            - size
        )
        if grow < best_grow or (grow == best_grow and size < best_size):
            best, best_grow, best_size = ch, grow, size
    return best


@njit(cache=True)
def _new_node(ni, nbox, nfree, tr, height):
    if tr[FTOP] > 0:
        tr[FTOP] -= 1
        n = nfree[tr[FTOP]]
    else:
        n = tr[NHW]
        tr[NHW] += 1
    ni[n, PAR] = -1
    ni[n, CNT] = 0
    ni[n, HGT] = height
    nbox[n, 0], nbox[n, 1], nbox[n, 2], nbox[n, 3] = np.inf, np.inf, -np.inf, -np.inf
    return n


@njit(cache=True)
def _free_node(ni, nfree, tr, n):
    ni[n, CNT] = 0
    ni[n, PAR] = -1
    nfree[tr[FTOP]] = n
    tr[FTOP] += 1


@njit(cache=True)
def _quadratic_split(ni, nch, nbox, bbox, cl_sub, n, n2, min_fill):
    """Guttman's quadratic split of the B + 1 entries of ``n`` between ``n`` and the empty
    ``n2`` (PickSeeds: the pair wasting the most area; PickNext: the entry with the strongest
    preference; each group gets at least ``min_fill`` = b entries)."""
    k = ni[n, CNT]
    bx = np.empty((k, 4))
    ent = nch[n, :k].copy()
    for e in range(k):
        bx[e, 0], bx[e, 1], bx[e, 2], bx[e, 3] = _entry_box(ni, nch, nbox, bbox, cl_sub, n, e)
    s1, s2 = _pick_seeds(bx, k)
    group = np.full(k, -1, np.int8)
    g = np.empty((2, 4))
    group[s1], group[s2] = 0, 1
    g[0] = bx[s1]
    g[1] = bx[s2]
    cnt = np.array([1, 1])
    left = k - 2
    while left > 0:
        if cnt[0] + left == min_fill or cnt[1] + left == min_fill:
            fill = 0 if cnt[0] + left == min_fill else 1
            for e in range(k):
                if group[e] < 0:
                    group[e] = fill
                    cnt[fill] += 1
            break
        pick, pick_d, pick_g = -1, -1.0, 0
        for e in range(k):
            if group[e] >= 0:
                continue
            d0 = _grow(g[0], bx[e])
            d1 = _grow(g[1], bx[e])
            if abs(d0 - d1) > pick_d:
                pick, pick_d = e, abs(d0 - d1)
                pick_g = 0 if (d0 < d1 or (d0 == d1 and cnt[0] <= cnt[1])) else 1
        group[pick] = pick_g
        cnt[pick_g] += 1
        for a in range(2):
            g[pick_g, a] = min(g[pick_g, a], bx[pick, a])
            g[pick_g, a + 2] = max(g[pick_g, a + 2], bx[pick, a + 2])
        left -= 1
    c0, c1 = 0, 0
    for e in range(k):
        if group[e] == 0:
            nch[n, c0] = ent[e]
            c0 += 1
        else:
            nch[n2, c1] = ent[e]
            c1 += 1
    ni[n, CNT] = c0
    ni[n2, CNT] = c1


@njit(cache=True)
def _pick_seeds(bx, k):
    """Guttman's PickSeeds: the pair of entries whose common box wastes the most area."""
    s1, s2, worst = 0, 1, -np.inf
    for i in range(k):
        for j in range(i + 1, k):
            d = _grow(bx[i], bx[j]) - _size(bx[j, 0], bx[j, 1], bx[j, 2], bx[j, 3])
            if d > worst:
                s1, s2, worst = i, j, d
    return s1, s2


@njit(cache=True)
def _grow(gb, eb):
    size = _size(gb[0], gb[1], gb[2], gb[3])
    return _size(min(gb[0], eb[0]), min(gb[1], eb[1]), max(gb[2], eb[2]), max(gb[3], eb[3])) - size


# ---- insert / delete (004 Sect. 3.1, 4.1, 5.1 "Updates") -----------------------------------------
@njit(cache=True)
def insert_clauses(
    rows, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
):
    """Insert clause rows ``rows`` one after the other (their summary tokens already in the pool):
    the standard R-tree insertion (Guttman: ChooseLeaf, quadratic split, AdjustTree) with the
    summaries of the leaf's ancestors updated (004 Sect. 3.1 Updates). Node capacity for
    ``H + 2`` new nodes per row must be free. Returns the table."""
    for i in range(rows.shape[0]):
        ht = _insert_one(
            rows[i], ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk,
        )  # fmt: skip
    return ht


@njit(cache=True)
def _insert_one(c, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk):
    s = cl_sub[c]
    x0, y0, x1, y1 = bbox[s, 0], bbox[s, 1], bbox[s, 2], bbox[s, 3]
    n = tr[ROOT]
    while ni[n, HGT] > 0:  # ChooseLeaf: least enlargement
        n = _choose_subtree(ni, nch, nbox, n, x0, y0, x1, y1)
    nch[n, ni[n, CNT]] = c
    ni[n, CNT] += 1
    cleaf[c] = n
    a = n
    while a >= 0:  # AdjustTree: the boxes on the path cover the new region
        nbox[a, 0] = min(nbox[a, 0], x0)
        nbox[a, 1] = min(nbox[a, 1], y0)
        nbox[a, 2] = max(nbox[a, 2], x1)
        nbox[a, 3] = max(nbox[a, 3], y1)
        a = ni[a, PAR]
    # Sect. 3.1 / 4.1 / 5.1 Updates: the new clause's tokens into its ancestors' summaries
    ht = add_path(ht, hm, tr, ni, c, n, 1, moff, mlen, mtok, lk)
    while ni[n, CNT] > tr[CAP_B]:
        ht, n = _split(
            n, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
        )
        if n < 0:
            break
    return ht


@njit(cache=True)
def _split(n, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk):
    """Split the overflowing node ``n``; returns (table, the parent to check next or -1)."""
    n2 = _new_node(ni, nbox, nfree, tr, ni[n, HGT])
    _quadratic_split(ni, nch, nbox, bbox, cl_sub, n, n2, tr[MIN_B])
    for e in range(ni[n2, CNT]):
        if ni[n, HGT] == 0:
            cleaf[nch[n2, e]] = n2
        else:
            ni[nch[n2, e], PAR] = n2
    tighten(ni, nch, nbox, bbox, cl_sub, n)
    tighten(ni, nch, nbox, bbox, cl_sub, n2)
    root = tr[ROOT]
    if n == root:  # the root splits: a new root above n and n2, the tree one level higher
        r = _new_node(ni, nbox, nfree, tr, ni[n, HGT] + 1)
        nch[r, 0], nch[r, 1] = n, n2
        ni[r, CNT] = 2
        ni[n, PAR], ni[n2, PAR] = r, r
        tighten(ni, nch, nbox, bbox, cl_sub, r)
        tr[ROOT] = r
        if tr[VARIANT] == COUNTS:  # n and n2 become entries: they need summaries now
            for m in (n, n2):
                for c in subtree_clauses(m, ni, nch):
                    ht = contrib(ht, hm, COUNTS, m, 1, 1, c, 1, moff, mlen, mtok, lk)
        else:  # R^t++: levels count from the root, so every assignment moves (Sect. 5.1)
            ht = _clear(ht, hm)
            ht = summarize_all(ht, hm, tr, ni, nch, cleaf, moff, mlen, mtok, lk)
        return ht, -1
    p = ni[n, PAR]
    nch[p, ni[p, CNT]] = n2
    ni[p, CNT] += 1
    ni[n2, PAR] = p
    height = ni[root, HGT]
    depth = height - ni[n, HGT]
    v = tr[VARIANT]
    for c in subtree_clauses(n2, ni, nch):  # the clauses now under n2 move their part over
        ht = contrib(ht, hm, v, n, depth, height, c, -1, moff, mlen, mtok, lk)
        ht = contrib(ht, hm, v, n2, depth, height, c, 1, moff, mlen, mtok, lk)
    return ht, p


@njit(cache=True)
def _clear(ht, hm):
    ht[:, 0] = EMPTY
    hm[0] = 0
    hm[1] = 0
    return ht


@njit(cache=True)
def delete_clauses(
    rows, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
):
    """Take clause rows ``rows`` out: their summary entries first (counts decremented, a token at
    0 dropped; R^t++ postings unlinked), then the leaf entry (004 Sect. 3.1 Updates). Guttman's
    CondenseTree for the leaf: a leaf left with fewer than b entries leaves the tree and its
    clauses are reinserted; a node left empty leaves its parent (recursively); the boxes on the
    path are tightened. An underfull internal node stays (see the module's ambiguities). Node
    capacity for ``(H + 2) * b`` new nodes per row must be free. O(H |c|) each, plus the
    reinsertions."""
    for i in range(rows.shape[0]):
        c = rows[i]
        n = cleaf[c]
        ht = add_path(ht, hm, tr, ni, c, n, -1, moff, mlen, mtok, lk)
        _drop_entry(ni, nch, n, c)
        cleaf[c] = -1
        root = tr[ROOT]
        k = ni[n, CNT]
        orphans = nch[n, :k].copy() if n != root and k < tr[MIN_B] else nch[n, :0].copy()
        for o in orphans:  # CondenseTree: the underfull leaf's clauses go out, to come back in
            ht = add_path(ht, hm, tr, ni, o, n, -1, moff, mlen, mtok, lk)
            cleaf[o] = -1
        if orphans.shape[0]:
            ni[n, CNT] = 0
        while n != root and ni[n, CNT] == 0:
            p = ni[n, PAR]
            _drop_entry(ni, nch, p, n)
            _free_node(ni, nfree, tr, n)
            n = p
        if n == root and ni[root, CNT] == 0:
            ni[root, HGT] = 0  # an empty tree is one empty leaf
        a = n
        while a >= 0:
            tighten(ni, nch, nbox, bbox, cl_sub, a)
            a = ni[a, PAR]
        for o in orphans:
            ht = _insert_one(
                o, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
            )
    return ht


@njit(cache=True)
def subscribe_rows(
    rows, strategy, n_keep, seed, cl_sub, cl_off, cl_len, terms, bbox, df, cells, cell_ht, cell_hm,
    grid, g, start, ht, hm, tr, ni, nch, nbox, nfree, cleaf, moff, mlen, mtok, lk,
):  # fmt: skip
    """New clause rows in one call (the update path of ``subscribe``): their summary tokens
    chosen from the current frequencies and put in the pool from ``start`` (``order_tokens``;
    R^t++: each position's element is the one of the same number), then counted in the
    frequencies (``count_stats``; 004 Sect. 4.2 Updates: choose, then count), then inserted
    (``insert_clauses``; node capacity for ``H + 2`` new nodes per row must be free). Returns
    (table, cell table, new pool end). O(H |s|) per row plus splits."""
    pos = order_tokens(
        rows, strategy, n_keep, cl_sub, cl_off, cl_len, terms, bbox, df, cell_ht, grid, g, seed,
        moff, mlen, mtok, start,
    )  # fmt: skip
    if tr[VARIANT] == POSTINGS:
        for i in range(rows.shape[0]):
            c = rows[i]
            for p in range(moff[c], moff[c] + mlen[c]):
                lk[p, ELEM] = p
                lk[p, ECL] = c
    cell_ht = count_stats(
        rows, 1, cl_sub, cl_off, cl_len, terms, bbox, df, cells, cell_ht, cell_hm, grid, g
    )
    ht = insert_clauses(
        rows, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
    )
    return ht, cell_ht, pos


@njit(cache=True)
def unsubscribe_rows(
    rows, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk,
    cl_off, cl_len, terms, df, cells, cell_ht, cell_hm, grid, g,
):  # fmt: skip
    """Clause rows out in one call (the update path of ``unsubscribe``): ``delete_clauses``, their
    terms taken out of the frequencies (``count_stats``), their summary tokens left in the pool
    as garbage (``mlen`` 0). Node capacity as ``delete_clauses``. Returns (table, cell table,
    pool positions freed)."""
    ht = delete_clauses(
        rows, ht, hm, tr, ni, nch, nbox, nfree, cleaf, bbox, cl_sub, moff, mlen, mtok, lk
    )
    cell_ht = count_stats(
        rows, -1, cl_sub, cl_off, cl_len, terms, bbox, df, cells, cell_ht, cell_hm, grid, g
    )
    freed = 0
    for i in range(rows.shape[0]):
        freed += mlen[rows[i]]
        mlen[rows[i]] = 0
    return ht, cell_ht, freed


@njit(cache=True)
def _drop_entry(ni, nch, n, x):
    k = ni[n, CNT]
    for e in range(k):
        if nch[n, e] == x:
            nch[n, e] = nch[n, k - 1]
            break
    ni[n, CNT] = k - 1


# ---- bulk load: STR packing -----------------------------------------------------------------------
@njit(cache=True)
def fill_level(order, items, boxes, cap, height, ni, nch, nbox, tr, is_leaf, cleaf):
    """Pack ``items`` (in STR ``order``) ``cap`` per node into new nodes of ``height``; returns
    the new node ids and their boxes."""
    k = order.shape[0]
    n_nodes = (k + cap - 1) // cap
    ids = np.empty(n_nodes, np.int32)
    out = np.empty((n_nodes, 4))
    for g in range(n_nodes):
        n = tr[NHW]
        tr[NHW] += 1
        ids[g] = n
        ni[n, PAR] = -1
        ni[n, HGT] = height
        x0, y0, x1, y1 = np.inf, np.inf, -np.inf, -np.inf
        m = 0
        for j in range(g * cap, min(k, (g + 1) * cap)):
            i = order[j]
            x = items[i]
            nch[n, m] = x
            m += 1
            if is_leaf:
                cleaf[x] = n
            else:
                ni[x, PAR] = n
            x0, y0 = min(x0, boxes[i, 0]), min(y0, boxes[i, 1])
            x1, y1 = max(x1, boxes[i, 2]), max(y1, boxes[i, 3])
        ni[n, CNT] = m
        nbox[n, 0], nbox[n, 1], nbox[n, 2], nbox[n, 3] = x0, y0, x1, y1
        out[g, 0], out[g, 1], out[g, 2], out[g, 3] = x0, y0, x1, y1
    return ids, out


# ---- representative tokens (004 Sect. 4.2) ---------------------------------------------------------
DF, IDF, LOCALITY, RANDOM = 0, 1, 2, 3
"""Strategies: df order (greedy), idf (rarest), locality-aware (rarest in the grid cell, then
global idf), random."""


@njit(cache=True)
def cell_of(box, grid, g):
    """The grid cell (of ``g`` x ``g`` over ``grid`` = x0, y0, x1, y1) holding the centre of
    ``box`` (clamped to the grid)."""
    cx = 0.5 * (box[0] + box[2])
    cy = 0.5 * (box[1] + box[3])
    w = max(grid[2] - grid[0], 1e-12)
    h = max(grid[3] - grid[1], 1e-12)
    i = min(max(int((cx - grid[0]) / w * g), 0), g - 1)
    j = min(max(int((cy - grid[1]) / h * g), 0), g - 1)
    return j * g + i


@njit(cache=True)
def count_stats(
    rows, sign, cl_sub, cl_off, cl_len, terms, bbox, df, cells, cell_ht, cell_hm, grid, g
):
    """Add (``sign`` 1) or take out (-1) the clause rows' terms in the global df and the per-cell
    df hash when ``cells`` (004 Sect. 4.2 Updates: a frequency hash table, one per grid cell).
    Returns the cell table."""
    for i in range(rows.shape[0]):
        c = rows[i]
        cell = cell_of(bbox[cl_sub[c]], grid, g)
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            df[terms[j]] += sign
            if cells:
                cell_ht = hadd(cell_ht, cell_hm, hkey(cell, terms[j]), sign)
    return cell_ht


@njit(cache=True)
def _mix(x):
    x = x * np.int64(-7046029254386353131)
    x ^= x >> 31
    x = x * np.int64(-4658895280553007687)
    x ^= x >> 29
    return x


@njit(cache=True)
def _token_key(t, strategy, df, cell_ht, cell, seed):
    """Sort key of term ``t``: smaller first (the representative token, or the top level)."""
    if strategy == DF:
        return -df[t] * np.int64(1 << 31) + t
    if strategy == IDF:
        return df[t] * np.int64(1 << 31) + t
    if strategy == LOCALITY:
        local = min(max(hget(cell_ht, hkey(cell, t)), 0), (1 << 22) - 1)
        glob = min(df[t], (1 << 20) - 1)
        return (local * np.int64(1 << 20) + glob) * np.int64(1 << 21) + (t & ((1 << 21) - 1))
    return _mix(np.int64(t) * 1000003 + seed)


@njit(cache=True)
def order_tokens(
    rows, strategy, n_keep, cl_sub, cl_off, cl_len, terms, bbox, df, cell_ht, grid, g, seed, moff,
    mlen, mtok, start,
):  # fmt: skip
    """Each clause row's summary tokens into the pool from ``start``: its terms sorted by the
    strategy's key, the first ``n_keep`` kept (1: the R^t+ representative token; -1: all, the
    R^t++ level order of Sect. 5.1 "Discussion on token assignment"). Returns the new pool end."""
    pos = start
    for i in range(rows.shape[0]):
        c = rows[i]
        a, k = cl_off[c], cl_len[c]
        cell = cell_of(bbox[cl_sub[c]], grid, g) if strategy == LOCALITY else 0
        keys = np.empty(k, np.int64)
        for j in range(k):
            keys[j] = _token_key(terms[a + j], strategy, df, cell_ht, cell, seed + c)
        idx = np.argsort(keys)
        keep = k if n_keep < 0 else min(k, n_keep)
        moff[c] = pos
        mlen[c] = keep
        for j in range(keep):
            mtok[pos + j] = terms[a + idx[j]]
        pos += keep
    return pos


@njit(cache=True)
def greedy_df(rows, cl_off, cl_len, terms, n_terms, moff, mlen, mtok, start):
    """Sect. 4.2, the df-based greedy: take the token of the largest df among the clauses left,
    make it the representative of every clause left holding it, drop those clauses, recount,
    repeat (a lazy max-heap: counts only fall). Ties go to the smaller term id. Returns the new
    pool end. O(terms log V)."""
    k = rows.shape[0]
    cnt = np.zeros(n_terms, np.int64)
    for i in range(k):
        c = rows[i]
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            cnt[terms[j]] += 1
    start_t = np.zeros(n_terms + 1, np.int64)
    for t in range(n_terms):
        start_t[t + 1] = start_t[t] + cnt[t]
    fill = start_t[:-1].copy()
    inv = np.empty(start_t[n_terms], np.int64)
    for i in range(k):
        c = rows[i]
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            inv[fill[terms[j]]] = i
            fill[terms[j]] += 1
    heap_key = np.empty(n_terms, np.int64)  # -count * 2^31 + t: a min-heap = largest df first
    size = 0
    for t in range(n_terms):
        if cnt[t] > 0:
            heap_key[size] = -cnt[t] * np.int64(1 << 31) + t
            size = _heap_up(heap_key, size)
    done = np.zeros(k, np.bool_)
    pos = start
    while size > 0:
        top = heap_key[0]
        size = _heap_pop(heap_key, size)
        t = top & ((1 << 31) - 1)
        cur = -cnt[t] * np.int64(1 << 31) + t
        if cnt[t] == 0:
            continue
        if cur != top:  # stale: push it back with its current count
            heap_key[size] = cur
            size = _heap_up(heap_key, size)
            continue
        for x in range(start_t[t], start_t[t + 1]):
            i = inv[x]
            if done[i]:
                continue
            done[i] = True
            c = rows[i]
            moff[c] = pos
            mlen[c] = 1
            mtok[pos] = t
            pos += 1
            for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                cnt[terms[j]] -= 1
    return pos


@njit(cache=True)
def _heap_up(h, size):
    i = size
    size += 1
    while i > 0:
        p = (i - 1) // 2
        if h[p] <= h[i]:
            break
        h[p], h[i] = h[i], h[p]
        i = p
    return size


@njit(cache=True)
def _heap_pop(h, size):
    size -= 1
    h[0] = h[size]
    i = 0
    while True:
        a, b, m = 2 * i + 1, 2 * i + 2, i
        if a < size and h[a] < h[m]:
            m = a
        if b < size and h[b] < h[m]:
            m = b
        if m == i:
            return size
        h[m], h[i] = h[i], h[m]
        i = m


# ---- filtering -------------------------------------------------------------------------------------
@njit(cache=True)
def _any_token(ht, n, m_terms, a, b):
    """The token filter (Sect. 3.2 MBRTokenFilter): probe the node's count table with each
    message token, stop at the first hit. O(|m.T|)."""
    for i in range(a, b):  # noqa: SIM110 (a loop: numba compiles no generator into any())
        if hget(ht, hkey(n, m_terms[i])) > 0:
            return True
    return False


@njit(cache=True)
def _misses(nbox, n, x0, y0, x1, y1):
    return x1 < nbox[n, 0] or x0 > nbox[n, 2] or y1 < nbox[n, 1] or y0 > nbox[n, 3]


@njit(cache=True)
def _verify_leaf(
    n, ni, nch, q, is_point, x0, y0, x1, y1, geom, cl_sub, cl_off, cl_len, terms, kind, bbox, circ,
    n_clauses, TM, SM, stamp, out_m, out_s, nout,
):  # fmt: skip
    """Sect. 3.2 R^t-TREE-VERIFY on one leaf: every term by its stamp (what fails most often
    here: the leaf's box already met the message), then the region."""
    for e in range(ni[n, CNT]):
        c = nch[n, e]
        s = cl_sub[c]
        if verify_clause(cl_off, cl_len, terms, TM, stamp, c, -1) and hits_region(
            kind, bbox, circ, s, is_point, x0, y0, x1, y1, geom
        ):
            out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
    return out_m, out_s, nout


@njit(cache=True)
def match_filter_verify(
    root, ni, nch, nbox, ht, empty_rows,
    cl_sub, cl_off, cl_len, terms, kind, bbox, circ, n_clauses,
    TM, SM, stamp, m_off, m_terms, m_kind, m_geom,
):  # fmt: skip
    """004 Fig. 3 (R^t-tree, and R^t+-tree by Theorem 2) over a batch: pre-order traversal, an
    entry pruned by the MBR filter or the token filter, the clauses of the candidate leaves
    verified. Returns (out_m, out_s, stamp)."""
    out_m = np.empty(64, np.int32)
    out_s = np.empty(64, np.int32)
    nout = 0
    stack = np.empty(64, np.int32)
    for q in range(m_kind.shape[0]):
        stamp += 1
        a, b = m_off[q], m_off[q + 1]
        for i in range(a, b):
            TM[m_terms[i]] = stamp
        x0, y0, x1, y1 = m_geom[q, 0], m_geom[q, 1], m_geom[q, 2], m_geom[q, 3]
        is_point = m_kind[q] == 0
        for c in empty_rows:  # clauses without terms: only the region counts
            s = cl_sub[c]
            if hits_region(kind, bbox, circ, s, is_point, x0, y0, x1, y1, m_geom[q]):
                out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
        if ni[root, CNT] == 0 or _misses(nbox, root, x0, y0, x1, y1):
            continue
        stack[0] = root
        top = 1
        while top > 0:
            top -= 1
            n = stack[top]
            if ni[n, HGT] == 0:
                out_m, out_s, nout = _verify_leaf(
                    n, ni, nch, q, is_point, x0, y0, x1, y1, m_geom[q], cl_sub, cl_off, cl_len,
                    terms, kind, bbox, circ, n_clauses, TM, SM, stamp, out_m, out_s, nout,
                )  # fmt: skip
                continue
            for e in range(ni[n, CNT]):
                ch = nch[n, e]
                if _misses(nbox, ch, x0, y0, x1, y1) or not _any_token(ht, ch, m_terms, a, b):
                    continue  # MBR filter / token filter (Sect. 3.2)
                if top == stack.shape[0]:
                    stack = np.concatenate((stack, np.empty(top, np.int32)))
                stack[top] = ch
                top += 1
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp


@njit(cache=True)
def match_prune(
    root, ni, nch, nbox, ht, empty_rows, mlen, lk,
    cl_sub, cl_off, cl_len, terms, kind, bbox, circ, n_clauses,
    TM, SM, stamp, Mst, Mct, mstamp, m_off, m_terms, m_kind, m_geom,
):  # fmt: skip
    """004 Fig. 6, R^t++-TREE-PRUNE over a batch: for each entry n (level i) of a visited node
    that meets the message, each token of ``n.T ∩ m.T`` (probed in the hash per message token),
    each clause s on ``I_n[t]``: ``M[s] += 1``; ``M[s] = |s|`` and its region meets the message:
    an answer (Lemma 4, no verification); ``M[s] = i < |s|`` at an internal n: visit n's
    children (Lemma 5). ``M`` is ``Mct`` under the per-message stamp ``Mst``. Returns (out_m,
    out_s, stamp, mstamp)."""
    out_m = np.empty(64, np.int32)
    out_s = np.empty(64, np.int32)
    nout = 0
    stack = np.empty(64, np.int32)
    height = ni[root, HGT]
    for q in range(m_kind.shape[0]):
        stamp += 1
        mstamp += 1
        a, b = m_off[q], m_off[q + 1]
        for i in range(a, b):
            TM[m_terms[i]] = stamp
        x0, y0, x1, y1 = m_geom[q, 0], m_geom[q, 1], m_geom[q, 2], m_geom[q, 3]
        is_point = m_kind[q] == 0
        geom = m_geom[q]
        for c in empty_rows:
            s = cl_sub[c]
            if hits_region(kind, bbox, circ, s, is_point, x0, y0, x1, y1, geom):
                out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
        if ni[root, CNT] == 0 or _misses(nbox, root, x0, y0, x1, y1):
            continue
        if height == 0:  # one leaf, no level below the root: its few clauses verified directly
            out_m, out_s, nout = _verify_leaf(
                root, ni, nch, q, is_point, x0, y0, x1, y1, geom, cl_sub, cl_off, cl_len,
                terms, kind, bbox, circ, n_clauses, TM, SM, stamp, out_m, out_s, nout,
            )  # fmt: skip
            continue
        stack[0] = root
        top = 1
        while top > 0:
            top -= 1
            r = stack[top]
            for e in range(ni[r, CNT]):
                n = nch[r, e]
                if _misses(nbox, n, x0, y0, x1, y1):
                    continue  # line 3: this entry fails the spatial constraint
                depth = height - ni[n, HGT]
                internal = ni[n, HGT] > 0
                visit = False
                for i in range(a, b):
                    p = hget(ht, hkey(n, m_terms[i]))
                    while p >= 0:
                        c = lk[p, ECL]
                        if Mst[c] != mstamp:
                            Mst[c] = mstamp
                            Mct[c] = 0
                        Mct[c] += 1
                        cnt = Mct[c]
                        if cnt == mlen[c]:  # Case 2.1 / 3: every token in m (Lemma 4)
                            s = cl_sub[c]
                            if hits_region(kind, bbox, circ, s, is_point, x0, y0, x1, y1, geom):
                                out_m, out_s, nout = report(
                                    out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1
                                )
                        elif cnt == depth and internal:  # Case 2.2: answers may lie below
                            visit = True
                        p = lk[p, NXT]
                if visit:  # Lemma 5: otherwise nothing below n can be an answer
                    if top == stack.shape[0]:
                        stack = np.concatenate((stack, np.empty(top, np.int32)))
                    stack[top] = n
                    top += 1
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp, mstamp
