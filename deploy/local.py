"""The one-command local cluster behind ``geopubsub up`` / ``down`` / ``status`` (``up`` itself,
``start`` here and then supervision, is ``deploy.supervise.up``).

``up`` starts a private redis-server (``deploy.redis_local``; unless ``settings.redis_url`` names a
Redis), then the coordinator as a child process ``python -m coordinator`` with the resolved
settings, and waits until the coordinator prints its listening line and its grpc.health.v1 check
answers SERVING. The coordinator starts the shards on a local Ray itself (``ray.init``) or joins
``settings.ray_address``. In the foreground the cluster runs until Ctrl-C (or SIGTERM), then the
launcher stops the coordinator (SIGINT, which makes it stop serving and call ``ray.shutdown``),
whatever is left of its local Ray, and Redis. With ``detach`` it returns once SERVING, leaving
``<data_dir>/cluster.json`` for ``down`` and ``status``.

Both are supervised (``deploy.supervise``): a private Redis or a coordinator that dies is started
again, with back-off, until ``restart_max`` crashes within ``restart_window_s``. In the foreground
the launcher itself supervises; ``up --detach`` leaves a small supervisor process behind
(``python -m deploy.supervise``, its pid in ``cluster.json``), which ``down`` stops first.

Files under ``data_dir`` (default ``.geopubsub/``)::

    cluster.json        pids (with start times), address, Redis URL of the running cluster,
                        restarts, the supervisor's pid (detached)
    coordinator.toml    the settings handed to the coordinator (all of them, resolved)
    coordinator.log     the coordinator's stdout and stderr (and Ray's driver output)
    supervisor.log      what the detached supervisor saw and did (a foreground launcher prints it)
    redis/              the private Redis: appendonlydir/ (its data), redis.log

Every process the launcher starts runs in a session of its own, so that Ctrl-C in the terminal
reaches only the launcher, which stops them in order (coordinator before Redis). The local Ray's
processes (gcs_server, raylet, workers) belong to the coordinator's session: ``down`` stops any of
them still alive after the coordinator exits (normally none: ``ray.shutdown`` stopped them, and
Ray ties them to the coordinator's life), and never touches a Ray cluster joined by address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import grpc
import redis

from coordinator.health import REDIS_HEALTH, shard_health_name
from coordinator.settings import ENV_PREFIX, Settings
from deploy.processes import (
    AdoptedProcess,
    alive,
    log_tail,
    start_time,
    stop_process,
    stop_session,
)
from deploy.redis_local import RedisServer, load_or_create_password, stop_redis
from deploy.tls import certificate_names, default_hosts, local_tls
from geopubsub.client import GeoPubSubClient, Tls, describe_stats
from shard.errors import GeoPubSubError, UnavailableError, ValidationError
from shard.metadata_codec import redacted
from shard.partition_map import MAX_PARTS

CLUSTER_FILE = "cluster.json"
CONFIG_FILE = "coordinator.toml"
COORDINATOR_LOG = "coordinator.log"
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_STOP_S = 90.0
"""Grace for the supervisor to finish a restart under way when ``down`` stops it (a Redis
loading its AOF takes up to ``redis_local.STARTUP_TIMEOUT_S``)."""
READY_TIMEOUT_S = 360.0
"""Longest ``up`` waits for SERVING: Ray's start plus the rebuild of every shard from Redis, and
on a fresh checkout the shard actors' first compile (``coordinator.shards.ACTOR_START_S``, 300 s,
and a minute more)."""
COORDINATOR_STOP_S = 30.0
"""Grace after SIGINT for the coordinator to drain, snapshot and shut Ray down."""
LISTENING = re.compile(r"geopubsub coordinator listening on (\S+):(\d+)\s*$", re.MULTILINE)
"""The line the coordinator prints to stdout once it serves."""
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
STOPPED = {0, -signal.SIGINT, -signal.SIGTERM}
"""Coordinator exit codes of a requested stop."""


class ClusterError(GeoPubSubError):
    """The local cluster cannot be started or is in the way (already running)."""


def coordinator_command() -> list[str]:
    return [sys.executable, "-m", "coordinator"]


def client_target(host: str, port: int) -> str:
    """The address a client on this machine dials for a server bound to ``host``:``port``."""
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


# ---- cluster.json ----------------------------------------------------------------------------
def manifest_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / CLUSTER_FILE


def read_manifest(data_dir: str | Path) -> dict[str, Any] | None:
    """The ``cluster.json`` of ``data_dir``, None when there is none."""
    path = manifest_path(data_dir)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{path}: unreadable ({exc}); remove it if no cluster runs") from None


def _write_manifest(data_dir: Path, manifest: dict[str, Any]) -> None:
    _write_private(manifest_path(data_dir), json.dumps(manifest, indent=2) + "\n")


def manifest_target(data_dir: str | Path) -> str | None:
    """The coordinator address recorded in ``<data_dir>/cluster.json``, if any."""
    manifest = read_manifest(data_dir)
    return manifest["coordinator"]["target"] if manifest else None


def manifest_tls(data_dir: str | Path) -> Tls | None:
    """How the launcher reaches the coordinator recorded in ``<data_dir>/cluster.json`` (the CA
    ``tls = "auto"`` made, the client certificate given for mutual TLS); None: plaintext."""
    manifest = read_manifest(data_dir)
    return _tls_of(manifest["coordinator"]) if manifest else None


def _tls_of(coord: dict[str, Any]) -> Tls | None:
    tls = coord.get("tls")
    if not tls:
        return None
    return Tls(tls.get("ca"), tls.get("cert"), tls.get("key"), tls.get("server_name"))


def _launcher_tls(settings: Settings, ca: str | None) -> Tls | None:
    """The TLS a launcher's own health checks use (None: the coordinator serves plaintext)."""
    if not settings.tls_on:
        return None
    if settings.tls_client_ca and not settings.client_cert:
        raise ValidationError(
            "client_cert",
            settings.client_cert,
            "needed with tls_client_ca: the launcher checks the coordinator's health as a client",
        )
    server_name = None
    if settings.tls_cert:  # the launcher dials 127.0.0.1: verify the name the certificate has
        names = certificate_names(settings.tls_cert)
        if names and not {"127.0.0.1", "localhost"} & set(names):
            server_name = names[0]
    return Tls(
        ca or settings.ca or None,
        settings.client_cert or None,
        settings.client_key or None,
        server_name,
    )


def _running(manifest: dict[str, Any]) -> list[str]:
    """The recorded processes still alive, as ``name pid``."""
    out = []
    for name in ("supervisor", "coordinator", "redis"):
        proc = manifest.get(name) or {}
        if proc.get("pid") and alive(proc["pid"], started=proc.get("started")):
            out.append(f"{name} pid {proc['pid']}")
    return out


# ---- settings handed to the coordinator -------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


CLIENT_SECRETS = ("token",)
"""Settings of a client that the coordinator's file does not keep."""


def metrics_url(settings: Settings) -> str:
    """Where the coordinator's Prometheus endpoint serves (``metrics_port``)."""
    scheme = "https" if settings.tls_on else "http"
    return f"{scheme}://{settings.metrics_host}:{settings.metrics_port}/metrics"


def write_settings(settings: Settings, path: Path) -> None:
    """Write every field of ``settings`` as TOML for ``--config`` (read back: ``Settings.load``)."""
    lines = ["# Written by `geopubsub up`: the resolved settings of the running cluster."]
    lines += [
        f"{k} = {_toml_value(v)}"
        for k, v in dataclasses.asdict(settings).items()
        if k not in CLIENT_SECRETS
    ]
    _write_private(path, "\n".join(lines) + "\n")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by the owner only (a Redis URL may hold a password), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def child_environment() -> dict[str, str]:
    """The launcher's environment without ``GEOPUBSUB_<setting>`` variables: the settings file
    and flags given to the coordinator are the resolved settings, and an inherited variable would
    override the file."""
    names = {f.name for f in dataclasses.fields(Settings)}
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() in names)
    }
    env["PYTHONUNBUFFERED"] = "1"  # the listening line must reach the log at once
    return env


# ---- the running cluster ----------------------------------------------------------------------
@dataclasses.dataclass
class LocalCluster:
    """A cluster this process started: ``stop()`` it, or leave it running (detached)."""

    settings: Settings
    data_dir: Path
    coordinator: subprocess.Popen
    coordinator_started: int | None
    host: str
    port: int
    redis_url: str
    redis: RedisServer | None
    """The private Redis, None when ``settings.redis_url`` was given."""
    argv: list[str] = dataclasses.field(default_factory=list)
    """The coordinator's command line (a restart uses it, with the port it bound)."""
    tls: Tls | None = None
    """How the launcher and the local CLI reach the coordinator (None: plaintext)."""
    restarts: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"coordinator": 0, "redis": 0}
    )
    gave_up: dict[str, str] = dataclasses.field(default_factory=dict)
    """Processes the supervisor no longer restarts, and why."""
    supervisor: dict[str, Any] | None = None
    """The detached supervisor's pid, start time and log."""
    started_at: float = dataclasses.field(default_factory=time.time)
    launcher_pid: int = dataclasses.field(default_factory=os.getpid)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], settings: Settings) -> LocalCluster:
        """The cluster ``cluster.json`` describes, its processes adopted by pid (the detached
        supervisor watches processes the launcher started)."""
        coord, red = manifest["coordinator"], manifest.get("redis") or {}
        redis_server = None
        if red.get("private"):
            redis_server = RedisServer(
                manifest["data_dir"],
                port=red["port"],
                extra_args=red.get("extra_args", ()),
                password=urlsplit(red["url"]).password,
            )
            redis_server.process = AdoptedProcess(red["pid"], red.get("started"))
            redis_server.started = red.get("started")
        return cls(
            settings,
            Path(manifest["data_dir"]),
            AdoptedProcess(coord["pid"], coord.get("started")),
            coord.get("started"),
            coord["host"],
            coord["port"],
            red["url"],
            redis_server,
            argv=list(coord.get("argv") or []),
            tls=_tls_of(coord),
            restarts={"coordinator": coord.get("restarts", 0), "redis": red.get("restarts", 0)},
            gave_up={
                name: manifest[name]["gave_up"]
                for name in ("coordinator", "redis")
                if (manifest.get(name) or {}).get("gave_up")
            },
            supervisor=manifest.get("supervisor"),
            started_at=manifest.get("started_at", time.time()),
            launcher_pid=manifest.get("launcher_pid", os.getpid()),
        )

    @property
    def target(self) -> str:
        return client_target(self.host, self.port)

    @property
    def log_path(self) -> Path:
        return self.data_dir / COORDINATOR_LOG

    def manifest(self, *, detached: bool) -> dict[str, Any]:
        redis_info: dict[str, Any] = {"url": self.redis_url, "private": self.redis is not None}
        if self.redis is not None:
            redis_info |= {
                "pid": self.redis.pid,
                "started": self.redis.started,
                "port": self.redis.port,
                "log": str(self.redis.log_path),
                "extra_args": list(self.redis.extra_args),
                "restarts": self.restarts.get("redis", 0),
                "gave_up": self.gave_up.get("redis"),
            }
        return {
            "version": 1,
            "detached": detached,
            "launcher_pid": self.launcher_pid,
            "data_dir": str(self.data_dir),
            "started_at": self.started_at,
            "coordinator": {
                "pid": self.coordinator.pid,
                "started": self.coordinator_started,
                "host": self.host,
                "port": self.port,
                "target": self.target,
                "log": str(self.log_path),
                "argv": self.argv,
                "tls": dataclasses.asdict(self.tls) if self.tls else None,
                "metrics": metrics_url(self.settings) if self.settings.metrics_port else None,
                "restarts": self.restarts.get("coordinator", 0),
                "gave_up": self.gave_up.get("coordinator"),
            },
            "redis": redis_info,
            "ray_address": self.settings.ray_address,
            "supervisor": self.supervisor,
        }

    def write_manifest(self, *, detached: bool) -> None:
        _write_manifest(self.data_dir, self.manifest(detached=detached))

    def stop(self) -> bool:
        """Stop the coordinator (SIGINT, then SIGTERM, SIGKILL), what is left of its session (a
        local Ray), then the private Redis; remove cluster.json. True if all ended without
        SIGKILL."""
        clean = stop_process(
            self.coordinator.pid,
            first=signal.SIGINT,
            grace_s=COORDINATOR_STOP_S,
            popen=self.coordinator,
        )
        clean &= not stop_session(self.coordinator.pid)
        if self.redis is not None:
            clean &= self.redis.stop()
        manifest_path(self.data_dir).unlink(missing_ok=True)
        return clean

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    settings: Settings,
    *,
    timeout_s: float = READY_TIMEOUT_S,
    command: Sequence[str] | None = None,
) -> LocalCluster:
    """Start Redis (unless ``settings.redis_url``) and the coordinator; return once the coordinator
    answers SERVING. Writes ``cluster.json`` as soon as the processes exist (``detached`` false),
    so that ``down`` can clean up after a launcher that died. On failure, stops what it started
    and raises ClusterError with the tail of the failing process's log.

    ``command`` replaces ``python -m coordinator`` (tests run a stand-in); it gets the
    coordinator's flags.
    """
    data_dir = Path(settings.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(data_dir)
    if previous is not None:
        if running := _running(previous):
            raise ClusterError(
                f"a cluster is already running from {data_dir} ({', '.join(running)}, "
                f"{previous['coordinator']['target']}); stop it with `geopubsub down`"
            )
        manifest_path(data_dir).unlink()  # left by a launcher that was killed

    _launcher_tls(settings, None)  # (checked before anything starts)
    redis_server: RedisServer | None = None
    coordinator: subprocess.Popen | None = None
    try:
        if settings.redis_url:
            redis_url = settings.redis_url
            _check_redis(redis_url)
        else:
            redis_server = RedisServer(
                data_dir,
                extra_args=redis_options(settings),
                password=load_or_create_password(data_dir),
            ).start()
            redis_url = redis_server.url
        resolved = dataclasses.replace(settings, data_dir=str(data_dir), redis_url=redis_url)
        ca = None
        if settings.tls == "auto":  # the coordinator gets the files (it knows nothing of "auto")
            files = local_tls(data_dir / TLS_DIR, default_hosts(settings.host))
            ca = str(files.ca)
            resolved = dataclasses.replace(
                resolved, tls="", tls_cert=str(files.cert), tls_key=str(files.key)
            )
        tls = _launcher_tls(resolved, ca)
        config = data_dir / CONFIG_FILE
        write_settings(resolved, config)
        argv = [*(command or coordinator_command()), "--config", str(config)]
        argv += ["--shards", str(resolved.shards), "--host", resolved.host]
        argv += ["--port", str(resolved.port), "--data-dir", str(data_dir)]
        if urlsplit(redis_url).password is None:  # a password stays in the 0600 config file, off ps
            argv += ["--redis-url", redis_url]
        if resolved.ray_address:
            argv += ["--ray-address", resolved.ray_address]
        coordinator, offset = spawn_coordinator(argv, data_dir / COORDINATOR_LOG)
        cluster = LocalCluster(
            resolved,
            data_dir,
            coordinator,
            start_time(coordinator.pid),
            resolved.host,
            resolved.port,
            redis_url,
            redis_server,
            argv=argv,
            tls=tls,
        )
        cluster.write_manifest(detached=False)
        cluster.port = _wait_serving(cluster, offset, timeout_s)
        cluster.write_manifest(detached=False)
        return cluster
    except BaseException:
        if coordinator is not None:
            stop_process(coordinator.pid, first=signal.SIGINT, grace_s=10.0, popen=coordinator)
            stop_session(coordinator.pid, settle_s=2.0)
        if redis_server is not None:
            redis_server.stop()
        manifest_path(data_dir).unlink(missing_ok=True)
        raise


def spawn_coordinator(argv: Sequence[str], log_path: Path) -> tuple[subprocess.Popen, int]:
    """Start the coordinator in a session of its own, its output appended to ``log_path`` after
    a header line; returns the process and the log offset where its output begins."""
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        offset = log.tell()
        with _sigint_not_ignored_in_children():
            coordinator = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=child_environment(),
                start_new_session=True,
            )
    return coordinator, offset


def redis_options(settings: Settings) -> list[str]:
    """The private redis-server's options from the settings (kept in ``cluster.json``: a
    restart by the supervisor uses them again)."""
    return [
        "--maxmemory", f"{settings.redis_maxmemory_mb}mb",
        "--maxmemory-policy", "noeviction",
        "--appendfsync", settings.redis_fsync,
    ]  # fmt: skip


def _check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=5.0, socket_timeout=5.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise UnavailableError(f"Redis at {redacted(url)} is not reachable: {exc}") from None
    finally:
        client.close()


def _wait_serving(cluster: LocalCluster, offset: int, timeout_s: float) -> int:
    """Wait for the listening line, then for SERVING; return the port the coordinator bound."""
    deadline = time.monotonic() + timeout_s
    port: int | None = None
    while True:
        code = cluster.coordinator.poll()
        if code is not None:
            raise ClusterError(
                f"the coordinator exited with code {code} while starting; "
                f"{cluster.log_path}:\n{log_tail(cluster.log_path, 30, start=offset)}"
            )
        if cluster.redis is not None and not alive(cluster.redis.pid, popen=cluster.redis.process):
            raise ClusterError(
                f"redis-server exited while the coordinator was starting; {cluster.redis.log_path}:"
                f"\n{log_tail(cluster.redis.log_path, 20)}"
            )
        if port is None:
            found = LISTENING.search(log_tail(cluster.log_path, 10_000, start=offset))
            if found:
                port = int(found[2])
        if (
            port is not None
            and _health(client_target(cluster.host, port), cluster.tls) == "SERVING"
        ):
            return port
        if time.monotonic() >= deadline:
            why = "did not print its listening line" if port is None else "is not SERVING"
            raise ClusterError(
                f"the coordinator {why} within {timeout_s:g} s; "
                f"{cluster.log_path}:\n{log_tail(cluster.log_path, 30, start=offset)}"
            )
        time.sleep(0.2)


def _health(target: str, tls: Tls | None = None, timeout_s: float = 1.0) -> str:
    """The health status name of the server at ``target``, or the gRPC error code's name."""
    with GeoPubSubClient(target, tls=tls) as client:
        try:
            return client.health(timeout_s=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name


# ---- commands -------------------------------------------------------------------------------
@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, so that ``kill`` stops the cluster as
    Ctrl-C does (main thread only, where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sigint_not_ignored_in_children() -> Iterator[None]:
    """A child inherits an ignored SIGINT (a launcher started with ``&`` from a script has it
    ignored), and the coordinator would then not stop on SIGINT. A handler, unlike SIG_IGN, is
    reset to the default on exec: install a no-op one while spawning (main thread only)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def down(data_dir: str | Path, *, out: TextIO | None = None) -> int:
    """``geopubsub down``: stop the cluster recorded in ``<data_dir>/cluster.json`` (detached or
    a foreground one): the coordinator, what is left of its local Ray, the private Redis. A pid
    reused by another process since (its start time differs) is never signalled."""
    out = out or sys.stdout
    manifest = read_manifest(data_dir)
    if manifest is None:
        print(f"no local cluster in {data_dir} (no {CLUSTER_FILE})", file=out)
        return 0
    sup = manifest.get("supervisor") or {}
    if sup.get("pid") and alive(sup["pid"], started=sup.get("started")):
        # first, so that it restarts nothing of what follows; it may have restarted a process
        # just before: the pids are read again after it stopped
        print(f"stopping the supervisor (pid {sup['pid']}) ...", file=out, flush=True)
        stop_process(sup["pid"], grace_s=SUPERVISOR_STOP_S, started=sup.get("started"))
        manifest = read_manifest(data_dir) or manifest
    coord = manifest["coordinator"]
    if alive(coord["pid"], started=coord.get("started")):
        print(f"stopping the coordinator (pid {coord['pid']}) ...", file=out, flush=True)
        stop_process(
            coord["pid"],
            first=signal.SIGINT,
            grace_s=COORDINATOR_STOP_S,
            started=coord.get("started"),
        )
    # A pid alive with another start time was reused: its session is not the coordinator's (the
    # kernel does not reuse a pid while processes of its session remain).
    reused = alive(coord["pid"]) and not alive(coord["pid"], started=coord.get("started"))
    if not reused and (left := stop_session(coord["pid"])):
        print(f"stopped {len(left)} leftover process(es) of the coordinator: {left}", file=out)
    red = manifest.get("redis") or {}
    if red.get("private") and alive(red["pid"], started=red.get("started")):
        print(f"stopping redis-server (pid {red['pid']}) ...", file=out, flush=True)
        stop_redis(
            red["pid"],
            red["port"],
            started=red.get("started"),
            password=urlsplit(red["url"]).password,
        )
    manifest_path(data_dir).unlink(missing_ok=True)
    print("geopubsub cluster stopped", file=out)
    return 0


def _parts_health(target: str, tls: Tls | None, timeout_s: float = 2.0) -> str:
    """The coordinator's health per part (``coordinator.health``: ``…/redis``, ``…/shard-K``)
    as ``redis SERVING, shard 0 SERVING, shard 1 NOT_SERVING``; "" if it has none."""
    names = [("redis", REDIS_HEALTH)] + [
        (f"shard {k}", shard_health_name(k)) for k in range(MAX_PARTS)
    ]
    out = []
    with GeoPubSubClient(target, tls=tls) as client:
        for label, name in names:
            try:
                out.append(f"{label} {client.health(name, timeout_s=timeout_s)}")
            except grpc.RpcError:  # NOT_FOUND: no such part (the last shard was the one before)
                break
    return ", ".join(out)


def _supervision(proc: dict[str, Any]) -> str:
    """``, restarts N`` and, once the supervisor gave up on the process, why."""
    text = f", restarts {proc.get('restarts', 0)}"
    if proc.get("gave_up"):
        text += f", not restarted any more ({proc['gave_up']})"
    return text


def status(
    data_dir: str | Path,
    *,
    target: str | None = None,
    out: TextIO | None = None,
    tls: Tls | None = None,
    token: str | None = None,
) -> int:
    """``geopubsub status``: the local cluster's processes (from cluster.json), the coordinator's
    health at ``target`` (default: the recorded address) and, when SERVING, its stats. ``tls``:
    how to reach it (default: as cluster.json says). Exit code 0 when SERVING, else 1."""
    out = out or sys.stdout
    manifest = read_manifest(data_dir)
    if tls is None and manifest is not None:
        tls = _tls_of(manifest["coordinator"])
    if manifest is not None:
        coord, red = manifest["coordinator"], manifest.get("redis") or {}
        mode = (
            "detached"
            if manifest.get("detached")
            else f"foreground, launcher pid {manifest.get('launcher_pid')}"
        )
        state = "running" if alive(coord["pid"], started=coord.get("started")) else "not running"
        print(f"local cluster in {manifest['data_dir']} ({mode})", file=out)
        print(
            f"  coordinator pid {coord['pid']} {state}, {coord['target']}, log {coord['log']}"
            + _supervision(coord),
            file=out,
        )
        if red.get("private"):
            state = "running" if alive(red["pid"], started=red.get("started")) else "not running"
            print(
                f"  redis pid {red['pid']} {state}, {redacted(red['url'])}" + _supervision(red),
                file=out,
            )
        else:
            print(f"  redis {redacted(red.get('url') or '')} (external)", file=out)
        if manifest.get("detached"):
            sup = manifest.get("supervisor") or {}
            state = (
                "running"
                if sup.get("pid") and alive(sup["pid"], started=sup.get("started"))
                else "not running: nothing restarts the processes"
            )
            print(f"  supervisor pid {sup.get('pid')} {state}, log {sup.get('log')}", file=out)
        target = target or coord["target"]
    elif target is None:
        print(f"no local cluster in {data_dir} (start one with: geopubsub up)", file=out)
        return 1
    health = _health(target, tls, timeout_s=2.0)
    print(f"{target}: {health}" + (" (TLS)" if tls else ""), file=out)
    parts = _parts_health(target, tls)
    if parts:
        print(f"  health: {parts}", file=out)
    if health != "SERVING":
        return 1
    with GeoPubSubClient(target, timeout_s=5.0, tls=tls, token=token) as client:
        try:
            stats = client.stats()
        except grpc.RpcError as exc:
            print(f"  GetStats failed: {exc.code().name}: {exc.details()}", file=out)
            return 1
    for line in describe_stats(stats):
        print(f"  {line}", file=out)
    return 0


TLS_DIR = "tls"
"""Under the data dir: the local CA and server certificate of ``tls = "auto"`` (``deploy.tls``)."""
