//! PTY sessions of the real `warren execd`: SIGTERM and SIGINT kill every shell and job it
//! started. (What it listens on, and with which token, is `execd_listen.rs`.)

use warren_test_support::{alive, eventually};

use crate::support::ExecdProcess;

#[tokio::test]
async fn warren_execd_kills_every_shell_and_job_on_sigterm_and_sigint() {
    use rustix::process::Signal;
    let root_dir = tempfile::tempdir().expect("temp root");
    let root = root_dir.path().to_str().expect("a UTF-8 temp path");
    for signal in [Signal::TERM, Signal::INT] {
        let execd = ExecdProcess::start(&["--listen", "127.0.0.1:0", "--root", root], &[]).await;
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
