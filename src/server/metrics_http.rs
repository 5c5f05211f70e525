//! A minimal HTTP endpoint for Prometheus scrapes: `GET /metrics` only.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut got = 0;
            // Read the request head (bounded in size and time).
            let head_done = tokio::time::timeout(Duration::from_secs(5), async {
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
            let _ = stream.write_all(resp.as_bytes()).await;
        });
    }
}
