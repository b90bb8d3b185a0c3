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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numba import njit

from shard.applus.tree import recentre, subscription_form
from shard.brute import condition_holds, subscription_matches
from shard.conditions import ConditionColumns
from shard.geometry import region_bbox, region_hits_point, region_hits_rect
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
from shard.ranking import WORLD, core_clauses


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

    @classmethod
    def over(cls, inner: Any, subs: Iterable[Subscription] = ()) -> ResidualIndex:
        """Wrap ``inner``, already built over the core forms of ``subs`` (later ids replace
        earlier ones) with no live message, registering those that are not plain. O(n)."""
        self = cls(inner)
        last = {s.id: s for s in subs}
        store = inner.store
        for sub in last.values():
            if not sub.plain:
                self._register(sub, store.slot_of[sub.id])
        return self

    @property
    def n_ranked(self) -> int:
        return self._ranked

    def _register(self, sub: Subscription, slot: int) -> None:
        self.subs[sub.id] = sub
        self._ranked += sub.threshold is not None
        self.inner.store.extra[slot] = self.cond.add(sub) + 1

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
        for sub in run:
            if sub.id in fresh:
                self._register(sub, store.slot_of[sub.id])
        out = []
        for u in ups:
            sid = u[0]
            if sid not in fresh:
                out.append(u)
                continue
            sub = self.subs[sid]  # a new subscription: its updates are +m
            if sub.moving:
                self.core_held.setdefault(sid, set()).add(u[2])
            if self.holds(sub, self._live(u[2]), store.slot_of[sid]):
                self.held.setdefault(sid, set()).add(u[2])
                out.append(u)
        return out

    def subscribe(self, sub: Subscription, now: float | None = None) -> list[Update]:
        return self.subscribe_many([sub], now)

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
            slot = store.slot_of[sid]
            self._register(sub, slot)
            new = {m for m in cand if self.holds(sub, self._live(m), slot)}
            if new:
                self.held[sid] = new
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
        the message."""
        updates = self.inner.advance(now)
        if not self.subs or not updates:
            return updates
        subs = self.subs
        return [u for u in updates if u[0] not in subs or self._expired(u[0], u[2])]

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
        return True

    def advance_tagged(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``APPlusTree.advance_tagged``, filtered as ``advance``."""
        if not self.subs:
            return self.inner.advance_tagged(now)
        ids, out_m, out_s = self.inner.expire_slots(now)
        store = self.inner.store
        flagged = np.flatnonzero(store.extra[out_s])
        if flagged.size:
            keep = np.ones(out_s.shape[0], np.bool_)
            names = store.ids[out_s[flagged]].tolist()
            for j, sid, q in zip(flagged.tolist(), names, out_m[flagged].tolist(), strict=True):
                keep[j] = self._expired(sid, ids[q])
            out_m, out_s = out_m[keep], out_s[keep]
        counts = np.bincount(out_m, minlength=len(ids)).astype(np.int64)
        return ids, counts, store.tag[out_s[np.argsort(out_m, kind="stable")]]

    # ---- messages -----------------------------------------------------------------------------
    def publish_slots(self, messages: Sequence[Message], now: float):
        """Publish: (the expirations up to ``now``, the store slots reached by message, how
        many each reached), the candidates of subscriptions with conditions checked."""
        updates = self.advance(now)
        _, slots, counts = self.inner.publish_slots(messages, now)  # expired above: none here
        if not self.subs:
            return updates, slots, counts
        store = self.inner.store
        flagged = np.flatnonzero(store.extra[slots])
        if not flagged.size:
            return updates, slots, counts
        owner = np.repeat(np.arange(len(messages)), counts)
        f_slots = slots[flagged]
        f_owner = owner[flagged]
        names = store.ids[f_slots].tolist()
        rows = store.extra[f_slots].astype(np.int64) - 1
        qs = np.unique(f_owner)  # only the messages some of them reached are encoded
        batch = self.cond.encode([messages[q] for q in qs.tolist()])
        ok = self.cond.check(rows, np.searchsorted(qs, f_owner), store.bbox[f_slots], batch)
        subs = self.subs
        stored = np.fromiter((bool(m.ttl) for m in messages), np.bool_, len(messages))
        for j in np.flatnonzero(stored[f_owner]).tolist():  # what they hold from now on
            sid, mid = names[j], messages[f_owner[j]].id
            if subs[sid].moving:
                self.core_held.setdefault(sid, set()).add(mid)
            if ok[j]:
                self.held.setdefault(sid, set()).add(mid)
        keep = np.ones(slots.shape[0], np.bool_)
        keep[flagged] = ok
        return updates, slots[keep], np.bincount(owner[keep], minlength=len(messages))

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
            new = {m for m in core if self.holds(sub, self._live(m), slot)}
            old = self.held.get(sid, set())
            updates += [(sid, REMOVE, m) for m in sorted(old - new)]
            updates += [(sid, ADD, m) for m in sorted(new - old)]
            if new:
                self.held[sid] = new
            else:
                self.held.pop(sid, None)
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
            if self.subs[sid].moving:
                assert held <= self.core_held.get(sid, set()), sid
        for sid in self.core_held:
            assert sid in self.subs and self.subs[sid].moving, sid


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


def index_box(sub: Subscription) -> tuple[float, float, float, float]:
    """The box a subscription is placed by (the shards it goes to): its core form's, so a
    ranked subscription that can match anywhere goes to every shard.

    >>> index_box(Subscription("s", (("a",),), Rect(0, 0, 1, 1), threshold=0.6, alpha=0.2))
    (-180.0, -90.0, 180.0, 90.0)
    """
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

    def __len__(self) -> int:
        return len(self.row_of)

    def cores(self, subs):
        """``subs`` as their core forms (``shard.residual.core_form``), those with conditions
        recorded (a later one with the same id replaces an earlier one)."""
        for sub in subs:
            row = self.row_of.pop(sub.id, None)
            if row is not None:
                self.cond.remove(row)
            if not sub.plain:
                self.row_of[sub.id] = self.cond.add(sub)
            yield core_form(sub)

    def bind(self, store) -> None:
        """Mark the recorded subscriptions' rows in ``store``'s ``extra`` column (the index's
        rebuilds carry it). Once, after the index is loaded. O(subscriptions with conditions)."""
        for sid, row in self.row_of.items():
            slot = store.slot_of.get(sid)
            if slot is not None:
                store.extra[slot] = row + 1

    def filter(
        self, store, messages: Sequence[Message], out_m: np.ndarray, out_s: np.ndarray, encoded=None
    ):
        """The pairs (message index, store slot) that hold: those of subscriptions without
        conditions, and the others' that ``ConditionColumns.check`` passes. ``encoded``: the
        index's ``EncodedMessages`` of the batch, whose kinds and boxes are reused."""
        if not self.row_of:
            return out_m, out_s
        rows = store.extra[out_s].astype(np.int64) - 1
        flagged = np.flatnonzero(rows >= 0)
        if not flagged.size:
            return out_m, out_s
        fm = out_m[flagged]
        qs = np.unique(fm)
        if encoded is None:
            batch = self.cond.encode([messages[q] for q in qs.tolist()])
        else:
            picked = [messages[q] for q in qs.tolist()]
            batch = self.cond.encode(picked, encoded.kind[qs], encoded.geom[qs])
        ok = self.cond.check(
            rows[flagged], np.searchsorted(qs, fm), store.bbox[out_s[flagged]], batch
        )
        keep = np.ones(out_m.shape[0], np.bool_)
        keep[flagged] = ok
        return out_m[keep], out_s[keep]

    def match(self, index, messages: Sequence[Message]) -> list[list[str]]:
        """``index.match_batch(messages)`` with the conditions checked."""
        encoded = index.encode(messages)
        out_m, out_s = index.match_encoded(encoded)
        out_m, out_s = self.filter(index.store, messages, out_m, out_s, encoded)
        return index.ids_of(len(messages), out_m, out_s)
