//! RPC call and reply headers (RFC 5531 section 9).

use super::auth::{AuthSys, Credential, AUTH_NONE, AUTH_SYS, MAX_AUTH_BYTES};
use crate::xdr::{XdrReader, XdrWriter};

pub const RPC_VERSION: u32 = 2;
const MSG_CALL: u32 = 0;
const MSG_REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const REJECT_RPC_MISMATCH: u32 = 0;
const REJECT_AUTH_ERROR: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum AcceptError {
    ProgUnavail = 1,
    ProgMismatch = 2,
    ProcUnavail = 3,
    GarbageArgs = 4,
    SystemErr = 5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum AuthStat {
    BadCred = 1,
    RejectedCred = 2,
    BadVerf = 3,
    RejectedVerf = 4,
    TooWeak = 5,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader {
    pub xid: u32,
    pub program: u32,
    pub version: u32,
    pub procedure: u32,
    pub credential: Credential,
}

/// Why a call header could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Not even an XID and message type: nothing can be answered.
    Unparseable,
    /// A REPLY or unknown message type sent to a server: ignored.
    NotACall,
    /// Answer MSG_DENIED / RPC_MISMATCH.
    RpcMismatch { xid: u32 },
    /// Answer MSG_DENIED / AUTH_ERROR.
    Auth { xid: u32, stat: AuthStat },
}

/// Decodes a call header; on success the reader is left at the procedure arguments.
pub fn decode_call(r: &mut XdrReader<'_>) -> Result<CallHeader, HeaderError> {
    let xid = r.u32().map_err(|_| HeaderError::Unparseable)?;
    let mtype = r.u32().map_err(|_| HeaderError::Unparseable)?;
    if mtype != MSG_CALL {
        return Err(HeaderError::NotACall);
    }
    let garbage = HeaderError::Auth { xid, stat: AuthStat::BadCred };
    let rpcvers = r.u32().map_err(|_| garbage.clone())?;
    if rpcvers != RPC_VERSION {
        return Err(HeaderError::RpcMismatch { xid });
    }
    let program = r.u32().map_err(|_| garbage.clone())?;
    let version = r.u32().map_err(|_| garbage.clone())?;
    let procedure = r.u32().map_err(|_| garbage.clone())?;
    let flavor = r.u32().map_err(|_| garbage.clone())?;
    let body = r.opaque(MAX_AUTH_BYTES).map_err(|_| garbage.clone())?;
    let verf_flavor = r.u32().map_err(|_| HeaderError::Auth { xid, stat: AuthStat::BadVerf })?;
    let _verf = r.opaque(MAX_AUTH_BYTES).map_err(|_| HeaderError::Auth { xid, stat: AuthStat::BadVerf })?;
    // The credential first, as knfsd: a call under a flavor not served (RPCSEC_GSS,
    // whose verifier is of its own flavor too) hears BADCRED, not of its verifier.
    let credential = match flavor {
        AUTH_NONE => Credential::None,
        AUTH_SYS => Credential::Sys(AuthSys::decode(body).map_err(|_| garbage)?),
        _ => return Err(HeaderError::Auth { xid, stat: AuthStat::BadCred }),
    };
    if verf_flavor != AUTH_NONE && verf_flavor != AUTH_SYS {
        return Err(HeaderError::Auth { xid, stat: AuthStat::BadVerf });
    }
    Ok(CallHeader { xid, program, version, procedure, credential })
}

fn reply_prefix(w: &mut XdrWriter, xid: u32, reply_stat: u32) {
    w.u32(xid);
    w.u32(MSG_REPLY);
    w.u32(reply_stat);
}

/// MSG_ACCEPTED + AUTH_NONE verifier + SUCCESS; procedure results follow.
pub fn encode_success(w: &mut XdrWriter, xid: u32) {
    reply_prefix(w, xid, MSG_ACCEPTED);
    w.u32(AUTH_NONE);
    w.u32(0);
    w.u32(0);
}

pub fn encode_accept_error(w: &mut XdrWriter, xid: u32, err: AcceptError, versions: (u32, u32)) {
    reply_prefix(w, xid, MSG_ACCEPTED);
    w.u32(AUTH_NONE);
    w.u32(0);
    w.u32(err as u32);
    if err == AcceptError::ProgMismatch {
        w.u32(versions.0);
        w.u32(versions.1);
    }
}

pub fn encode_rpc_mismatch(w: &mut XdrWriter, xid: u32) {
    reply_prefix(w, xid, MSG_DENIED);
    w.u32(REJECT_RPC_MISMATCH);
    w.u32(RPC_VERSION);
    w.u32(RPC_VERSION);
}

pub fn encode_auth_error(w: &mut XdrWriter, xid: u32, stat: AuthStat) {
    reply_prefix(w, xid, MSG_DENIED);
    w.u32(REJECT_AUTH_ERROR);
    w.u32(stat as u32);
}

/// Encodes a call header (used by tests and the benchmark's own probes).
pub fn encode_call(w: &mut XdrWriter, xid: u32, program: u32, version: u32, procedure: u32, cred: &Credential) {
    w.u32(xid);
    w.u32(MSG_CALL);
    w.u32(RPC_VERSION);
    w.u32(program);
    w.u32(version);
    w.u32(procedure);
    match cred {
        Credential::None => {
            w.u32(AUTH_NONE);
            w.u32(0);
        }
        Credential::Sys(sys) => {
            w.u32(AUTH_SYS);
            let mut body = XdrWriter::new();
            sys.encode(&mut body);
            w.opaque(body.as_slice());
        }
    }
    w.u32(AUTH_NONE);
    w.u32(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_round_trip() {
        let cred = Credential::Sys(AuthSys { stamp: 9, machine_name: "c".into(), uid: 5, gid: 6, gids: vec![7] });
        let mut w = XdrWriter::new();
        encode_call(&mut w, 42, 100003, 3, 1, &cred);
        w.u32(0xdead);
        let buf = w.into_inner();
        let mut r = XdrReader::new(&buf);
        let h = decode_call(&mut r).unwrap();
        assert_eq!((h.xid, h.program, h.version, h.procedure), (42, 100003, 3, 1));
        assert_eq!(h.credential, cred);
        assert_eq!(r.u32().unwrap(), 0xdead);
    }

    #[test]
    fn header_errors() {
        // A call header made of these words, decoded.
        let decoded = |words: &[u32]| {
            let mut w = XdrWriter::new();
            for v in words {
                w.u32(*v);
            }
            decode_call(&mut XdrReader::new(w.as_slice()))
        };
        assert_eq!(decoded(&[1, MSG_CALL, 3]), Err(HeaderError::RpcMismatch { xid: 1 }));
        assert_eq!(decode_call(&mut XdrReader::new(&[0, 0])), Err(HeaderError::Unparseable));
        assert_eq!(decoded(&[1, MSG_REPLY]), Err(HeaderError::NotACall));
        // Unknown flavor (RPCSEC_GSS = 6) is an auth error, not garbage.
        assert_eq!(decoded(&[7, MSG_CALL, 2, 100003, 3, 0, 6, 0, 0, 0]), Err(HeaderError::Auth { xid: 7, stat: AuthStat::BadCred }));
        // An RPCSEC_GSS call carries a verifier of that flavor too: still the credential.
        assert_eq!(decoded(&[8, MSG_CALL, 2, 100003, 3, 0, 6, 0, 6, 0]), Err(HeaderError::Auth { xid: 8, stat: AuthStat::BadCred }));
        // A served credential with a verifier of an unknown flavor is the verifier's fault.
        assert_eq!(decoded(&[9, MSG_CALL, 2, 100003, 3, 0, 0, 0, 6, 0]), Err(HeaderError::Auth { xid: 9, stat: AuthStat::BadVerf }));
    }

    #[test]
    fn prog_mismatch_carries_range() {
        let mut w = XdrWriter::new();
        encode_accept_error(&mut w, 3, AcceptError::ProgMismatch, (3, 3));
        let buf = w.into_inner();
        let mut r = XdrReader::new(&buf);
        let words: Vec<u32> = (0..8).map(|_| r.u32().unwrap()).collect();
        assert_eq!(words, vec![3, MSG_REPLY, MSG_ACCEPTED, 0, 0, 2, 3, 3]);
    }
}
