"""Moving subscription processing for a batch of location updates in one compiled call (Alg. 6).

Per move: re-centre the region, then walk the subscription's clauses from the root with the old
and the new box together (``move_clauses``): where both lead to the same child the clause stays
and its leaves (its nodelist) only get the new box; where they part, it leaves the old region's
leaves and enters the new one's (filling leaves it creates from the parking lists). Then check
the messages on the m-lists of both sets of leaves and their ancestors against the old and the
new form
(``diff_results``). Leaf splits and collapses the batch calls for are returned, to be done once
at its end.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from shard.applus.mlists import diff_results, ensure_rows, repair_created
from shard.aptree.layout import T_NI
from shard.aptree.maintain import int_list, move_clauses
from shard.geometry import KIND_CIRCLE, circle_bbox


@njit(cache=True)
def clause_form(S, s, fc, ncl):
    """Subscription s's clauses as (offsets, terms) from the store columns."""
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    k = ncl[s]
    off = np.zeros(k + 1, np.int64)
    for i in range(k):
        off[i + 1] = off[i] + cl_len[fc[s] + i]
    out = np.empty(off[k], np.int32)
    for i in range(k):
        c = fc[s] + i
        out[off[i] : off[i + 1]] = terms[cl_off[c] : cl_off[c] + cl_len[c]]
    return off, out


@njit(cache=True)
def recentre_columns(kind, bbox, circ, s, px, py):
    """Move subscription s's region so that its centre is (px, py), in the store columns: a rect
    keeps width and height (shifted back inside the world), a circle its radius."""
    if kind[s] == KIND_CIRCLE:
        circ[s, 0] = px
        circ[s, 1] = py
        b = circle_bbox(px, py, circ[s, 2])
        bbox[s, 0] = b[0]
        bbox[s, 1] = b[1]
        bbox[s, 2] = b[2]
        bbox[s, 3] = b[3]
        return
    w = bbox[s, 2] - bbox[s, 0]
    h = bbox[s, 3] - bbox[s, 1]
    x0 = min(max(px - w / 2, -180.0), 180.0 - w)
    y0 = min(max(py - h / 2, -90.0), 90.0 - h)
    bbox[s, 0] = x0
    bbox[s, 1] = y0
    bbox[s, 2] = x0 + w
    bbox[s, 3] = y0 + h


@njit(cache=True)
def move_batch_kernel(T, S, MT, MS, params, fc, ncl, slots, px, py, NSTAMP, MSTAMP, stamp, TM, ts):
    """Apply the moves (slot, px, py) in order. Returns (tree, m-lists, node stamps, move index,
    message slot and sign of every update, nodes to rebuild, last stamp, last term stamp)."""
    kind = S[0]
    bbox = S[1]
    circ = S[2]
    todo = int_list()
    o_q = List()
    o_x = List()
    o_g = List()
    o_q.append(np.int64(0))
    o_q.pop()
    o_x.append(np.int32(0))
    o_x.pop()
    o_g.append(np.int8(0))
    o_g.pop()
    for i in range(slots.shape[0]):
        s = slots[i]
        clauses = np.arange(fc[s], fc[s] + ncl[s]).astype(np.int32)
        off, terms = clause_form(S, s, fc, ncl)
        o_kind = kind[s]
        o_bbox = bbox[s].copy()
        o_circ = circ[s].copy()
        recentre_columns(kind, bbox, circ, s, px[i], py[i])
        T, todo1, old_leaves, new_leaves, created = move_clauses(T, S, params, clauses, o_bbox)
        MT = ensure_rows(MT, T[T_NI].shape[0])
        if NSTAMP.shape[0] < T[T_NI].shape[0]:
            n2 = np.zeros(T[T_NI].shape[0], np.int64)
            n2[: NSTAMP.shape[0]] = NSTAMP
            NSTAMP = n2
        if created.shape[0]:
            MT = repair_created(T, MT, MS, created)
        leaves = np.concatenate((old_leaves, new_leaves))
        stamp += 1
        xs, gs, ts = diff_results(
            T,
            MT,
            MS,
            leaves,
            NSTAMP,
            MSTAMP,
            stamp,
            TM,
            ts,
            True,
            off,
            terms,
            o_kind,
            o_bbox,
            o_circ,
            True,
            off,
            terms,
            kind[s],
            bbox[s],
            circ[s],
        )
        for j in range(xs.shape[0]):
            o_q.append(i)
            o_x.append(xs[j])
            o_g.append(gs[j])
        for u in todo1:
            todo.append(u)
    n = len(o_q)
    aq = np.empty(n, np.int64)
    ax = np.empty(n, np.int32)
    ag = np.empty(n, np.int8)
    for j in range(n):
        aq[j] = o_q[j]
        ax[j] = o_x[j]
        ag[j] = o_g[j]
    at = np.empty(len(todo), np.int64)
    for j in range(len(todo)):
        at[j] = todo[j]
    return T, MT, NSTAMP, aq, ax, ag, np.unique(at), stamp, ts
