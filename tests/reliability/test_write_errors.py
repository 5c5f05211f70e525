"""Writeback errors: data the disk refused is never vouched for afterwards.

The export is an ext4 file system (no journal, errors=continue) on a loop device whose
backing file lives on a tmpfs much smaller than the image: once the tmpfs is full, every
write the loop device passes down fails, as a failing disk's would. The kernel reports a
writeback error once per error to each open file; a server that forgets it (a cache
eviction, a new descriptor) would then let a later COMMIT succeed for data that is gone.
nasd instead changes its write verifier, so every client resends what it had not seen
committed.

    python3 -m pytest -s tests/reliability/test_write_errors.py
"""
import os
import shutil
import subprocess

import pytest

from rig.nasd import Nasd
from rig.rpc import Nfs3Client, auth_sys, NFS3_OK

MiB = 1 << 20


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def failing_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs and a loop device")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")
    outer, inner = tmp_path / "backing", tmp_path / "export"
    outer.mkdir()
    inner.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(outer))
    loop = None
    try:
        image = outer / "disk.img"
        with open(image, "wb") as f:
            f.truncate(64 * MiB)
        run("mkfs.ext4", "-q", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", str(image))
        loop = run("losetup", "-f", "--show", str(image))
        run("mount", "-o", "errors=continue", loop, str(inner))
        yield inner
    finally:
        subprocess.run(["umount", str(inner)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        subprocess.run(["umount", str(outer)], capture_output=True)


def test_a_failed_commit_changes_the_write_verifier(failing_fs):
    with Nasd(failing_fs, args=["--no-root-squash"]) as srv, \
            Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=60) as c:
        root = c.root(str(failing_fs))
        # Both files exist before the disk fills up.
        lost = c.create(root, "lost").fh
        probe = c.create(root, "probe").fh
        assert lost and probe
        chunk = os.urandom(MiB)
        verifiers = set()
        for i in range(16):   # 16 MiB into the page cache; the disk has room for ~5
            r = c.write(lost, i * MiB, chunk, stable="unstable")
            assert r.status == NFS3_OK, f"UNSTABLE write {i}: nfsstat3 {r.status}"
            verifiers.add(r.verf)
        assert len(verifiers) == 1, "the verifier changed while nothing failed"
        (acknowledged,) = verifiers

        r = c.commit(lost)
        assert r.status != NFS3_OK, "the disk refused the data, yet COMMIT succeeded"
        # While the file stays in nasd's cache its sync failure is kept (this held before
        # the verifier change too); what follows is what the cache cannot guarantee.
        assert c.commit(lost).status != NFS3_OK, "a second COMMIT vouched for the lost data"

        # Any client's uncommitted writes may have gone with it: the verifier every client
        # sees from now on differs from the one its UNSTABLE writes were acknowledged with.
        r = c.write(probe, 0, b"p" * 4096, stable="unstable")
        assert r.status == NFS3_OK, f"UNSTABLE write after the failure: nfsstat3 {r.status}"
        assert r.verf != acknowledged, "the write verifier outlived a failed sync"
