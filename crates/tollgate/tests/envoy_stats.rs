//! The Envoy service's hit counters under envoyproxy/ratelimit's Prometheus names
//! (`ratelimit_service_rate_limit_*{domain,key1,key2}`, as its `USE_PROMETHEUS` mapping exports
//! its `ratelimit.service.rate_limit.<domain>.<key path>.<stat>` stats), counted as its
//! `base_limiter.go` counts them, and bounded in number when a stranger chooses the values.

mod common;

use std::collections::BTreeMap;

use common::{Tollgate, inside_window};
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
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    descriptors:
      - key: tier
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: client
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: blocked
    value: x
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
"#;

fn descriptor(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        hits_addend: Some(UInt64Value { value: hits }),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: "edge".into(), descriptors, hits_addend: 0 }
}

async fn start(extra: &[&str]) -> (Tollgate, RateLimitServiceClient<Channel>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let mut args = vec!["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap()];
    args.extend(extra);
    let server = Tollgate::start("", &args).await;
    let client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 10).await;
    (server, client, dir)
}

/// One request's overall code.
async fn code(client: &mut RateLimitServiceClient<Channel>, descriptors: Vec<RateLimitDescriptor>) -> Code {
    client.should_rate_limit(request(descriptors)).await.unwrap().into_inner().overall_code()
}

/// The samples of `/metrics` whose name starts with `prefix`: `name{labels}` to value.
async fn samples(server: &Tollgate, prefix: &str) -> BTreeMap<String, f64> {
    let (status, text) = server.get_text("/metrics").await;
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// The five upstream counters of one label set: total, over, near, within, shadow.
fn expect(into: &mut BTreeMap<String, f64>, labels: &str, counts: [u64; 5]) {
    let names = ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"];
    for (name, n) in names.iter().zip(counts) {
        #[allow(clippy::cast_precision_loss)]
        into.insert(format!("ratelimit_service_rate_limit_{name}{{{labels}}}"), n as f64);
    }
}

#[tokio::test]
async fn upstream_stat_names_labels_and_counts_are_exported() {
    let (server, mut client, _dir) = start(&[]).await;
    let login = |hits| vec![descriptor(&[("path", "/login")], hits)];
    // Limit 10, near past floor(10 x 0.8) = 8. 0 -> 7: within.
    assert_eq!(code(&mut client, login(7)).await, Code::Ok);
    // 7 -> 9: within, and 1 near (the part past 8).
    assert_eq!(code(&mut client, login(2)).await, Code::Ok);
    // 9 -> 12: refused; 2 over, 1 near (9 to 10), none within (upstream's split).
    assert_eq!(code(&mut client, login(3)).await, Code::OverLimit);
    // Refused hits are not charged here: 9 -> 10, within and near.
    assert_eq!(code(&mut client, login(1)).await, Code::Ok);

    // Limit 4, near past 3: any address counts under the key alone.
    for ip in ["10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"] {
        code(&mut client, vec![descriptor(&[("remote_address", ip)], 1)]).await;
    }
    // Shadow mode, limit 2, near past 1: 0 -> 3 is answered OK, counted over and in shadow_mode.
    assert_eq!(code(&mut client, vec![descriptor(&[("plan", "trial")], 3)]).await, Code::Ok);
    // Nested: two levels, key1 and key2.
    code(&mut client, vec![descriptor(&[("user", "ann"), ("tier", "gold")], 1)]).await;
    // detailed_metric: the value, an IPv4 address's dots made underscores (upstream's sanitiser).
    code(&mut client, vec![descriptor(&[("client", "10.1.2.3")], 1)]).await;
    // value_to_metric: the value, `:` made `_`.
    code(&mut client, vec![descriptor(&[("route", "a:b")], 1)]).await;
    // share_threshold: the pattern, whatever the value.
    code(
        &mut client,
        vec![descriptor(&[("files", "files/a.pdf")], 1), descriptor(&[("files", "files/b")], 1)],
    )
    .await;
    // A block list: every hit over.
    assert_eq!(code(&mut client, vec![descriptor(&[("blocked", "x")], 1)]).await, Code::OverLimit);
    // A request's own limit: every key_value, split at the dots into key1 and key2.
    let mut own = descriptor(&[("k", "v.w")], 1);
    own.limit = Some(RateLimitOverride { requests_per_unit: 5, unit: Unit::Hour as i32 });
    code(&mut client, vec![own]).await;
    // Unlimited and unmatched descriptors are not counted, as upstream.
    code(&mut client, vec![descriptor(&[("free", "x")], 1), descriptor(&[("nowhere", "x")], 1)]).await;

    let mut want = BTreeMap::new();
    expect(&mut want, r#"domain="edge",key1="path_/login""#, [13, 2, 3, 10, 0]);
    expect(&mut want, r#"domain="edge",key1="remote_address""#, [6, 1, 1, 5, 0]);
    expect(&mut want, r#"domain="edge",key1="plan_trial""#, [3, 1, 1, 0, 1]);
    expect(&mut want, r#"domain="edge",key1="user",key2="tier_gold""#, [1, 0, 0, 1, 0]);
    expect(&mut want, r#"domain="edge",key1="client_10_1_2_3""#, [1, 0, 0, 1, 0]);
    expect(&mut want, r#"domain="edge",key1="route_a_b""#, [1, 0, 0, 1, 0]);
    expect(&mut want, r#"domain="edge",key1="files_files/*""#, [2, 0, 0, 2, 0]);
    expect(&mut want, r#"domain="edge",key1="blocked_x""#, [1, 1, 0, 0, 0]);
    expect(&mut want, r#"domain="edge",key1="k_v",key2="w""#, [1, 0, 0, 1, 0]);
    assert_eq!(samples(&server, "ratelimit_service_rate_limit_").await, want);

    // Tollgate's own names stay, with their own labels and counting.
    let legacy = samples(&server, "tollgate_envoy_total_hits").await;
    assert_eq!(legacy[r#"tollgate_envoy_total_hits{domain="edge",descriptor="path"}"#], 13.0);
    assert_eq!(legacy[r#"tollgate_envoy_total_hits{domain="edge",descriptor="client_10.1.2.3"}"#], 1.0);
}

#[tokio::test]
async fn stranger_chosen_values_cannot_grow_the_series_past_the_bound() {
    let (server, mut client, _dir) = start(&["--envoy-stats-max-key-paths", "20"]).await;
    // 200 distinct detailed_metric values, 50 descriptors a request.
    for batch in 0..4 {
        let descriptors =
            (0..50).map(|i| descriptor(&[("client", &format!("stranger-{batch}-{i}"))], 1)).collect();
        assert_eq!(code(&mut client, descriptors).await, Code::Ok);
    }
    for family in ["ratelimit_service_rate_limit_total_hits", "tollgate_envoy_total_hits"] {
        let series = samples(&server, &format!("{family}{{")).await;
        // 20 key paths of their own, then one for the rest: no hit is lost.
        assert_eq!(series.len(), 21, "{family}: {series:?}");
        assert_eq!(series.values().sum::<f64>(), 200.0, "{family}");
        let overflow = series.iter().find(|(k, _)| k.contains("|overflow|")).unwrap();
        assert_eq!(*overflow.1, 180.0, "{family}");
    }
    // A key path already counted keeps its own series past the bound.
    let first = samples(&server, "ratelimit_service_rate_limit_total_hits{").await;
    let (kept, before) = first.iter().find(|(k, _)| !k.contains("|overflow|")).unwrap();
    let value = kept.split("key1=\"client_").nth(1).unwrap().split('"').next().unwrap().to_owned();
    code(&mut client, vec![descriptor(&[("client", &value)], 1)]).await;
    let after = samples(&server, "ratelimit_service_rate_limit_total_hits{").await;
    assert_eq!(after[kept], before + 1.0);
    assert_eq!(after.len(), 21);
}
