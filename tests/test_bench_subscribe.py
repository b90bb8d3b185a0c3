"""``geopubsub bench subscribe`` end to end on a small cluster of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geopubsub.tools.bench_subscribe import cpu_s

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_seconds_are_read_from_proc():
    spent = cpu_s(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_s(os.getpid()) > spent > 0
    assert cpu_s(2**22 + 12345) == 0.0  # no such process


def test_cpu_seconds_of_another_process_count_a_few_milliseconds_and_exited_threads():
    # A shard doing a few milliseconds of work between two readings must not read as idle: the
    # ticks of /proc/<pid>/stat (10 ms) would often show none of it.
    code = (
        "import sys, threading, time\n"
        "def burn(s):\n"
        "    t = time.thread_time()\n"
        "    while time.thread_time() - t < s: pass\n"
        "sys.stdin.readline(); burn(0.003); print('a', flush=True)\n"
        "sys.stdin.readline(); th = threading.Thread(target=burn, args=(0.02,)); th.start();"
        " th.join(); print('b', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    argv = [sys.executable, "-c", code]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            time.sleep(0.5)
            before = cpu_s(child.pid)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "a\n"
            after = cpu_s(child.pid)
            assert 0.003 <= after - before < 0.5
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "b\n"  # the burning thread has exited
            assert cpu_s(child.pid) - after >= 0.02
        finally:
            child.kill()


@pytest.mark.e2e
def test_bench_subscribe_registers_removes_and_times_every_call(tmp_path):
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "bench", "subscribe", "--data-dir"]
    argv += [str(tmp_path / "c"), "--gen-subs", "600", "--batch", "1,50", "--in-flight", "8"]
    argv += ["--rate", "200", "--latency-duration", "1", "--idle-window", "1", "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["subscriptions"] == 600 and [p["batch"] for p in r["phases"]] == [1, 50]
    for p in r["phases"]:
        assert p["subscribe_per_s"] > 0 and p["unsubscribe_per_s"] > 0
        assert p["subscribe_shard_us"] > 0  # the shard actors were found and did the work
        assert p["subscribe_coordinator_us"] > 0 and p["subscribe_redis_us"] > 0  # (Redis too)
    assert r["latency"]["calls"] == 200 and 0 < r["latency"]["p50_ms"] <= r["latency"]["p99_ms"]
    assert 0 < r["latency"]["rounds"] <= 200 and r["latency"]["shard_us_per_round"] > 0
    # the shards' idle CPU (Ray's threads) was read before the phase and taken off its figure
    assert r["latency"]["shard_idle_us_per_s"] > 0
    assert r["latency"]["shard_us_net_of_idle"] < r["latency"]["shard_us"]
    stopped = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "c")], capture_output=True, text=True, check=False
    )
    assert stopped.stdout.strip() == "", "the cluster it started is still running"


@pytest.mark.parametrize("window", ["-1", "nan", "61"])
def test_bench_subscribe_names_a_bad_idle_window(tmp_path, window):
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "bench", "subscribe", "--data-dir"]
    argv += [str(tmp_path / "c"), "--idle-window", window]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--idle-window" in proc.stderr and window in proc.stderr
    assert not (tmp_path / "c").exists()  # refused before any cluster started
