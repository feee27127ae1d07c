//! One person, several devices (phone.md "Pairing"): a pairing code registers a second browser
//! under the same owner, once and for five minutes; the owner's devices are listed and revoked;
//! every bad code or id gets its status and code.

use reqwest::Method;
use serde_json::{Value, json};

use super::helpers::{TestGateway, args_without_agent, assert_error, file_store_only, json_of};

/// `POST /v1/devices/pair` with `token`: the answer's body.
async fn mint(gw: &TestGateway, token: &str) -> Value {
    let response = gw.send(Method::POST, token, "/devices/pair").await;
    assert_eq!(response.status(), 201, "minting a pairing code");
    response.json().await.expect("a JSON body")
}

/// `POST /v1/devices` with a pairing code and no app key.
async fn join(gw: &TestGateway, device_id: &str, code: &str) -> reqwest::Response {
    gw.http
        .post(format!("{}/v1/devices", gw.url))
        .json(&json!({"device_id": device_id, "pair_code": code}))
        .send()
        .await
        .expect("a pairing registration")
}

async fn session_ids(gw: &TestGateway, token: &str) -> Vec<String> {
    let list = json_of(gw.request(Method::GET, token, "/sessions"), "sessions").await;
    let mut ids: Vec<String> = list["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("sessions in {list}"))
        .iter()
        .map(|s| s["id"].as_str().expect("an id").to_owned())
        .collect();
    ids.sort();
    ids
}

async fn device_ids(gw: &TestGateway, token: &str) -> Vec<(String, bool)> {
    let list = json_of(gw.request(Method::GET, token, "/devices"), "devices").await;
    list["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("devices in {list}"))
        .iter()
        .map(|d| {
            (
                d["device_id"].as_str().expect("an id").to_owned(),
                d["current"].as_bool().expect("current"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_paired_device_drives_the_same_sessions_and_its_code_works_once() {
    let gw = TestGateway::start(args_without_agent).await;
    let phone = gw.register("phone-0001").await;
    let session = gw.create_session(&phone).await;

    let code = mint(&gw, &phone).await;
    let shown = code["code"].as_str().expect("code");
    assert!(
        shown.len() == 9 && shown.as_bytes()[4] == b'-',
        "ABCD-EFGH: {shown}"
    );
    assert_eq!(code["url"], format!("{}/#/pair/{shown}", gw.url));
    let svg = code["qr_svg"].as_str().expect("qr_svg");
    assert!(svg.contains("<svg") && svg.contains("</svg>"), "{svg}");
    let expires = chrono::DateTime::parse_from_rfc3339(code["expires_at"].as_str().expect("at"))
        .expect("RFC 3339");
    let left = expires.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        left > chrono::Duration::minutes(4) && left <= chrono::Duration::minutes(5),
        "{left}"
    );

    // Typed loosely on the laptop: lower case, a blank for the dash.
    let typed = shown.to_lowercase().replace('-', " ");
    let response = join(&gw, "laptop-0001", &typed).await;
    assert_eq!(response.status(), 201, "joins with the code");
    let laptop: Value = response.json().await.expect("body");
    let laptop = laptop["token"].as_str().expect("a token").to_owned();
    assert_eq!(session_ids(&gw, &laptop).await, vec![session.clone()]);
    let opened = gw
        .send(Method::GET, &laptop, &format!("/sessions/{session}"))
        .await;
    assert_eq!(opened.status(), 200, "the laptop opens the phone's session");
    let made_on_laptop = gw.create_session(&laptop).await;
    let mut both = vec![session.clone(), made_on_laptop];
    both.sort();
    assert_eq!(
        session_ids(&gw, &phone).await,
        both,
        "and the phone the laptop's"
    );

    // Once only.
    assert_error(
        join(&gw, "tablet-0001", shown).await,
        401,
        "INVALID_PAIR_CODE",
        "the code a second time",
    )
    .await;
    // A new code replaces the phone's previous one.
    let first = mint(&gw, &phone).await;
    let second = mint(&gw, &phone).await;
    assert_error(
        join(&gw, "tablet-0001", first["code"].as_str().expect("code")).await,
        401,
        "INVALID_PAIR_CODE",
        "a code replaced by a newer one",
    )
    .await;
    // A paired device mints codes for the same owner.
    let from_laptop = mint(&gw, &laptop).await;
    let tablet = join(&gw, "tablet-0001", from_laptop["code"].as_str().expect("c")).await;
    assert_eq!(tablet.status(), 201);
    let tablet: Value = tablet.json().await.expect("body");
    let tablet = tablet["token"].as_str().expect("token").to_owned();
    assert_eq!(session_ids(&gw, &tablet).await, both);
    // The phone's newer code still works after the laptop's was used.
    assert_eq!(
        join(&gw, "watch-00001", second["code"].as_str().expect("c"))
            .await
            .status(),
        201
    );

    assert_eq!(
        device_ids(&gw, &laptop).await,
        vec![
            ("laptop-0001".to_owned(), true),
            ("phone-0001".to_owned(), false),
            ("tablet-0001".to_owned(), false),
            ("watch-00001".to_owned(), false),
        ]
    );
    // Another owner (the app key makes a device its own owner) sees none of it.
    let stranger = gw.register("stranger-01").await;
    assert_eq!(session_ids(&gw, &stranger).await, Vec::<String>::new());
    assert_eq!(
        device_ids(&gw, &stranger).await,
        vec![("stranger-01".to_owned(), true)]
    );
    let refused = gw
        .send(Method::DELETE, &stranger, "/devices/phone-0001")
        .await;
    assert_error(refused, 404, "DEVICE_NOT_FOUND", "another owner's device").await;
    let foreign = gw
        .send(Method::GET, &stranger, &format!("/sessions/{session}"))
        .await;
    assert_eq!(foreign.status(), 404, "another owner's session");
    gw.stop().await;
}

#[tokio::test]
async fn a_revoked_device_loses_its_token_at_once_and_its_id_for_good() {
    let gw = TestGateway::start(args_without_agent).await;
    let phone = gw.register("phone-0001").await;
    let session = gw.create_session(&phone).await;
    let code = mint(&gw, &phone).await;
    let laptop: Value = join(&gw, "laptop-0001", code["code"].as_str().expect("c"))
        .await
        .json()
        .await
        .expect("body");
    let laptop = laptop["token"].as_str().expect("token").to_owned();
    let spare = mint(&gw, &laptop).await;

    let revoked = gw
        .send(Method::DELETE, &phone, "/devices/laptop-0001")
        .await;
    assert_eq!(revoked.status(), 204);
    for path in ["/sessions", "/devices"] {
        let refused = gw.send(Method::GET, &laptop, path).await;
        assert_error(refused, 401, "UNAUTHORIZED", path).await;
    }
    assert_error(
        join(&gw, "tablet-0001", spare["code"].as_str().expect("c")).await,
        401,
        "INVALID_PAIR_CODE",
        "a code minted by a device revoked since",
    )
    .await;
    let again = gw.registration("laptop-0001").send().await.expect("sent");
    assert_error(
        again,
        409,
        "DEVICE_REVOKED",
        "the revoked id with the app key",
    )
    .await;
    let fresh = mint(&gw, &phone).await;
    assert_error(
        join(&gw, "laptop-0001", fresh["code"].as_str().expect("c")).await,
        409,
        "DEVICE_REVOKED",
        "the revoked id with a code",
    )
    .await;
    // The code is still good for a new id.
    assert_eq!(
        join(&gw, "laptop-0002", fresh["code"].as_str().expect("c"))
            .await
            .status(),
        201
    );
    let twice = gw
        .send(Method::DELETE, &phone, "/devices/laptop-0001")
        .await;
    assert_error(twice, 404, "DEVICE_NOT_FOUND", "revoked already").await;
    assert_eq!(session_ids(&gw, &phone).await, vec![session.clone()]);
    assert_eq!(
        device_ids(&gw, &phone).await,
        vec![
            ("laptop-0002".to_owned(), false),
            ("phone-0001".to_owned(), true)
        ]
    );
    // A device may revoke itself (signing out for good).
    assert_eq!(
        gw.send(Method::DELETE, &phone, "/devices/phone-0001")
            .await
            .status(),
        204
    );
    assert_eq!(
        gw.send(Method::GET, &phone, "/sessions").await.status(),
        401
    );
    // Every device of the owner is gone: an admin's reset lets the owner's id register again
    // with the app key, and its sessions are there.
    let refused = gw.registration("phone-0001").send().await.expect("sent");
    assert_error(refused, 409, "DEVICE_REVOKED", "before the reset").await;
    let reset = gw
        .http
        .post(format!("{}/v1/admin/devices/phone-0001/reset", gw.url))
        .bearer_auth("test-admin-token")
        .send()
        .await
        .expect("sent");
    assert_eq!(reset.status(), 204);
    let phone = gw.register("phone-0001").await;
    assert_eq!(session_ids(&gw, &phone).await, vec![session]);
    gw.stop().await;
}

#[tokio::test]
async fn every_bad_pairing_gets_its_status_and_code() {
    let gw = TestGateway::start(args_without_agent).await;
    let phone = gw.register("phone-0001").await;
    let code = mint(&gw, &phone).await;
    let code = code["code"].as_str().expect("code").to_owned();
    for bad in [
        "",
        "ABC",
        "ABCD-EFGHJ",
        "ABCD-EFG0",
        "ABCD-EFGÉ",
        "AAAA-AAAA",
    ] {
        assert_error(
            join(&gw, "laptop-0001", bad).await,
            401,
            "INVALID_PAIR_CODE",
            &format!("code {bad:?}"),
        )
        .await;
    }
    assert_error(
        join(&gw, "bad/id", &code).await,
        400,
        "INVALID_DEVICE_ID",
        "an invalid device id",
    )
    .await;
    assert_error(
        join(&gw, "phone-0001", &code).await,
        409,
        "DEVICE_ALREADY_BOUND",
        "an id in use",
    )
    .await;
    // The app key does not rescue a bad code: the code is what joins an owner.
    let with_key = gw
        .http
        .post(format!("{}/v1/devices", gw.url))
        .header("X-App-Key", "test-app-key")
        .json(&json!({"device_id": "laptop-0001", "pair_code": "AAAA-AAAA"}));
    assert_error(
        with_key.send().await.expect("sent"),
        401,
        "INVALID_PAIR_CODE",
        "a wrong code beside the right app key",
    )
    .await;
    let no_token = gw.send_plain(Method::POST, "/v1/devices/pair").await;
    assert_error(no_token, 401, "UNAUTHORIZED", "minting without a token").await;
    let no_token = gw.send_plain(Method::GET, "/v1/devices").await;
    assert_error(no_token, 401, "UNAUTHORIZED", "listing without a token").await;
    // After all that the code still works: no bad attempt used it up.
    assert_eq!(join(&gw, "laptop-0001", &code).await.status(), 201);
    gw.stop().await;
}

#[tokio::test]
async fn a_code_outlives_a_restart_but_not_its_five_minutes() {
    if file_store_only("edits a device's file between two gateways") {
        return;
    }
    let gw = TestGateway::start(args_without_agent).await;
    let phone = gw.register("phone-0001").await;
    let kept = mint(&gw, &phone).await["code"]
        .as_str()
        .expect("code")
        .to_owned();
    let dir = gw.stop().await.expect("the data dir");
    let gw = TestGateway::start_in(args_without_agent(dir.path().to_path_buf())).await;
    assert_eq!(
        join(&gw, "laptop-0001", &kept).await.status(),
        201,
        "a code minted before a restart"
    );
    let old = mint(&gw, &phone).await["code"]
        .as_str()
        .expect("code")
        .to_owned();
    gw.stop_leaving_hands().await;
    // Six minutes later, as far as the record says.
    let file = dir.path().join("devices/phone-0001.json");
    let mut record: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("the record")).expect("JSON");
    let past = chrono::Utc::now() - chrono::Duration::minutes(1);
    record["pairing"]["expires_at"] = json!(past.to_rfc3339());
    std::fs::write(&file, serde_json::to_vec(&record).expect("JSON")).expect("written");
    let gw = TestGateway::start_in(args_without_agent(dir.path().to_path_buf())).await;
    assert_error(
        join(&gw, "tablet-0001", &old).await,
        401,
        "INVALID_PAIR_CODE",
        "an expired code",
    )
    .await;
    gw.stop().await;
    drop(dir);
}
