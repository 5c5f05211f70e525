//! A quick, deterministic fuzz pass over every decoder, for `cargo test` (the real
//! fuzzing is `fuzz/`, with cargo-fuzz). 200,000 inputs per decoder: random bytes and
//! mutations of the seeds captured from real clients (fuzz/seeds/), driven by a
//! fixed-seed PRNG. A decoder must not panic, must not read past its input, and no
//! single allocation may exceed MAX_ALLOC (a counting global allocator checks that).

use nasd::rpc::auth::AuthSys;
use nasd::rpc::message::decode_call;
use nasd::rpc::record::{read_record, RecordLimits};
use nasd::xdr::XdrReader;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

const ITERATIONS: usize = 200_000;
/// The record reader grows its buffer in 64 KiB steps; nothing else should come close.
const MAX_ALLOC: usize = 256 * 1024;

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.fetch_max(n, Ordering::Relaxed);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// splitmix64: small, fixed-seed, good enough to drive mutations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut v: Vec<Vec<u8>> =
        std::fs::read_dir(&dir).map(|d| d.filter_map(|e| std::fs::read(e.ok()?.path()).ok()).collect()).unwrap_or_default();
    v.sort();
    // A renamed or emptied seed directory would leave only random input, silently.
    assert!(!v.is_empty(), "no seeds for {target} in {}", dir.display());
    v
}

/// Interesting 32-bit words: lengths and discriminants at and around the limits.
const WORDS: [u32; 12] = [0, 1, 2, 3, 4, 16, 17, 255, 256, 1024, 0x7fff_ffff, 0xffff_ffff];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    if seeds.is_empty() || rng.below(4) == 0 {
        let n = rng.below(512);
        out.extend((0..n).map(|_| rng.next() as u8));
        return;
    }
    out.extend_from_slice(&seeds[rng.below(seeds.len())]);
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 if out.len() >= 4 => {
                // Overwrite an aligned word with a boundary value: lengths, counts, tags.
                let i = rng.below(out.len() / 4) * 4;
                out[i..i + 4].copy_from_slice(&WORDS[rng.below(WORDS.len())].to_be_bytes());
            }
            3 => out.truncate(rng.below(out.len() + 1)),
            4 => {
                let n = rng.below(64);
                out.extend((0..n).map(|_| rng.next() as u8));
            }
            _ if out.len() > 8 => {
                // Splice a chunk of the input onto itself.
                let a = rng.below(out.len());
                let b = a + rng.below(out.len() - a);
                let chunk = out[a..b].to_vec();
                let at = rng.below(out.len());
                out.splice(at..at, chunk);
            }
            _ => {}
        }
    }
}

fn run(target: &str, seed: u64, mut f: impl FnMut(&[u8])) {
    let seeds = seeds(target);
    let mut rng = Rng(seed);
    let mut buf = Vec::new();
    for _ in 0..ITERATIONS {
        mutate(&mut rng, &seeds, &mut buf);
        f(&buf);
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest <= MAX_ALLOC, "{target}: an allocation of {largest} bytes");
}

#[test]
fn rpc_call_and_auth_sys() {
    run("rpc_call", 1, |d| {
        let mut r = XdrReader::new(d);
        let _ = decode_call(&mut r);
        assert!(r.position() <= d.len());
        if let Ok(a) = AuthSys::decode(d) {
            assert!(a.gids.len() <= 16);
        }
    });
}

#[test]
fn nfs3_args() {
    run("nfs3_args", 2, |d| {
        let Some((&p, body)) = d.split_first() else { return };
        let mut r = XdrReader::new(body);
        let _ = nasd::nfs3::xdr::Args::decode((p % 24) as u32, &mut r);
        assert!(r.position() <= body.len());
    });
}

#[test]
fn mount3_args() {
    run("mount3_args", 3, |d| {
        let Some((&p, body)) = d.split_first() else { return };
        let mut r = XdrReader::new(body);
        let _ = nasd::mount3::Args::decode((p % 8) as u32, &mut r);
        assert!(r.position() <= body.len());
    });
}

#[test]
fn portmap_args() {
    run("portmap_args", 4, |d| {
        let [v, p, body @ ..] = d else { return };
        let mut r = XdrReader::new(body);
        let _ = nasd::portmap::Args::decode(2 + (v % 4) as u32, (p % 16) as u32, &mut r);
        assert!(r.position() <= body.len());
    });
}

#[test]
fn rpc_record() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    run("rpc_record", 5, |d| {
        let Some((&sel, stream)) = d.split_first() else { return };
        let limits = RecordLimits { max_record: [8usize, 100, 4096, 1 << 20][(sel % 4) as usize], max_fragments: 1 + (sel >> 2) as usize };
        rt.block_on(async {
            // Small and large read buffers: records then straddle buffered and direct reads.
            let mut r = tokio::io::BufReader::with_capacity([4usize, 64, 8192][sel as usize % 3], stream);
            let mut buf = Vec::new();
            while let Ok(true) = read_record(&mut r, &limits, &mut buf).await {
                assert!(buf.len() <= limits.max_record);
            }
            assert!(buf.capacity() <= stream.len() + 64 * 1024);
        });
    });
}
