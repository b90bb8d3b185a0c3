"""Random subscriptions and messages for differential tests (plain ``random``, seeded)."""

from __future__ import annotations

import dataclasses
import math
import random

from shard.attributes import Predicate
from shard.brute import subscription_matches
from shard.errors import ValidationError
from shard.model import ADD, Circle, Message, Point, Polygon, Rect, Subscription
from shard.polygon import validate_polygon

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


def random_polygon(rng: random.Random) -> Polygon:
    """A valid polygon: on the integer lattice (an L shape, or a square with a square hole:
    messages on its vertices and edges test the boundary), or star-shaped around a centre with
    rounded coordinates, sometimes with a star-shaped hole."""
    cx, cy = rng.randint(-15, 15), rng.randint(-15, 15)
    w, h = rng.randint(2, 12), rng.randint(2, 12)
    r = rng.random()
    if r < 0.2:
        rings = [[[cx, cy], [cx + w, cy], [cx + w, cy + 1], [cx + 1, cy + 1], [cx + 1, cy + h], [cx, cy + h], [cx, cy]]]  # fmt: skip
    elif r < 0.4:
        rings = [
            [[cx, cy], [cx + w, cy], [cx + w, cy + h], [cx, cy + h], [cx, cy]],
            [
                [cx + 1, cy + 1],
                [cx + 1, cy + h - 1],
                [cx + w - 1, cy + h - 1],
                [cx + w - 1, cy + 1],
                [cx + 1, cy + 1],
            ],  # fmt: skip
        ][: 2 if w > 2 and h > 2 else 1]
    else:
        k = rng.randint(3, 12)
        angles = sorted(rng.uniform(0, 2 * math.pi) for _ in range(k))
        radii = [rng.uniform(2, 10) for _ in range(k)]
        digits = rng.choice([0, 1, 3, 7])
        ring = [[round(cx + d * math.cos(a), digits), round(cy + d * math.sin(a), digits)] for a, d in zip(angles, radii, strict=True)]  # fmt: skip
        rings = [[*ring, ring[0]]]
        if rng.random() < 0.4:
            hr = min(radii) * 0.3
            rings.append(
                [[cx + hr, cy], [cx, cy + hr], [cx - hr, cy], [cx, cy - hr], [cx + hr, cy]]
            )
    try:
        return Polygon.of(validate_polygon("polygon", rings))
    except ValidationError:  # a star whose rounding made it invalid: a plain square instead
        square = [[cx, cy], [cx + w, cy], [cx + w, cy + h], [cx, cy + h], [cx, cy]]
        return Polygon.of(validate_polygon("polygon", [square]))


ATTRS = ("price", "cat", "n")
CATS = ("food", "drinks", "toys", "books")


def random_predicates(rng: random.Random) -> tuple[Predicate, ...]:
    """1-3 predicates on distinct attributes, every operator, numbers and strings."""
    out = []
    for attr in rng.sample(ATTRS, rng.randint(1, 3)):
        if attr == "cat" or (attr == "n" and rng.random() < 0.3):
            op = rng.choice(["=", "!=", "in", "not in"])
            if op in ("in", "not in"):
                value = tuple(sorted(set(rng.choices(CATS, k=rng.randint(1, 3)))))
            else:
                value = rng.choice(CATS)
        else:
            op = rng.choice(["=", "!=", "<", "<=", ">", ">=", "in", "not in", "between"])
            if op == "between":
                lo = float(rng.randint(0, 10))
                value = (lo, lo + rng.randint(0, 5))
            elif op in ("in", "not in"):
                value = tuple(sorted({float(rng.randint(0, 10)) for _ in range(3)}))
            else:
                value = float(rng.randint(0, 10))
        out.append(Predicate(attr, op, value))
    return tuple(out)


def random_attributes(rng: random.Random) -> tuple:
    """0-3 attributes: numbers on the predicates' lattice, strings, sometimes the wrong type."""
    out = {}
    for attr in ATTRS:
        if rng.random() < 0.7:
            if attr == "cat" or rng.random() < 0.15:
                out[attr] = rng.choice(CATS + ("other",))
            else:
                out[attr] = float(rng.randint(-1, 16)) + rng.choice([0.0, 0.0, 0.5])
    return tuple(sorted(out.items()))


def random_subscription(
    rng: random.Random, sid: str, vocab: list[str] = VOCAB, extras: float = 0.0
) -> Subscription:
    """A random subscription; with ``extras`` > 0, each of NOT terms, a polygon region and
    attribute predicates with that probability."""

    def clause() -> tuple[str, ...]:
        k = rng.choice([1, 1, 2, 2, 3, 4])
        return tuple(
            sorted(set(rng.choices(vocab[: len(vocab) // 2] if rng.random() < 0.7 else vocab, k=k)))
        )

    n = 1 if rng.random() < 0.6 else rng.randint(2, 4)
    clauses = tuple(sorted({clause() for _ in range(n)}))
    if not extras:
        return Subscription(sid, clauses, random_region(rng))
    if rng.random() < extras / 2:  # ranked (paper 004, Sect. 6): its first clause's terms scored
        region = random_region(rng)
        if not isinstance(region, Rect):
            region = Rect(region.lon - 1, region.lat - 1, region.lon + 1, region.lat + 1)
            region = Rect(max(region.min_lon, -180.0), max(region.min_lat, -90.0), min(region.max_lon, 180.0), min(region.max_lat, 90.0))  # fmt: skip
        alpha = rng.choice([0.0, 0.2, 0.5, 0.8])
        if alpha and rng.random() < 0.35:  # theta <= alpha: matches on location alone too
            theta = alpha * rng.choice([0.2, 0.6, 1.0])
        else:
            theta = alpha + (1 - alpha) * rng.choice([0.05, 0.3, 0.5, 0.75, 1.0])
        terms = clauses[0]
        weights = None
        if rng.random() < 0.5:
            weights = tuple(rng.choice([0.5, 1.0, 2.0, 3.7]) for _ in terms)
        preds = random_predicates(rng) if rng.random() < extras else ()
        return Subscription(
            sid, (terms,), region, predicates=preds, threshold=theta, alpha=alpha, weights=weights
        )
    negated = None
    if rng.random() < extras:
        pool = vocab[: len(vocab) // 2]
        negated = tuple(
            tuple(sorted(set(rng.sample(pool, rng.randint(0, 2))) - set(c))) for c in clauses
        )
        if not any(negated):
            negated = None
    region = random_polygon(rng) if rng.random() < extras else random_region(rng)
    preds = random_predicates(rng) if rng.random() < extras else ()
    return Subscription(sid, clauses, region, negated=negated, predicates=preds)


def random_message(
    rng: random.Random, mid: str, vocab: list[str] = VOCAB, attributes: bool = False
) -> Message:
    terms = tuple(sorted(set(rng.choices(vocab, k=rng.randint(1, 10)))))
    attrs = random_attributes(rng) if attributes else ()
    if rng.random() < 0.25:
        x0, x1 = sorted((_coord(rng, LATTICE_X, -25, 25), _coord(rng, LATTICE_X, -25, 25)))
        y0, y1 = sorted((_coord(rng, LATTICE_Y, -25, 25), _coord(rng, LATTICE_Y, -25, 25)))
        return Message(mid, terms, Rect(x0, y0, x1, y1), attributes=attrs)
    return Message(
        mid,
        terms,
        Point(_coord(rng, LATTICE_X, -25, 25), _coord(rng, LATTICE_Y, -25, 25)),
        attributes=attrs,
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
    return dataclasses.replace(sub, moving=moving, keywords=None, expr=None)


def canonical(updates):
    """The updates of one call in a shape-independent order: sorted by (subscription, message),
    stably, so the order of the updates of one pair (e.g. -m then +m) is kept."""
    return sorted(updates, key=lambda u: (u[0], u[2]))


def random_point(rng: random.Random) -> Point:
    return Point(rng.uniform(-30, 30), rng.uniform(-30, 30))


def random_ops(
    rng: random.Random, ids: list[str], n_ops: int, t0: float, start: int, extras: float = 0.0
):
    """A list of (kind, payload, now) operations over subscription ids ``ids`` (all moving);
    with ``extras``, subscriptions with conditions (``random_subscription``) and messages with
    attributes."""
    ops = []
    now = t0
    n = start
    for _ in range(n_ops):
        now += rng.choice([0.0, 0.25, 1.0, 3.0])
        r = rng.random()
        if r < 0.35:
            msgs = []
            for _ in range(rng.randint(1, 8)):
                m = random_message(rng, f"n{n}", attributes=extras > 0)
                n += 1
                ttl = rng.choice([None, 0.7, 2.0, 6.5])
                msgs.append(dataclasses.replace(m, ttl=ttl))
            ops.append(("publish", msgs, now))
        elif r < 0.7:
            ops.append(("move", [(rng.choice(ids), random_point(rng)) for _ in range(4)], now))
        elif r < 0.8:
            sid = rng.choice(ids)
            sub = random_subscription(rng, sid, extras=extras)
            ops.append(("subscribe", [as_moving(sub)], now))
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
