//! An SDK's check script run as a child of the test, as the other interoperability tests run
//! theirs (`#[path]`-included by the test binaries that drive a real SDK).

use std::time::Duration;

/// Runs `command` (killed if the test ends first, given 5 minutes) and asserts that it exits 0
/// and prints `passed`.
pub async fn assert_checks_pass(command: &mut tokio::process::Command, passed: &str) {
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        command.kill_on_drop(true).output(),
    )
    .await
    .expect("the SDK script finishes within 5 minutes")
    .expect("the SDK script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK checks failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains(passed), "{stdout}");
}
