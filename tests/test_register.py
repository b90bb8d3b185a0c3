"""``geopubsub register``: a workload file through Subscribe calls with many in flight, against the
stand-in coordinator on 127.0.0.1 (a real gRPC server): every valid line registered as written, a
bad line reported as ``file:line`` and skipped, the exit code telling which."""

from __future__ import annotations

import json

import pytest

from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from shard.workload import read_subscriptions
from tests.fake_coordinator import serve


@pytest.fixture
def server():
    server, port, fake = serve()
    yield fake, f"127.0.0.1:{port}"
    server.stop(0).wait()


def test_register_subscribes_every_line(server, tmp_path, capsys):
    fake, target = server
    generate(300, 0, tmp_path, seed=4, dnf_share=0.3, circle_share=0.3, moving_share=0.2)
    path = tmp_path / "subs.jsonl"
    code = main(["register", "--subs", str(path), "--target", target, "--in-flight", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    want = {s.id: s for s in read_subscriptions(path)}
    assert fake.subs == want  # as written: keywords / expr, region, moving
    assert (
        "registered 300 subscriptions" in out
        and f"({sum(s.moving for s in want.values())} moving)" in out
    )


def test_register_in_batches_keeps_the_good_ones_of_a_refused_batch(server, tmp_path, capsys):
    """``--batch 7``: requests of seven subscriptions; a batch the server refuses is sent again
    one by one, so that only the refused subscription is missing and counted."""
    fake, target = server
    generate(100, 0, tmp_path, seed=5)
    path = tmp_path / "subs.jsonl"
    fake.refused_ids = {"s10"}
    argv = ["register", "--subs", str(path), "--target", target, "--batch", "7"]
    code = main(argv + ["--in-flight", "4"])
    out = capsys.readouterr()
    assert code == 2, out
    assert set(fake.subs) == {s.id for s in read_subscriptions(path)} - {"s10"}
    assert "registered 99 subscriptions" in out.out and "1 rejected" in out.out
    assert "s10: subscriptions[0].id='s10': refused (a test)" in out.err
    assert fake.requests == 14 + 6  # 15 batches, one refused and retried as seven singles


def test_a_bad_line_is_reported_and_skipped(server, tmp_path, capsys):
    fake, target = server
    path = tmp_path / "subs.jsonl"
    rows = [{"id": f"s{i}", "keywords": ["a"], "rect": [0, 0, 1, 1]} for i in range(5)]
    rows[2]["rect"] = [0, 95, 1, 96]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["register", "--subs", str(path), "--target", target])
    captured = capsys.readouterr()
    assert code == 2
    assert sorted(fake.subs) == ["s0", "s1", "s3", "s4"]
    assert f"{path}:3:" in captured.err and "rect[1]" in captured.err
    assert "1 rejected" in captured.out
