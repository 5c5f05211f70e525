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
//! non-idempotent calls that already ran. A client that is slow but moving is not stalled:
//! before closing, the kernel's counts for the socket are asked whether the client
//! acknowledged enough reply bytes since the stall began, or sent enough of its request
//! since the last look (a slow reader may free too little of the send buffer for the
//! server to send again, and a slow sender's request takes long to arrive whole); enough
//! is [`MIN_PROGRESS_PER_SEC`] per second of the timeout, so a byte now and then is not.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::Semaphore;

/// How often callers waiting for a slot look for stalled connections (all of them
/// together: one looks, the others wait).
pub const PRESSURE_CHECK: Duration = Duration::from_millis(500);

/// Closings at the connection limit, which any peer can cause, logged once a minute.
static EVICTIONS: crate::throttle::Throttle = crate::throttle::Throttle::new(60);

/// What the watch needs of a connection.
pub trait Watched: Send + Sync {
    /// The kernel's counts for its socket, if it can tell.
    fn tcp_counts(&self) -> Option<TcpCounts>;
    /// Ends the connection at once, from any thread.
    fn abort(&self);
}

/// From the kernel's `TCP_INFO` for a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpCounts {
    /// Bytes sent that the peer acknowledged (it took them into its receive buffer).
    pub bytes_acked: u64,
    /// Bytes received from the peer.
    pub bytes_received: u64,
    /// Milliseconds since data last arrived from the peer.
    pub ms_since_data_received: u32,
}

/// What a connection holding slots must move, in one direction, per second of the stall
/// timeout while others wait, to count as slow rather than stalled: a peer that trickles
/// a byte every few seconds into a request (or takes a byte of its replies) would
/// otherwise keep its slots for the whole write timeout. About 130 kbit/s.
const MIN_PROGRESS_PER_SEC: u64 = 16 * 1024;

fn min_progress(timeout: Duration) -> u64 {
    MIN_PROGRESS_PER_SEC * timeout.as_secs().max(1)
}

/// `TCP_INFO` of a TCP socket: the fields at their offsets in `struct tcp_info` (stable
/// kernel ABI; `bytes_acked` since Linux 4.1).
pub fn tcp_counts(fd: RawFd) -> Option<TcpCounts> {
    const LAST_DATA_RECV: usize = 52;
    const BYTES_ACKED: usize = 120;
    const BYTES_RECEIVED: usize = 128;
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live local buffer.
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len) };
    if rc != 0 || (len as usize) < BYTES_RECEIVED + 8 {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_ne_bytes(info[o..o + 8].try_into().expect("8 bytes"));
    Some(TcpCounts {
        bytes_acked: u64_at(BYTES_ACKED),
        bytes_received: u64_at(BYTES_RECEIVED),
        ms_since_data_received: u32_at(LAST_DATA_RECV),
    })
}

/// The live connections and how long each has been stalled.
pub struct Stalls {
    conns: Mutex<HashMap<u64, Arc<Progress>>>,
    next_id: AtomicU64,
    /// `None`: never close (a `stall_timeout_secs` of 0).
    timeout: Option<Duration>,
    /// When a waiting caller last looked ([`stamp`]).
    last_look: AtomicU64,
}

/// One connection's stalls, as stamps of when each began ([`stamp`]; 0: not stalled).
pub struct Progress {
    peer: SocketAddr,
    /// Since when replies have waited for a client that has taken none of their bytes.
    write_stalled: AtomicU64,
    /// The client's acknowledged bytes when that stall began (`u64::MAX`: unknown).
    acked_at_stall: AtomicU64,
    /// Since when the request now arriving has been arriving.
    request_arriving: AtomicU64,
    /// The bytes received from the client when a look found that request arriving for the
    /// timeout (`u64::MAX`: no look yet): the next look measures its progress from there.
    received_at_look: AtomicU64,
    /// When the connection opened or its last request began to arrive: the idle one used
    /// least recently makes room when the connection limit is reached.
    last_request: AtomicU64,
    /// The connection's request slots and how many it has: each call holds one from
    /// before it is read until its reply is sent, and the reader one while it waits.
    slots: OnceLock<(Arc<Semaphore>, usize)>,
    /// The reader holds one of those slots, waiting for the next request.
    reader_holds_slot: AtomicBool,
    /// Closed by the watch already: not again.
    closing: AtomicBool,
    conn: OnceLock<Weak<dyn Watched>>,
}

/// A connection's place among the live ones; leaving it (dropping) removes it.
pub struct Registration<'a> {
    stalls: &'a Stalls,
    id: u64,
    progress: Arc<Progress>,
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

impl Stalls {
    /// `timeout`: how long a connection may stall while others wait; zero: forever.
    pub fn new(timeout: Duration) -> Self {
        Self {
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            timeout: (!timeout.is_zero()).then_some(timeout),
            last_look: AtomicU64::new(0),
        }
    }

    /// Adds a connection, to be watched once [`Registration::watch`] says how.
    pub fn register(&self, peer: SocketAddr) -> Registration<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let progress = Arc::new(Progress {
            peer,
            write_stalled: AtomicU64::new(0),
            acked_at_stall: AtomicU64::new(u64::MAX),
            request_arriving: AtomicU64::new(0),
            received_at_look: AtomicU64::new(u64::MAX),
            last_request: AtomicU64::new(stamp()),
            slots: OnceLock::new(),
            reader_holds_slot: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            conn: OnceLock::new(),
        });
        self.conns.lock().insert(id, progress.clone());
        Registration { stalls: self, id, progress }
    }

    /// Called by a caller that has waited for a slot: closes every connection other than
    /// `except` (the caller's own) stalled for the timeout or longer, unless another
    /// caller looked less than [`PRESSURE_CHECK`] ago. Returns how many it closed.
    pub fn close_stalled(&self, except: Option<u64>) -> usize {
        let now = stamp();
        let last = self.last_look.load(Ordering::Relaxed);
        if now.saturating_sub(last) < PRESSURE_CHECK.as_nanos() as u64
            || self.last_look.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return 0;
        }
        self.close_stalled_at(now, except)
    }

    /// At the connection limit: closes the idle connection (no call running, no reply
    /// waiting) whose last request is the oldest, or that never sent one, as knfsd does,
    /// so that connections opened and left idle cannot keep every client out until the
    /// idle timeout. Its client, if it is one, reconnects when it next has a call; nothing
    /// it waits for is lost. Returns whether one was closed.
    pub fn close_least_recently_used(&self) -> bool {
        let mut idle: Vec<Arc<Progress>> =
            self.conns.lock().values().filter(|p| !p.closing.load(Ordering::Relaxed) && p.is_idle()).cloned().collect();
        idle.sort_by_key(|p| p.last_request.load(Ordering::Relaxed));
        for p in idle {
            let Some(conn) = p.conn.get().and_then(Weak::upgrade) else { continue };
            if p.closing.swap(true, Ordering::Relaxed) {
                continue;
            }
            if let Some(held_back) = EVICTIONS.allow() {
                tracing::warn!(client = %p.peer, held_back, "connection limit reached: closing the idle connection used least recently");
            }
            conn.abort();
            return true;
        }
        false
    }

    fn close_stalled_at(&self, now: u64, except: Option<u64>) -> usize {
        let Some(timeout) = self.timeout else { return 0 };
        let limit = timeout.as_nanos() as u64;
        let min_progress = min_progress(timeout);
        let aged = |stamp: &AtomicU64| {
            let since = stamp.load(Ordering::Relaxed);
            since != 0 && now.saturating_sub(since) >= limit
        };
        let candidates: Vec<Arc<Progress>> = self
            .conns
            .lock()
            .iter()
            .filter(|(id, p)| Some(**id) != except && !p.closing.load(Ordering::Relaxed))
            .filter(|(_, p)| aged(&p.write_stalled) || aged(&p.request_arriving))
            .map(|(_, p)| p.clone())
            .collect();
        // Outside the lock: asking the kernel and closing take time and locks of their own.
        let mut closed = 0;
        for p in candidates {
            let Some(conn) = p.conn.get().and_then(Weak::upgrade) else { continue };
            let counts = conn.tcp_counts();
            let mut why = None;
            if aged(&p.write_stalled) {
                match counts {
                    // The client took enough reply bytes since: slow, not stalled; a new
                    // stall would start from here.
                    Some(c) if c.bytes_acked.saturating_sub(p.acked_at_stall.load(Ordering::Relaxed)) >= min_progress => {
                        p.acked_at_stall.store(c.bytes_acked, Ordering::Relaxed);
                        p.write_stalled.store(now, Ordering::Relaxed);
                    }
                    _ => why = Some("it stopped reading its replies, or reads them a few bytes at a time"),
                }
            }
            if aged(&p.request_arriving) {
                let base = p.received_at_look.load(Ordering::Relaxed);
                match counts {
                    // Data came within the timeout, and this is the first look at the
                    // request or it moved enough since the last: measure again from here.
                    // (The count is not taken as each request starts: that would cost
                    // every request a system call.)
                    Some(c)
                        if (c.ms_since_data_received as u128) < timeout.as_millis()
                            && (base == u64::MAX || c.bytes_received.saturating_sub(base) >= min_progress) =>
                    {
                        p.received_at_look.store(c.bytes_received, Ordering::Relaxed);
                        p.request_arriving.store(now, Ordering::Relaxed);
                    }
                    _ => why = why.or(Some("its request stopped arriving, or arrives a few bytes at a time")),
                }
            }
            let Some(why) = why else { continue };
            if p.closing.swap(true, Ordering::Relaxed) {
                continue;
            }
            tracing::warn!(client = %p.peer, stalled = why, "closing a stalled connection: it holds request slots others are waiting for");
            conn.abort();
            closed += 1;
        }
        closed
    }
}

impl Registration<'_> {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the connection reports its progress to (shared with its writer).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// The connection to ask and to close when it is found stalled.
    pub fn watch(&self, conn: Weak<dyn Watched>) {
        let _ = self.progress.conn.set(conn);
    }
}

impl Progress {
    /// The connection's request slots, `count` of them, for telling whether it is idle.
    pub fn count_slots(&self, slots: Arc<Semaphore>, count: usize) {
        let _ = self.slots.set((slots, count));
    }

    /// Whether the reader holds a slot (waiting for the next request) or has handed it
    /// to a call, or waits for one to be free.
    pub fn reader_holds_slot(&self, holds: bool) {
        self.reader_holds_slot.store(holds, Ordering::Relaxed);
    }

    /// No call running and no reply waiting: every slot free but the one its reader may
    /// hold while it waits for the next request. (Counted, not assumed: with one slot per
    /// connection, a call running holds the only one.)
    fn is_idle(&self) -> bool {
        let reader = usize::from(self.reader_holds_slot.load(Ordering::Relaxed));
        self.slots.get().is_some_and(|(slots, count)| slots.available_permits() + reader >= *count)
    }

    /// A request has begun to arrive (it now holds a slot).
    pub fn request_arriving(&self) {
        let now = stamp();
        self.request_arriving.store(now, Ordering::Relaxed);
        self.last_request.store(now, Ordering::Relaxed);
        if self.received_at_look.load(Ordering::Relaxed) != u64::MAX {
            self.received_at_look.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// The request has arrived whole.
    pub fn request_arrived(&self) {
        self.request_arriving.store(0, Ordering::Relaxed);
    }

    /// The socket is full with replies waiting: a stall starts now unless one started
    /// earlier, and `acked` (asked only then) gives the client's acknowledged bytes.
    pub fn write_blocked(&self, acked: impl FnOnce() -> Option<u64>) {
        if self.write_stalled.load(Ordering::Relaxed) == 0 {
            self.acked_at_stall.store(acked().unwrap_or(u64::MAX), Ordering::Relaxed);
            self.write_stalled.store(stamp(), Ordering::Relaxed);
        }
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
    use parking_lot::Mutex as PMutex;
    use std::sync::atomic::AtomicUsize;

    /// A connection whose kernel counts the test sets.
    #[derive(Default)]
    struct FakeConn {
        counts: PMutex<Option<TcpCounts>>,
        aborted: AtomicUsize,
    }

    impl Watched for FakeConn {
        fn tcp_counts(&self) -> Option<TcpCounts> {
            *self.counts.lock()
        }
        fn abort(&self) {
            self.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counts(bytes_acked: u64, ms_since_data_received: u32) -> Option<TcpCounts> {
        Some(TcpCounts { bytes_acked, bytes_received: 0, ms_since_data_received })
    }

    fn received(bytes_received: u64, ms_since_data_received: u32) -> Option<TcpCounts> {
        Some(TcpCounts { bytes_acked: 0, bytes_received, ms_since_data_received })
    }

    const SEC: u64 = 1_000_000_000;

    fn watched<'a>(stalls: &'a Stalls, conn: &Arc<FakeConn>) -> Registration<'a> {
        let r = stalls.register("127.0.0.1:700".parse().unwrap());
        let weak: Weak<dyn Watched> = Arc::downgrade(conn) as Weak<dyn Watched>;
        r.watch(weak);
        r
    }

    #[test]
    fn only_connections_stalled_for_the_timeout_are_closed_and_only_once() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let conns: Vec<Arc<FakeConn>> = (0..4).map(|_| Arc::new(FakeConn::default())).collect();
        for c in &conns {
            *c.counts.lock() = counts(1000, 60_000);
        }
        let regs: Vec<Registration<'_>> = conns.iter().map(|c| watched(&stalls, c)).collect();
        let (busy, not_reading, not_sending, waiter) = (&regs[0], &regs[1], &regs[2], &regs[3]);
        // Stalls that began at 1 s: the socket full (1000 bytes acknowledged then), a
        // request half arrived.
        not_reading.progress.write_blocked(|| Some(1000));
        not_reading.progress.write_stalled.store(SEC, Ordering::Relaxed);
        not_sending.progress.request_arriving.store(SEC, Ordering::Relaxed);
        waiter.progress.write_stalled.store(SEC, Ordering::Relaxed);
        // At 5.9 s none has lasted 5 s.
        assert_eq!(stalls.close_stalled_at(5 * SEC + SEC * 9 / 10, Some(waiter.id())), 0);
        // At 6 s both have, except the caller's own; the busy one never stalled.
        assert_eq!(stalls.close_stalled_at(6 * SEC, Some(waiter.id())), 2);
        let aborted: Vec<usize> = conns.iter().map(|c| c.aborted.load(Ordering::SeqCst)).collect();
        assert_eq!(aborted, [0, 1, 1, 0]);
        // Until their tasks end they stay registered, but are not closed again.
        assert_eq!(stalls.close_stalled_at(60 * SEC, Some(waiter.id())), 0);
        assert!(busy.progress.write_stalled.load(Ordering::Relaxed) == 0);
    }

    #[test]
    fn the_idle_connection_used_least_recently_makes_room_once() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let conns: Vec<Arc<FakeConn>> = (0..3).map(|_| Arc::new(FakeConn::default())).collect();
        let regs: Vec<Registration<'_>> = conns.iter().map(|c| watched(&stalls, c)).collect();
        for (reg, at) in regs.iter().zip([3 * SEC, SEC, 2 * SEC]) {
            reg.progress.last_request.store(at, Ordering::Relaxed);
            reg.progress.count_slots(Arc::new(Semaphore::new(8)), 8);
        }
        // The oldest is busy (a call running): passed over while it is.
        let busy = Arc::new(Semaphore::new(8));
        let running = busy.clone().try_acquire_many_owned(2).unwrap();
        let busy_conn = Arc::new(FakeConn::default());
        let busy_reg = watched(&stalls, &busy_conn);
        busy_reg.progress.last_request.store(0, Ordering::Relaxed);
        busy_reg.progress.count_slots(busy, 8);
        let aborted = || conns.iter().map(|c| c.aborted.load(Ordering::SeqCst)).collect::<Vec<_>>();
        assert!(stalls.close_least_recently_used());
        assert_eq!(aborted(), [0, 1, 0]);
        // Closing, not yet gone: the next oldest goes next.
        assert!(stalls.close_least_recently_used());
        assert_eq!(aborted(), [0, 1, 1]);
        assert!(stalls.close_least_recently_used());
        assert!(!stalls.close_least_recently_used(), "nothing idle left to close");
        assert_eq!(aborted(), [1, 1, 1]);
        drop(running);
        assert!(stalls.close_least_recently_used(), "idle once its call is answered");
        assert_eq!(busy_conn.aborted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn with_one_slot_per_connection_a_call_running_is_not_idle() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let conn = Arc::new(FakeConn::default());
        let reg = watched(&stalls, &conn);
        let slots = Arc::new(Semaphore::new(1));
        reg.progress.count_slots(slots.clone(), 1);
        // The reader took the only slot to wait for a request: idle.
        let slot = slots.clone().try_acquire_owned().unwrap();
        reg.progress.reader_holds_slot(true);
        assert!(reg.progress.is_idle());
        // It handed the slot to a call: busy until the call is answered.
        reg.progress.reader_holds_slot(false);
        assert!(!reg.progress.is_idle(), "a call running on the only slot counted as idle");
        assert!(!stalls.close_least_recently_used());
        drop(slot);
        assert!(reg.progress.is_idle());
        assert!(stalls.close_least_recently_used());
        assert_eq!(conn.aborted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_slow_client_is_not_stalled() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let reader = Arc::new(FakeConn::default());
        let sender = Arc::new(FakeConn::default());
        let slow_reader = watched(&stalls, &reader);
        let slow_sender = watched(&stalls, &sender);
        slow_reader.progress.write_blocked(|| Some(1000));
        slow_reader.progress.write_stalled.store(SEC, Ordering::Relaxed);
        slow_sender.progress.request_arriving.store(SEC, Ordering::Relaxed);
        const MIN_PROGRESS: u64 = 5 * MIN_PROGRESS_PER_SEC;
        // The reader acknowledged enough since its stall began (without freeing enough of
        // the send buffer for another send); the sender's last data came 1 s ago.
        *reader.counts.lock() = counts(1000 + MIN_PROGRESS, 60_000);
        *sender.counts.lock() = received(1_000_000, 1000);
        assert_eq!(stalls.close_stalled_at(10 * SEC, None), 0);
        // Each stall starts over from that look: both move as much again...
        *reader.counts.lock() = counts(1000 + 2 * MIN_PROGRESS, 60_000);
        *sender.counts.lock() = received(1_000_000 + MIN_PROGRESS, 1000);
        assert_eq!(stalls.close_stalled_at(15 * SEC, None), 0);
        // ...then five more seconds without progress...
        *sender.counts.lock() = received(1_000_000 + MIN_PROGRESS, 6000);
        assert_eq!(stalls.close_stalled_at(19 * SEC, None), 0);
        // ...and then they are stalled.
        assert_eq!(stalls.close_stalled_at(20 * SEC, None), 2);
        assert_eq!(reader.aborted.load(Ordering::SeqCst) + sender.aborted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_client_that_trickles_is_stalled() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let reader = Arc::new(FakeConn::default());
        let sender = Arc::new(FakeConn::default());
        let trickle_reader = watched(&stalls, &reader);
        let trickle_sender = watched(&stalls, &sender);
        trickle_reader.progress.write_blocked(|| Some(1000));
        trickle_reader.progress.write_stalled.store(SEC, Ordering::Relaxed);
        trickle_sender.progress.request_arriving.store(SEC, Ordering::Relaxed);
        // A byte taken, a byte sent within the last second, again and again.
        *reader.counts.lock() = counts(1001, 60_000);
        *sender.counts.lock() = received(500, 900);
        // The reader moved less than it must: closed. The sender's first look sets where
        // its progress is measured from...
        assert_eq!(stalls.close_stalled_at(6 * SEC, None), 1);
        assert_eq!(reader.aborted.load(Ordering::SeqCst), 1);
        *sender.counts.lock() = received(510, 900);
        assert_eq!(stalls.close_stalled_at(10 * SEC, None), 0);
        // ...and five seconds later ten bytes are not progress.
        assert_eq!(stalls.close_stalled_at(11 * SEC, None), 1);
        assert_eq!(sender.aborted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn progress_ends_a_stall_and_a_new_one_starts_from_then() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let conn = Arc::new(FakeConn::default());
        let reg = watched(&stalls, &conn);
        let progress = reg.progress();
        progress.write_blocked(|| None);
        let first = progress.write_stalled.load(Ordering::Relaxed);
        assert_ne!(first, 0);
        // Blocked again without progress: the stall still dates from the first time.
        progress.write_blocked(|| panic!("asked again"));
        assert_eq!(progress.write_stalled.load(Ordering::Relaxed), first);
        // The client read something: no longer stalled, however long ago it began.
        progress.wrote();
        assert_eq!(stalls.close_stalled_at(first + 60 * SEC, None), 0);
        progress.request_arriving();
        progress.request_arrived();
        assert_eq!(stalls.close_stalled_at(first + 120 * SEC, None), 0);
        // Without the kernel's counts, a request arriving for a minute is stalled.
        progress.request_arriving();
        assert_eq!(stalls.close_stalled_at(first + 60 * SEC, None), 1);
        assert_eq!(conn.aborted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_closed_connection_leaves_the_registry_and_zero_disables() {
        let stalls = Stalls::new(Duration::from_secs(5));
        let conn = Arc::new(FakeConn::default());
        let reg = watched(&stalls, &conn);
        reg.progress.request_arriving.store(SEC, Ordering::Relaxed);
        drop(reg);
        assert_eq!(stalls.close_stalled_at(60 * SEC, None), 0);
        assert!(stalls.conns.lock().is_empty());

        let never = Stalls::new(Duration::ZERO);
        let reg = watched(&never, &conn);
        reg.progress.request_arriving.store(SEC, Ordering::Relaxed);
        assert_eq!(never.close_stalled_at(3600 * SEC, None), 0);
        assert_eq!(conn.aborted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_kernel_counts_a_socket_s_bytes() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.write_all(&[7u8; 5000]).unwrap();
        let mut got = [0u8; 5000];
        client.read_exact(&mut got).unwrap();
        client.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        server.read_exact(&mut one).unwrap();
        let c = tcp_counts(server.as_raw_fd()).expect("TCP_INFO");
        assert_eq!(c.bytes_acked, 5000);
        assert!(c.ms_since_data_received < 5000, "{c:?}");
        assert_eq!(tcp_counts(-1), None);
    }
}
