"""The garbage collector around long-lived indexes.

A shard holds ~500,000 subscriptions and the coordinator its routing tables: millions of
long-lived objects. Every full collection traverses all of them (~100 ms and more per pass at
1M), stalling rounds. After each bulk (re)load, ``freeze_long_lived`` moves everything alive into
the permanent generation, out of later collections. ``GcPauses`` records how long collections
stop the process, so that a stall shows in the log instead of as unexplained latency.

What a process creates after its last freeze is not frozen. Under traffic the coordinator keeps
~500,000 such objects alive (live messages, moved subscriptions, rounds in flight) and frees
them by reference counting; in a 10-minute soak at 5,000 msgs/s its full collections found
14-75 objects of garbage each. Python's allocation-counted collections cost it anyway: the
count is allocations minus deallocations, so when expired messages are freed as fast as new
ones are made it stays low while the young generation fills with live objects; a young
collection then traversed 40,000-70,000 of them (20-100 ms, several a minute; with a threshold
of 50,000 instead of 700, one took 682 ms), and full collections of what had reached the old
generation took 0.1-0.5 s.

So the coordinator collects by the clock instead (``ClockCollector``): Python's own
collections off, and every ``RECENT_EVERY_S`` one collection of both young generations (what
was made since the last one and is still alive: a few ms), its survivors then frozen, so that
nothing is traversed twice. Cycles among frozen objects are not collected until the next full
collection, which ``tick`` makes (unfreezing everything: ~1.5 s at 1M subscriptions) only once
the frozen objects have grown by ``FULL_GROWTH`` since the last one — garbage that was still
alive when it was frozen is then what grows them.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable

RECENT_EVERY_S = 0.25
"""How often a ``ClockCollector`` collects what was made since its last tick."""
FULL_GROWTH = 0.25
"""A full collection once the frozen objects grew by this share since the last one ..."""
FULL_MIN_OBJECTS = 500_000
"""... and by at least this many objects."""

_frozen_after_full = 0
"""Frozen objects right after the last full collection (``freeze_long_lived``)."""


def freeze_long_lived() -> int:
    """Collect what an earlier load left behind (unfrozen first, so that its cycles can go),
    then freeze every surviving object; returns how many objects were found to be garbage.
    O(objects); call after a bulk (re)load."""
    global _frozen_after_full
    gc.unfreeze()
    with warnings.catch_warnings():  # what others leaked (unclosed files) is not ours to report
        warnings.simplefilter("ignore", ResourceWarning)
        found = gc.collect()
    gc.freeze()
    _frozen_after_full = gc.get_freeze_count()
    return found


class ClockCollector:
    """Collections by the clock: ``start`` turns Python's allocation-counted collections off;
    the owner then calls ``tick`` every ``RECENT_EVERY_S``.

    >>> c = ClockCollector().start(); gc.isenabled()
    False
    >>> c.tick() is None  # (a full collection only once the frozen objects have grown)
    True
    >>> c.stop(); gc.isenabled()
    True
    """

    def start(self) -> ClockCollector:
        gc.disable()
        return self

    def stop(self) -> None:
        gc.enable()

    def tick(self) -> int | None:
        """Collect both young generations and freeze their survivors; if the frozen objects
        have grown by ``FULL_GROWTH`` (and ``FULL_MIN_OBJECTS``) since the last full
        collection, collect everything instead (``freeze_long_lived``) and return how many
        objects it found to be garbage (else None)."""
        gc.collect(1)
        gc.freeze()
        n = gc.get_freeze_count()
        if n - _frozen_after_full > max(FULL_MIN_OBJECTS, FULL_GROWTH * _frozen_after_full):
            return freeze_long_lived()
        return None


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
