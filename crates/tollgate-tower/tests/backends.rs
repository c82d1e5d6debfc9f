//! The layer over each backend, and when the backend fails: a Backend that always errs under
//! each failure policy, a private Redis, and a real `tollgate serve` through `RemoteBackend`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tollgate_config::Config;
use tollgate_core::{Backend, Decision, Error, Operation, RuleSet};
use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings};
use tollgate_redis::RedisBackend;
use tollgate_server::AppState;
use tollgate_testkit::RedisServer;
use tollgate_tower::{RemoteBackend, TollgateLayer};

struct Down;

#[async_trait::async_trait]
impl Backend for Down {
    async fn execute(&self, _: &str, _: &RuleSet, _: Operation<'_>) -> Result<Decision, Error> {
        Err(Error::Unavailable("down for the test".into()))
    }
    async fn reset(&self, _: &str, _: &RuleSet) -> Result<(), Error> {
        Err(Error::Unavailable("down for the test".into()))
    }
}

fn settings(on_failure: FailurePolicy) -> LimiterSettings {
    // A long probe interval: the breaker stays open for the whole test.
    LimiterSettings { on_failure, probe_interval: Duration::from_secs(60), ..Default::default() }
}

async fn over(limiter: Limiter, limit: u64) -> String {
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", limit)).build().unwrap();
    serve(app(), layer).await
}

#[tokio::test]
async fn a_failing_backend_under_each_failure_policy() {
    let c = client();
    // Open: admitted, marked degraded for the handler.
    let base = over(limiter_over(Down, settings(FailurePolicy::Open)), 1).await;
    for _ in 0..5 {
        assert_eq!(get(&c, &base).await, (200, "ip:127.0.0.1 p false true 0".into()));
    }
    // Closed: 503 with Retry-After, never reaching the app.
    let base = over(limiter_over(Down, settings(FailurePolicy::Closed)), 1).await;
    for _ in 0..5 {
        let r = c.get(&base).send().await.unwrap();
        assert_eq!(header(&r, "retry-after"), Some("1"));
        let body = problem(r, 503).await;
        assert!(body["detail"].as_str().unwrap().contains("closed"), "{body}");
    }
    // Local: limited in this process.
    let base = over(limiter_over(Down, settings(FailurePolicy::Local)), 1).await;
    assert_eq!(get(&c, &base).await, (200, "ip:127.0.0.1 p false true 0".into()));
    assert_eq!(status(&c, &base).await, 429);
}

#[tokio::test]
async fn over_redis() {
    let redis = RedisServer::start();
    let backend = RedisBackend::builder(redis.url()).timeout(Duration::from_secs(2)).build().unwrap();
    let base = over(limiter_over(backend, settings(FailurePolicy::Closed)), 2).await;
    let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    assert_eq!(get(&a, &base).await, (200, "ip:127.0.0.1 p false false 0".into()));
    let r = a.get(&base).send().await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let r = a.get(&base).send().await.unwrap();
    assert!(header(&r, "retry-after").is_some());
    problem(r, 429).await;
    assert_eq!(status(&b, &base).await, 200);
}

/// A real `tollgate serve` router in this process, on a free port.
async fn tollgate_serve() -> String {
    let config = Config::builtin();
    let limiter =
        Limiter::new(Arc::new(tollgate_core::MemoryBackend::new()), "memory", config.limiter_settings());
    serve_on("127.0.0.1:0".parse().unwrap(), tollgate_server::router(AppState::new(limiter, config)))
        .await
        .unwrap()
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

#[tokio::test]
async fn an_unreachable_remote_server_follows_the_failure_policy() {
    // A port nothing listens on.
    let dead = format!("http://127.0.0.1:{}", tollgate_testkit::free_port());
    let remote = RemoteBackend::new(&dead);
    assert!(matches!(remote.ping().await, Err(Error::Unavailable(_))));
    let c = client();
    let base = over(limiter_over(remote.clone(), settings(FailurePolicy::Closed)), 1).await;
    problem(c.get(&base).send().await.unwrap(), 503).await;
    let base = over(limiter_over(remote, settings(FailurePolicy::Open)), 1).await;
    assert_eq!(get(&c, &base).await, (200, "ip:127.0.0.1 p false true 0".into()));
}
