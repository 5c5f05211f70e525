//! A minimal HTTP endpoint for Prometheus scrapes: `GET /metrics` only.

use crate::metrics::Metrics;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};

/// Connections served at once; more wait in the listen backlog (one of them accepted).
const CONCURRENT_SCRAPES: usize = 16;
/// For the request to arrive, and again for the reply to be taken.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_HEAD_MAX: usize = 4096;

/// Connections whose request has not arrived yet, oldest first. When every place is
/// taken, a new connection ends the oldest of these: a scraper sends its request at once,
/// so a handful of idle connections cannot keep scrapes out for `SCRAPE_TIMEOUT` each.
/// (A flood of connections can still end a scraper's in the moment between its connect
/// and its request; it tries again at its next interval.)
#[derive(Default)]
struct AwaitingRequest {
    queue: Mutex<VecDeque<(u64, Arc<Notify>)>>,
}

impl AwaitingRequest {
    fn enter(&self, id: u64) -> Arc<Notify> {
        let told = Arc::new(Notify::new());
        self.queue.lock().push_back((id, told.clone()));
        told
    }

    fn leave(&self, id: u64) {
        self.queue.lock().retain(|(i, _)| *i != id);
    }

    /// Ends the oldest connection still waiting for its request; false if there is none.
    fn end_oldest(&self) -> bool {
        match self.queue.lock().pop_front() {
            // `notify_one` keeps the wake-up for a task not yet waiting on it.
            Some((_, told)) => {
                told.notify_one();
                true
            }
            None => false,
        }
    }
}

pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let places = Arc::new(Semaphore::new(CONCURRENT_SCRAPES));
    let awaiting = Arc::new(AwaitingRequest::default());
    let mut next_id = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends leave the listener ready: back off instead of spinning.
                tracing::debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let place = loop {
            match places.clone().try_acquire_owned() {
                Ok(place) => break place,
                Err(tokio::sync::TryAcquireError::Closed) => return,
                Err(tokio::sync::TryAcquireError::NoPermits) => {}
            }
            if awaiting.end_oldest() {
                tracing::debug!("metrics: every place taken; the oldest connection yet to send a request is closed");
            }
            // The one ended may have had its request just in (it is being answered), and
            // every place may be answering (SCRAPE_TIMEOUT at most): look again shortly.
            if let Ok(Ok(place)) = tokio::time::timeout(Duration::from_millis(100), places.clone().acquire_owned()).await {
                break place;
            }
        };
        next_id += 1;
        let id = next_id;
        // Listed before its task runs, so that the next connection can end it at once.
        let told_to_end = awaiting.enter(id);
        let (metrics, awaiting) = (metrics.clone(), awaiting.clone());
        tokio::spawn(async move {
            let (_place, mut stream) = (place, stream);
            let head = tokio::select! {
                head = tokio::time::timeout(SCRAPE_TIMEOUT, read_request_head(&mut stream)) => head.ok().flatten(),
                _ = told_to_end.notified() => None,
            };
            awaiting.leave(id);
            if let Some(head) = head {
                answer(stream, &head, &metrics).await;
            }
        });
    }
}

/// The request up to its blank line, or None if the peer closed or sent too much.
async fn read_request_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; REQUEST_HEAD_MAX];
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got += n,
        }
        if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") || buf[..got].windows(2).any(|w| w == b"\n\n") {
            buf.truncate(got);
            return Some(buf);
        }
    }
    None
}

async fn answer(mut stream: TcpStream, head: &[u8], metrics: &Metrics) {
    let line = String::from_utf8_lossy(head);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if line.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
        ("200 OK", metrics.render())
    } else {
        ("404 Not Found", "not found: try /metrics\n".to_string())
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A peer that does not take the reply must not keep its task and socket.
    let _ = tokio::time::timeout(SCRAPE_TIMEOUT, stream.write_all(resp.as_bytes())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every place held by a connection that sends nothing: a scrape is still answered, and
    /// only the oldest idle connection was closed for it (had the scrape waited for their
    /// time to run out, all of them would be closed).
    #[tokio::test]
    async fn idle_connections_holding_every_place_do_not_keep_a_scrape_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(serve(listener, metrics));
        let mut idle = Vec::new();
        for _ in 0..CONCURRENT_SCRAPES {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut scrape = TcpStream::connect(addr).await.unwrap();
        scrape.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
        let mut reply = String::new();
        tokio::time::timeout(SCRAPE_TIMEOUT * 3, scrape.read_to_string(&mut reply)).await.expect("scrape answered").unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        let mut closed = Vec::new();
        for (i, conn) in idle.iter_mut().enumerate() {
            let mut byte = [0u8; 1];
            if let Ok(read) = tokio::time::timeout(Duration::from_millis(50), conn.read(&mut byte)).await {
                assert_eq!(read.unwrap(), 0, "an idle connection got data");
                closed.push(i);
            }
        }
        assert_eq!(closed, [0], "only the oldest idle connection is closed");
    }
}
