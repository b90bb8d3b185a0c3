"""``geopubsub load --master spark://...`` against a Spark standalone master and worker started
from the pyspark distribution (``deploy.spark_standalone``), into a real redis-server: the same
subscriptions and rejects as the ``local[2]`` runs, and the master shows the application done
on its worker."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from coordinator.metadata import Metadata
from deploy import spark_standalone
from deploy.processes import alive
from shard.model import subscription_from_dict, subscription_to_dict
from shard.workload import write_jsonl
from tests.cli import ROOT, run_geopubsub
from tests.workloads import random_subscription

pytestmark = pytest.mark.spark


def test_the_loader_runs_on_a_standalone_master_and_worker(redis_url, tmp_path):
    rng = random.Random(5)
    rows = [subscription_to_dict(random_subscription(rng, f"s{i}")) for i in range(300)]
    rows.append({"id": "bad", "keywords": [], "rect": [0, 0, 1, 1]})
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    rejects = tmp_path / "rejects.txt"
    cluster = spark_standalone.start(tmp_path / "spark", workers=1, cores=2, memory="1g")
    try:
        [worker] = cluster.workers()
        assert worker["state"] == "ALIVE" and worker["cores"] == 2
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        argv = ["load", str(path), "--master", cluster.url, "--redis-url", redis_url]
        argv += ["--namespace", "standalone", "--shards", "2", "--rejects", str(rejects)]
        proc = run_geopubsub(*argv, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "loaded 300 subscriptions (300 new" in proc.stdout, proc.stdout
        assert rejects.read_text().splitlines() == [
            f"{path}:301: keywords=[]: must hold 1-16 keywords"
        ]
        with urllib.request.urlopen(f"{cluster.webui}/json/", timeout=10) as r:
            master = json.loads(r.read())
        apps = master["completedapps"]
        assert [a["name"] for a in apps] == ["geopubsub-load"], apps
        assert apps[0]["cores"] == 2  # it ran on the worker's cores, not in the driver
    finally:
        cluster.stop()
    assert all(p.poll() is not None for p in cluster.procs) or not cluster.procs
    r = redis.Redis.from_url(redis_url)
    assert r.scard("standalone:subs") == 300
    r.close()

    async def read_back():
        md = Metadata(redis_url, "standalone")
        got = [s async for batch in md.iter_subscriptions() for s in batch]
        await md.close()
        return got

    got = {s.id: s for s in asyncio.run(read_back())}
    want = {r["id"]: subscription_from_dict(r) for r in rows[:-1]}
    assert got == want


def test_the_spark_command_serves_until_sigterm_and_leaves_nothing(tmp_path):
    """``geopubsub spark`` prints its master and stops it and its worker on SIGTERM (as on
    Ctrl-C), the JVMs included."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "spark", "--cores", "1", "--memory", "1g"]
    proc = subprocess.Popen(
        [*argv, "--data-dir", str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    jvms: list[int] = []
    try:
        first = proc.stdout.readline()
        assert first.startswith("Spark master spark://127.0.0.1:"), first
        url = first.split()[2]
        jvms = session_members_of_children(proc.pid)
        assert len(jvms) == 2, jvms  # the master and the worker
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not [p for p in jvms if alive(p)], url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        for p in jvms:  # (only when the test failed: left behind)
            if alive(p):
                os.kill(p, signal.SIGKILL)


def session_members_of_children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the master's and the worker's JVMs)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out
