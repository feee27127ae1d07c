//! libFuzzer entry point for `warren_fuzz::snapshot_unpack` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::snapshot_unpack(data));
