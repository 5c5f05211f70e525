"""Shared helpers for tests/integration (imported as ``integration._common``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.rpc import auth_sys  # noqa: E402

ROOT = auth_sys(0, 0, machine="itest")


def make_export(tmp_path: Path, name: str = "export", mode: int = 0o755) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, mode)
    return d


def write_exports(tmp_path: Path, lines) -> Path:
    f = tmp_path / "exports"
    f.write_text("".join(line + "\n" for line in lines))
    return f
