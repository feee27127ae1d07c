//! `/proxy/{port}/{path}` (OpenSandbox's route): a reverse proxy to `127.0.0.1:{port}` beside
//! execd, so a web app the agent started in the hands can be reached through execd's one
//! address (the gateway's previews use it). HTTP/1.1 with both bodies streamed, and WebSocket
//! (any `Upgrade`): the upgrade goes upstream, and once both sides switched protocols the bytes
//! are copied both ways.
//!
//! Built on hyper's client and `hyper::upgrade`, not hand-written HTTP. Hop-by-hop headers are
//! dropped (an upgrade keeps `Connection: upgrade` and `Upgrade`), and so are execd's own
//! credentials (`X-EXECD-ACCESS-TOKEN`, the hands nonce): the app never sees them. `Host` is
//! the upstream's (`127.0.0.1:{port}`, what dev servers accept); the client's goes in
//! `X-Forwarded-Host`, with `X-Forwarded-Proto` and `X-Forwarded-Prefix: /proxy/{port}`.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::error::ApiError;

pub mod error;
pub use error::ProxyError;

/// The proxy's state: one pooled HTTP client.
#[derive(Clone)]
pub struct Proxy {
    client: Client<HttpConnector, Body>,
}

impl Default for Proxy {
    fn default() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

pub fn routes(proxy: Proxy) -> Router {
    Router::new()
        .route("/proxy/{port}", any(forward_root))
        .route("/proxy/{port}/", any(forward_root))
        .route("/proxy/{port}/{*rest}", any(forward_path))
        .with_state(proxy)
}

async fn forward_root(
    axum::extract::State(proxy): axum::extract::State<Proxy>,
    Path(port): Path<String>,
    request: Request,
) -> Response {
    forward(&proxy, &port, "", request).await
}

async fn forward_path(
    axum::extract::State(proxy): axum::extract::State<Proxy>,
    Path((port, rest)): Path<(String, String)>,
    request: Request,
) -> Response {
    forward(&proxy, &port, &rest, request).await
}

async fn forward(proxy: &Proxy, port: &str, rest: &str, request: Request) -> Response {
    match forward_checked(proxy, port, rest, request).await {
        Ok(response) => response,
        Err(error) => ApiError::from(error).into_response(),
    }
}

async fn forward_checked(
    proxy: &Proxy,
    port_text: &str,
    rest: &str,
    mut request: Request,
) -> Result<Response, ProxyError> {
    let port = match port_text.parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => return Err(ProxyError::InvalidPort(port_text.to_owned())),
    };
    let upgrade = warren_http::hop::wants_upgrade(request.headers());
    let path_and_query = match request.uri().query() {
        Some(query) => format!("/{rest}?{query}"),
        None => format!("/{rest}"),
    };
    let uri: Uri = format!("http://127.0.0.1:{port}{path_and_query}")
        .parse()
        .map_err(|_| ProxyError::InvalidPort(port_text.to_owned()))?;
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    let forwarded_host = parts.headers.get(header::HOST).cloned();
    let mut headers = upstream_headers(&parts.headers, upgrade);
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("an address is a header value"),
    );
    if let Some(host) = forwarded_host {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    if let Ok(prefix) = HeaderValue::from_str(&format!("/proxy/{port}")) {
        headers.insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    parts.uri = uri;
    parts.headers = headers;
    parts.version = axum::http::Version::HTTP_11;
    let upstream_request = Request::from_parts(parts, body);
    let mut answer =
        proxy
            .client
            .request(upstream_request)
            .await
            .map_err(|e| ProxyError::Unreachable {
                port,
                detail: error_chain(&e),
            })?;
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((client, upstream)) => {
                    let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                Err(e) => tracing::debug!(port, error = %e, "a proxied upgrade failed"),
            }
        });
        let (mut parts, _) = answer.into_parts();
        // The 101 keeps `Connection: upgrade` and `Upgrade` for the client.
        parts.headers = upstream_headers(&parts.headers, true);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = answer.into_parts();
    parts.headers = upstream_headers(&parts.headers, false);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// What goes on of `headers` ([`warren_http::hop::forwardable`]) without execd's own
/// credentials, which the app never sees.
fn upstream_headers(headers: &HeaderMap, upgrade: bool) -> HeaderMap {
    let mut kept = warren_http::hop::forwardable(headers, upgrade);
    kept.remove(crate::auth::ACCESS_TOKEN_HEADER);
    kept.remove(warren_protocol::hands::HANDS_NONCE_HEADER);
    kept
}

/// The error and its causes, for the 502 message ("connection refused" is in the chain).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execd_credentials_stay_behind_with_the_hop_by_hop_headers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("x-execd-access-token", "t"),
            ("x-warren-hands-nonce", "n"),
            ("host", "hands"),
            ("cookie", "a=b"),
            ("accept", "text/html"),
        ] {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_static(value),
            );
        }
        let kept = upstream_headers(&headers, false);
        let mut names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        names.sort();
        assert_eq!(names, ["accept", "cookie"]);
    }
}
