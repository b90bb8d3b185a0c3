"""MBRTrie: a trie over the clauses' tokens in a global order, each node carrying the MBR of the
subscriptions below it (paper 000, Sect. 3).

Paper: M. Yu, G. Li, J. Feng, "A Cost-based Method for Location-Aware Publish/Subscribe
Services", CIKM 2015, Sect. 3 (``../shared/papers/000_…``). Shared numbering and change buffers:
``shard.rivals.p000_common``.

Structure (Sect. 3.1), as columns over nodes numbered in pre-order:

* each clause's distinct tokens, as ranks in the idf order, spell a root-to-node path; node
  ``n`` carries its token ``tok[n]`` (the root -1), its depth, its children (CSR ``child_off`` /
  ``child_ids``, sorted by token, with ``child_tok`` beside them for the binary searches), the
  id range ``[lo[n], hi[n])`` of the clauses below it (positions in token-set order, so the range
  is contiguous) and the MBR ``mbr[n]`` of their regions' boxes;
* the paper's leaf (empty token ε) holding the clauses whose token set is exactly the path is
  not a node here: those clauses are the first ``nend[n]`` of ``n``'s range (a prefix sorts
  before its extensions), ``[lo[n], lo[n] + nend[n])``.

Filter and verification (Sect. 3.2, Alg. 1): a candidate pair ``<n, T_n>`` (``T_n`` the
message's tokens after the one ``n`` matched, an index ``j`` into the message's rank-sorted
token array) whose MBR meets the message; its terminal clauses meet the textual constraint
already, so verification is the region test only (MBRTrie-VERIFY). Children become pairs by one
of the three probes of Sect. 3.3, chosen by the ``probe`` option:

* ``"tokenset"`` (ProbeTokenSet): each child binary-searches ``T_n``;
* ``"trie"`` (ProbeTrie): each token of ``T_n`` binary-searches the children;
* ``"cost"`` (CostBasedProbe, SELECTPAIR, the default): per node, tokens probe the children if
  ``|T_n| log|n| < |n| log|T_n|``, else the children probe the tokens.

Bulk build (Sect. 3.1): ranks, token-set order (``np.lexsort``) and the trie in one compiled pass
over the sorted clauses (longest common prefix with the previous clause), MBRs enlarged along
each path. Insert and delete: the shared pending buffer and tombstones (``p000_common``): a
tombstoned clause stays inside its nodes' MBRs and ranges until the next bulk rebuild.

Where the paper is ambiguous:

* The printed SELECTPAIR tests ``c_mbr ∩ m.R = φ``; the prose says ``≠ φ`` (kept: ``≠``).
* The logs of SELECTPAIR's comparison are base 2 and floored at 1 (a node of one child,
  ``log 1 = 0``, would otherwise always be probed by the tokens).
* ProbeTokenSet searches ``T_n`` (the tokens after the parent's), not all of ``T``: a child's
  token ranks after its parent's, so it can only be there (the same nodes, fewer comparisons).
* Node MBRs are of the regions' boxes (a circle's conservative box); the exact circle test is
  part of the verification.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numba import njit

from shard.errors import ValidationError
from shard.rivals.p000_common import (
    P000Index,
    boxes_meet,
    distinct_ranks,
    lg,
    lower_bound,
    report_spatial,
    scan_pending,
    start_message,
)

PROBES = ("tokenset", "trie", "cost")
"""The token-filter strategies of Sect. 3.3 (codes 0, 1, 2 in the kernels)."""


# ---- build ------------------------------------------------------------------------------------
@njit(cache=True)
def build_trie(mat, lens, pos_slot, bbox):
    """Sect. 3.1: the trie of the clauses ``mat`` / ``lens`` (ranked tokens, rows in token-set
    order). Returns (tok, depth, lo, hi, nend, mbr, parent), nodes in pre-order. O(k L)."""
    k = mat.shape[0]
    cap = 1 + int(lens.sum())
    tok = np.full(cap, -1, np.int32)
    depth = np.zeros(cap, np.int32)
    lo = np.zeros(cap, np.int32)
    hi = np.zeros(cap, np.int32)
    nend = np.zeros(cap, np.int32)
    parent = np.full(cap, -1, np.int32)
    mbr = np.empty((cap, 4), np.float64)
    mbr[:, 0] = np.inf
    mbr[:, 1] = np.inf
    mbr[:, 2] = -np.inf
    mbr[:, 3] = -np.inf
    path = np.zeros(mat.shape[1] + 1, np.int32)
    n_nodes = 1
    prev = 0
    for i in range(k):
        ln = lens[i]
        lcp = 0
        if i > 0:
            while lcp < ln and lcp < prev and mat[i, lcp] == mat[i - 1, lcp]:
                lcp += 1
        for d in range(lcp + 1, prev + 1):  # the previous clause's deeper nodes end here
            hi[path[d]] = i
        for d in range(lcp + 1, ln + 1):  # new nodes for the rest of this clause's tokens
            n = n_nodes
            n_nodes += 1
            tok[n] = mat[i, d - 1]
            depth[n] = d
            parent[n] = path[d - 1]
            lo[n] = i
            path[d] = n
        nend[path[ln]] += 1
        s = pos_slot[i]
        for d in range(ln + 1):  # enlarge the MBRs on the path
            n = path[d]
            mbr[n, 0] = min(mbr[n, 0], bbox[s, 0])
            mbr[n, 1] = min(mbr[n, 1], bbox[s, 1])
            mbr[n, 2] = max(mbr[n, 2], bbox[s, 2])
            mbr[n, 3] = max(mbr[n, 3], bbox[s, 3])
        prev = ln
    for d in range(prev + 1):
        hi[path[d]] = k
    hi[0] = k
    return (
        tok[:n_nodes].copy(),
        depth[:n_nodes].copy(),
        lo[:n_nodes].copy(),
        hi[:n_nodes].copy(),
        nend[:n_nodes].copy(),
        mbr[:n_nodes].copy(),
        parent[:n_nodes].copy(),
    )


@njit(cache=True)
def build_children(tok, parent):
    """Children CSR (pre-order makes each node's children ascending by token): (child_off,
    child_ids, child_tok)."""
    n = tok.shape[0]
    off = np.zeros(n + 1, np.int64)
    for c in range(1, n):
        off[parent[c] + 1] += 1
    for i in range(n):
        off[i + 1] += off[i]
    fill = off[:-1].copy()
    ids = np.empty(max(n - 1, 0), np.int32)
    for c in range(1, n):
        p = parent[c]
        ids[fill[p]] = c
        fill[p] += 1
    ctok = np.empty(ids.shape[0], np.int32)
    for i in range(ids.shape[0]):
        ctok[i] = tok[ids[i]]
    return off, ids, ctok


def make_trie(mat, lens, pos_slot, bbox):
    """The trie as the tuple the kernels take: (tok, lo, hi, nend, mbr, child_off, child_ids,
    child_tok), plus (depth, parent) for statistics and checks."""
    tok, depth, lo, hi, nend, mbr, parent = build_trie(mat, lens, pos_slot, bbox)
    off, ids, ctok = build_children(tok, parent)
    return (tok, lo, hi, nend, mbr, off, ids, ctok), (depth, parent)


# ---- probing ----------------------------------------------------------------------------------
@njit(cache=True)
def probe_children(trie, n, T, j, probe, x0, y0, x1, y1, out_c, out_j):
    """Sect. 3.3: the candidate pairs ``<c, T_c>`` among node ``n``'s children for ``T_n =
    T[j:]`` (children whose token is in ``T_n`` and whose MBR meets the message), written to
    ``out_c`` / ``out_j`` (``T_c = T[out_j:]``). ``probe``: 0 ProbeTokenSet, 1 ProbeTrie, 2
    SELECTPAIR's cost-based choice. Returns the number of pairs."""
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = trie
    a, b = child_off[n], child_off[n + 1]
    nt = T.shape[0] - j
    nc = b - a
    if nt <= 0 or nc <= 0:
        return 0
    by_tokens = probe == 1
    if probe == 2:  # SELECTPAIR line 2: |T_n| log|n| < |n| log|T_n|
        by_tokens = nt * lg(nc) < nc * lg(nt)
    k = 0
    if by_tokens:  # each token of T_n binary-searches the children
        lo_c = a
        for i in range(j, T.shape[0]):
            lo_c = lower_bound(child_tok, lo_c, b, T[i])
            if lo_c == b:
                break
            if child_tok[lo_c] == T[i]:
                c = child_ids[lo_c]
                if boxes_meet(mbr[c], x0, y0, x1, y1):
                    out_c[k] = c
                    out_j[k] = i + 1
                    k += 1
    else:  # each child binary-searches T_n
        for i in range(a, b):
            c = child_ids[i]
            if not boxes_meet(mbr[c], x0, y0, x1, y1):
                continue
            x = lower_bound(T, j, T.shape[0], child_tok[i])
            if x < T.shape[0] and T[x] == child_tok[i]:
                out_c[k] = c
                out_j[k] = x + 1
                k += 1
    return k


@njit(cache=True)
def trie_match(trie, T, probe, numbering, cols, SM, msg, out, scratch):
    """Alg. 1 for one message (``msg``, ranks ``T``): MBRTrie-FILTER from the root (depth first,
    an explicit stack of candidate pairs) and MBRTrie-VERIFY of each candidate's terminal
    clauses. ``scratch``: (stack nodes, stack token indexes, pair nodes, pair indexes). Returns
    (out, nodes visited)."""
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = trie
    rank, pos_row, pos_slot, alive = numbering
    st_n, st_j, pc, pj = scratch
    x0, y0, x1, y1 = msg[3]
    if tok.shape[0] == 0 or not boxes_meet(mbr[0], x0, y0, x1, y1):  # Alg. 1 line 6
        return out, 0
    sp = 1
    st_n[0] = 0
    st_j[0] = 0
    visited = 0
    while sp > 0:
        sp -= 1
        n, j = st_n[sp], st_j[sp]
        visited += 1
        for p in range(lo[n], lo[n] + nend[n]):  # MBRTrie-VERIFY: the region test only
            out = report_spatial(p, pos_slot, alive, cols, SM, msg, out)
        k = probe_children(trie, n, T, j, probe, x0, y0, x1, y1, pc, pj)
        for i in range(k):  # (a node is pushed at most once: the stack fits the node count)
            st_n[sp] = pc[i]
            st_j[sp] = pj[i]
            sp += 1
    return out, visited


@njit(cache=True)
def trie_scratch(trie):
    """Stack and pair buffers for ``trie_match`` (the pairs of one node fit its fanout), made
    with the trie: a batch of one message should not pay O(nodes) for them."""
    child_off = trie[5]
    n_nodes = child_off.shape[0] - 1
    fan = 1
    for n in range(n_nodes):
        fan = max(fan, child_off[n + 1] - child_off[n])
    return (
        np.empty(n_nodes + 1, np.int32),
        np.empty(n_nodes + 1, np.int32),
        np.empty(fan, np.int32),
        np.empty(fan, np.int32),
    )


@njit(cache=True)
def _match(trie, probe, scratch, numbering, cols, TM, SM, stamp, cstamp, CM, pending, batch):
    """Alg. 1 over a batch: per message its ranks, the trie, then the pending clauses."""
    rank = numbering[0]
    m_terms = batch[1]
    out = (np.empty(64, np.int32), np.empty(64, np.int32), 0)
    visited = np.zeros(1, np.int64)
    for q in range(batch[2].shape[0]):
        stamp, a, b, msg = start_message(batch, q, TM, stamp)
        T = distinct_ranks(m_terms, a, b, rank)
        out, v = trie_match(trie, T, probe, numbering, cols, SM, msg, out, scratch)
        visited[0] += v
        out = scan_pending(pending, m_terms[a:b], cols, TM, SM, msg, out)
    out_m, out_s, nout = out
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp, cstamp, visited


class MBRTrie(P000Index):
    """The MBRTrie of paper 000 (Sect. 3) over the store's clauses.

    ``MBRTrie.build(subs, probe="cost")``; ``probe`` is one of ``"tokenset"``, ``"trie"``,
    ``"cost"`` (Sect. 3.3). Build O(k L log k); a message costs Eq. 1 + Eq. 2 plus the pending
    buffer.

    >>> from shard.model import Message, Point, Rect, Subscription
    >>> ix = MBRTrie.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
    >>> ix.match_batch([Message("m", ("sale", "x", "ipad"), Point(0.5, 0.5))])
    [['s']]
    """

    name = "mbrtrie"
    options_doc: ClassVar[dict[str, str]] = {
        "probe": "token filter of Sect. 3.3: tokenset (ProbeTokenSet), trie (ProbeTrie) or "
        "cost (CostBasedProbe, default)",
        **P000Index.options_doc,
    }
    small_options: ClassVar[dict[str, object]] = {"probe": "tokenset", "pending_min": 8}

    def __init__(self, probe: str = "cost", **options) -> None:
        if probe not in PROBES:
            raise ValidationError("probe", probe, f"must be one of {', '.join(PROBES)}")
        self.probe = probe
        super().__init__(**options)
        self.visited = 0
        """Trie nodes visited (candidate pairs) over every message matched so far."""
        self._index(np.zeros((0, 1), np.int32), np.zeros(0, np.int32))

    def _index(self, mat: np.ndarray, lens: np.ndarray) -> None:
        self.trie, (self.depth, self.parent) = make_trie(mat, lens, self.pos_slot, self.store.bbox)
        self.scratch = trie_scratch(self.trie)

    def match_encoded(self, batch):
        out_m, out_s, visited = self._run(
            _match, batch, self.trie, PROBES.index(self.probe), self.scratch
        )
        self.visited += int(visited[0])
        return out_m, out_s

    def stats(self) -> dict[str, int]:
        return {
            **super().stats(),
            "nodes": int(self.trie[0].shape[0]),
            "height": int(self.depth.max(initial=0)),
        }

    def _check_structure(self) -> None:
        check_trie(self.trie, self.depth, self.parent, self.pos_slot, self.store.bbox, self.alive)


def check_trie(trie, depth, parent, pos_slot, bbox, alive) -> None:
    """Sect. 3.1's invariants: ranges nest and partition, children ascend by token and hold the
    token after their parent's, every live clause's box lies inside each MBR on its path."""
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = trie
    n = tok.shape[0]
    k = pos_slot.shape[0]
    assert n >= 1 and lo[0] == 0 and hi[0] == k
    for v in range(n):
        kids = child_ids[child_off[v] : child_off[v + 1]]
        assert np.all(np.diff(tok[kids]) > 0), f"children of {v} not ascending"
        assert np.all(tok[kids] > tok[v]), f"child token not after node {v}'s"
        assert np.all(parent[kids] == v) and np.all(depth[kids] == depth[v] + 1)
        start = lo[v] + nend[v]
        for c in kids:  # the children's ranges tile the rest of the node's range, in order
            assert lo[c] == start, f"range gap under {v}"
            start = hi[c]
        assert start == hi[v], f"range of {v}"
        assert v == 0 or hi[v] > lo[v], f"empty node {v}"
        live = np.arange(lo[v], hi[v])[alive[lo[v] : hi[v]]]
        b = bbox[pos_slot[live]]
        m = mbr[v]
        assert np.all(
            (m[0] <= b[:, 0]) & (m[1] <= b[:, 1]) & (m[2] >= b[:, 2]) & (m[3] >= b[:, 3])
        ), f"MBR of node {v} misses a live clause"
