"""Binary search over a sorted slice of an array, compiled: the one every kernel that looks a
value up in sorted columns shares (the rivals' term lists, the top-k forests, ``in`` lists,
segment-tree coordinates).

>>> import numpy as np
>>> a = np.array([1, 3, 3, 7])
>>> lower_bound(a, 0, 4, 3), lower_bound(a, 0, 4, 4), lower_bound(a, 0, 4, 9), lower_bound(a, 1, 3, 0)
(1, 3, 4, 1)
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def lower_bound(a, lo, hi, v):
    """First index in ``a[lo:hi]`` (ascending) whose value is >= ``v`` (``hi`` if none).
    O(log (hi - lo)). Inlined into each kernel that calls it (a call in the hot loops of TAS
    cost it ~17 %)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo
