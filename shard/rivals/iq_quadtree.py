"""Quadtree cells holding ranked-key posting lists: the machinery IQ-Tree and RQ-Tree share
(paper 002, Sect. 3.1 "Previous state-of-the-arts", Fig. 4a, and Sect. 5.1.1).

Paper 002 describes IQ-Tree (its ref. [6]) so: "subscriptions are organized by a Quadtree where
each subscription is attached to one or multiple Quadtree cells according to a cost model which
aims to balance matching and update costs. For each cell, the related subscriptions are
organized by a ranked-key Inverted List [46], and a subscription is assigned to the posting list
of its least frequent keyword." RQ-Tree (Sect. 5.1.1) "first employs ranked-key Inverted List
[6,46] to partition subscriptions into the posting lists according to their least frequent
keywords. Then for subscriptions on each posting list, we build a Quadtree for spatial filtering
purpose where the cost model in [6] is also adopted." Both are one thing here: a *forest* of
quadtrees whose cells hold posting lists keyed by term. IQ-Tree is one tree (root cell 0) whose
cells hold a list per key term; RQ-Tree is one tree per key term (``troot``), each cell holding
the one list of its tree's term. ``shard.rivals.iqtree`` and ``shard.rivals.rqtree`` are the two
faces; this module holds the columns and the kernels.

The structure, step by step:

1. Ranked key (Sect. 3.1, ref. [46]): each DNF clause is filed under its least frequent term
   (frequency = live clauses holding the term; ties to the lowest id), chosen when the clause is
   filed and kept until it leaves (a ranked-key list is not re-keyed). A clause without terms
   has the key -1, a list every message probes.
2. Cells (Sect. 3.1, Fig. 4a): a cell is a closed box; an internal cell has four quadrant
   children. A leaf cell whose entries exceed ``cell_capacity`` splits into four (up to
   ``max_depth``) and its entries are filed anew from it.
3. Attaching a clause to cells (Sect. 3.1: "attached to one or multiple Quadtree cells
   according to a cost model which aims to balance matching and update costs"; Sect. 5.1.1
   footnote 11: "we use the number of verifications to evaluate the goodness of the subscription
   decomposition"): a clause descends from the root. At a leaf it is filed. At an internal cell,
   if its box meets one child only it goes down to it; if it meets ``m`` > 1 children it is
   decomposed into those children when the verifications saved outweigh the ``m - 1`` extra
   copies (``_keeps``)::

       messages_per_update * p(key) * (w(cell) - sum of w(child) over the m children) > m - 1

   where ``w`` is a cell's estimated share of the messages and ``p(key)`` the estimated share of
   messages holding the key term; otherwise it is filed at the cell. The copies of a clause are
   disjoint cells whose union covers its box within the root; a clause whose box leaves the root
   stays on the root.
4. Matching (Sect. 3.1, filtering and refinement): a message visits every cell its box meets
   (the root always); IQ-Tree probes, in each visited cell, the lists of the message's terms
   (or, when the cell has fewer lists than the message has terms, every list of the cell,
   keeping those whose term the message holds); RQ-Tree walks the tree of each of the message's
   terms. Only the message's terms that key some live clause are probed. Each entry is verified: its box, the clause's other terms, the exact circle test;
   a subscription is reported once per message.
5. Maintenance (Sect. 5.1.3 "Evaluate index maintenance", which inserts 80 % of the
   subscriptions incrementally into IQ-Tree and RQ-Tree): an insert files the clause as in 3
   (splitting leaves as in 2); a delete follows the clause's chain of copies and takes each out
   of its list (the last entry of the list moves into its place).

Where the paper is ambiguous (paper 002 summarises [6] in a paragraph; each choice is the
nearest reading of its sentences):

* The cost model of [6] is not given in paper 002. Its stated aim ("balance matching and update
  costs") and measure ("the number of verifications") are taken literally: a copy costs one
  update, a copy at a cell costs the verifications of the messages that reach the cell with the
  key term, over ``messages_per_update`` messages.
* The cost model looks one level down only (``_keeps``): it weighs keeping the clause at the
  cell against copying it into the children its box meets, not against deeper cuts. A box
  meeting all four children saves nothing at that level (their shares sum to the cell's), so it
  stays at the cell, however small: a tiny box on a cell's centre lines (the root's included)
  stays on that cell, and every message reaching the cell with its key verifies it.
* Paper 002 builds IQ-Tree "according to subscription and message workloads" (5 % of the
  messages as the historical workload, Sect. 5.1.1). Given a ``message_sample``, its messages
  estimate both factors as the AP-Tree estimates its own (``APTree.rebuild``): ``p(key)`` =
  (sample messages holding the term + 0.5) / (sample size + 1), and a split gives child i the
  share ``(n_i + 1) / (n_0 + ... + n_3 + 4)`` of its parent's ``w`` (``w`` = 1 at a root),
  ``n_i`` the sample's message centres in child i. Without one (the rival interface builds from
  subscriptions alone) the subscriptions stand in, as in the AP-Tree's default: ``p(key)`` =
  live clauses holding the term / live clauses, ``n_i`` = entries of the splitting leaf whose
  box meets child i. The empty key has ``p`` = 1. ``w`` is fixed when a cell is made.
* How the Quadtree's cells come to be is not said ("a Quadtree"): a leaf splits at more than
  ``cell_capacity`` entries (a bucket PR-quadtree over the entries), up to ``max_depth``.
* The quadtree's space: the bounding box of the live clauses' boxes at the (re)build (the whole
  lon/lat space when there are none). RQ-Tree's trees all divide that same space (Sect. 5.1.1:
  "we build a Quadtree" for each posting list; a tree made later for a new term needs a space
  before its first clause, so one space serves all).
* "Least frequent keyword": over the live clauses, counted when the clause is filed; ties to
  the lowest term id. A clause keeps its key (no re-keying when frequencies drift).
* DNF subscriptions: "We extend IQ-Tree and RQ-Tree to support general boolean subscriptions
  following the similar strategy as our AP-Tree" (Sect. 5.1.3): each clause is filed on its own
  and a subscription is reported once.
* Deletes never merge cells (the paper's maintenance experiment only inserts); emptied cells
  stay until ``rebuild``. In RQ-Tree this includes whole trees: a key term's root cell, its
  list row and its hash slot stay after its last clause leaves (kept for the term's next
  clause), so the forest holds a tree per key term used since the last ``rebuild``, not per
  live key. Matching skips them (only terms with ``nkey`` > 0 are probed); they cost memory
  only (about 160 bytes a term), and ``rebuild`` drops them.
* Posting lists live in one pool; a full list moves to the pool's end with twice the room
  (O(its length), amortised over the appends that filled it), and the pool is compacted once
  it is mostly empty. The pool, the clause rows (``ki``) and the list hash grow by doubling; a
  bulk load and a compaction leave room in them (``ROOM_SHARE``) so that a build is not
  followed at once by an O(size) regrowth (at 1,000,000 place names, 0.15-0.25 s in the first
  subscribe after the build, most of the 2,000-update mean of ``bench compare``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit

from shard.aptree.match import grown
from shard.errors import ValidationError
from shard.geometry import exact_hit
from shard.model import Message, Point
from shard.rivals.base import RivalIndex, report, verify_clause

DEFAULT_CELL_CAPACITY = 64
"""Entries a leaf cell holds before it splits. On /work/bench/pl200k (200,000 real place names,
5,000 point messages) IQ-Tree matched as fast with 64 as with 128 to 1,024 (6.7-7.5 us per
message, within the noise of the shared 2-core machine), and RQ-Tree's lists rarely reach 64;
the smaller value keeps finer cells for workloads of small ranges (the paper's are 0.01-1 % of
the space)."""
DEFAULT_MAX_DEPTH = 20
"""Deepest cell level (a depth-20 cell of the whole lon/lat space is about 40 m wide)."""
DEFAULT_MESSAGES_PER_UPDATE = 1e6
"""Messages matched per subscription insert or delete, the ratio the cost model weighs a
verification saved against a copy stored (step 3). With it, the 200,000 place names of pl200k
are stored as 1.5 copies per clause in IQ-Tree (1.0 with 0, 3.2 with 1e8)."""

COMPACT_MIN_UNUSED = 4096
"""The pool is compacted once its slots not holding an entry (abandoned by moved lists, room
left in lists) exceed twice the entries plus this many (a compaction costs a pass)."""
ROOM_SHARE = 4
"""A bulk load and a compaction leave 1/``ROOM_SHARE`` of their entries (plus
``COMPACT_MIN_UNUSED``) free at the pool's end; a bulk load leaves 1/``ROOM_SHARE`` of its clause
rows free in ``ki`` and room for 1/(2 ``ROOM_SHARE``) more lists in the list hash. The updates that
follow thus start without an O(size) regrowth (each still grows by doubling, amortised)."""

# cells, int columns (``ci``)
C_CHILD, C_PARENT, C_DEPTH, C_COUNT, C_FIRST_LIST, C_NLISTS, C_TERM = range(7)
N_CI = 7
# cells, float columns (``cf``): the box, then the message share ``w``
C_W = 4
# lists (``li``)
L_OFF, L_LEN, L_CAP, L_NEXT, L_CELL, L_TERM = range(6)
N_LI = 6
# entries, int columns (``ei``); their boxes are ``ef``
E_CLAUSE, E_LIST, E_NEXT, E_PREV = range(4)
# clause rows (``ki``)
K_FIRST, K_KEY, K_NCOPY = range(3)
# counters (``meta``)
M_CELLS, M_LISTS, M_ETOP, M_HUSED, M_NLIVE, M_NENTRIES = range(6)
N_META = 6
# parameters (``par``)
P_CAP, P_DEPTH, P_LAMBDA, P_FOREST, P_SAMPLE, P_X0, P_Y0, P_X1, P_Y1 = range(9)
N_PAR = 9

NO_TERM = -1
"""The key of a clause without terms."""
NOT_A_TREE_TERM = -2
"""``C_TERM`` of IQ-Tree's cells (one tree for all keys)."""

_MIX = np.uint64(0xFF51AFD7ED558CCD)
_S33 = np.uint64(33)


# ---- small helpers ----------------------------------------------------------------------------
@njit(cache=True)
def _grow_rows(a, need):
    """``a`` with room for at least ``need`` rows (doubling)."""
    if need <= a.shape[0]:
        return a
    b = np.empty((max(need, 2 * a.shape[0]),) + a.shape[1:], a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True)
def _meets(b, x0, y0, x1, y1) -> bool:
    """Whether closed box row ``b`` meets the closed box (x0, y0, x1, y1)."""
    return not (x1 < b[0] or x0 > b[2] or y1 < b[1] or y0 > b[3])


@njit(cache=True)
def _hash_slot(cell, term, mask):
    x = np.uint64((cell << 32) | (term + 1))
    x ^= x >> _S33
    x *= _MIX
    x ^= x >> _S33
    return np.int64(x & np.uint64(mask))


@njit(cache=True)
def _hash_get(ht, cell, term):
    """The list of (``cell``, ``term``), -1 if none. ``ht`` rows: (key, list), key -1 empty."""
    key = (cell << 32) | (term + 1)
    mask = ht.shape[0] - 1
    h = _hash_slot(cell, term, mask)
    while ht[h, 0] != -1:
        if ht[h, 0] == key:
            return ht[h, 1]
        h = (h + 1) & mask
    return -1


@njit(cache=True)
def hash_room(ht, meta, more):
    """The table with room for ``more`` keys beyond those it holds before it passes half full:
    itself, or rehashed into the smallest power of two that has it. Returns the table."""
    size = ht.shape[0]
    while 2 * (meta[M_HUSED] + more) > size:
        size *= 2
    if size == ht.shape[0]:
        return ht
    old = ht
    ht = np.full((size, 2), -1, np.int64)
    mask = size - 1
    for i in range(old.shape[0]):
        k = old[i, 0]
        if k != -1:
            h = _hash_slot(k >> 32, (k & 0xFFFFFFFF) - 1, mask)
            while ht[h, 0] != -1:
                h = (h + 1) & mask
            ht[h, 0] = k
            ht[h, 1] = old[i, 1]
    return ht


@njit(cache=True)
def _hash_put(ht, meta, cell, term, lid):
    """Map (``cell``, ``term``) to list ``lid`` (absent before); doubles the table past half
    full. Returns the table."""
    if 2 * (meta[M_HUSED] + 1) > ht.shape[0]:
        ht = hash_room(ht, meta, 1)
    mask = ht.shape[0] - 1
    h = _hash_slot(cell, term, mask)
    while ht[h, 0] != -1:
        h = (h + 1) & mask
    ht[h, 0] = (cell << 32) | (term + 1)
    ht[h, 1] = lid
    meta[M_HUSED] += 1
    return ht


@njit(cache=True)
def new_cell(cf, ci, meta, x0, y0, x1, y1, parent, depth, w, term):
    """Append a leaf cell. Returns (cf, ci, its index)."""
    n = meta[M_CELLS]
    cf = _grow_rows(cf, n + 1)
    ci = _grow_rows(ci, n + 1)
    cf[n, 0], cf[n, 1], cf[n, 2], cf[n, 3], cf[n, C_W] = x0, y0, x1, y1, w
    ci[n, C_CHILD] = -1
    ci[n, C_PARENT] = parent
    ci[n, C_DEPTH] = depth
    ci[n, C_COUNT] = 0
    ci[n, C_FIRST_LIST] = -1
    ci[n, C_NLISTS] = 0
    ci[n, C_TERM] = term
    meta[M_CELLS] = n + 1
    return cf, ci, n


# ---- entries: the posting-list pool and each clause's chain of copies -------------------------
@njit(cache=True)
def _move_entry(ei, ef, ki, src, dst):
    """Move entry ``src`` of the pool to ``dst``, keeping its clause's chain of copies."""
    for d in range(4):
        ei[dst, d] = ei[src, d]
        ef[dst, d] = ef[src, d]
    prev = ei[dst, E_PREV]
    nxt = ei[dst, E_NEXT]
    if prev >= 0:
        ei[prev, E_NEXT] = dst
    else:
        ki[ei[dst, E_CLAUSE], K_FIRST] = dst
    if nxt >= 0:
        ei[nxt, E_PREV] = dst


@njit(cache=True)
def _unlink(ei, ki, meta, p):
    """Take entry ``p`` out of its clause's chain of copies (its list is the caller's)."""
    c = ei[p, E_CLAUSE]
    prev = ei[p, E_PREV]
    nxt = ei[p, E_NEXT]
    if prev >= 0:
        ei[prev, E_NEXT] = nxt
    else:
        ki[c, K_FIRST] = nxt
    if nxt >= 0:
        ei[nxt, E_PREV] = prev
    ki[c, K_NCOPY] -= 1
    meta[M_NENTRIES] -= 1


@njit(cache=True)
def _list_of(ci, ht, li, meta, cell, term):
    """The list of (``cell``, ``term``), made empty if absent. Returns (ht, li, list)."""
    lid = _hash_get(ht, cell, term)
    if lid >= 0:
        return ht, li, lid
    lid = meta[M_LISTS]
    li = _grow_rows(li, lid + 1)
    li[lid, L_OFF] = meta[M_ETOP]
    li[lid, L_LEN] = 0
    li[lid, L_CAP] = 0
    li[lid, L_NEXT] = ci[cell, C_FIRST_LIST]
    li[lid, L_CELL] = cell
    li[lid, L_TERM] = term
    ci[cell, C_FIRST_LIST] = lid
    ci[cell, C_NLISTS] += 1
    meta[M_LISTS] = lid + 1
    ht = _hash_put(ht, meta, cell, term, lid)
    return ht, li, lid


@njit(cache=True)
def _add_entry(ci, ht, li, ei, ef, ki, meta, cell, c, key, x0, y0, x1, y1):
    """File clause ``c`` (key ``key``, box) at ``cell``: append it to the cell's list of its
    key, moving a full list to the pool's end with twice the room. Returns (ht, li, ei, ef)."""
    ht, li, lid = _list_of(ci, ht, li, meta, cell, key)
    n = li[lid, L_LEN]
    if n == li[lid, L_CAP]:
        cap = max(2, 2 * n)
        top = meta[M_ETOP]
        ei = _grow_rows(ei, top + cap)
        ef = _grow_rows(ef, top + cap)
        off = li[lid, L_OFF]
        for j in range(n):
            _move_entry(ei, ef, ki, off + j, top + j)
        li[lid, L_OFF] = top
        li[lid, L_CAP] = cap
        meta[M_ETOP] = top + cap
    p = li[lid, L_OFF] + n
    first = ki[c, K_FIRST]
    ei[p, E_CLAUSE] = c
    ei[p, E_LIST] = lid
    ei[p, E_NEXT] = first
    ei[p, E_PREV] = -1
    if first >= 0:
        ei[first, E_PREV] = p
    ki[c, K_FIRST] = p
    ki[c, K_NCOPY] += 1
    ef[p, 0], ef[p, 1], ef[p, 2], ef[p, 3] = x0, y0, x1, y1
    li[lid, L_LEN] = n + 1
    ci[cell, C_COUNT] += 1
    meta[M_NENTRIES] += 1
    return ht, li, ei, ef


@njit(cache=True)
def _remove_entry(ci, li, ei, ef, ki, meta, p):
    """Take entry ``p`` out of its list (the list's last entry moves into its place)."""
    lid = ei[p, E_LIST]
    _unlink(ei, ki, meta, p)
    last = li[lid, L_OFF] + li[lid, L_LEN] - 1
    if p != last:
        _move_entry(ei, ef, ki, last, p)
    li[lid, L_LEN] -= 1
    ci[li[lid, L_CELL], C_COUNT] -= 1


@njit(cache=True)
def compact_pool(li, ei, ef, ki, meta, room):
    """Lay every list out anew, back to back with no room to spare, dropping the abandoned
    slots; the new pool has ``room`` free rows past its end (for the lists the next inserts
    move there). Returns (ei, ef). O(pool)."""
    top = meta[M_ETOP]
    remap = np.full(top, -1, np.int64)
    pos = 0
    for lid in range(meta[M_LISTS]):
        off = li[lid, L_OFF]
        n = li[lid, L_LEN]
        for j in range(n):
            remap[off + j] = pos + j
        li[lid, L_OFF] = pos
        li[lid, L_CAP] = n
        pos += n
    nei = np.empty((max(pos + room, 64), 4), ei.dtype)
    nef = np.empty((max(pos + room, 64), 4), ef.dtype)
    for old in range(top):
        new = remap[old]
        if new < 0:
            continue
        for d in range(4):
            nei[new, d] = ei[old, d]
            nef[new, d] = ef[old, d]
        if nei[new, E_NEXT] >= 0:
            nei[new, E_NEXT] = remap[nei[new, E_NEXT]]
        if nei[new, E_PREV] >= 0:
            nei[new, E_PREV] = remap[nei[new, E_PREV]]
    for c in range(ki.shape[0]):
        if ki[c, K_FIRST] >= 0:
            ki[c, K_FIRST] = remap[ki[c, K_FIRST]]
    meta[M_ETOP] = pos
    return nei, nef


# ---- Sect. 3.1: attaching a clause to cells ---------------------------------------------------
@njit(cache=True)
def _keeps(cf, ci, par, meta, freq, p_term, cell, key, x0, y0, x1, y1) -> bool:
    """Whether a clause (key, box) reaching internal ``cell`` is filed there rather than
    decomposed into the children its box meets (step 3 of the module docstring). ``p_term``:
    the share of sample messages holding each term (``P_SAMPLE``), else ``freq`` serves."""
    if ci[cell, C_PARENT] < 0 and not (
        x0 >= cf[cell, 0] and y0 >= cf[cell, 1] and x1 <= cf[cell, 2] and y1 <= cf[cell, 3]
    ):
        return True  # part of its box lies outside the space: only the root covers it
    ch = ci[cell, C_CHILD]
    m = 0
    w = 0.0
    for i in range(4):
        if _meets(cf[ch + i], x0, y0, x1, y1):
            m += 1
            w += cf[ch + i, C_W]
    if m == 0 or m == 4:
        return True  # the four children are the cell again: copies would save nothing
    if m == 1:
        return False  # one child holds all of it: fewer verifications, no extra copy
    if key < 0:
        p_key = 1.0
    elif par[P_SAMPLE] != 0.0:
        p_key = p_term[key + 1]
    else:
        p_key = freq[key + 1] / max(meta[M_NLIVE], 1)
    saved = par[P_LAMBDA] * p_key * (cf[cell, C_W] - w)
    return not saved > m - 1


@njit(cache=True)
def _sample_in(sx, sy, x0, y0, x1, y1):
    """Sample message centres in the closed box (``sx`` ascending). O(log n + slab)."""
    n = 0
    for j in range(np.searchsorted(sx, x0), np.searchsorted(sx, x1, side="right")):
        if y0 <= sy[j] <= y1:
            n += 1
    return n


@njit(cache=True)
def _split(cf, ci, li, ei, ef, ki, meta, par, sx, sy, cell, work, nwork):
    """Sect. 3.1, Fig. 4a: split leaf ``cell`` into four quadrants (message shares from the
    sample's message centres in each, else from its entries' boxes) and push its entries on the
    work stack, to be filed anew from ``cell``. Returns (cf, ci, work, nwork)."""
    x0, y0, x1, y1 = cf[cell, 0], cf[cell, 1], cf[cell, 2], cf[cell, 3]
    xm = 0.5 * (x0 + x1)
    ym = 0.5 * (y0 + y1)
    qx0 = (x0, xm, x0, xm)
    qx1 = (xm, x1, xm, x1)
    qy0 = (y0, y0, ym, ym)
    qy1 = (ym, ym, y1, y1)
    hits = np.zeros(4, np.float64)
    if par[P_SAMPLE] != 0.0:
        for i in range(4):
            hits[i] = _sample_in(sx, sy, qx0[i], qy0[i], qx1[i], qy1[i])
    else:
        lid = ci[cell, C_FIRST_LIST]
        while lid >= 0:
            off = li[lid, L_OFF]
            for p in range(off, off + li[lid, L_LEN]):
                for i in range(4):
                    if _meets(ef[p], qx0[i], qy0[i], qx1[i], qy1[i]):
                        hits[i] += 1.0
            lid = li[lid, L_NEXT]
    total = hits.sum() + 4.0
    depth = ci[cell, C_DEPTH] + 1
    first = meta[M_CELLS]
    for i in range(4):
        w = cf[cell, C_W] * (hits[i] + 1.0) / total
        cf, ci, _ = new_cell(
            cf, ci, meta, qx0[i], qy0[i], qx1[i], qy1[i], cell, depth, w, ci[cell, C_TERM]
        )
    ci[cell, C_CHILD] = first
    lid = ci[cell, C_FIRST_LIST]
    while lid >= 0:
        off = li[lid, L_OFF]
        for p in range(off, off + li[lid, L_LEN]):
            if nwork + 1 > work.shape[0]:
                work = _grow_rows(work, nwork + 1)
            work[nwork, 0] = ei[p, E_CLAUSE]
            work[nwork, 1] = cell
            nwork += 1
            _unlink(ei, ki, meta, p)
        li[lid, L_LEN] = 0
        lid = li[lid, L_NEXT]
    ci[cell, C_COUNT] = 0
    return cf, ci, work, nwork


@njit(cache=True)
def _file_work(cf, ci, ht, li, ei, ef, ki, meta, par, freq, wl, cl_sub, bbox, work, nwork):
    """File every (clause, cell) of the work stack (steps 2 and 3): down to a leaf or to the
    cell the cost model keeps it at; a leaf over capacity splits and its entries join the
    stack. ``wl``: the message sample's (term shares, centre x ascending, centre y). Returns
    (cf, ci, ht, li, ei, ef, work)."""
    p_term, sx, sy = wl
    cap = par[P_CAP]
    max_depth = par[P_DEPTH]
    while nwork > 0:
        nwork -= 1
        c = work[nwork, 0]
        cell = work[nwork, 1]
        s = cl_sub[c]
        key = ki[c, K_KEY]
        x0, y0, x1, y1 = bbox[s, 0], bbox[s, 1], bbox[s, 2], bbox[s, 3]
        ch = ci[cell, C_CHILD]
        if ch >= 0 and not _keeps(cf, ci, par, meta, freq, p_term, cell, key, x0, y0, x1, y1):
            for i in range(4):  # Sect. 3.1: "attached to one or multiple Quadtree cells"
                if _meets(cf[ch + i], x0, y0, x1, y1):
                    if nwork + 1 > work.shape[0]:
                        work = _grow_rows(work, nwork + 1)
                    work[nwork, 0] = c
                    work[nwork, 1] = ch + i
                    nwork += 1
            continue
        ht, li, ei, ef = _add_entry(ci, ht, li, ei, ef, ki, meta, cell, c, key, x0, y0, x1, y1)
        if ch < 0 and ci[cell, C_COUNT] > cap and ci[cell, C_DEPTH] < max_depth:
            cf, ci, work, nwork = _split(
                cf, ci, li, ei, ef, ki, meta, par, sx, sy, cell, work, nwork
            )
    return cf, ci, ht, li, ei, ef, work


@njit(cache=True)
def _least_frequent(freq, cl_off, cl_len, terms, c):
    """Sect. 3.1, ref. [46]: the clause's least frequent term (ties to the lowest id), -1 for a
    clause without terms."""
    best = NO_TERM
    for j in range(cl_off[c], cl_off[c] + cl_len[c]):
        t = terms[j]
        if (
            best == NO_TERM
            or freq[t + 1] < freq[best + 1]
            or (freq[t + 1] == freq[best + 1] and t < best)
        ):
            best = t
    return best


@njit(cache=True)
def _root_of(cf, ci, troot, meta, par, key):
    """The root the clause of ``key`` descends from: cell 0 (IQ-Tree), or its key's tree (made
    on first use: RQ-Tree, Sect. 5.1.1). Returns (cf, ci, root)."""
    if par[P_FOREST] == 0.0:
        return cf, ci, 0
    r = troot[key + 1]
    if r < 0:
        cf, ci, r = new_cell(
            cf, ci, meta, par[P_X0], par[P_Y0], par[P_X1], par[P_Y1], -1, 0, 1.0, key
        )
        troot[key + 1] = r
    return cf, ci, r


@njit(cache=True)
def insert_clauses(
    cf, ci, ht, li, ei, ef, ki, meta, par, freq, nkey, wl, troot, clauses, counted,
    cl_sub, cl_off, cl_len, terms, bbox,
):  # fmt: skip
    """Index clause rows ``clauses`` (Sect. 5.1.3, incremental maintenance; also the bulk load):
    count their terms into ``freq`` unless ``counted`` (the bulk load counts them all first),
    key each by its least frequent term (counted in ``nkey``), file it from its root. Returns (cf, ci, ht, li, ei,
    ef). O(clauses * depth) plus the splits."""
    work = np.empty((64, 2), np.int64)
    if not counted:
        for c in clauses:
            for j in range(cl_off[c], cl_off[c] + cl_len[c]):
                freq[terms[j] + 1] += 1
            meta[M_NLIVE] += 1
    for c in clauses:
        key = _least_frequent(freq, cl_off, cl_len, terms, c)
        ki[c, K_KEY] = key
        nkey[key + 1] += 1
        ki[c, K_FIRST] = -1
        ki[c, K_NCOPY] = 0
        cf, ci, root = _root_of(cf, ci, troot, meta, par, key)
        work[0, 0] = c
        work[0, 1] = root
        cf, ci, ht, li, ei, ef, work = _file_work(
            cf, ci, ht, li, ei, ef, ki, meta, par, freq, wl, cl_sub, bbox, work, 1
        )
    return cf, ci, ht, li, ei, ef


@njit(cache=True)
def delete_clauses(ci, li, ei, ef, ki, meta, freq, nkey, clauses, cl_off, cl_len, terms):
    """Take clause rows ``clauses`` out (Sect. 5.1.3): every copy along the clause's chain
    leaves its list; the terms leave ``freq``, the key ``nkey``. O(copies + terms)."""
    for c in clauses:
        while ki[c, K_FIRST] >= 0:
            _remove_entry(ci, li, ei, ef, ki, meta, ki[c, K_FIRST])
        ki[c, K_NCOPY] = 0
        nkey[ki[c, K_KEY] + 1] -= 1
        for j in range(cl_off[c], cl_off[c] + cl_len[c]):
            freq[terms[j] + 1] -= 1
        meta[M_NLIVE] -= 1


# ---- Sect. 3.1: filtering and refinement ------------------------------------------------------
@njit(cache=True)
def _scan_list(
    li, ei, ef, lid, key, cl_sub, cl_off, cl_len, terms, kind, bbox, circ,
    TM, SM, stamp, q, is_point, gx0, gy0, gx1, gy1, geom, out_m, out_s, nout,
):  # fmt: skip
    """Verify the entries of list ``lid`` (key ``key``, which the message holds): box, the
    clause's other terms, the exact region test; report each subscription once."""
    off = li[lid, L_OFF]
    for p in range(off, off + li[lid, L_LEN]):
        if not _meets(ef[p], gx0, gy0, gx1, gy1):
            continue
        c = ei[p, E_CLAUSE]
        s = cl_sub[c]
        if SM[s] == stamp:
            continue  # reported, from another copy or another clause
        if not verify_clause(cl_off, cl_len, terms, TM, stamp, c, key):
            continue
        if not exact_hit(kind[s], bbox[s], circ[s], is_point, gx0, gy0, geom):
            continue
        out_m, out_s, nout = report(out_m, out_s, nout, q, s, SM, stamp, True)
    return out_m, out_s, nout


@njit(cache=True)
def match_forest(
    cf, ci, ht, li, ei, ef, troot, nkey, forest,
    cl_sub, cl_off, cl_len, terms, kind, bbox, circ,
    TM, SM, stamp, m_off, m_terms, m_kind, m_geom,
):  # fmt: skip
    """Match a batch (step 4): for each message, the cells its box meets, from cell 0 (IQ-Tree:
    the lists of the message's terms in each cell) or from the root of each of its terms
    (``forest``, RQ-Tree: the one list of each cell). Only the message's terms some live clause
    is keyed by (``nkey``) are probed. Returns (out_m, out_s, stamp).
    O(cells visited * min(lists, message terms) + entries scanned)."""
    out_m = np.empty(256, np.int32)
    out_s = np.empty(256, np.int32)
    nout = 0
    stack = np.empty(64, np.int64)
    probe = np.empty(64, np.int64)
    for q in range(m_kind.shape[0]):
        stamp += 1
        t0 = m_off[q]
        t1 = m_off[q + 1]
        if t1 - t0 + 1 > probe.shape[0]:
            probe = np.empty(2 * (t1 - t0 + 1), np.int64)
        n_probe = 0
        for i in range(t0, t1 + 1):
            t = m_terms[i] if i < t1 else NO_TERM
            if i < t1:
                TM[t] = stamp
            if t + 1 < nkey.shape[0] and nkey[t + 1] > 0:  # a ranked key of some clause
                probe[n_probe] = t
                n_probe += 1
        if n_probe == 0:
            continue
        is_point = m_kind[q] == 0
        geom = m_geom[q]
        gx0, gy0, gx1, gy1 = geom[0], geom[1], geom[2], geom[3]
        for r in range(n_probe if forest else 1):
            if forest:
                key = probe[r]
                if troot[key + 1] < 0:
                    continue
                stack[0] = troot[key + 1]
            else:
                key = NOT_A_TREE_TERM
                stack[0] = 0
            top = 1
            while top > 0:
                top -= 1
                cell = stack[top]
                if ci[cell, C_COUNT] > 0:
                    if forest:  # RQ-Tree: the cell's one list, of its tree's term
                        out_m, out_s, nout = _scan_list(
                            li, ei, ef, ci[cell, C_FIRST_LIST], key, cl_sub, cl_off, cl_len,
                            terms, kind, bbox, circ, TM, SM, stamp, q, is_point,
                            gx0, gy0, gx1, gy1, geom, out_m, out_s, nout,
                        )  # fmt: skip
                    elif ci[cell, C_NLISTS] <= n_probe:  # fewer lists than terms to probe
                        lid = ci[cell, C_FIRST_LIST]
                        while lid >= 0:
                            t = li[lid, L_TERM]
                            if li[lid, L_LEN] > 0 and (t == NO_TERM or TM[t] == stamp):
                                out_m, out_s, nout = _scan_list(
                                    li, ei, ef, lid, t, cl_sub, cl_off, cl_len, terms, kind,
                                    bbox, circ, TM, SM, stamp, q, is_point,
                                    gx0, gy0, gx1, gy1, geom, out_m, out_s, nout,
                                )  # fmt: skip
                            lid = li[lid, L_NEXT]
                    else:  # IQ-Tree, Sect. 3.1: "the posting lists of the message keywords"
                        for i in range(n_probe):
                            t = probe[i]
                            lid = _hash_get(ht, cell, t)
                            if lid >= 0:
                                out_m, out_s, nout = _scan_list(
                                    li, ei, ef, lid, t, cl_sub, cl_off, cl_len, terms, kind,
                                    bbox, circ, TM, SM, stamp, q, is_point,
                                    gx0, gy0, gx1, gy1, geom, out_m, out_s, nout,
                                )  # fmt: skip
                ch = ci[cell, C_CHILD]
                if ch >= 0 and _meets(cf[cell], gx0, gy0, gx1, gy1):
                    # the children are the cell's quadrants (``_split``): the same closed boxes
                    xm = 0.5 * (cf[cell, 0] + cf[cell, 2])
                    ym = 0.5 * (cf[cell, 1] + cf[cell, 3])
                    if top + 4 > stack.shape[0]:
                        stack = grown(stack, top)
                    if gy0 <= ym:
                        if gx0 <= xm:
                            stack[top] = ch
                            top += 1
                        if gx1 >= xm:
                            stack[top] = ch + 1
                            top += 1
                    if gy1 >= ym:
                        if gx0 <= xm:
                            stack[top] = ch + 2
                            top += 1
                        if gx1 >= xm:
                            stack[top] = ch + 3
                            top += 1
    return out_m[:nout].copy(), out_s[:nout].copy(), stamp


@njit(cache=True)
def _data_space(live, cl_sub, bbox):
    """The bounding box of the live clauses' boxes (the whole lon/lat space if none)."""
    if live.shape[0] == 0:
        return -180.0, -90.0, 180.0, 90.0
    x0 = y0 = np.inf
    x1 = y1 = -np.inf
    for c in live:
        s = cl_sub[c]
        x0 = min(x0, bbox[s, 0])
        y0 = min(y0, bbox[s, 1])
        x1 = max(x1, bbox[s, 2])
        y1 = max(y1, bbox[s, 3])
    return x0, y0, x1, y1


# ---- the Python shell ---------------------------------------------------------------------------
def _messages(sample) -> list[Message]:
    sample = list(sample)
    for i, m in enumerate(sample):
        if not isinstance(m, Message):
            raise ValidationError(f"message_sample[{i}]", type(m).__name__, "must be a Message")
    return sample


def _centre(loc) -> tuple[float, float]:
    """A message's location as one point: a point, or a rectangle's centre."""
    if isinstance(loc, Point):
        return loc.lon, loc.lat
    return (loc.min_lon + loc.max_lon) / 2.0, (loc.min_lat + loc.max_lat) / 2.0


def _positive_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise ValidationError(name, value, f"must be an integer in [{lo}, {hi}]")
    return int(value)


class QuadCellIndex(RivalIndex):
    """IQ-Tree / RQ-Tree over the store's columns (``forest`` picks RQ-Tree's tree per key).

    Constructor options (keyword, validated): ``cell_capacity``, ``max_depth``,
    ``messages_per_update``, ``message_sample`` (``options_doc``).
    """

    forest = False
    options_doc = {
        "cell_capacity": f"entries a leaf cell holds before it splits into four "
        f"(default {DEFAULT_CELL_CAPACITY})",
        "max_depth": f"deepest cell level; leaves there never split (default {DEFAULT_MAX_DEPTH})",
        "messages_per_update": "messages per subscription update: the cost model decomposes a "
        "clause over several cells when the verifications it saves over that many messages "
        f"exceed its extra copies (0: never) (default {DEFAULT_MESSAGES_PER_UPDATE:g})",
        "message_sample": "historical messages (Sect. 5.1.1: the cost model works 'according to "
        "subscription and message workloads'): their term and location frequencies estimate the "
        "messages' (default none: the subscriptions' stand in)",
    }
    small_options = {"cell_capacity": 4, "max_depth": 8, "messages_per_update": 1e4}
    """Deep trees from a few hundred subscriptions, with copies (the default would copy a clause
    of 300 a dozen times over: the cost model weighs 10^6 messages against one update)."""

    def __init__(
        self,
        *,
        cell_capacity: int = DEFAULT_CELL_CAPACITY,
        max_depth: int = DEFAULT_MAX_DEPTH,
        messages_per_update: float = DEFAULT_MESSAGES_PER_UPDATE,
        message_sample: Iterable[Message] | None = None,
        **options,
    ) -> None:
        super().__init__(**options)
        self.cell_capacity = _positive_int("cell_capacity", cell_capacity, 1, 1 << 30)
        self.max_depth = _positive_int("max_depth", max_depth, 0, 40)
        if (
            isinstance(messages_per_update, bool)
            or not isinstance(messages_per_update, int | float)
            or not 0 <= messages_per_update < float("inf")
        ):
            raise ValidationError(
                "messages_per_update", messages_per_update, "must be a finite number >= 0"
            )
        self.messages_per_update = float(messages_per_update)
        self.message_sample = None if message_sample is None else _messages(message_sample)
        self._reset((-180.0, -90.0, 180.0, 90.0))

    # ---- state -----------------------------------------------------------------------------
    def _reset(self, space) -> None:
        self.par = np.array(
            [
                self.cell_capacity,
                self.max_depth,
                self.messages_per_update,
                1.0 if self.forest else 0.0,
                0.0 if self.message_sample is None else 1.0,
                *space,
            ],
            np.float64,
        )
        self.meta = np.zeros(N_META, np.int64)
        self.cf = np.zeros((64, 5), np.float64)
        self.ci = np.zeros((64, N_CI), np.int64)
        self.ht = np.full((1024, 2), -1, np.int64)
        self.li = np.zeros((64, N_LI), np.int64)
        self.ei = np.zeros((64, 4), np.int32)
        self.ef = np.zeros((64, 4), np.float64)
        rows = self.store.n_clause_rows
        self.ki = np.full((rows + rows // ROOM_SHARE + 64, 3), -1, np.int32)
        self.ki[:, K_NCOPY] = 0
        self.freq = np.zeros(len(self.store.vocab_terms) + 1, np.int64)
        self.nkey = np.zeros(len(self.store.vocab_terms) + 1, np.int64)
        """Live clauses keyed by each term (+1; index 0: the empty key)."""
        self.troot = np.full(len(self.store.vocab_terms) + 1, -1, np.int64)
        self.wl = self._workload()
        if not self.forest:
            self.cf, self.ci, _ = new_cell(
                self.cf, self.ci, self.meta, *space, -1, 0, 1.0, NOT_A_TREE_TERM
            )

    def _workload(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The message sample as the kernels take it: (share of its messages holding each term,
        +1 for the empty key; their centres' x ascending; their y), as the AP-Tree estimates
        them (``APTree.rebuild``: (count + 0.5) / (n + 1)). Empty arrays without a sample."""
        sample = self.message_sample
        if sample is None:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        st = self.store
        df = np.zeros(len(st.vocab_terms), np.float64)
        xy = np.empty((len(sample), 2), np.float64)
        for i, m in enumerate(sample):
            df[st.encode_terms(m.terms)] += 1.0
            xy[i] = _centre(m.location)
        p_term = np.concatenate([[1.0], (df + 0.5) / (len(sample) + 1.0)])
        xy = xy[np.argsort(xy[:, 0], kind="stable")]
        return p_term, np.ascontiguousarray(xy[:, 0]), np.ascontiguousarray(xy[:, 1])

    def _fit(self) -> None:
        """Room for the store's clause rows and vocabulary (both only grow; doubling)."""
        st = self.store
        if self.ki.shape[0] < st.n_clause_rows:
            old = self.ki
            self.ki = np.full((max(st.n_clause_rows, 2 * old.shape[0]), 3), -1, np.int32)
            self.ki[:, K_NCOPY] = 0
            self.ki[: old.shape[0]] = old
        v = len(st.vocab_terms) + 1
        if self.freq.shape[0] < v:
            self.freq = np.concatenate(
                [self.freq, np.zeros(max(v, 2 * self.freq.shape[0]) - self.freq.shape[0], np.int64)]
            )
            more = self.freq.shape[0] - self.troot.shape[0]
            self.troot = np.concatenate([self.troot, np.full(more, -1, np.int64)])
            self.nkey = np.concatenate([self.nkey, np.zeros(more, np.int64)])
        p_term, sx, sy = self.wl
        if self.message_sample is not None and p_term.shape[0] < self.freq.shape[0]:
            unseen = 0.5 / (len(self.message_sample) + 1.0)  # a term no sample message holds
            more = np.full(self.freq.shape[0] - p_term.shape[0], unseen)
            self.wl = (np.concatenate([p_term, more]), sx, sy)

    def _file(self, clauses: np.ndarray, counted: bool) -> None:
        st = self.store
        self.cf, self.ci, self.ht, self.li, self.ei, self.ef = insert_clauses(
            self.cf, self.ci, self.ht, self.li, self.ei, self.ef, self.ki, self.meta, self.par,
            self.freq, self.nkey, self.wl, self.troot, clauses, counted,
            st.cl_sub, st.cl_off, st.cl_len, st.terms, st.bbox,
        )  # fmt: skip

    def _tidy(self) -> None:
        """Compact the pool once it is mostly empty (``COMPACT_MIN_UNUSED``)."""
        m = self.meta
        if m[M_ETOP] - m[M_NENTRIES] > 2 * m[M_NENTRIES] + COMPACT_MIN_UNUSED:
            self._compact()

    def _compact(self) -> None:
        """Lay the pool out anew with room at its end (``ROOM_SHARE``)."""
        room = int(self.meta[M_NENTRIES]) // ROOM_SHARE + COMPACT_MIN_UNUSED
        self.ei, self.ef = compact_pool(self.li, self.ei, self.ef, self.ki, self.meta, room)

    # ---- RivalIndex ----------------------------------------------------------------------------
    def _build(self) -> None:
        """Bulk load: count term frequencies over every live clause, take the data space, then
        file each clause (one compiled call). The pool, ``ki`` and the list hash are left with
        room (``ROOM_SHARE``), and the delete kernel is made ready (compiled, or loaded from
        numba's cache), so the first updates after a build pay neither an O(size) regrowth
        nor a compilation. O(clauses * depth) plus the splits."""
        st = self.store
        live = st.live_clauses()
        space = _data_space(live, st.cl_sub, st.bbox) if live.size else (-180.0, -90.0, 180.0, 90.0)
        self._reset(space)
        self.freq[1:] = st.term_frequencies()
        self.meta[M_NLIVE] = live.shape[0]
        self._fit()
        self._file(live, True)
        self._compact()
        self.ht = hash_room(self.ht, self.meta, int(self.meta[M_HUSED]) // (2 * ROOM_SHARE) + 64)
        self._delete(-1, np.empty(0, np.int32))  # compile now, not in the first unsubscribe

    def _insert(self, slot: int, clauses: np.ndarray) -> None:
        self._fit()
        self._file(np.asarray(clauses, np.int32), False)
        self._tidy()

    def _delete(self, slot: int, clauses: np.ndarray) -> None:
        st = self.store
        delete_clauses(
            self.ci, self.li, self.ei, self.ef, self.ki, self.meta, self.freq, self.nkey,
            np.asarray(clauses, np.int32), st.cl_off, st.cl_len, st.terms,
        )  # fmt: skip
        self._tidy()

    def subscribe_many(self, subs) -> None:
        """Insert a batch: replaced ids leave first, the new rows enter the store at once
        (``add_many``) and are filed in one compiled call."""
        fresh = {}
        for sub in subs:
            if sub.id in self.store.slot_of:
                self.unsubscribe(sub.id)
            fresh[sub.id] = sub
        if not fresh:
            return
        if len(fresh) < len(subs):  # an id twice in the batch: the last one counts
            for sub in fresh.values():
                self.subscribe(sub)
            return
        _, clauses, _ = self.store.add_many(list(fresh.values()))
        self._insert(-1, clauses)

    def match_encoded(self, batch):
        st = self.store
        sc = self._stamps()
        self._fit()
        out_m, out_s, sc.stamp = match_forest(
            self.cf, self.ci, self.ht, self.li, self.ei, self.ef, self.troot, self.nkey, self.forest,
            st.cl_sub, st.cl_off, st.cl_len, st.terms, st.kind, st.bbox, st.circ,
            sc.TM, sc.SM, sc.stamp, batch.off, batch.terms, batch.kind, batch.geom,
        )  # fmt: skip
        return out_m, out_s

    # ---- introspection ---------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Sizes: subscriptions, clauses, entries (copies), cells, leaves, lists, trees, the
        deepest cell, the longest list."""
        m = self.meta
        n = int(m[M_CELLS])
        ci = self.ci[:n]
        lens = self.li[: int(m[M_LISTS]), L_LEN]
        return {
            "subscriptions": len(self),
            "clauses": int(m[M_NLIVE]),
            "entries": int(m[M_NENTRIES]),
            "cells": n,
            "leaves": int((ci[:, C_CHILD] < 0).sum()),
            "lists": int((lens > 0).sum()),
            "trees": int((ci[:, C_PARENT] < 0).sum()),
            "depth": int(ci[:, C_DEPTH].max()) if n else 0,
            "longest_list": int(lens.max()) if lens.size else 0,
        }

    def check_invariants(self) -> None:
        """Assert the structure: cells are quadrants of their parents, whose message shares they
        split; a leaf over capacity is at ``max_depth``; each cell's count is its lists' lengths
        and its lists carry its term (RQ-Tree); lists are disjoint in the pool and found by the
        hash; term and key counts are the live clauses'; every live clause has a key among its
        terms and copies that are entries of its key's lists, with its box, forming a cut of its
        tree that covers its box; no entry of a dead clause. O(cells + entries + copies *
        depth), in Python (for tests)."""
        _check(self)


def _check(ix: QuadCellIndex) -> None:
    st, m = ix.store, ix.meta
    n_cells, n_lists = int(m[M_CELLS]), int(m[M_LISTS])
    cf, ci, li, ei, ef, ki = ix.cf, ix.ci, ix.li, ix.ei, ix.ef, ix.ki
    cap, max_depth = ix.cell_capacity, ix.max_depth
    for c in range(n_cells):
        where = f"cell {c}: {ci[c].tolist()} {cf[c].tolist()}"
        ch = int(ci[c, C_CHILD])
        if ch < 0:
            assert ci[c, C_COUNT] <= cap or ci[c, C_DEPTH] == max_depth, where
        else:
            x0, y0, x1, y1 = cf[c, :4]
            xm, ym = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
            want = [(x0, y0, xm, ym), (xm, y0, x1, ym), (x0, ym, xm, y1), (xm, ym, x1, y1)]
            assert abs(cf[ch : ch + 4, C_W].sum() - cf[c, C_W]) <= 1e-9 * cf[c, C_W], where
            for i in range(4):
                assert tuple(cf[ch + i, :4]) == want[i], where
                assert ci[ch + i, C_PARENT] == c and ci[ch + i, C_DEPTH] == ci[c, C_DEPTH] + 1
                assert ci[ch + i, C_TERM] == ci[c, C_TERM], where
        total, k, lid = 0, 0, int(ci[c, C_FIRST_LIST])
        while lid >= 0:
            assert li[lid, L_CELL] == c, where
            assert _hash_get(ix.ht, c, int(li[lid, L_TERM])) == lid, where
            if ix.forest:
                assert li[lid, L_TERM] == ci[c, C_TERM], where
            total += int(li[lid, L_LEN])
            k += 1
            lid = int(li[lid, L_NEXT])
        assert total == ci[c, C_COUNT] and k == ci[c, C_NLISTS], where
    if ix.forest:
        roots = [int(r) for r in ix.troot if r >= 0]
        assert sorted(roots) == [c for c in range(n_cells) if ci[c, C_PARENT] < 0]
        for t, r in enumerate(ix.troot):
            assert r < 0 or ci[r, C_TERM] == t - 1
    used = np.zeros(int(m[M_ETOP]), np.int64)
    n_entries = 0
    for lid in range(n_lists):
        a, n = int(li[lid, L_OFF]), int(li[lid, L_LEN])
        assert 0 <= n <= li[lid, L_CAP] and a + li[lid, L_CAP] <= m[M_ETOP], lid
        used[a : a + n] += 1
        for p in range(a, a + n):
            assert ei[p, E_LIST] == lid, (lid, p)
        n_entries += n
    assert used.max(initial=0) <= 1, "lists overlap in the pool"
    assert n_entries == m[M_NENTRIES], (n_entries, m[M_NENTRIES])
    live = st.live_clauses()
    assert m[M_NLIVE] == live.shape[0]
    freq = np.zeros(ix.freq.shape[0], np.int64)
    freq[1 : len(st.vocab_terms) + 1] = st.term_frequencies()
    assert np.array_equal(freq, ix.freq), "term frequencies drifted"
    keys = ki[live, K_KEY].astype(np.int64) + 1
    assert np.array_equal(np.bincount(keys, minlength=ix.nkey.shape[0]), ix.nkey), "key counts"
    n_copies = 0
    for c in live.tolist():
        s = int(st.cl_sub[c])
        a, n = int(st.cl_off[c]), int(st.cl_len[c])
        cl_terms = st.terms[a : a + n].tolist()
        key = int(ki[c, K_KEY])
        where = f"clause {c} (slot {s}, terms {cl_terms}, key {key})"
        assert (key in cl_terms) if cl_terms else key == NO_TERM, where
        cells = []
        p, prev = int(ki[c, K_FIRST]), -1
        while p >= 0:
            assert ei[p, E_CLAUSE] == c and ei[p, E_PREV] == prev, where
            lid = int(ei[p, E_LIST])
            assert li[lid, L_OFF] <= p < li[lid, L_OFF] + li[lid, L_LEN], where
            assert li[lid, L_TERM] == key, where
            assert ef[p].tolist() == st.bbox[s].tolist(), where
            cells.append(int(li[lid, L_CELL]))
            prev, p = p, int(ei[p, E_NEXT])
        assert len(cells) == ki[c, K_NCOPY] >= 1, where
        assert len(set(cells)) == len(cells), where
        n_copies += len(cells)
        root = int(ix.troot[key + 1]) if ix.forest else 0
        assert _covers(cf, ci, root, set(cells), st.bbox[s]), where
    assert n_copies == n_entries, "an entry of a dead clause"


def _covers(cf, ci, cell, cells, box) -> bool:
    """Whether the copy cells in ``cells`` cover ``box`` within ``cell`` (a box leaving the root
    must be on the root) and none lies below another (a cut of the tree)."""
    above = set()
    for c in cells:
        p = int(ci[c, C_PARENT])
        while p >= 0:
            above.add(p)
            p = int(ci[p, C_PARENT])
    if above & cells:
        return False
    x0, y0, x1, y1 = box
    inside = x0 >= cf[cell, 0] and y0 >= cf[cell, 1] and x1 <= cf[cell, 2] and y1 <= cf[cell, 3]
    if cell not in cells and not inside:
        return False
    todo = [cell]
    while todo:
        c = todo.pop()
        if c in cells:
            continue
        ch = int(ci[c, C_CHILD])
        if ch < 0:
            return False  # a part of the box no copy covers
        todo.extend(ch + i for i in range(4) if _meets(cf[ch + i], x0, y0, x1, y1))
    return True
