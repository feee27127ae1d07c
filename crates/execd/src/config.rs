//! The daemon's settings, parsed from the command line (`warren execd --listen ...`) or built
//! directly by tests and by the gateway when it starts hands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use warren_http::ServeConfig;

use crate::origin_guard::{AllowedHost, AllowedOrigin, Exposure, Guard};

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

    /// Require this token in `X-EXECD-ACCESS-TOKEN` on every route except `GET /ping` (and
    /// in `X-Access-Token` on envd's, except `/health`). Without one, execd and envd listen
    /// only on loopback, a Unix socket, or with `--no-auth`.
    #[arg(long, env = "EXECD_ACCESS_TOKEN", hide_env_values = true)]
    pub access_token: Option<String>,

    /// Listen on a non-loopback address (`--listen`, `--e2b-listen`) without an access token:
    /// whoever reaches the port runs commands and reads and writes files. Without this flag
    /// that start is refused. It turns no check off: a token, if set, is still required.
    #[arg(long)]
    pub no_auth: bool,

    /// Also answer requests whose `Host` is this name (repeatable): a proxy's or a cluster's
    /// name for this server. `.example.com` is that name and every name under it; `*` turns
    /// the `Host` check off (DNS rebinding is then possible). Loopback names and addresses are
    /// always answered; see docs/http.md.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<AllowedHost>,

    /// Also answer requests sent by web pages of this origin, `scheme://host[:port]`
    /// (repeatable; `null` for sandboxed frames, `*` for every origin). A request with another
    /// site's `Origin` is refused with 403; one without `Origin` (curl, the SDKs) is not.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<AllowedOrigin>,

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

    /// `--header-read-timeout-ms`, `--body-idle-timeout-ms`, `--max-connections`.
    #[command(flatten)]
    pub serve: warren_http::ServeFlags,

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
            no_auth: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
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
            serve: warren_http::ServeFlags::default(),
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

/// A listener beyond loopback with no access token and no `--no-auth`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to listen on {listen} without an access token: anyone who reaches it could run \
     commands and read and write files; set --access-token (or EXECD_ACCESS_TOKEN, or \
     --secrets-fd), listen on 127.0.0.1, or pass --no-auth to serve it to the network unguarded"
)]
pub struct UnguardedListener {
    pub listen: SocketAddr,
}

impl Config {
    /// Refuses a start that would serve a non-loopback address without an access token,
    /// unless `--no-auth` says so (Docker's `--tls=false`). `serves_execd` is false for
    /// `warren envd`, which binds only `--e2b-listen`.
    pub fn check_unguarded_listeners(&self, serves_execd: bool) -> Result<(), UnguardedListener> {
        if self.access_token.is_some() || self.no_auth {
            return Ok(());
        }
        let execd = match &self.listen {
            ListenAddr::Tcp(listen) if serves_execd => Some(*listen),
            _ => None,
        };
        match execd
            .into_iter()
            .chain(self.e2b_listen)
            .find(|listen| Exposure::of_ip(listen.ip()) == Exposure::Network)
        {
            Some(listen) => Err(UnguardedListener { listen }),
            None => Ok(()),
        }
    }

    /// The guard of execd's listener (`--listen`).
    pub fn execd_guard(&self) -> Guard {
        let exposure = match &self.listen {
            ListenAddr::Unix(_) => Exposure::Unix,
            ListenAddr::Tcp(listen) => Exposure::of_ip(listen.ip()),
        };
        self.guard(exposure)
    }

    /// The guard of envd's listener (`--e2b-listen`; loopback when unset, as `warren envd`'s
    /// default is).
    pub fn envd_guard(&self) -> Guard {
        let exposure = self
            .e2b_listen
            .map_or(Exposure::Loopback, |listen| Exposure::of_ip(listen.ip()));
        self.guard(exposure)
    }

    fn guard(&self, exposure: Exposure) -> Guard {
        Guard::new(
            exposure,
            self.access_token.is_some(),
            &self.allowed_hosts,
            &self.allowed_origins,
        )
    }

    /// The connection limits `warren_http::serve` applies.
    pub fn serve_config(&self) -> ServeConfig {
        self.serve.config()
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
    fn a_listener_beyond_loopback_needs_a_token_or_no_auth() {
        use clap::Parser;
        let refused = |listen: &str| {
            Some(UnguardedListener {
                listen: listen.parse().expect("addr"),
            })
        };
        // (flags, serves execd (false: `warren envd`), the listener refused)
        let cases: [(&[&str], bool, Option<UnguardedListener>); 10] = [
            (&[], true, None),
            (&["--listen=127.0.0.2:1"], true, None),
            (&["--listen=[::1]:1"], true, None),
            (&["--listen=unix:/run/execd.sock"], true, None),
            (&["--listen=0.0.0.0:44772"], true, refused("0.0.0.0:44772")),
            (&["--listen=[::]:1"], true, refused("[::]:1")),
            (&["--listen=0.0.0.0:1", "--access-token=t"], true, None),
            (&["--listen=0.0.0.0:1", "--no-auth"], true, None),
            // `warren envd` binds only --e2b-listen.
            (
                &["--listen=0.0.0.0:1", "--e2b-listen=127.0.0.1:2"],
                false,
                None,
            ),
            (
                &["--e2b-listen=10.1.2.3:49983"],
                false,
                refused("10.1.2.3:49983"),
            ),
        ];
        for (flags, serves_execd, expected) in cases {
            let argv = std::iter::once("execd").chain(flags.iter().copied());
            let parsed = Cli::try_parse_from(argv).expect("parses");
            assert_eq!(
                parsed.config.check_unguarded_listeners(serves_execd).err(),
                expected,
                "{flags:?}"
            );
        }
    }

    #[test]
    fn allowed_hosts_and_origins_repeat_and_refuse_what_they_cannot_name() {
        use clap::Parser;
        let flags = [
            "execd",
            "--allowed-host=proxy.internal",
            "--allowed-host",
            ".cluster.local",
            "--allowed-origin=https://console.example",
            "--allowed-origin=null",
        ];
        let parsed = Cli::try_parse_from(flags).expect("parses");
        assert_eq!(parsed.config.allowed_hosts.len(), 2);
        assert_eq!(parsed.config.allowed_origins.len(), 2);
        for bad in [
            "--allowed-host=proxy.internal:8080",
            "--allowed-host=http://proxy.internal",
            "--allowed-origin=console.example",
            "--allowed-origin=https://console.example/app",
        ] {
            assert!(Cli::try_parse_from(["execd", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn serve_limits_are_the_shared_flags_with_their_defaults() {
        use clap::Parser;
        let parsed = Cli::try_parse_from(["execd"]).expect("parses no flags");
        assert_eq!(parsed.config.serve_config(), ServeConfig::default());
        assert_eq!(Config::default().serve_config(), ServeConfig::default());
        let parsed = Cli::try_parse_from(["execd", "--max-connections=5"]).expect("parses");
        assert_eq!(parsed.config.serve_config().max_connections, 5);
        assert!(Cli::try_parse_from(["execd", "--max-connections=0"]).is_err());
    }
}
