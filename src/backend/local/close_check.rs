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
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};

type Job = (Arc<OwnedFd>, Weak<LocalFs>);

/// Descriptors waiting for their check. Where the disk is so slow that more pile up, a
/// descriptor is closed unchecked and the verifier renewed instead: clients resend what
/// they have not seen committed, which is always safe, and nobody waits.
const QUEUE: usize = 1024;

/// Checks `fd`, which `owner` wrote through, and closes it (once no request uses it).
/// Never blocks: it may run where a cache lock is held.
pub fn check_and_close(fd: Arc<OwnedFd>, owner: Weak<LocalFs>) {
    static CHECKER: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
    // A removed file's data can never be committed: nothing to vouch for, and its space
    // is freed at once.
    if sys::fstat(fd.as_raw_fd()).map_or(true, |st| st.st_nlink == 0) {
        return;
    }
    let checker = CHECKER.get_or_init(|| {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let spawned = std::thread::Builder::new().name("nasd-close-check".into()).spawn(move || {
            for (fd, owner) in rx {
                check(&fd, &owner);
            }
        });
        match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the close checker: written files are closed unchecked, each with a new write verifier");
                None
            }
        }
    });
    let unsent = match checker {
        Some(tx) => match tx.try_send((fd, owner)) {
            Ok(()) => return,
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job,
        },
        None => (fd, owner),
    };
    if let Some(fs) = unsent.1.upgrade() {
        fs.renew_write_verifier();
    }
}

fn check(fd: &OwnedFd, owner: &Weak<LocalFs>) {
    if let Err(e) = sys::write_and_wait(fd) {
        if let Some(fs) = owner.upgrade() {
            // First the verifier: from here on a COMMIT through a new descriptor hears
            // nothing of this error, and must not answer with the old one.
            fs.renew_write_verifier();
            tracing::warn!(error = %e, "a file leaving the cache had a writeback error");
        }
    }
}
