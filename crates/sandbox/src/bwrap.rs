//! The bubblewrap command line of one hands ([`SandboxSpec::command`]), the check that bwrap
//! works on this host ([`probe`]), and where it is installed ([`find_bwrap`]).
//!
//! The sandbox's root is built from nothing: read-only binds of the host's `/usr` and `/etc`
//! (and `/bin`, `/lib*`, `/sbin` as the host has them: symlinks into `/usr`, or read-only
//! binds), a fresh `/proc`, `/dev` and `/tmp`, an empty `/home` holding only the agent's home,
//! the session workspace at `/workspace`, the run directory at `/run/warren` and the `warren`
//! binary at `/opt/warren/bin/warren`, then the root is remounted read-only. Nothing else of
//! the host is mounted. The session's directories come in as descriptors the caller opened,
//! so none of their host paths matters to the sandbox:
//!
//! - When the ids switch (a root daemon: [`SandboxSpec::uid`] or [`SandboxSpec::gid`] set),
//!   the child, still root, mounts them into a staging tmpfs on [`STAGING_DIR`] in a mount
//!   namespace of its own ([`CommandSpec::stage_binds`]), and bwrap binds them from there
//!   (`--bind /tmp/workspace /workspace`...). bwrap opens its sources as the hands' uid, so a
//!   descriptor alone (`--bind-fd`, which bwrap 0.8 resolves back to its host path) would fail
//!   wherever an ancestor is not searchable by that uid (a data directory under `/root`, a
//!   0700 temp dir). The staging namespace is bwrap's alone and the daemon's gains no mount;
//!   bwrap's own `/tmp` covers the staging tmpfs, so nothing of it shows inside.
//! - Otherwise (a daemon that is not root, which cannot unshare a mount namespace) they are
//!   passed at fixed numbers as `--bind-fd`/`--ro-bind-fd`: bwrap runs as the daemon's user,
//!   who reaches its own paths. bwrap closes them once mounted, so none reaches a command.
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
use warren_process::{CommandSpec, Connect, EnvPolicy, HandsVar, StageBind, StageKind, TreeMarker};

/// Where the session workspace is mounted inside; the sandbox's working directory.
pub const WORKSPACE: &str = "/workspace";
/// Where the run directory (execd's socket) is mounted inside.
pub const RUN_DIR: &str = "/run/warren";
/// Where the `warren` binary is mounted inside, read-only.
pub const WARREN_BIN: &str = "/opt/warren/bin/warren";
/// The agent's home inside.
pub const HOME: &str = "/home/agent";
/// Where the agent's install prefix is mounted inside, read-only (agents.md).
pub const AGENT_PREFIX: &str = "/opt/warren/agent";
/// Where a sandbox that switches ids stages its sources, in the bwrap child's own mount
/// namespace; inside the sandbox `/tmp` is bwrap's own tmpfs over it.
pub const STAGING_DIR: &str = "/tmp";

const SECCOMP_FD: i32 = 3;
const WORKSPACE_FD: i32 = 4;
const RUN_DIR_FD: i32 = 5;
const WARREN_BIN_FD: i32 = 6;
const HOME_FD: i32 = 7;
const AGENT_PREFIX_FD: i32 = 8;
const TRUST_BUNDLE_FD: i32 = 9;
/// Where the sandbox finds its trusted certificates (the host's path, bound over with
/// [`SandboxSpec::trust_bundle`] when the gateway has credentials).
pub const TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

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
/// [`SandboxSpec::command`] stages them or passes them at fixed numbers.
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
    /// The directory the agent program is installed in, bound read-only at [`AGENT_PREFIX`]
    /// (whose `node_modules/.bin` and `bin` lead the sandbox's `PATH`).
    pub agent_prefix: Option<Arc<OwnedFd>>,
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
    /// Variables the sandbox gets unless `--hands-env` sets them (the egress proxy's).
    pub env_defaults: Vec<(String, String)>,
    /// The certificates the sandbox trusts, bound read-only over [`TRUST_BUNDLE`] (the host's
    /// and the gateway's egress CA, network.md "Credentials"); `None` keeps the host's.
    pub trust_bundle: Option<Arc<OwnedFd>>,
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
    /// it; the caller may add its own with [`CommandSpec::fd`] (above 9), which bwrap passes on.
    /// With a uid or gid the sources are staged ([`CommandSpec::stage_binds`], which needs
    /// root), else passed as descriptors (see the module docs).
    pub fn command(
        &self,
        marker: &TreeMarker,
        inner_program: &str,
        inner_args: &[OsString],
    ) -> CommandSpec {
        let mut args = isolation_args(self.network);
        args.extend(root_args());
        let sources = self.sources();
        let staged = self.uid.is_some() || self.gid.is_some();
        for source in &sources {
            let option = if source.read_only {
                "--ro-bind"
            } else {
                "--bind"
            };
            if staged {
                let staged_path = Path::new(STAGING_DIR).join(source.name);
                args.extend([option.into(), staged_path.into(), source.dest.into()]);
            } else {
                args.extend([
                    format!("{option}-fd").into(),
                    source.fd_number.to_string().into(),
                    source.dest.into(),
                ]);
            }
        }
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
            .join_cgroups(self.cgroup_procs.clone())
            .close_other_fds()
            .outlive_daemon();
        if staged {
            let binds = sources
                .into_iter()
                .map(|source| StageBind {
                    source: source.fd,
                    name: source.name.to_owned(),
                    kind: source.kind,
                })
                .collect();
            command = command.stage_binds(STAGING_DIR, binds);
        } else {
            for source in sources {
                command = command.fd(source.fd_number, source.fd);
            }
        }
        for (name, value) in INSIDE_DEFAULTS {
            if !self.extra_env.iter().any(|var| var.name == *name) {
                let value = match (*name, &self.agent_prefix) {
                    ("PATH", Some(_)) => {
                        format!("{AGENT_PREFIX}/node_modules/.bin:{AGENT_PREFIX}/bin:{value}")
                    }
                    _ => (*value).to_string(),
                };
                command = command.env(name, value);
            }
        }
        for (name, value) in &self.env_defaults {
            if !self.extra_env.iter().any(|var| var.name == *name) {
                command = command.env(name, value);
            }
        }
        command.uid = self.uid;
        command.gid = self.gid;
        command
    }
}

/// One host source of a sandbox: bound at `dest`, passed as descriptor `fd_number` or staged
/// as `name`.
struct Source {
    fd: Arc<OwnedFd>,
    fd_number: i32,
    name: &'static str,
    kind: StageKind,
    dest: &'static str,
    read_only: bool,
}

impl SandboxSpec {
    /// The sources in the order bwrap mounts them: the home first (under the `/home` tmpfs),
    /// the workspace last.
    fn sources(&self) -> Vec<Source> {
        let source = |fd: &Arc<OwnedFd>, fd_number, name, kind, dest, read_only| Source {
            fd: fd.clone(),
            fd_number,
            name,
            kind,
            dest,
            read_only,
        };
        let mut sources = Vec::with_capacity(6);
        if let Some(home) = &self.home {
            sources.push(source(home, HOME_FD, "home", StageKind::Dir, HOME, false));
        }
        if let Some(prefix) = &self.agent_prefix {
            sources.push(source(
                prefix,
                AGENT_PREFIX_FD,
                "agent",
                StageKind::Dir,
                AGENT_PREFIX,
                true,
            ));
        }
        sources.extend([
            source(
                &self.run_dir,
                RUN_DIR_FD,
                "run",
                StageKind::Dir,
                RUN_DIR,
                false,
            ),
            source(
                &self.warren_bin,
                WARREN_BIN_FD,
                "warren",
                StageKind::File,
                WARREN_BIN,
                true,
            ),
        ]);
        if let Some(bundle) = &self.trust_bundle {
            sources.push(source(
                bundle,
                TRUST_BUNDLE_FD,
                "trust",
                StageKind::File,
                TRUST_BUNDLE,
                true,
            ));
        }
        sources.extend([source(
            &self.workspace,
            WORKSPACE_FD,
            "workspace",
            StageKind::Dir,
            WORKSPACE,
            false,
        )]);
        sources
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ids: Option<u32>) -> SandboxSpec {
        let dir = || {
            Arc::new(
                rustix::fs::open(
                    "/",
                    rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .expect("opens /"),
            )
        };
        SandboxSpec {
            bwrap: "/usr/bin/bwrap".into(),
            workspace: dir(),
            run_dir: dir(),
            warren_bin: dir(),
            home: Some(dir()),
            agent_prefix: Some(dir()),
            network: Network::None,
            uid: ids,
            gid: ids,
            seccomp: seccomp_memfd().expect("seccomp memfd"),
            cgroup_procs: Vec::new(),
            extra_env: Vec::new(),
            env_defaults: Vec::new(),
            trust_bundle: None,
        }
    }

    fn binds(command: &CommandSpec) -> Vec<String> {
        let args: Vec<String> = command
            .args
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        args.windows(3)
            .filter(|w| w[0].starts_with("--bind") || w[0].starts_with("--ro-bind"))
            .filter(|w| !["/usr", "/etc", "/bin", "/sbin"].contains(&w[2].as_str()))
            .filter(|w| !w[2].starts_with("/lib"))
            .map(|w| w.join(" "))
            .collect()
    }

    #[test]
    fn switching_ids_stages_the_sources_and_passes_no_descriptor_of_them() {
        let command = spec(Some(1000)).command(&TreeMarker::new(), WARREN_BIN, &[]);
        assert_eq!(
            binds(&command),
            [
                "--bind /tmp/home /home/agent",
                "--ro-bind /tmp/agent /opt/warren/agent",
                "--bind /tmp/run /run/warren",
                "--ro-bind /tmp/warren /opt/warren/bin/warren",
                "--bind /tmp/workspace /workspace",
            ]
        );
        let targets: Vec<i32> = command.fds.iter().map(|(target, _)| *target).collect();
        assert_eq!(targets, [SECCOMP_FD]);
        let staged = command.staged_binds.expect("staged");
        assert_eq!(staged.dir, Path::new(STAGING_DIR));
        let names: Vec<(&str, StageKind)> = staged
            .binds
            .iter()
            .map(|bind| (bind.name.as_str(), bind.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("home", StageKind::Dir),
                ("agent", StageKind::Dir),
                ("run", StageKind::Dir),
                ("warren", StageKind::File),
                ("workspace", StageKind::Dir),
            ]
        );
        assert_eq!((command.uid, command.gid), (Some(1000), Some(1000)));
    }

    #[test]
    fn keeping_ids_passes_the_sources_as_descriptors() {
        let command = spec(None).command(&TreeMarker::new(), WARREN_BIN, &[]);
        assert_eq!(
            binds(&command),
            [
                "--bind-fd 7 /home/agent",
                "--ro-bind-fd 8 /opt/warren/agent",
                "--bind-fd 5 /run/warren",
                "--ro-bind-fd 6 /opt/warren/bin/warren",
                "--bind-fd 4 /workspace",
            ]
        );
        let mut targets: Vec<i32> = command.fds.iter().map(|(target, _)| *target).collect();
        targets.sort();
        assert_eq!(targets, [3, 4, 5, 6, 7, 8]);
        assert!(command.staged_binds.is_none());
    }

    #[test]
    fn an_agent_prefix_leads_the_path_inside() {
        let command = spec(None).command(&TreeMarker::new(), WARREN_BIN, &[]);
        let path = command
            .env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.to_string_lossy().into_owned());
        assert_eq!(
            path.as_deref(),
            Some(
                "/opt/warren/agent/node_modules/.bin:/opt/warren/agent/bin:/usr/local/bin:/usr/bin:/bin"
            )
        );
    }
}
