//! Writes made on a thread that must not wait, where the file system has no `RWF_NOWAIT`
//! for buffered writes (ext4): such a write normally only copies into the page cache, but
//! the kernel makes writers wait when dirty pages pile up faster than the disk takes them
//! (`balance_dirty_pages`, pauses of 10–200 ms). A runtime thread held there stalls every
//! connection it serves, so after one such wait writes go to threads that may wait, for a
//! while, as knfsd's would each wait on their own.

use super::cache::clock_ms;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A write that took longer was held up: a copy of 1 MiB into the page cache takes well
/// under a millisecond, and a runnable thread is seldom kept off a CPU for this long.
const HELD_UP: Duration = Duration::from_millis(20);
/// How long writes stay off the threads that must not wait after one was held up.
const BACK_OFF: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct HeldUp {
    /// Milliseconds on `clock_ms`'s monotonic clock until which writes must go where waiting is allowed.
    until_ms: AtomicU64,
}

impl HeldUp {
    /// Whether a write was held up recently: the next ones should run where they may wait.
    pub fn held_up(&self) -> bool {
        self.held_up_at(clock_ms())
    }

    /// Records how long a write took; true if it was held up (the back-off starts now).
    pub fn took(&self, elapsed: Duration) -> bool {
        self.took_at(elapsed, clock_ms())
    }

    fn held_up_at(&self, now: u64) -> bool {
        now < self.until_ms.load(Ordering::Relaxed)
    }

    fn took_at(&self, elapsed: Duration, now: u64) -> bool {
        if elapsed < HELD_UP {
            return false;
        }
        self.until_ms.fetch_max(now + BACK_OFF.as_millis() as u64, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_up_write_sends_the_next_ones_away_for_the_back_off() {
        let h = HeldUp::default();
        assert!(!h.held_up_at(0));
        assert!(!h.took_at(Duration::from_micros(300), 10), "a page-cache copy is not held up");
        assert!(!h.held_up_at(10));
        assert!(h.took_at(Duration::from_millis(150), 1_000));
        assert!(h.held_up_at(1_001) && h.held_up_at(1_999));
        assert!(!h.held_up_at(2_000), "the back-off ends");
        // A second wait during the back-off extends it; an earlier one never shortens it.
        assert!(h.took_at(Duration::from_millis(50), 1_500));
        assert!(h.held_up_at(2_400));
        h.took_at(Duration::from_millis(50), 100);
        assert!(h.held_up_at(2_400));
    }
}
