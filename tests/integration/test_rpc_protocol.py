"""ONC RPC layer, duplicate request cache, exclusive create and write stability,
driven by the raw client in rig/rpc.py."""

import os
import shutil
import socket
import struct
import time
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd, runtime_root  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import (Nfs3Client, RpcClient, Packer, auth_sys, auth_raw, build_call, frame,  # noqa: E402
                     nfs3_args, decode_result, NFS_PROG, MOUNT_PROG, NFS_V3)
from integration._common import ROOT, make_export  # noqa: E402


@pytest.fixture
def work(srv, request):
    """A fresh directory in the export (on disk path, handle) for one test."""
    d = Path(srv.export_dir) / request.node.name.replace("[", "_").replace("]", "")
    d.mkdir()
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        root = c.root(srv.export_dir)
        r = c.lookup(root, d.name)
        assert r.ok
        yield d, r.fh


# ------------------------------------------------------------ RPC errors

PROTOS = ["tcp", "udp"]


@pytest.mark.parametrize("proto", PROTOS)
def test_null_procedures_succeed(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        for prog in (NFS_PROG, MOUNT_PROG):
            r = c.call(prog, 3, 0)
            assert r.success and r.results == b""
        assert c.call(rpc.PMAP_PROG, 2, 0).success


@pytest.mark.parametrize("proto", PROTOS)
def test_unknown_program_is_prog_unavail(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        r = c.call(100099, 1, 0)
        assert r.accepted and r.accept_stat == rpc.PROG_UNAVAIL


@pytest.mark.parametrize("proto", PROTOS)
def test_nfs_v4_is_prog_mismatch_3_3(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        r = c.call(NFS_PROG, 4, 0)
        assert r.accepted and r.accept_stat == rpc.PROG_MISMATCH
        assert r.mismatch == (3, 3)
        r = c.call(NFS_PROG, 2, 0)
        assert r.accept_stat == rpc.PROG_MISMATCH and r.mismatch == (3, 3)


@pytest.mark.parametrize("proto", PROTOS)
def test_unknown_procedure_is_proc_unavail(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        assert c.call(NFS_PROG, 3, 99).accept_stat == rpc.PROC_UNAVAIL
        assert c.call(MOUNT_PROG, 3, 99).accept_stat == rpc.PROC_UNAVAIL


@pytest.mark.parametrize("proto", PROTOS)
def test_truncated_args_are_garbage_args(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto, cred=ROOT) as c:
        # GETATTR: a handle that claims 30 bytes but carries 3
        r = c.call(NFS_PROG, 3, rpc.NFSPROC3_GETATTR, Packer().u32(30).raw(b"abc").bytes())
        assert r.accepted and r.accept_stat == rpc.GARBAGE_ARGS
        # WRITE cut off in the middle of its fixed fields
        r = c.call(NFS_PROG, 3, rpc.NFSPROC3_WRITE, Packer().u32(0).u32(1).bytes())
        assert r.accept_stat == rpc.GARBAGE_ARGS
        r = c.call(MOUNT_PROG, 3, rpc.MOUNTPROC_MNT, b"\0\0")
        assert r.accept_stat == rpc.GARBAGE_ARGS


@pytest.mark.parametrize("proto", PROTOS)
def test_rpc_version_3_is_rpc_mismatch(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        xid = c.next_xid()
        r = c.call_raw(build_call(xid, NFS_PROG, 3, 0, rpcvers=3), xid)
        assert not r.accepted and r.reject_stat == rpc.RPC_MISMATCH
        assert r.mismatch == (2, 2)


@pytest.mark.parametrize("proto", PROTOS)
def test_auth_sys_with_17_groups_is_badcred(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        ok = c.call(NFS_PROG, 3, 0, cred=auth_sys(1000, 1000, gids=range(1, 17)))
        assert ok.success, "16 groups must be accepted"
        r = c.call(NFS_PROG, 3, 0, cred=auth_sys(1000, 1000, gids=range(1, 18)))
        assert not r.accepted and r.reject_stat == rpc.AUTH_ERROR
        assert r.auth_stat == rpc.AUTH_BADCRED


@pytest.mark.parametrize("proto", PROTOS)
def test_auth_sys_machine_name_over_255_bytes_is_badcred(srv, proto):
    with RpcClient(srv.host, srv.port, proto=proto) as c:
        assert c.call(NFS_PROG, 3, 0, cred=auth_sys(1000, 1000, machine="m" * 255)).success
        r = c.call(NFS_PROG, 3, 0, cred=auth_sys(1000, 1000, machine="m" * 256))
        assert not r.accepted and r.reject_stat == rpc.AUTH_ERROR and r.auth_stat == rpc.AUTH_BADCRED
        # The connection (or socket) still serves well-formed calls.
        assert c.call(NFS_PROG, 3, 0).success


@pytest.mark.parametrize("flavor", [6, 3, 99])  # RPCSEC_GSS, AUTH_DH, nonsense
def test_unknown_auth_flavor_is_auth_error(srv, flavor):
    with RpcClient(srv.host, srv.port) as c:
        r = c.call(NFS_PROG, 3, 0, cred=auth_raw(flavor, b"\0" * 8))
        assert not r.accepted and r.reject_stat == rpc.AUTH_ERROR
        assert r.auth_stat in (rpc.AUTH_BADCRED, rpc.AUTH_REJECTEDCRED, rpc.AUTH_TOOWEAK)


def test_multi_fragment_record_accepted(srv, work):
    d, dfh = work
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, "frag", "guarded"))
        wire = frame(msg, 3)
        marks = []
        pos = 0
        while pos < len(wire):
            (hdr,) = struct.unpack(">I", wire[pos:pos + 4])
            marks.append(hdr)
            pos += 4 + (hdr & 0x7FFFFFFF)
        assert len(marks) == 3 and [m >> 31 for m in marks] == [0, 0, 1]
        r = decode_result(rpc.NFSPROC3_CREATE, c.call_raw(msg, xid, fragments=3))
        assert r.ok and r.fh
        assert (d / "frag").is_file()
        # seven fragments, boundaries falling inside header words
        xid2, msg2 = c.build(NFS_PROG, 3, rpc.NFSPROC3_GETATTR, nfs3_args.fh(r.fh))
        r2 = decode_result(rpc.NFSPROC3_GETATTR, c.call_raw(msg2, xid2, fragments=7))
        assert r2.ok and r2.attr.fileid == os.stat(d / "frag").st_ino


def test_udp_large_read_and_readdir_are_answered(srv, work):
    """A reply must fit one datagram: a 1 MiB READ over UDP gets a short read, not silence."""
    d, dfh = work
    data = os.urandom(1 << 20)
    (d / "big").write_bytes(data)
    for i in range(3000):
        (d / f"entry-with-a-longish-name-{i:05d}").touch()
    with Nfs3Client(srv.host, srv.port, proto="udp", cred=ROOT, timeout=3) as c:
        fh = c.lookup(dfh, "big").fh
        r = c.read(fh, 0, 1 << 20)
        assert r.ok and 0 < r.count < 65000 and r.data == data[:r.count] and not r.eof
        r = c.read(fh, (1 << 20) - 100_000, 1 << 20)
        assert r.ok and r.data == data[(1 << 20) - 100_000:][:r.count]
        rd = c.readdir(dfh, count=1 << 20)
        assert rd.ok and rd.entries and not rd.eof
        names = {n for _, n, _ in c.readdir_all(dfh, count=1 << 20)}
        assert len(names) == 3000 + 1 + 2  # entries, big, "." and ".."


def test_malformed_transport_input_is_survived(srv):
    """Zero-length fragments are legal; an oversized record or junk only costs
    that connection/datagram; a REPLY sent to the server is ignored."""
    with RpcClient(srv.host, srv.port) as c:
        xid, msg = c.build(NFS_PROG, 3, 0)
        c.send_raw(struct.pack(">I", 0) + frame(msg))
        assert c.wait_xid(xid).success
        c.send_msg(struct.pack(">II", 5, rpc.MSG_REPLY) + b"\0" * 16)
        xid, msg = c.build(NFS_PROG, 3, 0)
        assert c.call_raw(msg, xid).success
    with RpcClient(srv.host, srv.port) as c:
        c.send_raw(struct.pack(">I", 0x80000000 | 0x7FFFFFFF) + b"x" * 1000)
        c.sock.settimeout(10)
        try:
            assert c.sock.recv(16) == b"", "oversized record: connection closed without a reply"
        except ConnectionResetError:
            pass
    with RpcClient(srv.host, srv.port, proto="udp") as c:
        for junk in (b"", b"abc", os.urandom(100), struct.pack(">II", 1, rpc.MSG_CALL)):
            c.send_raw(junk)
        xid, msg = c.build(NFS_PROG, 3, 0)
        assert c.call_raw(msg, xid).success
    assert srv.alive()


# ------------------------------------------------------------ DRC

def test_drc_create_guarded_retransmit_same_reply(srv, work):
    d, dfh = work
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, "g", "guarded"))
        first = c.resend(msg, xid)
        ino = os.stat(d / "g").st_ino
        again = c.resend(msg, xid)
        assert decode_result(rpc.NFSPROC3_CREATE, first).ok
        assert again.raw == first.raw, "retransmit must get the cached reply byte for byte"
        assert os.listdir(d) == ["g"] and os.stat(d / "g").st_ino == ino
        # a genuinely new call (new XID) runs and fails
        assert c.create(dfh, "g", how="guarded").status == rpc.NFS3ERR_EXIST


def test_drc_remove_retransmit_is_ok_not_noent(srv, work):
    d, dfh = work
    (d / "victim").write_bytes(b"x")
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_REMOVE, nfs3_args.diropargs(dfh, "victim"))
        first = c.resend(msg, xid)
        assert decode_result(rpc.NFSPROC3_REMOVE, first).ok
        assert not (d / "victim").exists()
        again = c.resend(msg, xid)
        assert decode_result(rpc.NFSPROC3_REMOVE, again).ok
        assert again.raw == first.raw
        assert c.remove(dfh, "victim").status == rpc.NFS3ERR_NOENT


@pytest.mark.parametrize("what", ["create", "remove"])
def test_drc_retransmit_on_new_tcp_connection(srv, work, what):
    d, dfh = work
    if what == "create":
        args, proc = nfs3_args.create(dfh, "n", "guarded"), rpc.NFSPROC3_CREATE
    else:
        (d / "n").write_bytes(b"x")
        args, proc = nfs3_args.diropargs(dfh, "n"), rpc.NFSPROC3_REMOVE
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c1:
        xid, msg = c1.build(NFS_PROG, 3, proc, args)
        first = c1.resend(msg, xid)
        port1 = c1.local_addr[1]
    assert decode_result(proc, first).ok
    assert (d / "n").exists() == (what == "create")
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c2:
        assert c2.local_addr[1] != port1
        again = c2.resend(msg, xid)
    assert again.raw == first.raw
    assert (d / "n").exists() == (what == "create")


@pytest.mark.parametrize("what", ["create", "remove", "rename", "mkdir"])
def test_drc_retransmit_after_a_server_kill_gets_the_first_reply(tmp_path, what):
    """A namespace change whose reply was lost when nasd died (SIGKILL) and that the
    client sends again, same XID, to the restarted nasd: answered with the first reply
    from the duplicate request journal, byte for byte, not run again (EEXIST, ENOENT)."""
    export = make_export(tmp_path)
    (export / "n").write_bytes(b"x")
    with Nasd(export, args=["--no-root-squash"]) as srv:
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c1:
            root = c1.root(srv.export_dir)
            proc, args = nfs3_args.namespace_change(root, what)
            xid, msg = c1.build(NFS_PROG, 3, proc, args)
            first = c1.resend(msg, xid)
            assert decode_result(proc, first).ok
        after = sorted(os.listdir(export))
        srv.kill()
        srv.start()
        with Nfs3Client(srv.host, srv.port, cred=ROOT) as c2:
            again = c2.resend(msg, xid)
            assert again.raw == first.raw, (decode_result(proc, again).status, "ran again")
            assert sorted(os.listdir(export)) == after
            # A new call (new XID) does run, and finds the change made.
            r = c2.nfs(proc, args)
            assert r.status != rpc.NFS3_OK, "the same change again should fail"


def journal_holds_reply_to(path, xid) -> bool:
    """Whether the duplicate request journal at `path` holds a reply to `xid` (a framed
    reply starts with its record mark, then the XID and the message type REPLY)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    return struct.pack(">II", xid, 1) in data


@pytest.mark.parametrize("stop", ["clean stop", "kill"])
def test_drc_replies_outlive_a_reboot_through_the_state_directorys_copy(tmp_path, stop):
    """The journal is written to a memory file system (the live journal) and copied to
    the state directory: at a clean stop at once, while serving within a tenth of a
    second. A reboot empties the memory file system (here the runtime directory is
    removed); the restarted nasd starts from the state directory's copy and answers the
    resent CREATE with its first reply. Without the copy it would run again: EXIST."""
    if runtime_root() is None:
        pytest.skip("needs /dev/shm on a tmpfs for the live journal")
    run = Path(tempfile.mkdtemp(prefix="nasd-test-run-", dir="/dev/shm"))
    try:
        export = make_export(tmp_path)
        with Nasd(export, args=["--no-root-squash", "--runtime-dir", run]) as srv:
            with Nfs3Client(srv.host, srv.port, cred=ROOT) as c1:
                root = c1.root(srv.export_dir)
                proc, args = nfs3_args.namespace_change(root, "create")
                xid, msg = c1.build(NFS_PROG, 3, proc, args)
                first = c1.resend(msg, xid)
                assert decode_result(proc, first).ok
            live = list(run.glob("drc-journal-*"))
            assert len(live) == 1 and journal_holds_reply_to(live[0], xid), "the reply is not in the live journal"
            kept = Path(srv.state_dir) / "drc-journal"
            if stop == "clean stop":
                assert srv.stop() == 0
                assert journal_holds_reply_to(kept, xid), "a clean stop left the reply out of the state directory"
            else:
                deadline = time.monotonic() + 10
                while not journal_holds_reply_to(kept, xid):
                    assert time.monotonic() < deadline, "the reply never reached the state directory's journal"
                    time.sleep(0.02)
                srv.kill()
            shutil.rmtree(run)
            srv.start()
            with Nfs3Client(srv.host, srv.port, cred=ROOT) as c2:
                again = c2.resend(msg, xid)
                assert again.raw == first.raw, (decode_result(proc, again).status, "ran again")
            assert len(list(run.glob("drc-journal-*"))) == 1, "the live journal was not made again from the copy"
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_retransmit_while_the_original_runs_is_not_run_again(srv, work):
    """Copies of a GUARDED CREATE sent back to back: the later ones arrive while the
    first still runs (it makes the directory durable) or just after. Each copy is dropped
    or answered with the first reply; none may run again (that would answer EXIST)."""
    d, dfh = work
    first_reply = {}   # xid -> the first reply's bytes

    def take(r):
        if r.xid in first_reply:
            assert r.raw == first_reply[r.xid], "a copy ran again (its reply differs)"
        else:
            assert r.xid == xid, f"a reply to a call not made: xid {r.xid}"
            assert decode_result(rpc.NFSPROC3_CREATE, r).ok
            first_reply[r.xid] = r.raw

    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        for n in range(5):
            xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, f"g{n}", "guarded"))
            c.send_raw(frame(msg) * 3)
            # A copy of an earlier call answered late, on a busy machine, may come first.
            while xid not in first_reply:
                take(c.recv_reply(timeout=30))
            while True:
                try:
                    take(c.recv_reply(timeout=1.0))
                except OSError:  # socket timeout: no more replies
                    break
    assert sorted(os.listdir(d)) == [f"g{n}" for n in range(5)]


def test_replies_leave_in_completion_order(srv, work):
    """A quick call sent behind a slow one on the same connection is answered first."""
    d, dfh = work
    (d / "f").write_bytes(b"")
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        fh = c.lookup(dfh, "f").fh
        slow, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_WRITE, nfs3_args.write(fh, 0, os.urandom(1 << 20), "file_sync"))
        wire = [frame(msg)]
        quick = []
        for _ in range(20):
            x, m = c.build(NFS_PROG, 3, rpc.NFSPROC3_GETATTR, nfs3_args.fh(dfh))
            quick.append(x)
            wire.append(frame(m))
        c.send_raw(b"".join(wire))
        order = [c.recv_reply(timeout=30).xid for _ in range(21)]
    assert sorted(order) == sorted([slow] + quick)
    assert order.index(slow) > 0, "the slow FILE_SYNC WRITE held back every GETATTR behind it"


def test_drc_udp_retransmit(srv, work):
    d, dfh = work
    with Nfs3Client(srv.host, srv.port, proto="udp", cred=ROOT) as c:
        xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_MKDIR, nfs3_args.mkdir(dfh, "sub"))
        first = c.resend(msg, xid)
        again = c.resend(msg, xid)
    assert decode_result(rpc.NFSPROC3_MKDIR, first).ok
    assert again.raw == first.raw and (d / "sub").is_dir()


def test_drc_same_xid_other_args_or_other_client_is_a_new_call(srv, work):
    d, dfh = work
    xid = RpcClient.next_xid()
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        assert c.create(dfh, "a", how="guarded", xid=xid).ok
        assert c.create(dfh, "b", how="guarded", xid=xid).ok, "same XID, different args: not a retransmit"
        xid2, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_REMOVE, nfs3_args.diropargs(dfh, "a"))
        assert decode_result(rpc.NFSPROC3_REMOVE, c.resend(msg, xid2)).ok
    assert sorted(os.listdir(d)) == ["b"]
    (d / "a").write_bytes(b"again")
    with Nfs3Client(srv.host, srv.port, src_addr="127.0.0.2", cred=ROOT) as other:
        r = decode_result(rpc.NFSPROC3_REMOVE, other.resend(msg, xid2))
    assert r.ok and not (d / "a").exists(), "same bytes from another client address must run"


def test_refused_calls_do_not_push_real_replies_out_of_the_drc(tmp_path):
    """A call refused before it changed anything (handles that name nothing, a MKNOD of
    a type that is not a special file, answered before its handle is looked at) is not
    remembered and makes no room: anyone can send such calls, and a stream of them must
    not evict the reply of a real REMOVE from a full cache, whose retransmit would
    otherwise run again (NOENT)."""
    export = make_export(tmp_path)
    (Path(export) / "victim").write_bytes(b"x")
    with Nasd(export, args=["--no-root-squash", "--drc-entries", "32"]) as n, \
            Nfs3Client(n.host, n.port, cred=ROOT) as c:
        root = c.root(n.export_dir)
        xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_REMOVE, nfs3_args.diropargs(root, "victim"))
        first = c.resend(msg, xid)
        assert decode_result(rpc.NFSPROC3_REMOVE, first).ok
        for i in range(31):  # the cache is full
            assert c.create(root, f"f{i}", how="guarded").ok
        for i in range(100):
            bogus = bytes([i]) * 32
            assert c.remove(bogus, "x").status in (rpc.NFS3ERR_BADHANDLE, rpc.NFS3ERR_STALE)
            assert c.mknod(bogus, "x", 1 + i % 2).status == rpc.NFS3ERR_BADTYPE  # NF3REG, NF3DIR
        again = c.resend(msg, xid)
        assert again.raw == first.raw, \
            f"retransmitted REMOVE ran again: {decode_result(rpc.NFSPROC3_REMOVE, again).status}"


def test_pipelined_calls_all_answered(srv, work):
    d, dfh = work
    names = [f"p{i:02d}" for i in range(50)]
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        wire, xids = [], {}
        for i, name in enumerate(names):
            if i % 2:
                xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_CREATE, nfs3_args.create(dfh, name, "guarded"))
                xids[xid] = (rpc.NFSPROC3_CREATE, name)
            else:
                xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_GETATTR, nfs3_args.fh(dfh))
                xids[xid] = (rpc.NFSPROC3_GETATTR, name)
            wire.append(frame(msg))
        c.send_raw(b"".join(wire))  # all 50 before reading anything
        got = {}
        while len(got) < len(xids):
            r = c.recv_reply(timeout=20)
            assert r.xid in xids and r.xid not in got, f"unexpected or duplicate reply xid {r.xid}"
            got[r.xid] = decode_result(xids[r.xid][0], r)
    assert all(r.ok for r in got.values())
    assert sorted(os.listdir(d)) == names[1::2]


def test_pipelined_large_and_small_reads_survive_a_slow_reader(srv, work):
    """128 pipelined READs (1 MiB and 4 KiB) and WRITEs on one connection whose client
    reads slowly through a small receive buffer, so replies leave in batches that only
    partly fit the socket, while FILE_SYNC writes finish on worker threads and queue their
    replies in between: every reply must arrive once, whole and correct."""
    d, dfh = work
    data = os.urandom(4 << 20)
    (d / "big").write_bytes(data)
    rng = __import__("random").Random(7)
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        fh = c.lookup(dfh, "big").fh
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        wire, calls = [], {}
        for i in range(128):
            if i % 4 == 3:
                off = (4 << 20) + i * 4096  # past the data: never read back here
                stable = "file_sync" if i % 8 == 3 else "unstable"
                xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_WRITE, nfs3_args.write(fh, off, b"w" * 4096, stable))
                calls[xid] = (rpc.NFSPROC3_WRITE, off, 4096)
            else:
                count = (1 << 20) if i % 2 else 4096
                off = rng.randrange(0, len(data) - count)
                xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_READ, nfs3_args.read(fh, off, count))
                calls[xid] = (rpc.NFSPROC3_READ, off, count)
            wire.append(frame(msg))
        sender = __import__("threading").Thread(target=c.send_raw, args=(b"".join(wire),))
        sender.start()
        got = set()
        while len(got) < len(calls):
            time.sleep(0.002)
            r = c.recv_reply(timeout=30)
            assert r.xid in calls and r.xid not in got, f"unexpected or duplicate reply xid {r.xid}"
            got.add(r.xid)
            proc, off, count = calls[r.xid]
            res = decode_result(proc, r)
            assert res.ok, f"{proc} at {off}: status {res.status}"
            if proc == rpc.NFSPROC3_READ:
                assert res.count == count and res.data == data[off:off + count], f"READ at {off} returned wrong data"
            else:
                assert res.count == count
        sender.join()


# ------------------------------------------------------------ exclusive create

def test_exclusive_create_verifier(srv, work):
    d, dfh = work
    v1, v2 = b"verfAAAA", b"verfBBBB"
    with Nfs3Client(srv.host, srv.port, cred=ROOT) as c:
        a = c.create(dfh, "ex", how="exclusive", verf=v1)
        assert a.ok and a.fh
        fileid = c.getattr(a.fh).attr.fileid
        assert fileid == os.stat(d / "ex").st_ino
        b = c.create(dfh, "ex", how="exclusive", verf=v1)  # new XID: a client retry
        assert b.ok, f"same verifier must succeed, got {b.status}"
        assert c.getattr(b.fh).attr.fileid == fileid
        assert c.create(dfh, "ex", how="exclusive", verf=v2).status == rpc.NFS3ERR_EXIST
        # a plain file that happens to exist is not "ours" either
        (d / "plain").write_bytes(b"")
        assert c.create(dfh, "plain", how="exclusive", verf=v1).status == rpc.NFS3ERR_EXIST
        # nor one holding data, even with the verifier's times (knfsd: size 0 as well)
        st = os.stat(d / "ex")
        (d / "ex").write_bytes(b"written since")
        os.utime(d / "ex", ns=(st.st_atime_ns, st.st_mtime_ns))
        assert c.create(dfh, "ex", how="exclusive", verf=v1).status == rpc.NFS3ERR_EXIST
        assert (d / "ex").read_bytes() == b"written since"


@pytest.mark.parametrize("proto", PROTOS)
def test_write_whose_count_disagrees_with_its_data_is_garbage_args(srv, work, proto):
    path, dfh = work
    (path / "f").write_bytes(b"original")
    with Nfs3Client(srv.host, srv.port, proto=proto, cred=ROOT) as c:
        fh = c.lookup(dfh, "f").fh
        for count in (3, 9, 0xFFFFFFFF):  # the data below is 5 bytes
            args = Packer().opaque(fh).u64(0).u32(count).u32(rpc.FILE_SYNC).opaque(b"WRONG").bytes()
            r = c.call(NFS_PROG, 3, rpc.NFSPROC3_WRITE, args)
            assert r.accepted and r.accept_stat == rpc.GARBAGE_ARGS, f"count {count}"
    assert (path / "f").read_bytes() == b"original"


# ------------------------------------------------------------ write stability

def test_write_stability_and_verifier(tmp_path):
    export = make_export(tmp_path)
    (export / "f").write_bytes(b"")
    with Nasd(export, args=["--no-root-squash"]) as n:
        with Nfs3Client(n.host, n.port, cred=ROOT) as c:
            fh = c.lookup(c.root(n.export_dir), "f").fh
            w = c.write(fh, 0, b"sync-data", stable="file_sync")
            assert w.ok and w.count == 9 and w.committed == rpc.FILE_SYNC
            u = c.write(fh, 9, b"+unstable", stable="unstable")
            assert u.ok and u.committed == rpc.UNSTABLE
            assert u.verf == w.verf and len(u.verf) == 8
            cm = c.commit(fh)
            assert cm.ok and cm.verf == u.verf
            assert (export / "f").read_bytes() == b"sync-data+unstable"
            before = cm.verf
        n.restart()
        with Nfs3Client(n.host, n.port, cred=ROOT) as c:
            u2 = c.write(fh, 0, b"S", stable="unstable")
            assert u2.ok, "handle must survive the restart"
            assert u2.verf != before, "write verifier must change across a restart"
            assert c.commit(fh).verf == u2.verf
