"""PT-Quadtree: a quadtree over the subscriptions' regions whose nodes carry pivotal tokens
(paper 000, Sect. 4).

Paper: M. Yu, G. Li, J. Feng, "A Cost-based Method for Location-Aware Publish/Subscribe
Services", CIKM 2015, Sect. 4 (``../shared/papers/000_…``). Shared numbering and change buffers:
``shard.rivals.p000_common``.

Structure (Sect. 4.1), as columns over nodes numbered breadth first (the four children of a node
are consecutive: SW, SE, NW, NE):

* the root is the minimal box covering every clause's region box; a node is split into four
  quadrants at its centre unless fewer than ``tau_num`` boxes meet it, its area is below
  ``tau_area`` (a fraction of the root's), or it is ``max_depth`` deep;
* each leaf keeps the sorted list of the clauses (positions in token-set order, the ids LFilter's
  list pruning needs) whose box meets its region (closed boxes: a box on a quadrant line is on
  both sides), so a clause can be on several leaves; beside each list, as columns in list order,
  the listed clauses' boxes and their first term in the idf order (their rarest);
* pivotal tokens: a leaf picks one token per clause greedily (the token of largest df among the
  clauses still unrepresented, until none is left); an internal node's set is the union of its
  children's; a token in all four children's sets goes to the node's cover set (CSet) and out of
  the children, the others are its non-cover set (NSet) (Lemma 1, Fig. 4).

Filter and verification (Sect. 4.2, Alg. 2): depth first from the root, prune a node whose
region misses the message; if its CSet meets the message's terms, every leaf below it that meets
the message is a candidate without more token checks; else if its NSet does, go on to its
children (a leaf: a candidate); else prune. PT-QUADTREE-VERIFY checks each clause on a candidate
leaf for both constraints (every term among the message's, through the message stamps; the
region, exactly for a circle), once per message however many candidate leaves hold it.

A set meets the message's terms by the cheaper of the two probes of Sect. 4.2's time complexity
(``min(log N |set|, log|set| N)``): each message term binary-searches the sorted set, or each set
term looks up the message's stamp.

Bulk build: one compiled pass splitting nodes breadth first (each node's clause list filtered
into its quadrants), then the leaves' pivots and the sets bottom up. Insert and delete: the shared
pending buffer and tombstones (``p000_common``); a tombstoned clause stays on its leaves and its
pivotal token in the sets until the next bulk rebuild (still exact: the sets only over-approximate).

Where the paper is ambiguous:

* No values of ``tau_num`` / ``tau_area`` are given: ``DEFAULT_TAU_NUM``, ``DEFAULT_TAU_AREA``.
  A depth limit (``max_depth``) is added so that many clauses at one point stop splitting.
* Splitting copies a box on every quadrant it meets; a split that would make more than
  ``max_copies`` times the node's clauses is not made (the node stays a leaf). The paper's
  alternative (MX-CIF lists on internal nodes) is not built.
* PT-QUADTREE-FILTER (Fig. 5) visits the children of a node whose NSet meets the message; a leaf
  passing that test is taken as a candidate (the figure only says so for the CSet case).
* Greedy pivots: "largest df" is counted among the leaf's clauses still unrepresented (ties to
  the lower term id); after ``GREEDY_ROUNDS`` picks, each remaining clause takes its own token of
  largest count (bounds the build on leaves of many distinct tokens).
* Only the children of a node lose the tokens of its CSet (as the paper says), not deeper
  descendants; a node reached through a CSet hit is never token-checked anyway.
* Verification looks each term up in the message stamps, O(|s|), instead of binary-searching
  the message, O(|s| log N); it tests the list's own columns first (the box, then the rarest
  term), then the clause's other terms and its exact region. The order of the two constraints
  is not the paper's concern; on real place names a point meets thousands of boxes, and reading
  them from the list instead of the store made PT-QUADTREE-VERIFY about ten times faster.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numba import njit

from shard.aptree.match import grown
from shard.rivals.p000_common import (
    P000Index,
    boxes_meet,
    lg,
    lower_bound,
    outside,
    positive_float,
    positive_int,
    report_full,
    report_spatial,
    room,
    room2,
    scan_pending,
    start_message,
)

DEFAULT_TAU_NUM = 32
"""A node with fewer clause boxes than this is a leaf (``tau_num``; the paper gives no value):
32 keeps the PT-QUADTREE-VERIFY of a point message to a few dozen clauses."""

DEFAULT_TAU_AREA = 4.0**-20
"""A node smaller than this share of the root's area is a leaf (``tau_area``): depth 20."""

DEFAULT_MAX_DEPTH = 24
"""No node deeper than this (many boxes at one point)."""

DEFAULT_MAX_COPIES = 2.5
"""A split whose quadrants would hold more than this many times the node's clauses (large boxes
copied to every quadrant) is not made."""

GREEDY_ROUNDS = 64
"""Greedy pivot picks per leaf before the remaining clauses each take their own best token."""


# ---- build ------------------------------------------------------------------------------------
@njit(cache=True)
def split_nodes(boxes, items0, root, tau_num, tau_area, max_depth, max_copies):
    """Sect. 4.1: split breadth first. Returns (region [n, 4], depth, first child (-1: leaf),
    parent, leaf list offsets [n + 1], leaf lists (positions ascending))."""
    cap = 64
    reg = np.empty((cap, 4), np.float64)
    depth = np.zeros(cap, np.int32)
    child = np.full(cap, -1, np.int32)
    parent = np.full(cap, -1, np.int32)
    it_off = np.zeros(cap, np.int64)
    it_cnt = np.zeros(cap, np.int64)
    buf = np.empty(max(16, 2 * items0.shape[0]), np.int32)
    buf[: items0.shape[0]] = items0
    top = items0.shape[0]
    reg[0] = root
    it_cnt[0] = items0.shape[0]
    n_nodes = 1
    min_area = tau_area * (root[2] - root[0]) * (root[3] - root[1])
    quad = np.empty((4, 4), np.float64)
    i = 0
    while i < n_nodes:
        cnt = it_cnt[i]
        r = reg[i]
        area = (r[2] - r[0]) * (r[3] - r[1])
        if cnt < tau_num or area < min_area or area <= 0.0 or depth[i] >= max_depth:
            i += 1
            continue
        mx, my = 0.5 * (r[0] + r[2]), 0.5 * (r[1] + r[3])
        for z in range(4):  # SW, SE, NW, NE
            quad[z, 0] = r[0] if z % 2 == 0 else mx
            quad[z, 1] = r[1] if z < 2 else my
            quad[z, 2] = mx if z % 2 == 0 else r[2]
            quad[z, 3] = my if z < 2 else r[3]
        total = 0
        for j in range(it_off[i], it_off[i] + cnt):
            b = boxes[buf[j]]
            for z in range(4):
                if boxes_meet(quad[z], b[0], b[1], b[2], b[3]):
                    total += 1
        if total > max_copies * cnt:
            i += 1
            continue
        reg = room2(reg, n_nodes, 4)  # (the node columns grow together)
        depth, child, parent = (
            room(depth, n_nodes, 4),
            room(child, n_nodes, 4),
            room(parent, n_nodes, 4),
        )
        it_off, it_cnt = room(it_off, n_nodes, 4), room(it_cnt, n_nodes, 4)
        buf = room(buf, top, total)
        child[i] = n_nodes
        for z in range(4):
            c = n_nodes + z
            reg[c] = quad[z]
            depth[c] = depth[i] + 1
            child[c] = -1
            parent[c] = i
            it_off[c] = top
            for j in range(it_off[i], it_off[i] + cnt):
                b = boxes[buf[j]]
                if boxes_meet(quad[z], b[0], b[1], b[2], b[3]):
                    buf[top] = buf[j]
                    top += 1
            it_cnt[c] = top - it_off[c]
        n_nodes += 4
        i += 1
    list_off = np.zeros(n_nodes + 1, np.int64)
    for n in range(n_nodes):
        list_off[n + 1] = list_off[n] + (it_cnt[n] if child[n] < 0 else 0)
    lists = np.empty(list_off[n_nodes], np.int32)
    for n in range(n_nodes):
        if child[n] < 0:
            lists[list_off[n] : list_off[n + 1]] = buf[it_off[n] : it_off[n] + it_cnt[n]]
    return (
        reg[:n_nodes].copy(),
        depth[:n_nodes].copy(),
        child[:n_nodes].copy(),
        parent[:n_nodes].copy(),
        list_off,
        lists,
    )


@njit(cache=True)
def leaf_pivots(lists, a, b, pos_row, cl_off, cl_len, terms, cnt):
    """Sect. 4.1: the pivotal-token set of a leaf (clauses ``lists[a:b]``), greedily: the token
    held by most clauses not yet represented, until every clause is. ``cnt``: a zeroed count per
    term id (left zeroed). Returns the set, ascending."""
    n_t = 0
    for i in range(a, b):
        n_t += cl_len[pos_row[lists[i]]]
    dist = np.empty(max(n_t, 1), np.int32)
    nd = 0
    for i in range(a, b):
        c = pos_row[lists[i]]
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            t = terms[j]
            if cnt[t] == 0:
                dist[nd] = t
                nd += 1
            cnt[t] += 1
    done = np.zeros(b - a, np.bool_)
    piv = np.empty(max(b - a, 1), np.int32)
    npiv = 0
    left = b - a
    while left > 0:
        if npiv < GREEDY_ROUNDS:
            best = -1
            for x in range(nd):
                t = dist[x]
                if best < 0 or cnt[t] > cnt[best] or (cnt[t] == cnt[best] and t < best):
                    best = t
            piv[npiv] = best
            npiv += 1
            for i in range(a, b):  # its clauses are represented: their tokens count no more
                if done[i - a]:
                    continue
                c = pos_row[lists[i]]
                has = False
                for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                    has = has or terms[j] == best
                if has:
                    done[i - a] = True
                    left -= 1
                    for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                        cnt[terms[j]] -= 1
        else:  # each remaining clause its own token of largest count
            for i in range(a, b):
                if done[i - a]:
                    continue
                c = pos_row[lists[i]]
                best = -1
                for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                    t = terms[j]
                    if best < 0 or cnt[t] > cnt[best] or (cnt[t] == cnt[best] and t < best):
                        best = t
                piv[npiv] = best
                npiv += 1
            left = 0
    for x in range(nd):
        cnt[dist[x]] = 0
    return np.unique(piv[:npiv])


@njit(cache=True)
def pivot_sets(child, parent, list_off, lists, pos_row, cl_off, cl_len, terms, n_vocab):
    """Sect. 4.1: every node's CSet and NSet (CSR, term ids ascending): leaves' greedy pivots,
    unions bottom up, a token of all four children in the CSet and out of the children."""
    n = child.shape[0]
    cnt = np.zeros(max(n_vocab, 1), np.int64)
    f_off = np.zeros(n, np.int64)
    f_len = np.zeros(n, np.int64)
    c_off = np.zeros(n, np.int64)
    c_len = np.zeros(n, np.int64)
    fs = np.empty(64, np.int32)
    cs = np.empty(64, np.int32)
    ftop = 0
    ctop = 0
    for v in range(n - 1, -1, -1):  # children (higher ids) before parents
        if child[v] < 0:
            full = leaf_pivots(
                lists, list_off[v], list_off[v + 1], pos_row, cl_off, cl_len, terms, cnt
            )
            cover = np.empty(0, np.int32)
        else:
            tot = 0
            for z in range(4):
                tot += f_len[child[v] + z]
            cat = np.empty(tot, np.int32)
            k = 0
            for z in range(4):
                c = child[v] + z
                cat[k : k + f_len[c]] = fs[f_off[c] : f_off[c] + f_len[c]]
                k += f_len[c]
            cat.sort()
            full = np.empty(tot, np.int32)
            cover = np.empty(tot, np.int32)
            nf = 0
            ncv = 0
            x = 0
            while x < tot:  # run lengths: a run of 4 is a token of every child
                y = x
                while y < tot and cat[y] == cat[x]:
                    y += 1
                full[nf] = cat[x]
                nf += 1
                if y - x == 4:
                    cover[ncv] = cat[x]
                    ncv += 1
                x = y
            full = full[:nf]
            cover = cover[:ncv]
        fs = room(fs, ftop, full.shape[0])
        cs = room(cs, ctop, cover.shape[0])
        f_off[v], f_len[v] = ftop, full.shape[0]
        fs[ftop : ftop + full.shape[0]] = full
        ftop += full.shape[0]
        c_off[v], c_len[v] = ctop, cover.shape[0]
        cs[ctop : ctop + cover.shape[0]] = cover
        ctop += cover.shape[0]
    # final sets: CSet(v) and NSet(v) = full(v) - CSet(v), both without the parent's CSet
    cs_off = np.zeros(n + 1, np.int64)
    ns_off = np.zeros(n + 1, np.int64)
    cs_terms = np.empty(ctop, np.int32)
    ns_terms = np.empty(ftop, np.int32)
    for v in range(n):
        p = parent[v]
        pa, pb = (c_off[p], c_off[p] + c_len[p]) if p >= 0 else (0, 0)
        k = cs_off[v]
        m = ns_off[v]
        ca, cb = c_off[v], c_off[v] + c_len[v]
        for x in range(f_off[v], f_off[v] + f_len[v]):
            t = fs[x]
            y = lower_bound(cs, pa, pb, t)
            if y < pb and cs[y] == t:
                continue  # in the parent's CSet: removed from the children
            y = lower_bound(cs, ca, cb, t)
            if y < cb and cs[y] == t:
                cs_terms[k] = t
                k += 1
            else:
                ns_terms[m] = t
                m += 1
        cs_off[v + 1] = k
        ns_off[v + 1] = m
    return cs_off, cs_terms[: cs_off[n]].copy(), ns_off, ns_terms[: ns_off[n]].copy()


def make_quadtree(
    index: P000Index, mat: np.ndarray, lens: np.ndarray, tau_num, tau_area, max_depth, max_copies
):
    """The PT-Quadtree over ``index``'s positions (``lens``: their token counts; a clause without
    tokens stays out): the tuple the kernels take, (region, first child, list offsets, lists,
    CSet offsets, CSet terms, NSet offsets, NSet terms), and (depth, parent)."""
    st = index.store
    boxes = np.ascontiguousarray(st.bbox[index.pos_slot])
    items = np.flatnonzero(lens > 0).astype(np.int32)
    if items.shape[0]:
        b = boxes[items]
        root = np.array([b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max()])
    else:
        root = np.array([np.inf, np.inf, -np.inf, -np.inf])
    reg, depth, child, parent, list_off, lists = split_nodes(
        boxes, items, root, tau_num, tau_area, max_depth, max_copies
    )
    cs_off, cs_terms, ns_off, ns_terms = pivot_sets(
        child,
        parent,
        list_off,
        lists,
        index.pos_row,
        st.cl_off,
        st.cl_len,
        st.terms,
        len(st.vocab_terms),
    )
    # beside the lists: each clause's box and its first (rarest) term, tested before the clause
    list_box = np.ascontiguousarray(boxes[lists])
    inv = np.argsort(index.rank).astype(np.int32)
    first = inv[np.maximum(mat[:, 0], 0)] if inv.shape[0] else np.zeros(lens.shape[0], np.int32)
    list_tok = first[lists].astype(np.int32)
    qt = (reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms)
    return qt, (depth, parent)


# ---- filtering --------------------------------------------------------------------------------
@njit(cache=True)
def meets_terms(set_terms, a, b, m_terms, ma, mb, TM, stamp) -> bool:
    """Whether the sorted set ``set_terms[a:b]`` shares a term with the message (terms
    ``m_terms[ma:mb]`` ascending, stamped in ``TM``), by the cheaper probe."""
    s = b - a
    n = mb - ma
    if s == 0 or n == 0:
        return False
    if n * lg(s) < s:  # each message term binary-searches the set
        for i in range(ma, mb):
            x = lower_bound(set_terms, a, b, m_terms[i])
            if x < b and set_terms[x] == m_terms[i]:
                return True
        return False
    for x in range(a, b):  # noqa: SIM110 (each set term looks up the message's stamp)
        if TM[set_terms[x]] == stamp:
            return True
    return False


@njit(cache=True)
def pt_filter(qt, box, m_terms, ma, mb, TM, stamp, stack, cand):
    """PT-QUADTREE-FILTER (Fig. 5): the candidate leaves, written to ``cand``. ``stack``: two
    columns (node, 1 when below a CSet hit). Returns (number of candidates, stack, cand)."""
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = qt
    x0, y0, x1, y1 = box
    nc = 0
    sp = 1
    stack[0, 0] = 0
    stack[0, 1] = 0
    while sp > 0:
        sp -= 1
        n, free = stack[sp, 0], stack[sp, 1]
        if not boxes_meet(reg[n], x0, y0, x1, y1):  # line 2
            continue
        if free == 0:
            if meets_terms(cs_terms, cs_off[n], cs_off[n + 1], m_terms, ma, mb, TM, stamp):
                free = 1  # lines 3-5: every leaf below that meets the message
            elif not meets_terms(ns_terms, ns_off[n], ns_off[n + 1], m_terms, ma, mb, TM, stamp):
                continue  # Lemma 1
        if child[n] < 0:
            if nc == cand.shape[0]:
                cand = grown(cand, nc)
            cand[nc] = n
            nc += 1
            continue
        stack = room2(stack, sp, 4)
        for z in range(4):
            stack[sp, 0] = child[n] + z
            stack[sp, 1] = free
            sp += 1
    return nc, stack, cand


@njit(cache=True)
def report_tokenless(n_empty, numbering, cols, SM, msg, out):
    """The clauses without tokens (the first ``n_empty`` positions, kept out of the quadtree:
    no pivotal token) against every message: the region test only. Returns ``out``."""
    pos_slot, alive = numbering[2], numbering[3]
    for p in range(n_empty):
        out = report_spatial(p, pos_slot, alive, cols, SM, msg, out)
    return out


@njit(cache=True)
def verify_list(qt, x_from, x_to, numbering, cols, TM, SM, CM, cstamp, msg, out):
    """PT-QUADTREE-VERIFY (Sect. 4.2) of the leaf-list entries ``lists[x_from:x_to]``: the
    list's own columns first (the box, then the rarest term), each position once per message
    (``CM``/``cstamp``), then ``report_full``. Returns (out, positions verified)."""
    lists, list_box, list_tok = qt[3], qt[4], qt[5]
    rank, pos_row, pos_slot, alive = numbering
    stamp = msg[1]
    x0, y0, x1, y1 = msg[3]
    nv = 0
    for x in range(x_from, x_to):
        if outside(list_box, x, x0, y0, x1, y1):
            continue  # (the box test on the list's own column, before the clause's)
        if TM[list_tok[x]] != stamp:
            continue  # (its rarest term, from the list's column)
        p = lists[x]
        if CM[p] == cstamp:
            continue
        CM[p] = cstamp
        nv += 1
        out = report_full(p, pos_row, pos_slot, alive, cols, TM, SM, msg, out)
    return out, nv


@njit(cache=True)
def _match(qt, n_empty, numbering, cols, TM, SM, stamp, cstamp, CM, pending, batch):
    """Alg. 2 over a batch: the clauses without tokens, filter, PT-QUADTREE-VERIFY of the
    candidate leaves, the pending clauses. Extra result: [candidate leaves, clauses verified]."""
    list_off = qt[2]
    m_terms = batch[1]
    out = (np.empty(64, np.int32), np.empty(64, np.int32), 0)
    stack = np.empty((64, 2), np.int32)
    cand = np.empty(64, np.int32)
    counts = np.zeros(2, np.int64)
    for q in range(batch[2].shape[0]):
        stamp, a, b, msg = start_message(batch, q, TM, stamp)
        cstamp += 1
        out = report_tokenless(n_empty, numbering, cols, SM, msg, out)
        nc, stack, cand = pt_filter(qt, msg[3], m_terms, a, b, TM, stamp, stack, cand)
        counts[0] += nc
        for i in range(nc):
            leaf = cand[i]
            xa, xb = list_off[leaf], list_off[leaf + 1]
            out, nv = verify_list(qt, xa, xb, numbering, cols, TM, SM, CM, cstamp, msg, out)
            counts[1] += nv
        out = scan_pending(pending, m_terms[a:b], cols, TM, SM, msg, out)
    out_m, out_s, nout = out
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp, cstamp, counts


def quadtree_options(tau_num, tau_area, max_depth, max_copies):
    """The validated quadtree options (``ValidationError`` naming a bad one)."""
    return (
        positive_int("tau_num", tau_num),
        positive_float("tau_area", tau_area),
        positive_int("max_depth", max_depth, 0),
        positive_float("max_copies", max_copies, 1.0),
    )


QUADTREE_OPTIONS_DOC = {
    "tau_num": f"a node meeting fewer clause boxes is a leaf (default {DEFAULT_TAU_NUM})",
    "tau_area": "a node below this share of the root's area is a leaf (default 4^-20)",
    "max_depth": f"deepest node (default {DEFAULT_MAX_DEPTH})",
    "max_copies": "a split copying the node's clauses more than this many times over its "
    f"quadrants is not made (default {DEFAULT_MAX_COPIES})",
}


class PTQuadtree(P000Index):
    """The PT-Quadtree of paper 000 (Sect. 4) over the store's clauses.

    ``PTQuadtree.build(subs, tau_num=32, tau_area=4**-20, max_depth=24, max_copies=2.5)``.
    Build O(k H + pivots); a message costs Eq. 3 + Eq. 4 plus the pending buffer.

    >>> from shard.model import Message, Point, Rect, Subscription
    >>> ix = PTQuadtree.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
    >>> ix.match_batch([Message("m", ("sale", "x", "ipad"), Point(0.5, 0.5))])
    [['s']]
    """

    name = "ptquadtree"
    options_doc: ClassVar[dict[str, str]] = {**QUADTREE_OPTIONS_DOC, **P000Index.options_doc}
    small_options: ClassVar[dict[str, object]] = {"tau_num": 4, "max_depth": 8, "pending_min": 8}

    def __init__(
        self,
        tau_num: int = DEFAULT_TAU_NUM,
        tau_area: float = DEFAULT_TAU_AREA,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_copies: float = DEFAULT_MAX_COPIES,
        **options,
    ) -> None:
        self.qt_options = quadtree_options(tau_num, tau_area, max_depth, max_copies)
        super().__init__(**options)
        self.counts = np.zeros(2, np.int64)
        """Over every message matched so far: candidate leaves, clauses verified."""
        self._index(np.zeros((0, 1), np.int32), np.zeros(0, np.int32))

    def _index(self, mat: np.ndarray, lens: np.ndarray) -> None:
        self.qt, (self.qdepth, self.qparent) = make_quadtree(self, mat, lens, *self.qt_options)
        self.n_empty = int(np.count_nonzero(lens == 0))  # the first positions (token-set order)

    def match_encoded(self, batch):
        out_m, out_s, counts = self._run(_match, batch, self.qt, self.n_empty)
        self.counts += counts
        return out_m, out_s

    def stats(self) -> dict[str, int]:
        return {**super().stats(), **quadtree_stats(self.qt, self.qdepth)}

    def _check_structure(self) -> None:
        check_quadtree(self, self.qt, self.qdepth, self.qparent, self.n_empty)


def quadtree_stats(qt, depth) -> dict[str, int]:
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = qt
    return {
        "quad_nodes": int(child.shape[0]),
        "quad_leaves": int(np.count_nonzero(child < 0)),
        "quad_height": int(depth.max(initial=0)),
        "leaf_entries": int(lists.shape[0]),
        "pivot_tokens": int(cs_terms.shape[0] + ns_terms.shape[0]),
    }


def check_quadtree(index: P000Index, qt, depth, parent, n_empty: int) -> None:
    """Sect. 4.1's invariants: quadrants tile their parent, each leaf lists (ascending) exactly
    the clauses whose box meets it, every clause with tokens is on a leaf, and each clause on a
    leaf is represented along its path (Lemma 1: from the root, a token of it in the NSet of every
    node down to the leaf, or in the CSet of one of them)."""
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = qt
    st = index.store
    k = index.pos_row.shape[0]
    lens = st.cl_len[index.pos_row]
    dead = ~index.alive
    assert np.all(lens[:n_empty][~dead[:n_empty]] == 0) and np.all(
        (lens[n_empty:] > 0) | dead[n_empty:]
    )
    boxes = st.bbox[index.pos_slot]
    seen = np.zeros(k, bool)
    sets = [
        (
            set(cs_terms[cs_off[v] : cs_off[v + 1]].tolist()),
            set(ns_terms[ns_off[v] : ns_off[v + 1]].tolist()),
        )
        for v in range(child.shape[0])
    ]
    for v in range(child.shape[0]):
        r = reg[v]
        if child[v] >= 0:
            mx, my = 0.5 * (r[0] + r[2]), 0.5 * (r[1] + r[3])
            kids = reg[child[v] : child[v] + 4]
            assert np.allclose(kids[0], (r[0], r[1], mx, my)) and np.allclose(
                kids[3], (mx, my, r[2], r[3])
            )
            assert np.all(parent[child[v] : child[v] + 4] == v)
            assert list_off[v + 1] == list_off[v], "an internal node with a list"
            continue
        ids = lists[list_off[v] : list_off[v + 1]]
        assert np.all(np.diff(ids) > 0), f"leaf {v}'s list not ascending"
        b = boxes[ids]
        meets = ~((r[2] < b[:, 0]) | (r[0] > b[:, 2]) | (r[3] < b[:, 1]) | (r[1] > b[:, 3]))
        assert np.all(meets | dead[ids]), f"leaf {v} lists a clause its region misses"
        seen[ids] = True
        for p in ids[~dead[ids]]:
            c = index.pos_row[p]
            toks = set(st.terms[st.cl_off[c] : st.cl_off[c] + st.cl_len[c]].tolist())
            path = [v]
            while parent[path[-1]] >= 0:
                path.append(parent[path[-1]])
            for u in reversed(path):  # Lemma 1: the filter, from the root, reaches the leaf
                cs, ns = sets[u]
                if toks & cs:
                    break
                assert toks & ns, f"clause at position {p} not represented at node {u}"
    live = np.flatnonzero(index.alive & (lens > 0))
    assert np.all(seen[live]), "a clause with tokens is on no leaf"
