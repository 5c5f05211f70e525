//! portmap/rpcbind v2-4 argument decoders: the first byte picks the version (2..=5), the
//! second the procedure (0..=15).
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::portmap::Args;
use nasd::xdr::XdrReader;

fuzz_target!(|data: &[u8]| {
    let [v, p, body @ ..] = data else { return };
    let mut r = XdrReader::new(body);
    let _ = Args::decode(2 + (v % 4) as u32, (p % 16) as u32, &mut r);
    assert!(r.position() <= body.len());
});
