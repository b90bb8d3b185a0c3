"""The compiled vocabulary table (``shard.aptree.vocab``) against a plain dict: any strings
(NUL bytes, lone surrogates, non-ASCII, the empty string), added in chunks, renumbered, dropped
and revived, and the store's table kept in step with its dict through subscribes, removals and
keyword reorders (which drop the terms no subscription holds)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shard.aptree.store import SubscriptionStore
from shard.aptree.vocab import VocabTable
from shard.model import Rect, Subscription

TERMS = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
"""Any code points, surrogates and NUL included."""


@settings(max_examples=80, deadline=None)
@given(
    chunks=st.lists(
        st.lists(TERMS | st.sampled_from(["a", "b", "c", "d"]), max_size=40), max_size=6
    ),
    queries=st.lists(TERMS, max_size=60),
    seed=st.integers(0, 2**32 - 1),
)
def test_lookups_equal_a_dict_through_adds_and_renumbering(chunks, queries, seed):
    rng = np.random.default_rng(seed)
    table = VocabTable()
    ids: dict[str, int] = {}
    for chunk in chunks:
        new = [t for t in dict.fromkeys(chunk) if t not in ids]
        base = len(ids)
        table.add(new, range(base, base + len(new)))
        ids.update((t, base + i) for i, t in enumerate(new))
        if ids and rng.random() < 0.5:  # renumber, dropping some terms (id -1)
            kept = rng.random(len(ids)) < 0.7
            new_id = np.full(len(ids), -1, np.int32)
            new_id[kept] = rng.permutation(int(kept.sum()))
            table.renumber(new_id)
            ids = {t: int(new_id[i]) for t, i in ids.items() if new_id[i] >= 0}
        asked = queries + list(ids)[:20]
        assert table.lookup(asked).tolist() == [ids.get(t, -1) for t in asked]
    assert len(table) >= len(ids)  # (dropped keys stay, as unknown, until revived)


def test_a_term_holding_the_separator_is_still_found():
    table = VocabTable()
    table.add(["a\x00b", "a", "b", ""], [0, 1, 2, 3])
    assert table.lookup(["a", "a\x00b", "b", "", "x\x00"]).tolist() == [1, 0, 2, 3, -1]
    assert table.lookup(["b", "a", "", "zz"]).tolist() == [2, 1, 3, -1]
    assert table.lookup([]).tolist() == []
    # a message batch's lists (``lookup_lists``: one joined buffer, split in compiled code)
    lists = [["a", "a\x00b"], [], ["", "x\x00"], ["b"]]
    assert table.lookup_lists(lists, 5).tolist() == [1, 0, 3, -1, 2]
    assert table.lookup_lists([["b", "zz"], ["", "a"]], 4).tolist() == [2, -1, 3, 1]
    assert table.lookup_lists([["\x00"]], 1).tolist() == [-1]


def test_growth_past_many_table_sizes_keeps_every_key():
    table = VocabTable()
    words = [f"w{i}é" for i in range(20_000)]
    for i in range(0, len(words), 3_000):
        table.add(words[i : i + 3_000], range(i, min(i + 3_000, len(words))))
    assert table.lookup(words).tolist() == list(range(len(words)))
    copy = table.copy()
    table.renumber(np.arange(len(words), dtype=np.int32)[::-1].copy())
    assert copy.lookup(words[:3]).tolist() == [0, 1, 2]
    assert table.lookup(words[:3]).tolist() == [19_999, 19_998, 19_997]


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.lists(st.sampled_from("abcdefgh") | TERMS, min_size=1, max_size=3), max_size=8),
        max_size=5,
    ),
    order=st.sampled_from(["frequency", "rare-first", "alphabetical"]),
)
def test_the_stores_table_follows_its_dict(batches, order):
    store = SubscriptionStore()
    n = 0
    for batch in batches:
        for clause in batch:
            store.add(Subscription(f"s{n}", (tuple(clause),), Rect(0, 0, 1, 1)))
            n += 1
        if n % 3 == 1 and len(store):
            store.remove(next(iter(store.slot_of)))
        if n % 2:
            store.reorder_terms(order)
            held = set(t for s in store.slot_of for t in _terms_of(store, s))
            assert set(store.vocab) == held  # the vocabulary follows the subscriptions down
        terms = list(store.vocab) + ["not-a-term\x00", "zz-unknown"]
        want = [store.vocab.get(t, -1) for t in terms]
        assert store.vocab_table().lookup(terms).tolist() == want


def _terms_of(store: SubscriptionStore, sub_id: str) -> set[str]:
    slot = store.slot(sub_id)
    out = set()
    for c in store.clauses_of(slot).tolist():
        a = int(store.cl_off[c])
        out.update(store.vocab_terms[t] for t in store.terms[a : a + int(store.cl_len[c])].tolist())
    return out


def test_after_a_rare_first_renumbering_a_new_term_ranks_before_every_older_one():
    """A term first seen after a "rare-first" renumbering has one holder: it takes a reserved id
    below every ranked term, so a clause of an old common term and a new one is filed under the
    new one (docs/APTREE.md, departure 13); once the reserve is used up new terms go last."""
    store = SubscriptionStore()
    for i in range(4):
        store.add(Subscription(f"s{i}", (("common", f"r{i}"),), Rect(0, 0, 1, 1)))
    store.reorder_terms("rare-first")
    ranked = dict(store.vocab)
    assert sorted(ranked.values()) == list(range(5, 10))  # 5 ranked, ids 0-4 reserved
    assert ranked["common"] == 9
    _, clauses = store.add(Subscription("n", (("common", "fresh"),), Rect(0, 0, 1, 1)))
    assert store.vocab["fresh"] == 4
    assert int(store.terms[int(store.cl_off[int(clauses[0])])]) == 4  # its first term
    for j in range(5):
        store.add(Subscription(f"m{j}", ((f"x{j}",),), Rect(0, 0, 1, 1)))
    assert [store.vocab[f"x{j}"] for j in range(5)] == [3, 2, 1, 0, 10]
    words = list(store.vocab) + ["absent"]
    assert store.vocab_table().lookup(words).tolist() == [store.vocab.get(w, -1) for w in words]
    assert _terms_of(store, "n") == {"common", "fresh"}
    store.reorder_terms("frequency")  # no reserve in the other orders
    assert sorted(store.vocab.values()) == list(range(len(store.vocab)))
    assert None not in store.vocab_terms


def test_after_churn_a_renumbering_makes_the_table_anew_with_the_live_terms_only():
    """5,900 of 6,000 single-term subscriptions leave (plus terms only a message holds, kept):
    the renumbering drops the dead terms, its table is made anew rather than updated, and it
    finds exactly the live and kept terms under their new ids (an explicit order's term that no
    one holds is not ranked), then terms added after it."""
    for order in ("rare-first", "frequency", "alphabetical", ["k5999", "k3"]):
        store = SubscriptionStore()
        for i in range(6_000):
            store.add(Subscription(f"s{i}", ((f"k{i}", f"c{i % 3}"),), Rect(0, 0, 1, 1)))
        store.vocab_table()  # (the table knew some of the terms before: half of them)
        for i in range(3_000, 6_000):
            store.term_id(f"late{i}")  # (terms the table has not been told of)
        for i in range(100, 6_000):
            store.remove(f"s{i}")
        keep = np.zeros(len(store.vocab_terms), np.bool_)
        keep[store.vocab["late3000"]] = True  # a term a live message holds
        new_id = store.reorder_terms(order, keep)
        live = [f"k{i}" for i in range(100)] + ["c0", "c1", "c2", "late3000"]
        assert sorted(t for t in store.vocab_terms if t is not None) == sorted(live)
        assert (new_id >= 0).sum() == len(live)
        for i in range(1_000, 6_000, 1_000):  # dropped, then seen again after the renumbering
            store.term_id(f"k{i}")
        ids = store.vocab_table().lookup(live + ["k100", "k5999", "k1000", "late3001"])
        want = [store.vocab[t] for t in live] + [-1, -1, store.vocab["k1000"], -1]
        assert ids.tolist() == want, order
