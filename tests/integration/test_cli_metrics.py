"""Command line behaviour and the Prometheus metrics endpoint."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import Nasd, default_binary, free_port  # noqa: E402
from rig.netns import Netns, join  # noqa: E402
from rig import rpc  # noqa: E402
from rig.rpc import Nfs3Client, nfs3_args, NFS_PROG  # noqa: E402
from integration._common import ROOT, make_export, write_exports  # noqa: E402


def run_nasd(*args, timeout=15):
    """Run nasd to completion (for the failure cases: it must exit by itself)."""
    return subprocess.run([str(default_binary()), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------ CLI

def test_help_exits_0_and_documents_options():
    for argv in (["serve", "--help"], ["--help"]):
        p = run_nasd(*argv)
        assert p.returncode == 0, p.stderr
        assert "serve" in p.stdout
    p = run_nasd("serve", "--help")
    for opt in ("--exports", "--listen", "--portmap", "--state-dir", "--metrics"):
        assert opt in p.stdout, f"{opt} missing from serve --help"


def test_missing_dir_argument_exits_2(tmp_path):
    p = run_nasd("serve", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", tmp_path / "s")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.strip(), "a message is expected"
    assert "exports" in p.stderr.lower() or "dir" in p.stderr.lower()


def test_nonexistent_dir_exits_2_naming_it(tmp_path):
    missing = tmp_path / "no-such-dir"
    p = run_nasd("serve", missing, "--listen", f"127.0.0.1:{free_port()}", "--state-dir", tmp_path / "s")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert str(missing) in p.stderr


def test_a_second_server_on_one_state_directory_is_refused(tmp_path):
    """Two servers on one state directory would overwrite each other's duplicate
    request journal (and two first starts could install different handle keys): the
    second exits 2 naming the directory, and starts once the first has stopped."""
    export = make_export(tmp_path)
    state = tmp_path / "state"
    with Nasd(export, state_dir=state) as first:
        p = run_nasd("serve", export, "--listen", f"127.0.0.1:{free_port()}", "--state-dir", state)
        assert p.returncode == 2, (p.returncode, p.stderr)
        assert "in use by another nasd" in p.stderr and str(state) in p.stderr, p.stderr
        assert first.alive()
        with Nfs3Client(first.host, first.port, cred=ROOT) as c:
            assert c.getattr(c.root(str(export))).ok, "the first server still serves"
    with Nasd(export, state_dir=state) as again:
        with Nfs3Client(again.host, again.port, cred=ROOT) as c:
            assert c.getattr(c.root(str(export))).ok


@pytest.mark.parametrize("bad", [
    "{d} 127.0.0.1(rw,no_such_option)",
    "{d} 127.0.0.1(rw,insecure",
    "relative/path 127.0.0.1(rw)",
    "{d} 127.0.0.1(anonuid=notanumber)",
], ids=["unknown_option", "unbalanced_paren", "relative_path", "bad_anonuid"])
def test_malformed_exports_line_reports_file_and_line(tmp_path, bad):
    export = make_export(tmp_path)
    ex = write_exports(tmp_path, ["# a comment", f"{export} 127.0.0.1(rw,insecure)", bad.format(d=export)])
    p = run_nasd("serve", "--exports", ex, "--listen", f"127.0.0.1:{free_port()}",
                 "--state-dir", tmp_path / "s")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"{ex}:3" in p.stderr, p.stderr


def _congestion_control_by_peer(port: int, ns: Netns | None = None) -> dict[str, str]:
    """Peer address -> congestion control of each established TCP socket on local port
    `port` (the server's ends), in `ns` or this test's own namespace, from `ss`: a
    socket's line, then its info line, which starts with the algorithm."""
    argv = ["ss", "-Htin", "state", "established", f"( sport = :{port} )"]
    p = (ns.run if ns else subprocess.run)(argv, capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stderr
    algorithms = set(Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split())
    found, peer = {}, None
    for line in p.stdout.splitlines():
        if line and not line[0].isspace():
            peer = line.split()[3].rsplit(":", 1)[0]
        elif peer is not None:
            found[peer] = next(tok for tok in line.split() if tok in algorithms)
            peer = None
    return found


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss not installed (Debian package iproute2)")
def test_tcp_congestion_applies_to_nfs_connections_and_the_default_is_the_servers_own(tmp_path):
    system = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    wanted = "cubic" if system == "reno" else "reno"    # reno is in every kernel
    export = make_export(tmp_path)
    # Unset, a pacing default gives way to cubic for clients on this host (the next test).
    default = "cubic" if system.startswith("bbr") else system
    with Nasd(export, args=["--tcp-congestion", wanted]) as tuned, Nasd(export, state_dir=tmp_path / "s2") as plain:
        for server, expected in ((tuned, wanted), (plain, default)):
            with Nfs3Client("127.0.0.1", server.port) as c:
                c.call(NFS_PROG, 3, 0, b"")        # NULL: the connection is accepted and served
                assert list(_congestion_control_by_peer(server.port).values()) == [expected]
    assert f"algorithm={wanted}" in re.sub(r"\x1b\[[0-9;]*m", "", tuned.log())


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(shutil.which("ss") is None, reason="ss not installed (Debian package iproute2)")
@pytest.mark.skipif("bbr" not in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split(),
                    reason="this kernel has no bbr (module tcp_bbr), the pacing default the rule is for")
def test_where_the_default_paces_only_clients_on_other_hosts_are_paced(tmp_path):
    """With bbr as the default (set in the test's own namespaces), a connection from this
    host (loopback, or the server's own address) gets cubic, as the listener has it; one
    from another host, over a veth pair, is switched back to bbr as it is accepted; one
    whose route names reno (`congctl`) keeps reno."""
    export = make_export(tmp_path)
    with Netns() as server_ns, Netns() as client_ns:
        server_if, client_if = join(server_ns, client_ns)
        for argv in (["-n", client_ns.name, "addr", "add", "10.99.0.3/24", "dev", client_if],
                     ["-n", server_ns.name, "route", "add", "10.99.0.3/32", "dev", server_if, "congctl", "reno"]):
            p = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
            assert p.returncode == 0, p.stderr
        for ns in (server_ns, client_ns):
            p = ns.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=bbr"], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
        with Nasd(export, netns=server_ns, host="127.0.0.1", listen="0.0.0.0") as n:
            def connect(host: str, src: str) -> Nfs3Client:
                c = Nfs3Client(host, n.port, src_addr=src)
                c.call(NFS_PROG, 3, 0, b"")        # NULL: accepted and served
                return c
            clients = [client_ns.call(connect, "10.99.0.1", "10.99.0.2", timeout=30),
                       client_ns.call(connect, "10.99.0.1", "10.99.0.3", timeout=30),
                       server_ns.call(connect, "127.0.0.1", "127.0.0.1", timeout=30),
                       server_ns.call(connect, "10.99.0.1", "10.99.0.1", timeout=30)]
            try:
                found = _congestion_control_by_peer(n.port, server_ns)
            finally:
                for c in clients:
                    c.close()
        log = re.sub(r"\x1b\[[0-9;]*m", "", n.log())
    assert found == {"10.99.0.2": "bbr", "10.99.0.3": "reno", "127.0.0.1": "cubic", "10.99.0.1": "cubic"}, found
    assert "this_host=cubic other_hosts=bbr" in log, log


def test_an_unknown_tcp_congestion_exits_2_naming_it(tmp_path):
    p = run_nasd("serve", make_export(tmp_path), "--listen", f"127.0.0.1:{free_port()}",
                 "--state-dir", tmp_path / "s", "--tcp-congestion", "nosuchalgo")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert '"nosuchalgo"' in p.stderr and "this kernel has" in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_port_in_use_exits_2(tmp_path, kind):
    export = make_export(tmp_path)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    if kind == "tcp":
        s.listen(1)
    port = s.getsockname()[1]
    try:
        p = run_nasd("serve", export, "--listen", f"127.0.0.1:{port}", "--state-dir", tmp_path / "s")
    finally:
        s.close()
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert str(port) in p.stderr or "in use" in p.stderr.lower()


# ------------------------------------------------------------ metrics

def _metrics(port: int, timeout=10.0) -> str:
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert r.status == 200
                return r.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def _value(text: str, name: str, labels: str = "", missing_is_zero: bool = False) -> float:
    """The value of one series; a missing one fails the test (a renamed metric or a changed
    label would otherwise read as 0), unless it is a count not begun yet."""
    series = name + (("{" + labels + "}") if labels else "")
    m = re.search(re.escape(series) + r" ([0-9.eE+-]+)$", text, re.M)
    if m is None:
        assert missing_is_zero, f"{series} missing from the metrics"
        return 0.0
    return float(m.group(1))


def test_busy_poll_metrics_count_every_wait_of_a_tight_loop_client(tmp_path):
    """Each wait for a tight-loop client's next request either spins or says why not;
    spins that saw the request are counted, and so is the time spent spinning."""
    export = make_export(tmp_path)
    mport = free_port()
    calls = 200
    # The longest window, 1 ms: a Python client's pause between calls is well inside it.
    with Nasd(export, args=["--no-root-squash", "--metrics", f"127.0.0.1:{mport}", "--busy-poll-us", "1000"]) as n:
        with Nfs3Client(n.host, n.port, cred=ROOT) as c:
            root = c.root(n.export_dir)
            for _ in range(calls):
                assert c.getattr(root).ok
        text = _metrics(mport)
    spins = _value(text, "nasd_busy_poll_spins_total")
    caught = _value(text, "nasd_busy_poll_caught_total")
    declined = {why: _value(text, "nasd_busy_poll_declined_total", f'reason="{why}"')
                for why in ("client_not_in_tight_loop", "no_spare_cpu", "pollers_busy")}
    assert spins + sum(declined.values()) >= calls, (spins, declined)
    # Only the first wait of the connection has no pause to judge it by (a machine so
    # loaded that every CPU is wanted is the other reason not to spin).
    assert declined["client_not_in_tight_loop"] < calls // 2, declined
    assert caught <= spins
    if declined["no_spare_cpu"] < calls // 2:
        assert caught >= spins // 2 > 0, (spins, caught, declined)
        assert _value(text, "nasd_busy_poll_seconds_total") > 0


def test_metrics_count_calls_and_drc_hits(tmp_path):
    export = make_export(tmp_path)
    mport = free_port()
    with Nasd(export, args=["--no-root-squash", "--metrics", f"127.0.0.1:{mport}"]) as n:
        text = _metrics(mport)
        assert "nasd_rpc_calls_total" in text and "nasd_drc_hits_total" in text
        getattr_label = 'program="nfs3",procedure="GETATTR"'
        g0 = _value(text, "nasd_rpc_calls_total", getattr_label, missing_is_zero=True)
        h0 = _value(text, "nasd_drc_hits_total")
        assert h0 == 0
        with Nfs3Client(n.host, n.port, cred=ROOT) as c:
            root = c.root(n.export_dir)
            for _ in range(5):
                assert c.getattr(root).ok
            text = _metrics(mport)
            assert _value(text, "nasd_rpc_calls_total", getattr_label) == g0 + 5
            assert _value(text, "nasd_drc_hits_total") == 0, "no retransmits yet"
            xid, msg = c.build(NFS_PROG, 3, rpc.NFSPROC3_CREATE, nfs3_args.create(root, "m", "guarded"))
            c.send_msg(msg)
            first = c.wait_xid(xid)
            c.send_msg(msg)
            again = c.wait_xid(xid)
            assert again.raw == first.raw
        text = _metrics(mport)
        assert _value(text, "nasd_drc_hits_total") >= 1
        assert _value(text, "nasd_rpc_calls_total", 'program="nfs3",procedure="CREATE"') >= 1
