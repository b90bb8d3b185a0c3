"""Threshold-ranked subscriptions (paper 004, Sect. 6; ``shard.ranking``): the score, the
prefix the indexes file a subscription under (a message that scores enough always holds one of
its terms, and lies in its rectangle when text alone cannot reach the threshold), and the
validation of the workload form."""

from __future__ import annotations

import random
from collections import Counter

import hypothesis.strategies as st
import pytest
from hypothesis import given

from coordinator.ranking import TermCounts
from shard.errors import ValidationError
from shard.model import Point, Rect, Subscription, subscription_from_dict, subscription_to_dict
from shard.ranking import core_clauses, idf_weight, on_location, score
from shard.state import ShardState

TERMS = ("a", "b", "c", "d", "e")


LOCATIONS = {  # (box, is_point, whether it meets the region (0, 0, 2, 2))
    "point inside": ((1.0, 1.0, 1.0, 1.0), True, True),
    "point outside": ((5.0, 5.0, 5.0, 5.0), True, False),
    "rect across": ((1.0, 1.0, 3.0, 3.0), False, True),
    "rect apart": ((3.0, 3.0, 4.0, 4.0), False, False),
}


@given(
    weights=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=5),
    alpha=st.floats(0.0, 0.99),
    theta=st.floats(0.0001, 1.0),
    present=st.sets(st.sampled_from(TERMS)),
    where=st.sampled_from(sorted(LOCATIONS)),
)
def test_a_message_that_scores_enough_is_found_by_the_filing(weights, alpha, theta, present, where):
    """A match holds a clause the index files the subscription under, where it files it,
    unless the subscription matches on location alone (θ ≤ α) and the message meets its
    rectangle: the side index's candidates (``shard.side``)."""
    terms = TERMS[: len(weights)]
    clauses, anywhere = core_clauses(terms, weights, alpha, theta)
    loc, is_point, meets = LOCATIONS[where]
    psi = score((0, 0, 2, 2), terms, weights, alpha, present, loc, is_point)
    if psi >= theta and not (on_location(alpha, theta) and meets):
        assert any(set(c) <= present for c in clauses), (clauses, present, psi)
        assert meets or anywhere
    if not on_location(alpha, theta):
        assert all(len(c) == 1 and c[0] in terms for c in clauses) and clauses
    if on_location(alpha, theta) and meets and is_point:
        assert psi >= theta  # inside, with no term at all: alpha >= theta


def test_scores_of_points_rectangles_and_degenerate_regions():
    t, w = ("a", "b"), (1.0, 3.0)
    assert score((0, 0, 2, 2), t, w, 0.5, {"a", "b"}, (2, 2, 2, 2), True) == 1.0  # on the edge
    assert score((0, 0, 2, 2), t, w, 0.5, {"a"}, (3, 3, 3, 3), True) == 0.125
    assert score((0, 0, 2, 2), t, w, 0.0, set(), (0, 0, 1, 1), False) == 0.0
    assert score((0, 0, 2, 2), t, w, 1.0 - 1e-12, set(), (-5, -5, 5, 5), False) > 0.99
    assert score((0, 0, 2, 2), t, w, 0.5, set(), (0, 0, 1, 2), False) == 0.25  # half the area
    assert score((1, 1, 1, 1), t, w, 0.5, set(), (0, 0, 2, 2), False) == 0.5  # a point region


def test_idf_weights_are_positive_and_fall_with_frequency():
    assert idf_weight(1000, 0) > idf_weight(1000, 10) > idf_weight(1000, 999) >= 1.0


GOOD = {"id": "r", "keywords": ["iPad", "Sale"], "rect": [0, 0, 1, 1], "threshold": 0.7}


@pytest.mark.parametrize(
    ("changes", "field", "needle"),
    [
        ({"threshold": 0}, "threshold", "must be in (0, 1]"),
        ({"threshold": 1.5}, "threshold", "must be in (0, 1]"),
        ({"threshold": "high"}, "threshold", "must be a number"),
        ({"alpha": 1.0}, "alpha", "must be in [0, 1)"),
        ({"weights": {"ipad": 0}}, "weights.ipad", "must be > 0"),
        ({"weights": {"phone": 1}}, "weights.phone", "not one of the subscription's keywords"),
        ({"weights": [1, 2]}, "weights", "must be an object"),
        ({"rect": None, "circle": [0, 0, 10]}, "circle", "takes a rect"),
        ({"keywords": None, "expr": "a OR b"}, "expr", "takes keywords"),
    ],
)
def test_bad_ranked_subscriptions_name_the_field(changes, field, needle):
    d = {**GOOD, **changes}
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(ValidationError) as e:
        subscription_from_dict(d)
    assert e.value.field == field and needle in str(e.value)


def test_alpha_and_weights_need_a_threshold_and_the_form_round_trips():
    with pytest.raises(ValidationError, match="only a ranked subscription"):
        subscription_from_dict({"id": "x", "keywords": ["a"], "rect": [0, 0, 1, 1], "alpha": 0.2})
    s = subscription_from_dict({**GOOD, "alpha": 0.25, "weights": {"IPAD": 2.5}})
    assert (s.threshold, s.alpha, s.weights) == (0.7, 0.25, (2.5, 1.0))
    assert subscription_from_dict(subscription_to_dict(s)) == s


def test_a_ranked_subscription_filed_everywhere_counts_where_its_rectangle_is():
    """Filed for the whole world (its terms alone can reach θ), it is counted on a density map
    in the cell of its rectangle's centre, and after a move in the new one's."""
    s = ShardState(0)
    sub = Subscription("r", (("a", "b"),), Rect(10, 10, 12, 12), True, threshold=0.6, alpha=0.2)
    s.subscribe_batch([sub], 0.0)
    world = (-180, -90, 180, 90)
    assert s.tree.store.bbox[s.tree.store.slot_of["r"]].tolist() == list(world)
    grid = s.density(world, world, 36, 18).reshape(18, 36)
    assert [a.tolist() for a in grid.nonzero()] == [[10], [19]]
    s.move_batch([("r", Point(-55.0, 45.0))], 1.0)
    grid = s.density(world, world, 36, 18).reshape(18, 36)
    assert [a.tolist() for a in grid.nonzero()] == [[13], [12]]


@pytest.mark.parametrize("alpha", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("eps", [0.0, 2e-10, 5e-10, 1e-9, 2e-9])
def test_the_filing_is_never_empty_at_the_slack_and_a_shard_rebuilds(alpha, eps):
    """θ just above 1 − α (inside the prefix's slack) with θ ≤ α: the filing keeps a clause
    (found by a review: an empty one left a shard that could not be rebuilt)."""
    theta = 1.0 - alpha + eps
    clauses, _ = core_clauses(("x", "y"), (1.0, 1.0), alpha, theta)
    assert clauses and all(clauses)
    sub = Subscription("s", (("x", "y"),), Rect(0, 0, 1, 1), threshold=theta, alpha=alpha)
    st = ShardState(0)
    st.subscribe_batch([sub], 0.0)
    st.check_invariants()
    ShardState.restore(st.snapshot()).check_invariants()


@pytest.mark.parametrize("fold_after", [1, 7, TermCounts.FOLD_AFTER])
def test_term_counts_are_exact_whenever_read(fold_after, monkeypatch):
    """Counted in bulk (queued changes folded when read, or when ``FOLD_AFTER`` wait): the
    counts read are those of the subscriptions held, whatever came and went in between."""
    monkeypatch.setattr(TermCounts, "FOLD_AFTER", fold_after)
    rng = random.Random(fold_after)
    tc, held = TermCounts(), {}
    for step in range(3000):
        if held and rng.random() < 0.4:
            tc.remove(held.pop(rng.choice(sorted(held))))
        else:
            i = f"s{rng.randrange(400)}"
            if i in held:
                tc.remove(held.pop(i))
            terms = [f"t{rng.randrange(30)}" for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.3:  # a DNF: a term in two clauses counts once
                clauses = (tuple(sorted(set(terms))), tuple(sorted({terms[0], "t99"})))
            else:
                clauses = (tuple(sorted(set(terms))),)
            held[i] = Subscription(i, clauses, Rect(0, 0, 1, 1))
            tc.add(held[i])
        if step % 97 == 0:
            want = Counter(t for s in held.values() for t in {t for c in s.clauses for t in c})
            got = {t: n for t, n in tc.df.items() if n}
            assert got == dict(want) and tc.n == len(held), step
            assert [tc.count(t) for t in ("t0", "t7", "t99", "none")] == [
                want[t] for t in ("t0", "t7", "t99", "none")
            ], step
