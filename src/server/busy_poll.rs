//! Busy polling: after answering a client that calls in a tight loop (the next request
//! follows each reply within microseconds), spin briefly on its socket for that request
//! instead of going to sleep. Sleeping costs the wake-up of an idle CPU on every request
//! (tens of microseconds in a virtual machine or from a deep C-state), which is most of
//! the latency at iodepth 1; polling trades CPU time for it while such a client is active.
//!
//! Bounded: a connection polls only if its previous wait was short, for at most `window`,
//! at most one connection per two cores polls at any moment, and nobody polls while the
//! machine has no CPU to spare (`SpareCpu`): spinning is free only on a CPU that would
//! otherwise idle, and takes the CPU from whoever waits for it, clients on the same
//! machine included. Nobody polls either while helper threads have work (a listing's
//! look-ahead): they need that CPU, and a thread spinning on the CPU its client left
//! stays apart from it, the client then sharing its CPU with the helpers.

use crate::metrics::{PollDeclined, PollStats};
use std::fs::File;
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct BusyPoll {
    window: Duration,
    /// Longest poll through a running call ([`MAX_POLL_THROUGH_CALL`]; tests set it).
    through_call: Duration,
    /// What the polling did, for the metrics (and the tests: whether a call polled does
    /// not depend on a clock).
    stats: Arc<PollStats>,
    pollers: AtomicUsize,
    max_pollers: usize,
    cpu: SpareCpu,
    /// Whether helper threads have work: then nobody polls ([`crate::vfs::helpers_working`]).
    helpers_working: fn() -> bool,
}

/// A previous wait this much longer than the window means the client is not in a tight
/// loop: polling would only burn CPU.
const TIGHT_LOOP_FACTOR: u32 = 4;

impl BusyPoll {
    /// Polls for at most `window`, counting what it does into `stats`.
    pub fn new(window: Duration, stats: Arc<PollStats>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_gauge(window, SpareCpu::new(File::open("/proc/loadavg").ok(), cores), stats)
    }

    fn with_gauge(window: Duration, cpu: SpareCpu, stats: Arc<PollStats>) -> Self {
        Self {
            window,
            through_call: MAX_POLL_THROUGH_CALL,
            stats,
            pollers: AtomicUsize::new(0),
            max_pollers: (cpu.cores / 2).max(1),
            cpu,
            // Tests of the other rules must not see the helpers of tests running beside them.
            helpers_working: if cfg!(test) { || false } else { crate::vfs::helpers_working },
        }
    }

    /// Spins until `fd` has data to read (or reached end of stream), for at most the
    /// window, if the connection's previous wait (`last_wait`) was short and a CPU is to
    /// spare. Returns whether data arrived while polling.
    pub fn poll_readable(&self, fd: RawFd, last_wait: Option<Duration>) -> bool {
        self.poll_readable_after(fd, last_wait, || false)
    }

    /// As [`Self::poll_readable`], for a client whose call is still running (`running`
    /// says whether it is): its next request can only follow that call's reply, so the
    /// window starts once `running` turns false; polling through the call lasts at most
    /// [`MAX_POLL_THROUGH_CALL`]. Otherwise the thread would sleep through every call run
    /// on a blocking thread (a sync, typically), and the client's next request would have
    /// to wake it.
    pub fn poll_readable_after(&self, fd: RawFd, last_wait: Option<Duration>, running: impl Fn() -> bool) -> bool {
        if self.window.is_zero() {
            return false;
        }
        let declined = if (self.helpers_working)() {
            Some(PollDeclined::HelpersWorking)
        } else if last_wait.is_none_or(|w| w > self.window * TIGHT_LOOP_FACTOR) {
            Some(PollDeclined::ClientNotInTightLoop)
        } else if !self.cpu.has_spare() {
            Some(PollDeclined::NoSpareCpu)
        } else if self.pollers.fetch_add(1, Ordering::AcqRel) >= self.max_pollers {
            self.pollers.fetch_sub(1, Ordering::AcqRel);
            Some(PollDeclined::PollersBusy)
        } else {
            None
        };
        if let Some(why) = declined {
            self.stats.declined(why);
            return false;
        }
        let start = Instant::now();
        // When the window began: once no call of the client's runs.
        let mut window_start = None;
        // The call needs a CPU of its own: on one core, polling would take it from it.
        let through_call = if self.cpu.cores >= 2 { self.through_call } else { Duration::ZERO };
        let arrived = loop {
            if readable(fd) {
                break true;
            }
            let now = Instant::now();
            match window_start {
                None if running() && now - start < through_call => {}
                None => window_start = Some(now),
                Some(since) if now - since >= self.window => break false,
                Some(_) => {}
            }
            std::hint::spin_loop();
        };
        self.pollers.fetch_sub(1, Ordering::AcqRel);
        self.stats.spun(arrived, start.elapsed());
        arrived
    }

    #[cfg(test)]
    pub fn stats(&self) -> &PollStats {
        &self.stats
    }

    /// A poller that finds a CPU to spare on a machine of two cores, whatever the load
    /// (tests of the transport, whose outcome must not depend on other tests' threads).
    #[cfg(test)]
    pub fn always_spare(window: Duration, through_call: Duration) -> Self {
        let mut poll = Self::with_gauge(window, SpareCpu::new(None, 2), Arc::default());
        poll.through_call = through_call;
        poll
    }
}

/// Longest poll through a running call: a directory or file sync on a disk that flushes
/// in well under a millisecond. Longer calls let the thread sleep.
pub const MAX_POLL_THROUGH_CALL: Duration = Duration::from_millis(2);

/// Whether a read on `fd` would not block: data, end of stream or an error is waiting.
fn readable(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a local.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

/// How often the machine's runnable-thread count is sampled (at most).
const SAMPLE_EVERY: Duration = Duration::from_millis(1);
/// Fixed-point scale of `SpareCpu::busy_share`.
const SHARE_ONE: u32 = 1 << 16;
/// Each sample moves the average this fraction (1/2^n) of the way.
const SHARE_SHIFT: u32 = 4;
/// Polling stops once a quarter of the recent samples found every CPU wanted.
const BUSY_SHARE_LIMIT: u32 = SHARE_ONE / 4;

/// Whether the machine has a CPU to spare, from the number of runnable threads
/// (`/proc/loadavg`'s fourth field, which counts the sampling thread itself). A sample
/// with more runnable threads than cores means every CPU has other work waiting, so a
/// spinning thread would take a CPU from it. Sampled at most once per `SAMPLE_EVERY` by
/// whoever asks, and averaged, so brief bursts do not flip the answer. With two clients
/// on a two-core machine this found every CPU wanted in most samples, with one client
/// (whose polling it must keep) in a few.
struct SpareCpu {
    /// `None` where the count cannot be read: then a CPU is assumed to be spare.
    loadavg: Option<File>,
    cores: usize,
    epoch: Instant,
    /// Nanoseconds since `epoch` when the next sample is due.
    next_sample: AtomicU64,
    /// Recent share of samples that found every CPU wanted, in 1/`SHARE_ONE`.
    busy_share: AtomicU32,
}

impl SpareCpu {
    fn new(loadavg: Option<File>, cores: usize) -> Self {
        Self { loadavg, cores, epoch: Instant::now(), next_sample: AtomicU64::new(0), busy_share: AtomicU32::new(0) }
    }

    fn has_spare(&self) -> bool {
        if let Some(file) = &self.loadavg {
            let now = self.epoch.elapsed().as_nanos() as u64;
            let due = self.next_sample.load(Ordering::Relaxed);
            // One caller per interval samples; the others use the average as it stands.
            if now >= due
                && self
                    .next_sample
                    .compare_exchange(due, now + SAMPLE_EVERY.as_nanos() as u64, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                if let Some(runnable) = read_runnable(file) {
                    self.record(runnable);
                }
            }
        }
        self.busy_share.load(Ordering::Relaxed) < BUSY_SHARE_LIMIT
    }

    /// Folds one sample of the runnable-thread count into the average.
    fn record(&self, runnable: u32) {
        let busy = if runnable as usize > self.cores { SHARE_ONE } else { 0 };
        // Only the sampler of the interval writes, so a plain load and store suffice.
        let old = self.busy_share.load(Ordering::Relaxed);
        let new = old - (old >> SHARE_SHIFT) + (busy >> SHARE_SHIFT);
        self.busy_share.store(new, Ordering::Relaxed);
    }
}

/// The runnable-thread count from `/proc/loadavg` ("0.52 0.58 0.59 3/467 12345": the
/// fourth field's numerator).
fn read_runnable(file: &File) -> Option<u32> {
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

fn parse_runnable(loadavg: &str) -> Option<u32> {
    loadavg.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn nobody_polls_while_helpers_have_work() {
        let (mut client, server) = pair();
        let mut poll = BusyPoll::with_gauge(Duration::from_millis(20), SpareCpu::new(None, 1), Arc::default());
        poll.helpers_working = || true;
        let fd = server.as_raw_fd();
        // A tight loop with a spare CPU would poll, and data is there to be seen.
        client.write_all(b"x").unwrap();
        assert!(!poll.poll_readable(fd, Some(Duration::from_micros(10))));
        assert_eq!(poll.stats.spins(), 0);
        assert_eq!(poll.stats.declined_for(PollDeclined::HelpersWorking), 1);
        poll.helpers_working = || false;
        assert!(poll.poll_readable(fd, Some(Duration::from_micros(10))), "without helpers' work the same loop polls");
    }

    #[test]
    fn polls_only_tight_loops_and_sees_data() {
        let (mut client, server) = pair();
        // A gauge that always finds a spare CPU: other tests may keep this machine's
        // CPUs busy, and the rules tested here must not depend on that.
        let poll = BusyPoll::with_gauge(Duration::from_millis(20), SpareCpu::new(None, 1), Arc::default());
        let fd = server.as_raw_fd();
        // No history, or a long previous wait: no polling at all, however long data takes.
        assert!(!poll.poll_readable(fd, None));
        assert!(!poll.poll_readable(fd, Some(Duration::from_secs(1))));
        assert_eq!(poll.stats.spins(), 0, "polled a connection that is not in a tight loop");
        assert_eq!(poll.stats.declined_for(PollDeclined::ClientNotInTightLoop), 2);
        // A tight loop polls for the window when nothing comes...
        let t = Instant::now();
        assert!(!poll.poll_readable(fd, Some(Duration::from_micros(10))));
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!((poll.stats.spins(), poll.stats.caught()), (1, 0));
        let seconds = poll.stats.seconds();
        assert!((0.02..10.0).contains(&seconds), "a 20 ms spin counted as {seconds} s");
        // ...and returns as soon as the next request arrives (a window long enough that a
        // sender held up on a loaded machine still writes within it).
        let patient = BusyPoll::with_gauge(Duration::from_secs(30), SpareCpu::new(None, 1), Arc::default());
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            client.write_all(b"x").unwrap();
            client
        });
        assert!(patient.poll_readable(fd, Some(Duration::from_micros(10))));
        assert_eq!((patient.stats.spins(), patient.stats.caught()), (1, 1));
        drop(sender.join().unwrap());
        // End of stream counts as readable too, so the reader sees it at once.
        let (client, server) = pair();
        drop(client);
        assert!(poll.poll_readable(server.as_raw_fd(), Some(Duration::ZERO)));
        assert_eq!((poll.stats.spins(), poll.stats.caught()), (2, 1));
    }

    #[test]
    fn at_most_one_connection_in_two_cores_polls_at_once() {
        let (_client, server) = pair();
        let poll = Arc::new(BusyPoll::with_gauge(Duration::from_millis(300), SpareCpu::new(None, 2), Arc::default()));
        let fd = server.as_raw_fd();
        let first = std::thread::spawn({
            let poll = poll.clone();
            move || poll.poll_readable(fd, Some(Duration::ZERO))
        });
        while poll.pollers.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        assert!(!poll.poll_readable(fd, Some(Duration::ZERO)));
        assert_eq!(poll.stats.declined_for(PollDeclined::PollersBusy), 1);
        assert!(!first.join().unwrap());
        assert_eq!(poll.stats.spins(), 1);
    }

    #[test]
    fn polls_through_a_running_call_and_then_for_the_window() {
        let (mut client, server) = pair();
        let fd = server.as_raw_fd();
        let mut poll = BusyPoll::with_gauge(Duration::from_millis(20), SpareCpu::new(None, 2), Arc::default());
        poll.through_call = Duration::from_millis(200);
        // The call runs for 30 ms, longer than the window, and the request follows its
        // reply after 5 ms: caught, as the window starts when the call ends.
        let running_until = Instant::now() + Duration::from_millis(30);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(35));
            client.write_all(b"x").unwrap();
            client
        });
        let started = Instant::now();
        let arrived = poll.poll_readable_after(fd, Some(Duration::from_micros(10)), || Instant::now() < running_until);
        let client = sender.join().unwrap();
        // A sender held up by a loaded machine past the window lets the poll end first.
        assert!(arrived || started.elapsed() >= Duration::from_millis(50), "gave up after {:?}", started.elapsed());
        // Nothing arrives: the poll lasts the call and then the window.
        let mut byte = [0u8; 1];
        (&server).read_exact(&mut byte).unwrap();
        let running_until = Instant::now() + Duration::from_millis(30);
        let started = Instant::now();
        assert!(!poll.poll_readable_after(fd, Some(Duration::from_micros(10)), || Instant::now() < running_until));
        assert!(started.elapsed() >= Duration::from_millis(50), "stopped after {:?}", started.elapsed());
        // A call that goes on is polled through for `through_call`, then the window.
        let started = Instant::now();
        assert!(!poll.poll_readable_after(fd, Some(Duration::from_micros(10)), || true));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(220) && took < Duration::from_secs(10), "stopped after {took:?}");
        // A client that is not in a tight loop is not polled for, running call or not.
        assert!(!poll.poll_readable_after(fd, Some(Duration::from_secs(1)), || true));
        assert_eq!(poll.stats.spins(), 3);
        // On one core the call needs the CPU: only the window is polled.
        let mut single = BusyPoll::with_gauge(Duration::from_millis(20), SpareCpu::new(None, 1), Arc::default());
        single.through_call = Duration::from_secs(2);
        let started = Instant::now();
        assert!(!single.poll_readable_after(fd, Some(Duration::from_micros(10)), || true));
        assert!(started.elapsed() < Duration::from_secs(1), "polled through a call on one core for {:?}", started.elapsed());
        drop(client);
    }

    #[test]
    fn zero_window_never_polls() {
        let (_client, server) = pair();
        let poll = BusyPoll::new(Duration::ZERO, Arc::default());
        assert!(!poll.poll_readable(server.as_raw_fd(), Some(Duration::ZERO)));
    }

    #[test]
    fn runnable_count_is_the_fourth_fields_numerator() {
        assert_eq!(parse_runnable("0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(parse_runnable("0.00 0.00 0.00 12/80 1"), Some(12));
        assert_eq!(parse_runnable("0.52 0.58 0.59"), None);
        assert_eq!(parse_runnable("0.52 0.58 0.59 x/467 1"), None);
    }

    #[test]
    fn a_spare_cpu_is_one_no_recent_sample_found_wanted() {
        let cpu = SpareCpu::new(None, 2);
        assert!(cpu.has_spare(), "nothing sampled yet");
        // Runnable threads up to the core count (the sampler among them): room left.
        for _ in 0..100 {
            cpu.record(2);
        }
        assert!(cpu.has_spare());
        // One sample with every CPU wanted is a burst, not a busy machine...
        cpu.record(3);
        assert!(cpu.has_spare());
        // ...but a run of them is.
        let mut samples = 1;
        while cpu.has_spare() {
            cpu.record(3);
            samples += 1;
            assert!(samples <= 10, "still polling after {samples} samples with every CPU wanted");
        }
        // Once the other threads are gone, polling resumes within a few samples.
        let mut samples = 0;
        while !cpu.has_spare() {
            cpu.record(1);
            samples += 1;
            assert!(samples <= 40, "still not polling after {samples} idle samples");
        }
    }

    #[test]
    fn no_polling_while_other_threads_keep_every_cpu_busy() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..cores + 1)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let poll = BusyPoll::new(Duration::from_millis(20), Arc::default());
        assert!(poll.cpu.loadavg.is_some(), "/proc/loadavg is unreadable");
        // The gauge samples once a millisecond; give it time to see the spinners.
        let deadline = Instant::now() + Duration::from_secs(5);
        while poll.cpu.has_spare() && Instant::now() < deadline {
            std::thread::sleep(SAMPLE_EVERY);
        }
        let (_client, server) = pair();
        let arrived = poll.poll_readable(server.as_raw_fd(), Some(Duration::from_micros(10)));
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        assert!(!arrived);
        assert_eq!(poll.stats.spins(), 0, "polled with {} spinning threads on {cores} cores", cores + 1);
        assert_eq!(poll.stats.declined_for(PollDeclined::NoSpareCpu), 1);
    }
}
