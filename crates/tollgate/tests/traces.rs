//! OpenTelemetry traces (`[tracing]`), received by a small OTLP collector that each test runs
//! (opentelemetry-proto's `TraceService`, served by tonic on a free loopback port): the request
//! span under the caller's `traceparent` (HTTP and gRPC), the decision and the Redis call under
//! it, the caller's sampling decision followed, the standard environment variables, and
//! nothing sent when tracing is off.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::{Tollgate, eventually};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::json;
use tollgate_testkit::RedisServer;

/// One span as received, with its resource's `service.name`.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

/// An OTLP collector (gRPC) on a free loopback port, keeping every span it is sent.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    exports: Arc<Mutex<usize>>,
}

#[derive(Clone)]
struct Service {
    spans: Arc<Mutex<Vec<Received>>>,
    exports: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        *self.exports.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| Received { service: service.clone(), span }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = Service { spans: Arc::default(), exports: Arc::default() };
        let (spans, exports) = (service.spans.clone(), service.exports.clone());
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service))
                .serve_with_incoming(incoming),
        );
        Collector { addr, spans, exports }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn exports(&self) -> usize {
        *self.exports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spans of the trace `trace_id` (hex).
    fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans().into_iter().map(|r| r.span).filter(|s| hex(&s.trace_id) == trace_id).collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &Any) -> Option<String> {
    match value {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        Any::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// A span's attribute, as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

/// The one span of `spans` named `name`.
fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one span named {name:?} in {:#?}", names(spans));
    found[0]
}

fn names(spans: &[Span]) -> Vec<(String, String, String)> {
    spans.iter().map(|s| (s.name.clone(), hex(&s.span_id), hex(&s.parent_span_id))).collect()
}

/// Whether `ancestor` is `span`'s parent, or its parent's, and so on, within `spans`.
fn descends_from(spans: &[Span], span: &Span, ancestor: &Span) -> bool {
    let mut parent = span.parent_span_id.clone();
    for _ in 0..spans.len() {
        if parent == ancestor.span_id {
            return true;
        }
        match spans.iter().find(|s| s.span_id == parent) {
            Some(next) => parent = next.parent_span_id.clone(),
            None => return false,
        }
    }
    false
}

/// A W3C `traceparent`: version 00, the trace, the caller's span, sampled or not.
fn traceparent(trace_id: &str, parent_id: &str, sampled: bool) -> String {
    format!("00-{trace_id}-{parent_id}-{}", if sampled { "01" } else { "00" })
}

/// `POST /v1/check` of one unit of policy `p`, with `traceparent` if given: the status.
async fn check(server: &Tollgate, key: &str, traceparent: Option<&str>) -> u16 {
    let mut request = server.client.post(server.url("/v1/check")).json(&json!({"key": key, "policy": "p"}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.unwrap().status().as_u16()
}

/// SIGTERM, waited for off the runtime (the collector must go on answering meanwhile).
async fn terminate(mut server: Tollgate) -> (Tollgate, std::process::ExitStatus) {
    tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (server, status)
    })
    .await
    .unwrap()
}

const ENVOY_YAML: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_on_redis_is_traced_under_the_callers_traceparent() {
    let collector = Collector::start().await;
    let redis = RedisServer::start();
    // A minute between exports: what arrives is what shutdown sent.
    let config = format!(
        r#"
[backend]
kind = "redis"
url = "{redis}"
prefix = "traces"
timeout = "5s"

[tracing]
otlp_endpoint = "{endpoint}"
sample_ratio = 1.0
service_name = "tollgate-under-test"
export_delay = "1m"

[policies.p]
rules = [{{ algorithm = "fixed_window", limit = 10, period = "1h" }}]
"#,
        redis = redis.url(),
        endpoint = collector.endpoint(),
    );
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, ENVOY_YAML).unwrap();
    let grpc = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let server =
        Tollgate::start(&config, &["--grpc-listen", &grpc, "--envoy-config", yaml.to_str().unwrap()]).await;
    assert!(server.logs().contains("spans are exported over OTLP"), "{}", server.logs());

    let (http_trace, http_parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (unsampled_trace, unsampled_parent) = ("5c0a2f3577b34da6a3ce929d0e0e4737", "11f067aa0ba902b8");
    let (grpc_trace, grpc_parent) = ("6d1b3f3577b34da6a3ce929d0e0e4738", "22f067aa0ba902b9");
    assert_eq!(check(&server, "alice", Some(&traceparent(http_trace, http_parent, true))).await, 200);
    // The caller did not sample its trace: neither does Tollgate, at any ratio.
    assert_eq!(
        check(&server, "bob", Some(&traceparent(unsampled_trace, unsampled_parent, false))).await,
        200
    );
    // No traceparent: the request starts a trace of its own.
    assert_eq!(check(&server, "carol", None).await, 200);
    // Probes make no spans.
    assert_eq!(server.get_text("/healthz").await.0, 200);

    // gRPC: the traceparent is metadata of the Envoy service's call.
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.unwrap();
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "user".into(), value: "dave".into() }],
        ..Default::default()
    };
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor],
        hits_addend: 0,
    });
    request.metadata_mut().insert("traceparent", traceparent(grpc_trace, grpc_parent, true).parse().unwrap());
    let answer = client.should_rate_limit(request).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    drop(client);

    assert_eq!(collector.exports(), 0, "nothing is sent before the export delay or shutdown");
    let (server, status) = terminate(server).await;
    assert!(status.success(), "{status}: {}", server.logs());
    // Shutdown waited for the export; a short margin for the collector's bookkeeping.
    assert!(
        eventually(Duration::from_secs(5), || async { !collector.trace(grpc_trace).is_empty() }).await,
        "no spans arrived: {:#?}\n{}",
        collector.spans(),
        server.logs()
    );
    for received in collector.spans() {
        assert_eq!(received.service, "tollgate-under-test");
    }

    // HTTP: request -> decision -> backend -> redis.
    let spans = collector.trace(http_trace);
    let request = named(&spans, "POST /v1/check");
    assert_eq!(hex(&request.parent_span_id), http_parent, "the request's parent is the caller's span");
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(attr(request, "http.route").as_deref(), Some("/v1/check"));
    assert_eq!(attr(request, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(attr(request, "http.response.status_code").as_deref(), Some("200"));
    let decision = named(&spans, "decision");
    assert_eq!(decision.parent_span_id, request.span_id);
    assert_eq!(attr(decision, "tollgate.policy").as_deref(), Some("p"));
    assert_eq!(attr(decision, "tollgate.decision").as_deref(), Some("allowed"));
    assert_eq!(attr(decision, "tollgate.backend").as_deref(), Some("redis"));
    assert_eq!(attr(decision, "tollgate.degraded").as_deref(), Some("false"));
    let backend = named(&spans, "backend");
    assert_eq!(backend.parent_span_id, decision.span_id);
    let redis_span = named(&spans, "redis");
    assert!(descends_from(&spans, redis_span, request), "{:#?}", names(&spans));
    assert_eq!(redis_span.kind, SpanKind::Client as i32);
    assert_eq!(attr(redis_span, "db.system.name").as_deref(), Some("redis"));
    assert_eq!(attr(redis_span, "tollgate.operation").as_deref(), Some("check"));
    assert!(attr(redis_span, "tollgate.engine").is_some(), "{redis_span:?}");

    assert!(collector.trace(unsampled_trace).is_empty(), "{:#?}", collector.trace(unsampled_trace));
    let all: Vec<Span> = collector.spans().into_iter().map(|r| r.span).collect();
    assert!(!all.iter().any(|s| s.name.contains("healthz")), "{:#?}", names(&all));
    // Carol's request: a root span, with its own decision and Redis call.
    let roots: Vec<&Span> =
        all.iter().filter(|s| s.name == "POST /v1/check" && s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), 1, "{:#?}", names(&all));
    let own = collector.trace(&hex(&roots[0].trace_id));
    assert!(own.iter().any(|s| s.name == "redis" && descends_from(&own, s, roots[0])), "{:#?}", names(&own));

    // gRPC: the request span is the method's, under the caller's span, with Redis below.
    let spans = collector.trace(grpc_trace);
    let request = named(&spans, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    assert_eq!(hex(&request.parent_span_id), grpc_parent);
    assert_eq!(attr(request, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(attr(request, "rpc.method").as_deref(), Some("ShouldRateLimit"));
    let decision = named(&spans, "decision");
    assert!(descends_from(&spans, decision, request));
    assert_eq!(attr(decision, "tollgate.decision").as_deref(), Some("allowed"));
    let redis_span = named(&spans, "redis");
    assert!(descends_from(&spans, redis_span, decision), "{:#?}", names(&spans));
}

/// `tollgate serve` with `env`, on a memory backend, exporting every 100 ms when on.
async fn start_memory(env: &[(&str, &str)]) -> Tollgate {
    let config = r#"
[tracing]
export_delay = "100ms"

[policies.p]
rules = [{ algorithm = "fixed_window", limit = 10, period = "1h" }]
"#;
    Tollgate::start_with_env(config, &[], env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_variables_turn_tracing_on_and_off() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    // OTEL_SDK_DISABLED wins over an endpoint: no exporter, and nothing is sent, even at exit.
    let off =
        start_memory(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_SDK_DISABLED", "true")]).await;
    let (off_trace, off_parent) = ("7e2c4f3577b34da6a3ce929d0e0e4739", "33f067aa0ba902ba");
    for key in ["a", "b", "c"] {
        assert_eq!(check(&off, key, Some(&traceparent(off_trace, off_parent, true))).await, 200);
    }
    // The same with the endpoint alone: on, and sent within the export delay, while serving.
    let on = start_memory(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]).await;
    let (on_trace, on_parent) = ("8f3d5f3577b34da6a3ce929d0e0e473a", "44f067aa0ba902bb");
    assert_eq!(check(&on, "a", Some(&traceparent(on_trace, on_parent, true))).await, 200);
    assert!(
        eventually(Duration::from_secs(10), || async { collector.trace(on_trace).len() >= 3 }).await,
        "{:#?}\n{}",
        collector.spans(),
        on.logs()
    );
    let spans = collector.trace(on_trace);
    let request = named(&spans, "POST /v1/check");
    assert_eq!(hex(&request.parent_span_id), on_parent);
    let backend = named(&spans, "backend");
    assert!(descends_from(&spans, backend, request));
    assert_eq!(attr(backend, "tollgate.backend").as_deref(), Some("memory"));
    assert!(!spans.iter().any(|s| s.name == "redis"), "no Redis behind a memory backend");

    let (off, status) = terminate(off).await;
    assert!(status.success());
    assert!(!off.logs().contains("spans are exported"), "{}", off.logs());
    // The other server's spans arrived after the disabled one's requests; its exit flushed
    // nothing either.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(collector.trace(off_trace).is_empty(), "{:#?}", collector.trace(off_trace));
}

#[test]
fn a_bad_endpoint_is_refused_naming_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    let database = format!("sqlite://{}", dir.path().join("tollgate.db").display());
    let serve = |env: &[(&str, &str)]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config", config.to_str().unwrap(), "--database", &database])
            .args(["--listen", &format!("127.0.0.1:{}", tollgate_testkit::free_port())])
            .args(["--grpc-listen", &format!("127.0.0.1:{}", tollgate_testkit::free_port())])
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
    };
    std::fs::write(&config, "[tracing]\notlp_endpoint = \"collector:4317\"\n").unwrap();
    let (status, stderr) = serve(&[]);
    assert!(!status.success());
    assert!(stderr.contains("tollgate.toml:2: tracing.otlp_endpoint"), "{stderr}");
    std::fs::write(&config, "").unwrap();
    let (status, stderr) = serve(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")]);
    assert!(!status.success());
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && stderr.contains("collector:4317"), "{stderr}");
}
