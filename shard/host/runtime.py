"""Interpreter settings for the event-loop processes (coordinator, load and demo clients).

gRPC's poller thread and Ray's completion threads hand every finished read, write and shard call
to the asyncio loop, and each must first take the GIL from the main thread. A busy main thread
keeps it for ``sys.getswitchinterval()`` (5 ms by default) before handing it over, so each such
hand-over can wait that long: one PublishStream then read at most ~200 requests/s, and a 1M
coordinator at 5,000 msgs/s in small requests answered in ~0.7 s (p50) instead of ~30 ms
(docs/BENCHMARKS.md).
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005
"""How long a busy thread keeps the GIL while another waits for it."""


def hand_over_promptly(interval_s: float = SWITCH_INTERVAL_S) -> None:
    """Let waiting threads take the GIL after ``interval_s`` instead of Python's 5 ms.

    >>> hand_over_promptly(); sys.getswitchinterval() == SWITCH_INTERVAL_S
    True
    """
    sys.setswitchinterval(interval_s)
