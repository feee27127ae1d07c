//! libFuzzer entry point for `warren_fuzz::terminal_clean` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::terminal_clean(data));
