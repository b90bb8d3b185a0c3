"""Handles through which the engine calls its shards: ``RayShard`` (a shard actor, the cluster)
and ``LocalShard`` (a ``ShardState`` in this process, for tests of the coordinator's logic).
Both answer ``apply(ops, now)``, ``load(subs, now, tags)`` (replaces the whole state, bulk path)
and ``stats()``; a shard that cannot be reached, or does not answer in time, raises
``UnavailableError`` (``ShardDeadError`` once Ray has given its actor up for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from shard.errors import GeoPubSubError, ShardDeadError, UnavailableError
from shard.host.channel import Channel
from shard.model import Subscription, subscriptions_to_rows
from shard.ops import apply_ops
from shard.state import ShardState
from shard.wire import dumps_ops, loads_result

log = logging.getLogger(__name__)

CHANNEL_RETRY_S = 60.0
"""How long a shard whose channel port could not be reached gets its rounds as Ray calls."""
SHARD_CALL_SHARE = 0.5
"""The share of ``deadline_s`` a shard call may take: the rest is left for the round it is part
of (and the round before, rounds finish in order) to be answered within the callers' own wait of
``deadline_s``, so that the other shards' operations of that round are answered, not timed out."""
ACTOR_START_S = 300.0
"""What the first call on a new actor may take on top of its limit: Ray starts a worker process
and the actor compiles its kernels first (~1 s from numba's cache; on a fresh checkout two
actors compiling at once on this 2-core machine took 118 s, so 120 s was too close)."""
LOAD_S_PER_SUBSCRIPTION = 250e-6
"""What a bulk load may take on top of the deadline, per subscription: one core built 1M
subscriptions in 24 s (AP-Tree) and 62 s (AP+-Tree, moving; docs/BENCHMARKS.md), a busy machine
doubles that; this leaves twice as much again (1M: the deadline + 250 s)."""


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

    async def figures(self) -> dict[str, Any]:
        return self.state.figures()

    async def density(self, own, view, cols: int, rows: int, keyword: str) -> bytes:
        return self.state.density(own, view, cols, rows, keyword).astype("<u4").tobytes()


class RayShard:
    """A shard actor (``shard.host.actor.make_shard_actor``). Rounds (``apply``) go over the actor's
    direct channel (``shard.host.channel``; ``channel=False``: one Ray task each), everything else is
    a Ray call. The channel is opened on the first round and again after it broke (the actor
    restarted, say): the round that finds it broken fails with ``UnavailableError`` like a
    failed Ray call, and the engine rebuilds the shard. If the actor answers but its port
    cannot be reached (a network that lets Ray through and nothing else), rounds go as Ray
    calls, and the channel is tried again after ``CHANNEL_RETRY_S``.

    Every call is bounded by ``timeout_s`` (``SHARD_CALL_SHARE`` of ``deadline_s``; a load by more,
    ``LOAD_S_PER_SUBSCRIPTION``, and calls before the actor's first answer by ``ACTOR_START_S``
    more): a stopped or hung actor makes it raise ``UnavailableError``
    instead of blocking the round. A round that times out on the channel drops the connection
    (the rounds behind it fail at once); a load drops it too, because the actor fences the
    connections opened before a load (``shard.host.channel``), and the next round opens a new one.
    Calls are made on the actor in the order they are made here, whichever the path."""

    def __init__(
        self, shard_id: int, actor: Any, *, channel: bool = True, deadline_s: float | None = None
    ) -> None:
        self.shard_id = shard_id
        self.actor = actor
        self.use_channel = channel
        self.timeout_s = None if deadline_s is None else deadline_s * SHARD_CALL_SHARE
        """Longest wait for an answer (a round, stats, opening the channel; a load gets
        ``LOAD_S_PER_SUBSCRIPTION`` more per subscription): past it the call raises
        ``UnavailableError`` (a stopped or hung actor). None: no limit."""
        self._channel: asyncio.Future | None = None
        """Future of the open ``Channel`` (None: unreachable, use Ray calls): rounds made while
        it connects wait for it in order."""
        self._retry_at = 0.0
        self._answered = False
        """Whether the actor answered a call yet (until then calls get ``ACTOR_START_S`` more)."""

    async def apply(self, ops: list[tuple], now: float):
        data = dumps_ops(ops)
        if self.use_channel:
            fut = self._channel
            if fut is None or (fut.done() and self._failed(fut)):
                fut = self._channel = asyncio.ensure_future(self._open())
            channel = await asyncio.shield(fut)
            if channel is not None:
                try:
                    answer = await self._bounded(channel.call(data, now), self.timeout_s)
                except UnavailableError:
                    if self._channel is fut and not channel.broken:  # timed out: the rounds
                        await self._drop_channel()  # behind it fail at once
                    raise
                return loads_result(answer)
        return loads_result(await self._call(self.actor.apply_wire.remote(data, now)))

    def _failed(self, fut: asyncio.Future) -> bool:
        """Whether a new channel should be opened instead of the one ``fut`` gave."""
        if fut.cancelled() or fut.exception() is not None:
            return True
        channel = fut.result()
        return channel.broken if channel is not None else time.monotonic() >= self._retry_at

    async def _open(self) -> Channel | None:
        host, port, token = await self._call(self.actor.channel.remote())
        try:
            return await self._bounded(
                Channel.open((host, port), token, f"shard {self.shard_id}"), self.timeout_s
            )
        except UnavailableError as exc:
            self._retry_at = time.monotonic() + CHANNEL_RETRY_S
            log.warning("%s; its rounds go as Ray calls for %g s", exc, CHANNEL_RETRY_S)
            return None

    async def close(self) -> None:
        await self._drop_channel()

    async def _drop_channel(self) -> None:
        fut, self._channel = self._channel, None
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            channel = fut.result()
            if channel is not None:
                await channel.close()

    async def load(self, subs: Sequence[Subscription], now: float, tags: Sequence[int]) -> int:
        # the actor fences the open connection when it loads (``shard.host.channel``): rounds after
        # the load go over a new one, opened as soon as the load is done (a Ray call, a connection
        # and its handshake: ~10 ms the first round would otherwise wait, and the calls behind it)
        await self._drop_channel()
        # as tuples: pickling 500k dataclasses took ~8 s of the coordinator's start, tuples ~2 s
        rows = subscriptions_to_rows(subs)
        limit = None
        if self.timeout_s is not None:
            limit = self.timeout_s + len(rows) * LOAD_S_PER_SUBSCRIPTION
        n = await self._call(self.actor.load_rows.remote(rows, now, list(tags)), limit)
        if self.use_channel and self._channel is None:  # opened now, not by the first round
            self._channel = asyncio.ensure_future(self._open())
            # (a failure is the next round's to see, ``_failed``; none may come: not logged)
            self._channel.add_done_callback(lambda f: f.cancelled() or f.exception())
        return n

    async def stats(self) -> dict[str, Any]:
        return await self._call(self.actor.stats.remote())

    async def figures(self) -> dict[str, Any]:
        return await self._call(self.actor.figures.remote())

    async def density(self, own, view, cols: int, rows: int, keyword: str) -> bytes:
        return await self._call(self.actor.density.remote(own, view, cols, rows, keyword))

    async def _bounded(self, awaitable, limit: float | None):
        if limit is None:
            return await awaitable
        if not self._answered:
            limit += ACTOR_START_S
        try:
            result = await asyncio.wait_for(awaitable, limit)
        except TimeoutError:
            raise UnavailableError(
                f"shard {self.shard_id} did not answer within {limit:g} s"
            ) from None
        self._answered = True
        return result

    async def _call(self, ref, limit: float | None = None):
        """Await a Ray call of the actor within ``limit`` (None: ``timeout_s``)."""
        import ray.exceptions

        try:
            return await self._bounded(ref, self.timeout_s if limit is None else limit)
        except GeoPubSubError:
            raise
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, GeoPubSubError):
                raise cause from None
            raise
        except ray.exceptions.ActorDiedError as exc:
            raise ShardDeadError(f"shard {self.shard_id}'s actor is dead: {exc}") from None
        except ray.exceptions.RayError as exc:
            raise UnavailableError(f"shard {self.shard_id} unreachable: {exc}") from None

    def kill(self) -> None:
        """End the actor for good (it is being replaced by a new one)."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
