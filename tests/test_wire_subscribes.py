"""A round of new plain subscriptions read straight from its bytes (``shard.wire_subscribes``,
``shard.ops.apply_round``): the same answer and the same shard as the general path
(``loads_ops`` + ``apply_ops``), and never a round the general path would refuse."""

from __future__ import annotations

import math
import random
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest

from shard.errors import ValidationError
from shard.geometry import KIND_CIRCLE
from shard.model import Circle, Message, Point, Rect, Subscription
from shard.ops import apply_ops, apply_round
from shard.state import ShardState, _validate_subscriptions, _validate_tags
from shard.wire import dumps_ops, loads_ops
from shard.wire_subscribes import read_plain_subscribes
from tests.workloads import random_message, random_subscription

VOCAB = [f"t{i}" for i in range(40)] + ["straße", "東京", "café", "ñ", "a b", "x\x00y", "🙂"]


def _sub(rng: random.Random, sid: str) -> Subscription:
    s = random_subscription(rng, sid, VOCAB)
    return Subscription(s.id, s.clauses, s.region, rng.random() < 0.4, None, None)


def _general(data: bytes) -> list[tuple] | None:
    """What the general path makes of ``data``: (id, clauses, region, moving, tag) per
    operation, or None when it refuses the round or it is not plain subscribes only."""
    try:
        ops = loads_ops(data)
        subs = [op[1] for op in ops if op[0] == "sub"]
        if len(subs) != len(ops) or not all(s.plain for s in subs):
            return None
        _validate_subscriptions(subs)
        _validate_tags([op[2] for op in ops], len(ops))
    except ValidationError:
        return None
    return [(s.id, s.clauses, s.region, s.moving, op[2]) for s, op in zip(subs, ops, strict=True)]


def _fast(data: bytes) -> list[tuple] | None:
    p = read_plain_subscribes(data)
    if p is None:
        return None
    out, t, c = [], 0, 0
    for i, sid in enumerate(p.ids):
        clauses = []
        for _ in range(int(p.n_clauses[i])):
            k = int(p.clause_len[c])
            clauses.append(tuple(p.term(j) for j in range(t, t + k)))
            t, c = t + k, c + 1
        if p.kind[i] == KIND_CIRCLE:
            region = Circle(*p.circle[i].tolist())
        else:
            region = Rect(*p.bbox[i].tolist())
        out.append((sid, tuple(clauses), region, bool(p.moving[i]), int(p.tags[i])))
    return out


def _answer(result: tuple) -> tuple:
    (mids, counts, holders), out, tags = result
    return mids, counts.tolist(), holders.tolist(), out, tags.tolist()


def _shard_rows(state: ShardState) -> dict:
    """Every subscription as the store holds it: region, moving flag, tag, clause terms."""
    st = state.tree.store
    terms = st.vocab_terms
    rows = {}
    for sid, slot in st.slot_of.items():
        first, k = int(st.first_clause[slot]), int(st.n_clauses[slot])
        clauses = []
        for c in range(first, first + k):
            a, n = int(st.cl_off[c]), int(st.cl_len[c])
            clauses.append(tuple(terms[t] for t in st.terms[a : a + n].tolist()))
        rows[sid] = (
            int(st.kind[slot]),
            st.bbox[slot].tolist(),
            st.circ[slot].tolist(),
            bool(st.moving[slot]),
            int(st.tag[slot]),
            sorted(clauses),
        )
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_rounds_of_new_plain_subscribes_give_what_the_general_path_gives(seed: int) -> None:
    rng = random.Random(seed)
    base = [_sub(rng, f"b{i}") for i in range(300)]
    fast, general = ShardState.build(0, base, 0.0), ShardState.build(0, base, 0.0)
    now, n_fast, n_new = 0.0, 0, 0
    for r in range(40):
        now += 0.5
        msgs = [random_message(rng, f"m{r}.{i}", VOCAB) for i in range(rng.randint(0, 6))]
        msgs = [Message(m.id, m.terms, m.location, 3.0) for m in msgs]
        if msgs:  # live messages, which the new subscriptions get as +m
            ops = [("pub", m) for m in msgs]
            assert _answer(apply_ops(fast, ops, now)) == _answer(apply_ops(general, ops, now))
        if r % 3 == 2:  # freed slots and clause blocks, reused by the next rounds
            gone = rng.sample(sorted(fast.tree.store.slot_of), 12)
            ops = [("unsub", g) for g in gone]
            assert _answer(apply_ops(fast, ops, now)) == _answer(apply_ops(general, ops, now))
        ids = [f"r{r}.{i}" for i in range(rng.choice([1, 2, 5, 30]))]
        if r % 4 == 3:  # a replacement: the fast path leaves the round to the general one
            ids[0] = rng.choice(sorted(fast.tree.store.slot_of))
        round_ = [(("sub", _sub(rng, i), rng.randint(-1, 10**6))) for i in ids]
        data = dumps_ops(round_)
        p = read_plain_subscribes(data)
        took = p is not None and fast.takes_plain(p)
        n_fast += took
        n_new += r % 4 != 3
        now += 0.25
        a = apply_round(fast, data, now)
        assert _answer(a) == _answer(apply_ops(general, loads_ops(data), now))
    assert n_fast == n_new  # every round of new ids went the fast way
    assert _shard_rows(fast) == _shard_rows(general)
    probe = [random_message(rng, f"p{i}", VOCAB) for i in range(300)]
    assert sorted(fast.publish_batch(probe, now + 1)) == sorted(
        general.publish_batch(probe, now + 1)
    )


def _round_bytes(items: list[list]) -> bytes:
    return msgpack.packb(items)


def _op(sid="a", clauses=(("x",),), region=(0, 0.0, 0.0, 1.0, 1.0), moving=False, kw=None, expr=None, tag=-1):  # fmt: skip
    return ["S", sid, [list(c) for c in clauses], list(region), moving, kw, expr, tag]


BAD_OR_OTHER = [
    [_op(clauses=(("",),))],  # an empty term
    [_op(clauses=tuple((f"c{i}",) for i in range(65)))],  # too many clauses
    [_op(clauses=(tuple(f"t{i}" for i in range(17)),))],  # too many terms
    [_op(clauses=())],
    [_op(sid="")],
    [_op(sid="x" * 129)],
    [_op(sid="a\nb")],
    [_op(), _op()],  # the same id twice: a replacement within the round
    [_op(tag=-2)],
    [_op(tag=2**31)],
    [_op(tag=True)],
    [_op(tag=1.0)],
    [_op(region=(0, 0.0, 0.0, 1.0, math.nan))],
    [_op(region=(0, 2.0, 0.0, 1.0, 1.0))],
    [_op(region=(0, 0.0, 0.0, 181.0, 1.0))],
    [_op(region=(0, 0.0, -91.0, 1.0, 1.0))],
    [_op(region=(0, True, 0.0, 1.0, 1.0))],
    [_op(region=(1, 0.0, 0.0, 0.0))],
    [_op(region=(1, 0.0, 0.0, 2.1e7))],
    [_op(region=(1, 0.0, 0.0, math.inf))],
    [_op(region=(1, 0.0, 0.0))],
    [_op(region=(2, [[[0, 0], [1, 0], [1, 1]]], [0, 0, 1, 1]))],  # a polygon: not plain
    [_op(region=(0.0, 0.0, 0.0, 1.0, 1.0))],
    [_op(moving=1)],
    [_op(kw=["a", 1])],
    [_op(expr=3)],
    [_op() + [{"negated": None, "predicates": [], "ranked": None}]],
    [_op()[:7]],
    [["U", "a"]],
    [_op(), ["U", "b"]],
    [],
]


@pytest.mark.parametrize("items", BAD_OR_OTHER, ids=range(len(BAD_OR_OTHER)))
def test_the_fast_path_leaves_every_other_round_to_the_general_one(items: list) -> None:
    data = _round_bytes(items)
    assert read_plain_subscribes(data) is None
    assert read_plain_subscribes(data + b"\xc0") is None  # (bytes after the round)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xdd\xff\xff\xff\xff", b"\x91\xdd\xff\xff\xff\xff", b"\xc0", b"\x91\x98\xa1S"],
)
def test_bytes_that_are_no_round_are_left_to_the_general_path(data: bytes) -> None:
    """Cut short, or headers announcing more than the bytes hold (4 billion operations in 5
    bytes): None, with nothing allocated for what the header claims."""
    assert read_plain_subscribes(data) is None


_LYING_HEADER = r"""
import resource
from shard.wire_subscribes import _scan, read_plain_subscribes
import numpy as np
read_plain_subscribes(b"\x90")  # (loaded before the limit)
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, ((vm + 300_000) * 1024, resource.RLIM_INFINITY))
data = b"\xdd\x01\x31\x2d\x00" + bytes(20_000_000)  # 20,000,000 operations claimed
status = _scan(np.frombuffer(data, np.uint8))[0]
print(status, read_plain_subscribes(data))
"""


def test_a_header_claiming_more_operations_than_its_bytes_allocates_nothing_for_them() -> None:
    """20 MB of zeros under a header claiming 20 million operations, the address space limited
    to 300 MB more: the scan refuses the claim before allocating for it (rows for each claimed
    operation would take ~1.6 GB)."""
    out = subprocess.run(
        [sys.executable, "-c", _LYING_HEADER], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "None"]


def test_what_the_fast_path_reads_is_what_the_general_path_reads() -> None:
    """Rounds in every encoding msgpack allows for a field (ints, float32, long strings,
    16-bit array headers), then random damage to them: whatever the fast path takes, the
    general path takes too, with the same fields."""
    rng = random.Random(5)
    f32 = struct.unpack(">f", struct.pack(">f", 0.25))[0]
    rounds = [
        _round_bytes([_op(region=(0, -3, 0, 4, 7), tag=70000), _op("b", region=(1, 2, -1, 300))]),
        msgpack.packb([_op(region=(0, f32, 0.0, 1.0, 1.0))], use_single_float=True),
        _round_bytes(
            [_op("é" * 128, clauses=(("y" * 300, "ß"),) * 20, kw=["k"], expr="e" * 70000)]
        ),
        _round_bytes([_op(f"i{i}", tag=i) for i in range(70)]),  # a 16-bit array header
    ]
    for i in range(60):
        subs = [_sub(rng, f"s{i}.{j}") for j in range(rng.randint(1, 8))]
        rounds.append(dumps_ops([("sub", s, rng.randint(-1, 99)) for s in subs]))
    taken = 0
    for data in rounds:
        assert _fast(data) is not None and _fast(data) == _general(data)
        for _ in range(150):
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(b) or 1)
                how = rng.random()
                if how < 0.6 and b:
                    b[at] = rng.randrange(256)
                elif how < 0.8:
                    del b[at:]
                else:
                    b.insert(at, rng.randrange(256))
            fast = _fast(bytes(b))
            if fast is not None:
                taken += 1
                assert fast == _general(bytes(b)), bytes(b)
    assert taken > 500  # much damage leaves a valid round (a changed term, number, tag)


def test_a_hosted_rival_index_takes_rounds_the_general_way() -> None:
    rng = random.Random(1)
    subs = [_sub(rng, f"s{i}") for i in range(50)]
    state = ShardState.build(0, subs, 0.0, index="rt")
    data = dumps_ops([("sub", _sub(rng, "n1"), 3), ("sub", _sub(rng, "n2"), 4)])
    p = read_plain_subscribes(data)
    assert p is not None and not state.takes_plain(p)
    apply_round(state, data, 1.0)
    assert state.has(["n1", "n2"]) == [True, True]


def test_the_store_looks_up_known_terms_and_adds_new_ones_once() -> None:
    state = ShardState.build(0, [Subscription("a", (("café", "x"),), Rect(0, 0, 1, 1))], 0.0)
    st = state.tree.store
    before = len(st.vocab)
    data = dumps_ops([("sub", Subscription(f"n{i}", (("x", "新", "café"),), Rect(0, 0, 1, 1)), i) for i in range(3)])  # fmt: skip
    apply_round(state, data, 1.0)
    assert len(st.vocab) == before + 1
    rows = _shard_rows(state)
    assert rows["n2"][4] == 2 and rows["n2"][5] == [
        tuple(sorted(("x", "新", "café"), key=st.vocab.get))
    ]
    got = state.publish_batch([Message("m", ("café", "x", "新"), Point(0.5, 0.5))], 2.0)
    assert sorted(u[0] for u in got) == ["a", "n0", "n1", "n2"]
    assert np.array_equal(st.vocab_table().lookup(["新"]), [st.vocab["新"]])
