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
use parking_lot::{Condvar, Mutex};
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
    let Some(fs) = owner.upgrade() else {
        // The export is gone: nothing left to vouch for.
        return;
    };
    let _checking = fs.close_checks.begin();
    if let Err(e) = sys::write_and_wait(fd) {
        // First the verifier: from here on a COMMIT through a new descriptor hears
        // nothing of this error, and must not answer with the old one.
        fs.renew_write_verifier();
        tracing::warn!(error = %e, "a file leaving the cache had a writeback error");
    }
}

/// The checks of one export's files under way. A check takes a writeback error for
/// itself: once it has, a COMMIT through a new descriptor of that file syncs without
/// hearing of it, and only the new write verifier the check then makes tells the client.
/// So a COMMIT waits, before it takes the verifier for its reply, for every check begun
/// by then; a check begun after its sync cannot have taken an error that sync needed.
#[derive(Default)]
pub struct CloseChecks {
    /// Checks begun and ended.
    counts: Mutex<(u64, u64)>,
    ended: Condvar,
}

/// A check under way; ends when dropped.
pub struct Checking<'a>(&'a CloseChecks);

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        self.0.counts.lock().1 += 1;
        self.0.ended.notify_all();
    }
}

impl CloseChecks {
    pub fn begin(&self) -> Checking<'_> {
        self.counts.lock().0 += 1;
        Checking(self)
    }

    /// Returns once every check begun before this call has ended.
    pub fn wait_for_begun(&self) {
        let mut counts = self.counts.lock();
        let begun = counts.0;
        while counts.1 < begun {
            self.ended.wait(&mut counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_commit_waits_for_the_checks_begun_before_it_and_no_others() {
        let checks = Arc::new(CloseChecks::default());
        checks.wait_for_begun();
        let first = checks.begin();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let c = checks.clone();
        let waiter = std::thread::spawn(move || {
            c.wait_for_begun();
            done_tx.send(()).unwrap();
        });
        assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err(), "returned while a check begun before it ran");
        // begun after the waiter started waiting: not waited for
        let second = checks.begin();
        drop(first);
        done_rx.recv_timeout(Duration::from_secs(10)).expect("returned once the checks begun before it ended");
        waiter.join().unwrap();
        drop(second);
        checks.wait_for_begun();
    }
}
