//! Directory streams kept open between READDIR calls.
//!
//! A listing arrives as a run of calls, each continuing at the cookie where the previous
//! reply ended. Reopening the directory for every call is expensive on ext4: a hashed
//! directory is read in hash order, and every fresh open rebuilds the in-memory tree of a
//! stretch of entries (hashing and allocating each name) before it can continue. So the
//! stream a reply stopped in is parked here, with the entries it had already read but the
//! reply could not take, and the call that continues at that cookie picks it up.
//!
//! A parked stream is only a cache: a call that finds none reopens and seeks, with the
//! same result; a stream of a directory removed meanwhile reads as empty until evicted.
//! What the listing shows of entries created or removed meanwhile is what
//! `getdents` on an open directory shows, which is also what reopening gives.

use crate::vfs::{Cred, ObjectId};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;

/// Streams kept at most; the oldest goes first (one per listing in progress).
const CAPACITY: usize = 16;

pub struct DirStream {
    pub fd: OwnedFd,
    /// `getdents64` buffer; `buf[pos..len]` holds entries read but not yet returned.
    pub buf: Vec<u8>,
    pub pos: usize,
    pub len: usize,
}

struct Parked {
    dir: ObjectId,
    cookie: u64,
    /// The stream was opened with this caller's permissions; only it continues it.
    cred: Cred,
    stream: DirStream,
}

#[derive(Default)]
pub struct DirStreams {
    parked: Mutex<VecDeque<Parked>>,
}

impl DirStreams {
    /// The stream of `dir` whose last reply ended at `cookie`, for `cred`.
    pub fn take(&self, dir: &ObjectId, cookie: u64, cred: &Cred) -> Option<DirStream> {
        let mut parked = self.parked.lock();
        let i = parked.iter().position(|p| p.cookie == cookie && p.dir == *dir && p.cred == *cred)?;
        parked.remove(i).map(|p| p.stream)
    }

    /// Keeps a stream for the call that continues `dir` at `cookie`.
    pub fn park(&self, dir: ObjectId, cookie: u64, cred: &Cred, stream: DirStream) {
        let mut parked = self.parked.lock();
        if parked.len() >= CAPACITY {
            parked.pop_front();
        }
        parked.push_back(Parked { dir, cookie, cred: cred.clone(), stream });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.parked.lock().len()
    }

    #[cfg(test)]
    pub fn take_any(&self) -> Option<DirStream> {
        self.parked.lock().pop_front().map(|p| p.stream)
    }
}
