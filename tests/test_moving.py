"""Event streams, ``gen --moving`` and ``bench moving``: the AP+-Tree and the grid baseline, two
independent implementations, must produce the same update stream."""

from __future__ import annotations

import json

import pytest

from geopubsub.tools.cli import main
from shard.errors import ValidationError
from shard.events import event_from_dict, read_events


def _updates(path) -> dict[float, list[str]]:
    by_t: dict[float, list[str]] = {}
    for line in path.read_text().splitlines():
        t, rest = line.split("\t", 1)
        by_t.setdefault(float(t), []).append(rest)
    return {t: sorted(v) for t, v in by_t.items()}


def test_gen_moving_and_both_indexes_agree(tmp_path, capsys):
    args = ["gen", "--moving", "--subs", "3000", "--steps", "12", "--msgs-per-step", "150"]
    args += ["--velocity-kmh", "400", "--step-s", "60", "--lifetime-steps", "3"]
    args += ["--circle-share", "0.3", "--dnf-share", "0.3", "--region-msg-share", "0.2"]
    assert main([*args, "--out", str(tmp_path), "--seed", "4"]) == 0
    capsys.readouterr()
    events = list(read_events(tmp_path / "events.jsonl", strict=True))
    assert {e.op for e in events} == {"publish", "move"}
    assert all(a.t <= b.t for a, b in zip(events, events[1:], strict=False))
    reports = {}
    for index in ("applus", "naive"):
        out = tmp_path / f"{index}.tsv"
        cmd = ["bench", "moving", "--events", str(tmp_path / "events.jsonl")]
        cmd += ["--subs", str(tmp_path / "subs.jsonl"), "--index", index, "--json"]
        cmd += ["--out", str(out), "--batch", "7"]
        assert main(cmd) == 0
        reports[index] = json.loads(capsys.readouterr().out)
    a, n = reports["applus"], reports["naive"]
    assert a["moves"] == n["moves"] > 1000
    assert a["publishes"] == 1800
    assert a["updates"] == n["updates"] > 0
    assert _updates(tmp_path / "applus.tsv") == _updates(tmp_path / "naive.tsv")
    signs = {line.split("\t")[2] for line in (tmp_path / "applus.tsv").read_text().splitlines()}
    assert signs == {"+", "-"}


@pytest.mark.parametrize(
    "obj, field",
    [
        ({"t": -1, "op": "move", "id": "s", "point": [0, 0]}, "t"),
        ({"t": 1, "op": "jump", "id": "s"}, "op"),
        ({"t": 1, "op": "move", "id": "s", "point": [0, 95]}, "point[1]"),
        ({"t": 1, "op": "move", "id": "s"}, "point"),
        (
            {
                "t": 1,
                "op": "publish",
                "msg": {"id": "m", "keywords": ["a"], "point": [0, 0], "ttl": -2},
            },
            "msg.ttl",
        ),
        (
            {"t": 1, "op": "subscribe", "sub": {"id": "s", "keywords": [], "rect": [0, 0, 1, 1]}},
            "sub.keywords",
        ),
        ({"t": 1, "op": "unsubscribe", "id": "s", "extra": 1}, "extra"),
    ],
)
def test_bad_events_name_the_field(obj, field):
    with pytest.raises(ValidationError) as e:
        event_from_dict(obj)
    assert e.value.field == field


def test_bad_lines_are_reported_and_skipped(tmp_path):
    p = tmp_path / "ev.jsonl"
    lines = [
        {"t": 0, "op": "unsubscribe", "id": "a"},
        {"t": 5, "op": "unsubscribe", "id": "b"},
        {"t": 4, "op": "unsubscribe", "id": "c"},
        {"t": 6, "op": "move", "id": "d", "point": [200, 0]},
        {"t": 7, "op": "unsubscribe", "id": "e"},
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    errors: list[str] = []
    got = [e.id for e in read_events(p, errors=errors)]
    assert got == ["a", "b", "e"]
    assert [e.split(": ")[0] for e in errors] == [f"{p}:3", f"{p}:4", f"{p}:6"]
    assert "goes back in time" in errors[0] and "point[0]" in errors[1]
