//! The egress of a session's hands (network.md): the policy that decides what a sandbox may
//! reach, and the HTTP proxy that enforces it on the session's Unix socket. Knows nothing of the
//! gateway: the owner gets decisions, questions, byte counts and each use of a credential
//! through [`Observer`]. Credentials are set at the edge ([`Edge`]): for a credentialed host
//! the proxy answers the sandbox's TLS with the gateway's CA ([`Authority`]).

pub mod authority;
pub mod credential;
mod inject;
pub mod policy;
pub mod proxy;
mod splice;

pub use authority::{Authority, AuthorityError, upstream_trust};
pub use credential::{Credential, CredentialError};
pub use inject::{CredentialUse, Edge};
pub use policy::{Mode, Policy, Rule, RuleError, Verdict};
pub use proxy::{Answer, AnswerFuture, Egress, Limits, Observer};
