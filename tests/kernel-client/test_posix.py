"""POSIX semantics of nasd through the Linux kernel NFSv3 client.

Five guest boots (each ~13 s under TCG plus its workload), shared by the
test functions of this module through module-scoped fixtures:

* ``posix_run``: nasd ``--no-root-squash``, explicit ports; sections for
  create/append/truncate/chmod+chown/rename/hard links/symlinks/mkdir -p/
  a 10,000-file tree/FIFO/unpacking a real source tarball (+ cp -r, rm -rf).
  The guest prints ``key: value`` lines; the host checks them and the export
  dir afterwards (os.stat, sha256, a local ``tar -x`` of the same tarball).
* ``squash_run``: three servers in one namespace: nasd with the default
  root_squash on 2049 (explicit ports), and nasd ``--portmap`` on 2050 that
  the guest mounts with only ``vers=3,nolock`` (ports from the embedded
  portmapper on 111); and a third nasd on 2051 mounted with ``nconnect=4``,
  written by four fio jobs at once over four connections.
* ``restart_run``: the guest holds open fds on a file, reads half of it,
  asks the host (a marker file created through NFS) to kill -9 nasd; the host
  keeps it down for a few seconds and starts it again with the same state
  dir, while the guest continues reading from the old fd (old file handle).
* ``crash_run``: the guest writes files (fsync, O_SYNC, close, rename, rm) while
  the host SIGKILLs and restarts nasd three times; every finished file must be
  on the server intact (the new write verifier makes the client resend).
* ``fault_run``: nsx and fsx with the guest's NFS connections through a relay that
  breaks them in the middle of calls and replies; the client's retransmissions on
  the new connections must be answered as the first sending was. And a second
  nasd serving a 1 MiB tmpfs: writes and mkdirs past full fail with ENOSPC, and
  what was stored stays.

    python3 -m pytest tests/kernel-client/test_posix.py -s
    NASD_KEEP_GUEST=1 ...   # keep the guest's share dir (stdout/stderr/console)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for p in (str(TESTS), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from rig import vm  # noqa: E402
from rig.cutter import ConnectionCutter  # noqa: E402
from rig.nasd import Nasd  # noqa: E402
from rig.netns import Netns  # noqa: E402
from rig.nfsh import guest_exerciser_binary, nsx_tree_problems  # noqa: E402
import posix_helpers as ph  # noqa: E402

M = "/mnt/nfs"
BLOB_SIZE = 3 * 1024 * 1024 + 12345          # not a multiple of any block size
HELLO = "hello from the host\n"


_MISSING = vm.missing_prerequisite("kernel-client tests")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    return _sha(path.read_bytes())


class Run:
    """What one guest boot left behind."""

    def __init__(self, res: vm.GuestResult, export: Path, **extra):
        self.res = res
        self.kv = ph.parse_kv(res.stdout)
        self.export = export
        self.__dict__.update(extra)

    def section_ok(self, name: str) -> None:
        rc = self.kv.get(f"result {name}")
        assert rc == "0", (f"guest section {name!r} failed (rc={rc}); guest stderr "
                           f"tail:\n{self._stderr_of(name)}")

    def _stderr_of(self, name: str) -> str:
        err = self.res.stderr
        i = err.find(f"===== section {name}\n")
        if i >= 0:
            j = err.find("===== section ", i + 10)
            err = err[i:j if j >= 0 else len(err)]
        return err[-3000:]

    def __getitem__(self, key: str) -> str:
        assert key in self.kv, f"guest printed no {key!r}:\n{self.res.stdout[-2000:]}"
        return self.kv[key]


def _report(name: str, res: vm.GuestResult, srv_logs: str) -> None:
    print(f"\n===== {name}: rc={res.rc} ({res.seconds:.1f}s) =====")
    print(f"--- stdout ---\n{res.stdout}")
    print(f"--- stderr (tail) ---\n{res.stderr[-6000:]}")
    if res.rc != 0 or "FAIL" in res.stdout:
        print(f"--- console tail ---\n{res.console[-3000:]}")
    print(f"--- nasd log (tail) ---\n{srv_logs[-3000:]}")


def _nsx_result(r: "Run", result: str, entry: str, ops: int) -> dict:
    """The result line of an nsx run (``result`` its key), which must have done its
    ``ops`` with every answer the model's, and left the model's tree on the export (its
    ``entry`` lines)."""
    res = json.loads(r[result])
    assert res["ok"] is True and res["ops"] == ops, res
    lines = [json.loads(line.split(": ", 1)[1]) for line in r.res.stdout.splitlines()
             if line.startswith(f"{entry}: ")]
    problems = nsx_tree_problems(lines, r.export / "nsx")
    assert not problems, "\n".join(problems[:20])
    return res


def _fresh_export(base: Path) -> Path:
    """An empty export directory under `base` that the guest's root can list."""
    export = base / "export"
    export.mkdir()
    os.chmod(export, 0o755)
    return export


def _sections(texts: dict[str, str]) -> dict[str, str]:
    return {f"sec/{name}.sh": f"M={M}\n" + body for name, body in texts.items()}


@pytest.fixture(scope="module")
def guest_image() -> vm.Image:
    return vm.ensure_image()


@pytest.fixture(scope="module")
def workdir():
    """mkdtemp(name) -> Path; removed at module end (NASD_KEEP_GUEST=1 keeps).

    Not tmp_path_factory: other pytest runs on the machine prune old
    /tmp/pytest-of-*/pytest-N dirs, possibly while nasd still serves one."""
    made: list[str] = []

    def mk(name: str) -> Path:
        made.append(tempfile.mkdtemp(prefix=f"nasd-posix-{name}-"))
        return Path(made[-1])
    yield mk
    for d in made:
        if os.environ.get("NASD_KEEP_GUEST") == "1":
            print(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


# ===================================================================== posix
FSX_OPS = 3000
NSX_OPS = 2000
FSX_SEED = 20261127

POSIX_SECTIONS = {
    "create": r"""
cp /share/blob.bin $M/blob.bin
printf 'hello nfs\n' > $M/hello.txt
echo 3 > /proc/sys/vm/drop_caches
echo "create.sha: $(sha256sum < $M/blob.bin | cut -d' ' -f1)"
echo "create.size: $(stat -c %s $M/blob.bin)"
echo "create.hello: $(cat $M/hello.txt)"
echo "create.host_hello: $(cat $M/host-hello.txt)"
""",
    "append": r"""
printf 'one\n' > $M/app.txt
printf 'two\n' >> $M/app.txt
printf 'three\n' >> $M/app.txt
head -c 100000 /share/blob.bin > $M/app.bin
tail -c +100001 /share/blob.bin >> $M/app.bin
echo 3 > /proc/sys/vm/drop_caches
echo "append.txt: $(tr '\n' ',' < $M/app.txt)"
echo "append.sha: $(sha256sum < $M/app.bin | cut -d' ' -f1)"
""",
    "truncate": r"""
cp /share/blob.bin $M/trunc.bin
truncate -s 1000 $M/trunc.bin
echo "trunc.small_size: $(stat -c %s $M/trunc.bin)"
echo 3 > /proc/sys/vm/drop_caches
echo "trunc.small_sha: $(sha256sum < $M/trunc.bin | cut -d' ' -f1)"
truncate -s 5000 $M/trunc.bin
echo 3 > /proc/sys/vm/drop_caches
echo "trunc.large_size: $(stat -c %s $M/trunc.bin)"
echo "trunc.head_sha: $(head -c 1000 $M/trunc.bin | sha256sum | cut -d' ' -f1)"
echo "trunc.tail_nonzero: $(tail -c 4000 $M/trunc.bin | tr -d '\000' | wc -c)"
echo "trunc.tail_len: $(tail -c 4000 $M/trunc.bin | wc -c)"
cp /share/blob.bin $M/trunc0.bin
: > $M/trunc0.bin
echo "trunc.zero_size: $(stat -c %s $M/trunc0.bin)"
""",
    "perms": r"""
echo data > $M/own.txt
chown 1234:5678 $M/own.txt
chmod 0754 $M/own.txt
touch -m -d @981173106 $M/own.txt
mkdir $M/privdir
chown 4321:4321 $M/privdir
chmod 0700 $M/privdir
echo x > $M/sgid.txt
chmod 2755 $M/sgid.txt
mkdir $M/sticky
chmod 1777 $M/sticky
echo 3 > /proc/sys/vm/drop_caches
echo "perms.own: $(stat -c '%u %g %a %Y' $M/own.txt)"
echo "perms.privdir: $(stat -c '%u %g %a' $M/privdir)"
echo "perms.sgid: $(stat -c '%a' $M/sgid.txt)"
echo "perms.sticky: $(stat -c '%a' $M/sticky)"
""",
    "rename": r"""
mkdir $M/r1 $M/r2 $M/r1/sub
echo moved > $M/r1/file
echo inner > $M/r1/sub/inner
mv $M/r1/file $M/r2/renamed
mv $M/r1/sub $M/r2/sub2
echo new > $M/r2/a
echo old > $M/r1/b
mv $M/r2/a $M/r1/b
echo 3 > /proc/sys/vm/drop_caches
echo "rename.content: $(cat $M/r2/renamed)"
echo "rename.inner: $(cat $M/r2/sub2/inner)"
echo "rename.over: $(cat $M/r1/b)"
echo "rename.r1: $(ls -A $M/r1 | tr '\n' ' ')"
echo "rename.r2: $(ls -A $M/r2 | tr '\n' ' ')"
""",
    "hardlink": r"""
echo linked > $M/hl1
mkdir $M/hld
ln $M/hl1 $M/hld/hl2
echo "link.nlink: $(stat -c %h $M/hl1) $(stat -c %h $M/hld/hl2)"
i1=$(stat -c %i $M/hl1); i2=$(stat -c %i $M/hld/hl2)
if [ "$i1" = "$i2" ]; then echo "link.same_inode: yes"; else echo "link.same_inode: no $i1 $i2"; fi
echo " more" >> $M/hld/hl2
echo 3 > /proc/sys/vm/drop_caches
echo "link.content: $(tr '\n' '|' < $M/hl1)"
""",
    "symlink": r"""
mkdir $M/sl
echo target-data > $M/sl/target
ln -s target $M/sl/rel
ln -s ../host-hello.txt $M/sl/up
ln -s /nonexistent/x $M/sl/dangling
echo 3 > /proc/sys/vm/drop_caches
echo "symlink.rel: $(readlink $M/sl/rel)"
echo "symlink.follow: $(cat $M/sl/rel)"
echo "symlink.up: $(cat $M/sl/up)"
echo "symlink.dangling: $(readlink $M/sl/dangling)"
echo "symlink.type: $(stat -c %F $M/sl/rel)"
echo "symlink.ltype: $(stat -L -c %F $M/sl/rel)"
if [ -e $M/sl/dangling ]; then echo "symlink.dangling_exists: yes"; else echo "symlink.dangling_exists: no"; fi
""",
    "mkdirp": r"""
mkdir -p $M/a/b/c/d
echo "mkdirp.tree: $(cd $M && find a | sort | tr '\n' ' ')"
""",
    "fifo": r"""
mkfifo -m 0640 $M/fifo
echo 3 > /proc/sys/vm/drop_caches
echo "fifo.type: $(stat -c %F $M/fifo)"
echo "fifo.mode: $(stat -c %a $M/fifo)"
(echo through-the-fifo > $M/fifo &)
echo "fifo.data: $(timeout 30 cat $M/fifo)"
""",
    "fio": r"""
# fio's own checksums (crc32c in every block), several jobs at once
D="--name=direct --directory=$M --filename_format=fiod.\$jobnum --size=4m --numjobs=4"
rc=0
fio $D --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 \
    --verify=crc32c --verify_fatal=1 --group_reporting > /tmp/fio-direct.txt || rc=$?
echo "fio.direct: $rc"
B="--name=buffered --directory=$M --filename_format=fiob.\$jobnum --size=8m --numjobs=4 --rw=randwrite --bs=64k --ioengine=psync --direct=0 --verify=crc32c --verify_fatal=1 --randseed=4242"
rc=0
fio $B --do_verify=0 --end_fsync=1 > /tmp/fio-bw.txt || rc=$?
echo "fio.buffered_write: $rc"
echo 3 > /proc/sys/vm/drop_caches
rc=0
fio $B --verify_only > /tmp/fio-bv.txt || rc=$?
echo "fio.buffered_verify: $rc"
echo "fio.sizes: $(stat -c %s $M/fiod.0 $M/fiod.3 $M/fiob.0 $M/fiob.3 | tr '\n' ' ')"
echo "fio.sha_d1: $(sha256sum < $M/fiod.1 | cut -d' ' -f1)"
echo "fio.sha_b1: $(sha256sum < $M/fiob.1 | cut -d' ' -f1)"
# the check can fail: one block of fiob.0 zeroed through NFS
dd if=/dev/zero of=$M/fiob.0 bs=64k seek=5 count=1 conv=notrunc,fsync 2>/dev/null
echo 3 > /proc/sys/vm/drop_caches
if fio $B --verify_only > /tmp/fio-bc.txt 2>&1; then echo "fio.corrupt_verify: passed"; else echo "fio.corrupt_verify: failed"; fi
""",
    "tree10k": r"""
mkdir $M/tree
cd $M/tree
t0=$(date +%s)
# 100 dirs x 100 files, four dirs at a time (the guest is slow: TCG)
seq 0 99 | xargs -P 4 -I{} sh -ec "mkdir d{}; cd d{}; seq -f 'f%g' 0 99 | xargs touch"
t1=$(date +%s)
echo "tree.count: $(find . -type f | wc -l)"
echo "tree.dirs: $(find . -mindepth 1 -type d | wc -l)"
echo "tree.d7: $(ls d7 | wc -l)"
cd /
t2=$(date +%s)
rm -rf $M/tree/*
t3=$(date +%s)
echo "tree.left: $(ls -A $M/tree | wc -l)"
echo "tree.seconds: create $((t1-t0)) rm $((t3-t2))"
""",
    "tarball": r"""
mkdir $M/src /tmp/ref
tar -C /tmp/ref -xf /share/src.tar
tar -C $M/src -xf /share/src.tar
echo 3 > /proc/sys/vm/drop_caches
echo "tar.files: $(find $M/src -type f | wc -l)"
diff -r /tmp/ref $M/src >&2
echo "tar.vs_tmpfs: same"
cp -r $M/src $M/srccopy
echo 3 > /proc/sys/vm/drop_caches
diff -r $M/src $M/srccopy >&2
echo "tar.copy_diff: same"
(cd $M/srccopy && find . -type f -print0 | sort -z | xargs -0 sha256sum) > /tmp/copy.sha
echo "tar.copy_sha: $(sha256sum < /tmp/copy.sha | cut -d' ' -f1)"
echo "tar.copy_files: $(wc -l < /tmp/copy.sha)"
rm -rf $M/srccopy
if [ -e $M/srccopy ]; then echo "tar.copy_removed: no"; else echo "tar.copy_removed: yes"; fi
""",
    "fsx": r"""
# fsx (tests/rig/libnfs_helper/guest-exerciser.c): random I/O on one file through a
# buffered and an O_DIRECT descriptor, mmap and cache drops, every read checked
# against its model
cp /share/guest-exerciser /tmp/exerciser
chmod 755 /tmp/exerciser
/tmp/exerciser fsx $M/fsx.bin {ops} {seed} 4194304 /tmp/fsx-model > /tmp/fsx.out
echo "fsx.result: $(tail -n 1 /tmp/fsx.out)"
echo "fsx.model_sha: $(sha256sum < /tmp/fsx-model | cut -d' ' -f1)"
""".format(ops=FSX_OPS, seed=FSX_SEED),
    "nsx": r"""
# nsx (same program): random namespace changes in a tree seen through two more mounts
# of the export, two clients with caches of their own (nosharecache) that ask the
# server about every name (noac, lookupcache=none), checked against a model
O=$(awk -v m=$M '$2 == m {{print $4}}' /proc/mounts)
mkdir -p /mnt/a /mnt/b
mount -t nfs -o "$O,nosharecache,noac,lookupcache=none" 10.0.2.2:/ /mnt/a
mount -t nfs -o "$O,nosharecache,noac,lookupcache=none" 10.0.2.2:/ /mnt/b
cp /share/guest-exerciser /tmp/exerciser
chmod 755 /tmp/exerciser
/tmp/exerciser nsx /mnt/a /mnt/b /nsx {ops} {seed} > /tmp/nsx.out
echo "nsx.result: $(tail -n 1 /tmp/nsx.out)"
grep '"entry"' /tmp/nsx.out | sed 's/^/nsx.entry: /'
umount /mnt/a /mnt/b
""".format(ops=NSX_OPS, seed=FSX_SEED),
}
POSIX_ORDER = [("create", 120), ("append", 120), ("truncate", 120), ("perms", 60),
               ("rename", 60), ("hardlink", 60), ("symlink", 60), ("mkdirp", 60),
               ("fifo", 60), ("tarball", 300), ("fio", 300), ("fsx", 420), ("nsx", 420), ("tree10k", 420)]


@pytest.fixture(scope="module")
def posix_run(workdir, guest_image):
    base = workdir("posix")
    export = _fresh_export(base)
    (export / "host-hello.txt").write_text(HELLO)
    blob = os.urandom(BLOB_SIZE)
    tar_path, what = ph.source_tarball(base / "src.tar")
    ref = base / "ref"
    ref.mkdir()
    subprocess.run(["tar", "-C", str(ref), "-xf", str(tar_path)], check=True)
    prologue = (f"timeout 120 mount -t nfs -o {{opts}} 10.0.2.2:/ {M}\n"
                f'echo "result mount: $?"\ngrep " {M} " /proc/mounts >&2')
    epilogue = f'sync; timeout 60 umount {M}; echo "result umount: $?"'
    with Netns() as ns, Nasd(export, args=["--no-root-squash"], netns=ns) as srv:
        script = ph.guest_program(prologue.format(opts=srv.mount_options()), POSIX_ORDER,
                                  epilogue)
        files = {"blob.bin": blob, "src.tar": tar_path.read_bytes(),
                 "guest-exerciser": Path(guest_exerciser_binary()), **_sections(POSIX_SECTIONS)}
        res = vm.run_guest(script, ns, timeout=1500, image=guest_image, files=files)
        alive = srv.alive()
        _report(f"posix ({what})", res, srv.log())
    return Run(res, export, blob=blob, ref=ref, tar_what=what, server_alive=alive)


def test_posix_mount(posix_run):
    assert posix_run.server_alive, "nasd exited during the guest run (see its log above)"
    assert posix_run["result mount"] == "0"
    assert posix_run["guest"] == "done"
    assert posix_run["result umount"] == "0"


def test_create_write_read(posix_run):
    r = posix_run
    r.section_ok("create")
    want = _sha(r.blob)
    assert r["create.sha"] == want
    assert r["create.size"] == str(BLOB_SIZE)
    assert r["create.hello"] == "hello nfs"
    assert r["create.host_hello"] == HELLO.strip()
    assert _file_sha(r.export / "blob.bin") == want
    assert (r.export / "hello.txt").read_text() == "hello nfs\n"


def test_append(posix_run):
    r = posix_run
    r.section_ok("append")
    assert r["append.txt"] == "one,two,three,"
    assert (r.export / "app.txt").read_text() == "one\ntwo\nthree\n"
    assert r["append.sha"] == _sha(r.blob)
    assert _file_sha(r.export / "app.bin") == _sha(r.blob)


def test_truncate(posix_run):
    r = posix_run
    r.section_ok("truncate")
    assert r["trunc.small_size"] == "1000"
    assert r["trunc.small_sha"] == _sha(r.blob[:1000])
    assert r["trunc.large_size"] == "5000"
    assert r["trunc.head_sha"] == _sha(r.blob[:1000])
    assert r["trunc.tail_len"] == "4000"
    assert r["trunc.tail_nonzero"] == "0"
    assert (r.export / "trunc.bin").read_bytes() == r.blob[:1000] + b"\0" * 4000
    assert r["trunc.zero_size"] == "0"
    assert (r.export / "trunc0.bin").stat().st_size == 0


def test_chmod_chown_as_root(posix_run):
    r = posix_run
    r.section_ok("perms")
    assert r["perms.own"] == "1234 5678 754 981173106"
    st = os.stat(r.export / "own.txt")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o754)
    assert int(st.st_mtime) == 981173106
    assert r["perms.privdir"] == "4321 4321 700"
    st = os.stat(r.export / "privdir")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4321, 4321, 0o700)
    assert r["perms.sgid"] == "2755"
    assert stat.S_IMODE(os.stat(r.export / "sgid.txt").st_mode) == 0o2755
    assert r["perms.sticky"] == "1777"
    assert stat.S_IMODE(os.stat(r.export / "sticky").st_mode) == 0o1777


def test_rename_across_dirs(posix_run):
    r = posix_run
    r.section_ok("rename")
    assert r["rename.content"] == "moved"
    assert r["rename.inner"] == "inner"
    assert r["rename.over"] == "new"
    assert r["rename.r1"].split() == ["b"]
    assert r["rename.r2"].split() == ["renamed", "sub2"]
    e = r.export
    assert not (e / "r1/file").exists() and not (e / "r1/sub").exists()
    assert (e / "r2/renamed").read_text() == "moved\n"
    assert (e / "r2/sub2/inner").read_text() == "inner\n"
    assert (e / "r1/b").read_text() == "new\n"
    assert not (e / "r2/a").exists()


def test_hard_links(posix_run):
    r = posix_run
    r.section_ok("hardlink")
    assert r["link.nlink"] == "2 2"
    assert r["link.same_inode"] == "yes"
    assert r["link.content"] == "linked| more|"
    a, b = os.stat(r.export / "hl1"), os.stat(r.export / "hld/hl2")
    assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)
    assert a.st_nlink == 2
    assert (r.export / "hl1").read_text() == "linked\n more\n"


def test_symlinks(posix_run):
    r = posix_run
    r.section_ok("symlink")
    assert r["symlink.rel"] == "target"
    assert r["symlink.follow"] == "target-data"
    assert r["symlink.up"] == HELLO.strip()
    assert r["symlink.dangling"] == "/nonexistent/x"
    assert r["symlink.type"] == "symbolic link"
    assert r["symlink.ltype"] == "regular file"
    assert r["symlink.dangling_exists"] == "no"
    sl = r.export / "sl"
    assert os.readlink(sl / "rel") == "target"
    assert os.readlink(sl / "up") == "../host-hello.txt"
    assert os.readlink(sl / "dangling") == "/nonexistent/x"
    assert stat.S_ISLNK(os.lstat(sl / "rel").st_mode)


def test_mkdir_p(posix_run):
    r = posix_run
    r.section_ok("mkdirp")
    assert r["mkdirp.tree"].split() == ["a", "a/b", "a/b/c", "a/b/c/d"]
    assert (r.export / "a/b/c/d").is_dir()
    assert list((r.export / "a/b/c/d").iterdir()) == []


def test_fifo(posix_run):
    r = posix_run
    r.section_ok("fifo")
    assert r["fifo.type"] == "fifo"
    assert r["fifo.mode"] == "640"
    assert r["fifo.data"] == "through-the-fifo"
    st = os.lstat(r.export / "fifo")
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640


def test_10k_file_tree(posix_run):
    r = posix_run
    print("tree timing:", r.kv.get("tree.seconds"))
    r.section_ok("tree10k")
    assert r["tree.count"] == "10000"
    assert r["tree.dirs"] == "100"
    assert r["tree.d7"] == "100"
    assert r["tree.left"] == "0"
    assert (r.export / "tree").is_dir()
    assert list((r.export / "tree").iterdir()) == []


def test_tarball_unpack_matches_local(posix_run):
    r = posix_run
    r.section_ok("tarball")
    want = ph.tree_manifest(r.ref)
    got = ph.tree_manifest(r.export / "src")
    assert len(want) > 100, f"tarball too small ({r.tar_what})"
    assert r["tar.files"] == str(sum(1 for v in want.values() if v[0] == "f"))
    assert r["tar.vs_tmpfs"] == "same"
    assert sorted(got) == sorted(want)
    diffs = [(k, want[k], got[k]) for k in sorted(want) if want[k] != got[k]]
    assert not diffs, f"{len(diffs)} entries differ (want, got), first: {diffs[:5]}"
    # the tar's numeric owner really was applied (chown through tar)
    assert all(v[3:5] == (ph.TAR_UID, ph.TAR_GID) for v in got.values())


def test_concurrent_io_verified_through_the_server(posix_run):
    """Data written by several fio jobs at once reads back intact: O_DIRECT 4 KiB random
    writes, 16 in flight per job, each a WRITE and its check a READ sent to nasd; and
    buffered 64 KiB writes, flushed and COMMITted, checked after the guest dropped its
    page cache, so that the reads reach nasd. Zeroing one block through NFS must make
    the same check fail."""
    r = posix_run
    r.section_ok("fio")
    assert r["fio.direct"] == "0", "O_DIRECT writes read back wrong (fio verify)"
    assert r["fio.buffered_write"] == "0"
    assert r["fio.buffered_verify"] == "0", "buffered writes read back wrong after a cache drop"
    assert r["fio.sizes"].split() == [str(4 << 20)] * 2 + [str(8 << 20)] * 2
    # what the guest read is what nasd stored
    assert r["fio.sha_d1"] == _file_sha(r.export / "fiod.1")
    assert r["fio.sha_b1"] == _file_sha(r.export / "fiob.1")
    assert r["fio.corrupt_verify"] == "failed", "fio's verification missed a zeroed block"
    assert (r.export / "fiob.0").read_bytes()[5 << 16:6 << 16] == bytes(1 << 16)


def test_fsx_through_the_page_cache_direct_io_and_mmap(posix_run):
    """fsx in the guest: random writes, reads, truncations, syncs and reopenings of one
    file through a buffered and an O_DIRECT descriptor, with mmap reads and writes and
    cache drops between them, every read checked against the program's model. The file
    nasd stored must be the model."""
    r = posix_run
    r.section_ok("fsx")
    res = json.loads(r["fsx.result"])
    assert res["ok"] is True and res["ops"] == FSX_OPS, res
    for kind in ("write", "read", "truncate", "commit", "reopen", "big_write", "mmap_or_dropcaches"):
        assert res[kind] > 0, (kind, res)
    assert (r.export / "fsx.bin").stat().st_size == res["size"]
    assert _file_sha(r.export / "fsx.bin") == r["fsx.model_sha"]


def test_nsx_namespace_changes_through_two_kernel_clients(posix_run):
    """nsx in the guest: random creates (exclusive), mkdirs, symlinks, unlinks, rmdirs,
    renames and links in one tree through two mounts that share no cache, each answer
    checked against a model, with listings and lookups through either mount. The tree
    nasd stored must be the model's."""
    r = posix_run
    r.section_ok("nsx")
    res = _nsx_result(r, "nsx.result", "nsx.entry", NSX_OPS)
    for kind in ("create", "mkdir", "symlink", "unlink", "rmdir", "rename", "link", "chmod"):
        assert 0 < res[f"{kind}_errors"] < res[kind], (kind, res)


def test_cp_r_and_rm_rf(posix_run):
    r = posix_run
    r.section_ok("tarball")
    assert r["tar.copy_diff"] == "same"
    # sha256sum list of the copy, in the guest's format, computed from the local unpack
    lines = []
    for dirpath, _d, files in os.walk(r.ref):
        for f in files:
            full = Path(dirpath) / f
            lines.append(("./" + str(full.relative_to(r.ref))).encode())
    lines.sort()
    text = b"".join(_file_sha(r.ref / p.decode()[2:]).encode() + b"  " + p + b"\n"
                    for p in lines)
    assert r["tar.copy_files"] == str(len(lines))
    assert r["tar.copy_sha"] == _sha(text)
    assert r["tar.copy_removed"] == "yes"
    assert not (r.export / "srccopy").exists()


# ============================================================ squash + portmap
SQUASH_SECTIONS = {
    "squash": r"""
try() { if out=$("$@" 2>&1); then rc=0; else rc=$?; fi; printf '%s rc=%s' "$out" "$rc" | tr '\n' ' '; }
echo created > $M/rootfile
echo 3 > /proc/sys/vm/drop_caches
echo "squash.owner: $(stat -c '%u %g' $M/rootfile)"
echo "squash.chown: $(try chown 1234 $M/rootfile)"
echo "squash.chgrp: $(try chgrp 1234 $M/rootfile)"
echo "squash.chown_other: $(try chown 0 $M/hostfile)"
echo "squash.chmod_own: $(try chmod 0600 $M/rootfile)"
echo "squash.chmod_other: $(try chmod 0666 $M/hostfile)"
echo "squash.read_secret: $(try cat $M/secret)"
echo "squash.mkdir_owner: $(mkdir $M/rootdir && stat -c '%u %g' $M/rootdir)"
""",
    "portmap": r"""
M=/mnt/nfs2
timeout 120 mount -t nfs -o vers=3,nolock 10.0.2.2:/ $M
grep " $M " /proc/mounts >&2
echo "portmap.opts: $(grep " $M " /proc/mounts | cut -d' ' -f4)"
echo "portmap.hello: $(cat $M/pm-hello.txt)"
cp /share/blob.bin $M/pm.bin
printf 'written via portmap\n' > $M/pm-out.txt
echo 3 > /proc/sys/vm/drop_caches
echo "portmap.sha: $(sha256sum < $M/pm.bin | cut -d' ' -f1)"
echo "portmap.out: $(cat $M/pm-out.txt)"
timeout 60 umount $M
echo "portmap.umount: ok"
""",
    "nconnect": r"""
M=/mnt/nfs3
P=2051
mkdir -p $M
timeout 120 mount -t nfs -o vers=3,proto=tcp,port=$P,mountport=$P,mountproto=tcp,nolock,nconnect=4 10.0.2.2:/ $M
grep " $M " /proc/mounts >&2
echo "nconnect.opts: $(grep " $M " /proc/mounts | cut -d' ' -f4)"
# four jobs of O_DIRECT 4 KiB random writes, 16 in flight each, spread over the connections
rc=0
fio --name=nc --directory=$M --filename_format=nc.\$jobnum --size=4m --numjobs=4 \
    --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 \
    --verify=crc32c --verify_fatal=1 --group_reporting > /tmp/fio-nc.txt || rc=$?
echo "nconnect.fio: $rc"
echo "nconnect.connections: $(ss -Htn state established dst 10.0.2.2 dport = :$P | wc -l)"
echo "nconnect.sha1: $(sha256sum < $M/nc.1 | cut -d' ' -f1)"
timeout 60 umount $M
echo "nconnect.umount: ok"
""",
}


@pytest.fixture(scope="module")
def squash_run(workdir, guest_image):
    base = workdir("squash")
    export, pm_export = base / "export", base / "pm-export"
    export.mkdir()
    pm_export.mkdir()
    os.chmod(export, 0o777)
    os.chmod(pm_export, 0o777)
    (export / "hostfile").write_text("owned by 1000\n")
    os.chown(export / "hostfile", 1000, 1000)
    os.chmod(export / "hostfile", 0o644)
    (export / "secret").write_text("secret\n")
    os.chown(export / "secret", 1000, 1000)
    os.chmod(export / "secret", 0o600)
    (pm_export / "pm-hello.txt").write_text(HELLO)
    (base / "nc").mkdir()
    nc_export = _fresh_export(base / "nc")
    blob = os.urandom(BLOB_SIZE)
    with Netns() as ns, \
            Nasd(export, netns=ns) as srv, \
            Nasd(pm_export, args=["--portmap"], netns=ns, port=2050) as pm, \
            Nasd(nc_export, args=["--no-root-squash", "--metrics", "127.0.0.1:9101"], netns=ns, port=2051) as nc:
        ns.wait_tcp(111)
        prologue = (f"timeout 120 mount -t nfs -o {srv.mount_options()} 10.0.2.2:/ {M}\n"
                    f'echo "result mount: $?"')
        epilogue = f'timeout 60 umount {M}; echo "result umount: $?"'
        script = ph.guest_program(prologue, [("squash", 120), ("portmap", 300), ("nconnect", 300)], epilogue)
        res = vm.run_guest(script, ns, timeout=900, image=guest_image,
                           files={"blob.bin": blob, **_sections(SQUASH_SECTIONS)})
        metrics = ns.call(lambda: urllib.request.urlopen("http://127.0.0.1:9101/metrics", timeout=10).read().decode(), timeout=30)
        _report("squash+portmap+nconnect", res,
                srv.log() + "\n--- portmap nasd ---\n" + pm.log() + "\n--- nconnect nasd ---\n" + nc.log())
    return Run(res, export, blob=blob, pm_export=pm_export, nc_export=nc_export, nc_metrics=metrics)


def test_nconnect_spreads_calls_over_four_connections_and_keeps_the_data(squash_run):
    """`nconnect=4`: the kernel client opens four connections to one server and spreads
    its calls over them; four fio jobs of O_DIRECT random writes (16 in flight each)
    read back intact, and nasd counts the four connections (and the MOUNT one)."""
    r = squash_run
    r.section_ok("nconnect")
    assert "nconnect=4" in r["nconnect.opts"], r["nconnect.opts"]
    assert r["nconnect.fio"] == "0", "data written over four connections read back wrong (fio verify)"
    assert r["nconnect.connections"] == "4", "the guest did not hold four connections to nasd"
    assert r["nconnect.sha1"] == _file_sha(r.nc_export / "nc.1")
    assert [(r.nc_export / f"nc.{i}").stat().st_size for i in range(4)] == [4 << 20] * 4
    counts = {line.split()[0]: int(line.split()[1]) for line in r.nc_metrics.splitlines()
              if line and not line.startswith("#") and " " in line and line.split()[1].isdigit()}
    assert counts.get("nasd_connections_total", 0) >= 4, r.nc_metrics[:2000]


def test_root_squash_create_owned_by_anon(squash_run):
    r = squash_run
    assert r["result mount"] == "0"
    r.section_ok("squash")
    assert r["squash.owner"] == "65534 65534"
    st = os.stat(r.export / "rootfile")
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    assert r["squash.mkdir_owner"] == "65534 65534"
    assert os.stat(r.export / "rootdir").st_uid == 65534


def test_root_squash_chown_chmod_denied(squash_run):
    r = squash_run
    r.section_ok("squash")
    for key in ("squash.chown", "squash.chgrp", "squash.chown_other", "squash.chmod_other"):
        assert "Operation not permitted" in r[key] and r[key].endswith("rc=1"), (key, r[key])
    # the squashed user owns rootfile, so chmod of it is allowed
    assert r["squash.chmod_own"].strip() == "rc=0"
    assert stat.S_IMODE(os.stat(r.export / "rootfile").st_mode) == 0o600
    st = os.stat(r.export / "rootfile")
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    st = os.stat(r.export / "hostfile")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o644)
    assert "Permission denied" in r["squash.read_secret"]
    assert r["squash.read_secret"].endswith("rc=1")


def test_portmap_mount_without_ports(squash_run):
    r = squash_run
    r.section_ok("portmap")
    opts = r["portmap.opts"].split(",")
    assert "port=2050" in opts and "mountport=2050" in opts, opts
    assert r["portmap.hello"] == HELLO.strip()
    assert r["portmap.sha"] == _sha(r.blob)
    assert _file_sha(r.pm_export / "pm.bin") == _sha(r.blob)
    assert r["portmap.out"] == "written via portmap"
    assert (r.pm_export / "pm-out.txt").read_text() == "written via portmap\n"
    assert r["portmap.umount"] == "ok"


# ================================================================== restart
BIG_SIZE = 8 * 1024 * 1024
# nasd stays down at least this long, and until the guest has seen it down: under
# emulation on a busy host the guest's probe loop can take longer than any fixed time.
DOWN_SECONDS = 5
DOWN_SEEN_WAIT_MAX = 300
RESTART_SECTIONS = {
    "handles": r"""
ls -la $M $M/sub >&2
exec 3< $M/big.bin
exec 4>> $M/wlog.txt
echo before >&4
dd bs=1048576 count=3 iflag=fullblock of=/tmp/part1 <&3 2>/dev/null
echo "handles.part1_size: $(stat -c %s /tmp/part1)"
echo "handles.other1_pre: $(cat $M/other1.txt)"
stat $M/sub/other2.txt >&2
sync
# The signal goes over the 9p share, not NFS: a marker made over NFS (CREATE, then
# SETATTR) could get the server killed between the two calls, and the guest would then
# sit in the SETATTR through the whole outage without seeing the server down.
touch /share/restart-now
# wait until the host has killed the server (connect refused)
down=no
i=0
while [ $i -lt 150 ]; do
    if ! timeout 2 bash -c 'exec 5<>/dev/tcp/10.0.2.2/2049' 2>/dev/null; then down=yes; break; fi
    sleep 0.2
    i=$((i+1))
done
echo "handles.down_observed: $down"
# The host keeps the server down until this says the guest has looked.
touch /share/down-seen
echo 3 > /proc/sys/vm/drop_caches
t0=$(date +%s)
# these run while the server is down; the hard mount retries until it is back
timeout 240 cat <&3 > /tmp/part2
t1=$(date +%s)
echo "handles.blocked_seconds: $((t1-t0))"
cat /tmp/part1 /tmp/part2 | sha256sum | cut -d' ' -f1 | sed 's/^/handles.sha: /'
echo "handles.other1: $(cat $M/other1.txt)"
echo "handles.other2: $(cat $M/sub/other2.txt)"
echo "handles.stat2: $(stat -c %s $M/sub/other2.txt)"
echo after >&4
exec 4>&-
exec 3<&-
echo "handles.wlog: $(tr '\n' ',' < $M/wlog.txt)"
echo new-after-restart > $M/sub/new.txt
echo "handles.ls: $(ls $M/sub | tr '\n' ' ')"
""",
}


def script_for_restart(srv) -> str:
    prologue = (f"timeout 120 mount -t nfs -o {srv.mount_options()} 10.0.2.2:/ {M}\n"
                f'echo "result mount: $?"')
    epilogue = f'timeout 60 umount {M}; echo "result umount: $?"'
    return ph.guest_program(prologue, [("handles", 420)], epilogue)


@pytest.fixture(scope="module")
def restart_run(workdir, guest_image):
    export = _fresh_export(workdir("restart"))
    big = os.urandom(BIG_SIZE)
    (export / "big.bin").write_bytes(big)
    (export / "other1.txt").write_text("other one\n")
    (export / "sub").mkdir()
    (export / "sub/other2.txt").write_text("other two\n")
    events: dict[str, object] = {}
    stop = threading.Event()

    with Netns() as ns, Nasd(export, args=["--no-root-squash"], netns=ns) as srv:
        guest = vm.Guest(script_for_restart(srv), ns, image=guest_image, files=_sections(RESTART_SECTIONS))

        def restarter():
            try:
                while not stop.is_set():
                    if guest.share is not None and (guest.share / "restart-now").exists():
                        break
                    time.sleep(0.05)
                else:
                    return
                events["kill_rc"] = srv.kill(signal.SIGKILL)
                events["killed_at"] = killed_at = time.monotonic()
                while not (guest.share / "down-seen").exists() and time.monotonic() < killed_at + DOWN_SEEN_WAIT_MAX:
                    time.sleep(0.1)
                events["down_seen_after"] = time.monotonic() - killed_at
                time.sleep(max(0.0, killed_at + DOWN_SECONDS - time.monotonic()))
                srv.start()
                events["restarted_at"] = time.monotonic()
            except BaseException as e:   # reported by the test
                events["error"] = repr(e)

        th = threading.Thread(target=restarter, daemon=True)
        th.start()
        try:
            guest.start()
            res = guest.wait(timeout=600)
        finally:
            stop.set()
            th.join(timeout=60)
            guest.close()
        _report("restart", res, srv.log())
    return Run(res, export, big=big, events=events)


def test_handles_survive_kill9_restart(restart_run):
    r = restart_run
    ev = r.events
    assert "error" not in ev, ev.get("error")
    assert "restarted_at" in ev, f"the host never restarted nasd: {ev}"
    assert ev["kill_rc"] == -signal.SIGKILL
    r.section_ok("handles")
    assert r["handles.part1_size"] == str(3 * 1024 * 1024)
    assert r["handles.down_observed"] == "yes"
    assert r["handles.sha"] == _sha(r.big)
    assert r["handles.other1"] == "other one"
    assert r["handles.other2"] == "other two"
    assert r["handles.stat2"] == str(len("other two\n"))
    assert r["handles.wlog"] == "before,after,"
    assert (r.export / "wlog.txt").read_text() == "before\nafter\n"
    assert (r.export / "sub/new.txt").read_text() == "new-after-restart\n"
    assert r["handles.ls"].split() == ["new.txt", "other2.txt"]
    assert r["result umount"] == "0"


# ================================================================== crash
# The kernel client writes a 96 MiB O_DIRECT file and then many small ones (fsync ->
# COMMIT, O_SYNC -> FILE_SYNC WRITEs, plain close -> UNSTABLE WRITEs + COMMIT, write +
# rename, remove) while the host SIGKILLs and restarts nasd three times: first in the
# middle of the O_DIRECT write, then at random. Each restart brings a new write verifier, so the client
# must resend what it had not seen committed; the hard mount retries everything else.
# Every file the guest finished must end on the server byte for byte.
CRASH_KILLS = 3
# Fewer files than this written through the kills prove too little.
CRASH_MIN_FILES = 10
CRASH_FSX_OPS = 3000
CRASH_NSX_OPS = 1500
CRASH_SECTIONS = {
    "crash": r"""
mkdir -p $M/k
# fsx runs beside the writers, through the same kills: its reads (buffered, O_DIRECT,
# mmap) are checked against its model across every restart.
cp /share/guest-exerciser /tmp/exerciser
chmod 755 /tmp/exerciser
(rc=0; /tmp/exerciser fsx $M/fsx.bin {fsx_ops} {seed} 4194304 /tmp/fsx-model > /tmp/crashfsx.out 2>/tmp/crashfsx.err || rc=$?; echo $rc > /tmp/crashfsx.rc) &
fsx_pid=$!
# nsx too, through two more mounts: namespace changes whose replies a kill takes away
# must be answered from nasd's journal when the client sends them again, not run twice.
O=$(awk -v m=$M '$2 == m {print $4}' /proc/mounts)
mkdir -p /mnt/a /mnt/b
mount -t nfs -o "$O,nosharecache,noac,lookupcache=none" 10.0.2.2:/ /mnt/a
mount -t nfs -o "$O,nosharecache,noac,lookupcache=none" 10.0.2.2:/ /mnt/b
# /share/kills: how many times the host has killed nasd so far.
(k0=$(cat /share/kills 2>/dev/null || echo 0); rc=0; /tmp/exerciser nsx /mnt/a /mnt/b /nsx {nsx_ops} {seed} > /tmp/crashnsx.out 2>/tmp/crashnsx.err || rc=$?; echo $rc > /tmp/crashnsx.rc; echo $(( $(cat /share/kills 2>/dev/null || echo 0) - k0 )) > /tmp/crashnsx.kills) &
nsx_pid=$!
# One O_DIRECT write of 96 MiB: UNSTABLE WRITEs, then a COMMIT. The host kills nasd
# once 8 MiB have arrived, so the WRITE replies carry two verifiers and the client
# must send the data again.
head -c 96M /dev/urandom > /tmp/big
echo "crash.direct: $(sha256sum /tmp/big | cut -c1-64)"
dd if=/tmp/big of=$M/k/direct bs=96M count=1 oflag=direct status=none
rm /tmp/big
touch $M/k/.go
end=$(( $(date +%s) + 240 ))
i=0
while [ ! -e /share/stop ] && [ "$(date +%s)" -lt "$end" ]; do
  i=$((i+1))
  r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
  size=$(( (r % 48 + 1) * 65536 + r ))
  head -c $size /dev/urandom > /tmp/src
  sha=$(sha256sum /tmp/src | cut -c1-64)
  case $((i % 4)) in
    0) dd if=/tmp/src of=$M/k/f$i bs=1M conv=fsync status=none ;;
    1) dd if=/tmp/src of=$M/k/f$i bs=1M oflag=sync status=none ;;
    2) cp /tmp/src $M/k/f$i ;;
    3) cp /tmp/src $M/k/t$i; mv $M/k/t$i $M/k/f$i ;;
  esac
  echo "crash.file: f$i $size $sha"
  if [ $((i % 7)) -eq 0 ]; then rm $M/k/f$((i-3)); echo "crash.removed: f$((i-3))"; fi
done
echo "crash.count: $i"
wait $nsx_pid
echo "crash.nsx_rc: $(cat /tmp/crashnsx.rc)"
echo "crash.nsx_kills: $(cat /tmp/crashnsx.kills)"
echo "crash.nsx_result: $(tail -n 1 /tmp/crashnsx.out)"
grep '"entry"' /tmp/crashnsx.out | sed 's/^/crash.nsx_entry: /'
tail -n 30 /tmp/crashnsx.err >&2
umount /mnt/a /mnt/b
wait $fsx_pid
echo "crash.fsx_rc: $(cat /tmp/crashfsx.rc)"
echo "crash.fsx_result: $(tail -n 1 /tmp/crashfsx.out)"
echo "crash.fsx_model_sha: $(sha256sum < /tmp/fsx-model | cut -d' ' -f1)"
tail -n 60 /tmp/crashfsx.err >&2
grep -m1 '^[[:space:]]*bytes:' /proc/self/mountstats | sed 's/^[[:space:]]*bytes:[[:space:]]*/crash.bytes: /'
""".replace("{fsx_ops}", str(CRASH_FSX_OPS)).replace("{nsx_ops}", str(CRASH_NSX_OPS)).replace("{seed}", str(FSX_SEED)),
}


@pytest.fixture(scope="module")
def crash_run(workdir, guest_image):
    export = _fresh_export(workdir("crash"))
    events: dict[str, object] = {"kills": []}
    stop = threading.Event()
    rng = random.Random(20261122)

    with Netns() as ns, Nasd(export, args=["--no-root-squash"], netns=ns) as srv:
        prologue = (f"timeout 120 mount -t nfs -o {srv.mount_options()} 10.0.2.2:/ {M}\n"
                    f'echo "result mount: $?"')
        epilogue = f'timeout 120 umount {M}; echo "result umount: $?"'
        script = ph.guest_program(prologue, [("crash", 420)], epilogue)
        guest = vm.Guest(script, ns, image=guest_image,
                         files={"guest-exerciser": Path(guest_exerciser_binary()),
                                **_sections(CRASH_SECTIONS)})

        def kill_and_restart():
            events["kills"].append(srv.kill(signal.SIGKILL))
            # Replaced whole (rename), so that the guest never reads it half written.
            (guest.share / "kills.new").write_text(str(len(events["kills"])))
            (guest.share / "kills.new").rename(guest.share / "kills")
            time.sleep(2)
            srv.start()

        def killer():
            try:
                direct, go = export / "k" / "direct", export / "k" / ".go"
                while not (direct.exists() and direct.stat().st_size >= 8 << 20):
                    if stop.wait(0.02):
                        return
                events["direct_size_at_kill"] = direct.stat().st_size
                kill_and_restart()
                while not go.exists():
                    if stop.wait(0.1):
                        return
                for _ in range(CRASH_KILLS - 1):
                    if stop.wait(rng.uniform(3, 7)):
                        return
                    kill_and_restart()
                # The guest keeps writing against the last run, until it has made
                # enough files to matter: under emulation, beside fsx and nsx, a fixed
                # wait gave it too few on a slow machine. Removals only lower the
                # files present below those written, so counting them is safe.
                deadline = time.monotonic() + 150
                while sum(n.startswith("f") for n in os.listdir(export / "k")) <= CRASH_MIN_FILES:
                    if stop.wait(0.5) or time.monotonic() > deadline:
                        break
                time.sleep(2)
            except BaseException as e:   # reported by the test
                events["error"] = repr(e)
            finally:
                (guest.share / "stop").write_text("")

        try:
            guest.start()
            th = threading.Thread(target=killer, daemon=True)
            th.start()
            res = guest.wait(600)
        finally:
            stop.set()
            guest.close()
        th.join(timeout=60)
        _report("crash", res, srv.log())
        events["srv_log"] = srv.log()
    return Run(res, export, events=events)


def test_kernel_client_data_survives_server_kills(crash_run):
    r = crash_run
    ev = r.events
    assert "error" not in ev, ev["error"]
    assert ev["kills"] == [-signal.SIGKILL] * CRASH_KILLS, ev
    r.section_ok("crash")
    assert r["result umount"] == "0"
    files, removed = {}, set()
    for line in r.res.stdout.splitlines():
        if line.startswith("crash.file: "):
            name, size, sha = line.split()[1:]
            files[name] = (int(size), sha)
        elif line.startswith("crash.removed: "):
            removed.add(line.split()[1])
    assert int(r["crash.count"]) == len(files) > CRASH_MIN_FILES, "the guest wrote too little to matter"
    k = r.export / "k"
    want = set(files) - removed
    assert set(os.listdir(k)) - {".go", "direct"} == want, "files the guest kept or removed"
    assert _file_sha(k / "direct") == r["crash.direct"], "the O_DIRECT file differs"
    bad = [n for n in sorted(want) if (k / n).stat().st_size != files[n][0] or _file_sha(k / n) != files[n][1]]
    assert not bad, f"{len(bad)} files differ after the server kills: {bad[:10]}"
    # mountstats "bytes:" = normal read, normal write, direct read, direct write,
    # server read, server write, ...: more bytes sent to the server than the
    # application wrote means the client resent data after a verifier change.
    b = [int(x) for x in r["crash.bytes"].split()]
    app = b[1] + b[3]
    print(f"\nkernel crash: files={len(files)} removed={len(removed)} "
          f"direct_size_at_kill={ev['direct_size_at_kill']} app_write_bytes={app} "
          f"server_write_bytes={b[5]} resent={b[5] - app}")
    assert b[5] > app, "the client never resent data after the write verifier changed"


def test_kernel_fsx_reads_stay_right_through_server_kills(crash_run):
    """fsx in the guest beside the writers above, through the same SIGKILLs and
    restarts: every read (buffered, O_DIRECT, mmap, after cache drops) matches its
    model, and the file nasd stored at the end is the model."""
    r = crash_run
    r.section_ok("crash")
    assert r["crash.fsx_rc"] == "0", r._stderr_of("crash")
    res = json.loads(r["crash.fsx_result"])
    assert res["ok"] is True and res["ops"] == CRASH_FSX_OPS, res
    assert _file_sha(r.export / "fsx.bin") == r["crash.fsx_model_sha"]


def test_kernel_nsx_namespace_changes_stay_right_through_server_kills(crash_run):
    """nsx through two more mounts, beside the writers and fsx, through the same
    SIGKILLs: every answer (a CREATE's, a REMOVE's...) is the model's, so no change
    whose reply a kill took was run a second time on its retransmission (EEXIST,
    ENOENT), also when the kill came during its sync; and the tree nasd stored is the
    model's."""
    r = crash_run
    r.section_ok("crash")
    assert r["crash.nsx_rc"] == "0", r._stderr_of("crash")
    res = _nsx_result(r, "crash.nsx_result", "crash.nsx_entry", CRASH_NSX_OPS)
    assert int(r["crash.nsx_kills"]) >= 1, "nasd was never killed while nsx ran"
    # How many kills found changes in their sync (a matter of timing, so not asserted).
    print(f"\nkernel nsx through kills: {res['ops']} operations, {r['crash.nsx_kills']} kills; restarts that took replies "
          f"put aside before their sync: {r.events['srv_log'].count('made durable, kept')}")


# ================================================================== faults
# Connections cut mid-record, and (section "full") a full file system.
# The guest's NFS traffic (not MOUNT's) goes through rig/cutter.py in the namespace:
# now and then it passes only the first part of a record and closes the connection.
# The kernel client connects again and sends every call it has no reply to again,
# with the same XID. A cut-off call must not have been carried out; a cut-off reply's
# call was, and if it changes something, its retransmission must get the first
# answer from nasd's duplicate request cache (the key leaves out the client's port),
# not run again: a CREATE would answer EEXIST, a REMOVE ENOENT.
CUT_NSX_OPS = 1500
CUT_FSX_OPS = 800
# NFSv3 procedures nasd keeps in its duplicate request cache (nfs3/mod.rs).
NON_IDEMPOTENT = {2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 21}


def _cut_chance(is_reply: bool, procedure: int | None, record_len: int) -> float:
    if is_reply:
        return 0.04 if procedure in NON_IDEMPOTENT or record_len > 65536 else 0.0
    return 0.01 if record_len > 4096 else 0.002


FULL_PORT = 2052
CUT_SECTIONS = {
    "full": r"""
# A second nasd serves a tmpfs of 1 MiB and 64 inodes holding `keep`
F=/mnt/full
mkdir -p $F
timeout 120 mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock 10.0.2.2:/ $F
echo "full.keep_sha: $(sha256sum < $F/keep | cut -d' ' -f1)"
rc=0
dd if=/dev/urandom of=$F/big bs=64k count=32 conv=fsync 2>/tmp/dd.err || rc=$?
echo "full.dd_rc: $rc"
echo "full.dd_err: $(tr '\n' ' ' < /tmp/dd.err)"
rm $F/big
head -c 262144 /dev/urandom > /tmp/small
cp /tmp/small $F/small
echo 3 > /proc/sys/vm/drop_caches
echo "full.small_sha: $(sha256sum < /tmp/small | cut -d' ' -f1)"
echo "full.small_read_sha: $(sha256sum < $F/small | cut -d' ' -f1)"
i=0
while [ $i -lt 200 ]; do i=$((i+1)); mkdir $F/d$i 2>/tmp/mkdir.err || break; done
echo "full.mkdirs_tried: $i"
echo "full.mkdir_err: $(tr '\n' ' ' < /tmp/mkdir.err)"
echo 3 > /proc/sys/vm/drop_caches
echo "full.keep_sha_after: $(sha256sum < $F/keep | cut -d' ' -f1)"
timeout 60 umount $F
""".replace("{port}", str(FULL_PORT)),
    "cutnsx": POSIX_SECTIONS["nsx"].replace(
        f"{NSX_OPS} {FSX_SEED}", f"{CUT_NSX_OPS} {FSX_SEED}").replace("nsx.", "cutnsx."),
    "cutfsx": POSIX_SECTIONS["fsx"].replace(
        f"{FSX_OPS} {FSX_SEED}", f"{CUT_FSX_OPS} {FSX_SEED}").replace("fsx.", "cutfsx."),
}


@pytest.fixture(scope="module")
def fault_run(workdir, guest_image):
    base = workdir("fault")
    export = _fresh_export(base)
    full = base / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64,mode=755", "tmpfs", str(full)],
                   check=True)
    try:
        keep = os.urandom(200 * 1024)
        (full / "keep").write_bytes(keep)
        return _fault_run(export, full, keep, guest_image)
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)


def _fault_run(export: Path, full: Path, keep: bytes, guest_image) -> Run:
    mport = 9102
    with Netns() as ns, Nasd(export, args=["--no-root-squash", "--metrics", f"127.0.0.1:{mport}"],
                             netns=ns) as srv, \
            Nasd(full, args=["--no-root-squash"], netns=ns, port=FULL_PORT) as full_srv:
        cutter = ns.call(lambda: ConnectionCutter(srv.port, FSX_SEED, _cut_chance), timeout=30)
        opts = (f"vers=3,proto=tcp,port={cutter.port},mountport={srv.port},"
                f"mountproto=tcp,nolock")
        prologue = (f"timeout 120 mount -t nfs -o {opts} 10.0.2.2:/ {M}\n"
                    f'echo "result mount: $?"')
        epilogue = f'sync; timeout 120 umount {M}; echo "result umount: $?"'
        script = ph.guest_program(prologue, [("cutnsx", 600), ("cutfsx", 600), ("full", 300)],
                                  epilogue)
        try:
            res = vm.run_guest(script, ns, timeout=1500, image=guest_image,
                               files={"guest-exerciser": Path(guest_exerciser_binary()),
                                      **_sections(CUT_SECTIONS)})
        finally:
            cutter.close()
        metrics = ns.call(lambda: urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                                         timeout=10).read().decode(), timeout=30)
        alive = srv.alive() and full_srv.alive()
        _report("faults", res, srv.log() + "\n--- nasd of the full file system ---\n" + full_srv.log())
    print(f"cut: replies cut by procedure {dict(cutter.replies_cut_by_procedure)}")
    return Run(res, export, cutter=cutter, metrics=metrics, server_alive=alive,
               full=full, keep=keep, full_listing=sorted(os.listdir(full)),
               full_small=(full / "small").read_bytes() if (full / "small").exists() else None)


def test_nsx_through_connections_cut_mid_record(fault_run):
    """nsx through two more mounts while connections break mid-record: every answer
    (success or the POSIX error) must be the model's, so no retransmitted CREATE,
    REMOVE, RENAME or LINK ran twice, and the tree nasd stored must be the model's."""
    r = fault_run
    assert r.server_alive
    r.section_ok("cutnsx")
    _nsx_result(r, "cutnsx.result", "cutnsx.entry", CUT_NSX_OPS)


def test_fsx_through_connections_cut_mid_record(fault_run):
    """fsx (buffered, O_DIRECT, mmap) while connections break in the middle of READ
    replies, WRITE calls and WRITE/COMMIT replies: every read must match the model and
    the file nasd stored must be the model."""
    r = fault_run
    r.section_ok("cutfsx")
    res = json.loads(r["cutfsx.result"])
    assert res["ok"] is True and res["ops"] == CUT_FSX_OPS, res
    assert _file_sha(r.export / "cutfsx.bin") == r["cutfsx.model_sha"]


def test_retransmissions_after_cut_replies_are_answered_from_the_cache(fault_run):
    """Each cut reply to a call that changes something is followed by the client's
    retransmission on a new connection, which nasd must answer from its duplicate
    request cache: at least as many cache hits as such replies cut. Cut calls and
    replies in both directions must have happened, or the run tested nothing."""
    r = fault_run
    c = r.cutter
    changing = sum(n for proc, n in c.replies_cut_by_procedure.items() if proc in NON_IDEMPOTENT)
    assert changing >= 5 and c.calls_cut >= 3, (
        f"too few cuts to test anything: {c.calls_cut} calls, replies by procedure "
        f"{dict(c.replies_cut_by_procedure)}")
    hits = [line for line in r.metrics.splitlines() if line.startswith("nasd_drc_hits_total")]
    assert hits, "no nasd_drc_hits_total in the metrics"
    print(f"\ncut: {c.connections} connections, {c.calls_cut} calls and {c.replies_cut} "
          f"replies cut ({changing} to calls that change something); {hits[0]}")
    assert float(hits[0].split()[-1]) >= changing, (hits, dict(c.replies_cut_by_procedure))


def test_a_full_file_system_refuses_writes_and_mkdirs_and_keeps_what_it_holds(fault_run):
    """Through the kernel client, on an export of 1 MiB and 64 inodes: a 2 MiB write
    (dd conv=fsync) fails with ENOSPC; after its file is removed a 256 KiB file is
    written and read back whole; mkdirs run until one fails with ENOSPC; the file
    stored before is the same throughout, and the host sees exactly the directories
    the guest made."""
    r = fault_run
    r.section_ok("full")
    want = _sha(r.keep)
    assert r["full.keep_sha"] == want and r["full.keep_sha_after"] == want
    assert r["full.dd_rc"] != "0" and "No space left on device" in r["full.dd_err"], r["full.dd_err"]
    assert r["full.small_read_sha"] == r["full.small_sha"]
    assert r.full_small is not None and _sha(r.full_small) == r["full.small_sha"]
    tried = int(r["full.mkdirs_tried"])
    assert 10 < tried < 200 and "No space left on device" in r["full.mkdir_err"], (tried, r["full.mkdir_err"])
    made = [n for n in r.full_listing if n.startswith("d")]
    assert sorted(made) == sorted(f"d{i}" for i in range(1, tried)), made
    assert set(r.full_listing) - set(made) == {"keep", "small"}
