//! NFS version 3 (RFC 1813): program 100003, version 3.
//!
//! `xdr.rs` holds the wire types; `proc.rs` one function per procedure, each calling the
//! [`crate::vfs::Vfs`] of the export the file handle belongs to.

mod proc;
pub mod xdr;

use crate::rpc::{CallContext, ProcError, RpcProgram};
use crate::server::state::ServerState;
use crate::xdr::{XdrReader, XdrWriter};
use std::sync::Arc;
use xdr::Args;

pub struct Nfs3 {
    state: Arc<ServerState>,
}

impl Nfs3 {
    pub fn new(state: Arc<ServerState>) -> Self {
        Self { state }
    }
}

impl RpcProgram for Nfs3 {
    fn program(&self) -> u32 {
        xdr::PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (xdr::VERSION, xdr::VERSION)
    }

    fn call(&self, ctx: &CallContext, args: &mut XdrReader<'_>, out: &mut XdrWriter) -> Result<(), ProcError> {
        let args = match Args::decode(ctx.procedure, args) {
            None => return Err(ProcError::ProcUnavail),
            Some(Err(e)) => {
                tracing::debug!(client = %ctx.peer, xid = ctx.xid, error = %e, "undecodable NFSv3 arguments");
                return Err(ProcError::GarbageArgs);
            }
            Some(Ok(a)) => a,
        };
        proc::run(&self.state, ctx, args, out)
    }

    fn is_non_idempotent(&self, _version: u32, procedure: u32) -> bool {
        use xdr::proc::*;
        matches!(procedure, SETATTR | WRITE | CREATE | MKDIR | SYMLINK | MKNOD | REMOVE | RMDIR | RENAME | LINK | COMMIT)
    }

    fn is_kept_across_restarts(&self, _version: u32, procedure: u32) -> bool {
        use xdr::proc::*;
        // Each already waits for a directory sync (or changes attributes, rarely), so
        // the journal's write costs them nothing that shows.
        matches!(procedure, SETATTR | CREATE | MKDIR | SYMLINK | MKNOD | REMOVE | RMDIR | RENAME | LINK)
    }

    fn is_quick(&self, _version: u32, procedure: u32, args: &[u8]) -> bool {
        use xdr::proc::*;
        match procedure {
            NULL | GETATTR | LOOKUP | ACCESS | READLINK | READ | READDIR | READDIRPLUS | FSSTAT | FSINFO | PATHCONF => true,
            // An UNSTABLE write only reaches the page cache.
            WRITE => xdr::write_stability(args) == Some(crate::vfs::Stability::Unstable),
            _ => false,
        }
    }

    fn results_start_with_status(&self, procedure: u32) -> bool {
        procedure != xdr::proc::NULL
    }

    fn refused_unchanged(&self, _procedure: u32, status: u32) -> bool {
        use xdr::Status;
        // BADTYPE: a MKNOD of a type that is no special file is answered, as by knfsd,
        // before its handle is looked at, so anyone can send it. JUKEBOX asks the client
        // to send the call again: kept, its retransmission would get only this answer.
        [Status::Perm, Status::Access, Status::RoFs, Status::Stale, Status::BadHandle, Status::BadType, Status::Jukebox]
            .iter()
            .any(|s| *s as u32 == status)
    }

    fn procedure_name(&self, _version: u32, procedure: u32) -> &'static str {
        xdr::proc::NAMES.get(procedure as usize).copied().unwrap_or("unknown")
    }
}
