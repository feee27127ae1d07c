//! Peak-memory checks for integration tests, shared by several crates' tests through
//! `#[path]`: the process-wide high-water mark (`VmHWM`) belongs to one test only when that test
//! runs alone in its process.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

/// Runs the named test again, alone, in a new process of this test binary, and returns true
/// in that process, where the test's body runs. Process-wide peak memory (`VmHWM`) is then
/// the test's own under any runner (`cargo test` runs a binary's tests as threads of one
/// process).
pub fn alone_in_a_new_process(name: &str) -> bool {
    const VAR: &str = "WARREN_TEST_ALONE";
    if std::env::var_os(VAR).is_some() {
        return true;
    }
    let status = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(VAR, name)
        .status()
        .expect("runs the test binary");
    assert!(
        status.success(),
        "{name} failed in its own process: {status}"
    );
    false
}

/// A `/proc/self/status` memory line (`VmRSS`, `VmHWM`) in KiB.
pub fn memory_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reads /proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}
