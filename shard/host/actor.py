"""The shard's Ray actor: a thin shell that delegates every call to a ``ShardState``.

All logic lives in ``shard.state`` (Ray-free, tested directly); this module adds only what being
a Ray actor needs: the remote class, its restart policy, and a guard against serving from a
state that a restart emptied.

Restart policy (``make_shard_actor``):

* ``max_restarts``: Ray brings a dead shard process back that many times (the coordinator
  passes ``Settings.shard_max_restarts``, 3; past them it makes a new actor; -1, the default
  here, ``DEFAULT_MAX_RESTARTS``: always), so the coordinator's handle stays valid meanwhile.
  A restart re-runs the constructor: the shard comes
  up **empty**, and marked so; every round then raises ``UnavailableError`` until the
  coordinator rebuilds it with ``load_rows`` (its subscriptions from Redis, bulk path). An
  empty shard answering publishes would silently deliver nothing.
* ``max_task_retries=0`` (``DEFAULT_MAX_TASK_RETRIES``): a call in flight when the process dies
  fails (``RayActorError``) instead of being re-run. A retry would run against the empty
  restarted state, or apply a batch twice; the coordinator replays what it needs after the
  rebuild, knowing which batches were answered.
* ``max_concurrency=1``: calls run one at a time, in the order one caller submitted them, which
  the ± update semantics need.

The constructor compiles the index kernels first (``shard.host.warmup``; ~1 s from numba's cache,
~30 s on a fresh checkout), so no client call waits for the compiler.

``info()`` never raises: it reports the shard id, whether a rebuild is needed, and an
``incarnation`` token that changes with every (re)start, so a coordinator can tell a restart.

``channel()`` opens the direct connection the coordinator sends its rounds over
(``shard.host.channel``: a Ray call costs ~1 ms of CPU on the two sides together). Its
requests run on the channel's thread, so every method that touches the state holds the actor's
lock: calls from Ray and from the channel never interleave.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from shard.errors import UnavailableError
from shard.host.channel import ChannelServer
from shard.host.heap import GcPauses, freeze_long_lived
from shard.host.warmup import warm_up_shard
from shard.model import subscriptions_from_rows
from shard.ops import apply_round
from shard.state import ShardState
from shard.wire import dumps_result, loads_ops

log = logging.getLogger(__name__)

SLOW_ROUND_S = 0.1
"""A round that takes the shard longer is logged (to the actor's stderr): its operations by
kind and the subtrees it rebuilt. A shard's long call stalls every round behind it, which shows
as a latency spike at the subscribers (docs/RELIABILITY.md, soak-18)."""

DEFAULT_MAX_RESTARTS = -1
"""Restart a dead shard without limit: its state is always rebuildable (Redis + snapshot)."""

DEFAULT_MAX_TASK_RETRIES = 0
"""Never re-run a call that was in flight at a crash (it would run on the emptied state)."""


def _locked(method: Callable) -> Callable:
    """Run ``method`` holding the actor's lock (see the module docstring)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class ShardActor:
    """The actor body (``RemoteShardActor`` is its Ray class). Every method takes a batch and
    delegates to ``ShardState``; see there for semantics and complexity."""

    def __init__(self, shard_id: int, options: dict[str, Any] | None = None) -> None:
        self._shard_id = shard_id
        self._options = dict(options or {})
        self._state = ShardState(shard_id, **self._options)  # validates the options first
        warm_up_shard(self._options)
        self._gc = GcPauses().install()
        self._incarnation = uuid.uuid4().hex
        self._needs_rebuild = _was_reconstructed()
        self._lock = threading.RLock()
        self._channel: ChannelServer | None = None

    def _live(self) -> ShardState:
        if self._needs_rebuild:
            raise UnavailableError(f"shard {self._shard_id} restarted empty and awaits load_rows")
        return self._state

    # ---- lifecycle ----------------------------------------------------------------------------
    @_locked
    def info(self) -> dict[str, Any]:
        """Shard id, incarnation token, whether it awaits a rebuild, size, clock and the
        process id (fault tests stop it). Never raises."""
        return {
            "shard_id": self._shard_id,
            "incarnation": self._incarnation,
            "needs_rebuild": self._needs_rebuild,
            "subscriptions": len(self._state),
            "now": self._state.now,
            "pid": os.getpid(),
        }

    @_locked
    def load_rows(
        self, rows: Sequence[tuple], now: float | None, tags: Sequence[int] | None = None
    ) -> int:
        """Replace the whole state by a bulk build, at ``now`` (no live messages), of the
        subscriptions sent as ``shard.model.subscriptions_to_rows`` (cheaper to pickle than the
        objects), with their ``tags``. Idempotent. Returns the number of subscriptions."""
        self._fence()
        state = ShardState.build(
            self._shard_id, subscriptions_from_rows(rows), now, tags=tags, **self._options
        )
        self._state = state
        self._needs_rebuild = False
        freeze_long_lived()
        return len(state)

    def _fence(self) -> None:
        """A new state: rounds sent over a channel connection opened before it are turned
        away (``shard.host.channel``), also when this load fails half-way."""
        if self._channel is not None:
            self._channel.fence()

    # ---- batches ------------------------------------------------------------------------------
    @_locked
    def apply_wire(self, ops: bytes, now: float) -> bytes:
        """One coordinator round: advance to ``now``, then the operations in order
        (``shard.ops.apply_round``), the operations and the answer as ``shard.wire`` bytes
        (msgpack: what the channel carries; nothing is unpickled)."""
        return dumps_result(self._timed_round(ops, now))

    def _timed_round(self, data: bytes, now: float):
        state = self._live()
        rebuilt = state.rebuilds
        t0 = time.perf_counter()
        out = apply_round(state, data, now)
        took = time.perf_counter() - t0
        if took > SLOW_ROUND_S:
            kinds = collections.Counter(op[0] for op in loads_ops(data))  # (it was read once)
            log.warning(
                "%s shard %d: a round took %.0f ms: %s; %d subtrees rebuilt; %d live messages",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - took)),
                self._shard_id,
                1000 * took,
                ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no operations",
                state.rebuilds - rebuilt,
                state.live_messages,
            )
        return out

    @_locked
    def channel(self) -> tuple[str, int, bytes]:
        """(host, port, token) of the direct connection for rounds (``shard.host.channel``), opened
        on the first call on this node's address."""
        if self._channel is None:
            self._channel = ChannelServer(
                ray.util.get_node_ip_address(), self.apply_wire, lock=self._lock
            )
        return (*self._channel.address, self._channel.token)

    def figures(self) -> dict[str, Any]:
        """Cheap figures for the metrics endpoint (``ShardState.figures``), with this process's
        CPU seconds, resident memory and garbage collections; without the lock, so that a
        scrape never waits behind a round (each read is one atomic length or counter)."""
        gcp = self._gc
        return self._state.figures() | {
            "node": ray.get_runtime_context().get_node_id(),
            "cpu_s": time.process_time(),
            "rss_bytes": _rss_bytes(),
            "gc_collections": list(gcp.count),
            "gc_pause_s": list(gcp.total_s),
        }

    @_locked
    def density(
        self, own: Sequence[float], view: Sequence[float], cols: int, rows: int, keyword: str
    ) -> bytes:
        """``ShardState.density``, the counts as little-endian uint32 bytes."""
        counts = self._live().density(own, view, cols, rows, keyword)
        return counts.astype("<u4").tobytes()

    @_locked
    def stats(self) -> dict[str, Any]:
        """The state's figures, and this process's garbage-collector pauses."""
        gcp = self._gc
        return self._live().stats() | {
            "gc_collections": list(gcp.count),
            "gc_max_pause_ms": [round(1000 * x, 1) for x in gcp.max_s],
        }


def _rss_bytes() -> int:
    """This process's resident memory (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


RemoteShardActor = ray.remote(ShardActor)
"""The Ray actor class; create shards with ``make_shard_actor``."""


def make_shard_actor(
    shard_id: int,
    options: dict[str, Any] | None = None,
    *,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    max_task_retries: int = DEFAULT_MAX_TASK_RETRIES,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float | None = None,
    node_id: str | None = None,
) -> Any:
    """Start shard ``shard_id`` as a Ray actor (``ray.init`` must have run) and return its handle.
    ``options`` go to ``ShardState`` / ``APPlusTree``; ``name``/``namespace`` make it a named
    actor; ``num_cpus`` reserves CPUs for it (Ray's default reserves none once it runs);
    ``node_id`` asks for that Ray node (``shard_node``), and Ray's scheduler decides without
    it. After
    ``ray.init()``::

        handle = make_shard_actor(0, {"theta_p": 64}); ray.get(handle.info.remote())
    """
    opts: dict[str, Any] = {
        "max_restarts": max_restarts,
        "max_task_retries": max_task_retries,
        "max_concurrency": 1,
    }
    if node_id is not None:  # there if it can be, elsewhere if that node is gone
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    if name is not None:
        opts["name"] = name
    if namespace is not None:
        opts["namespace"] = namespace
    if num_cpus is not None:
        opts["num_cpus"] = num_cpus
    return RemoteShardActor.options(**opts).remote(shard_id, options)


def shard_node(shard_id: int) -> str | None:
    """The Ray node for shard ``shard_id``: the cluster's alive nodes that offer CPUs, in
    the order of their ids, shard k on node k mod their number (on one node: that node). Ray's
    own strategies packed both shards of a two-node cluster onto one node (SPREAD included)."""
    nodes = sorted(
        n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")
    )
    return nodes[shard_id % len(nodes)] if nodes else None


def _was_reconstructed() -> bool:
    """True inside an actor process that Ray restarted; False on the first start and outside Ray."""
    if not ray.is_initialized():
        return False
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id() is None:
        return False
    with warnings.catch_warnings():  # Ray's own property reads its deprecated ``actor_id``
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ctx.was_current_actor_reconstructed)
