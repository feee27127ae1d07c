//! PTY sessions of the real `warren execd`: SIGTERM and SIGINT kill every shell and job it
//! started, and it warns when it listens on a non-loopback address without an access token.

use serde_json::json;
use warren_test_support::pty::Daemon;
use warren_test_support::{alive, eventually};

use crate::support::ExecdProcess;

#[tokio::test]
async fn warren_execd_kills_every_shell_and_job_on_sigterm_and_sigint() {
    use rustix::process::Signal;
    for signal in [Signal::TERM, Signal::INT] {
        let execd = ExecdProcess::start(&["--listen", "127.0.0.1:0"], &[]).await;
        let (_id, mut holder) = execd.daemon.shell().await;
        let line = "sleep 1003 & echo job=$!; echo sh=$$; echo ok-$((1+1))";
        let [job, shell] = holder.run_for_pids(line, "ok-2", ["job=", "sh="]).await;
        assert!(alive(job) && alive(shell));
        execd.stop_with(signal).await;
        eventually("every shell and job is dead after the signal", || {
            !alive(job) && !alive(shell)
        })
        .await;
    }
}

#[tokio::test]
async fn warren_execd_warns_on_a_non_loopback_address_without_a_token() {
    let open = ExecdProcess::start(&["--listen", "0.0.0.0:0"], &[]).await;
    open.daemon.create(json!({})).await;
    let log = open.stop_with(rustix::process::Signal::TERM).await;
    assert!(
        log.contains("listening on a non-loopback address without an access token"),
        "{log}"
    );
    // With the token from the environment there is no warning, and the token is required.
    let guarded = ExecdProcess::start(
        &["--listen", "0.0.0.0:0"],
        &[("EXECD_ACCESS_TOKEN", "from-env")],
    )
    .await;
    guarded.daemon.create(json!({})).await;
    let anonymous = Daemon {
        token: None,
        base: guarded.daemon.base.clone(),
        http: guarded.daemon.http.clone(),
    };
    assert_eq!(anonymous.post_raw("/pty", "{}").await.0, 401);
    let log = guarded.stop_with(rustix::process::Signal::TERM).await;
    assert!(!log.contains("non-loopback"), "{log}");
}
