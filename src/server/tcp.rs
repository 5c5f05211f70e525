//! RPC over TCP. Per connection, a reader task reads records as fast as the request
//! slots allow and runs each call on a worker thread; the worker sends its own reply
//! straight to the socket when nothing is queued ahead of it (no extra thread hop), and
//! otherwise queues it for the connection's writer task, which drains the queue in order
//! without ever blocking a worker on a slow client.

use super::Shared;
use crate::rpc::record::read_record;
use crate::rpc::Transport;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A reply on its way out, holding the request slots it used until it is written.
struct Outgoing {
    reply: Arc<Vec<u8>>,
    /// Bytes already sent.
    sent: usize,
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

#[derive(Default)]
struct SinkState {
    queue: VecDeque<Outgoing>,
    /// The writer task owns the socket's output until the queue is empty.
    draining: bool,
    closed: bool,
}

/// The write side of one connection, shared by its workers and its writer task. It owns
/// the socket's write half, so the descriptor stays valid while any worker holds it.
struct ReplySink {
    socket: OwnedWriteHalf,
    state: Mutex<SinkState>,
    wake_writer: Notify,
}

enum Sent {
    All,
    Partly,
    Failed,
}

impl ReplySink {
    /// Non-blocking send of the unsent part of `out`. Workers call the socket directly;
    /// the writer task goes through tokio (`from_runtime`) so a full socket clears the
    /// readiness it then waits on.
    fn try_send(&self, out: &mut Outgoing, from_runtime: bool) -> Sent {
        let fd = self.socket.as_ref().as_raw_fd();
        while out.sent < out.reply.len() {
            let rest = &out.reply[out.sent..];
            let n = if from_runtime {
                self.socket.as_ref().try_write(rest)
            } else {
                // SAFETY: fd is open while `self` lives; the slice bounds the read.
                let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            };
            match n {
                Ok(n) => out.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Sent::Partly,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Sent::Failed,
            }
        }
        Sent::All
    }

    /// Sends a reply now if nothing is queued ahead of it, else queues it.
    fn send(&self, mut out: Outgoing) {
        let mut st = self.state.lock();
        if st.closed {
            return;
        }
        if !st.draining {
            match self.try_send(&mut out, false) {
                Sent::All => return,
                Sent::Failed => {
                    st.closed = true;
                    self.wake_writer.notify_one();
                    return;
                }
                Sent::Partly => st.draining = true,
            }
        }
        st.queue.push_back(out);
        self.wake_writer.notify_one();
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.wake_writer.notify_one();
    }
}

pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let connections = Arc::new(Semaphore::new(shared.limits.max_connections));
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
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            tracing::warn!(client = %peer, "connection refused: max_connections reached");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.metrics.connection_opened();
            if let Err(e) = serve_connection(stream, peer, &shared).await {
                tracing::debug!(client = %peer, error = %e, "connection closed");
            }
            shared.metrics.connection_closed();
            drop(slot);
        });
    }
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let local = stream.local_addr()?;
    tracing::debug!(client = %peer, "connection opened");
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(128 * 1024, rd);
    let sink = Arc::new(ReplySink { socket: wr, state: Mutex::new(SinkState::default()), wake_writer: Notify::new() });
    let write_timeout = Duration::from_secs(shared.limits.write_timeout_secs);
    let mut writer = tokio::spawn(drain_replies(sink.clone(), write_timeout, peer));
    let per_conn = shared.limits.max_requests_per_connection.max(1);
    let conn_slots = Arc::new(Semaphore::new(per_conn));
    let idle = Duration::from_secs(shared.limits.idle_timeout_secs);
    // Once a request starts arriving it holds a global slot, so it must finish arriving
    // promptly (a slowloris client must not keep slots for the idle timeout).
    let request_deadline = Duration::from_secs(shared.limits.write_timeout_secs).min(idle);
    let result = loop {
        // Take both slots before reading, so a connection cannot read more requests than
        // it may run: this is the back-pressure that bounds memory.
        let conn_slot = conn_slots.clone().acquire_owned().await.expect("never closed");
        // But take the global slot only once the next record has begun to arrive: an idle
        // connection must not hold a slot every other client needs (otherwise
        // max_requests_in_flight idle connections stop the server for everyone).
        let waited = tokio::select! {
            r = tokio::time::timeout(idle, rd.fill_buf()) => r.map(|r| r.map(|b| b.is_empty())),
            _ = &mut writer => break Ok(()),
        };
        match waited {
            Err(_) => break Err(anyhow::anyhow!("idle for {idle:?}")),
            Ok(Err(e)) => break Err(e.into()),
            Ok(Ok(true)) => break Ok(()),
            Ok(Ok(false)) => {}
        }
        let global_slot = shared.global_requests.clone().acquire_owned().await.expect("never closed");
        let mut record = Vec::new();
        let read = tokio::select! {
            r = tokio::time::timeout(request_deadline, read_record(&mut rd, &shared.record_limits, &mut record)) => r,
            _ = &mut writer => break Ok(()),
        };
        match read {
            Err(_) => break Err(anyhow::anyhow!("a request took longer than {request_deadline:?} to arrive")),
            Ok(Err(e)) => break Err(e.into()),
            Ok(Ok(false)) => break Ok(()),
            Ok(Ok(true)) => {}
        }
        shared.metrics.request_started();
        // Nothing else in flight on this connection: a quick call runs right here, which
        // saves two thread hand-offs on the latency path. Anything that may wait on the
        // disk, and everything under pipelined load, goes to the worker threads.
        let alone = conn_slots.available_permits() + 1 == per_conn && rd.buffer().is_empty() && !bytes_waiting(rd.get_ref());
        let quick = alone && shared.dispatcher.is_quick(&record);
        let run = {
            let (shared, sink) = (shared.clone(), sink.clone());
            move || {
                let reply = shared.dispatcher.handle(&record, peer, local, Transport::Tcp);
                drop(record);
                if let Some(reply) = reply {
                    sink.send(Outgoing { reply, sent: 0, _slots: (conn_slot, global_slot) });
                }
                shared.metrics.request_finished();
            }
        };
        if quick {
            run();
        } else {
            tokio::task::spawn_blocking(run);
        }
    };
    // Let the calls still running finish and their replies go out (bounded by the write
    // timeout), then close.
    let _ = tokio::time::timeout(write_timeout, conn_slots.acquire_many(per_conn as u32)).await;
    sink.close();
    let _ = writer.await;
    result
}

/// Whether the client has already sent more than we have read (a pipelined request).
fn bytes_waiting(socket: &tokio::net::tcp::OwnedReadHalf) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(socket.as_ref().as_raw_fd(), libc::FIONREAD, &mut n) };
    r != 0 || n > 0
}

/// Sends queued replies in order; exits when the connection is closed or the client stops
/// reading for longer than `timeout`.
async fn drain_replies(sink: Arc<ReplySink>, timeout: Duration, peer: SocketAddr) {
    loop {
        sink.wake_writer.notified().await;
        loop {
            // Decide under the lock; wait for the socket outside it.
            let blocked = {
                let mut st = sink.state.lock();
                if st.closed {
                    st.queue.clear();
                    return;
                }
                let Some(mut out) = st.queue.pop_front() else {
                    st.draining = false;
                    break;
                };
                // Sending while holding the lock keeps bytes in order; it never blocks.
                match sink.try_send(&mut out, true) {
                    Sent::All => false,
                    Sent::Failed => {
                        st.closed = true;
                        st.queue.clear();
                        return;
                    }
                    Sent::Partly => {
                        st.queue.push_front(out);
                        true
                    }
                }
            };
            if blocked {
                let ready = tokio::time::timeout(timeout, sink.socket.as_ref().writable()).await;
                if !matches!(ready, Ok(Ok(()))) {
                    tracing::warn!(client = %peer, "client is not reading its replies; closing the connection");
                    sink.close();
                    return;
                }
            }
        }
    }
}
