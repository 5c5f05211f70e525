"""Session-wide rules for every test under tests/.

- The nasd binary is built (``cargo build --release``) before any test module is
  collected, so no module sees a missing or stale binary. ``$NASD_BINARY`` names another
  build to test instead, and nothing is built then.
- Under CI (``$CI`` set) a skipped test fails: CI installs everything the suite needs, so
  a skip there means a check silently did not run.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ -> `import rig`

from rig.nasd import REPO, default_binary  # noqa: E402


def pytest_sessionstart(session):
    if os.environ.get("NASD_BINARY"):
        if not default_binary().exists():
            raise pytest.UsageError(f"NASD_BINARY={default_binary()} does not exist")
        return
    # Cheap when nothing changed; otherwise the tests would run an old build.
    subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    if not default_binary().exists():
        raise pytest.UsageError(f"{default_binary()} missing after cargo build --release")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {reason}"
