//! File handles: what a client sends back is authenticated before anything trusts it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::fh::HandleKey;
use nasd::vfs::ObjectId;

fuzz_target!(|data: &[u8]| {
    let key = HandleKey::from_bytes([7; 32]);
    // Bytes from the wire: never a panic, and only a handle this key made decodes.
    if let Ok((export, obj)) = key.decode(data) {
        assert_eq!(key.encode(export, &obj), data);
    }
    // A handle made from the input decodes to what it was made of; one changed byte
    // anywhere is refused.
    if let (Some(head), Some(obj)) = (data.get(..5), data.get(5..).and_then(ObjectId::new)) {
        let export = u32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
        let mut fh = key.encode(export, &obj);
        assert_eq!(key.decode(&fh).expect("a handle of ours"), (export, obj));
        let at = head[4] as usize % fh.len();
        fh[at] ^= 0x5a;
        assert!(key.decode(&fh).is_err(), "a handle changed at byte {at} was accepted");
    }
});
