"""The clusters the tests run: a coordinator with in-process shards (``Node``, and ``DownShard``,
a shard that crashes when told), one with real Ray shard actors (``Cluster``), the local
launcher in a process of its own (``launch``), and their settings."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from coordinator.engine import Engine
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard, RayShard
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.host.actor import make_shard_actor
from shard.state import ShardState

FAKE = [sys.executable, str(Path(__file__).with_name("fake_coordinator.py"))]
"""The stand-in coordinator ``launch`` starts (it keeps the real one's command line)."""
SHARD_DEADLINE_S = 120.0
"""Shard calls are bounded (half of this) far above what any round of these tests takes."""


def coordinator_settings(redis_url: str, namespace: str, **kw) -> Settings:
    return Settings.load(
        flags={"port": 0, "redis_url": redis_url, "namespace": namespace, "shards": 2, **kw}
    )


class Node:
    """A coordinator with in-process shards and a client stub; ``crash`` stops it the way a
    killed process would: no final writes, nothing drained."""

    def __init__(self, settings: Settings, shard=LocalShard) -> None:
        self.settings = settings
        self.shard = shard

    async def __aenter__(self):
        self.server, port, self.app = await create_server(self.settings, self.shard)
        self.target = f"127.0.0.1:{port}"
        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub = pb_grpc.GeoPubSubStub(self.channel)
        self.crashed = False
        return self

    async def crash(self) -> None:
        self.crashed = True
        await self.channel.close()
        await self.server.stop(None)
        app = self.app
        app.engine._task.cancel()
        for task in app.engine.recovery.reloads.values():  # (a killed process reloads nothing)
            task.cancel()
        writer = app.deliveries._writer
        if writer is not None:
            writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(app.engine._task, return_exceptions=True)
        await app.md.close()

    async def __aexit__(self, *exc):
        if not self.crashed:
            await self.channel.close()
            await stop_server(self.server, self.app)


class DownShard(LocalShard):
    """A shard that, when told, crashes and stays down (its calls and loads fail) for a while."""

    down_until = 0.0

    def _check(self) -> None:
        if time.monotonic() < DownShard.down_until:
            self.state = ShardState(self.shard_id)
            raise RuntimeError("shard process is down")

    async def apply(self, ops, now):
        self._check()
        return await super().apply(ops, now)

    async def load(self, subs, now, tags):
        self._check()
        return await super().load(subs, now, tags)


class Cluster:
    """The coordinator with two shard actors, and a client channel to it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def __aenter__(self):
        self.actors = []

        def factory(k: int):
            actor = make_shard_actor(k)
            self.actors.append(actor)
            # bounded, so that a shard that never answers fails the test instead of hanging it
            return RayShard(k, actor, deadline_s=SHARD_DEADLINE_S)

        self.server, self.port, self.app = await create_server(self.settings, factory)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GeoPubSubStub(self.channel)
        return self

    async def __aexit__(self, *exc):
        import ray

        await self.channel.close()
        await stop_server(self.server, self.app)
        for a in self.actors:
            ray.kill(a)


async def settled(engine: Engine, step: float = 0.002, tries: int = 2000) -> None:
    """Until no shard is down and nothing waits, twice ``10 * step`` apart (polled every
    ``step`` s, at most ``tries`` times). Here the test clock stands still: nothing expires."""
    for _ in range(tries):
        await asyncio.sleep(step)
        if not engine.recovery.down_shards() and not engine.pending and not engine.inflight:
            await asyncio.sleep(10 * step)
            if not engine.recovery.down_shards() and not engine.pending and not engine.inflight:
                return
    raise AssertionError(f"the engine did not settle: down {engine.recovery.down_shards()}")


def launch(
    settings: Settings, *, detach: bool, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``supervise.up`` in a process of its own, as ``geopubsub up`` runs it."""
    code = (
        "import json, sys\n"
        "from coordinator.settings import Settings\n"
        "from deploy import supervise\n"
        "settings = Settings(**json.loads(sys.argv[1]))\n"
        "sys.exit(supervise.up(settings, detach=sys.argv[2] == 'detach', command=json.loads(sys.argv[3])))\n"
    )
    argv = [sys.executable, "-c", code, json.dumps(dataclasses.asdict(settings))]
    argv += ["detach" if detach else "foreground", json.dumps(FAKE)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def launch_settings(tmp_path: Path, **flags) -> Settings:
    return Settings.load(flags={"data_dir": str(tmp_path), "port": 0, **flags})
