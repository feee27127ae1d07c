//! The model proxy (agents.md "Model keys stay in the gateway"):
//! `/v1/model/{anthropic|openai|gemini}/…`. An agent (inside the hands or on the host) holds only
//! its session's `wm_` token and a base URL pointing here; the proxy checks the token, swaps in
//! the real credential, streams both ways and turns what the provider reports about each model
//! call into a `usage` event of the session, refusing calls once the session is over
//! `--model-budget-tokens`.
//!
//! The proxy reaches a session only through the [`Ledger`] its owner gives it: whether the
//! session is live, the tokens it used, and where a call's usage and a refusal go.
//!
//! Code map: [`keys`] the real keys and the upstreams; [`tokens`] the sessions' `wm_` tokens;
//! [`provider`] what differs between the three APIs (credential headers, model calls, error
//! shapes); [`usage`] the pure usage parsers; [`forward`] one request through; [`sockets`]
//! the proxy on a Unix socket per session.
//! Deliberately absent: normalising the providers' numbers, retries, caching, reading the
//! request body, any log or error text holding a key or a token.

mod forward;
mod keys;
mod provider;
pub mod sockets;
mod tokens;
pub mod usage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::any;
use warren_protocol::gateway::ModelUsage;

pub use keys::{Upstream, parse_upstream};
pub use provider::Provider;

use keys::Keys;
use tokens::Tokens;

/// How long connecting to an upstream may take; an answer itself may take as long as it takes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The model proxy's flags (flattened into `GatewayArgs`). The keys are not flags: they come
/// from the environment or the key file, so they never sit on a command line.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ModelArgs {
    /// Where the model proxy sends a provider's requests: NAME=URL with NAME one of anthropic,
    /// openai, gemini and URL an http(s) origin with an optional path prefix (repeatable).
    /// Default: the public APIs.
    #[arg(
        long = "model-upstream",
        env = "WARREN_MODEL_UPSTREAM",
        value_name = "NAME=URL",
        value_delimiter = ',',
        value_parser = parse_upstream
    )]
    pub model_upstream: Vec<Upstream>,
    /// A file of ANTHROPIC_API_KEY=…, OPENAI_API_KEY=…, GEMINI_API_KEY=… lines (`#` comments)
    /// for the model proxy; it overrides the gateway's environment, and an empty value means
    /// no key for that provider.
    #[arg(long, env = "WARREN_MODEL_KEY_FILE", value_name = "PATH")]
    pub model_key_file: Option<PathBuf>,
    /// Model tokens (input, output and cache, as the providers report them) a session may use
    /// through the model proxy; past it model calls get the API's 429.
    #[arg(long, env = "WARREN_MODEL_BUDGET_TOKENS", value_name = "N")]
    pub model_budget_tokens: Option<u64>,
}

/// The proxy's state: upstreams, the real keys, the per-session tokens, one HTTP client.
pub struct ModelProxy {
    upstreams: HashMap<Provider, String>,
    keys: Keys,
    tokens: Tokens,
    budget_tokens: Option<u64>,
    client: reqwest::Client,
}

// Hand-written so neither the keys nor the tokens can reach a log through `{:?}`.
impl std::fmt::Debug for ModelProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let with_keys: Vec<&str> = Provider::ALL
            .into_iter()
            .filter(|p| self.keys.get(*p).is_some())
            .map(Provider::name)
            .collect();
        f.debug_struct("ModelProxy")
            .field("upstreams", &self.upstreams)
            .field("keys_for", &with_keys)
            .field("budget_tokens", &self.budget_tokens)
            .finish_non_exhaustive()
    }
}

impl ModelProxy {
    /// Reads the keys (the gateway's environment, then `--model-key-file`) and the upstreams.
    pub fn from_args(args: &ModelArgs) -> Result<ModelProxy, String> {
        let keys = Keys::load(args.model_key_file.as_deref(), |name| {
            std::env::var(name).ok()
        })?;
        let mut upstreams: HashMap<Provider, String> = Provider::ALL
            .into_iter()
            .map(|p| (p, p.default_upstream().to_string()))
            .collect();
        for upstream in &args.model_upstream {
            upstreams.insert(upstream.provider, upstream.base.clone());
        }
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // Redirects go back to the agent: following them here could carry the real key
            // to another origin.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(ModelProxy {
            upstreams,
            keys,
            tokens: Tokens::default(),
            budget_tokens: args.model_budget_tokens,
            client,
        })
    }

    /// The session's model token (`wm_…`), made on first use and the same until revoked.
    pub fn token(&self, session_id: &str) -> String {
        self.tokens.token(session_id)
    }

    /// Revokes the session's token: later requests with it get 401.
    pub fn revoke(&self, session_id: &str) {
        self.tokens.revoke(session_id)
    }

    /// `--model-budget-tokens`: the model tokens one session may use.
    pub fn budget(&self) -> Option<u64> {
        self.budget_tokens
    }

    /// Whether the gateway holds a key for `provider`.
    pub fn has_key(&self, provider: Provider) -> bool {
        self.keys.get(provider).is_some()
    }

    /// The upstream origin (and path prefix) requests for `provider` go to.
    pub fn upstream(&self, provider: Provider) -> &str {
        self.upstreams
            .get(&provider)
            .map_or(provider.default_upstream(), String::as_str)
    }
}

/// The sessions, as the proxy sees them (implemented by their owner, the gateway).
pub trait Ledger: Send + Sync + 'static {
    /// The live session `session_id` (the one a valid token names), if it is here.
    fn account(&self, session_id: &str) -> Option<Arc<dyn Account>>;
}

/// One session's account with the proxy.
pub trait Account: Send + Sync {
    fn session_id(&self) -> &str;
    /// The model tokens the session used so far (what `--model-budget-tokens` counts).
    fn used_tokens(&self) -> u64;
    /// One model call (or one the proxy answered itself): the session's `usage` event.
    fn record(&self, usage: ModelUsage);
    /// A refusal the person should see (over budget): the session's `error` event.
    fn refused(&self, code: &str, message: &str);
}

/// The routes' state: the proxy and the sessions it serves.
#[derive(Clone)]
struct Served {
    proxy: Arc<ModelProxy>,
    ledger: Arc<dyn Ledger>,
}

/// The proxy's routes (`/v1/model/{provider}/…`), for the gateway's listener and each hands'
/// model socket.
pub fn router(proxy: Arc<ModelProxy>, ledger: Arc<dyn Ledger>) -> Router {
    Router::new()
        .route("/v1/model/{provider}/{*rest}", any(serve))
        .with_state(Served { proxy, ledger })
}

async fn serve(State(served): State<Served>, request: Request) -> Response {
    forward::forward(&served.proxy, served.ledger.as_ref(), request).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    #[test]
    fn flags_name_upstreams_the_key_file_and_the_budget() {
        let cli = Cli::try_parse_from([
            "warren",
            "--model-upstream",
            "anthropic=http://127.0.0.1:9/a/,openai=https://o.test",
            "--model-upstream",
            "gemini=https://g.test/v",
            "--model-key-file",
            "/etc/warren/keys",
            "--model-budget-tokens",
            "5000",
        ])
        .expect("flags parse");
        let proxy = ModelProxy::from_args(&ModelArgs {
            model_key_file: None,
            ..cli.model.clone()
        })
        .expect("proxy");
        assert_eq!(proxy.upstream(Provider::Anthropic), "http://127.0.0.1:9/a");
        assert_eq!(proxy.upstream(Provider::OpenAi), "https://o.test");
        assert_eq!(proxy.upstream(Provider::Gemini), "https://g.test/v");
        assert_eq!(proxy.budget(), Some(5000));
        assert_eq!(
            cli.model.model_key_file.as_deref(),
            Some(std::path::Path::new("/etc/warren/keys"))
        );
        assert!(
            Cli::try_parse_from(["warren", "--model-upstream", "bard=https://x.test"]).is_err()
        );
        let defaults = ModelProxy::from_args(&ModelArgs::default()).expect("defaults");
        assert_eq!(
            defaults.upstream(Provider::Gemini),
            "https://generativelanguage.googleapis.com"
        );
    }
}
