//! The console's JavaScript unit tests in cargo's test run: `node --test
//! crates/gateway/console/test/` (node's own runner, no package to install) from the repository
//! root, failing with node's output when any of them fails. Until the folder exists there is
//! nothing to run and the test says so; once it exists, a run that finds no test fails too, so a
//! renamed file is not silently skipped.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;
use std::time::Duration;

use warren_test_support::repo_root;

/// How long the whole unit-test run may take.
const NODE_TESTS_WAIT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_console_javascript_unit_tests_pass() {
    let folder = "crates/gateway/console/test/";
    if !repo_root().join(folder).is_dir() {
        eprintln!("note: {folder} does not exist yet; no console unit tests to run");
        return;
    }
    let mut command = tokio::process::Command::new("node");
    command
        .args(["--test", "--test-reporter=tap", folder])
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(NODE_TESTS_WAIT, command.output())
        .await
        .unwrap_or_else(|_| {
            panic!("`node --test {folder}` did not finish within {NODE_TESTS_WAIT:?}")
        })
        .unwrap_or_else(|e| {
            panic!("starts `node --test {folder}` (Node 20 or later on PATH): {e}")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let shown = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        output.status.success(),
        "`node --test {folder}` failed ({}):\n{shown}",
        output.status
    );
    // TAP's summary: `# tests N`.
    let n_tests: usize = stdout
        .lines()
        .find_map(|line| line.strip_prefix("# tests "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("node's TAP summary names a test count:\n{shown}"));
    assert!(
        n_tests > 0,
        "`node --test {folder}` found no test:\n{shown}"
    );
    eprintln!("{n_tests} console unit tests passed");
}
