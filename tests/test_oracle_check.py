"""The oracle checks of what clients received (``geopubsub.tools.oracle_check``): a correct timeline
passes, and each kind of wrong delivery, missing delivery or wrong move difference is caught."""

from __future__ import annotations

import dataclasses

from geopubsub.tools.oracle_check import (
    MoveRecord,
    PublishWindow,
    Received,
    check_mover,
    check_static,
)
from shard.applus.tree import recentre
from shard.model import Message, Point, Rect, Subscription

MOVER = Subscription("w", (("a",),), Rect(0, 0, 2, 2), moving=True)
TTL = 10.0
# p0 where the mover starts; p1 where it goes; p2 where it goes too but without the keyword
MSGS = [
    Message("p0", ("a",), Point(1, 1), ttl=TTL),
    Message("p1", ("a", "b"), Point(11, 1), ttl=TTL),
    Message("p2", ("b",), Point(11, 1), ttl=TTL),
]
WINDOWS = {
    "p0": PublishWindow(MSGS[0], 0.0, 0.01),
    "p1": PublishWindow(MSGS[1], 2.0, 2.01),
    "p2": PublishWindow(MSGS[2], 2.0, 2.01),
}


def _published(mid: str):
    return WINDOWS.get(mid)


def _d(seq: int, kind: str, mid: str, t: float) -> Received:
    return Received(seq, kind, mid, t, 0.0, t + 0.001)


def _timeline():
    """The mover sees p0, moves away at ~1 s (− p0), p1 is published into its new region at ~2 s
    (+ p1) and expires at ~12 s (− p1)."""
    move = MoveRecord(
        Point(11, 1), recentre(MOVER.region, Point(11, 1)), 1.0, 1.01, [_d(2, "-", "p0", 1.005)]
    )
    stream = [
        _d(1, "+", "p0", 0.005),
        _d(2, "-", "p0", 1.005),
        _d(3, "+", "p1", 2.005),
        _d(4, "-", "p1", 12.005),
    ]
    return [move], stream


def _check(moves, stream, **kw):
    return check_mover(MOVER, moves, stream, _published, MSGS, all_expired=True, **kw)


def test_a_correct_timeline_passes():
    moves, stream = _timeline()
    v = _check(moves, stream)
    assert v.violations == 0, v.examples
    assert v.checked >= 10 and (v.adds, v.removes, v.moves) == (2, 2, 1)


def test_a_missing_publish_delivery_is_caught():
    moves, stream = _timeline()
    stream = [_d(1, "+", "p0", 0.005), _d(2, "-", "p0", 1.005)]
    v = _check(moves, stream)
    assert v.violations == 1 and "p1" in v.examples[0] and "not held" in v.examples[0]


def test_a_delivery_the_keywords_do_not_match_is_caught():
    moves, stream = _timeline()
    stream[2:] = [
        _d(3, "+", "p1", 2.005),
        _d(4, "+", "p2", 2.006),
        _d(5, "-", "p1", 12.005),
        _d(6, "-", "p2", 12.006),
    ]
    v = _check(moves, stream)
    assert v.violations == 1 and "p2" in v.examples[0] and "do not match" in v.examples[0]


def test_a_publish_delivered_outside_the_region_is_caught():
    moves, stream = _timeline()
    far = dataclasses.replace(MSGS[1], location=Point(50, 50))
    WINDOWS["p1"], saved = PublishWindow(far, 2.0, 2.01), WINDOWS["p1"]
    try:
        v = check_mover(MOVER, moves, stream, _published, [MSGS[0], far, MSGS[2]], all_expired=True)
    finally:
        WINDOWS["p1"] = saved
    assert "outside every region" in v.examples[0]
    assert v.violations == 2 and "held during" in v.examples[1]  # and it was kept there


def test_a_move_that_keeps_a_message_it_left_is_caught():
    moves, stream = _timeline()
    moves[0].updates = []  # the move answered nothing: p0 stays held until it expires
    stream = [
        _d(1, "+", "p0", 0.005),
        _d(2, "+", "p1", 2.005),
        _d(3, "-", "p0", 10.005),
        _d(4, "-", "p1", 12.005),
    ]
    v = _check(moves, stream)
    assert v.violations == 1 and "held during" in v.examples[0], v.examples


def test_a_wrong_move_difference_is_caught():
    moves, stream = _timeline()
    moves[0] = dataclasses.replace(moves[0], updates=[])
    moves[0].updates.append(_d(2, "-", "p0", 1.005))
    # the move returns to the start: the oracle removes nothing, yet p0 was removed
    moves[0].point, moves[0].region = Point(1, 1), MOVER.region
    v = _check(moves, stream[:2])
    assert v.violations >= 1 and any("the oracle removes []" in e for e in v.examples), v.examples


def test_an_early_expiry_and_a_broken_sequence_are_caught():
    moves, stream = _timeline()
    stream[3] = _d(5, "-", "p1", 3.0)
    v = _check(moves, stream)
    assert v.violations == 3, v.examples
    assert "sequences" in v.examples[0]
    assert "before its expiry" in v.examples[1]
    assert "but was not held then" in v.examples[2]  # p1 was live and in the region until 12 s


def test_a_message_still_held_at_the_end_is_caught():
    moves, stream = _timeline()
    v = _check(moves, stream[:3])
    assert any("still holds ['p1']" in e for e in v.examples), v.examples


def test_static_streams_are_checked_exactly():
    sub = Subscription("s", (("a",),), Rect(10, 0, 12, 2))
    stream = [_d(1, "+", "p1", 2.005), _d(2, "-", "p1", 12.005)]
    ok = check_static(sub, stream, {"p1"}, _published, all_expired=True)
    assert ok.violations == 0 and ok.checked >= 4
    missing = check_static(sub, stream, {"p1", "p0"}, _published, all_expired=True)
    assert missing.violations == 1 and "missing ['p0']" in missing.examples[0]
    late = [_d(1, "+", "p1", 2.5), _d(2, "-", "p1", 12.005)]
    wrong_round = check_static(sub, late, {"p1"}, _published, all_expired=True)
    assert wrong_round.violations == 1 and "outside its publish round" in wrong_round.examples[0]
