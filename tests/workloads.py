"""Random subscriptions and messages for differential tests (plain ``random``, seeded)."""

from __future__ import annotations

import random

from shard.model import Circle, Message, Point, Rect, Subscription

VOCAB = [f"t{i}" for i in range(40)]
LATTICE_X = [
    -180.0,
    -120.0,
    -60.0,
    -10.0,
    -5.0,
    -1.0,
    0.0,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    60.0,
    179.0,
    180.0,
]
LATTICE_Y = [-90.0, -60.0, -10.0, -5.0, -1.0, 0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 60.0, 89.0, 90.0]


def _coord(rng: random.Random, lattice: list[float], lo: float, hi: float) -> float:
    if rng.random() < 0.5:
        return rng.choice(lattice)
    return round(rng.uniform(lo, hi), rng.choice([0, 1, 3, 7]))


def random_region(rng: random.Random) -> Rect | Circle:
    if rng.random() < 0.25:
        return Circle(
            _coord(rng, LATTICE_X, -180, 180),
            _coord(rng, LATTICE_Y, -90, 90),
            rng.choice([1.0, 1e3, 5e4, 5e5, 3e6, 2e7]),
        )
    x0, x1 = sorted((_coord(rng, LATTICE_X, -20, 20), _coord(rng, LATTICE_X, -20, 20)))
    y0, y1 = sorted((_coord(rng, LATTICE_Y, -20, 20), _coord(rng, LATTICE_Y, -20, 20)))
    if rng.random() < 0.05:
        return Rect(-180.0, -90.0, 180.0, 90.0)
    return Rect(x0, y0, x1, y1)


def random_subscription(rng: random.Random, sid: str, vocab: list[str] = VOCAB) -> Subscription:
    def clause() -> tuple[str, ...]:
        k = rng.choice([1, 1, 2, 2, 3, 4])
        return tuple(
            sorted(set(rng.choices(vocab[: len(vocab) // 2] if rng.random() < 0.7 else vocab, k=k)))
        )

    n = 1 if rng.random() < 0.6 else rng.randint(2, 4)
    clauses = tuple(sorted({clause() for _ in range(n)}))
    return Subscription(sid, clauses, random_region(rng))


def random_message(rng: random.Random, mid: str, vocab: list[str] = VOCAB) -> Message:
    terms = tuple(sorted(set(rng.choices(vocab, k=rng.randint(1, 10)))))
    if rng.random() < 0.25:
        x0, x1 = sorted((_coord(rng, LATTICE_X, -25, 25), _coord(rng, LATTICE_X, -25, 25)))
        y0, y1 = sorted((_coord(rng, LATTICE_Y, -25, 25), _coord(rng, LATTICE_Y, -25, 25)))
        return Message(mid, terms, Rect(x0, y0, x1, y1))
    return Message(
        mid, terms, Point(_coord(rng, LATTICE_X, -25, 25), _coord(rng, LATTICE_Y, -25, 25))
    )


def assert_same_matches(index, oracle, messages) -> None:
    got = index.match_batch(messages)
    want = oracle.match_batch(messages)
    for m, g, w in zip(messages, got, want, strict=True):
        assert len(g) == len(set(g)), f"{m.id}: duplicate deliveries {g}"
        assert sorted(g) == sorted(w), f"{m.id}: index {sorted(g)} != oracle {sorted(w)} for {m}"
