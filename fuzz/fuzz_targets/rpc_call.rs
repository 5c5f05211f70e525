//! RPC call header (with the credential and verifier) and AUTH_SYS bodies.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::rpc::auth::{AuthSys, MAX_AUTH_SYS_GROUPS, MAX_MACHINE_NAME};
use nasd::rpc::message::decode_call;
use nasd::xdr::XdrReader;

fuzz_target!(|data: &[u8]| {
    let mut r = XdrReader::new(data);
    if decode_call(&mut r).is_ok() {
        assert!(r.position() <= data.len());
    }
    // The same bytes as a bare AUTH_SYS body.
    if let Ok(a) = AuthSys::decode(data) {
        assert!(a.gids.len() <= MAX_AUTH_SYS_GROUPS);
        assert!(a.machine_name.len() <= MAX_MACHINE_NAME * 3);
    }
});
