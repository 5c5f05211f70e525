"""Helpers for tests/kernel-client/test_posix.py.

* ``source_tarball(dest)``: a tar of real source trees (the Rust sources of a
  few crates from the cargo registry this repo builds against; fallback: this
  repository's own ``src`` and ``tests``), with a fixed numeric owner so the
  unpack also exercises chown.
* ``tree_manifest(root)``: {relative path: (type, size, mode, uid, gid,
  mtime, sha256)} for comparing an unpack on the export with a local one.
* ``guest_program(sections)``: the guest's cmd.sh that runs each section
  script (shipped as /share/sec/NAME.sh) under ``timeout``, records
  ``result NAME: RC`` and never stops at the first failure, so one boot
  reports every section.
* ``parse_kv(stdout)``: ``key: value`` lines of the guest's stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Crates (by name) whose registry sources go into the tarball, in order;
# enough for ~800 files / ~8 MB.
CRATES = ["tokio", "bytes", "serde", "thiserror", "parking_lot_core"]
TAR_UID = 1234
TAR_GID = 5678


def _cargo_home() -> Path:
    return Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")


def _crate_dirs() -> list[Path]:
    """Registry source dirs of CRATES, as resolved for this repo."""
    dirs: dict[str, Path] = {}
    cargo = shutil.which("cargo")
    if cargo:
        try:
            p = subprocess.run([cargo, "metadata", "--offline", "--format-version", "1"],
                               cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, timeout=120)
            if p.returncode == 0:
                for pkg in json.loads(p.stdout)["packages"]:
                    src = pkg.get("source") or ""
                    if pkg["name"] in CRATES and src.startswith("registry+"):
                        d = Path(pkg["manifest_path"]).parent
                        if d.is_dir():
                            dirs.setdefault(pkg["name"], d)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
    if not dirs:  # no cargo / offline metadata failed: look in CARGO_HOME
        for reg in sorted((_cargo_home() / "registry" / "src").glob("*")):
            for name in CRATES:
                cands = sorted(reg.glob(f"{name}-[0-9]*"))
                if cands and name not in dirs:
                    dirs[name] = cands[-1]
    return [dirs[n] for n in CRATES if n in dirs]


def source_tarball(dest: Path) -> tuple[Path, str]:
    """Write the tarball to ``dest``; return (dest, description)."""
    crates = _crate_dirs()
    if crates:
        parent = crates[0].parent
        crates = [c for c in crates if c.parent == parent]
        cwd, members = parent, [c.name for c in crates]
        what = "crates " + " ".join(members)
    else:
        cwd, members, what = REPO, ["src", "tests"], "repo src+tests"
    subprocess.run(["tar", "-C", str(cwd), "--owner", str(TAR_UID), "--group", str(TAR_GID),
                    "--numeric-owner", "--exclude=__pycache__", "-cf", str(dest), *members],
                   check=True, stdin=subprocess.DEVNULL)
    return dest, what


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_manifest(root: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            st = full.lstat()
            if stat.S_ISREG(st.st_mode):
                kind, digest = "f", _sha256(full)
            elif stat.S_ISDIR(st.st_mode):
                kind, digest = "d", ""
            elif stat.S_ISLNK(st.st_mode):
                kind, digest = "l", os.readlink(full)
            else:
                kind, digest = "?", ""
            size = st.st_size if kind == "f" else 0
            # directory mtimes change as entries are added; compare file ones
            mtime = int(st.st_mtime) if kind == "f" else 0
            out[rel] = (kind, size, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                        mtime, digest)
    return out


def guest_program(prologue: str, sections: list[tuple[str, int]], epilogue: str = "",
                  mountpoint: str = "/mnt/nfs") -> str:
    """cmd.sh: ``prologue`` (set -e semantics are the caller's), then each
    section /share/sec/NAME.sh under ``timeout -k 10 T sh -eux``; a section's
    failure is recorded as ``result NAME: RC`` and the next one runs, unless
    it timed out (then the rest are reported as skipped).  Nothing runs if
    ``mountpoint`` is not mounted after the prologue."""
    lines = ["#!/bin/sh", "set -u", "hung=", prologue.strip(),
             # no mount, no point: the sections would run on the guest's own disk
             f'grep -q " {mountpoint} " /proc/mounts || hung=mount', ""]
    for name, secs in sections:
        # after a timeout the mount is most likely dead: skip the rest instead
        # of waiting out every remaining section's timeout
        lines += [f'if [ -n "$hung" ]; then echo "result {name}: skipped after $hung timed out"; else',
                  f'echo "===== section {name}" >&2',
                  f"timeout -k 10 {secs} sh -eux /share/sec/{name}.sh",
                  'rc=$?',
                  f'echo "result {name}: $rc"',
                  f'case $rc in 124|137) hung={name};; esac',
                  'fi']
    lines += ['if [ -z "$hung" ]; then', epilogue.strip(), "fi", 'echo "guest: done"', ""]
    return "\n".join(lines)


def parse_kv(stdout: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        if ": " in line:
            k, v = line.split(": ", 1)
            out[k.strip()] = v
    return out
