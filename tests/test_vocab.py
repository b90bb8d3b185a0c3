"""The compiled vocabulary table (``shard.aptree.vocab``) against a plain dict: any strings
(NUL bytes, lone surrogates, non-ASCII, the empty string), added in chunks, renumbered, and the
store's table kept in step with its dict through subscribes and keyword reorders."""

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
    chunks=st.lists(st.lists(TERMS, max_size=40), max_size=6),
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
        if ids and rng.random() < 0.5:
            new_id = rng.permutation(len(ids)).astype(np.int32)
            table.renumber(new_id)
            ids = {t: int(new_id[i]) for t, i in ids.items()}
        asked = queries + list(ids)[:20]
        assert table.lookup(asked).tolist() == [ids.get(t, -1) for t in asked]
    assert len(table) == len(ids)


def test_a_term_holding_the_separator_is_still_found():
    table = VocabTable()
    table.add(["a\x00b", "a", "b", ""], [0, 1, 2, 3])
    assert table.lookup(["a", "a\x00b", "b", "", "x\x00"]).tolist() == [1, 0, 2, 3, -1]
    assert table.lookup(["b", "a", "", "zz"]).tolist() == [2, 1, 3, -1]
    assert table.lookup([]).tolist() == []


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
        if n % 2:
            store.reorder_terms(order)
        terms = list(store.vocab) + ["not-a-term\x00", "zz-unknown"]
        want = [store.vocab.get(t, -1) for t in terms]
        assert store.vocab_table().lookup(terms).tolist() == want
