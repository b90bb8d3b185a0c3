"""The baseline for moving subscriptions: an AP-Tree for message matching plus a plain uniform
grid of live messages; a moved subscription is re-evaluated from scratch over the grid cells its
old and new regions meet. Same operations and updates as ``APPlusTree``; compiled like it.

The grid's cell size is a parameter (``cell_deg``); ``geopubsub bench moving --index naive
--naive-cell`` picks it, and docs/BENCHMARKS.md records the sweep that chose the default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from shard.applus.messages import MessageStore
from shard.applus.mlists import MS_ALIVE, change_of, push_update
from shard.applus.tree import Update, recentre, subscription_form
from shard.aptree.match import grown
from shard.aptree.tree import APTree, EncodedMessages
from shard.errors import ValidationError
from shard.geometry import KIND_CIRCLE
from shard.model import Circle, Message, Point, Rect, Subscription

DEFAULT_CELL_DEG = 1.0


@njit(cache=True)
def _cells(x0, y0, x1, y1, cell, nx, ny):
    a0 = min(max(int((x0 + 180.0) / cell), 0), nx - 1)
    a1 = min(max(int((x1 + 180.0) / cell), 0), nx - 1)
    b0 = min(max(int((y0 + 90.0) / cell), 0), ny - 1)
    b1 = min(max(int((y1 + 90.0) / cell), 0), ny - 1)
    return a0, a1, b0, b1


@njit(cache=True)
def _grid_insert(head, nxt_slot, nxt_link, n_links, x, geom, cell, nx, ny):
    """Put message slot x into every cell its location meets (a linked list per cell)."""
    a0, a1, b0, b1 = _cells(geom[x, 0], geom[x, 1], geom[x, 2], geom[x, 3], cell, nx, ny)
    for a in range(a0, a1 + 1):
        for b in range(b0, b1 + 1):
            k = a * ny + b
            if n_links == nxt_slot.shape[0]:
                nxt_slot = grown(nxt_slot, n_links)
                nxt_link = grown(nxt_link, n_links)
            nxt_slot[n_links] = x
            nxt_link[n_links] = head[k]
            head[k] = n_links
            n_links += 1
    return nxt_slot, nxt_link, n_links


@njit(cache=True)
def _grid_diff(head, nxt_slot, nxt_link, cell, nx, ny, MS, MSTAMP, stamp, TM, ts, o, n):
    """± updates of a subscription from old form ``o`` to new form ``n`` (each: clause offsets,
    clause terms, kind, bbox, circle), checking every live message in the cells either meets."""
    alive = MS[MS_ALIVE]
    out_x = np.empty(64, np.int32)
    out_g = np.empty(64, np.int8)
    cnt = 0
    for form in range(2):
        bb = o[3] if form == 0 else n[3]
        a0, a1, b0, b1 = _cells(bb[0], bb[1], bb[2], bb[3], cell, nx, ny)
        for a in range(a0, a1 + 1):
            for b in range(b0, b1 + 1):
                link = head[a * ny + b]
                while link >= 0:
                    x = nxt_slot[link]
                    link = nxt_link[link]
                    if not alive[x] or MSTAMP[x] == stamp:
                        continue
                    MSTAMP[x] = stamp
                    g, ts = change_of(MS, x, TM, ts, True, *o, True, *n)
                    if g != 0:
                        out_x, out_g, cnt = push_update(out_x, out_g, cnt, x, g)
    return out_x[:cnt].copy(), out_g[:cnt].copy(), ts


class NaiveMoving:
    """An AP-Tree (stationary matching) and a uniform grid of live messages."""

    def __init__(self, tree: APTree | None = None, *, cell_deg: float = DEFAULT_CELL_DEG) -> None:
        if not 0 < cell_deg <= 180:
            raise ValidationError("cell_deg", cell_deg, "must be in (0, 180]")
        self.tree = tree if tree is not None else APTree()
        self.msgs = MessageStore()
        self.cell = float(cell_deg)
        self.nx = max(1, math.ceil(360.0 / self.cell))
        self.ny = max(1, math.ceil(180.0 / self.cell))
        self._reset_grid()
        self.now = -math.inf
        self._mstamp = np.zeros(1024, np.int64)
        self._stamp = 0
        self._tm = np.zeros(1024, np.int64)
        self._ts = 0

    def _reset_grid(self) -> None:
        self.head = np.full(self.nx * self.ny, -1, np.int64)
        self.nxt_slot = np.empty(1024, np.int32)
        self.nxt_link = np.empty(1024, np.int64)
        self.n_links = 0

    def _sync(self) -> None:
        if self.msgs.alive.shape[0] > self._mstamp.shape[0]:
            self._mstamp = np.zeros(2 * self.msgs.alive.shape[0], np.int64)
        v = len(self.tree.store.vocab_terms)
        if v > self._tm.shape[0]:
            self._tm = np.zeros(2 * v, np.int64)
        self.tree._extend_pw()
        self.tree._ensure_stamps()

    def advance(self, now: float) -> list[Update]:
        if not isinstance(now, (int, float)) or not math.isfinite(now) or now < self.now:
            raise ValidationError("now", now, f"must be finite and not before {self.now}")
        self.now = float(now)
        expired = self.msgs.pop_expired(self.now)
        if not expired:
            return []
        out_m, out_s = self.tree.match_encoded(
            EncodedMessages(*self.msgs.encoded(np.array(expired, np.int64)))
        )
        names = self.tree.store.ids[out_s].tolist()
        msgs = self.msgs.messages
        ups = [(s, "-", msgs[expired[q]].id) for s, q in zip(names, out_m.tolist(), strict=True)]
        if len(self.msgs.dead) > max(65536, len(self.msgs)):
            self._rebuild_grid()
        return ups

    def _rebuild_grid(self) -> None:
        self.msgs.release_dead()
        self._reset_grid()
        for x in np.flatnonzero(self.msgs.alive[: self.msgs.n_slots]).tolist():
            self._insert(x)

    def _insert(self, x: int) -> None:
        self.nxt_slot, self.nxt_link, self.n_links = _grid_insert(
            self.head,
            self.nxt_slot,
            self.nxt_link,
            self.n_links,
            x,
            self.msgs.geom,
            self.cell,
            self.nx,
            self.ny,
        )

    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        updates = self.advance(now)
        store = self.tree.store
        for m in messages:
            if m.ttl:
                if m.id in self.msgs.slot_of:
                    raise ValidationError("id", m.id, "a live message already has this id")
                ids = sorted({store.term_id(t) for t in m.terms})
                self._insert(self.msgs.add(m, ids, self.now + float(m.ttl)))
        self._sync()
        for m, ids in zip(messages, self.tree.match_batch(messages), strict=True):
            updates += [(s, "+", m.id) for s in ids]
        return updates

    def _form(self, slot: int):
        return subscription_form(self.tree.store, slot)

    def subscribe(self, sub: Subscription, now: float) -> list[Update]:
        updates = self.advance(now)
        self.tree.subscribe(sub)
        slot = self.tree.store.slot_of[sub.id]
        new = self._form(slot)
        none = (
            np.zeros(1, np.int64),
            np.zeros(0, np.int32),
            0,
            np.array([1.0, 1.0, -1.0, -1.0]),
            np.zeros(3),
        )
        return updates + self._diff(sub.id, none, new)

    def unsubscribe(self, sub_id: str) -> None:
        self.tree.unsubscribe(sub_id)

    def move(self, sub_id: str, point: Point, now: float) -> list[Update]:
        updates = self.advance(now)
        st = self.tree.store
        slot = st.slot(sub_id)
        old = self._form(slot)
        region = (
            Circle(*map(float, st.circ[slot]))
            if st.kind[slot] == KIND_CIRCLE
            else Rect(*map(float, st.bbox[slot]))
        )
        clauses = tuple(
            tuple(st.vocab_terms[t] for t in old[1][old[0][i] : old[0][i + 1]])
            for i in range(old[0].shape[0] - 1)
        )
        self.tree.subscribe(Subscription(sub_id, clauses, recentre(region, point), moving=True))
        new = self._form(self.tree.store.slot_of[sub_id])
        return updates + self._diff(sub_id, old, new)

    def move_batch(self, moves, now: float) -> list[Update]:
        updates = self.advance(now)
        for sub_id, point in moves:
            updates += self.move(sub_id, point, now)
        return updates

    def _diff(self, sub_id, old, new) -> list[Update]:
        self._sync()
        self._stamp += 1
        xs, gs, self._ts = _grid_diff(
            self.head,
            self.nxt_slot,
            self.nxt_link,
            self.cell,
            self.nx,
            self.ny,
            self.msgs.columns(),
            self._mstamp,
            self._stamp,
            self._tm,
            self._ts,
            old,
            new,
        )
        msgs = self.msgs.messages
        return [
            (sub_id, "+" if g > 0 else "-", msgs[x].id)
            for x, g in zip(xs.tolist(), gs.tolist(), strict=True)
        ]
