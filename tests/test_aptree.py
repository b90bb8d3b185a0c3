"""AP-Tree unit tests: node types, dummy cut/cell, dynamic maintenance, DNF, circles, region
messages; every tree is ``check_invariants()``-ed after every mutation and compared with the oracle."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from shard.applus import APPlusTree
from shard.aptree import APTree
from shard.aptree.layout import (
    C_NODES,
    F_CHOFF,
    F_DUMMY,
    F_NBUILT,
    F_NCH,
    F_TYPE,
    KNODE,
    LEAF,
    SNODE,
    T_CHI,
    T_CLO,
    T_CNT,
    T_NI,
)
from shard.aptree.match import DIRECT_MIN_CUTS, NO_LEAVES
from shard.aptree.store import SubscriptionStore
from shard.brute import BruteMatcher
from shard.errors import NotFoundError, ValidationError
from shard.model import Circle, Message, Point, Rect, Subscription
from tests.workloads import assert_same_matches, random_message, random_subscription


def root_type(tree: APTree) -> int:
    return int(tree._tree[T_NI][0, F_TYPE])


def root_dummy(tree: APTree) -> int:
    return int(tree._tree[T_NI][0, F_DUMMY])


def test_small_set_is_one_leaf():
    subs = [Subscription(f"s{i}", (("a",),), Rect(0, 0, 1, 1)) for i in range(5)]
    tree = APTree.build(subs, theta_p=10)
    tree.check_invariants()
    assert root_type(tree) == LEAF
    assert sorted(tree.match(Message("m", ("a",), Point(0.5, 0.5)))) == [f"s{i}" for i in range(5)]
    assert tree.match(Message("m", ("b",), Point(0.5, 0.5))) == []


def test_keyword_workload_builds_k_node_with_dummy_cut():
    # one region for all: only keywords can separate them; 2-term clauses exhaust at offset 2
    subs = [
        Subscription(f"s{i}", ((f"k{i % 50}", f"z{i % 3}"),), Rect(-1, -1, 1, 1))
        for i in range(400)
    ]
    tree = APTree.build(subs, theta_p=8, fanout=16)
    tree.check_invariants()
    assert root_type(tree) == KNODE
    st = tree.stats()
    assert st["k_nodes"] >= 2
    got = tree.match(Message("m", ("k7", "z1"), Point(0, 0)))
    assert sorted(got) == sorted(f"s{i}" for i in range(400) if i % 50 == 7 and i % 3 == 1)


def test_k_nodes_cut_one_keyword_each_by_default_and_at_most_keyword_fanout_when_bounded():
    subs = [Subscription(f"s{i}", ((f"k{i % 300}", "z"),), Rect(-1, -1, 1, 1)) for i in range(3000)]
    for options, one_each in (({}, True), ({"keyword_fanout": 20}, False)):
        tree = APTree.build(subs, theta_p=8, **options)
        tree.check_invariants()
        NI, CLO, CHI = tree._tree[T_NI], tree._tree[T_CLO], tree._tree[T_CHI]
        assert root_type(tree) == KNODE
        off, nch = int(NI[0, F_CHOFF]), int(NI[0, F_NCH])
        singles = all(CLO[off + k] == CHI[off + k] for k in range(nch))
        assert (nch, singles) == ((300, True) if one_each else (20, False))
        got = tree.match(Message("m", ("k7", "z"), Point(0, 0)))
        assert sorted(got) == sorted(f"s{i}" for i in range(3000) if i % 300 == 7)


def test_dummy_cut_holds_exhausted_clauses():
    subs = [Subscription(f"a{i}", (("common", f"x{i}"),), Rect(0, 0, 1, 1)) for i in range(60)]
    subs += [Subscription(f"b{i}", (("common",),), Rect(0, 0, 1, 1)) for i in range(60)]
    tree = APTree.build(subs, theta_p=8, fanout=8)
    tree.check_invariants()
    got = tree.match(Message("m", ("common",), Point(0.5, 0.5)))
    assert sorted(got) == sorted(f"b{i}" for i in range(60))


def test_spatial_workload_builds_s_node_with_dummy_cell():
    rng = random.Random(3)
    subs = []
    for i in range(600):
        x, y = rng.uniform(-170, 160), rng.uniform(-80, 70)
        subs.append(Subscription(f"s{i}", (("same",),), Rect(x, y, x + 1, y + 1)))
    world = [Subscription(f"w{i}", (("same",),), Rect(-180, -90, 180, 90)) for i in range(30)]
    tree = APTree.build(subs + world, theta_p=8, fanout=16)
    tree.check_invariants()
    assert root_type(tree) == SNODE
    assert root_dummy(tree) >= 0
    brute = BruteMatcher(subs + world)
    msgs = [
        Message(f"m{i}", ("same",), Point(rng.uniform(-180, 180), rng.uniform(-90, 90)))
        for i in range(300)
    ]
    assert_same_matches(tree, brute, msgs)
    # every message anywhere reaches the world-covering subscriptions in the dummy cell
    assert all({f"w{i}" for i in range(30)} <= set(r) for r in tree.match_batch(msgs))


def test_dnf_subscription_delivered_once():
    sub = Subscription("s", (("a", "b"), ("a", "c"), ("d",)), Rect(0, 0, 2, 2))
    others = [Subscription(f"o{i}", ((f"q{i}",),), Rect(0, 0, 2, 2)) for i in range(100)]
    tree = APTree.build([sub, *others], theta_p=4, fanout=8)
    tree.check_invariants()
    assert tree.match(Message("m", ("a", "b", "c", "d"), Point(1, 1))) == ["s"]
    assert tree.match(Message("m", ("a",), Point(1, 1))) == []


def test_region_message_reaches_replicated_subscription_once():
    rng = random.Random(5)
    subs = [
        Subscription(f"s{i}", (("t",),), Rect(rng.uniform(-10, 9), rng.uniform(-10, 9), 10, 10))
        for i in range(500)
    ]
    tree = APTree.build(subs, theta_p=4, fanout=16, max_span=1000)
    tree.check_invariants()
    assert tree.stats()["entries"] > tree.stats()["clauses"]  # replication happened
    got = tree.match(Message("m", ("t",), Rect(-10, -10, 10, 10)))
    assert sorted(got) == sorted(s.id for s in subs)


def test_circle_is_verified_exactly():
    # 1 degree of latitude is 111,195 m on this sphere: a point just inside and just outside
    c = Subscription("c", (("x",),), Circle(10.0, 0.0, 111_195.0))
    filler = [Subscription(f"f{i}", (("x",),), Rect(i, 0, i + 0.1, 0.1)) for i in range(50)]
    tree = APTree.build([c, *filler], theta_p=4, fanout=8)
    tree.check_invariants()
    assert "c" in tree.match(Message("m", ("x",), Point(10.0, 0.999)))
    assert "c" not in tree.match(Message("m", ("x",), Point(10.0, 1.001)))
    # corner of the bounding box is outside the circle
    assert "c" not in tree.match(Message("m", ("x",), Point(10.99, 0.99)))
    # a rect message whose nearest point is within the radius
    assert "c" in tree.match(Message("m", ("x",), Rect(10.5, 0.5, 20, 20)))


def test_circle_across_antimeridian():
    c = Subscription("c", (("x",),), Circle(179.9, 0.0, 50_000.0))
    tree = APTree.build([c], theta_p=1, fanout=4)
    tree.check_invariants()
    assert tree.match(Message("m", ("x",), Point(-179.9, 0.0))) == ["c"]
    assert tree.match(Message("m", ("x",), Point(-179.0, 0.0))) == []


def test_subscribe_replaces_and_unsubscribe_unknown_raises():
    tree = APTree.build([Subscription("s", (("a",),), Rect(0, 0, 1, 1))])
    tree.subscribe(Subscription("s", (("b",),), Rect(0, 0, 1, 1)))
    tree.check_invariants()
    assert len(tree) == 1
    assert tree.match(Message("m", ("a",), Point(0, 0))) == []
    assert tree.match(Message("m", ("b",), Point(0, 0))) == ["s"]
    with pytest.raises(NotFoundError):
        tree.unsubscribe("nope")
    tree.unsubscribe("s")
    tree.check_invariants()
    assert len(tree) == 0 and tree.match(Message("m", ("b",), Point(0, 0))) == []


def test_leaf_split_and_collapse():
    tree = APTree(theta_p=8, fanout=8)
    rng = random.Random(1)
    subs = [random_subscription(rng, f"s{i}") for i in range(300)]
    for s in subs:
        tree.subscribe(s)
        tree.check_invariants()
    st = tree.stats()
    assert st["k_nodes"] + st["s_nodes"] > 0 and st["rebuilds"] > 0  # leaves were split
    for s in subs[:295]:
        tree.unsubscribe(s.id)
        tree.check_invariants()
    assert_same_matches(
        tree, BruteMatcher(subs[295:]), [random_message(rng, f"m{i}") for i in range(100)]
    )
    for s in subs[295:]:
        tree.unsubscribe(s.id)
        tree.check_invariants()
    assert root_type(tree) == LEAF  # collapsed below θp
    assert tree.stats()["nodes"] == 1


def test_kl_divergence_triggers_reconstruction():
    # build on keywords k0..k9, then insert a workload on other keywords
    base = [Subscription(f"b{i}", ((f"k{i % 10}",),), Rect(0, 0, 1, 1)) for i in range(2000)]
    tree = APTree.build(base, theta_p=8, fanout=16)
    before = tree.stats()["rebuilds"]
    for i in range(1500):
        tree.subscribe(Subscription(f"n{i}", ((f"k{10 + i % 40}",),), Rect(0, 0, 1, 1)))
    tree.check_invariants()
    assert tree.stats()["rebuilds"] > before
    got = tree.match(Message("m", ("k12",), Point(0.5, 0.5)))
    assert sorted(got) == sorted(f"n{i}" for i in range(1500) if 10 + i % 40 == 12)


def test_a_wide_k_node_is_not_rebuilt_for_growth_that_follows_its_distribution():
    # 2,000 keywords with 2-3 subscriptions each: one cut per keyword at the root. Growth in the
    # same distribution moves each cut's count by sampling noise only (kl_noise); growth onto
    # ten keywords is drift, and the root is rebuilt.
    def sub(name, i):
        return Subscription(name, ((f"k{i}", "z"),), Rect(0, 0, 1, 1))

    base = [sub(f"b{i}", i % 2000) for i in range(5000)]
    tree = APTree.build(base, theta_p=8)
    root_built = int(tree._tree[T_NI][0, F_NBUILT])
    for i in range(1000):
        tree.subscribe(sub(f"n{i}", (i * 7919) % 2000))
    tree.check_invariants()
    assert int(tree._tree[T_NI][0, F_NBUILT]) == root_built  # not rebuilt
    for i in range(1500):
        tree.subscribe(sub(f"d{i}", i % 10))
    tree.check_invariants()
    assert int(tree._tree[T_NI][0, F_NBUILT]) > root_built  # rebuilt
    got = tree.match(Message("m", ("k3", "z"), Point(0.5, 0.5)))
    want = [s.id for s in base if s.clauses[0][0] == "k3"] + [
        f"d{i}" for i in range(1500) if i % 10 == 3
    ]
    want += [f"n{i}" for i in range(1000) if (i * 7919) % 2000 == 3]
    assert sorted(got) == sorted(want)


@pytest.mark.parametrize(
    "options",
    [
        {"keyword_partition": "optimal"},
        {"keyword_order": "alphabetical"},
        {"keyword_order": "rare-first"},
        {"keyword_order": ["t39", "t38"]},
        {"keyword_fanout": 3},
        {"keyword_fanout": 9, "keyword_order": "frequency"},
        {"max_span": 1},
        {"max_span": 10_000},
    ],
)
def test_options_keep_results_exact(options):
    rng = random.Random(11)
    subs = [random_subscription(rng, f"s{i}") for i in range(800)]
    msgs = [random_message(rng, f"m{i}") for i in range(300)]
    tree = APTree.build(subs, theta_p=6, fanout=9, **options)
    tree.check_invariants()
    assert_same_matches(tree, BruteMatcher(subs), msgs)


def test_message_sample_probabilities_keep_results_exact():
    rng = random.Random(12)
    subs = [random_subscription(rng, f"s{i}") for i in range(800)]
    msgs = [random_message(rng, f"m{i}") for i in range(300)]
    tree = APTree.build(subs, message_sample=msgs[:100], theta_p=6, fanout=9)
    tree.check_invariants()
    assert tree._params[6] == 1.0
    assert_same_matches(tree, BruteMatcher(subs), msgs)


def test_bulk_load_later_id_replaces_earlier():
    subs = [
        Subscription("s", (("a",),), Rect(0, 0, 1, 1)),
        Subscription("s", (("b",),), Rect(0, 0, 1, 1)),
    ]
    tree = APTree.build(subs)
    tree.check_invariants()
    assert len(tree) == 1
    assert tree.match(Message("m", ("a", "b"), Point(0.5, 0.5))) == ["s"]
    assert tree.match(Message("m", ("a",), Point(0.5, 0.5))) == []


def test_unknown_message_terms_match_nothing():
    tree = APTree.build([Subscription("s", (("a",),), Rect(0, 0, 1, 1))])
    assert tree.match(Message("m", ("zzz",), Point(0.5, 0.5))) == []


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("fanout", 2),
        ("theta_p", 0),
        ("theta_kl", 0.0),
        ("keyword_partition", "best"),
        ("keyword_order", "random"),
        ("max_span", 0),
        ("keyword_fanout", 1),
        ("keyword_fanout", -1),
        ("keyword_fanout", 2.5),
    ],
)
def test_bad_options_name_the_field(option, value):
    with pytest.raises(ValidationError) as e:
        APTree(**{option: value})
    assert e.value.field == option and e.value.value == value


def test_match_encoded_counts_verifications():
    subs = [Subscription(f"s{i}", (("a",),), Rect(0, 0, 1, 1)) for i in range(3)]
    tree = APTree.build(subs)
    out_m, out_s = tree.match_encoded(tree.encode([Message("m", ("a",), Point(0.5, 0.5))]))
    assert out_m.tolist() == [0, 0, 0] and sorted(out_s.tolist()) == [0, 1, 2]
    assert tree.verified == 3
    assert isinstance(out_s, np.ndarray)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gone=st.integers(0, 30), batch=st.integers(1, 40))
def test_add_many_stores_what_add_stores_one_by_one(seed, gone, batch):
    """The batched ``add_many`` (a shard's round of new subscriptions) leaves every column,
    slot and clause row as ``add`` one by one does, free slots and clause blocks reused."""
    rng = random.Random(seed)
    first = [random_subscription(rng, f"a{i}") for i in range(40)]
    later = [random_subscription(rng, f"b{i}") for i in range(batch)]
    stores = [SubscriptionStore(), SubscriptionStore()]
    for store in stores:
        for s in first:
            store.add(s)
        for s in first[:gone]:
            store.remove(s.id)
    one, many = stores
    got_one = [one.add(s) for s in later]
    slots, clauses, off = many.add_many(later)
    assert slots.tolist() == [g[0] for g in got_one]
    assert [clauses[off[i] : off[i + 1]].tolist() for i in range(batch)] == [
        g[1].tolist() for g in got_one
    ]
    for name in ("kind", "bbox", "circ", "moving", "first_clause", "n_clauses", "tag", "last_t"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    for name in ("cl_sub", "cl_off", "cl_len"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    assert np.array_equal(one.terms[: one.n_terms], many.terms[: many.n_terms])
    assert one.slot_of == many.slot_of and list(one.ids) == list(many.ids)
    assert one.vocab == many.vocab and one.n_clause_rows == many.n_clause_rows


def test_the_first_subscribes_after_a_bulk_load_do_not_copy_the_store():
    """A bulk load leaves room in the store's columns (``HEADROOM``): the Subscribes that come
    next (a shard's first rounds after a load) write into them instead of copying every column
    of the loaded subscriptions first, a stall of ~110 ms at 1M."""
    rng = random.Random(5)
    subs = [random_subscription(rng, f"s{i}") for i in range(4000)]
    tree = APTree.build(subs)
    store = tree.store
    columns = {name: getattr(store, name) for name in ("kind", "bbox", "cl_sub", "terms")}
    for i in range(len(subs) // 10):
        tree.subscribe(random_subscription(rng, f"new{i}"))
    for name, column in columns.items():
        assert getattr(store, name) is column, f"{name} was copied"
    assert len(tree) == 4400


def test_the_first_nodes_made_after_a_bulk_load_do_not_copy_the_node_pool():
    """A bulk build asks for a wide root's cuts at once; the node pool then keeps room
    (``POOL_HEADROOM``), so the first nodes a shard makes after a load (a dummy leaf for a new
    keyword, a split) do not copy every node's row first, a stall of ~45 ms at 510,000."""
    rng = random.Random(8)
    subs = [
        Subscription(f"s{i}", ((f"w{i % 3000}",),), Rect(x := rng.uniform(0, 2), x, x + 8, x + 8))
        for i in range(6000)
    ]
    tree = APTree.build(subs)
    nodes = tree.arrays[T_NI]
    before = int(tree.arrays[T_CNT][C_NODES])
    assert root_type(tree) == KNODE and nodes[0, F_NCH] >= 3000
    for i in range(5):  # keywords the root has no cut for: its dummy
        tree.subscribe(Subscription(f"new{i}", ((f"fresh{i}",),), Rect(0, 0, 1, 1)))
    for i in range(170):  # a leaf past θp (160): split
        tree.subscribe(Subscription(f"more{i}", (("w7",),), Rect(i % 9, 0, i % 9 + 1, 1)))
    assert tree.arrays[T_CNT][C_NODES] >= before + 2  # (more than one node made)
    copied = tree.arrays[T_NI] is not nodes
    assert not copied, "the node pool was copied"
    assert len(tree) == 6175
    assert_same_matches(
        tree, BruteMatcher([*subs]), [random_message(rng, f"m{i}") for i in range(50)]
    )


def test_a_wide_root_answers_from_its_direct_table_and_a_stale_one_loses_no_match():
    """The root of rare-term subscriptions has a cut per keyword: matching reads the cut off
    the root's direct table. A table gone stale (here: scrambled) is caught by its check
    against the cut bounds, loses no match, and is re-made for the next batch; so is one the
    root's growth left behind."""
    rng = random.Random(21)
    subs = [
        Subscription(f"s{i}", ((f"w{i % 700}",),), Rect(x := rng.uniform(0, 2), x, x + 8, x + 8))
        for i in range(2000)
    ]
    msgs = [
        Message(f"m{i}", tuple({f"w{rng.randrange(800)}" for _ in range(6)}), Point(p, p))
        for i, p in enumerate(rng.uniform(0, 10) for _ in range(400))
    ]
    tree = APTree.build(subs)
    NI = tree.arrays[T_NI]
    assert root_type(tree) == KNODE and NI[0, F_NCH] >= DIRECT_MIN_CUTS
    table, node, _ = tree.direct_table()
    assert node == 0 and table.size > 0
    brute = BruteMatcher(subs)
    assert_same_matches(tree, brute, msgs)
    tree._direct = (table[::-1].copy(), 0)
    tree._leaves, tree._leaves_at = NO_LEAVES, tree._changes  # (every term by its cut)
    assert_same_matches(tree, brute, msgs)
    assert tree._direct_key is None  # the kernel saw it stale: re-made next time
    assert np.array_equal(tree.direct_table()[0], table)
    more = [Subscription(f"n{i}", ((f"w{700 + i}",),), Rect(0, 0, 10, 10)) for i in range(100)]
    for s in more:
        tree.subscribe(s)
        brute.subscribe(s)
    tree.check_invariants()
    assert_same_matches(tree, brute, msgs)


def test_the_wide_roots_leaves_by_term_stay_exact_through_subscribes_and_unsubscribes():
    """A wide root's leaves addressed by term (``direct_leaves``): the kernel goes from a
    message term straight to its leaf's records without checking them, so the table must be
    the tree's as it is. Leaves that grow, move (past their capacity), split, shrink and new
    cuts: every match equals the brute force's after each change; and the test can fail: a
    table kept past a change (pretended fresh) loses the new subscriptions' matches."""
    rng = random.Random(5)

    def sub(i: int, word: int) -> Subscription:
        x = rng.uniform(0, 6)
        return Subscription(f"s{i}", ((f"w{word}",),), Rect(x, x, x + 4, x + 4))

    subs = [sub(i, i % 600) for i in range(1800)]
    msgs = [
        Message(f"m{i}", tuple({f"w{rng.randrange(700)}" for _ in range(8)}), Point(p, p))
        for i, p in enumerate(rng.uniform(0, 10) for _ in range(300))
    ]
    tree = APTree.build(subs)
    brute = BruteMatcher(subs)
    assert_same_matches(tree, brute, msgs)
    leaves = tree.direct_table(len(msgs))[2]
    assert (leaves[:, 0] >= 0).sum() > 500  # most terms go straight to their leaf
    made = tree._leaves_at
    n = len(subs)
    for step in range(6):
        for _ in range(40):  # grown leaves (some past their capacity), new terms' cuts
            s = sub(n, rng.randrange(650) if step % 2 else rng.randrange(5))
            n += 1
            tree.subscribe(s)
            brute.subscribe(s)
        for sid in rng.sample(sorted(brute._subs), 25):
            tree.unsubscribe(sid)
            brute.unsubscribe(sid)
        assert_same_matches(tree, brute, msgs)
        assert tree._leaves_at != made  # made again for the changed tree
        made = tree._leaves_at
    tree.check_invariants()
    # a table kept past a change would miss: the test sees it
    old = tree.direct_table(len(msgs))[2].copy()
    hot = next(w for w in range(600) if old[w, 0] >= 0)
    extra = [Subscription(f"x{i}", ((f"w{hot}",),), Rect(0, 0, 10, 10)) for i in range(50)]
    for s in extra:
        tree.subscribe(s)
        brute.subscribe(s)
    tree._leaves, tree._leaves_at = old, tree._changes
    probe = [Message("p", (f"w{hot}",), Point(5, 5))]
    assert set(tree.match_batch(probe)[0]) != set(brute.match_batch(probe)[0])


def test_messages_that_outgrow_the_kernels_arrays_lose_nothing():
    # a root k-node of 600 one-keyword cuts and messages holding every keyword: each message
    # pushes 600 children (the kernel's stack starts at 256), matches 600 subscriptions (its
    # pairs start at 1,024) and visits 601 nodes (the trace starts at 4,096 entries); the
    # kernel stops where an array is full, grows it and goes on from that message
    n = 600
    subs = [Subscription(f"s{i}", ((f"k{i}",),), Rect(-10, -10, 10, 10)) for i in range(n)]
    subs += [Subscription(f"far{i}", ((f"k{i}",),), Rect(50, 50, 60, 60)) for i in range(n)]
    tree = APTree.build(subs, theta_p=4)
    assert root_type(tree) == KNODE
    every = tuple(f"k{i}" for i in range(n))
    msgs = [Message(f"m{j}", every, Point(j / 10, 0.0)) for j in range(40)]
    msgs += [Message("few", ("k1", "k2"), Point(55, 55)), Message("r", every, Rect(-1, -1, 51, 51))]
    oracle = BruteMatcher()
    for s in subs:
        oracle.subscribe(s)
    assert_same_matches(tree, oracle, msgs)
    assert sum(map(len, tree.match_batch(msgs))) == 40 * n + 2 + 2 * n

    moving = APPlusTree.build(subs, theta_p=4)
    e = moving.encode(msgs)
    tr_m, tr_n = moving.traversal(e.off, e.terms, e.kind, e.geom)
    assert tr_m.shape[0] > 4096
    one_by_one = [moving.traversal(*_one(e, q)) for q in range(len(msgs))]
    assert tr_m.tolist() == [q for q, (m, _) in enumerate(one_by_one) for _ in m.tolist()]
    assert tr_n.tolist() == [u for _, nodes in one_by_one for u in nodes.tolist()]


def _one(e, q: int):
    """Message ``q`` of encoded batch ``e`` as a batch of its own (off, terms, kind, geom)."""
    a, b = int(e.off[q]), int(e.off[q + 1])
    return np.array([0, b - a]), e.terms[a:b], e.kind[q : q + 1], e.geom[q : q + 1]
