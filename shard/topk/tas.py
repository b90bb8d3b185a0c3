"""TAS, the Threshold-Algorithm-based Solution of paper 001 (Sect. 4), the baseline of the
R^I-tree.

Two-level index (Sect. 4): per attribute key a **scored segment tree** (Machanavajjhala et al.)
over the subscriptions' Table 2 intervals on that key, each node's list sorted by the weight
premultiplied by (1 − α); and for the location an **R-tree** whose nodes carry α_max (the
R^I-tree's ``SpatialTree`` without forests).

Matching an event (Sect. 4, steps 1-4), one compiled kernel per batch:

1. per event attribute, a sorted-access stream over its segment tree: the nodes on the path from
   the leaf that holds the value to the root each have a list sorted by grade; the stream
   returns the largest head among them (the paper's max-heap of size O(log n); a path has at
   most ~40 nodes, so we scan the heads);
2. the spatial stream: incremental best-first over the R-tree with key
   α_max · (1 − MinDist / MaxDist) for nodes and α · ψ_s for subscriptions;
3. Fagin's TA, round-robin: one sorted access on each stream; a subscription seen for the first
   time is scored exactly ("random access", ``kernels.score_slot``); the threshold is the sum
   over the streams of the best grade not yet returned (0 for an exhausted stream); stop once
   the k-th best score is above the threshold (+ slack) or every stream is exhausted;
4. the top k (and the k-th's ties, ordered by id in Python).

Exactness: ψ(e, s) ≤ Σ_streams grade(s) because a stream's grade of s is (1 − α)ω whenever the
predicate can hold (the interval over-approximates ``!=``, ``not in``, ``in``, strict
comparisons) and α·ψ_s in the spatial stream; every subscription is in the spatial stream, so an
unseen one is bounded by the threshold.

Changes: ``subscribe`` / ``unsubscribe`` update the R-tree at once (its insert/delete) and mark
the predicates' keys dirty; a dirty key's segment tree is rebuilt (O(n_key log n_key)) before the
next query. Trees live in append-only pools; all keys are rebuilt once the dead rows outweigh
the live ones.

Where the paper is ambiguous
----------------------------
* The scored segment tree's dynamic maintenance is not described: a key's tree is rebuilt
  lazily when its subscriptions changed (above).
* Segment-tree leaves are the elementary intervals of the distinct finite endpoints (points and
  the open gaps between them), so closed intervals with ±inf ends are decomposed exactly.
* TA's round-robin order and its threshold: one access per stream per round; the threshold uses
  the best *remaining* grade of each stream (a valid, slightly tighter bound than the last seen).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.sorted_arrays import lower_bound
from shard.topk.base import TopKIndex
from shard.topk.kernels import (
    BOUND_SLACK,
    batch_scratch,
    emit,
    grown_i,
    offer,
    pq_pop,
    pq_push,
    pq_reserve,
    reserve,
    score_slot,
    spatial_bound,
    threshold,
)
from shard.topk.ritree import DEFAULT_ALPHA_SLABS, DEFAULT_FANOUT, SpatialTree

_MAX_PATH = 64
"""Nodes on a segment tree's root-to-leaf path at most (2^63 leaves)."""


@njit(cache=True)
def leaf_of(coords, c0, m, v):
    """The elementary interval holding ``v``: 2j + 1 for the point coords[j], 2j for the gap
    below it (2m: above the last). O(log m)."""
    i = lower_bound(coords, c0, c0 + m, v)
    j = i - c0
    if j < m and coords[i] == v:
        return 2 * j + 1
    return 2 * j


@njit(cache=True)
def segtree_build(lo, hi, grade, slot):
    """A scored segment tree (Sect. 4) over closed intervals [lo, hi] (±inf allowed).
    Returns (coords, P, node list starts [2P + 1], item slots, item grades): node i (heap
    order, leaves P..P + 2m) lists its canonical intervals by grade descending, slot ascending.
    O(n log n)."""
    n = lo.shape[0]
    ends = np.empty(2 * n)
    ne = 0
    for i in range(n):
        if np.isfinite(lo[i]):
            ends[ne] = lo[i]
            ne += 1
        if np.isfinite(hi[i]):
            ends[ne] = hi[i]
            ne += 1
    coords = np.unique(ends[:ne])
    m = coords.shape[0]
    n_leaves = 2 * m + 1
    P = 1
    while n_leaves > P:  # P: leaves of the complete tree
        P *= 2
    it_node = np.empty(16, np.int64)
    it_idx = np.empty(16, np.int64)
    nit = 0
    for i in range(n):
        left = leaf_of(coords, 0, m, lo[i]) if np.isfinite(lo[i]) else 0
        right = leaf_of(coords, 0, m, hi[i]) if np.isfinite(hi[i]) else n_leaves - 1
        a = left + P
        b = right + P + 1
        while a < b:  # canonical decomposition
            if a & 1:
                if nit == it_node.shape[0]:
                    it_node = grown_i(it_node, nit)
                    it_idx = grown_i(it_idx, nit)
                it_node[nit] = a
                it_idx[nit] = i
                nit += 1
                a += 1
            if b & 1:
                b -= 1
                if nit == it_node.shape[0]:
                    it_node = grown_i(it_node, nit)
                    it_idx = grown_i(it_idx, nit)
                it_node[nit] = b
                it_idx[nit] = i
                nit += 1
            a >>= 1
            b >>= 1
    node = it_node[:nit]
    idx = it_idx[:nit]
    # order by node, then grade descending, then slot
    order = np.argsort(slot[idx], kind="mergesort")
    order = order[np.argsort(-grade[idx][order], kind="mergesort")]
    order = order[np.argsort(node[order], kind="mergesort")]
    starts = np.zeros(2 * P + 1, np.int64)
    for t in range(nit):
        starts[node[t] + 1] += 1
    for t in range(2 * P):
        starts[t + 1] += starts[t]
    return coords, P, starts, slot[idx[order]], grade[idx[order]]


@njit(cache=True)
def _stream_head(path_n, ptr, h, nstart, it_grade, base):
    """Index on the path of the node whose current head has the largest grade (−1: none)."""
    best = -1
    bg = -1.0
    for j in range(h):
        p = ptr[j]
        if p < nstart[base + path_n[j] + 1] and it_grade[p] > bg:
            bg = it_grade[p]
            best = j
    return best


@njit(cache=True)
def tas_kernel(
    segs, tree, n_slots, n_keys, e_off, e_key, e_val, e_x, e_y, k, max_dist, slack, cols
):
    """TA over the event's attribute streams and the spatial stream (module docstring), every
    event of a batch. Returns (offsets, slots, scores, subscriptions scored): per event the top k and the
    k-th's ties.
    O(sorted accesses x (path length + predicates))."""
    kP, kc_start, kc_len, kn_start, coords, nstart, it_slot, it_grade = segs
    root, level, count, child, box, amin, amax = tree
    alpha = cols[2]
    sx = cols[0]
    sy = cols[1]
    ne = e_x.shape[0]
    ev_stamp, ev_val, top, out_off, out_slot, out_score, buf_slot, buf_score = batch_scratch(
        n_keys, k, ne
    )
    n_scored = 0
    nout = 0
    seen = np.zeros(max(n_slots, 1), np.int64)
    pq_key = np.empty(64)
    pq_val = np.empty(64, np.int64)
    n_attr_max = 1
    for q in range(ne):
        n_attr_max = max(n_attr_max, e_off[q + 1] - e_off[q])
    path_n = np.zeros((n_attr_max, _MAX_PATH), np.int64)
    ptr = np.zeros((n_attr_max, _MAX_PATH), np.int64)
    plen = np.zeros(n_attr_max, np.int64)
    pbase = np.zeros(n_attr_max, np.int64)
    for q in range(ne):
        stamp = q + 1
        e0 = e_off[q]
        e1 = e_off[q + 1]
        ex = e_x[q]
        ey = e_y[q]
        for i in range(e0, e1):
            ev_stamp[e_key[i]] = stamp
            ev_val[e_key[i]] = e_val[i]
        # step 1: a stream per event attribute with a segment tree
        na = 0
        for i in range(e0, e1):
            key = e_key[i]
            P = kP[key]
            if P == 0:
                continue
            leaf = leaf_of(coords, kc_start[key], kc_len[key], e_val[i])
            u = P + leaf
            h = 0
            while u >= 1:
                path_n[na, h] = u
                ptr[na, h] = nstart[kn_start[key] + u]
                h += 1
                u >>= 1
            plen[na] = h
            pbase[na] = kn_start[key]
            na += 1
        # step 2: the spatial stream
        npq = 0
        if count[root] > 0:
            npq = pq_push(pq_key, pq_val, npq, 1.0, root)
        ntop = 0
        nbuf = 0
        while True:  # step 3: TA rounds
            buf_slot, buf_score, nbuf = reserve(
                buf_slot, buf_score, nbuf, na + 1, threshold(top, ntop, k)
            )
            bound = 0.0
            progressed = False
            for a in range(na):
                j = _stream_head(path_n[a], ptr[a], plen[a], nstart, it_grade, pbase[a])
                if j < 0:
                    continue
                p = ptr[a, j]
                ptr[a, j] = p + 1
                progressed = True
                s = it_slot[p]
                if seen[s] != stamp:  # random access: the exact score
                    seen[s] = stamp
                    v = score_slot(s, ev_stamp, ev_val, stamp, ex, ey, max_dist, cols)
                    n_scored += 1
                    ntop = offer(top, ntop, k, v)
                    if v >= threshold(top, ntop, k):
                        buf_slot[nbuf] = s
                        buf_score[nbuf] = v
                        nbuf += 1
                j = _stream_head(path_n[a], ptr[a], plen[a], nstart, it_grade, pbase[a])
                if j >= 0:
                    bound += it_grade[ptr[a, j]]
            while npq > 0:  # the spatial stream's next subscription
                key_s, val, npq = pq_pop(pq_key, pq_val, npq)
                if val < 0:
                    s = -val - 1
                    progressed = True
                    if seen[s] != stamp:
                        seen[s] = stamp
                        v = score_slot(s, ev_stamp, ev_val, stamp, ex, ey, max_dist, cols)
                        n_scored += 1
                        ntop = offer(top, ntop, k, v)
                        if v >= threshold(top, ntop, k):
                            buf_slot[nbuf] = s
                            buf_score[nbuf] = v
                            nbuf += 1
                    break
                u = val
                pq_key, pq_val = pq_reserve(pq_key, pq_val, npq, count[u])
                for i in range(count[u]):
                    c = child[u, i]
                    if level[u] == 0:
                        g = alpha[c] * spatial_bound(ex, ey, sx[c], sy[c], sx[c], sy[c], max_dist)
                        npq = pq_push(pq_key, pq_val, npq, g, -c - 1)
                    else:
                        g = amax[c] * spatial_bound(
                            ex, ey, box[c, 0], box[c, 1], box[c, 2], box[c, 3], max_dist
                        )
                        npq = pq_push(pq_key, pq_val, npq, g, c)
            if npq > 0:
                bound += pq_key[0]
            if not progressed:
                break
            if ntop >= k and bound < threshold(top, ntop, k) - slack:
                break
        out_slot, out_score, nout = emit(
            out_slot, out_score, nout, buf_slot, buf_score, nbuf, threshold(top, ntop, k)
        )
        out_off[q + 1] = nout
    return out_off, out_slot[:nout], out_score[:nout], n_scored


class TAS(TopKIndex):
    """The threshold-algorithm baseline (module docstring); exact top-k.

    >>> from shard.topk.model import subscription_from_dict, event_from_dict
    >>> subs = [subscription_from_dict({"id": f"s{i}", "predicates": [{"attr": "a", "op": "=",
    ...     "value": i}], "alpha": 0.5, "point": [i, 0]}) for i in range(5)]
    >>> TAS.build(subs, max_dist=4.0).topk(event_from_dict({"id": "e", "attributes": {"a": 3},
    ...     "point": [3, 0]}), 2)
    [('s3', 1.0), ('s2', 0.375)]
    """

    name = "tas"

    def __init__(
        self, *, fanout: int = DEFAULT_FANOUT, alpha_slabs: int = DEFAULT_ALPHA_SLABS, **options
    ) -> None:
        super().__init__(**options)
        self.tree = SpatialTree(self.columns, fanout, with_forest=False, alpha_slabs=alpha_slabs)
        self._dirty: set[int] = set()
        self._reset_pools()

    def _reset_pools(self) -> None:
        self.kP = np.zeros(0, np.int64)
        self.kc_start = np.zeros(0, np.int64)
        self.kc_len = np.zeros(0, np.int64)
        self.kn_start = np.zeros(0, np.int64)
        self.coords = np.zeros(0)
        self.nstart = np.zeros(0, np.int64)
        self.it_slot = np.zeros(0, np.int64)
        self.it_grade = np.zeros(0)
        self._live_items = 0
        self._dead_items = 0
        self._item_len: dict[int, int] = {}

    def _bulk(self, slots: np.ndarray) -> None:
        self.tree.bulk(slots)
        self._dirty = set(range(len(self.columns.keys)))
        self._refresh()

    def _on_add(self, slot: int) -> None:
        self.tree.insert(slot)
        c = self.columns
        a = int(c.pstart[slot])
        self._dirty.update(c.p_key[a : a + c.plen[slot]].tolist())

    def _on_remove(self, slot: int) -> None:
        self.tree.delete(slot)
        c = self.columns
        a = int(c.pstart[slot])
        self._dirty.update(c.p_key[a : a + c.plen[slot]].tolist())

    def _refresh(self) -> None:
        """Rebuild the segment trees of the dirty keys (all of them once the pools are mostly
        dead rows). O(live predicates + rebuilt trees)."""
        if not self._dirty:
            return
        c = self.columns
        if self._dead_items > max(4096, self._live_items):
            self._reset_pools()
            self._dirty = set(range(len(c.keys)))
        n_keys = len(c.keys)
        for name in ("kP", "kc_start", "kc_len", "kn_start"):
            arr = getattr(self, name)
            if arr.shape[0] < n_keys:
                new = np.zeros(n_keys, np.int64)
                new[: arr.shape[0]] = arr
                setattr(self, name, new)
        live = np.flatnonzero(c.live[: len(c.ids)])
        owner, rows = c.rows_of(live)
        keys = c.p_key[rows]
        dirty = np.fromiter(self._dirty, np.int64, len(self._dirty))
        pick = np.isin(keys, dirty)
        owner, rows, keys = owner[pick], rows[pick], keys[pick]
        order = np.argsort(keys, kind="stable")
        owner, rows, keys = owner[order], rows[order], keys[order]
        slot = live[owner]
        grade = c.p_w[rows] * (1.0 - c.alpha[slot])  # Sect. 4: weights premultiplied by (1 − α)
        bounds = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True]) if len(keys) else []
        parts_c, parts_n, parts_s, parts_g = [], [], [], []
        n_c, n_n, n_i = len(self.coords), len(self.nstart), len(self.it_slot)
        for key in self._dirty:
            old = self._item_len.pop(key, 0)
            self._dead_items += old
            self._live_items -= old
            self.kP[key] = 0
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            key = int(keys[a])
            coords, P, starts, it_s, it_g = segtree_build(
                c.p_lo[rows[a:b]], c.p_hi[rows[a:b]], grade[a:b], slot[a:b]
            )
            self.kP[key] = P
            self.kc_start[key], self.kc_len[key] = n_c, len(coords)
            self.kn_start[key] = n_n
            parts_c.append(coords)
            parts_n.append(starts + n_i)
            parts_s.append(it_s)
            parts_g.append(it_g)
            n_c += len(coords)
            n_n += len(starts)
            n_i += len(it_s)
            self._item_len[key] = len(it_s)
            self._live_items += len(it_s)
        if parts_c:
            self.coords = np.concatenate([self.coords, *parts_c])
            self.nstart = np.concatenate([self.nstart, *parts_n])
            self.it_slot = np.concatenate([self.it_slot, *parts_s])
            self.it_grade = np.concatenate([self.it_grade, *parts_g])
        self._dirty.clear()

    def _kernel(self, enc, k: int):
        self._refresh()
        e_off, e_key, e_val, e_x, e_y = enc
        t = self.tree
        return tas_kernel(
            (
                self.kP,
                self.kc_start,
                self.kc_len,
                self.kn_start,
                self.coords,
                self.nstart,
                self.it_slot,
                self.it_grade,
            ),
            (t.root, t.level, t.count, t.child, t.box, t.amin, t.amax),
            len(self.columns.ids),
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
