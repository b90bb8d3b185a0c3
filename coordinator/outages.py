"""What the engine keeps about a shard that is down, and the state it is reloaded to.

A shard's deliveries tell its subscribers what it holds. When a call to a shard fails (its actor
died, or did not answer in time) the shard's state is thrown away and rebuilt (``Engine``'s
reload); the operations routed to it from the failed round on were answered UNAVAILABLE, though
the engine's routing state already has them (and the other shards applied their parts). So the
shard is rebuilt to what its subscribers were *told*, and those operations are applied again
after the load in a round that delivers their updates:

- ``Outage.missed`` lists every item routed to the shard from its first failed round on (in
  rounds in flight then, in rounds that skipped it while it was down, in a replay round that
  failed again), each with the subscription as it was on that shard before the item (None: not
  there);
- ``told`` turns the shard's current share back into the share before those items (the first
  item that touched a subscription says what it was) and lists the items to apply again: a
  subscription's items in order (a move's ± then come out as the ADDs and REMOVEs the subscriber
  missed), and the publishes of messages still live elsewhere (their holders on this shard get
  their ADDs). Items of subscriptions gone since, and publishes of messages that are not live,
  are dropped (nobody is left to tell).

The live messages the shard had are stored again without deliveries (their holders were told).

>>> from shard.model import Point, Rect, Subscription
>>> a = Subscription("a", (("x",),), Rect(0, 0, 1, 1), moving=True)
>>> a2 = Subscription("a", (("x",),), Rect(5, 5, 6, 6), moving=True)
>>> b = Subscription("b", (("y",),), Rect(0, 0, 1, 1))
>>> missed = [(("move", "a", Point(5.5, 5.5)), a), (("sub", b, 7), None)]
>>> share, redo = told({"a": a2, "b": b}, missed, {"a": a2, "b": b}.__contains__)
>>> share
[Subscription(id='a', clauses=(('x',),), region=Rect(min_lon=0, min_lat=0, max_lon=1, max_lat=1), moving=True, keywords=(), expr=None)]
>>> [item[0] for item, _ in redo]
['move', 'sub']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shard.errors import UnavailableError
from shard.model import Subscription

MISSED_MAX = 100_000
"""Items routed to a shard while it is down, kept to apply again after its load; past this the
shard is loaded from the current state instead (its moving subscribers' holdings there may then
differ from what they were told: logged)."""

Missed = tuple[tuple, Subscription | None]
"""An item routed to a down shard, and the subscription it concerns as it was on that shard
before the item (None: not there; a publish: None)."""


@dataclass(slots=True)
class Outage:
    """A shard that is down: the error its operations get, and what it missed."""

    error: UnavailableError
    missed: list[Missed] = field(default_factory=list)
    overflow: bool = False
    """More than ``MISSED_MAX`` items missed: reload from the current state."""

    def note(self, items: Sequence[Missed]) -> None:
        if self.overflow:
            return
        self.missed.extend(items)
        if len(self.missed) > MISSED_MAX:
            self.overflow = True
            self.missed.clear()


def subject(item: tuple) -> str:
    """The subscription an item concerns (for a publish: the message id)."""
    return item[1].id if item[0] in ("sub", "pub") else item[1]


def told(
    share: Mapping[str, Subscription],
    missed: Sequence[Missed],
    exists: Callable[[str], bool],
) -> tuple[list[Subscription], list[Missed]]:
    """The shard's share as its subscribers were told it (``share``: its subscriptions now, by
    id), and the items of ``missed`` to apply again after loading it, in order (publishes
    included: the caller keeps those of messages still live); ``exists``: whether a
    subscription still exists (items of gone ones are dropped)."""
    first: dict[str, Subscription | None] = {}
    redo: list[Missed] = []
    for item, before in missed:
        if item[0] == "pub":
            redo.append((item, before))
            continue
        sid = subject(item)
        if not exists(sid):
            continue
        first.setdefault(sid, before)
        redo.append((item, before))
    out = dict(share)
    for sid in list(out):
        if not exists(sid):
            del out[sid]
    for sid, before in first.items():
        if before is None:
            out.pop(sid, None)
        else:
            out[sid] = before
    return list(out.values()), redo
