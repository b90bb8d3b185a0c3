"""The index core and the shard's state load no ray, grpc, pyspark or redis module (checked in a
fresh interpreter); only ``shard.host.actor`` may import Ray. Every module, the tests' own
included, imports at its top: only the heavy optional packages (ray, pyspark, matplotlib) are imported inside
the functions that use them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("ray", "grpc", "pyspark", "redis")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shard", "coordinator", "loader", "deploy", "geopubsub")
TESTS = ROOT / "tests"
GENERATED = ROOT / "geopubsub" / "v1"
"""The generated gRPC stubs: not checked."""
IN_FUNCTION_ALLOWED = frozenset({"ray", "pyspark", "matplotlib"})
"""The top-level packages a function may import itself: heavy and optional, loaded where used
(matplotlib: 0.26 s, only for the plots of ``bench compare``; every CLI command would pay it)."""


def test_core_imports_no_io_frameworks():
    code = (
        "import sys\n"
        "import shard.aptree, shard.brute, shard.invlist, shard.model, shard.expr, shard.terms, shard.geometry, shard.errors\n"
        "import shard.applus, shard.state, shard.ops, shard.partition_map, shard.metadata_codec\n"
        "import shard.attributes, shard.predicates, shard.polygon, shard.conditions, shard.residual\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m.endswith('_pb2'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core loaded: {out.stdout.strip()}"


def test_client_side_imports_do_not_load_numba_but_set_its_cache():
    """The client, the CLI and the supervisor import ``shard`` (errors, model) without numba;
    numba, imported later or earlier, uses the package's hash-keyed kernel cache."""
    code = (
        "import os, sys\n"
        "os.environ.pop('NUMBA_CACHE_DIR', None)\n"
        "import geopubsub.client, deploy.supervise\n"
        "print('numba' in sys.modules)\n"
        "import numba\n"
        "print(numba.config.CACHE_DIR == os.environ['NUMBA_CACHE_DIR'], '/geopubsub/numba/' in numba.config.CACHE_DIR)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["False", "True", "True"], out.stdout
    first = "import numba, shard\nprint('/geopubsub/numba/' in numba.config.CACHE_DIR)\n"
    out = subprocess.run(
        [sys.executable, "-c", first], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "True", out.stdout


def in_function_imports(source: str) -> list[tuple[int, str, str]]:
    """``(line, module, function)`` of every import statement inside a function or method of
    ``source`` (nested ones included), ``module`` as written (``from . import x``: ``.``)."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if function is not None and isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name, function) for alias in child.names)
            elif function is not None and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or ""), function))
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, child.name if inner else function)

    visit(ast.parse(source), None)
    return found


def test_in_function_imports_are_found():
    source = (
        "import json\n"
        "def f():\n    import ray\n    from pyspark.sql import functions\n"
        "class C:\n    async def m(self):\n        def g():\n            import os.path\n"
        "        from . import x\n"
    )
    assert in_function_imports(source) == [
        (3, "ray", "f"),
        (4, "pyspark.sql", "f"),
        (8, "os.path", "g"),
        (9, ".", "m"),
    ]


def checked_modules() -> list[Path]:
    """The packages' modules (but the generated stubs) and the tests' own (``tests/*.py``)."""
    paths = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    paths = [p for p in paths if not p.is_relative_to(GENERATED)]
    return paths + sorted(TESTS.glob("*.py"))


def test_the_packages_and_the_tests_are_checked():
    checked = {p.relative_to(ROOT).as_posix() for p in checked_modules()}
    assert {"shard/host/actor.py", "tests/conftest.py", "tests/clusters.py"} <= checked
    assert not any(p.startswith("geopubsub/v1/") for p in checked)


def test_imports_are_at_module_level_but_ray_pyspark_and_matplotlib():
    """A module says what it needs at its top; an import inside a function hides a dependency
    (or an import cycle, or a layer crossed the wrong way) until that function runs. The tests
    follow the same rule (an import in a ``subprocess`` code string is text, not an import)."""
    bad = []
    for path in checked_modules():
        rel = path.relative_to(ROOT).as_posix()
        for line, module, function in in_function_imports(path.read_text(encoding="utf-8")):
            if module.split(".")[0] in IN_FUNCTION_ALLOWED:
                continue
            bad.append(f"{rel}:{line}: {module} (in {function})")
    assert not bad, (
        "imported inside a function (import it at the top of the module; only "
        f"{sorted(IN_FUNCTION_ALLOWED)} may be imported where used):\n" + "\n".join(bad)
    )
