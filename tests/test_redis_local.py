"""The private redis-server of the local cluster, with the real binary (``make setup`` installs it;
without it these tests fail rather than skip)."""

from __future__ import annotations

import shutil
import socket

import pytest
import redis

from deploy import redis_local
from deploy.processes import alive
from deploy.redis_local import RedisServer, load_or_create_password, ping, stop_redis
from shard.errors import UnavailableError
from shard.metadata_codec import redacted

pytestmark = pytest.mark.redis


def test_redis_server_is_installed():
    assert shutil.which("redis-server"), "redis-server missing: run `make setup`"
    assert redis_local.find_redis_server() == shutil.which("redis-server")


def test_start_answers_ping_with_the_configuration_and_stop_ends_it(tmp_path):
    server = RedisServer(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        config = client.config_get("*")
        client.close()
        assert config["appendonly"] == "yes"
        assert config["bind"] == "127.0.0.1"
        assert config["save"] == ""
        assert (config["maxmemory"], config["maxmemory-policy"]) == ("0", "noeviction")
        assert config["dir"] == str((tmp_path / "redis").resolve())
        assert int(config["port"]) == server.port != 0
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert "Ready to accept connections" in server.log_path.read_text()
        pid, port, process = server.pid, server.port, server.process
    finally:
        clean = server.stop()
    assert clean
    assert process.poll() is not None
    assert not alive(pid)
    assert not ping(port)
    assert "User requested shutdown" in (tmp_path / "redis" / "redis.log").read_text()


def test_maxmemory_caps_the_server_and_writes_past_it_are_refused(tmp_path):
    with RedisServer(tmp_path, maxmemory_mb=2) as server:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("maxmemory")["maxmemory"] == str(2 * 2**20)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(64):  # 4 MB
                client.set(f"k{i}", b"x" * 65536)
        assert client.dbsize() < 32  # nothing was evicted to make room: writes were refused
        assert client.get("k0") == b"x" * 65536
        client.close()


def test_data_survives_a_restart(tmp_path):
    with RedisServer(tmp_path) as first:
        client = redis.Redis.from_url(first.url)
        client.hset("gps:sub:s1", mapping={"expr": "ipad AND sale", "shard": "1"})
        client.xadd("gps:log:s1", {"seq": "1"})
        client.close()
    assert (tmp_path / "redis" / "appendonlydir").is_dir()
    with RedisServer(tmp_path) as second:
        client = redis.Redis.from_url(second.url, decode_responses=True)
        assert client.hgetall("gps:sub:s1") == {"expr": "ipad AND sale", "shard": "1"}
        assert client.xlen("gps:log:s1") == 1
        client.close()


def test_stop_redis_by_pid_as_down_does(tmp_path):
    server = RedisServer(tmp_path).start()
    pid, port, started = server.pid, server.port, server.started
    assert started is not None
    try:
        assert stop_redis(pid, port, started=started)  # no Popen: another process started it
        assert not ping(port)
        assert not alive(pid)
    finally:
        server.process.wait(timeout=5)  # already reaped by stop_redis's waitpid


def test_a_reused_pid_is_not_signalled(tmp_path):
    with RedisServer(tmp_path) as server:
        assert stop_redis(server.pid, server.port, started=server.started + 1)
        assert ping(server.port)  # the start time did not match: left alone


def test_missing_binary_says_to_run_make_setup(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UnavailableError, match="make setup"):
        RedisServer(tmp_path).start()


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    server = RedisServer(tmp_path, extra_args=["--maxmemory", "lots"])
    with pytest.raises(UnavailableError) as info:
        server.start()
    message = str(info.value)
    assert "exited with code 1" in message
    assert "FATAL CONFIG FILE ERROR" in message
    assert "argument must be a memory value" in message


def test_a_port_in_use_is_reported(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UnavailableError, match="Address already in use"):
            RedisServer(tmp_path, port=port).start(timeout_s=10)


def test_a_password_is_made_once_kept_private_and_required(tmp_path):
    password = load_or_create_password(tmp_path)
    assert load_or_create_password(tmp_path) == password and len(password) >= 40
    assert (tmp_path / "redis" / "password").stat().st_mode & 0o777 == 0o600
    server = RedisServer(tmp_path, password=password).start()
    try:
        assert (tmp_path / "redis" / "redis.conf").stat().st_mode & 0o777 == 0o600
        with open(f"/proc/{server.pid}/cmdline", "rb") as f:
            assert password.encode() not in f.read()  # not in `ps` for every local user
        assert server.url == f"redis://:{password}@127.0.0.1:{server.port}/0"
        assert not ping(server.port) and ping(server.port, password=password)
        stranger = redis.Redis(host="127.0.0.1", port=server.port)
        with pytest.raises(redis.AuthenticationError):
            stranger.set("k", "v")
        stranger.close()
        client = redis.Redis.from_url(server.url)
        assert client.set("k", "v")
        client.close()
    finally:
        pid = server.pid
        assert server.stop()
    assert not alive(pid)
    assert "User requested shutdown" in server.log_path.read_text()  # SHUTDOWN, after AUTH
    with RedisServer(tmp_path, password=load_or_create_password(tmp_path)) as again:
        client = redis.Redis.from_url(again.url)
        assert client.get("k") == b"v"
        client.close()


def test_a_redis_url_is_shown_without_its_password():
    assert redacted("redis://:s3cret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert redacted("rediss://app:s3cret@db:6380/2") == "rediss://app:***@db:6380/2"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
