"""Host-side integration tests (tests/integration/); tests/conftest.py builds nasd."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`, `integration._common`
