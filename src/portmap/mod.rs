//! Embedded portmapper / rpcbind (RFC 1833): program 100000, versions 2–4.
//!
//! It answers for the programs this server serves, so `mount -t nfs host:/path` works
//! with no system rpcbind, and for the services other programs on this host register
//! with SET (rpc.statd, which NFSv3 locking needs, among them). As rpcbind, it takes SET
//! and UNSET only from local callers (a loopback source address), and never for a
//! program this server serves itself. Every procedure of the three versions is
//! answered, GETSTAT's statistics (`rpcinfo -m`) among them (`stats.rs`).

pub mod stats;

use crate::rpc::{CallContext, ProcError, RpcProgram, Transport};
use crate::xdr::{XdrReader, XdrResult, XdrWriter};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

pub const PROGRAM: u32 = 100000;

pub mod proc {
    pub const SET: u32 = 1;
    pub const UNSET: u32 = 2;
    /// GETPORT (v2) and GETADDR (v3, v4).
    pub const GETADDR: u32 = 3;
    /// DUMP, in portmap v2 and rpcbind v3 and v4 alike.
    pub const DUMP: u32 = 4;
    /// CALLIT (v2, v3) and BCAST (v4): a call passed on to a program, mostly broadcast.
    pub const CALLIT: u32 = 5;
    pub const GETTIME: u32 = 6;
    /// Universal address to the transport's own (a `struct sockaddr`), and back.
    pub const UADDR2TADDR: u32 = 7;
    pub const TADDR2UADDR: u32 = 8;
    pub const GETVERSADDR: u32 = 9;
    /// CALLIT that answers errors too, for calls not broadcast.
    pub const INDIRECT: u32 = 10;
    pub const GETADDRLIST: u32 = 11;
    pub const GETSTAT: u32 = 12;
    /// Procedure names of rpcbind v4 (v2's GETPORT is v3's and v4's GETADDR), for logs
    /// and metrics.
    pub const NAMES: [&str; 13] = [
        "NULL", "SET", "UNSET", "GETPORT", "DUMP", "CALLIT", "GETTIME", "UADDR2TADDR", "TADDR2UADDR", "GETVERSADDR", "INDIRECT",
        "GETADDRLIST", "GETSTAT",
    ];
}
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
const MAX_STR: usize = 256;
/// Services other programs may register at once; each is a SET from a local caller, and
/// a host runs a handful.
const MAX_REGISTRATIONS: usize = 256;
/// Arguments of a call CALLIT passes on; only NULL's, which are empty, are looked at.
const MAX_CALLIT_ARGS: usize = 8192;
/// A transport address: a `struct sockaddr_storage`.
const MAX_TADDR: usize = 128;

/// One service the portmapper gives the address of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub program: u32,
    pub version: u32,
    pub protocol: u32,
    pub port: u16,
    /// `None`: one of this server's own, reached at the address called, in either
    /// family. `Some`: registered by another program with SET, for one family.
    pub registered: Option<RegisteredAt>,
}

/// Where a service another program registered listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredAt {
    /// The address it gave; the unspecified address (`0.0.0.0`, `::`) for all of its
    /// family, answered as the address called.
    pub ip: IpAddr,
    /// Registered from a reserved port, which only root binds (libtirpc's and glibc's
    /// clients of rpcbind bind one when they can): only such a caller unregisters it.
    pub privileged: bool,
}

impl Mapping {
    /// Whether a caller reaching the portmapper at `local` can reach this service.
    fn reachable_from(&self, local: IpAddr) -> bool {
        self.registered.is_none_or(|at| at.ip.is_ipv6() == local.is_ipv6())
    }

    /// The netid rpcbind names this service by, for a caller at `local`.
    fn netid(&self, local: IpAddr) -> &'static str {
        Portmap::netid(self.protocol, self.registered.map_or(local, |at| at.ip))
    }

    /// The universal address a caller at `local` reaches this service at.
    fn universal_address(&self, local: IpAddr) -> String {
        let ip = self.registered.map(|at| at.ip).filter(|ip| !ip.is_unspecified()).unwrap_or(local);
        Portmap::universal_address(ip, self.port)
    }

    fn owner(&self) -> &'static [u8] {
        // rpcbind's owner of a registration by a caller not on its local socket.
        if self.registered.is_some() {
            b"unknown"
        } else {
            b"nasd"
        }
    }
}

/// rpcb (versions 3 and 4) arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rpcb<'a> {
    pub program: u32,
    pub version: u32,
    pub netid: &'a [u8],
    pub addr: &'a [u8],
    pub owner: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args<'a> {
    Null,
    /// v2 SET/UNSET/GETPORT carry a mapping.
    Mapping(u32, u32, u32, u32),
    /// v3/v4 SET/UNSET/GETADDR/GETVERSADDR and v4 GETADDRLIST carry an rpcb.
    Rpcb(Rpcb<'a>),
    Dump,
    GetTime,
    /// CALLIT/BCAST/INDIRECT: program, version, procedure (its arguments are not needed).
    CallIt(u32, u32, u32),
    /// UADDR2TADDR: a universal address.
    UniversalAddress(&'a [u8]),
    /// TADDR2UADDR: a transport address (a netbuf's bytes).
    TransportAddress(&'a [u8]),
    GetStat,
}

impl<'a> Args<'a> {
    /// `None`: a procedure this portmapper does not serve.
    pub fn decode(version: u32, procedure: u32, r: &mut XdrReader<'a>) -> Option<XdrResult<Args<'a>>> {
        let rpcb = |r: &mut XdrReader<'a>| -> XdrResult<Args<'a>> {
            Ok(Args::Rpcb(Rpcb {
                program: r.u32()?,
                version: r.u32()?,
                netid: r.opaque(MAX_STR)?,
                addr: r.opaque(MAX_STR)?,
                owner: r.opaque(MAX_STR)?,
            }))
        };
        Some(match (version, procedure) {
            (_, 0) => Ok(Args::Null),
            (2, 1..=3) => (|| Ok(Args::Mapping(r.u32()?, r.u32()?, r.u32()?, r.u32()?)))(),
            (3 | 4, 1..=3) | (4, proc::GETVERSADDR | proc::GETADDRLIST) => rpcb(r),
            (_, 4) => Ok(Args::Dump),
            (3 | 4, proc::GETTIME) => Ok(Args::GetTime),
            (3 | 4, proc::UADDR2TADDR) => r.opaque(MAX_STR).map(Args::UniversalAddress),
            (3 | 4, proc::TADDR2UADDR) => (|| {
                let _maxlen = r.u32()?;
                Ok(Args::TransportAddress(r.opaque(MAX_TADDR)?))
            })(),
            (4, proc::GETSTAT) => Ok(Args::GetStat),
            (_, proc::CALLIT) | (4, proc::INDIRECT) => (|| {
                let call = (r.u32()?, r.u32()?, r.u32()?);
                r.opaque(MAX_CALLIT_ARGS)?;
                Ok(Args::CallIt(call.0, call.1, call.2))
            })(),
            _ => return None,
        })
    }
}

pub struct Portmap {
    /// Port of the NFS/MOUNT listener, known once it is bound.
    nfs_port: Arc<AtomicU16>,
    /// Port this portmapper answers on (111 normally).
    own_port: u16,
    /// Services other programs registered with SET, oldest first.
    registered: Mutex<Vec<Mapping>>,
    stats: stats::Stats,
}

impl Portmap {
    pub fn new(nfs_port: Arc<AtomicU16>, own_port: u16) -> Self {
        Self { nfs_port, own_port, registered: Mutex::new(Vec::new()), stats: stats::Stats::default() }
    }

    /// This server's own services, then those registered with SET.
    pub fn mappings(&self) -> Vec<Mapping> {
        let mut v = self.own_mappings();
        v.extend(self.registrations().iter().copied());
        v
    }

    fn own_mappings(&self) -> Vec<Mapping> {
        let nfs = self.nfs_port.load(Ordering::Relaxed);
        let own = |program, version, protocol, port| Mapping { program, version, protocol, port, registered: None };
        let mut v = Vec::new();
        for protocol in [IPPROTO_TCP, IPPROTO_UDP] {
            for version in 2..=4 {
                v.push(own(PROGRAM, version, protocol, self.own_port));
            }
            v.push(own(crate::nfs3::xdr::PROGRAM, 3, protocol, nfs));
            // MOUNT 1 and 2 for their listings (showmount on the BSDs; libnfs's discovery
            // of servers calls NULL of version 2).
            for version in crate::mount3::OLDEST_VERSION..=crate::mount3::VERSION {
                v.push(own(crate::mount3::PROGRAM, version, protocol, nfs));
            }
        }
        v
    }

    fn registrations(&self) -> std::sync::MutexGuard<'_, Vec<Mapping>> {
        self.registered.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `program` is one this server serves itself: no one else registers it.
    fn serves(&self, program: u32) -> bool {
        self.own_mappings().iter().any(|m| m.program == program)
    }

    /// Registers `mapping` for another program, as SET does: refused (false) for a
    /// program served here, for one already registered at that version over that
    /// netid, for a reserved port claimed by a caller that could not have bound it, and
    /// once the table is full.
    fn register(&self, program: u32, version: u32, protocol: u32, port: u16, at: RegisteredAt) -> bool {
        let mut registered = self.registrations();
        let taken = registered.iter().any(|m| {
            (m.program, m.version, m.protocol) == (program, version, protocol)
                && m.registered.is_some_and(|other| other.ip.is_ipv6() == at.ip.is_ipv6())
        });
        let port_claimed_falsely = port < 1024 && !at.privileged;
        if self.serves(program) || taken || port_claimed_falsely || registered.len() >= MAX_REGISTRATIONS {
            return false;
        }
        registered.push(Mapping { program, version, protocol, port, registered: Some(at) });
        true
    }

    /// Removes the registrations of `program` `version` that `which` selects (by where
    /// they are and their protocol), as UNSET does; those made from a reserved port only
    /// for a `privileged` caller. False if none was removed.
    fn unregister(&self, program: u32, version: u32, privileged: bool, which: impl Fn(RegisteredAt, u32) -> bool) -> bool {
        let mut registered = self.registrations();
        let before = registered.len();
        registered.retain(|m| {
            let selected = m.registered.is_some_and(|at| which(at, m.protocol) && (privileged || !at.privileged));
            !(m.program == program && m.version == version && selected)
        });
        registered.len() < before
    }

    /// The service `program` over `protocol` that a caller at `local` reaches: of
    /// `version` where it is served, otherwise, unless `exact`, of any version, as
    /// rpcbind answers GETPORT and GETADDR (the client then learns the versions served
    /// from the program's PROG_MISMATCH); GETVERSADDR asks for `exact`.
    fn find(&self, program: u32, version: u32, protocol: u32, local: IpAddr, exact: bool) -> Option<Mapping> {
        let served: Vec<Mapping> =
            self.mappings().into_iter().filter(|m| m.program == program && m.protocol == protocol && m.reachable_from(local)).collect();
        let same_version = served.iter().find(|m| m.version == version);
        same_version.or(if exact { None } else { served.first() }).copied()
    }

    fn universal_address(ip: IpAddr, port: u16) -> String {
        match crate::exports::canonical_ip(ip) {
            IpAddr::V4(v4) => format!("{}.{}.{}", v4, port >> 8, port & 0xff),
            IpAddr::V6(v6) => format!("{}.{}.{}", v6, port >> 8, port & 0xff),
        }
    }

    /// The address and port of a universal address ("h1.h2.h3.h4.p1.p2", or an IPv6
    /// address followed by ".p1.p2").
    fn parse_universal_address(uaddr: &str) -> Option<(IpAddr, u16)> {
        let mut parts = uaddr.rsplitn(3, '.');
        let (low, high) = (parts.next()?.parse::<u8>().ok()?, parts.next()?.parse::<u8>().ok()?);
        let ip = parts.next()?.parse::<IpAddr>().ok()?;
        Some((ip, u16::from(high) << 8 | u16::from(low)))
    }

    /// The protocol of a netid rpcbind registers inet services under, and whether it is
    /// IPv6's.
    fn parse_netid(netid: &[u8]) -> Option<(u32, bool)> {
        match netid {
            b"tcp" => Some((IPPROTO_TCP, false)),
            b"udp" => Some((IPPROTO_UDP, false)),
            b"tcp6" => Some((IPPROTO_TCP, true)),
            b"udp6" => Some((IPPROTO_UDP, true)),
            _ => None,
        }
    }

    /// SET or UNSET of rpcbind versions 3 and 4, from a local caller, `privileged` if
    /// from a reserved port.
    fn set_or_unset(&self, procedure: u32, rpcb: &Rpcb<'_>, privileged: bool) -> bool {
        let netid = Self::parse_netid(rpcb.netid);
        if procedure == proc::UNSET {
            // An empty netid unsets every transport, as rpcbind does.
            return !self.serves(rpcb.program)
                && (rpcb.netid.is_empty() || netid.is_some())
                && self.unregister(rpcb.program, rpcb.version, privileged, |at, protocol| {
                    netid.is_none_or(|(netid_protocol, v6)| protocol == netid_protocol && at.ip.is_ipv6() == v6)
                });
        }
        // An IPv4-mapped address is IPv4's, whatever netid names it.
        let address = std::str::from_utf8(rpcb.addr).ok().and_then(Self::parse_universal_address);
        match (netid, address.map(|(ip, port)| (crate::exports::canonical_ip(ip), port))) {
            (Some((protocol, v6)), Some((ip, port))) if ip.is_ipv6() == v6 => {
                self.register(rpcb.program, rpcb.version, protocol, port, RegisteredAt { ip, privileged })
            }
            _ => false,
        }
    }

    /// SET or UNSET of portmap version 2, from a local caller, `privileged` if from a
    /// reserved port: IPv4 services on every address; UNSET removes both transports.
    fn set_or_unset_v2(&self, procedure: u32, program: u32, version: u32, protocol: u32, port: u32, privileged: bool) -> bool {
        if procedure == proc::UNSET {
            return !self.serves(program) && self.unregister(program, version, privileged, |at, _| at.ip.is_ipv4());
        }
        let at = RegisteredAt { ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), privileged };
        match (protocol, u16::try_from(port)) {
            (IPPROTO_TCP | IPPROTO_UDP, Ok(port)) => self.register(program, version, protocol, port, at),
            _ => false,
        }
    }

    /// The protocol number of `transport`, as mappings name it.
    fn protocol(transport: Transport) -> u32 {
        match transport {
            Transport::Tcp => IPPROTO_TCP,
            Transport::Udp => IPPROTO_UDP,
        }
    }

    /// The netid of `protocol` in the family of `ip`.
    fn netid(protocol: u32, ip: IpAddr) -> &'static str {
        let v6 = crate::exports::canonical_ip(ip).is_ipv6();
        match (protocol == IPPROTO_TCP, v6) {
            (true, false) => "tcp",
            (true, true) => "tcp6",
            (false, false) => "udp",
            (false, true) => "udp6",
        }
    }

    /// rpcbind v4 GETADDRLIST: an `rpcb_entry` for each transport of the caller's
    /// address family that serves `program` at exactly `version`, as rpcbind lists them.
    fn write_address_list(&self, program: u32, version: u32, local: IpAddr, out: &mut XdrWriter) {
        // Semantics constants of <netconfig.h>: connection-oriented with orderly release,
        // and connectionless.
        const NC_TPI_CLTS: u32 = 1;
        const NC_TPI_COTS_ORD: u32 = 3;
        let family = if local.is_ipv6() { "inet6" } else { "inet" };
        for m in self.mappings().into_iter().filter(|m| m.program == program && m.version == version && m.reachable_from(local)) {
            let tcp = m.protocol == IPPROTO_TCP;
            out.bool(true);
            out.opaque(m.universal_address(local).as_bytes());
            out.opaque(m.netid(local).as_bytes());
            out.u32(if tcp { NC_TPI_COTS_ORD } else { NC_TPI_CLTS });
            out.opaque(family.as_bytes());
            out.opaque(if tcp { b"tcp" } else { b"udp" });
        }
        out.bool(false);
    }
}

/// A `struct sockaddr_in` or `sockaddr_in6` as this host lays it out: what rpcbind's
/// UADDR2TADDR answers (the family in the host's byte order, the port and address in
/// the network's).
fn sockaddr_bytes(ip: IpAddr, port: u16) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(28);
    match ip {
        IpAddr::V4(v4) => {
            bytes.extend((libc::AF_INET as u16).to_ne_bytes());
            bytes.extend(port.to_be_bytes());
            bytes.extend(v4.octets());
            bytes.extend([0; 8]);
        }
        IpAddr::V6(v6) => {
            bytes.extend((libc::AF_INET6 as u16).to_ne_bytes());
            bytes.extend(port.to_be_bytes());
            bytes.extend([0; 4]); // flow information
            bytes.extend(v6.octets());
            bytes.extend([0; 4]); // scope
        }
    }
    bytes
}

/// The address and port of a `struct sockaddr_in` or `sockaddr_in6` laid out as
/// [`sockaddr_bytes`] does.
fn sockaddr_from_bytes(bytes: &[u8]) -> Option<(IpAddr, u16)> {
    let family = u16::from_ne_bytes(bytes.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?);
    match i32::from(family) {
        libc::AF_INET => Some((IpAddr::from(<[u8; 4]>::try_from(bytes.get(4..8)?).ok()?), port)),
        libc::AF_INET6 => Some((IpAddr::from(<[u8; 16]>::try_from(bytes.get(8..24)?).ok()?), port)),
        _ => None,
    }
}

impl RpcProgram for Portmap {
    fn program(&self) -> u32 {
        PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (2, 4)
    }

    fn call(&self, ctx: &CallContext, args: &mut XdrReader<'_>, out: &mut XdrWriter) -> Result<(), ProcError> {
        let args = Args::decode(ctx.version, ctx.procedure, args).ok_or(ProcError::ProcUnavail)??;
        self.stats.call(ctx.version, ctx.procedure);
        // The address called, in the family the caller sees (an IPv4 client of a
        // dual-stack socket is an IPv4 client).
        let local = crate::exports::canonical_ip(ctx.local.ip());
        let protocol = Self::protocol(ctx.transport);
        let service = |program, version, netid| stats::Service { program, version, netid };
        // As rpcbind: only programs on this host register, and only they unregister. Both
        // ends on loopback: a datagram's source alone could be forged where the kernel
        // routes loopback sources from outside (`route_localnet`).
        let local_caller = crate::exports::canonical_ip(ctx.peer.ip()).is_loopback() && local.is_loopback();
        let privileged = ctx.peer.port() < 1024;
        let set_or_unset = matches!(ctx.procedure, proc::SET | proc::UNSET);
        if set_or_unset && !local_caller {
            tracing::debug!(peer = %ctx.peer, procedure = self.procedure_name(ctx.version, ctx.procedure), "portmapper change refused: not a local caller");
        }
        let changed = |done: bool| {
            if done {
                self.stats.changed(ctx.version, ctx.procedure == proc::UNSET);
            }
            done
        };
        match args {
            Args::Null => {}
            Args::Mapping(program, version, protocol, port) => match ctx.procedure {
                proc::GETADDR => {
                    // Version 2 knows IPv4 services alone, whatever transport it is called over.
                    let found = self.find(program, version, protocol, std::net::Ipv4Addr::UNSPECIFIED.into(), false);
                    let netid = match protocol {
                        IPPROTO_TCP => "tcp",
                        IPPROTO_UDP => "udp",
                        _ => "",
                    };
                    self.stats.lookup(ctx.version, service(program, version, netid), found.is_some());
                    out.u32(found.map_or(0, |m| m.port.into()));
                }
                _ => out.bool(changed(local_caller && self.set_or_unset_v2(ctx.procedure, program, version, protocol, port, privileged))),
            },
            Args::Rpcb(rpcb) => match ctx.procedure {
                proc::GETADDR | proc::GETVERSADDR => {
                    // RFC 1833: the netid asked for is ignored; it is the transport's the
                    // call came in on, as rpcbind answers (libnfs sends an empty one).
                    let found = self.find(rpcb.program, rpcb.version, protocol, local, ctx.procedure == proc::GETVERSADDR);
                    self.stats.lookup(ctx.version, service(rpcb.program, rpcb.version, Self::netid(protocol, local)), found.is_some());
                    out.opaque(found.map(|m| m.universal_address(local)).unwrap_or_default().as_bytes());
                }
                proc::GETADDRLIST => self.write_address_list(rpcb.program, rpcb.version, local, out),
                _ => out.bool(changed(local_caller && self.set_or_unset(ctx.procedure, &rpcb, privileged))),
            },
            Args::Dump if ctx.version == 2 => {
                // Portmap version 2 knows IPv4 alone.
                for m in self.mappings().into_iter().filter(|m| m.registered.is_none_or(|at| at.ip.is_ipv4())) {
                    out.bool(true);
                    for v in [m.program, m.version, m.protocol, m.port as u32] {
                        out.u32(v);
                    }
                }
                out.bool(false);
            }
            Args::Dump => {
                // This server's own are at the address called, so their netid is of its
                // family; registered ones as they were registered.
                for m in self.mappings() {
                    out.bool(true);
                    out.u32(m.program);
                    out.u32(m.version);
                    out.opaque(m.netid(local).as_bytes());
                    let uaddr = match m.registered {
                        Some(at) => Self::universal_address(at.ip, m.port),
                        None => m.universal_address(local),
                    };
                    out.opaque(uaddr.as_bytes());
                    out.opaque(m.owner());
                }
                out.bool(false);
            }
            // As rpcbind, a CALLIT is answered only if the call it carries succeeds, so a
            // broadcast gets replies from the servers of the program alone (libnfs's
            // discovery of servers gives up on any other reply); an INDIRECT, never
            // broadcast, gets an error instead. Only NULL of a program served here is
            // run: it does nothing, and nothing is passed on.
            Args::CallIt(program, version, procedure) => {
                let indirect = ctx.version == 4 && ctx.procedure == proc::INDIRECT;
                let own = self.find(program, version, protocol, local, true).filter(|m| m.registered.is_none() && procedure == 0);
                self.stats.remote_call(
                    ctx.version,
                    service(program, version, Self::netid(protocol, local)),
                    procedure,
                    indirect,
                    own.is_some(),
                );
                let own = own.ok_or(if indirect { ProcError::SystemErr } else { ProcError::Drop })?;
                if ctx.version == 2 {
                    out.u32(own.port as u32);
                } else {
                    out.opaque(own.universal_address(local).as_bytes());
                }
                out.opaque(b"");
            }
            Args::GetTime => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                out.u32(now as u32);
            }
            // In the family of the transport called, as rpcbind converts with its netid;
            // an empty netbuf or string when the address is not one of that family.
            Args::UniversalAddress(uaddr) => {
                let ip_and_port = std::str::from_utf8(uaddr).ok().and_then(Self::parse_universal_address);
                let sockaddr = ip_and_port.filter(|(ip, _)| ip.is_ipv6() == local.is_ipv6()).map(|(ip, port)| sockaddr_bytes(ip, port));
                let sockaddr = sockaddr.unwrap_or_default();
                out.u32(sockaddr.len() as u32);
                out.opaque(&sockaddr);
            }
            Args::TransportAddress(taddr) => {
                let address = sockaddr_from_bytes(taddr).filter(|(ip, _)| ip.is_ipv6() == local.is_ipv6());
                out.opaque(address.map(|(ip, port)| Self::universal_address(ip, port)).unwrap_or_default().as_bytes());
            }
            Args::GetStat => self.stats.encode(out),
        }
        Ok(())
    }

    fn is_quick(&self, _version: u32, _procedure: u32, _args: &[u8]) -> bool {
        true
    }

    fn procedure_name(&self, _version: u32, procedure: u32) -> &'static str {
        proc::NAMES.get(procedure as usize).copied().unwrap_or("unknown")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn universal_addresses() {
        assert_eq!(Portmap::universal_address("127.0.0.1".parse().unwrap(), 2049), "127.0.0.1.8.1");
        assert_eq!(Portmap::universal_address("::ffff:10.0.0.1".parse().unwrap(), 20048), "10.0.0.1.78.80");
        assert_eq!(Portmap::universal_address("::1".parse().unwrap(), 662), "::1.2.150");
        for (uaddr, parsed) in [
            ("127.0.0.1.8.1", Some(("127.0.0.1", 2049))),
            ("0.0.0.0.2.150", Some(("0.0.0.0", 662))),
            ("::.2.150", Some(("::", 662))),
            ("fe80::1.255.255", Some(("fe80::1", 65535))),
            ("127.0.0.1.256.1", None),
            ("127.0.0.1.8", None),
            ("localhost.8.1", None),
            ("", None),
        ] {
            let expected = parsed.map(|(ip, port)| (ip.parse::<IpAddr>().unwrap(), port));
            assert_eq!(Portmap::parse_universal_address(uaddr), expected, "{uaddr:?}");
        }
    }

    /// The result of `procedure` of rpcbind `version`, called over `transport` at `local`
    /// of a portmapper on 111 for NFS on 2049.
    fn call(local: &str, transport: Transport, version: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        call_from(&pm, "127.0.0.1:900", local, transport, version, procedure, args)
    }

    /// As [`call`], of `pm`, from `peer`.
    fn call_from(pm: &Portmap, peer: &str, local: &str, transport: Transport, version: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
        let ctx = CallContext {
            xid: 1,
            program: PROGRAM,
            version,
            procedure,
            credential: crate::rpc::Credential::None,
            peer: peer.parse().unwrap(),
            local: local.parse().unwrap(),
            transport,
            may_block: false,
            early_reply: None,
        };
        let mut out = XdrWriter::new();
        pm.call(&ctx, &mut XdrReader::new(args), &mut out).unwrap();
        out.into_inner()
    }

    /// An rpcb argument registering `program` `version` over `netid` at `uaddr`.
    fn rpcb_at(program: u32, version: u32, netid: &str, uaddr: &str) -> Vec<u8> {
        let mut w = XdrWriter::new();
        w.u32(program);
        w.u32(version);
        w.opaque(netid.as_bytes());
        w.opaque(uaddr.as_bytes());
        w.opaque(b"0");
        w.into_inner()
    }

    /// A portmap version 2 mapping argument.
    fn mapping(program: u32, version: u32, protocol: u32, port: u32) -> Vec<u8> {
        let mut w = XdrWriter::new();
        for v in [program, version, protocol, port] {
            w.u32(v);
        }
        w.into_inner()
    }

    fn answer_bool(reply: &[u8]) -> bool {
        XdrReader::new(reply).bool().unwrap()
    }

    /// Every entry of a version 4 DUMP: (program, version, netid, universal address, owner).
    fn dump_v4(pm: &Portmap, local: &str) -> Vec<(u32, u32, String, String, String)> {
        let reply = call_from(pm, "127.0.0.1:900", local, Transport::Tcp, 4, proc::DUMP, &[]);
        let mut r = XdrReader::new(&reply);
        let mut entries = Vec::new();
        while r.bool().unwrap() {
            let (program, version) = (r.u32().unwrap(), r.u32().unwrap());
            entries.push((program, version, string(&mut r), string(&mut r), string(&mut r)));
        }
        entries
    }

    /// Every entry of a version 2 DUMP: (program, version, protocol, port).
    fn dump_v2(pm: &Portmap) -> Vec<[u32; 4]> {
        let reply = call_from(pm, "127.0.0.1:900", "127.0.0.1:111", Transport::Tcp, 2, proc::DUMP, &[]);
        let mut r = XdrReader::new(&reply);
        let mut entries = Vec::new();
        while r.bool().unwrap() {
            entries.push([r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()]);
        }
        entries
    }

    const STATD: u32 = 100024;

    #[test]
    fn a_local_service_set_is_found_by_getport_getaddr_and_dump_until_unset() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let local = "127.0.0.1:900";
        let v2 = |procedure, args: &[u8]| call_from(&pm, local, "127.0.0.1:111", Transport::Udp, 2, procedure, args);
        let getport = |protocol| XdrReader::new(&v2(proc::GETADDR, &mapping(STATD, 1, protocol, 0))).u32().unwrap();
        let getaddr = |at: &str, transport| {
            let reply = call_from(&pm, local, at, transport, 3, proc::GETADDR, &rpcb(STATD, 1, ""));
            string(&mut XdrReader::new(&reply))
        };

        // rpc.statd registers this way through libtirpc when no rpcbind socket answers.
        assert!(answer_bool(&v2(proc::SET, &mapping(STATD, 1, IPPROTO_TCP, 662))));
        assert!(answer_bool(&v2(proc::SET, &mapping(STATD, 1, IPPROTO_UDP, 663))));
        assert_eq!((getport(IPPROTO_TCP), getport(IPPROTO_UDP)), (662, 663));
        // Registered on every address: named by the address called.
        assert_eq!(getaddr("127.0.0.2:111", Transport::Tcp), "127.0.0.2.2.150");
        assert!(dump_v2(&pm).contains(&[STATD, 1, IPPROTO_TCP, 662]));
        assert!(dump_v4(&pm, "127.0.0.1:111").contains(&(STATD, 1, "udp".into(), "0.0.0.0.2.151".into(), "unknown".into())));
        // IPv4 registrations are no answer to an IPv6 caller; an IPv6 one is.
        assert_eq!(getaddr("[::1]:111", Transport::Tcp), "");
        let set6 = call_from(&pm, "[::1]:900", "[::1]:111", Transport::Tcp, 4, proc::SET, &rpcb_at(STATD, 1, "tcp6", "::.2.152"));
        assert!(answer_bool(&set6));
        assert_eq!(getaddr("[::1]:111", Transport::Tcp), "::1.2.152");
        assert_eq!(getaddr("[::1]:111", Transport::Udp), "");
        assert!(!dump_v2(&pm).iter().any(|m| m[3] == 152 + (2 << 8)), "version 2 lists IPv4 alone");

        // Version 2's UNSET removes both IPv4 transports and leaves IPv6 alone.
        assert!(answer_bool(&v2(proc::UNSET, &mapping(STATD, 1, 0, 0))));
        assert_eq!((getport(IPPROTO_TCP), getport(IPPROTO_UDP)), (0, 0));
        assert_eq!(getaddr("[::1]:111", Transport::Tcp), "::1.2.152");
        // Version 2 knows IPv4 services alone, even called over IPv6.
        let getport_v6 = call_from(&pm, "[::1]:900", "[::1]:111", Transport::Tcp, 2, proc::GETADDR, &mapping(STATD, 1, IPPROTO_TCP, 0));
        assert_eq!(XdrReader::new(&getport_v6).u32().unwrap(), 0);
        // Version 4's with no netid removes every transport; once.
        let unset = || call_from(&pm, local, "127.0.0.1:111", Transport::Tcp, 4, proc::UNSET, &rpcb(STATD, 1, ""));
        assert!(answer_bool(&unset()));
        assert!(!answer_bool(&unset()));
        assert_eq!(getaddr("[::1]:111", Transport::Tcp), "");
        assert!(!dump_v4(&pm, "127.0.0.1:111").iter().any(|e| e.0 == STATD));
    }

    #[test]
    fn universal_and_transport_addresses_convert_both_ways_in_the_family_called() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let to_taddr = |local, uaddr: &str| {
            let mut w = XdrWriter::new();
            w.opaque(uaddr.as_bytes());
            let reply = call_from(&pm, "127.0.0.1:900", local, Transport::Udp, 4, proc::UADDR2TADDR, &w.into_inner());
            let mut r = XdrReader::new(&reply);
            let maxlen = r.u32().unwrap();
            let taddr = r.opaque(MAX_TADDR).unwrap().to_vec();
            assert_eq!(maxlen as usize, taddr.len());
            taddr
        };
        let to_uaddr = |local, taddr: &[u8]| {
            let mut w = XdrWriter::new();
            w.u32(taddr.len() as u32);
            w.opaque(taddr);
            let reply = call_from(&pm, "127.0.0.1:900", local, Transport::Tcp, 3, proc::TADDR2UADDR, &w.into_inner());
            string(&mut XdrReader::new(&reply))
        };
        let v4 = to_taddr("127.0.0.1:111", "127.0.0.1.2.150");
        // struct sockaddr_in: the family in this host's order, then port and address.
        let mut expected = (libc::AF_INET as u16).to_ne_bytes().to_vec();
        expected.extend([2, 150, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(v4, expected);
        assert_eq!(to_uaddr("127.0.0.1:111", &v4), "127.0.0.1.2.150");
        let v6 = to_taddr("[::1]:111", "fe80::1.8.1");
        assert_eq!(v6.len(), 28);
        assert_eq!(to_uaddr("[::1]:111", &v6), "fe80::1.8.1");
        // Another family than the transport's, or no address: empty.
        assert_eq!(to_taddr("127.0.0.1:111", "::1.8.1"), b"");
        assert_eq!(to_taddr("127.0.0.1:111", "nonsense"), b"");
        assert_eq!(to_uaddr("127.0.0.1:111", &v6), "");
        assert_eq!(to_uaddr("127.0.0.1:111", &[1, 2, 3]), "");
    }

    #[test]
    fn indirect_answers_a_null_of_a_program_served_here_and_an_error_otherwise() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let ctx = CallContext {
            xid: 1,
            program: PROGRAM,
            version: 4,
            procedure: proc::INDIRECT,
            credential: crate::rpc::Credential::None,
            peer: "127.0.0.1:900".parse().unwrap(),
            local: "127.0.0.1:111".parse().unwrap(),
            transport: Transport::Tcp,
            may_block: false,
            early_reply: None,
        };
        let run = |args: &[u8]| {
            let mut out = XdrWriter::new();
            pm.call(&ctx, &mut XdrReader::new(args), &mut out).map(|()| out.into_inner())
        };
        let reply = run(&callit(100003, 3, 0)).expect("answered");
        let mut r = XdrReader::new(&reply);
        assert_eq!((string(&mut r), r.opaque(8).unwrap(), r.remaining()), ("127.0.0.1.8.1".to_string(), &b""[..], 0));
        // Not dropped as a broadcast's would be: the caller hears why.
        assert_eq!(run(&callit(100003, 3, 1)), Err(ProcError::SystemErr));
        assert_eq!(run(&callit(100021, 4, 0)), Err(ProcError::SystemErr));
    }

    #[test]
    fn set_and_unset_are_refused_to_remote_callers_bad_addresses_and_programs_served_here() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let set = |peer, args: &[u8]| answer_bool(&call_from(&pm, peer, "127.0.0.1:111", Transport::Tcp, 4, proc::SET, args));
        let unset = |peer, args: &[u8]| answer_bool(&call_from(&pm, peer, "127.0.0.1:111", Transport::Tcp, 4, proc::UNSET, args));
        let statd = rpcb_at(STATD, 1, "tcp", "0.0.0.0.2.150");

        for remote in ["10.0.0.9:900", "[::ffff:192.168.1.2]:900", "[2001:db8::1]:900"] {
            assert!(!set(remote, &statd), "{remote}");
        }
        // A loopback source on a datagram that came to another address is not local.
        let to_outside = call_from(&pm, "127.0.0.1:900", "10.0.0.1:111", Transport::Udp, 4, proc::SET, &statd);
        assert!(!answer_bool(&to_outside));
        assert!(!dump_v4(&pm, "127.0.0.1:111").iter().any(|e| e.0 == STATD));
        assert!(set("[::ffff:127.0.0.1]:900", &statd));
        assert!(!set("127.0.0.1:900", &statd), "already registered at that version and netid");
        assert!(set("127.0.0.1:900", &rpcb_at(STATD, 2, "tcp", "0.0.0.0.2.150")), "another version");
        assert!(!unset("10.0.0.9:900", &rpcb(STATD, 1, "")), "a remote caller unregisters nothing");
        assert!(dump_v4(&pm, "127.0.0.1:111").iter().any(|e| (e.0, e.1) == (STATD, 1)));

        // No one else speaks for this server's own programs.
        for program in [PROGRAM, 100003, 100005] {
            assert!(!set("127.0.0.1:900", &rpcb_at(program, 4, "tcp", "127.0.0.1.9.9")), "{program}");
            assert!(!unset("127.0.0.1:900", &rpcb(program, 3, "")), "{program}");
        }
        assert_eq!(pm.find(100003, 3, IPPROTO_TCP, "127.0.0.1".parse().unwrap(), true).map(|m| m.port), Some(2049));

        // Addresses that are not an inet transport's, or not of the netid's family.
        for (netid, uaddr) in [
            ("local", "/run/statd.sock"),
            ("tcp", "localhost.2.150"),
            ("tcp", "0.0.0.0.2"),
            ("tcp6", "127.0.0.1.2.150"),
            ("tcp6", "::ffff:127.0.0.1.2.150"),
            ("udp", "::1.2.150"),
        ] {
            assert!(!set("127.0.0.1:900", &rpcb_at(STATD, 3, netid, uaddr)), "{netid} {uaddr}");
        }
        let v2_set = |protocol, port| {
            let reply = call_from(&pm, "127.0.0.1:900", "127.0.0.1:111", Transport::Udp, 2, proc::SET, &mapping(STATD, 9, protocol, port));
            answer_bool(&reply)
        };
        assert!(!v2_set(99, 662), "no such protocol");
        assert!(!v2_set(IPPROTO_TCP, 70000), "no such port");

        // The table is bounded.
        for version in 100..100 + 2 * MAX_REGISTRATIONS as u32 {
            set("127.0.0.1:900", &rpcb_at(STATD, version, "udp", "0.0.0.0.2.151"));
        }
        assert_eq!(pm.registrations().len(), MAX_REGISTRATIONS);
    }

    #[test]
    fn a_registration_from_a_reserved_port_is_unregistered_only_from_one() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let change = |procedure, peer, args: &[u8]| answer_bool(&call_from(&pm, peer, "127.0.0.1:111", Transport::Tcp, 4, procedure, args));
        let (root, user) = ("127.0.0.1:797", "127.0.0.1:40000");
        // A caller that could not bind a reserved port cannot claim one.
        assert!(!change(proc::SET, user, &rpcb_at(STATD, 1, "tcp", "0.0.0.0.2.150")));
        assert!(change(proc::SET, root, &rpcb_at(STATD, 1, "tcp", "0.0.0.0.2.150")));
        assert!(!change(proc::UNSET, user, &rpcb(STATD, 1, "")), "statd's registration is root's");
        assert!(dump_v4(&pm, "127.0.0.1:111").iter().any(|e| e.0 == STATD));
        // Any local caller registers an unreserved port, and root unregisters it too.
        assert!(change(proc::SET, user, &rpcb_at(400_000, 1, "tcp", "0.0.0.0.156.65")));
        assert!(change(proc::UNSET, root, &rpcb(400_000, 1, "tcp")));
        assert!(change(proc::SET, user, &rpcb_at(400_000, 1, "tcp", "0.0.0.0.156.65")));
        assert!(change(proc::UNSET, user, &rpcb(400_000, 1, "")));
        assert!(change(proc::UNSET, root, &rpcb(STATD, 1, "")));
        assert!(!dump_v4(&pm, "127.0.0.1:111").iter().any(|e| e.0 == STATD || e.0 == 400_000));
    }

    /// An rpcb argument for `program` and `version` naming `netid`.
    fn rpcb(program: u32, version: u32, netid: &str) -> Vec<u8> {
        let mut w = XdrWriter::new();
        w.u32(program);
        w.u32(version);
        w.opaque(netid.as_bytes());
        w.opaque(b"");
        w.opaque(b"");
        w.into_inner()
    }

    fn string(r: &mut XdrReader<'_>) -> String {
        String::from_utf8(r.opaque(64).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn getaddr_answers_for_the_transport_called_whatever_netid_is_asked() {
        // libnfs over IPv6 asks with an empty netid; RFC 1833 says the netid is ignored.
        for (local, transport, netid, uaddr) in [
            ("[::1]:111", Transport::Tcp, "", "::1.8.1"),
            ("[::1]:111", Transport::Udp, "", "::1.8.1"),
            ("127.0.0.1:111", Transport::Tcp, "udp", "127.0.0.1.8.1"),
            ("127.0.0.1:111", Transport::Udp, "no such netid", "127.0.0.1.8.1"),
        ] {
            for (version, procedure) in [(3, proc::GETADDR), (4, proc::GETADDR), (4, proc::GETVERSADDR)] {
                let reply = call(local, transport, version, procedure, &rpcb(100005, 3, netid));
                assert_eq!(string(&mut XdrReader::new(&reply)), uaddr, "{local} {transport:?} {netid:?} v{version} proc {procedure}");
            }
        }
        // A program not served has no address, whatever the netid.
        let reply = call("[::1]:111", Transport::Tcp, 4, proc::GETADDR, &rpcb(100021, 4, "tcp6"));
        assert_eq!(string(&mut XdrReader::new(&reply)), "");
    }

    #[test]
    fn getaddrlist_lists_each_transport_of_the_family_called() {
        let entries = |local: &str, program: u32, version: u32| {
            let reply = call(local, Transport::Udp, 4, proc::GETADDRLIST, &rpcb(program, version, ""));
            let mut r = XdrReader::new(&reply);
            let mut entries = Vec::new();
            while r.bool().unwrap() {
                let (uaddr, netid, semantics) = (string(&mut r), string(&mut r), r.u32().unwrap());
                entries.push((uaddr, netid, semantics, string(&mut r), string(&mut r)));
            }
            assert_eq!(r.remaining(), 0, "nothing follows the list");
            entries
        };
        let v6 = entries("[::1]:111", 100003, 3);
        let expected = |addr: &str, tcp: &str, udp: &str, family: &str| {
            vec![
                (format!("{addr}.8.1"), tcp.to_string(), 3, family.to_string(), "tcp".to_string()),
                (format!("{addr}.8.1"), udp.to_string(), 1, family.to_string(), "udp".to_string()),
            ]
        };
        assert_eq!(v6, expected("::1", "tcp6", "udp6", "inet6"));
        assert_eq!(entries("[::ffff:127.0.0.1]:111", 100003, 3), expected("127.0.0.1", "tcp", "udp", "inet"));
        // Exactly the version asked for, as rpcbind lists them.
        assert_eq!(entries("127.0.0.1:111", 100003, 4), vec![]);
    }

    /// The arguments of a CALLIT of `procedure` of `program` `version`, with no arguments.
    fn callit(program: u32, version: u32, procedure: u32) -> Vec<u8> {
        let mut w = XdrWriter::new();
        w.u32(program);
        w.u32(version);
        w.u32(procedure);
        w.opaque(b"");
        w.into_inner()
    }

    #[test]
    fn callit_answers_only_a_null_of_a_program_served_here() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let ctx = |version, local: &str| CallContext {
            xid: 1,
            program: PROGRAM,
            version,
            procedure: proc::CALLIT,
            credential: crate::rpc::Credential::None,
            peer: "10.0.0.9:900".parse().unwrap(),
            local: local.parse().unwrap(),
            transport: Transport::Udp,
            may_block: false,
            early_reply: None,
        };
        let run = |version, local: &str, args: &[u8]| {
            let mut out = XdrWriter::new();
            pm.call(&ctx(version, local), &mut XdrReader::new(args), &mut out).map(|()| out.into_inner())
        };
        // libnfs looks for servers with a broadcast CALLIT of MOUNT 2's NULL.
        let reply = run(2, "10.0.0.1:111", &callit(100005, 2, 0)).expect("answered");
        let mut r = XdrReader::new(&reply);
        assert_eq!((r.u32().unwrap(), r.opaque(8).unwrap(), r.remaining()), (2049, &b""[..], 0));
        for version in [3, 4] {
            let reply = run(version, "[::ffff:10.0.0.1]:111", &callit(100003, 3, 0)).expect("answered");
            let mut r = XdrReader::new(&reply);
            assert_eq!((string(&mut r), r.opaque(8).unwrap(), r.remaining()), ("10.0.0.1.8.1".to_string(), &b""[..], 0));
        }
        // Anything else is not answered at all, as rpcbind does when the call fails: a
        // procedure other than NULL (which would be passed on), a program or a version
        // not served.
        for args in [callit(100005, 3, 1), callit(100021, 4, 0), callit(100003, 4, 0)] {
            for version in [2, 3, 4] {
                assert_eq!(run(version, "10.0.0.1:111", &args), Err(ProcError::Drop));
            }
        }
    }

    /// rpcbind v3 DUMP: (netid, universal address) of every entry, asked at `local`.
    fn rpcb_dump(local: &str) -> Vec<(String, String)> {
        let bytes = call(local, Transport::Tcp, 3, proc::DUMP, &[]);
        let mut r = XdrReader::new(&bytes);
        let mut entries = Vec::new();
        while r.bool().unwrap() {
            let (_program, _version) = (r.u32().unwrap(), r.u32().unwrap());
            let netid = String::from_utf8(r.opaque(64).unwrap().to_vec()).unwrap();
            let uaddr = String::from_utf8(r.opaque(64).unwrap().to_vec()).unwrap();
            let _owner = r.opaque(64).unwrap();
            entries.push((netid, uaddr));
        }
        entries
    }

    #[test]
    fn rpcbind_dump_names_netids_of_the_family_called() {
        let v4 = rpcb_dump("127.0.0.1:111");
        assert!(!v4.is_empty());
        assert!(v4.iter().all(|(n, a)| (n == "tcp" || n == "udp") && a.starts_with("127.0.0.1.")), "{v4:?}");
        let v6 = rpcb_dump("[::1]:111");
        assert!(v6.iter().all(|(n, a)| (n == "tcp6" || n == "udp6") && a.starts_with("::1.")), "{v6:?}");
        assert_eq!(v6.iter().filter(|(n, _)| n == "tcp6").count(), v4.iter().filter(|(n, _)| n == "tcp").count());
        // An IPv4 client of a dual-stack socket is an IPv4 client.
        assert_eq!(rpcb_dump("[::ffff:127.0.0.1]:111"), v4);
    }

    #[test]
    fn getport_finds_only_served_programs_and_any_version_unless_asked_for_one() {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let port = |program, version, protocol, exact| {
            let local: IpAddr = "127.0.0.1".parse().unwrap();
            pm.find(program, version, protocol, local, exact).map(|m| m.port)
        };
        for exact in [false, true] {
            assert_eq!(port(100003, 3, IPPROTO_TCP, exact), Some(2049));
            assert_eq!(port(100005, 3, IPPROTO_UDP, exact), Some(2049));
            assert_eq!(port(100021, 4, IPPROTO_TCP, exact), None, "NLM is not served");
            assert_eq!(port(100003, 3, 99, exact), None, "no such protocol");
        }
        // As rpcbind: GETPORT and GETADDR name the program's port whatever the version,
        // so a client asking for NFS v4 or MOUNT v1 reaches it and learns the versions
        // from its PROG_MISMATCH; GETVERSADDR finds the version asked for only.
        assert_eq!(port(100003, 4, IPPROTO_TCP, false), Some(2049));
        assert_eq!(port(100005, 1, IPPROTO_UDP, false), Some(2049));
        assert_eq!(port(100003, 4, IPPROTO_TCP, true), None);
        assert_eq!(port(100000, 2, IPPROTO_TCP, true), Some(111));
    }
}
