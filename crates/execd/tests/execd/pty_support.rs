//! The PTY session tests' support: a real daemon on 127.0.0.1:0 in this process, and the
//! shared client of `warren_test_support::pty` (REST, and a WebSocket client that sorts what it
//! receives).

use warren_execd::{Config, Execd};
pub use warren_test_support::pty::{Client, Daemon, Event, pid_after};
pub use warren_test_support::{WAIT, alive, eventually};

pub async fn start() -> Daemon {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> Daemon {
    start_with_shutdown(config, std::future::pending()).await.0
}

/// A daemon that requires `token` as its access token.
pub async fn start_with_token(token: &str) -> Daemon {
    start_with(Config {
        access_token: Some(token.to_owned()),
        ..Config::default()
    })
    .await
}

/// A daemon that shuts down (and tears every session down) when `shutdown` resolves; the
/// handle resolves once `serve` has returned.
pub async fn start_with_shutdown(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Daemon, tokio::task::JoinHandle<()>) {
    let token = config.access_token.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let execd = Execd::new(config);
    let served = tokio::spawn(async move {
        warren_execd::serve(execd, listener, shutdown)
            .await
            .expect("daemon serves");
    });
    (Daemon::at(format!("http://{addr}"), token), served)
}
