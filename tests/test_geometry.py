"""Geometry: haversine, conservative circle bounding boxes, region predicates."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shard.applus.moves import recentre_columns
from shard.applus.tree import recentre
from shard.geometry import (
    circle_bbox,
    haversine_m,
    region_columns,
    region_hits_point,
    region_hits_rect,
)
from shard.model import Circle, Point, Rect


def test_haversine_known_values():
    assert abs(haversine_m(0, 0, 0, 1) - math.pi / 180 * 6_371_008.8) < 1e-6
    assert haversine_m(12.5, 41.9, 12.5, 41.9) == 0.0
    assert abs(haversine_m(0, 0, 180, 0) - math.pi * 6_371_008.8) < 1e-3
    assert abs(haversine_m(179.5, 0, -179.5, 0) - haversine_m(0, 0, 1, 0)) < 1e-6


@given(
    lon=st.floats(-180, 180),
    lat=st.floats(-89.9, 89.9),
    r=st.floats(1.0, 2e7),
    bearing=st.floats(0, 2 * math.pi),
    frac=st.floats(0, 1),
)
def test_circle_bbox_contains_every_point_of_the_circle(lon, lat, r, bearing, frac):
    # destination point at distance frac*r along bearing
    d = frac * r / 6_371_008.8
    p1, l1 = math.radians(lat), math.radians(lon)
    p2 = math.asin(math.sin(p1) * math.cos(d) + math.cos(p1) * math.sin(d) * math.cos(bearing))
    l2 = l1 + math.atan2(
        math.sin(bearing) * math.sin(d) * math.cos(p1), math.cos(d) - math.sin(p1) * math.sin(p2)
    )
    plon = (math.degrees(l2) + 540) % 360 - 180
    plat = math.degrees(p2)
    if haversine_m(lon, lat, plon, plat) > r:
        return  # rounding put it just outside: nothing to check
    x0, y0, x1, y1 = circle_bbox(lon, lat, r)
    assert x0 <= plon <= x1 and y0 <= plat <= y1


def test_circle_bbox_goes_full_longitude_at_antimeridian_and_poles():
    assert circle_bbox(179.9, 0, 50_000)[0] == -180 and circle_bbox(179.9, 0, 50_000)[2] == 180
    b = circle_bbox(0, 89.9, 50_000)
    assert b[0] == -180 and b[2] == 180 and b[3] == 90


def test_region_predicates():
    box = np.array([0.0, 0.0, 1.0, 1.0])
    none = np.zeros(3)
    assert region_hits_point(0, box, none, 1.0, 1.0)
    assert not region_hits_point(0, box, none, 1.0000001, 1.0)
    assert region_hits_rect(0, box, none, np.array([1.0, 1.0, 2.0, 2.0]))
    circ = np.array([0.0, 0.0, 111_195.0])
    cb = np.array(circle_bbox(0.0, 0.0, 111_195.0))
    assert region_hits_point(1, cb, circ, 0.0, 0.99)
    assert not region_hits_point(1, cb, circ, 0.9, 0.9)
    assert region_hits_rect(1, cb, circ, np.array([0.5, -0.5, 3.0, 0.5]))
    assert not region_hits_rect(1, cb, circ, np.array([0.8, 0.8, 3.0, 3.0]))


_lon = st.floats(-180.0, 180.0, allow_nan=False)
_lat = st.floats(-90.0, 90.0, allow_nan=False)


@st.composite
def _regions(draw):
    if draw(st.booleans()):
        return Circle(draw(_lon), draw(_lat), draw(st.floats(1.0, 2_000_000.0)))
    x0, x1 = sorted((draw(_lon), draw(_lon)))
    y0, y1 = sorted((draw(_lat), draw(_lat)))
    return Rect(x0, y0, x1, y1)


@given(_regions(), _lon, _lat)
def test_the_python_and_the_compiled_recentring_agree(region, lon, lat):
    """A move is re-centred twice: by the coordinator (``recentre``, to route it and to report
    the new region) and by the shard (``recentre_columns``, in the store's columns): the two
    must give the very same region, or the shard and the coordinator disagree on where it is."""
    kind, bbox, circ = region_columns(region)
    K = np.array([kind], np.int8)
    B = np.array([bbox], np.float64)
    C = np.array([circ], np.float64)
    recentre_columns(K, B, C, 0, lon, lat)
    want_kind, want_bbox, want_circ = region_columns(recentre(region, Point(lon, lat)))
    assert K[0] == want_kind
    assert tuple(B[0]) == want_bbox
    assert tuple(C[0]) == want_circ
