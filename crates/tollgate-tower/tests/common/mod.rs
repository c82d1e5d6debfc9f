//! A real axum app with the layer, served on a free loopback port, and a client for it.

#![allow(dead_code)] // each test binary uses a different part

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::routing::get as route_get;
use serde_json::Value;
use tollgate_core::{Backend, ManualClock, MemoryBackend, Period, Rule, RuleSet};
use tollgate_limiter::{Limiter, LimiterSettings, Policy};
use tollgate_tower::{RateLimitInfo, TollgateLayer};

/// A limiter over a memory backend on a manual clock: windows move only when the test says.
pub fn manual_limiter() -> (Limiter, ManualClock) {
    let clock = ManualClock::at_wall_clock_second();
    (limiter_over(MemoryBackend::with_clock(clock.clone()), LimiterSettings::default()), clock)
}

pub fn limiter_over(backend: impl Backend + 'static, settings: LimiterSettings) -> Limiter {
    Limiter::new(Arc::new(backend), "test", settings)
}

/// An enforced policy of `limit` a minute (a fixed window from the first hit, so tests on the
/// real clock never straddle a window's edge).
pub fn per_minute(name: &str, limit: u64) -> Policy {
    let rule = Rule::fixed_window_from_first_hit(limit, Period::MINUTE).named("minute");
    Policy::enforce(name, RuleSet::new([rule]).unwrap())
}

/// Answers with what the layer decided: `key policy shadow_denied degraded waited_ms`, or
/// `unlimited`.
pub async fn whoami(info: Option<Extension<RateLimitInfo>>) -> String {
    match info {
        Some(Extension(i)) => format!(
            "{} {} {} {} {}",
            i.key,
            i.policy.name,
            i.verdict.shadow_denied,
            i.verdict.degraded,
            i.verdict.waited.as_millis()
        ),
        None => "unlimited".into(),
    }
}

/// An app answering `whoami` on every path and method.
pub fn app() -> Router {
    Router::new().fallback(whoami).route("/healthz", route_get(|| async { "ok" }))
}

/// Serves `app` with `layer` on 127.0.0.1 and a free port, with the peer address.
pub async fn serve(app: Router, layer: TollgateLayer) -> String {
    serve_on("127.0.0.1:0".parse().unwrap(), app.layer(layer)).await.unwrap()
}

pub async fn serve_on(addr: SocketAddr, app: Router) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    Ok(format!("http://{addr}"))
}

/// A client whose connections come from `from` (any 127.0.0.0/8 address works on Linux).
pub fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

pub fn client() -> reqwest::Client {
    client_from("127.0.0.1")
}

/// GETs `url` and returns the status.
pub async fn status(client: &reqwest::Client, url: &str) -> u16 {
    client.get(url).send().await.unwrap().status().as_u16()
}

/// GETs `url`: status and body.
pub async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let r = client.get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The header's value as text.
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// A response's problem+json body, checking its content type and status field.
pub async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().unwrap().starts_with("https://"), "{body}");
    assert!(!body["title"].as_str().unwrap().is_empty(), "{body}");
    body
}
