//! Open-object cache: kernel handle -> open descriptors, so a busy file costs no
//! `open_by_handle_at` per request (the role of knfsd's filecache).

use super::sync::SyncGroup;
use crate::vfs::ObjectId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// One cached object: an `O_PATH` descriptor that names it, lazily a descriptor open for
/// I/O (read-write for files, read-only for directories), and the group commit that
/// concurrent stable writes, COMMITs and directory changes share.
pub struct CachedObject {
    pub path_fd: OwnedFd,
    pub io_fd: Mutex<Option<Arc<OwnedFd>>>,
    pub sync: SyncGroup,
}

impl CachedObject {
    pub fn new(path_fd: OwnedFd) -> Self {
        Self { path_fd, io_fd: Mutex::new(None), sync: SyncGroup::default() }
    }
}

const SHARDS: usize = 16;

pub struct ObjectCache {
    shards: Vec<Mutex<HashMap<ObjectId, Arc<CachedObject>>>>,
    per_shard: usize,
}

impl ObjectCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: (capacity / SHARDS).max(4),
        }
    }

    fn shard(&self, id: &ObjectId) -> &Mutex<HashMap<ObjectId, Arc<CachedObject>>> {
        let b = id.as_bytes();
        let h = b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3));
        &self.shards[(h as usize) % SHARDS]
    }

    pub fn get(&self, id: &ObjectId) -> Option<Arc<CachedObject>> {
        self.shard(id).lock().get(id).cloned()
    }

    /// Inserts unless another thread won the race; returns the cached entry either way.
    pub fn insert(&self, id: ObjectId, obj: CachedObject) -> Arc<CachedObject> {
        let mut shard = self.shard(&id).lock();
        if let Some(existing) = shard.get(&id) {
            return existing.clone();
        }
        if shard.len() >= self.per_shard {
            // Drop an arbitrary quarter: cheap, and in-use objects stay alive through
            // their Arc until their requests finish.
            let victims: Vec<ObjectId> = shard.keys().take(self.per_shard / 4 + 1).copied().collect();
            for v in victims {
                shard.remove(&v);
            }
        }
        let obj = Arc::new(obj);
        shard.insert(id, obj.clone());
        obj
    }

    pub fn remove(&self, id: &ObjectId) {
        self.shard(id).lock().remove(id);
    }
}
