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
//! same result; a stream of a directory removed meanwhile reads as empty until evicted,
//! by newer streams or, on an idle server, by the cache sweeper once parked for
//! `open_object_idle_secs`.
//! A stream is continued only while the directory's change and modification times are
//! those it was parked with: the entries it read ahead predate any change since, and a
//! client that lists again because the directory changed must see that change, even
//! where its new listing reaches a cookie an abandoned one was parked at.
//!
//! The `statx` calls of READDIRPLUS entries are made in batches ([`StatBatch`]) that
//! several threads share. A parked stream may carry the batch its next call will need,
//! started by a helper thread while the client reads the reply just sent; the next call
//! uses it only if nothing can have changed since it began (see `LocalFs::readdir`).

use crate::vfs::{Attr, Cred, ObjectId, Timespec};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Instant;

/// Streams kept at most; the oldest goes first (one per listing in progress).
const CAPACITY: usize = 16;

pub struct DirStream {
    /// Shared with helper threads looking at its entries.
    pub fd: Arc<OwnedFd>,
    /// `getdents64` buffer; `buf[pos..len]` holds entries read but not yet returned.
    pub buf: Vec<u8>,
    pub pos: usize,
    pub len: usize,
    /// The directory's count of entry changes through nasd when `buf` was filled.
    pub entry_changes: u64,
    /// The entries from `pos` on, looked at ahead of the calls that will list them.
    pub ahead: Option<LookAhead>,
    /// How many entries the next look-ahead takes at most (0: a few replies' worth). It
    /// grows while look-aheads are used to their end, and starts again small after one
    /// was given up (a change, or a client that stopped): a change every call would
    /// otherwise throw away a long look-ahead every call.
    pub window: usize,
}

/// A batch started before the calls that need it, with what tells whether it may still
/// be used.
pub struct LookAhead {
    pub batch: Arc<StatBatch>,
    /// The batch's entry at the stream's position: those before it were listed.
    pub next: usize,
    /// Before the first `statx` could have begun.
    pub begun: Instant,
    /// The backend's mark of modifying calls when the batch was made ([`super::ChangeCount`]).
    pub modifications: u64,
    /// The directory's change and modification times when the batch was made.
    pub dir_times: (Timespec, Timespec),
}

impl LookAhead {
    /// Entries looked at ahead and not listed yet.
    pub fn remaining(&self) -> usize {
        self.batch.len().saturating_sub(self.next)
    }
}

/// Threads that share the `statx` calls of READDIRPLUS batches with the threads serving
/// the calls. Between jobs they sleep in the kernel rather than spin: with a rayon pool,
/// whose idle workers spin in `sched_yield`, 44 % of look-aheads had not begun when
/// their call arrived, against 28 % with these (docs/performance.md, change 19). A
/// spinning helper competes for the CPUs the client and the serving thread run on.
///
/// A helper keeps off the CPU of the thread whose job it takes: there it could only take
/// turns with that thread. Schedulers that pack woken threads together put it there:
/// on a 2-core virtual machine the serving thread, the helper and a local client all ran
/// on one CPU while the other idled (`perf sched`), and one listing of 5,000 entries took
/// 13–20 ms against 9–12 ms with the helper on the other CPU (docs/performance.md).
pub struct ListingHelpers {
    jobs: mpsc::SyncSender<Job>,
}

/// A job and the CPU the helper keeps off (that of the client the job is for, or of the
/// thread that queued it).
struct Job {
    run: Box<dyn FnOnce() + Send>,
    from_cpu: Option<usize>,
}

/// Jobs waiting for a helper at most. Beyond them a job is dropped: the thread serving
/// the call does its `statx` calls itself, as it does for any a helper has not taken, and
/// helpers stuck on a hung file system do not pile up jobs (each holds a directory open).
const JOBS_QUEUED: usize = 64;

impl ListingHelpers {
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::sync_channel::<Job>(JOBS_QUEUED);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new().name(format!("nasd-listing-{i}")).spawn(move || {
                let mut placement = crate::cpu::Placement::of_this_thread();
                loop {
                    // One helper waits for the next job while the others wait for the queue.
                    let Ok(job) = queue.lock().recv() else { return };
                    if let (Some(p), Some(cpu)) = (placement.as_mut(), job.from_cpu) {
                        p.keep_off(cpu);
                    }
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.run)).is_err() {
                        tracing::error!("a listing helper's job panicked");
                    }
                }
            })?;
        }
        Ok(Self { jobs })
    }

    /// Queues `job` for a helper; false if the queue is full (the job is dropped).
    #[cfg(test)]
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.spawn_off(crate::cpu::current_cpu(), job)
    }

    /// As [`Self::spawn`], for a helper kept off `cpu` (the calling thread's if `None`).
    pub fn spawn_off(&self, cpu: Option<usize>, job: impl FnOnce() + Send + 'static) -> bool {
        // The helpers never end while the sender lives: only a full queue refuses.
        self.jobs.try_send(Job { run: Box::new(job), from_cpu: cpu.or_else(crate::cpu::current_cpu) }).is_ok()
    }
}

/// How long a thread that needs an entry another thread is looking at waits for it (in
/// spin-loop hints: a few microseconds, about one `statx`) before looking itself.
const IN_FLIGHT_SPINS: u32 = 200;

/// Handle and attributes of a listed entry, when they could be had.
pub type EntryStat = Option<(ObjectId, Attr)>;

/// The `statx` calls for a batch of listed entries, shared by whichever threads take
/// part: each takes the next entry until none is left, so a thread that comes late does
/// less, and the one that needs the results waits only for entries already taken.
pub struct StatBatch {
    /// The names to look at, NUL-terminated and back to back, and where each one is in
    /// listing order (`None`: answered without a `statx`).
    names: Vec<u8>,
    spans: Vec<Option<(usize, usize)>>,
    next: AtomicUsize,
    results: Vec<OnceLock<EntryStat>>,
}

impl StatBatch {
    pub fn new<'a>(names: impl Iterator<Item = Option<&'a CStr>>) -> Arc<Self> {
        let mut buf = Vec::new();
        let spans: Vec<Option<(usize, usize)>> = names
            .map(|n| {
                n.map(|n| {
                    let start = buf.len();
                    buf.extend_from_slice(n.to_bytes_with_nul());
                    (start, buf.len())
                })
            })
            .collect();
        Arc::new(Self { results: spans.iter().map(|_| OnceLock::new()).collect(), names: buf, spans, next: AtomicUsize::new(0) })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn name(&self, i: usize) -> Option<&CStr> {
        let (start, end) = (*self.spans.get(i)?)?;
        CStr::from_bytes_with_nul(&self.names[start..end]).ok()
    }

    /// Looks at entry `i`, taken by this thread. An entry whose look panics counts as
    /// done without attributes, so that no thread waits for it forever.
    fn look(&self, i: usize, stat: &impl Fn(&CStr) -> EntryStat) {
        let looked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.name(i).and_then(stat)));
        let _ = self.results[i].set(looked.unwrap_or_else(|_| {
            tracing::error!("looking at a listed entry panicked; listed without attributes");
            None
        }));
    }

    /// Takes entries until none is left.
    pub fn work(&self, stat: impl Fn(&CStr) -> EntryStat) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.spans.len() {
                return;
            }
            self.look(i, &stat);
        }
    }

    /// The results of the entries in `range`: takes those of them no thread took yet,
    /// then waits briefly for the others (another thread is inside one `statx`) and looks
    /// at those still not done itself: a helper that was preempted, or shares its CPU with
    /// the client, must not hold up the call.
    pub fn results(&self, range: std::ops::Range<usize>, stat: impl Fn(&CStr) -> EntryStat) -> Vec<EntryStat> {
        let end = range.end.min(self.spans.len());
        let mut i = self.next.load(Ordering::Relaxed);
        while i < end {
            match self.next.compare_exchange_weak(i, i + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.look(i, &stat);
                    i += 1;
                }
                Err(now) => i = now,
            }
        }
        (range.start..end)
            .map(|i| {
                for _ in 0..IN_FLIGHT_SPINS {
                    if let Some(r) = self.results[i].get() {
                        return r.clone();
                    }
                    std::hint::spin_loop();
                }
                // Whichever look finishes first gives the result; the other's is dropped.
                self.look(i, &stat);
                self.results[i].get().cloned().flatten()
            })
            .collect()
    }

    /// Works on the batch, then waits for entries other threads took; the results in order.
    pub fn join(&self, stat: impl Fn(&CStr) -> EntryStat) -> Vec<EntryStat> {
        self.results(0..self.len(), stat)
    }

    /// Leaves whatever is not taken yet undone: the results will not be used.
    pub fn abandon(&self) {
        self.next.fetch_max(self.spans.len(), Ordering::Relaxed);
    }
}

struct Parked {
    dir: ObjectId,
    cookie: u64,
    /// The stream was opened with this caller's permissions; only it continues it.
    cred: Cred,
    /// The directory's change and modification times when the stream was parked.
    dir_times: (Timespec, Timespec),
    stream: DirStream,
    parked_at: Instant,
}

#[derive(Default)]
pub struct DirStreams {
    parked: Mutex<VecDeque<Parked>>,
}

impl DirStreams {
    /// The stream of `dir` whose last reply ended at `cookie`, for `cred`, if the
    /// directory's times are still `dir_times` and its count of entry changes through
    /// nasd is still `entry_changes` (a stream parked or read before a change is dropped).
    pub fn take(&self, dir: &ObjectId, cookie: u64, cred: &Cred, dir_times: (Timespec, Timespec), entry_changes: u64) -> Option<DirStream> {
        let mut parked = self.parked.lock();
        loop {
            let i = parked.iter().position(|p| p.cookie == cookie && p.dir == *dir && p.cred == *cred)?;
            let p = parked.remove(i)?;
            if p.dir_times == dir_times && p.stream.entry_changes == entry_changes {
                return Some(p.stream);
            }
            if let Some(ahead) = p.stream.ahead {
                ahead.batch.abandon();
            }
        }
    }

    /// Keeps a stream for the call that continues `dir` at `cookie`; `dir_times`: the
    /// directory's change and modification times as of the call that read its entries.
    pub fn park(&self, dir: ObjectId, cookie: u64, cred: &Cred, dir_times: (Timespec, Timespec), stream: DirStream) {
        let mut parked = self.parked.lock();
        if parked.len() >= CAPACITY {
            // Nobody will continue the oldest: its look-ahead may stop.
            if let Some(ahead) = parked.pop_front().and_then(|p| p.stream.ahead) {
                ahead.batch.abandon();
            }
        }
        parked.push_back(Parked { dir, cookie, cred: cred.clone(), dir_times, stream, parked_at: Instant::now() });
    }

    /// Drops the streams parked before `before`: a listing left unfinished (its client
    /// gone, or its directory removed) keeps no directory open for long on an idle
    /// server. Returns how many were dropped.
    pub fn drop_parked_before(&self, before: Instant) -> usize {
        let mut parked = self.parked.lock();
        let was = parked.len();
        parked.retain(|p| {
            let keep = p.parked_at >= before;
            if let (false, Some(ahead)) = (keep, &p.stream.ahead) {
                ahead.batch.abandon();
            }
            keep
        });
        was - parked.len()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::FileKind;
    use std::ffi::CString;

    /// A stand-in for a `statx`: the entry's number (its name) as its size.
    fn stat_of(name: &CStr) -> EntryStat {
        let n: u64 = name.to_str().ok()?.strip_prefix('e')?.parse().ok()?;
        let t = Timespec::default();
        let attr = Attr {
            kind: FileKind::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: n,
            used: 0,
            rdev: (0, 0),
            fsid: 1,
            fileid: n,
            atime: t,
            mtime: t,
            ctime: t,
        };
        Some((ObjectId::new(&n.to_le_bytes())?, attr))
    }

    fn names(n: usize) -> Vec<Option<CString>> {
        // Every seventh entry is answered without a look (like `.`).
        (0..n).map(|i| (i % 7 != 3).then(|| CString::new(format!("e{i}")).expect("no NUL"))).collect()
    }

    fn batch(names: &[Option<CString>]) -> Arc<StatBatch> {
        StatBatch::new(names.iter().map(|n| n.as_deref()))
    }

    fn check(results: &[EntryStat], n: usize) {
        assert_eq!(results.len(), n);
        for (i, r) in results.iter().enumerate() {
            match r {
                None => assert_eq!(i % 7, 3, "entry {i} lost its result"),
                Some((_, a)) => assert_eq!(a.size, i as u64, "entry {i} got another entry's result"),
            }
        }
    }

    #[test]
    fn threads_sharing_a_batch_give_every_entry_its_own_result_in_order() {
        for n in [0, 1, 8, 49, 500] {
            let names = names(n);
            let b = batch(&names);
            let helpers: Vec<_> = (0..2)
                .map(|_| {
                    let b = b.clone();
                    std::thread::spawn(move || b.work(stat_of))
                })
                .collect();
            check(&b.join(stat_of), n);
            helpers.into_iter().for_each(|h| h.join().expect("helper"));
        }
    }

    #[test]
    fn a_panicking_look_is_an_entry_without_attributes_not_a_hang() {
        let names = names(40);
        let b = batch(&names);
        let helper = {
            let b = b.clone();
            std::thread::spawn(move || b.work(|c| if c.to_bytes() == b"e20" { panic!("injected") } else { stat_of(c) }))
        };
        helper.join().expect("the panic stays inside the batch");
        let results = b.join(stat_of);
        assert!(results[20].is_none());
        assert_eq!(results[21].as_ref().map(|(_, a)| a.size), Some(21));
    }

    #[test]
    fn entries_a_stalled_helper_took_are_looked_at_by_the_thread_that_needs_them() {
        let names = names(40);
        let b = batch(&names);
        // A helper took the first two entries and then stopped running (preempted, or
        // sharing its CPU with the client): the results must not wait for it.
        b.next.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || tx.send(b.results(0..40, stat_of)).expect("send"))
        };
        let results = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the results waited for a helper that never ran");
        waiter.join().expect("waiter");
        check(&results, 40);
        // The helper's late result is dropped; the one given stays.
        let _ = b.results[0].set(None);
        assert_eq!(b.results(0..1, stat_of)[0].as_ref().map(|(_, a)| a.size), Some(0));
    }

    #[test]
    fn a_helper_whose_job_panics_goes_on_with_the_next() {
        let helpers = ListingHelpers::start(1).expect("start a helper");
        helpers.spawn(|| panic!("injected"));
        let (tx, rx) = mpsc::channel();
        helpers.spawn(move || tx.send(7).expect("send"));
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(7), "the helper stopped after a panicking job");
    }

    #[test]
    fn jobs_for_a_stuck_helper_are_refused_once_the_queue_is_full() {
        let helpers = ListingHelpers::start(1).expect("start a helper");
        let (release, stuck) = mpsc::channel::<()>();
        // A helper hung in a `statx` on a file system that no longer answers.
        helpers.spawn(move || {
            let _ = stuck.recv();
        });
        let accepted = (0..JOBS_QUEUED * 3).take_while(|_| helpers.spawn(|| ())).count();
        assert!(accepted <= JOBS_QUEUED, "{accepted} jobs queued behind a stuck helper");
        drop(release);
        let (tx, rx) = mpsc::channel();
        let sent = (0..1000).any(|_| {
            let tx = tx.clone();
            helpers.spawn(move || tx.send(()).expect("send")) || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(sent && rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok(), "the helper did not come back once released");
    }

    #[test]
    fn an_abandoned_batch_is_left_undone() {
        let names = names(40);
        let b = batch(&names);
        b.abandon();
        let looked = AtomicUsize::new(0);
        b.work(|_| {
            looked.fetch_add(1, Ordering::Relaxed);
            None
        });
        assert_eq!(looked.load(Ordering::Relaxed), 0, "an abandoned batch looked at entries");
    }
}
