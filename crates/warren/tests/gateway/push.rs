//! Web Push (phone.md "Push") against a local push service as strict as the real ones
//! (`warren_test_support::push_service`): it checks each push's TTL, encoding, size and VAPID
//! token (signed by the key `GET /v1/push/key` gives, for its own origin) and decrypts it with
//! the subscription's keys, which it made. The gateways here allow its endpoints with
//! `--push-allow-endpoint` (pushes otherwise go only to public `https://` hosts).

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use warren_protocol::gateway::EventBody;
use warren_test_support::push_service::{PushService, Received};

use super::helpers::{
    TestGateway, args_with_shell_agent, args_without_agent, assert_error, stop_reason,
};

/// How long a push may take to arrive (the sender is idle otherwise: it comes at once).
const PUSH_WAIT: Duration = Duration::from_secs(20);

/// A gateway (its arguments from `base`) whose pushes may go to `service`, and `change`d.
async fn gateway_for(
    service: &PushService,
    base: fn(std::path::PathBuf) -> warren_gateway::GatewayArgs,
    change: impl FnOnce(&mut warren_gateway::GatewayArgs),
) -> TestGateway {
    let prefix = service.endpoint_prefix();
    TestGateway::start_changed(base, move |args| {
        args.push_allow_endpoint = vec![prefix];
        change(args);
    })
    .await
}

async fn push_key(gw: &TestGateway) -> String {
    let answer = gw.get_plain("/v1/push/key").await;
    assert_eq!(answer.status(), 200, "the key needs no token");
    let body: Value = answer.json().await.expect("JSON");
    body["public_key"].as_str().expect("public_key").to_owned()
}

/// `POST /v1/push/subscriptions` with `body` as `token`'s device.
async fn subscribe(gw: &TestGateway, token: &str, body: &Value) -> reqwest::Response {
    gw.request(Method::POST, token, "/push/subscriptions")
        .json(body)
        .send()
        .await
        .expect("POST /v1/push/subscriptions")
}

/// A subscription of `service` for the gateway's key, made by `token`'s device; its id.
async fn subscribed(gw: &TestGateway, service: &PushService, token: &str) -> (String, Value) {
    let subscription = service.subscribe(&push_key(gw).await);
    let answer = subscribe(gw, token, &subscription).await;
    assert_eq!(answer.status(), 201, "subscribed");
    let body: Value = answer.json().await.expect("JSON");
    let id = body["id"].as_str().expect("an id").to_owned();
    (id, subscription)
}

async fn listed(gw: &TestGateway, token: &str) -> Vec<Value> {
    let list = gw.get_json(token, "/push/subscriptions").await;
    list.as_array().expect("a list").clone()
}

/// Appends a `hands` event entering `lost` to `session`'s log, as the hands would.
fn hands_lost(gw: &TestGateway, session: &str, error: &str) -> u64 {
    let lost = EventBody::Hands {
        state: "lost".into(),
        elapsed_ms: None,
        isolation: Some("bwrap".into()),
        reset: None,
        snapshot_at: None,
        snapshot_bytes: None,
        error: Some(error.into()),
        message: None,
    };
    gw.session(session)
        .log
        .append(None, lost)
        .expect("appended")
        .seq
}

fn of_kind(received: &[Received], kind: &str) -> Vec<Received> {
    received
        .iter()
        .filter(|push| push.payload["kind"] == kind)
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_vapid_key_and_the_subscriptions_outlive_a_restart() {
    let service = PushService::start().await;
    let gw = gateway_for(&service, args_without_agent, |_| {}).await;
    let key = push_key(&gw).await;
    let point = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        key.as_bytes(),
    )
    .expect("base64url without padding");
    assert_eq!(
        (point.len(), point[0]),
        (65, 0x04),
        "an uncompressed P-256 point"
    );
    let token = gw.register("phone-push-01").await;
    let (id, _) = subscribed(&gw, &service, &token).await;
    let mut args = args_without_agent(gw.data.clone());
    args.push_allow_endpoint = vec![service.endpoint_prefix()];
    let data_dir = gw.stop().await;
    let again = TestGateway::start_in(args).await;
    assert_eq!(push_key(&again).await, key, "the same key after a restart");
    let ids: Vec<Value> = listed(&again, &token)
        .await
        .iter()
        .map(|s| s["id"].clone())
        .collect();
    assert_eq!(ids, [json!(id)], "the subscription is kept with the device");
    again.stop().await;
    drop(data_dir);
}

#[tokio::test]
async fn subscriptions_are_the_devices_own_and_bad_ones_are_refused_with_a_code() {
    let service = PushService::start().await;
    let gw = gateway_for(&service, args_without_agent, |_| {}).await;
    let token = gw.register("phone-push-02").await;
    let other = gw.register("phone-push-03").await;
    let key = push_key(&gw).await;
    let subscription = service.subscribe(&key);
    let first = subscribe(&gw, &token, &subscription).await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.expect("JSON");
    let id = first["id"].as_str().expect("id").to_owned();
    assert_eq!(first["endpoint"], subscription["endpoint"]);

    // The same endpoint again (new keys, as after the browser renewed them): the same id.
    let mut renewed = service.subscribe(&key);
    renewed["endpoint"] = subscription["endpoint"].clone();
    let again = subscribe(&gw, &token, &renewed).await;
    assert_eq!(again.status(), 201);
    let again: Value = again.json().await.expect("JSON");
    assert_eq!(again["id"], id.as_str(), "one subscription per endpoint");
    let list = listed(&gw, &token).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["endpoint"], subscription["endpoint"]);
    assert!(list[0]["created_at"].is_string() && list[0].get("keys").is_none());
    assert!(
        listed(&gw, &other).await.is_empty(),
        "another device's list"
    );

    let path = format!("/push/subscriptions/{id}");
    let foreign = gw.delete(&other, &path).await;
    assert_error(
        foreign,
        404,
        "PUSH_SUBSCRIPTION_NOT_FOUND",
        "another device's",
    )
    .await;
    let unknown = gw.delete(&token, "/push/subscriptions/ps_nothing").await;
    assert_error(unknown, 404, "PUSH_SUBSCRIPTION_NOT_FOUND", "an unknown id").await;
    let anonymous = gw
        .http
        .post(format!("{}/v1/push/subscriptions", gw.url))
        .json(&subscription)
        .send()
        .await
        .expect("sent");
    assert_error(anonymous, 401, "UNAUTHORIZED", "no token").await;

    // Table: a bad subscription → its status and code.
    let with = |field: &str, value: Value| {
        let mut body = service.subscribe(&key);
        match field {
            "endpoint" => body["endpoint"] = value,
            key => body["keys"][key] = value,
        }
        body
    };
    let point = subscription["keys"]["p256dh"].as_str().expect("p256dh");
    // The same X with the last bit of Y flipped: never on the curve (a point has Y and p - Y,
    // and p - Y differs from Y in more than its last bit).
    let off_curve = {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut bytes = engine.decode(point).expect("p256dh is base64url");
        *bytes.last_mut().expect("a point") ^= 1;
        engine.encode(bytes)
    };
    let cases = [
        (
            with("endpoint", json!("https://push.example.com/x")),
            "INVALID_PUSH_SUBSCRIPTION",
            "an endpoint not allowed",
        ),
        (
            with("endpoint", json!(format!("{}/other/1", service.origin()))),
            "INVALID_PUSH_SUBSCRIPTION",
            "outside the allowed path",
        ),
        (
            with("endpoint", json!("not a url")),
            "INVALID_PUSH_SUBSCRIPTION",
            "not a URL",
        ),
        (
            with("p256dh", json!(&point[..40])),
            "INVALID_PUSH_SUBSCRIPTION",
            "a short p256dh",
        ),
        (
            with("p256dh", json!(off_curve)),
            "INVALID_PUSH_SUBSCRIPTION",
            "a point off the curve",
        ),
        (
            with("auth", json!("AAAAAAAAAAAAAAAAAAAA")),
            "INVALID_PUSH_SUBSCRIPTION",
            "auth of 15 bytes",
        ),
        (
            with("auth", json!("!!")),
            "INVALID_PUSH_SUBSCRIPTION",
            "auth not base64url",
        ),
        (
            json!({"endpoint": subscription["endpoint"]}),
            "INVALID_REQUEST_BODY",
            "no keys",
        ),
        (
            json!({"endpoint": 7, "keys": subscription["keys"]}),
            "INVALID_REQUEST_BODY",
            "a number for an endpoint",
        ),
        (
            json!([subscription]),
            "INVALID_REQUEST_BODY",
            "not an object",
        ),
    ];
    for (body, code, what) in cases {
        assert_error(subscribe(&gw, &token, &body).await, 400, code, what).await;
    }
    assert_eq!(listed(&gw, &token).await.len(), 1, "nothing bad was kept");

    assert_eq!(gw.delete(&token, &path).await.status(), 204);
    assert!(listed(&gw, &token).await.is_empty());
    let twice = gw.delete(&token, &path).await;
    assert_error(twice, 404, "PUSH_SUBSCRIPTION_NOT_FOUND", "deleted twice").await;

    // A device keeps at most 16; one it has may still be renewed.
    let mut last = Value::Null;
    for _ in 0..16 {
        last = service.subscribe(&key);
        assert_eq!(subscribe(&gw, &token, &last).await.status(), 201);
    }
    let over = subscribe(&gw, &token, &service.subscribe(&key)).await;
    assert_error(over, 409, "TOO_MANY_PUSH_SUBSCRIPTIONS", "a 17th").await;
    assert_eq!(subscribe(&gw, &token, &last).await.status(), 201, "renewed");
    gw.stop().await;
}

#[tokio::test]
async fn a_permission_request_is_pushed_decrypted_and_its_allow_action_answers_it() {
    let service = PushService::start().await;
    let gw = gateway_for(&service, args_with_shell_agent, |_| {}).await;
    let mut chat = gw.conversation("phone-push-04").await;
    let (_, subscription) = subscribed(&gw, &service, &chat.token).await;
    chat.turn_ok("touch doomed.txt").await;
    let request = chat.permission_request_for("rm doomed.txt").await;
    let request_id = request.data["request_id"].as_str().expect("request id");
    let push = service
        .wait_for("of the permission request", PUSH_WAIT, |push| {
            push.payload["kind"] == "permission_request"
        })
        .await;
    assert_eq!(
        push.endpoint,
        subscription["endpoint"].as_str().expect("endpoint")
    );
    let payload = &push.payload;
    assert_eq!(payload["session"], chat.session.as_str());
    assert_eq!(payload["title"], "test", "the session's title");
    assert_eq!(payload["request"], request_id);
    assert_eq!(
        payload["url"],
        format!("/#/s/{}/r/{request_id}", chat.session).as_str()
    );
    let text = payload["text"].as_str().expect("text");
    assert!(
        text.starts_with("The agent asks to run: ") && text.contains("rm"),
        "{text}"
    );
    let options = request.data["options"].as_array().expect("options");
    let expected: Vec<Value> = options
        .iter()
        .map(|option| json!({"id": option["optionId"], "title": option["name"]}))
        .collect();
    assert_eq!(
        payload["actions"],
        json!(expected),
        "the options, as actions"
    );
    assert_eq!(push.header("urgency"), Some("high"));
    assert_eq!(push.header("ttl"), Some("60"));
    assert_eq!(push.header("content-encoding"), Some("aes128gcm"));
    assert_eq!(
        push.vapid_key,
        push_key(&gw).await,
        "signed with the gateway's key"
    );
    assert_eq!(push.claims["aud"], service.origin());

    // The allow action, as the service worker sends it: its id to the permissions route.
    let allow = options
        .iter()
        .find(|option| option["kind"] == "allow_once")
        .expect("an allow option");
    let action = payload["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .find(|action| action["id"] == allow["optionId"])
        .expect("the allow action");
    let answer = gw
        .request(
            Method::POST,
            &chat.token,
            &format!(
                "/sessions/{}/permissions/{}",
                payload["session"].as_str().expect("session"),
                payload["request"].as_str().expect("request")
            ),
        )
        .json(&json!({"option_id": action["id"]}))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 204);
    let seen = chat.until_turn_end("rm").await;
    assert_eq!(stop_reason(&seen), "end_turn");
    assert!(!chat.workspace().join("doomed.txt").exists(), "rm ran");
    assert!(service.refusals().is_empty(), "{:?}", service.refusals());
    gw.stop().await;
}

#[tokio::test]
async fn a_subscription_the_push_service_says_is_gone_is_removed() {
    let service = PushService::start().await;
    let gw = gateway_for(&service, args_without_agent, |_| {}).await;
    let token = gw.register("phone-push-05").await;
    let session = gw.create_session(&token).await;
    let (gone_id, gone) = subscribed(&gw, &service, &token).await;
    let (kept_id, kept) = subscribed(&gw, &service, &token).await;
    service.answer_gone(gone["endpoint"].as_str().expect("endpoint"));
    hands_lost(&gw, &session, "the sandbox hit its memory limit");
    let push = service
        .wait_for("to the live subscription", PUSH_WAIT, |push| {
            push.payload["kind"] == "hands_lost"
        })
        .await;
    assert_eq!(push.endpoint, kept["endpoint"].as_str().expect("endpoint"));
    assert_eq!(
        push.payload["text"],
        "The sandbox was lost: the sandbox hit its memory limit"
    );
    assert_eq!(push.payload["url"], format!("/#/s/{session}").as_str());
    assert_eq!(
        (push.header("ttl"), push.header("urgency")),
        (Some("3600"), Some("normal"))
    );
    let deadline = Instant::now() + PUSH_WAIT;
    loop {
        let ids: Vec<Value> = listed(&gw, &token)
            .await
            .iter()
            .map(|s| s["id"].clone())
            .collect();
        if ids == [json!(kept_id)] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gone subscription {gone_id} is removed, {kept_id} kept: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_push_service_that_does_not_answer_delays_no_event() {
    let service = PushService::start().await;
    // Every push is held far longer than the stream is given.
    service.set_delay(Duration::from_secs(40));
    let gw = gateway_for(&service, args_with_shell_agent, |_| {}).await;
    let mut chat = gw.conversation("phone-push-06").await;
    subscribed(&gw, &service, &chat.token).await;
    let started = Instant::now();
    let n_lost = 40;
    for n in 0..n_lost {
        hands_lost(&gw, &chat.session, &format!("loss {n}"));
    }
    let seen = chat
        .until("every hands event", |e| {
            e.event == "hands" && e.data["error"] == format!("loss {}", n_lost - 1).as_str()
        })
        .await;
    assert_eq!(seen.iter().filter(|e| e.event == "hands").count(), n_lost);
    let seen = chat.turn_ok("echo still-here").await;
    assert!(super::helpers::agent_text(&seen).contains("still-here"));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the events and a turn came while the push service held every push: {:?}",
        started.elapsed()
    );
    service
        .wait_for("held by the service", PUSH_WAIT, |push| {
            push.payload["kind"] == "hands_lost"
        })
        .await;
    gw.stop().await;
}

#[tokio::test]
async fn only_a_turn_longer_than_push_after_is_pushed_when_it_ends() {
    let service = PushService::start().await;
    let gw = gateway_for(&service, args_with_shell_agent, |args| {
        args.push_after = Duration::from_secs(2);
    })
    .await;
    let mut chat = gw.conversation("phone-push-07").await;
    subscribed(&gw, &service, &chat.token).await;
    chat.turn_ok("echo quick").await;
    chat.turn_ok("sleep 3; echo slow").await;
    let push = service
        .wait_for("of the long turn's end", PUSH_WAIT, |push| {
            push.payload["kind"] == "turn_end"
        })
        .await;
    let text = push.payload["text"].as_str().expect("text");
    let seconds: u64 = text
        .strip_prefix("The agent finished after ")
        .and_then(|rest| rest.strip_suffix(" s."))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("how long the turn ran: {text}"));
    assert!((3..30).contains(&seconds), "{text}");
    assert_eq!(
        push.payload["url"],
        format!("/#/s/{}", chat.session).as_str()
    );
    // The short turn ended first: had it been pushed, its push would have come before.
    let ends = of_kind(&service.received(), "turn_end");
    assert_eq!(ends.len(), 1, "only the long turn is pushed: {ends:?}");
    gw.stop().await;
}
