"""The index core and the shard's state load no ray, grpc, pyspark or redis module (checked in a
fresh interpreter); only ``shard.actor`` may import Ray."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("ray", "grpc", "pyspark", "redis")


def test_core_imports_no_io_frameworks():
    code = (
        "import sys\n"
        "import shard.aptree, shard.brute, shard.invlist, shard.model, shard.expr, shard.terms, shard.geometry, shard.errors\n"
        "import shard.applus, shard.state, shard.ops, shard.partition_map, shard.metadata_codec\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m.endswith('_pb2'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core loaded: {out.stdout.strip()}"
