"""The benchmark commands run end to end on a small workload and report what they claim."""

from __future__ import annotations

import json

from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from shard.brute import BruteMatcher
from shard.workload import read_messages, read_subscriptions


def test_bench_match_json_and_pairs(tmp_path, capsys):
    generate(3000, 300, tmp_path, seed=5, dnf_share=0.3, circle_share=0.2, region_msg_share=0.2)
    subs, msgs = tmp_path / "subs.jsonl", tmp_path / "msgs.jsonl"
    out = tmp_path / "pairs.tsv"
    args = [
        "bench",
        "match",
        "--subs",
        str(subs),
        "--msgs",
        str(msgs),
        "--json",
        "--out",
        str(out),
        "--repeat",
        "2",
    ]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    keys = {
        "index",
        "n_subs",
        "n_msgs",
        "build_s",
        "match_s",
        "us_per_msg",
        "msgs_per_s",
        "pairs",
        "peak_rss_mb",
    }
    assert keys <= report.keys()
    assert report["index"] == "aptree" and report["n_subs"] == 3000 and report["n_msgs"] == 300
    assert len(report["match_s_runs"]) == 2
    brute = BruteMatcher(read_subscriptions(subs))
    want = {(m.id, s) for m in read_messages(msgs) for s in brute.match(m)}
    got = {tuple(line.split("\t")) for line in out.read_text().splitlines()}
    assert got == want and report["pairs"] == len(want) > 0
    assert (
        report["baseline"]["identical"]
        and report["baseline"]["brute_pairs"] == report["baseline"]["aptree_pairs"]
    )

    assert (
        main(
            [
                "bench",
                "match",
                "--subs",
                str(subs),
                "--msgs",
                str(msgs),
                "--index",
                "brute",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["pairs"] == len(want)


def test_bench_update_and_maintain(tmp_path, capsys):
    generate(2000, 100, tmp_path, seed=6)
    subs, msgs = str(tmp_path / "subs.jsonl"), str(tmp_path / "msgs.jsonl")
    assert main(["bench", "update", "--subs", subs, "--ops", "500", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ops"] == 500 and r["n_subs"] == 2000 and r["subscribe_per_s"] > 0
    assert main(["bench", "maintain", "--subs", subs, "--msgs", msgs, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["initial"] == 400 and r["inserted"] == 1600
    assert r["grown_pairs"] == r["fresh_pairs"]
    assert r["grown_verified_per_msg"] > 0 and r["fresh_verified_per_msg"] > 0


def test_bench_reports_bad_lines_and_missing_files(tmp_path, capsys):
    subs = tmp_path / "subs.jsonl"
    subs.write_text(
        '{"id": "s1", "keywords": ["a"], "rect": [0, 0, 1, 1]}\n{"id": "s2", "keywords": ["a"], "rect": [0, 0, 1]}\n'
    )
    msgs = tmp_path / "msgs.jsonl"
    msgs.write_text('{"id": "m1", "keywords": ["a"], "point": [0.5, 0.5]}\n')
    assert main(["bench", "match", "--subs", str(subs), "--msgs", str(msgs), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["bad_lines"] == 1 and r["pairs"] == 1
    assert main(["bench", "match", "--subs", str(subs), "--msgs", str(msgs), "--strict"]) == 2
    assert f"{subs}:2" in capsys.readouterr().err
    assert (
        main(["bench", "match", "--subs", str(tmp_path / "nope.jsonl"), "--msgs", str(msgs)]) == 2
    )
    assert "--subs" in capsys.readouterr().err


def test_bench_grpc_answers_every_message_single_and_batched(capsys):
    assert main(["bench", "grpc", "--messages", "600", "--batch", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["single"]["per_request"] == 1 and out["batched"]["per_request"] == 50
    assert out["single"]["msgs_per_s"] > 0 and out["batched"]["msgs_per_s"] > 0
    assert main(["bench", "grpc", "--batch", "0"]) == 2
