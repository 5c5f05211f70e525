//! Server metrics in Prometheus text format: per-procedure calls, errors by status and
//! latency histograms; bytes moved; connections, requests in flight and duplicate request
//! cache hits. Counters are lock-free atomics on the request path.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Histogram bucket upper bounds in microseconds. Calls answered from memory take 1–10 µs,
/// so the finest buckets are there: percentiles interpolated within a first bucket of
/// 25 µs said nothing about them.
const BUCKETS_US: [u64; 22] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];
/// Procedure numbers tracked per program.
const MAX_PROCS: usize = 32;

#[derive(Default)]
struct ProcStats {
    calls: AtomicU64,
    /// Calls that waited on a runtime thread (see `rpc::held_up`).
    held_up_inline: AtomicU64,
    /// Tenths of a microsecond: most calls take a few microseconds, and whole ones would
    /// bias the mean; nanoseconds would wrap a u64 after 5.8 years of 100 calls in flight.
    latency_sum_100ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
}

struct ProgramStats {
    program: u32,
    name: &'static str,
    procs: Vec<(&'static str, ProcStats)>,
}

#[derive(Default)]
pub struct Metrics {
    programs: Vec<ProgramStats>,
    /// (program name, procedure name, status) -> count, for non-zero statuses.
    statuses: Mutex<BTreeMap<(&'static str, &'static str, u32), u64>>,
    rpc_errors: Mutex<BTreeMap<&'static str, u64>>,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    /// WRITE calls by the stability the client asked for (unstable, data_sync, file_sync).
    writes_by_stability: [AtomicU64; 3],
    connections: AtomicI64,
    connections_total: AtomicU64,
    in_flight: AtomicI64,
    drc_hits: AtomicU64,
    /// Shared with the server's busy poller, which counts into it.
    pub busy_poll: std::sync::Arc<PollStats>,
}

/// What busy polling for clients' next requests did (`server::busy_poll`): how often it
/// spun, how often the request arrived while it did, the time it spun (CPU spent), and
/// why it did not spin. Tells an operator what `--busy-poll-us` buys and costs.
#[derive(Default)]
pub struct PollStats {
    spins: AtomicU64,
    caught: AtomicU64,
    spin_ns: AtomicU64,
    declined: [AtomicU64; PollDeclined::ALL.len()],
}

/// Why a connection waited for its next request without polling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollDeclined {
    /// The client's last pause was too long for a tight loop (or there was none yet).
    ClientNotInTightLoop,
    /// Every CPU had other work waiting: spinning would take one from it.
    NoSpareCpu,
    /// As many connections as allowed were polling already.
    PollersBusy,
    /// The last call left work on helper threads, which need the other CPU.
    HelpersWorking,
}

impl PollDeclined {
    const ALL: [PollDeclined; 4] =
        [PollDeclined::ClientNotInTightLoop, PollDeclined::NoSpareCpu, PollDeclined::PollersBusy, PollDeclined::HelpersWorking];

    fn label(self) -> &'static str {
        match self {
            PollDeclined::ClientNotInTightLoop => "client_not_in_tight_loop",
            PollDeclined::NoSpareCpu => "no_spare_cpu",
            PollDeclined::PollersBusy => "pollers_busy",
            PollDeclined::HelpersWorking => "helpers_working",
        }
    }
}

impl PollStats {
    /// One spin, `spun` long, that saw the next request arrive (`caught`) or gave up.
    pub fn spun(&self, caught: bool, spun: Duration) {
        self.spins.fetch_add(1, Ordering::Relaxed);
        if caught {
            self.caught.fetch_add(1, Ordering::Relaxed);
        }
        self.spin_ns.fetch_add(u64::try_from(spun.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn declined(&self, why: PollDeclined) {
        self.declined[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn spins(&self) -> u64 {
        self.spins.load(Ordering::Relaxed)
    }

    pub fn caught(&self) -> u64 {
        self.caught.load(Ordering::Relaxed)
    }

    pub fn declined_for(&self, why: PollDeclined) -> u64 {
        self.declined[why as usize].load(Ordering::Relaxed)
    }

    /// Time spent spinning, in seconds.
    pub fn seconds(&self) -> f64 {
        self.spin_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    fn render_into(&self, o: &mut String) -> std::fmt::Result {
        writeln!(
            o,
            "# HELP nasd_busy_poll_spins_total Spins on a connection for its client's next request instead of sleeping (--busy-poll-us)."
        )?;
        writeln!(o, "# TYPE nasd_busy_poll_spins_total counter\nnasd_busy_poll_spins_total {}", self.spins())?;
        writeln!(o, "# HELP nasd_busy_poll_caught_total Spins during which the next request arrived: each saved a wake-up.")?;
        writeln!(o, "# TYPE nasd_busy_poll_caught_total counter\nnasd_busy_poll_caught_total {}", self.caught())?;
        writeln!(o, "# HELP nasd_busy_poll_seconds_total Time spent spinning: CPU time busy polling cost.")?;
        writeln!(o, "# TYPE nasd_busy_poll_seconds_total counter\nnasd_busy_poll_seconds_total {}", self.seconds())?;
        writeln!(o, "# HELP nasd_busy_poll_declined_total Waits for a next request that did not spin, by reason.")?;
        writeln!(o, "# TYPE nasd_busy_poll_declined_total counter")?;
        for why in PollDeclined::ALL {
            writeln!(o, "nasd_busy_poll_declined_total{{reason=\"{}\"}} {}", why.label(), self.declined_for(why))?;
        }
        Ok(())
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a program and its procedure names (index = procedure number).
    pub fn register(&mut self, program: u32, name: &'static str, procedures: &[&'static str]) {
        let procs = procedures.iter().take(MAX_PROCS).map(|p| (*p, ProcStats::default())).collect();
        self.programs.push(ProgramStats { program, name, procs });
    }

    fn program(&self, program: u32) -> Option<&ProgramStats> {
        self.programs.iter().find(|p| p.program == program)
    }

    pub fn record_call(&self, program: u32, procedure: u32, latency: Duration, status: Option<u32>) {
        let Some(p) = self.program(program) else { return };
        let Some((pname, s)) = p.procs.get(procedure as usize) else { return };
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.latency_sum_100ns.fetch_add(ns / 100, Ordering::Relaxed);
        let i = BUCKETS_US.iter().position(|&b| ns <= b * 1_000).unwrap_or(BUCKETS_US.len());
        s.buckets[i].fetch_add(1, Ordering::Relaxed);
        if let Some(st) = status.filter(|&s| s != 0) {
            *self.statuses.lock().entry((p.name, pname, st)).or_default() += 1;
        }
    }

    /// A call that ran on a runtime thread was held up there (see `rpc::held_up`).
    pub fn inline_call_held_up(&self, program: u32, procedure: u32) {
        if let Some((_, s)) = self.program(program).and_then(|p| p.procs.get(procedure as usize)) {
            s.held_up_inline.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// RPC-level rejections (GARBAGE_ARGS, PROG_UNAVAIL, AUTH_ERROR, ...).
    pub fn record_rpc_error(&self, kind: &'static str) {
        *self.rpc_errors.lock().entry(kind).or_default() += 1;
    }

    pub fn add_read_bytes(&self, n: u64) {
        self.read_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_write_bytes(&self, n: u64) {
        self.write_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a completed WRITE by the stability the client asked for: shows whether
    /// clients rely on COMMIT or pay for a sync per write.
    pub fn count_write(&self, requested: crate::vfs::Stability) {
        use crate::vfs::Stability::*;
        let i = match requested {
            Unstable => 0,
            DataSync => 1,
            FileSync => 2,
        };
        self.writes_by_stability[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request_finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn drc_hit(&self) {
        self.drc_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut o = String::with_capacity(16 * 1024);
        let _ = self.render_into(&mut o);
        o
    }

    fn render_into(&self, o: &mut String) -> std::fmt::Result {
        writeln!(o, "# HELP nasd_rpc_calls_total RPC calls completed, by program and procedure.")?;
        writeln!(o, "# TYPE nasd_rpc_calls_total counter")?;
        for p in &self.programs {
            for (name, s) in &p.procs {
                writeln!(o, "nasd_rpc_calls_total{{program=\"{}\",procedure=\"{}\"}} {}", p.name, name, s.calls.load(Ordering::Relaxed))?;
            }
        }
        writeln!(o, "# HELP nasd_rpc_held_up_inline_total Calls held up (20 ms or more) on a runtime thread that serves many connections; each sends its procedure's calls to blocking threads for a second.")?;
        writeln!(o, "# TYPE nasd_rpc_held_up_inline_total counter")?;
        for p in &self.programs {
            for (name, s) in &p.procs {
                let n = s.held_up_inline.load(Ordering::Relaxed);
                if n > 0 {
                    writeln!(o, "nasd_rpc_held_up_inline_total{{program=\"{}\",procedure=\"{}\"}} {n}", p.name, name)?;
                }
            }
        }
        writeln!(o, "# HELP nasd_rpc_latency_seconds Time from a complete request to its reply being queued.")?;
        writeln!(o, "# TYPE nasd_rpc_latency_seconds histogram")?;
        for p in &self.programs {
            for (name, s) in &p.procs {
                let calls = s.calls.load(Ordering::Relaxed);
                if calls == 0 {
                    continue;
                }
                let labels = format!("program=\"{}\",procedure=\"{}\"", p.name, name);
                let mut cum = 0;
                for (i, b) in BUCKETS_US.iter().enumerate() {
                    cum += s.buckets[i].load(Ordering::Relaxed);
                    writeln!(o, "nasd_rpc_latency_seconds_bucket{{{labels},le=\"{}\"}} {cum}", *b as f64 / 1e6)?;
                }
                cum += s.buckets[BUCKETS_US.len()].load(Ordering::Relaxed);
                writeln!(o, "nasd_rpc_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {cum}")?;
                writeln!(o, "nasd_rpc_latency_seconds_sum{{{labels}}} {}", s.latency_sum_100ns.load(Ordering::Relaxed) as f64 / 1e7)?;
                writeln!(o, "nasd_rpc_latency_seconds_count{{{labels}}} {cum}")?;
            }
        }
        writeln!(o, "# HELP nasd_rpc_errors_total Replies with a non-zero protocol status, by status code.")?;
        writeln!(o, "# TYPE nasd_rpc_errors_total counter")?;
        for ((prog, proc_name, st), n) in self.statuses.lock().iter() {
            writeln!(o, "nasd_rpc_errors_total{{program=\"{prog}\",procedure=\"{proc_name}\",status=\"{st}\"}} {n}")?;
        }
        writeln!(o, "# HELP nasd_write_requests_total WRITE calls completed, by the stability the client asked for.")?;
        writeln!(o, "# TYPE nasd_write_requests_total counter")?;
        for (label, n) in ["unstable", "data_sync", "file_sync"].iter().zip(&self.writes_by_stability) {
            writeln!(o, "nasd_write_requests_total{{stable=\"{label}\"}} {}", n.load(Ordering::Relaxed))?;
        }
        writeln!(o, "# HELP nasd_rpc_rejected_total Calls rejected at the RPC layer.")?;
        writeln!(o, "# TYPE nasd_rpc_rejected_total counter")?;
        for (kind, n) in self.rpc_errors.lock().iter() {
            writeln!(o, "nasd_rpc_rejected_total{{reason=\"{kind}\"}} {n}")?;
        }
        let gauges: [(&str, &str, &str, i64); 8] = [
            ("nasd_read_bytes_total", "counter", "File data bytes returned by READ.", self.read_bytes.load(Ordering::Relaxed) as i64),
            ("nasd_write_bytes_total", "counter", "File data bytes accepted by WRITE.", self.write_bytes.load(Ordering::Relaxed) as i64),
            ("nasd_connections", "gauge", "Open client connections.", self.connections.load(Ordering::Relaxed)),
            ("nasd_connections_total", "counter", "Client connections accepted.", self.connections_total.load(Ordering::Relaxed) as i64),
            ("nasd_requests_in_flight", "gauge", "Requests being processed or waiting to be sent.", self.in_flight.load(Ordering::Relaxed)),
            (
                "nasd_drc_hits_total",
                "counter",
                "Retransmitted calls answered from the duplicate request cache.",
                self.drc_hits.load(Ordering::Relaxed) as i64,
            ),
            ("nasd_resident_memory_bytes", "gauge", "Resident set size of the server.", resident_bytes()),
            ("nasd_peak_resident_memory_bytes", "gauge", "Highest resident set size since the server started.", peak_resident_bytes()),
        ];
        for (name, kind, help, v) in gauges {
            writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}")?;
        }
        self.busy_poll.render_into(o)
    }
}

/// A size from /proc/self/status (kB there; 0 if missing). In kB whatever the page
/// size, which differs between machines (4 KiB, 16 KiB, 64 KiB).
fn status_bytes(field: &str) -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn peak_resident_bytes() -> i64 {
    status_bytes("VmHWM")
}

fn resident_bytes() -> i64 {
    status_bytes("VmRSS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_in_bytes_and_never_above_its_peak() {
        let (now, peak) = (resident_bytes(), peak_resident_bytes());
        // A test binary is resident in megabytes, not in pages counted as bytes.
        assert!(now > 1 << 20 && now <= peak, "resident {now} bytes, peak {peak}");
    }

    #[test]
    fn renders_counts_histograms_and_errors() {
        let mut m = Metrics::new();
        m.register(100003, "nfs3", &["NULL", "GETATTR"]);
        m.record_call(100003, 1, Duration::from_micros(30), Some(0));
        m.record_call(100003, 0, Duration::from_nanos(1_500), Some(0));
        m.record_call(100003, 1, Duration::from_millis(2), Some(70));
        m.record_call(100003, 9, Duration::from_millis(2), None); // unknown procedure: ignored
        m.add_read_bytes(4096);
        m.count_write(crate::vfs::Stability::FileSync);
        m.count_write(crate::vfs::Stability::FileSync);
        m.count_write(crate::vfs::Stability::Unstable);
        let text = m.render();
        assert!(text.contains("nasd_rpc_calls_total{program=\"nfs3\",procedure=\"GETATTR\"} 2"), "{text}");
        assert!(text.contains("nasd_rpc_latency_seconds_bucket{program=\"nfs3\",procedure=\"GETATTR\",le=\"0.00005\"} 1"), "{text}");
        assert!(text.contains("nasd_rpc_latency_seconds_bucket{program=\"nfs3\",procedure=\"GETATTR\",le=\"+Inf\"} 2"));
        // Microsecond calls land in microsecond buckets, and their time is not rounded away.
        assert!(text.contains("nasd_rpc_latency_seconds_bucket{program=\"nfs3\",procedure=\"NULL\",le=\"0.000001\"} 0"), "{text}");
        assert!(text.contains("nasd_rpc_latency_seconds_bucket{program=\"nfs3\",procedure=\"NULL\",le=\"0.000002\"} 1"), "{text}");
        assert!(text.contains("nasd_rpc_latency_seconds_sum{program=\"nfs3\",procedure=\"NULL\"} 0.0000015"), "{text}");
        assert!(text.contains("nasd_rpc_errors_total{program=\"nfs3\",procedure=\"GETATTR\",status=\"70\"} 1"));
        assert!(text.contains("nasd_read_bytes_total 4096"));
        assert!(text.contains("nasd_write_requests_total{stable=\"unstable\"} 1"), "{text}");
        assert!(text.contains("nasd_write_requests_total{stable=\"data_sync\"} 0"), "{text}");
        assert!(text.contains("nasd_write_requests_total{stable=\"file_sync\"} 2"), "{text}");
        m.busy_poll.spun(true, Duration::from_micros(30));
        m.busy_poll.spun(false, Duration::from_micros(50));
        m.busy_poll.declined(PollDeclined::NoSpareCpu);
        let text = m.render();
        for line in [
            "nasd_busy_poll_spins_total 2",
            "nasd_busy_poll_caught_total 1",
            "nasd_busy_poll_seconds_total 0.00008",
            "nasd_busy_poll_declined_total{reason=\"no_spare_cpu\"} 1",
            "nasd_busy_poll_declined_total{reason=\"pollers_busy\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        let peak: i64 = text.lines().find_map(|l| l.strip_prefix("nasd_peak_resident_memory_bytes ")).expect("peak RSS").parse().unwrap();
        assert!(peak > 0 && peak >= resident_bytes() / 2, "peak {peak}");
    }
}
