"""Running the ``geopubsub`` console script as users do: a real process, from the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_geopubsub(*argv: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m geopubsub.tools.cli ARGV...`` in the repository with ``env``; output captured as
    text."""
    return subprocess.run(
        [sys.executable, "-m", "geopubsub.tools.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
