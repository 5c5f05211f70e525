"""fio built with the libnfs ioengine, for driving an NFS server from user space.

Debian 12 ships fio 3.33 without the ``nfs`` engine, so we rebuild Debian's own
fio source package against libnfs-dev:

* a ``Types: deb-src`` twin of every ``Types: deb`` stanza found in
  ``/etc/apt/sources.list.d/*.sources`` is written to
  ``/etc/apt/sources.list.d/nasd-deb-src.sources`` (URIs/Suites are copied at
  run time, nothing is hard-coded here), then ``apt-get update``;
* ``apt-get source fio`` into a temp dir, apply ``fio-libnfs-sync.patch``
  (the engine then honours ``sync=1`` by opening with ``O_SYNC``, so libnfs sends
  FILE_SYNC WRITEs, and turns ``fsync=N``/``end_fsync=1`` into NFS COMMITs; Debian's
  engine rejects them), ``./configure --enable-libnfs``, ``make -j2``;
* the binary is copied to ``<cache>/fio-libnfs-<recipe hash>/fio``.

Cache dir: ``$NASD_TEST_CACHE`` or ``<repo>/target/test-cache``.  A file lock
serialises concurrent builds; the result is verified with ``fio --enghelp``.

Usage::

    from rig.fio import fio_binary, run_fio
    out = run_fio(["--name=w", "--ioengine=nfs", "--nfs_url=" + url, ...], timeout=120)
    out["jobs"][0]["write"]["iops"]

Prebuild: ``python3 -m rig.fio`` (run from the ``tests`` dir) or
``tests/rig/build-fio-nfs.sh``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Bump RECIPE_VERSION whenever the build steps below change meaningfully.
RECIPE_VERSION = "2"
ENGINE_PATCH = Path(__file__).resolve().parent / "fio-libnfs-sync.patch"
CONFIGURE_ARGS = ["--enable-libnfs"]
APT_SRC_FILE = "/etc/apt/sources.list.d/nasd-deb-src.sources"
SOURCES_GLOB = "/etc/apt/sources.list.d/*.sources"
BUILD_PACKAGES = ["dpkg-dev", "libnfs-dev", "pkg-config", "gcc", "make", "patch"]


class FioBuildError(RuntimeError):
    pass


class FioError(RuntimeError):
    """fio exited non-zero or produced no parseable JSON."""

    def __init__(self, msg, returncode=None, stdout="", stderr=""):
        super().__init__(msg)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def _log(msg: str) -> None:
    print(f"[rig.fio] {msg}", file=sys.stderr, flush=True)


def get_cache_dir(cache_dir=None) -> Path:
    """The test cache dir (created if needed)."""
    d = cache_dir or os.environ.get("NASD_TEST_CACHE") or (REPO / "target" / "test-cache")
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def file_lock(path: Path):
    """Exclusive flock on ``path`` (blocking)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd, cwd=None, env=None, timeout=None, log_path=None):
    """Run a build step; raise FioBuildError with the output tail on failure."""
    _log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace")
    if log_path:
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}\n[rc={p.returncode}]\n")
    if p.returncode != 0:
        tail = "\n".join(p.stdout.splitlines()[-40:])
        raise FioBuildError(f"command failed (rc={p.returncode}): {' '.join(cmd)}\n{tail}")
    return p.stdout


def _pkg_version(pkg: str) -> str:
    """Version of an installed package, "" when not installed."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Version}", pkg],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
    parts = out.split()  # "ii  1.2-3" (Status-Abbrev has a trailing space)
    return parts[-1] if len(parts) >= 2 and parts[0] == "ii" else ""


def _apt(cmd, cwd=None, log_path=None, timeout=900):
    """Run an apt command, waiting out other apt/dpkg processes' locks."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [cmd[0], "-o", "DPkg::Lock::Timeout=300"] + cmd[1:]
    for attempt in range(30):
        try:
            return _run(cmd, cwd=cwd, env=env, timeout=timeout, log_path=log_path)
        except FioBuildError as e:
            msg = str(e)
            if attempt < 29 and ("Could not get lock" in msg or "Unable to lock" in msg):
                time.sleep(10)
                continue
            raise


def recipe_hash() -> str:
    """Hash of everything that determines the build result we care about."""
    h = hashlib.sha256()
    h.update(RECIPE_VERSION.encode())
    h.update(" ".join(CONFIGURE_ARGS).encode())
    h.update(ENGINE_PATCH.read_bytes())
    # A different libnfs (ABI) means a different binary.
    h.update(_pkg_version("libnfs-dev").encode())
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------
# apt deb-src handling


def _parse_deb822(text: str):
    """Parse a deb822 .sources file into a list of dicts (keys lower-cased)."""
    stanzas, cur, last = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, last = {}, None
            continue
        if line[0] in " \t" and last:
            cur[last] += "\n" + line.strip()
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            last = k.strip().lower()
            cur[last] = v.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def deb_src_stanzas():
    """deb-src stanzas mirroring the machine's ``Types: deb`` apt sources.

    Returns (text_to_write, already_has_deb_src)."""
    out, have_src = [], False
    for path in sorted(glob.glob(SOURCES_GLOB)):
        if os.path.abspath(path) == APT_SRC_FILE:
            continue
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for st in _parse_deb822(text):
            if st.get("enabled", "yes").lower() == "no":
                continue
            types = st.get("types", "").split()
            if "deb-src" in types:
                have_src = True
            if "deb" not in types or not st.get("uris") or not st.get("suites"):
                continue
            lines = ["Types: deb-src"]
            for key, name in (("uris", "URIs"), ("suites", "Suites"),
                              ("components", "Components"),
                              ("signed-by", "Signed-By"),
                              ("architectures", "Architectures"),
                              ("trusted", "Trusted")):
                if key in st:
                    val = st[key]
                    if "\n" in val:  # multi-line value (e.g. inline key)
                        val = val.replace("\n", "\n ")
                    lines.append(f"{name}: {val}")
            out.append("\n".join(lines))
    return ("\n\n".join(out) + "\n") if out else "", have_src


def _legacy_deb_src_lines():
    """Fallback for machines that only use one-line sources.list format."""
    out = []
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("deb "):
                out.append("deb-src " + s[4:])
    return out


def ensure_deb_src(log_path=None) -> None:
    """Make ``apt-get source`` possible: add deb-src entries and update."""
    text, have_src = deb_src_stanzas()
    changed = False
    if text:
        old = Path(APT_SRC_FILE).read_text() if os.path.exists(APT_SRC_FILE) else None
        if old != text:
            Path(APT_SRC_FILE).write_text(text)
            changed = True
    elif not have_src and not os.path.exists(APT_SRC_FILE):
        legacy = _legacy_deb_src_lines()
        if not legacy:
            raise FioBuildError("no apt sources found to derive deb-src entries from")
        lf = "/etc/apt/sources.list.d/nasd-deb-src.list"
        if not os.path.exists(lf) or Path(lf).read_text() != "\n".join(legacy) + "\n":
            Path(lf).write_text("\n".join(legacy) + "\n")
            changed = True
    if changed or not glob.glob("/var/lib/apt/lists/*_Sources*"):
        _apt(["apt-get", "update"], log_path=log_path)


def ensure_build_packages(log_path=None) -> None:
    missing = [p for p in BUILD_PACKAGES if not _pkg_version(p)]
    if shutil.which("pkg-config") is None and "pkg-config" not in missing:
        missing.append("pkg-config")
    if missing:
        _apt(["apt-get", "install", "-y", "--no-install-recommends"] + missing,
             log_path=log_path)


# --------------------------------------------------------------------------
# build


def has_nfs_engine(fio: str) -> bool:
    try:
        p = subprocess.run([fio, "--enghelp"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"^\s*nfs\s*$", p.stdout, re.M) is not None


def _build(dest_dir: Path) -> None:
    t0 = time.monotonic()
    log_path = dest_dir.parent / f"{dest_dir.name}.build.log"
    try:
        log_path.unlink()
    except FileNotFoundError:
        pass
    if os.geteuid() != 0:
        raise FioBuildError("building fio needs root (apt-get source / install)")
    ensure_build_packages(log_path)
    ensure_deb_src(log_path)
    with tempfile.TemporaryDirectory(prefix="nasd-fio-build-") as tmp:
        try:
            _apt(["apt-get", "source", "fio"], cwd=tmp, log_path=log_path)
        except FioBuildError:
            # stale lists: refresh once and retry
            _apt(["apt-get", "update"], log_path=log_path)
            _apt(["apt-get", "source", "fio"], cwd=tmp, log_path=log_path)
        srcs = [d for d in Path(tmp).iterdir()
                if d.is_dir() and d.name.startswith("fio-") and (d / "configure").exists()]
        if not srcs:
            raise FioBuildError(f"apt-get source fio produced no source tree in {tmp}")
        src = srcs[0]
        _run(["patch", "-p1", "-i", str(ENGINE_PATCH)], cwd=src, log_path=log_path)
        _run(["./configure"] + CONFIGURE_ARGS, cwd=src, timeout=600, log_path=log_path)
        jobs = str(min(2, os.cpu_count() or 1))
        _run(["make", f"-j{jobs}", "fio"], cwd=src, timeout=3600, log_path=log_path)
        built = src / "fio"
        if not has_nfs_engine(str(built)):
            raise FioBuildError(f"built fio has no nfs engine (see {log_path})")
        dest_dir.mkdir(parents=True, exist_ok=True)
        tmp_dest = dest_dir / "fio.tmp"
        shutil.copy2(built, tmp_dest)
        os.chmod(tmp_dest, 0o755)
        (dest_dir / "SOURCE").write_text(src.name + "\n")
        os.replace(tmp_dest, dest_dir / "fio")
    _log(f"fio built in {time.monotonic() - t0:.0f}s -> {dest_dir / 'fio'}")


def fio_binary(cache_dir=None) -> str:
    """Path to a fio binary that has the ``nfs`` ioengine (built on demand)."""
    env_fio = os.environ.get("NASD_FIO")
    if env_fio and has_nfs_engine(env_fio):
        return env_fio
    cdir = get_cache_dir(cache_dir)
    dest_dir = cdir / f"fio-libnfs-{recipe_hash()}"
    fio = dest_dir / "fio"
    if fio.exists() and os.access(fio, os.X_OK):
        return str(fio)
    with file_lock(cdir / "fio-libnfs.lock"):
        if not (fio.exists() and has_nfs_engine(str(fio))):
            _build(dest_dir)
    return str(fio)


# --------------------------------------------------------------------------
# running


def parse_fio_json(text: str) -> dict:
    """Extract fio's JSON document from output polluted by engine noise.

    The nfs engine prints lines like ``Failed NFS operation(code:-14)`` on
    teardown, sometimes before/after and occasionally in the middle of the
    JSON (stdout is shared).  Strategy: decode from the first line that starts
    with ``{``; if that fails drop every line that cannot belong to fio's
    pretty-printed JSON (i.e. does not start with whitespace, a brace or a
    bracket) and retry."""
    dec = json.JSONDecoder()
    lines = text.splitlines()
    for attempt in range(2):
        if attempt == 1:
            lines = [ln for ln in lines
                     if ln[:1] in ("", " ", "\t", "{", "}", "[", "]", '"')]
        for i, ln in enumerate(lines):
            if ln.startswith("{"):
                blob = "\n".join(lines[i:])
                try:
                    obj, _ = dec.raw_decode(blob)
                    return obj
                except json.JSONDecodeError:
                    break
    raise ValueError("no JSON document found in fio output")


def run_fio(args, timeout=300, fio=None, cwd=None, env=None, check_errors=True,
            netns=None) -> dict:
    """Run fio with ``--output-format=json`` and return the parsed JSON.

    ``args`` are fio command-line arguments (job options as ``--name=...``
    style or a job-file path).  Raises :class:`FioError` on non-zero exit,
    timeout, or unparseable output.  The returned dict gets an extra
    ``"_noise"`` key: list of non-JSON stdout lines (e.g. engine errors) and
    ``"_stderr"``.  With ``check_errors`` a job whose JSON ``error`` is
    non-zero raises too; pass False to inspect such results yourself.
    ``netns``: object with ``.argv(cmd)`` to run fio inside that namespace."""
    fio = fio or fio_binary()
    args = [str(a) for a in args]
    if not any(a.startswith("--output-format") for a in args):
        args = ["--output-format=json"] + args
    cmd = [fio] + args
    if netns is not None:
        cmd = netns.argv(cmd)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as e:
        raise FioError(f"fio timed out after {timeout}s: {' '.join(cmd)}",
                       stdout=(e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
                       stderr=(e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
    if p.returncode != 0:
        raise FioError(f"fio failed rc={p.returncode}: {' '.join(cmd)}\n"
                       f"stderr:\n{p.stderr[-4000:]}\nstdout:\n{p.stdout[-4000:]}",
                       p.returncode, p.stdout, p.stderr)
    try:
        out = parse_fio_json(p.stdout)
    except ValueError:
        raise FioError(f"fio produced no JSON: {' '.join(cmd)}\nstdout:\n{p.stdout[-4000:]}"
                       f"\nstderr:\n{p.stderr[-4000:]}", p.returncode, p.stdout, p.stderr)
    out["_noise"] = [ln for ln in p.stdout.splitlines()
                     if ln and ln[:1] not in (" ", "\t", "{", "}", "[", "]", '"')]
    out["_stderr"] = p.stderr
    # fio reports per-job errors in JSON while still exiting 0 in some cases
    errs = [j for j in out.get("jobs", []) if j.get("error")] if check_errors else []
    if errs:
        raise FioError(f"fio job error(s): " +
                       ", ".join(f"{j.get('jobname')}: error={j.get('error')}" for j in errs)
                       + f"\nstderr:\n{p.stderr[-4000:]}", p.returncode, p.stdout, p.stderr)
    return out


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Build/locate fio with the libnfs engine")
    ap.add_argument("--cache-dir", default=None)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    path = fio_binary(a.cache_dir)
    print(path)
    _log(f"ready in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
