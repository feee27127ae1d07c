//! The console in a real browser, in cargo's test run: the flows of console.md "Proven in a real
//! browser" (sign in, chat, permission, terminal, files, preview, network drop, hostile agent
//! text; phone and desktop sizes) are `tests/python/console/run.py`, Playwright for Python
//! (pinned in scripts/python-env.sh) driving Debian's headless chromium (`/usr/bin/chromium`,
//! installed by scripts/test.sh). This side starts the real gateway and runs it.
//!
//! The command line, the contract between the two sides:
//!
//! ```text
//! <venv python> tests/python/console/run.py --url <gateway url> --app-key <app key> --shots <dir>
//! ```
//!
//! - `--url`: the gateway's origin, `http://127.0.0.1:<port>` (no trailing slash); the console
//!   is at `<url>/`, previews at the default `http://p-<token>.localhost:<port>/`.
//! - `--app-key`: the key that registers devices (`X-App-Key`).
//! - `--shots`: a directory (it may not exist yet) for the screenshots at both sizes;
//!   `target/console-shots/`.
//! - Exit status 0 when every flow passed; anything else fails this test, which shows what
//!   run.py printed (stdout and stderr, into one file). run.py bounds each flow (a flow past its
//!   limit prints where every thread was and ends the run); this side stops run.py's whole
//!   process group after [`BROWSER_TESTS_WAIT`] and shows what it had printed by then.
//!
//! The gateway is in-process (a `TestGateway` from [`in_bwrap`]), with the built-in shell agent and bwrap hands
//! on the host network, as the other gateway tests start it; nothing extra is built.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;
use std::time::Duration;

use warren_test_support::{python, repo_root};

use super::helpers::{host_links, in_bwrap};

/// How long the whole browser run may take (both sizes, every flow).
const BROWSER_TESTS_WAIT: Duration = Duration::from_secs(15 * 60);

#[tokio::test]
async fn the_console_works_in_a_real_browser() {
    let run_py = repo_root().join("tests/python/console/run.py");
    assert!(
        run_py.is_file(),
        "{} does not exist: the console's browser flows live there (Playwright, written with \
         the front end); this test runs it as its module docs say",
        run_py.display()
    );
    // No test changes the host's links while the browser runs (they abort its loads).
    let _links = host_links().await;
    // A credential for the npm registry (reached for real through the egress proxy), so the
    // flows see its `credential_used` lines and switch it (an extra header npm ignores).
    let gw = in_bwrap(|args| {
        // A short heartbeat, so the flow that freezes the console's connection sees it noticed
        // (two intervals of silence) within seconds; the console learns it from the heartbeats.
        args.sse_heartbeat_ms = 1500;
        args.hands_credential = vec![
            warren_egress::Credential::parse(
                "npm=registry.npmjs.org:X-Warren-Console-Check:Bearer $CHECK",
                |_| Some("console-check-value".to_owned()),
            )
            .expect("the credential parses"),
        ];
    })
    .await;
    let shots = repo_root().join("target/console-shots");
    // run.py's output goes to a file, not a pipe: what it printed is there even when it has to
    // be stopped, and a process it leaves behind cannot keep this side waiting for an EOF.
    let log_file = tempfile::NamedTempFile::new().expect("a file for run.py's output");
    let log = log_file.reopen().expect("reopens the log");
    let mut command = tokio::process::Command::new(python());
    command
        .arg(&run_py)
        .arg("--url")
        .arg(&gw.url)
        .arg("--app-key")
        .arg(&gw.app_key)
        .arg("--shots")
        .arg(&shots)
        // While working on a few flows: `WARREN_CONSOLE_FLOWS=a,b` runs only those (after signing
        // in and creating a session).
        .arg("--flows")
        .arg(std::env::var("WARREN_CONSOLE_FLOWS").unwrap_or_default())
        .current_dir(repo_root())
        .stdin(Stdio::null())
        // One open file for both, so they share its offset: two opens would write over each
        // other from the start.
        .stdout(log.try_clone().expect("the log's handle again"))
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starts {}: {e}", run_py.display()));
    let group = child.id().expect("run.py has a pid");
    let status = tokio::time::timeout(BROWSER_TESTS_WAIT, child.wait()).await;
    // Whatever run.py started (Playwright's driver, chromium) goes with it; a group already gone
    // is not an error.
    let _ = warren_process::signal_group(group as i32, rustix::process::Signal::KILL);
    let printed = std::fs::read_to_string(log_file.path()).unwrap_or_default();
    eprintln!("{printed}");
    let status = match status {
        Ok(status) => status.unwrap_or_else(|e| panic!("waits for {}: {e}", run_py.display())),
        Err(_) => panic!(
            "{} did not finish within {BROWSER_TESTS_WAIT:?}; it printed:\n{printed}",
            run_py.display()
        ),
    };
    assert!(
        status.success(),
        "the console's browser flows failed ({status}); screenshots in {}:\n{printed}",
        shots.display()
    );
    gw.stop().await;
}
