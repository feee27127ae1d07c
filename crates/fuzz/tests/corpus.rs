//! Replays every committed fuzz corpus input (`fuzz/corpus/<target>/*`) through its target
//! function as an ordinary test, so an input that once crashed a target fails CI without a fuzz
//! build or libFuzzer. One test per target; a failure names the input file.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, run: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("the corpus {} cannot be read: {error}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "the corpus {} is empty", dir.display());
    let mut failed = Vec::new();
    for input in &inputs {
        let data = std::fs::read(input).expect("a corpus input reads");
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failed.push(input.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target} panicked on: {failed:#?}");
}

#[test]
fn every_target_has_a_corpus() {
    for (target, _) in warren_fuzz::TARGETS {
        assert!(corpus_dir(target).is_dir(), "no corpus for {target}");
    }
}

macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), warren_fuzz::$target);
            }
        )*
    };
}

replay_tests!(
    pty_client_frame,
    json_bodies,
    path_resolver,
    snapshot_unpack,
    snapshot_read,
    terminal_clean,
    connect_envelope,
    range_header,
    last_event_id,
);
