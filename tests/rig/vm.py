"""A Linux kernel NFS client in a qemu (TCG) guest.

``ensure_image()`` builds (once, cached) a tiny Debian bookworm guest:
kernel + initrd + an ext4 root image whose init runs ``/share/cmd.sh`` from a
9p share and powers off.  ``run_guest(script, netns)`` boots it inside a
network namespace so the guest's 10.0.2.2 (qemu user-mode gateway) is the
namespace's 127.0.0.1, where the NFS server under test listens.

Only the standard library is used.  Building needs root, debootstrap and
mke2fs; running needs qemu-system-x86_64.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Image", "GuestResult", "GuestError", "ImageBuildError", "Guest",
           "ensure_image", "run_guest", "default_cache_dir", "apt_mirror"]

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# Recipe.  Anything that changes the image must live here (or in INIT_SCRIPT):
# the hash of these constants names the cached image.
RECIPE_VERSION = 1
SUITE = "bookworm"
PACKAGES = ["linux-image-amd64", "nfs-common", "fio", "iproute2", "kmod",
            "procps", "netbase"]
# Modules kept in the guest (plus their dependencies and soft dependencies).
KEEP_MODULES = [
    "nfs", "nfsv3", "nfsv4", "nfs_acl", "lockd", "grace", "sunrpc",
    "auth_rpcgss", "rpcsec_gss_krb5", "dns_resolver", "fscache", "netfs",
    "9p", "9pnet", "9pnet_virtio",
    "virtio", "virtio_ring", "virtio_pci", "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev", "virtio_blk", "virtio_net", "virtio_rng",
    "net_failover", "failover",
    "ext4", "jbd2", "mbcache", "crc16", "crc32c_generic", "crc32c_intel",
    "libcrc32c",
]
# Loaded from the initrd (enough to mount the ext4 root on virtio-blk).
INITRD_MODULES = ["virtio_pci", "virtio_blk", "crc32c_generic", "ext4"]
TRIM_PATHS = ["usr/share/doc", "usr/share/man", "usr/share/info",
              "usr/share/locale", "usr/share/lintian", "usr/share/linda",
              "var/cache/apt/archives", "var/lib/apt/lists", "usr/share/bug"]
ROOTFS_HEADROOM_MB = 256
INIT_PATH = "sbin/nasd-test-init"

INIT_SCRIPT = r"""#!/bin/sh
# nasd kernel-client rig guest init: run /share/cmd.sh, record rc, power off.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
log() { echo "nasd-init: $*" > /dev/console 2>/dev/null || echo "nasd-init: $*"; }

mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mount -o remount,rw / 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts devpts /dev/pts 2>/dev/null
hostname nasd-guest 2>/dev/null

modprobe -q 9pnet_virtio 2>/dev/null
modprobe -q 9p 2>/dev/null
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /share; then
    log "cannot mount 9p share"
    echo o > /proc/sysrq-trigger
    exit 1
fi

for m in virtio_net nfs nfsv3 nfsv4; do modprobe -q $m 2>/dev/null; done
ip link set lo up
NIC=
i=0
while [ -z "$NIC" ] && [ $i -lt 50 ]; do
    for d in /sys/class/net/*; do
        n=${d##*/}
        [ "$n" = lo ] && continue
        NIC=$n; break
    done
    [ -z "$NIC" ] && sleep 0.1
    i=$((i+1))
done
if [ -n "$NIC" ]; then
    ip link set "$NIC" up
    ip addr add 10.0.2.15/24 dev "$NIC"
    ip route add default via 10.0.2.2
else
    log "no network interface found"
fi
log "net: ${NIC:-none}; running /share/cmd.sh"

cd /tmp
sh /share/cmd.sh > /share/stdout 2> /share/stderr < /dev/null
rc=$?
echo $rc > /share/rc.tmp
sync
mv /share/rc.tmp /share/rc
sync
log "cmd.sh exited $rc; powering off"
poweroff -f 2>/dev/null
echo o > /proc/sysrq-trigger
sleep 10
exit $rc
"""


def recipe_hash() -> str:
    h = hashlib.sha256()
    for part in (RECIPE_VERSION, SUITE, PACKAGES, KEEP_MODULES, INITRD_MODULES,
                 TRIM_PATHS, ROOTFS_HEADROOM_MB, INIT_PATH, INIT_SCRIPT):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Image:
    kernel: Path
    initrd: Path
    rootfs: Path


@dataclasses.dataclass
class GuestResult:
    rc: int
    stdout: str
    stderr: str
    console: str = ""
    seconds: float = 0.0


class GuestError(RuntimeError):
    pass


class ImageBuildError(RuntimeError):
    pass


def default_cache_dir() -> Path:
    env = os.environ.get("NASD_TEST_CACHE")
    return Path(env) if env else REPO / "target" / "test-cache"


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (never hard-coded in the repo)."""
    uris: list[str] = []
    for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for line in Path(f).read_text().splitlines():
            m = re.match(r"\s*URIs:\s*(.+)", line)
            if m:
                uris += m.group(1).split()
    lists = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]
    for f in lists:
        if not os.path.exists(f):
            continue
        for line in Path(f).read_text().splitlines():
            m = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)", line)
            if m:
                uris.append(m.group(2))
    for u in uris:
        if u.startswith(("http://", "https://")) and "security" not in u:
            return u
    raise ImageBuildError("no Debian mirror found in /etc/apt sources")


def _log(msg: str) -> None:
    print(f"[rig.vm] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log_path: Path, **kw) -> None:
    with open(log_path, "a") as lf:
        lf.write(f"\n$ {' '.join(map(str, cmd))}\n")
        lf.flush()
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=lf,
                           stderr=subprocess.STDOUT, **kw)
    if p.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(True)[-30:])
        raise ImageBuildError(f"{cmd[0]} failed ({p.returncode}); log {log_path}:\n{tail}")


def _mod_name(path: str) -> str:
    base = os.path.basename(path)
    base = re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base)
    return base.replace("-", "_")


def _trim_modules(root: Path, log_path: Path) -> str:
    mods = sorted((root / "lib/modules").iterdir())
    if len(mods) != 1:
        raise ImageBuildError(f"expected one kernel in the guest, found {mods}")
    kdir = mods[0]
    kver = kdir.name
    deps: dict[str, list[str]] = {}
    files: dict[str, str] = {}
    for line in (kdir / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        n = _mod_name(mod)
        files[n] = mod
        deps[n] = [_mod_name(d) for d in rest.split()]
    soft: dict[str, list[str]] = {}
    sd = kdir / "modules.softdep"
    if sd.exists():
        for line in sd.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "softdep":
                soft[parts[1].replace("-", "_")] = [
                    p.replace("-", "_") for p in parts[2:] if not p.endswith(":")]
    keep: set[str] = set()
    todo = [m for m in KEEP_MODULES if m in files]
    while todo:
        m = todo.pop()
        if m in keep or m not in files:
            continue
        keep.add(m)
        todo += deps.get(m, []) + soft.get(m, [])
    keep_files = {files[m] for m in keep}
    removed = 0
    kernel_dir = kdir / "kernel"
    for dirpath, _dirs, fnames in os.walk(kernel_dir):
        for fn in fnames:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, kdir)
            if rel not in keep_files:
                os.unlink(full)
                removed += 1
    for dirpath, dirs, fnames in os.walk(kernel_dir, topdown=False):
        if not os.listdir(dirpath):
            os.rmdir(dirpath)
    with open(log_path, "a") as lf:
        lf.write(f"\nkept modules ({len(keep)}): {' '.join(sorted(keep))}\n"
                 f"removed {removed} module files\n")
    _run(["chroot", str(root), "depmod", "-a", kver], log_path)
    return kver


def _umount_under(path: Path) -> None:
    """Unmount anything left mounted below ``path`` (an interrupted debootstrap
    leaves proc/sys, possibly a bind of /dev) so rmtree never walks into it."""
    prefix = os.path.realpath(path) + "/"
    mounts = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mnt = line.split()[1].replace("\\040", " ")
            if mnt.startswith(prefix):
                mounts.append(mnt)
    for mnt in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _rmtree(path: Path) -> None:
    _umount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def _du_mb(path: Path) -> int:
    out = subprocess.run(["du", "-sxm", str(path)], stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    return int(out.split()[0])


def _build(work: Path, log_path: Path) -> None:
    root = work / "root"
    mirror = apt_mirror()
    t0 = time.monotonic()
    _log(f"debootstrap {SUITE} into {root} (log {log_path})")
    _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
          SUITE, str(root), mirror], log_path)
    _log(f"debootstrap done in {time.monotonic() - t0:.0f}s; trimming")

    for rel in TRIM_PATHS:
        p = root / rel
        if p.is_dir():
            shutil.rmtree(p)
            p.mkdir(parents=True, exist_ok=True)
    kver = _trim_modules(root, log_path)

    # Small initrd: only what mounts the root disk.
    conf = root / "etc/initramfs-tools/initramfs.conf"
    text = conf.read_text()
    text = re.sub(r"(?m)^MODULES=.*$", "MODULES=list", text)
    conf.write_text(text)
    (root / "etc/initramfs-tools/modules").write_text("\n".join(INITRD_MODULES) + "\n")
    for b in root.glob("boot/initrd.img-*"):
        b.unlink()
    _run(["chroot", str(root), "update-initramfs", "-c", "-k", kver], log_path)

    # Guest configuration.
    (root / INIT_PATH).write_text(INIT_SCRIPT)
    os.chmod(root / INIT_PATH, 0o755)
    for d in ("share", "mnt", "mnt/nfs", "mnt/nfs2"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/hostname").write_text("nasd-guest\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost nasd-guest\n10.0.2.2 server\n")
    (root / "etc/fstab").write_text("")
    mtab = root / "etc/mtab"
    if mtab.exists() or mtab.is_symlink():
        mtab.unlink()
    mtab.symlink_to("../proc/self/mounts")

    # Kernel and initrd out, then the root image.
    out = work / "out"
    out.mkdir()
    shutil.copy2(root / f"boot/vmlinuz-{kver}", out / "vmlinuz")
    shutil.copy2(root / f"boot/initrd.img-{kver}", out / "initrd.img")
    for p in list(root.glob("boot/*")):
        if p.is_file():
            p.unlink()
    size_mb = _du_mb(root) + ROOTFS_HEADROOM_MB
    _run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "nasd-guest", "-d", str(root),
          str(out / "rootfs.ext4"), f"{size_mb}M"], log_path)
    (out / "kernel-version").write_text(kver + "\n")
    (out / "recipe").write_text(recipe_hash() + "\n")
    _log(f"image built in {time.monotonic() - t0:.0f}s "
         f"(kernel {kver}, rootfs {size_mb} MiB)")


def missing_prerequisite(what: str, tools: tuple[str, ...] = ()) -> str | None:
    """Why tests that boot a guest (`what`, for the message) cannot run here, or None:
    root, qemu, iproute2, `tools`, and a cached image or the tools to build one."""
    if os.geteuid() != 0:
        return f"{what} need root (netns, debootstrap)"
    needs = {"qemu-system-x86_64": "qemu-system-x86", "ip": "iproute2"}
    needs.update({t: "e2fsprogs" for t in tools})
    for tool, package in needs.items():
        if not shutil.which(tool):
            return f"{tool} missing: apt-get install {package}"
    cached = (default_cache_dir() / f"image-{recipe_hash()}" / "recipe").exists()
    if not cached and not (shutil.which("debootstrap") and shutil.which("mke2fs")):
        return "no cached guest image, and debootstrap/mke2fs missing: apt-get install debootstrap e2fsprogs"
    return None


def ensure_image(cache_dir: str | os.PathLike | None = None) -> Image:
    """Return the cached guest image, building it first if the recipe changed."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"image-{recipe_hash()}"

    def image() -> Image:
        return Image(final / "vmlinuz", final / "initrd.img", final / "rootfs.ext4")

    if (final / "recipe").exists():
        return image()
    if os.geteuid() != 0:
        raise ImageBuildError("building the guest image needs root")
    for tool in ("debootstrap", "mke2fs", "chroot"):
        if not shutil.which(tool):
            raise ImageBuildError(f"{tool} not found (apt-get install debootstrap e2fsprogs)")
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest may be building
        if (final / "recipe").exists():
            return image()
        for stale in cache.glob("build-*"):  # from a killed build (we hold the lock)
            _rmtree(stale)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
        log_path = cache / "build.log"
        log_path.write_text(f"recipe {recipe_hash()}\n")
        try:
            _build(work, log_path)
            os.rename(work / "out", final)
        finally:
            _rmtree(work)
        # Drop images of older recipes.
        for old in cache.glob("image-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return image()


# ---------------------------------------------------------------------------
def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no console log)"
    return "\n".join(lines[-n:])


def _qemu_escape(path: str | os.PathLike) -> str:
    """A path as a qemu option value (commas are doubled)."""
    return os.fspath(path).replace(",", ",,")


def _qemu_argv(qemu: str, img: Image, share: Path, smp: int, mem: int,
               drives=(), hostfwd=()) -> list[str]:
    netdev = "user,id=n0"
    for host_port, guest_port in hostfwd:
        # listens on 127.0.0.1 of the namespace qemu runs in; forwards to 10.0.2.15
        netdev += f",hostfwd=tcp:127.0.0.1:{int(host_port)}-:{int(guest_port)}"
    # TCG by default (this host's /dev/kvm cannot boot a stock kernel);
    # NASD_VM_ACCEL=kvm where KVM works.
    accel = os.environ.get("NASD_VM_ACCEL", "tcg,thread=multi")
    cmd = [qemu, "-accel", accel, "-smp", str(smp), "-m", str(mem),
           "-nographic", "-no-reboot",
           "-kernel", str(img.kernel), "-initrd", str(img.initrd),
           "-append", "root=/dev/vda ro quiet console=ttyS0 "
                      "init=/" + INIT_PATH + " panic=-1",
           "-drive", f"file={img.rootfs},if=virtio,format=raw,snapshot=on"]
    for d in drives:
        # /dev/vdb, /dev/vdc, ... in this order.  cache=writeback (qemu's
        # default): what the guest wrote reaches the image file (the host page
        # cache) even if qemu is SIGKILLed; what sits in the guest's page cache
        # does not -- a power cut as far as the guest can tell.
        cmd += ["-drive", f"file={_qemu_escape(d)},if=virtio,format=raw,cache=writeback"]
    cmd += ["-virtfs", f"local,path={share},mount_tag=share,security_model=none",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile=",
            "-device", "virtio-rng-pci"]
    return cmd


class Guest:
    """One qemu guest run, for scripts that do not end by themselves (a server).

        with vm.Guest(script, ns, drives=[img], hostfwd=[(2049, 2049)]) as g:
            ...                      # g.alive(), g.read("stderr"), g.console()
            g.power_cut()            # SIGKILL qemu: the guest's page cache is lost
        # or: res = g.wait(timeout)  # GuestResult once the script ended

    ``script``, ``files``, ``smp``, ``mem``, ``image``, ``keep_share`` are as
    for :func:`run_guest` (``files`` values may also be paths of host files,
    copied into the share).  ``drives`` are raw image files attached as
    virtio disks /dev/vdb, /dev/vdc, ... (cache=writeback).  ``hostfwd`` is a
    list of (host_port, guest_port): qemu listens on 127.0.0.1:host_port of
    ``netns`` and forwards to the guest's 10.0.2.15:guest_port, so a client
    inside the namespace reaches a server in the guest.  Note that qemu
    accepts such connections even before the guest listens (and then closes
    them): wait for a real reply, not for a TCP connect.
    ``close()`` (also on exit of the with-block) stops qemu if it still runs
    (SIGTERM, then SIGKILL) and removes the share dir.
    """

    def __init__(self, script: str, netns, smp: int = 2, mem: int = 2048,
                 image: Image | None = None, keep_share: bool | None = None,
                 files: dict[str, str | bytes | os.PathLike] | None = None,
                 drives=(), hostfwd=()):
        self.script, self.netns = script, netns
        self.smp, self.mem, self.image = smp, mem, image
        self.keep_share = os.environ.get("NASD_KEEP_GUEST") == "1" \
            if keep_share is None else keep_share
        self.files = dict(files or {})
        self.drives = [os.fspath(d) for d in drives]
        self.hostfwd = [(int(h), int(g)) for h, g in hostfwd]
        self.share: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.seconds = 0.0

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "Guest":
        qemu = shutil.which("qemu-system-x86_64")
        if not qemu:
            raise GuestError("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
        img = self.image or ensure_image()
        share = Path(tempfile.mkdtemp(prefix="nasd-guest-"))
        self.share = share
        os.chmod(share, 0o755)
        (share / "cmd.sh").write_text(self.script)
        for name, content in self.files.items():
            dest = share / name
            if dest.resolve().parent != share.resolve() and \
                    share.resolve() not in dest.resolve().parents:
                raise ValueError(f"file name {name!r} escapes the share dir")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                dest.write_bytes(content)
            elif isinstance(content, os.PathLike):
                shutil.copyfile(content, dest)
            else:
                dest.write_text(content)
            os.chmod(dest, 0o755)
        cmd = _qemu_argv(qemu, img, share, self.smp, self.mem, self.drives, self.hostfwd)
        self.t0 = time.monotonic()
        with open(share / "console.log", "wb") as con:
            self.proc = self.netns.popen(cmd, stdout=con, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def power_cut(self) -> None:
        """SIGKILL qemu (by PID) and reap it: a power failure for the guest."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.seconds = time.monotonic() - self.t0

    def wait(self, timeout: float = 300) -> GuestResult:
        """Wait for the script to end (the guest powers off); its GuestResult.

        Raises GuestError (console tail) if no exit status was recorded
        within ``timeout`` s or qemu exited without one; qemu is stopped."""
        assert self.proc is not None and self.share is not None, "start() first"
        try:
            self.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill(self.proc)
        secs = self.seconds = time.monotonic() - self.t0
        share = self.share
        rc_file = share / "rc"
        if not rc_file.exists():
            why = f"timed out after {timeout}s" if timed_out else \
                f"qemu exited {self.proc.returncode} after {secs:.0f}s"
            where = f"share dir kept: {share}" if self.keep_share else \
                "set NASD_KEEP_GUEST=1 to keep the share dir"
            raise GuestError(f"guest recorded no exit status ({why}); {where}; "
                             f"console tail:\n{_tail(share / 'console.log')}")
        return GuestResult(
            rc=int(rc_file.read_text().strip() or "-1"),
            stdout=self.read("stdout"), stderr=self.read("stderr"),
            console=self.console(), seconds=secs)

    def close(self) -> None:
        if self.proc is not None:
            _kill(self.proc)
        if self.share is not None:
            if self.keep_share:
                _log(f"guest share dir kept: {self.share}")
            else:
                shutil.rmtree(self.share, ignore_errors=True)
            self.share = None

    def __enter__(self) -> "Guest":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the guest left in the share --------------------------------
    def read(self, name: str) -> str:
        """Text of a file in the share ("" if missing): stdout, stderr, rc, ..."""
        if self.share is None:
            return ""
        p = self.share / name
        return p.read_text(errors="replace") if p.exists() else ""

    def console(self) -> str:
        return self.read("console.log")

    def console_tail(self, n: int = 40) -> str:
        return _tail(self.share / "console.log", n) if self.share else "(no console log)"


def run_guest(script: str, netns, timeout: float = 300, smp: int = 2,
              mem: int = 2048, image: Image | None = None,
              keep_share: bool | None = None,
              files: dict[str, str | bytes] | None = None,
              drives=(), hostfwd=()) -> GuestResult:
    """Boot the guest inside ``netns``, run ``script`` with sh, return its result.

    The script runs as root in the guest with the 9p share at /share (it may
    leave files there; ``files`` maps extra names to contents to put beside
    cmd.sh, e.g. {"helper.sh": "..."} appears as /share/helper.sh); 10.0.2.2
    is the namespace's 127.0.0.1.  Raises
    GuestError (with the console tail) if the guest did not record an exit
    status within ``timeout`` seconds.  The share dir (cmd.sh, stdout,
    stderr, rc, console.log) is removed afterwards unless ``keep_share`` or
    env NASD_KEEP_GUEST=1; the console log is also in ``GuestResult.console``.
    ``drives`` and ``hostfwd``: extra disks and forwarded ports, see
    :class:`Guest` (which also runs guests that do not end by themselves).
    """
    g = Guest(script, netns, smp=smp, mem=mem, image=image, keep_share=keep_share,
              files=files, drives=drives, hostfwd=hostfwd)
    try:
        g.start()
        return g.wait(timeout)
    finally:
        g.close()
