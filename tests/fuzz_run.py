"""The long fuzz run of docs/SECURITY.md: ``tests/test_fuzz.py``'s three request generators for
N examples each against one coordinator, with its process's RSS sampled and every call's status
counted; ends with the exact delivery check. Not collected by pytest (``make test`` runs the
short version).

    .venv/bin/python -m tests.fuzz_run --examples 34000      # ~100,000 requests
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.redis_local import RedisServer
from shard.host.warmup import warm_up_shard
from tests import test_fuzz as fuzz


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=34_000, help="per generator (three of them)")
    args = p.parse_args()
    warm_up_shard()
    tests = (
        fuzz.test_every_field_of_every_request_gets_a_documented_status,
        fuzz.test_bytes_that_are_no_request_get_a_documented_status,
        fuzz.test_one_hostile_field_in_a_request_that_was_valid,
    )
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as redis_server:
        c = fuzz.Coordinator(redis_server.url)
        t0 = time.perf_counter()
        rss = [_rss_mb()]
        for test in tests:
            inner = given(data=st.data())(test.hypothesis.inner_test)
            run = settings(fuzz.FUZZ, max_examples=args.examples, database=None)(inner)
            run(coordinator=c)
            rss.append(_rss_mb())
            print(
                f"{test.__name__}: {sum(fuzz.SEEN.values()):,} calls so far, RSS {rss[-1]:.0f} MB"
            )
        fuzz.test_reload_with_garbage_and_then_the_cluster_still_serves_exactly(c)
        seconds = time.perf_counter() - t0
        c.close()
    by_status: dict[str, int] = {}
    for (_, code), n in fuzz.SEEN.items():
        by_status[code] = by_status.get(code, 0) + n
    total = sum(by_status.values())
    print(f"{total:,} calls in {seconds:.0f} s; by status: {by_status}")
    print("by method and status:", dict(sorted(fuzz.SEEN.items())))
    print(
        f"RSS of the process (coordinator, shards and client): {' -> '.join(f'{r:.0f}' for r in rss)} MB"
    )
    print("after: health SERVING, a new subscription and two messages delivered exactly")


if __name__ == "__main__":
    main()
