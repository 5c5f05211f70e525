"""Reliability tests (tests/reliability/): crash consistency, power loss, floods and write
errors; tests/conftest.py builds nasd."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`
sys.path.insert(0, str(Path(__file__).resolve().parent))      # crashlib, floodlib
