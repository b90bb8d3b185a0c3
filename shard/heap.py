"""The garbage collector around long-lived indexes.

A shard holds ~500,000 subscriptions and the coordinator its routing tables: millions of
long-lived objects. Every full collection traverses all of them (~100 ms and more per pass at
1M), stalling rounds. After each bulk (re)load, ``freeze_long_lived`` moves everything alive into
the permanent generation, out of later collections. ``GcPauses`` records how long collections
stop the process, so that a stall shows in the log instead of as unexplained latency.

What a process creates after its last freeze is not frozen. Under traffic the coordinator keeps
~200,000 such objects alive at any time (live messages, moved subscriptions, rounds in flight)
and frees them by reference counting; measured in a 10-minute soak at 5,000 msgs/s, its
collections found no garbage at all (0 objects collected by every collection over 50 ms).
Python's defaults cost it anyway: a young collection every 700 net allocations traversed
40,000-70,000 of those objects (20-100 ms, several a minute), and a full collection, which
Python starts whenever the old generation grows by a quarter of what survived the last one
(ignoring the frozen objects), traversed everything made since the last freeze (0.1-0.5 s).
``young_collections_only`` therefore collects the young generations only every
``YOUNG_THRESHOLD`` net allocations (garbage that is never freed counts: cycles left behind
bring a collection on after that many objects) and never the whole heap unasked; the owner then
calls ``collect_if_grown`` now and then, which applies Python's own rule with the frozen objects
counted among the long-lived: a full collection (and a freeze of its survivors) once the old
generation holds more than a quarter of them, at least ``FULL_MIN_OBJECTS``.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable

FULL_CHECK_EVERY_S = 30.0
"""How often a process under ``young_collections_only`` looks whether to collect everything."""
FULL_SHARE = 0.25
"""A full collection once the old generation holds this share of the frozen objects (Python's
own rule for its long-lived objects)."""
FULL_MIN_OBJECTS = 200_000
"""... and at least this many objects (a small process collects as often as it needs to)."""
YOUNG_THRESHOLD = 50_000
"""Net allocations of tracked objects between young collections (Python's default is 700)."""
_NEVER = 1 << 30


def young_collections_only(young: int = YOUNG_THRESHOLD) -> None:
    """Collect the young generations as Python does, never the whole heap unasked.

    >>> young_collections_only(); gc.get_threshold() == (YOUNG_THRESHOLD, 10, _NEVER)
    True
    >>> gc.set_threshold(700, 10, 10)
    """
    gc.set_threshold(young, 10, _NEVER)


def freeze_long_lived() -> None:
    """Collect what an earlier load left behind (unfrozen first, so that its cycles can go),
    then freeze every surviving object. O(objects); call after a bulk (re)load."""
    gc.unfreeze()
    with warnings.catch_warnings():  # what others leaked (unclosed files) is not ours to report
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    gc.freeze()


def collect_if_grown(share: float = FULL_SHARE, least: int = FULL_MIN_OBJECTS) -> int | None:
    """Collect everything, and freeze the survivors, if the old generation holds more than
    ``share`` of the frozen objects and at least ``least`` objects; returns how many objects the
    collection found to be garbage (None: not collected). Looking costs a list of the old
    generation (O(its size), a few ms for 100,000s).

    >>> collect_if_grown(least=1 << 40) is None
    True
    """
    old = len(gc.get_objects(2))
    if old <= max(least, share * gc.get_freeze_count()):
        return None
    found = gc.collect()
    gc.freeze()
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
