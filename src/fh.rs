//! Wire file handles: compose and verify (the role of knfsd's nfsfh.c).
//!
//! Layout: version (1) | export id (4, big endian) | object id length (1) | object id |
//! authenticator (12). The authenticator is a keyed BLAKE3 MAC under a secret kept in the
//! server's state directory, so handles stay valid across restarts while a forged or
//! altered handle is refused before it reaches the backend.

use crate::vfs::{ObjectId, VfsError, MAX_OBJECT_ID};
use anyhow::Context;
use std::path::Path;

const VERSION: u8 = 1;
const MAC_LEN: usize = 12;
const HEADER: usize = 6;
/// Largest handle this server issues (fits NFSv3's 64 bytes).
pub const MAX_HANDLE: usize = HEADER + MAX_OBJECT_ID + MAC_LEN;

#[derive(Clone)]
pub struct HandleKey {
    key: [u8; 32],
}

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

impl HandleKey {
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// A name for this key that does not give it away: what files kept outside the state
    /// directory for it are named by.
    pub fn fingerprint(&self) -> [u8; 16] {
        blake3::keyed_hash(&self.key, b"nasd key fingerprint").as_bytes()[..16].try_into().expect("16 bytes")
    }

    /// Loads the key from `dir/handle-key`, creating it (mode 0600, in a directory of mode
    /// 0700) on first start. Whoever can write the directory or read the key can forge
    /// handles to any file of an exported file system, so a key or directory another user
    /// owns is refused, and one of ours that others may use is made private again.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<Self> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        private_dir(dir, "state directory")?;
        let path = dir.join("handle-key");
        let no_follow = libc::O_NOFOLLOW | libc::O_CLOEXEC;
        match std::fs::OpenOptions::new().read(true).custom_flags(no_follow).open(&path) {
            Ok(f) => {
                let meta = f.metadata().with_context(|| format!("reading {}", path.display()))?;
                anyhow::ensure!(meta.is_file(), "{} is not a regular file", path.display());
                anyhow::ensure!(
                    meta.uid() == effective_uid(),
                    "{} belongs to uid {}, not to this server (uid {}): refusing a key someone else may have written",
                    path.display(),
                    meta.uid(),
                    effective_uid()
                );
                if meta.mode() & 0o077 != 0 {
                    tracing::warn!(key = %path.display(), mode = format!("{:o}", meta.mode() & 0o7777), "the handle key was readable by others, who can forge file handles with it: made private; delete it (every client must mount again) if others may have read it");
                    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                }
                let mut bytes = Vec::with_capacity(33);
                (&f).take(33).read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
                let key: [u8; 32] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("{}: expected 32 bytes, found {}", path.display(), bytes.len()))?;
                Ok(Self { key })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                rand::Rng::fill(&mut rand::thread_rng(), &mut key);
                let written = replace_private_file(&path, |f| {
                    use std::io::Write;
                    f.write_all(&key)
                });
                if let Err(e) = written {
                    // Not left for the next start to take as durable: no handle was made
                    // with it yet, and a key made anew then is as good.
                    let _ = std::fs::remove_file(&path);
                    return Err(e).with_context(|| format!("writing {} durably", path.display()));
                }
                Ok(Self { key })
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let h = blake3::keyed_hash(&self.key, data);
        h.as_bytes()[..MAC_LEN].try_into().expect("MAC_LEN bytes")
    }

    pub fn encode(&self, export_id: u32, obj: &ObjectId) -> Vec<u8> {
        let id = obj.as_bytes();
        let mut v = Vec::with_capacity(HEADER + id.len() + MAC_LEN);
        v.push(VERSION);
        v.extend_from_slice(&export_id.to_be_bytes());
        v.push(id.len() as u8);
        v.extend_from_slice(id);
        let mac = self.mac(&v);
        v.extend_from_slice(&mac);
        v
    }

    /// Verifies a handle from the wire: `BadHandle` if malformed, `Stale` if its
    /// authenticator does not match (forged, altered, or from another server's key).
    pub fn decode(&self, fh: &[u8]) -> Result<(u32, ObjectId), VfsError> {
        if fh.len() < HEADER + MAC_LEN || fh.len() > MAX_HANDLE || fh[0] != VERSION {
            return Err(VfsError::BadHandle);
        }
        let n = fh[5] as usize;
        if fh.len() != HEADER + n + MAC_LEN {
            return Err(VfsError::BadHandle);
        }
        let (body, mac) = fh.split_at(HEADER + n);
        // Constant-time compare: the MAC is what keeps handles unforgeable.
        let expect = self.mac(body);
        if expect.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(VfsError::Stale);
        }
        let export_id = u32::from_be_bytes(fh[1..5].try_into().expect("4 bytes"));
        let obj = ObjectId::new(&body[HEADER..]).ok_or(VfsError::BadHandle)?;
        Ok((export_id, obj))
    }
}

/// Creates `dir` (mode 0700; missing parents 0755, as `mkdir -p` makes them) or checks
/// that it is this server's alone: a directory owned by it and writable by nobody else
/// (tightened if it is ours). A symbolic link to such a directory counts as that
/// directory only if the link is this server's too: one planted by another user where
/// the state directory was to be could otherwise turn the server onto a directory of its
/// own such as `/tmp`, and make it private. `what` names the directory in errors
/// ("state directory").
pub(crate) fn private_dir(dir: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if let Ok(link) = std::fs::symlink_metadata(dir) {
        anyhow::ensure!(
            !link.file_type().is_symlink() || link.uid() == effective_uid(),
            "{what} {} is a symbolic link that belongs to uid {}, not to this server (uid {})",
            dir.display(),
            link.uid(),
            effective_uid()
        );
    }
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .with_context(|| format!("creating {}, the {what}'s parent", parent.display()))?;
            }
            std::fs::DirBuilder::new().mode(0o700).create(dir).with_context(|| format!("creating {what} {}", dir.display()))
        }
        Err(e) => Err(e).with_context(|| format!("{what} {}", dir.display())),
        Ok(meta) => {
            anyhow::ensure!(meta.is_dir(), "{what} {} is not a directory", dir.display());
            anyhow::ensure!(
                meta.uid() == effective_uid(),
                "{what} {} belongs to uid {}, not to this server (uid {})",
                dir.display(),
                meta.uid(),
                effective_uid()
            );
            if meta.mode() & 0o022 != 0 {
                tracing::warn!(dir = %dir.display(), mode = format!("{:o}", meta.mode() & 0o7777), "the {what} was writable by others, who could replace what it holds: made private");
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("making {what} {} private", dir.display()))?;
            }
            Ok(())
        }
    }
}

/// Opens (or makes, mode 0600) a file of the state directory for reading and writing,
/// never through a symbolic link.
pub(crate) fn open_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Puts a file written by `fill` in place of the one at `path` (or where there is none),
/// durably: it is written to `path.new`, synced and renamed over `path`, whose name is
/// then made durable too, so that a crash leaves the old file or the new one whole. The
/// name needs the file system synced (`syncfs`) where it keeps no journal: there the
/// directory's `fsync` does not cover a rename.
pub(crate) fn replace_private_file(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".new");
    let new = std::path::PathBuf::from(name);
    // Left by a start that crashed: made anew, never written through (it may be a link).
    match std::fs::remove_file(&new) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = open_private_file(&new)?;
    fill(&mut file)?;
    file.sync_all()?;
    std::fs::rename(&new, path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = std::fs::File::open(dir)?;
    dir.sync_all()?;
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    dir.sync_all()?;
    Ok(file)
}

/// Whether `path` is on a file system kept in memory (tmpfs, ramfs): what it holds
/// survives the process, not a reboot, and is never written to a disk.
pub(crate) fn on_memory_file_system(path: &Path) -> bool {
    const RAMFS_MAGIC: libc::c_long = 0x8584_58F6;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: statfs fills the zeroed struct; the path is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && matches!(st.f_type, libc::TMPFS_MAGIC | RAMFS_MAGIC) }
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's umask, read without changing it (tests run in parallel).
    fn umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap();
        u32::from_str_radix(line.trim(), 8).unwrap()
    }

    /// Gives `p` itself (not what a link points at) to uid and gid 4321. Needs root.
    fn give_away(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 4321, 4321) }, 0);
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_key_and_its_directory_are_made_private_whatever_the_umask() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("state").join("nasd");
        // The server runs with umask 0 (created files get the mode clients ask for), so
        // only modes given explicitly keep others out; whatever the umask here, they must.
        let key = HandleKey::load_or_create(&dir).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        assert_eq!(mode_of(dir.parent().unwrap()), 0o755 & !umask(), "a parent made on the way is not private");
        assert_eq!(mode_of(&dir.join("handle-key")), 0o600);
        assert_eq!(HandleKey::load_or_create(&dir).unwrap().key, key.key, "the same key on the next start");
    }

    #[test]
    fn a_state_directory_others_can_write_is_made_private_and_keeps_its_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = HandleKey::load_or_create(dir.path()).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(dir.path().join("handle-key"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(HandleKey::load_or_create(dir.path()).unwrap().key, key.key);
        assert_eq!(mode_of(dir.path()), 0o700);
        assert_eq!(mode_of(&dir.path().join("handle-key")), 0o600);
    }

    #[test]
    fn a_state_directory_reached_through_a_link_is_that_directory() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("data-nasd");
        let key = HandleKey::load_or_create(&real).unwrap();
        let link = dir.path().join("nasd");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(HandleKey::load_or_create(&link).unwrap().key, key.key);
        // ...and its target is checked as the directory itself would be
        std::fs::write(dir.path().join("plain"), b"").unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(dir.path().join("plain"), &link).unwrap();
        assert!(HandleKey::load_or_create(&link).is_err());
    }

    #[test]
    fn a_link_another_user_planted_is_not_followed() {
        if unsafe { libc::geteuid() } != 0 {
            return crate::testing::skip("needs root to give a link away");
        }
        // Another user's link where the state directory was to be, pointing at a directory
        // of the server's own that others use: refused, and that directory left as it was.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let link = dir.path().join("nasd");
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        give_away(&link);
        let e = HandleKey::load_or_create(&link).unwrap_err();
        assert!(format!("{e:#}").contains("symbolic link that belongs to uid 4321"), "{e:#}");
        assert_eq!(mode_of(&shared), 0o1777);
        assert!(!shared.join("handle-key").exists());
    }

    #[test]
    fn a_planted_temporary_file_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("handle-key.new")).unwrap();
        HandleKey::load_or_create(&state).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(state.join("handle-key")).unwrap().len(), 32);
        // A key that is a link to another file is refused, not read.
        std::fs::remove_file(state.join("handle-key")).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("handle-key")).unwrap();
        assert!(HandleKey::load_or_create(&state).is_err());
    }

    #[test]
    fn a_key_or_directory_someone_else_owns_is_refused() {
        if unsafe { libc::geteuid() } != 0 {
            return crate::testing::skip("needs root to give files away");
        }
        let dir = tempfile::tempdir().unwrap();
        HandleKey::load_or_create(dir.path()).unwrap();
        give_away(&dir.path().join("handle-key"));
        let e = HandleKey::load_or_create(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("belongs to uid 4321"), "{e:#}");
        give_away(dir.path());
        let e = HandleKey::load_or_create(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("state directory"), "{e:#}");
    }

    #[test]
    fn round_trip_and_tamper_detection() {
        let k = HandleKey::from_bytes([7; 32]);
        let obj = ObjectId::new(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]).unwrap();
        let fh = k.encode(99, &obj);
        assert!(fh.len() <= 64);
        assert_eq!(k.decode(&fh).unwrap(), (99, obj));
        for i in 0..fh.len() {
            let mut bad = fh.clone();
            bad[i] ^= 0x40;
            assert!(k.decode(&bad).is_err(), "flipping byte {i} must be detected");
        }
        assert_eq!(HandleKey::from_bytes([8; 32]).decode(&fh), Err(VfsError::Stale));
        assert_eq!(k.decode(&fh[..10]), Err(VfsError::BadHandle));
        assert_eq!(k.decode(&[]), Err(VfsError::BadHandle));
    }

    #[test]
    fn key_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = HandleKey::load_or_create(dir.path()).unwrap();
        let b = HandleKey::load_or_create(dir.path()).unwrap();
        assert_eq!(a.key, b.key);
    }
}
