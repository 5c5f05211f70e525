"""Crash consistency of the local backend: SIGKILL nasd at random points while a client
writes (UNSTABLE+COMMIT, DATA_SYNC, FILE_SYNC), truncates, creates, renames and removes;
restart it on the same state dir and check that everything acknowledged as stable is
on disk. See crashlib.py for the model and docs/reliability.md for the long run.

    NASD_CRASH_TRIALS=100 python3 -m pytest -s tests/reliability/test_crash.py -k trials

A SIGKILL of the server does not drop the page cache: data written but never fsynced
survives a process kill, so this checks that nothing acknowledged is lost or half-applied
by the server itself (not power loss). `async` exports reply FILE_SYNC without syncing:
they are the only mode allowed to lose acknowledged data (on power loss).
"""
import os
import random

import pytest

from crashlib import run_trials, BLOCK, block_bytes
from rig.nasd import Nasd
from rig.rpc import Nfs3Client, auth_sys, NFS3_OK, UNSTABLE, FILE_SYNC

TRIALS = int(os.environ.get("NASD_CRASH_TRIALS", "20"))
SEED = int(os.environ.get("NASD_CRASH_SEED", "20261122"))


@pytest.fixture
def export(tmp_path):
    d = tmp_path / "export"
    d.mkdir()
    return d


def client(srv):
    return Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=20)


def test_sigkill_trials_lose_nothing_acknowledged(export, tmp_path):
    """`sync` (the default): every acknowledged-stable byte and namespace change survives."""
    log = str(tmp_path / "ops.jsonl")
    with Nasd(export, args=["--no-root-squash"]) as srv:
        s = run_trials(srv, TRIALS, SEED, log)
    print(f"\ncrash trials={s['trials']} ops={s['ops']} bytes_checked={s['bytes_checked']} "
          f"bytes_lost={s['bytes_lost']} seconds={s['seconds']} seed={SEED}")
    assert s["ops"] > TRIALS, "the writer did almost nothing"
    assert s["bytes_checked"] > 0
    assert not s["problems"], "\n".join(s["problems"][:20])
    assert s["bytes_lost"] == 0
    # a fresh write verifier per server run
    per_run = [v for v in s["verfs"] if v]
    assert all(len(v) == 1 for v in per_run), "write verifier changed within one run"
    distinct = {next(iter(v)) for v in per_run}
    assert len(distinct) == len(per_run), "write verifier repeated across restarts"


def test_verifier_changes_and_client_resends(export):
    """UNSTABLE writes, SIGKILL, restart: COMMIT returns a new verifier, so a client
    resends what it had not seen committed, and the data ends correct."""
    with Nasd(export, args=["--no-root-squash"]) as srv:
        with client(srv) as c:
            root = c.root(str(export))
            fh = c.create(root, "v", how="guarded").fh
            pending = {}
            verf1 = None
            for b in range(16):
                data = block_bytes(1, b)
                r = c.write(fh, b * BLOCK, data, stable="unstable")
                assert r.status == NFS3_OK and r.committed == UNSTABLE
                verf1 = verf1 or r.verf
                assert r.verf == verf1
                pending[b] = data
        srv.kill()
        srv.start()
        with client(srv) as c:
            root = c.root(str(export))
            fh2 = c.lookup(root, "v").fh
            assert fh2 == fh, "file handle changed across restart"
            r = c.commit(fh)
            assert r.status == NFS3_OK
            assert r.verf != verf1, "write verifier survived a restart"
            # the client's duty on a verifier mismatch: resend, then commit again
            for b, data in pending.items():
                r = c.write(fh, b * BLOCK, data, stable="unstable")
                assert r.status == NFS3_OK and r.verf != verf1
            verf2 = r.verf
            r = c.commit(fh)
            assert r.status == NFS3_OK and r.verf == verf2
            got = c.read(fh, 0, 16 * BLOCK)
            assert got.status == NFS3_OK
        assert (export / "v").read_bytes() == b"".join(pending[b] for b in range(16))


def test_acknowledged_namespace_changes_survive_sigkill(export):
    with Nasd(export, args=["--no-root-squash"]) as srv:
        with client(srv) as c:
            root = c.root(str(export))
            assert c.mkdir(root, "dir").status == NFS3_OK
            dfh = c.lookup(root, "dir").fh
            for i in range(50):
                assert c.create(dfh, f"c{i}", how="guarded").status == NFS3_OK
            for i in range(0, 50, 2):
                assert c.rename(dfh, f"c{i}", dfh, f"r{i}").status == NFS3_OK
            for i in range(1, 50, 4):
                assert c.remove(dfh, f"c{i}").status == NFS3_OK
            fh = c.create(root, "t", how="guarded").fh
            r = c.write(fh, 0, b"x" * 10000, stable="file_sync")
            assert r.status == NFS3_OK and r.committed == FILE_SYNC
            assert c.setattr(fh, size=1234).status == NFS3_OK
        srv.kill()
        want = {f"r{i}" for i in range(0, 50, 2)} | {f"c{i}" for i in range(1, 50, 2) if (i - 1) % 4}
        assert set(os.listdir(export / "dir")) == want
        assert (export / "t").read_bytes() == b"x" * 1234


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_only_async_claims_unperformed_stability(export, mode):
    """`sync` never claims more than it did: an UNSTABLE write is answered UNSTABLE and
    made stable by COMMIT. `async` answers FILE_SYNC without syncing: the only mode that
    may lose acknowledged data (on power loss; a process kill keeps the page cache)."""
    args = ["--no-root-squash"] + (["--async"] if mode == "async" else [])
    with Nasd(export, args=args) as srv:
        with client(srv) as c:
            root = c.root(str(export))
            fh = c.create(root, "a", how="guarded").fh
            r = c.write(fh, 0, b"y" * 8192, stable="unstable")
            assert r.status == NFS3_OK
            assert r.committed == (FILE_SYNC if mode == "async" else UNSTABLE)
            r = c.write(fh, 8192, b"z" * 8192, stable="file_sync")
            assert r.status == NFS3_OK and r.committed == FILE_SYNC
        srv.kill()
        assert (export / "a").read_bytes() == b"y" * 8192 + b"z" * 8192


def test_checker_detects_a_lost_block(export, tmp_path):
    """The harness itself: a stable block overwritten behind its back is reported lost."""
    from crashlib import Model, Writer, check
    m = Model(2)
    with Nasd(export, args=["--no-root-squash"]) as srv:
        w = Writer(srv.port, srv.export_dir, m, str(tmp_path / "ops.jsonl"), 1, ops_limit=200)
        w.start()
        w.join(60)
        assert w.failure is None and w.ops == 200
        srv.kill()
        victim = next((f, b) for f in range(2) for b in range(len(m.hist[f]))
                      if any(e[1] and e[0] for e in m.hist[f][b]) and m.hist[f][b][-1][1])
        f, b = victim
        with open(export / f"d{f}", "r+b") as fd:
            fd.seek(b * BLOCK)
            fd.write(b"\xee" * BLOCK)
        checked, lost, problems = check(str(export), m)
        assert lost == BLOCK and len(problems) == 1, problems
