//! The backend's bounded in-memory maps: the open-object cache (kernel handle -> open
//! descriptors, so a busy file costs no `open_by_handle_at` per request, the role of
//! knfsd's filecache) and the handle cache (inode -> kernel handle, so a READDIRPLUS entry
//! costs no `name_to_handle_at`).

use super::sync::SyncGroup;
use super::{close_check, LocalFs};
use crate::vfs::ObjectId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

/// The descriptors an object's I/O goes through, each opened when first needed.
#[derive(Default)]
pub struct IoFds {
    /// Read-only (directories: for `fsync`).
    pub read: Option<Arc<OwnedFd>>,
    /// Read-write, once the object was written, and the export it was written through:
    /// checked for writeback errors when the object is dropped (`close_check`).
    pub write: Option<(Arc<OwnedFd>, Weak<LocalFs>)>,
}

/// One cached object: an `O_PATH` descriptor that names it, lazily the descriptors for
/// its I/O, and the group commit that concurrent stable writes, COMMITs and directory
/// changes share.
pub struct CachedObject {
    pub path_fd: OwnedFd,
    pub io_fds: Mutex<IoFds>,
    pub sync: SyncGroup,
    /// Used since the last sweep ([`sweep_idle`]).
    used: AtomicBool,
    /// When its place in the export was last checked ([`clock_ms`]).
    place_checked_ms: AtomicU64,
    /// A READ sent from the page cache could not be sent ([`crate::vfs::FileRange`]).
    pub in_place_send_failed: Arc<AtomicBool>,
    /// Until when ([`clock_ms`]) its READs are copied after such a failure; 0: not.
    pub copy_reads_until_ms: AtomicU64,
}

/// How long a cached object's place in the export is trusted: a directory moved out of the
/// export (by a local user, or through another export) is no longer served after this.
pub const PLACE_RECHECK: Duration = Duration::from_secs(1);

/// `place_checked_ms` of an object whose place needs no checks: not a directory.
const NEVER_CHECK: u64 = u64::MAX;

/// Milliseconds on a monotonic clock that starts with the first call.
pub(super) fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Drop for CachedObject {
    fn drop(&mut self) {
        if let Some((fd, owner)) = self.io_fds.get_mut().write.take() {
            close_check::check_and_close(fd, owner);
        }
    }
}

impl CachedObject {
    pub fn new(path_fd: OwnedFd) -> Arc<Self> {
        Arc::new(Self {
            path_fd,
            io_fds: Mutex::new(IoFds::default()),
            sync: SyncGroup::default(),
            used: AtomicBool::new(true),
            place_checked_ms: AtomicU64::new(clock_ms()),
            in_place_send_failed: Arc::new(AtomicBool::new(false)),
            copy_reads_until_ms: AtomicU64::new(0),
        })
    }

    /// Marks the object used, for the sweep. Loads first, so a busy object's cache line is
    /// not written by every request.
    pub fn touch(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// Only a directory's place is checked ([`Self::claim_place_check`]): a file handle
    /// leads nowhere else, as with knfsd's `no_subtree_check`.
    pub fn never_check_place(&self) {
        self.place_checked_ms.store(NEVER_CHECK, Ordering::Relaxed);
    }

    /// Whether the object's place in the export is due for a check ([`PLACE_RECHECK`]);
    /// one caller is told so, and makes it, while the others go on.
    pub fn claim_place_check(&self) -> bool {
        let last = self.place_checked_ms.load(Ordering::Relaxed);
        if last == NEVER_CHECK {
            return false;
        }
        let now = clock_ms();
        now.saturating_sub(last) >= PLACE_RECHECK.as_millis() as u64
            && self.place_checked_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// Drops the objects no request used since the previous sweep and none holds now; returns
/// how many. A cached descriptor keeps its inode alive, so without this a file that others
/// delete or replace keeps its disk space for as long as its entry stays cached (knfsd's
/// filecache closes idle files the same way).
pub fn sweep_idle(cache: &ObjectCache) -> usize {
    cache.retain(|o| Arc::strong_count(o) > 1 || o.used.swap(false, Ordering::Relaxed))
}

pub type ObjectCache = BoundedMap<ObjectId, Arc<CachedObject>>;

const SHARDS: usize = 16;

/// A map of at most about `capacity` entries, sharded so that threads working on
/// different keys rarely meet on a lock.
pub struct BoundedMap<K, V> {
    shards: Vec<Mutex<HashMap<K, V, Hashing>>>,
    per_shard: usize,
    /// Seeded apart from the shards' own, so keys of one shard still spread in its table.
    shard_hasher: Hashing,
}

/// Keys are kernel handles and inode numbers the file system assigns (handles from clients
/// are authenticated before any lookup), so a fast seeded hash is enough; SipHash was a
/// visible share of READDIRPLUS's profile.
type Hashing = foldhash::fast::RandomState;

impl<K: Hash + Eq + Copy, V: Clone> BoundedMap<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::default())).collect(),
            per_shard: (capacity / SHARDS).max(4),
            shard_hasher: Hashing::default(),
        }
    }

    fn shard(&self, key: &K) -> &Mutex<HashMap<K, V, Hashing>> {
        &self.shards[(self.shard_hasher.hash_one(key) as usize) % SHARDS]
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.shard(key).lock().get(key).cloned()
    }

    /// Inserts unless another thread won the race; returns the entry in the map either way.
    pub fn insert(&self, key: K, value: V) -> V {
        let mut shard = self.shard(&key).lock();
        if let Some(existing) = shard.get(&key) {
            return existing.clone();
        }
        if shard.len() >= self.per_shard {
            // Drop an arbitrary quarter: cheap, and (for objects) in-use entries stay
            // alive through their Arc until their requests finish.
            let victims: Vec<K> = shard.keys().take(self.per_shard / 4 + 1).copied().collect();
            for v in victims {
                shard.remove(&v);
            }
        }
        shard.insert(key, value.clone());
        value
    }

    /// Takes `key`'s entry out, handing it to the caller.
    pub fn remove(&self, key: &K) -> Option<V> {
        self.shard(key).lock().remove(key)
    }

    /// Keeps only the entries `keep` accepts; returns how many it dropped.
    pub fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut dropped = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|_, v| keep(v));
            dropped += before - shard.len();
        }
        dropped
    }
}

/// One incarnation of an inode: its number and its birth time. Inode numbers are reused
/// once a file is deleted, but a successor is born later, so the pair names one inode for
/// as long as the clock only moves forward.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct InodeKey {
    ino: u64,
    born_sec: i64,
    born_nsec: u32,
}

/// File systems stamp birth times from a clock that ticks every few milliseconds, so two
/// inodes born in one tick can share a birth time. An inode is keyed only once its birth is
/// further in the past than this: every inode born from then on has a later birth time.
pub(super) const BIRTH_TICK_MARGIN: Duration = Duration::from_millis(50);

impl InodeKey {
    /// The key of the inode `st` describes, if the file system reports birth times and the
    /// inode was born long enough ago (at `now`) to be told apart from any successor.
    pub fn of(st: &libc::statx, now: SystemTime) -> Option<Self> {
        if st.stx_mask & libc::STATX_BTIME == 0 || st.stx_btime.tv_sec < 0 {
            return None;
        }
        let born = SystemTime::UNIX_EPOCH + Duration::new(st.stx_btime.tv_sec as u64, st.stx_btime.tv_nsec);
        if born + BIRTH_TICK_MARGIN >= now {
            return None;
        }
        Some(Self { ino: st.stx_ino, born_sec: st.stx_btime.tv_sec, born_nsec: st.stx_btime.tv_nsec })
    }
}

/// Kernel handles by inode, for entries listed again (or first seen by LOOKUP or CREATE).
pub type HandleCache = BoundedMap<InodeKey, ObjectId>;

#[cfg(test)]
mod tests {
    use super::*;

    fn statx_born(ino: u64, sec: i64, nsec: u32, mask: u32) -> libc::statx {
        // SAFETY: statx is plain data; all-zero is a valid value.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        st.stx_mask = mask;
        st.stx_ino = ino;
        st.stx_btime.tv_sec = sec;
        st.stx_btime.tv_nsec = nsec;
        st
    }

    #[test]
    fn inodes_are_keyed_only_once_their_birth_tick_has_passed() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
        let old = statx_born(7, 999_999, 0, mask);
        assert!(InodeKey::of(&old, now).is_some());
        // Born 10 ms ago: a successor born in the same tick could get the same birth time.
        let young = statx_born(7, 999_999, 990_000_000, mask);
        assert_eq!(InodeKey::of(&young, now), None);
        // No birth time reported: no key.
        assert_eq!(InodeKey::of(&statx_born(7, 999_999, 0, libc::STATX_BASIC_STATS), now), None);
        // Same number, different birth: different inodes.
        assert_ne!(InodeKey::of(&old, now), InodeKey::of(&statx_born(7, 999_998, 0, mask), now));
    }

    fn object() -> Arc<CachedObject> {
        let fd = std::fs::File::open("/").expect("open /");
        CachedObject::new(OwnedFd::from(fd))
    }

    #[test]
    fn sweeps_drop_objects_unused_since_the_last_one_and_not_held() {
        let cache = ObjectCache::new(64);
        let (idle, busy, held) = (object(), object(), object());
        let id = |n: u8| ObjectId::new(&[n; 8]).expect("id");
        cache.insert(id(1), idle);
        cache.insert(id(2), busy.clone());
        cache.insert(id(3), held.clone());
        drop(busy);
        // New entries count as used: the first sweep keeps them all.
        assert_eq!(sweep_idle(&cache), 0);
        cache.get(&id(2)).expect("cached").touch();
        assert_eq!(sweep_idle(&cache), 1, "only the unused, unheld object goes");
        assert!(cache.get(&id(1)).is_none());
        assert!(cache.get(&id(2)).is_some(), "touched since the last sweep");
        assert!(cache.get(&id(3)).is_some(), "a request still holds it");
        drop(held);
        assert_eq!(sweep_idle(&cache), 1, "the touched object goes once a sweep passed without use");
        assert!(cache.get(&id(2)).is_none());
        // An object held through sweeps goes a whole period after it is let go.
        assert_eq!(sweep_idle(&cache), 1);
        assert!(cache.get(&id(3)).is_none());
    }

    #[test]
    fn bounded_map_stays_bounded_and_first_insert_wins() {
        let m: BoundedMap<u64, u64> = BoundedMap::new(64);
        assert_eq!(m.insert(1, 10), 10);
        assert_eq!(m.insert(1, 11), 10, "a racing insert gets the entry already there");
        for k in 0..10_000 {
            m.insert(k, k);
        }
        let total: usize = m.shards.iter().map(|s| s.lock().len()).sum();
        assert!(total <= 64, "{total} entries kept for a capacity of 64");
        m.remove(&9_999);
        assert_eq!(m.get(&9_999), None);
    }
}
