"""Subscriptions counted on a grid: where they are, for an operator's density map
(``GetDensity``).

A subscription counts once, in the cell that holds its region's centre (a rectangle's middle, a
circle's centre; a moving subscription's current one). A subscription that spans several
partition parts is held by each of their shards, so a shard counts only the subscriptions whose
centre its own part owns (``own``: its part's box, half-open like ``PartitionMap.owner``): the
part owning the centre always holds the subscription (the centre lies in its region), so the
shards' grids add up to each subscription exactly once.

Cells are half-open too: cell (col, row) covers [x0 + col·w, x0 + (col+1)·w) × [y0 + row·h, …),
the view's east and north edges belonging to the last column and row. One pass over the slots,
compiled: ~5 ms a million subscriptions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.errors import ValidationError
from shard.geometry import KIND_CIRCLE

WORLD = (-180.0, -90.0, 180.0, 90.0)
MAX_SIDE = 1024
"""Columns or rows of a density grid at most (a limit, docs/LIMITS.md)."""
MAX_CELLS = 262_144
"""Cells of a density grid at most: 1 MiB of counts."""
DEFAULT_GRID = (360, 180)
"""A grid asked with 0 columns and 0 rows: one degree a cell over the world."""


def grid_shape(cols: int, rows: int) -> tuple[int, int]:
    """The grid asked for, checked: (0, 0) means ``DEFAULT_GRID``.

    >>> grid_shape(0, 0), grid_shape(4, 2)
    ((360, 180), (4, 2))
    >>> grid_shape(2000, 1)
    Traceback (most recent call last):
    ...
    shard.errors.ValidationError: cols=2000: must be in [1, 1024]
    """
    if cols == 0 and rows == 0:
        return DEFAULT_GRID
    for name, v in (("cols", cols), ("rows", rows)):
        if not 1 <= v <= MAX_SIDE:
            raise ValidationError(name, v, f"must be in [1, {MAX_SIDE}]")
    if cols * rows > MAX_CELLS:
        raise ValidationError("cols", cols, f"cols x rows = {cols * rows} is over {MAX_CELLS:,}")
    return cols, rows


def count_centres(
    store, own, view, cols: int, rows: int, term: int, bbox: np.ndarray | None = None
) -> np.ndarray:
    """The grid (``rows * cols`` counts, row by row from the south-west) of the stored
    subscriptions whose centre ``own`` owns and ``view`` holds; ``term`` >= 0: only those whose
    condition names that term id, -1: all. ``bbox``: the boxes to take rectangles' centres
    from, when not the store's own (``ResidualIndex.centre_boxes``)."""
    return _count(
        store.kind,
        store.bbox if bbox is None else bbox,
        store.circ,
        store.first_clause,
        store.n_clauses,
        store.cl_off,
        store.cl_len,
        store.terms,
        int(store.n_slots),
        np.asarray(own, np.float64),
        np.asarray(view, np.float64),
        cols,
        rows,
        term,
    )


@njit(cache=True, nogil=True)
def _count(kind, bbox, circ, first, ncl, cl_off, cl_len, terms, n, own, view, cols, rows, term):  # fmt: skip
    out = np.zeros(rows * cols, np.uint32)
    east, north = own[2] >= WORLD[2], own[3] >= WORLD[3]
    x0, y0, x1, y1 = view[0], view[1], view[2], view[3]
    w = (x1 - x0) / cols
    h = (y1 - y0) / rows
    for s in range(n):
        k = ncl[s]
        if k == 0:  # a free slot
            continue
        if kind[s] == KIND_CIRCLE:
            cx, cy = circ[s, 0], circ[s, 1]
        else:
            cx = 0.5 * (bbox[s, 0] + bbox[s, 2])
            cy = 0.5 * (bbox[s, 1] + bbox[s, 3])
        if not (own[0] <= cx and (cx < own[2] or east) and own[1] <= cy and (cy < own[3] or north)):
            continue
        if not (x0 <= cx <= x1 and y0 <= cy <= y1):
            continue
        if term >= 0:
            found = False
            for c in range(first[s], first[s] + k):
                for i in range(cl_off[c], cl_off[c] + cl_len[c]):
                    if terms[i] == term:
                        found = True
                        break
                if found:
                    break
            if not found:
                continue
        col = min(int((cx - x0) / w), cols - 1) if w > 0 else 0
        row = min(int((cy - y0) / h), rows - 1) if h > 0 else 0
        out[row * cols + col] += 1
    return out
