"""Handles through which the engine calls its shards: ``RayShard`` (a shard actor, the cluster)
and ``LocalShard`` (a ``ShardState`` in this process, for tests of the coordinator's logic).
Both answer ``apply(ops, now)``, ``load(subs, now, tags)`` (replaces the whole state, bulk path)
and ``stats()``; a shard that cannot be reached raises ``UnavailableError``.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence
from typing import Any

from shard.channel import Channel
from shard.errors import GeoPubSubError, UnavailableError
from shard.model import Subscription, subscriptions_to_rows
from shard.ops import apply_ops, dumps_ops
from shard.state import ShardState


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
    failed Ray call, and the engine rebuilds the shard."""

    def __init__(self, shard_id: int, actor: Any, *, channel: bool = True) -> None:
        self.shard_id = shard_id
        self.actor = actor
        self.use_channel = channel
        self._channel: asyncio.Future | None = None
        """Future of the open ``Channel``: rounds made while it connects wait for it in order."""

    async def apply(self, ops: list[tuple], now: float):
        data = dumps_ops(ops)
        if not self.use_channel:
            return pickle.loads(await self._call(self.actor.apply_pickled.remote(data, now)))
        if self._channel is None or (self._channel.done() and self._failed(self._channel)):
            self._channel = asyncio.ensure_future(self._open())
        channel = await asyncio.shield(self._channel)
        return pickle.loads(await channel.call(data, now))

    @staticmethod
    def _failed(fut: asyncio.Future) -> bool:
        return fut.cancelled() or fut.exception() is not None or fut.result().broken

    async def _open(self) -> Channel:
        host, port, token = await self._call(self.actor.channel.remote())
        return await Channel.open((host, port), token, f"shard {self.shard_id}")

    async def close(self) -> None:
        if self._channel is not None and self._channel.done() and not self._failed(self._channel):
            await self._channel.result().close()
        self._channel = None

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
