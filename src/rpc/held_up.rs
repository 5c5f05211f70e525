//! Calls held up on a thread that must not wait. Calls the procedures call quick run on
//! the connection's own runtime thread, where they normally take microseconds: they read
//! cached metadata and copy to and from the page cache. Some still wait for the disk: a
//! LOOKUP or GETATTR of an inode or directory block nothing has cached, a write that the
//! kernel holds back while dirty pages pile up faster than the disk takes them
//! (`balance_dirty_pages`, 10–200 ms; ext4 has no `RWF_NOWAIT` for buffered writes). A
//! runtime thread held there stalls every call of every connection it serves, where
//! knfsd's threads would each wait on their own. Nothing says in advance which call will
//! wait, so after one call of a procedure was held up, that procedure's calls go to
//! threads that may wait for a while: the next cold calls of a crawl, or the next writes
//! while the disk catches up, wait there instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A call that took longer was held up: a warm call takes microseconds, a copy of 1 MiB
/// into the page cache well under a millisecond, and a runnable thread is seldom kept off
/// a CPU for this long.
pub const HELD_UP: Duration = Duration::from_millis(20);
/// How long a procedure's calls stay off the threads that must not wait after one was held up.
const BACK_OFF: Duration = Duration::from_secs(1);
/// Procedure numbers tracked; higher ones share the last entry.
const PROCEDURES: usize = 32;

/// Per procedure of one program: until when its calls must run where waiting is allowed.
pub struct HeldUp {
    epoch: Instant,
    /// Milliseconds since `epoch` until which the procedure's calls go to threads that may wait.
    until_ms: [AtomicU64; PROCEDURES],
    /// [`HELD_UP`], but for tests on a loaded machine.
    threshold: Duration,
}

impl Default for HeldUp {
    fn default() -> Self {
        Self::with_threshold(HELD_UP)
    }
}

impl HeldUp {
    /// Calls that take `threshold` or longer count as held up.
    pub fn with_threshold(threshold: Duration) -> Self {
        Self { epoch: Instant::now(), until_ms: std::array::from_fn(|_| AtomicU64::new(0)), threshold }
    }

    /// Whether a call of `procedure` arriving at `now` should run where it may wait.
    pub fn held_up(&self, procedure: u32, now: Instant) -> bool {
        self.held_up_at(procedure, self.ms(now))
    }

    /// Records that a call of `procedure`, on a thread that must not wait, ended at `now`
    /// after `elapsed`; true if it was held up (the back-off starts now).
    pub fn took(&self, procedure: u32, elapsed: Duration, now: Instant) -> bool {
        self.took_at(procedure, elapsed, self.ms(now))
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn slot(&self, procedure: u32) -> &AtomicU64 {
        &self.until_ms[(procedure as usize).min(PROCEDURES - 1)]
    }

    fn held_up_at(&self, procedure: u32, now_ms: u64) -> bool {
        now_ms < self.slot(procedure).load(Ordering::Relaxed)
    }

    fn took_at(&self, procedure: u32, elapsed: Duration, now_ms: u64) -> bool {
        if elapsed < self.threshold {
            return false;
        }
        self.slot(procedure).fetch_max(now_ms + BACK_OFF.as_millis() as u64, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_up_call_sends_the_next_ones_of_its_procedure_away_for_the_back_off() {
        let h = HeldUp::default();
        assert!(!h.held_up_at(7, 0));
        assert!(!h.took_at(7, Duration::from_micros(300), 10), "a page-cache copy is not held up");
        assert!(!h.held_up_at(7, 10));
        assert!(h.took_at(7, Duration::from_millis(150), 1_000));
        assert!(h.held_up_at(7, 1_001) && h.held_up_at(7, 1_999));
        assert!(!h.held_up_at(3, 1_001), "other procedures stay where they are");
        assert!(!h.held_up_at(7, 2_000), "the back-off ends");
        // A second wait during the back-off extends it; an earlier one never shortens it.
        assert!(h.took_at(7, Duration::from_millis(50), 1_500));
        assert!(h.held_up_at(7, 2_400));
        h.took_at(7, Duration::from_millis(50), 100);
        assert!(h.held_up_at(7, 2_400));
    }

    #[test]
    fn procedures_beyond_the_table_share_its_last_entry() {
        let h = HeldUp::default();
        h.took_at(1_000, HELD_UP, 0);
        assert!(h.held_up_at(40, 1) && h.held_up_at(PROCEDURES as u32 - 1, 1));
        assert!(!h.held_up_at(0, 1));
    }
}
