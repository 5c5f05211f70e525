"""Smoke test of ``nasd bench``: a tiny suite end to end, then the report is checked.

    pytest tests/bench/test_bench_smoke.py

Runs ``target/release/nasd bench --suite smoke --target nasd [--target ganesha]``
(Ganesha when ``ganesha.nfsd`` is installed; the local-disk ceiling always) and
checks that report.md parses, that its suite table has a column per target and
the nasd ÷ peer / nasd ÷ local ratio columns, that report.html, results.json and
raw fio JSON exist, and that the plots are valid PNG files.
"""

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import rig`

from rig.fio import fio_binary  # noqa: E402
from rig.nasd import default_binary  # noqa: E402

NASD = default_binary()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def md_tables(text):
    """Markdown tables as lists of rows (lists of cells), header first."""
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if all(set(c) <= set("-:|") for c in cells):
                continue  # the alignment row
            cur.append(cells)
        elif cur:
            tables.append(cur)
            cur = []
    if cur:
        tables.append(cur)
    return tables


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\0")[-8:-4] == b"IEND" or b"IEND" in data[-16:], f"{path}: no IEND"
    return w, h


def test_bench_smoke(tmp_path):
    out = tmp_path / "report"
    targets = ["nasd"] + (["ganesha"] if shutil.which("ganesha.nfsd") else [])
    cmd = [str(NASD), "bench", "--suite", "smoke", "--out", str(out), "--fio", fio_binary()]
    for t in targets:
        cmd += ["--target", t]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stderr[-4000:])
    assert p.returncode == 0, p.stderr[-4000:]
    assert "ETA" in p.stderr  # progress

    md = (out / "report.md").read_text()
    columns = targets + ["local"] + [f"nasd÷{t}" for t in targets if t != "nasd"] + ["nasd÷local"]
    tables = md_tables(md)
    suite = [t for t in tables if t[0][:2] == ["job", "unit"]]
    assert suite, md[:3000]
    header, rows = suite[0][0], suite[0][1:]
    assert header == ["job", "unit"] + columns, header
    assert len(rows) >= 5
    assert all(len(r) == len(header) for r in rows)
    names = [r[0] for r in rows]
    assert "4k randread qd1" in names and "1m write qd16" in names
    # every target gave figures for most jobs, nasd for all (a run a server fails shows
    # "error" and is listed under "Failed runs"; Ganesha's stability is not ours to check)
    for i, name in enumerate(header[2:2 + len(targets) + 1]):
        cells = [r[2 + i] for r in rows]
        good = [float(c) for c in cells if c not in ("-", "error")]
        assert len(good) >= len(rows) // 2, (name, cells)
        if name == "nasd":
            assert all(c not in ("-", "error") for c in cells), f"nasd gave no figure for a job: {list(zip(names, cells))}"
        if "error" in cells:
            assert "## Failed runs" in md
    # with a peer: the latency goal at iodepth 1, against the client's own share
    if "ganesha" in targets:
        title = "### The latency goal at iodepth 1 (mean ≤ 0.5× ganesha) against the client's share"
        assert title in md, md[:3000]
        goal = md_tables(md.split(title, 1)[1])[0]
        rows_by_job = {r[0]: r for r in goal[1:]}
        assert "4k randread qd1" in rows_by_job and "1m write qd16" not in rows_by_job, goal
        row = dict(zip(goal[0], rows_by_job["4k randread qd1"]))
        assert float(row["floor µs (client's share)"]) == pytest.approx(
            float(row["nasd mean µs"]) - float(row["nasd server µs per call"]), abs=0.6), row
        assert row["goal"].split(":")[0] in ("met", "out of reach", "open"), row
    # machine facts, exact command lines, no machine paths in the command lines
    for fact in ("CPU", "cores", "memory", "kernel", "file system of the data", "fio"):
        assert f"| {fact} |" in md, fact
    assert "--ioengine=nfs" in md and "--nfs_url=nfs://127.0.0.1" in md
    assert str(out) not in md

    html = (out / "report.html").read_text()
    assert "<table>" in html and "nasd÷local" in html

    results = json.loads((out / "results.json").read_text())
    assert [t["name"] for t in results["targets"]] == targets + ["local"]
    assert list((out / "raw").glob("*.json"))

    pngs = sorted(out.glob("*.png"))
    assert any(p.name == "smoke-ratio.png" for p in pngs), pngs
    assert any(p.name.startswith("smoke-sweep-") for p in pngs), pngs
    for png in pngs:
        w, h = png_size(png)
        assert w >= 400 and h >= 200, (png, w, h)
        assert f"({png.name})" in md, f"{png.name} not linked from report.md"
    assert not (out / "data").exists()  # servers' data removed


def bench_results(out, *args):
    """Runs `nasd bench ARGS --out OUT`, which must succeed; returns its stderr and
    results.json."""
    cmd = [str(NASD), "bench", *args, "--out", str(out), "--fio", fio_binary()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stderr[-4000:])
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stderr, json.loads((out / "results.json").read_text())


def test_bench_parallel_metadata(tmp_path):
    """The metadata suite's parallel jobs against nasd and the local disk: eight nfsh
    processes create 5000 files at once, each in a directory of its own, then remove them.
    Every operation reaches nasd, and the eight loops really overlap in time."""
    out = tmp_path / "report"
    _, results = bench_results(out, "--suite", "metadata", "--only", "clients", "--target", "nasd")
    jobs = {j["job"]["name"]: j for j in results["jobs"]}
    assert list(jobs) == ["create 5000 files × 8 clients", "remove 5000 files × 8 clients"]
    for name, job in jobs.items():
        runs = {m["target"]: m for m in job["runs"]}
        for target in ("nasd", "local"):
            m = runs[target]
            assert m["error"] is None, (name, target, m["error"])
            assert m["meta"]["ops"] == 5000 and m["ops_per_sec"] > 0, (name, target, m["meta"])
        # the local disk again, each change durable as a sync export makes it
        durable = runs["local"]["durable"]
        assert durable["ops"] == 5000 and durable["seconds"] > 0, (name, durable)
        nasd = runs["nasd"]
        assert len(nasd["commands"]) == 8, nasd["commands"]
        calls = {f["procedure"]: f["calls"] for f in nasd["server"]["procs"]}
        proc = "nfs3 CREATE" if name.startswith("create") else "nfs3 REMOVE"
        assert calls.get(proc) == 5000, calls

    # each client's loop, as nfsh reported it (raw/NNN-<job>-nasd.json)
    loops = [json.loads(f.read_text()) for f in sorted((out / "raw").glob("*-nasd.json"))]
    assert len(loops) == 2, loops
    for clients in loops:
        assert len(clients) == 8 and sum(c["ops"] for c in clients) == 5000
        # all eight ran at once: the last to start began before the first to finish ended
        assert max(c["started"] for c in clients) < min(c["ended"] for c in clients), clients


def test_bench_repeats_metadata_steps_each_in_a_directory_of_its_own(tmp_path):
    """With --repeat, the metadata steps run again as a whole, and each repetition works
    in a directory of its own: `--only readdir` runs create and readdir, which leave their
    5000 files behind, so a second create in the same place would only open files that
    exist and the listing would count the first repetition's files."""
    out = tmp_path / "report"
    stderr, results = bench_results(out, "--suite", "metadata", "--only", "readdir", "--repeat", "2",
                                    "--target", "nasd", "--keep-data")
    jobs = {j["job"]["name"]: j for j in results["jobs"]}
    relist = "readdir 5000 files × 10 listings"
    assert list(jobs) == ["create 5000 files", "readdir 5000 files", relist]
    for name, job in jobs.items():
        for m in job["runs"]:
            assert m["error"] is None, (name, m["target"], m["error"])
            # the repeated listing counts the entries of each of its ten listings
            assert m["meta"]["ops"] == (50000 if name == relist else 5000), (name, m["target"], m["meta"])
            assert len(m["repeats"]) == 2, (name, m["target"], m["repeats"])
    # the steps ran in order in each repetition: create, readdir, create, readdir
    order = stderr.index
    assert order("create 5000 files (1/2)") < order("readdir 5000 files (1/2)") < order(f"{relist} (1/2)") \
        < order("create 5000 files (2/2)") < order("readdir 5000 files (2/2)") < order(f"{relist} (2/2)")
    raw = {f.name for f in (out / "raw").glob("*-nasd*.json") if not f.name.startswith("002-")}
    assert raw == {"000-create-5000-files-nasd.json", "000-create-5000-files-nasd-r2.json",
                   "001-readdir-5000-files-nasd.json", "001-readdir-5000-files-nasd-r2.json"}, raw
    assert len(list((out / "raw").glob("002-*-nasd*.json"))) == 2
    for export in (out / "data" / "nasd").rglob("md-flat"):
        assert len(list(export.iterdir())) == 5000, export
    # every repetition, the first too, one directory deep (libnfs LOOKUPs each directory
    # of a path: a shallower first repetition would be a round trip per operation faster)
    # (the local disk's second, durable, run of the create in a directory of its own)
    flats = sorted(str(d.relative_to(out / "data")) for d in (out / "data").rglob("md-flat"))
    assert flats == sorted([f"nasd/export/round-{n}/md-flat" for n in (1, 2)]
                           + [f"local/round-{n}/{d}md-flat" for n in (1, 2) for d in ("", "durable/")]), flats
    # the create changes the namespace, so the local disk also timed it durable; the
    # listing changes nothing and has no such figure
    local = {name: next(m for m in job["runs"] if m["target"] == "local") for name, job in jobs.items()}
    assert local["create 5000 files"]["durable"]["ops"] == 5000, local["create 5000 files"]
    assert "durable" not in local["readdir 5000 files"], local["readdir 5000 files"]
    assert "durable" not in local[relist] and local[relist]["meta"]["ops"] == 50000, local[relist]


def test_bench_refuses_a_report_to_compare_with_before_running_anything(tmp_path):
    """`--compare` with a directory that holds no results.json stops the run at once,
    naming the file, before any server starts or job runs (found when a two-minute run
    ended in this error without writing its report)."""
    out, old = tmp_path / "report", tmp_path / "old"
    old.mkdir()
    cmd = [str(NASD), "bench", "--suite", "metadata", "--target", "nasd", "--out", str(out),
           "--compare", str(old)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"{old}/results.json" in p.stderr, p.stderr
    assert not (out / "data").exists(), "a job ran before the comparison was read"


def test_bench_weighs_the_metadata_goal_against_the_clients_round_trip(tmp_path):
    """The round-trip job sends one GETATTR per operation (one call each, against any
    server); with a peer in the run, the report puts each single-client job's floor (its
    calls × the client's round trip, plus the local disk's durable change for jobs that
    change something) beside the peer's time ÷ 3 and says which goals no server can meet."""
    if not shutil.which("ganesha.nfsd"):
        pytest.skip("ganesha.nfsd is not installed (scripts/install-deps.sh installs it): the goal needs a peer")
    out = tmp_path / "report"
    _, results = bench_results(out, "--suite", "metadata", "--only", "round trip", "--only", "stat",
                               "--target", "nasd", "--target", "ganesha")
    jobs = {j["job"]["name"]: j for j in results["jobs"]}
    assert list(jobs) == ["create 5000 files", "stat 5000 files", "round trip: 5000 GETATTRs of one file"]
    rt = {m["target"]: m for m in jobs["round trip: 5000 GETATTRs of one file"]["runs"]}
    for target in ("nasd", "ganesha", "local"):
        assert rt[target]["error"] is None and rt[target]["meta"]["ops"] == 5000, (target, rt[target])
    calls = {f["procedure"]: f["calls"] for f in rt["nasd"]["server"]["procs"]}
    # every operation one GETATTR (nfsh opens the file first: a few calls more)
    assert 5000 <= calls["nfs3 GETATTR"] <= 5003 and sum(calls.values()) < 5010, calls

    md = (out / "report.md").read_text()
    title = "### The metadata goal (3× ganesha) against the client's floor"
    assert title in md, md
    table = md_tables(md.split(title, 1)[1])[0]
    header, rows = table[0], {r[0]: r for r in table[1:]}
    assert set(rows) == {"create 5000 files", "stat 5000 files"}, rows
    col = {h.split(" (")[0]: i for i, h in enumerate(header)}
    round_trip_us = float(header[col["client floor µs/op"]].split("× ")[1].rstrip(")"))
    assert 0 < round_trip_us < 1e6 / rt["nasd"]["ops_per_sec"], header
    stat, create = rows["stat 5000 files"], rows["create 5000 files"]
    # libnfs resolves the path on every stat: LOOKUPs of its directories and the file, then GETATTR
    assert float(stat[col["calls/op"]]) >= 3, stat
    assert stat[col["durable change, local µs/op"]] == "-", stat
    assert create[col["durable change, local µs/op"]] != "-", create
    for row in (stat, create):
        floor = float(row[col["floor µs/op"]])
        assert floor >= float(row[col["calls/op"]]) * round_trip_us * 0.99, row
        assert row[col["goal"]].split(":")[0] in ("met", "out of reach", "open"), row
