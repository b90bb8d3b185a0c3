"""Message matching over the AP-Tree (Alg. 1), compiled: depth-first with an explicit stack.

Messages arrive as a CSR batch: ``m_off``/``m_terms`` (term ids ascending in the global keyword
order, unknown terms dropped), ``m_kind`` (0 point, 1 rect) and ``m_geom`` (x, y, x, y for a point).
A k-node visits each cut hit by a message keyword at most once, continuing with η after the first
keyword that hit it (or at it, when the child refines the same keyword offset), plus its dummy cut; an s-node visits the cell holding the point (every cell a
rect message overlaps) plus its dummy cell. Leaves verify keywords (a per-message term stamp) and
region exactly; a per-subscription stamp reports each subscription once per message even when
several DNF clauses or replicated entries match.

The shortcuts, all exact:

* **The direct table of a wide k-node** (the root on rare-term text: one cut per keyword,
  hundreds of thousands of them). Finding a keyword's cut is a binary search, ~18 dependent
  reads there, most of them cache misses. ``direct_cuts`` tabulates, per term id, the cut that
  search would find; the kernel takes the table's answer only after checking it against the
  cut bounds (the search's own condition), and searches otherwise. A stale table (the node's
  cuts changed since) costs time, never a match: the kernel counts its misses and the owner
  re-makes it.
* **The leaves of a wide root, addressed by term.** Nearly every child of such a root is a
  leaf under a cut of one keyword; reaching it costs the cut's bounds, its child and the
  child's node row, one dependent miss after the other. ``direct_leaves`` tabulates, per term
  with such a cut, the leaf and its records (first, count), so the kernel goes from the term
  straight to the records, as an inverted list goes to a posting list. Unlike the direct table
  it is not checked by the kernel: its owner (``APTree.direct_table``) hands it over only while
  the tree is as it was when it was made, and an empty one otherwise. A leaf reached this way
  is traced like one reached through its cut (the AP+-Tree stores messages on the nodes a
  message's trace names, in any order).
* **Loads started ahead.** The leaves by term of the next messages are known before they are
  scanned, so the kernel asks for them a few messages early (``shard.prefetch``): the term
  rows of message q + 6, the first records of the leaves of message q + 3. Their misses then
  overlap each other and the work in between instead of following one another (the default
  workload's kernel 19 % faster, places' 7 %, docs/BENCHMARKS.md).
* **Box tests without a branch.** Whether an entry's box meets the message is a coin toss the
  CPU cannot predict (on real place names a quarter of a leaf's entries pass, on Zipf about
  two thirds), and a wrong guess costs more than the test. A leaf is scanned
  ``CANDIDATES`` entries at a time: each entry's index is written to a small buffer and the
  count advanced by the test's outcome (0 or 1), then only the entries that passed are tested
  further (places' kernel 1.34 → 0.93 µs a message, Zipf's 8.97 → 7.70; docs/BENCHMARKS.md).
* **No per-subscription stamp for a single-clause subscription and a point message.** A point
  reaches one cell of every s-node and one cut (or the dummy) of every k-node per keyword
  offset, and a clause lies in exactly one of those, so it is verified at most once; only a
  subscription of several clauses (``LBK_MULTI`` on its entries) or a rect message, which
  overlaps several cells, can meet an entry twice. Skipping the stamp saves a random read of
  the per-slot stamps for every candidate.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from shard.aptree.layout import (
    C_ROOT,
    F_BOFF,
    F_CHOFF,
    F_DUMMY,
    F_L,
    F_LLEN,
    F_LOFF,
    F_NCH,
    F_NX,
    F_NY,
    F_TYPE,
    KNODE,
    LB_INLINE_TERMS,
    LBI_KIND,
    LBI_NT,
    LBI_SLOT,
    LBI_T,
    LBK_KIND,
    LBK_MULTI,
    LEAF,
    T_BND,
    T_CH,
    T_CHI,
    T_CLO,
    T_CNT,
    T_LB,
    T_LI,
    T_NI,
)
from shard.aptree.partition import cell_of, cell_range
from shard.geometry import KIND_CIRCLE, exact_hit
from shard.prefetch import prefetch


@njit(cache=True, inline="always")
def _enter(stack_n, stack_e, top, child, eta, trace, tr_d, ntr):
    """Push ``child`` with ``eta`` on the traversal's stack; a missing child (-1) is a dead end
    of the node traced last (``tr_d[ntr - 1]``). Returns the new top. The arrays are written,
    never replaced (``traverse_kernel``)."""
    if child >= 0:
        stack_n[top] = child
        stack_e[top] = eta
        return top + 1
    if trace:
        tr_d[ntr - 1] = True
    return top


@njit(cache=True, inline="always")
def boxes_meeting(B, c0, c1, x0, y0, x1, y1, cand):
    """Rows ``c0:c1`` of ``B`` whose box (columns 0-3: x0, y0, x1, y1) meets the box ``x0, y0,
    x1, y1``, written to ``cand``; returns how many. Without a branch: each row's index is
    written and the count advanced by the test's outcome (the module docstring). ``cand``
    holds at least ``c1 - c0``."""
    nc = 0
    for k in range(c0, c1):
        cand[nc] = k
        nc += (x1 >= B[k, 0]) & (x0 <= B[k, 2]) & (y1 >= B[k, 1]) & (y0 <= B[k, 3])
    return nc


@njit(cache=True)
def all_stamped(TM, terms, a, b, stamp) -> bool:
    """Whether every term of ``terms[a:b]`` carries the message's ``stamp`` in ``TM`` (is
    among the message's terms)."""
    for j in range(a, b):  # noqa: SIM110 (a loop: numba compiles no generator into all())
        if TM[terms[j]] != stamp:
            return False
    return True


@njit(cache=True)
def grown(a, n):
    """A copy of ``a[:n]`` with room for 2n (growable kernel outputs)."""
    b = np.empty(2 * n, a.dtype)
    b[:n] = a[:n]
    return b


@njit(cache=True)
def trimmed(a, n):
    """``a[:n]``, a kernel's output: the array itself when at least half of it is used, else
    a copy (so a small answer does not keep a large array alive)."""
    if 2 * n >= a.shape[0]:
        return a[:n]
    return a[:n].copy()


class PairRoom:
    """How many (message, subscription) pairs a kernel makes room for before a batch: the
    pairs a message of the batches so far (a moving average) times the batch's messages, and
    a quarter more. A kernel whose pair arrays start small doubles and copies them ~log(pairs)
    times a batch, into fresh memory each time; on Zipf text (635 pairs a message) that cost
    ~1 µs a message, a seventh of the AP-Tree's kernel (docs/BENCHMARKS.md, twenty-eighth
    session). Shared by every index with such a kernel.

    >>> r = PairRoom(); r.room(100)
    1024
    >>> r.saw(100, 100_000); r.room(100) > 100_000
    True
    """

    __slots__ = ("per_message",)

    def __init__(self) -> None:
        self.per_message = 0.0

    def room(self, n_messages: int) -> int:
        return max(1024, int(self.per_message * n_messages * 1.25) + 64)

    def saw(self, n_messages: int, n_pairs: int) -> None:
        """A batch of ``n_messages`` gave ``n_pairs`` pairs."""
        if n_messages:
            rate = n_pairs / n_messages
            self.per_message = rate if self.per_message == 0.0 else 0.5 * (self.per_message + rate)


_SHORT = 32
"""Messages of at most this many terms are sorted by insertion (a sort call cost more)."""


@njit(cache=True)
def pack_terms(ids, lens):
    """CSR of a message batch from per-message term ids (-1: unknown, dropped): each message's
    known ids ascending and de-duplicated. Returns (offsets, terms). O(terms log terms)."""
    n = lens.shape[0]
    off = np.zeros(n + 1, np.int64)
    out = np.empty(ids.shape[0], np.int32)
    pos = 0
    src = 0
    for q in range(n):
        start = pos
        if lens[q] <= _SHORT:
            for i in range(src, src + lens[q]):
                t = ids[i]
                if t < 0:
                    continue
                j = pos
                while j > start and out[j - 1] > t:
                    j -= 1
                if j > start and out[j - 1] == t:
                    continue  # a duplicate
                for k in range(pos, j, -1):
                    out[k] = out[k - 1]
                out[j] = t
                pos += 1
        else:
            prev = -1
            for t in np.sort(ids[src : src + lens[q]]):
                if t >= 0 and t != prev:
                    out[pos] = t
                    pos += 1
                    prev = t
        src += lens[q]
        off[q + 1] = pos
    return off, out[:pos].copy()


DIRECT_MIN_CUTS = 256
"""A k-node with at least this many cuts gets a direct table (below that, the search is a few
cached reads)."""


@njit(cache=True)
def direct_cuts(T, u):
    """The direct table of k-node ``u``: for every term id ``w`` up to its last cut's high
    keyword, the index of the last cut whose low keyword is ``<= w`` (0 when none is), which is
    what the kernel's binary search finds. O(terms + cuts)."""
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    off = T[T_NI][u, F_CHOFF]
    nch = T[T_NI][u, F_NCH]
    out = np.zeros(CHI[off + nch - 1] + 1, np.int32)
    for i in range(1, nch):
        lo = CLO[off + i]
        hi = CLO[off + i + 1] if i + 1 < nch else out.shape[0]
        out[lo:hi] = i
    return out


@njit(cache=True)
def direct_leaves(T, S, u):
    """For k-node ``u``: per term id ``w``, the leaf under a cut of ``w`` alone, with its first
    record and its number of records (``-1, -1, -1`` where ``w`` has no such cut), and
    (``D3_DUMMY_KEY``) whether a clause in ``u``'s dummy subtree has ``w`` as its keyword at
    ``u``'s offset: only a message holding one of those can match there, so the matching
    without traces skips the dummy for the others (docs/APTREE.md, departure 14). A clause
    without a keyword at that offset marks every term. Rows run to the last cut's high keyword
    or the highest dummy key; a message term beyond them visits the dummy. Exact only for the
    tree as it is now. O(terms + cuts + the dummy subtree)."""
    NI = T[T_NI]
    CH = T[T_CH]
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    LI = T[T_LI]
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    off = NI[u, F_CHOFF]
    nch = NI[u, F_NCH]
    l = NI[u, F_L]
    keys = List()
    keys.append(np.int64(0))
    keys.pop()
    every = False
    d = NI[u, F_DUMMY]
    stack = List()
    if d >= 0:
        stack.append(np.int64(d))
    while len(stack) > 0:
        v = stack.pop()
        if NI[v, F_TYPE] == LEAF:
            for k in range(NI[v, F_LOFF], NI[v, F_LOFF] + NI[v, F_LLEN]):
                c = LI[k]
                if c < 0:
                    continue
                if cl_len[c] > l:
                    keys.append(np.int64(terms[cl_off[c] + l]))
                else:
                    every = True
            continue
        if NI[v, F_DUMMY] >= 0:
            stack.append(np.int64(NI[v, F_DUMMY]))
        for i in range(NI[v, F_CHOFF], NI[v, F_CHOFF] + NI[v, F_NCH]):
            if CH[i] >= 0:
                stack.append(np.int64(CH[i]))
    n = CHI[off + nch - 1] + 1
    for w in keys:
        n = max(n, w + 1)
    out = np.full((n, 4), -1, np.int64)
    out[:, D3_DUMMY_KEY] = 1 if every else 0
    for w in keys:
        out[w, D3_DUMMY_KEY] = 1
    for i in range(nch):
        w = CLO[off + i]
        c = CH[off + i]
        if w == CHI[off + i] and w >= 0 and c >= 0 and NI[c, F_TYPE] == LEAF:
            out[w, 0] = c
            out[w, 1] = NI[c, F_LOFF]
            out[w, 2] = NI[c, F_LLEN]
    return out


PREFETCH_TERMS_AHEAD = 6
"""The kernels ask for the rows of a message's terms (its term stamps, its leaves by term or
its direct-table entries) this many messages ahead ..."""
PREFETCH_LEAVES_AHEAD = 3
"""... and for the first ``PREFETCH_LINES`` records of its leaves by term this many ahead.
Chosen on the 1M workloads (places, default, Zipf; docs/BENCHMARKS.md, twenty-third session):
6 / 3 / 8 against 2 / 1 / 2, 4 / 2 / 2-8, 8 / 4 / 3-10 and 16 / 8 / 8 were within 2 % of each
other on places and the default workload and faster than none by 7-20 %; Zipf (whose time is its
matches) gained nothing either way."""
PREFETCH_LINES = 8
"""Records (64 bytes: a cache line each) of a leaf asked for ahead; the CPU's own prefetcher
follows a longer leaf once the scan reads it in order."""
D3_DUMMY_KEY = 3
"""``direct_leaves``' column: 1 where the term is a dummy clause's keyword at the node."""
CANDIDATES = 128
"""A leaf is scanned this many entries at a time: their box tests first, then the rest of the
test for the entries that passed."""
NO_LEAVES = np.full((0, 4), -1, np.int64)
"""An empty ``direct_leaves`` table: every term takes the cut's way."""


@njit(cache=True)
def match_kernel(T, S, TM, SM, stamp0, m_off, m_terms, m_kind, m_geom, DIR, dnode, D3, room):
    """Match every message of the batch (``DIR``: the direct table of node ``dnode``, or -1;
    ``D3``: its ``direct_leaves``, or ``NO_LEAVES``; ``room``: the pairs to make room for first,
    ``PairRoom``).
    Returns (message index, subscription slot) pairs, the last stamp used, the number of leaf
    entries verified (the paper's cost measure) and of direct-table answers found stale. Cost
    per message: the nodes visited plus O(|c|) per clause verified."""
    out_m, out_s, stamp, verified, _, _, _, misses = traverse_kernel(
        T, S, TM, SM, stamp0, m_off, m_terms, m_kind, m_geom, T[T_CNT][C_ROOT], False, DIR, dnode,
        D3, room,
    )  # fmt: skip
    return out_m, out_s, stamp, verified, misses


FULL_NONE, FULL_OUT, FULL_STACK, FULL_TRACE = 0, 1, 2, 3
"""Why ``_traverse`` stopped: every message matched, or an array (the pairs, the stack, the
trace) had no room for the message it was on."""


@njit(cache=True)
def traverse_kernel(T, S, TM, SM, stamp0, m_off, m_terms, m_kind, m_geom, start, trace, DIR, dnode, D3, room):  # fmt: skip
    """Alg. 1 from node ``start`` (the root, or a rebuilt subtree with η = 0), ``DIR`` the direct
    table of node ``dnode`` (``direct_cuts``; -1: none), ``D3`` its leaves by term
    (``direct_leaves``, exact for the tree as it is; ``NO_LEAVES``: none). With ``trace``
    it also returns every node each message visited, in visiting order, as (message index, node,
    dead end) where a dead end is a child the message would enter that does not exist (a missing
    dummy, an empty cell or cut): the AP+-Tree stores messages along these traces.

    The work is ``_traverse``'s, over arrays it never replaces: a compiled loop that may replace
    an array (grow it) pays a reference count at every use of it, which cost the loop ~10× on a
    stack machine of this kind (docs/BENCHMARKS.md, twenty-seventh session). When an array is
    full, ``_traverse`` stops at the start of the message it was on; this grows that array and
    has it go on from there. The pair arrays start with ``room`` (``PairRoom``)."""
    out_m = np.empty(max(room, 16), np.int32)
    out_s = np.empty(max(room, 16), np.int32)
    stack_n = np.empty(256, np.int64)
    stack_e = np.empty(256, np.int64)
    cap = 4096 if trace else 1
    tr_m = np.empty(cap, np.int32)
    tr_n = np.empty(cap, np.int32)
    tr_d = np.zeros(cap, np.bool_)
    q = 0
    nout = 0
    ntr = 0
    stamp = stamp0
    verified = 0
    misses = 0
    while True:
        q, nout, ntr, stamp, verified, misses, full = _traverse(
            T, S, TM, SM, stamp, m_off, m_terms, m_kind, m_geom, start, trace, DIR, dnode, D3,
            q, out_m, out_s, nout, stack_n, stack_e, tr_m, tr_n, tr_d, ntr, verified, misses,
        )  # fmt: skip
        if full == FULL_NONE:
            break
        if full == FULL_OUT:
            out_m = grown(out_m, out_m.shape[0])
            out_s = grown(out_s, out_s.shape[0])
        elif full == FULL_STACK:
            stack_n = grown(stack_n, stack_n.shape[0])
            stack_e = grown(stack_e, stack_e.shape[0])
        else:
            tr_m = grown(tr_m, tr_m.shape[0])
            tr_n = grown(tr_n, tr_n.shape[0])
            tr_d = grown(tr_d, tr_d.shape[0])
    return (
        trimmed(out_m, nout),
        trimmed(out_s, nout),
        stamp,
        verified,
        trimmed(tr_m, ntr),
        trimmed(tr_n, ntr),
        trimmed(tr_d, ntr),
        misses,
    )


@njit(cache=True)
def _traverse(T, S, TM, SM, stamp, m_off, m_terms, m_kind, m_geom, start, trace, DIR, dnode, D3, q0, out_m, out_s, nout, stack_n, stack_e, tr_m, tr_n, tr_d, ntr, verified, misses):  # fmt: skip
    """``traverse_kernel``'s loop from message ``q0``, the pairs, trace and counters so far
    given. Returns (message, pairs, trace entries, stamp, verified, misses, why it stopped):
    on ``FULL_*`` the message it stopped at and the counts as they were before it."""
    NI = T[T_NI]
    CH = T[T_CH]
    CLO = T[T_CLO]
    CHI = T[T_CHI]
    BND = T[T_BND]
    LI = T[T_LI]
    LB = T[T_LB]
    LBI = LB.view(np.int32)
    bbox = S[1]
    circ = S[2]
    cl_off = S[4]
    cl_len = S[5]
    terms = S[6]
    nm = m_kind.shape[0]
    cap_out = out_m.shape[0]
    cap_stack = stack_n.shape[0]
    cap_tr = tr_m.shape[0]
    cand = np.empty(CANDIDATES, np.int64)
    for q in range(q0, nm):
        # the loads of the messages ahead, started now (module docstring): the rows of
        # the terms of message q + PREFETCH_TERMS_AHEAD, the first records of the leaves
        # of message q + PREFETCH_LEAVES_AHEAD (whose rows were asked for earlier)
        if q + PREFETCH_TERMS_AHEAD < nm:
            for i in range(m_off[q + PREFETCH_TERMS_AHEAD], m_off[q + PREFETCH_TERMS_AHEAD + 1]):
                w = m_terms[i]
                prefetch(TM, w)
                if w < D3.shape[0]:
                    prefetch(D3, w)
                elif w < DIR.shape[0]:
                    prefetch(DIR, w)
        if q + PREFETCH_LEAVES_AHEAD < nm and D3.shape[0] > 0:
            for i in range(m_off[q + PREFETCH_LEAVES_AHEAD], m_off[q + PREFETCH_LEAVES_AHEAD + 1]):
                w = m_terms[i]
                if w < D3.shape[0] and D3[w, 0] >= 0:
                    for k in range(D3[w, 1], D3[w, 1] + min(PREFETCH_LINES, D3[w, 2])):
                        prefetch(LB, k)
        # as they were before message q (given back when an array is full)
        nout_q = nout
        ntr_q = ntr
        verified_q = verified
        misses_q = misses
        stamp += 1
        t0 = m_off[q]
        t1 = m_off[q + 1]
        mlen = t1 - t0
        for i in range(t0, t1):
            TM[m_terms[i]] = stamp
        is_point = m_kind[q] == 0
        gx0 = m_geom[q, 0]
        gy0 = m_geom[q, 1]
        gx1 = m_geom[q, 2]
        gy1 = m_geom[q, 3]
        if mlen == 0:
            continue
        stack_n[0] = start
        stack_e[0] = 0
        top = 1
        while top > 0:
            top -= 1
            u = stack_n[top]
            eta = stack_e[top]
            if u < 0:  # the root's leaf of term -u - 2, by ``D3``: no node row read
                w = -u - 2
                u = D3[w, 0]
                typ = LEAF
                loff = D3[w, 1]
                llen = D3[w, 2]
            else:
                typ = NI[u, F_TYPE]
                loff = NI[u, F_LOFF]
                llen = NI[u, F_LLEN]
            if trace:
                if ntr == cap_tr:
                    return q, nout_q, ntr_q, stamp, verified_q, misses_q, FULL_TRACE
                tr_m[ntr] = q
                tr_n[ntr] = u
                tr_d[ntr] = False
                ntr += 1
            if typ == LEAF:
                verified += llen
                for c0 in range(loff, loff + llen, CANDIDATES):
                    # the leaf's own record of each entry (``LB_*``): box, slot, kind, terms;
                    # only a clause longer than LB_INLINE_TERMS or a circle reads the store.
                    # First the entries whose box meets the message, without a branch (module
                    # docstring), then the rest of the test for those
                    c1 = min(c0 + CANDIDATES, loff + llen)
                    nc = boxes_meeting(LB, c0, c1, gx0, gy0, gx1, gy1, cand)
                    for ci in range(nc):
                        k = cand[ci]
                        s = LBI[k, LBI_SLOT]
                        flags = LBI[k, LBI_KIND]
                        once = is_point and not (flags & LBK_MULTI)  # (the module's docstring)
                        if not once and SM[s] == stamp:
                            continue
                        nt = LBI[k, LBI_NT]
                        if nt <= LB_INLINE_TERMS:
                            hit = True
                            for j in range(nt):
                                if TM[LBI[k, LBI_T + j]] != stamp:
                                    hit = False
                                    break
                            if not hit:
                                continue
                        else:
                            c = LI[k]
                            if not all_stamped(TM, terms, cl_off[c], cl_off[c] + cl_len[c], stamp):
                                continue
                        if (flags & LBK_KIND) == KIND_CIRCLE and not exact_hit(
                            KIND_CIRCLE, bbox[s], circ[s], is_point, gx0, gy0, m_geom[q]
                        ):
                            continue
                        if not once:
                            SM[s] = stamp
                        if nout == cap_out:
                            return q, nout_q, ntr_q, stamp, verified_q, misses_q, FULL_OUT
                        out_m[nout] = q
                        out_s[nout] = s
                        nout += 1
            elif typ == KNODE:
                if top + 1 + mlen - eta > cap_stack:  # the dummy and a child per keyword
                    return q, nout_q, ntr_q, stamp, verified_q, misses_q, FULL_STACK
                d = NI[u, F_DUMMY]
                if d >= 0 and not trace and u == dnode and D3.shape[0] > 0:
                    # without traces (nothing stored on the dummy's lists) only a message
                    # holding a dummy clause's keyword at this node can match there
                    need = False
                    for i in range(t0, t1):
                        w = m_terms[i]
                        if w >= D3.shape[0] or D3[w, D3_DUMMY_KEY] != 0:
                            need = True
                            break
                    if not need:
                        d = -1
                top = _enter(stack_n, stack_e, top, d, eta, trace, tr_d, ntr)
                off = NI[u, F_CHOFF]
                nch = NI[u, F_NCH]
                last = -1
                for i in range(eta, mlen):
                    w = m_terms[t0 + i]
                    if w > CHI[off + nch - 1]:
                        break
                    if u == dnode and w < D3.shape[0] and D3[w, 0] >= 0:
                        # w's own leaf, straight from the term (a cut of w alone is reached
                        # by no other keyword of the message)
                        stack_n[top] = -w - 2
                        stack_e[top] = 0
                        top += 1
                        continue
                    # the last cut whose low keyword is <= w
                    lo = 0
                    hi = nch - 1
                    if u == dnode:
                        h = DIR[w] if w < DIR.shape[0] else -1
                        if (
                            0 <= h < nch
                            and (h == 0 or CLO[off + h] <= w)
                            and (h == nch - 1 or CLO[off + h + 1] > w)
                        ):
                            lo = hi = h
                        else:
                            misses += 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if CLO[off + mid] <= w:
                            lo = mid
                        else:
                            hi = mid - 1
                    if lo == last or CLO[off + lo] > w or w > CHI[off + lo]:
                        continue
                    last = lo
                    child = CH[off + lo]
                    # a child refining this cut at the same offset still needs keyword i
                    nxt = i if child >= 0 and NI[child, F_L] == NI[u, F_L] else i + 1
                    top = _enter(stack_n, stack_e, top, child, nxt, trace, tr_d, ntr)
            else:
                off = NI[u, F_CHOFF]
                boff = NI[u, F_BOFF]
                nx = NI[u, F_NX]
                ny = NI[u, F_NY]
                if is_point:
                    x0 = x1 = cell_of(BND, boff, nx, gx0)
                    y0 = y1 = cell_of(BND, boff + nx + 1, ny, gy0)
                else:
                    x0, x1 = cell_range(BND, boff, nx, gx0, gx1)
                    y0, y1 = cell_range(BND, boff + nx + 1, ny, gy0, gy1)
                if top + 1 + (x1 - x0 + 1) * (y1 - y0 + 1) > cap_stack:  # the dummy and cells
                    return q, nout_q, ntr_q, stamp, verified_q, misses_q, FULL_STACK
                top = _enter(stack_n, stack_e, top, NI[u, F_DUMMY], eta, trace, tr_d, ntr)
                for a in range(x0, x1 + 1):
                    for b in range(y0, y1 + 1):
                        child = CH[off + a * ny + b]
                        top = _enter(stack_n, stack_e, top, child, eta, trace, tr_d, ntr)
    return nm, nout, ntr, stamp, verified, misses, FULL_NONE
