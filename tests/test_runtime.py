"""Process-level tuning: GC freezing and pause counting (``shard.host.heap``), the GIL hand-over
interval (``shard.host.runtime``), and answering a finished publish without a turn of the loop."""

from __future__ import annotations

import asyncio
import sys

import pytest

import shard.host.heap
import shard.host.runtime
from coordinator.service import within
from shard.errors import UnavailableError


def test_hand_over_promptly_sets_the_interval_and_can_be_undone():
    old = sys.getswitchinterval()
    try:
        shard.host.runtime.hand_over_promptly(0.001)
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        sys.setswitchinterval(old)


class _Context:
    def time_remaining(self):
        return None


def test_within_answers_a_done_future_without_suspending():
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        done.set_result(7)
        coro = within(done, _Context(), 1.0)
        with pytest.raises(StopIteration) as info:  # finished on its first step: no suspension
            coro.send(None)
        assert info.value.value == 7

        failed = loop.create_future()
        failed.set_exception(KeyError("x"))
        with pytest.raises(KeyError):
            within(failed, _Context(), 1.0).send(None)

        pending = loop.create_future()
        loop.call_later(0.01, pending.set_result, 3)
        assert loop.run_until_complete(within(pending, _Context(), 1.0)) == 3
        late = loop.create_future()  # past the server's deadline_s: UNAVAILABLE, saying why
        with pytest.raises(UnavailableError, match=r"deadline_s=0.01 s: shard 1 is down"):
            loop.run_until_complete(within(late, _Context(), 0.01, lambda: "shard 1 is down"))

        class _Short(_Context):  # the call's own deadline comes first: DEADLINE_EXCEEDED
            def time_remaining(self):
                return 0.005

        with pytest.raises(TimeoutError):
            loop.run_until_complete(within(loop.create_future(), _Short(), 0.5))
    finally:
        loop.close()
