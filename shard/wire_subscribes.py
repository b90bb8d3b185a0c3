"""A round of new plain subscriptions read from its wire bytes straight into columns.

Why: a shard's round of single Subscribes (tens of them, after the shard sat idle) spent more
on Python objects than on its index: msgpack's tuples and strings, a ``Subscription`` each,
validated twice, then each term looked up in a dictionary of ~400,000 (docs/BENCHMARKS.md,
thirtieth session). Here one compiled pass over the round's msgpack bytes (``shard.wire``'s
format, unchanged) finds every field, checks it as ``shard.wire.loads_ops`` and the shard's own
validation would, and hands back columns: the regions, the flags, the tags, and the terms as
spans of the bytes, which the store looks up in its compiled vocabulary (``SubscriptionStore
.add_plain``). Only the ids become Python strings.

It reads only what it is sure of: a round holding anything else (a publish, a subscription with
NOT, predicates, a polygon or a rank, a top-k one, a number of an unusual type, bad UTF-8, a
value out of range, an id given twice, ...) gives None, and the shard reads it the general way
(``loads_ops``), which accepts it or names what is wrong. So the fast path never accepts what
the general one refuses, nor refuses anything itself.

>>> from shard.model import Circle, Rect, Subscription
>>> from shard.wire import dumps_ops
>>> a = Subscription("a", (("ipad", "sale"), ("x",)), Rect(0.0, 0.0, 1.0, 1.0), moving=True)
>>> b = Subscription("b", (("y",),), Circle(2.0, 3.0, 500.0))
>>> p = read_plain_subscribes(dumps_ops([("sub", a, 4), ("sub", b, -1)]))
>>> p.ids, p.tags.tolist(), p.n_clauses.tolist(), p.clause_len.tolist()
(['a', 'b'], [4, -1], [2, 1], [2, 1, 1])
>>> [p.term(i) for i in range(len(p.term_start))], p.moving.tolist(), p.kind.tolist()
(['ipad', 'sale', 'x', 'y'], [True, False], [0, 1])
>>> read_plain_subscribes(dumps_ops([("unsub", "a")])) is None
True
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
from numba import njit

from shard.geometry import circle_bbox
from shard.limits import MAX_CLAUSE_TERMS, MAX_CLAUSES, MAX_ID_LEN, MAX_RADIUS_M

_BAD = -1
_BIG_ENDIAN_HOST = sys.byteorder == "big"
MIN_OP_BYTES = 18
"""The fewest bytes a plain "S" operation takes (``[S, a, [[b]], [1, 0, 0, 1], false, nil,
nil, -1]``): a round's header claiming more operations than its bytes can hold is refused
before anything is allocated for them."""


@njit(cache=True)
def _uint(buf, p, n):
    x = 0
    for i in range(n):
        x = (x << 8) | np.int64(buf[p + i])
    return x


@njit(cache=True)
def _header(buf, p, end, fix, fix_mask, wide, wide_log, n_wide):
    """(length, first byte after the header) of a msgpack length header at ``p``: a "fix" code
    (``fix`` ... ``fix + fix_mask``, the length in its low bits) or one of ``n_wide`` codes from
    ``wide`` whose length follows in 2**(``wide_log`` + k) big-endian bytes; length -1 when there
    is no such header or it is cut short."""
    if p >= end:
        return _BAD, p
    b = np.int64(buf[p])
    if fix <= b <= fix + fix_mask:
        return b & fix_mask, p + 1
    if wide <= b < wide + n_wide:
        n = 1 << (wide_log + b - wide)
        if p + 1 + n <= end:
            return _uint(buf, p + 1, n), p + 1 + n
    return _BAD, p


@njit(cache=True)
def _array_len(buf, p, end):
    """(items, next position) of an array header at ``p`` (fixarray, array 16, array 32);
    items -1 when there is none."""
    return _header(buf, p, end, 0x90, 0x0F, 0xDC, 1, 2)


@njit(cache=True)
def _str_span(buf, p, end):
    """(start, stop) of a string's bytes at ``p`` (fixstr, str 8, 16, 32; start -1: no string
    there, or cut short)."""
    n, a = _header(buf, p, end, 0xA0, 0x1F, 0xD9, 0, 3)
    if n < 0:
        return _BAD, p
    if a + n > end:
        return _BAD, p
    return a, a + n


@njit(cache=True)
def _utf8(buf, a, b):
    """Whether ``buf[a:b]`` is strict UTF-8, as Python decodes it (no surrogates, no overlong
    forms)."""
    i = a
    while i < b:
        c = buf[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return False
        n = 1 if c < 0xE0 else (2 if c < 0xF0 else 3)
        if i + n >= b:
            return False
        c1 = buf[i + 1]
        if c == 0xE0 and c1 < 0xA0 or c == 0xED and c1 > 0x9F:
            return False
        if c == 0xF0 and c1 < 0x90 or c == 0xF4 and c1 > 0x8F:
            return False
        for k in range(1, n + 1):
            if buf[i + k] & 0xC0 != 0x80:
                return False
        i += n + 1
    return True


@njit(cache=True)
def _number(buf, p, end, f64, b8, f32, b4):
    """(ok, value, next position) of an integer or a float at ``p`` (not a bool: the fast path
    leaves other types to the general one)."""
    if p >= end:
        return False, 0.0, p
    b = buf[p]
    if b <= 0x7F:
        return True, float(b), p + 1
    if b >= 0xE0:
        return True, float(np.int64(b) - 256), p + 1
    if b == 0xCB and p + 9 <= end:
        for i in range(8):
            b8[7 - i] = buf[p + 1 + i]
        return True, f64[0], p + 9
    if b == 0xCA and p + 5 <= end:
        for i in range(4):
            b4[3 - i] = buf[p + 1 + i]
        return True, np.float64(f32[0]), p + 5
    ok, v, q = _integer(buf, p, end)
    return ok, float(v), q


@njit(cache=True)
def _integer(buf, p, end):
    """(ok, value, next position) of an integer that fits in int64 at ``p``."""
    if p >= end:
        return False, 0, p
    b = buf[p]
    if b <= 0x7F:
        return True, np.int64(b), p + 1
    if b >= 0xE0:
        return True, np.int64(b) - 256, p + 1
    if 0xCC <= b <= 0xCE:  # uint 8, 16, 32
        n = 1 << (b - 0xCC)
        if p + 1 + n <= end:
            return True, _uint(buf, p + 1, n), p + 1 + n
    if 0xD0 <= b <= 0xD3:  # int 8, 16, 32, 64
        n = 1 << (b - 0xD0)
        if p + 1 + n <= end:
            v = _uint(buf, p + 1, n)
            if n < 8 and v >= 1 << (8 * n - 1):
                v -= 1 << (8 * n)
            return True, v, p + 1 + n
    return False, 0, p


@njit(cache=True)
def _scan(buf):
    """Every field of a round of plain "S" operations, checked; status 0 when the round is
    one, else the fast path does not take it (nothing is said why: the general path will)."""
    end = buf.shape[0]
    n, p = _array_len(buf, 0, end)
    if n > (end - p) // MIN_OP_BYTES:  # a header that lies: nothing allocated for its claim
        n = -1
    cap = end // 2 + 1  # (a term takes 2 bytes or more, a clause 3)
    id_a = np.empty(max(n, 0), np.int64)  # each id's bytes
    id_b = np.empty(max(n, 0), np.int64)
    n_cl = np.empty(max(n, 0), np.int32)
    kind = np.empty(max(n, 0), np.int8)
    geo = np.empty((max(n, 0), 4), np.float64)
    circ = np.empty((max(n, 0), 3), np.float64)
    moving = np.empty(max(n, 0), np.bool_)
    tags = np.empty(max(n, 0), np.int32)
    cl_len = np.empty(end // 3 + 1, np.int32)
    t_a = np.empty(cap, np.int64)
    t_b = np.empty(cap, np.int64)
    b8 = np.empty(8, np.uint8)
    b4 = np.empty(4, np.uint8)
    f64 = b8.view(np.float64)
    f32 = b4.view(np.float32)
    n_clauses = 0
    n_terms = 0
    status = 0
    if n < 1:
        status = 1
    i = 0
    while status == 0 and i < n:
        status = 2  # until the operation is read whole
        k, p = _array_len(buf, p, end)
        if k != 8 or p + 2 > end or buf[p] != 0xA1 or buf[p + 1] != 0x53:  # ["S", ... 8 items
            break
        a, b = _str_span(buf, p + 2, end)
        if a < 0 or not _utf8(buf, a, b):
            break
        id_a[i], id_b[i], p = a, b, b
        m, p = _array_len(buf, p, end)
        if not 1 <= m <= MAX_CLAUSES:
            break
        good = True
        for _ in range(m):
            t, p = _array_len(buf, p, end)
            if not 1 <= t <= MAX_CLAUSE_TERMS:
                good = False
                break
            for _ in range(t):
                a, b = _str_span(buf, p, end)
                if a < 0 or b == a or not _utf8(buf, a, b):
                    good = False
                    break
                t_a[n_terms], t_b[n_terms], p = a, b, b
                n_terms += 1
            if not good:
                break
            cl_len[n_clauses] = t
            n_clauses += 1
        if not good:
            break
        n_cl[i] = m
        r, p = _array_len(buf, p, end)  # [0, x0, y0, x1, y1] or [1, lon, lat, radius_m]
        if r < 4 or r > 5 or p >= end or buf[p] != 5 - r:
            break
        kind[i] = 5 - r
        p += 1
        for j in range(r - 1):
            ok, v, p = _number(buf, p, end, f64, b8, f32, b4)
            if not ok:
                good = False
                break
            geo[i, j] = v
        if not good:
            break
        x0, y0, x1, y1 = geo[i, 0], geo[i, 1], geo[i, 2], geo[i, 3]
        if r == 5:
            if not (-180.0 <= x0 <= x1 <= 180.0 and -90.0 <= y0 <= y1 <= 90.0):
                break
            circ[i, 0], circ[i, 1], circ[i, 2] = 0.0, 0.0, 0.0
        elif not (-180.0 <= x0 <= 180.0 and -90.0 <= y0 <= 90.0 and 0.0 < x1 <= MAX_RADIUS_M):
            break
        else:  # a circle: indexed by its box
            circ[i, 0], circ[i, 1], circ[i, 2] = x0, y0, x1
            geo[i, 0], geo[i, 1], geo[i, 2], geo[i, 3] = circle_bbox(x0, y0, x1)
        if p >= end or buf[p] != 0xC2 and buf[p] != 0xC3:
            break
        moving[i] = buf[p] == 0xC3
        p += 1
        if p < end and buf[p] == 0xC0:  # keywords: nil or strings
            p += 1
        else:
            kw, p = _array_len(buf, p, end)
            if kw < 0:
                break
            for _ in range(kw):
                a, b = _str_span(buf, p, end)
                if a < 0 or not _utf8(buf, a, b):
                    good = False
                    break
                p = b
            if not good:
                break
        if p < end and buf[p] == 0xC0:  # expr: nil or a string
            p += 1
        else:
            a, b = _str_span(buf, p, end)
            if a < 0 or not _utf8(buf, a, b):
                break
            p = b
        ok, tag, p = _integer(buf, p, end)
        if not ok or not -1 <= tag < 2**31:
            break
        tags[i] = tag
        status = 0
        i += 1
    if status == 0 and p != end:
        status = 3
    joined = np.empty(0, np.uint8)
    if status == 0:  # the ids, joined by NUL (which no valid id holds), to decode at once
        size = n - 1
        for i in range(n):
            size += id_b[i] - id_a[i]
        joined = np.empty(size, np.uint8)
        q = 0
        for i in range(n):
            chars = 0
            for x in range(id_a[i], id_b[i]):
                c = buf[x]
                if c == 0:
                    status = 4
                chars += c & 0xC0 != 0x80
                joined[q] = c
                q += 1
            if not 1 <= chars <= MAX_ID_LEN:
                status = 4
            if i < n - 1:
                joined[q] = 0
                q += 1
    return status, joined, n_cl, cl_len[:n_clauses], t_a[:n_terms], t_b[:n_terms], kind, geo, circ, moving, tags  # fmt: skip


@dataclass(slots=True)
class PlainSubscribes:
    """A round of new plain subscriptions as columns: per subscription its id, tag, region
    (``kind``; ``bbox`` the box indexed, ``circle`` lon, lat, radius for a circle), moving flag
    and number of clauses; per clause its number of terms; per term its bytes'
    ``buf[term_start:term_stop]`` (the round's bytes)."""

    ids: list[str]
    tags: np.ndarray
    kind: np.ndarray
    bbox: np.ndarray
    circle: np.ndarray
    moving: np.ndarray
    n_clauses: np.ndarray
    clause_len: np.ndarray
    buf: np.ndarray
    term_start: np.ndarray
    term_stop: np.ndarray

    def term(self, i: int) -> str:
        return bytes(self.buf[self.term_start[i] : self.term_stop[i]]).decode()


def read_plain_subscribes(data: bytes) -> PlainSubscribes | None:
    """The round ``data`` (``shard.wire.dumps_ops``' bytes) as columns when it holds only
    plain subscribes with distinct, valid ids and valid fields; None otherwise (module
    docstring). O(bytes)."""
    if _BIG_ENDIAN_HOST:  # (the scan turns msgpack's big-endian floats around for this host)
        return None
    buf = np.frombuffer(data, np.uint8)
    try:
        scanned = _scan(buf)
    except MemoryError:  # (its arrays are a few times the round's bytes: the general path says)
        return None
    status, joined, n_cl, cl_len, t_a, t_b, kind, bbox, circle, moving, tags = scanned
    if status:
        return None
    ids = joined.tobytes().decode().split("\x00")  # (the scan checked their lengths)
    if len(set(ids)) != len(ids) or not all(map(str.isprintable, ids)):  # (validate_id)
        return None
    return PlainSubscribes(ids, tags, kind, bbox, circle, moving, n_cl, cl_len, buf, t_a, t_b)
