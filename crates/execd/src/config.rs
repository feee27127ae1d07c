//! The daemon's settings, parsed from the command line (`warren execd --listen ...`) or built
//! directly by tests and by the gateway when it starts hands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use warren_http::ServeConfig;

/// `warren execd` flags. Every field has the default the specs give.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Address to listen on: `HOST:PORT`, or `unix:/path/to/execd.sock` for a Unix socket
    /// (a stale socket file there is replaced; the new one is mode 0600).
    #[arg(long, default_value = "127.0.0.1:44772")]
    pub listen: ListenAddr,

    /// This hands instance's identity, reported by `GET /v1/hands/identity`; a request whose
    /// `X-Warren-Hands-Nonce` differs is refused with 409 (default: a random one at start).
    #[arg(long, env = "WARREN_HANDS_NONCE", hide_env_values = true)]
    pub hands_nonce: Option<String>,

    /// Read `EXECD_ACCESS_TOKEN=...` and `WARREN_HANDS_NONCE=...` lines from this inherited
    /// descriptor (a pipe) at start and close it, instead of the environment or the command
    /// line, which `/proc` shows to every process of the same user. Set, execd also makes
    /// itself non-dumpable, so commands it runs cannot read its memory or descriptors.
    #[arg(long)]
    pub secrets_fd: Option<i32>,

    /// `ADDR=unix:/path`: forward connections to the TCP address `ADDR` to the Unix socket
    /// (repeatable): how an agent in a sandbox without a network reaches the gateway's model
    /// proxy.
    #[arg(long)]
    pub forward: Vec<crate::forward::Forward>,

    /// Also serve E2B's envd API (Connect `process.Process`, `filesystem.Filesystem`, `/files`)
    /// on this address, for the `e2b` SDKs in debug mode (docs/e2b-compat.md; envd's port is
    /// 49983). Off by default.
    #[arg(long)]
    pub e2b_listen: Option<SocketAddr>,

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

    /// The agent's home: `GET /v1/workspace/snapshot?tree=home` and the matching restore work
    /// on it (the gateway keeps it as the session's second snapshot).
    #[arg(long)]
    pub home: Option<PathBuf>,

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

    /// A connection that has not sent a complete request head this long after it could, is
    /// closed, in milliseconds (also how long an idle keep-alive connection is kept).
    #[arg(
        long,
        default_value_t = ServeConfig::DEFAULT_HEADER_READ_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub header_read_timeout_ms: u64,

    /// A request body from which nothing arrives this long while it is read fails with 408,
    /// in milliseconds.
    #[arg(
        long,
        default_value_t = ServeConfig::DEFAULT_BODY_IDLE_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub body_idle_timeout_ms: u64,

    /// Most connections served at once (WebSockets included); more wait to be accepted.
    #[arg(
        long,
        default_value_t = ServeConfig::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub max_connections: usize,

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
            listen: ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 44772))),
            access_token: None,
            hands_nonce: None,
            secrets_fd: None,
            forward: Vec::new(),
            e2b_listen: None,
            home: None,
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
            header_read_timeout_ms: ServeConfig::DEFAULT_HEADER_READ_TIMEOUT_MS,
            body_idle_timeout_ms: ServeConfig::DEFAULT_BODY_IDLE_TIMEOUT_MS,
            max_connections: ServeConfig::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Where execd listens: a TCP address or a Unix-domain socket's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if let Some(path) = value.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("expected unix:/path/to/execd.sock".to_owned());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        value
            .parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("expected HOST:PORT or unix:/path, not {value:?}"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Config {
    /// The connection limits `warren_http::serve` applies.
    pub fn serve_config(&self) -> ServeConfig {
        ServeConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
            max_connections: self.max_connections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn listen_takes_host_port_or_a_unix_socket_path() {
        let cases = [
            (
                "127.0.0.1:0",
                Some(ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0)))),
            ),
            (
                "[::1]:44772",
                Some(ListenAddr::Tcp("[::1]:44772".parse().expect("addr"))),
            ),
            (
                "unix:/run/h/execd.sock",
                Some(ListenAddr::Unix("/run/h/execd.sock".into())),
            ),
            ("unix:rel.sock", Some(ListenAddr::Unix("rel.sock".into()))),
            ("unix:", None),
            ("localhost", None),
            ("http://127.0.0.1:1", None),
        ];
        for (input, expected) in cases {
            assert_eq!(input.parse::<ListenAddr>().ok(), expected, "{input}");
            if let Some(parsed) = expected {
                assert_eq!(parsed.to_string().parse::<ListenAddr>().ok(), Some(parsed));
            }
        }
    }

    #[test]
    fn serve_limits_default_from_flags_and_from_config_default_and_refuse_zero() {
        use clap::Parser;
        let parsed = Cli::try_parse_from(["execd"]).expect("parses no flags");
        assert_eq!(parsed.config.serve_config(), ServeConfig::default());
        assert_eq!(Config::default().serve_config(), ServeConfig::default());
        let flags = [
            "execd",
            "--header-read-timeout-ms=300",
            "--body-idle-timeout-ms=400",
            "--max-connections=5",
        ];
        let parsed = Cli::try_parse_from(flags).expect("parses the flags");
        assert_eq!(
            parsed.config.serve_config(),
            ServeConfig {
                header_read_timeout: Duration::from_millis(300),
                body_idle_timeout: Duration::from_millis(400),
                max_connections: 5,
            }
        );
        for zero in [
            "--header-read-timeout-ms=0",
            "--body-idle-timeout-ms=0",
            "--max-connections=0",
        ] {
            assert!(Cli::try_parse_from(["execd", zero]).is_err(), "{zero}");
        }
    }
}
