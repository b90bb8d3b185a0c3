"""Compile (or load from numba's on-disk cache) the index kernels before the first real request.

numba compiles a kernel at its first call; on a fresh checkout (no ``__pycache__``) the AP+-Tree's
move and m-list kernels take tens of seconds to compile, which a first client would otherwise wait
out (and time out on). ``warm_up_shard`` drives a throwaway ``ShardState`` through every kind of
operation: a bulk build, subscribe, publish, moves that split and collapse leaves, detach,
unsubscribe, expiry and a purge; then a root wide enough for the direct tables, a compaction of
its pools, m-lists growing with the nodes and a vocabulary outgrowing its first hash table (``tests/test_warmup.py`` checks that a growing shard compiles
nothing after it). With a warm cache it takes well under a second.
"""

from __future__ import annotations

from typing import Any

from shard.applus.mlists import ensure_rows, new_mlists
from shard.aptree.vocab import VocabTable
from shard.model import Circle, Message, Point, Rect, Subscription, subscription_from_dict
from shard.ops import apply_ops, apply_round
from shard.state import ShardState
from shard.wire import dumps_ops

N_SUBS = 200
VOCAB_FIRST_ROWS = 1024
"""Rows of a new ``VocabTable``'s hash table (filled to half, it is rehashed into a larger one)."""
N_MSGS = 50


def workload(moving: bool = True) -> tuple[list[Subscription], list[Message]]:
    """The small workload every warm-up runs (the shard's here, the benches' too): ``N_SUBS``
    subscriptions over ten unit cells, ``N_MSGS`` point messages living 5 s."""
    subs = [
        Subscription(f"w{i}", (("a", f"b{i % 7}"),), Rect(i % 10, 0, i % 10 + 1, 1), moving=moving)
        for i in range(N_SUBS)
    ]
    msgs = [
        Message(f"m{i}", ("a", f"b{i % 7}"), Point(i % 10 + 0.5, 0.5), ttl=5.0)
        for i in range(N_MSGS)
    ]
    return subs, msgs


def warm_up_shard(options: dict[str, Any] | None = None) -> None:
    """Run every operation kind once on a small throwaway shard (see the module docstring)
    made with the shard's ``options``: a shard on a rival index (``index``) compiles that
    index's kernels, not only the AP+-Tree's."""
    subs, msgs = workload()
    opts = dict(options or {})
    if opts.get("index", "aptree") == "aptree":
        opts.update(theta_p=8, fanout=16)
    state = ShardState.build(0, subs, 0.0, **opts)
    ops: list[tuple] = [("pub", m) for m in msgs]
    ops.append(("pub", Message("r", ("a",), Rect(0, 0, 3, 1), ttl=0.0)))
    apply_ops(state, ops, 0.0)
    apply_ops(state, [("move", f"w{i}", Point(i % 3, 0.5)) for i in range(N_SUBS)], 1.0)
    extra = [
        Subscription("x", (("a",), ("b1", "n1")), Rect(0, 0, 1, 1), moving=True),  # a new term
        Subscription("c", (("a",),), Circle(0.5, 0.5, 50_000.0)),
    ]
    apply_round(state, dumps_ops([("sub", s, i) for i, s in enumerate(extra)]), 2.0)  # as columns
    apply_ops(state, [("detach", "w1"), ("unsub", "w2"), ("move", "x", Point(5, 0.5))], 3.0)
    apply_ops(state, [], 10.0)
    if hasattr(state.tree, "purge"):  # the AP+-Tree's lazy deletion
        state.tree.purge()
    # top-k subscriptions (paper 001): the R^I-tree's bulk build, insert, move and search
    preds = [{"attr": "p", "op": "<=", "value": 5}, {"attr": "c", "op": "in", "value": ["x"]}]
    top = [
        subscription_from_dict(
            {"id": f"t{i}", "point": [i % 10, 0], "predicates": preds, "moving": True}
        )
        for i in range(40)
    ]
    apply_ops(state, [("sub", s, i) for i, s in enumerate(top)], 11.0)
    apply_ops(state, [("sub", top[0], 0), ("move", "t1", Point(3, 3))], 12.0)
    event = Message("e", ("a",), Point(1, 0), attributes=(("c", "x"), ("p", 3.0)))
    apply_ops(state, [("topk", event, 5)], 13.0)
    state.stats()
    # a root with a cut per keyword, wide enough for the direct tables (``APTree.direct_table``;
    # a shard's tree gets one once it holds a few hundred rare keywords), matched and stored
    wide = ShardState.build(
        0, [Subscription(f"d{i}", ((f"k{i}",),), Rect(0, 0, 1, 1)) for i in range(600)], 0.0
    )
    wide.publish_batch([Message("d", ("k3", "k9"), Point(0.5, 0.5), ttl=1.0)], 0.0)
    wide.publish_batch([Message("e", ("k4",), Point(0.5, 0.5))], 0.0)
    # the pools' compaction, which a shard growing by subscribes reaches in some round
    # (its dummy promotions orphan the root's cut list; ~1 s to compile, tens of ms to load)
    wide.tree.compact_pools()
    # the m-lists growing with the tree's nodes (``APPlusTree.sync`` calls it only then)
    ensure_rows(new_mlists(4, 4), 8)
    # a vocabulary outgrowing its first hash table (a growing shard's whole rebuild, its first
    # thousand terms): the table's rehash, loaded here instead of in that round
    table = VocabTable()
    table.add([f"v{i}" for i in range(2 * VOCAB_FIRST_ROWS)], range(2 * VOCAB_FIRST_ROWS))
