"""Fixtures for the reliability tests (tests/reliability/): crash consistency and floods.

The nasd binary is built once per session (``cargo build --release``) when
``target/release/nasd`` (or ``$NASD_BINARY``) is missing.
"""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`
sys.path.insert(0, str(Path(__file__).resolve().parent))      # crashlib, floodlib

from rig.nasd import REPO, default_binary  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def nasd_binary():
    b = default_binary()
    if not b.exists():
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    assert b.exists(), f"{b} missing after cargo build --release"
    return b
