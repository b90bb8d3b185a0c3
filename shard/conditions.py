"""``ConditionColumns``: the conditions an index does not check (NOT terms, a polygon, attribute
predicates) of many subscriptions as columns, and their exact test over a batch of candidate
pairs in compiled calls.

One row per subscription that is not plain (``Subscription.plain``): its DNF clauses (the terms
each needs and the terms it must not meet, as ids of this table's own vocabulary), its polygon
(a row of a ``shard.polygon.PolygonColumns``, the centre of its base box) and its predicates (a
row of a ``shard.predicates.PredicateColumns``). ``check`` decides pairs (row, message of a
batch): some clause holds on the message's terms (a binary search per term over the message's
sorted ids), the message meets the polygon where the pair's box has it now (``check_pairs`` of
``shard.polygon``, the offset computed as ``shard.model.polygon_offset`` does), and every
predicate holds (``check_pairs`` of ``shard.predicates``): three compiled calls a batch, each
over the pairs that need it. The semantics are ``shard.brute.subscription_matches``'s; the
region's own box or circle is the index's to test.

>>> from shard.model import Message, Point, Rect, Subscription
>>> c = ConditionColumns()
>>> r = c.add(Subscription("s", (("coffee",),), Rect(0, 0, 1, 1), negated=(("starbucks",),)))
>>> batch = c.encode([Message("a", ("coffee",), Point(0, 0)), Message("b", ("coffee", "starbucks"), Point(0, 0))])
>>> c.check(np.array([r, r]), np.array([0, 1]), np.zeros((2, 4)), batch).tolist()
[True, False]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from shard.aptree.match import pack_terms
from shard.aptree.vocab import VocabTable
from shard.geometry import location_bbox
from shard.model import Message, Point, Polygon, Subscription
from shard.polygon import PolygonColumns
from shard.polygon import check_pairs as polygon_pairs
from shard.predicates import AttributeBatch, PredicateColumns, in_set
from shard.predicates import check_pairs as predicate_pairs

COMPACT_MIN_DEAD = 4096
"""The clause pool is rewritten once its dead rows outnumber the live ones and are at least this
many (a pass is O(live rows))."""


class ConditionBatch(NamedTuple):
    """A batch of messages as ``ConditionColumns.check`` reads them: each message's known term
    ids ascending (``off`` / ``terms``), its kind (``MSG_POINT`` / ``MSG_RECT``) and box, and its
    attributes (``shard.predicates.AttributeBatch``)."""

    off: np.ndarray
    terms: np.ndarray
    kind: np.ndarray
    geom: np.ndarray
    attrs: AttributeBatch


def _grown(a: np.ndarray, need: int, fill=0) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.full((max(need, 2 * a.shape[0], 16),) + a.shape[1:], fill, a.dtype)
    b[: a.shape[0]] = a
    return b


class ConditionColumns:
    """Rows of conditions (module docstring). ``add`` / ``remove`` O(terms + vertices +
    predicates), amortised; rows are reused."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.table = VocabTable()
        """``vocab`` compiled: a batch's terms are looked up in one call (``encode``)."""
        self.polygons = PolygonColumns()
        self.predicates = PredicateColumns()
        self.c_first = np.zeros(0, np.int64)
        self.c_n = np.zeros(0, np.int32)
        self.poly = np.zeros(0, np.int64)
        self.pred = np.zeros(0, np.int64)
        self.centre = np.zeros((0, 2))
        """The centre of each polygon's base box ((x0 + x2) / 2, (y0 + y2) / 2)."""
        self.theta = np.zeros(0)
        """A ranked row's threshold (NaN: not ranked; ``shard.ranking``), its alpha and its
        rectangle where it is now (``move_ranked``); its one clause holds its terms in their
        sorted order with their weights beside them in ``wpool``."""
        self.alpha = np.zeros(0)
        self.rect = np.zeros((0, 4))
        self.n_rows = 0
        self.free: list[int] = []
        self.live = 0
        # clause pool: clause k needs tpool[pos_off[k]:pos_off[k] + pos_len[k]] and must not
        # meet tpool[neg_off[k]:neg_off[k] + neg_len[k]]
        self.pos_off = np.zeros(0, np.int64)
        self.pos_len = np.zeros(0, np.int32)
        self.neg_off = np.zeros(0, np.int64)
        self.neg_len = np.zeros(0, np.int32)
        self.tpool = np.zeros(0, np.int32)
        self.wpool = np.zeros(0)
        self.n_clauses = 0
        self.n_terms = 0
        self.dead_clauses = 0

    def __len__(self) -> int:
        return self.live

    def _term(self, t: str) -> int:
        i = self.vocab.get(t)
        if i is None:
            i = self.vocab[t] = len(self.vocab)
            self.table.add([t], [i])
        return i

    # ---- rows ---------------------------------------------------------------------------------
    def add(self, sub: Subscription) -> int:
        """Store ``sub``'s conditions; returns its row."""
        r = self.free.pop() if self.free else self._new_row()
        self.live += 1
        neg = sub.negated or ((),) * len(sub.clauses)
        if sub.threshold is None:
            self.c_first[r], self.c_n[r] = self._add_clauses(sub.clauses, neg)
            self.theta[r] = np.nan
        else:
            self.c_first[r], self.c_n[r] = self._add_clauses(sub.clauses, neg, sub.term_weights)
            self.theta[r], self.alpha[r] = sub.threshold, sub.alpha
            g = sub.region
            self.rect[r] = (g.min_lon, g.min_lat, g.max_lon, g.max_lat)
        region = sub.region
        if type(region) is Polygon:
            self.poly[r] = self.polygons.add(region.rings)
            b = region.base
            self.centre[r] = ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
        else:
            self.poly[r] = -1
        self.pred[r] = self.predicates.add(sub.predicates) if sub.predicates else -1
        return r

    def _new_row(self) -> int:
        r = self.n_rows
        self.n_rows += 1
        n = self.n_rows
        self.c_first = _grown(self.c_first, n)
        self.c_n = _grown(self.c_n, n)
        self.poly = _grown(self.poly, n, -1)
        self.pred = _grown(self.pred, n, -1)
        self.centre = _grown(self.centre, n)
        self.theta = _grown(self.theta, n, np.nan)
        self.alpha = _grown(self.alpha, n)
        self.rect = _grown(self.rect, n)
        return r

    def move_ranked(self, r: int, rect: Sequence[float]) -> None:
        """A ranked row's rectangle is now ``rect`` (its subscription moved)."""
        self.rect[r] = rect

    def _add_clauses(self, clauses, negated, weights=None) -> tuple[int, int]:
        """Append clauses; with ``weights`` (a ranked row: one clause), its terms stay in their
        given (sorted) order, each weight beside its term, so the kernel sums them in the order
        ``shard.ranking.score`` does."""
        k0 = self.n_clauses
        k = len(clauses)
        n_t = sum(len(c) for c in clauses) + sum(len(n) for n in negated)
        self.pos_off = _grown(self.pos_off, k0 + k)
        self.pos_len = _grown(self.pos_len, k0 + k)
        self.neg_off = _grown(self.neg_off, k0 + k)
        self.neg_len = _grown(self.neg_len, k0 + k)
        self.tpool = _grown(self.tpool, self.n_terms + n_t)
        self.wpool = _grown(self.wpool, self.n_terms + n_t)
        t = self.n_terms
        if weights is not None:
            self.wpool[t : t + len(weights)] = weights
        for i, (pos, neg) in enumerate(zip(clauses, negated, strict=True)):
            for terms, off, length in ((pos, self.pos_off, self.pos_len), (neg, self.neg_off, self.neg_len)):  # fmt: skip
                ids = [self._term(x) for x in terms]
                if weights is None:
                    ids.sort()
                off[k0 + i] = t
                length[k0 + i] = len(ids)
                self.tpool[t : t + len(ids)] = ids
                t += len(ids)
        self.n_terms = t
        self.n_clauses = k0 + k
        return k0, k

    def remove(self, r: int) -> None:
        """Forget row ``r``."""
        if self.poly[r] >= 0:
            self.polygons.remove(int(self.poly[r]))
        if self.pred[r] >= 0:
            self.predicates.remove(int(self.pred[r]))
        self.dead_clauses += int(self.c_n[r])
        self.c_n[r] = 0
        self.poly[r] = self.pred[r] = -1
        self.free.append(r)
        self.live -= 1
        if self.dead_clauses >= max(COMPACT_MIN_DEAD, self.n_clauses - self.dead_clauses):
            self._compact()

    def _compact(self) -> None:
        """Rewrite the clause and term pools with the live rows' clauses only. O(live)."""
        pos_off, pos_len, neg_off, neg_len, pool, wpool = [], [], [], [], [], []
        for r in np.flatnonzero(self.c_n[: self.n_rows] > 0).tolist():
            first = len(pos_off)
            for k in range(int(self.c_first[r]), int(self.c_first[r] + self.c_n[r])):
                for off, length, src_off, src_len in (
                    (pos_off, pos_len, self.pos_off, self.pos_len),
                    (neg_off, neg_len, self.neg_off, self.neg_len),
                ):
                    a, n = int(src_off[k]), int(src_len[k])
                    off.append(len(pool))
                    length.append(n)
                    pool.extend(self.tpool[a : a + n].tolist())
                    wpool.extend(self.wpool[a : a + n].tolist())
            self.c_first[r] = first
        self.pos_off, self.pos_len = np.array(pos_off, np.int64), np.array(pos_len, np.int32)
        self.neg_off, self.neg_len = np.array(neg_off, np.int64), np.array(neg_len, np.int32)
        self.tpool = np.array(pool, np.int32)
        self.wpool = np.array(wpool, np.float64)
        self.n_clauses, self.n_terms = len(pos_off), len(pool)
        self.dead_clauses = 0

    # ---- batches ------------------------------------------------------------------------------
    def encode(
        self,
        messages: Sequence[Message],
        kind: np.ndarray | None = None,
        geom: np.ndarray | None = None,
    ) -> ConditionBatch:
        """A batch's messages as ``check`` reads them: their terms looked up in one compiled
        call (``shard.aptree.vocab``), their kinds and boxes (``kind`` / ``geom`` when the
        caller has them already, as an index's ``EncodedMessages`` do), their attributes (when
        some row has predicates). O(terms + attributes)."""
        n = len(messages)
        term_lists = [m.terms for m in messages]
        lens = np.fromiter(map(len, term_lists), np.int64, n)
        ids = self.table.lookup_lists(term_lists, int(lens.sum()))
        off, terms = pack_terms(ids, lens)
        if kind is None or geom is None:
            locs = [m.location for m in messages]
            kind = np.fromiter((type(x) is not Point for x in locs), np.int64, n)
            geom = np.array([location_bbox(x) for x in locs], np.float64).reshape(-1, 4)
        else:
            kind = kind.astype(np.int64)
        if len(self.predicates):
            attrs = self.predicates.encode_messages([m.attributes for m in messages])
        else:  # no predicate to test: no attribute to encode
            attrs = AttributeBatch(
                np.zeros(n + 1, np.int64),
                np.zeros(0, np.int32),
                np.zeros(0),
                self.predicates.generation,
            )
        return ConditionBatch(off, terms, kind, geom, attrs)

    def check(
        self, rows: np.ndarray, msg: np.ndarray, boxes: np.ndarray, batch: ConditionBatch
    ) -> np.ndarray:
        """Whether each pair (row ``rows[i]``, message ``msg[i]`` of ``batch``) holds, the
        polygon where the pair's ``boxes[i]`` (the index's box of the subscription now) has it
        (``boxes`` may stop after the last pair of a polygon row).
        Three compiled calls; O(clause terms · log message terms + vertices + predicates) a
        pair."""
        rows = np.ascontiguousarray(rows, np.int64)
        msg = np.ascontiguousarray(msg, np.int64)
        ok = _clauses_hold(
            rows,
            msg,
            self.c_first,
            self.c_n,
            self.pos_off,
            self.pos_len,
            self.neg_off,
            self.neg_len,
            self.tpool,
            self.wpool,
            self.theta,
            self.alpha,
            self.rect,
            batch.off,
            batch.terms,
            batch.kind,
            batch.geom,
        )
        poly = self.poly[rows]
        sel = np.flatnonzero(ok & (poly >= 0))
        if sel.size:
            b = boxes[sel]
            c = self.centre[rows[sel]]
            dx = (b[:, 0] + b[:, 2]) / 2 - c[:, 0]
            dy = (b[:, 1] + b[:, 3]) / 2 - c[:, 1]
            m = msg[sel]
            ok[sel] = polygon_pairs(
                *self.polygons.columns(), poly[sel], dx, dy, batch.kind[m], batch.geom[m]
            )
        pred = self.pred[rows]
        sel = np.flatnonzero(ok & (pred >= 0))
        if sel.size:
            ok[sel] = predicate_pairs(self.predicates, pred[sel], msg[sel], batch.attrs)
        return ok


@njit(cache=True)
def _ranked_score(k, pos_off, pos_len, tpool, wpool, alpha, rect, m_terms, a, b, kind, geom):
    """``shard.ranking.score`` of ranked clause ``k`` (same operations in the same order, so
    the same float) against the message whose terms are ``m_terms[a:b]``."""
    total = 0.0
    hit = 0.0
    for j in range(pos_off[k], pos_off[k] + pos_len[k]):
        total += wpool[j]
        if in_set(tpool[j], m_terms, a, b - a):
            hit += wpool[j]
    psi_t = hit / total
    x0, y0, x1, y1 = rect[0], rect[1], rect[2], rect[3]
    mx0, my0, mx1, my1 = geom[0], geom[1], geom[2], geom[3]
    if mx1 < x0 or mx0 > x1 or my1 < y0 or my0 > y1:
        psi_s = 0.0
    elif kind == 0:
        psi_s = 1.0
    else:
        area = (x1 - x0) * (y1 - y0)
        if area <= 0.0:
            psi_s = 1.0
        else:
            w = min(x1, mx1) - max(x0, mx0)
            h = min(y1, my1) - max(y0, my0)
            psi_s = min(1.0, (w * h) / area)
    return alpha * psi_s + (1.0 - alpha) * psi_t


@njit(cache=True)
def _clauses_hold(rows, msg, c_first, c_n, pos_off, pos_len, neg_off, neg_len, tpool, wpool, theta, alpha, rect, m_off, m_terms, m_kind, m_geom):  # fmt: skip
    """For each pair: does some clause of row ``rows[i]`` hold on message ``msg[i]``'s terms
    (its terms all there, none of its negated ones)? For a ranked row: does the message's
    score reach its threshold?"""
    out = np.zeros(rows.shape[0], np.bool_)
    for i in range(rows.shape[0]):
        r = rows[i]
        q = msg[i]
        a = m_off[q]
        b = m_off[q + 1]
        if theta[r] == theta[r]:  # ranked (not NaN)
            k = c_first[r]
            psi = _ranked_score(
                k, pos_off, pos_len, tpool, wpool, alpha[r], rect[r], m_terms, a, b, m_kind[q],
                m_geom[q],
            )  # fmt: skip
            out[i] = psi >= theta[r]
            continue
        for k in range(c_first[r], c_first[r] + c_n[r]):
            ok = True
            for j in range(pos_off[k], pos_off[k] + pos_len[k]):
                if not in_set(tpool[j], m_terms, a, b - a):
                    ok = False
                    break
            if ok:
                for j in range(neg_off[k], neg_off[k] + neg_len[k]):
                    if in_set(tpool[j], m_terms, a, b - a):
                        ok = False
                        break
            if ok:
                out[i] = True
                break
    return out
