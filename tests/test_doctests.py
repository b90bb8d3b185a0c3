"""The examples in the docstrings run: every module of the project's packages that has one
(``>>>``) is found from the source, imported and ``doctest``-ed; an example that no longer holds
fails here."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shard", "coordinator", "loader", "deploy", "geopubsub")


def _modules_with_examples() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            if ">>> " in path.read_text(encoding="utf-8"):
                rel = path.relative_to(ROOT).with_suffix("")
                out.append(".".join(p for p in rel.parts if p != "__init__"))
    return out


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert len(MODULES) >= 30 and "shard.state" in MODULES and "geopubsub.convert" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 1, f"{name}: '>>>' found but no example ran"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
