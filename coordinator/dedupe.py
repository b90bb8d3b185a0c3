"""Idempotent publishing: a message published again with the same client-given id, while the
first is still in the retention log, is not published again; the retry is answered with the
first one's matched count.

An id is *pending* from the moment its publish is queued until its round is written (a retry
meanwhile waits for the same answer); then *logged* (the round's blob lists it, so a restarted
coordinator knows it too: ``RoundLog.recover``) until the log drops that round. One table holds
both (a future while pending, the matched count once logged): one look-up per message.

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
        self.ids: dict[str, int | asyncio.Future] = {}

    def lookup(self, msg_id: str) -> int | asyncio.Future | None:
        """The matched count of a logged publish, the future of a pending one, or None (a
        pending one that failed is forgotten: it may be retried)."""
        got = self.ids.get(msg_id)
        if type(got) is not int and got is not None and got.done() and got.exception():
            del self.ids[msg_id]
            return None
        return got

    def begin(self, msg_id: str, fut: asyncio.Future) -> None:
        """A publish with this client-given id was queued."""
        self.ids[msg_id] = fut

    def pending(self, msg_id: str, fut: asyncio.Future) -> bool:
        """Whether ``fut`` is the pending publish of ``msg_id`` (its id is to be logged)."""
        return self.ids.get(msg_id) is fut

    def forget(self, msg_id: str) -> None:
        """Its publish failed: a retry publishes it."""
        self.ids.pop(msg_id, None)

    def logged(self, matched: Mapping[str, int], dropped: Iterable[str]) -> None:
        """A round with these publishes was written; the log dropped rounds with ``dropped``."""
        ids = self.ids
        for i in dropped:
            if type(ids.get(i)) is int:
                del ids[i]
        ids.update(matched)

    def restore(self, published: Mapping[str, int]) -> None:
        self.ids.update(published)
