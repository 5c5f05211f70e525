//! The exports file: any text gets a table or an error with a line number, never a panic.
//! Host names resolve to nothing here (no resolver is asked).
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::exports::parse_exports_with;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_exports_with(text, "fuzz", &|_| Vec::new()) {
        Ok(table) => {
            for e in &table.exports {
                assert!(e.path.is_absolute(), "{:?}", e.path);
            }
        }
        Err(e) => assert!(e.line >= 1 && e.line <= text.lines().count().max(1), "{e:?}"),
    }
});
