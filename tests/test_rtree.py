"""Focused tests of the R^t-tree family (``shard.rivals.rtree``; papers 003/004): node splits on
insert, the representative-token strategies of R^t+ (004 Sect. 4.2), the multiple representative
tokens of R^t++ (Sect. 5.1, its Property), delete with CondenseTree, each checked against the
brute-force oracle and ``check_invariants``."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.model import Message, Point, Rect, Subscription
from shard.rivals import rtree as rtree_module
from shard.rivals import rtree_kernels as K
from shard.rivals.rtree import STRATEGIES, RtPlusPlusTree, RtPlusTree, RtTree
from tests.workloads import assert_same_matches, random_message, random_subscription

SMALL = {"max_entries": 4, "min_entries": 2}
CLASSES = [RtTree, RtPlusTree, RtPlusPlusTree]


def _workload(seed: int, n_subs: int, n_msgs: int = 80):
    rng = random.Random(seed)
    subs = [random_subscription(rng, f"s{i}") for i in range(n_subs)]
    msgs = [random_message(rng, f"m{i}") for i in range(n_msgs)]
    return subs, msgs


def _reps(ix: RtPlusTree, sub_id: str) -> list[str]:
    """The representative token of each clause of ``sub_id``."""
    st = ix.store
    out = []
    for c in st.clauses_of(st.slot(sub_id)):
        assert ix.mlen[c] == 1
        out.append(st.vocab_terms[int(ix.mtok[ix.moff[c]])])
    return out


@pytest.mark.parametrize("cls", CLASSES)
def test_inserts_split_nodes_and_stay_exact(cls):
    subs, msgs = _workload(1, 120)
    ix = cls(**SMALL)
    oracle = BruteMatcher()
    heights = []
    for sub in subs:
        ix.subscribe(sub)
        oracle.subscribe(sub)
        ix.check_invariants()
        heights.append(ix.height)
    # a leaf of 4 overflows at the 5th clause: the root splits, and splits go on up the tree
    assert heights[0] == 0 and heights[-1] >= 3 and heights == sorted(heights)
    assert ix.stats()["nodes"] > 30
    assert_same_matches(ix, oracle, msgs)


@pytest.mark.parametrize("cls", CLASSES)
def test_bulk_str_and_bulk_insert_agree_with_the_oracle(cls):
    subs, msgs = _workload(2, 400)
    for bulk in ("str", "insert"):
        ix = cls.build(subs, bulk=bulk, **SMALL)
        ix.check_invariants()
        assert ix.height >= 3
        assert_same_matches(ix, BruteMatcher(subs), msgs)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("cls", [RtPlusTree, RtPlusPlusTree])
def test_each_strategy_gives_an_exact_index(cls, strategy):
    subs, msgs = _workload(3, 300)
    ix = cls.build(subs, strategy=strategy, **SMALL)
    ix.check_invariants()
    assert_same_matches(ix, BruteMatcher(subs), msgs)
    oracle = BruteMatcher(subs)
    rng = random.Random(4)
    for i in range(60):  # updates take their tokens from the maintained frequencies
        sub = random_subscription(rng, f"n{i}")
        ix.subscribe(sub)
        oracle.subscribe(sub)
        gone = subs[i].id
        ix.unsubscribe(gone)
        oracle.unsubscribe(gone)
    ix.check_invariants()
    assert_same_matches(ix, oracle, msgs)


def test_df_strategy_is_the_greedy_with_recounting():
    box = Rect(0, 0, 1, 1)
    clauses = [("a", "x"), ("a", "y"), ("a", "z"), ("b", "x"), ("b", "y"), ("c", "z")]
    subs = [Subscription(f"s{i}", (cl,), box) for i, cl in enumerate(clauses)]
    ix = RtPlusTree.build(subs, strategy="df")
    # a (df 3) first; of {b,x},{b,y},{c,z} b now has df 2 (x and y fell to 1): b; then c or z
    assert [_reps(ix, f"s{i}")[0] for i in range(5)] == ["a", "a", "a", "b", "b"]
    assert _reps(ix, "s5")[0] in ("c", "z")
    ix.check_invariants()


def test_idf_and_locality_strategies_pick_rare_tokens():
    west, east = Rect(-50, 0, -49, 1), Rect(49, 0, 50, 1)
    subs = [Subscription(f"w{i}", (("x", f"w{i}"),), west) for i in range(30)]  # x: local to west
    subs += [Subscription(f"e{i}", (("y", f"e{i}"),), east) for i in range(40)]  # y: local to east
    subs += [Subscription("probe", (("x", "y"),), west)]
    idf = RtPlusTree.build(subs, strategy="idf")
    loc = RtPlusTree.build(subs, strategy="locality", grid=10)
    assert _reps(idf, "w0") == ["w0"]  # the clause's rarest token
    assert _reps(idf, "probe") == ["x"]  # x (df 31) is rarer than y (df 41) overall
    assert _reps(loc, "probe") == ["y"]  # ... but in the west cell y is the rare one
    for ix in (idf, loc):
        ix.check_invariants()
        got = ix.match(Message("m", ("x", "y"), Point(-49.5, 0.5)))
        assert sorted(got) == ["probe"]


def test_rtplusplus_assigns_one_token_per_level():
    rng = random.Random(5)
    vocab = [f"t{i}" for i in range(40)]
    subs = []
    for i in range(300):
        k = rng.randint(1, 7)  # shorter and longer than the height
        base = random_subscription(rng, f"s{i}", vocab)
        subs.append(Subscription(base.id, (tuple(sorted(rng.sample(vocab, k))),), base.region))
    ix = RtPlusPlusTree.build(subs, **SMALL)
    ix.check_invariants()
    height = ix.height
    assert height >= 3
    root = int(ix.tr[K.ROOT])
    depth_of = {}
    for key in ix.ht[:, 0][ix.ht[:, 0] >= 0].tolist():
        n = key >> 32
        d, a = 0, n
        while a != root:
            a, d = int(ix.ni[a, K.PAR]), d + 1
        p = int(ix.ht[ix.ht[:, 0] == key][0, 1])
        while p >= 0:
            depth_of.setdefault(int(ix.lk[p, K.ECL]), []).append(d)
            p = int(ix.lk[p, K.NXT])
    for c, depths in depth_of.items():
        size = int(ix.store.cl_len[c])
        assert len(depths) == size  # Property (Sect. 5.1): s appears exactly |s| times ...
        for i in range(1, min(size, height)):  # ... and i times in the first i levels
            assert sum(d <= i for d in depths) == i
    msgs = [
        Message(f"m{i}", tuple(rng.sample(vocab, rng.randint(1, 30))), m.location)
        for i, m in enumerate(random_message(rng, f"x{i}") for i in range(200))
    ]
    assert_same_matches(ix, BruteMatcher(subs), msgs)


@pytest.mark.parametrize("cls", CLASSES)
def test_delete_then_match(cls):
    subs, msgs = _workload(6, 300)
    ix = cls.build(subs, **SMALL)
    oracle = BruteMatcher(subs)
    rng = random.Random(7)
    order = [s.id for s in subs]
    rng.shuffle(order)
    for i, sid in enumerate(order):
        ix.unsubscribe(sid)
        oracle.unsubscribe(sid)
        if i % 25 == 0:
            ix.check_invariants()
            assert_same_matches(ix, oracle, msgs[:20])
    ix.check_invariants()
    assert ix.height == 0 and ix.stats()["summary_entries"] == 0
    assert ix.match_batch(msgs[:5]) == [[]] * 5
    ix.subscribe(subs[0])  # and the emptied tree takes subscriptions again
    assert_same_matches(ix, BruteMatcher(subs[:1]), msgs)


@pytest.mark.parametrize("cls", CLASSES)
def test_interleaved_updates_with_seeds(cls):
    for seed in range(3):
        rng = random.Random(seed)
        ix = cls(**SMALL)
        oracle = BruteMatcher()
        live: list[str] = []
        for step in range(400):
            if live and rng.random() < 0.4:
                sid = live.pop(rng.randrange(len(live)))
                ix.unsubscribe(sid)
                oracle.unsubscribe(sid)
            else:
                sub = random_subscription(rng, f"s{step}")
                ix.subscribe(sub)
                oracle.subscribe(sub)
                live.append(sub.id)
            if step % 40 == 0:
                ix.check_invariants()
                msgs = [random_message(rng, f"m{j}") for j in range(20)]
                assert_same_matches(ix, oracle, msgs)
        ix.check_invariants()


def test_clause_without_terms_matches_by_region():
    subs = [
        Subscription("empty", ((),), Rect(0, 0, 1, 1)),
        Subscription("both", ((), ("a",)), Rect(0, 0, 1, 1)),
    ]
    for cls in CLASSES:
        ix = cls.build(subs)
        ix.check_invariants()
        assert sorted(ix.match(Message("m", ("zz",), Point(0.5, 0.5)))) == ["both", "empty"]
        assert ix.match(Message("m", ("a",), Point(5, 5))) == []


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_entries": 2}, "max_entries"),
        ({"max_entries": 10, "min_entries": 6}, "min_entries"),
        ({"bulk": "fast"}, "bulk"),
        ({"strategy": "tf"}, "strategy"),
        ({"grid": 0}, "grid"),
    ],
)
def test_options_are_validated(options, field):
    with pytest.raises(ValidationError) as err:
        RtPlusPlusTree(**options)
    assert err.value.field == field
    with pytest.raises(ValidationError):
        RtTree(strategy="idf")  # the R^t-tree has no representative tokens


def test_summaries_shrink_from_rt_to_rtplus():
    """Lemma 2's premise: a representative-token set is a subset of the TokenSet."""
    subs, _ = _workload(8, 300)
    rt = RtTree.build(subs, **SMALL)
    plus = RtPlusTree.build(subs, **SMALL)
    assert plus.stats()["summary_entries"] < rt.stats()["summary_entries"]
    keys_rt = set(rt.ht[:, 0][rt.ht[:, 0] >= 0].tolist())
    keys_plus = set(plus.ht[:, 0][plus.ht[:, 0] >= 0].tolist())
    assert keys_plus <= keys_rt  # same STR tree (same layout), so node ids agree
    assert np.array_equal(rt.nbox[: rt.tr[K.NHW]], plus.nbox[: plus.tr[K.NHW]])


@pytest.mark.parametrize("cls", CLASSES)
def test_subscribe_many_inserts_a_batch(cls):
    subs, msgs = _workload(9, 200)
    ix = cls(**SMALL)
    ix.subscribe_many(subs[:150])  # one batch (new distinct ids)
    ix.subscribe_many([*subs[150:], subs[3]])  # a present id: one by one, replacing it
    ix.check_invariants()
    assert len(ix) == 200 and ix.height >= 3
    assert_same_matches(ix, BruteMatcher(subs), msgs)


def test_rtplusplus_keeps_its_postings_through_a_pool_compaction_while_the_root_is_a_leaf():
    """A pool compaction at height 0 (more than 4,096 dead summary positions while the tree is
    one leaf) must leave every live position an element: once the root splits, the postings of
    the clauses from before the compaction are linked again (they were lost: no match)."""
    ix = RtPlusPlusTree.build([])
    keep = [
        Subscription(f"k{i}", (("a", "b", f"t{i}"),), Rect(i, 0, i + 0.5, 1)) for i in range(20)
    ]
    for s in keep:
        ix.subscribe(s)
    for j in range(1500):  # 3 tokens each: past 4,096 garbage positions at height 0
        ix.subscribe(Subscription(f"c{j}", (("x", "y", f"u{j}"),), Rect(0, 0, 1, 1)))
        ix.unsubscribe(f"c{j}")
    assert ix.height == 0
    for j in range(200):  # the root splits: the summaries are made again from the positions
        ix.subscribe(Subscription(f"g{j}", (("p", f"v{j}"),), Rect(j, 5, j + 0.5, 6)))
    assert ix.height > 0
    ix.check_invariants()
    assert ix.match(Message("m", ("a", "b", "t3"), Point(3.2, 0.5))) == ["k3"]
    for s in keep[:10]:  # and their removal unlinks their own postings only
        ix.unsubscribe(s.id)
    ix.check_invariants()
    assert ix.match(Message("m", ("a", "b", "t13"), Point(13.2, 0.5))) == ["k13"]


@pytest.mark.parametrize("cls", CLASSES)
def test_a_batch_past_the_chunk_takes_the_same_tokens_as_one_compiled_call(cls, monkeypatch):
    """``subscribe_many`` of more than ``_CHUNK`` clauses goes the chunked way (tokens, counts,
    then inserts chunk by chunk); a smaller one goes through ``subscribe_rows`` in one call: the
    same summary tokens, an exact index either way, and ``unsubscribe_rows`` takes them out."""
    subs, msgs = _workload(10, 160)
    one = cls.build(subs[:40], **SMALL)
    one.subscribe_many(subs[40:])
    monkeypatch.setattr(rtree_module, "_CHUNK", 7)
    chunked = cls.build(subs[:40], **SMALL)
    chunked.subscribe_many(subs[40:])
    for ix in (one, chunked):
        ix.check_invariants()
        assert_same_matches(ix, BruteMatcher(subs), msgs)
    st_a, st_b = one.store, chunked.store
    for s in subs[40:]:
        ca = st_a.clauses_of(st_a.slot(s.id))
        cb = st_b.clauses_of(st_b.slot(s.id))
        ta = [one.mtok[one.moff[c] : one.moff[c] + one.mlen[c]].tolist() for c in ca]
        tb = [
            chunked.mtok[chunked.moff[c] : chunked.moff[c] + chunked.mlen[c]].tolist() for c in cb
        ]
        assert ta == tb, s.id
    for s in subs[::3]:
        one.unsubscribe(s.id)
    one.check_invariants()
    assert_same_matches(one, BruteMatcher([s for i, s in enumerate(subs) if i % 3]), msgs)
