"""Redis's forked children (its AOF rewrites) on the CPU the cluster leaves, not on the cluster's.

A rewrite writes the whole dataset (the 1M subscriptions and the retention log: ~500 MB) for
seconds of a core. On a 2-core machine running the cluster at ~70 % the cores then run out and
deliveries wait up to ~1 s (docs/RELIABILITY.md, the soaks). ``nice`` cannot prevent it: with the
kernel's autogroup scheduling a process shares its session's group, and redis-server's session
competes as a whole with the coordinator's and the shards'. A cpu cgroup can: the supervisor moves
each child of the private redis-server into ``GROUP``, a group marked idle (``cpu.idle``, Linux
5.15 and later; else the smallest ``cpu.shares`` / ``cpu.weight``), so that a rewrite runs when a
core would otherwise be idle and takes longer instead.

It needs a cpu controller the supervisor may write (root, cgroup v1 or v2); where there is none,
``forks_group`` returns None with the reason and the cluster runs as before.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "geopubsub-redis-forks"
WATCH_S = 0.05
"""How often the supervisor looks for a new child (a rewrite lasts seconds)."""


def _cpu_hierarchy(root: Path) -> Path | None:
    """Where the cpu controller is mounted: ``<root>/cpu`` (cgroup v1) or ``<root>`` (v2)."""
    if (root / "cpu" / "cpu.shares").exists():
        return root / "cpu"
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return root
    return None


def forks_group(root: Path = CGROUP_ROOT) -> tuple[Path | None, str]:
    """The idle cpu cgroup for Redis's children, made if missing: (its directory, how it is
    limited), or (None, why not)."""
    base = _cpu_hierarchy(root)
    if base is None:
        return None, f"no cpu cgroup controller under {root}"
    group = base / GROUP
    try:
        if base == root:  # v2: the cpu controller must be enabled for the root's children
            control = root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
        group.mkdir(exist_ok=True)
        if (group / "cpu.idle").exists():
            (group / "cpu.idle").write_text("1")
            return group, "cpu.idle 1"
        name, value = ("cpu.shares", "2") if base != root else ("cpu.weight", "1")
        (group / name).write_text(value)
        return group, f"{name} {value}"
    except OSError as exc:
        return None, f"cannot set up {group}: {exc.strerror or exc}"


def children(pid: int) -> list[int]:
    """The processes ``pid`` forked that still run ([] if it is gone)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def move_children(pid: int, group: Path, moved: set[int]) -> list[int]:
    """Move the children of ``pid`` not yet in ``moved`` into ``group``; returns those moved
    now (a child that ended meanwhile is skipped). ``moved`` keeps only live children."""
    kids = children(pid)
    moved.intersection_update(kids)
    now = []
    for k in kids:
        if k in moved:
            continue
        try:
            (group / "cgroup.procs").write_text(str(k))
        except OSError:  # ended meanwhile
            continue
        moved.add(k)
        now.append(k)
    return now


def group_of(pid: int) -> str:
    """The cpu cgroup path of ``pid`` (v1's ``cpu`` line, or v2's single line)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    return ""
