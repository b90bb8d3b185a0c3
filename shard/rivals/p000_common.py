"""What paper 000's three indexes (MBRTrie, PT-Quadtree, LFilter) share: the numbering of the
clauses in token-set order, the change buffers (pending inserts, tombstones) and small kernels.

Paper: M. Yu, G. Li, J. Feng, "A Cost-based Method for Location-Aware Publish/Subscribe
Services", CIKM 2015 (``../shared/papers/000_…``).

* Sect. 3.1: fix a global token order, sort each clause's tokens in it, sort the clauses in
  *token-set order* (lexicographic on the sorted tokens, a prefix before its extensions) and give
  them ids in that order, so that the clauses under an MBRTrie node are a contiguous id range
  ``[n_l, n_u]``. Here the ids are *positions* ``0 .. k-1``; ``pos_row`` maps a position back to
  the store's clause row and ``pos_slot`` to its subscription slot. The PT-Quadtree's leaf lists
  hold the same positions, which is what LFilter's list pruning (Sect. 5.2) needs.
* The global order is the idf order of the paper's experiments (Sect. 6.1, Fig. 7): the *rank*
  of a term is its place by descending idf (ascending df over the live clauses at the build,
  ties to the lower term id). Terms first seen after the build rank after all of them, in id
  order (their rank is their id: the build's ranks are a permutation of ``0 .. R-1``).

Changes (Sects. 3.1 and 4.1 give only a sketch: "reserve some IDs for future insertions", "use
a special mark to denote the deletions"):

* delete: a tombstone per position (``alive``); node MBRs, ranges and pivotal tokens are left
  as they were (still conservative, so still exact). Once a quarter of the positions is dead,
  the index is rebuilt in bulk.
* insert: the new clauses go to a *pending* buffer that every message probes (an inverted list
  by each clause's first term in the rank order: the message's terms binary-search the buffer
  sorted by that term; then the box, the other terms and the exact region), merged by a bulk
  rebuild once it holds ``max(pending_min, indexed // PENDING_SHARE)`` clauses. This keeps the
  numbering contiguous in token-set order, which list pruning relies on, without reserving id
  gaps, and keeps the trie's child arrays sorted for the binary searches of Sect. 3.3; the
  paper's in-place insert (MBRs and ranges enlarged along the path, a pivotal token added to the
  NSets on the path) is not built.

Where the paper is ambiguous (choices shared by the three indexes):

* "idf order" does not say which end comes first: rarest (highest idf) first, so the trie's
  upper levels hold selective tokens.
* A clause with no terms (the oracle gives it every message in its region; validation does not
  produce one) sits at the trie root's terminal list; the PT-Quadtree cannot give it a pivotal
  token, so there it is kept out of the quadtree and checked with every message.
* A clause repeating a term is indexed with the term once (sets, as in the paper).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numba import njit

from shard.aptree.tree import EncodedMessages
from shard.errors import ValidationError
from shard.rivals.base import RivalIndex, hits_region, report, verify_clause
from shard.sorted_arrays import lower_bound

PENDING_SHARE = 8
"""Pending inserts are merged (bulk rebuild) once they number ``indexed // PENDING_SHARE`` (and
at least ``pending_min``); the rebuilds cost O(PENDING_SHARE log n) amortised per insert. A
message probes the buffer by its terms (O(N log P) plus the clauses under them): 2,590 pending
clauses on 180,000 (pl200k) cost the MBRTrie 1.5 µs a message, a linear scan of them 27 µs.
An insert costs about 8 µs plus its share of the rebuilds (pl200k: PT-Quadtree 1.7 s per
22,500 inserts, MBRTrie 0.5 s)."""

DEFAULT_PENDING_MIN = 256
"""The smallest pending buffer that triggers a merge (small indexes rebuild rarely)."""

DEAD_SHARE = 4
"""A bulk rebuild drops the tombstones once ``1 / DEAD_SHARE`` of the positions are dead."""


# ---- numbering ----------------------------------------------------------------------------------
@njit(cache=True)
def term_df(live, cl_off, cl_len, terms, n_terms):
    """Live clauses per term id (df). O(terms)."""
    df = np.zeros(n_terms, np.int64)
    for i in range(live.shape[0]):
        c = live[i]
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            df[terms[j]] += 1
    return df


def idf_ranks(live, cl_off, cl_len, terms, n_terms: int) -> np.ndarray:
    """Rank of every term id in the idf order (ascending df, ties to the lower id): a
    permutation of ``0 .. n_terms-1``. O(terms + V log V)."""
    df = term_df(live, cl_off, cl_len, terms, n_terms)
    order = np.lexsort((np.arange(n_terms), df))
    rank = np.empty(n_terms, np.int32)
    rank[order] = np.arange(n_terms, dtype=np.int32)
    return rank


@njit(cache=True)
def rank_of(rank, t):
    """The rank of term id ``t`` (a term newer than the ranks ranks as its id)."""
    return rank[t] if t < rank.shape[0] else t


@njit(cache=True)
def distinct_ranks(terms, a, b, rank):
    """The distinct ranks of ``terms[a:b]``, ascending: a clause's path in the trie (Sect. 3.1),
    a message's ``T = <t1 .. tN>`` (Sect. 3.3)."""
    n = b - a
    out = np.empty(n, np.int32)
    for i in range(n):
        out[i] = rank_of(rank, terms[a + i])
    out.sort()
    m = 0
    for i in range(n):
        if m == 0 or out[i] != out[m - 1]:
            out[m] = out[i]
            m += 1
    return out[:m]


@njit(cache=True)
def ranked_clauses(live, cl_off, cl_len, terms, rank):
    """Each live clause's distinct terms as ranks, ascending, padded with -1 to the longest:
    (matrix [k, L], lengths [k]). O(terms log)."""
    k = live.shape[0]
    width = 1
    for i in range(k):
        width = max(width, cl_len[live[i]])
    mat = np.full((k, width), -1, np.int32)
    lens = np.zeros(k, np.int32)
    for i in range(k):
        c = live[i]
        row = distinct_ranks(terms, cl_off[c], cl_off[c] + cl_len[c], rank)
        mat[i, : row.shape[0]] = row
        lens[i] = row.shape[0]
    return mat, lens


def token_set_order(mat: np.ndarray) -> np.ndarray:
    """Sect. 3.1: the clauses (rows of ``ranked_clauses``) in token-set order: lexicographic on
    the ranks, a prefix (padded with -1) before its extensions. O(k L log k)."""
    if mat.shape[0] == 0:
        return np.zeros(0, np.int64)
    return np.lexsort(mat.T[::-1])


# ---- small kernels the matchers share -------------------------------------------------------
@njit(cache=True)
def boxes_meet(b, x0, y0, x1, y1) -> bool:
    """Whether box ``b`` (min x, min y, max x, max y) meets the message box (closed)."""
    return not (x1 < b[0] or x0 > b[2] or y1 < b[1] or y0 > b[3])


@njit(cache=True)
def outside(boxes, i, x0, y0, x1, y1) -> bool:
    """Whether row ``i`` of a box column misses the message box (closed)."""
    return x1 < boxes[i, 0] or x0 > boxes[i, 2] or y1 < boxes[i, 1] or y0 > boxes[i, 3]


@njit(cache=True)
def room(a, top, more):
    """``a`` (filled to ``top``), or a copy with room for ``more`` after ``top``."""
    if top + more <= a.shape[0]:
        return a
    b = np.empty(2 * (top + more), a.dtype)
    b[:top] = a[:top]
    return b


@njit(cache=True)
def room2(a, top, more):
    """``room`` for the rows of a 2-d array."""
    if top + more <= a.shape[0]:
        return a
    b = np.empty((2 * (top + more), a.shape[1]), a.dtype)
    b[:top] = a[:top]
    return b


@njit(cache=True)
def lg(x):
    """log2, floored at 1 (the cost formulas' logs of small counts)."""
    return np.log2(x) if x > 2.0 else 1.0


@njit(cache=True)
def start_message(batch, q, TM, stamp):
    """Open message ``q`` of ``batch`` (off, terms, kind, geom): stamp its terms in ``TM`` with
    the next stamp. Returns (stamp, a, b, msg): its terms are ``batch[1][a:b]``; ``msg`` is (q,
    stamp, is_point, box (x0, y0, x1, y1)), what the report kernels take (a tuple of scalars: no
    array to count references to on every report)."""
    m_off, m_terms, m_kind, m_geom = batch
    stamp += 1
    a, b = m_off[q], m_off[q + 1]
    for i in range(a, b):
        TM[m_terms[i]] = stamp
    g = m_geom[q]
    return stamp, a, b, (q, stamp, m_kind[q] == 0, (g[0], g[1], g[2], g[3]))


@njit(cache=True)
def scan_pending(pending, msg_terms, cols, TM, SM, msg, out):
    """The pending (inserted since the build) clauses against message ``msg`` (terms
    ``msg_terms``, ascending). ``pending``: (clause rows, their first term in the rank order, -1
    for none, their boxes), sorted by that term: each message term binary-searches its run
    (and the run of -1 is always read); then the box, the clause's other terms and its exact
    region. ``out`` is (out_m, out_s, nout); returns it."""
    rows, first, boxes = pending
    kind, bbox, circ, cl_sub, cl_off, cl_len, terms, n_clauses = cols
    q, stamp, is_point, box = msg
    x0, y0, x1, y1 = box
    k = rows.shape[0]
    if k == 0:
        return out
    out_m, out_s, nout = out
    x = 0
    for w in range(-1, msg_terms.shape[0]):
        t = -1 if w < 0 else msg_terms[w]
        x = lower_bound(first, x, k, t)
        while x < k and first[x] == t:
            i = x
            x += 1
            if outside(boxes, i, x0, y0, x1, y1):
                continue
            c = rows[i]
            s = cl_sub[c]
            if s < 0 or not verify_clause(cl_off, cl_len, terms, TM, stamp, c, -1):
                continue
            if hits_region(kind, bbox, circ, s, is_point, x0, y0, x1, y1, box):
                out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
    return out_m, out_s, nout


@njit(cache=True, inline="always")  # (a cached LFilter ran 25% slower without)
def report_spatial(p, pos_slot, alive, cols, SM, msg, out):
    """Sect. 3.2, Step 2 (MBRTrie-VERIFY): position ``p`` already meets the textual constraint;
    report its subscription when alive and its region meets the message ``msg``
    (``start_message``'s). ``out`` is (out_m, out_s, nout); returns it."""
    if not alive[p]:
        return out
    kind, bbox, circ, cl_sub, cl_off, cl_len, terms, n_clauses = cols
    q, stamp, is_point, box = msg
    s = pos_slot[p]
    if hits_region(kind, bbox, circ, s, is_point, box[0], box[1], box[2], box[3], box):
        out_m, out_s, nout = out
        return report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
    return out


@njit(cache=True, inline="always")  # (see ``report_spatial``)
def report_full(p, pos_row, pos_slot, alive, cols, TM, SM, msg, out):
    """Sect. 4.2, Step 2 (PT-QUADTREE-VERIFY): report position ``p`` when alive, every term of
    its clause among the message's (stamps) and its region meets the message (tested first: a
    point message's leaf lists many clauses whose boxes miss the point)."""
    if not alive[p]:
        return out
    kind, bbox, circ, cl_sub, cl_off, cl_len, terms, n_clauses = cols
    q, stamp, is_point, box = msg
    s = pos_slot[p]
    if not hits_region(kind, bbox, circ, s, is_point, box[0], box[1], box[2], box[3], box):
        return out
    if not verify_clause(cl_off, cl_len, terms, TM, stamp, pos_row[p], -1):
        return out
    out_m, out_s, nout = out
    return report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValidationError(name, value, f"must be an integer >= {minimum}")
    return int(value)


def positive_float(name: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
        raise ValidationError(name, value, f"must be a number >= {minimum}")
    return float(value)


class P000Index(RivalIndex):
    """The clause numbering and change buffers of paper 000's indexes (see the module docstring).

    A subclass implements ``_index()`` (build its structure over ``pos_row`` / ``pos_slot``,
    positions in token-set order) and ``match_encoded``; it may extend ``stats`` and
    ``_check_structure``."""

    options_doc: ClassVar[dict[str, str]] = {
        "pending_min": "inserted clauses kept in a scanned buffer before a bulk merge "
        f"(default {DEFAULT_PENDING_MIN}; the buffer may grow to indexed/{PENDING_SHARE})",
    }

    def __init__(self, pending_min: int = DEFAULT_PENDING_MIN, **options: Any) -> None:
        super().__init__(**options)  # (an unknown option: ``ValidationError``)
        self.pending_min = positive_int("pending_min", pending_min)
        self._cstamp = 0
        self._reset_numbering(np.zeros(0, np.int32), np.zeros(0, np.int32))

    # ---- numbering ----------------------------------------------------------------------------
    def _reset_numbering(self, rank: np.ndarray, pos_row: np.ndarray) -> None:
        st = self.store
        self.rank = rank
        self.pos_row = pos_row.astype(np.int32)
        self.pos_slot = st.cl_sub[self.pos_row].astype(np.int32)
        k = self.pos_row.shape[0]
        self.alive = np.ones(k, np.bool_)
        self.pos_of_row = np.full(max(st.n_clause_rows, 1), -1, np.int32)
        self.pos_of_row[self.pos_row] = np.arange(k, dtype=np.int32)
        self.CM = np.zeros(k, np.int64)
        """Per position: the last message stamp (``_cstamp``) that examined it (a clause on
        several quadtree leaves is verified once per message)."""
        self.pending = np.zeros(16, np.int32)
        """Clause rows inserted since the build; beside them their first term in the rank order
        (-1: none) and their boxes, the columns ``scan_pending`` reads first."""
        self.pending_tok = np.zeros(16, np.int32)
        self.pending_box = np.zeros((16, 4), np.float64)
        self.n_pending = 0
        self._pending_sorted = None
        self._pending_at: dict[int, int] = {}
        self.n_dead = 0

    def _build(self) -> None:
        st = self.store
        live = st.live_clauses()
        rank = idf_ranks(live, st.cl_off, st.cl_len, st.terms, len(st.vocab_terms))
        mat, lens = ranked_clauses(live, st.cl_off, st.cl_len, st.terms, rank)
        order = token_set_order(mat)
        self._reset_numbering(rank, live[order])
        self._index(mat[order], lens[order])

    def _index(self, mat: np.ndarray, lens: np.ndarray) -> None:
        """Build the structure over the positions (``mat``/``lens``: their ranked terms)."""
        raise NotImplementedError

    # ---- changes ------------------------------------------------------------------------------
    def _insert(self, slot: int, clauses: np.ndarray) -> None:
        st = self.store
        self._pending_sorted = None
        for c in map(int, clauses):
            if self.n_pending == self.pending.shape[0]:
                self.pending = np.concatenate([self.pending, np.zeros_like(self.pending)])
                self.pending_tok = np.concatenate(
                    [self.pending_tok, np.zeros_like(self.pending_tok)]
                )
                self.pending_box = np.concatenate(
                    [self.pending_box, np.zeros_like(self.pending_box)]
                )
            a, n = int(st.cl_off[c]), int(st.cl_len[c])
            terms = st.terms[a : a + n]
            r = self.rank
            first = min(
                terms.tolist(), key=lambda t: int(r[t]) if t < r.shape[0] else t, default=-1
            )
            i = self.n_pending
            self._pending_at[c] = i
            self.pending[i] = c
            self.pending_tok[i] = first
            self.pending_box[i] = st.bbox[slot]
            self.n_pending += 1
        if self.n_pending > max(self.pending_min, self.pos_row.shape[0] // PENDING_SHARE):
            self.rebuild()

    def _delete(self, slot: int, clauses: np.ndarray) -> None:
        for c in map(int, clauses):
            p = int(self.pos_of_row[c]) if c < self.pos_of_row.shape[0] else -1
            if p >= 0:
                self.alive[p] = False
                self.pos_of_row[c] = -1
                self.n_dead += 1
                continue
            i = self._pending_at.pop(c)
            self._pending_sorted = None
            self.n_pending -= 1
            j = self.n_pending
            if i != j:  # the last pending clause takes its place
                last = int(self.pending[j])
                self.pending[i] = last
                self.pending_tok[i] = self.pending_tok[j]
                self.pending_box[i] = self.pending_box[j]
                self._pending_at[last] = i

    def unsubscribe(self, sub_id: str) -> None:
        """Remove ``sub_id``; rebuild in bulk once a quarter of the positions are tombstones."""
        super().unsubscribe(sub_id)
        if self.n_dead * DEAD_SHARE > max(self.pos_row.shape[0], 4 * self.pending_min):
            self.rebuild()

    # ---- matching helpers ---------------------------------------------------------------------
    def _cols(self):
        st = self.store
        return (st.kind, st.bbox, st.circ, st.cl_sub, st.cl_off, st.cl_len, st.terms, st.n_clauses)

    def _run(self, kernel, batch: EncodedMessages, *structure):
        """Call a match kernel ``kernel(structure..., numbering, cols, TM, SM, stamp, cstamp,
        CM, pending, (off, terms, kind, geom))``; keeps the stamps. Returns (out_m, out_s,
        extra)."""
        sc = self._stamps()
        numbering = (self.rank, self.pos_row, self.pos_slot, self.alive)
        out_m, out_s, sc.stamp, self._cstamp, extra = kernel(
            *structure,
            numbering,
            self._cols(),
            sc.TM,
            sc.SM,
            sc.stamp,
            self._cstamp,
            self.CM,
            self._pending_by_term(),
            (batch.off, batch.terms, batch.kind, batch.geom),
        )
        return out_m, out_s, extra

    def _pending_by_term(self):
        """The pending columns sorted by first term (``scan_pending``'s runs), cached until the
        next change."""
        if self._pending_sorted is None:
            n = self.n_pending
            order = np.argsort(self.pending_tok[:n], kind="stable")
            self._pending_sorted = (
                self.pending[:n][order],
                self.pending_tok[:n][order],
                np.ascontiguousarray(self.pending_box[:n][order]),
            )
        return self._pending_sorted

    # ---- introspection ------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {
            "subscriptions": len(self),
            "positions": int(self.pos_row.shape[0]),
            "dead": int(self.n_dead),
            "pending": int(self.n_pending),
        }

    def check_invariants(self) -> None:
        st = self.store
        live = st.live_clauses()
        k = self.pos_row.shape[0]
        assert self.pos_slot.shape[0] == k and self.alive.shape[0] == k
        assert int(k - self.alive.sum()) == self.n_dead, "tombstone count"
        pend = self.pending[: self.n_pending]
        assert len(set(pend.tolist())) == self.n_pending == len(self._pending_at)
        assert np.array_equal(self.pending_box[: self.n_pending], st.bbox[st.cl_sub[pend]])
        alive_rows = self.pos_row[self.alive]
        assert len(alive_rows) + self.n_pending == live.shape[0], "a live clause is not indexed"
        assert np.array_equal(np.sort(np.concatenate([alive_rows, pend])), live)
        alive_pos = np.flatnonzero(self.alive)
        assert np.array_equal(self.pos_of_row[alive_rows], alive_pos)
        assert np.array_equal(st.cl_sub[alive_rows], self.pos_slot[alive_pos]), "slot moved"
        self._check_structure()

    def _check_structure(self) -> None:
        """Assert the subclass's structural invariants."""
