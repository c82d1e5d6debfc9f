//! The "Behind Envoy" recipe of docs/recipes.md, checked as far as it can be without an Envoy
//! binary (issue 23): its `envoy.yaml` is parsed and checked for the mistakes that would make
//! Envoy refuse it or limit nothing (a route or filter naming an undefined cluster, the
//! rate-limit cluster not on Tollgate's gRPC port or not HTTP/2, a route without `rate_limits`),
//! and the descriptors its routes' actions build for sample requests are sent to a Tollgate
//! serving the recipe's `ratelimit.yaml`, which must limit them as the recipe says.
//!
//! The recipe's commands themselves (check-config, serve) run in tests/recipes.rs.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Tollgate, inside_window};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_yaml_ng::Value;

/// Tollgate's default gRPC port, the one the recipe's rate-limit cluster must reach.
const TOLLGATE_GRPC_PORT: u64 = 8081;

/// The fenced block of docs/recipes.md whose first line is `# NAME`.
fn recipe_file(name: &str) -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/recipes.md")).unwrap();
    let head = format!("```yaml\n# {name}\n");
    let start =
        doc.find(&head).unwrap_or_else(|| panic!("docs/recipes.md has no block `# {name}`")) + head.len();
    let len = doc[start..].find("```").expect("the block ends");
    doc[start..start + len].to_owned()
}

/// `value[key]`, failing with the path when it is missing.
fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter()
        .fold(value, |v, key| v.get(*key).unwrap_or_else(|| panic!("envoy.yaml: no `{}`", path.join("."))))
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("envoy.yaml: {value:?} is not a string"))
}

fn list(value: &Value) -> &[Value] {
    value.as_sequence().unwrap_or_else(|| panic!("envoy.yaml: {value:?} is not a list"))
}

/// One HTTP request as Envoy's rate-limit actions see it.
struct Request<'a> {
    path: &'a str,
    client: &'a str,
    headers: &'a [(&'a str, &'a str)],
}

/// What the recipe's Envoy does with `envoy.yaml`: the rate-limit filter's domain and, per route
/// in order, its prefix and its `rate_limits`.
struct Envoy {
    domain: String,
    routes: Vec<(String, Vec<Value>)>,
}

impl Envoy {
    /// Parses and checks the file, failing on whatever would make Envoy refuse it or never ask
    /// Tollgate.
    fn parse(yaml: &str) -> Envoy {
        let config: Value = serde_yaml_ng::from_str(yaml).expect("envoy.yaml parses");
        let resources = at(&config, &["static_resources"]);
        let clusters: BTreeMap<&str, &Value> =
            list(at(resources, &["clusters"])).iter().map(|c| (text(at(c, &["name"])), c)).collect();
        let listeners = list(at(resources, &["listeners"]));
        assert_eq!(listeners.len(), 1, "the recipe has one listener");
        let filters = list(at(&list(at(&listeners[0], &["filter_chains"]))[0], &["filters"]));
        let manager = at(&filters[0], &["typed_config"]);
        assert_eq!(
            text(at(manager, &["@type"])),
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        );

        // The rate-limit filter: before the router (Envoy runs HTTP filters in order), with a
        // domain, and a gRPC service on a defined cluster.
        let http_filters = list(at(manager, &["http_filters"]));
        let names: Vec<&str> = http_filters.iter().map(|f| text(at(f, &["name"]))).collect();
        assert_eq!(names, ["envoy.filters.http.ratelimit", "envoy.filters.http.router"]);
        let ratelimit = at(&http_filters[0], &["typed_config"]);
        assert_eq!(text(at(ratelimit, &["rate_limit_service", "transport_api_version"])), "V3");
        let service_cluster =
            text(at(ratelimit, &["rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name"]));
        let tollgate =
            clusters.get(service_cluster).unwrap_or_else(|| panic!("no cluster `{service_cluster}`"));
        // gRPC needs HTTP/2 to the cluster: without it Envoy speaks HTTP/1.1 and every call fails.
        let options = at(
            tollgate,
            &["typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"],
        );
        assert!(at(options, &["explicit_http_config"]).get("http2_protocol_options").is_some());
        let endpoints = list(at(tollgate, &["load_assignment", "endpoints"]));
        let endpoint =
            at(&list(at(&endpoints[0], &["lb_endpoints"]))[0], &["endpoint", "address", "socket_address"]);
        assert_eq!(at(endpoint, &["port_value"]).as_u64(), Some(TOLLGATE_GRPC_PORT));
        assert_eq!(
            text(at(endpoint, &["address"])),
            "127.0.0.1",
            "Tollgate's gRPC listens on loopback by default"
        );

        let mut routes = Vec::new();
        for host in list(at(manager, &["route_config", "virtual_hosts"])) {
            for route in list(at(host, &["routes"])) {
                let target = text(at(route, &["route", "cluster"]));
                assert!(clusters.contains_key(target), "a route names the undefined cluster `{target}`");
                let limits = list(at(route, &["route", "rate_limits"])).to_vec();
                assert!(!limits.is_empty(), "a route without rate_limits sends no descriptor");
                routes.push((text(at(route, &["match", "prefix"])).to_owned(), limits));
            }
        }
        Envoy { domain: text(at(ratelimit, &["domain"])).to_owned(), routes }
    }

    /// The descriptors Envoy sends for `request`: the first matching route's `rate_limits`, one
    /// descriptor each, left out when an action finds nothing (a missing header).
    fn descriptors(&self, request: &Request) -> Vec<RateLimitDescriptor> {
        let (_, limits) =
            self.routes.iter().find(|(prefix, _)| request.path.starts_with(prefix.as_str())).unwrap();
        limits
            .iter()
            .filter_map(|limit| {
                let entries: Option<Vec<Entry>> =
                    list(at(limit, &["actions"])).iter().map(|a| entry(a, request)).collect();
                entries.map(|entries| RateLimitDescriptor { entries, ..Default::default() })
            })
            .collect()
    }
}

/// One action's entry, or `None` when it finds nothing. Only the actions the recipe uses are
/// known: another one fails the test rather than being guessed at.
fn entry(action: &Value, request: &Request) -> Option<Entry> {
    let (kind, spec) = action.as_mapping().and_then(|m| m.iter().next()).expect("an action is a one-key map");
    let entry = |key: &str, value: &str| Entry { key: key.into(), value: value.into() };
    match text(kind) {
        "remote_address" => Some(entry("remote_address", request.client)),
        "generic_key" => {
            let key = spec.get("descriptor_key").map_or("generic_key", text);
            Some(entry(key, text(at(spec, &["descriptor_value"]))))
        }
        "request_headers" => {
            let header = text(at(spec, &["header_name"]));
            let value = if header == ":path" {
                Some(request.path)
            } else {
                request.headers.iter().find(|(name, _)| name.eq_ignore_ascii_case(header)).map(|(_, v)| *v)
            };
            value.map(|v| entry(text(at(spec, &["descriptor_key"])), v))
        }
        other => panic!("envoy.yaml uses the action `{other}`, which this test does not model"),
    }
}

#[tokio::test]
async fn the_recipes_envoy_yaml_sends_descriptors_that_tollgate_limits() {
    let envoy = Envoy::parse(&recipe_file("envoy.yaml"));

    let checkout = Request { path: "/checkout", client: "10.0.0.1", headers: &[("x-user", "alice")] };
    let entries = |d: &[RateLimitDescriptor]| -> Vec<Vec<(String, String)>> {
        d.iter().map(|d| d.entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect()).collect()
    };
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        entries(&envoy.descriptors(&checkout)),
        [
            vec![pair("remote_address", "10.0.0.1")],
            vec![pair("generic_key", "checkout"), pair("user", "alice")]
        ]
    );
    let anonymous = Request { path: "/checkout", client: "10.0.0.2", headers: &[] };
    assert_eq!(entries(&envoy.descriptors(&anonymous)), [vec![pair("remote_address", "10.0.0.2")]]);
    let page = Request { path: "/index.html", client: "10.0.0.1", headers: &[("x-user", "alice")] };
    assert_eq!(entries(&envoy.descriptors(&page)), [vec![pair("remote_address", "10.0.0.1")]]);

    // Tollgate serving the recipe's ratelimit.yaml, asked as that Envoy would ask.
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("ratelimit.yaml");
    std::fs::write(&yaml, recipe_file("ratelimit.yaml")).unwrap();
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let _server =
        Tollgate::start("", &["--grpc-listen", &listen, "--envoy-config", yaml.to_str().unwrap()]).await;
    let mut client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    let mut ask = async |request: &Request| {
        let descriptors = envoy.descriptors(request);
        let request = RateLimitRequest { domain: envoy.domain.clone(), descriptors, hits_addend: 0 };
        client.should_rate_limit(request).await.unwrap().into_inner().overall_code()
    };
    // The limits count clock minutes: start where the minute has room for the whole test.
    inside_window(60, 15).await;
    for n in 1..=3 {
        assert_eq!(ask(&checkout).await, Code::Ok, "checkout {n} of 3");
    }
    assert_eq!(ask(&checkout).await, Code::OverLimit, "the fourth checkout of a minute is refused");
    // Another user's checkout, and alice's other pages, are counted apart.
    let bob = Request { path: "/checkout", client: "10.0.0.1", headers: &[("x-user", "bob")] };
    assert_eq!(ask(&bob).await, Code::Ok);
    assert_eq!(ask(&page).await, Code::Ok);
}
