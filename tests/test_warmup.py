"""The shard's warm-up (``shard.host.warmup``) leaves nothing to compile for a client's rounds:
in a fresh interpreter, after ``warm_up_shard``, a shard growing by single subscribes through a
whole rebuild with a vocabulary of thousands of terms and compactions of its pools, publishing,
moving and unsubscribing, adds no type signature to any compiled kernel (each one would be a compile, or a load from
numba's cache, of tens of milliseconds inside a round)."""

from __future__ import annotations

import json
import subprocess
import sys

_PROGRAM = r"""
import importlib, json, pkgutil
from numba.core.registry import CPUDispatcher
import shard
from shard.host.warmup import warm_up_shard
from shard.model import Circle, Message, Point, Rect, Subscription
from shard.ops import apply_ops, apply_round
from shard.state import ShardState
from shard.wire import dumps_ops

mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(shard.__path__, "shard.")]
kernels = {
    f"{v.py_func.__module__}.{v.__name__}": v
    for m in mods for v in vars(m).values() if isinstance(v, CPUDispatcher)
}
warm_up_shard({})
before = {k: {str(s) for s in v.signatures} for k, v in kernels.items()}
import shard.aptree.tree as tree_module  # a compaction of the pools at every housekeeping
tree_module.COMPACT_MIN_GARBAGE = tree_module.COMPACT_GARBAGE_RATIO = 0
st = ShardState(0)
now = 100.0
for i in range(1_300):  # one a round, each with a new term: a whole rebuild at 1,000
    now += 0.01
    region = Circle(i % 30, 1, 5e4) if i % 5 == 0 else Rect(i % 30, 0, i % 30 + 2, 2)
    sub = Subscription(f"s{i}", ((f"k{i}", f"c{i % 7}"),), region, moving=i % 3 == 0)
    apply_round(st, dumps_ops([("sub", sub, i)]), now)  # as the shard actor takes a round
    if i % 50 == 0:
        msgs = [Message(f"m{i}_{j}", (f"k{i - j}", f"c{j}"), Point(j, 1), ttl=5.0) for j in range(7)]
        apply_ops(st, [("pub", m) for m in msgs] + [("move", "s0", Point(i % 30, 1))], now)
apply_ops(st, [("unsub", f"s{i}") for i in range(0, 1_300, 2)], now + 1)
apply_ops(st, [], now + 60)
new = {k: sorted({str(s) for s in v.signatures} - before[k]) for k, v in kernels.items()}
print(json.dumps({k: v for k, v in new.items() if v}))
"""


def test_after_the_warm_up_a_growing_shard_compiles_nothing():
    out = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True, timeout=600
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


_COORDINATOR = r"""
import asyncio, json, sys
from coordinator import slots
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.model import Rect, Subscription
from tests.clusters import Node, coordinator_settings
from geopubsub.convert import to_proto_subscription

async def main():
    async with Node(coordinator_settings(sys.argv[1], "warm")) as node:
        before = {k: {str(s) for s in getattr(slots, k).signatures} for k in ("number", "directory")}
        for i in range(3):
            sub = Subscription(f"s{i}", (("a",),), Rect(0, 0, 1, 1))
            await node.stub.Subscribe(pb.SubscribeRequest(subscription=to_proto_subscription(sub)))
        await node.stub.Unsubscribe(pb.UnsubscribeRequest(id="s0"))
        after = {k: {str(s) for s in getattr(slots, k).signatures} for k in ("number", "directory")}
    print(json.dumps({k: sorted(after[k] - before[k]) for k in after}), flush=True)

asyncio.run(main())
"""


def test_a_fresh_coordinator_compiles_nothing_for_its_first_rounds(redis_url):
    """The coordinator loads its delivery kernels when it starts (``coordinator.slots.warm_up``):
    its first Subscribe and Unsubscribe rounds, through gRPC on a real Redis, add no signature."""
    out = subprocess.run(
        [sys.executable, "-c", _COORDINATOR, redis_url],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"number": [], "directory": []}
