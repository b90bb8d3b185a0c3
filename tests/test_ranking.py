"""Threshold-ranked subscriptions (paper 004, Sect. 6; ``shard.ranking``): the score, the
prefix the indexes file a subscription under (a message that scores enough always holds one of
its terms, and lies in its rectangle when text alone cannot reach the threshold), and the
validation of the workload form."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from shard.errors import ValidationError
from shard.model import Point, Rect, Subscription, subscription_from_dict, subscription_to_dict
from shard.ranking import core_clauses, idf_weight, score
from shard.state import ShardState

TERMS = ("a", "b", "c", "d", "e")


@given(
    weights=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=5),
    alpha=st.floats(0.0, 0.99),
    frac=st.floats(0.0001, 1.0),
    present=st.sets(st.sampled_from(TERMS)),
    inside=st.booleans(),
)
def test_a_message_that_scores_enough_holds_a_prefix_term(weights, alpha, frac, present, inside):
    terms = TERMS[: len(weights)]
    theta = alpha + (1 - alpha) * frac
    clauses, anywhere = core_clauses(terms, weights, alpha, theta)
    loc = (1.0, 1.0, 1.0, 1.0) if inside else (5.0, 5.0, 5.0, 5.0)
    psi = score((0, 0, 2, 2), terms, weights, alpha, present, loc, True)
    if psi >= theta:
        assert any(c[0] in present for c in clauses), (clauses, present, psi)
        assert inside or anywhere
    assert all(len(c) == 1 and c[0] in terms for c in clauses) and clauses


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
        ({"threshold": 0.4}, "threshold", "must be above alpha=0.5"),
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
