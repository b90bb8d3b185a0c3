"""The columns every top-k index keeps its subscriptions in (paper 001, Sect. 3.1 and Table 2):
one slot per subscription (point, α, a slice of the predicate pool), predicates as columns
(attribute key, op code, operands, normalised weight, the Table 2 interval) and ``in`` lists in
a value pool; strings become ids through an interning table per attribute.

An attribute *key* is (attribute name, is-string): numbers and strings of one attribute live
on two axes, so a predicate only ever meets values of its own type (the semantics of
``shard.topk.model``). An event is encoded to (key, value) pairs; a string no predicate
mentions becomes −1, which equals no id (so ``!=`` / ``not in`` hold on it, ``=`` / ``in`` do
not).

Where the paper is ambiguous
----------------------------
* Table 2 maps a predicate to an interval over ``[v_min, v_max]``; we use ``[−inf, +inf]`` as
  the domain (no schema needed) and closed intervals throughout (``< v`` becomes ``[−inf, v]``,
  a superset of ``[v_min, v)``): the interval is only ever a bound, every candidate is scored
  exactly (``shard.predicates.holds``).
* Interned strings are never forgotten (an unsubscribe leaves its strings' ids in the table).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from shard.errors import NotFoundError
from shard.topk.model import OPS, TopKEvent, TopKSubscription

_OPCODE = {name: i for i, name in enumerate(OPS)}
_INF = float("inf")


def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.zeros((max(need, 2 * a.shape[0], 16),) + a.shape[1:], a.dtype)
    b[: a.shape[0]] = a
    return b


class SubColumns:
    """Slots, predicate pool and interning tables (see the module docstring).

    ``add`` / ``remove`` are O(predicates); freed pool space is reclaimed by ``_compact`` once
    it outweighs the live rows (amortised O(1) a row).

    >>> from shard.topk.model import subscription_from_dict
    >>> c = SubColumns()
    >>> c.add(subscription_from_dict({"id": "s", "predicates": [{"attr": "a", "op": "in",
    ...     "value": ["y", "x"]}], "point": [0, 0]}))
    0
    >>> c.p_lo[:1], c.p_hi[:1], c.set_vals[:2]
    (array([0.]), array([1.]), array([0., 1.]))
    """

    def __init__(self) -> None:
        self.keys: dict[tuple[str, bool], int] = {}
        self.strings: dict[str, dict[str, int]] = {}
        self.slot_of: dict[str, int] = {}
        self.ids: list[str | None] = []
        self.free: list[int] = []
        self.x = np.zeros(0)
        self.y = np.zeros(0)
        self.alpha = np.zeros(0)
        self.pstart = np.zeros(0, np.int64)
        self.plen = np.zeros(0, np.int32)
        self.live = np.zeros(0, np.bool_)
        self.n_p = 0
        self.p_key = np.zeros(0, np.int32)
        self.p_op = np.zeros(0, np.int8)
        self.p_a = np.zeros(0)
        self.p_b = np.zeros(0)
        self.p_w = np.zeros(0)
        self.p_lo = np.zeros(0)
        self.p_hi = np.zeros(0)
        self.p_sstart = np.zeros(0, np.int64)
        self.p_slen = np.zeros(0, np.int32)
        self.n_set = 0
        self.set_vals = np.zeros(0)
        self.dead_p = 0
        self.dead_set = 0

    def __len__(self) -> int:
        return len(self.slot_of)

    # ---- interning ---------------------------------------------------------------------------
    def _key(self, attr: str, is_str: bool) -> int:
        k = self.keys.get((attr, is_str))
        if k is None:
            k = self.keys[(attr, is_str)] = len(self.keys)
        return k

    def _intern(self, attr: str, value: str) -> float:
        table = self.strings.setdefault(attr, {})
        i = table.get(value)
        if i is None:
            i = table[value] = len(table)
        return float(i)

    # ---- rows ----------------------------------------------------------------------------
    def _encode(self, sub: TopKSubscription):
        """Rows of ``sub``'s predicates: (key, op, a, b, w, lo, hi, set values)."""
        rows = []
        for p in sub.predicates:
            is_str = p.is_string
            key = self._key(p.attr, is_str)
            op = _OPCODE[p.op]
            v = p.value
            conv = (lambda s, attr=p.attr: self._intern(attr, s)) if is_str else float
            sv: list[float] = []
            a = b = 0.0
            if p.op == "between":
                a, b = float(v[0]), float(v[1])  # type: ignore[index,arg-type]
                lo, hi = a, b  # Table 2: ∈_i [v1, v2] -> [v1, v2]
            elif p.op in ("in", "not in"):
                sv = sorted(conv(s) for s in v)  # type: ignore[union-attr]
                # Table 2: ∈_s -> [v1, vk]; ∉_s -> the whole domain
                lo, hi = (sv[0], sv[-1]) if p.op == "in" else (-_INF, _INF)
            else:
                a = conv(v)  # type: ignore[arg-type]
                if p.op == "=":
                    lo, hi = a, a
                elif p.op == "!=":
                    lo, hi = -_INF, _INF  # Table 2: the whole domain (over-approximation)
                elif p.op in ("<", "<="):
                    lo, hi = -_INF, a
                else:
                    lo, hi = a, _INF
            rows.append((key, op, a, b, p.weight, lo, hi, sv))
        return rows

    def _new_slot(self) -> int:
        if self.free:
            return self.free.pop()
        s = len(self.ids)
        self.ids.append(None)
        n = s + 1
        self.x, self.y, self.alpha = _grow(self.x, n), _grow(self.y, n), _grow(self.alpha, n)
        self.pstart, self.plen = _grow(self.pstart, n), _grow(self.plen, n)
        self.live = _grow(self.live, n)
        return s

    def add(self, sub: TopKSubscription) -> int:
        """Store ``sub`` (its id must not be stored); returns its slot. O(predicates)."""
        return self.add_many([sub])[0]

    def add_many(self, subs: Sequence[TopKSubscription]) -> list[int]:
        """Store several subscriptions (ids not stored, distinct); their slots. O(predicates)."""
        slots = []
        p_rows: list[tuple] = []
        set_rows: list[float] = []
        for sub in subs:
            s = self._new_slot()
            self.ids[s] = sub.id
            self.slot_of[sub.id] = s
            self.x[s], self.y[s], self.alpha[s] = sub.point.lon, sub.point.lat, sub.alpha
            self.pstart[s] = self.n_p + len(p_rows)
            rows = self._encode(sub)
            self.plen[s] = len(rows)
            self.live[s] = True
            for key, op, a, b, w, lo, hi, sv in rows:
                p_rows.append((key, op, a, b, w, lo, hi, self.n_set + len(set_rows), len(sv)))
                set_rows.extend(sv)
            slots.append(s)
        if p_rows:
            self._append_rows(p_rows, set_rows)
        return slots

    def _append_rows(self, p_rows: list[tuple], set_rows: list[float]) -> None:
        n0, n1 = self.n_p, self.n_p + len(p_rows)
        cols = list(zip(*p_rows, strict=True))
        for name, col in zip(
            ("p_key", "p_op", "p_a", "p_b", "p_w", "p_lo", "p_hi", "p_sstart", "p_slen"),
            cols,
            strict=True,
        ):
            arr = _grow(getattr(self, name), n1)
            arr[n0:n1] = col
            setattr(self, name, arr)
        self.n_p = n1
        if set_rows:
            m1 = self.n_set + len(set_rows)
            self.set_vals = _grow(self.set_vals, m1)
            self.set_vals[self.n_set : m1] = set_rows
            self.n_set = m1

    def remove(self, sub_id: str) -> int:
        """Drop ``sub_id``; returns its (now free) slot. Raises NotFoundError. O(predicates)."""
        s = self.slot_of.pop(sub_id, None)
        if s is None:
            raise NotFoundError("subscription", sub_id)
        self.live[s] = False
        self.ids[s] = None
        self.free.append(s)
        j0, j1 = int(self.pstart[s]), int(self.pstart[s] + self.plen[s])
        self.dead_p += j1 - j0
        self.dead_set += int(self.p_slen[j0:j1].sum())
        self.plen[s] = 0
        if self.dead_p > max(1024, self.n_p - self.dead_p):
            self._compact()
        return s

    def _compact(self) -> None:
        """Rewrite the pools with the live slots' rows only. O(rows)."""
        live = np.flatnonzero(self.live[: len(self.ids)])
        plen = self.plen[live].astype(np.int64)
        idx = np.repeat(self.pstart[live] - np.cumsum(plen) + plen, plen) + np.arange(plen.sum())
        new_start = np.cumsum(plen) - plen
        slen = self.p_slen[idx].astype(np.int64)
        sidx = np.repeat(self.p_sstart[idx] - np.cumsum(slen) + slen, slen) + np.arange(slen.sum())
        for name in ("p_key", "p_op", "p_a", "p_b", "p_w", "p_lo", "p_hi", "p_slen"):
            setattr(self, name, getattr(self, name)[idx].copy())
        self.p_sstart = np.cumsum(slen) - slen
        self.set_vals = self.set_vals[sidx].copy()
        self.pstart[live] = new_start
        self.n_p, self.n_set = int(plen.sum()), int(slen.sum())
        self.dead_p = self.dead_set = 0

    def kernel_columns(self) -> tuple:
        """The tuple ``kernels.score_slot`` reads."""
        return (
            self.x,
            self.y,
            self.alpha,
            self.pstart,
            self.plen,
            self.p_key,
            self.p_op,
            self.p_a,
            self.p_b,
            self.p_w,
            self.p_sstart,
            self.p_slen,
            self.set_vals,
        )

    def rows_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(owner index into ``slots``, pool row) of every predicate of ``slots``."""
        plen = self.plen[slots].astype(np.int64)
        owner = np.repeat(np.arange(len(slots)), plen)
        rows = np.repeat(self.pstart[slots] - np.cumsum(plen) + plen, plen) + np.arange(plen.sum())
        return owner, rows

    # ---- events --------------------------------------------------------------------------
    def encode_events(self, events: Iterable[TopKEvent]):
        """(offsets, keys, values, lon, lat) of a batch: each event's attributes that some
        subscription's key mentions, strings as interned ids (−1 when unknown)."""
        off = [0]
        keys: list[int] = []
        vals: list[float] = []
        xs: list[float] = []
        ys: list[float] = []
        for e in events:
            for name, v in e.attributes:
                is_str = isinstance(v, str)
                k = self.keys.get((name, is_str))
                if k is None:
                    continue
                keys.append(k)
                if is_str:
                    vals.append(float(self.strings.get(name, {}).get(v, -1)))  # type: ignore[arg-type]
                else:
                    vals.append(v)  # type: ignore[arg-type]
            off.append(len(keys))
            xs.append(e.point.lon)
            ys.append(e.point.lat)
        return (
            np.asarray(off, np.int64),
            np.asarray(keys, np.int32),
            np.asarray(vals, np.float64),
            np.asarray(xs, np.float64),
            np.asarray(ys, np.float64),
        )

    def ranked(self, off, slots, scores, k: int) -> list[list[tuple[str, float]]]:
        """Per event, the candidates of a kernel's output (CSR) ordered by (−ψ, id), first k."""
        ids = self.ids
        out = []
        for q in range(len(off) - 1):
            a, b = int(off[q]), int(off[q + 1])
            cand = [
                (ids[s], float(v))
                for s, v in zip(slots[a:b].tolist(), scores[a:b].tolist(), strict=True)
            ]
            cand.sort(key=lambda t: (-t[1], t[0]))
            out.append(cand[:k])  # type: ignore[arg-type]
        return out
