//! OpenSandbox-compatible commands, bash sessions, files, health and metrics
//! (`execd-compat.md`), so the OpenSandbox SDKs work against `warren execd` unchanged.
//!
//! Each submodule owns one feature's state and logic; this module holds the routes, the
//! request parsing, and [`CompatError`], whose statuses are picked in `crate::error` with every
//! other execd error's. Out-of-scope OpenSandbox routes (`/code`, `/proxy`,
//! `/v1/isolated`) answer 501 `NOT_SUPPORTED`.

mod bash_sessions;
mod commands;
mod files;
mod metrics;
pub mod stream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Multipart, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use warren_protocol::opensandbox::{
    CreateSessionRequest, CreateSessionResponse, Permission, RenameItem, ReplaceItem,
    RunCommandRequest, RunInSessionRequest,
};

use crate::Config;
use crate::error::{ApiError, Json, OptionalJson, Path as UrlPath};

pub use crate::fs::expand_path;

pub mod error;
pub use error::CompatError;

impl IntoResponse for CompatError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// The OpenSandbox-compatible feature's state, shared by its routes.
#[derive(Clone)]
pub struct Compat {
    inner: Arc<Inner>,
}

struct Inner {
    commands: commands::Commands,
    sessions: bash_sessions::Sessions,
    files: Arc<files::Files>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Best effort: logs of this daemon's commands are useless once it is gone.
        let _ = std::fs::remove_dir_all(self.commands.log_dir());
    }
}

impl Compat {
    pub fn new(config: &Config) -> Self {
        let log_dir = std::env::temp_dir().join(format!(
            "warren-commands-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        if let Err(err) = std::fs::create_dir_all(&log_dir) {
            tracing::error!(dir = %log_dir.display(), %err, "cannot create the command log directory");
        }
        let files = Arc::new(files::Files::new(&config.root));
        let default_cwd = files.root().to_path_buf();
        Self {
            inner: Arc::new(Inner {
                commands: commands::Commands::new(
                    log_dir,
                    Duration::from_secs(config.command_retention_secs),
                    config.command_records_max,
                    default_cwd,
                ),
                sessions: bash_sessions::Sessions::new(config.max_bash_sessions),
                files,
            }),
        }
    }

    /// Where background command output is kept (one file per live record).
    pub fn command_log_dir(&self) -> &Path {
        self.inner.commands.log_dir()
    }

    /// Kills every running command and every bash session.
    pub async fn shutdown(&self) {
        tokio::join!(
            self.inner.commands.shutdown(),
            self.inner.sessions.shutdown()
        );
    }
}

/// Every OpenSandbox-compatible route.
pub fn routes(state: Compat) -> Router {
    Router::new()
        .route("/ping", get(ping))
        .route("/metrics", get(get_metrics))
        .route("/metrics/watch", get(watch_metrics))
        .route("/command", post(run_command).delete(interrupt_command))
        .route("/command/status/{id}", get(command_status))
        .route("/command/{id}/logs", get(command_logs))
        .route("/session", post(create_session))
        .route("/session/{id}", delete(delete_session))
        .route("/session/{id}/run", post(run_in_session))
        .route("/files", delete(delete_files))
        .route("/files/info", get(files_info))
        .route("/files/mv", post(rename_files))
        .route("/files/permissions", post(chmod_files))
        .route("/files/search", get(search_files))
        .route("/files/replace", post(replace_content))
        .route(
            "/files/upload",
            post(upload_files).layer(DefaultBodyLimit::disable()),
        )
        .route("/files/download", get(download_file))
        .route("/directories", post(make_dirs).delete(remove_dirs))
        .route("/directories/list", get(list_directory))
        .route("/code", any(not_supported))
        .route("/code/{*rest}", any(not_supported))
        .route("/v1/isolated/{*rest}", any(not_supported))
        .with_state(state)
}

type Result<T, E = CompatError> = std::result::Result<T, E>;

/// Query parameters in order, repeats kept (`?path=a&path=b`).
type Pairs = Query<Vec<(String, String)>>;

fn all(pairs: &[(String, String)], name: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .collect()
}

fn first(pairs: &[(String, String)], name: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

fn required(pairs: &[(String, String)], name: &str) -> Result<String> {
    first(pairs, name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CompatError::MissingQuery(format!("missing query parameter '{name}'")))
}

async fn ping() -> StatusCode {
    StatusCode::OK
}

async fn not_supported() -> CompatError {
    CompatError::NotSupported("this OpenSandbox route is not supported by warren execd".to_owned())
}

async fn get_metrics() -> Result<axum::Json<warren_protocol::opensandbox::Metrics>> {
    Ok(axum::Json(metrics::current().await?))
}

async fn watch_metrics() -> Response {
    metrics::watch()
}

async fn run_command(
    State(state): State<Compat>,
    Json(request): Json<RunCommandRequest>,
) -> Result<Response> {
    let (sink, response) = stream::channel();
    state.inner.commands.run(request, sink)?;
    Ok(response)
}

async fn interrupt_command(State(state): State<Compat>, Query(pairs): Pairs) -> Result<StatusCode> {
    let id = required(&pairs, "id")?;
    if state.inner.sessions.contains(&id) {
        state.inner.sessions.delete(&id).await?;
        return Ok(StatusCode::OK);
    }
    state.inner.commands.interrupt(&id).await?;
    Ok(StatusCode::OK)
}

async fn command_status(
    State(state): State<Compat>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<warren_protocol::opensandbox::CommandStatus>> {
    Ok(axum::Json(state.inner.commands.status(&id)?))
}

async fn command_logs(
    State(state): State<Compat>,
    UrlPath(id): UrlPath<String>,
    Query(pairs): Pairs,
) -> Result<Response> {
    let cursor = first(&pairs, "cursor")
        .and_then(|c| c.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let (bytes, next) = state.inner.commands.logs(&id, cursor).await?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert("EXECD-COMMANDS-TAIL-CURSOR", HeaderValue::from(next));
    Ok((headers, Bytes::from(bytes)).into_response())
}

async fn create_session(
    State(state): State<Compat>,
    OptionalJson(request): OptionalJson<CreateSessionRequest>,
) -> Result<Response, ApiError> {
    let cwd = match request.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(cwd) => PathBuf::from(crate::fs::checked_path(cwd)?),
        None => state.inner.files.root().to_path_buf(),
    };
    let session_id = state.inner.sessions.create(cwd).await?;
    Ok(axum::Json(CreateSessionResponse { session_id }).into_response())
}

async fn run_in_session(
    State(state): State<Compat>,
    UrlPath(id): UrlPath<String>,
    Json(request): Json<RunInSessionRequest>,
) -> Result<Response> {
    let (sink, response) = stream::channel();
    state.inner.sessions.run(&id, request, sink)?;
    Ok(response)
}

async fn delete_session(
    State(state): State<Compat>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode> {
    state.inner.sessions.delete(&id).await?;
    Ok(StatusCode::OK)
}

async fn files_info(
    State(state): State<Compat>,
    Query(pairs): Pairs,
) -> Result<axum::Json<HashMap<String, warren_protocol::opensandbox::FileInfo>>> {
    Ok(axum::Json(
        state.inner.files.info(all(&pairs, "path")).await?,
    ))
}

async fn delete_files(State(state): State<Compat>, Query(pairs): Pairs) -> Result<StatusCode> {
    state.inner.files.delete_files(all(&pairs, "path")).await?;
    Ok(StatusCode::OK)
}

async fn rename_files(
    State(state): State<Compat>,
    Json(items): Json<Vec<RenameItem>>,
) -> Result<StatusCode> {
    state.inner.files.rename(items).await?;
    Ok(StatusCode::OK)
}

async fn chmod_files(
    State(state): State<Compat>,
    Json(request): Json<HashMap<String, Permission>>,
) -> Result<StatusCode> {
    state.inner.files.set_permissions(request).await?;
    Ok(StatusCode::OK)
}

async fn search_files(State(state): State<Compat>, Query(pairs): Pairs) -> Result<files::Listing> {
    let path = required(&pairs, "path")?;
    state
        .inner
        .files
        .search(path, first(&pairs, "pattern"))
        .await
}

async fn replace_content(
    State(state): State<Compat>,
    Query(pairs): Pairs,
    Json(request): Json<HashMap<String, ReplaceItem>>,
) -> Result<Response> {
    let verbose = first(&pairs, "verbose").as_deref() == Some("true");
    let results = state.inner.files.replace(request).await?;
    Ok(if verbose {
        axum::Json(results).into_response()
    } else {
        StatusCode::OK.into_response()
    })
}

async fn upload_files(
    State(state): State<Compat>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<StatusCode> {
    let multipart = multipart
        .map_err(|e| CompatError::InvalidFile(format!("expected a multipart body: {e}")))?;
    state.inner.files.upload(multipart).await?;
    Ok(StatusCode::OK)
}

async fn download_file(
    State(state): State<Compat>,
    Query(pairs): Pairs,
    headers: HeaderMap,
) -> Result<Response> {
    let path = required(&pairs, "path")?;
    let range = warren_http::range::range_header(&headers);
    let number = |name: &str| -> Result<Option<u64>> {
        first(&pairs, name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.trim().parse::<u64>().map_err(|_| {
                    CompatError::InvalidRequest(format!("{name} must be a whole number"))
                })
            })
            .transpose()
    };
    let (offset, limit) = (number("offset")?, number("limit")?);
    let lines = match (offset, limit) {
        (None, None) => None,
        (Some(0), _) => {
            return Err(CompatError::InvalidRequest("offset is 1-based".to_owned()));
        }
        (offset, limit) => Some((offset.unwrap_or(1), limit)),
    };
    state.inner.files.download(path, range, lines).await
}

async fn list_directory(
    State(state): State<Compat>,
    Query(pairs): Pairs,
) -> Result<files::Listing> {
    let path = required(&pairs, "path")?;
    let depth = match first(&pairs, "depth").map(|d| d.trim().to_owned()) {
        None => 1,
        Some(d) if d.is_empty() => 1,
        // A depth too large to represent asks for everything, like any depth past the limit.
        Some(d) if d.bytes().all(|b| b.is_ascii_digit()) => d.parse().unwrap_or(usize::MAX),
        Some(_) => {
            return Err(CompatError::InvalidRequest(
                "depth must be a whole number".to_owned(),
            ));
        }
    };
    state.inner.files.list(path, depth).await
}

async fn make_dirs(
    State(state): State<Compat>,
    Json(request): Json<HashMap<String, Permission>>,
) -> Result<StatusCode> {
    state.inner.files.make_dirs(request).await?;
    Ok(StatusCode::OK)
}

async fn remove_dirs(State(state): State<Compat>, Query(pairs): Pairs) -> Result<StatusCode> {
    state.inner.files.remove_dirs(all(&pairs, "path")).await?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    /// `(retention secs, records max, bash sessions max, root)` of a config.
    fn limits(config: &Config) -> (u64, usize, usize, PathBuf) {
        (
            config.command_retention_secs,
            config.command_records_max,
            config.max_bash_sessions,
            config.root.clone(),
        )
    }

    #[test]
    fn limits_default_to_the_spec_from_flags_and_from_config_default() {
        use clap::Parser;
        let spec = (3600, 1024, 64, PathBuf::from("/"));
        assert_eq!(limits(&Config::default()), spec);
        let parsed = Cli::try_parse_from(["execd"]).expect("parses no flags");
        assert_eq!(limits(&parsed.config), spec);
        for retention in ["--command-retention=60", "--command-retention-secs=60"] {
            let flags = [
                "execd",
                retention,
                "--command-records-max=5",
                "--max-bash-sessions=2",
                "--root=/tmp",
            ];
            let parsed = Cli::try_parse_from(flags).expect("parses the flags");
            assert_eq!(
                limits(&parsed.config),
                (60, 5, 2, PathBuf::from("/tmp")),
                "{retention}"
            );
        }
    }
}
