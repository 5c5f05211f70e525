//! Socket addresses as the C library takes and gives them (for system calls that the
//! standard library does not wrap: `recvmsg`, `sendmsg`, `getnameinfo`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// The address a C socket address holds, if it is IPv4 or IPv6.
pub fn from_c(sa: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match sa.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), sin6.sin6_flowinfo, sin6.sin6_scope_id)))
        }
        _ => None,
    }
}

/// `addr` as a C socket address, with its length.
pub fn to_c(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage; each arm writes the struct its family
    // names, which fits in the storage.
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = unsafe { &mut *(&mut sa as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from(*a.ip()).to_be() };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = unsafe { &mut *(&mut sa as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (sa, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_round_trip_through_c() {
        for text in ["127.0.0.2:2049", "0.0.0.0:0", "[::1]:111", "[::ffff:10.1.2.3]:65535", "[fe80::1%3]:20049"] {
            let addr: SocketAddr = text.parse().unwrap();
            let (c, len) = to_c(addr);
            let size = if addr.is_ipv4() { std::mem::size_of::<libc::sockaddr_in>() } else { std::mem::size_of::<libc::sockaddr_in6>() };
            assert_eq!(len as usize, size, "{text}");
            assert_eq!(from_c(&c), Some(addr), "{text}");
        }
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_c(&unspec), None);
    }
}
