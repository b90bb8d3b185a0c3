"""Columnar storage of subscriptions for the AP-Tree: one row per subscription slot, one per DNF
clause, a pool of interned term ids. No Python object is kept per subscription except its id string.

Term ids are ranks in the global keyword order (0 = first). ``reorder_terms`` renumbers them after
a bulk load; terms first seen later are appended at the end of the order, except after a
"rare-first" renumbering: that one leaves as many ids as it ranked free below the ranked terms,
and terms first seen later take them from the top down, so that each ranks before every older
term (one holder so far: the rarest there is) until the reserve is used up (docs/APTREE.md,
departure 13).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from shard.aptree.vocab import VocabTable, span_ids
from shard.errors import NotFoundError, ValidationError
from shard.geometry import region_columns
from shard.model import Subscription

if TYPE_CHECKING:
    from shard.wire_subscribes import PlainSubscribes

HEADROOM = 8
"""A column grown to hold ``need`` rows gets ``need // HEADROOM`` more than asked, or doubles,
whichever is more; a column laid out anew (``relayout``, after every whole build) gets as
much. Without it a bulk load left every column full, and the first Subscribe after
it copied them all (~110 ms of the round at 1M subscriptions, a stall seen by every call in that
round; docs/BENCHMARKS.md, twenty-eighth session)."""


@njit(cache=True)
def _sort_run(terms, a, b):
    """Sort ``terms[a:b]`` in place: insertion sort, a clause being a few terms long."""
    for i in range(a + 1, b):
        v = terms[i]
        j = i - 1
        while j >= a and terms[j] > v:
            terms[j + 1] = terms[j]
            j -= 1
        terms[j + 1] = v


@njit(cache=True)
def _sort_clause_terms(cl_off, cl_len, terms, n_clauses):
    """Sort each clause's term ids in place (``np.sort`` of each slice allocated a copy a
    clause: 12.8 of a 115 ms rebuild of 50,000 place names)."""
    for c in range(n_clauses):
        _sort_run(terms, cl_off[c], cl_off[c] + cl_len[c])


@njit(cache=True)
def _sort_runs(lens, terms):
    """Sort each run of ``terms`` (``lens[c]`` long, one after another) in place."""
    a = 0
    for c in range(lens.shape[0]):
        _sort_run(terms, a, a + lens[c])
        a += lens[c]


@njit(cache=True)
def _clause_term_ids(tab, kb, id_of_key, buf, starts, ends, lens, out):
    """The id of every term of a round's clauses (``buf[starts[i]:ends[i]]``, clauses ``lens``
    long) into ``out``, each clause's ascending, in one call; returns how many terms the
    vocabulary lacks (-1 in ``out``, nothing sorted: the caller adds them, then sorts)."""
    missing = span_ids(tab, kb, id_of_key, buf, starts, ends, out)
    if missing == 0:
        _sort_runs(lens, out)
    return missing


class SubscriptionStore:
    """Subscriptions as columns.

    Slots: ``kind`` (0 rect, 1 circle), ``bbox`` [n, 4], ``circ`` [n, 3] (lon, lat, radius m),
    ``first_clause``/``n_clauses``. Clauses: ``cl_sub`` (slot), ``cl_off``/``cl_len`` into
    ``terms`` (term ids ascending). Freed slots and clause blocks are recycled.
    """

    def __init__(self, slot_cap: int = 1024, clause_cap: int = 1024, term_cap: int = 4096) -> None:
        self.kind = np.zeros(slot_cap, np.int8)
        self.bbox = np.zeros((slot_cap, 4), np.float64)
        self.circ = np.zeros((slot_cap, 3), np.float64)
        self.first_clause = np.full(slot_cap, -1, np.int64)
        self.n_clauses = np.zeros(slot_cap, np.int32)
        self.cl_sub = np.full(clause_cap, -1, np.int32)
        self.cl_off = np.zeros(clause_cap, np.int64)
        self.cl_len = np.zeros(clause_cap, np.int32)
        self.terms = np.zeros(term_cap, np.int32)
        self.n_slots = 0
        self.n_clause_rows = 0
        self.n_terms = 0
        self.term_garbage = 0
        self.ids = np.full(slot_cap, None, dtype=object)
        """Subscription id per slot (None when free); an object array so results map in one take."""
        self.slot_of: dict[str, int] = {}
        self.free_slots: list[int] = []
        self.free_clauses: dict[int, list[int]] = {}
        self.vocab: dict[str, int] = {}
        self.vocab_terms: list[str | None] = []  # None: a reserved id (``_reserve_left``)
        self._table = VocabTable()
        self._table_ids = 0  # the terms of ids below this are in _table (none renumbered since)
        self._reserve_left = 0
        """Ids ``[0, _reserve_left)`` are free for new terms, handed out from the top down (a
        "rare-first" ``reorder_terms`` reserved them; ``vocab_terms`` holds None there)."""
        self._reserved_new: list[tuple[str, int]] = []  # handed out, not yet in _table
        self.moving = np.zeros(slot_cap, np.bool_)
        self.vel = np.zeros((slot_cap, 2), np.float64)
        """Estimated velocity (degrees/s, lon and lat) of a moving subscription (Sect. 4.3.1)."""
        self.upd_dt = np.zeros(slot_cap, np.float64)
        """Estimated seconds between its location updates (0: not known yet)."""
        self.last_t = np.full(slot_cap, -np.inf)
        """Time of its last location update (or subscription)."""
        self.extra = np.zeros(slot_cap, np.int32)
        """0, or 1 + the row of the subscription's conditions that this index does not check
        (NOT, a polygon, predicates: ``shard.conditions``): its matches are candidates, checked
        by the owner of those rows (``shard.residual``, ``StaticChecker``)."""
        self.tag = np.full(slot_cap, -1, np.int32)
        """The owner's number for the subscription (the coordinator's slot), reported instead of
        its id where deliveries are counted in bulk (``publish_tagged``); -1: none given."""

    # ---- sizes --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.slot_of)

    def columns(self):
        """The tuple the kernels take: (kind, bbox, circ, cl_sub, cl_off, cl_len, terms, vel,
        upd_dt, n_clauses)."""
        return (
            self.kind,
            self.bbox,
            self.circ,
            self.cl_sub,
            self.cl_off,
            self.cl_len,
            self.terms,
            self.vel,
            self.upd_dt,
            self.n_clauses,
        )

    # ---- vocabulary -----------------------------------------------------------------------
    def term_id(self, term: str) -> int:
        tid = self.vocab.get(term)
        if tid is None:
            if self._reserve_left:
                self._reserve_left -= 1
                tid = self._reserve_left
                self.vocab_terms[tid] = term
                self._reserved_new.append((term, tid))
            else:
                tid = len(self.vocab_terms)
                self.vocab_terms.append(term)
            self.vocab[term] = tid
        return tid

    def vocab_table(self) -> VocabTable:
        """``vocab`` as a compiled table (``shard.aptree.vocab``), brought up to date with the
        terms added since it was last asked for. O(new terms)."""
        if self._reserved_new:
            new = self._reserved_new
            self._table.add([t for t, _ in new], [i for _, i in new])
            self._reserved_new = []
        n = len(self.vocab_terms)
        if self._table_ids < n:
            self._table.add(self.vocab_terms[self._table_ids :], range(self._table_ids, n))
            self._table_ids = n
        return self._table

    def encode_terms(self, terms: Iterable[str]) -> list[int]:
        """Known term ids of a message's terms, ascending; unknown terms cannot match and are dropped."""
        get = self.vocab.get
        ids = [t for t in map(get, terms) if t is not None]
        ids.sort()
        return ids

    # ---- growth ---------------------------------------------------------------------------
    def _grow_slots(self, need: int) -> None:
        cap = self.kind.shape[0]
        if need <= cap:
            return
        cap = _capacity(need, cap)
        self.kind = _resized(self.kind, cap)
        self.bbox = _resized(self.bbox, cap)
        self.circ = _resized(self.circ, cap)
        self.first_clause = _resized(self.first_clause, cap, -1)
        self.n_clauses = _resized(self.n_clauses, cap)
        self.moving = _resized(self.moving, cap)
        self.vel = _resized(self.vel, cap)
        self.upd_dt = _resized(self.upd_dt, cap)
        self.last_t = _resized(self.last_t, cap, -np.inf)
        self.tag = _resized(self.tag, cap, -1)
        self.extra = _resized(self.extra, cap)
        self.ids = _resized(self.ids, cap, None)

    def _grow_clauses(self, need: int) -> None:
        cap = self.cl_sub.shape[0]
        if need <= cap:
            return
        cap = _capacity(need, cap)
        self.cl_sub = _resized(self.cl_sub, cap, -1)
        self.cl_off = _resized(self.cl_off, cap)
        self.cl_len = _resized(self.cl_len, cap)

    def _grow_terms(self, need: int) -> None:
        if need <= self.terms.shape[0]:
            return
        if self.term_garbage > self.n_terms // 2:
            self._compact_terms()
            if need - self.term_garbage <= self.terms.shape[0]:
                return
        self.terms = _resized(self.terms, _capacity(need, self.terms.shape[0]))

    def _compact_terms(self) -> None:
        live = np.flatnonzero(self.cl_sub[: self.n_clause_rows] >= 0)
        new = np.zeros_like(self.terms)
        pos = 0
        for c in live:
            a, n = int(self.cl_off[c]), int(self.cl_len[c])
            new[pos : pos + n] = self.terms[a : a + n]
            self.cl_off[c] = pos
            pos += n
        self.terms = new
        self.n_terms = pos
        self.term_garbage = 0

    # ---- rows ---------------------------------------------------------------------------
    def add(self, sub: Subscription) -> tuple[int, np.ndarray]:
        """Store a new subscription (its id must not be present). Returns (slot, clause ids). O(terms)."""
        clause_ids = [[self.term_id(t) for t in clause] for clause in sub.clauses]
        slot = self.free_slots.pop() if self.free_slots else self._new_slot()
        kind, bb, circ = region_columns(sub.region)
        self._init_rows(slot, kind, bb, circ, sub.moving)
        k = len(clause_ids)
        first = self._clause_rows(k)
        self._grow_clauses(self.n_clause_rows)
        n_t = sum(len(c) for c in clause_ids)
        self._grow_terms(self.n_terms + n_t)
        pos = self.n_terms
        for i, ids in enumerate(clause_ids):
            ids.sort()
            c = first + i
            self.cl_sub[c] = slot
            self.cl_off[c] = pos
            self.cl_len[c] = len(ids)
            self.terms[pos : pos + len(ids)] = ids
            pos += len(ids)
        self.n_terms = pos
        self.first_clause[slot] = first
        self.n_clauses[slot] = k
        self.ids[slot] = sub.id
        self.slot_of[sub.id] = slot
        return slot, np.arange(first, first + k, dtype=np.int32)

    def add_many(self, subs: Sequence[Subscription]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``add`` of many new subscriptions (distinct ids, none present) with each column
        written once for the batch: (slots, every clause id, offsets: the clause ids of
        ``subs[i]`` are ``clauses[off[i]:off[i + 1]]``). A shard adds a round's new
        subscriptions so; one by one, the numpy writes of ``add`` cost about as much as the
        rest of its work. O(terms)."""
        n = len(subs)
        if n == 1:  # (the batch's numpy writes cost more than ``add``'s for one: 47 against ~12 µs)
            slot, clauses = self.add(subs[0])
            return np.array([slot], np.int64), clauses, np.array([0, clauses.shape[0]], np.int64)
        term_id = self.term_id
        known = self.vocab.get
        n_cl: list[int] = []
        lens: list[int] = []
        flat: list[int] = []
        for s in subs:
            n_cl.append(len(s.clauses))
            for clause in s.clauses:
                lens.append(len(clause))
                flat += sorted([i if (i := known(t)) is not None else term_id(t) for t in clause])
        kinds, boxes, circles = zip(*[region_columns(s.region) for s in subs], strict=True)
        return self._add_rows(
            [s.id for s in subs], kinds, boxes, circles, [s.moving for s in subs], n_cl, lens, flat
        )

    def add_plain(self, p: PlainSubscribes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``add_many`` of a round read as columns (``shard.wire_subscribes``; ids distinct, none
        present), with their tags: the terms looked up from the round's bytes in the compiled
        vocabulary, only the unknown ones decoded and added one by one. O(terms)."""
        t = self.vocab_table()
        tids = np.empty(p.term_start.shape[0], np.int32)
        lens = p.clause_len
        if _clause_term_ids(t.tab, t.kb, t.id_of_key, p.buf, p.term_start, p.term_stop, lens, tids):
            term_id = self.term_id
            new = np.flatnonzero(tids < 0)
            for i in new.tolist():  # (a term dropped from the table is still in ``vocab``)
                tids[i] = term_id(p.term(i))
            t.add_spans(p.buf, p.term_start[new], p.term_stop[new], tids[new])
            self._table_ids, self._reserved_new = len(self.vocab_terms), []  # all in ``t`` now
            _sort_runs(lens, tids)
        out = self._add_rows(p.ids, p.kind, p.bbox, p.circle, p.moving, p.n_clauses, lens, tids)
        self.tag[out[0]] = p.tags
        return out

    def _add_rows(self, ids, kinds, boxes, circles, moving, n_cl, lens, flat):
        """The rows of new subscriptions ``ids`` (distinct, none present) from their columns:
        regions, moving flags, clauses per subscription ``n_cl``, terms per clause ``lens``,
        every clause's term ids ``flat`` (each clause's ascending). Returns ``add_many``'s."""
        n = len(ids)
        free = self.free_slots
        taken = [free.pop() for _ in range(min(len(free), n))]
        start = self.n_slots
        self.n_slots += n - len(taken)
        self._grow_slots(self.n_slots)
        slot_list = taken + list(range(start, self.n_slots))
        slots = np.array(slot_list, np.int64)
        # rows all new (no freed one reused) are written through slices, cheaper than an index
        at = slots if taken else slice(start, self.n_slots)
        self._init_rows(at, kinds, boxes, circles, moving)
        n_terms = len(flat)
        self._grow_terms(self.n_terms + n_terms)  # may compact: positions are taken after it
        reuse = any(self.free_clauses.values())
        first_row = self.n_clause_rows
        n_cl = np.asarray(n_cl, np.int64)
        firsts = []
        rows: list[int] = []
        for k in n_cl.tolist():
            first = self._clause_rows(k)
            firsts.append(first)
            if reuse:
                rows.extend(range(first, first + k))
        self._grow_clauses(self.n_clause_rows)
        if reuse:
            r = np.array(rows, np.int64)
            cl_at = r
        else:
            r = np.arange(first_row, self.n_clause_rows, dtype=np.int64)
            cl_at = slice(first_row, self.n_clause_rows)
        pos = self.n_terms
        offs = np.empty(len(lens) + 1, np.int64)
        offs[0] = pos
        np.cumsum(lens, out=offs[1:])
        offs[1:] += pos
        self.cl_sub[cl_at] = np.repeat(slots, n_cl)
        self.cl_off[cl_at] = offs[:-1]
        self.cl_len[cl_at] = lens
        self.terms[pos : pos + n_terms] = flat
        self.n_terms = pos + n_terms
        self.first_clause[at] = firsts
        self.n_clauses[at] = n_cl
        self.ids[at] = ids
        self.slot_of.update(zip(ids, slot_list, strict=True))
        off = np.zeros(n + 1, np.int64)
        np.cumsum(n_cl, out=off[1:])
        return slots, r.astype(np.int32), off

    def _init_rows(self, slots, kind, bbox, circ, moving) -> None:
        """The columns of new subscription rows ``slots`` (a slot, or an array of them with a
        value or a sequence per column): region, moving flag, no motion known yet, no tag."""
        self.kind[slots] = kind
        self.bbox[slots] = bbox
        self.circ[slots] = circ
        self.moving[slots] = moving
        self.vel[slots] = 0.0
        self.upd_dt[slots] = 0.0
        self.last_t[slots] = -np.inf
        self.tag[slots] = -1
        self.extra[slots] = 0

    def _clause_rows(self, k: int) -> int:
        """The first of ``k`` consecutive clause rows: a freed block of ``k``, else new rows
        (the caller grows the clause columns to ``n_clause_rows``)."""
        block = self.free_clauses.get(k)
        if block:
            return block.pop()
        first = self.n_clause_rows
        self.n_clause_rows += k
        return first

    def add_bulk(self, subs: Iterable[Subscription]) -> int:
        """Append many subscriptions to an empty store in one pass (the bulk-load path: columns
        are gathered in compact ``array.array`` buffers, then copied once). A repeated id
        replaces the earlier row. Returns the number of live subscriptions. O(total terms)."""
        if self.n_slots:
            raise RuntimeError("add_bulk needs an empty store")
        kinds, moving = array("b"), array("b")
        boxes, circs = array("d"), array("d")
        n_cl, cl_len, terms = array("i"), array("i"), array("i")
        ids: list[str | None] = []
        slot_of: dict[str, int] = {}
        dead: list[int] = []
        term_id = self.term_id
        for sub in subs:
            kind, bb, circ = region_columns(sub.region)
            slot = len(ids)
            old = slot_of.get(sub.id)
            if old is not None:
                dead.append(old)
                ids[old] = None
            slot_of[sub.id] = slot
            ids.append(sub.id)
            kinds.append(kind)
            moving.append(1 if sub.moving else 0)
            boxes.extend(bb)
            circs.extend(circ)
            n_cl.append(len(sub.clauses))
            for clause in sub.clauses:
                cl_len.append(len(clause))
                terms.extend(sorted(term_id(t) for t in clause))
        n = len(ids)
        self._grow_slots(max(n, 1))
        self.kind[:n] = np.frombuffer(kinds, np.int8)
        self.moving[:n] = np.frombuffer(moving, np.int8).astype(bool)
        self.bbox[:n] = np.frombuffer(boxes, np.float64).reshape(n, 4)
        self.circ[:n] = np.frombuffer(circs, np.float64).reshape(n, 3)
        ncl = np.frombuffer(n_cl, np.int32)
        self.n_clauses[:n] = ncl
        first = np.zeros(n, np.int64)
        np.cumsum(ncl[:-1], out=first[1:])
        self.first_clause[:n] = first
        k = len(cl_len)
        self._grow_clauses(max(k, 1))
        lens = np.frombuffer(cl_len, np.int32)
        self.cl_len[:k] = lens
        self.cl_sub[:k] = np.repeat(np.arange(n, dtype=np.int32), ncl)
        offs = np.zeros(k, np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        self.cl_off[:k] = offs
        self._grow_terms(max(len(terms), 1))
        self.terms[: len(terms)] = np.frombuffer(terms, np.int32)
        self.n_slots, self.n_clause_rows, self.n_terms = n, k, len(terms)
        self.ids[:n] = ids
        self.slot_of = slot_of
        for slot in dead:
            self.slot_of[f"\x00dead{slot}"] = slot  # let remove() recycle the replaced row
            self.ids[slot] = f"\x00dead{slot}"
            self.remove(f"\x00dead{slot}")
        return len(self.slot_of)

    def _new_slot(self) -> int:
        slot = self.n_slots
        self.n_slots += 1
        self._grow_slots(self.n_slots)
        return slot

    def clauses_of(self, slot: int) -> np.ndarray:
        first = int(self.first_clause[slot])
        return np.arange(first, first + int(self.n_clauses[slot]), dtype=np.int32)

    def slot(self, sub_id: str) -> int:
        try:
            return self.slot_of[sub_id]
        except KeyError:
            raise NotFoundError("subscription", sub_id) from None

    def remove(self, sub_id: str) -> int:
        """Forget a subscription whose clauses are already out of the tree. Returns its slot."""
        slot = self.slot(sub_id)
        del self.slot_of[sub_id]
        self.ids[slot] = None
        self.tag[slot] = -1
        self.extra[slot] = 0
        first, k = int(self.first_clause[slot]), int(self.n_clauses[slot])
        for c in range(first, first + k):
            self.term_garbage += int(self.cl_len[c])
            self.cl_sub[c] = -1
            self.cl_len[c] = 0
        self.free_clauses.setdefault(k, []).append(first)
        self.first_clause[slot] = -1
        self.n_clauses[slot] = 0
        self.bbox[slot] = (np.inf, np.inf, -np.inf, -np.inf)  # matches nothing
        self.free_slots.append(slot)
        return slot

    def live_clauses(self) -> np.ndarray:
        return np.flatnonzero(self.cl_sub[: self.n_clause_rows] >= 0).astype(np.int32)

    # ---- locality ---------------------------------------------------------------------------
    def relayout(self, order: np.ndarray) -> np.ndarray:
        """Renumber the live slots in ``order`` (every live slot exactly once), lay their clauses
        and terms out in that order, and drop the free rows. Returns the new id of every old
        clause row (-1 for dead rows). After a build, ``order`` is the leaf order of the tree, so
        the subscriptions one leaf verifies lie next to each other in memory. O(slots + terms)."""
        order = np.asarray(order, np.int64)
        n = order.shape[0]
        if n != len(self.slot_of):
            raise RuntimeError("relayout needs every live slot exactly once")
        ncl = self.n_clauses[order].astype(np.int64)
        old_first = self.first_clause[order]
        new_first = np.zeros(n, np.int64)
        np.cumsum(ncl[:-1], out=new_first[1:])
        k = int(ncl.sum())
        old_rows = np.repeat(old_first, ncl) + _ragged_arange(ncl)
        new_of_old = np.full(self.n_clause_rows, -1, np.int64)
        new_of_old[old_rows] = np.arange(k)
        lens = self.cl_len[old_rows]
        t_old = np.repeat(self.cl_off[old_rows], lens) + _ragged_arange(lens)
        terms = self.terms[t_old]
        offs = np.zeros(k, np.int64)
        np.cumsum(lens[:-1].astype(np.int64), out=offs[1:])
        slot_cap = max(n + n // HEADROOM, 1024)
        for name in ("kind", "bbox", "circ", "moving", "vel", "upd_dt", "last_t", "tag", "extra"):
            col = getattr(self, name)
            fresh = np.full((slot_cap,) + col.shape[1:], -1 if name == "tag" else 0, col.dtype)
            fresh[:n] = col[order]
            setattr(self, name, fresh)
        ids = np.full(slot_cap, None, dtype=object)
        ids[:n] = self.ids[order]
        self.ids = ids
        self.first_clause = np.full(slot_cap, -1, np.int64)
        self.first_clause[:n] = new_first
        self.n_clauses = np.zeros(slot_cap, np.int32)
        self.n_clauses[:n] = ncl
        cap = max(k + k // HEADROOM, 1024)
        self.cl_sub = np.full(cap, -1, np.int32)
        self.cl_sub[:k] = np.repeat(np.arange(n, dtype=np.int32), ncl)
        self.cl_off = np.zeros(cap, np.int64)
        self.cl_off[:k] = offs
        self.cl_len = np.zeros(cap, np.int32)
        self.cl_len[:k] = lens
        self.terms = np.zeros(max(terms.shape[0] + terms.shape[0] // HEADROOM, 4096), np.int32)
        self.terms[: terms.shape[0]] = terms
        self.n_slots, self.n_clause_rows, self.n_terms = n, k, int(terms.shape[0])
        self.term_garbage = 0
        self.free_slots = []
        self.free_clauses = {}
        self.slot_of = dict(zip(ids[:n].tolist(), range(n), strict=True))
        return new_of_old

    # ---- global keyword order -----------------------------------------------------------------
    def term_frequencies(self) -> np.ndarray:
        """Occurrences of each term id over the live clauses. O(terms)."""
        live = self.live_clauses()
        counts = np.zeros(len(self.vocab_terms), np.int64)
        if live.size:
            lens = self.cl_len[live]
            idx = np.repeat(self.cl_off[live], lens) + _ragged_arange(lens)
            counts += np.bincount(self.terms[idx], minlength=len(self.vocab_terms))
        return counts

    def reorder_terms(
        self, order: str | list[str] = "frequency", keep: np.ndarray | None = None
    ) -> np.ndarray:
        """Renumber term ids so that id = rank in the global keyword order, then re-sort every
        clause; returns the new id of every old id, -1 for a term dropped. ``order`` is
        "frequency" (decreasing frequency over subscription keywords, the paper's default),
        "rare-first" (increasing frequency), "alphabetical", or an explicit list of terms ranked
        first (the rest follow by decreasing frequency). "rare-first" ranks the k terms kept at
        ids k to 2k - 1 and leaves 0 to k - 1 for terms first seen later (``term_id``): a term
        that arrives after the renumbering is held once, and with ids appended it would rank
        as the commonest and a clause would be filed under an older, commoner term of its own
        (a tree grown so verified twice a fresh build's entries: docs/BENCHMARKS.md).

        Terms no live subscription holds are dropped, unless ``keep`` (a mask over the old ids:
        the terms live messages hold) keeps them: the vocabulary follows the subscriptions down as
        well as up, and a whole rebuild costs O(live terms), not O(every term ever seen).
        O(terms + V log V)."""
        freq = self.term_frequencies()
        v = len(self.vocab_terms)
        held = freq > 0
        if keep is not None:
            held[: keep.shape[0]] |= keep[:v]
        # only the terms kept are ranked (ascending ids, so the stable sorts break ties by id
        # as a ranking of every term would): after churn most of the vocabulary is dropped
        cand = np.flatnonzero(held)
        if isinstance(order, str):
            if order == "frequency":
                rank_of_old = cand[np.argsort(-freq[cand], kind="stable")]
            elif order == "rare-first":
                rank_of_old = cand[np.argsort(freq[cand], kind="stable")]
            elif order == "alphabetical":
                terms = self.vocab_terms
                rank_of_old = np.array(sorted(cand.tolist(), key=terms.__getitem__), np.int64)
            else:
                raise ValidationError(
                    "keyword_order",
                    order,
                    "must be 'frequency', 'rare-first', 'alphabetical' or a list of terms",
                )
        else:
            first = [self.vocab[t] for t in order if t in self.vocab]
            first = [i for i in dict.fromkeys(first) if held[i]]
            seen = set(first)
            rest = [
                i for i in cand[np.argsort(-freq[cand], kind="stable")].tolist() if i not in seen
            ]
            rank_of_old = np.array(first + rest, np.int64)
        k = rank_of_old.shape[0]
        reserve = k if isinstance(order, str) and order == "rare-first" else 0
        new_id = np.full(v, -1, np.int32)
        new_id[rank_of_old] = np.arange(reserve, reserve + k, dtype=np.int32)
        # a table mostly of dropped keys is not brought up to date and renumbered, but made anew
        # from the live ones (after churn: ~9 ms of 25 for a rebuild at 1,190 subscriptions);
        # nor is one that would have to take in more terms than it holds to be renumbered (the
        # terms added since messages last needed it: a shard that only took subscribes meanwhile
        # spent 5 ms of a 23 ms rebuild at 4,776 filling it), which fills anew when next asked
        pending = len(self._reserved_new) + max(0, v - self._table_ids)
        fresh = max(len(self._table), v) > 2 * k + 4096 or pending > len(self._table)
        if not fresh:
            self.vocab_table().renumber(new_id)
        if self.n_terms:  # (a freed clause block may hold -1, a dropped term: it is never read)
            t = self.terms[: self.n_terms]
            ok = t >= 0
            t[ok] = new_id[t[ok]]
        terms = self.vocab_terms
        ranked = list(map(terms.__getitem__, rank_of_old.tolist()))
        self.vocab = dict(zip(ranked, range(reserve, reserve + k), strict=True))
        self.vocab_terms = [None] * reserve + ranked
        self._reserve_left = reserve
        self._reserved_new = []  # (the table was brought up to date above, or is made anew)
        if fresh:
            self._table, self._table_ids = VocabTable(), reserve
        else:
            self._table_ids = reserve + k
        _sort_clause_terms(self.cl_off, self.cl_len, self.terms, self.n_clause_rows)
        return new_id


def _capacity(need: int, cap: int) -> int:
    """The new capacity of a column of capacity ``cap`` that must hold ``need`` rows."""
    return max(need + need // HEADROOM, 2 * cap)


def _resized(a: np.ndarray, cap: int, fill=0) -> np.ndarray:
    out = np.full((cap,) + a.shape[1:], fill, a.dtype)
    out[: a.shape[0]] = a
    return out


def _ragged_arange(lens: np.ndarray) -> np.ndarray:
    """Concatenated aranges 0..len-1 for each length."""
    total = int(lens.sum())
    ends = np.cumsum(lens)
    return np.arange(total) - np.repeat(ends - lens, lens)
