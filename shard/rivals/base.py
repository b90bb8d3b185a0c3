"""``RivalIndex``: what every rival index shares, so that each module holds only its structure.

A rival keeps its subscriptions in a ``SubscriptionStore`` (the AP-Tree's columns: one row per
subscription slot, one per DNF clause, interned term ids; ``shard.aptree.store``), and indexes
*clauses*: a subscription of several clauses (``a AND (b OR c)`` is ``{a b} | {a c}``) is
decomposed into them, as papers 000, 003 and 004 do for boolean expressions, and reported once
per message however many of its clauses match. Regions are the store's: a rectangle, or a
circle indexed by its conservative box (``bbox``) and verified exactly
(``shard.geometry.exact_hit``); messages are points or rectangles (``EncodedMessages``: term ids
ascending, ``kind`` 0 point / 1 rectangle, ``geom`` the box). The semantics are the oracle's
(``shard.brute``): every term of some clause among the message's terms, and the region meets the
message's location.

A subclass implements four methods over slots and clause rows of ``self.store``:

* ``_build()``: index every live clause of the store (``store.live_clauses()``), bulk;
* ``_insert(slot, clauses)``: index the new subscription ``slot`` (already in the store) whose
  clause rows are ``clauses``;
* ``_delete(slot, clauses)``: take them out (called before the store forgets the row);
* ``match_encoded(batch)``: (message index, slot) of every match, message indexes ascending,
  each slot at most once per message (int arrays); compiled over columns.

and may override ``stats`` (sizes), ``nbytes`` (the index's own arrays) and
``check_invariants``. Term ids are stable: a rival never renumbers the store's vocabulary, so
ids held in its structure stay valid; a term first seen later gets the next id.

>>> from shard.model import Message, Point, Rect, Subscription
>>> class Scan(RivalIndex):
...     name = "scan"
...     def _build(self): pass
...     def _insert(self, slot, clauses): pass
...     def _delete(self, slot, clauses): pass
...     def match_encoded(self, batch):
...         return scan_all(self.store, batch, self._stamps())
>>> ix = Scan.build([Subscription("s", (("ipad", "sale"),), Rect(0, 0, 1, 1))])
>>> ix.match_batch([Message("m", ("sale", "ipad", "x"), Point(0.5, 0.5))])
[['s']]
>>> ix.unsubscribe("s"); ix.match_batch([Message("m", ("sale", "ipad"), Point(0.5, 0.5))])
[[]]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
from numba import njit

from shard.aptree.match import all_stamped, grown
from shard.aptree.store import SubscriptionStore
from shard.aptree.tree import EncodedMessages, encode_messages, ids_by_message
from shard.errors import ValidationError
from shard.geometry import exact_hit
from shard.model import Message, Subscription


class Stamps:
    """Scratch the kernels share: a stamp per term id (``TM``: the message's terms carry the
    current stamp) and per slot (``SM``: a subscription already reported for this message).
    Stamps only grow, so nothing is cleared between messages; ``stamp`` is the last one used
    (a kernel returns the new value, stored back by the caller)."""

    __slots__ = ("SM", "TM", "stamp")

    def __init__(self) -> None:
        self.TM = np.zeros(1024, np.int64)
        self.SM = np.zeros(1024, np.int64)
        self.stamp = 0

    def fit(self, n_terms: int, n_slots: int) -> Stamps:
        if n_terms + 1 > self.TM.shape[0]:
            self.TM = np.zeros(max(n_terms + 1, 2 * self.TM.shape[0]), np.int64)
            self.stamp = 0
            self.SM[:] = 0
        if n_slots > self.SM.shape[0]:
            self.SM = np.zeros(max(n_slots, 2 * self.SM.shape[0]), np.int64)
            self.stamp = 0
            self.TM[:] = 0
        return self


class RivalIndex:
    """Base of the rival indexes: the store, subscribe / unsubscribe, encoding, results.

    ``build(subs, **options)`` (bulk; a repeated id replaces the earlier one) or
    ``from_store(store, **options)``; ``subscribe`` (replacing a present id) / ``unsubscribe``;
    ``match_batch`` / ``match`` / ``encode`` + ``match_encoded`` + ``ids_of`` query.
    """

    name: ClassVar[str] = ""
    """The name ``--index`` and the shard setting ``index`` use (``shard.indexes``)."""
    options_doc: ClassVar[dict[str, str]] = {}
    """Each option the constructor takes, with what it means (shown by ``bench compare``)."""

    def __init__(self, **options: Any) -> None:
        if options:
            key = sorted(options)[0]
            raise ValidationError(key, options[key], f"is not an option of the {self.name} index")
        self.store = SubscriptionStore()
        self._scratch = Stamps()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, subs: Iterable[Subscription], **options: Any) -> RivalIndex:
        """Bulk-load ``subs`` (a repeated id: the last one counts) and index them."""
        index = cls(**options)
        index.store.add_bulk(subs)
        index.rebuild()
        return index

    @classmethod
    def from_store(cls, store: SubscriptionStore, **options: Any) -> RivalIndex:
        """Index the live subscriptions of a store built elsewhere (taken over, not copied)."""
        index = cls(**options)
        index.store = store
        index.rebuild()
        return index

    def rebuild(self) -> None:
        """Index the store's live subscriptions anew (bulk)."""
        self._build()

    # ---- changes ------------------------------------------------------------------------------
    def subscribe(self, sub: Subscription) -> None:
        """Add ``sub``, replacing a subscription with the same id."""
        if sub.id in self.store.slot_of:
            self.unsubscribe(sub.id)
        slot, clauses = self.store.add(sub)
        self._insert(slot, clauses)

    def subscribe_many(self, subs: Sequence[Subscription]) -> None:
        """``subscribe`` each, in order (a subclass may index a batch at once)."""
        for sub in subs:
            self.subscribe(sub)

    def unsubscribe(self, sub_id: str) -> None:
        """Remove ``sub_id`` (``NotFoundError`` if unknown)."""
        slot = self.store.slot(sub_id)
        self._delete(slot, self.store.clauses_of(slot))
        self.store.remove(sub_id)

    # ---- matching -----------------------------------------------------------------------------
    def encode(self, messages: Sequence[Message]) -> EncodedMessages:
        """Messages as kernel arrays over the store's vocabulary (unknown terms dropped)."""
        return encode_messages(messages, self.store.vocab_table())

    def match_encoded(self, batch: EncodedMessages) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def ids_of(self, n: int, out_m: np.ndarray, out_s: np.ndarray) -> list[list[str]]:
        """``match_encoded``'s pairs of a batch of ``n`` messages as each message's ids."""
        return ids_by_message(self.store.ids, n, out_m, out_s)

    def match_batch(self, messages: Sequence[Message]) -> list[list[str]]:
        """The ids of the subscriptions each message matches, in batch order."""
        if not messages:
            return []
        out_m, out_s = self.match_encoded(self.encode(messages))
        return self.ids_of(len(messages), out_m, out_s)

    def match(self, message: Message) -> list[str]:
        return self.match_batch([message])[0]

    def _stamps(self) -> Stamps:
        """The shared scratch, sized to the store's vocabulary and slots."""
        return self._scratch.fit(len(self.store.vocab_terms), self.store.n_slots)

    # ---- introspection ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.store.slot_of

    def stats(self) -> dict[str, int]:
        return {"subscriptions": len(self)}

    def nbytes(self) -> int:
        """Bytes of the index's own arrays (every numpy array attribute but the store's)."""
        return sum(
            v.nbytes for k, v in vars(self).items() if isinstance(v, np.ndarray) and k != "store"
        ) + sum(_nbytes(v) for v in vars(self).values() if isinstance(v, tuple | list))

    def memory_bytes(self) -> int:
        """The index's arrays plus the store's columns (what a process holds for it)."""
        st = self.store
        cols = [v for v in vars(st).values() if isinstance(v, np.ndarray)]
        return self.nbytes() + sum(c.nbytes for c in cols) + sys.getsizeof(st.slot_of)

    def check_invariants(self) -> None:
        """Assert the structure's invariants (a subclass checks its own)."""


def _nbytes(v) -> int:
    total = 0
    for x in v:
        if isinstance(x, np.ndarray):
            total += x.nbytes
        elif isinstance(x, tuple | list):
            total += _nbytes(x)
    return total


@njit(cache=True)
def verify_clause(cl_off, cl_len, terms, TM, stamp, c, skip_term) -> bool:
    """Whether every term of clause row ``c`` but ``skip_term`` (-1: none) carries the message's
    stamp in ``TM``."""
    for j in range(cl_off[c], cl_off[c] + cl_len[c]):
        t = terms[j]
        if t != skip_term and TM[t] != stamp:
            return False
    return True


@njit(cache=True)
def hits_region(kind, bbox, circ, s, is_point, x0, y0, x1, y1, q) -> bool:
    """Whether subscription slot ``s``'s region meets the message (box ``x0, y0, x1, y1``;
    ``q`` its geom row): the box test, then the exact one (a circle)."""
    if x1 < bbox[s, 0] or x0 > bbox[s, 2] or y1 < bbox[s, 1] or y0 > bbox[s, 3]:
        return False
    return exact_hit(kind[s], bbox[s], circ[s], is_point, x0, y0, q)


@njit(cache=True)
def report(out_m, out_s, nout, q, s, SM, stamp, multi):
    """Append (q, s) unless ``s`` was reported for this message (checked when ``multi``: its
    subscription has several clauses). Returns (out_m, out_s, nout)."""
    if multi:
        if SM[s] == stamp:
            return out_m, out_s, nout
        SM[s] = stamp
    if nout == out_m.shape[0]:
        out_m = grown(out_m, nout)
        out_s = grown(out_s, nout)
    out_m[nout] = q
    out_s[nout] = s
    return out_m, out_s, nout + 1


@njit(cache=True)
def _scan_all(
    cl_sub,
    cl_off,
    cl_len,
    terms,
    n_rows,
    kind,
    bbox,
    circ,
    n_clauses,
    TM,
    SM,
    stamp,
    m_off,
    m_terms,
    m_kind,
    m_geom,
):
    out_m = np.empty(64, np.int32)
    out_s = np.empty(64, np.int32)
    nout = 0
    for q in range(m_kind.shape[0]):
        stamp += 1
        for i in range(m_off[q], m_off[q + 1]):
            TM[m_terms[i]] = stamp
        x0, y0, x1, y1 = m_geom[q, 0], m_geom[q, 1], m_geom[q, 2], m_geom[q, 3]
        for c in range(n_rows):
            s = cl_sub[c]
            if s < 0 or not all_stamped(TM, terms, cl_off[c], cl_off[c] + cl_len[c], stamp):
                continue
            if not hits_region(kind, bbox, circ, s, m_kind[q] == 0, x0, y0, x1, y1, m_geom[q]):
                continue
            out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, n_clauses[s] > 1)
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp


def scan_all(store: SubscriptionStore, batch: EncodedMessages, scratch: Stamps):
    """Every live clause against every message: the reference kernel (and the doctest's index)."""
    out_m, out_s, scratch.stamp = _scan_all(
        store.cl_sub,
        store.cl_off,
        store.cl_len,
        store.terms,
        store.n_clause_rows,
        store.kind,
        store.bbox,
        store.circ,
        store.n_clauses,
        scratch.TM,
        scratch.SM,
        scratch.stamp,
        batch.off,
        batch.terms,
        batch.kind,
        batch.geom,
    )
    return out_m, out_s
