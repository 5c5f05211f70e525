//! The local-directory backend: exports a directory of a Linux filesystem.
//!
//! Objects are named by the kernel's own persistent file handles (`name_to_handle_at`),
//! which survive renames and server restarts and go stale only when the inode is gone.
//! Lookups never follow symlinks and never cross into another filesystem, and `..` at the
//! export root is the root itself, so no name reaches outside the export. Wire handles
//! are authenticated one layer up, so a forged handle never reaches `open_by_handle_at`.

mod cache;
mod close_check;
pub mod creds;
mod dirstream;
mod sync;
mod sys;

use crate::vfs::*;
use cache::{CachedObject, HandleCache, InodeKey, ObjectCache};
use dirstream::{DirStream, DirStreams, EntryStat, ListingHelpers, LookAhead, StatBatch};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use sync::{SyncGroup, SyncKind, SyncTicket};

/// Threads that share the `statx` calls of READDIRPLUS batches with the thread serving the
/// call: one fewer than the cores, none on one core.
fn listing_helpers() -> Option<&'static ListingHelpers> {
    static POOL: std::sync::OnceLock<Option<ListingHelpers>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 {
            return None;
        }
        ListingHelpers::start(cores - 1).map_err(|e| tracing::warn!(error = %e, "no helper threads for directory listings")).ok()
    })
    .as_ref()
}

/// Smallest batch of listed entries fetched once a reply takes more than its caller
/// estimated.
const MIN_PLUS_BATCH: usize = 4;
/// Smallest READDIRPLUS batch whose `statx` calls are shared with a second thread: below
/// it, waking the helper costs more than it saves.
const PARALLEL_PLUS_BATCH: usize = 8;

#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub path: PathBuf,
    /// Reported as the filesystem id of every object in this export.
    pub fsid: u64,
    /// `sync`: stable writes and namespace changes are on disk before the reply.
    pub sync: bool,
    /// Open objects kept in the cache.
    pub cache_capacity: usize,
    /// A cached object unused for this long is let go (after between half of it and all of
    /// it), so that files others delete free their space; `None`: kept until the cache is
    /// full.
    pub cache_idle: Option<Duration>,
    /// Shared by exports that may share files (all of a server's exports: they may nest).
    pub changes: ChangeCount,
}

/// How the changes made through nasd are counted and kept apart, shared by every export
/// that may hold the same files (all of a server's: exports nest), so that a change
/// made through one is seen, and waited for, by calls through another.
///
/// Modifying calls begun and finished so far: work done ahead of a call (entries of a
/// listing looked at before it was asked for) is used only if no modifying call was
/// running when the work began and none has begun since. A call counts as begun before
/// its change and as finished once the change is made, when its method returns the
/// change (`Made`), whose sync may still be running: the sync alters no entry.
#[derive(Debug, Clone, Default)]
pub struct ChangeCount(Arc<ChangeCounters>);

#[derive(Debug)]
struct ChangeCounters {
    begun: AtomicU64,
    finished: AtomicU64,
    /// Held by a change of a directory's entries from its pre-op to its post-op
    /// attributes ([`LocalFs::change_entries`]), one per directory inode number modulo
    /// their count: keyed by inode, not by cached object, which the cache may drop and
    /// open again while a call still holds the old one (nor by export: nested exports
    /// reach one directory through two).
    entry_locks: Box<[parking_lot::Mutex<()>]>,
    /// Held by a SETATTR of anything but a directory (which takes its entry lock), keyed
    /// the same way: truncating a large file takes seconds, and must not hold off the
    /// entry changes of directories that share a lock with it.
    attr_locks: Box<[parking_lot::Mutex<()>]>,
    /// Entry changes made through nasd, per directory lock: a listing's buffer filled
    /// before one is not continued, where the directory's times alone may not show it
    /// (a file system or kernel with coarse timestamps: several changes in one tick).
    entry_changes: Box<[AtomicU64]>,
}

impl Default for ChangeCounters {
    fn default() -> Self {
        Self {
            begun: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            entry_locks: (0..ENTRY_LOCKS).map(|_| parking_lot::Mutex::new(())).collect(),
            attr_locks: (0..ENTRY_LOCKS).map(|_| parking_lot::Mutex::new(())).collect(),
            entry_changes: (0..ENTRY_LOCKS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ChangeCount {
    /// The lock a change of the entries of the directory with inode number `fileid` holds.
    fn entry_lock(&self, fileid: u64) -> &parking_lot::Mutex<()> {
        &self.0.entry_locks[entry_lock_slot(fileid)]
    }

    /// The lock a SETATTR of the non-directory with inode number `fileid` holds.
    fn attr_lock(&self, fileid: u64) -> &parking_lot::Mutex<()> {
        &self.0.attr_locks[entry_lock_slot(fileid)]
    }

    /// Entry changes made so far to the directory `fileid` (and those sharing its lock).
    fn entry_changes(&self, fileid: u64) -> u64 {
        self.0.entry_changes[entry_lock_slot(fileid)].load(Ordering::SeqCst)
    }

    fn count_entry_change(&self, fileid: u64) {
        self.0.entry_changes[entry_lock_slot(fileid)].fetch_add(1, Ordering::SeqCst);
    }

    /// A mark of this moment if no modifying call is running (`None` otherwise): work
    /// begun now is still valid while the mark is the same.
    fn quiet_mark(&self) -> Option<u64> {
        let begun = self.0.begun.load(Ordering::SeqCst);
        (self.0.finished.load(Ordering::SeqCst) == begun).then_some(begun)
    }

    /// Counts a modifying call as begun; the guard counts it finished when dropped.
    fn begin(&self) -> Modifying<'_> {
        self.0.begun.fetch_add(1, Ordering::SeqCst);
        Modifying(self)
    }
}

/// Counts a modifying call as finished when dropped, on every return path.
struct Modifying<'a>(&'a ChangeCount);

impl Drop for Modifying<'_> {
    fn drop(&mut self) {
        (self.0).0.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// How changes are made durable on a file system without a journal, where a directory's
/// `fsync` leaves the allocation bitmaps and group descriptors behind (and older kernels'
/// file `fsync` the inode table block).
struct FsSync {
    /// Concurrent changes share one flush.
    group: SyncGroup,
    /// The file system's block device: its `fsync` writes the metadata alone. Without it,
    /// `syncfs`, which also writes every file's dirty data, so a namespace change waits
    /// for the writeback of whatever another client wrote UNSTABLE.
    device: Option<OwnedFd>,
}

impl FsSync {
    /// Makes every metadata change made so far durable, sharing the flush with
    /// concurrent callers.
    /// `on_failure` runs when a flush fails, before any caller learns the outcome.
    fn flush(&self, since: SyncTicket, root: &OwnedFd, on_failure: impl Fn()) -> VfsResult<()> {
        self.flush_kind(SyncKind::Full, since, root, on_failure)
    }

    /// `Full`: as [`Self::flush`]. `Data`, with `syncfs`: everything written, but the
    /// disk's cache not flushed after `syncfs`'s last writes; the caller's own `fsync`
    /// that follows does that.
    fn flush_kind(&self, kind: SyncKind, since: SyncTicket, root: &OwnedFd, on_failure: impl Fn()) -> VfsResult<()> {
        self.group.sync(kind, since, |kind| {
            let flushed = flush_metadata(self.device.as_ref(), kind, root);
            if flushed.is_err() {
                on_failure();
            }
            flushed
        })
    }

    fn new(device: Option<OwnedFd>) -> Self {
        Self { group: SyncGroup::default(), device }
    }
}

/// One flush of a journal-less file system's metadata: an `fsync` of its block `device`,
/// else `syncfs` through `root` (for `SyncKind::Data`, without the flush after it: the
/// caller's own `fsync` follows).
fn flush_metadata(device: Option<&OwnedFd>, kind: SyncKind, root: &OwnedFd) -> VfsResult<()> {
    match device {
        Some(device) => sys::fsync(device),
        // `syncfs` writes the device's metadata buffers (inode tables among them) last,
        // after the cache flush it makes (`sync_filesystem`: `sync_fs(wait)`, then
        // `sync_blockdev`): on a disk with a volatile write cache they are not yet durable
        // when it returns. An `fsync` after it flushes them: without a journal, ext4
        // flushes the device on every `fsync` (since Linux 6.5; before that, not for a
        // clean file, docs/reliability.md).
        None if kind == SyncKind::Full => sys::syncfs(root).and_then(|()| sys::fsync(root)),
        None => sys::syncfs(root),
    }
}

/// How a `sync` export makes each namespace change durable on its file system: decided
/// once, from the file system, for the server and for the bench's report alike.
enum NamespacePlan {
    /// A journal (or a log, or copy-on-write) commits the change with the directory's
    /// `fsync`.
    DirectoryFsync,
    /// No journal (or none that can be seen): an `fsync` of the block device writes all
    /// the file system's metadata.
    DeviceFsync { log: sys::MetadataLog, device: OwnedFd, path: String },
    /// No journal and a block device that cannot be opened: `syncfs`, which also waits
    /// for all dirty file data, and an `fsync`.
    Syncfs { log: sys::MetadataLog, why: std::io::Error },
}

impl NamespacePlan {
    /// The plan for a file system on device `dev` whose metadata log is `log`
    /// ([`sys::metadata_log`]).
    fn of(log: sys::MetadataLog, dev: u64) -> Self {
        match log {
            sys::MetadataLog::Journal => Self::DirectoryFsync,
            log => match sys::open_block_device(dev) {
                Ok((device, path)) => Self::DeviceFsync { log, device, path },
                Err(why) => Self::Syncfs { log, why },
            },
        }
    }

    /// The plan in words (for logs and the bench report).
    fn describe(&self) -> String {
        let no_journal = |log: &sys::MetadataLog| match log {
            sys::MetadataLog::Unknown => "journal unknown, taken as none",
            _ => "no journal",
        };
        match self {
            Self::DirectoryFsync => "an fsync of the changed directory (a journal, log or copy-on-write commits it)".into(),
            Self::DeviceFsync { log, path, .. } => format!("an fsync of its block device {path} (all metadata: {})", no_journal(log)),
            Self::Syncfs { log, why } => format!(
                "syncfs and an fsync (all dirty data and metadata: {}, and its block device cannot be opened: {why})",
                no_journal(log)
            ),
        }
    }

    /// The flush that stands in for the directory's `fsync`, where that is not enough.
    fn into_fs_sync(self) -> Option<FsSync> {
        match self {
            Self::DirectoryFsync => None,
            Self::DeviceFsync { device, .. } => Some(FsSync::new(Some(device))),
            Self::Syncfs { .. } => Some(FsSync::new(None)),
        }
    }
}

/// How a `sync` export on the file system holding `dir` makes each namespace change
/// durable, in words (the bench reports it: it decides the metadata figures).
pub fn namespace_durability(dir: &Path) -> String {
    match DurableCalls::for_dir(dir) {
        Ok(calls) => calls.describe(),
        Err(_) => "unknown (the directory cannot be opened)".into(),
    }
}

/// The calls a `sync` export on the file system holding a directory makes to have each
/// change durable before its reply, one change at a time and without the group commit
/// that shares them between clients. The bench times the local disk making them: with
/// a client that sends one change at a time, the floor for nasd's figure.
pub struct DurableCalls {
    /// Where `syncfs`, and the `fsync` that follows it, go: the directory itself, as the
    /// export root does for nasd.
    root: OwnedFd,
    plan: NamespacePlan,
    /// Calls of [`Self::entries_changed`] so far.
    entries_made: AtomicU64,
    /// Calls of [`Self::data_written`] so far.
    data_made: AtomicU64,
}

impl DurableCalls {
    /// The plan nasd would take for an export at `dir` ([`NamespacePlan::of`]).
    pub fn for_dir(dir: &Path) -> std::io::Result<Self> {
        let root = OwnedFd::from(std::fs::File::open(dir)?);
        let st = sys::fstat(root.as_raw_fd()).map_err(|e| std::io::Error::other(format!("fstat {}: {e}", dir.display())))?;
        let plan = NamespacePlan::of(sys::metadata_log(root.as_raw_fd(), st.st_dev), st.st_dev);
        Ok(Self { root, plan, entries_made: AtomicU64::new(0), data_made: AtomicU64::new(0) })
    }

    /// How many times [`Self::entries_changed`] and [`Self::data_written`] have been called.
    pub fn made(&self) -> (u64, u64) {
        (self.entries_made.load(Ordering::Relaxed), self.data_made.load(Ordering::Relaxed))
    }

    /// The plan in words, as the server logs it.
    pub fn describe(&self) -> String {
        self.plan.describe()
    }

    /// After a change to the entries of `dirs` (both directories of a rename): what
    /// `LocalFs::commit_dirs` does.
    pub fn entries_changed(&self, dirs: &[&std::fs::File]) -> std::io::Result<()> {
        self.entries_made.fetch_add(1, Ordering::Relaxed);
        match &self.plan {
            NamespacePlan::DirectoryFsync => dirs.iter().try_for_each(|d| d.sync_all()),
            NamespacePlan::DeviceFsync { device, .. } => self.flush(Some(device), SyncKind::Full),
            NamespacePlan::Syncfs { .. } => self.flush(None, SyncKind::Full),
        }
    }

    /// After `file`'s data was written, what its COMMIT does: `LocalFs::make_durable`'s
    /// calls in its order.
    pub fn data_written(&self, file: &std::fs::File) -> std::io::Result<()> {
        self.data_made.fetch_add(1, Ordering::Relaxed);
        match &self.plan {
            NamespacePlan::DirectoryFsync => file.sync_all(),
            NamespacePlan::DeviceFsync { device, .. } => file.sync_all().and_then(|()| self.flush(Some(device), SyncKind::Full)),
            NamespacePlan::Syncfs { .. } => self.flush(None, SyncKind::Data).and_then(|()| file.sync_all()),
        }
    }

    fn flush(&self, device: Option<&OwnedFd>, kind: SyncKind) -> std::io::Result<()> {
        flush_metadata(device, kind, &self.root).map_err(|e| std::io::Error::other(format!("flushing the file system's metadata: {e}")))
    }
}

/// A write into blocks already allocated and written, and where they lay on the disk
/// when it was made ([`sys::written_layout`]).
struct Overwrite {
    offset: u64,
    len: u64,
    layout: sys::Layout,
}

/// Where the sync groups a change will wait on stood just before it was made (see
/// [`SyncTicket`]): the whole file system's ([`LocalFs::fs_group`]) and the object's own.
#[derive(Debug, Clone, Copy)]
struct Since {
    fs: SyncTicket,
    obj: SyncTicket,
}

pub struct LocalFs {
    root_fd: OwnedFd,
    root_id: ObjectId,
    root_dev: u64,
    /// Mount the export root is on; objects reached through any other mount (a bind
    /// mount or another filesystem inside the export) are not served.
    root_mount: i32,
    root_ino: u64,
    fsid: u64,
    sync: bool,
    /// Set where the file system has no journal: namespace changes are then made durable
    /// for the whole file system, shared by concurrent changes, instead of by the
    /// directory's `fsync`, and data syncs are followed by the same flush.
    fs_sync: Option<FsSync>,
    /// `syncfs` of a file system with a journal, for changes nothing smaller covers
    /// (attributes of symlinks, FIFOs, sockets and devices).
    syncfs_group: SyncGroup,
    /// An `fsync` of a new object makes its name durable too ([`sys::inode_sync_covers_new_entry`]).
    inode_sync_covers_entry: bool,
    /// The export's file system answers `statx` from memory whatever the flags
    /// ([`sys::attributes_are_local`]; see [`Self::stat_entry`]).
    attributes_are_local: bool,
    /// The write verifier: new on every start, and after every failed sync
    /// ([`Self::renew_write_verifier`]).
    verifier: AtomicU64,
    cache: ObjectCache,
    /// Handles of inodes seen before, so listing them again costs no `name_to_handle_at`.
    handles: HandleCache,
    /// Directory listings in progress, left open where their last reply ended.
    dir_streams: DirStreams,
    /// Descriptors leaving the cache being checked for writeback errors.
    close_checks: close_check::CloseChecks,
    /// The file system refused `RWF_NOWAIT` for a buffered write: stop asking.
    no_nowait_writes: AtomicBool,
    /// The file system refused `RWF_NOWAIT` for a read (tmpfs, vfat): reads that must not
    /// wait go to a thread that may.
    no_nowait_reads: AtomicBool,
    /// The file system's limits, read once at start: PATHCONF and FSINFO report them.
    limits: PathConf,
    changes: ChangeCount,
    /// This backend, for work handed to helper threads.
    me: Weak<LocalFs>,
}

/// How long entries looked at ahead of a listing call stay usable. The call normally
/// follows within a client round trip; this bounds how old an entry's attributes can be
/// when a program other than this server changed the file.
const LOOK_AHEAD_MAX_AGE: std::time::Duration = std::time::Duration::from_millis(100);

/// A listing's first look-ahead takes this many replies' worth of entries; each one used
/// to its end doubles the next, up to [`MAX_LOOK_AHEAD`] entries (or its buffer's end).
const FIRST_LOOK_AHEAD_REPLIES: usize = 4;
const MAX_LOOK_AHEAD: usize = 4096;

/// Handles are small (about 100 bytes cached) and every listed entry has one: the handle
/// cache holds this many for every open object the object cache may hold.
const HANDLES_PER_OPEN_OBJECT: usize = 16;

/// Locks of directories' entry changes ([`LocalFs::change_entries`]) and of SETATTR
/// ([`ChangeCounters::attr_locks`]): two objects share one only when their inode numbers
/// agree modulo this.
const ENTRY_LOCKS: usize = 256;

/// The lock of the object with inode number `fileid` in [`ChangeCounters::entry_locks`]
/// or [`ChangeCounters::attr_locks`].
fn entry_lock_slot(fileid: u64) -> usize {
    (fileid % ENTRY_LOCKS as u64) as usize
}

/// Stable writes of at least this size start their writeback before the group fsync.
const EARLY_WRITEBACK_MIN: usize = 64 * 1024;

/// How long READs of a file are copied after one could not be sent from its page cache:
/// long enough for the client to reconnect and send its READs again.
const COPY_READS_AFTER_FAILED_SEND: Duration = Duration::from_secs(5);

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// The mode a SETATTR that also changes the owner sets. `chown` clears a file's setuid
/// bit (and setgid, where it means set-group-id: group execute set); a mode given in the
/// same call must not put them back for the new owner, as knfsd strips them too.
fn mode_after_chown(mode: u32, kind: FileKind, chown: bool) -> u32 {
    if !chown || kind == FileKind::Directory {
        return mode;
    }
    let setgid = if mode & 0o010 != 0 { libc::S_ISGID } else { 0 };
    mode & !(libc::S_ISUID | setgid)
}

/// Mode-bit permission check, as the kernel does it for a process with `cred`.
fn may(cred: &Cred, attr: &Attr, want: u32) -> bool {
    if cred.uid == 0 {
        // Root may do anything except execute a file nobody may execute.
        return want & X == 0 || attr.kind == FileKind::Directory || attr.mode & 0o111 != 0;
    }
    let bits = if cred.uid == attr.uid {
        (attr.mode >> 6) & 7
    } else if cred.in_group(attr.gid) {
        (attr.mode >> 3) & 7
    } else {
        attr.mode & 7
    };
    bits & want == want
}

/// Whether `cred` may `want` (R/W/X bits) the object: the mode bits where they decide
/// alone, otherwise the kernel's check under the caller's identity, which applies POSIX
/// ACLs as well. An owner's permissions are the mode's owner bits even under an ACL, and
/// root's follow from its capabilities, so only other callers pay the extra syscall.
/// Expects the caller's identity on this thread (as after `resolve`).
fn may_access(cred: &Cred, obj: &CachedObject, attr: &Attr, want: u32) -> VfsResult<bool> {
    if cred.uid == 0 || cred.uid == attr.uid || !creds::enabled() {
        return Ok(may(cred, attr, want));
    }
    Ok(sys::may_access(obj.path_fd.as_raw_fd(), want)?.unwrap_or_else(|| may(cred, attr, want)))
}

/// What ACCESS grants: `may_access`, except that write is asked of the kernel for every
/// caller. An immutable inode or a file system mounted read-only refuses changes to the
/// owner and root too, which the mode bits do not show; knfsd's `nfsd_access` checks
/// both, and a client told otherwise would open for writing and fail only at write-back.
fn may_access_reported(cred: &Cred, obj: &CachedObject, attr: &Attr, want: u32) -> VfsResult<bool> {
    if want & W != 0 && creds::enabled() {
        if let Some(allowed) = sys::may_access(obj.path_fd.as_raw_fd(), want)? {
            return Ok(allowed);
        }
    }
    may_access(cred, obj, attr, want)
}

/// Whether the kernel will let `cred` make the ownership change `attrs` asks for (none
/// asked: yes): root any; the owner only its group, to one it belongs to; else none.
fn may_chown(cred: &Cred, attr: &Attr, attrs: &SetAttrs) -> bool {
    if cred.uid == 0 || !creds::enabled() {
        return true;
    }
    let uid_ok = attrs.uid.is_none_or(|u| u == attr.uid && cred.uid == attr.uid);
    let gid_ok = attrs.gid.is_none_or(|g| cred.uid == attr.uid && (g == attr.gid || cred.in_group(g)));
    uid_ok && gid_ok
}

/// READ and WRITE permission as knfsd grants it: the owner may always read and write its
/// own file (a file created with mode 0444 must still accept the data that follows), and a
/// file that may be executed may be read.
fn may_io(cred: &Cred, obj: &CachedObject, attr: &Attr, want: u32) -> VfsResult<bool> {
    Ok(cred.uid == attr.uid || may_access(cred, obj, attr, want)? || (want == R && may_access(cred, obj, attr, X)?))
}

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn timespec(t: SetTime) -> libc::timespec {
    match t {
        SetTime::Unchanged => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        SetTime::ServerNow => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        SetTime::Client(t) => libc::timespec { tv_sec: t.sec, tv_nsec: t.nsec.min(999_999_999) as i64 },
    }
}

/// Lets go of the cached objects of `fs` that are unused for `idle` (between half of it and
/// all of it), and of directory streams parked for longer than `idle`, until `fs` is
/// dropped.
fn spawn_cache_sweeper(fs: Weak<LocalFs>, idle: Duration) {
    let period = (idle / 2).max(Duration::from_millis(100));
    let spawned = std::thread::Builder::new().name("nasd-cache-sweep".into()).spawn(move || loop {
        std::thread::sleep(period);
        let Some(fs) = fs.upgrade() else { return };
        let dropped = cache::sweep_idle(&fs.cache);
        if dropped > 0 {
            tracing::debug!(dropped, "closed idle cached objects");
        }
        if let Some(before) = std::time::Instant::now().checked_sub(idle) {
            let dropped = fs.dir_streams.drop_parked_before(before);
            if dropped > 0 {
                tracing::debug!(dropped, "closed directory streams of listings left unfinished");
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the cache sweeper: idle objects stay open until the cache is full");
    }
}

impl LocalFs {
    pub fn open(cfg: &LocalConfig) -> anyhow::Result<Arc<Self>> {
        use anyhow::Context;
        let c = CString::new(cfg.path.as_os_str().as_encoded_bytes()).context("export path contains NUL")?;
        // A real (not O_PATH) descriptor: open_by_handle_at needs one as its mount fd.
        let root_fd = sys::openat(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| anyhow::anyhow!("cannot open export directory {}: {e}", cfg.path.display()))?;
        let st = sys::fstat(root_fd.as_raw_fd()).map_err(|e| anyhow::anyhow!("stat {}: {e}", cfg.path.display()))?;
        let (root_id, root_mount) = sys::name_to_handle(root_fd.as_raw_fd(), &CString::default(), libc::AT_EMPTY_PATH)
            .map_err(|e| anyhow::anyhow!("{}: the filesystem does not provide persistent file handles ({e})", cfg.path.display()))?;
        creds::become_root();
        sys::open_by_handle(root_fd.as_raw_fd(), &root_id, libc::O_PATH).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot open objects by handle ({e}); nasd needs root (CAP_DAC_READ_SEARCH) to serve a directory",
                cfg.path.display()
            )
        })?;
        if creds::enabled() {
            // As root, reading the export's own root: only a filter of the call refuses it.
            let probe = sys::may_access(root_fd.as_raw_fd(), libc::R_OK as u32);
            if matches!(probe, Ok(Some(false)) | Err(_)) {
                sys::faccessat2_refused();
            }
            if !matches!(probe, Ok(Some(true))) {
                tracing::warn!(
                    export = %cfg.path.display(),
                    "faccessat2 is missing (Linux before 5.8) or refused (a seccomp filter): permissions follow mode bits alone, so POSIX ACL entries that grant or deny more than the mode's group bits, immutable files and read-only mounts are not seen in ACCESS replies"
                );
            }
        }
        let verifier = AtomicU64::new(rand::random());
        let (link_max, name_max) = sys::link_and_name_max(root_fd.as_raw_fd());
        let limits = PathConf {
            link_max,
            name_max,
            // Linux truncates no name and lets only a privileged caller give files away.
            no_trunc: true,
            chown_restricted: true,
            case_insensitive: false,
            case_preserving: true,
            max_file_size: sys::max_file_size(root_fd.as_raw_fd()),
        };
        let log = sys::metadata_log(root_fd.as_raw_fd(), st.st_dev);
        let inode_sync_covers_entry = sys::inode_sync_covers_new_entry(root_fd.as_raw_fd(), log);
        let attributes_are_local = sys::attributes_are_local(root_fd.as_raw_fd());
        let fs_sync = if cfg.sync {
            let plan = NamespacePlan::of(log, st.st_dev);
            if !matches!(plan, NamespacePlan::DirectoryFsync) {
                // Costs more than a directory's `fsync` (and `syncfs` waits for everything
                // other clients wrote UNSTABLE): worth a warning.
                tracing::warn!(
                    export = %cfg.path.display(),
                    "each namespace change is made durable with {}; stable writes and COMMITs are followed by the same flush",
                    plan.describe()
                );
            }
            plan.into_fs_sync()
        } else {
            None
        };
        let fs = Arc::new_cyclic(|me| Self {
            root_fd,
            root_id,
            root_dev: st.st_dev,
            root_mount,
            root_ino: st.st_ino,
            fsid: cfg.fsid,
            sync: cfg.sync,
            fs_sync,
            syncfs_group: SyncGroup::default(),
            inode_sync_covers_entry,
            attributes_are_local,
            verifier,
            cache: ObjectCache::new(cfg.cache_capacity),
            handles: HandleCache::new(cfg.cache_capacity.saturating_mul(HANDLES_PER_OPEN_OBJECT)),
            dir_streams: DirStreams::default(),
            close_checks: close_check::CloseChecks::default(),
            no_nowait_writes: AtomicBool::new(false),
            no_nowait_reads: AtomicBool::new(false),
            limits,
            changes: cfg.changes.clone(),
            me: me.clone(),
        });
        if let Some(idle) = cfg.cache_idle {
            spawn_cache_sweeper(Arc::downgrade(&fs), idle);
        }
        Ok(fs)
    }

    /// Device and inode of the export's directory as opened.
    pub fn root_identity(&self) -> (u64, u64) {
        (self.root_dev, self.root_ino)
    }

    /// The count of entry changes made through nasd to `dir` (and the directories that
    /// share its lock).
    fn entry_changes(&self, dir: u64) -> u64 {
        self.changes.entry_changes(dir)
    }

    fn modifying(&self) -> Modifying<'_> {
        self.changes.begin()
    }

    pub fn path_is_dir(path: &Path) -> bool {
        path.is_dir()
    }

    /// Runs `f` with full privileges, then returns to the caller's identity.
    /// Fails the call if the thread cannot go back (it might still act as root).
    fn as_root<T>(&self, cred: &Cred, f: impl FnOnce() -> VfsResult<T>) -> VfsResult<T> {
        creds::become_root();
        let r = f();
        if !creds::become_user(cred) {
            return Err(VfsError::Access);
        }
        r
    }

    fn object(&self, cred: &Cred, id: &ObjectId) -> VfsResult<Arc<CachedObject>> {
        if let Some(o) = self.cache.get(id) {
            o.touch();
            if o.claim_place_check() && !self.as_root(cred, || self.still_in_export(&o))? {
                tracing::debug!("cached directory handle refused: the directory is no longer in the export");
                self.cache.remove(id);
                return Err(VfsError::Stale);
            }
            return Ok(o);
        }
        let fd = self.as_root(cred, || {
            let fd = sys::open_by_handle(self.root_fd.as_raw_fd(), id, libc::O_PATH)?;
            let st = sys::fstat(fd.as_raw_fd())?;
            if st.st_dev != self.root_dev {
                return Err(VfsError::Stale);
            }
            // A file may be anywhere (knfsd's no_subtree_check); a directory must be in the
            // export, or its `..` leads out of it.
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR && !self.dir_within_export(fd.as_raw_fd())? {
                tracing::debug!(ino = st.st_ino, "directory handle refused: the directory is no longer in the export");
                return Err(VfsError::Stale);
            }
            Ok(fd)
        })?;
        Ok(self.cache.insert(*id, CachedObject::new(fd)))
    }

    /// Whether a cached object may still be served: a directory only while it is in the
    /// export (as when its handle is first opened). Run as root.
    fn still_in_export(&self, obj: &CachedObject) -> VfsResult<bool> {
        let st = sys::fstat(obj.path_fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            obj.never_check_place();
            return Ok(true);
        }
        self.dir_within_export(obj.path_fd.as_raw_fd())
    }

    /// Whether the directory `fd` is the export root or below it now. A directory's
    /// handle outlives a move out of the export (by a local user, or through another
    /// export of the same file system), and from there `..` would reach the whole file
    /// system. Walks up with one `openat` and one `fstat` per level; run as root.
    fn dir_within_export(&self, fd: RawFd) -> VfsResult<bool> {
        const MAX_DEPTH: usize = 4096;
        let dotdot = CString::new("..").expect("no NUL");
        let mut st = sys::fstat(fd)?;
        let mut current: Option<OwnedFd> = None;
        for _ in 0..MAX_DEPTH {
            if st.st_dev != self.root_dev {
                return Ok(false);
            }
            if st.st_ino == self.root_ino {
                return Ok(true);
            }
            let parent = sys::openat(current.as_ref().map_or(fd, |f| f.as_raw_fd()), &dotdot, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            let parent_st = sys::fstat(parent.as_raw_fd())?;
            if (parent_st.st_dev, parent_st.st_ino) == (st.st_dev, st.st_ino) {
                // The file system's root, reached without passing the export's.
                return Ok(false);
            }
            st = parent_st;
            current = Some(parent);
        }
        Ok(false)
    }

    fn stat(&self, obj: &CachedObject) -> VfsResult<Attr> {
        let st = sys::fstat(obj.path_fd.as_raw_fd())?;
        if st.st_nlink == 0 {
            return Err(VfsError::Stale);
        }
        Ok(sys::attr_from_stat(&st, self.fsid))
    }

    /// Switches to `cred`, then finds the object and its current attributes.
    fn resolve(&self, cred: &Cred, id: &ObjectId) -> VfsResult<(Arc<CachedObject>, Attr)> {
        if !creds::become_user(cred) {
            return Err(VfsError::Access);
        }
        let obj = self.object(cred, id)?;
        match self.stat(&obj) {
            Err(VfsError::Stale) => {
                self.cache.remove(id);
                Err(VfsError::Stale)
            }
            Err(e) => Err(e),
            Ok(a) => Ok((obj, a)),
        }
    }

    fn resolve_dir(&self, cred: &Cred, id: &ObjectId) -> VfsResult<(Arc<CachedObject>, Attr)> {
        let (o, a) = self.resolve(cred, id)?;
        if a.kind != FileKind::Directory {
            return Err(VfsError::NotDir);
        }
        Ok((o, a))
    }

    /// A descriptor for I/O (`want` with `W`: writing), opened once, as root; callers
    /// check permissions first. Reading goes through a read-only descriptor, as in knfsd,
    /// so that a program on the server can still execute a file clients read, and a file
    /// that may only be read (immutable, on a read-only mount) reads; a read-write one is
    /// opened for the first write, and serves reads too from then on. A write that cannot
    /// open one fails with the reason (`ROFS`, `ACCES`) instead of writing through a
    /// read-only descriptor.
    fn io_fd(&self, cred: &Cred, obj: &CachedObject, attr: &Attr, want: u32) -> VfsResult<Arc<OwnedFd>> {
        let writing = want & W != 0;
        let mut fds = obj.io_fds.lock();
        let write = fds.write.as_ref().map(|(fd, _)| fd);
        let cached = if writing { write } else { write.or(fds.read.as_ref()) };
        if let Some(fd) = cached {
            return Ok(fd.clone());
        }
        let path = sys::proc_fd_path(obj.path_fd.as_raw_fd());
        let flags = match (attr.kind, writing) {
            (FileKind::Directory, _) => libc::O_RDONLY | libc::O_DIRECTORY,
            (_, true) => libc::O_RDWR,
            (_, false) => libc::O_RDONLY,
        };
        let fd = Arc::new(self.as_root(cred, || sys::openat(libc::AT_FDCWD, &path, flags, 0))?);
        if writing {
            fds.write = Some((fd.clone(), self.me.clone()));
        } else {
            fds.read = Some(fd.clone());
        }
        Ok(fd)
    }

    /// A regular file the caller may read (`R`) or write (`W`): the object, its current
    /// attributes and a descriptor for the I/O.
    fn data_io(&self, cred: &Cred, id: &ObjectId, want: u32) -> VfsResult<(Arc<CachedObject>, Attr, Arc<OwnedFd>)> {
        let (obj, attr) = self.resolve(cred, id)?;
        let fd = self.file_fd_for(cred, &obj, &attr, want)?;
        Ok((obj, attr, fd))
    }

    /// The I/O descriptor of a resolved object, if it is a regular file the caller may
    /// read (`R`) or write (`W`).
    fn file_fd_for(&self, cred: &Cred, obj: &CachedObject, attr: &Attr, want: u32) -> VfsResult<Arc<OwnedFd>> {
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(VfsError::IsDir),
            _ => return Err(VfsError::Inval),
        }
        if !may_io(cred, obj, attr, want)? {
            return Err(VfsError::Access);
        }
        self.io_fd(cred, obj, attr, want)
    }

    fn is_root(&self, attr: &Attr) -> bool {
        attr.fileid == self.root_ino
    }

    /// The object an open descriptor (of a file just created) refers to, whatever its name
    /// has become since.
    fn open_created(&self, created: &OwnedFd) -> VfsResult<(ObjectId, Attr, OwnedFd)> {
        self.entry_of(sys::openat(libc::AT_FDCWD, &sys::proc_fd_path(created.as_raw_fd()), libc::O_PATH, 0)?)
    }

    /// Opens `name` in `dir` without following symlinks; refuses other filesystems.
    fn open_entry(&self, dir: &CachedObject, name: &CString) -> VfsResult<(ObjectId, Attr, OwnedFd)> {
        self.entry_of(sys::openat(dir.path_fd.as_raw_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)?)
    }

    /// Handle and attributes of the object an `O_PATH` descriptor holds; refuses other
    /// filesystems.
    fn entry_of(&self, fd: OwnedFd) -> VfsResult<(ObjectId, Attr, OwnedFd)> {
        // An existing name a CREATE opened may have another file system mounted on it.
        let st = self.stat_entry(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)?;
        let id = self.handle_for(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH, &st, true)?;
        Ok((id, sys::attr_from_statx(&st, self.fsid), fd))
    }

    /// `statx` of the entry `name` in `dirfd` (with `AT_EMPTY_PATH` in `flags`: of what
    /// `dirfd` holds, an entry just opened) that does not wait on a file system mounted
    /// on it: an NFS mount whose server is down, or a FUSE daemon that hangs, would
    /// otherwise hold a LOOKUP or a listing of the directory (and its thread) for as
    /// long, only for the answer to be thrown away, as nothing past a mount is served.
    /// `AT_STATX_DONT_SYNC` has such a file system answer from its cache. Where the
    /// export's own file system is one of those, an entry found on it is asked again
    /// without the flag, for attributes as fresh as the server's.
    fn stat_entry(&self, dirfd: RawFd, name: &CStr, flags: libc::c_int) -> VfsResult<libc::statx> {
        let st = sys::statx(dirfd, name, flags | libc::AT_STATX_DONT_SYNC)?;
        if self.attributes_are_local || sys::statx_dev(&st) != self.root_dev {
            return Ok(st);
        }
        sys::statx(dirfd, name, flags)
    }

    /// The cached handle of the object `st` describes, if it is on the export's mount and
    /// was seen before.
    fn cached_handle(&self, st: &libc::statx) -> Option<ObjectId> {
        if sys::statx_dev(st) != self.root_dev || sys::statx_mount(st)? != self.root_mount {
            return None;
        }
        self.handles.get(&InodeKey::of(st, sys::coarse_now())?)
    }

    /// The handle of the object `st` describes, which `name` relative to `dirfd` named when
    /// `st` was taken: from the handle cache if the inode was seen before. An object on
    /// another mount (a file system or bind mount inside the export) gets `Access`: it is
    /// not crossed, so nothing outside the export is reachable through it.
    /// `same_object`: `dirfd` and `name` still name exactly that object (an open
    /// descriptor), so the handle found is that object's without looking again.
    fn handle_for(&self, dirfd: RawFd, name: &CStr, flags: libc::c_int, st: &libc::statx, same_object: bool) -> VfsResult<ObjectId> {
        if sys::statx_dev(st) != self.root_dev {
            return Err(VfsError::Access);
        }
        if let Some(id) = self.cached_handle(st) {
            return Ok(id);
        }
        let key = InodeKey::of(st, sys::coarse_now());
        let (id, mount) = sys::name_to_handle(dirfd, name, flags)?;
        if mount != self.root_mount {
            return Err(VfsError::Access);
        }
        // A name may be renamed over, or removed and made again under the inode number
        // just freed, between the `statx` and here: the handle would then name another
        // object than the attributes describe (knfsd takes both from one dentry). Where
        // the handle shows its inode number, a different one tells; otherwise the name is
        // looked at again, and the same inode number and birth time on both sides of the
        // handle's lookup mean it found the same object.
        if let Some(ino) = sys::handle_ino(&id) {
            if ino != st.stx_ino {
                return Err(VfsError::Stale);
            }
        }
        if !same_object {
            let again = sys::statx(dirfd, name, flags)?;
            let born = |st: &libc::statx| (st.stx_ino, st.stx_btime.tv_sec, st.stx_btime.tv_nsec, sys::statx_dev(st));
            if born(&again) != born(st) {
                return Err(VfsError::Stale);
            }
        }
        if let Some(key) = key {
            self.handles.insert(key, id);
        }
        Ok(id)
    }

    /// `name` in the resolved directory `dir`, `..` included.
    fn lookup_entry(&self, cred: &Cred, dir: &CachedObject, dir_attr: &Attr, name: &[u8]) -> VfsResult<(ObjectId, Attr)> {
        if name == b".." {
            if self.is_root(dir_attr) {
                // Never above the export root: `..` of the root is the root.
                return Ok((self.root_id, dir_attr.clone()));
            }
            // The directory may have been moved out of the export since it was cached, or
            // may be moved while this runs: the parent found is what must be in the export.
            let dotdot = CString::new("..").expect("no NUL");
            let parent = sys::openat(dir.path_fd.as_raw_fd(), &dotdot, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            if !self.as_root(cred, || self.dir_within_export(parent.as_raw_fd()))? {
                return Err(VfsError::Stale);
            }
            let (id, attr, fd) = self.entry_of(parent)?;
            self.cache.insert(id, CachedObject::new(fd)).touch();
            return Ok((id, attr));
        }
        let c = if is_dot_or_dotdot(name) { CString::new(name).expect("no NUL") } else { sys::component(name)? };
        // An object looked up before and still open costs one `statx`, not an open.
        let st = self.stat_entry(dir.path_fd.as_raw_fd(), &c, 0)?;
        if sys::statx_dev(&st) != self.root_dev {
            // Another file system mounted on the name: refused without opening it, as
            // nothing on it is served (`handle_for`).
            return Err(VfsError::Access);
        }
        if let Some(id) = self.cached_handle(&st) {
            if let Some(o) = self.cache.get(&id) {
                o.touch();
                return Ok((id, sys::attr_from_statx(&st, self.fsid)));
            }
        }
        let (id, attr, fd) = self.open_entry(dir, &c)?;
        self.cache.insert(id, CachedObject::new(fd));
        Ok((id, attr))
    }

    /// Where the sync groups a change to `obj` will wait on stand, taken before the change.
    fn since(&self, obj: &CachedObject) -> Since {
        Since { fs: self.fs_group().ticket(), obj: obj.sync.ticket() }
    }

    /// The group of the syncs that cover the whole file system: its flush where it has no
    /// journal, `syncfs` otherwise.
    fn fs_group(&self) -> &SyncGroup {
        self.fs_sync.as_ref().map_or(&self.syncfs_group, |fs| &fs.group)
    }

    /// In `sync` mode, makes a directory's changed entries durable; concurrent changes to
    /// one directory share the `fsync`.
    fn commit_dir(&self, cred: &Cred, dir: &CachedObject, attr: &Attr, since: Since) -> VfsResult<()> {
        self.commit_dirs(cred, &[(dir, attr, since)])
    }

    /// [`Self::commit_dir`] for a change that touched several directories (a rename).
    fn commit_dirs(&self, cred: &Cred, dirs: &[(&CachedObject, &Attr, Since)]) -> VfsResult<()> {
        if !self.sync {
            return Ok(());
        }
        if let Some(fs) = &self.fs_sync {
            let since = dirs.iter().map(|(_, _, since)| since.fs).min().expect("at least one directory");
            return fs.flush(since, &self.root_fd, || self.renew_write_verifier());
        }
        for (dir, attr, since) in dirs {
            self.make_durable(cred, dir, attr, SyncKind::Full, *since, None)?;
        }
        Ok(())
    }

    /// In `sync` mode, makes a change to `obj`'s own inode (its attributes) durable: its
    /// `fsync` where it can be opened; symlinks, FIFOs, sockets and devices give no
    /// descriptor to `fsync`, so the whole file system's metadata is synced for them.
    fn commit_inode(&self, cred: &Cred, obj: &CachedObject, attr: &Attr, since: Since) -> VfsResult<()> {
        if !self.sync {
            return Ok(());
        }
        match attr.kind {
            FileKind::Regular | FileKind::Directory => self.make_durable(cred, obj, attr, SyncKind::Full, since, None),
            _ => self.flush_file_system(since),
        }
    }

    /// Every change made so far to the export's file system, durable: its flush where it
    /// has no journal; `syncfs` otherwise (a journal commit and a cache flush, and also
    /// the writeback of every dirty file, so only for what nothing smaller covers).
    fn flush_file_system(&self, since: Since) -> VfsResult<()> {
        match &self.fs_sync {
            Some(fs) => fs.flush(since.fs, &self.root_fd, || self.renew_write_verifier()),
            // Shared by concurrent callers: `syncfs` writes back every dirty file.
            None => self
                .syncfs_group
                .sync(SyncKind::Full, since.fs, |_| sys::syncfs(&self.root_fd).inspect_err(|_| self.renew_write_verifier())),
        }
    }

    /// Makes everything written to `obj` so far durable, sharing the flush with concurrent
    /// callers (group commit); fails if a sync since `since` failed.
    fn make_durable(
        &self,
        cred: &Cred,
        obj: &CachedObject,
        attr: &Attr,
        kind: SyncKind,
        since: Since,
        overwrite: Option<&Overwrite>,
    ) -> VfsResult<()> {
        // `fsync` works through any descriptor of the file.
        let fd = self.io_fd(cred, obj, attr, R)?;
        // A failed sync changes the verifier before any caller learns the outcome: a sync
        // that succeeds after it must not be answered with the old one.
        let file_sync = || {
            obj.sync.sync(kind, since.obj, |kind| {
                let synced = match kind {
                    SyncKind::Data => sys::fdatasync(&fd),
                    SyncKind::Full => sys::fsync(&fd),
                };
                if synced.is_err() {
                    self.renew_write_verifier();
                }
                synced
            })
        };
        // Without a journal, kernels before the 2025 fix of ext4's no-journal fsync leave
        // the inode table block behind when the inode was changed without being marked
        // dirty, as when writeback allocates the blocks of a hole: the data is on disk,
        // the extent that points to it is not. So the whole file system's metadata
        // follows.
        match (&self.fs_sync, overwrite) {
            (None, _) => file_sync(),
            // A write into blocks already allocated and written changes no allocation: the
            // file's own sync writes all it changed, its data and its inode (whose times
            // the write marked dirty, as it should), on any kernel, and ends in the flush.
            // The layout is looked at again after it: should it have changed meanwhile
            // (the range punched and filled again by someone else), the file system's
            // flush follows after all.
            (Some(fs), Some(o)) => {
                file_sync()?;
                if sys::written_layout(&fd, o.offset, o.len).as_ref() == Some(&o.layout) {
                    Ok(())
                } else {
                    fs.flush(since.fs, &self.root_fd, || self.renew_write_verifier())
                }
            }
            // `syncfs` writes the file's data and everything else first; the file's own
            // `fsync` then flushes the disk's cache after `syncfs`'s last writes (one
            // flush fewer than `fsync`, `syncfs`, `fsync` of the root) and reports the
            // file's own writeback errors.
            (Some(fs), None) if fs.device.is_none() => {
                fs.flush_kind(SyncKind::Data, since.fs, &self.root_fd, || self.renew_write_verifier())?;
                file_sync()
            }
            (Some(fs), None) => {
                file_sync()?;
                fs.flush(since.fs, &self.root_fd, || self.renew_write_verifier())
            }
        }
    }

    /// A change made: in a `sync` export, with `make_durable` still to run.
    fn made<'a, T>(&self, result: T, make_durable: impl FnOnce() -> VfsResult<()> + 'a) -> Made<'a, T> {
        if self.sync {
            Made::pending(result, make_durable)
        } else {
            Made::durable_already(result)
        }
    }

    /// After a failed sync nasd can no longer vouch for UNSTABLE writes to any file: the
    /// kernel may have dropped their data, and it reports that once, to one caller (the
    /// sync group passes it on only to the callers of that sync and the next). A new write verifier
    /// makes every client resend what it has not yet seen committed, as knfsd does.
    fn renew_write_verifier(&self) {
        let old = self.verifier.load(Ordering::Relaxed);
        let mut new = rand::random();
        while new == old {
            new = rand::random();
        }
        self.verifier.store(new, Ordering::Relaxed);
        tracing::warn!(export_id = self.fsid, "a sync failed: new write verifier, so clients resend their uncommitted writes");
    }

    /// An UNSTABLE write on a thread that must not wait for the disk. Whole or not at all:
    /// a short count would make the Linux client send the rest again as FILE_SYNC, so a
    /// write the kernel cut short is done again, whole, by a thread that may wait.
    fn write_nowait(&self, fd: &OwnedFd, data: &[u8], offset: u64, size: u64) -> VfsResult<usize> {
        if !self.no_nowait_writes.load(Ordering::Relaxed) {
            match sys::pwrite_nowait(fd, data, offset)? {
                Some(n) if n == data.len() => return Ok(n),
                Some(_) => return Err(VfsError::WouldBlock),
                None => self.no_nowait_writes.store(true, Ordering::Relaxed),
            }
        }
        // Without RWF_NOWAIT (ext4): a buffered write of whole pages, or past the end of the
        // file, needs no read from disk, unlike a partial page. It can still be held up
        // when the kernel throttles writers of dirty pages; the dispatcher then sends the
        // next WRITEs to threads that may wait, until the kernel has caught up
        // (`rpc::held_up`).
        const PAGE: u64 = 4096;
        let whole_pages = offset.is_multiple_of(PAGE) && (data.len() as u64).is_multiple_of(PAGE);
        if !(whole_pages || offset >= size) {
            return Err(VfsError::WouldBlock);
        }
        sys::pwrite(fd, data, offset, 0)
    }

    /// Runs `change` of the entries of `dirs` (one directory, or a rename's two; each
    /// with its inode number) with their attributes taken just before and just after it,
    /// under nasd's lock of each directory: no other call's change to them falls between
    /// a reply's pre-op and post-op attributes, which a client whose cache matches the
    /// pre-op ones takes as showing its own change alone (knfsd holds the directories'
    /// inode locks the same way). Making the change durable comes after, unlocked, so
    /// concurrent changes still share their syncs. Programs on the server are not held
    /// off.
    fn change_entries<const N: usize, T>(
        &self,
        dirs: [(&CachedObject, u64); N],
        change: impl FnOnce() -> VfsResult<T>,
    ) -> VfsResult<(T, [Wcc; N])> {
        // In lock order, each lock once (a rename within one directory names it twice).
        let mut slots: [usize; N] = std::array::from_fn(|i| entry_lock_slot(dirs[i].1));
        slots.sort_unstable();
        let mut locked: [Option<parking_lot::MutexGuard<'_, ()>>; N] = std::array::from_fn(|_| None);
        for (n, &slot) in slots.iter().enumerate() {
            if n == 0 || slots[n - 1] != slot {
                locked[n] = Some(self.changes.0.entry_locks[slot].lock());
            }
        }
        let before: [Option<PreOpAttr>; N] = std::array::from_fn(|i| self.stat(dirs[i].0).ok().map(|a| PreOpAttr::from(&a)));
        let done = change()?;
        for &(_, fileid) in &dirs {
            self.changes.count_entry_change(fileid);
        }
        let wcc = std::array::from_fn(|i| Wcc { before: before[i], after: self.stat(dirs[i].0).ok() });
        drop(locked);
        Ok((done, wcc))
    }

    /// The wcc data of a directory a call looked at but did not change, taken as
    /// [`Self::change_entries`] takes it.
    fn unchanged_dir_wcc(&self, dir: &CachedObject, fileid: u64) -> VfsResult<Wcc> {
        let ((), [wcc]) = self.change_entries([(dir, fileid)], || Ok(()))?;
        Ok(wcc)
    }

    /// Applies ownership, mode and times (not size) under the caller's identity.
    fn apply_attrs(&self, fd: &OwnedFd, kind: FileKind, attrs: &SetAttrs) -> VfsResult<()> {
        let raw = fd.as_raw_fd();
        let chown = attrs.uid.is_some() || attrs.gid.is_some();
        if chown {
            sys::chown_fd(raw, attrs.uid, attrs.gid)?;
        }
        if let Some(mode) = attrs.mode {
            if kind != FileKind::Symlink {
                sys::chmod_fd(raw, mode_after_chown(mode & 0o7777, kind, chown))?;
            }
        }
        if attrs.atime != SetTime::Unchanged || attrs.mtime != SetTime::Unchanged {
            sys::utimens_fd(raw, &[timespec(attrs.atime), timespec(attrs.mtime)])?;
        }
        Ok(())
    }

    /// Finishes a create-like operation: caches the new object and applies attributes;
    /// making the directory durable is what remains. `created`: the descriptor that made
    /// the object, where there is one; otherwise the object is found by name again, and a
    /// rename over that name in between would hand back another object.
    fn finish_create<'a>(
        &'a self,
        cred: &'a Cred,
        (dir, dir_before, dir_wcc): (Arc<CachedObject>, Attr, Wcc),
        since: Since,
        name: &CString,
        created: Option<OwnedFd>,
        attrs: Option<&SetAttrs>,
    ) -> VfsResult<Made<'a, Created>> {
        // A new file is empty: a size other than 0 extends it, as knfsd's create does.
        let grow = attrs.and_then(|a| a.size).filter(|&size| size > 0);
        if let (Some(size), Some(created)) = (grow, &created) {
            sys::ftruncate(created, size)?;
        }
        let (id, mut attr, fd) = match created {
            Some(created) => self.open_created(&created)?,
            None => self.open_entry(&dir, name)?,
        };
        let mut inode_changed = grow.is_some() && attr.kind == FileKind::Regular;
        if let Some(attrs) = attrs {
            // Mode was given at creation; ownership and times may still need setting.
            // Ownership asked for by anyone but root is ignored, as knfsd does: the
            // object is already made, and a chown the kernel refuses would fail a
            // create that happened.
            let owner = |id: Option<u32>, now: u32| id.filter(|&i| i != now && cred.uid == 0);
            let rest =
                SetAttrs { mode: None, size: None, uid: owner(attrs.uid, attr.uid), gid: owner(attrs.gid, attr.gid), ..attrs.clone() };
            if rest != SetAttrs::default() {
                self.apply_attrs(&fd, attr.kind, &rest)?;
                inode_changed = true;
            }
        }
        if inode_changed {
            attr = sys::attr_from_stat(&sys::fstat(fd.as_raw_fd())?, self.fsid);
        }
        let obj = self.cache.insert(id, CachedObject::new(fd));
        let durable_attr = attr.clone();
        Ok(self.made(Created { obj: id, attr, dir_wcc }, move || {
            self.commit_created(cred, (&dir, &dir_before, since), (&obj, &durable_attr), inode_changed)
        }))
    }

    /// In `sync` mode, makes a new entry durable, and the new object's inode where it
    /// was changed after it was made. The directory's sync covers the entry and the
    /// inode as it was made; a later change to the inode may sit in a later journal
    /// transaction than the directory's last one, which is all a directory `fsync` waits
    /// for, so the inode is synced too, and where its sync carries the entry, it alone.
    /// Without a journal the directory's flush comes after every change and covers it.
    fn commit_created(
        &self,
        cred: &Cred,
        (dir, dir_before, since): (&CachedObject, &Attr, Since),
        (obj, attr): (&CachedObject, &Attr),
        inode_changed: bool,
    ) -> VfsResult<()> {
        let inode_only = inode_changed && self.inode_sync_covers_entry && matches!(attr.kind, FileKind::Regular | FileKind::Directory);
        if !inode_only {
            self.commit_dir(cred, dir, dir_before, since)?;
        }
        if inode_changed && self.fs_sync.is_none() {
            self.commit_inode(cred, obj, attr, self.since(obj))?;
        }
        Ok(())
    }

    /// The directory and the validated name a create-like operation makes an entry with.
    fn new_entry(&self, cred: &Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<(Arc<CachedObject>, Attr, CString)> {
        let (dobj, dattr) = self.resolve_dir(cred, dir)?;
        if is_dot_or_dotdot(name) {
            return Err(VfsError::Exist);
        }
        Ok((dobj, dattr, sys::component(name)?))
    }

    /// What `name` in `dir` is now, if anything, taken out of the object cache and held
    /// by a call that removes or replaces it until the directory's entry lock is
    /// released: dropping the last reference to a file frees its blocks (seconds for a
    /// large file), which then happens outside the lock, as the kernel's own unlink drops
    /// its last reference after unlocking the directory. The cached object is held too:
    /// dropped before the unlink, its written descriptor would go to the close checker
    /// (the file still had a link), and the space stay taken until that thread got to it.
    fn take_name(&self, dir: &CachedObject, name: &CString) -> Doomed {
        // One lookup of the name: the cached object taken is the inode held.
        let path_fd = sys::openat(dir.path_fd.as_raw_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok();
        let cached = path_fd.as_ref().and_then(|fd| {
            let (id, _) = sys::name_to_handle(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH).ok()?;
            self.cache.remove(&id)
        });
        Doomed { _cached: cached, _path_fd: path_fd }
    }
}

/// What a REMOVE, RMDIR or RENAME takes the place of, held until its entry lock is
/// released ([`LocalFs::take_name`]).
struct Doomed {
    _cached: Option<Arc<CachedObject>>,
    _path_fd: Option<OwnedFd>,
}

impl Vfs for LocalFs {
    fn root(&self) -> ObjectId {
        self.root_id
    }

    fn getattr(&self, cred: &Cred, obj: &ObjectId) -> VfsResult<Attr> {
        self.resolve(cred, obj).map(|(_, a)| a)
    }

    fn setattr<'a>(&'a self, cred: &'a Cred, id: &ObjectId, attrs: &SetAttrs, guard_ctime: Option<Timespec>) -> VfsResult<Made<'a, Wcc>> {
        let _modifying = self.modifying();
        let (obj, resolved) = self.resolve(cred, id)?;
        let since = self.since(&obj);
        // Under nasd's lock of the object: the guard is checked against, and the pre-op
        // attributes are, the state the change applies to, and no other SETATTR (nor,
        // for a directory, entry change) falls between them and the post-op ones. WRITE
        // does not take it: knfsd's inode lock covers writes too, but holding one per
        // object for every WRITE would serialise a file's concurrent writes.
        let lock = if resolved.kind == FileKind::Directory {
            self.changes.entry_lock(resolved.fileid)
        } else {
            self.changes.attr_lock(resolved.fileid)
        };
        let locked = lock.lock();
        let before = self.stat(&obj)?;
        if let Some(ct) = guard_ctime {
            if ct != before.ctime {
                return Err(VfsError::NotSync);
            }
        }
        // The kernel lets only the owner set times unless both become "now"; knfsd lets
        // anyone who may write set either one to the server's time (`open(O_TRUNC)` by a
        // group member sends size 0 with mtime = server time, atime unchanged). nasd checks
        // that permission itself and then sets the times as root. Every check comes before
        // the first change, so a refused SETATTR changes nothing.
        let times = attrs.atime != SetTime::Unchanged || attrs.mtime != SetTime::Unchanged;
        let explicit_times = matches!(attrs.atime, SetTime::Client(_)) || matches!(attrs.mtime, SetTime::Client(_));
        let owner = cred.uid == 0 || cred.uid == before.uid || !creds::enabled();
        let touch_as_root = times && !explicit_times && !owner;
        if touch_as_root && !may_access(cred, &obj, &before, W)? {
            return Err(VfsError::Access);
        }
        if !owner && (explicit_times || attrs.mode.is_some()) || !may_chown(cred, &before, attrs) {
            return Err(VfsError::Perm);
        }
        if let Some(size) = attrs.size {
            // Beyond FSINFO's maxfilesize: FBIG, as knfsd answers, also where the file
            // system itself would take it (tmpfs, XFS and btrfs go up to 2^63 - 1).
            if size > self.limits.max_file_size {
                return Err(VfsError::FBig);
            }
            let fd = self.file_fd_for(cred, &obj, &before, W)?;
            sys::ftruncate(&fd, size)?;
        }
        let rest = SetAttrs { size: None, ..attrs.clone() };
        if touch_as_root {
            self.apply_attrs(&obj.path_fd, before.kind, &SetAttrs { atime: SetTime::Unchanged, mtime: SetTime::Unchanged, ..rest })?;
            let raw = obj.path_fd.as_raw_fd();
            self.as_root(cred, || sys::utimens_fd(raw, &[timespec(attrs.atime), timespec(attrs.mtime)]))?;
        } else {
            self.apply_attrs(&obj.path_fd, before.kind, &rest)?;
        }
        let after = self.stat(&obj).ok();
        drop(locked);
        let wcc = Wcc { before: Some(PreOpAttr::from(&before)), after };
        Ok(self.made(wcc, move || self.commit_inode(cred, &obj, &before, since)))
    }

    fn lookup_in(&self, cred: &Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Lookup> {
        let (dobj, dir_attr) = self.resolve_dir(cred, dir)?;
        let found = self.lookup_entry(cred, &dobj, &dir_attr, name);
        Ok(Lookup { dir_attr, found })
    }

    fn access(&self, cred: &Cred, id: &ObjectId, mask: u32) -> VfsResult<(u32, Attr)> {
        let (obj, attr) = self.resolve(cred, id)?;
        let dir = attr.kind == FileKind::Directory;
        // Changing a directory's entries needs search permission as well as write.
        let change = if dir { W | X } else { W };
        let checks = [
            (access::READ, R),
            (access::MODIFY | access::EXTEND | if dir { access::DELETE } else { 0 }, change),
            (if dir { access::LOOKUP } else { access::EXECUTE }, X),
        ];
        let mut granted = 0;
        // Only what the client asked about: each check may cost a syscall.
        for (bits, want) in checks {
            if bits & mask != 0 && may_access_reported(cred, &obj, &attr, want)? {
                granted |= bits;
            }
        }
        Ok((granted & mask, attr))
    }

    fn readlink(&self, cred: &Cred, id: &ObjectId) -> VfsResult<(Vec<u8>, Attr)> {
        let (obj, attr) = self.resolve(cred, id)?;
        if attr.kind != FileKind::Symlink {
            return Err(VfsError::Inval);
        }
        Ok((sys::readlinkat(obj.path_fd.as_raw_fd())?, attr))
    }

    fn read(&self, cred: &Cred, id: &ObjectId, offset: u64, count: usize, out: &mut Vec<u8>, blocking: Blocking) -> VfsResult<ReadResult> {
        let (_, attr, fd) = self.data_io(cred, id, R)?;
        let nowait = blocking == Blocking::Forbidden;
        if nowait && self.no_nowait_reads.load(Ordering::Relaxed) {
            return Err(VfsError::WouldBlock);
        }
        let wanted = count;
        let count = if offset >= attr.size {
            0
        } else {
            // Clients ask for their whole rsize (1 MiB) whatever the file's size: the
            // buffer is sized by what the file holds. Bytes appended since the size was
            // taken are left for the next READ, as if it had come a moment earlier.
            let holds = usize::try_from(attr.size - offset).unwrap_or(usize::MAX);
            match sys::pread_append(&fd, out, wanted.min(holds), offset, nowait) {
                Err(VfsError::NotSupp) if nowait => {
                    tracing::info!(
                        export_id = self.fsid,
                        "the file system cannot read without waiting (no RWF_NOWAIT): reads go to the blocking pool"
                    );
                    self.no_nowait_reads.store(true, Ordering::Relaxed);
                    return Err(VfsError::WouldBlock);
                }
                read => read?,
            }
        };
        // Nothing read where something was asked for is the end of the file, even if the
        // size taken before the read said otherwise (the file shrank meanwhile): a reply of
        // no data and no eof makes the Linux client fail the read with EIO.
        let eof = (count == 0 && wanted > 0) || offset.saturating_add(count as u64) >= attr.size;
        Ok(ReadResult { count, eof, attr })
    }

    fn read_in_place(&self, cred: &Cred, id: &ObjectId, offset: u64, count: usize) -> VfsResult<Option<(ReadResult, FileRange)>> {
        let (obj, attr, fd) = self.data_io(cred, id, R)?;
        // For a while after a failed send, READs of the file are copied: the client's
        // retransmissions, which may come after other READs of the file, are answered
        // (with a short read, or an error).
        if obj.in_place_send_failed.load(Ordering::Relaxed) && obj.in_place_send_failed.swap(false, Ordering::Relaxed) {
            obj.copy_reads_until_ms.store(cache::clock_ms() + COPY_READS_AFTER_FAILED_SEND.as_millis() as u64, Ordering::Relaxed);
        }
        let copy_until = obj.copy_reads_until_ms.load(Ordering::Relaxed);
        if copy_until != 0 && cache::clock_ms() < copy_until {
            return Ok(None);
        }
        let len = attr.size.saturating_sub(offset).min(count as u64) as usize;
        match sys::ready_in_page_cache(&fd, offset, len) {
            None => return Ok(None),
            Some(false) => return Err(VfsError::WouldBlock),
            Some(true) => {}
        }
        let eof = offset.saturating_add(len as u64) >= attr.size;
        let send_failed = obj.in_place_send_failed.clone();
        Ok(Some((ReadResult { count: len, eof, attr }, FileRange { fd, offset, len, send_failed })))
    }

    fn write(&self, cred: &Cred, id: &ObjectId, offset: u64, data: &[u8], stable: Stability, blocking: Blocking) -> VfsResult<WriteResult> {
        let _modifying = self.modifying();
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
            return Err(VfsError::FBig);
        }
        // In an `async` export every write is reported stable without waiting for the disk.
        let committed = if self.sync { stable } else { Stability::FileSync };
        let needs_sync = self.sync && stable != Stability::Unstable;
        if needs_sync && blocking == Blocking::Forbidden {
            return Err(VfsError::WouldBlock);
        }
        let (obj, before, fd) = self.data_io(cred, id, W)?;
        let since = self.since(&obj);
        let count = match blocking {
            Blocking::Forbidden => self.write_nowait(&fd, data, offset, before.size)?,
            Blocking::Allowed => sys::pwrite(&fd, data, offset, 0)?,
        };
        if needs_sync {
            // Start a large write's writeback now: while the caller waits for its turn at
            // the group fsync the data is already on its way, and that fsync has less to do
            // (1 MiB FILE_SYNC writes at iodepth 16: +18 %, docs/performance.md).
            if count >= EARLY_WRITEBACK_MIN {
                sys::start_writeback(&fd, offset, count as u64);
            }
            let kind = if stable == Stability::FileSync { SyncKind::Full } else { SyncKind::Data };
            // Where the file's sync alone would not do for every write (no journal), one
            // that allocates nothing needs no more ([`Self::make_durable`]).
            let within = offset.checked_add(count as u64).is_some_and(|end| end <= before.size);
            let overwrite = (self.fs_sync.is_some() && within)
                .then(|| sys::written_layout(&fd, offset, count as u64))
                .flatten()
                .map(|layout| Overwrite { offset, len: count as u64, layout });
            self.make_durable(cred, &obj, &before, kind, since, overwrite.as_ref())?;
        }
        Ok(WriteResult { count, committed, wcc: Wcc { before: Some(PreOpAttr::from(&before)), after: self.stat(&obj).ok() } })
    }

    fn commit(&self, cred: &Cred, id: &ObjectId, _offset: u64, _count: u64) -> VfsResult<Wcc> {
        let (obj, before) = self.resolve(cred, id)?;
        // Only files hold data to commit; knfsd answers ISDIR and INVAL for the rest.
        match before.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(VfsError::IsDir),
            _ => return Err(VfsError::Inval),
        }
        // As knfsd: only a caller who may write the file (or owns it) may have it synced,
        // which costs the disk a flush.
        if !may_io(cred, &obj, &before, W)? {
            return Err(VfsError::Access);
        }
        if self.sync {
            // Writes acknowledged before a failed sync are the verifier's to disown.
            self.make_durable(cred, &obj, &before, SyncKind::Full, self.since(&obj), None)?;
            // A check of a descriptor leaving the cache may have taken an error this sync
            // would have reported; the verifier the reply carries must show it.
            self.close_checks.wait_for_begun();
        }
        Ok(Wcc { before: Some(PreOpAttr::from(&before)), after: self.stat(&obj).ok() })
    }

    fn create<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], how: &CreateHow) -> VfsResult<Made<'a, Created>> {
        let _modifying = self.modifying();
        let (dobj, dattr, c) = self.new_entry(cred, dir, name)?;
        let since = self.since(&dobj);
        let dfd = dobj.path_fd.as_raw_fd();
        let excl = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        match how {
            CreateHow::Unchecked(attrs) | CreateHow::Guarded(attrs) => {
                // Refused before anything is made: a file created and then refused would
                // turn the client's retry of a GUARDED create into EXIST.
                if attrs.size.is_some_and(|size| size > self.limits.max_file_size) {
                    return Err(VfsError::FBig);
                }
                let mode = attrs.mode.unwrap_or(0o644) & 0o7777;
                match self.change_entries([(&*dobj, dattr.fileid)], || sys::openat(dfd, &c, excl, mode)) {
                    Ok((fd, [wcc])) => self.finish_create(cred, (dobj, dattr, wcc), since, &c, Some(fd), Some(attrs)),
                    Err(VfsError::Exist) if matches!(how, CreateHow::Unchecked(_)) => {
                        // UNCHECKED on an existing file opens it, applying only the size.
                        let (id, attr, fd) = self.open_entry(&dobj, &c)?;
                        if attr.kind != FileKind::Regular {
                            return Err(VfsError::Exist);
                        }
                        self.cache.insert(id, CachedObject::new(fd));
                        // The truncation is made now and made durable with the rest, so
                        // that the reply is put aside before any sync, as for any change.
                        let (attr, truncation) = match attrs.size {
                            Some(size) => {
                                let sa = SetAttrs { size: Some(size), ..Default::default() };
                                let (wcc, truncation) = self.setattr(cred, &id, &sa, None)?.split();
                                (wcc.after.unwrap_or(attr), truncation)
                            }
                            None => (attr, Made::durable_already(())),
                        };
                        // Another client's create of this name may still be syncing: the
                        // file this reply speaks of must be durable too.
                        let created = Created { obj: id, attr, dir_wcc: self.unchanged_dir_wcc(&dobj, dattr.fileid)? };
                        Ok(self.made(created, move || {
                            truncation.durable()?;
                            self.commit_dir(cred, &dobj, &dattr, since)
                        }))
                    }
                    Err(e) => Err(e),
                }
            }
            CreateHow::Exclusive(verf) => {
                // Without the high bits, as knfsd does: file systems with 32-bit times
                // (XFS without bigtime) would not keep them, and the check below would
                // then fail a retransmitted create of the client's own file.
                let a = (u32::from_be_bytes(verf[..4].try_into().expect("4")) & 0x7fff_ffff) as i64;
                let m = (u32::from_be_bytes(verf[4..].try_into().expect("4")) & 0x7fff_ffff) as i64;
                match self.change_entries([(&*dobj, dattr.fileid)], || sys::openat(dfd, &c, excl, 0)) {
                    Ok((fd, [wcc])) => {
                        // The verifier lives in atime/mtime until the client's SETATTR.
                        let time = |sec| SetTime::Client(Timespec { sec, nsec: 0 });
                        let verifier = SetAttrs { atime: time(a), mtime: time(m), ..Default::default() };
                        self.finish_create(cred, (dobj, dattr, wcc), since, &c, Some(fd), Some(&verifier))
                    }
                    Err(VfsError::Exist) => {
                        let (id, attr, fd) = self.open_entry(&dobj, &c)?;
                        // Empty as well, as knfsd checks: no data can follow a create
                        // before its reply reached the client.
                        let same = attr.kind == FileKind::Regular && attr.size == 0 && attr.atime.sec == a && attr.mtime.sec == m;
                        if !same {
                            return Err(VfsError::Exist);
                        }
                        // A resend after a restart may find a create whose sync never ended.
                        let obj = self.cache.insert(id, CachedObject::new(fd));
                        let created = Created { obj: id, attr: attr.clone(), dir_wcc: self.unchanged_dir_wcc(&dobj, dattr.fileid)? };
                        Ok(self.made(created, move || self.commit_created(cred, (&dobj, &dattr, since), (&obj, &attr), true)))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn mkdir<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], attrs: &SetAttrs) -> VfsResult<Made<'a, Created>> {
        let _modifying = self.modifying();
        let (dobj, dattr, c) = self.new_entry(cred, dir, name)?;
        let since = self.since(&dobj);
        let mode = attrs.mode.unwrap_or(0o755) & 0o7777;
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || {
            // SAFETY: valid C string and fd.
            sys::check(unsafe { libc::mkdirat(dobj.path_fd.as_raw_fd(), c.as_ptr(), mode) }).map(drop)
        })?;
        self.finish_create(cred, (dobj, dattr, wcc), since, &c, None, Some(attrs))
    }

    fn symlink<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], target: &[u8], attrs: &SetAttrs) -> VfsResult<Made<'a, Created>> {
        let _modifying = self.modifying();
        let (dobj, dattr, c) = self.new_entry(cred, dir, name)?;
        let since = self.since(&dobj);
        if target.is_empty() || target.len() >= libc::PATH_MAX as usize {
            return Err(if target.is_empty() { VfsError::Inval } else { VfsError::NameTooLong });
        }
        let t = CString::new(target).map_err(|_| VfsError::Inval)?;
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || {
            // SAFETY: valid C strings and fd.
            sys::check(unsafe { libc::symlinkat(t.as_ptr(), dobj.path_fd.as_raw_fd(), c.as_ptr()) }).map(drop)
        })?;
        let attrs = SetAttrs { mode: None, ..attrs.clone() };
        self.finish_create(cred, (dobj, dattr, wcc), since, &c, None, Some(&attrs))
    }

    fn mknod<'a>(
        &'a self,
        cred: &'a Cred,
        dir: &ObjectId,
        name: &[u8],
        node: SpecialNode,
        attrs: &SetAttrs,
    ) -> VfsResult<Made<'a, Created>> {
        let _modifying = self.modifying();
        let (dobj, dattr, c) = self.new_entry(cred, dir, name)?;
        let since = self.since(&dobj);
        let perm = attrs.mode.unwrap_or(0o644) & 0o7777;
        let (kind, dev) = match node {
            SpecialNode::Fifo => (libc::S_IFIFO, 0),
            SpecialNode::Socket => (libc::S_IFSOCK, 0),
            SpecialNode::CharDevice(ma, mi) => (libc::S_IFCHR, libc::makedev(ma, mi)),
            SpecialNode::BlockDevice(ma, mi) => (libc::S_IFBLK, libc::makedev(ma, mi)),
        };
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || {
            // SAFETY: valid C string and fd; the kernel enforces CAP_MKNOD for devices.
            sys::check(unsafe { libc::mknodat(dobj.path_fd.as_raw_fd(), c.as_ptr(), kind | perm, dev) }).map(drop)
        })?;
        self.finish_create(cred, (dobj, dattr, wcc), since, &c, None, Some(attrs))
    }

    fn remove<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, Wcc>> {
        let _modifying = self.modifying();
        let (dobj, dattr) = self.resolve_dir(cred, dir)?;
        let since = self.since(&dobj);
        // ACCES for "." and "..", REMOVE or RMDIR alike, as knfsd's `nfsd_unlink` answers.
        if is_dot_or_dotdot(name) {
            return Err(VfsError::Access);
        }
        let c = sys::component(name)?;
        let doomed = self.take_name(&dobj, &c);
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || sys::unlink(&dobj.path_fd, &c, 0))?;
        drop(doomed);
        Ok(self.made(wcc, move || self.commit_dir(cred, &dobj, &dattr, since)))
    }

    fn rmdir<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, Wcc>> {
        let _modifying = self.modifying();
        let (dobj, dattr) = self.resolve_dir(cred, dir)?;
        let since = self.since(&dobj);
        if is_dot_or_dotdot(name) {
            return Err(VfsError::Access);
        }
        let c = sys::component(name)?;
        let doomed = self.take_name(&dobj, &c);
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || sys::unlink(&dobj.path_fd, &c, libc::AT_REMOVEDIR))?;
        drop(doomed);
        Ok(self.made(wcc, move || self.commit_dir(cred, &dobj, &dattr, since)))
    }

    fn rename<'a>(
        &'a self,
        cred: &'a Cred,
        from_dir: &ObjectId,
        from: &[u8],
        to_dir: &ObjectId,
        to: &[u8],
    ) -> VfsResult<Made<'a, (Wcc, Wcc)>> {
        let _modifying = self.modifying();
        let (fobj, fattr) = self.resolve_dir(cred, from_dir)?;
        let (tobj, tattr) = self.resolve_dir(cred, to_dir)?;
        let (fsince, tsince) = (self.since(&fobj), self.since(&tobj));
        // PERM, as knfsd's `nfsd_rename` answers.
        if is_dot_or_dotdot(from) || is_dot_or_dotdot(to) {
            return Err(VfsError::Perm);
        }
        let fc = sys::component(from)?;
        let tc = sys::component(to)?;
        let replaced = self.take_name(&tobj, &tc);
        let ((), [from_wcc, to_wcc]) =
            self.change_entries([(&*fobj, fattr.fileid), (&*tobj, tattr.fileid)], || sys::rename(&fobj.path_fd, &fc, &tobj.path_fd, &tc))?;
        drop(replaced);
        Ok(self.made((from_wcc, to_wcc), move || {
            if fattr.fileid == tattr.fileid {
                self.commit_dir(cred, &tobj, &tattr, tsince)
            } else {
                self.commit_dirs(cred, &[(&tobj, &tattr, tsince), (&fobj, &fattr, fsince)])
            }
        }))
    }

    fn link<'a>(&'a self, cred: &'a Cred, id: &ObjectId, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, (Attr, Wcc)>> {
        let _modifying = self.modifying();
        let (obj, attr) = self.resolve(cred, id)?;
        let (dobj, dattr) = self.resolve_dir(cred, dir)?;
        let since = self.since(&dobj);
        // ISDIR, as knfsd answers (link(2) would say EPERM; the Linux client refuses
        // before asking).
        if attr.kind == FileKind::Directory {
            return Err(VfsError::IsDir);
        }
        if is_dot_or_dotdot(name) {
            return Err(VfsError::Exist);
        }
        let c = sys::component(name)?;
        let src = sys::proc_fd_path(obj.path_fd.as_raw_fd());
        // The caller needs write and search permission on the directory, nothing on the
        // file: knfsd calls `vfs_link`, which leaves out `fs.protected_hardlinks` (a local
        // process may link only files it owns or may read and write). Acting as the file's
        // owner lifts that check alone; the directory's permissions, quotas and reserved
        // blocks, immutable files and read-only mounts are the caller's as before.
        let ((), [wcc]) = self.change_entries([(&*dobj, dattr.fileid)], || {
            creds::with_owner_override(|| {
                // SAFETY: valid C strings and fds; following the /proc link names the object itself.
                sys::check(unsafe {
                    libc::linkat(libc::AT_FDCWD, src.as_ptr(), dobj.path_fd.as_raw_fd(), c.as_ptr(), libc::AT_SYMLINK_FOLLOW)
                })
                .map(drop)
            })
        })?;
        let attr = self.stat(&obj)?;
        Ok(self.made((attr, wcc), move || self.commit_dir(cred, &dobj, &dattr, since)))
    }

    fn readdir(
        &self,
        cred: &Cred,
        dir: &ObjectId,
        cookie: u64,
        plus: bool,
        max_entries: usize,
        accept: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> VfsResult<ReadDirEnd> {
        let (dobj, dattr) = self.resolve_dir(cred, dir)?;
        let dir_times = (dattr.ctime, dattr.mtime);
        let mut stream = match self.dir_streams.take(dir, cookie, cred, dir_times, self.entry_changes(dattr.fileid)) {
            Some(s) => s,
            None => {
                // Opened as the caller so the kernel checks read permission on the directory
                // (and through /proc, so listing does not also need search permission, as
                // with ".").
                let fd = sys::openat(libc::AT_FDCWD, &sys::proc_fd_path(dobj.path_fd.as_raw_fd()), libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                if cookie != 0 {
                    sys::lseek_set(&fd, cookie).map_err(|_| VfsError::BadCookie)?;
                }
                // Start small and grow: the kernel fills the whole buffer, and a reply often
                // takes far fewer entries than 32 KiB of dirents (libnfs asks for 8 KiB
                // replies).
                DirStream { fd: Arc::new(fd), buf: vec![0u8; 4 * 1024], pos: 0, len: 0, entry_changes: 0, ahead: None, window: 0 }
            }
        };
        let at_root = self.is_root(&dattr);
        // Entries looked at ahead are used only if nothing can have changed them since:
        // no modifying call finished here, the directory's times are the same (programs
        // other than this server changing its entries), and they are recent. A READDIR
        // continuing a READDIRPLUS listing has no use for them: the helper may stop.
        let mut ahead = stream.ahead.take().and_then(|a| {
            let fresh = plus
                && self.changes.quiet_mark() == Some(a.modifications)
                && a.dir_times == dir_times
                && a.begun.elapsed() <= LOOK_AHEAD_MAX_AGE;
            if !fresh {
                a.batch.abandon();
                stream.window = 0;
            }
            fresh.then_some(a)
        });
        let mut last_cookie = None;
        // Entries are taken in batches of what the reply can hold, so that few are looked
        // at for entries the reply then has no room for.
        let mut want = max_entries.max(1);
        loop {
            if stream.pos == stream.len {
                // A look-ahead ends with the buffer it was taken from.
                if let Some(a) = ahead.take() {
                    a.batch.abandon();
                }
                // Counted before the entries are read: a change made while they are is noticed.
                stream.entry_changes = self.entry_changes(dattr.fileid);
                let n = sys::getdents(&stream.fd, &mut stream.buf)?;
                if n == 0 {
                    return Ok(ReadDirEnd { eof: true, dir_attr: dattr });
                }
                (stream.pos, stream.len) = (0, n);
                if stream.buf.len() < 64 * 1024 {
                    stream.buf.resize(stream.buf.len() * 2, 0);
                }
            }
            let batch: Vec<sys::RawDirent<'_>> = sys::parse_dirents(&stream.buf[stream.pos..stream.len]).take(want).collect();
            if plus && ahead.is_none() {
                // This call's entries and those after them, which a helper goes on with
                // while the reply is sent and the client reads it: the next calls then
                // find them looked at.
                ahead = self.look_ahead(cred, &stream, at_root, batch.len(), dir_times);
            }
            let stats = if plus { self.batch_stats(cred, &stream.fd, at_root, &batch, &mut ahead) } else { Vec::new() };
            let mut stats = stats.into_iter();
            let mut reply_full = false;
            for ent in &batch {
                let stat = stats.next().flatten();
                let (fileid, extra) = match ent.name {
                    b"." => (dattr.fileid, plus.then(|| (*dir, dattr.clone()))),
                    b".." if at_root => (dattr.fileid, plus.then(|| (self.root_id, dattr.clone()))),
                    _ => (stat.as_ref().map_or(ent.ino, |(_, a)| a.fileid), stat),
                };
                if !accept(DirEntry { name: ent.name, fileid, cookie: ent.off, plus: extra }) {
                    reply_full = true;
                    break;
                }
                last_cookie = Some(ent.off);
                stream.pos += ent.reclen;
                if let Some(a) = &mut ahead {
                    a.next += 1;
                }
            }
            if let Some(used) = ahead.take_if(|a| a.remaining() == 0) {
                // Used to its end: the next one may be longer.
                stream.window = (used.batch.len() * 2).min(MAX_LOOK_AHEAD);
            }
            if reply_full {
                let Some(c) = last_cookie else {
                    if let Some(a) = ahead {
                        a.batch.abandon();
                    }
                    return Ok(ReadDirEnd { eof: false, dir_attr: dattr });
                };
                stream.ahead = ahead;
                self.dir_streams.park(*dir, c, cred, dir_times, stream);
                return Ok(ReadDirEnd { eof: false, dir_attr: dattr });
            }
            if batch.len() < want {
                // Whole buffer consumed (the kernel returns whole records; a malformed tail
                // is skipped rather than looped on).
                stream.pos = stream.len;
            }
            // The caller's count is an estimate: if it takes more, go on in small batches.
            want = want.saturating_sub(batch.len()).max(MIN_PLUS_BATCH);
        }
    }

    fn fsstat(&self, cred: &Cred, id: &ObjectId) -> VfsResult<(FsStat, Attr)> {
        let (obj, attr) = self.resolve(cred, id)?;
        let s = sys::statvfs(obj.path_fd.as_raw_fd())?;
        let frsize = s.f_frsize;
        Ok((
            FsStat {
                total_bytes: s.f_blocks * frsize,
                free_bytes: s.f_bfree * frsize,
                avail_bytes: s.f_bavail * frsize,
                total_files: s.f_files,
                free_files: s.f_ffree,
                avail_files: s.f_favail,
            },
            attr,
        ))
    }

    fn pathconf(&self) -> PathConf {
        self.limits
    }

    fn write_verifier(&self) -> [u8; 8] {
        self.verifier.load(Ordering::Relaxed).to_be_bytes()
    }

    fn make_all_durable(&self) -> VfsResult<()> {
        // Also in an `async` export: the process that put a reply aside may have served
        // it with `sync`.
        let since = Since { fs: self.fs_group().ticket(), obj: SyncTicket::default() };
        self.flush_file_system(since)
    }
}

impl LocalFs {
    /// Handle and attributes of a directory entry for READDIRPLUS; `None` when the entry
    /// vanished or is a mount point (the client then looks it up).
    fn entry_plus(&self, dir_fd: &OwnedFd, name: &CStr) -> Option<(ObjectId, Attr)> {
        let st = self.stat_entry(dir_fd.as_raw_fd(), name, 0).ok()?;
        let id = self.handle_for(dir_fd.as_raw_fd(), name, 0, &st, false).ok()?;
        Some((id, sys::attr_from_statx(&st, self.fsid)))
    }

    /// The name of a listed entry to `statx`; `None` for `.` and for `..` of the export
    /// root, which the listing answers from the directory's own attributes.
    fn name_to_stat<'a>(ent: &sys::RawDirent<'a>, at_root: bool) -> Option<&'a CStr> {
        let from_dir = ent.name == b"." || (ent.name == b".." && at_root);
        ent.c_name.filter(|_| !from_dir)
    }

    /// Handles and attributes of a batch of listed entries (`None` where there are none to
    /// give), in order: from `ahead` where it covers the batch (its entries from its `next`
    /// on), the rest looked at now, shared with a helper thread when worth it. The client
    /// waits for the whole reply, so the `statx` calls are its latency, and while one
    /// client lists the other core is otherwise idle. A look-ahead that does not match the
    /// batch is given up (`ahead` becomes `None`).
    fn batch_stats(
        &self,
        cred: &Cred,
        fd: &Arc<OwnedFd>,
        at_root: bool,
        batch: &[sys::RawDirent<'_>],
        ahead: &mut Option<LookAhead>,
    ) -> Vec<EntryStat> {
        let stat = |c: &CStr| self.entry_plus(fd, c);
        let covered = match ahead {
            Some(a) => {
                let n = a.remaining().min(batch.len());
                // Names are unique in a directory: the same names in the same order are
                // the same entries.
                if (0..n).all(|i| a.batch.name(a.next + i) == Self::name_to_stat(&batch[i], at_root)) {
                    n
                } else {
                    a.batch.abandon();
                    *ahead = None;
                    0
                }
            }
            None => 0,
        };
        let mut stats = match ahead {
            Some(a) if covered > 0 => a.batch.results(a.next..a.next + covered, stat),
            _ => Vec::new(),
        };
        let rest = &batch[covered..];
        if !rest.is_empty() {
            let now = StatBatch::new(rest.iter().map(|e| Self::name_to_stat(e, at_root)));
            if rest.len() >= PARALLEL_PLUS_BATCH {
                self.share(cred, fd, &now);
            }
            stats.extend(now.join(stat));
        }
        stats
    }

    /// Starts looking at the entries from `stream`'s position on, on a helper thread as
    /// well as this one: at least `at_least` (this call's), at most the stream's window
    /// (a few replies' worth at first) and what its buffer holds. The helper goes on with
    /// those after this call's while its reply is made and the client reads it.
    fn look_ahead(
        &self,
        cred: &Cred,
        stream: &DirStream,
        at_root: bool,
        at_least: usize,
        dir_times: (Timespec, Timespec),
    ) -> Option<LookAhead> {
        listing_helpers()?;
        let window = if stream.window == 0 { at_least.saturating_mul(FIRST_LOOK_AHEAD_REPLIES) } else { stream.window };
        let entries: Vec<sys::RawDirent<'_>> =
            sys::parse_dirents(stream.buf.get(stream.pos..stream.len)?).take(window.max(at_least)).collect();
        if entries.len() < PARALLEL_PLUS_BATCH {
            return None;
        }
        // Marked before the first `statx`: a change that begins after it is noticed, and
        // while one is running (made, perhaps, but not yet durable) nothing is looked at.
        let (begun, modifications) = (std::time::Instant::now(), self.changes.quiet_mark()?);
        let batch = StatBatch::new(entries.iter().map(|e| Self::name_to_stat(e, at_root)));
        self.share(cred, &stream.fd, &batch);
        Some(LookAhead { batch, next: 0, begun, modifications, dir_times })
    }

    /// Has a helper thread work on `batch` too, as `cred`.
    fn share(&self, cred: &Cred, fd: &Arc<OwnedFd>, batch: &Arc<StatBatch>) {
        let (Some(helpers), Some(fs)) = (listing_helpers(), self.me.upgrade()) else { return };
        let (cred, fd, batch) = (cred.clone(), fd.clone(), batch.clone());
        // Refused when the queue is full: the serving thread then does the whole batch.
        // Off the client's CPU: the serving thread and the client take turns, and the
        // helper runs while both wait for each other.
        let counted = crate::vfs::helper_job();
        let _ = helpers.spawn_off(crate::vfs::caller_cpu(), move || {
            let _counted = counted;
            // The helper must see the directory as the caller would; if it cannot, the
            // serving thread does the whole batch.
            if creds::become_user(&cred) {
                batch.work(|c| fs.entry_plus(&fd, c));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn export() -> (tempfile::TempDir, Arc<LocalFs>) {
        export_syncing(false)
    }

    /// An export in a temporary directory; `sync`: as a `sync` export.
    fn export_syncing(sync: bool) -> (tempfile::TempDir, Arc<LocalFs>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = LocalFs::open(&LocalConfig {
            path: dir.path().to_path_buf(),
            fsid: 1,
            sync,
            cache_capacity: 64,
            cache_idle: None,
            changes: ChangeCount::default(),
        })
        .expect("open export");
        (dir, fs)
    }

    #[test]
    fn a_lookup_gives_the_directory_attributes_it_resolved_found_or_not() {
        let (dir, fs) = export();
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        std::fs::write(dir.path().join("d/f"), b"1").expect("write");
        let root = Cred::root();
        let (d, _) = fs.lookup(&root, &fs.root(), b"d").expect("lookup d");
        let d_attr = fs.getattr(&root, &d).expect("getattr d");
        let found = fs.lookup_in(&root, &d, b"f").expect("lookup_in f");
        let (f, f_attr) = found.found.expect("f is there");
        assert_eq!((found.dir_attr.fileid, found.dir_attr.kind), (d_attr.fileid, FileKind::Directory));
        assert_eq!(found.dir_attr.mtime, d_attr.mtime);
        assert_eq!(f_attr.fileid, fs.getattr(&root, &f).expect("getattr f").fileid);
        let missing = fs.lookup_in(&root, &d, b"missing").expect("the directory resolves");
        assert_eq!(missing.found.err(), Some(VfsError::NoEnt));
        assert_eq!(missing.dir_attr.fileid, d_attr.fileid);
        // `..` of a directory below the root: the root, with the directory's attributes.
        let up = fs.lookup_in(&root, &d, b"..").expect("lookup_in ..");
        assert_eq!(up.found.expect("..").0, fs.root());
        assert_eq!(up.dir_attr.fileid, d_attr.fileid);
        // A handle that is no directory fails as a whole.
        assert_eq!(fs.lookup_in(&root, &f, b"x").err(), Some(VfsError::NotDir));
    }

    #[test]
    fn a_read_of_a_small_file_takes_a_buffer_its_size_not_the_count_asked() {
        let (dir, fs) = export();
        std::fs::write(dir.path().join("small"), b"0123456789").expect("write");
        let (id, _) = fs.lookup(&Cred::root(), &fs.root(), b"small").expect("lookup");
        let mut out = Vec::new();
        let r = fs.read(&Cred::root(), &id, 4, 1 << 20, &mut out, Blocking::Allowed).expect("read");
        assert_eq!((out.as_slice(), r.count, r.eof), (&b"456789"[..], 6, true));
        assert!(out.capacity() < 4096, "1 MiB asked of a 10-byte file reserved {} bytes", out.capacity());
        let mut past_end = Vec::new();
        let r = fs.read(&Cred::root(), &id, 10, 1 << 20, &mut past_end, Blocking::Allowed).expect("read at the end");
        assert_eq!((r.count, r.eof, past_end.capacity()), (0, true, 0));
    }

    #[test]
    fn after_a_failed_send_from_the_page_cache_reads_of_the_file_are_copied_for_a_while() {
        let (dir, fs) = export();
        std::fs::write(dir.path().join("f"), vec![5u8; 128 * 1024]).expect("write");
        std::fs::write(dir.path().join("g"), vec![6u8; 128 * 1024]).expect("write");
        let (f, _) = fs.lookup(&Cred::root(), &fs.root(), b"f").expect("lookup");
        let (g, _) = fs.lookup(&Cred::root(), &fs.root(), b"g").expect("lookup");
        let warm = |id| {
            let mut out = Vec::new();
            fs.read(&Cred::root(), id, 0, 128 * 1024, &mut out, Blocking::Allowed).expect("read into the page cache");
        };
        warm(&f);
        warm(&g);
        // A host's idle-memory reclaim (DAMON `pageout`) can take the file's fresh pages by
        // its own timing; then the file is read in again, up to three times.
        let in_place = |id| {
            for _ in 0..3 {
                match fs.read_in_place(&Cred::root(), id, 0, 64 * 1024) {
                    Err(VfsError::WouldBlock) => warm(id),
                    r => return r.expect("read in place"),
                }
            }
            panic!("the file read in three times is still not in the page cache");
        };
        let Some((r, range)) = in_place(&f) else {
            eprintln!("skipped: this kernel cannot tell what is in the page cache (cachestat, Linux 6.5)");
            return;
        };
        assert_eq!((r.count, range.len), (64 * 1024, 64 * 1024));
        // The transport could not send it (the file was cut short meanwhile).
        range.send_failed.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            assert!(in_place(&f).is_none(), "READs of the file are copied, the retransmission among them");
        }
        assert!(in_place(&g).is_some(), "other files are not");
        let obj = fs.cache.get(&f).expect("cached");
        obj.copy_reads_until_ms.store(cache::clock_ms(), Ordering::Relaxed);
        assert!(in_place(&f).is_some(), "and only for a while");
    }

    #[test]
    fn no_other_change_falls_between_a_replys_pre_op_and_post_op_directory_attributes() {
        let (_dir, fs) = export();
        let root = Cred::root();
        let (d, _) = fs.mkdir(&root, &fs.root(), b"d", &SetAttrs::default()).durable().map(|c| (c.obj, c.attr)).expect("mkdir d");
        // Two clients changing one directory at once, every kind of entry change.
        let spans: Vec<(Timespec, Timespec)> = std::thread::scope(|s| {
            let workers: Vec<_> = [b'a', b'b']
                .into_iter()
                .map(|tag| {
                    let (fs, root) = (fs.clone(), root.clone());
                    s.spawn(move || {
                        let mut wccs = Vec::new();
                        for i in 0..200 {
                            let name = |suffix: &str| format!("{}{i}{suffix}", tag as char).into_bytes();
                            let made = fs.create(&root, &d, &name(""), &CreateHow::Guarded(SetAttrs::default())).durable().expect("create");
                            wccs.push(made.dir_wcc);
                            wccs.push(fs.link(&root, &made.obj, &d, &name(".link")).durable().expect("link").1);
                            let (from, to) = fs.rename(&root, &d, &name(".link"), &d, &name(".moved")).durable().expect("rename");
                            wccs.extend([from, to]);
                            wccs.push(fs.remove(&root, &d, &name(".moved")).durable().expect("remove"));
                            wccs.push(fs.mkdir(&root, &d, &name(".dir"), &SetAttrs::default()).durable().expect("mkdir").dir_wcc);
                            wccs.push(fs.rmdir(&root, &d, &name(".dir")).durable().expect("rmdir"));
                        }
                        wccs
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("worker"))
                .map(|w| (w.before.expect("pre-op").ctime, w.after.expect("post-op").ctime))
                .collect()
        });
        // In the order of the changes: by post-op ctime, then pre-op (a file system with
        // coarse timestamps gives several changes one ctime). A rename within one
        // directory reports it twice, the same.
        let spans: Vec<_> =
            spans.into_iter().map(|(before, after)| (after, before)).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let changes = spans.len();
        // Changes one at a time: each reply's pre-op ctime is the post-op ctime of the
        // change before it. Two changes between one reply's attributes show up as a
        // pre-op ctime older than the change before it.
        let interleaved = spans.windows(2).filter(|w| w[1].1 != w[0].0).count();
        assert_eq!(interleaved, 0, "{interleaved} of {changes} replies had another change between their pre-op and post-op attributes");
    }

    /// Descriptors this process holds of files under `dir` that have no name left.
    fn open_unlinked_under(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir("/proc/self/fd")
            .expect("list /proc/self/fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .filter(|target| target.starts_with(&*dir.to_string_lossy()) && target.ends_with(" (deleted)"))
            .collect()
    }

    #[test]
    fn a_stable_write_that_allocates_nothing_needs_no_flush_of_the_whole_file_system() {
        let (dir, fs) = export_syncing(true);
        let Some(fs_flushes) = fs.fs_sync.as_ref().map(|f| &f.group) else {
            eprintln!("skipped: this file system has a journal, so a file's sync never needs the whole file system's flush");
            return;
        };
        let root = Cred::root();
        let f = fs.create(&root, &fs.root(), b"f", &CreateHow::Guarded(SetAttrs::default())).durable().expect("create").obj;
        let block = vec![5u8; 64 * 1024];
        fs.write(&root, &f, 0, &block, Stability::Unstable, Blocking::Allowed).expect("write");
        fs.commit(&root, &f, 0, 0).expect("commit: the blocks are allocated and written");
        let (obj, _) = fs.resolve(&root, &f).expect("resolve");
        let fd = fs.io_fd(&root, &obj, &fs.getattr(&root, &f).expect("getattr"), R).expect("fd");
        if sys::written_layout(&fd, 0, block.len() as u64).is_none() {
            assert!(!sys::tests::maps_extents(&fd), "ext4 gave no layout for blocks allocated and written");
            eprintln!("skipped: this file system does not map a file's extents (FIEMAP)");
            return;
        }
        let stable = |offset: u64, data: &[u8]| {
            let before = fs_flushes.ticket();
            let w = fs.write(&root, &f, offset, data, Stability::FileSync, Blocking::Allowed).expect("stable write");
            assert_eq!((w.count, w.committed), (data.len(), Stability::FileSync));
            fs_flushes.ticket() > before
        };
        assert!(!stable(4096, &[6u8; 8192]), "an overwrite of written blocks flushed the whole file system");
        assert!(stable(block.len() as u64, &[7u8; 4096]), "a write past the end allocates: the file system's flush must follow");
        // A hole inside the file (made by extending its size) is allocated by the write.
        fs.setattr(&root, &f, &SetAttrs { size: Some(1 << 20), ..Default::default() }, None).durable().expect("grow");
        assert!(stable(512 * 1024, &[8u8; 4096]), "a write into a hole allocates: the file system's flush must follow");
        let back = std::fs::read(dir.path().join("f")).expect("read back");
        assert!(back[4096..12288].iter().all(|b| *b == 6) && back[..4096].iter().all(|b| *b == 5), "the overwrite's data");
        assert!(back[64 * 1024..68 * 1024].iter().all(|b| *b == 7) && back[512 * 1024] == 8, "the allocating writes' data");
    }

    #[test]
    fn a_removed_file_written_through_the_cache_is_closed_by_the_time_the_remove_returns() {
        let (dir, fs) = export();
        let root = Cred::root();
        for (name, replace) in [(&b"removed"[..], false), (&b"replaced"[..], true)] {
            let f = fs.create(&root, &fs.root(), name, &CreateHow::Guarded(SetAttrs::default())).durable().expect("create").obj;
            let w = fs.write(&root, &f, 0, &[7u8; 64 * 1024], Stability::Unstable, Blocking::Allowed).expect("write");
            assert_eq!(w.count, 64 * 1024);
            if replace {
                fs.create(&root, &fs.root(), b"other", &CreateHow::Guarded(SetAttrs::default())).durable().expect("create");
                fs.rename(&root, &fs.root(), b"other", &fs.root(), name).durable().expect("rename over it");
            } else {
                fs.remove(&root, &fs.root(), name).durable().expect("remove");
            }
            // Its blocks are free once the last descriptor is closed: a client that removed
            // a file to make room writes next, and must find the room there.
            let held = open_unlinked_under(dir.path());
            assert!(held.is_empty(), "still open after the call returned: {held:?}");
        }
    }

    #[test]
    fn no_other_change_falls_between_a_setattr_replys_pre_op_and_post_op_attributes() {
        let (_dir, fs) = export();
        let root = Cred::root();
        let f = fs.create(&root, &fs.root(), b"f", &CreateHow::Guarded(SetAttrs::default())).durable().expect("create").obj;
        // Two clients changing one file's attributes at once (every chmod changes ctime).
        let spans: std::collections::BTreeSet<(Timespec, Timespec)> = std::thread::scope(|s| {
            let workers: Vec<_> = [0o600, 0o644]
                .into_iter()
                .map(|mode| {
                    let (fs, root) = (fs.clone(), root.clone());
                    s.spawn(move || {
                        (0..300)
                            .map(|_| {
                                let wcc = fs
                                    .setattr(&root, &f, &SetAttrs { mode: Some(mode), ..Default::default() }, None)
                                    .durable()
                                    .expect("setattr");
                                (wcc.after.expect("post-op").ctime, wcc.before.expect("pre-op").ctime)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("worker")).collect()
        });
        let spans: Vec<_> = spans.into_iter().collect();
        let interleaved = spans.windows(2).filter(|w| w[1].1 != w[0].0).count();
        assert_eq!(
            interleaved,
            0,
            "{interleaved} of {} replies had another change between their pre-op and post-op attributes",
            spans.len()
        );
    }

    #[test]
    fn a_long_setattr_of_a_file_does_not_hold_off_entry_changes_of_directories() {
        let (_dir, fs) = export();
        let root = Cred::root();
        let made = fs.mkdir(&root, &fs.root(), b"d", &SetAttrs::default()).durable().expect("mkdir d");
        // What a SETATTR truncating a large file holds for seconds, for every file that
        // shares this directory's inode number modulo the lock count.
        let truncating = fs.changes.attr_lock(made.attr.fileid).lock();
        let (done_tx, done) = std::sync::mpsc::channel();
        let created = std::thread::scope(|s| {
            s.spawn(|| {
                let created = fs.create(&root, &made.obj, b"f", &CreateHow::Guarded(SetAttrs::default())).durable().map(drop);
                done_tx.send(created).expect("send");
            });
            let created = done.recv_timeout(std::time::Duration::from_secs(10));
            // Let a CREATE that waits finish, so that a failure ends the test.
            drop(truncating);
            created
        });
        assert!(matches!(created, Ok(Ok(()))), "a CREATE waited for the lock of a file's SETATTR: {created:?}");
    }

    #[test]
    fn pathconf_gives_each_file_systems_own_link_and_name_limits() {
        let open = |path: &Path| {
            LocalFs::open(&LocalConfig {
                path: path.to_path_buf(),
                fsid: 1,
                sync: false,
                cache_capacity: 8,
                cache_idle: None,
                changes: ChangeCount::default(),
            })
            .expect("open export")
        };
        let posix = |path: &Path| {
            let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: plain syscalls on a valid C string and out pointer.
            let links = unsafe { libc::pathconf(c.as_ptr(), libc::_PC_LINK_MAX) };
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
            (links as u32, st.f_namemax as u32)
        };
        // The disk's file system (ext4 here: 65,000 links) and tmpfs (no limit of its own;
        // POSIX says 127) differ, so a fixed answer fails one of them.
        let disk = tempfile::tempdir().expect("tempdir");
        let shm = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
        let (on_disk, on_shm) = (posix(disk.path()), posix(shm.path()));
        assert_ne!(on_disk.0, on_shm.0, "the two file systems allow as many links: the test cannot tell them apart");
        for (dir, want) in [(disk.path(), on_disk), (shm.path(), on_shm)] {
            let pc = open(dir).pathconf();
            assert_eq!((pc.link_max, pc.name_max), want, "{}", dir.display());
        }
    }

    #[test]
    fn namespace_durability_says_what_a_sync_export_there_does() {
        let shm = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
        let said = namespace_durability(shm.path());
        assert!(said.starts_with("an fsync of the changed directory"), "tmpfs: {said}");
        let gone = shm.path().join("missing");
        assert!(namespace_durability(&gone).starts_with("unknown"));
    }

    /// Lists `dir` the way a client does, `per_call` entries per reply, continuing at the
    /// last cookie; `between` runs after every reply. Returns the names and the replies.
    fn list(fs: &LocalFs, cred: &Cred, dir: &ObjectId, per_call: usize, mut between: impl FnMut()) -> (Vec<Vec<u8>>, usize) {
        let (mut names, mut cookie, mut calls) = (Vec::new(), 0u64, 0);
        loop {
            let mut taken = 0;
            let end = fs
                .readdir(cred, dir, cookie, true, per_call + 1, &mut |e: DirEntry<'_>| {
                    if taken == per_call {
                        return false;
                    }
                    taken += 1;
                    assert!(e.plus.is_some(), "no attributes for {:?}", String::from_utf8_lossy(e.name));
                    names.push(e.name.to_vec());
                    cookie = e.cookie;
                    true
                })
                .expect("readdir");
            calls += 1;
            between();
            if end.eof {
                return (names, calls);
            }
        }
    }

    /// Handles and attributes of every entry but `.` and `..`, from one READDIRPLUS listing.
    fn plus_entries(fs: &LocalFs, dir: &ObjectId) -> std::collections::HashMap<Vec<u8>, (ObjectId, Attr)> {
        let mut out = std::collections::HashMap::new();
        fs.readdir(&Cred::root(), dir, 0, true, usize::MAX, &mut |e: DirEntry<'_>| {
            if !is_dot_or_dotdot(e.name) {
                out.insert(e.name.to_vec(), e.plus.expect("attributes"));
            }
            true
        })
        .expect("readdir");
        out
    }

    #[test]
    fn a_create_answers_with_the_file_it_made_even_if_renamed_over() {
        // Another process renames a one-byte file over the name again and again while the
        // export creates (GUARDED) and removes that name: whenever a create succeeds, its
        // answer must describe the empty file it made, never the renamed one.
        let (dir, fs) = export();
        let cred = Cred::root();
        let root = fs.root();
        let stop = Arc::new(AtomicBool::new(false));
        let renamer = {
            let (stop, dir) = (stop.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || {
                let mut renames = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::fs::write(dir.join("y"), b"1").expect("write y");
                    if std::fs::rename(dir.join("y"), dir.join("x")).is_ok() {
                        renames += 1;
                    }
                }
                renames
            })
        };
        let mut created = 0;
        for _ in 0..20_000 {
            if let Ok(c) = fs.create(&cred, &root, b"x", &CreateHow::Guarded(SetAttrs::default())).durable() {
                created += 1;
                assert_eq!(c.attr.size, 0, "a create answered with the file renamed over its name");
            }
            let _ = fs.remove(&cred, &root, b"x").durable();
        }
        stop.store(true, Ordering::Relaxed);
        let renames = renamer.join().expect("renamer");
        assert!(created > 100 && renames > 100, "no race was run: {created} creates, {renames} renames");
    }

    /// Waits until inodes born so far may be kept in the handle cache.
    fn let_births_age() {
        std::thread::sleep(std::time::Duration::from_millis(80));
    }

    fn statx_of(path: &Path) -> libc::statx {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        sys::statx(libc::AT_FDCWD, &c, 0).expect("statx")
    }

    #[test]
    fn a_name_made_again_under_a_reused_inode_number_gets_no_handle_for_the_old_attributes() {
        let (dir, fs) = export();
        let path = dir.path().join("f");
        let dir_fd = std::fs::File::open(dir.path()).expect("open the export");
        // The attributes READDIRPLUS took, then the name removed and made again before
        // its handle is looked up: ext4 gives the new file the number just freed.
        let mut tries = 0;
        loop {
            std::fs::write(&path, b"old").expect("create");
            let old = statx_of(&path);
            std::fs::remove_file(&path).expect("remove");
            std::fs::create_dir(&path).expect("make again");
            let new = statx_of(&path);
            let found = fs.handle_for(dir_fd.as_raw_fd(), c"f", 0, &old, false);
            if new.stx_ino == old.stx_ino {
                assert_eq!(found, Err(VfsError::Stale), "a directory's handle with a removed file's attributes");
                let now = fs.handle_for(dir_fd.as_raw_fd(), c"f", 0, &new, false).expect("the new one's handle");
                assert_eq!(fs.lookup(&Cred::root(), &fs.root(), b"f").expect("lookup").0, now);
                return;
            }
            // Another number: the inode-number check alone tells.
            assert_eq!(found, Err(VfsError::Stale));
            std::fs::remove_dir(&path).expect("clean");
            tries += 1;
            assert!(tries < 50, "this file system never reused an inode number: the case was not run");
        }
    }

    #[test]
    fn listed_handles_are_cached_by_inode_and_follow_a_name_renamed_over() {
        let (dir, fs) = export();
        let born = std::time::Instant::now();
        std::fs::write(dir.path().join("a"), b"a").expect("create");
        std::fs::write(dir.path().join("b"), b"bb").expect("create");
        let young = plus_entries(&fs, &fs.root());
        // Unless this thread was held up for most of the margin (a loaded machine).
        if born.elapsed() < cache::BIRTH_TICK_MARGIN / 2 {
            assert_eq!(fs.cached_handle(&statx_of(&dir.path().join("a"))), None, "an inode born this tick is not cached");
        }
        let_births_age();
        let first = plus_entries(&fs, &fs.root());
        assert_eq!(first, young);
        for name in ["a", "b"] {
            let (id, attr) = &first[name.as_bytes()];
            assert_eq!(fs.cached_handle(&statx_of(&dir.path().join(name))), Some(*id), "{name} listed: its handle is cached");
            assert_eq!(fs.lookup(&Cred::root(), &fs.root(), name.as_bytes()).expect("lookup"), (*id, attr.clone()));
        }
        // The name `a` now names b's inode: the listing must give b's handle for it.
        std::fs::rename(dir.path().join("b"), dir.path().join("a")).expect("rename");
        let second = plus_entries(&fs, &fs.root());
        assert_eq!(second.len(), 1);
        assert_eq!(second[&b"a"[..]].0, first[&b"b"[..]].0);
        assert_eq!(second[&b"a"[..]].1.size, 2);
        assert!(matches!(fs.getattr(&Cred::root(), &first[&b"a"[..]].0), Err(VfsError::Stale)));
    }

    #[test]
    fn a_reused_inode_number_gets_its_own_handle() {
        let (dir, fs) = export();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        // The file system hands a freed inode number to the next file, usually at once;
        // try a few times before concluding it does not.
        for _ in 0..20 {
            std::fs::write(&old, b"old").expect("create");
            let_births_age();
            let listed_old = plus_entries(&fs, &fs.root())[&b"old"[..]].0;
            assert!(fs.cached_handle(&statx_of(&old)).is_some());
            let ino = statx_of(&old).stx_ino;
            std::fs::remove_file(&old).expect("remove");
            std::fs::write(&new, b"new!").expect("create");
            if statx_of(&new).stx_ino != ino {
                std::fs::remove_file(&new).expect("remove");
                continue;
            }
            // Listed young and again once aged: neither listing may return the old file's
            // handle for the file that reuses its number.
            for _ in 0..2 {
                let (id, attr) = plus_entries(&fs, &fs.root())[&b"new"[..]].clone();
                assert_ne!(id, listed_old);
                assert_eq!(fs.getattr(&Cred::root(), &id).expect("the listed handle opens the file").size, 4);
                assert_eq!((attr.fileid, attr.size), (ino, 4));
                let_births_age();
            }
            return;
        }
        crate::testing::skip("this file system never reused an inode number at once, so reuse could not be provoked");
    }

    #[test]
    fn listing_continues_in_a_parked_stream_and_matches_a_reopened_one() {
        let (dir, fs) = export();
        for i in 0..500 {
            std::fs::write(dir.path().join(format!("entry-with-a-longer-name-{i:05}")), b"").expect("create");
        }
        let cred = Cred::root();
        let root = fs.root();
        let mut parked_between = 0;
        let (kept, calls) = list(&fs, &cred, &root, 37, || parked_between += fs.dir_streams.len());
        assert!(calls > 10);
        // Every reply but the last left its stream for the next call.
        assert_eq!(parked_between, calls - 1);
        assert_eq!(fs.dir_streams.len(), 0, "a finished listing stays parked");

        // The same listing with every stream dropped between calls (reopen and seek).
        let (reopened, _) = list(&fs, &cred, &root, 37, || while fs.dir_streams.take_any().is_some() {});
        assert_eq!(kept, reopened);
        let unique: HashSet<&Vec<u8>> = kept.iter().collect();
        assert_eq!((kept.len(), unique.len()), (502, 502), "500 entries, . and .., each once");
    }

    #[test]
    fn a_listing_begun_after_a_change_does_not_continue_a_stream_parked_before_it() {
        // A client lists a directory, gives up after one reply (its stream is parked with
        // entries read ahead), files after the next entry are removed, and it lists again
        // from the start: its second call continues at the same cookie (ext4's cookie is
        // the position of the next entry, which stays), and must not be answered from the
        // entries the old stream read before the removals.
        let (dir, fs) = export();
        for i in 0..2000 {
            std::fs::write(dir.path().join(format!("f{i:04}")), b"").expect("create");
        }
        let (cred, root) = (Cred::root(), fs.root());
        let mut kept = HashSet::new();
        fs.readdir(&cred, &root, 0, false, usize::MAX, &mut |e: DirEntry<'_>| {
            kept.insert(e.name.to_vec());
            kept.len() <= 37
        })
        .expect("readdir");
        assert_eq!((kept.len(), fs.dir_streams.len()), (38, 1), "one reply of 37, the stream parked");
        for i in 0..2000 {
            let name = format!("f{i:04}");
            if !kept.contains(name.as_bytes()) {
                std::fs::remove_file(dir.path().join(name)).expect("remove");
            }
        }
        let (again, calls) = list(&fs, &cred, &root, 37, || {});
        assert!(calls >= 2);
        let again: HashSet<Vec<u8>> = again.into_iter().collect();
        kept.extend([b".".to_vec(), b"..".to_vec()]);
        assert_eq!(again, kept, "the listing after the removals shows exactly what is left");
    }

    /// Makes 100 files in the export at `dir`, lists 10 of them as root (the stream is
    /// parked) and returns the cookie the listing ended at.
    fn ten_of_a_hundred_listed(dir: &Path, fs: &LocalFs) -> u64 {
        for i in 0..100 {
            std::fs::write(dir.join(format!("f{i:03}")), b"").expect("create");
        }
        ten_listed(fs, &fs.root())
    }

    /// Lists the first ten entries of `dir` (the rest of the stream is parked) and returns
    /// the cookie the listing ended at.
    fn ten_listed(fs: &LocalFs, dir: &ObjectId) -> u64 {
        let (mut cookie, mut n) = (0, 0);
        fs.readdir(&Cred::root(), dir, 0, false, usize::MAX, &mut |e: DirEntry<'_>| {
            n += 1;
            if n > 10 {
                return false;
            }
            cookie = e.cookie;
            true
        })
        .expect("readdir");
        cookie
    }

    #[test]
    fn a_stream_parked_too_long_ago_is_dropped() {
        let (dir, fs) = export();
        let (root, cookie) = (fs.root(), ten_of_a_hundred_listed(dir.path(), &fs));
        let parked_by = std::time::Instant::now();
        if let Some(long_ago) = parked_by.checked_sub(Duration::from_secs(60)) {
            assert_eq!(fs.dir_streams.drop_parked_before(long_ago), 0, "parked just now");
        }
        assert_eq!(fs.dir_streams.drop_parked_before(parked_by + Duration::from_millis(1)), 1);
        let attr = fs.getattr(&Cred::root(), &root).expect("getattr");
        let (times, changes) = ((attr.ctime, attr.mtime), fs.entry_changes(attr.fileid));
        assert!(fs.dir_streams.take(&root, cookie, &Cred::root(), times, changes).is_none());
    }

    #[test]
    fn a_parked_stream_serves_only_its_caller() {
        let (dir, fs) = export();
        let (root, cookie) = (fs.root(), ten_of_a_hundred_listed(dir.path(), &fs));
        let other = Cred { uid: 1000, gid: 1000, groups: vec![] };
        let attr = fs.getattr(&Cred::root(), &root).expect("getattr");
        let (times, changes) = ((attr.ctime, attr.mtime), fs.entry_changes(attr.fileid));
        assert!(fs.dir_streams.take(&root, cookie, &other, times, changes).is_none());
        assert!(fs.dir_streams.take(&root, cookie, &Cred::root(), times, changes).is_some());
    }

    #[test]
    fn a_stream_read_before_an_entry_change_through_nasd_is_not_continued() {
        let (dir, fs) = export();
        let (root, cred, cookie) = (fs.root(), Cred::root(), ten_of_a_hundred_listed(dir.path(), &fs));
        let attr = fs.getattr(&cred, &root).expect("getattr");
        fs.create(&cred, &root, b"new", &CreateHow::Guarded(SetAttrs::default())).durable().expect("create");
        // As if the directory's times had not moved (one coarse tick): the count alone
        // must tell that the buffer no longer shows the directory.
        let times = (attr.ctime, attr.mtime);
        assert!(
            fs.dir_streams.take(&root, cookie, &cred, times, fs.entry_changes(attr.fileid)).is_none(),
            "a stream read before a CREATE was continued"
        );
    }

    #[test]
    fn a_stream_read_through_one_export_is_not_continued_after_a_change_through_a_nested_one() {
        // `/T` and `/T/sub` both exported: one directory reached through two exports.
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir sub");
        for i in 0..100 {
            std::fs::write(sub.join(format!("f{i:03}")), b"").expect("create");
        }
        let changes = ChangeCount::default();
        let open = |path: &Path, fsid| {
            LocalFs::open(&LocalConfig {
                path: path.to_path_buf(),
                fsid,
                sync: false,
                cache_capacity: 64,
                cache_idle: None,
                changes: changes.clone(),
            })
            .expect("open export")
        };
        let (outer, inner) = (open(dir.path(), 1), open(&sub, 2));
        let cred = Cred::root();
        let (sub_id, attr) = outer.lookup(&cred, &outer.root(), b"sub").expect("lookup sub");
        let times = (attr.ctime, attr.mtime);
        // Ten entries listed through the outer export: the rest of the stream is parked.
        let cookie = ten_listed(&outer, &sub_id);
        assert!(
            outer.dir_streams.take(&sub_id, cookie, &cred, times, outer.entry_changes(attr.fileid)).is_some(),
            "nothing changed: the stream goes on"
        );
        let cookie = ten_listed(&outer, &sub_id);
        inner.create(&cred, &inner.root(), b"new", &CreateHow::Guarded(SetAttrs::default())).durable().expect("create");
        // As if the directory's times had not moved (one coarse tick).
        assert!(
            outer.dir_streams.take(&sub_id, cookie, &cred, times, outer.entry_changes(attr.fileid)).is_none(),
            "a stream read through the outer export before a CREATE through the inner one was continued"
        );
    }

    #[test]
    fn batched_listing_gives_each_entry_its_own_attributes_and_handle() {
        let (dir, fs) = export();
        for i in 0..300usize {
            std::fs::write(dir.path().join(format!("f{i:03}")), vec![0u8; i]).expect("create");
        }
        let root = fs.root();
        // Whole-directory batches and reply-sized ones (with the count estimate one short,
        // so the listing also goes on past an estimate).
        for (per_call, estimate) in [(usize::MAX, usize::MAX), (37, 38), (37, 36)] {
            let (mut seen, mut cookie) = (0, 0u64);
            loop {
                let mut taken = 0;
                let end = fs
                    .readdir(&Cred::root(), &root, cookie, true, estimate, &mut |e: DirEntry<'_>| {
                        if taken == per_call {
                            return false;
                        }
                        taken += 1;
                        cookie = e.cookie;
                        if is_dot_or_dotdot(e.name) {
                            return true;
                        }
                        let name = std::str::from_utf8(e.name).expect("utf-8");
                        let (id, attr) = e.plus.expect("attributes");
                        let i: u64 = name[1..].parse().expect("index");
                        assert_eq!(attr.size, i, "{name}: another entry's attributes");
                        assert_eq!(
                            attr.fileid,
                            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.path().join(name)).expect("stat"))
                        );
                        assert_eq!(fs.lookup(&Cred::root(), &root, e.name).expect("lookup").0, id, "{name}: another entry's handle");
                        seen += 1;
                        true
                    })
                    .expect("readdir");
                if end.eof {
                    break;
                }
            }
            assert_eq!(seen, 300);
        }
    }

    #[test]
    fn batched_listing_looks_at_entries_as_the_caller() {
        if !creds::init() {
            crate::testing::skip("switching identities needs root");
            return;
        }
        let (dir, fs) = export();
        // Others may read the directory but not search it: they see names, and no
        // attributes, as a local `ls -l` by them would.
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        for i in 0..400 {
            std::fs::write(shared.join(format!("f{i:03}")), b"x").expect("create");
        }
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o744)).expect("chmod");
        let (sid, _) = fs.lookup(&Cred::root(), &fs.root(), b"shared").expect("lookup");
        let other = Cred { uid: 4321, gid: 4321, groups: vec![] };
        for cred in [other, Cred::root()] {
            let (mut names, mut with_attrs) = (0, 0);
            fs.readdir(&cred, &sid, 0, true, usize::MAX, &mut |e: DirEntry<'_>| {
                if !is_dot_or_dotdot(e.name) {
                    names += 1;
                    with_attrs += usize::from(e.plus.is_some());
                }
                true
            })
            .expect("readdir");
            let expected = if cred.uid == 0 { 400 } else { 0 };
            assert_eq!((names, with_attrs), (400, expected), "uid {}", cred.uid);
        }
    }

    /// Lists two replies of 37 entries of a fresh export holding 200 empty files, lets the
    /// look-ahead of the next reply finish, runs `between`, and returns the sizes of the
    /// files `f*` in the next reply; `None` if that took too long for the look-ahead to
    /// stay usable. Each reply takes one entry fewer than it was offered: the look-ahead
    /// the second call begins covers the whole third reply only if it starts where the
    /// second reply is expected to end (as long as the first), not where its offer ends.
    fn sizes_in_next_reply_after(between: impl FnOnce(&Path, &LocalFs)) -> Option<Vec<u64>> {
        let (dir, fs) = export();
        for i in 0..200 {
            std::fs::write(dir.path().join(format!("f{i:03}")), b"").expect("create");
        }
        let root = fs.root();
        let mut cookie = 0;
        for _ in 0..2 {
            let mut taken = 0;
            fs.readdir(&Cred::root(), &root, cookie, true, 38, &mut |e: DirEntry<'_>| {
                if taken == 37 {
                    return false;
                }
                (taken, cookie) = (taken + 1, e.cookie);
                true
            })
            .expect("readdir");
        }
        let begun = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        between(dir.path(), &fs);
        if begun.elapsed() > LOOK_AHEAD_MAX_AGE / 2 {
            return None;
        }
        let (mut sizes, mut taken) = (Vec::new(), 0);
        fs.readdir(&Cred::root(), &root, cookie, true, 38, &mut |e: DirEntry<'_>| {
            if taken == 37 {
                return false;
            }
            taken += 1;
            if e.name.starts_with(b"f") {
                sizes.push(e.plus.expect("attributes").1.size);
            }
            true
        })
        .expect("readdir");
        assert!(sizes.len() > 30);
        Some(sizes)
    }

    fn write_every_file(dir: &Path, size: usize) {
        for i in 0..200 {
            std::fs::write(dir.join(format!("f{i:03}")), vec![b'x'; size]).expect("write");
        }
    }

    /// One READDIRPLUS call of `fs`'s root from `cookie` that takes `n` entries; returns
    /// the cookie it ended at and the stream it parked (taken out of the parked streams).
    fn take_and_unpark(fs: &LocalFs, cookie: u64, n: usize) -> (u64, DirStream) {
        let (mut taken, mut last) = (0, cookie);
        fs.readdir(&Cred::root(), &fs.root(), cookie, true, n, &mut |e: DirEntry<'_>| {
            if taken == n {
                return false;
            }
            (taken, last) = (taken + 1, e.cookie);
            true
        })
        .expect("readdir");
        (last, fs.dir_streams.take_any().expect("a parked stream"))
    }

    #[test]
    fn a_look_ahead_covers_the_next_replies_and_grows_while_it_is_used_to_its_end() {
        if listing_helpers().is_none() {
            crate::testing::skip("one core, so listings are not looked at ahead");
            return;
        }
        let (dir, fs) = export();
        for i in 0..1000 {
            std::fs::write(dir.path().join(format!("f{i:04}")), b"").expect("create");
        }
        let attr = fs.getattr(&Cred::root(), &fs.root()).expect("getattr");
        let park = |cookie, stream| fs.dir_streams.park(fs.root(), cookie, &Cred::root(), (attr.ctime, attr.mtime), stream);
        // The look-ahead must stay fresh from the first call to the fifth (its entries age
        // out after LOOK_AHEAD_MAX_AGE): a loaded machine gets more tries.
        let grew = (0..10).any(|_| {
            let begun = std::time::Instant::now();
            // The first reply's 20 entries and three more replies' worth are looked at.
            let (mut cookie, first) = take_and_unpark(&fs, 0, 20);
            let remaining = first.ahead.as_ref().map(LookAhead::remaining);
            assert_eq!(remaining, Some(20 * (FIRST_LOOK_AHEAD_REPLIES - 1)), "the first call's look-ahead");
            park(cookie, first);
            for _ in 0..FIRST_LOOK_AHEAD_REPLIES - 1 {
                let (c, s) = take_and_unpark(&fs, cookie, 20);
                cookie = c;
                if s.ahead.is_none() {
                    return false;
                }
                park(cookie, s);
            }
            let last = fs.dir_streams.take_any().expect("parked");
            // Used to its end: the next look-ahead, begun by the fourth call for the rest of
            // its reply, may be twice as long, and takes what the buffer holds up to that.
            let doubled = 2 * 20 * FIRST_LOOK_AHEAD_REPLIES;
            let in_buffer = sys::parse_dirents(&last.buf[last.pos..last.len]).count();
            begun.elapsed() < LOOK_AHEAD_MAX_AGE / 2
                && last.window == doubled
                && last.ahead.as_ref().map(LookAhead::remaining) == Some(doubled.min(in_buffer))
        });
        assert!(grew, "no listing's look-ahead grew after it was used to its end");
    }

    #[test]
    fn entries_looked_at_ahead_are_served_only_while_nothing_can_have_changed_them() {
        if listing_helpers().is_none() {
            crate::testing::skip("one core, so listings are not looked at ahead");
            return;
        }
        // Written by another program, in a directory that did not change: the entries were
        // looked at before the writes, within the bounded age, and are served as they were.
        // This shows the look-ahead is used at all; tried up to 20 times, as on a loaded
        // machine the helper thread (shared with other tests) may start late.
        let served_as_looked_at =
            (0..20).any(|_| sizes_in_next_reply_after(|dir, _| write_every_file(dir, 5)).is_some_and(|s| s.iter().all(|&n| n == 0)));
        assert!(served_as_looked_at, "the entries looked at ahead were not used");
        // The changes below must show in every attempt that was quick enough to tell
        // (three of them; a loaded machine gets more tries before none can tell).
        let attempts = |between: &dyn Fn(&Path, &LocalFs), expected: u64| {
            let told: Vec<bool> =
                (0..30).filter_map(|_| sizes_in_next_reply_after(between)).take(3).map(|s| s.iter().all(|&n| n == expected)).collect();
            assert!(
                !told.is_empty(),
                "no attempt in 30 was quick enough to tell (the look-ahead's entries age out after {LOOK_AHEAD_MAX_AGE:?})"
            );
            told.iter().all(|&ok| ok)
        };
        // Written through this backend: every reply after that shows the writes.
        let through_backend = |dir: &Path, fs: &LocalFs| {
            for i in 0..200 {
                let (id, _) = fs.lookup(&Cred::root(), &fs.root(), format!("f{i:03}").as_bytes()).expect("lookup");
                fs.write(&Cred::root(), &id, 0, b"abc", Stability::Unstable, Blocking::Allowed).expect("write");
            }
            let _ = dir;
        };
        assert!(attempts(&through_backend, 3), "a write through the backend was missed");
        // Made by a call through this backend that has not returned yet (its change made,
        // its sync still running when the next reply is made): never ends, here.
        let still_running = |dir: &Path, fs: &LocalFs| {
            std::mem::forget(fs.modifying());
            write_every_file(dir, 9);
        };
        assert!(attempts(&still_running, 9), "a change by a call still running was missed");
        // Written by another program that also changed the directory: the directory's
        // times give it away.
        assert!(
            attempts(
                &|dir, _| {
                    write_every_file(dir, 7);
                    std::fs::write(dir.join("new"), b"").expect("create")
                },
                7
            ),
            "a directory change was missed"
        );
    }
}
