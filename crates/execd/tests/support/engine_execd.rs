//! A real execd router on 127.0.0.1:0 in this process, on a temp root, with the daemon's
//! reaper running (the exec engine's commands need it, so only test binaries of their own use
//! this), reached with the typed client the gateway uses. Shared by the test binaries of the
//! engine's routes (`#[path]`-included).

use warren_execd::{Config, Execd};
use warren_execd_client::ExecdClient;

#[path = "loopback.rs"]
mod loopback;

pub struct Server {
    pub client: ExecdClient,
    /// execd's `--root`.
    pub root: tempfile::TempDir,
}

pub async fn start() -> Server {
    warren_process::reaper::start().expect("become subreaper and start reaping");
    let root = tempfile::tempdir().expect("temp dir");
    let config = Config {
        root: root.path().to_path_buf(),
        ..Config::default()
    };
    let execd = Execd::new(config);
    let base = loopback::serve(execd.router()).await;
    Server {
        client: ExecdClient::new(&base, None).expect("client"),
        root,
    }
}
