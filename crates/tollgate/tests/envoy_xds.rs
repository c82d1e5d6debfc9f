//! The Envoy configuration over xDS (State of the World over ADS), as envoyproxy/ratelimit takes
//! it with `CONFIG_TYPE=GRPC_XDS_SOTW`: a management server written here with tonic serves
//! `AggregatedDiscoveryService/StreamAggregatedResources` on loopback, `tollgate serve
//! --envoy-xds-server` subscribes to it, and each test asserts over real gRPC
//! `ShouldRateLimit` calls, and over the ACKs and NACKs the server receives.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Tollgate, eventually, inside_window};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tollgate_envoy::xds::{TYPE_URL, proto};
use tonic::transport::{Certificate, Channel, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

const NODE: &str = "tollgate-test-node";

type Responses = mpsc::Sender<Result<DiscoveryResponse, Status>>;

/// The management server's state: the snapshot it serves, its open streams, and every request
/// it received.
#[derive(Default)]
struct State {
    snapshot: Option<(String, Vec<Any>)>,
    streams: Vec<Responses>,
    requests: Vec<DiscoveryRequest>,
    /// Each stream's headers.
    headers: Vec<tonic::metadata::MetadataMap>,
    nonces: u64,
}

impl State {
    /// The snapshot as a response with a fresh nonce.
    fn response(&mut self) -> Option<DiscoveryResponse> {
        let (version, resources) = self.snapshot.clone()?;
        self.nonces += 1;
        Some(DiscoveryResponse {
            version_info: version,
            resources,
            type_url: TYPE_URL.into(),
            nonce: format!("nonce-{}", self.nonces),
            ..Default::default()
        })
    }
}

#[derive(Clone, Default)]
struct Ads(Arc<Mutex<State>>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let headers = request.metadata().clone();
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        // The state holds the stream's one strong sender: dropping it ends the stream.
        let weak = tx.downgrade();
        let mut s = self.0.lock().unwrap();
        s.streams.push(tx);
        s.headers.push(headers);
        drop(s);
        let state = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                let first = req.response_nonce.is_empty();
                let reply = {
                    let mut s = state.lock().unwrap();
                    s.requests.push(req);
                    if first { s.response() } else { None }
                };
                if let (Some(reply), Some(tx)) = (reply, weak.upgrade()) {
                    let _ = tx.send(Ok(reply)).await;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("State of the World only"))
    }
}

/// A management server on a loopback port, until [`stop`](Self::stop).
struct XdsServer {
    ads: Ads,
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl XdsServer {
    /// Serves `ads` on `port` (a free one when 0).
    async fn start(port: u16, ads: Ads) -> XdsServer {
        Self::start_tls(port, ads, None).await
    }

    /// Serves `ads` on `port`, over TLS when `tls` is given.
    async fn start_tls(port: u16, ads: Ads, tls: Option<ServerTlsConfig>) -> XdsServer {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel();
        let service = AggregatedDiscoveryServiceServer::new(ads.clone());
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let task = tokio::spawn(async move {
            builder
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        XdsServer { ads, port, stop: Some(stop), task: Some(task) }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Serves `resources` as `version` from now on, and pushes it on every open stream.
    async fn push(&self, version: &str, resources: Vec<Any>) {
        let sends: Vec<(Responses, DiscoveryResponse)> = {
            let mut s = self.ads.0.lock().unwrap();
            s.snapshot = Some((version.to_owned(), resources));
            s.streams.retain(|t| !t.is_closed());
            let streams = s.streams.clone();
            streams.into_iter().map(|t| (t, s.response().unwrap())).collect()
        };
        for (tx, response) in sends {
            let _ = tx.send(Ok(response)).await;
        }
    }

    fn requests(&self) -> Vec<DiscoveryRequest> {
        self.ads.0.lock().unwrap().requests.clone()
    }

    /// Waits up to 10 s for a request `matches` accepts, and returns it.
    async fn request_where(
        &self,
        what: &str,
        matches: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let found =
            eventually(Duration::from_secs(10), || async { self.requests().iter().any(&matches) }).await;
        assert!(found, "no request {what}; the server saw: {:#?}", self.requests());
        self.requests().into_iter().find(|r| matches(r)).unwrap()
    }

    /// The nonce of the last response sent.
    fn last_nonce(&self) -> String {
        format!("nonce-{}", self.ads.0.lock().unwrap().nonces)
    }

    /// Ends every stream and stops serving: the port refuses connections.
    async fn stop(&mut self) {
        self.ads.0.lock().unwrap().streams.clear();
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
            abort.abort();
        }
    }
}

/// A RateLimitConfig resource of `domain` with, for each `(key, requests per hour)`, a
/// descriptor `key` (any value) limited to that many.
fn resource(name: &str, domain: &str, limits: &[(&str, u32)]) -> Any {
    let descriptors = limits
        .iter()
        .map(|(key, n)| proto::RateLimitDescriptor {
            key: (*key).into(),
            rate_limit: Some(proto::RateLimitPolicy { unit: 3, requests_per_unit: *n, ..Default::default() }),
            ..Default::default()
        })
        .collect();
    let config = proto::RateLimitConfig { name: name.into(), domain: domain.into(), descriptors };
    Any { type_url: TYPE_URL.into(), value: config.encode_to_vec() }
}

/// `tollgate serve` subscribed to `xds`, and a client of its rate-limit service.
async fn start_tollgate(xds: &XdsServer) -> (Tollgate, RateLimitServiceClient<Channel>) {
    start_tollgate_with(&xds.url(), &[]).await
}

/// `tollgate serve` subscribed to `url` with `extra` arguments, and a client of its
/// rate-limit service.
async fn start_tollgate_with(url: &str, extra: &[&str]) -> (Tollgate, RateLimitServiceClient<Channel>) {
    let listen = format!("127.0.0.1:{}", tollgate_testkit::free_port());
    let mut args = vec![
        "--grpc-listen",
        &listen,
        "--envoy-xds-server",
        url,
        "--envoy-xds-node-id",
        NODE,
        "--envoy-xds-backoff-initial",
        "100ms",
        "--envoy-xds-backoff-max",
        "400ms",
    ];
    args.extend(extra);
    let server = Tollgate::start("", &args).await;
    let client = RateLimitServiceClient::connect(format!("http://{listen}")).await.unwrap();
    inside_window(3600, 10).await;
    (server, client)
}

/// The overall code of one hit on `domain` for the descriptor `key=value`.
async fn hit(client: &mut RateLimitServiceClient<Channel>, domain: &str, key: &str, value: &str) -> Code {
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: key.into(), value: value.into() }],
        ..Default::default()
    };
    let request = RateLimitRequest { domain: domain.into(), descriptors: vec![descriptor], hits_addend: 0 };
    client.should_rate_limit(request).await.unwrap().into_inner().overall_code()
}

/// `n` hits' codes.
async fn hits(client: &mut RateLimitServiceClient<Channel>, n: usize, key: &str, value: &str) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..n {
        codes.push(hit(client, "edge", key, value).await);
    }
    codes
}

fn is_ack(r: &DiscoveryRequest, version: &str, nonce: &str) -> bool {
    r.version_info == version && r.response_nonce == nonce && r.error_detail.is_none()
}

#[tokio::test]
async fn a_pushed_configuration_applies_and_the_next_replaces_it() {
    let ads = Ads::default();
    let xds = XdsServer::start(0, ads).await;
    xds.push("v1", vec![resource("edge-limits", "edge", &[("user", 2)])]).await;
    let extra =
        ["--envoy-xds-node-metadata", "cluster=edge,zone=a", "--envoy-xds-headers", "x-xds-token:s3cret"];
    let (_tollgate, mut client) = start_tollgate_with(&xds.url(), &extra).await;

    // The subscription: ADS, the node id and metadata, RateLimitConfig, nothing acked yet, and
    // the extra header.
    let first = xds.request_where("subscribing", |r| r.response_nonce.is_empty()).await;
    assert_eq!(first.type_url, TYPE_URL);
    let node = first.node.as_ref().unwrap();
    assert_eq!(node.id, NODE);
    let metadata = &node.metadata.as_ref().unwrap().fields;
    let text = |k: &str| match &metadata[k].kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!((text("cluster"), text("zone")), ("edge".to_owned(), "a".to_owned()));
    assert_eq!(first.version_info, "", "nothing acked yet");
    let headers = xds.ads.0.lock().unwrap().headers.clone();
    assert_eq!(headers[0].get("x-xds-token").and_then(|v| v.to_str().ok()), Some("s3cret"));
    let nonce = xds.last_nonce();
    xds.request_where("acking v1", |r| is_ack(r, "v1", &nonce)).await;

    // v1 decides: 2 per hour for each user.
    assert_eq!(hits(&mut client, 3, "user", "ann").await, [Code::Ok, Code::Ok, Code::OverLimit]);

    // v2 replaces it: users are no longer limited, tenants are, 1 per hour.
    xds.push("v2", vec![resource("edge-limits", "edge", &[("tenant", 1)])]).await;
    let nonce = xds.last_nonce();
    let ack = xds.request_where("acking v2", |r| is_ack(r, "v2", &nonce)).await;
    assert_eq!(ack.type_url, TYPE_URL);
    assert_eq!(hits(&mut client, 3, "user", "ann").await, [Code::Ok, Code::Ok, Code::Ok], "v1 is gone");
    assert_eq!(hits(&mut client, 2, "tenant", "acme").await, [Code::Ok, Code::OverLimit]);
    assert!(xds.requests().iter().all(|r| r.error_detail.is_none()), "nothing NACKed");
}

#[tokio::test]
async fn an_invalid_configuration_is_nacked_and_the_last_good_one_answers() {
    let ads = Ads::default();
    let xds = XdsServer::start(0, ads).await;
    xds.push("7", vec![resource("edge-limits", "edge", &[("tenant", 1)])]).await;
    let (tollgate, mut client) = start_tollgate(&xds).await;
    let nonce = xds.last_nonce();
    xds.request_where("acking 7", |r| is_ack(r, "7", &nonce)).await;
    assert_eq!(hits(&mut client, 2, "tenant", "acme").await, [Code::Ok, Code::OverLimit]);

    // Version 8: a good resource beside one whose limit has no unit (upstream refuses it).
    let mut broken =
        proto::RateLimitConfig { name: "broken-limits".into(), domain: "other".into(), ..Default::default() };
    broken.descriptors.push(proto::RateLimitDescriptor {
        key: "user".into(),
        rate_limit: Some(proto::RateLimitPolicy { requests_per_unit: 5, ..Default::default() }),
        ..Default::default()
    });
    let broken = Any { type_url: TYPE_URL.into(), value: broken.encode_to_vec() };
    xds.push("8", vec![resource("edge-limits", "edge", &[("user", 1)]), broken]).await;
    let nonce = xds.last_nonce();
    let nack = xds.request_where("nacking 8", |r| r.response_nonce == nonce).await;
    assert_eq!(nack.version_info, "7", "a NACK names the last version applied");
    let detail = nack.error_detail.expect("a NACK carries the reason");
    assert!(detail.message.contains("xDS resource 'broken-limits'"), "{}", detail.message);
    assert!(detail.message.contains("invalid rate limit unit 'UNKNOWN'"), "{}", detail.message);

    // Version 7 still answers, whole: tenants limited, users not.
    assert_eq!(hits(&mut client, 1, "tenant", "acme").await, [Code::OverLimit]);
    assert_eq!(hits(&mut client, 2, "tenant", "globex").await, [Code::Ok, Code::OverLimit]);
    assert_eq!(hits(&mut client, 2, "user", "ann").await, [Code::Ok, Code::Ok]);
    assert_eq!(
        tollgate.metric("tollgate_config_reloads_total{config=\"envoy\",result=\"refused\"}").await,
        1.0
    );
    assert_eq!(tollgate.metric("tollgate_config_last_reload_successful{config=\"envoy\"}").await, 0.0);

    // A good version 9 is applied and the gauge recovers.
    xds.push("9", vec![resource("edge-limits", "edge", &[("user", 1)])]).await;
    let nonce = xds.last_nonce();
    xds.request_where("acking 9", |r| is_ack(r, "9", &nonce)).await;
    assert_eq!(hits(&mut client, 2, "user", "bob").await, [Code::Ok, Code::OverLimit]);
    assert_eq!(tollgate.metric("tollgate_config_last_reload_successful{config=\"envoy\"}").await, 1.0);
    assert!(
        tollgate.logs().contains("invalid rate limit unit"),
        "the refusal is logged:\n{}",
        tollgate.logs()
    );
}

#[tokio::test]
async fn the_last_configuration_outlives_the_server_and_the_next_applies_on_its_return() {
    let ads = Ads::default();
    let mut xds = XdsServer::start(0, ads).await;
    xds.push("a", vec![resource("edge-limits", "edge", &[("tenant", 1)])]).await;
    let (tollgate, mut client) = start_tollgate(&xds).await;
    let nonce = xds.last_nonce();
    xds.request_where("acking a", |r| is_ack(r, "a", &nonce)).await;
    assert_eq!(tollgate.metric("tollgate_envoy_xds_connected").await, 1.0);

    // The server goes away: the configuration keeps answering.
    xds.stop().await;
    let gone = eventually(Duration::from_secs(10), || async {
        tollgate.metric("tollgate_envoy_xds_connected").await == 0.0
    })
    .await;
    assert!(gone, "the stream's end is noticed");
    tokio::time::sleep(Duration::from_millis(800)).await; // a few refused reconnections
    assert_eq!(hits(&mut client, 2, "tenant", "acme").await, [Code::Ok, Code::OverLimit]);

    // It comes back on the same port with version b: the client reconnects, says it holds a,
    // and applies b.
    let ads = Ads::default();
    ads.0.lock().unwrap().snapshot =
        Some(("b".into(), vec![resource("edge-limits", "edge", &[("plan", 1)])]));
    ads.0.lock().unwrap().nonces = 100;
    let xds = XdsServer::start(xds.port, ads).await;
    let again = xds.request_where("subscribing again", |r| r.response_nonce.is_empty()).await;
    assert_eq!(again.version_info, "a", "the new stream names the version held");
    xds.request_where("acking b", |r| is_ack(r, "b", "nonce-101")).await;
    assert_eq!(hits(&mut client, 2, "plan", "pro").await, [Code::Ok, Code::OverLimit]);
    assert_eq!(hits(&mut client, 2, "tenant", "acme").await, [Code::Ok, Code::Ok], "a is replaced");
    assert_eq!(tollgate.metric("tollgate_envoy_xds_connected").await, 1.0);
}

#[tokio::test]
async fn a_response_over_the_size_limit_changes_nothing_and_the_next_applies() {
    let xds = XdsServer::start(0, Ads::default()).await;
    xds.push("small", vec![resource("edge-limits", "edge", &[("tenant", 1)])]).await;
    let (tollgate, mut client) =
        start_tollgate_with(&xds.url(), &["--envoy-xds-max-message-bytes", "32768"]).await;
    let nonce = xds.last_nonce();
    xds.request_where("acking small", |r| is_ack(r, "small", &nonce)).await;

    // About 100 KiB of descriptors: the stream fails on it, again at each reconnection.
    let keys: Vec<String> = (0..2000).map(|i| format!("key-{i:04}-{}", "x".repeat(32))).collect();
    let limits: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    xds.push("big", vec![resource("edge-limits", "edge", &limits)]).await;
    let refused = eventually(Duration::from_secs(10), || async {
        tollgate.logs().matches("message length too large").count() >= 2
    })
    .await;
    assert!(refused, "the big response fails the stream each time:\n{}", tollgate.logs());
    assert!(xds.requests().iter().all(|r| r.version_info != "big"), "never ACKed");
    assert_eq!(hits(&mut client, 2, "tenant", "acme").await, [Code::Ok, Code::OverLimit], "small answers");

    // A response within the limit is read at the next reconnection and applied.
    xds.push("small-again", vec![resource("edge-limits", "edge", &[("plan", 1)])]).await;
    xds.request_where("acking small-again", |r| r.version_info == "small-again" && r.error_detail.is_none())
        .await;
    assert_eq!(hits(&mut client, 2, "plan", "pro").await, [Code::Ok, Code::OverLimit]);
}

/// A CA, the xDS server's certificate for `xds.internal` and a client certificate it issued,
/// as PEM files in a temporary directory.
fn pki() -> tempfile::TempDir {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "xDS test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    write("ca.pem", ca.pem());
    for (file, name) in [("server", "xds.internal"), ("client", "tollgate.client")] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
        write(&format!("{file}.pem"), cert.pem());
        write(&format!("{file}.key"), key.serialize_pem());
    }
    dir
}

#[tokio::test]
async fn the_server_is_reached_over_mutual_tls_checked_against_the_san() {
    let pki = pki();
    let read = |name: &str| std::fs::read_to_string(pki.path().join(name)).unwrap();
    let path = |name: &str| pki.path().join(name).to_str().unwrap().to_owned();
    // The server asks for a client certificate of the CA.
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("server.pem"), read("server.key")))
        .client_ca_root(Certificate::from_pem(read("ca.pem")));
    let xds = XdsServer::start_tls(0, Ads::default(), Some(tls)).await;
    xds.push("v1", vec![resource("edge-limits", "edge", &[("user", 1)])]).await;
    let url = format!("https://127.0.0.1:{}", xds.port);
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    let trust = ["--envoy-xds-tls-ca", &ca, "--envoy-xds-tls-san", "xds.internal"];

    // Without a client certificate the handshake fails: nothing arrives, nothing applies.
    let (refused, mut client) =
        start_tollgate_with(&url, &[&trust[..], &["--envoy-xds-force-start"]].concat()).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(xds.requests().is_empty(), "{:#?}", xds.requests());
    assert_eq!(hits(&mut client, 2, "user", "ann").await, [Code::Ok, Code::Ok], "no configuration");
    assert!(refused.logs().contains("no xDS stream"), "{}", refused.logs());
    drop(refused);

    // With it, the configuration arrives over TLS (the server's name is the SAN, not the URL's).
    let identity = ["--envoy-xds-tls-cert", &cert, "--envoy-xds-tls-key", &key];
    let (_tollgate, mut client) = start_tollgate_with(&url, &[&trust[..], &identity[..]].concat()).await;
    let nonce = xds.last_nonce();
    xds.request_where("acking v1", |r| is_ack(r, "v1", &nonce)).await;
    assert_eq!(hits(&mut client, 2, "user", "ann").await, [Code::Ok, Code::OverLimit]);
}

#[test]
fn xds_and_envoy_config_are_refused_together() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--envoy-config", "edge.yaml", "--envoy-xds-server", "http://127.0.0.1:1"])
        .env_remove("TOLLGATE_ENVOY_CONFIG")
        .env_remove("TOLLGATE_ENVOY_XDS_SERVER")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--envoy-xds-server") && stderr.contains("cannot be used with"), "{stderr}");
}
