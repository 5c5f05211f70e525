//! State shared by every protocol: the exports with their storage, the file-handle key,
//! the MOUNT table and metrics.

use crate::exports::{canonical_ip, squash, Export, ExportOptions};
use crate::fh::HandleKey;
use crate::metrics::Metrics;
use crate::mount3::MountList;
use crate::rpc::CallContext;
use crate::vfs::{Cred, ObjectId, Vfs, VfsError};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

/// The exports being served. A reload replaces the whole list at once; a call keeps the
/// export it was admitted to until it is answered.
pub type ExportList = Arc<Vec<Arc<ExportRuntime>>>;

pub struct ExportRuntime {
    pub export: Export,
    pub vfs: Arc<dyn Vfs>,
    /// Device and inode of the export's directory when it was opened: a reload that finds
    /// another directory at the path (a file system mounted there since) opens it afresh.
    pub root: (u64, u64),
}

pub struct ServerState {
    exports: RwLock<ExportList>,
    pub handle_key: HandleKey,
    /// (client address, mounted path) pairs for MOUNT DUMP.
    pub mounts: Mutex<MountList>,
    pub metrics: Arc<Metrics>,
    /// The port NFS and MOUNT are served on (for the portmapper).
    pub nfs_port: Arc<std::sync::atomic::AtomicU16>,
}

/// A call admitted to an export: the object, the client's options and the squashed
/// identity to run as.
pub struct Admitted {
    pub rt: Arc<ExportRuntime>,
    pub obj: ObjectId,
    pub options: ExportOptions,
    pub cred: Cred,
}

impl ServerState {
    pub fn new(exports: Vec<ExportRuntime>, handle_key: HandleKey, metrics: Arc<Metrics>) -> Self {
        Self {
            exports: RwLock::new(Arc::new(exports.into_iter().map(Arc::new).collect())),
            handle_key,
            mounts: Mutex::new(MountList::new(crate::mount3::MOUNTS_PER_CLIENT, crate::mount3::MOUNTS_LISTED)),
            metrics,
            nfs_port: Arc::new(std::sync::atomic::AtomicU16::new(0)),
        }
    }

    /// The exports as of now.
    pub fn exports(&self) -> ExportList {
        self.exports.read().clone()
    }

    /// Serves `exports` from now on. Calls already admitted finish on the export they
    /// were admitted to.
    pub fn replace_exports(&self, exports: Vec<Arc<ExportRuntime>>) {
        *self.exports.write() = Arc::new(exports);
    }

    pub fn export_by_id(&self, id: u32) -> Option<Arc<ExportRuntime>> {
        self.exports.read().iter().find(|e| e.export.id == id).cloned()
    }

    /// The options this client gets on `rt`, or why it is refused.
    pub fn client_options(&self, rt: &ExportRuntime, ctx: &CallContext) -> Result<ExportOptions, VfsError> {
        let ip = canonical_ip(ctx.peer.ip());
        // On a thread that must not wait, a name the resolver would have to find moves the
        // call to one that may; there, with every lookup thread taken, the client is told
        // to retry (JUKEBOX) rather than refused for want of a name.
        let not_yet = if ctx.may_block { VfsError::Jukebox } else { VfsError::WouldBlock };
        let opts = rt.export.options_for(ip, ctx.may_block).map_err(|_| not_yet)?.ok_or(VfsError::Access)?;
        if opts.secure && ctx.peer.port() >= 1024 {
            tracing::debug!(client = %ctx.peer, export = %rt.export.path.display(), "refused: source port is not privileged (export is 'secure')");
            return Err(VfsError::Perm);
        }
        Ok(opts.clone())
    }

    /// Whether any export admits this client. The resolver is not asked, so a name
    /// wildcard rule counts only for a client whose name is already confirmed (by an
    /// earlier MNT).
    pub fn admits_anywhere(&self, client: std::net::IpAddr) -> bool {
        let ip = canonical_ip(client);
        self.exports.read().iter().any(|rt| rt.export.admits(ip))
    }

    /// Whether a rule of some export names this client, not `*` alone ([`Export::names`]).
    pub fn names_anywhere(&self, client: std::net::IpAddr) -> bool {
        let ip = canonical_ip(client);
        self.exports.read().iter().any(|rt| rt.export.names(ip))
    }

    /// The export a MOUNT path names (by id) and the path below its root.
    /// The exports a MOUNT path is in, the deepest first ([`crate::exports::ExportTable::mount_candidates`]).
    pub fn exports_table_lookup(&self, path: &str) -> Vec<(u32, std::path::PathBuf)> {
        let table = crate::exports::ExportTable { exports: self.exports.read().iter().map(|e| e.export.clone()).collect() };
        table.mount_candidates(path).into_iter().map(|(e, rest)| (e.id, rest)).collect()
    }

    pub fn file_handle(&self, rt: &ExportRuntime, obj: &ObjectId) -> Vec<u8> {
        self.handle_key.encode(rt.export.id, obj)
    }

    /// Verifies a wire handle and admits the caller to its export.
    pub fn admit(&self, ctx: &CallContext, fh: &[u8]) -> Result<Admitted, VfsError> {
        let (export_id, obj) = self.handle_key.decode(fh)?;
        let rt = self.export_by_id(export_id).ok_or(VfsError::Stale)?;
        let options = self.client_options(&rt, ctx)?;
        let cred = squash(&options, &ctx.credential);
        Ok(Admitted { rt, obj, options, cred })
    }
}
