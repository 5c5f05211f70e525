//! Connections that hold request slots without making progress, closed when others wait.
//!
//! The global request slots bound memory, so they are shared by every client. Two kinds
//! of connection keep slots without using them: one whose client stopped reading (each
//! reply queued for it holds its request's slot), and one whose request began to arrive
//! and then stopped (the request holds a slot while it arrives). The write timeout closes
//! both, but only after `write_timeout_secs`; until then a handful of such connections can
//! hold every slot and stop the server for everyone.
//!
//! So while some caller waits for a slot, every connection that has been stalled for
//! `stall_timeout_secs` is closed. Nothing is lost: its client could not use what it held,
//! and on reconnecting it retransmits, and the duplicate request cache answers the
//! non-idempotent calls that already ran. A connection that makes progress, however slowly
//! its client reads, is never stalled for long: any byte sent or received ends the stall.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How often a caller waiting for a slot looks for stalled connections.
pub const PRESSURE_CHECK: Duration = Duration::from_millis(500);

/// The live connections and how long each has been stalled.
pub struct Stalls {
    conns: Mutex<HashMap<u64, Arc<Progress>>>,
    next_id: AtomicU64,
    timeout: Duration,
}

/// One connection's stalls, as stamps of when each began ([`stamp`]; 0: not stalled).
pub struct Progress {
    peer: SocketAddr,
    /// Since when replies have waited for a client that has taken none of their bytes.
    write_stalled: AtomicU64,
    /// Since when the request now arriving has been arriving.
    request_arriving: AtomicU64,
    /// Ends the connection, from any thread (set once it can be).
    close: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// A connection's place among the live ones; leaving it (dropping) removes it.
pub struct Registration<'a> {
    stalls: &'a Stalls,
    id: u64,
    progress: Arc<Progress>,
}

impl Stalls {
    pub fn new(timeout: Duration) -> Self {
        Self { conns: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), timeout }
    }

    /// Adds a connection, to be closed through [`Registration::close_with`].
    pub fn register(&self, peer: SocketAddr) -> Registration<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let progress = Arc::new(Progress {
            peer,
            write_stalled: AtomicU64::new(0),
            request_arriving: AtomicU64::new(0),
            close: OnceLock::new(),
        });
        self.conns.lock().insert(id, progress.clone());
        Registration { stalls: self, id, progress }
    }

    /// Closes every connection other than `except` (the caller's own) stalled for the
    /// timeout or longer; returns how many.
    pub fn close_stalled(&self, except: Option<u64>) -> usize {
        self.close_stalled_at(stamp(), except)
    }

    fn close_stalled_at(&self, now: u64, except: Option<u64>) -> usize {
        let limit = self.timeout.as_nanos() as u64;
        let stalled_since = |stamp: &AtomicU64| {
            let since = stamp.load(Ordering::Relaxed);
            since != 0 && now.saturating_sub(since) >= limit
        };
        let stalled: Vec<Arc<Progress>> = self
            .conns
            .lock()
            .iter()
            .filter(|(id, _)| Some(**id) != except)
            .filter(|(_, p)| stalled_since(&p.write_stalled) || stalled_since(&p.request_arriving))
            .map(|(_, p)| p.clone())
            .collect();
        // Closed outside the lock: closing may take locks of its own.
        for p in &stalled {
            let arriving = p.write_stalled.load(Ordering::Relaxed) == 0;
            tracing::warn!(
                client = %p.peer,
                stalled = if arriving { "its request stopped arriving" } else { "it stopped reading its replies" },
                "closing a stalled connection: it holds request slots others are waiting for"
            );
            if let Some(close) = p.close.get() {
                close();
            }
        }
        stalled.len()
    }
}

/// Now, in nanoseconds of the monotonic clock, never 0 (which means "not stalled"). The
/// coarse clock (milliseconds of resolution, against seconds of timeout): every request
/// takes a stamp, and this costs a fraction of a precise clock read.
fn stamp() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64).max(1)
}

impl Registration<'_> {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the connection reports its progress to (shared with its writer).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// How to end the connection when it is found stalled.
    pub fn close_with(&self, close: impl Fn() + Send + Sync + 'static) {
        let _ = self.progress.close.set(Box::new(close));
    }
}

impl Progress {
    /// A request has begun to arrive (it now holds a slot).
    pub fn request_arriving(&self) {
        self.request_arriving.store(stamp(), Ordering::Relaxed);
    }

    /// The request has arrived whole.
    pub fn request_arrived(&self) {
        self.request_arriving.store(0, Ordering::Relaxed);
    }

    /// The socket is full with replies waiting: the stall starts now unless it started
    /// earlier.
    pub fn write_blocked(&self) {
        let _ = self.write_stalled.compare_exchange(0, stamp(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The client took some of the replies' bytes.
    pub fn wrote(&self) {
        if self.write_stalled.load(Ordering::Relaxed) != 0 {
            self.write_stalled.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.stalls.conns.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn counter() -> (Arc<AtomicUsize>, impl Fn() + Send + Sync + 'static) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (n, move || {
            m.fetch_add(1, Ordering::SeqCst);
        })
    }

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn only_connections_stalled_for_the_timeout_are_closed() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let peer: SocketAddr = "127.0.0.1:700".parse().unwrap();
        let (busy_closed, busy_close) = counter();
        let (reader_closed, reader_close) = counter();
        let (sender_closed, sender_close) = counter();
        let (waiter_closed, waiter_close) = counter();
        let registered = |close| {
            let r = stalls.register(peer);
            r.close_with(close);
            r
        };
        let busy = registered(Box::new(busy_close) as Box<dyn Fn() + Send + Sync>);
        let not_reading = registered(Box::new(reader_close));
        let not_sending = registered(Box::new(sender_close));
        let waiter = registered(Box::new(waiter_close));

        // Stalls that began at 1 s: the socket full, a request half arrived.
        not_reading.progress.write_stalled.store(SEC, Ordering::Relaxed);
        not_sending.progress.request_arriving.store(SEC, Ordering::Relaxed);
        waiter.progress.write_stalled.store(SEC, Ordering::Relaxed);
        // At 5.9 s none has lasted 5 s.
        assert_eq!(stalls.close_stalled_at(5 * SEC + SEC * 9 / 10, Some(waiter.id())), 0);
        // At 6 s both have, except the caller's own; the busy one never stalled.
        assert_eq!(stalls.close_stalled_at(6 * SEC, Some(waiter.id())), 2);
        assert_eq!(reader_closed.load(Ordering::SeqCst), 1);
        assert_eq!(sender_closed.load(Ordering::SeqCst), 1);
        assert_eq!(busy_closed.load(Ordering::SeqCst), 0);
        assert_eq!(waiter_closed.load(Ordering::SeqCst), 0);
        drop(busy);
    }

    #[test]
    fn progress_ends_a_stall_and_a_new_one_starts_from_then() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let (closed, close) = counter();
        let conn = stalls.register("127.0.0.1:700".parse().unwrap());
        conn.close_with(close);
        let progress = conn.progress();
        progress.write_blocked();
        let first = progress.write_stalled.load(Ordering::Relaxed);
        assert_ne!(first, 0);
        // Blocked again without progress: the stall still dates from the first time.
        progress.write_blocked();
        assert_eq!(progress.write_stalled.load(Ordering::Relaxed), first);
        // The client read something: no longer stalled, however long ago it began.
        progress.wrote();
        assert_eq!(stalls.close_stalled_at(first + 60 * SEC, None), 0);
        progress.request_arriving();
        assert_eq!(stalls.close_stalled_at(first + 60 * SEC, None), 1, "a request arriving for a minute is stalled");
        progress.request_arrived();
        assert_eq!(stalls.close_stalled_at(first + 120 * SEC, None), 0);
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_closed_connection_leaves_the_registry() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let (closed, close) = counter();
        let conn = stalls.register("127.0.0.1:700".parse().unwrap());
        conn.close_with(close);
        conn.progress.request_arriving.store(SEC, Ordering::Relaxed);
        drop(conn);
        assert_eq!(stalls.close_stalled_at(60 * SEC, None), 0);
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        assert!(stalls.conns.lock().is_empty());
    }
}
