//! `json_bodies`: the JSON request bodies of execd (`/v1/exec`, `/v1/terminals`, `/v1/files*`,
//! `/pty`, the OpenSandbox routes) and of the gateway (devices, sessions, messages, permissions,
//! previews, file moves), parsed as the servers parse them: `warren_http::from_json_slice` for
//! a required body (an object only where the type is a struct), `parse_optional_json` for one
//! that may be empty, then the checks the handler runs on the parsed value. The first input byte
//! picks the body type, the rest is the body.
//!
//! Oracle: no panic; a refusal is a 400 `INVALID_REQUEST_BODY`; what parses serialises back to JSON that
//! parses to the same value.

use std::collections::HashMap;
use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;
use warren_http::RequestError;
use warren_http::request::{from_json_slice, parse_optional_json};
use warren_protocol::{exec, files, gateway, opensandbox, pty, terminal};

/// The gateway's private `POST /v1/sessions/{id}/previews` body, restated.
#[derive(Debug, PartialEq, serde::Deserialize, Serialize)]
struct CreatePreview {
    port: i64,
}

pub fn json_bodies(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 16 {
        0 => {
            required::<exec::ExecCommandArgs>(body);
        }
        1 => {
            optional::<exec::WriteStdinBody>(body);
        }
        2 => {
            required::<terminal::TerminalCreate>(body);
        }
        3 => {
            required::<files::MoveRequest>(body);
        }
        4 => {
            optional::<pty::CreatePtyRequest>(body);
        }
        5 => {
            required::<opensandbox::RunCommandRequest>(body);
        }
        6 => {
            optional::<opensandbox::CreateSessionRequest>(body);
        }
        7 => {
            required::<opensandbox::RunInSessionRequest>(body);
        }
        8 => {
            required::<Vec<opensandbox::RenameItem>>(body);
        }
        9 => {
            required::<HashMap<String, opensandbox::Permission>>(body);
        }
        10 => {
            required::<HashMap<String, opensandbox::ReplaceItem>>(body);
        }
        11 => {
            required::<gateway::RegisterDevice>(body);
        }
        12 => {
            if let Some(session) = optional::<gateway::CreateSession>(body)
                && let Some(title) = &session.title
            {
                title_check(title);
            }
        }
        13 => {
            if let Some(rename) = required::<gateway::RenameSession>(body) {
                title_check(rename.title.trim());
            }
        }
        14 => {
            required::<gateway::PostMessage>(body);
            required::<gateway::PermissionAnswer>(body);
        }
        _ => {
            if let Some(preview) = required::<CreatePreview>(body) {
                match warren_gateway::previews::parse_port(preview.port) {
                    Ok(port) => assert_eq!(i64::from(port), preview.port),
                    Err(error) => assert_400(&error),
                }
            }
        }
    }
}

/// A `Json<T>` body: required, an object where `T` is a struct. The value when accepted.
fn required<T>(body: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    accepted(from_json_slice::<T>(body).map_err(|e| RequestError::InvalidJson(e.to_string())))
}

/// An `OptionalJson<T>` body: empty or whitespace is `T::default()`.
fn optional<T>(body: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug + Default,
{
    accepted(parse_optional_json::<T>(body))
}

fn accepted<T>(parsed: Result<T, RequestError>) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    match parsed {
        Ok(value) => {
            let json = serde_json::to_vec(&value).expect("request bodies serialise");
            let again: T = from_json_slice(&json).unwrap_or_else(|error| {
                let json = String::from_utf8_lossy(&json);
                panic!("{value:?} serialises to {json}, which does not parse: {error}")
            });
            assert_eq!(again, value, "a body round-trips through JSON");
            Some(value)
        }
        Err(error) => {
            assert_eq!(error.status(), http::StatusCode::BAD_REQUEST, "{error:?}");
            assert_eq!(error.default_code(), "INVALID_REQUEST_BODY", "{error:?}");
            None
        }
    }
}

fn title_check(title: &str) {
    match warren_gateway::api::check_title(title) {
        Ok(()) => assert!(title.chars().count() <= 200),
        Err(error) => assert_400(&error),
    }
}

fn assert_400(error: &warren_gateway::error::GatewayError) {
    assert!(
        matches!(
            error,
            warren_gateway::error::GatewayError::InvalidRequest(_)
        ),
        "{error:?} is a 400"
    );
}
