//! Busy polling: after answering a client that calls in a tight loop (the next request
//! follows each reply within microseconds), spin briefly on its socket for that request
//! instead of going to sleep. Sleeping costs the wake-up of an idle CPU on every request
//! (tens of microseconds in a virtual machine or from a deep C-state), which is most of
//! the latency at iodepth 1; polling trades CPU time for it while such a client is active.
//!
//! Bounded: a connection polls only if its previous wait was short, for at most `window`,
//! and at most one connection per two cores polls at any moment.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct BusyPoll {
    window: Duration,
    pollers: AtomicUsize,
    max_pollers: usize,
}

/// A previous wait this much longer than the window means the client is not in a tight
/// loop: polling would only burn CPU.
const TIGHT_LOOP_FACTOR: u32 = 4;

impl BusyPoll {
    pub fn new(window: Duration) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self { window, pollers: AtomicUsize::new(0), max_pollers: (cores / 2).max(1) }
    }

    /// Spins until `fd` has data to read (or reached end of stream), for at most the
    /// window, if the connection's previous wait (`last_wait`) was short. Returns whether
    /// data arrived while polling.
    pub fn poll_readable(&self, fd: RawFd, last_wait: Option<Duration>) -> bool {
        let tight = last_wait.is_some_and(|w| w <= self.window * TIGHT_LOOP_FACTOR);
        if self.window.is_zero() || !tight {
            return false;
        }
        if self.pollers.fetch_add(1, Ordering::AcqRel) >= self.max_pollers {
            self.pollers.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        let start = Instant::now();
        let arrived = loop {
            if readable(fd) {
                break true;
            }
            if start.elapsed() >= self.window {
                break false;
            }
            std::hint::spin_loop();
        };
        self.pollers.fetch_sub(1, Ordering::AcqRel);
        arrived
    }
}

/// Whether a read on `fd` would not block: data, end of stream or an error is waiting.
fn readable(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a local.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn polls_only_tight_loops_and_sees_data() {
        let (mut client, server) = pair();
        let poll = BusyPoll::new(Duration::from_millis(20));
        let fd = server.as_raw_fd();
        // No history, or a long previous wait: no polling at all, however long data takes.
        assert!(!poll.poll_readable(fd, None));
        let t = Instant::now();
        assert!(!poll.poll_readable(fd, Some(Duration::from_secs(1))));
        assert!(t.elapsed() < Duration::from_millis(10), "polled a connection that is not in a tight loop");
        // A tight loop polls for the window when nothing comes...
        let t = Instant::now();
        assert!(!poll.poll_readable(fd, Some(Duration::from_micros(10))));
        assert!(t.elapsed() >= Duration::from_millis(20));
        // ...and returns as soon as the next request arrives.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            client.write_all(b"x").unwrap();
            client
        });
        assert!(poll.poll_readable(fd, Some(Duration::from_micros(10))));
        drop(sender.join().unwrap());
        // End of stream counts as readable too, so the reader sees it at once.
        let (client, server) = pair();
        drop(client);
        assert!(poll.poll_readable(server.as_raw_fd(), Some(Duration::ZERO)));
    }

    #[test]
    fn zero_window_never_polls() {
        let (_client, server) = pair();
        let poll = BusyPoll::new(Duration::ZERO);
        assert!(!poll.poll_readable(server.as_raw_fd(), Some(Duration::ZERO)));
    }
}
