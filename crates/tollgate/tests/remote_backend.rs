//! The tower layer over a real `tollgate serve` router through `RemoteBackend`: here, where both
//! the layer and the server are dependencies, so that neither crate depends on the other.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use serde_json::Value;
use tollgate_config::Config;
use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings, Policy};
use tollgate_server::AppState;
use tollgate_tower::{RateLimitInfo, RemoteBackend, TollgateLayer};

fn settings(on_failure: FailurePolicy) -> LimiterSettings {
    // A long probe interval: the breaker stays open for the whole test.
    LimiterSettings { on_failure, probe_interval: Duration::from_secs(60), ..Default::default() }
}

fn limiter_over(backend: impl Backend + 'static, settings: LimiterSettings) -> Limiter {
    Limiter::new(Arc::new(backend), "test", settings)
}

/// An enforced policy of `limit` a minute (a fixed window from the first hit, so the test never
/// straddles a window's edge).
fn per_minute(name: &str, limit: u64) -> Policy {
    let rule = Rule::fixed_window_from_first_hit(limit, Period::MINUTE).named("minute");
    Policy::enforce(name, RuleSet::new([rule]).unwrap())
}

/// Answers with what the layer decided: `key policy shadow_denied degraded waited_ms`.
async fn whoami(info: Option<Extension<RateLimitInfo>>) -> String {
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

async fn serve_on(addr: SocketAddr, app: Router) -> String {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    format!("http://{addr}")
}

/// An app answering `whoami` on every path, behind a layer over `limiter` allowing `limit` a minute.
async fn over(limiter: Limiter, limit: u64) -> String {
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", limit)).build().unwrap();
    serve_on("127.0.0.1:0".parse().unwrap(), Router::new().fallback(whoami).layer(layer)).await
}

/// A client whose connections come from `from` (any 127.0.0.0/8 address works on Linux).
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn status(client: &reqwest::Client, url: &str) -> u16 {
    client.get(url).send().await.unwrap().status().as_u16()
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let r = client.get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// A response's problem+json body, checking its content type and status field.
async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().unwrap().starts_with("https://"), "{body}");
    assert!(!body["title"].as_str().unwrap().is_empty(), "{body}");
    body
}

/// A real `tollgate serve` router in this process, on a free port.
async fn tollgate_serve() -> String {
    let config = Config::builtin();
    let limiter =
        Limiter::new(Arc::new(tollgate_core::MemoryBackend::new()), "memory", config.limiter_settings());
    serve_on("127.0.0.1:0".parse().unwrap(), tollgate_server::router(AppState::new(limiter, config))).await
}

#[tokio::test]
async fn over_a_remote_tollgate_server() {
    let server = tollgate_serve().await;
    let remote = RemoteBackend::new(&server).timeout(Duration::from_secs(5));
    remote.ping().await.unwrap();
    let limiter = limiter_over(remote.clone(), settings(FailurePolicy::Closed));
    let base = over(limiter.clone(), 2).await;
    let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    assert_eq!(get(&a, &base).await, (200, "ip:127.0.0.1 p false false 0".into()));
    let r = a.get(&base).send().await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let r = a.get(&base).send().await.unwrap();
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    problem(r, 429).await;
    assert_eq!(status(&b, &base).await, 200);

    // The counters live on the server: a reset there admits again.
    let rules = per_minute("p", 2).rules;
    remote.reset("p:ip:127.0.0.1", &rules).await.unwrap();
    assert_eq!(status(&a, &base).await, 200);
    // Decisions match the server's own for the same inline rules.
    let d = remote.check("direct", &rules, 2).await.unwrap();
    assert!(d.allowed());
    let d = remote.check("direct", &rules, 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.remaining(), 0);
    assert!(d.retry_after() > Duration::ZERO && d.retry_after() <= Duration::from_secs(60));
}
