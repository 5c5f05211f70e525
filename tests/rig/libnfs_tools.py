"""Thin wrappers around Debian's libnfs-utils: nfs-ls, nfs-cp, nfs-cat.

    from rig.libnfs_tools import nfs_ls, nfs_cat, nfs_cp
    entries = nfs_ls(srv.url())              # [{"name": "a", "type": "file", "size": 6, ...}]
    data = nfs_cat(srv.url("/a"))            # bytes
    nfs_cp("/local/file", srv.url("/copy"))  # upload; returns bytes copied
    nfs_cp(srv.url("/copy"), "/local/out")   # download

Every failure raises :class:`LibnfsToolError` carrying the command, exit
status and stderr.

How the tools treat URLs (libnfs 4.0, Debian 12):
* ``nfs-ls URL`` MOUNTs the whole URL path, so listing a subdirectory means
  the server has to accept a MOUNT of that subdirectory.
* ``nfs-cat``/``nfs-cp`` split the URL into directory + file name; the
  directory is MOUNTed, the file opened relative to it.
* ``nfs-cp`` creates destination files with mode 0660.
* ``nfs-ls -D`` (discovery) broadcasts on every local network: never used
  here (refused by :func:`nfs_ls_raw`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

__all__ = ["LibnfsToolError", "nfs_ls", "nfs_ls_raw", "nfs_cat", "nfs_cp",
           "nfs_get", "nfs_put", "tools_available"]

TOOLS = ("nfs-ls", "nfs-cp", "nfs-cat")


class LibnfsToolError(RuntimeError):
    def __init__(self, cmd, returncode, stdout, stderr):
        self.cmd = cmd
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        super().__init__(f"{' '.join(cmd)} failed (rc={returncode}): {self.stderr.strip()}")


def tools_available() -> bool:
    return all(shutil.which(t) for t in TOOLS)


def _run(cmd, timeout, text=True, netns=None):
    if not shutil.which(cmd[0]):
        raise LibnfsToolError(cmd, 127, "", f"{cmd[0]} not found (apt-get install libnfs-utils)")
    full = netns.argv(cmd) if netns is not None else cmd
    try:
        p = subprocess.run(full, capture_output=True, text=text, timeout=timeout,
                           stdin=subprocess.DEVNULL,
                           **({"errors": "replace"} if text else {}))
    except subprocess.TimeoutExpired as e:
        raise LibnfsToolError(cmd, None, e.stdout or "", f"timed out after {timeout}s") from e
    if p.returncode != 0:
        raise LibnfsToolError(cmd, p.returncode, p.stdout, p.stderr)
    return p


_TYPES = {"d": "dir", "-": "file", "l": "symlink", "c": "char", "b": "block",
          "p": "fifo", "s": "socket"}
# "drwxr-xr-x  2     0     0         4096 sub" ; name may contain spaces
_LS_RE = re.compile(r"^(\S{10})\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+) (.*)$")


def nfs_ls_raw(url: str, recursive: bool = False, summary: bool = False,
               timeout: float = 60, netns=None) -> str:
    """stdout of ``nfs-ls [-R] [-s] URL``."""
    if str(url).startswith("-"):
        raise ValueError("nfs-ls takes a URL here; options other than -R/-s are refused")
    cmd = ["nfs-ls"]
    if recursive:
        cmd.append("-R")
    if summary:
        cmd.append("-s")
    cmd.append(str(url))
    return _run(cmd, timeout, netns=netns).stdout


def nfs_ls(url: str, recursive: bool = False, timeout: float = 60, netns=None) -> list:
    """Parsed ``nfs-ls`` listing (no ``.``/``..``).

    Each entry: ``name`` (relative path with -R), ``type`` (file, dir,
    symlink, ...), ``mode`` (the ls-style string), ``nlink``, ``uid``,
    ``gid``, ``size``."""
    out = []
    for line in nfs_ls_raw(url, recursive=recursive, timeout=timeout, netns=netns).splitlines():
        m = _LS_RE.match(line)
        if not m:
            continue
        mode, nlink, uid, gid, size, name = m.groups()
        if name in (".", ".."):
            continue
        out.append({"name": name, "type": _TYPES.get(mode[0], "unknown"), "mode": mode,
                    "nlink": int(nlink), "uid": int(uid), "gid": int(gid),
                    "size": int(size)})
    return out


def nfs_cat(url: str, timeout: float = 60, netns=None) -> bytes:
    """File content via ``nfs-cat URL``."""
    return _run(["nfs-cat", str(url)], timeout, text=False, netns=netns).stdout


def nfs_cp(src: str, dst: str, timeout: float = 300, netns=None) -> int:
    """``nfs-cp SRC DST`` (each a local path or nfs:// URL). Returns bytes copied."""
    p = _run(["nfs-cp", os.fspath(src), os.fspath(dst)], timeout, netns=netns)
    m = re.search(r"copied (\d+) bytes", p.stdout)
    return int(m.group(1)) if m else -1


def nfs_get(url: str, local_path, timeout: float = 300, netns=None) -> int:
    return nfs_cp(url, os.fspath(local_path), timeout, netns=netns)


def nfs_put(local_path, url: str, timeout: float = 300, netns=None) -> int:
    return nfs_cp(os.fspath(local_path), url, timeout, netns=netns)
