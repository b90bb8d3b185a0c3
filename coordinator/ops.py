"""What the engine queues, routes and answers: one client operation (or a shard's missed item
applied again) with the future its caller waits on, and what the engine needs of a shard.

The kinds: ``"pub"`` (a message), ``"topk"`` (a message to the k best top-k subscriptions),
``"sub"`` (a subscription, new or changed), ``"unsub"``,
``"move"`` (a moving subscription's new position) and ``"redo"`` (an item a reloaded shard
missed, applied to it again with deliveries: ``coordinator.recovery``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shard.model import Point, Subscription, Update


class ShardHandle(Protocol):
    """What the engine needs of a shard (a Ray actor in the cluster, a ShardState in tests)."""

    async def apply(self, ops: list[tuple], now: float) -> tuple[list[Update], list, Any]:
        """``shard.ops.apply_ops``: (expirations, each operation's updates, or for a publish
        the number of subscriptions it reached, the reached subscriptions' slots)."""
        ...

    async def load(self, subs: Sequence[Subscription], now: float, tags: Sequence[int]) -> int:
        """Replace the shard's state by ``subs`` (bulk path) tagged with their slots."""
        ...


@dataclass(slots=True)
class Op:
    kind: str  # "pub" | "topk" | "sub" | "unsub" | "move" | "redo"
    arg: Any
    """The message, the subscription, the subscription id (unsub, move), or the missed item
    (redo)."""
    future: asyncio.Future
    payload: bytes = b""
    point: Point | None = None
    replay: bool = False
    """A live message stored again at start, its deliveries not made again (``replay``)."""
    expiry: float = 0.0
    """A replayed message's expiry."""
    prev: Subscription | None = None
    """A change's subscription before it (None: new), and where it was placed then."""
    prev_at: tuple[int, ...] = ()
    partial: bool = False
    """A publish that failed on some shards and took effect on others (``Recovery.partial``)."""
    shard: int = -1
    """A "redo" operation (``arg``: an item a reloaded shard missed, and the subscription before
    it): the shard it goes to again, its updates delivered (``coordinator.outages``)."""
    clears: bytes = b""
    """A "redo" operation that is its subject's last: the outage record field its round
    deletes."""
    skip: frozenset[int] = frozenset()
    """A replayed message: shards it is not stored in again (they get it as a "redo")."""
    k: int = 0
    """A top-k publish ("topk"): how many subscriptions it goes to (``coordinator.topk``)."""
    placed: tuple[int, ...] | None = None
    """A subscription's shards as its Subscribe call computed them for Redis
    (``Router.shards_of_region``; None: routing computes them)."""
    seq: int = -1
    """The order the engine routed it in (a "redo" operation: its item's first routing):
    what a shard missed of a subscription before it was unsubscribed is an old one's
    (``Recovery.forget``)."""
    deferred: bool = False
    """A subscribe already answered (``coordinator.admission``): its round may wait."""
    born: float = field(default_factory=time.perf_counter)
    """When it reached the engine (``perf_counter``): ``coordinator.metrics`` times a publish
    to its deliveries from here."""


def fail(fut: asyncio.Future, err: Exception) -> None:
    """Fail an operation's future and mark the error seen: its caller may have timed out and
    gone, and asyncio would log every such future at shutdown."""
    fut.set_exception(err)
    fut.exception()
