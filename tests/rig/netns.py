"""Throw-away Linux network namespaces for the kernel-client rig.

A ``Netns`` holds only a loopback interface, so anything started inside it
(the NFS server under test, the qemu guest whose user-mode network maps
10.0.2.2 to the namespace's 127.0.0.1) can reach nothing but itself.

    with Netns() as ns:
        srv = ns.popen(["some-server", "--listen", "127.0.0.1:2049"])
        ns.wait_tcp(2049)
        ns.run(["ss", "-tln"])

Requires root (``ip netns add``).

A Python thread can also be moved into the namespace (``Netns.call(fn)``, or
``enter()`` at the start of a thread you own): sockets it opens there reach
the namespace's 127.0.0.1, e.g. a port qemu forwards into a guest.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import subprocess
import threading
import time

__all__ = ["Netns", "NetnsError", "join"]


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


# Probe run inside the namespace; exit 0 once a TCP connect succeeds.
_PROBE = (
    "import socket,sys,time\n"
    "h,p,t=sys.argv[1],int(sys.argv[2]),float(sys.argv[3])\n"
    "end=time.monotonic()+t\n"
    "while True:\n"
    "    try:\n"
    "        socket.create_connection((h,p),timeout=1).close(); sys.exit(0)\n"
    "    except OSError:\n"
    "        if time.monotonic()>end: sys.exit(1)\n"
    "        time.sleep(0.1)\n"
)


class Netns:
    """A fresh network namespace ``nasd-<random>`` with only ``lo`` up.

    Use as a context manager (or call ``close()``); the namespace is deleted
    on exit, also when the body raised.  Processes started with ``popen`` are
    not killed by ``close()``: their owners stop them by PID first (a process
    left inside keeps the namespace alive after ``ip netns del`` but it is no
    longer reachable by name).
    """

    def __init__(self, name: str | None = None):
        self.name = name or f"nasd-{secrets.token_hex(4)}"
        self._open = False
        _ip("netns", "add", self.name)
        self._open = True
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
            addrs = _ip("-n", self.name, "-4", "addr", "show", "dev", "lo").stdout
            if "127.0.0.1/8" not in addrs:
                _ip("-n", self.name, "addr", "add", "127.0.0.1/8", "dev", "lo")
        except BaseException:
            self.close()
            raise

    # -- context manager -------------------------------------------------
    def __enter__(self) -> "Netns":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Netns({self.name!r})"

    # -- running things inside -------------------------------------------
    def argv(self, cmd: list[str]) -> list[str]:
        """The argv that runs ``cmd`` inside the namespace (exec, same PID)."""
        return ["ip", "netns", "exec", self.name, *[os.fspath(c) for c in cmd]]

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.argv(cmd), **kw)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.argv(cmd), **kw)

    def wait_tcp(self, port: int, host: str = "127.0.0.1", timeout: float = 30,
                 proc: subprocess.Popen | None = None) -> None:
        """Wait until ``host:port`` accepts TCP connections inside the namespace.

        If ``proc`` is given and exits meanwhile, fail at once.
        """
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            step = max(0.5, min(2.0, left))
            p = self.run(["python3", "-c", _PROBE, host, str(port), str(step)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if p.returncode == 0:
                return
            if p.returncode != 1:
                raise NetnsError(f"probe in {self.name} failed: {p.stderr.strip()}")
            if proc is not None and proc.poll() is not None:
                raise NetnsError(f"process {proc.pid} exited with {proc.returncode} "
                                 f"before {host}:{port} opened in {self.name}")
            if time.monotonic() >= end:
                raise TimeoutError(f"{host}:{port} in netns {self.name} not open "
                                   f"after {timeout}s")

    # -- threads of this process inside ----------------------------------
    def enter(self) -> None:
        """Move the *calling thread* into the namespace (setns(2) acts on one
        thread): sockets it creates afterwards belong to the namespace.  Call
        it only at the start of a thread you own, never in the main thread."""
        if threading.current_thread() is threading.main_thread():
            raise NetnsError("enter() would move the main thread; use call() or a thread")
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, 0x40000000) != 0:      # CLONE_NEWNET
                err = ctypes.get_errno()
                raise NetnsError(f"setns({self.name}) failed: {os.strerror(err)}")
        finally:
            os.close(fd)

    def call(self, fn, *args, timeout: float | None = None, **kw):
        """Run ``fn(*args, **kw)`` in a new thread inside the namespace and
        return its result (its exception is re-raised here)."""
        out: dict = {}

        def body():
            try:
                self.enter()
                out["result"] = fn(*args, **kw)
            except BaseException as e:       # handed to the caller
                out["error"] = e

        t = threading.Thread(target=body, daemon=True, name=f"netns-{self.name}")
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {self.name} still "
                               f"running after {timeout}s")
        if "error" in out:
            raise out["error"]
        return out.get("result")

    # -- teardown --------------------------------------------------------
    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        for _ in range(10):
            p = _ip("netns", "del", self.name, check=False)
            if p.returncode == 0 or not os.path.exists(f"/run/netns/{self.name}"):
                return
            time.sleep(0.2)
        raise NetnsError(f"could not delete netns {self.name}: {p.stderr.strip()}")


def join(server_ns: Netns, client_ns: Netns) -> tuple[str, str]:
    """A network of two: a veth pair, 10.99.0.1/24 in `server_ns`, 10.99.0.2 in `client_ns`.
    Returns the names of the pair's ends: (in `server_ns`, in `client_ns`)."""
    server_if, client_if = f"nv{server_ns.name[-8:]}", f"nv{client_ns.name[-8:]}"
    for argv in (
        ["-n", server_ns.name, "link", "add", server_if, "type", "veth", "peer", "name", client_if, "netns", client_ns.name],
        ["-n", server_ns.name, "addr", "add", "10.99.0.1/24", "brd", "+", "dev", server_if],
        ["-n", client_ns.name, "addr", "add", "10.99.0.2/24", "brd", "+", "dev", client_if],
        ["-n", server_ns.name, "link", "set", server_if, "up"],
        ["-n", client_ns.name, "link", "set", client_if, "up"],
    ):
        _ip(*argv)
    return server_if, client_if
