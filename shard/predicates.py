"""Attribute predicates checked compiled: every subscription's conjunction of predicates
(``shard.attributes``) as columns under an int row, messages' attributes as CSR columns, and
one compiled call that decides a batch of (row, message) pairs. Also the exact per-predicate
check ``holds`` that the top-k kernels (``shard.topk.kernels``) score with.

An attribute *key* is (attribute name, is-string): numbers and strings of one attribute live
on two axes, so a predicate only ever meets values of its own type (the semantics of
``shard.attributes``). Strings become float ids through an interning table per attribute; a
message's string that no predicate mentions becomes −1, which equals no id, so ``!=`` /
``not in`` hold on it and ``=`` / ``in`` do not. ``<, <=, >, >=, between`` take numbers only,
so the interning order (not lexicographic) never matters. Interned strings are never
forgotten (a removed row leaves its strings' ids in the table).

A batch is encoded against the interning tables of the moment: adding a row that interns a new
key or string makes older batches stale, and ``check_pairs`` refuses them (``generation``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from shard.attributes import (
    OP_BETWEEN,
    OP_EQ,
    OP_GE,
    OP_GT,
    OP_IN,
    OP_LE,
    OP_LT,
    OP_NE,
    OP_NOT_IN,
    OPS,
    SET_OPS,
    Predicate,
    Scalar,
)
from shard.errors import NotFoundError
from shard.sorted_arrays import lower_bound

_OPCODE = {name: i for i, name in enumerate(OPS)}
_EQ, _NE, _LT, _LE, _GT, _GE = OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE
_IN, _BETWEEN = OP_IN, OP_BETWEEN

COMPACT_MIN_DEAD = 1024
"""Freed pool entries tolerated before a compaction is considered; past it the pools are
rewritten once the dead entries outnumber the live ones (amortised O(1) a predicate), as in
``shard.topk.columns``."""


@njit(cache=True, inline="always")
def in_set(v, set_vals, start, n):
    """Whether ``v`` is among the sorted ``set_vals[start:start + n]`` (binary search)."""
    i = lower_bound(set_vals, start, start + n, v)
    return i < start + n and set_vals[i] == v


@njit(cache=True, inline="always")
def holds(op, v, a, b, set_vals, sstart, slen):
    """Whether the predicate (op code, operands ``a``/``b``, list ``set_vals[sstart:sstart +
    slen]``) holds on the value ``v`` of its key, exact for every operator (``!=`` and ``not
    in`` included). O(log n) for the lists, O(1) otherwise."""
    if op == _EQ:
        return v == a
    if op == _NE:
        return v != a
    if op == _LT:
        return v < a
    if op == _LE:
        return v <= a
    if op == _GT:
        return v > a
    if op == _GE:
        return v >= a
    if op == _BETWEEN:
        return a <= v and v <= b
    if op == _IN:
        return in_set(v, set_vals, sstart, slen)
    return not in_set(v, set_vals, sstart, slen)


def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.zeros((max(need, 2 * a.shape[0], 16),) + a.shape[1:], a.dtype)
    b[: a.shape[0]] = a
    return b


class AttributeBatch(NamedTuple):
    """A batch of messages' attributes (``PredicateColumns.encode_messages``): message ``m``'s
    keys are ``keys[off[m]:off[m + 1]]`` ascending, their values beside them in ``vals``."""

    off: np.ndarray
    keys: np.ndarray
    vals: np.ndarray
    generation: int


_POOL = ("p_key", "p_op", "p_a", "p_b", "p_sstart", "p_slen")


class PredicateColumns:
    """Each subscription's predicates under an int row: a row is a slice ``pstart[r] :
    pstart[r] + plen[r]`` of the predicate pool (columns key, op code, operands ``a``/``b``, a
    slice of the ``in``-list pool), sorted by key. Freed rows are reused; freed pool space is
    reclaimed once it outweighs the live rows.

    >>> from shard.attributes import predicates_from_list, attributes_from_mapping
    >>> cols = PredicateColumns()
    >>> r = cols.add(predicates_from_list("where", [{"attr": "price", "op": "<", "value": 5},
    ...     {"attr": "cat", "op": "!=", "value": "toys"}], weighted=False))
    >>> batch = cols.encode_messages([attributes_from_mapping("a", {"price": 4, "cat": "food"}),
    ...     attributes_from_mapping("a", {"price": 4, "cat": "toys"}), ()])
    >>> check_pairs(cols, [r, r, r], [0, 1, 2], batch)
    array([ True, False, False])
    """

    def __init__(self) -> None:
        self.keys: dict[tuple[str, bool], int] = {}
        self.strings: dict[str, dict[str, int]] = {}
        self.generation = 0
        self.n_rows = 0
        self.free: list[int] = []
        self.pstart = np.zeros(0, np.int64)
        self.plen = np.zeros(0, np.int32)
        self.live = np.zeros(0, np.bool_)
        self.n_p = 0
        self.p_key = np.zeros(0, np.int32)
        self.p_op = np.zeros(0, np.int8)
        self.p_a = np.zeros(0)
        self.p_b = np.zeros(0)
        self.p_sstart = np.zeros(0, np.int64)
        self.p_slen = np.zeros(0, np.int32)
        self.n_set = 0
        self.set_vals = np.zeros(0)
        self.dead_p = 0
        self.dead_set = 0

    def __len__(self) -> int:
        """Live rows."""
        return self.n_rows - len(self.free)

    # ---- interning -------------------------------------------------------------------------
    def _key(self, attr: str, is_str: bool) -> int:
        k = self.keys.get((attr, is_str))
        if k is None:
            k = self.keys[(attr, is_str)] = len(self.keys)
            self.generation += 1
        return k

    def _intern(self, attr: str, value: str) -> float:
        table = self.strings.setdefault(attr, {})
        i = table.get(value)
        if i is None:
            i = table[value] = len(table)
            self.generation += 1
        return float(i)

    def _encode(self, preds: Sequence[Predicate]) -> list[tuple]:
        """Pool entries of ``preds``, sorted by key: (key, op, a, b, list values)."""
        out = []
        for p in preds:
            is_str = p.is_string
            key = self._key(p.attr, is_str)
            v = p.value
            a = b = 0.0
            sv: list[float] = []
            if p.op == "between":
                a, b = float(v[0]), float(v[1])  # type: ignore[index,arg-type]
            elif p.op in SET_OPS:
                conv = (lambda s, attr=p.attr: self._intern(attr, s)) if is_str else float
                sv = sorted(conv(s) for s in v)  # type: ignore[union-attr]
            else:
                a = self._intern(p.attr, v) if is_str else float(v)  # type: ignore[arg-type]
            out.append((key, _OPCODE[p.op], a, b, sv))
        out.sort(key=lambda t: t[0])
        return out

    # ---- rows ------------------------------------------------------------------------------
    def add(self, preds: Sequence[Predicate]) -> int:
        """Store a conjunction (no predicates: a row that always holds); returns its row.
        O(predicates + list values).

        >>> from shard.attributes import Predicate
        >>> cols = PredicateColumns()
        >>> cols.add([Predicate("a", "=", 1.0)]), cols.add([Predicate("b", "in", ("x", "y"))])
        (0, 1)
        """
        return self.add_many([preds])[0]

    def add_many(self, many: Iterable[Sequence[Predicate]]) -> list[int]:
        """Store several conjunctions; their rows, in order. The pools grow once.
        O(predicates + list values)."""
        rows: list[int] = []
        p_rows: list[tuple] = []
        set_rows: list[float] = []
        for preds in many:
            if self.free:
                r = self.free.pop()
            else:
                r = self.n_rows
                self.n_rows += 1
                self.pstart = _grow(self.pstart, self.n_rows)
                self.plen = _grow(self.plen, self.n_rows)
                self.live = _grow(self.live, self.n_rows)
            enc = self._encode(preds)
            self.pstart[r] = self.n_p + len(p_rows)
            self.plen[r] = len(enc)
            self.live[r] = True
            for key, op, a, b, sv in enc:
                p_rows.append((key, op, a, b, self.n_set + len(set_rows), len(sv)))
                set_rows.extend(sv)
            rows.append(r)
        if p_rows:
            n0, n1 = self.n_p, self.n_p + len(p_rows)
            for name, col in zip(_POOL, zip(*p_rows, strict=True), strict=True):
                arr = _grow(getattr(self, name), n1)
                arr[n0:n1] = col
                setattr(self, name, arr)
            self.n_p = n1
        if set_rows:
            m1 = self.n_set + len(set_rows)
            self.set_vals = _grow(self.set_vals, m1)
            self.set_vals[self.n_set : m1] = set_rows
            self.n_set = m1
        return rows

    def remove(self, row: int) -> None:
        """Free ``row`` (a later ``add`` reuses it). Raises NotFoundError for a row not stored.
        O(predicates), amortised (compaction).

        >>> from shard.attributes import Predicate
        >>> cols = PredicateColumns()
        >>> r = cols.add([Predicate("a", "=", 1.0)])
        >>> cols.remove(r); cols.add([Predicate("b", "=", 2.0)]) == r
        True
        """
        if not (0 <= row < self.n_rows and self.live[row]):
            raise NotFoundError("predicate row", str(row))
        self.live[row] = False
        self.free.append(row)
        j0, j1 = int(self.pstart[row]), int(self.pstart[row] + self.plen[row])
        self.dead_p += j1 - j0
        self.dead_set += int(self.p_slen[j0:j1].sum())
        self.plen[row] = 0
        if self.dead_p > max(COMPACT_MIN_DEAD, self.n_p - self.dead_p):
            self._compact()

    def _compact(self) -> None:
        """Rewrite the pools with the live rows' entries only. O(pool)."""
        live = np.flatnonzero(self.live[: self.n_rows])
        plen = self.plen[live].astype(np.int64)
        idx = np.repeat(self.pstart[live] - np.cumsum(plen) + plen, plen) + np.arange(plen.sum())
        slen = self.p_slen[idx].astype(np.int64)
        sidx = np.repeat(self.p_sstart[idx] - np.cumsum(slen) + slen, slen) + np.arange(slen.sum())
        for name in ("p_key", "p_op", "p_a", "p_b", "p_slen"):
            setattr(self, name, getattr(self, name)[idx].copy())
        self.p_sstart = np.cumsum(slen) - slen
        self.set_vals = self.set_vals[sidx].copy()
        self.pstart[live] = np.cumsum(plen) - plen
        self.pstart[self.free] = 0
        self.n_p, self.n_set = int(plen.sum()), int(slen.sum())
        self.dead_p = self.dead_set = 0

    def _check(self) -> None:
        """Assert every invariant of the rows and pools."""
        n = self.n_rows
        live = self.live[:n]
        assert sorted(self.free) == np.flatnonzero(~live).tolist(), (self.free, live)
        assert not self.plen[:n][~live].any(), "a free row owns predicates"
        used = np.zeros(self.n_p, np.int64)
        for r in np.flatnonzero(live).tolist():
            j0, j1 = int(self.pstart[r]), int(self.pstart[r] + self.plen[r])
            assert 0 <= j0 <= j1 <= self.n_p, (r, j0, j1, self.n_p)
            used[j0:j1] += 1
            keys = self.p_key[j0:j1]
            assert (np.diff(keys) >= 0).all(), (r, keys)
            for j in range(j0, j1):
                s0, s1 = int(self.p_sstart[j]), int(self.p_sstart[j] + self.p_slen[j])
                assert 0 <= s0 <= s1 <= self.n_set, (r, j, s0, s1)
                assert (np.diff(self.set_vals[s0:s1]) > 0).all(), (r, j, self.set_vals[s0:s1])
                assert (self.p_op[j] in (OP_IN, OP_NOT_IN)) == (s1 > s0), (r, j)
                assert 0 <= self.p_key[j] < len(self.keys), (r, j)
        assert (used <= 1).all(), "two rows share a pool entry"
        assert int(self.n_p - used.sum()) == self.dead_p, (self.n_p, int(used.sum()), self.dead_p)

    # ---- messages --------------------------------------------------------------------------
    def encode_messages(self, messages: Iterable[Sequence[tuple[str, Scalar]]]) -> AttributeBatch:
        """The batch columns of messages' attributes (``attributes_from_mapping`` pairs): per
        message the keys some predicate mentions, ascending, strings as interned ids (−1 when
        unknown); attributes no predicate mentions are left out. O(attributes · log)."""
        off = [0]
        keys: list[int] = []
        vals: list[float] = []
        for attrs in messages:
            pairs = []
            for name, v in attrs:
                is_str = isinstance(v, str)
                k = self.keys.get((name, is_str))
                if k is None:
                    continue
                if is_str:
                    pairs.append((k, float(self.strings.get(name, {}).get(v, -1))))  # type: ignore[arg-type]
                else:
                    pairs.append((k, v))
            pairs.sort()
            keys.extend(k for k, _ in pairs)
            vals.extend(x for _, x in pairs)  # type: ignore[misc]
            off.append(len(keys))
        return AttributeBatch(
            np.asarray(off, np.int64),
            np.asarray(keys, np.int32),
            np.asarray(vals, np.float64),
            self.generation,
        )

    def kernel_columns(self) -> tuple:
        """The tuple ``check_pairs_kernel`` reads."""
        return (
            self.pstart[: self.n_rows],
            self.plen,
            self.live,
            self.p_key,
            self.p_op,
            self.p_a,
            self.p_b,
            self.p_sstart,
            self.p_slen,
            self.set_vals,
        )


@njit(cache=True)
def check_pairs_kernel(cols, rows, msg_index, off, keys, vals):
    """``out[i]``: every predicate of row ``rows[i]`` holds on message ``msg_index[i]``. Each
    predicate's key is found by a binary search over the message's ascending keys, starting
    where the previous (smaller) key was found. O(predicates · log attributes) a pair. Raises
    IndexError for a row not stored or a message not in the batch."""
    pstart, plen, live, p_key, p_op, p_a, p_b, p_sstart, p_slen, set_vals = cols
    n_rows = pstart.shape[0]
    n_msgs = off.shape[0] - 1
    out = np.empty(rows.shape[0], np.bool_)
    for i in range(rows.shape[0]):
        r = rows[i]
        m = msg_index[i]
        if r < 0 or r >= n_rows or not live[r]:
            raise IndexError("a row that is not stored")
        if m < 0 or m >= n_msgs:
            raise IndexError("a message index outside the batch")
        lo = off[m]
        end = off[m + 1]
        ok = True
        for j in range(pstart[r], pstart[r] + plen[r]):
            key = p_key[j]
            lo = lower_bound(keys, lo, end, key)  # (keys ascending: on from the last one)
            if lo == end or keys[lo] != key:
                ok = False
                break
            if not holds(p_op[j], vals[lo], p_a[j], p_b[j], set_vals, p_sstart[j], p_slen[j]):
                ok = False
                break
        out[i] = ok
    return out


def check_pairs(
    cols: PredicateColumns, rows: Sequence[int] | np.ndarray, msg_index, batch: AttributeBatch
) -> np.ndarray:
    """Whether each pair (``rows[i]``, message ``msg_index[i]`` of ``batch``) matches: every
    predicate of the row holds on the message's attributes (``shard.attributes.all_hold``).
    One compiled call; O(predicates · log attributes) a pair. Raises ValueError for a batch
    encoded before an ``add`` that interned something new, IndexError for a row not stored.

    >>> from shard.attributes import Predicate
    >>> cols = PredicateColumns()
    >>> r = cols.add([Predicate("tag", "not in", ("a", "b"))])
    >>> check_pairs(cols, [r, r], [0, 1], cols.encode_messages([[("tag", "c")], [("tag", 1.0)]]))
    array([ True, False])
    """
    if batch.generation != cols.generation:
        raise ValueError("the batch was encoded before the columns interned new keys or strings")
    rows_a = np.ascontiguousarray(rows, np.int64)
    msg_a = np.ascontiguousarray(msg_index, np.int64)
    if rows_a.shape != msg_a.shape or rows_a.ndim != 1:
        raise ValueError(f"rows {rows_a.shape} and msg_index {msg_a.shape} differ")
    return check_pairs_kernel(
        cols.kernel_columns(), rows_a, msg_a, batch.off, batch.keys, batch.vals
    )
