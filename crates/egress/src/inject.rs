//! Credentials at the edge (network.md "Credentials"): a `CONNECT` to a host a session's
//! credential is for, carrying TLS, is answered with a certificate for that host signed by the
//! gateway's CA; the proxy checks the upstream's real certificate, sets the credential's header
//! on each request (replacing one the sandbox sent), and masks the credential's value in what
//! comes back. Anything else on such a tunnel (a protocol that is not TLS) passes opaque, with
//! no credential.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::authority::Authority;
use crate::credential::Credential;
use crate::proxy::{Body, Counted, HOP_HEADERS, Observer, text};

/// The gateway's CA and what upstreams are checked against: shared by every session's proxy.
pub struct Edge {
    authority: Arc<Authority>,
    upstream: Arc<ClientConfig>,
}

impl Edge {
    pub fn new(authority: Arc<Authority>, upstream: Arc<ClientConfig>) -> Arc<Edge> {
        Arc::new(Edge {
            authority,
            upstream,
        })
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// A request that carried a credential (a `credential_used` event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialUse {
    pub name: String,
    pub host: String,
    pub method: String,
    /// Without its query.
    pub path: String,
    pub status: u16,
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// One tunnel to a credentialed host: what the sandbox's side and the upstream carried.
pub(crate) struct Interception {
    pub edge: Arc<Edge>,
    pub observer: Arc<dyn Observer>,
    pub host: String,
    pub port: u16,
    pub credentials: Vec<Arc<Credential>>,
    /// The TLS handshakes' bound.
    pub handshake_timeout: Duration,
    pub response_timeout: Duration,
}

impl Interception {
    /// Serves the tunnel until either side closes; the bytes sent up and down (on the wire, to
    /// and from the upstream).
    pub(crate) async fn run(self, client: Upgraded, upstream: TcpStream) -> (u64, u64) {
        let mut client = TokioIo::new(client);
        let mut first = [0u8; 1];
        // A TLS client speaks first; an upstream that speaks first (SMTP, a database) is no TLS
        // the proxy could answer: the tunnel is opaque from its first byte.
        let head = tokio::select! {
            read = client.read(&mut first) => match read {
                Ok(1) => Some(first[0]),
                _ => return (0, 0),
            },
            _ = upstream.readable() => None,
        };
        let counted = Counted::new(upstream);
        let (up, down) = (counted.up.clone(), counted.down.clone());
        let client = Prefixed {
            head,
            inner: client,
        };
        if head == Some(TLS_HANDSHAKE) {
            self.intercept(client, counted).await;
        } else {
            // Not TLS: no credential, an opaque tunnel.
            let mut client = client;
            let mut upstream = counted;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
        (
            up.load(std::sync::atomic::Ordering::Acquire),
            down.load(std::sync::atomic::Ordering::Acquire),
        )
    }

    async fn intercept(self, client: Prefixed<TokioIo<Upgraded>>, upstream: Counted) {
        let server_config = match self.edge.authority.server_config(&self.host) {
            Ok(config) => config,
            Err(error) => {
                tracing::warn!(%error, "egress proxy: cannot answer a credentialed host's TLS");
                return;
            }
        };
        // The sandbox's handshake and the upstream's at once: a new tunnel waits for the
        // slower, not for both in turn.
        let accept = tokio::time::timeout(
            self.handshake_timeout,
            tokio_rustls::TlsAcceptor::from(server_config).accept(client),
        );
        let (accepted, upstream) = tokio::join!(accept, self.connect_upstream(upstream));
        let client = match accepted {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                tracing::debug!(host = %self.host, %error, "egress proxy: the sandbox's TLS handshake failed");
                return;
            }
            Err(_) => return,
        };
        let (sender, refused, upstream_closed) = match upstream {
            Ok(tls) => match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
                Ok((sender, connection)) => {
                    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
                    tokio::spawn(async move {
                        let _ = connection.await;
                        let _ = closed_tx.send(());
                    });
                    (Some(tokio::sync::Mutex::new(sender)), None, Some(closed_rx))
                }
                Err(error) => (
                    None,
                    Some(format!(
                        "warren egress: {}:{}: {error}\n",
                        self.host, self.port
                    )),
                    None,
                ),
            },
            Err(why) => (None, Some(why), None),
        };
        let relay = Arc::new(Relay {
            masker: Masker::new(&self.credentials),
            interception: self,
            sender,
            refused,
        });
        let service = hyper::service::service_fn(move |request| {
            let relay = relay.clone();
            async move { Ok::<_, std::convert::Infallible>(relay.relay(request).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(client), service);
        let mut connection = std::pin::pin!(connection);
        match upstream_closed {
            Some(closed) => {
                tokio::select! {
                    _ = connection.as_mut() => return,
                    _ = closed => connection.as_mut().graceful_shutdown(),
                }
                let _ = connection.await;
            }
            None => {
                let _ = connection.await;
            }
        }
    }

    /// TLS to the upstream, its certificate checked for the host; `Err` is the text every
    /// request on the tunnel is answered with instead (nothing is sent upstream).
    async fn connect_upstream(
        &self,
        upstream: Counted,
    ) -> Result<tokio_rustls::client::TlsStream<Counted>, String> {
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| format!("warren egress: {}: {e}\n", self.host))?;
        let connected = tokio::time::timeout(
            self.handshake_timeout,
            tokio_rustls::TlsConnector::from(self.edge.upstream.clone()).connect(name, upstream),
        )
        .await;
        match connected {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(error)) => {
                let why = format!("the upstream's certificate is not trusted: {error}");
                self.observer.decided(&self.host, self.port, false, &why);
                Err(format!(
                    "warren egress: {}:{} refused: TLS to it failed ({error}), so nothing was sent \
                     and no credential used. If it uses a private CA, the gateway can trust it \
                     with --egress-upstream-ca FILE.\n",
                    self.host, self.port
                ))
            }
            Err(_) => Err(format!(
                "warren egress: {}:{} did not complete TLS within {:?}\n",
                self.host, self.port, self.handshake_timeout
            )),
        }
    }
}

/// The requests of one intercepted tunnel, relayed with the credentials set.
struct Relay {
    interception: Interception,
    masker: Arc<Masker>,
    sender: Option<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>>,
    /// Why nothing is relayed (the upstream's TLS failed).
    refused: Option<String>,
}

impl Relay {
    async fn relay(&self, mut request: Request<Incoming>) -> Response<Body> {
        let Interception {
            host,
            port,
            credentials,
            observer,
            response_timeout,
            ..
        } = &self.interception;
        let Some(sender) = &self.sender else {
            let why = self.refused.clone().unwrap_or_default();
            return text(StatusCode::BAD_GATEWAY, why);
        };
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        if request.uri().authority().is_some() {
            let origin_form = request
                .uri()
                .path_and_query()
                .map(|pq| pq.as_str().to_owned())
                .unwrap_or_else(|| "/".to_owned());
            match origin_form.parse() {
                Ok(uri) => *request.uri_mut() = uri,
                Err(_) => {
                    return text(StatusCode::BAD_REQUEST, "warren egress: bad path\n".into());
                }
            }
        }
        let headers = request.headers_mut();
        for hop in HOP_HEADERS {
            headers.remove(*hop);
        }
        for credential in credentials {
            headers.remove(credential.header());
        }
        for credential in credentials {
            headers.insert(credential.header().clone(), credential.value().clone());
        }
        // What comes back is searched for the credential's value: no compression hides it.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let mut sender = sender.lock().await;
        if sender.ready().await.is_err() {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("warren egress: {host}:{port} closed the connection\n"),
            );
        }
        let answered = tokio::time::timeout(*response_timeout, sender.send_request(request)).await;
        drop(sender);
        // The header went out: the use is said whatever came back (the proxy's 502 or 504 when
        // nothing did).
        let response = match answered {
            Ok(Ok(response)) => {
                let (mut parts, body) = response.into_parts();
                self.masker.mask_headers(&mut parts.headers);
                Response::from_parts(parts, Scrubbed::new(body, self.masker.clone()).boxed())
            }
            Ok(Err(error)) => text(
                StatusCode::BAD_GATEWAY,
                format!("warren egress: {host}:{port}: {error}\n"),
            ),
            Err(_) => text(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "warren egress: {host}:{port} sent no response within {response_timeout:?}\n"
                ),
            ),
        };
        for credential in credentials {
            observer.credential_used(CredentialUse {
                name: credential.name().to_owned(),
                host: host.clone(),
                method: method.clone(),
                path: path.clone(),
                status: response.status().as_u16(),
            });
        }
        response
    }
}

/// Masks the credentials' values (each byte an `*`, so lengths hold) in what an upstream sends
/// back to the sandbox.
pub(crate) struct Masker {
    finders: Vec<memchr::memmem::Finder<'static>>,
    longest: usize,
}

impl Masker {
    pub(crate) fn new(credentials: &[Arc<Credential>]) -> Arc<Masker> {
        let finders: Vec<_> = credentials
            .iter()
            .flat_map(|credential| credential.secrets())
            .filter(|secret| !secret.is_empty())
            .map(|secret| memchr::memmem::Finder::new(secret).into_owned())
            .collect();
        let longest = finders.iter().map(|f| f.needle().len()).max().unwrap_or(0);
        Arc::new(Masker { finders, longest })
    }

    /// Masks every whole occurrence in `data`; true when there was one.
    pub(crate) fn mask(&self, data: &mut [u8]) -> bool {
        let mut ranges = Vec::new();
        for finder in &self.finders {
            let length = finder.needle().len();
            ranges.extend(finder.find_iter(data).map(|at| at..at + length));
        }
        for range in &ranges {
            data[range.clone()].fill(b'*');
        }
        !ranges.is_empty()
    }

    fn mask_headers(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            if self.mask(&mut bytes)
                && let Ok(masked) = HeaderValue::from_bytes(&bytes)
            {
                *value = masked;
            }
        }
    }
}

/// A response body with the credentials' values masked, across chunk boundaries: the last
/// `longest - 1` bytes wait for the next chunk.
pub(crate) struct Scrubbed<B> {
    inner: B,
    masker: Arc<Masker>,
    carry: BytesMut,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> Scrubbed<B> {
    pub(crate) fn new(inner: B, masker: Arc<Masker>) -> Scrubbed<B> {
        Scrubbed {
            inner,
            masker,
            carry: BytesMut::new(),
            trailers: None,
            done: false,
        }
    }
}

impl<B> http_body::Body for Scrubbed<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                if !this.carry.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(this.carry.split().freeze()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        this.masker.mask(&mut this.carry);
                        let keep = this.masker.longest.saturating_sub(1).min(this.carry.len());
                        let ready = this.carry.len() - keep;
                        if ready > 0 {
                            return Poll::Ready(Some(Ok(Frame::data(
                                this.carry.split_to(ready).freeze(),
                            ))));
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut trailers) = frame.into_trailers() {
                            this.masker.mask_headers(&mut trailers);
                            this.trailers = Some(trailers);
                        }
                        this.done = true;
                    }
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => this.done = true,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.carry.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let carried = self.carry.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + carried);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + carried);
        }
        hint
    }
}

/// A stream with a byte read ahead of it put back in front.
struct Prefixed<S> {
    head: Option<u8>,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if buf.remaining() > 0
            && let Some(byte) = self.head.take()
        {
            buf.put_slice(&[byte]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker() -> Arc<Masker> {
        let credential = Credential::parse("t=example.test:Authorization:Bearer $T", |_| {
            Some("sekret-value-123".into())
        })
        .expect("the test body works");
        Masker::new(&[Arc::new(credential)])
    }

    async fn scrub(chunks: &[&str]) -> String {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk.as_bytes()))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let collected = Scrubbed::new(body, masker())
            .collect()
            .await
            .expect("the test body works");
        String::from_utf8(collected.to_bytes().to_vec()).expect("the test body works")
    }

    #[tokio::test]
    async fn the_value_is_masked_in_a_body_even_split_across_chunks() {
        let whole = "echo: Authorization: Bearer sekret-value-123\n";
        let masked = "echo: Authorization: ***********************\n";
        assert_eq!(scrub(&[whole]).await, masked);
        for at in 1..whole.len() {
            let (a, b) = whole.split_at(at);
            assert_eq!(scrub(&[a, b]).await, masked, "split at {at}");
        }
        let single: Vec<String> = whole.chars().map(String::from).collect();
        let single: Vec<&str> = single.iter().map(String::as_str).collect();
        assert_eq!(scrub(&single).await, masked);
        // The token alone is masked too; other text passes unchanged.
        assert_eq!(
            scrub(&["x sekret-value-123 y", " plain"]).await,
            "x **************** y plain"
        );
    }

    #[test]
    fn the_value_is_masked_in_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-echo",
            HeaderValue::from_static("Bearer sekret-value-123"),
        );
        headers.insert("x-other", HeaderValue::from_static("fine"));
        masker().mask_headers(&mut headers);
        assert_eq!(headers["x-echo"], "***********************");
        assert_eq!(headers["x-other"], "fine");
    }
}
