"""Real client (libnfs: nfs-cp, nfs-ls, nfsh) against nasd: bulk data and large directories."""

import hashlib
from collections import Counter
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig.nfsh import (exerciser_lines, nfsh_popen, nfsh_binary, nfsh_together,  # noqa: E402
                      nsx_tree_problems)
from rig import libnfs_tools  # noqa: E402
from rig.libnfs_tools import nfs_cp, nfs_ls  # noqa: E402
from integration._common import make_export  # noqa: E402

pytestmark = pytest.mark.skipif(not libnfs_tools.tools_available(),
                                reason="libnfs-utils (nfs-ls/nfs-cp) not installed")

BIG_DIR_ENTRIES = 100_000
CONCURRENT_CREATES = 2_000


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    export = make_export(tmp_path_factory.mktemp("libnfs"), mode=0o777)
    with Nasd(export, args=["--no-root-squash"]) as n:
        yield n


@pytest.fixture(scope="module")
def big_dir(srv):
    """export/big with 100,000 empty files e000000..e099999, made directly on disk."""
    d = Path(srv.export_dir) / "big"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(BIG_DIR_ENTRIES):
            os.close(os.open(f"e{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    names = {f"e{i:06d}" for i in range(BIG_DIR_ENTRIES)}
    return d, names


def test_nfs_cp_256mib_roundtrip(srv, tmp_path):
    src = tmp_path / "src.bin"
    with open(src, "wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
    want = _sha256(src)
    url = f"nfs://127.0.0.1{srv.export_dir}/big.bin?nfsport={srv.port}&mountport={srv.port}&version=3"
    assert nfs_cp(src, url, timeout=180) in (256 << 20, -1)
    on_disk = Path(srv.export_dir) / "big.bin"
    assert on_disk.stat().st_size == 256 << 20
    assert _sha256(on_disk) == want, "uploaded content differs on the server's disk"
    back = tmp_path / "back.bin"
    nfs_cp(url, back, timeout=180)
    assert back.stat().st_size == 256 << 20
    assert _sha256(back) == want, "downloaded content differs"
    on_disk.unlink()


def test_nfs_ls_100k_entries_each_once(srv, big_dir):
    d, _ = big_dir
    on_disk = sorted(os.listdir(d))  # includes anything another test added
    assert len(on_disk) >= BIG_DIR_ENTRIES
    entries = nfs_ls(srv.url("/big"), timeout=180)
    listed = sorted(e["name"] for e in entries)
    dups = {n for n, k in Counter(listed).items() if k > 1}
    assert not dups, f"{len(dups)} duplicated names, e.g. {sorted(dups)[:5]}"
    missing = set(on_disk) - set(listed)
    extra = set(listed) - set(on_disk)
    assert not missing and not extra, (f"missing {len(missing)} e.g. {sorted(missing)[:5]}, "
                                       f"extra {len(extra)} e.g. {sorted(extra)[:5]}")
    assert len(listed) == len(on_disk)


def test_readdir_while_creating(srv, big_dir):
    d, originals = big_dir
    # Both begin once both have mounted, so that the creates meet the listing.
    created, res = nfsh_together(srv.url(), [("create-loop", "/big", CONCURRENT_CREATES),
                                             ("readdir", "/big", "--names")], timeout=180)
    assert created.get("ops") == CONCURRENT_CREATES, created
    # The listing's calls ran while files were being created (both report
    # CLOCK_MONOTONIC times), or this test checked a quiet directory.
    assert created["started"] < res["ended"] and res["started"] < created["ended"], \
        ({k: created[k] for k in ("started", "ended")}, {k: res[k] for k in ("started", "ended")})
    names = res["names"]
    seen = Counter(names)
    dup_orig = sorted(n for n in originals if seen.get(n, 0) > 1)
    missing = sorted(n for n in originals if n not in seen)
    assert not missing, f"{len(missing)} original names missing, e.g. {missing[:5]}"
    assert not dup_orig, f"{len(dup_orig)} original names listed twice, e.g. {dup_orig[:5]}"
    assert res.get("unique") is True, res.get("duplicates")
    new = [n for n in names if n not in originals]
    assert all(n.startswith("f") for n in new)
    assert len(new) <= CONCURRENT_CREATES
    assert len(os.listdir(d)) >= BIG_DIR_ENTRIES + CONCURRENT_CREATES


FSX_SEEDS = (11, 12, 13)
FSX_OPS = 4000


def test_fsx_random_io_through_two_connections_matches_a_model(srv, tmp_path):
    """fsx-style exerciser (nfsh fsx), three at once on files of their own: random
    writes (unaligned, page-aligned, appending, multi-MiB), reads at and past the end,
    truncations both ways, COMMITs, size checks and reopenings, each through one of two
    connections (one writing FILE_SYNC, one UNSTABLE), each read checked against a model.
    The file on the server's disk must then hold exactly the model."""
    nfsh_binary()
    runs = {seed: nfsh_popen(srv.url(), "fsx", f"/fsx{seed}", FSX_OPS, seed, "8m",
                             tmp_path / f"model{seed}")
            for seed in FSX_SEEDS}
    results = {seed: exerciser_lines(p, f"seed {seed}")[-1] for seed, p in runs.items()}
    for seed, res in results.items():
        # No call needed sending again: nothing broke a connection.
        assert res["ok"] is True and res["ops"] == FSX_OPS and res["retries"] == 0, res
        # Every kind of operation ran, or the mix checked less than it says.
        for kind in ("write", "read", "truncate", "commit", "stat", "reopen", "append", "big_write"):
            assert res[kind] > 0, (seed, kind, res)
        on_disk = Path(srv.export_dir) / f"fsx{seed}"
        model = (tmp_path / f"model{seed}").read_bytes()
        assert on_disk.stat().st_size == res["size"] == len(model)
        assert on_disk.read_bytes() == model, f"seed {seed}: the file on disk differs from the model"
        on_disk.unlink()


NSX_SEEDS = (21, 22)
NSX_OPS = 4000


def test_nsx_namespace_changes_through_two_connections_match_a_model(srv):
    """Namespace exerciser (nfsh nsx), two at once in trees of their own: random
    create, mkdir, symlink, unlink, rmdir, rename (over files, over directories, into
    itself) and link through two connections, each answer checked against a model
    (success or the POSIX error), with READDIRPLUS listings, lookups and link counts
    checked along the way. The tree on the server's disk must then be the model's."""
    nfsh_binary()
    runs = {seed: nfsh_popen(srv.url(), "nsx", f"/nsx{seed}", NSX_OPS, seed) for seed in NSX_SEEDS}
    for seed, p in runs.items():
        lines = exerciser_lines(p, f"seed {seed}")
        res = lines[-1]
        assert res["ok"] is True and res["ops"] == NSX_OPS, res
        # Each kind of change both succeeded and failed as the model said, or the mix
        # checked less than it claims.
        for kind in ("create", "mkdir", "symlink", "unlink", "rmdir", "rename", "link", "chmod"):
            assert 0 < res[f"{kind}_errors"] < res[kind], (seed, kind, res)
        assert res["list"] > 100 and res["stat"] > 100, res
        assert sum(1 for e in lines if "entry" in e) > 20, lines
        problems = nsx_tree_problems(lines, Path(srv.export_dir) / f"nsx{seed}")
        assert not problems, f"seed {seed}: " + "\n".join(problems[:20])


def test_fsx_writers_sharing_one_file_each_see_their_stretch_intact(srv, tmp_path):
    """Four fsx at once on one file (eight connections), each owning a stretch of it
    (nfsh fsx ... STRIPE): FILE_SYNC and UNSTABLE writes, COMMITs and reads of one file
    arrive together from many connections, and every writer's reads must still find
    exactly its own bytes, and zeros where it wrote nothing."""
    nfsh_binary()
    stripes, maxlen = 4, 4 << 20
    shared = Path(srv.export_dir) / "fsx-shared"
    shared.touch()
    shared.chmod(0o666)
    runs = [nfsh_popen(srv.url(), "fsx", "/fsx-shared", 3000, 40 + k, maxlen, tmp_path / f"m{k}", k)
            for k in range(stripes)]
    results = [exerciser_lines(p, f"stripe {k}")[-1] for k, p in enumerate(runs)]
    data = shared.read_bytes()
    stretch = maxlen + (3 << 20)
    for k, res in enumerate(results):
        assert res["ok"] is True and res["truncate"] == 0 and res["write"] > 1000, res
        assert res["retries"] == 0, res
        base = k * stretch
        model = (tmp_path / f"m{k}").read_bytes()
        assert len(model) == res["size"] > 0
        assert data[base:base + len(model)] == model, f"stripe {k} differs on disk"
        assert not any(data[base + len(model):base + stretch]), f"stripe {k}: bytes past its writes"
