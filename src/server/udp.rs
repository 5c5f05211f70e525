//! RPC over UDP: one datagram, one call. Used by MOUNT and portmap clients that prefer it.

use super::Shared;
use crate::rpc::message::encode_auth_error;
use crate::rpc::{AuthStat, Transport};
use crate::xdr::XdrWriter;
use std::borrow::Cow;
use std::net::SocketAddr;
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
        let slot = shared.global_slot(None).await;
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
            let local = if is_portmap_call(&buf) { reply_source(local, peer) } else { local };
            if let Some(reply) = shared.dispatcher.handle(&buf, peer, local, Transport::Udp) {
                // Datagrams carry no record mark; procedures never leave data in files for UDP.
                let body = &reply.bytes[4..];
                if reply.file.is_some() {
                    tracing::error!(client = %peer, "reply with file data over UDP; dropped");
                } else if body.len() > MAX_DATAGRAM {
                    tracing::warn!(client = %peer, bytes = body.len(), "reply too large for a datagram; dropped");
                } else {
                    if let Some(answer) = guarded_answer(&shared, peer, buf.len(), body) {
                        if let Err(e) = socket.try_send_to(&answer, peer) {
                            // UDP is best effort: the client retransmits.
                            tracing::debug!(client = %peer, error = %e, "udp reply not sent");
                        }
                    }
                }
            }
            drop(slot);
        });
    }
}

/// Whether a datagram is a call to portmap (program 100000 at byte 12), whose GETADDR
/// and DUMP hand out the server's address.
fn is_portmap_call(datagram: &[u8]) -> bool {
    datagram.get(12..16) == Some(&crate::portmap::PROGRAM.to_be_bytes()[..])
}

/// The address portmap hands out to `peer` as the server's: the socket's own, or, where
/// it listens on every address, the source address the kernel routes replies to `peer`
/// from (asked of a UDP socket connected to `peer`, which sends nothing). A connected TCP
/// socket knows the address it was reached on; a datagram does not say. On a host with
/// several addresses in one subnet the routed one may differ from the one the client
/// called, where `IP_PKTINFO` would tell; it is not 0.0.0.0, which names no host.
fn reply_source(local: SocketAddr, peer: SocketAddr) -> SocketAddr {
    if !local.ip().is_unspecified() {
        return local;
    }
    let any: SocketAddr = if peer.is_ipv4() { (std::net::Ipv4Addr::UNSPECIFIED, 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    std::net::UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(peer)?;
            s.local_addr()
        })
        .map_or(local, |routed| SocketAddr::new(routed.ip(), local.port()))
}

/// A datagram's source address can be forged, so a reply larger than its call would let
/// anyone reflect amplified traffic at a third party (portmap DUMP and MOUNT EXPORT
/// answer a 40-byte call with hundreds of bytes). Such a reply goes only to a client some
/// export admits; any other source gets `AUTH_ERROR`/`AUTH_TOOWEAK` (20 bytes, smaller
/// than any whole call) and can ask again over TCP, whose source address is real.
/// Returns what to send for `reply`, if anything.
fn guarded_answer<'a>(shared: &Shared, peer: SocketAddr, call_len: usize, reply: &'a [u8]) -> Option<Cow<'a, [u8]>> {
    if reply.len() <= call_len || shared.state.admits_anywhere(peer.ip()) {
        return Some(Cow::Borrowed(reply));
    }
    shared.metrics.record_rpc_error("udp_reply_larger_than_call");
    tracing::debug!(client = %peer, call = call_len, reply = reply.len(), "large UDP reply to a client no export admits: refused");
    refusal_within(call_len, reply).map(Cow::Owned)
}

/// The refusal of `reply`, unless even that is larger than the call (one cut short of a
/// whole header): then nothing is sent.
fn refusal_within(call_len: usize, reply: &[u8]) -> Option<Vec<u8>> {
    Some(reflection_refusal(reply)).filter(|refusal| refusal.len() <= call_len)
}

/// `AUTH_ERROR`/`AUTH_TOOWEAK` with the XID of `reply` (its first word).
fn reflection_refusal(reply: &[u8]) -> Vec<u8> {
    let xid = u32::from_be_bytes(reply[..4].try_into().expect("a reply starts with its xid"));
    let mut w = XdrWriter::new();
    encode_auth_error(&mut w, xid, AuthStat::TooWeak);
    w.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_smaller_than_any_call_and_keeps_the_xid() {
        let refusal = reflection_refusal(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1, 0, 0, 0, 0]);
        // The smallest call: xid, type, rpcvers, prog, vers, proc, two empty auths.
        assert!(refusal.len() < 40, "{} bytes", refusal.len());
        let words: Vec<u32> = refusal.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
        // xid, REPLY, MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK
        assert_eq!(words, [0xdeadbeef, 1, 1, 1, 5]);
    }

    #[test]
    fn a_call_cut_short_gets_no_refusal_larger_than_itself() {
        // 8 bytes (xid and CALL) draw a 20-byte AUTH_BADCRED; its 20-byte refusal would
        // still reflect more than came in.
        let reply = [0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1];
        assert_eq!(refusal_within(8, &reply), None);
        assert!(refusal_within(40, &reply).is_some_and(|r| r.len() <= 40));
    }
}
