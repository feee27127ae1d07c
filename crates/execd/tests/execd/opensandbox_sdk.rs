//! The real client: the OpenSandbox Python SDK (opensandbox==1.1.1, installed into a venv by
//! `scripts/python-env.sh`) drives its adapters against this crate's router on 127.0.0.1:0,
//! running `tests/python/opensandbox_sdk_test.py`, which exits non-zero naming each failed check.

use crate::opensandbox_support::Server;
use warren_test_support::{python, repo_root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opensandbox_python_sdk_adapters_work_against_warren() {
    let root = repo_root();
    let python = python();

    let server = Server::start().await;
    let workdir = server.path("sdk");
    std::fs::create_dir(&workdir).expect("creates the SDK work directory");
    let port = server
        .base
        .rsplit(':')
        .next()
        .expect("base has a port")
        .to_owned();
    let script = root.join("tests/python/opensandbox_sdk_test.py");
    crate::sdk_script::assert_checks_pass(
        tokio::process::Command::new(&python)
            .arg(&script)
            .arg(&port)
            .arg(&workdir),
        "all OpenSandbox SDK checks passed",
    )
    .await;
    server.shutdown().await;
}
