"""A keyword-first inverted list: the simple keyword index the AP-Tree is measured against.

Each DNF clause of each subscription is filed under its *rarest* term (the term held by the
fewest live clauses when the list was built; ties to the lowest term id). A message probes the
posting lists of its own terms; a candidate clause matches when its region box meets the
message, every other term of the clause is among the message's terms, and (for a circle) the
exact haversine test passes; a subscription is reported once per message however many of its
clauses match. A clause with no terms (not produced by validation, but the oracle's semantics
give it every message in its region) sits on an extra list every message probes.

Postings are columns in posting order, so one list is one sequential scan: the clause's
subscription slot, its region box (the same conservative box ``shard.geometry.region_columns``
gives the AP-Tree and the oracle) and its remaining terms (CSR). The probe-and-verify loop is
one compiled kernel over a batch of ``EncodedMessages``; the region tests are
``shard.geometry``'s, so the semantics are the oracle's.

Static: built in bulk from a list of subscriptions (``build``) or from a
``SubscriptionStore`` (``from_store``); ``subscribe`` / ``unsubscribe`` are not supported
(change the store and ``rebuild``).

>>> from shard.model import Message, Point, Rect, Subscription
>>> il = InvertedList.build([Subscription("s1", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
>>> il.match_batch([Message("m1", ("ipad", "sale", "today"), Point(0.5, 0.5))])
[['s1']]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

from shard.aptree.match import CANDIDATES, PairRoom, all_stamped, grown, trimmed
from shard.aptree.store import SubscriptionStore
from shard.aptree.tree import EncodedMessages, encode_messages, ids_by_message
from shard.aptree.vocab import VocabTable
from shard.geometry import KIND_CIRCLE, exact_hit
from shard.model import Message, Subscription


@njit(cache=True)
def build_postings(live, cl_sub, cl_off, cl_len, terms, bbox, freq, n_clauses):
    """File every live clause under its rarest term (``freq``: live clauses per term id; list
    ``V = freq.shape[0]`` holds the clauses without terms). Returns the postings as columns:
    (start [V + 2], clause row [k], slot [k], box [k, 4], other-term offsets [k + 1], other
    terms, whether the clause's subscription has several clauses [k]). O(terms + V)."""
    v = freq.shape[0]
    k = live.shape[0]
    key = np.empty(k, np.int64)
    counts = np.zeros(v + 2, np.int64)
    n_other = 0
    for i in range(k):
        c = live[i]
        best = v
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            t = terms[j]
            if best == v or freq[t] < freq[best] or (freq[t] == freq[best] and t < best):
                best = t
        key[i] = best
        counts[best + 1] += 1
        if cl_len[c] > 0:
            n_other += cl_len[c] - 1
    start = np.cumsum(counts)
    fill = start[:-1].copy()
    p_clause = np.empty(k, np.int32)
    for i in range(k):  # stable: a list keeps the clauses in store order
        p_clause[fill[key[i]]] = live[i]
        fill[key[i]] += 1
    p_sub = np.empty(k, np.int32)
    p_multi = np.empty(k, np.bool_)
    p_box = np.empty((k, 4), np.float64)
    p_toff = np.zeros(k + 1, np.int64)
    p_terms = np.empty(n_other, np.int32)
    pos = 0
    for t in range(v + 1):
        for p in range(start[t], start[t + 1]):
            c = p_clause[p]
            s = cl_sub[c]
            p_sub[p] = s
            p_multi[p] = n_clauses[s] > 1
            for d in range(4):
                p_box[p, d] = bbox[s, d]
            skipped = False  # the filing term is known to be in a message that probes it
            for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                if not skipped and terms[j] == t:
                    skipped = True
                    continue
                p_terms[pos] = terms[j]
                pos += 1
            p_toff[p + 1] = pos
    return start, p_clause, p_sub, p_box, p_toff, p_terms, p_multi


@njit(cache=True)
def match_postings(
    start,
    p_sub,
    p_box,
    p_toff,
    p_terms,
    p_multi,
    kind,
    circ,
    TM,
    SM,
    stamp0,
    m_off,
    m_terms,
    m_kind,
    m_geom,
    room,
):
    """Match every message of the batch: probe the lists of its terms (and the list of clauses
    without terms), verify box, other terms and circle. ``TM`` (per term id) and ``SM`` (per
    slot) are stamp arrays; stamps only grow, so they need no clearing. A clause is filed once,
    so only the clauses of a subscription of several (``p_multi``) read and stamp ``SM``, as the
    AP-Tree's kernel does. Returns (message index, subscription slot) pairs, each slot at most
    once per message, and the last stamp used. O(sum of the probed lists' lengths + terms of
    the candidates whose box meets the message).

    As the AP-Tree's kernel (``shard.aptree.match.traverse_kernel``), the loop runs over output
    arrays it never replaces (``_match_postings``); when they are full it stops at the start of
    the message it was on, and this grows them and has it go on. They start with ``room``
    (``shard.aptree.match.PairRoom``), as the AP-Tree's."""
    out_m = np.empty(max(room, 16), np.int32)
    out_s = np.empty(max(room, 16), np.int32)
    q = 0
    nout = 0
    stamp = stamp0
    while True:
        q, nout, stamp = _match_postings(
            start, p_sub, p_box, p_toff, p_terms, p_multi, kind, circ, TM, SM, stamp,
            m_off, m_terms, m_kind, m_geom, q, out_m, out_s, nout,
        )  # fmt: skip
        if q == m_kind.shape[0]:
            break
        out_m = grown(out_m, out_m.shape[0])
        out_s = grown(out_s, out_s.shape[0])
    return trimmed(out_m, nout), trimmed(out_s, nout), stamp


@njit(cache=True)
def _match_postings(start, p_sub, p_box, p_toff, p_terms, p_multi, kind, circ, TM, SM, stamp, m_off, m_terms, m_kind, m_geom, q0, out_m, out_s, nout):  # fmt: skip
    """``match_postings``' loop from message ``q0``. Returns (message, pairs, stamp): the
    message count when done, else the message whose pairs found ``out_m`` full and the pairs
    before it."""
    v = start.shape[0] - 2
    nm = m_kind.shape[0]
    cap = out_m.shape[0]
    cand = np.empty(CANDIDATES, np.int64)
    for q in range(q0, nm):
        nout_q = nout
        stamp += 1
        t0 = m_off[q]
        t1 = m_off[q + 1]
        for i in range(t0, t1):
            TM[m_terms[i]] = stamp
        is_point = m_kind[q] == 0
        gx0 = m_geom[q, 0]
        gy0 = m_geom[q, 1]
        gx1 = m_geom[q, 2]
        gy1 = m_geom[q, 3]
        for i in range(t0, t1 + 1):
            t = m_terms[i] if i < t1 else v
            # the postings whose box meets the message first, without a branch (as the
            # AP-Tree's leaves: shard.aptree.match), then the rest of the test for those;
            # written out (``boxes_meeting`` here cost this kernel 3.5 % on Zipf, measured)
            for c0 in range(start[t], start[t + 1], CANDIDATES):
                c1 = min(c0 + CANDIDATES, start[t + 1])
                nc = 0
                for p in range(c0, c1):
                    cand[nc] = p
                    nc += (
                        (gx1 >= p_box[p, 0])
                        & (gx0 <= p_box[p, 2])
                        & (gy1 >= p_box[p, 1])
                        & (gy0 <= p_box[p, 3])
                    )
                for ci in range(nc):
                    p = cand[ci]
                    s = p_sub[p]
                    multi = p_multi[p]
                    if multi and SM[s] == stamp:
                        continue
                    if not all_stamped(TM, p_terms, p_toff[p], p_toff[p + 1], stamp):
                        continue
                    if kind[s] == KIND_CIRCLE and not exact_hit(
                        KIND_CIRCLE, p_box[p], circ[s], is_point, gx0, gy0, m_geom[q]
                    ):
                        continue
                    if multi:
                        SM[s] = stamp
                    if nout == cap:
                        return q, nout_q, stamp
                    out_m[nout] = q
                    out_s[nout] = s
                    nout += 1
    return nm, nout, stamp


class InvertedList:
    """Subscriptions filed clause by clause under their rarest term; exact, static.

    ``InvertedList.build(subs)`` (bulk, later ids replace earlier ones) or ``from_store``;
    ``match_batch`` / ``match`` / ``match_encoded`` query. No ``subscribe`` / ``unsubscribe``:
    the index is a snapshot of its store, re-made by ``rebuild()``.
    """

    def __init__(self) -> None:
        self.store = SubscriptionStore()
        """The columns the list is built from (``rebuild`` reads them; matching does not)."""
        self._vocab = VocabTable()
        self._ids = np.full(0, None, dtype=object)
        self._n_live = 0
        self._kind = np.zeros(0, np.int8)
        self._circ = np.zeros((0, 3), np.float64)
        self._start = np.zeros(2, np.int64)
        self._clause = np.zeros(0, np.int32)
        self._sub = np.zeros(0, np.int32)
        self._box = np.zeros((0, 4), np.float64)
        self._toff = np.zeros(1, np.int64)
        self._terms = np.zeros(0, np.int32)
        self._multi = np.zeros(0, np.bool_)
        self._freq = np.zeros(0, np.int64)
        self._term_stamp = np.zeros(1, np.int64)
        self._sub_stamp = np.zeros(0, np.int64)
        self._stamp = 0
        self._room = PairRoom()

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, subs: Iterable[Subscription], **_options) -> InvertedList:
        """Bulk-load ``subs`` into a store and index it. O(terms + V).

        >>> from shard.model import Rect
        >>> len(InvertedList.build([Subscription("a", (("x",),), Rect(0, 0, 1, 1))]))
        1
        """
        index = cls()
        index.store.add_bulk(subs)
        index.rebuild()
        return index

    @classmethod
    def from_store(cls, store: SubscriptionStore) -> InvertedList:
        """Index the live subscriptions of someone else's store (e.g. an ``APTree``'s, to compare
        both on the same data without loading it twice). Everything matching reads is copied, so
        later changes to the store (new terms, renumbering) do not reach the list until
        ``rebuild()``. O(terms + V + slots)."""
        index = cls()
        index.store = store
        index.rebuild()
        return index

    def rebuild(self) -> None:
        """Index the store's live subscriptions as they are now (rarity counted anew)."""
        store = self.store
        n_slots = store.n_slots
        self._vocab = store.vocab_table().copy()
        self._ids = store.ids[:n_slots].copy()
        self._n_live = len(store)
        self._kind = store.kind[:n_slots].copy()
        self._circ = store.circ[:n_slots].copy()
        self._freq = store.term_frequencies()
        (
            self._start,
            self._clause,
            self._sub,
            self._box,
            self._toff,
            self._terms,
            self._multi,
        ) = build_postings(
            store.live_clauses(),
            store.cl_sub,
            store.cl_off,
            store.cl_len,
            store.terms,
            store.bbox,
            self._freq,
            store.n_clauses,
        )
        self._term_stamp = np.zeros(len(store.vocab_terms) + 1, np.int64)
        self._sub_stamp = np.zeros(n_slots, np.int64)
        self._stamp = 0

    # ---- matching ---------------------------------------------------------------------------
    def encode(self, messages: Sequence[Message]) -> EncodedMessages:
        """Messages to kernel arrays over this list's vocabulary (``encode_messages``)."""
        return encode_messages(messages, self._vocab)

    def match_encoded(self, batch: EncodedMessages) -> tuple[np.ndarray, np.ndarray]:
        """(message index, subscription slot) for every match in the batch, message indexes
        ascending; compiled. Each subscription appears at most once per message."""
        out_m, out_s, self._stamp = match_postings(
            self._start,
            self._sub,
            self._box,
            self._toff,
            self._terms,
            self._multi,
            self._kind,
            self._circ,
            self._term_stamp,
            self._sub_stamp,
            self._stamp,
            batch.off,
            batch.terms,
            batch.kind,
            batch.geom,
            self._room.room(len(batch.kind)),
        )
        self._room.saw(len(batch.kind), len(out_m))
        return out_m, out_s

    def match_batch(self, messages: Sequence[Message]) -> list[list[str]]:
        """The ids of the subscriptions each message matches, in batch order. O(probed lists).

        >>> InvertedList().match_batch([])
        []
        """
        out_m, out_s = self.match_encoded(self.encode(messages))
        return self.ids_of(len(messages), out_m, out_s)

    def ids_of(self, n: int, out_m: np.ndarray, out_s: np.ndarray) -> list[list[str]]:
        """``match_encoded``'s pairs of a batch of ``n`` messages as each message's ids."""
        return ids_by_message(self._ids, n, out_m, out_s)

    def match(self, message: Message) -> list[str]:
        """The ids of the subscriptions ``message`` matches (order unspecified)."""
        return self.match_batch([message])[0]

    # ---- introspection ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n_live

    def stats(self) -> dict[str, int]:
        """Sizes: subscriptions, clauses (postings), lists in use, the longest list."""
        lens = np.diff(self._start)
        return {
            "subscriptions": self._n_live,
            "clauses": int(self._sub.shape[0]),
            "lists": int((lens > 0).sum()),
            "longest_list": int(lens.max()) if lens.size else 0,
        }

    def check_invariants(self) -> None:
        """Assert the invariants: every live clause of the store as the list was built is filed
        exactly once, under one of its terms of least frequency, with its subscription's box and
        its other terms; the lists are a partition of the postings."""
        store = self.store
        start, v = self._start, self._freq.shape[0]
        assert start.shape[0] == v + 2 and start[0] == 0, start
        assert np.all(np.diff(start) >= 0), "list starts decrease"
        assert start[-1] == self._sub.shape[0] == self._clause.shape[0], (start[-1], self._sub)
        live = store.live_clauses()
        assert sorted(self._clause.tolist()) == live.tolist(), "a live clause missing or twice"
        for t in range(v + 1):
            for p in range(int(start[t]), int(start[t + 1])):
                c = int(self._clause[p])
                s = int(store.cl_sub[c])
                a, n = int(store.cl_off[c]), int(store.cl_len[c])
                cl_terms = store.terms[a : a + n].tolist()
                where = f"posting {p} (clause {c}, slot {s}, terms {cl_terms}) in list {t}"
                assert int(self._sub[p]) == s, where
                assert bool(self._multi[p]) == (store.n_clauses[s] > 1), where
                assert self._box[p].tolist() == store.bbox[s].tolist(), where
                other = sorted(self._terms[self._toff[p] : self._toff[p + 1]].tolist())
                if t == v:
                    assert n == 0 and other == [], where
                    continue
                assert t in cl_terms, where
                assert self._freq[t] == min(self._freq[x] for x in cl_terms), where
                rest = list(cl_terms)
                rest.remove(t)
                assert other == sorted(rest), where
