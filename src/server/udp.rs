//! RPC over UDP: one datagram, one call. Used by MOUNT and portmap clients that prefer it.

use super::Shared;
use crate::rpc::Transport;
use std::sync::Arc;
use tokio::net::UdpSocket;

const MAX_DATAGRAM: usize = 65536;

pub(crate) async fn serve(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let local = match socket.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        let slot = shared.global_requests.clone().acquire_owned().await.expect("never closed");
        let mut buf = vec![0u8; MAX_DATAGRAM];
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
                // Datagrams carry no record mark.
                if reply.len() - 4 <= MAX_DATAGRAM {
                    // UDP is best effort: a full socket buffer drops the reply, and the
                    // client retransmits.
                    let _ = socket.try_send_to(&reply[4..], peer);
                }
            }
            drop(slot);
        });
    }
}
