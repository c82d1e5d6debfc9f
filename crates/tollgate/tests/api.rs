//! The HTTP contract of `tollgate serve`, end to end against the real binary: every route, every
//! rate-limit header, the 200 and 429 bodies, peeks, all-or-nothing rule sets, resets, leases,
//! shadow mode, the `delay` strategy and the operations routes.
//!
//! Windows are long ("1h", first-hit aligned where exact values matter) and keys are distinct per
//! test, so no window turns mid-test; timing assertions keep generous margins.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Tollgate;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// One decision: status, headers and JSON body.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("header values are ASCII"))
    }

    fn header_u64(&self, name: &str) -> u64 {
        let v = self.header(name).unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers));
        v.parse().unwrap_or_else(|_| panic!("{name}: {v:?} is not a whole number"))
    }

    fn u64(&self, field: &str) -> u64 {
        self.body[field].as_u64().unwrap_or_else(|| panic!("{field} is not a number in {}", self.body))
    }

    fn rule(&self, index: usize) -> &Value {
        &self.body["rules"][index]
    }
}

async fn call(server: &Tollgate, path: &str, body: Value) -> Answer {
    let r = server.post(path, &body).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} {body}: {e}: {text:?}"))
    };
    Answer { status, headers, body }
}

async fn check(server: &Tollgate, body: Value) -> Answer {
    call(server, "/v1/check", body).await
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// One item of a structured-field list header: its name and its parameters in order.
fn sf_items(value: &str) -> Vec<(String, Vec<(String, u64)>)> {
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap();
            assert!(name.starts_with('"') && name.ends_with('"'), "item name not a string: {item:?}");
            let name = name[1..name.len() - 1].to_owned();
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or_else(|| panic!("bad parameter {p:?}"));
                    (k.to_owned(), v.parse().unwrap_or_else(|_| panic!("bad value in {p:?}")))
                })
                .collect();
            (name, params)
        })
        .collect()
}

/// Every header of a decision agrees with its body, which is what a client relies on.
fn assert_headers_match_body(a: &Answer) {
    let body = &a.body;
    let ctx = format!("{body} / {:?}", a.headers);
    assert_eq!(a.header("content-type"), Some("application/json"), "{ctx}");
    assert_eq!(a.header_u64("x-ratelimit-limit"), a.u64("limit"), "{ctx}");
    assert_eq!(a.header_u64("x-ratelimit-remaining"), a.u64("remaining"), "{ctx}");
    assert_eq!(a.header_u64("x-ratelimit-reset"), ceil_div(a.u64("reset_after_ms"), 1000), "{ctx}");

    let rules = body["rules"].as_array().expect("rules is an array");
    let policy = sf_items(a.header("ratelimit-policy").expect("RateLimit-Policy"));
    let state = sf_items(a.header("ratelimit").expect("RateLimit"));
    assert_eq!(policy.len(), rules.len(), "one RateLimit-Policy item per rule: {ctx}");
    assert_eq!(state.len(), rules.len(), "one RateLimit item per rule: {ctx}");
    for ((rule, (pname, pparams)), (sname, sparams)) in rules.iter().zip(&policy).zip(&state) {
        let name = rule["name"].as_str().unwrap();
        assert_eq!(pname, name, "{ctx}");
        assert_eq!(sname, name, "{ctx}");
        assert_eq!(pparams[0], ("q".to_owned(), rule["limit"].as_u64().unwrap()), "{ctx}");
        let reset = ceil_div(rule["reset_after_ms"].as_u64().unwrap(), 1000);
        assert_eq!(
            sparams,
            &vec![("r".to_owned(), rule["remaining"].as_u64().unwrap()), ("t".to_owned(), reset)],
            "{ctx}"
        );
    }

    match a.status {
        200 => assert_eq!(a.header("retry-after"), None, "no Retry-After on a 200: {ctx}"),
        429 => {
            let retry = a.header_u64("retry-after");
            assert!(retry >= 1, "Retry-After is at least 1: {ctx}");
            assert_eq!(retry, ceil_div(a.u64("retry_after_ms"), 1000).max(1), "rounded up: {ctx}");
        }
        other => panic!("not a decision status: {other}: {ctx}"),
    }
}

fn hour_window(limit: u64) -> Value {
    json!({"algorithm": "fixed_window", "limit": limit, "period": "1h", "align": "first_hit"})
}

#[tokio::test]
async fn healthz_readyz_and_info_describe_the_server() {
    let server = Tollgate::start_builtin(&[]).await;
    for path in ["/healthz", "/readyz"] {
        let (status, text) = server.get_text(path).await;
        assert_eq!(status, 200, "{path}: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body, json!({"status": "ok", "backend": "memory"}), "{path}");
    }

    let (status, text) = server.get_text("/v1/info").await;
    assert_eq!(status, 200, "{text}");
    let info: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(info["enabled"], true, "{info}");
    assert_eq!(info["backend"], "memory", "{info}");
    assert_eq!(info["backend_available"], true, "{info}");
    assert_eq!(info["breaker"], "closed", "{info}");
    assert_eq!(info["on_failure"], "local", "{info}");
    assert!(!info["version"].as_str().unwrap().is_empty(), "{info}");
    let mut policies: Vec<&str> =
        info["policies"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    policies.sort_unstable();
    assert_eq!(policies, ["default", "login", "smooth", "trial", "uploads"], "{info}");
}

#[tokio::test]
async fn info_lists_the_policies_of_the_given_config() {
    let config = r#"
[backend]
on_failure = "open"

[policies.only]
rules = [{ algorithm = "fixed_window", limit = 1, period = "1h" }]
"#;
    let server = Tollgate::start(config, &[]).await;
    let (_, text) = server.get_text("/v1/info").await;
    let info: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(info["policies"], json!(["only"]), "{info}");
    assert_eq!(info["on_failure"], "open", "{info}");
}

#[tokio::test]
async fn openapi_lists_every_route() {
    let server = Tollgate::start_builtin(&[]).await;
    let r = server.client.get(server.url("/openapi.json")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let doc: Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().expect("paths");
    for (path, method) in [
        ("/v1/check", "post"),
        ("/v1/acquire", "post"),
        ("/v1/release", "post"),
        ("/v1/reset", "post"),
        ("/v1/info", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ] {
        let item = paths.get(path).unwrap_or_else(|| panic!("{path} missing from {:?}", paths.keys()));
        assert!(item.get(method).is_some(), "{path} has no {method}: {item}");
    }
    let check = &paths["/v1/check"]["post"]["responses"];
    for status in ["200", "400", "404", "429"] {
        assert!(check.get(status).is_some(), "/v1/check does not document {status}: {check}");
    }
}

#[tokio::test]
async fn check_admits_with_the_full_body_and_every_header() {
    let server = Tollgate::start_builtin(&[]).await;
    let a = check(&server, json!({"key": "body-200", "policy": "default"})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let body = &a.body;
    assert_eq!(body["allowed"], true);
    assert_eq!(body["policy"], "default");
    assert_eq!(body["degraded"], false);
    assert_eq!(body["retry_after_ms"], 0);
    // Admitted: the headline is the rule with the fewest units left, "second" (9 of 10).
    assert_eq!(body["limit"], 10);
    assert_eq!(body["remaining"], 9);
    for absent in ["shadow_denied", "delayed_ms", "lease_id"] {
        assert!(body.get(absent).is_none(), "{absent} only appears when it applies: {body}");
    }
    let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
    for key in
        ["allowed", "limit", "remaining", "reset_after_ms", "retry_after_ms", "degraded", "policy", "rules"]
    {
        assert!(keys.contains(&key), "{key} missing: {body}");
    }

    let rules = body["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(
        (&rules[0]["name"], &rules[0]["algorithm"], &rules[0]["limit"], &rules[0]["remaining"]),
        (&json!("second"), &json!("fixed_window"), &json!(10), &json!(9))
    );
    assert_eq!(
        (&rules[1]["name"], &rules[1]["algorithm"], &rules[1]["limit"], &rules[1]["remaining"]),
        (&json!("minute"), &json!("sliding_window_counter"), &json!(100), &json!(99))
    );
    for rule in rules {
        assert_eq!(rule["allowed"], true);
        assert_eq!(rule["retry_after_ms"], 0);
        let keys: Vec<&str> = rule.as_object().unwrap().keys().map(String::as_str).collect();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["algorithm", "allowed", "limit", "name", "remaining", "reset_after_ms", "retry_after_ms"]
        );
    }

    assert_eq!(a.header("ratelimit-policy"), Some(r#""second";q=10;w=1, "minute";q=100;w=60"#));
    assert_headers_match_body(&a);
}

#[tokio::test]
async fn inline_rules_report_every_algorithm_with_default_names() {
    let server = Tollgate::start_builtin(&[]).await;
    let limits = json!([
        hour_window(5),
        {"algorithm": "token_bucket", "capacity": 10, "refill": 1, "per": "1m"},
        {"algorithm": "gcra", "limit": 10, "period": "1h", "burst": 2},
        {"name": "log", "algorithm": "sliding_window_log", "limit": 3, "period": "1h"},
        {"algorithm": "sliding_window_counter", "limit": 50, "period": "1h"},
    ]);
    let a = check(&server, json!({"key": "inline-names", "limits": limits})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["policy"], "inline");
    let names: Vec<&str> =
        a.body["rules"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fixed_window.0", "token_bucket.1", "gcra.2", "log", "sliding_window_counter.4"]);
    let algorithms: Vec<&str> =
        a.body["rules"].as_array().unwrap().iter().map(|r| r["algorithm"].as_str().unwrap()).collect();
    assert_eq!(
        algorithms,
        ["fixed_window", "token_bucket", "gcra", "sliding_window_log", "sliding_window_counter"]
    );
    // Windows: the period, or the time to refill from empty (10 tokens at 1 a minute: 600 s;
    // a GCRA burst of 2 at 10 an hour: 720 s).
    assert_eq!(
        a.header("ratelimit-policy"),
        Some(
            r#""fixed_window.0";q=5;w=3600, "token_bucket.1";q=10;w=600, "gcra.2";q=2;w=720, "log";q=3;w=3600, "sliding_window_counter.4";q=50;w=3600"#
        )
    );
    // The headline is the rule with the fewest units left: the GCRA burst, 1 of 2.
    assert_eq!((a.u64("limit"), a.u64("remaining")), (2, 1), "{}", a.body);
    let remaining: Vec<u64> =
        a.body["rules"].as_array().unwrap().iter().map(|r| r["remaining"].as_u64().unwrap()).collect();
    assert_eq!(remaining, [4, 9, 1, 2, 49]);
    assert_headers_match_body(&a);
}

#[tokio::test]
async fn policy_headers_name_the_configured_rules() {
    let server = Tollgate::start_builtin(&[]).await;
    let a = check(&server, json!({"key": "login-headers", "policy": "login"})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    // GCRA 5 a minute, burst 3: the burst refills in 36 s.
    assert_eq!(a.header("ratelimit-policy"), Some(r#""attempts";q=3;w=36"#));
    assert_eq!(a.u64("remaining"), 2);
    assert_headers_match_body(&a);
}

#[tokio::test]
async fn over_the_limit_is_429_with_the_same_body_and_retry_after() {
    let server = Tollgate::start_builtin(&[]).await;
    let req = json!({"key": "body-429", "limits": [hour_window(2)]});
    for expected_remaining in [1, 0] {
        let a = check(&server, req.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.u64("remaining"), expected_remaining);
        assert_headers_match_body(&a);
    }
    let a = check(&server, req.clone()).await;
    assert_eq!(a.status, 429, "{}", a.body);
    let body = &a.body;
    assert_eq!(body["allowed"], false);
    assert_eq!(body["limit"], 2);
    assert_eq!(body["remaining"], 0);
    assert_eq!(body["degraded"], false);
    assert_eq!(body["policy"], "inline");
    assert!(body.get("shadow_denied").is_none() && body.get("lease_id").is_none(), "{body}");
    let retry = a.u64("retry_after_ms");
    assert!(retry > 3_500_000 && retry <= 3_600_000, "a first-hit hour window: {body}");
    assert!(a.u64("reset_after_ms") >= retry, "{body}");
    let rule = a.rule(0);
    assert_eq!(rule["allowed"], false);
    assert_eq!(rule["remaining"], 0);
    assert_eq!(rule["retry_after_ms"], body["retry_after_ms"]);
    let retry_header = a.header_u64("retry-after");
    assert!((3500..=3600).contains(&retry_header), "{retry_header}");
    assert_headers_match_body(&a);
    assert_eq!(a.header_u64("x-ratelimit-remaining"), 0);
}

#[tokio::test]
async fn retry_after_is_rounded_up_and_at_least_one_second() {
    let server = Tollgate::start_builtin(&[]).await;
    // GCRA at 2 a second, burst 1: the next request fits within 500 ms, so the wait is under a
    // second and Retry-After says 1, never 0.
    let req = json!({"key": "sub-second", "limits": [{"algorithm": "gcra", "limit": 2, "period": "1s", "burst": 1}]});
    let mut denied = None;
    for _ in 0..20 {
        let a = check(&server, req.clone()).await;
        if a.status == 429 {
            denied = Some(a);
            break;
        }
    }
    let a = denied.expect("back-to-back requests over 2 a second are denied");
    let retry_ms = a.u64("retry_after_ms");
    assert!((1..=500).contains(&retry_ms), "{}", a.body);
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_headers_match_body(&a);

    // A wait of a little under 90 s is announced as 90, not 89.
    let req = json!({"key": "ninety", "limits": [
        {"algorithm": "fixed_window", "limit": 1, "period": "90s", "align": "first_hit"}
    ]});
    assert_eq!(check(&server, req.clone()).await.status, 200);
    let a = check(&server, req).await;
    assert_eq!(a.status, 429);
    let retry_ms = a.u64("retry_after_ms");
    assert!(retry_ms <= 90_000 && retry_ms > 85_000, "{}", a.body);
    assert_eq!(a.header_u64("retry-after"), retry_ms.div_ceil(1000));
    if retry_ms > 89_000 {
        assert_eq!(a.header("retry-after"), Some("90"), "{}", a.body);
    }
    assert_headers_match_body(&a);
}

#[tokio::test]
async fn headers_track_the_body_request_after_request() {
    let server = Tollgate::start_builtin(&[]).await;
    let req = json!({"key": "track", "limits": [
        {"name": "hour", "algorithm": "fixed_window", "limit": 5, "period": "1h", "align": "first_hit"},
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 20, "refill": 1, "per": "1s"},
    ]});
    for n in 1..=7u64 {
        let a = check(&server, req.clone()).await;
        assert_eq!(a.status, if n <= 5 { 200 } else { 429 }, "request {n}: {}", a.body);
        assert_eq!(a.header_u64("x-ratelimit-limit"), 5, "the hour rule binds: {}", a.body);
        assert_eq!(a.header_u64("x-ratelimit-remaining"), 5u64.saturating_sub(n));
        let reset = a.header_u64("x-ratelimit-reset");
        assert!((3500..=3600).contains(&reset), "request {n}: reset {reset}");
        assert_headers_match_body(&a);
    }
}

#[tokio::test]
async fn a_peek_with_cost_zero_consumes_nothing() {
    let server = Tollgate::start_builtin(&[]).await;
    let limits =
        json!([hour_window(3), {"algorithm": "token_bucket", "capacity": 5, "refill": 1, "per": "1h"}]);
    let peek = json!({"key": "peek", "limits": limits, "cost": 0});
    let take = json!({"key": "peek", "limits": limits});

    for _ in 0..5 {
        let a = check(&server, peek.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.u64("remaining"), 3, "a peek takes nothing: {}", a.body);
        assert_eq!(a.rule(1)["remaining"], 5, "{}", a.body);
        assert_headers_match_body(&a);
    }
    let a = check(&server, take.clone()).await;
    assert_eq!((a.status, a.u64("remaining")), (200, 2), "{}", a.body);
    for _ in 0..3 {
        let a = check(&server, peek.clone()).await;
        assert_eq!((a.status, a.u64("remaining")), (200, 2), "{}", a.body);
        assert_eq!(a.rule(1)["remaining"], 4, "{}", a.body);
    }
    for _ in 0..2 {
        assert_eq!(check(&server, take.clone()).await.status, 200);
    }
    // Exhausted: a peek reports that one more unit would be denied, and still takes nothing.
    let a = check(&server, peek.clone()).await;
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(a.rule(1)["remaining"], 2, "{}", a.body);
    assert_headers_match_body(&a);
}

#[tokio::test]
async fn a_denied_request_consumes_nothing_from_the_other_rules() {
    let server = Tollgate::start_builtin(&[]).await;
    let limits = json!([
        {"name": "small", "algorithm": "fixed_window", "limit": 2, "period": "1h", "align": "first_hit"},
        {"name": "big", "algorithm": "fixed_window", "limit": 5, "period": "1h", "align": "first_hit"},
    ]);
    let req = json!({"key": "all-or-nothing", "limits": limits});
    for _ in 0..2 {
        assert_eq!(check(&server, req.clone()).await.status, 200);
    }
    for _ in 0..3 {
        let a = check(&server, req.clone()).await;
        assert_eq!(a.status, 429, "{}", a.body);
        assert_eq!(a.rule(0)["allowed"], false, "{}", a.body);
        assert_eq!(a.rule(1)["allowed"], true, "big alone would admit: {}", a.body);
        assert_eq!(a.rule(1)["remaining"], 3, "a denial takes nothing from big: {}", a.body);
        assert_headers_match_body(&a);
    }
    let a = check(&server, json!({"key": "all-or-nothing", "limits": limits, "cost": 0})).await;
    assert_eq!(a.rule(1)["remaining"], 3, "{}", a.body);

    // The other way round, with costs: a bucket of 10 and a window of 3.
    let limits = json!([
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 10, "refill": 1, "per": "1h"},
        {"name": "window", "algorithm": "fixed_window", "limit": 3, "period": "1h", "align": "first_hit"},
    ]);
    let with_cost = |cost: u64| json!({"key": "all-or-nothing-2", "limits": limits, "cost": cost});
    let a = check(&server, with_cost(3)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!((&a.rule(0)["remaining"], &a.rule(1)["remaining"]), (&json!(7), &json!(0)));
    let a = check(&server, with_cost(1)).await;
    assert_eq!(a.status, 429, "the window is full: {}", a.body);
    assert_eq!(a.rule(0)["remaining"], 7, "{}", a.body);
    let a = check(&server, with_cost(0)).await;
    assert_eq!(a.rule(0)["remaining"], 7, "no denial took tokens: {}", a.body);

    // Denied by the first rule while the second would admit: a bucket of 5, a window of 10.
    let limits = json!([
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 5, "refill": 1, "per": "1h"},
        {"name": "window", "algorithm": "fixed_window", "limit": 10, "period": "1h", "align": "first_hit"},
    ]);
    let with_cost = |cost: u64| json!({"key": "all-or-nothing-3", "limits": limits, "cost": cost});
    assert_eq!(check(&server, with_cost(4)).await.status, 200);
    for _ in 0..3 {
        let a = check(&server, with_cost(2)).await;
        assert_eq!(a.status, 429, "one token left: {}", a.body);
        assert_eq!((&a.rule(0)["allowed"], &a.rule(1)["allowed"]), (&json!(false), &json!(true)));
        assert_eq!(a.rule(1)["remaining"], 6, "{}", a.body);
    }
    let a = check(&server, with_cost(0)).await;
    assert_eq!((&a.rule(0)["remaining"], &a.rule(1)["remaining"]), (&json!(1), &json!(6)), "{}", a.body);
}

#[tokio::test]
async fn reset_restores_the_full_quota_of_that_key_only() {
    let server = Tollgate::start_builtin(&[]).await;
    let limits = json!([hour_window(2)]);
    for key in ["reset-a", "reset-b"] {
        for _ in 0..2 {
            assert_eq!(check(&server, json!({"key": key, "limits": limits})).await.status, 200);
        }
        assert_eq!(check(&server, json!({"key": key, "limits": limits})).await.status, 429);
    }
    let r = server.post("/v1/reset", &json!({"key": "reset-a", "limits": limits})).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.text().await.unwrap().is_empty(), "a 204 has no body");
    let a = check(&server, json!({"key": "reset-a", "limits": limits})).await;
    assert_eq!((a.status, a.u64("remaining")), (200, 1), "{}", a.body);
    assert_eq!(
        check(&server, json!({"key": "reset-b", "limits": limits})).await.status,
        429,
        "another key keeps its counters"
    );

    // A named policy: login allows a burst of 3.
    let login = json!({"key": "reset-login", "policy": "login"});
    for _ in 0..3 {
        assert_eq!(check(&server, login.clone()).await.status, 200);
    }
    assert_eq!(check(&server, login.clone()).await.status, 429);
    let r = server.post("/v1/reset", &json!({"key": "reset-login", "policy": "login"})).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let a = check(&server, login).await;
    assert_eq!((a.status, a.u64("remaining")), (200, 2), "{}", a.body);

    // Resetting a key that has no state is fine too.
    let r = server.post("/v1/reset", &json!({"key": "never-seen", "policy": "default"})).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

fn lease_id(a: &Answer) -> String {
    let id = a.body["lease_id"].as_str().unwrap_or_else(|| panic!("no lease_id: {}", a.body));
    assert!(!id.is_empty() && id.len() <= 64, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
    id.to_owned()
}

#[tokio::test]
async fn acquire_and_release_inline_leases() {
    let server = Tollgate::start_builtin(&[]).await;
    let acquire = json!({"key": "lease-inline", "limit": 2, "lease": "30s"});
    let first = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!((first.u64("limit"), first.u64("remaining")), (2, 1));
    assert_eq!(first.rule(0)["algorithm"], "concurrency");
    assert_eq!(first.header("ratelimit-policy"), Some(r#""concurrency";q=2"#), "no window for concurrency");
    assert_headers_match_body(&first);
    let first_id = lease_id(&first);

    let second = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!((second.status, second.u64("remaining")), (200, 0), "{}", second.body);
    let second_id = lease_id(&second);
    assert_ne!(first_id, second_id, "every lease has its own id");

    let third = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert!(third.body.get("lease_id").is_none(), "no lease when denied: {}", third.body);
    let retry = third.header_u64("retry-after");
    assert!((1..=30).contains(&retry), "a lease expires within 30s: {retry}");
    assert_headers_match_body(&third);

    let release = |id: &str| json!({"key": "lease-inline", "limit": 2, "lease": "30s", "lease_id": id});
    let released = call(&server, "/v1/release", release(&first_id)).await;
    assert_eq!(released.status, 200, "{}", released.body);
    assert_eq!(released.u64("remaining"), 1, "the state after the release: {}", released.body);
    assert!(released.body.get("lease_id").is_none());
    assert_headers_match_body(&released);

    let again = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!((again.status, again.u64("remaining")), (200, 0), "{}", again.body);
    let again_id = lease_id(&again);

    // Releasing twice, or an unknown lease, gives nothing back and is not an error.
    let twice = call(&server, "/v1/release", release(&first_id)).await;
    assert_eq!((twice.status, twice.u64("remaining")), (200, 0), "{}", twice.body);
    assert_eq!(twice.header("retry-after"), None, "a release is never a denial");
    let unknown = call(&server, "/v1/release", release("no-such-lease")).await;
    assert_eq!((unknown.status, unknown.u64("remaining")), (200, 0), "{}", unknown.body);

    for id in [second_id, again_id] {
        assert_eq!(call(&server, "/v1/release", release(&id)).await.status, 200);
    }
    let empty = call(&server, "/v1/release", release("no-such-lease")).await;
    assert_eq!(empty.u64("remaining"), 2, "{}", empty.body);
}

#[tokio::test]
async fn acquire_and_release_under_the_uploads_policy() {
    let server = Tollgate::start_builtin(&[]).await;
    let acquire = json!({"key": "uploader", "policy": "uploads"});
    let a = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["policy"], "uploads");
    assert_eq!(a.header("ratelimit-policy"), Some(r#""in_flight";q=2, "hourly";q=100;w=3600"#));
    assert_eq!((&a.rule(0)["remaining"], &a.rule(1)["remaining"]), (&json!(1), &json!(99)));
    assert_headers_match_body(&a);
    let first = lease_id(&a);

    let b = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!((&b.rule(0)["remaining"], &b.rule(1)["remaining"]), (&json!(0), &json!(98)));
    let second = lease_id(&b);

    let c = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(c.status, 429, "{}", c.body);
    assert_eq!(c.rule(0)["allowed"], false);
    assert_eq!(c.rule(1)["remaining"], 98, "a denied acquire takes no token: {}", c.body);
    assert_headers_match_body(&c);

    // A peek through /v1/check is allowed on a policy with a concurrency rule.
    let peek = check(&server, json!({"key": "uploader", "policy": "uploads", "cost": 0})).await;
    assert_eq!(peek.status, 429, "both slots are held: {}", peek.body);
    assert_eq!(peek.rule(1)["remaining"], 98, "{}", peek.body);

    let r = call(&server, "/v1/release", json!({"key": "uploader", "policy": "uploads", "lease_id": first}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.rule(0)["remaining"], 1, "{}", r.body);
    assert_eq!(r.rule(1)["remaining"], 98, "a release gives back no hourly token: {}", r.body);
    assert_headers_match_body(&r);

    let d = call(&server, "/v1/acquire", acquire.clone()).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!((&d.rule(0)["remaining"], &d.rule(1)["remaining"]), (&json!(0), &json!(97)));
    let third = lease_id(&d);
    for id in [second, third] {
        let r = call(&server, "/v1/release", json!({"key": "uploader", "policy": "uploads", "lease_id": id}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let peek = check(&server, json!({"key": "uploader", "policy": "uploads", "cost": 0})).await;
    assert_eq!(peek.status, 200, "{}", peek.body);
    assert_eq!(peek.rule(0)["remaining"], 2, "{}", peek.body);
}

#[tokio::test]
async fn the_headers_setting_chooses_the_rate_limit_headers() {
    for (set, written, absent) in [
        ("ietf", ["ratelimit-policy", "ratelimit"], ["x-ratelimit-limit", "x-ratelimit-remaining"]),
        ("legacy", ["x-ratelimit-limit", "x-ratelimit-reset"], ["ratelimit-policy", "ratelimit"]),
    ] {
        let config = format!(
            r#"
[server]
headers = "{set}"

[policies.p]
rules = [{{ algorithm = "fixed_window", limit = 1, period = "1h" }}]
"#
        );
        let server = Tollgate::start(&config, &[]).await;
        for expected in [200, 429] {
            let a = check(&server, json!({"key": "k", "policy": "p"})).await;
            assert_eq!(a.status, expected, "{}", a.body);
            for name in written {
                assert!(a.header(name).is_some(), "{set} {expected}: no {name}");
            }
            for name in absent {
                assert!(a.header(name).is_none(), "{set} {expected}: {name} written");
            }
            assert_eq!(a.header("retry-after").is_some(), expected == 429, "{set}");
        }
    }
}

#[tokio::test]
async fn reset_header_epoch_gives_unix_seconds() {
    let config = r#"
[server]
reset_header = "epoch"

[policies.hourly]
rules = [{ name = "hour", algorithm = "fixed_window", limit = 2, period = "1h", align = "first_hit" }]
"#;
    let server = Tollgate::start(config, &[]).await;
    let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let req = json!({"key": "epoch", "policy": "hourly"});
    for expected in [200, 200, 429] {
        let before = now();
        let a = check(&server, req.clone()).await;
        let after = now();
        assert_eq!(a.status, expected, "{}", a.body);
        let reset = a.header_u64("x-ratelimit-reset");
        let delta = ceil_div(a.u64("reset_after_ms"), 1000);
        assert!(
            reset >= before + delta && reset <= after + delta + 1,
            "X-RateLimit-Reset {reset} is not now ({before}..{after}) + {delta}"
        );
        assert!((3500..=3600).contains(&delta), "the body stays relative: {}", a.body);
        // The IETF fields and Retry-After stay relative.
        let t = &sf_items(a.header("ratelimit").unwrap())[0].1[1];
        assert_eq!(t, &("t".to_owned(), delta));
        if expected == 429 {
            let retry = a.header_u64("retry-after");
            assert!((3500..=3600).contains(&retry), "Retry-After stays in seconds: {retry}");
        }
    }
}

#[tokio::test]
async fn shadow_mode_admits_and_reports_the_would_be_denial() {
    let server = Tollgate::start_builtin(&[]).await;
    let series = r#"tollgate_decisions_total{policy="trial",outcome="shadow_denied"}"#;
    let before = server.metric(series).await;
    let req = json!({"key": "shadow", "policy": "trial"});
    for n in 1..=3 {
        let a = check(&server, req.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.body.get("shadow_denied").is_none(), "request {n}: {}", a.body);
        assert_eq!(a.rule(0)["allowed"], true);
    }
    for n in 4..=5 {
        let a = check(&server, req.clone()).await;
        assert_eq!(a.status, 200, "request {n} is let through: {}", a.body);
        assert_eq!(a.body["allowed"], true, "{}", a.body);
        assert_eq!(a.body["shadow_denied"], true, "{}", a.body);
        assert_eq!(a.body["policy"], "trial");
        assert_eq!(a.rule(0)["allowed"], false, "{}", a.body);
        assert_eq!(a.rule(0)["remaining"], 0, "{}", a.body);
        assert_eq!(a.header("retry-after"), None, "a 200 has no Retry-After");
        assert_eq!(a.header_u64("x-ratelimit-remaining"), 0);
    }
    let after = server.metric(series).await;
    assert_eq!(after - before, 2.0, "two shadow denials counted");
    let allowed = server.metric(r#"tollgate_decisions_total{policy="trial",outcome="allowed"}"#).await;
    assert_eq!(allowed, 3.0);
    let denied = server.metric(r#"tollgate_decisions_total{policy="trial",outcome="denied"}"#).await;
    assert_eq!(denied, 0.0, "shadow denials are not denials");
}

#[tokio::test]
async fn delay_holds_a_request_until_it_fits() {
    let server = Tollgate::start_builtin(&[]).await;
    // smooth: 5 a second, burst 1, on_limit = "delay", max_wait 1s. Back-to-back requests
    // arrive early and are held about 200 ms each, then admitted.
    let req = json!({"key": "smooth", "policy": "smooth"});
    let first = check(&server, req.clone()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let mut delayed = Vec::new();
    for _ in 0..4 {
        let start = Instant::now();
        let a = check(&server, req.clone()).await;
        let took = start.elapsed();
        assert_eq!(a.status, 200, "held, then admitted: {}", a.body);
        assert_eq!(a.body["allowed"], true);
        if let Some(ms) = a.body.get("delayed_ms") {
            let ms = ms.as_u64().unwrap();
            assert!(ms > 0, "{}", a.body);
            assert!(ms <= 3_000, "held at most about max_wait: {}", a.body);
            assert!(took >= Duration::from_millis(ms.saturating_sub(5)), "{took:?} vs {}", a.body);
            assert_headers_match_body(&a);
            delayed.push(ms);
        }
    }
    assert!(!delayed.is_empty(), "back-to-back requests at 5 a second were held");
    let admitted = server.metric(r#"tollgate_delayed_total{policy="smooth",result="admitted"}"#).await;
    assert_eq!(admitted, delayed.len() as f64);
}

#[tokio::test]
async fn delay_longer_than_max_wait_is_denied_at_once() {
    let config = r#"
[policies.slow]
rules = [{ name = "pace", algorithm = "gcra", limit = 1, period = "10s", burst = 1 }]
on_limit = "delay"
max_wait = "500ms"
"#;
    let server = Tollgate::start(config, &[]).await;
    let req = json!({"key": "slow", "policy": "slow"});
    assert_eq!(check(&server, req.clone()).await.status, 200);
    let start = Instant::now();
    let a = check(&server, req).await;
    let took = start.elapsed();
    assert_eq!(a.status, 429, "{}", a.body);
    // The wait would be ~10 s: answered without holding it for max_wait, let alone 10 s.
    assert!(took < Duration::from_secs(3), "answered in {took:?}");
    assert!(a.body.get("delayed_ms").is_none(), "{}", a.body);
    let retry = a.header_u64("retry-after");
    assert!((9..=10).contains(&retry), "{retry}");
    assert_headers_match_body(&a);
}

const ONE_AT_A_TIME: &str = r#"
[server]
max_delayed = 1

[policies.queue]
rules = [{ name = "one", algorithm = "gcra", limit = 1, period = "10s", burst = 1 }]
on_limit = "delay"
max_wait = "30s"
"#;

const QUEUE_FULL: &str = r#"tollgate_delayed_total{policy="queue",result="queue_full"}"#;

fn client_with_timeout(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

#[tokio::test]
async fn beyond_max_delayed_requests_are_denied_at_once() {
    // The premise of the next test: with one slot taken, another delayed request is refused.
    let server = Tollgate::start(ONE_AT_A_TIME, &[]).await;
    let req = json!({"key": "queue", "policy": "queue"});
    assert_eq!(check(&server, req.clone()).await.status, 200);
    let url = server.url("/v1/check");
    let holder = {
        let (url, req) = (url.clone(), req.clone());
        tokio::spawn(
            async move { client_with_timeout(Duration::from_secs(5)).post(url).json(&req).send().await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!holder.is_finished(), "the second request is held");
    let start = Instant::now();
    let r = client_with_timeout(Duration::from_secs(2)).post(&url).json(&req).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(start.elapsed() < Duration::from_secs(1), "denied at once");
    assert_eq!(server.metric(QUEUE_FULL).await, 1.0);
    holder.abort();
}

#[tokio::test]
async fn a_delayed_request_frees_its_slot_when_the_client_goes_away() {
    let server = Tollgate::start(ONE_AT_A_TIME, &[]).await;
    let req = json!({"key": "queue", "policy": "queue"});
    let url = server.url("/v1/check");

    // A is admitted at once.
    assert_eq!(check(&server, req.clone()).await.status, 200);

    // B would be held ~10 s and takes the only slot, but gives up after 300 ms.
    let b = client_with_timeout(Duration::from_millis(300)).post(&url).json(&req).send().await;
    let err = b.expect_err("B is held, so its client times out");
    assert!(err.is_timeout(), "{err}");
    // Let the server see the closed connection.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // C: B's slot must be free again, so C is held (its client times out), not refused with
    // queue_full.
    let full_before = server.metric(QUEUE_FULL).await;
    let start = Instant::now();
    let c = client_with_timeout(Duration::from_secs(2)).post(&url).json(&req).send().await;
    let full_after = server.metric(QUEUE_FULL).await;
    match c {
        Err(e) => assert!(e.is_timeout(), "C should have been held: {e}"),
        Ok(r) => panic!(
            "C answered {} after {:?} (queue_full {full_before} -> {full_after}): the delayed request \
             of a client that went away still holds its max_delayed slot\n{}",
            r.status(),
            start.elapsed(),
            server.logs()
        ),
    }
    assert_eq!(full_after, full_before, "no queue_full denial");
}

#[tokio::test]
async fn metrics_count_decisions_near_limits_and_backend_calls() {
    let server = Tollgate::start_builtin(&[]).await;
    let login = json!({"key": "metrics", "policy": "login"});
    let statuses = [
        check(&server, login.clone()).await.status,
        check(&server, login.clone()).await.status,
        check(&server, login.clone()).await.status,
        check(&server, login.clone()).await.status,
    ];
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(check(&server, json!({"key": "metrics", "limits": [hour_window(10)]})).await.status, 200);

    let r = server.client.get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = r.text().await.unwrap();
    for line in [
        "# TYPE tollgate_decisions_total counter",
        "# TYPE tollgate_near_limit_total counter",
        "# TYPE tollgate_backend_duration_seconds histogram",
        r#"tollgate_backend_duration_seconds_bucket{backend="memory",le="+Inf"}"#,
        r#"tollgate_backend_duration_seconds_sum{backend="memory"}"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    let m = |s: &'static str| server.metric(s);
    assert_eq!(m(r#"tollgate_decisions_total{policy="login",outcome="allowed"}"#).await, 3.0);
    assert_eq!(m(r#"tollgate_decisions_total{policy="login",outcome="denied"}"#).await, 1.0);
    assert_eq!(m(r#"tollgate_decisions_total{policy="inline",outcome="allowed"}"#).await, 1.0);
    // The third login attempt left 0 of 3: above 80 % of the limit.
    assert_eq!(m(r#"tollgate_near_limit_total{policy="login"}"#).await, 1.0);
    assert!(m(r#"tollgate_backend_duration_seconds_count{backend="memory"}"#).await >= 5.0);
    assert!(m(r#"tollgate_backend_duration_seconds_bucket{backend="memory",le="+Inf"}"#).await >= 5.0);
}
