//! Group commit: concurrent requests to make one file durable share one `fsync`.
//!
//! A caller whose write has completed needs a sync that *starts* after that moment. Syncs
//! of a file run one at a time and are numbered; a caller waits for the next one to start
//! (running it itself when nobody else is), so while one `fsync` is in flight every write
//! that completes meanwhile is covered by the single `fsync` that follows it. At iodepth
//! 64 this turns 64 flushes into about two.

use crate::vfs::{VfsError, VfsResult};
use parking_lot::{Condvar, Mutex};

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
    /// The first sync that failed. Failures are sticky: once writeback failed the kernel
    /// may have dropped the data, so no later sync can vouch for earlier writes. (In a
    /// [`SyncGroup::whole_fs`] group: the last sync that failed.)
    failed: Option<(u64, VfsError)>,
}

#[derive(Default)]
pub struct SyncGroup {
    state: Mutex<State>,
    finished: Condvar,
    /// Failures reach only the callers of the failed sync (see [`SyncGroup::whole_fs`]).
    transient_failures: bool,
}

impl SyncGroup {
    /// A group for `syncfs`, whose error may come from any file of the file system (one
    /// the server never touched, or a momentarily full disk): it goes to the callers whose
    /// changes that sync was to cover, and a later sync speaks for the changes after it.
    /// A sticky failure would refuse every namespace change until restart.
    pub fn whole_fs() -> Self {
        Self { transient_failures: true, ..Self::default() }
    }

    /// Returns once everything written to the file before this call is durable. `run`
    /// performs one sync of the given kind; it is called by at most one thread at a time.
    pub fn sync(&self, kind: SyncKind, run: impl Fn(SyncKind) -> VfsResult<()>) -> VfsResult<()> {
        let mut st = self.state.lock();
        let need = st.started + 1;
        if kind == SyncKind::Full {
            st.next_full = true;
        }
        while st.finished < need {
            if st.running {
                self.finished.wait(&mut st);
                continue;
            }
            st.running = true;
            st.started += 1;
            let number = st.started;
            let kind = if std::mem::take(&mut st.next_full) { SyncKind::Full } else { SyncKind::Data };
            let result = parking_lot::MutexGuard::unlocked(&mut st, || run(kind));
            st.running = false;
            st.finished = number;
            if let Err(e) = result {
                if self.transient_failures {
                    st.failed = Some((number, e));
                } else {
                    st.failed.get_or_insert((number, e));
                }
            }
            self.finished.notify_all();
        }
        match st.failed {
            // The sync this caller needed, or one after it, failed: another caller may
            // have run the next sync before this one woke up, so "after" is counted too.
            Some((failed, e)) if self.transient_failures && failed >= need => Err(e),
            Some((first, e)) if !self.transient_failures && first <= need => Err(e),
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
    fn a_sync_started_before_the_call_does_not_count() {
        let group = Arc::new(SyncGroup::default());
        let writes = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Barrier::new(2));
        // Thread A starts a slow sync that sees write #1 only.
        let a = {
            let (group, writes, gate) = (group.clone(), writes.clone(), gate.clone());
            std::thread::spawn(move || {
                writes.store(1, Ordering::SeqCst);
                group.sync(SyncKind::Data, |_| {
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
            .sync(SyncKind::Data, |_| {
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
                    group.sync(kind, |k| {
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
    fn failures_are_sticky() {
        let group = SyncGroup::default();
        assert_eq!(group.sync(SyncKind::Data, |_| Ok(())), Ok(()));
        assert_eq!(group.sync(SyncKind::Data, |_| Err(VfsError::Io)), Err(VfsError::Io));
        // A later sync that succeeds cannot vouch for data the failed writeback dropped.
        assert_eq!(group.sync(SyncKind::Data, |_| Ok(())), Err(VfsError::Io));
    }

    #[test]
    fn whole_fs_failures_reach_only_the_callers_of_the_failed_sync() {
        let group = SyncGroup::whole_fs();
        assert_eq!(group.sync(SyncKind::Full, |_| Err(VfsError::NoSpc)), Err(VfsError::NoSpc));
        assert_eq!(group.sync(SyncKind::Full, |_| Ok(())), Ok(()));
        assert_eq!(group.sync(SyncKind::Full, |_| Err(VfsError::Io)), Err(VfsError::Io));
        assert_eq!(group.sync(SyncKind::Full, |_| Ok(())), Ok(()));
    }
}
