//! Devices and credentials through the API: first-use binding, 409 without the token, admin
//! reset, foreign sessions answered 404, and tokens never written to disk or logs.

use reqwest::Method;
use serde_json::Value;

use super::helpers::{LogBuffer, TestGateway, args_without_agent, stored_rows_keep_none_of};

/// `GET /v1{path}` with `authorization` as the `Authorization` header.
async fn get_with_authorization(
    gw: &TestGateway,
    path: &str,
    authorization: String,
) -> reqwest::Response {
    gw.http
        .get(format!("{}/v1{path}", gw.url))
        .header("Authorization", authorization)
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn registering_a_bound_device_without_its_token_is_409() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let again = gw.registration("phone-0001").send().await.expect("request");
    assert_eq!(again.status(), 409);
    let body: Value = again.json().await.expect("body");
    assert_eq!(body["code"], "DEVICE_ALREADY_BOUND");

    let with_token = gw
        .registration("phone-0001")
        .bearer_auth(&token)
        .send()
        .await
        .expect("request");
    assert_eq!(
        with_token.status(),
        201,
        "the holder of the token may register again"
    );
    gw.stop().await;
}

#[tokio::test]
async fn registration_needs_the_app_key_and_a_valid_device_id() {
    let gw = TestGateway::start(args_without_agent).await;
    let cases = [
        (Some("wrong-key"), "phone-0001", 401, "INVALID_APP_KEY"),
        (None, "phone-0001", 401, "INVALID_APP_KEY"),
        (Some("test-app-key"), "short", 400, "INVALID_DEVICE_ID"),
        (Some("test-app-key"), "bad/../id", 400, "INVALID_DEVICE_ID"),
    ];
    for (key, device_id, status, code) in cases {
        let mut request = gw
            .http
            .post(format!("{}/v1/devices", gw.url))
            .json(&serde_json::json!({"device_id": device_id}));
        if let Some(key) = key {
            request = request.header("X-App-Key", key);
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status(), status, "{key:?} {device_id}");
        let body: Value = response.json().await.expect("body");
        assert_eq!(body["code"], code, "{key:?} {device_id}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn another_device_gets_404_on_every_session_route() {
    let gw = TestGateway::start(args_without_agent).await;
    let owner = gw.register("owner-0001").await;
    let other = gw.register("other-0001").await;
    let session = gw.create_session(&owner).await;
    let base = format!("{}/v1/sessions/{session}", gw.url);
    let missing = format!(
        "{}/v1/sessions/00000000-0000-0000-0000-000000000000",
        gw.url
    );
    for target in [&base, &missing] {
        let requests = [
            gw.http.get(target.to_string()),
            gw.http.delete(target.to_string()),
            gw.http
                .post(format!("{target}/messages"))
                .json(&serde_json::json!({"text": "echo x"})),
            gw.http.post(format!("{target}/cancel")),
            gw.http
                .post(format!("{target}/permissions/perm-1"))
                .json(&serde_json::json!({"option_id": "allow"})),
            gw.http.get(format!("{target}/events")),
        ];
        for request in requests {
            let response = request.bearer_auth(&other).send().await.expect("request");
            let url = response.url().to_string();
            assert_eq!(response.status(), 404, "{url}");
            let body: Value = response.json().await.expect("body");
            assert_eq!(body["code"], "SESSION_NOT_FOUND", "{url}");
        }
    }
    let listed = gw.get_json(&other, "/sessions").await;
    assert_eq!(listed["sessions"], serde_json::json!([]));
    let owner_view = gw.get(&owner, &format!("/sessions/{session}")).await;
    assert_eq!(owner_view.status(), 200, "the owner still sees it");
    let no_token = gw.http.get(&base).send().await.expect("get");
    assert_eq!(no_token.status(), 401);
    gw.stop().await;
}

#[tokio::test]
async fn admin_reset_revokes_tokens_but_keeps_sessions() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("tablet-0001").await;
    let session = gw.create_session(&token).await;
    let admin = "test-admin-token";

    let listed = gw.get_json(admin, "/admin/devices").await;
    assert_eq!(listed[0]["device_id"], "tablet-0001");
    assert_eq!(listed[0]["bound"], true);
    assert_eq!(listed[0]["n_sessions"], 1);
    assert!(!listed.to_string().contains(&token));

    let device_token_as_admin = gw.get(&token, "/admin/devices").await;
    assert_eq!(device_token_as_admin.status(), 401);
    let admin_reads_no_session = gw.get(admin, &format!("/sessions/{session}")).await;
    assert_eq!(admin_reads_no_session.status(), 401);

    let reset = gw
        .send(Method::POST, admin, "/admin/devices/tablet-0001/reset")
        .await;
    assert_eq!(reset.status(), 204);
    let revoked = gw.get(&token, "/sessions").await;
    assert_eq!(revoked.status(), 401);
    let body: Value = revoked.json().await.expect("error body");
    assert_eq!(body["code"], "UNAUTHORIZED");
    let unknown = gw
        .send(Method::POST, admin, "/admin/devices/nobody-0001/reset")
        .await;
    assert_eq!(
        unknown.status(),
        404,
        "resetting a device that never registered"
    );
    let body: Value = unknown.json().await.expect("error body");
    assert_eq!(body["code"], "DEVICE_NOT_FOUND");

    let new_token = gw.register("tablet-0001").await;
    let kept = gw.get(&new_token, &format!("/sessions/{session}")).await;
    assert_eq!(kept.status(), 200, "sessions survive a reset");
    gw.stop().await;
}

#[tokio::test]
async fn admin_routes_are_absent_without_an_admin_token() {
    let gw = TestGateway::start_changed(args_without_agent, |args| args.admin_token = None).await;
    let response = gw.get("anything", "/admin/devices").await;
    assert_eq!(response.status(), 404);
    gw.stop().await;
}

#[tokio::test]
async fn tokens_never_reach_the_data_dir_or_the_logs() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("laptop-0001").await;
    let session = gw.create_session(&token).await;
    // Use the token every way a client can: header, query parameter, and a failed attempt.
    gw.http
        .get(format!(
            "{}/v1/sessions/{session}?access_token={token}",
            gw.url
        ))
        .send()
        .await
        .expect("query token");
    gw.http
        .get(format!("{}/v1/sessions", gw.url))
        .bearer_auth(format!("{token}x"))
        .send()
        .await
        .expect("bad token");
    let _ = gw.post_message(&token, &session, "echo secret-check").await;
    let re = gw
        .registration("laptop-0001")
        .send()
        .await
        .expect("re-register");
    assert_eq!(re.status(), 409);
    let data = gw.data.clone();
    let _data_dir = gw.stop().await;

    let files = super::helpers::files_under(&data);
    for path in &files {
        let bytes = std::fs::read(path).expect("read file");
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&token),
            "token found in {}",
            path.display()
        );
    }
    if !stored_rows_keep_none_of(&data, "laptop-0001", &[&token]) {
        assert!(
            files.len() >= 3,
            "device, meta and events files were checked"
        );
    }
    let logged =
        String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).to_string();
    assert!(
        logged.contains("device registered"),
        "the log capture works"
    );
    assert!(!logged.contains(&token), "token found in the logs");
    assert!(
        !logged.contains(&token[3..20]),
        "part of the token found in the logs"
    );
}

#[tokio::test]
async fn lower_case_bearer_scheme_is_accepted() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    for scheme in ["bearer", "BEARER", "Bearer", "bEaReR"] {
        let path = format!("/sessions/{session}");
        let response = get_with_authorization(&gw, &path, format!("{scheme} {token}")).await;
        assert_eq!(response.status(), 200, "scheme {scheme:?}");
    }
    // Re-registering a bound device reads the same header.
    let again = gw
        .registration("phone-0001")
        .header("Authorization", format!("bearer {token}"))
        .send()
        .await
        .expect("request");
    assert_eq!(
        again.status(),
        201,
        "re-registration with a lower-case scheme"
    );
    let response = get_with_authorization(&gw, "/sessions", format!("Basic {token}")).await;
    assert_eq!(response.status(), 401, "another scheme is refused");
    gw.stop().await;
}
