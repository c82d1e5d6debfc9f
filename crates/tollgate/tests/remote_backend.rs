//! The tower layer over a real `tollgate serve` router through `RemoteBackend`: here, where both
//! the layer and the server are dependencies, so that neither crate depends on the other.

use std::sync::Arc;
use std::time::Duration;

use tollgate_config::Config;
use tollgate_core::Backend;
use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings};
use tollgate_server::AppState;
use tollgate_tower::{RemoteBackend, TollgateLayer};

// The tower layer's own test helpers (an app answering `whoami`, clients from chosen
// addresses, problem+json checks), shared rather than copied.
#[path = "../../tollgate-tower/tests/common/mod.rs"]
mod common;
use common::*;

fn settings(on_failure: FailurePolicy) -> LimiterSettings {
    // A long probe interval: the breaker stays open for the whole test.
    LimiterSettings { on_failure, probe_interval: Duration::from_secs(60), ..Default::default() }
}

/// An app answering `whoami` on every path, behind a layer over `limiter` allowing `limit` a minute.
async fn over(limiter: Limiter, limit: u64) -> String {
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", limit)).build().unwrap();
    serve(app(), layer).await
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
