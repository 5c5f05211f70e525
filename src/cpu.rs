//! Where threads run: the CPU a thread is on, and the CPUs it may use, narrowed for the
//! helpers that work beside a serving thread and for a serving thread that follows its
//! client (docs/performance.md, "Where a listing's threads run").

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The CPU the calling thread runs on, if the kernel says.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPUs a thread may run on, narrowed to keep it off one CPU at a time.
pub struct Placement {
    allowed: libc::cpu_set_t,
    kept_off: Option<usize>,
    /// The one CPU it runs on now ([`Placement::pin_to`]).
    pinned: Option<usize>,
}

impl Placement {
    /// The calling thread's CPUs as it started (`taskset`, cgroup cpusets); `None` if
    /// fewer than two.
    pub fn of_this_thread() -> Option<Self> {
        // SAFETY: cpu_set_t is plain data; the kernel fills it.
        let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer and size.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) } != 0 {
            return None;
        }
        // SAFETY: reads the set filled above.
        (unsafe { libc::CPU_COUNT(&allowed) } >= 2).then_some(Self { allowed, kept_off: None, pinned: None })
    }

    /// Keeps the calling thread off `cpu` (it moves now if it is on it) until another CPU
    /// is to be kept off. Nothing changes if `cpu` is not one it may use.
    pub fn keep_off(&mut self, cpu: usize) {
        if self.kept_off == Some(cpu) || !self.may_use(cpu) {
            return;
        }
        let mut set = self.allowed;
        // SAFETY: cpu is within the set's size (may_use).
        unsafe { libc::CPU_CLR(cpu, &mut set) };
        if self.set(&set) {
            self.kept_off = Some(cpu);
        }
    }

    fn may_use(&self, cpu: usize) -> bool {
        // SAFETY: CPU_ISSET reads the set; cpu is bounds-checked against its size.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.allowed) }
    }

    fn set(&self, set: &libc::cpu_set_t) -> bool {
        // SAFETY: valid pointer and size; on failure the thread stays where it may run.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
    }

    /// Runs the calling thread on `cpu` alone (it moves now) until [`Self::release`].
    pub fn pin_to(&mut self, cpu: usize) {
        if self.pinned == Some(cpu) || !self.may_use(cpu) {
            return;
        }
        // SAFETY: plain data.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: cpu is within the set's size (may_use).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        if self.set(&set) {
            self.pinned = Some(cpu);
        }
    }

    /// Lets the calling thread run on all its CPUs again.
    pub fn release(&mut self) {
        if self.pinned.is_some() && self.set(&self.allowed) {
            self.pinned = None;
        }
    }
}

thread_local! {
    /// A serving thread's CPUs once it followed a client, and when it last was asked to.
    static FOLLOWING: RefCell<Option<(Placement, Instant)>> = const { RefCell::new(None) };
}

/// How long a serving thread stays on its client's CPU after it was last asked to: calls
/// of other connections served by the same thread in between do not move it back and
/// forth.
pub const FOLLOW_CLIENT_FOR: Duration = Duration::from_millis(20);

/// Serving threads: runs the calling thread on `client_cpu` (the CPU its client's calls
/// come in on); with `None`, on all its CPUs again once [`FOLLOW_CLIENT_FOR`] has passed
/// since it was last asked to follow (at once with `now`). A client that waits for each
/// reply and a thread that waits for each call take turns: on one CPU they hand over
/// without waking another, and the other CPU is left to helpers. Costs nothing while
/// not asked.
pub fn follow_client(client_cpu: Option<usize>, now: bool) {
    FOLLOWING.with(|f| {
        let mut f = f.borrow_mut();
        match client_cpu {
            Some(cpu) => {
                if f.is_none() {
                    *f = Placement::of_this_thread().map(|p| (p, Instant::now()));
                }
                if let Some((p, at)) = f.as_mut() {
                    p.pin_to(cpu);
                    *at = Instant::now();
                }
            }
            None => {
                if let Some((p, at)) = f.as_mut() {
                    if p.pinned.is_some() && (now || at.elapsed() >= FOLLOW_CLIENT_FOR) {
                        p.release();
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed_now() -> libc::cpu_set_t {
        // SAFETY: plain data, filled by the kernel.
        let mut now: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer and size.
        assert_eq!(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut now) }, 0);
        now
    }

    #[test]
    fn a_thread_kept_off_a_cpu_leaves_it_and_stays_off() {
        let Some(mut placement) = Placement::of_this_thread() else {
            crate::testing::skip("this thread may run on fewer than two CPUs, so none can be kept off");
            return;
        };
        // In a thread of its own: the test harness's thread keeps its CPUs.
        std::thread::spawn(move || {
            let here = current_cpu().expect("sched_getcpu");
            placement.keep_off(here);
            for _ in 0..100 {
                assert_ne!(current_cpu(), Some(here), "still on the CPU it was kept off");
                std::thread::yield_now();
            }
            let now = allowed_now();
            // SAFETY: reads the set.
            assert!(!unsafe { libc::CPU_ISSET(here, &now) }, "the CPU is still allowed");
            // SAFETY: as above.
            assert_eq!(unsafe { libc::CPU_COUNT(&now) }, unsafe { libc::CPU_COUNT(&placement.allowed) } - 1, "only that CPU is left out");
        })
        .join()
        .expect("placement thread");
    }

    #[test]
    fn a_thread_that_follows_a_client_runs_on_its_cpu_until_the_period_ends() {
        if Placement::of_this_thread().is_none() {
            crate::testing::skip("this thread may run on fewer than two CPUs, so there is nowhere to follow");
            return;
        }
        std::thread::spawn(|| {
            let before = allowed_now();
            let here = current_cpu().expect("sched_getcpu");
            // SAFETY: reads the set.
            let other =
                (0..libc::CPU_SETSIZE as usize).find(|&c| c != here && unsafe { libc::CPU_ISSET(c, &before) }).expect("a second CPU");
            follow_client(Some(other), false);
            assert_eq!(current_cpu(), Some(other), "did not move to the client's CPU");
            // SAFETY: reads the set.
            assert_eq!(unsafe { libc::CPU_COUNT(&allowed_now()) }, 1, "may still run elsewhere");
            // Another connection's call soon after: the thread stays.
            follow_client(None, false);
            // SAFETY: reads the set.
            assert_eq!(unsafe { libc::CPU_COUNT(&allowed_now()) }, 1, "let go within the follow period");
            std::thread::sleep(FOLLOW_CLIENT_FOR);
            follow_client(None, false);
            // SAFETY: reads the sets.
            assert_eq!(unsafe { libc::CPU_COUNT(&allowed_now()) }, unsafe { libc::CPU_COUNT(&before) }, "its CPUs were not given back");
        })
        .join()
        .expect("following thread");
    }
}
