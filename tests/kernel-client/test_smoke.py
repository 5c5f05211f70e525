"""Kernel NFS client smoke test: the same POSIX script against Ganesha and nasd.

A qemu guest (Debian bookworm kernel, TCG) mounts the server with NFSv3 over
TCP through qemu user networking; the server listens on 127.0.0.1 inside a
throw-away network namespace.  See docs/testing.md.

    python3 -m pytest tests/kernel-client/test_smoke.py -s            # both
    python3 -m pytest tests/kernel-client/test_smoke.py -k ganesha -s
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from rig import vm  # noqa: E402
from rig.ganesha import Ganesha  # noqa: E402
from rig.netns import Netns  # noqa: E402

NASD = Path(os.environ.get("NASD_BINARY") or REPO / "target" / "release" / "nasd")
DATA_BYTES = 4 * 1024 * 1024
PATTERN = b"nasd kernel-client smoke pattern\n"
HELLO = "hello from the host\n"


_MISSING = vm.missing_prerequisite("kernel-client tests")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))


@pytest.fixture(scope="session")
def guest_image() -> vm.Image:
    return vm.ensure_image()


def _pattern_data() -> bytes:
    return (PATTERN * (DATA_BYTES // len(PATTERN) + 1))[:DATA_BYTES]


GUEST_SCRIPT = r"""
set -eux
M=/mnt/nfs
{setup}
timeout 90 mount -t nfs -o {opts} {server}:{path} $M
grep " $M " /proc/mounts >&2
echo "hello: $(cat $M/hello.txt)"
# 4 MiB of a repeating pattern (the host knows its md5).
yes '{pattern}' | head -c {nbytes} > /tmp/data
dd if=/tmp/data of=$M/data.bin bs=64k conv=fsync status=none
mkdir $M/dir1
mv $M/data.bin $M/dir1/moved.bin
echo 3 > /proc/sys/vm/drop_caches
echo "md5: $(md5sum < $M/dir1/moved.bin | cut -d' ' -f1)"
echo "size: $(stat -c %s $M/dir1/moved.bin)"
ls -l $M/dir1 >&2
echo "from the guest" > $M/keep.txt
sync
echo "list1: $(cd $M && ls | tr '\n' ' ')"
rm $M/dir1/moved.bin
rmdir $M/dir1
echo "list2: $(cd $M && ls | tr '\n' ' ')"
ls -la $M >&2
umount $M
echo "done"
"""


def _stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def guest_script(opts: str, path: str, server: str = "10.0.2.2", setup: str = "") -> str:
    """GUEST_SCRIPT mounting ``server:path`` with ``opts``, after the shell lines ``setup``."""
    return GUEST_SCRIPT.format(opts=opts, path=path, server=server, setup=setup, nbytes=DATA_BYTES,
                               pattern=PATTERN.decode().rstrip("\n"))


@contextlib.contextmanager
def _nasd(ns: Netns, export: Path, logdir: Path, host: str = "127.0.0.1", args=()):
    port = 2049
    log = open(logdir / "nasd.log", "wb")
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    proc = ns.popen([str(NASD), "serve", str(export), "--listen", listen,
                     "--no-root-squash", *args], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
    try:
        try:
            ns.wait_tcp(port, host=host, timeout=30, proc=proc)
        except Exception as e:
            raise RuntimeError(f"nasd did not start: {e}\n"
                               f"{(logdir / 'nasd.log').read_text(errors='replace')[-3000:]}")
        yield {"port": port, "mount_port": port, "path": str(export)}
    finally:
        _stop(proc)
        log.close()
        print(f"--- nasd log (exit {proc.returncode}) ---")
        print((logdir / "nasd.log").read_text(errors="replace")[-3000:])


@contextlib.contextmanager
def _ganesha(ns: Netns, export: Path, logdir: Path):
    if not shutil.which("ganesha.nfsd"):
        pytest.skip("ganesha.nfsd missing: apt-get install nfs-ganesha nfs-ganesha-vfs rpcbind")
    g = Ganesha(export, netns=ns)
    try:
        with g:
            yield {"port": g.port, "mount_port": g.mount_port, "path": g.export_path, "pseudo": g.pseudo}
    finally:
        (logdir / "ganesha.log").write_text(g.log)


SERVERS = {"ganesha": _ganesha, "nasd": _nasd}


@pytest.mark.parametrize("server", ["ganesha", "nasd"])
def test_smoke_v3(server: str, tmp_path: Path, guest_image: vm.Image) -> None:
    export = tmp_path / "export"
    export.mkdir()
    os.chmod(export, 0o777)
    (export / "hello.txt").write_text(HELLO)
    with Netns() as ns, SERVERS[server](ns, export, tmp_path) as srv:
        opts = (f"vers=3,proto=tcp,port={srv['port']},mountport={srv['mount_port']},"
                f"mountproto=tcp,nolock")
        res = vm.run_guest(guest_script(opts, srv["path"]), ns, timeout=300, image=guest_image)
    print(f"\n===== {server}: rc={res.rc} ({res.seconds:.1f}s) =====")
    print(f"--- {server} stdout ---\n{res.stdout}")
    print(f"--- {server} stderr ---\n{res.stderr}")
    if res.rc != 0:
        print(f"--- {server} console tail ---\n{res.console[-3000:]}")

    _assert_script_ran(res, server, export)


def _assert_script_ran(res: vm.GuestResult, server: str, export: Path) -> None:
    """GUEST_SCRIPT ran to its end, and what it did is what the export holds."""
    assert res.rc == 0, f"guest script failed on {server}:\n{res.stderr[-2000:]}"
    out = dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)
    assert out["hello"] == HELLO.strip()
    assert out["md5"] == hashlib.md5(_pattern_data()).hexdigest()
    assert out["size"] == str(DATA_BYTES)
    assert out["list1"].split() == ["dir1", "hello.txt", "keep.txt"]
    assert out["list2"].split() == ["hello.txt", "keep.txt"]
    assert res.stdout.rstrip().endswith("done")
    # What the guest did is visible on the exported directory.
    assert (export / "keep.txt").read_text() == "from the guest\n"
    assert sorted(p.name for p in export.iterdir()) == ["hello.txt", "keep.txt"]


# qemu's user network gives the guest fec0::/64 and connects its fec0::2 to ::1 of the
# namespace qemu runs in. `nodad`: the address is usable at once, without waiting out
# duplicate address detection.
GUEST_IPV6 = """NIC=$(ls /sys/class/net | grep -vx lo | head -n 1)
ip -6 addr add fec0::15/64 dev "$NIC" nodad"""


def test_smoke_v3_over_ipv6_through_the_embedded_portmapper(tmp_path: Path, guest_image: vm.Image) -> None:
    """The kernel client mounts nasd over IPv6 with no port given: mount.nfs asks the
    embedded rpcbind (v4/v3 GETADDR over tcp6) for MOUNT's and NFS's addresses."""
    export = tmp_path / "export"
    export.mkdir()
    os.chmod(export, 0o777)
    (export / "hello.txt").write_text(HELLO)
    with Netns() as ns, _nasd(ns, export, tmp_path, host="::1", args=["--portmap"]) as srv:
        script = guest_script("vers=3,proto=tcp6,mountproto=tcp6,nolock", srv["path"],
                              server="[fec0::2]", setup=GUEST_IPV6)
        res = vm.run_guest(script, ns, timeout=300, image=guest_image)
    print(f"\n===== nasd over IPv6: rc={res.rc} ({res.seconds:.1f}s) =====")
    print(f"--- stdout ---\n{res.stdout}\n--- stderr ---\n{res.stderr[-3000:]}")
    _assert_script_ran(res, "nasd over IPv6", export)
    # The mount as /proc/mounts shows it: over IPv6 to the server's fec0::2, MOUNT too.
    mounted = [line for line in res.stderr.splitlines() if " /mnt/nfs nfs " in line]
    assert mounted and "addr=fec0::2" in mounted[0] and "mountproto=tcp6" in mounted[0], mounted


@pytest.mark.parametrize("server", ["ganesha", "nasd"])
def test_smoke_v42(server: str, tmp_path: Path, guest_image: vm.Image) -> None:
    """`mount -o vers=4.2`: Ganesha serves the same script over NFSv4.2; nasd (NFSv3
    only so far) must refuse at once with "version not supported" (PROG_MISMATCH 3-3),
    not hang the client."""
    export = tmp_path / "export"
    export.mkdir()
    os.chmod(export, 0o777)
    (export / "hello.txt").write_text(HELLO)
    with Netns() as ns, SERVERS[server](ns, export, tmp_path) as srv:
        path = srv.get("pseudo", srv["path"])
        opts = f"vers=4.2,proto=tcp,port={srv['port']}"
        res = vm.run_guest(guest_script(opts, path), ns, timeout=300, image=guest_image)
    print(f"\n===== {server} v4.2: rc={res.rc} ({res.seconds:.1f}s) =====")
    print(f"--- stdout ---\n{res.stdout}\n--- stderr ---\n{res.stderr[-3000:]}")
    if server == "nasd":
        assert res.rc != 0, "a v4.2 mount of an NFSv3-only server must fail"
        assert "not supported" in res.stderr, res.stderr[-2000:]
        # The script stops at the mount, with its status: `timeout` would give 124 had
        # the refusal made the mount retry until it was killed.
        assert res.rc != 124, "the mount went on retrying until timeout killed it"
        return
    assert res.rc == 0, f"guest script failed on {server}:\n{res.stderr[-2000:]}"
    out = dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)
    assert out["hello"] == HELLO.strip()
    assert out["md5"] == hashlib.md5(_pattern_data()).hexdigest()
    assert out["list2"].split() == ["hello.txt", "keep.txt"]
