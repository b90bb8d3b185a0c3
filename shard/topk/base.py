"""What every top-k index of ``shard.topk`` offers (paper 001, Sect. 3.2, problem SM-k): build in
bulk, subscribe, unsubscribe, and the exact top-k of an event under one tie rule -- score
descending, then subscription id ascending (``shard.topk.model.ranked``).

An index keeps its subscriptions in ``SubColumns`` and answers a batch with one compiled kernel
(``_kernel``) that returns, per event, the top k and every subscription tied with the k-th;
Python orders those by (−ψ, id) and cuts at k.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from shard.errors import ValidationError
from shard.topk.columns import SubColumns
from shard.topk.model import DEFAULT_MAX_DIST, TopKEvent, TopKSubscription, validate_k


class TopKIndex:
    """Base of ``RITree``, ``TAS`` and ``BruteTopK``.

    ``max_dist`` is Eq. 4's MaxDist, fixed for the life of the index (see
    ``shard.topk.model``).
    """

    name = "index"

    def __init__(self, *, max_dist: float = DEFAULT_MAX_DIST) -> None:
        if not (isinstance(max_dist, int | float) and max_dist > 0 and np.isfinite(max_dist)):
            raise ValidationError("max_dist", max_dist, "must be a finite number > 0")
        self.max_dist = float(max_dist)
        self.columns = SubColumns()
        self.scored = 0
        """Subscriptions scored exactly by all queries so far (the work pruning did not save)."""

    def __len__(self) -> int:
        return len(self.columns)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.columns.slot_of

    # ---- construction and changes --------------------------------------------------------
    @classmethod
    def build(cls, subs: Iterable[TopKSubscription], **options: Any):
        """A new index over ``subs`` by the bulk path (a later duplicate id replaces an earlier
        one).

        >>> from shard.topk.model import subscription_from_dict, event_from_dict
        >>> from shard.topk.oracle import BruteTopK
        >>> s = subscription_from_dict({"id": "s", "predicates": [{"attr": "a", "op": "=",
        ...     "value": 1}], "alpha": 0.0, "point": [0, 0]})
        >>> BruteTopK.build([s]).topk(event_from_dict({"id": "e", "attributes": {"a": 1},
        ...     "point": [0, 0]}), 1)
        [('s', 1.0)]
        """
        index = cls(**options)
        unique = {s.id: s for s in subs}
        slots = index.columns.add_many(list(unique.values()))
        index._bulk(np.asarray(slots, np.int64))
        return index

    def subscribe(self, sub: TopKSubscription) -> None:
        """Add ``sub``; a known id is replaced. O(predicates + the index's insert)."""
        if sub.id in self.columns.slot_of:
            self.unsubscribe(sub.id)
        slot = self.columns.add(sub)
        self._on_add(slot)

    def unsubscribe(self, sub_id: str) -> None:
        """Remove ``sub_id``; NotFoundError when unknown. O(predicates + the index's delete)."""
        slot = self.columns.slot_of.get(sub_id)
        if slot is not None:
            self._on_remove(slot)
        self.columns.remove(sub_id)

    # ---- queries -------------------------------------------------------------------------
    def topk(self, event: TopKEvent, k: int) -> list[tuple[str, float]]:
        """The ``k`` best subscriptions for ``event`` as (id, ψ), by (−ψ, id)."""
        return self.topk_batch([event], k)[0]

    def topk_batch(self, events: Sequence[TopKEvent], k: int) -> list[list[tuple[str, float]]]:
        """``topk`` of every event of a batch, one compiled call."""
        validate_k(k)
        events = list(events)
        if not events:
            return []
        if len(self.columns) == 0:
            return [[] for _ in events]
        enc = self.columns.encode_events(events)
        off, slots, scores, scored = self._kernel(enc, min(k, len(self.columns)))
        self.scored += int(scored)
        return self.columns.ranked(off, slots, scores, k)

    # ---- for subclasses ------------------------------------------------------------------
    def _bulk(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            self._on_add(s)

    def _on_add(self, slot: int) -> None:
        pass

    def _on_remove(self, slot: int) -> None:
        pass

    def _kernel(self, enc, k: int):
        raise NotImplementedError

    def _check(self) -> None:
        """Assert the structural invariants (tests call it after every change)."""
        c = self.columns
        live = np.flatnonzero(c.live[: len(c.ids)])
        assert sorted(c.slot_of.values()) == live.tolist(), "slot table and live flags differ"
        for sid, s in c.slot_of.items():
            assert c.ids[s] == sid, f"slot {s}: id {c.ids[s]!r} != {sid!r}"
