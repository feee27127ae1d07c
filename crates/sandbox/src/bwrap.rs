//! The bubblewrap command line of one hands ([`SandboxSpec::command`]), the check that bwrap
//! works on this host ([`probe`]), and where it is installed ([`find_bwrap`]).
//!
//! The sandbox's root is built from nothing: read-only binds of the host's `/usr` and `/etc`
//! (and `/bin`, `/lib*`, `/sbin` as the host has them: symlinks into `/usr`, or read-only
//! binds), a fresh `/proc`, `/dev` and `/tmp`, an empty `/home` holding only the agent's home,
//! the session workspace at `/workspace`, the run directory at `/run/warren` and the `warren`
//! binary at `/opt/warren/bin/warren`, then the root is remounted read-only. Nothing else of
//! the host is mounted. The session's directories come in as descriptors the caller opened,
//! at fixed numbers, and bwrap closes them once mounted, so none reaches a command. bwrap
//! resolves them by path (`/proc/self/fd/N`), so their parent directories must be searchable
//! by the hands' uid.
//!
//! bwrap runs as the hands' host uid (an unprivileged user namespace maps it to itself), with
//! the hands' clean environment, in cgroups it joins before exec, and outlives the daemon that
//! starts it (no parent-death signal, no `--die-with-parent`): a restarted gateway adopts it.
//! This module builds commands; it starts nothing but [`probe`]'s.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use warren_process::pipes::{OutputMode, PipeOptions, StdinMode};
use warren_process::{CommandSpec, Connect, EnvPolicy, HandsVar, TreeMarker};

/// Where the session workspace is mounted inside; the sandbox's working directory.
pub const WORKSPACE: &str = "/workspace";
/// Where the run directory (execd's socket) is mounted inside.
pub const RUN_DIR: &str = "/run/warren";
/// Where the `warren` binary is mounted inside, read-only.
pub const WARREN_BIN: &str = "/opt/warren/bin/warren";
/// The agent's home inside.
pub const HOME: &str = "/home/agent";

const SECCOMP_FD: i32 = 3;
const WORKSPACE_FD: i32 = 4;
const RUN_DIR_FD: i32 = 5;
const WARREN_BIN_FD: i32 = 6;
const HOME_FD: i32 = 7;

/// The variables the sandbox gets unless `--hands-env` sets them; `TERM` comes from the
/// daemon (hands allowlist) when it has one.
const INSIDE_DEFAULTS: &[(&str, &str)] = &[
    ("HOME", HOME),
    ("USER", "agent"),
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("LANG", "C.UTF-8"),
];

/// Which network the hands see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// The host's network (package registries work).
    Host,
    /// A network namespace of its own with loopback only.
    None,
}

/// Everything one hands' sandbox is made of. The descriptors are the caller's; each
/// [`SandboxSpec::command`] passes them at fixed numbers.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The bwrap executable.
    pub bwrap: PathBuf,
    /// An `O_PATH | O_DIRECTORY` descriptor of the session workspace, bound read-write at
    /// [`WORKSPACE`].
    pub workspace: Arc<OwnedFd>,
    /// The session's run directory, bound read-write at [`RUN_DIR`].
    pub run_dir: Arc<OwnedFd>,
    /// The `warren` executable, bound read-only at [`WARREN_BIN`].
    pub warren_bin: Arc<OwnedFd>,
    /// The agent's home, bound at [`HOME`]; `None`: an empty directory on a tmpfs `/home`.
    pub home: Option<Arc<OwnedFd>>,
    pub network: Network,
    /// Host user id bwrap runs as (from a root daemon); `None` keeps ours.
    pub uid: Option<u32>,
    /// Host group id bwrap runs as; `None` keeps ours.
    pub gid: Option<u32>,
    /// A memfd holding [`crate::seccomp::filter_bpf`] ([`seccomp_memfd`]).
    pub seccomp: Arc<OwnedFd>,
    /// `cgroup.procs` files bwrap joins before exec ([`crate::HandsCgroup::procs_files`]).
    pub cgroup_procs: Vec<PathBuf>,
    /// `--hands-env` entries, on top of the clean allowlist.
    pub extra_env: Vec<HandsVar>,
}

/// The namespace and hardening flags every sandbox (and [`probe`]) uses.
fn isolation_args(network: Network) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    if network == Network::None {
        args.push("--unshare-net".into());
    }
    for arg in [
        // No user namespaces inside: a nested one would hand a command capabilities again.
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--hostname",
        "warren",
        // Commands get no controlling terminal of ours (no TIOCSTI into it); execd's own
        // PTYs inside work as usual.
        "--new-session",
        "--seccomp",
    ] {
        args.push(arg.into());
    }
    args.push(SECCOMP_FD.to_string().into());
    args
}

/// The host image, read-only: `/usr`, `/etc`, and `/bin`, `/lib*`, `/sbin` as the host has
/// them (a symlink stays a symlink, a directory is bound), then `/proc`, `/dev`, `/tmp`.
fn root_args() -> Vec<OsString> {
    let mut args: Vec<OsString> = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        .map(OsString::from)
        .into();
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let path = Path::new(top);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend([
                        OsString::from("--symlink"),
                        target.into_os_string(),
                        OsString::from(top),
                    ]);
                }
            }
            Ok(meta) if meta.is_dir() => args.extend(["--ro-bind", top, top].map(OsString::from)),
            _ => {}
        }
    }
    args.extend(
        [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home",
        ]
        .map(OsString::from),
    );
    args
}

impl SandboxSpec {
    /// The command that starts `inner_program inner_args` (execd, at [`WARREN_BIN`]) in this
    /// sandbox, carrying `marker`. No descriptor of this process but the ones given reaches
    /// it; the caller may add its own with [`CommandSpec::fd`] (above 7), which bwrap passes on.
    pub fn command(
        &self,
        marker: &TreeMarker,
        inner_program: &str,
        inner_args: &[OsString],
    ) -> CommandSpec {
        let mut args = isolation_args(self.network);
        args.extend(root_args());
        let mut bind_fd = |option: &str, fd: i32, dest: &str| {
            args.extend([option.into(), fd.to_string().into(), dest.into()]);
        };
        if self.home.is_some() {
            bind_fd("--bind-fd", HOME_FD, HOME);
        }
        bind_fd("--bind-fd", RUN_DIR_FD, RUN_DIR);
        bind_fd("--ro-bind-fd", WARREN_BIN_FD, WARREN_BIN);
        bind_fd("--bind-fd", WORKSPACE_FD, WORKSPACE);
        if self.home.is_none() {
            args.extend(["--dir", HOME].map(OsString::from));
        }
        args.extend(["--remount-ro", "/", "--chdir", WORKSPACE, "--"].map(OsString::from));
        args.push(inner_program.into());
        args.extend(inner_args.iter().cloned());

        let mut command = CommandSpec::new(&self.bwrap, marker)
            .args(args)
            .env_policy(EnvPolicy::Hands {
                pass: self.extra_env.clone(),
            })
            .fd(SECCOMP_FD, own_offset(&self.seccomp))
            .fd(WORKSPACE_FD, self.workspace.clone())
            .fd(RUN_DIR_FD, self.run_dir.clone())
            .fd(WARREN_BIN_FD, self.warren_bin.clone())
            .join_cgroups(self.cgroup_procs.clone())
            .close_other_fds()
            .outlive_daemon();
        if let Some(home) = &self.home {
            command = command.fd(HOME_FD, home.clone());
        }
        for (name, value) in INSIDE_DEFAULTS {
            if !self.extra_env.iter().any(|var| var.name == *name) {
                command = command.env(name, value);
            }
        }
        command.uid = self.uid;
        command.gid = self.gid;
        command
    }
}

/// A descriptor of the same memfd with an offset of its own: bwrap reads the filter from the
/// current offset to the end, and duplicates share one offset, so every sandbox reopens it.
/// Where `/proc` cannot reopen it, the shared descriptor is used as it is.
fn own_offset(memfd: &Arc<OwnedFd>) -> Arc<OwnedFd> {
    let path = format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&**memfd)
    );
    match rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => Arc::new(fd),
        Err(_) => memfd.clone(),
    }
}

/// A sealed memfd holding [`crate::seccomp::filter_bpf`], for [`SandboxSpec::seccomp`].
pub fn seccomp_memfd() -> io::Result<Arc<OwnedFd>> {
    let bytes = crate::seccomp::filter_bpf().map_err(io::Error::other)?;
    let memfd = rustix::fs::memfd_create(
        "warren-seccomp",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(&bytes)?;
    rustix::fs::fcntl_add_seals(
        file.as_fd(),
        rustix::fs::SealFlags::WRITE
            | rustix::fs::SealFlags::GROW
            | rustix::fs::SealFlags::SHRINK
            | rustix::fs::SealFlags::SEAL,
    )?;
    rustix::fs::seek(file.as_fd(), rustix::fs::SeekFrom::Start(0))?;
    Ok(Arc::new(OwnedFd::from(file)))
}

/// Starts a minimal sandbox with the same namespaces, seccomp filter and read-only root
/// that runs `true`. `Err` carries bwrap's complaint (no user namespaces, an old bwrap...).
pub async fn probe(bwrap: &Path) -> Result<(), String> {
    let seccomp = seccomp_memfd().map_err(|err| format!("seccomp filter: {err}"))?;
    let mut args = isolation_args(Network::None);
    args.extend(root_args());
    args.extend(["--remount-ro", "/", "--", "/usr/bin/true"].map(OsString::from));
    let spec = CommandSpec::new(bwrap, &TreeMarker::new())
        .args(args)
        .env_policy(EnvPolicy::Hands { pass: Vec::new() })
        .fd(SECCOMP_FD, seccomp);
    let options = PipeOptions {
        stdin: StdinMode::Null,
        output: OutputMode::Merged,
        ..PipeOptions::default()
    };
    let mut child = warren_process::spawn(&spec, Connect::Pipes(options))
        .map_err(|err| format!("starting {}: {err}", bwrap.display()))?
        .into_pipes();
    let mut output = String::new();
    let run = async {
        let _ = child.stdout.read_to_string(&mut output).await;
        child.child.wait().await
    };
    let status = match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(status)) => status,
        Ok(Err(err)) => return Err(format!("waiting for {}: {err}", bwrap.display())),
        Err(_) => {
            let _ = warren_process::kill_tree(&child.tree, Duration::from_secs(1)).await;
            return Err(format!("{} did not finish within 10 s", bwrap.display()));
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed ({status}): {}",
            bwrap.display(),
            output.trim()
        ))
    }
}

/// bwrap on `PATH`, else at `/usr/bin/bwrap`; `None` when neither is an executable file.
pub fn find_bwrap() -> Option<PathBuf> {
    let executable = |path: &Path| {
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("bwrap"))
        .chain([PathBuf::from("/usr/bin/bwrap")])
        .find(|candidate| candidate.is_absolute() && executable(candidate))
}
