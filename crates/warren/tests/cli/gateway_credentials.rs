//! `warren gateway --hands-credential` refuses to start on a credential it cannot carry, each
//! time naming what is wrong and never the value: a variable that is not set, a device list for
//! no credential, a name given twice, a network without the egress proxy, a bad upstream CA.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::warren;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "wrn-cli-canary-51f0c2";

/// Runs `warren gateway` with `args` and `WARREN_TEST_TOKEN` set; it must exit non-zero within
/// [`WAIT`]. Returns its stderr.
fn refused(args: &[&str]) -> String {
    let data = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(warren())
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--app-key",
            "cli-app-key",
        ])
        .arg("--data")
        .arg(data.path())
        .args(args)
        .env("WARREN_TEST_TOKEN", TOKEN)
        .env_remove("WARREN_APP_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts warren gateway");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("warren gateway {args:?} did not refuse to start within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .expect("reads stderr");
    assert!(!status.success(), "{args:?} started: {stderr}");
    assert!(!stderr.contains(TOKEN), "{args:?}: the value in {stderr}");
    stderr
}

#[test]
fn a_credential_the_gateway_cannot_carry_stops_it_at_start_saying_why() {
    let good = "api=api.example.test:Authorization:Bearer $WARREN_TEST_TOKEN";
    for (args, says) in [
        (
            vec![
                "--hands-credential",
                "api=api.example.test:Authorization:Bearer $WARREN_TEST_UNSET",
            ],
            "WARREN_TEST_UNSET is not set",
        ),
        (
            vec![
                "--hands-credential",
                "api=api.example.test:Host:$WARREN_TEST_TOKEN",
            ],
            "the proxy's",
        ),
        (
            vec![
                "--hands-credential",
                good,
                "--hands-credential-devices",
                "other=phone",
            ],
            "names other, which no --hands-credential defines",
        ),
        (
            vec!["--hands-credential", good, "--hands-credential", good],
            "is given twice",
        ),
        (
            vec!["--hands-credential", good, "--hands-network", "host"],
            "needs local hands with --hands-network private",
        ),
        (
            vec![
                "--hands-credential",
                good,
                "--egress-upstream-ca",
                "/nonexistent/ca.pem",
            ],
            "--egress-upstream-ca /nonexistent/ca.pem",
        ),
    ] {
        let stderr = refused(&args);
        assert!(stderr.contains(says), "{args:?}: {says:?} in {stderr}");
    }
}
