"""Handles through which the engine calls its shards: ``RayShard`` (a shard actor, the cluster)
and ``LocalShard`` (a ``ShardState`` in this process, for tests of the coordinator's logic).
Both answer ``apply(ops, now)``, ``load(subs, now, tags)`` (replaces the whole state, bulk path)
and ``stats()``; a shard that cannot be reached raises ``UnavailableError``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Sequence
from typing import Any

from shard.channel import Channel
from shard.errors import GeoPubSubError, UnavailableError
from shard.model import Subscription, subscriptions_to_rows
from shard.ops import apply_ops, dumps_ops
from shard.state import ShardState

log = logging.getLogger(__name__)

CHANNEL_RETRY_S = 60.0
"""How long a shard whose channel port could not be reached gets its rounds as Ray calls."""


class LocalShard:
    def __init__(self, shard_id: int, **options: Any) -> None:
        self.shard_id = shard_id
        self.options = options
        self.state = ShardState(shard_id, **options)

    async def apply(self, ops: list[tuple], now: float):
        return apply_ops(self.state, ops, now)

    async def load(self, subs: Sequence[Subscription], now: float, tags: Sequence[int]) -> int:
        self.state = ShardState.build(self.shard_id, subs, now, tags=tags, **self.options)
        return len(self.state)

    async def stats(self) -> dict[str, Any]:
        return self.state.stats()


class RayShard:
    """A shard actor (``shard.actor.make_shard_actor``). Rounds (``apply``) go over the actor's
    direct channel (``shard.channel``; ``channel=False``: one Ray task each), everything else is
    a Ray call. The channel is opened on the first round and again after it broke (the actor
    restarted, say): the round that finds it broken fails with ``UnavailableError`` like a
    failed Ray call, and the engine rebuilds the shard. If the actor answers but its port
    cannot be reached (a network that lets Ray through and nothing else), rounds go as Ray
    calls, and the channel is tried again after ``CHANNEL_RETRY_S``."""

    def __init__(self, shard_id: int, actor: Any, *, channel: bool = True) -> None:
        self.shard_id = shard_id
        self.actor = actor
        self.use_channel = channel
        self._channel: asyncio.Future | None = None
        """Future of the open ``Channel`` (None: unreachable, use Ray calls): rounds made while
        it connects wait for it in order."""
        self._retry_at = 0.0

    async def apply(self, ops: list[tuple], now: float):
        data = dumps_ops(ops)
        if self.use_channel:
            fut = self._channel
            if fut is None or (fut.done() and self._failed(fut)):
                fut = self._channel = asyncio.ensure_future(self._open())
            channel = await asyncio.shield(fut)
            if channel is not None:
                return pickle.loads(await channel.call(data, now))
        return pickle.loads(await self._call(self.actor.apply_pickled.remote(data, now)))

    def _failed(self, fut: asyncio.Future) -> bool:
        """Whether a new channel should be opened instead of the one ``fut`` gave."""
        if fut.cancelled() or fut.exception() is not None:
            return True
        channel = fut.result()
        return channel.broken if channel is not None else time.monotonic() >= self._retry_at

    async def _open(self) -> Channel | None:
        host, port, token = await self._call(self.actor.channel.remote())
        try:
            return await Channel.open((host, port), token, f"shard {self.shard_id}")
        except UnavailableError as exc:
            self._retry_at = time.monotonic() + CHANNEL_RETRY_S
            log.warning("%s; its rounds go as Ray calls for %g s", exc, CHANNEL_RETRY_S)
            return None

    async def close(self) -> None:
        fut, self._channel = self._channel, None
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            channel = fut.result()
            if channel is not None:
                await channel.close()

    async def load(self, subs: Sequence[Subscription], now: float, tags: Sequence[int]) -> int:
        # as tuples: pickling 500k dataclasses took ~8 s of the coordinator's start, tuples ~2 s
        rows = subscriptions_to_rows(subs)
        return await self._call(self.actor.load_rows.remote(rows, now, list(tags)))

    async def stats(self) -> dict[str, Any]:
        return await self._call(self.actor.stats.remote())

    async def _call(self, ref):
        import ray.exceptions

        try:
            return await ref
        except GeoPubSubError:
            raise
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, GeoPubSubError):
                raise cause from None
            raise
        except ray.exceptions.RayError as exc:
            raise UnavailableError(f"shard {self.shard_id} unreachable: {exc}") from None
