"""One round of a shard's work: the coordinator's operations applied in order, in batches.

An operation is a plain tuple (picklable, no protobuf):

    ("pub", Message)          the ids of the matching subscriptions (each gets +m)
    ("sub", Subscription)     create or replace: +m / the replacement's difference
    ("unsub", id)             no updates
    ("detach", id)            -m for everything s holds here, then removed (s left this shard)
    ("move", id, Point)       the move's ± difference

``apply_ops`` first advances the shard to ``now`` (the expirations), then applies runs of
operations of one kind with one batch call each, and attributes every update to its operation:
a run never holds two operations on the same subscription (or message), so the subscription id
(for publishes, the message id) names the operation.

>>> from shard.model import Message, Point, Rect, Subscription
>>> from shard.state import ShardState
>>> st = ShardState(0)
>>> sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
>>> apply_ops(st, [("sub", sub), ("pub", Message("m", ("x",), Point(2, 0.5), ttl=9.0))], 0.0)
([], [[], []])
>>> apply_ops(st, [("move", "s", Point(2, 0.5))], 1.0)
([], [[('s', '+', 'm')]])
"""

from __future__ import annotations

from collections.abc import Sequence

from shard.errors import NotFoundError, ValidationError
from shard.state import ShardState

Update = tuple[str, str, str]

_KINDS = ("pub", "sub", "unsub", "detach", "move")
PICKLE_PROTOCOL = 5
"""Rounds cross to shard actors pickled by the caller (``ShardActor.apply_pickled``)."""


def apply_ops(
    state: ShardState, ops: Sequence[tuple], now: float
) -> tuple[list[Update], list[list]]:
    """Returns (expirations up to ``now``, the updates of each operation: for a publish, the ids
    of the subscriptions it reached). A run that the shard
    rejects (each batch call is all-or-nothing) leaves the shard unchanged; its operations get
    the exception in place of their updates, the other runs go on."""
    for i, op in enumerate(ops):
        if not isinstance(op, tuple) or not op or op[0] not in _KINDS:
            raise ValidationError(f"ops[{i}]", op, f"must be a tuple starting with one of {_KINDS}")
    expired = state.advance(now)
    out: list[list] = [[] for _ in ops]
    i = 0
    while i < len(ops):
        kind = ops[i][0]
        j = i
        keys: dict[str, int] = {}
        while j < len(ops) and ops[j][0] == kind:
            key = _key(ops[j])
            if key in keys:
                break
            keys[key] = j
            j += 1
        run = ops[i:j]
        try:
            _apply_run(state, kind, run, keys, out, now)
        except (ValidationError, NotFoundError) as exc:
            for k in range(i, j):
                out[k] = exc
        i = j
    return expired, out


def _apply_run(state, kind, run, keys, out, now) -> None:
    if kind == "pub":  # a list of subscription ids per message: no tuple per delivery
        expired, groups = state.publish_grouped([op[1] for op in run], now)
        assert not expired, "the shard was advanced before its runs"
        for k, subs in zip(keys.values(), groups, strict=True):
            out[k] = subs
        return
    if kind == "sub":
        ups = state.subscribe_batch([op[1] for op in run], now)
    elif kind == "unsub":
        ups = state.unsubscribe_batch([op[1] for op in run], now)
    elif kind == "detach":
        ups = state.detach_batch([op[1] for op in run], now)
    else:
        ups = state.move_batch([(op[1], op[2]) for op in run], now)
    for u in ups:
        out[keys[u[0]]].append(u)


def _key(op: tuple) -> str:
    return op[1].id if op[0] in ("pub", "sub") else op[1]
