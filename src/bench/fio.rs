//! fio: job shapes to command lines, and fio's JSON output to figures.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One fio job shape, independent of the target it runs against.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FioShape {
    /// fio `rw=`: read, write, randread, randwrite, rw, randrw.
    pub rw: String,
    /// Block size in bytes.
    pub bs: u64,
    pub iodepth: u32,
    /// Percentage of reads for rw/randrw.
    pub rwmixread: Option<u32>,
    /// File size in bytes.
    pub size: u64,
    /// Seconds of measurement (time_based); 0 = one pass over the file.
    pub runtime: u64,
    /// Seconds of warm-up excluded from the figures.
    pub ramp: u64,
    /// fio `randrepeat=0` (a new random sequence on every run).
    pub randrepeat0: bool,
    /// fio `sync=1`: every write is stable when it completes (NFS: FILE_SYNC WRITEs;
    /// local: O_SYNC).
    #[serde(default)]
    pub sync: bool,
    /// File name below the target's root.
    pub file: String,
}

impl FioShape {
    /// One pass over `size` bytes of `file` in blocks of `bs`, `iodepth` at a time; every
    /// other option fio's default (set the fields to time it, mix it or make it stable).
    pub fn one_pass(rw: &str, bs: u64, iodepth: u32, size: u64, file: &str) -> Self {
        Self { rw: rw.into(), bs, iodepth, rwmixread: None, size, runtime: 0, ramp: 0, randrepeat0: false, sync: false, file: file.into() }
    }

    pub fn reads(&self) -> bool {
        self.rw.contains("read") || self.rw.ends_with("rw")
    }
    pub fn is_pure_read(&self) -> bool {
        self.rw == "read" || self.rw == "randread" || (self.rwmixread == Some(100) && self.rw.ends_with("rw"))
    }

    /// Job options shared by every target (no engine, no file location).
    pub fn options(&self, name: &str) -> Vec<String> {
        let mut a = vec![
            format!("--name={name}"),
            format!("--rw={}", self.rw),
            format!("--bs={}", fmt_size(self.bs)),
            format!("--iodepth={}", self.iodepth),
            format!("--size={}", fmt_size(self.size)),
        ];
        if let Some(m) = self.rwmixread {
            a.push(format!("--rwmixread={m}"));
        }
        if self.runtime > 0 {
            a.push("--time_based=1".into());
            a.push(format!("--runtime={}", self.runtime));
            if self.ramp > 0 {
                a.push(format!("--ramp_time={}", self.ramp));
            }
            // A report every second: the figures survive a client that hangs on its way out.
            a.push("--status-interval=1".into());
        }
        if self.randrepeat0 {
            a.push("--randrepeat=0".into());
        }
        if self.sync {
            a.push("--sync=1".into());
        }
        a
    }
}

/// How a job reaches its storage.
#[derive(Clone, Debug)]
pub enum Engine {
    /// libnfs engine with this URL (the export root).
    Nfs { url: String },
    /// Local file system, direct I/O, with this fio engine, files in `dir`.
    Local { engine: String, dir: PathBuf },
}

impl Engine {
    pub fn args(&self, file: &str, iodepth: u32) -> Vec<String> {
        match self {
            Engine::Nfs { url } => vec!["--ioengine=nfs".into(), format!("--nfs_url={url}"), format!("--filename={file}")],
            Engine::Local { engine, dir } => {
                let _ = iodepth; // psync ignores it: the report names the engine
                vec![format!("--ioengine={engine}"), "--direct=1".into(), format!("--filename={}", dir.join(file).display())]
            }
        }
    }
}

/// Full fio command line (without the binary) for a shape on an engine.
pub fn command_line(shape: &FioShape, name: &str, engine: &Engine) -> Vec<String> {
    // `json+` adds each direction's latency histogram, from which percentiles of a mixed
    // job's or several clients' I/O together are taken ([`Percentiles`]).
    let mut a = vec!["--output-format=json+".to_string()];
    a.extend(shape.options(name));
    a.extend(engine.args(&shape.file, shape.iodepth));
    a
}

/// Command line that lays a file out (read jobs can't create files through libnfs).
pub fn layout_command(file: &str, size: u64, engine: &Engine) -> Vec<String> {
    let shape = FioShape::one_pass("write", 128 * 1024, 16, size, file);
    command_line(&shape, "layout", engine)
}

/// Quote a command line for a shell.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.chars().all(|c| c.is_ascii_alphanumeric() || "-_=./:,+%@".contains(c)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn fmt_size(b: u64) -> String {
    for (unit, m) in [("g", 1u64 << 30), ("m", 1 << 20), ("k", 1 << 10)] {
        if b >= m && b.is_multiple_of(m) {
            return format!("{}{unit}", b / m);
        }
    }
    b.to_string()
}

/// Parse sizes like 4k, 1m, 512M, 2g, 4096.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        Some('t') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| anyhow!("bad size {s:?} (examples: 4k, 64m, 1g)"))?;
    Ok(n * mult)
}

/// Figures of one direction (read or write) of a job.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DirStats {
    pub ios: u64,
    pub iops: f64,
    pub bw_bytes: f64,
    /// Completion latency in microseconds.
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    /// Milliseconds fio measured this direction over (its JSON's `runtime`, rounded up to
    /// whole milliseconds); none in results saved before it was kept.
    #[serde(default)]
    pub runtime_ms: Option<u64>,
    /// fio's completion latency histogram (`json+`): (bin value in ns, I/O count),
    /// ascending. Not saved: [`FioResult::all`] keeps what is taken from it.
    #[serde(skip)]
    pub bins: Vec<(u64, u64)>,
}

/// Completion latency percentiles of all of a job's I/O, in µs.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// Histograms (bin value, count) added up into one, ascending.
fn merged_bins<'a>(bins: impl IntoIterator<Item = &'a (u64, u64)>) -> Vec<(u64, u64)> {
    let mut merged = std::collections::BTreeMap::<u64, u64>::new();
    for &(value, count) in bins {
        *merged.entry(value).or_default() += count;
    }
    merged.into_iter().collect()
}

impl Percentiles {
    /// The percentiles of the I/O counted in `bins` (value in ns, count), all directions
    /// and clients together, taken as fio takes its own: the value of the first bin at
    /// which the running count reaches the share asked for. None without any I/O.
    fn of<'a>(bins: impl IntoIterator<Item = &'a (u64, u64)>) -> Option<Self> {
        let merged = merged_bins(bins);
        let total: u64 = merged.iter().map(|&(_, count)| count).sum();
        if total == 0 {
            return None;
        }
        let at = |share: f64| {
            let mut seen = 0u64;
            let reached = merged.iter().find(|&&(_, count)| {
                seen += count;
                seen as f64 >= share * total as f64
            });
            reached.map_or(0.0, |&(value, _)| value as f64 / 1000.0)
        };
        // Shares written as fio computes them (99.9 / 100 is a hair above 0.999: of 1,000
        // I/O, fio's p99.9 is the 1,000th).
        Some(Self { p50_us: at(50.0 / 100.0), p99_us: at(99.0 / 100.0), p999_us: at(99.9 / 100.0) })
    }
}

/// Figures of a job: both directions and their total.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FioResult {
    pub read: DirStats,
    pub write: DirStats,
    pub errors: u64,
    /// Percentiles of both directions' I/O (and every client's) together, from fio's
    /// histograms; none where fio gave none (results saved before they were read).
    #[serde(default)]
    pub all: Option<Percentiles>,
}

impl FioResult {
    pub fn iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }
    pub fn mib_s(&self) -> f64 {
        (self.read.bw_bytes + self.write.bw_bytes) / (1u64 << 20) as f64
    }
    /// Milliseconds the job measured over (the longer direction), when known.
    pub fn runtime_ms(&self) -> Option<u64> {
        self.read.runtime_ms.into_iter().chain(self.write.runtime_ms).max()
    }
    /// Latency figures weighted by the I/O count of each direction: the mean of all I/O,
    /// and for percentiles, where no histogram was kept, the weighted mean of both
    /// directions' percentiles (not a percentile of all I/O).
    pub fn lat(&self, f: impl Fn(&DirStats) -> f64) -> f64 {
        let (r, w) = (self.read.ios as f64, self.write.ios as f64);
        if r + w == 0.0 {
            return 0.0;
        }
        (f(&self.read) * r + f(&self.write) * w) / (r + w)
    }
    pub fn lat_mean_us(&self) -> f64 {
        self.lat(|d| d.lat_mean_us)
    }
    pub fn lat_p50_us(&self) -> f64 {
        self.all.map_or_else(|| self.lat(|d| d.lat_p50_us), |a| a.p50_us)
    }
    pub fn lat_p99_us(&self) -> f64 {
        self.all.map_or_else(|| self.lat(|d| d.lat_p99_us), |a| a.p99_us)
    }
    pub fn lat_p999_us(&self) -> f64 {
        self.all.map_or_else(|| self.lat(|d| d.lat_p999_us), |a| a.p999_us)
    }
    /// Aggregate of concurrent runs (separate clients): throughput adds up, the mean
    /// latency is weighted by I/O count, and percentiles are taken of all their I/O
    /// where fio gave histograms.
    pub fn aggregate(parts: &[FioResult]) -> FioResult {
        let mut out = FioResult::default();
        for (dst, pick) in [(&mut out.read, 0), (&mut out.write, 1)] {
            let ds: Vec<&DirStats> = parts.iter().map(|p| if pick == 0 { &p.read } else { &p.write }).collect();
            let ios: u64 = ds.iter().map(|d| d.ios).sum();
            dst.ios = ios;
            dst.iops = ds.iter().map(|d| d.iops).sum();
            dst.bw_bytes = ds.iter().map(|d| d.bw_bytes).sum();
            dst.runtime_ms = ds.iter().filter_map(|d| d.runtime_ms).max();
            if ios > 0 {
                let w = |f: fn(&DirStats) -> f64| ds.iter().map(|d| f(d) * d.ios as f64).sum::<f64>() / ios as f64;
                dst.lat_mean_us = w(|d| d.lat_mean_us);
                dst.lat_p50_us = w(|d| d.lat_p50_us);
                dst.lat_p99_us = w(|d| d.lat_p99_us);
                dst.lat_p999_us = w(|d| d.lat_p999_us);
            }
            dst.bins = merged_bins(ds.iter().flat_map(|d| &d.bins));
            // A direction's own percentiles come from its histogram, as fio's do.
            if let Some(p) = Percentiles::of(&dst.bins).filter(|_| parts.len() > 1) {
                (dst.lat_p50_us, dst.lat_p99_us, dst.lat_p999_us) = (p.p50_us, p.p99_us, p.p999_us);
            }
        }
        out.errors = parts.iter().map(|p| p.errors).sum();
        // One direction of one job keeps fio's own percentiles.
        let mixed = parts.len() > 1 || (out.read.ios > 0 && out.write.ios > 0);
        out.all = if mixed { Percentiles::of(out.read.bins.iter().chain(&out.write.bins)) } else { None };
        out
    }
}

/// Extract fio's JSON document from output polluted by engine noise (the nfs engine
/// prints lines like `Failed NFS operation(code:-14)` on the same stdout).
/// The last JSON document in fio's output (with `--status-interval`, fio prints one per
/// interval and the final report last), skipping any non-JSON lines.
pub fn extract_json(text: &str) -> Result<serde_json::Value> {
    let lines: Vec<&str> = text.lines().collect();
    // First without lines that cannot be fio JSON (libnfs prints into it), then as is.
    for attempt in 0..2 {
        let kept: Vec<&str> = if attempt == 1 {
            lines.clone()
        } else {
            lines.iter().copied().filter(|l| l.is_empty() || l.starts_with([' ', '\t', '{', '}', '[', ']', '"'])).collect()
        };
        if let Some(i) = kept.iter().position(|l| l.starts_with('{')) {
            let blob = kept[i..].join("\n");
            let docs = serde_json::Deserializer::from_str(&blob).into_iter::<serde_json::Value>();
            if let Some(v) = docs.map_while(Result::ok).last() {
                return Ok(v);
            }
        }
    }
    bail!("no JSON document in fio output")
}

/// Seconds of measurement a report covers (the longest job).
pub fn covered_seconds(v: &serde_json::Value) -> f64 {
    v["jobs"].as_array().into_iter().flatten().filter_map(|j| j["job_runtime"].as_f64()).fold(0.0, f64::max) / 1000.0
}

fn dir_stats(j: &serde_json::Value) -> DirStats {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let clat = &j["clat_ns"];
    let pct = |k: &str| f(&clat["percentile"][k]) / 1000.0;
    DirStats {
        ios: j["total_ios"].as_u64().unwrap_or(0),
        iops: f(&j["iops"]),
        bw_bytes: f(&j["bw_bytes"]),
        lat_mean_us: f(&clat["mean"]) / 1000.0,
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        lat_p999_us: pct("99.900000"),
        runtime_ms: j["runtime"].as_u64(),
        bins: histogram(&clat["bins"]),
    }
}

/// fio's `json+` latency histogram: bin value (ns, a decimal string key) → count.
fn histogram(bins: &serde_json::Value) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = bins
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(value, count)| Some((value.parse().ok()?, count.as_u64()?)))
        .filter(|&(_, count)| count > 0)
        .collect();
    out.sort_unstable();
    out
}

/// Figures from fio's JSON (all jobs of the document aggregated).
pub fn parse_result(v: &serde_json::Value) -> Result<FioResult> {
    let jobs = v["jobs"].as_array().context("fio JSON has no jobs")?;
    let parts: Vec<FioResult> = jobs
        .iter()
        .map(|j| FioResult {
            read: dir_stats(&j["read"]),
            write: dir_stats(&j["write"]),
            errors: j["error"].as_u64().unwrap_or(0),
            all: None,
        })
        .collect();
    Ok(FioResult::aggregate(&parts))
}

/// Output of one fio process.
pub struct FioRun {
    pub json: serde_json::Value,
    pub raw: String,
    pub result: FioResult,
    /// fio measured its full time but then hung on its way out (libnfs waiting for a
    /// reply on a connection it had torn down): the figures are from its last status
    /// report, covering this many seconds.
    pub hung_at_exit: Option<f64>,
}

/// fio ran far past its time: its client is waiting for a reply that will not come.
#[derive(Debug, thiserror::Error)]
#[error("fio timed out after {seconds}s: {command}")]
pub struct Stuck {
    pub seconds: u64,
    pub command: String,
}

/// When to give up on a fio process.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// Seconds the job measures (runtime + ramp); 0 for size-based jobs.
    pub measures: u64,
    /// Seconds of runtime (ramp excluded) that a report of a fio hanging at exit must
    /// cover to stand for the job: all of it, but for the status interval and some slack.
    pub runtime: u64,
    /// Seconds allowed after measuring to finish and report, before fio is taken to hang
    /// on its way out.
    pub exit_grace: u64,
    /// Seconds after which fio is stuck.
    pub stuck: u64,
}

impl Deadlines {
    /// A job that runs `runtime` seconds after a ramp of `ramp`.
    pub fn time_based(runtime: u64, ramp: u64, stuck: u64) -> Self {
        Self { measures: runtime + ramp, runtime, exit_grace: 15, stuck }
    }

    /// A job that ends when its size is done.
    pub fn size_based(stuck: u64) -> Self {
        Self { measures: 0, runtime: 0, exit_grace: 0, stuck }
    }

    /// Whether a last report covering `covered` seconds stands for the whole job: a fio
    /// that stopped reporting earlier hung while measuring, and its figure is partial.
    /// (fio reports every second; whether its job time counts the ramp does not matter.)
    fn covers_the_job(&self, covered: f64) -> bool {
        let runtime = self.runtime as f64;
        covered >= runtime - (runtime / 4.0).min(2.0)
    }
}

/// Run fio; fails on a non-zero exit, missing JSON or job errors.
pub fn run(fio: &Path, args: &[String], deadlines: Deadlines) -> Result<FioRun> {
    let child = spawn(fio, args)?;
    wait(child, args, deadlines)
}

/// A running fio whose output is being collected.
pub struct Running {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    err: std::sync::Arc<std::sync::Mutex<String>>,
    readers: [std::thread::JoinHandle<()>; 2],
}

/// Starts fio and at once begins collecting its output: a client whose pipe nobody reads
/// stops when the pipe is full, so several started together and waited for one after the
/// other would otherwise run one after the other.
pub fn spawn(fio: &Path, args: &[String]) -> Result<Running> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::sync::{Arc, Mutex};
    let mut child = Command::new(fio)
        .args(args)
        // Its own process group, so its job processes (which hold the output pipes) can be
        // stopped with it.
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", fio.display()))?;
    let mut so = child.stdout.take().expect("piped stdout");
    let mut se = child.stderr.take().expect("piped stderr");
    // stdout is collected as it comes, so status reports can be read while fio runs.
    let out = Arc::new(Mutex::new(String::new()));
    let t_out = {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            while let Ok(n) = so.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                out.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        })
    };
    let err = Arc::new(Mutex::new(String::new()));
    let t_err = {
        let err = err.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            *err.lock().unwrap() = s;
        })
    };
    Ok(Running { child, out, err, readers: [t_out, t_err] })
}

pub fn wait(running: Running, args: &[String], deadlines: Deadlines) -> Result<FioRun> {
    use std::time::{Duration, Instant};
    let Running { mut child, out, err, readers: [t_out, t_err] } = running;
    let started = Instant::now();
    let hung_after = (deadlines.measures > 0).then(|| Duration::from_secs(deadlines.measures + deadlines.exit_grace));
    let mut hung_at_exit = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        let elapsed = started.elapsed();
        if hung_after.is_some_and(|t| elapsed > t) {
            let report = extract_json(&out.lock().unwrap()).ok();
            if let Some(covered) = report.map(|r| covered_seconds(&r)).filter(|&c| deadlines.covers_the_job(c)) {
                kill_group(&mut child);
                hung_at_exit = Some(covered);
                break None;
            }
        }
        if elapsed > Duration::from_secs(deadlines.stuck) {
            kill_group(&mut child);
            return Err(Stuck { seconds: deadlines.stuck, command: shell_join(args) }.into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_some() {
        // fio exited: its output ends. After a kill, a straggler could keep the pipes open,
        // so take what arrived without waiting for the end.
        let _ = t_out.join();
        let _ = t_err.join();
    }
    let out = std::mem::take(&mut *out.lock().unwrap());
    let err = std::mem::take(&mut *err.lock().unwrap());
    let tail = |s: &str| s.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect::<String>();
    if let Some(status) = status.filter(|s| !s.success()) {
        bail!("fio failed ({status}): {}\n{}\n{}", shell_join(args), tail(&err), tail(&out));
    }
    let json = extract_json(&out).with_context(|| format!("fio: {}\n{}", shell_join(args), tail(&err)))?;
    let result = parse_result(&json)?;
    if result.errors > 0 {
        bail!("fio job error(s) {}: {}\n{}", result.errors, shell_join(args), tail(&err));
    }
    Ok(FioRun { json, raw: out, result, hung_at_exit })
}

/// Stops fio and its job processes (fio forks one per job, which may leave its process
/// group).
fn kill_group(child: &mut std::process::Child) {
    fn descendants(pid: u32, out: &mut Vec<u32>) {
        let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for c in list.split_whitespace().filter_map(|c| c.parse().ok()) {
            out.push(c);
            descendants(c, out);
        }
    }
    let mut pids = Vec::new();
    descendants(child.id(), &mut pids);
    // SAFETY: plain syscalls; the group was created for this child, the pids are its own.
    unsafe {
        libc::killpg(child.id() as libc::pid_t, libc::SIGKILL);
        for p in pids {
            libc::kill(p as libc::pid_t, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

/// `fio --version`.
pub fn version(fio: &Path) -> String {
    Command::new(fio)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Engines compiled into fio (`fio --enghelp`).
pub fn engines(fio: &Path) -> Vec<String> {
    Command::new(fio)
        .arg("--enghelp")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"Failed NFS operation(code:-14)
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "j",
      "error" : 0,
      "read" : {
        "io_bytes" : 4096000, "bw_bytes" : 40960000, "iops" : 10000.0, "total_ios" : 1000, "runtime" : 100,
        "clat_ns" : { "mean" : 95000.5,
          "percentile" : { "50.000000" : 90112, "99.000000" : 200704, "99.900000" : 501760 } }
      },
      "write" : {
        "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.0, "total_ios" : 0, "runtime" : 0,
        "clat_ns" : { "mean" : 0.0 }
      }
    }
  ]
}
Failed NFS operation(code:-14)
"#;

    #[test]
    fn parses_noisy_fio_json() {
        let v = extract_json(SAMPLE).unwrap();
        let r = parse_result(&v).unwrap();
        assert_eq!(r.read.ios, 1000);
        assert!((r.iops() - 10000.0).abs() < 1e-9);
        assert!((r.mib_s() - 40960000.0 / 1048576.0).abs() < 1e-9);
        assert!((r.lat_mean_us() - 95.0005).abs() < 1e-6);
        assert!((r.lat_p50_us() - 90.112).abs() < 1e-9);
        assert!((r.lat_p99_us() - 200.704).abs() < 1e-9);
        assert!((r.lat_p999_us() - 501.76).abs() < 1e-9);
        // the direction that did the I/O: 4096000 bytes in 100 ms
        assert_eq!(r.runtime_ms(), Some(100));
        // results saved before the runtime was kept have none
        assert_eq!(FioResult::default().runtime_ms(), None);
    }

    #[test]
    fn noise_inside_json_is_dropped() {
        let noisy = SAMPLE.replacen("      \"write\"", "Failed NFS operation(code:-14)\n      \"write\"", 1);
        let r = parse_result(&extract_json(&noisy).unwrap()).unwrap();
        assert_eq!(r.read.ios, 1000);
        assert!(extract_json("no json here").is_err());
    }

    #[test]
    fn the_last_of_several_reports_counts() {
        let early = SAMPLE.replace("\"total_ios\" : 1000", "\"total_ios\" : 10");
        let both = format!("{early}\n{SAMPLE}");
        assert_eq!(parse_result(&extract_json(&both).unwrap()).unwrap().read.ios, 1000);
        assert_eq!(parse_result(&extract_json(&early).unwrap()).unwrap().read.ios, 10);
    }

    /// Runs, with `deadlines`, a stand-in for fio that prints one status report covering
    /// `covered_ms` and then hangs, as fio does when libnfs waits forever during teardown.
    /// The shell reads the script: a script just written and executed itself can fail
    /// with ETXTBSY while another test thread's child still holds it open.
    fn run_hanging_fio(covered_ms: u64, deadlines: Deadlines) -> Result<FioRun> {
        let dir = tempfile::tempdir().unwrap();
        let report = SAMPLE.replace("\"jobname\"", &format!("\"job_runtime\" : {covered_ms},\n      \"jobname\""));
        let json = dir.path().join("report.json");
        std::fs::write(&json, report).unwrap();
        let script = dir.path().join("fio");
        std::fs::write(&script, format!("cat {}\nexec sleep 60\n", json.display())).unwrap();
        run(Path::new("/bin/sh"), &[script.display().to_string()], deadlines)
    }

    #[test]
    fn clients_started_together_are_not_held_up_by_their_output() {
        // Each fake fio writes more than a pipe holds before it can finish. Unless their
        // output is read from the start, the second blocks until the bench waits for it.
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("report.json");
        std::fs::write(&json, SAMPLE).unwrap();
        let script = dir.path().join("fio");
        crate::testing::write_executable(
            &script,
            &format!("#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' ' '\ntouch \"$1\"\ncat {}\n", json.display()),
        );
        let markers: Vec<String> = (0..2).map(|i| dir.path().join(format!("past-output-{i}")).display().to_string()).collect();
        let running: Vec<Running> = markers.iter().map(|m| spawn(&script, std::slice::from_ref(m)).unwrap()).collect();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !markers.iter().all(|m| Path::new(m).exists()) {
            assert!(std::time::Instant::now() < end, "a client stayed blocked on its output while nobody waited for it");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for (r, m) in running.into_iter().zip(&markers) {
            let run = wait(r, std::slice::from_ref(m), Deadlines { measures: 0, runtime: 0, exit_grace: 0, stuck: 30 }).unwrap();
            assert_eq!(run.result.read.ios, 1000);
        }
    }

    #[test]
    fn a_hang_after_measuring_keeps_the_last_report() {
        let t = std::time::Instant::now();
        let run = run_hanging_fio(1000, Deadlines { measures: 1, runtime: 1, exit_grace: 0, stuck: 30 }).unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
        assert_eq!(run.hung_at_exit, Some(1.0));
        assert_eq!(run.result.read.ios, 1000);
    }

    #[test]
    fn a_hang_before_measuring_enough_is_stuck() {
        // Covers 0.2 s of a 2 s job: not enough to stand for the job.
        let err = run_hanging_fio(200, Deadlines { measures: 2, runtime: 2, exit_grace: 0, stuck: 4 }).err().expect("stuck");
        assert!(err.is::<Stuck>(), "{err:#}");
    }

    #[test]
    fn a_hang_half_way_through_is_stuck() {
        // A report of 9 s of a 15 s job with a 2 s ramp stands for a hang while measuring,
        // not at exit; its figure would be 9 s of a job meant to run 15.
        let deadlines = Deadlines::time_based(15, 2, 64);
        assert!(!deadlines.covers_the_job(9.0));
        assert!(deadlines.covers_the_job(14.0) && deadlines.covers_the_job(17.0));
        let quick = Deadlines::time_based(5, 1, 42);
        assert!(quick.covers_the_job(4.0) && !quick.covers_the_job(3.0));
        let err = run_hanging_fio(1000, Deadlines { measures: 2, runtime: 2, exit_grace: 0, stuck: 4 }).err().expect("stuck");
        assert!(err.is::<Stuck>(), "{err:#}");
    }

    #[test]
    fn aggregate_adds_throughput_and_weights_latency() {
        let a = FioResult {
            read: DirStats {
                ios: 100,
                iops: 10.0,
                bw_bytes: 1.0,
                lat_mean_us: 10.0,
                lat_p50_us: 10.0,
                lat_p99_us: 20.0,
                lat_p999_us: 30.0,
                runtime_ms: Some(1000),
                bins: vec![],
            },
            ..Default::default()
        };
        let b = FioResult {
            read: DirStats {
                ios: 300,
                iops: 30.0,
                bw_bytes: 3.0,
                lat_mean_us: 20.0,
                lat_p50_us: 20.0,
                lat_p99_us: 40.0,
                lat_p999_us: 50.0,
                runtime_ms: Some(1200),
                bins: vec![],
            },
            ..Default::default()
        };
        let s = FioResult::aggregate(&[a, b]);
        assert_eq!(s.read.ios, 400);
        assert_eq!(s.iops(), 40.0);
        assert_eq!(s.lat_mean_us(), 17.5);
        assert_eq!(s.lat_p99_us(), 35.0);
        // clients that ran at once: the longest one's time
        assert_eq!(s.runtime_ms(), Some(1200));
    }

    #[test]
    fn percentiles_of_a_mixed_job_are_taken_of_all_its_io() {
        // 1,000 reads (990 at 100 µs, 10 at 300 µs) and 250 writes at 2 ms: one I/O in
        // five is a write, so the 99th percentile of all of them is a write's time; the
        // weighted mean of the two directions' p99 would say 480 µs.
        let dir = |bins: serde_json::Value, p99: u64| {
            serde_json::json!({
                "total_ios": bins.as_object().unwrap().values().map(|c| c.as_u64().unwrap()).sum::<u64>(),
                "iops": 100.0, "bw_bytes": 409600.0, "runtime": 10000,
                "clat_ns": { "mean": 1000.0, "percentile": { "50.000000": 100000, "99.000000": p99, "99.900000": p99 }, "bins": bins },
            })
        };
        let job = |read, write| serde_json::json!({ "error": 0, "read": read, "write": write });
        let read = dir(serde_json::json!({ "100000": 990, "300000": 10 }), 100000);
        let write = dir(serde_json::json!({ "2000000": 250 }), 2000000);
        let one = parse_result(&serde_json::json!({ "jobs": [job(read.clone(), write.clone())] })).unwrap();
        assert_eq!((one.lat_p50_us(), one.lat_p99_us(), one.lat_p999_us()), (100.0, 2000.0, 2000.0));
        assert_eq!(one.lat(|d| d.lat_p99_us), 480.0, "what the weighted mean would have said");
        // Each direction keeps fio's own figures, and a job of one direction its own.
        assert_eq!((one.read.lat_p99_us, one.write.lat_p99_us), (100.0, 2000.0));
        let reads_only = parse_result(&serde_json::json!({ "jobs": [job(read.clone(), dir(serde_json::json!({}), 0))] })).unwrap();
        assert_eq!((reads_only.all, reads_only.lat_p99_us()), (None, 100.0));
        // As fio reckons the share: of 1,000 I/O, the p99.9 is the 1,000th.
        let p = Percentiles::of(&[(100_000, 999), (500_000, 1)]).unwrap();
        assert_eq!((p.p99_us, p.p999_us), (100.0, 500.0));
        // Two clients, one reading and one writing, are taken together alike.
        let idle = dir(serde_json::json!({}), 0);
        let reader = parse_result(&serde_json::json!({ "jobs": [job(read, idle.clone())] })).unwrap();
        let writer = parse_result(&serde_json::json!({ "jobs": [job(idle, write)] })).unwrap();
        let both = FioResult::aggregate(&[reader, writer]);
        assert_eq!(both.all, one.all);
        // Results saved without histograms fall back to the weighted mean.
        let saved: FioResult = serde_json::from_value(serde_json::json!({ "read": serde_json::to_value(&one.read).unwrap(), "write": serde_json::to_value(&one.write).unwrap(), "errors": 0 })).unwrap();
        assert_eq!(saved.lat_p99_us(), 480.0);
    }

    #[test]
    fn command_lines() {
        let shape = FioShape {
            rwmixread: Some(75),
            runtime: 5,
            ramp: 1,
            randrepeat0: true,
            ..FioShape::one_pass("randrw", 16384, 16, 64 << 20, "bench.dat")
        };
        let a = command_line(&shape, "j", &Engine::Nfs { url: "nfs://127.0.0.1/x?nfsport=1&mountport=1&version=3".into() });
        let s = shell_join(&a);
        assert!(s.contains("--bs=16k --iodepth=16 --size=64m --rwmixread=75 --time_based=1 --runtime=5 --ramp_time=1 --status-interval=1 --randrepeat=0"), "{s}");
        assert!(s.contains("'--nfs_url=nfs://127.0.0.1/x?nfsport=1&mountport=1&version=3'"), "{s}");
        assert!(s.ends_with("--filename=bench.dat"), "{s}");
        let l = layout_command("f", 1 << 20, &Engine::Local { engine: "psync".into(), dir: "/d".into() });
        assert!(
            l.contains(&"--bs=128k".to_string()) && l.contains(&"--direct=1".to_string()) && l.contains(&"--filename=/d/f".to_string())
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(parse_size("x").is_err());
        assert_eq!(fmt_size(4096), "4k");
        assert_eq!(fmt_size(1 << 20), "1m");
        assert_eq!(fmt_size(1000), "1000");
    }
}
