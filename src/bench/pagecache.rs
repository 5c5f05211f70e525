//! The page-cache state a fio job starts from.
//!
//! Where a file's pages stand when a job begins changes what the job measures: pages the
//! kernel dropped are read from the disk, and pages cached by 4 KiB random reads stay
//! 4 KiB folios that later 1 MiB writes and their writeback pay for page by page (about
//! twice the kernel work per MiB of a file cached in large folios). Between one target's
//! run of a job and its next job the other targets run for tens of seconds, long enough
//! for a host that reclaims idle page cache (a DAMON `pageout` scheme, say) to drop some
//! or all of the file. So before each fio job the bench drops the file's cached pages and
//! reads it once from start to end: every target and every job starts with the whole file
//! cached, in the folios a sequential read leaves, whatever ran before.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Drops `path`'s cached pages (after writing back its dirty ones) and reads it through
/// once. Returns the bytes read.
pub fn warm(path: &Path) -> Result<u64> {
    let mut f = File::open(path).with_context(|| format!("opening {} to warm its cache", path.display()))?;
    // Dirty pages survive DONTNEED; write them back first.
    f.sync_data().with_context(|| format!("syncing {}", path.display()))?;
    fadvise(&f, libc::POSIX_FADV_DONTNEED).with_context(|| format!("dropping the cached pages of {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        total += n as u64;
    }
}

fn fadvise(f: &File, advice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain syscall on a descriptor `f` keeps open.
    match unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, advice) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Share of `path`'s pages in the page cache (`mincore` over a mapping of it).
pub fn resident_fraction(path: &Path) -> Result<f64> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok(1.0);
    }
    // SAFETY: a private read-only mapping that is only passed to mincore and unmapped
    // before return; no page of it is touched, so nothing is read in.
    unsafe {
        let addr = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mut vec = vec![0u8; len.div_ceil(page)];
        let r = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(addr, len);
        if r != 0 {
            return Err(err).context("mincore");
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / vec.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn warming_leaves_the_whole_file_cached_after_its_pages_were_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 8 << 20]).unwrap();
        f.sync_all().unwrap();
        fadvise(&f, libc::POSIX_FADV_DONTNEED).unwrap();
        let dropped = resident_fraction(&path).unwrap();
        // tmpfs keeps every page (DONTNEED cannot drop them); elsewhere they are gone now.
        if !on_tmpfs(dir.path()) {
            assert!(dropped < 0.5, "{dropped:.3} of the file still cached after DONTNEED");
        }
        assert_eq!(warm(&path).unwrap(), 8 << 20);
        let warmed = resident_fraction(&path).unwrap();
        assert!(warmed > 0.99, "after warming {warmed:.3} of the file is cached (before: {dropped:.3})");
    }

    fn on_tmpfs(dir: &Path) -> bool {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out-pointer.
        unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
    }
}
