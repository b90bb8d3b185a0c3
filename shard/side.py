"""``SideIndex``: the ranked subscriptions that match on location alone, by their rectangles.

A ranked subscription with θ ≤ α (``shard.ranking.on_location``) receives a message inside its
rectangle that holds none of its terms: α·1 ≥ θ. No index keyed on terms finds those, so every
message meeting the rectangle is a candidate, scored exactly by ``shard.conditions`` as any
other. This index holds those rectangles in an AP+-Tree of its own, each filed under one
keyword every message is given here (``TERM``): the tree's keyword level has a single entry,
and its spatial partitioning does the work (grid cells as the cost model chooses, moves as
the AP+-Tree moves). It stores no message: what such a subscription holds is kept by its owner
(``shard.residual.ResidualIndex``), and a new or moved one is evaluated over the live messages
there.

Each entry's store ``extra`` column is its conditions' row (+ 1) in the owner's
``ConditionColumns``, so a match gives the row to test directly, without looking up its id.

>>> from shard.model import Rect
>>> side = SideIndex()
>>> side.add([("s", Rect(0, 0, 1, 1), False, 7)])
>>> owner, rows, slots = side.pairs(np.array([0, 0]), np.array([[0.5, 0.5, 0.5, 0.5], [2.0, 2, 2, 2]]))
>>> owner.tolist(), rows.tolist(), side.ids(slots)
([0], [7], ['s'])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shard.applus import APPlusTree
from shard.aptree.tree import EncodedMessages
from shard.model import Point, Rect, Subscription

TERM = "*"
"""The one keyword of this index's entries (its own vocabulary: no clash with real terms)."""


class SideIndex:
    """Rectangles of subscriptions (module docstring), with their condition rows."""

    def __init__(self) -> None:
        self.tree = APPlusTree()

    def __len__(self) -> int:
        return len(self.tree)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.tree

    def add(self, items: Sequence[tuple[str, Rect, bool, int]]) -> None:
        """File (id, rectangle, moving, condition row) entries, new ids only, in one call."""
        if not items:
            return
        self.tree.subscribe_many(
            [Subscription(sid, ((TERM,),), rect, moving) for sid, rect, moving, _ in items]
        )
        store = self.tree.store
        for sid, _, _, row in items:
            store.extra[store.slot_of[sid]] = row + 1

    def remove(self, sub_id: str) -> None:
        self.tree.unsubscribe(sub_id)

    def move(self, moves: Sequence[tuple[str, Point]], now: float) -> None:
        """Re-centre moving entries (the tree stores no message: no update comes back)."""
        if moves:
            self.tree.move_batch(moves, now)

    def pairs(
        self, kind: np.ndarray, geom: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(message index, condition row, entry slot) of every entry whose rectangle meets a
        message of the batch (``kind`` 0 point / 1 rect, ``geom`` the boxes); one compiled
        traversal."""
        n = int(kind.shape[0])
        store = self.tree.store
        tid = int(store.vocab_table().lookup([TERM])[0])
        if not n or tid < 0 or not len(self.tree):
            none = np.zeros(0, np.int64)
            return none, none, none
        batch = EncodedMessages(
            np.arange(n + 1, dtype=np.int64),
            np.full(n, tid, np.int32),
            np.ascontiguousarray(kind, np.int8),
            np.ascontiguousarray(geom, np.float64),
        )
        self.tree.sync()
        out_m, out_s = self.tree.match_encoded(batch)
        out_s = out_s.astype(np.int64)
        return out_m.astype(np.int64), store.extra[out_s].astype(np.int64) - 1, out_s

    def ids(self, slots: np.ndarray) -> list[str]:
        """The subscription ids of entry ``slots``."""
        return self.tree.store.ids[slots].tolist()

    def boxes(self, slots: np.ndarray) -> np.ndarray:
        """The rectangles of entry ``slots`` where they are now, [n, 4]."""
        return self.tree.store.bbox[slots]

    def check_invariants(self) -> None:
        self.tree.check_invariants()
