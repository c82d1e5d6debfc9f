//! The Envoy rate-limit service over gRPC, called by a tonic client over loopback, configured by
//! an envoyproxy/ratelimit-style YAML file: each test pins an answer envoyproxy/ratelimit gives
//! (its `src/service/ratelimit.go` and `src/config/config_impl.go`), or Tollgate's option.

mod common;

use std::time::Duration;

use common::{Tollgate, eventually, inside_window};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

const YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
    metadata: {owner: edge, nested: {a: 1}, tags: [x, 2]}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 1, name: login}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /users/*/orders
    rate_limit: {unit: HOUR, requests_per_unit: 1}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
    metadata: {unlimited: never sent}
  - key: plan
    value: trial
    rate_limit: {unit: hour, requests_per_unit: 1}
    shadow_mode: true
    metadata: {owner: trial, nested: {a: 9, b: true}}
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
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: batch
    value: nightly
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: batch
    value: weekly
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
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

fn with_limit(mut d: RateLimitDescriptor, requests_per_unit: u32, unit: Unit) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride { requests_per_unit, unit: unit as i32 });
    d
}

fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: hits });
    d
}

async fn start_with(
    extra: &[&str],
) -> (Tollgate, RateLimitServiceClient<Channel>, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let port = tollgate_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap()];
    args.extend(extra);
    let server = Tollgate::start("", &args).await;
    let client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 5).await;
    (server, client, dir, listen)
}

async fn start() -> (Tollgate, RateLimitServiceClient<Channel>, tempfile::TempDir, String) {
    start_with(&[]).await
}

/// Codes of one request's statuses, and its overall code.
async fn codes(client: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> (Code, Vec<Code>) {
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    (r.overall_code(), r.statuses.iter().map(|s| s.code()).collect())
}

/// Each status's code and `limit_remaining`, `None` where it has no current limit.
type Each = Vec<(Code, Option<u32>)>;

/// One request's overall code, and each status's code and remaining.
async fn answer(client: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> (Code, Each) {
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    let each =
        r.statuses.iter().map(|s| (s.code(), s.current_limit.as_ref().map(|_| s.limit_remaining))).collect();
    (r.overall_code(), each)
}

#[tokio::test]
async fn descriptors_match_and_answer_as_upstream() {
    let (_server, mut client, _dir, _) = start().await;
    let ip = |v: &str| request(vec![descriptor(&[("remote_address", v)])]);
    assert_eq!(answer(&mut client, ip("10.0.0.1")).await, (Code::Ok, vec![(Code::Ok, Some(1))]));
    let r = client.should_rate_limit(ip("10.0.0.1")).await.unwrap().into_inner();
    let status = &r.statuses[0];
    assert_eq!((status.code(), status.limit_remaining), (Code::Ok, 0));
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (2, Unit::Hour));
    let reset = status.duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 3600, "{reset:?}");
    // Over the limit, nothing remains (upstream answers 0, not what the refused hits left).
    assert_eq!(
        answer(&mut client, ip("10.0.0.1")).await,
        (Code::OverLimit, vec![(Code::OverLimit, Some(0))])
    );
    assert_eq!(codes(&mut client, ip("10.0.0.2")).await.0, Code::Ok, "each value has its own count");

    // Wildcards, at the end of a value or in its middle, each value counted apart; no match
    // at all is OK without a current limit.
    let path = |p: &str| request(vec![descriptor(&[("path", p)])]);
    let r = client.should_rate_limit(path("/api/orders")).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 5);
    assert_eq!(answer(&mut client, path("/users/7/orders")).await, (Code::Ok, vec![(Code::Ok, Some(0))]));
    assert_eq!(codes(&mut client, path("/users/7/orders")).await.0, Code::OverLimit);
    assert_eq!(codes(&mut client, path("/users/8/orders")).await.0, Code::Ok);
    assert_eq!(answer(&mut client, path("/users/7/carts")).await, (Code::Ok, vec![(Code::Ok, None)]));
    assert_eq!(answer(&mut client, path("/nowhere")).await, (Code::Ok, vec![(Code::Ok, None)]));
    // Unlimited: OK with u32::MAX remaining and no current limit, every time.
    for _ in 0..5 {
        let r = client.should_rate_limit(path("/health")).await.unwrap().into_inner();
        let s = &r.statuses[0];
        assert_eq!((s.code(), s.limit_remaining, s.current_limit.is_none()), (Code::Ok, u32::MAX, true));
    }
}

#[tokio::test]
async fn a_block_list_refuses_every_request() {
    let (_server, mut client, _dir, _) = start().await;
    let blocked = || request(vec![descriptor(&[("remote_address", "50.0.0.5")])]);
    for _ in 0..3 {
        let r = client.should_rate_limit(blocked()).await.unwrap().into_inner();
        let s = &r.statuses[0];
        assert_eq!((r.overall_code(), s.code(), s.limit_remaining), (Code::OverLimit, Code::OverLimit, 0));
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit()), (0, Unit::Hour));
        let reset = s.duration_until_reset.as_ref().unwrap();
        assert!(reset.seconds > 0 && reset.seconds <= 3600, "{reset:?}");
    }
    // Checking without a hit refuses too.
    let peek = request(vec![with_hits(descriptor(&[("remote_address", "50.0.0.5")]), 0)]);
    assert_eq!(codes(&mut client, peek).await.0, Code::OverLimit);
}

#[tokio::test]
async fn hits_addend_shadow_mode_and_replaces() {
    let (_server, mut client, _dir, _) = start().await;
    // Request-level hits: 4 of /api's 5.
    let mut req = request(vec![descriptor(&[("path", "/api/x")])]);
    req.hits_addend = 4;
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // Descriptor-level hits 0: a check that counts nothing.
    for _ in 0..3 {
        let d = with_hits(descriptor(&[("path", "/api/x")]), 0);
        assert_eq!(answer(&mut client, request(vec![d])).await, (Code::Ok, vec![(Code::Ok, Some(1))]));
    }
    // More hits than the limit holds: over the limit, nothing remaining.
    let d = with_hits(descriptor(&[("path", "/api/y")]), 6);
    assert_eq!(
        answer(&mut client, request(vec![d])).await,
        (Code::OverLimit, vec![(Code::OverLimit, Some(0))])
    );

    // Shadow mode: counted, never refusing; past its limit it reports 0 remaining.
    let trial = || request(vec![descriptor(&[("plan", "trial")])]);
    assert_eq!(answer(&mut client, trial()).await, (Code::Ok, vec![(Code::Ok, Some(0))]));
    for _ in 0..2 {
        assert_eq!(answer(&mut client, trial()).await, (Code::Ok, vec![(Code::Ok, Some(0))]));
    }

    // `login` (1 an hour) is replaced by the gold tier's limit when both apply: not counted.
    let both =
        || request(vec![descriptor(&[("path", "/login")]), descriptor(&[("user", "u1"), ("tier", "gold")])]);
    for left in [9, 8, 7] {
        assert_eq!(
            answer(&mut client, both()).await,
            (Code::Ok, vec![(Code::Ok, None), (Code::Ok, Some(left))])
        );
    }
    let login = || request(vec![descriptor(&[("path", "/login")])]);
    assert_eq!(codes(&mut client, login()).await.0, Code::Ok, "alone, login applies, and was never charged");
    assert_eq!(codes(&mut client, login()).await.0, Code::OverLimit);

    // Overall: over the limit when any descriptor is.
    let mixed = request(vec![descriptor(&[("path", "/login")]), descriptor(&[("path", "/api/z")])]);
    assert_eq!(codes(&mut client, mixed).await, (Code::OverLimit, vec![Code::OverLimit, Code::Ok]));
}

#[tokio::test]
async fn a_requests_own_limit_applies_only_in_a_known_domain() {
    let (_server, mut client, _dir, _) = start().await;
    // In a known domain it applies to any descriptor, even one the file does not name.
    let unknown_key = || request(vec![with_limit(descriptor(&[("nowhere", "x")]), 1, Unit::Day)]);
    assert_eq!(answer(&mut client, unknown_key()).await, (Code::Ok, vec![(Code::Ok, Some(0))]));
    let r = client.should_rate_limit(unknown_key()).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::OverLimit);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (1, Unit::Day));
    // And it replaces the file's limit, an unlimited one included.
    let health = || request(vec![with_limit(descriptor(&[("path", "/health")]), 1, Unit::Hour)]);
    assert_eq!(codes(&mut client, health()).await.0, Code::Ok);
    assert_eq!(codes(&mut client, health()).await.0, Code::OverLimit);
    // A limit of 0 refuses.
    let zero = request(vec![with_limit(descriptor(&[("remote_address", "z")]), 0, Unit::Hour)]);
    assert_eq!(answer(&mut client, zero).await, (Code::OverLimit, vec![(Code::OverLimit, Some(0))]));
    // In an unknown domain it is ignored: nothing is limited.
    for _ in 0..3 {
        let mut other = request(vec![with_limit(descriptor(&[("k", "v")]), 1, Unit::Day)]);
        other.domain = "elsewhere".into();
        assert_eq!(answer(&mut client, other).await, (Code::Ok, vec![(Code::Ok, None)]));
    }
}

#[tokio::test]
async fn each_descriptor_is_charged_on_its_own_by_default() {
    let (_server, mut client, _dir, _) = start().await;
    let both = || request(vec![descriptor(&[("remote_address", "a")]), descriptor(&[("path", "/login")])]);
    assert_eq!(answer(&mut client, both()).await, (Code::Ok, vec![(Code::Ok, Some(1)), (Code::Ok, Some(0))]));
    // /login is spent: the request is refused, and the address is charged all the same, as
    // upstream charges it.
    assert_eq!(
        answer(&mut client, both()).await,
        (Code::OverLimit, vec![(Code::Ok, Some(0)), (Code::OverLimit, Some(0))])
    );
    let alone = request(vec![descriptor(&[("remote_address", "a")])]);
    assert_eq!(codes(&mut client, alone).await.0, Code::OverLimit, "the address was charged");

    // The same counter named twice: charged once per descriptor, in order.
    let twice =
        || request(vec![descriptor(&[("remote_address", "b")]), descriptor(&[("remote_address", "b")])]);
    assert_eq!(
        answer(&mut client, twice()).await,
        (Code::Ok, vec![(Code::Ok, Some(1)), (Code::Ok, Some(0))])
    );
    assert_eq!(codes(&mut client, twice()).await, (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit]));
    // Two hits on a counter with one left: the first descriptor's hit fits, the second's not.
    let three = request(vec![
        descriptor(&[("remote_address", "b2")]),
        with_hits(descriptor(&[("remote_address", "b2")]), 2),
    ]);
    assert_eq!(
        answer(&mut client, three).await,
        (Code::OverLimit, vec![(Code::Ok, Some(1)), (Code::OverLimit, Some(0))])
    );

    // A descriptor over its limit whatever the count is refused alone; the others are charged.
    let big = with_hits(descriptor(&[("remote_address", "c")]), 3);
    let r = answer(&mut client, request(vec![big, descriptor(&[("path", "/api/q")])])).await;
    assert_eq!(r, (Code::OverLimit, vec![(Code::OverLimit, Some(0)), (Code::Ok, Some(4))]));
}

/// Tollgate's option: a request one descriptor refuses is charged to none of them.
#[tokio::test]
async fn all_or_nothing_is_an_option() {
    let (_server, mut client, _dir, _) = start_with(&["--envoy-all-or-nothing"]).await;
    let both = || request(vec![descriptor(&[("remote_address", "a")]), descriptor(&[("path", "/login")])]);
    assert_eq!(answer(&mut client, both()).await, (Code::Ok, vec![(Code::Ok, Some(1)), (Code::Ok, Some(0))]));
    // /login is spent: the request is refused, and the address's hour is not charged for it.
    assert_eq!(
        answer(&mut client, both()).await,
        (Code::OverLimit, vec![(Code::Ok, Some(1)), (Code::OverLimit, Some(0))])
    );
    let alone = request(vec![descriptor(&[("remote_address", "a")])]);
    assert_eq!(
        answer(&mut client, alone).await.1,
        [(Code::Ok, Some(0))],
        "one unit was left for the address"
    );

    // The same counter named twice asks it for both hits at once.
    let twice =
        || request(vec![descriptor(&[("remote_address", "b")]), descriptor(&[("remote_address", "b")])]);
    assert_eq!(
        answer(&mut client, twice()).await,
        (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(0))])
    );
    assert_eq!(codes(&mut client, twice()).await.0, Code::OverLimit);

    // A descriptor over its limit whatever the count, or a block list, refuses the request;
    // the others are only looked at.
    for refusing in
        [with_hits(descriptor(&[("remote_address", "c")]), 3), descriptor(&[("remote_address", "50.0.0.5")])]
    {
        let r = answer(&mut client, request(vec![refusing, descriptor(&[("path", "/api/q")])])).await;
        assert_eq!(r, (Code::OverLimit, vec![(Code::OverLimit, Some(0)), (Code::Ok, Some(5))]));
    }
    let r = client.should_rate_limit(request(vec![descriptor(&[("path", "/api/q")])])).await.unwrap();
    assert_eq!(
        r.into_inner().statuses[0].limit_remaining,
        4,
        "/api/q was not charged by the refused requests"
    );

    // Shadow-mode descriptors are decided alone and block nothing.
    let with_trial = || request(vec![descriptor(&[("plan", "trial")]), descriptor(&[("path", "/api/s")])]);
    assert_eq!(
        answer(&mut client, with_trial()).await,
        (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(4))])
    );
    assert_eq!(
        answer(&mut client, with_trial()).await,
        (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(3))])
    );
}

/// Upstream's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a request with any descriptor over its
/// limit, shadow and quota-mode ones included, is charged to none.
#[tokio::test]
async fn stop_increment_when_over_limit_is_an_option() {
    let (_server, mut client, _dir, _) = start_with(&["--envoy-stop-increment-when-over-limit"]).await;
    let both = || request(vec![descriptor(&[("remote_address", "a")]), descriptor(&[("path", "/login")])]);
    assert_eq!(answer(&mut client, both()).await, (Code::Ok, vec![(Code::Ok, Some(1)), (Code::Ok, Some(0))]));
    assert_eq!(
        answer(&mut client, both()).await,
        (Code::OverLimit, vec![(Code::Ok, Some(1)), (Code::OverLimit, Some(0))])
    );
    // A shadow-mode descriptor over its limit answers OK, and stops the others' charges.
    let with_trial = || request(vec![descriptor(&[("plan", "trial")]), descriptor(&[("path", "/api/s")])]);
    assert_eq!(
        answer(&mut client, with_trial()).await,
        (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(4))])
    );
    for _ in 0..2 {
        assert_eq!(
            answer(&mut client, with_trial()).await,
            (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(4))]),
            "/api/s is not charged while the trial is over"
        );
    }
    // So does a quota-mode one.
    let with_quota = || request(vec![descriptor(&[("batch", "nightly")]), descriptor(&[("path", "/api/t")])]);
    assert_eq!(
        answer(&mut client, with_quota()).await,
        (Code::Ok, vec![(Code::Ok, Some(0)), (Code::Ok, Some(4))])
    );
    assert_eq!(
        answer(&mut client, with_quota()).await,
        (Code::OverLimit, vec![(Code::OverLimit, Some(0)), (Code::Ok, Some(4))])
    );
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
async fn shared_thresholds_and_quota_mode() {
    let (_server, mut client, _dir, _) = start().await;
    // Values matching a share_threshold wildcard spend one counter.
    let file = |f: &str| request(vec![descriptor(&[("files", f)])]);
    assert_eq!(answer(&mut client, file("files/a.pdf")).await.1, [(Code::Ok, Some(1))]);
    assert_eq!(answer(&mut client, file("files/b.csv")).await.1, [(Code::Ok, Some(0))]);
    assert_eq!(codes(&mut client, file("files/c.txt")).await.0, Code::OverLimit);

    // Quota mode: a descriptor over its limit refuses the request only when every quota-mode
    // descriptor of it is over.
    let batch = |names: &[&str]| request(names.iter().map(|n| descriptor(&[("batch", n)])).collect());
    assert_eq!(codes(&mut client, batch(&["nightly"])).await, (Code::Ok, vec![Code::Ok]));
    assert_eq!(
        codes(&mut client, batch(&["nightly", "weekly"])).await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok]),
        "one quota left: OK"
    );
    assert_eq!(
        codes(&mut client, batch(&["nightly", "weekly"])).await,
        (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit])
    );
    assert_eq!(codes(&mut client, batch(&["nightly"])).await.0, Code::OverLimit);
}

#[tokio::test]
async fn global_quota_mode_refuses_only_when_every_descriptor_is_over() {
    let (_server, mut client, _dir, _) = start_with(&["--envoy-quota-mode"]).await;
    let login = || descriptor(&[("path", "/login")]);
    assert_eq!(codes(&mut client, request(vec![login()])).await, (Code::Ok, vec![Code::Ok]));
    // Alone and over: every descriptor of the request is over.
    assert_eq!(codes(&mut client, request(vec![login()])).await, (Code::OverLimit, vec![Code::OverLimit]));
    // Beside one within its limit, or one no limit matches: OK, the status still says over.
    let ip = descriptor(&[("remote_address", "10.9.9.9")]);
    assert_eq!(
        codes(&mut client, request(vec![login(), ip])).await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok])
    );
    let nowhere = descriptor(&[("nowhere", "x")]);
    assert_eq!(
        codes(&mut client, request(vec![login(), nowhere])).await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok])
    );
    // An unlimited descriptor takes no part; a block list is over.
    let health = descriptor(&[("path", "/health")]);
    let blocked = descriptor(&[("remote_address", "50.0.0.5")]);
    assert_eq!(
        codes(&mut client, request(vec![login(), health, blocked])).await,
        (Code::OverLimit, vec![Code::OverLimit, Code::Ok, Code::OverLimit])
    );
}

#[tokio::test]
async fn empty_requests_and_descriptors() {
    let (_server, mut client, _dir, _) = start().await;
    // No descriptors at all: refused, as upstream refuses it.
    let err = client.should_rate_limit(request(vec![])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // A descriptor without entries matches nothing...
    assert_eq!(answer(&mut client, request(vec![descriptor(&[])])).await, (Code::Ok, vec![(Code::Ok, None)]));
    // ...but a limit of its own counts, under the domain alone.
    let own = || request(vec![with_limit(descriptor(&[]), 1, Unit::Hour)]);
    assert_eq!(codes(&mut client, own()).await.0, Code::Ok);
    assert_eq!(codes(&mut client, own()).await.0, Code::OverLimit);
    // An empty value is a value.
    let empty = || request(vec![descriptor(&[("remote_address", "")])]);
    assert_eq!(answer(&mut client, empty()).await.1, [(Code::Ok, Some(1))]);
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

/// `--envoy-reserve auto` on Redis: a hot descriptor is answered from reserved blocks (most
/// requests without a Redis call), never past its limit, and close to it; a sliding-window
/// descriptor beside it checks every request, and both are right.
#[tokio::test]
async fn reservations_answer_hot_descriptors_within_the_limit() {
    let redis = tollgate_testkit::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    let hot = r#"
domain: edge
descriptors:
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 400}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window_counter}
"#;
    std::fs::write(&yaml, hot).unwrap();
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let url = redis.url();
    let args = ["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap(), "--redis", &url];
    let config = "[backend]\non_failure = \"closed\"\ntimeout = \"5s\"\n";
    let server = Tollgate::start(config, &[&args[..], &["--envoy-reserve", "auto"]].concat()).await;
    let mut client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 5).await;
    let (mut api, mut user) = (0, 0);
    for _ in 0..500 {
        let req = request(vec![descriptor(&[("api", "all")]), descriptor(&[("user", "u1")])]);
        let (_, each) = codes(&mut client, req).await;
        api += u32::from(each[0] == Code::Ok);
        user += u32::from(each[1] == Code::Ok);
    }
    assert_eq!(user, 100, "the sliding-window descriptor, exact");
    // One instance holds at most a quarter of the limit idle (the blocks shrink near the end).
    assert!((300..=400).contains(&api), "{api} of 500 admitted under a limit of 400");
    // A hot descriptor alone: most requests answered without Redis.
    let calls = |redis: &tollgate_testkit::RedisServer| {
        ["evalsha", "eval", "fcall"].iter().map(|c| redis.command_stat(c, "calls")).sum::<u64>()
    };
    let before = calls(&redis);
    for _ in 0..300 {
        let (overall, _) = codes(&mut client, request(vec![descriptor(&[("api", "solo")])])).await;
        assert_eq!(overall, Code::Ok);
    }
    let script_calls = calls(&redis) - before;
    assert!(script_calls < 40, "{script_calls} Redis script calls for 300 requests of a hot descriptor");
    let served = server.metric("tollgate_reserved_decisions_total{policy=\"edge\"}").await;
    assert!(served > 400.0, "{served} decisions from blocks");
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() {
    let (_server, mut client, _dir, _) = start().await;
    let mut no_domain = request(vec![descriptor(&[("k", "v")])]);
    no_domain.domain = String::new();
    let too_many = request((0..65).map(|i| descriptor(&[("k", &i.to_string())])).collect());
    let no_descriptors = request(vec![]);
    let long_value = request(vec![descriptor(&[("k", &"v".repeat(300))])]);
    let mut bad_unit = descriptor(&[("k", "v")]);
    bad_unit.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: 99 });
    for req in [no_domain, too_many, no_descriptors, long_value, request(vec![bad_unit])] {
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
async fn the_standard_health_service_follows_the_healthcheck() {
    use tokio::io::AsyncWriteExt;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    // Unhealthy until a domain is loaded (upstream's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    let dir = tempfile::tempdir().unwrap();
    let port = tollgate_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = dir.path().to_str().unwrap();
    let mut server = Tollgate::start(
        "",
        &["--grpc-listen", &listen, "--envoy-config", config, "--envoy-health-needs-config"],
    )
    .await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{listen}")).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let names = ["", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"];
    let statuses = |mut health: HealthClient<Channel>| async move {
        let mut all = Vec::new();
        for service in names {
            let r = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
            all.push(r.status());
        }
        all
    };
    assert_eq!(server.get_text("/healthcheck").await.0, 500);
    assert_eq!(statuses(health.clone()).await, [ServingStatus::NotServing; 3]);

    // A domain arrives: both turn healthy.
    std::fs::write(dir.path().join("edge.yaml"), YAML).unwrap();
    let serving = eventually(Duration::from_secs(10), || async {
        statuses(health.clone()).await == [ServingStatus::Serving; 3]
    });
    assert!(serving.await, "the gRPC health service never turned SERVING");
    assert_eq!(server.get_text("/healthcheck").await, (200, "OK".into()));
    let unknown = health.check(HealthCheckRequest { service: "nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // SIGTERM: NOT_SERVING at once, while a request in flight (its body still coming) holds
    // the process up.
    let mut held = tokio::net::TcpStream::connect(server.base.trim_start_matches("http://")).await.unwrap();
    held.write_all(
        b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 64\r\n\r\n{",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.signal_term();
    let failing = eventually(Duration::from_secs(5), || async {
        statuses(health.clone()).await == [ServingStatus::NotServing; 3]
    });
    assert!(failing.await, "the gRPC health service kept SERVING after SIGTERM");
    assert!(server.running(), "the process should still be finishing the held request");
    drop(held);
}

/// The limit the file gives `reloaded=x` now (peeked), `None` when none applies.
async fn reloaded_limit(client: &mut RateLimitServiceClient<Channel>) -> Option<u32> {
    let peek = request(vec![with_hits(descriptor(&[("reloaded", "x")]), 0)]);
    let r = client.should_rate_limit(peek).await.unwrap().into_inner();
    r.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit)
}

/// Replaces `path` as an editor or `kubectl cp` would: a new file renamed over the old.
fn replace(path: &std::path::Path, text: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, path).unwrap();
}

fn reloaded_yaml(requests_per_unit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: reloaded\n    rate_limit: {{unit: hour, requests_per_unit: {requests_per_unit}}}\n"
    )
}

#[tokio::test]
async fn the_yaml_is_reloaded_and_a_broken_one_refused() {
    let (server, mut client, dir, _) = start().await;
    let yaml = dir.path().join("edge.yaml");
    let one = || request(vec![descriptor(&[("reloaded", "x")])]);
    assert_eq!(answer(&mut client, one()).await, (Code::Ok, vec![(Code::Ok, None)]));

    // A block list added, then lifted.
    replace(&yaml, &reloaded_yaml(0));
    let blocked = eventually(Duration::from_secs(10), || async {
        reloaded_limit(&mut client.clone()).await == Some(0)
    });
    assert!(blocked.await, "not reloaded:\n{}", server.logs());
    assert_eq!(codes(&mut client, one()).await.0, Code::OverLimit);
    replace(&yaml, &reloaded_yaml(1));
    let lifted = eventually(Duration::from_secs(10), || async {
        reloaded_limit(&mut client.clone()).await == Some(1)
    });
    assert!(lifted.await, "not reloaded:\n{}", server.logs());
    assert_eq!(codes(&mut client, one()).await.0, Code::Ok);
    assert_eq!(codes(&mut client, one()).await.0, Code::OverLimit);

    // A file upstream refuses keeps the last good configuration.
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: reloaded\n    rate_limit: {unit: day, unlimited: true}\n",
    )
    .unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        server.logs().contains("Envoy configuration reload refused")
    });
    assert!(refused.await, "{}", server.logs());
    assert!(server.logs().contains("should not specify rate limit unit when unlimited"), "{}", server.logs());
    assert_eq!(reloaded_limit(&mut client).await, Some(1), "the last good configuration stays");
    assert_eq!(codes(&mut client, one()).await.0, Code::OverLimit);
}

/// Writes to other files of the YAML's directory (a database, a log) wake the watcher but do
/// not reload the configuration: only a change of its own text does.
#[tokio::test]
async fn writes_beside_the_yaml_do_not_reload_it() {
    let (server, mut client, dir, _) = start().await;
    let reloads = || server.logs().matches("Envoy configuration reloaded").count();
    for n in 0..5 {
        std::fs::write(dir.path().join("beside.log"), format!("line {n}\n")).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reloads(), 0, "{}", server.logs());
    // The watcher is alive: a change of the YAML itself is applied, once.
    replace(&dir.path().join("edge.yaml"), &reloaded_yaml(3));
    let applied = eventually(Duration::from_secs(10), || async {
        reloaded_limit(&mut client.clone()).await == Some(3)
    });
    assert!(applied.await, "not reloaded:\n{}", server.logs());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reloads(), 1, "{}", server.logs());
    assert_eq!(reloaded_limit(&mut client).await, Some(3));
}

/// A YAML that cannot be read is refused once, not again at every write beside it.
#[tokio::test]
async fn a_missing_yaml_is_refused_once() {
    let (server, mut client, dir, _) = start().await;
    std::fs::remove_file(dir.path().join("edge.yaml")).unwrap();
    let refused = eventually(Duration::from_secs(10), || async { server.logs().contains("reload refused") });
    assert!(refused.await, "{}", server.logs());
    for n in 0..4 {
        std::fs::write(dir.path().join("beside.log"), format!("line {n}\n")).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.logs().matches("reload refused").count(), 1, "{}", server.logs());
    // The last good configuration still answers.
    assert_eq!(answer(&mut client, request(vec![descriptor(&[("reloaded", "x")])])).await.0, Code::Ok);
}

/// A Kubernetes ConfigMap mounted as `--envoy-config DIR`: kubelet swaps the `..data` symlink
/// to a new directory in one rename; the new files apply, read once (the `..` copies are
/// skipped); a subfolder's files are read and watched too.
#[cfg(unix)]
#[tokio::test]
async fn a_config_map_swap_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("config");
    let version = |n: u32, limit: u32| {
        let data = mount.join(format!("..2026_01_01_00_00_0{n}.1"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("edge.yaml"), reloaded_yaml(limit)).unwrap();
        let link = mount.join("..data_tmp");
        std::os::unix::fs::symlink(data.file_name().unwrap(), &link).unwrap();
        std::fs::rename(&link, mount.join("..data")).unwrap();
    };
    std::fs::create_dir_all(&mount).unwrap();
    version(1, 1);
    std::os::unix::fs::symlink("..data/edge.yaml", mount.join("edge.yaml")).unwrap();
    std::fs::create_dir_all(mount.join("local")).unwrap();
    std::fs::write(mount.join("local/extra.yaml"), "domain: extra\n").unwrap();

    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let server =
        Tollgate::start("", &["--grpc-listen", &listen, "--envoy-config", mount.to_str().unwrap()]).await;
    let mut client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    assert_eq!(reloaded_limit(&mut client).await, Some(1));

    version(2, 7);
    let swapped = eventually(Duration::from_secs(10), || async {
        reloaded_limit(&mut client.clone()).await == Some(7)
    });
    assert!(swapped.await, "not reloaded:\n{}", server.logs());
    // A file in a subfolder changing is seen too.
    std::fs::write(mount.join("local/extra.yaml"), "domain: edge\n").unwrap();
    let refused =
        eventually(Duration::from_secs(10), || async { server.logs().contains("duplicate domain 'edge'") });
    assert!(refused.await, "{}", server.logs());
    assert_eq!(reloaded_limit(&mut client).await, Some(7), "the last good configuration stays");
}

#[tokio::test]
async fn response_headers_report_the_most_restrictive_descriptor_when_enabled() {
    let (_server, mut client, _dir, _) = start_with(&["--envoy-response-headers"]).await;
    let headers = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect::<Vec<_>>()
    };
    let reset_of = |h: &[(String, String)]| {
        assert_eq!(h[2].0, "RateLimit-Reset");
        h[2].1.parse::<u64>().unwrap()
    };
    // Upstream's names and values: the limit alone, what remains, seconds to the reset.
    let req = || request(vec![descriptor(&[("path", "/api/h")]), descriptor(&[("remote_address", "h")])]);
    let r = client.should_rate_limit(req()).await.unwrap().into_inner();
    let h = headers(&r);
    assert_eq!(
        h[..2],
        [("RateLimit-Limit".into(), "2".into()), ("RateLimit-Remaining".into(), "1".into())],
        "remote_address has 1 left of 2"
    );
    assert!((1..=3600).contains(&reset_of(&h)), "{h:?}");
    // A refusing descriptor is reported, even after one left at 0 that admits (upstream's
    // choice); the unlimited and the unmatched never are.
    client.should_rate_limit(req()).await.unwrap();
    let req =
        request(vec![descriptor(&[("path", "/users/9/orders")]), descriptor(&[("remote_address", "h")])]);
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    let each: Vec<(Code, u32)> = r.statuses.iter().map(|s| (s.code(), s.limit_remaining)).collect();
    assert_eq!(each, [(Code::Ok, 0), (Code::OverLimit, 0)]);
    assert_eq!(
        headers(&r)[..2],
        [("RateLimit-Limit".into(), "2".into()), ("RateLimit-Remaining".into(), "0".into())]
    );
    let free = request(vec![descriptor(&[("path", "/health")]), descriptor(&[("path", "/nowhere")])]);
    assert!(client.should_rate_limit(free).await.unwrap().into_inner().response_headers_to_add.is_empty());
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
        (serde_json::json!({"domain": "edge", "descriptors": []}), "descriptors"),
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

/// Runs `tests/python/envoy_wire.py` against `listen` (over TLS trusting `ca` when given):
/// Python grpcio, gRPC C-core underneath.
async fn python_wire(dir: &std::path::Path, listen: String, ca: Option<std::path::PathBuf>) {
    // Debian's python3 with python3-grpcio and python3-grpc-tools (scripts/test installs them).
    let python = "/usr/bin/python3";
    let probe = std::process::Command::new(python).args(["-c", "import grpc, grpc_tools"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "this test needs Python's grpcio and grpc-tools{}: apt-get install python3-grpcio python3-grpc-tools, \
         or run scripts/test, which does",
        if std::env::var("CI").as_deref() == Ok("true") { " (CI=true)" } else { "" }
    );
    let out = dir.join("py");
    std::fs::create_dir_all(&out).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/envoy_wire.py");
    let result = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .arg(proto_dir())
            .arg(&listen)
            .arg(&out)
            .args(ca)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success() && stdout.trim() == "ok", "python client:\n{stdout}\n{stderr}");
}

#[tokio::test]
async fn a_python_grpcio_client_speaks_the_same_wire() {
    let (_server, _client, dir, listen) =
        start_with(&["--envoy-response-headers", "--envoy-response-dynamic-metadata"]).await;
    python_wire(dir.path(), listen, None).await;
}

#[tokio::test]
async fn a_python_grpcio_client_speaks_the_same_wire_over_tls() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: with rcgen's default name on both, OpenSSL takes the server's
    // certificate for a self-signed one.
    params.distinguished_name.push(rcgen::DnType::CommonName, "Tollgate test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("server.pem"), cert.pem()).unwrap();
    std::fs::write(path("server.key"), key.serialize_pem()).unwrap();
    std::fs::write(path("edge.yaml"), YAML).unwrap();
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let (yaml, cert, key) = (path("edge.yaml"), path("server.pem"), path("server.key"));
    let _server = Tollgate::start(
        "",
        &[
            "--grpc-listen",
            &listen,
            "--envoy-config",
            yaml.to_str().unwrap(),
            "--envoy-response-headers",
            "--envoy-response-dynamic-metadata",
            "--grpc-tls-cert",
            cert.to_str().unwrap(),
            "--grpc-tls-key",
            key.to_str().unwrap(),
        ],
    )
    .await;
    inside_window(3600, 5).await;
    python_wire(dir.path(), listen, Some(path("ca.pem"))).await;
}

/// A protobuf Struct as JSON, to compare whole.
fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(t)) => serde_json::json!(t),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
        }
    }
    s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect::<serde_json::Map<_, _>>().into()
}

#[tokio::test]
async fn dynamic_metadata_carries_the_request_and_the_admitting_descriptors_metadata() {
    let (server, mut client, _dir, _) = start_with(&["--envoy-response-dynamic-metadata"]).await;
    let metadata = |r: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        struct_json(r.dynamic_metadata.as_ref().expect("dynamic metadata"))
    };
    let req = || {
        request(vec![
            descriptor(&[("remote_address", "m1")]),
            descriptor(&[("plan", "trial")]),
            descriptor(&[("path", "/health")]),
            with_hits(with_limit(descriptor(&[("k", "v")]), 5, Unit::Hour), 2),
        ])
    };
    let r = client.should_rate_limit(req()).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::Ok);
    // Upstream's fields; the first descriptor's value wins, maps are merged; the unlimited
    // descriptor and the request's own limit carry none.
    assert_eq!(
        metadata(r),
        serde_json::json!({
            "domain": "edge",
            "descriptors": [
                {"entries": ["remote_address=m1"]},
                {"entries": ["plan=trial"]},
                {"entries": ["path=/health"]},
                {"entries": ["k=v"], "limit": "requests_per_unit:5 unit:HOUR", "hitsAddend": 2.0},
            ],
            "metadata": {"owner": "edge", "nested": {"a": 1.0, "b": true}, "tags": ["x", 2.0]},
        })
    );
    // Over its limit, a descriptor's metadata is not sent; a shadow-mode one over its limit
    // admits, and is (remote_address admits 2 an hour; plan=trial, in shadow mode, 1).
    client.should_rate_limit(req()).await.unwrap();
    let r = client.should_rate_limit(req()).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].code(), Code::OverLimit);
    let m = metadata(r);
    assert_eq!(m["metadata"], serde_json::json!({"owner": "trial", "nested": {"a": 9.0, "b": true}}));
    assert!(m.get("hitsAddend").is_none(), "no hits_addend, none sent: {m}");
    let mut three = request(vec![descriptor(&[("path", "/nowhere")])]);
    three.hits_addend = 3;
    let m = metadata(client.should_rate_limit(three).await.unwrap().into_inner());
    assert_eq!(m["hitsAddend"], 3.0);
    assert!(m.get("metadata").is_none(), "no descriptor with metadata admitted: {m}");
    // POST /json answers it as protobuf's JSON mapping.
    let body = serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "m2"}]}]});
    let answer: serde_json::Value = server.post("/json", &body).await.json().await.unwrap();
    assert_eq!(answer["dynamicMetadata"]["metadata"]["owner"], "edge", "{answer}");
    assert_eq!(answer["dynamicMetadata"]["descriptors"][0]["entries"][0], "remote_address=m2");
    // Off by default.
    let (_plain, mut plain, _d, _) = start().await;
    let r = plain.should_rate_limit(req()).await.unwrap().into_inner();
    assert!(r.dynamic_metadata.is_none());
}

#[tokio::test]
async fn header_names_and_the_near_limit_ratio_are_settings() {
    let (server, mut client, _dir, _) = start_with(&[
        "--envoy-response-headers",
        "--envoy-limit-header",
        "X-Edge-Limit",
        "--envoy-remaining-header",
        "x-edge-left",
        "--envoy-reset-header",
        "X-Edge-Reset",
        "--envoy-near-limit-ratio",
        "0.5",
    ])
    .await;
    let req = || request(vec![descriptor(&[("path", "/api/near")])]);
    let r = client.should_rate_limit(req()).await.unwrap().into_inner();
    let keys: Vec<&str> = r.response_headers_to_add.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, ["X-Edge-Limit", "x-edge-left", "X-Edge-Reset"], "the names as given, case kept");
    assert_eq!(r.response_headers_to_add[0].value, "5");
    // 5 an hour at 0.5: near past floor(2.5) = 2 used, so from the 3rd hit (0.8: the 5th).
    let near = || server.metric("tollgate_envoy_near_limit");
    client.should_rate_limit(req()).await.unwrap();
    assert_eq!(near().await, 0.0);
    client.should_rate_limit(req()).await.unwrap();
    assert_eq!(near().await, 1.0);
}

#[test]
fn bad_header_names_and_ratios_are_refused_naming_the_setting() {
    let refused = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args(["--database", "sqlite::memory:"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} {env:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let long = "x".repeat(129);
    for (flag, bad) in [
        ("--envoy-limit-header", "Rate Limit"),
        ("--envoy-remaining-header", "x:y"),
        ("--envoy-reset-header", "Content-Length"),
        ("--envoy-limit-header", long.as_str()),
        ("--envoy-limit-header", ""),
        ("--envoy-near-limit-ratio", "0"),
        ("--envoy-near-limit-ratio", "1.5"),
        ("--envoy-near-limit-ratio", "NaN"),
    ] {
        let e = refused(&[flag, bad], &[]);
        assert!(e.contains(flag), "{flag} {bad:?}: {e}");
    }
    // From the environment, the flag is named too.
    let e = refused(&[], &[("TOLLGATE_ENVOY_NEAR_LIMIT_RATIO", "-1")]);
    assert!(e.contains("--envoy-near-limit-ratio"), "{e}");
    let e = refused(&[], &[("TOLLGATE_ENVOY_RESET_HEADER", "ratelimit-limit")]);
    assert!(e.contains("must name three different headers"), "{e}");
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_and_keeps_the_statuses() {
    let (server, mut client, _dir, _) =
        start_with(&["--envoy-shadow-mode", "--envoy-response-headers", "--envoy-response-dynamic-metadata"])
            .await;
    // The block list: each status as without the shadow mode, only the overall code is OK.
    let blocked =
        request(vec![descriptor(&[("remote_address", "50.0.0.5")]), descriptor(&[("path", "/nowhere")])]);
    let r = client.should_rate_limit(blocked).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::Ok);
    let each: Vec<(Code, u32)> = r.statuses.iter().map(|s| (s.code(), s.limit_remaining)).collect();
    assert_eq!(each, [(Code::OverLimit, 0), (Code::Ok, 0)]);
    let remaining = r.response_headers_to_add.iter().find(|h| h.key == "RateLimit-Remaining").unwrap();
    assert_eq!(remaining.value, "0", "the headers say what was refused");
    // A request's own limit of 0 too (upstream's code makes no exception for it).
    let zero = request(vec![with_limit(descriptor(&[("k", "z")]), 0, Unit::Hour)]);
    let r = client.should_rate_limit(zero).await.unwrap().into_inner();
    assert_eq!((r.overall_code(), r.statuses[0].code()), (Code::Ok, Code::OverLimit));
    // Counting goes on: the third hit of 2 an hour is over, and admitted.
    let ip = || request(vec![descriptor(&[("remote_address", "gs")])]);
    client.should_rate_limit(ip()).await.unwrap();
    client.should_rate_limit(ip()).await.unwrap();
    let r = client.should_rate_limit(ip()).await.unwrap().into_inner();
    assert_eq!((r.overall_code(), r.statuses[0].code()), (Code::Ok, Code::OverLimit));
    assert!(
        !r.dynamic_metadata.unwrap().fields.contains_key("metadata"),
        "a refused descriptor's metadata stays out"
    );
    assert_eq!(server.metric("tollgate_envoy_global_shadow_mode").await, 3.0);
    // POST /json: 200.
    let body = serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "gs"}]}]});
    assert_eq!(server.post("/json", &body).await.status(), 200);
}

#[tokio::test]
async fn healthcheck_and_rlconfig_as_upstream_serves_them() {
    let (server, _client, _dir, _) = start_with(&["--envoy-health-needs-config"]).await;
    assert_eq!(server.get_text("/healthcheck").await, (200, "OK".into()));
    let (code, dump) = server.get_text("/rlconfig").await;
    assert_eq!(code, 200);
    for line in [
        "edge.remote_address: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false\n",
        "edge.remote_address_50.0.0.5: unit=HOUR requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
        "edge.path_/health: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
        "edge.plan_trial: unit=HOUR requests_per_unit=1, shadow_mode: true, quota_mode: false\n",
        "edge.user.tier_gold: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false\n",
        "edge.batch_nightly: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: true\n",
    ] {
        assert!(dump.contains(line), "{line} missing from:\n{dump}");
    }
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: no domain, unhealthy; without it, healthy.
    let bare = Tollgate::start("", &["--envoy-health-needs-config"]).await;
    assert_eq!(bare.get_text("/healthcheck").await.0, 500);
    assert_eq!(bare.get_text("/rlconfig").await, (200, String::new()));

    // The backend: unhealthy until it first answers; then, by default, healthy whatever it
    // does (upstream's Redis component), or only while it answers with
    // --envoy-health-checks-backend (upstream's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION).
    let port = tollgate_testkit::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let default = Tollgate::start("", &["--redis", &url]).await;
    let active = Tollgate::start("", &["--redis", &url, "--envoy-health-checks-backend"]).await;
    assert_eq!(default.get_text("/healthcheck").await.0, 500);
    assert_eq!(active.get_text("/healthcheck").await.0, 500);
    let redis = tollgate_testkit::RedisServer::start_on(port);
    for server in [&default, &active] {
        let up =
            eventually(Duration::from_secs(10), || async { server.get_text("/healthcheck").await.0 == 200 });
        assert!(up.await, "{}", server.logs());
    }
    drop(redis);
    let down =
        eventually(Duration::from_secs(10), || async { active.get_text("/healthcheck").await.0 == 500 });
    assert!(down.await, "{}", active.logs());
    assert_eq!(default.get_text("/healthcheck").await, (200, "OK".into()));
}

/// The gRPC port answers `ShouldRateLimit` by its exact path without going through its router
/// (a shortcut for the hot method): the same method with a query string takes it too, while any
/// other path, of the same service or another, is still the router's, UNIMPLEMENTED.
#[tokio::test]
async fn only_should_rate_limit_itself_skips_the_grpc_router() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use tonic::codegen::http::uri::PathAndQuery;

    let (_server, _client, _dir, listen) = start().await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{listen}")).unwrap().connect().await.unwrap();
    let grpc = tonic::client::Grpc::new(channel);
    let call = |path: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            grpc.ready().await.unwrap();
            let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
            let req = request(vec![descriptor(&[("remote_address", "10.0.0.1")])]);
            grpc.unary(tonic::Request::new(req), PathAndQuery::from_static(path), codec).await
        }
    };
    let answered = call("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit?x=1").await.unwrap();
    // gRPC answers carry no Date header (the HTTP port's do).
    assert!(answered.metadata().get("date").is_none(), "{:?}", answered.metadata());
    assert_eq!(answered.into_inner().overall_code(), Code::Ok);
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/Other",
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit/more",
        "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit",
        "/other.Service/ShouldRateLimit",
    ] {
        let status = call(path).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}: {status:?}");
    }
}
