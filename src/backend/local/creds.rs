//! Per-thread filesystem identity.
//!
//! Namespace operations run under the caller's uid, gid and groups so the kernel enforces
//! permissions, sticky bits, ownership of new files and capability rules exactly as for a
//! local process. `setfsuid`, `setfsgid` and the raw `setgroups` syscall change only the
//! calling thread (glibc's `setgroups` wrapper would change every thread), and the last
//! identity is remembered so a run of calls by one user costs no syscalls.

use crate::vfs::Cred;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: RefCell<Option<Cred>> = const { RefCell::new(None) };
}

/// Turns identity switching on when the process runs as root; otherwise every operation
/// runs as the server's own user.
pub fn init() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    ENABLED.store(root, Ordering::Relaxed);
    root
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Makes the calling thread act as `cred` for filesystem access.
pub fn become_user(cred: &Cred) {
    if !enabled() {
        return;
    }
    CURRENT.with(|cur| {
        let mut cur = cur.borrow_mut();
        if cur.as_ref() == Some(cred) {
            return;
        }
        // SAFETY: plain syscalls on this thread's credentials with valid pointers.
        unsafe {
            // Order: groups and gid first while still privileged, fsuid last.
            libc::syscall(libc::SYS_setgroups, cred.groups.len(), cred.groups.as_ptr());
            libc::syscall(libc::SYS_setfsgid, cred.gid);
            libc::syscall(libc::SYS_setfsuid, cred.uid);
        }
        *cur = Some(cred.clone());
    });
}

/// Back to full privileges (needed for `open_by_handle_at`).
pub fn become_root() {
    thread_local! {
        static ROOT: Cred = Cred::root();
    }
    ROOT.with(become_user);
}
