"""A Spark standalone cluster on this machine, from the pyspark distribution the project installs:
a master and its workers as child processes (``bin/spark-class``), for ``geopubsub load --master
spark://HOST:PORT``. On several machines the same two commands run there (Spark's
``start-master.sh`` / ``start-worker.sh`` do the same); ``docs/DEPLOY.md`` says how.

>>> cmd = worker_command("spark://127.0.0.1:7077", cores=2, memory="1g", work_dir=Path("w"), webui_port=0)
>>> cmd[1:3], cmd[-1]
(['org.apache.spark.deploy.worker.Worker', 'spark://127.0.0.1:7077'], 'w')
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from deploy.processes import free_port, log_tail, stop_process, stop_session
from shard.errors import UnavailableError, ValidationError

READY_S = 120.0
"""Longest ``start`` waits for the master to list every worker ALIVE."""


def spark_home() -> Path:
    """The pyspark distribution's directory (its ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def master_command(host: str, port: int, webui_port: int) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.master.Master",
        "--host",
        host,
        "--port",
        str(port),
        "--webui-port",
        str(webui_port),
    ]


def worker_command(
    master: str, *, cores: int, memory: str, work_dir: Path, webui_port: int
) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker",
        master,
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--webui-port",
        str(webui_port),
        "--work-dir",
        str(work_dir),
    ]


@dataclass
class Standalone:
    """A running master (``url``: ``spark://HOST:PORT``, ``webui``: its status page, whose
    ``/json/`` lists the workers) and its workers; ``stop`` ends them all."""

    url: str
    webui: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def workers(self) -> list[dict]:
        """The master's view of its workers (id, state, cores, memory, ...)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as r:
            return json.loads(r.read())["workers"]

    def stop(self) -> None:
        """Workers first, then the master; then whatever their sessions left (a worker's
        executors)."""
        for p in reversed(self.procs):
            stop_process(p.pid, popen=p)
            stop_session(p.pid, settle_s=0.5)
        self.procs.clear()


def start(
    work_dir: str | Path,
    *,
    workers: int = 1,
    cores: int = 2,
    memory: str = "2g",
    host: str = "127.0.0.1",
    timeout_s: float = READY_S,
) -> Standalone:
    """Start a master and ``workers`` workers of ``cores`` cores and ``memory`` each under
    ``work_dir`` (logs, the workers' scratch), and wait until the master lists them ALIVE."""
    if workers < 1:
        raise ValidationError("workers", workers, "must be >= 1")
    if cores < 1:
        raise ValidationError("cores", cores, "must be >= 1")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
    port, webui = free_port(host), free_port(host)
    cluster = Standalone(f"spark://{host}:{port}", f"http://{host}:{webui}")
    try:
        cmds = [master_command(host, port, webui)]
        for i in range(workers):
            wdir = work / f"worker-{i}"
            wdir.mkdir(exist_ok=True)
            cmds.append(
                worker_command(cluster.url, cores=cores, memory=memory, work_dir=wdir, webui_port=0)
            )
        for i, cmd in enumerate(cmds):
            log = work / ("master.log" if i == 0 else f"worker-{i - 1}.log")
            with open(log, "ab") as fh:
                cluster.procs.append(
                    subprocess.Popen(
                        cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )
            cluster.logs.append(log)
            if i == 0:
                _wait(cluster, 0, timeout_s)
        _wait(cluster, workers, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(cluster: Standalone, n: int, timeout_s: float) -> None:
    """Until the master answers and lists ``n`` workers ALIVE (or a process died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p, log in zip(cluster.procs, cluster.logs, strict=True):
            if p.poll() is not None:
                raise UnavailableError(
                    f"Spark {log.stem} exited with {p.returncode}:\n{log_tail(log)}"
                )
        try:
            alive = [w for w in cluster.workers() if w.get("state") == "ALIVE"]
            if len(alive) >= n:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise UnavailableError(
        f"the Spark master at {cluster.url} did not list {n} workers within {timeout_s:g} s:\n"
        + log_tail(cluster.logs[0])
    )
