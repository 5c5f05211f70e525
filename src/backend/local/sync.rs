//! Group commit: concurrent requests to make one file durable share one `fsync`.
//!
//! A caller whose write has completed needs a sync that *starts* after that moment. Syncs
//! of a file run one at a time and are numbered; a caller waits for the next one to start
//! (running it itself when nobody else is), so while one `fsync` is in flight every write
//! that completes meanwhile is covered by the single `fsync` that follows it. At iodepth
//! 64 this turns 64 flushes into about two.

use crate::vfs::{VfsError, VfsResult};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};

/// How much of the file must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Data and what is needed to read it back (`fdatasync`).
    Data,
    /// Data and all metadata, times included (`fsync`).
    Full,
}

#[derive(Default)]
struct State {
    /// Number of the last sync started; the next one is `started + 1`.
    started: u64,
    /// Number of the last sync finished.
    finished: u64,
    running: bool,
    /// Whether a caller waiting for the next sync needs a full one.
    next_full: bool,
    /// The last sync that failed, and how.
    failed: Option<(u64, VfsError)>,
    /// Callers waiting for a sync to finish.
    waiting: usize,
}

/// A group's position just before a change was made: the number of the last sync
/// finished then. Every sync after it may have written the change, and the kernel
/// reports a writeback error once, to whichever sync comes first; so a failure of any of
/// them is the change's failure, even if the sync that finally covers it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct SyncTicket(u64);

/// Who hears of a failed sync: every caller whose change was made before it ended
/// ([`SyncTicket`]). A change made after it is spoken for by a later sync that succeeds.
/// Unstable writes acknowledged before the failure are not: the caller of `run` renews the
/// write verifier when a sync fails, so clients resend what they had not seen committed.
/// (Sticky failures would refuse every change to a busy directory, the export root, from
/// one transient error until restart.)
#[derive(Default)]
pub struct SyncGroup {
    state: Mutex<State>,
    finished: Condvar,
    /// `State::finished`, readable without the lock: every WRITE and namespace change
    /// takes a ticket, most of them with no sync to follow.
    last_finished: AtomicU64,
}

impl SyncGroup {
    /// To be taken before a change that [`Self::sync`] is to make durable. A sync that
    /// ends while this is read is either counted (it began before the change, so its
    /// failure is the change's too: the cautious side) or was over before the change.
    pub fn ticket(&self) -> SyncTicket {
        SyncTicket(self.last_finished.load(Ordering::Acquire))
    }

    /// Returns once everything written to the file before this call is durable, or the
    /// error of a sync since `since` (which may have lost the change). `run` performs one
    /// sync of the given kind; it is called by at most one thread at a time.
    pub fn sync(&self, kind: SyncKind, since: SyncTicket, run: impl Fn(SyncKind) -> VfsResult<()>) -> VfsResult<()> {
        let mut st = self.state.lock();
        let need = st.started + 1;
        if kind == SyncKind::Full {
            st.next_full = true;
        }
        while st.finished < need {
            if st.running {
                st.waiting += 1;
                self.finished.wait(&mut st);
                st.waiting -= 1;
                continue;
            }
            st.running = true;
            st.started += 1;
            let number = st.started;
            let kind = if std::mem::take(&mut st.next_full) { SyncKind::Full } else { SyncKind::Data };
            // A panic in `run` is this sync's failure: left `running`, the group would
            // hold every later caller of this file (or file system) forever.
            let outcome =
                parking_lot::MutexGuard::unlocked(&mut st, || std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(kind))));
            let (result, panicked) = match outcome {
                Ok(result) => (result, None),
                Err(panic) => (Err(VfsError::Io), Some(panic)),
            };
            st.running = false;
            st.finished = number;
            self.last_finished.store(number, Ordering::Release);
            if let Err(e) = result {
                st.failed = Some((number, e));
            }
            self.finished.notify_all();
            if let Some(panic) = panicked {
                drop(st);
                std::panic::resume_unwind(panic);
            }
        }
        match st.failed {
            Some((failed, e)) if failed > since.0 => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    #[test]
    fn a_sync_that_panics_fails_its_callers_and_leaves_the_group_usable() {
        let group = Arc::new(SyncGroup::default());
        let since = group.ticket();
        let g = group.clone();
        let panicked = std::thread::spawn(move || g.sync(SyncKind::Full, since, |_| panic!("a sync panics"))).join();
        assert!(panicked.is_err(), "the panic reaches its caller");
        // a change made before the failed sync hears of it; a later one is synced anew
        let (tx, rx) = std::sync::mpsc::channel();
        let g = group.clone();
        std::thread::spawn(move || {
            let before = g.sync(SyncKind::Data, since, |_| Ok(()));
            let after = g.sync(SyncKind::Data, g.ticket(), |_| Ok(()));
            let _ = tx.send((before, after));
        });
        let (before, after) = rx.recv_timeout(Duration::from_secs(10)).expect("the group still syncs after a panic");
        assert_eq!(before, Err(VfsError::Io));
        assert_eq!(after, Ok(()));
    }

    #[test]
    fn a_sync_started_before_the_call_does_not_count() {
        let group = Arc::new(SyncGroup::default());
        let writes = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Barrier::new(2));
        // Thread A starts a slow sync that sees write #1 only.
        let a = {
            let (group, writes, gate) = (group.clone(), writes.clone(), gate.clone());
            std::thread::spawn(move || {
                writes.store(1, Ordering::SeqCst);
                group.sync(SyncKind::Data, group.ticket(), |_| {
                    gate.wait();
                    std::thread::sleep(Duration::from_millis(50));
                    Ok(())
                })
            })
        };
        gate.wait();
        // Write #2 completes while A's sync runs: its sync must start later and see it.
        writes.store(2, Ordering::SeqCst);
        let seen = AtomicU64::new(0);
        group
            .sync(SyncKind::Data, group.ticket(), |_| {
                seen.store(writes.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        a.join().unwrap().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn concurrent_callers_share_syncs_and_full_wins() {
        let group = Arc::new(SyncGroup::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let fulls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..32)
            .map(|i| {
                let (group, runs, fulls) = (group.clone(), runs.clone(), fulls.clone());
                std::thread::spawn(move || {
                    let kind = if i == 0 { SyncKind::Full } else { SyncKind::Data };
                    group.sync(kind, group.ticket(), |k| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        if k == SyncKind::Full {
                            fulls.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        let runs = runs.load(Ordering::SeqCst);
        assert!(runs < 32, "32 callers ran {runs} syncs: nothing was shared");
        assert!(fulls.load(Ordering::SeqCst) >= 1, "the caller that asked for a full sync never got one");
    }

    #[test]
    fn a_failure_reaches_its_callers_and_a_later_success_speaks_for_later_changes() {
        let group = SyncGroup::default();
        assert_eq!(group.sync(SyncKind::Full, group.ticket(), |_| Err(VfsError::NoSpc)), Err(VfsError::NoSpc));
        assert_eq!(group.sync(SyncKind::Full, group.ticket(), |_| Ok(())), Ok(()));
        assert_eq!(group.sync(SyncKind::Full, group.ticket(), |_| Err(VfsError::Io)), Err(VfsError::Io));
        assert_eq!(group.sync(SyncKind::Full, group.ticket(), |_| Ok(())), Ok(()));
    }

    #[test]
    fn a_caller_that_joined_during_a_failing_sync_hears_of_it_though_the_next_succeeds() {
        let group = Arc::new(SyncGroup::default());
        let (started, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        // Sync 1 fails, after the second caller's change was made (and maybe written by it).
        let first = {
            let (group, started, release) = (group.clone(), started.clone(), release.clone());
            std::thread::spawn(move || {
                group.sync(SyncKind::Data, group.ticket(), |_| {
                    started.wait();
                    release.wait();
                    Err(VfsError::Io)
                })
            })
        };
        started.wait();
        let second = {
            let group = group.clone();
            // Its change is made now, while sync 1 runs; sync 2 then finds nothing left to
            // fail on, as after the kernel reported the error.
            std::thread::spawn(move || {
                let since = group.ticket();
                group.sync(SyncKind::Data, since, |_| Ok(()))
            })
        };
        // The second caller has its number (2) once it waits for sync 1 to end.
        while group.state.lock().waiting == 0 {
            std::thread::yield_now();
        }
        release.wait();
        assert_eq!(first.join().unwrap(), Err(VfsError::Io));
        assert_eq!(second.join().unwrap(), Err(VfsError::Io), "the joined caller was told its change is durable");
        // A caller after both: its change was made after the failed sync ended.
        assert_eq!(group.sync(SyncKind::Data, group.ticket(), |_| Ok(())), Ok(()));
    }

    #[test]
    fn a_change_made_before_a_failed_sync_of_others_hears_of_it() {
        let group = SyncGroup::default();
        let since = group.ticket();
        // Another caller's sync runs between this change and this caller's sync, and
        // fails: it may have written this change.
        assert_eq!(group.sync(SyncKind::Data, group.ticket(), |_| Err(VfsError::Io)), Err(VfsError::Io));
        assert_eq!(group.sync(SyncKind::Data, since, |_| Ok(())), Err(VfsError::Io));
        assert_eq!(group.sync(SyncKind::Data, group.ticket(), |_| Ok(())), Ok(()));
    }
}
