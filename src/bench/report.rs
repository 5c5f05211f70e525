//! report.md and report.html: one table per suite (rows = jobs, columns = targets, with
//! nasd ÷ peer and nasd ÷ local ratio columns), latency, server-side figures, the exact
//! command lines, machine facts and plots. Both formats render the same blocks.

use super::suites::{iozone_cases, JobKind, MetaOp, IOZONE_OPS};
use super::{fio::fmt_size, JobResult, Measurement, Results};
use std::collections::BTreeSet;
use std::path::Path;

/// A report element, rendered as Markdown or HTML.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Heading(u8, String),
    Para(String),
    Table { header: Vec<String>, rows: Vec<Vec<String>> },
    Code(String),
    Image { file: String, alt: String },
}

/// nasd ÷ other, when both are known and the divisor is positive.
pub fn ratio(nasd: Option<f64>, other: Option<f64>) -> Option<f64> {
    match (nasd, other) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{:.0}", v)
    } else if a >= 10.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.2}", v)
    }
}

pub fn fmt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "-".into())
}

/// iozone cases that ran shorter than this (milliseconds) are marked [`SHORT_MARK`] and
/// left out of the max and mean: fio counts whole milliseconds, rounded up, so a pass of
/// 0.2 ms shows as the file size ÷ 1 ms, a figure that is mostly the rounding.
pub const IOZONE_MIN_MS: u64 = 5;
pub const SHORT_MARK: &str = "†";

/// An iozone case whose run was too short for its figure to mean much.
fn too_short(j: &JobResult, target: &str) -> bool {
    matches!(j.job.kind, JobKind::Iozone { .. })
        && j.get(target).and_then(|m| m.fio.as_ref()).and_then(|f| f.runtime_ms()).is_some_and(|ms| ms < IOZONE_MIN_MS)
}

/// A job's figure, marked when it is an iozone case too short to count.
fn figure(j: &JobResult, target: &str) -> Option<String> {
    let v = fmt_num(j.value(target)?);
    Some(if too_short(j, target) { format!("{v}{SHORT_MARK}") } else { v })
}

fn cell(j: &JobResult, target: &str) -> String {
    match j.get(target) {
        None => "-".into(),
        Some(m) if m.error.is_some() => "error".into(),
        Some(_) => figure(j, target).unwrap_or_else(|| "-".into()),
    }
}

fn suites_in(r: &Results) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for j in &r.jobs {
        if !v.contains(&j.job.suite) {
            v.push(j.job.suite.clone());
        }
    }
    v
}

/// The headline table of a suite: rows = jobs, columns = targets then ratios.
pub fn main_table(r: &Results, suite: &str) -> Block {
    let names = r.target_names();
    let peers = r.peers();
    let mut header = vec!["job".to_string(), "unit".into()];
    header.extend(names.iter().cloned());
    let nasd = r.has("nasd");
    if nasd {
        for p in &peers {
            header.push(format!("nasd÷{p}"));
        }
        if r.has("local") {
            header.push("nasd÷local".into());
        }
    }
    let mut rows = Vec::new();
    for j in r.jobs.iter().filter(|j| j.job.suite == suite) {
        let mut row = vec![j.job.name.clone(), j.job.metric.label().to_string()];
        for n in &names {
            row.push(cell(j, n));
        }
        if nasd {
            for p in &peers {
                row.push(ratio_cell(j, "nasd", p));
            }
            if r.has("local") {
                row.push(ratio_cell(j, "nasd", "local"));
            }
        }
        rows.push(row);
    }
    Block::Table { header, rows }
}

/// `a`'s figure over `b`'s. Where a repetition failed, the two medians are of different
/// numbers of runs (of an even number, the upper middle one): the ratio says so.
fn ratio_cell(j: &JobResult, a: &str, b: &str) -> String {
    let r = ratio(j.value(a), j.value(b));
    let runs = |t: &str| j.get(t).filter(|m| !m.repeats.is_empty()).map(|m| m.repeats.iter().flatten().count());
    match (r, runs(a), runs(b)) {
        (Some(_), Some(x), Some(y)) if x != y => format!("{} (medians of {x} and {y} runs)", fmt_ratio(r)),
        _ => fmt_ratio(r),
    }
}

fn latency_table(r: &Results, suite: &str) -> Option<Block> {
    let names = r.target_names();
    let mut header = vec!["job".to_string()];
    for n in &names {
        header.push(format!("{n} mean / p50 / p99 / p99.9 (µs)"));
    }
    let mut rows = Vec::new();
    for j in r.jobs.iter().filter(|j| j.job.suite == suite) {
        if matches!(j.job.kind, JobKind::Meta { .. }) {
            continue;
        }
        let mut row = vec![j.job.name.clone()];
        for n in &names {
            row.push(match j.get(n).filter(|m| m.error.is_none()).and_then(|m| m.fio.as_ref()) {
                Some(f) => format!(
                    "{} / {} / {} / {}",
                    fmt_num(f.lat_mean_us()),
                    fmt_num(f.lat_p50_us()),
                    fmt_num(f.lat_p99_us()),
                    fmt_num(f.lat_p999_us())
                ),
                None => "-".into(),
            });
        }
        rows.push(row);
    }
    (!rows.is_empty()).then_some(Block::Table { header, rows })
}

/// Cores the client and the server kept busy while the client ran, and the server's CPU
/// per operation.
fn cpu_table(r: &Results, suite: &str) -> Option<Block> {
    let names = r.target_names();
    let mut header = vec!["job".to_string()];
    header.extend(names.iter().map(|n| format!("{n} client / server cores · server CPU per op (µs)")));
    let mut rows = Vec::new();
    for j in r.jobs.iter().filter(|j| j.job.suite == suite) {
        let mut row = vec![j.job.name.clone()];
        let mut any = false;
        for n in &names {
            let m = j.get(n).filter(|m| m.error.is_none());
            row.push(match m.and_then(|m| m.cpu.as_ref().map(|c| (c, m.server_cpu_per_op_us(&j.job)))) {
                Some((c, per_op)) => {
                    any = true;
                    let server = c.server_cores().map_or("-".into(), |s| format!("{s:.2}"));
                    format!("{:.2} / {server} · {}", c.client_cores(), per_op.map_or("-".into(), fmt_num))
                }
                None => "-".into(),
            });
        }
        if any {
            rows.push(row);
        }
    }
    (!rows.is_empty()).then_some(Block::Table { header, rows })
}

/// Metadata jobs: operations and seconds of the timed part, per target; and where the
/// local disk also ran them with each change durable, that figure and nasd's ratio to it.
fn meta_table(r: &Results, suite: &str) -> Option<Block> {
    let names = r.target_names();
    let jobs: Vec<&JobResult> = r.jobs.iter().filter(|j| j.job.suite == suite && matches!(j.job.kind, JobKind::Meta { .. })).collect();
    fn durable_of(j: &JobResult) -> Option<&super::MetaFigures> {
        j.get("local").filter(|m| m.error.is_none()).and_then(|m| m.durable.as_ref())
    }
    let with_durable = jobs.iter().any(|j| durable_of(j).is_some());
    let mut header = vec!["job".to_string()];
    header.extend(names.iter().map(|n| format!("{n} ops in s")));
    if with_durable {
        header.extend(["local, each change durable: ops in s".to_string(), "nasd÷local durable".to_string()]);
    }
    let figures = |f: &super::MetaFigures| {
        let mut c = format!("{} in {:.2} s", f.ops, f.seconds);
        if let Some(b) = f.bytes {
            c.push_str(&format!(", {:.1} MiB", b as f64 / 1048576.0));
        }
        c
    };
    let mut rows = Vec::new();
    for j in jobs {
        let mut row = vec![j.job.name.clone()];
        for n in &names {
            row.push(j.get(n).filter(|m| m.error.is_none()).and_then(|m| m.meta.as_ref()).map_or_else(|| "-".into(), figures));
        }
        if with_durable {
            let durable = durable_of(j);
            row.push(durable.map_or_else(|| "-".into(), figures));
            let durable_rate = durable.map(|f| f.ops as f64 / f.seconds.max(1e-9));
            row.push(fmt_ratio(ratio(j.value("nasd"), durable_rate)));
        }
        rows.push(row);
    }
    (!rows.is_empty()).then_some(Block::Table { header, rows })
}

/// The metadata goal: nasd at least this many times a peer's operations per second.
pub const META_GOAL: f64 = 3.0;

/// The client's own round trip: nasd's time per GETATTR in the round-trip job less its
/// server-side time for one, i.e. what a call costs with a server that takes no time at
/// all (the client, both kernels' TCP paths and the wake-ups).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTrip {
    /// µs per call.
    pub us: f64,
    /// The client's own CPU time per call of it (its process's user + system time), µs.
    pub client_cpu_us: Option<f64>,
}

impl RoundTrip {
    pub fn of(r: &Results, suite: &str) -> Option<RoundTrip> {
        let j = r.jobs.iter().find(|j| j.job.suite == suite && matches!(j.job.kind, JobKind::Meta { op: MetaOp::RoundTrip, .. }))?;
        let per_call = 1e6 / j.value("nasd").filter(|v| *v > 0.0)?;
        let nasd = j.get("nasd")?;
        let server = nasd.server.as_ref()?.procs.iter().find(|p| p.procedure.ends_with("GETATTR"))?.mean_us;
        Some(RoundTrip { us: (per_call - server).max(0.0), client_cpu_us: client_cpu_per_op_us(nasd) })
    }
}

/// The client processes' CPU time per operation of a metadata job, µs.
fn client_cpu_per_op_us(m: &Measurement) -> Option<f64> {
    let ops = m.meta.as_ref().map(|f| f.ops).filter(|n| *n > 0)?;
    Some(m.cpu.as_ref()?.client / ops as f64 * 1e6)
}

/// One single-client metadata job weighed against the goal over `peer`: what the goal
/// allows per operation, and the least any server can take per operation with this
/// client, one call at a time, plus the local disk's own time to make the change durable
/// where it changes something. A goal whose floor lies above its budget cannot be met by
/// any server that keeps RFC 1813's promise.
///
/// The client's part of that floor is the larger of two lower bounds: a round trip per
/// call; and, where the client's CPU time is known, the round trip less the client's own
/// CPU in it per call, plus the client's CPU per operation of this job (the less of
/// nasd's run and the peer's). The second counts what a call's round trip does not: the
/// client reading a long reply (a READDIRPLUS reply's entries), which it does before it
/// sends the next call.
#[derive(Clone, Debug, PartialEq)]
pub struct GoalCheck {
    pub peer_us: f64,
    pub budget_us: f64,
    pub calls_per_op: f64,
    pub client_floor_us: f64,
    pub durable_us: Option<f64>,
    pub nasd_us: f64,
}

impl GoalCheck {
    pub fn of(j: &JobResult, peer: &str, round_trip: RoundTrip) -> Option<GoalCheck> {
        let JobKind::Meta { op, clients: 1, .. } = j.job.kind else { return None };
        if op == MetaOp::RoundTrip {
            return None;
        }
        let nasd = j.get("nasd").filter(|m| m.error.is_none())?;
        let ops = nasd.meta.as_ref()?.ops;
        let calls = nasd.server.as_ref()?.calls();
        let peer_us = 1e6 / j.value(peer).filter(|v| *v > 0.0)?;
        let durable_us = j
            .get("local")
            .filter(|m| m.error.is_none() && op.changes_the_namespace())
            .and_then(|m| m.durable.as_ref())
            .filter(|d| d.ops > 0)
            .map(|d| d.seconds / d.ops as f64 * 1e6);
        let calls_per_op = calls as f64 / ops.max(1) as f64;
        let client_cpu_us = [Some(nasd), j.get(peer).filter(|m| m.error.is_none())]
            .into_iter()
            .flatten()
            .filter_map(client_cpu_per_op_us)
            .min_by(f64::total_cmp);
        let with_client_cpu = match (client_cpu_us, round_trip.client_cpu_us) {
            (Some(op_cpu), Some(call_cpu)) => calls_per_op * (round_trip.us - call_cpu).max(0.0) + op_cpu,
            _ => 0.0,
        };
        Some(GoalCheck {
            peer_us,
            budget_us: peer_us / META_GOAL,
            calls_per_op,
            client_floor_us: (calls_per_op * round_trip.us).max(with_client_cpu),
            durable_us,
            nasd_us: 1e6 / j.value("nasd").filter(|v| *v > 0.0)?,
        })
    }

    pub fn floor_us(&self) -> f64 {
        self.client_floor_us + self.durable_us.unwrap_or(0.0)
    }

    pub fn verdict(&self) -> String {
        if self.peer_us / self.nasd_us >= META_GOAL {
            "met".into()
        } else if self.floor_us() > self.budget_us {
            format!("out of reach: the floor is {:.1}× the budget", self.floor_us() / self.budget_us)
        } else {
            format!("open: nasd is {} µs above the floor", fmt_num(self.nasd_us - self.floor_us()))
        }
    }
}

/// The metadata goal against `peer`, job by job, beside the floor that this client
/// ([`RoundTrip`]) and this disk put under any server ([`GoalCheck`]).
fn goal_table(r: &Results, suite: &str, peer: &str, round_trip: RoundTrip) -> Option<Block> {
    let header = vec![
        "job".to_string(),
        format!("{peer} µs/op"),
        format!("{META_GOAL}× budget µs/op"),
        "calls/op".into(),
        format!("client floor µs/op (≥ calls × {})", fmt_num(round_trip.us)),
        "durable change, local µs/op".into(),
        "floor µs/op".into(),
        "nasd µs/op".into(),
        format!("nasd÷{peer}"),
        "goal".into(),
    ];
    jobs_table(r, suite, header, |j| {
        let g = GoalCheck::of(j, peer, round_trip)?;
        Some(vec![
            j.job.name.clone(),
            fmt_num(g.peer_us),
            fmt_num(g.budget_us),
            fmt_num(g.calls_per_op),
            fmt_num(g.client_floor_us),
            g.durable_us.map_or_else(|| "-".into(), fmt_num),
            fmt_num(g.floor_us()),
            fmt_num(g.nasd_us),
            fmt_ratio(Some(g.peer_us / g.nasd_us)),
            g.verdict(),
        ])
    })
}

/// A table of the suite's jobs that `row` gives a row for; none if it gives none.
fn jobs_table(r: &Results, suite: &str, header: Vec<String>, row: impl Fn(&JobResult) -> Option<Vec<String>>) -> Option<Block> {
    let rows: Vec<Vec<String>> = r.jobs.iter().filter(|j| j.job.suite == suite).filter_map(row).collect();
    (!rows.is_empty()).then_some(Block::Table { header, rows })
}

/// The latency goal: at iodepth 1, nasd's mean at most this share of a peer's.
pub const LATENCY_GOAL: f64 = 0.5;

/// An iodepth-1 fio job weighed against the latency goal over a peer: the client's own
/// share of each I/O (nasd's client-side mean less its server-side time per call, which
/// any server's client pays too) against what the goal allows.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyCheck {
    pub peer_us: f64,
    pub budget_us: f64,
    pub server_us: f64,
    pub nasd_us: f64,
}

impl LatencyCheck {
    pub fn of(j: &JobResult, peer: &str) -> Option<LatencyCheck> {
        let JobKind::Fio(shape) = &j.job.kind else { return None };
        if shape.iodepth != 1 {
            return None;
        }
        let mean =
            |t: &str| j.get(t).filter(|m| m.error.is_none()).and_then(|m| m.fio.as_ref()).map(|f| f.lat_mean_us()).filter(|v| *v > 0.0);
        let (nasd_us, peer_us) = (mean("nasd")?, mean(peer)?);
        let server = j.get("nasd")?.server.as_ref()?;
        let calls = server.calls();
        if calls == 0 {
            return None;
        }
        let server_us = server.procs.iter().map(|p| p.calls as f64 * p.mean_us).sum::<f64>() / calls as f64;
        Some(LatencyCheck { peer_us, budget_us: peer_us * LATENCY_GOAL, server_us, nasd_us })
    }

    /// What an I/O takes with a server that takes no time.
    pub fn floor_us(&self) -> f64 {
        (self.nasd_us - self.server_us).max(0.0)
    }

    pub fn verdict(&self) -> String {
        if self.nasd_us <= self.budget_us {
            "met".into()
        } else if self.floor_us() > self.budget_us {
            format!("out of reach: the floor is {:.2}× the budget", self.floor_us() / self.budget_us)
        } else {
            format!("open: nasd is {} µs above the budget", fmt_num(self.nasd_us - self.budget_us))
        }
    }
}

fn latency_goal_table(r: &Results, suite: &str, peer: &str) -> Option<Block> {
    let header = vec![
        "job".to_string(),
        format!("{peer} mean µs"),
        format!("budget µs ({LATENCY_GOAL}×)"),
        "nasd mean µs".into(),
        "nasd server µs per call".into(),
        "floor µs (client's share)".into(),
        format!("nasd÷{peer}"),
        "goal".into(),
    ];
    jobs_table(r, suite, header, |j| {
        let c = LatencyCheck::of(j, peer)?;
        Some(vec![
            j.job.name.clone(),
            fmt_num(c.peer_us),
            fmt_num(c.budget_us),
            fmt_num(c.nasd_us),
            fmt_num(c.server_us),
            fmt_num(c.floor_us()),
            format!("{:.2}×", c.nasd_us / c.peer_us),
            c.verdict(),
        ])
    })
}

fn server_table(r: &Results, suite: &str) -> Option<Block> {
    let header = [
        "job",
        "client mean (µs)",
        "server procedure",
        "calls",
        "server mean (µs)",
        "server p50 (µs)",
        "server p99 (µs)",
        "server errors",
        "nasd RSS / peak (MiB)",
        "busy poll: caught / spins, s spun",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for j in r.jobs.iter().filter(|j| j.job.suite == suite) {
        let Some(m) = j.get("nasd") else { continue };
        let Some(s) = &m.server else { continue };
        let client = m.fio.as_ref().map(|f| fmt_num(f.lat_mean_us())).unwrap_or_else(|| "-".into());
        // A run that failed (a stable write job that was sent UNSTABLE WRITEs) still has
        // the server's figures, but they stand for no result.
        let name = if m.error.is_some() { format!("{} (failed run)", j.job.name) } else { j.job.name.clone() };
        for (k, p) in s.procs.iter().take(2).enumerate() {
            rows.push(vec![
                if k == 0 { name.clone() } else { String::new() },
                if k == 0 { client.clone() } else { String::new() },
                p.procedure.clone(),
                p.calls.to_string(),
                fmt_num(p.mean_us),
                fmt_num(p.p50_us),
                fmt_num(p.p99_us),
                if k == 0 { s.errors.to_string() } else { String::new() },
                if k == 0 && s.peak_resident_bytes > 0 {
                    format!("{:.0} / {:.0}", s.resident_bytes as f64 / 1048576.0, s.peak_resident_bytes as f64 / 1048576.0)
                } else {
                    String::new()
                },
                match (k, s.busy_poll) {
                    (0, bp) if bp.spins > 0.0 => format!("{:.0} / {:.0}, {:.2} s", bp.caught, bp.spins, bp.seconds),
                    (0, _) => "-".into(),
                    _ => String::new(),
                },
            ]);
        }
    }
    (!rows.is_empty()).then_some(Block::Table { header, rows })
}

/// iozone-style tables: per operation and target, MiB/s by file size (rows) × record size.
fn iozone_blocks(r: &Results) -> Vec<Block> {
    let mut out = Vec::new();
    let cases: Vec<(u64, u64)> = r
        .jobs
        .iter()
        .filter_map(|j| match &j.job.kind {
            JobKind::Iozone { shape, .. } => Some((shape.size, shape.bs)),
            _ => None,
        })
        .collect();
    if cases.is_empty() {
        return out;
    }
    let files: BTreeSet<u64> = cases.iter().map(|c| c.0).collect();
    let recs: BTreeSet<u64> = cases.iter().map(|c| c.1).collect();
    let max_file = *files.iter().last().unwrap();
    let names = r.target_names();
    out.push(Block::Para(format!(
        "{} cases (files {}–{}, records {}–{}; records of 32k and below skipped for files above 32m), the iozone -a matrix. Max and mean over all cases, MiB/s, leaving out the cases marked {SHORT_MARK}:",
        iozone_cases(max_file).len(),
        fmt_size(*files.iter().next().unwrap()),
        fmt_size(max_file),
        fmt_size(*recs.iter().next().unwrap()),
        fmt_size(*recs.iter().last().unwrap())
    )));
    let iozone = || r.jobs.iter().filter(|j| matches!(j.job.kind, JobKind::Iozone { .. }));
    if iozone().any(|j| names.iter().any(|n| too_short(j, n))) {
        out.push(Block::Para(format!(
            "{SHORT_MARK} ran under {IOZONE_MIN_MS} ms: fio counts whole milliseconds, rounded up, so a pass that took 0.2 ms shows as the file size ÷ 1 ms. \
             These figures are mostly that rounding; the max and mean leave them out."
        )));
    }
    let mut header = vec!["operation".to_string()];
    for n in &names {
        header.push(format!("{n} max"));
        header.push(format!("{n} mean"));
    }
    let mut rows = Vec::new();
    for op in IOZONE_OPS {
        let mut row = vec![op.to_string()];
        for n in &names {
            let vals: Vec<f64> = r
                .jobs
                .iter()
                .filter(|j| matches!(&j.job.kind, JobKind::Iozone { op: o, .. } if o == op))
                .filter(|j| !too_short(j, n))
                .filter_map(|j| j.value(n))
                .collect();
            let max = vals.iter().cloned().fold(f64::NAN, f64::max);
            let mean = if vals.is_empty() { f64::NAN } else { vals.iter().sum::<f64>() / vals.len() as f64 };
            row.push(fmt_num(max));
            row.push(fmt_num(mean));
        }
        rows.push(row);
    }
    out.push(Block::Table { header, rows });
    for op in IOZONE_OPS {
        for n in &names {
            out.push(Block::Heading(4, format!("{op}, {n}: MiB/s, rows = file size, columns = record size")));
            let mut header = vec!["file \\ record".to_string()];
            header.extend(recs.iter().map(|r| fmt_size(*r)));
            let mut rows = Vec::new();
            for f in &files {
                let mut row = vec![fmt_size(*f)];
                for rc in &recs {
                    let v = r.jobs.iter().find(
                        |j| matches!(&j.job.kind, JobKind::Iozone { op: o, shape } if o == op && shape.size == *f && shape.bs == *rc),
                    );
                    row.push(v.and_then(|j| figure(j, n)).unwrap_or_default());
                }
                rows.push(row);
            }
            out.push(Block::Table { header, rows });
        }
    }
    out
}

fn compare_table(new: &Results, old: &Results) -> Block {
    let mut rows = Vec::new();
    for j in &new.jobs {
        let Some(o) = old.jobs.iter().find(|o| o.job.suite == j.job.suite && o.job.name == j.job.name) else { continue };
        // A job's name leaves out its file size, runtime and ramp (`--size`, `--runtime`,
        // and the suite that ran it) among the rest of its shape: a change between two
        // shapes is no change.
        let same_shape = o.job.kind == j.job.kind;
        for t in new.target_names() {
            let (a, b) = (o.value(&t), j.value(&t));
            if a.is_none() && b.is_none() {
                continue;
            }
            let change = match ratio(b, a) {
                Some(_) if !same_shape => "not comparable: another shape (size, runtime, ramp...)".into(),
                Some(r) => format!("{:+.1}%", (r - 1.0) * 100.0),
                None => "-".into(),
            };
            rows.push(vec![
                j.job.name.clone(),
                t.clone(),
                j.job.metric.label().into(),
                a.map(fmt_num).unwrap_or_else(|| "-".into()),
                b.map(fmt_num).unwrap_or_else(|| "-".into()),
                change,
            ]);
        }
    }
    Block::Table { header: ["job", "target", "unit", "before", "now", "change"].iter().map(|s| s.to_string()).collect(), rows }
}

/// What the run's clients were and what `local` measured: fio jobs and metadata jobs
/// measure the local disk in different ways, and neither is a ceiling for every job.
fn intro(r: &Results) -> String {
    let fio = r.jobs.iter().any(|j| !j.job.is_meta());
    let meta = r.jobs.iter().any(|j| j.job.is_meta());
    let mut text = format!("Run {} ({} s). ", r.started, r.seconds as u64);
    if fio {
        text += &format!(
            "Client: fio with the libnfs engine ({}, over TCP to 127.0.0.1), one process per job. `local` is fio on the file system that holds the servers' data, with direct I/O: the disk's own figure for the same shape, without network or client. Reads and unstable writes over NFS go through the server's page cache and can exceed it. ",
            r.protocol
        );
    }
    if meta {
        text += "Metadata jobs: the test rig's libnfs client (nfsh), one call at a time. `local` runs the same operations with system calls on the file system that holds the servers' data, making nothing durable, where an NFS server in a `sync` export makes each change durable before it replies. ";
    }
    text + "Each job runs against every target in turn before the next job, and the target that goes first rotates from job to job."
}

/// Everything in the report, in order.
pub fn blocks(r: &Results, old: Option<&Results>, plots: &[(String, String)]) -> Vec<Block> {
    let mut b = Vec::new();
    b.push(Block::Heading(1, format!("nasd bench: {} suite", r.suite)));
    b.push(Block::Para(intro(r)));
    b.push(Block::Code(r.command.clone()));
    b.push(Block::Heading(2, "Targets".into()));
    b.push(Block::Table {
        header: vec!["target".into(), "version".into(), "how".into()],
        rows: r.targets.iter().map(|t| vec![t.name.clone(), t.version.clone(), t.how.clone()]).collect(),
    });
    b.push(Block::Heading(2, "Machine".into()));
    b.push(Block::Table {
        header: vec!["fact".into(), "value".into()],
        rows: r.facts.iter().map(|(k, v)| vec![k.clone(), v.clone()]).collect(),
    });
    for n in &r.notes {
        b.push(Block::Para(format!("Note: {n}")));
    }
    for suite in suites_in(r) {
        b.push(Block::Heading(2, format!("Suite `{suite}`")));
        b.push(Block::Para("Headline figure per job (higher is better); ratios above 1 mean nasd is faster.".into()));
        b.push(main_table(r, &suite));
        for (file, alt) in plots.iter().filter(|(f, _)| f.starts_with(&format!("{suite}-"))) {
            b.push(Block::Image { file: file.clone(), alt: alt.clone() });
        }
        if suite == "iozone" {
            b.extend(iozone_blocks(r));
            continue;
        }
        if let Some(t) = meta_table(r, &suite) {
            b.push(Block::Heading(3, "Metadata: operations and timed seconds".into()));
            b.push(Block::Para(
                "Through libnfs (the test rig's nfsh), one RPC after the other; local: the same with system calls. ops/s = operations ÷ seconds of the timed part. \
                 The real-tree jobs count one operation per file, directory and symlink: untar writes the source tree from the local disk into the export \
                 (each file created, written, committed and closed), cp -r copies it inside the export, rm -rf removes it. The source tree is named in the notes above."
                    .into(),
            ));
            b.push(t);
        }
        let round_trip = RoundTrip::of(r, &suite);
        for peer in r.peers() {
            let Some(rt) = round_trip else { break };
            if let Some(t) = goal_table(r, &suite, &peer, rt) {
                b.push(Block::Heading(3, format!("The metadata goal ({META_GOAL}× {peer}) against the client's floor")));
                let client_cpu = rt.client_cpu_us.map_or_else(|| "not measured".into(), |us| format!("{} µs a call", fmt_num(us)));
                b.push(Block::Para(format!(
                    "nfsh sends one call at a time, so an operation takes at least its calls' round trips. The round-trip job measures one: \
                     nasd's time per GETATTR less its server-side time for it is what a call costs with a server that takes no time \
                     ({} µs here; the client's own CPU in it: {client_cpu}). calls/op: the calls nasd counted over the job's timed part ÷ its operations (the client sends the same \
                     calls to every server). The client floor is the larger of calls × round trip and, where the client's CPU was measured, \
                     calls × the round trip less the client's CPU in it, plus the client's own CPU per operation of the job (the less of nasd's run and {peer}'s): \
                     nfsh reads each reply whole, a long listing's entries included, before it sends the next call. \
                     A job that changes the namespace adds the local disk's time to make one change durable \
                     the way a `sync` export here makes it (RFC 1813: before the reply). Where that floor exceeds the budget \
                     ({peer}'s time ÷ {META_GOAL}), no server that keeps the promise meets the goal with this client on this disk.",
                    fmt_num(rt.us)
                )));
                b.push(t);
            }
        }
        for peer in r.peers() {
            if let Some(t) = latency_goal_table(r, &suite, &peer) {
                b.push(Block::Heading(
                    3,
                    format!("The latency goal at iodepth 1 (mean ≤ {LATENCY_GOAL}× {peer}) against the client's share"),
                ));
                b.push(Block::Para(
                    "One I/O at a time: its latency is the client's share (fio, libnfs, both kernels' TCP paths, the wake-ups) plus the \
                     server's time for the call. nasd's server time per call (from /metrics, request complete to reply queued) taken \
                     from its client-side mean leaves the client's share, which a server that took no time would still cost. Where \
                     that floor exceeds the budget, no server meets the goal with this client on this machine."
                        .into(),
                ));
                b.push(t);
            }
        }
        if let Some(t) = latency_table(r, &suite) {
            b.push(Block::Heading(3, "Completion latency (client side)".into()));
            b.push(t);
        }
        if let Some(t) = cpu_table(r, &suite) {
            b.push(Block::Heading(3, "CPU while the client ran".into()));
            b.push(Block::Para(
                "Cores kept busy (CPU seconds ÷ wall seconds of the client's run) by the client (fio, or nfsh for the metadata jobs) and by the \
                 server process, and the server's CPU per operation (fio: its cores ÷ IOPS; metadata: its CPU ÷ the operations counted). Client and server share this machine's cores: a client near one full core, or the two together near \
                 all cores, bounds the figure whatever the server does. Kernel work outside both processes (writeback threads, softirqs on \
                 other cores) is in neither; `-`: the bench did not start that server (external, or the local disk's kernel). nasd's \
                 figure includes its busy polling: after a reply to a client that calls in a tight loop it spins up to `--busy-poll-us` \
                 (50 µs) for the next call, so where calls come one at a time (metadata jobs, iodepth 1) most of its CPU is that wait \
                 (the time spun is in the server-side table below, with how many of its spins the next call ended)."
                    .into(),
            ));
            b.push(t);
        }
        if let Some(t) = server_table(r, &suite) {
            b.push(Block::Heading(3, "nasd server side (from /metrics, scraped before and after each job)".into()));
            b.push(Block::Para(
                "Server latency is from a complete request to its reply being queued; p50/p99 are interpolated from the histogram buckets. \
                 Busy poll: of the waits for a client's next call that spun, those the call ended (each a wake-up saved), and the \
                 seconds spent spinning during the job."
                    .into(),
            ));
            b.push(t);
            let peak = r
                .jobs
                .iter()
                .filter(|j| j.job.suite == suite)
                .filter_map(|j| j.get("nasd").and_then(|m| m.server.as_ref()).map(|s| s.peak_resident_bytes))
                .max()
                .unwrap_or(0);
            if peak > 0 {
                b.push(Block::Para(format!(
                    "nasd's peak resident memory (VmHWM) by the end of this suite: {:.0} MiB.",
                    peak as f64 / 1048576.0
                )));
            }
        }
    }
    if let Some(o) = old {
        b.push(Block::Heading(2, format!("Change since the earlier report ({})", o.started)));
        b.push(compare_table(r, o));
    }
    let repeated: Vec<Vec<String>> = r
        .jobs
        .iter()
        .flat_map(|j| {
            j.runs.iter().filter(|m| m.repeats.len() > 1).map(move |m| {
                let all: Vec<String> = m.repeats.iter().map(|v| v.map_or_else(|| "failed".into(), fmt_num)).collect();
                let ok = || m.repeats.iter().flatten().copied();
                let spread = match (ok().reduce(f64::min), ok().reduce(f64::max)) {
                    (Some(lo), Some(hi)) if lo > 0.0 => format!("{:.0}%", (hi - lo) / lo * 100.0),
                    _ => "-".into(),
                };
                vec![
                    j.job.name.clone(),
                    m.target.clone(),
                    all.join(" / "),
                    m.value(j.job.metric).map(fmt_num).unwrap_or_else(|| "-".into()),
                    spread,
                ]
            })
        })
        .collect();
    if !repeated.is_empty() {
        b.push(Block::Heading(2, "Repetitions".into()));
        b.push(Block::Para(
            "Every run's figure (IOPS, MiB/s, ops/s) in run order, `failed` for a run that failed (its error is under Failed runs). The tables above use the median of \
             the runs that succeeded; of an even number, the upper middle one, a real run whose latency, CPU and server figures the tables show with it. \
             Spread = (max − min) ÷ min of the runs that succeeded."
                .into(),
        ));
        b.push(Block::Table {
            header: ["job", "target", "runs", "median", "spread"].iter().map(|s| s.to_string()).collect(),
            rows: repeated,
        });
    }
    let errors: Vec<Vec<String>> = r
        .jobs
        .iter()
        .flat_map(|j| {
            j.runs.iter().flat_map(move |m| {
                m.failed_runs().into_iter().map(move |(run, e)| {
                    let run = run.map_or_else(|| "-".into(), |k| format!("{k} of {}", m.repeats.len()));
                    vec![j.job.name.clone(), m.target.clone(), run, e.lines().next().unwrap_or("").to_string()]
                })
            })
        })
        .collect();
    if !errors.is_empty() {
        b.push(Block::Heading(2, "Failed runs".into()));
        b.push(Block::Para("Every run that failed, each repetition of a repeated job on its own row.".into()));
        b.push(Block::Table { header: vec!["job".into(), "target".into(), "run".into(), "error".into()], rows: errors });
    }
    let hangs: Vec<Vec<String>> = r
        .jobs
        .iter()
        .flat_map(|j| {
            j.runs.iter().filter(|m| m.stuck_retries > 0 || m.hung_at_exit.is_some()).map(move |m| {
                vec![
                    j.job.name.clone(),
                    m.target.clone(),
                    m.stuck_retries.to_string(),
                    m.hung_at_exit.map_or("-".into(), |s| format!("{s:.1} s")),
                ]
            })
        })
        .collect();
    if !hangs.is_empty() {
        b.push(Block::Heading(2, "Client hangs".into()));
        b.push(Block::Para(
            "libnfs 4.0 can hang when fio tears a connection down with READ replies still arriving (it keeps the \
             half-read reply and waits forever on the next connection), against any server. A run stuck before its \
             end was started again; a run that hung on its way out was stopped, and its figures are from fio's last \
             one-second status report, covering the time shown."
                .into(),
        ));
        b.push(Block::Table {
            header: vec!["job".into(), "target".into(), "runs started again".into(), "figures from status report".into()],
            rows: hangs,
        });
    }
    b.push(Block::Heading(2, "Exact command lines".into()));
    b.push(Block::Para("Raw fio JSON of every run is in raw/, all figures in results.json.".into()));
    let mut text = String::new();
    let mut iozone_seen = BTreeSet::new();
    for j in &r.jobs {
        if let JobKind::Iozone { op, .. } = &j.job.kind {
            if !iozone_seen.insert(op.clone()) {
                continue;
            }
            text.push_str("# iozone matrix: one example per operation; the other cases differ in --bs, --size and --filename\n");
        }
        text.push_str(&format!("# {} / {}\n", j.job.suite, j.job.name));
        for m in &j.runs {
            for c in &m.commands {
                text.push_str(c);
                text.push('\n');
            }
        }
    }
    b.push(Block::Code(text));
    b
}

/// A column whose cells are all figures (or empty, "-", "error") is right-aligned.
fn numeric_column(rows: &[Vec<String>], i: usize) -> bool {
    i > 0
        && rows.iter().all(|r| {
            let c = r.get(i).map(String::as_str).unwrap_or("");
            c.is_empty() || c == "-" || c == "error" || c.starts_with(|ch: char| ch.is_ascii_digit() || ch == '+' || ch == '-')
        })
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

pub fn render_md(blocks: &[Block]) -> String {
    let mut o = String::new();
    for b in blocks {
        match b {
            Block::Heading(l, t) => o.push_str(&format!("{} {}\n\n", "#".repeat(*l as usize), t)),
            Block::Para(t) => o.push_str(&format!("{t}\n\n")),
            Block::Code(t) => o.push_str(&format!("```\n{}\n```\n\n", t.trim_end())),
            Block::Image { file, alt } => o.push_str(&format!("![{alt}]({file})\n\n")),
            Block::Table { header, rows } => {
                o.push_str(&format!("| {} |\n", header.iter().map(|h| md_escape(h)).collect::<Vec<_>>().join(" | ")));
                o.push_str(&format!(
                    "|{}\n",
                    (0..header.len()).map(|i| if numeric_column(rows, i) { "---:|" } else { "---|" }).collect::<String>()
                ));
                for r in rows {
                    o.push_str(&format!("| {} |\n", r.iter().map(|c| md_escape(c)).collect::<Vec<_>>().join(" | ")));
                }
                o.push('\n');
            }
        }
    }
    o
}

fn h(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn inline_code(s: &str) -> String {
    // `x` -> <code>x</code> after escaping
    let mut o = String::new();
    for (i, part) in h(s).split('`').enumerate() {
        if i % 2 == 1 {
            o.push_str(&format!("<code>{part}</code>"));
        } else {
            o.push_str(part);
        }
    }
    o
}

pub fn render_html(blocks: &[Block], title: &str) -> String {
    let mut o = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\nbody{{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}}\ntable{{border-collapse:collapse;margin:1em 0;font-size:90%}}\nth,td{{border:1px solid #ccc;padding:3px 8px}}\ntd{{text-align:right}}td:first-child{{text-align:left}}\nth{{background:#eee}}\npre{{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:85%}}\nimg{{max-width:100%;border:1px solid #ddd;margin:.5em 0}}\n</style></head><body>\n",
        h(title)
    );
    for b in blocks {
        match b {
            Block::Heading(l, t) => o.push_str(&format!("<h{l}>{}</h{l}>\n", inline_code(t))),
            Block::Para(t) => o.push_str(&format!("<p>{}</p>\n", inline_code(t))),
            Block::Code(t) => o.push_str(&format!("<pre>{}</pre>\n", h(t.trim_end()))),
            Block::Image { file, alt } => o.push_str(&format!("<p><img src=\"{}\" alt=\"{}\"></p>\n", h(file), h(alt))),
            Block::Table { header, rows } => {
                o.push_str("<table>\n<tr>");
                for c in header {
                    o.push_str(&format!("<th>{}</th>", h(c)));
                }
                o.push_str("</tr>\n");
                for r in rows {
                    o.push_str("<tr>");
                    for (i, c) in r.iter().enumerate() {
                        let style = if numeric_column(rows, i) { "" } else { " style=\"text-align:left\"" };
                        o.push_str(&format!("<td{style}>{}</td>", h(c)));
                    }
                    o.push_str("</tr>\n");
                }
                o.push_str("</table>\n");
            }
        }
    }
    o.push_str("</body></html>\n");
    o
}

/// Paths below the report directory are shown as `$OUT/...`, so a committed report names
/// no machine paths.
fn relative(blocks: Vec<Block>, out_dir: &str) -> Vec<Block> {
    if out_dir.is_empty() {
        return blocks;
    }
    let f = |s: &str| s.replace(out_dir, "$OUT");
    blocks
        .into_iter()
        .map(|b| match b {
            Block::Para(t) => Block::Para(f(&t)),
            Block::Code(t) => Block::Code(f(&t)),
            Block::Table { header, rows } => {
                Block::Table { header, rows: rows.into_iter().map(|r| r.iter().map(|c| f(c)).collect()).collect() }
            }
            other => other,
        })
        .collect()
}

pub fn markdown(r: &Results, old: Option<&Results>, plots: &[(String, String)]) -> String {
    render_md(&relative(blocks(r, old, plots), &r.out_dir))
}

pub fn html(r: &Results, old: Option<&Results>, plots: &[(String, String)]) -> String {
    render_html(&relative(blocks(r, old, plots), &r.out_dir), &format!("nasd bench: {}", r.suite))
}

fn read(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn cmd(argv: &[&str]) -> String {
    std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// CPU, cores, memory, kernel, OS, file system of `dir`, versions, idle page-cache
/// reclaim, TCP congestion control.
pub fn machine_facts(dir: &Path) -> Vec<(String, String)> {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let os = read("/etc/os-release")
        .lines()
        .find(|l| l.starts_with("PRETTY_NAME="))
        .map(|l| l[12..].trim_matches('"').to_string())
        .unwrap_or_default();
    let d = dir.display().to_string();
    let fs = cmd(&["findmnt", "-n", "-o", "FSTYPE,OPTIONS", "--target", &d]);
    let fs = if fs.is_empty() { cmd(&["stat", "-f", "-c", "%T", &d]) } else { fs };
    let dev = cmd(&["findmnt", "-n", "-o", "SOURCE", "--target", &d]);
    let libnfs = cmd(&["pkg-config", "--modversion", "libnfs"]);
    let system_cc = read("/proc/sys/net/ipv4/tcp_congestion_control").trim().to_string();
    vec![
        ("CPU".into(), cpu),
        ("cores".into(), cores.to_string()),
        ("memory".into(), format!("{:.1} GiB", mem_kb as f64 / 1048576.0)),
        ("kernel".into(), read("/proc/sys/kernel/osrelease").trim().to_string()),
        ("OS".into(), os),
        ("file system of the data".into(), format!("{fs} on {dev}")),
        ("nasd makes each namespace change durable with".into(), crate::backend::local::namespace_durability(dir)),
        ("nasd".into(), format!("{} (this build)", env!("CARGO_PKG_VERSION"))),
        ("libnfs".into(), if libnfs.is_empty() { "unknown".into() } else { libnfs }),
        (
            "idle page-cache reclaim".into(),
            super::pagecache::idle_page_reclaim(Path::new("/sys/kernel/mm/damon/admin")).unwrap_or_else(|| "none found".into()),
        ),
        // It can bound the 1 MiB jobs over loopback: bbr paces a loopback connection at a
        // bandwidth estimate that swings widely (docs/performance.md, change 21).
        ("TCP congestion control (the system's, for the client and other servers)".into(), system_cc.clone()),
        (
            "TCP congestion control of nasd's connections from this host".into(),
            if crate::server::paces(&system_cc) {
                "cubic (reno where cubic cannot be set): the system's paces, and nasd does not pace this host's clients unless started with --tcp-congestion (change 23)".into()
            } else {
                "the system's".into()
            },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::fio::{FioResult, FioShape};
    use super::super::suites::{Job, Metric};
    use super::super::TargetInfo;
    use super::*;

    fn results() -> Results {
        let shape = FioShape { runtime: 1, ..FioShape::one_pass("randread", 4096, 1, 1 << 20, "f") };
        let meas = |t: &str, iops: f64, err: bool| {
            let mut f = FioResult::default();
            f.read.iops = iops;
            f.read.ios = 10;
            f.read.lat_mean_us = 100.0;
            Measurement {
                target: t.into(),
                fio: Some(f),
                error: err.then(|| "boom".into()),
                commands: vec![format!("fio --name={t}")],
                ..Default::default()
            }
        };
        Results {
            suite: "smoke".into(),
            command: "nasd bench".into(),
            started: "now".into(),
            seconds: 1.0,
            protocol: "NFSv3".into(),
            out_dir: String::new(),
            targets: ["nasd", "ganesha", "local"]
                .iter()
                .map(|n| TargetInfo { name: n.to_string(), version: "v".into(), how: "h".into() })
                .collect(),
            facts: vec![("CPU".into(), "x".into())],
            notes: vec![],
            jobs: vec![JobResult {
                job: Job {
                    suite: "smoke".into(),
                    name: "4k randread qd1".into(),
                    group: "g".into(),
                    x: 1.0,
                    metric: Metric::Iops,
                    kind: JobKind::Fio(shape),
                },
                runs: vec![meas("nasd", 3000.0, false), meas("ganesha", 1500.0, false), meas("local", 0.0, true)],
            }],
        }
    }

    #[test]
    fn server_figures_of_a_failed_run_are_marked() {
        let mut r = results();
        let proc = super::super::metrics::ProcFigures { procedure: "READ".into(), calls: 10, mean_us: 5.0, p50_us: 4.0, p99_us: 9.0 };
        r.jobs[0].runs[0].server = Some(super::super::metrics::ServerFigures { procs: vec![proc], ..Default::default() });
        let name = |r: &Results| match server_table(r, "smoke") {
            Some(Block::Table { rows, .. }) => rows[0][0].clone(),
            _ => panic!("a table"),
        };
        assert_eq!(name(&r), "4k randread qd1");
        r.jobs[0].runs[0].error = Some("sent UNSTABLE WRITEs".into());
        assert_eq!(name(&r), "4k randread qd1 (failed run)");
    }

    #[test]
    fn the_server_table_gives_what_busy_polling_caught_and_cost() {
        use super::super::metrics::{BusyPollFigures, ProcFigures, ServerFigures};
        let mut r = results();
        let procs = vec![
            ProcFigures { procedure: "READ".into(), calls: 10, ..Default::default() },
            ProcFigures { procedure: "GETATTR".into(), calls: 2, ..Default::default() },
        ];
        let busy_poll = BusyPollFigures { spins: 9.0, caught: 8.0, seconds: 0.25 };
        r.jobs[0].runs[0].server = Some(ServerFigures { procs: procs.clone(), busy_poll, ..Default::default() });
        let rows = |r: &Results| match server_table(r, "smoke") {
            Some(Block::Table { header, rows }) => {
                assert_eq!(header.last().unwrap(), "busy poll: caught / spins, s spun");
                rows.iter().map(|row| row.last().unwrap().clone()).collect::<Vec<_>>()
            }
            _ => panic!("a table"),
        };
        // On the job's first line only.
        assert_eq!(rows(&r), ["8 / 9, 0.25 s", ""]);
        r.jobs[0].runs[0].server = Some(ServerFigures { procs, ..Default::default() });
        assert_eq!(rows(&r), ["-", ""]);
    }

    #[test]
    fn a_comparison_gives_a_change_only_between_runs_of_one_shape() {
        let old = results();
        let mut new = results();
        new.jobs[0].runs[0].fio.as_mut().unwrap().read.iops = 3300.0;
        let rows = |new: &Results| match compare_table(new, &old) {
            Block::Table { rows, .. } => rows,
            _ => panic!("a table"),
        };
        assert_eq!(rows(&new)[0], ["4k randread qd1", "nasd", "IOPS", "3000", "3300", "+10.0%"]);
        // The same job name run longer (another suite, or --runtime) is not compared.
        let JobKind::Fio(shape) = &mut new.jobs[0].job.kind else { panic!("a fio job") };
        shape.runtime = 15;
        assert_eq!(rows(&new)[0][5], "not comparable: another shape (size, runtime, ramp...)");
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(Some(3.0), Some(1.5)), Some(2.0));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        assert_eq!(fmt_ratio(Some(0.5)), "0.50×");
        assert_eq!(fmt_num(12345.6), "12346");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(1.234), "1.23");
    }

    #[test]
    fn main_table_has_targets_and_ratios() {
        let r = results();
        let Block::Table { header, rows } = main_table(&r, "smoke") else { panic!() };
        assert_eq!(header, ["job", "unit", "nasd", "ganesha", "local", "nasd÷ganesha", "nasd÷local"]);
        assert_eq!(rows[0], ["4k randread qd1", "IOPS", "3000", "1500", "error", "2.00×", "-"]);
        // With repetitions, a ratio of medians of different numbers of runs says so.
        let mut r = results();
        r.jobs[0].runs[0].repeats = vec![Some(2900.0), Some(3000.0), Some(3100.0)];
        r.jobs[0].runs[1].repeats = vec![Some(1400.0), None, Some(1500.0)];
        let Block::Table { rows, .. } = main_table(&r, "smoke") else { panic!() };
        assert_eq!(rows[0][5], "2.00× (medians of 3 and 2 runs)");
        r.jobs[0].runs[1].repeats = vec![Some(1400.0), Some(1450.0), Some(1500.0)];
        let Block::Table { rows, .. } = main_table(&r, "smoke") else { panic!() };
        assert_eq!(rows[0][5], "2.00×");
    }

    #[test]
    fn the_goal_check_puts_the_clients_round_trips_and_the_durable_change_under_each_job() {
        use super::super::metrics::{ProcFigures, ServerFigures};
        use super::super::suites::MetaOp;
        let mut r = results();
        r.suite = "metadata".into();
        let server = |procs: &[(&str, u64, f64)]| ServerFigures {
            procs: procs
                .iter()
                .map(|&(p, calls, mean_us)| ProcFigures { procedure: p.into(), calls, mean_us, ..Default::default() })
                .collect(),
            ..Default::default()
        };
        let meas = |t: &str, ops: u64, secs: f64, srv: Option<ServerFigures>| Measurement {
            target: t.into(),
            ops_per_sec: Some(ops as f64 / secs),
            meta: Some(super::super::MetaFigures { ops, seconds: secs, bytes: None }),
            server: srv,
            ..Default::default()
        };
        let job = |name: &str, op| Job {
            suite: "metadata".into(),
            name: name.into(),
            group: "metadata".into(),
            x: 0.0,
            metric: Metric::OpsPerSec,
            kind: JobKind::Meta { op, files: 1000, dirs: 10, clients: 1 },
        };
        // round trip: 1000 GETATTRs in 35 ms through nasd, 5 µs of them in nasd: 30 µs a call
        let round_trip = JobResult {
            job: job("round trip: 1000 GETATTRs of one file", MetaOp::RoundTrip),
            runs: vec![
                meas("nasd", 1000, 0.035, Some(server(&[("nfs3 GETATTR", 1001, 5.0), ("nfs3 LOOKUP", 1, 9.0)]))),
                meas("ganesha", 1000, 0.05, None),
            ],
        };
        // stat: 3 calls an operation; 90 µs floor against a budget of 150/3 = 50 µs
        let stat = JobResult {
            job: job("stat 1000 files", MetaOp::Stat),
            runs: vec![
                meas("nasd", 1000, 0.1, Some(server(&[("nfs3 LOOKUP", 2000, 5.0), ("nfs3 GETATTR", 1000, 1.0)]))),
                meas("ganesha", 1000, 0.15, None),
            ],
        };
        // create: 2 calls and a 100 µs durable change: floor 160 µs, budget 600/3 µs
        let mut local = meas("local", 1000, 0.01, None);
        local.durable = Some(super::super::MetaFigures { ops: 1000, seconds: 0.1, bytes: None });
        let create = JobResult {
            job: job("create 1000 files", MetaOp::Create),
            runs: vec![
                meas("nasd", 1000, 0.25, Some(server(&[("nfs3 CREATE", 1000, 150.0), ("nfs3 LOOKUP", 1000, 5.0)]))),
                meas("ganesha", 1000, 0.6, None),
                local,
            ],
        };
        // readdir: met
        let readdir = JobResult {
            job: job("readdir 1000 files", MetaOp::Readdir),
            runs: vec![meas("nasd", 1000, 0.001, Some(server(&[("nfs3 READDIRPLUS", 20, 40.0)]))), meas("ganesha", 1000, 0.004, None)],
        };
        // readdir again, where the client's CPU is known: 20 calls for 1000 entries, and
        // reading the replies costs the client 0.6 µs an entry (ganesha's run; 0.9 in nasd's)
        let with_cpu = |mut m: Measurement, client: f64| {
            m.cpu = Some(super::super::cpu::CpuFigures { seconds: 0.0, client, server: None });
            m
        };
        let relist = JobResult {
            job: job("readdir 1000 files × 10 listings", MetaOp::Relist),
            runs: vec![
                with_cpu(meas("nasd", 1000, 0.002, Some(server(&[("nfs3 READDIRPLUS", 20, 20.0)]))), 0.0009),
                with_cpu(meas("ganesha", 1000, 0.0015, None), 0.0006),
            ],
        };
        r.jobs = vec![create.clone(), stat.clone(), round_trip.clone(), readdir];
        let rt = RoundTrip::of(&r, "metadata").expect("a round trip");
        assert!((rt.us - 30.0).abs() < 1e-6 && rt.client_cpu_us.is_none(), "{rt:?}");
        // Without the client's CPU the floor is the calls' round trips alone.
        let g = GoalCheck::of(&relist, "ganesha", rt).expect("relist is checked");
        assert!((g.floor_us() - 0.6).abs() < 1e-9, "{g:?}");
        assert!(g.verdict().starts_with("out of reach: the floor is 1.2×"), "{}", g.verdict());
        // With it (10 µs of the 30 µs round trip is the client's CPU): 20 µs a call, plus
        // 0.6 µs an entry of reading replies, 0.02 calls an entry: 1.0 µs against 0.5.
        let rt_cpu = RoundTrip { client_cpu_us: Some(10.0), ..rt };
        let g = GoalCheck::of(&relist, "ganesha", rt_cpu).expect("relist is checked");
        assert!((g.floor_us() - 1.0).abs() < 1e-9 && (g.budget_us - 0.5).abs() < 1e-9, "{g:?}");
        assert_eq!(g.verdict(), "out of reach: the floor is 2.0× the budget");
        // A job whose client CPU is below its calls' share of the round trip keeps that floor.
        let g = GoalCheck::of(&stat, "ganesha", rt_cpu).expect("stat is checked");
        assert!((g.floor_us() - 90.0).abs() < 1e-6, "{g:?}");
        let g = GoalCheck::of(&stat, "ganesha", rt).expect("stat is checked");
        assert!((g.calls_per_op - 3.0).abs() < 1e-9 && (g.floor_us() - 90.0).abs() < 1e-6 && (g.budget_us - 50.0).abs() < 1e-6, "{g:?}");
        assert_eq!(g.durable_us, None, "a stat changes nothing");
        assert_eq!(g.verdict(), "out of reach: the floor is 1.8× the budget");
        let g = GoalCheck::of(&create, "ganesha", rt).expect("create is checked");
        assert!((g.floor_us() - 160.0).abs() < 1e-6, "{g:?}");
        assert_eq!(g.verdict(), "open: nasd is 90.0 µs above the floor");
        assert_eq!(GoalCheck::of(&round_trip, "ganesha", rt), None, "the round trip is the floor, not a goal");
        let Some(Block::Table { header, rows }) = goal_table(&r, "metadata", "ganesha", rt) else { panic!("a goal table") };
        assert_eq!(header[4], "client floor µs/op (≥ calls × 30.0)");
        let verdicts: Vec<(&str, &str)> = rows.iter().map(|row| (row[0].as_str(), row[9].as_str())).collect();
        assert_eq!(
            verdicts,
            [
                ("create 1000 files", "open: nasd is 90.0 µs above the floor"),
                ("stat 1000 files", "out of reach: the floor is 1.8× the budget"),
                ("readdir 1000 files", "met")
            ]
        );
        assert!(markdown(&r, None, &[]).contains("### The metadata goal (3× ganesha) against the client's floor"));
        // Without the round-trip job (or nasd's server figures for it) there is no floor to show.
        r.jobs.retain(|j| !matches!(j.job.kind, JobKind::Meta { op: MetaOp::RoundTrip, .. }));
        assert_eq!(RoundTrip::of(&r, "metadata"), None);
        assert!(!markdown(&r, None, &[]).contains("The metadata goal"));
        r.jobs.push(JobResult { runs: vec![meas("nasd", 1000, 0.035, None)], ..round_trip });
        assert_eq!(RoundTrip::of(&r, "metadata"), None);
        assert!(!markdown(&r, None, &[]).contains("The metadata goal"));
    }

    #[test]
    fn the_latency_goal_takes_nasds_server_time_from_its_mean_to_find_the_clients_share() {
        use super::super::metrics::{ProcFigures, ServerFigures};
        let mut r = results();
        // nasd 3000 IOPS at a 100 µs mean, 10 µs of it in nasd; ganesha at 100 µs too
        let read = ProcFigures { procedure: "nfs3 READ".into(), calls: 9, mean_us: 10.0, ..Default::default() };
        let null = ProcFigures { procedure: "nfs3 NULL".into(), calls: 1, mean_us: 10.0, ..Default::default() };
        r.jobs[0].runs[0].server = Some(ServerFigures { procs: vec![read, null], ..Default::default() });
        let c = LatencyCheck::of(&r.jobs[0], "ganesha").expect("an iodepth-1 job");
        assert_eq!((c.budget_us, c.server_us, c.floor_us()), (50.0, 10.0, 90.0));
        assert_eq!(c.verdict(), "out of reach: the floor is 1.80× the budget");
        r.jobs[0].runs[1].fio.as_mut().unwrap().read.lat_mean_us = 190.0;
        assert_eq!(LatencyCheck::of(&r.jobs[0], "ganesha").unwrap().verdict(), "open: nasd is 5.00 µs above the budget");
        r.jobs[0].runs[1].fio.as_mut().unwrap().read.lat_mean_us = 250.0;
        assert_eq!(LatencyCheck::of(&r.jobs[0], "ganesha").unwrap().verdict(), "met");
        let Some(Block::Table { rows, .. }) = latency_goal_table(&r, "smoke", "ganesha") else { panic!("a table") };
        assert_eq!(rows[0], ["4k randread qd1", "250", "125", "100", "10.0", "90.0", "0.40×", "met"]);
        // deeper queues are not the latency goal's; nor is a run without nasd's server figures
        r.jobs[0].runs[0].server = None;
        assert!(latency_goal_table(&r, "smoke", "ganesha").is_none());
    }

    #[test]
    fn metadata_jobs_show_operations_and_seconds() {
        let mut r = results();
        r.suite = "metadata".into();
        let meas = |t: &str, ops: u64, secs: f64, bytes: Option<u64>| Measurement {
            target: t.into(),
            ops_per_sec: Some(ops as f64 / secs),
            meta: Some(super::super::MetaFigures { ops, seconds: secs, bytes }),
            ..Default::default()
        };
        r.jobs = vec![JobResult {
            job: Job {
                suite: "metadata".into(),
                name: "untar tree".into(),
                group: "metadata".into(),
                x: 0.0,
                metric: Metric::OpsPerSec,
                kind: JobKind::Meta { op: super::super::suites::MetaOp::Untar, files: 0, dirs: 0, clients: 1 },
            },
            runs: vec![
                meas("nasd", 3000, 2.0, Some(64 << 20)),
                meas("ganesha", 3000, 4.0, Some(64 << 20)),
                meas("local", 3000, 0.5, Some(64 << 20)),
            ],
        }];
        let Block::Table { rows, .. } = main_table(&r, "metadata") else { panic!() };
        assert_eq!(rows[0], ["untar tree", "ops/s", "1500", "750", "6000", "2.00×", "0.25×"]);
        let md = markdown(&r, None, &[]);
        assert!(md.contains("| job | nasd ops in s | ganesha ops in s | local ops in s |\n"), "{md}");
        assert!(md.contains("| untar tree | 3000 in 2.00 s, 64.0 MiB | 3000 in 4.00 s, 64.0 MiB | 3000 in 0.50 s, 64.0 MiB |"), "{md}");

        // the local disk making each change durable: its figure, and nasd's ratio to it
        r.jobs[0].runs[2].durable = Some(super::super::MetaFigures { ops: 3000, seconds: 1.5, bytes: Some(64 << 20) });
        let md = markdown(&r, None, &[]);
        assert!(
            md.contains(
                "| job | nasd ops in s | ganesha ops in s | local ops in s | local, each change durable: ops in s | nasd÷local durable |"
            ),
            "{md}"
        );
        assert!(md.contains("| 3000 in 0.50 s, 64.0 MiB | 3000 in 1.50 s, 64.0 MiB | 0.75× |"), "{md}");
    }

    #[test]
    fn markdown_and_html_render() {
        let r = results();
        // An earlier report where nasd did 2000 IOPS and Ganesha 2000.
        let mut earlier = results();
        for run in &mut earlier.jobs[0].runs {
            if let Some(f) = run.fio.as_mut() {
                f.read.iops = 2000.0;
            }
        }
        let md = markdown(&r, Some(&earlier), &[("smoke-bars.png".into(), "bars".into())]);
        assert!(md.contains("| job | unit | nasd | ganesha | local | nasd÷ganesha | nasd÷local |"), "{md}");
        assert!(md.contains("| 4k randread qd1 | IOPS | 3000 | 1500 | error | 2.00× | - |"), "{md}");
        assert!(md.contains("![bars](smoke-bars.png)"));
        assert!(md.contains("fio --name=nasd"));
        assert!(md.contains("Change since the earlier report"));
        assert!(md.contains("| 4k randread qd1 | nasd | IOPS | 2000 | 3000 | +50.0% |"), "{md}");
        assert!(md.contains("| 4k randread qd1 | ganesha | IOPS | 2000 | 1500 | -25.0% |"), "{md}");
        let html = html(&r, None, &[]);
        assert!(html.contains("<th>nasd÷local</th>") && html.contains("<td>2.00×</td>"));
        assert!(!html.contains("Change since"));
    }

    #[test]
    fn the_introduction_says_what_local_measured_for_the_jobs_that_ran() {
        let r = results();
        let fio_only = intro(&r);
        assert!(fio_only.contains("direct I/O") && !fio_only.contains("nfsh"), "{fio_only}");
        let mut meta = r.clone();
        meta.jobs[0].job.kind = JobKind::Meta { op: crate::bench::suites::MetaOp::Create, files: 10, dirs: 1, clients: 1 };
        let meta_only = intro(&meta);
        assert!(meta_only.contains("making nothing durable") && !meta_only.contains("direct I/O"), "{meta_only}");
    }

    #[test]
    fn repetitions_show_failed_runs_in_place_and_every_error() {
        let mut r = results();
        let run = |v: Option<f64>, err: &str| {
            let mut m = r.jobs[0].runs[0].clone();
            m.fio.as_mut().unwrap().read.iops = v.unwrap_or(0.0);
            m.error = v.is_none().then(|| err.to_string());
            m
        };
        let reps = vec![run(Some(3000.0), ""), run(None, "timed out"), run(Some(2000.0), ""), run(None, "server exited")];
        r.jobs[0].runs[0] = super::super::median_run(reps, Metric::Iops);
        let md = markdown(&r, None, &[]);
        assert!(md.contains("| 4k randread qd1 | nasd | 3000 / failed / 2000 / failed | 3000 | 50% |"), "{md}");
        assert!(md.contains("| job | target | run | error |"), "{md}");
        assert!(md.contains("| 4k randread qd1 | nasd | 2 of 4 | timed out |"), "{md}");
        assert!(md.contains("| 4k randread qd1 | nasd | 4 of 4 | server exited |"), "{md}");
        // a run without repetitions: its own error
        assert!(md.contains("| 4k randread qd1 | local | - | boom |"), "{md}");
    }

    #[test]
    fn iozone_cases_too_short_to_time_are_marked_and_left_out_of_the_mean() {
        let mut r = results();
        r.suite = "iozone".into();
        let case = |size: u64, mib_s: f64, runtime_ms: u64| {
            let shape = FioShape::one_pass("read", 4096, 1, size, "f");
            let mut f = FioResult::default();
            f.read.bw_bytes = mib_s * 1048576.0;
            f.read.runtime_ms = Some(runtime_ms);
            JobResult {
                job: Job {
                    suite: "iozone".into(),
                    name: format!("read file {size}"),
                    group: "read".into(),
                    x: 4096.0,
                    metric: Metric::MiBs,
                    kind: JobKind::Iozone { op: "read".into(), shape },
                },
                runs: vec![Measurement { target: "nasd".into(), fio: Some(f), ..Default::default() }],
            }
        };
        // 1 MiB in under a millisecond counts as 1 ms: 1000 MiB/s, whatever it took.
        r.jobs = vec![case(1 << 20, 1000.0, 1), case(64 << 20, 200.0, 320), case(128 << 20, 100.0, 1280)];
        let md = markdown(&r, None, &[]);
        assert!(md.contains("| read | 200 | 150 |"), "{md}");
        assert!(md.contains(&format!("| 1m | 1000{SHORT_MARK} |")), "{md}");
        assert!(md.contains("| 64m | 200 |"), "{md}");
        assert!(md.contains(&format!("{SHORT_MARK} ran under 5 ms")), "{md}");
        let Block::Table { rows, .. } = main_table(&r, "iozone") else { panic!() };
        assert_eq!(rows[0][2], format!("1000{SHORT_MARK}"));
    }

    #[test]
    fn cpu_table_shows_cores_and_server_cpu_per_op() {
        let mut r = results();
        // 8 s of runtime after 2 s of ramp, in a window of 12 s (fio's start and end).
        let JobKind::Fio(shape) = &mut r.jobs[0].job.kind else { panic!("a fio job") };
        (shape.runtime, shape.ramp) = (8, 2);
        let cpu = |client: f64, server: Option<f64>| Some(super::super::cpu::CpuFigures { seconds: 12.0, client, server });
        // nasd: 6 s of CPU for 3000 IOPS over the 10 s of I/O = 200 µs per I/O (not the
        // 167 µs its 0.5 cores over the whole window would make).
        r.jobs[0].runs[0].cpu = cpu(9.0, Some(6.0));
        r.jobs[0].runs[1].cpu = cpu(8.0, None); // a server the bench did not start
        let Block::Table { header, rows } = cpu_table(&r, "smoke").expect("a CPU table") else { panic!() };
        assert_eq!(header[1], "nasd client / server cores · server CPU per op (µs)");
        assert_eq!(rows, [["4k randread qd1", "0.75 / 0.50 · 200", "0.67 / - · -", "-"]]);
        // Metadata jobs: the server's CPU over the operations nfsh counted.
        let meta = Measurement {
            target: "nasd".into(),
            meta: Some(super::super::MetaFigures { ops: 5000, seconds: 2.0, bytes: None }),
            cpu: Some(super::super::cpu::CpuFigures { seconds: 2.5, client: 1.0, server: Some(1.0) }),
            ..Default::default()
        };
        assert_eq!(meta.server_cpu_per_op_us(&r.jobs[0].job), Some(200.0));
        // A listing whose server CPU is three clock ticks gets no figure per entry.
        let listing =
            Measurement { cpu: Some(super::super::cpu::CpuFigures { seconds: 0.03, client: 0.02, server: Some(0.03) }), ..meta.clone() };
        assert_eq!(listing.server_cpu_per_op_us(&r.jobs[0].job), None);
        // Reports written before CPU figures existed have none: no table.
        for m in &mut r.jobs[0].runs {
            m.cpu = None;
        }
        assert!(cpu_table(&r, "smoke").is_none());
    }
}
