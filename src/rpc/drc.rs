//! Duplicate request cache: a retransmitted non-idempotent call (same client address,
//! XID, program, version, procedure and argument checksum) gets the original reply instead
//! of running again. The key leaves out the client's port and connection, so a retransmit
//! on a new connection after a reconnect is recognised too.

use super::Reply;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of arguments covered by the checksum; with the total length this tells apart
/// reused XIDs without hashing a whole 1 MiB WRITE (256 bytes hold a WRITE's handle,
/// offset, count and the first ~150 bytes of its data).
const CHECKSUM_PREFIX: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrcKey {
    client: IpAddr,
    xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    args_len: usize,
    args_sum: [u8; 16],
}

/// Tables hash the key through its checksum and XID alone (one word, with the table's
/// random keys); equality still compares every field.
impl std::hash::Hash for DrcKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let sum = u64::from_le_bytes(self.args_sum[..8].try_into().expect("8 bytes"));
        state.write_u64(sum ^ u64::from(self.xid));
    }
}

impl DrcKey {
    pub fn new(client: IpAddr, xid: u32, program: u32, version: u32, procedure: u32, args: &[u8]) -> Self {
        let head = &args[..args.len().min(CHECKSUM_PREFIX)];
        let sum = blake3::hash(head);
        let mut args_sum = [0u8; 16];
        args_sum.copy_from_slice(&sum.as_bytes()[..16]);
        Self { client, xid, program, version, procedure, args_len: args.len(), args_sum }
    }
}

#[derive(Debug, Clone)]
enum Entry {
    InProgress,
    Done(Arc<Reply>),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// First sighting: run the call, then `complete` or `abandon` it.
    New,
    /// The original is still running: drop this copy, the client will retransmit.
    InProgress,
    /// Already answered: send this framed reply again.
    Replay(Arc<Reply>),
}

pub struct DuplicateRequestCache {
    capacity: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
}

/// An entry and the number of the insertion that made it.
struct Slot {
    entry: Entry,
    insertion: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<DrcKey, Slot>,
    /// Insertions, oldest first. A key abandoned and begun again is here twice; only the
    /// place whose number its slot still carries may evict it.
    order: VecDeque<(DrcKey, u64)>,
    insertions: u64,
}

impl Inner {
    /// Drops the oldest answered calls until one more entry fits. A call still running
    /// keeps its entry, as in knfsd: evicted, its retransmit would run a second time
    /// beside it. While every entry is running the cache grows past its capacity; running
    /// calls are bounded by the server's requests in flight.
    fn make_room(&mut self, capacity: usize) {
        let mut running = 0;
        while self.entries.len() >= capacity && running < self.order.len() {
            let Some((old, number)) = self.order.pop_front() else { break };
            match self.entries.get(&old) {
                Some(slot) if slot.insertion == number => match slot.entry {
                    Entry::Done(_) => {
                        self.entries.remove(&old);
                    }
                    Entry::InProgress => {
                        self.order.push_back((old, number));
                        running += 1;
                    }
                },
                // The stale place of a key abandoned and begun again.
                _ => {}
            }
        }
    }
}

impl DuplicateRequestCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), inner: Mutex::new(Inner::default()), hits: AtomicU64::new(0) }
    }

    pub fn begin(&self, key: &DrcKey) -> Lookup {
        let mut inner = self.inner.lock();
        match inner.entries.get(key).map(|slot| &slot.entry) {
            Some(Entry::InProgress) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Lookup::InProgress
            }
            Some(Entry::Done(reply)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Lookup::Replay(reply.clone())
            }
            None => {
                // Room is made when the call completes: a call that is refused or
                // abandoned (which anyone can send) then never pushes out a real reply.
                // Abandoned keys leave stale copies behind; drop them before they pile up.
                if inner.order.len() >= 2 * self.capacity {
                    let Inner { entries, order, .. } = &mut *inner;
                    order.retain(|(k, n)| entries.get(k).is_some_and(|slot| slot.insertion == *n));
                }
                inner.insertions += 1;
                let insertion = inner.insertions;
                inner.entries.insert(key.clone(), Slot { entry: Entry::InProgress, insertion });
                inner.order.push_back((key.clone(), insertion));
                Lookup::New
            }
        }
    }

    pub fn complete(&self, key: &DrcKey, reply: Arc<Reply>) {
        let mut inner = self.inner.lock();
        // This call's entry is still running, so it is not the one evicted.
        inner.make_room(self.capacity + 1);
        if let Some(slot) = inner.entries.get_mut(key) {
            slot.entry = Entry::Done(reply);
        }
    }

    /// Forgets a call that produced no reply, so a retransmit runs it.
    pub fn abandon(&self, key: &DrcKey) {
        let mut inner = self.inner.lock();
        if matches!(inner.entries.get(key), Some(Slot { entry: Entry::InProgress, .. })) {
            inner.entries.remove(key);
        }
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(bytes: Vec<u8>) -> Arc<Reply> {
        Arc::new(Reply { bytes, file: None })
    }

    fn key(xid: u32, args: &[u8]) -> DrcKey {
        DrcKey::new("127.0.0.1".parse().unwrap(), xid, 100003, 3, 8, args)
    }

    #[test]
    fn replays_completed_and_drops_in_progress() {
        let drc = DuplicateRequestCache::new(4);
        let k = key(1, b"args");
        assert_eq!(drc.begin(&k), Lookup::New);
        assert_eq!(drc.begin(&k), Lookup::InProgress);
        drc.complete(&k, reply(vec![1, 2, 3]));
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![1, 2, 3])));
        assert_eq!(drc.hits(), 2);
        // Same XID, different arguments: a different call.
        assert_eq!(drc.begin(&key(1, b"other")), Lookup::New);
    }

    #[test]
    fn bounded_and_abandon_forgets() {
        let drc = DuplicateRequestCache::new(3);
        for x in 0..10 {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::New);
            drc.complete(&key(x, b"a"), reply(vec![x as u8]));
        }
        assert_eq!(drc.len(), 3);
        assert_eq!(drc.begin(&key(0, b"a")), Lookup::New, "oldest evicted");
        let k = key(99, b"z");
        assert_eq!(drc.begin(&k), Lookup::New);
        drc.abandon(&k);
        assert_eq!(drc.begin(&k), Lookup::New);
    }

    #[test]
    fn an_abandoned_and_restarted_call_keeps_its_place() {
        let drc = DuplicateRequestCache::new(3);
        let k = key(1, b"write");
        assert_eq!(drc.begin(&k), Lookup::New);
        assert_eq!(drc.begin(&key(2, b"a")), Lookup::New);
        drc.complete(&key(2, b"a"), reply(vec![2]));
        // k would have blocked: abandoned and begun again, so it is now newer than 2.
        drc.abandon(&k);
        assert_eq!(drc.begin(&k), Lookup::New);
        drc.complete(&k, reply(vec![7]));
        assert_eq!(drc.begin(&key(3, b"a")), Lookup::New);
        drc.complete(&key(3, b"a"), reply(vec![3]));
        // Full: the next call to complete evicts the oldest live entry, 2, not k through
        // the stale place of its first insertion.
        assert_eq!(drc.begin(&key(4, b"a")), Lookup::New);
        drc.complete(&key(4, b"a"), reply(vec![4]));
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![7])), "evicted through its stale place");
        assert_eq!(drc.begin(&key(2, b"a")), Lookup::New, "2 was the oldest");
    }

    #[test]
    fn a_call_still_running_is_not_evicted() {
        let drc = DuplicateRequestCache::new(2);
        let running = key(1, b"remove");
        assert_eq!(drc.begin(&running), Lookup::New);
        // A flood of answered calls pushes out answered calls only.
        for x in 2..100 {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::New);
            drc.complete(&key(x, b"a"), reply(vec![x as u8]));
        }
        assert_eq!(drc.begin(&running), Lookup::InProgress, "its retransmit must not run beside it");
        drc.complete(&running, reply(vec![1]));
        assert_eq!(drc.begin(&running), Lookup::Replay(reply(vec![1])));
        // With every entry running, one more call is still taken in.
        let drc = DuplicateRequestCache::new(2);
        for x in 0..3 {
            assert_eq!(drc.begin(&key(x, b"r")), Lookup::New);
        }
        assert_eq!(drc.len(), 3);
        for x in 0..3 {
            assert_eq!(drc.begin(&key(x, b"r")), Lookup::InProgress);
        }
    }

    #[test]
    fn calls_that_are_abandoned_evict_nothing_from_a_full_cache() {
        let drc = DuplicateRequestCache::new(4);
        for x in 0..4 {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::New);
            drc.complete(&key(x, b"a"), reply(vec![x as u8]));
        }
        for x in 100..200 {
            assert_eq!(drc.begin(&key(x, b"refused")), Lookup::New);
            drc.abandon(&key(x, b"refused"));
        }
        assert_eq!(drc.begin(&key(0, b"a")), Lookup::Replay(reply(vec![0])), "the oldest real reply was pushed out");
    }

    #[test]
    fn abandoned_calls_do_not_grow_the_eviction_order() {
        let drc = DuplicateRequestCache::new(8);
        // Calls that produce no reply are abandoned; the cache never fills, so nothing
        // is evicted, yet their places in the eviction order must not pile up.
        for x in 0..10_000 {
            let k = key(x, b"w");
            assert_eq!(drc.begin(&k), Lookup::New);
            drc.abandon(&k);
        }
        let order = drc.inner.lock().order.len();
        assert!(order <= 2 * 8, "the eviction order holds {order} places for an empty cache");
        assert!(drc.is_empty());
    }
}
