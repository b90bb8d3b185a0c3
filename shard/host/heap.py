"""The garbage collector around long-lived indexes.

A shard holds ~500,000 subscriptions and the coordinator its routing tables: millions of
long-lived objects. Every full collection traverses all of them (~100 ms and more per pass at
1M), stalling rounds. After each bulk (re)load, ``freeze_long_lived`` moves everything alive into
the permanent generation, out of later collections. ``GcPauses`` records how long collections
stop the process, so that a stall shows in the log instead of as unexplained latency.

What a process creates after its last freeze is not frozen. Under traffic the coordinator keeps
a few 100,000 such objects alive (live messages, moved subscriptions, rounds in flight) and
frees them by reference counting; in a 10-minute soak at 5,000 msgs/s its full collections
found 10-75 objects of garbage each. Python's rule for full collections (whenever the old
generation grows by a quarter of what survived the last one) ignores the frozen objects and so
fires over and over, each pass traversing everything made since the last freeze (0.1-0.5 s).
``young_collections_only`` leaves the young generations to Python and never collects the whole
heap unasked; the owner calls ``collect_if_grown`` now and then, which applies Python's rule
with the frozen objects counted among the long-lived: a full collection (and a freeze of its
survivors) once the process's memory blocks have grown by a quarter since the last one, and by
at least ``FULL_MIN_OBJECTS``. Not during a bulk load (``loading``).

Measured and not kept: a young threshold of 50,000 instead of 700 (Python counts allocations
minus deallocations, so while expired messages are freed as fast as new ones are made the
young generation fills with live objects: one collection took 682 ms), and collecting by the
clock with the survivors frozen each time (the coordinator fell seconds behind).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import warnings
from collections.abc import Callable, Iterator

FULL_CHECK_EVERY_S = 30.0
"""How often a process under ``young_collections_only`` looks whether to collect everything."""
FULL_SHARE = 0.25
"""A full collection once the process's memory blocks grew by this share since the last one
(Python's own rule for its long-lived objects)."""
FULL_MIN_OBJECTS = 200_000
"""... and by at least this many objects (a small process collects as often as it needs to)."""
YOUNG_THRESHOLD = 700
"""Net allocations of tracked objects between young collections (Python's default)."""
_NEVER = 1 << 30
_loading = 0
_blocks_after_full = 0
"""``sys.getallocatedblocks()`` right after the last full collection."""
"""Bulk loads under way (``loading``): ``collect_if_grown`` waits for them to end."""


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """A bulk (re)load: what it builds is not garbage, and it ends with ``freeze_long_lived``;
    ``collect_if_grown`` does not collect meanwhile (it would take the load for garbage, and
    collect everything again and again as it grows)."""
    global _loading
    _loading += 1
    try:
        yield
    finally:
        _loading -= 1


def young_collections_only(young: int = YOUNG_THRESHOLD) -> None:
    """Collect the young generations as Python does, never the whole heap unasked.

    >>> young_collections_only(); gc.get_threshold() == (YOUNG_THRESHOLD, 10, _NEVER)
    True
    >>> gc.set_threshold(700, 10, 10)
    """
    gc.set_threshold(young, 10, _NEVER)


def freeze_long_lived() -> int:
    """Collect what an earlier load left behind (unfrozen first, so that its cycles can go),
    then freeze every surviving object; returns how many objects were garbage. O(objects);
    call after a bulk (re)load."""
    global _blocks_after_full
    gc.unfreeze()
    with warnings.catch_warnings():  # what others leaked (unclosed files) is not ours to report
        warnings.simplefilter("ignore", ResourceWarning)
        found = gc.collect()
    gc.freeze()
    _blocks_after_full = sys.getallocatedblocks()
    return found


def collect_if_grown(share: float = FULL_SHARE, least: int = FULL_MIN_OBJECTS) -> int | None:
    """Collect everything not frozen, and freeze the survivors, once the process's memory
    blocks (``sys.getallocatedblocks``: every small object, frozen or not) have grown by more
    than ``share`` since the last full collection, and by at least ``least``; returns how many
    objects the collection found to be garbage (None: not collected). Python's own rule (a
    quarter more long-lived objects) with the frozen ones counted, read in O(1): in steady
    traffic what is made is freed as fast and nothing is collected; garbage that only a
    collection can free grows the count until one comes. (Counting the old generation with
    ``gc.get_objects(2)`` instead stopped the coordinator for ~240 ms a look.) Nothing during a
    bulk load (``loading``).

    >>> collect_if_grown(least=1 << 40) is None
    True
    """
    global _blocks_after_full
    if _loading:
        return None
    blocks = sys.getallocatedblocks()
    if blocks - _blocks_after_full <= max(least, share * _blocks_after_full):
        return None
    found = gc.collect()
    gc.freeze()
    _blocks_after_full = sys.getallocatedblocks()
    return found


class GcPauses:
    """Counts collections per generation and their pauses; ``on_long(generation, seconds,
    objects collected)`` is called for each pause of at least ``long_s``.

    >>> w = GcPauses(long_s=10.0).install()
    >>> _ = gc.collect()
    >>> w.count[2] >= 1 and w.max_s[2] >= 0.0
    True
    >>> w.uninstall()
    """

    def __init__(
        self, *, long_s: float = 0.05, on_long: Callable[[int, float, int], None] | None = None
    ) -> None:
        self.long_s = long_s
        self.on_long = on_long
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def install(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        g = info["generation"]
        dt = time.perf_counter() - self._t0
        self.count[g] += 1
        self.total_s[g] += dt
        self.max_s[g] = max(self.max_s[g], dt)
        if dt >= self.long_s and self.on_long is not None:
            self.on_long(g, dt, info["collected"])
