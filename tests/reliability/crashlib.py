"""Crash-consistency harness: a writer that records what nasd acknowledged as stable,
and a checker that compares the export directory with that record after a SIGKILL.

The writer speaks NFSv3 through the raw RPC client (tests/rig/rpc.py) so it controls
stable_how exactly. One operation is in flight at a time; every operation is appended to
a JSON-lines log (flushed) when sent and again when acknowledged.

Model
  data files  d0..dN, written in BLOCK-sized blocks. Per block, a history of versions
              (the block's bytes, or None after a truncate). A version is *stable* when
              its WRITE was answered DATA_SYNC/FILE_SYNC, or a later COMMIT on the file
              succeeded with the same write verifier, or (truncate) its SETATTR succeeded.
              After a crash a block must hold its last stable version or a version sent
              after it (anything newer may have reached the page cache: a SIGKILL does
              not drop it). A block hit by the write in flight at the kill may be torn,
              byte by byte, between those versions.
  namespace   names in ns/: CREATE (guarded), RENAME, REMOVE. The directory must list
              exactly the acknowledged names, or those with the in-flight op applied.
"""
from __future__ import annotations

import json
import os
import random
import struct
import threading
import time

from rig.rpc import Nfs3Client, auth_sys, NFS3_OK

BLOCK = 4096
BLOCKS_PER_FILE = 48
# Blocks of a large write (128 KiB).
LARGE_WRITE_BLOCKS = 32
STABLE = {"unstable": 0, "data_sync": 1, "file_sync": 2}


def block_bytes(tag: int, block: int) -> bytes:
    """A recognisable, unique block: every 8 bytes say (tag, block)."""
    return struct.pack(">II", tag, block) * (BLOCK // 8)


class Model:
    def __init__(self, nfiles: int):
        self.nfiles = nfiles
        # hist[f][b] = list of [bytes|None, stable, inflight]
        self.hist = [[[[None, True, False]] for _ in range(BLOCKS_PER_FILE)] for _ in range(nfiles)]
        self.names: set[str] = set()
        self.ns_inflight = None      # ("create", name) | ("rename", a, b) | ("remove", name)
        self.tag = 0
        self.uncommitted: dict[int, list] = {}   # file -> [(entry, verf)]

    def next_tag(self) -> int:
        self.tag += 1
        return self.tag


class Writer(threading.Thread):
    """Runs operations until the connection breaks (the server was killed) or `stop`."""

    def __init__(self, port: int, export: str, model: Model, log_path: str, seed: int,
                 ops_limit: int = 100000):
        super().__init__(daemon=True)
        self.port, self.export, self.m = port, export, model
        self.rng = random.Random(seed)
        self.log = open(log_path, "a")
        self.stop = threading.Event()
        self.ops = 0
        self.ops_limit = ops_limit
        self.error = None
        self.failure = None
        self.verfs: set[bytes] = set()

    def note(self, **kw):
        self.log.write(json.dumps(kw) + "\n")
        self.log.flush()

    def run(self):
        try:
            with Nfs3Client("127.0.0.1", self.port, cred=auth_sys(0, 0), timeout=20) as c:
                self.c = c
                root = c.root(self.export)
                self.fhs = []
                for i in range(self.m.nfiles):
                    r = c.lookup(root, f"d{i}")
                    if r.status != NFS3_OK:
                        r = c.create(root, f"d{i}", how="unchecked")
                    assert r.status == NFS3_OK, r.status
                    self.fhs.append(r.fh)
                r = c.lookup(root, "ns")
                if r.status != NFS3_OK:
                    r = c.mkdir(root, "ns")
                assert r.status == NFS3_OK
                self.ns = r.fh
                while not self.stop.is_set() and self.ops < self.ops_limit:
                    self.one()
                    self.ops += 1
        except OSError as e:     # expected: the server went away mid-call (EOF, reset, timeout)
            self.error = e
        except Exception as e:   # an error reply, a malformed one or a wrong result: a real failure
            self.failure = repr(e)
        finally:
            self.log.close()

    def one(self):
        m, rng = self.m, self.rng
        k = rng.random()
        if k < 0.60:
            self.write(rng.randrange(m.nfiles))
        elif k < 0.70:
            self.commit(rng.randrange(m.nfiles))
        elif k < 0.76:
            self.truncate(rng.randrange(m.nfiles))
        else:
            self.namespace()

    def write(self, f):
        m, rng = self.m, self.rng
        if rng.random() < 0.2:
            # 128 KiB or more, aligned, as a streaming client sends them.
            start = rng.randrange(BLOCKS_PER_FILE - LARGE_WRITE_BLOCKS + 1)
            n = rng.randint(LARGE_WRITE_BLOCKS, BLOCKS_PER_FILE - start)
        else:
            start = rng.randrange(BLOCKS_PER_FILE)
            n = min(rng.randint(1, 8), BLOCKS_PER_FILE - start)
        stable = rng.choice(["unstable", "unstable", "data_sync", "file_sync"])
        tag = m.next_tag()
        data = b"".join(block_bytes(tag, b) for b in range(start, start + n))
        entries = []
        for b in range(start, start + n):
            e = [block_bytes(tag, b), False, True]
            m.hist[f][b].append(e)
            entries.append(e)
        self.note(op="write", f=f, block=start, n=n, stable=stable, tag=tag, state="sent")
        r = self.c.write(self.fhs[f], start * BLOCK, data, stable=stable)
        for e in entries:
            e[2] = False
        assert r.status == NFS3_OK and r.count == len(data), (r.status, r.count)
        self.verfs.add(r.verf)
        if r.committed >= STABLE["data_sync"]:
            for e in entries:
                e[1] = True
            self.note(op="write", f=f, tag=tag, state="stable", committed=r.committed)
        else:
            m.uncommitted.setdefault(f, []).extend((e, r.verf) for e in entries)
            self.note(op="write", f=f, tag=tag, state="unstable")

    def commit(self, f):
        pending = self.m.uncommitted.get(f, [])
        self.note(op="commit", f=f, state="sent")
        r = self.c.commit(self.fhs[f])
        assert r.status == NFS3_OK, r.status
        self.verfs.add(r.verf)
        for e, verf in pending:
            if verf == r.verf:
                e[1] = True
            # else: the client would have to resend; the writer never sees this within
            # one server run (test_verifier_* covers it).
        self.m.uncommitted[f] = []
        self.note(op="commit", f=f, state="stable", n=len(pending))

    def truncate(self, f):
        m, rng = self.m, self.rng
        keep = rng.randrange(BLOCKS_PER_FILE // 2, BLOCKS_PER_FILE + 1)
        entries = []
        for b in range(keep, BLOCKS_PER_FILE):
            e = [None, False, True]
            m.hist[f][b].append(e)
            entries.append(e)
        self.note(op="truncate", f=f, size=keep * BLOCK, state="sent")
        r = self.c.setattr(self.fhs[f], size=keep * BLOCK)
        assert r.status == NFS3_OK, r.status
        for e in entries:
            e[1], e[2] = True, False
        self.note(op="truncate", f=f, size=keep * BLOCK, state="stable")

    def namespace(self):
        m, rng = self.m, self.rng
        names = sorted(m.names)
        k = rng.random()
        if not names or k < 0.45:
            name = f"n{m.next_tag()}"
            op = ("create", name)
        elif k < 0.75:
            op = ("rename", rng.choice(names), f"n{m.next_tag()}")
        else:
            op = ("remove", rng.choice(names))
        m.ns_inflight = op
        self.note(op=op[0], args=op[1:], state="sent")
        if op[0] == "create":
            r = self.c.create(self.ns, op[1], how="guarded")
        elif op[0] == "rename":
            r = self.c.rename(self.ns, op[1], self.ns, op[2])
        else:
            r = self.c.remove(self.ns, op[1])
        assert r.status == NFS3_OK, (op, r.status)
        apply_ns(m.names, op)
        m.ns_inflight = None
        self.note(op=op[0], args=op[1:], state="stable")


def apply_ns(names: set, op):
    if op[0] == "create":
        names.add(op[1])
    elif op[0] == "rename":
        names.discard(op[1])
        names.add(op[2])
    else:
        names.discard(op[1])


def _read_local(export_dir: str, name: str) -> bytes:
    path = os.path.join(export_dir, name)
    return open(path, "rb").read() if os.path.exists(path) else b""


def _list_local(export_dir: str, name: str) -> set:
    path = os.path.join(export_dir, name)
    return set(os.listdir(path)) if os.path.isdir(path) else set()


def check(export_dir: str, m: Model, read=None, listdir=None, torn_unsynced: bool = False):
    """-> (bytes_checked, bytes_lost, problems). Also compacts the histories: after a
    crash the on-disk content becomes the new, stable, starting version.

    ``read(name)`` (file contents, b"" if missing) and ``listdir(name)`` (set of
    names, empty if missing) look at the export for names relative to its root;
    by default they read ``export_dir``. ``torn_unsynced``: a block may also be torn
    (byte by byte between its allowed versions) when versions newer than its last
    stable one exist -- after a power cut, writeback of unsynced data may have been
    cut short; after a process kill only the write in flight can tear a block."""
    read = read or (lambda name: _read_local(export_dir, name))
    listdir = listdir or (lambda name: _list_local(export_dir, name))
    checked = lost = 0
    problems = []
    for f in range(m.nfiles):
        data = read(f"d{f}")
        for b in range(BLOCKS_PER_FILE):
            h = m.hist[f][b]
            last = max(i for i, e in enumerate(h) if e[1])
            allowed = [e[0] for e in h[last:]]
            got = data[b * BLOCK:(b + 1) * BLOCK]
            norm = [a if a is not None else b"" for a in allowed]
            ok = any(got == a or (a == b"" and got.strip(b"\0") == b"") for a in norm)
            if not ok:
                # torn in-flight write: every byte from one of the allowed versions
                full = [a if a else b"\0" * BLOCK for a in norm]
                g = got.ljust(BLOCK, b"\0")
                ok = all(any(g[i] == a[i] for a in full) for i in range(BLOCK)) and \
                    (any(e[2] for e in h[last:]) or (torn_unsynced and len(h) - last > 1))
            if h[last][0] is not None:
                checked += BLOCK
                if not ok:
                    lost += BLOCK
            if not ok:
                problems.append(f"d{f} block {b}: got {got[:8].hex()}.. allowed "
                                f"{[(a[:8].hex() if a else None) for a in allowed]}")
            # the state found on disk is now the baseline
            m.hist[f][b] = [[got if got.strip(b'\0') else None, True, False]]
    m.uncommitted.clear()
    actual = set(listdir("ns"))
    want = set(m.names)
    alt = set(want)
    if m.ns_inflight:
        apply_ns(alt, m.ns_inflight)
    if actual != want and actual != alt:
        problems.append(f"namespace: missing {sorted(want - actual)} extra {sorted(actual - want)} "
                        f"(in flight: {m.ns_inflight})")
    m.names = actual
    m.ns_inflight = None
    return checked, lost, problems


def run_trials(srv, trials: int, seed: int, log_path: str, nfiles: int = 6,
               min_run: float = 0.05, max_run: float = 0.6):
    """SIGKILL/restart loop. Returns a summary dict."""
    m = Model(nfiles)
    rng = random.Random(seed)
    total_checked = total_lost = ops = 0
    problems = []
    verfs = []
    t0 = time.monotonic()
    for t in range(trials):
        w = Writer(srv.port, srv.export_dir, m, log_path, seed * 1000 + t)
        w.start()
        time.sleep(rng.uniform(min_run, max_run))
        srv.kill()                                  # SIGKILL, mid-operation
        w.join(30)
        assert not w.is_alive(), "writer hung after the server was killed"
        assert w.failure is None, f"trial {t}: {w.failure}"
        ops += w.ops
        verfs.append(w.verfs)
        srv.start()
        c, lost, p = check(srv.export_dir, m)
        total_checked += c
        total_lost += lost
        problems += [f"trial {t}: {x}" for x in p]
    return {"trials": trials, "ops": ops, "bytes_checked": total_checked,
            "bytes_lost": total_lost, "problems": problems,
            "seconds": round(time.monotonic() - t0, 1), "verfs": verfs}
