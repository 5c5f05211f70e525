"""NFSv3 procedure semantics against files prepared on disk: ACCESS from mode bits and
the caller's identity, FSINFO / FSSTAT / PATHCONF, weak cache consistency data,
CREATE modes and MKNOD, the duplicate request cache for RENAME / LINK / UNSTABLE
WRITE, and READDIR paging with the cookie verifier."""

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import (Nfs3Client, auth_sys, nfs3_args, decode_result, NFS_PROG,  # noqa: E402
                     ACCESS3_READ as R, ACCESS3_LOOKUP as L, ACCESS3_MODIFY as M,
                     ACCESS3_EXTEND as E, ACCESS3_DELETE as D, ACCESS3_EXECUTE as X,
                     ACCESS3_ALL)
from integration._common import ROOT  # noqa: E402

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown, identity switching in nasd)")

OWNER_UID, GROUP_GID = 1000, 2000


@pytest.fixture
def work(srv, c, request):
    """A fresh directory in the export for one test: (on-disk path, handle)."""
    d = Path(srv.export_dir) / request.node.name.replace("[", "_").replace("]", "").replace("/", "_")
    d.mkdir()
    r = c.lookup(c.export_root, d.name)
    assert r.ok
    return d, r.fh


def _ts(ns: int) -> tuple:
    return divmod(ns, 1_000_000_000)


def _pre(st: os.stat_result) -> dict:
    """pre_op_attr as it must look for this stat."""
    return {"size": st.st_size, "mtime": _ts(st.st_mtime_ns), "ctime": _ts(st.st_ctime_ns)}


_FTYPE = {stat.S_IFREG: rpc.NF3REG, stat.S_IFDIR: rpc.NF3DIR, stat.S_IFBLK: rpc.NF3BLK,
          stat.S_IFCHR: rpc.NF3CHR, stat.S_IFLNK: rpc.NF3LNK, stat.S_IFSOCK: rpc.NF3SOCK,
          stat.S_IFIFO: rpc.NF3FIFO}


def _attr_of(st: os.stat_result) -> dict:
    return {"type": _FTYPE[stat.S_IFMT(st.st_mode)], "mode": st.st_mode & 0o7777, "nlink": st.st_nlink,
            "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size, "used": st.st_blocks * 512,
            "fileid": st.st_ino, "atime": _ts(st.st_atime_ns), "mtime": _ts(st.st_mtime_ns),
            "ctime": _ts(st.st_ctime_ns)}


def _attr_dict(a: rpc.Fattr) -> dict:
    return {k: getattr(a, k) for k in ("type", "mode", "nlink", "uid", "gid", "size", "used", "fileid",
                                       "atime", "mtime", "ctime")}


def _age(*paths):
    """Give each path an old, distinctive mtime, then let the clock move on, so that a
    pre-op mtime/ctime can only match the state before the operation."""
    for i, p in enumerate(paths):
        os.utime(p, ns=(1_000_000_000_123_456_789 + i, 1_000_000_000_987_654_321 + i), follow_symlinks=False)
    time.sleep(0.05)


def _bits(mask: int) -> str:
    names = [(R, "READ"), (L, "LOOKUP"), (M, "MODIFY"), (E, "EXTEND"), (D, "DELETE"), (X, "EXECUTE")]
    return "|".join(n for b, n in names if mask & b) or "0"


# ------------------------------------------------------------ ACCESS

OWNER = auth_sys(OWNER_UID, 1500, gids=[1500])                # owner, not in the group
GROUP = auth_sys(1001, GROUP_GID, gids=[GROUP_GID])           # primary group matches
SUPPL = auth_sys(1002, 3000, gids=[3000, 3001, GROUP_GID])    # supplementary group matches
OTHER = auth_sys(1003, 3000, gids=[3000])
OWNER_IN_GROUP = auth_sys(OWNER_UID, GROUP_GID, gids=[GROUP_GID])
MEMBER_NOT_OWNER = auth_sys(1004, GROUP_GID, gids=[GROUP_GID])

# (kind, mode, caller, granted for a request of all six bits).  Files owned by
# OWNER_UID:GROUP_GID.  Files: r -> READ, w -> MODIFY|EXTEND, x -> EXECUTE (DELETE and
# LOOKUP have no meaning).  Directories: r -> READ, x -> LOOKUP, w+x -> MODIFY|EXTEND|DELETE
# (EXECUTE has no meaning).  Root: everything, except EXECUTE on a file without any x bit.
ACCESS_CASES = [
    ("file", 0o754, OWNER, R | M | E | X),
    ("file", 0o754, GROUP, R | X),
    ("file", 0o754, SUPPL, R | X),
    ("file", 0o754, OTHER, R),
    ("file", 0o754, ROOT, R | M | E | X),
    ("file", 0o640, ROOT, R | M | E),          # no x bit anywhere: root may not execute
    ("file", 0o000, ROOT, R | M | E),
    ("file", 0o001, ROOT, R | M | E | X),      # any x bit lets root execute
    ("file", 0o461, OWNER, R),
    ("file", 0o461, GROUP, R | M | E),
    ("file", 0o461, OTHER, X),
    ("file", 0o070, OWNER_IN_GROUP, 0),        # the owner class decides, even if the group would allow
    ("file", 0o070, MEMBER_NOT_OWNER, R | M | E | X),
    ("file", 0o607, GROUP, 0),                 # the group class decides, even if other would allow
    ("file", 0o607, OTHER, R | M | E | X),
    ("file", 0o2755, OTHER, R | X),            # setgid bit does not grant anything
    ("dir", 0o750, OWNER, R | L | M | E | D),
    ("dir", 0o750, GROUP, R | L),
    ("dir", 0o750, SUPPL, R | L),
    ("dir", 0o750, OTHER, 0),
    ("dir", 0o000, ROOT, R | L | M | E | D),
    ("dir", 0o731, GROUP, L | M | E | D),
    ("dir", 0o731, OTHER, L),
    ("dir", 0o1777, OTHER, R | L | M | E | D),
    ("dir", 0o070, OWNER_IN_GROUP, 0),
    ("dir", 0o070, MEMBER_NOT_OWNER, R | L | M | E | D),
    ("dir", 0o500, OWNER, R | L),
]


def _owned_object(d, kind, mode):
    """`d/obj`, a directory or a small script, owned by OWNER_UID:GROUP_GID with `mode`."""
    p = d / "obj"
    if kind == "dir":
        p.mkdir()
    else:
        p.write_bytes(b"#!/bin/sh\n")
    os.chown(p, OWNER_UID, GROUP_GID)
    os.chmod(p, mode)
    return p


def _cred_name(cr):
    return {OWNER: "owner", GROUP: "group", SUPPL: "suppl", OTHER: "other", ROOT: "root",
            OWNER_IN_GROUP: "owner_in_group", MEMBER_NOT_OWNER: "member"}[cr]


@needs_root
@pytest.mark.parametrize("kind,mode,cred,expect", ACCESS_CASES,
                         ids=[f"{k}-{m:o}-{_cred_name(cr)}" for k, m, cr, _ in ACCESS_CASES])
def test_access_follows_mode_bits_and_identity(srv, c, work, kind, mode, cred, expect):
    d, dfh = work
    p = _owned_object(d, kind, mode)
    fh = c.lookup(dfh, "obj").fh
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == mode
    with Nfs3Client(srv.host, srv.port, cred=cred) as uc:
        r = uc.access(fh, ACCESS3_ALL)
        assert r.ok, f"ACCESS status {r.status}"
        assert r.access == expect, (f"{kind} mode {mode:o} owner {OWNER_UID}:{GROUP_GID}, caller "
                                    f"{_cred_name(cred)}: granted {_bits(r.access)}, expected {_bits(expect)}")
        assert r.attr.fileid == st.st_ino and r.attr.mode == mode
        # Only what was asked for comes back.
        for bit in (R, L, M, E, D, X):
            assert uc.access(fh, bit).access == expect & bit
        assert uc.access(fh, 0).access == 0


@needs_root
@pytest.mark.parametrize("mode", [0o600, 0o200], ids=lambda m: f"{m:03o}")
def test_access_directory_write_without_search_grants_no_changes(srv, c, work, mode):
    """Adding, renaming or removing an entry needs write AND search permission on the
    directory (the kernel refuses it otherwise), so ACCESS must not grant MODIFY, EXTEND
    or DELETE on a directory whose owner has w but not x: CREATE and REMOVE there fail."""
    d, dfh = work
    sub = d / "sub"
    sub.mkdir()
    (sub / "victim").write_bytes(b"")
    os.chown(sub, OWNER_UID, GROUP_GID)
    os.chmod(sub, mode)
    fh = c.lookup(dfh, "sub").fh
    with Nfs3Client(srv.host, srv.port, cred=OWNER) as uc:
        assert uc.create(fh, "new").status == rpc.NFS3ERR_ACCES
        assert uc.remove(fh, "victim").status == rpc.NFS3ERR_ACCES
        r = uc.access(fh, ACCESS3_ALL)
        assert r.ok
        assert r.access & (M | E | D) == 0, (
            f"dir mode {mode:o}, caller is the owner: ACCESS granted {_bits(r.access)}, "
            f"but CREATE and REMOVE in it fail with NFS3ERR_ACCES")
    assert sorted(os.listdir(sub)) == ["victim"]


@needs_root
@pytest.mark.parametrize("mode", [0o700, 0o600, 0o500, 0o400, 0o300, 0o200, 0o100, 0o000],
                         ids=lambda m: f"{m:03o}")
def test_access_agrees_with_directory_operations(srv, c, work, mode):
    """For each ACCESS bit of a directory, the operation it stands for succeeds exactly
    when the bit is granted: READ <-> READDIR, LOOKUP <-> LOOKUP, EXTEND <-> CREATE,
    DELETE <-> REMOVE (caller = the directory's owner)."""
    d, dfh = work
    sub = d / "sub"
    sub.mkdir()
    (sub / "victim").write_bytes(b"")
    os.chown(sub, OWNER_UID, GROUP_GID)
    os.chmod(sub, mode)
    fh = c.lookup(dfh, "sub").fh
    with Nfs3Client(srv.host, srv.port, cred=OWNER) as uc:
        granted = uc.access(fh, ACCESS3_ALL).access
        done = {
            "READ/READDIR": (R, uc.readdir(fh).status),
            "LOOKUP/LOOKUP": (L, uc.lookup(fh, "victim").status),
            "EXTEND/CREATE": (E, uc.create(fh, "new", how="guarded").status),
            "DELETE/REMOVE": (D, uc.remove(fh, "victim").status),
        }
    wrong = {k: f"ACCESS {'grants' if granted & bit else 'denies'}, procedure gave status {st}"
             for k, (bit, st) in done.items() if bool(granted & bit) != (st == rpc.NFS3_OK)}
    for k, (bit, st) in done.items():
        assert st in (rpc.NFS3_OK, rpc.NFS3ERR_ACCES), f"{k}: unexpected status {st}"
    assert not wrong, f"dir mode {mode:o} (ACCESS granted {_bits(granted)}): {wrong}"


@needs_root
@pytest.mark.parametrize("kind", ["file", "dir"])
@pytest.mark.parametrize("cred", [ROOT, OWNER], ids=["root", "owner"])
def test_access_denies_changes_to_an_immutable_object_even_to_owner_and_root(srv, c, work, kind, cred):
    """Mode bits are not the whole answer for write: an immutable inode (`chattr +i`), like
    a file system mounted read-only, refuses every change, to its owner and root as well
    (knfsd's `nfsd_permission` asks the kernel). ACCESS must say so, or the client's
    open for writing succeeds and the data fails only at write-back."""
    d, dfh = work
    p = _owned_object(d, kind, 0o755)
    made = subprocess.run(["chattr", "+i", str(p)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"the test file system takes no inode flags (chattr +i: {made.stderr.strip()})")
    try:
        fh = c.lookup(dfh, "obj").fh
        with Nfs3Client(srv.host, srv.port, cred=cred) as uc:
            r = uc.access(fh, ACCESS3_ALL)
            assert r.ok, f"ACCESS status {r.status}"
            assert r.access & (M | E | D) == 0, f"granted {_bits(r.access)} on an immutable {kind}"
            assert r.access & R, "reading an immutable object is allowed"
            if kind == "file":
                w = uc.write(fh, 0, b"x")
                assert w.status == rpc.NFS3ERR_PERM, f"WRITE to an immutable file: status {w.status}"
            else:
                assert uc.create(fh, "new").status == rpc.NFS3ERR_PERM
    finally:
        subprocess.run(["chattr", "-i", str(p)], check=True)


def test_readdirplus_fills_maxcount_whatever_dircount_says(srv, c, work):
    """READDIRPLUS replies are bounded by maxcount alone, as knfsd's ("we choose to ignore
    the dircount parameter"): older Linux clients send dircount = maxcount / 8,
    which honoured would cut a reply of ~190 entries to ~100 and double the round trips
    of `ls -l` on a large directory."""
    d, dfh = work
    sub = d / "many"
    sub.mkdir()
    for i in range(400):
        (sub / f"entry-{i:04d}").write_bytes(b"")
    fh = c.lookup(dfh, "many").fh
    small = c.readdirplus(fh, dircount=32768 >> 3, maxcount=32768)
    full = c.readdirplus(fh, dircount=32768, maxcount=32768)
    assert small.ok and full.ok
    assert len(small.entries) == len(full.entries) > 100, (len(small.entries), len(full.entries))
    assert len(small.reply.raw) <= 32768 + 64
    assert all(a is not None and h for _, _, _, a, h in small.entries)


@needs_root
def test_readdir_needs_read_not_search_permission(srv, c, work):
    """Listing a directory needs read permission on it, not search permission (a local
    process as the owner of a mode 0400 directory can readdir it); search without read
    (0100) must not list."""
    d, dfh = work
    for name, mode in (("r_only", 0o400), ("x_only", 0o100)):
        sub = d / name
        sub.mkdir()
        (sub / "entry").write_bytes(b"")
        os.chown(sub, OWNER_UID, GROUP_GID)
        os.chmod(sub, mode)
    with Nfs3Client(srv.host, srv.port, cred=OWNER) as uc:
        r = uc.readdir(c.lookup(dfh, "r_only").fh)
        x = uc.readdir(c.lookup(dfh, "x_only").fh)
    assert x.status == rpc.NFS3ERR_ACCES
    assert r.ok, f"READDIR of a mode 0400 directory by its owner: status {r.status}, expected NFS3_OK"
    assert {n for _, n, _ in r.entries} == {".", "..", "entry"}


# ------------------------------------------------------------ FSINFO / FSSTAT / PATHCONF

def test_fsinfo_tcp(srv, c, work):
    d, dfh = work
    r = c.fsinfo(c.export_root)
    assert r.ok
    assert r.attr.fileid == os.stat(srv.export_dir).st_ino and r.attr.type == rpc.NF3DIR
    assert (r.rtmax, r.wtmax) == (1 << 20, 1 << 20)
    assert 0 < r.rtpref <= r.rtmax and 0 < r.wtpref <= r.wtmax
    assert r.rtmult > 0 and r.rtmax % r.rtmult == 0 and r.wtmult > 0 and r.wtmax % r.wtmult == 0
    assert 4096 <= r.dtpref <= r.rtmax
    assert r.maxfilesize >= (1 << 40), r.maxfilesize
    assert r.time_delta == (0, 1), "timestamps are kept to the nanosecond"
    assert r.properties & rpc.FSF3_LINK and r.properties & rpc.FSF3_SYMLINK
    assert r.properties & rpc.FSF3_HOMOGENEOUS and r.properties & rpc.FSF3_CANSETTIME
    assert r.properties & ~0x1B == 0, f"unknown property bits {r.properties:#x}"
    # the same answer for any handle of the export
    (d / "f").write_bytes(b"")
    r2 = c.fsinfo(c.lookup(dfh, "f").fh)
    assert (r2.rtmax, r2.wtmax, r2.dtpref, r2.properties) == (r.rtmax, r.wtmax, r.dtpref, r.properties)
    # the advertised maxima really work
    data = os.urandom(r.wtmax)
    fh = c.lookup(dfh, "f").fh
    w = c.write(fh, 0, data, stable="unstable")
    assert w.ok and w.count == r.wtmax
    rd = c.read(fh, 0, r.rtmax)
    assert rd.ok and rd.count == r.rtmax and rd.data == data


def test_fsinfo_udp(srv, c, work):
    d, dfh = work
    (d / "f").write_bytes(os.urandom(100_000))
    fh = c.lookup(dfh, "f").fh
    with Nfs3Client(srv.host, srv.port, proto="udp", cred=ROOT, timeout=5) as uc:
        r = uc.fsinfo(c.export_root)
        assert r.ok
        assert (r.rtmax, r.wtmax) == (32768, 32768)
        assert r.rtpref <= r.rtmax and r.wtpref <= r.wtmax
        # a READDIR of the preferred size is answered in one datagram
        rd = uc.readdir(dfh, count=r.dtpref)
        assert rd.ok and rd.eof and {n for _, n, _ in rd.entries} == {".", "..", "f"}
        rd = uc.read(fh, 0, r.rtmax)
        assert rd.ok and rd.count == r.rtmax
        data = os.urandom(r.wtmax)
        w = uc.write(fh, 0, data)
        assert w.ok and w.count == r.wtmax
    assert (d / "f").read_bytes()[:r.wtmax] == data


def test_fsinfo_maxfilesize_is_writable(srv, c, work):
    """maxfilesize is "the maximum size of a file on the file system" (RFC 1813 3.3.19):
    a one-byte WRITE ending exactly at maxfilesize must not fail with NFS3ERR_FBIG."""
    d, dfh = work
    (d / "sparse").write_bytes(b"")
    fh = c.lookup(dfh, "sparse").fh
    maxsize = c.fsinfo(c.export_root).maxfilesize
    w = c.write(fh, maxsize - 1, b"x", stable="unstable")
    assert w.ok and w.count == 1, (f"FSINFO maxfilesize={maxsize}, WRITE 1 byte at offset {maxsize - 1}: "
                                   f"status {w.status}")
    assert os.stat(d / "sparse").st_size == maxsize


@pytest.mark.parametrize("size", [1 << 63, (1 << 64) - 1], ids=["2^63", "2^64-1"])
def test_setattr_size_beyond_any_file_is_fbig(srv, c, work, size):
    """A size3 beyond what off_t holds is too big for any file: FBIG, as knfsd answers
    (it takes the largest offset, which the file system refuses), not INVAL."""
    d, dfh = work
    (d / "f").write_bytes(b"keep")
    fh = c.lookup(dfh, "f").fh
    r = c.setattr(fh, size=size)
    assert r.status == rpc.NFS3ERR_FBIG, f"SETATTR size={size}: status {r.status}"
    assert (d / "f").read_bytes() == b"keep"


def test_fsstat_matches_statvfs(srv, c):
    tol = 64 << 20   # other processes may be writing to the same file system
    before = os.statvfs(srv.export_dir)
    r = c.fsstat(c.export_root)
    after = os.statvfs(srv.export_dir)
    assert r.ok
    assert r.attr.fileid == os.stat(srv.export_dir).st_ino
    f = before.f_frsize

    def between(name, got, a, b, slack):
        lo, hi = min(a, b) - slack, max(a, b) + slack
        assert lo <= got <= hi, f"{name}={got}, statvfs says {a}..{b} (+-{slack})"

    assert r.tbytes == before.f_blocks * f == after.f_blocks * f
    between("fbytes", r.fbytes, before.f_bfree * f, after.f_bfree * f, tol)
    between("abytes", r.abytes, before.f_bavail * f, after.f_bavail * f, tol)
    assert r.tfiles == before.f_files
    between("ffiles", r.ffiles, before.f_ffree, after.f_ffree, 10_000)
    between("afiles", r.afiles, before.f_favail, after.f_favail, 10_000)
    assert r.abytes <= r.fbytes <= r.tbytes and r.afiles <= r.ffiles <= r.tfiles
    assert r.invarsec == 0


def test_pathconf(srv, c, work):
    d, dfh = work
    r = c.pathconf(c.export_root)
    assert r.ok
    assert r.attr.fileid == os.stat(srv.export_dir).st_ino
    # The export's own file system's limits, as POSIX gives them there.
    assert r.name_max == min(255, os.statvfs(srv.export_dir).f_namemax)
    assert r.linkmax == os.pathconf(srv.export_dir, "PC_LINK_MAX")
    assert r.no_trunc and r.chown_restricted and r.case_preserving and not r.case_insensitive
    # no_trunc + name_max: 255 bytes work, 256 are refused (not truncated)
    assert c.create(dfh, "n" * 255, how="guarded").ok
    assert c.create(dfh, "m" * 256, how="guarded").status == rpc.NFS3ERR_NAMETOOLONG
    assert os.listdir(d) == ["n" * 255]
    # A symlink's target: up to 4,095 bytes (the kernel's limit), NAMETOOLONG past it,
    # as knfsd answers, not GARBAGE_ARGS (a call the server could not read).
    target = "t/" * 2047 + "t"
    assert c.symlink(dfh, "long-link", target).ok
    assert os.readlink(os.path.join(d, "long-link")) == target
    for too_long in (4096, 5000, 60000):
        r = c.symlink(dfh, "too-long-link", "x" * too_long)
        assert r.status == rpc.NFS3ERR_NAMETOOLONG, f"a {too_long}-byte target answered {r.status}"
    os.unlink(os.path.join(d, "long-link"))
    # case preserving, case sensitive
    assert c.create(dfh, "MiXeD", how="guarded").ok
    assert c.lookup(dfh, "mixed").status == rpc.NFS3ERR_NOENT
    assert "MiXeD" in os.listdir(d)


# ------------------------------------------------------------ WCC

def _check_wcc(wcc, before: os.stat_result, path, what):
    pre, post = wcc
    assert pre is not None and post is not None, f"{what}: wcc_data incomplete: {wcc}"
    assert pre == _pre(before), f"{what}: pre-op attrs {pre} != state before {_pre(before)}"
    after = os.stat(path, follow_symlinks=False)
    assert _attr_dict(post) == _attr_of(after), f"{what}: post-op attrs differ from os.stat after"
    return after


def test_wcc_write(srv, c, work):
    d, dfh = work
    f = d / "f"
    f.write_bytes(b"12345")
    fh = c.lookup(dfh, "f").fh
    _age(f)
    before = os.stat(f)
    r = c.write(fh, 3, b"abcdefg", stable="file_sync")
    assert r.ok
    after = _check_wcc(r.wcc, before, f, "WRITE")
    assert r.wcc[0]["size"] == 5 and r.wcc[1].size == 10
    assert after.st_mtime_ns != before.st_mtime_ns


def test_wcc_create(srv, c, work):
    d, dfh = work
    _age(d)
    before = os.stat(d)
    r = c.create(dfh, "new", how="guarded")
    assert r.ok
    after = _check_wcc(r.dir_wcc, before, d, "CREATE dir_wcc")
    assert after.st_mtime_ns != before.st_mtime_ns
    assert _attr_dict(r.attr) == _attr_of(os.stat(d / "new"))


def test_lookup_carries_the_directory_attributes_found_or_not(srv, c, work):
    """The directory's post-op attributes come with every LOOKUP reply (a client caches a
    negative result by them), and they are the directory's, not the entry's."""
    d, dfh = work
    (d / "f").write_bytes(b"12345")
    (d / "sub").mkdir()
    _age(d, d / "f")
    for name, status in (("f", rpc.NFS3_OK), ("sub", rpc.NFS3_OK), ("missing", rpc.NFS3ERR_NOENT)):
        r = c.lookup(dfh, name)
        assert r.status == status, name
        assert r.dir_attr is not None, f"LOOKUP {name}: no directory attributes"
        assert _attr_dict(r.dir_attr) == _attr_of(os.stat(d)), f"LOOKUP {name}: directory attributes"
        if status == rpc.NFS3_OK:
            assert _attr_dict(r.attr) == _attr_of(os.stat(d / name, follow_symlinks=False)), f"LOOKUP {name}"
    # A handle that is no directory: its own attributes, with NOTDIR.
    r = c.lookup(c.lookup(dfh, "f").fh, "x")
    assert r.status == rpc.NFS3ERR_NOTDIR
    assert _attr_dict(r.dir_attr) == _attr_of(os.stat(d / "f"))


def test_wcc_remove(srv, c, work):
    d, dfh = work
    (d / "victim").write_bytes(b"x")
    _age(d)
    before = os.stat(d)
    r = c.remove(dfh, "victim")
    assert r.ok
    after = _check_wcc(r.wcc, before, d, "REMOVE")
    assert after.st_mtime_ns != before.st_mtime_ns


@pytest.mark.parametrize("change", ["mode", "size"])
def test_wcc_setattr(srv, c, work, change):
    d, dfh = work
    f = d / "f"
    f.write_bytes(b"0123456789")
    os.chmod(f, 0o600)
    fh = c.lookup(dfh, "f").fh
    _age(f)
    before = os.stat(f)
    r = c.setattr(fh, **({"mode": 0o640} if change == "mode" else {"size": 4}))
    assert r.ok
    after = _check_wcc(r.wcc, before, f, f"SETATTR {change}")
    assert after.st_ctime_ns != before.st_ctime_ns
    if change == "mode":
        assert stat.S_IMODE(after.st_mode) == 0o640 and after.st_size == 10
    else:
        assert after.st_size == 4 and r.wcc[0]["size"] == 10


@pytest.mark.parametrize("where", ["same_dir", "two_dirs"])
def test_wcc_rename(srv, c, work, where):
    d, dfh = work
    a = d / "a"
    a.mkdir()
    afh = c.lookup(dfh, "a").fh
    if where == "two_dirs":
        b = d / "b"
        b.mkdir()
        bfh = c.lookup(dfh, "b").fh
    else:
        b, bfh = a, afh
    (a / "old").write_bytes(b"x")
    if where == "two_dirs":
        _age(a, b)
    else:
        _age(a)
    before_a, before_b = os.stat(a), os.stat(b)
    r = c.rename(afh, "old", bfh, "new")
    assert r.ok
    _check_wcc(r.from_wcc, before_a, a, "RENAME from_wcc")
    _check_wcc(r.to_wcc, before_b, b, "RENAME to_wcc")
    assert (b / "new").read_bytes() == b"x" and not (a / "old").exists()


# ------------------------------------------------------------ CREATE modes, MKNOD

def test_create_unchecked_with_size_truncates_existing(srv, c, work):
    d, dfh = work
    f = d / "f"
    f.write_bytes(b"hello world")
    ino = os.stat(f).st_ino
    r = c.nfs(rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, "f", "unchecked", mode=0o644, size=0))
    assert r.ok
    assert r.attr.fileid == ino and r.attr.size == 0
    assert os.stat(f).st_ino == ino and f.read_bytes() == b""
    assert c.getattr(r.fh).attr.fileid == ino
    # a non-zero size truncates to that size
    f.write_bytes(b"hello world")
    r = c.nfs(rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, "f", "unchecked", mode=0o644, size=5))
    assert r.ok and r.attr.size == 5 and f.read_bytes() == b"hello"
    # without a size the data stays
    r = c.create(dfh, "f", how="unchecked")
    assert r.ok and r.attr.fileid == ino and f.read_bytes() == b"hello"


def test_create_guarded_existing_is_exist(srv, c, work):
    d, dfh = work
    f = d / "f"
    f.write_bytes(b"keep me")
    (d / "sub").mkdir()
    before = os.stat(f)
    r = c.nfs(rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, "f", "guarded", mode=0o600, size=0))
    assert r.status == rpc.NFS3ERR_EXIST
    assert c.create(dfh, "sub", how="guarded").status == rpc.NFS3ERR_EXIST
    assert f.read_bytes() == b"keep me"
    after = os.stat(f)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (before.st_mode, before.st_ino, before.st_mtime_ns)
    assert (d / "sub").is_dir()


def test_mknod_socket(srv, c, work):
    d, dfh = work
    r = c.mknod(dfh, "sock", rpc.NF3SOCK, mode=0o640)
    assert r.ok, f"MKNOD NF3SOCK status {r.status}"
    st = os.lstat(d / "sock")
    assert stat.S_ISSOCK(st.st_mode), oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert r.attr.type == rpc.NF3SOCK and r.attr.fileid == st.st_ino
    g = c.getattr(r.fh)
    assert g.ok and g.attr.type == rpc.NF3SOCK
    assert c.lookup(dfh, "sock").attr.type == rpc.NF3SOCK
    # the name is taken now
    assert c.mknod(dfh, "sock", rpc.NF3SOCK).status == rpc.NFS3ERR_EXIST


@needs_root
def test_mknod_devices_only_for_unsquashed_root(srv, c, work):
    """Device nodes follow the kernel's CAP_MKNOD: nasd acts with the caller's fsuid, which
    drops the capability for anyone but root, so only an unsquashed root creates them."""
    d, dfh = work
    r = c.mknod(dfh, "null", rpc.NF3CHR, mode=0o600, rdev=(1, 3))
    assert r.ok, f"root MKNOD NF3CHR status {r.status}"
    st = os.lstat(d / "null")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    os.chmod(d, 0o777)
    user = auth_sys(OWNER_UID, GROUP_GID)
    r = c.mknod(dfh, "dev2", rpc.NF3BLK, rdev=(7, 0), cred=user)
    assert r.status in (rpc.NFS3ERR_PERM, rpc.NFS3ERR_ACCES), f"a user made a device node: status {r.status}"
    assert not (d / "dev2").exists()
    # A FIFO needs no privilege.
    assert c.mknod(dfh, "fifo", rpc.NF3FIFO, cred=user).ok


@needs_root
def test_setattr_giving_a_file_away_drops_its_set_id_bits(srv, c, work):
    """A SETATTR that changes the owner and sets a mode in one call must not hand the new
    owner a setuid file: chown clears the bits, and the mode sent with it may not restore
    them (knfsd strips them too). setgid without group execute is not set-group-id and
    stays; a directory keeps both; a mode alone is applied as sent."""
    d, dfh = work
    cases = [("suid", 0o6755, 0o0755), ("sgid-noexec", 0o6745, 0o2745)]
    for name, sent, expect in cases:
        (d / name).write_bytes(b"x")
        fh = c.lookup(dfh, name).fh
        r = c.setattr(fh, mode=sent, uid=OWNER_UID, gid=GROUP_GID)
        assert r.ok, f"SETATTR {name}: status {r.status}"
        st = os.stat(d / name)
        assert (st.st_uid, st.st_gid) == (OWNER_UID, GROUP_GID)
        assert stat.S_IMODE(st.st_mode) == expect, f"{name}: mode {oct(stat.S_IMODE(st.st_mode))}"
    (d / "sub").mkdir()
    r = c.setattr(c.lookup(dfh, "sub").fh, mode=0o2775, uid=OWNER_UID)
    assert r.ok and stat.S_IMODE(os.stat(d / "sub").st_mode) == 0o2775
    (d / "plain").write_bytes(b"x")
    assert c.setattr(c.lookup(dfh, "plain").fh, mode=0o4755).ok
    assert stat.S_IMODE(os.stat(d / "plain").st_mode) == 0o4755


@needs_root
def test_owner_may_write_and_read_its_read_only_file(srv, c, work):
    """knfsd's owner override: a file created 0444 must still take the data that follows
    (cp, tar and the kernel client rely on it); other users are refused."""
    d, dfh = work
    os.chmod(d, 0o777)
    owner = auth_sys(OWNER_UID, GROUP_GID)
    r = c.create(dfh, "ro", how="guarded", mode=0o444, cred=owner)
    assert r.ok and stat.S_IMODE(os.stat(d / "ro").st_mode) == 0o444
    w = c.write(r.fh, 0, b"data", cred=owner)
    assert w.ok and w.count == 4, f"owner WRITE to its 0444 file: status {w.status}"
    assert (d / "ro").read_bytes() == b"data"
    os.chmod(d / "ro", 0o000)
    assert c.read(r.fh, 0, 4, cred=owner).data == b"data", "owner READ of its mode 000 file"
    other = auth_sys(OWNER_UID + 1, GROUP_GID + 1)
    assert c.write(r.fh, 0, b"evil", cred=other).status == rpc.NFS3ERR_ACCES
    assert c.read(r.fh, 0, 4, cred=other).status == rpc.NFS3ERR_ACCES


# ------------------------------------------------------------ duplicate request cache

def test_drc_rename_replay(srv, c, work):
    d, dfh = work
    (d / "a").write_bytes(b"original")
    ino = os.stat(d / "a").st_ino
    xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_RENAME, nfs3_args.rename(dfh, "a", dfh, "b"))
    first = c.resend(msg, xid)
    assert decode_result(rpc.NFSPROC3_RENAME, first).ok
    assert sorted(os.listdir(d)) == ["b"]
    again = c.resend(msg, xid)
    assert again.raw == first.raw, ("replayed RENAME must get the cached reply byte for byte, got status "
                                    f"{decode_result(rpc.NFSPROC3_RENAME, again).status}")
    # if the replay had run, it would now move the new "a" over "b"
    (d / "a").write_bytes(b"newcomer")
    again2 = c.resend(msg, xid)
    assert again2.raw == first.raw
    assert (d / "a").read_bytes() == b"newcomer"
    assert os.stat(d / "b").st_ino == ino and (d / "b").read_bytes() == b"original"
    # the same request under a new XID really runs
    os.unlink(d / "a")
    assert c.rename(dfh, "a", dfh, "b").status == rpc.NFS3ERR_NOENT


def test_commit_of_anything_but_a_file_is_refused_as_knfsd_answers(srv, c, work):
    """COMMIT is for file data: knfsd answers ISDIR for a directory and INVAL for a
    symbolic link or special file (`fh_verify(S_IFREG)`)."""
    d, dfh = work
    (d / "sub").mkdir()
    os.symlink("target", d / "ln")
    os.mkfifo(d / "fifo")
    (d / "f").write_bytes(b"data")
    for name, want in (("sub", rpc.NFS3ERR_ISDIR), ("ln", rpc.NFS3ERR_INVAL), ("fifo", rpc.NFS3ERR_INVAL),
                       ("f", rpc.NFS3_OK)):
        r = c.commit(c.lookup(dfh, name).fh)
        assert r.status == want, f"COMMIT of {name}: status {r.status}, want {want}"


@needs_root
def test_failure_replies_carry_the_attributes_after_the_call(srv, c, work):
    """Every failure arm of RFC 1813 has room for the objects' attributes, and knfsd fills
    it: a client then updates its cache from the reply instead of revalidating (an EXIST
    from an O_EXCL lock-file race, a NOENT, an ACCES). Pre-op attributes stay empty; a
    handle that names nothing has nothing to report."""
    d, dfh = work
    (d / "f").write_bytes(b"data")
    os.chown(d / "f", OWNER_UID, GROUP_GID)
    os.chmod(d / "f", 0o600)
    (d / "sub").mkdir()
    dir_ino, file_ino, sub_ino = (os.stat(d / n).st_ino for n in (".", "f", "sub"))
    fh, sfh = c.lookup(dfh, "f").fh, c.lookup(dfh, "sub").fh

    def after(wcc):
        pre, post = wcc
        assert pre is None
        return post.fileid if post else None

    r = c.create(dfh, "f", how="guarded")
    assert r.status == rpc.NFS3ERR_EXIST and after(r.dir_wcc) == dir_ino
    r = c.remove(dfh, "missing")
    assert r.status == rpc.NFS3ERR_NOENT and after(r.wcc) == dir_ino
    r = c.rename(dfh, "missing", sfh, "x")
    assert r.status == rpc.NFS3ERR_NOENT and (after(r.from_wcc), after(r.to_wcc)) == (dir_ino, sub_ino)
    r = c.link(fh, dfh, "sub")
    assert r.status == rpc.NFS3ERR_EXIST and r.attr.fileid == file_ino and after(r.dir_wcc) == dir_ino
    with Nfs3Client(srv.host, srv.port, cred=OTHER) as uc:
        r = uc.read(fh, 0, 4)
        assert r.status == rpc.NFS3ERR_ACCES and r.attr.fileid == file_ino
        r = uc.write(fh, 0, b"x")
        assert r.status == rpc.NFS3ERR_ACCES and after(r.wcc) == file_ino
    r = c.remove(b"\x01" * 32, "f")
    assert r.status in (rpc.NFS3ERR_BADHANDLE, rpc.NFS3ERR_STALE) and r.wcc == (None, None)
    assert (d / "f").read_bytes() == b"data"


def test_dot_names_are_refused_as_knfsd_answers(srv, c, work):
    """"." and ".." cannot be removed or renamed: ACCES for REMOVE and RMDIR
    (`nfsd_unlink`), PERM for RENAME from or to them (`nfsd_rename`), and nothing moves."""
    d, dfh = work
    (d / "sub").mkdir()
    (d / "f").write_bytes(b"")
    sfh = c.lookup(dfh, "sub").fh
    for name in (".", ".."):
        assert c.remove(sfh, name).status == rpc.NFS3ERR_ACCES, f"REMOVE {name}"
        assert c.rmdir(sfh, name).status == rpc.NFS3ERR_ACCES, f"RMDIR {name}"
        assert c.rename(sfh, name, dfh, "moved").status == rpc.NFS3ERR_PERM, f"RENAME from {name}"
        assert c.rename(dfh, "f", sfh, name).status == rpc.NFS3ERR_PERM, f"RENAME to {name}"
    assert sorted(os.listdir(d)) == ["f", "sub"] and os.listdir(d / "sub") == []


def test_link_of_a_directory_is_isdir_as_knfsd_answers(srv, c, work):
    d, dfh = work
    (d / "sub").mkdir()
    r = c.link(c.lookup(dfh, "sub").fh, dfh, "alias")
    assert r.status == rpc.NFS3ERR_ISDIR, f"nfsstat3 {r.status}"
    assert sorted(os.listdir(d)) == ["sub"]


@needs_root
def test_link_needs_the_directory_not_the_file_as_knfsd(srv, c, work):
    """LINK needs write and search permission on the directory and none on the file, as
    with knfsd (`vfs_link`): the server's `fs.protected_hardlinks`, which stops a local
    process from linking a file it may not read and write, does not apply to clients."""
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
        pytest.skip("fs.protected_hardlinks is off here: nothing would refuse the link")
    d, dfh = work
    f = d / "private"
    f.write_bytes(b"secret")
    os.chown(f, OWNER_UID, GROUP_GID)
    os.chmod(f, 0o600)
    for sub, mode in (("open", 0o777), ("closed", 0o755)):
        (d / sub).mkdir()
        os.chown(d / sub, OWNER_UID, GROUP_GID)
        os.chmod(d / sub, mode)
    fh = c.lookup(dfh, "private").fh
    with Nfs3Client(srv.host, srv.port, cred=OTHER) as uc:
        r = uc.link(fh, c.lookup(dfh, "open").fh, "l")
        assert r.status == rpc.NFS3_OK, f"LINK into a directory the caller may write: status {r.status}"
        r = uc.link(fh, c.lookup(dfh, "closed").fh, "l")
        assert r.status == rpc.NFS3ERR_ACCES, f"LINK into a directory the caller may not write: status {r.status}"
    assert os.stat(d / "open" / "l").st_ino == os.stat(f).st_ino and os.stat(f).st_nlink == 2
    assert not (d / "closed" / "l").exists()


def test_drc_link_replay(srv, c, work):
    d, dfh = work
    (d / "f").write_bytes(b"x")
    fh = c.lookup(dfh, "f").fh
    xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_LINK, nfs3_args.link(fh, dfh, "l"))
    first = c.resend(msg, xid)
    r1 = decode_result(rpc.NFSPROC3_LINK, first)
    assert r1.ok and r1.attr.nlink == 2
    assert os.stat(d / "f").st_nlink == 2
    again = c.resend(msg, xid)
    assert again.raw == first.raw, ("replayed LINK must get the cached reply byte for byte, got status "
                                    f"{decode_result(rpc.NFSPROC3_LINK, again).status}")
    assert os.stat(d / "f").st_nlink == 2 and sorted(os.listdir(d)) == ["f", "l"]
    # even where running it again would succeed, the replay does not run
    os.unlink(d / "l")
    again2 = c.resend(msg, xid)
    assert again2.raw == first.raw
    assert os.stat(d / "f").st_nlink == 1 and os.listdir(d) == ["f"]
    assert c.link(fh, dfh, "l").ok and os.stat(d / "f").st_nlink == 2


def test_drc_unstable_write_replay(srv, c, work):
    d, dfh = work
    f = d / "f"
    f.write_bytes(b"........")
    fh = c.lookup(dfh, "f").fh
    xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_WRITE, nfs3_args.write(fh, 2, b"WXYZ", stable="unstable"))
    first = c.resend(msg, xid)
    r1 = decode_result(rpc.NFSPROC3_WRITE, first)
    assert r1.ok and r1.count == 4 and r1.committed == rpc.UNSTABLE
    assert f.read_bytes() == b"..WXYZ.."
    # change the bytes behind the server's back: a replay that ran would restore them
    with open(f, "r+b") as fp:
        fp.write(b"--------")
    mtime = os.stat(f).st_mtime_ns
    time.sleep(0.02)
    again = c.resend(msg, xid)
    assert again.raw == first.raw, "replayed UNSTABLE WRITE must get the cached reply byte for byte"
    assert f.read_bytes() == b"--------", "the replayed WRITE ran a second time"
    assert os.stat(f).st_mtime_ns == mtime


# ------------------------------------------------------------ READDIR cookies

ZERO_VERF = b"\0" * 8


def _page_through(c, dfh, cookie=0, verf=ZERO_VERF, count=1024):
    """READDIR pages from (cookie, verf) to eof: (entries, verifiers seen, pages, eof)."""
    entries, verfs, pages = [], [], 0
    while True:
        r = c.readdir(dfh, cookie, verf, count)
        assert r.ok, f"READDIR cookie={cookie} status {r.status}"
        pages += 1
        verfs.append(r.cookieverf)
        entries += r.entries
        if r.eof:
            return entries, verfs, pages, r.eof
        assert r.entries, "no entries and no eof"
        cookie, verf = r.entries[-1][2], r.cookieverf


def test_readdir_pages_with_returned_verifier(srv, c, work):
    d, dfh = work
    names = {f"entry-{i:04d}-{'x' * 20}" for i in range(300)}
    for n in names:
        (d / n).touch()
    entries, verfs, pages, eof = _page_through(c, dfh, count=1024)
    got = [n for _, n, _ in entries]
    assert eof and pages > 5, pages
    assert len(set(verfs)) == 1, f"the verifier of an unchanged directory changed while paging: {verfs}"
    assert len(got) == len(set(got)), "a name was returned twice"
    assert set(got) == names | {".", ".."}
    ino = {n: os.stat(d / n).st_ino for n in names}
    assert all(fid == ino[n] for fid, n, _ in entries if n in ino)
    cookies = [ck for _, _, ck in entries]
    assert len(set(cookies)) == len(cookies) and 0 not in cookies


def test_readdir_stale_verifier_and_added_entries(srv, c, work):
    """What nasd does with the cookie verifier (src/nfs3/proc.rs readdir): cookies are
    the directory's own seek offsets, stable while entries come and go, so the server
    returns one constant verifier and ignores the one the client sends; a stale or
    made-up verifier is never NFS3ERR_BAD_COOKIE.  What must hold regardless: continuing
    from a cookie of an earlier listing, after entries were added, returns every
    original name not yet seen exactly once, nothing already seen again, and each new
    name at most once."""
    d, dfh = work
    originals = {f"orig-{i:04d}-{'y' * 24}" for i in range(250)}
    for n in originals:
        (d / n).touch()
    first = c.readdir(dfh, 0, ZERO_VERF, 2048)
    assert first.ok and first.entries and not first.eof
    seen = [n for _, n, _ in first.entries]
    cookie, verf = first.entries[-1][2], first.cookieverf
    added = {f"added-{i:04d}-{'z' * 24}" for i in range(100)}
    for n in added:
        (d / n).touch()
    # the verifier the server hands out does not change with the directory
    again = c.readdir(dfh, 0, ZERO_VERF, 2048)
    assert again.ok and again.cookieverf == verf
    # an old cookie with a verifier from nowhere: accepted
    stale = b"\xde\xad\xbe\xef\x01\x02\x03\x04"
    assert stale != verf
    r = c.readdir(dfh, cookie, stale, 2048)
    assert r.ok, f"stale verifier: status {r.status} (server documents it ignores the verifier)"
    assert r.cookieverf == verf
    rest, _, _, eof = _page_through(c, dfh, cookie, stale, count=2048)
    assert eof
    rest_names = [n for _, n, _ in rest]
    assert len(rest_names) == len(set(rest_names)), "a name was returned twice after the cookie"
    assert not set(rest_names) & set(seen), "names listed before the cookie came again"
    missing = (originals | {".", ".."}) - set(seen) - set(rest_names)
    assert not missing, f"original names lost when continuing: {sorted(missing)[:5]}"
    assert set(rest_names) <= originals | added | {".", ".."}


def test_a_file_clients_read_can_still_be_run_on_the_server(srv, c, work):
    """READ goes through a read-only descriptor: a program file a client has read can
    still be executed on the server (a descriptor open for writing makes exec fail with
    ETXTBSY), and a WRITE to it while it runs is refused, not failed as an I/O error."""
    import shutil
    d, dfh = work
    prog = d / "prog"
    shutil.copy2(shutil.which("sleep"), prog)
    fh = c.lookup(dfh, "prog").fh
    assert c.read(fh, 0, 4096).data[:4] == b"\x7fELF"
    ran = subprocess.run([str(prog), "0"], capture_output=True, text=True)
    assert ran.returncode == 0, f"exec after a client READ: {ran.stderr.strip()}"
    running = subprocess.Popen([str(prog), "600"])   # killed below; long enough for any machine
    try:
        time.sleep(0.3)
        w = c.write(fh, 0, b"\0\0\0\0")
        assert w.status == rpc.NFS3ERR_ACCES, f"WRITE to a running program gave nfsstat3 {w.status}"
    finally:
        running.kill()
        running.wait()
    assert prog.read_bytes()[:4] == b"\x7fELF"
    assert c.write(fh, 0, b"\x7fELF").ok, "once the program has exited the file takes writes again"


@needs_root
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_reads_from_a_file_system_without_nowait_reads(tmp_path, proto):
    """tmpfs (like vfat) refuses reads that must not wait (RWF_NOWAIT). nasd tries small
    READs on its network thread that way first; such a file system must send them to a
    thread that may wait, not answer NOTSUPP."""
    export = tmp_path / "tmpfs"
    export.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(export)], check=True)
    try:
        small, large = b"small file\n", os.urandom(300_000)
        (export / "small").write_bytes(small)
        (export / "large").write_bytes(large)
        with Nasd(export, args=["--no-root-squash"]) as n, \
                Nfs3Client(n.host, n.port, cred=ROOT, proto=proto) as cl:
            root = cl.root(str(export))
            for name, data, count in (("small", small, 4096), ("large", large, 32768)):
                fh = cl.lookup(root, name).fh
                for attempt in range(3):   # the first finds out, the next ones know
                    r = cl.read(fh, 0, count)
                    assert r.status == rpc.NFS3_OK, f"READ of {name} (attempt {attempt}): nfsstat3 {r.status}"
                    assert r.data == data[:count]
    finally:
        subprocess.run(["umount", str(export)], check=False)
