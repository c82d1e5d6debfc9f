//! The layer over each backend, and when the backend fails: a Backend that always errs under
//! each failure policy, a private Redis, and an unreachable `RemoteBackend`. The layer over a
//! real `tollgate serve` is tested beside the server, in `crates/tollgate/tests/remote_backend.rs`.

mod common;

use std::time::Duration;

use common::*;
use tollgate_core::{Backend, Decision, Error, Operation, RuleSet};
use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings};
use tollgate_redis::RedisBackend;
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
