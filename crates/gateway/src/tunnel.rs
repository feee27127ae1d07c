//! One HTTP request, upgrades included, to a running hands' execd, on a connection of its own
//! (its Unix socket or TCP) with hyper's client: the previews' `/proxy/{port}/…` and the
//! terminals' `/pty/{id}/ws`. The request's hop-by-hop headers and `Host` stay behind, execd's
//! token and the hands nonce are added; a `101` answer is passed on and, once both sides
//! switched protocols, the bytes are copied both ways until either ends. Any other answer is
//! streamed back as it comes.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use crate::hands::HandsEndpoint;

/// The hands' execd could not be reached or did not speak HTTP.
#[derive(Debug, thiserror::Error)]
#[error("the hands' execd: {0}")]
pub struct TunnelError(String);

/// Sends `request` to `path_and_query` of the execd at `endpoint`; see the module docs. `keep`
/// lives as long as an upgraded connection (a hold on the hands, say), else it is dropped
/// with the answer.
pub async fn forward(
    endpoint: &HandsEndpoint,
    path_and_query: &str,
    request: Request,
    keep: impl Send + 'static,
) -> Result<Response, TunnelError> {
    let mut extra = axum::http::HeaderMap::new();
    extra.insert(header::HOST, HeaderValue::from_static("hands"));
    if let Ok(token) = HeaderValue::from_str(&endpoint.token) {
        extra.insert("x-execd-access-token", token);
    }
    if let Ok(nonce) = HeaderValue::from_str(&endpoint.nonce) {
        extra.insert(warren_protocol::hands::HANDS_NONCE_HEADER, nonce);
    }
    forward_to(&endpoint.url, path_and_query, request, extra, keep).await
}

/// Sends `request` to `path_and_query` of the server at `url` (`unix:/path` or
/// `http://host:port`) with its hop-by-hop headers left behind and `extra` set on top (another
/// replica's gateway, or an execd by [`forward`]); upgrades and streamed answers as the module
/// docs say.
pub async fn forward_to(
    url: &str,
    path_and_query: &str,
    mut request: Request,
    extra: axum::http::HeaderMap,
    keep: impl Send + 'static,
) -> Result<Response, TunnelError> {
    let upgrade = warren_http::hop::wants_upgrade(request.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut headers = warren_http::hop::forwardable(&parts.headers, upgrade);
    for (name, value) in extra.iter() {
        headers.insert(name.clone(), value.clone());
    }
    let mut upstream = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query)
        .body(body)
        .map_err(|e| TunnelError(e.to_string()))?;
    *upstream.headers_mut() = headers;
    let mut answer = send(url, upstream).await?;
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            let _keep = keep;
            if let Ok((client, upstream)) = tokio::try_join!(client_upgrade, upstream_upgrade) {
                let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        });
        let (mut parts, _) = answer.into_parts();
        parts.headers = warren_http::hop::forwardable(&parts.headers, true);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = answer.into_parts();
    parts.headers = warren_http::hop::forwardable(&parts.headers, false);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// One request on a new connection to the execd at `url` (`unix:/path` or
/// `http://host:port`), with upgrades allowed.
async fn send(
    url: &str,
    request: Request,
) -> Result<hyper::Response<hyper::body::Incoming>, TunnelError> {
    let failed = |e: &dyn std::fmt::Display| TunnelError(e.to_string());
    let io: Box<dyn Io> = match url.strip_prefix("unix:") {
        Some(path) => Box::new(
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| failed(&e))?,
        ),
        None => {
            let parsed = reqwest::Url::parse(url).map_err(|e| failed(&e))?;
            let host = parsed.host_str().unwrap_or("127.0.0.1").to_owned();
            let port = parsed.port_or_known_default().unwrap_or(80);
            Box::new(
                tokio::net::TcpStream::connect((host, port))
                    .await
                    .map_err(|e| failed(&e))?,
            )
        }
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| failed(&e))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    sender.send_request(request).await.map_err(|e| failed(&e))
}

/// A byte stream to an execd.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}
