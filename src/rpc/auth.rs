//! RPC credentials: AUTH_NONE and AUTH_SYS (RFC 5531 appendix A).

use crate::xdr::{XdrError, XdrReader, XdrResult};

pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;

/// RFC 5531 bounds an opaque_auth body to 400 bytes.
pub const MAX_AUTH_BYTES: usize = 400;
/// AUTH_SYS machine names are at most 255 bytes.
pub const MAX_MACHINE_NAME: usize = 255;
/// AUTH_SYS carries at most 16 supplementary groups.
pub const MAX_AUTH_SYS_GROUPS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSys {
    pub stamp: u32,
    pub machine_name: String,
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    None,
    Sys(AuthSys),
}

impl AuthSys {
    /// Decodes an AUTH_SYS body. Oversized names or group lists are errors rather than
    /// silently truncated, so the caller can answer AUTH_BADCRED.
    pub fn decode(body: &[u8]) -> XdrResult<AuthSys> {
        let mut r = XdrReader::new(body);
        let stamp = r.u32()?;
        let name = r.opaque(MAX_MACHINE_NAME)?;
        let uid = r.u32()?;
        let gid = r.u32()?;
        let n = r.u32()? as usize;
        if n > MAX_AUTH_SYS_GROUPS {
            return Err(XdrError::TooLong { len: n, max: MAX_AUTH_SYS_GROUPS });
        }
        let mut gids = Vec::with_capacity(n);
        for _ in 0..n {
            gids.push(r.u32()?);
        }
        Ok(AuthSys { stamp, machine_name: String::from_utf8_lossy(name).into_owned(), uid, gid, gids })
    }

    pub fn encode(&self, w: &mut crate::xdr::XdrWriter) {
        w.u32(self.stamp);
        w.opaque(self.machine_name.as_bytes());
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.gids.len() as u32);
        for g in &self.gids {
            w.u32(*g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::XdrWriter;

    fn encoded(groups: usize, name_len: usize) -> Vec<u8> {
        let mut w = XdrWriter::new();
        w.u32(1);
        w.opaque(&vec![b'h'; name_len]);
        w.u32(1000);
        w.u32(100);
        w.u32(groups as u32);
        for g in 0..groups {
            w.u32(g as u32);
        }
        w.into_inner()
    }

    #[test]
    fn decodes_auth_sys() {
        let a = AuthSys::decode(&encoded(3, 5)).unwrap();
        assert_eq!((a.uid, a.gid, a.gids.clone()), (1000, 100, vec![0, 1, 2]));
        assert_eq!(a.machine_name, "hhhhh");
        let mut w = XdrWriter::new();
        a.encode(&mut w);
        assert_eq!(AuthSys::decode(w.as_slice()).unwrap(), a);
    }

    #[test]
    fn rejects_more_than_16_groups_and_long_names() {
        assert!(AuthSys::decode(&encoded(16, 10)).is_ok());
        assert!(AuthSys::decode(&encoded(17, 10)).is_err());
        assert!(AuthSys::decode(&encoded(1, 256)).is_err());
        assert!(AuthSys::decode(&encoded(1, 255)).is_ok());
    }
}
