//! RPC over TCP: one reader and one writer task per connection. Requests are read as
//! fast as the limits allow, run concurrently on worker threads, and their replies are
//! written in completion order, batched into as few syscalls as the queue allows.

use super::Shared;
use crate::rpc::record::read_record;
use crate::rpc::Transport;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// A reply on its way out, holding the request slots it used until it is written.
struct Outgoing {
    reply: Arc<Vec<u8>>,
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
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
    let per_conn = shared.limits.max_requests_per_connection.max(1);
    let (tx, rx) = mpsc::channel::<Outgoing>(per_conn);
    let write_timeout = Duration::from_secs(shared.limits.write_timeout_secs);
    let writer = tokio::spawn(write_replies(wr, rx, write_timeout, peer));
    let conn_slots = Arc::new(Semaphore::new(per_conn));
    let idle = Duration::from_secs(shared.limits.idle_timeout_secs);
    let result = loop {
        // Take both slots before reading, so a connection cannot read more requests than
        // it may run: this is the back-pressure that bounds memory.
        let conn_slot = conn_slots.clone().acquire_owned().await.expect("never closed");
        let global_slot = shared.global_requests.clone().acquire_owned().await.expect("never closed");
        let mut record = Vec::new();
        let read = tokio::select! {
            r = tokio::time::timeout(idle, read_record(&mut rd, &shared.record_limits, &mut record)) => r,
            _ = tx.closed() => break Ok(()),
        };
        match read {
            Err(_) => break Err(anyhow::anyhow!("idle for {idle:?}")),
            Ok(Err(e)) => break Err(e.into()),
            Ok(Ok(false)) => break Ok(()),
            Ok(Ok(true)) => {}
        }
        let shared = shared.clone();
        let tx = tx.clone();
        shared.metrics.request_started();
        tokio::task::spawn_blocking(move || {
            let reply = shared.dispatcher.handle(&record, peer, local, Transport::Tcp);
            drop(record);
            if let Some(reply) = reply {
                let _ = tx.blocking_send(Outgoing { reply, _slots: (conn_slot, global_slot) });
            }
            shared.metrics.request_finished();
        });
    };
    drop(tx);
    // Let replies already computed go out before closing.
    let _ = writer.await;
    result
}

async fn write_replies(wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>, timeout: Duration, peer: SocketAddr) {
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < 64 {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let send = async {
            for out in &batch {
                w.write_all(&out.reply).await?;
            }
            w.flush().await
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(client = %peer, error = %e, "write failed");
                return;
            }
            Err(_) => {
                tracing::warn!(client = %peer, "client is not reading its replies; closing the connection");
                return;
            }
        }
    }
}
