//! Embedded portmapper / rpcbind (RFC 1833): program 100000, versions 2–4.
//!
//! It answers only for the programs this server serves, so `mount -t nfs host:/path`
//! works with no system rpcbind. SET and UNSET are refused: nothing else registers here.

use crate::rpc::{CallContext, ProcError, RpcProgram, Transport};
use crate::xdr::{XdrReader, XdrResult, XdrWriter};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

pub const PROGRAM: u32 = 100000;

pub mod proc {
    /// GETPORT (v2) and GETADDR (v3, v4).
    pub const GETADDR: u32 = 3;
    /// DUMP, in portmap v2 and rpcbind v3 and v4 alike.
    pub const DUMP: u32 = 4;
    /// CALLIT (v2, v3) and BCAST (v4): a call passed on to a program, mostly broadcast.
    pub const CALLIT: u32 = 5;
    pub const GETVERSADDR: u32 = 9;
    pub const GETADDRLIST: u32 = 11;
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
/// Arguments of a call CALLIT passes on; only NULL's, which are empty, are looked at.
const MAX_CALLIT_ARGS: usize = 8192;

/// One registered service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub program: u32,
    pub version: u32,
    pub protocol: u32,
    pub port: u16,
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
    /// CALLIT/BCAST: program, version, procedure (its arguments are not needed).
    CallIt(u32, u32, u32),
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
            (3 | 4, 6) => Ok(Args::GetTime),
            (_, proc::CALLIT) => (|| {
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
}

impl Portmap {
    pub fn new(nfs_port: Arc<AtomicU16>, own_port: u16) -> Self {
        Self { nfs_port, own_port }
    }

    pub fn mappings(&self) -> Vec<Mapping> {
        let nfs = self.nfs_port.load(Ordering::Relaxed);
        let mut v = Vec::new();
        for protocol in [IPPROTO_TCP, IPPROTO_UDP] {
            for version in 2..=4 {
                v.push(Mapping { program: PROGRAM, version, protocol, port: self.own_port });
            }
            v.push(Mapping { program: crate::nfs3::xdr::PROGRAM, version: 3, protocol, port: nfs });
            // MOUNT 1 and 2 for their listings (showmount on the BSDs; libnfs's discovery
            // of servers calls NULL of version 2).
            for version in crate::mount3::OLDEST_VERSION..=crate::mount3::VERSION {
                v.push(Mapping { program: crate::mount3::PROGRAM, version, protocol, port: nfs });
            }
        }
        v
    }

    /// The port of `program` over `protocol`: of `version` where it is served, otherwise,
    /// unless `exact`, of any version, as rpcbind answers GETPORT and GETADDR (the client
    /// then learns the versions served from the program's PROG_MISMATCH); GETVERSADDR
    /// asks for `exact`.
    fn find(&self, program: u32, version: u32, protocol: u32, exact: bool) -> Option<u16> {
        let served: Vec<Mapping> = self.mappings().into_iter().filter(|m| m.program == program && m.protocol == protocol).collect();
        let same_version = served.iter().find(|m| m.version == version);
        same_version.or(if exact { None } else { served.first() }).map(|m| m.port)
    }

    fn universal_address(local: SocketAddr, port: u16) -> String {
        let ip = crate::exports::canonical_ip(local.ip());
        match ip {
            IpAddr::V4(v4) => format!("{}.{}.{}", v4, port >> 8, port & 0xff),
            IpAddr::V6(v6) => format!("{}.{}.{}", v6, port >> 8, port & 0xff),
        }
    }

    /// The protocol number of `transport`, as mappings name it.
    fn protocol(transport: Transport) -> u32 {
        match transport {
            Transport::Tcp => IPPROTO_TCP,
            Transport::Udp => IPPROTO_UDP,
        }
    }

    /// The netid of `protocol` in the family of the address called.
    fn netid(protocol: u32, local: SocketAddr) -> &'static str {
        let v6 = crate::exports::canonical_ip(local.ip()).is_ipv6();
        match (protocol == IPPROTO_TCP, v6) {
            (true, false) => "tcp",
            (true, true) => "tcp6",
            (false, false) => "udp",
            (false, true) => "udp6",
        }
    }

    /// rpcbind v4 GETADDRLIST: an `rpcb_entry` for each transport of the caller's
    /// address family that serves `program` at exactly `version`, as rpcbind lists them.
    fn write_address_list(&self, program: u32, version: u32, local: SocketAddr, out: &mut XdrWriter) {
        // Semantics constants of <netconfig.h>: connection-oriented with orderly release,
        // and connectionless.
        const NC_TPI_CLTS: u32 = 1;
        const NC_TPI_COTS_ORD: u32 = 3;
        let family = if crate::exports::canonical_ip(local.ip()).is_ipv6() { "inet6" } else { "inet" };
        for m in self.mappings().into_iter().filter(|m| m.program == program && m.version == version) {
            let tcp = m.protocol == IPPROTO_TCP;
            out.bool(true);
            out.opaque(Self::universal_address(local, m.port).as_bytes());
            out.opaque(Self::netid(m.protocol, local).as_bytes());
            out.u32(if tcp { NC_TPI_COTS_ORD } else { NC_TPI_CLTS });
            out.opaque(family.as_bytes());
            out.opaque(if tcp { b"tcp" } else { b"udp" });
        }
        out.bool(false);
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
        match args {
            Args::Null => {}
            Args::Mapping(program, version, protocol, _) => match ctx.procedure {
                3 => out.u32(self.find(program, version, protocol, false).unwrap_or(0) as u32),
                _ => out.bool(false),
            },
            Args::Rpcb(rpcb) => match ctx.procedure {
                proc::GETADDR | proc::GETVERSADDR => {
                    // RFC 1833: the netid asked for is ignored; it is the transport's the
                    // call came in on, as rpcbind answers (libnfs sends an empty one).
                    let port = self.find(rpcb.program, rpcb.version, Self::protocol(ctx.transport), ctx.procedure == proc::GETVERSADDR);
                    let uaddr = port.map(|p| Self::universal_address(ctx.local, p)).unwrap_or_default();
                    out.opaque(uaddr.as_bytes());
                }
                proc::GETADDRLIST => self.write_address_list(rpcb.program, rpcb.version, ctx.local, out),
                _ => out.bool(false),
            },
            Args::Dump if ctx.version == 2 => {
                for m in self.mappings() {
                    out.bool(true);
                    for v in [m.program, m.version, m.protocol, m.port as u32] {
                        out.u32(v);
                    }
                }
                out.bool(false);
            }
            Args::Dump => {
                // The addresses are the one called, so their netid is of its family.
                for m in self.mappings() {
                    out.bool(true);
                    out.u32(m.program);
                    out.u32(m.version);
                    out.opaque(Self::netid(m.protocol, ctx.local).as_bytes());
                    out.opaque(Self::universal_address(ctx.local, m.port).as_bytes());
                    out.opaque(b"nasd");
                }
                out.bool(false);
            }
            // As rpcbind, a CALLIT is answered only if the call it carries succeeds, so a
            // broadcast gets replies from the servers of the program alone (libnfs's
            // discovery of servers gives up on any other reply). Only NULL of a program
            // served here is run: it does nothing, and nothing is passed on.
            Args::CallIt(program, version, procedure) => {
                let port =
                    self.find(program, version, Self::protocol(ctx.transport), true).filter(|_| procedure == 0).ok_or(ProcError::Drop)?;
                if ctx.version == 2 {
                    out.u32(port as u32);
                } else {
                    out.opaque(Self::universal_address(ctx.local, port).as_bytes());
                }
                out.opaque(b"");
            }
            Args::GetTime => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                out.u32(now as u32);
            }
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
        assert_eq!(Portmap::universal_address("127.0.0.1:111".parse().unwrap(), 2049), "127.0.0.1.8.1");
        assert_eq!(Portmap::universal_address("[::ffff:10.0.0.1]:111".parse().unwrap(), 20048), "10.0.0.1.78.80");
    }

    /// The result of `procedure` of rpcbind `version`, called over `transport` at `local`
    /// of a portmapper on 111 for NFS on 2049.
    fn call(local: &str, transport: Transport, version: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
        let pm = Portmap::new(Arc::new(AtomicU16::new(2049)), 111);
        let ctx = CallContext {
            xid: 1,
            program: PROGRAM,
            version,
            procedure,
            credential: crate::rpc::Credential::None,
            peer: "127.0.0.1:900".parse().unwrap(),
            local: local.parse().unwrap(),
            transport,
            may_block: false,
            early_reply: None,
        };
        let mut out = XdrWriter::new();
        pm.call(&ctx, &mut XdrReader::new(args), &mut out).unwrap();
        out.into_inner()
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
        for exact in [false, true] {
            assert_eq!(pm.find(100003, 3, IPPROTO_TCP, exact), Some(2049));
            assert_eq!(pm.find(100005, 3, IPPROTO_UDP, exact), Some(2049));
            assert_eq!(pm.find(100021, 4, IPPROTO_TCP, exact), None, "NLM is not served");
            assert_eq!(pm.find(100003, 3, 99, exact), None, "no such protocol");
        }
        // As rpcbind: GETPORT and GETADDR name the program's port whatever the version,
        // so a client asking for NFS v4 or MOUNT v1 reaches it and learns the versions
        // from its PROG_MISMATCH; GETVERSADDR finds the version asked for only.
        assert_eq!(pm.find(100003, 4, IPPROTO_TCP, false), Some(2049));
        assert_eq!(pm.find(100005, 1, IPPROTO_UDP, false), Some(2049));
        assert_eq!(pm.find(100003, 4, IPPROTO_TCP, true), None);
        assert_eq!(pm.find(100000, 2, IPPROTO_TCP, true), Some(111));
    }
}
