"""The shards on a Ray cluster of two nodes, each started by ``ray start`` with a resource of its
own (``tests.clusters.ray_nodes``), the real coordinator joining it with ``geopubsub up
--ray-address``: the shards land on both nodes, rounds cross the node addresses over the shard
channel, and what subscribers get equals the brute-force oracle."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy import local
from deploy.processes import free_port
from geopubsub.client import GeoPubSubClient
from shard.brute import subscription_matches
from tests.clusters import ray_nodes
from tests.workloads import random_message, random_subscription

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _shard_nodes(metrics_port: int) -> dict[str, str]:
    """Shard -> the Ray node it runs on, from the metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {
        s.labels["shard"]: s.labels["node"]
        for f in text_string_to_metric_families(text)
        if f.name == "geopubsub_shard_info"
        for s in f.samples
    }


def test_the_shards_run_across_two_ray_nodes_and_deliver_like_the_oracle(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GEOPUBSUB_") and k not in ("RAY_ADDRESS", "RAY_worker_niceness")
    }
    cli = [sys.executable, "-m", "geopubsub.tools.cli"]
    where = ["--data-dir", str(tmp_path)]

    def geopubsub(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cli, *argv, *where], capture_output=True, text=True, env=env, timeout=timeout
        )

    rng = random.Random(8)
    subs = [random_subscription(rng, f"s{i}") for i in range(80)]
    msgs = [random_message(rng, f"m{i}") for i in range(120)]
    metrics_port = free_port()
    with ray_nodes(2) as address:
        up = geopubsub(
            "up",
            "--detach",
            "--port",
            "0",
            "--shards",
            "2",
            "--ray-address",
            address,
            "--metrics-port",
            str(metrics_port),
            timeout=300,
        )
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in up.stdout
            target = local.read_manifest(tmp_path)["coordinator"]["target"]
            nodes = _shard_nodes(metrics_port)
            assert sorted(nodes) == ["0", "1"] and len(set(nodes.values())) == 2, nodes
            with GeoPubSubClient(target) as c:
                c.subscribe_many(subs, batch=16)
                matched = [r.matched for r in c.publish_many(msgs)]
                assert matched == [sum(subscription_matches(s, m) for s in subs) for m in msgs]
                movers = [s for s in subs if s.moving]
                for s in movers[:5]:  # a move may take a subscription to the other node's shard
                    c.update_location(s.id, rng.uniform(-170, 170), rng.uniform(-80, 80))
                stats = c.stats()
                assert stats.subscriptions == len(subs)
                assert stats.published == len(msgs)
                assert [x.shard for x in stats.shards] == [0, 1]
        finally:
            down = geopubsub("down", timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
