//! Per-consumer limits end to end: records written through the management API, aggregated,
//! checked over six periods in one backend call, reported by call-limits; anonymous limits.

mod common;

use common::{Tollgate, bootstrap_token, inside_window};
use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

/// Decisions from Redis only: a failing call answers 503 rather than a local decision.
const EXACT: &str = "[backend]\non_failure = \"closed\"\ntimeout = \"5s\"\n";

struct Setup {
    server: Tollgate,
    root: String,
    _dir: tempfile::TempDir,
}

async fn setup(config: &str, extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("c.db").display());
    let root = bootstrap_token(&database, "root", "admin", None);
    let mut args = vec!["--database", database.as_str()];
    args.extend_from_slice(extra);
    let server = Tollgate::start(config, &args).await;
    Setup { server, root, _dir: dir }
}

fn six(second: i64, minute: i64, hour: i64, day: i64, week: i64, month: i64) -> Value {
    json!({"per_second": second, "per_minute": minute, "per_hour": hour, "per_day": day, "per_week": week, "per_month": month})
}

impl Setup {
    async fn add_limit(&self, consumer: &str, mut record: Value, extra: Value) -> Value {
        record.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = self
            .server
            .client
            .post(self.server.url(&format!("/v1/admin/consumers/{consumer}/limits")))
            .bearer_auth(&self.root)
            .json(&record)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{body}");
        body
    }

    async fn check(&self, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self.server.post("/v1/check", &body).await;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        (status, r.json().await.unwrap(), headers)
    }

    async fn statuses(&self, consumer: &str, n: usize) -> Vec<u16> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.check(json!({"consumer": consumer})).await.0);
        }
        out
    }
}

#[tokio::test]
async fn active_records_add_up_and_the_denial_names_the_shortest_failing_period() {
    let s = setup("", &[]).await;
    s.add_limit("acme", six(-1, -1, 2, -1, -1, -1), json!({})).await;
    s.add_limit("acme", six(-1, -1, 1, -1, -1, 10_000), json!({})).await;
    inside_window(3600, 5).await;
    assert_eq!(s.statuses("acme", 4).await, [200, 200, 200, 429], "2 + 1 per hour");
    let (_, body, headers) = s.check(json!({"consumer": "acme"})).await;
    assert_eq!(body["message"], "Too Many Requests. We only allow 3 requests per hour for this consumer.");
    assert_eq!(body["policy"], "consumer");
    let names: Vec<_> =
        body["rules"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["per_hour", "per_month"], "unlimited periods are not checked");
    assert_eq!(headers["x-ratelimit-limit"], "3", "the headers report the period that binds");

    // Two failing periods: the message names the shorter.
    s.add_limit("duo", six(-1, 2, 2, -1, -1, -1), json!({})).await;
    inside_window(3600, 5).await;
    inside_window(60, 3).await;
    assert_eq!(s.statuses("duo", 3).await, [200, 200, 429]);
    let (_, body, _) = s.check(json!({"consumer": "duo"})).await;
    assert_eq!(body["message"], "Too Many Requests. We only allow 2 requests per minute for this consumer.");
}

#[tokio::test]
async fn defaults_scopes_dates_and_unlimited() {
    let config = "[consumers]\ndefaults = { per_second = -1, per_minute = -1, per_hour = 2, per_day = -1, per_week = -1, per_month = -1 }\n";
    let s = setup(config, &[]).await;
    inside_window(3600, 5).await;
    assert_eq!(s.statuses("nobody", 3).await, [200, 200, 429], "defaults apply without a record");

    // An expired record is not active: the defaults apply. A future one neither.
    s.add_limit(
        "old",
        six(-1, -1, 50, -1, -1, -1),
        json!({"from": "2020-01-01T00:00:00Z", "to": "2021-01-01T00:00:00Z"}),
    )
    .await;
    s.add_limit("old", six(-1, -1, 70, -1, -1, -1), json!({"from": "2999-01-01T00:00:00Z"})).await;
    assert_eq!(s.check(json!({"consumer": "old", "cost": 0})).await.1["limit"], 2);

    // Scoped records add to the unscoped ones for checks in their scope.
    s.add_limit("shop", six(-1, -1, 5, -1, -1, -1), json!({})).await;
    s.add_limit("shop", six(-1, -1, 7, -1, -1, -1), json!({"scope": "/orders"})).await;
    assert_eq!(s.check(json!({"consumer": "shop", "cost": 0})).await.1["limit"], 5);
    assert_eq!(s.check(json!({"consumer": "shop", "scope": "/orders/42", "cost": 0})).await.1["limit"], 12);
    assert_eq!(s.check(json!({"consumer": "shop", "scope": "/users", "cost": 0})).await.1["limit"], 5);

    // All -1: unlimited, admitted without limits or headers.
    s.add_limit("vip", six(-1, -1, -1, -1, -1, -1), json!({})).await;
    for _ in 0..5 {
        let (status, body, headers) = s.check(json!({"consumer": "vip"})).await;
        assert_eq!((status, &body["limit"], &body["allowed"]), (200, &Value::Null, &json!(true)), "{body}");
        assert!(headers.get("x-ratelimit-limit").is_none());
    }
}

#[tokio::test]
async fn call_limits_reports_live_counts() {
    let s = setup("", &[]).await;
    s.add_limit("meter", six(-1, 10, 100, -1, -1, -1), json!({})).await;
    inside_window(3600, 5).await;
    inside_window(60, 5).await;
    assert_eq!(s.statuses("meter", 3).await, [200, 200, 200]);
    let r = s
        .server
        .client
        .get(s.server.url("/v1/consumers/meter/call-limits"))
        .bearer_auth(&s.root)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["limits"],
        json!({"per_second": -1, "per_minute": 10, "per_hour": 100, "per_day": -1, "per_week": -1, "per_month": -1})
    );
    assert_eq!(body["current_state"]["per_minute"]["calls_made"], 3);
    assert_eq!(body["current_state"]["per_hour"]["calls_made"], 3);
    let reset = body["current_state"]["per_minute"]["reset_in_seconds"].as_i64().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    assert_eq!(body["current_state"]["per_second"], json!({"calls_made": -1, "reset_in_seconds": -1}));
    // Reading the usage consumed nothing.
    let again: Value = s
        .server
        .client
        .get(s.server.url("/v1/consumers/meter/call-limits"))
        .bearer_auth(&s.root)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["current_state"]["per_minute"]["calls_made"], 3);
    // It needs a token.
    let r = s.server.client.get(s.server.url("/v1/consumers/meter/call-limits")).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn anonymous_callers_get_the_hourly_limit_per_address() {
    let s = setup("[consumers]\nanonymous_per_hour = 2\n", &[]).await;
    inside_window(3600, 5).await;
    let check = |ip: &str| json!({"anonymous_ip": ip});
    for ip in ["203.0.113.7", "2001:db8::1"] {
        assert_eq!(s.check(check(ip)).await.0, 200);
        assert_eq!(s.check(check(ip)).await.0, 200);
        let (status, body, headers) = s.check(check(ip)).await;
        assert_eq!(status, 429);
        assert_eq!(
            body["message"],
            "Too Many Requests. We only allow 2 requests per hour from an anonymous caller."
        );
        assert!(headers.contains_key("retry-after"));
    }
    for (body, field) in [
        (json!({"anonymous_ip": "not-an-ip"}), "anonymous_ip"),
        (json!({"anonymous_ip": "1.2.3.4", "consumer": "x"}), "anonymous_ip"),
        (json!({"consumer": "x", "key": "k"}), "key"),
        (json!({"consumer": "x", "policy": "p"}), "policy"),
        (json!({"anonymous_ip": "1.2.3.4", "scope": "/x"}), "scope"),
        (json!({"key": "k", "policy": "p", "scope": "/x"}), "scope"),
        (json!({"consumer": ""}), "consumer"),
        (json!({"policy": "p"}), "key"),
    ] {
        let (status, problem, _) = s.check(body.clone()).await;
        assert_eq!((status, problem["field"].as_str()), (400, Some(field)), "{body}: {problem}");
    }
}

#[tokio::test]
async fn six_periods_are_one_atomic_call_exact_under_concurrency() {
    let redis = RedisServer::start();
    // Exactness is Redis's: no answer may come from the failure policy, even on a loaded machine.
    let s = setup(EXACT, &["--redis", &redis.url()]).await;
    s.add_limit("burst", six(-1, 50, 1000, 5000, 10_000, 100_000), json!({})).await;
    inside_window(3600, 10).await;
    inside_window(60, 10).await;
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let client = s.server.client.clone();
            let url = s.server.url("/v1/check");
            tokio::spawn(async move {
                client.post(url).json(&json!({"consumer": "burst"})).send().await.unwrap().status().as_u16()
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => admitted += 1,
            429 => {}
            other => panic!("status {other}: Redis was too slow for the test's 5 s timeout"),
        }
    }
    assert_eq!(admitted, 50, "exactly the per-minute limit");
    // Every period counted exactly the admitted ones: none was incremented by a denied check.
    let r = s
        .server
        .client
        .get(s.server.url("/v1/consumers/burst/call-limits"))
        .bearer_auth(&s.root)
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    for period in ["per_minute", "per_hour", "per_day", "per_week", "per_month"] {
        assert_eq!(body["current_state"][period]["calls_made"], 50, "{period}: {body}");
    }
    let keys = redis.keys();
    assert!(keys.iter().all(|k| k.starts_with("tollgate:{consumer:burst}:")), "one hash tag: {keys:?}");
}
