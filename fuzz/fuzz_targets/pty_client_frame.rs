//! libFuzzer entry point for `warren_fuzz::pty_client_frame` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::pty_client_frame(data));
