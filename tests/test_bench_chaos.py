"""``geopubsub bench chaos``: its checker on hand-made streams (a loss, a duplicate, a sequence
out of order, a GAP must each be caught), the resuming result stream against a stand-in server
that drops it, the fault plan, the shard actor lookup by session; and the command end to end with
one fault of each kind (kill -9 and SIGSTOP of a shard actor, kill -9 of the coordinator and of
redis-server, SIGSTOP of redis-server), where nothing may be lost, duplicated or out of order."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from deploy import local
from deploy.processes import alive
from geopubsub.tools.bench_chaos import (
    KINDS,
    LEAD_S,
    TAIL_S,
    check_mover,
    check_static,
    findings,
    plan_faults,
    shard_actor_pids,
)
from geopubsub.tools.traffic import ResumingStream
from geopubsub.v1 import geopubsub_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]


def _static(arrivals, expected, *, acked=None, one_shot=(), all_expired=True):
    acked_set = set(expected) if acked is None else set(acked)
    return check_static(
        "s",
        arrivals,
        set(expected),
        acked_set.__contains__,
        set(one_shot).__contains__,
        all_expired=all_expired,
    )


def _counts(c):
    return (c.lost, c.duplicated, c.out_of_order, c.unexpected)


def test_a_clean_static_stream_passes():
    c = _static(
        [(1, 1, "+", "p1"), (2, 2, "+", "p2"), (3, 3, "-", "p1"), (4, 4, "-", "p2")],
        {"p1", "p2"},
    )
    assert _counts(c) == (0, 0, 0, 0) and (c.deliveries, c.adds, c.removes) == (4, 2, 2)
    assert c.examples == []


def test_the_static_check_catches_a_lost_add_but_not_an_unacknowledged_one():
    c = _static([(1, 1, "+", "p1"), (2, 2, "-", "p1")], {"p1", "p2", "p3"}, acked={"p1", "p2"})
    assert _counts(c) == (1, 0, 0, 0)
    assert "+ p2 never received" in c.examples[0]


def test_the_static_check_catches_duplicates():
    twice = _static([(1, 1, "+", "p1"), (2, 2, "+", "p1"), (3, 3, "-", "p1")], {"p1"})
    assert _counts(twice) == (0, 1, 0, 0)
    assert "+ p1 (#2) again, first as #1" in twice.examples[0]
    unacked_twice = _static(
        [(1, 1, "+", "p1"), (2, 2, "+", "p1")], {"p1"}, acked=(), one_shot={"p1"}
    )
    assert unacked_twice.duplicated == 1
    removed_twice = _static([(1, 1, "+", "p1"), (2, 2, "-", "p1"), (3, 3, "-", "p1")], {"p1"})
    assert _counts(removed_twice) == (0, 1, 0, 0)
    same_sequence = _static(
        [(1, 1, "+", "p1"), (1, 1, "+", "p2")], {"p1", "p2"}, one_shot={"p1", "p2"}
    )
    assert _counts(same_sequence) == (0, 1, 0, 0)
    assert "sequence #1 (+ p2) received again" in same_sequence.examples[0]


def test_the_static_check_catches_a_sequence_out_of_order():
    c = _static([(2, 2, "+", "p2"), (1, 1, "+", "p1")], {"p1", "p2"}, one_shot={"p1", "p2"})
    assert _counts(c) == (0, 0, 1, 0)
    assert "#1 (+ p1) after #2" in c.examples[0]


def test_a_gap_over_an_acknowledged_message_is_lost_and_counted_apart():
    c = _static(
        [(1, 1, "+", "p1"), (2, 3, "gap", ""), (4, 4, "+", "p4")],
        {"p1", "p2", "p4"},
        one_shot={"p1", "p2", "p4"},
    )
    assert _counts(c) == (1, 0, 0, 0)
    assert (c.gaps, c.gap_sequences, c.deliveries) == (1, 2, 2)
    assert "GAPs #2..#3" in c.examples[0]
    into_gap = _static([(2, 3, "gap", ""), (3, 3, "+", "p1")], {"p1"}, one_shot={"p1"})
    assert into_gap.duplicated == 1  # a sequence the GAP already named


def test_the_static_check_catches_a_missing_remove_and_a_remove_without_add():
    held = _static([(1, 1, "+", "p1"), (2, 2, "+", "p2")], {"p1", "p2"}, one_shot={"p2"})
    assert _counts(held) == (1, 0, 0, 0) and "p1 (+ #1) still held" in held.examples[0]
    assert held.lost_removes == 1
    assert _static([(1, 1, "+", "p1")], {"p1"}, all_expired=False).lost == 0
    described = check_static(
        "s",
        [(1, 1, "+", "p1")],
        {"p1"},
        bool,
        lambda m: False,
        all_expired=True,
        describe=str.upper,
    )
    assert described.examples == [
        "lost REMOVE: s: p1 (+ #1) still held after it expired: no - [P1]"
    ]
    orphan = _static([(1, 1, "-", "p1")], {"p1"})
    assert _counts(orphan) == (1, 0, 0, 0)  # once, not also as a missing +
    assert "- p1 (#1) without its +" in orphan.examples[0]


def test_the_static_check_catches_unexpected_deliveries():
    c = _static([(1, 1, "+", "p9"), (2, 2, "-", "p9")], {"p1"}, acked=())
    assert c.unexpected == 1
    one_shot_removed = _static([(1, 1, "+", "p1"), (2, 2, "-", "p1")], {"p1"}, one_shot={"p1"})
    assert one_shot_removed.unexpected == 1


def _mover(arrivals, *, matches=lambda m: True, one_shot=(), all_expired=True):
    return check_mover("m", arrivals, matches, set(one_shot).__contains__, all_expired=all_expired)


def test_a_mover_may_hold_a_message_again_but_not_twice():
    ok = _mover([(1, 1, "+", "p1"), (2, 2, "-", "p1"), (3, 3, "+", "p1"), (4, 4, "-", "p1")])
    assert _counts(ok) == (0, 0, 0, 0) and ok.deliveries == 4
    twice = _mover([(1, 1, "+", "p1"), (2, 2, "+", "p1"), (3, 3, "-", "p1")])
    assert _counts(twice) == (0, 1, 0, 0)
    one_shot = _mover([(1, 1, "+", "p5"), (2, 2, "+", "p5")], one_shot={"p5"})
    assert _counts(one_shot) == (0, 1, 0, 0)


def test_the_mover_check_catches_losses_order_and_strangers():
    orphan = _mover([(1, 1, "-", "p1")])
    assert _counts(orphan) == (1, 0, 0, 0)
    held = _mover([(1, 1, "+", "p1"), (2, 2, "+", "p2")], one_shot={"p2"})
    assert _counts(held) == (1, 0, 0, 0) and "p1 (+ #1) still held" in held.examples[0]
    assert held.lost_removes == 1 and orphan.lost_removes == 0
    order = _mover([(2, 2, "+", "p1"), (1, 1, "-", "p1")])
    assert _counts(order) == (0, 0, 1, 0)
    stranger = _mover([(1, 1, "+", "p1"), (2, 2, "-", "p1")], matches=lambda m: False)
    assert stranger.unexpected == 1


def test_a_rare_finding_is_reported_before_many_common_ones():
    held = [(i, i, "+", f"p{i}") for i in range(1, 40)]  # 39 lost REMOVEs
    many = _static(held + [(40, 40, "+", "p1")], {f"p{i}" for i in range(1, 40)})
    assert many.lost_removes == 39 and many.duplicated == 1 and len(many.examples) == 11
    out = findings([many])
    assert out[0].startswith("duplicated: s: + p1 (#40) again") and len(out) == 11


def test_the_fault_plan_has_every_kind_and_stays_inside_the_traffic():
    for n in (5, 12):
        plan = plan_faults(n, KINDS, 60.0, seed=3)
        kinds = [k for _, k in plan]
        assert len(plan) == n and all(kinds.count(k) >= n // len(KINDS) for k in KINDS)
        times = [t for t, _ in plan]
        assert times == sorted(times) and times[0] >= LEAD_S and times[-1] <= 60.0 - TAIL_S
    assert plan_faults(5, KINDS, 60.0, seed=3) == plan_faults(5, KINDS, 60.0, seed=3)


def test_shard_actors_are_found_by_name_in_the_coordinators_session_only():
    def fake_actor():  # argv[0] "ray::ShardActor", in a session of its own like the coordinator
        return subprocess.Popen(
            ["bash", "-c", 'exec -a "ray::ShardActor" sleep 30'], start_new_session=True
        )

    ours, theirs = fake_actor(), fake_actor()
    try:
        deadline = time.monotonic() + 5
        while shard_actor_pids(ours.pid) != [ours.pid]:
            assert time.monotonic() < deadline, shard_actor_pids(ours.pid)
            time.sleep(0.05)
        assert theirs.pid not in shard_actor_pids(ours.pid)
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
    assert shard_actor_pids(ours.pid) == []


def _error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "test")


def _add(seq: int, mid: str) -> pb.Delivery:
    return pb.Delivery(
        subscription_id="s", sequence=seq, kind=pb.Delivery.ADD, message=pb.Message(id=mid)
    )


class _Call:
    """A stand-in StreamResults call: yields its deliveries, then raises ``error`` (or ends, or
    never ends)."""

    def __init__(self, deliveries, error=None, *, hang=False):
        self.deliveries, self.error, self.hang = deliveries, error, hang

    def __aiter__(self):
        return self._read()

    async def _read(self):
        for d in self.deliveries:
            yield d
        if self.error is not None:
            raise self.error
        if self.hang:
            await asyncio.Event().wait()

    def cancel(self):
        pass


class _Stub:
    def __init__(self, calls):
        self.calls = list(calls)
        self.requests: list[int] = []

    def StreamResults(self, request):
        self.requests.append(request.after_sequence)
        return self.calls.pop(0)


def test_a_resuming_stream_reconnects_after_the_last_sequence_and_records_every_arrival():
    gap = pb.Delivery(subscription_id="s", sequence=5, kind=pb.Delivery.GAP, gap_from=4)
    stub = _Stub(
        [
            _Call([_add(1, "p1"), _add(2, "p2")], _error(grpc.StatusCode.UNAVAILABLE)),
            _Call([_add(3, "p3"), gap, _add(6, "p6")]),  # the server ends it
            _Call([], _error(grpc.StatusCode.INTERNAL)),
            _Call([], hang=True),
        ]
    )
    stream = ResumingStream("s", give_up_s=30.0)

    async def main():
        task = asyncio.ensure_future(stream.run(stub))
        deadline = time.monotonic() + 10
        while len(stub.requests) < 4:
            assert time.monotonic() < deadline, stub.requests
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert stub.requests == [0, 2, 6, 6]
    assert stream.arrivals == [
        (1, 1, "+", "p1"),
        (2, 2, "+", "p2"),
        (3, 3, "+", "p3"),
        (4, 5, "gap", ""),
        (6, 6, "+", "p6"),
    ]
    assert stream.reconnects == 3 and stream.errors == {"UNAVAILABLE": 1, "END": 1, "INTERNAL": 1}
    assert stream.gaps == [(4, 5)] and not stream.gave_up


def test_a_resuming_stream_gives_up_when_it_cannot_connect():
    stub = _Stub([_Call([], _error(grpc.StatusCode.UNAVAILABLE)) for _ in range(50)])
    stream = ResumingStream("s", give_up_s=0.5)
    began = time.monotonic()
    asyncio.run(asyncio.wait_for(stream.run(stub), 10))
    assert stream.gave_up and 0.5 <= time.monotonic() - began < 5
    assert 2 <= len(stub.requests) < 10


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_chaos_loses_and_repeats_nothing_through_one_fault_of_each_kind(tmp_path):
    argv = [sys.executable, "-m", "geopubsub.tools.cli", "bench", "chaos"]
    argv += ["--data-dir", str(tmp_path)]
    # 80 s: a fault is injected once the one before has recovered (a killed coordinator takes
    # ~12 s, more on a cold numba cache), and one that slips past the traffic's end is skipped
    duration, rate = 80, 100
    argv += ["--gen-subs", "2000", "--gen-msgs", "3000", "--duration", str(duration)]
    argv += ["--rate", str(rate)]
    argv += ["--ttl", "3", "--faults", "6", "--min-gap", "2", "--stop", "2", "3.5"]
    argv += ["--movers", "4", "--crowd-rate", "20", "--json"]
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400)
    finally:  # a run cut short leaves its detached cluster behind: stopped here (and failed)
        left = local.read_manifest(tmp_path)
        if left is not None:
            down = [sys.executable, "-m", "geopubsub.tools.cli", "down"]
            down += ["--data-dir", str(tmp_path)]
            subprocess.run(down, cwd=ROOT, timeout=120)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (r["lost"], r["duplicated"], r["out_of_order"], r["unexpected"]) == (0, 0, 0, 0), r[
        "findings"
    ]
    assert r["rejected_publishes"] == 0, r["rejections"]  # a retry is answered, never refused
    timeline = [(f["kind"], f["at_s"], f["stopped_s"], f["recovered_s"]) for f in r["fault_log"]]
    assert r["faults_skipped"] == [], (r["faults_skipped"], timeline)
    assert r["faults"] == dict.fromkeys(KINDS, 1), timeline
    assert all(f["recovered_s"] is not None for f in r["fault_log"])
    assert r["restarts"]["coordinator"] == 2 and r["restarts"]["redis"] == 1
    assert r["restarts"]["shard_actor_processes_seen"] > 2  # a killed one was replaced
    # not vacuous: the faults were felt, and deliveries of every kind were checked
    assert r["drained"] and r["stream_reconnects"] >= r["followed_streams"]
    assert sum(r["publish_failures"].values()) > 0 and r["retried_publishes"] > 0
    assert r["published"] == duration * rate and r["acknowledged"] > 0.9 * r["published"]
    assert r["followed_streams"] >= 20 and r["tracked_movers"] == 4
    assert r["static"]["adds"] > 50 and r["static"]["removes"] > 0
    assert r["movers"]["adds"] > 0 and r["movers"]["removes"] > 0
    # everything it started is stopped
    assert left is None
    assert not any(alive(f["pid"]) for f in r["fault_log"])
    assert proc.returncode == 0, proc.stderr[-3000:]
