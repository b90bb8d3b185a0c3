"""What the two workload generators (``gen``: synthetic, ``gen_places``: real place names)
share: the paper's DNF expression shape and the checks of the options both take."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from shard.errors import ValidationError
from shard.polygon_rings import validate_polygon


def dnf_text(rng: np.random.Generator, terms: list[str]) -> str:
    """Paper Sect. 5.1.1: split the terms in two groups by a random AND/OR between neighbours;
    each group becomes an OR- or AND-clause; groups are joined by AND."""
    cut = int(rng.integers(1, len(terms)))
    groups = [terms[:cut], terms[cut:]]
    parts = []
    for g in groups:
        op = " OR " if rng.random() < 0.5 else " AND "
        parts.append(f"({op.join(g)})" if len(g) > 1 else g[0])
    return " AND ".join(parts)


def check_shapes(
    n_subs: int,
    n_msgs: int,
    *,
    dnf_share: float,
    circle_share: float,
    region_msg_share: float,
    moving_share: float,
    min_area: float,
    max_area: float,
) -> None:
    """ValidationError naming the flag of the first bad count, share or area."""
    for name, v in (("--subs", n_subs), ("--msgs", n_msgs)):
        if v < 0:
            raise ValidationError(name, v, "must be >= 0")
    for name, v in (
        ("--dnf-share", dnf_share),
        ("--circle-share", circle_share),
        ("--region-msg-share", region_msg_share),
        ("--moving-share", moving_share),
    ):
        if not 0.0 <= v <= 1.0:
            raise ValidationError(name, v, "must be in [0, 1]")
    if not 0 < min_area <= max_area <= 1:
        raise ValidationError(
            "--min-area", (min_area, max_area), "need 0 < min-area <= max-area <= 1"
        )


# ---- conditions beyond terms and a rectangle ([2.7]) ----------------------------------------
CATEGORIES = ("food", "drinks", "books", "toys", "music", "games", "garden", "tools", "shoes", "phones", "travel", "health")  # fmt: skip
"""A message's ``category`` attribute: one of these, Zipf-popular in this order."""

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ConditionShares:
    """Shares of subscriptions given each condition (independently), and whether messages
    carry attributes (on whenever a share of subscriptions has predicates)."""

    not_share: float = 0.0
    polygon_share: float = 0.0
    predicate_share: float = 0.0
    attributes: bool = False
    ranked_share: float = 0.0

    def check(self) -> None:
        for name, v in (
            ("--not-share", self.not_share),
            ("--polygon-share", self.polygon_share),
            ("--predicate-share", self.predicate_share),
            ("--ranked-share", self.ranked_share),
        ):
            if not 0.0 <= v <= 1.0:
                raise ValidationError(name, v, "must be in [0, 1]")

    @property
    def any(self) -> bool:
        return bool(
            self.not_share or self.polygon_share or self.predicate_share or self.ranked_share
        )

    @property
    def messages_have_attributes(self) -> bool:
        return self.attributes or self.predicate_share > 0


def message_attributes(rng: np.random.Generator) -> dict:
    """``price`` (log-normal, median ~20, 90 % of messages), ``category`` (Zipf over
    ``CATEGORIES``, 85 %), ``rating`` (1-5, 60 %)."""
    out: dict = {}
    if rng.random() < 0.9:
        out["price"] = round(float(rng.lognormal(3.0, 0.8)), 2)
    if rng.random() < 0.85:
        p = 1.0 / np.arange(1, len(CATEGORIES) + 1)
        out["category"] = CATEGORIES[int(rng.choice(len(CATEGORIES), p=p / p.sum()))]
    if rng.random() < 0.6:
        out["rating"] = int(rng.integers(1, 6))
    return out


def _predicates(rng: np.random.Generator) -> list[dict]:
    out = []
    for attr in rng.choice(["price", "category", "rating"], int(rng.integers(1, 3)), replace=False):
        r = rng.random()
        if attr == "price":
            x = round(float(rng.lognormal(3.0, 0.8)), 0)
            if r < 0.6:
                out.append({"attr": "price", "op": "<=", "value": x})
            else:
                out.append({"attr": "price", "op": "between", "value": [x / 2, x * 2]})
        elif attr == "category":
            cats = [str(c) for c in rng.choice(CATEGORIES, int(rng.integers(1, 4)), replace=False)]
            op = "in" if r < 0.7 else "not in"
            out.append({"attr": "category", "op": op, "value": cats})
        else:
            out.append({"attr": "rating", "op": ">=", "value": int(rng.integers(2, 6))})
    return out


def _polygon_in(rect: list[float], rng: np.random.Generator) -> list:
    """A star-shaped polygon (6-24 vertices, one in each of k equal sectors around the centre,
    radii 55-100 % of the ellipse inscribed in ``rect``): no two consecutive vertices half a
    turn apart, so it is simple (star-shaped about the centre), as large as the rectangle's
    ellipse. (Sorted uniform angles left a gap of more than half a turn now and then, and the
    edge across it could cross others: 0.25 % of them, found by a 1M-subscription load.)"""
    x0, y0, x1, y1 = rect
    cx, cy, a, b = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
    k = int(rng.integers(6, 25))
    angles = 2 * np.pi * (np.arange(k) + rng.uniform(0.1, 0.9, k)) / k
    radii = rng.uniform(0.55, 1.0, k)
    ring = [
        [round(cx + a * r * np.cos(t), 6), round(cy + b * r * np.sin(t), 6)]
        for t, r in zip(angles.tolist(), radii.tolist(), strict=True)
    ]
    ring = [pt for i, pt in enumerate(ring) if i == 0 or pt != ring[i - 1]]
    return [[*ring, ring[0]]]


def add_conditions(
    rng: np.random.Generator,
    d: dict,
    shares: ConditionShares,
    others: list[str],
    counts: dict,
) -> None:
    """Give the subscription ``d`` (workload form) each condition with its share: ``AND NOT``
    one of ``others`` (terms that occur beside its own in the message it was drawn from, so
    the negation bites), a star-shaped polygon in place of its rectangle, 1-2 predicates on the
    messages' attributes (``message_attributes``); or instead, with ``ranked_share``, make it a
    ranked subscription (a rectangle's keywords scored: α in [0.1, 0.5], θ between α and 1, or
    for a quarter of them between α / 2 and α; a draw only when the share is not 0, so other
    workloads keep their streams). Counted in ``counts``."""
    if shares.ranked_share and rng.random() < shares.ranked_share and "keywords" in d and "rect" in d:  # fmt: skip
        alpha = round(float(rng.uniform(0.1, 0.5)), 3)
        d["alpha"] = alpha
        if rng.random() < 0.25:  # θ <= α: anything in its rectangle, and text outside
            d["threshold"] = round(alpha * float(rng.uniform(0.5, 1.0)), 3)
        else:
            d["threshold"] = round(alpha + (1 - alpha) * float(rng.uniform(0.3, 0.9)), 3)
        counts["ranked"] = counts.get("ranked", 0) + 1
        return
    if rng.random() < shares.not_share:
        own = set(d.get("keywords") or _WORD.findall(d.get("expr", "")))
        pool = [t for t in others if t not in own and _WORD.fullmatch(t)]
        plain_words = all(_WORD.fullmatch(t) for t in d.get("keywords", ()))
        if pool and plain_words:
            neg = pool[int(rng.integers(len(pool)))]
            if "keywords" in d:
                d["expr"] = " AND ".join(d.pop("keywords")) + f" AND NOT {neg}"
            else:
                d["expr"] = f"({d['expr']}) AND NOT {neg}"
            counts["not"] = counts.get("not", 0) + 1
    if rng.random() < shares.polygon_share and "rect" in d:
        poly = _polygon_in(d["rect"], rng)
        try:  # rounding to 6 decimals can still fold a thin one: then it keeps its rectangle
            validate_polygon("polygon", poly)
        except ValidationError:
            poly = None
        if poly is not None:
            del d["rect"]
            d["polygon"] = poly
            counts["polygon"] = counts.get("polygon", 0) + 1
    if rng.random() < shares.predicate_share:
        d["predicates"] = _predicates(rng)
        counts["predicates"] = counts.get("predicates", 0) + 1


NO_CONDITIONS = ConditionShares()
"""The generators' default: plain subscriptions, messages without attributes."""
