"""Focused tests of paper 000's indexes (``shard.rivals.mbrtrie``, ``ptquadtree``, ``lfilter``):
the structural steps of the paper happen and the results stay the oracle's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.model import Message, Point, Rect, Subscription
from shard.rivals.lfilter import LFilter
from shard.rivals.mbrtrie import MBRTrie
from shard.rivals.p000_common import distinct_ranks
from shard.rivals.ptquadtree import PTQuadtree
from tests.workloads import assert_same_matches, random_message, random_subscription


def _workload(seed: int, n_subs: int, n_msgs: int, vocab_size: int = 60):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocab_size)]
    subs = [random_subscription(rng, f"s{i}", vocab) for i in range(n_subs)]
    msgs = [random_message(rng, f"m{i}", vocab) for i in range(n_msgs)]
    msgs += [
        Message(f"L{i}", tuple(rng.sample(vocab, rng.randint(20, vocab_size))), m.location)
        for i, m in enumerate(msgs[:20])
    ]
    return subs, msgs


# ---- numbering (Sect. 3.1) ---------------------------------------------------------------------
def test_distinct_ranks_sort_and_merge_a_clause_or_message_and_rank_new_terms_as_their_id():
    rank = np.array([2, 0, 1], np.int32)  # term 1 rarest, then 2, then 0
    terms = np.array([9, 2, 0, 2, 5, 1], np.int32)
    # terms[1:6] = 2, 0, 2, 5, 1: ranks 1, 2, 1, 5 (newer than the ranks), 0
    assert distinct_ranks(terms, 1, 6, rank).tolist() == [0, 1, 2, 5]
    assert distinct_ranks(terms, 3, 3, rank).tolist() == []


# ---- MBRTrie (Sect. 3) ------------------------------------------------------------------------
def test_each_probe_strategy_is_exact_and_finds_the_same_candidate_pairs():
    subs, msgs = _workload(1, 400, 80)
    oracle = BruteMatcher(subs)
    visited = {}
    for probe in ("tokenset", "trie", "cost"):
        index = MBRTrie.build(subs, probe=probe)
        index.check_invariants()
        assert_same_matches(index, oracle, msgs)
        visited[probe] = index.visited
    # Sect. 3.3: the three probes are three ways of finding the same candidate pairs
    assert visited["tokenset"] == visited["trie"] == visited["cost"] > len(msgs)


def test_clauses_sharing_a_prefix_share_trie_nodes_and_id_ranges():
    box = Rect(0, 0, 1, 1)
    subs = [
        Subscription("ab", (("a", "b"),), box),
        Subscription("ac", (("a", "c"),), Rect(5, 5, 6, 6)),
        Subscription("a", (("a",),), box),
        Subscription("abc", (("a", "b", "c"),), box),
    ]
    index = MBRTrie.build(subs)
    index.check_invariants()
    tok, lo, hi, nend, mbr, child_off, child_ids, child_tok = index.trie
    # idf order: b, c (df 2) before a (df 4), so the paths are b·a, b·c·a, c·a, a: the root and
    # b, b·a, b·c, b·c·a, c, c·a, a (b shared by two clauses)
    assert index.stats()["nodes"] == 8
    root_kids = child_ids[child_off[0] : child_off[1]]
    # the root's range is every clause; its children's ranges tile it
    assert lo[0] == 0 and hi[0] == 4 and sum(hi[c] - lo[c] for c in root_kids) == 4
    # the MBR of a node covers the boxes of the clauses below it
    assert mbr[0].tolist() == [0, 0, 6, 6]
    got = index.match(Message("m", ("a", "b", "c"), Point(0.5, 0.5)))
    assert sorted(got) == ["a", "ab", "abc"]


def test_probe_option_is_validated():
    with pytest.raises(ValidationError):
        MBRTrie(probe="bfs")
    with pytest.raises(ValidationError):
        PTQuadtree(tau_num=0)
    with pytest.raises(ValidationError):
        LFilter(est_level=-1)
    with pytest.raises(ValidationError):
        MBRTrie(tau_num=4)  # not an option of the trie


# ---- PT-Quadtree (Sect. 4) --------------------------------------------------------------------
def test_quadtree_splits_and_lists_each_clause_on_the_leaves_it_meets():
    rng = random.Random(3)
    subs = [
        Subscription(f"s{i}", (("x",), (f"t{i % 7}", "y")), Rect(x, y, x + 0.5, y + 0.5))
        for i, (x, y) in enumerate((rng.uniform(-50, 50), rng.uniform(-50, 50)) for _ in range(200))
    ]
    index = PTQuadtree.build(subs, tau_num=8)
    index.check_invariants()
    st = index.stats()
    assert st["quad_nodes"] > 1 + 4 and st["quad_height"] >= 2
    reg, child, list_off, lists, *_ = index.qt
    # small boxes scattered over 100 x 100 degrees: splitting went on until the leaves were small
    sizes = np.diff(list_off)[child < 0]
    assert sizes.max() < 8 * 2 and sizes.sum() < 2 * len(subs) * 2  # (two clauses a subscription)
    msgs = [
        Message(
            f"m{i}",
            ("x",) if i % 2 else (f"t{i % 7}", "y"),
            Point(rng.uniform(-50, 50), rng.uniform(-50, 50)),
        )
        for i in range(100)
    ]
    assert_same_matches(index, BruteMatcher(subs), msgs)


def test_a_token_of_all_four_quadrants_moves_to_the_cover_set():
    # Sect. 4.1, Fig. 4: leaves whose pivots are all "b" give their parent CSet {b}
    corners = [(-10, -10), (5, -10), (-10, 5), (5, 5)]
    subs = [
        Subscription(f"s{i}{j}", (("b", f"u{i}{j}"),), Rect(x + j, y, x + j + 0.5, y + 0.5))
        for i, (x, y) in enumerate(corners)
        for j in range(3)
    ]
    index = PTQuadtree.build(subs, tau_num=4)
    index.check_invariants()
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = index.qt
    b = index.store.vocab["b"]
    assert child[0] >= 0, "the root was not split"
    assert cs_terms[cs_off[0] : cs_off[1]].tolist() == [b]
    for c in range(child[0], child[0] + 4):  # and out of the children
        assert (
            b not in cs_terms[cs_off[c] : cs_off[c + 1]]
            and b not in ns_terms[ns_off[c] : ns_off[c + 1]]
        )
    msgs = [
        Message("hit", ("b", "u00"), Point(-9.75, -9.75)),
        Message("miss", ("u00",), Point(-10, -10)),
    ]
    assert_same_matches(index, BruteMatcher(subs), msgs)
    assert index.match(msgs[0]) == ["s00"]


def test_greedy_pivots_take_the_most_shared_token_first():
    subs = [
        Subscription("ab", (("a", "b"),), Rect(0, 0, 1, 1)),
        Subscription("bc", (("b", "c"),), Rect(0, 0, 1, 1)),
        Subscription("bd", (("b", "d"),), Rect(0, 0, 1, 1)),
        Subscription("c", (("c",),), Rect(0, 0, 1, 1)),
    ]
    index = PTQuadtree.build(subs)  # one leaf
    reg, child, list_off, lists, list_box, list_tok, cs_off, cs_terms, ns_off, ns_terms = index.qt
    assert child.shape[0] == 1
    voc = index.store.vocab
    assert ns_terms.tolist() == sorted([voc["b"], voc["c"]])  # b (3 clauses), then c


# ---- LFilter (Sect. 5) ------------------------------------------------------------------------
def test_lfilter_takes_each_branch_of_the_cost_model_and_stays_exact():
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(40)]
    subs = [random_subscription(rng, f"s{i}", vocab) for i in range(600)]
    index = LFilter.build(subs, tau_num=8)
    index.check_invariants()
    oracle = BruteMatcher(subs)
    # a whole-world range message: cand_Q is every leaf, Cost_Q^F > Cost_T^F (Case 1)
    world = [Message("w", tuple(rng.sample(vocab, 5)), Rect(-180, -90, 180, 90))]
    assert_same_matches(index, oracle, world)
    assert index.counts[0] == 1 and index.counts[1] == 0

    # point messages: cand_Q = 1. Two tokens: the trie's filter is cheaper still (Case 1);
    # ten tokens: the quadtree filters (Case 2), then HYBRIDPRUNE picks per node (Eq. 5/6)
    def points(k):
        return [
            Message(
                f"p{k}.{i}",
                tuple(rng.sample(vocab, k)),
                Point(rng.uniform(-25, 25), rng.uniform(-25, 25)),
            )
            for i in range(60)
        ]

    assert_same_matches(index, oracle, points(2))
    assert index.counts[0] == 1 + 60 and index.counts[1] == 0
    assert_same_matches(index, oracle, points(10))
    assert index.counts[1] == 60
    assert index.counts[2] > 0, "no node chose list pruning (Eq. 5)"
    assert index.counts[3] > 0, "no node chose direct verification (Eq. 6)"
    assert_same_matches(index, oracle, [random_message(rng, f"r{i}", vocab) for i in range(100)])
    assert set(index.stats()) >= {"trie_messages", "list_pruned_nodes", "direct_verified_nodes"}


def test_list_pruning_cuts_each_list_to_a_child_range():
    # Sect. 5.2's example in spirit: one point, two trie subtrees; only the one on the point's
    # leaf survives list pruning, and its matches are the oracle's
    subs = [Subscription(f"a{i}", (("a", f"x{i}"),), Rect(0, 0, 1, 1)) for i in range(6)]
    subs += [Subscription(f"b{i}", (("b", f"x{i}"),), Rect(50, 50, 51, 51)) for i in range(6)]
    index = LFilter.build(subs, tau_num=2)
    index.check_invariants()
    msg = Message("m", ("a", "b", "x1", "x2"), Point(0.5, 0.5))
    assert sorted(index.match(msg)) == ["a1", "a2"]
    assert index.counts[1] == 1


# ---- changes (pending buffer, tombstones, rebuilds) ------------------------------------------
@pytest.mark.parametrize("cls", [MBRTrie, PTQuadtree, LFilter])
def test_inserts_merge_and_deletes_rebuild(cls):
    subs, msgs = _workload(9, 120, 40)
    index = cls.build(subs, pending_min=16)
    oracle = BruteMatcher(subs)
    rng = random.Random(2)
    vocab = [f"w{j}" for j in range(60)]
    positions = index.stats()["positions"]
    for i in range(4):  # at most 16 clauses: under the merge threshold, probed from the buffer
        s = random_subscription(rng, f"n{i}", vocab)
        index.subscribe(s)
        oracle.subscribe(s)
    assert index.stats()["pending"] > 0 and index.stats()["positions"] == positions
    index.check_invariants()
    assert_same_matches(index, oracle, msgs)
    for i in range(4, 40):
        s = random_subscription(rng, f"n{i}", vocab)
        index.subscribe(s)
        oracle.subscribe(s)
    assert index.stats()["positions"] > positions  # merged by a bulk rebuild
    index.check_invariants()
    assert_same_matches(index, oracle, msgs)
    for s in subs[:20]:
        index.unsubscribe(s.id)
        oracle.unsubscribe(s.id)
    assert index.stats()["dead"] > 0  # tombstones
    index.check_invariants()
    assert_same_matches(index, oracle, msgs)
    for s in subs[20:60]:
        index.unsubscribe(s.id)
        oracle.unsubscribe(s.id)
    assert index.stats()["dead"] * 4 <= index.stats()["positions"] + 4 * 16  # rebuilt once dead
    index.check_invariants()
    assert_same_matches(index, oracle, msgs)
