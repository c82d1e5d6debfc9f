//! The Envoy rate-limit service over gRPC, called by a tonic client over loopback, configured by
//! an envoyproxy/ratelimit-style YAML file.

mod common;

use common::{Tollgate, inside_window};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

const YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 1, name: login}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /health
    rate_limit: {unit: second, unlimited: true}
  - key: plan
    value: trial
    rate_limit: {unit: hour, requests_per_unit: 1}
    shadow_mode: true
  - key: user
    descriptors:
      - key: tier
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 10, replaces: [{name: login}]}
  - key: tenant
    value: acme
    rate_limits:
      - {unit: second, requests_per_unit: 3, unit_multiplier: 3600}
      - {unit: hour, requests_per_unit: 100, algorithm: gcra, burst: 2}
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: "edge".into(), descriptors, hits_addend: 0 }
}

async fn start() -> (Tollgate, RateLimitServiceClient<Channel>, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let port = tollgate_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let server =
        Tollgate::start("", &["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap()]).await;
    let client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 5).await;
    (server, client, dir, listen)
}

/// Codes of one request's statuses, and its overall code.
async fn codes(client: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> (Code, Vec<Code>) {
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    (r.overall_code(), r.statuses.iter().map(|s| s.code()).collect())
}

#[tokio::test]
async fn descriptors_match_most_specific_first_and_count_per_value() {
    let (_server, mut client, _dir, _) = start().await;
    let ip = |v: &str| request(vec![descriptor(&[("remote_address", v)])]);
    assert_eq!(codes(&mut client, ip("10.0.0.1")).await, (Code::Ok, vec![Code::Ok]));
    let r = client.should_rate_limit(ip("10.0.0.1")).await.unwrap().into_inner();
    let status = &r.statuses[0];
    assert_eq!((status.code(), status.limit_remaining), (Code::Ok, 0));
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (2, Unit::Hour));
    let reset = status.duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 3600, "{reset:?}");
    assert_eq!(codes(&mut client, ip("10.0.0.1")).await, (Code::OverLimit, vec![Code::OverLimit]));
    assert_eq!(codes(&mut client, ip("10.0.0.2")).await.0, Code::Ok, "each value has its own count");

    // Prefixes, the longest match, and no match at all (OK, no current limit).
    let path = |p: &str| request(vec![descriptor(&[("path", p)])]);
    let r = client.should_rate_limit(path("/api/orders")).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 5);
    let r = client.should_rate_limit(path("/nowhere")).await.unwrap().into_inner();
    assert_eq!((r.overall_code(), r.statuses[0].current_limit.is_none()), (Code::Ok, true));
    for _ in 0..5 {
        let r = client.should_rate_limit(path("/health")).await.unwrap().into_inner();
        assert_eq!(
            (r.statuses[0].code(), r.statuses[0].current_limit.is_none()),
            (Code::Ok, true),
            "unlimited"
        );
    }
}

#[tokio::test]
async fn hits_addend_overrides_shadow_mode_and_replaces() {
    let (_server, mut client, _dir, _) = start().await;
    // Request-level hits: 4 of /api's 5.
    let mut req = request(vec![descriptor(&[("path", "/api/x")])]);
    req.hits_addend = 4;
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // Descriptor-level hits 0: a check that counts nothing.
    let mut d = descriptor(&[("path", "/api/x")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..3 {
        let r = client.should_rate_limit(request(vec![d.clone()])).await.unwrap().into_inner();
        assert_eq!((r.statuses[0].code(), r.statuses[0].limit_remaining), (Code::Ok, 1));
    }
    // More hits than the limit holds: over the limit.
    let mut d = descriptor(&[("path", "/api/y")]);
    d.hits_addend = Some(UInt64Value { value: 6 });
    assert_eq!(codes(&mut client, request(vec![d])).await.0, Code::OverLimit);

    // The request's own limit overrides the file's.
    let mut d = descriptor(&[("remote_address", "override")]);
    d.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: Unit::Day as i32 });
    assert_eq!(codes(&mut client, request(vec![d.clone()])).await.0, Code::Ok);
    let r = client.should_rate_limit(request(vec![d])).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().unit(), Unit::Day);

    // Shadow mode: counted, never refusing.
    let trial = || request(vec![descriptor(&[("plan", "trial")])]);
    for _ in 0..3 {
        assert_eq!(codes(&mut client, trial()).await.0, Code::Ok);
    }

    // `login` (1 an hour) is replaced by the gold tier's limit when both apply.
    let both =
        || request(vec![descriptor(&[("path", "/login")]), descriptor(&[("user", "u1"), ("tier", "gold")])]);
    for _ in 0..3 {
        let (overall, each) = codes(&mut client, both()).await;
        assert_eq!((overall, &each[..]), (Code::Ok, &[Code::Ok, Code::Ok][..]));
    }
    let login = || request(vec![descriptor(&[("path", "/login")])]);
    assert_eq!(codes(&mut client, login()).await.0, Code::Ok);
    assert_eq!(codes(&mut client, login()).await.0, Code::OverLimit, "alone, login applies");

    // Overall: over the limit when any descriptor is.
    let mixed = request(vec![descriptor(&[("path", "/login")]), descriptor(&[("path", "/api/z")])]);
    assert_eq!(codes(&mut client, mixed).await, (Code::OverLimit, vec![Code::OverLimit, Code::Ok]));
}

#[tokio::test]
async fn several_limits_on_one_descriptor_are_all_or_nothing() {
    let (_server, mut client, _dir, _) = start().await;
    let acme = || request(vec![descriptor(&[("tenant", "acme")])]);
    // GCRA 100 an hour with a burst of 2: two at once, then one every 36 s; the fixed window
    // (3 per 3600 s) is not consumed by the refused third.
    assert_eq!(codes(&mut client, acme()).await.0, Code::Ok);
    assert_eq!(codes(&mut client, acme()).await.0, Code::Ok);
    let r = client.should_rate_limit(acme()).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::OverLimit);
    let binding = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(binding.requests_per_unit, 100, "the GCRA limit refused");
}

#[tokio::test]
async fn the_descriptors_of_one_request_are_all_or_nothing() {
    let (_server, mut client, _dir, _) = start().await;
    let remaining = |r: &RateLimitResponse| r.statuses.iter().map(|s| s.limit_remaining).collect::<Vec<_>>();
    let both = || request(vec![descriptor(&[("remote_address", "a")]), descriptor(&[("path", "/login")])]);
    let r = client.should_rate_limit(both()).await.unwrap().into_inner();
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![1, 0]));
    // /login is spent: the request is refused, and the address's hour is not charged for it.
    let r = client.should_rate_limit(both()).await.unwrap().into_inner();
    let each: Vec<Code> = r.statuses.iter().map(|s| s.code()).collect();
    assert_eq!(
        (r.overall_code(), each, remaining(&r)),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit], vec![1, 0])
    );
    let r = client.should_rate_limit(request(vec![descriptor(&[("remote_address", "a")])])).await.unwrap();
    assert_eq!(remaining(&r.into_inner()), [0], "one unit was left for the address");

    // The same counter named twice asks it for both hits.
    let twice =
        || request(vec![descriptor(&[("remote_address", "b")]), descriptor(&[("remote_address", "b")])]);
    let r = client.should_rate_limit(twice()).await.unwrap().into_inner();
    assert_eq!((r.overall_code(), remaining(&r)), (Code::Ok, vec![0, 0]));
    assert_eq!(codes(&mut client, twice()).await.0, Code::OverLimit);

    // A descriptor over its limit whatever the count refuses the request; the others are only
    // looked at.
    let mut big = descriptor(&[("remote_address", "c")]);
    big.hits_addend = Some(UInt64Value { value: 3 });
    let r = client
        .should_rate_limit(request(vec![big, descriptor(&[("path", "/api/q")])]))
        .await
        .unwrap()
        .into_inner();
    let each: Vec<Code> = r.statuses.iter().map(|s| s.code()).collect();
    assert_eq!(
        (r.overall_code(), each, remaining(&r)),
        (Code::OverLimit, vec![Code::OverLimit, Code::Ok], vec![0, 5])
    );
    let r = client.should_rate_limit(request(vec![descriptor(&[("path", "/api/q")])])).await.unwrap();
    assert_eq!(remaining(&r.into_inner()), [4], "/api/q was not charged by the refused request");
}

const EVERY_ALGORITHM: &str = r#"
domain: edge
descriptors:
  - {key: algo, value: fixed_window, rate_limit: {unit: hour, requests_per_unit: 3}}
  - {key: algo, value: sliding_window_log, rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window_log}}
  - {key: algo, value: sliding_window_counter, rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window_counter}}
  - {key: algo, value: token_bucket, rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}}
  - {key: algo, value: gcra, rate_limit: {unit: hour, requests_per_unit: 3, algorithm: gcra, burst: 3}}
"#;

/// One request naming every algorithm, on the memory backend and on Redis: each admits 3 an
/// hour, all or nothing.
#[tokio::test]
async fn every_algorithm_on_memory_and_redis() {
    let redis = tollgate_testkit::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, EVERY_ALGORITHM).unwrap();
    let algorithms = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra"];
    for backend in [None, Some(redis.url())] {
        let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
        let mut args = vec!["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap()];
        if let Some(url) = &backend {
            args.extend(["--redis", url.as_str()]);
        }
        let exact = "[backend]\non_failure = \"closed\"\ntimeout = \"5s\"\n";
        let _server = Tollgate::start(exact, &args).await;
        let mut client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
        inside_window(3600, 5).await;
        let all = || request(algorithms.iter().map(|a| descriptor(&[("algo", a)])).collect());
        for left in [2, 1, 0] {
            let r = client.should_rate_limit(all()).await.unwrap().into_inner();
            assert_eq!(r.overall_code(), Code::Ok, "{backend:?}");
            assert!(r.statuses.iter().all(|s| s.limit_remaining == left), "{backend:?}: {:?}", r.statuses);
        }
        let (overall, each) = codes(&mut client, all()).await;
        assert_eq!((overall, each), (Code::OverLimit, vec![Code::OverLimit; 5]), "{backend:?}");
        // Alone, each still refuses: every one was charged exactly three times.
        for a in algorithms {
            let one = request(vec![descriptor(&[("algo", a)])]);
            assert_eq!(codes(&mut client, one).await.0, Code::OverLimit, "{backend:?} {a}");
        }
    }
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() {
    let (_server, mut client, _dir, _) = start().await;
    let mut no_domain = request(vec![descriptor(&[("k", "v")])]);
    no_domain.domain = String::new();
    let too_many = request((0..65).map(|i| descriptor(&[("k", &i.to_string())])).collect());
    let no_entries = request(vec![descriptor(&[])]);
    let long_value = request(vec![descriptor(&[("k", &"v".repeat(300))])]);
    let mut bad_unit = descriptor(&[("k", "v")]);
    bad_unit.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: 99 });
    for req in [no_domain, too_many, no_entries, long_value, request(vec![bad_unit])] {
        let err = client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    // The largest descriptor allowed is decided, not refused for its key's length.
    let entries: Vec<(String, String)> = (0..16).map(|i| (format!("k{i}"), "v".repeat(256))).collect();
    let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut big = descriptor(&pairs);
    big.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: Unit::Hour as i32 });
    assert_eq!(codes(&mut client, request(vec![big.clone()])).await.0, Code::Ok);
    assert_eq!(codes(&mut client, request(vec![big])).await.0, Code::OverLimit);
    // An unknown domain limits nothing.
    let mut other = request(vec![descriptor(&[("remote_address", "x")])]);
    other.domain = "elsewhere".into();
    assert_eq!(codes(&mut client, other).await, (Code::Ok, vec![Code::Ok]));
}

#[tokio::test]
async fn the_standard_health_service_answers_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let port = tollgate_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let _server = Tollgate::start("", &["--grpc-listen", &listen]).await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{listen}")).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn the_yaml_is_reloaded_and_a_broken_one_refused() {
    let (server, mut client, dir, _) = start().await;
    let yaml = dir.path().join("edge.yaml");
    let one = || request(vec![descriptor(&[("reloaded", "x")])]);
    assert_eq!(codes(&mut client, one()).await.0, Code::Ok);
    let limited =
        "domain: edge\ndescriptors:\n  - key: reloaded\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    std::fs::write(dir.path().join("edge.yaml.new"), limited).unwrap();
    std::fs::rename(dir.path().join("edge.yaml.new"), &yaml).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = client.should_rate_limit(one()).await.unwrap().into_inner();
        if r.statuses[0].current_limit.is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not reloaded:\n{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(codes(&mut client, one()).await.0, Code::OverLimit);

    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: reloaded\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !server.logs().contains("Envoy configuration reload refused") {
        assert!(std::time::Instant::now() < deadline, "{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(codes(&mut client, one()).await.0, Code::OverLimit, "the last good configuration stays");
}

#[tokio::test]
async fn response_headers_report_the_most_restrictive_descriptor_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let args = [
        "--grpc-listen",
        listen.as_str(),
        "--envoy-config",
        yaml.to_str().unwrap(),
        "--envoy-response-headers",
    ];
    let _server = Tollgate::start("", &args).await;
    let mut client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 5).await;
    let req = request(vec![descriptor(&[("path", "/api/h")]), descriptor(&[("remote_address", "h")])]);
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    let headers: Vec<(String, String)> =
        r.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
    assert_eq!(
        headers[0],
        ("x-ratelimit-limit".to_owned(), "2, 2;w=3600".to_owned()),
        "remote_address has 1 left of 2"
    );
    assert_eq!(headers[1], ("x-ratelimit-remaining".to_owned(), "1".to_owned()));
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!(headers[2].0 == "x-ratelimit-reset" && (1..=3600).contains(&reset));
    // Off by default.
    let (_plain, mut plain_client, _d, _) = start().await;
    let r = plain_client
        .should_rate_limit(request(vec![descriptor(&[("path", "/api/h")])]))
        .await
        .unwrap()
        .into_inner();
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn post_json_speaks_the_same_request() {
    let (server, _client, _dir, _) = start().await;
    let body = serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "j"}]}]});
    let r = server.post("/json", &body).await;
    assert_eq!(r.status(), 200);
    let answer: serde_json::Value = r.json().await.unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 2, "unit": "HOUR"})
    );
    assert_eq!(answer["statuses"][0]["limitRemaining"], 1);
    assert!(answer["statuses"][0]["durationUntilReset"].as_str().unwrap().ends_with('s'));
    server.post("/json", &body).await;
    let r = server.post("/json", &body).await;
    assert_eq!(r.status(), 429);
    let answer: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (answer["overallCode"].as_str(), answer["statuses"][0]["code"].as_str()),
        (Some("OVER_LIMIT"), Some("OVER_LIMIT"))
    );

    // Overrides and hits by the same names; mistakes are problems.
    let over = serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "k", "value": "v"}],
        "limit": {"requestsPerUnit": 1, "unit": "MINUTE"}, "hitsAddend": 2}]});
    assert_eq!(server.post("/json", &over).await.status(), 429, "2 hits against 1 a minute");
    for (bad, field) in [
        (serde_json::json!({"domain": "edge", "descriptors": [{"entries": []}]}), "descriptors"),
        (
            serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "k"}], "limit": {"requestsPerUnit": 1, "unit": "FORTNIGHT"}}]}),
            "descriptors",
        ),
        (serde_json::json!({"domain": "edge", "colour": 1}), "colour"),
        (serde_json::json!({"descriptors": []}), "domain"),
    ] {
        let r = server.post("/json", &bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        let problem: serde_json::Value = r.json().await.unwrap();
        assert_eq!(problem["field"], field, "{bad}: {problem}");
    }
}

/// The envoy-types crate's proto directory, from the cargo registry it was built from.
fn proto_dir() -> std::path::PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let registry = home.join("registry").join("src");
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(&registry)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|index| std::fs::read_dir(index.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("envoy-types-")))
        .map(|p| p.join("proto"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no envoy-types protos under {}", registry.display()))
}

#[tokio::test]
async fn a_python_grpcio_client_speaks_the_same_wire() {
    // Debian's python3 with python3-grpcio and python3-grpc-tools (scripts/test installs them).
    let python = "/usr/bin/python3";
    let probe = std::process::Command::new(python).args(["-c", "import grpc, grpc_tools"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "this test needs Python's grpcio and grpc-tools{}: apt-get install python3-grpcio python3-grpc-tools, \
         or run scripts/test, which does",
        if std::env::var("CI").as_deref() == Ok("true") { " (CI=true)" } else { "" }
    );
    let (_server, _client, dir, listen) = start().await;
    let out = dir.path().join("py");
    std::fs::create_dir_all(&out).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/envoy_wire.py");
    let result = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .arg(proto_dir())
            .arg(&listen)
            .arg(&out)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success() && stdout.trim() == "ok", "python client:\n{stdout}\n{stderr}");
}
