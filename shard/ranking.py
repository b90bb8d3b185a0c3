"""Threshold-ranked subscriptions (paper 004, Sect. 6): a message reaches a ranked subscription
when its spatial-textual similarity reaches the subscription's threshold θ,

    ψ(s, m) = α·ψ_s(s, m) + (1 − α)·ψ_t(s, m) ≥ θ                              (Eq. 3)
    ψ_t(s, m) = Σ_{t ∈ s.T ∩ m.T} ω_s(t) / Σ_{t ∈ s.T} ω_s(t)
    ψ_s(s, m) = |s.R ∩ m.R| / |s.R|      (a rectangle message; areas in degrees²)
    ψ_s(s, m) = 1 if m ∈ s.R else 0       (a point message)

Definitions and choices (docs/LIMITS.md):

* **Point messages.** The paper's area ratio is 0 for a point. A point inside the region (its
  boundary included) scores ψ_s = 1, outside 0: the message lies wholly in the region, as a
  rectangle message inside it scores 1.
* **A degenerate region** (zero width or height: no area) scores 1 when the message meets it,
  else 0.
* **Weights.** ω_s(t) is given with the subscription (``weights``) or, where the cluster takes
  it (``coordinator``), the term's idf over the registered subscriptions when this one is
  subscribed, ``1 + ln((1 + N) / (1 + df(t)))``; without either, 1 each. A subscription keeps its
  weights while it lives (re-subscribing refreshes them), so its score of a message never
  changes under it and every shard scores it alike.
* **Where the index files one** (Sect. 6.2, Eq. 5). With θ > α every match holds a term of
  the subscription's *prefix*: its terms by descending weight, up to where the weight left is
  below (θ − α) / (1 − α) of the total. The indexes file it under those terms as one-term
  clauses (``core_clauses``), in its rectangle when text alone cannot reach θ (θ > 1 − α), else
  anywhere (the whole world): the index's own pruning is the bound, and every candidate is
  scored exactly (``score``).
* **θ ≤ α** (``on_location``): a message inside the region with none of the terms scores α and
  matches. Such a subscription is also filed by its rectangle alone (``shard.residual``: a
  spatial side index whose every message meeting the rectangle is a candidate); the terms then
  only find the matches outside it, which need ψ_t ≥ θ / (1 − α): the prefix for that bound,
  anywhere, when θ ≤ 1 − α, and none otherwise (the index files the clause of all its terms in
  its rectangle, whose matches the side index finds anyway).
* Regions are rectangles (``rect``); circles and polygons are refused for ranked
  subscriptions (their overlap areas are not defined here).

Everything that scores (the oracle, the shards' exact test) calls ``score``, so the floats are
the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from shard.attributes import validate_number
from shard.errors import ValidationError
from shard.terms import normalize_term

WORLD = (-180.0, -90.0, 180.0, 90.0)

PREFIX_SLACK = 1e-9
"""The prefix is cut where the weight left is below the bound by this share of the total, so
that rounding in a score can never pass a message the prefix dropped."""


def score(
    rect: Sequence[float],
    terms: Sequence[str],
    weights: Sequence[float],
    alpha: float,
    msg_terms: frozenset[str] | set[str],
    location: Sequence[float],
    is_point: bool,
) -> float:
    """ψ(s, m) of a ranked subscription (region ``rect``, sorted ``terms`` with their
    ``weights``, ``alpha``) and a message (its term set, its ``location`` (x0, y0, x1, y1),
    a point when ``is_point``). O(terms).

    >>> score((0, 0, 2, 2), ("a", "b"), (1.0, 3.0), 0.5, {"b"}, (1, 1, 1, 1), True)
    0.875
    >>> score((0, 0, 2, 2), ("a", "b"), (1.0, 1.0), 0.5, {"a"}, (1, 1, 3, 3), False)
    0.375
    """
    total = 0.0
    hit = 0.0
    for t, w in zip(terms, weights, strict=True):
        total += w
        if t in msg_terms:
            hit += w
    psi_t = hit / total
    x0, y0, x1, y1 = rect
    mx0, my0, mx1, my1 = location
    if mx1 < x0 or mx0 > x1 or my1 < y0 or my0 > y1:
        psi_s = 0.0
    elif is_point:
        psi_s = 1.0
    else:
        area = (x1 - x0) * (y1 - y0)
        if area <= 0.0:
            psi_s = 1.0
        else:
            w = min(x1, mx1) - max(x0, mx0)
            h = min(y1, my1) - max(y0, my0)
            psi_s = min(1.0, (w * h) / area)
    return alpha * psi_s + (1.0 - alpha) * psi_t


def _prefix(
    terms: Sequence[str], weights: Sequence[float], bound: float
) -> tuple[tuple[str, ...], ...]:
    """The one-term clauses of the terms by descending weight (ties by term), up to where the
    weight left is below ``bound`` (less the slack) of the total."""
    total = math.fsum(weights)
    bound -= PREFIX_SLACK
    order = sorted(zip(terms, weights, strict=True), key=lambda tw: (-tw[1], tw[0]))
    left = total
    prefix: list[str] = []
    for t, w in order:
        if left / total < bound:
            break
        prefix.append(t)
        left -= w
    return tuple(sorted((t,) for t in prefix))


def on_location(alpha: float, threshold: float) -> bool:
    """Whether a message with none of the terms can match (inside the region): θ ≤ α.

    >>> on_location(0.5, 0.5), on_location(0.5, 0.6)
    (True, False)
    """
    return threshold <= alpha


def core_clauses(
    terms: Sequence[str], weights: Sequence[float], alpha: float, threshold: float
) -> tuple[tuple[tuple[str, ...], ...], bool]:
    """(the clauses an index files the subscription under, whether they are filed anywhere
    rather than in its region): every match holds one of them, except, when ``on_location``,
    the matches meeting the region (module docstring).

    >>> core_clauses(("a", "b", "c"), (1.0, 5.0, 1.0), 0.2, 0.6)
    ((('b',),), True)
    >>> core_clauses(("a", "b"), (1.0, 1.0), 0.5, 0.9)
    ((('a',),), False)
    >>> core_clauses(("a", "b"), (1.0, 3.0), 0.5, 0.4)   # outside: psi_t >= 0.8
    ((('b',),), True)
    >>> core_clauses(("a", "b"), (1.0, 3.0), 0.8, 0.5)   # outside: never
    ((('a', 'b'),), False)
    >>> core_clauses(("a", "b"), (1.0, 1.0), 0.9, 0.1 + 5e-10)   # outside: all terms, at most
    ((('a', 'b'),), True)
    """
    if not on_location(alpha, threshold):
        prefix = _prefix(terms, weights, (threshold - alpha) / (1.0 - alpha))
        return prefix, threshold <= 1.0 - alpha + PREFIX_SLACK
    if threshold <= 1.0 - alpha + PREFIX_SLACK:  # (a bound at 1 within the slack: all terms)
        return (_prefix(terms, weights, threshold / (1.0 - alpha)) or (tuple(sorted(terms)),)), True
    return (tuple(sorted(terms)),), False


def validate_ranking(
    d: Mapping[str, Any], terms: tuple[str, ...]
) -> tuple[float, float, tuple[float, ...]]:
    """(threshold, alpha, weights aligned with ``terms``) of a ranked subscription's workload
    form: ``threshold`` θ in (0, 1], ``alpha`` α in [0, 1) (default 0.5), ``weights``
    ``{term: weight > 0}`` for some of its (normalized) terms (1 for the others)."""
    theta = validate_number("threshold", d["threshold"])
    if not 0.0 < theta <= 1.0:
        raise ValidationError("threshold", d["threshold"], "must be in (0, 1]")
    alpha = validate_number("alpha", d.get("alpha", 0.5))
    if not 0.0 <= alpha < 1.0:
        raise ValidationError("alpha", d.get("alpha"), "must be in [0, 1)")
    raw = d.get("weights", {})
    if not isinstance(raw, Mapping):
        raise ValidationError("weights", raw, "must be an object {keyword: weight}")
    given: dict[str, float] = {}
    for k, v in raw.items():
        t = normalize_term(k) if isinstance(k, str) else k
        if t not in terms:
            raise ValidationError(f"weights.{k}", v, "not one of the subscription's keywords")
        w = validate_number(f"weights.{k}", v)
        if not w > 0.0:
            raise ValidationError(f"weights.{k}", v, "must be > 0")
        given[t] = w
    return theta, alpha, tuple(given.get(t, 1.0) for t in terms)


def idf_weight(n_subs: int, df: int) -> float:
    """The weight the cluster gives a term held by ``df`` of ``n_subs`` subscriptions:
    ``1 + ln((1 + n) / (1 + df))`` (smoothed idf: positive, 1 for a term every one holds).

    >>> round(idf_weight(99, 9), 3), idf_weight(0, 0)
    (3.303, 1.0)
    """
    return 1.0 + math.log((1 + n_subs) / (1 + df))
