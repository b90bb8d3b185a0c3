"""``APPlusTree``: the AP-Tree with m-lists of live messages for moving subscriptions (Sect. 4).

Time is a parameter: every operation takes ``now`` (seconds) and first advances to it, so the
updates it returns start with the expirations up to ``now``. An update is a tuple
``(subscription id, sign, message id)`` (``shard.model.Sign``); a client applying them in order holds exactly
R(s, t) = {live m : m matches s at its current region} after every operation.

>>> from shard.model import Subscription, Message, Rect, Point
>>> t = APPlusTree()
>>> t.subscribe(Subscription("s", (("ipad",),), Rect(0, 0, 1, 1), moving=True), now=0.0)
[]
>>> t.publish(Message("m", ("ipad",), Point(2.5, 0.5), ttl=10.0), now=1.0)
[]
>>> t.move("s", Point(2.5, 0.5), now=2.0)
[('s', ADD, 'm')]
>>> t.advance(11.0)
[('s', REMOVE, 'm')]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from shard.applus.check import check_mlists
from shard.applus.messages import MessageStore
from shard.applus.mlists import (
    count_entries,
    diff_results,
    ensure_rows,
    gather_subtrees,
    new_mlists,
    purge,
    repair_created,
    store_traces,
)
from shard.applus.moves import move_batch_kernel
from shard.aptree.layout import (
    C_NODES,
    C_ROOT,
    F_PARENT,
    F_TYPE,
    FREED,
    P_GAP_TO_DUMMY,
    P_MOVE_COST,
    P_MSG_RATE,
    T_CNT,
    T_NI,
)
from shard.aptree.maintain import delete_clauses, insert_clause_groups, insert_clauses
from shard.aptree.match import pack_terms, traverse_kernel
from shard.aptree.tree import APTree, EncodedMessages
from shard.errors import ValidationError
from shard.geometry import KIND_CIRCLE, location_bbox
from shard.model import (
    ADD,
    REMOVE,
    Circle,
    Message,
    Point,
    Polygon,
    Rect,
    Region,
    Subscription,
    Update,
)

if TYPE_CHECKING:
    from shard.wire_subscribes import PlainSubscribes

DEFAULT_DUP_LIMIT = 64
"""Leaves a message may be stored in before it stays at an ancestor level (Sect. 4.2.4)."""

DEFAULT_PURGE_INTERVAL = 60.0
"""Seconds of ``now`` between lazy deletions of expired messages' entries (Sect. 4.2.3)."""

PURGE_MIN_DEAD = 65536
"""A purge also runs once this many expired messages (and at least as many as are live) wait."""


class APPlusTree(APTree):
    """AP+-Tree: publish, subscribe, move, unsubscribe, advance with exact ± updates."""

    def __init__(
        self,
        *,
        dup_limit: int = DEFAULT_DUP_LIMIT,
        purge_interval: float = DEFAULT_PURGE_INTERVAL,
        move_cost: bool = True,
        **options,
    ) -> None:
        super().__init__(**options)
        self._params[P_MOVE_COST] = 1.0 if move_cost else 0.0
        self._published = 0
        self._first_publish = math.inf
        if not isinstance(dup_limit, int) or dup_limit < 1:
            raise ValidationError("dup_limit", dup_limit, "must be an integer >= 1")
        if not purge_interval > 0:
            raise ValidationError("purge_interval", purge_interval, "must be > 0")
        self._params[P_GAP_TO_DUMMY] = 1.0
        self.dup_limit = dup_limit
        self.purge_interval = float(purge_interval)
        self.msgs = MessageStore()
        self._mt = new_mlists()
        self.now = -math.inf
        self._last_purge = -math.inf
        self._nstamp = np.zeros(1024, np.int64)
        self._mstamp = np.zeros(1024, np.int64)
        self._dstamp = 0
        self._dterm = np.zeros(1024, np.int64)
        self._dts = 0

    # ---- bookkeeping ----------------------------------------------------------------------
    def sync(self) -> None:
        """Grow the per-node, per-message and per-term side arrays to the current sizes."""
        n = self._tree[T_NI].shape[0]
        if n > self._mt[0].shape[0]:  # (a compiled call returns, and boxes, every array)
            self._mt = ensure_rows(self._mt, n)
        if n > self._nstamp.shape[0]:
            self._nstamp = np.zeros(max(n, 2 * self._nstamp.shape[0]), np.int64)
        m = self.msgs.alive.shape[0]
        if m > self._mstamp.shape[0]:
            self._mstamp = np.zeros(max(m, 2 * self._mstamp.shape[0]), np.int64)
        v = len(self.store.vocab_terms)
        if v > self._dterm.shape[0]:
            self._dterm = np.zeros(max(v, 2 * self._dterm.shape[0]), np.int64)
        self._extend_pw()
        self._ensure_stamps()

    def _terms_renumbered(self, new_id: np.ndarray) -> None:
        self.msgs.remap_terms(new_id)

    def _terms_held(self) -> np.ndarray:
        return self.msgs.held_terms(len(self.store.vocab_terms))

    def _reinsert(self, slots: np.ndarray, start: int) -> None:
        """Run the traversal of each message from ``start`` and hang it on the nodes it reaches."""
        if slots.size:
            self.sync()
            self._traverse(*self.msgs.encoded(slots), start, slots, True)

    @property
    def mlists(self) -> tuple:
        """The m-lists (``shard.applus.mlists``: per node rows, the pool, its counters)."""
        return self._mt

    def traversal(self, off, terms, kind, geom) -> tuple[np.ndarray, np.ndarray]:
        """(message index, node) of every node the traversal (Alg. 1) of each encoded message
        from the root reaches: where it belongs on m-lists (``shard.applus.check``)."""
        self.sync()
        root = int(self._tree[T_CNT][C_ROOT])
        return self._run_traversal(off, terms, kind, geom, root, True)[3:5]

    def _run_traversal(self, off, terms, kind, geom, start, traces):
        """The compiled Alg. 1 from ``start`` over the tree's columns: (message index, sub slot)
        of every match, the entries verified, and with ``traces`` the (message, node, depth) of
        every node a traversal reached."""
        out_m, out_s, self._stamp, verified, tr_m, tr_n, tr_d, misses = traverse_kernel(
            self._tree,
            self.store.columns(),
            self._term_stamp,
            self._sub_stamp,
            self._stamp,
            off,
            terms,
            kind,
            geom,
            start,
            traces,
            *self.direct_table(kind.shape[0]),
            self._room.room(kind.shape[0]),
        )
        self._room.saw(kind.shape[0], len(out_m))
        self._direct_missed(misses)
        return out_m, out_s, verified, tr_m, tr_n, tr_d

    def _traverse(self, off, terms, kind, geom, start, slot_of_q, store):
        """Alg. 1 from ``start`` for a batch; with ``store``, message q is hung on the nodes of its
        traversal under slot ``slot_of_q[q]`` (-1: not stored). Returns (message index, sub slot)."""
        out_m, out_s, verified, tr_m, tr_n, tr_d = self._run_traversal(
            off, terms, kind, geom, start, store
        )
        self.verified += int(verified)
        if tr_m.size:
            self._mt = store_traces(
                self._tree, self._mt, tr_m, tr_n, tr_d, slot_of_q, self.dup_limit, self.msgs.geom
            )
        return out_m, out_s

    def _note_rate(self) -> None:
        """r_m of Eq. 7: messages per second published so far (0 before any time has passed)."""
        span = self.now - self._first_publish
        self._params[P_MSG_RATE] = self._published / span if span > 0 else 0.0

    def rebuild(self, *, message_sample=None) -> None:
        self._note_rate()
        live = np.flatnonzero(self.msgs.alive[: self.msgs.n_slots]).astype(np.int32)
        super().rebuild(message_sample=message_sample)
        self._mt = new_mlists(self._tree[T_NI].shape[0])
        self.msgs.release_dead()
        self._reinsert(live, int(self._tree[T_CNT][C_ROOT]))

    def _rebuild_nodes(self, todo: np.ndarray) -> None:
        """Rebuild subtrees (splits, collapses, KL reconstructions) carrying their messages over:
        gather each topmost subtree's messages, rebuild, run their traversals from its root."""
        NI = self._tree[T_NI]
        pending = set(todo.tolist())
        tops = []
        for u in pending:
            if NI[u, F_TYPE] == FREED:
                continue
            p = int(NI[u, F_PARENT])
            while p >= 0 and p not in pending:
                p = int(NI[p, F_PARENT])
            if p < 0:
                tops.append(u)
        self.sync()
        # no message ever stored: no list to gather (5 of a one-subscribe round's ~58 us)
        carried = [
            (u, gather_subtrees(self._tree, self._mt, np.array([u], np.int64), self.msgs.alive))
            for u in (tops if self.msgs.n_slots else ())
        ]
        self._note_rate()
        super()._rebuild_nodes(todo)
        for u, slots in carried:
            self._reinsert(slots, u)

    # ---- time -----------------------------------------------------------------------------
    def advance(self, now: float) -> list[Update]:
        """Expire every message with t + ttl <= now: (s, -m) for each s whose result holds m."""
        if not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValidationError("now", now, "must be a finite number of seconds")
        if now < self.now:
            raise ValidationError("now", now, f"must not go back in time (last now={self.now})")
        ids, out_m, out_s = self._expire(now)
        updates: list[Update] = []
        if out_s.size:
            names = self.store.ids[out_s].tolist()
            updates = [(s, REMOVE, ids[q]) for s, q in zip(names, out_m.tolist(), strict=True)]
        self._maybe_purge()
        return updates

    def advance_tagged(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``advance`` answered as columns, nothing per delivery: (the ids of the messages that
        expired, how many holders each had, the ``tag`` of every holder, message by message)."""
        ids, out_m, out_s = self._expire(now)
        if not ids:  # (the usual round: a few array calls saved)
            self._maybe_purge()
            return ids, np.zeros(0, np.int64), np.zeros(0, np.int32)
        counts = np.bincount(out_m, minlength=len(ids)).astype(np.int64)
        tags = self.store.tag[out_s[np.argsort(out_m, kind="stable")]]
        self._maybe_purge()
        return ids, counts, tags

    def expire_slots(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``advance`` answered as (the expired messages' ids, and for each of their holders the
        index of the message in that list and the holder's store slot)."""
        out = self._expire(now)
        self._maybe_purge()
        return out

    def _expire(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Move the clock to ``now`` and pop the expired messages: (their ids, and for each of
        their holders the index of the message in that list and the holder's store slot)."""
        self.now = float(now)
        expired, ids = self.msgs.pop_expired(self.now)
        if not expired:
            return ids, np.zeros(0, np.int64), np.zeros(0, np.int64)
        out_m, out_s = self._match_arrays(*self.msgs.encoded(np.array(expired, np.int64)))
        return ids, out_m, out_s

    def _maybe_purge(self) -> None:
        dead = len(self.msgs.dead)
        if dead and (
            dead >= max(PURGE_MIN_DEAD, len(self.msgs))
            or self.now - self._last_purge >= self.purge_interval
        ):
            self.purge()

    def purge(self) -> None:
        """Lazy deletion: drop expired messages' entries from every list, recycle their slots."""
        self.sync()
        self._mt = purge(self._tree, self._mt, self.msgs.alive, int(self._tree[T_CNT][C_NODES]))
        self.msgs.release_dead()
        self._last_purge = self.now

    def _match_arrays(self, off, terms, kind, geom):
        return self.match_encoded(EncodedMessages(off, terms, kind, geom))

    # ---- messages -------------------------------------------------------------------------
    def publish(self, msg: Message, now: float) -> list[Update]:
        """Deliver ``msg``: (s, +m) for each matching s; a message with ttl > 0 stays live."""
        return self.publish_batch([msg], now)

    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        """Publish several messages at ``now`` with one compiled traversal (the shard's micro-batch)."""
        updates, groups = self.publish_grouped(messages, now)
        for m, subs in zip(messages, groups, strict=True):
            updates += [(s, ADD, m.id) for s in subs]
        return updates

    def publish_grouped(
        self, messages: Sequence[Message], now: float
    ) -> tuple[list[Update], list[list[str]]]:
        """``publish_batch`` answered as (the expirations up to ``now``, for each message the
        ids of the subscriptions it reached, in traversal order): no tuple per delivery."""
        updates, slots, counts = self._publish_slots(messages, now)
        names = self.store.ids[slots].tolist()
        ends = np.cumsum(counts).tolist()
        return updates, [names[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def publish_tagged(
        self, messages: Sequence[Message], now: float
    ) -> tuple[list[Update], np.ndarray, np.ndarray]:
        """``publish_batch`` answered as (the expirations up to ``now``, the ``tag`` of every
        subscription reached, message by message in traversal order, and how many each message
        reached): two integer arrays, nothing per delivery."""
        updates, slots, counts = self._publish_slots(messages, now)
        return updates, self.store.tag[slots], counts

    def publish_slots(self, messages: Sequence[Message], now: float):
        """Publish; returns (expirations, the store slots reached by message, the counts)."""
        return self._publish_slots(messages, now)

    def _publish_slots(self, messages: Sequence[Message], now: float):
        """Publish; returns (expirations, the store slots reached by message, the counts)."""
        updates = self.advance(now)
        self._published += len(messages)
        self._first_publish = min(self._first_publish, self.now)
        stored = [m.ttl is not None and m.ttl > 0 for m in messages]
        seen: set[str] = set()
        for m, keep in zip(messages, stored, strict=True):
            if keep and (m.id in self.msgs.slot_of or m.id in seen):
                raise ValidationError("id", m.id, "a live message already has this id")
            seen.add(m.id)
        term_lists = [m.terms for m in messages]
        flat = [t for ts in term_lists for t in ts]
        ids = self.store.vocab_table().lookup(flat)
        lens = np.fromiter(map(len, term_lists), np.int64, len(messages))
        unknown = np.flatnonzero(ids < 0)
        if unknown.size and any(stored):
            # stored messages intern every term: a subscription may use it later
            term_id = self.store.term_id
            of_stored = np.repeat(np.array(stored, np.bool_), lens)[unknown]
            for i in unknown[of_stored].tolist():
                ids[i] = term_id(flat[i])
        off, terms = pack_terms(ids, lens)
        kind = np.array([type(m.location) is not Point for m in messages], np.int8)
        geom = np.array([location_bbox(m.location) for m in messages], np.float64).reshape(-1, 4)
        slot_of_q = np.full(len(messages), -1, np.int32)
        keep = np.flatnonzero(np.array(stored, np.bool_))
        if keep.size:
            kept = [messages[q] for q in keep.tolist()]
            lens = off[keep + 1] - off[keep]
            k_off = np.zeros(keep.size + 1, np.int64)
            np.cumsum(lens, out=k_off[1:])
            k_terms = (
                terms
                if keep.size == len(messages)
                else np.concatenate([terms[off[q] : off[q + 1]] for q in keep.tolist()])
            )
            expiry = self.now + np.array([float(m.ttl) for m in kept])
            slot_of_q[keep] = self.msgs.add_batch(
                kept, k_off, k_terms.astype(np.int32), kind[keep], geom[keep], expiry
            )
        self.sync()
        out_m, out_s = self._traverse(
            off, terms, kind, geom, int(self._tree[T_CNT][C_ROOT]), slot_of_q, any(stored)
        )
        order = np.argsort(out_m, kind="stable")  # by message, traversal order within each
        return updates, out_s[order], np.bincount(out_m, minlength=len(messages))

    # ---- subscriptions --------------------------------------------------------------------
    def _form(self, slot: int):
        return subscription_form(self.store, slot)

    def _diff(self, leaves: np.ndarray, old, new) -> list[tuple[int, int]]:
        self.sync()
        self._dstamp += 1
        no = (np.zeros(1, np.int64), np.zeros(0, np.int32), 0, np.zeros(4), np.zeros(3))
        o = old if old is not None else no
        n = new if new is not None else no
        xs, gs, self._dts = diff_results(
            self._tree,
            self._mt,
            self.msgs.columns(),
            leaves,
            self._nstamp,
            self._mstamp,
            self._dstamp,
            self._dterm,
            self._dts,
            old is not None,
            *o,
            new is not None,
            *n,
        )
        return list(zip(xs.tolist(), gs.tolist(), strict=True))

    def _place(self, slot_clauses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Insert clauses, fill leaves they created from the parking lists. (todo, leaves)."""
        self.sync()
        T, todo, touched, created = insert_clauses(
            self._tree, self.store.columns(), self._params, slot_clauses
        )
        self._tree = T
        self.sync()
        if created.size:
            self._mt = repair_created(self._tree, self._mt, self.msgs.columns(), created)
        return todo, touched

    def _updates(self, sub_id: str, diff: list[tuple[int, int]]) -> list[Update]:
        msgs = self.msgs.messages
        return [(sub_id, ADD if g > 0 else REMOVE, msgs[x].id) for x, g in diff]

    def subscribe(self, sub: Subscription, now: float | None = None) -> list[Update]:
        """Add (or replace) ``sub``: (s, +m) for each live message it matches; a replacement
        gets only the difference between its old and new results (Alg. 7)."""
        updates = self.advance(now) if now is not None else []
        old = None
        todo_old = np.zeros(0, np.int64)
        old_leaves = np.zeros(0, np.int64)
        if sub.id in self.store.slot_of:
            slot = self.store.slot_of[sub.id]
            old = self._form(slot) if len(self.msgs) else None
            T, todo_old, old_leaves = delete_clauses(
                self._tree, self.store.columns(), self._params, self.store.clauses_of(slot)
            )
            self._tree = T
            self.store.remove(sub.id)
        slot, clauses = self.store.add(sub)
        self.store.last_t[slot] = self.now
        todo, leaves = self._place(clauses)
        if len(self.msgs):  # no live message: nothing to add or take back
            diff = self._diff(np.concatenate((old_leaves, leaves)), old, self._form(slot))
            updates += self._updates(sub.id, diff)
        self._finish(np.concatenate((todo_old, todo)))
        return updates

    def subscribe_many(
        self, subs: Sequence[Subscription], now: float | None = None
    ) -> list[Update]:
        """``subscribe`` each of ``subs`` in order, with the same updates. New ids go into the
        tree together: one compiled insert for all their clauses, each one's (s, +m) found over
        the leaves it reached, the nodes to rebuild rebuilt once. A replacement (an id present,
        or given twice) goes through ``subscribe``."""
        updates = self.advance(now) if now is not None else []
        fresh: list[Subscription] = []
        seen: set[str] = set()
        for sub in subs:
            if sub.id in self.store.slot_of or sub.id in seen:
                updates += self._add_fresh(fresh)
                fresh, seen = [], set()
                updates += self.subscribe(sub)
            else:
                fresh.append(sub)
                seen.add(sub.id)
        updates += self._add_fresh(fresh)
        return updates

    def subscribe_plain(self, p: PlainSubscribes) -> list[Update]:
        """``subscribe_many`` of new subscriptions read as columns (``shard.wire_subscribes``;
        ids distinct and none in the tree): their (s, +m)."""
        if not p.ids:
            return []
        return self._insert_stored(p.ids, *self.store.add_plain(p))

    def _add_fresh(self, subs: list[Subscription]) -> list[Update]:
        """Subscriptions whose ids are not in the tree (and distinct): their updates."""
        if not subs:
            return []
        return self._insert_stored([s.id for s in subs], *self.store.add_many(subs))

    def _insert_stored(
        self, ids: list[str], slots: np.ndarray, clauses: np.ndarray, off: np.ndarray
    ) -> list[Update]:
        """New subscriptions just stored (``add_many``' slots, clause ids and offsets) into the
        tree: one compiled insert, each one's (s, +m) over the leaves it reached."""
        st = self.store
        st.last_t[slots] = self.now
        self.sync()
        T, todo, reached, reached_off, created = insert_clause_groups(
            self._tree, st.columns(), self._params, clauses, off
        )
        self._tree = T
        self.sync()
        if created.size:
            self._mt = repair_created(self._tree, self._mt, self.msgs.columns(), created)
        updates: list[Update] = []
        if len(self.msgs):  # no live message: nothing to add
            for i, sub_id in enumerate(ids):
                leaves = reached[reached_off[i] : reached_off[i + 1]]
                diff = self._diff(leaves, None, self._form(int(slots[i])))
                updates += self._updates(sub_id, diff)
        self._finish(todo, len(ids))
        return updates

    def move(self, sub_id: str, point: Point, now: float) -> list[Update]:
        """Re-centre a moving subscription's region on ``point`` (a rect keeps its size, clamped
        to the world; a circle its radius): -m for each message lost, +m for each gained (Alg. 6)."""
        return self.move_batch([(sub_id, point)], now)

    def move_batch(self, moves: Sequence[tuple[str, Point]], now: float) -> list[Update]:
        """Several location updates at ``now``, applied in order in one compiled call. Every move
        is validated first: a bad one raises before any is applied."""
        updates = self.advance(now)
        st = self.store
        slots = np.empty(len(moves), np.int64)
        px = np.empty(len(moves))
        py = np.empty(len(moves))
        for i, (sub_id, point) in enumerate(moves):
            slot = st.slot(sub_id)
            if not st.moving[slot]:
                raise ValidationError(
                    "id", sub_id, "the subscription is not moving (subscribe it with moving=true)"
                )
            if not isinstance(point, Point):
                raise ValidationError("point", point, "must be a Point")
            slots[i], px[i], py[i] = slot, point.lon, point.lat
        if not len(moves):
            return updates
        self._note_motion(slots, px, py)
        self.sync()
        T, self._mt, self._nstamp, q, xs, gs, todo, self._dstamp, self._dts = move_batch_kernel(
            self._tree,
            st.columns(),
            self._mt,
            self.msgs.columns(),
            self._params,
            st.first_clause,
            st.n_clauses,
            slots,
            px,
            py,
            self._nstamp,
            self._mstamp,
            self._dstamp,
            self._dterm,
            self._dts,
        )
        self._tree = T
        ids = st.ids[slots[q]].tolist()
        msgs = self.msgs.messages
        updates += [
            (s, ADD if g > 0 else REMOVE, msgs[x].id)
            for s, x, g in zip(ids, xs.tolist(), gs.tolist(), strict=True)
        ]
        self._finish(todo)
        return updates

    def _note_motion(self, slots: np.ndarray, px: np.ndarray, py: np.ndarray) -> None:
        """Velocity and update-interval estimates (for ζs, Eq. 9, and Alg. 8): an exponential
        average (weight 1/2) over each subscription's moves."""
        st = self.store
        circle = st.kind[slots] == KIND_CIRCLE
        cx = np.where(circle, st.circ[slots, 0], (st.bbox[slots, 0] + st.bbox[slots, 2]) / 2)
        cy = np.where(circle, st.circ[slots, 1], (st.bbox[slots, 1] + st.bbox[slots, 3]) / 2)
        dt = self.now - st.last_t[slots]
        ok = np.isfinite(dt) & (dt > 0)
        s, dt = slots[ok], dt[ok]
        v = np.stack(((px[ok] - cx[ok]) / dt, (py[ok] - cy[ok]) / dt), axis=1)
        known = st.upd_dt[s] > 0
        st.vel[s] = np.where(known[:, None], 0.5 * st.vel[s] + 0.5 * v, v)
        st.upd_dt[s] = np.where(known, 0.5 * st.upd_dt[s] + 0.5 * dt, dt)
        st.last_t[slots] = self.now

    def _finish(self, todo: np.ndarray, n: int = 1) -> None:
        if self._whole_rebuild_due():
            self.rebuild()
        elif todo.size:
            self._rebuild_nodes(np.unique(todo))
        self._housekeeping(n)

    def region_of(self, slot: int) -> Rect | Circle:
        st = self.store
        if st.kind[slot] == KIND_CIRCLE:
            return Circle(*map(float, st.circ[slot]))
        return Rect(*map(float, st.bbox[slot]))

    # ---- introspection --------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        out = super().stats()
        m, d = count_entries(self._mt, int(self._tree[T_CNT][C_NODES]))
        out.update(live_messages=len(self.msgs), mlist_entries=int(m), parked_entries=int(d))
        return out

    def check_invariants(self) -> None:
        super().check_invariants()
        check_mlists(self)


def subscription_form(store, slot: int):
    """(clause offsets, clause terms, kind, bbox, circle) of a stored subscription, copied: the
    form ``diff_results`` compares."""
    cl = store.clauses_of(slot)
    lens = store.cl_len[cl].astype(np.int64)
    off = np.zeros(cl.shape[0] + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    terms = np.concatenate(
        [store.terms[store.cl_off[c] : store.cl_off[c] + store.cl_len[c]] for c in cl]
    ).astype(np.int32)
    return off, terms, int(store.kind[slot]), store.bbox[slot].copy(), store.circ[slot].copy()


def recentre(region: Region, p: Point) -> Region:
    """The region moved so that its centre is ``p``; a rect keeps width and height and is
    shifted back inside the world where it would leave it; a polygon moves its box as a rect
    (``Polygon``: the rings follow the box).

    >>> recentre(Rect(0, 0, 2, 2), Point(179.5, 0))
    Rect(min_lon=178.0, min_lat=-1.0, max_lon=180.0, max_lat=1.0)
    """
    if isinstance(region, Point):  # a top-k subscription's location
        return p
    if isinstance(region, Circle):
        return Circle(p.lon, p.lat, region.radius_m)
    if isinstance(region, Polygon):
        b = recentre(Rect(*region.box), p)
        return Polygon(region.rings, region.base, (b.min_lon, b.min_lat, b.max_lon, b.max_lat))
    w = region.max_lon - region.min_lon
    h = region.max_lat - region.min_lat
    x0 = min(max(p.lon - w / 2, -180.0), 180.0 - w)
    y0 = min(max(p.lat - h / 2, -90.0), 90.0 - h)
    return Rect(x0, y0, x0 + w, y0 + h)
