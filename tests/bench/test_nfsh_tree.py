"""The nfsh commands behind the metadata suite's rename and real-tree jobs, against nasd:

    pytest tests/bench/test_nfsh_tree.py

rename-loop / remove-loop with a name prefix, and put-tree ("untar"), copy-tree
("cp -r") and remove-tree ("rm -rf"): the counts they report and what lands in
the export (content, symlinks, permissions, nothing left behind).
"""

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig.nfsh import nfsh, NfshError  # noqa: E402


def snapshot(root: Path):
    """{relative path: (kind, content / link target, permission bits)}"""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p), None)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None, None)
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "sub" / "deeper").mkdir(parents=True)
    (src / "empty-dir").mkdir()
    (src / "a.py").write_text("print('a')\n")
    (src / "pkg" / "__init__.py").write_bytes(b"")
    (src / "pkg" / "sub" / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 123))
    (src / "pkg" / "sub" / "deeper" / "x.txt").write_text("x" * 5000)
    tool = src / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.symlink("../a.py", src / "pkg" / "link.py")
    os.symlink("/nonexistent/target", src / "dangling")
    return src


@pytest.fixture
def srv(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    with Nasd(export, args=["--no-root-squash"]) as n:
        yield n


def test_put_copy_remove_tree(tree, srv):
    export = Path(srv.export_dir)
    want = snapshot(tree)
    files = sum(1 for v in want.values() if v[0] == "file")
    dirs = 1 + sum(1 for v in want.values() if v[0] == "dir")
    links = sum(1 for v in want.values() if v[0] == "link")
    size = sum(len(v[1]) for v in want.values() if v[0] == "file")

    r = nfsh(srv.url(), "put-tree", str(tree), "/untar")
    assert r["ok"] and r["op"] == "put-tree"
    assert (r["files"], r["dirs"], r["links"], r["skipped"]) == (files, dirs, links, 0), r
    assert r["ops"] == files + dirs + links and r["bytes"] == size and r["seconds"] > 0
    assert snapshot(export / "untar") == want

    r = nfsh(srv.url(), "copy-tree", "/untar", "/copy")
    assert r["op"] == "copy-tree"
    assert (r["files"], r["dirs"], r["links"], r["bytes"]) == (files, dirs, links, size), r
    assert snapshot(export / "copy") == want

    r = nfsh(srv.url(), "remove-tree", "/untar")
    assert r["op"] == "remove-tree" and "bytes" not in r
    assert (r["files"], r["dirs"], r["links"], r["ops"]) == (files, dirs, links, files + dirs + links), r
    assert not (export / "untar").exists()
    assert snapshot(export / "copy") == want  # the other tree is untouched
    nfsh(srv.url(), "remove-tree", "/copy")
    assert os.listdir(export) == []


def test_tree_commands_fail_cleanly(tree, srv):
    with pytest.raises(NfshError) as e:
        nfsh(srv.url(), "copy-tree", "/missing", "/copy")
    assert e.value.errno == 2
    with pytest.raises(NfshError) as e:
        nfsh(srv.url(), "put-tree", str(tree / "nonexistent"), "/x")
    assert e.value.result.get("local") is True and e.value.errno == 2
    with pytest.raises(NfshError) as e:
        nfsh(srv.url(), "remove-tree", "/")
    assert e.value.returncode == 2


def test_rename_loop_then_remove_loop_with_prefix(srv):
    export = Path(srv.export_dir)
    nfsh(srv.url(), "mkdir", "/flat")
    assert nfsh(srv.url(), "create-loop", "/flat", 50)["ops"] == 50
    r = nfsh(srv.url(), "rename-loop", "/flat", 50)
    assert r["ok"] and r["op"] == "rename" and r["ops"] == 50 and r["ops_per_sec"] > 0
    assert sorted(os.listdir(export / "flat")) == [f"r{i:08d}" for i in range(50)]
    # and back, with explicit prefixes
    nfsh(srv.url(), "rename-loop", "/flat", 50, "r", "g")
    assert sorted(os.listdir(export / "flat")) == [f"g{i:08d}" for i in range(50)]
    assert nfsh(srv.url(), "readdir", "/flat")["count"] == 50
    with pytest.raises(NfshError):
        nfsh(srv.url(), "remove-loop", "/flat", 50)  # no f00000000 any more
    assert nfsh(srv.url(), "remove-loop", "/flat", 50, "g")["ops"] == 50
    assert os.listdir(export / "flat") == []
