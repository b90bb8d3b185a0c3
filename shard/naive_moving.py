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
from shard.applus.mlists import MS_ALIVE, move_change_of, push_update
from shard.applus.moves import clause_form, recentre_columns
from shard.applus.tree import subscription_form
from shard.aptree.maintain import int_list, move_clauses
from shard.aptree.match import grown
from shard.aptree.tree import APTree, EncodedMessages
from shard.errors import ValidationError
from shard.model import ADD, REMOVE, Message, Point, Subscription, Update

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
def _grid_scan(head, nxt_slot, nxt_link, cell, nx, ny, MS, MSTAMP, stamp, TM, ts, o, n, out):
    """Append to ``out`` = (slots, signs, count) the ± updates of a subscription going from old
    form ``o`` to new form ``n`` (each: clause offsets, clause terms, kind, bbox, circle),
    checking every live message in the cells either region meets; returns (out, ts)."""
    alive = MS[MS_ALIVE]
    out_x, out_g, cnt = out
    for form in range(2):
        bb = o[3] if form == 0 else n[3]
        if bb[0] > bb[2]:
            continue  # the empty form of a new subscription
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
                    g, ts = move_change_of(
                        MS, x, TM, ts, n[0], n[1], o[2], o[3], o[4], n[2], n[3], n[4]
                    )
                    if g != 0:
                        out_x, out_g, cnt = push_update(out_x, out_g, cnt, x, g)
    return (out_x, out_g, cnt), ts


@njit(cache=True)
def _grid_diff(head, nxt_slot, nxt_link, cell, nx, ny, MS, MSTAMP, stamp, TM, ts, o, n):
    out = (np.empty(64, np.int32), np.empty(64, np.int8), 0)
    out, ts = _grid_scan(
        head, nxt_slot, nxt_link, cell, nx, ny, MS, MSTAMP, stamp, TM, ts, o, n, out
    )
    return out[0][: out[2]].copy(), out[1][: out[2]].copy(), ts


@njit(cache=True)
def _move_batch_kernel(T, S, params, fc, ncl, slots, px, py, G, MS, MSTAMP, stamp, TM, ts, scan):
    """The baseline's location updates, in order, in one compiled call: move the subscription's
    clauses in the AP-Tree (as the AP+-Tree does) and re-evaluate it from scratch over the grid
    cells of its old and new regions. Returns (tree, move index, message slot and sign of every
    update, nodes to rebuild, last stamp, last term stamp). Without ``scan`` only the tree is
    updated (no updates computed: the benchmark's sampling, see ``move_batch``)."""
    head, nxt_slot, nxt_link, cell, nx, ny = G
    kind = S[0]
    bbox = S[1]
    circ = S[2]
    todo = int_list()
    out = (np.empty(64, np.int32), np.empty(64, np.int8), 0)
    q = np.empty(64, np.int64)
    for i in range(slots.shape[0]):
        s = slots[i]
        clauses = np.arange(fc[s], fc[s] + ncl[s]).astype(np.int32)
        off, terms = clause_form(S, s, fc, ncl)
        old = (off, terms, kind[s], bbox[s].copy(), circ[s].copy())
        recentre_columns(kind, bbox, circ, s, px[i], py[i])
        T, todo1, _, _, _ = move_clauses(T, S, params, clauses, old[3])
        for u in todo1:
            todo.append(u)
        new = (off, terms, kind[s], bbox[s].copy(), circ[s].copy())
        if not scan:
            continue
        stamp += 1
        c0 = out[2]
        out, ts = _grid_scan(
            head, nxt_slot, nxt_link, cell, nx, ny, MS, MSTAMP, stamp, TM, ts, old, new, out
        )
        while q.shape[0] < out[2]:
            q = grown(q, q.shape[0])
        q[c0 : out[2]] = i
    at = np.empty(len(todo), np.int64)
    for j in range(len(todo)):
        at[j] = todo[j]
    n = out[2]
    return T, q[:n].copy(), out[0][:n].copy(), out[1][:n].copy(), np.unique(at), stamp, ts


class MessageGrid:
    """Live messages (slots of a ``MessageStore``) on a uniform grid of ``cell_deg`` degrees: a
    linked list per cell, a message in every cell its location meets. ``diff`` re-evaluates a
    subscription going from one form to another over the cells either region meets. ``mstamp``
    (per message), ``tm`` (per term) and their last stamps ``stamp`` / ``ts`` are the kernels'
    scratch."""

    def __init__(self, cell_deg: float = DEFAULT_CELL_DEG) -> None:
        if not isinstance(cell_deg, int | float) or not 0 < cell_deg <= 180:
            raise ValidationError("cell_deg", cell_deg, "must be in (0, 180]")
        self.cell = float(cell_deg)
        self.nx = max(1, math.ceil(360.0 / self.cell))
        self.ny = max(1, math.ceil(180.0 / self.cell))
        self.reset()
        self.mstamp = np.zeros(1024, np.int64)
        self.stamp = 0
        self.tm = np.zeros(1024, np.int64)
        self.ts = 0

    def reset(self) -> None:
        self.head = np.full(self.nx * self.ny, -1, np.int64)
        self.nxt_slot = np.empty(1024, np.int32)
        self.nxt_link = np.empty(1024, np.int64)
        self.n_links = 0

    @property
    def columns(self) -> tuple:
        """The tuple the kernels take: (head, next slot, next link, cell, nx, ny)."""
        return (self.head, self.nxt_slot, self.nxt_link, self.cell, self.nx, self.ny)

    def add(self, x: int, geom: np.ndarray) -> None:
        """File message slot ``x`` (its box ``geom[x]``)."""
        self.nxt_slot, self.nxt_link, self.n_links = _grid_insert(
            self.head,
            self.nxt_slot,
            self.nxt_link,
            self.n_links,
            x,
            geom,
            self.cell,
            self.nx,
            self.ny,
        )

    def rebuild(self, msgs: MessageStore) -> None:
        """Only the live messages, the dead slots released for reuse."""
        msgs.release_dead()
        self.reset()
        for x in np.flatnonzero(msgs.alive[: msgs.n_slots]).tolist():
            self.add(x, msgs.geom)

    def sync(self, msgs: MessageStore, n_terms: int) -> None:
        """Grow the per-message and per-term scratch to the current sizes."""
        if msgs.alive.shape[0] > self.mstamp.shape[0]:
            self.mstamp = np.zeros(2 * msgs.alive.shape[0], np.int64)
        if n_terms > self.tm.shape[0]:
            self.tm = np.zeros(2 * n_terms, np.int64)

    def diff(self, msgs: MessageStore, n_terms: int, old, new) -> tuple[np.ndarray, np.ndarray]:
        """(message slot, sign) of every live message a subscription gains (+1) or loses (-1)
        going from form ``old`` to form ``new`` (``subscription_form``; the clauses are read
        from ``new`` for both)."""
        self.sync(msgs, n_terms)
        self.stamp += 1
        xs, gs, self.ts = _grid_diff(
            *self.columns, msgs.columns(), self.mstamp, self.stamp, self.tm, self.ts, old, new
        )
        return xs, gs


class NaiveMoving:
    """An AP-Tree (stationary matching) and a uniform grid of live messages."""

    def __init__(self, tree: APTree | None = None, *, cell_deg: float = DEFAULT_CELL_DEG) -> None:
        self.grid = MessageGrid(cell_deg)
        self.tree = tree if tree is not None else APTree()
        self.msgs = MessageStore()
        # the live messages hold term ids: follow the tree when a rebuild renumbers them
        self.tree.follow_terms(
            self.msgs.remap_terms, lambda: self.msgs.held_terms(len(self.tree.store.vocab_terms))
        )
        self.now = -math.inf

    @property
    def cell(self) -> float:
        return self.grid.cell

    def _sync(self) -> None:
        self.grid.sync(self.msgs, len(self.tree.store.vocab_terms))
        self.tree.reserve()

    def advance(self, now: float) -> list[Update]:
        if not isinstance(now, (int, float)) or not math.isfinite(now) or now < self.now:
            raise ValidationError("now", now, f"must be finite and not before {self.now}")
        self.now = float(now)
        expired, ids = self.msgs.pop_expired(self.now)
        if not expired:
            return []
        out_m, out_s = self.tree.match_encoded(
            EncodedMessages(*self.msgs.encoded(np.array(expired, np.int64)))
        )
        names = self.tree.store.ids[out_s].tolist()
        ups = [(s, REMOVE, ids[q]) for s, q in zip(names, out_m.tolist(), strict=True)]
        if len(self.msgs.dead) > max(65536, len(self.msgs)):
            self.grid.rebuild(self.msgs)
        return ups

    def rebuild(self) -> None:
        """Rebuild the AP-Tree (the grid holds messages only and needs nothing)."""
        self.tree.rebuild()

    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        updates = self.advance(now)
        store = self.tree.store
        for m in messages:
            if m.ttl:
                if m.id in self.msgs.slot_of:
                    raise ValidationError("id", m.id, "a live message already has this id")
                ids = sorted({store.term_id(t) for t in m.terms})
                self.grid.add(self.msgs.add(m, ids, self.now + float(m.ttl)), self.msgs.geom)
        self._sync()
        for m, ids in zip(messages, self.tree.match_batch(messages), strict=True):
            updates += [(s, ADD, m.id) for s in ids]
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
            np.array([np.inf, np.inf, -np.inf, -np.inf]),  # meets nothing, a rectangle neither
            np.zeros(3),
        )
        return updates + self._diff(sub.id, none, new)

    def unsubscribe(self, sub_id: str) -> None:
        self.tree.unsubscribe(sub_id)

    def move(self, sub_id: str, point: Point, now: float) -> list[Update]:
        return self.move_batch([(sub_id, point)], now)

    def move_batch(self, moves, now: float, *, diff: bool = True) -> list[Update]:
        """Several location updates at ``now`` in one compiled call (validated first, as the
        AP+-Tree does). ``diff=False`` moves the subscriptions without computing their updates
        (the state stays exact; the benchmark samples batches this way at large scale)."""
        updates = self.advance(now)
        st = self.tree.store
        slots = np.empty(len(moves), np.int64)
        px = np.empty(len(moves))
        py = np.empty(len(moves))
        for i, (sub_id, point) in enumerate(moves):
            slot = st.slot(sub_id)
            if not isinstance(point, Point):
                raise ValidationError("point", point, "must be a Point")
            slots[i], px[i], py[i] = slot, point.lon, point.lat
        if not len(moves):
            return updates
        self._sync()
        tree = self.tree
        g = self.grid
        T, q, xs, gs, todo, g.stamp, g.ts = _move_batch_kernel(
            tree.arrays,
            st.columns(),
            tree.params,
            st.first_clause,
            st.n_clauses,
            slots,
            px,
            py,
            g.columns,
            self.msgs.columns(),
            g.mstamp,
            g.stamp,
            g.tm,
            g.ts,
            diff,
        )
        tree.adopt(T, todo)
        ids = st.ids[slots[q]].tolist()
        msgs = self.msgs.messages
        updates += [
            (s, ADD if g > 0 else REMOVE, msgs[x].id)
            for s, x, g in zip(ids, xs.tolist(), gs.tolist(), strict=True)
        ]
        return updates

    def _diff(self, sub_id, old, new) -> list[Update]:
        self._sync()
        xs, gs = self.grid.diff(self.msgs, len(self.tree.store.vocab_terms), old, new)
        return updates_of(sub_id, xs, gs, self.msgs)


def updates_of(sub_id: str, xs: np.ndarray, gs: np.ndarray, msgs: MessageStore) -> list[Update]:
    """A grid diff's (message slot, sign) pairs as updates of ``sub_id``."""
    messages = msgs.messages
    return [
        (sub_id, ADD if g > 0 else REMOVE, messages[x].id)
        for x, g in zip(xs.tolist(), gs.tolist(), strict=True)
    ]
