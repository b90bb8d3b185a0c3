"""Workload files: streaming, `file:line: reason` errors, skip versus --strict."""

from __future__ import annotations

import pytest

from shard.errors import ValidationError
from shard.workload import read_messages, read_subscriptions, write_jsonl


def test_bad_lines_are_reported_and_skipped(tmp_path):
    p = tmp_path / "subs.jsonl"
    p.write_bytes(
        b'{"id": "s1", "keywords": ["a"], "rect": [0, 0, 1, 1]}\n'
        b"not json\n"
        b"\n"
        b'{"id": "s2", "keywords": ["a"], "rect": [5, 0, 1, 1]}\n'
        b'{"id": "s3", "keywords": ["\xff"], "rect": [0, 0, 1, 1]}\n'
        b"[1, 2]\n"
        b'{"id": "s4", "keywords": ["b"], "circle": [0, 0, 10]}\n'
    )
    errors: list[str] = []
    subs = list(read_subscriptions(p, errors=errors))
    assert [s.id for s in subs] == ["s1", "s4"]
    assert len(errors) == 4
    assert errors[0].startswith(f"{p}:2: ")
    assert errors[1].startswith(f"{p}:4: rect[2]=1")
    assert errors[2].startswith(f"{p}:5: ") and "UTF-8" in errors[2]
    assert errors[3].startswith(f"{p}:6: ") and "object" in errors[3]


def test_strict_stops_at_first_bad_line(tmp_path):
    p = tmp_path / "msgs.jsonl"
    p.write_text(
        '{"id": "m1", "keywords": ["a"], "point": [0, 0]}\n{"id": "m2", "keywords": ["a"], "point": [0, 99]}\n'
    )
    it = read_messages(p, strict=True)
    assert next(it).id == "m1"
    with pytest.raises(ValidationError) as e:
        next(it)
    assert e.value.field == f"{p}:2" and "point[1]" in str(e.value)


def test_write_then_read(tmp_path):
    p = tmp_path / "w.jsonl"
    n = write_jsonl(p, [{"id": f"m{i}", "text": "ünïcode", "point": [0, 0]} for i in range(3)])
    assert n == 3
    assert [m.terms for m in read_messages(p)] == [("ünïcode",)] * 3
