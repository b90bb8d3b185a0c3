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
UB_t of Eq. 5 is the paper's, at O(log |F| + rows of a) per attribute; a node's forest is
rewritten as a whole when it changes (O(|F| log |F|)) instead of updated in O(log n).

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

* **insert**: Guttman's ChooseLeaf (least enlargement of the MBR, then least widening of the
  α range, then least area, then first child); the point joins the leaf; an overflowing node
  (``fanout + 1`` entries) is split in half along x, y or α, whichever cut leaves the least
  normalised area plus α-range width (a root split grows a new root); then every node from the changed one up is re-summarised (MBR,
  α range, forest, Γ), stopping at the first node whose summary did not change (its ancestors
  depend on nothing else);
* **delete**: the slot leaves its leaf; a node left empty is unlinked from its parent (upwards);
  the path is re-summarised as for insert (summaries shrink back exactly); a root left with one
  child is replaced by it. Underfull nodes are kept (no condense-and-reinsert): they only cost
  pruning power, never correctness, and ``build`` repacks.

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
  ChooseLeaf break ties by the α range (an R-tree over the points still: MBRs, MinDist and
  Eq. 6 are unchanged; only which points share a node differs).
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
        lo = a
        hi = b
        while lo < hi:  # first row with f_key >= key
            mid = (lo + hi) >> 1
            if f_key[mid] < key:
                lo = mid + 1
            else:
                hi = mid
        best = 0.0
        j = lo
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
            if self.dead[which] <= max(4096, live):
                continue
            n = self.n_nodes
            ln = length[:n]
            idx = np.repeat(start[:n] - np.cumsum(ln) + ln, ln) + np.arange(ln.sum())
            pool = self.pool[which]
            for f in _G_FIELDS:
                pool[f] = pool[f][idx].copy()
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
    def _choose_leaf(self, px: float, py: float, alpha: float) -> int:
        u = self.root
        while self.level[u] > 0:
            ch = self.child[u, : self.count[u]]
            b = self.box[ch]
            area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
            grown = (np.maximum(b[:, 2], px) - np.minimum(b[:, 0], px)) * (
                np.maximum(b[:, 3], py) - np.minimum(b[:, 1], py)
            )
            a_grown = np.maximum(self.amax[ch], alpha) - np.minimum(self.amin[ch], alpha)
            a_grown -= self.amax[ch] - self.amin[ch]
            # least enlargement, then least widening of the α range, then least area
            best = np.lexsort((area, a_grown, grown - area))[0]
            u = int(ch[best])
        return u

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

    def insert(self, slot: int) -> None:
        """ChooseLeaf, add, split upwards on overflow, re-summarise the path.
        O(height x fanout + forest rewrites on the path)."""
        self.s_leaf = _grow(self.s_leaf, len(self.cols.ids), -1)
        c = self.cols
        u = self._choose_leaf(float(c.x[slot]), float(c.y[slot]), float(c.alpha[slot]))
        self._add_child(u, slot)
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
        """Remove ``slot`` from its leaf, unlink emptied nodes, re-summarise the path, collapse
        a root of one child. O(height x fanout + forest rewrites on the path)."""
        u = int(self.s_leaf[slot])
        self.s_leaf[slot] = -1
        self._remove_child(u, slot)
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
