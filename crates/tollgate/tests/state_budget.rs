//! Issue 18, finding 2: one small unauthenticated request could make Redis store megabytes.
//! Through the real binary, on the memory backend and on a private Redis: inline rules whose
//! state for one key could exceed `[server] max_request_state` are refused with 400 naming
//! `limits` (or the inline `limit` of `/v1/acquire`); the budget is configurable, and reloads;
//! `[server] inline_limits = false` refuses inline rules with 403; configured policies are
//! never held to the budget.

mod common;

use std::time::{Duration, Instant};

use common::{Tollgate, eventually};
use serde_json::{Value, json};

/// A configured policy far above the default budget (a year-long log of 10,000: 1.3 MB per key
/// at worst), which the operator chose and which is applied all the same.
const BIG_POLICY: &str = r#"
[policies.big]
rules = [{ algorithm = "sliding_window_log", limit = 10000, period = "365d" }]
"#;

/// Issue 18's request: 16 year-long logs of 10,000, cost 10,000 (about 1.2 KB of JSON).
fn attack(key: &str) -> Value {
    let limits: Vec<Value> = (0..16)
        .map(|i| json!({"algorithm": "sliding_window_log", "limit": 10_000, "period": format!("{}d", 365 - i)}))
        .collect();
    json!({"key": key, "limits": limits, "cost": 10_000})
}

fn log_rule(limit: u64) -> Value {
    json!({"key": "one-log", "limits": [{"algorithm": "sliding_window_log", "limit": limit, "period": "365d"}]})
}

async fn problem(server: &Tollgate, path: &str, body: &Value) -> (u16, Value) {
    let r = server.post(path, body).await;
    let status = r.status().as_u16();
    let content_type = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body: Value = r.json().await.unwrap();
    if status >= 400 {
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{body}");
    }
    (status, body)
}

async fn start(config: &str, redis: Option<&tollgate_testkit::RedisServer>) -> Tollgate {
    let url = redis.map(tollgate_testkit::RedisServer::url);
    let mut args = Vec::new();
    if let Some(url) = &url {
        args.extend(["--redis", url.as_str()]);
    }
    Tollgate::start(config, &args).await
}

async fn the_budget_holds(redis: Option<&tollgate_testkit::RedisServer>) {
    let server = start(BIG_POLICY, redis).await;
    // The operator's own large policy is applied, with a warning at load.
    let logs = server.logs();
    assert!(logs.contains("max_request_state allows inline rules") && logs.contains("big"), "{logs}");
    assert!(logs.contains("1300160"), "the warning gives the worst case: {logs}");
    let started = Instant::now();
    let (status, body) = problem(&server, "/v1/check", &attack("attacker")).await;
    let took = started.elapsed();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "limits");
    assert!(body["type"].as_str().unwrap().ends_with("#state-too-large"), "{body}");
    let detail = body["detail"].as_str().unwrap();
    // 16 x (160 + 10,000 x 130) bytes, and the default budget of 256 KiB
    assert!(detail.contains("20802560 bytes") && detail.contains("262144 bytes"), "{detail}");
    assert!(detail.contains("max_request_state"), "{detail}");
    eprintln!("the 16-log request refused in {took:?}");

    // One year-long log of 10,000 alone is over the default budget too; one of 1,000 fits.
    assert_eq!(problem(&server, "/v1/check", &log_rule(10_000)).await.0, 400);
    assert_eq!(problem(&server, "/v1/check", &log_rule(1_000)).await.0, 200);
    // Constant-size rules fit whatever their limits.
    let counters: Vec<Value> = (0..16)
        .map(|i| json!({"algorithm": "sliding_window_counter", "limit": 1_000_000_000_000u64, "period": format!("{}d", 365 - i)}))
        .collect();
    let (status, body) =
        problem(&server, "/v1/check", &json!({"key": "c", "limits": counters, "cost": 10_000})).await;
    assert_eq!(status, 200, "{body}");

    // Acquire: an inline concurrency limit of 10,000 could hold 10,000 leases (2.9 MB).
    let acquire = |limit: u64| json!({"key": "pool", "limit": limit, "lease": "1h", "cost": 1});
    let (status, body) = problem(&server, "/v1/acquire", &acquire(10_000)).await;
    assert_eq!((status, body["field"].as_str()), (400, Some("limit")), "{body}");
    assert!(body["type"].as_str().unwrap().ends_with("#state-too-large"), "{body}");
    let (status, body) = problem(&server, "/v1/acquire", &acquire(500)).await;
    assert_eq!(status, 200, "{body}");
    // Releases and resets only shrink state: not held to the budget.
    let release = json!({"key": "pool", "limit": 10_000, "lease": "1h", "lease_id": body["lease_id"]});
    assert_eq!(problem(&server, "/v1/release", &release).await.0, 200);
    let reset = json!({"key": "one-log", "limits": log_rule(10_000)["limits"]});
    assert_eq!(server.post("/v1/reset", &reset).await.status(), 204);

    // The operator's own policy is applied, whatever its size.
    let (status, body) = server.check(json!({"key": "k", "policy": "big", "cost": 10_000})).await;
    assert_eq!(status, 200, "{body}");

    if let Some(redis) = redis {
        let keys = redis.keys();
        assert!(!keys.iter().any(|k| k.contains("attacker")), "a refused request stored state: {keys:?}");
        // The configured policy's check of cost 10,000: one entry (and the base), not 10,000.
        let log = keys.iter().find(|k| k.contains("{k}:swl2:")).expect("the policy's log");
        assert_eq!(redis.command::<i64>(&["ZCARD", log]), 2);
    }
}

#[tokio::test]
async fn inline_rules_over_the_budget_are_refused_on_memory() {
    the_budget_holds(None).await;
}

#[tokio::test]
async fn inline_rules_over_the_budget_are_refused_on_redis() {
    let redis = tollgate_testkit::RedisServer::start();
    the_budget_holds(Some(&redis)).await;
}

#[tokio::test]
async fn the_budget_is_configurable_and_reloads() {
    let redis = tollgate_testkit::RedisServer::start();
    let server = start(&format!("[server]\nmax_request_state = 2000000\n{BIG_POLICY}"), Some(&redis)).await;
    // 160 + 10,000 x 130 = 1,300,160 bytes: within 2,000,000
    assert_eq!(problem(&server, "/v1/check", &log_rule(10_000)).await.0, 200);
    // the attack still is not (20.8 MB)
    assert_eq!(problem(&server, "/v1/check", &attack("attacker")).await.0, 400);

    // A tiny budget: a log of 10 (1,460 bytes) no longer fits; a fixed window (164) does.
    server.rewrite_config(&format!("[server]\nmax_request_state = 1024\n{BIG_POLICY}"));
    let applied = eventually(Duration::from_secs(5), || async {
        problem(&server, "/v1/check", &log_rule(10)).await.0 == 400
    })
    .await;
    assert!(applied, "the new budget applies:\n{}", server.logs());
    let (_, body) = problem(&server, "/v1/check", &log_rule(10)).await;
    assert!(body["detail"].as_str().unwrap().contains("up to 1460 bytes"), "{body}");
    assert!(body["detail"].as_str().unwrap().contains("budget of 1024 bytes"), "{body}");
    let window = json!({"key": "w", "limits": [{"algorithm": "fixed_window", "limit": 5, "period": "1s"}]});
    assert_eq!(problem(&server, "/v1/check", &window).await.0, 200);
    // out of range: refused with its line, and the last good configuration stays
    server.rewrite_config("[server]\nmax_request_state = 10\n");
    let refused = eventually(Duration::from_secs(5), || async {
        server.logs().contains("max_request_state = 10 bytes")
    })
    .await;
    assert!(refused, "{}", server.logs());
    assert_eq!(problem(&server, "/v1/check", &log_rule(10)).await.0, 400);
}

#[tokio::test]
async fn inline_rules_can_be_turned_off() {
    let redis = tollgate_testkit::RedisServer::start();
    let server = start(&format!("[server]\ninline_limits = false\n{BIG_POLICY}"), Some(&redis)).await;
    let window = json!([{"algorithm": "fixed_window", "limit": 5, "period": "1s"}]);
    for (path, body, field) in [
        ("/v1/check", json!({"key": "k", "limits": window}), "limits"),
        ("/v1/check", attack("attacker"), "limits"),
        ("/v1/reset", json!({"key": "k", "limits": window}), "limits"),
        ("/v1/acquire", json!({"key": "k", "limit": 2, "lease": "30s"}), "limit"),
        ("/v1/release", json!({"key": "k", "limit": 2, "lease": "30s", "lease_id": "abc"}), "limit"),
    ] {
        let (status, problem) = problem(&server, path, &body).await;
        assert_eq!(status, 403, "{path} {body}: {problem}");
        assert_eq!(problem["field"], field, "{path}");
        assert!(problem["type"].as_str().unwrap().ends_with("#inline-limits-disabled"), "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("inline_limits = false"), "{problem}");
    }
    // Configured policies still answer.
    assert_eq!(server.check(json!({"key": "k", "policy": "big"})).await.0, 200);
    assert!(redis.keys().iter().all(|k| k.contains("{k}:swl2:")), "{:?}", redis.keys());

    // Turned on again by a reload.
    server.rewrite_config(BIG_POLICY);
    let on = eventually(Duration::from_secs(5), || async {
        server.check(json!({"key": "k", "limits": window})).await.0 == 200
    })
    .await;
    assert!(on, "{}", server.logs());
}
