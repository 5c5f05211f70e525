//! RPC over UDP: one datagram, one call. Used by MOUNT and portmap clients that prefer it.

use super::Shared;
use crate::rpc::Transport;
use std::sync::Arc;
use tokio::net::UdpSocket;

/// Largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65507;

pub(crate) async fn serve(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let local = match socket.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        let slot = shared.global_requests.clone().acquire_owned().await.expect("never closed");
        let mut buf = vec![0u8; 65536];
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "udp receive failed");
                continue;
            }
        };
        buf.truncate(n);
        let shared = shared.clone();
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(reply) = shared.dispatcher.handle(&buf, peer, local, Transport::Udp) {
                // Datagrams carry no record mark; procedures never leave data in files for UDP.
                let body = &reply.bytes[4..];
                if reply.file.is_some() {
                    tracing::error!(client = %peer, "reply with file data over UDP; dropped");
                } else if body.len() > MAX_DATAGRAM {
                    tracing::warn!(client = %peer, bytes = body.len(), "reply too large for a datagram; dropped");
                } else if let Err(e) = socket.try_send_to(body, peer) {
                    // UDP is best effort: the client retransmits.
                    tracing::debug!(client = %peer, error = %e, "udp reply not sent");
                }
            }
            drop(slot);
        });
    }
}
