"""The direct shard channel (``shard.host.channel``) over real loopback sockets: answers in order,
a failing call fails alone, a wrong token is refused both ways and never sent, a silent or
surplus connection is closed, a lost connection fails every waiting call with UNAVAILABLE, a
fence turns older connections away; and through a real shard actor, rounds over the channel give
what rounds over Ray calls give, a restarted actor's channel is opened again, and a pickle sent
to it is refused without being run."""

from __future__ import annotations

import asyncio
import os
import pickle
import secrets
import socket
import struct
import threading
import time

import msgpack
import pytest

from coordinator import shards as shards_mod
from coordinator.shards import RayShard
from shard.errors import UnavailableError
from shard.host import channel as channel_mod
from shard.host.actor import make_shard_actor
from shard.host.channel import Channel, ChannelServer, proof
from shard.model import Message, Point, Rect, Subscription
from shard.wire import dumps_ops, loads_result


def _echo(payload: bytes, now: float) -> bytes:
    if payload == b"boom":
        raise ValueError("no such thing")
    if payload == b"slow":
        time.sleep(0.05)
    return msgpack.packb([payload, now])


def _unpack(answer: bytes):
    return tuple(msgpack.unpackb(answer, use_list=False))


def _raw_login(address, token: bytes) -> socket.socket:
    """A hand-made client: the handshake of ``shard.host.channel``, then the socket."""
    sock = socket.create_connection(address, timeout=10)
    challenge = _recv(sock, channel_mod.NONCE_BYTES)
    ours = secrets.token_bytes(channel_mod.NONCE_BYTES)
    sock.sendall(ours + proof(token, channel_mod._CLIENT, challenge, ours))
    assert _recv(sock, 32) == proof(token, channel_mod._SERVER, ours, challenge)
    return sock


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def test_calls_are_answered_in_order_and_a_failing_call_fails_alone():
    server = ChannelServer("127.0.0.1", _echo)

    async def main():
        ch = await Channel.open(server.address, server.token, "shard 0")
        calls = [
            ch.call(p, float(i)) for i, p in enumerate([b"slow", b"a", b"boom", b"b" * 70_000])
        ]
        got = await asyncio.gather(*calls, return_exceptions=True)
        assert _unpack(got[0]) == (b"slow", 0.0)
        assert _unpack(got[1]) == (b"a", 1.0)
        assert isinstance(got[2], UnavailableError)
        assert "ValueError: no such thing" in str(got[2]) and "shard 0" in str(got[2])
        assert _unpack(got[3]) == (b"b" * 70_000, 3.0)  # longer than one socket read
        assert not ch.broken
        assert _unpack(await ch.call(b"after", 4.0)) == (b"after", 4.0)
        await ch.close()
        with pytest.raises(UnavailableError):
            await ch.call(b"closed", 5.0)

    asyncio.run(main())
    server.close()


def test_a_wrong_token_is_refused_and_the_token_never_crosses_the_network():
    server = ChannelServer("127.0.0.1", _echo)

    async def main():
        with pytest.raises(UnavailableError, match="refused the channel"):
            await Channel.open(server.address, b"x" * len(server.token), "shard 1")

    asyncio.run(main())
    server.close()

    # a listener that pretends to be the shard sees what a client sends, and cannot answer
    token = secrets.token_bytes(channel_mod.TOKEN_BYTES)
    impostor = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def pretend():
        conn, _ = impostor.accept()
        with conn:
            conn.sendall(b"c" * channel_mod.NONCE_BYTES)
            seen.append(_recv(conn, channel_mod.NONCE_BYTES + 32))
            conn.sendall(b"p" * 32)  # no proof: it does not hold the token

    thread = threading.Thread(target=pretend)
    thread.start()

    async def client():
        with pytest.raises(UnavailableError, match="does not hold the channel's token"):
            await Channel.open(impostor.getsockname(), token, "shard 5")

    asyncio.run(client())
    thread.join(10)
    impostor.close()
    assert len(seen[0]) == channel_mod.NONCE_BYTES + 32 and token not in seen[0]


def test_a_silent_connection_is_closed_and_connections_are_bounded(monkeypatch):
    monkeypatch.setattr(channel_mod, "AUTH_TIMEOUT_S", 0.5)
    monkeypatch.setattr(channel_mod, "MAX_CONNECTIONS", 3)
    server = ChannelServer("127.0.0.1", _echo)
    silent = socket.create_connection(server.address, timeout=10)
    assert len(_recv(silent, channel_mod.NONCE_BYTES)) == channel_mod.NONCE_BYTES
    t0 = time.monotonic()
    assert silent.recv(1) == b""  # closed by the shard, not by us
    assert 0.4 < time.monotonic() - t0 < 5
    silent.close()
    logged = [_raw_login(server.address, server.token) for _ in range(3)]
    extra = socket.create_connection(server.address, timeout=10)
    assert extra.recv(1) == b""  # no challenge: closed at once
    extra.close()
    logged.pop().close()  # one gone: a new one is taken again
    deadline = time.monotonic() + 5
    while True:
        again = socket.create_connection(server.address, timeout=10)
        if again.recv(channel_mod.NONCE_BYTES):
            break
        again.close()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again.close()
    for sock in logged:
        sock.close()
    server.close()


def test_a_lost_connection_fails_every_waiting_call():
    server = ChannelServer("127.0.0.1", _echo)

    async def main():
        ch = await Channel.open(server.address, server.token, "shard 2")
        assert _unpack(await ch.call(b"a", 1.0)) == (b"a", 1.0)
        calls = [asyncio.ensure_future(ch.call(b"slow", 2.0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        ch._writer.transport.abort()  # the connection drops with calls waiting
        for c in calls:
            with pytest.raises(UnavailableError):
                await asyncio.wait_for(c, 5)
        with pytest.raises(UnavailableError):
            await ch.call(b"later", 3.0)
        again = await Channel.open(server.address, server.token, "shard 2")  # a new one works
        assert _unpack(await again.call(b"b", 4.0)) == (b"b", 4.0)
        await again.close()

    asyncio.run(main())
    server.close()


def test_a_fence_turns_away_the_connections_opened_before_it():
    """What a shard's load does (``ShardActor.load``): a round still waiting on an older
    connection must not be applied to the new state; a connection opened after serves."""
    applied = []

    def handler(payload: bytes, now: float) -> bytes:
        applied.append(payload)
        return payload

    server = ChannelServer("127.0.0.1", handler)

    async def main():
        old = await Channel.open(server.address, server.token, "shard 4")
        assert await old.call(b"before", 1.0) == b"before"
        server.fence()
        with pytest.raises(UnavailableError, match="loaded again since this connection opened"):
            await asyncio.wait_for(old.call(b"stale", 2.0), 5)
        with pytest.raises(UnavailableError):  # and the old connection is closed
            await asyncio.wait_for(old.call(b"stale again", 3.0), 5)
        new = await Channel.open(server.address, server.token, "shard 4")
        assert await new.call(b"after", 4.0) == b"after"
        await new.close()
        await old.close()

    asyncio.run(main())
    server.close()
    assert applied == [b"before", b"after"]


def test_a_closed_port_is_unavailable():
    server = ChannelServer("127.0.0.1", _echo)
    address = server.address
    server.close()

    async def main():
        with pytest.raises(UnavailableError, match="unreachable"):
            await Channel.open(address, server.token, "shard 3")

    asyncio.run(main())


@pytest.mark.ray
def test_rounds_over_the_channel_equal_rounds_over_ray_and_survive_a_restart(ray_session):
    """Two actors loaded alike, one called through Ray and one through its channel, give the same
    answers to the same rounds; a restart breaks the channel, the next round opens a new one and
    fails UNAVAILABLE until the shard is loaded again."""
    ray = ray_session
    subs = [
        Subscription(f"s{i}", (("x",),), Rect(i, 0, i + 2, 2), moving=i % 2 == 0) for i in range(20)
    ]
    tags = list(range(len(subs)))
    rounds = [
        [("pub", Message(f"m{r}-{j}", ("x",), Point(r + j * 0.5, 1.0), ttl=2.0)) for j in range(8)]
        + [("move", "s4", Point(r + 1.0, 1.0)), ("unsub", f"s{r + 10}")]
        for r in range(5)
    ]
    actors = [make_shard_actor(k, {"theta_p": 4}) for k in (0, 1)]
    via_ray, via_channel = RayShard(0, actors[0], channel=False), RayShard(1, actors[1])

    def canonical(answer):
        (mids, counts, held), out, tags = answer
        expired = (mids, counts.tolist(), held.tolist())
        return expired, [x if isinstance(x, int) else sorted(x) for x in out], list(tags)

    async def main():
        for sh in (via_ray, via_channel):
            assert await sh.load(subs, 0.0, tags) == len(subs)
        for r, ops in enumerate(rounds):
            a = await via_ray.apply(ops, 1.0 + r)
            b = await via_channel.apply(ops, 1.0 + r)
            assert canonical(a) == canonical(b)
        assert via_channel._channel is not None and not via_ray._channel
        info = ray.get(actors[1].info.remote())
        old = via_channel._channel.result()
        ray.kill(actors[1], no_restart=False)
        deadline = time.monotonic() + 120
        while True:  # Ray brings the actor back empty
            try:
                if (
                    ray.get(actors[1].info.remote(), timeout=30)["incarnation"]
                    != info["incarnation"]
                ):
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            assert time.monotonic() < deadline, "the shard actor did not come back"
            await asyncio.sleep(0.2)
        assert old.broken  # the connection went with the process
        with pytest.raises(UnavailableError, match="awaits load"):  # a new one; the shard is empty
            await via_channel.apply(rounds[0], 9.0)
        assert await via_channel.load(subs, 10.0, tags) == len(subs)
        answer = await via_channel.apply(rounds[0][:1], 11.0)
        assert answer[1] == [len(answer[2])] and len(answer[2]) > 0
        await via_channel.close()

    asyncio.run(main())
    for a in actors:
        ray.kill(a)


@pytest.mark.ray
def test_a_shard_whose_port_cannot_be_reached_gets_ray_calls_and_is_retried(
    ray_session, monkeypatch
):
    """A network that lets Ray through but not the channel's port (simulated: connecting fails)
    costs speed, not rounds: they go as Ray calls, and the channel is tried again later."""
    ray = ray_session
    real_open = Channel.open

    async def firewalled(address, token, name):
        raise UnavailableError(f"{name} unreachable at {address}: [Errno 113] No route to host")

    monkeypatch.setattr(shards_mod.Channel, "open", firewalled)
    actor = make_shard_actor(0, {"theta_p": 4})
    shard = RayShard(0, actor)
    pub = [("pub", Message("m", ("x",), Point(0.5, 0.5)))]

    async def main():
        assert await shard.load([Subscription("s", (("x",),), Rect(0, 0, 1, 1))], 0.0, [7]) == 1
        for now in (1.0, 2.0):  # answered, as Ray calls
            assert list((await shard.apply(pub, now))[2]) == [7]
        assert shard._channel.result() is None
        monkeypatch.setattr(shards_mod.Channel, "open", real_open)
        assert list((await shard.apply(pub, 3.0))[2]) == [7]  # not retried yet
        assert shard._channel.result() is None
        shard._retry_at = 0.0  # the retry time has come
        assert list((await shard.apply(pub, 4.0))[2]) == [7]
        assert shard._channel.result() is not None and not shard._channel.result().broken
        await shard.close()

    asyncio.run(main())
    ray.kill(actor)


class _Payload:
    """A pickle that would create ``path`` when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.mark.ray
def test_a_pickle_sent_to_a_shard_actor_is_refused_unrun(ray_session, tmp_path):
    """Whoever holds the token gets no code run: the shard takes ``shard.wire`` rounds only."""
    ray = ray_session
    actor = make_shard_actor(0, {"theta_p": 4})
    ray.get(actor.load_rows.remote([], 0.0))
    host, port, token = ray.get(actor.channel.remote())
    marker = tmp_path / "unpickled"
    sock = _raw_login((host, port), token)
    for evil in (pickle.dumps(_Payload(str(marker))), pickle.dumps([("pub", _Payload("x"))])):
        sock.sendall(struct.pack("!Id", len(evil), 1.0) + evil)
        status, n = struct.unpack("!BI", _recv(sock, 5))
        text = _recv(sock, n).decode()
        assert status == channel_mod.FAILED and "ValidationError" in text, text
    assert not marker.exists()
    good = dumps_ops([("pub", Message("m", ("x",), Point(0.5, 0.5)))])
    sock.sendall(struct.pack("!Id", len(good), 2.0) + good)  # the same connection still serves
    status, n = struct.unpack("!BI", _recv(sock, 5))
    assert status == channel_mod.OK
    assert loads_result(_recv(sock, n))[1] == [0]
    sock.close()
    ray.kill(actor)
