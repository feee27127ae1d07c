//! libFuzzer entry point for `warren_fuzz::json_bodies` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::json_bodies(data));
