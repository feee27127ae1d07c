//! Checks of the typed client's error answers, and a FIFO made without a child process, for
//! the test binaries that drive execd through `warren_execd_client` (`#[path]`-included).

use std::path::Path;

use warren_execd_client::ClientError;

/// Asserts that `result` is execd's error answer with `status` and `code`; `what` names the
/// request in the failure.
#[track_caller]
pub fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
    status: u16,
    code: &str,
    what: &str,
) {
    let error = result.expect_err(what);
    assert_error(&error, status, code, what);
}

/// Asserts that `error` is execd's error answer with `status` and `code`.
#[track_caller]
pub fn assert_error(error: &ClientError, status: u16, code: &str, what: &str) {
    let answer = (error.status().map(|s| s.as_u16()), error.code());
    assert_eq!(answer, (Some(status), Some(code)), "{what}: {error}");
}

/// Makes a FIFO at `path` directly: no child process, so no exit status for a reaper to take.
pub fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
}
