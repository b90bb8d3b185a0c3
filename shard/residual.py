"""``ResidualIndex``: any index plus the conditions it does not check itself.

The indexes (the AP+-Tree, the hosted rivals of ``shard.indexes``) file and verify a
subscription by its clauses' terms and its region's box or circle. A subscription may say more
(``Subscription.plain`` is False): negated terms (``coffee AND NOT starbucks``), a polygon
region, attribute predicates. Such a subscription goes into the index in its *core form*
(``core_form``: its clauses' positive terms, its polygon's box), whose matches are a superset of
its own, and this wrapper checks every match of it exactly (``holds``) before anyone sees one:

* a publish: a candidate is delivered only if it holds, and a stored message it holds is
  recorded (``held``), so that an expiry's REMOVE reaches only the subscriptions that got its
  ADD;
* a move: a moving subscription's index updates are folded into what its core form holds
  (``core_held``), and its result set is re-evaluated from that at the new position (a polygon
  gains or loses messages that its box holds before and after);
* a replacement involving such a subscription (the old one or the new): the old result set
  (``held``, or a plain one's by re-evaluation, ``results``) against the new one's checked
  matches, as -m / +m.

A client applying the updates in order holds exactly R(s, t) = {live m : m matches s where s
is now}, as for plain subscriptions. With no such subscription every call goes straight to the
index (one test of an empty dict); with some, the index's answers are filtered by the store's
``extra`` column (one vectorised gather), and only the candidates of those subscriptions are
checked one by one.

>>> from shard.applus import APPlusTree
>>> from shard.model import Message, Point, Rect, Subscription
>>> t = ResidualIndex(APPlusTree())
>>> t.subscribe_many([Subscription("s", (("coffee",),), Rect(0, 0, 1, 1), negated=(("starbucks",),))])
[]
>>> t.publish_batch([Message("a", ("coffee", "starbucks"), Point(0.5, 0.5)),
...                  Message("b", ("coffee",), Point(0.5, 0.5), ttl=5.0)], 0.0)
[('s', ADD, 'b')]
>>> t.advance(5.0)
[('s', REMOVE, 'b')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from shard.applus.tree import recentre, subscription_form
from shard.brute import condition_holds, subscription_matches
from shard.conditions import ConditionColumns
from shard.errors import ValidationError
from shard.geometry import location_bbox, region_bbox, region_hits_point, region_hits_rect
from shard.model import (
    ADD,
    REMOVE,
    Message,
    Point,
    Polygon,
    Rect,
    Subscription,
    Update,
    polygon_offset,
)
from shard.polygon import polygon_hits
from shard.ranking import WORLD, core_clauses, on_location
from shard.side import SideIndex

if TYPE_CHECKING:
    from shard.wire_subscribes import PlainSubscribes


def core_form(sub: Subscription) -> Subscription:
    """What an index holds of ``sub``: its clauses' positive terms (a clause that holds another
    dropped) and, for a polygon, its box as a rectangle; ``sub`` itself when it is plain.

    >>> core_form(Subscription("s", (("a",), ("a", "b")), Rect(0, 0, 1, 1), negated=(("x",), ()))).clauses
    (('a',),)
    """
    if sub.plain:
        return sub
    if sub.threshold is not None:  # ranked: its prefix terms, in its rectangle or anywhere
        clauses, anywhere = core_clauses(sub.clauses[0], sub.term_weights, sub.alpha, sub.threshold)
        return Subscription(sub.id, clauses, Rect(*WORLD) if anywhere else sub.region, sub.moving)
    clauses = sub.clauses
    if sub.negated is not None:
        kept: list[tuple[str, ...]] = []
        for c in sorted(set(clauses), key=len):
            if not any(set(k) <= set(c) for k in kept):
                kept.append(c)
        clauses = tuple(sorted(kept))
    region = sub.region
    if type(region) is Polygon:
        region = Rect(*region.box)
    return Subscription(sub.id, clauses, region, sub.moving)


class ResidualIndex:
    """An index (``inner``: an ``APPlusTree`` or a ``HostedIndex``) with the conditions it does
    not check checked here (module docstring). Every attribute not defined here is the inner
    index's (``store``, ``msgs``, ``now``, ``stats``, ...)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.subs: dict[str, Subscription] = {}
        """The subscriptions that are not plain, as given (a polygon at its base position)."""
        self.held: dict[str, set[str]] = {}
        """The stored messages each of them holds (absent: none)."""
        self.core_held: dict[str, set[str]] = {}
        """For the moving ones: the stored messages their core form holds (absent: none)."""
        self._ranked = 0
        self.region_now: dict[str, Rect] = {}
        """A moved ranked subscription's rectangle now."""
        self.cond = ConditionColumns()
        """Their conditions as columns, for the compiled test of a publish's candidates; the
        store's ``extra`` column has each one's row (+ 1)."""
        self.side = SideIndex()
        """The ranked ones that match on location alone (θ ≤ α), by their rectangles: every
        message meeting one is a candidate (``shard.side``)."""
        self.held_by: dict[str, set[str]] = {}
        """For those: the ones holding each stored message (their expiry is found here)."""
        self.row_slots = RowSlots()

    @classmethod
    def over(cls, inner: Any, subs: Iterable[Subscription] = ()) -> ResidualIndex:
        """Wrap ``inner``, already built over the core forms of ``subs`` (later ids replace
        earlier ones) with no live message, registering those that are not plain. O(n)."""
        self = cls(inner)
        last = {s.id: s for s in subs}
        store = inner.store
        self._register_many([s for s in last.values() if not s.plain], store)
        return self

    @property
    def n_ranked(self) -> int:
        return self._ranked

    def _register(self, sub: Subscription, slot: int) -> int:
        """Record ``sub`` (not plain), held by the index in ``slot``; its conditions' row."""
        self.subs[sub.id] = sub
        self._ranked += sub.threshold is not None
        row = self.cond.add(sub)
        self.inner.store.extra[slot] = row + 1
        return row

    def _register_many(self, subs: Sequence[Subscription], store: Any) -> None:
        """``_register`` each (new ids, held by the index), those matching on location alone
        filed in the side index in one call."""
        side = []
        for sub in subs:
            row = self._register(sub, store.slot_of[sub.id])
            if _on_location(sub):
                side.append((sub.id, self.region_now.get(sub.id, sub.region), sub.moving, row))
        self.side.add(side)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.inner

    # ---- the exact test -----------------------------------------------------------------------
    def holds(self, sub: Subscription, msg: Message, slot: int) -> bool:
        """Whether ``msg`` matches ``sub`` (held in store ``slot``), given that it matches its
        core form: the condition with its negations and predicates (``shard.brute``'s
        reference), and a polygon where the slot's box has it now (``shard.polygon``). O(terms
        + predicates + vertices)."""
        if sub.threshold is not None:
            return subscription_matches(self.ranked_at(sub, slot), msg)
        if not condition_holds(sub, msg):
            return False
        region = sub.region
        if type(region) is not Polygon:
            return True  # the index tested the rectangle or circle itself
        box = self.inner.store.bbox[slot]
        dx, dy = polygon_offset(region.base, (box[0], box[1], box[2], box[3]))
        loc = msg.location
        if type(loc) is Point:
            return polygon_hits(region.rings, dx, dy, 0, (loc.lon, loc.lat, loc.lon, loc.lat))
        return polygon_hits(
            region.rings, dx, dy, 1, (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat)
        )

    def ranked_at(self, sub: Subscription, slot: int) -> Subscription:
        """A ranked subscription where it is now (its rectangle moves with it; the index may
        hold it anywhere, so the place is kept here)."""
        region = self.region_now.get(sub.id)
        return sub if region is None else dataclasses.replace(sub, region=region)

    def _live(self, mid: str) -> Message:
        msgs = self.inner.msgs
        return msgs.messages[msgs.slot_of[mid]]

    def _evaluate(self, sub: Subscription, core: Iterable[str], slot: int) -> set[str]:
        """What ``sub`` (held in ``slot``) holds of the stored messages: those of ``core`` (its
        core form's) that hold, and for one matching on location alone, of those meeting its
        rectangle too (a vectorised box test over the live messages)."""
        cand = set(core)
        if sub.id in self.side:
            cand.update(self._live_meeting(self.ranked_at(sub, slot).region))
        return {m for m in cand if self.holds(sub, self._live(m), slot)}

    def _live_meeting(self, r: Rect) -> list[str]:
        """The ids of the live messages whose location meets rectangle ``r`` (edges included).
        O(live messages), vectorised."""
        msgs = self.inner.msgs
        if not len(msgs):
            return []
        n = msgs.n_slots
        g = msgs.geom[:n]
        hit = np.flatnonzero(
            msgs.alive[:n]
            & (g[:, 0] <= r.max_lon)
            & (g[:, 2] >= r.min_lon)
            & (g[:, 1] <= r.max_lat)
            & (g[:, 3] >= r.min_lat)
        )
        return [msgs.messages[x].id for x in hit.tolist()]

    def _set_held(self, sid: str, new: set[str]) -> None:
        """What ``sid`` holds is ``new`` (``held_by`` kept for the side index's)."""
        old = self.held.get(sid, set())
        if sid in self.side:
            for m in old - new:
                self._unhold_by(m, sid)
            for m in new - old:
                self.held_by.setdefault(m, set()).add(sid)
        if new:
            self.held[sid] = new
        else:
            self.held.pop(sid, None)

    def _hold(self, sid: str, mid: str) -> None:
        self.held.setdefault(sid, set()).add(mid)
        if sid in self.side:
            self.held_by.setdefault(mid, set()).add(sid)

    def _unhold_by(self, mid: str, sid: str) -> None:
        holders = self.held_by.get(mid)
        if holders is not None:
            holders.discard(sid)
            if not holders:
                del self.held_by[mid]

    # ---- subscriptions ------------------------------------------------------------------------
    def subscribe_many(
        self, subs: Sequence[Subscription], now: float | None = None
    ) -> list[Update]:
        """Create or replace each subscription in order, with the updates of
        ``APPlusTree.subscribe_many``: plain ones in runs straight to the index, the others
        (and replacements of them) one by one with their result sets compared."""
        updates = self.advance(now) if now is not None else []
        run: list[Subscription] = []
        run_ids: set[str] = set()
        fresh: set[str] = set()  # new ids with conditions in the run
        for sub in subs:
            sid = sub.id
            if sid in self.subs or sid in fresh or (not sub.plain and (sid in self.inner or sid in run_ids)):  # fmt: skip
                updates += self._subscribe_run(run, fresh)
                run, run_ids, fresh = [], set(), set()
                updates += self._subscribe_checked(sub)
                continue
            run.append(sub)
            run_ids.add(sid)
            if not sub.plain:
                fresh.add(sid)
        return updates + self._subscribe_run(run, fresh)

    def _subscribe_run(self, run: list[Subscription], fresh: set[str]) -> list[Update]:
        """Subscriptions into the index in one call: plain ones (new or replacing plain ones)
        and new ones with conditions (``fresh``), whose +m are then checked."""
        if not run:
            return []
        ups = self.inner.subscribe_many([core_form(s) for s in run])
        if not fresh:
            return ups
        store = self.inner.store
        new_subs = [sub for sub in run if sub.id in fresh]
        self._register_many(new_subs, store)
        out = []
        core: dict[str, list[str]] = {}
        for u in ups:
            if u[0] in fresh:  # a new subscription: its updates are +m
                core.setdefault(u[0], []).append(u[2])
            else:
                out.append(u)
        for sub in new_subs:
            sid = sub.id
            cand = core.get(sid, [])
            if sub.moving and cand:
                self.core_held[sid] = set(cand)
            new = self._evaluate(sub, cand, store.slot_of[sid])
            self._set_held(sid, new)
            out += [(sid, ADD, m) for m in sorted(new)]
        return out

    def subscribe(self, sub: Subscription, now: float | None = None) -> list[Update]:
        return self.subscribe_many([sub], now)

    @property
    def takes_plain(self) -> bool:
        """Whether the index adds new plain subscriptions from columns (``subscribe_plain``)."""
        return hasattr(self.inner, "subscribe_plain")

    def subscribe_plain(self, p: PlainSubscribes) -> list[Update]:
        """``subscribe_many`` of new plain subscriptions read as columns (ids distinct, none
        present here): nothing of them is checked here, so straight into the index."""
        return self.inner.subscribe_plain(p)

    def _subscribe_checked(self, sub: Subscription) -> list[Update]:
        sid = sub.id
        if sid in self.subs:
            old = self.held.get(sid, set())
        elif sid in self.inner:
            old = set(self.results(sid))
        else:
            old = set()
        self._forget(sid)
        if sid in self.inner:
            self.inner.unsubscribe(sid)
        ups = self.inner.subscribe_many([core_form(sub)])  # +m for all its core form matches
        cand = [m for _, _, m in ups]
        if sub.plain:
            new = set(cand)
        else:
            store = self.inner.store
            self._register_many([sub], store)
            new = self._evaluate(sub, cand, store.slot_of[sid])
            self._set_held(sid, new)
            if sub.moving and cand:
                self.core_held[sid] = set(cand)
        return [(sid, REMOVE, m) for m in sorted(old - new)] + [
            (sid, ADD, m) for m in sorted(new - old)
        ]

    def unsubscribe(self, sub_id: str) -> None:
        self._forget(sub_id)
        self.inner.unsubscribe(sub_id)

    def _forget(self, sub_id: str) -> None:
        """Drop what is kept of ``sub_id`` here (before the index forgets its slot)."""
        if sub_id in self.side:
            self._set_held(sub_id, set())
            self.side.remove(sub_id)
        self.held.pop(sub_id, None)
        self.core_held.pop(sub_id, None)
        self.region_now.pop(sub_id, None)
        old = self.subs.pop(sub_id, None)
        if old is not None:
            self._ranked -= old.threshold is not None
            store = self.inner.store
            slot = store.slot_of.get(sub_id)
            if slot is not None:
                self.cond.remove(int(store.extra[slot]) - 1)
                store.extra[slot] = 0

    def results(self, sub_id: str) -> list[str]:
        """R(s, now): the ids of the live messages subscription ``sub_id`` matches where it is
        now. For one with conditions, what it holds; for a plain one, by re-evaluating it
        against every live message (a vectorised box test, then the exact test compiled: about
        0.1 ms per 20,000 live messages here)."""
        if sub_id in self.subs:
            return sorted(self.held.get(sub_id, ()))
        inner = self.inner
        msgs = inner.msgs
        if not len(msgs):
            return []
        form = subscription_form(inner.store, inner.store.slot_of[sub_id])
        x0, y0, x1, y1 = form[3].tolist()
        geom = msgs.geom[: msgs.n_slots]
        # vectorised box test first (exact as a filter: every region lies inside its box)
        near = np.flatnonzero(
            (geom[:, 0] <= x1) & (geom[:, 2] >= x0) & (geom[:, 1] <= y1) & (geom[:, 3] >= y0)
        )
        scratch = np.zeros(len(inner.store.vocab_terms) + 1, np.int64)
        columns = (msgs.alive, msgs.kind, msgs.geom, msgs.toff, msgs.tlen, msgs.terms)
        slots = _result_slots(*columns, near, scratch, *form)
        return [msgs.messages[x].id for x in slots.tolist()]

    def subscription_at(self, slot: int) -> Subscription | None:
        """The subscription with conditions held in ``slot`` where it is now (a polygon's box
        where the index has moved it), or None for a plain one."""
        store = self.inner.store
        sub = self.subs.get(store.ids[slot])
        if sub is None:
            return None
        region = sub.region
        if type(region) is Polygon:
            box = tuple(float(v) for v in store.bbox[slot])
            region = Polygon(region.rings, region.base, box)  # type: ignore[arg-type]
        elif sub.threshold is not None:
            region = self.region_now.get(sub.id, region)
        elif sub.moving:
            region = self.inner.region_of(slot)
        return dataclasses.replace(sub, region=region)

    def centre_boxes(self) -> np.ndarray:
        """The store's boxes, with a ranked subscription filed for the whole world given its
        rectangle where it is now: what a density map counts by its centre."""
        store = self.inner.store
        if not self.n_ranked:
            return store.bbox
        out = None
        for sid, sub in self.subs.items():
            if sub.threshold is None:
                continue
            slot = store.slot_of[sid]
            r = self.region_now.get(sid, sub.region)
            box = (r.min_lon, r.min_lat, r.max_lon, r.max_lat)
            if tuple(store.bbox[slot]) != box:
                if out is None:
                    out = store.bbox.copy()
                out[slot] = box
        return store.bbox if out is None else out

    # ---- time ---------------------------------------------------------------------------------
    def advance(self, now: float) -> list[Update]:
        """The index's expirations, those of subscriptions with conditions only where they held
        the message, and the side index's subscriptions' (``held_by``)."""
        if not self.held_by:
            updates = self.inner.advance(now)
            if not self.subs or not updates:
                return updates
            subs = self.subs
            return [u for u in updates if u[0] not in subs or self._expired(u[0], u[2])]
        _check_now(now, self.inner.now)
        ids, out_m, out_s = self.inner.expire_slots(now)
        names = self.inner.store.ids[out_s].tolist()
        subs = self.subs
        updates = [
            (s, REMOVE, ids[q])
            for s, q in zip(names, out_m.tolist(), strict=True)
            if s not in subs or self._expired(s, ids[q])
        ]
        return updates + [(s, REMOVE, ids[q]) for q, s in self._side_expired(ids)]

    def _side_expired(self, ids: list[str]) -> list[tuple[int, str]]:
        """(index in ``ids``, subscription) for each side index subscription that still holds
        an expired message of ``ids`` (those the index reported are gone from ``held_by``)."""
        out = []
        for q, mid in enumerate(ids):
            holders = self.held_by.pop(mid, None)
            if holders is None:
                continue
            for sid in sorted(holders):
                held = self.held[sid]
                held.discard(mid)
                if not held:
                    del self.held[sid]
                out.append((q, sid))
        return out

    def _expired(self, sid: str, mid: str) -> bool:
        """The expiry of ``mid`` for ``sid`` (a subscription with conditions): whether it held
        it (then not any more)."""
        core = self.core_held.get(sid)
        if core is not None:
            core.discard(mid)
            if not core:
                del self.core_held[sid]
        held = self.held.get(sid)
        if held is None or mid not in held:
            return False
        held.discard(mid)
        if not held:
            del self.held[sid]
        if self.held_by:
            self._unhold_by(mid, sid)
        return True

    def advance_tagged(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``APPlusTree.advance_tagged``, filtered as ``advance``."""
        if not self.subs:
            return self.inner.advance_tagged(now)
        _check_now(now, self.inner.now)
        ids, out_m, out_s = self.inner.expire_slots(now)
        store = self.inner.store
        flagged = np.flatnonzero(store.extra[out_s])
        if flagged.size:
            keep = np.ones(out_s.shape[0], np.bool_)
            names = store.ids[out_s[flagged]].tolist()
            for j, sid, q in zip(flagged.tolist(), names, out_m[flagged].tolist(), strict=True):
                keep[j] = self._expired(sid, ids[q])
            out_m, out_s = out_m[keep], out_s[keep]
        if self.held_by:
            more = self._side_expired(ids)
            if more:
                out_m = np.concatenate([out_m, np.array([q for q, _ in more], np.int64)])
                extra = np.array([store.slot_of[sid] for _, sid in more], np.int64)
                out_s = np.concatenate([out_s, extra])
        counts = np.bincount(out_m, minlength=len(ids)).astype(np.int64)
        return ids, counts, store.tag[out_s[np.argsort(out_m, kind="stable")]]

    # ---- messages -----------------------------------------------------------------------------
    def publish_slots(self, messages: Sequence[Message], now: float):
        """Publish: (the expirations up to ``now``, the store slots reached by message, how
        many each reached), the candidates of subscriptions with conditions checked, and the
        side index's candidates added where they hold."""
        updates = self.advance(now)
        _, slots, counts = self.inner.publish_slots(messages, now)  # expired above: none here
        if not self.subs:
            return updates, slots, counts
        n = len(messages)
        store = self.inner.store
        owner = np.repeat(np.arange(n), counts)
        found = check_candidates(self.cond, self.side, store, messages, owner, slots)
        if found is None:
            return updates, slots, counts
        flagged, ok, s_owner, s_rows = found
        s_slots = self.row_slots.of(store, s_rows)
        subs = self.subs
        stored = np.fromiter((bool(m.ttl) for m in messages), np.bool_, n)
        f_owner = owner[flagged]
        names = store.ids[slots[flagged]].tolist()
        for j in np.flatnonzero(stored[f_owner]).tolist():  # what they hold from now on
            sid, mid = names[j], messages[f_owner[j]].id
            if subs[sid].moving:
                self.core_held.setdefault(sid, set()).add(mid)
            if ok[j]:
                self._hold(sid, mid)
        kept = np.flatnonzero(stored[s_owner])
        s_names = store.ids[s_slots[kept]].tolist()
        for sid, q in zip(s_names, s_owner[kept].tolist(), strict=True):
            self._hold(sid, messages[q].id)
        out_owner, out_slots = _with_side(owner, slots, flagged, ok, s_owner, s_slots)
        return updates, out_slots, np.bincount(out_owner, minlength=n)

    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        if not self.subs:
            return self.inner.publish_batch(messages, now)
        updates, groups = self.publish_grouped(messages, now)
        for m, subs in zip(messages, groups, strict=True):
            updates += [(s, ADD, m.id) for s in subs]
        return updates

    def publish(self, msg: Message, now: float) -> list[Update]:
        return self.publish_batch([msg], now)

    def publish_grouped(self, messages: Sequence[Message], now: float):
        if not self.subs:
            return self.inner.publish_grouped(messages, now)
        updates, slots, counts = self.publish_slots(messages, now)
        names = self.inner.store.ids[slots].tolist()
        ends = np.cumsum(counts).tolist()
        return updates, [names[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def publish_tagged(self, messages: Sequence[Message], now: float):
        if not self.subs:
            return self.inner.publish_tagged(messages, now)
        updates, slots, counts = self.publish_slots(messages, now)
        return updates, self.inner.store.tag[slots], counts

    # ---- moves --------------------------------------------------------------------------------
    def move_batch(self, moves: Sequence[tuple[str, Point]], now: float) -> list[Update]:
        """The index's moves; a moving subscription with conditions gets the difference between
        what it held and what its core form holds now that holds where it is now."""
        updates = self.advance(now)
        moved = self.inner.move_batch(moves, now)
        if not self.subs:
            return updates + moved
        subs = self.subs
        for u in moved:
            sid = u[0]
            if sid not in subs:
                updates.append(u)
                continue
            core = self.core_held.setdefault(sid, set())
            if u[1] is ADD:
                core.add(u[2])
            else:
                core.discard(u[2])
        store = self.inner.store
        self.side.move([(sid, p) for sid, p in moves if sid in self.side], now)
        for sid, point in moves:
            sub = subs.get(sid)
            if sub is not None and sub.threshold is not None:
                now_at = self.region_now.get(sid, sub.region)
                moved = self.region_now[sid] = recentre(now_at, point)
                row = int(store.extra[store.slot_of[sid]]) - 1
                self.cond.move_ranked(
                    row, (moved.min_lon, moved.min_lat, moved.max_lon, moved.max_lat)
                )
        for sid in dict.fromkeys(sid for sid, _ in moves if sid in subs):
            sub = subs[sid]
            slot = store.slot_of[sid]
            core = self.core_held.get(sid, set())
            if not core:
                self.core_held.pop(sid, None)
            new = self._evaluate(sub, core, slot)
            old = self.held.get(sid, set())
            updates += [(sid, REMOVE, m) for m in sorted(old - new)]
            updates += [(sid, ADD, m) for m in sorted(new - old)]
            self._set_held(sid, new)
        return updates

    def move(self, sub_id: str, point: Point, now: float) -> list[Update]:
        return self.move_batch([(sub_id, point)], now)

    # ---- checks -------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The index's invariants, and this wrapper's: exactly the subscriptions with
        conditions are flagged in the store, what they hold is live, and held by their core
        form where that is tracked."""
        self.inner.check_invariants()
        store = self.inner.store
        flagged = {store.ids[s] for s in np.flatnonzero(store.extra).tolist()}
        assert flagged == set(self.subs), flagged ^ set(self.subs)
        live = self.inner.msgs.slot_of
        for sid, held in self.held.items():
            assert sid in self.subs and held, sid
            assert all(m in live for m in held), (sid, held)
            if self.subs[sid].moving and sid not in self.side:
                assert held <= self.core_held.get(sid, set()), sid
        for sid in self.core_held:
            assert sid in self.subs and self.subs[sid].moving, sid
        side = {sid for sid, sub in self.subs.items() if _on_location(sub)}
        assert len(self.side) == len(side) and all(sid in self.side for sid in side)
        self.side.check_invariants()
        pairs = {(m, sid) for sid in side for m in self.held.get(sid, ())}
        assert pairs == {(m, sid) for m, held in self.held_by.items() for sid in held}
        assert all(self.held_by.values())


@njit(cache=True)
def _result_slots(alive, mkind, geom, toff, tlen, mterms, cand, TM, cl_off, cl_terms, kind, bbox, circ):  # fmt: skip
    """The live message slots among ``cand`` (``MessageStore`` columns) that match one
    subscription form (clause offsets, clause terms, kind, bbox, circle): the region test of
    ``shard.geometry``, the index's own predicates, then some clause's terms all among the
    message's (marked in ``TM`` with a fresh stamp per message)."""
    out = np.empty(16, np.int64)
    n = 0
    stamp = 0
    for i in range(cand.shape[0]):
        x = cand[i]
        if not alive[x]:
            continue
        if mkind[x] == 0:
            if not region_hits_point(kind, bbox, circ, geom[x, 0], geom[x, 1]):
                continue
        elif not region_hits_rect(kind, bbox, circ, geom[x]):
            continue
        stamp += 1
        for j in range(toff[x], toff[x] + tlen[x]):
            TM[mterms[j]] = stamp
        for c in range(cl_off.shape[0] - 1):
            ok = True
            for j in range(cl_off[c], cl_off[c + 1]):
                if TM[cl_terms[j]] != stamp:
                    ok = False
                    break
            if ok:
                if n == out.shape[0]:
                    grown = np.empty(2 * n, np.int64)
                    grown[:n] = out
                    out = grown
                out[n] = x
                n += 1
                break
    return out[:n].copy()


def check_candidates(
    cond: ConditionColumns,
    side: SideIndex,
    store: Any,
    messages: Sequence[Message],
    owner: np.ndarray,
    slots: np.ndarray,
    kind: np.ndarray | None = None,
    geom: np.ndarray | None = None,
):
    """The exact test of an index's pairs (message ``owner[i]``, store ``slots[i]``) for a
    batch of ``messages``: those of subscriptions with conditions (the store's ``extra``
    column) checked by ``cond``, and the side index's candidates (a pair the index gave too
    tested once). Returns None when there is nothing to test, else (the positions of the
    flagged pairs, whether each holds, the message index and condition row of each side pair that
    holds). ``kind`` / ``geom``: the batch's, when the caller has them."""
    flagged = np.flatnonzero(store.extra[slots])
    n = len(messages)
    s_owner = s_rows = s_slots = np.zeros(0, np.int64)
    if len(side):
        if kind is None or geom is None:
            kind = np.fromiter((type(m.location) is not Point for m in messages), np.int8, n)
            geom = np.array([location_bbox(m.location) for m in messages], np.float64)
            geom = geom.reshape(-1, 4)
        s_owner, s_rows, s_slots = side.pairs(kind, geom)
    if not flagged.size and not s_owner.size:
        return None
    f_owner = owner[flagged].astype(np.int64)
    f_slots = slots[flagged]
    rows = store.extra[f_slots].astype(np.int64) - 1
    n_core = f_owner.shape[0]
    if s_owner.size and n_core:  # the index's pairs of side subscriptions (their prefix)
        dup = np.flatnonzero(cond.theta[rows] <= cond.alpha[rows])
        if dup.size:
            width = int(max(rows.max(), s_rows.max())) + 1
            fresh = ~np.isin(s_owner * width + s_rows, f_owner[dup] * width + rows[dup])
            s_owner, s_rows, s_slots = s_owner[fresh], s_rows[fresh], s_slots[fresh]
    all_owner = np.concatenate([f_owner, s_owner])
    present = np.bincount(all_owner, minlength=n) > 0
    qs = np.flatnonzero(present)  # only the messages some of them reached are encoded
    at = np.cumsum(present) - 1  # a message's place among them
    picked = [messages[q] for q in qs.tolist()]
    if kind is None or geom is None:
        batch = cond.encode(picked)
    else:
        batch = cond.encode(picked, kind[qs], geom[qs])
    # (boxes: for the index's pairs only; a side pair's row is ranked, never a polygon)
    ok = cond.check(np.concatenate([rows, s_rows]), at[all_owner], store.bbox[f_slots], batch)
    side_ok = np.flatnonzero(ok[n_core:])
    return flagged, ok[:n_core], s_owner[side_ok], s_rows[side_ok]


class RowSlots:
    """The store slot of each condition row: the inverse of the store's ``extra`` column, kept
    between calls and checked on every use (a relayout or a new subscription moves slots: then
    it is rebuilt, O(slots) vectorised)."""

    def __init__(self) -> None:
        self.slot = np.zeros(0, np.int64)

    def of(self, store: Any, rows: np.ndarray) -> np.ndarray:
        """The slots of condition ``rows`` (each held by the store)."""
        if not rows.size:
            return np.zeros(0, np.int64)
        s = self.slot
        if int(rows.max()) < s.shape[0]:
            got = s[rows]
            if (got >= 0).all() and np.array_equal(store.extra[got], rows + 1):
                return got
        flagged = np.flatnonzero(store.extra)
        self.slot = np.full(int(store.extra[flagged].max()) if flagged.size else 0, -1, np.int64)
        self.slot[store.extra[flagged].astype(np.int64) - 1] = flagged
        return self.slot[rows]


def _with_side(owner, slots, flagged, ok, s_owner, s_slots):
    """The pairs (owner, slot) kept: the index's that are not flagged or hold, then the side
    index's that hold (``s_owner``, ``s_slots``), in message order."""
    keep = np.ones(slots.shape[0], np.bool_)
    keep[flagged] = ok
    out_owner, out_slots = owner[keep], slots[keep]
    if not s_slots.size:
        return out_owner, out_slots
    out_owner = np.concatenate([out_owner, s_owner.astype(out_owner.dtype)])
    out_slots = np.concatenate([out_slots, s_slots.astype(out_slots.dtype)])
    key = out_owner.astype(np.int16) if out_owner.max() < 2**15 else out_owner  # (radix sort)
    order = np.argsort(key, kind="stable")
    return out_owner[order], out_slots[order]


def _on_location(sub: Subscription) -> bool:
    """Whether ``sub`` is ranked and matches on location alone (``shard.ranking``)."""
    return sub.threshold is not None and on_location(sub.alpha, sub.threshold)


def _check_now(now: float, last: float) -> None:
    """The index's test of a new clock value (``APPlusTree.advance``), for the paths that
    expire through ``expire_slots``."""
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValidationError("now", now, "must be a finite number of seconds")
    if now < last:
        raise ValidationError("now", now, f"must not go back in time (last now={last})")


def index_box(sub: Subscription) -> tuple[float, float, float, float]:
    """The box a subscription is placed by (the shards it goes to): its core form's, so a
    ranked subscription that can match anywhere goes to every shard; a top-k one's point.

    >>> index_box(Subscription("s", (("a",),), Rect(0, 0, 1, 1), threshold=0.6, alpha=0.2))
    (-180.0, -90.0, 180.0, 90.0)
    """
    p = sub.region
    if type(p) is Point:
        return (p.lon, p.lat, p.lon, p.lat)
    return region_bbox(core_form(sub).region)


class StaticChecker:
    """The exact test of the conditions for a static index (``bench match``): the index holds
    the subscriptions' core forms (``cores``), marked in its store (``bind``), and the pairs its
    ``match_encoded`` gives are filtered here (``filter``). An empty checker passes everything, and costs nothing.

    >>> from shard.aptree.tree import APTree
    >>> from shard.model import Message, Point, Rect, Subscription
    >>> chk = StaticChecker()
    >>> subs = [Subscription("s", (("coffee",),), Rect(0, 0, 1, 1), negated=(("starbucks",),))]
    >>> tree = APTree.build(list(chk.cores(subs)))
    >>> chk.bind(tree.store)
    >>> chk.match(tree, [Message("a", ("coffee", "starbucks"), Point(0, 0)), Message("b", ("coffee",), Point(0, 0))])
    [[], ['s']]
    """

    def __init__(self) -> None:
        self.cond = ConditionColumns()
        self.row_of: dict[str, int] = {}
        self.on_location: dict[str, Rect] = {}
        """The ranked ones matching on location alone: their rectangles (``shard.side``)."""
        self.side = SideIndex()
        self.row_slots = RowSlots()

    def __len__(self) -> int:
        return len(self.row_of)

    def cores(self, subs):
        """``subs`` as their core forms (``shard.residual.core_form``), those with conditions
        recorded (a later one with the same id replaces an earlier one)."""
        for sub in subs:
            row = self.row_of.pop(sub.id, None)
            self.on_location.pop(sub.id, None)
            if row is not None:
                self.cond.remove(row)
            if not sub.plain:
                self.row_of[sub.id] = self.cond.add(sub)
                if _on_location(sub):
                    self.on_location[sub.id] = sub.region
            yield core_form(sub)

    def bind(self, store) -> None:
        """Mark the recorded subscriptions' rows in ``store``'s ``extra`` column (the index's
        rebuilds carry it), and file those matching on location alone in the side index. Once,
        after the index is loaded. O(subscriptions with conditions)."""
        for sid, row in self.row_of.items():
            slot = store.slot_of.get(sid)
            if slot is not None:
                store.extra[slot] = row + 1
        self.side = SideIndex()
        self.side.add([(sid, r, False, self.row_of[sid]) for sid, r in self.on_location.items()])

    def filter(
        self, store, messages: Sequence[Message], out_m: np.ndarray, out_s: np.ndarray, encoded=None
    ):
        """The pairs (message index, store slot) that hold: those of subscriptions without
        conditions, the others' that ``ConditionColumns.check`` passes, and the side index's
        that hold, by message. ``encoded``: the index's ``EncodedMessages`` of the batch, whose
        kinds and boxes are reused."""
        if not self.row_of:
            return out_m, out_s
        kind = geom = None
        if encoded is not None:
            kind, geom = encoded.kind, encoded.geom
        found = check_candidates(self.cond, self.side, store, messages, out_m, out_s, kind, geom)
        if found is None:
            return out_m, out_s
        flagged, ok, s_owner, s_rows = found
        s_slots = self.row_slots.of(store, s_rows)
        return _with_side(out_m, out_s, flagged, ok, s_owner, s_slots)

    def match(self, index, messages: Sequence[Message]) -> list[list[str]]:
        """``index.match_batch(messages)`` with the conditions checked."""
        encoded = index.encode(messages)
        out_m, out_s = index.match_encoded(encoded)
        out_m, out_s = self.filter(index.store, messages, out_m, out_s, encoded)
        return index.ids_of(len(messages), out_m, out_s)
