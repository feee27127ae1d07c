//! libFuzzer entry point for `warren_fuzz::path_resolver` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::path_resolver(data));
