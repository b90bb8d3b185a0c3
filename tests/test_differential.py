"""Differential tests: the AP-Tree against the brute-force oracle, on Hypothesis-drawn workloads
(AND and DNF, rects and circles, points and rect messages, lattice/boundary coordinates) and in a
state machine interleaving subscribe, unsubscribe and match with ``check_invariants()`` after each step."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from shard.aptree import APTree
from shard.brute import BruteMatcher
from tests.workloads import assert_same_matches, random_message, random_subscription

tree_options = st.fixed_dictionaries(
    {
        "theta_p": st.integers(1, 12),
        "fanout": st.integers(4, 30),
        "keyword_partition": st.sampled_from(["heuristic", "optimal"]),
        "max_span": st.sampled_from([1, 2, 4, 16, 1000]),
        "keyword_fanout": st.sampled_from([0, 2, 5, 30]),
        "keyword_order": st.sampled_from(["rare-first", "frequency"]),
    }
)


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), n_subs=st.integers(0, 400), options=tree_options)
def test_bulk_built_tree_matches_oracle(seed, n_subs, options):
    rng = random.Random(seed)
    subs = [random_subscription(rng, f"s{i}") for i in range(n_subs)]
    msgs = [random_message(rng, f"m{i}") for i in range(60)]
    tree = APTree.build(subs, **options)
    tree.check_invariants()
    assert_same_matches(tree, BruteMatcher(subs), msgs)


class TreeVersusOracle(RuleBasedStateMachine):
    """Random interleavings of subscribe / re-subscribe / unsubscribe / match / rebuild."""

    subs = Bundle("subs")
    options: dict = {"fanout": 6, "keyword_fanout": 6, "keyword_order": "frequency"}
    """The paper's bounded k-nodes: cuts are keyword intervals that inserts widen."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)
        self.tree = APTree(theta_p=3, **self.options)
        self.oracle = BruteMatcher()
        self.next_id = 0

    @rule(target=subs, seed=st.integers(0, 2**32 - 1))
    def subscribe(self, seed):
        sub = random_subscription(random.Random(seed), f"s{self.next_id}")
        self.next_id += 1
        self.tree.subscribe(sub)
        self.oracle.subscribe(sub)
        return sub.id

    @rule(target=subs, seed=st.integers(0, 2**32 - 1), n=st.integers(5, 60))
    def subscribe_many(self, seed, n):
        rng = random.Random(seed)
        last = None
        for _ in range(n):
            sub = random_subscription(rng, f"s{self.next_id}")
            self.next_id += 1
            self.tree.subscribe(sub)
            self.oracle.subscribe(sub)
            last = sub.id
        return last

    @rule(sid=subs, seed=st.integers(0, 2**32 - 1))
    def resubscribe(self, sid, seed):
        if sid not in self.oracle:
            return
        sub = random_subscription(random.Random(seed), sid)
        self.tree.subscribe(sub)
        self.oracle.subscribe(sub)

    @rule(sid=consumes(subs))
    def unsubscribe(self, sid):
        if sid in self.oracle:
            self.tree.unsubscribe(sid)
            self.oracle.unsubscribe(sid)

    @rule(seed=st.integers(0, 2**32 - 1))
    def match(self, seed):
        rng = random.Random(seed)
        assert_same_matches(
            self.tree, self.oracle, [random_message(rng, f"m{i}") for i in range(20)]
        )

    @rule()
    def rebuild(self):
        self.tree.rebuild()

    @invariant()
    def structure_holds(self):
        self.tree.check_invariants()
        assert len(self.tree) == len(self.oracle)


TestTreeVersusOracle = TreeVersusOracle.TestCase
TestTreeVersusOracle.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)


class DefaultTreeVersusOracle(TreeVersusOracle):
    """The same with the defaults: one cut per keyword, rare-first keyword order."""

    options: dict = {"fanout": 6}


TestDefaultTreeVersusOracle = DefaultTreeVersusOracle.TestCase
TestDefaultTreeVersusOracle.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None
)


def test_seeded_stress_dynamic():
    """A longer seeded loop: 3,000 mixed operations on one tree, compared every 250 steps."""
    rng = random.Random(2024)
    tree = APTree(theta_p=5, fanout=12)
    oracle = BruteMatcher()
    live: list[str] = []
    for step in range(3000):
        if live and rng.random() < 0.35:
            sid = live.pop(rng.randrange(len(live)))
            tree.unsubscribe(sid)
            oracle.unsubscribe(sid)
        else:
            sub = random_subscription(rng, f"s{step}")
            tree.subscribe(sub)
            oracle.subscribe(sub)
            live.append(sub.id)
        if step % 250 == 0:
            tree.check_invariants()
            assert_same_matches(tree, oracle, [random_message(rng, f"m{i}") for i in range(40)])
    tree.check_invariants()
    assert_same_matches(tree, oracle, [random_message(rng, f"m{i}") for i in range(200)])
