"""The brute-force matcher: the oracle of every test and the baseline of every benchmark.

``subscription_matches`` is the reference semantics written plainly (DNF over the message's terms,
a clause holding when its terms all occur and none of its negated terms does; every attribute
predicate holding on the message's attributes (``shard.attributes``); closed rectangles;
haversine circles; polygons by ``shard.polygon``'s exact test at their offset; a region message
matches a region it intersects, a circle against a rectangle by the distance to the rectangle's
nearest point). ``BruteMatcher`` applies it
to every subscription, after a vectorised bounding-box scan that is exact because every region
lies inside its bounding box.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from shard.attributes import all_hold
from shard.errors import NotFoundError
from shard.geometry import haversine_m, region_columns
from shard.model import Message, Point, Polygon, Rect, Region, Subscription
from shard.polygon import polygon_hits
from shard.ranking import WORLD, score


def region_matches(region: Region, location: Point | Rect) -> bool:
    """Does the subscription region meet the message location? O(1).

    >>> region_matches(Rect(0, 0, 1, 1), Point(1, 1))
    True
    """
    if isinstance(location, Point):
        x0 = x1 = location.lon
        y0 = y1 = location.lat
    else:
        x0, y0, x1, y1 = location.min_lon, location.min_lat, location.max_lon, location.max_lat
    if isinstance(region, Polygon):
        dx, dy = region.offset
        kind = 0 if isinstance(location, Point) else 1
        return polygon_hits(region.rings, dx, dy, kind, (x0, y0, x1, y1))
    if isinstance(region, Rect):
        return (
            region.min_lon <= x1
            and x0 <= region.max_lon
            and region.min_lat <= y1
            and y0 <= region.max_lat
        )
    nx = min(max(region.lon, x0), x1)
    ny = min(max(region.lat, y0), y1)
    return haversine_m(region.lon, region.lat, nx, ny) <= region.radius_m


def condition_holds(sub: Subscription, msg: Message) -> bool:
    """The subscription's condition without its region: some clause's terms all occur in the
    message and none of that clause's negated terms does, and every predicate holds.

    >>> s = Subscription("s", (("a",),), Rect(0, 0, 1, 1), negated=(("b",),))
    >>> condition_holds(s, Message("m", ("a",), Point(0, 0))), condition_holds(s, Message("n", ("a", "b"), Point(0, 0)))
    (True, False)
    """
    terms = set(msg.terms)
    neg = sub.negated
    if not any(
        terms.issuperset(clause) and (neg is None or terms.isdisjoint(neg[i]))
        for i, clause in enumerate(sub.clauses)
    ):
        return False
    return not sub.predicates or all_hold(sub.predicates, dict(msg.attributes))


def ranked_score(sub: Subscription, msg: Message) -> float:
    """ψ(s, m) of a ranked subscription (``shard.ranking``) where it is now.

    >>> s = Subscription("s", (("a", "b"),), Rect(0, 0, 2, 2), threshold=0.6, alpha=0.5)
    >>> ranked_score(s, Message("m", ("a",), Point(1, 1)))
    0.75
    """
    r = sub.region
    loc = msg.location
    if isinstance(loc, Point):
        geom, is_point = (loc.lon, loc.lat, loc.lon, loc.lat), True
    else:
        geom, is_point = (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat), False
    return score(
        (r.min_lon, r.min_lat, r.max_lon, r.max_lat),
        sub.clauses[0],
        sub.term_weights,
        sub.alpha,
        set(msg.terms),
        geom,
        is_point,
    )


def subscription_matches(sub: Subscription, msg: Message) -> bool:
    """Reference semantics: the condition holds (``condition_holds``), and the regions meet;
    for a ranked subscription, its predicates hold and the score reaches its threshold.

    >>> s = Subscription("s", (("a", "b"), ("c",)), Rect(0, 0, 1, 1))
    >>> subscription_matches(s, Message("m", ("c", "x"), Point(0.5, 0.5)))
    True
    """
    if sub.threshold is not None:
        return (
            not sub.predicates or all_hold(sub.predicates, dict(msg.attributes))
        ) and ranked_score(sub, msg) >= sub.threshold
    return condition_holds(sub, msg) and region_matches(sub.region, msg.location)


class BruteMatcher:
    """Checks every subscription against every message. Same interface as ``APTree``.

    ``match`` costs O(n) vectorised for the box scan plus O(candidates) exact checks.
    """

    def __init__(self, subs: Iterable[Subscription] = ()) -> None:
        self._subs: dict[str, Subscription] = {}
        for s in subs:
            self._subs[s.id] = s
        self._ids: list[str] = []
        self._boxes = np.zeros((0, 4))
        self._dirty = True

    @classmethod
    def build(cls, subs: Iterable[Subscription], **_options) -> BruteMatcher:
        return cls(subs)

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._subs

    def subscribe(self, sub: Subscription) -> None:
        self._subs[sub.id] = sub
        self._dirty = True

    def unsubscribe(self, sub_id: str) -> None:
        if sub_id not in self._subs:
            raise NotFoundError("subscription", sub_id)
        del self._subs[sub_id]
        self._dirty = True

    def refresh(self, force: bool = False) -> None:
        """Rebuild the columns after changes (``force``: even without, to time a build)."""
        if not (self._dirty or force):
            return
        self._ids = list(self._subs)
        boxes = np.empty((len(self._ids), 4))
        for i, sid in enumerate(self._ids):
            sub = self._subs[sid]
            # a ranked subscription may match outside its region (on its terms alone)
            boxes[i] = WORLD if sub.threshold is not None else region_columns(sub.region)[1]
        self._boxes = boxes
        self._dirty = False

    def match(self, msg: Message) -> list[str]:
        """Ids of every subscription ``msg`` matches."""
        self.refresh()
        loc = msg.location
        if isinstance(loc, Point):
            x0 = x1 = loc.lon
            y0 = y1 = loc.lat
        else:
            x0, y0, x1, y1 = loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat
        b = self._boxes
        hit = np.flatnonzero((b[:, 0] <= x1) & (b[:, 2] >= x0) & (b[:, 1] <= y1) & (b[:, 3] >= y0))
        subs = self._subs
        ids = self._ids
        return [ids[i] for i in hit.tolist() if subscription_matches(subs[ids[i]], msg)]

    def match_batch(self, messages: Sequence[Message]) -> list[list[str]]:
        return [self.match(m) for m in messages]
