"""One round of a shard's work: the coordinator's operations applied in order, in batches.

An operation is a plain tuple (no protobuf; ``shard.wire`` carries it to a shard actor):

    ("pub", Message)          how many subscriptions match (each gets +m); their tags are in
                              the round's tag array, publish after publish
    ("sub", Subscription, tag)  create or replace: +m / the replacement's difference; ``tag``
                              (optional) is what publishes report for it
    ("unsub", id)             no updates
    ("detach", id)            -m for everything s holds here, then removed (s left this shard)
    ("move", id, Point)       the move's ± difference
    ("topk", Message, k)      a top-k publish (paper 001): the ``TopKAnswer`` (tags and scores)
                              of this shard's k best top-k subscriptions; nothing stored

``apply_ops`` first advances the shard to ``now`` (the expirations, as columns:
``ShardState.advance_tagged``), then applies runs of
operations of one kind with one batch call each, and attributes every update to its operation
(a publish's deliveries are counted, and given as tags, not tuples):
a run never holds two operations on the same subscription (or message), so the subscription id
(for publishes, the message id) names the operation.

>>> from shard.model import Message, Point, Rect, Subscription
>>> from shard.state import ShardState
>>> st = ShardState(0)
>>> sub = Subscription("s", (("x",),), Rect(0, 0, 1, 1), moving=True)
>>> _, out, tags = apply_ops(
...     st, [("sub", sub, 4), ("pub", Message("m", ("x",), Point(2, 0.5), ttl=9.0))], 0.0
... )
>>> out, tags
([[], 0], array([], dtype=int32))
>>> apply_ops(st, [("move", "s", Point(2, 0.5))], 1.0)[1]
[[('s', ADD, 'm')]]
>>> apply_ops(st, [("pub", Message("n", ("x",), Point(2.5, 0.5)))], 2.0)[1:]
([1], array([4], dtype=int32))
>>> apply_ops(st, [], 20.0)[0]  # m expired: held by the subscription tagged 4
(['m'], array([1]), array([4], dtype=int32))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shard.errors import NotFoundError, ValidationError
from shard.state import ShardState
from shard.wire import loads_ops
from shard.wire_subscribes import read_plain_subscribes

_KINDS = ("pub", "sub", "unsub", "detach", "move", "topk")


Expired = tuple[list[str], np.ndarray, np.ndarray]
"""Expirations as columns: message ids, how many holders each, the holders' tags in order."""


def apply_ops(
    state: ShardState, ops: Sequence[tuple], now: float
) -> tuple[Expired, list, np.ndarray]:
    """Returns (expirations up to ``now``, the updates of each operation, the tags of the
    subscriptions the publishes reached): for a publish, its entry is how many subscriptions it
    reached, and their tags follow those of the publishes before it. A run that the shard
    rejects (each batch call is all-or-nothing) leaves the shard unchanged; its operations get
    the exception in place of their updates, the other runs go on."""
    for i, op in enumerate(ops):
        if not isinstance(op, tuple) or not op or op[0] not in _KINDS:
            raise ValidationError(f"ops[{i}]", op, f"must be a tuple starting with one of {_KINDS}")
    expired = state.advance_tagged(now)
    out: list = [[] for _ in ops]
    tags: list[np.ndarray] = []
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
            _apply_run(state, kind, run, keys, out, tags, now)
        except (ValidationError, NotFoundError) as exc:
            for k in range(i, j):
                out[k] = exc
        i = j
    return expired, out, np.concatenate(tags) if tags else np.zeros(0, np.int32)


def apply_round(state: ShardState, data: bytes, now: float) -> tuple[Expired, list, np.ndarray]:
    """``apply_ops`` of a round as ``shard.wire`` bytes. A round of new plain subscriptions only
    (the rounds of live Subscribes) is read straight into columns (``shard.wire_subscribes``)
    and added without an object each, with the same answer; any other round, or one that path
    does not take, is decoded into operations (``loads_ops``) and applied as such."""
    plain = read_plain_subscribes(data)
    if plain is None or not state.takes_plain(plain):
        return apply_ops(state, loads_ops(data), now)
    expired = state.advance_tagged(now)
    out: list = [[] for _ in plain.ids]
    at = {sid: i for i, sid in enumerate(plain.ids)}
    for u in state.subscribe_plain(plain, now):
        out[at[u[0]]].append(u)
    return expired, out, np.zeros(0, np.int32)


def _apply_run(state, kind, run, keys, out, tags, now) -> None:
    if kind == "pub":  # counted, the subscriptions as tags: nothing per delivery
        expired, reached, counts = state.publish_tagged([op[1] for op in run], now)
        assert not expired, "the shard was advanced before its runs"
        for k, n in zip(keys.values(), counts.tolist(), strict=True):
            out[k] = n
        tags.append(reached)
        return
    if kind == "topk":
        answers = state.topk_batch([op[1] for op in run], [op[2] for op in run], now)
        for k, a in zip(keys.values(), answers, strict=True):
            out[k] = a
        return
    if kind == "sub":
        ups = state.subscribe_batch(
            [op[1] for op in run], now, [op[2] if len(op) > 2 else -1 for op in run]
        )
    elif kind == "unsub":
        ups = state.unsubscribe_batch([op[1] for op in run], now)
    elif kind == "detach":
        ups = state.detach_batch([op[1] for op in run], now)
    else:
        ups = state.move_batch([(op[1], op[2]) for op in run], now)
    for u in ups:
        out[keys[u[0]]].append(u)


def _key(op: tuple) -> str:
    return op[1].id if op[0] in ("pub", "sub", "topk") else op[1]
