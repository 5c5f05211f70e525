//! NFSv3 wire types (RFC 1813 section 2.5–3): argument decoding and result encoding.
//!
//! Arguments decode into [`Args`] before anything runs, so every decoder is exercised by
//! the fuzz target without touching storage.

use crate::vfs::{Attr, CreateHow, FileKind, PreOpAttr, SetAttrs, SetTime, SpecialNode, Stability, Timespec, VfsError, Wcc};
use crate::xdr::{XdrError, XdrReader, XdrResult, XdrWriter};

pub const PROGRAM: u32 = 100003;
pub const VERSION: u32 = 3;
/// Largest handle a client may send (RFC 1813 NFS3_FHSIZE).
pub const FHSIZE: usize = 64;
/// Names longer than this are NAMETOOLONG; the decoder accepts up to NAME_DECODE_MAX so it
/// can say so instead of GARBAGE_ARGS.
pub const NAME_MAX: usize = 255;
const NAME_DECODE_MAX: usize = 4096;
/// A SYMLINK target longer than the kernel takes (4,095 bytes) is NAMETOOLONG, as knfsd
/// answers; the decoder accepts one this long (a slice of the call, nothing allocated)
/// so that it can say so instead of GARBAGE_ARGS.
const PATH_DECODE_MAX: usize = 64 * 1024;
/// Largest READ and WRITE payload (advertised in FSINFO).
pub const MAX_IO: u32 = 1024 * 1024;

pub mod proc {
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;

    pub const NAMES: [&str; 22] = [
        "NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE", "CREATE", "MKDIR", "SYMLINK", "MKNOD", "REMOVE",
        "RMDIR", "RENAME", "LINK", "READDIR", "READDIRPLUS", "FSSTAT", "FSINFO", "PATHCONF", "COMMIT",
    ];
}

/// nfsstat3
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    NxIo = 6,
    Access = 13,
    Exist = 17,
    XDev = 18,
    NoDev = 19,
    NotDir = 20,
    IsDir = 21,
    Inval = 22,
    FBig = 27,
    NoSpc = 28,
    RoFs = 30,
    MLink = 31,
    NameTooLong = 63,
    NotEmpty = 66,
    DQuot = 69,
    Stale = 70,
    BadHandle = 10001,
    NotSync = 10002,
    BadCookie = 10003,
    NotSupp = 10004,
    TooSmall = 10005,
    ServerFault = 10006,
    BadType = 10007,
    Jukebox = 10008,
}

impl From<VfsError> for Status {
    fn from(e: VfsError) -> Self {
        match e {
            VfsError::Perm => Status::Perm,
            VfsError::NoEnt => Status::NoEnt,
            VfsError::Io => Status::Io,
            VfsError::NxIo => Status::NxIo,
            VfsError::Access => Status::Access,
            VfsError::Exist => Status::Exist,
            VfsError::XDev => Status::XDev,
            VfsError::NotDir => Status::NotDir,
            VfsError::IsDir => Status::IsDir,
            VfsError::Inval => Status::Inval,
            VfsError::FBig => Status::FBig,
            VfsError::NoSpc => Status::NoSpc,
            VfsError::RoFs => Status::RoFs,
            VfsError::MLink => Status::MLink,
            VfsError::NameTooLong => Status::NameTooLong,
            VfsError::NotEmpty => Status::NotEmpty,
            VfsError::DQuot => Status::DQuot,
            VfsError::Stale => Status::Stale,
            VfsError::BadHandle => Status::BadHandle,
            VfsError::BadCookie => Status::BadCookie,
            VfsError::NotSync => Status::NotSync,
            VfsError::NotSupp => Status::NotSupp,
            VfsError::BadType => Status::BadType,
            VfsError::ServerFault => Status::ServerFault,
            VfsError::Jukebox | VfsError::WouldBlock => Status::Jukebox,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirOp<'a> {
    pub dir: &'a [u8],
    pub name: &'a [u8],
}

/// Decoded arguments of one NFSv3 call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[rustfmt::skip] // one line per variant reads as a table
pub enum Args<'a> {
    Null,
    Getattr { fh: &'a [u8] },
    Setattr { fh: &'a [u8], attrs: SetAttrs, guard: Option<Timespec> },
    Lookup(DirOp<'a>),
    Access { fh: &'a [u8], mask: u32 },
    Readlink { fh: &'a [u8] },
    Read { fh: &'a [u8], offset: u64, count: u32 },
    Write { fh: &'a [u8], offset: u64, stable: Stability, data: &'a [u8] },
    Create { at: DirOp<'a>, how: CreateHow },
    Mkdir { at: DirOp<'a>, attrs: SetAttrs },
    Symlink { at: DirOp<'a>, attrs: SetAttrs, target: &'a [u8] },
    /// `node` is `Err(ftype)` for types MKNOD cannot make (BADTYPE).
    Mknod { at: DirOp<'a>, node: Result<SpecialNode, u32>, attrs: SetAttrs },
    Remove(DirOp<'a>),
    Rmdir(DirOp<'a>),
    Rename { from: DirOp<'a>, to: DirOp<'a> },
    Link { fh: &'a [u8], to: DirOp<'a> },
    Readdir { fh: &'a [u8], cookie: u64, verifier: [u8; 8], count: u32 },
    Readdirplus { fh: &'a [u8], cookie: u64, verifier: [u8; 8], dircount: u32, maxcount: u32 },
    Fsstat { fh: &'a [u8] },
    Fsinfo { fh: &'a [u8] },
    Pathconf { fh: &'a [u8] },
    Commit { fh: &'a [u8], offset: u64, count: u32 },
}

fn fh<'a>(r: &mut XdrReader<'a>) -> XdrResult<&'a [u8]> {
    r.opaque(FHSIZE)
}

fn dirop<'a>(r: &mut XdrReader<'a>) -> XdrResult<DirOp<'a>> {
    Ok(DirOp { dir: fh(r)?, name: r.opaque(NAME_DECODE_MAX)? })
}

fn nfstime(r: &mut XdrReader<'_>) -> XdrResult<Timespec> {
    Ok(Timespec { sec: r.u32()? as i64, nsec: r.u32()? })
}

fn set_time(r: &mut XdrReader<'_>) -> XdrResult<SetTime> {
    Ok(match r.u32()? {
        0 => SetTime::Unchanged,
        1 => SetTime::ServerNow,
        2 => SetTime::Client(nfstime(r)?),
        v => return Err(XdrError::BadValue { what: "time_how", value: v }),
    })
}

fn opt_u32(r: &mut XdrReader<'_>) -> XdrResult<Option<u32>> {
    Ok(if r.bool()? { Some(r.u32()?) } else { None })
}

pub fn sattr(r: &mut XdrReader<'_>) -> XdrResult<SetAttrs> {
    let mode = opt_u32(r)?;
    let uid = opt_u32(r)?;
    let gid = opt_u32(r)?;
    let size = if r.bool()? { Some(r.u64()?) } else { None };
    let atime = set_time(r)?;
    let mtime = set_time(r)?;
    Ok(SetAttrs { mode, uid, gid, size, atime, mtime })
}

fn stable_how(v: u32) -> XdrResult<Stability> {
    Ok(match v {
        0 => Stability::Unstable,
        1 => Stability::DataSync,
        2 => Stability::FileSync,
        v => return Err(XdrError::BadValue { what: "stable_how", value: v }),
    })
}

impl<'a> Args<'a> {
    /// Decodes the arguments of `procedure`; `None` for an unknown procedure.
    pub fn decode(procedure: u32, r: &mut XdrReader<'a>) -> Option<XdrResult<Args<'a>>> {
        use proc::*;
        let res = (|| -> XdrResult<Args<'a>> {
            Ok(match procedure {
                NULL => Args::Null,
                GETATTR => Args::Getattr { fh: fh(r)? },
                SETATTR => {
                    let fh = fh(r)?;
                    let attrs = sattr(r)?;
                    let guard = if r.bool()? { Some(nfstime(r)?) } else { None };
                    Args::Setattr { fh, attrs, guard }
                }
                LOOKUP => Args::Lookup(dirop(r)?),
                ACCESS => Args::Access { fh: fh(r)?, mask: r.u32()? },
                READLINK => Args::Readlink { fh: fh(r)? },
                READ => Args::Read { fh: fh(r)?, offset: r.u64()?, count: r.u32()? },
                WRITE => {
                    let fh = fh(r)?;
                    let offset = r.u64()?;
                    let count = r.u32()?;
                    let stable = stable_how(r.u32()?)?;
                    let data = r.opaque(MAX_IO as usize)?;
                    // A count that differs from the data sent is a broken or hostile client;
                    // writing either length could store what the client did not mean.
                    if count as usize != data.len() {
                        return Err(XdrError::BadValue { what: "write count", value: count });
                    }
                    Args::Write { fh, offset, stable, data }
                }
                CREATE => {
                    let at = dirop(r)?;
                    let how = match r.u32()? {
                        0 => CreateHow::Unchecked(sattr(r)?),
                        1 => CreateHow::Guarded(sattr(r)?),
                        2 => CreateHow::Exclusive(r.fixed_array::<8>()?),
                        v => return Err(XdrError::BadValue { what: "createmode3", value: v }),
                    };
                    Args::Create { at, how }
                }
                MKDIR => Args::Mkdir { at: dirop(r)?, attrs: sattr(r)? },
                SYMLINK => Args::Symlink { at: dirop(r)?, attrs: sattr(r)?, target: r.opaque(PATH_DECODE_MAX)? },
                MKNOD => {
                    let at = dirop(r)?;
                    let ftype = r.u32()?;
                    let (node, attrs) = match ftype {
                        3 | 4 => {
                            let attrs = sattr(r)?;
                            let (ma, mi) = (r.u32()?, r.u32()?);
                            let node = if ftype == 3 { SpecialNode::BlockDevice(ma, mi) } else { SpecialNode::CharDevice(ma, mi) };
                            (Ok(node), attrs)
                        }
                        6 => (Ok(SpecialNode::Socket), sattr(r)?),
                        7 => (Ok(SpecialNode::Fifo), sattr(r)?),
                        1 | 2 | 5 => (Err(ftype), SetAttrs::default()),
                        v => return Err(XdrError::BadValue { what: "ftype3", value: v }),
                    };
                    Args::Mknod { at, node, attrs }
                }
                REMOVE => Args::Remove(dirop(r)?),
                RMDIR => Args::Rmdir(dirop(r)?),
                RENAME => Args::Rename { from: dirop(r)?, to: dirop(r)? },
                LINK => Args::Link { fh: fh(r)?, to: dirop(r)? },
                READDIR => Args::Readdir { fh: fh(r)?, cookie: r.u64()?, verifier: r.fixed_array::<8>()?, count: r.u32()? },
                READDIRPLUS => Args::Readdirplus {
                    fh: fh(r)?,
                    cookie: r.u64()?,
                    verifier: r.fixed_array::<8>()?,
                    dircount: r.u32()?,
                    maxcount: r.u32()?,
                },
                FSSTAT => Args::Fsstat { fh: fh(r)? },
                FSINFO => Args::Fsinfo { fh: fh(r)? },
                PATHCONF => Args::Pathconf { fh: fh(r)? },
                COMMIT => Args::Commit { fh: fh(r)?, offset: r.u64()?, count: r.u32()? },
                _ => return Err(XdrError::BadValue { what: "procedure", value: procedure }),
            })
        })();
        if procedure > proc::COMMIT {
            return None;
        }
        Some(res)
    }
}

/// The stability a WRITE asks for, read without decoding the payload.
pub fn write_stability(args: &[u8]) -> Option<Stability> {
    let mut r = XdrReader::new(args);
    fh(&mut r).ok()?;
    r.u64().ok()?;
    r.u32().ok()?;
    stable_how(r.u32().ok()?).ok()
}

fn ftype(kind: FileKind) -> u32 {
    match kind {
        FileKind::Regular => 1,
        FileKind::Directory => 2,
        FileKind::BlockDevice => 3,
        FileKind::CharDevice => 4,
        FileKind::Symlink => 5,
        FileKind::Socket => 6,
        FileKind::Fifo => 7,
    }
}

fn put_time(w: &mut XdrWriter, t: Timespec) {
    w.u32(t.sec.clamp(0, u32::MAX as i64) as u32);
    w.u32(t.nsec);
}

/// Encoded size of fattr3.
pub const FATTR3_SIZE: usize = 84;

pub fn put_fattr(w: &mut XdrWriter, a: &Attr) {
    w.u32(ftype(a.kind));
    w.u32(a.mode);
    w.u32(a.nlink);
    w.u32(a.uid);
    w.u32(a.gid);
    w.u64(a.size);
    w.u64(a.used);
    w.u32(a.rdev.0);
    w.u32(a.rdev.1);
    w.u64(a.fsid);
    w.u64(a.fileid);
    put_time(w, a.atime);
    put_time(w, a.mtime);
    put_time(w, a.ctime);
}

pub fn put_post_op_attr(w: &mut XdrWriter, a: Option<&Attr>) {
    match a {
        Some(a) => {
            w.bool(true);
            put_fattr(w, a);
        }
        None => w.bool(false),
    }
}

fn put_pre_op_attr(w: &mut XdrWriter, p: Option<&PreOpAttr>) {
    match p {
        Some(p) => {
            w.bool(true);
            w.u64(p.size);
            put_time(w, p.mtime);
            put_time(w, p.ctime);
        }
        None => w.bool(false),
    }
}

pub fn put_wcc(w: &mut XdrWriter, wcc: &Wcc) {
    put_pre_op_attr(w, wcc.before.as_ref());
    put_post_op_attr(w, wcc.after.as_ref());
}

pub fn put_post_op_fh(w: &mut XdrWriter, fh: Option<&[u8]>) {
    match fh {
        Some(fh) => {
            w.bool(true);
            w.opaque(fh);
        }
        None => w.bool(false),
    }
}

pub fn stable_code(s: Stability) -> u32 {
    match s {
        Stability::Unstable => 0,
        Stability::DataSync => 1,
        Stability::FileSync => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_write_and_create() {
        let mut w = XdrWriter::new();
        w.opaque(&[9; 20]);
        w.u64(4096);
        w.u32(5);
        w.u32(2);
        w.opaque(b"hello");
        let buf = w.into_inner();
        let args = Args::decode(proc::WRITE, &mut XdrReader::new(&buf)).unwrap().unwrap();
        assert_eq!(args, Args::Write { fh: &[9; 20], offset: 4096, stable: Stability::FileSync, data: b"hello" });

        let mut w = XdrWriter::new();
        w.opaque(&[1; 8]);
        w.opaque(b"name");
        w.u32(2);
        w.fixed(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let buf = w.into_inner();
        let args = Args::decode(proc::CREATE, &mut XdrReader::new(&buf)).unwrap().unwrap();
        assert_eq!(args, Args::Create { at: DirOp { dir: &[1; 8], name: b"name" }, how: CreateHow::Exclusive([1, 2, 3, 4, 5, 6, 7, 8]) });
    }

    #[test]
    fn rejects_bad_input() {
        assert!(Args::decode(22, &mut XdrReader::new(&[])).is_none());
        assert!(Args::decode(proc::GETATTR, &mut XdrReader::new(&[0, 0, 0, 65])).unwrap().is_err());
        let mut w = XdrWriter::new();
        w.opaque(&[1; 8]);
        w.u64(0);
        w.u32(1);
        w.u32(7); // bad stable_how
        w.opaque(b"x");
        assert!(Args::decode(proc::WRITE, &mut XdrReader::new(w.as_slice())).unwrap().is_err());
        for count in [0, 1, 3, u32::MAX] {
            let mut w = XdrWriter::new();
            w.opaque(&[1; 8]);
            w.u64(0);
            w.u32(count);
            w.u32(0);
            w.opaque(b"xy");
            let decoded = Args::decode(proc::WRITE, &mut XdrReader::new(w.as_slice())).unwrap();
            assert!(decoded.is_err(), "count {count} with 2 bytes of data was accepted");
        }
    }

    #[test]
    fn fattr_size_matches_constant() {
        let a = Attr {
            kind: FileKind::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 1,
            used: 4096,
            rdev: (0, 0),
            fsid: 1,
            fileid: 2,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
        };
        let mut w = XdrWriter::new();
        put_fattr(&mut w, &a);
        assert_eq!(w.len(), FATTR3_SIZE);
    }
}
