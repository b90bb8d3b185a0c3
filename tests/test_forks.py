"""Redis's forked children (AOF rewrites) moved into an idle cpu cgroup (``deploy.forks``): the
group set up on hand-made v1 and v2 layouts, and a real rewrite child of a real redis-server moved
into the machine's real cgroup."""

from __future__ import annotations

import contextlib
import time

import pytest
import redis

from deploy import forks
from deploy.redis_local import RedisServer

pytestmark = pytest.mark.redis


def test_the_group_is_made_idle_on_a_v1_layout(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.shares").write_text("1024")
    group, how = forks.forks_group(tmp_path)
    assert group == tmp_path / "cpu" / forks.GROUP and how == "cpu.shares 2"
    assert (group / "cpu.shares").read_text() == "2"
    (group / "cpu.idle").write_text("0")  # a kernel with cpu.idle: that is used instead
    assert forks.forks_group(tmp_path) == (group, "cpu.idle 1")
    assert (group / "cpu.idle").read_text() == "1"


def test_the_group_is_made_on_a_v2_layout_with_the_cpu_controller_enabled(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    (tmp_path / "cgroup.subtree_control").write_text("memory")
    group, how = forks.forks_group(tmp_path)
    assert group == tmp_path / forks.GROUP and how == "cpu.weight 1"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (group / "cpu.weight").read_text() == "1"


def test_without_a_cpu_controller_it_says_why(tmp_path):
    assert forks.forks_group(tmp_path) == (None, f"no cpu cgroup controller under {tmp_path}")
    (tmp_path / "cgroup.controllers").write_text("memory pids")
    assert forks.forks_group(tmp_path)[0] is None


def test_a_real_rewrite_child_is_moved_into_the_idle_group(tmp_path):
    group, why = forks.forks_group()
    assert group is not None, why  # (root on a machine with a cpu controller, as CI's)
    server = RedisServer(tmp_path).start()
    try:
        r = redis.Redis.from_url(server.url)
        blob = b"x" * 100_000
        pipe = r.pipeline(transaction=False)
        for i in range(1500):  # ~150 MB: a rewrite of some tenths of a second
            pipe.set(f"k{i}", blob)
        pipe.execute()
        moved: set[int] = set()
        with contextlib.suppress(redis.ResponseError):  # (one may have begun by itself)
            r.bgrewriteaof()
        got: list[int] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = forks.move_children(server.pid, group, moved)
            time.sleep(0.005)
        assert got, "no child of redis-server seen during BGREWRITEAOF"
        assert forks.group_of(got[0]).endswith("/" + forks.GROUP)
        assert forks.group_of(server.pid) != forks.group_of(got[0])  # the server itself stays
        while r.info("persistence")["aof_rewrite_in_progress"]:
            time.sleep(0.05)
        assert r.info("persistence")["aof_last_bgrewrite_status"] == "ok"
        assert forks.move_children(server.pid, group, moved) == [] and moved == set()
        r.close()
    finally:
        server.stop()
