"""Reloading the exports file on SIGHUP, as `exportfs -r` does: new rules take effect
for clients already connected, exports come and go, handles of exports that stay keep
working, and a broken file changes nothing."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import Nfs3Client  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402


def _reload(n: Nasd, tmp_path: Path, lines) -> int:
    """Writes the exports file, sends SIGHUP and waits for nasd to log the outcome.
    Returns the log length before, so the caller can read what this reload logged."""
    before = len(n.log())
    write_exports(tmp_path, lines)
    os.kill(n.pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tail = n.log()[before:]
        if "exports reloaded" in tail or "exports not reloaded" in tail:
            return before
        n.check_alive()
        time.sleep(0.05)
    raise AssertionError(f"no reload logged after SIGHUP\n{n.log()[-2000:]}")


def test_sighup_applies_the_edited_exports_file(tmp_path):
    a = make_export(tmp_path, "a")
    b = make_export(tmp_path, "b")
    (a / "kept").write_bytes(b"a file")
    ex = write_exports(tmp_path, [f"{a} 127.0.0.1(ro,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(str(a))
        kept = c.lookup(root, "kept").fh
        assert c.create(root, "new1").status == rpc.NFS3ERR_ROFS
        assert c.mnt(str(b)).status != rpc.MNT3_OK

        # ro -> rw, and a second export: the connected client and its handles go on
        start = _reload(n, tmp_path, [f"{a} 127.0.0.1(rw,no_root_squash,insecure)",
                                      f"{b} *(rw,no_root_squash,insecure)"])
        assert "exports reloaded" in n.log()[start:]
        assert c.create(root, "new1").ok
        assert c.read(kept).data == b"a file"
        assert (a / "new1").exists()
        assert c.mnt(str(b)).status == rpc.MNT3_OK
        assert {p for p, _ in c.mount_export()} == {os.path.realpath(a), os.path.realpath(b)}

        # a file with an error is refused, and what was served stays served
        start = _reload(n, tmp_path, [f"{a} 127.0.0.1(rw,bogus_option)"])
        assert "exports not reloaded" in n.log()[start:]
        assert c.create(root, "new2").ok
        assert c.mnt(str(b)).status == rpc.MNT3_OK

        # the client's address no longer admitted: refused at once, on the same connection
        _reload(n, tmp_path, [f"{a} 127.0.0.2(rw,no_root_squash,insecure)",
                              f"{b} *(rw,no_root_squash,insecure)"])
        assert c.getattr(kept).status == rpc.NFS3ERR_ACCES
        assert c.mnt(str(a)).status == rpc.MNT3ERR_ACCES

        # an export taken out: its handles go stale, the other export goes on
        broot = c.root(str(b))
        _reload(n, tmp_path, [f"{b} *(rw,no_root_squash,insecure)"])
        assert c.getattr(kept).status == rpc.NFS3ERR_STALE
        assert c.getattr(broot).ok
        assert [p for p, _ in c.mount_export()] == [os.path.realpath(b)]

        # and put back: the old handles work again, as after a restart
        _reload(n, tmp_path, [f"{a} 127.0.0.1(rw,no_root_squash,insecure)"])
        assert c.read(kept).data == b"a file"
        assert c.getattr(broot).status == rpc.NFS3ERR_STALE


def test_a_reload_reads_the_exports_as_the_server_whoever_was_served_last(tmp_path):
    """The reload runs on a thread of the blocking pool, whose threads keep the identity
    of the last client they served (UDP calls all run there). An export below a directory
    only root may search must still be found."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    a = make_export(locked, "a")
    ex = write_exports(tmp_path, [f"{a} 127.0.0.1(rw,all_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, proto="udp", cred=ROOT) as c:
        root = c.root(str(a))
        for _ in range(30):
            assert c.getattr(root).ok   # as nobody (all_squash), on pool threads
        start = _reload(n, tmp_path, [f"{a} 127.0.0.1(ro,all_squash,insecure)"])
        assert "exports reloaded" in n.log()[start:], n.log()[start:]
        assert c.create(root, "x").status == rpc.NFS3ERR_ROFS


def test_an_export_whose_file_system_is_unmounted_goes_at_the_next_reload(tmp_path):
    """`mp`: after its file system is unmounted, a reload stops serving the export, even
    when it was the only one, so nothing lands in the directory underneath."""
    disk = make_export(tmp_path, "disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "nasd-test", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        ex = write_exports(tmp_path, [f"{disk} 127.0.0.1(rw,no_root_squash,insecure,mp)"])
        with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
            root = c.root(str(disk))
            assert c.create(root, "on-the-disk").ok
            subprocess.run(["umount", "-l", str(disk)], check=True)
            start = _reload(n, tmp_path, [f"{disk} 127.0.0.1(rw,no_root_squash,insecure,mp)"])
            assert "exports reloaded" in n.log()[start:], n.log()[start:]
            assert c.mnt(str(disk)).status != rpc.MNT3_OK
            assert not c.create(root, "under-the-mount").ok
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert os.listdir(disk) == [], "written into the directory under the mount point"


def test_a_file_system_mounted_on_an_export_is_served_after_the_next_reload(tmp_path):
    """A disk mounted late (after nasd started) on an export without `mp`: the reload
    must serve the mounted file system, as `exportfs -r` does, not go on filling the
    directory underneath through the storage opened before."""
    disk = make_export(tmp_path, "disk")
    ex = write_exports(tmp_path, [f"{disk} 127.0.0.1(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        assert c.create(c.root(str(disk)), "before-the-mount").ok
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "nasd-test", str(disk)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        try:
            start = _reload(n, tmp_path, [f"{disk} 127.0.0.1(rw,no_root_squash,insecure)"])
            assert "exports reloaded" in n.log()[start:], n.log()[start:]
            assert "opened afresh" in n.log()[start:]
            assert c.create(c.root(str(disk)), "on-the-disk").ok
            assert os.listdir(disk) == ["on-the-disk"], "the new file is on the mounted file system"
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert os.listdir(disk) == ["before-the-mount"], "nothing written into the directory under the mount point"


def test_an_export_whose_directory_is_missing_is_left_out_and_the_rest_reloaded(tmp_path):
    """As exportfs: a missing export directory costs that export only; refusing the whole
    file would keep serving the old rules of the others."""
    a = make_export(tmp_path, "a")
    gone = tmp_path / "gone"
    ex = write_exports(tmp_path, [f"{a} 127.0.0.1(ro,no_root_squash,insecure)", f"{gone} *(rw)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(str(a))
        assert c.create(root, "f").status == rpc.NFS3ERR_ROFS
        start = _reload(n, tmp_path, [f"{a} 127.0.0.1(rw,no_root_squash,insecure)", f"{gone} *(rw)"])
        assert "exports reloaded" in n.log()[start:]
        assert "not exported" in n.log()[start:] and str(gone) in n.log()[start:]
        assert c.create(root, "f").ok, "the change to the export that exists was applied"
        assert c.mnt(str(gone)).status != rpc.MNT3_OK

