"""Idempotent publishing: a message published again with the same client-given id, while the
first is still in the retention log, is not published again; the retry is answered with the
first one's matched count.

An id is *pending* from the moment its publish is queued until its round is written (a retry
meanwhile waits for the same answer); then *logged* (the round's blob lists it, so a restarted
coordinator knows it too: ``RoundLog.recover``) until the log drops that round.

>>> d = Dedupe()
>>> d.logged({"m1": 3}, []); d.lookup("m1"), d.lookup("m2")
(3, None)
>>> d.logged({}, ["m1"]); d.lookup("m1")
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping


class Dedupe:
    def __init__(self) -> None:
        self.pending: dict[str, asyncio.Future] = {}
        self.done: dict[str, int] = {}

    def lookup(self, msg_id: str) -> int | asyncio.Future | None:
        """The matched count of a logged publish, the future of a pending one, or None (a
        pending one that failed is forgotten: it may be retried)."""
        got = self.done.get(msg_id)
        if got is not None:
            return got
        fut = self.pending.get(msg_id)
        if fut is not None and fut.done() and fut.exception() is not None:
            del self.pending[msg_id]
            return None
        return fut

    def begin(self, msg_id: str, fut: asyncio.Future) -> None:
        """A publish with this client-given id was queued."""
        self.pending[msg_id] = fut

    def logged(self, matched: Mapping[str, int], dropped: Iterable[str]) -> None:
        """A round with these publishes was written; the log dropped rounds with ``dropped``."""
        for i in dropped:
            self.done.pop(i, None)
        self.done.update(matched)
        pending = self.pending
        for i in matched:
            pending.pop(i, None)

    def restore(self, published: Mapping[str, int]) -> None:
        self.done.update(published)
