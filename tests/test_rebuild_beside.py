"""Whole rebuilds run beside the live tree (``shard.aptree.beside``): the tree taken afterwards
answers exactly as one rebuilt in place, whatever changed while the copy was being rebuilt."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np
from hypothesis import settings
from hypothesis.stateful import initialize, rule

from shard.applus import APPlusTree, recentre
from shard.aptree import beside as beside_module
from shard.aptree.build import build_subtree, refresh_leaf_entries
from shard.aptree.store import _sort_clause_terms
from shard.brute import subscription_matches
from shard.model import ADD, Message, Point, Rect, Subscription
from shard.state import ShardState
from tests.test_applus import PlusVersusOracle
from tests.workloads import (
    apply_op,
    as_moving,
    canonical,
    random_message,
    random_ops,
    random_subscription,
)


class PlusBesideVersusOracle(PlusVersusOracle):
    """The AP+-Tree against the oracle (``test_applus``) with whole rebuilds run beside it:
    one falls due at any step, is started and taken at later steps (or waited for), with
    subscribes, replacements, moves, removals, publishes and expiries in between."""

    @initialize(
        theta_p=st.sampled_from([2, 4, 40]),
        fanout=st.sampled_from([4, 9, 200]),
        dup_limit=st.sampled_from([1, 3, 64]),
        keyword_fanout=st.sampled_from([0, 4]),
        keyword_order=st.sampled_from(["rare-first", "frequency"]),
    )
    def setup(self, theta_p, fanout, dup_limit, keyword_fanout, keyword_order):
        super().setup(theta_p, fanout, dup_limit, keyword_fanout, keyword_order)
        self.tree.rebuild_beside = True

    @rule()
    def whole_rebuild_due(self):
        """As when the tree has grown past a threshold (``_whole_rebuild_due``)."""
        self.tree._rebuild_whole()

    @rule(wait=st.booleans())
    def poll(self, wait):
        self.tree.poll_rebuild(wait=wait)


TestPlusBesideVersusOracle = PlusBesideVersusOracle.TestCase
TestPlusBesideVersusOracle.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None
)


def test_a_growing_tree_rebuilds_beside_and_answers_like_one_rebuilt_in_place():
    """Two AP+-Trees take the same 5,000 subscribes (in batches, some replacing), moves,
    removals and publishes; one rebuilds whole in place, the other beside itself, taken only
    some rounds later. Every call's updates are the same, both match like the oracle, and the
    beside one took its rebuilds with changes to replay."""
    rng = random.Random(5)
    subs = [as_moving(random_subscription(rng, f"s{i}"), rng.random() < 0.3) for i in range(5_000)]
    here = APPlusTree(theta_p=8)
    there = APPlusTree(theta_p=8)
    there.rebuild_beside = True
    current = {}
    taken = replayed = 0
    now = 0.0
    n_msg = 0
    for k in range(0, len(subs), 50):
        now += 0.5
        batch = subs[k : k + 50]
        if k and rng.random() < 0.3:  # replace a few present ones
            batch = batch + [
                as_moving(random_subscription(rng, sid), current[sid].moving)
                for sid in rng.sample(sorted(current), 3)
            ]
        assert canonical(here.subscribe_many(batch, now)) == canonical(
            there.subscribe_many(batch, now)
        )
        current.update((s.id, s) for s in batch)
        movers = [sid for sid, s in current.items() if s.moving]
        moves = [(rng.choice(movers), Point(rng.uniform(-20, 20), rng.uniform(-20, 20)))]
        assert canonical(here.move_batch(moves, now)) == canonical(there.move_batch(moves, now))
        for sid, p in moves:
            was = current[sid]
            current[sid] = Subscription(sid, was.clauses, recentre(was.region, p), moving=True)
        gone = rng.choice(sorted(current))
        here.unsubscribe(gone)
        there.unsubscribe(gone)
        del current[gone]
        msgs = []
        for _ in range(4):
            m = random_message(rng, f"m{n_msg}")
            msgs.append(Message(m.id, m.terms, m.location, ttl=rng.choice([None, 1.0, 30.0])))
            n_msg += 1
        assert canonical(here.publish_batch(msgs, now)) == canonical(there.publish_batch(msgs, now))
        if k % 150 == 0:  # between rounds, now and then (a job started waits for the next)
            job = there._beside
            if job is not None:
                job.wait()
                replayed += len(job.touched)
            taken += there.poll_rebuild()
    taken += there.poll_rebuild(wait=True)
    assert taken >= 2 and replayed > 0, (taken, replayed)
    for tree in (here, there):
        tree.check_invariants()
    for j in range(60):
        m = random_message(rng, f"q{j}")
        want = {s.id for s in current.values() if subscription_matches(s, m)}
        assert set(here.match(m)) == want
        assert set(there.match(m)) == want
    # every live message leaves the results holding it: the same results on both
    gone_here, gone_there = here.advance(now + 100.0), there.advance(now + 100.0)
    assert gone_here and canonical(gone_here) == canonical(gone_there)


def test_a_shard_rebuilding_beside_keeps_tags_and_conditions_of_what_changed_meanwhile():
    """Two shard states (NOT, polygons, predicates, ranked subscriptions, tags) take the same
    rounds; one rebuilds beside itself, polled between rounds. Tags and conditions of
    subscriptions made or replaced while the copy was rebuilt survive the swap: every round's
    updates and every publish's tags are the same."""
    rng = random.Random(21)
    subs = [
        as_moving(random_subscription(rng, f"s{i}", extras=0.3), rng.random() < 0.5)
        for i in range(2_400)
    ]
    here, there = ShardState(0), ShardState(0)
    there.rebuild_beside()
    taken = 0
    now = 0.0
    for k in range(0, len(subs), 100):
        now += 1.0
        batch = subs[k : k + 100]
        tags = [rng.randrange(1_000_000) for _ in batch]
        assert canonical(here.subscribe_batch(batch, now, tags)) == canonical(
            there.subscribe_batch(batch, now, tags)
        )
        movers = [s.id for s in subs[: k + 100] if s.moving]
        for op in random_ops(rng, movers, 6, now, k, extras=0.3):
            assert canonical(apply_op(here, op)) == canonical(apply_op(there, op))
            now = op[2]
        msgs = [random_message(rng, f"p{k}_{j}", attributes=True) for j in range(20)]
        a, b = here.publish_tagged(msgs, now), there.publish_tagged(msgs, now)
        assert canonical(a[0]) == canonical(b[0])
        assert a[2].tolist() == b[2].tolist()  # subscriptions reached, message by message
        bounds = np.concatenate(([0], np.cumsum(a[2])))
        for i in range(len(msgs)):  # their tags, as sets per message
            lo, hi = bounds[i], bounds[i + 1]
            assert sorted(a[1][lo:hi].tolist()) == sorted(b[1][lo:hi].tolist())
        taken += there.poll_rebuild()
    taken += there.poll_rebuild(wait=True)
    assert taken >= 1
    here.check_invariants()
    there.check_invariants()


def test_messages_keep_terms_first_seen_or_dropped_while_the_copy_was_rebuilt():
    """A live message holds a term the copy did not rank: one first seen after the copy
    ("zz"), one no subscription held when copied ("yy", which the live store still knew).
    After the swap each still has its term: a subscription made then gets the message."""
    rng = random.Random(4)
    subs = [random_subscription(rng, f"s{i}") for i in range(200)]
    area = Rect(100.0, 40.0, 101.0, 41.0)
    tree = APPlusTree.build(subs + [Subscription("y", (("yy",),), area)])
    tree.unsubscribe("y")
    tree.rebuild_beside = True
    tree._rebuild_whole()
    tree.poll_rebuild()  # the copy is taken: "yy" has no subscription, "zz" is unknown
    assert tree.subscribe(Subscription("z", (("zz",),), area), 1.0) == []
    at = Point(100.5, 40.5)
    ups = tree.publish_batch(
        [Message("mz", ("zz",), at, ttl=60.0), Message("my", ("yy",), at, ttl=60.0)], 1.0
    )
    assert ups == [("z", ADD, "mz")]
    assert tree.poll_rebuild(wait=True) is True
    assert tree.subscribe(Subscription("z2", (("zz",),), area), 2.0) == [("z2", ADD, "mz")]
    assert tree.subscribe(Subscription("y2", (("yy",),), area), 2.0) == [("y2", ADD, "my")]
    tree.check_invariants()


def test_a_failed_rebuild_beside_falls_back_to_one_in_place(monkeypatch):
    """A rebuild that fails on its thread is not taken: the tree rebuilds in place instead,
    with what changed meanwhile, and stays exact."""
    rng = random.Random(3)
    subs = [random_subscription(rng, f"s{i}") for i in range(300)]
    tree = APPlusTree.build(subs)
    tree.rebuild_beside = True

    def failing(self):
        self.error = MemoryError("no memory left")

    monkeypatch.setattr(beside_module.RebuildBeside, "run", failing)
    tree._rebuild_whole()
    assert tree.poll_rebuild() is False  # started
    more = [random_subscription(rng, f"t{i}") for i in range(20)]
    tree.subscribe_many(more, 1.0)
    assert tree.poll_rebuild(wait=True) is True
    assert tree._beside is None and tree._built_size == 320  # in place, with the 20
    for j in range(40):
        m = random_message(rng, f"m{j}")
        assert set(tree.match(m)) == {s.id for s in subs + more if subscription_matches(s, m)}
    tree.check_invariants()


def test_the_kernels_a_rebuild_beside_runs_release_the_gil():
    """The rebuild's compiled parts are ``nogil``: while one runs on its thread, the rounds go
    on on theirs (with the GIL held, they would wait for the whole build)."""
    for kernel in (build_subtree, refresh_leaf_entries, _sort_clause_terms):
        assert kernel.targetoptions.get("nogil") is True, kernel
