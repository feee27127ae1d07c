//! `warren gateway` / `warren serve` flags (each also an env var `WARREN_<NAME>`) and the small
//! parsers for durations (`2h`, `30s`, `500ms`) and sizes (`512MiB`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use warren_http::ServeConfig;

#[derive(Clone, clap::Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, env = "WARREN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Data directory (devices, sessions, event logs, workspaces).
    #[arg(long, env = "WARREN_DATA", default_value = "./warren-data")]
    pub data: PathBuf,
    /// Where devices, session metadata and event logs live: `file:` (the data directory) or
    /// `postgres://user@host:port/db` (a PostgreSQL database the gateway's replicas share;
    /// workspaces and caches stay in `--data`).
    #[arg(
        long,
        env = "WARREN_STORE",
        default_value = "file:",
        hide_env_values = true
    )]
    pub store: StoreUrl,
    /// This replica's id among the gateways sharing a `--store postgres://…` (default: one
    /// made at the first start and kept in `--data`).
    #[arg(long, env = "WARREN_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// How the other replicas reach this one (default: `http://` and the listen address, with
    /// loopback for an unspecified one).
    #[arg(long, env = "WARREN_REPLICA_URL")]
    pub replica_url: Option<String>,
    /// How long a replica's hold on a session lasts without renewal (renewed every third of
    /// it); when its replica dies, another takes the session after this.
    #[arg(long, env = "WARREN_LEASE_TTL", default_value = "15s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// Key a client presents (`X-App-Key`) to register a device; generated and printed if absent.
    #[arg(long, env = "WARREN_APP_KEY", hide_env_values = true)]
    pub app_key: Option<String>,
    /// Bearer token for the admin routes; they are off when absent.
    #[arg(long, env = "WARREN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The agent: a preset (`claude`, `codex`, `gemini`, `shell`) or an ACP agent command line
    /// (default: `shell`, the built-in `warren shell-agent`).
    #[arg(long, env = "WARREN_AGENT")]
    pub agent: Option<String>,
    /// The program of the `claude`, `codex` or `gemini` preset at this path, instead of the
    /// one found on PATH (the preset's variables and config stay).
    #[arg(long, env = "WARREN_AGENT_PROGRAM")]
    pub agent_program: Option<PathBuf>,
    /// The model the `claude`, `codex` or `gemini` preset asks for, instead of the agent's own
    /// default (Codex's default here is one the pinned Codex knows: `gpt-5.4`).
    #[arg(long, env = "WARREN_AGENT_MODEL")]
    pub agent_model: Option<String>,
    /// Where the agent runs: `hands` (inside the session's sandbox) or `host`. Default: `hands`
    /// for every agent but the built-in shell agent.
    #[arg(long, env = "WARREN_BRAIN_PLACEMENT", value_enum)]
    pub brain_placement: Option<BrainPlacement>,
    /// Agent workers started and initialized ahead of time.
    #[arg(long, env = "WARREN_WARM_WORKERS", default_value_t = 2)]
    pub warm_workers: usize,
    /// Server-wide limit of running brains.
    #[arg(long, env = "WARREN_MAX_BRAINS", default_value_t = 24)]
    pub max_brains: usize,
    /// A brain with no turn and no pending permission is stopped after this long.
    #[arg(long, env = "WARREN_BRAIN_IDLE", default_value = "2h", value_parser = parse_duration)]
    pub brain_idle: Duration,
    /// Hands with no running turn, attached terminal or other use for this long are
    /// snapshotted and frozen (processes stay in memory); any use resumes them.
    #[arg(long, env = "WARREN_HANDS_IDLE_PAUSE", default_value = "2m", value_parser = parse_duration)]
    pub hands_idle_pause: Duration,
    /// Hands paused this long, with a snapshot of their current files, are archived: their
    /// processes stop and the live workspace is removed; the next use restores the snapshot.
    #[arg(long, env = "WARREN_HANDS_ARCHIVE_AFTER", default_value = "24h", value_parser = parse_duration)]
    pub hands_archive_after: Duration,
    /// Snapshots larger than this are never archived (the hands stay paused).
    #[arg(long, env = "WARREN_SNAPSHOT_MAX", default_value = "512MiB", value_parser = parse_size)]
    pub snapshot_max: u64,
    /// Where sessions' snapshots live: `s3://bucket/prefix` (S3-compatible object storage,
    /// reached with the standard `AWS_*` settings), or, when absent, the data directory.
    #[arg(long, env = "WARREN_SNAPSHOTS")]
    pub snapshots: Option<warren_store::objects::ObjectUrl>,
    /// Checkpoints kept per session (checkpoints.md); older ones go, and the chunks no kept
    /// checkpoint uses with them. The newest is always kept.
    #[arg(long, env = "WARREN_CHECKPOINTS_KEEP", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoints_keep: u32,
    /// Checkpoints older than this go (the newest is always kept).
    #[arg(long, env = "WARREN_CHECKPOINTS_MAX_AGE", default_value = "30d", value_parser = parse_duration)]
    pub checkpoints_max_age: Duration,
    /// How hands are confined: `auto` (bwrap when it works, else unconfined with a warning),
    /// `bwrap` (refuse to start hands without it) or `none`.
    #[arg(
        long,
        env = "WARREN_HANDS_ISOLATION",
        value_enum,
        default_value = "auto"
    )]
    pub hands_isolation: crate::hands::local::IsolationMode,
    /// The hands' network (network.md): `private` (a namespace of their own; egress only
    /// through the session's proxy, by `--hands-egress`), `none` (loopback only) or `host` (the
    /// host's network, shared with every other session: said loudly).
    #[arg(
        long,
        env = "WARREN_HANDS_NETWORK",
        value_enum,
        default_value = "private"
    )]
    pub hands_network: crate::hands::local::NetworkMode,
    /// What the hands' egress proxy lets through without asking: `none`, `registries` (package
    /// registries and code hosts; anything else is asked), `ask` (everything is asked) or
    /// `open` (any public address). Each session's can be changed at run time.
    #[arg(long, env = "WARREN_HANDS_EGRESS", default_value = "registries", value_parser = clap::value_parser!(warren_egress::Mode))]
    pub hands_egress: warren_egress::Mode,
    /// An egress allow rule for every session, `HOST[:PORT]` or `*.DOMAIN[:PORT]` (repeatable;
    /// comma-separated in the environment). Loopback, private and metadata addresses pass only
    /// when a rule names that exact host (or address) and port.
    #[arg(long = "hands-egress-allow", env = "WARREN_HANDS_EGRESS_ALLOW", value_delimiter = ',', value_parser = clap::value_parser!(warren_egress::Rule))]
    pub hands_egress_allow: Vec<warren_egress::Rule>,
    /// An egress deny rule for every session (repeatable; comma-separated in the environment);
    /// deny wins over allow.
    #[arg(long = "hands-egress-deny", env = "WARREN_HANDS_EGRESS_DENY", value_delimiter = ',', value_parser = clap::value_parser!(warren_egress::Rule))]
    pub hands_egress_deny: Vec<warren_egress::Rule>,
    /// How long a connection to a host no rule covers waits for the person's answer before it
    /// is refused.
    #[arg(long, env = "WARREN_EGRESS_ASK_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub egress_ask_timeout: Duration,
    /// A credential the egress proxy sets on HTTPS requests to its hosts, so its token never
    /// enters a sandbox: `NAME=HOST[,HOST…]:HEADER:VALUE`, VALUE naming a variable of this
    /// process's environment alone or after a scheme (`Bearer $GITHUB_TOKEN`; `Basic $PAIR` with
    /// `user:token`, sent base64-encoded). Read at start (repeatable; `;`-separated in the
    /// environment). Needs `--hands-network private`.
    #[arg(long = "hands-credential", env = "WARREN_HANDS_CREDENTIAL", value_delimiter = ';', value_parser = clap::value_parser!(warren_egress::Credential))]
    pub hands_credential: Vec<warren_egress::Credential>,
    /// The devices whose sessions may use a credential, `NAME=DEVICE_ID[,DEVICE_ID…]`
    /// (repeatable; `;`-separated in the environment); a credential not named here is offered
    /// to every device's sessions.
    #[arg(long = "hands-credential-devices", env = "WARREN_HANDS_CREDENTIAL_DEVICES", value_delimiter = ';', value_parser = parse_credential_devices)]
    pub hands_credential_devices: Vec<(String, Vec<String>)>,
    /// A PEM file of CA certificates the egress proxy trusts for upstreams, besides the
    /// system's (repeatable): for a credentialed host behind a private CA.
    #[arg(
        long = "egress-upstream-ca",
        env = "WARREN_EGRESS_UPSTREAM_CA",
        value_delimiter = ','
    )]
    pub egress_upstream_ca: Vec<PathBuf>,
    /// The unprivileged host uid (and gid) a sandbox runs as when the gateway runs as root.
    #[arg(long, env = "WARREN_HANDS_UID", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub hands_uid: u32,
    /// The bwrap program (default: `bwrap` on PATH). Hidden: for packagers and tests.
    #[arg(long, env = "WARREN_HANDS_BWRAP", hide = true)]
    pub hands_bwrap: Option<PathBuf>,
    /// Memory limit of each hands sandbox (e.g. `2GiB`), where the host's cgroups allow.
    #[arg(long, env = "WARREN_HANDS_MEMORY", value_parser = parse_size)]
    pub hands_memory: Option<u64>,
    /// Process limit of each hands sandbox, where the host's cgroups allow.
    #[arg(long, env = "WARREN_HANDS_PIDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub hands_pids: Option<u64>,
    /// Where hands run: `local` (a sandbox on this machine) or `remote` (an execd per session
    /// at `--hands-url-template`).
    #[arg(
        long,
        env = "WARREN_HANDS_PROVIDER",
        value_enum,
        default_value = "local"
    )]
    pub hands_provider: HandsProviderKind,
    /// The execd URL of a session's remote hands; `{session}` is replaced by the session id.
    #[arg(long, env = "WARREN_HANDS_URL_TEMPLATE")]
    pub hands_url_template: Option<String>,
    /// The access token of remote hands' execds.
    #[arg(long, env = "WARREN_HANDS_TOKEN", hide_env_values = true)]
    pub hands_token: Option<String>,
    /// A variable for the agent, `NAME=VALUE` (repeatable; comma-separated in the environment),
    /// added to the gateway's environment minus Warren's own credentials.
    #[arg(long = "agent-env", env = "WARREN_AGENT_ENV", value_delimiter = ',', value_parser = parse_assignment)]
    pub agent_env: Vec<(String, String)>,
    /// A variable for the hands, `NAME` (the gateway's value) or `NAME=VALUE` (repeatable;
    /// comma-separated in the environment). The hands get only PATH, HOME, LANG, TERM, USER and
    /// these, never the gateway's other variables.
    #[arg(long = "hands-env", env = "WARREN_HANDS_ENV", value_delimiter = ',')]
    pub hands_env: Vec<warren_process::HandsVar>,
    /// `--header-read-timeout-ms`, `--body-idle-timeout-ms`, `--max-connections`.
    #[command(flatten)]
    pub serve: warren_http::ServeFlags,
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first); needs
    /// `--tls-key`.
    #[arg(long, env = "WARREN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`; needs `--tls-cert`.
    #[arg(long, env = "WARREN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The `warren` binary used to start hands (`execd`), the MCP server and the built-in
    /// agent (default: this executable).
    #[arg(long, env = "WARREN_BIN", hide = true)]
    pub warren_bin: Option<PathBuf>,
    /// Milliseconds of silence after which an event stream sends a heartbeat comment. Hidden:
    /// the spec fixes 15 s; tests shorten it to see heartbeats without waiting that long.
    #[arg(
        long,
        env = "WARREN_SSE_HEARTBEAT_MS",
        default_value_t = 15_000,
        value_parser = clap::value_parser!(u64).range(1..),
        hide = true
    )]
    pub sse_heartbeat_ms: u64,
    /// Where previews are served: a URL with `{token}` in its host (e.g.
    /// `https://{token}.preview.example.com`, with wildcard DNS). Default: on the host the
    /// console was opened on: `http://p-{token}.localhost:<listen port>` from this machine
    /// (browsers resolve `*.localhost` to loopback), `p-{token}.<name>` for a DNS name, a port
    /// of its own for an IP address (docs/gateway.md "Previews").
    #[arg(long, env = "WARREN_PREVIEW_BASE_URL")]
    pub preview_base_url: Option<String>,
    /// How long a preview URL works.
    #[arg(long, env = "WARREN_PREVIEW_TTL", default_value = "1h", value_parser = parse_duration)]
    pub preview_ttl: Duration,
    /// The largest file `PUT /v1/sessions/{id}/files/content` takes; a larger one is refused
    /// with 413 and nothing of it is kept.
    #[arg(long, env = "WARREN_UPLOAD_MAX", default_value = "200MiB", value_parser = parse_size)]
    pub upload_max: u64,
    /// Where Web Push messages may go: a URL prefix a subscription's endpoint must be under,
    /// compared by origin and then path (repeatable; comma-separated in the environment).
    /// Default: any `https://` URL of a public host.
    #[arg(long = "push-allow-endpoint", env = "WARREN_PUSH_ALLOW_ENDPOINT", value_delimiter = ',', value_parser = parse_url_prefix)]
    pub push_allow_endpoint: Vec<String>,
    /// A finished turn is pushed to the person's subscribed browsers when it ran longer than
    /// this (questions and lost sandboxes are pushed at once).
    #[arg(long, env = "WARREN_PUSH_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub push_after: Duration,
    /// The contact in every push's VAPID token (its `sub`): a `mailto:` or `https:` URL a push
    /// service can reach the operator at. Apple's refuses a host that does not resolve.
    #[arg(long, env = "WARREN_PUSH_CONTACT", default_value = "mailto:warren@example.com", value_parser = parse_push_contact)]
    pub push_contact: String,
    /// Serve the web console's files from this directory, read at every request, instead of
    /// the ones embedded in the binary. Hidden: for editing the console without rebuilding.
    #[arg(long, env = "WARREN_CONSOLE_DIR", hide = true)]
    pub console_dir: Option<PathBuf>,
    #[command(flatten)]
    pub model: crate::model_proxy::ModelArgs,
}

/// `--store`: the data directory (`file:`) or a PostgreSQL database.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    File,
    /// A `postgres://` or `postgresql://` URL (it may carry a password).
    Postgres(String),
}

impl std::str::FromStr for StoreUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<StoreUrl, String> {
        if text == "file:" || text == "file" {
            Ok(StoreUrl::File)
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(text.to_owned()))
        } else {
            Err("the store is `file:` or a postgres:// URL".into())
        }
    }
}

// Hand-written so a password in the URL never reaches a log.
impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::File => f.write_str("file:"),
            StoreUrl::Postgres(_) => f.write_str("postgres://<redacted>"),
        }
    }
}

pub use warren_hands::BrainPlacement;

/// `--hands-provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HandsProviderKind {
    Local,
    Remote,
}

/// `NAME=VALUE` with a non-empty name and no NUL byte.
fn parse_assignment(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() && !text.contains('\0') => {
            Ok((name.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not NAME=VALUE")),
    }
}

// Hand-written so the app key and admin token never reach a log through `{:?}`.
impl std::fmt::Debug for GatewayArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayArgs")
            .field("listen", &self.listen)
            .field("data", &self.data)
            .field("store", &self.store)
            .field("replica_id", &self.replica_id)
            .field("replica_url", &self.replica_url)
            .field("lease_ttl", &self.lease_ttl)
            .field("app_key", &self.app_key.as_ref().map(|_| "<redacted>"))
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("agent", &self.agent)
            .field("brain_placement", &self.brain_placement)
            .field("agent_program", &self.agent_program)
            .field("agent_model", &self.agent_model)
            .field("warm_workers", &self.warm_workers)
            .field("max_brains", &self.max_brains)
            .field("brain_idle", &self.brain_idle)
            .field("hands_idle_pause", &self.hands_idle_pause)
            .field("hands_archive_after", &self.hands_archive_after)
            .field("snapshot_max", &self.snapshot_max)
            .field("snapshots", &self.snapshots)
            .field("checkpoints_keep", &self.checkpoints_keep)
            .field("checkpoints_max_age", &self.checkpoints_max_age)
            .field("hands_isolation", &self.hands_isolation)
            .field("hands_network", &self.hands_network)
            .field("hands_egress", &self.hands_egress)
            .field("hands_egress_allow", &self.hands_egress_allow)
            .field("hands_egress_deny", &self.hands_egress_deny)
            .field("egress_ask_timeout", &self.egress_ask_timeout)
            .field("hands_credential", &self.hands_credential)
            .field("hands_credential_devices", &self.hands_credential_devices)
            .field("egress_upstream_ca", &self.egress_upstream_ca)
            .field("hands_uid", &self.hands_uid)
            .field("hands_bwrap", &self.hands_bwrap)
            .field("hands_memory", &self.hands_memory)
            .field("hands_pids", &self.hands_pids)
            .field("hands_provider", &self.hands_provider)
            .field("hands_url_template", &self.hands_url_template)
            .field(
                "hands_token",
                &self.hands_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "agent_env",
                &self
                    .agent_env
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field(
                "hands_env",
                &self
                    .hands_env
                    .iter()
                    .map(|var| &var.name)
                    .collect::<Vec<_>>(),
            )
            .field("preview_base_url", &self.preview_base_url)
            .field("preview_ttl", &self.preview_ttl)
            .field("upload_max", &self.upload_max)
            .field("console_dir", &self.console_dir)
            .field("push_allow_endpoint", &self.push_allow_endpoint)
            .field("push_after", &self.push_after)
            .field("push_contact", &self.push_contact)
            .field("model", &self.model)
            .field("warren_bin", &self.warren_bin)
            .field("sse_heartbeat_ms", &self.sse_heartbeat_ms)
            .field("serve", &self.serve)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

impl GatewayArgs {
    /// Every default, with the data directory and listen address given (tests, benchmarks).
    pub fn with_data(data: PathBuf) -> GatewayArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: GatewayArgs,
        }
        let mut args = Wrapper::parse_from(["warren"]).args;
        args.data = data;
        args.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        args
    }

    /// The silence after which an event stream sends a heartbeat comment.
    pub fn sse_heartbeat(&self) -> Duration {
        Duration::from_millis(self.sse_heartbeat_ms)
    }

    /// The connection limits `warren_http::serve` applies.
    pub fn serve_config(&self) -> ServeConfig {
        self.serve.config()
    }
}

/// `--hands-credential-devices NAME=DEVICE_ID[,DEVICE_ID…]`.
fn parse_credential_devices(text: &str) -> Result<(String, Vec<String>), String> {
    let (name, devices) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=DEVICE_ID[,DEVICE_ID…], not {text:?}"))?;
    let devices: Vec<String> = devices
        .split(',')
        .map(|device| device.trim().to_owned())
        .filter(|device| !device.is_empty())
        .collect();
    if name.trim().is_empty() || devices.is_empty() {
        return Err(format!(
            "expected NAME=DEVICE_ID[,DEVICE_ID…], not {text:?}"
        ));
    }
    Ok((name.trim().to_owned(), devices))
}

/// `--push-allow-endpoint`: an `http://` or `https://` URL (the push crate checks the rest).
fn parse_url_prefix(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.starts_with("https://") || text.starts_with("http://") {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not an http:// or https:// URL"))
    }
}

/// `--push-contact`: a `mailto:` or `https:` URL (RFC 8292 section 2.1).
fn parse_push_contact(text: &str) -> Result<String, String> {
    let text = text.trim();
    let rest = text
        .strip_prefix("mailto:")
        .or_else(|| text.strip_prefix("https://"))
        .filter(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace));
    match rest {
        Some(_) => Ok(text.to_owned()),
        None => Err(format!("{text:?} is not a mailto: or https:// URL")),
    }
}

/// `2h`, `90m`, `30s`, `500ms`, `1d`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = split_number(text, "duration")?;
    let seconds_per_unit: u64 = match unit {
        "ms" => return Ok(Duration::from_millis(number)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "invalid duration unit in {text:?} (use ms, s, m, h, d)"
            ));
        }
    };
    number
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("duration {text:?} is too large"))
}

/// `512MiB`, `1GiB`, `200MB`, `64KiB`, or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = split_number(text, "size")?;
    let factor: u64 = match unit {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "invalid size unit in {text:?} (use B, KB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Splits `text` (already trimmed) into its leading decimal number and the unit after it.
fn split_number<'a>(text: &'a str, what: &str) -> Result<(u64, &'a str), String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number = number
        .parse()
        .map_err(|_| format!("invalid {what} {text:?}"))?;
    Ok((number, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_table() {
        let cases = [
            ("2h", Some(7200)),
            ("2m", Some(120)),
            ("30s", Some(30)),
            ("45", Some(45)),
            ("1d", Some(86_400)),
            ("h", None),
            ("2w", None),
            ("999999999999999999d", None),
            ("99999999999999999999", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_duration(text).ok().map(|d| d.as_secs()),
                want,
                "{text}"
            );
        }
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn sizes_table() {
        let cases = [
            ("512MiB", Some(512 << 20)),
            ("200MB", Some(200_000_000)),
            ("7", Some(7)),
            ("1XB", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).ok(), want, "{text}");
        }
    }

    #[test]
    fn defaults_follow_the_spec_and_debug_hides_secrets() {
        let mut args = GatewayArgs::with_data(PathBuf::from("d"));
        assert_eq!(args.warm_workers, 2);
        assert_eq!(args.max_brains, 24);
        assert_eq!(args.brain_idle, Duration::from_secs(7200));
        assert_eq!(args.snapshot_max, 512 << 20);
        assert_eq!(args.sse_heartbeat(), Duration::from_secs(15));
        args.app_key = Some("secret-app-key".into());
        assert!(!format!("{args:?}").contains("secret-app-key"));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: GatewayArgs,
    }

    #[test]
    fn command_line_defaults_follow_the_spec() {
        use clap::Parser;
        let args = Cli::try_parse_from(["warren"])
            .expect("no flag is required")
            .args;
        assert_eq!(args.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(args.data, PathBuf::from("./warren-data"));
        assert_eq!(args.store, StoreUrl::File);
        assert_eq!(args.lease_ttl, Duration::from_secs(15));
        assert_eq!(args.warm_workers, 2);
        assert_eq!(args.max_brains, 24);
        assert_eq!(args.brain_idle, Duration::from_secs(2 * 3600));
        assert_eq!(args.hands_idle_pause, Duration::from_secs(2 * 60));
        assert_eq!(args.hands_archive_after, Duration::from_secs(24 * 3600));
        assert_eq!(args.snapshot_max, 512 << 20);
        assert_eq!(args.serve_config(), ServeConfig::default());
    }

    #[test]
    fn store_is_file_or_a_postgres_url_whose_password_is_never_shown() {
        use clap::Parser;
        let url = "postgres://warren:s3cret@127.0.0.1:5432/warren";
        let args = Cli::try_parse_from(["warren", "--store", url])
            .expect("a postgres URL parses")
            .args;
        assert_eq!(args.store, StoreUrl::Postgres(url.into()));
        assert!(!format!("{args:?}").contains("s3cret"));
        for bad in ["mysql://x", "", "/var/lib/warren", "s3://bucket"] {
            assert!(
                Cli::try_parse_from(["warren", "--store", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn serve_limits_are_the_shared_flags() {
        use clap::Parser;
        let args = Cli::try_parse_from(["warren", "--max-connections=5"])
            .expect("parses")
            .args;
        assert_eq!(args.serve_config().max_connections, 5);
        assert!(Cli::try_parse_from(["warren", "--max-connections=0"]).is_err());
    }

    #[test]
    fn every_flag_is_also_an_env_var_warren_name() {
        use clap::CommandFactory;
        let command = Cli::command();
        let mut n_flags = 0;
        for arg in command.get_arguments() {
            // Hidden flags (the binary path, test intervals) are not the spec's.
            let Some(long) = arg.get_long().filter(|_| !arg.is_hide_set()) else {
                continue;
            };
            let want = format!("WARREN_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|env| env.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            n_flags += 1;
        }
        assert!(n_flags >= 11, "the spec's flags are all there: {n_flags}");
    }

    #[test]
    fn push_flags_parse_and_refuse_what_is_not_a_url() {
        use clap::Parser;
        let args = Cli::try_parse_from(["warren"]).expect("defaults").args;
        assert!(args.push_allow_endpoint.is_empty());
        assert_eq!(args.push_after, Duration::from_secs(30));
        let args = Cli::try_parse_from([
            "warren",
            "--push-allow-endpoint",
            "http://127.0.0.1:4000/push/",
            "--push-allow-endpoint=https://fcm.googleapis.com/",
            "--push-after",
            "2m",
            "--push-contact",
            "https://ops.example.com/warren",
        ])
        .expect("parses")
        .args;
        assert_eq!(
            args.push_allow_endpoint,
            ["http://127.0.0.1:4000/push/", "https://fcm.googleapis.com/"]
        );
        assert_eq!(args.push_after, Duration::from_secs(120));
        assert_eq!(args.push_contact, "https://ops.example.com/warren");
        for bad in [
            ["--push-allow-endpoint", "fcm.googleapis.com"],
            ["--push-contact", "ops@example.com"],
            ["--push-contact", "mailto:"],
            ["--push-after", "soon"],
        ] {
            assert!(
                Cli::try_parse_from(["warren", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sse_heartbeat_flag_is_hidden_and_rejects_zero() {
        use clap::{CommandFactory, Parser};
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--warm-workers"), "help lists the flags");
        assert!(!help.contains("sse-heartbeat"), "the flag is hidden");
        let args = Cli::try_parse_from(["warren", "--sse-heartbeat-ms", "250"])
            .expect("a positive interval parses")
            .args;
        assert_eq!(args.sse_heartbeat(), Duration::from_millis(250));
        assert!(
            Cli::try_parse_from(["warren", "--sse-heartbeat-ms", "0"]).is_err(),
            "a zero interval would send heartbeats in a busy loop"
        );
    }
}
