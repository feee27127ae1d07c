//! Peak-memory checks: the process-wide high-water mark (`VmHWM`) belongs to one test only when
//! that test runs alone in its process.

/// Runs the named test again, alone, in a new process of this test binary, and returns true
/// in that process, where the test's body runs. Process-wide peak memory (`VmHWM`) is then
/// the test's own under any runner (`cargo test` runs a binary's tests as threads of one
/// process).
///
/// `name` is the test function's name; the test's full path (its module in a test binary with
/// modules) comes from the test thread, which the harness names after the test. The new
/// process must report that exactly one test ran: a filter that matched nothing would pass.
pub fn alone_in_a_new_process(name: &str) -> bool {
    const VAR: &str = "WARREN_TEST_ALONE";
    if std::env::var_os(VAR).is_some() {
        return true;
    }
    let thread = std::thread::current();
    let full_name = thread
        .name()
        .filter(|full| *full == name || full.ends_with(&format!("::{name}")))
        .unwrap_or_else(|| panic!("{name} runs on its own test thread, named after it"));
    // stdout and stderr go to files, read whatever the status.
    let out = tempfile_for(full_name, "stdout");
    let err = tempfile_for(full_name, "stderr");
    let status = crate::status_owned(
        std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", full_name, "--test-threads=1", "--nocapture"])
            .env(VAR, full_name)
            .stdout(std::fs::File::create(&out).expect("a stdout file"))
            .stderr(std::fs::File::create(&err).expect("a stderr file")),
    );
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    // Passed on to this test's own output (shown when it fails).
    print!("{stdout}");
    eprint!("{}", std::fs::read_to_string(&err).unwrap_or_default());
    let _ = (std::fs::remove_file(&out), std::fs::remove_file(&err));
    let status =
        status.unwrap_or_else(|e| panic!("cannot run {full_name} in its own process: {e}"));
    assert!(
        status.success(),
        "{full_name} failed in its own process: {status}"
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{full_name} did not run, or failed, in its own process"
    );
    false
}

/// A file in the temp dir for one stream of the test `name`'s own process.
fn tempfile_for(name: &str, stream: &str) -> std::path::PathBuf {
    let name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!(
        "warren-alone-{}-{name}.{stream}",
        std::process::id()
    ))
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

/// Reads a streamed answer to its end without keeping it (each chunk within [`crate::WAIT`]):
/// its length and its last byte.
#[cfg(feature = "pty")]
pub async fn drain(response: reqwest::Response) -> (usize, u8) {
    use futures_util::StreamExt;
    let mut stream = response.bytes_stream();
    let (mut n_bytes, mut last_byte) = (0usize, 0u8);
    while let Some(chunk) = tokio::time::timeout(crate::WAIT, stream.next())
        .await
        .expect("the answer keeps coming")
    {
        let chunk = chunk.expect("a chunk");
        n_bytes += chunk.len();
        last_byte = chunk.last().copied().unwrap_or(last_byte);
    }
    (n_bytes, last_byte)
}
