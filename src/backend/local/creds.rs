//! Per-thread filesystem identity.
//!
//! Namespace operations run under the caller's uid, gid and groups so the kernel enforces
//! permissions, sticky bits, ownership of new files and capability rules exactly as for a
//! local process. `setfsuid`, `setfsgid` and the raw `setgroups` syscall change only the
//! calling thread (glibc's `setgroups` wrapper would change every thread), and the last
//! identity is remembered so a run of calls by one user costs no syscalls.

use crate::vfs::{Cred, INVALID_ID};
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

/// Makes the calling thread act as `cred` for filesystem access, or as nobody where the
/// kernel will not take `cred` on. False if the thread could not be made to act as either:
/// the call must then be refused, for the thread may still act as root.
#[must_use]
pub fn become_user(cred: &Cred) -> bool {
    if !enabled() {
        return true;
    }
    CURRENT.with(|cur| switch_identity(&mut cur.borrow_mut(), cred))
}

/// Whether this process can act as its callers: taking on another identity and reading
/// it back works on a thread of its own. It cannot where the process runs as root
/// without `CAP_SETUID`/`CAP_SETGID` (a capability bounding set, a container): serving
/// then would give every caller root's access.
pub fn check_switching() -> Result<(), String> {
    if !enabled() {
        return Ok(());
    }
    std::thread::spawn(|| {
        let probe = Cred { uid: NOBODY, gid: NOBODY, groups: vec![NOBODY] };
        if apply_identity(&probe) {
            Ok(())
        } else {
            Err("nasd runs as root but cannot act as its callers (setfsuid, setfsgid or setgroups refused: it needs CAP_SETUID and CAP_SETGID)".to_string())
        }
    })
    .join()
    .unwrap_or_else(|_| Err("the identity check panicked".into()))
}

/// Makes this thread act as `cred`; `current`: what it acts as now (`None`: the server's
/// own identity, root, or unknown), updated. True if it now acts as `cred`, or as nobody
/// where `cred` could not be taken on.
fn switch_identity(current: &mut Option<Cred>, cred: &Cred) -> bool {
    if current.as_ref() == Some(cred) {
        return true;
    }
    // Squashing maps -1 away (`setfsuid(-1)` would keep the identity as it was); an id
    // the kernel refuses (-1, or one a user namespace does not map) makes the call act
    // as nobody.
    let valid = cred.uid != INVALID_ID && cred.gid != INVALID_ID;
    let acting_as = if valid && apply_identity(cred) {
        cred.clone()
    } else {
        if let Some(held_back) = REFUSALS.allow() {
            tracing::error!(uid = cred.uid, gid = cred.gid, groups = ?cred.groups, held_back, "could not take on a caller's identity: acting as nobody");
        }
        let nobody = Cred { uid: NOBODY, gid: NOBODY, groups: Vec::new() };
        if !apply_identity(&nobody) {
            tracing::error!("could not act as nobody either: refusing the call");
            // Whatever the thread acts as now, it keeps no resource override, and the
            // next switch starts from scratch.
            resource_override(false);
            *current = None;
            return false;
        }
        nobody
    };
    resource_override(acting_as.uid == 0);
    *current = Some(acting_as);
    true
}

thread_local! {
    /// Whether this thread's `CAP_SYS_RESOURCE` is raised, as last set (threads start as
    /// the process does: raised, where it is held at all).
    static RESOURCE_OVERRIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Raises or drops `CAP_SYS_RESOURCE` on this thread unless it already is so.
fn resource_override(on: bool) {
    if RESOURCE_OVERRIDE.with(|r| r.replace(on)) != on {
        set_resource_override(on);
    }
}

/// At most one log line a minute for ids the kernel refuses: any client can send them.
static REFUSALS: crate::throttle::Throttle = crate::throttle::Throttle::new(60);

/// The fallback identity, with no privileges and no groups.
const NOBODY: u32 = 65534;

/// Sets this thread's groups, fsgid and fsuid, then reads the ids back: `setfsuid` and
/// `setfsgid` report no error (refused, they leave the id as it was). True if all three
/// took effect.
fn apply_identity(cred: &Cred) -> bool {
    // SAFETY: plain syscalls on this thread's credentials with valid pointers.
    unsafe {
        // Order: groups and gid first while still privileged, fsuid last.
        let groups = libc::syscall(libc::SYS_setgroups, cred.groups.len(), cred.groups.as_ptr()) == 0;
        if !groups {
            libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
        }
        libc::syscall(libc::SYS_setfsgid, cred.gid);
        libc::syscall(libc::SYS_setfsuid, cred.uid);
        // Asked for -1 they change nothing and return the id in force.
        let fsgid = libc::syscall(libc::SYS_setfsgid, INVALID_ID) as u32;
        let fsuid = libc::syscall(libc::SYS_setfsuid, INVALID_ID) as u32;
        groups && fsgid == cred.gid && fsuid == cred.uid
    }
}

/// Back to full privileges (needed for `open_by_handle_at`).
pub fn become_root() {
    thread_local! {
        static ROOT: Cred = Cred::root();
    }
    // Root's own identity: nothing to refuse, and nothing less privileged to fall to.
    let _ = ROOT.with(become_user);
}

/// `CAP_SYS_RESOURCE`: exceeding disk quota hard limits and using the blocks ext4 keeps
/// for root. A changed fsuid drops only the file-system capabilities, so for any caller
/// but root nasd drops this one as well, as knfsd does: a client's writes then meet the
/// limits its user meets locally.
const CAP_SYS_RESOURCE: u32 = 24;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `CAP_FOWNER`: acting as the owner of any file. Raised only around LINK, whose
/// `fs.protected_hardlinks` check (a local process may link only files it owns or may read
/// and write) knfsd does not apply to clients.
const CAP_FOWNER: u32 = 3;

/// Raises or drops `CAP_SYS_RESOURCE` in this thread's effective set, leaving every other
/// capability as it is (the file-system ones follow the fsuid).
fn set_resource_override(on: bool) {
    set_effective(CAP_SYS_RESOURCE, on);
}

/// Runs `f` with `CAP_FOWNER` raised on this thread, under whatever identity the thread
/// has, and puts it back as it was. Every other check of the caller's stays: permission
/// on directories, quotas and reserved blocks, immutable files.
pub fn with_owner_override<T>(f: impl FnOnce() -> T) -> T {
    let was = set_effective(CAP_FOWNER, true);
    let r = f();
    if was == Some(false) {
        set_effective(CAP_FOWNER, false);
    }
    r
}

/// Raises (where permitted) or drops one capability in this thread's effective set,
/// leaving the others as they are; whether it was raised before (`None`: unknown, the
/// kernel refused).
fn set_effective(cap: u32, on: bool) -> Option<bool> {
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset on the calling thread with a v3 header and two data words.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "capget");
            return None;
        }
        let bit = 1u32 << cap;
        let was = data[0].effective & bit != 0;
        if on {
            data[0].effective |= bit & data[0].permitted;
        } else {
            data[0].effective &= !bit;
        }
        if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "capset");
            return None;
        }
        Some(was)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's effective capabilities, from /proc.
    fn effective_caps() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        let line = status.lines().find(|l| l.starts_with("CapEff:")).expect("CapEff");
        u64::from_str_radix(line["CapEff:".len()..].trim(), 16).expect("hex")
    }

    /// This thread's fsuid and fsgid, from /proc ("Uid:\treal\teffective\tsaved\tfs").
    fn fs_ids() -> (u32, u32) {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        let fs = |key: &str| -> u32 {
            let line = status.lines().find(|l| l.starts_with(key)).expect(key);
            line.split_whitespace().nth(4).expect("fs id").parse().expect("number")
        };
        (fs("Uid:"), fs("Gid:"))
    }

    /// Runs `f` on a thread of its own, which ends with the identities it took (they are
    /// per thread), where this process is root; elsewhere says why the test is skipped.
    fn on_own_thread_as_root(needs: &str, f: impl FnOnce() + Send + 'static) {
        if unsafe { libc::geteuid() } != 0 {
            crate::testing::skip(&format!("needs root ({needs})"));
            return;
        }
        std::thread::spawn(f).join().expect("thread");
    }

    #[test]
    fn an_identity_that_cannot_be_taken_on_acts_as_nobody() {
        on_own_thread_as_root("identities to switch", || {
            let mut current = None;
            for bad in [
                Cred { uid: INVALID_ID, gid: 1000, groups: vec![] },
                Cred { uid: 1000, gid: INVALID_ID, groups: vec![] },
                Cred { uid: 1000, gid: 1000, groups: vec![INVALID_ID] },
            ] {
                assert!(switch_identity(&mut current, &Cred::root()));
                assert_eq!(fs_ids(), (0, 0));
                assert!(switch_identity(&mut current, &bad));
                assert_eq!(fs_ids(), (NOBODY, NOBODY), "{bad:?}");
                assert_eq!(effective_caps() & 0b10, 0, "no DAC override left: {bad:?}");
            }
            assert!(switch_identity(&mut current, &Cred { uid: 1000, gid: 1001, groups: vec![7] }));
            assert_eq!(fs_ids(), (1000, 1001));
        });
    }

    #[test]
    fn callers_other_than_root_lose_the_resource_override() {
        on_own_thread_as_root("capabilities to drop", || {
            let mut current = None;
            let bit = 1u64 << CAP_SYS_RESOURCE;
            let held = effective_caps() & bit;
            if held == 0 {
                // Containers often withhold it: then only its absence for users is checked.
                eprintln!("CAP_SYS_RESOURCE not held by this process: checking only that users lack it");
            }
            assert!(switch_identity(&mut current, &Cred { uid: 1000, gid: 1000, groups: vec![1000] }));
            assert_eq!(effective_caps() & bit, 0, "a user's calls must meet quotas and reserved blocks");
            assert_eq!(effective_caps() & 0b10, 0, "and no DAC override either");
            assert!(switch_identity(&mut current, &Cred { uid: 1001, gid: 1001, groups: vec![] }));
            assert_eq!(effective_caps() & bit, 0);
            assert!(switch_identity(&mut current, &Cred::root()));
            assert_eq!(effective_caps() & bit, held, "back to root, back to the override");
            assert_ne!(effective_caps() & 0b10, 0, "and the file-system capabilities");
        });
    }
}
