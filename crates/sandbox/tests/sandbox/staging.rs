//! Where the session's sources may live on the host: anywhere the daemon reaches. From a root
//! daemon the sandbox's sources are staged in bwrap's own mount namespace, so a workspace, run
//! directory, home and `warren` binary under a directory the hands uid cannot search still
//! work, the daemon's mount namespace gains nothing, and the staging does not show inside.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use warren_process::pipes::StdinMode;
use warren_sandbox::{Limits, Network};

use crate::support::{Fixture, Sandbox, expected_uid, is_root, run_ok};

fn open_path(path: &Path) -> Arc<OwnedFd> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
    Arc::new(fd)
}

/// The fixture (its root 0700) with a home and a copy of `/usr/bin/env` as the warren binary,
/// both under that root too.
fn everything_under_an_unsearchable_root() -> (Fixture, warren_sandbox::SandboxSpec) {
    let fixture = Fixture::new();
    let mode = std::fs::metadata(fixture.root.path()).expect("root").mode();
    assert_eq!(mode & 0o777, 0o700, "the fixture's root is 0700");
    let bin_dir = fixture.root.path().join("target/debug");
    std::fs::create_dir_all(&bin_dir).expect("mkdir");
    let bin = bin_dir.join("warren");
    std::fs::copy("/usr/bin/env", &bin).expect("copies a binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let home = fixture.root.path().join("homes/agent");
    std::fs::create_dir_all(&home).expect("mkdir");
    if is_root() {
        std::os::unix::fs::chown(&home, Some(expected_uid()), Some(expected_uid()))
            .expect("chowns");
    }
    let mut spec = fixture.spec(Network::None);
    spec.warren_bin = open_path(&bin);
    spec.home = Some(open_path(&home));
    (fixture, spec)
}

#[tokio::test]
async fn sources_under_a_directory_the_hands_cannot_search_work() {
    let (fixture, spec) = everything_under_an_unsearchable_root();
    // The command itself runs through the copied binary (`/opt/warren/bin/warren /bin/sh`).
    let out = run_ok(
        &spec,
        "echo ws > in-workspace && echo sock > /run/warren/socket-stand-in && \
         echo home > \"$HOME/in-home\" && /opt/warren/bin/warren true && echo ran",
    )
    .await;
    assert_eq!(out, "ran\n");
    for (path, content) in [
        (fixture.workspace.join("in-workspace"), "ws\n"),
        (fixture.run_dir.join("socket-stand-in"), "sock\n"),
        (fixture.root.path().join("homes/agent/in-home"), "home\n"),
    ] {
        assert_eq!(
            std::fs::read_to_string(&path).expect("landed on the host"),
            content
        );
        let meta = std::fs::metadata(&path).expect("exists");
        assert_eq!(meta.uid(), expected_uid(), "{}", path.display());
    }
}

#[tokio::test]
async fn the_daemons_mount_namespace_gains_no_mount() {
    let (_fixture, spec) = everything_under_an_unsearchable_root();
    let mountinfo = || std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let before = mountinfo();
    // Up and holding its mounts while the daemon looks, until its stdin closes.
    let mut sandbox = Sandbox::start(
        &spec,
        &Limits::default(),
        "echo up; cat > /dev/null",
        StdinMode::Pipe,
    );
    let mut up = [0u8; 3];
    warren_test_support::within(
        "the sandbox is up",
        sandbox.child.stdout.read_exact(&mut up),
    )
    .await
    .expect("reads");
    assert_eq!(&up, b"up\n");
    let during = mountinfo();
    drop(sandbox.child.stdin.take());
    let (code, out) = sandbox.finish().await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        before, during,
        "a running sandbox shows a mount in the daemon's namespace"
    );
    assert_eq!(
        before,
        mountinfo(),
        "a sandbox left a mount in the daemon's namespace"
    );
}

#[tokio::test]
async fn the_staging_does_not_show_inside() {
    let (_fixture, spec) = everything_under_an_unsearchable_root();
    let out = run_ok(
        &spec,
        "ls -A /tmp; echo end; awk '$5 == \"/tmp\" || $5 ~ \"^/tmp/\"' /proc/self/mountinfo \
         | wc -l",
    )
    .await;
    // `/tmp` is bwrap's one empty tmpfs, with nothing mounted under it.
    assert_eq!(out, "end\n1\n");
}
