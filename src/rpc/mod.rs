//! ONC RPC v2 (RFC 5531): message headers, credentials, record marking, the duplicate
//! request cache and the dispatch contract that every RPC program implements.
//!
//! Nothing here knows about NFS: a program is anything implementing [`RpcProgram`].

pub mod auth;
pub mod dispatch;
pub mod drc;
pub mod held_up;
pub mod message;
pub mod record;

use crate::xdr::{XdrReader, XdrWriter};
use std::net::SocketAddr;

pub use auth::{AuthSys, Credential};
pub use message::{AcceptError, AuthStat, CallHeader};

/// A framed reply ready for the wire: `bytes` (record mark first), then, for a READ served
/// from the page cache without copying, the bytes of `file` and their XDR padding.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub file: Option<crate::vfs::FileRange>,
}

impl Reply {
    pub fn len(&self) -> usize {
        self.bytes.len() + self.file.as_ref().map_or(0, |f| crate::xdr::pad4(f.len))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a procedure sees of the call it is serving.
#[derive(Debug, Clone)]
pub struct CallContext<'a> {
    pub xid: u32,
    pub program: u32,
    pub version: u32,
    pub procedure: u32,
    pub credential: Credential,
    /// The client's address (IPv4-mapped IPv6 already unmapped).
    pub peer: SocketAddr,
    /// The server address the call arrived at.
    pub local: SocketAddr,
    pub transport: Transport,
    /// False on a network thread: the procedure must not wait for the disk and returns
    /// [`ProcError::WouldBlock`] instead, to be run again on a thread that may.
    pub may_block: bool,
    /// Where [`Self::reply_before_durable`] puts the reply: for calls the duplicate
    /// request journal keeps, if there is one.
    pub early_reply: Option<drc::EarlyReply<'a>>,
}

impl CallContext<'_> {
    /// Called by a procedure whose successful reply, complete in `out` (the dispatcher's
    /// writer), speaks of a change that is made and about to be made durable. The reply
    /// is put aside first, so that a retransmission reaching a server restarted during
    /// the sync is answered with it rather than running the change again; the
    /// dispatcher's final reply, success or failure, replaces it.
    pub fn reply_before_durable(&self, out: &XdrWriter) {
        if let Some(early) = &self.early_reply {
            early.keep(&record::framed_copy(out));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// Outcome of a procedure, mapped to the accepted/denied reply by the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcError {
    ProcUnavail,
    GarbageArgs,
    SystemErr,
    Auth(AuthStat),
    /// The request must not be answered (e.g. a retransmit of a call still in progress).
    Drop,
    /// Only with `may_block` false: the call would wait for the disk and did nothing.
    WouldBlock,
}

impl From<crate::xdr::XdrError> for ProcError {
    fn from(_: crate::xdr::XdrError) -> Self {
        ProcError::GarbageArgs
    }
}

/// One RPC program (NFS, MOUNT, portmap, ...). `call` decodes its arguments from `args`
/// and appends the procedure's results to `out`, which already holds the accepted-reply
/// header.
pub trait RpcProgram: Send + Sync {
    fn program(&self) -> u32;
    /// Inclusive range of supported versions, reported in PROG_MISMATCH.
    fn versions(&self) -> (u32, u32);
    fn call(&self, ctx: &CallContext, args: &mut XdrReader<'_>, out: &mut XdrWriter) -> Result<(), ProcError>;
    /// Whether replies to this procedure are kept in the duplicate request cache because
    /// running it twice would not give the same result.
    fn is_non_idempotent(&self, _version: u32, _procedure: u32) -> bool {
        false
    }
    /// Whether such a reply is also kept across a restart of the server (written to the
    /// duplicate request journal): for calls whose second run would answer differently
    /// and that are rare enough to pay a small write each, namespace changes; not WRITE,
    /// whose second run stores the same bytes again.
    fn is_kept_across_restarts(&self, _version: u32, _procedure: u32) -> bool {
        false
    }
    /// Whether a call normally finishes in microseconds without waiting for the disk (no
    /// fsync, no directory change), so it is tried first on the connection's own task,
    /// saving a thread hand-off. `args` are the undecoded arguments.
    fn is_quick(&self, _version: u32, _procedure: u32, _args: &[u8]) -> bool {
        false
    }
    /// Whether a successful reply's results begin with a status word (counted in metrics).
    fn results_start_with_status(&self, _procedure: u32) -> bool {
        false
    }
    /// Whether a reply with this status refused the call before it changed anything (a
    /// bad or stale handle, a caller not admitted, a read-only export): such a reply is
    /// not kept by the duplicate request cache, since anyone can cause one.
    fn refused_unchanged(&self, _procedure: u32, _status: u32) -> bool {
        false
    }
    /// Short name of a procedure for logs and metrics.
    fn procedure_name(&self, _version: u32, _procedure: u32) -> &'static str {
        "unknown"
    }
}
