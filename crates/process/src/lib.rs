//! Process handling for Warren: starting a command ([`CommandSpec`]) on a PTY or on pipes,
//! signalling its process group, discovering its whole process tree, killing it with escalation
//! (SIGTERM to every process group, a grace period, SIGKILL, a bounded wait), reaping orphans
//! as a child subreaper, and listing running trees on disk ([`TreeRegistry`]) so a restarted
//! daemon can stop what a crashed one left behind.
//!
//! This is the only crate that spawns processes, sends signals or reaps. It does not capture
//! output or know about HTTP.

pub mod command;
pub mod pipes;
pub mod procfs;
pub mod pty;
pub mod reaper;
pub mod registry;
pub mod tree;

pub use command::{CommandSpec, OwnedChild, exit_code, signal_group};
pub use registry::{Registered, TreeRegistry};
pub use tree::{KillReport, TreeId, kill_tree, tree_members};
