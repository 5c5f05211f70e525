#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, from real client traffic.

Starts nasd on a loopback port, puts a recording TCP proxy in front of it and runs
libnfs clients (nfsh, nfs-ls, nfs-cat) through the proxy. The client->server stream of
every connection is split into RPC records; the server's MNT reply gives the export's
root file handle. Writes:

  seeds/rpc_record/   raw client streams (first records of each connection)
  seeds/rpc_call/     whole call records (header, credential, arguments)
  seeds/nfs3_args/    procedure byte + NFSv3 arguments (a few per procedure)
  seeds/mount3_args/  procedure byte + MOUNT arguments
  seeds/portmap_args/ version byte + procedure byte + arguments (encoded here: libnfs
                      needs no portmapper when it is given the ports)
  seeds/dispatch/     sessions of records (u16 length + record) with the root handle
                      replaced by the opaque "ROOT" (see fuzz_targets/dispatch.rs)

Usage (from the repo root, after `cargo build --release`):
    python3 fuzz/capture_seeds.py [--out fuzz/seeds]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import socket
import struct
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from rig.nasd import Nasd, free_port  # noqa: E402
from rig.nfsh import run_nfsh  # noqa: E402
from rig import libnfs_tools  # noqa: E402

MAX_SEED = 4096          # bytes per seed file
PER_PROC = 6             # seeds kept per (program, procedure)
ROOT_TOKEN = b"\0\0\0\x04ROOT"
EXPORT_TOKEN = b"\0\0\0\x06EXPORT\0\0"
NEUTRAL_EXPORT = b"/export"   # the capture's temporary path never lands in the repo


class Proxy(threading.Thread):
    """Accepts on a free loopback port, forwards to nasd, records both directions."""

    def __init__(self, target_port: int):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.target = target_port
        self.conns: list[tuple[bytearray, bytearray]] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            s = socket.create_connection(("127.0.0.1", self.target))
            up, down = bytearray(), bytearray()
            self.conns.append((up, down))
            for a, b, log in ((c, s, up), (s, c, down)):
                threading.Thread(target=self._pump, args=(a, b, log), daemon=True).start()

    @staticmethod
    def _pump(a, b, log):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                log += d
                b.sendall(d)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def records(stream: bytes):
    """Splits a record-marked stream into (record, raw bytes incl. marks)."""
    pos, cur, start = 0, b"", 0
    while pos + 4 <= len(stream):
        mark = struct.unpack(">I", stream[pos:pos + 4])[0]
        n = mark & 0x7FFFFFFF
        frag = stream[pos + 4:pos + 4 + n]
        if len(frag) < n:
            return
        cur += frag
        pos += 4 + n
        if mark & 0x80000000:
            yield cur, stream[start:pos]
            cur, start = b"", pos


def parse_call(rec: bytes):
    """-> (xid, prog, vers, proc, args) or None."""
    try:
        xid, mtype, rpcvers, prog, vers, proc, _fl, clen = struct.unpack(">8I", rec[:32])
        p = 32 + (clen + 3) // 4 * 4
        _vf, vlen = struct.unpack(">2I", rec[p:p + 8])
        p += 8 + (vlen + 3) // 4 * 4
        if mtype != 0:
            return None
        return xid, prog, vers, proc, rec[p:]
    except struct.error:
        return None


def root_handle(replies: bytes, mnt_xids: set[int]):
    """The file handle in the first successful reply to an MNT call."""
    for rec, _ in records(replies):
        xid, mtype, stat = struct.unpack(">3I", rec[:12])
        if xid in mnt_xids and mtype == 1 and stat == 0:
            _vf, vlen = struct.unpack(">2I", rec[12:20])
            p = 20 + (vlen + 3) // 4 * 4
            astat, mstat, fhlen = struct.unpack(">3I", rec[p:p + 12])
            if astat == 0 and mstat == 0 and 8 <= fhlen <= 64 and len(rec) >= p + 12 + fhlen:
                return rec[p + 12:p + 12 + fhlen]
    return None


def xdr_opaque(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b + b"\0" * (-len(b) % 4)


def portmap_seeds():
    out = []
    for vers, proc in [(2, 0), (2, 3), (2, 4), (3, 3), (4, 3), (4, 9), (3, 4), (4, 6), (3, 1)]:
        if vers == 2 and proc in (1, 2, 3):
            args = struct.pack(">4I", 100003, 3, 6, 0)
        elif proc in (1, 2, 3, 9):
            args = struct.pack(">2I", 100005, 3) + xdr_opaque(b"tcp") + xdr_opaque(b"127.0.0.1.8.1") + xdr_opaque(b"superuser")
        else:
            args = b""
        out.append(bytes([vers - 2, proc]) + args)
    return out


def write(dirpath: Path, items):
    dirpath.mkdir(parents=True, exist_ok=True)
    n = 0
    for data in items:
        data = data[:MAX_SEED]
        name = hashlib.sha1(data).hexdigest()[:16]
        (dirpath / name).write_bytes(data)
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "fuzz" / "seeds"))
    a = ap.parse_args()
    out = Path(a.out)
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export"
        export.mkdir()
        (export / "hello").write_bytes(b"hello, world\n")
        with Nasd(export, args=["--no-root-squash"]) as srv:
            px = Proxy(srv.port)
            px.start()
            url = srv.url().replace(f"nfsport={srv.port}&mountport={srv.port}",
                                    f"nfsport={px.port}&mountport={px.port}")
            script = [
                ("mkdir", "/d"), ("create-loop", "/d", "3"), ("stat-loop", "/d", "3"),
                ("readdir", "/d", "--names"), ("write-pattern", "/w", "3000", "7"),
                ("verify-pattern", "/w", "3000", "7"), ("truncate", "/w", "100"),
                ("chmod", "/w", "600"), ("symlink", "hello", "/s"), ("readlink", "/s"),
                ("link", "/hello", "/h2"), ("rename", "/h2", "/h3"), ("unlink", "/h3"),
                ("statvfs", "/"), ("lstat", "/s"), ("cat", "/hello"),
                ("remove-loop", "/d", "3"), ("rmdir", "/d"),
                ("mkdir-tree", "/t", "2", "2"),
            ]
            for cmd in script:
                run_nfsh(url, *cmd, timeout=60, check=False)
            if libnfs_tools.tools_available():
                libnfs_tools.nfs_ls(url, recursive=True, timeout=60)
                libnfs_tools.nfs_cat(url.replace("?", "/hello?"), timeout=60)
            px.stop.set()
            px.join(2)
        seeds = {k: [] for k in ("rpc_record", "rpc_call", "nfs3_args", "mount3_args", "dispatch")}
        per_proc: dict[tuple[int, int], int] = {}
        exp = xdr_opaque(str(export).encode())
        mnt = set()
        for up, _ in px.conns:
            mnt |= {c[0] for c in map(parse_call, (r for r, _ in records(bytes(up))))
                    if c and c[1] == 100005 and c[3] == 1}
        root = None
        for _, down in px.conns:
            root = root or root_handle(bytes(down), mnt)
        print("root handle:", root.hex() if root else None)
        for up, _ in px.conns:
            calls = []
            for rec, _raw in records(bytes(up)):
                neutral = rec.replace(exp, xdr_opaque(NEUTRAL_EXPORT))
                calls.append((neutral, rec, parse_call(neutral)))
            seeds["rpc_record"].append(b"".join(struct.pack(">I", 0x80000000 | len(r)) + r
                                                for r, _, _ in calls[:6]))
            session = b""
            for rec, orig, c in calls[:8]:
                if not c:
                    continue
                _xid, prog, _vers, proc, args = c
                k = (prog, proc)
                if per_proc.get(k, 0) < PER_PROC and len(rec) <= MAX_SEED:
                    per_proc[k] = per_proc.get(k, 0) + 1
                    seeds["rpc_call"].append(rec)
                    if prog == 100003:
                        seeds["nfs3_args"].append(bytes([proc]) + args)
                    elif prog == 100005:
                        seeds["mount3_args"].append(bytes([proc]) + args)
                r = orig.replace(exp, EXPORT_TOKEN)
                r = r.replace(xdr_opaque(root), ROOT_TOKEN) if root else r
                if len(session) + len(r) + 2 <= MAX_SEED:
                    session += struct.pack(">H", len(r)) + r
            if session:
                seeds["dispatch"].append(session)
        seeds["portmap_args"] = portmap_seeds()
        for k, items in seeds.items():
            print(f"{k}: {write(out / k, items)} seeds")


if __name__ == "__main__":
    main()
