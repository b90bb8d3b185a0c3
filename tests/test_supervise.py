"""The launcher's supervision (``deploy.supervise``) with real processes and real ``kill -9``: a
foreground ``up`` (the stand-in coordinator of ``fake_coordinator.py``) restarts its coordinator
and its redis-server (the data fsynced before the kill is back) and gives up after
``restart_max`` crashes; a detached cluster with the real coordinator survives ``kill -9`` of its
coordinator (the subscriptions come back from Redis) and of its redis-server (the coordinator
reconnects), and ``down`` stops its supervisor too."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from deploy import local
from deploy.processes import alive, session_members
from deploy.redis_local import ping
from geopubsub.client import GeoPubSubClient
from tests.clusters import launch, launch_settings

pytestmark = pytest.mark.redis

FSYNC_S = 1.5
"""Wait after a write before killing Redis: the AOF is fsynced every second."""


@pytest.fixture(autouse=True)
def _no_cluster_left(tmp_path):
    yield
    local.down(tmp_path, out=io.StringIO())


def _wait_for(what: str, check, within_s: float, poll_s: float = 0.1):
    """Poll ``check()`` until it returns something true; fail naming ``what`` after
    ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} within {within_s:g} s"
        time.sleep(poll_s)


def _restarted(data_dir: Path, name: str, old_pid: int, restarts: int):
    """The manifest once ``name`` runs again with a new pid after ``restarts`` restarts."""

    def check():
        m = local.read_manifest(data_dir) or {}
        proc = m.get(name) or {}
        if (
            proc.get("restarts") == restarts
            and proc.get("pid") != old_pid
            and alive(proc["pid"], started=proc.get("started"))
        ):
            return m
        return None

    return check


def _serving(target: str):
    return lambda: local._health(target) == "SERVING"


def test_foreground_restarts_its_coordinator_and_redis_then_gives_up(tmp_path):
    settings = launch_settings(tmp_path, restart_max=2, restart_window_s=300.0)
    launcher = launch(settings, detach=False)
    try:
        lines = []
        for line in launcher.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        else:
            pytest.fail("".join(lines))
        first = local.read_manifest(tmp_path)
        target, port = first["coordinator"]["target"], first["redis"]["port"]
        password = urlsplit(first["redis"]["url"]).password
        assert password  # the private Redis takes nothing before AUTH
        client = redis.Redis.from_url(first["redis"]["url"], decode_responses=True)
        client.set("written", "before the kill")
        time.sleep(FSYNC_S)

        os.kill(first["coordinator"]["pid"], signal.SIGKILL)
        m = _wait_for(
            "the coordinator restarted",
            _restarted(tmp_path, "coordinator", first["coordinator"]["pid"], 1),
            30,
        )
        assert m["coordinator"]["target"] == target  # the same address (it had bound port 0)
        _wait_for("the restarted coordinator SERVING", _serving(target), 30)

        os.kill(first["redis"]["pid"], signal.SIGKILL)
        m = _wait_for(
            "redis restarted", _restarted(tmp_path, "redis", first["redis"]["pid"], 1), 30
        )
        assert m["redis"]["port"] == port and ping(port, password=password)
        assert not ping(port)  # restarted with its password
        assert client.get("written") == "before the kill"
        client.close()
        text = io.StringIO()
        local.status(tmp_path, out=text)
        assert text.getvalue().count(", restarts 1") == 2, text.getvalue()

        for n in (2, 3):  # restart_max=2: the third crash within the window is one too many
            pid = local.read_manifest(tmp_path)["coordinator"]["pid"]
            os.kill(pid, signal.SIGKILL)
            if n == 2:
                _wait_for("restart 2", _restarted(tmp_path, "coordinator", pid, 2), 30)
        out, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 1, out
    assert "coordinator (pid" in out and "was killed by SIGKILL; restarting it in 0.5 s" in out
    assert "redis restarted" in out
    assert "3 crashes within 300 s, more than restart_max=2; giving up" in out
    assert "geopubsub cluster stopped" in out
    assert not ping(port)
    assert not local.manifest_path(tmp_path).exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_detached_cluster_survives_kill_9_of_its_coordinator_and_its_redis(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOPUBSUB_")}

    def geopubsub(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "geopubsub.tools.cli", *argv, "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    up = geopubsub("up", "--detach", "--port", "0", "--shards", "2", timeout=300)
    first = local.read_manifest(tmp_path)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        target = first["coordinator"]["target"]
        supervisor = first["supervisor"]
        assert f"supervisor pid {supervisor['pid']}" in up.stdout
        with GeoPubSubClient(target) as c:
            c.subscribe("s1", keywords=["ipad"], rect=(-10, -10, 10, 10))
            assert c.publish(["ipad"], point=(1, 2), id="m1").matched == 1
        time.sleep(FSYNC_S)

        os.kill(first["coordinator"]["pid"], signal.SIGKILL)
        _wait_for(
            "the coordinator restarted",
            _restarted(tmp_path, "coordinator", first["coordinator"]["pid"], 1),
            60,
        )
        _wait_for("the restarted coordinator SERVING", _serving(target), 180, poll_s=0.5)
        with GeoPubSubClient(target) as c:
            assert c.get_subscription("s1").keywords == ("ipad",)  # rebuilt from Redis
            assert c.publish(["ipad"], point=(3, 4), id="m2").matched == 1
            stream = c.stream_results("s1")
            got = [next(stream), next(stream)]
            stream.close()
        assert [(d.sequence, d.message_id) for d in got] == [(1, "m1"), (2, "m2")]
        time.sleep(FSYNC_S)

        os.kill(first["redis"]["pid"], signal.SIGKILL)
        _wait_for("redis restarted", _restarted(tmp_path, "redis", first["redis"]["pid"], 1), 60)
        _wait_for("the coordinator SERVING with Redis back", _serving(target), 60, poll_s=0.5)
        with GeoPubSubClient(target) as c:
            c.subscribe("s2", keywords=["ipad"], rect=(0, 0, 5, 5))  # its client reconnected
            assert c.get_subscription("s1").keywords == ("ipad",)
            assert c.publish(["ipad"], point=(1, 1), id="m3").matched == 2
        status = geopubsub("status")
        assert status.returncode == 0, status.stdout + status.stderr
        password = urlsplit(first["redis"]["url"]).password
        assert password and password not in up.stdout + up.stderr + status.stdout
        assert ":***@" in status.stdout
        assert status.stdout.count(", restarts 1") == 2, status.stdout
        assert f"supervisor pid {supervisor['pid']} running" in status.stdout
        assert "health: redis SERVING, shard 0 SERVING, shard 1 SERVING\n" in status.stdout
        log = (tmp_path / local.SUPERVISOR_LOG).read_text()
        assert "Redis's AOF rewrites run in the cpu cgroup" in log, log  # (deploy.forks)
        last = local.read_manifest(tmp_path)
    finally:
        down = geopubsub("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopping the supervisor" in down.stdout
    assert not alive(supervisor["pid"], started=supervisor["started"])
    for name in ("coordinator", "redis"):
        assert not alive(last[name]["pid"], started=last[name]["started"])
    assert session_members(last["coordinator"]["pid"]) == []
    assert not local.manifest_path(tmp_path).exists()
