//! MOUNT v3 argument decoders: the first byte picks the procedure.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::mount3::Args;
use nasd::xdr::XdrReader;

fuzz_target!(|data: &[u8]| {
    let Some((&p, body)) = data.split_first() else { return };
    let mut r = XdrReader::new(body);
    if let Some(Ok(Args::Mnt(path) | Args::Umnt(path))) = Args::decode((p % 8) as u32, &mut r) {
        assert!(path.len() <= 1024);
    }
});
