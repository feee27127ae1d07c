//! The bad-input matrix: every route of `warren execd` (its E2B listener included) and of
//! `warren gateway`, each the real binary as a child process, gets every category of bad input
//! that applies to it (malformed JSON, wrong types, empty and huge bodies with and without
//! `Content-Length`, invalid UTF-8, NUL bytes, long paths, traversal, bad `Range`, bad tokens,
//! wrong methods and content types, a refused or malformed WebSocket). Every answer must come
//! within one second with the status the route documents and an error body in the route's
//! shape; the server must stay healthy, keep what it had, never reach the file beside its root,
//! and its memory must stay flat over repeated passes.
//!
//! A handler that panics answering 500 `RUNTIME_ERROR` in Warren's shape is tested once, on the
//! shared serving code: `crates/http/tests/serve.rs`,
//! `a_handler_that_panics_answers_500_in_the_error_shape_and_the_server_goes_on`.

#![allow(clippy::disallowed_methods)]

mod execd;
mod gateway;
mod matrix;
mod regressions;
mod servers;
mod wire;

use matrix::{Case, Failure, Route, Shape};
use servers::Server;
use wire::Request;

/// Passes after the warm-up one; memory after the last may exceed memory after the first by
/// at most [`RSS_GROWTH_KIB`].
const PASSES: usize = 3;
const RSS_GROWTH_KIB: u64 = 16 * 1024;
/// Requests in flight at once.
const PARALLEL: usize = 8;

/// Requests that fit no single route: unknown and overlong paths, NULs and bytes that are not
/// UTF-8 in path segments.
fn edge_routes(
    server: &Server,
    credential: Option<matrix::Credential>,
    shape: Shape,
) -> Vec<Route> {
    let long = "a".repeat(60 * 1024);
    let mut routes = Vec::new();
    for (target, fine) in [
        (format!("/{long}"), &[404][..]),
        (format!("/v1/{long}/x"), &[404][..]),
        ("/no/such/route".to_owned(), &[404][..]),
        ("/v1/sessions%00/x".to_owned(), &[404][..]),
        ("/%C3%28%FF".to_owned(), &[404][..]),
        ("//v1//..//x".to_owned(), &[404][..]),
    ] {
        let mut route = Route::new("GET", target, server.addr);
        route.credential = credential.clone();
        route.shape = shape;
        route.fine = fine;
        routes.push(route);
    }
    routes
}

/// The edge requests as cases: each expects only its route's `fine` statuses.
fn edge_cases(routes: &[Route]) -> Vec<Case> {
    routes
        .iter()
        .map(|route| {
            let mut request = Request::new(route.method, route.target.clone().into_bytes());
            if let Some(credential) = &route.credential {
                request = request.header(credential.header, credential.good.clone());
            }
            Case {
                route: format!(
                    "{} {}…",
                    route.method,
                    route.target.chars().take(40).collect::<String>()
                ),
                category: "long paths and odd segments",
                variant: "the path itself".into(),
                addr: route.addr,
                shape: route.shape,
                request,
                expect: route.fine.to_vec(),
                frame: None,
            }
        })
        .collect()
}

/// Every case of `routes`, then the edge requests with the credential of `routes[credentialed]`
/// and errors in `shape`.
fn all_cases(server: &Server, routes: &[Route], credentialed: usize, shape: Shape) -> Vec<Case> {
    let outside_abs = server.outside().join("secret.txt");
    let mut cases = matrix::cases(routes, &outside_abs.to_string_lossy());
    let credential = routes[credentialed].credential.clone();
    cases.extend(edge_cases(&edge_routes(server, credential, shape)));
    cases
}

/// The listing of the directory beside the root: no case may create anything there.
fn outside_listing(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(server.outside())
        .expect("lists the outside dir")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

/// Runs the matrix: a warm-up pass, then [`PASSES`] more, each category followed by a health
/// check. Panics listing every failure at once, and prints the figures.
async fn run_matrix(
    name: &str,
    server: &mut Server,
    health: &str,
    cases: Vec<Case>,
    still_there: impl AsyncFn(&Server) -> Option<String>,
) {
    let census = matrix::census(&cases);
    let routes: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.route.as_str()).collect();
    eprintln!(
        "{name}: {} routes, {} categories, {} cases per pass: {census:?}",
        routes.len(),
        census.len(),
        cases.len()
    );
    let outside_before = outside_listing(server);
    let mut failures: Vec<Failure> = Vec::new();
    let mut rss = Vec::new();
    let started = std::time::Instant::now();
    for pass in 0..=PASSES {
        for (category, _) in &census {
            let group: Vec<&Case> = cases.iter().filter(|c| c.category == *category).collect();
            let found = run_refs(&group).await;
            if pass == 0 || !found.is_empty() {
                failures.extend(found);
            }
            if let Some(why) = server.unhealthy(health).await {
                failures.push(Failure {
                    case: format!("after the {category} cases of pass {pass}"),
                    problem: format!("server unhealthy: {why}"),
                });
                break;
            }
        }
        if let Some(why) = still_there(&*server).await {
            failures.push(Failure {
                case: format!("after pass {pass}"),
                problem: why,
            });
        }
        let outside_after = outside_listing(server);
        if outside_after != outside_before {
            failures.push(Failure {
                case: format!("after pass {pass}"),
                problem: format!("the directory beside the root changed: {outside_after:?}"),
            });
        }
        rss.push(server.rss_kib());
        if server.unhealthy(health).await.is_some() {
            break;
        }
    }
    eprintln!(
        "{name}: RSS after each pass (KiB, warm-up first): {rss:?}; {} passes in {:?}",
        rss.len(),
        started.elapsed()
    );
    if let (Some(first), Some(last)) = (rss.get(1), rss.last())
        && last.saturating_sub(*first) > RSS_GROWTH_KIB
    {
        failures.push(Failure {
            case: "memory".into(),
            problem: format!(
                "RSS grew from {first} KiB after the first pass to {last} KiB after the last"
            ),
        });
    }
    // A case that fails in every pass is listed once.
    let mut seen = std::collections::BTreeMap::new();
    for failure in failures {
        seen.entry(failure.case).or_insert(failure.problem);
    }
    if !seen.is_empty() {
        let list: Vec<String> = seen
            .iter()
            .map(|(case, problem)| format!("  {case}: {problem}"))
            .collect();
        panic!(
            "{name}: {} failing cases:\n{}\n--- server log (tail) ---\n{}",
            seen.len(),
            list.join("\n"),
            server.log_tail()
        );
    }
}

async fn run_refs(cases: &[&Case]) -> Vec<Failure> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(cases)
        .map(|case| async move {
            matrix::check(case).await.map(|problem| Failure {
                case: format!("{} [{}: {}]", case.route, case.category, case.variant),
                problem,
            })
        })
        .buffer_unordered(PARALLEL)
        .filter_map(|failure| async move { failure })
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execd_answers_every_bad_input_on_every_route_with_a_clear_error() {
    let mut server = servers::execd().await;
    let fixtures = execd::fixtures(&server).await;
    let routes = execd::routes(&server, &fixtures);
    let cases = all_cases(&server, &routes, 0, Shape::OpenSandbox);
    let pty = fixtures.pty.clone();
    let pty_gone = async |server: &Server| {
        (!execd::pty_alive(server, &pty).await).then(|| format!("the PTY session {pty} is gone"))
    };
    run_matrix("execd", &mut server, "/ping", cases, pty_gone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_answers_every_bad_input_on_every_route_with_a_clear_error() {
    let mut server = servers::gateway().await;
    let fixtures = gateway::fixtures(&server).await;
    let (token, session) = (fixtures.token.clone(), fixtures.session.clone());
    let routes = gateway::routes(&server, &fixtures);
    let cases = all_cases(&server, &routes, 3, Shape::Warren);
    let session_gone = async |server: &Server| {
        let request = Request::new("GET", format!("/v1/sessions/{session}"))
            .header("Authorization", format!("Bearer {token}"));
        match wire::send(server.addr, &request).await {
            Ok(response) if response.status == 200 => None,
            other => Some(format!("the session {session} is gone: {other:?}")),
        }
    };
    run_matrix("gateway", &mut server, "/healthz", cases, session_gone).await;
}
