"""``geopubsub bench compare`` and ``bench match --index <rival>`` end to end on a small
generated workload: every index of ``shard.indexes`` built, exact against brute force, the
report, the plots, the sweeps' workloads and the flags' errors."""

from __future__ import annotations

import json

import pytest

from geopubsub.tools.bench_compare import cut_keywords, sized_messages, square_messages
from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from shard.brute import BruteMatcher
from shard.indexes import RIVAL_NAMES
from shard.model import Message, Point, Rect, Subscription
from shard.workload import read_messages, read_subscriptions


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    generate(3000, 200, d, seed=9, dnf_share=0.3, circle_share=0.2, region_msg_share=0.2)
    return d / "subs.jsonl", d / "msgs.jsonl"


def test_compare_runs_every_index_exact_with_report_and_plots(workload, tmp_path, capsys):
    subs, msgs = workload
    out = tmp_path / "report"
    argv = ["bench", "compare", "--subs", str(subs), "--msgs", str(msgs), "--repeat", "1"]
    argv += ["--updates", "50", "--check-sample", "200", "--choice", "--out-dir", str(out)]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["index"]: r for r in report["rows"]}
    assert set(rows) == {"brute", "aptree", "invlist", *RIVAL_NAMES}
    want = sum(len(BruteMatcher(read_subscriptions(subs)).match(m)) for m in read_messages(msgs))
    assert want > 0
    for name, r in rows.items():
        assert r["exact"] is True, name
        assert r["n_subs"] == 3000
        if name != "brute":  # brute force matched the sample (all 200 here) too
            assert r["pairs"] == want, name
            assert r["us_per_msg"] > 0 and r["memory_mb"] > 0
        assert (r["subscribe_us"] is None) == (name in ("invlist", "brute")), name
    assert report["pick"]["index"] in rows and report["choice"][0]["oracle_choice_us"] > 0
    text = (out / "report.md").read_text()
    assert "| - | rt++ | 3,000 |" in text and "Pick: **" in text
    for png in ("us_per_msg.png", "costs.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_sweeps_and_errors(workload, capsys):
    subs, msgs = workload
    argv = ["bench", "compare", "--subs", str(subs), "--msgs", str(msgs), "--repeat", "1"]
    argv += ["--updates", "0", "--index", "aptree,rt"]
    assert main([*argv, "--sweep", "subs", "--values", "500,3000"]) == 0
    text = capsys.readouterr().out
    assert "| 500 | rt | 500 |" in text and "| 3000 | aptree | 3,000 |" in text
    assert main([*argv, "--sweep", "region", "--values", "0,2"]) == 0
    assert main([*argv, "--index", "rt+@strategy=idf,mbrtrie@probe=trie"]) == 0
    text = capsys.readouterr().out
    assert "| - | rt+@strategy=idf | 3,000 |" in text and "| - | mbrtrie@probe=trie |" in text
    assert main([*argv, "--index", "rt+@strategy=best"]) == 2
    assert "strategy='best'" in capsys.readouterr().err
    assert main([*argv, "--index", "kdtree"]) == 2
    assert "--index='kdtree'" in capsys.readouterr().err
    assert main([*argv, "--sweep", "msg-length", "--values", "medium"]) == 2
    assert "--values='medium': must be short or long" in capsys.readouterr().err


def test_the_sweeps_workloads():
    subs = list(read_subscriptions_of([("a b c", (0, 0, 1, 1))]))
    assert [c for s in cut_keywords(subs, 2) for c in s.clauses] == [("a", "b")]
    msgs = [Message("m", ("a",), Rect(0, 0, 2, 2))]
    assert square_messages(msgs, 0)[0].location == Point(1, 1)
    assert square_messages(msgs, 1)[0].location == Rect(0.5, 0.5, 1.5, 1.5)
    long = sized_messages(msgs, subs * 10, "short", 1)[0]
    assert long.terms[0] == "a" and 1 <= len(long.terms) <= 20
    assert set(long.terms) <= {"a", "b", "c"}


def read_subscriptions_of(rows):
    for i, (kw, box) in enumerate(rows):
        yield Subscription(f"s{i}", (tuple(kw.split()),), Rect(*box))


@pytest.mark.parametrize("name", RIVAL_NAMES)
def test_bench_match_takes_every_rival(workload, capsys, name):
    subs, msgs = workload
    argv = ["bench", "match", "--subs", str(subs), "--msgs", str(msgs), "--index", name]
    assert main([*argv, "--json", "--baseline-sample", "100"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["index"] == name and r["baseline"]["identical"] is True and r["pairs"] > 0
