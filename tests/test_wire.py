"""The bytes rounds and answers travel as between the coordinator and a shard (``shard.wire``):
every operation and answer round-trips exactly, and bytes that are not a round or an answer
(random bytes, msgpack of the wrong shape, pickles) raise ``ValidationError`` and nothing else."""

from __future__ import annotations

import contextlib
import pickle
import random

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard.errors import ExpressionError, NotFoundError, ValidationError
from shard.model import ADD, REMOVE, Point
from shard.ops import apply_ops
from shard.state import ShardState
from shard.wire import dumps_ops, dumps_result, loads_ops, loads_result
from tests.workloads import random_message, random_subscription


def _ops(rng: random.Random, n: int) -> list[tuple]:
    ops: list[tuple] = []
    for i in range(n):
        kind = rng.choice(["pub", "pub", "sub", "unsub", "detach", "move"])
        if kind == "pub":
            m = random_message(rng, f"m{i}é")
            ops.append(("pub", m.__class__(m.id, m.terms, m.location, m.ttl)))
        elif kind == "sub":
            s = random_subscription(rng, f"s{i}")
            s = s.__class__(s.id, s.clauses, s.region, rng.random() < 0.5, None, "x AND y")
            ops.append(("sub", s, rng.randint(-1, 10**6)))
        elif kind == "move":
            ops.append(("move", f"s{i}", Point(rng.uniform(-180, 180), rng.uniform(-90, 90))))
        else:
            ops.append((kind, f"s{i}\x00"))
    return ops


@pytest.mark.parametrize("seed", range(5))
def test_rounds_round_trip_exactly(seed):
    rng = random.Random(seed)
    ops = _ops(rng, 200)
    assert loads_ops(dumps_ops(ops)) == ops


def test_answers_round_trip_exactly_errors_included():
    expired = (["m1", "m2"], np.array([2, 1], np.int64), np.array([4, 7, 9], np.int32))
    out = [
        3,
        [("s", ADD, "m"), ("t", REMOVE, "n")],
        [],
        ValidationError("subscription.region", (1.0, float("nan")), "must be finite"),
        ExpressionError("expr", "a AND", "dangling AND"),
        NotFoundError("subscription", "s9"),
    ]
    tags = np.array([5, 6, 7], np.int32)
    (mids, counts, held), got, back = loads_result(dumps_result((expired, out, tags)))
    assert mids == ["m1", "m2"] and counts.tolist() == [2, 1] and held.tolist() == [4, 7, 9]
    assert counts.dtype == np.int64 and held.dtype == np.int32 and back.dtype == np.int32
    assert back.tolist() == [5, 6, 7]
    assert got[:3] == out[:3]
    for want, err in zip(out[3:], got[3:], strict=True):
        assert type(err) is type(want) and str(err) == str(want).replace(
            "(1.0, nan)", "'(1.0, nan)'"
        )
    assert got[5].ident == "s9"


class _Evil:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used by msgpack
        pickle.dumps(_Evil()),
        pickle.dumps([("pub", "m")]),
        msgpack.packb({"a": 1}),
        msgpack.packb([["P", "m", ["x"], [1.0], None]]),  # a location of one number
        msgpack.packb([["S", "s", [["x"]], [7, 1, 2, 3], False, None, None, -1]]),
        msgpack.packb([["M", "s", "east", 2.0]]),
        msgpack.packb([["Z", "s"]]),
        msgpack.packb([1, 2]),
        msgpack.packb([[["P"] * 3] * 3] * 3),
        msgpack.packb([]) + b"x",  # trailing bytes
        msgpack.packb([["S", "a", [["x"]], [], False, None, None, -1]]),  # an empty region
        msgpack.packb([["S", "a", [["x"]], {"k": 1}, False, None, None, -1]]),  # a map
    ],
)
def test_what_is_not_a_round_raises_validation_error(data, capsys):
    with pytest.raises(ValidationError):
        loads_ops(data)
    assert "ran" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "op",
    [
        ["P", "m", "x", [1.0, 2.0], None],  # terms not a list
        ["P", "m", [7], [1.0, 2.0], None],
        ["P", "m", ["x"], ["east", 2.0], None],
        ["P", "m", ["x"], [1.0, 2.0], -1.0],
        ["P", "m", ["x"], [1e300, 2.0], None],
        ["P", 5, ["x"], [1.0, 2.0], None],
        ["S", "s", [["x"]], [0, 5.0, 0.0, 1.0, 1.0], False, None, None, -1],  # x0 > x1
        ["S", "s", [[]], [1, 0.0, 0.0, 10.0], False, None, None, -1],
        ["S", "s", [["x"]], [1, 0.0, 0.0, 10.0], "yes", None, None, "tag"],
    ],
)
def test_a_round_of_wrong_values_is_refused_by_the_shard_by_name(op):
    """The wire carries values; the shard checks them as for any caller (``ShardState``)."""
    _, out, _ = apply_ops(ShardState(0), loads_ops(msgpack.packb([op])), 1.0)
    assert isinstance(out[0], ValidationError), out


@given(st.binary(max_size=200))
def test_random_bytes_are_a_round_or_a_validation_error(data):
    with contextlib.suppress(ValidationError):
        loads_ops(data)


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=6),
        max_leaves=30,
    )
)
def test_msgpack_of_any_shape_is_a_round_or_a_validation_error(value):
    with contextlib.suppress(ValidationError):
        loads_ops(msgpack.packb([value]))


@given(st.binary(max_size=200))
def test_random_bytes_are_an_answer_or_a_validation_error(data):
    with contextlib.suppress(ValidationError):
        loads_result(data)
