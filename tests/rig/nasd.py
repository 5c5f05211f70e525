"""Launch the nasd server under test.

    from rig.nasd import Nasd
    with Nasd(export_dir) as srv:                  # free port on 127.0.0.1
        url = srv.url()                            # export root, for nfsh/fio
        srv.url("/a/b")                            # a file below the export
        srv.restart()                              # same port, same --state-dir
        srv.kill(signal.SIGKILL); srv.start()      # crash + start again
        print(srv.log())                           # stderr of all runs

    with Netns() as ns, Nasd(export_dir, netns=ns) as srv:   # port 2049 in ns
        ...

Command line (contract with src/):
    nasd serve [EXPORT_DIR] --listen 127.0.0.1:PORT --state-dir STATE [ARGS...]
    nasd serve --exports FILE --listen ... --state-dir ... [ARGS...]
where ARGS are e.g. --portmap --no-root-squash --ro --async --metrics ADDR:PORT.
NFS (100003 v3) and MOUNT (100005 v3) are both served on PORT.

Binary: ``binary=`` argument, else ``$NASD_BINARY``, else
``<repo>/target/release/nasd``.
"""

from __future__ import annotations

import atexit
import os
import random
import signal as _signal
import socket
import subprocess
import sys
import tempfile
import shutil
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO / "target" / "release" / "nasd"

__all__ = ["Nasd", "NasdError", "free_port", "host_port", "default_binary"]


class NasdError(RuntimeError):
    pass


# Ports handed out by this process, not handed out again: two picks in a row (a server's
# NFS and MOUNT ports) must differ even though nothing listens on the first yet.
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP and UDP port free on ``host`` (IPv4 or IPv6) a moment ago.

    Taken below the kernel's ephemeral range, so no outgoing connection (a client of
    another test, a fio job) can take it between this pick and the server's bind; the
    kernel's own pick (bind to port 0) would come from that range.
    """
    low, _high = _ephemeral_range()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    with _handing_out:
        for port in candidates:
            if port in _handed_out:
                continue
            try:
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    with socket.socket(family, kind) as s:
                        s.bind((host, port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    raise NasdError(f"no free port on {host} below the ephemeral range ({low})")


def host_port(host: str, port: int) -> str:
    """``host:port`` as nasd's --listen takes it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def default_binary() -> Path:
    return Path(os.environ.get("NASD_BINARY") or DEFAULT_BINARY)


def _tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


_runtime_root: str | None = None


def runtime_root() -> str | None:
    """A directory on a memory file system for the live duplicate request journals of
    every server of this test run (each names its file by its state dir), removed at
    exit; None where /dev/shm is not a tmpfs (nasd then picks its own)."""
    global _runtime_root
    if _runtime_root is None:
        try:
            with open("/proc/self/mounts") as f:
                shm = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f)
        except OSError:
            shm = False
        if not shm:
            return None
        _runtime_root = tempfile.mkdtemp(prefix="nasd-rig-run-", dir="/dev/shm")
        atexit.register(shutil.rmtree, _runtime_root, True)
    return _runtime_root


class Nasd:
    """A nasd server process (context manager).

    ``host`` is the address clients call (IPv4 or IPv6) and, unless ``listen`` names
    another, the one nasd listens on.

    Attributes: ``port``, ``host``, ``listen``, ``export_dir`` (absolute, or None with
    ``exports_file``), ``state_dir`` (kept across restart(); a temp dir
    removed at exit unless passed in), ``proc``, ``pid``, ``returncode``
    (of the last run that ended), ``argv`` (of the current/last run).
    """

    def __init__(self, export_dir=None, args=(), netns=None, port=None,
                 binary=None, exports_file=None, state_dir=None, env=None,
                 host="127.0.0.1", start_timeout=30.0, stop_timeout=10.0,
                 wait_ready=True, listen=None):
        if (export_dir is None) == (exports_file is None):
            raise ValueError("give exactly one of export_dir or exports_file")
        self.export_dir = os.path.abspath(export_dir) if export_dir is not None else None
        self.exports_file = os.path.abspath(exports_file) if exports_file is not None else None
        self.args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        self.netns = netns
        self.host = host
        # The address nasd listens on, when clients reach it by another (`::` for both
        # IPv4 and IPv6 clients of one socket).
        self.listen = listen or host
        self._auto_port = port is None and netns is None
        self.port = port if port is not None else (2049 if netns is not None else free_port(host))
        self.binary = Path(binary) if binary else default_binary()
        self._own_state = state_dir is None
        self.state_dir = state_dir
        self.env = env
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._wait_ready = wait_ready
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.argv: list[str] = []
        self.workdir: str | None = None   # logs live here
        self._runs = 0

    # ------------------------------------------------------------ helpers
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [str(self.binary), "serve"]
        if self.export_dir is not None:
            cmd.append(self.export_dir)
        else:
            cmd += ["--exports", self.exports_file]
        cmd += ["--listen", host_port(self.listen, self.port), "--state-dir", str(self.state_dir)]
        if (run := runtime_root()) is not None and "--runtime-dir" not in self.args:
            cmd += ["--runtime-dir", run]
        return cmd + list(self.args)

    def url(self, path: str = "", version: int = 3, export: str | None = None) -> str:
        """nfs:// URL for libnfs tools / nfsh / fio.

        ``path`` is appended to the export path (``""`` = the export itself,
        which is what nfsh and fio want).  ``export`` overrides the export
        path (needed with ``exports_file``)."""
        exp = export if export is not None else self.export_dir
        if exp is None:
            raise ValueError("url(): pass export= when using exports_file")
        exp = "/" + exp.strip("/") if exp.strip("/") else ""
        if path and not path.startswith("/"):
            path = "/" + path
        if not exp and not path:
            path = "/"
        if version == 4:
            return f"nfs://{self.host}{exp}{path}?nfsport={self.port}&version=4"
        return (f"nfs://{self.host}{exp}{path}"
                f"?nfsport={self.port}&mountport={self.port}&version={version}")

    def mount_options(self) -> str:
        """Kernel mount -o options for NFSv3 against this server (no portmapper)."""
        return (f"vers=3,proto=tcp,port={self.port},mountport={self.port},"
                f"mountproto=tcp,nolock")

    def log(self) -> str:
        """Captured stderr of every run so far (runs separated by a marker)."""
        if not self.workdir:
            return getattr(self, "_final_log", "")
        p = Path(self.workdir) / "stderr.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stdout(self) -> str:
        if not self.workdir:
            return ""
        p = Path(self.workdir) / "stdout.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise NasdError (with the log tail) if the server has died."""
        if not self.alive():
            rc = self.proc.returncode if self.proc else self.returncode
            raise NasdError(f"nasd is not running (rc={rc})\n--- log tail ---\n{self.log()[-4000:]}")

    # ---------------------------------------------------------- lifecycle
    def start(self) -> "Nasd":
        if self.alive():
            raise NasdError("nasd already running")
        if not self.binary.exists():
            raise NasdError(f"nasd binary not found: {self.binary} "
                            "(cargo build --release, or set NASD_BINARY)")
        if self.workdir is None:
            self.workdir = tempfile.mkdtemp(prefix="nasd-rig-")
        if self.state_dir is None:
            self.state_dir = os.path.join(self.workdir, "state")
        os.makedirs(self.state_dir, exist_ok=True)
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            try:
                self._spawn()
                if self._wait_ready:
                    self.wait_ready()
                return self
            except NasdError as e:
                self._reap()
                in_use = "in use" in self._last_run_log().lower()
                if attempt + 1 < attempts and in_use:
                    self.port = free_port(self.host)   # lost the port race; retry
                    continue
                raise e
        return self

    def _last_run_log(self) -> str:
        text = self.log()
        i = text.rfind("==== nasd run ")
        return text[i:] if i >= 0 else text

    def _spawn(self) -> None:
        self._runs += 1
        self.argv = self.command()
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        if self.env:
            env.update({k: str(v) for k, v in self.env.items()})
        wd = Path(self.workdir)
        with open(wd / "stderr.log", "ab") as err, open(wd / "stdout.log", "ab") as out:
            err.write(f"==== nasd run {self._runs}: {' '.join(self.argv)}\n".encode())
            err.flush()
            argv = self.netns.argv(self.argv) if self.netns is not None else self.argv
            # Own session: a Ctrl-C aimed at pytest does not hit the server
            # first, and we always signal by PID (ip netns exec execs, so the
            # PID is the server's).
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, env=env, start_new_session=True)
        self.returncode = None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the listen port accepts TCP (fails fast if nasd exits)."""
        timeout = self.start_timeout if timeout is None else timeout
        assert self.proc is not None
        if self.netns is not None:
            try:
                self.netns.wait_tcp(self.port, host=self.host, timeout=timeout, proc=self.proc)
            except Exception as e:
                raise NasdError(f"nasd did not start in netns: {e}\n--- log tail ---\n"
                                f"{self._last_run_log()[-4000:]}") from e
            return
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise NasdError(f"nasd exited with rc={self.proc.returncode} before "
                                f"{self.host}:{self.port} opened\n--- log tail ---\n"
                                f"{self._last_run_log()[-4000:]}")
            if _tcp_open(self.host, self.port):
                return
            if time.monotonic() > end:
                raise NasdError(f"nasd: {self.host}:{self.port} not open after {timeout}s"
                                f"\n--- log tail ---\n{self._last_run_log()[-4000:]}")
            time.sleep(0.05)

    def _reap(self) -> None:
        """Make sure the current process is gone (SIGKILL by PID)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.returncode = self.proc.wait()
        self.proc = None

    def kill(self, sig=_signal.SIGKILL, wait: bool | None = None) -> int | None:
        """Send ``sig`` to the server by PID.

        For terminating signals (KILL/TERM/INT/QUIT/ABRT) waits for exit
        (``stop_timeout``, then SIGKILL) and returns the exit status
        (negative = killed by signal); for others (STOP/CONT/HUP...) returns
        None right away unless ``wait=True``."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        if wait is None:
            wait = sig in (_signal.SIGKILL, _signal.SIGTERM, _signal.SIGINT,
                           _signal.SIGQUIT, _signal.SIGABRT)
        if not wait:
            return None
        try:
            rc = self.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            try:  # in case it was SIGSTOPped
                os.kill(self.proc.pid, _signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                os.kill(self.proc.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = self.proc.wait()
        self.returncode = rc
        self.proc = None
        return rc

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait (``stop_timeout`` s), then SIGKILL. Returns exit status."""
        if self.proc is None:
            return self.returncode
        old = self.stop_timeout
        if timeout is not None:
            self.stop_timeout = timeout
        try:
            if self.proc.poll() is None:
                # a SIGSTOPped server would never see SIGTERM
                try:
                    os.kill(self.proc.pid, _signal.SIGCONT)
                except ProcessLookupError:
                    pass
            return self.kill(_signal.SIGTERM, wait=True)
        finally:
            self.stop_timeout = old

    def restart(self, sig=_signal.SIGTERM, args=None) -> "Nasd":
        """Stop (``sig``: SIGTERM = graceful, SIGKILL = crash) and start
        again on the same port with the same state dir.  ``args`` replaces
        the extra arguments if given."""
        if sig == _signal.SIGTERM:
            self.stop()
        else:
            self.kill(sig, wait=True)
        if args is not None:
            self.args = [str(a) for a in args]
        return self.start()

    def close(self) -> None:
        """Stop and remove temp dirs (the log stays readable via log())."""
        try:
            self.stop()
        finally:
            if self.workdir:
                self._final_log = self.log()
                if os.environ.get("NASD_KEEP_RIG_DIRS"):
                    print(f"[rig.nasd] kept {self.workdir}", file=sys.stderr)
                else:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None

    def __enter__(self) -> "Nasd":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.workdir:
            # shown by pytest with the failure
            print(f"--- nasd log (tail) ---\n{self.log()[-4000:]}", file=sys.stderr)
        self.close()

    def __del__(self):
        # last resort: never leave a server behind
        try:
            if self.proc is not None and self.proc.poll() is None:
                os.kill(self.proc.pid, _signal.SIGKILL)
                self.proc.wait()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<Nasd pid={self.pid} {self.host}:{self.port} export={self.export_dir or self.exports_file}>"
