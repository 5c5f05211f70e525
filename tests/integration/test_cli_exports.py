"""`nasd exports FILE`: an exports file checked before it is served. The table printed is
the one `nasd serve --exports FILE` would serve (same reader), every option spelled out;
a file with an error exits 2 with its line; `--client` shows the rule a client gets."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.nasd import default_binary  # noqa: E402


def _exports(*args, cwd=None):
    return subprocess.run([str(default_binary()), "exports", *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_the_table_is_printed_as_it_would_be_served(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "link").symlink_to(shared)
    missing = tmp_path / "missing"
    f = tmp_path / "exports"
    f.write_text(
        f"{tmp_path}/link/ -rw 127.0.0.0/8(no_root_squash,insecure) *(ro,fsid=0x10)\n"
        f"{missing} *(rw)\n"
        f"{shared} 10.0.0.0/255.0.0.0(async)\n"
    )
    p = _exports(f)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    # the symlinked path and the real one are one export, by its real path; its lines merged
    assert lines[0] == f"{shared}  (id 16; written {tmp_path}/link)", p.stdout
    assert lines[1:4] == [
        "    127.0.0.0/8(rw,sync,insecure,no_root_squash,anonuid=65534,anongid=65534)",
        "    *(ro,sync,secure,root_squash,anonuid=65534,anongid=65534)",
        "    10.0.0.0/8(ro,async,secure,root_squash,anonuid=65534,anongid=65534)",
    ], p.stdout
    assert lines[4].startswith(f"{missing}  not served: "), p.stdout
    assert len(lines) == 5, p.stdout


def test_a_client_sees_the_rule_that_admits_it(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    f = tmp_path / "exports"
    f.write_text(f"{d} 127.0.0.1(rw,no_root_squash) 127.0.0.0/8(ro) 192.168.7.*(rw)\n")
    p = _exports(f, "--client", "127.0.0.1", "--client", "127.0.0.2", "--client", "::ffff:192.168.7.9", "--client", "10.1.1.1")
    assert p.returncode == 0, p.stderr
    blocks = [b.strip("\n") for b in p.stdout.split("\n\n")[1:]]
    assert blocks == [
        f"127.0.0.1:\n    {d}  rw,sync,secure,no_root_squash,anonuid=65534,anongid=65534  (rule 127.0.0.1)",
        f"127.0.0.2:\n    {d}  ro,sync,secure,root_squash,anonuid=65534,anongid=65534  (rule 127.0.0.0/8)",
        f"192.168.7.9:\n    {d}  rw,sync,secure,root_squash,anonuid=65534,anongid=65534  (rule 192.168.7.*)",
        f"10.1.1.1:\n    {d}  refused",
    ], p.stdout


def test_a_file_with_an_error_exits_2_naming_its_line(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    f = tmp_path / "exports"
    f.write_text(f"# comment\n{d} *(rw)\n{d}2 *(rw,no_such_option)\n")
    p = _exports(f)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    assert f"{f}:3" in p.stderr and "no_such_option" in p.stderr, p.stderr
    p = _exports(tmp_path / "absent")
    assert p.returncode == 2 and "absent" in p.stderr, p.stderr


def test_a_name_left_out_for_its_mountpoint_takes_the_directorys_other_names_with_it(tmp_path):
    """A directory exported by two names, one with `mp`: they are one export, which
    needs the mount whatever name a line used; `mp` with no path on both lines names
    one directory, not two."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "link").symlink_to(shared)
    mnt = tmp_path / "mnt"
    mnt.mkdir()                         # a directory, nothing mounted on it
    f = tmp_path / "exports"
    f.write_text(f"{tmp_path}/link *(rw,mp={mnt})\n{shared} 10.0.0.0/8(rw)\n")
    p = _exports(f)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{tmp_path}/link  not served: its mountpoint {mnt} is not mounted\n", p.stdout
    f.write_text(f"{tmp_path}/link *(rw,mp)\n{shared} 10.0.0.0/8(rw,mp)\n")
    p = _exports(f)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{tmp_path}/link  not served: its mountpoint {shared} is not mounted\n", p.stdout
