"""Process helpers for the local launcher: liveness and identity by pid, stopping one process
politely then firmly, the processes left in a session, free ports and log tails (Linux ``/proc``).

A process is named by ``(pid, start time)`` so that a pid recorded in ``cluster.json`` and reused
since by an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

POLL_S = 0.05
"""How often waits re-check a process."""


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``comm`` (state, ppid, pgrp, session, ...)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), its identity with the pid; None when the
    process does not exist or ``/proc`` is unavailable."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, *, started: int | None = None, popen: subprocess.Popen | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not) and, given ``started``, is still the same process.

    >>> alive(os.getpid())
    True
    """
    if popen is not None:
        return popen.poll() is None
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child, exited: reaped now
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    if fields is None:
        return not Path("/proc").is_dir()
    if fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def wait_gone(
    pid: int,
    timeout_s: float,
    *,
    started: int | None = None,
    popen: subprocess.Popen | None = None,
) -> bool:
    """Wait up to ``timeout_s`` for the process to exit; True once it has."""
    deadline = time.monotonic() + timeout_s
    while alive(pid, started=started, popen=popen):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop_process(
    pid: int,
    *,
    first: signal.Signals = signal.SIGTERM,
    grace_s: float = 10.0,
    started: int | None = None,
    popen: subprocess.Popen | None = None,
) -> bool:
    """Send ``first`` and wait ``grace_s``; then SIGTERM (if ``first`` was another signal) and
    SIGKILL, 5 s each. Returns whether the process ended before SIGKILL. A process that is gone
    already, or whose start time differs from ``started`` (the pid was reused), is left alone.
    """
    steps = [(first, grace_s)] + ([(signal.SIGTERM, 5.0)] if first is not signal.SIGTERM else [])
    for sig, wait_s in steps:
        if not alive(pid, started=started, popen=popen):
            return True
        _signal(pid, sig, popen)
        if wait_gone(pid, wait_s, started=started, popen=popen):
            return True
    if alive(pid, started=started, popen=popen):
        _signal(pid, signal.SIGKILL, popen)
        wait_gone(pid, 5.0, started=started, popen=popen)
    return False


def _signal(pid: int, sig: signal.Signals, popen: subprocess.Popen | None) -> None:
    if popen is not None:
        popen.send_signal(sig)  # a no-op once the child has been reaped
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def session_members(sid: int) -> list[int]:
    """Live processes (zombies excluded) of session ``sid`` or process group ``sid``: what a
    process started with ``start_new_session=True`` and its descendants left behind (Ray's
    gcs_server, raylet and workers for a coordinator that ran a local Ray). Linux only; [] elsewhere.
    """
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X") or pid == os.getpid():
            continue
        if int(fields[2]) == sid or int(fields[3]) == sid:
            out.append(pid)
    return sorted(out)


def stop_session(sid: int, *, settle_s: float = 5.0) -> list[int]:
    """Stop what is left of session ``sid``: wait ``settle_s`` for the processes to exit by
    themselves, then SIGTERM, then SIGKILL. Returns the pids that had to be signalled."""
    deadline = time.monotonic() + settle_s
    while (left := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5.0
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return left


UNKNOWN_EXIT = -1000
"""``AdoptedProcess.returncode`` once the process is gone: its exit status went to its parent."""


class AdoptedProcess:
    """A process this one did not start (a detached cluster's, found in ``cluster.json``),
    known by pid and start time: the part of ``subprocess.Popen`` the launcher uses (``pid``,
    ``poll``, ``send_signal``, ``returncode``). Its exit status is not ours to read: once it is
    gone, ``returncode`` is ``UNKNOWN_EXIT``."""

    def __init__(self, pid: int, started: int | None) -> None:
        self.pid = pid
        self.started = started
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not alive(self.pid, started=self.started):
            self.returncode = UNKNOWN_EXIT
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the caller may lose a race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 20, *, start: int = 0) -> str:
    """The last ``lines`` lines of a log file from byte offset ``start`` ("" if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
