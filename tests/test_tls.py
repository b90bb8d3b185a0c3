"""TLS on the gRPC API: the local CA and certificates (``deploy.tls``), the
coordinator over TLS and mutual TLS with a real redis-server and real gRPC clients (a client
without the CA, with another CA, or without its certificate under mutual TLS is refused), and
``geopubsub up --tls auto`` end to end with the real coordinator."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import grpc
import pytest
from cryptography import x509

from coordinator.server import create_server, stop_server
from coordinator.settings import Settings
from coordinator.shards import LocalShard
from deploy import local
from deploy.tls import client_certificate, local_tls
from geopubsub.client import GeoPubSubClient, Tls, open_channel
from geopubsub.convert import to_proto_subscription
from geopubsub.v1 import geopubsub_pb2 as pb
from geopubsub.v1 import geopubsub_pb2_grpc as pb_grpc
from shard.errors import ValidationError
from shard.model import Rect, Subscription


def test_the_local_ca_is_kept_and_the_server_certificate_follows_its_hosts(tmp_path):
    first = local_tls(tmp_path / "tls", ["localhost", "127.0.0.1"])
    for key in (first.key, tmp_path / "tls" / "ca.key"):
        assert key.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in names] == ["localhost", "127.0.0.1"]
    ca_pem, cert_pem = first.ca.read_bytes(), first.cert.read_bytes()
    again = local_tls(tmp_path / "tls", ["localhost", "127.0.0.1"])
    assert (again.ca.read_bytes(), again.cert.read_bytes()) == (ca_pem, cert_pem)  # kept
    moved = local_tls(tmp_path / "tls", ["localhost", "127.0.0.1", "10.1.2.3"])
    assert moved.ca.read_bytes() == ca_pem and moved.cert.read_bytes() != cert_pem


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"tls": "manual"}, "tls"),
        ({"tls_cert": "c.pem"}, "tls_key"),
        ({"tls_key": "k.pem"}, "tls_cert"),
        ({"tls": "auto", "tls_cert": "c.pem", "tls_key": "k.pem"}, "tls_cert"),
        ({"tls_client_ca": "ca.pem"}, "tls_client_ca"),
        ({"client_cert": "c.pem"}, "client_key"),
    ],
)
def test_tls_settings_that_do_not_fit_are_named(flags, field):
    with pytest.raises(ValidationError) as info:
        Settings.load(flags=flags)
    assert info.value.field == field


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.org"])
def test_a_non_loopback_bind_needs_tls_or_insecure(host):
    with pytest.raises(ValidationError) as info:
        Settings.load(flags={"host": host})
    assert info.value.field == "host" and "insecure = true" in str(info.value)
    assert Settings.load(flags={"host": host, "insecure": True}).host == host
    assert Settings.load(flags={"host": host, "tls": "auto"}).tls_on
    assert Settings.load(env={"GEOPUBSUB_HOST": host, "GEOPUBSUB_INSECURE": "true"}).insecure
    with pytest.raises(ValidationError, match="host"):  # "false" is false
        Settings.load(env={"GEOPUBSUB_HOST": host, "GEOPUBSUB_INSECURE": "false"})
    with pytest.raises(ValidationError, match="GEOPUBSUB_INSECURE"):
        Settings.load(env={"GEOPUBSUB_INSECURE": "maybe"})
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert Settings.load(flags={"host": loopback}).host == loopback


def test_unreadable_tls_files_are_named(tmp_path, redis_url):
    s = Settings.load(
        flags={
            "port": 0,
            "redis_url": redis_url,
            "tls_cert": str(tmp_path / "missing.pem"),
            "tls_key": str(tmp_path / "missing.key"),
        }
    )
    with pytest.raises(ValidationError) as info:
        asyncio.run(create_server(s, lambda k: LocalShard(k)))
    assert info.value.field == "tls_key" and "cannot be read" in str(info.value)


async def _subscribe(target: str, tls: Tls | None, sid: str) -> grpc.StatusCode:
    """OK, or the code a Subscribe over this client's channel failed with."""
    sub = Subscription(sid, (("x",),), Rect(0, 0, 1, 1))
    async with open_channel(target, tls, aio=True) as ch:
        try:
            await pb_grpc.GeoPubSubStub(ch).Subscribe(
                pb.SubscribeRequest(subscription=to_proto_subscription(sub)), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_tls_and_mutual_tls_refuse_who_does_not_hold_the_right_keys(tmp_path, redis_url):
    files = local_tls(tmp_path / "server", ["localhost", "127.0.0.1"])
    other = local_tls(tmp_path / "other", ["localhost", "127.0.0.1"])  # another CA
    clients = local_tls(tmp_path / "clients", ["clients"])
    cert, key = client_certificate(tmp_path / "clients", "alice")
    stranger_cert, stranger_key = client_certificate(tmp_path / "other", "mallory")

    async def main():
        base = {"port": 0, "redis_url": redis_url, "namespace": uuid.uuid4().hex}
        tls = {"tls_cert": str(files.cert), "tls_key": str(files.key)}
        server, port, app = await create_server(
            Settings.load(flags=base | tls), lambda k: LocalShard(k)
        )
        target = f"127.0.0.1:{port}"
        try:
            assert await _subscribe(target, Tls(str(files.ca)), "a") == grpc.StatusCode.OK
            assert await _subscribe(target, None, "b") == grpc.StatusCode.UNAVAILABLE
            assert await _subscribe(target, Tls(str(other.ca)), "c") == grpc.StatusCode.UNAVAILABLE
            assert "b" not in app.engine.subs and "c" not in app.engine.subs
        finally:
            await stop_server(server, app)

        mutual = tls | {"tls_client_ca": str(clients.ca)}
        server, port, app = await create_server(
            Settings.load(flags=base | mutual), lambda k: LocalShard(k)
        )
        target = f"127.0.0.1:{port}"
        try:
            alice = Tls(str(files.ca), str(cert), str(key))
            assert await _subscribe(target, alice, "d") == grpc.StatusCode.OK
            assert await _subscribe(target, Tls(str(files.ca)), "e") == grpc.StatusCode.UNAVAILABLE
            mallory = Tls(str(files.ca), str(stranger_cert), str(stranger_key))
            assert await _subscribe(target, mallory, "f") == grpc.StatusCode.UNAVAILABLE
            assert set(app.engine.subs) >= {"a", "d"} and not {"e", "f"} & set(app.engine.subs)
        finally:
            await stop_server(server, app)

    asyncio.run(main())


def test_a_certificate_for_another_name_is_verified_against_that_name(tmp_path, redis_url):
    """A server certificate for geo.example.org reached at 127.0.0.1: the client says which name
    to verify (``Tls.server_name``); the launcher finds it in the certificate itself."""
    files = local_tls(tmp_path / "named", ["geo.example.org"])
    flags = {"port": 0, "redis_url": redis_url, "namespace": uuid.uuid4().hex}
    flags |= {"tls_cert": str(files.cert), "tls_key": str(files.key)}
    settings = Settings.load(flags=flags)
    assert local._launcher_tls(settings, str(files.ca)).server_name == "geo.example.org"

    async def main():
        server, port, app = await create_server(settings, lambda k: LocalShard(k))
        target = f"127.0.0.1:{port}"
        try:
            named = Tls(str(files.ca), server_name="geo.example.org")
            assert await _subscribe(target, named, "n1") == grpc.StatusCode.OK
            assert await _subscribe(target, Tls(str(files.ca)), "n2") == grpc.StatusCode.UNAVAILABLE
            wrong = Tls(str(files.ca), server_name="other.example.org")
            assert await _subscribe(target, wrong, "n3") == grpc.StatusCode.UNAVAILABLE
        finally:
            await stop_server(server, app)

    asyncio.run(main())


def test_up_with_tls_auto_serves_tls_to_the_cli_and_refuses_plaintext(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOPUBSUB_")}
    where = ["--data-dir", str(tmp_path)]

    def geopubsub(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "geopubsub.tools.cli", *argv, *where],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    refused = geopubsub("up", "--tls", "auto", "--tls-client-ca", str(tmp_path / "x.pem"))
    assert refused.returncode == 2 and "client_cert" in refused.stderr, refused.stderr
    exposed = geopubsub("up", "--host", "0.0.0.0")
    assert exposed.returncode == 2 and "host='0.0.0.0'" in exposed.stderr, exposed.stderr

    up = geopubsub("up", "--detach", "--tls", "auto", "--port", "0", timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        ca = tmp_path / "tls" / "ca.pem"
        assert f"TLS on; clients trust {ca}" in up.stdout
        assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
        target = local.read_manifest(tmp_path)["coordinator"]["target"]
        sub = geopubsub(
            "subscribe", "--id", "s1", "--keywords", "ipad", "--rect", "0", "0", "5", "5"
        )
        assert sub.returncode == 0, sub.stderr
        pub = geopubsub("publish", "--keywords", "ipad", "--point", "1", "1", "--id", "m1")
        assert (pub.returncode, pub.stdout) == (0, "published m1: 1 matched\n"), pub.stderr
        status = geopubsub("status")
        assert status.returncode == 0 and f"{target}: SERVING (TLS)" in status.stdout
        # a client of another data dir gives the CA itself; without it, nothing is served
        other = ["--data-dir", str(tmp_path / "elsewhere"), "--target", target]
        got = subprocess.run(
            [sys.executable, "-m", "geopubsub.tools.cli", "stats", *other, "--ca", str(ca)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert got.returncode == 0, got.stderr
        with GeoPubSubClient(target, timeout_s=5) as plain:
            with pytest.raises(grpc.RpcError) as info:
                plain.get_subscription("s1")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        down = geopubsub("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
