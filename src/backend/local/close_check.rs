//! Writeback errors of files leaving the object cache.
//!
//! The kernel reports a writeback error to each descriptor that was open when it
//! happened. A file written UNSTABLE and then let go of by the cache (idle, or evicted)
//! may still have dirty pages; if their writeback fails after the descriptor is closed,
//! and the inode then leaves memory, the error is gone, and a later COMMIT through a new
//! descriptor would succeed with the old write verifier: the client would never resend
//! data the disk refused. So, as knfsd's file cache does, a read-write descriptor is
//! checked before it is closed: its dirty pages are written and waited for, and an error
//! renews the export's write verifier. The check runs on a thread of its own, since the
//! object may be dropped on a thread that must not wait for the disk.

use super::{sys, LocalFs};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};

type Job = (Arc<OwnedFd>, Weak<LocalFs>);

/// Checks `fd`, which `owner` wrote through, and closes it (once no request uses it).
pub fn check_and_close(fd: Arc<OwnedFd>, owner: Weak<LocalFs>) {
    static CHECKER: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    let checker = CHECKER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let spawned = std::thread::Builder::new().name("nasd-close-check".into()).spawn(move || {
            for (fd, owner) in rx {
                check(&fd, &owner);
            }
        });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the close checker: files are checked where they are closed");
                None
            }
        }
    });
    let job = (fd, owner);
    let unsent = match checker {
        Some(tx) => tx.lock().unwrap_or_else(|p| p.into_inner()).send(job).err().map(|e| e.0),
        None => Some(job),
    };
    if let Some((fd, owner)) = unsent {
        check(&fd, &owner);
    }
}

fn check(fd: &OwnedFd, owner: &Weak<LocalFs>) {
    // A removed file's data can never be committed: nothing to vouch for.
    if sys::fstat(std::os::fd::AsRawFd::as_raw_fd(fd)).map_or(true, |st| st.st_nlink == 0) {
        return;
    }
    if let Err(e) = sys::write_and_wait(fd) {
        if let Some(fs) = owner.upgrade() {
            tracing::warn!(error = %e, "a file leaving the cache had a writeback error");
            fs.renew_write_verifier();
        }
    }
}
