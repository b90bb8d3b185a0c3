"""``geopubsub bench soak``: the RSS verdict on hand-made samples (growth, a replaced or a new
process must fail it), RSS read from /proc, and a few seconds of the command against a small
cluster it starts and stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import local
from geopubsub.tools.bench_soak import PerMinute, Sample, p99_steady, rss_flat, rss_mb

ROOT = Path(__file__).resolve().parents[1]


def _series(values, pids=None):
    pids = pids or [1] * len(values)
    return [
        Sample(10.0 * i, {"c": p} if v is not None else {}, {"c": v} if v is not None else {})
        for i, (v, p) in enumerate(zip(values, pids, strict=True))
    ]


def test_rss_within_the_band_after_the_warm_up_is_flat():
    v = rss_flat(_series([50.0, 100.0, 105.0, 96.0, 117.0]), warmup_s=10, tolerance=0.10)
    p = v["processes"]["c"]
    assert v["flat"] and p["level_mb"] == 106.5 and p["deviation_pct"] == 9.9
    assert p["at_warmup_mb"] == 100.0  # the growth before it does not count


def test_a_swinging_rss_is_flat_if_the_swing_fits_and_growth_is_not():
    swing = [110.0, 92.0, 108.0, 94.0, 110.0, 92.0, 108.0, 90.0, 108.0, 92.0, 109.0]
    v = rss_flat(_series(swing), warmup_s=70, tolerance=0.10)
    assert v["flat"] and v["processes"]["c"]["level_mb"] == 99.5  # 90 at 70 s, 109 at most
    grows = rss_flat(_series(swing + [112.0]), warmup_s=70, tolerance=0.10)
    assert not grows["flat"]


def test_rss_growth_a_replaced_or_vanished_process_is_not_flat():
    grows = rss_flat(_series([100.0, 100.0, 105.0, 123.0]), warmup_s=0, tolerance=0.10)
    assert not grows["flat"] and grows["processes"]["c"]["deviation_pct"] == 10.3
    shrinks = rss_flat(_series([100.0, 100.0, 80.0]), warmup_s=0, tolerance=0.10)
    assert not shrinks["flat"]
    replaced = rss_flat(_series([100.0, 100.0, 100.0], pids=[1, 1, 2]), 0, 0.10)
    assert (
        not replaced["flat"] and replaced["processes"]["c"]["note"] == "replaced by another process"
    )
    gone = rss_flat(_series([100.0, 100.0, None]), 0, 0.10)
    assert not gone["flat"] and gone["processes"]["c"]["note"] == "gone before the end"
    late = _series([100.0, 100.0]) + [Sample(20.0, {"c": 1, "d": 7}, {"c": 100.0, "d": 5.0})]
    v = rss_flat(late, 0, 0.10)
    assert not v["flat"] and v["processes"]["d"] == {
        "flat": False,
        "note": "appeared after the warm-up",
    }
    with pytest.raises(ValueError):
        rss_flat(_series([100.0]), warmup_s=60, tolerance=0.1)


def test_rss_is_read_from_proc_and_latency_is_grouped_by_minute():
    assert 1.0 < rss_mb(os.getpid()) < 100_000
    per = PerMinute(started=1000.0)
    for due, lat in ((1000.0, 0.001), (1059.0, 0.003), (1060.0, 0.010)):
        per.add(due, lat)
    rows = per.table()
    assert [(r["minute"], r["n"], r["max_ms"]) for r in rows] == [(1, 2, 3.0), (2, 1, 10.0)]


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_soak_samples_every_process_and_stops_its_cluster(tmp_path):
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "bench", "soak"]
    argv += ["--data-dir", str(tmp_path)]
    argv += ["--gen-subs", "2000", "--gen-msgs", "500", "--register", "grpc", "--duration", "8"]
    argv += ["--warmup", "3", "--sample-every", "1", "--rate", "200", "--streams", "20"]
    argv += ["--crowd-rate", "20", "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == (0 if r["flat"] and r["p99_steady"]["steady"] else 1), proc.stderr[
        -3000:
    ]
    assert r["published"] == 1600 and r["deliveries_timed"] > 0
    assert r["minutes"][0]["minute"] == 1 and r["minutes"][0]["p99_ms"] > 0
    assert 0 < len(r["slowest_seconds"]) <= 5 and r["slowest_seconds"][0]["max_ms"] > 0
    names = set(r["rss"]["processes"])
    assert names == {"coordinator", "redis-server", "supervisor", "shard-actor-1", "shard-actor-2"}
    assert len(r["rss_samples"]) >= 8
    for p in r["rss"]["processes"].values():
        assert p["flat"] == (p["deviation_pct"] <= 10.0 and not p["note"]), p
    assert local.read_manifest(tmp_path) is None


def test_the_p99_is_steady_unless_a_minute_after_the_warm_up_spikes():
    rows = [{"minute": m, "p99_ms": p} for m, p in enumerate([643.5, 111.7, 167.2, 142.2], 1)]
    v = p99_steady(rows, 120, 2.0)  # minutes 3 and 4 are judged; the warm-up's are not
    assert (v["steady"], v["minutes"], v["median_ms"], v["worst_minute"]) == (True, 2, 154.7, 3)
    spike = rows + [{"minute": 5, "p99_ms": 434.0}, {"minute": 6, "p99_ms": 150.0}]
    v = p99_steady(spike, 120, 2.0)
    assert not v["steady"] and v["median_ms"] == 158.6 and v["worst_minute"] == 5
    assert p99_steady(spike, 120, 3.0)["steady"]
    assert p99_steady(rows[:2], 120, 2.0) == {
        "steady": True,
        "minutes": 0,
        "median_ms": None,
        "max_ms": None,
        "worst_minute": None,
        "spread": 2.0,
    }


def test_the_slowest_seconds_name_when_a_stall_was():
    pm = PerMinute(1_800_000_000.0)  # 2027-01-15 08:00:00 UTC
    for i in range(400):
        pm.add(pm.started + i * 0.2, 0.150 if 61 <= i * 0.2 < 62 else 0.010)
    top = pm.slowest(2)
    assert top[0] == {"second": 61, "utc": "08:01:01", "max_ms": 150.0}
    assert top[1]["max_ms"] == 10.0 and len(top) == 2
