//! Process handling for Warren: starting a command ([`CommandSpec`]) on a PTY or on pipes,
//! signalling its process group, discovering its whole process tree, killing it with escalation
//! (SIGTERM to every process group, a grace period, SIGKILL, a bounded wait), reaping orphans
//! as a child subreaper, and listing running trees on disk ([`TreeRegistry`]) so a restarted
//! daemon can stop what a crashed one left behind.
//!
//! Also the one environment policy ([`env`]) and the one default-shell lookup ([`shell`]).
//!
//! This is the only crate that spawns processes, sends signals or reaps (clippy.toml refuses
//! `Command::new` elsewhere). It does not capture output or know about HTTP.

mod child_setup;
pub mod command;
pub mod env;
pub mod inherited;
pub mod pipes;
pub mod procfs;
pub mod pty;
pub mod reaper;
pub mod registry;
pub mod shell;
mod spawner;
pub mod stop;
pub mod tree;

pub use command::{
    CommandSpec, Connect, OwnedChild, Spawned, StageBind, StageKind, StagedBinds, exit_code,
    signal_group, signal_pid, spawn,
};
pub use env::{EnvPolicy, HandsVar};
pub use registry::{Registered, TreeRegistry};
pub use tree::{
    KillReport, TreeGuard, TreeId, TreeMarker, kill_tree, kill_tree_blocking, signal_tree,
    tree_members,
};
