//! The egress of a session's hands (network.md): the policy that decides what a sandbox may
//! reach, and the HTTP proxy that enforces it on the session's Unix socket. Knows nothing of the
//! gateway: the owner gets decisions, questions and byte counts through [`Observer`].

pub mod policy;
pub mod proxy;
mod splice;

pub use policy::{Mode, Policy, Rule, RuleError, Verdict};
pub use proxy::{Answer, AnswerFuture, Egress, Limits, Observer};
