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

    /// Loads the key from `dir/handle-key`, creating it (mode 0600) on first start.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("handle-key");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("{}: expected 32 bytes, found {}", path.display(), bytes.len()))?;
                Ok(Self { key })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).with_context(|| format!("creating state directory {}", dir.display()))?;
                let mut key = [0u8; 32];
                rand::Rng::fill(&mut rand::thread_rng(), &mut key);
                let tmp = dir.join("handle-key.tmp");
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .with_context(|| format!("writing {}", tmp.display()))?;
                f.write_all(&key)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)?;
                if let Ok(d) = std::fs::File::open(dir) {
                    let _ = d.sync_all();
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

#[cfg(test)]
mod tests {
    use super::*;

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
