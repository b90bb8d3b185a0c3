"""Compiled pieces every top-k index shares (paper 001, Sect. 3.1 and 5.2): the exact score ψ
of one subscription slot (Eq. 1-4, bit-identical to ``shard.topk.model.score``), the spatial
bound (Eq. 6), the closed form of the combined bound (Eq. 8), the running top-k threshold and
the candidate buffer that keeps ties exact. The exact check of one predicate, ``holds``, is
``shard.predicates``'s (shared with boolean subscriptions).

Ties are kept exact without comparing string ids in compiled code: a search keeps the k best
scores in a min-heap (``offer``; its root is the threshold τ once it holds k) and puts every
scored subscription with ψ ≥ τ (τ at that moment) in a buffer. τ only grows, so what was left
out is below the final τ; ``emit`` keeps the buffered ones ≥ the final τ -- the top k plus
every subscription tied with the k-th -- and Python orders them by (−ψ, id) and cuts at k.

Bounds are compared with a slack (``BOUND_SLACK``): the bounds are sums of weights premultiplied
by (1 − α) (the paper's Sect. 5.1), the scores multiply the sum, and the two may differ in the
last bits; a node or list is dropped only when its bound is below τ − slack.

Where the paper is ambiguous
----------------------------
* Eq. 8 assumes UB_s ∈ [0, 1]; with ψ_s clamped at 0 (``shard.topk.model``) UB_s is clamped
  too, which keeps it a bound (``max(0, ·)`` is monotone).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shard.predicates import holds

BOUND_SLACK = 1e-9
"""Slack of every pruning test (scores are in [0, 1]; rounding differences are ~1e-16)."""


@njit(cache=True, inline="always")
def score_slot(s, ev_stamp, ev_val, stamp, ex, ey, max_dist, cols):
    """ψ(e, s) of Eq. 1 for slot ``s``; the event's attribute values are ``ev_val[key]`` where
    ``ev_stamp[key] == stamp``. The same operations in the same order as
    ``shard.topk.model.score``. O(predicates of s)."""
    x, y, alpha, pstart, plen, p_key, p_op, p_a, p_b, p_w, p_sstart, p_slen, set_vals = cols
    psi_t = 0.0
    for j in range(pstart[s], pstart[s] + plen[s]):  # Eq. 2: event attributes only
        key = p_key[j]
        if ev_stamp[key] != stamp:
            continue
        if holds(p_op[j], ev_val[key], p_a[j], p_b[j], set_vals, p_sstart[j], p_slen[j]):
            psi_t += p_w[j]
    dx = ex - x[s]
    dy = ey - y[s]
    psi_s = 1.0 - np.sqrt(dx * dx + dy * dy) / max_dist  # Eq. 4, clamped at 0
    if psi_s < 0.0:
        psi_s = 0.0
    return (1.0 - alpha[s]) * psi_t + alpha[s] * psi_s  # Eq. 1


@njit(cache=True, inline="always")
def spatial_bound(ex, ey, x0, y0, x1, y1, max_dist):
    """UB_s of Eq. 6: 1 − MinDist(e, rectangle) / MaxDist, clamped at 0. O(1)."""
    dx = 0.0
    if ex < x0:
        dx = x0 - ex
    elif ex > x1:
        dx = ex - x1
    dy = 0.0
    if ey < y0:
        dy = y0 - ey
    elif ey > y1:
        dy = ey - y1
    u = 1.0 - np.sqrt(dx * dx + dy * dy) / max_dist
    return u if u > 0.0 else 0.0


@njit(cache=True, inline="always")
def combined_bound(ubt, ubs, amin, amax):
    """UB of Eq. 8 (the closed form of Eq. 7's max over α ∈ [α_min, α_max]). O(1)."""
    c = 1.0 - ubt
    if amin >= c:
        return 1.0 - amin + amin * ubs
    if amax <= c:
        return amax * ubs + ubt
    return c * ubs + ubt


@njit(cache=True, inline="always")
def offer(top, n, k, s):
    """Offer score ``s`` to the min-heap ``top[:n]`` of the best ``k`` scores; returns the new
    size. O(log k)."""
    if n < k:
        i = n
        top[i] = s
        n += 1
        while i > 0:
            p = (i - 1) >> 1
            if top[p] <= top[i]:
                break
            top[p], top[i] = top[i], top[p]
            i = p
        return n
    if s > top[0]:
        top[0] = s
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and top[c + 1] < top[c]:
                c += 1
            if top[i] <= top[c]:
                break
            top[i], top[c] = top[c], top[i]
            i = c
    return n


@njit(cache=True, inline="always")
def threshold(top, n, k):
    """τ: the k-th best score so far, −inf while fewer than k were offered."""
    return top[0] if n >= k else -np.inf


@njit(cache=True)
def batch_scratch(n_keys, k, ne):
    """What every top-k kernel allocates for a batch of ``ne`` events: the event's attribute
    stamps and values per key, the top-k heap, the output offsets, the output and the tie
    buffer (growable). Returns (ev_stamp, ev_val, top, out_off, out_slot, out_score, buf_slot,
    buf_score)."""
    return (
        np.zeros(max(n_keys, 1), np.int64),
        np.zeros(max(n_keys, 1)),
        np.empty(k),
        np.zeros(ne + 1, np.int64),
        np.empty(16, np.int64),
        np.empty(16),
        np.empty(16, np.int64),
        np.empty(16),
    )


@njit(cache=True)
def grown_i(a, n):
    b = np.empty(max(2 * n, 16), a.dtype)
    b[:n] = a[:n]
    return b


@njit(cache=True)
def grown_f(a, n):
    b = np.empty(max(2 * n, 16), a.dtype)
    b[:n] = a[:n]
    return b


@njit(cache=True)
def reserve(buf_slot, buf_score, nbuf, need, tau):
    """Make room for ``need`` more candidates: drop the buffered ones below ``tau`` (they can
    no longer be in the answer), then grow if still short. Returns (slots, scores, length).
    Called outside the hot loops, which then append without reallocating (a reassigned array
    in a loop costs numba reference counting on every iteration). O(nbuf)."""
    if nbuf + need <= buf_slot.shape[0]:
        return buf_slot, buf_score, nbuf
    kept = 0
    for i in range(nbuf):
        if buf_score[i] >= tau:
            buf_slot[kept] = buf_slot[i]
            buf_score[kept] = buf_score[i]
            kept += 1
    if kept + need > buf_slot.shape[0]:
        cap = max(2 * buf_slot.shape[0], kept + need)
        new_slot = np.empty(cap, np.int64)
        new_score = np.empty(cap)
        new_slot[:kept] = buf_slot[:kept]
        new_score[:kept] = buf_score[:kept]
        return new_slot, new_score, kept
    return buf_slot, buf_score, kept


@njit(cache=True)
def emit(out_slot, out_score, nout, buf_slot, buf_score, nbuf, tau):
    """Append the buffered candidates with ψ ≥ τ to the output; returns the output arrays (grown
    when needed) and their new length. O(nbuf)."""
    for i in range(nbuf):
        if buf_score[i] >= tau:
            if nout == out_slot.shape[0]:
                out_slot = grown_i(out_slot, nout)
                out_score = grown_f(out_score, nout)
            out_slot[nout] = buf_slot[i]
            out_score[nout] = buf_score[i]
            nout += 1
    return out_slot, out_score, nout


@njit(cache=True)
def pq_reserve(keys, vals, n, need):
    """Room for ``need`` more pushes on the heap (grown outside the hot loop, as ``reserve``)."""
    if n + need <= keys.shape[0]:
        return keys, vals
    cap = max(2 * keys.shape[0], n + need)
    new_keys = np.empty(cap)
    new_vals = np.empty(cap, np.int64)
    new_keys[:n] = keys[:n]
    new_vals[:n] = vals[:n]
    return new_keys, new_vals


@njit(cache=True, inline="always")
def pq_push(keys, vals, n, key, val):
    """Push onto the max-heap ``keys[:n]`` (payload ``vals``; room reserved by ``pq_reserve``);
    returns n + 1. O(log n)."""
    i = n
    keys[i] = key
    vals[i] = val
    while i > 0:
        p = (i - 1) >> 1
        if keys[p] >= keys[i]:
            break
        keys[p], keys[i] = keys[i], keys[p]
        vals[p], vals[i] = vals[i], vals[p]
        i = p
    return n + 1


@njit(cache=True, inline="always")
def pq_pop(keys, vals, n):
    """Remove the maximum of the max-heap ``keys[:n]``; returns (key, val, n − 1)."""
    key = keys[0]
    val = vals[0]
    n -= 1
    keys[0] = keys[n]
    vals[0] = vals[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and keys[c + 1] > keys[c]:
            c += 1
        if keys[i] >= keys[c]:
            break
        keys[i], keys[c] = keys[c], keys[i]
        vals[i], vals[c] = vals[c], vals[i]
        i = c
    return key, val, n
