"""``geopubsub demo`` (``make run``) and ``geopubsub bench e2e`` end to end at a tiny scale: a real
local cluster (redis-server, Ray, the coordinator) started and stopped by the command, real gRPC
clients; the demo's followed streams must pass the oracle check, and nothing may be left running."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deploy import local
from deploy.processes import alive
from geopubsub.tools.gen import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DEMO = [sys.executable, "-m", "geopubsub.tools.cli", "demo", "--subs", "2000", "--msgs", "2000"]


def _json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_demo_streams_equal_the_oracle_and_everything_stops(tmp_path):
    argv = [*DEMO, "--duration", "10", "--rate", "200", "--ttl", "3", "--streams", "30"]
    argv += ["--work-dir", str(tmp_path), "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = _json(proc.stdout)
    assert r["published"] == 2000 and r["registration"]["registered"] == 2000
    assert r["registration"]["via"] == "loader" and r["registration"]["rejected"] == 0
    assert r["drained"], "the streams did not fall quiet"
    static, movers = r["check_static"], r["check_movers"]
    assert r["followed_streams"] == 30 and r["tracked_movers"] == 8
    assert static["violations"] == 0 and movers["violations"] == 0, r["violations"]
    # not vacuous: deliveries were made both ways and checked
    assert static["adds"] > 0 and static["adds"] == static["removes"]  # every + expired
    assert movers["adds"] > 0 and movers["removes"] == movers["adds"]
    assert movers["moves"] > 100 and movers["checked"] > movers["deliveries"]
    assert r["latency"]["n"] == static["adds"]
    # the cluster it started is gone
    assert local.read_manifest(tmp_path / "cluster") is None
    assert not alive(r["cluster"]["coordinator_pid"])
    assert not alive(r["cluster"]["redis_pid"])


def _end(proc: subprocess.Popen, cluster_dir: Path) -> None:
    """A demo the test left running (it failed) killed, and the cluster it started stopped."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
    if local.read_manifest(cluster_dir) is not None:
        local.down(cluster_dir, out=io.StringIO())


def _demo_process(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C must reach it even when the tests run in the background (`make test &`
        # starts them with SIGINT ignored, and a child would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_demo_interrupted_stops_the_cluster(tmp_path):
    argv = [*DEMO, "--duration", "60", "--rate", "100", "--work-dir", str(tmp_path)]
    proc = _demo_process(argv)
    try:
        manifest = None
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # wait until the traffic runs
            if line.startswith("traffic"):
                manifest = local.read_manifest(tmp_path / "cluster")
                break
            assert time.monotonic() < deadline
        assert manifest is not None, proc.stderr.read()
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        _end(proc, tmp_path / "cluster")
    assert proc.returncode == 130, err[-3000:]
    assert local.read_manifest(tmp_path / "cluster") is None
    assert not alive(manifest["coordinator"]["pid"], started=manifest["coordinator"]["started"])
    assert not alive(manifest["redis"]["pid"], started=manifest["redis"]["started"])


def test_demo_serves_the_live_map_and_keeps_it_with_keep_until_ctrl_c(tmp_path):
    argv = [*DEMO, "--duration", "3", "--rate", "100", "--ttl", "1", "--streams", "5"]
    argv += ["--work-dir", str(tmp_path), "--map-port", "0", "--keep"]
    proc = _demo_process(argv)
    try:
        url = None
        deadline = time.monotonic() + 300
        for line in proc.stderr:
            if line.startswith("map "):
                url = line.split()[1]
            if line.startswith("kept"):
                break
            assert time.monotonic() < deadline
        assert url and url.startswith("http://127.0.0.1:"), url
        manifest = local.read_manifest(tmp_path / "cluster")
        with urllib.request.urlopen(url + "api/stats", timeout=30) as r:
            stats = json.loads(r.read())
        assert stats["subscriptions"] == 2000 and stats["published"] >= 300  # still up
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"geopubsub" in r.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        _end(proc, tmp_path / "cluster")
    assert proc.returncode == 0, err[-3000:]
    assert "oracle" in out  # the report came before the wait
    assert local.read_manifest(tmp_path / "cluster") is None
    assert not alive(manifest["coordinator"]["pid"], started=manifest["coordinator"]["started"])


def test_bench_e2e_reports_the_three_phases_and_equal_matches(tmp_path):
    generate(2000, 500, tmp_path, seed=3, moving_share=0.2, region_msg_share=0.1)
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "bench", "e2e"]
    argv += ["--subs", str(tmp_path / "subs.jsonl"), "--msgs", str(tmp_path / "msgs.jsonl")]
    argv += ["--data-dir", str(tmp_path / "cluster"), "--duration", "2", "--rate", "300"]
    argv += ["--latency-duration", "2", "--moves-duration", "2", "--live", "200", "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = _json(proc.stdout)
    assert r["registration"]["registered"] == 2000
    for phase in ("a", "b"):
        assert r[phase]["published"] > 0
        assert r[phase]["matched"] > 0 and r[phase]["matched_equal"], r[phase]
    assert r["b"]["latency"]["n"] > 0 and r["b"]["latency"]["p50_ms"] > 0
    stages = r["b"]["latency_stages"]  # every timed delivery is split into the four stages
    assert list(stages) == [
        "client pacing",
        "to coordinator",
        "waiting for a round",
        "round to client",
    ]
    assert all(x["n"] == r["b"]["latency"]["n"] for x in stages.values()), stages
    assert r["c"]["moves"] > 0 and r["c"]["moves_per_s"] > 0 and r["c"]["live_messages"] >= 200
    assert r["reference"]["pairs"] > 0
    assert local.read_manifest(tmp_path / "cluster") is None
