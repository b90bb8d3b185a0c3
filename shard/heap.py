"""The garbage collector around long-lived indexes.

A shard holds ~500,000 subscriptions and the coordinator its routing tables: millions of
long-lived objects. Every full collection traverses all of them (~100 ms and more per pass at
1M), stalling rounds. After each bulk (re)load, ``freeze_long_lived`` moves everything alive into
the permanent generation, out of later collections. ``GcPauses`` records how long collections
stop the process, so that a stall shows in the log instead of as unexplained latency.

What a process creates after its last freeze is not frozen: in the coordinator, every move makes
a new subscription object, ~20,000 long-lived objects a second under a moving crowd. Python
starts a full collection whenever those grow by a quarter, and each took 100-260 ms at 1M
(~80,000 such objects), several times a second during moves. ``young_collections_only`` leaves
those full collections to the process's own schedule (the coordinator: every
``FULL_COLLECTION_EVERY_S``, freezing the survivors after each); reference counting frees the
replaced objects meanwhile, only cyclic garbage waits for the next full collection (and cycles
among frozen objects wait for the next reload, which unfreezes and collects everything).
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable

FULL_COLLECTION_EVERY_S = 300.0
"""How often a process under ``young_collections_only`` collects everything."""
YOUNG_THRESHOLD = 700
"""Allocations between young collections (Python's default)."""
_NEVER = 1 << 30


def young_collections_only(young: int = YOUNG_THRESHOLD) -> None:
    """Collect the young generations as Python does, never the whole heap unasked.

    >>> young_collections_only(); gc.get_threshold()[0] == YOUNG_THRESHOLD
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
