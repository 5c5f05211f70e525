"""Access control: client address rules, ro, secure, squashing, AUTH_SYS identity."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd, default_binary  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import Nfs3Client, RpcClient, auth_sys, NFS_PROG  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown, privileged ports)")


def _tree_snapshot(d: Path):
    return sorted((str(p.relative_to(d)), p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
                  for p in d.rglob("*"))


# ------------------------------------------------------------ client address

def test_exports_client_address_rule(tmp_path):
    export = make_export(tmp_path)
    (export / "f").write_bytes(b"secret")
    ex = write_exports(tmp_path, [f"{export} 127.0.0.2(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n:
        # refused from 127.0.0.1
        with Nfs3Client(n.host, n.port, src_addr="127.0.0.1", cred=ROOT) as c1:
            r = c1.mnt(str(export))
            assert r.status == rpc.MNT3ERR_ACCES
        # allowed from 127.0.0.2
        with Nfs3Client(n.host, n.port, src_addr="127.0.0.2", cred=ROOT) as c2:
            root = c2.root(str(export))
            fh = c2.lookup(root, "f").fh
            assert c2.getattr(fh).ok
            assert c2.read(fh).data == b"secret"
        # the handle obtained by 127.0.0.2 is worthless from 127.0.0.1 (TCP and UDP)
        for proto in ("tcp", "udp"):
            with Nfs3Client(n.host, n.port, proto=proto, src_addr="127.0.0.1", cred=ROOT) as c1:
                assert c1.getattr(fh).status == rpc.NFS3ERR_ACCES
                assert c1.read(fh).status == rpc.NFS3ERR_ACCES
                assert c1.getattr(root).status == rpc.NFS3ERR_ACCES
                assert c1.remove(root, "f").status == rpc.NFS3ERR_ACCES
    assert (export / "f").read_bytes() == b"secret"


# ------------------------------------------------------------ ro

def test_ro_export_refuses_every_modification(tmp_path):
    export = make_export(tmp_path)
    (export / "f").write_bytes(b"original")
    (export / "d").mkdir()
    before = _tree_snapshot(export)
    with Nasd(export, args=["--ro", "--no-root-squash"]) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(n.export_dir)
        fh = c.lookup(root, "f").fh
        assert c.read(fh).data == b"original", "reads work on a ro export"
        results = {
            "WRITE": c.write(fh, 0, b"X"),
            "WRITE_UNSTABLE": c.write(fh, 0, b"X", stable="unstable"),
            "CREATE": c.create(root, "new"),
            "CREATE_EXCL": c.create(root, "newx", how="exclusive", verf=b"12345678"),
            "SETATTR": c.setattr(fh, mode=0o600),
            "SETATTR_SIZE": c.setattr(fh, size=0),
            "REMOVE": c.remove(root, "f"),
            "MKDIR": c.mkdir(root, "nd"),
            "RENAME": c.rename(root, "f", root, "g"),
            "LINK": c.link(fh, root, "hl"),
            "SYMLINK": c.symlink(root, "sl", "f"),
            "MKNOD": c.mknod_fifo(root, "fifo"),
            "RMDIR": c.rmdir(root, "d"),
            "COMMIT": c.commit(fh),
        }
        bad = {k: r.status for k, r in results.items() if r.status != rpc.NFS3ERR_ROFS}
        assert not bad, f"expected NFS3ERR_ROFS(30) from all, got {bad}"
    assert _tree_snapshot(export) == before
    assert (export / "f").read_bytes() == b"original"


def test_ro_export_leaves_writing_fifos_and_devices_to_their_mode_bits(tmp_path):
    """Writing a FIFO or device node never reaches the server, so a read-only export
    does not take MODIFY and EXTEND from them (as knfsd); the Linux client asks ACCESS
    before it opens one for writing. Files and directories stay read-only."""
    export = make_export(tmp_path)
    os.mkfifo(export / "pipe", 0o666)
    os.chmod(export / "pipe", 0o666)
    os.mkfifo(export / "private", 0o600)
    (export / "f").write_bytes(b"x")
    os.chmod(export / "f", 0o666)
    (export / "d").mkdir(mode=0o777)
    os.chmod(export / "d", 0o777)
    write = rpc.ACCESS3_MODIFY | rpc.ACCESS3_EXTEND
    with Nasd(export, args=["--ro"]) as n, Nfs3Client(n.host, n.port, cred=auth_sys(1000, 1000, gids=[1000])) as c:
        root = c.root(n.export_dir)
        granted = {name: c.access(c.lookup(root, name).fh).access for name in ["pipe", "private", "f", "d"]}
        assert granted["pipe"] & write == write, granted
        assert granted["private"] & write == 0, "the mode bits still decide"
        assert granted["f"] & (write | rpc.ACCESS3_DELETE) == 0, granted
        assert granted["d"] & (write | rpc.ACCESS3_DELETE) == 0, granted
        assert c.mknod_fifo(root, "another").status == rpc.NFS3ERR_ROFS


def test_ro_option_in_exports_file(tmp_path):
    export = make_export(tmp_path)
    ex = write_exports(tmp_path, [f"{export} 127.0.0.1(ro,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(str(export))
        assert c.create(root, "x").status == rpc.NFS3ERR_ROFS
        assert c.mkdir(root, "y").status == rpc.NFS3ERR_ROFS
    assert os.listdir(export) == []


# ------------------------------------------------------------ secure

@needs_root
def test_secure_requires_privileged_source_port(tmp_path):
    export = make_export(tmp_path)
    with Nasd(export, args=["--secure", "--no-root-squash"]) as n:
        with Nfs3Client(n.host, n.port, src_port="privileged", cred=ROOT) as priv:
            assert priv.local_addr[1] < 1024
            root = priv.root(n.export_dir)
            assert priv.getattr(root).ok
            assert priv.create(root, "ok").ok
        for proto in ("tcp", "udp"):
            with Nfs3Client(n.host, n.port, proto=proto, cred=ROOT) as unpriv:
                assert unpriv.local_addr[1] >= 1024
                assert unpriv.mnt(n.export_dir).status != rpc.MNT3_OK
                r = unpriv.getattr(root)
                assert r.status in (rpc.NFS3ERR_PERM, rpc.NFS3ERR_ACCES), r.status
                assert not unpriv.create(root, "bad").ok
        with Nfs3Client(n.host, n.port, proto="udp", src_port="privileged", cred=ROOT) as upriv:
            assert upriv.getattr(root).ok
    assert os.listdir(export) == ["ok"]


# ------------------------------------------------------------ squashing

def _create_owner(n: Nasd, cred, name="f", export=None):
    export = str(export or n.export_dir)
    with Nfs3Client(n.host, n.port, cred=cred) as c:
        root = c.root(export)
        r = c.create(root, name, how="guarded")
        assert r.ok, f"CREATE as {cred} failed: {r.status}"
        st = os.stat(Path(export) / name)
        assert (r.attr.uid, r.attr.gid) == (st.st_uid, st.st_gid), "reply attrs match the disk"
        return st.st_uid, st.st_gid


@needs_root
@pytest.mark.parametrize("args,cred,expect", [
    ([], auth_sys(0, 0), (65534, 65534)),                                          # root_squash default
    (["--anonuid", "4321", "--anongid", "4322"], auth_sys(0, 0), (4321, 4322)),  # root_squash + anonuid
    ([], auth_sys(1000, 1000), (1000, 1000)),                                      # non-root untouched
    (["--no-root-squash"], auth_sys(0, 0), (0, 0)),
    (["--all-squash", "--anonuid", "1234", "--anongid", "1234"], auth_sys(1000, 1000), (1234, 1234)),
    (["--all-squash", "--anonuid", "1234", "--anongid", "1234"], auth_sys(0, 0), (1234, 1234)),
    (["--no-root-squash"], rpc.AUTH_NONE_CRED, (65534, 65534)),                    # AUTH_NONE = anonymous
], ids=["root_squash", "root_squash_anonuid", "nonroot", "no_root_squash",
        "all_squash_user", "all_squash_root", "auth_none"])
def test_squashing_sets_owner_on_disk(tmp_path, args, cred, expect):
    export = make_export(tmp_path, mode=0o777)
    with Nasd(export, args=args) as n:
        assert _create_owner(n, cred) == expect


@needs_root
def test_squashing_from_exports_file(tmp_path):
    export = make_export(tmp_path, mode=0o777)
    ex = write_exports(tmp_path, [f"{export} 127.0.0.1(rw,all_squash,anonuid=2222,anongid=2223,insecure)"])
    with Nasd(exports_file=ex) as n:
        assert _create_owner(n, auth_sys(0, 0), export=export) == (2222, 2223)


@needs_root
def test_nonroot_user_permissions(tmp_path):
    export = make_export(tmp_path, mode=0o755)
    (export / "rootfile").write_bytes(b"root")
    os.chmod(export / "rootfile", 0o644)
    (export / "mine").write_bytes(b"mine")
    os.chmod(export / "mine", 0o644)
    os.chown(export / "mine", 1000, 1000)
    user = auth_sys(1000, 1000, gids=[1000])
    with Nasd(export) as n, Nfs3Client(n.host, n.port, cred=user) as c:
        root = c.root(n.export_dir)
        rf = c.lookup(root, "rootfile").fh
        mf = c.lookup(root, "mine").fh
        assert c.write(rf, 0, b"HACK").status == rpc.NFS3ERR_ACCES
        assert c.setattr(rf, mode=0o666).status in (rpc.NFS3ERR_PERM, rpc.NFS3ERR_ACCES)
        assert c.create(root, "newfile").status == rpc.NFS3ERR_ACCES  # dir is root's 0755
        assert c.remove(root, "rootfile").status == rpc.NFS3ERR_ACCES
        w = c.write(mf, 0, b"MINE")
        assert w.ok and w.count == 4
        assert c.read(rf).data == b"root", "reading a 0644 file is fine"
    assert (export / "rootfile").read_bytes() == b"root"
    assert (export / "mine").read_bytes() == b"MINE"
    assert os.stat(export / "rootfile").st_mode & 0o777 == 0o644
    assert sorted(os.listdir(export)) == ["mine", "rootfile"]


@needs_root
@pytest.mark.parametrize("cred", [auth_sys(0xFFFFFFFF, 1000, gids=[1000]),
                                  auth_sys(1000, 0xFFFFFFFF, gids=[0xFFFFFFFF])],
                         ids=["uid", "gid"])
def test_the_invalid_id_minus_one_never_acts_as_the_server(tmp_path, cred):
    """(uid_t)-1 names nobody: `setfsuid(-1)` and `setfsgid(-1)` change nothing, so a call
    that reached the file system with it would act as the server itself (root). Such an
    id is the anonymous one instead, as with knfsd."""
    export = make_export(tmp_path, mode=0o755)
    for name, owner, mode in (("user-only", (4242, 4242), 0o600), ("group-0-only", (4242, 0), 0o070)):
        (export / name).write_bytes(name.encode())
        os.chown(export / name, *owner)
        os.chmod(export / name, mode)
    with Nasd(export) as n, Nfs3Client(n.host, n.port, cred=cred) as c:
        root = c.root(n.export_dir)
        for name in ("user-only", "group-0-only"):
            fh = c.lookup(root, name).fh
            assert c.read(fh).status == rpc.NFS3ERR_ACCES, name
            assert c.write(fh, 0, b"HACK").status == rpc.NFS3ERR_ACCES, name
        assert c.create(root, "planted", how="guarded").status == rpc.NFS3ERR_ACCES
    # nor can an export make it the anonymous id
    for opt in ("--anonuid", "--anongid"):
        p = subprocess.run([str(default_binary()), "serve", str(export), opt, "4294967295"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0 and "4294967295" in p.stderr, (opt, p.returncode, p.stderr[-500:])
    assert sorted(os.listdir(export)) == ["group-0-only", "user-only"]
    assert (export / "user-only").read_bytes() == b"user-only"


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")
@pytest.mark.parametrize("dropped", ["setuid", "setgid"])
def test_a_root_server_that_cannot_take_on_identities_refuses_to_serve(tmp_path, dropped):
    """Without CAP_SETUID (or CAP_SETGID) the kernel quietly ignores `setfsuid` (or refuses
    `setgroups`): serving would give every caller root's access to the files."""
    export = make_export(tmp_path)
    cmd = ["setpriv", f"--bounding-set=-{dropped}", str(default_binary()), "serve", str(export),
           "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nasd served without CAP_{dropped.upper()}")
    assert p.returncode != 0 and "cannot act as its callers" in p.stderr, (p.returncode, p.stderr[-500:])


@needs_root
def test_commit_needs_write_permission_or_ownership(tmp_path):
    """A COMMIT costs the disk a flush: as with knfsd, only a caller who may write the file,
    or owns it, may ask for one."""
    export = make_export(tmp_path, mode=0o755)
    for name, owner, mode in (("theirs", 4242, 0o644), ("mine-read-only", 1000, 0o444), ("shared", 4242, 0o666)):
        (export / name).write_bytes(b"x")
        os.chown(export / name, owner, owner)
        os.chmod(export / name, mode)
    with Nasd(export) as n, Nfs3Client(n.host, n.port, cred=auth_sys(1000, 1000, gids=[1000])) as c:
        root = c.root(n.export_dir)
        got = {name: c.commit(c.lookup(root, name).fh).status for name in ("theirs", "mine-read-only", "shared")}
    assert got == {"theirs": rpc.NFS3ERR_ACCES, "mine-read-only": 0, "shared": 0}


@needs_root
def test_ownership_in_a_create_by_anyone_but_root_is_ignored(tmp_path):
    """As knfsd: a CREATE or MKDIR by a user that also names an owner makes the object,
    owned by the caller, instead of failing after the object was made."""
    export = make_export(tmp_path, mode=0o777)
    with Nasd(export) as n, Nfs3Client(n.host, n.port, cred=auth_sys(1000, 1000, gids=[1000])) as c:
        root = c.root(n.export_dir)
        r = c.nfs(rpc.NFSPROC3_CREATE, rpc.nfs3_args.create(root, "f", "guarded", 0o640, uid=4242, gid=4242))
        assert r.ok, r.status
        assert c.lookup(root, "f").ok
    st = os.stat(export / "f")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1000, 1000, 0o640)
    # root (not squashed) still gets the owner it asks for
    with Nasd(export, args=["--no-root-squash"]) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        r = c.nfs(rpc.NFSPROC3_CREATE, rpc.nfs3_args.create(c.root(n.export_dir), "g", "guarded", 0o640, uid=4242, gid=4343))
        assert r.ok, r.status
    st = os.stat(export / "g")
    assert (st.st_uid, st.st_gid) == (4242, 4343)


@needs_root
def test_supplementary_groups_grant_access_and_17_are_rejected(tmp_path):
    export = make_export(tmp_path)
    (export / "grp").write_bytes(b"g")
    os.chown(export / "grp", 0, 3000)
    os.chmod(export / "grp", 0o664)
    with Nasd(export) as n:
        with Nfs3Client(n.host, n.port, cred=auth_sys(1000, 1000, gids=[1000])) as c:
            fh = c.lookup(c.root(n.export_dir), "grp").fh
            assert c.write(fh, 0, b"X").status == rpc.NFS3ERR_ACCES
        sixteen = [1000 + i for i in range(15)] + [3000]
        with Nfs3Client(n.host, n.port, cred=auth_sys(1000, 1000, gids=sixteen)) as c:
            assert c.write(fh, 0, b"Y").ok, "group 3000 (16th group) grants write"
        with RpcClient(n.host, n.port, cred=auth_sys(1000, 1000, gids=sixteen + [3001])) as c:
            r = c.call(NFS_PROG, 3, rpc.NFSPROC3_WRITE, rpc.nfs3_args.write(fh, 0, b"Z"))
            assert not r.accepted and r.reject_stat == rpc.AUTH_ERROR and r.auth_stat == rpc.AUTH_BADCRED
    assert (export / "grp").read_bytes() == b"Y"


@needs_root
def test_a_group_writer_may_truncate_and_touch_but_not_set_times(tmp_path):
    """`echo x > shared` by a group member who does not own the file: the Linux client
    sends SETATTR size 0 with mtime = server time (atime unchanged). Anyone who may write
    may set either time to the server's clock, as with knfsd; only the owner may set
    chosen times; and a refused SETATTR changes nothing, the size included."""
    export = make_export(tmp_path)
    shared = export / "shared"
    shared.write_bytes(b"old contents")
    os.chown(shared, 1000, 3000)
    os.chmod(shared, 0o664)
    old = os.stat(shared)
    os.utime(shared, ns=(old.st_atime_ns - 10**10, old.st_mtime_ns - 10**10))
    before = os.stat(shared)
    member = auth_sys(1001, 1001, gids=[1001, 3000])
    stranger = auth_sys(1002, 1002, gids=[1002])
    with Nasd(export) as n:
        with Nfs3Client(n.host, n.port, cred=stranger) as c:
            fh = c.lookup(c.root(n.export_dir), "shared").fh
            assert c.setattr(fh, mtime="server").status == rpc.NFS3ERR_ACCES
            assert c.setattr(fh, size=0, mtime="server").status == rpc.NFS3ERR_ACCES
        assert os.stat(shared).st_size == len(b"old contents")
        with Nfs3Client(n.host, n.port, cred=member) as c:
            fh = c.lookup(c.root(n.export_dir), "shared").fh
            chosen = c.setattr(fh, size=0, mtime=(1_000_000_000, 0))
            assert chosen.status == rpc.NFS3ERR_PERM, "only the owner sets chosen times"
            assert os.stat(shared).st_size == len(b"old contents"), "a refused SETATTR truncated the file"
            assert c.setattr(fh, mode=0o666).status == rpc.NFS3ERR_PERM
            r = c.setattr(fh, size=0, mtime="server")
            assert r.ok, f"group writer's O_TRUNC refused: nfsstat3 {r.status}"
            assert c.setattr(fh, atime="server").ok
    after = os.stat(shared)
    assert after.st_size == 0
    assert after.st_mtime_ns > before.st_mtime_ns and after.st_atime_ns > before.st_atime_ns
    assert (after.st_uid, after.st_gid, after.st_mode & 0o777) == (1000, 3000, 0o664)


@needs_root
def test_exports_per_client_options_and_exports5_defaults(tmp_path):
    """Each client gets its own options; options not given take exports(5)
    defaults (root_squash, secure)."""
    export = make_export(tmp_path, mode=0o777)
    ex = write_exports(tmp_path, [
        f"{export} 127.0.0.1(ro,insecure) 127.0.0.2(rw,insecure,no_root_squash) "
        f"127.0.0.0/24(rw,all_squash,anonuid=77,anongid=77,insecure) 127.0.1.0/24(rw)"])
    got = {}
    with Nasd(exports_file=ex) as n:
        for ip in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.1.5"):
            with Nfs3Client(n.host, n.port, src_addr=ip, cred=ROOT) as c:
                m = c.mnt(str(export))
                if m.status != rpc.MNT3_OK:
                    got[ip] = ("mnt", m.status)
                    continue
                r = c.create(m.fh, f"f{ip}", how="guarded")
                got[ip] = ("create", r.status, os.stat(export / f"f{ip}").st_uid if r.ok else None)
        with Nfs3Client(n.host, n.port, src_addr="127.0.1.5", src_port="privileged", cred=ROOT) as c:
            r = c.create(c.root(str(export)), "priv", how="guarded")
            got["127.0.1.5/priv"] = ("create", r.status, os.stat(export / "priv").st_uid if r.ok else None)
        with Nfs3Client(n.host, n.port, src_addr="127.0.2.1", cred=ROOT) as c:
            got["127.0.2.1"] = ("mnt", c.mnt(str(export)).status)
    assert got == {
        "127.0.0.1": ("create", rpc.NFS3ERR_ROFS, None),
        "127.0.0.2": ("create", 0, 0),
        "127.0.0.3": ("create", 0, 77),
        "127.0.1.5": ("mnt", rpc.MNT3ERR_ACCES),          # secure by default
        "127.0.1.5/priv": ("create", 0, 65534),           # root_squash by default
        "127.0.2.1": ("mnt", rpc.MNT3ERR_ACCES),          # no matching client
    }


def test_an_export_with_sync_and_async_clients_serves_all_sync(tmp_path):
    """One backend serves all clients of an export, so it cannot be async for one client
    and sync for another: a client told its data is safe must not lose it because
    another client's rule says async. nasd serves them all sync and says so."""
    export = make_export(tmp_path)
    ex = write_exports(tmp_path, [
        f"{export} 127.0.0.1(rw,insecure,no_root_squash,async) 127.0.0.2(rw,insecure,no_root_squash,sync)"])
    with Nasd(exports_file=ex) as n:
        for ip in ("127.0.0.1", "127.0.0.2"):
            with Nfs3Client(n.host, n.port, src_addr=ip, cred=ROOT) as c:
                root = c.root(str(export))
                fh = c.create(root, f"f{ip}").fh
                r = c.write(fh, 0, b"x" * 4096, stable="unstable")
                assert r.ok
                # An async export would claim FILE_SYNC for an UNSTABLE write.
                assert r.committed == 0, f"{ip}: UNSTABLE write answered with stable_how {r.committed}"
        assert "are served 'sync'" in n.log()
    only_async = write_exports(tmp_path, [f"{export} 127.0.0.1(rw,insecure,no_root_squash,async)"])
    with Nasd(exports_file=only_async) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        fh = c.create(c.root(str(export)), "g").fh
        assert c.write(fh, 0, b"y" * 4096, stable="unstable").committed == 2


# ------------------------------------------------------------ POSIX ACLs

ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20


def _set_access_acl(path: Path, entries):
    """Sets `system.posix_acl_access` (the kernel's xattr layout: version 2, then tag,
    permission bits and id per entry, sorted by tag and id), as `setfacl` would."""
    import struct
    blob = struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", tag, perm, 0xFFFFFFFF if ident is None else ident)
        for tag, perm, ident in sorted(entries, key=lambda e: (e[0], e[2] or 0)))
    try:
        os.setxattr(path, "system.posix_acl_access", blob)
    except OSError as e:
        pytest.skip(f"the test directory's file system does not take POSIX ACLs ({e})")


@needs_root
def test_posix_acls_decide_read_write_and_access_for_other_users(tmp_path):
    """An ACL entry naming a user is obeyed, whether it takes away what the mode bits would
    give (user 1000 on `denied`) or gives what they would not (user 1000 on `granted`)."""
    export = make_export(tmp_path)
    denied, granted = export / "denied", export / "granted"
    denied.write_bytes(b"public")
    granted.write_bytes(b"shared")
    # Mode 0644, but user 1000 may do nothing.
    _set_access_acl(denied, [(ACL_USER_OBJ, 6, None), (ACL_USER, 0, 1000), (ACL_GROUP_OBJ, 4, None),
                             (ACL_MASK, 4, None), (ACL_OTHER, 4, None)])
    # Nobody but the owner by the mode's owner and other bits, but user 1000 may read and write.
    _set_access_acl(granted, [(ACL_USER_OBJ, 6, None), (ACL_USER, 6, 1000), (ACL_GROUP_OBJ, 0, None),
                              (ACL_MASK, 6, None), (ACL_OTHER, 0, None)])
    listed = auth_sys(1000, 1000, gids=[1000])
    other = auth_sys(1001, 1001, gids=[1001])
    read_bits = rpc.ACCESS3_READ
    modify_bits = rpc.ACCESS3_MODIFY | rpc.ACCESS3_EXTEND
    with Nasd(export) as n:
        with Nfs3Client(n.host, n.port, cred=listed) as c:
            root = c.root(n.export_dir)
            d, g = c.lookup(root, "denied").fh, c.lookup(root, "granted").fh
            assert c.read(d).status == rpc.NFS3ERR_ACCES, "the ACL's entry for user 1000 grants nothing"
            assert c.access(d).access & (read_bits | modify_bits) == 0
            assert c.read(g).data == b"shared", "the ACL's entry for user 1000 grants reading"
            assert c.write(g, 0, b"SHARED").ok, "the ACL's entry for user 1000 grants writing"
            assert c.access(g).access & (read_bits | modify_bits) == read_bits | modify_bits
            assert c.access(g, read_bits).access == read_bits
        with Nfs3Client(n.host, n.port, cred=other) as c:
            root = c.root(n.export_dir)
            d, g = c.lookup(root, "denied").fh, c.lookup(root, "granted").fh
            assert c.read(d).data == b"public", "others keep what the ACL's other entry gives"
            assert c.access(d).access & (read_bits | modify_bits) == read_bits
            assert c.read(g).status == rpc.NFS3ERR_ACCES
            assert c.write(g, 0, b"HACK").status == rpc.NFS3ERR_ACCES
            assert c.access(g).access & (read_bits | modify_bits) == 0
    assert granted.read_bytes() == b"SHARED"
    assert denied.read_bytes() == b"public"


def test_mountpoint_option_leaves_out_an_export_whose_file_system_is_not_mounted(tmp_path):
    """exports(5) `mp`: a directory meant to hold a mounted file system is served only
    while something is mounted there, so that a disk that failed to mount does not
    expose, and fill, the directory underneath. The other exports are served."""
    unmounted = make_export(tmp_path, "disk", mode=0o777)
    mounted = make_export(tmp_path, "other", mode=0o777)
    # the usual form: a share below the mount point, which does not exist while unmounted
    below = unmounted / "share"
    ex = write_exports(tmp_path, [f"{unmounted} 127.0.0.1(rw,insecure,mp)",
                                  f"{below} 127.0.0.1(rw,insecure,mountpoint={unmounted})",
                                  f"{mounted} -mountpoint=/ 127.0.0.1(rw,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        assert c.mnt(str(unmounted)).status != rpc.MNT3_OK
        assert c.mnt(str(below)).status != rpc.MNT3_OK
        m = c.mnt(str(mounted))
        assert m.status == rpc.MNT3_OK
        assert c.create(m.fh, "f", how="guarded").ok
    assert os.listdir(unmounted) == []
    assert "not exported" in n.log() and str(unmounted) in n.log()
