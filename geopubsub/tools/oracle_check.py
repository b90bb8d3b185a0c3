"""What clients received, checked against the brute-force oracle (``shard.brute``).

The cluster's rule: a subscription holds R(s, t) = {live m : m matches s at its region at t}, and
its result stream is the sequence of + / - that keeps a client's copy equal to it. The checks here
hold a client's stream against that rule using only what the client can know:

* a publish's round happened at a time between the client handing the message to gRPC and reading
  its answer (``PublishWindow``), and every delivery carries its round's time (``Delivery.time``,
  the server's clock, which is the client's on one machine);
* a tracked mover's moves are sequential, each round between its request and its answer (exactly
  at its updates' time when it had updates), and the updates it answered are exact.

Static subscriptions are checked exactly: the set of + equals the brute-force match set of the
published messages, each + in its publish round, each - an expiry. Moving subscriptions: every +
and - is possible under the oracle at its time (the region it had, given the timing bounds); every
move's updates are exactly the oracle's difference for the region it moved to (where the timing
makes it certain); wherever the oracle is certain that a message matched the mover for a stretch
of time, the stream held it then, and it never held a message while its region certainly did not
meet it. What the timing leaves undecided is counted, not guessed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from shard.brute import region_matches
from shard.model import Circle, Message, Point, Rect, Subscription

EPS_S = 1e-6
"""Slack for comparing times that went through float formatting."""
MAX_REPORTED = 20
"""Violations listed per subscription (all are counted)."""


@dataclass(slots=True)
class Received:
    """One delivery as a client saw it."""

    sequence: int
    kind: str  # "+" | "-"
    message_id: str
    time: float
    """Delivery.time: the round that made it (server clock)."""
    message_time: float
    """Message.time: when the coordinator received the publish (0 on a REMOVE)."""
    received: float
    """When the client read it."""

    def __str__(self) -> str:
        return f"{self.kind} {self.message_id} (#{self.sequence})"


@dataclass(slots=True)
class MoveRecord:
    """One UpdateLocation of a tracked mover: the new centre and region, when the request was sent
    and its answer read (the move's round lies between), and the updates it answered."""

    point: Point
    region: Rect | Circle
    sent: float
    answered: float
    updates: list[Received]


@dataclass(frozen=True, slots=True)
class PublishWindow:
    """A published message and the bounds of its publish round's time: ``lo`` (handed to gRPC)
    ≤ round ≤ ``hi`` (answer read)."""

    message: Message
    lo: float
    hi: float

    @property
    def ttl(self) -> float:
        return self.message.ttl or 0.0


Published = Callable[[str], PublishWindow | None]
"""Looks up a message id; None for a message that was never published."""


@dataclass
class Verdict:
    """The outcome of checking one subscription's stream."""

    subscription: str
    deliveries: int = 0
    adds: int = 0
    removes: int = 0
    moves: int = 0
    checked: int = 0
    """Individual assertions that held or failed."""
    undecided: int = 0
    """(message, region period) pairs the timing bounds leave open: not checked."""
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.checked += 1
        self.violations += 1
        if len(self.examples) < MAX_REPORTED:
            self.examples.append(f"{self.subscription}: {text}")

    def ok(self) -> None:
        self.checked += 1

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def keyword_match(sub: Subscription, msg: Message) -> bool:
    """The keyword half of ``shard.brute.subscription_matches``.

    >>> keyword_match(Subscription("s", (("a", "b"),), Rect(0, 0, 1, 1)), Message("m", ("a", "b", "c"), Point(0, 0)))
    True
    """
    terms = set(msg.terms)
    return any(terms.issuperset(c) for c in sub.clauses)


def _sequences(v: Verdict, stream: Sequence[Received]) -> None:
    if [d.sequence for d in stream] == list(range(1, len(stream) + 1)):
        v.ok()
    else:
        v.fail(f"sequences are not 1..{len(stream)} in order: {[d.sequence for d in stream][:20]}")


def _intervals(
    v: Verdict, stream: Sequence[Received]
) -> tuple[dict[str, list[list[float]]], set[str]]:
    """Replay the stream: per message the [add time, remove time] intervals (remove inf while
    held); checks that a + is for a message not held and a - for one held. Returns the intervals
    and the set held at the end."""
    held: set[str] = set()
    intervals: dict[str, list[list[float]]] = {}
    for d in stream:
        if d.kind == "+":
            if d.message_id in held:
                v.fail(f"{d}: + for a message already held")
                continue
            held.add(d.message_id)
            intervals.setdefault(d.message_id, []).append([d.time, math.inf])
        else:
            if d.message_id not in held:
                v.fail(f"{d}: - for a message not held")
                continue
            held.discard(d.message_id)
            intervals[d.message_id][-1][1] = d.time
        v.ok()
    return intervals, held


def check_static(
    sub: Subscription,
    stream: Sequence[Received],
    expected: Iterable[str],
    published: Published,
    *,
    all_expired: bool,
) -> Verdict:
    """Exact check of a subscription that never moved: sequences 1..n; the + are exactly
    ``expected`` (the brute-force matches among the published messages), each once, in its publish
    round; each - an expiry (at or after publish + ttl); with ``all_expired`` (the run outlived every
    message) nothing is held at the end."""
    v = Verdict(sub.id, deliveries=len(stream))
    _sequences(v, stream)
    _, held = _intervals(v, stream)
    adds = [d for d in stream if d.kind == "+"]
    v.adds, v.removes = len(adds), len(stream) - len(adds)
    got = {d.message_id for d in adds}
    want = set(expected)
    if len(got) != len(adds):
        v.fail("a message was added more than once")
    if got == want:
        v.ok()
    else:
        v.fail(
            f"+ set differs from the oracle: missing {sorted(want - got)[:10]}, "
            f"unexpected {sorted(got - want)[:10]}"
        )
    for d in stream:
        w = published(d.message_id)
        if w is None:
            v.fail(f"{d}: never published")
        elif d.kind == "+":
            _in_publish_round(v, d, w)
        elif d.time + EPS_S < w.lo + w.ttl:
            v.fail(f"{d}: removed at {d.time:.6f} before its expiry (>= {w.lo + w.ttl:.6f})")
        else:
            v.ok()
    if all_expired:
        one_shot = {m for m in held if (w := published(m)) is not None and not w.ttl}
        _nothing_held(v, held - one_shot)
    return v


def _in_publish_round(v: Verdict, d: Received, w: PublishWindow) -> None:
    if w.lo - EPS_S <= d.time <= w.hi + EPS_S:
        v.ok()
    else:
        v.fail(f"{d}: + at {d.time:.6f}, outside its publish round [{w.lo:.6f}, {w.hi:.6f}]")


def _nothing_held(v: Verdict, held: set[str]) -> None:
    if held:
        v.fail(f"still holds {sorted(held)[:10]} after every message expired")
    else:
        v.ok()


@dataclass(slots=True)
class _Period:
    """The mover's region from the round of one move to the round of the next: certainly in force
    during [sure_from, sure_until); its move's round lies in [lo, hi]."""

    region: Rect | Circle
    lo: float
    hi: float
    first_seq: int  # of its move's updates; 0 when it had none
    last_seq: int
    sure_from: float = -math.inf
    sure_until: float = math.inf
    maybe_until: float = math.inf


def _periods(sub: Subscription, moves: Sequence[MoveRecord]) -> list[_Period]:
    out = [_Period(sub.region, -math.inf, -math.inf, 0, 0)]
    for m in moves:
        if m.updates:
            t = m.updates[0].time
            seqs = [u.sequence for u in m.updates]
            out.append(_Period(m.region, t, t, min(seqs), max(seqs)))
        else:
            out.append(_Period(m.region, m.sent, m.answered, 0, 0))
    for a, b in zip(out, out[1:], strict=False):
        a.sure_until, a.maybe_until = b.lo, b.hi
        b.sure_from = b.hi
    return out


def _candidates(periods: Sequence[_Period], seq: int, t: float) -> list[_Period]:
    """The periods that may have been in force for a delivery ``seq`` made at round time ``t``."""
    first = 0
    for k in range(1, len(periods)):
        p = periods[k]
        if (p.last_seq and p.last_seq < seq) or p.hi < t:
            first = k
    out = [periods[first]]
    for p in periods[first + 1 :]:
        if (p.first_seq and p.first_seq > seq) or p.lo > t:
            break
        out.append(p)
    return out


def check_mover(
    sub: Subscription,
    moves: Sequence[MoveRecord],
    stream: Sequence[Received],
    published: Published,
    messages: Iterable[Message],
    *,
    all_expired: bool,
) -> Verdict:
    """Check a tracked mover's result stream against the oracle, given its moves in order (its
    only ones), the publish windows and every published message (``messages``, for completeness).
    Every published message must have a ttl: a one-shot message is never removed, so a client's
    copy of R(s, t) does not apply to it. See the module docstring for what is checked;
    ``undecided`` counts what the timing leaves open.
    """
    v = Verdict(sub.id, deliveries=len(stream), moves=len(moves))
    _sequences(v, stream)
    by_seq = {d.sequence: d for d in stream}
    move_seqs: set[int] = set()
    for k, m in enumerate(moves, 1):
        for u in m.updates:
            move_seqs.add(u.sequence)
            d = by_seq.get(u.sequence)
            if d is None or (d.kind, d.message_id) != (u.kind, u.message_id):
                v.fail(f"move {k}: update {u} is not in the result stream as such ({d})")
            else:
                v.ok()
    # snapshots of the held set just before each move's first update
    firsts = {m.updates[0].sequence: k for k, m in enumerate(moves) if m.updates}
    before: dict[int, set[str]] = {}
    held: set[str] = set()
    for d in stream:
        if d.sequence in firsts:
            before[firsts[d.sequence]] = set(held)
        if d.kind == "+":
            held.add(d.message_id)
        else:
            held.discard(d.message_id)
    intervals, held = _intervals(v, stream)
    v.adds = sum(d.kind == "+" for d in stream)
    v.removes = len(stream) - v.adds
    periods = _periods(sub, moves)

    # every delivery not made by a move: a publish (+) or an expiry (-)
    for d in stream:
        if d.sequence in move_seqs:
            continue
        w = published(d.message_id)
        if w is None:
            v.fail(f"{d}: never published")
            continue
        if d.kind == "-":
            if d.time + EPS_S >= w.lo + w.ttl:
                v.ok()
            else:
                v.fail(f"{d}: removed at {d.time:.6f}, not by a move, before its expiry")
            continue
        if not keyword_match(sub, w.message):
            v.fail(f"{d}: its terms {w.message.terms} do not match {sub.clauses}")
            continue
        _in_publish_round(v, d, w)
        cands = _candidates(periods, d.sequence, d.time)
        if any(region_matches(p.region, w.message.location) for p in cands):
            v.ok()
        else:
            v.fail(
                f"{d}: published at {w.message.location}, outside every region the mover may have had"
            )

    # every move with updates: exactly the oracle's difference
    for k, m in enumerate(moves):
        if not m.updates:
            continue
        t = m.updates[0].time
        r_before = before[k]
        removes = {u.message_id for u in m.updates if u.kind == "-"}
        adds = {u.message_id for u in m.updates if u.kind == "+"}
        want_removes = set()
        for mid in r_before:
            w = published(mid)
            if w is not None and not region_matches(m.region, w.message.location):
                want_removes.add(mid)
        if removes == want_removes:
            v.ok()
        else:
            v.fail(
                f"move {k + 1} to {m.point}: removed {sorted(removes)[:10]}, the oracle removes "
                f"{sorted(want_removes)[:10]}"
            )
        for mid in adds:
            w = published(mid)
            if w is None:
                v.fail(f"move {k + 1}: + {mid} never published")
            elif (
                mid not in r_before
                and keyword_match(sub, w.message)
                and region_matches(m.region, w.message.location)
                and w.lo - EPS_S <= t < w.hi + w.ttl + EPS_S
            ):
                v.ok()
            else:
                v.fail(f"move {k + 1} to {m.point}: + {mid} does not match or is not live")

    # completeness: where the oracle is certain the mover held a message, the stream held it
    for msg in messages:
        if not keyword_match(sub, msg):
            continue
        w = published(msg.id)
        if w is None:
            continue
        if not w.ttl:
            raise ValueError(f"check_mover: {msg.id} is one-shot (no ttl)")
        spans = intervals.get(msg.id, [])
        for p in periods:
            if not region_matches(p.region, msg.location):
                if not spans:
                    continue
                # held while the region certainly did not meet it: a move failed to remove it
                for a, b in spans:
                    if max(a, p.sure_from) + EPS_S < min(b, p.sure_until):
                        v.fail(
                            f"{msg.id} at {msg.location} held during [{a:.3f}, {b:.3f}) while the "
                            f"region was {p.region} from {p.sure_from:.3f} to {p.sure_until:.3f}"
                        )
                        break
                else:
                    v.ok()
                continue
            start, end = max(p.sure_from, w.hi), min(p.sure_until, w.lo + w.ttl)
            if not start < end:
                if max(p.lo, w.lo) < min(p.maybe_until, w.hi + w.ttl):
                    v.undecided += 1
                continue
            if any(a <= start + EPS_S and b >= end - EPS_S for a, b in spans):
                v.ok()
            else:
                v.fail(
                    f"{msg.id} at {msg.location} matched the region {p.region} for certain "
                    f"during [{start:.3f}, {end:.3f}) but was not held then ({spans})"
                )
    if all_expired:
        _nothing_held(v, held)
    return v
