"""Focused tests of IQ-Tree and RQ-Tree (paper 002, Sect. 3.1 and 5.1.1;
``shard.rivals.iq_quadtree``): the ranked key, the cell split, the cost model's decomposition,
the clause outside the space, deletes and pool compaction, every option value, each against the
brute-force oracle and ``check_invariants``."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest

from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.model import Message, Point, Rect, Subscription
from shard.rivals import iq_quadtree as qt
from shard.rivals.iqtree import IQTree
from shard.rivals.rqtree import RQTree
from tests.workloads import assert_same_matches, random_message, random_subscription

BOTH = [IQTree, RQTree]


def _sub(sid, terms, x0, y0, x1, y1):
    return Subscription(sid, (tuple(terms),), Rect(x0, y0, x1, y1))


def _copy_cells(ix, sub_id):
    """The cells holding a copy of each clause of ``sub_id``."""
    st = ix.store
    out = []
    for c in st.clauses_of(st.slot(sub_id)).tolist():
        cells, p = [], int(ix.ki[c, qt.K_FIRST])
        while p >= 0:
            cells.append(int(ix.li[ix.ei[p, qt.E_LIST], qt.L_CELL]))
            p = int(ix.ei[p, qt.E_NEXT])
        out.append(sorted(cells))
    return out


def _grid_messages(terms, n=9, lo=-1.0, hi=11.0):
    """Point messages on a lattice over (and around) the test space, plus a few rectangles."""
    xs = np.linspace(lo, hi, n)
    msgs = [
        Message(f"p{i}_{j}", terms, Point(x, y)) for i, x in enumerate(xs) for j, y in enumerate(xs)
    ]
    msgs += [
        Message("r0", terms, Rect(4.0, 4.0, 6.0, 6.0)),
        Message("r1", terms, Rect(-5, -5, 20, 20)),
    ]
    return msgs


@pytest.mark.parametrize("cls", BOTH)
def test_clause_filed_under_its_least_frequent_term(cls):
    # Sect. 3.1: "a subscription is assigned to the posting list of its least frequent keyword"
    subs = [_sub(f"c{i}", ["common"], 0, 0, 1, 1) for i in range(5)]
    subs += [_sub("mid1", ["mid"], 0, 0, 1, 1), _sub("mid2", ["mid"], 0, 0, 1, 1)]
    subs += [_sub("x", ["common", "mid", "rare"], 0, 0, 1, 1)]
    ix = cls.build(subs)
    ix.check_invariants()
    st = ix.store
    (c,) = st.clauses_of(st.slot("x")).tolist()
    assert st.vocab_terms[ix.ki[c, qt.K_KEY]] == "rare"
    p = int(ix.ki[c, qt.K_FIRST])
    assert st.vocab_terms[ix.li[ix.ei[p, qt.E_LIST], qt.L_TERM]] == "rare"
    # a later clause is keyed by the frequencies of its time: "mid" (2 + 1) beats "common" (6)
    ix.subscribe(_sub("y", ["common", "mid"], 0, 0, 1, 1))
    (c,) = st.clauses_of(st.slot("y")).tolist()
    assert st.vocab_terms[ix.ki[c, qt.K_KEY]] == "mid"
    msgs = [Message("m", ("common", "mid", "rare"), Point(0.5, 0.5))]
    assert_same_matches(ix, BruteMatcher([*subs, _sub("y", ["common", "mid"], 0, 0, 1, 1)]), msgs)


@pytest.mark.parametrize("cls", BOTH)
def test_a_leaf_over_capacity_splits_into_quadrants_and_stays_exact(cls):
    # Fig. 4a: cells; a leaf of more than cell_capacity entries splits into four
    corners = [_sub(f"k{i}", ["a"], x, y, x, y) for i, (x, y) in enumerate([(0, 0), (10, 10)])]
    ix = cls.build(corners, cell_capacity=2, messages_per_update=0.0)
    assert ix.stats()["cells"] == 1 and ix.stats()["leaves"] == 1
    subs = list(corners)
    for i, (x, y) in enumerate([(1, 1), (9, 1), (1, 9), (9, 9)]):
        sub = _sub(f"n{i}", ["a"], x, y, x + 0.5, y + 0.5)
        ix.subscribe(sub)
        subs.append(sub)
        ix.check_invariants()
    s = ix.stats()
    assert s["cells"] == 5 and s["leaves"] == 4 and s["depth"] == 1, s
    root = 0 if cls is IQTree else int(ix.troot[ix.store.vocab["a"] + 1])
    assert ix.ci[root, qt.C_COUNT] == 0  # every entry went down to a quadrant
    ch = int(ix.ci[root, qt.C_CHILD])
    assert [int(ix.ci[ch + i, qt.C_COUNT]) for i in range(4)] == [2, 1, 1, 2]
    # message shares: (entries meeting the quadrant + 1) / (all + 4), summing to the parent's
    assert ix.cf[ch : ch + 4, qt.C_W].sum() == pytest.approx(1.0)
    assert_same_matches(ix, BruteMatcher(subs), _grid_messages(("a", "b")))


def _split_space(cls, **options):
    """An index over the space [0, 10]^2 whose root has split (five point subscriptions)."""
    pts = [(0, 0), (10, 10), (2, 2), (8, 2), (2, 8)]
    subs = [_sub(f"k{i}", ["a"], x, y, x, y) for i, (x, y) in enumerate(pts)]
    ix = cls.build(subs, cell_capacity=1, max_depth=3, **options)
    return ix, subs


@pytest.mark.parametrize("cls", BOTH)
def test_cost_model_decomposes_a_clause_only_when_it_pays(cls):
    # Sect. 3.1: a subscription is attached to one or several cells by the cost model
    wide = _sub("wide", ["a"], 1.0, 1.0, 9.0, 3.0)  # meets the two lower quadrants of the root
    ix, subs = _split_space(cls, messages_per_update=0.0)  # copies never pay
    ix.subscribe(wide)
    root = 0 if cls is IQTree else int(ix.troot[ix.store.vocab["a"] + 1])
    assert _copy_cells(ix, "wide") == [[root]]
    ix.check_invariants()
    msgs = _grid_messages(("a",))
    assert_same_matches(ix, BruteMatcher([*subs, wide]), msgs)

    ix, subs = _split_space(cls, messages_per_update=1e12)  # verifications cost more
    ix.subscribe(wide)
    cells = _copy_cells(ix, "wide")[0]
    assert len(cells) >= 2 and root not in cells
    assert all(ix.ci[c, qt.C_DEPTH] >= 1 for c in cells)
    ix.check_invariants()
    assert_same_matches(ix, BruteMatcher([*subs, wide]), msgs)
    # a box meeting all four quadrants saves nothing by being copied: it stays at the root
    ix.subscribe(_sub("all", ["a"], 4.0, 4.0, 6.0, 6.0))
    assert _copy_cells(ix, "all") == [[root]]
    # a box leaving the space is only covered by the root
    ix.subscribe(_sub("out", ["a"], 8.0, 8.0, 30.0, 9.0))
    assert _copy_cells(ix, "out") == [[root]]
    ix.check_invariants()
    subs += [wide, _sub("all", ["a"], 4.0, 4.0, 6.0, 6.0), _sub("out", ["a"], 8.0, 8.0, 30.0, 9.0)]
    far = [Message("far", ("a",), Point(25.0, 8.5)), Message("farr", ("a",), Rect(20, 0, 40, 20))]
    assert_same_matches(ix, BruteMatcher(subs), msgs + far)
    assert ix.match_batch(far) == [["out"], ["out"]]


@pytest.mark.parametrize("cls", BOTH)
def test_delete_takes_every_copy_out_then_matches(cls):
    rng = random.Random(11)
    subs = [random_subscription(rng, f"s{i}") for i in range(250)]
    ix = cls.build(subs, cell_capacity=3, max_depth=6, messages_per_update=1e9)
    oracle = BruteMatcher(subs)
    entries = ix.stats()["entries"]
    gone = rng.sample([s.id for s in subs], 120)
    copies = sum(len(cells) for sid in gone for cells in _copy_cells(ix, sid))
    assert copies > len(gone)  # decomposed clauses among them
    for sid in gone:
        ix.unsubscribe(sid)
        oracle.unsubscribe(sid)
    assert ix.stats()["entries"] == entries - copies
    ix.check_invariants()
    msgs = [random_message(rng, f"m{i}") for i in range(150)]
    assert_same_matches(ix, oracle, msgs)


@pytest.mark.parametrize("cls", BOTH)
def test_churn_compacts_the_pool_and_stays_exact(cls, monkeypatch):
    monkeypatch.setattr(qt, "COMPACT_MIN_UNUSED", 256)
    rng = random.Random(5)
    ix = cls(cell_capacity=2)
    oracle = BruteMatcher()
    live: list[str] = []
    top = []  # the pool's end
    for round_ in range(12):
        batch = [random_subscription(rng, f"r{round_}_{i}") for i in range(400)]
        ix.subscribe_many(batch)
        top.append(int(ix.meta[qt.M_ETOP]))
        for s in batch:
            oracle.subscribe(s)
        live += [s.id for s in batch]
        for sid in rng.sample(live, 300):
            live.remove(sid)
            ix.unsubscribe(sid)
            oracle.unsubscribe(sid)
    # the pool only grows, but for the compactions (``_tidy``)
    assert any(b < a for a, b in zip(top, top[1:], strict=False)), top
    ix.check_invariants()
    assert_same_matches(ix, oracle, [random_message(rng, f"m{i}") for i in range(120)])
    ix.rebuild()
    ix.check_invariants()
    assert_same_matches(ix, oracle, [random_message(rng, f"n{i}") for i in range(120)])


@pytest.mark.parametrize("cls", BOTH)
def test_a_build_leaves_room_for_the_next_updates(cls):
    # the first updates after a bulk load regrow neither the pool, nor the clause rows, nor the
    # list hash (each O(size)), nor compile the delete kernel (``ROOM_SHARE``, ``_build``)
    rng = random.Random(11)
    subs = [random_subscription(rng, f"s{i}") for i in range(2000)]
    ix = cls.build(subs)
    assert qt.delete_clauses.signatures
    sizes = (ix.ei.shape[0], ix.ef.shape[0], ix.ki.shape[0], ix.ht.shape[0])
    oracle = BruteMatcher(subs)
    fresh = []
    for i in range(100):  # copies of random subscriptions under new ids, as ``bench compare``
        s = subs[rng.randrange(len(subs))]
        fresh.append(Subscription(f"{s.id}~u{i}", s.clauses, s.region))
        ix.subscribe(fresh[-1])
        oracle.subscribe(fresh[-1])
        if i == 9:  # (each insert moves the lists it fills, up to 2 * 70 slots a copy, here)
            assert (ix.ei.shape[0], ix.ef.shape[0], ix.ki.shape[0], ix.ht.shape[0]) == sizes
    assert (ix.ki.shape[0], ix.ht.shape[0]) == sizes[2:]
    ix.check_invariants()
    assert_same_matches(ix, oracle, [random_message(rng, f"m{i}") for i in range(100)])
    for s in fresh[::2]:
        ix.unsubscribe(s.id)
        oracle.unsubscribe(s.id)
    ix.check_invariants()
    assert_same_matches(ix, oracle, [random_message(rng, f"n{i}") for i in range(100)])


def test_hash_room_rehashes_every_key():
    meta = np.zeros(qt.N_META, np.int64)
    ht = np.full((8, 2), -1, np.int64)
    keys = [(c, t) for c in range(3) for t in (-1, 0, 5)]
    for lid, (c, t) in enumerate(keys):
        ht = qt._hash_put(ht, meta, c, t, lid)
    assert ht.shape[0] == 32  # doubled twice to stay at most half full
    ht = qt.hash_room(ht, meta, 0)
    assert ht.shape[0] == 32  # room enough: the same table
    ht = qt.hash_room(ht, meta, 40)
    assert ht.shape[0] == 128 and meta[qt.M_HUSED] == len(keys)
    assert [qt._hash_get(ht, c, t) for c, t in keys] == list(range(len(keys)))
    assert qt._hash_get(ht, 7, 0) == -1


def test_rqtree_keeps_one_quadtree_per_key_term():
    # Sect. 5.1.1: ranked-key lists first, then a Quadtree over each list
    subs = [_sub(f"a{i}", ["a"], i % 10, i // 10, i % 10 + 0.1, i // 10 + 0.1) for i in range(60)]
    subs += [_sub(f"b{i}", ["a", "b"], 5, 5, 5.1, 5.1) for i in range(3)]
    subs += [_sub("c", ["c"], 0, 0, 9, 9)]
    ix = RQTree.build(subs, cell_capacity=8)
    ix.check_invariants()
    s = ix.stats()
    assert s["trees"] == 3  # keys a, b, c
    v = ix.store.vocab
    ra, rb, rc = (int(ix.troot[v[t] + 1]) for t in "abc")
    assert ix.ci[ra, qt.C_CHILD] >= 0  # the list of "a" is partitioned in space
    assert ix.ci[rb, qt.C_CHILD] < 0 and ix.ci[rc, qt.C_CHILD] < 0
    msgs = _grid_messages(("a", "b", "c"), n=12)
    assert_same_matches(ix, BruteMatcher(subs), msgs)
    # IQ-Tree over the same: one tree, cells holding lists of several terms
    iq = IQTree.build(subs, cell_capacity=8)
    assert iq.stats()["trees"] == 1
    assert_same_matches(iq, BruteMatcher(subs), msgs)


OPTION_VALUES = [
    {"cell_capacity": 1},
    {"cell_capacity": 4},
    {"cell_capacity": 1000},
    {"max_depth": 0},
    {"max_depth": 2},
    {"max_depth": 40, "cell_capacity": 1},
    {"messages_per_update": 0},
    {"messages_per_update": 1e3},
    {"messages_per_update": 1e9, "cell_capacity": 2, "max_depth": 6},
]


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("options", OPTION_VALUES, ids=repr)
def test_every_option_value_is_exact_built_and_grown(cls, options):
    rng = random.Random(zlib.crc32(repr(options).encode()))
    subs = [random_subscription(rng, f"s{i}") for i in range(200)]
    msgs = [random_message(rng, f"m{i}") for i in range(80)]
    ix = cls.build(subs[:100], **options)
    ix.check_invariants()
    assert_same_matches(ix, BruteMatcher(subs[:100]), msgs)
    ix.subscribe_many(subs[100:])
    for s in subs[:30]:
        ix.unsubscribe(s.id)
    ix.check_invariants()
    assert_same_matches(ix, BruteMatcher(subs[30:]), msgs)


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cell_capacity", 0),
        ("cell_capacity", 2.5),
        ("cell_capacity", True),
        ("max_depth", -1),
        ("max_depth", 41),
        ("messages_per_update", -1.0),
        ("messages_per_update", "many"),
        ("messages_per_update", float("nan")),
        ("messages_per_update", float("inf")),
        ("fanout", 4),
    ],
)
def test_bad_options_are_refused_naming_the_field(cls, field, value):
    with pytest.raises(ValidationError) as err:
        cls(**{field: value})
    assert err.value.field == field


@pytest.mark.parametrize("cls", BOTH)
def test_subscribe_many_replaces_present_and_repeated_ids(cls):
    a = _sub("s", ["x"], 0, 0, 1, 1)
    ix = cls.build([a])
    b = _sub("s", ["y"], 0, 0, 1, 1)
    c = _sub("t", ["x"], 0, 0, 1, 1)
    d = _sub("t", ["z"], 0, 0, 1, 1)
    ix.subscribe_many([b, c, d])
    ix.check_invariants()
    msgs = [Message("m", ("x", "y", "z"), Point(0.5, 0.5)), Message("n", ("x",), Point(0.5, 0.5))]
    assert_same_matches(ix, BruteMatcher([b, d]), msgs)


@pytest.mark.parametrize("cls", BOTH)
def test_a_message_sample_sets_the_cell_shares_and_key_shares(cls):
    # Sect. 5.1.1: the cost model works "according to subscription and message workloads"
    sample = [Message(f"h{i}", ("a", "hot"), Point(8.0 + i / 100, 8.0)) for i in range(30)]
    sample += [Message("h", ("b",), Rect(0.0, 0.0, 2.0, 2.0))]  # a rectangle counts by its centre
    pts = [(0, 0), (10, 10), (2, 2)]
    subs = [_sub(f"k{i}", ["a"], x, y, x, y) for i, (x, y) in enumerate(pts)]
    ix = cls.build(subs, cell_capacity=2, max_depth=1, message_sample=sample)
    ix.check_invariants()
    root = 0 if cls is IQTree else int(ix.troot[ix.store.vocab["a"] + 1])
    ch = int(ix.ci[root, qt.C_CHILD])
    # 1 sample centre in the lower-left quadrant, 30 in the upper-right: (n_i + 1) / (31 + 4)
    assert ix.cf[ch : ch + 4, qt.C_W].tolist() == pytest.approx([2 / 35, 1 / 35, 1 / 35, 31 / 35])
    p_term = ix.wl[0]
    assert p_term[ix.store.vocab["a"] + 1] == pytest.approx(30.5 / 32)
    # a copy saves the verifications of the messages falling outside the quadrants it meets:
    # across the two lower quadrants (few messages) it avoids the many of the upper ones
    ix = cls.build(subs, cell_capacity=2, max_depth=1, message_sample=sample, messages_per_update=5)
    low, high = _sub("low", ["a"], 1, 1, 9, 2), _sub("high", ["a"], 1, 8, 9, 9)
    ix.subscribe_many([low, high])
    assert _copy_cells(ix, "low") == [[ch, ch + 1]]  # 5 * 30.5/32 * (1 - 3/35) > 1 copy
    assert _copy_cells(ix, "high") == [[root]]  # 5 * 30.5/32 * (1 - 32/35) < 1 copy
    ix.subscribe(_sub("new", ["a", "unseen"], 1, 8, 9, 9))  # keyed by a term no sample holds
    assert ix.wl[0][ix.store.vocab["unseen"] + 1] == pytest.approx(0.5 / 32)
    ix.check_invariants()
    subs += [low, high, _sub("new", ["a", "unseen"], 1, 8, 9, 9)]
    assert_same_matches(ix, BruteMatcher(subs), _grid_messages(("a", "unseen")))
    with pytest.raises(ValidationError) as err:
        cls(message_sample=[sample[0], "m"])
    assert err.value.field == "message_sample[1]"
