"""The shard: the index core (AP-Tree, domain model, brute-force oracle) and, in ``shard.host``,
the process edge that hosts it (its Ray actor, the rounds' connection, process tuning).

Everything under ``shard`` but ``shard.host`` is pure: no network, no ray/grpc/pyspark/redis.
The one thing done at import is choosing where numba keeps its compiled kernels (below), without
importing numba.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

KERNEL_CACHE_KEEP_S = 7 * 86400
"""Cache directories of other versions of the package unused this long are removed."""


def _kernel_cache_dir() -> Path:
    """numba's on-disk cache (``cache=True``) is keyed by each function's own source file, so a
    kernel whose callee in another file changed would load stale machine code after an upgrade
    (a documented numba limitation; it happened here: wrong leaf records until the cache was
    cleared). The cache directory is therefore keyed by the source of the whole package:
    ``$XDG_CACHE_HOME/geopubsub/numba/<hash>``. ``NUMBA_CACHE_DIR`` set by the user wins."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "geopubsub" / "numba"
    here = base / digest.hexdigest()[:16]
    try:
        here.mkdir(parents=True, exist_ok=True)
        os.utime(here)
        for other in base.iterdir():
            if other != here and time.time() - other.stat().st_mtime > KERNEL_CACHE_KEEP_S:
                shutil.rmtree(other, ignore_errors=True)
    except OSError:  # a read-only home: numba falls back to its own locations
        pass
    return here


if not os.environ.get("NUMBA_CACHE_DIR"):
    # numba reads the variable when it is imported: a process that never compiles (the client,
    # the CLI, the supervisor) does not import it (~60 MB, ~0.5 s). Child processes inherit it.
    if "numba" in sys.modules:
        sys.modules["numba"].config.CACHE_DIR = str(_kernel_cache_dir())
    else:
        os.environ["NUMBA_CACHE_DIR"] = str(_kernel_cache_dir())
