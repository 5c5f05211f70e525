//! Thin, checked wrappers over the Linux syscalls the local backend needs.

use crate::vfs::{Attr, FileKind, ObjectId, Timespec, VfsError, VfsResult, MAX_OBJECT_ID};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

pub fn last_err() -> VfsError {
    VfsError::from_errno(errno())
}

pub fn check(ret: libc::c_int) -> VfsResult<libc::c_int> {
    if ret < 0 {
        Err(last_err())
    } else {
        Ok(ret)
    }
}

/// Converts a name from the wire into a C string, refusing what cannot be a single
/// component in this directory.
pub fn component(name: &[u8]) -> VfsResult<CString> {
    if name.is_empty() || name.contains(&b'/') {
        return Err(VfsError::Inval);
    }
    if name.len() > 255 {
        return Err(VfsError::NameTooLong);
    }
    CString::new(name).map_err(|_| VfsError::Inval)
}

pub fn proc_fd_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL")
}

const HANDLE_BYTES_MAX: usize = MAX_OBJECT_ID - 4;

#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

/// The kernel's persistent handle of `name` relative to `dirfd` (`""` = `dirfd` itself),
/// packed as an [`ObjectId`]: handle type (little endian) then handle bytes; and the id of
/// the mount it was reached through.
pub fn name_to_handle(dirfd: RawFd, name: &CStr, flags: libc::c_int) -> VfsResult<(ObjectId, i32)> {
    let mut fh = FileHandle { handle_bytes: 128, handle_type: 0, f_handle: [0; 128] };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: fh is large enough for MAX_HANDLE_SZ (128) bytes as announced.
    let r = unsafe { libc::syscall(libc::SYS_name_to_handle_at, dirfd, name.as_ptr(), &mut fh as *mut FileHandle, &mut mount_id, flags) };
    if r < 0 {
        return Err(match errno() {
            libc::EOPNOTSUPP => VfsError::NotSupp,
            e => VfsError::from_errno(e),
        });
    }
    let n = fh.handle_bytes as usize;
    if n > HANDLE_BYTES_MAX {
        return Err(VfsError::NotSupp);
    }
    let mut raw = [0u8; MAX_OBJECT_ID];
    raw[..4].copy_from_slice(&fh.handle_type.to_le_bytes());
    raw[4..4 + n].copy_from_slice(&fh.f_handle[..n]);
    Ok((ObjectId::new(&raw[..4 + n]).expect("bounded"), mount_id))
}

/// Opens an object by its kernel handle. Needs CAP_DAC_READ_SEARCH.
pub fn open_by_handle(mount_fd: RawFd, id: &ObjectId, flags: libc::c_int) -> VfsResult<OwnedFd> {
    let raw = id.as_bytes();
    if raw.len() < 4 {
        return Err(VfsError::BadHandle);
    }
    let mut fh = FileHandle { handle_bytes: (raw.len() - 4) as u32, handle_type: 0, f_handle: [0; 128] };
    fh.handle_type = i32::from_le_bytes(raw[..4].try_into().expect("4 bytes"));
    fh.f_handle[..raw.len() - 4].copy_from_slice(&raw[4..]);
    // SAFETY: fh is a valid file_handle with handle_bytes within f_handle.
    let fd = unsafe { libc::syscall(libc::SYS_open_by_handle_at, mount_fd, &mut fh as *mut FileHandle, flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(match errno() {
            libc::ESTALE | libc::ENOENT | libc::EINVAL | libc::ELOOP => VfsError::Stale,
            e => VfsError::from_errno(e),
        });
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn openat(dirfd: RawFd, name: &CString, flags: libc::c_int, mode: u32) -> VfsResult<OwnedFd> {
    // SAFETY: valid C string; the returned fd is owned.
    let fd = check(unsafe { libc::openat(dirfd, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn fstat(fd: RawFd) -> VfsResult<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// `faccessat2` answers EPERM for everything (a seccomp filter that predates it, as older
/// container runtimes install): [`may_access`] then says it cannot tell.
static FACCESSAT2_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records that `faccessat2` refused root a read of a directory, which only a filter of
/// the system call itself does.
pub fn faccessat2_refused() {
    FACCESSAT2_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the calling thread, with its current file-system identity (fsuid, fsgid,
/// groups), may access the object `fd` holds (`mode`: `R_OK`/`W_OK`/`X_OK` bits), as the
/// kernel decides for a local process: mode bits and POSIX ACLs. `None` where the kernel
/// has no `faccessat2` (before 5.8).
pub fn may_access(fd: RawFd, mode: u32) -> VfsResult<Option<bool>> {
    if FACCESSAT2_REFUSED.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    // SAFETY: a valid C string; AT_EACCESS checks the thread's fsuid/fsgid, not its real ids.
    let r = unsafe { libc::syscall(libc::SYS_faccessat2, fd, c"".as_ptr(), mode as libc::c_int, libc::AT_EMPTY_PATH | libc::AT_EACCESS) };
    if r == 0 {
        return Ok(Some(true));
    }
    match errno() {
        libc::EACCES | libc::EPERM | libc::EROFS => Ok(Some(false)),
        libc::ENOSYS => Ok(None),
        _ => Err(last_err()),
    }
}

/// What `statx` is asked for: the attributes, the birth time that tells inode
/// incarnations apart and the mount the object was reached through.
const STATX_WANTED: libc::c_uint = libc::STATX_BASIC_STATS | libc::STATX_BTIME | libc::STATX_MNT_ID;

/// `statx` of `name` relative to `dirfd` (`""` with `AT_EMPTY_PATH`: `dirfd` itself),
/// never following a symlink.
pub fn statx(dirfd: RawFd, name: &CStr, flags: libc::c_int) -> VfsResult<libc::statx> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    // Never an automount: what is mounted on a name inside the export is not served,
    // and a `statx` must not be what mounts it.
    let flags = flags | libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT;
    check(unsafe { libc::statx(dirfd, name.as_ptr(), flags, STATX_WANTED, &mut st) })?;
    Ok(st)
}

/// The mount a `statx` result was reached through, if the kernel said.
pub fn statx_mount(st: &libc::statx) -> Option<i32> {
    (st.stx_mask & libc::STATX_MNT_ID != 0).then_some(st.stx_mnt_id as i32)
}

pub fn statx_dev(st: &libc::statx) -> u64 {
    libc::makedev(st.stx_dev_major, st.stx_dev_minor)
}

/// The inode number inside a kernel handle, for the layout ext2/3/4 and XFS (32-bit inode
/// numbers) use: type 1 (`FILEID_INO32_GEN`), inode number then generation. `None` for
/// any other layout.
pub fn handle_ino(id: &ObjectId) -> Option<u64> {
    const FILEID_INO32_GEN: i32 = 1;
    let raw = id.as_bytes();
    (raw.len() == 12 && raw[..4] == FILEID_INO32_GEN.to_le_bytes())
        .then(|| u32::from_ne_bytes(raw[4..8].try_into().expect("4 bytes")) as u64)
}

fn kind_from_mode(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFBLK => FileKind::BlockDevice,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFIFO => FileKind::Fifo,
        _ => FileKind::Regular,
    }
}

pub fn attr_from_statx(st: &libc::statx, fsid: u64) -> Attr {
    let ts = |t: &libc::statx_timestamp| Timespec { sec: t.tv_sec, nsec: t.tv_nsec };
    let mode = st.stx_mode as u32;
    Attr {
        kind: kind_from_mode(mode),
        mode: mode & 0o7777,
        nlink: st.stx_nlink,
        uid: st.stx_uid,
        gid: st.stx_gid,
        size: st.stx_size,
        used: st.stx_blocks * 512,
        rdev: (st.stx_rdev_major, st.stx_rdev_minor),
        fsid,
        fileid: st.stx_ino,
        atime: ts(&st.stx_atime),
        mtime: ts(&st.stx_mtime),
        ctime: ts(&st.stx_ctime),
    }
}

pub fn attr_from_stat(st: &libc::stat, fsid: u64) -> Attr {
    let kind = kind_from_mode(st.st_mode);
    let ts = |sec: i64, nsec: i64| Timespec { sec, nsec: nsec as u32 };
    Attr {
        kind,
        mode: st.st_mode & 0o7777,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        used: (st.st_blocks as u64) * 512,
        rdev: (libc::major(st.st_rdev), libc::minor(st.st_rdev)),
        fsid,
        fileid: st.st_ino,
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
    }
}

/// Appends up to `count` bytes read at `offset` to `out`, stopping early only at end of
/// file. With `nowait`, data that is not in the page cache fails the whole read with
/// `WouldBlock` and appends nothing.
pub fn pread_append(fd: &OwnedFd, out: &mut Vec<u8>, count: usize, offset: u64, nowait: bool) -> VfsResult<usize> {
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    let start = out.len();
    out.reserve(count);
    let mut done = 0;
    while done < count {
        let spare = &mut out.spare_capacity_mut()[..count - done];
        let iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: spare.len() };
        // SAFETY: one iovec over reserved, unused capacity of `out`; the kernel writes at
        // most its length, and only the bytes it reports written become part of `out`.
        let n = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, (offset + done as u64) as i64, flags) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            out.truncate(start);
            return Err(if nowait && e == libc::EAGAIN { VfsError::WouldBlock } else { VfsError::from_errno(e) });
        }
        if n == 0 {
            break;
        }
        // SAFETY: the kernel initialised these `n` bytes.
        unsafe { out.set_len(out.len() + n as usize) };
        done += n as usize;
    }
    Ok(done)
}

/// One buffered write that must not wait for the disk. `Ok(None)`: the file system cannot
/// promise that (no `RWF_NOWAIT` for buffered writes). A short count is possible.
pub fn pwrite_nowait(fd: &OwnedFd, data: &[u8], offset: u64) -> VfsResult<Option<usize>> {
    let iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    loop {
        // SAFETY: one valid iovec over `data`.
        let n = unsafe { libc::pwritev2(fd.as_raw_fd(), &iov, 1, offset as i64, libc::RWF_NOWAIT) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        match errno() {
            libc::EINTR => continue,
            libc::EAGAIN => return Err(VfsError::WouldBlock),
            libc::EOPNOTSUPP => return Ok(None),
            _ => return Err(last_err()),
        }
    }
}

/// Writes all of `data`, or as much as went in before an error (a full file system):
/// like write(2), a short count then, and the error only if nothing was written. So a
/// WRITE that changed the file is answered with what it wrote, as knfsd does, and the
/// client's WRITE of the rest gets the error. `flags` may carry RWF_DSYNC or RWF_SYNC to
/// make it durable in the same syscall.
pub fn pwrite(fd: &OwnedFd, data: &[u8], offset: u64, flags: libc::c_int) -> VfsResult<usize> {
    let mut done = 0;
    while done < data.len() {
        let iov = libc::iovec { iov_base: data[done..].as_ptr() as *mut _, iov_len: data.len() - done };
        // SAFETY: one valid iovec over the remaining data.
        let n = unsafe { libc::pwritev2(fd.as_raw_fd(), &iov, 1, (offset + done as u64) as i64, flags) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            if done > 0 {
                break;
            }
            return Err(last_err());
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

/// Asks the kernel to start writing back a range (no waiting, no durability by itself);
/// a hint, so failures are ignored: the fsync that follows reports errors.
pub fn start_writeback(fd: &OwnedFd, offset: u64, len: u64) {
    // SAFETY: plain syscall on an owned fd.
    unsafe { libc::sync_file_range(fd.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Where a range of a file lies on the disk: its extents as `(logical, physical, length)`
/// in bytes, in file order.
pub type Layout = Vec<(u64, u64, u64)>;

/// The layout of `len` bytes at `offset` when every byte of it lies in blocks already
/// allocated and written (`FS_IOC_FIEMAP`, without syncing first): writing there again
/// changes no allocation, so nothing but the file's own data and inode is to write.
/// `None` where any of it is a hole, still to be allocated (delayed allocation), allocated
/// but unwritten (a write converts it), shared (a write copies it), or where the file
/// system does not say.
pub fn written_layout(fd: &OwnedFd, offset: u64, len: u64) -> Option<Layout> {
    /// Extents asked for at most: a range in more pieces is taken as not plain.
    const MAX_EXTENTS: usize = 16;
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; MAX_EXTENTS],
    }
    // _IOWR('f', 11, struct fiemap), whose size without the extents is 32 bytes.
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const LAST: u32 = 0x1;
    const MERGED: u32 = 0x1000;
    let end = offset.checked_add(len)?;
    if len == 0 {
        return None;
    }
    let mut map = Fiemap {
        start: offset,
        length: len,
        flags: 0,
        mapped_extents: 0,
        extent_count: MAX_EXTENTS as u32,
        reserved: 0,
        extents: [Extent::default(); MAX_EXTENTS],
    };
    // SAFETY: `map` is a fiemap header followed by room for `extent_count` extents.
    if unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FIEMAP, &mut map as *mut Fiemap) } < 0 {
        return None;
    }
    let mapped = (map.mapped_extents as usize).min(MAX_EXTENTS);
    let mut covered = offset;
    let mut layout = Layout::with_capacity(mapped);
    for e in &map.extents[..mapped] {
        // Any flag but these marks data that is not plainly where it will stay.
        if e.flags & !(LAST | MERGED) != 0 || e.logical > covered {
            return None;
        }
        covered = covered.max(e.logical.checked_add(e.length)?);
        layout.push((e.logical, e.physical, e.length));
        if covered >= end {
            return Some(layout);
        }
    }
    None
}

/// Writes the file's dirty pages and waits for them, without flushing the disk's cache;
/// reports any writeback error this descriptor has not seen yet (`sync_file_range` waits
/// through `file_fdatawait_range`, which checks the descriptor's error sequence).
pub fn write_and_wait(fd: &OwnedFd) -> VfsResult<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, flags) }).map(|_| ())
}

/// Removes a name (`flags`: 0 or `AT_REMOVEDIR`). A name something is mounted on answers
/// ACCES, as knfsd's `nfsd_unlink` answers an NFSv3 client: `EBUSY` would become IO,
/// which reads as a failing disk.
pub fn unlink(dir: &OwnedFd, name: &CStr, flags: libc::c_int) -> VfsResult<()> {
    // SAFETY: valid C string and fd.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } < 0 {
        return Err(if errno() == libc::EBUSY { VfsError::Access } else { last_err() });
    }
    Ok(())
}

/// Renames `from` in `from_dir` to `to` in `to_dir`. A name something is mounted on, on
/// either side, answers ACCES, as [`unlink`] does.
pub fn rename(from_dir: &OwnedFd, from: &CStr, to_dir: &OwnedFd, to: &CStr) -> VfsResult<()> {
    // SAFETY: valid C strings and fds.
    if unsafe { libc::renameat(from_dir.as_raw_fd(), from.as_ptr(), to_dir.as_raw_fd(), to.as_ptr()) } < 0 {
        return Err(if errno() == libc::EBUSY { VfsError::Access } else { last_err() });
    }
    Ok(())
}

pub fn fsync(fd: &OwnedFd) -> VfsResult<()> {
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::fsync(fd.as_raw_fd()) }).map(|_| ())
}

pub fn fdatasync(fd: &OwnedFd) -> VfsResult<()> {
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::fdatasync(fd.as_raw_fd()) }).map(|_| ())
}

/// Everything written to the file system holding `fd`: data, inodes, and the allocation
/// bitmaps and group descriptors that a file's own `fsync` leaves behind where there is no
/// journal.
pub fn syncfs(fd: &OwnedFd) -> VfsResult<()> {
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(|_| ())
}

/// Whether a directory's `fsync` is enough to make a change of its entries durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataLog {
    /// A journal (or a log, or copy-on-write) commits the whole change, allocation
    /// included, with the directory's `fsync`.
    Journal,
    /// No journal: `fsync` writes the directory and inode but not the bitmaps and group
    /// descriptors, and after a crash `fsck` may take a new inode for a free one and drop
    /// its entry. `syncfs`, or an `fsync` of the block device, covers the change.
    NoJournal,
    /// Could not tell (treated like `NoJournal`, the safe side, with a warning).
    Unknown,
}

const EXT_SUPER_MAGIC: i64 = 0xEF53;
const MSDOS_SUPER_MAGIC: i64 = 0x4d44;
const EXFAT_SUPER_MAGIC: i64 = 0x2011_BAB0;

/// How the file system holding `fd` (on device `dev`) keeps its metadata consistent.
pub fn metadata_log(fd: RawFd, dev: u64) -> MetadataLog {
    // SAFETY: fstatfs fills the zeroed struct.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut sfs) } < 0 {
        return MetadataLog::Unknown;
    }
    match sfs.f_type as i64 {
        MSDOS_SUPER_MAGIC | EXFAT_SUPER_MAGIC => MetadataLog::NoJournal,
        // ext2, ext3 and ext4 share the magic; ext4 also mounts without a journal.
        EXT_SUPER_MAGIC => match block_device_name(dev) {
            Some(name) => ext_journal(&name, std::path::Path::new("/proc/fs")),
            None => MetadataLog::Unknown,
        },
        _ => MetadataLog::Journal,
    }
}

const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58F6;
const F2FS_SUPER_MAGIC: i64 = 0xF2F5_2010;
const ZFS_SUPER_MAGIC: i64 = 0x2FC1_2FC1;
const BCACHEFS_SUPER_MAGIC: i64 = 0xCA45_1A4E;

/// Whether the file system holding `fd` keeps every inode's attributes in memory itself,
/// so that `statx` with `AT_STATX_DONT_SYNC` answers exactly what it does without: local
/// disk and memory file systems. Network and FUSE file systems may instead answer from
/// a cache the server has since changed; an unknown type is taken for one of those.
pub fn attributes_are_local(fd: RawFd) -> bool {
    // SAFETY: fstatfs fills the zeroed struct.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut sfs) } < 0 {
        return false;
    }
    matches!(
        sfs.f_type as i64,
        EXT_SUPER_MAGIC
            | XFS_SUPER_MAGIC
            | BTRFS_SUPER_MAGIC
            | TMPFS_MAGIC
            | RAMFS_MAGIC
            | F2FS_SUPER_MAGIC
            | ZFS_SUPER_MAGIC
            | BCACHEFS_SUPER_MAGIC
            | MSDOS_SUPER_MAGIC
            | EXFAT_SUPER_MAGIC
    )
}

/// Whether an `fsync` of a new object also makes its name durable: true of ext4 with a
/// journal and of XFS, whose logs commit in order, and which log the new entry and the
/// new inode in one transaction, so that the inode's commit carries the entry's.
pub fn inode_sync_covers_new_entry(fd: RawFd, log: MetadataLog) -> bool {
    // SAFETY: fstatfs fills the zeroed struct.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut sfs) } < 0 {
        return false;
    }
    match sfs.f_type as i64 {
        EXT_SUPER_MAGIC => log == MetadataLog::Journal,
        XFS_SUPER_MAGIC => true,
        _ => false,
    }
}

/// The kernel's name of block device `dev`, from sysfs.
fn block_device_name(dev: u64) -> Option<String> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent")).ok()?;
    devname_from_uevent(&uevent).map(str::to_string)
}

/// Opens block device `dev` read-only, for `fsync`: that writes back the device's buffer
/// cache, which holds ext2/3/4's metadata (directory blocks, inode tables, bitmaps, group
/// descriptors) but not file data, and flushes the disk's cache.
pub fn open_block_device(dev: u64) -> std::io::Result<(OwnedFd, String)> {
    use std::io::{Error, ErrorKind};
    let name = block_device_name(dev).ok_or_else(|| Error::new(ErrorKind::NotFound, "no name in sysfs"))?;
    let path = format!("/dev/{name}");
    let c = CString::new(path.as_str()).map_err(|_| Error::new(ErrorKind::InvalidInput, "NUL in device name"))?;
    let fd = openat(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_NONBLOCK, 0).map_err(|e| Error::other(format!("{path}: {e}")))?;
    let st = fstat(fd.as_raw_fd()).map_err(|e| Error::other(format!("{path}: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFBLK || st.st_rdev != dev {
        return Err(Error::other(format!("{path} is not the file system's block device")));
    }
    Ok((fd, path))
}

/// The kernel's name of a block device (`vda`, `dm-0`) from its sysfs `uevent` file.
fn devname_from_uevent(uevent: &str) -> Option<&str> {
    uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map(str::trim).filter(|n| !n.is_empty())
}

/// jbd2 lists every journal it runs as `<device>-<journal inode>` under `/proc/fs/jbd2`,
/// which does not exist while no journal is loaded.
fn ext_journal(devname: &str, proc_fs: &std::path::Path) -> MetadataLog {
    if !proc_fs.is_dir() {
        return MetadataLog::Unknown;
    }
    let prefix = format!("{devname}-");
    let journaled = std::fs::read_dir(proc_fs.join("jbd2"))
        .map(|dir| dir.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))))
        .unwrap_or(false);
    if journaled {
        MetadataLog::Journal
    } else {
        MetadataLog::NoJournal
    }
}

/// Sets a file's size. A size beyond what `off_t` holds is taken as its largest value, as
/// knfsd does, so the file system answers EFBIG (FBIG) rather than a negative size EINVAL.
pub fn ftruncate(fd: &OwnedFd, size: u64) -> VfsResult<()> {
    let size = size.min(i64::MAX as u64) as i64;
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) }).map(|_| ())
}

pub fn lseek_set(fd: &OwnedFd, pos: u64) -> VfsResult<()> {
    if pos > i64::MAX as u64 {
        return Err(VfsError::Inval);
    }
    // SAFETY: plain syscall on an owned fd.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), pos as i64, libc::SEEK_SET) };
    if r < 0 {
        Err(last_err())
    } else {
        Ok(())
    }
}

/// One batch of raw `linux_dirent64` records; returns bytes filled (0 at the end).
pub fn getdents(fd: &OwnedFd, buf: &mut [u8]) -> VfsResult<usize> {
    // SAFETY: the kernel writes at most buf.len() bytes.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    if n < 0 {
        Err(last_err())
    } else {
        Ok(n as usize)
    }
}

pub struct RawDirent<'a> {
    pub ino: u64,
    pub off: u64,
    pub name: &'a [u8],
    /// The name with the terminating NUL the kernel wrote, for system calls on it.
    pub c_name: Option<&'a CStr>,
    /// Bytes the record takes in the buffer.
    pub reclen: usize,
}

/// Iterates the records of a getdents64 buffer.
pub fn parse_dirents(buf: &[u8]) -> impl Iterator<Item = RawDirent<'_>> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos + 19 > buf.len() {
            return None;
        }
        let ino = u64::from_ne_bytes(buf[pos..pos + 8].try_into().ok()?);
        let off = u64::from_ne_bytes(buf[pos + 8..pos + 16].try_into().ok()?);
        let reclen = u16::from_ne_bytes(buf[pos + 16..pos + 18].try_into().ok()?) as usize;
        if reclen < 19 || pos + reclen > buf.len() {
            return None;
        }
        let raw_name = &buf[pos + 19..pos + reclen];
        let name_len = raw_name.iter().position(|&b| b == 0).unwrap_or(raw_name.len());
        let c_name = raw_name.get(..=name_len).and_then(|n| CStr::from_bytes_with_nul(n).ok());
        let entry = RawDirent { ino, off, name: &raw_name[..name_len], c_name, reclen };
        pos += reclen;
        Some(entry)
    })
}

pub fn statvfs(fd: RawFd) -> VfsResult<libc::statvfs> {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out pointer.
    check(unsafe { libc::fstatvfs(fd, &mut s) })?;
    Ok(s)
}

pub fn utimens_fd(fd: RawFd, times: &[libc::timespec; 2]) -> VfsResult<()> {
    let empty = CString::default();
    // SAFETY: valid pointers; AT_EMPTY_PATH acts on fd itself (works for O_PATH fds).
    let r = unsafe { libc::utimensat(fd, empty.as_ptr(), times.as_ptr(), libc::AT_EMPTY_PATH) };
    if r == 0 {
        return Ok(());
    }
    if !matches!(errno(), libc::EINVAL | libc::ENOENT | libc::ENOTDIR) {
        return Err(last_err());
    }
    let path = proc_fd_path(fd);
    // SAFETY: as above, through the descriptor's /proc link.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }).map(|_| ())
}

pub fn chmod_fd(fd: RawFd, mode: u32) -> VfsResult<()> {
    let path = proc_fd_path(fd);
    // SAFETY: valid C string.
    check(unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) }).map(|_| ())
}

pub fn chown_fd(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> VfsResult<()> {
    let empty = CString::default();
    let u = uid.unwrap_or(u32::MAX);
    let g = gid.unwrap_or(u32::MAX);
    // SAFETY: valid pointers; -1 leaves an id unchanged.
    check(unsafe { libc::fchownat(fd, empty.as_ptr(), u, g, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW) }).map(|_| ())
}

pub fn readlinkat(fd: RawFd) -> VfsResult<Vec<u8>> {
    let empty = CString::default();
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf bounds the write; empty path reads the O_PATH symlink itself.
    let n = unsafe { libc::readlinkat(fd, empty.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(last_err());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The link and name limits of the file system holding directory `dir`, as POSIX reports
/// them (`fpathconf`, `fstatvfs`): 65,000 links on ext4, 65,535 on btrfs, 2^31 - 1 on XFS,
/// and POSIX's 127 where the C library does not know the file system (tmpfs). Where a
/// limit cannot be read: none for links, 255 bytes for names.
pub fn link_and_name_max(dir: RawFd) -> (u32, u32) {
    // SAFETY: plain syscall on a live descriptor.
    let links = unsafe { libc::fpathconf(dir, libc::_PC_LINK_MAX) };
    let link_max = if links < 0 { u32::MAX } else { u32::try_from(links).unwrap_or(u32::MAX) };
    let name_max = statvfs(dir).ok().and_then(|s| u32::try_from(s.f_namemax).ok()).filter(|&n| n > 0).unwrap_or(255);
    (link_max, name_max)
}

/// The largest size a file in directory `dir` may have, found by growing an unnamed
/// temporary file (sparse; nothing is written). `i64::MAX` when that cannot be tried (a
/// read-only file system, no `O_TMPFILE`).
pub fn max_file_size(dir: RawFd) -> u64 {
    let Ok(file) = openat(dir, &CString::from(c"."), libc::O_TMPFILE | libc::O_RDWR, 0o600) else { return i64::MAX as u64 };
    // SAFETY: plain syscall on an owned fd.
    let fits = |size: u64| unsafe { libc::ftruncate(file.as_raw_fd(), size as i64) } == 0;
    let (mut lo, mut hi) = (0u64, i64::MAX as u64);
    if fits(hi) {
        return hi;
    }
    // Invariant: `lo` fits, `hi` does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Whether `len` bytes at `offset` of the file can be sent from the page cache without
/// waiting for the disk: all of its pages are cached (`cachestat`, Linux 6.5), and its
/// first and last ones are up to date with no readahead to start. `cachestat` counts
/// pages whose read is still in flight, such as the readahead a previous `sendfile` of a
/// sequential reader started, and a `sendfile` of those would wait for the disk on a
/// server thread; a one-byte `RWF_NOWAIT` read of each end tells (the window in flight
/// is at the range's end for a sequential reader). `None` when the kernel cannot tell.
pub fn ready_in_page_cache(fd: &OwnedFd, offset: u64, len: usize) -> Option<bool> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    if len == 0 {
        return Some(true);
    }
    let page = page_size();
    let first = offset / page;
    let last = (offset + len as u64 - 1) / page;
    let range = Range { off: first * page, len: (last - first + 1) * page };
    let mut stat = Stat::default();
    // SAFETY: the kernel reads `range` and writes `stat`, both valid for the call.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, fd.as_raw_fd(), &range as *const Range, &mut stat as *mut Stat, 0) };
    if r != 0 {
        return None;
    }
    if stat.nr_cache < last - first + 1 {
        return Some(false);
    }
    let end = offset + len as u64 - 1;
    let ends = if first == last { &[offset][..] } else { &[offset, end][..] };
    let mut byte = 0u8;
    for &at in ends {
        let iov = libc::iovec { iov_base: (&mut byte as *mut u8).cast(), iov_len: 1 };
        // SAFETY: one valid iovec of one byte, owned here.
        let n = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, at as libc::off_t, libc::RWF_NOWAIT) };
        match n {
            1 => {}
            // A file system that cannot read without waiting: `cachestat` alone tells.
            _ if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) => return Some(true),
            // EAGAIN: not ready. An error, or the end of the file: the copy path reports it.
            _ => return Some(false),
        }
    }
    Some(true)
}

/// The kernel's page size, which `cachestat` counts in.
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|&p| p > 0).unwrap_or(4096))
}

/// The wall clock as of its last tick: at most a few milliseconds behind, and cheaper to
/// read than the precise clock (which a virtual machine may only offer through a system
/// call). For checks that stay correct with a clock that lags.
pub fn coarse_now() -> std::time::SystemTime {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec; CLOCK_REALTIME_COARSE exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    std::time::UNIX_EPOCH + std::time::Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Whether the file system holding `fd` is ext2/3/4, which answers FIEMAP.
    pub(crate) fn maps_extents(fd: &OwnedFd) -> bool {
        // SAFETY: fstatfs fills the zeroed struct.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) }) == 0 && sfs.f_type as i64 == EXT_SUPER_MAGIC
    }

    #[test]
    fn only_blocks_allocated_and_written_have_a_written_layout() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(dir.path().join("f")).expect("create");
        file.write_all_at(&[1u8; 64 * 1024], 0).expect("write");
        file.sync_all().expect("sync: the blocks are allocated");
        let fd = OwnedFd::from(file.try_clone().expect("clone"));
        let Some(layout) = written_layout(&fd, 4096, 8192) else {
            // ext4 maps them: there, no layout is a failure, not a reason to skip.
            assert!(!maps_extents(&fd), "ext4 gave no layout for blocks allocated and written");
            eprintln!("skipped: this file system does not map a file's extents (FIEMAP)");
            return;
        };
        let (logical, _, length) = layout[0];
        assert!(logical <= 4096 && logical + length >= 4096 + 8192, "{layout:?}");
        assert_eq!(written_layout(&fd, 0, 64 * 1024), written_layout(&fd, 0, 64 * 1024), "the same layout read twice");
        // Past the end, a hole, delayed allocation, an allocated but unwritten range: not plain.
        assert_eq!(written_layout(&fd, 60 * 1024, 8192), None, "past the end of the file");
        file.set_len(1 << 20).expect("grow");
        assert_eq!(written_layout(&fd, 512 * 1024, 4096), None, "a hole");
        file.write_all_at(&[2u8; 4096], 256 * 1024).expect("write into the hole");
        assert_eq!(written_layout(&fd, 256 * 1024, 4096), None, "written, not yet allocated");
        // SAFETY: plain syscall on an owned fd.
        let preallocated = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 768 * 1024, 64 * 1024) } == 0;
        if preallocated {
            assert_eq!(written_layout(&fd, 768 * 1024, 4096), None, "allocated, never written");
        }
        assert_eq!(written_layout(&fd, 0, 0), None, "nothing");
    }

    #[test]
    fn a_range_is_ready_in_the_page_cache_only_if_all_of_it_is_cached_and_within_the_file() {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![1u8; 256 * 1024]).unwrap();
        file.sync_all().unwrap();
        let fd = OwnedFd::from(file.try_clone().unwrap());
        // Read through until it is all cached, up to three times: a host's idle-memory
        // reclaim (DAMON `pageout`) can take fresh pages by its own timing in between.
        let mut ready = None;
        for _ in 0..3 {
            let mut back = vec![0u8; 256 * 1024];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
            ready = ready_in_page_cache(&fd, 0, 256 * 1024);
            if ready != Some(false) {
                break;
            }
        }
        let Some(ready) = ready else {
            eprintln!("skipped: this kernel has no cachestat (Linux 6.5)");
            return;
        };
        assert!(ready, "the whole file read through three times is not all cached");
        assert_eq!(ready_in_page_cache(&fd, 4095, 2), Some(true), "two pages, both cached");
        // Past the end of the file: not there to send.
        assert_eq!(ready_in_page_cache(&fd, 200 * 1024, 100 * 1024), Some(false));
        // SAFETY: fstatfs fills the zeroed struct.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) }, 0);
        if sfs.f_type as i64 == TMPFS_MAGIC {
            eprintln!("skipped in part: the temporary directory is on tmpfs, whose pages cannot be dropped");
            return;
        }
        // Written back and dropped from the page cache: it would wait for the disk.
        // SAFETY: plain syscall on a valid descriptor.
        assert_eq!(unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        assert_eq!(ready_in_page_cache(&fd, 0, 256 * 1024), Some(false));
    }

    #[test]
    fn devname_is_read_from_uevent() {
        let uevent = "MAJOR=253\nMINOR=0\nDEVNAME=dm-0\nDEVTYPE=disk\n";
        assert_eq!(devname_from_uevent(uevent), Some("dm-0"));
        assert_eq!(devname_from_uevent("MAJOR=8\nDEVNAME=\n"), None);
        assert_eq!(devname_from_uevent(""), None);
    }

    #[test]
    fn ext_journal_is_found_by_device_name_only() {
        let proc_fs = tempfile::tempdir().unwrap();
        // /proc/fs without jbd2: no journal is running anywhere.
        assert_eq!(ext_journal("vda", proc_fs.path()), MetadataLog::NoJournal);
        std::fs::create_dir_all(proc_fs.path().join("jbd2/vda1-8")).unwrap();
        std::fs::create_dir_all(proc_fs.path().join("jbd2/dm-10-8")).unwrap();
        assert_eq!(ext_journal("vda1", proc_fs.path()), MetadataLog::Journal);
        assert_eq!(ext_journal("dm-10", proc_fs.path()), MetadataLog::Journal);
        // A name that is only a prefix of a journaled device's is not that device.
        assert_eq!(ext_journal("vda", proc_fs.path()), MetadataLog::NoJournal);
        assert_eq!(ext_journal("dm-1", proc_fs.path()), MetadataLog::NoJournal);
        assert_eq!(ext_journal("vda", &proc_fs.path().join("missing")), MetadataLog::Unknown);
    }
}
