//! A minimal HTTP endpoint for Prometheus scrapes: `GET /metrics` only.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Scrapes served at once; more wait in the listen backlog.
const CONCURRENT_SCRAPES: usize = 16;
/// For the request to arrive, and again for the reply to be taken.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let scrapes = Arc::new(Semaphore::new(CONCURRENT_SCRAPES));
    loop {
        let Ok(scrape) = scrapes.clone().acquire_owned().await else { return };
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends leave the listener ready: back off instead of spinning.
                tracing::debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _scrape = scrape;
            let mut buf = vec![0u8; 4096];
            let mut got = 0;
            // Read the request head (bounded in size and time).
            let head_done = tokio::time::timeout(SCRAPE_TIMEOUT, async {
                while got < buf.len() {
                    match stream.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => got += n,
                    }
                    if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") || buf[..got].windows(2).any(|w| w == b"\n\n") {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false);
            if !head_done {
                return;
            }
            let line = String::from_utf8_lossy(&buf[..got]);
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
        });
    }
}
