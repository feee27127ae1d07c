//! The fixture every sandbox test starts from: a session directory tree (workspace, run
//! directory, a sibling session and a data directory), a [`SandboxSpec`] for it, and
//! [`Sandbox`], a running sandbox in a cgroup of its own that is killed and removed on drop.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::io::AsyncReadExt;
use warren_process::pipes::{PipeOptions, PipedChild, StdinMode};
use warren_process::{Connect, TreeMarker};
use warren_sandbox::{CgroupRoots, HandsCgroup, LimitHits, Limits, Network, SandboxSpec};

/// The host uid the hands run as when the tests run as root.
pub const HANDS_UID: u32 = 1000;

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The uid a sandboxed command has: the hands uid from root, else ours.
pub fn expected_uid() -> u32 {
    if is_root() {
        HANDS_UID
    } else {
        rustix::process::geteuid().as_raw()
    }
}

pub fn open_path(path: &Path) -> Arc<OwnedFd> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
    Arc::new(fd)
}

fn hands_owned_dir(path: &Path) {
    std::fs::create_dir_all(path).expect("creates a directory");
    if is_root() {
        std::os::unix::fs::chown(path, Some(HANDS_UID), Some(HANDS_UID)).expect("chowns");
    }
}

/// One session's directories on the host, next to another session's and a data directory.
pub struct Fixture {
    pub root: tempfile::TempDir,
    pub workspace: PathBuf,
    pub run_dir: PathBuf,
    pub other_session: PathBuf,
    pub data_dir: PathBuf,
}

impl Fixture {
    pub fn new() -> Fixture {
        // 0700 and owned by the daemon's user, as a gateway's data directory may be: the hands
        // uid cannot search it, and the sandbox still reaches the session's directories.
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let workspace = root.path().join("sessions/s1/workspace");
        let run_dir = root.path().join("sessions/s1/run");
        let other_session = root.path().join("sessions/s2/workspace");
        let data_dir = root.path().join("data");
        for dir in [&workspace, &run_dir, &other_session] {
            hands_owned_dir(dir);
        }
        std::fs::create_dir_all(&data_dir).expect("data dir");
        std::fs::write(other_session.join("secret.txt"), "other").expect("writes");
        std::fs::write(data_dir.join("devices.json"), "{}").expect("writes");
        Fixture {
            root,
            workspace,
            run_dir,
            other_session,
            data_dir,
        }
    }

    /// A spec for this session: `/usr/bin/env` stands in for the warren binary.
    pub fn spec(&self, network: Network) -> SandboxSpec {
        SandboxSpec {
            bwrap: warren_sandbox::find_bwrap().expect("bwrap is installed"),
            workspace: open_path(&self.workspace),
            run_dir: open_path(&self.run_dir),
            warren_bin: open_path(Path::new("/usr/bin/env")),
            home: None,
            agent_prefix: None,
            network,
            uid: is_root().then_some(HANDS_UID),
            gid: is_root().then_some(HANDS_UID),
            seccomp: warren_sandbox::seccomp_memfd().expect("seccomp memfd"),
            cgroup_procs: Vec::new(),
            extra_env: Vec::new(),
            env_defaults: Vec::new(),
            trust_bundle: None,
        }
    }
}

/// A cgroup of the test's own: killed and removed on drop.
pub struct CgroupGuard(Option<HandsCgroup>);

impl CgroupGuard {
    pub fn create(limits: &Limits) -> CgroupGuard {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let cgroup =
            HandsCgroup::create(&CgroupRoots::discover(), &name, limits).expect("creates cgroups");
        CgroupGuard(Some(cgroup))
    }

    pub fn get(&self) -> &HandsCgroup {
        self.0.as_ref().expect("present until drop")
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(cgroup) = self.0.take() {
            let _ = cgroup.thaw();
            if let Err(err) = cgroup.remove() {
                eprintln!("removing a test cgroup: {err}");
            }
        }
    }
}

/// A sandbox running `/bin/sh -c script` (through the stand-in warren binary).
pub struct Sandbox {
    pub child: PipedChild,
    pub cgroup: CgroupGuard,
}

impl Sandbox {
    pub fn start(spec: &SandboxSpec, limits: &Limits, script: &str, stdin: StdinMode) -> Sandbox {
        let cgroup = CgroupGuard::create(limits);
        let mut spec = spec.clone();
        spec.cgroup_procs = cgroup.get().procs_files();
        let inner: Vec<OsString> = ["/bin/sh", "-c", script].map(OsString::from).into();
        let command = spec.command(
            &TreeMarker::new(),
            warren_sandbox::bwrap::WARREN_BIN,
            &inner,
        );
        let options = PipeOptions {
            stdin,
            ..PipeOptions::default()
        };
        let child = warren_process::spawn(&command, Connect::Pipes(options))
            .expect("bwrap starts")
            .into_pipes();
        Sandbox { child, cgroup }
    }

    /// Waits for the sandbox to exit: its exit code (-1 after a signal) and all it printed.
    /// Its cgroup goes with it.
    pub async fn finish(self) -> (i32, String) {
        let (code, out, _) = self.finish_with_hits().await;
        (code, out)
    }

    /// [`Sandbox::finish`], plus the cgroup's limit counters read before it goes.
    pub async fn finish_with_hits(mut self) -> (i32, String, LimitHits) {
        let mut out = String::new();
        let stdout = &mut self.child.stdout;
        warren_test_support::within("the sandbox prints and exits", async {
            let _ = stdout.read_to_string(&mut out).await;
        })
        .await;
        let code = self.child.child.wait_code().await;
        (code, out, self.cgroup.get().limit_hits())
    }
}

/// Runs `script` in a sandbox of `spec` without limits and returns what it printed, failing
/// the test when it exits non-zero.
pub async fn run_ok(spec: &SandboxSpec, script: &str) -> String {
    let (code, out) = Sandbox::start(spec, &Limits::default(), script, StdinMode::Null)
        .finish()
        .await;
    assert_eq!(code, 0, "{script:?} printed {out:?}");
    out
}
