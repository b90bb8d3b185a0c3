"""The brute-force top-k oracle (paper 001, Sect. 3.2 and the SCAN baseline of Sect. 6.1).

* ``reference_topk``: plain Python over the model objects (``shard.topk.model.score``), no
  interning, no columns -- the independent definition the tests hold every index to.
* ``BruteTopK``: the same scan compiled over ``SubColumns`` (the paper's SCAN): every live
  subscription scored exactly, the k best kept (with the k-th's ties) -- the baseline of
  ``geopubsub bench topk`` and the oracle it checks a sample against.

Where the paper is ambiguous
----------------------------
* SCAN is only named ("a sequential scan"); ours is the exact scan with the shared tie rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from numba import njit

from shard.topk.base import TopKIndex
from shard.topk.kernels import batch_scratch, emit, offer, reserve, score_slot, threshold
from shard.topk.model import DEFAULT_MAX_DIST, TopKEvent, TopKSubscription, ranked, score


def reference_topk(
    subs: Iterable[TopKSubscription],
    event: TopKEvent,
    k: int,
    max_dist: float = DEFAULT_MAX_DIST,
) -> list[tuple[str, float]]:
    """The top ``k`` of ``subs`` for ``event`` by (−ψ, id), in plain Python. O(n log n).

    >>> from shard.topk.model import subscription_from_dict, event_from_dict
    >>> subs = [subscription_from_dict({"id": i, "predicates": [{"attr": "a", "op": "=",
    ...     "value": v}], "alpha": 0.0, "point": [0, 0]}) for i, v in (("x", 1), ("y", 2))]
    >>> reference_topk(subs, event_from_dict({"id": "e", "attributes": {"a": 2},
    ...     "point": [0, 0]}), 2)
    [('y', 1.0), ('x', 0.0)]
    """
    return ranked([(s.id, score(s, event, max_dist)) for s in subs], k)


_CHUNK = 4096
"""Slots scanned between two checks of the candidate buffer's room."""


@njit(cache=True)
def brute_kernel(live, n_keys, e_off, e_key, e_val, e_x, e_y, k, max_dist, cols):
    """SCAN: score every live slot for every event of the batch; per event keep the top k and
    the k-th's ties. Returns (offsets, slots, scores, subscriptions scored). O(events x predicates)."""
    ne = e_x.shape[0]
    ev_stamp, ev_val, top, out_off, out_slot, out_score, buf_slot, buf_score = batch_scratch(
        n_keys, k, ne
    )
    n_scored = 0
    nout = 0
    for q in range(ne):
        stamp = q + 1
        for i in range(e_off[q], e_off[q + 1]):
            ev_stamp[e_key[i]] = stamp
            ev_val[e_key[i]] = e_val[i]
        ntop = 0
        nbuf = 0
        n = live.shape[0]
        for c0 in range(0, n, _CHUNK):
            c1 = min(c0 + _CHUNK, n)
            buf_slot, buf_score, nbuf = reserve(
                buf_slot, buf_score, nbuf, c1 - c0, threshold(top, ntop, k)
            )
            for s in range(c0, c1):
                if not live[s]:
                    continue
                v = score_slot(s, ev_stamp, ev_val, stamp, e_x[q], e_y[q], max_dist, cols)
                n_scored += 1
                ntop = offer(top, ntop, k, v)
                if v >= threshold(top, ntop, k):
                    buf_slot[nbuf] = s
                    buf_score[nbuf] = v
                    nbuf += 1
        out_slot, out_score, nout = emit(
            out_slot, out_score, nout, buf_slot, buf_score, nbuf, threshold(top, ntop, k)
        )
        out_off[q + 1] = nout
    return out_off, out_slot[:nout], out_score[:nout], n_scored


class BruteTopK(TopKIndex):
    """Exact top-k by scanning every subscription (compiled). ``subscribe`` / ``unsubscribe``
    are O(predicates); a query is O(subscriptions x predicates)."""

    name = "brute"

    def _kernel(self, enc, k: int):
        c = self.columns
        e_off, e_key, e_val, e_x, e_y = enc
        return brute_kernel(
            c.live[: len(c.ids)],
            len(c.keys),
            e_off,
            e_key,
            e_val,
            e_x,
            e_y,
            k,
            self.max_dist,
            c.kernel_columns(),
        )
