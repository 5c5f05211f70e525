"""A full file system under the export: out of blocks, or out of inodes.

The export is a small tmpfs. A WRITE that runs out of space part way is answered with
what it wrote (a short count, as write(2) and knfsd answer), never with an error for a
file it changed; the client's WRITE of the rest gets NFS3ERR_NOSPC and changes nothing.
A CREATE, MKDIR or SYMLINK past the last inode is refused and leaves no name behind.
Through all of it nasd keeps serving, what was stored stays as it was, and once space
is freed writes and creates work again.

    python3 -m pytest -s tests/reliability/test_disk_full.py
"""
import os
import shutil
import subprocess

import pytest

from rig.nasd import Nasd
from rig.nfsh import nfsh, nfsh_binary, pattern_bytes
from rig.rpc import Nfs3Client, auth_sys, NFS3_OK, NFS3ERR_NOENT

NFS3ERR_NOSPC = 28
KiB = 1 << 10


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 512 KiB and 64 inodes."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    if not shutil.which("mount"):
        pytest.skip("needs mount")
    d = tmp_path / "export"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,nr_inodes=64,mode=755", "tmpfs", str(d)],
                   check=True, capture_output=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


@pytest.mark.parametrize("stable", ["unstable", "file_sync"])
def test_a_write_that_runs_out_of_space_is_answered_with_what_it_wrote(small_fs, stable):
    data = pattern_bytes(1024 * KiB, 1)
    with Nasd(small_fs, args=["--no-root-squash"]) as srv, \
            Nfs3Client(srv.host, srv.port, cred=auth_sys(0, 0)) as c:
        root = c.root(str(small_fs))
        fh = c.create(root, "f").fh
        w = c.write(fh, 0, data, stable=stable)
        assert w.status == NFS3_OK, f"a WRITE that changed the file was refused: {w.status}"
        n = w.fields["count"]
        assert 0 < n < len(data), n
        assert w.fields["wcc"][1].size == n
        on_disk = (small_fs / "f").read_bytes()
        assert on_disk == data[:n], "the file does not hold what the reply says was written"

        rest = c.write(fh, n, data[n:], stable=stable)
        assert rest.status == NFS3ERR_NOSPC, rest.status
        assert rest.fields["wcc"][1].size == n
        assert (small_fs / "f").read_bytes() == on_disk

        # Space comes back with the file gone; a write then goes in whole.
        assert c.remove(root, "f").status == NFS3_OK
        fh2 = c.create(root, "g").fh
        w2 = c.write(fh2, 0, data[:256 * KiB], stable=stable)
        assert w2.status == NFS3_OK and w2.fields["count"] == 256 * KiB
        assert (small_fs / "g").read_bytes() == data[:256 * KiB]
        assert srv.alive()


def test_creates_past_the_last_inode_are_refused_and_leave_nothing(small_fs):
    with Nasd(small_fs, args=["--no-root-squash"]) as srv, \
            Nfs3Client(srv.host, srv.port, cred=auth_sys(0, 0)) as c:
        root = c.root(str(small_fs))
        made = []
        for i in range(200):
            kind = ("file", "dir", "link")[i % 3]
            name = f"{kind}{i}"
            r = (c.create(root, name) if kind == "file" else c.mkdir(root, name) if kind == "dir"
                 else c.symlink(root, name, "target"))
            if r.status == NFS3ERR_NOSPC:
                assert c.lookup(root, name).status == NFS3ERR_NOENT, f"{name} refused but left behind"
                break
            assert r.status == NFS3_OK, (name, r.status)
            made.append(name)
        else:
            pytest.fail("200 creates in a file system of 64 inodes all succeeded")
        assert len(made) > 10
        for kind in ("file", "dir", "link"):   # every kind is refused now
            name = f"late-{kind}"
            r = (c.create(root, name) if kind == "file" else c.mkdir(root, name) if kind == "dir"
                 else c.symlink(root, name, "target"))
            assert r.status == NFS3ERR_NOSPC, (name, r.status)
        listed = sorted(e[1] for e in c.readdir_all(root) if e[1] not in (".", ".."))
        assert listed == sorted(made)
        assert sorted(os.listdir(small_fs)) == sorted(made)

        # One name freed, one create fits again.
        victim = next(n for n in made if n.startswith("file"))
        assert c.remove(root, victim).status == NFS3_OK
        assert c.create(root, "again").status == NFS3_OK
        assert srv.alive()


def test_libnfs_writing_past_full_fails_and_the_server_goes_on(small_fs):
    """Through libnfs: a file bigger than the file system fails to write, a file
    stored before keeps its bytes, and after the big one is removed a smaller one is
    written and read back."""
    nfsh_binary()
    keep = pattern_bytes(100 * KiB, 7)
    (small_fs / "keep").write_bytes(keep)
    with Nasd(small_fs, args=["--no-root-squash"]) as srv:
        url = srv.url()
        big = nfsh(url, "write-pattern", "/big", "2m", 3, check=False)
        assert big["ok"] is False, big
        assert srv.alive()
        assert (small_fs / "keep").read_bytes() == keep
        assert nfsh(url, "unlink", "/big")["ok"] is True
        small = nfsh(url, "write-pattern", "/small", "256k", 4)
        assert small["ok"] is True, small
        check = nfsh(url, "verify-pattern", "/small", "256k", 4)
        assert check["ok"] is True and check["first_mismatch"] == -1, check
        assert (small_fs / "keep").read_bytes() == keep
