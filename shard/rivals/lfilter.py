"""LFilter: the cost-based hybrid of MBRTrie and PT-Quadtree (paper 000, Sect. 5).

Paper: M. Yu, G. Li, J. Feng, "A Cost-based Method for Location-Aware Publish/Subscribe
Services", CIKM 2015, Sect. 5 (``../shared/papers/000_…``); the two indexes are
``shard.rivals.mbrtrie`` (Sect. 3) and ``shard.rivals.ptquadtree`` (Sect. 4), built here over one
numbering of the clauses (positions in token-set order, ``shard.rivals.p000_common``), so that
the quadtree's leaf lists hold the ids whose ranges the trie nodes carry.

Per message (Alg. 3, LFILTER):

1. Sect. 5.1 / 5.3: estimate the filter costs. ``Cost_T^F`` by Eq. 1 from the trie's level sizes
   ``L_i`` (``F_{i-1} = L_i / L_{i-1}``), the message's token count ``N`` and the number ``D`` of
   distinct tokens; ``Cost_Q^F`` by Eq. 3 from the quadtree's height ``H_q``, the mean size
   ``Avg_RT`` of the nodes' pivotal sets and ``cand_Q``: 1 for a point message, else
   ``Σ |leaves(n_i)| · ||n_i ∩ m.R|| / |n_i|`` over the quadtree nodes ``n_i`` of level
   ``est_level`` (Sect. 5.3).
2. Case 1, ``Cost_Q^F > Cost_T^F``: the MBRTrie algorithm (Alg. 1, CostBasedProbe).
3. Case 2: PT-QUADTREE-FILTER gives the candidate leaves, whose lists are ``Φ_I``; HYBRIDPRUNE
   walks the trie from the root with ``Φ_I`` (Fig. 6). At node ``n`` (matched token ``t_j``,
   ``T_n`` the message's tokens after it):
   * its terminal clauses (the paper's leaf) that are on a list of ``Φ_I`` need the region test
     only (Sect. 5.2: they meet the textual constraint by the path, and ``Σ |I_l| ≤ |I|``);
   * Eq. 5 / Eq. 6: ``C_L = C_F + Σ (log|I| + |I|)`` against ``C_V = Σ |I| · S_avg · log|T_n|``;
     if ``C_L > C_V`` every clause of ``Φ_I`` below ``n`` is verified directly (both
     constraints, PT-QUADTREE-VERIFY); otherwise SELECTPAIR gives the children ``<c, T_c>``
     and LISTPRUNING cuts each list to ``c``'s id range ``[c_l, c_u]`` by binary search (a child
     left with no list is pruned), and HYBRIDPRUNE recurses.
4. The clauses without tokens (trie root's terminal list; not in the quadtree) and the pending
   inserts are checked as in the two indexes.

``counts`` (a ``stats()`` entry too): messages of case 1, of case 2, trie nodes where list
pruning was chosen, nodes where direct verification was chosen.

Insert and delete: those of the two indexes (the shared pending buffer and tombstones, then a
bulk rebuild of both), see ``p000_common``.

Where the paper is ambiguous:

* ``C_F`` (Sect. 5.3) is written with the level sizes ``L_{i+1}``, ``L_{i+2}``; as it estimates
  the cost of finding *n's* descendants, they are taken as n's children and grandchildren counts.
* ``D`` is the number of distinct tokens of the indexed clauses; ``(N/D)`` is capped at 1; all
  logs are base 2, floored at 1 (``p000_common.lg``).
* ``k`` of the ``cand_Q`` estimate is not given: ``DEFAULT_EST_LEVEL`` (leaves shallower than it
  count as themselves; a node of zero area counts whole when it meets the message).
* Eq. 3's ``Avg_RT`` is the mean number of pivotal tokens (CSet + NSet) over the quadtree nodes.
* A clause on several candidate lists is examined once per message (a per-position stamp).
* At a trie node with no children, or when ``T_n`` is empty, nothing below can match and the
  choice of Eq. 5/6 is not made.
* On real place names the model picks Case 1 (the trie) for every point message, short or long,
  though the quadtree case is faster on long ones. We checked the code against Sect. 5.1/5.3 term
  by term (the logs, the levels, ``(N/D)^{i-1}``, ``H_q``, ``cand_Q``), and it is the paper's model
  as written. The mismatch is in the formulas themselves. Measured on pl200k (first 100,000
  subscriptions, 5,000 point messages; H_q 8, Avg_RT 311, D 101,783, L_1 76,803), forcing each
  case: Cost_T^F / Cost_Q^F medians were 89 / 331 on short messages (6-20 terms) and
  11,911 / 22,612 on long ones (100-1,000). Both orders were the trie first. The trie took 4.4
  µs a message and the quadtree + HYBRIDPRUNE 5.8 on short ones, so the model was right there.
  On long ones the trie took 165 µs and the quadtree 78, and the model was wrong on all 400 of a
  sample; LFilter ran at 155. The reasons:
  * Eq. 1's level-1 term, ``N log F_0`` (each token binary-searching the root's children), is
    what the trie really does.
  * Eq. 3 prices each node's test as a whole intersection (Sect. 4.2's
    ``min(log N |set|, log|set| N)``). The test stops at the first shared token, though, and a
    CSet hit ends the token tests below it. On long messages the root's CSet hits at once: about
    2 probe steps a message against Eq. 3's 20,700. Eq. 3 also grows with N, while this real
    cost falls as N grows.
  * The choice leaves out verification, since Sect. 5.1 takes the trie's as the cheaper one.
    Here the trie region-tests about 700 text-matching clauses (scattered reads) per long
    message.
  Taking Avg_RT over the leaves' sets only (mean 150) would move the switch to about N = 480
  (10,900 vs 12,000 at N = 547), but that is a reading of the text chosen to fit this data, and
  the nodes a point message tests have larger sets (the root's holds 38,772). The model is kept
  as the paper has it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numba import njit

from shard.rivals.mbrtrie import check_trie, make_trie, probe_children, trie_match, trie_scratch
from shard.rivals.p000_common import (
    P000Index,
    boxes_meet,
    distinct_ranks,
    lg,
    lower_bound,
    outside,
    positive_int,
    report_spatial,
    room2,
    scan_pending,
    start_message,
)
from shard.rivals.ptquadtree import (
    DEFAULT_MAX_COPIES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_TAU_AREA,
    DEFAULT_TAU_NUM,
    QUADTREE_OPTIONS_DOC,
    check_quadtree,
    make_quadtree,
    pt_filter,
    quadtree_options,
    quadtree_stats,
    report_tokenless,
    verify_list,
)

DEFAULT_EST_LEVEL = 3
"""Sect. 5.3's ``k``: the quadtree level whose nodes estimate ``cand_Q`` (at most 64 nodes)."""

COUNT_NAMES = ("trie_messages", "quadtree_messages", "list_pruned_nodes", "direct_verified_nodes")


# ---- cost model (Sect. 5.3) -------------------------------------------------------------------
@njit(cache=True)
def cost_trie(L, n, d):
    """Eq. 1: ``Σ_i min(log N · L_i, N · log F_{i-1} · L_{i-1}) · (N/D)^{i-1}``."""
    ratio = min(1.0, n / max(d, 1.0))
    total = 0.0
    w = 1.0
    for i in range(1, L.shape[0]):
        f = L[i] / L[i - 1]
        total += min(lg(n) * L[i], n * lg(f) * L[i - 1]) * w
        w *= ratio
    return total


@njit(cache=True)
def estimate_cand_q(qt, frontier, leaves_under, is_point, box):
    """Sect. 5.3: 1 for a point message, else the level-k nodes' leaves weighted by the share of
    their area the message covers."""
    if is_point:
        return 1.0
    reg = qt[0]
    x0, y0, x1, y1 = box
    est = 0.0
    for i in range(frontier.shape[0]):
        r = reg[frontier[i]]
        if not boxes_meet(r, x0, y0, x1, y1):
            continue
        area = (r[2] - r[0]) * (r[3] - r[1])
        ov = (min(r[2], x1) - max(r[0], x0)) * (min(r[3], y1) - max(r[1], y0))
        est += leaves_under[frontier[i]] * (ov / area if area > 0.0 else 1.0)
    return max(est, 1.0)


@njit(cache=True)
def cost_quadtree(h_q, avg_rt, cand_q, n):
    """Eq. 3: ``H_q · cand_Q · min(log N · Avg_RT, log Avg_RT · N)``."""
    return h_q * cand_q * min(lg(n) * avg_rt, lg(avg_rt) * n)


# ---- HYBRIDPRUNE (Sect. 5.2, Fig. 6) ------------------------------------------------------------
@njit(cache=True)
def hybrid_prune(
    trie, fan, T, qt, pairs, npairs, numbering, cols, TM, SM, CM, cstamp, msg, out, work
):
    """HYBRIDPRUNE from the root with the lists ``pairs[:npairs]`` (ranges of the quadtree's
    ``lists``). ``fan``: (children, grandchildren per node, D, S_avg). Depth first with an explicit
    stack of frames (node, token index, pair range); the pairs of live frames stay a stack in
    ``pairs``. ``work``: (frames, SELECTPAIR's pair nodes, pair indexes, ``COUNT_NAMES``
    counters). Returns (out, pairs)."""
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = trie
    lists, list_box = qt[3], qt[4]
    nchild, ngrand, d, s_avg = fan
    rank, pos_row, pos_slot, alive = numbering
    frames, pc, pj, counts = work
    x0, y0, x1, y1 = msg[3]
    n_tok = T.shape[0]
    frames[0, 0] = 0
    frames[0, 1] = 0
    frames[0, 2] = 0
    frames[0, 3] = npairs
    sp = 1
    while sp > 0:
        sp -= 1
        n, j, s0, s1 = frames[sp, 0], frames[sp, 1], frames[sp, 2], frames[sp, 3]
        top = s1
        t_lo, t_hi = lo[n], lo[n] + nend[n]
        if nend[n] > 0:  # the paper's leaf: listed clauses need the region test only
            for z in range(s0, s1):
                x = lower_bound(lists, pairs[z, 0], pairs[z, 1], t_lo)
                while x < pairs[z, 1] and lists[x] < t_hi:
                    p = lists[x]
                    x += 1
                    if outside(list_box, x - 1, x0, y0, x1, y1):
                        continue
                    if CM[p] != cstamp:
                        CM[p] = cstamp
                        out = report_spatial(p, pos_slot, alive, cols, SM, msg, out)
        nt = n_tok - j
        if nchild[n] == 0 or nt == 0:
            continue
        size = 0.0
        c_l = 0.0
        for z in range(s0, s1):
            m = pairs[z, 1] - pairs[z, 0]
            size += m
            c_l += lg(m) + m
        # Sect. 5.3: C_F over n's children and grandchildren, Eq. 5 and Eq. 6
        nc, ng = float(nchild[n]), float(ngrand[n])
        c_f = min(nc * lg(nt) + ng * nt / d * lg(nt), lg(nc) * nt + lg(ng) * nt / d * nt)
        c_l += c_f
        c_v = size * s_avg * lg(nt)
        if c_l > c_v:  # Fig. 6 lines 4-6: PT-QUADTREE-VERIFY of the lists below n
            counts[3] += 1
            for z in range(s0, s1):
                x = lower_bound(lists, pairs[z, 0], pairs[z, 1], t_hi)
                out, nv = verify_list(
                    qt, x, pairs[z, 1], numbering, cols, TM, SM, CM, cstamp, msg, out
                )
            continue
        counts[2] += 1  # lines 9-13: SELECTPAIR, then LISTPRUNING to each child's range
        k = probe_children(trie, n, T, j, 2, x0, y0, x1, y1, pc, pj)
        for i in range(k):
            c = pc[i]
            start = top
            pairs = room2(pairs, top, s1 - s0)
            for z in range(s0, s1):
                a = lower_bound(lists, pairs[z, 0], pairs[z, 1], lo[c])
                b = lower_bound(lists, a, pairs[z, 1], hi[c])
                if a < b:
                    pairs[top, 0] = a
                    pairs[top, 1] = b
                    top += 1
            if top > start:
                frames[sp, 0] = c
                frames[sp, 1] = pj[i]
                frames[sp, 2] = start
                frames[sp, 3] = top
                sp += 1
    return out, pairs


@njit(cache=True)
def _match(lf, numbering, cols, TM, SM, stamp, cstamp, CM, pending, batch):
    """Alg. 3 over a batch (``lf``: the ``LFilter._kernel_args``). Extra result: the four
    ``COUNT_NAMES`` counters."""
    trie, scratch, fan, L, qt, qstats, n_empty = lf
    list_off = qt[2]
    h_q, avg_rt, frontier, leaves_under = qstats
    d = fan[2]
    rank = numbering[0]
    m_terms = batch[1]
    out = (np.empty(64, np.int32), np.empty(64, np.int32), 0)
    tsc = (scratch[0], scratch[1], scratch[2], scratch[3])  # trie_match's
    counts = np.zeros(4, np.int64)
    work = (scratch[4], scratch[2], scratch[3], counts)  # hybrid_prune's
    pairs = np.empty((64, 2), np.int64)
    stack = np.empty((64, 2), np.int32)
    cand = np.empty(64, np.int32)
    for q in range(batch[2].shape[0]):
        stamp, a, b, msg = start_message(batch, q, TM, stamp)
        cstamp += 1
        is_point, box = msg[2], msg[3]
        T = distinct_ranks(m_terms, a, b, rank)
        n = float(T.shape[0])
        cand_q = estimate_cand_q(qt, frontier, leaves_under, is_point, box)
        if cost_quadtree(h_q, avg_rt, cand_q, n) > cost_trie(L, n, d):  # Case 1
            counts[0] += 1
            out, v = trie_match(trie, T, 2, numbering, cols, SM, msg, out, tsc)
        else:  # Case 2
            counts[1] += 1
            out = report_tokenless(n_empty, numbering, cols, SM, msg, out)
            nc, stack, cand = pt_filter(qt, box, m_terms, a, b, TM, stamp, stack, cand)
            pairs = room2(pairs, 0, nc)
            for i in range(nc):
                pairs[i, 0] = list_off[cand[i]]
                pairs[i, 1] = list_off[cand[i] + 1]
            if nc > 0 and T.shape[0] > 0:
                out, pairs = hybrid_prune(
                    trie, fan, T, qt, pairs, nc, numbering, cols, TM, SM, CM, cstamp, msg, out, work
                )
        out = scan_pending(pending, m_terms[a:b], cols, TM, SM, msg, out)
    out_m, out_s, nout = out
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp, cstamp, counts


# ---- statistics for the cost model --------------------------------------------------------------
def trie_fan(trie, lens: np.ndarray, parent: np.ndarray):
    """(children per node, grandchildren per node, D, S_avg) for Sect. 5.3."""
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = trie
    nchild = np.diff(child_off).astype(np.int64)
    ngrand = np.zeros_like(nchild)
    np.add.at(ngrand, parent[1:], nchild[1:])
    d = float(max(1, np.unique(tok[1:]).shape[0]))
    s_avg = float(lens.mean()) if lens.shape[0] else 1.0
    return nchild, ngrand, d, s_avg


def level_sizes(depth: np.ndarray) -> np.ndarray:
    """``L_i``: trie nodes per level (the root's level 0)."""
    return np.bincount(depth, minlength=1).astype(np.float64)


def quadtree_cost_stats(qt, qdepth: np.ndarray, est_level: int):
    """(H_q, Avg_RT, level-k frontier nodes, leaves under each node) for Eq. 3 and ``cand_Q``."""
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = qt
    n = child.shape[0]
    h_q = float(qdepth.max(initial=0) + 1)
    avg_rt = float((cs_terms.shape[0] + ns_terms.shape[0]) / max(n, 1))
    leaves = _leaves_under(child)
    frontier = np.flatnonzero((qdepth == est_level) | ((qdepth < est_level) & (child < 0)))
    return h_q, avg_rt, frontier.astype(np.int32), leaves


def _leaves_under(child: np.ndarray) -> np.ndarray:
    """Leaves below each quadtree node (breadth-first numbering: children after parents)."""
    n = child.shape[0]
    leaves = (child < 0).astype(np.float64)
    for v in range(n - 1, -1, -1):
        if child[v] >= 0:
            leaves[v] = leaves[child[v] : child[v] + 4].sum()
    return leaves


class LFilter(P000Index):
    """LFilter of paper 000 (Sect. 5): both indexes, and per message the cost model's choice.

    ``LFilter.build(subs, tau_num=32, tau_area=4**-20, max_depth=24, max_copies=2.5,
    est_level=3)``. Build: an MBRTrie and a PT-Quadtree over the same positions.

    >>> from shard.model import Message, Point, Rect, Subscription
    >>> ix = LFilter.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
    >>> ix.match_batch([Message("m", ("sale", "x", "ipad"), Point(0.5, 0.5))])
    [['s']]
    """

    name = "lfilter"
    options_doc: ClassVar[dict[str, str]] = {
        **QUADTREE_OPTIONS_DOC,
        "est_level": f"quadtree level estimating cand_Q (Sect. 5.3; default {DEFAULT_EST_LEVEL})",
        **P000Index.options_doc,
    }
    small_options: ClassVar[dict[str, object]] = {"tau_num": 4, "max_depth": 8, "pending_min": 8}

    def __init__(
        self,
        tau_num: int = DEFAULT_TAU_NUM,
        tau_area: float = DEFAULT_TAU_AREA,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_copies: float = DEFAULT_MAX_COPIES,
        est_level: int = DEFAULT_EST_LEVEL,
        **options,
    ) -> None:
        self.qt_options = quadtree_options(tau_num, tau_area, max_depth, max_copies)
        self.est_level = positive_int("est_level", est_level, 0)
        super().__init__(**options)
        self.counts = np.zeros(len(COUNT_NAMES), np.int64)
        """Over every message matched so far: ``COUNT_NAMES``."""
        self._index(np.zeros((0, 1), np.int32), np.zeros(0, np.int32))

    def _index(self, mat: np.ndarray, lens: np.ndarray) -> None:
        self.trie, (self.depth, self.parent) = make_trie(mat, lens, self.pos_slot, self.store.bbox)
        sc = trie_scratch(self.trie)
        self.scratch = (*sc, np.empty((sc[0].shape[0], 4), np.int64))  # + HYBRIDPRUNE's frames
        self.fan = trie_fan(self.trie, lens, self.parent)
        self.L = level_sizes(self.depth)
        self.qt, (self.qdepth, self.qparent) = make_quadtree(self, mat, lens, *self.qt_options)
        h_q, avg_rt, frontier, leaves = quadtree_cost_stats(self.qt, self.qdepth, self.est_level)
        self.qstats = (h_q, avg_rt, frontier, leaves)
        self.n_empty = int(np.count_nonzero(lens == 0))

    def match_encoded(self, batch):
        out_m, out_s, counts = self._run(_match, batch, self._kernel_args())
        self.counts += counts
        return out_m, out_s

    def _kernel_args(self):
        """What ``_match`` takes of the structure: (trie, scratch, fan, L, qt, qstats,
        n_empty)."""
        return (self.trie, self.scratch, self.fan, self.L, self.qt, self.qstats, self.n_empty)

    def stats(self) -> dict[str, int]:
        return {
            **super().stats(),
            "nodes": int(self.trie[0].shape[0]),
            **quadtree_stats(self.qt, self.qdepth),
            **{k: int(v) for k, v in zip(COUNT_NAMES, self.counts, strict=True)},
        }

    def _check_structure(self) -> None:
        check_trie(self.trie, self.depth, self.parent, self.pos_slot, self.store.bbox, self.alive)
        check_quadtree(self, self.qt, self.qdepth, self.qparent, self.n_empty)
        assert self.n_empty == self.trie[3][0], "the clauses without tokens end at the root"
