"""An external Redis reached over TLS (``rediss://``) with a password, and a cluster secured end
to end: a real redis-server that serves TLS only, ``geopubsub up --tls auto --auth on`` on it,
tokens made in it, the Spark loader writing to it and the Reload over TLS with an admin's token,
then ``bench e2e --target`` with ``--ca`` and ``--token``, whose deliveries must equal the
in-process reference."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest
import redis

from deploy import local
from deploy.processes import free_port
from deploy.redis_local import find_redis_server
from deploy.tls import local_tls
from geopubsub.tools.gen import generate
from tests.cli import run_geopubsub

pytestmark = pytest.mark.redis


class TlsRedis:
    """A redis-server that listens for TLS only (no plaintext port), with a password."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files = local_tls(self.dir / "tls", ["127.0.0.1", "localhost"])
        self.password = secrets.token_urlsafe(24)
        self.port = free_port()
        conf = self.dir / "redis.conf"
        conf.write_text(
            "\n".join(
                [
                    "bind 127.0.0.1",
                    "port 0",
                    f"tls-port {self.port}",
                    f"tls-cert-file {self.files.cert}",
                    f"tls-key-file {self.files.key}",
                    f"tls-ca-cert-file {self.files.ca}",
                    "tls-auth-clients no",
                    f"requirepass {self.password}",
                    f"dir {self.dir}",
                    'save ""',
                    "appendonly no",
                    f"logfile {self.dir / 'redis.log'}",
                ]
            )
            + "\n"
        )
        os.chmod(conf, 0o600)
        self.proc = subprocess.Popen([find_redis_server(), str(conf)])
        self.url = f"rediss://:{self.password}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.files.ca}"
        client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)
        for _ in range(100):
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.dir / "redis.log").read_text()) from None
                time.sleep(0.1)
        else:
            raise RuntimeError("TLS redis-server did not answer")
        client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _geopubsub(*argv: str, env: dict, timeout: float = 300):
    return run_geopubsub(*argv, env=env, timeout=timeout)  # a cluster start, a Spark job


@pytest.fixture
def tls_redis(tmp_path):
    server = TlsRedis(tmp_path / "redis-tls")
    yield server
    server.stop()


def test_the_tls_redis_refuses_plaintext_and_a_wrong_ca(tls_redis, tmp_path):
    plain = redis.Redis(host="127.0.0.1", port=tls_redis.port, password=tls_redis.password,
                        socket_timeout=2, socket_connect_timeout=2)  # fmt: skip
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    other = local_tls(tmp_path / "other-ca", ["127.0.0.1"])
    wrong = tls_redis.url.replace(str(tls_redis.files.ca), str(other.ca))
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(wrong, socket_timeout=2, socket_connect_timeout=2).ping()


@pytest.mark.slow
def test_a_secured_cluster_on_a_tls_redis_loads_and_serves(tls_redis, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOPUBSUB_")}
    where = ["--data-dir", str(tmp_path / "cluster")]
    generate(1500, 400, tmp_path, seed=5, moving_share=0.2, region_msg_share=0.1)
    up = _geopubsub(
        "up", "--detach", "--port", "0", "--redis-url", tls_redis.url, "--tls", "auto",
        "--auth", "on", *where, env=env,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert tls_redis.password not in up.stdout + up.stderr
        manifest = local.read_manifest(tmp_path / "cluster")
        target, ca = manifest["coordinator"]["target"], manifest["coordinator"]["tls"]["ca"]
        made = _geopubsub("token", "create", "--role", "admin", *where, env=env)
        assert made.returncode == 0, made.stderr
        admin = made.stdout.strip()
        raw = redis.Redis.from_url(tls_redis.url)
        assert raw.hlen("gps:tokens") == 1  # kept in the TLS Redis, hashed
        assert admin.split(".")[1] not in raw.hget("gps:tokens", admin[5:17]).decode()

        load = _geopubsub(
            "load", str(tmp_path / "subs.jsonl"), "--coordinator", target, *where,
            env=env | {"GEOPUBSUB_TOKEN": admin},
        )  # fmt: skip
        assert load.returncode == 0, load.stdout[-3000:] + load.stderr[-3000:]
        assert "loaded 1,500 subscriptions" in load.stdout, load.stdout
        assert f"the coordinator at {target} reloaded its shards" in load.stdout
        assert raw.scard("gps:subs") == 1500

        # a client elsewhere: the CA and the token given as flags, nothing from cluster.json
        bench = _geopubsub(
            "bench", "e2e", "--target", target, "--ca", ca, "--token", admin,
            "--no-register", "--subs", str(tmp_path / "subs.jsonl"),
            "--msgs", str(tmp_path / "msgs.jsonl"), "--data-dir", str(tmp_path / "elsewhere"),
            "--duration", "2", "--rate", "300", "--latency-duration", "2",
            "--moves-duration", "2", "--live", "100", "--json", env=env, timeout=600,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr[-4000:]
        report = json.loads(bench.stdout.strip().splitlines()[-1])
        for phase in ("a", "b"):
            assert report[phase]["matched"] > 0 and report[phase]["matched_equal"], report[phase]
        refused = _geopubsub(
            "bench", "e2e", "--target", target, "--ca", ca, "--no-register",
            "--subs", str(tmp_path / "subs.jsonl"), "--msgs", str(tmp_path / "msgs.jsonl"),
            "--data-dir", str(tmp_path / "elsewhere"), "--no-reference", "--duration", "1",
            env=env, timeout=300,
        )  # fmt: skip
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
        log = (tmp_path / "cluster" / "coordinator.log").read_text()
        assert tls_redis.password not in log and admin not in log
        raw.close()
    finally:
        down = _geopubsub("down", *where, env=env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert redis.Redis.from_url(tls_redis.url).ping()  # an external Redis is left running
