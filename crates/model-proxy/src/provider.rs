//! What differs between the three model APIs the proxy serves: where an SDK puts its API key,
//! where the real key goes, which requests are model calls (and so are metered and budgeted),
//! and the shape of an error body each SDK understands.
//!
//! Pure: no I/O, no state. The proxy's own errors are built here in the provider's shape so an
//! agent's SDK shows their message instead of failing to parse a Warren body.

use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use warren_http::secret::bearer_token;

/// A model API behind `/v1/model/{provider}/…`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    Anthropic,
    OpenAi,
    Gemini,
}

/// An error the proxy answers itself, before or instead of the upstream's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyRefusal {
    /// Missing, unknown or revoked `wm_` token (401).
    Unauthenticated,
    /// The gateway holds no key for this provider (503).
    NoKey,
    /// The upstream could not be reached (502).
    Unreachable,
    /// The session is over `--model-budget-tokens` (429).
    OverBudget,
}

impl ProxyRefusal {
    pub fn status(self) -> StatusCode {
        match self {
            ProxyRefusal::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProxyRefusal::NoKey => StatusCode::SERVICE_UNAVAILABLE,
            ProxyRefusal::Unreachable => StatusCode::BAD_GATEWAY,
            ProxyRefusal::OverBudget => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

/// Which credential header the proxy removes from every forwarded request: an agent's token
/// never reaches an upstream, whichever header it came in.
pub const CREDENTIAL_HEADERS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("x-goog-api-key"),
];

impl Provider {
    pub const ALL: [Provider; 3] = [Provider::Anthropic, Provider::OpenAi, Provider::Gemini];

    /// The name in `/v1/model/{name}/…` and in `--model-upstream NAME=URL`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
            Provider::Gemini => "gemini",
        }
    }

    pub fn from_name(name: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The public API's origin, the default upstream.
    pub fn default_upstream(self) -> &'static str {
        match self {
            Provider::Anthropic => "https://api.anthropic.com",
            Provider::OpenAi => "https://api.openai.com",
            Provider::Gemini => "https://generativelanguage.googleapis.com",
        }
    }

    /// The variables that hold the real key, in order of preference (environment and
    /// `--model-key-file` alike).
    pub fn key_variables(self) -> &'static [&'static str] {
        match self {
            Provider::Anthropic => &["ANTHROPIC_API_KEY"],
            Provider::OpenAi => &["OPENAI_API_KEY"],
            Provider::Gemini => &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        }
    }

    fn title(self) -> &'static str {
        match self {
            Provider::Anthropic => "Anthropic",
            Provider::OpenAi => "OpenAI",
            Provider::Gemini => "Gemini",
        }
    }

    /// The token the agent presented, where this provider's SDK sends its API key: Anthropic
    /// `x-api-key` or `Authorization: Bearer`, OpenAI `Authorization: Bearer`, Gemini
    /// `x-goog-api-key` or the `key` query parameter.
    pub fn presented_token<'a>(
        self,
        headers: &'a HeaderMap,
        query: Option<&'a str>,
    ) -> Option<&'a str> {
        let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let bearer = || header_text(header::AUTHORIZATION.as_str()).and_then(bearer_token);
        let token = match self {
            Provider::Anthropic => header_text("x-api-key").or_else(bearer),
            Provider::OpenAi => bearer(),
            Provider::Gemini => header_text("x-goog-api-key").or_else(|| query_key(query)),
        };
        token.map(str::trim).filter(|t| !t.is_empty())
    }

    /// The real credential header for `key`.
    pub fn credential_header(self) -> (HeaderName, &'static str) {
        match self {
            Provider::Anthropic => (HeaderName::from_static("x-api-key"), ""),
            Provider::OpenAi => (header::AUTHORIZATION, "Bearer "),
            Provider::Gemini => (HeaderName::from_static("x-goog-api-key"), ""),
        }
    }

    /// Whether `method rest` (the path after `/v1/model/{provider}/`) is a model call: metered
    /// into a `usage` event and refused over budget. Listing models and counting tokens are not.
    /// For Gemini, also the model the path names (`…/models/{model}:generateContent`).
    pub fn classify(self, method: &axum::http::Method, rest: &str) -> Call {
        if method != axum::http::Method::POST {
            return Call::Other;
        }
        let rest = rest.trim_end_matches('/');
        let model_call = match self {
            Provider::Anthropic => rest.ends_with("messages"),
            Provider::OpenAi => {
                rest.ends_with("responses")
                    || rest.ends_with("chat/completions")
                    || rest.ends_with("/completions")
                    || rest == "completions"
            }
            Provider::Gemini => {
                rest.ends_with(":generateContent") || rest.ends_with(":streamGenerateContent")
            }
        };
        if !model_call {
            return Call::Other;
        }
        let model = match self {
            Provider::Gemini => rest
                .rsplit_once("models/")
                .and_then(|(_, tail)| tail.split_once(':'))
                .map(|(model, _)| model.to_string())
                .filter(|model| !model.is_empty() && !model.contains('/')),
            _ => None,
        };
        Call::Model { model }
    }

    /// The proxy's own error in this provider's error body shape.
    pub fn refusal(self, refusal: ProxyRefusal, message: &str) -> Response {
        let status = refusal.status();
        let body = match self {
            Provider::Anthropic => {
                let kind = match refusal {
                    ProxyRefusal::Unauthenticated => "authentication_error",
                    ProxyRefusal::OverBudget => "rate_limit_error",
                    ProxyRefusal::NoKey | ProxyRefusal::Unreachable => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
            Provider::OpenAi => {
                let (kind, code) = match refusal {
                    ProxyRefusal::Unauthenticated => {
                        ("invalid_request_error", Some("invalid_api_key"))
                    }
                    ProxyRefusal::OverBudget => ("insufficient_quota", Some("insufficient_quota")),
                    ProxyRefusal::NoKey | ProxyRefusal::Unreachable => ("server_error", None),
                };
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            Provider::Gemini => {
                let kind = match refusal {
                    ProxyRefusal::Unauthenticated => "UNAUTHENTICATED",
                    ProxyRefusal::OverBudget => "RESOURCE_EXHAUSTED",
                    ProxyRefusal::NoKey | ProxyRefusal::Unreachable => "UNAVAILABLE",
                };
                json!({"error": {"code": status.as_u16(), "message": message, "status": kind}})
            }
        };
        (status, axum::Json(body)).into_response()
    }

    /// The 503 message: which variable to set.
    pub fn no_key_message(self) -> String {
        format!(
            "the gateway has no {} API key: set {} in the gateway's environment or in --model-key-file",
            self.title(),
            self.key_variables().join(" or ")
        )
    }
}

/// What a proxied request is, for metering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A model call; for Gemini with the model its path names.
    Model { model: Option<String> },
    /// Anything else (model lists, token counts, files): forwarded, not metered.
    Other,
}

/// The `key` query parameter (Gemini's `?key=`).
fn query_key(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|pair| pair.strip_prefix("key="))
}

/// The query string without Gemini's `key=` parameter (`None` when nothing is left).
pub fn query_without_key(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| !pair.is_empty() && *pair != "key" && !pair.starts_with("key="))
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    #[test]
    fn presented_tokens_come_from_where_each_sdk_sends_its_key() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().expect("header value"));
            }
            map
        };
        let cases: [(Provider, HeaderMap, Option<&str>, Option<&str>); 9] = [
            (
                Provider::Anthropic,
                headers(&[("x-api-key", "wm_a")]),
                None,
                Some("wm_a"),
            ),
            (
                Provider::Anthropic,
                headers(&[("authorization", "Bearer wm_b")]),
                None,
                Some("wm_b"),
            ),
            (Provider::Anthropic, headers(&[]), Some("key=wm_c"), None),
            (
                Provider::OpenAi,
                headers(&[("authorization", "bearer wm_d")]),
                None,
                Some("wm_d"),
            ),
            (
                Provider::OpenAi,
                headers(&[("x-api-key", "wm_e")]),
                None,
                None,
            ),
            (
                Provider::Gemini,
                headers(&[("x-goog-api-key", "wm_f")]),
                None,
                Some("wm_f"),
            ),
            (
                Provider::Gemini,
                headers(&[]),
                Some("alt=sse&key=wm_g"),
                Some("wm_g"),
            ),
            (
                Provider::Gemini,
                headers(&[("authorization", "Bearer wm_h")]),
                None,
                None,
            ),
            (
                Provider::Gemini,
                headers(&[("x-goog-api-key", " ")]),
                None,
                None,
            ),
        ];
        for (provider, headers, query, expected) in cases {
            assert_eq!(
                provider.presented_token(&headers, query),
                expected,
                "{provider:?} {headers:?} {query:?}"
            );
        }
    }

    #[test]
    fn the_key_parameter_is_dropped_from_the_query() {
        let cases = [
            (None, None),
            (Some("key=wm_x"), None),
            (Some("alt=sse&key=wm_x"), Some("alt=sse")),
            (Some("key=wm_x&alt=sse&x=1"), Some("alt=sse&x=1")),
            (Some("keyword=1&key"), Some("keyword=1")),
            (Some(""), None),
        ];
        for (query, expected) in cases {
            assert_eq!(query_without_key(query).as_deref(), expected, "{query:?}");
        }
    }

    #[test]
    fn model_calls_are_told_from_other_requests() {
        let model = |m: Option<&str>| Call::Model {
            model: m.map(str::to_string),
        };
        let cases = [
            (
                Provider::Anthropic,
                Method::POST,
                "v1/messages",
                model(None),
            ),
            (
                Provider::Anthropic,
                Method::POST,
                "v1/messages/count_tokens",
                Call::Other,
            ),
            (Provider::Anthropic, Method::GET, "v1/models", Call::Other),
            (Provider::OpenAi, Method::POST, "v1/responses", model(None)),
            (
                Provider::OpenAi,
                Method::POST,
                "v1/chat/completions",
                model(None),
            ),
            (Provider::OpenAi, Method::GET, "v1/responses", Call::Other),
            (
                Provider::OpenAi,
                Method::POST,
                "v1/responses/input_tokens",
                Call::Other,
            ),
            (
                Provider::Gemini,
                Method::POST,
                "v1beta/models/gemini-2.5-pro:streamGenerateContent",
                model(Some("gemini-2.5-pro")),
            ),
            (
                Provider::Gemini,
                Method::POST,
                "v1beta/models/gemini-2.5-flash:generateContent",
                model(Some("gemini-2.5-flash")),
            ),
            (
                Provider::Gemini,
                Method::POST,
                "v1beta/models/gemini-2.5-flash:countTokens",
                Call::Other,
            ),
            (Provider::Gemini, Method::GET, "v1beta/models", Call::Other),
        ];
        for (provider, method, rest, expected) in cases {
            assert_eq!(
                provider.classify(&method, rest),
                expected,
                "{provider:?} {method} {rest}"
            );
        }
    }
}
