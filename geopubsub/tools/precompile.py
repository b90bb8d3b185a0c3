"""Compile the index kernels into numba's on-disk cache ahead of their first use: ``make test``
runs this in the background, at the lowest priority, while its first tests run, so that the
kernels the suite needs later (the rival indexes, the conditions' checks) are loaded instead of
compiled then. On a cold cache the suite spends most of its time compiling (the AP+-Tree's state
machine test: 140 s cold, 1.2 s warm). A step that fails is reported and skipped: this only
saves time, it checks nothing.

``python -m geopubsub.tools.precompile``
"""

from __future__ import annotations

import sys
import time

from geopubsub.tools.bench_compare import warm
from shard.host.warmup import warm_up_shard, workload
from shard.indexes import RIVAL_NAMES
from shard.model import Message, Point, Rect, Subscription, subscription_from_dict
from shard.state import ShardState


def _conditions() -> None:
    """A shard with NOT, a moving polygon, predicates and a ranked subscription, published to,
    moved, expired."""
    subs = [
        subscription_from_dict(
            {"id": "n", "expr": "a AND NOT b", "rect": [0, 0, 2, 2], "moving": True,
             "predicates": [{"attr": "p", "op": "<=", "value": 5}]}
        ),
        subscription_from_dict(
            {"id": "g", "keywords": ["a"], "polygon": [[[0, 0], [2, 0], [0, 2], [0, 0]]],
             "moving": True}
        ),
        subscription_from_dict(
            {"id": "r", "keywords": ["a", "c"], "rect": [0, 0, 1, 1], "threshold": 0.6,
             "alpha": 0.2, "moving": True}
        ),
        Subscription("plain", (("a",),), Rect(0, 0, 1, 1)),
    ]  # fmt: skip
    state = ShardState.build(0, subs, 0.0)
    msgs = [
        Message("m1", ("a",), Point(0.5, 0.5), 5.0, attributes=(("p", 1.0),)),
        Message("m2", ("a", "c"), Rect(0, 0, 1, 1), 5.0),
    ]
    state.publish_tagged(msgs, 1.0)
    state.move_batch([("n", Point(1.5, 1.5)), ("g", Point(1.0, 1.0)), ("r", Point(3, 3))], 2.0)
    state.advance_tagged(10.0)


def main() -> int:
    subs, msgs = workload(moving=False)
    steps = []  # the rivals first: the suite's first tests compile the AP+-Tree's themselves
    for name in RIVAL_NAMES:
        steps.append((f"shard on {name}", lambda n=name: warm_up_shard({"index": n})))
        steps.append((f"bench compare {name}", lambda n=name: warm(n, subs, msgs)))
    steps.append(("conditions", _conditions))
    for what, step in steps:
        t0 = time.perf_counter()
        try:
            step()
        except Exception as exc:  # only a head start: never the build's failure
            print(f"precompile: {what} failed: {exc!r}", file=sys.stderr)
            continue
        print(f"precompile: {what} {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
