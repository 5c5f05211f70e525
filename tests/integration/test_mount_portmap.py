"""MOUNT v3 DUMP / UMNT / UMNTALL / EXPORT and the embedded portmapper's DUMP and
GETPORT, driven by the raw client in rig/rpc.py."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd, free_port  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import (Nfs3Client, RpcClient, Packer, decode_pmaplist, NFS_PROG, MOUNT_PROG,  # noqa: E402
                     PMAP_PROG, IPPROTO_TCP, IPPROTO_UDP, nfs3_args)
from integration._common import ROOT, make_export, write_exports  # noqa: E402


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    export = make_export(tmp_path_factory.mktemp("mount"))
    (export / "sub" / "deeper").mkdir(parents=True)
    # Loopback named, not `*`: listings (DUMP) over UDP go only to clients a rule names.
    with Nasd(export, args=["--no-root-squash", "--allow", "127.0.0.0/8"]) as n:
        yield n


def _mine(srv, ip):
    """This client address's entries in the server's mount list."""
    with Nfs3Client(srv.host, srv.port, src_addr="127.0.0.1", cred=ROOT) as c:
        return sorted(d for h, d in c.mount_dump() if h == ip)


# ------------------------------------------------------------ DUMP / UMNT / UMNTALL

def test_dump_lists_mount_until_umnt(srv):
    ip = "127.0.0.3"
    exp = srv.export_dir
    sub = exp + "/sub"
    assert _mine(srv, ip) == []
    with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
        assert c.mnt(exp).status == rpc.MNT3_OK
        assert c.mount_dump().count((ip, exp)) == 1
        assert c.mnt(sub).status == rpc.MNT3_OK
        assert c.mnt(exp).status == rpc.MNT3_OK   # mounting again lists it once
        assert sorted(d for h, d in c.mount_dump() if h == ip) == sorted([exp, sub])
        r = c.umnt(exp)
        assert r.success and r.results == b"", "UMNT returns void"
        assert _mine(srv, ip) == [sub]
        assert c.umnt(sub).success
    assert _mine(srv, ip) == []


def test_dump_seen_over_udp_and_from_other_clients(srv):
    ip = "127.0.0.6"
    with Nfs3Client(srv.host, srv.port, proto="udp", src_addr=ip, cred=ROOT) as c:
        assert c.mnt(srv.export_dir).status == rpc.MNT3_OK
    try:
        # a different client sees it too (DUMP is the server-wide list), over TCP and UDP
        for proto in ("tcp", "udp"):
            with Nfs3Client(srv.host, srv.port, proto=proto, src_addr="127.0.0.7", cred=ROOT) as other:
                assert (ip, srv.export_dir) in other.mount_dump()
                other.umnt(srv.export_dir)   # UMNT of someone else's mount does nothing
        assert _mine(srv, ip) == [srv.export_dir]
    finally:
        with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
            c.umnt(srv.export_dir)
    assert _mine(srv, ip) == []


def test_one_client_cannot_grow_the_mount_list_without_bound(srv):
    """Spellings of one directory (`/./`, `//`, a trailing slash) are one mount-list
    entry, and UMNT of any of them removes it; past 64 directories per client nasd still
    mounts but stops listing, so DUMP stays small and other clients are still listed."""
    ip, other_ip = "127.0.0.8", "127.0.0.9"
    many = Path(srv.export_dir) / "many"
    for i in range(100):
        (many / f"d{i:03d}").mkdir(parents=True, exist_ok=True)
    with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
        for i in range(200):
            spelling = srv.export_dir + "/." * i + "//sub" + "/" * (i % 2)
            assert c.mnt(spelling).status == rpc.MNT3_OK, spelling
        assert _mine(srv, ip) == [srv.export_dir + "/sub"]
        assert c.umnt(srv.export_dir + "/./sub/").success
        assert _mine(srv, ip) == []
        for i in range(100):
            assert c.mnt(f"{many}/d{i:03d}").status == rpc.MNT3_OK
        assert len(_mine(srv, ip)) == 64
    try:
        with Nfs3Client(srv.host, srv.port, src_addr=other_ip, cred=ROOT) as other:
            assert other.mnt(srv.export_dir).status == rpc.MNT3_OK
        assert _mine(srv, other_ip) == [srv.export_dir]
    finally:
        for addr in (ip, other_ip):
            with Nfs3Client(srv.host, srv.port, src_addr=addr, cred=ROOT) as c:
                c.umntall()
    assert _mine(srv, ip) == []


def test_umntall_clears_only_the_callers_mounts(srv):
    a, b = "127.0.0.4", "127.0.0.5"
    for ip in (a, b):
        with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
            assert c.mnt(srv.export_dir).status == rpc.MNT3_OK
            assert c.mnt(srv.export_dir + "/sub/deeper").status == rpc.MNT3_OK
    assert len(_mine(srv, a)) == 2 and len(_mine(srv, b)) == 2
    with Nfs3Client(srv.host, srv.port, src_addr=a, cred=ROOT) as c:
        r = c.umntall()
        assert r.success and r.results == b""
    assert _mine(srv, a) == []
    assert _mine(srv, b) == sorted([srv.export_dir, srv.export_dir + "/sub/deeper"])
    with Nfs3Client(srv.host, srv.port, src_addr=b, cred=ROOT) as c:
        assert c.umntall().success
    assert _mine(srv, b) == []


def test_refused_mount_is_not_listed(srv):
    ip = "127.0.0.8"
    with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
        assert c.mnt(srv.export_dir + "/missing").status == rpc.MNT3ERR_NOENT
        assert c.mnt("/not/an/export").status != rpc.MNT3_OK
    assert _mine(srv, ip) == []


# ------------------------------------------------------------ EXPORT

def test_export_lists_the_export_path(srv):
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        exports = c.mount_export()
    assert exports == [(os.path.realpath(srv.export_dir), ["127.0.0.0/8"])]


def test_mount_version_1_lists_exports_and_mounts_and_unmounts_but_mounts_nothing(srv):
    """`showmount` on FreeBSD, macOS and illumos asks with MOUNT version 1, whose EXPORT,
    DUMP, UMNT and UMNTALL are version 3's; its MNT would answer with an NFSv2 handle."""
    ip = "127.0.0.11"
    exp = srv.export_dir
    with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as c:
        assert c.mnt(exp).status == rpc.MNT3_OK
        for proto in ("tcp", "udp"):
            with Nfs3Client(srv.host, srv.port, proto=proto, src_addr=ip, cred=ROOT) as v1:
                assert rpc.decode_exports(v1.call(MOUNT_PROG, 1, 5)) == c.mount_export()
                assert (ip, exp) in rpc.decode_mountlist(v1.call(MOUNT_PROG, 1, 2))
                refused = v1.call(MOUNT_PROG, 1, 1, nfs3_args.mnt(exp))
                assert refused.accepted and refused.accept_stat == rpc.PROC_UNAVAIL, refused
                # Version 2 alike (its PATHCONF is not served either).
                assert v1.call(MOUNT_PROG, 2, 1, nfs3_args.mnt(exp)).accept_stat == rpc.PROC_UNAVAIL
                assert v1.call(MOUNT_PROG, 2, 7, nfs3_args.mnt(exp)).accept_stat == rpc.PROC_UNAVAIL
                assert v1.call(MOUNT_PROG, 4, 0).mismatch == (1, 3)
        with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as v1:
            assert v1.call(MOUNT_PROG, 1, 3, nfs3_args.mnt(exp)).success    # UMNT
        assert _mine(srv, ip) == []
        assert c.mnt(exp).status == rpc.MNT3_OK
        with Nfs3Client(srv.host, srv.port, src_addr=ip, cred=ROOT) as v1:
            assert v1.call(MOUNT_PROG, 1, 4).success                       # UMNTALL
        assert _mine(srv, ip) == []


def test_export_lists_every_export_of_an_exports_file(tmp_path):
    e1 = make_export(tmp_path, "one")
    e2 = make_export(tmp_path, "two")
    ex = write_exports(tmp_path, [
        f"{e1} 127.0.0.1(rw,insecure) 10.1.0.0/16(ro)",
        f"{e2} *(ro,insecure)",
    ])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        got = dict(c.mount_export())
        # EXPORT over UDP gives the same list
        with Nfs3Client(n.host, n.port, proto="udp", cred=ROOT) as uc:
            assert dict(uc.mount_export()) == got
    assert set(got) == {os.path.realpath(e1), os.path.realpath(e2)}
    assert got[os.path.realpath(e1)] == ["127.0.0.1", "10.1.0.0/16"]
    assert got[os.path.realpath(e2)] == ["*"]


def test_an_export_written_through_a_symlink_mounts_by_either_name(tmp_path):
    """As mountd, which resolves the path a client asks for: fstab entries name the
    export as the exports file does, and `/export -> /data/export` is common. With two
    exports the written name found nothing (NOENT); with one it was taken as a
    subdirectory of the export."""
    data = make_export(tmp_path, "data")
    home = make_export(data, "home")
    (home / "u1").mkdir()
    (tmp_path / "export").symlink_to(data)
    other = make_export(tmp_path, "other")
    written = tmp_path / "export" / "home"
    ex = write_exports(tmp_path, [f"{written} 127.0.0.1(rw,insecure)", f"{other} *(ro,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        by_written, by_real = c.mnt(str(written)), c.mnt(os.path.realpath(home))
        assert by_written.status == rpc.MNT3_OK, by_written.status
        assert by_real.status == rpc.MNT3_OK
        assert c.getattr(by_written.fh).attr.fileid == os.stat(home).st_ino
        below = c.mnt(str(written / "u1"))
        assert below.status == rpc.MNT3_OK and c.getattr(below.fh).attr.fileid == os.stat(home / "u1").st_ino
        assert c.mnt(str(tmp_path / "export")).status != rpc.MNT3_OK, "the link's own directory is no export"


def test_a_client_mounts_a_nested_export_it_is_not_in_through_the_export_above(tmp_path):
    """`/srv` for this client (read-only), `/srv/data` for another one: the client's MNT
    of `/srv/data` is served through `/srv`, as mountd serves it, with `/srv`'s rules."""
    srv = make_export(tmp_path, "srv")
    data = make_export(srv, "data")
    ex = write_exports(tmp_path, [f"{srv} 127.0.0.1(ro,no_root_squash,insecure)",
                                  f"{data} 127.0.0.2(rw,no_root_squash,insecure)"])
    with Nasd(exports_file=ex) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        r = c.mnt(str(data))
        assert r.status == rpc.MNT3_OK, r.status
        assert c.getattr(r.fh).attr.fileid == os.stat(data).st_ino
        assert c.create(r.fh, "f").status == rpc.NFS3ERR_ROFS, "served with /srv's rules (ro), not /srv/data's"
    only_deep = write_exports(tmp_path, [f"{srv} 127.0.0.2(ro,insecure)", f"{data} 127.0.0.2(rw,insecure)"])
    with Nasd(exports_file=only_deep) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        assert c.mnt(str(data)).status == rpc.MNT3ERR_ACCES, "admitted by neither"
    # Admitted by the deeper export but from an unprivileged port it requires (`secure`):
    # refused there, as mountd does, not served through the export above.
    secure_deep = write_exports(tmp_path, [f"{srv} 127.0.0.1(ro,insecure)", f"{data} 127.0.0.1(rw,secure)"])
    with Nasd(exports_file=secure_deep) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        assert c.local_addr[1] >= 1024
        assert c.mnt(str(data)).status == rpc.MNT3ERR_ACCES
        assert c.mnt(str(srv)).status == rpc.MNT3_OK


def test_a_squashed_client_mounts_a_directory_below_one_it_cannot_search(tmp_path):
    """MNT walks the path as root, as mountd does: a root-squashed client mounts
    `locked/open` though `locked` (root's, 0700) refuses it a search. What it may do
    then is checked call by call under the squashing: it cannot look into `locked`."""
    export = make_export(tmp_path)
    locked = export / "locked"
    (locked / "open").mkdir(parents=True)
    (locked / "open" / "f").write_bytes(b"x")
    os.chmod(locked, 0o700)
    with Nasd(export) as n, Nfs3Client(n.host, n.port, cred=ROOT) as c:
        below = c.mnt(str(locked / "open"))
        assert below.status == rpc.MNT3_OK, below.status
        assert c.getattr(below.fh).attr.fileid == os.stat(locked / "open").st_ino
        assert c.lookup(below.fh, "f").status == rpc.NFS3_OK, "the mounted directory is the squashed client's to use"
        top = c.mnt(str(export))
        assert top.status == rpc.MNT3_OK
        into_locked = c.lookup(c.lookup(top.fh, "locked").fh, "open")
        assert into_locked.status == rpc.NFS3ERR_ACCES, "squashed root searched a directory only root may search"
        assert c.mnt(str(locked / "absent")).status == rpc.MNT3ERR_NOENT


# ------------------------------------------------------------ portmap

@pytest.fixture(scope="module")
def pmap_srv(tmp_path_factory):
    export = make_export(tmp_path_factory.mktemp("pmap"))
    pport = free_port()
    with Nasd(export, args=["--portmap", "--portmap-port", str(pport), "--no-root-squash", "--allow", "127.0.0.0/8"]) as n:
        n.pmap_port = pport
        yield n


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_portmap_v2_dump_lists_nfs_and_mount(pmap_srv, proto):
    n = pmap_srv
    with RpcClient(n.host, n.pmap_port, proto=proto) as c:
        maps = decode_pmaplist(c.call(PMAP_PROG, 2, rpc.PMAPPROC_DUMP))
    assert len(maps) == len(set(maps)), f"duplicate mappings: {maps}"
    for prot in (IPPROTO_TCP, IPPROTO_UDP):
        assert (NFS_PROG, 3, prot, n.port) in maps, maps
        assert (MOUNT_PROG, 3, prot, n.port) in maps, maps
        assert (PMAP_PROG, 2, prot, n.pmap_port) in maps, maps
    # nothing that is not served: NFS only in version 3, MOUNT in 1 to 3 (the listings of
    # 1 and 2), always on nasd's port
    for prog, vers, prot, port in maps:
        assert prot in (IPPROTO_TCP, IPPROTO_UDP)
        if prog == NFS_PROG:
            assert (vers, port) == (3, n.port), (prog, vers, prot, port)
        elif prog == MOUNT_PROG:
            assert vers in (1, 2, 3) and port == n.port, (prog, vers, prot, port)
        else:
            assert prog == PMAP_PROG and port == n.pmap_port


def test_portmap_getport_and_the_advertised_port_works(pmap_srv):
    n = pmap_srv
    with RpcClient(n.host, n.pmap_port) as c:
        def getport(prog, vers, prot):
            r = c.call(PMAP_PROG, 2, rpc.PMAPPROC_GETPORT, Packer().u32(prog).u32(vers).u32(prot).u32(0).bytes())
            assert r.success
            return r.unpacker().u32()
        assert getport(NFS_PROG, 3, IPPROTO_TCP) == n.port
        assert getport(MOUNT_PROG, 3, IPPROTO_UDP) == n.port
        # As rpcbind: the program's port whatever the version asked for; the program then
        # tells the client which versions it serves.
        assert getport(NFS_PROG, 4, IPPROTO_TCP) == n.port
        assert getport(MOUNT_PROG, 1, IPPROTO_UDP) == n.port
        assert getport(100021, 4, IPPROTO_TCP) == 0   # NLM is not served
        port = getport(MOUNT_PROG, 3, IPPROTO_TCP)
    with Nfs3Client(n.host, port, cred=ROOT) as m:
        root = m.root(n.export_dir)
        assert m.getattr(root).ok


@pytest.mark.parametrize("called", ["127.0.0.1", "127.0.0.2"])
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_rpcbind_getaddr_names_the_address_called_on_a_wildcard_listener(tmp_path, proto, called):
    """rpcbind v3/v4 GETADDR answers with a universal address ("h1.h2.h3.h4.p1.p2") for
    the client to connect to. nasd listening on every address (0.0.0.0) must name the
    address the client reached it on, not 0.0.0.0 and not another address of the host,
    over UDP as over TCP (TCP's connected socket knows it; for a datagram the kernel
    says, when asked)."""
    export = make_export(tmp_path)
    port = free_port()
    with Nasd(export, args=["--no-root-squash"], host="0.0.0.0", port=port) as n:
        with RpcClient(called, port, proto=proto) as c:
            for vers in (3, 4):
                args = Packer().u32(NFS_PROG).u32(3).opaque(b"udp").opaque(b"").opaque(b"").bytes()
                r = c.call(PMAP_PROG, vers, 3, args)
                assert r.success
                uaddr = r.unpacker().opaque().decode()
                assert uaddr == f"{called}.{port >> 8}.{port & 0xff}", f"v{vers} GETADDR over {proto}: {uaddr}"


@pytest.mark.parametrize("called", ["127.0.0.1", "127.0.0.2"])
def test_udp_replies_come_from_the_address_called_on_a_wildcard_listener(tmp_path, called):
    """A host with several addresses: a client calling one of them over UDP with a
    connected socket (as the Linux client does) drops datagrams from any other, so a
    reply routed out from the host's first address would never arrive and the mount
    would hang. nasd on 0.0.0.0 answers from the address each call was sent to."""
    import socket
    export = make_export(tmp_path)
    port = free_port()
    with Nasd(export, args=["--no-root-squash"], host="0.0.0.0", port=port):
        for prog, vers in ((MOUNT_PROG, 3), (NFS_PROG, 3), (PMAP_PROG, 2)):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                s.connect((called, port))
                s.settimeout(5)
                xid = RpcClient.next_xid()
                s.send(rpc.build_call(xid, prog, vers, 0, b"", cred=rpc.AUTH_NONE_CRED))
                try:
                    reply, source = s.recvfrom(1 << 16)
                except socket.timeout:
                    pytest.fail(f"no reply to NULL of program {prog} called at {called}: sent from another address?")
                assert source == (called, port)
                assert rpc.parse_reply(reply).success


# ------------------------------------------------------------ UDP reflection

def test_udp_replies_larger_than_the_call_go_only_to_admitted_clients(tmp_path):
    """A UDP source can be forged: portmap DUMP and MOUNT EXPORT answer a small call with
    a large reply, which would let anyone bounce amplified traffic off nasd at a victim.
    A client no export admits gets a refusal no larger than its call instead; admitted
    clients, and anyone over TCP, get the full answer."""
    e = make_export(tmp_path)
    ex = write_exports(tmp_path, [f"{e} 127.0.0.1(rw,insecure)"])
    pport = free_port()
    stranger, member = "127.0.0.9", "127.0.0.1"
    with Nasd(exports_file=ex, args=["--portmap", "--portmap-port", str(pport)]) as n:
        large_calls = [
            (pport, PMAP_PROG, 2, rpc.PMAPPROC_DUMP),
            (pport, PMAP_PROG, 3, rpc.PMAPPROC_DUMP),
            (n.port, PMAP_PROG, 4, rpc.PMAPPROC_DUMP),
            (pport, PMAP_PROG, 4, 12),   # rpcbind GETSTAT
            (n.port, MOUNT_PROG, 3, rpc.MOUNTPROC_EXPORT),
        ]
        for port, prog, vers, proc in large_calls:
            with RpcClient(n.host, port, proto="udp", src_addr=stranger) as c:
                xid, call = c.build(prog, vers, proc)
                refused = c.call_raw(call, xid)
                assert not refused.accepted, (prog, vers, proc)
                assert (refused.reject_stat, refused.auth_stat) == (rpc.AUTH_ERROR, rpc.AUTH_TOOWEAK)
                assert len(refused.raw) <= len(call), (len(refused.raw), len(call))
            with RpcClient(n.host, port, proto="tcp", src_addr=stranger) as c:
                full = c.call(prog, vers, proc)
                assert full.success and len(full.raw) > len(call), (prog, vers, proc)
            with RpcClient(n.host, port, proto="udp", src_addr=member) as c:
                answer = c.call(prog, vers, proc)
                # GETSTAT's counts include the call before it; its layout stays.
                same = len if (prog, proc) == (PMAP_PROG, 12) else (lambda results: results)
                assert answer.success and same(answer.results) == same(full.results), (prog, vers, proc)
        # small replies still reach anyone over UDP: a stranger can find the ports
        with RpcClient(n.host, pport, proto="udp", src_addr=stranger) as c:
            r = c.call(PMAP_PROG, 2, rpc.PMAPPROC_GETPORT,
                       Packer().u32(MOUNT_PROG).u32(3).u32(IPPROTO_UDP).u32(0).bytes())
            assert r.success and r.unpacker().u32() == n.port
