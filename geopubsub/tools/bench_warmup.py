"""The kernels compiled (or loaded from numba's cache) before an in-process benchmark times
anything: ``bench match`` / ``update`` / ``maintain`` / ``moving`` (``geopubsub.tools.bench``)
and the in-process reference of ``bench e2e`` (``geopubsub.tools.bench_e2e``)."""

from __future__ import annotations

from shard.aptree import APTree
from shard.host.warmup import warm_up_shard, workload
from shard.invlist import InvertedList
from shard.model import Message, Point, Rect, Subscription
from shard.naive_moving import NaiveMoving


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel before anything is timed."""
    subs, _ = workload(moving=False)
    t = APTree.build(subs, theta_p=8, fanout=16)
    t.match_batch(
        [Message("m", ("a", "b1"), Point(0.5, 0.5)), Message("n", ("a",), Rect(0, 0, 3, 3))]
    )
    t.subscribe(Subscription("x", (("a",),), Rect(0, 0, 1, 1)))
    t.unsubscribe("x")
    InvertedList.from_store(t.store).match_batch(
        [Message("m", ("a", "b1"), Point(0.5, 0.5)), Message("n", ("a",), Rect(0, 0, 3, 3))]
    )


def warm_up_moving() -> None:
    """Compile (or load) the AP+-Tree's and the grid baseline's kernels before timing."""
    warm_up_shard()
    subs, msgs = workload()
    naive = NaiveMoving(APTree.build(subs, theta_p=8, fanout=16))
    naive.publish_batch(msgs, 0.0)
    naive.move_batch([(f"w{i}", Point(i % 3, 0.5)) for i in range(200)], 1.0)
    naive.subscribe(Subscription("x", (("a",),), Rect(0, 0, 1, 1), moving=True), 2.0)
    naive.advance(10.0)
