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

    /// Most OpenSandbox bash sessions that may exist at once; creating more answers 429.
    #[arg(long, default_value_t = 64)]
    pub max_bash_sessions: usize,

    /// Directory that confines the files API (and the default working directory).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,

    /// Where execd lists the process trees it runs, so the next execd on this directory stops
    /// what a killed one left (default: `<tmp>/warren-execd-<uid>/<port>`; a private one for
    /// port 0).
    #[arg(long, env = "WARREN_EXECD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Environment variables passed to commands even though their names look like secrets.
    #[arg(long, value_delimiter = ',')]
    pub pass_env: Vec<String>,

    /// How long finished OpenSandbox command records are kept, in seconds
    /// (`--command-retention` is the spec's name for it).
    #[arg(long, visible_alias = "command-retention", default_value_t = 3600)]
    pub command_retention_secs: u64,

    /// Most finished OpenSandbox command records kept, whatever their age; the oldest (and
    /// their logs) go first.
    #[arg(long, default_value_t = 1024)]
    pub command_records_max: usize,

    /// PTY WebSocket: interval between server pings, in milliseconds.
    #[arg(long, hide = true, default_value_t = 30_000)]
    pub pty_ping_interval_ms: u64,

    /// PTY WebSocket: a connection silent this long is dropped, in milliseconds.
    #[arg(long, hide = true, default_value_t = 60_000)]
    pub pty_silence_timeout_ms: u64,

    /// PTY WebSocket: one write (to the client or to the shell's stdin) gives up after this
    /// long, in milliseconds.
    #[arg(long, hide = true, default_value_t = 10_000)]
    pub pty_write_timeout_ms: u64,

    /// PTY takeover: how long the old holder gets to go before the newcomer is refused with
    /// `ALREADY_CONNECTED`, in milliseconds.
    #[arg(long, hide = true, default_value_t = 5_000)]
    pub pty_takeover_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 44772)),
            access_token: None,
            max_pty_sessions: 256,
            max_bash_sessions: 64,
            root: PathBuf::from("/"),
            state_dir: None,
            pass_env: Vec::new(),
            command_retention_secs: 3600,
            command_records_max: 1024,
            pty_ping_interval_ms: 30_000,
            pty_silence_timeout_ms: 60_000,
            pty_write_timeout_ms: 10_000,
            pty_takeover_timeout_ms: 5_000,
        }
    }
}
