"""The keyword-first inverted list (``shard.invlist``) against the brute-force oracle: Hypothesis
workloads (AND and DNF, rects and circles, point and rect messages, messages sharing no term
with any subscription), its filing rule, and ``bench match --index invlist``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from shard.aptree import APTree
from shard.brute import BruteMatcher
from shard.invlist import InvertedList
from shard.model import Circle, Message, Point, Rect, Subscription
from shard.workload import read_messages, read_subscriptions
from tests.workloads import VOCAB, assert_same_matches, random_message, random_subscription

FOREIGN = [f"u{i}" for i in range(10)]
"""Terms no subscription holds."""


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_subs=st.integers(0, 300),
    vocab_size=st.sampled_from([3, 8, 40]),
)
def test_inverted_list_matches_oracle(seed, n_subs, vocab_size):
    rng = random.Random(seed)
    vocab = VOCAB[:vocab_size]
    subs = [random_subscription(rng, f"s{i}", vocab) for i in range(n_subs)]
    msgs = [random_message(rng, f"m{i}", vocab) for i in range(50)]
    msgs += [random_message(rng, f"f{i}", FOREIGN) for i in range(5)]  # no term in common
    msgs += [random_message(rng, f"x{i}", vocab + FOREIGN) for i in range(10)]
    index = InvertedList.build(subs)
    index.check_invariants()
    assert len(index) == n_subs
    oracle = BruteMatcher(subs)
    assert_same_matches(index, oracle, msgs)
    for m in msgs[50:55]:
        assert index.match(m) == [] == oracle.match(m)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_inverted_list_over_an_aptree_store_matches_oracle(seed):
    """``from_store`` over a tree's store after its build renumbered the terms and relaid the
    slots out; later changes to that store do not reach the list."""
    rng = random.Random(seed)
    subs = [random_subscription(rng, f"s{i}") for i in range(200)]
    msgs = [random_message(rng, f"m{i}") for i in range(40)]
    tree = APTree.build(subs, theta_p=4, fanout=8)
    index = InvertedList.from_store(tree.store)
    index.check_invariants()
    oracle = BruteMatcher(subs)
    assert_same_matches(index, oracle, msgs)
    tree.subscribe(Subscription("new", (("brand-new-term",),), Rect(-180, -90, 180, 90)))
    tree.rebuild()  # new term ids and slots in the store
    assert_same_matches(index, oracle, msgs)


def test_dnf_subscription_reported_once_and_empty_batch():
    sub = Subscription("s", (("a",), ("b",), ("a", "c")), Rect(0, 0, 1, 1))
    other = Subscription("t", (("a", "b"),), Circle(0.5, 0.5, 1000.0))
    index = InvertedList.build([sub, other])
    index.check_invariants()
    assert index.match(Message("m", ("a", "b", "c"), Point(0.5, 0.5))) in (["s", "t"], ["t", "s"])
    assert index.match(Message("m", ("a", "b", "c"), Point(0.9, 0.9))) == ["s"]  # outside circle
    assert index.match(Message("m", ("c",), Point(0.5, 0.5))) == []
    assert index.match_batch([]) == []


def test_region_messages_against_rects_and_circles():
    subs = [
        Subscription("rect", (("a",),), Rect(10, 10, 11, 11)),
        Subscription("circle", (("a",),), Circle(20.0, 0.0, 50_000.0)),
    ]
    index = InvertedList.build(subs)
    touching = Message("m1", ("a",), Rect(11, 11, 12, 12))  # closed rectangles meet at a corner
    near_circle = Message("m2", ("a",), Rect(20.3, -1, 21, 1))  # ~33 km from the centre
    # ~63 km from the centre: meets the circle's box, not the circle (the haversine test decides)
    past_circle = Message("m3", ("a",), Rect(20.4, 0.4, 21, 1))
    past_point = Message("m4", ("a",), Point(20.4, 0.4))
    batch = [touching, near_circle, past_circle, past_point]
    got = index.match_batch(batch)
    assert got == [["rect"], ["circle"], [], []]
    assert got == BruteMatcher(subs).match_batch(batch)


def test_clause_filed_under_its_rarest_term():
    subs = [Subscription(f"c{i}", (("common", f"r{i}"),), Rect(0, 0, 1, 1)) for i in range(5)]
    subs += [Subscription("only", (("common",),), Rect(0, 0, 1, 1))]
    index = InvertedList.build(subs)
    index.check_invariants()
    vocab = index.store.vocab
    lens = np.diff(index._start)
    assert lens[vocab["common"]] == 1  # only the clause that has no rarer term
    assert all(lens[vocab[f"r{i}"]] == 1 for i in range(5))
    got = index.match(Message("m", ("common", "r3"), Point(0.5, 0.5)))
    assert sorted(got) == ["c3", "only"]


def test_check_detects_a_misfiled_clause():
    subs = [Subscription(f"c{i}", (("common", f"r{i}"),), Rect(0, 0, 1, 1)) for i in range(3)]
    index = InvertedList.build(subs)
    index.check_invariants()
    index._sub[0] = index._sub[1]
    with pytest.raises(AssertionError):
        index.check_invariants()


def test_clause_without_terms_matches_every_message_in_its_region():
    """Validation never makes such a clause; the oracle's semantics still hold for one."""
    subs = [
        Subscription("any", ((),), Rect(0, 0, 1, 1)),
        Subscription("kw", (("a",),), Rect(0, 0, 1, 1)),
    ]
    index = InvertedList.build(subs)
    index.check_invariants()
    msgs = [
        Message("m1", ("zzz",), Point(0.5, 0.5)),
        Message("m2", ("a",), Point(0.5, 0.5)),
        Message("m3", ("a",), Point(5, 5)),
    ]
    assert_same_matches(index, BruteMatcher(subs), msgs)
    assert index.match_batch(msgs)[0] == ["any"]


def test_repeated_id_replaces_the_earlier_subscription():
    subs = [
        Subscription("s", (("a",),), Rect(0, 0, 1, 1)),
        Subscription("s", (("b",),), Rect(0, 0, 1, 1)),
    ]
    index = InvertedList.build(subs)
    index.check_invariants()
    assert len(index) == 1
    assert index.match(Message("m", ("a",), Point(0.5, 0.5))) == []
    assert index.match(Message("m", ("b",), Point(0.5, 0.5))) == ["s"]


def test_bench_match_invlist_and_beside_the_aptree(tmp_path, capsys):
    generate(2000, 200, tmp_path, seed=9, dnf_share=0.3, circle_share=0.2, region_msg_share=0.2)
    subs, msgs = tmp_path / "subs.jsonl", tmp_path / "msgs.jsonl"
    brute = BruteMatcher(read_subscriptions(subs))
    want = {(m.id, s) for m in read_messages(msgs) for s in brute.match(m)}
    assert want

    out = tmp_path / "pairs.tsv"
    common = ["bench", "match", "--subs", str(subs), "--msgs", str(msgs), "--json"]
    assert main([*common, "--index", "invlist", "--out", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["index"] == "invlist" and r["n_subs"] == 2000 and r["n_msgs"] == 200
    assert r["pairs"] == len(want) and r["build_s"] >= 0 and r["us_per_msg"] > 0
    assert {tuple(line.split("\t")) for line in out.read_text().splitlines()} == want
    b = r["baseline"]
    assert b["identical"] and b["brute_pairs"] == b["invlist_pairs"] > 0

    assert main([*common, "--index", "aptree", "--out", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    v = r["invlist"]
    assert v["pairs"] == v["aptree_pairs"] == r["pairs"] == len(want)
    assert v["identical"] and v["us_per_msg"] > 0
    for p in (r["phases"], v["phases"]):  # the shard's answer (tags) beside the ids
        assert p["tags_us"] > 0
        assert p["answer_us"] == round(p["encode_us"] + p["kernel_us"] + p["tags_us"], 2)
    assert v["aptree_answer_speedup"] == round(
        v["phases"]["answer_us"] / r["phases"]["answer_us"], 2
    )
    b = r["baseline"]
    assert b["identical"] and b["brute_pairs"] == b["aptree_pairs"] == b["invlist_pairs"]

    assert main([*common, "--no-invlist-baseline"]) == 0
    assert "invlist" not in json.loads(capsys.readouterr().out)

    assert main(common[:-1] + ["--index", "aptree"]) == 0
    text = capsys.readouterr().out
    assert "inverted list" in text and f"pairs {len(want):,} / aptree {len(want):,}" in text


def test_a_batch_whose_pairs_outgrow_the_kernels_array_loses_nothing():
    # 41 messages matching 600 subscriptions each: the kernel's pairs start at 1,024, it stops
    # where they are full, grows them and goes on from that message
    n = 600
    subs = [Subscription(f"s{i}", ((f"k{i}", "x"),), Rect(-10, -10, 10, 10)) for i in range(n)]
    every = (*(f"k{i}" for i in range(n)), "x")
    msgs = [Message(f"m{j}", every, Point(j / 10, 0.0)) for j in range(40)]
    msgs.append(Message("r", every, Rect(-1, -1, 51, 51)))
    index = InvertedList.build(subs)
    oracle = BruteMatcher()
    for s in subs:
        oracle.subscribe(s)
    assert_same_matches(index, oracle, msgs)
    assert sum(map(len, index.match_batch(msgs))) == 41 * n
