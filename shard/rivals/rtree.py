"""The R^t-tree family of papers 003 (Li et al., KDD 2013, "Location-aware publish/subscribe") and
004 (Yu, Li, Wang, Feng, Gong, IEEE TKDE 2015, "Efficient filtering algorithms for location-aware
publish/subscribe", the journal version with insert / delete): ``rt``, ``rt+`` and ``rt++``.

All three are R-trees over the subscriptions' DNF clauses (004 Sect. 2.1: a disjunctive
subscription is decomposed into conjunctive ones; each clause is a data entry, indexed by its
subscription's region box) whose non-root nodes carry a token summary:

* ``RtTree`` (004 Sect. 3): the summary of a node is its TokenSet, the union of the tokens of the
  clauses below, kept as a hash table token -> number of clauses below holding it (Sect. 3.1,
  Updates). Filtering (Sect. 3.2, Fig. 3): pre-order traversal; an entry is pruned when its MBR
  misses the message (MBR filter) or no message token is in its TokenSet (token filter, one hash
  probe per message token, stopping at the first hit); the clauses of the candidate leaves are
  verified (every term by the message's stamps, then the region, exact for circles).
* ``RtPlusTree`` (004 Sect. 4): one representative token per clause; a node's summary is the set
  (counted) of the representative tokens below (Sect. 4.1, Lemma 1); same filter-and-verify.
  The representative token is chosen by ``strategy`` (Sect. 4.2): ``"df"`` (the greedy: the
  token of the largest df among the clauses left, recounted after each pick), ``"idf"`` (the
  clause's rarest token), ``"locality"`` (the rarest token in the clause's grid cell, of
  ``grid`` x ``grid`` cells; default, the best in Sect. 7.1), ``"random"``.
* ``RtPlusPlusTree`` (004 Sect. 5): multiple representative tokens: the clause's tokens in the
  strategy's order (Sect. 5.1 "Discussion on token assignment": large idf in the upper levels;
  the experiments use the locality-aware order), token i assigned to its level-i ancestor, the
  tokens from level H on to its leaf; each node keeps an inverted list ``I_n[t]`` per token.
  Filtering (Sect. 5.2, Fig. 6, R^t++-TREE-PRUNE) counts each clause's occurrences ``M[s]`` on
  the visited path: ``M[s] = |s|`` and the region meets the message: an answer, without
  verification (Lemma 4); a node's children are visited only when some ``M[s] = i < |s|``
  (Lemma 5).

Updates (004 Sect. 3.1, 4.1, 4.2, 5.1 "Updates"): an insert goes down the R-tree as in the
standard R-tree (Guttman's ChooseLeaf, least area enlargement) and adds the clause's tokens to
its ancestors' summaries (O(H |s|); R^t+ O(H); R^t++ O(H + |s|)); an overflowing node is split
(Guttman's quadratic split) and the summaries of the clauses that moved go with them. A delete
decrements the counts (a token at 0 leaves the table) or unlinks the postings, then removes the
leaf entry. New clauses take their representative token / order from the token frequencies
maintained in a hash table (global df, and per grid cell for the locality-aware strategy); the
representative tokens of earlier clauses are not changed (Sect. 4.2 Updates). A ``subscribe`` /
``unsubscribe`` does its steps (tokens chosen, frequencies counted, the R-tree insert with the
summaries; or the delete, the frequencies, the pool garbage) in one compiled call
(``rtree_kernels.subscribe_rows`` / ``unsubscribe_rows``), not four, so that its cost is the
paper's O(H |s|) and not a dozen Python-to-kernel round trips; a batch of more than ``_CHUNK``
clauses goes the chunked way. The update kernels are compiled (or loaded from numba's cache) at
the first build of the process (``_warm_update_kernels``, on a throwaway tree of a few clauses),
not inside the first ``subscribe`` / ``unsubscribe`` after it (seconds with a cold cache: that
was most of R^t's measured subscribe and unsubscribe costs). Arrays sized to the tree (the pool,
the clause rows, the nodes, the hash) grow by doubling (the hash past 60 % use, tombstones
included), so a growth is O(size) once per doubling, amortised O(1) per update; a bulk build
leaves an eighth more room in the pool and the clause-row arrays (``_with_room``; these follow
the rows in use, not the store's capacity), so that the first update after a build does not
copy them whole (the R^t++ element array is 32 bytes a pool position: ~0.1 s at 300,000
subscriptions, charged to the first ``subscribe``).

Bulk build (``bulk="str"``, the default): the paper builds by insertion and gives no bulk load;
here the tree is packed bottom-up with Sort-Tile-Recursive (Leutenegger et al. 1997): leaves
of ``B`` clauses, the levels above with an even fanout within ``b``..``B`` (so the root, whose
entries are the R^t++ level 1, has as many entries as the height allows, not the 2 a full
packing can leave), then every summary is filled in one pass (the same summaries as insertion
gives). ``bulk="insert"`` builds by repeated insertion, the paper's way (a little slower: 200K
subscriptions in ~1-3 s here, 1M in ~15 s; a tree of different shape). Either way the store is
then laid out in leaf order (``SubscriptionStore.relayout``, as the AP-Tree does), and the
R^t++ lists are laid out list by list (``rtree_kernels.link_sorted``), so a leaf's clauses and a
list's postings are each one run in memory. ``subscribe_many`` inserts a batch of new ids in one
kernel call.

Where the paper is ambiguous:

* Insertion / split cost: 004 says only "insert the subscription into the leaf node as in the
  standard R-tree" (Sect. 3.1) and gives no spatial-textual cost, so ChooseLeaf is Guttman's
  least area enlargement (ties to the smallest area) and the split is Guttman's quadratic split
  with min fill ``b``. Areas are taken on boxes widened by ``SIZE_EPS`` (1e-6 degrees) a side so
  that point regions still compare by their spread.
* Deletion: "remove the subscription from the corresponding leaf node similar to the standard
  R-tree operation". The counts are decremented eagerly (footnote 2 allows lazy updates; eager
  keeps the summaries exact, which ``check_invariants`` asserts). Guttman's CondenseTree is
  followed for leaves: a leaf left with fewer than ``b`` clauses leaves the tree and its clauses
  are reinserted; a node left empty is removed (up the path); an underfull *internal* node is
  kept (Guttman would reinsert its subtrees at their level): the tree stays balanced and exact,
  only less tightly packed after many deletes. The root is not shortened when it keeps one child.
* The MBR filter: the paper's test "whether n.R has a vertex contained in m.R" misses crossing
  boxes and boxes containing the message; the per-axis interval test is used (the notes' fix).
* The root: 004's levels start at the root's entries (level 1), so the root carries no summary;
  a tree of a single leaf (height 0) verifies its at most B clauses directly (R^t++ too).
* R^t++ and the height: a token's level counts from the root, so when the root splits (the tree
  grows a level) every assignment moves; all inverted lists are rebuilt then (O(terms), once per
  height change). A split below the root moves the postings of the clauses under the new node.
* R^t++ exactness: the counting scheme needs each clause's tokens distinct (the store's are)
  and each assigned to exactly one node on its path (the property of Sect. 5.1); then
  ``M[s] = |s|`` iff every token is in the message, so no verification is needed in any case
  (conjunctions of any length, clauses longer than H included). A clause without tokens (the
  oracle gives it every message in its region; validation never produces one) is kept outside
  the tree on a list every message checks by region, in all three trees.
* Token order ties and the locality grid: ``"idf"`` picks the smallest df (ties: smaller term
  id), ``"df"`` the largest, ``"locality"`` the smallest df in the clause's cell (cell of the
  centre of its box in a ``grid`` x ``grid`` grid over the bounding box of the clause centres at
  build time; later clauses clamp into it), ties by global df, then term id (the paper applies df
  or idf after the per-cell sort; the experiments use idf, as here). For R^t++, ``"df"`` orders
  the tokens by decreasing df, ``"idf"``/``"locality"`` by increasing (local) df. ``"random"``
  is a seeded hash of (clause row, term): deterministic. At build, the frequencies include the
  clause itself; on insert the clause is counted after its choice (Sect. 4.2 Updates).
* The token filter probes the node's hash once per message token (the paper's hash-based
  method, O(|m.T|) per entry); R^t++ takes ``n.T ∩ m.T`` the same way. One table keyed by
  (node, token) stands for the paper's table per node.
* DNF: each clause is an entry with its own representative token(s), so R^t+ (which 004 calls
  "not effective for disjunctive queries") stays exact; a subscription is reported once however
  many clauses match (``report``).
* STR leaves are filled to ``B``; a slab's last node may hold fewer than ``b`` entries (the
  paper's b..B bound holds for split nodes, not for every packed one).

>>> from shard.model import Message, Point, Rect, Subscription
>>> ix = RtPlusPlusTree.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
>>> ix.match_batch([Message("m", ("sale", "ipad", "x"), Point(0.5, 0.5))])
[['s']]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from shard.aptree.tree import EncodedMessages
from shard.errors import ValidationError
from shard.model import Rect, Subscription
from shard.rivals import rtree_kernels as K
from shard.rivals.base import RivalIndex

DEFAULT_MAX_ENTRIES = 50
"""B, the most entries of a node: the paper's experiments (004 Sect. 7: b = 25, B = 50)."""
DEFAULT_STRATEGY = "locality"
"""The representative-token strategy: locality-aware, the best in 004 Sect. 7.1 and the one its
Sect. 7.2 uses for R^t+ and R^t++."""
DEFAULT_GRID = 100
"""Cells a side of the locality-aware grid: 100 x 100 = the 10,000 grids of 004 Sect. 7.1."""
DEFAULT_BULK = "str"
"""How ``rebuild`` builds: STR packing (fast), or ``"insert"`` (repeated insertion)."""
STRATEGIES = {"df": K.DF, "idf": K.IDF, "locality": K.LOCALITY, "random": K.RANDOM}
_CHUNK = 4096
"""Clause rows inserted per kernel call (node capacity is reserved for a chunk's splits)."""


class RtTree(RivalIndex):
    """R^t-tree (004 Sect. 3): an R-tree whose nodes carry the TokenSet of the clauses below.

    Options: ``max_entries`` (B), ``min_entries`` (b, the split's min fill), ``bulk``. Build
    O(terms H) after STR; insert / delete O(H |s|) plus splits; match: Fig. 3.
    """

    name = "rt"
    options_doc: ClassVar[dict[str, str]] = {
        "max_entries": f"B, the most entries of a node (default {DEFAULT_MAX_ENTRIES}, 004 Sect. 7)",
        "min_entries": "b, the fewest entries a split leaves in a node (default B // 2)",
        "bulk": "'str' (default: Sort-Tile-Recursive packing) or 'insert' (repeated insertion)",
    }
    small_options: ClassVar[dict[str, Any]] = {"max_entries": 4, "min_entries": 2}
    _variant: ClassVar[int] = K.COUNTS
    _n_keep: ClassVar[int] = -1

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        min_entries: int | None = None,
        bulk: str = DEFAULT_BULK,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 3:
            raise ValidationError("max_entries", max_entries, "must be an integer >= 3")
        if min_entries is None:
            min_entries = max_entries // 2
        if not isinstance(min_entries, int) or not 1 <= min_entries <= (max_entries + 1) // 2:
            raise ValidationError(
                "min_entries", min_entries, "must be in 1 .. (max_entries + 1) // 2"
            )
        if bulk not in ("str", "insert"):
            raise ValidationError("bulk", bulk, "must be 'str' or 'insert'")
        self.max_entries = max_entries
        self.min_entries = min_entries
        self.bulk = bulk
        self._strategy = K.IDF
        self._grid_cells = 1
        self._seed = 0
        self._reset(0)

    # ---- state ----------------------------------------------------------------------------------
    def _reset(self, n_rows: int) -> None:
        """An empty tree (one empty leaf as the root) with room for ``n_rows`` clauses."""
        cap = max(16, 2 * n_rows // max(self.min_entries, 1) + 16)
        self.ni = np.zeros((cap, 3), np.int32)
        self.nch = np.zeros((cap, self.max_entries + 1), np.int32)
        self.nbox = np.zeros((cap, 4), np.float64)
        self.nfree = np.zeros(cap, np.int32)
        self.tr = np.array([0, 1, 0, self.max_entries, self.min_entries, self._variant], np.int64)
        self.ni[0] = (-1, 0, 0)
        self.nbox[0] = (np.inf, np.inf, -np.inf, -np.inf)
        self.ht = K.new_table(1024)
        self.hm = np.zeros(2, np.int64)
        rows_cap = _with_room(self.store.n_clause_rows)
        self.cleaf = np.full(rows_cap, -1, np.int32)
        self.moff = np.zeros(rows_cap, np.int64)
        self.mlen = np.zeros(rows_cap, np.int32)
        self.mtok = np.zeros(1024, np.int32)
        self.lk = np.full((1024 if self._variant == K.POSTINGS else 1, 4), -1, np.int64)
        self._pool_n = 0
        self._pool_garbage = 0
        self._empty: set[int] = set()
        self._empty_rows = np.zeros(0, np.int32)
        self.df = np.zeros(max(len(self.store.vocab_terms), 16), np.int64)
        self.cell_ht = K.new_table(16)
        self.cell_hm = np.zeros(2, np.int64)
        self.grid = np.array([-180.0, -90.0, 180.0, 90.0])
        self.Mst = np.zeros(rows_cap, np.int64)
        self.Mct = np.zeros(rows_cap, np.int32)
        self._mstamp = 0

    def _fit_rows(self) -> None:
        need = self.store.n_clause_rows  # the rows in use, not the store's capacity
        have = [a.shape[0] for a in (self.cleaf, self.moff, self.mlen, self.Mst, self.Mct)]
        if need > min(have):
            n = max(need, 2 * min(have), max(have))
            self.cleaf = _grown(self.cleaf, n, -1)
            self.moff = _grown(self.moff, n, 0)
            self.mlen = _grown(self.mlen, n, 0)
            self.Mst = _grown(self.Mst, n, 0)
            self.Mct = _grown(self.Mct, n, 0)
        v = len(self.store.vocab_terms)
        if v > self.df.shape[0]:
            self.df = _grown(self.df, max(v, 2 * self.df.shape[0]), 0)

    def _fit_pool(self, extra: int) -> None:
        need = self._pool_n + extra
        if need > self.mtok.shape[0]:
            n = max(need, 2 * self.mtok.shape[0])
            self.mtok = _grown(self.mtok, n, 0)
            if self._variant == K.POSTINGS:
                self.lk = _grown(self.lk, n, -1)

    def _fit_nodes(self, extra: int) -> None:
        need = int(self.tr[K.NHW]) + extra
        if need > self.ni.shape[0]:
            n = max(need, 2 * self.ni.shape[0])
            self.ni = _grown(self.ni, n, 0)
            self.nch = _grown(self.nch, n, 0)
            self.nbox = _grown(self.nbox, n, 0.0)
            self.nfree = _grown(self.nfree, n, 0)

    @property
    def height(self) -> int:
        """Levels below the root (0: the root is a leaf)."""
        return int(self.ni[self.tr[K.ROOT], K.HGT])

    # ---- summary tokens ---------------------------------------------------------------------------
    def _count(self, rows: np.ndarray, sign: int) -> None:
        st = self.store
        self.cell_ht = K.count_stats(
            rows, sign, st.cl_sub, st.cl_off, st.cl_len, st.terms, st.bbox, self.df,
            self._strategy == K.LOCALITY, self.cell_ht, self.cell_hm, self.grid, self._grid_cells,
        )  # fmt: skip

    def _assign_tokens(self, rows: np.ndarray, bulk: bool) -> None:
        """Each row's summary tokens into the pool: all its terms (R^t), its representative token
        (R^t+, Sect. 4.2), or its terms in level order (R^t++, Sect. 5.1)."""
        st = self.store
        total = int(st.cl_len[rows].sum())
        self._fit_pool(_with_room(total) if bulk else total)
        if bulk and self._n_keep == 1 and self._strategy == K.DF:
            self._pool_n = K.greedy_df(
                rows, st.cl_off, st.cl_len, st.terms, self.df.shape[0], self.moff, self.mlen,
                self.mtok, self._pool_n,
            )  # fmt: skip
        else:
            self._pool_n = K.order_tokens(
                rows, self._strategy, self._n_keep, st.cl_sub, st.cl_off, st.cl_len, st.terms,
                st.bbox, self.df, self.cell_ht, self.grid, self._grid_cells, self._seed,
                self.moff, self.mlen, self.mtok, self._pool_n,
            )  # fmt: skip
        if self._variant == K.POSTINGS:  # new positions: the element of the same number
            lens = self.mlen[rows].astype(np.int64)
            pos = np.repeat(self.moff[rows], lens) + _ragged_arange(lens)
            self.lk[pos, K.ELEM] = pos
            self.lk[pos, K.ECL] = np.repeat(rows, lens)

    def _set_grid(self, rows: np.ndarray) -> None:
        if rows.shape[0] == 0:
            return
        bb = self.store.bbox[self.store.cl_sub[rows]]
        cx = 0.5 * (bb[:, 0] + bb[:, 2])
        cy = 0.5 * (bb[:, 1] + bb[:, 3])
        self.grid = np.array([cx.min(), cy.min(), cx.max(), cy.max()])

    # ---- RivalIndex -------------------------------------------------------------------------------
    def _build(self) -> None:
        _warm_update_kernels()
        st = self.store
        live = st.live_clauses()
        self._reset(live.shape[0])
        self._fit_rows()
        has = st.cl_len[live] > 0
        self._set_empty(set(live[~has].tolist()))
        rows = live[has]
        self._set_grid(rows)
        self._count(rows, 1)
        self._assign_tokens(rows, bulk=True)
        if self.bulk == "insert":
            self._insert_rows(rows)
            self._relayout_store()
            if self._variant == K.POSTINGS:  # the same lists, each laid out in one run
                self._summarize(self.ht.shape[0])
            return
        self._str_load(rows)
        self._relayout_store()
        self._summarize(2 * int(self.mlen[rows].sum()) + 16)

    def _summarize(self, size: int) -> None:
        """Every summary anew into a fresh table of ``size`` slots (it grows as needed): R^t++
        lists laid out list by list (``link_sorted``), counts clause by clause."""
        self.ht = K.new_table(size)
        self.hm[:] = 0
        kernel = K.link_sorted if self._variant == K.POSTINGS else K.summarize_all
        self.ht = kernel(
            self.ht, self.hm, self.tr, self.ni, self.nch, self.cleaf, self.moff, self.mlen,
            self.mtok, self.lk,
        )  # fmt: skip

    def _str_load(self, rows: np.ndarray) -> None:
        """Sort-Tile-Recursive packing level by level up to one root: leaves of B clauses, the
        levels above of ``_fanout`` entries (within b..B, as even as the height allows, so the
        root's entries, the R^t++ level 1, are as many as they can be)."""
        st = self.store
        k = rows.shape[0]
        if k == 0:
            return
        self._fit_nodes(2 * (k // self.min_entries + 1) + 8)
        self.tr[K.NHW] = 0
        items = rows.astype(np.int32)
        boxes = st.bbox[st.cl_sub[rows]]
        height = 0
        while True:
            cap = self.max_entries if height == 0 else self._fanout(items.shape[0])
            order = _str_order(boxes, cap)
            ids, boxes = K.fill_level(
                order, items, boxes, cap, height, self.ni, self.nch, self.nbox, self.tr,
                height == 0, self.cleaf,
            )  # fmt: skip
            if ids.shape[0] == 1:
                self.tr[K.ROOT] = ids[0]
                return
            items = ids
            height += 1

    def _fanout(self, n: int) -> int:
        """Entries a node for packing ``n`` nodes under a root: the fewest levels B allows, the
        smallest even fanout that fills them, kept within b..B."""
        b, cap = self.min_entries, self.max_entries
        levels = 1
        while cap**levels < n:
            levels += 1
        f = 2
        while f**levels < n:
            f += 1
        return min(cap, max(b, f))

    def _relayout_store(self) -> None:
        """Lay the store's rows out in leaf order (``SubscriptionStore.relayout``, as the AP-Tree
        does after a build), so a leaf's clauses lie next to each other; the clause rows held
        here are renumbered with it."""
        st = self.store
        live_slots = np.array(sorted(st.slot_of.values()), np.int64)
        if live_slots.shape[0] == 0:
            return
        leaves = np.flatnonzero(self.ni[: int(self.tr[K.NHW]), K.HGT] == 0)
        cnt = self.ni[leaves, K.CNT]
        in_leaf = np.arange(self.max_entries + 1)[None, :] < cnt[:, None]
        rows = self.nch[leaves][in_leaf]  # leaf by leaf, in STR order
        seq = np.concatenate((st.cl_sub[rows].astype(np.int64), live_slots))
        _, first = np.unique(seq, return_index=True)
        new_of_old = st.relayout(seq[np.sort(first)])
        old_rows = np.flatnonzero(self.cleaf >= 0)
        new_rows = new_of_old[old_rows]
        self._fit_rows()
        for name in ("cleaf", "moff", "mlen"):
            col = getattr(self, name)
            fresh = np.full(col.shape[0], -1 if name == "cleaf" else 0, col.dtype)
            fresh[new_rows] = col[old_rows]
            setattr(self, name, fresh)
        block = self.nch[leaves]
        block[in_leaf] = new_of_old[rows]
        self.nch[leaves] = block
        if self._variant == K.POSTINGS:
            ecl = self.lk[: self._pool_n, K.ECL]
            ecl[ecl >= 0] = new_of_old[ecl[ecl >= 0]]
        self._set_empty({int(new_of_old[c]) for c in self._empty})

    def _insert_rows(self, rows: np.ndarray) -> None:
        for i in range(0, rows.shape[0], _CHUNK):
            part = rows[i : i + _CHUNK]
            self._fit_nodes((self.height + 3) * part.shape[0] + 8)
            self.ht = K.insert_clauses(
                part, self.ht, self.hm, self.tr, self.ni, self.nch, self.nbox, self.nfree,
                self.cleaf, self.store.bbox, self.store.cl_sub, self.moff, self.mlen, self.mtok,
                self.lk,
            )  # fmt: skip

    def _insert(self, slot: int, clauses: np.ndarray) -> None:
        self._fit_rows()
        clauses = np.asarray(clauses, np.int32)
        has = self.store.cl_len[clauses] > 0
        if not has.all():
            self._set_empty(self._empty | set(clauses[~has].tolist()))
        rows = clauses[has]
        if rows.shape[0] == 0:
            return
        if rows.shape[0] > _CHUNK:  # a large batch: node capacity reserved chunk by chunk
            self._assign_tokens(rows, bulk=False)  # Sect. 4.2 Updates: choose, then count
            self._count(rows, 1)
            self._insert_rows(rows)
            return
        st = self.store  # the same three steps in one compiled call
        self._fit_pool(int(st.cl_len[rows].sum()))
        self._fit_nodes((self.height + 3) * rows.shape[0] + 8)
        self.ht, self.cell_ht, self._pool_n = K.subscribe_rows(
            rows, self._strategy, self._n_keep, self._seed, st.cl_sub, st.cl_off, st.cl_len,
            st.terms, st.bbox, self.df, self._strategy == K.LOCALITY, self.cell_ht, self.cell_hm,
            self.grid, self._grid_cells, self._pool_n, self.ht, self.hm, self.tr, self.ni,
            self.nch, self.nbox, self.nfree, self.cleaf, self.moff, self.mlen, self.mtok, self.lk,
        )  # fmt: skip

    def subscribe_many(self, subs: Sequence[Subscription]) -> None:
        """``subscribe`` each, in order; new distinct ids go in as one batch (the store's
        ``add_many``, then one insert kernel call). O(H |s|) each plus splits."""
        ids = [s.id for s in subs]
        if len(subs) < 2 or len(set(ids)) < len(ids) or any(i in self.store.slot_of for i in ids):
            super().subscribe_many(subs)
            return
        _, clauses, _ = self.store.add_many(subs)
        self._insert(-1, clauses)

    def _delete(self, slot: int, clauses: np.ndarray) -> None:
        clauses = np.asarray(clauses, np.int32)
        has = self.store.cl_len[clauses] > 0
        if not has.all():
            self._set_empty(self._empty - set(clauses[~has].tolist()))
        rows = clauses[has]
        if rows.shape[0] == 0:
            return
        self._fit_nodes((self.height + 3) * self.min_entries * rows.shape[0] + 8)
        st = self.store
        self.ht, self.cell_ht, freed = K.unsubscribe_rows(
            rows, self.ht, self.hm, self.tr, self.ni, self.nch, self.nbox, self.nfree,
            self.cleaf, st.bbox, st.cl_sub, self.moff, self.mlen, self.mtok, self.lk, st.cl_off,
            st.cl_len, st.terms, self.df, self._strategy == K.LOCALITY, self.cell_ht,
            self.cell_hm, self.grid, self._grid_cells,
        )  # fmt: skip
        self._pool_garbage += int(freed)
        if self._pool_garbage > max(4096, self._pool_n // 2):
            self._compact_pool()

    def _compact_pool(self) -> None:
        """Drop the summary tokens of deleted clauses (positions renumbered; R^t++ relinks)."""
        rows = np.flatnonzero(self.cleaf >= 0).astype(np.int32)
        lens = self.mlen[rows].astype(np.int64)
        old = np.repeat(self.moff[rows], lens) + _ragged_arange(lens)
        toks = self.mtok[old]
        n = toks.shape[0]
        self.mtok[:n] = toks
        offs = np.zeros(rows.shape[0], np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        self.moff[rows] = offs
        self._pool_n, self._pool_garbage = n, 0
        if self._variant == K.POSTINGS:
            self.lk[:] = -1
            self._summarize(2 * self.ht.shape[0] // 3)

    def _set_empty(self, rows: set[int]) -> None:
        self._empty = rows
        self._empty_rows = np.array(sorted(rows), np.int32)

    def match_encoded(self, batch: EncodedMessages) -> tuple[np.ndarray, np.ndarray]:
        """Fig. 3 (filter and verify) over the batch in one compiled call."""
        st = self.store
        sc = self._stamps()
        out_m, out_s, sc.stamp = K.match_filter_verify(
            self.tr[K.ROOT], self.ni, self.nch, self.nbox, self.ht, self._empty_rows,
            st.cl_sub, st.cl_off, st.cl_len, st.terms, st.kind, st.bbox, st.circ, st.n_clauses,
            sc.TM, sc.SM, sc.stamp, batch.off, batch.terms, batch.kind, batch.geom,
        )  # fmt: skip
        return out_m, out_s

    # ---- introspection ----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        nodes = int(self.tr[K.NHW] - self.tr[K.FTOP])
        return {
            "subscriptions": len(self),
            "height": self.height,
            "nodes": nodes,
            "summary_entries": int(self.hm[1]),
            "summary_tokens": self._pool_n - self._pool_garbage,
        }

    def check_invariants(self) -> None:
        """The R-tree (parents, heights, counts, tight boxes, every live clause in one leaf) and
        every node's summary equal to one recomputed from the clauses below it."""
        st = self.store
        root = int(self.tr[K.ROOT])
        ni, nch, nbox = self.ni, self.nch, self.nbox
        assert ni[root, K.PAR] == -1
        live = st.live_clauses()
        has = st.cl_len[live] > 0
        assert self._empty == set(live[~has].tolist()), "clauses without terms"
        want_rows = set(live[has].tolist())
        seen: dict[int, int] = {}
        expect: dict[tuple[int, int], Any] = defaultdict(int)
        height = self.height
        stack = [(root, 0)]
        while stack:
            n, depth = stack.pop()
            k = int(ni[n, K.CNT])
            assert k <= self.max_entries, f"node {n} holds {k} entries"
            assert n == root or k >= 1, f"node {n} is empty"
            assert ni[n, K.HGT] == height - depth, f"node {n}: height {ni[n, K.HGT]}"
            ent = nch[n, :k]
            if ni[n, K.HGT] == 0:
                boxes = st.bbox[st.cl_sub[ent]]
                for c in ent.tolist():
                    assert c not in seen, f"clause {c} twice"
                    seen[c] = n
                    assert self.cleaf[c] == n, f"clause {c}: leaf {self.cleaf[c]} != {n}"
            else:
                boxes = nbox[ent]
                for ch in ent.tolist():
                    assert ni[ch, K.PAR] == n, f"node {ch}: parent {ni[ch, K.PAR]} != {n}"
                    stack.append((ch, depth + 1))
            if k:
                tight = (boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max())
                assert tuple(nbox[n]) == tight, f"node {n}: box {nbox[n]} != {tight}"
        assert set(seen) == want_rows, "the leaves do not hold exactly the live clauses"
        for c, leaf in seen.items():
            self._expect_summary(c, leaf, root, height, expect)
        got = self._summary_table()
        assert got == dict(expect), f"summaries differ: {_diff(got, dict(expect))}"
        assert int(self.hm[1]) == len(got)
        self._check_tokens(seen)

    def _expect_summary(self, c: int, leaf: int, root: int, height: int, expect: dict) -> None:
        toks = self.mtok[self.moff[c] : self.moff[c] + self.mlen[c]].tolist()
        a, depth = leaf, height
        while a != root:
            if self._variant == K.COUNTS:
                for t in toks:
                    expect[(a, t)] += 1
            else:
                for k, t in enumerate(toks):
                    if min(k + 1, height) == depth:
                        expect.setdefault((a, t), set()).add(int(self.moff[c]) + k)
            a, depth = int(self.ni[a, K.PAR]), depth - 1

    def _summary_table(self) -> dict[tuple[int, int], Any]:
        keys = self.ht[:, 0]
        out: dict[tuple[int, int], Any] = {}
        for i in np.flatnonzero(keys >= 0).tolist():
            key, val = int(self.ht[i, 0]), int(self.ht[i, 1])
            n, t = key >> 32, key & 0xFFFFFFFF
            if self._variant == K.COUNTS:
                out[(n, t)] = val
                continue
            got, prev, e = set(), -1, val
            while e >= 0:  # elements back to pool positions
                assert self.lk[e, K.PRV] == prev, f"list ({n}, {t}): broken back link at {e}"
                p = int(self.moff[self.lk[e, K.ECL]]) + self._elem_index(e)
                assert self.mtok[p] == t and p not in got
                got.add(p)
                prev, e = e, int(self.lk[e, K.NXT])
            out[(n, t)] = got
        return out

    def _check_tokens(self, seen: dict[int, int]) -> None:
        st = self.store
        for c in seen:
            terms = st.terms[st.cl_off[c] : st.cl_off[c] + st.cl_len[c]].tolist()
            toks = self.mtok[self.moff[c] : self.moff[c] + self.mlen[c]].tolist()
            if self._n_keep == 1:
                assert len(toks) == 1 and toks[0] in terms, f"clause {c}: representative {toks}"
            else:
                assert sorted(toks) == terms, f"clause {c}: tokens {toks} != {terms}"
            if self._variant == K.POSTINGS:
                a = int(self.moff[c])
                elems = self.lk[a : a + len(toks), K.ELEM]
                assert (self.lk[elems, K.ECL] == c).all(), f"clause {c}: elements {elems}"

    def _elem_index(self, e: int) -> int:
        """Which token of its clause R^t++ element ``e`` is."""
        c = int(self.lk[e, K.ECL])
        a = int(self.moff[c])
        hit = np.flatnonzero(self.lk[a : a + int(self.mlen[c]), K.ELEM] == e)
        assert hit.shape[0] == 1, f"element {e} is not one position of clause {c}"
        return int(hit[0])


class RtPlusTree(RtTree):
    """R^t+-tree (004 Sect. 4): one representative token per clause in the node summaries.

    Options as ``RtTree`` plus ``strategy`` ("df" greedy, "idf", "locality" (default), "random"),
    ``grid`` (cells a side for "locality") and ``seed`` ("random").
    """

    name = "rt+"
    options_doc: ClassVar[dict[str, str]] = {
        **RtTree.options_doc,
        "strategy": "representative tokens (004 Sect. 4.2): 'df' (greedy), 'idf', 'locality' "
        f"(default {DEFAULT_STRATEGY!r}: rarest in the clause's grid cell), 'random'",
        "grid": f"cells a side of the locality-aware grid (default {DEFAULT_GRID})",
        "seed": "seed of the 'random' strategy (default 0)",
    }
    _n_keep: ClassVar[int] = 1

    def __init__(
        self,
        strategy: str = DEFAULT_STRATEGY,
        grid: int = DEFAULT_GRID,
        seed: int = 0,
        **options: Any,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValidationError("strategy", strategy, f"must be one of {', '.join(STRATEGIES)}")
        if not isinstance(grid, int) or isinstance(grid, bool) or not 1 <= grid <= 4096:
            raise ValidationError("grid", grid, "must be an integer in 1 .. 4096")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValidationError("seed", seed, "must be an integer")
        super().__init__(**options)
        self.strategy = strategy
        self._strategy = STRATEGIES[strategy]
        self._grid_cells = grid
        self._seed = seed


class RtPlusPlusTree(RtPlusTree):
    """R^t++-tree (004 Sect. 5): token i of a clause at its level-i ancestor, inverted lists per
    node, occurrence counting without verification (Fig. 6).

    Options as ``RtPlusTree`` (``strategy`` orders each clause's tokens over the levels).
    """

    name = "rt++"
    options_doc: ClassVar[dict[str, str]] = {
        **RtPlusTree.options_doc,
        "strategy": "token order over the levels (004 Sect. 5.1, 4.2): 'df' (frequent first), "
        f"'idf' (rare first), 'locality' (default {DEFAULT_STRATEGY!r}: rare in the cell first), "
        "'random'",
    }
    _variant: ClassVar[int] = K.POSTINGS
    _n_keep: ClassVar[int] = -1

    def match_encoded(self, batch: EncodedMessages) -> tuple[np.ndarray, np.ndarray]:
        """Fig. 6 (R^t++-TREE-PRUNE) over the batch in one compiled call."""
        st = self.store
        sc = self._stamps()
        self._fit_rows()
        out_m, out_s, sc.stamp, self._mstamp = K.match_prune(
            self.tr[K.ROOT], self.ni, self.nch, self.nbox, self.ht, self._empty_rows, self.mlen,
            self.lk, st.cl_sub, st.cl_off, st.cl_len, st.terms, st.kind, st.bbox,
            st.circ, st.n_clauses, sc.TM, sc.SM, sc.stamp, self.Mst, self.Mct, self._mstamp,
            batch.off, batch.terms, batch.kind, batch.geom,
        )  # fmt: skip
        return out_m, out_s


_WARM: list[bool] = [False]
"""Whether this process has compiled (or loaded) the update kernels (``_warm_update_kernels``)."""


def _warm_update_kernels() -> None:
    """Compile (or load from numba's cache) the insert / split / delete kernels once per process,
    at the first build, on a throwaway tree of a few clauses (all three trees share the kernels:
    the same array types). Otherwise the first ``subscribe`` and ``unsubscribe`` after a build
    pay the compilation (seconds, far more with a cold cache) inside what they cost."""
    if _WARM[0]:
        return
    _WARM[0] = True
    subs = [
        Subscription(f"w{i}", ((f"a{i % 3}", f"b{i % 5}"),), Rect(i, 0, i + 1, 1))
        for i in range(12)
    ]
    ix = RtPlusPlusTree.build(subs, max_entries=4, min_entries=2)
    ix.subscribe(Subscription("x", (("a0",), ("b1", "c")), Rect(0, 0, 2, 1)))
    ix.subscribe_many(
        [Subscription(f"y{i}", (("a1", "d"),), Rect(i, 0, i + 1, 1)) for i in range(6)]
    )
    for sid in ["x", *(f"y{i}" for i in range(6)), *(f"w{i}" for i in range(12))]:
        ix.unsubscribe(sid)


def _str_order(boxes: np.ndarray, cap: int) -> np.ndarray:
    """STR: sort by x centre into ceil(sqrt(P)) vertical slabs of S * cap items, each slab by y
    centre; consecutive runs of ``cap`` are the nodes."""
    k = boxes.shape[0]
    n_nodes = -(-k // cap)
    slabs = max(1, int(np.ceil(np.sqrt(n_nodes))))
    cx = boxes[:, 0] + boxes[:, 2]
    cy = boxes[:, 1] + boxes[:, 3]
    by_x = np.argsort(cx, kind="stable")
    slab = np.empty(k, np.int64)
    slab[by_x] = np.arange(k) // (slabs * cap)
    return np.lexsort((cy, slab))


def _with_room(n: int) -> int:
    """Capacity for ``n`` items built in bulk: an eighth more, so that the first updates after a
    build do not copy the pool and the clause-row arrays whole (growth then doubles as usual)."""
    return n + n // 8 + 16


def _grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    out = np.empty((n,) + a.shape[1:], a.dtype)  # each byte written once: the copy, the fill
    out[: a.shape[0]] = a
    out[a.shape[0] :] = fill
    return out


def _ragged_arange(lens: np.ndarray) -> np.ndarray:
    total = int(lens.sum())
    starts = np.repeat(np.cumsum(lens) - lens, lens)
    return np.arange(total, dtype=np.int64) - starts


def _diff(got: dict, want: dict) -> str:
    keys = sorted(set(got) | set(want))
    bad = [(k, got.get(k), want.get(k)) for k in keys if got.get(k) != want.get(k)]
    return f"{len(bad)} keys, first {bad[:5]}"
