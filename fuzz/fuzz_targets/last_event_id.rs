//! libFuzzer entry point for `warren_fuzz::last_event_id` (the oracle lives there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::last_event_id(data));
