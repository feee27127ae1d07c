//! Reaching `warren gateway` from a phone (phone.md "Reaching the gateway from a phone"): the
//! real binary with `--tls-cert`/`--tls-key` (a certificate for 127.0.0.1 from a test CA made
//! here) prints `https://` URLs and serves `/healthz` and the console over HTTPS; plain HTTP to
//! its port is told to use HTTPS; a missing certificate file refuses the start, naming it.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
use warren_test_support::tls::TestCa;
use warren_test_support::within;

/// `warren gateway` on 127.0.0.1:0 with `extra` flags, no warm hands, data in `data`.
fn gateway(data: &Path, extra: &[&Path]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"));
    command
        .args(["gateway", "--listen", "127.0.0.1:0", "--warm-workers", "0"])
        .arg("--data")
        .arg(data)
        .args(extra)
        .env("WARREN_LOG", "warn")
        .env_remove("WARREN_TLS_CERT")
        .env_remove("WARREN_TLS_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn gateway_with_a_certificate_serves_https_and_prints_https_urls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new();
    let (cert, key) = ca.write_server(dir.path(), &["127.0.0.1"]);
    let data = dir.path().join("data");
    let mut child = gateway(
        &data,
        &[Path::new("--tls-cert"), &cert, Path::new("--tls-key"), &key],
    )
    .spawn()
    .expect("spawns warren gateway");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut banner = Vec::new();
    for _ in 0..2 {
        let line = within("the gateway's banner", lines.next_line())
            .await
            .expect("reads the gateway's stdout")
            .expect("the gateway exited while printing its banner");
        banner.push(line);
    }
    let url = banner[0]
        .strip_prefix("warren gateway listening on ")
        .unwrap_or_else(|| panic!("the listening line, got {banner:?}"))
        .to_owned();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert_eq!(banner[1], format!("open {url}/ on your phone or browser"));

    let ca_cert = reqwest::Certificate::from_pem(ca.ca_pem().as_bytes()).expect("the CA");
    let client = reqwest::Client::builder()
        .tls_certs_only([ca_cert])
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client");
    let health = client
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect("/healthz answers over HTTPS");
    assert_eq!(health.status(), 200);
    let console = client
        .get(format!("{url}/"))
        .send()
        .await
        .expect("the console answers over HTTPS");
    assert_eq!(console.status(), 200);
    assert_eq!(
        console.headers()["content-type"],
        "text/html; charset=utf-8"
    );

    // Plain HTTP from 127.0.0.1 (the gateway's own clients on its machine, such as an agent on
    // the host reaching the model proxy) is served; from elsewhere it is told to use HTTPS
    // (warren-http's tests).
    let plain_url = url.replacen("https://", "http://", 1);
    let plain = reqwest::Client::builder()
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client")
        .get(format!("{plain_url}/healthz"))
        .send()
        .await
        .expect("plain HTTP from loopback is answered");
    assert_eq!(plain.status(), 200);
    // A client that does not trust the certificate is refused by its own TLS check.
    let other_ca =
        reqwest::Certificate::from_pem(TestCa::new().ca_pem().as_bytes()).expect("another CA");
    let untrusting = reqwest::Client::builder()
        .tls_certs_only([other_ca])
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client");
    assert!(
        untrusting
            .get(format!("{url}/healthz"))
            .send()
            .await
            .is_err()
    );
    child.start_kill().expect("stops the gateway");
    within("the gateway to exit", child.wait())
        .await
        .expect("waits for the gateway");
}

#[tokio::test]
async fn gateway_with_a_missing_certificate_refuses_to_start_naming_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new();
    let (_cert, key) = ca.write_server(dir.path(), &["127.0.0.1"]);
    let missing = dir.path().join("no-such-cert.pem");
    let data = dir.path().join("data");
    let mut child = gateway(
        &data,
        &[
            Path::new("--tls-cert"),
            &missing,
            Path::new("--tls-key"),
            &key,
        ],
    )
    .spawn()
    .expect("spawns warren gateway");
    let mut stdout = String::new();
    let mut stderr = String::new();
    let (mut out, mut err) = (
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let (read_out, read_err) = within("the refused gateway's output", async {
        tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr)
        )
    })
    .await;
    read_out.expect("reads stdout");
    read_err.expect("reads stderr");
    let status = within("the refused gateway to exit", child.wait())
        .await
        .expect("waits");
    assert!(!status.success(), "{status:?}");
    assert!(
        !stdout.contains("listening on"),
        "nothing is served: {stdout}"
    );
    assert!(
        stderr.contains("--tls-cert") && stderr.contains(&missing.display().to_string()),
        "the error names the file: {stderr}"
    );

    // One without the other is a usage error.
    let alone = gateway(&data, &[Path::new("--tls-key"), &key]).output();
    let alone = within("the usage error", alone).await.expect("runs");
    assert_eq!(alone.status.code(), Some(2), "{alone:?}");
    assert!(
        String::from_utf8_lossy(&alone.stderr).contains("--tls-cert"),
        "{alone:?}"
    );
}
