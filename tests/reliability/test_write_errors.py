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
import time

import pytest

from rig.nasd import Nasd
from rig.rpc import Nfs3Client, auth_sys, NFS3_OK

MiB = 1 << 20


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def failing_fs(tmp_path):
    yield from _failing_fs(tmp_path, journal=False)


@pytest.fixture
def failing_journaled_fs(tmp_path):
    yield from _failing_fs(tmp_path, journal=True)


def _failing_fs(tmp_path, journal):
    """With a journal, the journal is written out at mkfs time, so that only new data
    blocks find the backing tmpfs full and the journal keeps working."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs and a loop device")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")
    outer, inner = tmp_path / "backing", tmp_path / "export"
    outer.mkdir()
    inner.mkdir()
    run("mount", "-t", "tmpfs", "-o", f"size={10 if journal else 6}m", "tmpfs", str(outer))
    loop = None
    try:
        image = outer / "disk.img"
        with open(image, "wb") as f:
            f.truncate(64 * MiB)
        if journal:
            run("mkfs.ext4", "-q", "-J", "size=4", "-E", "lazy_itable_init=1,lazy_journal_init=0,nodiscard", str(image))
        else:
            run("mkfs.ext4", "-q", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", str(image))
        loop = run("losetup", "-f", "--show", str(image))
        run("mount", "-o", "errors=continue", loop, str(inner))
        yield inner
    finally:
        subprocess.run(["umount", str(inner)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        subprocess.run(["umount", str(outer)], capture_output=True)


def _descriptors_of(pid: int, path) -> list:
    """The descriptors process `pid` holds on `path`."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                held.append(fd)
        except OSError:
            continue  # closed meanwhile
    return held


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
        # A second COMMIT may succeed (nothing is left to write), but never with the
        # verifier the lost writes were acknowledged with: the client resends them.
        again = c.commit(lost)
        assert again.status != NFS3_OK or again.verf != acknowledged, "a second COMMIT vouched for the lost data"

        # Any client's uncommitted writes may have gone with it: the verifier every client
        # sees from now on differs from the one its UNSTABLE writes were acknowledged with.
        r = c.write(probe, 0, b"p" * 4096, stable="unstable")
        assert r.status == NFS3_OK, f"UNSTABLE write after the failure: nfsstat3 {r.status}"
        assert r.verf != acknowledged, "the write verifier outlived a failed sync"


def test_a_file_let_go_of_with_unwritten_data_cannot_vouch_for_it(failing_journaled_fs, tmp_path):
    """The cache lets go of a file written UNSTABLE (idle for a second here) before its
    data is written back. When that writeback fails and the inode leaves memory, no
    descriptor opened later hears of the error, so a COMMIT through one would succeed
    with the verifier the writes were acknowledged with: the client would never resend.
    nasd checks a written file as it lets go of it (as knfsd's file cache does), so the
    COMMIT fails or answers a new verifier. With a journal, so that COMMIT is the file's
    own fsync and not a sync of the whole file system, which would report the error."""
    export = failing_journaled_fs
    config = tmp_path / "nasd.toml"
    config.write_text("[limits]\nopen_object_idle_secs = 1\n")
    with Nasd(export, args=["--no-root-squash", "--config", config]) as srv, \
            Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=60) as c:
        root = c.root(str(export))
        lost = c.create(root, "lost").fh
        chunk = os.urandom(MiB)
        verifiers = set()
        for i in range(16):   # into the page cache; the disk has room for a few MiB
            r = c.write(lost, i * MiB, chunk, stable="unstable")
            assert r.status == NFS3_OK, f"UNSTABLE write {i}: nfsstat3 {r.status}"
            verifiers.add(r.verf)
        (acknowledged,) = verifiers
        # Idle, the cache lets go of the file: its last descriptor closes once the check
        # of its writeback is done. Until then a COMMIT would go through the descriptor
        # that holds the error, and the case this test is about would not arise.
        deadline = time.monotonic() + 30
        while _descriptors_of(srv.pid, export / "lost") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _descriptors_of(srv.pid, export / "lost"), "nasd's cache kept the file open"
        run("sync")     # the writeback fails (if nothing wrote it before)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")   # and the inode, with its error, leaves memory
        r = c.commit(lost)
        # A failed COMMIT (EIO, or ROFS where the writeback error aborted the journal and
        # the file system went read-only) has no verifier.
        changed = r.verf != acknowledged if r.status == NFS3_OK else None
        print(f"COMMIT after the cache let go: nfsstat3 {r.status}, verifier changed: {changed}")
        assert r.status != NFS3_OK or r.verf != acknowledged, \
            "COMMIT vouched for data the disk refused, with the verifier the writes got"
