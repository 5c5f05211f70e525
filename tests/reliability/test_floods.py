"""Hostile clients: floods and malformed streams. In each case a well-behaved client
(NULL + GETATTR over its own connection) keeps being answered with normal latency,
nasd stays alive and its peak RSS (VmHWM) stays bounded. Figures are printed (-s) and
recorded in docs/reliability.md.

    python3 -m pytest -s tests/reliability/test_floods.py

Latency is compared with a baseline taken on the same machine at the start, with a
generous factor: p99 < 20 x baseline p99 + 50 ms in one of up to three probes.
"""
import contextlib
import os
import random
import resource
import socket
import struct
import threading
import time

import pytest

from rig.nasd import Nasd, free_port
from rig.rpc import Nfs3Client, auth_sys, build_call, decode_result, frame, nfs3_args, NFS3_OK, NFS_PROG, NFS_V3

RSS_LIMIT_KIB = 512 * 1024
LAT_FACTOR, LAT_SLACK = 20.0, 0.050
PROBE_CALLS = 300


def vm_hwm_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def probe(srv, root, calls=PROBE_CALLS, deadline=60.0):
    """NULL + GETATTR pairs on a fresh connection -> sorted per-call latencies (s)."""
    lat = []
    end = time.monotonic() + deadline
    with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=30) as c:
        for i in range(calls):
            t = time.monotonic()
            if i % 2:
                assert c.getattr(root).status == NFS3_OK
            else:
                c.call(NFS_PROG, NFS_V3, 0)
            lat.append(time.monotonic() - t)
            assert time.monotonic() < end, "probe took too long"
    return sorted(lat)


def p99(lat):
    return lat[min(len(lat) - 1, int(len(lat) * 0.99))]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    export = tmp_path_factory.mktemp("floods")
    (export / "big").write_bytes(os.urandom(1 << 20))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    with Nasd(export, args=["--no-root-squash"]) as srv:
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0)) as c:
            root = c.root(str(export))
            big = c.lookup(root, "big").fh
        base = probe(srv, root)
        srv.ctx = {"root": root, "big": big, "export": str(export), "base_p99": p99(base),
                   "figures": []}
        print(f"\nbaseline: p50={base[len(base) // 2] * 1e3:.2f} ms p99={p99(base) * 1e3:.2f} ms")
        yield srv
        print("\nflood figures:")
        for f in srv.ctx["figures"]:
            print("  " + f)


def check_served(srv, name, extra="", tries=3, flood_goes_on=lambda: True):
    """Probes while the flood goes on, up to `tries` times until one probe's p99 is within
    bounds: the p99 of 300 calls is the 4th slowest, so a burst of load from elsewhere on a
    shared machine can spoil one probe, while a server that holds clients up spoils all.
    A flood that ends by itself says through `flood_goes_on` whether a next probe would
    still meet it; one that would not is not made."""
    base = srv.ctx["base_p99"]
    for attempt in range(1, tries + 1):
        lat = probe(srv, srv.ctx["root"])
        assert srv.alive(), f"{name}: nasd died"
        hwm = vm_hwm_kib(srv.pid)
        fig = (f"{name}: probe p50={lat[len(lat) // 2] * 1e3:.2f} ms p99={p99(lat) * 1e3:.2f} ms "
               f"(baseline p99 {base * 1e3:.2f} ms, probe {attempt}), nasd VmHWM={hwm // 1024} MiB {extra}")
        srv.ctx["figures"].append(fig)
        print("\n" + fig)
        assert hwm < RSS_LIMIT_KIB, fig
        if p99(lat) < LAT_FACTOR * base + LAT_SLACK:
            return
        if not flood_goes_on():
            break
    raise AssertionError(f"{name}: every probe made ({attempt} of up to {tries}) was too slow; the last: {fig}")


def null_call(xid=1):
    return frame(build_call(xid, NFS_PROG, NFS_V3, 0))


def test_thousand_concurrent_connections(server):
    """1,000 connections: each makes one NULL call, then all stay open and idle."""
    socks = []
    try:
        for i in range(1000):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            socks.append(s)
        for i, s in enumerate(socks):
            s.sendall(null_call(i + 1))
        answered = 0
        for s in socks:
            got = s.recv(4096)
            answered += bool(got)
        assert answered == 1000
        check_served(server, "1000 idle connections", f"(answered {answered}/1000)")
    finally:
        for s in socks:
            s.close()


def test_slowloris(server):
    """Clients sending a call one byte a second; others are not held up."""
    stop = threading.Event()
    msg = null_call(7)

    def slow():
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            for b in msg:
                if stop.wait(1.0):
                    return
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    return

    ts = [threading.Thread(target=slow, daemon=True) for _ in range(20)]
    for t in ts:
        t.start()
    try:
        time.sleep(3)
        check_served(server, "20 slowloris clients (1 byte/s)")
    finally:
        stop.set()
        for t in ts:
            t.join(5)


def test_client_never_reads_replies(server):
    """Pipelined 1 MiB READs, never reading a reply: the connection's request slots and
    the write timeout bound what nasd holds for it."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent = 0
    stop = threading.Event()
    args = nfs3_args.read(server.ctx["big"], 0, 1 << 20)

    def flood():
        nonlocal sent
        s.settimeout(2)
        for i in range(5000):
            if stop.is_set():
                return
            try:
                s.sendall(frame(build_call(1000 + i, NFS_PROG, NFS_V3, 6, args, cred=auth_sys(0, 0))))
                sent += 1
            except OSError:
                return   # send buffer full (nasd stopped reading) or closed

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        time.sleep(3)
        check_served(server, "client never reading replies", f"(calls sent {sent})")
    finally:
        stop.set()
        t.join(10)
        s.close()


def open_server_connections(port: int) -> int:
    """Established TCP connections whose local end is `port` (the server's side), from
    /proc/net/tcp: a connection the server closed leaves that state at once, even while
    its kernel still sends what the socket held."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":
                count += 1
    return count


@contextlib.contextmanager
def few_slots(tmp_path, limits):
    """nasd with 8 request slots per connection and 16 in all (plus `limits`, TOML lines),
    exporting a 1 MiB file; yields the server, the export root's handle and the
    arguments of a READ of the whole file."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "big").write_bytes(os.urandom(1 << 20))
    config = tmp_path / "nasd.toml"
    config.write_text("[limits]\nmax_requests_per_connection = 8\nmax_requests_in_flight = 16\n" + limits)
    with Nasd(export, args=["--no-root-squash", "--config", config]) as srv:
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0)) as c:
            root = c.root(str(export))
            big = c.lookup(root, "big").fh
        yield srv, root, nfs3_args.read(big, 0, 1 << 20)


@pytest.mark.parametrize("portmap", [False, True], ids=["udp", "udp-and-portmap-udp"])
def test_an_idle_udp_socket_holds_no_request_slot(tmp_path, portmap):
    """With as many request slots in all as nasd has UDP sockets, calls over TCP are
    still answered, and calls over UDP too: a socket waiting for a datagram holds no
    slot (each held one while it waited, so TCP calls waited for a datagram to come)."""
    export = tmp_path / "export"
    export.mkdir()
    config = tmp_path / "nasd.toml"
    slots = 2 if portmap else 1
    config.write_text(f"[limits]\nmax_requests_per_connection = 1\nmax_requests_in_flight = {slots}\n")
    args = ["--no-root-squash", "--config", config]
    if portmap:
        args += ["--portmap", "--portmap-port", str(free_port())]
    with Nasd(export, args=args) as srv:
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=5) as c:
            root = c.root(str(export))
            for _ in range(20):
                assert c.getattr(root).ok
        with Nfs3Client("127.0.0.1", srv.port, proto="udp", cred=auth_sys(0, 0), timeout=5) as u:
            for _ in range(5):
                assert u.getattr(root).ok
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=5) as c:
            assert c.getattr(root).ok, "a TCP call after the UDP ones"


def not_reading_client(srv, read_args, n):
    """A connection that pipelines 40 READs of 1 MiB (more than its slots) and never
    reads a reply. 40 calls of ~150 bytes fit in the socket buffers: sendall cannot block."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"".join(frame(build_call(100 * n + i, NFS_PROG, NFS_V3, 6, read_args, cred=auth_sys(0, 0)))
                       for i in range(40)))
    return s


def test_connections_that_stop_reading_give_back_their_slots(tmp_path):
    """Connections that pipeline more 1 MiB READs than they have request slots and never
    read a reply hold every global slot, but only until the write timeout: nasd then
    closes them, drops their unsent replies and serves everyone else again."""
    # Two such connections fill all 16 global slots; the third waits for one.
    with few_slots(tmp_path, "write_timeout_secs = 2\n") as (srv, root, args):
        hogs = []
        try:
            for n in range(3):
                hogs.append(not_reading_client(srv, args, n))
            # Every slot holder is given up on after the write timeout (the third gets its
            # slots when the first two are closed, and is given up on one timeout later):
            # a new client is then answered.
            deadline = time.monotonic() + 30
            while True:
                try:
                    with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=2) as c:
                        assert c.getattr(root).status == NFS3_OK
                    break
                except (TimeoutError, socket.timeout):
                    assert time.monotonic() < deadline, "no request slot came free: nasd kept them for clients that stopped reading"
            # And nasd closed every connection that stopped reading.
            while open_server_connections(srv.port) > 0:
                assert time.monotonic() < deadline, \
                    f"{open_server_connections(srv.port)} connections that stopped reading are still open"
                time.sleep(0.2)
            assert srv.alive()
        finally:
            for s in hogs:
                s.close()


def closed_within(s, secs):
    """Whether nasd has closed `s` (end of stream or reset) within `secs`, reading
    whatever replies were still on their way."""
    end = time.monotonic() + secs
    try:
        while time.monotonic() < end:
            s.settimeout(max(0.01, end - time.monotonic()))
            if not s.recv(1 << 20):
                return True
        return False
    except ConnectionResetError:
        return True
    except (TimeoutError, socket.timeout):
        return False


def half_sent_requests(srv, n):
    """`n` connections that each send a record mark for 200 bytes, then 8 of them."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(struct.pack(">I", 0x80000000 | 200) + b"\0" * 8)
        socks.append(s)
    return socks


def answered_after(srv, root, behind):
    """Seconds a new client waits for a GETATTR behind connections that `behind`."""
    started = time.monotonic()
    with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=20) as c:
        assert c.getattr(root).status == NFS3_OK
    waited = time.monotonic() - started
    print(f"connections that {behind}: a new client was answered after {waited:.1f} s")
    assert waited < 10, f"a new client waited {waited:.1f} s behind connections that {behind}"
    return waited


def test_stalled_connections_are_closed_when_others_need_their_slots(tmp_path):
    """Clients that hold every global request slot without progress, in both ways a
    connection can: two that pipeline 1 MiB READs and never read a reply, then sixteen
    that each send the first bytes of a request and no more. The write timeout (30 s
    here) would close them only after 30 s; while a new client waits for a slot, nasd
    closes those stalled for stall_timeout_secs (1 s) instead, and answers it within
    seconds."""
    with few_slots(tmp_path, "write_timeout_secs = 30\nstall_timeout_secs = 1\n") as (srv, root, args):
        not_reading = [not_reading_client(srv, args, n) for n in range(2)]
        not_sending = []
        try:
            for attack, hogs in (("stopped reading", not_reading), ("stopped sending", not_sending)):
                if attack == "stopped sending":
                    hogs += half_sent_requests(srv, 16)
                time.sleep(0.5)  # every slot taken
                answered_after(srv, root, attack)
                # Because stalled connections were closed (those stalled long enough
                # when it had waited; the rest keep their slots while nobody waits).
                closed = sum(closed_within(s, 2.0) for s in hogs)
                print(f"  {closed} of {len(hogs)} such connections closed")
                assert closed >= 1, f"no connection that {attack} was closed"
            assert srv.alive()
        finally:
            for s in not_reading + not_sending:
                s.close()


def test_connections_that_trickle_requests_are_closed_when_others_need_their_slots(tmp_path):
    """Sixteen connections that hold every global request slot and send a byte of their
    request every half second. Any data used to count as progress, so they kept their
    slots for the whole write timeout (30 s here); now a connection must move 64 KiB per
    stall timeout (1 s here) while others wait, and a new client is answered within
    seconds. (Replies taken a few bytes at a time are held to the same rate: unit tests
    in server/stalls.rs, since the kernel's buffers make that hard to pace from here.)"""
    with few_slots(tmp_path, "write_timeout_secs = 30\nstall_timeout_secs = 1\n") as (srv, root, args):
        hogs = []
        stop = threading.Event()

        def trickle():
            while not stop.wait(0.5):
                for s in hogs:
                    with contextlib.suppress(OSError):
                        s.send(b"\0")

        mover = threading.Thread(target=trickle)
        try:
            hogs += half_sent_requests(srv, 16)
            mover.start()
            time.sleep(1.0)  # every slot taken, every request moving a byte at a time
            answered_after(srv, root, "trickle their requests")
            closed = sum(closed_within(s, 2.0) for s in hogs)
            print(f"  {closed} of {len(hogs)} such connections closed")
            assert closed >= 1
            assert srv.alive()
        finally:
            stop.set()
            if mover.is_alive():
                mover.join()
            for s in hogs:
                s.close()


def test_idle_connections_at_the_limit_do_not_keep_clients_out(tmp_path):
    """Connections opened and left idle, more than max_connections allows: a new
    client is still answered, because at the limit the
    connection used least recently is closed (as knfsd does), not the new one. The idle
    timeout (360 s) would otherwise keep every client out for six minutes. A connection
    that keeps calling is not the one closed."""
    export = tmp_path / "export"
    export.mkdir()
    config = tmp_path / "nasd.toml"
    config.write_text("[limits]\nmax_connections = 16\n")
    with Nasd(export, args=["--no-root-squash", "--config", config]) as srv:
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=10) as busy:
            root = busy.root(str(export))
            hogs = []
            try:
                for _ in range(20):
                    hogs.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
                    # nasd stamps activity with a coarse clock (a few ms): apart by more.
                    time.sleep(0.02)
                    assert busy.getattr(root).status == NFS3_OK  # stays the most recent
                    time.sleep(0.02)
                for attempt in range(3):
                    started = time.monotonic()
                    with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=10) as c:
                        assert c.getattr(root).status == NFS3_OK
                    waited = time.monotonic() - started
                    print(f"new client {attempt} answered after {waited:.2f} s with {len(hogs)} idle connections open")
                    assert waited < 5
                    assert busy.getattr(root).status == NFS3_OK, "the busy connection was closed"
                    time.sleep(0.02)
                closed = sum(closed_within(s, 0.2) for s in hogs)
                print(f"  {closed} of {len(hogs)} idle connections closed")
                assert closed >= len(hogs) - 15
                assert srv.alive()
            finally:
                for s in hogs:
                    s.close()


def test_a_request_half_sent_at_the_limit_is_not_closed_for_a_new_connection(tmp_path):
    """At max_connections, a new connection closes the idle connection used least
    recently. A connection whose request has begun to arrive is not idle, even if it is
    the oldest: its WRITE is completed and answered, and an idle one makes room."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "f").write_bytes(b"")
    config = tmp_path / "nasd.toml"
    config.write_text("[limits]\nmax_connections = 4\n")
    with Nasd(export, args=["--no-root-squash", "--config", config]) as srv:
        with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=10) as writer:
            root = writer.root(str(export))
            fh = writer.lookup(root, "f").fh
            data = bytes(range(256)) * 1024
            xid, msg = writer.build(NFS_PROG, NFS_V3, 7, nfs3_args.write(fh, 0, data))
            record = frame(msg)
            writer.send_raw(record[:1000])  # the WRITE has begun to arrive, and stops
            time.sleep(0.05)
            idle = []
            try:
                for _ in range(3):
                    idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
                    time.sleep(0.05)
                with Nfs3Client("127.0.0.1", srv.port, cred=auth_sys(0, 0), timeout=10) as newcomer:
                    assert newcomer.getattr(root).status == NFS3_OK
                writer.send_raw(record[1000:])
                assert decode_result(7, writer.wait_xid(xid)).status == NFS3_OK
                assert (export / "f").read_bytes() == data
                closed = [closed_within(s, 0.2) for s in idle]
                print(f"idle connections closed: {closed}")
                assert closed[0], "the oldest idle connection made room"
            finally:
                for s in idle:
                    s.close()


def test_garbage_burst(server):
    """100,000 garbage records (random bodies, valid record marks) in a burst over 4
    connections whose replies, if any, are drained. The records are made beforehand so
    the senders do not compete with the probe for the Python interpreter."""
    per = 25000
    streams = []
    for k in range(4):
        r = random.Random(k)
        recs = []
        for i in range(per):
            n = r.choice([0, 4, 8, 24, 40, 100, 300])
            body = struct.pack(">II", i, r.choice([0, 0, 1, 7])) + r.randbytes(n)
            recs.append(struct.pack(">I", 0x80000000 | len(body)) + body)
        streams.append(b"".join(recs))
    sent = [0] * 4

    def burst(k):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            drain_stop = threading.Event()

            def drain():
                s.settimeout(0.5)
                while not drain_stop.is_set():
                    try:
                        if not s.recv(1 << 16):
                            return
                    except socket.timeout:
                        continue
                    except OSError:
                        return

            d = threading.Thread(target=drain, daemon=True)
            d.start()
            s.sendall(streams[k])
            sent[k] = per
            time.sleep(1)
            drain_stop.set()
            d.join(5)

    ts = [threading.Thread(target=burst, args=(k,), daemon=True) for k in range(4)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    try:
        check_served(server, "100,000 garbage records", flood_goes_on=lambda: any(t.is_alive() for t in ts))
    finally:
        for t in ts:
            t.join(120)
    secs = time.monotonic() - t0
    server.ctx["figures"].append(f"garbage burst: {sum(sent)} records "
                                 f"({sum(map(len, streams)) >> 20} MiB) sent in {secs:.1f} s")
    assert sum(sent) == 4 * per


def closed_or_answered(port, data, timeout=10.0, keep_open=False):
    """Sends `data`; -> 'closed' | 'answered' | 'open' (nothing within timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if not keep_open:
            s.shutdown(socket.SHUT_WR)
        try:
            got = s.recv(65536)
        except socket.timeout:
            return "open"
        except ConnectionResetError:
            return "closed"
        return "answered" if got else "closed"


def test_malformed_streams(server):
    port = server.port
    call = build_call(9, NFS_PROG, NFS_V3, 0)
    cases = {
        # record mark announcing 2 GiB: refused before any allocation
        "oversized record mark": (struct.pack(">I", 0xFFFFFFFF) + b"x" * 100, {"closed"}),
        "2 MiB record": (struct.pack(">I", 0x80000000 | (2 << 20)) + b"\0" * 4096, {"closed"}),
        # 2,000 empty non-last fragments: more than the fragment limit
        "looping fragments": (struct.pack(">I", 0) * 2000, {"closed"}),
        # credential announcing 4 GiB of body
        "huge credential length": (frame(call[:28] + struct.pack(">I", 0xFFFFFFF0) + b"\0" * 64), {"answered", "closed"}),
        # opaque file handle announcing 4 GiB
        "huge opaque in GETATTR": (frame(build_call(10, NFS_PROG, NFS_V3, 1, struct.pack(">I", 0xFFFFFFFF))), {"answered"}),
        "huge WRITE length": (frame(build_call(11, NFS_PROG, NFS_V3, 7, nfs3_args.fh(server.ctx["big"]) + struct.pack(">QIII", 0, 0xFFFFFFFF, 2, 0xFFFFFFFF))), {"answered"}),
        "truncated record then EOF": (struct.pack(">I", 0x80000000 | 1000) + b"\0" * 10, {"closed"}),
        "truncated mark then EOF": (b"\x80\0", {"closed"}),
        "23 groups in AUTH_SYS": (frame(build_call(12, NFS_PROG, NFS_V3, 0, cred=auth_sys(0, 0, gids=list(range(23))))), {"answered"}),
    }
    results = {}
    for name, (data, ok) in cases.items():
        results[name] = closed_or_answered(port, data)
        assert results[name] in ok, (name, results[name])
        assert server.alive(), f"nasd died on {name}"
    # A truncated record on a connection left open must not hold anyone else up.
    held = socket.create_connection(("127.0.0.1", port))
    held.sendall(struct.pack(">I", 0x80000000 | 1000) + b"\0" * 10)
    try:
        check_served(server, "malformed streams", str(results))
    finally:
        held.close()
