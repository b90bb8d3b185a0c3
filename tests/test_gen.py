"""The workload generator: deterministic, valid, shaped as documented; CLI errors name the option."""

from __future__ import annotations

import json

import pytest

from geopubsub.tools.cli import main
from geopubsub.tools.gen import generate
from shard.model import message_from_dict, subscription_from_dict


def test_deterministic_and_valid(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    opts = {"dnf_share": 0.5, "circle_share": 0.3, "region_msg_share": 0.2, "moving_share": 0.1}
    generate(2000, 500, a, seed=3, **opts)
    generate(2000, 500, b, seed=3, **opts)
    generate(2000, 500, c, seed=4, **opts)
    assert (a / "subs.jsonl").read_bytes() == (b / "subs.jsonl").read_bytes()
    assert (a / "msgs.jsonl").read_bytes() == (b / "msgs.jsonl").read_bytes()
    assert (a / "subs.jsonl").read_bytes() != (c / "subs.jsonl").read_bytes()
    subs = [json.loads(line) for line in (a / "subs.jsonl").read_text().splitlines()]
    msgs = [json.loads(line) for line in (a / "msgs.jsonl").read_text().splitlines()]
    assert len(subs) == 2000 and len(msgs) == 500
    parsed = [subscription_from_dict(d) for d in subs]  # every line is valid
    [message_from_dict(d) for d in msgs]
    dnf = sum("expr" in d for d in subs) / len(subs)
    circles = sum("circle" in d for d in subs) / len(subs)
    assert 0.35 < dnf < 0.65 and 0.2 < circles < 0.4
    assert 0.1 < sum("rect" in d for d in msgs) / len(msgs) < 0.3
    assert all(1 <= len(d["keywords"]) <= 5 for d in subs if "keywords" in d)
    assert all(sum(len(c) for c in s.clauses) >= 1 for s in parsed)
    mean_terms = sum(len(d["keywords"]) for d in msgs) / len(msgs)
    assert 7 < mean_terms < 11
    space = 360.0 * 180.0
    areas = [
        (r[2] - r[0]) * (r[3] - r[1]) / space for r in (d["rect"] for d in subs if "rect" in d)
    ]
    assert max(areas) <= 0.01 + 1e-9
    unclipped = [x for x in areas if x > 0.0001 - 1e-9]
    assert len(unclipped) > 0.8 * len(areas)


@pytest.mark.parametrize("text", ["synthetic", "places"])
def test_conditions_of_each_kind_and_the_plain_part_unchanged(tmp_path, text):
    """NOT, polygons, predicates and ranked subscriptions at their shares, every line valid,
    messages with attributes; the subscriptions without any are those of the plain workload
    (the conditions draw from a stream of their own)."""
    plain, mixed = tmp_path / "p", tmp_path / "m"
    main(["gen", "--text", text, "--subs", "3000", "--msgs", "300", "--seed", "2", "--out", str(plain)])  # fmt: skip
    main(
        ["gen", "--text", text, "--subs", "3000", "--msgs", "300", "--seed", "2", "--out",
         str(mixed), "--not-share", "0.1", "--polygon-share", "0.1", "--predicate-share", "0.1",
         "--ranked-share", "0.1"]
    )  # fmt: skip
    subs = [
        subscription_from_dict(json.loads(x))
        for x in (mixed / "subs.jsonl").read_text().splitlines()
    ]
    msgs = [
        message_from_dict(json.loads(x)) for x in (mixed / "msgs.jsonl").read_text().splitlines()
    ]
    share = {
        "not": sum(s.negated is not None for s in subs) / len(subs),
        "polygon": sum(hasattr(s.region, "rings") for s in subs) / len(subs),
        "predicates": sum(bool(s.predicates) for s in subs) / len(subs),
        "ranked": sum(s.threshold is not None for s in subs) / len(subs),
    }
    assert all(0.04 < v < 0.16 for v in share.values()), share
    assert sum(bool(m.attributes) for m in msgs) > 0.8 * len(msgs)
    before = [json.loads(x) for x in (plain / "subs.jsonl").read_text().splitlines()]
    after = [json.loads(x) for x in (mixed / "subs.jsonl").read_text().splitlines()]
    kept = [a for a in after if a == before[int(a["id"][1:])]]
    assert len(kept) > 0.5 * len(after)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--subs", "1", "--msgs", "1", "--ranked-share", "2"], "--ranked-share"),
        (["--subs", "-1", "--msgs", "1"], "--subs"),
        (["--subs", "1", "--msgs", "1", "--dnf-share", "1.5"], "--dnf-share"),
        (["--subs", "1", "--msgs", "1", "--space", "10,0,5,1"], "--space"),
        (["--subs", "1", "--msgs", "1", "--min-area", "0.5", "--max-area", "0.1"], "--min-area"),
    ],
)
def test_cli_errors_name_the_option(tmp_path, capsys, args, needle):
    assert main(["gen", "--out", str(tmp_path), *args]) == 2
    assert needle in capsys.readouterr().err
