"""Differential tests of every rival index (``shard.indexes.RIVAL_NAMES``) against the brute-force
oracle: bulk builds on Hypothesis-drawn workloads (AND and DNF, rectangles and circles, point and
rectangle messages, lattice and boundary coordinates), and a state machine interleaving
subscribe, re-subscribe, unsubscribe, match and rebuild with ``check_invariants()`` after each
step. Each rival is run with its defaults and with ``small_options`` (small nodes, so that a few
hundred subscriptions make a deep structure)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from shard.brute import BruteMatcher
from shard.indexes import RIVAL_NAMES, index_class, make_index
from shard.model import Message, Rect
from tests.workloads import assert_same_matches, random_message, random_subscription

VARIANTS = [(name, small) for name in RIVAL_NAMES for small in (False, True)]


def _options(name: str, small: bool) -> dict:
    return dict(getattr(index_class(name), "small_options", {})) if small else {}


@pytest.mark.parametrize(("name", "small"), VARIANTS)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_subs=st.integers(0, 300))
def test_bulk_built_index_matches_oracle(name, small, seed, n_subs):
    rng = random.Random(seed)
    subs = [random_subscription(rng, f"s{i}") for i in range(n_subs)]
    msgs = [random_message(rng, f"m{i}") for i in range(60)]
    index = make_index(name, subs, **_options(name, small))
    index.check_invariants()
    assert len(index) == len(BruteMatcher(subs))
    assert_same_matches(index, BruteMatcher(subs), msgs)


@pytest.mark.parametrize("name", RIVAL_NAMES)
def test_long_messages_repeated_ids_and_an_empty_index(name):
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(400)]
    subs = [random_subscription(rng, f"s{i}", vocab) for i in range(500)]
    subs += [random_subscription(rng, "s3", vocab)]  # a repeated id: the last one counts
    long = [
        Message(f"L{i}", tuple(rng.sample(vocab, rng.randint(100, 400))), m.location)
        for i, m in enumerate(random_message(rng, f"x{i}", vocab) for i in range(30))
    ]
    index = make_index(name, subs)
    assert_same_matches(index, BruteMatcher(subs), long)
    empty = make_index(name, [])
    assert empty.match_batch([Message("m", ("a",), Rect(-180, -90, 180, 90))]) == [[]]
    assert empty.match_batch([]) == []


def _machine(name: str, small: bool):
    class RivalVersusOracle(RuleBasedStateMachine):
        subs = Bundle("subs")

        def __init__(self) -> None:
            super().__init__()
            self.index = index_class(name)(**_options(name, small))
            self.oracle = BruteMatcher()
            self.next_id = 0

        @rule(target=subs, seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
        def subscribe_many(self, seed, n):
            rng = random.Random(seed)
            last = None
            for _ in range(n):
                sub = random_subscription(rng, f"s{self.next_id}")
                self.next_id += 1
                self.index.subscribe(sub)
                self.oracle.subscribe(sub)
                last = sub.id
            return last

        @rule(sid=subs, seed=st.integers(0, 2**32 - 1))
        def resubscribe(self, sid, seed):
            if sid in self.oracle:
                sub = random_subscription(random.Random(seed), sid)
                self.index.subscribe(sub)
                self.oracle.subscribe(sub)

        @rule(sid=consumes(subs))
        def unsubscribe(self, sid):
            if sid in self.oracle:
                self.index.unsubscribe(sid)
                self.oracle.unsubscribe(sid)

        @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(0, 400))
        def unsubscribe_many(self, seed, k):
            rng = random.Random(seed)
            live = sorted(s for s in (f"s{i}" for i in range(self.next_id)) if s in self.oracle)
            for sid in rng.sample(live, min(k, len(live))):
                self.index.unsubscribe(sid)
                self.oracle.unsubscribe(sid)

        @rule(seed=st.integers(0, 2**32 - 1))
        def match(self, seed):
            rng = random.Random(seed)
            msgs = [random_message(rng, f"m{i}") for i in range(20)]
            assert_same_matches(self.index, self.oracle, msgs)

        @rule()
        def rebuild(self):
            self.index.rebuild()

        @invariant()
        def structure_holds(self):
            self.index.check_invariants()
            assert len(self.index) == len(self.oracle)

    RivalVersusOracle.__name__ = f"{name}{'_small' if small else ''}VersusOracle"
    return RivalVersusOracle


for _name, _small in VARIANTS:
    _case = _machine(_name, _small).TestCase
    _case.settings = settings(max_examples=12, stateful_step_count=30, deadline=None)
    _key = _name.replace("+", "plus") + ("_small" if _small else "")
    globals()[f"Test_{_key}_versus_oracle"] = _case
