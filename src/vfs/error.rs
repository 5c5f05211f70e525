use thiserror::Error;

/// Backend-neutral failure of a storage operation. Each protocol maps these to its own
/// status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum VfsError {
    #[error("operation not permitted")]
    Perm,
    #[error("no such file or directory")]
    NoEnt,
    #[error("i/o error")]
    Io,
    #[error("no such device or address")]
    NxIo,
    #[error("permission denied")]
    Access,
    #[error("file exists")]
    Exist,
    #[error("cross-device link")]
    XDev,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("invalid argument")]
    Inval,
    #[error("file too large")]
    FBig,
    #[error("no space left on device")]
    NoSpc,
    #[error("read-only file system")]
    RoFs,
    #[error("too many links")]
    MLink,
    #[error("name too long")]
    NameTooLong,
    #[error("directory not empty")]
    NotEmpty,
    #[error("quota exceeded")]
    DQuot,
    #[error("stale file handle")]
    Stale,
    #[error("malformed file handle")]
    BadHandle,
    #[error("directory cookie is no longer valid")]
    BadCookie,
    #[error("attribute guard did not match")]
    NotSync,
    #[error("operation not supported")]
    NotSupp,
    #[error("object type not supported")]
    BadType,
    #[error("internal server fault")]
    ServerFault,
    #[error("try again later")]
    Jukebox,
    /// The call was made with [`crate::vfs::Blocking::Forbidden`] and would have to wait
    /// for the disk: nothing was done; call again where waiting is allowed.
    #[error("would block")]
    WouldBlock,
}

pub type VfsResult<T> = Result<T, VfsError>;

impl VfsError {
    pub fn from_errno(errno: i32) -> Self {
        match errno {
            libc::EPERM => VfsError::Perm,
            libc::ENOENT => VfsError::NoEnt,
            libc::ENXIO | libc::ENODEV => VfsError::NxIo,
            // ETXTBSY: writing a file a program on the server is executing; NFSv3 has no
            // code of its own for it.
            libc::EACCES | libc::ETXTBSY => VfsError::Access,
            libc::EEXIST => VfsError::Exist,
            libc::EXDEV => VfsError::XDev,
            libc::ENOTDIR | libc::ELOOP => VfsError::NotDir,
            libc::EISDIR => VfsError::IsDir,
            libc::EINVAL => VfsError::Inval,
            libc::EFBIG | libc::EOVERFLOW => VfsError::FBig,
            libc::ENOSPC => VfsError::NoSpc,
            libc::EROFS => VfsError::RoFs,
            libc::EMLINK => VfsError::MLink,
            libc::ENAMETOOLONG => VfsError::NameTooLong,
            libc::ENOTEMPTY => VfsError::NotEmpty,
            libc::EDQUOT => VfsError::DQuot,
            libc::ESTALE => VfsError::Stale,
            libc::EOPNOTSUPP => VfsError::NotSupp,
            libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE => VfsError::Jukebox,
            _ => VfsError::Io,
        }
    }
}

impl From<std::io::Error> for VfsError {
    fn from(e: std::io::Error) -> Self {
        e.raw_os_error().map(VfsError::from_errno).unwrap_or(VfsError::Io)
    }
}
