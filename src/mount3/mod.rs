//! MOUNT protocol version 3 (RFC 1813 appendix I): program 100005.
//!
//! Served on the same port as NFS. MNT resolves a path inside an export component by
//! component, never following symlinks, and answers with the directory's file handle.
//!
//! Versions 1 and 2 (RFC 1094) are served too, except their MNT, which answers with an
//! NFSv2 handle (NFSv2 is not served): their DUMP, UMNT, UMNTALL and EXPORT are version
//! 3's. `showmount` on FreeBSD, macOS and illumos asks with version 1, and libnfs looks
//! for servers with a NULL of version 2.

use crate::rpc::{CallContext, ProcError, RpcProgram, Transport};
use crate::server::state::ServerState;
use crate::vfs::{Cred, FileKind, VfsError};
use crate::xdr::{XdrReader, XdrResult, XdrWriter};
use std::path::Component;
use std::sync::Arc;

mod list;
pub use list::MountList;

pub const PROGRAM: u32 = 100005;
pub const VERSION: u32 = 3;
/// The oldest version whose listings are answered.
pub const OLDEST_VERSION: u32 = 1;
const MNTPATHLEN: usize = 1024;
/// Mounts DUMP lists per client address, and in all.
pub const MOUNTS_PER_CLIENT: usize = 64;
pub const MOUNTS_LISTED: usize = 4096;
/// Bytes of mount entries one DUMP reply carries at most: the list is informational, and
/// its reply must not outgrow the others. Over UDP, what fits one datagram.
const DUMP_REPLY_MAX: usize = 256 * 1024;
const DUMP_DATAGRAM_MAX: usize = 60 * 1024;
const AUTH_SYS: u32 = 1;

/// Mount requests, which any peer can send (over UDP, from any source address), logged
/// at most once a second.
static MOUNT_LOG: crate::throttle::Throttle = crate::throttle::Throttle::new(1);

pub mod proc {
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;
    pub const NAMES: [&str; 6] = ["NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];
}

/// Why MNT gives no file handle.
enum Refusal {
    Status(MountStatus),
    /// Nothing is answered; the client's retransmission may fare better.
    TryLater,
}

impl From<MountStatus> for Refusal {
    fn from(s: MountStatus) -> Self {
        Refusal::Status(s)
    }
}

/// mountstat3
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MountStatus {
    Ok = 0,
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    Access = 13,
    NotDir = 20,
    Inval = 22,
    NameTooLong = 63,
    NotSupp = 10004,
    ServerFault = 10006,
}

impl From<VfsError> for MountStatus {
    fn from(e: VfsError) -> Self {
        match e {
            VfsError::Perm => MountStatus::Perm,
            VfsError::NoEnt | VfsError::Stale => MountStatus::NoEnt,
            VfsError::Access => MountStatus::Access,
            VfsError::NotDir => MountStatus::NotDir,
            VfsError::Inval => MountStatus::Inval,
            VfsError::NameTooLong => MountStatus::NameTooLong,
            VfsError::NotSupp => MountStatus::NotSupp,
            VfsError::ServerFault => MountStatus::ServerFault,
            _ => MountStatus::Io,
        }
    }
}

/// Decoded MOUNT arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args<'a> {
    Null,
    Mnt(&'a [u8]),
    Dump,
    Umnt(&'a [u8]),
    UmntAll,
    Export,
}

impl<'a> Args<'a> {
    pub fn decode(procedure: u32, r: &mut XdrReader<'a>) -> Option<XdrResult<Args<'a>>> {
        Some(match procedure {
            proc::NULL => Ok(Args::Null),
            proc::MNT => r.opaque(MNTPATHLEN).map(Args::Mnt),
            proc::DUMP => Ok(Args::Dump),
            proc::UMNT => r.opaque(MNTPATHLEN).map(Args::Umnt),
            proc::UMNTALL => Ok(Args::UmntAll),
            proc::EXPORT => Ok(Args::Export),
            _ => return None,
        })
    }
}

pub struct Mount3 {
    state: Arc<ServerState>,
}

impl Mount3 {
    pub fn new(state: Arc<ServerState>) -> Self {
        Self { state }
    }

    /// MNT. A client whose name cannot be looked up yet (every lookup thread taken) gets
    /// no answer: MOUNT has no "try again later", and a refusal would fail the mount, where
    /// the client's retransmission will find a thread.
    fn mnt(&self, ctx: &CallContext, path: &[u8], out: &mut XdrWriter) -> Result<(), ProcError> {
        let result = match self.resolve(ctx, path) {
            Err(Refusal::TryLater) => return Err(ProcError::Drop),
            Err(Refusal::Status(status)) => Err(status),
            Ok(fh) => Ok(fh),
        };
        if let Some(held_back) = MOUNT_LOG.allow() {
            let path = String::from_utf8_lossy(path);
            match &result {
                Ok(_) => tracing::info!(client = %ctx.peer, %path, held_back, "mounted"),
                Err(status) => tracing::info!(client = %ctx.peer, %path, ?status, held_back, "mount refused"),
            }
        }
        match result {
            Ok(fh) => {
                out.u32(MountStatus::Ok as u32);
                out.opaque(&fh);
                out.u32(1);
                out.u32(AUTH_SYS);
                // Valid UTF-8: `resolve` accepted it.
                self.remember_mount(ctx.peer.ip().to_string(), listed_path(&String::from_utf8_lossy(path)));
            }
            Err(status) => out.u32(status as u32),
        }
        Ok(())
    }

    fn resolve(&self, ctx: &CallContext, path: &[u8]) -> Result<Vec<u8>, Refusal> {
        let path = std::str::from_utf8(path).map_err(|_| MountStatus::Inval)?;
        if !path.is_empty() && !path.starts_with('/') {
            return Err(MountStatus::Inval.into());
        }
        // The deepest export the path is in that admits the client.
        let mut refusal = Refusal::Status(MountStatus::NoEnt);
        let mut admitted = None;
        for (export, rest) in self.state.exports_table_lookup(path) {
            let Some(rt) = self.state.export_by_id(export) else { continue };
            match self.state.client_options(&rt, ctx) {
                Ok(_) => {
                    admitted = Some((rt, rest));
                    break;
                }
                Err(VfsError::Jukebox) => return Err(Refusal::TryLater),
                // Not admitted by this export: one above it may admit the client.
                Err(VfsError::Access) => refusal = Refusal::Status(MountStatus::Access),
                // Admitted but refused (`secure`, an unprivileged port): as mountd, no other
                // export is tried.
                Err(_) => return Err(MountStatus::Access.into()),
            }
        }
        let (rt, rest) = admitted.ok_or(refusal)?;
        // The path is walked as root, as mountd walks it: what the client may do there is
        // checked by every NFS call it makes with the handle, under the export's squashing;
        // a directory above it that the squashed identity cannot search does not refuse
        // the mount of one below that it may use.
        let cred = Cred::root();
        let mut obj = rt.vfs.root();
        for comp in rest.components() {
            match comp {
                Component::Normal(name) => {
                    let (next, attr) = rt.vfs.lookup(&cred, &obj, name.as_encoded_bytes()).map_err(MountStatus::from)?;
                    if attr.kind != FileKind::Directory {
                        return Err(MountStatus::NotDir.into());
                    }
                    obj = next;
                }
                Component::CurDir => {}
                _ => return Err(MountStatus::Inval.into()),
            }
        }
        let attr = rt.vfs.getattr(&cred, &obj).map_err(MountStatus::from)?;
        if attr.kind != FileKind::Directory {
            return Err(MountStatus::NotDir.into());
        }
        Ok(self.state.file_handle(&rt, &obj))
    }

    /// Adds a mount to the list DUMP reports, which is bounded ([`MountList`]).
    fn remember_mount(&self, host: String, path: String) {
        if let Some((host, path)) = self.state.mounts.lock().add(host, path) {
            tracing::debug!(client = %host, path = %path, "mount list full (for this client or in all): this mount, listed longest ago, is left out");
        }
    }

    fn dump(&self, ctx: &CallContext, out: &mut XdrWriter) {
        let max = if ctx.transport == Transport::Udp { DUMP_DATAGRAM_MAX } else { DUMP_REPLY_MAX };
        let mut bytes = 0;
        for (host, dir) in self.state.mounts.lock().iter() {
            bytes += 12 + crate::xdr::pad4(host.len()) + crate::xdr::pad4(dir.len());
            if bytes > max {
                break;
            }
            out.bool(true);
            out.opaque(host.as_bytes());
            out.opaque(dir.as_bytes());
        }
        out.bool(false);
    }

    fn export_list(&self, out: &mut XdrWriter) {
        use crate::exports::ClientSpec;
        for rt in self.state.exports().iter() {
            out.bool(true);
            out.opaque(rt.export.path.as_os_str().as_encoded_bytes());
            for rule in &rt.export.rules {
                let name = match &rule.spec {
                    ClientSpec::Anyone => "*".to_string(),
                    ClientSpec::Address(a) => a.to_string(),
                    ClientSpec::Network(a, p) => format!("{a}/{p}"),
                    ClientSpec::Host(h, _) | ClientSpec::Wildcard(h) => h.clone(),
                };
                out.bool(true);
                out.opaque(name.as_bytes());
            }
            out.bool(false);
        }
        out.bool(false);
    }
}

/// A mounted path as DUMP lists it: without empty and `.` components or a trailing
/// slash, so that `/srv//a/./` and `/srv/a`, one directory, are one entry (and one client
/// cannot fill the list with spellings of it).
fn listed_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    format!("/{}", parts.join("/"))
}

impl RpcProgram for Mount3 {
    fn program(&self) -> u32 {
        PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (OLDEST_VERSION, VERSION)
    }

    fn call(&self, ctx: &CallContext, args: &mut XdrReader<'_>, out: &mut XdrWriter) -> Result<(), ProcError> {
        // MNT of versions 1 and 2 would answer with an NFSv2 handle. (Version 2's PATHCONF
        // is refused too: `Args::decode` knows no procedure 7.)
        if ctx.version < VERSION && ctx.procedure == proc::MNT {
            return Err(ProcError::ProcUnavail);
        }
        let args = Args::decode(ctx.procedure, args).ok_or(ProcError::ProcUnavail)??;
        match args {
            Args::Null => {}
            Args::Mnt(path) => self.mnt(ctx, path, out)?,
            Args::Dump => self.dump(ctx, out),
            Args::Umnt(path) => {
                let path = listed_path(&String::from_utf8_lossy(path));
                self.state.mounts.lock().remove(&ctx.peer.ip().to_string(), &path);
            }
            Args::UmntAll => {
                self.state.mounts.lock().remove_client(&ctx.peer.ip().to_string());
            }
            Args::Export => self.export_list(out),
        }
        Ok(())
    }

    fn procedure_name(&self, _version: u32, procedure: u32) -> &'static str {
        proc::NAMES.get(procedure as usize).copied().unwrap_or("unknown")
    }

    fn results_start_with_status(&self, procedure: u32) -> bool {
        procedure == proc::MNT
    }
}
