"""The local launcher (``deploy.local``) with a real redis-server and a stand-in coordinator
(``fake_coordinator.py``, which keeps the coordinator's command-line contract): start, health wait,
settings hand-over, cluster.json, status, down, foreground stop on Ctrl-C / SIGTERM, cleanup of the
coordinator's leftover processes, and the failure paths."""

from __future__ import annotations

import dataclasses
import io
import json
import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from coordinator.settings import Settings
from deploy import local
from deploy.processes import alive, free_port, session_members
from deploy.redis_local import RedisServer, ping
from shard.errors import UnavailableError
from tests.clusters import FAKE, launch, launch_settings

pytestmark = pytest.mark.redis


@pytest.fixture(autouse=True)
def _no_cluster_left(tmp_path):
    """Whatever a test leaves running (it failed half-way) is stopped."""
    yield
    for data_dir in (tmp_path, tmp_path / "cluster"):
        local.down(data_dir, out=io.StringIO())


def _up_detached(settings: Settings, **kwargs) -> str:
    launcher = launch(settings, detach=True, **kwargs)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out
    return out


def _report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "fake_coordinator.json").read_text())


def test_up_detached_hands_over_the_settings_and_down_stops_everything(tmp_path):
    settings = launch_settings(
        tmp_path, shards=3, batch_max=9, redis_maxmemory_mb=64, redis_fsync="always"
    )
    # An inherited GEOPUBSUB_* variable must not override the resolved settings.
    out = _up_detached(settings, env={"GEOPUBSUB_BATCH_MAX": "7", "FAKE_COORDINATOR_LEFTOVER": "1"})
    manifest = local.read_manifest(tmp_path)
    coord, red = manifest["coordinator"], manifest["redis"]
    assert manifest["detached"] is True
    assert coord["port"] != 0 and coord["target"] == f"127.0.0.1:{coord['port']}"
    assert f"SERVING at {coord['target']}: 3 shards" in out
    report = _report(tmp_path)
    assert report["pid"] == coord["pid"]
    assert report["settings"] == dataclasses.asdict(settings) | {
        "data_dir": str(tmp_path.resolve()),
        "redis_url": red["url"],
    }
    assert report["settings"]["batch_max"] == 9
    for private in ("coordinator.toml", "cluster.json"):  # may hold a Redis password
        assert (tmp_path / private).stat().st_mode & 0o777 == 0o600
    assert (
        "--shards" in report["argv"] and report["argv"][report["argv"].index("--shards") + 1] == "3"
    )
    password = (tmp_path / "redis" / "password").read_text().strip()
    assert red["private"] and red["url"] == f"redis://:{password}@127.0.0.1:{red['port']}/0"
    assert password not in out  # printed as ***
    client = redis.Redis.from_url(red["url"], decode_responses=True)
    assert client.get("fake.key") == "written by the fake coordinator"
    config = client.config_get("maxmemory*")
    assert (config["maxmemory"], config["maxmemory-policy"]) == (str(64 * 2**20), "noeviction")
    assert client.config_get("appendfsync")["appendfsync"] == "always"
    # what a restart by the supervisor starts redis-server with again
    assert red["extra_args"] == local.redis_options(settings)
    assert "64mb" in red["extra_args"] and "always" in red["extra_args"]
    client.set("kept", "across restarts")
    client.close()
    assert local.manifest_target(tmp_path) == coord["target"]

    text = io.StringIO()
    assert local.status(tmp_path, out=text) == 0
    assert f"{coord['target']}: SERVING" in text.getvalue()
    assert "subscriptions 0 (0 moving)" in text.getvalue()
    assert "(detached)" in text.getvalue()

    leftover = report["leftover_pid"]
    assert leftover in session_members(coord["pid"])
    text = io.StringIO()
    assert local.down(tmp_path, out=text) == 0
    assert "stopped 1 leftover process(es)" in text.getvalue()
    for pid in (coord["pid"], red["pid"], leftover):
        assert not alive(pid)
    assert session_members(coord["pid"]) == []
    assert not local.manifest_path(tmp_path).exists()
    assert not ping(red["port"])
    text = io.StringIO()
    assert local.status(tmp_path, out=text) == 1
    assert "no local cluster" in text.getvalue()
    assert local.down(tmp_path, out=io.StringIO()) == 0  # nothing to stop: fine

    # A restart finds the data of the private Redis again.
    _up_detached(settings)
    url = local.read_manifest(tmp_path)["redis"]["url"]
    client = redis.Redis.from_url(url, decode_responses=True)
    assert client.get("kept") == "across restarts"
    client.close()
    assert local.down(tmp_path, out=io.StringIO()) == 0


def test_a_second_up_is_refused_and_a_stale_manifest_ignored(tmp_path):
    settings = launch_settings(tmp_path)
    _up_detached(settings)
    try:
        with pytest.raises(local.ClusterError, match="already running .* `geopubsub down`"):
            local.start(settings, command=FAKE)
    finally:
        manifest = local.read_manifest(tmp_path)
        local.down(tmp_path, out=io.StringIO())
    # The processes of a killed launcher are gone but its cluster.json is left: up proceeds.
    local.manifest_path(tmp_path).write_text(json.dumps(manifest))
    _up_detached(settings)
    assert local.read_manifest(tmp_path)["coordinator"]["pid"] != manifest["coordinator"]["pid"]
    local.down(tmp_path, out=io.StringIO())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_foreground_runs_until_interrupted_then_stops_everything(tmp_path, sig):
    # With SIGINT the stand-in also leaves a process behind (as a local Ray would) for the launcher.
    leftover = {"FAKE_COORDINATOR_LEFTOVER": "1"} if sig is signal.SIGINT else {}
    launcher = launch(launch_settings(tmp_path), detach=False, env=leftover)
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if "Ctrl-C stops it" in line:
            break
    else:
        pytest.fail("".join(lines) + (launcher.stdout.read() or ""))
    manifest = local.read_manifest(tmp_path)
    assert manifest["detached"] is False and manifest["launcher_pid"] == launcher.pid
    assert local.status(tmp_path, out=io.StringIO()) == 0
    pids = [manifest["coordinator"]["pid"], manifest["redis"]["pid"]]
    if sig is signal.SIGINT:
        pids.append(_report(tmp_path)["leftover_pid"])
    launcher.send_signal(sig)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out
    assert "stopping the cluster" in out and "geopubsub cluster stopped" in out
    for pid in pids:
        assert not alive(pid)
    assert not local.manifest_path(tmp_path).exists()
    assert "fake coordinator stopped" in (tmp_path / "coordinator.log").read_text()  # SIGINT, clean


def test_down_stops_a_foreground_cluster_and_its_launcher_exits(tmp_path):
    launcher = launch(launch_settings(tmp_path), detach=False)
    for line in launcher.stdout:
        if "Ctrl-C stops it" in line:
            break
    assert local.down(tmp_path, out=io.StringIO()) == 0
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out


def test_a_coordinator_failing_at_start_is_reported_and_redis_stopped(tmp_path):
    failing = [sys.executable, "-c", "import sys; print('boom: cannot start'); sys.exit(3)"]
    with pytest.raises(local.ClusterError, match=r"exited with code 3(.|\n)*boom: cannot start"):
        local.start(launch_settings(tmp_path), command=failing)
    assert not local.manifest_path(tmp_path).exists()
    assert "User requested shutdown" in (tmp_path / "redis" / "redis.log").read_text()


def test_a_coordinator_never_listening_times_out(tmp_path):
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    began = time.monotonic()
    with pytest.raises(local.ClusterError, match="did not print its listening line within 1 s"):
        local.start(launch_settings(tmp_path), command=silent, timeout_s=1.0)
    assert time.monotonic() - began < 30
    assert not local.manifest_path(tmp_path).exists()


def test_an_external_redis_is_used_and_left_running(tmp_path):
    with RedisServer(tmp_path / "external") as external:
        settings = launch_settings(tmp_path / "cluster", redis_url=external.url)
        _up_detached(settings)
        manifest = local.read_manifest(tmp_path / "cluster")
        assert manifest["redis"] == {"url": external.url, "private": False}
        assert not (tmp_path / "cluster" / "redis").exists()
        assert local.down(tmp_path / "cluster", out=io.StringIO()) == 0
        assert ping(external.port)
        assert redis.Redis.from_url(external.url).get("fake.key") is not None


def test_an_unreachable_redis_url_fails_fast(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(UnavailableError, match="not reachable"):
        local.start(launch_settings(tmp_path, redis_url=url), command=FAKE)
    assert not local.manifest_path(tmp_path).exists()


def test_settings_file_round_trips(tmp_path):
    settings = Settings(
        shards=5,
        host="0.0.0.0",
        insecure=True,
        redis_url='redis://h:1/0?x="y"',
        batch_delay_ms=0.5,
    )
    local.write_settings(settings, tmp_path / "s.toml")
    assert Settings.load(file=tmp_path / "s.toml") == settings


def test_client_target_of_a_wildcard_bind():
    assert local.client_target("0.0.0.0", 5) == "127.0.0.1:5"
    assert local.client_target("::1", 5) == "[::1]:5"
    assert local.client_target("10.0.0.2", 5) == "10.0.0.2:5"
