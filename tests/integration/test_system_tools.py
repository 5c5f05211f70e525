"""The system's own RPC tools against nasd's embedded portmapper and MOUNT service:
`rpcinfo` (Debian's rpcbind package) and `showmount` (nfs-common), clients nasd did not
write. nasd runs in a network namespace of its own, so port 111 there is nasd's alone."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd  # noqa: E402
from rig.netns import Netns, join  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import Nfs3Client  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespace, port 111)"),
    pytest.mark.skipif(shutil.which("rpcinfo") is None, reason="rpcinfo not installed (Debian package rpcbind)"),
]


def _run(ns: Netns, *cmd: str) -> subprocess.CompletedProcess:
    return ns.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.fixture
def served(tmp_path):
    """nasd with the portmapper on 111 in a fresh namespace; the exports file admits
    `127.0.0.1` unless a test rewrites it."""
    export = make_export(tmp_path, "share")
    ex = write_exports(tmp_path, [f"{export} 127.0.0.1(rw,insecure,no_root_squash) 10.9.0.0/16(ro)"])
    with Netns() as ns, Nasd(exports_file=ex, netns=ns, args=["--portmap"]) as n:
        yield ns, n, export


def test_rpcinfo_finds_nfs_and_mount_through_the_embedded_portmapper(served):
    ns, n, _ = served
    p = _run(ns, "rpcinfo", "-p", "127.0.0.1")          # portmap v2 DUMP over TCP
    assert p.returncode == 0, p.stderr
    rows = {tuple(line.split()[:4]) for line in p.stdout.splitlines()[1:]}
    for proto in ("tcp", "udp"):
        assert ("100003", "3", proto, str(n.port)) in rows, p.stdout
        for vers in ("1", "2", "3"):    # MOUNT 1 and 2 for their listings
            assert ("100005", vers, proto, str(n.port)) in rows, p.stdout
        for vers in ("2", "3", "4"):
            assert ("100000", vers, proto, "111") in rows, p.stdout
    assert not any(r[0] == "100003" and r[1] != "3" for r in rows), "only NFS version 3 is served"
    assert not any(r[0] == "100005" and r[1] not in ("1", "2", "3") for r in rows), p.stdout

    p = _run(ns, "rpcinfo", "127.0.0.1")                # rpcbind v4 DUMP: universal addresses
    assert p.returncode == 0, p.stderr
    port = n.port
    uaddr = f"127.0.0.1.{port >> 8}.{port & 0xff}"
    assert re.search(rf"^\s*100003\s+3\s+tcp\s+{re.escape(uaddr)}\s", p.stdout, re.M), p.stdout

    # NULL calls through the addresses the portmapper gave out, over both transports
    for flag, prog in (("-t", "nfs"), ("-u", "nfs"), ("-t", "mountd"), ("-u", "mountd")):
        p = _run(ns, "rpcinfo", flag, "127.0.0.1", prog, "3")
        assert p.returncode == 0 and "ready and waiting" in p.stdout, (flag, prog, p.stdout, p.stderr)
    # a version nasd does not serve: as with rpcbind, the portmapper gives the program's
    # address and the program answers PROG_MISMATCH with the versions it serves
    p = _run(ns, "rpcinfo", "-t", "127.0.0.1", "nfs", "4")
    assert p.returncode != 0 and "version 4 is not available" in p.stdout, (p.stdout, p.stderr)
    assert "low version = 3, high version = 3" in p.stderr, (p.stdout, p.stderr)


def test_rpcinfo_m_shows_the_lookups_and_calls_the_portmapper_answered(served):
    """rpcbind's statistics (GETSTAT), as `rpcinfo -m` prints them: calls per procedure
    and version, and each service looked up, found or not."""
    ns, _, _ = served
    assert _run(ns, "rpcinfo", "-p", "127.0.0.1").returncode == 0        # portmap v2 DUMP
    assert _run(ns, "rpcinfo", "-t", "127.0.0.1", "nfs", "3").returncode == 0
    assert _run(ns, "rpcinfo", "-u", "127.0.0.1", "mountd", "3").returncode == 0
    assert _run(ns, "rpcinfo", "-t", "127.0.0.1", "100099", "1").returncode != 0   # not served
    p = _run(ns, "rpcinfo", "-m", "127.0.0.1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    v2 = dict(zip(lines[lines.index("PORTMAP (version 2) statistics") + 1].split(),
                  lines[lines.index("PORTMAP (version 2) statistics") + 2].split()))
    assert v2["DUMP"] == "1", p.stdout
    table = lines[lines.index("RPCB_GETADDR (version 4) call statistics") + 2:]
    lookups = {tuple(line.split()) for line in table if line.strip()}
    for row in (("nfs", "3", "tcp", "1", "0"), ("mountd", "3", "udp", "1", "0"), ("100099", "1", "tcp", "0", "1")):
        assert row in lookups, p.stdout
    v4 = lines[lines.index("RPCBIND (version 4) statistics") + 1:]
    found, asked = map(int, dict(zip(v4[0].split(), v4[1].split()))["GETADDR"].split("/"))
    assert asked - found == 1 and found >= 3, p.stdout
    assert dict(zip(v4[2].split(), v4[3].split()))["GETSTAT"] == "1", p.stdout


def test_rpcinfo_over_udp_is_refused_to_a_source_no_export_admits(served, tmp_path):
    """The portmapper's dump is far larger than the call asking for it; over UDP, whose
    source can be forged, only clients a rule names get it, not those only `*` admits
    (see docs/reliability.md)."""
    ns, n, export = served
    assert _run(ns, "rpcinfo", "-T", "udp", "-s", "127.0.0.1").returncode == 0
    write_exports(tmp_path, [f"{export} 127.0.0.2(rw,insecure)"])
    n.restart()
    refused = _run(ns, "rpcinfo", "-T", "udp", "-s", "127.0.0.1")
    assert refused.returncode != 0
    assert "too weak" in refused.stderr, refused.stderr
    over_tcp = _run(ns, "rpcinfo", "-T", "tcp", "-s", "127.0.0.1")
    assert over_tcp.returncode == 0 and "mountd" in over_tcp.stdout, over_tcp.stderr
    # An export for `*` admits every address, forged ones too: it does not vouch for a
    # listing over UDP. NFS calls over UDP of a client it admits are still answered.
    write_exports(tmp_path, [f"{export} *(rw,insecure,no_root_squash)"])
    n.restart()
    refused = _run(ns, "rpcinfo", "-T", "udp", "-s", "127.0.0.1")
    assert refused.returncode != 0 and "too weak" in refused.stderr, (refused.stdout, refused.stderr)
    assert _run(ns, "rpcinfo", "-T", "tcp", "-s", "127.0.0.1").returncode == 0

    # rpcbind's statistics (GETSTAT, whose lists grow with what anyone asks for) too;
    # `rpcinfo -m` asks over TCP whatever -T says, so the call is sent here.
    def getstat_over_udp():
        with rpc.RpcClient("127.0.0.1", 111, proto="udp") as c:
            xid, call = c.build(rpc.PMAP_PROG, 4, 12)
            return c.call_raw(call, xid)
    refused = ns.call(getstat_over_udp, timeout=30)
    assert not refused.accepted and (refused.reject_stat, refused.auth_stat) == (rpc.AUTH_ERROR, rpc.AUTH_TOOWEAK)
    p = _run(ns, "showmount", "-e", "127.0.0.1") if shutil.which("showmount") else None
    assert p is None or (p.returncode == 0 and "*" in p.stdout), (p.stdout, p.stderr)

    def nfs_over_udp():
        with Nfs3Client("127.0.0.1", n.port, cred=ROOT) as c:
            root = c.root(os.path.realpath(export))
        with Nfs3Client("127.0.0.1", n.port, proto="udp", cred=ROOT) as u:
            r = u.readdirplus(root)
            assert r.ok, r.status
    ns.call(nfs_over_udp, timeout=30)


@pytest.mark.skipif(shutil.which("showmount") is None, reason="showmount not installed (Debian package nfs-common)")
def test_showmount_lists_exports_and_mounts(served):
    ns, n, export = served
    p = _run(ns, "showmount", "-e", "127.0.0.1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "Export list for 127.0.0.1:"
    path, clients = lines[1].split()
    assert path == os.path.realpath(export)
    assert clients.split(",") == ["127.0.0.1", "10.9.0.0/16"]

    def mount():
        with Nfs3Client("127.0.0.1", n.port, cred=ROOT) as c:
            assert c.mnt(os.path.realpath(export)).status == rpc.MNT3_OK
    ns.call(mount, timeout=30)
    p = _run(ns, "showmount", "-a", "127.0.0.1")
    assert p.returncode == 0, p.stderr
    assert f"127.0.0.1:{os.path.realpath(export)}" in p.stdout.splitlines()[1:], p.stdout


def _without_system_rpcbind(*cmd: str) -> list[str]:
    """`cmd` in a mount namespace of its own whose /run hides the socket of any rpcbind on
    this machine (a path, which network namespaces share), so that libtirpc registers
    and unregisters over the network, with the portmapper of the namespace it runs in."""
    return ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "sh", *cmd]


def _rpcinfo_rows(ns: Netns, program: str) -> set[tuple[str, ...]]:
    """(program, version, protocol, port) of `program` in `rpcinfo -p` (portmap v2 DUMP)."""
    p = _run(ns, "rpcinfo", "-p", "127.0.0.1")
    assert p.returncode == 0, p.stderr
    return {tuple(line.split()[:4]) for line in p.stdout.splitlines()[1:] if line.split()[0] == program}


@pytest.mark.skipif(shutil.which("rpc.statd") is None, reason="rpc.statd not installed (Debian package nfs-common)")
def test_rpc_statd_registers_with_the_embedded_portmapper_and_unregisters(served, tmp_path):
    """rpc.statd, the status monitor NFSv3 locking relies on, registers with the host's
    portmapper through libtirpc; with `--portmap` that is nasd. libtirpc calls it at
    `::1`, which nasd answers on although it listens on 127.0.0.1."""
    ns, n, _ = served
    state = tmp_path / "statd"
    for sub in ("sm", "sm.bak"):
        (state / sub).mkdir(parents=True)

    def registered() -> set[tuple[str, ...]]:
        """statd's entries in `rpcinfo` (rpcbind v4 DUMP): (program, version, netid, address)."""
        p = _run(ns, "rpcinfo", "127.0.0.1")
        assert p.returncode == 0, p.stderr
        return {tuple(line.split()[:4]) for line in p.stdout.splitlines() if line.split()[0] == "100024"}

    def start_statd() -> subprocess.Popen:
        """rpc.statd, once it has registered all four transports (one SET each) or exited."""
        # Ports of its choosing: a fixed one can be the reserved port its own client of
        # the portmapper happened to bind.
        statd = ns.popen(_without_system_rpcbind("rpc.statd", "--foreground", "--no-syslog", "--no-notify", "-P", str(state)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(100):
            if len(registered()) == 4 or statd.poll() is not None:
                break
            time.sleep(0.2)
        return statd

    logs: dict[int, str] = {}

    def stop(statd: subprocess.Popen) -> str:
        """Its output, once it has stopped (again and again: failure messages stop it too)."""
        if statd.pid not in logs:
            if statd.poll() is None:
                statd.terminate()
            logs[statd.pid] = statd.communicate(timeout=30)[0]
        return logs[statd.pid]

    statd = start_statd()
    try:
        ports = {proto: int(port) for (_, vers, proto, port) in _rpcinfo_rows(ns, "100024") if vers == "1"}
        assert set(ports) == {"tcp", "udp"}, stop(statd)
        # Registered on every address of each family, at the ports portmap v2 gives.
        entries = {netid: addr for (_, _, netid, addr) in registered()}
        assert set(entries) == {"tcp", "udp", "tcp6", "udp6"}, entries
        for netid, addr in entries.items():
            host, high, low = addr.rsplit(".", 2)
            assert host == ("::" if netid.endswith("6") else "0.0.0.0"), entries
            if netid in ports:
                assert int(high) * 256 + int(low) == ports[netid], (entries, ports)
        # Clients find statd through nasd over each transport and family, and reach it.
        for argv in (["-t", "127.0.0.1"], ["-u", "127.0.0.1"], ["-T", "tcp6", "::1"], ["-T", "udp6", "::1"]):
            p = _run(ns, "rpcinfo", *argv, "status", "1")
            assert p.returncode == 0 and "ready and waiting" in p.stdout, (argv, p.stdout, p.stderr)
        # `rpcinfo -d`, libtirpc's UNSET of every transport, as root on this host.
        p = ns.run(_without_system_rpcbind("rpcinfo", "-d", "status", "1"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert _rpcinfo_rows(ns, "100024") == set()
        p = _run(ns, "rpcinfo", "-t", "127.0.0.1", "status", "1")
        assert p.returncode != 0 and "not registered" in p.stderr, (p.stdout, p.stderr)
    finally:
        log = stop(statd)

    # Started again it registers again, and going away it unregisters itself.
    statd = start_statd()
    try:
        assert len(registered()) == 4 and len(_rpcinfo_rows(ns, "100024")) == 2, log + stop(statd)
    finally:
        log = stop(statd)
    assert _rpcinfo_rows(ns, "100024") == set(), log
    assert "Failed to register" not in log, log


def test_only_programs_on_this_host_register_with_the_portmapper(tmp_path):
    """A SET or UNSET from another host is refused (rpcbind's rule), over TCP and UDP,
    even from a reserved port; the same SET from the server's own loopback is taken."""
    export = make_export(tmp_path, "share")
    with Netns() as server_ns, Netns() as client_ns:
        join(server_ns, client_ns)
        with Nasd(export, netns=server_ns, host="127.0.0.1", listen="0.0.0.0", args=["--portmap"]):
            def change(host: str, proto: str, procedure: int) -> bool:
                src_addr = "10.99.0.2" if host == "10.99.0.1" else None
                with rpc.RpcClient(host, 111, proto=proto, src_addr=src_addr, src_port="privileged") as c:
                    r = c.call(rpc.PMAP_PROG, 2, procedure, rpc.Packer().u32(100024).u32(1).u32(6).u32(662).bytes())
                    assert r.success, r
                    return r.unpacker().bool()

            def statd_in_dump() -> bool:
                with rpc.RpcClient("127.0.0.1", 111) as c:
                    maps = rpc.decode_pmaplist(c.call(rpc.PMAP_PROG, 2, rpc.PMAPPROC_DUMP))
                return any(m[0] == 100024 for m in maps)

            SET, UNSET = 1, 2
            for proto in ("tcp", "udp"):
                assert client_ns.call(change, "10.99.0.1", proto, SET, timeout=30) is False, proto
            assert server_ns.call(statd_in_dump, timeout=30) is False
            assert server_ns.call(change, "127.0.0.1", "tcp", SET, timeout=30) is True
            assert server_ns.call(statd_in_dump, timeout=30) is True
            for proto in ("tcp", "udp"):
                assert client_ns.call(change, "10.99.0.1", proto, UNSET, timeout=30) is False, proto
            assert server_ns.call(statd_in_dump, timeout=30) is True
            assert server_ns.call(change, "127.0.0.1", "udp", UNSET, timeout=30) is True
            assert server_ns.call(statd_in_dump, timeout=30) is False


@pytest.mark.skipif(shutil.which("nfs-ls") is None, reason="nfs-ls not installed (Debian package libnfs-utils)")
@pytest.mark.parametrize("listen", ["0.0.0.0", "::"])
def test_libnfs_finds_the_server_by_broadcast(tmp_path, listen):
    """`nfs-ls -D nfs://` broadcasts a portmap CALLIT of MOUNT 2's NULL on each interface
    and lists the servers that answer; any other answer makes it list none at all. Two
    namespaces joined by a veth pair stand for a network; on `::` the broadcast arrives
    v4-mapped, and the reply must leave from the interface's own address."""
    export = make_export(tmp_path, "share")
    with Netns() as server_ns, Netns() as client_ns:
        join(server_ns, client_ns)
        with Nasd(export, netns=server_ns, host="127.0.0.1", listen=listen, args=["--portmap"]) as n:
            p = _run(client_ns, "nfs-ls", "-D", "nfs://")
            assert p.returncode == 0 and p.stdout.split() == ["nfs://10.99.0.1"], (p.stdout, p.stderr, n.log()[-2000:])

            # rpcbind v3's CALLIT names the program's address: the interface's, not the
            # broadcast address the call was sent to.
            def callit_v3_broadcast():
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                    s.settimeout(10)
                    args = rpc.Packer().u32(rpc.MOUNT_PROG).u32(3).u32(0).opaque(b"").bytes()
                    s.sendto(rpc.build_call(0x5eed, rpc.PMAP_PROG, 3, 5, args), ("10.99.0.255", 111))
                    data, source = s.recvfrom(65536)
                reply = rpc.parse_reply(data)
                assert reply.success, reply
                return source[0], reply.unpacker().opaque().decode()
            assert client_ns.call(callit_v3_broadcast, timeout=30) == ("10.99.0.1", f"10.99.0.1.{n.port >> 8}.{n.port & 0xff}")
