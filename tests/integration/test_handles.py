"""File handle stability (restart, remove, rename) and escape attempts
(forged handles, "..", symlinks, MOUNT paths, subdirectory exports)."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import Nfs3Client  # noqa: E402
from rig.nfsh import OutputFollower, nfsh_popen, parse_lines  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402


# ------------------------------------------------------------ stability

def test_hold_and_read_across_restart(tmp_path):
    export = make_export(tmp_path)
    data = os.urandom(100_000)
    (export / "f").write_bytes(data)
    with Nasd(export, args=["--no-root-squash"]) as n:
        proc = nfsh_popen(n.url(), "hold-and-read", "/f", 7)
        try:
            output = OutputFollower(proc)
            # Restart only once a read through the handle has been answered.
            output.wait_first_line()
            t_stop = time.time()
            n.restart()
            t_up = time.time()
            out, err = output.finish()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    lines = parse_lines(out)
    attempts = [x for x in lines if "attempt" in x]
    summary = lines[-1]
    assert summary.get("summary") is True, (out, err)
    bad = [a for a in attempts if not a["ok"]]
    assert not bad, f"reads through the held handle failed: {bad}\n{err}"
    assert {a["bytes"] for a in attempts} == {len(data)}
    assert len({a["fnv1a"] for a in attempts}) == 1
    # the handle really was used against the restarted server
    assert any(a["wall"] > t_up for a in attempts), (t_stop, t_up, attempts)
    assert any(a["wall"] < t_stop for a in attempts), (t_stop, attempts[:3])


def test_handle_survives_restart_raw(tmp_path):
    export = make_export(tmp_path)
    (export / "f").write_bytes(b"persist")
    with Nasd(export, args=["--no-root-squash"]) as n:
        with Nfs3Client(n.host, n.port, cred=ROOT) as cl:
            fh = cl.lookup(cl.root(n.export_dir), "f").fh
        n.restart()
        with Nfs3Client(n.host, n.port, cred=ROOT) as cl:
            assert cl.read(fh).data == b"persist"


def test_handle_of_removed_file_is_stale(srv, c):
    p = Path(srv.export_dir) / "gone"
    p.write_bytes(b"x" * 100)
    fh = c.lookup(c.export_root, "gone").fh
    assert c.getattr(fh).ok and c.read(fh).ok  # warm any server-side cache
    os.remove(p)
    assert c.getattr(fh).status == rpc.NFS3ERR_STALE
    assert c.read(fh).status == rpc.NFS3ERR_STALE
    assert c.write(fh, 0, b"y").status == rpc.NFS3ERR_STALE
    assert not p.exists()
    # a new file with the same name is a different object: old handle stays stale
    p.write_bytes(b"new")
    assert c.getattr(fh).status == rpc.NFS3ERR_STALE
    assert c.lookup(c.export_root, "gone").fh != fh


def test_handle_of_removed_directory_is_stale(srv, c):
    p = Path(srv.export_dir) / "gonedir"
    p.mkdir()
    fh = c.lookup(c.export_root, "gonedir").fh
    assert c.readdir(fh).ok
    p.rmdir()
    assert c.getattr(fh).status == rpc.NFS3ERR_STALE
    assert c.create(fh, "x").status == rpc.NFS3ERR_STALE


# How long an unused open object is kept in the tests below: long enough that a busy
# machine does not let it go before the test has seen it held.
IDLE_SECS = 5
LET_GO_WITHIN = 30


def _deleted_files_held(pid: int, name: str) -> list:
    """The descriptors of process `pid` that still hold a deleted file called `name`."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.endswith(f"/{name} (deleted)"):
            held.append(target)
    return held


def test_files_deleted_by_others_are_let_go_once_idle(tmp_path):
    """A cached descriptor keeps its inode, and so its disk space, alive: a file deleted or
    replaced on the server must not stay allocated for as long as nasd runs."""
    export = make_export(tmp_path)
    (export / "big").write_bytes(os.urandom(4 << 20))
    (export / "replaced").write_bytes(b"old contents")
    config = tmp_path / "nasd.toml"
    config.write_text(f"[limits]\nopen_object_idle_secs = {IDLE_SECS}\n")
    with Nasd(export, args=["--no-root-squash", "--config", config]) as n, \
            Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(n.export_dir)
        big = c.lookup(root, "big").fh
        assert c.write(c.lookup(root, "replaced").fh, 0, b"new").ok
        assert len(c.read(big, 0, 65536).data) == 65536
        # Deleted and replaced by others, not through nasd.
        os.unlink(export / "big")
        assert _deleted_files_held(n.pid, "big"), "nasd had the file open (else this test proves nothing)"
        (export / "replacement").write_bytes(b"replacement")
        os.rename(export / "replacement", export / "replaced")
        deadline = time.monotonic() + LET_GO_WITHIN
        while time.monotonic() < deadline and (_deleted_files_held(n.pid, "big")
                                               or _deleted_files_held(n.pid, "replaced")):
            time.sleep(0.2)
        assert _deleted_files_held(n.pid, "big") == [] and _deleted_files_held(n.pid, "replaced") == [], \
            f"deleted files still held open {LET_GO_WITHIN} s after their last use"
        # The old handle now answers as a deleted file's must.
        assert c.getattr(big).status == rpc.NFS3ERR_STALE
        assert c.read(c.lookup(root, "replaced").fh).data == b"replacement"


def test_a_listing_left_unfinished_lets_its_removed_directory_go_once_idle(tmp_path):
    """The directory stream of a listing a client left unfinished is kept open for its
    next call: it must not keep a directory that others then removed (with every block
    its entries took) for as long as nasd runs, on a server that lists nothing else."""
    export = make_export(tmp_path)
    listed = export / "listed"
    listed.mkdir()
    for i in range(300):
        (listed / f"entry-{i:04}-{'x' * 40}").write_bytes(b"")
    config = tmp_path / "nasd.toml"
    config.write_text(f"[limits]\nopen_object_idle_secs = {IDLE_SECS}\n")
    with Nasd(export, args=["--no-root-squash", "--config", config]) as n, \
            Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(n.export_dir)
        r = c.readdir(c.lookup(root, "listed").fh, count=1024)
        assert r.ok and not r.eof, "one reply of a longer listing"
        for entry in listed.iterdir():
            entry.unlink()
        listed.rmdir()
        assert _deleted_files_held(n.pid, "listed"), "nasd kept the stream open (else this test proves nothing)"
        deadline = time.monotonic() + LET_GO_WITHIN
        while time.monotonic() < deadline and _deleted_files_held(n.pid, "listed"):
            time.sleep(0.2)
        assert _deleted_files_held(n.pid, "listed") == [], f"a removed directory still held open {LET_GO_WITHIN} s after its listing stopped"


def test_handle_survives_rename_on_disk(srv, c):
    base = Path(srv.export_dir)
    (base / "rn_a").mkdir()
    (base / "rn_b").mkdir()
    (base / "rn_a" / "f").write_bytes(b"renamed")
    dfh = c.lookup(c.export_root, "rn_a").fh
    fh = c.lookup(dfh, "f").fh
    ino = os.stat(base / "rn_a" / "f").st_ino
    os.rename(base / "rn_a" / "f", base / "rn_b" / "g")
    r = c.getattr(fh)
    assert r.ok and r.attr.fileid == ino
    assert c.read(fh).data == b"renamed"
    os.rename(base / "rn_a", base / "rn_c")  # the directory too
    assert c.getattr(dfh).ok
    assert c.create(dfh, "made-after-rename").ok
    assert (base / "rn_c" / "made-after-rename").exists()


# ------------------------------------------------------------ escapes

def test_flipped_handle_bytes_never_ok(srv, c):
    p = Path(srv.export_dir) / "flip"
    p.write_bytes(b"flip")
    handles = [c.export_root, c.lookup(c.export_root, "flip").fh]
    for fh in handles:
        assert c.getattr(fh).ok
        for i in range(len(fh)):
            for mask in (0x01, 0xFF):
                bad = bytearray(fh)
                bad[i] ^= mask
                r = c.getattr(bytes(bad))
                assert r.status in (rpc.NFS3ERR_STALE, rpc.NFS3ERR_BADHANDLE), \
                    f"byte {i} ^ {mask:#x}: status {r.status}"
        # truncated / extended / empty
        for bad in (fh[:-1], fh + b"\0", b"", fh[:6]):
            assert c.getattr(bad).status in (rpc.NFS3ERR_STALE, rpc.NFS3ERR_BADHANDLE)
        assert c.read(bytes([fh[0] ^ 0xFF]) + fh[1:]).status in (rpc.NFS3ERR_STALE, rpc.NFS3ERR_BADHANDLE)


def test_handle_from_other_server_key_is_stale(tmp_path, srv, c):
    """Same export directory, different state dir (= different handle key)."""
    fh = c.export_root
    with Nasd(srv.export_dir, args=["--no-root-squash"]) as other, \
            Nfs3Client(other.host, other.port, cred=ROOT) as oc:
        assert oc.getattr(fh).status == rpc.NFS3ERR_STALE


def test_lookup_dotdot_at_export_root_is_root(srv, c):
    root_id = c.getattr(c.export_root).attr.fileid
    assert root_id == os.stat(srv.export_dir).st_ino
    r = c.lookup(c.export_root, "..")
    assert r.ok and r.attr.fileid == root_id
    assert c.getattr(r.fh).attr.fileid == root_id
    r2 = c.lookup(r.fh, "..")
    assert r2.ok and r2.attr.fileid == root_id
    # readdir of the root: ".." names the root as well (or is left out)
    ents = {name: fid for fid, name, _ in c.readdir_all(c.export_root)}
    assert ents.get("..", root_id) == root_id


def test_lookup_of_names_with_slash_fails(srv, c):
    for name in ("../..", "sub/../..", "/etc", "a/b", "..\0"):
        r = c.lookup(c.export_root, name)
        assert not r.ok, f"LOOKUP {name!r} must fail"


def test_symlink_pointing_out_of_export(srv, c):
    link = Path(srv.export_dir) / "etc_link"
    os.symlink("/etc", link)
    r = c.lookup(c.export_root, "etc_link")
    assert r.ok and r.attr.type == rpc.NF3LNK
    assert c.read(r.fh).status != rpc.NFS3_OK
    assert c.readdir(r.fh).status != rpc.NFS3_OK
    assert not c.lookup(r.fh, "passwd").ok, "LOOKUP through a symlink handle must fail"
    assert not c.create(r.fh, "planted").ok
    assert not os.path.exists("/etc/planted")
    rl = c.readlink(r.fh)
    assert rl.ok and rl.target == "/etc"
    # the same with a relative symlink climbing out
    os.symlink("../../../../../../../../etc/passwd", Path(srv.export_dir) / "rel_link")
    r = c.lookup(c.export_root, "rel_link")
    assert r.ok and r.attr.type == rpc.NF3LNK
    assert c.read(r.fh).status != rpc.NFS3_OK
    assert c.readlink(r.fh).target == "../../../../../../../../etc/passwd"


def test_mount_escape_paths_refused(srv, c):
    base = srv.export_dir
    os.symlink("/etc", Path(base) / "mnt_etc")
    os.mkdir(Path(base) / "realsub")
    for path in ("/../../etc", f"{base}/../../etc", f"{base}/..", f"{base}/mnt_etc",
                 f"{base}/realsub/../../..", "/etc", f"{base}/mnt_etc/ssl"):
        r = c.mnt(path)
        assert r.status != rpc.MNT3_OK, f"MNT {path!r} must be refused"
    # while a real subdirectory is fine
    r = c.mnt(f"{base}/realsub")
    assert r.ok and c.getattr(r.fh).attr.fileid == os.stat(Path(base) / "realsub").st_ino


def test_subdirectory_export_dotdot_stays_inside(tmp_path):
    top = make_export(tmp_path, "X")
    sub = top / "sub"
    sub.mkdir()
    (top / "outside").write_bytes(b"must not be reachable")
    (sub / "inside").write_bytes(b"ok")
    ex = write_exports(tmp_path, [f"{sub} 127.0.0.1(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as cl:
        assert cl.mnt(str(top)).status != rpc.MNT3_OK, "the parent is not exported"
        root = cl.root(str(sub))
        sub_id = cl.getattr(root).attr.fileid
        assert sub_id == os.stat(sub).st_ino
        r = cl.lookup(root, "..")
        assert r.ok and r.attr.fileid == sub_id != os.stat(top).st_ino
        assert not cl.lookup(r.fh, "outside").ok
        assert not cl.lookup(root, "outside").ok
        names = {name for _, name, _ in cl.readdir_all(r.fh)}
        assert "outside" not in names and "inside" in names
        # a subdirectory of the export, then ".." twice
        d = cl.mkdir(root, "deeper")
        assert d.ok
        up = cl.lookup(d.fh, "..")
        assert up.ok and up.attr.fileid == sub_id
        up2 = cl.lookup(up.fh, "..")
        assert up2.ok and up2.attr.fileid == sub_id


def test_directory_moved_out_of_the_export_leads_nowhere(tmp_path):
    """A client keeps the handle of a directory that is then moved out of the export (by
    a local user here; a client of a wider export could do the same). Its `..` must not
    lead to the directories above the export, whether the directory is still cached or
    its handle is used after a restart."""
    top = make_export(tmp_path, "X")
    sub = top / "sub"
    (sub / "d").mkdir(parents=True)
    (top / "secret").write_bytes(b"must not be reachable")
    ex = write_exports(tmp_path, [f"{sub} 127.0.0.1(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n:
        with Nfs3Client(n.host, n.port, cred=ROOT) as cl:
            root = cl.root(str(sub))
            d = cl.lookup(root, "d").fh
            assert cl.lookup(d, "..").attr.fileid == os.stat(sub).st_ino
            os.rename(sub / "d", top / "moved")
            up = cl.lookup(d, "..")
            assert up.status == rpc.NFS3ERR_STALE, f"`..` of a directory moved out gave nfsstat3 {up.status}"
        n.restart()
        with Nfs3Client(n.host, n.port, cred=ROOT) as cl:
            r = cl.getattr(d)
            assert r.status == rpc.NFS3ERR_STALE, f"the moved directory's handle gave nfsstat3 {r.status} after a restart"
            # Moved back into the export, the same handle works again.
            os.rename(top / "moved", sub / "d")
            assert cl.getattr(d).ok
            assert cl.lookup(d, "..").attr.fileid == os.stat(sub).st_ino


def test_a_cached_directory_moved_out_of_the_export_stops_being_served(tmp_path):
    """A client that keeps using the handle of a directory moved out of the export (so
    nasd keeps it cached) must not go on working in it: within a few seconds every call
    through the handle answers STALE, and nothing is made outside the export."""
    top = make_export(tmp_path, "X")
    sub = top / "sub"
    (sub / "d").mkdir(parents=True)
    ex = write_exports(tmp_path, [f"{sub} 127.0.0.1(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as cl:
        d = cl.lookup(cl.root(str(sub)), "d").fh
        assert cl.create(d, "inside").ok
        os.rename(sub / "d", top / "moved")
        deadline = time.monotonic() + 10
        while cl.getattr(d).ok and time.monotonic() < deadline:
            time.sleep(0.1)   # a busy client: the handle never goes idle in the cache
        assert cl.getattr(d).status == rpc.NFS3ERR_STALE, "the directory outside the export is still served"
        assert cl.create(d, "outside").status == rpc.NFS3ERR_STALE
        assert cl.lookup(d, "inside").status == rpc.NFS3ERR_STALE
        assert sorted(os.listdir(top / "moved")) == ["inside"]
        # Moved back, it is served again.
        os.rename(top / "moved", sub / "d")
        assert cl.getattr(d).ok


def test_dotdot_of_a_directory_being_moved_out_never_leads_out(tmp_path):
    """A directory moved in and out of the export while a client looks up its `..`: each
    answer is the parent inside the export or STALE, never the directory outside it
    (whose entries the client could then read). The check must be made on the parent
    found, not on the directory before the lookup: between the two it may move."""
    top = make_export(tmp_path, "X")
    sub = top / "sub"
    (sub / "a" / "b").mkdir(parents=True)
    outside = top / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"must not be reachable")
    ex = write_exports(tmp_path, [f"{sub} 127.0.0.1(rw,no_root_squash,insecure)"])
    stop = threading.Event()

    def mover():
        inside, out = sub / "a" / "b", outside / "b"
        while not stop.is_set():
            os.rename(inside, out)
            os.rename(out, inside)

    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as cl:
        root = cl.root(str(sub))
        b = cl.lookup(cl.lookup(root, "a").fh, "b").fh
        t = threading.Thread(target=mover)
        t.start()
        answers = {}
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                up = cl.lookup(b, "..")
                answers[up.status] = answers.get(up.status, 0) + 1
                if up.ok:
                    leak = cl.lookup(up.fh, "secret")
                    assert leak.status != rpc.NFS3_OK, \
                        f"`..` led out of the export (parent fileid {up.attr.fileid}) after {sum(answers.values())} lookups"
        finally:
            stop.set()
            t.join()
        print(f"`..` answers by status: {answers}")
        assert answers.get(rpc.NFS3_OK, 0) > 0, "never answered: the test raced nothing"
        assert answers.get(rpc.NFS3ERR_STALE, 0) > 0, "never looked up while outside: the test raced nothing"


class HungFuseMount:
    """A FUSE file system mounted on `point` whose daemon never answers: the kernel holds
    any call that needs the daemon (a GETATTR of its root to refresh attributes, say)
    until the connection is aborted, as an NFS mount of a server that is down holds
    it. Made by hand (open /dev/fuse, mount(2) with its descriptor, read nothing);
    leaving aborts the connection, which fails what was held, and unmounts."""

    def __init__(self, point: Path):
        self.point = point

    def __enter__(self):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if self.libc.mount(b"nasd-test-hung", str(self.point).encode(), b"fuse", 0, opts) != 0:
            e = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(e, f"mount fuse on {self.point}: {os.strerror(e)}")
        return self

    def __exit__(self, *exc):
        os.close(self.fd)   # the last descriptor: the connection is aborted
        MNT_DETACH = 2
        assert self.libc.umount2(str(self.point).encode(), MNT_DETACH) == 0, "umount"


def test_a_hung_file_system_mounted_inside_the_export_holds_no_listing_or_lookup(srv, tmp_path):
    """A file system mounted inside the export whose server hangs (here a FUSE daemon that
    never answers) is not served, and must not be waited on either: READDIRPLUS of the
    directory it is mounted in lists its name at once (without a handle: the client
    looks it up), LOOKUP of it answers ACCES at once, and a CREATE of its name is refused at once. Asking it for fresh attributes
    of its root would hold both for as long as it hangs, for an answer thrown away."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("a FUSE mount needs root and /dev/fuse")
    parent = Path(srv.export_dir) / "with_hung_mount"
    parent.mkdir()
    (parent / "plain").write_text("plain\n")
    (parent / "hung").mkdir()
    with Nfs3Client(srv.host, srv.port, cred=ROOT, timeout=5) as cl:
        root = cl.root(srv.export_dir)
        dirfh = cl.lookup(root, "with_hung_mount").fh
        with HungFuseMount(parent / "hung"):
            # Each call fails the test by timing out if nasd waits on the mount.
            listed = {e[1]: e for e in cl.readdirplus(dirfh).entries}
            assert set(listed) >= {"plain", "hung"}, listed
            assert listed["plain"][4] is not None, "an ordinary entry comes with its handle"
            assert listed["hung"][4] is None, "the mount point was given a handle"
            r = cl.lookup(dirfh, "hung")
            assert r.status == rpc.NFS3ERR_ACCES, f"LOOKUP of the mount point answered {r.status}"
            # A CREATE of the name opens what is there: refused too, without waiting.
            r = cl.create(dirfh, "hung", how="unchecked")
            assert not r.ok, "CREATE over a mount point succeeded"
            assert cl.lookup(dirfh, "plain").ok
        # Unmounted, the plain directory is served again.
        assert cl.lookup(dirfh, "hung").ok


def test_bind_mount_inside_export_is_not_crossed(srv, c, tmp_path):
    """A directory bind-mounted into the export from outside stays out of reach: LOOKUP
    of the mount point is refused, and so is MOUNT of a path through it. Removing the
    name it is mounted on answers ACCES, as knfsd does, not IO (a failing disk), and so
    does renaming it or renaming another directory over it."""
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    point = Path(srv.export_dir) / "bind_point"
    point.mkdir()
    import subprocess
    subprocess.run(["mount", "--bind", str(outside), str(point)], check=True)
    try:
        r = c.lookup(c.export_root, "bind_point")
        assert not r.ok and r.status == rpc.NFS3ERR_ACCES
        assert c.mnt(str(point)).status != 0
        r = c.rmdir(c.export_root, "bind_point")
        assert r.status == rpc.NFS3ERR_ACCES, f"RMDIR of a mount point answered {r.status}"
        # Renamed, or renamed over: ACCES too.
        r = c.rename(c.export_root, "bind_point", c.export_root, "moved_point")
        assert r.status == rpc.NFS3ERR_ACCES, f"RENAME of a mount point answered {r.status}"
        assert c.mkdir(c.export_root, "empty_dir").ok
        r = c.rename(c.export_root, "empty_dir", c.export_root, "bind_point")
        assert r.status == rpc.NFS3ERR_ACCES, f"RENAME onto a mount point answered {r.status}"
        assert c.rmdir(c.export_root, "empty_dir").ok
    finally:
        subprocess.run(["umount", str(point)], check=True)
    # Unmounted, the plain directory is served again.
    assert c.lookup(c.export_root, "bind_point").ok
    assert c.rmdir(c.export_root, "bind_point").ok
