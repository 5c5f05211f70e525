//! RPC over TCP.
//!
//! Per connection, one task reads records and runs every call that can finish without
//! waiting for the disk right there (READ from the page cache, UNSTABLE WRITE, GETATTR,
//! LOOKUP, ...), collecting their replies; it sends them together, in one `writev`, when
//! it would otherwise wait (no more requests at hand, no free request slot) or the batch
//! grows large. Under pipelined load that is one send per batch instead of one per reply,
//! and no thread hand-off at all. Calls that may wait (stable writes, COMMIT, namespace
//! changes, reads of uncached data) run on worker threads, which queue their replies for
//! the same connection.
//!
//! Whoever queues replies while nobody is sending becomes the sender and writes everything
//! queued, so concurrent replies leave in batches too; when the socket is full, the
//! connection's writer task takes over, waits for the client to read, and gives up on a
//! client that stops reading.
//!
//! While the rest of a large record (a 1 MiB WRITE) is arriving, the connection waits for
//! all of it at once (`RecordStream`, a raised `SO_RCVLOWAT`) instead of waking for every
//! segment.

use super::stalls::{self, Progress, TcpCounts, Watched};
use super::Shared;
use crate::rpc::dispatch::Handled;
use crate::rpc::record::{read_record, RecordSource};
use crate::rpc::{Reply, Transport};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Interest, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Replies of calls run on the connection task are sent once this many bytes wait.
const BATCH_BYTES: usize = 256 * 1024;
/// Most replies handed to one `writev`.
const MAX_IOVECS: usize = 128;

/// The rest of a record at least this long is awaited with a raised low-water mark.
const MIN_LOW_WATER: usize = 64 * 1024;
/// The highest low-water mark set (the kernel caps it at half the largest receive buffer).
const MAX_LOW_WATER: usize = 1024 * 1024;

/// The read half of a connection. While the rest of a large record is on its way (a
/// 1 MiB WRITE arrives as sixteen 64 KiB loopback segments), the socket's receive
/// low-water mark (`SO_RCVLOWAT`) is raised to what is still missing, so the kernel wakes
/// the connection once, when the record is complete, instead of once per segment. The
/// client's sending thread pays for those wake-ups (on loopback the receive path runs in
/// the sender's context), as do our reads and the window updates each read sends back.
/// The mark never exceeds what the client must still send, and it is back at 1 before
/// any wait for a new record, so no wait can outlast the client's data.
struct RecordStream {
    inner: OwnedReadHalf,
    /// Bytes the current read is waiting for (0: any).
    expected: usize,
    /// The socket's current low-water mark.
    low_water: usize,
    /// Reads that had to wait for data.
    waits: u64,
}

impl RecordStream {
    fn new(inner: OwnedReadHalf) -> Self {
        Self { inner, expected: 0, low_water: 1, waits: 0 }
    }

    fn set_low_water(&mut self, bytes: usize) {
        // On failure the socket keeps its mark, and so does our note of it.
        match set_socket_option(self.inner.as_ref().as_raw_fd(), libc::SO_RCVLOWAT, bytes as libc::c_int) {
            Ok(()) => self.low_water = bytes,
            Err(e) => tracing::debug!(error = %e, "SO_RCVLOWAT"),
        }
    }
}

/// Sets an integer `SOL_SOCKET` option.
fn set_socket_option(fd: RawFd, option: libc::c_int, value: libc::c_int) -> std::io::Result<()> {
    // SAFETY: setsockopt reads one int from a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl AsyncRead for RecordStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if polled.is_ready() {
            this.expected = 0;
            return polled;
        }
        this.waits += 1;
        // About to wait. Setting the mark also wakes us if enough data is already queued
        // (the kernel re-checks readiness), so no data that came meanwhile is missed.
        let mark = if this.expected >= MIN_LOW_WATER { this.expected.min(MAX_LOW_WATER) } else { 1 };
        if mark != this.low_water {
            this.set_low_water(mark);
        }
        Poll::Pending
    }
}

impl RecordSource for RecordStream {
    fn expect(&mut self, bytes: usize) {
        self.expected = bytes;
    }
}

/// A reply on its way out, holding the request slots it used until it is written.
struct Outgoing {
    reply: Arc<Reply>,
    /// Bytes already sent.
    sent: usize,
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// Zeros for XDR padding.
static ZEROS: [u8; 4096] = [0; 4096];

/// One stretch of a reply still to be sent. Raw pointers (into the reply, which the batch
/// keeps alive) so the batch can be updated while the pieces are in use.
#[derive(Clone, Copy)]
enum Piece {
    Bytes(libc::iovec),
    File { fd: RawFd, offset: u64, len: usize },
}

impl Outgoing {
    fn is_sent(&self) -> bool {
        self.sent >= self.reply.len()
    }

    /// The unsent pieces in wire order: encoded bytes, file data, padding.
    fn unsent_pieces(&self) -> impl Iterator<Item = Piece> {
        let bytes = &self.reply.bytes;
        let s = self.sent;
        let mut pieces = [None; 3];
        if s < bytes.len() {
            pieces[0] = Some(Piece::Bytes(iovec(&bytes[s..])));
        }
        if let Some(f) = &self.reply.file {
            let (start, end) = (bytes.len(), bytes.len() + f.len);
            // No piece for no data (a READ at the end of the file): the bytes before it
            // go with MSG_MORE, and with nothing after them they would sit in the socket
            // until the kernel's 200 ms cork timer sent them.
            let from = s.max(start);
            if from < end {
                pieces[1] = Some(Piece::File { fd: f.fd.as_raw_fd(), offset: f.offset + (from - start) as u64, len: end - from });
            }
            let pad_end = self.reply.len();
            if s < pad_end && end < pad_end {
                pieces[2] = Some(Piece::Bytes(iovec(&ZEROS[s.max(end) - end..pad_end - end])));
            }
        }
        pieces.into_iter().flatten()
    }
}

/// An error of the connection rather than of a file being sent.
fn is_socket_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected | TimedOut)
}

fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() }
}

/// Records `n` bytes sent from the front of `batch`.
fn credit(batch: &mut [Outgoing], mut n: usize) {
    for o in batch.iter_mut() {
        let take = n.min(o.reply.len() - o.sent);
        o.sent += take;
        n -= take;
    }
}

#[derive(Default)]
struct SinkState {
    queue: VecDeque<Outgoing>,
    /// Someone (a thread that queued replies, or the writer task) is sending the queue;
    /// everyone else only adds to it.
    sending: bool,
    closed: bool,
}

/// The write side of one connection, shared by its reader, its workers and its writer
/// task. It owns the socket's write half, so the descriptor stays valid while any of them
/// holds it.
struct ReplySink {
    socket: OwnedWriteHalf,
    state: Mutex<SinkState>,
    /// Hands sending over to the writer task (socket full) or tells it to stop.
    wake_writer: Notify,
    /// Whether the client takes its replies, for the stall watch.
    progress: Arc<Progress>,
    /// When replies were last handed over (nanoseconds since `created`): where the
    /// client's wait for a reply ends and its time to the next call begins.
    created: Instant,
    last_submit_ns: AtomicU64,
}

enum Sent {
    All,
    /// The socket is full; unsent replies are back at the front of the queue.
    Blocked,
    Failed,
}

impl ReplySink {
    fn new(socket: OwnedWriteHalf, progress: Arc<Progress>) -> Self {
        Self {
            socket,
            state: Mutex::new(SinkState::default()),
            wake_writer: Notify::new(),
            progress,
            created: Instant::now(),
            last_submit_ns: AtomicU64::new(0),
        }
    }

    /// When replies were last handed over to be sent.
    fn last_submit(&self) -> Instant {
        self.created + Duration::from_nanos(self.last_submit_ns.load(Ordering::Relaxed))
    }

    /// Queues replies and, unless someone is already sending, sends the queue now from this
    /// thread; never blocks.
    fn submit(&self, replies: impl IntoIterator<Item = Outgoing>) {
        self.last_submit_ns.store(self.created.elapsed().as_nanos() as u64, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            st.queue.extend(replies);
            if st.sending || st.queue.is_empty() {
                return;
            }
            st.sending = true;
        }
        if let Sent::Blocked = self.send_queue() {
            // The writer task now owns the queue until it is empty.
            self.wake_writer.notify_one();
        }
    }

    /// Sends queued replies until the queue is empty (and gives up `sending`), the socket
    /// is full (keeps `sending` for the writer task) or the connection fails (closes it).
    /// Called only by the holder of `sending`.
    fn send_queue(&self) -> Sent {
        loop {
            let mut batch: Vec<Outgoing> = {
                let mut st = self.state.lock();
                if st.closed {
                    st.queue.clear();
                    return Sent::Failed;
                }
                if st.queue.is_empty() {
                    st.sending = false;
                    return Sent::All;
                }
                let n = st.queue.len().min(MAX_IOVECS);
                st.queue.drain(..n).collect()
            };
            let result = self.write_batch(&mut batch);
            if matches!(result, Ok(n) if n > 0) {
                self.progress.wrote();
            }
            let unsent: Vec<Outgoing> = batch.into_iter().filter(|o| !o.is_sent()).collect();
            match result {
                Ok(_) if unsent.is_empty() => continue,
                Ok(_) => {
                    let mut st = self.state.lock();
                    if st.closed {
                        // Closed while this batch was out of the queue: drop it too.
                        st.queue.clear();
                        return Sent::Failed;
                    }
                    for o in unsent.into_iter().rev() {
                        st.queue.push_front(o);
                    }
                    let fd = self.socket.as_ref().as_raw_fd();
                    self.progress.write_blocked(|| stalls::tcp_counts(fd).map(|c| c.bytes_acked));
                    return Sent::Blocked;
                }
                Err(_) => {
                    let mut st = self.state.lock();
                    st.closed = true;
                    st.queue.clear();
                    drop(st);
                    self.wake_writer.notify_one();
                    return Sent::Failed;
                }
            }
        }
    }

    /// Sends the unsent parts of `batch`, in order: byte parts gathered into one `sendmsg`,
    /// file parts (READ data) with `sendfile` straight from the page cache. Advances each
    /// reply's `sent` and returns the bytes sent; bytes left over mean the socket is full.
    fn write_batch(&self, batch: &mut [Outgoing]) -> std::io::Result<usize> {
        let mut total = 0;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(batch.len());
        for i in 0..batch.len() {
            for piece in batch[i].unsent_pieces() {
                match piece {
                    Piece::Bytes(v) => iov.push(v),
                    Piece::File { fd, offset, len } => {
                        if !iov.is_empty() {
                            let want: usize = iov.iter().map(|v| v.iov_len).sum();
                            // MSG_MORE: the header waits for the data it introduces.
                            let n = self.send_iov(&iov, libc::MSG_MORE)?;
                            credit(batch, n);
                            total += n;
                            if n < want {
                                return Ok(total);
                            }
                            iov.clear();
                        }
                        let n = match self.send_file(fd, offset, len) {
                            Ok(n) => n,
                            Err(e) => {
                                // The record's length is on the wire and its data cannot
                                // follow: the connection ends, and if the file was at
                                // fault its READs are copied for a while, so that the
                                // client's retransmission is answered.
                                if !is_socket_error(&e) {
                                    if let Some(file) = &batch[i].reply.file {
                                        file.send_failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                    }
                                    tracing::debug!(error = %e, "a READ reply's data could not be sent from the file; closing the connection");
                                }
                                return Err(e);
                            }
                        };
                        batch[i].sent += n;
                        total += n;
                        if n < len {
                            return Ok(total);
                        }
                    }
                }
            }
        }
        if !iov.is_empty() {
            let n = self.send_iov(&iov, 0)?;
            credit(batch, n);
            total += n;
        }
        Ok(total)
    }

    /// One non-blocking `sendmsg`; 0 when the socket is full. Goes through tokio, so a full
    /// socket clears the readiness the writer task waits on.
    fn send_iov(&self, iov: &[libc::iovec], flags: libc::c_int) -> std::io::Result<usize> {
        let fd = self.socket.as_ref().as_raw_fd();
        let sent = self.try_send(|| {
            let msg = libc::msghdr {
                msg_name: std::ptr::null_mut(),
                msg_namelen: 0,
                msg_iov: iov.as_ptr() as *mut _,
                msg_iovlen: iov.len(),
                msg_control: std::ptr::null_mut(),
                msg_controllen: 0,
                msg_flags: 0,
            };
            // SAFETY: the iovecs point into replies that the caller keeps alive.
            unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | flags) }
        })?;
        Ok(sent.unwrap_or(0))
    }

    /// Sends up to `len` bytes of a file at `offset`; 0 when the socket is full. A file cut
    /// short since the READ (truncated meanwhile) is an error: the reply said those bytes
    /// were data, and zeros in their place would be data the file never held.
    fn send_file(&self, file: RawFd, offset: u64, len: usize) -> std::io::Result<usize> {
        let sock = self.socket.as_ref().as_raw_fd();
        let mut off = offset as libc::off_t;
        // SAFETY: plain syscall; `off` is a local the kernel advances.
        match self.try_send(|| unsafe { libc::sendfile(sock, file, &mut off, len) })? {
            None => Ok(0),
            Some(0) if len > 0 => {
                Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file was cut short after its READ was answered"))
            }
            Some(n) => Ok(n),
        }
    }

    /// Runs one non-blocking send through tokio, so a full socket clears the readiness the
    /// writer task waits on; retries on EINTR. `None`: the socket is full.
    fn try_send(&self, mut send: impl FnMut() -> isize) -> std::io::Result<Option<usize>> {
        loop {
            let r = self.socket.as_ref().try_io(Interest::WRITABLE, || match send() {
                n if n < 0 => Err(std::io::Error::last_os_error()),
                n => Ok(n as usize),
            });
            match r {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
    /// Marks the connection closed and drops the replies still queued, which frees their
    /// request slots: a client that stopped reading must not keep them (the connection's
    /// reader may be waiting for one, and the global ones are every client's).
    fn close(&self) {
        let unsent = {
            let mut st = self.state.lock();
            st.closed = true;
            std::mem::take(&mut st.queue)
        };
        drop(unsent);
        self.wake_writer.notify_one();
    }
}

impl Watched for ReplySink {
    fn tcp_counts(&self) -> Option<TcpCounts> {
        stalls::tcp_counts(self.socket.as_ref().as_raw_fd())
    }

    /// Closes the connection and has the kernel drop what is still in its send buffer (a
    /// reset once the socket is closed): a client found stalled would take megabytes of
    /// replies it cannot use before it saw the end of the stream.
    fn abort(&self) {
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt reads one `linger` from a live local.
        let rc = unsafe {
            libc::setsockopt(
                self.socket.as_ref().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "SO_LINGER");
        }
        self.close();
    }
}

/// How long a new connection waits at the connection limit for the one closed to make
/// room for it to end.
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// Refusals at the connection limit, which any peer can cause, logged once a minute.
static REFUSED: crate::throttle::Throttle = crate::throttle::Throttle::new(60);

pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match shared.connections.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) if shared.stalls.close_least_recently_used() => None,
            Err(_) => {
                if let Some(held_back) = REFUSED.allow() {
                    tracing::warn!(client = %peer, held_back, "connection refused: max_connections reached and every connection busy");
                }
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            // At the limit, the connection closed to make room frees its place as its
            // task ends; this one waits for it here, not in the accept loop.
            let slot = match slot {
                Some(slot) => slot,
                None => match tokio::time::timeout(ROOM_WAIT, shared.connections.clone().acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        if let Some(held_back) = REFUSED.allow() {
                            tracing::warn!(client = %peer, held_back, "connection refused: max_connections reached");
                        }
                        return;
                    }
                },
            };
            shared.metrics.connection_opened();
            if let Err(e) = serve_connection(stream, peer, &shared).await {
                tracing::debug!(client = %peer, error = %e, "connection closed");
            }
            shared.metrics.connection_closed();
            drop(slot);
        });
    }
}

/// Replies of calls run on the connection task, waiting to be sent together.
struct Batch<'a> {
    sink: &'a ReplySink,
    replies: Vec<Outgoing>,
    bytes: usize,
}

impl Batch<'_> {
    fn push(&mut self, out: Outgoing) {
        self.bytes += out.reply.len();
        self.replies.push(out);
        if self.bytes >= BATCH_BYTES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.replies.is_empty() {
            self.sink.submit(self.replies.drain(..));
            self.bytes = 0;
        }
    }

    /// Awaits `fut`, first sending the batch if `fut` cannot finish at once: replies wait
    /// only while more work is already at hand.
    async fn flush_before_waiting<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        let ready = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(v) = ready {
            return v;
        }
        self.flush();
        fut.await
    }
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let local = stream.local_addr()?;
    shared.congestion.on_accept(&stream, peer, local);
    tracing::debug!(client = %peer, "connection opened");
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(128 * 1024, RecordStream::new(rd));
    let stall_watch = shared.stalls.register(peer);
    let progress = stall_watch.progress();
    let sink = Arc::new(ReplySink::new(wr, progress.clone()));
    stall_watch.watch(Arc::downgrade(&sink) as std::sync::Weak<dyn Watched>);
    let write_timeout = Duration::from_secs(shared.limits.write_timeout_secs);
    let mut writer = tokio::spawn(drain_replies(sink.clone(), write_timeout, peer));
    let per_conn = shared.limits.max_requests_per_connection.max(1);
    let conn_slots = Arc::new(Semaphore::new(per_conn));
    progress.count_slots(conn_slots.clone(), per_conn);
    let idle = Duration::from_secs(shared.limits.idle_timeout_secs);
    // Once a request starts arriving it holds a global slot, so it must finish arriving
    // promptly (a slowloris client must not keep slots for the idle timeout).
    let request_deadline = Duration::from_secs(shared.limits.write_timeout_secs).min(idle);
    let mut batch = Batch { sink: &sink, replies: Vec::new(), bytes: 0 };
    // How long the client took to send its next request the last time we had to wait.
    let mut last_wait: Option<Duration> = None;
    // Calls of this connection running on blocking threads, until their replies are queued.
    let on_threads = Arc::new(AtomicUsize::new(0));
    // When a call of this client's last set helper threads working.
    let mut helpers_engaged_at: Option<Instant> = None;
    let result = loop {
        // The writer gave up on a client that stopped reading: run nothing more for it.
        if writer.is_finished() {
            break Ok(());
        }
        // Take both slots before reading, so a connection cannot read more requests than
        // it may run: this is the back-pressure that bounds memory.
        // Each wait below also ends when the writer task does: it has given up on a client
        // that stopped reading, and the connection is over.
        let Some(conn_slot) = batch.flush_before_waiting(slot_unless_given_up(&conn_slots, &mut writer)).await else {
            break Ok(());
        };
        progress.reader_holds_slot(true);
        // But take the global slot only once the next record has begun to arrive: an idle
        // connection must not hold a slot every other client needs (otherwise
        // max_requests_in_flight idle connections stop the server for everyone).
        let wait_started = rd.buffer().is_empty().then(|| {
            batch.flush();
            let started = Instant::now();
            let fd = rd.get_ref().inner.as_ref().as_raw_fd();
            if on_threads.load(Ordering::Acquire) > 0 {
                // A call of this client's is still running on a blocking thread (a sync,
                // typically): its next request comes only after that reply, so poll on
                // through it rather than let this thread, and with it the CPU, sleep.
                shared.busy_poll.poll_readable_after(fd, last_wait, || on_threads.load(Ordering::Acquire) > 0);
            } else {
                shared.busy_poll.poll_readable(fd, last_wait);
            }
            started
        });
        let waited = batch
            .flush_before_waiting(async {
                // Idle means nothing sent and nothing running for the whole timeout: a
                // client waiting for a long COMMIT keeps its connection (as knfsd, which
                // ages out only transports no request holds), and the timeout starts
                // again once its last call has ended, not at the expiry before that.
                let mut wait = idle;
                // Calls start only once a request is read, which ends this wait: those
                // running now are all that can end during it.
                let mut calls_were_running = calls_running(&conn_slots, per_conn);
                loop {
                    tokio::select! {
                        r = tokio::time::timeout(wait, rd.fill_buf()) => match r {
                            // Look again soon: the quiet period starts when the calls end.
                            Err(_) if calls_running(&conn_slots, per_conn) => {
                                calls_were_running = true;
                                wait = IDLE_RECHECK.min(idle);
                            }
                            // The last call ended within the last look: a whole quiet period from now.
                            Err(_) if calls_were_running => {
                                calls_were_running = false;
                                wait = idle;
                            }
                            r => break Some(r.map(|r| r.map(|b| b.is_empty()))),
                        },
                        _ = &mut writer => break None,
                    }
                }
            })
            .await;
        match waited {
            None => break Ok(()),
            Some(Err(_)) => break Err(anyhow::anyhow!("idle for {idle:?}")),
            Some(Ok(Err(e))) => break Err(e.into()),
            Some(Ok(Ok(true))) => break Ok(()),
            Some(Ok(Ok(false))) => {}
        }
        if let Some(started) = wait_started {
            // The client's own time to its next call: counted from its last reply where
            // that went out during the wait (a call that ran on a blocking thread).
            last_wait = Some(started.max(sink.last_submit()).elapsed());
        }
        let global_wait = async {
            tokio::select! {
                biased;
                slot = shared.global_slot(Some(stall_watch.id())) => Some(slot),
                _ = &mut writer => None,
            }
        };
        let Some(global_slot) = batch.flush_before_waiting(global_wait).await else {
            break Ok(());
        };
        progress.request_arriving();
        // The request is arriving: the connection is busy, not to be closed for a new one
        // at the connection limit (one whose request stops arriving is the stall watch's
        // to close from now). Until here, waiting for a global slot while the server is
        // saturated, it counts as idle: closing it loses only a request not yet read,
        // which its client sends again, and a peer that sends a byte per connection does
        // not keep every connection past the limit's reach.
        progress.reader_holds_slot(false);
        let mut record = shared.record_pool.take();
        let read = batch
            .flush_before_waiting(async {
                tokio::select! {
                    r = tokio::time::timeout(request_deadline, read_record(&mut rd, &shared.record_limits, &mut record)) => Some(r),
                    _ = &mut writer => None,
                }
            })
            .await;
        progress.request_arrived();
        match read {
            None => break Ok(()),
            Some(Err(_)) => break Err(anyhow::anyhow!("a request took longer than {request_deadline:?} to arrive")),
            Some(Ok(Err(e))) => break Err(e.into()),
            Some(Ok(Ok(false))) => break Ok(()),
            Some(Ok(Ok(true))) => {}
        }
        shared.metrics.request_started();
        let slots = (conn_slot, global_slot);
        crate::vfs::serving_socket(Some(rd.get_ref().inner.as_ref().as_raw_fd()));
        // A client whose calls set helpers working (a listing's look-ahead) is served from
        // the CPU its calls come in on, for as long as it goes on calling soon after.
        let follow = helpers_engaged_at.is_some_and(|at| at.elapsed() < crate::cpu::FOLLOW_CLIENT_FOR);
        crate::cpu::follow_client(if follow { crate::vfs::caller_cpu() } else { None }, false);
        let handled = shared.dispatcher.try_handle_inline(&record, peer, local, Transport::Tcp);
        // Runtime threads queue helper jobs only inside this call (UDP's and slow calls run
        // on blocking threads), so the note is this call's.
        if crate::vfs::take_engaged_helpers() {
            helpers_engaged_at = Some(Instant::now());
        }
        crate::vfs::serving_socket(None);
        match handled {
            Handled::Done(reply) => {
                shared.record_pool.put(record);
                if let Some(reply) = reply {
                    batch.push(Outgoing { reply, sent: 0, _slots: slots });
                }
                shared.metrics.request_finished();
            }
            Handled::NeedsThread => {
                let (shared, sink) = (shared.clone(), sink.clone());
                let running = OnThread::start(&on_threads);
                tokio::task::spawn_blocking(move || {
                    let _running = running;
                    let reply = shared.dispatcher.handle(&record, peer, local, Transport::Tcp);
                    shared.record_pool.put(record);
                    if let Some(reply) = reply {
                        sink.submit([Outgoing { reply, sent: 0, _slots: slots }]);
                    }
                    shared.metrics.request_finished();
                });
            }
        }
    };
    // This thread (a runtime worker) no longer follows the client that went.
    crate::cpu::follow_client(None, helpers_engaged_at.is_some());
    batch.flush();
    // The reader's slot went with the loop: what is held now is calls'.
    progress.reader_holds_slot(false);
    // Let the calls still running finish and their replies go out (bounded by the write
    // timeout), then close.
    let _ = tokio::time::timeout(write_timeout, conn_slots.acquire_many(per_conn as u32)).await;
    sink.close();
    // The writer may already have ended, and a finished JoinHandle must not be polled again.
    if !writer.is_finished() {
        let _ = writer.await;
    }
    result
}

/// A call of a connection running on a blocking thread, counted in the connection's
/// `on_threads` until it is dropped (after its reply is queued, or by a panic).
struct OnThread(Arc<AtomicUsize>);

impl OnThread {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for OnThread {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How often a connection whose calls outlast the idle timeout looks whether they have
/// ended, to start its quiet period no later than this after the last one.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// Whether calls of this connection are running or their replies are still queued,
/// while the reader holds one slot for the next.
fn calls_running(conn_slots: &Semaphore, per_conn: usize) -> bool {
    conn_slots.available_permits() + 1 < per_conn
}

/// A request slot, or `None` once the connection's writer task has ended (it gave up on a
/// client that stopped reading). Biased: the writer is polled only when no slot is free at
/// once, so the common case costs nothing more.
async fn slot_unless_given_up(slots: &Arc<Semaphore>, writer: &mut JoinHandle<()>) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        biased;
        slot = slots.clone().acquire_owned() => Some(slot.expect("never closed")),
        _ = writer => None,
    }
}

/// Takes over sending when the socket is full: waits until the client reads, sends the
/// queue, and hands sending back once the queue is empty. Exits when the connection is
/// closed or the client stops reading for longer than `timeout`.
async fn drain_replies(sink: Arc<ReplySink>, timeout: Duration, peer: SocketAddr) {
    loop {
        sink.wake_writer.notified().await;
        loop {
            if sink.state.lock().closed {
                return;
            }
            let ready = tokio::select! {
                ready = tokio::time::timeout(timeout, sink.socket.as_ref().writable()) => ready,
                // Closed meanwhile (a stalled client's connection, by another task).
                _ = sink.wake_writer.notified() => continue,
            };
            if !matches!(ready, Ok(Ok(()))) {
                tracing::warn!(client = %peer, "client is not reading its replies; closing the connection");
                sink.close();
                return;
            }
            match sink.send_queue() {
                Sent::All => break,
                Sent::Blocked => continue,
                Sent::Failed => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Every third test reply carries file data (unaligned, so padding follows it).
    fn is_file_reply(id: u32) -> bool {
        id.is_multiple_of(3)
    }

    fn payload_len(id: u32) -> usize {
        [16, 3001, 70_002, 200_003][(id % 4) as usize]
    }

    /// Where in the test file the data of reply `id` starts.
    fn file_offset(id: u32) -> usize {
        (id as usize * 7919) % 4096
    }

    /// A test reply: record mark and id, then the payload: `payload_len` copies of the id's
    /// low byte, or that many bytes of the file (plus XDR padding).
    fn reply(id: u32, file: &Arc<std::os::fd::OwnedFd>) -> Reply {
        let len = payload_len(id);
        let wire = if is_file_reply(id) { crate::xdr::pad4(len) } else { len };
        let mut bytes = (0x8000_0000u32 | (4 + wire) as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&id.to_be_bytes());
        if !is_file_reply(id) {
            bytes.resize(8 + len, id as u8);
            return Reply { bytes, file: None };
        }
        let range = crate::vfs::FileRange { fd: file.clone(), offset: file_offset(id) as u64, len, send_failed: Default::default() };
        Reply { bytes, file: Some(range) }
    }

    /// The payload the client must see for reply `id`.
    fn expected_payload(id: u32, file_data: &[u8]) -> Vec<u8> {
        let len = payload_len(id);
        if !is_file_reply(id) {
            return vec![id as u8; len];
        }
        let mut v = file_data[file_offset(id)..file_offset(id) + len].to_vec();
        v.resize(crate::xdr::pad4(len), 0);
        v
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_record_wakes_its_reader_once_and_a_small_one_after_it_is_not_held_back() {
        use crate::rpc::record::RecordLimits;
        use std::io::Write;
        use tokio::io::AsyncWriteExt;
        const BIG: usize = 1 << 20;
        const PIECE: usize = 32 * 1024;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(&(0x8000_0000u32 | BIG as u32).to_be_bytes()).unwrap();
            // Trickled: a reader woken for every piece would wake 32 times.
            for piece in sent.chunks(PIECE) {
                s.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            // Then a small record, only once the server has the large one: it then waits
            // for the small one with whatever mark the large one left behind.
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack).unwrap();
            s.write_all(&(0x8000_0000u32 | 5).to_be_bytes()).unwrap();
            s.write_all(b"small").unwrap();
            s.read_exact(&mut ack).unwrap();
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::with_capacity(128 * 1024, RecordStream::new(rd));
        let limits = RecordLimits::default();
        let mut record = Vec::new();
        let large = tokio::time::timeout(Duration::from_secs(10), read_record(&mut rd, &limits, &mut record))
            .await
            .expect("the large record was held back by a low-water mark above what was still to come");
        assert!(large.unwrap());
        assert!(record == big, "the large record arrived damaged");
        let waits = rd.get_ref().waits;
        assert!(waits <= 4, "the reader waited {waits} times for one record sent in {} pieces", BIG / PIECE);
        wr.write_all(b"1").await.unwrap();
        let small = tokio::time::timeout(Duration::from_secs(10), read_record(&mut rd, &limits, &mut record))
            .await
            .expect("a small record after a large one was held back by the large one's low-water mark");
        assert!(small.unwrap());
        assert_eq!(record, b"small");
        wr.write_all(b"2").await.unwrap();
        client.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_replies_reach_a_slow_reader_whole_and_once() {
        // Byte replies and replies with file data (sendfile) mixed.
        const THREADS: u32 = 6;
        const EACH: u32 = 150;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let file_data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut tmp = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut tmp, &file_data).unwrap();
        let file = Arc::new(std::os::fd::OwnedFd::from(tmp));
        // The client reads slowly through a small buffer, so the socket keeps filling up
        // and sending keeps passing between submitting threads and the writer task.
        let client = std::thread::spawn(move || {
            let s = socket_with_small_buffers(addr);
            let file_data = file_data;
            let mut s = std::io::BufReader::new(s);
            let mut seen = std::collections::HashSet::new();
            for n in 0..THREADS * EACH {
                if n % 16 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut mark = [0u8; 4];
                s.read_exact(&mut mark).unwrap();
                let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
                let mut body = vec![0u8; len];
                s.read_exact(&mut body).unwrap();
                let id = u32::from_be_bytes(body[..4].try_into().unwrap());
                assert!(body[4..] == expected_payload(id, &file_data), "reply {id} arrived damaged or mixed with other bytes");
                assert!(seen.insert(id), "reply {id} arrived twice");
            }
            seen.len()
        });
        let (_rd, sink) = accepted_sink(&listener).await;
        let writer = tokio::spawn(drain_replies(sink.clone(), Duration::from_secs(30), addr));
        let slots = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        let submitters: Vec<_> = (0..THREADS)
            .map(|t| {
                let (sink, slots, file) = (sink.clone(), slots.clone(), file.clone());
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let id = t * EACH + i;
                        let slot = || slots.clone().try_acquire_owned().unwrap();
                        let out = Outgoing { reply: Arc::new(reply(id, &file)), sent: 0, _slots: (slot(), slot()) };
                        sink.submit([out]);
                    }
                })
            })
            .collect();
        for s in submitters {
            s.join().unwrap();
        }
        let received = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
        assert_eq!(received, (THREADS * EACH) as usize);
        sink.close();
        writer.await.unwrap();
    }

    /// The server side of the next connection to `listener`: its read half, and a reply
    /// sink on its write half.
    async fn accepted_sink(listener: &TcpListener) -> (tokio::net::tcp::OwnedReadHalf, Arc<ReplySink>) {
        let (server, peer) = listener.accept().await.unwrap();
        let (rd, wr) = server.into_split();
        let stalls = super::super::stalls::Stalls::new(Duration::from_secs(5));
        let progress = stalls.register(peer).progress();
        (rd, Arc::new(ReplySink::new(wr, progress)))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_with_no_file_data_is_not_left_corked_in_the_socket() {
        // A READ at or past the end of the file served from the page cache: a header and
        // an empty file range. Nothing of it may wait in the socket for more data.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_rd, sink) = accepted_sink(&listener).await;
        let fd = sink.socket.as_ref().as_raw_fd();
        let file = Arc::new(std::os::fd::OwnedFd::from(tempfile::tempfile().unwrap()));
        let slots = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        let slot = || slots.clone().try_acquire_owned().unwrap();
        for id in [1u32, 2] {
            let mut bytes = (0x8000_0000u32 | 4).to_be_bytes().to_vec();
            bytes.extend_from_slice(&id.to_be_bytes());
            let range = crate::vfs::FileRange { fd: file.clone(), offset: 0, len: 0, send_failed: Default::default() };
            let reply = Reply { bytes, file: Some(range) };
            sink.submit([Outgoing { reply: Arc::new(reply), sent: 0, _slots: (slot(), slot()) }]);
            // SIOCOUTQNSD: bytes in the send queue not yet sent. Corked bytes stay there
            // until the cork timer fires, 200 ms later.
            let mut unsent: libc::c_int = -1;
            // SAFETY: plain ioctl on a live socket into a local int.
            assert_eq!(unsafe { libc::ioctl(fd, 0x894B, &mut unsent) }, 0);
            assert_eq!(unsent, 0, "reply {id}: {unsent} bytes held back in the socket");
        }
        let mut got = [0u8; 16];
        (&client).read_exact(&mut got).unwrap();
        assert_eq!(got, [0x80, 0, 0, 4, 0, 0, 0, 1, 0x80, 0, 0, 4, 0, 0, 0, 2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn file_data_cut_short_after_the_read_ends_the_connection_instead_of_sending_zeros() {
        // A READ answered from the page cache for 8 KiB; the file is cut to 100 bytes
        // before the data is sent. The reply's header already says 8 KiB of data: the
        // connection must end after what the file still holds, not go on with zeros, and
        // the file's next READ must be copied (so the retransmission gets the truth).
        use std::io::Write;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (rd, sink) = accepted_sink(&listener).await;
        let writer = tokio::spawn(drain_replies(sink.clone(), Duration::from_secs(30), addr));
        let mut data = tempfile::tempfile().unwrap();
        data.write_all(&[7u8; 8192]).unwrap();
        let file = Arc::new(std::os::fd::OwnedFd::from(data.try_clone().unwrap()));
        let send_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut bytes = (0x8000_0000u32 | (4 + 8192)).to_be_bytes().to_vec();
        bytes.extend_from_slice(&1u32.to_be_bytes());
        let range = crate::vfs::FileRange { fd: file, offset: 0, len: 8192, send_failed: send_failed.clone() };
        data.set_len(100).unwrap();
        let slots = Arc::new(Semaphore::new(2));
        let slot = || slots.clone().try_acquire_owned().unwrap();
        sink.submit([Outgoing { reply: Arc::new(Reply { bytes, file: Some(range) }), sent: 0, _slots: (slot(), slot()) }]);
        tokio::time::timeout(Duration::from_secs(10), writer).await.expect("the writer gave up").unwrap();
        assert!(sink.state.lock().closed);
        drop((sink, rd));
        let received = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            (&client).read_to_end(&mut got).map(|_| got)
        })
        .await
        .unwrap();
        let got = received.unwrap_or_default();
        let data = got.get(8..).unwrap_or_default();
        assert!(data.len() <= 100, "{} bytes sent where the file holds 100", data.len());
        assert!(data.iter().all(|&b| b == 7), "bytes the file does not hold were sent");
        assert!(send_failed.load(std::sync::atomic::Ordering::Relaxed));
    }

    /// Program 400001, version 1: procedure 1 waits the milliseconds its word says and
    /// answers it, procedure 2 answers its word at once.
    struct Sleepy;

    impl crate::rpc::RpcProgram for Sleepy {
        fn program(&self) -> u32 {
            400_001
        }
        fn versions(&self) -> (u32, u32) {
            (1, 1)
        }
        fn call(
            &self,
            ctx: &crate::rpc::CallContext,
            args: &mut crate::xdr::XdrReader<'_>,
            out: &mut crate::xdr::XdrWriter,
        ) -> Result<(), crate::rpc::ProcError> {
            let word = args.u32()?;
            if ctx.procedure == 1 {
                std::thread::sleep(Duration::from_millis(word.into()));
            }
            out.u32(word);
            Ok(())
        }
    }

    /// A server's shared state with `program` alone and `limits`.
    fn shared_with(program: Arc<dyn crate::rpc::RpcProgram>, limits: crate::server::config::Limits) -> Arc<Shared> {
        shared_polling(program, limits, crate::server::busy_poll::BusyPoll::new(Duration::ZERO, Arc::default()))
    }

    /// As [`shared_with`], polling for requests with `busy_poll`.
    fn shared_polling(
        program: Arc<dyn crate::rpc::RpcProgram>,
        limits: crate::server::config::Limits,
        busy_poll: crate::server::busy_poll::BusyPoll,
    ) -> Arc<Shared> {
        use crate::metrics::Metrics;
        let metrics = Arc::new(Metrics::new());
        let state = crate::server::state::ServerState::new(Vec::new(), crate::fh::HandleKey::from_bytes([7; 32]), metrics.clone());
        Arc::new(Shared {
            dispatcher: crate::rpc::dispatch::Dispatcher::new(vec![program], 16, metrics.clone()),
            metrics,
            record_limits: crate::rpc::record::RecordLimits { max_record: limits.max_record_bytes, max_fragments: 1024 },
            global_requests: Arc::new(Semaphore::new(limits.max_requests_in_flight)),
            busy_poll,
            record_pool: crate::rpc::record::RecordPool::new(4),
            state: Arc::new(state),
            stalls: stalls::Stalls::new(Duration::from_secs(limits.stall_timeout_secs)),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            congestion: crate::server::congestion::Policy::Inherit,
            limits,
            _state_dir_lock: tempfile::tempfile().expect("a file to stand for the lock"),
        })
    }

    /// A framed call of program 400001 with one word of arguments.
    fn sleepy_call(xid: u32, procedure: u32, word: u32) -> Vec<u8> {
        let mut w = crate::xdr::XdrWriter::new();
        crate::rpc::message::encode_call(&mut w, xid, 400_001, 1, procedure, &crate::rpc::auth::Credential::None);
        w.u32(word);
        let body = w.into_inner();
        let mut framed = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&body);
        framed
    }

    /// Reads one framed reply: its xid and its last word.
    fn read_reply(s: &mut std::net::TcpStream) -> std::io::Result<(u32, u32)> {
        let mut mark = [0u8; 4];
        s.read_exact(&mut mark)?;
        let mut body = vec![0u8; (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize];
        s.read_exact(&mut body)?;
        let word = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
        Ok((word(0), word(body.len() - 4)))
    }

    /// Serves [`Sleepy`] with an idle timeout of `idle_secs` and runs `client` on a
    /// connection to it.
    async fn with_sleepy_server<T: Send + 'static>(
        idle_secs: u64,
        client: impl FnOnce(&mut std::net::TcpStream) -> T + Send + 'static,
    ) -> T {
        let limits = crate::server::config::Limits { idle_timeout_secs: idle_secs, ..Default::default() };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, shared_with(Arc::new(Sleepy), limits)));
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            client(&mut s)
        })
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_waiting_for_a_long_call_is_not_idle() {
        use std::io::Write;
        let replies = with_sleepy_server(1, |s| {
            // A call that runs past the idle timeout, then, while it runs and after the
            // timeout, a quick one on the same connection.
            s.write_all(&sleepy_call(1, 1, 3000)).unwrap();
            std::thread::sleep(Duration::from_millis(1800));
            s.write_all(&sleepy_call(2, 2, 42)).unwrap();
            (read_reply(s), read_reply(s))
        })
        .await;
        // Either may come first: on a slow machine the client's sleep can outlast the call.
        let mut answered = [replies.0, replies.1].map(|r| r.expect("the connection was closed while the long call ran"));
        answered.sort();
        assert_eq!(answered, [(1, 3000), (2, 42)]);
    }

    /// Under a 2 s idle timeout, a call of `long_ms`, then, `pause_ms` after its reply, a
    /// quick one on the same connection: both must be answered.
    async fn quick_call_after_a_long_one_and_a_pause(long_ms: u32, pause_ms: u64) {
        use std::io::Write;
        const IDLE: Duration = Duration::from_secs(2);
        // The call ends no sooner than `long_ms` after it was sent, so a server that is
        // right keeps the connection open until at least `long_ms` + 2 s after that. A
        // quick call the client sends later than this (less a margin for its way) may
        // rightly find the connection closed: a busy machine held the client up, and the
        // trial is made again, up to three times.
        for trial in 1..=3 {
            let (long, quick, sent_late) = with_sleepy_server(IDLE.as_secs(), move |s| {
                let start = std::time::Instant::now();
                s.write_all(&sleepy_call(1, 1, long_ms)).unwrap();
                let long = read_reply(s);
                std::thread::sleep(Duration::from_millis(pause_ms));
                let sent_late = start.elapsed() + Duration::from_millis(200) > Duration::from_millis(long_ms.into()) + IDLE;
                let sent = s.write_all(&sleepy_call(2, 2, 42));
                (long, sent.and_then(|()| read_reply(s)), sent_late)
            })
            .await;
            assert_eq!(long.expect("the long call was not answered"), (1, long_ms));
            match quick {
                Ok(reply) => return assert_eq!(reply, (2, 42)),
                Err(e) if sent_late => eprintln!("trial {trial}: the quick call was sent too late to tell ({e}); again"),
                Err(e) => panic!("the connection was closed before it had been idle for the timeout: {e}"),
            }
        }
        panic!("three trials in a row sent the quick call too late to tell: the machine is too busy for this test");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_idle_timeout_starts_when_the_last_long_call_ends() {
        // The call ends 1.6 s into the second idle period it spans (at 3.6 s). A timer
        // that only runs on from that period closes the connection at 4 s; the quick
        // call comes 1.5 s after the long one's reply, inside the 2 s owed to it.
        quick_call_after_a_long_one_and_a_pause(3600, 1500).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_that_ends_within_the_first_idle_period_restarts_the_timeout() {
        // The call ends at 1.5 s, inside the first 2 s idle period; the next call
        // comes 1 s after its reply, when that period (not restarted) has expired.
        quick_call_after_a_long_one_and_a_pause(1500, 1000).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_waiting_for_calls_on_blocking_threads_is_polled_for_through_them() {
        use std::io::Write;
        // Each call runs 100 ms on a blocking thread, longer than the window (20 ms) and
        // than the wait that still counts as a tight loop (4 × 20 ms), and the client
        // sends the next as soon as it has the reply. The server must poll through each
        // call and catch the next request: its client's own pause is short, counted
        // from the reply, not from the call's arrival.
        const CALLS: u32 = 6;
        let poll = crate::server::busy_poll::BusyPoll::always_spare(Duration::from_millis(20), Duration::from_secs(1));
        let shared = shared_polling(Arc::new(Sleepy), Default::default(), poll);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, shared.clone()));
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            for xid in 1..=CALLS {
                s.write_all(&sleepy_call(xid, 1, 100)).unwrap();
                assert_eq!(read_reply(&mut s).unwrap(), (xid, 100));
            }
        })
        .await
        .unwrap();
        // The first call has no history and the second follows a first wait that the
        // server spent asleep; of the other four, a client held up past the window by a
        // loaded machine may miss one or two.
        let caught = shared.busy_poll.stats().caught();
        assert!(caught >= 2, "{caught} of the last {} requests were caught while polling", CALLS - 2);
    }

    fn socket_with_small_buffers(addr: SocketAddr) -> std::net::TcpStream {
        let s = std::net::TcpStream::connect(addr).unwrap();
        // Not below the loopback MSS (64 KiB): a window that can never open to one segment
        // leaves the sender to zero-window probes, which back off to seconds.
        set_socket_option(s.as_raw_fd(), libc::SO_RCVBUF, 128 * 1024).unwrap();
        s
    }
}
