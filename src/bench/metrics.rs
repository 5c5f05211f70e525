//! Server-side figures from nasd's Prometheus endpoint: scraped before and after each job,
//! the difference gives per-procedure call counts and latency for that job alone.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One scrape: per procedure ("nfs3 READ") the latency histogram; plus byte counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// procedure -> (bucket upper bounds in seconds -> cumulative count), sum, count
    pub hist: BTreeMap<String, Hist>,
    pub read_bytes: f64,
    pub write_bytes: f64,
    pub errors: f64,
    pub resident_bytes: f64,
    pub peak_resident_bytes: f64,
    /// WRITE calls by the stability the client asked for ("unstable", "data_sync",
    /// "file_sync").
    pub writes_by_stability: BTreeMap<String, f64>,
    pub busy_poll: BusyPollFigures,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hist {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// Server-side figures of one job and one procedure.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcFigures {
    pub procedure: String,
    pub calls: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerFigures {
    pub procs: Vec<ProcFigures>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// The server's resident set size after the job, and its peak since it started.
    #[serde(default)]
    pub resident_bytes: u64,
    #[serde(default)]
    pub peak_resident_bytes: u64,
    /// WRITE calls of the job by the stability the client asked for.
    #[serde(default)]
    pub writes_by_stability: BTreeMap<String, u64>,
    /// What busy polling did during the job: the share of nasd's CPU that was waiting.
    #[serde(default)]
    pub busy_poll: BusyPollFigures,
}

impl ServerFigures {
    /// Calls of every procedure.
    pub fn calls(&self) -> u64 {
        self.procs.iter().map(|p| p.calls).sum()
    }
}

/// Busy polling's counters (nasd_busy_poll_*), or their change over a job.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BusyPollFigures {
    /// Waits for a next request that spun, and those during which it arrived.
    pub spins: f64,
    pub caught: f64,
    /// Time spent spinning.
    pub seconds: f64,
}

impl BusyPollFigures {
    /// What the counters grew by since `earlier` (never below zero: a restarted server's
    /// counters begin again).
    fn since(&self, earlier: &Self) -> Self {
        Self {
            spins: (self.spins - earlier.spins).max(0.0),
            caught: (self.caught - earlier.caught).max(0.0),
            seconds: (self.seconds - earlier.seconds).max(0.0),
        }
    }
}

pub fn scrape(addr: SocketAddr) -> Result<Snapshot> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).with_context(|| format!("metrics at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let Some(i) = text.find("\r\n\r\n") else { bail!("bad HTTP reply from {addr}") };
    if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
        bail!("metrics at {addr}: {}", text.lines().next().unwrap_or(""));
    }
    Ok(parse(&text[i + 4..]))
}

fn labels(l: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for part in l.split("\",") {
        if let Some((k, v)) = part.split_once("=\"") {
            m.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
        }
    }
    m
}

/// Parse the Prometheus text that nasd serves.
pub fn parse(text: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((key, val)) = line.rsplit_once(' ') else { continue };
        let Ok(v) = val.parse::<f64>() else { continue };
        let (name, lab) = match key.split_once('{') {
            Some((n, rest)) => (n, labels(rest.trim_end_matches('}'))),
            None => (key, BTreeMap::new()),
        };
        let proc_key = || {
            format!("{} {}", lab.get("program").map(String::as_str).unwrap_or("?"), lab.get("procedure").map(String::as_str).unwrap_or("?"))
        };
        match name {
            "nasd_rpc_latency_seconds_bucket" => {
                let le = lab.get("le").map(String::as_str).unwrap_or("+Inf");
                let b = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
                s.hist.entry(proc_key()).or_default().buckets.push((b, v));
            }
            "nasd_rpc_latency_seconds_sum" => s.hist.entry(proc_key()).or_default().sum = v,
            "nasd_rpc_latency_seconds_count" => s.hist.entry(proc_key()).or_default().count = v,
            "nasd_read_bytes_total" => s.read_bytes = v,
            "nasd_write_bytes_total" => s.write_bytes = v,
            "nasd_rpc_errors_total" => s.errors += v,
            "nasd_resident_memory_bytes" => s.resident_bytes = v,
            "nasd_peak_resident_memory_bytes" => s.peak_resident_bytes = v,
            "nasd_busy_poll_spins_total" => s.busy_poll.spins = v,
            "nasd_busy_poll_caught_total" => s.busy_poll.caught = v,
            "nasd_busy_poll_seconds_total" => s.busy_poll.seconds = v,
            "nasd_write_requests_total" => {
                if let Some(stable) = lab.get("stable") {
                    s.writes_by_stability.insert(stable.clone(), v);
                }
            }
            _ => {}
        }
    }
    s
}

/// Quantile from cumulative buckets, interpolated linearly inside the bucket.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let span = c - prev.1;
            let frac = if span > 0.0 { (rank - prev.1) / span } else { 1.0 };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    prev.0
}

/// What happened between two scrapes.
pub fn diff(before: &Snapshot, after: &Snapshot) -> ServerFigures {
    let mut procs = Vec::new();
    for (name, a) in &after.hist {
        let b = before.hist.get(name).cloned().unwrap_or_default();
        let calls = a.count - b.count;
        if calls <= 0.0 {
            continue;
        }
        let buckets: Vec<(f64, f64)> =
            a.buckets.iter().map(|&(le, c)| (le, c - b.buckets.iter().find(|x| x.0 == le).map(|x| x.1).unwrap_or(0.0))).collect();
        procs.push(ProcFigures {
            procedure: name.clone(),
            calls: calls as u64,
            mean_us: (a.sum - b.sum) / calls * 1e6,
            p50_us: quantile(&buckets, 0.5) * 1e6,
            p99_us: quantile(&buckets, 0.99) * 1e6,
        });
    }
    procs.sort_by_key(|p| std::cmp::Reverse(p.calls));
    ServerFigures {
        procs,
        read_bytes: (after.read_bytes - before.read_bytes).max(0.0) as u64,
        write_bytes: (after.write_bytes - before.write_bytes).max(0.0) as u64,
        errors: (after.errors - before.errors).max(0.0) as u64,
        resident_bytes: after.resident_bytes as u64,
        peak_resident_bytes: after.peak_resident_bytes as u64,
        writes_by_stability: after
            .writes_by_stability
            .iter()
            .map(|(stable, a)| (stable.clone(), (a - before.writes_by_stability.get(stable).copied().unwrap_or(0.0)).max(0.0) as u64))
            .filter(|&(_, n)| n > 0)
            .collect(),
        busy_poll: after.busy_poll.since(&before.busy_poll),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u64, extra: u64) -> String {
        format!(
            "# TYPE x counter\n\
             nasd_rpc_calls_total{{program=\"nfs3\",procedure=\"READ\"}} {n}\n\
             nasd_rpc_latency_seconds_bucket{{program=\"nfs3\",procedure=\"READ\",le=\"0.0001\"}} {n}\n\
             nasd_rpc_latency_seconds_bucket{{program=\"nfs3\",procedure=\"READ\",le=\"0.001\"}} {}\n\
             nasd_rpc_latency_seconds_bucket{{program=\"nfs3\",procedure=\"READ\",le=\"+Inf\"}} {}\n\
             nasd_rpc_latency_seconds_sum{{program=\"nfs3\",procedure=\"READ\"}} {}\n\
             nasd_rpc_latency_seconds_count{{program=\"nfs3\",procedure=\"READ\"}} {}\n\
             nasd_read_bytes_total {}\n\
             nasd_busy_poll_spins_total {}\n\
             nasd_busy_poll_caught_total {}\n\
             nasd_busy_poll_seconds_total {}\n",
            n + extra,
            n + extra,
            (n + extra) as f64 * 0.0002,
            n + extra,
            (n + extra) * 4096,
            n + extra,
            n + extra / 2,
            (n + extra) as f64 * 0.00005
        )
    }

    #[test]
    fn diff_of_two_scrapes() {
        let a = parse(&text(10, 0));
        let b = parse(&text(10, 100));
        let d = diff(&a, &b);
        assert_eq!(d.procs.len(), 1);
        let p = &d.procs[0];
        assert_eq!(p.procedure, "nfs3 READ");
        assert_eq!(p.calls, 100);
        assert!((p.mean_us - 200.0).abs() < 1e-6);
        // all 100 new calls fell in (100us, 1ms]
        assert!(p.p50_us > 100.0 && p.p50_us <= 1000.0, "{}", p.p50_us);
        assert_eq!(d.read_bytes, 409600);
        assert_eq!((d.busy_poll.spins, d.busy_poll.caught), (100.0, 50.0));
        assert!((d.busy_poll.seconds - 0.005).abs() < 1e-9, "{}", d.busy_poll.seconds);
    }

    #[test]
    fn quantiles() {
        let b = [(1.0, 50.0), (2.0, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(&b, 0.5), 1.0);
        assert_eq!(quantile(&b, 0.75), 1.5);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
