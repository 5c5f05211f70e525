"""Crash consistency through libnfs: a real client (nfsh durable-writer) creates files
with O_SYNC (FILE_SYNC WRITEs) or UNSTABLE WRITEs + fsync (COMMIT), renames, truncates
and removes them, logging each operation when sent and when libnfs reports it done.
nasd is SIGKILLed at a random point of each trial and restarted on the same state
directory; everything libnfs saw completed must be in the export directory, exactly.

    NASD_LIBNFS_CRASH_TRIALS=50 python3 -m pytest -s tests/reliability/test_crash_libnfs.py

The raw-RPC harness (test_crash.py) controls stable_how per WRITE; this one shows the
same guarantees hold for what a stock client library actually sends.
"""
from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.request

import pytest

from rig.cutter import ConnectionCutter
from rig.nasd import Nasd, free_port
from rig.nfsh import exerciser_lines, nfsh_binary, nfsh_popen, pattern_bytes

TRIALS = int(os.environ.get("NASD_LIBNFS_CRASH_TRIALS", "10"))
SEED = int(os.environ.get("NASD_CRASH_SEED", "20261122"))


def read_log(path) -> list[dict]:
    events = []
    for line in open(path, errors="replace"):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass   # a line cut short by the kill
    return events


def check_trial(events: list[dict], trial_dir) -> tuple[list[str], int]:
    """Replays the log into the expected directory contents and compares them with
    `trial_dir`. Returns (problems, bytes checked). The last operation sent but not
    done was in flight at the kill: either outcome is accepted for it."""
    live: dict[str, tuple[int, int]] = {}          # name -> (size, seed)
    sent = {e["i"]: e for e in events if e.get("state") == "sent"}
    done = {e["i"] for e in events if e.get("state") == "done"}
    in_flight = [sent[i] for i in sorted(sent) if i not in done]
    if len(in_flight) > 1:
        return [f"more than one operation in flight: {in_flight}"], 0
    for i in sorted(done):
        e = sent[i]
        if e["op"] == "put":
            live[e["name"]] = (e["size"], e["seed"])
        elif e["op"] == "rename":
            live[e["to"]] = live.pop(e["name"])
        elif e["op"] == "truncate":
            live[e["name"]] = (e["size"], live[e["name"]][1])
        elif e["op"] == "remove":
            del live[e["name"]]
    flying = in_flight[0] if in_flight else None
    # Names the in-flight operation may have created or removed, and content it may
    # have changed, are checked against both outcomes.
    maybe: dict[str, list] = {}
    if flying:
        n = flying["name"]
        if flying["op"] == "put":
            maybe[n] = [None, "any"]            # absent, or created with any prefix written
        elif flying["op"] == "rename":
            maybe[n] = [live[n], None]
            maybe[flying["to"]] = [None, live[n]]
        elif flying["op"] == "truncate":
            maybe[n] = [live[n], (flying["size"], live[n][1])]
        elif flying["op"] == "remove":
            maybe[n] = [live[n], None]
    problems, checked = [], 0
    on_disk = set(os.listdir(trial_dir))
    for name in sorted(on_disk | set(live) | set(maybe)):
        path = os.path.join(trial_dir, name)
        data = open(path, "rb").read() if name in on_disk else None
        allowed = maybe.get(name, [live.get(name)])
        ok = False
        for want in allowed:
            if want is None:
                ok = ok or data is None
            elif want == "any":
                ok = ok or data is not None
            elif data is not None and len(data) == want[0] and data == pattern_bytes(want[0], want[1]):
                ok = True
        if not ok:
            have = "absent" if data is None else f"{len(data)} bytes"
            problems.append(f"{name}: {have}, expected one of {allowed}")
        elif name in live and data is not None:
            checked += len(data)
    if flying and flying["op"] == "rename":
        both = {flying["name"], flying["to"]} & on_disk
        if len(both) != 1:
            problems.append(f"rename in flight left {sorted(both) or 'neither name'}")
    return problems, checked


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def counter(text: str, name: str, labels: str) -> int:
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\d+)$", text, re.M)
    assert m, f"{name}{{{labels}}} missing from metrics"
    return int(m.group(1))


@pytest.fixture
def export(tmp_path):
    d = tmp_path / "export"
    d.mkdir()
    return d


def test_libnfs_writer_survives_sigkill_trials(export, tmp_path):
    nfsh_binary()   # build before the clock starts
    rng = random.Random(SEED)
    mport = free_port()
    totals = {"trials": 0, "ops_done": 0, "bytes_checked": 0, "in_flight_at_kill": 0}
    problems: list[str] = []
    with Nasd(export, args=["--no-root-squash", "--metrics", f"127.0.0.1:{mport}"]) as srv:
        # A control run that completes: the writer really sends FILE_SYNC WRITEs and
        # COMMITs, so the trials below test both kinds of acknowledgement.
        log = tmp_path / "control.jsonl"
        with open(log, "w") as out:
            p = nfsh_popen(srv.url(), "durable-writer", "control", 40, SEED, stdout=out)
            assert p.wait(timeout=120) == 0, p.stderr.read()
        text = metrics(mport)
        assert counter(text, "nasd_write_requests_total", 'stable="file_sync"') > 0, text
        assert counter(text, "nasd_write_requests_total", 'stable="unstable"') > 0, text
        assert counter(text, "nasd_rpc_calls_total", 'program="nfs3",procedure="COMMIT"') > 0
        pr, checked = check_trial(read_log(log), export / "control")
        assert not pr, pr
        assert checked > 0

        for t in range(TRIALS):
            log = tmp_path / f"trial{t}.jsonl"
            with open(log, "w") as out:
                p = nfsh_popen(srv.url(), "durable-writer", f"t{t}", 100000, SEED + t,
                               stdout=out, env={"NFSH_TIMEOUT_MS": 2000})
                time.sleep(rng.uniform(0.2, 1.2))
                srv.kill()
                p.kill()
                p.wait()
            srv.start()
            events = read_log(log)
            pr, checked = check_trial(events, export / f"t{t}")
            problems += [f"trial {t}: {x}" for x in pr]
            done = sum(1 for e in events if e.get("state") == "done")
            sent = sum(1 for e in events if e.get("state") == "sent")
            totals["trials"] += 1
            totals["ops_done"] += done
            totals["in_flight_at_kill"] += sent - done
            totals["bytes_checked"] += checked
    print(f"\nlibnfs crash {totals} seed={SEED}")
    assert not problems, "\n".join(problems[:20])
    assert totals["ops_done"] > 5 * TRIALS, "the writer did almost nothing before the kills"
    assert totals["bytes_checked"] > 0


def test_fsx_goes_on_through_server_kills(export, tmp_path):
    """A client that lives through the crashes: nfsh fsx (random writes FILE_SYNC and
    UNSTABLE, truncations, reads checked against its model, through two connections)
    while nasd is SIGKILLed and restarted on the same state directory again and again.
    nfsh gets a new connection and sends the cut-off call again; the file handles it
    holds must still be valid and every read must still match what was written before
    the crash. (It turns libnfs's own reconnecting off: libnfs 4.0 mixes a reply cut
    off mid-send with the next connection's bytes; see the test below.)"""
    nfsh_binary()
    rng = random.Random(SEED)
    kills = 0
    with Nasd(export, args=["--no-root-squash"]) as srv:
        p = nfsh_popen(srv.url(), "fsx", "/fsx", 15000, SEED, "8m", tmp_path / "model",
                       env={"NFSH_TIMEOUT_MS": 10000})
        try:
            while p.poll() is None and kills < 12:
                time.sleep(rng.uniform(0.3, 1.2))
                if p.poll() is not None:
                    break
                srv.kill()
                kills += 1
                srv.start()
        except BaseException:
            p.kill()
            p.wait()
            raise
        res = exerciser_lines(p, f"fsx after {kills} kills", timeout=300)[-1]
    assert kills >= 3, f"fsx ended after {kills} kills: too short to have met a crash"
    assert res["ok"] is True and res["ops"] == 15000, res
    assert (export / "fsx").read_bytes() == (tmp_path / "model").read_bytes()
    # Every kill takes both connections down; the next call on either finds it out.
    assert res["retries"] >= kills, f"{res['retries']} calls sent again over {kills} kills"
    print(f"\nfsx through {kills} kills: {res['retries']} calls sent again; {res}")


def test_fsx_goes_on_through_connections_cut_mid_record(export, tmp_path):
    """Connections broken in the middle of an RPC record, in both directions: fsx's NFS
    traffic goes through a relay (rig/cutter.py) that now and then passes only the
    first part of a READ reply, or of a WRITE call, and then closes the connection.
    nasd must not carry out a call it got only part of, nor be put out of step by one,
    and the client's call sent again on a new connection must find the file as the
    model has it: every read is checked and the file must equal the model at the end.
    Each cut costs exactly one call sent again; a client that took a cut reply for a
    whole one (as libnfs 4.0 does when left to reconnect by itself: it fills the rest
    from the new connection) fails on the read's data."""
    nfsh_binary()
    with Nasd(export, args=["--no-root-squash"]) as srv, \
            ConnectionCutter(srv.port, SEED) as cutter:
        # MOUNT goes straight to nasd: only NFS calls and replies pass the cutter.
        url = srv.url().replace(f"nfsport={srv.port}", f"nfsport={cutter.port}")
        p = nfsh_popen(url, "fsx", "/fsx", 3000, SEED, "8m", tmp_path / "model",
                       env={"NFSH_TIMEOUT_MS": 10000, "NFSH_RETRY_FIRST_MOUNT": 1})
        lines = exerciser_lines(p, "fsx through cut connections", timeout=300)
        res = lines[-1]
        assert srv.alive(), "nasd died"
    assert res["ok"] is True and res["ops"] == 3000, res
    # Only the relay breaks connections: nasd ends none, whatever it was sent, and
    # refuses none.
    assert cutter.ended_by_server == 0, f"nasd ended {cutter.ended_by_server} connections"
    assert cutter.upstream_refused == 0, f"nasd refused {cutter.upstream_refused} connections"
    # A first mount is never cut (its calls are small), but one whose connection failed
    # otherwise (nfsh says how on stderr) is tried again: not a call sent again.
    first_mounts_again = [line for line in lines if line.get("op") == "first-mount"]
    assert (export / "fsx").read_bytes() == (tmp_path / "model").read_bytes()
    assert cutter.replies_cut >= 3 and cutter.calls_cut >= 3, \
        f"too few cuts to test anything: {cutter.replies_cut} replies, {cutter.calls_cut} calls"
    assert res["retries"] == cutter.replies_cut + cutter.calls_cut, \
        (f"{res['retries']} calls sent again for {cutter.replies_cut} replies and "
         f"{cutter.calls_cut} calls cut")
    print(f"\nfsx through cut connections: {cutter.replies_cut} replies and "
          f"{cutter.calls_cut} calls cut, {cutter.connections} connections, "
          f"{len(first_mounts_again)} first mounts tried again, {cutter.upstream_refused} "
          f"connections the relay could not pass on; {res}")


def test_checker_rejects_a_missing_acknowledged_file(tmp_path):
    """The checker itself: a put libnfs saw done but absent from disk is reported, and
    a file with the wrong bytes is reported."""
    d = tmp_path / "t"
    d.mkdir()
    events = [
        {"i": 0, "state": "sent", "op": "put", "name": "f0", "size": 5000, "seed": 7, "how": "commit"},
        {"i": 0, "state": "done"},
        {"i": 1, "state": "sent", "op": "put", "name": "f1", "size": 100, "seed": 8, "how": "file_sync"},
        {"i": 1, "state": "done"},
        {"i": 2, "state": "sent", "op": "remove", "name": "f1"},
    ]
    (d / "f0").write_bytes(pattern_bytes(5000, 7))
    assert check_trial(events, d) == ([], 5000)       # remove in flight: f1 may be gone
    (d / "f0").write_bytes(pattern_bytes(5000, 7)[:4096])
    pr, _ = check_trial(events, d)
    assert pr and "f0" in pr[0]
    os.unlink(d / "f0")
    pr, _ = check_trial(events, d)
    assert pr and "f0: absent" in pr[0]
