//! Exports and access control: which client may see which directory, with what options
//! (exports(5)), and how credentials are squashed.

mod parse;
mod show;
mod squash;

pub use parse::{merge_same_directories, parse_anon_id, parse_client_spec, parse_exports, parse_exports_with, ExportsError};
pub use show::{describe, describe_client, LeftOut};
pub use squash::squash;

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Per-client export options (exports(5) names in comments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportOptions {
    /// `ro` / `rw`
    pub read_only: bool,
    /// `sync` / `async`
    pub sync: bool,
    /// `root_squash` / `no_root_squash`: uid and gid 0 act as the anonymous ids.
    pub root_squash: bool,
    /// `all_squash` / `no_all_squash`: every caller acts as the anonymous ids, whatever
    /// `root_squash` says (the two are independent, as in exports(5)).
    pub all_squash: bool,
    pub anonuid: u32,
    pub anongid: u32,
    /// `secure`: requests must come from a port below 1024.
    pub secure: bool,
}

impl Default for ExportOptions {
    /// The exports(5) defaults.
    fn default() -> Self {
        Self { read_only: true, sync: true, root_squash: true, all_squash: false, anonuid: 65534, anongid: 65534, secure: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientSpec {
    Anyone,
    Address(IpAddr),
    Network(IpAddr, u8),
    /// A host name, with the addresses it resolved to when the exports were loaded.
    Host(String, Vec<IpAddr>),
    /// A pattern with `*`, `?` and `[...]`. One written for addresses (`192.168.1.*`,
    /// `fd00::*`: [`is_address_pattern`]) is matched against the client's address as
    /// text, the way nfs-utils matches a client without a name; any other against the
    /// client's forward-confirmed reverse name. A name never matches an address pattern:
    /// a client's own DNS zone could hold `10.1.x.evil.example`.
    Wildcard(String),
}

impl ClientSpec {
    /// Whether the spec admits every address: `*`, a network of prefix 0, or an address
    /// pattern of nothing but `*` and separators (`*.*.*.*`).
    pub fn admits_every_address(&self) -> bool {
        match self {
            ClientSpec::Anyone => true,
            ClientSpec::Network(_, prefix) => *prefix == 0,
            ClientSpec::Wildcard(p) => is_address_pattern(p) && p.chars().all(|c| matches!(c, '*' | '.' | ':')),
            ClientSpec::Address(_) | ClientSpec::Host(..) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRule {
    pub spec: ClientSpec,
    pub options: ExportOptions,
    /// The exports file line it was written on (0 when given on the command line): the
    /// rules of lines that turn out to name one directory are put back in file order.
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Export {
    /// Stable identity, carried in file handles: `fsid=` or derived from the path.
    pub id: u32,
    pub path: PathBuf,
    pub rules: Vec<ClientRule>,
    /// `mountpoint`/`mp`: served only while this directory (the export's own path when the
    /// option has no value) is a mount point, so that a file system that failed to mount
    /// does not expose, and fill, the directory underneath.
    pub needs_mount: Option<PathBuf>,
    /// The paths as the exports file wrote them, where they differ from `path` (the
    /// canonical one: a symlink on the way, say). Clients may mount it by those names too,
    /// as mountd resolves the path a client asks for.
    pub written_paths: Vec<PathBuf>,
}

pub fn export_id_for_path(path: &std::path::Path) -> u32 {
    let h = blake3::hash(path.as_os_str().as_encoded_bytes());
    u32::from_le_bytes(h.as_bytes()[..4].try_into().expect("4 bytes")) | 1
}

fn ip_in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let p = prefix.min(32) as u32;
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let p = prefix.min(128) as u32;
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Whether a wildcard is written for addresses: IPv4 ones have no letters, which every
/// host name has in its top-level domain (`192.168.1.*`, `10.0.[0-3].*`); IPv6 ones a
/// `:`, which no host name has (`fd00::*`, matched against the address as printed, in
/// its shortest form).
pub fn is_address_pattern(pattern: &str) -> bool {
    pattern.contains(':') || !pattern.bytes().any(|b| b.is_ascii_alphabetic())
}

/// Shell-style match of a client name, ignoring ASCII case, as nfs-utils matches exports(5)
/// wildcards: `*`, `?` and `[...]` classes (ranges, `!` or `^` to negate). Only the last
/// `*` is ever returned to, so the time is at most pattern × name, whatever name a
/// client's reverse lookup supplies.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to go on from if a mismatch follows a `*`: just after it, and the first
    // character of the name it has not yet taken.
    let mut after_star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            p += 1;
            after_star = Some((p, t));
            continue;
        }
        if p < pattern.len() {
            let (matched, len) = one_char_token(&pattern[p..], text[t]);
            if matched {
                p += len;
                t += 1;
                continue;
            }
        }
        match after_star {
            Some((resume_at, star_took)) => {
                p = resume_at;
                t = star_took + 1;
                after_star = Some((resume_at, t));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Whether the pattern token at the start of `pattern` (not a `*`) matches `c`, and the
/// token's length. An unclosed `[` is a plain character.
fn one_char_token(pattern: &[u8], c: u8) -> (bool, usize) {
    match pattern[0] {
        b'?' => (true, 1),
        b'[' => char_class(pattern, c).unwrap_or((c == b'[', 1)),
        p => (p.eq_ignore_ascii_case(&c), 1),
    }
}

/// The `[...]` class at the start of `pattern`: whether it admits `c`, and its length;
/// `None` when it is not closed. A `]` first in the class is one of its characters.
fn char_class(pattern: &[u8], c: u8) -> Option<(bool, usize)> {
    let c = c.to_ascii_lowercase();
    let mut i = 1;
    let negated = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let first = i;
    let mut admitted = false;
    loop {
        let lo = pattern.get(i)?.to_ascii_lowercase();
        if lo == b']' && i > first {
            return Some((admitted != negated, i + 1));
        }
        match (pattern.get(i + 1), pattern.get(i + 2)) {
            (Some(b'-'), Some(&hi)) if hi != b']' => {
                admitted |= (lo..=hi.to_ascii_lowercase()).contains(&c);
                i += 3;
            }
            _ => {
                admitted |= lo == c;
                i += 1;
            }
        }
    }
}

/// Reverse-resolves a client address (for wildcard rules only).
fn reverse_name(ip: IpAddr) -> Option<String> {
    use std::ffi::CStr;
    let (sa, len) = crate::sockaddr::to_c(std::net::SocketAddr::new(ip, 0));
    let mut host = [0 as libc::c_char; 256];
    // SAFETY: valid sockaddr of `len` bytes and output buffer.
    let r = unsafe {
        libc::getnameinfo(&sa as *const _ as *const libc::sockaddr, len, host.as_mut_ptr(), 256, std::ptr::null_mut(), 0, libc::NI_NAMEREQD)
    };
    if r != 0 {
        return None;
    }
    Some(unsafe { CStr::from_ptr(host.as_ptr()) }.to_string_lossy().into_owned())
}

/// The addresses a name resolves to now.
fn forward_addresses(name: &str) -> Vec<IpAddr> {
    (name, 0).to_socket_addrs().map(|addrs| addrs.map(|a| canonical_ip(a.ip())).collect()).unwrap_or_default()
}

/// The client's name for wildcard rules: its reverse name, but only if that name also
/// resolves back to the client (as mountd checks), since whoever controls the reverse zone
/// of an address can give it any name.
fn confirmed_name(client: IpAddr, reverse: impl Fn(IpAddr) -> Option<String>, forward: impl Fn(&str) -> Vec<IpAddr>) -> Option<String> {
    let name = reverse(client)?;
    if forward(&name).contains(&client) {
        Some(name)
    } else {
        tracing::warn!(%client, %name, "the client's reverse name does not resolve back to it; wildcard rules do not match it");
        None
    }
}

/// A client's name as wildcard rules see it (no cache: for a one-off question).
pub fn confirmed_client_name(client: IpAddr) -> Option<String> {
    confirmed_name(client, reverse_name, forward_addresses)
}

/// How long a client's confirmed name (or its lack of one) is reused. Rules are checked
/// on every call, and a resolver can take seconds to answer.
const NAME_TTL: Duration = Duration::from_secs(60);
const NAME_CACHE_ENTRIES: usize = 4096;

/// A wildcard rule needs the client's name, which is not known yet, and the caller may not
/// wait for the resolver: ask again where waiting is allowed, or (where it was, but every
/// lookup thread is taken) later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameNotResolved;

/// A client's confirmed name as last resolved.
struct KnownName {
    name: Option<String>,
    at: Instant,
    /// When a call last asked for it: a full cache keeps the clients that are calling,
    /// not the addresses looked up last (a flood of calls from new addresses would push
    /// every real client out and back to the resolver).
    used: Instant,
    /// A caller is resolving it again; the others use this one meanwhile.
    refreshing: bool,
}

/// Client names as last resolved, and the first lookups under way.
#[derive(Default)]
struct NameCache {
    state: Mutex<Names>,
    /// Signalled when a first lookup ends.
    looked_up: Condvar,
    /// Threads inside a lookup or waiting for another's.
    busy: AtomicUsize,
}

/// Threads at most inside a name lookup or waiting for one. They come from the pool that
/// also runs every client's stable writes and namespace changes, so calls from addresses
/// whose names take long to resolve (a slow resolver, an attacker rotating addresses or
/// forging UDP sources) must not take them all: beyond this, a call whose client's name
/// is not known yet is told to come back later ([`NameNotResolved`]).
const LOOKUP_THREADS: usize = 8;

/// One of the [`LOOKUP_THREADS`], given back when dropped.
struct LookupThread<'a>(&'a AtomicUsize);

impl<'a> LookupThread<'a> {
    /// Whether `held` holds one of the threads, taking one if it holds none yet.
    fn hold(held: &mut Option<Self>, names: &'a NameCache) -> bool {
        if held.is_some() {
            return true;
        }
        if names.busy.fetch_add(1, Ordering::AcqRel) >= LOOKUP_THREADS {
            names.busy.fetch_sub(1, Ordering::AcqRel);
            if let Some(held_back) = LOOKUPS_FULL.allow() {
                tracing::warn!(
                    held_back,
                    "{LOOKUP_THREADS} client name lookups under way: calls of clients whose names are not known yet are told to retry"
                );
            }
            return false;
        }
        *held = Some(Self(&names.busy));
        true
    }
}

impl Drop for LookupThread<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

static LOOKUPS_FULL: crate::throttle::Throttle = crate::throttle::Throttle::new(60);

#[derive(Default)]
struct Names {
    known: HashMap<IpAddr, KnownName>,
    /// Clients whose name a caller is looking up for the first time.
    first_lookups: HashSet<IpAddr>,
}

/// How long a caller waits for another's first lookup of the same client's name before
/// asking the resolver itself (a resolver that never answers must not hold them all).
const FIRST_LOOKUP_WAIT: Duration = Duration::from_secs(15);

/// [`confirmed_name`] through the system resolver, cached for [`NAME_TTL`]. Without
/// `may_resolve` only the cache is asked.
fn client_name(client: IpAddr, may_resolve: bool) -> Result<Option<String>, NameNotResolved> {
    static NAMES: OnceLock<NameCache> = OnceLock::new();
    cached_name(NAMES.get_or_init(Default::default), client, may_resolve, |ip| confirmed_name(ip, reverse_name, forward_addresses))
}

/// [`client_name`] with its cache and resolver given. One caller at a time asks the
/// resolver about a client: the others wait for its first answer, and go on with the old
/// name while an expired one is looked up again. Otherwise every call of a busy client
/// would ask the resolver at once, each on a thread of its own, when it first calls and
/// whenever its name expires (and wait seconds each where the resolver is down).
fn cached_name(
    names: &NameCache,
    client: IpAddr,
    may_resolve: bool,
    resolve: impl FnOnce(IpAddr) -> Option<String>,
) -> Result<Option<String>, NameNotResolved> {
    let mut state = names.state.lock();
    let mut thread = None;
    loop {
        if let Some(known) = state.known.get_mut(&client) {
            known.used = Instant::now();
            if known.used.duration_since(known.at) < NAME_TTL || known.refreshing {
                return Ok(known.name.clone());
            }
            if !may_resolve {
                return Err(NameNotResolved);
            }
            // Expired, and nobody resolving it: this caller does, if a thread may.
            if !LookupThread::hold(&mut thread, names) {
                return Ok(known.name.clone());
            }
            known.refreshing = true;
            break;
        }
        if !may_resolve {
            return Err(NameNotResolved);
        }
        if !LookupThread::hold(&mut thread, names) {
            return Err(NameNotResolved);
        }
        if state.first_lookups.insert(client) || names.looked_up.wait_for(&mut state, FIRST_LOOKUP_WAIT).timed_out() {
            break;
        }
    }
    drop(state);
    // Resolved without the lock: one slow lookup must not hold up every other client.
    let name = resolve(client);
    let mut state = names.state.lock();
    if state.known.len() >= NAME_CACHE_ENTRIES {
        make_room(&mut state.known, NAME_CACHE_ENTRIES / 2);
    }
    let now = Instant::now();
    state.known.insert(client, KnownName { name: name.clone(), at: now, used: now, refreshing: false });
    if state.first_lookups.remove(&client) {
        names.looked_up.notify_all();
    }
    Ok(name)
}

/// Shrinks a full name cache to at most `keep` entries: expired ones go first, then the
/// least recently used. Clearing it all would send every active client back to the
/// resolver at once.
fn make_room(names: &mut HashMap<IpAddr, KnownName>, keep: usize) {
    names.retain(|_, known| known.at.elapsed() < NAME_TTL);
    if keep == 0 {
        names.clear();
    } else if names.len() > keep {
        let mut uses: Vec<Instant> = names.values().map(|known| known.used).collect();
        uses.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = uses[keep - 1];
        names.retain(|_, known| known.used >= cutoff);
    }
}

/// Keeps the higher-ranked rule; on a tie the earlier one.
fn prefer<'a>(best: &mut Option<(u32, &'a ExportOptions)>, rank: u32, options: &'a ExportOptions) {
    if best.is_none_or(|(b, _)| rank > b) {
        *best = Some((rank, options));
    }
}

/// Which kind of rule wins when a client matches several, in the order exports(5) gives:
/// a single host (address or name), an IP network, a wildcard, anyone.
const HOST_RANK: u32 = 3;
const NETWORK_RANK: u32 = 2;
const WILDCARD_RANK: u32 = 1;
const ANYONE_RANK: u32 = 0;

impl Export {
    /// The options for a client, or `None` if no rule admits it. As exports(5) has it: a
    /// rule for the single host wins over one for a network it is in, which wins over a
    /// wildcard, which wins over `*`; between rules of one kind, the first on the line (not
    /// the narrowest network). A wildcard rule may need the client's name from the
    /// resolver, which can take seconds: without `may_resolve` (a thread that must not
    /// wait) that fails with [`NameNotResolved`] unless the name is cached.
    pub fn options_for(&self, client: IpAddr, may_resolve: bool) -> Result<Option<&ExportOptions>, NameNotResolved> {
        self.options_with_name(client, |ip| client_name(ip, may_resolve))
    }

    /// Whether some rule admits `client`, which rule winning aside: a name the resolver
    /// would have to find counts only where the name is cached, but a rule for its
    /// address, a network or `*` admits it whatever a name rule would give.
    pub fn admits(&self, client: IpAddr) -> bool {
        match self.options_for(client, false) {
            Ok(found) => found.is_some(),
            Err(NameNotResolved) => matches!(self.options_with_name(client, |_| Ok(None)), Ok(Some(_))),
        }
    }

    /// Whether a rule that names the client admits it (its address or name, a network it
    /// is in, a wildcard its address or cached name matches), not `*` alone, which admits
    /// every address, forged ones too.
    pub fn names(&self, client: IpAddr) -> bool {
        let narrower = Export { rules: self.rules.iter().filter(|r| !r.spec.admits_every_address()).cloned().collect(), ..self.clone() };
        narrower.admits(client)
    }

    /// [`Self::options_for`] with the client's name (for wildcard rules) from `name`, which
    /// is asked only when a wildcard rule could still win.
    fn options_with_name(
        &self,
        client: IpAddr,
        name: impl FnOnce(IpAddr) -> Result<Option<String>, NameNotResolved>,
    ) -> Result<Option<&ExportOptions>, NameNotResolved> {
        let mut best: Option<(u32, &ExportOptions)> = None;
        for rule in &self.rules {
            let rank = match &rule.spec {
                ClientSpec::Address(a) if *a == client => Some(HOST_RANK),
                ClientSpec::Host(_, addrs) if addrs.contains(&client) => Some(HOST_RANK),
                ClientSpec::Network(n, prefix) if ip_in_network(client, *n, *prefix) => Some(NETWORK_RANK),
                ClientSpec::Anyone => Some(ANYONE_RANK),
                _ => None,
            };
            if let Some(rank) = rank {
                prefer(&mut best, rank, &rule.options);
            }
        }
        if best.is_some_and(|(b, _)| b >= WILDCARD_RANK) {
            return Ok(best.map(|(_, o)| o));
        }
        // The first wildcard on the line that matches wins. The address text and the name
        // are made only when a pattern needs them: most exports have no wildcard, and this
        // runs on every call.
        let mut address: Option<String> = None;
        let mut name = Some(name);
        let mut known_name: Option<String> = None;
        for rule in &self.rules {
            let ClientSpec::Wildcard(pattern) = &rule.spec else { continue };
            let text = if is_address_pattern(pattern) {
                address.get_or_insert_with(|| client.to_string())
            } else {
                if let Some(ask) = name.take() {
                    known_name = ask(client)?;
                }
                match &known_name {
                    Some(n) => n,
                    None => continue,
                }
            };
            if glob_match(pattern.as_bytes(), text.as_bytes()) {
                prefer(&mut best, WILDCARD_RANK, &rule.options);
                break;
            }
        }
        Ok(best.map(|(_, o)| o))
    }
}

/// All exports of this server.
#[derive(Debug, Clone, Default)]
pub struct ExportTable {
    pub exports: Vec<Export>,
}

impl ExportTable {
    pub fn by_id(&self, id: u32) -> Option<&Export> {
        self.exports.iter().find(|e| e.id == id)
    }

    /// Every export a MOUNT path is in, the deepest first, with the path below each
    /// one's root: a client that the deepest does not admit may mount the directory
    /// through an export above it that does, as with mountd (`/srv` for A and `/srv/data`
    /// for B: A mounts `/srv/data` through `/srv`). With a single export, `/` (or an
    /// empty path) is its root and other paths outside its own absolute path are taken
    /// relative to it, so `host:/` and `host:/sub` both work.
    pub fn mount_candidates(&self, path: &str) -> Vec<(&Export, PathBuf)> {
        let p = std::path::Path::new(path);
        let mut found: Vec<(&Export, usize, PathBuf)> = self
            .exports
            .iter()
            .flat_map(|e| std::iter::once(&e.path).chain(&e.written_paths).map(move |name| (e, name)))
            .filter_map(|(e, name)| p.strip_prefix(name).ok().map(|rest| (e, name.components().count(), rest.to_path_buf())))
            .collect();
        found.sort_by_key(|(_, depth, _)| std::cmp::Reverse(*depth));
        // One export may be reached by several of its names, at different depths.
        let mut seen = HashSet::new();
        found.retain(|(e, _, _)| seen.insert(e.id));
        match (found.is_empty(), self.exports.as_slice()) {
            (false, _) => found.into_iter().map(|(e, _, rest)| (e, rest)).collect(),
            (true, [only]) => vec![(only, PathBuf::from(path.trim_start_matches('/')))],
            (true, _) => Vec::new(),
        }
    }
}

/// Maps an IPv4-mapped IPv6 address to plain IPv4, so rules written for IPv4 match.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_name_cache_drops_the_expired_then_the_least_recently_used_entries() {
        let now = Instant::now();
        let mut names = HashMap::new();
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let secs = |i: u32| Duration::from_secs(u64::from(i));
        // Resolved in the order 0..10, 0 last; used in the other order, 9 last.
        for i in 0..10u32 {
            names.insert(ip(i), KnownName { name: None, at: now - secs(i), used: now - secs(10 - i), refreshing: false });
        }
        let expired = now - NAME_TTL - secs(1);
        names.insert(ip(99), KnownName { name: None, at: expired, used: now, refreshing: false });
        make_room(&mut names, 4);
        let mut kept: Vec<IpAddr> = names.keys().copied().collect();
        kept.sort();
        assert_eq!(kept, (6..10).map(ip).collect::<Vec<_>>(), "the four used last stay, whenever they were resolved");
        make_room(&mut names, 8);
        assert_eq!(names.len(), 4, "nothing is dropped while there is room");
    }

    type Answer = Result<Option<String>, NameNotResolved>;

    /// Holds one caller's lookup of `ip` (which will answer `answer`) while `during` runs
    /// on this thread; `during` gets a way to call as another caller (whose own lookups
    /// answer no name) and one to let the held lookup answer. Returns the held caller's
    /// result and the number of lookups made in all.
    fn while_a_lookup_is_held(
        names: &NameCache,
        ip: IpAddr,
        answer: &str,
        during: impl FnOnce(&(dyn Fn(bool) -> Answer + Sync), &dyn Fn()),
    ) -> (Answer, usize) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let lookups = AtomicUsize::new(0);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let held = std::thread::scope(|scope| {
            let lookups = &lookups;
            let held = scope.spawn(move || {
                cached_name(names, ip, true, |_| {
                    lookups.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Some(answer.to_string())
                })
            });
            started_rx.recv().unwrap();
            let other = |may_resolve: bool| {
                cached_name(names, ip, may_resolve, |_| {
                    lookups.fetch_add(1, Ordering::SeqCst);
                    None
                })
            };
            let release = || release_tx.send(()).unwrap();
            during(&other, &release);
            held.join().unwrap()
        });
        (held, lookups.load(Ordering::SeqCst))
    }

    #[test]
    fn lookups_take_at_most_their_share_of_threads() {
        let names = NameCache::default();
        let ip = |i: usize| -> IpAddr { format!("10.9.0.{i}").parse().unwrap() };
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let release = std::sync::Barrier::new(LOOKUP_THREADS + 1);
        std::thread::scope(|scope| {
            let held: Vec<_> = (0..LOOKUP_THREADS)
                .map(|i| {
                    let (names, started_tx, release) = (&names, started_tx.clone(), &release);
                    scope.spawn(move || {
                        cached_name(names, ip(i), true, |_| {
                            started_tx.send(()).unwrap();
                            release.wait();
                            Some(format!("host{i}.example"))
                        })
                    })
                })
                .collect();
            for _ in 0..LOOKUP_THREADS {
                started_rx.recv().unwrap();
            }
            // Every lookup thread is taken: a new client's call is told to come back, at
            // once, and so is a second caller for a client being looked up (it would wait).
            assert_eq!(cached_name(&names, ip(100), true, |_| unreachable!("no thread for it")), Err(NameNotResolved));
            assert_eq!(cached_name(&names, ip(0), true, |_| unreachable!("no thread for it")), Err(NameNotResolved));
            release.wait();
            for (i, h) in held.into_iter().enumerate() {
                assert_eq!(h.join().unwrap(), Ok(Some(format!("host{i}.example"))));
            }
        });
        assert_eq!(names.busy.load(Ordering::SeqCst), 0);
        assert_eq!(cached_name(&names, ip(100), true, |_| Some("late.example".into())), Ok(Some("late.example".into())));
    }

    #[test]
    fn an_expired_name_is_resolved_again_by_one_caller_while_the_others_use_it() {
        let names = NameCache::default();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let stale = Instant::now() - NAME_TTL - Duration::from_secs(1);
        names.state.lock().known.insert(ip, KnownName { name: Some("old.example".into()), at: stale, used: stale, refreshing: false });
        // Inline callers (that may not wait) are sent to a thread for an expired name.
        assert_eq!(cached_name(&names, ip, false, |_| unreachable!()), Err(NameNotResolved));
        let (held, lookups) = while_a_lookup_is_held(&names, ip, "new.example", |other, release| {
            // While it resolves, every other caller gets the name it had, at once.
            for may_resolve in [true, false] {
                assert_eq!(other(may_resolve), Ok(Some("old.example".into())));
            }
            release();
        });
        assert_eq!(held, Ok(Some("new.example".into())));
        assert_eq!(lookups, 1, "one lookup for all callers");
        assert_eq!(cached_name(&names, ip, false, |_| unreachable!()), Ok(Some("new.example".into())));
    }

    #[test]
    fn a_new_client_is_looked_up_once_and_the_others_wait_for_that_answer() {
        let names = NameCache::default();
        let ip: IpAddr = "10.1.2.4".parse().unwrap();
        let (held, lookups) = while_a_lookup_is_held(&names, ip, "host.example", |other, release| {
            // An inline caller is sent to a thread; a caller on a thread waits.
            assert_eq!(other(false), Err(NameNotResolved));
            std::thread::scope(|scope| {
                let second = scope.spawn(|| other(true));
                std::thread::sleep(Duration::from_millis(50));
                assert!(!second.is_finished(), "the second caller did not wait for the first lookup");
                release();
                assert_eq!(second.join().unwrap(), Ok(Some("host.example".into())));
            });
        });
        assert_eq!(held, Ok(Some("host.example".into())));
        assert_eq!(lookups, 1, "one lookup for both callers");
    }

    fn rule(spec: ClientSpec, ro: bool) -> ClientRule {
        ClientRule { spec, options: ExportOptions { read_only: ro, ..Default::default() }, line: 0 }
    }

    #[test]
    fn host_then_network_then_anyone_and_the_first_network_on_the_line() {
        let e = Export {
            id: 1,
            path: "/srv".into(),
            rules: vec![
                rule(ClientSpec::Anyone, true),
                rule(ClientSpec::Network("10.0.0.0".parse().unwrap(), 8), false),
                rule(ClientSpec::Network("10.1.0.0".parse().unwrap(), 16), true),
                rule(ClientSpec::Address("10.1.2.3".parse().unwrap()), false),
            ],
            needs_mount: None,
            written_paths: Vec::new(),
        };
        let ro = |ip: &str| e.options_for(ip.parse().unwrap(), false).expect("no wildcard rule").unwrap().read_only;
        assert!(ro("192.168.1.1"), "only * matches");
        assert!(!ro("10.9.9.9"), "the /8 network");
        assert!(!ro("10.1.9.9"), "the /8 network comes first on the line: the /16 is not looked at");
        assert!(!ro("10.1.2.3"), "the host's own rule");
        let narrow_first = Export { rules: vec![e.rules[2].clone(), e.rules[1].clone()], ..e.clone() };
        assert!(narrow_first.options_for("10.1.9.9".parse().unwrap(), false).unwrap().unwrap().read_only);
        let only_net = Export { rules: vec![rule(ClientSpec::Network("127.0.0.0".parse().unwrap(), 8), false)], ..e };
        assert!(only_net.options_for("127.5.5.5".parse().unwrap(), false).expect("no wildcard rule").is_some());
        assert!(only_net.options_for("128.0.0.1".parse().unwrap(), false).expect("no wildcard rule").is_none());
        assert!(only_net.options_for("::1".parse().unwrap(), false).expect("no wildcard rule").is_none());
    }

    #[test]
    fn a_client_admitted_only_by_anyone_is_not_named() {
        let e = Export {
            id: 1,
            path: "/srv".into(),
            rules: vec![
                rule(ClientSpec::Anyone, true),
                rule(ClientSpec::Network("10.0.0.0".parse().unwrap(), 8), false),
                rule(ClientSpec::Wildcard("192.168.7.*".into()), false),
            ],
            needs_mount: None,
            written_paths: Vec::new(),
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(e.admits(ip("203.0.113.9")) && !e.names(ip("203.0.113.9")), "only * admits it");
        assert!(e.names(ip("10.2.3.4")), "its network names it");
        assert!(e.names(ip("192.168.7.7")), "an address wildcard names it");
        let no_anyone = Export { rules: e.rules[1..].to_vec(), ..e.clone() };
        assert!(!no_anyone.admits(ip("203.0.113.9")) && !no_anyone.names(ip("203.0.113.9")));
        // Rules written another way that admit every address name no one either.
        for (everyone, client) in [
            (ClientSpec::Network("0.0.0.0".parse().unwrap(), 0), "203.0.113.9"),
            (ClientSpec::Network("::".parse().unwrap(), 0), "2001:db8::9"),
            (ClientSpec::Wildcard("*.*.*.*".into()), "203.0.113.9"),
        ] {
            let wide = Export { rules: vec![rule(everyone.clone(), false)], ..e.clone() };
            assert!(wide.admits(ip(client)) && !wide.names(ip(client)), "{everyone:?}");
        }
    }

    #[test]
    fn wildcards_match_only_confirmed_names_and_only_when_they_could_win() {
        let client: IpAddr = "10.1.2.3".parse().unwrap();
        let other: IpAddr = "10.9.9.9".parse().unwrap();
        let named = |name: &'static str| move |_: IpAddr| Ok(Some(name.to_string()));
        let reverse = |name: &'static str| move |_: IpAddr| Some(name.to_string());
        // The reverse name must resolve back to the client.
        assert_eq!(confirmed_name(client, reverse("a.trusted.lab"), |_| vec![other, client]), Some("a.trusted.lab".into()));
        assert_eq!(confirmed_name(client, reverse("a.trusted.lab"), |_| vec![other]), None);
        assert_eq!(confirmed_name(client, |_| None, |_| vec![client]), None);

        let e = Export {
            id: 1,
            path: "/srv".into(),
            rules: vec![
                rule(ClientSpec::Anyone, true),
                rule(ClientSpec::Wildcard("*.trusted.lab".into()), false),
                rule(ClientSpec::Address("10.5.5.5".parse().unwrap()), true),
            ],
            needs_mount: None,
            written_paths: Vec::new(),
        };
        assert!(!e.options_with_name(client, named("a.trusted.lab")).unwrap().unwrap().read_only);
        assert!(e.options_with_name(client, named("a.other.lab")).unwrap().unwrap().read_only);
        assert!(e.options_with_name(client, |_| Ok(None)).unwrap().unwrap().read_only);
        // A thread that must not wait for the resolver learns that it would have to.
        assert_eq!(e.options_with_name(client, |_| Err(NameNotResolved)), Err(NameNotResolved));
        // A network rule outranks any wildcard (exports(5) order), and needs no name.
        let net_first = Export {
            rules: vec![
                rule(ClientSpec::Wildcard("*.trusted.lab".into()), false),
                rule(ClientSpec::Network("10.0.0.0".parse().unwrap(), 8), true),
            ],
            ..e.clone()
        };
        assert!(net_first.options_with_name(client, |_| Err(NameNotResolved)).unwrap().unwrap().read_only);
        // An address rule outranks any wildcard: no name lookup at all.
        let asked = std::cell::Cell::new(false);
        let ask = |_| {
            asked.set(true);
            Ok(Some("x.trusted.lab".to_string()))
        };
        assert!(e.options_with_name("10.5.5.5".parse().unwrap(), ask).unwrap().unwrap().read_only);
        assert!(!asked.get(), "looked up the name of a client an address rule decides");
        // Whether a client is admitted at all needs no name where `*` is on the line
        // (the UDP reply guard asks this of clients whose names are not yet known).
        let unnamed: IpAddr = "192.0.2.77".parse().unwrap();
        assert!(e.admits(unnamed), "`*` admits every client, whatever a name rule would give");
        let names_only = Export { rules: vec![rule(ClientSpec::Wildcard("*.trusted.lab".into()), false)], ..e.clone() };
        assert!(!names_only.admits(unnamed), "a client whose name is not known is admitted by no name rule");
    }

    #[test]
    fn address_wildcards_match_the_address_and_never_a_name() {
        let e = Export {
            id: 1,
            path: "/srv".into(),
            rules: vec![rule(ClientSpec::Wildcard("192.168.1.*".into()), false), rule(ClientSpec::Anyone, true)],
            needs_mount: None,
            written_paths: Vec::new(),
        };
        let no_name = |_| -> Result<Option<String>, NameNotResolved> { panic!("an address pattern needs no name") };
        assert!(!e.options_with_name("192.168.1.77".parse().unwrap(), no_name).unwrap().unwrap().read_only);
        assert!(e.options_with_name("192.168.10.7".parse().unwrap(), no_name).unwrap().unwrap().read_only);
        // A name that looks like the pattern, from the client's own reverse zone, is not an address.
        let attacker = |_| Ok(Some("192.168.1.x.evil.example".to_string()));
        assert!(e.options_with_name("203.0.113.9".parse().unwrap(), attacker).unwrap().unwrap().read_only);
        // Mixed with a name pattern: the first match on the line wins, the name is asked only if needed.
        let mixed = Export {
            rules: vec![rule(ClientSpec::Wildcard("*.trusted.lab".into()), true), rule(ClientSpec::Wildcard("10.1.*".into()), false)],
            ..e.clone()
        };
        let named = |_| Ok(Some("a.trusted.lab".to_string()));
        assert!(mixed.options_with_name("10.1.2.3".parse().unwrap(), named).unwrap().unwrap().read_only, "the name rule comes first");
        assert!(!mixed.options_with_name("10.1.2.3".parse().unwrap(), |_| Ok(None)).unwrap().unwrap().read_only);
        assert!(mixed.options_with_name("10.2.0.1".parse().unwrap(), |_| Ok(None)).unwrap().is_none());
        assert!(is_address_pattern("10.0.[0-3].*") && is_address_pattern("fd00::*") && !is_address_pattern("node[0-9].lab"));
        let v6 = Export { rules: vec![rule(ClientSpec::Wildcard("fd00::*".into()), false)], ..e.clone() };
        assert!(v6.options_with_name("fd00::17".parse().unwrap(), no_name).unwrap().is_some(), "IPv6 patterns are addresses too");
        assert!(v6.options_with_name("fd01::17".parse().unwrap(), no_name).unwrap().is_none());
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"*.example.com", b"host.Example.com"));
        assert!(!glob_match(b"*.example.com", b"example.com"));
        assert!(glob_match(b"h?st*", b"host1"));
        assert!(glob_match(b"*", b""));
        assert!(!glob_match(b"?", b""));
        assert!(glob_match(b"a*b*c", b"aXXbYYbZc"));
        assert!(!glob_match(b"a*b*c", b"aXXbYYbZ"));
        assert!(glob_match(b"*x", b"xxx"));
    }

    #[test]
    fn glob_classes_as_exports_5_describes_them() {
        assert!(glob_match(b"node[0-9].lab", b"node7.lab"));
        assert!(!glob_match(b"node[0-9].lab", b"nodeA.lab"));
        assert!(glob_match(b"node[!0-9].lab", b"nodeA.lab"));
        assert!(glob_match(b"node[^0-9].lab", b"nodeA.lab"));
        assert!(!glob_match(b"node[!0-9].lab", b"node3.lab"));
        assert!(glob_match(b"[abc]*.LAB", b"Bee.lab"), "classes ignore case too");
        assert!(glob_match(b"x[]]y", b"x]y"), "a ] first in the class is a member");
        assert!(glob_match(b"x[a-]y", b"x-y"), "a - last in the class is a member");
        assert!(glob_match(b"x[y", b"x[y"), "an unclosed [ is itself");
        assert!(!glob_match(b"x[y", b"xy"));
        assert!(glob_match(b"web[0-9][0-9].*.lab", b"web42.rack1.lab"));
    }

    #[test]
    fn glob_time_is_bounded_for_any_name() {
        // Exponential backtracking would take hours here; the linear one a few million steps.
        let name = vec![b'a'; 253];
        let pattern = b"*a*a*a*a*a*a*a*a*a*a*a*a*b";
        assert!(!glob_match(pattern, &name));
    }

    #[test]
    fn mount_paths() {
        let t = ExportTable {
            exports: vec![
                Export { id: 1, path: "/srv".into(), ..Default::default() },
                Export { id: 2, path: "/srv/data".into(), ..Default::default() },
            ],
        };
        assert_eq!(t.mount_candidates("/srv/data/x").into_iter().next().unwrap().0.id, 2);
        assert_eq!(t.mount_candidates("/srv/other").into_iter().next().unwrap().1, PathBuf::from("other"));
        assert!(t.mount_candidates("/").into_iter().next().is_none());
        assert!(t.mount_candidates("/srvx").into_iter().next().is_none());
        let single = ExportTable { exports: vec![Export { id: 1, path: "/srv".into(), ..Default::default() }] };
        assert_eq!(single.mount_candidates("/").into_iter().next().unwrap().1, PathBuf::new());
        assert_eq!(single.mount_candidates("").into_iter().next().unwrap().1, PathBuf::new());
        assert_eq!(single.mount_candidates("/srv/a").into_iter().next().unwrap().1, PathBuf::from("a"));
        assert_eq!(single.mount_candidates("/a/b").into_iter().next().unwrap().1, PathBuf::from("a/b"));
        assert_eq!(canonical_ip("::ffff:1.2.3.4".parse().unwrap()), "1.2.3.4".parse::<IpAddr>().unwrap());
        // An export written through a symlink is found by either name.
        let linked = ExportTable {
            exports: vec![
                Export { id: 1, path: "/data/export/home".into(), written_paths: vec!["/export/home".into()], ..Default::default() },
                Export { id: 2, path: "/srv".into(), ..Default::default() },
            ],
        };
        assert_eq!(
            linked.mount_candidates("/export/home/u1").into_iter().next().map(|(e, rest)| (e.id, rest)),
            Some((1, PathBuf::from("u1")))
        );
        assert_eq!(
            linked.mount_candidates("/data/export/home").into_iter().next().map(|(e, rest)| (e.id, rest)),
            Some((1, PathBuf::new()))
        );
        assert!(linked.mount_candidates("/export").into_iter().next().is_none());
        let nested: Vec<_> = t.mount_candidates("/srv/data/x").into_iter().map(|(e, rest)| (e.id, rest)).collect();
        assert_eq!(nested, vec![(2, PathBuf::from("x")), (1, PathBuf::from("data/x"))], "the deepest first, then those above it");
    }
}
