//! libFuzzer entry point for `warren_fuzz::snapshot_read` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::snapshot_read(data));
