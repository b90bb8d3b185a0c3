"""The retention log (``coordinator.retention``) against a real redis-server, and what it promises
through the coordinator (in-process shards): acknowledged deliveries are in Redis, numbering
never repeats across restarts (ephemeral subscriptions included), what cannot be served comes as
a GAP, and a publish retried with the same id is not delivered twice."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import grpc
import numpy as np
import pytest

import coordinator.retention as retention
from coordinator.metadata import Metadata
from coordinator.retention import SREC, RoundLog, directory_of, encode_round, message_record
from coordinator.server import stop_server
from coordinator.shards import LocalShard
from deploy.redis_local import RedisServer
from geopubsub.client import GeoPubSubClient
from geopubsub.convert import to_proto_message, to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from shard.model import Message, Point, Rect, Subscription
from shard.state import ShardState
from tests.clusters import DownShard, Node, coordinator_settings

pytestmark = pytest.mark.redis


def _blob(
    n: int, t: float, rows: dict[str, tuple[int, int, list[tuple[int, str]]]], pub=()
) -> bytes:
    """A round blob from {sub id: (prev round, first sequence, [(kind, message id)])} and the
    client ids published (each matched once)."""
    ids, recs, kinds, midx, mids = [], [], [], [], []
    for sid, (prev, first, ds) in rows.items():
        ids.append(sid.encode())
        recs.append((prev, first, len(ds), len(kinds)))
        for kind, mid in ds:
            kinds.append(kind)
            if mid not in mids:
                mids.append(mid)
            midx.append(mids.index(mid))
    msgs = [message_record(m, b"" if m.startswith("r") else m.encode() * 3) for m in mids]
    return encode_round(
        n,
        t,
        *directory_of(ids),
        np.array(recs, SREC),
        np.array(kinds, np.uint8),
        np.array(midx),
        msgs,
        list(pub),
        [1] * len(pub),
    )


def test_a_chain_of_rounds_reads_back_exactly_from_any_sequence(redis_url, monkeypatch):
    """Records of two subscriptions interleaved over 40 rounds; reads from every point give
    exactly the deliveries after it, across several script calls (few records per call)."""
    monkeypatch.setattr(retention, "WALK_HOPS", 3)

    async def main():
        md = Metadata(redis_url, uuid.uuid4().hex)
        log = RoundLog(md, retention_s=3600, max_bytes=1 << 30)
        head = {"a": 0, "b é*": 0}
        seq = {"a": 0, "b é*": 0}
        want: dict[str, list[tuple[int, int, str]]] = {"a": [], "b é*": []}
        try:
            for r in range(1, 41):
                n = log.next_round()
                rows = {}
                for sid in ("a", "b é*"):
                    if (r + len(sid)) % 3:  # not every round has every subscription
                        ds = [(0, f"m{r}"), (1, f"r{r}")] if r % 2 else [(0, f"m{r}")]
                        rows[sid] = (head[sid], seq[sid] + 1, ds)
                        for kind, mid in ds:
                            seq[sid] += 1
                            want[sid].append((seq[sid], kind, mid))
                        head[sid] = n
                await log.append(n, 100.0 + r, _blob(n, 100.0 + r, rows), [], [])
            for sid in want:
                for after in (0, 1, 7, seq[sid] - 1, seq[sid]):
                    got = await log.read(sid, head[sid], after, keep=10_000, now=200.0)
                    assert [(e.sequence, e.kind, e.msg_id) for e in got] == [
                        w for w in want[sid] if w[0] > after
                    ]
                    for e in got:
                        assert e.payload == (b"" if e.kind else e.msg_id.encode() * 3)
                got = await log.read(sid, head[sid], 0, keep=5, now=200.0)
                assert [e.sequence for e in got] == list(range(seq[sid] - 4, seq[sid] + 1))
                # rounds older than retention_s are not served
                got = await log.read(sid, head[sid], 0, keep=10_000, now=100.0 + 3600 + 30.5)
                assert got and got[0].time > 130.5
        finally:
            await md.close()

    asyncio.run(main())


def test_the_log_keeps_its_size_budget_and_recovers_what_it_kept(redis_url):
    async def main():
        ns = uuid.uuid4().hex
        md = Metadata(redis_url, ns)
        try:
            log = RoundLog(md, retention_s=3600, max_bytes=2000)
            head = 0
            for r in range(1, 61):
                n = log.next_round()
                blob = _blob(n, float(r), {"s": (head, r, [(0, f"m{r}")])}, [f"p{r}"])
                head = n
                await log.append(n, float(r), blob, [f"p{r}"], [(b"e", r)])
            assert log.bytes <= 2000
            kept = [k[0] for k in log.kept]
            assert kept == list(range(61 - len(kept), 61)) and len(kept) < 60
            got = await log.read("s", head, 0, keep=10_000, now=61.0)
            assert [e.sequence for e in got] == kept  # one delivery a round; older ones gone
            assert await md.get(md.key("round", "1").encode()) is None
            again = RoundLog(md, retention_s=3600, max_bytes=2000)
            rec = await again.recover()
            assert rec.last_round == 60 and again.last_round == 60
            assert [r[0] for r in rec.rounds] == kept
            assert rec.heads == {"s": (60, 60)}
            assert rec.leases == {"e": 60}
            assert rec.published == {f"p{k}": 1 for k in kept}
        finally:
            await md.close()

    asyncio.run(main())


def test_a_round_may_extend_many_leases_at_once(redis_url):
    """More leases than Lua's unpack takes in one call (~8,000 values)."""

    async def main():
        md = Metadata(redis_url, uuid.uuid4().hex)
        try:
            log = RoundLog(md, retention_s=3600, max_bytes=1 << 30)
            n = log.next_round()
            leases = [(f"e{i}".encode(), i) for i in range(9_000)]
            await log.append(n, 1.0, _blob(n, 1.0, {}), [], leases)
            rec = await RoundLog(md, retention_s=3600, max_bytes=1 << 30).recover()
            assert rec.leases == {f"e{i}": i for i in range(9_000)}
        finally:
            await md.close()

    asyncio.run(main())


# ---- through the coordinator ------------------------------------------------------------------
async def _read(stub, sub_id: str, after: int = 0, quiet_s: float = 0.4) -> list[pb.Delivery]:
    out = []
    call = stub.StreamResults(pb.StreamResultsRequest(id=sub_id, after_sequence=after))
    try:
        while True:
            out.append(await asyncio.wait_for(call.read(), quiet_s))
    except TimeoutError:
        pass
    finally:
        call.cancel()
    return out


def _shape(ds: list[pb.Delivery]) -> list[tuple]:
    return [
        ("gap", d.gap_from, d.sequence) if d.kind == pb.Delivery.GAP else (d.sequence, d.message.id)
        for d in ds
    ]


async def _publish(stub, mid: str, point=(0.5, 0.5)) -> pb.PublishResponse:
    m = Message(mid, ("x",), Point(*point))
    return await stub.Publish(pb.PublishRequest(message=to_proto_message(m)))


def _sub(sid: str, ephemeral: bool = False) -> pb.SubscribeRequest:
    s = to_proto_subscription(Subscription(sid, (("x",),), Rect(-1, -1, 1, 1)))
    s.ephemeral = ephemeral
    return pb.SubscribeRequest(subscription=s)


def test_acknowledged_deliveries_survive_a_crash_and_numbering_goes_on(redis_url):
    """The coordinator stops without a final write right after its publishes are answered:
    the durable subscription's deliveries are all there; the ephemeral one's numbering does
    not start again at 1 (a resume after 3 gets a GAP, never silence)."""
    ns = uuid.uuid4().hex

    async def main():
        async with Node(coordinator_settings(redis_url, ns)) as a:
            await a.stub.Subscribe(_sub("d"))
            await a.stub.Subscribe(_sub("e", ephemeral=True))
            for i in range(5):
                assert (await _publish(a.stub, f"m{i}")).matched == 2
            await a.crash()
        async with Node(coordinator_settings(redis_url, ns)) as b:
            got = await _read(b.stub, "d")
            assert _shape(got) == [(i + 1, f"m{i}") for i in range(5)]
            assert _shape(await _read(b.stub, "d", after=3)) == [(4, "m3"), (5, "m4")]
            await _publish(b.stub, "n")
            assert _shape(await _read(b.stub, "d", after=5)) == [(6, "n")]
            got = _shape(await _read(b.stub, "e", after=3))
            assert got[0][0] == "gap" and got[0][1] == 4 and got[0][2] > 5  # numbers skipped
            await _publish(b.stub, "n2")
            after = got[0][2]
            # n2 reached "e" while nobody followed it: not retained (ephemeral), so a gap
            assert _shape(await _read(b.stub, "e", after=after)) == [("gap", after + 1, after + 1)]
            after += 1
            call = b.stub.StreamResults(pb.StreamResultsRequest(id="e", after_sequence=after))
            await asyncio.sleep(0.2)
            await _publish(b.stub, "n3")
            d = await asyncio.wait_for(call.read(), 5)
            call.cancel()
            assert (d.sequence, d.message.id) == (after + 1, "n3")
            stats = await b.stub.GetStats(pb.GetStatsRequest())
            assert stats.gaps >= 1 and stats.log_rounds >= 1

    asyncio.run(main())


def test_a_clean_restart_skips_no_number_of_an_ephemeral_subscription(redis_url):
    ns = uuid.uuid4().hex

    async def main():
        async with Node(coordinator_settings(redis_url, ns)) as a:
            await a.stub.Subscribe(_sub("e", ephemeral=True))
            for i in range(3):
                await _publish(a.stub, f"m{i}")
        async with Node(coordinator_settings(redis_url, ns)) as b:
            call = b.stub.StreamResults(pb.StreamResultsRequest(id="e", after_sequence=3))
            await asyncio.sleep(0.2)
            await _publish(b.stub, "n")
            d = await asyncio.wait_for(call.read(), 5)
            call.cancel()
            assert (d.kind, d.sequence, d.message.id) == (pb.Delivery.ADD, 4, "n")

    asyncio.run(main())


def test_a_publish_retried_with_its_id_is_delivered_once(redis_url):
    """Retrying a publish (same client-given id) answers the first one's matched count and makes
    no second delivery, within one coordinator, after a crash and inside a batch; a message
    without an id is new every time."""
    ns = uuid.uuid4().hex

    async def main():
        async with Node(coordinator_settings(redis_url, ns)) as a:
            await a.stub.Subscribe(_sub("d"))
            assert (await _publish(a.stub, "once")).matched == 1
            assert (await _publish(a.stub, "once")).matched == 1
            m = Message("stored", ("x",), Point(0.5, 0.5), ttl=60.0)
            req = pb.PublishRequest(message=to_proto_message(m))
            assert (await a.stub.Publish(req)).matched == 1
            assert (await a.stub.Publish(req)).matched == 1  # not "a live message has this id"
            await a.crash()
        async with Node(coordinator_settings(redis_url, ns)) as b:
            assert (await _publish(b.stub, "once")).matched == 1
            batch = [
                to_proto_message(Message(i, ("x",), Point(0.5, 0.5))) for i in ("once", "fresh")
            ]
            r = await b.stub.Publish(pb.PublishRequest(messages=batch))
            assert list(r.matches) == [1, 1]
            anon = pb.Message(keywords=["x"], point=pb.Point(lon=0.5, lat=0.5))
            await b.stub.Publish(pb.PublishRequest(message=anon))
            await b.stub.Publish(pb.PublishRequest(message=anon))
            got = _shape(await _read(b.stub, "d"))
            assert [g[1] for g in got[:3]] == ["once", "stored", "fresh"]
            assert [g[0] for g in got] == [1, 2, 3, 4, 5]  # and the two anonymous ones

    asyncio.run(main())


def test_a_resume_from_before_what_is_retained_starts_with_a_gap(redis_url):
    async def main():
        async with Node(coordinator_settings(redis_url, uuid.uuid4().hex, retention_max=10)) as a:
            await a.stub.Subscribe(_sub("k"))
            for i in range(30):
                await _publish(a.stub, f"k{i}")
            got = _shape(await _read(a.stub, "k"))
            assert got == [("gap", 1, 20)] + [(i + 1, f"k{i}") for i in range(20, 30)]
            got = _shape(await _read(a.stub, "k", after=25))
            assert got == [(i + 1, f"k{i}") for i in range(25, 30)]

    asyncio.run(main())


async def _drain(call) -> list[pb.Delivery]:
    """What an open stream gives until it ends (5 s at most)."""
    out = []
    while (d := await asyncio.wait_for(call.read(), 5)) is not grpc.aio.EOF:
        out.append(d)
    return out


@pytest.mark.parametrize("at_once", [False, True])
def test_an_id_subscribed_again_is_a_new_subscription_to_its_stream(redis_url, at_once):
    """An id unsubscribed and subscribed again: its stream from 0 shows the earlier
    subscription's deliveries as a GAP (numbers go on, never repeat), the earlier one's open
    stream ends at its unsubscribe, and both hold after a crash, before the new subscription
    has a delivery of its own and after. ``at_once``: the Unsubscribe and the Subscribe are sent
    together (the same round, or the Subscribe's before the Unsubscribe's is delivered)."""
    ns = uuid.uuid4().hex

    async def main():
        async with Node(coordinator_settings(redis_url, ns)) as a:
            await a.stub.Subscribe(_sub("r"))
            for i in range(2):
                await _publish(a.stub, f"m{i}")
            call = a.stub.StreamResults(pb.StreamResultsRequest(id="r", after_sequence=0))
            await asyncio.sleep(0.2)
            if at_once:
                u = asyncio.ensure_future(a.stub.Unsubscribe(pb.UnsubscribeRequest(id="r")))
                await asyncio.sleep(0)
                await asyncio.gather(u, a.stub.Subscribe(_sub("r")))
            else:
                await a.stub.Unsubscribe(pb.UnsubscribeRequest(id="r"))
            assert _shape(await _drain(call)) == [(1, "m0"), (2, "m1")]
            if not at_once:
                await a.stub.Subscribe(_sub("r"))
            assert _shape(await _read(a.stub, "r")) == [("gap", 1, 2)]
            await a.crash()  # the new subscription has no delivery yet
        async with Node(coordinator_settings(redis_url, ns)) as b:
            assert _shape(await _read(b.stub, "r")) == [("gap", 1, 2)]
            await _publish(b.stub, "n")
            assert _shape(await _read(b.stub, "r")) == [("gap", 1, 2), (3, "n")]
            assert _shape(await _read(b.stub, "r", after=1)) == [("gap", 2, 2), (3, "n")]
            await b.crash()
        async with Node(coordinator_settings(redis_url, ns)) as c:
            assert _shape(await _read(c.stub, "r")) == [("gap", 1, 2), (3, "n")]

    asyncio.run(main())


def test_the_python_client_surfaces_a_gap(redis_url):
    async def main():
        async with Node(coordinator_settings(redis_url, uuid.uuid4().hex)) as a:
            await a.stub.Subscribe(_sub("e", ephemeral=True))
            await _publish(a.stub, "m")

            def first():
                with GeoPubSubClient(a.target) as c:
                    return next(iter(c.stream_results("e", resume=False)))

            d = await asyncio.to_thread(first)
            assert (d.kind, d.gap_from, d.sequence) == ("gap", 1, 1)
            assert str(d) == "gap e #1..#1"

    asyncio.run(main())


def test_a_slow_stream_drops_from_its_buffer_one_by_one_and_catches_up_from_the_log(redis_url):
    async def main():
        async with Node(coordinator_settings(redis_url, uuid.uuid4().hex, stream_buffer=3)) as a:
            await a.stub.Subscribe(_sub("d"))
            gen = a.app.deliveries.stream("d", 0)
            first = asyncio.ensure_future(gen.__anext__())  # open, waiting for a delivery
            await asyncio.sleep(0.1)
            for i in range(10):
                await _publish(a.stub, f"m{i}")
            got = [await first] + [await gen.__anext__() for _ in range(9)]
            await gen.aclose()
            assert _shape(got) == [(i + 1, f"m{i}") for i in range(10)]
            # 1 taken at once, 2..4 buffered, 5..10 dropped (and read from the log instead)
            assert a.app.deliveries.dropped == 6
            assert (await a.stub.GetStats(pb.GetStatsRequest())).dropped_deliveries == 6

    asyncio.run(main())


def test_open_streams_are_capped(redis_url):
    async def main():
        async with Node(coordinator_settings(redis_url, uuid.uuid4().hex, max_streams=1)) as a:
            await a.stub.Subscribe(_sub("d"))
            one = a.stub.StreamResults(pb.StreamResultsRequest(id="d"))
            await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _read(a.stub, "d")
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_streams=1" in e.value.details()
            one.cancel()
            await asyncio.sleep(0.2)
            assert await _read(a.stub, "d") == []  # the slot is free again

    asyncio.run(main())


def test_a_stream_buffer_is_bounded_in_bytes_too(redis_url):
    async def main():
        s = coordinator_settings(redis_url, uuid.uuid4().hex, stream_buffer_bytes=1024)
        async with Node(s) as a:
            await a.stub.Subscribe(_sub("d"))
            gen = a.app.deliveries.stream("d", 0)
            first = asyncio.ensure_future(gen.__anext__())
            await asyncio.sleep(0.1)
            big = " ".join(["word"] * 60)  # ~300 bytes of text
            for i in range(10):
                m = Message(f"m{i}", ("x",), Point(0.5, 0.5))
                p = to_proto_message(m)
                p.text = big
                await a.stub.Publish(pb.PublishRequest(message=p))
            got = [await first] + [await gen.__anext__() for _ in range(9)]
            await gen.aclose()
            assert [d.sequence for d in got] == list(range(1, 11))
            assert a.app.deliveries.dropped >= 6  # ~3 of ~330 bytes fit in 1,024

    asyncio.run(main())


# ---- live messages and positions across restarts and shard failures ---------------------------
def _mover(sid: str, ephemeral: bool = False) -> pb.SubscribeRequest:
    s = to_proto_subscription(Subscription(sid, (("x",),), Rect(-0.5, -0.5, 0.5, 0.5), True))
    s.ephemeral = ephemeral
    return pb.SubscribeRequest(subscription=s)


async def _stored(stub, mid: str, point, ttl: float) -> None:
    m = Message(mid, ("x",), Point(*point), ttl=ttl)
    await stub.Publish(pb.PublishRequest(message=to_proto_message(m)))


async def _move(stub, sid: str, point) -> list[tuple]:
    r = await stub.UpdateLocation(
        pb.UpdateLocationRequest(id=sid, point=pb.Point(lon=point[0], lat=point[1]))
    )
    return [(d.sequence, d.kind, d.message.id) for d in r.updates]


ADD, REMOVE = pb.Delivery.ADD, pb.Delivery.REMOVE


def test_live_messages_and_positions_survive_a_coordinator_crash(redis_url):
    """A mover holds a live message when the coordinator dies: after the restart it is where it
    was, leaving and entering the message gives exactly - and +, and the message's expiry
    still brings the REMOVE (to the mover and to a static subscription)."""
    ns = uuid.uuid4().hex

    async def main():
        async with Node(coordinator_settings(redis_url, ns)) as a:
            await a.stub.Subscribe(_mover("mv"))
            await a.stub.Subscribe(
                pb.SubscribeRequest(
                    subscription=to_proto_subscription(
                        Subscription("st", (("x",),), Rect(4, 4, 6, 6))
                    )
                )
            )
            await _stored(a.stub, "L", (5, 5), ttl=4.0)
            await _stored(a.stub, "gone", (-5, -5), ttl=0.5)  # expires while it is down
            assert await _move(a.stub, "mv", (5, 5)) == [(1, ADD, "L")]
            await a.crash()
        await asyncio.sleep(0.6)
        async with Node(coordinator_settings(redis_url, ns)) as b:
            assert await _move(b.stub, "mv", (0, 0)) == [(2, REMOVE, "L")]
            assert await _move(b.stub, "mv", (5.1, 5)) == [(3, ADD, "L")]
            st = b.stub.StreamResults(pb.StreamResultsRequest(id="st", after_sequence=1))
            mv = b.stub.StreamResults(pb.StreamResultsRequest(id="mv", after_sequence=3))
            got_st = await asyncio.wait_for(st.read(), 10)
            got_mv = await asyncio.wait_for(mv.read(), 10)
            st.cancel()
            mv.cancel()
            assert (got_st.sequence, got_st.kind, got_st.message.id) == (2, REMOVE, "L")
            assert (got_mv.sequence, got_mv.kind, got_mv.message.id) == (4, REMOVE, "L")
            assert len(b.app.engine.live) == 0
            await asyncio.sleep(0.3)  # (the round that expired L is written)
            assert await b.app.md.hgetall(b.app.log.live_key) == {}

    asyncio.run(main())


class LosingShard(LocalShard):
    """A shard that, when told, fails a round and forgets everything (a crashed process)."""

    lose = False

    async def apply(self, ops, now):
        if LosingShard.lose:
            LosingShard.lose = False
            self.state = ShardState(self.shard_id)
            raise RuntimeError("shard process died")
        return await super().apply(ops, now)


def test_a_reloaded_shard_gets_its_live_messages_back(redis_url):
    async def main():
        async with Node(
            coordinator_settings(redis_url, uuid.uuid4().hex, shards=1), LosingShard
        ) as a:
            await a.stub.Subscribe(_mover("mv"))
            await _stored(a.stub, "L", (5, 5), ttl=60.0)
            LosingShard.lose = True
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _stored(a.stub, "other", (7, 7), ttl=60.0)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert await _move(a.stub, "mv", (5, 5)) == [(1, ADD, "L")]
            assert (await a.stub.GetStats(pb.GetStatsRequest())).shards[0].live_messages >= 1

    asyncio.run(main())


def test_while_redis_is_down_new_operations_are_refused_and_the_log_heals_itself(tmp_path):
    """Redis killed (kill -9) under a running coordinator: the round being written is retried,
    new operations answer UNAVAILABLE at once naming the log, and once a redis-server is back
    on the same port and data the stuck round is written, answered and streamed, and publishing
    works again: nothing acknowledged is lost, nothing delivered twice."""

    async def main():
        server = RedisServer(tmp_path).start()
        port = server.port
        try:
            async with Node(coordinator_settings(server.url, "n", deadline_s=30.0)) as a:
                await a.stub.Subscribe(_sub("d"))
                assert (await _publish(a.stub, "before")).matched == 1
                await asyncio.sleep(1.2)  # (appendfsync everysec: on disk)
                os.kill(server.pid, signal.SIGKILL)
                server.process.wait()
                stuck = asyncio.ensure_future(_publish(a.stub, "during"))
                for _ in range(100):
                    if a.app.deliveries.log_failing is not None:
                        break
                    await asyncio.sleep(0.05)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _publish(a.stub, "refused")
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "retention log" in e.value.details()
                assert not stuck.done()
                again = RedisServer(tmp_path, port=port).start()
                try:
                    assert (await asyncio.wait_for(stuck, 20)).matched == 1
                    assert (await _publish(a.stub, "after")).matched == 1
                    assert _shape(await _read(a.stub, "d")) == [
                        (1, "before"),
                        (2, "during"),
                        (3, "after"),
                    ]
                    assert (await a.stub.GetStats(pb.GetStatsRequest())).log_write_failures > 0
                finally:
                    await stop_server(a.server, a.app)
                    a.crashed = True
                    again.stop()
        finally:
            if server.process is not None and server.process.poll() is None:
                server.stop()

    asyncio.run(main())


def test_a_publish_that_failed_on_its_shard_is_published_when_retried(redis_url):
    async def main():
        async with Node(
            coordinator_settings(redis_url, uuid.uuid4().hex, shards=1), LosingShard
        ) as a:
            await a.stub.Subscribe(_sub("d"))
            LosingShard.lose = True
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _publish(a.stub, "again")
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            await asyncio.sleep(0.3)  # the failed round went through the delivery stage
            for _ in range(50):  # the shard is reloaded; then the retry is published
                try:
                    r = await _publish(a.stub, "again")
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            assert r.matched == 1
            assert _shape(await _read(a.stub, "d")) == [(1, "again")]

    asyncio.run(main())


def test_reload_keeps_moved_positions_and_live_messages(redis_url):
    async def main():
        async with Node(coordinator_settings(redis_url, uuid.uuid4().hex)) as a:
            await a.stub.Subscribe(_mover("mv"))
            await _stored(a.stub, "L", (5, 5), ttl=60.0)
            assert await _move(a.stub, "mv", (5, 5)) == [(1, ADD, "L")]
            assert (await a.stub.Reload(pb.ReloadRequest())).subscriptions == 1
            assert await _move(a.stub, "mv", (0, 0)) == [(2, REMOVE, "L")]
            await a.stub.Subscribe(_mover("mv"))  # registered anew: back at its own centre
            assert (await a.stub.Reload(pb.ReloadRequest())).subscriptions == 1
            assert await _move(a.stub, "mv", (5.2, 5)) == [(3, ADD, "L")]

    asyncio.run(main())


def test_a_message_that_expires_while_its_shard_is_down_still_brings_its_removes(redis_url):
    async def main():
        async with Node(
            coordinator_settings(redis_url, uuid.uuid4().hex, shards=1), DownShard
        ) as a:
            await a.stub.Subscribe(_mover("mv"))
            await _stored(a.stub, "L", (5, 5), ttl=1.0)
            assert await _move(a.stub, "mv", (5, 5)) == [(1, ADD, "L")]
            call = a.stub.StreamResults(pb.StreamResultsRequest(id="mv", after_sequence=1))
            DownShard.down_until = time.monotonic() + 2.0  # down past L's expiry
            with pytest.raises(grpc.aio.AioRpcError):
                await _stored(a.stub, "other", (-7, -7), ttl=60.0)
            d = await asyncio.wait_for(call.read(), 15)  # after the shard is back
            call.cancel()
            assert (d.sequence, d.kind, d.message.id) == (2, REMOVE, "L")
            assert "L" not in a.app.engine.live

    asyncio.run(main())
