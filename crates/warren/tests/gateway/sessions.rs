//! Sessions through the API: lifecycle, body validation, quotas reserved atomically.

use reqwest::Method;
use serde_json::Value;

use super::helpers::{TestGateway, args_without_agent, assert_error, created_and_refused, json_of};

#[tokio::test]
async fn session_is_created_listed_read_and_deleted() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let creation = gw
        .request(Method::POST, &token, "/sessions")
        .json(&serde_json::json!({"title": "fix the build"}));
    let created = json_of(creation, "create").await;
    let id = created["id"].as_str().expect("id").to_string();
    for field in [
        "id",
        "title",
        "created_at",
        "status",
        "turn",
        "last_seq",
        "brain",
        "hands",
    ] {
        assert!(
            created.get(field).is_some(),
            "session has {field}: {created}"
        );
    }
    assert_eq!(created["title"], "fix the build");
    assert_eq!(created["status"], "idle");
    assert_eq!(created["turn"], 0);
    assert_eq!(created["hands"], "none", "hands start lazily");

    let untitled = gw
        .request(Method::POST, &token, "/sessions")
        .send()
        .await
        .expect("empty body");
    assert_eq!(untitled.status(), 201, "the body is optional");

    let listed = gw.get_json(&token, "/sessions").await;
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(2));
    let session_dir = gw.data.join("sessions").join(&id);
    assert!(session_dir.join("workspace").is_dir());
    if !super::helpers::on_postgres() {
        assert!(session_dir.join("meta.json").exists());
    }

    let deleted = gw.delete(&token, &format!("/sessions/{id}")).await;
    assert_eq!(deleted.status(), 204);
    let gone = gw.get(&token, &format!("/sessions/{id}")).await;
    assert_eq!(gone.status(), 404);
    assert!(!session_dir.exists(), "session data removed");
    gw.stop().await;
}

#[tokio::test]
async fn bad_bodies_get_400_with_a_code() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let messages = format!("/sessions/{session}/messages");
    let events = format!("/sessions/{session}/events");
    let cases = [
        gw.request(Method::POST, &token, "/sessions")
            .body("{not json")
            .header("content-type", "application/json"),
        gw.request(Method::POST, &token, &messages)
            .json(&serde_json::json!({"txt": "x"})),
        gw.request(Method::POST, &token, &messages).body("plain"),
        gw.request(Method::POST, &token, &messages)
            .json(&serde_json::json!({"text": ""})),
        gw.request(Method::POST, &token, &messages)
            .json(&serde_json::json!({"text": " \n\t"})),
        gw.request(Method::POST, &token, "/sessions")
            .json(&serde_json::json!({"title": "t".repeat(201)})),
        gw.request(Method::GET, &token, &events)
            .header("Last-Event-ID", "abc"),
        gw.request(Method::GET, &token, &format!("{events}?after=abc")),
        gw.request(Method::GET, &token, &format!("{events}?after=-1")),
        // Positions past the last event (the log is empty): following them would skip events.
        gw.request(Method::GET, &token, &events)
            .header("Last-Event-ID", "1"),
        gw.request(Method::GET, &token, &format!("{events}?after=7")),
        gw.request(Method::GET, &token, &format!("{events}?after={}", u64::MAX)),
    ];
    for request in cases {
        let response = request.send().await.expect("request");
        let url = response.url().to_string();
        let body = assert_error(response, 400, "INVALID_REQUEST_BODY", &url).await;
        assert!(body["message"].is_string(), "{url}: {body}");
    }
    let listed = gw.get_json(&token, "/sessions").await;
    let sessions = listed["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "a refused creation makes nothing");
    let longest = gw
        .request(Method::POST, &token, "/sessions")
        .json(&serde_json::json!({"title": "é".repeat(200)}))
        .send()
        .await
        .expect("create");
    assert_eq!(longest.status(), 201, "200 characters are accepted");
    let from_the_end = gw
        .request(Method::GET, &token, &format!("{events}?after=0"))
        .send()
        .await
        .expect("request");
    assert_eq!(
        from_the_end.status(),
        200,
        "the last seq is a valid position"
    );
    gw.stop().await;
}

#[tokio::test]
async fn unknown_routes_methods_and_undecodable_paths_get_an_error_body() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let cases = [
        (Method::GET, "/nothing-here".to_string(), 404, "NOT_FOUND"),
        (
            Method::PUT,
            "/sessions".to_string(),
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (
            Method::GET,
            format!("/sessions/{session}/messages"),
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (
            Method::GET,
            "/sessions/%FF%FE".to_string(),
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            Method::PUT,
            format!("/sessions/{session}"),
            405,
            "METHOD_NOT_ALLOWED",
        ),
    ];
    for (method, path, status, code) in cases {
        let response = gw
            .request(method.clone(), &token, &path)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), status, "{method} {path}");
        let body: Value = response.json().await.expect("error body");
        assert_eq!(body["code"], code, "{method} {path}: {body}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn bodies_over_the_size_limit_get_413() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    // axum's default limit is 2 MiB.
    let huge = "x".repeat((2 << 20) + 1024);
    let cases = [
        gw.request(
            Method::POST,
            &token,
            &format!("/sessions/{session}/messages"),
        )
        .json(&serde_json::json!({ "text": huge })),
        gw.request(Method::POST, &token, "/sessions")
            .json(&serde_json::json!({ "title": huge })),
    ];
    for request in cases {
        let response = request.send().await.expect("request");
        let url = response.url().to_string();
        assert_error(response, 413, "BODY_TOO_LARGE", &url).await;
    }
    let info = gw.session_info(&token, &session).await;
    assert_eq!(info["turn"], 0, "no turn started");
    gw.stop().await;
}

#[tokio::test]
async fn a_message_the_event_log_refuses_is_500_and_holds_no_brain_slot() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    // A log that takes no more appends, as after a disk failure.
    gw.session_of("phone-0001", &session).log.close().await;
    let refused = gw.post_message(&token, &session, "echo x").await;
    let body = assert_error(refused, 500, "RUNTIME_ERROR", "a refused append").await;
    assert_eq!(body["message"], "internal error", "internals are not shown");
    let info = gw.session_info(&token, &session).await;
    assert_eq!(
        (info["turn"].clone(), info["status"].clone()),
        (0.into(), "idle".into()),
        "no turn was started"
    );
    assert_eq!(
        gw.gateway.engine.sessions.admission().n_brains(),
        0,
        "the brain slot reserved for the message was given back"
    );
    gw.stop().await;
}

#[tokio::test]
async fn fifty_parallel_creations_never_exceed_the_quota() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("busy-device").await;
    let requests = (0..50).map(|_| gw.request(Method::POST, &token, "/sessions").send());
    let responses = futures_util::future::join_all(requests).await;
    assert_eq!(created_and_refused(responses).await, (20, 30));
    let listed = gw.get_json(&token, "/sessions").await;
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(20));
    gw.stop().await;
}

#[tokio::test]
async fn health_and_metrics_answer() {
    let gw = TestGateway::start(args_without_agent).await;
    gw.assert_healthy("/healthz").await;
    let metrics = gw.get_plain("/metrics").await.text().await.expect("text");
    for family in [
        "# TYPE warren_gateway_sessions gauge",
        "warren_gateway_events_appended_total",
        "# TYPE warren_gateway_pushes_dropped_total counter",
    ] {
        assert!(metrics.contains(family), "{metrics}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_message_whose_agent_cannot_start_ends_its_turn_with_error() {
    let gw = TestGateway::start(args_without_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    let seen = chat.turn("echo hi").await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"user_message"));
    assert!(kinds.contains(&"error"), "{kinds:?}");
    assert_eq!(
        seen.last().map(|e| e.data["stop_reason"].clone()),
        Some("error".into())
    );
    let again = chat.send("echo again").await;
    assert_eq!(again.status(), 202, "the conversation stays usable");
    gw.stop().await;
}

#[tokio::test]
async fn a_session_is_renamed_and_its_new_title_is_stored() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-rename-01").await;
    let session = gw.create_session(&token).await;
    let path = format!("/sessions/{session}");
    let rename =
        |token: String, body: Value| gw.request(Method::PATCH, &token, &path).json(&body).send();
    let renamed = rename(
        token.clone(),
        serde_json::json!({"title": "  fix the build  "}),
    )
    .await
    .expect("answers");
    assert_eq!(renamed.status(), 200);
    let info: serde_json::Value = renamed.json().await.expect("json");
    assert_eq!(info["title"], "fix the build", "trimmed");
    assert_eq!(
        gw.session_info(&token, &session).await["title"],
        "fix the build"
    );
    for (body, status, code) in [
        (
            serde_json::json!({"title": ""}),
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            serde_json::json!({"title": "   "}),
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            serde_json::json!({"title": "t".repeat(201)}),
            400,
            "INVALID_REQUEST_BODY",
        ),
        (serde_json::json!({}), 400, "INVALID_REQUEST_BODY"),
        (serde_json::json!({"title": 7}), 400, "INVALID_REQUEST_BODY"),
    ] {
        let answer = rename(token.clone(), body.clone()).await.expect("answers");
        assert_eq!(answer.status(), status, "{body}");
        let error: serde_json::Value = answer.json().await.expect("json");
        assert_eq!(error["code"], code, "{body}");
    }
    let other = gw.register("phone-rename-02").await;
    let refused = rename(other, serde_json::json!({"title": "mine now"}))
        .await
        .expect("answers");
    assert_eq!(refused.status(), 404);
    let error: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(error["code"], "SESSION_NOT_FOUND");

    // Stored: the next gateway on the same data (and store) loads the new title.
    let data = gw.data.clone();
    let _dir = gw.stop().await;
    let again = TestGateway::start_in(args_without_agent(data)).await;
    let info = again.session_info(&token, &session).await;
    assert_eq!(info["title"], "fix the build", "{info}");
    again.stop().await;
}
