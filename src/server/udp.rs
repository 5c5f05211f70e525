//! RPC over UDP: one datagram, one call. Used by MOUNT and portmap clients that prefer it.

use super::Shared;
use crate::rpc::message::encode_auth_error;
use crate::rpc::{AuthStat, Transport};
use crate::sockaddr;
use crate::xdr::XdrWriter;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65507;

pub(crate) async fn serve(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let bound = match socket.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        let mut buf = vec![0u8; 65536];
        let received = socket.async_io(Interest::READABLE, || receive(socket.as_raw_fd(), &mut buf)).await;
        let (n, peer, arrival) = match received {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "udp receive failed");
                continue;
            }
        };
        buf.truncate(n);
        // Taken once a call is here, not while waiting for one: an idle socket holding a
        // slot would leave TCP that many fewer (all of them at `max_requests_in_flight =
        // 1`). Nothing more is read from the socket until the call has one: the kernel's
        // buffer holds, then drops, what comes meanwhile, and clients retransmit.
        let slot = shared.global_slot(None).await;
        // Where the client called: the socket's own address, or on a socket bound to every
        // address (the only kind asked to report it, `report_destinations`) the one the
        // kernel reported.
        let local = arrival.map_or(bound, |a| SocketAddr::new(a.addr, bound.port()));
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
                } else {
                    if let Some(answer) = guarded_answer(&shared, peer, &buf, body) {
                        // From the address called: a client that called a second address
                        // of this host drops a reply from the first.
                        if let Err(e) = send(socket.as_raw_fd(), &answer, peer, arrival) {
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

/// Has the kernel say, with each datagram, which of this host's addresses it was sent to
/// (`IP_PKTINFO`, `IPV6_RECVPKTINFO`): needed on a socket bound to every address, whose
/// replies must come from the address the client called, and whose portmap answers name
/// that address. An IPv6 socket is asked for `IP_PKTINFO` too, for the IPv4 calls a
/// dual-stack one hears: only it names the interface's own address for a broadcast,
/// where `IPV6_PKTINFO` gives the broadcast address.
pub(crate) fn report_destinations(socket: &impl AsRawFd, local: SocketAddr) -> std::io::Result<()> {
    let set = |level, option| {
        let on: libc::c_int = 1;
        // SAFETY: a valid descriptor and an int option of the given size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                option,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of_val(&on) as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    match local {
        SocketAddr::V4(_) => set(libc::IPPROTO_IP, libc::IP_PKTINFO),
        SocketAddr::V6(_) => {
            set(libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO)?;
            // An IPv6-only socket hears no IPv4 call; `IPV6_PKTINFO` alone then does.
            let _ = set(libc::IPPROTO_IP, libc::IP_PKTINFO);
            Ok(())
        }
    }
}

/// Room for the packet-info control messages of a datagram (an IPv4 call on a dual-stack
/// socket brings both kinds), aligned for `cmsghdr`.
#[repr(C, align(8))]
struct Control([u8; 128]);

impl Control {
    fn new() -> Self {
        Self([0; 128])
    }
}

/// Where a datagram arrived: the local address to answer from and the interface.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    addr: IpAddr,
    ifindex: u32,
}

/// A message header for one datagram: its address `name` (`len` bytes of it used) and
/// its data `iov`; no control messages yet.
fn message(name: &mut libc::sockaddr_storage, len: libc::socklen_t, iov: &mut libc::iovec) -> libc::msghdr {
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = len;
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg
}

/// Receives one datagram into `buf`: its length, its sender and, where the socket reports
/// it, where it arrived.
fn receive(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr, Option<Arrival>)> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = Control::new();
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut msg = message(&mut name, std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t, &mut iov);
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: every pointer in `msg` points at a live buffer of the length given.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let peer = sockaddr::from_c(&name).ok_or_else(|| std::io::Error::other("datagram from an address that is not IP"))?;
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Ok((n as usize, peer, None));
    }
    let (mut arrival_v4, mut arrival_v6) = (None, None);
    // SAFETY: the kernel filled `msg_controllen` bytes of control messages; one is read
    // only if its length covers the structure, unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let holds = |size: usize| (*c).cmsg_len as usize >= libc::CMSG_LEN(size as u32) as usize;
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) if holds(std::mem::size_of::<libc::in_pktinfo>()) => {
                    // `ipi_spec_dst`, as knfsd answers from: the address called, or for a
                    // broadcast the receiving interface's own address.
                    let info: libc::in_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    let addr = IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_spec_dst.s_addr)));
                    arrival_v4 = Some(Arrival { addr, ifindex: 0 });
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if holds(std::mem::size_of::<libc::in6_pktinfo>()) => {
                    let info: libc::in6_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    let addr = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                    // A multicast group is no address to answer from: the kernel chooses.
                    if !addr.is_multicast() {
                        arrival_v6 = Some(Arrival { addr: IpAddr::V6(addr), ifindex: info.ipi6_ifindex });
                    }
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // For an IPv4 call on a dual-stack socket, both: the IPv4 one names the interface's
    // address where the IPv6 one names a broadcast.
    Ok((n as usize, peer, arrival_v4.or(arrival_v6)))
}

/// Sends `payload` to `peer` without waiting (UDP is best effort: the client resends),
/// from where the call arrived when that is known. Should the kernel refuse that source
/// (EINVAL, ENETUNREACH or EADDRNOTAVAIL: an address that is no longer this host's, or
/// one it cannot send from), it chooses one itself.
fn send(fd: RawFd, payload: &[u8], peer: SocketAddr, from: Option<Arrival>) -> std::io::Result<()> {
    match send_from(fd, payload, peer, from) {
        Err(e) if from.is_some() && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENETUNREACH | libc::EADDRNOTAVAIL)) => {
            send_from(fd, payload, peer, None)
        }
        sent => sent,
    }
}

fn send_from(fd: RawFd, payload: &[u8], peer: SocketAddr, from: Option<Arrival>) -> std::io::Result<()> {
    let (mut name, name_len) = sockaddr::to_c(peer);
    let mut control = Control::new();
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    let mut msg = message(&mut name, name_len, &mut iov);
    if let Some(from) = from {
        // The socket's family decides the message: a v6 socket takes a v4 client's reply
        // source as a v4-mapped address.
        match (peer, from.addr) {
            (SocketAddr::V4(_), IpAddr::V4(a)) => {
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr { s_addr: u32::from(a).to_be() },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                put_control(&mut msg, &mut control, libc::IPPROTO_IP, libc::IP_PKTINFO, info);
            }
            (SocketAddr::V6(_), addr) => {
                let a = match addr {
                    IpAddr::V6(a) => a,
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                };
                // The interface it came in on, as knfsd answers: a link-local source needs it.
                let info = libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: a.octets() }, ipi6_ifindex: from.ifindex };
                put_control(&mut msg, &mut control, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info);
            }
            (SocketAddr::V4(_), IpAddr::V6(_)) => return Err(std::io::Error::other("an IPv6 source for an IPv4 client")),
        }
    }
    // SAFETY: every pointer in `msg` points at a live buffer of the length given.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `value` the one control message of `msg`, in `control`.
fn put_control<T: Copy>(msg: &mut libc::msghdr, control: &mut Control, level: libc::c_int, kind: libc::c_int, value: T) {
    let size = std::mem::size_of::<T>() as u32;
    // SAFETY: the buffer holds a message of this size (asserted), and the header and the
    // value are written within it, the value unaligned.
    unsafe {
        let space = libc::CMSG_SPACE(size) as usize;
        assert!(space <= control.0.len(), "the control message fits its buffer");
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(msg);
        (*c).cmsg_level = level;
        (*c).cmsg_type = kind;
        (*c).cmsg_len = libc::CMSG_LEN(size) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<T>(), value);
    }
}

/// A datagram's source address can be forged, so a reply larger than its call would let
/// anyone reflect amplified traffic at a third party (portmap DUMP and MOUNT EXPORT
/// answer a 40-byte call with hundreds of bytes). Such a reply goes only to a client some
/// export admits; any other source gets `AUTH_ERROR`/`AUTH_TOOWEAK` (20 bytes, smaller
/// than any whole call) and can ask again over TCP, whose source address is real.
/// The listings (portmap DUMP, MOUNT DUMP and EXPORT), which answer a small call with up
/// to a datagram, go only to a client a rule names: an export for `*` admits every
/// address, forged ones too. Returns what to send for `reply`, if anything.
fn guarded_answer<'a>(shared: &Shared, peer: SocketAddr, call: &[u8], reply: &'a [u8]) -> Option<Cow<'a, [u8]>> {
    let call_len = call.len();
    if reply.len() <= call_len {
        return Some(Cow::Borrowed(reply));
    }
    let vouched = if is_listing(call) { shared.state.names_anywhere(peer.ip()) } else { shared.state.admits_anywhere(peer.ip()) };
    if vouched {
        return Some(Cow::Borrowed(reply));
    }
    shared.metrics.record_rpc_error("udp_reply_larger_than_call");
    tracing::debug!(client = %peer, call = call_len, reply = reply.len(), "large UDP reply to a client no export admits: refused");
    refusal_within(call_len, reply).map(Cow::Owned)
}

/// Whether `call` asks for a listing: portmap's or rpcbind's DUMP, GETADDRLIST or GETSTAT,
/// MOUNT's DUMP or EXPORT (procedure numbers of every version served).
fn is_listing(call: &[u8]) -> bool {
    let word = |at: usize| call.get(at..at + 4).map(|w| u32::from_be_bytes(w.try_into().expect("4 bytes")));
    // xid, CALL, rpcvers, prog, vers, proc
    match (word(12), word(20)) {
        // GETADDRLIST too: a few entries, but twice to three times its call. GETSTAT's
        // lists grow with the services anyone asks for.
        (Some(crate::portmap::PROGRAM), Some(proc)) => {
            [crate::portmap::proc::DUMP, crate::portmap::proc::GETADDRLIST, crate::portmap::proc::GETSTAT].contains(&proc)
        }
        (Some(crate::mount3::PROGRAM), Some(proc)) => proc == crate::mount3::proc::DUMP || proc == crate::mount3::proc::EXPORT,
        _ => false,
    }
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

    /// A socket bound to `any` (every address) answers a client that called `called` from
    /// that address, reported as `expect`: the client's connected socket takes nothing else.
    fn answers_from_the_address_called(any: &str, called: &str, expect: &str) {
        let server = std::net::UdpSocket::bind(any).unwrap();
        report_destinations(&server, server.local_addr().unwrap()).unwrap();
        let port = server.local_addr().unwrap().port();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client.connect((called, port)).unwrap();
        client.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        client.send(b"call").unwrap();
        let mut buf = [0u8; 16];
        let (n, peer, arrival) = receive(server.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"call");
        let arrival = arrival.expect("the kernel said where the call arrived");
        assert_eq!(arrival.addr, expect.parse::<IpAddr>().unwrap());
        send(server.as_raw_fd(), b"reply", peer, Some(arrival)).unwrap();
        assert_eq!(client.recv(&mut buf).expect("the reply reached the connected client"), 5);
    }

    #[test]
    fn replies_leave_from_the_address_called() {
        answers_from_the_address_called("0.0.0.0:0", "127.0.0.2", "127.0.0.2");
        answers_from_the_address_called("0.0.0.0:0", "127.0.0.1", "127.0.0.1");
        // A dual-stack socket hears an IPv4 call from a v4-mapped address, and is told the
        // IPv4 address it arrived at (for a broadcast, the interface's own).
        if std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "0") {
            answers_from_the_address_called("[::]:0", "127.0.0.3", "127.0.0.3");
        }
    }

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
    fn listings_are_told_from_their_call_header() {
        let call = |prog, vers, proc| {
            let mut w = XdrWriter::new();
            crate::rpc::message::encode_call(&mut w, 7, prog, vers, proc, &crate::rpc::auth::Credential::None);
            w.into_inner()
        };
        let (pmap, mount, nfs) = (crate::portmap::PROGRAM, crate::mount3::PROGRAM, crate::nfs3::xdr::PROGRAM);
        for vers in [2, 3, 4] {
            assert!(is_listing(&call(pmap, vers, 4)), "portmap v{vers} DUMP");
            assert!(!is_listing(&call(pmap, vers, 3)), "portmap v{vers} GETPORT/GETADDR");
            assert!(is_listing(&call(pmap, vers, crate::portmap::proc::GETADDRLIST)), "rpcbind v{vers} GETADDRLIST");
            assert!(is_listing(&call(pmap, vers, crate::portmap::proc::GETSTAT)), "rpcbind v{vers} GETSTAT");
        }
        assert!(is_listing(&call(mount, 3, crate::mount3::proc::DUMP)));
        assert!(is_listing(&call(mount, 3, crate::mount3::proc::EXPORT)));
        assert!(!is_listing(&call(mount, 3, crate::mount3::proc::MNT)));
        assert!(!is_listing(&call(nfs, 3, 4)), "NFS procedure 4 is ACCESS");
        assert!(!is_listing(&call(nfs, 3, 5)));
        let cut = call(pmap, 2, 4);
        assert!(!is_listing(&cut[..22]), "a header cut short is no listing");
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
