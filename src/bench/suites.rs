//! The job lists of each suite.

use super::fio::{fmt_size, FioShape};
use serde::{Deserialize, Serialize};

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

/// What the headline figure of a job is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Metric {
    Iops,
    MiBs,
    OpsPerSec,
}

impl Metric {
    pub fn label(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MiBs => "MiB/s",
            Metric::OpsPerSec => "ops/s",
        }
    }
}

/// A metadata operation driven through libnfs (nfsh).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum MetaOp {
    /// `mkdir-tree`: M directories with N/M files each (mkdir + create).
    Tree,
    Create,
    Stat,
    /// One file's attributes asked for over and over (nfsh `getattr-loop`, one GETATTR
    /// per operation): the client's round trip with a server that has next to nothing to
    /// do, the floor under every other job's calls ([`super::report`]'s goal check).
    RoundTrip,
    /// Rename each file of the flat directory (f00000000 -> r00000000).
    Rename,
    /// One listing of the flat directory: the first, with nothing of it in the server's
    /// caches but what the earlier jobs left.
    Readdir,
    /// [`RELISTINGS`] listings of the flat directory in a row by one client: listing a
    /// directory again, as `ls` in a loop or a build's file scans do, and a figure that
    /// one listing (tens of milliseconds) is too short to give on a shared machine.
    Relist,
    /// Remove the renamed files.
    Remove,
    /// The real-tree workload: recreate a source tree from the local disk ("tar x").
    Untar,
    /// Copy the unpacked tree inside the export ("cp -r").
    CopyTree,
    /// Remove the unpacked tree ("rm -rf").
    RemoveTree,
}

impl MetaOp {
    /// Jobs of the real-tree workload (their size is the source tree's, not `files`).
    pub fn is_tree(self) -> bool {
        matches!(self, MetaOp::Untar | MetaOp::CopyTree | MetaOp::RemoveTree)
    }

    /// Steps that create, rename or remove entries (all but stat and readdir): a `sync`
    /// export makes each of their changes durable before its reply.
    pub fn changes_the_namespace(self) -> bool {
        !matches!(self, MetaOp::Stat | MetaOp::RoundTrip | MetaOp::Readdir | MetaOp::Relist)
    }

    /// Steps that free inodes (remove, rm -rf). They run after every other step of every
    /// repetition ([`run_order`]).
    pub fn frees_inodes(self) -> bool {
        matches!(self, MetaOp::Remove | MetaOp::RemoveTree)
    }

    /// The earlier job, with as many clients, whose files this one works on.
    pub fn works_on(self, clients: u32) -> Option<MetaOp> {
        match self {
            MetaOp::Stat | MetaOp::RoundTrip | MetaOp::Rename | MetaOp::Readdir | MetaOp::Relist => Some(MetaOp::Create),
            // One client removes the renamed files; several remove what they created.
            MetaOp::Remove if clients == 1 => Some(MetaOp::Rename),
            MetaOp::Remove => Some(MetaOp::Create),
            MetaOp::CopyTree | MetaOp::RemoveTree => Some(MetaOp::Untar),
            MetaOp::Tree | MetaOp::Create | MetaOp::Untar => None,
        }
    }
}

/// Whether `name` holds `text` as whole words: not inside a longer word or number, so
/// that `4k randread qd1` is not also `4k randread qd16`.
fn names_words(name: &str, text: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    !text.is_empty()
        && name.match_indices(text).any(|(at, _)| !word(name[..at].chars().next_back()) && !word(name[at + text.len()..].chars().next()))
}

/// The jobs whose name contains one of `only` as whole words, and the earlier metadata
/// jobs that make the files they work on (`remove` needs `rename` needs `create`), in
/// suite order. Returns the jobs and the names of those added as prerequisites.
pub fn select(jobs: Vec<Job>, only: &[String]) -> (Vec<Job>, Vec<String>) {
    let mut wanted: Vec<bool> = jobs.iter().map(|j| only.iter().any(|t| names_words(&j.name, t))).collect();
    let mut added = Vec::new();
    // Prerequisites come earlier in a suite: one backward pass follows whole chains.
    for i in (0..jobs.len()).rev() {
        let JobKind::Meta { op, clients, .. } = jobs[i].kind else { continue };
        let Some(need) = op.works_on(clients) else { continue };
        if !wanted[i] {
            continue;
        }
        let before = jobs[..i].iter().rposition(|j| matches!(j.kind, JobKind::Meta { op, clients: c, .. } if op == need && c == clients));
        if let Some(k) = before {
            if !wanted[k] {
                wanted[k] = true;
                added.push(jobs[k].name.clone());
            }
        }
    }
    added.reverse();
    let jobs = jobs.into_iter().zip(wanted).filter_map(|(j, w)| w.then_some(j)).collect();
    (jobs, added)
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[rustfmt::skip] // one line per variant reads as a table
pub enum JobKind {
    Fio(FioShape),
    /// The same shape run by `clients` separate fio processes at once, each on its own file.
    Scale { clients: u32, shape: FioShape },
    /// iozone-style case: one pass of `op` over a file of `shape.size` in records of `shape.bs`.
    Iozone { op: String, shape: FioShape },
    /// With `clients` > 1, that many nfsh processes at once, each on its share of `files`
    /// in a directory of its own (create and remove only).
    Meta {
        op: MetaOp,
        files: u32,
        dirs: u32,
        #[serde(default = "one_client")]
        clients: u32,
    },
}

fn one_client() -> u32 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub suite: String,
    pub name: String,
    /// Jobs of a group are plotted together against `x`.
    pub group: String,
    pub x: f64,
    pub metric: Metric,
    pub kind: JobKind,
}

impl Job {
    /// Planned seconds (for the ETA), per target.
    pub fn planned_secs(&self) -> f64 {
        match &self.kind {
            JobKind::Fio(s) | JobKind::Scale { shape: s, .. } => (s.runtime + s.ramp) as f64 + 1.0,
            JobKind::Iozone { shape, .. } => 0.3 + shape.size as f64 / (200.0 * M as f64),
            JobKind::Meta { op, .. } if op.is_tree() => 10.0,
            JobKind::Meta { files, .. } => 1.0 + *files as f64 / 2000.0,
        }
    }

    /// How many times the job runs per target for `--repeat n`: fio jobs stand alone and
    /// repeat; metadata steps work on the files an earlier step left, so they repeat as a
    /// whole run of steps (see `bench::run`); iozone passes run once.
    pub fn repetitions(&self, n: u32) -> u32 {
        match self.kind {
            JobKind::Fio(_) | JobKind::Scale { .. } | JobKind::Meta { .. } => n.max(1),
            JobKind::Iozone { .. } => 1,
        }
    }

    pub fn is_meta(&self) -> bool {
        matches!(self.kind, JobKind::Meta { .. })
    }

    /// A metadata step that frees inodes ([`MetaOp::frees_inodes`]).
    pub fn frees_inodes(&self) -> bool {
        matches!(self.kind, JobKind::Meta { op, .. } if op.frees_inodes())
    }
}

/// The order in which a run of consecutive jobs, each repeated `reps` times, runs:
/// (repetition, index in `jobs`). Metadata steps that free inodes go last, after every
/// repetition of the other steps: ext4 without a journal passes over each inode freed in
/// the last minute (five, while its inode table block is unwritten) on every allocation,
/// so a create soon after thousands of removals costs 0.2–0.5 ms more here, whichever
/// server makes it (docs/performance.md). A freeing step still follows the steps of its own
/// repetition whose files it removes.
pub fn run_order(jobs: &[Job], reps: u32) -> Vec<(u32, usize)> {
    let mut order = Vec::new();
    for freeing in [false, true] {
        for rep in 0..reps {
            order.extend(jobs.iter().enumerate().filter(|(_, j)| j.frees_inodes() == freeing).map(|(i, _)| (rep, i)));
        }
    }
    order
}

/// Run-time and size of the fio jobs of a suite.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub runtime: u64,
    pub ramp: u64,
    pub size: u64,
}

pub const SUITES: &[&str] = &["smoke", "quick", "standard", "iozone", "mix", "scale", "metadata", "all"];

pub fn default_params(suite: &str) -> Params {
    match suite {
        "smoke" => Params { runtime: 1, ramp: 0, size: 8 * M },
        "standard" | "all" => Params { runtime: 15, ramp: 2, size: 1024 * M },
        "iozone" => Params { runtime: 0, ramp: 0, size: 512 * M },
        _ => Params { runtime: 5, ramp: 1, size: 128 * M },
    }
}

fn shape(rw: &str, bs: u64, iodepth: u32, p: Params) -> FioShape {
    FioShape { runtime: p.runtime, ramp: p.ramp, ..FioShape::one_pass(rw, bs, iodepth, p.size, "bench.dat") }
}

fn fio_job(suite: &str, group: &str, x: f64, s: FioShape) -> Job {
    let metric = if s.bs >= 64 * K { Metric::MiBs } else { Metric::Iops };
    let mut name = format!("{} {} qd{}", fmt_size(s.bs), s.rw, s.iodepth);
    if let Some(m) = s.rwmixread {
        name = format!("{} {} {}/{} qd{}", fmt_size(s.bs), s.rw, m, 100 - m, s.iodepth);
    }
    if s.randrepeat0 {
        name.push_str(" randrepeat=0");
    }
    if s.sync {
        name.push_str(" stable");
    }
    Job { suite: suite.into(), name, group: group.into(), x, metric, kind: JobKind::Fio(s) }
}

/// The cloud-NAS fio shapes (`quick` and `standard`; `smoke` is a tiny subset).
fn cloud(suite: &str, p: Params) -> Vec<Job> {
    let mut v = Vec::new();
    let depths: &[u32] = if suite == "smoke" { &[1, 16] } else { &[1, 16, 64, 128] };
    for rw in ["randread", "randwrite"] {
        for &qd in depths {
            v.push(fio_job(suite, &format!("4k {rw}"), qd as f64, shape(rw, 4 * K, qd, p)));
        }
    }
    let big_depths: &[u32] = match suite {
        "standard" | "all" => &[16, 64],
        _ => &[16],
    };
    for rw in ["randread", "randwrite", "read", "write"] {
        if suite == "smoke" && rw.starts_with("rand") {
            continue;
        }
        for &qd in big_depths {
            v.push(fio_job(suite, &format!("1m {rw}"), qd as f64, shape(rw, M, qd, p)));
        }
    }
    if suite != "smoke" {
        // The write jobs above are UNSTABLE WRITEs (the client's default); this one counts
        // a write only once it is on stable storage (FILE_SYNC; locally O_SYNC).
        let mut stable = shape("write", M, 16, p);
        stable.sync = true;
        v.push(fio_job(suite, "1m write stable", 16.0, stable));
    }
    if suite != "smoke" {
        v.push(fio_job(suite, "other", 0.0, shape("read", 8 * K, 16, p)));
        v.push(fio_job(suite, "other", 0.0, shape("write", 32 * K, 16, p)));
        v.push(fio_job(suite, "other", 0.0, shape("randwrite", 64 * K, 16, p)));
    }
    let mut mixed = shape("randrw", 16 * K, 16, p);
    mixed.rwmixread = Some(75);
    v.push(fio_job(suite, "other", 0.0, mixed));
    v
}

/// Read/write ratio sweep.
fn mix(p: Params) -> Vec<Job> {
    let mut v = Vec::new();
    for (rw, bs) in [("randrw", 4 * K), ("rw", 64 * K)] {
        for rr0 in [false, true] {
            for m in [100u32, 75, 50, 25, 0] {
                let mut s = shape(rw, bs, 16, p);
                s.rwmixread = Some(m);
                s.randrepeat0 = rr0;
                let group = format!("{} {}{}", fmt_size(bs), rw, if rr0 { " randrepeat=0" } else { "" });
                v.push(fio_job("mix", &group, m as f64, s));
            }
        }
    }
    v
}

/// 1, 2, 4 and 8 concurrent clients (separate fio processes).
fn scale(p: Params) -> Vec<Job> {
    let mut v = Vec::new();
    for (rw, bs) in [("randread", 4 * K), ("randwrite", 4 * K), ("read", M)] {
        for clients in [1u32, 2, 4, 8] {
            let mut s = shape(rw, bs, 16, p);
            // The clients together touch about one suite-size of data.
            s.size = (p.size / clients as u64).max(4 * M) / M * M;
            let metric = if bs >= 64 * K { Metric::MiBs } else { Metric::Iops };
            v.push(Job {
                suite: "scale".into(),
                name: format!("{} {} qd16 × {clients} clients", fmt_size(bs), rw),
                group: format!("{} {}", fmt_size(bs), rw),
                x: clients as f64,
                metric,
                kind: JobKind::Scale { clients, shape: s },
            });
        }
    }
    v
}

/// The iozone -a matrix: files 64 KiB..max, records 4 KiB..16 MiB (at most the file),
/// records of 32 KiB and below skipped once files exceed 32 MiB.
pub fn iozone_cases(max_file: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut f = 64 * K;
    while f <= max_file.max(64 * K) {
        let mut r = 4 * K;
        while r <= 16 * M && r <= f {
            if !(f > 32 * M && r <= 32 * K) {
                v.push((f, r));
            }
            r *= 2;
        }
        f *= 2;
    }
    v
}

pub const IOZONE_OPS: [&str; 4] = ["write", "rewrite", "read", "reread"];

fn iozone(p: Params) -> Vec<Job> {
    let mut v = Vec::new();
    for (f, r) in iozone_cases(p.size) {
        for op in IOZONE_OPS {
            let rw = if op.ends_with("write") { "write" } else { "read" };
            let mut s = shape(rw, r, 1, Params { runtime: 0, ramp: 0, size: f });
            s.file = format!("iozone-{}.dat", fmt_size(f));
            v.push(Job {
                suite: "iozone".into(),
                name: format!("{op} file {} rec {}", fmt_size(f), fmt_size(r)),
                group: op.into(),
                x: r as f64,
                metric: Metric::MiBs,
                kind: JobKind::Iozone { op: op.into(), shape: s },
            });
        }
    }
    v
}

/// The real-tree jobs and their names, in job order.
pub const TREE_JOBS: [(MetaOp, &str); 3] =
    [(MetaOp::Untar, "untar tree"), (MetaOp::CopyTree, "cp -r tree"), (MetaOp::RemoveTree, "rm -rf tree")];

/// Listings of the flat directory in the metadata suite's repeated-listing job.
pub const RELISTINGS: u32 = 10;

/// Concurrent clients of the metadata suite's parallel create and remove.
pub const META_CLIENTS: u32 = 8;

/// The metadata suite: loops over `files` files (mkdir-tree, create, stat, rename, readdir,
/// remove), the same creates and removes by `META_CLIENTS` clients at once, then the
/// real-tree workload (untar, cp -r, rm -rf of a source tree).
fn metadata(smoke: bool) -> Vec<Job> {
    let (files, dirs) = if smoke { (200, 4) } else { (5000, 50) };
    let one = |op, n: &str| (op, n.to_string(), 1);
    let parallel = |op, n: &str| (op, format!("{n} {files} files × {META_CLIENTS} clients"), META_CLIENTS);
    [
        one(MetaOp::Tree, &format!("mkdir-tree {dirs} dirs × {} files", files / dirs)),
        one(MetaOp::Create, &format!("create {files} files")),
        one(MetaOp::Stat, &format!("stat {files} files")),
        one(MetaOp::RoundTrip, &format!("round trip: {files} GETATTRs of one file")),
        one(MetaOp::Rename, &format!("rename {files} files")),
        one(MetaOp::Readdir, &format!("readdir {files} files")),
        one(MetaOp::Relist, &format!("readdir {files} files × {RELISTINGS} listings")),
        one(MetaOp::Remove, &format!("remove {files} files")),
        parallel(MetaOp::Create, "create"),
        parallel(MetaOp::Remove, "remove"),
    ]
    .into_iter()
    .chain(TREE_JOBS.into_iter().map(|(op, n)| one(op, n)))
    .map(|(op, name, clients)| Job {
        suite: "metadata".into(),
        name,
        group: "metadata".into(),
        x: 0.0,
        metric: Metric::OpsPerSec,
        kind: JobKind::Meta { op, files, dirs, clients },
    })
    .collect()
}

/// The jobs of a suite. `p` gives the fio run-time and file size (for iozone: the largest file).
pub fn jobs(suite: &str, p: Params) -> Vec<Job> {
    match suite {
        "smoke" | "quick" | "standard" => cloud(suite, p),
        "mix" => mix(p),
        "scale" => scale(p),
        "iozone" => iozone(p),
        "metadata" => metadata(false),
        "all" => {
            let mut v = cloud("standard", p);
            v.extend(mix(p));
            v.extend(scale(p));
            v.extend(metadata(false));
            v.extend(iozone(Params { size: default_params("iozone").size.min(p.size.max(64 * K)), ..p }));
            v
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|j| j.name.as_str()).collect()
    }

    #[test]
    fn selecting_a_metadata_job_brings_the_jobs_that_make_its_files() {
        let only = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (jobs, added) = select(metadata(false), &only(&["remove 5000 files"]));
        assert_eq!(
            names(&jobs),
            [
                "create 5000 files",
                "rename 5000 files",
                "remove 5000 files",
                "create 5000 files × 8 clients",
                "remove 5000 files × 8 clients"
            ]
        );
        assert_eq!(added, ["create 5000 files", "rename 5000 files", "create 5000 files × 8 clients"]);

        let (jobs, added) = select(metadata(false), &only(&["× 8 clients"]));
        assert_eq!(names(&jobs), ["create 5000 files × 8 clients", "remove 5000 files × 8 clients"]);
        assert!(added.is_empty());

        let (jobs, added) = select(metadata(false), &only(&["rm -rf"]));
        assert_eq!(names(&jobs), ["untar tree", "rm -rf tree"]);
        assert_eq!(added, ["untar tree"]);

        let (jobs, _) = select(metadata(false), &only(&["mkdir-tree"]));
        assert_eq!(jobs.len(), 1);
        // fio jobs have no prerequisites.
        let (jobs, added) = select(cloud("standard", default_params("standard")), &only(&["1m read"]));
        assert!(!jobs.is_empty() && jobs.iter().all(|j| j.name.contains("1m read")));
        assert!(added.is_empty());
    }

    #[test]
    fn a_selection_matches_whole_words_of_job_names() {
        let only = |t: &str| vec![t.to_string()];
        let standard = || jobs("standard", default_params("standard"));
        // iodepth 1 is not iodepth 16 or 128.
        let (qd1, _) = select(standard(), &only("4k randread qd1"));
        assert_eq!(names(&qd1), ["4k randread qd1"]);
        // A job's whole name still matches the longer names that go on with other words.
        let (writes, _) = select(standard(), &only("1m write qd16"));
        assert_eq!(names(&writes), ["1m write qd16", "1m write qd16 stable"]);
        let (fourk, _) = select(standard(), &only("4k"));
        assert!(fourk.len() > 1 && fourk.iter().all(|j| j.name.starts_with("4k ")));
        // Part of a word or number selects nothing.
        assert!(select(standard(), &only("randrea")).0.is_empty());
        assert!(select(standard(), &only("qd")).0.is_empty());
        assert!(select(standard(), &only("")).0.is_empty());
        assert!(names_words("create 5000 files × 8 clients", "× 8 clients"));
    }

    #[test]
    fn standard_has_a_stable_write_job_that_asks_for_file_sync() {
        let jobs = jobs("standard", default_params("standard"));
        let stable: Vec<&Job> = jobs.iter().filter(|j| j.name.ends_with("stable")).collect();
        assert_eq!(stable.len(), 1);
        let JobKind::Fio(s) = &stable[0].kind else { panic!("not a fio job") };
        assert_eq!((s.rw.as_str(), s.bs, s.iodepth), ("write", M, 16));
        assert!(s.options("j").contains(&"--sync=1".to_string()));
        // Every other job stays unstable (the client's default).
        assert!(jobs.iter().filter(|j| !j.name.ends_with("stable")).all(|j| match &j.kind {
            JobKind::Fio(s) => !s.sync && !s.options("j").iter().any(|o| o.starts_with("--sync")),
            _ => true,
        }));
    }

    #[test]
    fn iozone_matrix_follows_iozone_a() {
        let c = iozone_cases(512 * M);
        // 14 file sizes; 94 cases up to 32 MiB, 9 records each for the 4 larger files.
        assert_eq!(c.len(), 130);
        assert!(c.contains(&(64 * K, 4 * K)));
        assert!(!c.contains(&(64 * M, 32 * K)));
        assert!(c.contains(&(512 * M, 16 * M)));
        assert!(c.iter().all(|&(f, r)| r <= f));
    }

    #[test]
    fn quick_has_the_cloud_shapes() {
        let j = jobs("quick", default_params("quick"));
        let names: Vec<&str> = j.iter().map(|j| j.name.as_str()).collect();
        for n in [
            "4k randread qd1",
            "4k randwrite qd128",
            "1m read qd16",
            "8k read qd16",
            "32k write qd16",
            "64k randwrite qd16",
            "16k randrw 75/25 qd16",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(j.iter().map(|j| j.planned_secs()).sum::<f64>() < 150.0);
    }

    #[test]
    fn metadata_has_rename_and_the_real_tree() {
        for suite in ["metadata", "all"] {
            let j: Vec<Job> = jobs(suite, default_params(suite)).into_iter().filter(|j| j.suite == "metadata").collect();
            let names: Vec<&str> = j.iter().map(|j| j.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "mkdir-tree 50 dirs × 100 files",
                    "create 5000 files",
                    "stat 5000 files",
                    "round trip: 5000 GETATTRs of one file",
                    "rename 5000 files",
                    "readdir 5000 files",
                    "readdir 5000 files × 10 listings",
                    "remove 5000 files",
                    "create 5000 files × 8 clients",
                    "remove 5000 files × 8 clients",
                    "untar tree",
                    "cp -r tree",
                    "rm -rf tree"
                ],
                "{suite}"
            );
            let ops: Vec<MetaOp> = j
                .iter()
                .map(|j| match j.kind {
                    JobKind::Meta { op, .. } => op,
                    _ => panic!("{} is not a metadata job", j.name),
                })
                .collect();
            // rename runs on the files create made and stat looked at; readdir and remove
            // see the renamed files; the tree is unpacked before it is copied and removed.
            let at = |op: MetaOp| ops.iter().position(|o| *o == op).unwrap();
            assert!(at(MetaOp::Create) < at(MetaOp::Stat) && at(MetaOp::Stat) < at(MetaOp::Rename));
            // the round trip asks for a file create made, before rename renames it
            assert!(at(MetaOp::Create) < at(MetaOp::RoundTrip) && at(MetaOp::RoundTrip) < at(MetaOp::Rename));
            assert!(at(MetaOp::Rename) < at(MetaOp::Readdir) && at(MetaOp::Readdir) < at(MetaOp::Remove));
            assert!(at(MetaOp::Readdir) < at(MetaOp::Relist) && at(MetaOp::Relist) < at(MetaOp::Remove));
            assert!(at(MetaOp::Untar) < at(MetaOp::CopyTree) && at(MetaOp::CopyTree) < at(MetaOp::RemoveTree));
            assert_eq!(ops.iter().filter(|o| o.is_tree()).count(), 3);
            // the parallel jobs: create, then remove what it made, each by 8 clients
            let parallel: Vec<(MetaOp, u32)> = j
                .iter()
                .filter_map(|j| match j.kind {
                    JobKind::Meta { op, clients, .. } if clients > 1 => Some((op, clients)),
                    _ => None,
                })
                .collect();
            assert_eq!(parallel, [(MetaOp::Create, META_CLIENTS), (MetaOp::Remove, META_CLIENTS)]);
            assert!(j.iter().all(|j| j.metric == Metric::OpsPerSec && j.group == "metadata"));
            assert!(j.iter().all(|j| j.planned_secs() > 0.0));
        }
        // results.json of older runs (without the new operations) still parse
        let old: MetaOp = serde_json::from_str("\"Readdir\"").unwrap();
        assert_eq!(old, MetaOp::Readdir);
        assert_eq!(serde_json::to_string(&MetaOp::CopyTree).unwrap(), "\"CopyTree\"");
        // ... and so do their metadata jobs, which had no client count: one client
        let old: JobKind = serde_json::from_str(r#"{"Meta":{"op":"Create","files":5000,"dirs":50}}"#).unwrap();
        assert_eq!(old, JobKind::Meta { op: MetaOp::Create, files: 5000, dirs: 50, clients: 1 });
    }

    #[test]
    fn no_metadata_step_that_makes_files_runs_after_one_that_frees_them() {
        let j: Vec<Job> = jobs("metadata", default_params("metadata"));
        let order = run_order(&j, 3);
        // every step of every repetition exactly once, each job's repetitions in order
        assert_eq!(order.len(), 3 * j.len());
        for (i, job) in j.iter().enumerate() {
            let reps: Vec<u32> = order.iter().filter(|(_, k)| *k == i).map(|(r, _)| *r).collect();
            assert_eq!(reps, [0, 1, 2], "{}", job.name);
        }
        let op = |i: usize| match j[i].kind {
            JobKind::Meta { op, .. } => op,
            _ => unreachable!(),
        };
        let first_free = order.iter().position(|&(_, i)| op(i).frees_inodes()).unwrap();
        assert!(order[first_free..].iter().all(|&(_, i)| op(i).frees_inodes()), "{order:?}");
        assert_eq!(
            order[..first_free].len(),
            3 * 10,
            "mkdir-tree, create, stat, round trip, rename, readdir, relist, create × 8, untar, cp -r"
        );
        // a freeing step of a repetition runs after the step whose files it removes
        let at = |rep: u32, i: usize| order.iter().position(|&x| x == (rep, i)).unwrap();
        for (i, job) in j.iter().enumerate() {
            let JobKind::Meta { op, clients, .. } = job.kind else { unreachable!() };
            if let Some(need) = op.works_on(clients) {
                let k =
                    j.iter().position(|x| matches!(x.kind, JobKind::Meta { op, clients: c, .. } if op == need && c == clients)).unwrap();
                for rep in 0..3 {
                    assert!(at(rep, k) < at(rep, i), "{} before {}", j[k].name, job.name);
                }
            }
        }
        // fio jobs keep their plain repetition
        let fio = jobs("quick", default_params("quick"));
        assert_eq!(run_order(&fio[..1], 3), [(0, 0), (1, 0), (2, 0)]);
    }

    #[test]
    fn every_suite_has_jobs() {
        for s in SUITES {
            assert!(!jobs(s, default_params(s)).is_empty(), "{s}");
        }
        assert_eq!(jobs("mix", default_params("mix")).len(), 20);
        assert_eq!(jobs("scale", default_params("scale")).len(), 12);
    }
}
