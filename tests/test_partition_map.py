"""The spatial partition map's batch look-up agrees with the one-box look-up it vectorises."""

from __future__ import annotations

import random

import numpy as np

from shard.geometry import region_bbox
from shard.model import Circle, Rect
from shard.partition_map import PartitionMap


def test_overlapping_many_is_overlapping_for_each_box():
    rng = random.Random(9)
    pm = PartitionMap.build([(rng.uniform(-50, 50), rng.uniform(-40, 40)) for _ in range(500)], 7)
    boxes = []
    for _ in range(3000):
        # coordinates on the parts' own edges half of the time: the closed-box ties
        x0, x1 = sorted(rng.choice([rng.uniform(-180, 180), *pm.boxes[:, 0]]) for _ in range(2))
        y0, y1 = sorted(rng.choice([rng.uniform(-90, 90), *pm.boxes[:, 1]]) for _ in range(2))
        boxes.append((x0, y0, x1, y1))
    assert pm.overlapping_many(np.array(boxes)) == [pm.overlapping(b) for b in boxes]
    assert pm.overlapping_many(np.empty((0, 4))) == []


def test_owner_of_one_point_is_owners_of_many():
    rng = random.Random(4)
    pm = PartitionMap.build([(rng.uniform(-50, 50), rng.uniform(-40, 40)) for _ in range(500)], 5)
    edges_x = [*pm.boxes[:, 0], *pm.boxes[:, 2], -180.0, 180.0]
    edges_y = [*pm.boxes[:, 1], *pm.boxes[:, 3], -90.0, 90.0]
    pts = [
        (
            rng.choice([rng.uniform(-180, 180), rng.choice(edges_x)]),
            rng.choice([rng.uniform(-90, 90), rng.choice(edges_y)]),
        )
        for _ in range(5000)
    ]
    assert [pm.owner(x, y) for x, y in pts] == pm.owners(np.array(pts)).tolist()


def test_region_bbox_is_the_rect_or_the_circles_conservative_box():
    assert region_bbox(Rect(1.0, 2.0, 3.0, 4.0)) == (1.0, 2.0, 3.0, 4.0)
    x0, y0, x1, y1 = region_bbox(Circle(13.4, 52.5, 1000.0))
    assert x0 < 13.4 < x1 and y0 < 52.5 < y1
    assert region_bbox(Circle(0.0, 89.99, 5000.0))[::2] == (-180.0, 180.0)  # reaches the pole
