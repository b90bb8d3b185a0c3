"""``HostedIndex``: a rival index with the AP+-Tree's face, so that a shard can run on it
(the shard setting ``index``; ``shard.state.ShardState``).

The AP+-Tree keeps live messages on its nodes' m-lists and moves subscriptions inside itself
(paper 002, Sect. 4). The rivals have no such part: their papers match each message once. A
hosted rival therefore gets what ``shard.naive_moving`` gives the AP-Tree in the moving
baseline: the live messages on a uniform grid (``naive_moving.MessageGrid``), and a
subscription that moves or is replaced re-evaluated from scratch over the grid cells its old and
new regions meet (``MessageGrid.diff``), which yields its exact - m / + m. In the index itself a
move is a delete and an insert (papers 000/003/004 have no move). The updates are the AP+-Tree's:
(s, +m) for each match of a publish, the differences of a move or a replacement, (s, -m) to
every current holder when a message expires. Exact for any index that matches exactly.

>>> HostedIndex("brute")  # brute force is a benchmark index, not one a shard hosts
Traceback (most recent call last):
...
shard.errors.ValidationError: index='brute': a shard hosts a rival index (rt, rt+, rt++, mbrtrie, ptquadtree, lfilter, iqtree, rqtree) or the AP+-Tree (aptree)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shard.applus.messages import MessageStore
from shard.applus.tree import recentre, subscription_form
from shard.aptree.tree import EncodedMessages
from shard.errors import ValidationError
from shard.geometry import KIND_CIRCLE
from shard.indexes import RIVAL_NAMES, index_class
from shard.model import ADD, REMOVE, Circle, Message, Point, Rect, Subscription, Update
from shard.naive_moving import DEFAULT_CELL_DEG, MessageGrid, updates_of

_NONE_FORM = (
    np.zeros(1, np.int64),
    np.zeros(0, np.int32),
    0,
    np.array([np.inf, np.inf, -np.inf, -np.inf]),
    np.zeros(3),
)
"""The form of no subscription (an inverted infinite box, as a removed store row has: the grid
scan skips its cells and it meets no point and no rectangle; a box like (1, 1, -1, -1) would
still "meet" a rectangle message around it). ``MessageGrid.diff`` reads the *new* form's
clauses for both forms (a move keeps them)."""


def _same_clauses(a, b) -> bool:
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


class HostedIndex:
    """A rival index (``shard.indexes.RIVAL_NAMES``) plus a grid of live messages; the
    operations and updates of ``APPlusTree`` that ``ShardState`` uses."""

    def __init__(self, index: str, *, cell_deg: float = DEFAULT_CELL_DEG, **options: Any) -> None:
        if index not in RIVAL_NAMES:
            raise ValidationError(
                "index",
                index,
                f"a shard hosts a rival index ({', '.join(RIVAL_NAMES)}) or the AP+-Tree (aptree)",
            )
        self.name = index
        self.index = index_class(index)(**options)
        self.msgs = MessageStore()
        self.grid = MessageGrid(cell_deg)
        self.now = -math.inf
        self.rebuilds = 0

    @classmethod
    def build(cls, subs, index: str, **options: Any) -> HostedIndex:
        hosted = cls(index, **options)
        hosted.index.store.add_bulk(subs)
        hosted.index.rebuild()
        return hosted

    @property
    def store(self):
        return self.index.store

    # ---- the grid of live messages --------------------------------------------------------------
    def sync(self) -> None:
        """Grow the grid's per-message and per-term scratch to the current sizes."""
        self.grid.sync(self.msgs, len(self.store.vocab_terms))

    def _diff(self, sub_id: str, old, new) -> list[Update]:
        """(sub_id, +-, m) for every live message the subscription gains or loses going from
        form ``old`` to ``new``, over the grid cells either meets."""
        if not len(self.msgs):
            return []
        xs, gs = self.grid.diff(self.msgs, len(self.store.vocab_terms), old, new)
        return updates_of(sub_id, xs, gs, self.msgs)

    # ---- time -----------------------------------------------------------------------------------
    def _expire(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        if not isinstance(now, int | float) or not math.isfinite(now) or now < self.now:
            raise ValidationError("now", now, f"must be finite and not before {self.now}")
        self.now = float(now)
        expired, ids = self.msgs.pop_expired(self.now)
        if not expired:
            return ids, np.zeros(0, np.int64), np.zeros(0, np.int64)
        out_m, out_s = self.index.match_encoded(
            EncodedMessages(*self.msgs.encoded(np.array(expired, np.int64)))
        )
        if len(self.msgs.dead) > max(65536, len(self.msgs)):
            self.grid.rebuild(self.msgs)
        return ids, out_m, out_s

    def expire_slots(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(expired ids, message index and store slot of every holder): ``APPlusTree``'s."""
        return self._expire(now)

    def advance(self, now: float) -> list[Update]:
        """Expire every message with t + ttl <= now: (s, -m) for each s whose result holds m."""
        ids, out_m, out_s = self._expire(now)
        names = self.store.ids[out_s].tolist()
        return [(s, REMOVE, ids[q]) for s, q in zip(names, out_m.tolist(), strict=True)]

    def advance_tagged(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        ids, out_m, out_s = self._expire(now)
        counts = np.bincount(out_m, minlength=len(ids)).astype(np.int64)
        return ids, counts, self.store.tag[out_s[np.argsort(out_m, kind="stable")]]

    # ---- messages -------------------------------------------------------------------------------
    def publish_slots(self, messages: Sequence[Message], now: float):
        """(expirations, the store slots reached by message, the counts): ``APPlusTree``'s."""
        return self._publish_slots(messages, now)

    def _publish_slots(self, messages: Sequence[Message], now: float):
        updates = self.advance(now)
        store = self.store
        for m in messages:
            if m.ttl:
                if m.id in self.msgs.slot_of:
                    raise ValidationError("id", m.id, "a live message already has this id")
                ids = sorted({store.term_id(t) for t in m.terms})
                self.grid.add(self.msgs.add(m, ids, self.now + float(m.ttl)), self.msgs.geom)
        self.sync()
        if not messages:
            return updates, np.zeros(0, np.int64), np.zeros(0, np.int64)
        out_m, out_s = self.index.match_encoded(self.index.encode(messages))
        return updates, out_s, np.bincount(out_m, minlength=len(messages))

    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        updates, groups = self.publish_grouped(messages, now)
        for m, subs in zip(messages, groups, strict=True):
            updates += [(s, ADD, m.id) for s in subs]
        return updates

    def publish_grouped(self, messages: Sequence[Message], now: float):
        updates, slots, counts = self._publish_slots(messages, now)
        names = self.store.ids[slots].tolist()
        ends = np.cumsum(counts).tolist()
        return updates, [names[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def publish_tagged(self, messages: Sequence[Message], now: float):
        updates, slots, counts = self._publish_slots(messages, now)
        return updates, self.store.tag[slots], counts

    # ---- subscriptions --------------------------------------------------------------------------
    def _place(self, sub: Subscription, tag: int = -1, extra: int = 0) -> list[Update]:
        """Add or replace ``sub`` in the index: its updates against the live messages (``tag``
        and ``extra``: the store columns a move keeps)."""
        store = self.store
        slot = store.slot_of.get(sub.id)
        old = _NONE_FORM if slot is None else subscription_form(store, slot)
        self.index.subscribe(sub)
        slot = store.slot_of[sub.id]
        store.last_t[slot] = self.now
        store.tag[slot] = tag
        store.extra[slot] = extra
        new = subscription_form(store, slot)
        if old is _NONE_FORM or _same_clauses(old, new):
            return self._diff(sub.id, old, new)
        # the grid's comparison reads one clause list for both regions: other keywords are the
        # old result taken away and the new one given, a message in both netted out
        lost = self._diff(sub.id, old, (old[0], old[1], *_NONE_FORM[2:]))
        gained = self._diff(sub.id, (new[0], new[1], *_NONE_FORM[2:]), new)
        both = {u[2] for u in lost} & {u[2] for u in gained}
        return [u for u in lost + gained if u[2] not in both]

    def subscribe(self, sub: Subscription, now: float | None = None) -> list[Update]:
        updates = self.advance(now) if now is not None else []
        return updates + self._place(sub)

    def subscribe_many(self, subs: Sequence[Subscription], now: float | None = None):
        updates = self.advance(now) if now is not None else []
        for sub in subs:
            updates += self._place(sub)
        return updates

    def unsubscribe(self, sub_id: str) -> None:
        self.index.unsubscribe(sub_id)

    def move_batch(self, moves: Sequence[tuple[str, Point]], now: float) -> list[Update]:
        """Re-centre each subscription on its point, in order: a delete and an insert in the
        index, the - m / + m from the grid."""
        for sub_id, point in moves:
            self.store.slot(sub_id)
            if not isinstance(point, Point):
                raise ValidationError("point", point, "must be a Point")
        updates = self.advance(now)
        store = self.store
        words = store.vocab_terms
        for sub_id, point in moves:
            slot = store.slot_of[sub_id]
            off, terms, *_ = subscription_form(store, slot)
            clauses = tuple(
                tuple(words[t] for t in terms[off[i] : off[i + 1]].tolist())
                for i in range(off.shape[0] - 1)
            )
            region = recentre(self.region_of(slot), point)
            sub = Subscription(sub_id, clauses, region, moving=True)
            updates += self._place(sub, int(store.tag[slot]), int(store.extra[slot]))
        return updates

    def region_of(self, slot: int) -> Rect | Circle:
        st = self.store
        if st.kind[slot] == KIND_CIRCLE:
            return Circle(*map(float, st.circ[slot]))
        return Rect(*map(float, st.bbox[slot]))

    # ---- introspection --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.index

    def rebuild(self, **_ignored) -> None:
        self.index.rebuild()
        self.rebuilds += 1

    def stats(self) -> dict[str, Any]:
        out = {"index": self.name, **self.index.stats()}
        out.update(live_messages=len(self.msgs))
        return out

    def check_invariants(self) -> None:
        self.index.check_invariants()
