"""Self-tests of the test rig's client tools (no nasd needed).

    pytest tests/rig/test_rig_selftest.py

* pure unit tests (fio JSON parsing, data pattern, deb822 parsing);
* the connection cutter against a stand-in record server;
* fio with the libnfs engine builds (root: apt-get source) and lists ``nfs``;
* nfsh builds;
* the Nasd launcher against a stand-in server script;
* end to end against NFS-Ganesha (rig/ganesha.py): nfsh, fio (v3 + v4),
  nfs-ls/nfs-cat/nfs-cp, and nfsh hold-and-read across a server restart.
"""

import os
import signal
import socket
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig import fio as rig_fio  # noqa: E402
from rig.fio import parse_fio_json, run_fio, fio_binary, has_nfs_engine  # noqa: E402
from rig.nfsh import (nfsh, nfsh_lines, nfsh_popen, nfsh_binary, NfshError, OutputFollower,  # noqa: E402
                      pattern_bytes, parse_lines)
from rig.nasd import Nasd, NasdError, free_port  # noqa: E402
from rig import libnfs_tools  # noqa: E402
from rig.cutter import ConnectionCutter  # noqa: E402

IS_ROOT = os.geteuid() == 0


# ---------------------------------------------------------------- pure

def test_parse_fio_json_with_engine_noise():
    doc = '{\n  "fio version" : "fio-3.33",\n  "jobs" : [\n    {\n      "jobname" : "r"\n    }\n  ]\n}\n'
    assert parse_fio_json(doc)["jobs"][0]["jobname"] == "r"
    noisy = "Failed NFS operation(code:-14)\n" + doc + "Failed NFS operation(code:-14)\n"
    assert parse_fio_json(noisy)["fio version"] == "fio-3.33"
    lines = doc.splitlines()
    mid = "\n".join(lines[:3] + ["Failed NFS operation(code:-14)"] + lines[3:])
    assert parse_fio_json(mid)["jobs"][0]["jobname"] == "r"
    with pytest.raises(ValueError):
        parse_fio_json("no json here\n")


def test_pattern_bytes_is_offset_consistent():
    whole = pattern_bytes(4096, 7)
    assert len(whole) == 4096
    for off, n in [(0, 1), (1, 7), (5, 100), (8, 8), (1001, 2000), (4095, 1)]:
        assert pattern_bytes(n, 7, off) == whole[off:off + n]
    assert pattern_bytes(64, 8) != pattern_bytes(64, 7)
    # splitmix64(0) little-endian, a fixed point shared with nfsh.c
    assert pattern_bytes(8, 0) == (0xE220A8397B1DCDAF).to_bytes(8, "little")


def test_deb822_parsing_copies_sources():
    text = textwrap.dedent("""\
        Types: deb
        # comment
        URIs: http://mirror.invalid/debian
        Suites: stable stable-updates
        Components: main
        Signed-By: /usr/share/keyrings/x.gpg

        Types: deb deb-src
        URIs: http://mirror.invalid/sec
        Suites: stable-security
        Components: main contrib
        """)
    st = rig_fio._parse_deb822(text)
    assert len(st) == 2
    assert st[0]["suites"] == "stable stable-updates"
    assert st[1]["types"].split() == ["deb", "deb-src"]


# ---------------------------------------------------------------- cutter

def _record(xid: int, procedure: int, body_len: int) -> bytes:
    """A call-shaped record: mark, XID, CALL, RPC 2, program, version, procedure, body."""
    body = struct.pack(">IIIIII", xid, 0, 2, 100003, 3, procedure) + bytes([xid % 251]) * body_len
    return struct.pack(">I", 0x80000000 | len(body)) + body


def _record_echo_server():
    """A loopback server that answers every record with the same record: port, thread."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)

    def serve():
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            with c:
                buf = b""
                while (data := c.recv(1 << 16)):
                    buf += data
                    while len(buf) >= 4 and len(buf) >= (n := 4 + (struct.unpack(">I", buf[:4])[0] & 0x7fffffff)):
                        c.sendall(buf[:n])
                        buf = buf[n:]
    threading.Thread(target=serve, daemon=True).start()
    return ls


def _recv_exactly_or_eof(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n and (data := s.recv(n - len(got))):
        got += data
    return got


def test_cutter_passes_records_unchanged_when_it_cuts_nothing():
    ls = _record_echo_server()
    with ConnectionCutter(ls.getsockname()[1], 1, lambda *a: 0.0) as cut, \
            socket.create_connection(("127.0.0.1", cut.port)) as s:
        for xid in range(1, 40):
            rec = _record(xid, 7, xid * 997)
            s.sendall(rec)
            assert _recv_exactly_or_eof(s, len(rec)) == rec
    ls.close()
    assert (cut.replies_cut, cut.calls_cut, cut.connections) == (0, 0, 1)
    _settle()
    assert (cut.ended_by_server, cut.upstream_refused) == (0, 0), "the client ended it"


def test_cutter_cuts_only_the_records_it_is_told_and_then_closes():
    """Replies to procedure 8 are cut: a strict prefix, then end of stream, counted
    under that procedure; a reply to procedure 1 before it passes whole."""
    ls = _record_echo_server()
    chance = lambda is_reply, procedure, length: 1.0 if is_reply and procedure == 8 else 0.0  # noqa: E731
    with ConnectionCutter(ls.getsockname()[1], 7, chance) as cut, \
            socket.create_connection(("127.0.0.1", cut.port)) as s:
        whole = _record(5, 1, 100)
        s.sendall(whole)
        assert _recv_exactly_or_eof(s, len(whole)) == whole
        victim = _record(6, 8, 5000)
        s.sendall(victim)
        got = _recv_exactly_or_eof(s, len(victim))
        assert 0 < len(got) < len(victim) and victim.startswith(got)
        assert s.recv(10) == b"", "the connection stays open after a cut"
    ls.close()
    assert cut.replies_cut == 1 and cut.calls_cut == 0
    assert dict(cut.replies_cut_by_procedure) == {8: 1}
    _settle()
    assert cut.ended_by_server == 0, "the relay ended it, by the cut"


def _settle() -> None:
    """Gives the relay's threads time to see a connection's end."""
    time.sleep(0.3)


def test_cutter_counts_connections_the_server_ends_or_refuses():
    """A server that closes a connection after one reply is counted as having ended
    it; a server port nobody listens on, as refusing the relay."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def answer_once_and_close():
        c, _ = ls.accept()
        with c:
            rec = c.recv(1 << 16)
            c.sendall(rec)
    threading.Thread(target=answer_once_and_close, daemon=True).start()
    with ConnectionCutter(ls.getsockname()[1], 3, lambda *a: 0.0) as cut, \
            socket.create_connection(("127.0.0.1", cut.port)) as s:
        rec = _record(9, 1, 40)
        s.sendall(rec)
        assert _recv_exactly_or_eof(s, len(rec)) == rec
        assert s.recv(10) == b""
        _settle()
        assert (cut.ended_by_server, cut.upstream_refused) == (1, 0)
    port = ls.getsockname()[1]
    ls.close()
    with ConnectionCutter(port, 3, lambda *a: 0.0) as cut, \
            socket.create_connection(("127.0.0.1", cut.port)) as s:
        assert s.recv(10) == b""
        assert (cut.ended_by_server, cut.upstream_refused, cut.connections) == (0, 1, 0)


# ---------------------------------------------------------------- builds

def test_fio_binary_has_nfs_engine():
    if not IS_ROOT and not os.environ.get("NASD_FIO"):
        cached = list(rig_fio.get_cache_dir().glob(f"fio-libnfs-{rig_fio.recipe_hash()}/fio"))
        if not cached:
            pytest.skip("building fio needs root (apt-get source)")
    t0 = time.monotonic()
    fio = fio_binary()
    assert os.access(fio, os.X_OK)
    assert has_nfs_engine(fio), "fio --enghelp does not list nfs"
    # second call is a cache hit: the same binary, not built again
    t1 = time.monotonic()
    built = os.stat(fio)
    assert fio_binary() == fio
    again = os.stat(fio)
    assert (again.st_ino, again.st_mtime_ns) == (built.st_ino, built.st_mtime_ns), "fio was built again"
    print(f"fio ready in {t1 - t0:.1f}s: {fio}")
    help_ = subprocess.run([fio, "--enghelp=nfs"], capture_output=True, text=True).stdout
    assert "nfs_url" in help_


def test_nfsh_builds_and_reports_usage():
    b = nfsh_binary()
    assert os.access(b, os.X_OK)
    assert nfsh_binary() == b
    p = subprocess.run([b], capture_output=True, text=True)
    assert p.returncode == 2 and "usage: nfsh" in p.stderr
    p = subprocess.run([b, "nfs://127.0.0.1/x", "no-such-command"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown command" in p.stderr


def test_free_port_stays_out_of_the_ephemeral_range_and_never_repeats():
    # Below the range the kernel gives outgoing connections, so none of them can take
    # the port before the server binds it; and distinct, as a server's two ports must be.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)] + [free_port("::1") for _ in range(5)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports), ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # still free


def test_nfsh_connection_refused_is_a_clear_error():
    port = free_port()  # nothing listens there
    with pytest.raises(NfshError) as ei:
        nfsh(f"nfs://127.0.0.1/x?nfsport={port}&mountport={port}&version=3",
             "stat", "/", timeout=60, env={"NFSH_TIMEOUT_MS": 5000})
    assert ei.value.returncode == 1
    assert "mount" in str(ei.value)


# ------------------------------------------------- Nasd with a stand-in

FAKE_NASD = r'''#!/usr/bin/env python3
import argparse, os, signal, socket, sys
ap = argparse.ArgumentParser()
ap.add_argument("cmd"); ap.add_argument("dir", nargs="?")
ap.add_argument("--listen", required=True); ap.add_argument("--state-dir", required=True)
ap.add_argument("--runtime-dir")
ap.add_argument("--exports"); ap.add_argument("--ro", action="store_true")
ap.add_argument("--ignore-term", action="store_true"); ap.add_argument("--fail", action="store_true")
a = ap.parse_args()
assert a.cmd == "serve"
if a.fail:
    print("error: bad config", file=sys.stderr); sys.exit(3)
# everything observable happens before listen(): Nasd is "ready" at listen
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM", file=sys.stderr, flush=True), sys.exit(0)))
with open(os.path.join(a.state_dir, "runs"), "a") as f:
    f.write("run\n")
print(f"serving {a.dir or a.exports} ro={a.ro} on {a.listen}", file=sys.stderr, flush=True)
host, port = a.listen.rsplit(":", 1)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, int(port))); s.listen()
while True:
    c, _ = s.accept(); c.close()
'''


@pytest.fixture
def fake_nasd(tmp_path):
    p = tmp_path / "fake-nasd"
    p.write_text(FAKE_NASD)
    p.chmod(0o755)
    return p


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists"; Nasd reaps, so treat as dead only if gone
    return True


def test_nasd_launcher_lifecycle(tmp_path, fake_nasd):
    export = tmp_path / "export"
    export.mkdir()
    with Nasd(export, args=["--ro"], binary=fake_nasd) as srv:
        assert srv.port > 0
        assert srv.url() == (f"nfs://127.0.0.1{export}?nfsport={srv.port}"
                             f"&mountport={srv.port}&version=3")
        assert srv.url("/a/b").startswith(f"nfs://127.0.0.1{export}/a/b?")
        assert "version=4" in srv.url(version=4)
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
        state, port, pid1 = srv.state_dir, srv.port, srv.pid
        srv.restart()
        assert srv.port == port and srv.state_dir == state and srv.pid != pid1
        assert Path(state, "runs").read_text().count("run") == 2
        assert srv.kill(signal.SIGKILL) == -signal.SIGKILL
        assert not srv.alive()
        srv.start()
        pid = srv.pid
        assert srv.stop() == 0
        assert not _pid_alive(pid)
        srv.start()
        pid = srv.pid
        log = srv.log()
        assert "ro=True" in log and f"--listen 127.0.0.1:{port}" in log and "SIGTERM" in log
    assert not _pid_alive(pid)
    assert "serving" in srv.log()  # still readable after exit
    assert not os.path.exists(state)


def test_nasd_launcher_escalates_to_sigkill_and_exports_file(tmp_path, fake_nasd):
    ex = tmp_path / "exports.toml"
    ex.write_text("# whatever\n")
    srv = Nasd(exports_file=ex, args=["--ignore-term"], binary=fake_nasd, stop_timeout=1)
    with srv:
        assert f"--exports {ex}" in srv.log()
        assert srv.url(export="/srv/x").startswith("nfs://127.0.0.1/srv/x?")
        with pytest.raises(ValueError):
            srv.url()
    assert srv.returncode == -signal.SIGKILL


def test_nasd_launcher_reports_early_exit(tmp_path, fake_nasd):
    with pytest.raises(NasdError) as ei:
        with Nasd(tmp_path, args=["--fail"], binary=fake_nasd):
            pass
    assert "bad config" in str(ei.value) and "rc=3" in str(ei.value)
    with pytest.raises(NasdError, match="binary not found"):
        Nasd(tmp_path, binary=tmp_path / "nope").start()


def test_nasd_launcher_in_netns(tmp_path, fake_nasd):
    from rig.netns import Netns
    if not IS_ROOT or not shutil.which("ip"):
        pytest.skip("netns needs root and iproute2")
    with Netns() as ns, Nasd(tmp_path, netns=ns, binary=fake_nasd) as srv:
        assert srv.port == 2049
        assert srv.url().startswith(f"nfs://127.0.0.1{tmp_path}?nfsport=2049&mountport=2049")
        srv.restart()
        assert srv.alive()


# ------------------------------------------------ end to end vs Ganesha

def _ganesha_cls():
    if not shutil.which("ganesha.nfsd"):
        pytest.skip("ganesha.nfsd not installed (apt-get install nfs-ganesha nfs-ganesha-vfs)")
    if not IS_ROOT:
        pytest.skip("NFS-Ganesha needs root")
    from rig.ganesha import Ganesha
    return Ganesha


def _v3_url(g, path=""):
    return (f"nfs://127.0.0.1{g.export_path}{path}"
            f"?nfsport={g.port}&mountport={g.mount_port}&version=3")


@pytest.fixture(scope="module")
def ganesha(tmp_path_factory):
    Ganesha = _ganesha_cls()
    export = tmp_path_factory.mktemp("ganesha-export")
    with Ganesha(export) as g:
        g.local_dir = Path(export)
        yield g


def test_e2e_nfsh_against_ganesha(ganesha):
    url = _v3_url(ganesha)
    local = ganesha.local_dir
    root = nfsh(url, "stat", "/")
    assert root["type"] == "dir" and root["ok"] is True
    assert root["ino"] == os.stat(local).st_ino

    r = nfsh(url, "mkdir-tree", "/tree", 4, 5)
    assert r["dirs"] == 4 and r["files"] == 20
    assert sorted(os.listdir(local / "tree")) == [f"d{i:05d}" for i in range(4)]
    assert len(os.listdir(local / "tree" / "d00003")) == 5

    nfsh(url, "mkdir", "/loop")
    assert nfsh(url, "create-loop", "/loop", 300)["ops"] == 300
    assert len(os.listdir(local / "loop")) == 300
    assert nfsh(url, "stat-loop", "/loop", 300)["ops"] == 300
    rd = nfsh(url, "readdir", "/loop", "--names")
    assert rd["count"] == 300 and rd["unique"] is True
    assert rd["names"] == sorted(f"f{i:08d}" for i in range(300))
    st = nfsh(url, "stat", "/loop/f00000007")
    assert st["size"] == 0 and st["type"] == "file" and st["perm"] == "0644"
    assert nfsh(url, "remove-loop", "/loop", 300)["ops"] == 300
    assert os.listdir(local / "loop") == []

    size = 3 * 1024 * 1024 + 123
    assert nfsh(url, "write-pattern", "/pat", size, 99)["bytes"] == size
    assert nfsh(url, "verify-pattern", "/pat", size, 99)["ok"] is True
    data = (local / "pat").read_bytes()
    assert len(data) == size
    assert data[:65536] == pattern_bytes(65536, 99)
    assert data[-1000:] == pattern_bytes(1000, 99, size - 1000)
    with pytest.raises(NfshError) as ei:
        nfsh(url, "verify-pattern", "/pat", size, 100)
    assert ei.value.returncode == 3 and ei.value.result["first_mismatch"] == 0

    with pytest.raises(NfshError) as ei:
        nfsh(url, "stat", "/does/not/exist")
    assert ei.value.errno == 2 and "NOENT" in ei.value.stderr

    nfsh(url, "symlink", "pat", "/ln")
    assert nfsh(url, "readlink", "/ln")["target"] == "pat"
    assert nfsh(url, "lstat", "/ln")["type"] == "symlink"
    nfsh(url, "rename", "/ln", "/ln2")
    assert os.readlink(local / "ln2") == "pat"
    assert nfsh(url, "statvfs", "/")["bsize"] > 0


def test_e2e_fio_nfs_engine_against_ganesha(ganesha):
    url = f"nfs://127.0.0.1{ganesha.export_path}?nfsport={ganesha.port}&mountport={ganesha.mount_port}"
    common = ["--ioengine=nfs", f"--nfs_url={url}", "--size=8m", "--filename=fio.dat"]
    w = run_fio(["--name=layout", "--rw=write", "--bs=128k"] + common, timeout=120)
    assert w["jobs"][0]["write"]["io_bytes"] == 8 * 1024 * 1024
    assert (ganesha.local_dir / "fio.dat").stat().st_size == 8 * 1024 * 1024
    r = run_fio(["--name=rr", "--rw=randread", "--bs=4k", "--runtime=2", "--time_based"]
                + common, timeout=120)
    assert r["jobs"][0]["read"]["iops"] > 0
    # NFSv4 through the pseudo root
    url4 = f"nfs://127.0.0.1{ganesha.pseudo}?version=4&nfsport={ganesha.port}"
    r4 = run_fio(["--name=r4", "--rw=read", "--bs=128k", "--ioengine=nfs",
                  f"--nfs_url={url4}", "--size=8m", "--filename=fio.dat"], timeout=120)
    assert r4["jobs"][0]["read"]["io_bytes"] == 8 * 1024 * 1024


def test_e2e_libnfs_utils_against_ganesha(ganesha, tmp_path):
    if not libnfs_tools.tools_available():
        pytest.skip("libnfs-utils not installed")
    local = ganesha.local_dir
    (local / "hello world.txt").write_text("hello\n")
    names = {e["name"]: e for e in libnfs_tools.nfs_ls(_v3_url(ganesha))}
    assert names["hello world.txt"]["size"] == 6 and names["hello world.txt"]["type"] == "file"
    assert libnfs_tools.nfs_cat(_v3_url(ganesha, "/hello world.txt")) == b"hello\n"
    src = tmp_path / "up.bin"
    src.write_bytes(pattern_bytes(200_000, 5))
    assert libnfs_tools.nfs_put(src, _v3_url(ganesha, "/up.bin")) == 200_000
    assert (local / "up.bin").read_bytes() == src.read_bytes()
    assert libnfs_tools.nfs_get(_v3_url(ganesha, "/up.bin"), tmp_path / "down.bin") == 200_000
    assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()
    with pytest.raises(libnfs_tools.LibnfsToolError) as ei:
        libnfs_tools.nfs_cat(_v3_url(ganesha, "/missing"))
    assert "NOENT" in ei.value.stderr


def test_e2e_hold_and_read_survives_ganesha_restart(tmp_path):
    """The mechanism nasd's restart tests rely on: a libnfs handle kept open
    across a server restart on the same ports keeps working (auto-reconnect)."""
    Ganesha = _ganesha_cls()
    export = tmp_path / "exp"
    export.mkdir()
    (export / "f").write_bytes(pattern_bytes(100_000, 3))
    port, mport = free_port(), free_port()
    g = Ganesha(export, port=port, mount_port=mport)
    g.start()
    proc = None
    try:
        url = _v3_url(g)
        proc = nfsh_popen(url, "hold-and-read", "/f", 8)
        output = OutputFollower(proc)
        # Stop Ganesha only once a read through the held handle has been answered: nfsh
        # does not retry its first mount.
        output.wait_first_line()
        g.stop()
        time.sleep(1)
        g = Ganesha(export, port=port, mount_port=mport)
        g.start()
        out, err = output.finish()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        g.stop()
    lines = parse_lines(out)
    attempts = [x for x in lines if "attempt" in x]
    summary = lines[-1]
    assert summary.get("summary") is True, (out, err)
    assert attempts[0]["ok"] and attempts[-1]["ok"], attempts
    assert all(a["bytes"] == 100_000 for a in attempts if a["ok"])
    assert len({a["fnv1a"] for a in attempts if a["ok"]}) == 1
    # at least one read spanned the outage (high latency) or failed
    assert max(a["latency"] for a in attempts) > 0.5 or summary["failed"] > 0, attempts


def test_e2e_tools_inside_netns_against_ganesha(tmp_path):
    """nfsh / fio / nfs-ls with netns=: how tests reach a Nasd(netns=ns)."""
    Ganesha = _ganesha_cls()
    from rig.netns import Netns
    export = tmp_path / "exp"
    export.mkdir()
    (export / "f").write_bytes(pattern_bytes(4096, 1))
    with Netns() as ns, Ganesha(export, netns=ns) as g:
        url = _v3_url(g)
        # not reachable from the host namespace ...
        with pytest.raises(NfshError):
            nfsh(url, "stat", "/f", env={"NFSH_TIMEOUT_MS": 3000}, timeout=60)
        # ... but from inside
        assert nfsh(url, "stat", "/f", netns=ns)["size"] == 4096
        assert nfsh(url, "verify-pattern", "/f", 4096, 1, netns=ns)["ok"]
        names = [e["name"] for e in libnfs_tools.nfs_ls(url, netns=ns)]
        assert "f" in names
        furl = f"nfs://127.0.0.1{g.export_path}?nfsport={g.port}&mountport={g.mount_port}"
        out = run_fio(["--name=w", "--rw=write", "--bs=128k", "--size=1m", "--ioengine=nfs",
                       f"--nfs_url={furl}", "--filename=fio.dat"], timeout=120, netns=ns)
        assert out["jobs"][0]["write"]["io_bytes"] == 1024 * 1024
