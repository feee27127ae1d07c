//! Fuzz targets for everything in Warren that reads untrusted bytes: one public function per
//! target, `fn <target>(data: &[u8])`, whose assertions are its oracle (a panic is a finding).
//!
//! The functions are plain Rust with no libFuzzer in sight: the cargo-fuzz project in `fuzz/`
//! wraps each in a one-line `fuzz_target!`, and `tests/corpus.rs` replays every committed corpus
//! input through them as an ordinary test, so an input that once crashed fails CI without a fuzz
//! build. Each target calls the real parsing code the servers run (made `#[doc(hidden)] pub`
//! where it was private), never a copy, except where the server's own step is a one-line
//! condition that is restated here.

mod bodies;
mod connect;
mod headers;
mod paths;
mod pty;
mod snapshot;
mod text;

pub use bodies::json_bodies;
pub use connect::connect_envelope;
pub use headers::{last_event_id, range_header};
pub use paths::path_resolver;
pub use pty::pty_client_frame;
pub use snapshot::{snapshot_read, snapshot_unpack};
pub use text::terminal_clean;

/// A fuzz target: one input, asserting its oracle.
pub type Target = fn(&[u8]);

/// Every target by name, for the corpus replay.
pub const TARGETS: &[(&str, Target)] = &[
    ("pty_client_frame", pty_client_frame),
    ("json_bodies", json_bodies),
    ("path_resolver", path_resolver),
    ("snapshot_unpack", snapshot_unpack),
    ("snapshot_read", snapshot_read),
    ("terminal_clean", terminal_clean),
    ("connect_envelope", connect_envelope),
    ("range_header", range_header),
    ("last_event_id", last_event_id),
];
