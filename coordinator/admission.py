"""When the engine's next round may start: the waiting operations' deadline.

An operation is *urgent* (a publish, a move, an unsubscribe, a subscribe whose caller waits for
its round) or *deferrable*: a subscribe already answered once Redis held it
(``Settings.subscribe_ack = "stored"``), whose round only has to come before any later
operation's (the queue is one FIFO, so it does: every round takes the oldest operations first).

The next round goes when ``batch_max`` operations wait, or at the earlier of

* the oldest urgent operation's arrival + ``batch_delay`` (a round fills a little), and
* the oldest deferrable one's arrival + ``defer`` (a new subscription's +m for the messages
  live before it come at most that late).

So single Subscribes at 1,000/s reach a shard some tens at a time instead of one or two, and a
publish that follows them waits no longer than it would have (it takes them along).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from coordinator.ops import Op
from shard.model import Subscription


class Admission:
    """The deadline of the round the waiting operations will make (``time.perf_counter``,
    the clock of ``Op.born``)."""

    def __init__(self, batch_delay_s: float, defer_s: float) -> None:
        self.batch_delay = batch_delay_s
        self.defer = defer_s
        self._urgent_at = math.inf
        """Arrival of the oldest urgent operation waiting (inf: none)."""
        self._deferred_at = math.inf
        """Arrival of the oldest deferrable operation waiting (inf: none)."""

    def queued(self, ops: Sequence[Op]) -> bool:
        """Note operations appended to the queue; True if the deadline came earlier (the loop,
        asleep until the old one, must look again)."""
        before = self.deadline()
        for op in ops:
            if op.deferred:
                if op.born < self._deferred_at:
                    self._deferred_at = op.born
            elif op.born < self._urgent_at:
                self._urgent_at = op.born
        return self.deadline() < before

    def hurry(self) -> None:
        """The operations waiting are due now (a reload is about to stop the engine)."""
        if self._deferred_at < math.inf:
            self._deferred_at = -math.inf
        if self._urgent_at < math.inf:
            self._urgent_at = -math.inf

    def taken(self, left: Sequence[Op]) -> None:
        """A round took the queue's oldest operations; ``left`` are those still waiting (only
        after a full round: a load, under which nothing is deferred). They count as urgent from
        the oldest one's arrival: O(1), and never later than their own deadline."""
        self._deferred_at = math.inf
        self._urgent_at = left[0].born if left else math.inf

    def deadline(self) -> float:
        """When the next round should go (inf: nothing waits)."""
        return min(self._urgent_at + self.batch_delay, self._deferred_at + self.defer)


class Admitted(Mapping[str, Subscription]):
    """The subscriptions as callers know them: those routed (``Router.subs``) and, over them,
    those answered before their round and still waiting for it (``waiting``: at most
    ``batch_max`` of them). A Subscribe answered is found at once by GetSubscription,
    Unsubscribe, Move and StreamResults, whose operations queue after its own."""

    def __init__(self, routed: dict[str, Subscription], waiting: dict[str, Subscription]):
        self.routed = routed
        self.waiting = waiting

    def __getitem__(self, sub_id: str) -> Subscription:
        sub = self.waiting.get(sub_id)
        return sub if sub is not None else self.routed[sub_id]

    def get(self, sub_id: str, default: Any = None) -> Any:
        sub = self.waiting.get(sub_id)
        return sub if sub is not None else self.routed.get(sub_id, default)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self.waiting or sub_id in self.routed

    def __len__(self) -> int:
        routed = self.routed
        return len(routed) + sum(1 for sid in self.waiting if sid not in routed)

    def __iter__(self) -> Iterator[str]:
        yield from self.routed
        routed = self.routed
        yield from (sid for sid in self.waiting if sid not in routed)
