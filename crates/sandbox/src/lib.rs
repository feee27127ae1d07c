//! The local hands' sandbox: a bubblewrap command line ([`SandboxSpec`]) that confines one
//! session's `warren execd` to its workspace, the seccomp filter it installs ([`seccomp`]), and
//! the cgroups that freeze, kill and limit the hands as a whole ([`HandsCgroup`]).
//!
//! What a command inside can and cannot see is fixed here: the workspace read-write, a private
//! `/tmp`, the host's `/usr` and `/etc` read-only, its own pid, user, ipc and uts namespaces
//! (and network with [`Network::None`]), no capabilities, `no_new_privs`, the clean hands
//! environment. This crate builds commands and cgroups; it spawns only through
//! `warren-process` and knows nothing of sessions, execd or HTTP.

pub mod bwrap;
pub mod cgroup;
pub mod seccomp;

pub use bwrap::{
    AGENT_PREFIX, HOME, Network, SandboxSpec, TRUST_BUNDLE, WARREN_BIN, WORKSPACE, find_bwrap,
    probe, seccomp_memfd,
};
pub use cgroup::{CgroupRoots, HandsCgroup, LimitHits, Limits};
pub use seccomp::{DENIED, SeccompError, filter_bpf};
