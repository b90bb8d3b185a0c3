"""A compiled mirror of a term → id dictionary, so that a batch of messages is encoded in one
compiled call instead of one dictionary look-up per term in Python.

Why: at a million subscriptions the vocabulary holds ~400,000 terms. A Python ``dict.get`` on a
term string then costs two or three cache misses (the index table, the entry, the key's bytes to
compare) one after another, ~140 ns a term, and encoding was the largest share of a message's
matching time on real place names (docs/BENCHMARKS.md). Here the batch's terms are joined
into one UTF-8 buffer (one C call), hashed and probed in a loop whose misses overlap.

``VocabTable`` keeps every key it was given, in insertion order (key index ``k``): its bytes
(``kb[ko[k]:ko[k + 1]]``), and ``id_of_key[k]``, the term id the key stands for now. The open-
addressing table holds, per slot, the key's 64-bit FNV-1a hash, its index, its byte offset and
length (-1: empty). A look-up compares the bytes, so it is exact whatever the hashes. Term ids
may be renumbered (``renumber``, after the store's ``reorder_terms``) without rehashing; a key
renumbered to -1 is dropped (looked up as unknown) until ``add`` revives it.

>>> t = VocabTable()
>>> t.add(["ipad", "sale", "straße"], [0, 1, 2])
>>> t.lookup(["sale", "nope", "straße", "ipad"]).tolist()
[1, -1, 2, 0]
>>> t.renumber(np.array([2, 0, 1], np.int32)); t.lookup(["ipad", "sale"]).tolist()
[2, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
from numba import njit

_SEP = 0
"""The byte between two terms of a joined batch. A term holding it (a keyword with a NUL, which
validation allows) is looked up term by term instead (``lookup``)."""

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)

# slot columns
_H, _K, _OFF, _LEN = 0, 1, 2, 3


@njit(cache=True)
def _mix(h):
    """MurmurHash3's 64-bit finalizer: FNV-1a's low bits, which pick the slot, mix poorly."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _fnv(buf, a, b):
    h = _FNV_OFFSET
    for i in range(a, b):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return _mix(h)


@njit(cache=True)
def _insert(tab, h, k, off, length):
    mask = tab.shape[0] - 1
    j = np.int64(h & np.uint64(mask))
    while tab[j, _K] >= 0:
        j = (j + 1) & mask
    tab[j, _H] = np.int64(h)
    tab[j, _K] = k
    tab[j, _OFF] = off
    tab[j, _LEN] = length


@njit(cache=True)
def _rehash(tab, kb, ko, n_keys):
    """Every key 0..n_keys-1 into the (empty) ``tab``."""
    for k in range(n_keys):
        _insert(tab, _fnv(kb, ko[k], ko[k + 1]), k, ko[k], ko[k + 1] - ko[k])


@njit(cache=True)
def _lookup_spans(tab, kb, buf, starts, ends, out):
    """The index of the key ``buf[starts[i]:ends[i]]`` for each i, -1 if absent. First every
    term's hash, then one independent load of its home slot and key bytes (the CPU overlaps
    their cache misses), then the probes, which now mostly hit the cache. The probe is written
    out here, not called: a call per term cost more than the probe itself."""
    n_terms = starts.shape[0]
    hashes = np.empty(n_terms, np.int64)
    homes = np.empty(n_terms, np.int64)
    mask = tab.shape[0] - 1
    for i in range(n_terms):
        h = _fnv(buf, starts[i], ends[i])
        hashes[i] = np.int64(h)
        homes[i] = np.int64(h & np.uint64(mask))
    warm = 0
    for i in range(n_terms):
        warm += tab[homes[i], _OFF]
    for i in range(n_terms):
        off = tab[homes[i], _OFF]
        if off >= 0:
            warm += kb[off]
    for i in range(n_terms):
        a = starts[i]
        n = ends[i] - a
        hi = hashes[i]
        j = homes[i]
        found = -1
        while True:
            k = tab[j, _K]
            if k < 0:
                break
            if tab[j, _H] == hi and tab[j, _LEN] == n:
                off = tab[j, _OFF]
                same = True
                for x in range(n):
                    if kb[off + x] != buf[a + x]:
                        same = False
                        break
                if same:
                    found = k
                    break
            j = (j + 1) & mask
        out[i] = found
    return warm


@njit(cache=True)
def _split_joined(buf, n_terms):
    """(starts, ends) of the ``n_terms`` terms of ``buf``, joined by ``_SEP``."""
    starts = np.empty(n_terms, np.int64)
    ends = np.empty(n_terms, np.int64)
    pos = 0
    end = buf.shape[0]
    for i in range(n_terms):
        starts[i] = pos
        while pos < end and buf[pos] != _SEP:
            pos += 1
        ends[i] = pos
        pos += 1
    return starts, ends


@njit(cache=True)
def _lookup_joined(tab, kb, id_of_key, buf, out):
    """The id of each of the ``out.shape[0]`` terms of ``buf`` (joined by ``_SEP``; -1:
    unknown) into ``out``, in one compiled call: split, probe and the ids. Returns False, with
    ``out`` undefined, when the split did not end at the buffer's end: a term held the
    separator (the caller then looks the terms up one span at a time)."""
    n_terms = out.shape[0]
    starts, ends = _split_joined(buf, n_terms)
    if ends[n_terms - 1] != buf.shape[0]:
        return False
    _lookup_spans(tab, kb, buf, starts, ends, out)
    for i in range(n_terms):
        k = out[i]
        out[i] = id_of_key[k] if k >= 0 else -1
    return True


@njit(cache=True)
def span_ids(tab, kb, id_of_key, buf, starts, ends, out):
    """The id of each term ``buf[starts[i]:ends[i]]`` into ``out`` (-1: unknown); returns how
    many are unknown. (``VocabTable``'s arrays, for a caller's compiled code.)"""
    _lookup_spans(tab, kb, buf, starts, ends, out)
    missing = 0
    for i in range(out.shape[0]):
        k = out[i]
        if k >= 0:
            out[i] = id_of_key[k]
        else:
            missing += 1
    return missing


@njit(cache=True)
def _add_spans(tab, kb, ko, id_of_key, n_keys, buf, starts, ends, ids):
    """``VocabTable.add_spans`` in one call: each key ``buf[starts[i]:ends[i]]`` found gets
    ``ids[i]``, one not found is appended (its bytes, its id) and hashed in. Returns the new
    number of keys, or -1, with nothing changed, when the arrays lack the room."""
    n = starts.shape[0]
    n_bytes = 0
    for i in range(n):
        n_bytes += ends[i] - starts[i]
    if (
        n_keys + n > id_of_key.shape[0]
        or ko[n_keys] + n_bytes > kb.shape[0]
        or 2 * (n_keys + n) > tab.shape[0]
    ):
        return -1
    mask = tab.shape[0] - 1
    for i in range(n):
        a, b = starts[i], ends[i]
        h = _fnv(buf, a, b)
        hi = np.int64(h)
        j = np.int64(h & np.uint64(mask))
        found = -1
        while tab[j, _K] >= 0:
            if tab[j, _H] == hi and tab[j, _LEN] == b - a:
                off = tab[j, _OFF]
                same = True
                for x in range(b - a):
                    if kb[off + x] != buf[a + x]:
                        same = False
                        break
                if same:
                    found = tab[j, _K]
                    break
            j = (j + 1) & mask
        if found >= 0:
            id_of_key[found] = ids[i]
            continue
        off = ko[n_keys]
        for x in range(b - a):
            kb[off + x] = buf[a + x]
        ko[n_keys + 1] = off + b - a
        id_of_key[n_keys] = ids[i]
        tab[j, _H] = hi
        tab[j, _K] = n_keys
        tab[j, _OFF] = off
        tab[j, _LEN] = b - a
        n_keys += 1
    return n_keys


def _utf8(terms: Sequence[str]) -> bytes:
    # surrogatepass: a lone surrogate (valid in a JSON string) is a term like any other
    return "\x00".join(terms).encode("utf-8", "surrogatepass")


class VocabTable:
    """Term strings → term ids, looked up a batch at a time in compiled code (module doc)."""

    def __init__(self) -> None:
        self.n_keys = 0
        self.kb = np.zeros(1024, np.uint8)
        self.ko = np.zeros(1025, np.int64)
        self.id_of_key = np.zeros(1024, np.int32)
        self.tab = np.full((1024, 4), -1, np.int64)

    def __len__(self) -> int:
        return self.n_keys

    def add(self, terms: Sequence[str], ids: Sequence[int] | np.ndarray) -> None:
        """``terms[i]`` stands for ``ids[i]`` from now on (distinct terms). A term dropped by
        ``renumber`` is revived in place. O(their bytes)."""
        n = len(terms)
        if n == 0:
            return
        ids = np.fromiter(ids, np.int32, n)
        joined = _utf8(terms)
        if joined.count(b"\x00") == n - 1:
            buf = np.frombuffer(joined, np.uint8)
            starts, ends = _split_joined(buf, n)
        else:  # a term holds the separator: every term's span
            parts = [t.encode("utf-8", "surrogatepass") for t in terms]
            ends = np.cumsum(np.fromiter(map(len, parts), np.int64, n))
            starts = ends - np.fromiter(map(len, parts), np.int64, n)
            buf = np.frombuffer(b"".join(parts), np.uint8)
        self.add_spans(buf, starts, ends, ids)

    def add_spans(
        self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray
    ) -> None:
        """``add`` of the terms ``buf[starts[i]:ends[i]]`` (UTF-8 bytes; ``ids`` int32) in one
        compiled call: terms read straight from a round's bytes (``shard.wire_subscribes``), or
        ``add``'s. O(their bytes), and O(keys) when the hash table doubles."""
        k = _add_spans(self.tab, self.kb, self.ko, self.id_of_key, self.n_keys, buf, starts, ends, ids)  # fmt: skip
        if k < 0:
            n = starts.shape[0]
            self._reserve(self.n_keys + n, int(self.ko[self.n_keys] + (ends - starts).sum()))
            size = self.tab.shape[0]
            if 2 * (self.n_keys + n) > size:
                while 2 * (self.n_keys + n) > size:
                    size *= 2
                self.tab = np.full((size, 4), -1, np.int64)
                _rehash(self.tab, self.kb, self.ko, self.n_keys)
            k = _add_spans(self.tab, self.kb, self.ko, self.id_of_key, self.n_keys, buf, starts, ends, ids)  # fmt: skip
        self.n_keys = k

    def copy(self) -> VocabTable:
        """An independent table with the same keys and ids."""
        out = VocabTable()
        out.n_keys = self.n_keys
        out.kb, out.ko, out.id_of_key, out.tab = (
            self.kb.copy(),
            self.ko.copy(),
            self.id_of_key.copy(),
            self.tab.copy(),
        )
        return out

    def renumber(self, new_id: np.ndarray) -> None:
        """Every key's id ``i`` becomes ``new_id[i]`` (the store renumbered its terms)."""
        live = self.id_of_key[: self.n_keys] >= 0  # (a key dropped before stays dropped)
        ids = self.id_of_key[: self.n_keys]
        ids[live] = new_id[ids[live]]

    def lookup(self, terms: Sequence[str]) -> np.ndarray:
        """The id of every term (int32, -1: unknown), in order. O(bytes of the terms)."""
        return self._ids_of(self._keys(terms))

    def lookup_lists(self, term_lists: Sequence[Sequence[str]], n: int) -> np.ndarray:
        """``lookup`` of the concatenated ``term_lists`` (``n`` terms in all), without building
        the concatenated list: the usual case of a message batch."""
        joined = "\x00".join(chain.from_iterable(term_lists)).encode("utf-8", "surrogatepass")
        if n:
            out = np.empty(n, np.int32)
            buf = np.frombuffer(joined, np.uint8)
            if _lookup_joined(self.tab, self.kb, self.id_of_key, buf, out):
                return out
        return self.lookup([t for terms in term_lists for t in terms])

    def lookup_spans(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The id of each term ``buf[starts[i]:ends[i]]`` (its UTF-8 bytes; int32, -1:
        unknown): terms read straight from a round's bytes (``shard.wire_subscribes``)."""
        out = np.empty(starts.shape[0], np.int32)
        if out.shape[0]:
            span_ids(self.tab, self.kb, self.id_of_key, buf, starts, ends, out)
        return out

    def _ids_of(self, keys: np.ndarray) -> np.ndarray:
        return np.where(keys >= 0, self.id_of_key[keys], -1).astype(np.int32)

    def _keys(self, terms: Sequence[str]) -> np.ndarray:
        """The key index of every term, -1 if absent."""
        n = len(terms)
        if n == 0:
            return np.empty(0, np.int32)
        joined = _utf8(terms)
        if joined.count(b"\x00") == n - 1:
            return self._keys_joined(joined, n)
        # a term holds the separator: give every term's span instead
        parts = [t.encode("utf-8", "surrogatepass") for t in terms]
        lens = np.fromiter(map(len, parts), np.int64, n)
        ends = np.cumsum(lens)
        out = np.empty(n, np.int32)
        buf = np.frombuffer(b"".join(parts), np.uint8)
        _lookup_spans(self.tab, self.kb, buf, ends - lens, ends, out)
        return out

    def _keys_joined(self, joined: bytes, n: int) -> np.ndarray:
        out = np.empty(n, np.int32)
        buf = np.frombuffer(joined, np.uint8)
        starts, ends = _split_joined(buf, n)
        _lookup_spans(self.tab, self.kb, buf, starts, ends, out)
        return out

    def _reserve(self, keys: int, key_bytes: int) -> None:
        if keys > self.id_of_key.shape[0]:
            cap = max(keys, 2 * self.id_of_key.shape[0])
            self.id_of_key = _grown(self.id_of_key, cap)
            self.ko = _grown(self.ko, cap + 1)
        if key_bytes > self.kb.shape[0]:
            self.kb = _grown(self.kb, max(key_bytes, 2 * self.kb.shape[0]))


def _grown(a: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, a.dtype)
    out[: a.shape[0]] = a
    return out
