"""The bulk loader: its pure transform against the core, then the Spark job (``local[2]``) into a
real ``redis-server``, read back by the coordinator's own metadata code and served by a cluster
of Ray shards whose matches equal the brute-force oracle."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import random
import subprocess
import sys
import uuid
import warnings
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis

import loader.job
import shard.model
from coordinator.metadata import Metadata
from coordinator.settings import Settings
from deploy.local import CONFIG_FILE, write_settings
from geopubsub.convert import to_proto_message
from geopubsub.tools.cli import main as cli_main
from geopubsub.tools.gen import generate
from geopubsub.v1 import geopubsub_pb2 as pb
from loader import transform
from loader.convert import convert
from loader.job import run, spark_session
from shard.brute import subscription_matches
from shard.errors import ValidationError
from shard.geometry import region_bbox
from shard.model import subscription_from_dict, subscription_to_dict
from shard.partition_map import PartitionMap, bbox_centre
from shard.workload import iter_jsonl, write_jsonl
from tests.clusters import Cluster, coordinator_settings
from tests.workloads import random_message, random_subscription

BAD_ROWS = [
    {"id": "r1", "keywords": ["x"], "rect": [0, 0, 200, 1]},
    {"id": "r2", "keywords": ["x"], "rect": [5, 0, 1, 1]},
    {"id": "r3", "keywords": [], "rect": [0, 0, 1, 1]},
    {"id": "r4", "expr": "a AND (b", "rect": [0, 0, 1, 1]},
    {"id": "r5", "keywords": ["x"], "circle": [0, 0, -5]},
    {"id": "r6", "keywords": ["x"]},
    {"id": "r7", "keywords": ["x"], "rect": [0, 0, 1, 1], "colour": "red"},
    {"id": "", "keywords": ["x"], "rect": [0, 0, 1, 1]},
    {"id": "r9", "keywords": ["x"], "rect": [0, 0, 1, 1], "moving": "yes"},
    {"id": "r10", "keywords": ["x", 3], "rect": [0, 0, 1, 1]},
    {"keywords": ["x"], "rect": [0, 0, 1, 1]},
    {"id": "r12", "expr": "(" * 400 + "x" + ")" * 400, "rect": [0, 0, 1, 1]},  # was RecursionError
]


def _good(rng: random.Random, n: int, prefix: str = "s", extras: float = 0.0) -> list[dict]:
    return [
        subscription_to_dict(random_subscription(rng, f"{prefix}{i}", extras=extras))
        for i in range(n)
    ]


# ---- the pure transform ---------------------------------------------------------------------
def test_the_transform_validates_with_the_core_function(monkeypatch):
    calls = []
    core = shard.model.subscription_from_dict

    def spy(d):
        calls.append(d)
        return core(d)

    monkeypatch.setattr(shard.model, "subscription_from_dict", spy)
    rows = [("f", 0, json.dumps(d)) for d in [*_good(random.Random(1), 5), *BAD_ROWS]]
    out = list(transform.validate_rows(rows, transform.jsonl_payload))
    assert len(calls) == 5 + len(BAD_ROWS)
    reasons = [r[4] for r in out if r[0] == transform.BAD]
    want = []
    for d in BAD_ROWS:
        with pytest.raises(ValidationError) as e:
            core(d)
        want.append(str(e.value))
    assert reasons == want
    assert out[-2] == (transform.BLOCK, "f", 0, len(rows))
    assert out[-1][0] == transform.SUMMARY and out[-1][1].shape == (5,)


def test_a_valid_record_is_the_core_encoding_box_and_terms():
    d = {"id": "c", "expr": "iPad AND (Sale OR discount)", "circle": [13.4, 52.5, 1000]}
    rec = next(transform.validate_rows([("f", 0, json.dumps(d))], transform.jsonl_payload))
    sub = subscription_from_dict(d)
    assert rec[0] == transform.OK and rec[1] == "c"
    assert subscription_from_dict(json.loads(rec[3])) == sub
    assert rec[4] == region_bbox(sub.region)
    assert rec[5] == ("discount", "ipad", "sale")


def test_csv_and_parquet_rows_mean_what_the_json_form_means():
    rng = random.Random(2)
    n_extra = 0
    for i, d in enumerate(_good(rng, 200, extras=0.4)):
        sub = subscription_from_dict(d)
        n_extra += not sub.plain
        rect = d.get("rect", ["", "", "", ""])
        circle = d.get("circle", ["", "", ""])
        kws = " ".join(d.get("keywords", []))
        expr = d.get("expr", "")
        poly = json.dumps(d["polygon"]) if "polygon" in d else ""
        preds = json.dumps(d["predicates"]) if "predicates" in d else ""
        cells = [d["id"], kws, expr, *map(str, rect), *map(str, circle), str(d.get("moving", ""))]
        ranked = [str(d.get("threshold", "")), str(d.get("alpha", ""))]
        ranked.append(json.dumps(d["weights"]) if "weights" in d else "")
        if i % 2 or poly or preds or d.get("threshold"):  # else the 11 columns of before
            cells += [poly, preds, *ranked]
        out = io.StringIO()
        csv.writer(out).writerow(cells)
        got_csv = subscription_from_dict(transform.csv_payload(out.getvalue().strip()))
        assert (got_csv.id, got_csv.clauses, got_csv.negated, got_csv.region) == (
            sub.id,
            sub.clauses,
            sub.negated,
            sub.region,
        )
        assert got_csv.predicates == sub.predicates
        assert (got_csv.threshold, got_csv.alpha, got_csv.weights) == (
            sub.threshold,
            sub.alpha,
            sub.weights,
        )
        row = tuple(json.dumps(d[c]) if c == "predicates" and c in d else d.get(c) for c in transform.PARQUET_COLUMNS)  # fmt: skip
        assert subscription_from_dict(transform.parquet_payload(row)) == sub
    assert n_extra > 50
    assert transform.csv_payload(transform.CSV_HEADER) is None
    with pytest.raises(ValidationError, match=r"rect\[1\]='north': must be a number"):
        subscription_from_dict(transform.csv_payload("a,x,,0,north,1,1,,,,"))


def test_rejects_are_numbered_across_blocks():
    blocks = [("f", 200, 4), ("f", 0, 7), ("g", 0, 3), ("f", 90, 2)]
    off = transform.line_offsets(blocks)
    assert off == {("f", 0): 0, ("f", 90): 7, ("f", 200): 9, ("g", 0): 0}
    assert transform.reject_line((transform.BAD, "f", 200, 1, "why"), off) == "f:11: why"


# ---- the Spark job ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        # 4 kB input splits: a test file of a few hundred lines spans many blocks and tasks
        session = spark_session(
            "local[2]",
            {
                "spark.sql.files.maxPartitionBytes": "4096",
                "spark.sql.files.openCostInBytes": "0",
                "spark.driver.memory": "1g",
                "spark.sql.shuffle.partitions": "2",
            },
        )
    yield session
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        session.stop()


def _quiet(_line: str) -> None:
    pass


def _load(spark, paths, redis_url, ns, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return run(
            spark, [str(p) for p in paths], redis_url=redis_url, namespace=ns, progress=_quiet, **kw
        )


def _redis_state(url: str, ns: str) -> dict:
    r = redis.Redis.from_url(url)
    out = {}
    for k in sorted(r.scan_iter(f"{ns}:*")):
        t = r.type(k)
        out[k] = r.hgetall(k) if t == b"hash" else r.smembers(k) if t == b"set" else r.get(k)
    r.close()
    return out


@pytest.mark.spark
def test_rejects_name_file_line_and_the_core_reason(spark, redis_url, tmp_path):
    rng = random.Random(3)
    rows: list = _good(rng, 400)
    for i, bad in enumerate(BAD_ROWS):
        rows.insert(17 + 31 * i, bad)
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    text = path.read_text().splitlines()
    text.insert(50, "")  # a blank line counts as a line and is skipped
    text.insert(120, "{not json")
    text.insert(300, "[1, 2]")
    path.write_text("\n".join(text) + "\n")
    rejects = tmp_path / "rejects.txt"
    s = _load(spark, [path], redis_url, "rej", shards=2, rejects=str(rejects))
    want: list[str] = []
    list(iter_jsonl(path, subscription_from_dict, errors=want))  # the workload reader's verdicts
    assert rejects.read_text().splitlines() == want
    assert len(want) == len(BAD_ROWS) + 2 and s.rejected == len(want)
    assert s.loaded == 400 and s.read == len(text)
    assert len(s.stages) == 4


@pytest.mark.spark
def test_csv_and_parquet_inputs_load_the_same_and_reject_by_line_and_row(
    spark, redis_url, tmp_path
):
    rng = random.Random(4)
    rows = _good(rng, 150, extras=0.3)
    path = tmp_path / "subs.jsonl"
    write_jsonl(
        path, [*rows[:40], {"id": "bad", "keywords": ["x"], "rect": [0, 0, 1, 99]}, *rows[40:]]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        convert(spark, str(path), str(tmp_path / "p"), "parquet", partitions=1)
        convert(spark, str(path), str(tmp_path / "c"), "csv", partitions=1)
    states = {}
    for fmt in ("jsonl", "parquet", "csv"):
        src = path if fmt == "jsonl" else tmp_path / fmt[0]
        rej = tmp_path / f"{fmt}.rej"
        s = _load(spark, [src], redis_url, f"fmt-{fmt}", shards=3, fmt=fmt, rejects=str(rej))
        assert (s.loaded, s.rejected) == (150, 1), fmt
        (line,) = rej.read_text().splitlines()
        where, reason = line.split(": ", 1)
        assert reason in (
            "rect[3]=99: latitude must be in [-90, 90]",
            "rect[3]=99.0: latitude must be in [-90, 90]",
        )
        assert where.endswith({"jsonl": ":41", "parquet": ":41", "csv": ":42"}[fmt])
        states[fmt] = {
            k.split(b":", 1)[1]: v[b"sub"]
            for k, v in _redis_state(redis_url, f"fmt-{fmt}").items()
            if isinstance(v, dict)
        }
    # the CSV layout keeps normalized terms only up to spaces, so compare the parsed forms
    parsed = {
        f: {k: subscription_from_dict(json.loads(v)).clauses for k, v in st.items()}
        for f, st in states.items()
    }
    assert parsed["jsonl"] == parsed["parquet"] == parsed["csv"]
    assert states["jsonl"] == states["parquet"]


@pytest.mark.spark
def test_a_rerun_changes_nothing_and_a_changed_row_replaces_the_old(spark, redis_url, tmp_path):
    rng = random.Random(5)
    rows = _good(rng, 300)
    rows.append({"id": rows[10]["id"], "keywords": ["later"], "rect": [1.0, 1.0, 2.0, 2.0]})
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    first = _load(spark, [path], redis_url, "idem", shards=2, stamp=1000.0)
    assert (first.new, first.changed, first.unchanged, first.duplicates) == (300, 0, 0, 1)
    before = _redis_state(redis_url, "idem")
    key = b"idem:sub:" + rows[10]["id"].encode()
    assert json.loads(before[key][b"sub"])["keywords"] == ["later"]  # the later row won
    again = _load(spark, [path], redis_url, "idem", shards=2, stamp=2000.0)
    assert (again.new, again.changed, again.unchanged) == (0, 0, 300)
    assert _redis_state(redis_url, "idem") == before
    rows[3] = dict(rows[3], id=rows[3]["id"]) | {"moving": True}
    write_jsonl(path, rows)
    r = redis.Redis.from_url(redis_url)
    moved = {rows[3]["id"]: b"A" * 16, rows[4]["id"]: b"B" * 16}  # positions of earlier moves
    r.hset("idem:pos", mapping=moved)
    third = _load(spark, [path], redis_url, "idem", shards=2, stamp=3000.0)
    assert (third.new, third.changed, third.unchanged) == (0, 1, 299)
    # the subscription written anew starts from its new region; the unchanged one stays moved
    assert r.hgetall("idem:pos") == {rows[4]["id"].encode(): b"B" * 16}
    r.delete("idem:pos")
    r.close()
    after = _redis_state(redis_url, "idem")
    changed = [k for k in after if after[k] != before[k]]
    k3 = b"idem:sub:" + rows[3]["id"].encode()
    assert changed == [k3]
    assert after[k3][b"created"] == b"1000.0" and after[k3][b"updated"] == b"3000.0"
    assert json.loads(after[k3][b"sub"])["moving"] is True


@pytest.mark.spark
def test_an_ephemeral_load_marks_every_subscription_and_a_durable_one_unmarks_them(
    spark, redis_url, tmp_path
):
    rows = _good(random.Random(8), 120)
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    ids = {r["id"].encode() for r in rows}
    r = redis.Redis.from_url(redis_url)
    try:
        r.sadd("eph:ephemeral", "registered-elsewhere")
        _load(spark, [path], redis_url, "eph", shards=2, ephemeral=True)
        assert r.smembers("eph:ephemeral") == ids | {b"registered-elsewhere"}
        _load(spark, [path], redis_url, "eph", shards=2)
        assert r.smembers("eph:ephemeral") == {b"registered-elsewhere"}
    finally:
        r.close()


@pytest.mark.spark
def test_the_partition_map_is_balanced_from_a_sample(spark, redis_url, tmp_path, monkeypatch):
    """Bound: with s sampled centres, each of P parts owns n/P ± 5 % of the subscriptions (the
    quantile error of a sample of 5,000 is ~0.7 % of n per cut: 5 % is far outside noise)."""
    generate(20000, 1, tmp_path, seed=3)  # clustered, skewed centres
    monkeypatch.setattr(loader.job, "DEFAULT_SAMPLE", 5000)
    parts = 4
    s = _load(spark, [tmp_path / "subs.jsonl"], redis_url, "bal", shards=parts)
    r = redis.Redis.from_url(redis_url)
    pm = PartitionMap.from_json(r.get("bal:partition_map").decode())
    subs = list(iter_jsonl(tmp_path / "subs.jsonl", subscription_from_dict))
    owners = pm.owners(np.array([bbox_centre(region_bbox(x.region)) for x in subs]))
    owned = np.bincount(owners, minlength=parts)
    assert owned.sum() == s.loaded == 20000
    assert np.all(np.abs(owned - 20000 / parts) <= 0.05 * 20000 / parts), owned
    # every subscription sits on every part its box meets, and the counts say so
    stored = {
        k: v[b"shards"].decode()
        for k, v in _redis_state(redis_url, "bal").items()
        if isinstance(v, dict)
    }
    for x in subs[:2000]:
        assert stored[f"bal:sub:{x.id}".encode()] == ",".join(
            map(str, pm.overlapping(region_bbox(x.region)))
        )
    per = [sum(str(k) in v.split(",") for v in stored.values()) for k in range(parts)]
    assert per == [s.per_shard[k] for k in range(parts)]
    r.close()


@pytest.mark.spark
@pytest.mark.ray
@pytest.mark.e2e
def test_loaded_subscriptions_are_read_by_the_coordinator_and_match_like_the_oracle(
    spark, redis_url, tmp_path, ray_session
):
    rng = random.Random(6)
    rows = _good(rng, 250)
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    ns = uuid.uuid4().hex
    s = _load(spark, [path], redis_url, ns, shards=2)
    assert s.loaded == 250
    subs = [subscription_from_dict(d) for d in rows]
    msgs = [random_message(rng, f"m{i}") for i in range(150)]

    async def main():
        md = Metadata(redis_url, ns)
        got = [x async for batch in md.iter_subscriptions() for x in batch]
        assert sorted(got, key=lambda x: x.id) == sorted(subs, key=lambda x: x.id)
        assert await md.get_subscription(subs[7].id) == subs[7]
        await md.close()
        async with Cluster(
            coordinator_settings(redis_url, ns)
        ) as c:  # what `geopubsub up` does next
            stats = await c.stub.GetStats(pb.GetStatsRequest())
            assert stats.subscriptions == 250
            assert [x.subscriptions for x in stats.shards] == [s.per_shard[0], s.per_shard[1]]
            for m in msgs:
                r = await c.stub.Publish(pb.PublishRequest(message=to_proto_message(m)))
                assert r.matched == sum(subscription_matches(x, m) for x in subs), m

    asyncio.run(main())


@pytest.mark.spark
def test_the_load_command_finds_the_local_cluster_and_asks_for_a_reload(
    spark, redis_url, tmp_path, capsys
):
    """``--coordinator`` of a cluster in ``--data-dir``: its Redis, namespace and shards come from
    its files; a coordinator without the Reload RPC is told about, with the restart to do."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()  # a gRPC server with no services: every method is UNIMPLEMENTED
    try:
        target = f"127.0.0.1:{port}"
        settings = Settings.load(flags={"redis_url": redis_url, "namespace": "cli", "shards": 3})
        write_settings(settings, tmp_path / CONFIG_FILE)
        manifest = {
            "data_dir": str(tmp_path),
            "coordinator": {"target": target},
            "redis": {"url": redis_url},
        }
        (tmp_path / "cluster.json").write_text(json.dumps(manifest))
        path = tmp_path / "subs.jsonl"
        write_jsonl(path, _good(random.Random(7), 30))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            code = cli_main(
                ["load", str(path), "--coordinator", target, "--data-dir", str(tmp_path)]
            )
        assert code == 0
        out, err = capsys.readouterr()
        assert "loaded 30 subscriptions (30 new" in out
        assert "per shard (3, map built)" in out
        assert f"the coordinator at {target} has no Reload RPC" in err
        r = redis.Redis.from_url(redis_url)
        assert r.scard("cli:subs") == 30
        r.close()
        assert spark.sparkContext._jsc is not None  # the caller's session is left running
    finally:
        server.stop(None)


def test_the_job_runs_under_spark_submit(redis_url, tmp_path):
    """``spark-submit loader/job.py`` (the way onto a Spark cluster): same counts, same rejects
    file, a namespace of its own."""
    bin_dir = Path(sys.executable).parent
    rows = _good(random.Random(11), 40) + [BAD_ROWS[2]]
    path = tmp_path / "subs.jsonl"
    write_jsonl(path, rows)
    rejects = tmp_path / "rejects.txt"
    argv = [str(bin_dir / "spark-submit"), "--master", "local[2]", "loader/job.py", str(path)]
    argv += ["--redis-url", redis_url, "--namespace", "submit", "--rejects", str(rejects)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded 40 subscriptions (40 new" in proc.stdout
    assert rejects.read_text().splitlines() == [f"{path}:41: keywords=[]: must hold 1-16 keywords"]
    r = redis.Redis.from_url(redis_url)
    assert r.scard("submit:subs") == 40
    r.close()


def test_duplicate_ids_resolve_to_the_later_row_without_comparing_the_others():
    recs = [
        (transform.OK, "a", ("f", 0, 0), "{a0}", (0, 0, 1, 1), ("x",)),
        (transform.OK, "b", ("f", 0, 1), "{b}", (0, 0, 1, 1), ("x",)),
        (transform.OK, "a", ("g", 0, 0), "{a1}", (0, 0, 1, 1), ("x",)),
        (transform.OK, "a", ("f", 9, 0), "{a2}", (0, 0, 1, 1), ("x",)),
    ]
    hashes = np.array([transform.id_hash(r[1]) for r in recs], np.uint64)
    repeated, once = transform.repeated_hashes(hashes)
    assert once.tolist() == [False, True, False, False]
    win = {"a": transform.later(transform.later(recs[0][2], recs[2][2]), recs[3][2])}
    kept = list(transform.final_records(recs, frozenset(repeated.tolist()), win))
    assert [r[3] for r in kept] == ["{b}", "{a1}"]
