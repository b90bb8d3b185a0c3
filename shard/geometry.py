"""Spatial predicates shared by the AP-Tree and the brute-force oracle (one definition of the semantics).

Coordinates are degrees (lon, lat). Rectangles are closed. A circle holds the points whose haversine
distance from its centre on a sphere of radius ``EARTH_RADIUS_M`` is at most its radius. A circle
against a rectangle uses the distance from the centre to the rectangle's nearest point, found by
clamping lon and lat into the rectangle. Every function here is numba-compiled and callable from
Python, so the index and the oracle run literally the same arithmetic.
"""

from __future__ import annotations

import math

from numba import njit

from shard.limits import BBOX_MARGIN_DEG, EARTH_RADIUS_M

KIND_RECT = 0
KIND_CIRCLE = 1


@njit(cache=True)
def haversine_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    """Great-circle distance in metres. O(1).

    >>> round(haversine_m(0.0, 0.0, 0.0, 1.0))
    111195
    """
    p1 = math.radians(lat1)
    p2 = math.radians(lat2)
    dphi = p2 - p1
    dlam = math.radians(lon2 - lon1)
    s1 = math.sin(dphi * 0.5)
    s2 = math.sin(dlam * 0.5)
    a = s1 * s1 + math.cos(p1) * math.cos(p2) * s2 * s2
    if a > 1.0:
        a = 1.0
    return 2.0 * EARTH_RADIUS_M * math.asin(math.sqrt(a))


@njit(cache=True)
def circle_bbox(lon: float, lat: float, radius_m: float) -> tuple[float, float, float, float]:
    """A bounding box (min_lon, min_lat, max_lon, max_lat) that contains the whole circle.

    Full longitude range when the circle reaches a pole or crosses the antimeridian, so such
    circles are supported (indexed conservatively, verified exactly). O(1).

    >>> b = circle_bbox(0.0, 0.0, 111195.0)
    >>> round(b[3], 3)
    1.0
    """
    d = radius_m / EARTH_RADIUS_M  # angular radius, radians
    dlat = math.degrees(d) + BBOX_MARGIN_DEG
    min_lat = lat - dlat
    max_lat = lat + dlat
    full_lon = False
    if d >= 0.5 * math.pi or min_lat <= -90.0 or max_lat >= 90.0:
        full_lon = True
    else:
        s = math.sin(d) / math.cos(math.radians(lat))
        if s >= 1.0:
            full_lon = True
        else:
            dlon = math.degrees(math.asin(s)) + BBOX_MARGIN_DEG
            if lon - dlon < -180.0 or lon + dlon > 180.0:
                full_lon = True
    if full_lon:
        return -180.0, max(min_lat, -90.0), 180.0, min(max_lat, 90.0)
    return lon - dlon, max(min_lat, -90.0), lon + dlon, min(max_lat, 90.0)


@njit(cache=True)
def region_hits_point(kind: int, bbox, circle, px: float, py: float) -> bool:
    """Does a subscription region (``kind``, ``bbox`` = 4 floats, ``circle`` = lon, lat, r) hold the point?"""
    if px < bbox[0] or px > bbox[2] or py < bbox[1] or py > bbox[3]:
        return False
    if kind == KIND_RECT:
        return True
    return haversine_m(circle[0], circle[1], px, py) <= circle[2]


@njit(cache=True)
def region_hits_rect(kind: int, bbox, circle, q) -> bool:
    """Does a subscription region intersect the closed rectangle ``q`` (4 floats)?"""
    if q[2] < bbox[0] or q[0] > bbox[2] or q[3] < bbox[1] or q[1] > bbox[3]:
        return False
    if kind == KIND_RECT:
        return True
    nx = min(max(circle[0], q[0]), q[2])
    ny = min(max(circle[1], q[1]), q[3])
    return haversine_m(circle[0], circle[1], nx, ny) <= circle[2]


@njit(cache=True)
def exact_hit(kind: int, bbox, circle, is_point: bool, x: float, y: float, q) -> bool:
    """After the box test has passed: whether a subscription region holds the point message
    (``x``, ``y``) or meets the region message's rectangle ``q``, exactly (only a circle needs
    more than its box)."""
    if kind != KIND_CIRCLE:
        return True
    if is_point:
        return haversine_m(circle[0], circle[1], x, y) <= circle[2]
    return region_hits_rect(kind, bbox, circle, q)


def region_columns(
    region,
) -> tuple[int, tuple[float, float, float, float], tuple[float, float, float]]:
    """(kind, bbox, circle) of a ``Rect``, ``Circle`` or ``Polygon``: circles are indexed by a
    conservative box, a polygon as the rectangle of its ``box`` (the indexes' superset; the
    exact test is ``shard.polygon``'s, where the subscription's other conditions are checked).

    >>> from shard.model import Circle
    >>> region_columns(Circle(0.0, 0.0, 1000.0))[0]
    1
    """
    box = getattr(region, "box", None)
    if box is not None:  # a Polygon
        return KIND_RECT, (box[0], box[1], box[2], box[3]), (0.0, 0.0, 0.0)
    if not hasattr(region, "radius_m"):  # a Rect (no import of the model on this hot path)
        return (
            KIND_RECT,
            (region.min_lon, region.min_lat, region.max_lon, region.max_lat),
            (0.0, 0.0, 0.0),
        )
    bb = circle_bbox(region.lon, region.lat, region.radius_m)
    return KIND_CIRCLE, (bb[0], bb[1], bb[2], bb[3]), (region.lon, region.lat, region.radius_m)


def region_bbox(region) -> tuple[float, float, float, float]:
    """The box (min_lon, min_lat, max_lon, max_lat) a subscription region is indexed and routed
    by: a ``Rect`` itself, a ``Circle``'s conservative ``circle_bbox``. The coordinator and the
    bulk loader place subscriptions on shards with it (``PartitionMap.overlapping``). O(1).

    >>> from shard.model import Rect
    >>> region_bbox(Rect(0.0, 1.0, 2.0, 3.0))
    (0.0, 1.0, 2.0, 3.0)
    """
    return region_columns(region)[1]


def location_bbox(loc) -> tuple[float, float, float, float]:
    """The box of a message's location: a ``Point`` as a degenerate box, a ``Rect`` itself.
    The coordinator routes a message to the shards this box meets. O(1).

    >>> from shard.model import Point, Rect
    >>> location_bbox(Point(1.0, 2.0)), location_bbox(Rect(0.0, 1.0, 2.0, 3.0))
    ((1.0, 2.0, 1.0, 2.0), (0.0, 1.0, 2.0, 3.0))
    """
    lon = getattr(loc, "lon", None)
    if lon is not None:
        return (lon, loc.lat, lon, loc.lat)
    return (loc.min_lon, loc.min_lat, loc.max_lon, loc.max_lat)


def location_centre(loc) -> tuple[float, float]:
    """A message location's centre: a point itself, a rectangle's middle.

    >>> from shard.model import Point, Rect
    >>> location_centre(Point(1.0, 2.0)), location_centre(Rect(0.0, 1.0, 2.0, 3.0))
    ((1.0, 2.0), (1.0, 2.0))
    """
    x0, y0, x1, y1 = location_bbox(loc)
    return (x0 + x1) / 2, (y0 + y1) / 2


def region_centre(region) -> tuple[float, float]:
    """The point a moving subscription's region is centred on (``recentre`` puts it there): a
    circle's centre, a rectangle's middle.

    >>> from shard.model import Circle, Rect
    >>> region_centre(Rect(0.0, 1.0, 2.0, 3.0)), region_centre(Circle(179.9, 0.0, 50_000.0))
    ((1.0, 2.0), (179.9, 0.0))
    """
    lon = getattr(region, "lon", None)
    if lon is not None:
        return lon, region.lat
    box = getattr(region, "box", None)
    if box is not None:  # a Polygon: its box's centre
        return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return (region.min_lon + region.max_lon) / 2, (region.min_lat + region.max_lat) / 2
