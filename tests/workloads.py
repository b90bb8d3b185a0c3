"""Random subscriptions and messages for differential tests (plain ``random``, seeded)."""

from __future__ import annotations

import random

from shard.brute import subscription_matches
from shard.model import ADD, Circle, Message, Point, Rect, Subscription

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


class Mirror:
    """What a client sees (updates applied in order) next to the oracle's state."""

    def __init__(self) -> None:
        self.subs: dict[str, Subscription] = {}
        self.live: dict[str, tuple[Message, float]] = {}  # id -> (message, expiry)
        self.held: dict[str, set[str]] = {}

    def apply(self, updates) -> None:
        for sid, sign, mid in updates:
            held = self.held.setdefault(sid, set())
            if sign == ADD:
                assert mid not in held, f"+{mid} for {sid}, which already holds it"
                held.add(mid)
            else:
                assert mid in held, f"-{mid} for {sid}, which does not hold it"
                held.remove(mid)

    def expire(self, now: float) -> None:
        self.live = {k: v for k, v in self.live.items() if now < v[1]}

    def expected(self) -> dict[str, set[str]]:
        return {
            sid: {mid for mid, (m, _) in self.live.items() if subscription_matches(s, m)}
            for sid, s in self.subs.items()
        }

    def assert_exact(self) -> None:
        want = self.expected()
        for sid in set(want) | set(self.held):
            got = self.held.get(sid, set()) if sid in self.subs else set()
            assert got == want.get(sid, set()), (
                f"{sid}: client {sorted(got)} != {sorted(want.get(sid, set()))}"
            )


def as_moving(sub: Subscription, moving: bool = True) -> Subscription:
    return Subscription(sub.id, sub.clauses, sub.region, moving=moving)


def canonical(updates):
    """The updates of one call in a shape-independent order: sorted by (subscription, message),
    stably, so the order of the updates of one pair (e.g. -m then +m) is kept."""
    return sorted(updates, key=lambda u: (u[0], u[2]))


def random_point(rng: random.Random) -> Point:
    return Point(rng.uniform(-30, 30), rng.uniform(-30, 30))


def random_ops(rng: random.Random, ids: list[str], n_ops: int, t0: float, start: int):
    """A list of (kind, payload, now) operations over subscription ids ``ids`` (all moving)."""
    ops = []
    now = t0
    n = start
    for _ in range(n_ops):
        now += rng.choice([0.0, 0.25, 1.0, 3.0])
        r = rng.random()
        if r < 0.35:
            msgs = []
            for _ in range(rng.randint(1, 8)):
                m = random_message(rng, f"n{n}")
                n += 1
                msgs.append(Message(m.id, m.terms, m.location, rng.choice([None, 0.7, 2.0, 6.5])))
            ops.append(("publish", msgs, now))
        elif r < 0.7:
            ops.append(("move", [(rng.choice(ids), random_point(rng)) for _ in range(4)], now))
        elif r < 0.8:
            sid = rng.choice(ids)
            ops.append(("subscribe", [as_moving(random_subscription(rng, sid))], now))
        elif r < 0.85:
            ops.append(("detach", [rng.choice(ids)], now))
        else:
            ops.append(("advance", None, now))
    return ops


def apply_op(state, op) -> list:
    kind, payload, now = op
    if kind == "publish":
        return state.publish_batch(payload, now)
    if kind == "move":
        live = [sid for sid, _ in payload if state.has([sid])[0]]
        return state.move_batch([(sid, p) for sid, p in payload if sid in live], now)
    if kind == "subscribe":
        return state.subscribe_batch(payload, now)
    if kind == "detach":
        return state.detach_batch(payload, now)
    return state.advance(now)
