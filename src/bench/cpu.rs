//! CPU used while a job runs: by the client (fio and any other process the bench waited
//! for) and by the server process, when the bench started it (nasd, Ganesha). Client and
//! server share the machine's cores, so these tell what bounds a figure: the client, the
//! server, or neither (the disk). Kernel work done outside both processes (writeback
//! threads, softirqs on other cores) is in neither figure.

use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuFigures {
    /// Wall-clock seconds of the window measured (the client's whole run).
    pub seconds: f64,
    /// CPU seconds (user + system) of the client processes.
    pub client: f64,
    /// CPU seconds (user + system) of the server process; `None` when the bench did not
    /// start it (an external server, the local disk).
    pub server: Option<f64>,
}

impl CpuFigures {
    pub fn client_cores(&self) -> f64 {
        self.client / self.seconds.max(1e-9)
    }

    pub fn server_cores(&self) -> Option<f64> {
        self.server.map(|s| s / self.seconds.max(1e-9))
    }

    /// The server's CPU seconds, if enough to divide among operations: the kernel counts
    /// a process's CPU in clock ticks (10 ms), so a window of a few ticks (a listing of
    /// 5,000 entries takes three) is a count of ticks, one either way a third of it.
    pub fn server_to_divide(&self) -> Option<f64> {
        self.server.filter(|&s| s >= SERVER_CPU_TO_DIVIDE)
    }
}

/// Server CPU seconds below which no figure per operation is given: 50 ticks, so the
/// tick the count may be off by is 2 % of it.
pub const SERVER_CPU_TO_DIVIDE: f64 = 0.5;

/// A measurement in progress: start it right before the client starts, finish it once
/// every client process has been waited for.
pub struct CpuWindow {
    started: Instant,
    children: f64,
    server_pid: Option<u32>,
    server: Option<f64>,
}

impl CpuWindow {
    pub fn start(server_pid: Option<u32>) -> Self {
        Self { started: Instant::now(), children: children_cpu(), server_pid, server: server_pid.and_then(process_cpu) }
    }

    /// The figures, or none when a client was killed: a killed fio's job processes are
    /// never waited for by it, so their CPU escapes the count, and the window includes the
    /// time it hung.
    pub fn finish_unless(self, client_killed: bool) -> Option<CpuFigures> {
        (!client_killed).then(|| self.finish())
    }

    pub fn finish(self) -> CpuFigures {
        let server = match (self.server, self.server_pid.and_then(process_cpu)) {
            (Some(before), Some(after)) => Some((after - before).max(0.0)),
            _ => None,
        };
        CpuFigures { seconds: self.started.elapsed().as_secs_f64(), client: (children_cpu() - self.children).max(0.0), server }
    }
}

/// CPU seconds (user + system) from `getrusage(who)`; 0 if it fails.
fn rusage_cpu(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// CPU seconds of this process's children that have been waited for.
fn children_cpu() -> f64 {
    rusage_cpu(libc::RUSAGE_CHILDREN)
}

/// CPU seconds (user + system, all threads) of a running process.
pub fn process_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_the_client_it_waited_for_and_the_server_process() {
        let me = std::process::id();
        let own_before = rusage_cpu(libc::RUSAGE_SELF);
        let w = CpuWindow::start(Some(me));
        let thread_before = rusage_cpu(libc::RUSAGE_THREAD);
        // The "client": a child with a fixed amount of work (about 0.25 s of CPU here);
        // the "server": this process, busy for a while too.
        let status =
            std::process::Command::new("sh").args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]).status().expect("run sh");
        assert!(status.success());
        let mut x = 0u64;
        for i in 0..200_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let thread = rusage_cpu(libc::RUSAGE_THREAD) - thread_before;
        let f = w.finish();
        let own = rusage_cpu(libc::RUSAGE_SELF) - own_before;
        assert!(f.client > 0.05, "the waited-for child's CPU was not counted: {f:?}");
        // The window holds this thread's busy loop and lies within `own`, which other
        // tests' threads in this process add to as well. /proc counts in clock ticks:
        // allow a few either side.
        let server = f.server.expect("a server figure for a running process");
        assert!(server > thread - 0.05, "server {server} s, but this thread alone used {thread} s in the window: {f:?}");
        assert!(server < own + 0.05, "server {server} s, but this process used {own} s: {f:?}");
        assert!(f.server_cores().is_some_and(|c| c > 0.0) && f.client_cores() > 0.0);
    }

    #[test]
    fn no_server_figure_without_a_server_process() {
        assert!(process_cpu(u32::MAX).is_none());
        let f = CpuWindow::start(None).finish();
        assert_eq!(f.server, None);
        assert_eq!(f.server_cores(), None);
        assert!(CpuWindow::start(None).finish_unless(true).is_none(), "a figure for a client that was killed");
        assert!(CpuWindow::start(None).finish_unless(false).is_some());
    }
}
