"""``python -m coordinator``: run the coordinator (gRPC on HOST:PORT, shards as Ray actors) in the
foreground until SIGINT/SIGTERM. Needs a reachable Redis (``--redis-url``); starts a local Ray
unless ``--ray-address`` names a cluster to join. ``geopubsub up`` runs it for you.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import time

from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import RayShard
from shard.errors import GeoPubSubError
from shard.host.actor import make_shard_actor, shard_node
from shard.host.heap import FULL_CHECK_EVERY_S, GcPauses, collect_if_grown, young_collections_only
from shard.host.runtime import hand_over_promptly

log = logging.getLogger("coordinator")

SHARD_NICENESS = 0
"""The nice value of the shard actors on a local Ray. Ray starts its workers at 15 by default, so
whenever the two cores are busy (an AOF rewrite, a collection, the clients) the shards, which
every round waits for, lost the CPU to the coordinator and Redis. ``RAY_worker_niceness`` in
the environment wins; a joined cluster (``--ray-address``) keeps its own setting."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m coordinator", description=__doc__)
    p.add_argument("--config", help="TOML settings file")
    p.add_argument("--shards", type=int)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--redis-url")
    p.add_argument("--ray-address")
    p.add_argument("--data-dir")
    p.add_argument("--metrics-port", type=int)
    p.add_argument("--metrics-host")
    return p.parse_args(argv)


async def serve(settings) -> None:
    import ray

    if settings.ray_address:
        ray.init(address=settings.ray_address, include_dashboard=False, log_to_driver=False)
    elif not ray.is_initialized():
        config = {} if "RAY_worker_niceness" in os.environ else {"worker_niceness": SHARD_NICENESS}
        ray.init(include_dashboard=False, log_to_driver=False, _system_config=config)

    def factory(k: int) -> RayShard:
        actor = make_shard_actor(
            k,
            settings.shard_options(),
            max_restarts=settings.shard_max_restarts,
            node_id=shard_node(k),
        )
        return RayShard(
            k, actor, channel=settings.shard_calls == "channel", deadline_s=settings.deadline_s
        )

    server, port, app = await create_server(settings, factory)
    # the loaded subscriptions are frozen out of collections by every (re)load; what comes
    # later (moved subscriptions, live messages) is collected in full only once it has grown
    # (shard.host.heap)
    young_collections_only()
    full_collections = asyncio.get_running_loop().create_task(_collect_everything())
    hand_over_promptly()  # gRPC's and Ray's threads wake the loop without waiting 5 ms for the GIL
    GcPauses(
        on_long=lambda g, dt, n: log.warning(
            "gc: generation %d collection took %.0f ms (%d collected; %s tracked per generation)",
            g,
            dt * 1e3,
            n,
            gc.get_count(),
        )
    ).install()
    print(f"geopubsub coordinator listening on {settings.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    full_collections.cancel()
    await stop_server(server, app)
    ray.shutdown()


async def _collect_everything() -> None:
    """Every ``FULL_CHECK_EVERY_S``, a full collection of what was created since the last
    freeze if that has grown (``shard.host.heap.collect_if_grown``), its survivors frozen too."""
    while True:
        await asyncio.sleep(FULL_CHECK_EVERY_S)
        t0 = time.perf_counter()
        found = collect_if_grown()
        if found is not None:
            log.info(
                "gc: full collection (%d found garbage) in %.0f ms",
                found,
                1e3 * (time.perf_counter() - t0),
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    flags = {k: v for k, v in vars(args).items() if k != "config"}
    try:
        settings = Settings.load(file=args.config, env=os.environ, flags=flags)
        asyncio.run(serve(settings))
    except GeoPubSubError as exc:
        print(f"geopubsub coordinator: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
