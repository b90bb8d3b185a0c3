"""A whole rebuild run beside the live tree, on a thread, so that the rounds do not stop for it.

A tree grown by subscribes is rebuilt whole now and then (``APTree._whole_rebuild_due``: a fresh
keyword order and fresh node kinds). In place, that stops the shard for as long as a whole
build of its subscriptions: ~6.5 us a subscription (30 ms at 5,000, 1.3 s at 200,000 on the
2-core machine), and every round queued behind it waits as long (docs/BENCHMARKS.md).

Beside: ``RebuildBeside`` copies the store (``SubscriptionStore.clone``: one copy of each
column) and rebuilds a plain ``APTree`` over the copy on its own thread. The compiled build
releases the GIL (``nogil``), so the live tree goes on serving rounds meanwhile, noting the ids
of the subscriptions it changes (``touched``). Once the thread is done, the owner takes the new
tree at a point between two operations (``APTree.poll_rebuild``): it replays the touched
subscriptions as the live store holds them then (``APTree._replay``: out, and in again if still
there), follows the renumbered term ids, and (the AP+-Tree) hangs its live messages on the new
tree, as an in-place rebuild does.

The cost left in the round that takes the new tree is the replay (as many subscribes as
arrived during the build) and the messages' re-insertion (as in place). Memory: two stores and
two trees while the thread runs (``REBUILD_BESIDE_MAX`` bounds it).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shard.aptree.tree import APTree

log = logging.getLogger(__name__)

REBUILD_BESIDE_MAX = 2_000_000
"""Trees with more subscriptions are rebuilt in place (a copy beside them would hold two
trees: at 5M a shard, ~4 GB more)."""


class RebuildBeside:
    """One whole rebuild of ``copy`` (an ``APTree`` over a clone of the live store) on a thread.

    ``keep``: the term ids (over the live ids when copied) that something besides the
    subscriptions holds (live messages): the renumbering keeps them. ``new_id`` is, once done,
    the new id of every term id the live store had when copied (-1: dropped)."""

    def __init__(self, copy: APTree, keep: np.ndarray | None, *, start: bool = True) -> None:
        self.copy = copy
        self.keep = keep
        self.touched: set[str] = set()
        """Ids of the subscriptions the live tree created, replaced, moved or removed since the
        copy (the live tree adds them; the replay takes each one's state at the end)."""
        self.new_id: np.ndarray | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self.run, name="aptree-rebuild", daemon=True)
        if start:
            self._thread.start()

    def run(self) -> None:
        """The rebuild (on the thread; a test may call it directly with ``start=False``)."""
        try:
            self.new_id = self.copy.build_whole(self.keep)
        except BaseException as exc:  # handed to the owner, which rebuilds in place instead
            self.error = exc

    @property
    def done(self) -> bool:
        """Whether the rebuild finished (or failed): the owner may take it."""
        return self.new_id is not None or self.error is not None

    def wait(self) -> None:
        """Block until the thread is done (a test, or an owner that must have the new tree)."""
        if self._thread.is_alive():
            self._thread.join()
