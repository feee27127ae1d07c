//! The gateway's OpenAPI 3.1 document, served at `GET /openapi.json` without a token (it holds
//! no secret). The operations come from the same `utoipa_axum::routes!` calls that register the
//! handlers ([`crate::api::routes`]), so a route cannot be served without being documented;
//! this module adds what is the same for every operation: the version, the credential schemes
//! (as [`crate::auth::Device`], [`crate::auth::Admin`] and registration read them) and the 500
//! `RUNTIME_ERROR` any handler answers when it panics.
//!
//! Deliberately left out, on plain axum routes and named in [`UNDOCUMENTED`]: the model proxy,
//! which mirrors the providers' own APIs, and the web console's files (its manifest and service
//! worker included).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};
use warren_protocol::error::ErrorBody;
use warren_protocol::gateway::Event;

/// The device token (`wr_…`) as `Authorization: Bearer`.
pub const DEVICE_TOKEN: &str = "device_token";
/// The device token as `?access_token=`, for browsers' EventSource and WebSocket, which cannot
/// set headers.
pub const DEVICE_TOKEN_QUERY: &str = "device_token_query";
/// `--admin-token` as `Authorization: Bearer` (the admin routes are 404 without the flag).
pub const ADMIN_TOKEN: &str = "admin_token";
/// The app key (`wk_…`) in `X-App-Key`, which registers devices.
pub const APP_KEY: &str = "app_key";

/// A route the router serves that the document leaves out on purpose.
#[derive(Debug, Clone, Copy)]
pub struct Undocumented {
    /// `GET`, or `ANY` for every method.
    pub method: &'static str,
    /// As axum writes it (`{*rest}` a wildcard).
    pub path: &'static str,
    pub why: &'static str,
}

/// Every route of the gateway's router that is not in the document.
pub const UNDOCUMENTED: &[Undocumented] = &[
    Undocumented {
        method: "ANY",
        path: "/v1/model/{provider}/{*rest}",
        why: "the model proxy: it mirrors the providers' own APIs (Anthropic, OpenAI, Gemini) for a \
              session's agent, which presents the session's wm_ token",
    },
    Undocumented {
        method: "GET",
        path: "/",
        why: "the web console's index.html",
    },
    Undocumented {
        method: "GET",
        path: "/console/{*path}",
        why: "the web console's files, as they are",
    },
    Undocumented {
        method: "GET",
        path: "/manifest.webmanifest",
        why: "the web console's web app manifest (phone.md), at the root for the browser",
    },
    Undocumented {
        method: "GET",
        path: "/sw.js",
        why: "the web console's service worker (phone.md), at the root so its scope is the console",
    },
];

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Warren gateway",
        description = "The control plane phone and web clients talk to: devices, sessions, \
            their event streams, files, terminals and previews (docs/gateway.md, \
            files-terminals-previews.md). Every error is a JSON `{\"code\", \"message\"}` body."
    ),
    components(schemas(ErrorBody, Event)),
    tags(
        (name = "devices", description = "Registration, pairing, an owner's devices and the admin's device routes"),
        (name = "push", description = "Web Push: the gateway's VAPID key and a device's subscriptions"),
        (name = "sessions", description = "Sessions, messages, permissions and the event stream"),
        (name = "files", description = "The session's workspace"),
        (name = "terminals", description = "The person's shells and the agent's commands"),
        (name = "previews", description = "A port of the hands on an origin of its own"),
        (name = "health", description = "Health, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// One event of `GET /v1/sessions/{id}/events` as Server-Sent Events frame it (heartbeats are
/// comments, not events). Only its schema is used: `axum`'s `Sse` writes the frames.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct SseEvent {
    /// The event's `seq`, what `Last-Event-ID` resumes after.
    id: String,
    /// The event's `type`.
    event: String,
    /// The event, as JSON.
    #[schema(schema_with = event_json)]
    data: String,
}

/// A string that holds an [`Event`] as JSON.
fn event_json() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/json")
        .content_schema(Some(Ref::from_schema_name("Event")))
        .build()
}

/// The document: [`ApiDoc`] with every operation of [`crate::api::routes`], finished (see the
/// module docs).
pub fn document() -> OpenApi {
    let mut document = crate::api::routes().into_openapi();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let left_out: Vec<String> = UNDOCUMENTED
        .iter()
        .map(|route| format!("- `{} {}`: {}", route.method, route.path, route.why))
        .collect();
    let description = document.info.description.take().unwrap_or_default();
    document.info.description = Some(format!(
        "{description}\n\nNot in this document (served by the same listener):\n{}",
        left_out.join("\n")
    ));
    let components = document.components.get_or_insert_with(Default::default);
    let bearer = |format: &str| {
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format(format)
                .build(),
        )
    };
    components.add_security_scheme(DEVICE_TOKEN, bearer("wr_ device token"));
    components.add_security_scheme(
        DEVICE_TOKEN_QUERY,
        SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::new("access_token"))),
    );
    components.add_security_scheme(ADMIN_TOKEN, bearer("--admin-token"));
    components.add_security_scheme(
        APP_KEY,
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-App-Key"))),
    );
    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody"))))
                        .build(),
                )
                .build(),
        )
    };
    // A handler that panics answers 500 RUNTIME_ERROR in Warren's shape (warren_http::serve).
    let runtime_error = error("RUNTIME_ERROR: the gateway failed (the cause is logged, not shown)");
    // Every path parameter is read by `crate::error::Path`.
    let bad_path = error("INVALID_REQUEST_BODY: a path parameter does not decode");
    // `POST /v1/sessions` takes an empty body too (`OptionalJson`); `routes!` cannot say so
    // without making the body's schema nullable, and `null` is not a body it takes.
    if let Some(RefOr::T(body)) = document
        .paths
        .paths
        .get_mut("/v1/sessions")
        .and_then(|item| item.post.as_mut())
        .and_then(|operation| operation.request_body.as_mut())
    {
        body.required = Some(utoipa::openapi::Required::False);
    }
    for item in document.paths.paths.values_mut() {
        for operation in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
            &mut item.options,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
        {
            let reads_path = operation.parameters.iter().flatten().any(|parameter| {
                matches!(parameter, RefOr::T(parameter)
                    if parameter.parameter_in == utoipa::openapi::path::ParameterIn::Path)
            });
            let responses = &mut operation.responses.responses;
            if reads_path {
                responses
                    .entry("400".to_owned())
                    .or_insert_with(|| bad_path.clone());
            }
            responses
                .entry("500".to_owned())
                .or_insert_with(|| runtime_error.clone());
        }
    }
    document
}

/// The document as served, made once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    document()
        .to_json()
        .expect("the OpenAPI document is plain data and serializes")
});

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "health",
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)),
)]
pub async fn openapi_json() -> axum::response::Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}
