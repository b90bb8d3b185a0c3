"""The cluster commands of ``geopubsub``: argument parsing, validation errors (exit 2, the field and
value named), settings precedence, the client commands against a real gRPC server on 127.0.0.1
(the stand-in coordinator), ``subscribe --follow``, and end to end with the real coordinator."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest

from coordinator.settings import Settings
from deploy import local
from deploy.processes import alive, session_members
from geopubsub.client import GeoPubSubClient
from geopubsub.tools import cluster_cli
from geopubsub.tools.cli import COMMANDS, build_parser, main
from shard.errors import ValidationError
from tests.fake_coordinator import serve


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_parse(capsys, *argv: str) -> tuple[int, str]:
    """An argparse failure: its exit code and message."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    return info.value.code, capsys.readouterr().err


@pytest.fixture
def server():
    server, port, fake = serve()
    yield fake, f"127.0.0.1:{port}"
    server.stop(0).wait()


# ---- parsing and validation ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["subscribe", "--keywords", "a", "--rect", "0", "0", "1", "1"], "--id"),
        (
            [
                "subscribe",
                "--id",
                "s",
                "--keywords",
                "a",
                "--expr",
                "a",
                "--rect",
                "0",
                "0",
                "1",
                "1",
            ],
            "not allowed with",
        ),
        (["subscribe", "--id", "s", "--keywords", "a"], "one of the arguments --rect --circle"),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--rect", "0", "0", "1"],
            "expected 4 arguments",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--circle", "x", "0", "1"],
            "--circle: invalid float value: 'x'",
        ),
        (["publish", "--keywords", "a"], "one of the arguments --point --rect"),
        (
            ["publish", "--keywords", "a", "--point", "1", "2", "--ttl", "soon"],
            "--ttl: invalid float value: 'soon'",
        ),
        (["move", "--id", "s"], "--point"),
        (["up", "--shards", "two"], "--shards: invalid int value: 'two'"),
    ],
)
def test_argument_errors_exit_2_naming_the_argument(capsys, argv, message):
    code, err = run_parse(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--rect", "200", "0", "1", "1"],
            "rect[0]=200.0: longitude must be in [-180, 180]",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--rect", "2", "0", "1", "1"],
            "rect[2]=1.0: max_lon < min_lon",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--circle", "0", "0", "0"],
            "circle[2]=0.0: radius must be in",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--circle", "0", "nan", "5"],
            "circle[1]=nan: must be finite",
        ),
        (
            ["subscribe", "--id", "s", "--expr", "ipad AND", "--rect", "0", "0", "1", "1"],
            "expr='ipad AND'",
        ),
        (
            ["subscribe", "--id", "", "--keywords", "a", "--rect", "0", "0", "1", "1"],
            "id='': must be 1-128 characters",
        ),
        (["publish", "--point", "1", "2"], "keywords=[]: a message needs at least one term"),
        (
            ["publish", "--keywords", "a", "--point", "1", "95"],
            "point[1]=95.0: latitude must be in [-90, 90]",
        ),
        (
            ["publish", "--keywords", "a", "--point", "1", "2", "--ttl", "-1"],
            "ttl=-1.0: must be >= 0 seconds",
        ),
        (
            ["move", "--id", "s", "--point", "181", "0"],
            "point[0]=181.0: longitude must be in [-180, 180]",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--polygon", "[[[0,0],[1,1],[1,0]]]"],
            "polygon[0]=[[0, 0], [1, 1], [1, 0]]: a ring needs at least 4 positions",
        ),
        (
            ["subscribe", "--id", "s", "--keywords", "a", "--polygon", "[[[0,0],[1"],
            "--polygon='[[[0,0],[1': not JSON",
        ),
        (
            ["subscribe", "--id", "s", "--expr", "a OR NOT b", "--rect", "0", "0", "1", "1"],
            "expr='a OR NOT b': the DNF clause 'NOT b' has no positive term",
        ),
        (
            [
                "subscribe",
                "--id",
                "s",
                "--keywords",
                "a",
                "--rect",
                "0",
                "0",
                "1",
                "1",
                "--predicate",
                "price < cheap",
            ],
            "predicates[0].value='cheap': must be a number",
        ),
        (
            [
                "subscribe",
                "--id",
                "s",
                "--keywords",
                "a",
                "--rect",
                "0",
                "0",
                "1",
                "1",
                "--predicate",
                "price ~ 5",
            ],
            "--predicate='price ~ 5': expected ATTR OP VALUE",
        ),
        (
            ["publish", "--keywords", "a", "--point", "1", "2", "--attr", "price"],
            "--attr='price': expected NAME=VALUE",
        ),
        (
            ["publish", "--keywords", "a", "--point", "1", "2", "--attr", "price=inf"],
            "attributes.price=inf: must be finite",
        ),
        (["up", "--shards", "0"], "shards=0: must be 1..1024"),
        (["up", "--port", "70000"], "port=70000: must be 0..65535"),
        (["up", "--timeout", "0"], "timeout=0.0: must be > 0 seconds"),
        (
            ["status", "--config", "/nonexistent/geopubsub.toml"],
            "config='/nonexistent/geopubsub.toml'",
        ),
    ],
)
def test_invalid_values_exit_2_naming_the_field_and_value(capsys, tmp_path, argv, message):
    # No server runs at the target: validation happens before any call or process start.
    code, out, err = run(capsys, *argv, "--data-dir", str(tmp_path), *(_dead_target(argv)))
    assert code == 2, err
    assert f"geopubsub: error: {message}" in err
    assert list(tmp_path.iterdir()) == []  # nothing started


def _dead_target(argv: list[str]) -> list[str]:
    return ["--target", "127.0.0.1:1"] if argv[0] in ("subscribe", "publish", "move") else []


def test_bad_environment_and_config_values_name_their_source(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEOPUBSUB_SHARDS", "many")
    code, _, err = run(capsys, "up", "--data-dir", str(tmp_path))
    assert code == 2
    assert "GEOPUBSUB_SHARDS='many': must be int" in err
    monkeypatch.delenv("GEOPUBSUB_SHARDS")
    config = tmp_path / "c.toml"
    config.write_text("shards = 2\nbatch_size = 3\n")
    code, _, err = run(capsys, "up", "--config", str(config), "--data-dir", str(tmp_path))
    assert code == 2
    assert "batch_size=3: unknown setting" in err


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_command_table_is_what_the_modules_register():
    """``cli.COMMANDS`` (what ``geopubsub --help`` lists without importing a command's module)
    names every command, in order, with the help line its module gives it; given a command,
    the parser has that command's own arguments."""
    registered = {c.dest: c.help for c in _commands(build_parser())._choices_actions}
    assert registered == {name: help_line for name, (_, help_line) in COMMANDS.items()}
    assert list(registered) == list(COMMANDS)
    for name in COMMANDS:
        own = _commands(build_parser([name])).choices[name]
        assert len(own._actions) > 1, name  # more than -h: the module registered it


def test_help_imports_no_command_module():
    code = (
        "import sys\n"
        "from geopubsub.tools import cli\n"
        "cli.build_parser(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('geopubsub.tools.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['geopubsub.tools.cli']"


def test_settings_precedence_file_env_flags(tmp_path, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text('shards = 3\nport = 7000\nredis_url = "redis://file:1/0"\n')
    monkeypatch.setenv("GEOPUBSUB_PORT", "7001")
    parser = build_parser()
    args = parser.parse_args(["up", "--config", str(config), "--shards", "5"])
    settings = cluster_cli.load_settings(args)
    assert (settings.shards, settings.port, settings.redis_url) == (5, 7001, "redis://file:1/0")
    args = parser.parse_args(["up", "--config", str(config), "--port", "0", "--data-dir", "d"])
    settings = cluster_cli.load_settings(args)
    assert (settings.shards, settings.port, settings.data_dir) == (3, 0, "d")


def test_shard_calls_is_channel_or_ray_and_a_bad_value_is_named():
    assert Settings().shard_calls == "channel"
    assert Settings.load(env={"GEOPUBSUB_SHARD_CALLS": "ray"}).shard_calls == "ray"
    with pytest.raises(ValidationError) as e:
        Settings.load(env={"GEOPUBSUB_SHARD_CALLS": "grpc"})
    assert e.value.field == "shard_calls" and e.value.value == "grpc"


def test_resource_limit_settings_load_like_the_others_and_bad_values_are_named():
    d = Settings()
    assert (d.max_ttl_s, d.max_live_messages, d.redis_maxmemory_mb) == (86400.0, 1_000_000, 4096)
    s = Settings.load(
        env={
            "GEOPUBSUB_MAX_TTL_S": "3600",
            "GEOPUBSUB_MAX_LIVE_MESSAGES": "10",
            "GEOPUBSUB_REDIS_MAXMEMORY_MB": "0",
        }
    )
    assert (s.max_ttl_s, s.max_live_messages, s.redis_maxmemory_mb) == (3600.0, 10, 0)
    bad = [
        ("max_ttl_s", 30 * 86400 + 1.0),  # past shard.limits.MAX_TTL_S
        ("max_ttl_s", 0.0),
        ("max_live_messages", 0),
        ("redis_maxmemory_mb", -1),
    ]
    for name, value in bad:
        with pytest.raises(ValidationError) as e:
            Settings(**{name: value})
        assert (e.value.field, e.value.value) == (name, value)


def test_target_comes_from_the_flag_then_cluster_json_then_the_default(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["stats", "--data-dir", str(tmp_path)])
    settings = cluster_cli.load_settings(args)
    assert cluster_cli._target(args, settings) == "127.0.0.1:50051"
    (tmp_path / "cluster.json").write_text(
        json.dumps({"coordinator": {"target": "127.0.0.1:4242"}})
    )
    assert cluster_cli._target(args, settings) == "127.0.0.1:4242"
    args = parser.parse_args(["stats", "--data-dir", str(tmp_path), "--target", "h:1"])
    assert cluster_cli._target(args, settings) == "h:1"


# ---- client commands against a real gRPC server -----------------------------------------------
def test_subscribe_publish_move_stats_unsubscribe(capsys, server, tmp_path):
    fake, target = server
    common = ["--target", target, "--data-dir", str(tmp_path)]
    code, out, _ = run(
        capsys,
        "subscribe",
        "--id",
        "s1",
        "--expr",
        "ipad AND sale",
        "--circle",
        "13.4",
        "52.5",
        "1000",
        "--moving",
        *common,
    )
    assert (code, out) == (0, "subscribed s1\n")
    sub = fake.subs["s1"]
    assert (sub.expr, sub.moving, sub.region.radius_m) == ("ipad AND sale", True, 1000.0)
    code, out, _ = run(
        capsys,
        "publish",
        "--keywords",
        "ipad",
        "--text",
        "big sale",
        "--point",
        "13.4",
        "52.5",
        "--ttl",
        "60",
        "--id",
        "m1",
        *common,
    )
    assert (code, out) == (0, "published m1: 1 matched\n")
    code, out, _ = run(
        capsys, "publish", "--keywords", "ipad", "--rect", "0", "0", "1", "1", *common
    )
    assert (code, out) == (0, "published auto2: 0 matched\n")
    code, out, _ = run(capsys, "move", "--id", "s1", "--point", "13.5", "52.6", *common)
    assert (code, out) == (0, "- s1 left-13.5-52.6\nmoved s1 to 13.5,52.6: 1 updates\n")
    code, out, _ = run(capsys, "stats", *common)
    assert code == 0
    assert out.splitlines()[0] == "subscriptions 1 (1 moving), live messages 0"
    assert "published 2, deliveries 2" in out
    code, out, _ = run(capsys, "stats", "--json", *common)
    stats = json.loads(out)
    assert (stats["subscriptions"], stats["published"], stats["shards"][0]["shard"]) == (
        "1",
        "2",
        0,
    )
    code, out, _ = run(capsys, "unsubscribe", "--id", "s1", *common)
    assert (code, out, fake.subs) == (0, "unsubscribed s1\n", {})
    code, out, err = run(capsys, "unsubscribe", "--id", "s1", *common)
    assert code == 1
    assert "geopubsub: error: NOT_FOUND: subscription 's1' not found" in err


def test_polygons_predicates_and_attributes_from_the_command_line(capsys, server, tmp_path):
    fake, target = server
    common = ["--target", target, "--data-dir", str(tmp_path)]
    code, out, _ = run(
        capsys,
        "subscribe",
        "--id",
        "p1",
        "--expr",
        "coffee AND NOT starbucks",
        "--polygon",
        "[[[0,0],[4,0],[4,1],[1,1],[1,4],[0,4],[0,0]]]",
        "--predicate",
        "price<=5",
        "--predicate",
        "category in food, drinks",
        *common,
    )
    assert (code, out) == (0, "subscribed p1\n")
    sub = fake.subs["p1"]
    assert sub.negated == (("starbucks",),) and len(sub.region.rings[0]) == 7
    assert [(p.attr, p.op, p.value) for p in sub.predicates] == [
        ("price", "<=", 5.0),
        ("category", "in", ("drinks", "food")),
    ]
    for point, attrs, matched in (
        (("0.5", "3"), ["price=4.5", "category=food"], 1),
        (("3", "3"), ["price=4.5", "category=food"], 0),  # in the box, not the L
        (("0.5", "3"), ["price=9", "category=food"], 0),
        (("0.5", "3"), ["category=food"], 0),  # no price: the predicate does not hold
    ):
        argv = ["publish", "--keywords", "coffee", "--point", *point, "--id", "m"]
        for a in attrs:
            argv += ["--attr", a]
        code, out, _ = run(capsys, *argv, *common)
        assert (code, out) == (0, f"published m: {matched} matched\n"), attrs
    run(capsys, "unsubscribe", "--id", "p1", *common)
    # a ranked one: its keywords scored by weight, the region counting alpha
    code, out, _ = run(
        capsys,
        "subscribe",
        "--id",
        "r1",
        "--keywords",
        "cafe",
        "latte",
        "--rect",
        "0",
        "0",
        "2",
        "2",
        "--threshold",
        "0.6",
        "--alpha",
        "0.2",
        "--weight",
        "cafe=3",
        *common,
    )
    assert (code, out) == (0, "subscribed r1\n")
    r = fake.subs["r1"]
    assert (r.threshold, r.alpha, r.weights) == (0.6, 0.2, (3.0, 1.0))
    for kws, point, matched in (
        (["cafe"], ("1", "1"), 1),  # 0.2 + 0.8 * 3/4 = 0.8
        (["latte"], ("1", "1"), 0),  # 0.2 + 0.8 / 4 = 0.4
        (["cafe", "latte"], ("9", "9"), 1),  # outside: 0.8 * 1
        (["latte"], ("9", "9"), 0),  # outside: 0.8 / 4 = 0.2
    ):
        code, out, _ = run(capsys, "publish", "--keywords", *kws, "--point", *point, *common)
        assert (code, out.split(": ")[1]) == (0, f"{matched} matched\n"), kws
    # top-k (paper 001): two subscriptions at points, a publish to the best one
    for sid, lon, w in (("t1", "0", "3"), ("t2", "50", "1")):
        pred = json.dumps({"attr": "price", "op": "<=", "value": 5, "weight": float(w)})
        argv = ["subscribe", "--id", sid, "--point", lon, "0", "--predicate", pred]
        argv += ["--predicate", "category=food", "--alpha", "0.3"]
        code, out, _ = run(capsys, *argv, *common)
        assert (code, out) == (0, f"subscribed {sid}\n")
    t1 = fake.subs["t1"]
    assert t1.topk and t1.alpha == 0.3 and [p.weight for p in t1.predicates] == [0.75, 0.25]
    argv = ["publish", "--point", "49", "0", "--attr", "category=food", "--top-k", "1"]
    code, out, _ = run(capsys, *argv, "--id", "e1", *common)
    assert (code, out) == (0, "published e1: 1 matched\n")
    assert [d.message.id for d in fake.logs["t2"]] == ["e1"] and not fake.logs.get("t1")
    code, _, err = run(capsys, "publish", "--point", "0", "0", "--top-k", "1001", *common)
    assert code == 2 and "top_k=1001" in err, err


def test_a_subscription_without_a_condition_is_refused_naming_the_flags(capsys, tmp_path):
    """(Not argparse's: a top-k subscription, ``--point``, has no keywords.)"""
    argv = ["subscribe", "--id", "s", "--rect", "0", "0", "1", "1", "--data-dir", str(tmp_path)]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "give exactly one of 'keywords' and 'expr'" in err, err


def test_unreachable_coordinator_exits_1_with_a_hint(capsys, tmp_path):
    code, _, err = run(capsys, "stats", "--target", "127.0.0.1:1", "--data-dir", str(tmp_path))
    assert code == 1
    assert "geopubsub: error: UNAVAILABLE" in err
    assert "is a cluster running at 127.0.0.1:1?" in err


def test_subscribe_follow_prints_deliveries_until_ctrl_c(server, tmp_path):
    fake, target = server
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "geopubsub.tools.cli",
            "subscribe",
            "--target",
            target,
            "--data-dir",
            str(tmp_path),
            "--id",
            "s1",
            "--keywords",
            "ipad",
            "--rect",
            "0",
            "0",
            "10",
            "10",
            "--follow",
        ],
        # Ctrl-C must reach it even when the tests run in the background (`make test &`
        # starts them with SIGINT ignored, and a child would inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout.readline() == "subscribed s1\n"
        with GeoPubSubClient(target) as client:
            client.publish(["ipad", "sale"], point=(1, 2), id="m1")
            client.publish(["other"], point=(1, 2), id="m2")
            client.publish(["ipad"], rect=(1, 1, 2, 2), id="m3")
        assert follow.stdout.readline() == "+ s1 m1 ipad,sale @1,2\n"
        assert follow.stdout.readline() == "+ s1 m3 ipad @1,1,2,2\n"
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=20)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert out == ""


# ---- end to end with the real coordinator ----------------------------------------------------
@pytest.mark.e2e
def _is_shard(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::ShardActor")
    except OSError:
        return False


@pytest.mark.e2e
@pytest.mark.slow
def test_up_detached_status_down_with_the_real_coordinator(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GEOPUBSUB_") and k != "RAY_worker_niceness"
    }
    cli = [sys.executable, "-m", "geopubsub.tools.cli"]
    where = ["--data-dir", str(tmp_path)]

    def geopubsub(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cli, *argv, *where], capture_output=True, text=True, env=env, timeout=timeout
        )

    up = geopubsub("up", "--detach", "--port", "0", "--shards", "2", timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        manifest = local.read_manifest(tmp_path)
        target = manifest["coordinator"]["target"]
        assert f"SERVING at {target}: 2 shards" in up.stdout
        status = geopubsub("status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"{target}: SERVING" in status.stdout
        assert "shard 1:" in status.stdout
        # the shards run at the coordinator's priority, not Ray's default nice 15 for workers
        shards = [p for p in session_members(manifest["coordinator"]["pid"]) if _is_shard(p)]
        assert len(shards) == 2
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in shards] == [0, 0]

        subscribe = geopubsub(
            "subscribe", "--id", "s1", "--keywords", "ipad", "--rect", "-10", "-10", "10", "10"
        )
        assert subscribe.returncode == 0, subscribe.stderr
        publish = geopubsub(
            "publish", "--keywords", "ipad", "sale", "--point", "1", "2", "--id", "m1"
        )
        assert (publish.returncode, publish.stdout) == (0, "published m1: 1 matched\n"), (
            publish.stderr
        )
        # Rejected by the server (s1 is not moving): INVALID_ARGUMENT, exit 2.
        move = geopubsub("move", "--id", "s1", "--point", "1", "1")
        assert move.returncode == 2, move.stdout + move.stderr
        assert "geopubsub: error: INVALID_ARGUMENT" in move.stderr
        with GeoPubSubClient(target) as client:
            stream = client.stream_results("s1")
            first = next(stream)
            stream.close()
            assert (first.sequence, first.kind, first.message_id, first.location) == (
                1,
                "+",
                "m1",
                (1.0, 2.0),
            )
    finally:
        down = geopubsub("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    coordinator, redis_info = manifest["coordinator"], manifest["redis"]
    assert not alive(coordinator["pid"])
    assert not alive(redis_info["pid"])
    assert session_members(coordinator["pid"]) == []  # no Ray process left behind
    assert not (tmp_path / "cluster.json").exists()
    assert geopubsub("status").returncode == 1

    # A restarted cluster still has the subscription (Redis data under the data dir).
    up = geopubsub("up", "--detach", "--port", "0", timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        with GeoPubSubClient(local.read_manifest(tmp_path)["coordinator"]["target"]) as client:
            assert client.get_subscription("s1").keywords == ("ipad",)
    finally:
        assert geopubsub("down", timeout=120).returncode == 0
