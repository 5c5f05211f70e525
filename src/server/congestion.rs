//! TCP congestion control of NFS and MOUNT connections.
//!
//! A connection whose client is on this host (loopback, or the server's own address)
//! crosses no network: there is no queue to keep short and no other flow to be fair to.
//! A pacing algorithm (bbr) still paces it, and on a virtual machine each paced send arms
//! an hrtimer, which costs nasd two to three times the CPU per MiB read and halves 1 MiB
//! reads (docs/performance.md, changes 21 and 23). So where the system's default paces and
//! no algorithm is configured, the listeners take one that does not (cubic, or reno), and
//! each connection from another host is switched back to the system's default as it is
//! accepted. Pacing is decided when a connection is set up (bbr marks the socket for
//! pacing in its init), so the unpaced algorithm has to be the listener's: switching a
//! paced connection to cubic afterwards leaves it paced.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use tokio::net::TcpListener;

use super::UsageError;

/// Algorithms that do not pace, in order of preference; reno is built into every kernel.
const UNPACED: [&str; 2] = ["cubic", "reno"];

/// Which congestion control each accepted connection gets, decided at start from the
/// system's default then (a later change of the default is not followed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Every connection keeps what its listener gave it: the configured algorithm, or the
    /// system's default where that does not pace.
    Inherit,
    /// The listeners run `listener`, which does not pace; a connection from another host
    /// is switched to `remote`, the system's default.
    UnpacedOnThisHost { listener: String, remote: String },
}

impl Policy {
    /// Sets the listeners' algorithm: `configured` for every connection where it is given
    /// (refused where the kernel lacks it), else an unpaced one for this host's clients
    /// where the system's default paces.
    pub(crate) fn apply(listeners: &[TcpListener], configured: Option<&str>) -> anyhow::Result<Policy> {
        if let Some(name) = configured {
            for listener in listeners {
                set_on_listener(listener, name)?;
            }
            tracing::info!(algorithm = %name, "TCP congestion control of NFS connections");
            return Ok(Policy::Inherit);
        }
        let Some(first) = listeners.first() else { return Ok(Policy::Inherit) };
        // A new socket starts with the default of its network namespace.
        let system = match congestion_control(first.as_raw_fd()) {
            Ok(name) => name,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the TCP congestion control of the listener; connections keep the system's");
                return Ok(Policy::Inherit);
            }
        };
        if !paces(&system) {
            return Ok(Policy::Inherit);
        }
        let Some(unpaced) = UNPACED.iter().find(|name| set_congestion_control(first.as_raw_fd(), name).is_ok()) else {
            tracing::warn!(algorithm = %system, "no unpaced TCP congestion control can be set (cubic, reno); connections from this host are paced too");
            return Ok(Policy::Inherit);
        };
        for listener in &listeners[1..] {
            // A listener left at the default is harmless: its connections differ from the
            // unpaced algorithm, so they are never switched and keep the default.
            if let Err(e) = set_congestion_control(listener.as_raw_fd(), unpaced) {
                tracing::warn!(algorithm = %unpaced, error = %e, "cannot set a listener's congestion control; its connections keep the system's");
            }
        }
        tracing::info!(
            this_host = %unpaced,
            other_hosts = %system,
            "TCP congestion control: connections from this host are not paced, other hosts get the system's default"
        );
        Ok(Policy::UnpacedOnThisHost { listener: unpaced.to_string(), remote: system })
    }

    /// What a connection accepted on `local` from `peer` should be switched to, if
    /// anything. `current` is what it has: one that differs from the listener's was
    /// chosen by a route (`ip route … congctl`), which wins. (A route naming the
    /// listener's own algorithm cannot be told from none; with `congctl lock` the kernel
    /// refuses the switch, and the connection keeps the route's.)
    fn switch_for(&self, peer: IpAddr, local: IpAddr, current: &str) -> Option<&str> {
        match self {
            Policy::UnpacedOnThisHost { listener, remote } if !on_this_host(peer, local) && current == listener => Some(remote),
            _ => None,
        }
    }

    /// Gives a just accepted connection the algorithm this policy wants for it.
    pub(crate) fn on_accept(&self, socket: &impl AsRawFd, peer: SocketAddr, local: SocketAddr) {
        if matches!(self, Policy::Inherit) {
            return;
        }
        let fd = socket.as_raw_fd();
        let current = match congestion_control(fd) {
            Ok(name) => name,
            Err(e) => {
                tracing::debug!(client = %peer, error = %e, "cannot read the connection's congestion control");
                return;
            }
        };
        if let Some(wanted) = self.switch_for(peer.ip(), local.ip(), &current) {
            match set_congestion_control(fd, wanted) {
                Ok(()) => {}
                // A route's `congctl lock` fixes the algorithm: the route's choice stands.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    tracing::debug!(client = %peer, algorithm = %wanted, "a route locks the connection's congestion control")
                }
                Err(e) => tracing::warn!(client = %peer, algorithm = %wanted, error = %e, "cannot set the connection's congestion control"),
            }
        }
    }
}

/// Whether the kernel paces connections that use `algorithm` (bbr and its successors
/// mark their sockets for pacing; the loss-based ones do not).
pub(crate) fn paces(algorithm: &str) -> bool {
    algorithm.starts_with("bbr")
}

/// Whether a connection between `peer` and `local` stays on this host: the kernel routes
/// traffic to a loopback address or to the host's own address over the loopback device.
fn on_this_host(peer: IpAddr, local: IpAddr) -> bool {
    let (peer, local) = (peer.to_canonical(), local.to_canonical());
    peer.is_loopback() || peer == local
}

/// Has `listener`'s connections use `name`: accepted sockets inherit it from their
/// listener (a route's `congctl` still takes precedence). Refused where the kernel lacks
/// the algorithm, or, without `CAP_NET_ADMIN`, where
/// `net.ipv4.tcp_allowed_congestion_control` does not list it.
fn set_on_listener(listener: &TcpListener, name: &str) -> anyhow::Result<()> {
    let Err(e) = set_congestion_control(listener.as_raw_fd(), name) else { return Ok(()) };
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) => {
            let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default();
            format!(" (this kernel has: {}; a module may add more, e.g. tcp_{name})", available.trim())
        }
        Some(libc::EPERM) => " (not in net.ipv4.tcp_allowed_congestion_control, and nasd is not root)".to_string(),
        _ => String::new(),
    };
    Err(UsageError(format!("tcp_congestion = {name:?} cannot be used: {e}{hint}")).into())
}

fn set_congestion_control(fd: RawFd, name: &str) -> std::io::Result<()> {
    // SAFETY: setsockopt reads `name.len()` bytes from a live string.
    let rc = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), name.len() as libc::socklen_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The congestion control a TCP socket uses.
fn congestion_control(fd: RawFd) -> std::io::Result<String> {
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `name`.
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let name = &name[..(len as usize).min(name.len())];
    Ok(String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_and_the_hosts_own_address_are_this_host() {
        for (peer, local) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.3.4.5", "127.0.0.1"),
            ("::1", "::1"),
            ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
            ("::ffff:127.0.0.1", "::"),
            ("192.0.2.7", "192.0.2.7"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
        ] {
            assert!(on_this_host(ip(peer), ip(local)), "{peer} to {local}");
        }
        for (peer, local) in [("192.0.2.8", "192.0.2.7"), ("2001:db8::2", "2001:db8::1"), ("::ffff:10.0.0.2", "::ffff:10.0.0.1")] {
            assert!(!on_this_host(ip(peer), ip(local)), "{peer} to {local}");
        }
    }

    #[test]
    fn only_other_hosts_are_switched_back_and_a_routes_choice_stands() {
        let policy = Policy::UnpacedOnThisHost { listener: "cubic".into(), remote: "bbr".into() };
        assert_eq!(policy.switch_for(ip("192.0.2.8"), ip("192.0.2.7"), "cubic"), Some("bbr"));
        assert_eq!(policy.switch_for(ip("127.0.0.1"), ip("127.0.0.1"), "cubic"), None);
        assert_eq!(policy.switch_for(ip("192.0.2.7"), ip("192.0.2.7"), "cubic"), None);
        // A route's congctl gave this connection another algorithm: it keeps it.
        assert_eq!(policy.switch_for(ip("192.0.2.8"), ip("192.0.2.7"), "reno"), None);
        assert_eq!(Policy::Inherit.switch_for(ip("192.0.2.8"), ip("192.0.2.7"), "bbr"), None);
    }

    #[test]
    fn bbr_paces_and_loss_based_algorithms_do_not() {
        assert!(paces("bbr") && paces("bbr3"));
        assert!(!paces("cubic") && !paces("reno") && !paces("dctcp"));
    }

    #[tokio::test]
    async fn connections_accepted_on_a_listener_take_its_congestion_control() {
        let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
        // reno is built into every kernel; pick it unless it is already the default, so
        // the test can tell the setting from the default.
        let wanted = if system.trim() == "reno" { "cubic" } else { "reno" };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert_eq!(Policy::apply(std::slice::from_ref(&listener), Some(wanted)).unwrap(), Policy::Inherit);
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(congestion_control(accepted.as_raw_fd()).unwrap(), wanted);
        // The client's end keeps the system's default: the setting is the server's alone.
        assert_eq!(congestion_control(client.as_raw_fd()).unwrap(), system.trim());
    }

    #[tokio::test]
    async fn an_algorithm_the_kernel_lacks_is_refused_naming_it_and_what_there_is() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = set_on_listener(&listener, "nosuchalgo").unwrap_err().to_string();
        assert!(err.contains("\"nosuchalgo\"") && err.contains("this kernel has: ") && err.contains("reno"), "{err}");
    }

    #[tokio::test]
    async fn without_a_configured_algorithm_a_pacing_default_gives_way_on_this_host() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let system = congestion_control(listener.as_raw_fd()).unwrap();
        let policy = Policy::apply(std::slice::from_ref(&listener), None).unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, peer) = listener.accept().await.unwrap();
        policy.on_accept(&accepted, peer, accepted.local_addr().unwrap());
        let got = congestion_control(accepted.as_raw_fd()).unwrap();
        if paces(&system) {
            let Policy::UnpacedOnThisHost { listener, remote } = &policy else { panic!("{policy:?} under {system}") };
            assert!(UNPACED.contains(&listener.as_str()), "{listener}");
            assert_eq!(remote, &system);
            assert_eq!(&got, listener);
        } else {
            // Where the default paces, this path is also covered by the integration test
            // that sets bbr in network namespaces of its own.
            assert_eq!(policy, Policy::Inherit);
            assert_eq!(got, system);
        }
    }
}
