//! Preview URLs follow the host the console was opened on (phone.md "Reaching the gateway
//! from a phone"): a LAN address gets each preview a port of its own, a DNS name a
//! `p-<token>` subdomain of it, both with the console's `frame-src` to match and over HTTPS
//! when the gateway serves TLS; loopback keeps `p-<token>.localhost`, and `--preview-base-url`
//! wins. Every request goes to 127.0.0.1; only its `Host` names the LAN address or the name.

use reqwest::header::{HOST, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use warren_gateway::hands::local::NetworkMode;

use super::helpers::{
    Conversation, TestGateway, args_without_agent, assert_error, in_bwrap, json_of,
};

/// The address of the phone's LAN in these tests: only ever a `Host` header.
const LAN_ADDRESS: &str = "192.168.1.20";
/// A DNS name the console is opened on: only ever a `Host` header (and a resolver override).
const NAME: &str = "warren.test";

/// The gateway's port.
fn port_of(gw: &TestGateway) -> u16 {
    gw.gateway.args.listen.port()
}

/// A client that follows no redirect (an own port's first answer is one).
fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client")
}

/// `POST /sessions/{id}/previews` of `port` sent with `Host: host`: the preview's JSON.
async fn create_preview_on(chat: &Conversation<'_>, host: &str, port: u16) -> Value {
    let path = format!("/sessions/{}/previews", chat.session);
    let answer = chat
        .gw
        .request(reqwest::Method::POST, &chat.token, &path)
        .header(HOST, host)
        .json(&json!({ "port": port }))
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 201, "POST {path} on {host}");
    answer.json().await.expect("json")
}

/// `GET /sessions/{id}/previews` sent with `Host: host`.
async fn list_previews_on(chat: &Conversation<'_>, host: &str) -> Value {
    let path = format!("/sessions/{}/previews", chat.session);
    let request = chat
        .gw
        .request(reqwest::Method::GET, &chat.token, &path)
        .header(HOST, host);
    json_of(request, &format!("GET {path} on {host}")).await
}

/// The `frame-src` of the console's page fetched with `Host: host`.
async fn frame_src_on(gw: &TestGateway, host: &str) -> String {
    let page = plain_client()
        .get(format!("{}/", gw.url))
        .header(HOST, host)
        .send()
        .await
        .expect("the console answers");
    assert_eq!(page.status(), 200, "the console on {host}");
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .expect("text")
        .to_owned();
    policy
        .split(';')
        .map(str::trim)
        .find_map(|directive| directive.strip_prefix("frame-src "))
        .unwrap_or_else(|| panic!("no frame-src in {policy}"))
        .to_owned()
}

/// A session whose hands (without a network) serve `index.txt` on `port` with Python.
async fn serving<'a>(gw: &'a TestGateway, device: &str, port: u16) -> Conversation<'a> {
    let mut chat = gw.conversation(device).await;
    chat.turn_ok(&format!(
        "echo served-from-the-hands > index.txt; setsid nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & echo started"
    ))
    .await;
    chat
}

/// `url` split at its token parameter: `(scheme://host:port, token)`.
fn own_port_url(url: &str) -> (String, String) {
    let (origin, token) = url
        .split_once("/?warren_preview=")
        .unwrap_or_else(|| panic!("an own port's URL, got {url}"));
    (origin.to_owned(), token.to_owned())
}

/// The port of an origin `scheme://host:port`.
fn origin_port(origin: &str) -> u16 {
    origin
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("a port in {origin}"))
}

/// Opens a preview's own-port URL as a browser would (on 127.0.0.1, `Host` as the URL
/// names it): the redirect that sets its cookie, then `index.txt` with the cookie until the
/// dev server answers. Returns the cookie (`name=value`) and the `Set-Cookie` line.
async fn open_own_port(
    client: &reqwest::Client,
    scheme: &str,
    url: &str,
    host_of_url: &str,
) -> (String, String) {
    let (origin, token) = own_port_url(url);
    let port = origin_port(&origin);
    let first = client
        .get(format!(
            "{scheme}://127.0.0.1:{port}/?warren_preview={token}"
        ))
        .header(HOST, format!("{host_of_url}:{port}"))
        .send()
        .await
        .expect("the own port answers");
    assert_eq!(
        first.status(),
        303,
        "the URL's token is exchanged for a cookie"
    );
    assert_eq!(first.headers()[LOCATION], "/");
    let set_cookie = first.headers()[SET_COOKIE]
        .to_str()
        .expect("text")
        .to_owned();
    let cookie = set_cookie
        .split(';')
        .next()
        .expect("a cookie")
        .trim()
        .to_owned();
    assert_eq!(cookie, format!("warren_preview_{port}={token}"));
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    let body = warren_test_support::eventually_async(
        "the dev server answers through the preview's own port",
        || {
            let (client, cookie) = (client.clone(), cookie.clone());
            let target = format!("{scheme}://127.0.0.1:{port}/index.txt");
            let host = format!("{host_of_url}:{port}");
            async move {
                let response = client
                    .get(&target)
                    .header(HOST, host)
                    .header("cookie", cookie)
                    .send()
                    .await
                    .ok()?;
                (response.status() == 200).then_some(())?;
                response.text().await.ok()
            }
        },
    )
    .await;
    assert_eq!(body, "served-from-the-hands\n");
    (cookie, set_cookie)
}

#[tokio::test]
async fn a_console_on_a_lan_address_gets_previews_on_ports_of_their_own() {
    let gw = in_bwrap(|args| args.hands_network = NetworkMode::None).await;
    let chat = serving(&gw, "phone-lan-preview", 8771).await;
    let console_host = format!("{LAN_ADDRESS}:{}", port_of(&gw));

    let preview = create_preview_on(&chat, &console_host, 8771).await;
    let url = preview["url"].as_str().expect("url").to_owned();
    let (origin, token) = own_port_url(&url);
    let own_port = origin_port(&origin);
    assert!(
        origin.starts_with(&format!("http://{LAN_ADDRESS}:")),
        "{url}"
    );
    assert_ne!(own_port, port_of(&gw), "never the console's origin");
    assert_eq!(token.len(), 32, "{url}");
    assert_eq!(
        frame_src_on(&gw, &console_host).await,
        format!("http://{LAN_ADDRESS}:*")
    );
    // Listed on the same host: the same URL, its port kept.
    let listed = list_previews_on(&chat, &console_host).await;
    assert_eq!(listed[0]["url"], url.as_str());

    let client = plain_client();
    let (cookie, _) = open_own_port(&client, "http", &url, LAN_ADDRESS).await;
    let target = format!("http://127.0.0.1:{own_port}/index.txt");
    let own_host = format!("{LAN_ADDRESS}:{own_port}");
    // Without the token, or with another, the port serves nothing.
    let bare = client
        .get(&target)
        .header(HOST, &own_host)
        .send()
        .await
        .expect("answers");
    assert_error(bare, 404, "PREVIEW_NOT_FOUND", "no token").await;
    let wrong = client
        .get(&target)
        .header(HOST, &own_host)
        .header(
            "cookie",
            format!("warren_preview_{own_port}={}", "x".repeat(32)),
        )
        .send()
        .await
        .expect("answers");
    assert_error(wrong, 404, "PREVIEW_NOT_FOUND", "another token").await;
    // The API is not there, and the device token is refused there.
    let api = client
        .get(format!("http://127.0.0.1:{own_port}/v1/sessions"))
        .header(HOST, &own_host)
        .header("cookie", &cookie)
        .bearer_auth(&chat.token)
        .send()
        .await
        .expect("answers");
    assert_error(api, 403, "DEVICE_TOKEN_REFUSED", "the device token").await;

    // Revoked: the port stops listening.
    assert_eq!(chat.revoke_preview(8771).await.status(), 204);
    warren_test_support::eventually_async("the revoked preview's port to close", || {
        let client = client.clone();
        let (target, host, cookie) = (target.clone(), own_host.clone(), cookie.clone());
        async move {
            client
                .get(&target)
                .header(HOST, host)
                .header("cookie", cookie)
                .send()
                .await
                .is_err()
        }
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn a_console_on_a_dns_name_gets_previews_on_its_subdomains() {
    let gw = in_bwrap(|args| args.hands_network = NetworkMode::None).await;
    let chat = serving(&gw, "phone-name-preview", 8772).await;
    let port = port_of(&gw);
    let console_host = format!("{NAME}:{port}");

    let preview = create_preview_on(&chat, &console_host, 8772).await;
    let url = preview["url"].as_str().expect("url").to_owned();
    let token = url
        .strip_prefix("http://p-")
        .and_then(|rest| rest.strip_suffix(&format!(".{NAME}:{port}/")))
        .unwrap_or_else(|| panic!("a subdomain of {console_host}, got {url}"));
    assert_eq!(token.len(), 32, "{url}");
    assert_eq!(
        frame_src_on(&gw, &console_host).await,
        format!("http://*.{NAME}:{port}")
    );
    assert_eq!(
        list_previews_on(&chat, &console_host).await[0]["url"],
        url.as_str()
    );

    // The URL's host resolved to the gateway, as the name's wildcard DNS would.
    let preview_host = format!("p-{token}.{NAME}");
    let client = reqwest::Client::builder()
        .resolve(&preview_host, gw.gateway.args.listen)
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client");
    let body =
        warren_test_support::eventually_async("the dev server answers on the subdomain", || {
            let client = client.clone();
            let target = format!("{url}index.txt");
            async move {
                let response = client.get(&target).send().await.ok()?;
                (response.status() == 200).then_some(())?;
                response.text().await.ok()
            }
        })
        .await;
    assert_eq!(body, "served-from-the-hands\n");
    gw.stop().await;
}

#[tokio::test]
async fn over_https_preview_urls_and_frame_src_say_https() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = warren_test_support::tls::TestCa::new();
    let (cert, key) = ca.write_server(dir.path(), &["127.0.0.1", &format!("*.{NAME}")]);
    let gw = in_bwrap(|args| {
        args.hands_network = NetworkMode::None;
        args.tls_cert = Some(cert);
        args.tls_key = Some(key);
    })
    .await;
    // The test's client speaks plain HTTP from 127.0.0.1, which the HTTPS port serves.
    let chat = serving(&gw, "phone-tls-preview", 8773).await;
    let port = port_of(&gw);

    let on_address = create_preview_on(&chat, &format!("{LAN_ADDRESS}:{port}"), 8773).await;
    let url = on_address["url"].as_str().expect("url").to_owned();
    assert!(url.starts_with(&format!("https://{LAN_ADDRESS}:")), "{url}");
    assert_eq!(
        frame_src_on(&gw, &format!("{LAN_ADDRESS}:{port}")).await,
        format!("https://{LAN_ADDRESS}:*")
    );
    let ca_cert = reqwest::Certificate::from_pem(ca.ca_pem().as_bytes()).expect("the CA");
    let https = reqwest::Client::builder()
        .tls_certs_only([ca_cert])
        .redirect(reqwest::redirect::Policy::none())
        .timeout(warren_test_support::WAIT)
        .build()
        .expect("a client");
    let (_, set_cookie) = open_own_port(&https, "https", &url, LAN_ADDRESS).await;
    assert!(set_cookie.contains("Secure"), "{set_cookie}");

    let on_name = create_preview_on(&chat, &format!("{NAME}:{port}"), 8773).await;
    let url = on_name["url"].as_str().expect("url");
    assert!(
        url.starts_with("https://p-") && url.ends_with(&format!(".{NAME}:{port}/")),
        "{url}"
    );
    assert_eq!(
        frame_src_on(&gw, &format!("{NAME}:{port}")).await,
        format!("https://*.{NAME}:{port}")
    );
    gw.stop().await;
}

#[tokio::test]
async fn loopback_hosts_keep_the_localhost_preview_urls() {
    let gw = TestGateway::start(args_without_agent).await;
    let chat = gw.conversation("phone-loopback-preview").await;
    let port = port_of(&gw);
    let want_source = format!("http://*.localhost:{port}");
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("box.localhost:{port}"),
    ] {
        let preview = create_preview_on(&chat, &host, 3000).await;
        let url = preview["url"].as_str().expect("url");
        assert!(
            url.starts_with("http://p-") && url.ends_with(&format!(".localhost:{port}/")),
            "{host}: {url}"
        );
        assert_eq!(frame_src_on(&gw, &host).await, want_source, "{host}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn preview_base_url_wins_over_the_host() {
    let gw = TestGateway::start(|data| {
        let mut args = args_without_agent(data);
        args.preview_base_url = Some("https://{token}.preview.example.com".into());
        args
    })
    .await;
    let chat = gw.conversation("phone-base-url-preview").await;
    let port = port_of(&gw);
    for host in [format!("{LAN_ADDRESS}:{port}"), format!("{NAME}:{port}")] {
        let preview = create_preview_on(&chat, &host, 3000).await;
        let url = preview["url"].as_str().expect("url");
        assert!(
            url.starts_with("https://") && url.ends_with(".preview.example.com/"),
            "{host}: {url}"
        );
        assert_eq!(
            frame_src_on(&gw, &host).await,
            "https://*.preview.example.com",
            "{host}"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_spoofed_host_naming_an_unknown_preview_is_404_never_the_api() {
    let gw = TestGateway::start(args_without_agent).await;
    let chat = gw.conversation("phone-spoofed-preview").await;
    let port = port_of(&gw);
    let unknown = "0123456789abcdefghijklmnopqrstuv";
    let client = plain_client();
    for host in [
        format!("p-{unknown}.{NAME}:{port}"),
        format!("p-{unknown}.localhost:{port}"),
        format!("p-{unknown}.{LAN_ADDRESS}:{port}"),
    ] {
        for path in ["/v1/sessions", "/", "/healthz"] {
            let answer = client
                .get(format!("{}{path}", gw.url))
                .header(HOST, &host)
                .bearer_auth(&chat.token)
                .send()
                .await
                .expect("answers");
            assert_error(answer, 404, "PREVIEW_NOT_FOUND", &format!("{host}{path}")).await;
        }
    }
    // The console's own host still reaches the API.
    let sessions = client
        .get(format!("{}/v1/sessions", gw.url))
        .header(HOST, format!("{NAME}:{port}"))
        .bearer_auth(&chat.token)
        .send()
        .await
        .expect("answers");
    assert_eq!(sessions.status(), 200);
    gw.stop().await;
}
