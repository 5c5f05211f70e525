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
//!
//! Where a memory file system (tmpfs) is at hand, the writes go to a file there (the
//! live journal, which survives the process but not the boot) and are copied to the
//! state directory's within [`MIRROR_DELAY`], and at a clean stop. A reply is then not
//! a page for the next `syncfs` of the state directory's file system to write: where an
//! export on that file system has no journal, every namespace change is made durable
//! with `syncfs`, and the journal's page cost each such change a write and its wait
//! (about 80 µs on a virtio disk, docs/performance.md). A new process of the same boot
//! starts from the live journal, one after a reboot from the state directory's copy.
//!
//! A change's reply is written twice: once made, before the change is durable (the
//! directory's sync is most of such a call's time, so that is when a kill most likely
//! comes), and again once it is. A reply of the first kind is replayed only by a process
//! of the same boot, after the change has been made durable at start: the change then
//! survives in the kernel's page cache. After a power cut it may be gone, and so is the
//! reply.

use super::Reply;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Tables hash the key through its checksum, XID, length, procedure and client, not the
/// whole checksum or program: every field a client can vary while keeping the others
/// must reach the hash, or calls that differ only there (arguments padded past the
/// checksummed prefix, one XID from many procedures) would share one probe chain that
/// every lookup scans under the cache's lock.
impl std::hash::Hash for DrcKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let sum = u64::from_le_bytes(self.args_sum[..8].try_into().expect("8 bytes"));
        state.write_u64(sum ^ u64::from(self.xid) ^ ((self.args_len as u64) << 32));
        state.write_u32(self.procedure);
        self.client.hash(state);
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
    /// `kept_at`: the journal sequence number its reply was put aside under, if it was.
    InProgress {
        kept_at: Option<u64>,
    },
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
const MAGIC: [u8; 4] = *b"NDJ2";
/// magic, sequence, boot, state, address, XID, program, version, procedure, argument
/// length and checksum, reply length, then the slot's own checksum.
const HEADER: usize = 4 + 8 + 16 + 1 + 16 + 4 * 4 + 8 + 16 + 2 + 8;
/// Slots of the first layout (nasd before replies were put aside ahead of their sync):
/// no boot or state, every reply written once its change was durable.
const MAGIC_V1: [u8; 4] = *b"NDJ1";
const HEADER_V1: usize = HEADER - 16 - 1;
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// How far a kept reply's change had got when the reply was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Made, and perhaps not yet durable.
    Made = 1,
    /// Durable (or failed, and the reply says so).
    Durable = 2,
}

/// The replies kept across restarts: a file of fixed slots, written in turn (slot =
/// sequence number modulo the slot count), each with a checksum, so a slot half written
/// or left from another layout is skipped when read.
struct Journal {
    /// The file replies are written to: the state directory's journal, or the live one.
    file: File,
    slots: u64,
    next: AtomicU64,
    warned: AtomicBool,
    /// This boot of the kernel, if known: a reply written before its change was durable
    /// is trusted only by a later process of the same boot.
    boot: Option<[u8; 16]>,
    /// With a live journal: what copies its slots to the state directory's.
    mirror: Option<Mirror>,
}

/// Where the duplicate request journal is kept.
#[derive(Debug, Clone, Copy)]
pub enum JournalPlace<'a> {
    /// Written straight to this file of the state directory.
    Direct(&'a Path),
    /// Written to `live`, a file on a memory file system, and copied from there to
    /// `kept`, in the state directory, within [`MIRROR_DELAY`] and at a clean stop.
    Mirrored { live: &'a Path, kept: &'a Path },
}

/// How long replies written to the live journal wait to be copied to the state
/// directory's together: one page for a later `syncfs` to write, instead of one for
/// every change. A power cut can take the replies of this last stretch (with their
/// calls' retransmissions then answered by what is true, as from knfsd, whose cache
/// keeps nothing across a restart at all).
pub const MIRROR_DELAY: Duration = Duration::from_millis(100);

/// Most slots the copier moves with one read and one write (64 KiB).
const COPY_RUN: usize = 64;

/// One reply read back from the journal.
struct Found {
    seq: u64,
    key: DrcKey,
    reply: Vec<u8>,
    kept: Kept,
    this_boot: bool,
}

/// Sorts `found` by sequence number and drops all but the newest `count`.
fn keep_newest(found: &mut Vec<Found>, count: usize) {
    found.sort_by_key(|f| f.seq);
    let excess = found.len().saturating_sub(count);
    found.drain(..excess);
}

/// The kernel's boot id, hashed to 16 bytes; `None` where it cannot be read.
fn kernel_boot() -> Option<[u8; 16]> {
    let id = std::fs::read_to_string(KERNEL_BOOT_ID).ok()?;
    Some(blake3::hash(id.trim().as_bytes()).as_bytes()[..16].try_into().expect("16 bytes"))
}

impl Journal {
    fn encode(&self, seq: u64, key: &DrcKey, reply: &[u8], kept: Kept) -> Option<Vec<u8>> {
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
        b.extend_from_slice(&self.boot.unwrap_or_default());
        b.push(kept as u8);
        b.extend_from_slice(&ip.octets());
        for word in [key.xid, key.program, key.version, key.procedure] {
            b.extend_from_slice(&word.to_be_bytes());
        }
        b.extend_from_slice(&(key.args_len as u64).to_be_bytes());
        b.extend_from_slice(&key.args_sum);
        b.extend_from_slice(&(reply.len() as u16).to_be_bytes());
        let sum_at = b.len();
        b.extend_from_slice(&[0; 8]);
        debug_assert_eq!(b.len(), HEADER);
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

    fn decode(&self, slot: &[u8]) -> Option<Found> {
        if slot.len() != SLOT {
            return None;
        }
        let (header, v1) = match <[u8; 4]>::try_from(&slot[..4]).expect("4 bytes") {
            MAGIC => (HEADER, false),
            MAGIC_V1 => (HEADER_V1, true),
            _ => return None,
        };
        let len = u16::from_be_bytes([slot[header - 10], slot[header - 9]]) as usize;
        let sum_at = header - 8;
        if len > SLOT - header || slot[sum_at..header] != Self::checksum(&slot[..header + len], sum_at) {
            return None;
        }
        let mut at = 4;
        let mut take = |n: usize| {
            at += n;
            &slot[at - n..at]
        };
        let word = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
        let long = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        let seq = long(take(8));
        let (boot, kept) = if v1 {
            (None, Kept::Durable)
        } else {
            let boot: [u8; 16] = take(16).try_into().expect("16 bytes");
            let kept = match take(1)[0] {
                1 => Kept::Made,
                2 => Kept::Durable,
                _ => return None,
            };
            (Some(boot), kept)
        };
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(take(16)).expect("16 bytes"));
        let client = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        let key = DrcKey {
            client,
            xid: word(take(4)),
            program: word(take(4)),
            version: word(take(4)),
            procedure: word(take(4)),
            args_len: usize::try_from(long(take(8))).ok()?,
            args_sum: take(16).try_into().expect("16 bytes"),
        };
        let this_boot = boot.is_some() && self.boot == boot;
        Some(Found { seq, key, reply: slot[header..header + len].to_vec(), kept, this_boot })
    }

    /// Opens (or makes, mode 0600) the journal at `path` with `slots` slots, and returns
    /// the replies it holds, oldest first. `boot`: this boot of the kernel, if known.
    fn open(path: &Path, slots: usize, boot: Option<[u8; 16]>) -> std::io::Result<(Journal, Vec<Found>)> {
        use std::io::Read;
        let file = crate::fh::open_private_file(path)?;
        let slots = slots.max(1);
        let laid_out = (slots * SLOT) as u64;
        let length = file.metadata()?.len();
        let mut journal =
            Journal { file, slots: slots as u64, next: AtomicU64::new(0), warned: AtomicBool::new(false), boot, mirror: None };
        // Read slot by slot (a journal of another slot count can be of any size), keeping
        // the newest `slots` replies.
        let mut found = Vec::new();
        let mut reader = std::io::BufReader::with_capacity(64 * SLOT, (&journal.file).take(length - length % SLOT as u64));
        let mut slot = vec![0u8; SLOT];
        loop {
            match reader.read_exact(&mut slot) {
                Ok(()) => found.extend(journal.decode(&slot)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
            if found.len() >= 2 * slots {
                keep_newest(&mut found, slots);
            }
        }
        drop(reader);
        keep_newest(&mut found, slots);
        if length == 0 {
            journal.file.set_len(laid_out)?;
        } else if length != laid_out {
            // A reply's slot is its sequence number modulo the slot count, which is not
            // the one this file was written with: lay the replies out anew, numbered from
            // 0 in their order, or they would be read from and cleared in wrong slots.
            // A reply put aside by an earlier boot is dropped when read anyway; the rest
            // are written with this boot's id, which they had or do not depend on. One
            // too big for a slot of this layout (written by the first) is dropped.
            found.retain(|f| f.kept == Kept::Durable || f.this_boot);
            let mut laid = Vec::with_capacity(found.len());
            for mut f in found {
                f.seq = laid.len() as u64;
                if let Some(slot) = journal.encode(f.seq, &f.key, &f.reply, f.kept) {
                    laid.push((f, slot));
                }
            }
            journal.file = crate::fh::replace_private_file(path, |file| {
                file.set_len(laid_out)?;
                laid.iter().try_for_each(|(f, slot)| file.write_all_at(slot, f.seq * SLOT as u64))
            })?;
            found = laid.into_iter().map(|(f, _)| f).collect();
            tracing::info!(
                replies = found.len(),
                slots,
                "the duplicate request journal was laid out for another number of entries: rewritten"
            );
        }
        journal.next = AtomicU64::new(found.last().map_or(0, |f| f.seq + 1));
        Ok((journal, found))
    }

    /// Opens the journal at `place` ([`Self::open`]). Mirrored: from the live journal
    /// where there is one (this boot's newest), else from the state directory's copy
    /// (after a reboot, which empties the memory file system); the other file is
    /// then made a copy of it, and the live one is written from here on.
    fn open_at(place: JournalPlace, slots: usize, boot: Option<[u8; 16]>) -> std::io::Result<(Journal, Vec<Found>)> {
        let (live, kept) = match place {
            JournalPlace::Direct(path) => return Self::open(path, slots, boot),
            JournalPlace::Mirrored { live, kept } => (live, kept),
        };
        let from_live = std::fs::symlink_metadata(live).is_ok();
        let (mut journal, found) = Self::open(if from_live { live } else { kept }, slots, boot)?;
        let length = journal.slots * SLOT as u64;
        let (live_file, kept_file) = if from_live {
            // A kill can leave replies the copy had not reached yet.
            let kept_file = crate::fh::open_private_file(kept)?;
            kept_file.set_len(0)?;
            kept_file.set_len(length)?;
            copy_slots(&journal.file, &kept_file, length)?;
            (journal.file, kept_file)
        } else {
            // Put in place whole, so a start that dies half way leaves none (its syncs
            // cost a memory file system nothing).
            let live_file = crate::fh::replace_private_file(live, |file| {
                file.set_len(length)?;
                copy_slots(&journal.file, file, length)
            })?;
            (live_file, journal.file)
        };
        journal.mirror = Some(Mirror::start(live_file.try_clone()?, kept_file)?);
        journal.file = live_file;
        Ok((journal, found))
    }

    /// A sequence number, and so a slot, for a reply to be written.
    fn take_seq(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes the reply to its slot; false if it does not fit one.
    fn write(&self, seq: u64, key: &DrcKey, reply: &[u8], kept: Kept) -> bool {
        let Some(slot) = self.encode(seq, key, reply, kept) else { return false };
        self.write_slot(seq, &slot);
        true
    }

    /// Whether the slot of `seq` is still its own: a call whose sync lasted while as many
    /// replies as there are slots were written has lost it to a newer reply.
    fn still_holds(&self, seq: u64) -> bool {
        self.next.load(Ordering::Relaxed) - seq <= self.slots
    }

    /// Empties the slot of a reply put aside for a call that then gave none (or one that
    /// does not fit), unless a newer reply has taken it since.
    fn clear(&self, seq: u64) {
        if self.still_holds(seq) {
            self.write_slot(seq, &[0; SLOT]);
        }
    }

    fn write_slot(&self, seq: u64, slot: &[u8]) {
        let index = seq % self.slots;
        if let Err(e) = self.file.write_all_at(slot, index * SLOT as u64) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "writing the duplicate request journal failed: replies are kept in memory only");
            }
            return;
        }
        // Marked once written: a copy that runs between the two copies it the next time.
        if let Some(mirror) = &self.mirror {
            mirror.copy_later(index);
        }
    }
}

/// Copies the slots of `from` that hold anything to `to`, over the first `length` bytes.
fn copy_slots(from: &File, to: &File, length: u64) -> std::io::Result<()> {
    let mut chunk = vec![0u8; 64 * SLOT];
    let mut at = 0;
    while at < length {
        let n = chunk.len().min((length - at) as usize);
        from.read_exact_at(&mut chunk[..n], at)?;
        for (i, slot) in chunk[..n].chunks(SLOT).enumerate() {
            if slot.iter().any(|&b| b != 0) {
                to.write_all_at(slot, at + (i * SLOT) as u64)?;
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// Copies the slots written to the live journal to the state directory's, on a thread
/// of its own, [`MIRROR_DELAY`] after the first of them; and all that are left when it
/// is dropped, which waits for that.
struct Mirror {
    files: Arc<MirrorFiles>,
    wake: Option<SyncSender<()>>,
    copier: Option<std::thread::JoinHandle<()>>,
}

struct MirrorFiles {
    live: File,
    kept: File,
    /// Slots written to the live journal and not copied since.
    pending: Mutex<std::collections::BTreeSet<u64>>,
    /// Held by a copy, so that two never write one slot out of order.
    copying: Mutex<()>,
    warned: AtomicBool,
    /// Times the copier was woken, and copies made (the tests count them).
    wakes: AtomicU64,
    copies: AtomicU64,
}

impl MirrorFiles {
    fn copy_pending(&self) -> std::io::Result<()> {
        let _copying = self.copying.lock();
        let pending = std::mem::take(&mut *self.pending.lock());
        self.copies.fetch_add(1, Ordering::Relaxed);
        // Slots are taken in turn around the ring, so a stretch's are mostly adjacent:
        // each run of them is copied with one read and one write.
        let mut run = Vec::with_capacity(COPY_RUN * SLOT);
        let mut indices = pending.into_iter().peekable();
        while let Some(first) = indices.next() {
            let mut len = 1;
            while len < COPY_RUN && indices.next_if_eq(&(first + len as u64)).is_some() {
                len += 1;
            }
            run.resize(len * SLOT, 0);
            let at = first * SLOT as u64;
            self.live.read_exact_at(&mut run, at)?;
            self.kept.write_all_at(&run, at)?;
        }
        Ok(())
    }

    fn copy_or_warn(&self) {
        if let Err(e) = self.copy_pending() {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "copying the duplicate request journal to the state directory failed: replies written since survive the process, not a reboot");
            }
        }
    }
}

impl Mirror {
    fn start(live: File, kept: File) -> std::io::Result<Self> {
        let files = Arc::new(MirrorFiles {
            live,
            kept,
            pending: Mutex::new(Default::default()),
            copying: Mutex::new(()),
            warned: AtomicBool::new(false),
            wakes: AtomicU64::new(0),
            copies: AtomicU64::new(0),
        });
        let (wake, woken) = sync_channel::<()>(1);
        let copied = files.clone();
        let copier = std::thread::Builder::new().name("nasd-drc-copy".into()).spawn(move || {
            while woken.recv().is_ok() {
                // The writes of the next stretch go in the same copy; a stop ends it.
                let until = Instant::now() + MIRROR_DELAY;
                let stopped = loop {
                    match woken.recv_timeout(until.saturating_duration_since(Instant::now())) {
                        Ok(()) => continue,
                        Err(RecvTimeoutError::Timeout) => break false,
                        Err(RecvTimeoutError::Disconnected) => break true,
                    }
                };
                copied.copy_or_warn();
                if stopped {
                    return;
                }
            }
            copied.copy_or_warn();
        })?;
        Ok(Self { files, wake: Some(wake), copier: Some(copier) })
    }

    fn copy_later(&self, index: u64) {
        let starts_stretch = {
            let mut pending = self.files.pending.lock();
            let was_empty = pending.is_empty();
            pending.insert(index);
            was_empty
        };
        // Only the first slot of a stretch wakes the copier: the later ones are in the set
        // its copy takes (the copy empties the set under the same lock, so a slot written
        // after it starts the next stretch). Waking it for every write cost each namespace
        // change two thread wake-ups on its way to the reply.
        if starts_stretch {
            if let Some(wake) = &self.wake {
                self.files.wakes.fetch_add(1, Ordering::Relaxed);
                // Full: a wake-up is already waiting, and its copy takes this slot too.
                let _ = wake.try_send(());
            }
        }
    }

    /// Copies what is left now and makes the copy durable (a clean stop).
    fn flush(&self) -> std::io::Result<()> {
        self.files.copy_pending()?;
        self.files.kept.sync_data()
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(copier) = self.copier.take() {
            let _ = copier.join();
        }
    }
}

/// Where a call's reply is put aside before its change is durable: the journal, under the
/// call's key. Handed to the procedure with the call ([`super::CallContext`]).
#[derive(Clone, Copy)]
pub struct EarlyReply<'a> {
    cache: &'a DuplicateRequestCache,
    key: &'a DrcKey,
}

impl EarlyReply<'_> {
    /// Puts the framed reply aside (see [`DuplicateRequestCache::keep_before_durable`]).
    pub fn keep(&self, reply: &[u8]) {
        self.cache.keep_before_durable(self.key, reply);
    }
}

impl std::fmt::Debug for EarlyReply<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyReply").field("key", self.key).finish()
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
                    Entry::InProgress { .. } => {
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
    /// `path`, starting with those a previous process left there. Replies written before
    /// their change was durable are taken only from a process of this boot, and only if
    /// `make_all_durable` (called once, if there are any) makes every change durable and
    /// says so.
    pub fn with_journal(capacity: usize, path: &Path, make_all_durable: impl FnOnce() -> bool) -> std::io::Result<Self> {
        Self::with_journal_at(capacity, JournalPlace::Direct(path), make_all_durable)
    }

    /// [`Self::with_journal`], with the journal at `place`.
    pub fn with_journal_at(capacity: usize, place: JournalPlace, make_all_durable: impl FnOnce() -> bool) -> std::io::Result<Self> {
        Self::with_journal_of_boot(capacity, place, kernel_boot(), make_all_durable)
    }

    fn with_journal_of_boot(
        capacity: usize,
        place: JournalPlace,
        boot: Option<[u8; 16]>,
        make_all_durable: impl FnOnce() -> bool,
    ) -> std::io::Result<Self> {
        let (journal, found) = Journal::open_at(place, capacity, boot)?;
        let unsettled = found.iter().filter(|f| f.kept == Kept::Made && f.this_boot).count();
        let settled = unsettled > 0 && make_all_durable();
        if settled {
            tracing::info!(
                replies = unsettled,
                "replies put aside by an earlier process before their changes were durable: made durable, kept"
            );
        } else if unsettled > 0 {
            tracing::warn!(
                replies = unsettled,
                "replies put aside by an earlier process before their changes were durable: the changes could not be made durable, dropped"
            );
        }
        let mut cache = Self::new(capacity);
        {
            let inner = cache.inner.get_mut();
            for f in found {
                if f.kept == Kept::Made {
                    if f.this_boot && settled {
                        journal.write(f.seq, &f.key, &f.reply, Kept::Durable);
                    } else {
                        // Its change may have been lost with the page cache, or not be
                        // durable: run again, the call answers what is now true.
                        journal.clear(f.seq);
                        continue;
                    }
                }
                inner.make_room(cache.capacity);
                inner.insertions += 1;
                let insertion = inner.insertions;
                let reply = Arc::new(Reply { bytes: f.reply, file: None });
                inner.entries.insert(f.key.clone(), Slot { entry: Entry::Done(reply), insertion });
                inner.order.push_back((f.key, insertion));
            }
        }
        cache.journal = Some(journal);
        Ok(cache)
    }

    /// At a clean stop: the replies written to a live journal, copied to the state
    /// directory's and made durable there, so that they outlive a reboot that follows.
    pub fn flush_journal(&self) -> std::io::Result<()> {
        match self.journal.as_ref().and_then(|j| j.mirror.as_ref()) {
            Some(mirror) => mirror.flush(),
            None => Ok(()),
        }
    }

    /// Where the procedure of the call `key` puts its reply aside before its change is
    /// durable; `None` without a journal.
    pub fn early_reply<'a>(&'a self, key: &'a DrcKey) -> Option<EarlyReply<'a>> {
        self.journal.is_some().then_some(EarlyReply { cache: self, key })
    }

    /// Writes the framed reply of the running call `key`, whose change is made but perhaps
    /// not durable, to the journal; [`Self::complete`] writes its final reply to the same
    /// slot.
    pub fn keep_before_durable(&self, key: &DrcKey, reply: &[u8]) {
        let Some(journal) = &self.journal else { return };
        let seq = {
            let mut inner = self.inner.lock();
            match inner.entries.get_mut(key).map(|slot| &mut slot.entry) {
                Some(Entry::InProgress { kept_at }) => *kept_at.get_or_insert_with(|| journal.take_seq()),
                _ => return,
            }
        };
        journal.write(seq, key, reply, Kept::Made);
    }

    /// The journal slot the running call `key` put its reply aside in, if it did.
    fn kept_at(&self, key: &DrcKey) -> Option<u64> {
        match self.inner.lock().entries.get(key).map(|slot| &slot.entry) {
            Some(Entry::InProgress { kept_at }) => *kept_at,
            _ => None,
        }
    }

    pub fn begin(&self, key: &DrcKey) -> Lookup {
        let mut inner = self.inner.lock();
        match inner.entries.get(key).map(|slot| &slot.entry) {
            Some(Entry::InProgress { .. }) => {
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
                inner.entries.insert(key.clone(), Slot { entry: Entry::InProgress { kept_at: None }, insertion });
                inner.order.push_back((key.clone(), insertion));
                Lookup::New
            }
        }
    }

    /// Records the reply of a call that ran; `keep` also writes it to the journal, if
    /// there is one (a reply carrying file data never is).
    pub fn complete(&self, key: &DrcKey, reply: Arc<Reply>, keep: bool) {
        if let Some(journal) = &self.journal {
            let kept_at = self.kept_at(key);
            if keep && reply.file.is_none() {
                // The slot the reply was put aside in, unless a newer reply has it now.
                let seq = kept_at.filter(|&seq| journal.still_holds(seq)).unwrap_or_else(|| journal.take_seq());
                if !journal.write(seq, key, &reply.bytes, Kept::Durable) {
                    if let Some(seq) = kept_at {
                        journal.clear(seq);
                    }
                }
            } else if let Some(seq) = kept_at {
                journal.clear(seq);
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
        if let Some(Slot { entry: Entry::InProgress { kept_at }, .. }) = inner.entries.get(key) {
            let kept_at = *kept_at;
            inner.entries.remove(key);
            drop(inner);
            if let (Some(journal), Some(seq)) = (&self.journal, kept_at) {
                journal.clear(seq);
            }
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
    fn keys_that_differ_in_any_field_a_client_picks_hash_apart() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        let prefix = vec![7u8; CHECKSUM_PREFIX];
        let mut seen = std::collections::HashSet::new();
        for extra in 0..512usize {
            let mut args = prefix.clone();
            args.resize(CHECKSUM_PREFIX + 4 * extra, 0);
            seen.insert(hasher.hash_one(key(1, &args)));
        }
        assert_eq!(seen.len(), 512, "calls padded past the checksum must not share one hash");
        let procedures: std::collections::HashSet<u64> =
            (0..22).map(|p| hasher.hash_one(DrcKey::new("127.0.0.1".parse().unwrap(), 1, 100003, 3, p, &prefix))).collect();
        assert_eq!(procedures.len(), 22);
        let clients: std::collections::HashSet<u64> =
            (1..=200u8).map(|c| hasher.hash_one(DrcKey::new(std::net::IpAddr::from([10, 0, 0, c]), 1, 100003, 3, 7, &prefix))).collect();
        assert_eq!(clients.len(), 200);
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
        let (_dir, path) = scratch_journal();
        let v6 = DrcKey::new("2001:db8::7".parse().unwrap(), 9, 100003, 3, 14, b"rename");
        {
            let drc = DuplicateRequestCache::with_journal(8, &path, || true).unwrap();
            completed(&drc, &key(1, b"create"), vec![1; 300], true);
            completed(&drc, &key(2, b"write"), vec![2; 100], false);
            completed(&drc, &v6, vec![3; 40], true);
            completed(&drc, &key(4, b"huge"), vec![4; SLOT], true); // too big for a slot
        }
        let drc = DuplicateRequestCache::with_journal(8, &path, || true).unwrap();
        assert_eq!(drc.begin(&key(1, b"create")), Lookup::Replay(reply(vec![1; 300])));
        assert_eq!(drc.begin(&v6), Lookup::Replay(reply(vec![3; 40])));
        assert_eq!(drc.begin(&key(2, b"write")), Lookup::New, "not asked to be kept");
        assert_eq!(drc.begin(&key(4, b"huge")), Lookup::New);
        // Same XID, other arguments: still a different call after the restart.
        assert_eq!(drc.begin(&key(1, b"other")), Lookup::New);
    }

    #[test]
    fn the_journal_keeps_the_newest_replies_and_skips_a_damaged_slot() {
        let (_dir, path) = scratch_journal();
        {
            let drc = DuplicateRequestCache::with_journal(4, &path, || true).unwrap();
            for x in 0..10 {
                completed(&drc, &key(x, b"a"), vec![x as u8; 50], true);
            }
        }
        {
            // The slot of XID 8 (sequence 8 of 4 slots: slot 0) loses a byte of its reply.
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0xff], (HEADER + 3) as u64).unwrap();
        }
        let drc = DuplicateRequestCache::with_journal(4, &path, || true).unwrap();
        for x in [6, 7, 9] {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::Replay(reply(vec![x as u8; 50])), "xid {x}");
        }
        assert_eq!(drc.begin(&key(5, b"a")), Lookup::New, "overwritten by a newer reply");
        assert_eq!(drc.begin(&key(8, b"a")), Lookup::New, "a damaged slot is not replayed");
        // Sequence numbers go on from the newest kept (9): the next reply takes the
        // slot of 6, the oldest, and 9 stays.
        drop(drc);
        let drc = DuplicateRequestCache::with_journal(4, &path, || true).unwrap();
        completed(&drc, &key(20, b"a"), vec![20; 10], true);
        drop(drc);
        let drc = DuplicateRequestCache::with_journal(4, &path, || true).unwrap();
        assert_eq!(drc.begin(&key(6, b"a")), Lookup::New);
        assert_eq!(drc.begin(&key(20, b"a")), Lookup::Replay(reply(vec![20; 10])));
        assert_eq!(drc.begin(&key(9, b"a")), Lookup::Replay(reply(vec![9; 50])));
    }

    #[test]
    fn a_journal_opened_with_more_slots_keeps_its_replies_in_their_new_slots() {
        let (_dir, path) = scratch_journal();
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(4, JournalPlace::Direct(&path), BOOT, || true).unwrap();
            for x in 0..7 {
                completed(&drc, &key(x, b"a"), vec![x as u8; 40], true);
            }
        }
        // Put aside by a process that died before its sync, in a boot since lost: the
        // next process drops it. Laid out for 4 slots, sequence 7 takes slot 3 (XID 3's);
        // slots 0, 1 and 2 hold XIDs 4, 5 and 6.
        killed_during_the_sync_in(4, &path, BOOT, &key(99, b"a"), &[99; 40]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * SLOT as u64);
        // Opened with 5 slots, in another boot, twice: dropping the reply put aside must
        // not wipe a kept one (nasd once cleared it in slot 7 % 5 = 2, XID 6's).
        for _ in 0..2 {
            let drc = DuplicateRequestCache::with_journal_of_boot(5, JournalPlace::Direct(&path), NEXT_BOOT, || {
                panic!("nothing of this boot to settle")
            })
            .unwrap();
            for x in 4..7 {
                assert_eq!(drc.begin(&key(x, b"a")), Lookup::Replay(reply(vec![x as u8; 40])), "xid {x}");
            }
            assert_eq!(drc.begin(&key(99, b"a")), Lookup::New);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 5 * SLOT as u64);
        }
        // Replies written in the new layout are read back with the others.
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(5, JournalPlace::Direct(&path), NEXT_BOOT, || true).unwrap();
            completed(&drc, &key(10, b"a"), vec![10; 40], true);
        }
        let drc = DuplicateRequestCache::with_journal_of_boot(5, JournalPlace::Direct(&path), NEXT_BOOT, || true).unwrap();
        for x in [4, 5, 6, 10] {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::Replay(reply(vec![x as u8; 40])), "xid {x}");
        }
    }

    #[test]
    fn a_journal_opened_with_fewer_slots_keeps_its_newest_replies() {
        let (_dir, path) = scratch_journal();
        {
            let drc = DuplicateRequestCache::with_journal(8, &path, || true).unwrap();
            for x in 0..14 {
                completed(&drc, &key(x, b"a"), vec![x as u8; 40], true);
            }
        }
        // Slots 4 and 5 of the old layout hold XIDs 12 and 13, the newest.
        let drc = DuplicateRequestCache::with_journal(4, &path, || true).unwrap();
        for x in 10..14 {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::Replay(reply(vec![x as u8; 40])), "xid {x}");
        }
        for x in 6..10 {
            assert_eq!(drc.begin(&key(x, b"a")), Lookup::New, "xid {x} is older than the 4 kept");
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * SLOT as u64);
    }

    /// A journal path in a directory of its own, removed when the directory is dropped.
    fn scratch_journal() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        (dir, path)
    }

    const BOOT: Option<[u8; 16]> = Some([1; 16]);
    const NEXT_BOOT: Option<[u8; 16]> = Some([2; 16]);

    /// A process of `boot` that begins `k` and puts `early` aside, then dies before
    /// its change is durable.
    fn killed_during_the_sync(path: &Path, boot: Option<[u8; 16]>, k: &DrcKey, early: &[u8]) {
        killed_during_the_sync_in(8, path, boot, k, early);
    }

    /// The same, with a journal of `slots` slots.
    fn killed_during_the_sync_in(slots: usize, path: &Path, boot: Option<[u8; 16]>, k: &DrcKey, early: &[u8]) {
        let drc = DuplicateRequestCache::with_journal_of_boot(slots, JournalPlace::Direct(path), boot, || true).unwrap();
        assert_eq!(drc.begin(k), Lookup::New);
        drc.keep_before_durable(k, early);
    }

    #[test]
    fn a_reply_put_aside_before_its_change_was_durable_is_replayed_after_settling_in_the_same_boot() {
        let (_dir, path) = scratch_journal();
        let k = key(1, b"create");
        killed_during_the_sync(&path, BOOT, &k, &[7; 200]);
        let mut settles = 0;
        let drc = DuplicateRequestCache::with_journal_of_boot(8, JournalPlace::Direct(&path), BOOT, || {
            settles += 1;
            true
        })
        .unwrap();
        assert_eq!(settles, 1);
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![7; 200])));
        drop(drc);
        // Settled, it is as durable as any: a process of another boot replays it too.
        let drc =
            DuplicateRequestCache::with_journal_of_boot(8, JournalPlace::Direct(&path), NEXT_BOOT, || panic!("nothing left to settle"))
                .unwrap();
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![7; 200])));
    }

    #[test]
    fn a_reply_put_aside_before_its_change_was_durable_is_dropped_unless_settled_in_the_same_boot() {
        let (_dir, path) = scratch_journal();
        let (made, durable) = (key(1, b"remove"), key(2, b"mkdir"));
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(8, JournalPlace::Direct(&path), BOOT, || true).unwrap();
            completed(&drc, &durable, vec![2; 100], true);
        }
        killed_during_the_sync(&path, BOOT, &made, &[1; 100]);
        // The settling failed: the change may not be durable.
        let drc = DuplicateRequestCache::with_journal_of_boot(8, JournalPlace::Direct(&path), BOOT, || false).unwrap();
        assert_eq!(drc.begin(&made), Lookup::New);
        assert_eq!(drc.begin(&durable), Lookup::Replay(reply(vec![2; 100])));
        drop(drc);
        // A power cut: the change may have gone with the page cache. And a kernel whose
        // boot is unknown vouches for nothing.
        for boot in [NEXT_BOOT, None] {
            killed_during_the_sync(&path, BOOT, &made, &[1; 100]);
            let drc = DuplicateRequestCache::with_journal_of_boot(8, JournalPlace::Direct(&path), boot, || {
                panic!("nothing of this boot to settle")
            })
            .unwrap();
            assert_eq!(drc.begin(&made), Lookup::New);
            assert_eq!(drc.begin(&durable), Lookup::Replay(reply(vec![2; 100])));
        }
    }

    #[test]
    fn the_final_reply_replaces_the_one_put_aside_and_an_abandoned_call_leaves_none() {
        let (_dir, path) = scratch_journal();
        let (failed, abandoned) = (key(1, b"rename"), key(2, b"link"));
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || true).unwrap();
            assert_eq!(drc.begin(&failed), Lookup::New);
            drc.keep_before_durable(&failed, &[1; 60]);
            // Its sync failed: the reply sent says so.
            drc.complete(&failed, reply(vec![5; 30]), true);
            assert_eq!(drc.begin(&abandoned), Lookup::New);
            drc.keep_before_durable(&abandoned, &[2; 60]);
            drc.abandon(&abandoned);
        }
        let drc =
            DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || panic!("nothing to settle")).unwrap();
        assert_eq!(drc.begin(&failed), Lookup::Replay(reply(vec![5; 30])));
        assert_eq!(drc.begin(&abandoned), Lookup::New);
    }

    #[test]
    fn a_call_whose_sync_outlasts_the_journal_does_not_overwrite_newer_replies() {
        let (_dir, path) = scratch_journal();
        let slow = key(1, b"slow create");
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || true).unwrap();
            assert_eq!(drc.begin(&slow), Lookup::New);
            drc.keep_before_durable(&slow, &[1; 40]);
            // Meanwhile two other calls complete: the second takes the slow call's slot.
            completed(&drc, &key(2, b"a"), vec![2; 40], true);
            completed(&drc, &key(3, b"b"), vec![3; 40], true);
            drc.complete(&slow, reply(vec![9; 40]), true);
        }
        let drc =
            DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || panic!("nothing to settle")).unwrap();
        assert_eq!(drc.begin(&slow), Lookup::Replay(reply(vec![9; 40])), "its final reply took a slot of its own");
        assert_eq!(drc.begin(&key(3, b"b")), Lookup::Replay(reply(vec![3; 40])), "the newer reply in its old slot survived");
        drop(drc);
        // Abandoned that late, it clears nothing of anyone else's.
        let drc = DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || true).unwrap();
        let late = key(4, b"late");
        assert_eq!(drc.begin(&late), Lookup::New);
        drc.keep_before_durable(&late, &[4; 40]);
        completed(&drc, &key(5, b"c"), vec![5; 40], true);
        completed(&drc, &key(6, b"d"), vec![6; 40], true);
        drc.abandon(&late);
        drop(drc);
        let drc = DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || true).unwrap();
        assert_eq!(drc.begin(&key(6, b"d")), Lookup::Replay(reply(vec![6; 40])));
        assert_eq!(drc.begin(&key(5, b"c")), Lookup::Replay(reply(vec![5; 40])));
    }

    #[test]
    fn a_final_reply_too_big_for_a_slot_leaves_no_reply_put_aside() {
        let (_dir, path) = scratch_journal();
        let k = key(1, b"setattr");
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(4, JournalPlace::Direct(&path), BOOT, || true).unwrap();
            assert_eq!(drc.begin(&k), Lookup::New);
            drc.keep_before_durable(&k, &[1; 40]);
            drc.complete(&k, reply(vec![2; SLOT]), true);
        }
        let drc =
            DuplicateRequestCache::with_journal_of_boot(4, JournalPlace::Direct(&path), BOOT, || panic!("nothing to settle")).unwrap();
        assert_eq!(drc.begin(&k), Lookup::New);
    }

    #[test]
    fn replies_in_slots_of_the_first_layout_are_replayed() {
        let (_dir, path) = scratch_journal();
        let k = DrcKey::new("192.0.2.7".parse().unwrap(), 77, 100003, 3, 8, b"create");
        let big = DrcKey::new("192.0.2.7".parse().unwrap(), 78, 100003, 3, 8, b"create");
        // A reply that fits a slot of the first layout but not of this one.
        let big_reply = vec![6u8; SLOT - HEADER_V1];
        // Two slots of a journal laid out for two: opened with 4, it is rewritten.
        let journal = [first_layout_slot(4, &k, &[7, 8, 9]), first_layout_slot(5, &big, &big_reply)].concat();
        std::fs::write(&path, &journal).unwrap();
        let drc =
            DuplicateRequestCache::with_journal_of_boot(4, JournalPlace::Direct(&path), BOOT, || panic!("nothing to settle")).unwrap();
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![7, 8, 9])));
        assert_eq!(drc.begin(&big), Lookup::New, "too big for a slot of this layout: dropped");
        // New replies go on from its sequence number, without overwriting it.
        completed(&drc, &key(1, b"a"), vec![1; 10], true);
        drop(drc);
        let drc = DuplicateRequestCache::with_journal_of_boot(4, JournalPlace::Direct(&path), BOOT, || true).unwrap();
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![7, 8, 9])));
        assert_eq!(drc.begin(&key(1, b"a")), Lookup::Replay(reply(vec![1; 10])));
        // Of the same layout, it is read as it is.
        std::fs::write(&path, [first_layout_slot(4, &k, &[7, 8, 9]), first_layout_slot(5, &big, &big_reply)].concat()).unwrap();
        let drc =
            DuplicateRequestCache::with_journal_of_boot(2, JournalPlace::Direct(&path), BOOT, || panic!("nothing to settle")).unwrap();
        assert_eq!(drc.begin(&big), Lookup::Replay(reply(big_reply)));
    }

    /// Whether `file` holds a slot whose reply is `reply`, read as a start would.
    fn file_holds(file: &Path, reply: &[u8]) -> bool {
        std::fs::read(file).unwrap_or_default().windows(reply.len()).any(|w| w == reply)
    }

    #[test]
    fn a_live_journal_is_copied_to_the_state_directory_and_a_start_after_a_reboot_replays_from_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (live, kept) = (dir.path().join("live"), dir.path().join("kept"));
        let place = JournalPlace::Mirrored { live: &live, kept: &kept };
        let created = vec![0xC1; 300];
        {
            let drc = DuplicateRequestCache::with_journal_of_boot(8, place, BOOT, || true).unwrap();
            completed(&drc, &key(1, b"create"), created.clone(), true);
            assert!(file_holds(&live, &created), "the reply is written to the live journal at once");
            // The copy follows within MIRROR_DELAY, with the process still running.
            let until = Instant::now() + Duration::from_secs(10);
            while !file_holds(&kept, &created) {
                assert!(Instant::now() < until, "the reply never reached the state directory's journal");
                std::thread::sleep(MIRROR_DELAY / 4);
            }
            completed(&drc, &key(2, b"remove"), vec![0xC2; 100], true);
            drc.flush_journal().unwrap();
            assert!(file_holds(&kept, &[0xC2; 100]), "a clean stop copies what is left at once");
        }
        // A reboot empties the memory file system.
        std::fs::remove_file(&live).unwrap();
        let drc = DuplicateRequestCache::with_journal_of_boot(8, place, NEXT_BOOT, || panic!("nothing of this boot to settle")).unwrap();
        assert_eq!(drc.begin(&key(1, b"create")), Lookup::Replay(reply(created.clone())));
        assert_eq!(drc.begin(&key(2, b"remove")), Lookup::Replay(reply(vec![0xC2; 100])));
        assert!(file_holds(&live, &created), "the live journal starts as a copy of the state directory's");
    }

    #[test]
    fn the_copier_is_woken_once_per_stretch_of_writes_and_copies_them_in_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (live, kept) = (dir.path().join("live"), dir.path().join("kept"));
        let place = JournalPlace::Mirrored { live: &live, kept: &kept };
        // More slots than one copy moves at a time, and round the ring past its end.
        let drc = DuplicateRequestCache::with_journal_of_boot(150, place, BOOT, || true).unwrap();
        const WRITES: u32 = 200;
        for xid in 0..WRITES {
            completed(&drc, &key(xid, b"create"), vec![0xC4; 64 + xid as usize % 7], true);
        }
        let files = &drc.journal.as_ref().unwrap().mirror.as_ref().unwrap().files;
        let (wakes, copies) = (files.wakes.load(Ordering::Relaxed), files.copies.load(Ordering::Relaxed));
        // A copy that ended between the writes (a machine stalled for MIRROR_DELAY) lets
        // the next write start a stretch of its own; nothing else may wake the copier.
        assert!(wakes >= 1 && wakes <= copies + 1, "{wakes} wake-ups of the copier for {WRITES} writes and {copies} copies");
        drc.flush_journal().unwrap();
        assert!(std::fs::read(&kept).unwrap() == std::fs::read(&live).unwrap(), "the copy differs from the live journal");
        drop(drc);
        std::fs::remove_file(&live).unwrap();
        let drc = DuplicateRequestCache::with_journal_of_boot(150, place, NEXT_BOOT, || panic!("nothing of this boot to settle")).unwrap();
        assert_eq!(drc.begin(&key(WRITES - 1, b"create")), Lookup::Replay(reply(vec![0xC4; 64 + (WRITES as usize - 1) % 7])));
    }

    #[test]
    fn a_start_in_the_same_boot_takes_the_live_journal_and_brings_the_state_directorys_copy_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let (live, kept) = (dir.path().join("live"), dir.path().join("kept"));
        let place = JournalPlace::Mirrored { live: &live, kept: &kept };
        drop(DuplicateRequestCache::with_journal_of_boot(8, place, BOOT, || true).unwrap());
        // A process killed before the copy: its last replies are in the live journal alone.
        let k = key(3, b"rename");
        killed_during_the_sync(&live, BOOT, &k, &[0xC3; 120]);
        assert!(!file_holds(&kept, &[0xC3; 120]));
        let drc = DuplicateRequestCache::with_journal_of_boot(8, place, BOOT, || true).unwrap();
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![0xC3; 120])), "the live journal was not read");
        drop(drc);
        assert!(file_holds(&kept, &[0xC3; 120]), "the state directory's copy was not brought up to date");
        // Made good at that start, the reply is durable in the copy too: the next boot has it.
        std::fs::remove_file(&live).unwrap();
        let drc = DuplicateRequestCache::with_journal_of_boot(8, place, NEXT_BOOT, || panic!("nothing of this boot to settle")).unwrap();
        assert_eq!(drc.begin(&k), Lookup::Replay(reply(vec![0xC3; 120])));
    }

    /// A slot as nasd wrote it before the boot and state fields.
    fn first_layout_slot(seq: u64, k: &DrcKey, reply: &[u8]) -> Vec<u8> {
        let IpAddr::V4(ip) = k.client else { panic!("an IPv4 key") };
        let mut slot = Vec::new();
        slot.extend_from_slice(&MAGIC_V1);
        slot.extend_from_slice(&seq.to_be_bytes());
        slot.extend_from_slice(&ip.to_ipv6_mapped().octets());
        for word in [k.xid, k.program, k.version, k.procedure] {
            slot.extend_from_slice(&word.to_be_bytes());
        }
        slot.extend_from_slice(&(k.args_len as u64).to_be_bytes());
        slot.extend_from_slice(&k.args_sum);
        slot.extend_from_slice(&(reply.len() as u16).to_be_bytes());
        let sum_at = slot.len();
        slot.extend_from_slice(&[0; 8]);
        assert_eq!(slot.len(), HEADER_V1);
        slot.extend_from_slice(reply);
        let sum = Journal::checksum(&slot, sum_at);
        slot[sum_at..sum_at + 8].copy_from_slice(&sum);
        slot.resize(SLOT, 0);
        slot
    }
}
