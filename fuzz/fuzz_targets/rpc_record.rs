//! Record marking over arbitrary bytes, with small limits so the size and fragment
//! bounds are reached often. Reads records until end of stream or an error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::rpc::record::{read_record, RecordLimits};
use std::cell::RefCell;

thread_local! {
    static RT: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread().build().expect("runtime"));
}

fuzz_target!(|data: &[u8]| {
    // First byte picks the limits; the rest is the stream.
    let Some((&sel, stream)) = data.split_first() else { return };
    let limits =
        RecordLimits { max_record: [0usize, 8, 100, 4096, 200_000][(sel & 7) as usize % 5], max_fragments: 1 + (sel >> 3) as usize };
    RT.with(|rt| {
        rt.borrow().block_on(async {
            // Small and large read buffers: records then straddle buffered and direct reads.
            let mut r = tokio::io::BufReader::with_capacity([4usize, 64, 8192][sel as usize % 3], stream);
            let mut buf = Vec::new();
            let mut records = 0usize;
            while let Ok(true) = read_record(&mut r, &limits, &mut buf).await {
                assert!(buf.len() <= limits.max_record);
                records += 1;
                assert!(records <= stream.len() / 4 + 1);
            }
            // Memory follows the data: never more than what arrived (plus one chunk).
            assert!(buf.capacity() <= stream.len() + 64 * 1024);
        })
    });
});
