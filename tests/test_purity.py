"""The index core and the shard's state load no ray, grpc, pyspark or redis module (checked in a
fresh interpreter); only ``shard.host.actor`` may import Ray."""

from __future__ import annotations

import os
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
