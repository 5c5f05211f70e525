//! The storage interface: the only door from protocol code to storage.
//!
//! Types here are protocol-neutral (no NFSv3 or NFSv4 wire types) so that every protocol
//! version and every backend (local directory today, object storage later) meets here.
//! Calls are synchronous; the server runs them on worker threads.

mod error;

pub use error::{VfsError, VfsResult};

thread_local! {
    static CALLER_SOCKET: std::cell::Cell<Option<std::os::fd::RawFd>> = const { std::cell::Cell::new(None) };
    static ENGAGED_HELPERS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Jobs queued or running on backends' helper threads (a listing's look-ahead).
static HELPER_JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Backends: the calling thread queues a job for a helper thread; the guard counts it
/// ended when dropped.
pub fn helper_job() -> HelperJob {
    ENGAGED_HELPERS.with(|e| e.set(true));
    HELPER_JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HelperJob(())
}

/// Transports: whether the calling thread queued helper jobs since the last look; clears.
pub fn take_engaged_helpers() -> bool {
    ENGAGED_HELPERS.with(|e| e.replace(false))
}

/// A job counted in [`helpers_working`] until dropped.
pub struct HelperJob(());

impl Drop for HelperJob {
    fn drop(&mut self) {
        HELPER_JOBS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Transports: whether helper threads have work queued or running. A serving thread that
/// spins waiting for its client's next call meanwhile keeps a CPU the helpers would use,
/// and stays on it while its client runs on the other: the client then waits behind the
/// helpers for its CPU (docs/performance.md).
pub fn helpers_working() -> bool {
    HELPER_JOBS.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// Transports: the connected socket of the call this thread serves now; `None` once it
/// is served.
pub fn serving_socket(fd: Option<std::os::fd::RawFd>) {
    CALLER_SOCKET.with(|s| s.set(fd));
}

/// Backends: the CPU that last took in data from the caller's connection, if known: on
/// loopback, the CPU the client sent its call from. Work handed to helper threads is kept
/// off it, so that the client does not wait behind the helpers for its CPU.
pub fn caller_cpu() -> Option<usize> {
    let fd = CALLER_SOCKET.with(|s| s.get())?;
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid pointers and sizes; the socket is open while its call is served.
    let done = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_INCOMING_CPU, (&mut cpu as *mut libc::c_int).cast(), &mut len) };
    if done != 0 {
        return None;
    }
    usize::try_from(cpu).ok()
}

/// Longest backend object id. Wire handles add an export id and an authenticator and must
/// still fit the 64 bytes of an NFSv3 handle.
pub const MAX_OBJECT_ID: usize = 40;

/// A backend's stable name for one file system object. It survives server restarts and
/// renames; using it after the object is gone gives [`VfsError::Stale`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectId {
    len: u8,
    bytes: [u8; MAX_OBJECT_ID],
}

impl ObjectId {
    pub fn new(data: &[u8]) -> Option<Self> {
        if data.len() > MAX_OBJECT_ID {
            return None;
        }
        let mut bytes = [0u8; MAX_OBJECT_ID];
        bytes[..data.len()].copy_from_slice(data);
        Some(Self { len: data.len() as u8, bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectId(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// `(uid_t)-1`: no one's uid or gid. The kernel's `setfsuid`/`setfsgid` ignore it and
/// `setgroups` refuses it, so a call run with it would keep the server's own identity.
pub const INVALID_ID: u32 = u32::MAX;

/// The identity an operation runs as, after export squashing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Self {
        Self { uid: 0, gid: 0, groups: Vec::new() }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    BlockDevice,
    CharDevice,
    Symlink,
    Socket,
    Fifo,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (0o7777).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Bytes of storage actually used.
    pub used: u64,
    pub rdev: (u32, u32),
    pub fsid: u64,
    pub fileid: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

/// The attributes a client needs to validate its cache around a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreOpAttr {
    pub size: u64,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

impl From<&Attr> for PreOpAttr {
    fn from(a: &Attr) -> Self {
        Self { size: a.size, mtime: a.mtime, ctime: a.ctime }
    }
}

/// Attributes of an object before and after a change (weak cache consistency).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wcc {
    pub before: Option<PreOpAttr>,
    pub after: Option<Attr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime {
    #[default]
    Unchanged,
    ServerNow,
    Client(Timespec),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow {
    /// Create or open an existing file (truncating if a size is given).
    Unchecked(SetAttrs),
    /// Fail with `Exist` if the name exists.
    Guarded(SetAttrs),
    /// Exactly-once create: a retry with the same verifier succeeds on the file the first
    /// attempt made.
    Exclusive([u8; 8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialNode {
    Fifo,
    Socket,
    CharDevice(u32, u32),
    BlockDevice(u32, u32),
}

/// Whether a data call may wait for the disk. Servers try READ and WRITE first on their
/// network threads with `Forbidden` (served from memory, no thread hand-off) and, on
/// [`VfsError::WouldBlock`], again with `Allowed` on a thread that may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    Allowed,
    Forbidden,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stability {
    Unstable,
    DataSync,
    FileSync,
}

/// ACCESS bits; NFSv3 and NFSv4 share these values.
pub mod access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
}

/// What [`Vfs::lookup_in`] found.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub dir_attr: Attr,
    /// The entry's handle and attributes, or why the name gave none.
    pub found: VfsResult<(ObjectId, Attr)>,
}

#[derive(Debug, Clone)]
pub struct Created {
    pub obj: ObjectId,
    pub attr: Attr,
    pub dir_wcc: Wcc,
}

#[derive(Debug, Clone)]
pub struct ReadResult {
    pub count: usize,
    pub eof: bool,
    pub attr: Attr,
}

#[derive(Debug, Clone)]
pub struct WriteResult {
    pub count: usize,
    pub committed: Stability,
    pub wcc: Wcc,
}

/// Bytes of an open file that the transport sends straight from the page cache to the
/// socket (no copy through a buffer), for READ replies served from memory.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub fd: std::sync::Arc<std::os::fd::OwnedFd>,
    pub offset: u64,
    pub len: usize,
    /// Set by the transport when the range could not be sent as it stood (the file was cut
    /// short after the READ, or its data could not be read) and the connection was closed
    /// for it: the backend then copies the file's next READ, which answers what is true
    /// now (a short read, or an error) to the client's retransmission.
    pub send_failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PartialEq for FileRange {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.fd, &other.fd) && self.offset == other.offset && self.len == other.len
    }
}

impl Eq for FileRange {}

/// One directory entry handed to a READDIR consumer.
#[derive(Debug, Clone)]
pub struct DirEntry<'a> {
    pub name: &'a [u8],
    pub fileid: u64,
    /// Resume point: passing it back continues after this entry.
    pub cookie: u64,
    /// Handle and attributes, when the caller asked for them (READDIRPLUS).
    pub plus: Option<(ObjectId, Attr)>,
}

#[derive(Debug, Clone)]
pub struct ReadDirEnd {
    pub eof: bool,
    pub dir_attr: Attr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub total_files: u64,
    pub free_files: u64,
    pub avail_files: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathConf {
    pub link_max: u32,
    pub name_max: u32,
    pub no_trunc: bool,
    pub chown_restricted: bool,
    pub case_insensitive: bool,
    pub case_preserving: bool,
    /// Largest file the file system can hold, in bytes.
    pub max_file_size: u64,
}

/// A change that has been made and may not yet be durable. [`Made::durable`] waits until
/// it is (in a `sync` export: the directory's or the file system's sync) and returns its
/// result. Meanwhile a server can put the reply aside, so that a server killed during the
/// sync still answers a retransmission of the call with it (the duplicate request journal).
#[must_use = "a change is not known to be durable until `durable` returns"]
pub struct Made<'a, T> {
    pub result: T,
    pending: Option<Box<dyn FnOnce() -> VfsResult<()> + 'a>>,
}

impl<'a, T> Made<'a, T> {
    /// A change that is durable already, or never will be waited for (an `async` export).
    pub fn durable_already(result: T) -> Self {
        Self { result, pending: None }
    }

    /// A change that `make_durable` makes durable.
    pub fn pending(result: T, make_durable: impl FnOnce() -> VfsResult<()> + 'a) -> Self {
        Self { result, pending: Some(Box::new(make_durable)) }
    }

    /// Whether something remains to be done to make the change durable.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The result now, and what remains to make the change durable, for a change that
    /// is part of a larger one whose own sync must also wait for it.
    pub fn split(self) -> (T, Made<'a, ()>) {
        (self.result, Made { result: (), pending: self.pending })
    }

    /// Waits until the change is durable: its result, or why it may not be.
    pub fn durable(self) -> VfsResult<T> {
        if let Some(make_durable) = self.pending {
            make_durable()?;
        }
        Ok(self.result)
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Made<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Made").field("result", &self.result).field("pending", &self.is_pending()).finish()
    }
}

/// `.durable()` on the outcome of a change, for callers with nothing to do in between.
pub trait WaitDurable<T> {
    fn durable(self) -> VfsResult<T>;
}

impl<T> WaitDurable<T> for VfsResult<Made<'_, T>> {
    fn durable(self) -> VfsResult<T> {
        self?.durable()
    }
}

/// A storage backend. Every method runs with `cred`'s permissions. Changes to the
/// namespace and to attributes return once made, with what makes them durable ([`Made`]).
pub trait Vfs: Send + Sync {
    fn root(&self) -> ObjectId;
    fn getattr(&self, cred: &Cred, obj: &ObjectId) -> VfsResult<Attr>;
    /// `guard_ctime`: fail with `NotSync` unless the object's ctime equals it.
    fn setattr<'a>(&'a self, cred: &'a Cred, obj: &ObjectId, attrs: &SetAttrs, guard_ctime: Option<Timespec>) -> VfsResult<Made<'a, Wcc>>;
    /// `name` in `dir`, with the directory's attributes as resolving it found them: a
    /// LOOKUP reply carries both, found or not, and the directory need not be statted
    /// twice. Fails only where the directory itself cannot be used.
    fn lookup_in(&self, cred: &Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Lookup>;
    /// Just the entry of [`Self::lookup_in`].
    fn lookup(&self, cred: &Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<(ObjectId, Attr)> {
        self.lookup_in(cred, dir, name)?.found
    }
    /// Returns which of the `mask` bits the caller is granted.
    fn access(&self, cred: &Cred, obj: &ObjectId, mask: u32) -> VfsResult<(u32, Attr)>;
    fn readlink(&self, cred: &Cred, obj: &ObjectId) -> VfsResult<(Vec<u8>, Attr)>;
    /// Appends up to `count` bytes read at `offset` to `out` (fewer only at end of file).
    /// With `Blocking::Forbidden` it either serves the whole range from memory or fails
    /// with `WouldBlock`, appending nothing.
    fn read(&self, cred: &Cred, obj: &ObjectId, offset: u64, count: usize, out: &mut Vec<u8>, blocking: Blocking) -> VfsResult<ReadResult>;
    /// Like `read` with `Blocking::Forbidden`, but leaves the data where it is and returns the
    /// file range to send, all of it in memory; `WouldBlock` when some of it is not.
    /// `Ok(None)`: this backend or object cannot serve reads that way; use `read`.
    fn read_in_place(&self, _cred: &Cred, _obj: &ObjectId, _offset: u64, _count: usize) -> VfsResult<Option<(ReadResult, FileRange)>> {
        Ok(None)
    }
    /// With `Blocking::Forbidden` it fails with `WouldBlock`, having changed nothing, when
    /// the write would wait for the disk (a stable write always does).
    fn write(&self, cred: &Cred, obj: &ObjectId, offset: u64, data: &[u8], stable: Stability, blocking: Blocking)
        -> VfsResult<WriteResult>;
    /// Makes everything written to the object durable.
    fn commit(&self, cred: &Cred, obj: &ObjectId, offset: u64, count: u64) -> VfsResult<Wcc>;
    fn create<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], how: &CreateHow) -> VfsResult<Made<'a, Created>>;
    fn mkdir<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], attrs: &SetAttrs) -> VfsResult<Made<'a, Created>>;
    fn symlink<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8], target: &[u8], attrs: &SetAttrs) -> VfsResult<Made<'a, Created>>;
    fn mknod<'a>(
        &'a self,
        cred: &'a Cred,
        dir: &ObjectId,
        name: &[u8],
        node: SpecialNode,
        attrs: &SetAttrs,
    ) -> VfsResult<Made<'a, Created>>;
    fn remove<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, Wcc>>;
    fn rmdir<'a>(&'a self, cred: &'a Cred, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, Wcc>>;
    fn rename<'a>(
        &'a self,
        cred: &'a Cred,
        from_dir: &ObjectId,
        from: &[u8],
        to_dir: &ObjectId,
        to: &[u8],
    ) -> VfsResult<Made<'a, (Wcc, Wcc)>>;
    fn link<'a>(&'a self, cred: &'a Cred, obj: &ObjectId, dir: &ObjectId, name: &[u8]) -> VfsResult<Made<'a, (Attr, Wcc)>>;
    /// Lists `dir` from `cookie` (0 = start), offering entries to `accept` until it
    /// returns false (reply full) or the directory ends. `max_entries` is the caller's
    /// estimate of how many entries it can take, for backends that prepare entries in
    /// batches; `accept` alone decides.
    fn readdir(
        &self,
        cred: &Cred,
        dir: &ObjectId,
        cookie: u64,
        plus: bool,
        max_entries: usize,
        accept: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> VfsResult<ReadDirEnd>;
    fn fsstat(&self, cred: &Cred, obj: &ObjectId) -> VfsResult<(FsStat, Attr)>;
    fn pathconf(&self) -> PathConf;
    /// Changes on every server start, and whenever the backend can no longer vouch for
    /// UNSTABLE writes it acknowledged (a failed sync), so clients resend uncommitted writes.
    fn write_verifier(&self) -> [u8; 8];
    /// Makes every change made so far durable, an earlier server process's included,
    /// whatever the export's options: a new process does this before it answers from
    /// replies an old one put aside while their changes were still being made durable.
    fn make_all_durable(&self) -> VfsResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    /// Moves the calling thread to `cpu` alone; false if it may not run there.
    fn pin_to(cpu: usize) -> bool {
        crate::cpu::Placement::of_this_thread().is_some_and(|mut p| {
            p.pin_to(cpu);
            crate::cpu::current_cpu() == Some(cpu)
        })
    }

    #[test]
    fn the_caller_cpu_is_the_cpu_a_loopback_client_sent_from() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            crate::testing::skip("one CPU: every client sends from it");
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        assert_eq!(caller_cpu(), None, "no call is being served");
        for cpu in [1, 0] {
            let sent = std::thread::scope(|s| s.spawn(|| pin_to(cpu).then(|| client.write_all(b"call").is_ok())).join().unwrap());
            let Some(sent) = sent else {
                crate::testing::skip("this process may not run on CPUs 0 and 1");
                return;
            };
            assert!(sent, "could not send from CPU {cpu}");
            let mut buf = [0u8; 4];
            server.read_exact(&mut buf).unwrap();
            serving_socket(Some(server.as_raw_fd()));
            let seen = caller_cpu();
            serving_socket(None);
            assert_eq!(seen, Some(cpu), "the client sent from CPU {cpu}");
        }
        assert_eq!(caller_cpu(), None, "the call was served");
    }

    #[test]
    fn helpers_count_as_working_while_a_job_is_held() {
        // Other tests' jobs may come and go beside this one: only what holds whatever they
        // do is checked.
        let job = helper_job();
        assert!(helpers_working());
        let second = helper_job();
        drop(job);
        assert!(helpers_working(), "one job is still held");
        drop(second);
    }
}
