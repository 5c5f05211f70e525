"""nfsh: a small libnfs client (tests/rig/libnfs_helper/nfsh.c) and its Python wrapper.

    from rig.nfsh import nfsh, nfsh_lines, nfsh_binary, NfshError, pattern_bytes
    url = srv.url()                         # nfs://127.0.0.1/EXPORT?nfsport=P&mountport=P&version=3
    nfsh(url, "create-loop", "/d", 1000)    # -> {"ok": True, "ops": 1000, "seconds": ...}
    nfsh(url, "stat", "/d/f00000000")["size"]
    for line in nfsh_lines(url, "hold-and-read", "/f", 10): ...

The binary is compiled with ``cc`` into the test cache dir
(``$NASD_TEST_CACHE`` or ``<repo>/target/test-cache``) as ``nfsh-<hash>``; the
hash covers the C source, the compiler flags and the libnfs version, so an
edit of nfsh.c rebuilds automatically.

Commands (all paths relative to the export root; see nfsh.c for details):
  stat PATH, lstat PATH, statvfs PATH,
  create-loop DIR N, stat-loop DIR N, remove-loop DIR N [PREFIX]  (DIR/f00000000 ...),
  rename-loop DIR N [FROM TO]  (DIR/f00000000 -> DIR/r00000000 ...),
  readdir DIR [--names] [--times N]  (exit 3 when names are duplicated; --times
      lists N times, each must find as many entries: "count" is per listing),
  mkdir-tree DIR DIRS FILES_PER_DIR  (DIR/d00000/f00000000 ...),
  put-tree LOCALDIR DIR, copy-tree SRC DST, remove-tree DIR  ("untar", "cp -r",
      "rm -rf": {"ops": files+dirs+links, "files", "dirs", "links", "bytes", "seconds"}),
  hold-and-read PATH SECONDS  (one JSON line per 0.5 s attempt + a summary),
  write-pattern PATH SIZE SEED, verify-pattern PATH SIZE SEED  (exit 3 on mismatch),
  cat PATH, mkdir, rmdir, unlink, readlink PATH, rename/link OLD NEW,
  symlink TARGET PATH, chmod PATH OCTAL, truncate PATH SIZE.

Prebuild: ``python3 -m rig.nfsh`` from the ``tests`` dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

from rig.fio import ensure_build_packages, file_lock, get_cache_dir

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "libnfs_helper" / "nfsh.c"
HEADER = HERE / "libnfs_helper" / "exerciser.h"   # included by both
GUEST_EXERCISER_SOURCE = HERE / "libnfs_helper" / "guest-exerciser.c"
CFLAGS = ["-O2", "-g", "-Wall", "-Wextra", "-std=gnu11"]

__all__ = ["nfsh_binary", "guest_exerciser_binary", "nsx_tree_problems", "exerciser_lines", "nfsh", "nfsh_lines", "run_nfsh", "NfshError",
           "pattern_bytes", "EXIT_CHECK_FAILED"]

EXIT_CHECK_FAILED = 3  # verify-pattern mismatch / readdir duplicates


class NfshError(RuntimeError):
    """nfsh exited non-zero.

    ``errno`` is the NFS/POSIX errno when nfsh reported one (e.g. 2 for
    ENOENT, 13 for EACCES, 30 for EROFS), ``result`` the last JSON object
    printed (if any), ``returncode``, ``stdout``, ``stderr``."""

    def __init__(self, msg, returncode, stdout, stderr, result=None):
        super().__init__(msg)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.result = result or {}
        self.errno = self.result.get("errno")


def _pkgconfig_libnfs():
    for attempt in range(2):
        try:
            out = subprocess.run(["pkg-config", "--cflags", "--libs", "libnfs"],
                                 capture_output=True, text=True, check=True).stdout
            return shlex.split(out)
        except (OSError, subprocess.CalledProcessError):
            if attempt == 0 and os.geteuid() == 0:
                ensure_build_packages()  # apt-get install libnfs-dev pkg-config gcc ...
                continue
            raise RuntimeError("pkg-config libnfs failed: apt-get install libnfs-dev pkg-config")


def _libnfs_version() -> str:
    try:
        return subprocess.run(["pkg-config", "--modversion", "libnfs"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def _cached_build(name: str, source: Path, flags: list[str], key: bytes, cache_dir=None) -> str:
    """Compiles ``source`` (which includes exerciser.h) with ``flags`` into the cache dir
    as ``name-<hash>``, once: the hash covers both sources, the flags and ``key``."""
    h = hashlib.sha256(source.read_bytes() + HEADER.read_bytes() + b"\0"
                       + " ".join(flags).encode() + b"\0" + key).hexdigest()[:12]
    cdir = get_cache_dir(cache_dir)
    out = cdir / f"{name}-{h}"
    if out.exists() and os.access(out, os.X_OK):
        return str(out)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) found")
    with file_lock(cdir / "nfsh.lock"):
        if not out.exists():
            tmp = cdir / f".{name}-{h}.tmp{os.getpid()}"
            p = subprocess.run([cc, "-o", str(tmp), str(source)] + flags,
                               capture_output=True, text=True)
            if p.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise RuntimeError(f"compiling {name} failed:\n{p.stderr}")
            os.replace(tmp, out)
    return str(out)


def nfsh_binary(cache_dir=None) -> str:
    """Path to the compiled nfsh (built into the cache dir on demand)."""
    return _cached_build("nfsh", SOURCE, CFLAGS + _pkgconfig_libnfs(),
                         _libnfs_version().encode(), cache_dir)


def guest_exerciser_binary(cache_dir=None) -> str:
    """Path to guest-exerciser (fsx and nsx on kernel NFS mounts), statically linked so
    that it runs in the test VM's minimal Debian (built into the cache dir on demand,
    like nfsh)."""
    return _cached_build("guest-exerciser", GUEST_EXERCISER_SOURCE, CFLAGS + ["-static"], b"",
                         cache_dir)


def exerciser_lines(proc: subprocess.Popen, what: str, timeout: float = 240) -> list[dict]:
    """Waits for an ``nfsh fsx``/``nsx`` started with :func:`nfsh_popen` (killing it
    after ``timeout``) and returns its JSON lines; fails the test, with the end of its
    output and its last operations, unless it exited 0."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
    return _parse_lines(out)


def nsx_tree_problems(lines: list[dict], root: Path) -> list[str]:
    """Differences between the tree an nsx run printed (its ``{"entry": ...}`` lines)
    and the tree under ``root`` on the server's disk: entries, kinds, link counts,
    permissions, symlink targets, and file ids (where the run learnt one) against inode numbers."""
    model = {e["entry"]: (e["kind"], e["nlink"], e["fileid"], e.get("target"),
                          None if e["kind"] == "symlink" else e["mode"])
             for e in lines if "entry" in e}
    on_disk = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            kind = ("symlink" if p.is_symlink() else "dir" if p.is_dir() else
                    "file" if p.is_file() else "other")
            on_disk[str(p.relative_to(root))] = (
                kind, st.st_nlink, st.st_ino, os.readlink(p) if kind == "symlink" else None,
                None if kind == "symlink" else stat.S_IMODE(st.st_mode))
    problems = [f"{p}: on disk, not in the model" for p in sorted(set(on_disk) - set(model))]
    problems += [f"{p}: in the model, not on disk" for p in sorted(set(model) - set(on_disk))]
    for p in sorted(set(model) & set(on_disk)):
        (kind, nlink, fileid, target, mode), (dkind, dnlink, ino, dtarget, dmode) = model[p], on_disk[p]
        if (kind, nlink, target, mode) != (dkind, dnlink, dtarget, dmode) or fileid not in (0, ino):
            problems.append(f"{p}: model {model[p]}, disk {on_disk[p]}")
    if not model:
        problems.append("the run printed no tree")
    return problems


def _parse_lines(stdout: str):
    res = []
    for ln in stdout.splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                res.append(json.loads(ln))
            except json.JSONDecodeError:
                pass
    return res


def run_nfsh(url, *args, timeout=300, env=None, binary=None, check=True, netns=None):
    """Run nfsh; returns (list_of_json_objects, CompletedProcess).

    ``netns``: an object with ``.argv(cmd)`` (rig.netns.Netns) to run nfsh
    inside a network namespace (where a Nasd(netns=...) listens).
    Raises NfshError on non-zero exit when ``check`` is true, and
    ``subprocess.TimeoutExpired`` on timeout."""
    cmd = [binary or nfsh_binary(), str(url)] + [str(a) for a in args]
    if netns is not None:
        cmd = netns.argv(cmd)
    e = dict(os.environ)
    if env:
        e.update({k: str(v) for k, v in env.items()})
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                       timeout=timeout, env=e)
    objs = _parse_lines(p.stdout)
    if check and p.returncode != 0:
        last = objs[-1] if objs else None
        raise NfshError(f"nfsh {' '.join(map(str, args))} failed rc={p.returncode}: "
                        f"{p.stderr.strip()[-2000:]}", p.returncode, p.stdout, p.stderr, last)
    return objs, p


def nfsh(url, *args, timeout=300, env=None, check=True, netns=None) -> dict:
    """Run one nfsh command and return its (last) JSON object."""
    objs, p = run_nfsh(url, *args, timeout=timeout, env=env, check=check, netns=netns)
    if not objs:
        if not check:
            return {"ok": False, "returncode": p.returncode, "stderr": p.stderr}
        raise NfshError(f"nfsh {' '.join(map(str, args))}: no JSON output "
                        f"(stderr: {p.stderr.strip()[-2000:]})", p.returncode, p.stdout, p.stderr)
    return objs[-1]


def nfsh_lines(url, *args, timeout=300, env=None, check=True, netns=None) -> list:
    """Run one nfsh command and return all JSON objects it printed."""
    return run_nfsh(url, *args, timeout=timeout, env=env, check=check, netns=netns)[0]


def nfsh_together(url, arg_lists, timeout=300, env=None) -> list:
    """Runs one nfsh per argument list, all beginning their commands at once after every
    one has mounted (NFSH_START_ON_EOF), and returns each one's last JSON object, in
    order. Raises NfshError if any of them fails."""
    env = {**(env or {}), "NFSH_START_ON_EOF": 1}
    procs = []
    try:
        for args in arg_lists:
            procs.append(nfsh_popen(url, *args, env=env, stdin=subprocess.PIPE))
        said = []
        for p in procs:
            lines = []
            # Up to its word that it has mounted; one that could not mount ends instead.
            while (line := p.stdout.readline()) and line.strip() != '{"ready":true}':
                lines.append(line)
            said.append("".join(lines))
        for p in procs:
            p.stdin.close()
            p.stdin = None   # closed: communicate() must not touch it
        results = []
        for p, args, before in zip(procs, arg_lists, said):
            out, err = p.communicate(timeout=timeout)
            objs = _parse_lines(before + out)
            if p.returncode != 0 or not objs:
                raise NfshError(f"nfsh {' '.join(map(str, args))} failed rc={p.returncode}: {err.strip()[-2000:]}",
                                p.returncode, before + out, err, objs[-1] if objs else None)
            results.append(objs[-1])
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class OutputFollower:
    """Collects the output lines of a process started with :func:`nfsh_popen` as they
    come, so that a test can act once the first one is out (the first read of a
    hold-and-read) and still have all of them at the end."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self._first = proc, [], threading.Event()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._first.set()
        self._first.set()

    def wait_first_line(self, timeout=60.0):
        """Fails the test unless a first line came within `timeout` seconds."""
        assert self._first.wait(timeout) and self.lines, \
            f"nfsh printed nothing: {self.proc.stderr.read() if self.proc.poll() is not None else ''}"

    def finish(self, timeout=90.0) -> tuple[str, str]:
        """Waits for the process to end; returns (stdout, stderr)."""
        self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return "".join(self.lines), self.proc.stderr.read()


def nfsh_popen(url, *args, env=None, netns=None, **kw) -> subprocess.Popen:
    """Start nfsh in the background (e.g. hold-and-read while restarting the
    server).  stdout/stderr are pipes (text); read with ``communicate()``."""
    e = dict(os.environ)
    if env:
        e.update({k: str(v) for k, v in env.items()})
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    cmd = [nfsh_binary(), str(url)] + [str(a) for a in args]
    if netns is not None:
        cmd = netns.argv(cmd)
    return subprocess.Popen(cmd, env=e, **kw)


parse_lines = _parse_lines

# ---------------------------------------------------------------- pattern

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def pattern_bytes(size: int, seed: int, offset: int = 0) -> bytes:
    """The bytes nfsh write-pattern puts at [offset, offset+size) (same
    algorithm as pattern_fill in nfsh.c: word k = splitmix64(seed ^ k), LE).
    Pure Python: fine for a few MiB, slow beyond that."""
    if size <= 0:
        return b""
    first, last = offset >> 3, (offset + size - 1) >> 3
    seed &= _M64
    buf = b"".join(_splitmix64(seed ^ k).to_bytes(8, "little") for k in range(first, last + 1))
    start = offset - (first << 3)
    return buf[start:start + size]


def main(argv=None) -> int:
    print(nfsh_binary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
