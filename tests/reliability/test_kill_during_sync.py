"""A server killed while it makes a namespace change durable.

A CREATE, REMOVE, RENAME or MKDIR spends most of its time in the directory's (or the file
system's) sync, after the change is made and before its reply exists. A kill then leaves
the change made (in the kernel's page cache) and the client without a reply; the client
sends the call again, same XID, to the restarted server. Run again, the change would
answer EEXIST or ENOENT for what it did itself. nasd puts the reply aside before the sync
(the duplicate request journal), and the new process, having made every change durable,
answers the retransmission with it.

To hold a call inside its sync, the export is a file system on a loop device whose image
lives on a second file system, which the test freezes: the change itself goes to the page
cache, the sync's writes wait for the thaw.

    tmpfs ── backing.img (ext4, loop) ── export.img (ext4, loop) ── export

    python3 -m pytest -s tests/reliability/test_kill_during_sync.py
"""
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from rig.nasd import Nasd
from rig import rpc
from rig.rpc import Nfs3Client, auth_sys, frame, nfs3_args, decode_result, NFS_PROG

MiB = 1 << 20
ROOT = auth_sys(0, 0, machine="kill-during-sync")


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


# nasd's duplicate request journal (rpc/drc.rs): 1 KiB slots, each beginning with its
# magic, a sequence number, the boot id, then the state of its change (1: made).
JOURNAL, SLOT, MAGIC, STATE_AT, MADE_STATE = "drc-journal", 1024, b"NDJ2", 4 + 8 + 16, 1


def reply_put_aside(state_dir) -> bool:
    """Whether nasd's journal holds a reply written before its change was durable."""
    try:
        data = (state_dir / JOURNAL).read_bytes()
    except FileNotFoundError:
        return False
    return any(data[at:at + 4] == MAGIC and data[at + STATE_AT] == MADE_STATE
               for at in range(0, len(data) - SLOT + 1, SLOT))


def unfreeze(fs):
    """Thaws `fs` if it is frozen (and says nothing if it was not)."""
    subprocess.run(["fsfreeze", "--unfreeze", str(fs)], capture_output=True)


@contextlib.contextmanager
def nested_file_system(root, journal: bool):
    """A tmpfs holding an ext4 image (the backing file system) holding a second ext4
    image, mounted at root/export: yields (root/export, root/backing)."""
    tmpfs, backing, export = root / "tmpfs", root / "backing", root / "export"
    for d in (tmpfs, backing, export):
        d.mkdir(parents=True)
    # Taken down in reverse: each loop device holds the file system its image is on.
    undo = []
    try:
        run("mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(tmpfs))
        undo.append(["umount", str(tmpfs)])
        (tmpfs / "backing.img").write_bytes(b"")
        os.truncate(tmpfs / "backing.img", 64 * MiB)
        run("mkfs.ext4", "-q", "-E", "nodiscard", str(tmpfs / "backing.img"))
        loop = run("losetup", "-f", "--show", str(tmpfs / "backing.img"))
        undo.append(["losetup", "-d", loop])
        run("mount", loop, str(backing))
        undo.append(["umount", str(backing)])
        image = backing / "export.img"
        image.write_bytes(b"")
        os.truncate(image, 32 * MiB)
        journal_opts = ["-J", "size=4"] if journal else ["-O", "^has_journal"]
        # 256-byte inodes keep ctime to the nanosecond, which the guarded SETATTR needs.
        run("mkfs.ext4", "-q", "-I", "256", *journal_opts, "-E", "nodiscard", str(image))
        loop = run("losetup", "-f", "--show", str(image))
        undo.append(["losetup", "-d", loop])
        # noatime: with a journal, an atime update of the test's own listing would wait
        # for the commit the frozen file system holds up.
        run("mount", "-o", "noatime", loop, str(export))
        undo.append(["umount", str(export)])
        yield export, backing
    finally:
        unfreeze(backing)
        for cmd in reversed(undo):
            subprocess.run(cmd, capture_output=True)


def needs_root_and_tools():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs, loop devices and to freeze a file system")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount", "fsfreeze"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")


@pytest.fixture(params=[False, True], ids=["ext4-nojournal", "ext4-journal"])
def freezable_export(tmp_path, request):
    """(export directory, the file system to freeze to hold the export's syncs)."""
    needs_root_and_tools()
    with nested_file_system(tmp_path / "stack", request.param) as stack:
        yield stack


def kill_during_the_sync(srv, client, msg, backing, state_dir):
    """Sends the call `msg` with the backing file system frozen, waits until nasd has put
    its reply aside, SIGKILLs nasd, thaws, and waits for the process to be gone."""
    run("fsfreeze", "--freeze", str(backing))
    # Nothing here may look at the export while the freeze lasts: a lookup can wait for
    # a directory block the held-up sync is writing. A timer thaws it in any case, so
    # that a failure cannot hang the machine's writeback.
    thaw = threading.Timer(60, unfreeze, (backing,))
    thaw.start()
    try:
        client.send_raw(frame(msg))
        # The reply is put aside right after the change (the state directory is not on
        # the frozen file system); the sync that follows cannot end while the backing
        # file system is frozen, so no reply comes.
        deadline = time.monotonic() + 30
        while not reply_put_aside(state_dir):
            assert time.monotonic() < deadline, "no reply was put aside"
            time.sleep(0.02)
        with pytest.raises(OSError):
            client.recv_reply(timeout=0.2)
        srv.kill(signal.SIGKILL, wait=False)
    finally:
        thaw.cancel()
        unfreeze(backing)
    srv.kill()  # waits: the thread in the sync dies once it returns


# What each change leaves on the export once made.
MADE = {
    "create": lambda export: (export / "new").exists(),
    "remove": lambda export: not (export / "n").exists(),
    "rename": lambda export: (export / "m").exists() and not (export / "n").exists(),
    "mkdir": lambda export: (export / "dir").is_dir(),
    "link": lambda export: (export / "l").exists(),
    "rmdir": lambda export: not (export / "d").exists(),
    "symlink": lambda export: (export / "s").is_symlink(),
    "setattr": lambda export: (export / "n").stat().st_mode & 0o777 == 0o600,
    # UNCHECKED on the existing "n", truncating it: its truncation's sync, too, comes
    # after the reply is put aside.
    "create-truncating": lambda export: (export / "n").stat().st_size == 0,
}


@pytest.mark.parametrize("what", list(MADE))
def test_a_change_whose_server_died_in_its_sync_is_answered_not_run_again(freezable_export, tmp_path, what):
    """Run again, each would fail: CREATE (GUARDED), MKDIR, LINK and SYMLINK with
    EXIST, REMOVE, RMDIR and RENAME with NOENT, a SETATTR guarded by the ctime the
    change itself moved with NOT_SYNC. An UNCHECKED CREATE truncating a file would
    succeed again, but only the reply put aside before its sync shows it was made."""
    export, backing = freezable_export
    (export / "n").write_bytes(b"x")
    (export / "d").mkdir()
    os.sync()
    # The largest bound TOML can say: too far off to be a deadline, so no bound at all.
    config = tmp_path / "nasd.toml"
    config.write_text(f"[limits]\nstart_sync_timeout_secs = {2**63 - 1}\n")
    with Nasd(export, args=["--no-root-squash", "--config", str(config)], state_dir=tmp_path / "state") as srv:
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c1:
            root = c1.root(srv.export_dir)
            n = c1.lookup(root, "n")
            if what == "setattr":
                proc, args = rpc.NFSPROC3_SETATTR, nfs3_args.setattr(n.fh, guard=n.attr.ctime, mode=0o600)
            elif what == "create-truncating":
                proc, args = rpc.NFSPROC3_CREATE, nfs3_args.create(root, "n", "unchecked", size=0)
            else:
                proc, args = nfs3_args.namespace_change(root, what, n.fh)
            xid, msg = c1.build(NFS_PROG, 3, proc, args)
            kill_during_the_sync(srv, c1, msg, backing, tmp_path / "state")
        assert MADE[what](export), f"the {what} was not made before the kill"
        after = sorted(os.listdir(export))
        truncated_ns = os.stat(export / "n").st_ctime_ns if what == "create-truncating" else None
        truncated = divmod(truncated_ns, 10**9) if truncated_ns is not None else None
        srv.start()
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c2:
            again = decode_result(proc, c2.resend(msg, xid))
            assert again.ok, f"the retransmission ran the {what} again: status {again.status}"
            assert sorted(os.listdir(export)) == after
            if what in ("create", "mkdir"):
                name = "new" if what == "create" else "dir"
                assert again.fh == c2.lookup(c2.root(srv.export_dir), name).fh
            if what == "create-truncating":
                # A rerun would truncate again and move the ctime; the reply put aside
                # carries the ctime of the truncation made before the kill.
                assert again.fh == n.fh and again.attr.size == 0
                assert (again.attr.ctime, os.stat(export / "n").st_ctime_ns) == (truncated, truncated_ns), "the truncating create ran again"
            else:
                # A new call (new XID) runs, and finds the change made.
                assert c2.nfs(proc, args).status != rpc.NFS3_OK
        # The reply answered was the one put aside before the sync, made good at start.
        assert "made durable, kept" in srv.log()


# The start's sync bound (`start_sync_timeout_secs`) in the tests below.
BOUND = 2
# Where the export's own sync must finish within the bound for the test to hold, a bound
# a busy machine cannot overrun.
ROOMY_BOUND = 6


@contextlib.contextmanager
def remove_killed_in_its_sync(export, backing, tmp_path, bound=BOUND):
    """nasd, with a start sync bound of `bound` seconds, killed in the sync of a REMOVE
    of "n": yields (srv, proc, xid, msg) with nasd stopped."""
    (export / "n").write_bytes(b"x")
    os.sync()
    config = tmp_path / "nasd.toml"
    config.write_text(f"[limits]\nstart_sync_timeout_secs = {bound}\n")
    with Nasd(export, args=["--no-root-squash", "--config", str(config)], state_dir=tmp_path / "state") as srv:
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c1:
            proc, args = nfs3_args.namespace_change(c1.root(srv.export_dir), "remove")
            xid, msg = c1.build(NFS_PROG, 3, proc, args)
            kill_during_the_sync(srv, c1, msg, backing, tmp_path / "state")
        yield srv, proc, xid, msg


def restart_with_writeback_held(srv, dirty_dir, backing, ask):
    """Leaves a megabyte to write in `dirty_dir`, freezes `backing` (which the file
    system of `dirty_dir` writes to), restarts nasd and returns (ask(client), seconds
    from the start until it answered). Thaws whatever happens."""
    (dirty_dir / "dirty").write_bytes(b"d" * MiB)
    run("fsfreeze", "--freeze", str(backing))
    thaw = threading.Timer(60, unfreeze, (backing,))
    thaw.start()
    try:
        begun = time.monotonic()
        srv.start()  # the port is open before the sync: what counts is an answer
        with Nfs3Client(srv.host, srv.port, cred=ROOT, timeout=30) as c:
            answer = ask(c)
            return answer, time.monotonic() - begun
    finally:
        thaw.cancel()
        unfreeze(backing)


def test_a_start_whose_sync_hangs_serves_anyway_and_runs_the_call_again(freezable_export, tmp_path):
    """The start after such a kill syncs every export (and `sync(2)`) before it serves.
    Where a file system's writeback hangs (here: the export's, whose image lies on a
    frozen file system; elsewhere a dead device, a remote server gone, a freeze for a
    snapshot), nasd must not wait forever: past `start_sync_timeout_secs` it serves, and
    drops the reply put aside, whose change it could not make durable, so the resent
    call runs again."""
    export, backing = freezable_export
    with remove_killed_in_its_sync(export, backing, tmp_path) as (srv, proc, xid, msg):
        null, waited = restart_with_writeback_held(srv, export, backing, lambda c: c.call(NFS_PROG, 3, rpc.NFSPROC3_NULL))
        assert null.success
        assert BOUND <= waited < BOUND + 15, f"the first answer came {waited:.1f} s after the start"
        assert "the exports' file systems did not finish syncing at start" in srv.log()
        assert "could not be made durable, dropped" in srv.log()
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
            again = decode_result(proc, c.resend(msg, xid))
            assert again.status == rpc.NFS3ERR_NOENT, "the reply of a change not made durable was replayed"


def test_a_hung_file_system_that_is_not_exported_does_not_cost_the_replies(tmp_path):
    """The start also runs `sync(2)`, for file systems the earlier process may have
    served from exports since taken out. One that hangs elsewhere on the machine (here
    a second stack whose backing file system is frozen with data still to write) must
    neither keep nasd from serving nor drop replies whose exports are durable."""
    needs_root_and_tools()
    with nested_file_system(tmp_path / "exported", False) as (export, backing), \
            nested_file_system(tmp_path / "elsewhere", False) as (elsewhere, elsewhere_backing), \
            remove_killed_in_its_sync(export, backing, tmp_path, ROOMY_BOUND) as (srv, proc, xid, msg):
        again, waited = restart_with_writeback_held(srv, elsewhere, elsewhere_backing, lambda c: decode_result(proc, c.resend(msg, xid)))
        assert again.ok, f"the resent REMOVE ran again: status {again.status}"
        assert ROOMY_BOUND <= waited < ROOMY_BOUND + 15, f"the answer came {waited:.1f} s after the start"
        assert "file systems other than the exports did not finish syncing at start" in srv.log()
        assert "made durable, kept" in srv.log()
