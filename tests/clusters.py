"""The clusters the tests run: a coordinator with in-process shards (``Node``, and ``DownShard``,
a shard that crashes when told), one with real Ray shard actors (``Cluster``), the local
launcher in a process of its own (``launch``), and their settings."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from coordinator.engine import Engine
from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard, RayShard
from deploy.processes import free_port, log_tail, stop_process, stop_session
from geopubsub.convert import to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
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
            actor = make_shard_actor(k, self.settings.shard_options())
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


async def subscribe_all(stub, subs) -> None:
    """Register ``subs`` through the stub, in batches of at most 1,000 (one transaction each)."""
    for i in range(0, len(subs), 1000):
        await stub.Subscribe(
            pb.SubscribeRequest(
                subscriptions=[to_proto_subscription(s) for s in subs[i : i + 1000]]
            )
        )


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


@contextlib.contextmanager
def ray_nodes(n: int = 2):
    """A Ray cluster of ``n`` nodes on this machine, each a ``ray start --block`` of one CPU with
    a resource of its own (``geopubsub_node_<i>``), as a user starts one per machine; yields the
    head's address. Its files are under a temporary directory of its own (its address file too,
    so that no later ``ray.init()`` on this machine finds it); every process is stopped after."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    tmp = Path(tempfile.mkdtemp(prefix="gpsray", dir="/tmp"))  # (Ray's socket paths are short)
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    cmds = [
        [ray_bin, "start", "--head", f"--port={port}", f"--temp-dir={tmp}", *common]
        + ["--include-dashboard=false", '--resources={"geopubsub_node_0": 1}']
    ]
    cmds += [
        [
            ray_bin,
            "start",
            f"--address={address}",
            *common,
            f'--resources={{"geopubsub_node_{i}": 1}}',
        ]
        for i in range(1, n)
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    procs: list[subprocess.Popen] = []
    try:
        for i, cmd in enumerate(cmds):
            log = open(tmp / f"node-{i}.log", "wb")  # noqa: SIM115 (the child's, closed below)
            procs.append(
                subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
            log.close()
            _wait_nodes(ray_bin, address, i + 1, env, tmp)
        yield address
    finally:
        for p in reversed(procs):
            stop_process(p.pid, popen=p, grace_s=15.0)
            stop_session(p.pid, settle_s=1.0)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_nodes(ray_bin: str, address: str, n: int, env: dict, tmp: Path) -> None:
    """Until ``ray status`` at ``address`` lists ``n`` nodes (120 s at most)."""
    deadline = time.monotonic() + 120
    out = ""
    while time.monotonic() < deadline:
        r = subprocess.run(
            [ray_bin, "status", f"--address={address}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        out = r.stdout + r.stderr
        if sum(f"geopubsub_node_{i}" in out for i in range(n)) == n:
            return
        time.sleep(1.0)
    logs = "\n".join(log_tail(p) for p in sorted(tmp.glob("node-*.log")))
    raise AssertionError(f"Ray at {address} did not list {n} nodes: {out[-2000:]}\n{logs}")
