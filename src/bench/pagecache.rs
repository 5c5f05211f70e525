//! The page-cache state a fio job starts from, and the machine's page-cache facts.
//!
//! Where a file's pages stand when a job begins changes what the job measures. Pages the
//! kernel dropped are read from the disk. The size of the folios the rest are cached in
//! matters as much: large writes into 4 KiB folios take the kernel about twice the work
//! per MiB, and 4 KiB random writes into large folios ran at a sixth of their rate into
//! 4 KiB ones (docs/performance.md). Between one target's run of a job and its next the
//! other targets run for tens of seconds, long enough for a host that reclaims idle page
//! cache (a DAMON `pageout` scheme, say) to drop some or all of the file, by its own
//! timing. So before each fio job on a server the bench drops the file's cached pages and
//! reads it through once, in the way the job's own access pattern would have fetched it
//! from the disk: every target starts each job with the whole file cached, in the same
//! folios, whatever ran before. The report also names such a reclaim policy.

use anyhow::{Context, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// What the report says about the state `warm` sets.
pub const REPORT_NOTE: &str = "before each fio job on a server the bench started, the job's file was written back, dropped from the page cache and read through once the way the job's own access pattern fetches it: random jobs found it wholly cached in 4 KiB folios, sequential ones in the folios a sequential read leaves, large where the file system has them (the local disk's jobs use direct I/O).";

/// How a job's file is cached when the job starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// In 4 KiB folios: what random reads leave, each fetching only the pages it needs.
    SmallFolios,
    /// In the large folios that a sequential read's readahead leaves.
    LargeFolios,
}

impl CacheState {
    /// The state a job of fio access pattern `rw` would leave had it fetched the file from
    /// the disk itself: random patterns small folios, sequential ones large.
    pub fn for_pattern(rw: &str) -> Self {
        if rw.starts_with("rand") {
            CacheState::SmallFolios
        } else {
            CacheState::LargeFolios
        }
    }
}

/// Writes back `path`'s dirty pages, drops its cached pages and reads it through once so
/// that all of it is cached in `state`. Returns the bytes read.
pub fn warm(path: &Path, state: CacheState) -> Result<u64> {
    let f = File::open(path).with_context(|| format!("opening {} to warm its cache", path.display()))?;
    // Dirty pages survive DONTNEED; write them back first.
    f.sync_data().with_context(|| format!("syncing {}", path.display()))?;
    fadvise(&f, libc::POSIX_FADV_DONTNEED).with_context(|| format!("dropping the cached pages of {}", path.display()))?;
    // With FADV_RANDOM the kernel reads just the pages asked for, into order-0 folios,
    // and still in one request per read: the whole file comes in at near sequential speed.
    let advice = match state {
        CacheState::SmallFolios => libc::POSIX_FADV_RANDOM,
        CacheState::LargeFolios => libc::POSIX_FADV_SEQUENTIAL,
    };
    fadvise(&f, advice).with_context(|| format!("advising the access pattern of {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match std::os::unix::fs::FileExt::read_at(&f, &mut buf, total) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

fn fadvise(f: &File, advice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain syscall on a descriptor `f` keeps open.
    match unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, advice) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Host policies that drop idle page cache behind the bench's back, for the report's
/// machine facts: DAMON `pageout` schemes of running kdamonds (`damon` is the DAMON sysfs
/// admin directory, `/sys/kernel/mm/damon/admin`). None when there are none.
pub fn idle_page_reclaim(damon: &Path) -> Option<String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let subdirs = |p: &Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        v.sort();
        v
    };
    let mut found = Vec::new();
    for kd in subdirs(&damon.join("kdamonds")) {
        if read(&kd.join("state")).as_deref() != Some("on") {
            continue;
        }
        for ctx in subdirs(&kd.join("contexts")) {
            let aggr_us: Option<u64> = read(&ctx.join("monitoring_attrs/intervals/aggr_us")).and_then(|v| v.parse().ok());
            for scheme in subdirs(&ctx.join("schemes")) {
                if read(&scheme.join("action")).as_deref() != Some("pageout") {
                    continue;
                }
                let min_age: Option<u64> = read(&scheme.join("access_pattern/age/min")).and_then(|v| v.parse().ok());
                found.push(match (aggr_us, min_age) {
                    (Some(a), Some(m)) => format!("DAMON pageout of memory idle ≥ {} s", a.saturating_mul(m) as f64 / 1e6),
                    _ => "DAMON pageout".to_string(),
                });
            }
        }
    }
    found.dedup();
    (!found.is_empty()).then(|| found.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// Where `path`'s pages stand: (pages of the file, pages cached, cached pages that
    /// belong to folios of more than one page). The last is None where the kernel hides
    /// page frames from this process (it needs root).
    fn census(path: &Path) -> (usize, usize, Option<usize>) {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let pages = len.div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: a shared read-only mapping of `len` bytes, unmapped before return. Only
        // pages mincore reports cached are touched, and with readahead off for the
        // mapping, so the census reads nothing in.
        let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_ne!(addr, libc::MAP_FAILED);
        unsafe {
            assert_eq!(libc::madvise(addr, len, libc::MADV_RANDOM), 0);
            assert_eq!(libc::mincore(addr, len, vec.as_mut_ptr()), 0);
        }
        let cached: Vec<usize> = (0..pages).filter(|&i| vec[i] & 1 != 0).collect();
        let frames = (|| {
            let pagemap = File::open("/proc/self/pagemap").ok()?;
            let kpageflags = File::open("/proc/kpageflags").ok()?;
            let mut large = 0;
            for &i in &cached {
                let at = addr as usize + i * page;
                // SAFETY: inside the mapping; the page is cached, so this only maps it.
                unsafe { std::ptr::read_volatile(at as *const u8) };
                let mut e = [0u8; 8];
                pagemap.read_exact_at(&mut e, (at / page * 8) as u64).ok()?;
                let e = u64::from_ne_bytes(e);
                let pfn = e & ((1 << 55) - 1);
                if e >> 63 == 0 || pfn == 0 {
                    return None;
                }
                let mut fl = [0u8; 8];
                kpageflags.read_exact_at(&mut fl, pfn * 8).ok()?;
                // KPF_COMPOUND_HEAD (15) and KPF_COMPOUND_TAIL (16).
                if u64::from_ne_bytes(fl) & (3 << 15) != 0 {
                    large += 1;
                }
            }
            Some(large)
        })();
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(addr, len) };
        (pages, cached.len(), frames)
    }

    /// Warms `path` into `state` and takes its census, up to three times until the whole
    /// file is cached. A host's idle-memory reclaim (a DAMON `pageout` scheme over physical
    /// memory) judges coarse regions by sampling, so it can page out some of the freshly
    /// read pages by its own timing, between the warm-up and the census: a CI run saw 14 of
    /// 4,096 go. A warm-up that does not cache the file fails all three tries.
    fn warm_and_census(path: &Path, state: CacheState) -> (usize, usize, Option<usize>) {
        let mut last = None;
        for _ in 0..3 {
            assert_eq!(warm(path, state).unwrap(), 16 << 20);
            let c = census(path);
            if c.0 == c.1 {
                return c;
            }
            last = Some(c);
        }
        last.expect("three tries were made")
    }

    #[test]
    fn warming_caches_the_whole_file_in_the_folios_of_the_access_pattern() {
        assert_eq!(CacheState::for_pattern("randwrite"), CacheState::SmallFolios);
        assert_eq!(CacheState::for_pattern("randrw"), CacheState::SmallFolios);
        assert_eq!(CacheState::for_pattern("read"), CacheState::LargeFolios);
        assert_eq!(CacheState::for_pattern("write"), CacheState::LargeFolios);

        let dir = tempfile::tempdir().unwrap();
        if on_tmpfs(dir.path()) {
            crate::testing::skip("tmpfs keeps its pages through POSIX_FADV_DONTNEED, so no state can be set there");
            return;
        }
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 16 << 20]).unwrap();
        f.sync_all().unwrap();

        let (pages, cached, large) = warm_and_census(&path, CacheState::LargeFolios);
        assert_eq!(cached, pages, "after a sequential warm-up {cached} of {pages} pages are cached");
        let Some(large) = large else {
            crate::testing::skip("folio sizes not checked: /proc/kpageflags needs root");
            return;
        };
        let (pages, cached, small_state_large) = warm_and_census(&path, CacheState::SmallFolios);
        assert_eq!(cached, pages, "after a random warm-up {cached} of {pages} pages are cached");
        assert_eq!(small_state_large, Some(0), "a random warm-up leaves only 4 KiB folios");
        if large == 0 {
            crate::testing::skip("large folios not checked: this file system caches files in 4 KiB folios only");
        } else {
            assert!(large > pages / 2, "a sequential warm-up left only {large} of {pages} pages in large folios");
        }
    }

    fn on_tmpfs(dir: &Path) -> bool {
        crate::fh::on_memory_file_system(dir)
    }

    #[test]
    fn reports_running_damon_pageout_schemes_and_their_idle_age() {
        let dir = tempfile::tempdir().unwrap();
        let put = |rel: &str, v: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("{v}\n")).unwrap();
        };
        assert_eq!(idle_page_reclaim(dir.path()), None);
        put("kdamonds/0/state", "on");
        put("kdamonds/0/contexts/0/monitoring_attrs/intervals/aggr_us", "5000000");
        put("kdamonds/0/contexts/0/schemes/0/action", "stat");
        put("kdamonds/0/contexts/0/schemes/0/access_pattern/age/min", "6");
        assert_eq!(idle_page_reclaim(dir.path()), None, "a scheme that only counts drops nothing");
        put("kdamonds/0/contexts/0/schemes/1/action", "pageout");
        put("kdamonds/0/contexts/0/schemes/1/access_pattern/age/min", "6");
        assert_eq!(idle_page_reclaim(dir.path()).as_deref(), Some("DAMON pageout of memory idle ≥ 30 s"));
        put("kdamonds/0/state", "off");
        assert_eq!(idle_page_reclaim(dir.path()), None, "a stopped kdamond reclaims nothing");
    }
}
