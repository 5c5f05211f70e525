"""Host-side integration tests (tests/integration/); tests/conftest.py builds nasd.

Fixtures shared by the test modules (a module defines its own ``srv`` where it needs a
different export):

- ``srv``: one nasd per test module, serving a fresh export read-write with
  ``--no-root-squash``;
- ``c``: an NFSv3 client of it as root, with ``c.export_root`` the export's root handle.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`, `integration._common`

from rig.nasd import Nasd  # noqa: E402
from rig.rpc import Nfs3Client  # noqa: E402
from integration._common import ROOT, make_export  # noqa: E402


@pytest.fixture(scope="module")
def srv(request, tmp_path_factory):
    export = make_export(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    with Nasd(export, args=["--no-root-squash"]) as n:
        yield n


@pytest.fixture
def c(srv):
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as cl:
        cl.export_root = cl.root(srv.export_dir)
        yield cl
