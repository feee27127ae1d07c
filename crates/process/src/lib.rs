//! Process handling for Warren: discovering a command's whole process tree, killing it with
//! escalation (SIGTERM to every process group, a grace period, SIGKILL, a bounded wait), and
//! reaping orphans as a child subreaper.
//!
//! This is the only crate that sends signals or reaps processes. It does not capture output or
//! know about HTTP; spawning on PTYs and pipes builds on the helpers here.

pub mod pty;
pub mod pipes;
pub mod procfs;
pub mod reaper;
pub mod tree;

pub use tree::{KillReport, TreeId, kill_tree, tree_members};
