"""A private ``redis-server`` process for the local cluster (``geopubsub up`` without a Redis URL).

It listens on 127.0.0.1 only, on a port of its own, and keeps its data under ``<data_dir>/redis/``
with the append-only file on, so that the subscriptions the coordinator stored survive a restart of
the cluster (RDB snapshots are off: the AOF is the persistence, and background saves would compete
with the shards for this machine's two cores; the AOF is rewritten only when it has grown
``AOF_REWRITE_PERCENTAGE`` % past its last rewrite, and a rewrite is made cheap:
``HASH_LISTPACK_VALUE``, ``RDB_COMPRESSION``). ``SHUTDOWN`` flushes and fsyncs the AOF; a killed
server loses at most the last second of writes (``appendfsync everysec``). Its memory is capped at
``maxmemory_mb`` with the ``noeviction`` policy: past it Redis refuses writes (the coordinator
answers RESOURCE_EXHAUSTED) instead of evicting subscriptions or growing until the machine swaps.

With a ``password`` (``geopubsub up`` always gives one: ``load_or_create_password``) it takes no
command before AUTH; the password goes to redis-server in a configuration file of mode 0600
under its directory, never on its command line (which every local user can read in ``ps``).

::

    with RedisServer(".geopubsub") as redis_server:  # PING answered
        redis_server.url  # 'redis://127.0.0.1:<port>/0'
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from deploy.processes import alive, free_port, log_tail, start_time, stop_process, wait_gone
from shard.errors import UnavailableError

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 60.0
"""Longest wait for the first PING answer; loading a large AOF (1M subscriptions and the delivery
retention) takes seconds, during which Redis answers LOADING."""
AOF_REWRITE_PERCENTAGE = 400
"""Rewrite the AOF once it is 5x its size after the last rewrite (Redis: 2x). The durable
retention log writes ~10 MB/s of AOF at 90,000 deliveries/s; at 2x a 300 MB dataset was rewritten
(a forked child busy ~10 s) about every 35 s, a quarter of one of the two cores."""
HASH_LISTPACK_VALUE = 1024
"""``hash-max-listpack-value`` (Redis: 64). A subscription's hash holds its JSON (~80-200 bytes),
which at Redis's default makes every one of them a hash table: 472 bytes a subscription, and an
AOF rewrite serializes it field by field. Kept as a listpack it takes 264 bytes and is written as
one string: the 1M subscriptions of the soak take 355 MB of Redis instead of 611 MB, and a rewrite
of them 1.8 s of CPU instead of 2.9 s (docs/RELIABILITY.md)."""
RDB_COMPRESSION = "no"
"""``rdbcompression`` (Redis: yes): the AOF rewrite (an RDB preamble) does not LZF-compress
strings. On this 2-core machine a rewrite's CPU is taken from the shards and the coordinator
(docs/RELIABILITY.md); uncompressed, rewriting the 1M subscriptions takes 1.1 s of CPU instead of
1.8 s, for a base file 7 % larger."""
STOP_TIMEOUT_S = 30.0
"""Longest wait for SHUTDOWN (AOF flush) before SIGTERM, then SIGKILL."""
PORT_ATTEMPTS = 3
"""Starts tried on fresh free ports when another process grabbed the chosen one first."""
LOG_NAME = "redis.log"
PASSWORD_FILE = "password"
"""Under the private Redis's directory, mode 0600: made once, kept across restarts."""
CONFIG_NAME = "redis.conf"
"""Written at every start, mode 0600: the password (options on the command line follow it)."""


def find_redis_server() -> str:
    """The path of the ``redis-server`` binary; UnavailableError when it is not installed."""
    path = shutil.which("redis-server")
    if path is None:
        raise UnavailableError(
            "redis-server not found on PATH: run `make setup` (it installs the Debian package "
            "redis-server), or give --redis-url of a running Redis"
        )
    return path


def redis_dir(data_dir: str | Path) -> Path:
    """Where the private Redis keeps its AOF and log: ``<data_dir>/redis``."""
    return Path(data_dir) / "redis"


def _write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by its owner only from the first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # (an older file keeps its mode through O_CREAT)
        f.write(text)


def load_or_create_password(data_dir: str | Path) -> str:
    """The private Redis's password, kept in ``<data_dir>/redis/password`` (mode 0600): made at
    the first start (32 random bytes, URL-safe), the same ever after."""
    path = redis_dir(data_dir) / PASSWORD_FILE
    try:
        password = path.read_text().strip()
        if password:
            return password
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(32)
    _write_private(path, password + "\n")
    return password


def _client(port: int, timeout_s: float, password: str | None = None) -> redis.Redis:
    return redis.Redis(
        host=HOST,
        port=port,
        password=password,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, 2.0),
        retry=Retry(NoBackoff(), 0),
    )


def ping(port: int, *, timeout_s: float = 1.0, password: str | None = None) -> bool:
    """Whether a Redis on 127.0.0.1:``port`` answers PING (False while it is still loading, or
    when it wants another password)."""
    client = _client(port, timeout_s, password)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisServer:
    """A ``redis-server`` child process with its data in ``<data_dir>/redis/``.

    ``start()`` returns once PING answers; ``stop()`` sends SHUTDOWN (flushing the AOF), then
    SIGTERM, then SIGKILL. ``port=0`` picks a free port. ``maxmemory_mb`` caps its memory
    (policy ``noeviction``: writes past it are refused; 0: unlimited). ``extra_args`` are appended
    to the command line (``["--hz", "20"]``). ``password``: every client must AUTH with it.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int = 0,
        binary: str | None = None,
        maxmemory_mb: int = 0,
        extra_args: Sequence[str] = (),
        password: str | None = None,
    ) -> None:
        self.dir = redis_dir(data_dir).resolve()
        self.password = password
        self.log_path = self.dir / LOG_NAME
        self.port = port
        self.binary = binary
        self.maxmemory_mb = maxmemory_mb
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen | None = None
        self.started: int | None = None
        """The process's start time (``deploy.processes.start_time``), its identity with the pid."""

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("redis-server is not started")
        return self.process.pid

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    def command(self, binary: str, port: int) -> list[str]:
        config: list[str] = []
        if self.password:
            path = self.dir / CONFIG_NAME
            quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
            _write_private(path, f'requirepass "{quoted}"\n')
            config = [str(path)]
        return [
            binary,
            *config,
            "--port", str(port),
            "--bind", HOST,
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--auto-aof-rewrite-percentage", str(AOF_REWRITE_PERCENTAGE),
            "--hash-max-listpack-value", str(HASH_LISTPACK_VALUE),
            "--rdbcompression", RDB_COMPRESSION,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            "--maxmemory", f"{self.maxmemory_mb}mb",
            "--maxmemory-policy", "noeviction",
            *self.extra_args,  # (later options win: a restart passes them all again)
        ]  # fmt: skip

    def start(self, *, timeout_s: float = STARTUP_TIMEOUT_S) -> RedisServer:
        """Start the server and wait until it answers PING. Raises UnavailableError (with the tail
        of the server's log) when it exits or does not answer within ``timeout_s``."""
        if self.process is not None:
            raise RuntimeError("redis-server already started")
        binary = self.binary or find_redis_server()
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(PORT_ATTEMPTS):
            port = self.port or free_port(HOST)
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            # Messages printed before the log file is open (a bad option) go to the log as well.
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(binary, port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # Ctrl-C reaches the launcher, which stops us in order
                )
            self.started = start_time(self.process.pid)
            try:
                self._wait_ready(port, timeout_s, offset)
            except UnavailableError:
                tail = log_tail(self.log_path, start=offset)
                retry = not self.port and "Address already in use" in tail
                if retry and attempt + 1 < PORT_ATTEMPTS:
                    self.process = None
                    continue
                raise
            self.port = port
            return self
        raise AssertionError("unreachable")

    def _wait_ready(self, port: int, timeout_s: float, offset: int) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not ping(port, timeout_s=1.0, password=self.password):
            code = self.process.poll()
            if code is not None or time.monotonic() >= deadline:
                if code is None:
                    stop_process(self.process.pid, popen=self.process, grace_s=2.0)
                why = (
                    f"exited with code {code}"
                    if code is not None
                    else f"no PING answer in {timeout_s:g} s"
                )
                raise UnavailableError(
                    f"redis-server on {HOST}:{port} {why}; log {self.log_path}:\n"
                    + log_tail(self.log_path, start=offset)
                )
            time.sleep(0.05)

    def stop(self, *, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Shut the server down (AOF flushed); True if it exited without SIGKILL."""
        if self.process is None:
            return True
        clean = stop_redis(
            self.process.pid,
            self.port,
            timeout_s=timeout_s,
            popen=self.process,
            password=self.password,
        )
        self.process = None
        return clean

    def __enter__(self) -> RedisServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_redis(
    pid: int,
    port: int,
    *,
    timeout_s: float = STOP_TIMEOUT_S,
    started: int | None = None,
    popen: subprocess.Popen | None = None,
    password: str | None = None,
) -> bool:
    """Stop a private redis-server, also one another process started (``geopubsub down``):
    SHUTDOWN, wait, then SIGTERM (also a clean shutdown for Redis) and SIGKILL. A pid that is gone
    or was reused (its start time differs from ``started``) is left alone. True if it exited
    without SIGKILL."""
    if not alive(pid, started=started, popen=popen):
        return True
    if ping(port, timeout_s=2.0, password=password):
        client = _client(port, timeout_s, password)
        try:
            client.shutdown()  # returns once the connection closes: the server is exiting
        except redis.RedisError:
            pass  # SHUTDOWN refused: the signals below take over
        finally:
            client.close()
        if wait_gone(pid, timeout_s, started=started, popen=popen):
            return True
    return stop_process(pid, grace_s=timeout_s, started=started, popen=popen)
