"""Supervision of a local cluster's processes: the private redis-server and the coordinator are
started again when they die (a crash, ``kill -9``, the OOM killer).

* **Redis** comes back on the same port with the same data directory: the append-only file
  brings back everything fsynced before the crash (``appendfsync everysec``: at most the last
  second of writes is lost). The coordinator's Redis client reconnects by itself; while Redis is
  away, calls that need it answer UNAVAILABLE and its health says NOT_SERVING.
* **Redis's forks** (its AOF rewrites) are moved into an idle cpu cgroup within ``forks.WATCH_S``
  of their start, where the machine allows it (``deploy.forks``): a rewrite then runs on CPU the
  cluster leaves instead of taking a core from the coordinator and the shards for seconds.
* **The coordinator** comes back with the same command line and the port it had bound (clients
  keep their address); it rebuilds the shards from Redis as at any start. What was left of the
  dead one's session (its local Ray) is stopped first.
* **Restart policy**: a restart waits ``RESTART_PAUSE_S`` (0.5 s, doubling with every crash
  within ``restart_window_s``, at most 10 s); after ``restart_max`` crashes within
  ``restart_window_s`` the supervisor gives up on that process, says so in its log and in
  ``cluster.json`` (``geopubsub status`` shows it). A coordinator that exits with 0 or after
  SIGINT / SIGTERM was stopped on purpose and is not restarted.

Who supervises (``up`` below, ``geopubsub up``: ``deploy.local.start``, then this): a foreground
``geopubsub up`` itself (``Supervisor.run`` in its main thread; giving up ends the cluster, exit
code 1). ``up --detach`` starts ``python -m deploy.supervise --data-dir DIR``
(``start_supervisor``) in a session of its own; it adopts the processes by pid and start time
from ``cluster.json``, records its own pid there and logs to ``supervisor.log``; ``geopubsub
down`` stops it (SIGTERM) before anything else. Nobody restarts the supervisor: if it is killed,
the cluster runs unsupervised (``geopubsub status`` says so).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from coordinator.settings import Settings
from deploy import forks, local
from deploy.processes import UNKNOWN_EXIT, alive, start_time, stop_session
from deploy.redis_local import RedisServer
from shard.errors import GeoPubSubError
from shard.metadata_codec import redacted

RESTART_PAUSE_S = (0.5, 10.0)
"""First and longest pause before a restart: doubling with each crash within the window, so a
process that dies at once again is not restarted in a tight loop."""
POLL_S = 0.5
"""How often the supervisor looks at its processes."""
SUPERVISOR_READY_S = 30.0
"""Longest ``up --detach`` waits for the supervisor it started to record itself."""


def _describe_exit(code: int | None) -> str:
    if code == UNKNOWN_EXIT:
        return "is gone (exit status unknown: not the supervisor's child)"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Supervisor:
    """Watches the coordinator and the private Redis of ``cluster`` (``deploy.local``) and
    restarts whichever dies, as the module docstring says. ``out`` gets a line for everything it
    does; ``cluster.json`` is rewritten after every change."""

    def __init__(self, cluster: local.LocalCluster, *, out: TextIO, detached: bool) -> None:
        self.cluster = cluster
        self.out = out
        self.detached = detached
        self.stopping = threading.Event()
        """Set it (a signal handler does) to end ``run`` after the step under way."""
        self._crashes: dict[str, collections.deque[float]] = {
            "coordinator": collections.deque(),
            "redis": collections.deque(),
        }
        self.forks_group: Path | None = None
        """The idle cpu cgroup Redis's children go to (None: not possible here)."""
        self.forks_moved = 0

    def say(self, text: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {text}", file=self.out, flush=True)

    def run(self) -> int:
        """Supervise until ``stopping`` is set (0), the coordinator is stopped on purpose (0, in
        the foreground), or, in the foreground, the supervisor gives up on a process (1). A
        detached supervisor that gave up goes on watching what is left."""
        if self.cluster.redis is not None:
            self.forks_group, how = forks.forks_group()
            if self.forks_group is None:
                self.say(f"Redis's AOF rewrites run at normal CPU priority: {how}")
            else:
                self.say(f"Redis's AOF rewrites run in the cpu cgroup {self.forks_group} ({how})")
                threading.Thread(target=self._watch_forks, daemon=True).start()
        while not self.stopping.is_set():
            verdict = self.step()
            if verdict is not None and not self.detached:
                return verdict
            self.stopping.wait(POLL_S)
        return 0

    def _watch_forks(self) -> None:
        """Move every new child of the private redis-server into ``forks_group``."""
        moved: set[int] = set()
        while not self.stopping.wait(forks.WATCH_S):
            redis_server = self.cluster.redis
            if redis_server is not None and redis_server.process is not None:
                pid = redis_server.pid
                self.forks_moved += len(forks.move_children(pid, self.forks_group, moved))

    def step(self) -> int | None:
        """One look at the processes; restarts what died. None while all is well, else the
        foreground exit code (0 coordinator stopped on purpose, 1 gave up)."""
        c = self.cluster
        code = c.coordinator.poll() if "coordinator" not in c.gave_up else None
        if code in local.STOPPED:
            if not self.detached:
                return 0
            self.say(f"the coordinator (pid {c.coordinator.pid}) was stopped on purpose")
            c.gave_up["coordinator"] = "stopped on purpose"
            self._record()
        redis_code = None
        if c.redis is not None and "redis" not in c.gave_up:
            redis_code = c.redis.process.poll()
        if redis_code is not None and not self._restart("redis", _describe_exit(redis_code)):
            return 1
        crashed = code is not None and code not in local.STOPPED
        if crashed and not self._restart("coordinator", _describe_exit(code)):
            return 1
        return None

    def _restart(self, name: str, why: str) -> bool:
        """Restart ``name`` after its back-off; False once it is given up."""
        c = self.cluster
        pid = c.coordinator.pid if name == "coordinator" else c.redis.pid
        window, most = c.settings.restart_window_s, c.settings.restart_max
        crashes = self._crashes[name]
        while True:
            now = time.monotonic()
            crashes.append(now)
            while crashes and crashes[0] < now - window:
                crashes.popleft()
            if len(crashes) > most:
                c.gave_up[name] = f"{len(crashes)} crashes within {window:g} s"
                self.say(
                    f"{name} (pid {pid}) {why}: {len(crashes)} crashes within {window:g} s, "
                    f"more than restart_max={most}; giving up on it (see its log)"
                )
                self._record()
                return False
            pause = min(RESTART_PAUSE_S[0] * 2 ** (len(crashes) - 1), RESTART_PAUSE_S[1])
            self.say(f"{name} (pid {pid}) {why}; restarting it in {pause:g} s")
            if self.stopping.wait(pause):
                return True
            try:
                pid = self._start_again(name)
            except (GeoPubSubError, OSError) as exc:
                why = f"could not be started again ({exc})"
                continue
            c.restarts[name] += 1
            self.say(f"{name} restarted (pid {pid}, restart {c.restarts[name]})")
            self._record()
            return True

    def _start_again(self, name: str) -> int:
        c = self.cluster
        if name == "redis":
            server = RedisServer(
                c.data_dir,
                port=c.redis.port,
                extra_args=c.redis.extra_args,
                password=c.redis.password,
            )
            server.start()
            c.redis = server
            return server.pid
        left = stop_session(c.coordinator.pid, settle_s=2.0)  # the dead one's local Ray
        if left:
            self.say(f"stopped {len(left)} leftover process(es) of the coordinator: {left}")
        argv = _with_port(c.argv, c.port)
        coordinator, _ = local.spawn_coordinator(argv, c.log_path)
        c.coordinator = coordinator
        c.coordinator_started = start_time(coordinator.pid)
        return coordinator.pid

    def _record(self) -> None:
        self.cluster.write_manifest(detached=self.detached)


def _with_port(argv: list[str], port: int) -> list[str]:
    """``argv`` with the value of ``--port`` set to ``port`` (the one bound at the first start,
    also when it was 0 then)."""
    out = list(argv)
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    else:
        out += ["--port", str(port)]
    return out


# ---- the detached supervisor process ---------------------------------------------------------
def supervisor_command(data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "deploy.supervise", "--data-dir", str(data_dir)]


def start_supervisor(cluster: local.LocalCluster, *, timeout_s: float) -> dict:
    """Start the detached supervisor of ``cluster`` (whose ``cluster.json`` is written) and wait
    until it has recorded itself there; returns its record (pid, started, log). Raises
    ClusterError with its log's tail when it does not."""
    log_path = cluster.data_dir / local.SUPERVISOR_LOG
    with open(log_path, "ab") as log:
        offset = log.tell()
        process = subprocess.Popen(
            supervisor_command(cluster.data_dir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=local.child_environment(),
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        record = (local.read_manifest(cluster.data_dir) or {}).get("supervisor") or {}
        if record.get("pid") == process.pid:
            return record
        code = process.poll()
        if code is not None or time.monotonic() >= deadline:
            if code is None:
                process.kill()
                process.wait()
            why = f"exited with code {code}" if code is not None else "did not start in time"
            raise local.ClusterError(
                f"the supervisor {why}; {log_path}:\n{local.log_tail(log_path, 20, start=offset)}"
            )
        time.sleep(0.05)


# ---- `geopubsub up` ---------------------------------------------------------------------------
def up(
    settings: Settings,
    *,
    detach: bool,
    timeout_s: float = local.READY_TIMEOUT_S,
    command: Sequence[str] | None = None,
    out: TextIO | None = None,
) -> int:
    """``geopubsub up``: start the cluster; with ``detach`` return once SERVING, else run until
    Ctrl-C / SIGTERM and stop everything started. Returns the exit code: 0, or 1 when the
    coordinator or Redis died on its own."""
    out = out or sys.stdout
    with local.sigterm_as_interrupt():
        cluster = local.start(settings, timeout_s=timeout_s, command=command)
        redis_line = (
            f"redis {redacted(cluster.redis_url)} (pid {cluster.redis.pid}, data {cluster.redis.dir})"
            if cluster.redis is not None
            else f"redis {redacted(cluster.redis_url)} (external)"
        )
        ray_line = f"ray {settings.ray_address}" if settings.ray_address else "ray local"
        tls_line = ""
        if cluster.tls is not None:
            trust = cluster.tls.ca or "the system's CAs"
            mutual = ", clients must present a certificate" if settings.tls_client_ca else ""
            tls_line = f"\n  TLS on{mutual}; clients trust {trust} (give it to them: --ca)"
        if settings.auth_on:
            tls_line += (
                "\n  auth on: every call but health needs a bearer token (make one with: "
                f"geopubsub token create --role admin --data-dir {settings.data_dir})"
            )
        if settings.metrics_port:
            tls_line += f"\n  metrics: {local.metrics_url(settings)}"
        print(
            f"geopubsub cluster SERVING at {cluster.target}: {settings.shards} shards, {ray_line}\n"
            f"  coordinator pid {cluster.coordinator.pid}, log {cluster.log_path}\n  {redis_line}"
            + tls_line,
            file=out,
            flush=True,
        )
        if detach:
            cluster.write_manifest(detached=True)
            try:
                record = start_supervisor(cluster, timeout_s=SUPERVISOR_READY_S)
            except BaseException:
                cluster.stop()
                raise
            print(
                f"  supervisor pid {record['pid']}, log {record['log']}\n"
                "  stop it with: geopubsub down",
                file=out,
                flush=True,
            )
            return 0
        print("  Ctrl-C stops it", file=out, flush=True)
        try:
            code = Supervisor(cluster, out=out, detached=False).run()
        except KeyboardInterrupt:
            code = 0
            print("\nstopping the cluster ...", file=out, flush=True)
        finally:
            cluster.stop()
    print("geopubsub cluster stopped", file=out, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.supervise", description=__doc__)
    p.add_argument("--data-dir", required=True)
    args = p.parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    manifest = local.read_manifest(data_dir)
    if manifest is None:
        print(f"no {local.CLUSTER_FILE} in {data_dir}: nothing to supervise", file=sys.stderr)
        return 2
    settings = Settings.load(file=data_dir / local.CONFIG_FILE)
    cluster = local.LocalCluster.from_manifest(manifest, settings)
    cluster.supervisor = {
        "pid": os.getpid(),
        "started": start_time(os.getpid()),
        "log": str(data_dir / local.SUPERVISOR_LOG),
    }
    supervisor = Supervisor(cluster, out=sys.stdout, detached=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: supervisor.stopping.set())
    cluster.write_manifest(detached=True)
    supervisor.say(f"watching {data_dir} (coordinator pid {cluster.coordinator.pid})")
    supervisor.run()
    supervisor.say("stopped; the cluster's processes are left to `geopubsub down`")
    return 0


def supervisor_alive(manifest: dict) -> bool:
    record = manifest.get("supervisor") or {}
    return bool(record.get("pid")) and alive(record["pid"], started=record.get("started"))


if __name__ == "__main__":
    sys.exit(main())
