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
  are dropped (nobody is left to tell); so are the items of a subscription unsubscribed after
  them, even if its id was subscribed again since (``alive``: a new subscription, whose own
  items come later).

The live messages the shard had are stored again without deliveries (their holders were told).

The coordinator itself may be killed while a shard is down. So that its successor still knows
what that shard's subscribers were told, every missed item is also written to the shard's
*outage record* in Redis, in the write of the round that missed it (before anything of that
round is answered): a hash, one field per subject, the first value kept (``record``):
``s``+subscription id -> the subscription as it was on the shard before (empty: not there),
``m``+message id -> empty (a one-shot message, which is not stored anywhere: its payload and the
subscriptions the shards that were up reached, ``one_shot_value``). When the shard is reloaded the record is rewritten to what it will
apply again, and each field is deleted in the write of the round that delivers its subject's
last redo. A coordinator that starts and finds a record loads that shard to what its
subscribers were told and applies the difference to the state in Redis with deliveries
(``from_record``).

>>> from shard.model import Point, Rect, Subscription
>>> a = Subscription("a", (("x",),), Rect(0, 0, 1, 1), moving=True)
>>> a2 = Subscription("a", (("x",),), Rect(5, 5, 6, 6), moving=True)
>>> b = Subscription("b", (("y",),), Rect(0, 0, 1, 1))
>>> missed = [(("move", "a", Point(5.5, 5.5)), a, 1), (("sub", b, 7), None, 2)]
>>> share, redo = told({"a": a2, "b": b}, missed, {"a": a2, "b": b}.__contains__)
>>> share
[Subscription(id='a', clauses=(('x',),), region=Rect(min_lon=0, min_lat=0, max_lon=1, max_lat=1), moving=True, keywords=None, expr=None, negated=None, predicates=(), threshold=None, alpha=0.5, weights=None)]
>>> [item[0] for item, *_ in redo]
['move', 'sub']
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shard.errors import UnavailableError
from shard.metadata_codec import decode_subscription, encode_subscription
from shard.model import Message, Subscription

MISSED_MAX = 100_000
"""Items routed to a shard while it is down, kept to apply again after its load; past this the
shard is loaded from the current state instead (its moving subscribers' holdings there may then
differ from what they were told: logged)."""

Missed = tuple[tuple, Subscription | None, int]
"""An item routed to a down shard, the subscription it concerns as it was on that shard
before the item (None: not there; a publish: None), and its operation's sequence number
(``Op.seq``; -1: from an outage record, older than anything since the start)."""


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


def alive(items: Sequence[Missed], unsubscribed: Mapping[str, int]) -> list[Missed]:
    """``items`` without those of subscriptions unsubscribed after them (``unsubscribed``: id
    -> its last unsubscribe's sequence number), the unsubscribes included: nobody is left to
    tell, and an id subscribed anew is a new subscription, whose items come later."""
    if not unsubscribed:
        return list(items)
    return [x for x in items if not dead(x, unsubscribed)]


def dead(x: Missed, unsubscribed: Mapping[str, int]) -> bool:
    """Whether item ``x`` is of a subscription unsubscribed after it (``alive``)."""
    item = x[0]
    return item[0] != "pub" and unsubscribed.get(subject(item), -2) >= x[2]


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
    for x in missed:
        item = x[0]
        if item[0] == "pub":
            redo.append(x)
            continue
        sid = subject(item)
        if not exists(sid):
            continue
        first.setdefault(sid, x[1])
        redo.append(x)
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


def record_field(item: tuple) -> bytes:
    """The outage record's field of an item's subject: ``s`` + subscription id, or ``m`` +
    message id."""
    return (b"m" if item[0] == "pub" else b"s") + subject(item).encode()


def record(missed: Sequence[Missed]) -> dict[bytes, bytes]:
    """The outage record of ``missed``: each subject's field, and what its subscription was
    on the shard before the first item (empty: not there; a message: empty)."""
    out: dict[bytes, bytes] = {}
    for x in missed:
        item, before = x[0], x[1]
        f = record_field(item)
        if f not in out:
            out[f] = b"" if before is None else encode_subscription(before).encode()
    return out


def one_shot_value(payload: bytes, reached: Sequence[str]) -> bytes:
    """The record's value for a one-shot message a down shard missed: its payload, and the
    subscriptions the other shards reached (they are not told again)."""
    return b"o" + struct.pack("<I", len(payload)) + payload + "\n".join(reached).encode()


def parse_one_shot(value: bytes) -> tuple[bytes, list[str]]:
    """Inverse of ``one_shot_value``.

    >>> parse_one_shot(one_shot_value(b"xy", ["a", "b"]))
    (b'xy', ['a', 'b'])
    """
    (n,) = struct.unpack_from("<I", value, 1)
    rest = value[5 + n :]
    return value[5 : 5 + n], rest.decode().split("\n") if rest else []


def from_record(
    k: int,
    fields: Mapping[bytes, bytes],
    subs: Mapping[str, Subscription],
    placement: Mapping[str, tuple[int, ...]],
    tag_of: Mapping[str, int],
    live: Mapping[str, Message],
    one_shot: Callable[[bytes], Message] | None = None,
) -> list[Missed]:
    """The items shard ``k`` must apply again, found in its outage record at start (``fields``),
    against the state in Redis: ``subs`` and their ``placement`` and slots (``tag_of``), the
    ``live`` messages stored on ``k`` (``one_shot`` reads a one-shot message's payload). Each subscription whose record says otherwise than its
    state now is replaced (``sub``: the shard sends the difference) or detached (it left ``k``),
    with what it was before; each live message ``k`` missed is published to it. Subjects gone
    since are left out (nobody is left to tell); ``told`` turns the share back.

    >>> from shard.model import Point, Rect
    >>> was = Subscription("a", (("x",),), Rect(0, 0, 1, 1), moving=True)
    >>> now = Subscription("a", (("x",),), Rect(5, 5, 6, 6), moving=True)
    >>> rec = record([(("move", "a", Point(5.5, 5.5)), was, 1), (("pub", Message("m", ("x",), Point(5, 5))), None, 2)])
    >>> items = from_record(0, rec, {"a": now}, {"a": (0,)}, {"a": 3}, {"m": Message("m", ("x",), Point(5, 5))})
    >>> [(item[0], item[-1] if item[0] == "sub" else item[1].id) for item, *_ in items]
    [('sub', 3), ('pub', 'm')]
    >>> items[0][1].region == was.region
    True
    """
    out: list[Missed] = []
    for f, v in fields.items():
        name = f[1:].decode()
        if f[:1] == b"m":
            m = live.get(name)
            if v[:1] == b"o" and one_shot is not None:
                m = one_shot(parse_one_shot(v)[0])
            if m is not None:
                out.append((("pub", m), None, -1))
            continue
        s = subs.get(name)
        if s is None:
            continue
        before = decode_subscription(v) if v else None
        if k in placement.get(name, ()):
            if before is None or not _same(before, s):
                out.append((("sub", s, tag_of[name]), before, -1))
        elif before is not None:
            out.append((("detach", name), before, -1))
    return out


def _same(a: Subscription, b: Subscription) -> bool:
    """Whether two versions of a subscription match the same (a decoded one may spell its
    keywords otherwise)."""
    return dataclasses.replace(a, keywords=None, expr=None) == dataclasses.replace(
        b, keywords=None, expr=None
    )


def untold_records(
    untold: Mapping[str, Subscription | None],
    placed: Callable[[Subscription], Sequence[int]],
    placement: Mapping[str, tuple[int, ...]],
) -> dict[int, dict[bytes, bytes]]:
    """The outage record fields that say what the subscriptions ``untold`` (id -> as its
    subscriber was last told, None: not at all) were on each shard, where ``placed`` puts a
    subscription and ``placement`` has them now: a coordinator killed between a Subscribe's
    write to Redis and the round that told its subscriber leaves them so.

    >>> from shard.model import Rect
    >>> was = Subscription("a", (("x",),), Rect(0, 0, 1, 1))
    >>> untold_records({"a": was, "b": None}, lambda s: (0,), {"a": (1,), "b": (0, 1)})
    {0: {b'sa': b'{"id":"a","keywords":["x"],"rect":[0,0,1,1]}', b'sb': b''}, 1: {b'sa': b'', b'sb': b''}}
    """
    out: dict[int, dict[bytes, bytes]] = {}
    for sid, was in untold.items():
        before = placed(was) if was is not None else ()
        value = b"" if was is None else encode_subscription(was).encode()
        for k in sorted({*before, *placement.get(sid, ())}):
            out.setdefault(k, {})[b"s" + sid.encode()] = value if k in before else b""
    return out
