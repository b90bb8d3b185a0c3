"""``ShardState``: everything one shard holds, as a plain class (no Ray, no gRPC, no I/O).

One shard owns one partition of space and one ``APPlusTree`` over the subscriptions routed to it.
``shard.host.actor`` wraps this class in a Ray actor and only delegates; tests drive it directly.

Every method takes a batch and the time ``now`` (the coordinator reads the clock, the shard never
does) and returns the updates ``(subscription id, sign, message id)`` it caused (a sign is a
``shard.model.Sign``), the expirations up to ``now`` first. A client that applies a subscription's updates in order holds
exactly R(s, t) = {live m : m matches s at its current region} (Sect. 4 of the paper).

A batch is validated as a whole before any of it is applied, time included: a bad item raises
``ValidationError`` (field ``<batch>[<index>].<field>``) or ``NotFoundError`` and leaves the
shard exactly as it was, so no update of the batch, not even an expiration, is lost.

>>> from shard.model import Message, Point, Rect, Subscription
>>> s = ShardState(0)
>>> s.subscribe_batch([Subscription("s", (("ipad",),), Rect(0, 0, 1, 1), moving=True)], 0.0)
[]
>>> s.publish_batch([Message("m", ("ipad",), Point(2.5, 0.5), ttl=10.0)], 1.0)
[]
>>> s.move_batch([("s", Point(2.5, 0.5))], 2.0)
[('s', ADD, 'm')]
>>> s.detach_batch(["s"], 3.0)
[('s', REMOVE, 'm')]
>>> ShardState.restore(s.snapshot()).stats()["live_messages"]
1

Snapshot format (``snapshot`` / ``restore``), version ``SNAPSHOT_VERSION`` = 3 (1: without
``tags``, 2: without ``residual`` and messages' attributes; both still read)::

    b"GPSS" | version: uint16 little-endian | pickle (protocol 5) of a dict of builtins only:
      shard_id: int, options: dict (the APPlusTree options), now: float (-inf: never advanced),
      subs: {ids: [str] (n), moving: bytes u1[n], kind: bytes i1[n] (0 rect, 1 circle),
             region: bytes <f8[n, 4] (rect: min_lon, min_lat, max_lon, max_lat; circle: lon, lat,
             radius_m, 0) -- the *current* region, after moves,
             n_clauses: bytes <i4[n], clause_len: bytes <i4[k], terms: bytes <i4[t] (into vocab),
             vocab: [str], tags: bytes <i4[n] (-1: none)},
      residual: [row]  -- the subscriptions that are not plain, whole and where they are now,
                          as ``shard.model.subscriptions_to_rows`` (they replace their core
                          form in ``subs``, which holds what the index holds),
      messages: [(id, terms, location (lon, lat) or (min_lon, min_lat, max_lon, max_lat),
                  ttl, keywords, text, expiry, attributes)]  -- the live ones, expiry =
                  publish time + ttl, attributes [(name, value)]

The cluster does not use snapshots (a shard is rebuilt from the subscriptions in Redis, and the
live messages the coordinator keeps); they are how a ``ShardState`` pickles, and what the tests
hold a restored shard to. Only builtins are pickled, and ``restore`` unpickles with every global
refused, so a snapshot from elsewhere cannot run code. The tree itself (nodes, m-lists, stamps,
motion estimates) is derived state and is not stored: ``restore`` rebuilds it with the bulk path
and replays the live messages at their original publish times, so every message expires at the
same instant and the restored shard produces the same future updates as the original (the order
of updates within one call may differ, as it depends on the tree's shape; the order of the
updates of one subscription for one message does not).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shard.applus import APPlusTree
from shard.attributes import Predicate
from shard.density import count_centres, grid_shape
from shard.errors import NotFoundError, ValidationError
from shard.limits import MAX_CLAUSE_TERMS, MAX_CLAUSES, MAX_ID_LEN, MAX_TOP_K
from shard.model import (
    REMOVE,
    Circle,
    Message,
    Point,
    Polygon,
    Rect,
    Subscription,
    TopKAnswer,
    Update,
    subscription_from_dict,
    subscription_to_dict,
    subscriptions_from_rows,
    subscriptions_to_rows,
    validate_circle,
    validate_id,
    validate_point,
    validate_rect,
)
from shard.residual import ResidualIndex, core_form
from shard.rivals.hosted import HostedIndex
from shard.topk.hosted import TopKHold

if TYPE_CHECKING:
    from shard.wire_subscribes import PlainSubscribes

SNAPSHOT_MAGIC = b"GPSS"
SNAPSHOT_VERSION = 3
"""Version of the snapshot layout described in the module docstring; ``restore`` refuses others
(but versions 1 and 2, the same without tags, residual and attributes)."""
_READABLE_VERSIONS = (1, 2, 3)

_HEADER = struct.Struct("<4sH")
_OPTION_TYPES = (bool, int, float, str, list, tuple)

__all__ = ["SNAPSHOT_VERSION", "ShardState", "Update"]


def _new_tree(options: dict[str, Any], subs: Iterable[Subscription] | None = None):
    """The shard's index: the AP+-Tree, or with ``index`` set to a rival's name
    (``shard.indexes``) that rival hosted with the AP+-Tree's operations
    (``shard.rivals.hosted``); built in bulk over ``subs`` when given; either wrapped in a
    ``ResidualIndex``, which checks the conditions the index does not (NOT, polygons,
    attribute predicates)."""
    options = dict(options)
    name = options.pop("index", "aptree")
    subs = None if subs is None else list(subs)
    core = None if subs is None else [core_form(s) for s in subs]
    if name == "aptree":
        inner = APPlusTree(**options) if core is None else APPlusTree.build(core, **options)
    elif core is None:
        inner = HostedIndex(name, **options)
    else:
        inner = HostedIndex.build(core, name, **options)
    return ResidualIndex.over(inner, subs or ())


class ShardState:
    """One shard: an AP+-Tree (or a hosted rival index) plus batch operations, snapshot and
    restore.

    ``options`` are passed to ``APPlusTree`` (``theta_p``, ``fanout``, ``dup_limit``,
    ``purge_interval``, ``move_cost``, ...) and kept for ``snapshot``; ``index`` (default
    ``aptree``) names another index of ``shard.indexes`` to host instead
    (``shard.rivals.hosted.HostedIndex``, with that index's own options).
    """

    def __init__(self, shard_id: int, **options: Any) -> None:
        if isinstance(shard_id, bool) or not isinstance(shard_id, int) or shard_id < 0:
            raise ValidationError("shard_id", shard_id, "must be an integer >= 0")
        for key, value in options.items():
            if not isinstance(value, _OPTION_TYPES):
                raise ValidationError(key, value, "a shard option must be a plain value")
        self.shard_id = shard_id
        self.options = dict(options)
        self.tree = _new_tree(options)
        self.topk = TopKHold()
        """The top-k subscriptions (``Subscription.topk``; paper 001), beside the tree."""

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        shard_id: int,
        subs: Iterable[Subscription],
        now: float | None = None,
        *,
        tags: Sequence[int] | None = None,
        **options: Any,
    ) -> ShardState:
        """A shard holding ``subs`` (later ids replace earlier ones), built with the bulk path
        (``APPlusTree.build``), its clock at ``now``; ``tags``: each subscription's tag
        (``publish_tagged``). O(n log n · depth).

        >>> from shard.model import Rect, Subscription
        >>> len(ShardState.build(3, [Subscription("a", (("x",),), Rect(0, 0, 1, 1))], 5.0))
        1
        """
        state = cls(shard_id, **options)
        subs = list(subs)
        _validate_subscriptions(subs)
        tags = _validate_tags(tags, len(subs))
        if now is not None:
            _validate_now(now, -math.inf)
        tags = tags if tags is not None else [-1] * len(subs)
        last = {s.id: i for i, s in enumerate(subs)}  # a later id replaces an earlier one
        ranked = [i for i in last.values() if subs[i].topk]
        if ranked:
            state.topk.add([subs[i] for i in ranked], [tags[i] for i in ranked])
            subs, tags = (
                [s for i, s in enumerate(subs) if not s.topk and last[s.id] == i],
                [t for i, t in enumerate(tags) if not subs[i].topk and last[subs[i].id] == i],
            )
        state.tree = _new_tree(options, subs)
        state._set_tags([s.id for s in subs], tags)
        if now is not None:
            state.tree.advance(now)
        return state

    # ---- subscriptions --------------------------------------------------------------------
    def subscribe_batch(
        self, subs: Sequence[Subscription], now: float, tags: Sequence[int] | None = None
    ) -> list[Update]:
        """Create or replace each subscription, in order: (s, +m) for each live message a new
        one matches; a replacement gets only the difference (Alg. 7). ``tags``: each one's tag
        (``publish_tagged``; a replacement without one keeps none). O(batch · (depth + the
        m-lists of its leaves)).

        >>> from shard.model import Rect, Subscription
        >>> ShardState(0).subscribe_batch([Subscription("a", (("x",),), Rect(0, 0, 1, 1))], 0.0)
        []
        """
        subs = list(subs)
        _validate_subscriptions(subs)
        tags = _validate_tags(tags, len(subs))
        tags = tags if tags is not None else [-1] * len(subs)
        updates = self._advance_checked(now)
        tree, topk = self.tree, self.topk
        run: list[Subscription] = []
        run_tags: list[int] = []
        for sub, tag in zip(subs, tags, strict=True):
            if not sub.topk:
                topk.remove(sub.id)  # (a top-k one replaced by another kind)
                run.append(sub)
                run_tags.append(tag)
                continue
            if sub.id in tree or any(r.id == sub.id for r in run):  # another kind replaced
                updates += self._subscribe_run(run, run_tags)
                run, run_tags = [], []
                updates += self._detach(sub.id)
            topk.add([sub], [tag])
        return updates + self._subscribe_run(run, run_tags)

    def takes_plain(self, p: PlainSubscribes) -> bool:
        """Whether ``subscribe_plain`` takes the round ``p``: the index adds columns, and no id
        of it is held here (a replacement, of a subscription of any kind, goes through
        ``subscribe_batch``)."""
        tree = self.tree
        if not tree.takes_plain:
            return False
        slot_of = tree.store.slot_of
        if any(i in slot_of for i in p.ids):
            return False
        topk = self.topk
        return not (len(topk) and any(i in topk for i in p.ids))

    def subscribe_plain(self, p: PlainSubscribes, now: float) -> list[Update]:
        """``subscribe_batch`` of new plain subscriptions read as columns
        (``shard.wire_subscribes``, which checked every field; ``takes_plain`` must hold): the
        same updates, without a ``Subscription`` each."""
        updates = self._advance_checked(now)
        return updates + self.tree.subscribe_plain(p)

    def _subscribe_run(self, subs: list[Subscription], tags: list[int]) -> list[Update]:
        if not subs:
            return []
        updates = self.tree.subscribe_many(subs)
        self._set_tags([s.id for s in subs], tags)
        return updates

    def _set_tags(self, ids: list[str], tags: Sequence[int]) -> None:
        store = self.tree.store
        last = dict(zip(ids, tags, strict=True))  # a repeated id: its last subscription counts
        slots = np.fromiter((store.slot_of[i] for i in last), np.int64, len(last))
        store.tag[slots] = np.fromiter(last.values(), np.int32, len(last))

    def unsubscribe_batch(self, ids: Sequence[str], now: float) -> list[Update]:
        """Remove subscriptions. An unsubscription itself gives no updates (the client is gone);
        the result holds only the expirations up to ``now`` of the other subscriptions. Unknown
        ids are skipped, so the call is idempotent (a retried batch is harmless); ``has`` tells
        which ids are present. O(batch · (depth + leaf size)).

        >>> ShardState(0).unsubscribe_batch(["nobody"], 1.0)
        []
        """
        ids = _validate_ids(ids)
        updates = self._advance_checked(now)
        tree = self.tree
        for sub_id in ids:
            if sub_id in tree:
                tree.unsubscribe(sub_id)
            else:
                self.topk.remove(sub_id)
        return updates

    def detach_batch(self, ids: Sequence[str], now: float) -> list[Update]:
        """Remove subscriptions that leave this shard (a move out of its partition):
        (s, -m) for every live message of this shard that s currently holds, then the removal.
        The coordinator forwards those -m so that the client's result set stays exact while the
        new shard sends its +m. Unknown ids are skipped (idempotent). O(batch · live messages):
        a vectorised box test, then the exact test compiled (about 0.1 ms per detached
        subscription per 20,000 live messages here).

        >>> from shard.model import Message, Point, Rect, Subscription
        >>> s = ShardState(0)
        >>> _ = s.subscribe_batch([Subscription("a", (("x",),), Rect(0, 0, 1, 1))], 0.0)
        >>> s.publish_batch([Message("m", ("x",), Point(0.5, 0.5), ttl=9.0)], 0.0)
        [('a', ADD, 'm')]
        >>> s.detach_batch(["a"], 1.0), s.has(["a"])
        ([('a', REMOVE, 'm')], [False])
        """
        ids = _validate_ids(ids)
        updates = self._advance_checked(now)
        for sub_id in ids:
            updates += self._detach(sub_id)
        return updates

    def _detach(self, sub_id: str) -> list[Update]:
        """-m for all ``sub_id`` holds here, then its removal (a top-k one: no update)."""
        tree = self.tree
        if sub_id not in tree:
            self.topk.remove(sub_id)
            return []
        updates = [(sub_id, REMOVE, mid) for mid in tree.results(sub_id)]
        tree.unsubscribe(sub_id)
        return updates

    # ---- messages and moves ---------------------------------------------------------------
    def publish_batch(self, messages: Sequence[Message], now: float) -> list[Update]:
        """Deliver the messages: (s, +m) for each matching s, with one compiled traversal for
        the batch; a message with ttl > 0 stays live until now + ttl. A stored message's id must
        not be live (one that expires at ``now`` may be reused). O(batch · traversal).

        >>> from shard.model import Message, Point
        >>> ShardState(0).publish_batch([Message("m", ("x",), Point(0, 0))], 0.0)
        []
        """
        messages = list(messages)
        self._validate_messages(messages, now)
        return self.tree.publish_batch(messages, now)

    def publish_grouped(
        self, messages: Sequence[Message], now: float
    ) -> tuple[list[Update], list[list[str]]]:
        """``publish_batch`` answered as (the expirations up to ``now``, for each message the
        ids of the subscriptions it reached): what the coordinator takes, without a tuple per
        delivery.

        >>> from shard.model import Message, Point, Rect, Subscription
        >>> st = ShardState(0)
        >>> _ = st.subscribe_batch([Subscription("s", (("x",),), Rect(0, 0, 1, 1))], 0.0)
        >>> st.publish_grouped([Message("a", ("x",), Point(2, 2)), Message("b", ("x",), Point(0.5, 0.5))], 0.0)
        ([], [[], ['s']])
        """
        messages = list(messages)
        self._validate_messages(messages, now)
        return self.tree.publish_grouped(messages, now)

    def publish_tagged(
        self, messages: Sequence[Message], now: float
    ) -> tuple[list[Update], np.ndarray, np.ndarray]:
        """``publish_batch`` answered as (the expirations up to ``now``, the tag of each
        subscription reached, message by message, and how many subscriptions each message
        reached): what the coordinator takes, two integer arrays and nothing per delivery.

        >>> from shard.model import Message, Point, Rect, Subscription
        >>> st = ShardState(0)
        >>> _ = st.subscribe_batch([Subscription("s", (("x",),), Rect(0, 0, 1, 1))], 0.0, [7])
        >>> st.publish_tagged([Message("a", ("x",), Point(2, 2)), Message("b", ("x",), Point(0.5, 0.5))], 0.0)
        ([], array([7], dtype=int32), array([0, 1]))
        """
        messages = list(messages)
        self._validate_messages(messages, now)
        return self.tree.publish_tagged(messages, now)

    def move_batch(self, moves: Sequence[tuple[str, Point]], now: float) -> list[Update]:
        """Re-centre moving subscriptions, in order (one may move twice): -m for each message
        lost, +m for each gained (Alg. 6, one compiled call). O(batch · (depth + m-lists)).

        >>> from shard.model import Point
        >>> ShardState(0).move_batch([], 1.0)
        []
        """
        moves = list(moves)
        self._validate_moves(moves, now)
        topk = self.topk
        if not len(topk) or not any(sid in topk for sid, _ in moves):
            return self.tree.move_batch(moves, now)
        updates = self.tree.move_batch([(sid, p) for sid, p in moves if sid not in topk], now)
        topk.move([(sid, p) for sid, p in moves if sid in topk])  # (cannot fail: validated)
        return updates

    def topk_batch(
        self, messages: Sequence[Message], ks: Sequence[int], now: float
    ) -> list[TopKAnswer]:
        """Top-k publishes (paper 001): for each message, the tags and scores of the ``ks[i]``
        top-k subscriptions here that score it highest (ties by subscription id). The messages
        are not stored; each needs a point (``shard.topk.hosted``). O(search), compiled.

        >>> ShardState(0).topk_batch([Message("e", (), Point(0, 0))], [5], 0.0)[0].tags
        array([], dtype=int32)
        """
        messages = list(messages)
        _validate_now(now, self.tree.now)
        if len(ks) != len(messages):
            raise ValidationError("ks", len(ks), f"must give one k per message ({len(messages)})")
        for i, (m, k) in enumerate(zip(messages, ks, strict=True)):
            _check_message(f"messages[{i}]", m, need_terms=False)
            if type(m.location) is not Point:
                raise ValidationError(
                    f"messages[{i}].rect", m.location, "a top-k publish takes a point"
                )
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOP_K:
                raise ValidationError(f"ks[{i}]", k, f"must be an integer in [1, {MAX_TOP_K}]")
        self.tree.advance(now)  # (the tree's clock is the shard's)
        return self.topk.topk_batch(messages, ks)

    def advance(self, now: float) -> list[Update]:
        """Move the clock to ``now``: (s, -m) for each held message that expired. O(expired ·
        match).

        >>> ShardState(0).advance(10.0)
        []
        """
        return self._advance_checked(now)

    # ---- look-ups ---------------------------------------------------------------------------
    def has(self, ids: Sequence[str]) -> list[bool]:
        """Whether each subscription id is held by this shard. O(batch).

        >>> ShardState(0).has(["a"])
        [False]
        """
        tree, topk = self.tree, self.topk
        return [sub_id in tree or sub_id in topk for sub_id in _validate_ids(ids)]

    def subscriptions(self, ids: Sequence[str]) -> list[Subscription | None]:
        """The subscriptions as held now (a moving one at its current region; the condition as
        its DNF, ``keywords``/``expr`` are not kept), None for unknown ids. O(batch · terms)."""
        store = self.tree.store
        out: list[Subscription | None] = []
        for sub_id in _validate_ids(ids):
            slot = store.slot_of.get(sub_id)
            if slot is None:
                out.append(self.topk.subs.get(sub_id))
            else:
                out.append(self._subscription_at(slot))
        return out

    def messages(self, ids: Sequence[str]) -> list[Message | None]:
        """The live messages with these ids (None when not live here), e.g. to fill in the body
        of a delivery caused by a move. O(batch)."""
        msgs = self.tree.msgs
        out: list[Message | None] = []
        for mid in _validate_ids(ids):
            slot = msgs.slot_of.get(mid)
            out.append(None if slot is None else msgs.messages[slot])
        return out

    def _subscription_at(self, slot: int) -> Subscription:
        full = self.tree.subscription_at(slot)
        if full is not None:
            return full
        store = self.tree.store
        vocab = store.vocab_terms
        off, lens, terms = store.cl_off, store.cl_len, store.terms
        clauses = tuple(
            sorted(
                tuple(sorted(vocab[t] for t in terms[off[c] : off[c] + lens[c]].tolist()))
                for c in store.clauses_of(slot).tolist()
            )
        )
        return Subscription(
            store.ids[slot], clauses, self.tree.region_of(slot), bool(store.moving[slot])
        )

    @property
    def now(self) -> float:
        """The shard's clock: the largest ``now`` seen (-inf before any)."""
        return self.tree.now

    def __len__(self) -> int:
        return len(self.tree) + len(self.topk)

    @property
    def rebuilds(self) -> int:
        """Subtrees the index has rebuilt so far (splits, KL reconstructions, collapses)."""
        return self.tree.rebuilds

    @property
    def live_messages(self) -> int:
        return len(self.tree.msgs)

    def figures(self) -> dict[str, int]:
        """The O(1) counts for monitoring: subscriptions and live messages."""
        return {
            "subscriptions": len(self.tree.store) + len(self.topk),
            "live_messages": len(self.tree.msgs),
        }

    def stats(self) -> dict[str, Any]:
        """Counts for monitoring: subscriptions, moving ones, live messages, the tree's node and
        list statistics. O(subscriptions) (the moving count), so not for every request."""
        store = self.tree.store
        slots = np.fromiter(store.slot_of.values(), np.int64, len(store.slot_of))
        return {
            "shard_id": self.shard_id,
            "now": self.tree.now,
            "subscriptions": len(store) + len(self.topk),
            "topk_subscriptions": len(self.topk),
            "moving": int(np.count_nonzero(store.moving[slots]))
            + sum(s.moving for s in self.topk.subs.values()),
            "live_messages": len(self.tree.msgs),
            "tree": self.tree.stats(),
        }

    def density(
        self,
        own: Sequence[float],
        view: Sequence[float],
        cols: int,
        rows: int,
        keyword: str = "",
    ) -> np.ndarray:
        """The subscriptions whose region's centre ``own`` (this shard's partition box) owns,
        counted on a ``cols`` x ``rows`` grid over ``view``, only those naming ``keyword`` (a
        normalized term) if one is given (``shard.density``). O(subscriptions), compiled.

        >>> from shard.model import Rect, Subscription
        >>> st = ShardState.build(0, [Subscription("a", (("x",),), Rect(0, 0, 2, 2))])
        >>> st.density((-180, -90, 180, 90), (-180, -90, 180, 90), 2, 1).tolist()
        [0, 1]
        >>> st.density((-180, -90, 180, 90), (-180, -90, 180, 90), 2, 1, "y").tolist()
        [0, 0]
        """
        cols, rows = grid_shape(cols, rows)
        store = self.tree.store
        term = -1
        if keyword:
            term = store.vocab.get(keyword, -2)
            if term == -2:
                return np.zeros(rows * cols, np.uint32)
        return count_centres(store, own, view, cols, rows, term, self.tree.centre_boxes())

    def check_invariants(self) -> None:
        """Assert the tree's structural invariants."""
        # check_mlists reads one m-list row per node, but a rebuild with no live message leaves
        # the rows ungrown until the next operation needs them: grow them first
        self.tree.sync()
        self.tree.check_invariants()
        self.topk.check_invariants()
        assert not any(sid in self.tree for sid in self.topk.subs), "held twice"

    # ---- validation -------------------------------------------------------------------------
    def advance_tagged(self, now: float) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``advance`` as columns (``APPlusTree.advance_tagged``): the expired messages' ids,
        their holders' counts, and the holders' tags, message by message.

        >>> ShardState(0).advance_tagged(10.0)
        ([], array([], dtype=int64), array([], dtype=int32))
        """
        _validate_now(now, self.tree.now)
        return self.tree.advance_tagged(now)

    def _advance_checked(self, now: float) -> list[Update]:
        _validate_now(now, self.tree.now)
        return self.tree.advance(now)

    def _validate_messages(self, messages: list[Message], now: float) -> None:
        _validate_now(now, self.tree.now)
        live = self.tree.msgs
        seen: set[str] = set()
        for i, m in enumerate(messages):
            if not _plain_message(m):  # the common case is checked without naming fields
                _check_message(f"messages[{i}]", m)
            if m.ttl:
                slot = live.slot_of.get(m.id)
                # a live message expiring at ``now`` is gone by the time the batch is stored
                if m.id in seen or (slot is not None and live.expiry[slot] > now):
                    raise ValidationError(
                        f"messages[{i}].id", m.id, "a live message already has this id"
                    )
                seen.add(m.id)

    def _validate_moves(self, moves: list[tuple[str, Point]], now: float) -> None:
        _validate_now(now, self.tree.now)
        store = self.tree.store
        for i, item in enumerate(moves):
            at = f"moves[{i}]"
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ValidationError(at, item, "must be a pair (subscription id, Point)")
            sub_id, point = item
            if not isinstance(sub_id, str):
                raise ValidationError(f"{at}.id", sub_id, "must be a string")
            slot = store.slot_of.get(sub_id)
            held = self.topk.subs.get(sub_id)
            if slot is None and held is None:
                raise NotFoundError("subscription", sub_id)
            if not (store.moving[slot] if held is None else held.moving):
                raise ValidationError(
                    f"{at}.id", sub_id, "the subscription is not moving (subscribe it moving)"
                )
            if not isinstance(point, Point):
                raise ValidationError(f"{at}.point", point, "must be a Point")
            validate_point(f"{at}.point", point.lon, point.lat)

    # ---- snapshot ---------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The shard as bytes (format in the module docstring): the subscriptions at their
        current regions, the live messages with their expiry, the clock. O(subscriptions +
        terms), vectorised; about 40 bytes per subscription plus its ids and terms.
        """
        tree = self.tree
        store = tree.store
        ids = list(store.slot_of)
        slots = np.fromiter(store.slot_of.values(), np.int64, len(ids))
        kind = store.kind[slots]
        region = np.where(
            (kind == 1)[:, None],
            np.concatenate((store.circ[slots], np.zeros((slots.size, 1))), axis=1),
            store.bbox[slots],
        )
        ncl = store.n_clauses[slots].astype(np.int64)
        rows = np.repeat(store.first_clause[slots], ncl) + _ragged_arange(ncl)
        lens = store.cl_len[rows].astype(np.int64)
        terms = store.terms[np.repeat(store.cl_off[rows], lens) + _ragged_arange(lens)]
        msgs = tree.msgs
        live = [
            (
                m.id,
                m.terms,
                _location_tuple(m.location),
                m.ttl,
                m.keywords,
                m.text,
                float(msgs.expiry[slot]),
                m.attributes,
            )
            for slot, m in ((s, msgs.messages[s]) for s in msgs.slot_of.values())
        ]
        payload = {
            "shard_id": self.shard_id,
            "options": self.options,
            "now": float(tree.now),
            "subs": {
                "ids": ids,
                "moving": store.moving[slots].astype(np.uint8).tobytes(),
                "kind": kind.astype(np.int8).tobytes(),
                "region": region.astype("<f8").tobytes(),
                "n_clauses": ncl.astype("<i4").tobytes(),
                "clause_len": lens.astype("<i4").tobytes(),
                "terms": terms.astype("<i4").tobytes(),
                "vocab": list(store.vocab_terms),
                "tags": store.tag[slots].astype("<i4").tobytes(),
            },
            "residual": subscriptions_to_rows(
                [tree.subscription_at(store.slot_of[sid]) for sid in tree.subs]
            ),
            "messages": live,
            "topk": [
                (json.dumps(subscription_to_dict(s)), self.topk.tag[s.id])
                for s in self.topk.subs.values()
            ],
        }
        return _HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION) + pickle.dumps(payload, protocol=5)

    @classmethod
    def restore(cls, data: bytes) -> ShardState:
        """The shard a ``snapshot`` describes: the tree is rebuilt with the bulk path, the live
        messages are replayed at their original publish times (so each expires at the very same
        float), then the clock is set. Raises ``ValidationError`` for bytes that are not a
        snapshot of a known version. O(n log n · depth + messages).
        """
        payload = _load_payload(data)
        subs = _decode_subscriptions(payload["subs"])
        whole = {s.id: s for s in subscriptions_from_rows(payload.get("residual", ()))}
        if whole:
            subs = [whole.get(s.id, s) for s in subs]
        tags = payload["subs"].get("tags")
        tags = [-1] * len(subs) if tags is None else np.frombuffer(tags, "<i4").tolist()
        for raw, tag in payload.get("topk", ()):
            subs.append(subscription_from_dict(json.loads(raw)))
            tags.append(tag)
        state = cls.build(payload["shard_id"], subs, None, tags=tags, **payload["options"])
        now = payload["now"]
        by_time: dict[float, list[Message]] = {}
        for mid, terms, loc, ttl, keywords, text, expiry, *attrs in payload["messages"]:
            attributes = tuple(tuple(a) for a in attrs[0]) if attrs else ()
            msg = Message(mid, tuple(terms), _location(loc), ttl, tuple(keywords), text, attributes)
            by_time.setdefault(_publish_time(expiry, float(ttl), now), []).append(msg)
        tree = state.tree
        for t in sorted(by_time):
            tree.publish_batch(by_time[t], t)
        if math.isfinite(now):
            tree.advance(now)
        return state

    def __getstate__(self) -> dict[str, bytes]:
        # the tree is derived state: pickle the compact snapshot, rebuild on load
        return {"snapshot": self.snapshot()}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        other = ShardState.restore(state["snapshot"])
        self.__dict__.update(other.__dict__)


# ---- helpers --------------------------------------------------------------------------------
def _validate_now(now: Any, last: float) -> None:
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValidationError("now", now, "must be a finite number of seconds")
    if now < last:
        raise ValidationError("now", now, f"must not go back in time (last now={last})")


def _validate_tags(tags: Sequence[int] | None, n: int) -> list[int] | None:
    if tags is None:
        return None
    tags = np.asarray(tags).tolist() if isinstance(tags, np.ndarray) else list(tags)
    if len(tags) != n:
        raise ValidationError("tags", len(tags), f"must give one tag per subscription ({n})")
    for i, t in enumerate(tags):
        if isinstance(t, bool) or not isinstance(t, int) or not -1 <= t < 2**31:
            raise ValidationError(f"tags[{i}]", t, "must be an integer in [-1, 2**31)")
    return tags


def _validate_ids(ids: Sequence[str]) -> list[str]:
    ids = list(ids)
    for i, sub_id in enumerate(ids):
        if not isinstance(sub_id, str):
            raise ValidationError(f"ids[{i}]", sub_id, "must be a string")
    return ids


def _check_message(at: str, m: Any, *, need_terms: bool = True) -> None:
    """Raise ValidationError naming ``at.<field>`` for anything wrong with a message's fields
    (``need_terms`` False: a top-k publish's message may have none)."""
    if not isinstance(m, Message):
        raise ValidationError(at, m, "must be a Message")
    validate_id(f"{at}.id", m.id)
    if (
        not isinstance(m.terms, tuple)
        or (need_terms and not m.terms)
        or not all(isinstance(t, str) for t in m.terms)
    ):
        raise ValidationError(f"{at}.terms", m.terms, "must be a non-empty tuple of terms")
    _validate_location(f"{at}.location", m.location)
    ttl = m.ttl
    if ttl is not None and (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or ttl < 0
    ):
        raise ValidationError(f"{at}.ttl", ttl, "must be a finite number >= 0 or None")
    attrs = m.attributes
    if not isinstance(attrs, tuple) or not all(
        isinstance(a, tuple)
        and len(a) == 2
        and isinstance(a[0], str)
        and (isinstance(a[1], str) or (type(a[1]) is float and math.isfinite(a[1])))
        for a in attrs
    ):
        raise ValidationError(
            f"{at}.attributes", attrs, "must be a tuple of (name, float or str) pairs"
        )


def _plain_message(m: Any) -> bool:
    """A Message whose fields are all of the plain, valid kind (float coordinates in range, a
    non-empty tuple of strings, a float ttl >= 0 or None): what the coordinator sends, passed
    by ``_check_message`` too. False leaves the message to ``_check_message``, which names what
    is wrong."""
    if type(m) is not Message:
        return False
    mid, terms, loc, ttl = m.id, m.terms, m.location, m.ttl
    if m.attributes:  # checked by _check_message
        return False
    if not (
        type(mid) is str
        and 0 < len(mid) <= MAX_ID_LEN
        and mid.isprintable()
        and type(terms) is tuple
        and terms
        and all(type(t) is str for t in terms)
        and (ttl is None or (type(ttl) is float and 0.0 <= ttl < math.inf))
    ):
        return False
    if type(loc) is Point:
        x, y = loc.lon, loc.lat
        return type(x) is float and type(y) is float and -180.0 <= x <= 180.0 and -90.0 <= y <= 90.0
    if type(loc) is Rect:
        x0, y0, x1, y1 = loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat
        return (
            type(x0) is float
            and type(y0) is float
            and type(x1) is float
            and type(y1) is float
            and -180.0 <= x0 <= x1 <= 180.0
            and -90.0 <= y0 <= y1 <= 90.0
        )
    return False


def _validate_location(field: str, loc: Any) -> None:
    if isinstance(loc, Point):
        validate_point(field, loc.lon, loc.lat)
    elif isinstance(loc, Rect):
        validate_rect(field, [loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat])
    else:
        raise ValidationError(field, loc, "must be a Point or a Rect")


def _validate_subscriptions(subs: list[Subscription]) -> None:
    for i, sub in enumerate(subs):
        at = f"subs[{i}]"
        if not isinstance(sub, Subscription):
            raise ValidationError(at, sub, "must be a Subscription")
        validate_id(f"{at}.id", sub.id)
        if type(sub.region) is Point:  # a top-k subscription (paper 001)
            _validate_topk(at, sub)
            continue
        clauses = sub.clauses
        if not isinstance(clauses, tuple) or not 1 <= len(clauses) <= MAX_CLAUSES:
            raise ValidationError(
                f"{at}.clauses", clauses, f"must be a tuple of 1-{MAX_CLAUSES} clauses"
            )
        for j, clause in enumerate(clauses):
            if (
                not isinstance(clause, tuple)
                or not 1 <= len(clause) <= MAX_CLAUSE_TERMS
                or not all(isinstance(t, str) and t for t in clause)
            ):
                raise ValidationError(
                    f"{at}.clauses[{j}]", clause, f"must be a tuple of 1-{MAX_CLAUSE_TERMS} terms"
                )
        r = sub.region
        if isinstance(r, Rect):
            validate_rect(f"{at}.rect", [r.min_lon, r.min_lat, r.max_lon, r.max_lat])
        elif isinstance(r, Circle):
            validate_circle(f"{at}.circle", [r.lon, r.lat, r.radius_m])
        elif isinstance(r, Polygon):  # its rings were validated where it was made
            validate_rect(f"{at}.polygon.box", list(r.box))
        else:
            raise ValidationError(f"{at}.region", r, "must be a Rect, a Circle or a Polygon")
        if not isinstance(sub.moving, bool):
            raise ValidationError(f"{at}.moving", sub.moving, "must be true or false")
        neg = sub.negated
        if neg is not None and (
            not isinstance(neg, tuple)
            or len(neg) != len(clauses)
            or not all(isinstance(n, tuple) and all(isinstance(t, str) for t in n) for n in neg)
        ):
            raise ValidationError(
                f"{at}.negated", neg, "must be None or a tuple of term tuples, one per clause"
            )
        if not isinstance(sub.predicates, tuple) or not all(
            isinstance(p, Predicate) for p in sub.predicates
        ):
            raise ValidationError(
                f"{at}.predicates", sub.predicates, "must be a tuple of Predicates"
            )


def _validate_topk(at: str, sub: Subscription) -> None:
    """A top-k subscription's fields (``shard.model._topk_from_dict`` made them; a shard
    checks them again, as from any caller)."""
    p = sub.region
    validate_point(f"{at}.point", p.lon, p.lat)
    if sub.clauses != ():
        raise ValidationError(f"{at}.clauses", sub.clauses, "a top-k subscription has none")
    if not isinstance(sub.moving, bool):
        raise ValidationError(f"{at}.moving", sub.moving, "must be true or false")
    preds = sub.predicates
    if (
        not isinstance(preds, tuple)
        or not preds
        or not all(isinstance(x, Predicate) for x in preds)
        or len({x.attr for x in preds}) != len(preds)
    ):
        raise ValidationError(
            f"{at}.predicates", preds, "must be 1 or more Predicates on distinct attributes"
        )
    weights = [x.weight for x in preds]
    if not all(type(w) is float and 0.0 < w <= 1.0 for w in weights) or not math.isclose(
        math.fsum(weights), 1.0, abs_tol=1e-6
    ):
        raise ValidationError(f"{at}.predicates", weights, "weights must be > 0 and sum to 1")
    a = sub.alpha
    if type(a) is not float or not 0.0 <= a <= 1.0:
        raise ValidationError(f"{at}.alpha", a, "must be a number in [0, 1]")
    if sub.negated is not None or sub.threshold is not None or sub.weights is not None:
        raise ValidationError(f"{at}.region", p, "a top-k subscription takes no NOT nor ranking")


def _ragged_arange(lens: np.ndarray) -> np.ndarray:
    """Concatenated aranges 0..len-1 for each length."""
    ends = np.cumsum(lens)
    return np.arange(int(ends[-1]) if ends.size else 0) - np.repeat(ends - lens, lens)


def _location_tuple(loc: Point | Rect) -> tuple[float, ...]:
    if isinstance(loc, Point):
        return (loc.lon, loc.lat)
    return (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat)


def _location(t: Sequence[float]) -> Point | Rect:
    return Point(*t) if len(t) == 2 else Rect(*t)


def _publish_time(expiry: float, ttl: float, now: float) -> float:
    """A time p <= ``now`` with p + ttl == expiry in floating point, so that a message replayed
    at p expires at the very instant it did. ``expiry - ttl`` need not be the original publish
    time, but adding ttl back gives the expiry; checked, and nudged by an ulp should rounding
    ever disagree."""
    p = expiry - ttl
    for _ in range(8):
        if p + ttl == expiry:
            break
        p = math.nextafter(p, -math.inf if p + ttl > expiry else math.inf)
    return min(p, now)


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ValidationError("snapshot", f"{module}.{name}", "a snapshot holds builtins only")


def _load_payload(data: bytes) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < _HEADER.size:
        raise ValidationError("snapshot", data, "not a shard snapshot")
    magic, version = _HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise ValidationError("snapshot", bytes(data[:8]), "not a shard snapshot")
    if version not in _READABLE_VERSIONS:
        raise ValidationError(
            "snapshot.version", version, f"unsupported (this build reads {_READABLE_VERSIONS})"
        )
    try:
        payload = _BuiltinsOnly(io.BytesIO(memoryview(data)[_HEADER.size :])).load()
    except ValidationError:
        raise
    except Exception as e:  # a truncated or garbled pickle raises many kinds of errors
        raise ValidationError("snapshot", f"{len(data)} bytes", f"corrupt: {e!r}") from None
    if not isinstance(payload, dict):
        raise ValidationError("snapshot", type(payload).__name__, "corrupt: not a dict")
    return payload


def _decode_subscriptions(d: dict[str, Any]) -> list[Subscription]:
    ids = d["ids"]
    n = len(ids)
    moving = np.frombuffer(d["moving"], np.uint8).astype(bool).tolist()
    kind = np.frombuffer(d["kind"], np.int8).tolist()
    region = np.frombuffer(d["region"], "<f8").reshape(n, 4).tolist()
    ncl = np.frombuffer(d["n_clauses"], "<i4").tolist()
    lens = np.frombuffer(d["clause_len"], "<i4").tolist()
    vocab = d["vocab"]
    words = [vocab[t] for t in np.frombuffer(d["terms"], "<i4").tolist()]
    subs = []
    c = 0
    pos = 0
    for i in range(n):
        clauses = []
        for _ in range(ncl[i]):
            clauses.append(tuple(sorted(words[pos : pos + lens[c]])))
            pos += lens[c]
            c += 1
        r = region[i]
        reg = Circle(r[0], r[1], r[2]) if kind[i] == 1 else Rect(*r)
        subs.append(Subscription(ids[i], tuple(sorted(clauses)), reg, moving[i]))
    return subs
