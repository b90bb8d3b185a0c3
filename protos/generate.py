"""Generate the Python code of the gRPC API from ``protos/geopubsub/v1/geopubsub.proto``.

Run from anywhere: ``.venv/bin/python protos/generate.py`` writes ``geopubsub_pb2.py``,
``geopubsub_pb2.pyi`` and ``geopubsub_pb2_grpc.py`` into ``geopubsub/v1/``; ``--out DIR`` writes
them under ``DIR/geopubsub/v1/`` instead (``tests/test_proto.py`` uses it to check that the
checked-in files are current). The output depends on the protoc bundled with grpcio-tools, so the
script refuses any other version than the pinned one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.76.0"
"""Pinned like grpcio in pyproject.toml: the generated code names the versions it needs at run time."""

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTOS = ("geopubsub/v1/geopubsub.proto",)
GENERATED = ("geopubsub_pb2.py", "geopubsub_pb2.pyi", "geopubsub_pb2_grpc.py")
"""The files written into ``geopubsub/v1/`` for each proto."""


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on every proto; return the files written under ``out``."""
    found = importlib.metadata.version("grpcio-tools")
    if found != GRPCIO_TOOLS_VERSION:
        raise SystemExit(f"grpcio-tools {GRPCIO_TOOLS_VERSION} is required, found {found}")
    from grpc_tools import protoc  # after the version check: it is a dev-only dependency

    well_known = Path(protoc.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(PROTO_ROOT / p) for p in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return [out / Path(p).parent / name for p in PROTOS for name in GENERATED]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: the repo)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    sys.exit(main())
