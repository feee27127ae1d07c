//! The console in a real browser, in cargo's test run: the flows of console.md "Proven in a real
//! browser" (sign in, chat, permission, terminal, files, preview, network drop, hostile agent
//! text; phone and desktop sizes) are `tests/python/console/run.py`, Playwright for Python
//! (pinned in scripts/python-env.sh) driving Debian's headless chromium (`/usr/bin/chromium`,
//! installed by .ci/run). This side starts the real gateway and runs it.
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
//! - Exit status 0 when every flow passed; anything else fails this test, which shows run.py's
//!   stdout and stderr. run.py bounds its own waits; this side stops it after
//!   [`BROWSER_TESTS_WAIT`].
//!
//! The gateway is in-process ([`TestGateway`]), with the built-in shell agent and bwrap hands
//! on the host network, as the other gateway tests start it; nothing extra is built.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;
use std::time::Duration;

use warren_gateway::hands::local::IsolationMode;
use warren_test_support::{python, repo_root};

use super::helpers::{TestGateway, args_with_shell_agent};

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
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.hands_isolation = IsolationMode::Bwrap;
        args
    })
    .await;
    let shots = repo_root().join("target/console-shots");
    let mut command = tokio::process::Command::new(python());
    command
        .arg(&run_py)
        .arg("--url")
        .arg(&gw.url)
        .arg("--app-key")
        .arg(&gw.app_key)
        .arg("--shots")
        .arg(&shots)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(BROWSER_TESTS_WAIT, command.output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} did not finish within {BROWSER_TESTS_WAIT:?}",
                run_py.display()
            )
        })
        .unwrap_or_else(|e| panic!("starts {}: {e}", run_py.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        output.status.success(),
        "the console's browser flows failed ({}); screenshots in {}:\n--- stdout ---\n{stdout}\n\
         --- stderr ---\n{stderr}",
        output.status,
        shots.display()
    );
    gw.stop().await;
}
