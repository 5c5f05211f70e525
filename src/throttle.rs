//! Log lines that any peer can cause (a refused connection, a refused identity, a mount
//! request), let through at most once per interval so a flood of them cannot flood the
//! log too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

pub struct Throttle {
    every_secs: u64,
    /// Seconds since the first use of any throttle (a monotonic clock: a clock step must
    /// not silence the log) when the next line may go out.
    next: AtomicU64,
    held_back: AtomicU64,
}

impl Throttle {
    pub const fn new(every_secs: u64) -> Self {
        Self { every_secs, next: AtomicU64::new(0), held_back: AtomicU64::new(0) }
    }

    /// `Some(n)`: log this one, saying `n` were held back since the last; `None`: don't.
    pub fn allow(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        self.allow_at(START.get_or_init(Instant::now).elapsed().as_secs())
    }

    fn allow_at(&self, now: u64) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        if now >= next && self.next.compare_exchange(next, now + self.every_secs, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_a_count_of_the_rest() {
        let t = Throttle::new(60);
        assert_eq!(t.allow_at(1000), Some(0));
        assert_eq!(t.allow_at(1000), None);
        assert_eq!(t.allow_at(1059), None);
        assert_eq!(t.allow_at(1060), Some(2));
        assert_eq!(t.allow_at(1061), None);
        assert_eq!(t.allow_at(2000), Some(1));
    }
}
