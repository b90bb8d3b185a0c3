"""``check_tree``: every structural invariant of an AP-Tree, asserted (slow; for tests).

On failure the assertion message dumps the offending node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shard.aptree.layout import (
    C_LI,
    C_NODES,
    C_ROOT,
    F_BOFF,
    F_CHOFF,
    F_DEPTH,
    F_DUMMY,
    F_KP,
    F_L,
    F_LCAP,
    F_LLEN,
    F_LOFF,
    F_NCH,
    F_NX,
    F_NY,
    F_PARENT,
    F_SIZE,
    F_SP,
    F_TYPE,
    F_WD_CUR,
    FREED,
    KNODE,
    LB_INLINE_TERMS,
    LBI_SLOT,
    LBK_MULTI,
    LEAF,
    P_GAP_TO_DUMMY,
    P_MAX_SPAN,
    SNODE,
    T_LB,
    T_NF,
    T_NI,
)

if TYPE_CHECKING:
    from shard.aptree.tree import APTree


def _dump(T, u: int) -> str:
    NI, NF = T[T_NI], T[T_NF]
    return f"node {u}: fields={NI[u].tolist()} region={NF[u].tolist()}"


def check_tree(tree: APTree) -> None:
    """Assert the invariants:

    * parent/child links, depth, offsets (k-node children at L+1), flags (KP=0 has no k-node,
      SP=0 no s-node; dummy cut KP=0, dummy cell SP=0), child regions equal their cells;
    * k-node cuts are ordered, disjoint, and every clause below a cut has its L-th keyword in it,
      every clause below the dummy cut has at most L keywords;
    * s-node boundaries are strictly increasing and span the node region; a clause is below the
      dummy cell iff its region contains the node region, else below exactly the cells it meets;
    * leaves: no duplicate entry, only live clauses, slices inside the pool, each entry's record
      (``LB``) equal to what the store says (box, slot, kind, terms);
    * sizes: F_SIZE = entries below; current cut/cell weights = distinct clauses below;
    * every live clause is stored.
    """
    T = tree.arrays
    store = tree.store
    NI, NF, CH, CLO, CHI, _, WCUR, BND, LI, _, CNT, _ = T
    bbox, cl_sub, cl_off, cl_len, terms = (
        store.bbox,
        store.cl_sub,
        store.cl_off,
        store.cl_len,
        store.terms,
    )
    root = int(CNT[C_ROOT])
    max_span = tree.params[P_MAX_SPAN]
    gap_to_dummy = tree.params[P_GAP_TO_DUMMY] > 0.5
    assert NI[root, F_PARENT] == -1, _dump(T, root)
    below: dict[int, set[int]] = {}
    entries: dict[int, int] = {}

    def children(u: int) -> list[tuple[int, int]]:
        """(slot index or -1 for the dummy, child id)."""
        out = []
        off = int(NI[u, F_CHOFF])
        for k in range(int(NI[u, F_NCH])):
            if CH[off + k] >= 0:
                out.append((k, int(CH[off + k])))
        if NI[u, F_DUMMY] >= 0:
            out.append((-1, int(NI[u, F_DUMMY])))
        return out

    seen_nodes: set[int] = set()

    def visit(u: int) -> None:
        assert u not in seen_nodes, _dump(T, u)
        seen_nodes.add(u)
        typ = int(NI[u, F_TYPE])
        assert typ in (LEAF, KNODE, SNODE), _dump(T, u)
        if typ == LEAF:
            off, n, cap = int(NI[u, F_LOFF]), int(NI[u, F_LLEN]), int(NI[u, F_LCAP])
            assert 0 <= n <= cap and off + cap <= CNT[C_LI], _dump(T, u)
            items = LI[off : off + n].tolist()
            assert len(set(items)) == n, f"duplicate entries; {_dump(T, u)}"
            LB = T[T_LB]
            for i, c in enumerate(items):
                assert 0 <= c < store.n_clause_rows and cl_sub[c] >= 0, (
                    f"dead clause {c}; {_dump(T, u)}"
                )
                s = cl_sub[c]
                a, k = int(store.cl_off[c]), int(store.cl_len[c])
                flags = int(store.kind[s]) | (LBK_MULTI if store.n_clauses[s] > 1 else 0)
                want = [*bbox[s].tolist(), s, flags, k]
                want += store.terms[a : a + min(k, LB_INLINE_TERMS)].tolist()
                rec = LB[off + i]
                ints = rec.view(np.int32)[LBI_SLOT : LBI_SLOT + len(want) - 4].tolist()
                got = [*rec[:4].tolist(), *ints]
                assert got == want, (
                    f"leaf record of clause {c} is {got}, the store says {want}; {_dump(T, u)}"
                )
            below[u] = set(items)
            entries[u] = n
            assert NI[u, F_SIZE] == n, f"size; {_dump(T, u)}"
            return
        l = int(NI[u, F_L])
        if typ == KNODE:
            assert NI[u, F_KP] == 1, _dump(T, u)
        else:
            assert NI[u, F_SP] == 1, _dump(T, u)
        total_set: set[int] = set()
        total_entries = 0
        for k, ch in children(u):
            assert NI[ch, F_PARENT] == u and NI[ch, F_DEPTH] == NI[u, F_DEPTH] + 1, _dump(T, ch)
            if typ == KNODE:
                # the dummy cut and one-keyword cuts move to offset l+1; a wider cut may refine l
                assert NI[ch, F_L] == l + 1 or (k >= 0 and NI[ch, F_L] == l), _dump(T, ch)
                assert NI[ch, F_SP] == NI[u, F_SP], _dump(T, ch)
                assert NI[ch, F_KP] == (0 if k == -1 else NI[u, F_KP]), _dump(T, ch)
                assert np.array_equal(NF[ch], NF[u]), _dump(T, ch)
            else:
                assert NI[ch, F_L] == l and NI[ch, F_KP] == NI[u, F_KP], _dump(T, ch)
                assert NI[ch, F_SP] == (0 if k == -1 else 1), _dump(T, ch)
            visit(ch)
            total_set |= below[ch]
            total_entries += entries[ch]
        below[u] = total_set
        entries[u] = total_entries
        assert NI[u, F_SIZE] == total_entries, f"size {total_entries}; {_dump(T, u)}"
        off = int(NI[u, F_CHOFF])
        nch = int(NI[u, F_NCH])
        d = int(NI[u, F_DUMMY])
        dummy_set = below[d] if d >= 0 else set()
        assert NI[u, F_WD_CUR] == len(dummy_set), f"dummy weight; {_dump(T, u)}"
        child_sets = [below[int(CH[off + k])] if CH[off + k] >= 0 else set() for k in range(nch)]
        for k in range(nch):
            assert WCUR[off + k] == len(child_sets[k]), f"weight of slot {k}; {_dump(T, u)}"
        if typ == KNODE:
            for k in range(nch):
                assert CLO[off + k] <= CHI[off + k], _dump(T, u)
                if k:
                    assert CHI[off + k - 1] < CLO[off + k], _dump(T, u)
            for c in dummy_set:
                if cl_len[c] <= l:
                    continue
                # only with P_GAP_TO_DUMMY: a keyword that lies in no cut
                w = int(terms[cl_off[c] + l])
                in_cut = any(CLO[off + k] <= w <= CHI[off + k] for k in range(nch))
                assert gap_to_dummy and not in_cut, f"clause {c} in dummy cut; {_dump(T, u)}"
            for k in range(nch):
                for c in child_sets[k]:
                    assert cl_len[c] > l, _dump(T, u)
                    w = terms[cl_off[c] + l]
                    assert CLO[off + k] <= w <= CHI[off + k], (
                        f"clause {c} keyword {w} outside cut {k}; {_dump(T, u)}"
                    )
        else:
            nx, ny, boff = int(NI[u, F_NX]), int(NI[u, F_NY]), int(NI[u, F_BOFF])
            assert nx * ny == nch, _dump(T, u)
            bx = BND[boff : boff + nx + 1]
            by = BND[boff + nx + 1 : boff + nx + ny + 2]
            assert np.all(np.diff(bx) > 0) and np.all(np.diff(by) > 0), _dump(T, u)
            assert (
                bx[0] == NF[u, 0]
                and bx[-1] == NF[u, 2]
                and by[0] == NF[u, 1]
                and by[-1] == NF[u, 3]
            ), _dump(T, u)
            for a in range(nx):
                for b in range(ny):
                    ch = int(CH[off + a * ny + b])
                    if ch >= 0:
                        assert tuple(NF[ch]) == (bx[a], by[b], bx[a + 1], by[b + 1]), _dump(T, ch)
            r = NF[u]
            for c in total_set:
                s = cl_sub[c]
                contains = (
                    bbox[s, 0] <= r[0]
                    and bbox[s, 1] <= r[1]
                    and bbox[s, 2] >= r[2]
                    and bbox[s, 3] >= r[3]
                )
                x0, x1 = max(bbox[s, 0], r[0]), min(bbox[s, 2], r[2])
                y0, y1 = max(bbox[s, 1], r[1]), min(bbox[s, 3], r[3])
                span = sum(
                    1
                    for a in range(nx)
                    for b in range(ny)
                    if bx[a] <= x1 and bx[a + 1] >= x0 and by[b] <= y1 and by[b + 1] >= y0
                )
                to_dummy = contains or span > max_span
                assert to_dummy == (c in dummy_set), (
                    f"clause {c} dummy placement (span {span}); {_dump(T, u)}"
                )
                if to_dummy:
                    continue
                for a in range(nx):
                    for b in range(ny):
                        meets = bx[a] <= x1 and bx[a + 1] >= x0 and by[b] <= y1 and by[b + 1] >= y0
                        assert meets == (c in child_sets[a * ny + b]), (
                            f"clause {c} cell ({a},{b}); {_dump(T, u)}"
                        )

    visit(root)
    for u in range(int(CNT[C_NODES])):
        if NI[u, F_TYPE] != FREED:
            assert u in seen_nodes, f"unreachable live node; {_dump(T, u)}"
    live = set(store.live_clauses().tolist())
    assert below[root] == live, f"stored {len(below[root])} clauses, live {len(live)}"
