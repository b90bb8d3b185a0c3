"""The spatial partition map: a balanced k-d partition of the world, one part per shard.

Built from a sample of locations (subscription centres, say): each split cuts the sample at the
quantile that gives both sides a share of the sample proportional to their number of parts, on
the axis where the box is wider (in degrees). Every part is a closed box; parts tile the world.

Routing rules (the coordinator and the loader use this module, so they agree):

- a point belongs to exactly one part, ``owner(lon, lat)``: boxes are half-open on their upper
  sides except at the world's edge;
- a region (a subscription's or a message's bounding box) goes to every part whose closed box it
  meets, ``overlapping(bbox)``. If a subscription matches a message, some point lies in both
  regions; the part owning that point holds both. Parts that hold a pair may both report it, so
  the coordinator de-duplicates deliveries of messages sent to several parts.

>>> pm = PartitionMap.build([(-10.0, 0.0), (10.0, 0.0), (20.0, 5.0), (-20.0, 5.0)], 2)
>>> pm.owner(-50.0, 0.0), pm.owner(50.0, 0.0)
(0, 1)
>>> pm.overlapping((-1.0, -1.0, 1.0, 1.0))
[0, 1]
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from shard.errors import ValidationError

WORLD = (-180.0, -90.0, 180.0, 90.0)
MAX_PARTS = 1024
"""Upper bound on shards (a limit, see docs/LIMITS.md)."""
DEFAULT_SAMPLE = 200_000
"""Subscription centres a map is built from (the coordinator samples its subscriptions evenly,
the bulk loader at random): enough for quantiles to within ~0.2 % of the share of a part."""


class PartitionMap:
    """Parts as an array of boxes ``(n, 4)`` = (min_lon, min_lat, max_lon, max_lat)."""

    def __init__(self, boxes: np.ndarray) -> None:
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        if not 1 <= boxes.shape[0] <= MAX_PARTS:
            raise ValidationError("parts", boxes.shape[0], f"must be in [1, {MAX_PARTS}]")
        self.boxes = boxes
        self._rows = [tuple(float(v) for v in row) for row in boxes]

    def __len__(self) -> int:
        return self.boxes.shape[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionMap) and np.array_equal(self.boxes, other.boxes)

    def __repr__(self) -> str:
        return f"PartitionMap({len(self)} parts)"

    @classmethod
    def build(cls, sample: Sequence[tuple[float, float]] | np.ndarray, parts: int) -> PartitionMap:
        """Balanced k-d partition of the world into ``parts`` boxes from sample locations.
        O(s log s · log parts) for s sample points; an empty sample splits space evenly."""
        if not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS:
            raise ValidationError("parts", parts, f"must be an integer in [1, {MAX_PARTS}]")
        pts = np.asarray(sample, np.float64).reshape(-1, 2)
        boxes: list[tuple[float, float, float, float]] = []
        _split(pts, WORLD, parts, boxes)
        return cls(np.array(boxes))

    def owner(self, lon: float, lat: float) -> int:
        """The one part that owns the point (as ``owners``, without numpy's per-call cost: the
        coordinator asks once per published message). O(parts)."""
        for k, (x0, y0, x1, y1) in enumerate(self._rows):
            if (
                x0 <= lon
                and (lon < x1 or x1 >= WORLD[2])
                and y0 <= lat
                and (lat < y1 or y1 >= WORLD[3])
            ):
                return k
        return int(self.owners(np.array([[lon, lat]]))[0])  # raises: outside the world

    def owners(self, points: np.ndarray) -> np.ndarray:
        """Owners of many points ``(n, 2)`` at once. O(n · parts)."""
        p = np.asarray(points, np.float64).reshape(-1, 2)
        b = self.boxes
        x = p[:, 0:1]
        y = p[:, 1:2]
        in_x = (x >= b[:, 0]) & ((x < b[:, 2]) | (b[:, 2] >= WORLD[2]))
        in_y = (y >= b[:, 1]) & ((y < b[:, 3]) | (b[:, 3] >= WORLD[3]))
        hit = in_x & in_y
        if not hit.any(axis=1).all():
            bad = p[~hit.any(axis=1)][0]
            raise ValidationError("point", (float(bad[0]), float(bad[1])), "outside the world")
        return hit.argmax(axis=1)

    def overlapping(self, bbox: Sequence[float]) -> list[int]:
        """Every part whose closed box meets the closed box ``bbox``. O(parts), in plain Python:
        the coordinator asks once per subscription, and numpy's per-call cost on a handful of
        parts was ~6 us of its ~40 us a subscribe (py-spy, docs/BENCHMARKS.md).

        >>> PartitionMap.build([(-10.0, 0.0), (10.0, 0.0)], 2).overlapping((-1.0, 0.0, 1.0, 1.0))
        [0, 1]
        """
        x0, y0, x1, y1 = bbox
        return [
            k
            for k, (a0, b0, a1, b1) in enumerate(self._rows)
            if a0 <= x1 and x0 <= a1 and b0 <= y1 and y0 <= b1
        ]

    def overlapping_many(self, bboxes: np.ndarray) -> list[list[int]]:
        """``overlapping`` of many boxes ``(n, 4)`` at once (the same closed-box test, one
        vectorised pass instead of n small ones). O(n · parts).

        >>> PartitionMap.build([(-10.0, 0.0), (10.0, 0.0)], 2).overlapping_many(
        ...     np.array([[-5.0, 0.0, -4.0, 1.0], [-1.0, 0.0, 1.0, 1.0]]))
        [[0], [0, 1]]
        """
        q = np.asarray(bboxes, np.float64).reshape(-1, 4)
        b = self.boxes
        hit = (
            (b[:, 0] <= q[:, 2:3])
            & (q[:, 0:1] <= b[:, 2])
            & (b[:, 1] <= q[:, 3:4])
            & (q[:, 1:2] <= b[:, 3])
        )
        rows, cols = np.nonzero(hit)
        out: list[list[int]] = [[] for _ in range(q.shape[0])]
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            out[r].append(c)
        return out

    def to_json(self) -> str:
        return json.dumps({"version": 1, "boxes": self.boxes.tolist()})

    @classmethod
    def from_json(cls, text: str) -> PartitionMap:
        d = json.loads(text)
        if d.get("version") != 1:
            raise ValidationError("partition_map.version", d.get("version"), "unknown version")
        return cls(np.array(d["boxes"], np.float64))


def bbox_centre(bbox: Sequence[float]) -> tuple[float, float]:
    """The location a region contributes to a map's sample: the centre of its box (from
    ``shard.geometry.region_bbox``). O(1).

    >>> bbox_centre((0.0, 0.0, 2.0, 4.0))
    (1.0, 2.0)
    """
    x0, y0, x1, y1 = bbox
    return ((x0 + x1) / 2, (y0 + y1) / 2)


def _split(pts: np.ndarray, box, parts: int, out: list) -> None:
    if parts == 1:
        out.append(tuple(float(v) for v in box))
        return
    left = parts // 2
    x0, y0, x1, y1 = box
    axis = 0 if (x1 - x0) >= (y1 - y0) else 1
    lo, hi = (x0, x1) if axis == 0 else (y0, y1)
    inside = pts[(pts[:, axis] >= lo) & (pts[:, axis] <= hi)] if pts.size else pts
    if inside.shape[0] >= 2:
        cut = float(np.quantile(inside[:, axis], left / parts))
        # keep every part non-empty and strictly inside the box
        eps = (hi - lo) * 1e-9
        cut = min(max(cut, lo + eps), hi - eps)
    else:
        cut = lo + (hi - lo) * left / parts
    if axis == 0:
        a, b = (x0, y0, cut, y1), (cut, y0, x1, y1)
        pa, pb = pts[pts[:, 0] < cut], pts[pts[:, 0] >= cut]
    else:
        a, b = (x0, y0, x1, cut), (x0, cut, x1, y1)
        pa, pb = pts[pts[:, 1] < cut], pts[pts[:, 1] >= cut]
    _split(pa, a, left, out)
    _split(pb, b, parts - left, out)
