"""``check_mlists``: the m-list invariants of an AP+-Tree, asserted (slow; for tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shard.applus.mlists import FIX_DEG, NO_POINT
from shard.aptree.layout import C_NODES, F_PARENT, F_TYPE, FREED, LEAF, T_CNT, T_NI

if TYPE_CHECKING:
    from shard.applus.tree import APPlusTree


def _fixed(box) -> tuple[int, int]:
    if box[0] == box[2] and box[1] == box[3]:
        return int(round(box[0] / FIX_DEG)), int(round(box[1] / FIX_DEG))
    return NO_POINT, NO_POINT


def check_mlists(tree: APPlusTree) -> None:
    """Assert:

    * list slices lie inside the pool and do not overlap; freed nodes hold no entry;
    * every entry names a stored message slot;
    * completeness: every live message whose traversal of the current tree reaches a leaf is on
      the m-list of that leaf or of one of its ancestors.
    """
    tree.sync()  # the m-list rows follow the node array lazily
    T = tree.arrays
    ML, MP, MC = tree.mlists
    NI = T[T_NI]
    n_nodes = int(T[T_CNT][C_NODES])
    msgs = tree.msgs
    on: dict[int, set[int]] = {}
    spans = []
    for u in range(n_nodes):
        for which in (0, 3):
            off, n, cap = (int(v) for v in ML[u, which : which + 3])
            assert 0 <= n <= cap, f"node {u} list {which}: len {n} cap {cap}"
            assert off + cap <= int(MC[0]) or cap == 0, f"node {u} list {which} outside the pool"
            if cap:
                spans.append((off, off + cap))
            if NI[u, F_TYPE] == FREED:
                assert n == 0, f"freed node {u} holds entries"
            entries = MP[off : off + n, 0].tolist()
            for x in entries:
                assert 0 <= x < msgs.n_slots, f"node {u}: bad slot {x}"
            for k, x in enumerate(entries):  # a live message's point, in fixed point
                if msgs.alive[x]:
                    assert tuple(MP[off + k, 1:]) == _fixed(msgs.geom[x]), (
                        f"node {u}: pool location of slot {x} is stale: {MP[off + k]}"
                    )
            if which == 0:
                on[u] = set(entries)
    spans.sort()
    for (a0, a1), (b0, _) in zip(spans, spans[1:], strict=False):
        assert a1 <= b0, f"pool slices overlap: [{a0},{a1}) and [{b0},...)"
    live = np.flatnonzero(msgs.alive[: msgs.n_slots])
    if not live.size:
        return
    tr_m, tr_n = tree.traversal(*msgs.encoded(live))
    for q, u in zip(tr_m.tolist(), tr_n.tolist(), strict=True):
        if NI[u, F_TYPE] != LEAF:
            continue
        x = int(live[q])
        v = u
        while v >= 0 and x not in on.get(v, ()):
            v = int(NI[v, F_PARENT])
        assert v >= 0, f"live message slot {x} reaches leaf {u} but no m-list on its path holds it"
