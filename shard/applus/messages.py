"""Live messages of the AP+-Tree as columns: one row (slot) per stored message.

A slot is recycled only after a purge has removed every m-list entry that names it, so an entry
never points at a different message than the one stored.
"""

from __future__ import annotations

import heapq

import numpy as np

from shard.model import Message, Point


class MessageStore:
    """``alive``, ``kind`` (0 point, 1 rect), ``geom`` [n, 4], ``expiry`` (t + ttl), terms as CSR
    (``toff``/``tlen`` into ``terms``, ids ascending), ``ids`` and ``messages`` (the objects, for
    deliveries). An expiry heap yields slots in expiry order."""

    def __init__(self, cap: int = 1024) -> None:
        self.alive = np.zeros(cap, np.bool_)
        self.kind = np.zeros(cap, np.int8)
        self.geom = np.zeros((cap, 4), np.float64)
        self.expiry = np.zeros(cap, np.float64)
        self.toff = np.zeros(cap, np.int64)
        self.tlen = np.zeros(cap, np.int32)
        self.terms = np.zeros(4 * cap, np.int32)
        self.n_terms = 0
        self.messages: list[Message | None] = [None] * cap
        self.slot_of: dict[str, int] = {}
        self.n_slots = 0
        self.free: list[int] = []
        self.dead: list[int] = []
        """Expired slots still named by m-list entries (freed by the next purge)."""
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self.slot_of)

    def columns(self):
        """The tuple the kernels take (see ``mlists``)."""
        return (self.alive, self.kind, self.geom, self.toff, self.tlen, self.terms)

    def _grow(self, need: int) -> None:
        cap = self.alive.shape[0]
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        for name in ("alive", "kind", "geom", "expiry", "toff", "tlen"):
            col = getattr(self, name)
            fresh = np.zeros((cap,) + col.shape[1:], col.dtype)
            fresh[: col.shape[0]] = col
            setattr(self, name, fresh)
        self.messages.extend([None] * (cap - len(self.messages)))

    def _grow_terms(self, extra: int) -> None:
        if self.n_terms + extra <= self.terms.shape[0]:
            return
        live = np.flatnonzero(self.alive[: self.n_slots])
        if self.n_terms > 2 * int(self.tlen[live].sum()) + 1024:
            self._compact_terms(live)  # expired messages leave their terms behind
        if self.n_terms + extra > self.terms.shape[0]:
            fresh = np.zeros(max(self.n_terms + extra, 2 * self.terms.shape[0]), np.int32)
            fresh[: self.n_terms] = self.terms[: self.n_terms]
            self.terms = fresh

    def _compact_terms(self, live: np.ndarray) -> None:
        fresh = np.zeros_like(self.terms)
        pos = 0
        for x in live.tolist():
            a, n = int(self.toff[x]), int(self.tlen[x])
            fresh[pos : pos + n] = self.terms[a : a + n]
            self.toff[x] = pos
            pos += n
        self.terms = fresh
        self.n_terms = pos

    def add(self, msg: Message, term_ids: list[int], expiry: float) -> int:
        """Store a live message (its id must not be live). Returns its slot."""
        slot = self.free.pop() if self.free else self.n_slots
        if slot == self.n_slots:
            self.n_slots += 1
            self._grow(self.n_slots)
        n = len(term_ids)
        self._grow_terms(n)
        self.terms[self.n_terms : self.n_terms + n] = term_ids
        self.toff[slot] = self.n_terms
        self.tlen[slot] = n
        self.n_terms += n
        loc = msg.location
        if type(loc) is Point:
            self.kind[slot] = 0
            self.geom[slot] = (loc.lon, loc.lat, loc.lon, loc.lat)
        else:
            self.kind[slot] = 1
            self.geom[slot] = (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat)
        self.expiry[slot] = expiry
        self.alive[slot] = True
        self.messages[slot] = msg
        self.slot_of[msg.id] = slot
        heapq.heappush(self._heap, (expiry, slot))
        return slot

    def add_batch(
        self,
        msgs: list[Message],
        off: np.ndarray,
        terms: np.ndarray,
        kind: np.ndarray,
        geom: np.ndarray,
        expiry: np.ndarray,
    ) -> np.ndarray:
        """Store several live messages at once (ids not live): their terms as CSR (``off``,
        ``terms``), location kinds and boxes, expiry times. Returns their slots."""
        n = len(msgs)
        reuse = min(n, len(self.free))
        slots = np.empty(n, np.int64)
        if reuse:
            slots[:reuse] = self.free[len(self.free) - reuse :][::-1]
            del self.free[len(self.free) - reuse :]
        slots[reuse:] = np.arange(self.n_slots, self.n_slots + n - reuse)
        self.n_slots += n - reuse
        self._grow(self.n_slots)
        total = int(off[-1] - off[0])
        self._grow_terms(total)
        self.terms[self.n_terms : self.n_terms + total] = terms[off[0] : off[-1]]
        self.toff[slots] = self.n_terms + (off[:-1] - off[0])
        self.tlen[slots] = np.diff(off)
        self.n_terms += total
        self.kind[slots] = kind
        self.geom[slots] = geom
        self.expiry[slots] = expiry
        self.alive[slots] = True
        messages, slot_of, heap = self.messages, self.slot_of, self._heap
        for m, x, e in zip(msgs, slots.tolist(), expiry.tolist(), strict=True):
            messages[x] = m
            slot_of[m.id] = x
            heapq.heappush(heap, (e, x))
        return slots

    def pop_expired(self, now: float) -> tuple[list[int], list[str]]:
        """Slots whose expiry is <= now, in expiry order, and their messages' ids; they are
        marked dead and their message objects let go now (a few each round: freeing all of
        them at the next purge stalled it for 50-100 ms)."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, slot = heapq.heappop(heap)
            out.append(slot)
        ids = []
        messages = self.messages
        for slot in out:
            self.alive[slot] = False
            mid = messages[slot].id
            messages[slot] = None
            del self.slot_of[mid]
            ids.append(mid)
            self.dead.append(slot)
        return out, ids

    def release_dead(self) -> None:
        """After a purge: dead slots are named by no list any more and can be reused."""
        self.free.extend(self.dead)
        self.dead = []

    def held_terms(self, v: int) -> np.ndarray:
        """A mask over term ids 0..v-1 of the terms live messages hold."""
        held = np.zeros(v, np.bool_)
        alive = np.flatnonzero(self.alive[: self.n_slots])
        if alive.size:
            held[self.encoded(alive)[1]] = True
        return held

    def remap_terms(self, new_id: np.ndarray) -> None:
        """Term ids were renumbered (a full rebuild): rewrite and re-sort every live message."""
        for x in np.flatnonzero(self.alive[: self.n_slots]).tolist():
            a, n = int(self.toff[x]), int(self.tlen[x])
            self.terms[a : a + n] = np.sort(new_id[self.terms[a : a + n]])

    def encoded(self, slots: np.ndarray):
        """(off, terms, kind, geom) of the given slots, as ``APTree.match_encoded`` takes them."""
        lens = self.tlen[slots].astype(np.int64)
        off = np.zeros(slots.shape[0] + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        idx = np.repeat(self.toff[slots], lens) + (
            np.arange(int(off[-1])) - np.repeat(off[:-1], lens)
        )
        return off, self.terms[idx], self.kind[slots], self.geom[slots]
