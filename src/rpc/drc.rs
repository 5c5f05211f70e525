//! Duplicate request cache: a retransmitted non-idempotent call (same client address,
//! XID, program, version, procedure and argument checksum) gets the original reply instead
//! of running again. The key leaves out the client's port and connection, so a retransmit
//! on a new connection after a reconnect is recognised too.
//!
//! With a [`Journal`], the replies of the calls a program names (namespace changes) are
//! also written to a file in the state directory, and a new server process starts with
//! them: a client whose reply was lost when the server died (killed, restarted for an
//! upgrade) sends the call again to the new process and gets the first answer, not
//! EEXIST for its CREATE or ENOENT for its REMOVE. The file is written without a sync:
//! it survives the process, not a power cut.

use super::Reply;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    journal: Option<Journal>,
}

/// Bytes per journal slot: a header and one reply (a CREATE's is about 300 bytes).
const SLOT: usize = 1024;
const MAGIC: [u8; 4] = *b"NDJ1";
/// magic, sequence, address, XID, program, version, procedure, argument length and
/// checksum, reply length, then the slot's own checksum.
const HEADER: usize = 4 + 8 + 16 + 4 * 4 + 8 + 16 + 2 + 8;

/// The replies kept across restarts: a file of fixed slots, written in turn (slot =
/// sequence number modulo the slot count), each with a checksum, so a slot half written
/// or left from another layout is skipped when read.
struct Journal {
    file: File,
    slots: u64,
    next: AtomicU64,
    warned: AtomicBool,
}

impl Journal {
    fn encode(seq: u64, key: &DrcKey, reply: &[u8]) -> Option<Vec<u8>> {
        if reply.len() > SLOT - HEADER {
            return None;
        }
        let ip = match key.client {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut b = Vec::with_capacity(SLOT);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&seq.to_be_bytes());
        b.extend_from_slice(&ip.octets());
        for word in [key.xid, key.program, key.version, key.procedure] {
            b.extend_from_slice(&word.to_be_bytes());
        }
        b.extend_from_slice(&(key.args_len as u64).to_be_bytes());
        b.extend_from_slice(&key.args_sum);
        b.extend_from_slice(&(reply.len() as u16).to_be_bytes());
        let sum_at = b.len();
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(reply);
        let sum = Self::checksum(&b, sum_at);
        b[sum_at..sum_at + 8].copy_from_slice(&sum);
        b.resize(SLOT, 0);
        Some(b)
    }

    /// blake3 of the slot with its checksum field taken as zeros.
    fn checksum(slot: &[u8], sum_at: usize) -> [u8; 8] {
        let mut h = blake3::Hasher::new();
        h.update(&slot[..sum_at]);
        h.update(&[0; 8]);
        h.update(&slot[sum_at + 8..]);
        h.finalize().as_bytes()[..8].try_into().expect("8 bytes")
    }

    fn decode(slot: &[u8]) -> Option<(u64, DrcKey, Vec<u8>)> {
        let word = |at: usize| u32::from_be_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_be_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
        if slot.len() != SLOT || slot[..4] != MAGIC {
            return None;
        }
        let len = u16::from_be_bytes([slot[HEADER - 10], slot[HEADER - 9]]) as usize;
        let sum_at = HEADER - 8;
        if len > SLOT - HEADER || slot[sum_at..HEADER] != Self::checksum(&slot[..HEADER + len], sum_at) {
            return None;
        }
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&slot[12..28]).expect("16 bytes"));
        let client = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        let key = DrcKey {
            client,
            xid: word(28),
            program: word(32),
            version: word(36),
            procedure: word(40),
            args_len: usize::try_from(long(44)).ok()?,
            args_sum: slot[52..68].try_into().expect("16 bytes"),
        };
        Some((long(4), key, slot[HEADER..HEADER + len].to_vec()))
    }

    /// Opens (or makes, mode 0600) the journal at `path` with `slots` slots, and returns
    /// the replies it holds, oldest first.
    fn open(path: &Path, slots: usize) -> std::io::Result<(Journal, Vec<(DrcKey, Vec<u8>)>)> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let slots = slots.max(1);
        let mut bytes = Vec::new();
        (&mut file).take((slots * SLOT) as u64).read_to_end(&mut bytes)?;
        let mut found: Vec<_> = bytes.chunks_exact(SLOT).filter_map(Self::decode).collect();
        found.sort_by_key(|(seq, ..)| *seq);
        let next = found.last().map_or(0, |(seq, ..)| seq + 1);
        file.set_len((slots * SLOT) as u64)?;
        let journal = Journal { file, slots: slots as u64, next: AtomicU64::new(next), warned: AtomicBool::new(false) };
        Ok((journal, found.into_iter().map(|(_, key, reply)| (key, reply)).collect()))
    }

    fn write(&self, key: &DrcKey, reply: &[u8]) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = Self::encode(seq, key, reply) else { return };
        if let Err(e) = self.file.write_all_at(&slot, (seq % self.slots) * SLOT as u64) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "writing the duplicate request journal failed: replies are kept in memory only");
            }
        }
    }
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
        Self { capacity: capacity.max(1), inner: Mutex::new(Inner::default()), hits: AtomicU64::new(0), journal: None }
    }

    /// A cache that keeps the replies `complete` is asked to keep in the journal at
    /// `path`, starting with those a previous process left there.
    pub fn with_journal(capacity: usize, path: &Path) -> std::io::Result<Self> {
        let (journal, kept) = Journal::open(path, capacity)?;
        let mut cache = Self::new(capacity);
        {
            let inner = cache.inner.get_mut();
            for (key, bytes) in kept {
                inner.make_room(cache.capacity);
                inner.insertions += 1;
                let insertion = inner.insertions;
                let reply = Arc::new(Reply { bytes, file: None });
                inner.entries.insert(key.clone(), Slot { entry: Entry::Done(reply), insertion });
                inner.order.push_back((key, insertion));
            }
        }
        cache.journal = Some(journal);
        Ok(cache)
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

    /// Records the reply of a call that ran; `keep` also writes it to the journal, if
    /// there is one (a reply carrying file data never is).
    pub fn complete(&self, key: &DrcKey, reply: Arc<Reply>, keep: bool) {
        if keep && reply.file.is_none() {
            if let Some(journal) = &self.journal {
                journal.write(key, &reply.bytes);
            }
        }
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

    pub fn capacity(&self) -> usize {
        self.capacity
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
        drc.complete(&k, reply(vec![1, 2, 3]), false);
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
            drc.complete(&key(x, b"a"), reply(vec![x as u8]), false);
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
        drc.complete(&key(2, b"a"), reply(vec![2]), false);
        // k would have blocked: abandoned and begun again, so it is now newer than 2.
        drc.abandon(&k);
        assert_eq!(drc.begin(&k), Lookup::New);
        drc.complete(&k, reply(vec![7]), false);
        assert_eq!(drc.begin(&key(3, b"a")), Lookup::New);
        drc.complete(&key(3, b"a"), reply(vec![3]), false);
        // Full: the next call to complete evicts the oldest live entry, 2, not k through
        // the stale place of its first insertion.
        assert_eq!(drc.begin(&key(4, b"a")), Lookup::New);
        drc.complete(&key(4, b"a"), reply(vec![4]), false);
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
            drc.complete(&key(x, b"a"), reply(vec![x as u8]), false);
        }
        assert_eq!(drc.begin(&running), Lookup::InProgress, "its retransmit must not run beside it");
        drc.complete(&running, reply(vec![1]), false);
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
            drc.complete(&key(x, b"a"), reply(vec![x as u8]), false);
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

    fn completed(drc: &DuplicateRequestCache, k: &DrcKey, bytes: Vec<u8>, keep: bool) {
        assert_eq!(drc.begin(k), Lookup::New);
        drc.complete(k, reply(bytes), keep);
    }

    #[test]
    fn a_new_cache_on_the_same_journal_replays_the_kept_replies_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let v6 = DrcKey::new("2001:db8::7".parse().unwrap(), 9, 100003, 3, 14, b"rename");
        {
            let drc = DuplicateRequestCache::with_journal(8, &path).unwrap();
            completed(&drc, &key(1, b"create"), vec![1; 300], true);
            completed(&drc, &key(2, b"write"), vec![2; 100], false);
            completed(&drc, &v6, vec![3; 40], true);
            completed(&drc, &key(4, b"huge"), vec![4; SLOT], true); // too big for a slot
        }
        let drc = DuplicateRequestCache::with_journal(8, &path).unwrap();
        assert_eq!(drc.begin(&key(1, b"create")), Lookup::Replay(reply(vec![1; 300])));
        assert_eq!(drc.begin(&v6), Lookup::Replay(reply(vec![3; 40])));
        assert_eq!(drc.begin(&key(2, b"write")), Lookup::New, "not asked to be kept");
        assert_eq!(drc.begin(&key(4, b"huge")), Lookup::New);
        // Same XID, other arguments: still a different call after the restart.
        assert_eq!(drc.begin(&key(1, b"other")), Lookup::New);
    }

    #[test]
    fn the_journal_keeps_the_newest_replies_and_skips_a_damaged_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        {
            let drc = DuplicateRequestCache::with_journal(4, &path).unwrap();
            for x in 0..10 {
                completed(&drc, &key(x, b"a"), vec![x as u8; 50], true);
            }
        }
        {
            // The slot of XID 8 (sequence 8 of 4 slots: slot 0) loses a byte of its reply.
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0xff], (HEADER + 3) as u64).unwrap();
        }
        let drc = DuplicateRequestCache::with_journal(4, &path).unwrap();
        for x in [6, 7, 9] {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::Replay(reply(vec![x as u8; 50])), "xid {x}");
        }
        assert_eq!(drc.begin(&key(5, b"a")), Lookup::New, "overwritten by a newer reply");
        assert_eq!(drc.begin(&key(8, b"a")), Lookup::New, "a damaged slot is not replayed");
        // Sequence numbers go on from the newest kept (9): the next reply takes the
        // slot of 6, the oldest, and 9 stays.
        drop(drc);
        let drc = DuplicateRequestCache::with_journal(4, &path).unwrap();
        completed(&drc, &key(20, b"a"), vec![20; 10], true);
        drop(drc);
        let drc = DuplicateRequestCache::with_journal(4, &path).unwrap();
        assert_eq!(drc.begin(&key(6, b"a")), Lookup::New);
        assert_eq!(drc.begin(&key(20, b"a")), Lookup::Replay(reply(vec![20; 10])));
        assert_eq!(drc.begin(&key(9, b"a")), Lookup::Replay(reply(vec![9; 50])));
    }
}
