"""IPv6: libnfs reaches nasd over IPv6 as over IPv4, through the embedded portmapper too,
and each address family's export rules decide for its own clients, also when one
dual-stack socket (`--listen [::]:P`) hears both. The dual-stack server runs in a fresh
network namespace, where its wildcard address reaches nothing but that namespace's
loopback."""

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig import rpc  # noqa: E402
from rig.libnfs_tools import LibnfsToolError, nfs_cat, nfs_ls, nfs_put, tools_available  # noqa: E402
from rig.nasd import Nasd  # noqa: E402
from rig.netns import Netns  # noqa: E402
from rig.rpc import Nfs3Client  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402

def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not tools_available(), reason="libnfs-utils (nfs-cat, nfs-cp, nfs-ls) not installed"),
    pytest.mark.skipif(not _ipv6_loopback(), reason="this host has no IPv6 loopback (::1): IPv6 disabled"),
]

PAYLOAD = b"written over IPv6\n" * 1000


def _url(host: str, path: str, port: int | None = None) -> str:
    """A libnfs URL; libnfs takes an IPv6 address without brackets. Without `port`, the
    client asks the portmapper on 111."""
    ports = f"?nfsport={port}&mountport={port}" if port else ""
    return f"nfs://{host}{path}{ports}"


def test_a_libnfs_client_over_ipv6_writes_reads_and_lists(tmp_path):
    export = make_export(tmp_path)
    (export / "sub").mkdir()
    ex = write_exports(tmp_path, [f"{export} ::1(rw,no_root_squash,insecure)"])
    src = tmp_path / "src"
    src.write_bytes(PAYLOAD)
    with Nasd(exports_file=ex, host="::1") as srv:
        assert nfs_put(src, _url("::1", f"{export}/sub/file", srv.port)) == len(PAYLOAD)
        assert (export / "sub" / "file").read_bytes() == PAYLOAD
        assert nfs_cat(_url("::1", f"{export}/sub/file", srv.port)) == PAYLOAD
        listing = nfs_ls(_url("::1", f"{export}/sub", srv.port))
        assert [(e["name"], e["size"]) for e in listing] == [("file", len(PAYLOAD))]
        # MOUNT's list names the client by its IPv6 address (libnfs mounted the URL's
        # directory, `sub`).
        with Nfs3Client("::1", srv.port, cred=ROOT) as c:
            assert ("::1", f"{export}/sub") in c.mount_dump()


def test_each_familys_rules_decide_for_its_clients_on_a_dual_stack_socket(tmp_path):
    """An IPv4 client of a `[::]` socket arrives as ::ffff:127.0.0.1: the rules written for
    127.0.0.1 must be the ones it gets, and the IPv6 rules only IPv6 clients'."""
    six = make_export(tmp_path, "six")      # read-write for ::1, read-only for 127.0.0.1
    four = make_export(tmp_path, "four")    # read-write for 127.0.0.1, refused to ::1
    (six / "f").write_bytes(b"six\n")
    (four / "f").write_bytes(b"four\n")
    ex = write_exports(tmp_path, [
        f"{six} ::1(rw,no_root_squash,insecure) 127.0.0.1(ro,insecure)",
        f"{four} fd00::/8(rw,insecure) 127.0.0.1(rw,no_root_squash,insecure)",
    ])
    src = tmp_path / "src"
    src.write_bytes(PAYLOAD)
    with Netns() as ns, Nasd(exports_file=ex, netns=ns, host="::1", listen="::", args=["--portmap"]) as srv:
        # Through the portmapper on 111 (libnfs asks rpcbind v3 GETADDR over IPv6, with
        # no netid) as through the port itself.
        for port in (None, srv.port):
            assert nfs_cat(_url("::1", f"{six}/f", port), netns=ns) == b"six\n"
            assert nfs_cat(_url("127.0.0.1", f"{four}/f", port), netns=ns) == b"four\n"
        nfs_put(src, _url("::1", f"{six}/by-six"), netns=ns)
        nfs_put(src, _url("127.0.0.1", f"{four}/by-four"), netns=ns)
        assert (six / "by-six").read_bytes() == PAYLOAD
        assert (four / "by-four").read_bytes() == PAYLOAD

        # 127.0.0.1 reads `six` but may not write it; ::1 may not mount `four`.
        assert nfs_cat(_url("127.0.0.1", f"{six}/f"), netns=ns) == b"six\n"
        with pytest.raises(LibnfsToolError, match="ROFS"):
            nfs_put(src, _url("127.0.0.1", f"{six}/by-four"), netns=ns)
        with pytest.raises(LibnfsToolError, match="MNT3ERR_ACCES"):
            nfs_cat(_url("::1", f"{four}/f"), netns=ns)
        assert not (six / "by-four").exists()

        # The same decisions over UDP, where the IPv4 caller's source is also mapped.
        def mount_statuses():
            got = {}
            for host in ("::1", "127.0.0.1"):
                for proto in ("tcp", "udp"):
                    with Nfs3Client(host, srv.port, proto=proto, cred=ROOT) as c:
                        got[host, proto] = (c.mnt(str(six)).status, c.mnt(str(four)).status)
            return got
        statuses = ns.call(mount_statuses, timeout=60)
        for proto in ("tcp", "udp"):
            assert statuses["::1", proto] == (rpc.MNT3_OK, rpc.MNT3ERR_ACCES), statuses
            assert statuses["127.0.0.1", proto] == (rpc.MNT3_OK, rpc.MNT3_OK), statuses
