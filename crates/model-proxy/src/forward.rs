//! One request through the proxy: find the session by its token, refuse what cannot go (no
//! key, over budget), forward method, path, query, headers and body to the upstream with the
//! real credential, and stream the answer back chunk by chunk while a [`UsageParser`] reads it.
//! The `usage` event is recorded once per model call, when the answer ends or the client drops
//! it (`Drop` of [`Metered`]).
//!
//! Neither body is buffered: the request body is handed to reqwest as a stream, the answer to
//! axum as one. Logs name the provider, the session and the status, never a header value or
//! the query string (where Gemini keys travel).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::Stream;
use warren_protocol::gateway::ModelUsage;

use super::provider::{CREDENTIAL_HEADERS, Call, Provider, ProxyRefusal, query_without_key};
use super::usage::{Framing, UsageParser};
use crate::{Account, Ledger, ModelProxy};

pub async fn forward(proxy: &ModelProxy, ledger: &dyn Ledger, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let (name, rest) = split_path(parts.uri.path());
    let Some(provider) = Provider::from_name(name) else {
        return warren_http::error_response(
            StatusCode::NOT_FOUND,
            "UNKNOWN_MODEL_PROVIDER",
            format!(
                "unknown model provider {name:?}: the proxy serves anthropic, openai and gemini"
            ),
        );
    };
    let query = parts.uri.query();
    let session = provider
        .presented_token(&parts.headers, query)
        .and_then(|token| proxy.tokens.session_of(token))
        .and_then(|id| ledger.account(&id));
    let Some(session) = session else {
        tracing::debug!(
            provider = name,
            "model request without a live session token"
        );
        return provider.refusal(
            ProxyRefusal::Unauthenticated,
            "missing, unknown or revoked Warren model token: use the session's token (wm_…) the gateway gave the agent",
        );
    };
    let model = match provider.classify(&parts.method, rest) {
        Call::Model { model } => Some(model),
        Call::Other => None,
    };
    let refuse = |refusal: ProxyRefusal, message: &str| {
        if let Some(model) = &model {
            record(&session, provider, model.clone(), refusal.status(), started);
        }
        provider.refusal(refusal, message)
    };
    let credential = proxy.keys.get(provider).and_then(|key| {
        let (header_name, prefix) = provider.credential_header();
        key.header_value(prefix).map(|value| (header_name, value))
    });
    let Some((credential_name, credential_value)) = credential else {
        return refuse(ProxyRefusal::NoKey, &provider.no_key_message());
    };
    if model.is_some()
        && let Some(budget) = proxy.budget_tokens
    {
        let used = session.used_tokens();
        if used >= budget {
            let message = format!(
                "the session used {used} of its {budget} model tokens (--model-budget-tokens): no more model requests are forwarded"
            );
            tracing::info!(
                session = session.session_id(),
                provider = name,
                used,
                budget,
                "model request over budget"
            );
            session.refused("MODEL_BUDGET_EXCEEDED", &message);
            return refuse(ProxyRefusal::OverBudget, &message);
        }
    }

    let base = proxy.upstream(provider);
    let mut url = format!("{base}/{rest}");
    let query = match provider {
        Provider::Gemini => query_without_key(query),
        _ => query.filter(|q| !q.is_empty()).map(str::to_string),
    };
    if let Some(query) = query {
        url.push('?');
        url.push_str(&query);
    }
    let mut headers = warren_http::hop::forwardable(&parts.headers, false);
    for credential_header in &CREDENTIAL_HEADERS {
        headers.remove(credential_header);
    }
    // The usage parser reads the answer as it passes: ask for it uncompressed.
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    headers.insert(credential_name, credential_value);
    tracing::debug!(session = session.session_id(), provider = name, method = %parts.method, path = rest, "model request");
    let mut upstream = proxy
        .client
        .request(parts.method.clone(), &url)
        .headers(headers);
    // A request without a body (`GET /v1/models`) goes without one, not as an empty chunked
    // stream some front ends refuse on a GET.
    if !HttpBody::is_end_stream(&body) {
        upstream = upstream.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    }
    let upstream = upstream.send().await;
    let answer = match upstream {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(session = session.session_id(), provider = name, upstream = base, error = %error.without_url(), "model upstream unreachable");
            return refuse(
                ProxyRefusal::Unreachable,
                &format!("the gateway cannot reach the {name} upstream ({base})"),
            );
        }
    };
    let status = answer.status();
    let headers = warren_http::hop::forwardable(answer.headers(), false);
    let framing = Framing::of_content_type(
        answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let stream = Box::pin(answer.bytes_stream());
    let body = match model {
        Some(model) => Body::from_stream(Metered {
            inner: stream,
            meter: Some(Meter {
                session,
                provider,
                status,
                parser: UsageParser::new(provider, framing, model),
                started,
                ms_to_first_token: None,
            }),
        }),
        None => Body::from_stream(stream),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// `("anthropic", "v1/messages")` of `/v1/model/anthropic/v1/messages`, the rest still
/// percent-encoded as the agent sent it.
fn split_path(path: &str) -> (&str, &str) {
    let tail = path
        .find("/v1/model/")
        .map_or("", |at| &path[at + "/v1/model/".len()..]);
    tail.split_once('/').unwrap_or((tail, ""))
}

/// `headers` without the hop-by-hop ones, including those the `Connection` header names.
/// The `usage` event of a model call the proxy answered itself (no key, over budget, upstream
/// unreachable): no tokens, the proxy's status.
fn record(
    session: &Arc<dyn Account>,
    provider: Provider,
    model: Option<String>,
    status: StatusCode,
    started: Instant,
) {
    session.record(ModelUsage {
        provider: provider.name().to_string(),
        model: model.unwrap_or_default(),
        ms_total: millis(started),
        status: status.as_u16(),
        ..ModelUsage::default()
    });
}

fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

type UpstreamBody = Pin<Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send>>;

/// A model call's answer on its way to the agent: every chunk passes unchanged, through the
/// usage parser.
struct Metered {
    inner: UpstreamBody,
    /// Taken when the usage is recorded, so it is recorded once.
    meter: Option<Meter>,
}

struct Meter {
    session: Arc<dyn Account>,
    provider: Provider,
    status: StatusCode,
    parser: UsageParser,
    started: Instant,
    ms_to_first_token: Option<u64>,
}

impl Meter {
    fn finish(self) {
        let usage = self.parser.finish();
        let ms_total = millis(self.started);
        tracing::debug!(
            session = self.session.session_id(),
            provider = self.provider.name(),
            status = self.status.as_u16(),
            ms_total,
            "model request done"
        );
        self.session.record(ModelUsage {
            provider: self.provider.name().to_string(),
            model: usage.model.unwrap_or_default(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            ms_to_first_token: self.ms_to_first_token,
            ms_total,
            status: self.status.as_u16(),
        });
    }
}

impl Stream for Metered {
    type Item = Result<Bytes, reqwest::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = std::task::ready!(this.inner.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(meter) = this.meter.as_mut() {
                    if meter.ms_to_first_token.is_none() && !chunk.is_empty() {
                        meter.ms_to_first_token = Some(millis(meter.started));
                    }
                    meter.parser.feed(chunk);
                }
            }
            Some(Err(_)) | None => {
                if let Some(meter) = this.meter.take() {
                    meter.finish();
                }
            }
        }
        Poll::Ready(item)
    }
}

impl Drop for Metered {
    /// The agent went away before the end: what streamed so far is still the call's usage.
    fn drop(&mut self) {
        if let Some(meter) = self.meter.take() {
            meter.finish();
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn the_provider_and_the_rest_come_from_the_path() {
        let cases = [
            (
                "/v1/model/anthropic/v1/messages",
                ("anthropic", "v1/messages"),
            ),
            (
                "/v1/model/gemini/v1beta/models/g%2F1:streamGenerateContent",
                ("gemini", "v1beta/models/g%2F1:streamGenerateContent"),
            ),
            ("/v1/model/nope", ("nope", "")),
            ("/other", ("", "")),
        ];
        for (path, expected) in cases {
            assert_eq!(split_path(path), expected, "{path}");
        }
    }
}
