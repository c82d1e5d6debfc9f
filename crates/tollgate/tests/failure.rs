//! The server on a private Redis that is killed, frozen (SIGSTOP) and brought back: each
//! failure policy, the circuit breaker, and the return to Redis.

mod common;

use std::time::{Duration, Instant};

use common::Tollgate;
use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

/// A Redis-backed server's config. `timeout` is short only where a test is about slow calls: on
/// a loaded machine a healthy Redis can take longer than 50 ms.
fn config(redis: &RedisServer, on_failure: &str, timeout: &str) -> String {
    format!(
        r#"
[backend]
kind = "redis"
url = "{}"
prefix = "e2e"
timeout = "{timeout}"
on_failure = "{on_failure}"
probe_interval = "100ms"

[policies.p]
rules = [{{ name = "hourly", algorithm = "fixed_window", limit = 3, period = "1h" }}]
"#,
        redis.url()
    )
}

fn check(key: &str) -> Value {
    json!({"key": key, "policy": "p"})
}

/// Checks until an answer is not degraded; the time it took.
async fn until_not_degraded(server: &Tollgate, key: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let (status, body) = server.check(json!({"key": key, "policy": "p", "cost": 0})).await;
        if status == 200 && body["degraded"] == false {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "still degraded after {within:?}: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test]
async fn decisions_live_in_redis_with_ttls() {
    let redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis, "closed", "5s"), &[]).await;
    for remaining in [2, 1, 0] {
        let (status, body) = server.check(check("alice")).await;
        assert_eq!((status, body["remaining"].as_u64()), (200, Some(remaining)), "{body}");
        assert_eq!(body["degraded"], false);
    }
    let (status, body) = server.check(check("alice")).await;
    assert_eq!(status, 429, "{body}");

    let keys = redis.keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("e2e:{alice}:"), "{keys:?}");
    let ttl: i64 = redis.command(&["PTTL", &keys[0]]);
    assert!(ttl > 0, "every key has a TTL");

    let info: Value = server.client.get(server.url("/v1/info")).send().await.unwrap().json().await.unwrap();
    assert_eq!(info["backend"], "redis");
    assert_eq!(info["engine"], "lua", "no module on this Redis: {info}");
    assert_eq!(info["backend_available"], true);
    assert_eq!(server.get_text("/readyz").await.0, 200);
}

#[tokio::test]
async fn local_failure_policy_keeps_limiting_then_returns_to_redis() {
    let mut redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis, "local", "1s"), &[]).await;
    assert_eq!(server.check(check("bob-warm")).await.1["degraded"], false);

    redis.kill();
    let mut statuses = Vec::new();
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let (status, body) = server.check(check("bob")).await;
        latencies.push(start.elapsed());
        assert_eq!(body["degraded"], true, "{body}");
        statuses.push(status);
    }
    // The local limiter has the same rules but its own (fresh) counts: 3 admitted, then denied.
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(server.get_text("/readyz").await.0, 503);
    let info: Value = server.client.get(server.url("/v1/info")).send().await.unwrap().json().await.unwrap();
    assert_eq!((info["backend_available"].as_bool(), info["breaker"].as_str()), (Some(false), Some("open")));
    assert!(
        server.metric("tollgate_degraded_decisions_total{policy=\"p\",failure_policy=\"local\"}").await
            >= 5.0
    );
    assert_eq!(server.metric("tollgate_breaker_open{backend=\"redis\"}").await, 1.0);
    assert!(server.metric("tollgate_backend_errors_total{backend=\"redis\",kind=").await >= 1.0);
    let mut down = Vec::new();
    for i in 0..200 {
        let start = Instant::now();
        let (status, _) = server.check(check(&format!("down-{i}"))).await;
        down.push(start.elapsed());
        assert_eq!(status, 200);
    }
    let p99 = percentile(&mut down, 0.99);
    println!("redis killed, local policy: p50 {:?} p99 {:?}", percentile(&mut down, 0.5), p99);
    assert!(p99 < Duration::from_millis(100), "the breaker spares requests the dead backend: p99 {p99:?}");

    redis.restart();
    let back = until_not_degraded(&server, "bob", Duration::from_secs(5)).await;
    println!("returned to Redis {back:?} after it came back");
    assert!(back < Duration::from_secs(2), "back on Redis within 2 s (took {back:?})");
    assert_eq!(server.get_text("/readyz").await.0, 200);
    // Redis restarted empty: its counts start again from the full quota.
    assert_eq!(server.check(check("bob")).await.1["remaining"], 2);
}

#[tokio::test]
async fn open_failure_policy_admits_everything() {
    let mut redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis, "open", "1s"), &[]).await;
    redis.kill();
    for _ in 0..6 {
        let (status, body) = server.check(check("carol")).await;
        assert_eq!((status, &body["degraded"], &body["remaining"]), (200, &json!(true), &json!(3)), "{body}");
    }
}

#[tokio::test]
async fn closed_failure_policy_answers_503() {
    let mut redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis, "closed", "1s"), &[]).await;
    redis.kill();
    for _ in 0..5 {
        let r = server.post("/v1/check", &check("dave")).await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], 503);
        assert!(body["type"].as_str().unwrap().ends_with("#backend-unavailable"));
    }
    // A reset that cannot reach Redis says so, whatever the policy.
    let r = server.post("/v1/reset", &check("dave")).await;
    assert_eq!(r.status(), 503);
}

#[tokio::test]
async fn hung_redis_costs_at_most_the_timeout_then_nothing() {
    let redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis, "local", "50ms"), &[]).await;
    // One check counted in Redis (a slow first call is answered locally: try again).
    let mut counted = false;
    for _ in 0..50 {
        if server.check(check("erin")).await.1["degraded"] == false {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(counted, "Redis never answered within 50 ms");

    redis.pause();
    let mut hung = Vec::new();
    for i in 0..100 {
        let start = Instant::now();
        let (status, body) = server.check(check(&format!("hung-{i}"))).await;
        hung.push(start.elapsed());
        assert_eq!((status, &body["degraded"]), (200, &json!(true)), "{body}");
    }
    let max = *hung.iter().max().unwrap();
    let p99 = percentile(&mut hung, 0.99);
    println!("redis hung, local policy: p50 {:?} p99 {p99:?} max {max:?}", percentile(&mut hung, 0.5));
    // Only the requests before the breaker opens wait for the 50 ms timeout.
    assert!(max < Duration::from_millis(500), "max {max:?}");
    assert!(p99 < Duration::from_millis(100), "p99 {p99:?}");
    let started = Instant::now();
    let r = server.client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(1), "readiness is bounded by the timeout too");

    redis.resume();
    let back = until_not_degraded(&server, "erin", Duration::from_secs(5)).await;
    println!("returned to Redis {back:?} after SIGCONT");
    assert!(back < Duration::from_secs(2), "took {back:?}");
    // The count made before the freeze is still in Redis (a slow call answered locally is
    // retried: only Redis's answer tells).
    let mut from_redis = None;
    for _ in 0..50 {
        let (_, body) = server.check(check("erin")).await;
        if body["degraded"] == false {
            from_redis = Some(body["remaining"].clone());
            break;
        }
    }
    assert_eq!(from_redis, Some(json!(1)));
}

#[tokio::test]
async fn starts_without_redis_and_uses_it_once_it_appears() {
    let port = tollgate_testkit::free_port();
    let config = format!(
        "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\ntimeout = \"1s\"\n\
         [policies.p]\nrules = [{{ algorithm = \"fixed_window\", limit = 3, period = \"1h\" }}]\n"
    );
    let server = Tollgate::start(&config, &[]).await;
    let (status, body) = server.check(check("frank")).await;
    assert_eq!((status, &body["degraded"]), (200, &json!(true)), "answers at once, from the local limiter");
    assert_eq!(server.get_text("/readyz").await.0, 503);

    let redis = RedisServer::start_on(port);
    let back = until_not_degraded(&server, "frank", Duration::from_secs(5)).await;
    println!("used Redis {back:?} after it appeared");
    assert!(back < Duration::from_secs(2), "took {back:?}");
    assert_eq!(server.get_text("/readyz").await.0, 200);
    let (status, body) = server.check(check("frank")).await;
    assert_eq!((status, &body["degraded"], &body["remaining"]), (200, &json!(false), &json!(2)), "{body}");
    assert_eq!(redis.keys().len(), 1, "the count is in Redis now");
}
