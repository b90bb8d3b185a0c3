"""Partition algorithms and cost model: Alg. 2 is optimal (against exhaustive search), Alg. 3 is
valid and never better than Alg. 2, the spatial heuristic gives valid grids, Eq. 1 is computed right."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shard.aptree.partition import (
    axis_partition,
    cell_of,
    cell_range,
    grid_cost,
    keyword_partition_heuristic,
    keyword_partition_optimal,
)


def prefix(values):
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))


def cost_of(starts, w, p):
    n = len(w)
    bounds = list(starts) + [n]
    return sum(sum(w[a:b]) * sum(p[a:b]) for a, b in itertools.pairwise(bounds))


def exhaustive(w, p, f):
    n = len(w)
    best = np.inf
    for k in range(1, min(f, n) + 1):
        for cut in itertools.combinations(range(1, n), k - 1):
            best = min(best, cost_of([0, *cut], w, p))
    return best


weights = st.lists(st.integers(1, 50), min_size=1, max_size=9)


@settings(max_examples=80)
@given(w=weights, data=st.data(), f=st.integers(1, 5))
def test_keyword_partitions(w, data, f):
    p = data.draw(st.lists(st.floats(0.001, 1.0), min_size=len(w), max_size=len(w)))
    W, P = prefix(w), prefix(p)
    s_opt, c_opt = keyword_partition_optimal(W, P, f, False)
    s_heu, c_heu = keyword_partition_heuristic(W, P, f, False)
    for starts, cost in ((s_opt, c_opt), (s_heu, c_heu)):
        assert starts[0] == 0 and len(starts) <= f and np.all(np.diff(starts) > 0)
        assert abs(cost - cost_of(starts.tolist(), w, p)) < 1e-6
    assert abs(c_opt - exhaustive(w, p, f)) < 1e-6
    assert c_heu >= c_opt - 1e-9


def test_heuristic_balances_equal_probability_weights():
    # with p proportional to w (Sect. 3.3.2 special case) equal-weight cuts are optimal
    w = [10] * 40
    W, P = prefix(w), prefix([x / 400 for x in w])
    starts, cost = keyword_partition_heuristic(W, P, 4, False)
    assert starts.tolist() == [0, 10, 20, 30]
    assert abs(cost - 4 * 100 * 0.25) < 1e-9


def test_absolute_probabilities_are_capped_at_one():
    W, P = prefix([5, 5]), prefix([0.9, 0.9])
    starts, cost = keyword_partition_heuristic(W, P, 1, True)
    assert starts.tolist() == [0] and cost == 10.0


@settings(max_examples=60)
@given(
    boxes=st.lists(st.tuples(st.floats(-10, 10), st.floats(0, 5)), min_size=1, max_size=60),
    k=st.integers(2, 8),
)
def test_axis_partition_is_valid(boxes, k):
    lo = np.array([max(-10.0, a) for a, _ in boxes])
    hi = np.array([min(10.0, a + b) for a, b in boxes])
    b = axis_partition(lo, hi, -10.0, 10.0, k, np.empty(0))
    assert b[0] == -10.0 and b[-1] == 10.0
    assert np.all(np.diff(b) > 0) and len(b) <= k + 1


@settings(max_examples=100)
@given(
    bounds=st.lists(st.floats(-50, 50), min_size=1, max_size=8, unique=True),
    a=st.floats(-60, 60),
    width=st.floats(0, 30),
)
def test_cell_lookup_matches_naive(bounds, a, width):
    bnd = np.array([-60.0, *sorted(bounds), 60.0])
    n = len(bnd) - 1
    b = min(60.0, a + width)
    first, last = cell_range(bnd, 0, n, a, b)
    assert list(range(first, last + 1)) == [i for i in range(n) if bnd[i] <= b and bnd[i + 1] >= a]
    i = cell_of(bnd, 0, n, a)
    assert bnd[i] <= a <= bnd[i + 1]


def test_grid_cost_is_eq1():
    bx = np.array([0.0, 1.0, 4.0])
    by = np.array([0.0, 2.0])
    minx, maxx = np.array([0.2, 0.5, 2.0]), np.array([0.4, 2.0, 3.0])
    miny, maxy = np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0])
    cost, counts = grid_cost(
        minx, miny, maxx, maxy, bx, by, np.array([0.0, 0.0, 4.0, 2.0]), np.empty(0), np.empty(0)
    )
    assert counts.tolist() == [[2], [2]]
    assert abs(cost - (2 * 0.25 + 2 * 0.75)) < 1e-12
