//! A router served on 127.0.0.1:0 in this process, for the test binaries that drive execd's
//! routers over real HTTP (`#[path]`-included).

/// Serves `router` on 127.0.0.1:0 until the test ends; its base URL (`http://addr`).
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}
