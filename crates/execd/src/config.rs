//! The daemon's settings, parsed from the command line (`warren execd --listen ...`) or built
//! directly by tests and by the gateway when it starts hands.

use std::net::SocketAddr;
use std::path::PathBuf;

/// `warren execd` flags. Every field has the default the specs give.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:44772")]
    pub listen: SocketAddr,

    /// Require this token in `X-EXECD-ACCESS-TOKEN` on every route except `GET /ping`.
    #[arg(long, env = "EXECD_ACCESS_TOKEN", hide_env_values = true)]
    pub access_token: Option<String>,

    /// Most PTY sessions that may exist at once; creating more answers 429.
    #[arg(long, default_value_t = 256)]
    pub max_pty_sessions: usize,

    /// Directory that confines the files API (and the default working directory).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,

    /// Environment variables passed to commands even though their names look like secrets.
    #[arg(long, value_delimiter = ',')]
    pub pass_env: Vec<String>,

    /// How long finished OpenSandbox command records are kept, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub command_retention_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 44772)),
            access_token: None,
            max_pty_sessions: 256,
            root: PathBuf::from("/"),
            pass_env: Vec::new(),
            command_retention_secs: 3600,
        }
    }
}
