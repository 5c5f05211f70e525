//! NFSv3 argument decoders: the first byte picks the procedure (0..=21, beyond that an
//! unknown procedure), the rest is the argument body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::nfs3::xdr::Args;
use nasd::xdr::XdrReader;

fuzz_target!(|data: &[u8]| {
    let Some((&p, body)) = data.split_first() else { return };
    let procedure = (p % 24) as u32;
    let mut r = XdrReader::new(body);
    match Args::decode(procedure, &mut r) {
        None => assert!(procedure > 21),
        Some(_) => assert!(r.position() <= body.len()),
    }
});
