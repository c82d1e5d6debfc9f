//! `tollgate bench` against each kind of target: a private Redis (the in-process client path,
//! coalesced), a running `tollgate serve` over HTTP, and its Envoy gRPC service. Each run uses a
//! limit that no window refills during the run, so the admitted count must be exact: against a
//! server, exactly what the server counted for each key.

mod common;

use std::process::Command;

use common::{Tollgate, inside_window};
use serde_json::Value;

/// Runs `tollgate bench --json` with `args`; its summary.
fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("bench")
        .args(["--keys", "3", "--limit", "50", "--concurrency", "8", "--duration", "1s", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// 3 keys x 50 admitted, the rest denied, no errors.
fn assert_exact(summary: &Value) {
    let n = |field: &str| summary[field].as_u64().unwrap();
    assert_eq!(n("errors"), 0, "{summary}");
    assert!(n("decisions") > 150, "too few decisions to spend every key: {summary}");
    assert_eq!(n("allowed"), 150, "{summary}");
    assert_eq!(n("allowed") + n("denied"), n("decisions"));
    let latency = &summary["latency_us"];
    assert!(latency["p50"].as_u64().unwrap() <= latency["p99"].as_u64().unwrap(), "{summary}");
}

#[test]
fn against_redis_it_reports_redis_cpu_per_decision() {
    let redis = tollgate_testkit::RedisServer::start();
    let summary = bench(&["--target", &redis.url(), "--algorithm", "gcra", "--period", "1y"]);
    assert_exact(&summary);
    assert!(summary["redis_cpu_us_per_decision"].as_f64().unwrap() > 0.0, "{summary}");
    let calls = summary["redis_calls_per_decision"].as_f64().unwrap();
    assert!(calls > 0.0 && calls <= 1.0, "{summary}");
    // Without coalescing: one script call per decision, and still exact.
    let summary = bench(&["--target", &redis.url(), "--period", "1y", "--coalesce", "1"]);
    assert_eq!(summary["allowed"].as_u64(), Some(0), "the same keys are spent: {summary}");
    assert_eq!(summary["redis_calls_per_decision"].as_f64(), Some(1.0), "{summary}");
    // A flood of denials with the local denial cache: Redis hardly sees it.
    let summary = bench(&["--target", &redis.url(), "--period", "1y", "--coalesce", "1", "--deny-cache"]);
    assert_eq!(summary["allowed"].as_u64(), Some(0), "{summary}");
    assert!(summary["redis_calls_per_decision"].as_f64().unwrap() < 0.1, "{summary}");
}

/// Runs `bench` with `args` until the runs together made more than 150 decisions (then some
/// key was asked more than its 50: each request picks one of the 3 keys at random, so one run
/// of a loaded debug build may leave a key short of its limit). Answers the summed counts.
fn bench_until_spent(args: &[&str]) -> (u64, u64, u64) {
    let (mut decisions, mut allowed, mut denied) = (0, 0, 0);
    for _ in 0..10 {
        let summary = bench(args);
        let n = |field: &str| summary[field].as_u64().unwrap();
        assert_eq!(n("errors"), 0, "{summary}");
        assert_eq!(n("allowed") + n("denied"), n("decisions"), "{summary}");
        (decisions, allowed, denied) =
            (decisions + n("decisions"), allowed + n("allowed"), denied + n("denied"));
        if decisions > 150 {
            break;
        }
    }
    assert!(decisions > 150, "10 runs made only {decisions} decisions");
    (decisions, allowed, denied)
}

/// What the bench admitted is exactly what the server counted, at most 50 a key, and some key
/// (the one asked more than 50 times) was held to its 50.
fn assert_counted((decisions, allowed, denied): (u64, u64, u64), spent: [u64; 3]) {
    assert!(spent.iter().all(|&s| s <= 50), "over the limit: {spent:?}");
    assert_eq!(spent.iter().sum::<u64>(), allowed, "admitted {allowed} of {decisions}, counted {spent:?}");
    assert!(denied > 0 && spent.contains(&50), "{decisions} decisions, {denied} denied, {spent:?}");
}

#[tokio::test]
async fn against_a_server_over_http_and_grpc() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::google::protobuf::UInt64Value;

    let grpc = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    // The gRPC target's requests carry their own limit in the domain `tollgate-bench`; as
    // upstream, a request's limit counts only in a domain the server declares.
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("bench.yaml");
    std::fs::write(&yaml, "domain: tollgate-bench\n").unwrap();
    let server =
        Tollgate::start("", &["--grpc-listen", &grpc, "--envoy-config", yaml.to_str().unwrap()]).await;
    let counted = bench_until_spent(&[
        "--target",
        &server.base,
        "--algorithm",
        "sliding-window-counter",
        "--period",
        "1y",
    ]);
    let rule = serde_json::json!([{"algorithm": "sliding_window_counter", "limit": 50, "period": "1y"}]);
    let mut spent = [0; 3];
    for (k, spent) in spent.iter_mut().enumerate() {
        let (status, body) =
            server.check(serde_json::json!({"key": format!("k{k}"), "limits": rule, "cost": 0})).await;
        assert!(status == 200 || status == 429, "{status} {body}");
        *spent = 50 - body["remaining"].as_u64().unwrap();
    }
    assert_counted(counted, spent);

    // The runs (a few seconds; at most ten) stay inside one clock hour.
    inside_window(3600, 30).await;
    let target = format!("grpc://{grpc}");
    let counted = bench_until_spent(&["--target", &target, "--algorithm", "fixed-window", "--period", "1h"]);
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.unwrap();
    let mut spent = [0; 3];
    for (k, spent) in spent.iter_mut().enumerate() {
        let descriptor = RateLimitDescriptor {
            entries: vec![Entry { key: "bench_key".into(), value: format!("k{k}") }],
            limit: Some(RateLimitOverride { requests_per_unit: 50, unit: Unit::Hour as i32 }),
            hits_addend: Some(UInt64Value { value: 0 }),
            ..Default::default()
        };
        let request = RateLimitRequest {
            domain: "tollgate-bench".into(),
            descriptors: vec![descriptor],
            hits_addend: 0,
        };
        let r = client.should_rate_limit(request).await.unwrap().into_inner();
        *spent = 50 - u64::from(r.statuses[0].limit_remaining);
    }
    assert_counted(counted, spent);

    // Undeclared, the domain limits nothing: every request is admitted.
    let plain = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let _undeclared = Tollgate::start("", &["--grpc-listen", &plain]).await;
    let summary =
        bench(&["--target", &format!("grpc://{plain}"), "--algorithm", "fixed-window", "--period", "1h"]);
    assert!(summary["decisions"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["denied"].as_u64(), Some(0), "{summary}");

    // What the gRPC target cannot express is refused up front.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "--target", &target, "--algorithm", "gcra", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fixed window"));
}

#[tokio::test]
async fn policies_are_named_and_churn_slides_the_key_space() {
    // 10 a day per key, no window boundary to refill it during the run.
    let config = r#"
[policies.soak]
rules = [{ name = "day", algorithm = "sliding_window_log", limit = 10, period = "1d" }]
"#;
    let server = Tollgate::start(config, &[]).await;
    // 3 keys at a time, sliding by 3 every 0.5 s: within the second, k0 to k7.
    let summary = bench(&["--target", &server.base, "--policy", "soak", "--churn", "500ms"]);
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");
    assert_eq!(summary["churn_seconds"].as_f64(), Some(0.5), "{summary}");
    let mut spent = Vec::new();
    for n in 0..12 {
        let (status, body) =
            server.check(serde_json::json!({"key": format!("k{n}"), "policy": "soak", "cost": 0})).await;
        // A peek at a spent key answers 429.
        assert!(status == 200 || status == 429, "{status} {body}");
        spent.push(10 - body["remaining"].as_u64().unwrap());
    }
    // Counted under the policy (10 each, not the inline --limit 50), exactly what was admitted.
    assert_eq!(spent.iter().sum::<u64>(), summary["allowed"].as_u64().unwrap(), "{spent:?} {summary}");
    assert!(spent.iter().all(|&s| s <= 10), "{spent:?}");
    // New keys came: more than the 3 of a still key space were used, none past k7.
    assert!(spent.iter().filter(|&&s| s > 0).count() > 3, "{spent:?}");
    assert_eq!(spent[8..], [0, 0, 0, 0], "{spent:?}");
}

#[tokio::test]
async fn rate_paces_the_load() {
    let server = Tollgate::start("", &[]).await;
    // 8 workers, 100 a second between them: one every 80 ms each, for a second.
    let summary = bench(&["--target", &server.base, "--period", "1y", "--rate", "100"]);
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");
    assert_eq!(summary["rate"].as_f64(), Some(100.0), "{summary}");
    let decisions = summary["decisions"].as_u64().unwrap();
    // At most the schedule's 13 per worker; unpaced, thousands.
    assert!((50..=104).contains(&decisions), "{decisions} decisions: {summary}");
}
