//! `warren-engine`, the gateway's session engine: everything that runs a person's sessions,
//! with no HTTP in it. [`Engine`] holds the sessions ([`sessions`], one [`session`] each, with
//! its [`event_log`] over `warren-store`), turns and brains ([`turns`], `warren-brain`),
//! admission ([`admission`]), warm sandboxes ([`warm`]), the agent presets ([`agents`]), the
//! hands' network ([`network`]), the model proxy's tokens and sockets, and replicas' leases and
//! takeover ([`replicas`]); it starts and owns their background tasks. It fails with
//! [`EngineError`], which names what went wrong and never an HTTP status. The gateway's HTTP
//! layer (`warren-gateway`) drives it and maps its errors; [`config`] is the gateway's flags,
//! which both read.

pub mod admission;
pub mod agents;
pub mod checkpoints;
pub mod config;
pub mod engine;
pub mod engine_error;
pub mod event_log;
pub mod network;
pub mod replicas;
pub mod session;
pub mod sessions;
pub mod turns;
pub mod warm;

pub use warren_hands as hands;
pub use warren_model_proxy as model_proxy;

pub use config::GatewayArgs;
pub use engine::Engine;
pub use engine_error::EngineError;
