//! `nasd bench`: the NAS benchmark method as a command. Runs the standard workloads
//! (fio with the libnfs engine as the client) against nasd, peers and the local disk in
//! one run, alternating targets per job, and writes report.md, report.html, PNG plots,
//! results.json and the raw fio JSON.

pub mod cpu;
pub mod fio;
pub mod local;
pub mod metrics;
pub mod pagecache;
pub mod plot;
pub mod report;
pub mod suites;
pub mod targets;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use suites::{Job, JobKind, MetaOp, Metric};
use targets::{Target, TargetSpec};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload suite: smoke, quick (~5 min), standard (~20 min), iozone, mix, scale, metadata, all.
    #[arg(long, default_value = "quick")]
    pub suite: String,
    /// Target: nasd, ganesha or nfs://host/export (repeatable). Default: nasd, and ganesha
    /// when ganesha.nfsd is installed. The local disk ceiling is always measured.
    #[arg(long = "target", value_name = "TARGET")]
    pub targets: Vec<String>,
    /// NFS protocol version for the client: v3 or v4 (nasd serves v3 only).
    #[arg(long, default_value = "v3")]
    pub protocol: String,
    /// Report directory (created; its file system also holds the servers' data).
    #[arg(long, value_name = "DIR", default_value = "bench-report")]
    pub out: PathBuf,
    /// Earlier report directory to compare with (its results.json).
    #[arg(long, value_name = "OLD_DIR")]
    pub compare: Option<PathBuf>,
    /// fio binary with the libnfs engine (default: $NASD_FIO, else the test rig's build).
    #[arg(long, value_name = "PATH")]
    pub fio: Option<PathBuf>,
    /// Seconds per fio job (overrides the suite's default).
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u64>,
    /// File size per job, e.g. 64m (for iozone: the largest file).
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Skip the local-disk ceiling.
    #[arg(long)]
    pub no_local: bool,
    /// Keep the servers' data under OUT/data after the run.
    #[arg(long)]
    pub keep_data: bool,
    /// Run each fio and metadata job N times per target (targets interleaved) and report
    /// the median run; iozone passes, which build on each other's files, run once.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub repeat: u32,
    /// Run only the suite's jobs whose name contains TEXT as whole words (repeatable), e.g. "1m read" (not "4k randread qd16" for "4k randread qd1").
    #[arg(long = "only", value_name = "TEXT")]
    pub only: Vec<String>,
}

/// One target's figures for one job.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measurement {
    pub target: String,
    pub fio: Option<fio::FioResult>,
    /// Metadata jobs: operations per second.
    pub ops_per_sec: Option<f64>,
    /// Exact command line(s).
    pub commands: Vec<String>,
    pub server: Option<metrics::ServerFigures>,
    pub error: Option<String>,
    /// Runs given up as stuck and started again before the one that counts.
    #[serde(default)]
    pub stuck_retries: u32,
    /// fio hung on its way out after measuring; the figures cover this many seconds.
    #[serde(default)]
    pub hung_at_exit: Option<f64>,
    /// Metadata jobs: what was timed (ops_per_sec = ops ÷ seconds).
    #[serde(default)]
    pub meta: Option<MetaFigures>,
    /// The local disk's metadata jobs that change something, again with each change made
    /// durable before the next as a `sync` export there makes it
    /// ([`crate::backend::local::DurableCalls`]): the floor for a server that keeps RFC
    /// 1813's promise to a client sending one call at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<MetaFigures>,
    pub seconds: f64,
    /// With --repeat: the job's figure in every repetition, in run order, `None` for a
    /// repetition that failed; this measurement is the median one ([`median_run`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Option<f64>>,
    /// With --repeat: every repetition that failed, with its error (`error` itself is set
    /// only when all of them failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_repeats: Vec<FailedRepeat>,
    /// CPU of the client (fio, nfsh) and of the server while the client ran; none for runs
    /// whose fio was killed.
    #[serde(default)]
    pub cpu: Option<cpu::CpuFigures>,
}

/// A repetition of a job that failed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FailedRepeat {
    /// Its place in run order, from 1.
    pub run: u32,
    pub error: String,
}

/// Writes back every dirty page before a fio, iozone or metadata job starts (not timed), so that
/// no job measures the writeback of an earlier one: a read job right after a write job
/// would otherwise compete with the flushing of gigabytes written before it, and a
/// listing with the metadata writeback of another target's thousands of renames, for
/// whichever target happens to run then.
fn settle_page_cache() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Before a fio job on a server the bench started: the job's file wholly cached, in the
/// folios the job's access pattern would have fetched it in, the same for every target
/// (see `pagecache`). The local disk's jobs use direct I/O, and external servers' files
/// are out of reach.
fn warm_server_file(t: &Target, shape: &fio::FioShape) -> Result<()> {
    match t.data_dir() {
        Some(dir) if !t.is_local() => pagecache::warm(&dir.join(&shape.file), pagecache::CacheState::for_pattern(&shape.rw)).map(drop),
        _ => Ok(()),
    }
}

/// Of one target's repetitions of a job, the measurement with the median figure of those
/// that succeeded; of an even number, the upper middle one, for every target alike (a real
/// run rather than a mean of two, so that the latency, CPU and server figures shown with
/// it are its own). The first repetition if all failed. Failed repetitions stay in sight:
/// `None` in their place in `repeats`, their errors in `failed_repeats`.
pub fn median_run(reps: Vec<Measurement>, metric: Metric) -> Measurement {
    let values: Vec<Option<f64>> = reps.iter().map(|m| m.value(metric)).collect();
    let failed: Vec<FailedRepeat> = reps
        .iter()
        .zip(&values)
        .enumerate()
        .filter(|(_, (_, v))| v.is_none())
        .map(|(i, (m, _))| FailedRepeat { run: i as u32 + 1, error: m.error.clone().unwrap_or_else(|| "no figure".into()) })
        .collect();
    let several = reps.len() > 1;
    let mut ok: Vec<(f64, Measurement)> = reps.iter().zip(&values).filter_map(|(m, v)| v.map(|v| (v, m.clone()))).collect();
    let mut m = if ok.is_empty() {
        reps.into_iter().next().expect("a job runs at least once")
    } else {
        ok.sort_by(|a, b| a.0.total_cmp(&b.0));
        ok.swap_remove(ok.len() / 2).1
    };
    if several {
        m.repeats = values;
        m.failed_repeats = failed;
    }
    m
}

/// The timed part of a metadata job.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MetaFigures {
    pub ops: u64,
    pub seconds: f64,
    /// Bytes copied (untar and cp -r of the real tree).
    #[serde(default)]
    pub bytes: Option<u64>,
}

impl Measurement {
    /// Every failed run behind this measurement: its repetition (from 1, with --repeat)
    /// and its error.
    pub fn failed_runs(&self) -> Vec<(Option<u32>, &str)> {
        if self.failed_repeats.is_empty() {
            self.error.iter().map(|e| (None, e.as_str())).collect()
        } else {
            self.failed_repeats.iter().map(|f| (Some(f.run), f.error.as_str())).collect()
        }
    }

    /// The server process's CPU per operation (µs) of `job`: per counted operation for
    /// metadata jobs; per I/O for fio jobs, its IOPS taken over the ramp and runtime of a
    /// time-based job (the CPU window also holds fio's start and its closing COMMIT, in
    /// which it does no I/O at that rate), over the window otherwise. None where the
    /// window held too few clock ticks to divide ([`cpu::CpuFigures::server_to_divide`]).
    pub fn server_cpu_per_op_us(&self, job: &suites::Job) -> Option<f64> {
        let cpu = self.cpu.as_ref()?;
        let server = cpu.server_to_divide()?;
        match (&self.meta, &self.fio) {
            (Some(meta), _) if meta.ops > 0 => Some(server / meta.ops as f64 * 1e6),
            (_, Some(f)) if f.iops() > 0.0 => {
                let io_seconds = match &job.kind {
                    JobKind::Fio(s) | JobKind::Scale { shape: s, .. } if s.runtime > 0 => ((s.runtime + s.ramp) as f64).min(cpu.seconds),
                    _ => cpu.seconds,
                };
                Some(server / (f.iops() * io_seconds) * 1e6)
            }
            _ => None,
        }
    }

    /// The headline figure of a job (IOPS, MiB/s or ops/s).
    pub fn value(&self, metric: Metric) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        match metric {
            Metric::Iops => self.fio.as_ref().map(|r| r.iops()),
            Metric::MiBs => self.fio.as_ref().map(|r| r.mib_s()),
            Metric::OpsPerSec => self.ops_per_sec,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobResult {
    pub job: Job,
    pub runs: Vec<Measurement>,
}

impl JobResult {
    pub fn get(&self, target: &str) -> Option<&Measurement> {
        self.runs.iter().find(|m| m.target == target)
    }
    pub fn value(&self, target: &str) -> Option<f64> {
        self.get(target).and_then(|m| m.value(self.job.metric))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    pub version: String,
    pub how: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub suite: String,
    pub command: String,
    pub started: String,
    pub seconds: f64,
    pub protocol: String,
    /// The report directory when it ran (shown as `$OUT` in the report).
    #[serde(default)]
    pub out_dir: String,
    pub targets: Vec<TargetInfo>,
    pub facts: Vec<(String, String)>,
    pub notes: Vec<String>,
    pub jobs: Vec<JobResult>,
}

impl Results {
    /// Target names in column order: nasd first, then peers, local last.
    pub fn target_names(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.name.clone()).collect()
    }
    pub fn peers(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.name.clone()).filter(|n| n != "nasd" && n != "local").collect()
    }
    pub fn has(&self, name: &str) -> bool {
        self.targets.iter().any(|t| t.name == name)
    }
}

fn repo_tests_dir() -> Option<PathBuf> {
    // target/release/nasd -> <repo>/tests
    let exe = std::env::current_exe().ok()?;
    let repo = exe.parent()?.parent()?.parent()?;
    let t = repo.join("tests");
    t.join("rig").is_dir().then_some(t)
}

fn cache_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = std::env::var_os("NASD_TEST_CACHE") {
        v.push(PathBuf::from(d));
    }
    if let Some(t) = repo_tests_dir() {
        v.push(t.parent().unwrap().join("target/test-cache"));
    }
    v
}

/// A tool of the test rig: `$ENV`; else what `python3 -m rig.<module>` names (run from
/// the repository's tests directory: the rig knows which build matches its current recipe,
/// e.g. the fio whose libnfs engine honours `sync=1`, and builds it if missing); else,
/// outside a checkout, the newest `<cache>/<prefix>*[/suffix]`.
fn rig_tool(env: &str, prefix: &str, suffix: &str, module: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    if let Some(t) = repo_tests_dir() {
        let o = std::process::Command::new("python3").args(["-m", &format!("rig.{module}")]).current_dir(&t).output()?;
        if o.status.success() {
            let p = String::from_utf8_lossy(&o.stdout).trim().lines().last().unwrap_or("").to_string();
            if !p.is_empty() {
                return Ok(PathBuf::from(p));
            }
        }
        bail!("python3 -m rig.{module} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    }
    for d in cache_dirs() {
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !name.starts_with(prefix) || name.ends_with(".log") || name.ends_with(".lock") {
                    continue;
                }
                let p = if suffix.is_empty() { e.path() } else { e.path().join(suffix) };
                if let Ok(m) = std::fs::metadata(&p) {
                    if m.is_file() {
                        found.push((m.modified().unwrap_or(std::time::UNIX_EPOCH), p));
                    }
                }
            }
        }
        found.sort();
        if let Some((_, p)) = found.pop() {
            return Ok(p);
        }
    }
    bail!("no {prefix} binary: set {env} (or --fio) or run `cd tests && python3 -m rig.{module}`")
}

fn fmt_dur(s: f64) -> String {
    let s = s.max(0.0) as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

fn now_string() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Seconds from the first start to the last end of loops that nfsh processes ran at once
/// (their `started` and `ended`, on the machine's monotonic clock).
fn concurrent_span(loops: &[&serde_json::Value]) -> Result<f64> {
    let mut first_start = f64::INFINITY;
    let mut last_end = f64::NEG_INFINITY;
    for v in loops {
        let (Some(started), Some(ended)) = (v["started"].as_f64(), v["ended"].as_f64()) else {
            bail!("nfsh gave no loop start and end: {v}");
        };
        first_start = first_start.min(started);
        last_end = last_end.max(ended);
    }
    if loops.is_empty() || last_end < first_start {
        bail!("no loop times to span");
    }
    Ok(last_end - first_start)
}

/// An nfsh process of [`Runner::nfsh_mounted`], and what it printed before it was told to
/// begin.
struct MountedClient {
    cmd: String,
    child: std::process::Child,
    said: String,
}

impl MountedClient {
    /// Reads the client's output up to its word that it has mounted; a client that ends
    /// first (it could not mount) keeps what it said for [`MountedClients::run`].
    fn wait_until_mounted(&mut self) -> Result<()> {
        use std::io::Read;
        let Some(out) = self.child.stdout.as_mut() else { return Ok(()) };
        // Byte by byte, so that nothing after the word is read here: the rest is read
        // with the process's end.
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            match out.read(&mut byte) {
                Ok(0) => break,
                Ok(_) if byte[0] == b'\n' => {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    if serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v["ready"] == true) {
                        return Ok(());
                    }
                    self.said.push_str(&text);
                    self.said.push('\n');
                    line.clear();
                }
                Ok(_) => line.push(byte[0]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", self.cmd)),
            }
        }
        self.said.push_str(&String::from_utf8_lossy(&line));
        Ok(())
    }
}

/// nfsh processes that have mounted their target and wait for the end of their standard
/// input to begin. Dropped without [`MountedClients::run`], they are killed.
struct MountedClients {
    clients: Vec<MountedClient>,
}

impl MountedClients {
    /// Tells every client to begin, waits for all of them, and returns each one's
    /// command line and result (its last output line) in order; fails if any failed.
    fn run(mut self) -> Result<Vec<(String, serde_json::Value)>> {
        for c in &mut self.clients {
            drop(c.child.stdin.take());
        }
        // Wait for every process, even after a failure, so none is left behind.
        let finished: Vec<_> = std::mem::take(&mut self.clients).into_iter().map(|c| (c.cmd, c.said, c.child.wait_with_output())).collect();
        finished
            .into_iter()
            .map(|(cmd, said, o)| {
                let o = o.with_context(|| cmd.clone())?;
                let out = said + &String::from_utf8_lossy(&o.stdout);
                if !o.status.success() {
                    bail!("{cmd}: {}{}", out, String::from_utf8_lossy(&o.stderr));
                }
                let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or("{}")).context("nfsh output")?;
                Ok((cmd, v))
            })
            .collect()
    }
}

impl Drop for MountedClients {
    fn drop(&mut self) {
        for c in &mut self.clients {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
    }
}

struct Runner {
    fio: PathBuf,
    nfsh: Option<PathBuf>,
    raw: PathBuf,
    /// (target, file) -> size laid out
    laid_out: HashMap<(String, String), u64>,
    /// The source tree of the real-tree jobs (copied before the jobs), or why there is none.
    tree: Option<std::result::Result<local::TreeSource, String>>,
    /// Which repetition is running (0 = the first).
    round: u32,
    /// nasd's counters as the running job's timed part started ([`Runner::timed_part_starts`]).
    server_before: Option<metrics::Snapshot>,
}

/// A figure an nfsh loop reported: missing is an error, not a zero that would make up a
/// rate (no seconds: billions of operations a second).
fn reported(v: &serde_json::Value, key: &str) -> Result<f64> {
    v[key].as_f64().ok_or_else(|| anyhow!("nfsh reported no {key:?}: {v}"))
}

/// The seconds an nfsh loop took, which must be more than none.
fn reported_seconds(v: &serde_json::Value) -> Result<f64> {
    Some(reported(v, "seconds")?).filter(|&s| s > 0.0).ok_or_else(|| anyhow!("nfsh reported no time taken: {v}"))
}

/// A job labelled stable (fio `sync=1`) must have sent stable WRITEs only, where the
/// server counts them (nasd's metrics): a fio without the rig's patch ignores `sync=1`
/// with the libnfs engine, and its figure would be of unstable writes under a stable
/// label.
fn stable_writes_were_stable(job: &Job, server: Option<&metrics::ServerFigures>) -> Result<()> {
    let shape = match &job.kind {
        JobKind::Fio(shape) | JobKind::Scale { shape, .. } | JobKind::Iozone { shape, .. } => shape,
        JobKind::Meta { .. } => return Ok(()),
    };
    let unstable = server.and_then(|s| s.writes_by_stability.get("unstable")).copied().unwrap_or(0);
    if shape.sync && unstable > 0 {
        bail!("{unstable} UNSTABLE WRITEs in a job of stable writes: this fio ignores --sync=1 with the nfs engine (build it with tests/rig/fio-libnfs-sync.patch)");
    }
    Ok(())
}

impl Runner {
    fn save_raw(&self, tag: &str, text: &str) {
        let _ = std::fs::write(self.raw.join(format!("{tag}.json")), text);
    }

    /// This repetition's directory for the metadata jobs, `round-N` (N from 1).
    fn round_dir(&self) -> String {
        format!("round-{}", self.round + 1)
    }

    /// `path` (from the export's root) for this repetition's metadata jobs. Each repetition
    /// works in a directory of its own, so that none finds files an earlier one left (a run
    /// of steps selected only in part leaves its files, as `--only stat` leaves those
    /// `create` made). The first does too, with or without --repeat: libnfs resolves every
    /// path from the export's root, a LOOKUP per directory, so a repetition one directory
    /// deeper than another would pay a round trip more per operation.
    fn meta_path(&self, path: &str) -> String {
        format!("/{}{path}", self.round_dir())
    }

    /// The same place as [`Self::meta_path`], in the directory `root` the export serves.
    fn meta_root(&self, root: &Path) -> PathBuf {
        root.join(self.round_dir())
    }

    /// Makes this repetition's directory for the metadata jobs (not timed).
    fn enter_round(&self, t: &Target) -> Result<()> {
        match &t.local_dir {
            Some(root) => std::fs::create_dir_all(self.meta_root(root)).context("making the repetition's directory"),
            None => {
                // An earlier job of this repetition may have made it already.
                let _ = self.nfsh(t, &["mkdir".into(), self.meta_path("")]);
                Ok(())
            }
        }
    }

    /// Read jobs can't create files through libnfs: write the file at bs=128k first.
    fn ensure_file(&mut self, t: &Target, file: &str, size: u64) -> Result<()> {
        let key = (t.name.clone(), file.to_string());
        if self.laid_out.get(&key).is_some_and(|&s| s >= size) {
            return Ok(());
        }
        let args = fio::layout_command(file, size, &t.engine);
        fio::run(&self.fio, &args, fio::Deadlines::size_based(600)).with_context(|| format!("laying out {file} on {}", t.name))?;
        self.laid_out.insert(key, size);
        Ok(())
    }

    /// Marks the start of a job's timed part: reads the server's counters here, after the
    /// file layout, mkdirs and any other untimed setup (and again before a stuck run is
    /// started over), so that the server's figures count the timed client alone.
    fn timed_part_starts(&mut self, t: &Target) {
        self.server_before = t.metrics.and_then(|a| metrics::scrape(a).ok());
    }

    fn remove_file(&mut self, t: &Target, file: &str) {
        self.laid_out.remove(&(t.name.clone(), file.to_string()));
        if let Some(d) = t.data_dir() {
            let _ = std::fs::remove_file(d.join(file));
        } else if let (Some(nfsh), Some(url)) = (&self.nfsh, &t.url) {
            let _ = std::process::Command::new(nfsh).args([url.as_str(), "unlink", &format!("/{file}")]).output();
        }
    }

    fn nfsh(&self, t: &Target, args: &[String]) -> Result<(String, serde_json::Value)> {
        Ok(self.nfsh_mounted(t, &[args.to_vec()])?.run()?.remove(0))
    }

    /// Starts one nfsh per argument list and returns once every one has mounted the
    /// target and waits for the word to begin ([`MountedClients::run`]): what is timed then
    /// leaves the mounts out, and clients started together begin together.
    fn nfsh_mounted(&self, t: &Target, arg_lists: &[Vec<String>]) -> Result<MountedClients> {
        let nfsh = self.nfsh.as_ref().ok_or_else(|| anyhow!("no libnfs helper (nfsh): run `cd tests && python3 -m rig.nfsh`"))?;
        let url = t.url.as_ref().ok_or_else(|| anyhow!("{} has no NFS URL", t.name))?;
        let mut clients = MountedClients { clients: Vec::new() };
        for args in arg_lists {
            let mut argv = vec![url.clone()];
            argv.extend(args.iter().cloned());
            let cmd = format!("nfsh {}", fio::shell_join(&argv));
            let child = std::process::Command::new(nfsh)
                .args(&argv)
                .env("NFSH_START_ON_EOF", "1")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", nfsh.display()))?;
            // Dropped on an error: every client started is killed and waited for.
            clients.clients.push(MountedClient { cmd, child, said: String::new() });
        }
        for c in &mut clients.clients {
            c.wait_until_mounted()?;
        }
        Ok(clients)
    }

    /// Runs one nfsh per argument list as a metadata job's timed part: mounted first, then
    /// the server's counters and the CPU window start and every client begins at once.
    /// Records the window and the command lines in `m`; returns each client's command
    /// line and result.
    fn nfsh_timed(&mut self, t: &Target, arg_lists: &[Vec<String>], m: &mut Measurement) -> Result<Vec<(String, serde_json::Value)>> {
        let mounted = self.nfsh_mounted(t, arg_lists)?;
        self.timed_part_starts(t);
        let window = cpu::CpuWindow::start(t.pid());
        let runs = mounted.run()?;
        m.cpu = Some(window.finish());
        m.commands.extend(runs.iter().map(|(cmd, _)| cmd.clone()));
        Ok(runs)
    }

    /// The parallel metadata jobs: `clients` nfsh processes at once, each creating (or
    /// removing) its share of `files` in a directory of its own, `/md-par/cN`. The figure is
    /// all their operations over the time from the first loop's start to the last one's
    /// end. Locally: as many threads.
    fn run_parallel_meta(&mut self, t: &Target, op: MetaOp, files: u32, clients: u32, tag: &str, m: &mut Measurement) -> Result<()> {
        let per = (files / clients).max(1);
        let expected = per as u64 * clients as u64;
        let (ops, secs) = if let Some(root) = t.local_dir.clone() {
            let root = self.meta_root(&root);
            m.commands.push(format!("local system calls: {op:?} over {per} files in each of {clients} directories, one thread each"));
            let plain = local::meta_parallel(&root, op, per, clients, None)?;
            let (ops, seconds) =
                durable_local(&root, &mut m.commands, "", |dir, calls| local::meta_parallel(dir, op, per, clients, Some(calls)))?;
            m.durable = Some(MetaFigures { ops, seconds, bytes: None });
            plain
        } else {
            let dirs: Vec<String> = (0..clients).map(|c| self.meta_path(&format!("/md-par/c{c}"))).collect();
            let loops: Vec<Vec<String>> = match op {
                MetaOp::Create => {
                    // Not timed; a directory left by an earlier run is reused.
                    let _ = self.nfsh(t, &["mkdir".into(), self.meta_path("/md-par")]);
                    for d in &dirs {
                        let _ = self.nfsh(t, &["mkdir".into(), d.clone()]);
                    }
                    dirs.iter().map(|d| vec!["create-loop".into(), d.clone(), per.to_string()]).collect()
                }
                MetaOp::Remove => dirs.iter().map(|d| vec!["remove-loop".into(), d.clone(), per.to_string(), "f".into()]).collect(),
                _ => bail!("{op:?} has no parallel form"),
            };
            let runs = self.nfsh_timed(t, &loops, m)?;
            let values: Vec<&serde_json::Value> = runs.iter().map(|(_, v)| v).collect();
            self.save_raw(tag, &serde_json::json!(values).to_string());
            let ops: f64 = values.iter().map(|v| reported(v, "ops")).sum::<Result<f64>>()?;
            (ops as u64, concurrent_span(&values)?)
        };
        if ops != expected {
            bail!("{clients} clients did {ops} operations, expected {expected}");
        }
        m.ops_per_sec = Some(ops as f64 / secs.max(1e-9));
        m.meta = Some(MetaFigures { ops, seconds: secs, bytes: None });
        Ok(())
    }

    fn run_job(&mut self, t: &mut Target, job: &Job, idx: usize) -> Measurement {
        let mut m = Measurement { target: t.name.clone(), ..Default::default() };
        let t0 = Instant::now();
        self.server_before = None;
        let r = if job.is_meta() { self.enter_round(t) } else { Ok(()) };
        // The counters before were read where the timed part started; nothing after it
        // reaches the server (untimed removals after rm -rf and iozone go through the disk).
        let r = r.and_then(|()| self.run_job_inner(t, job, idx, &mut m));
        if let (Some(b), Some(a)) = (self.server_before.take(), t.metrics.and_then(|a| metrics::scrape(a).ok())) {
            m.server = Some(metrics::diff(&b, &a));
        }
        let r = r.and_then(|()| stable_writes_were_stable(job, m.server.as_ref()));
        if let Err(e) = r {
            m.error = Some(format!("{e:#}"));
            eprintln!("bench:   {} failed: {e:#}", t.name);
        }
        if let Err(e) = t.check_alive() {
            m.error.get_or_insert(format!("{e:#}"));
            eprintln!("bench:   {e:#}: restarting it over the same data");
            if let Err(e) = t.restart() {
                eprintln!("bench:   restart failed: {e:#}");
            }
        }
        m.seconds = t0.elapsed().as_secs_f64();
        m
    }

    fn run_job_inner(&mut self, t: &mut Target, job: &Job, idx: usize, m: &mut Measurement) -> Result<()> {
        // Each repetition keeps its own raw output.
        let round = match self.round {
            0 => String::new(),
            r => format!("-r{}", r + 1),
        };
        let tag = |suffix: &str| format!("{:03}-{}-{}{}{}", idx, slug(&job.name), t.name, round, suffix);
        match &job.kind {
            JobKind::Fio(s) => {
                self.ensure_file(t, &s.file, s.size)?;
                warm_server_file(t, s)?;
                settle_page_cache();
                let args = fio::command_line(s, &slug(&job.name), &t.engine);
                m.commands.push(format!("fio {}", fio::shell_join(&args)));
                self.timed_part_starts(t);
                let window = cpu::CpuWindow::start(t.pid());
                let run = loop {
                    match fio::run(&self.fio, &args, deadlines(s)) {
                        // libnfs (4.0) now and then never completes its last 1 MiB READs,
                        // against any server: run it again rather than lose the figure.
                        Err(e) if e.is::<fio::Stuck>() && m.stuck_retries < STUCK_RETRIES => {
                            m.stuck_retries += 1;
                            eprintln!("bench:   {} stuck (fio waits for a reply that never comes); running it again", t.name);
                            // From where the first run started: the file read into the
                            // server's cache and everything written before made durable.
                            warm_server_file(t, s)?;
                            settle_page_cache();
                            self.timed_part_starts(t);
                        }
                        r => break r?,
                    }
                };
                m.cpu = window.finish_unless(run.hung_at_exit.is_some() || m.stuck_retries > 0);
                self.save_raw(&tag(""), &run.raw);
                m.hung_at_exit = run.hung_at_exit;
                m.fio = Some(run.result);
            }
            JobKind::Iozone { op, shape } => {
                if op == "write" {
                    self.remove_file(t, &shape.file);
                } else {
                    self.ensure_file(t, &shape.file, shape.size)?;
                }
                settle_page_cache();
                let args = fio::command_line(shape, op, &t.engine);
                m.commands.push(format!("fio {}", fio::shell_join(&args)));
                self.timed_part_starts(t);
                let window = cpu::CpuWindow::start(t.pid());
                let run = fio::run(&self.fio, &args, fio::Deadlines::size_based(1800))?;
                m.cpu = window.finish_unless(run.hung_at_exit.is_some());
                self.save_raw(&tag(""), &run.raw);
                m.fio = Some(run.result);
                self.laid_out.insert((t.name.clone(), shape.file.clone()), shape.size);
                if op == "reread" {
                    self.remove_file(t, &shape.file);
                }
            }
            JobKind::Scale { clients, shape } => {
                let mut children = Vec::new();
                let mut argvs = Vec::new();
                for c in 0..*clients {
                    let mut s = shape.clone();
                    s.file = format!("scale-c{c}.dat");
                    self.ensure_file(t, &s.file, s.size)?;
                    warm_server_file(t, &s)?;
                    let args = fio::command_line(&s, &format!("client{c}"), &t.engine);
                    m.commands.push(format!("fio {}", fio::shell_join(&args)));
                    argvs.push((s, args));
                }
                settle_page_cache();
                self.timed_part_starts(t);
                let window = cpu::CpuWindow::start(t.pid());
                // Separate processes (own connections), started together.
                for (_, args) in &argvs {
                    children.push(fio::spawn(&self.fio, args)?);
                }
                let mut parts = Vec::new();
                let mut first_err = None;
                for (c, (child, (s, args))) in children.into_iter().zip(&argvs).enumerate() {
                    match fio::wait(child, args, deadlines(s)) {
                        Ok(run) => {
                            self.save_raw(&tag(&format!("-c{c}")), &run.raw);
                            if run.hung_at_exit.is_some() {
                                m.hung_at_exit = run.hung_at_exit;
                            }
                            parts.push(run.result);
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                m.cpu = window.finish_unless(m.hung_at_exit.is_some());
                if let Some(e) = first_err {
                    return Err(e);
                }
                m.fio = Some(fio::FioResult::aggregate(&parts));
            }
            JobKind::Meta { op, .. } if op.is_tree() => {
                settle_page_cache();
                let tag = tag("");
                self.run_tree_job(t, *op, &tag, m)?;
            }
            JobKind::Meta { op, files, clients, .. } if *clients > 1 => {
                settle_page_cache();
                self.run_parallel_meta(t, *op, *files, *clients, &tag(""), m)?;
            }
            JobKind::Meta { op, files, dirs, .. } => {
                settle_page_cache();
                if let Some(dir) = t.local_dir.clone() {
                    let root = self.meta_root(&dir);
                    let (ops, secs) = local::meta(&root, *op, *files, *dirs, None)?;
                    m.commands.push(format!("local system calls: {:?} over {files} files", op));
                    let mut raw = serde_json::json!({"op": format!("{op:?}"), "ops": ops, "seconds": secs});
                    if op.changes_the_namespace() {
                        let (ops, seconds) =
                            durable_local(&root, &mut m.commands, "", |dir, calls| local::meta(dir, *op, *files, *dirs, Some(calls)))?;
                        raw["durable"] = serde_json::json!({"ops": ops, "seconds": seconds});
                        m.durable = Some(MetaFigures { ops, seconds, bytes: None });
                    }
                    self.save_raw(&tag(""), &raw.to_string());
                    m.ops_per_sec = Some(ops as f64 / secs.max(1e-9));
                    m.meta = Some(MetaFigures { ops, seconds: secs, bytes: None });
                    return Ok(());
                }
                let per = (files / dirs.max(&1)).max(1);
                let flat = self.meta_path("/md-flat");
                let (args, count_key): (Vec<String>, &str) = match op {
                    MetaOp::Tree => (vec!["mkdir-tree".into(), self.meta_path("/md-tree"), dirs.to_string(), per.to_string()], "ops"),
                    MetaOp::Create => {
                        let _ = self.nfsh(t, &["mkdir".into(), flat.clone()]);
                        (vec!["create-loop".into(), flat, files.to_string()], "ops")
                    }
                    MetaOp::Stat => (vec!["stat-loop".into(), flat, files.to_string()], "ops"),
                    MetaOp::RoundTrip => (vec!["getattr-loop".into(), format!("{flat}/f00000000"), files.to_string()], "ops"),
                    // f00000000 -> r00000000 ...: readdir and remove then see the new names.
                    MetaOp::Rename => (vec!["rename-loop".into(), flat, files.to_string(), "f".into(), "r".into()], "ops"),
                    MetaOp::Readdir => (vec!["readdir".into(), flat], "count"),
                    MetaOp::Relist => (vec!["readdir".into(), flat, "--times".into(), suites::RELISTINGS.to_string()], "count"),
                    MetaOp::Remove => (vec!["remove-loop".into(), flat, files.to_string(), "r".into()], "ops"),
                    MetaOp::Untar | MetaOp::CopyTree | MetaOp::RemoveTree => unreachable!("real-tree jobs run in run_tree_job"),
                };
                let (_, v) = self.nfsh_timed(t, &[args], m)?.remove(0);
                self.save_raw(&tag(""), &v.to_string());
                let (mut ops, secs) = (reported(&v, count_key)?, reported_seconds(&v)?);
                if matches!(op, MetaOp::Readdir | MetaOp::Relist) {
                    // nfsh counts the entries of one listing, and checks every other finds as many.
                    if ops != *files as f64 {
                        bail!("readdir found {ops} entries, expected {files}");
                    }
                    ops *= reported(&v, "listings")?;
                }
                m.ops_per_sec = Some(ops / secs.max(1e-9));
                m.meta = Some(MetaFigures { ops: ops as u64, seconds: secs, bytes: None });
            }
        }
        Ok(())
    }
}

impl Runner {
    /// The real-tree workload: untar (the source tree from the local disk into the export),
    /// cp -r (the unpacked tree inside the export) and rm -rf (the unpacked tree), through
    /// nfsh put-tree / copy-tree / remove-tree, or with std::fs on the local disk. Every run
    /// must handle the whole source tree: a file missing from a copy is an error.
    fn run_tree_job(&mut self, t: &Target, op: MetaOp, tag: &str, m: &mut Measurement) -> Result<()> {
        let src = match &self.tree {
            Some(Ok(s)) => s.clone(),
            Some(Err(e)) => bail!("no source tree: {e}"),
            None => bail!("no source tree prepared"),
        };
        let (got, secs) = if let Some(dir) = t.local_dir.clone() {
            let dir = self.meta_root(&dir);
            let (st, secs) = local::tree(&dir, op, &src.path, None)?;
            m.commands.push(match op {
                MetaOp::Untar => format!("local std::fs: copy {} to {}", src.path.display(), dir.join("tree-untar").display()),
                MetaOp::CopyTree => {
                    format!("local std::fs: copy {} to {}", dir.join("tree-untar").display(), dir.join("tree-copy").display())
                }
                _ => format!("local std::fs: remove_dir_all {}", dir.join("tree-untar").display()),
            });
            let (durable, seconds) = durable_local(&dir, &mut m.commands, "one entry at a time as nfsh does, ", |root, calls| {
                local::tree(root, op, &src.path, Some(calls))
            })?;
            if durable != st {
                bail!("{op:?} with each change durable handled {}, without {}", durable.describe(), st.describe());
            }
            m.durable = Some(MetaFigures { ops: durable.ops(), seconds, bytes: (op != MetaOp::RemoveTree).then_some(durable.bytes) });
            let mut v = serde_json::to_value(st)?;
            v["op"] = format!("{op:?}").into();
            v["ops"] = st.ops().into();
            v["seconds"] = secs.into();
            v["durable"] = serde_json::json!({"ops": durable.ops(), "seconds": seconds});
            self.save_raw(tag, &v.to_string());
            (st, secs)
        } else {
            let (untar, copy) = (self.meta_path("/tree-untar"), self.meta_path("/tree-copy"));
            let args: Vec<String> = match op {
                MetaOp::Untar => vec!["put-tree".into(), src.path.display().to_string(), untar],
                MetaOp::CopyTree => vec!["copy-tree".into(), untar, copy.clone()],
                _ => vec!["remove-tree".into(), untar],
            };
            let (_, v) = self.nfsh_timed(t, &[args], m)?.remove(0);
            self.save_raw(tag, &v.to_string());
            if op == MetaOp::RemoveTree {
                // The copy goes too, not timed.
                if let Some(d) = t.data_dir() {
                    let _ = std::fs::remove_dir_all(self.meta_root(&d).join("tree-copy"));
                } else {
                    let _ = self.nfsh(t, &["remove-tree".into(), copy]);
                }
            }
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            (local::TreeStats { files: n("files"), dirs: n("dirs"), links: n("links"), bytes: n("bytes") }, reported_seconds(&v)?)
        };
        let with_bytes = op != MetaOp::RemoveTree;
        let want = local::TreeStats { bytes: if with_bytes { src.stats.bytes } else { 0 }, ..src.stats };
        let seen = local::TreeStats { bytes: if with_bytes { got.bytes } else { 0 }, ..got };
        if seen != want {
            bail!("{op:?} handled {} of the source tree's {}", seen.describe(), want.describe());
        }
        m.ops_per_sec = Some(got.ops() as f64 / secs.max(1e-9));
        m.meta = Some(MetaFigures { ops: got.ops(), seconds: secs, bytes: with_bytes.then_some(got.bytes) });
        Ok(())
    }
}

/// Runs a local metadata job again with each change durable: `job` in `durable` below
/// this repetition's directory `root`, with the calls that make each change there
/// durable; says so in `commands` (`how`: how the job goes, before the calls named).
fn durable_local<T>(
    root: &Path,
    commands: &mut Vec<String>,
    how: &str,
    job: impl FnOnce(&Path, &crate::backend::local::DurableCalls) -> Result<T>,
) -> Result<T> {
    let dir = root.join("durable");
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    let calls = crate::backend::local::DurableCalls::for_dir(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let done = job(&dir, &calls)?;
    commands.push(format!("the same in {}, {how}each change then made durable with {}", dir.display(), calls.describe()));
    Ok(done)
}

/// A time-based job that runs much longer than asked is stuck (a client waiting for a
/// reply that never comes): give up on it.
fn deadlines(s: &fio::FioShape) -> fio::Deadlines {
    if s.runtime > 0 {
        fio::Deadlines::time_based(s.runtime, s.ramp, 2 * (s.runtime + s.ramp) + 30)
    } else {
        fio::Deadlines::size_based(1800)
    }
}

/// How often a stuck fio run is started again.
const STUCK_RETRIES: u32 = 2;

pub fn slug(s: &str) -> String {
    let mut o = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            o.push(c);
        } else if !o.ends_with('-') {
            o.push('-');
        }
    }
    o.trim_matches('-').to_string()
}

pub fn run(args: BenchArgs) -> Result<()> {
    let t_start = Instant::now();
    if !suites::SUITES.contains(&args.suite.as_str()) {
        bail!("unknown suite {:?}: one of {}", args.suite, suites::SUITES.join(", "));
    }
    let protocol: u32 = match args.protocol.as_str() {
        "v3" | "3" => 3,
        "v4" | "4" => 4,
        p => bail!("unknown protocol {p:?}: v3 or v4"),
    };
    // Read before any job runs: a report to compare with that cannot be read should stop
    // the run at once, not after it, without its report.
    let old = match &args.compare {
        Some(d) => Some(
            serde_json::from_str::<Results>(
                &std::fs::read_to_string(d.join("results.json")).with_context(|| format!("{}/results.json", d.display()))?,
            )
            .with_context(|| format!("parsing {}/results.json", d.display()))?,
        ),
        None => None,
    };
    let mut params = suites::default_params(&args.suite);
    if let Some(r) = args.runtime {
        params.runtime = r;
        params.ramp = params.ramp.min(r / 5);
    }
    if let Some(s) = &args.size {
        params.size = fio::parse_size(s)?;
    }
    let mut jobs = suites::jobs(&args.suite, params);
    if !args.only.is_empty() {
        let (selected, added) = suites::select(jobs, &args.only);
        if selected.is_empty() {
            bail!("--only {:?} matches no job of suite {}", args.only, args.suite);
        }
        for name in added {
            eprintln!("bench: also running {name:?}: a selected job works on its files");
        }
        jobs = selected;
    }

    let mut specs: Vec<TargetSpec> = args.targets.iter().map(|t| TargetSpec::parse(t)).collect::<Result<_>>()?;
    if specs.is_empty() {
        if protocol == 3 {
            specs.push(TargetSpec::Nasd);
        }
        if targets::ganesha_available() {
            specs.push(TargetSpec::Ganesha);
        }
    }
    if specs.is_empty() {
        bail!("no target: give --target");
    }
    // nasd first, local last.
    specs.sort_by_key(|s| match s {
        TargetSpec::Nasd => 0,
        TargetSpec::Local => 3,
        TargetSpec::Ganesha => 1,
        TargetSpec::Url(_) => 2,
    });
    specs.dedup();
    if !args.no_local && !specs.contains(&TargetSpec::Local) {
        specs.push(TargetSpec::Local);
    }

    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let out = args.out.canonicalize()?;
    let raw = out.join("raw");
    let _ = std::fs::remove_dir_all(&raw);
    std::fs::create_dir_all(&raw)?;
    let work = out.join("data");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;

    let fio_bin = match &args.fio {
        Some(f) => f.clone(),
        None => rig_tool("NASD_FIO", "fio-libnfs-", "fio", "fio")?,
    };
    if !fio::engines(&fio_bin).iter().any(|e| e == "nfs") {
        bail!("{} has no nfs ioengine: build fio with libnfs (cd tests && python3 -m rig.fio)", fio_bin.display());
    }
    let needs_nfsh = jobs.iter().any(|j| matches!(j.kind, JobKind::Meta { .. }));
    let nfsh = if needs_nfsh { Some(rig_tool("NASD_NFSH", "nfsh-", "", "nfsh")?) } else { None };
    let local_engine = if specs.contains(&TargetSpec::Local) { local::pick_engine(&fio_bin, &work.join("local")) } else { "psync".into() };

    let font_ok = plot::load_font();
    if let Err(e) = &font_ok {
        bail!("{e:#}");
    }

    eprintln!("bench: suite {} ({} jobs), fio {}", args.suite, jobs.len(), fio_bin.display());
    let mut tgts: Vec<Target> = Vec::new();
    for s in &specs {
        let name = match s {
            TargetSpec::Nasd => "nasd".to_string(),
            TargetSpec::Ganesha => "ganesha".into(),
            TargetSpec::Local => "local".into(),
            TargetSpec::Url(_) => format!("url{}", tgts.len()),
        };
        eprintln!("bench: starting {name}");
        tgts.push(Target::start(s, &work.join(&name), protocol, &local_engine)?);
    }
    let mut names: Vec<String> = tgts.iter().map(|t| t.name.clone()).collect();
    targets::make_names_unique(&mut names);
    for (t, name) in tgts.iter_mut().zip(names) {
        t.name = name;
    }
    let mut notes = Vec::new();
    if args.suite == "iozone" || args.suite == "all" {
        notes.push("iozone matrix: driven by fio (iozone is not packaged in the registries we use): one pass per case, write = new file, rewrite = same file again, read and re-read = two passes over it, iodepth 1.".into());
    }
    if local_engine == "psync" {
        notes.push("local ceiling uses ioengine=psync (synchronous): its iodepth is effectively 1".into());
    }

    let mut runner = Runner { fio: fio_bin.clone(), nfsh, raw, laid_out: HashMap::new(), tree: None, round: 0, server_before: None };
    if jobs.iter().any(|j| matches!(j.kind, JobKind::Meta { op, .. } if op.is_tree())) {
        eprintln!("bench: copying the source tree of the real-tree jobs to {} (not timed)", work.join("tree-src").display());
        let src = local::prepare_tree_source(&work.join("tree-src")).map_err(|e| format!("{e:#}"));
        match &src {
            Ok(s) => notes.push(format!(
                "real-tree jobs (untar, cp -r, rm -rf): {}, copied once to {} before the jobs: {} ({} operations per job)",
                s.what,
                s.path.display(),
                s.stats.describe(),
                s.stats.ops()
            )),
            Err(e) => {
                eprintln!("bench: no source tree: {e}");
                notes.push(format!("real-tree jobs: no source tree ({e})"));
            }
        }
        runner.tree = Some(src);
    }
    let planned_total: f64 = jobs.iter().map(|j| j.planned_secs() * j.repetitions(args.repeat) as f64).sum::<f64>() * tgts.len() as f64;
    if jobs.iter().any(|j| matches!(j.kind, JobKind::Fio(_) | JobKind::Scale { .. })) {
        notes.push(pagecache::REPORT_NOTE.into());
    }
    if args.repeat > 1 {
        notes.push(format!("each fio and metadata job ran {} times per target (targets interleaved; the metadata jobs as a whole run of steps, each repetition in a directory of its own, round-N, since each step works on the files an earlier one made); tables show the median of the runs that succeeded (of an even number, the upper middle run), the section Repetitions lists every figure and failed run. iozone jobs ran once.", args.repeat));
    }
    let meta_step = |frees: bool| jobs.iter().any(|j| j.is_meta() && j.frees_inodes() == frees);
    if meta_step(true) && meta_step(false) {
        notes.push("the metadata steps that remove files (remove, rm -rf) ran after all the others, those of every repetition: ext4 without a journal passes over each inode freed in the last minute whenever it allocates one, so creates made soon after thousands of removals are slower, whichever server makes them (removals by other programs shortly before the run count too).".into());
    }
    if specs.contains(&TargetSpec::Local) && jobs.iter().any(|j| matches!(j.kind, JobKind::Meta { op, .. } if op.changes_the_namespace())) {
        notes.push("local, each change durable: the local disk ran each metadata job that creates, renames or removes again, in a directory of its own, making every change durable before the next one as a sync export on this file system makes it (the machine table says how) and each copied file's data once written, as its COMMIT does; one change at a time, as nfsh's loops send them. With one such client, that is the floor on this file system for a server that makes each change durable before its reply (RFC 1813) the way nasd does.".into());
    }
    let mut planned_done = 0.0;
    let t_jobs = Instant::now();
    let mut results: Vec<JobResult> = Vec::new();
    let n = jobs.len();
    let k = tgts.len();
    let mut first = 0;
    while first < n {
        // A job repeats on its own, except metadata steps: each works on the files an
        // earlier one made, so a run of them repeats as a whole.
        let end = if jobs[first].is_meta() { first + jobs[first..].iter().take_while(|j| j.is_meta()).count() } else { first + 1 };
        let reps = jobs[first].repetitions(args.repeat);
        let mut per_job: Vec<Vec<Vec<Measurement>>> = vec![vec![Vec::new(); k]; end - first];
        for (rep, at) in suites::run_order(&jobs[first..end], reps) {
            runner.round = rep;
            let (i, job) = (first + at, &jobs[first + at]);
            // Alternate which target goes first (fairness: caches, disk state, thermal).
            for step in 0..k {
                let ti = (i + rep as usize + step) % k;
                let elapsed = t_jobs.elapsed().as_secs_f64();
                let eta = if planned_done > 0.0 { (planned_total - planned_done) * elapsed / planned_done } else { planned_total };
                let of = if reps > 1 { format!(" ({}/{reps})", rep + 1) } else { String::new() };
                eprintln!(
                    "bench: [{}/{n}] {:<8} {:<40} elapsed {} ETA {}",
                    i + 1,
                    tgts[ti].name,
                    format!("{}{of}", job.name),
                    fmt_dur(elapsed),
                    fmt_dur(eta)
                );
                per_job[at][ti].push(runner.run_job(&mut tgts[ti], job, i));
                planned_done += job.planned_secs();
            }
        }
        runner.round = 0;
        let order: Vec<String> = tgts.iter().map(|t| t.name.clone()).collect();
        for (job, per_target) in jobs[first..end].iter().zip(per_job) {
            let mut runs: Vec<Measurement> = per_target.into_iter().filter(|v| !v.is_empty()).map(|v| median_run(v, job.metric)).collect();
            runs.sort_by_key(|m| order.iter().position(|n| *n == m.target));
            results.push(JobResult { job: job.clone(), runs });
        }
        first = end;
    }

    let mut facts = report::machine_facts(&out);
    facts.push(("fio".into(), format!("{} (libnfs engine; {})", fio::version(&fio_bin), fio_bin.file_name().unwrap().to_string_lossy())));
    facts.push(("local fio engine".into(), format!("{local_engine}, direct=1")));
    let results = Results {
        suite: args.suite.clone(),
        command: std::iter::once("nasd".to_string()).chain(std::env::args().skip(1)).collect::<Vec<_>>().join(" "),
        started: now_string(),
        seconds: t_start.elapsed().as_secs_f64(),
        protocol: format!("NFSv{protocol}"),
        out_dir: out.display().to_string(),
        targets: tgts.iter().map(|t| TargetInfo { name: t.name.clone(), version: t.version.clone(), how: t.how.clone() }).collect(),
        facts,
        notes,
        jobs: results,
    };
    for t in &mut tgts {
        t.stop();
        if !args.keep_data {
            t.cleanup();
        }
    }
    drop(tgts);
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    let plots = plot::all(&results, &out)?;
    std::fs::write(out.join("report.md"), report::markdown(&results, old.as_ref(), &plots))?;
    std::fs::write(out.join("report.html"), report::html(&results, old.as_ref(), &plots))?;
    if !args.keep_data {
        let _ = std::fs::remove_dir_all(&work);
    }
    let failed: usize = results.jobs.iter().flat_map(|j| &j.runs).map(|m| m.failed_runs().len()).sum();
    eprintln!(
        "bench: done in {}; report in {}/report.md ({} failed runs)",
        fmt_dur(t_start.elapsed().as_secs_f64()),
        out.display(),
        failed
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(v: Option<f64>) -> Measurement {
        Measurement { target: "nasd".into(), ops_per_sec: v, error: v.is_none().then(|| "failed".into()), ..Default::default() }
    }

    #[test]
    fn median_run_picks_the_middle_figure_and_keeps_all() {
        let m = median_run(vec![ops(Some(300.0)), ops(Some(100.0)), ops(Some(200.0))], Metric::OpsPerSec);
        assert_eq!(m.ops_per_sec, Some(200.0));
        assert_eq!(m.repeats, vec![Some(300.0), Some(100.0), Some(200.0)]);
        assert!(m.failed_repeats.is_empty() && m.failed_runs().is_empty());
        // Of an even number, the upper middle one, however many failed.
        let m = median_run(vec![ops(Some(10.0)), ops(Some(40.0)), ops(Some(20.0)), ops(Some(30.0))], Metric::OpsPerSec);
        assert_eq!(m.ops_per_sec, Some(30.0));
        let m = median_run(vec![ops(None), ops(Some(50.0)), ops(Some(70.0))], Metric::OpsPerSec);
        assert_eq!(m.ops_per_sec, Some(70.0));
        assert!(m.error.is_none());
        // The failed repetition stays in its place, with its error.
        assert_eq!(m.repeats, vec![None, Some(50.0), Some(70.0)]);
        assert_eq!(m.failed_repeats, vec![FailedRepeat { run: 1, error: "failed".into() }]);
        assert_eq!(m.failed_runs(), vec![(Some(1), "failed")]);
        // All failed: each one listed once.
        let m = median_run(vec![ops(None), ops(None)], Metric::OpsPerSec);
        assert!(m.error.is_some());
        assert_eq!(m.failed_runs(), vec![(Some(1), "failed"), (Some(2), "failed")]);
        // One run: nothing to list but its own error.
        assert!(median_run(vec![ops(Some(1.0))], Metric::OpsPerSec).repeats.is_empty());
        assert_eq!(median_run(vec![ops(None)], Metric::OpsPerSec).failed_runs(), vec![(None, "failed")]);
    }

    fn runner(dir: &Path, fio: PathBuf) -> Runner {
        let raw = dir.join("raw");
        std::fs::create_dir_all(&raw).unwrap();
        Runner { fio, nfsh: None, raw, laid_out: HashMap::new(), tree: None, round: 0, server_before: None }
    }

    fn meta_job(op: MetaOp, files: u32) -> Job {
        Job {
            suite: "metadata".into(),
            name: format!("{op:?}"),
            group: "metadata".into(),
            x: 0.0,
            metric: Metric::OpsPerSec,
            kind: JobKind::Meta { op, files, dirs: 1, clients: 1 },
        }
    }

    #[test]
    fn every_repetition_works_equally_deep() {
        // libnfs LOOKUPs each directory of a path: the first repetition may not be a level
        // shallower than the others, with or without --repeat.
        let tmp = tempfile::tempdir().unwrap();
        let mut r = runner(tmp.path(), "fio".into());
        assert_eq!(r.meta_path("/md-flat"), "/round-1/md-flat");
        r.round = 1;
        assert_eq!(r.meta_path("/md-flat"), "/round-2/md-flat");
        assert_eq!(r.meta_path("/tree-untar"), "/round-2/tree-untar");
        // The local disk's jobs likewise, each repetition in a directory of its own.
        let mut local = Target::start(&TargetSpec::Local, &tmp.path().join("local"), 3, "psync").unwrap();
        let root = local.local_dir.clone().unwrap();
        for round in [0, 1] {
            r.round = round;
            for (i, op) in [MetaOp::Create, MetaOp::Rename, MetaOp::Readdir].into_iter().enumerate() {
                let m = r.run_job(&mut local, &meta_job(op, 20), i);
                assert!(m.error.is_none(), "{op:?}: {:?}", m.error);
                assert_eq!(m.meta.map(|f| f.ops), Some(20), "{op:?}");
            }
        }
        for round in ["round-1", "round-2"] {
            assert_eq!(std::fs::read_dir(root.join(round).join("md-flat")).unwrap().count(), 20, "{round}");
        }
        assert!(!root.join("md-flat").exists());
    }

    /// A stand-in for nasd's metrics endpoint: its WRITE count is the number of lines in
    /// `calls`, one per run of the fake fio.
    fn fake_metrics(calls: PathBuf) -> std::net::SocketAddr {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                // The whole request first: closing with some of it unread would reset the
                // connection under the reply (the scraper writes it in several pieces).
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(n) if n > 0 => request.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let n = std::fs::read_to_string(&calls).unwrap_or_default().lines().count();
                let proc = "program=\"nfs3\",procedure=\"WRITE\"";
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\n\r\nnasd_rpc_latency_seconds_bucket{{{proc},le=\"+Inf\"}} {n}\n\
                     nasd_rpc_latency_seconds_sum{{{proc}}} {}\nnasd_rpc_latency_seconds_count{{{proc}}} {n}\n",
                    n as f64 * 1e-4
                );
            }
        });
        addr
    }

    #[test]
    fn server_figures_count_the_timed_run_alone() {
        // The file's layout is a fio run too, before the timed one: the server's figures
        // must leave it out.
        let tmp = tempfile::tempdir().unwrap();
        let calls = tmp.path().join("calls");
        let report = tmp.path().join("report.json");
        std::fs::write(
            &report,
            r#"{"jobs": [{"error": 0, "read": {"iops": 100.0, "bw_bytes": 409600, "total_ios": 100, "runtime": 1000}, "write": {}}]}"#,
        )
        .unwrap();
        let fio = tmp.path().join("fio");
        crate::testing::write_executable(&fio, &format!("#!/bin/sh\necho run >> {}\ncat {}\n", calls.display(), report.display()));
        let mut r = runner(tmp.path(), fio);
        let mut t = Target::start(&TargetSpec::Local, &tmp.path().join("local"), 3, "psync").unwrap();
        t.metrics = Some(fake_metrics(calls.clone()));
        let shape = fio::FioShape { runtime: 1, ..fio::FioShape::one_pass("randread", 4096, 1, 1 << 20, "f.dat") };
        let iozone = fio::FioShape { rw: "read".into(), runtime: 0, file: "iozone-1m.dat".into(), ..shape.clone() };
        let kinds = [JobKind::Fio(shape), JobKind::Iozone { op: "read".into(), shape: iozone }];
        for (i, kind) in kinds.into_iter().enumerate() {
            let job = Job { suite: "smoke".into(), name: format!("job {i}"), group: "g".into(), x: 1.0, metric: Metric::Iops, kind };
            let m = r.run_job(&mut t, &job, i);
            assert!(m.error.is_none(), "{:?}", m.error);
            let writes: Vec<u64> = m.server.expect("server figures").procs.iter().map(|p| p.calls).collect();
            assert_eq!(writes, [1], "job {i}: the layout's run counted");
        }
        // Each job laid its file out and then ran once.
        assert_eq!(std::fs::read_to_string(&calls).unwrap().lines().count(), 4);
    }

    #[test]
    fn a_loop_that_reports_no_count_or_no_time_is_an_error_not_a_rate() {
        let v = serde_json::json!({"ok": true, "ops": 10, "seconds": 0.5});
        assert_eq!((reported(&v, "ops").unwrap(), reported_seconds(&v).unwrap()), (10.0, 0.5));
        assert!(reported(&serde_json::json!({"ok": true, "seconds": 0.5}), "ops").is_err());
        assert!(reported_seconds(&serde_json::json!({"ok": true, "ops": 10})).is_err());
        assert!(reported_seconds(&serde_json::json!({"ops": 10, "seconds": 0.0})).is_err());
    }

    #[test]
    fn a_stable_write_job_that_sent_unstable_writes_is_an_error() {
        let scrape = |unstable: u64, file_sync: u64| {
            metrics::parse(&format!("nasd_write_requests_total{{stable=\"unstable\"}} {unstable}\nnasd_write_requests_total{{stable=\"file_sync\"}} {file_sync}\n"))
        };
        let before = scrape(5, 7);
        let shape = |sync| fio::FioShape { runtime: 5, ramp: 1, sync, ..fio::FioShape::one_pass("write", 1 << 20, 16, 1 << 30, "f.dat") };
        let job = |sync| Job {
            suite: "s".into(),
            name: "1m write".into(),
            group: "g".into(),
            x: 1.0,
            metric: Metric::MiBs,
            kind: JobKind::Fio(shape(sync)),
        };
        // An unpatched fio: sync=1 ignored, every WRITE of the timed part unstable.
        let ignored = metrics::diff(&before, &scrape(105, 7));
        assert_eq!(ignored.writes_by_stability, [("unstable".to_string(), 100)].into());
        let err = stable_writes_were_stable(&job(true), Some(&ignored)).expect_err("unstable WRITEs under a stable label");
        assert!(format!("{err}").contains("100 UNSTABLE WRITEs"), "{err}");
        // The patched one: FILE_SYNC only.
        let honoured = metrics::diff(&before, &scrape(5, 107));
        assert!(stable_writes_were_stable(&job(true), Some(&honoured)).is_ok());
        // Unstable writes are what an unstable job is for; a server without metrics (Ganesha) cannot tell.
        assert!(stable_writes_were_stable(&job(false), Some(&ignored)).is_ok());
        assert!(stable_writes_were_stable(&job(true), None).is_ok());
    }

    #[test]
    fn concurrent_loops_count_from_the_first_start_to_the_last_end() {
        let a = serde_json::json!({"ops": 10, "seconds": 2.0, "started": 100.0, "ended": 102.0});
        let b = serde_json::json!({"ops": 10, "seconds": 2.5, "started": 101.0, "ended": 103.5});
        assert_eq!(concurrent_span(&[&a, &b]).unwrap(), 3.5);
        // an nfsh without the loop times is an error, not a made-up figure
        let old = serde_json::json!({"ops": 10, "seconds": 2.0});
        assert!(concurrent_span(&[&a, &old]).is_err());
        assert!(concurrent_span(&[]).is_err());
    }
}
