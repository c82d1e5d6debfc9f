//! The Envoy configuration over xDS, State of the World, as envoyproxy/ratelimit takes it with
//! `CONFIG_TYPE=GRPC_XDS_SOTW` (what Envoy Gateway drives): a client of the management server's
//! `envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources` (ADS, the
//! stream upstream's go-control-plane client opens), subscribed to every resource of type
//! [`TYPE_URL`] for its node id.
//!
//! Each response is the whole configuration: all its resources, each a `RateLimitConfig` (one
//! domain), are turned into the YAML upstream's loader reads and read by
//! [`Config::add_file`], so a resource is accepted or refused exactly as a file of
//! `--envoy-config` is (domains of two resources merged only with `merge_domains`). A valid
//! response replaces the running domains at once and is ACKed (its `version_info` and `nonce`);
//! an invalid one changes nothing and is NACKed (the last ACKed version, its nonce, and an
//! `error_detail` naming the resource and the reason). When the stream ends or fails the client
//! reconnects after a bounded, jittered, doubling backoff, its last good configuration still
//! answering, and asks again with the last ACKed version.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node as XdsNode;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Any, Struct, Value as ProtoValue, value::Kind};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message as _;
use serde_yaml_ng::{Mapping, Value};
use tokio::sync::{mpsc, watch};
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::{Config, EnvoyConfigError, EnvoyService};

/// The resource type upstream subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Most resources one response may hold (each is a domain); a response with more is NACKed.
pub const MAX_RESOURCES: usize = 4096;

/// The largest response read by default: gRPC's own default receive limit, which upstream keeps
/// unless `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` raises it.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// How long a connection to the management server may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 pings on the stream, so that a server gone without a word is noticed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Upstream's `RateLimitConfig` (`api/ratelimit/config/ratelimit/v3/rls_conf.proto` of
/// envoyproxy/ratelimit), by hand: the messages and their field numbers.
pub mod proto {
    use envoy_types::pb::google::protobuf::Struct;

    /// One domain's configuration.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitConfig {
        /// The resource's name (unique per configuration).
        #[prost(string, tag = "1")]
        pub name: String,
        /// The domain.
        #[prost(string, tag = "2")]
        pub domain: String,
        /// Its descriptors.
        #[prost(message, repeated, tag = "3")]
        pub descriptors: Vec<RateLimitDescriptor>,
    }

    /// A descriptor, as a YAML file's.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitDescriptor {
        /// `key`.
        #[prost(string, tag = "1")]
        pub key: String,
        /// `value` (empty: none).
        #[prost(string, tag = "2")]
        pub value: String,
        /// `rate_limit`.
        #[prost(message, optional, tag = "3")]
        pub rate_limit: Option<RateLimitPolicy>,
        /// Nested `descriptors`.
        #[prost(message, repeated, tag = "4")]
        pub descriptors: Vec<RateLimitDescriptor>,
        /// `shadow_mode`.
        #[prost(bool, tag = "5")]
        pub shadow_mode: bool,
        /// `detailed_metric`.
        #[prost(bool, tag = "6")]
        pub detailed_metric: bool,
        /// `quota_mode`.
        #[prost(bool, tag = "7")]
        pub quota_mode: bool,
        /// `metadata`.
        #[prost(message, optional, tag = "8")]
        pub metadata: Option<Struct>,
    }

    /// A `rate_limit`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitPolicy {
        /// `unit`: upstream's `RateLimitUnit` (0 UNKNOWN, 1 SECOND, 2 MINUTE, 3 HOUR, 4 DAY,
        /// 5 MONTH, 6 YEAR, 7 WEEK: the numbers of Envoy's `RateLimitResponse.RateLimit.Unit`).
        #[prost(int32, tag = "1")]
        pub unit: i32,
        /// `requests_per_unit`.
        #[prost(uint32, tag = "2")]
        pub requests_per_unit: u32,
        /// `unlimited`.
        #[prost(bool, tag = "3")]
        pub unlimited: bool,
        /// `name` (empty: none).
        #[prost(string, tag = "4")]
        pub name: String,
        /// `replaces`.
        #[prost(message, repeated, tag = "5")]
        pub replaces: Vec<RateLimitReplace>,
    }

    /// One item of `replaces`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitReplace {
        /// The name of the limit replaced.
        #[prost(string, tag = "1")]
        pub name: String,
    }
}

// -------------------------------------------------------------------------------------------
// Resources to a configuration

/// The configuration of one response's `resources`, read as upstream reads them: each
/// `RateLimitConfig` turned into its YAML, then read as a file named after the resource. The
/// error names the resource (its name, else its place) and the reason.
pub fn config_from_resources(resources: &[Any], merge_domains: bool) -> Result<Config, EnvoyConfigError> {
    if resources.len() > MAX_RESOURCES {
        return Err(EnvoyConfigError::new(
            "xDS response",
            format!("{} resources, more than {MAX_RESOURCES}", resources.len()),
        ));
    }
    let mut config = Config::default();
    for (i, resource) in resources.iter().enumerate() {
        let unnamed = || format!("xDS resource #{i}");
        if resource.type_url != TYPE_URL {
            return Err(EnvoyConfigError::new(
                unnamed(),
                format!("type {:?}, not {TYPE_URL}", resource.type_url),
            ));
        }
        let rlc = proto::RateLimitConfig::decode(resource.value.as_slice())
            .map_err(|e| EnvoyConfigError::new(unnamed(), format!("cannot decode a RateLimitConfig: {e}")))?;
        let origin = if rlc.name.is_empty() { unnamed() } else { format!("xDS resource '{}'", rlc.name) };
        let yaml = serde_yaml_ng::to_string(&yaml_of(&rlc))
            .map_err(|e| EnvoyConfigError::new(origin.clone(), format!("cannot write as YAML: {e}")))?;
        config.add_written(&yaml, &origin, merge_domains)?;
    }
    Ok(config)
}

fn key(k: &str) -> Value {
    Value::String(k.to_owned())
}

/// The YAML of a file holding `rlc`, as upstream's `ConfigXdsProtoToYaml` makes it: empty
/// strings and lists are what the YAML leaves out.
fn yaml_of(rlc: &proto::RateLimitConfig) -> Value {
    let mut root = Mapping::new();
    root.insert(key("domain"), Value::String(rlc.domain.clone()));
    root.insert(key("descriptors"), Value::Sequence(rlc.descriptors.iter().map(descriptor_yaml).collect()));
    Value::Mapping(root)
}

fn descriptor_yaml(d: &proto::RateLimitDescriptor) -> Value {
    let mut m = Mapping::new();
    m.insert(key("key"), Value::String(d.key.clone()));
    if !d.value.is_empty() {
        m.insert(key("value"), Value::String(d.value.clone()));
    }
    if let Some(p) = &d.rate_limit {
        let mut l = Mapping::new();
        // Go's enum String(): the name, or the number for one it does not know.
        let unit = match p.unit {
            0 => "UNKNOWN".to_owned(),
            n => crate::config::Unit::from_proto(n).map_or(n.to_string(), |u| u.name().to_ascii_uppercase()),
        };
        l.insert(key("unit"), Value::String(unit));
        l.insert(key("requests_per_unit"), Value::Number(p.requests_per_unit.into()));
        l.insert(key("unlimited"), Value::Bool(p.unlimited));
        if !p.name.is_empty() {
            l.insert(key("name"), Value::String(p.name.clone()));
        }
        if !p.replaces.is_empty() {
            let replaces = p
                .replaces
                .iter()
                .map(|r| {
                    let mut one = Mapping::new();
                    one.insert(key("name"), Value::String(r.name.clone()));
                    Value::Mapping(one)
                })
                .collect();
            l.insert(key("replaces"), Value::Sequence(replaces));
        }
        m.insert(key("rate_limit"), Value::Mapping(l));
    }
    if !d.descriptors.is_empty() {
        m.insert(key("descriptors"), Value::Sequence(d.descriptors.iter().map(descriptor_yaml).collect()));
    }
    for (name, on) in
        [("shadow_mode", d.shadow_mode), ("detailed_metric", d.detailed_metric), ("quota_mode", d.quota_mode)]
    {
        if on {
            m.insert(key(name), Value::Bool(true));
        }
    }
    if let Some(s) = &d.metadata {
        m.insert(key("metadata"), struct_yaml(s));
    }
    Value::Mapping(m)
}

/// A protobuf Struct as YAML (numbers stay doubles; the loader bounds its depth and size).
fn struct_yaml(s: &Struct) -> Value {
    let mut fields: Vec<(&String, &ProtoValue)> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    Value::Mapping(fields.into_iter().map(|(k, v)| (key(k), value_yaml(v))).collect())
}

fn value_yaml(v: &ProtoValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => Value::Number((*n).into()),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_yaml(s),
        Some(Kind::ListValue(l)) => Value::Sequence(l.values.iter().map(value_yaml).collect()),
    }
}

// -------------------------------------------------------------------------------------------
// The client

/// Where and how to subscribe.
#[derive(Clone, Debug)]
pub struct XdsSettings {
    /// The management server: `http://host:port`, `https://host:port`, or `host:port`.
    pub server: String,
    /// The node id the server knows this instance by (upstream's `CONFIG_GRPC_XDS_NODE_ID`).
    pub node_id: String,
    /// The node's metadata, text values (upstream's `CONFIG_GRPC_XDS_NODE_METADATA`).
    pub node_metadata: Vec<(String, String)>,
    /// Headers (gRPC metadata) sent on the stream (upstream's
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`), such as a token the server asks for.
    pub headers: Vec<(String, String)>,
    /// TLS to the server, if any.
    pub tls: Option<ClientTlsConfig>,
    /// The largest response read; a larger one fails the stream (as gRPC's own limit does).
    pub max_message_bytes: usize,
    /// The first wait before reconnecting; doubled after each failure up to `backoff_max`.
    pub backoff_initial: Duration,
    /// The longest wait before reconnecting.
    pub backoff_max: Duration,
    /// Domains of several resources merged (upstream's `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

/// TLS to the management server, as upstream's `CONFIG_GRPC_XDS_SERVER_USE_TLS`: the server's
/// certificate checked against `ca` (PEM; the system's roots without it), for the name of the
/// server's address or `san` (upstream's `CONFIG_GRPC_XDS_SERVER_TLS_SAN`), and this client's
/// own certificate chain and key (PEM) when the server asks for one.
pub fn tls(ca: Option<&[u8]>, identity: Option<(&[u8], &[u8])>, san: Option<&str>) -> ClientTlsConfig {
    let mut tls = ClientTlsConfig::new();
    tls = match ca {
        Some(pem) => tls.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    if let Some(san) = san {
        tls = tls.domain_name(san);
    }
    tls
}

/// What one response did, for the caller's logs and metrics.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Applied and ACKed: its version and the domains now running.
    Applied {
        /// The response's `version_info`.
        version: &'a str,
        /// The names of the domains applied.
        domains: &'a [&'a str],
    },
    /// Refused and NACKed: the last good configuration stays.
    Refused {
        /// The response's `version_info`.
        version: &'a str,
        /// Why (the resource and the reason).
        error: &'a EnvoyConfigError,
    },
}

/// The running subscription: stopped when dropped.
#[derive(Debug)]
pub struct XdsClient {
    task: tokio::task::JoinHandle<()>,
    responses: watch::Receiver<u64>,
}

impl XdsClient {
    /// Waits until the first response has been handled (applied or refused), as upstream waits
    /// for its first configuration event before serving.
    pub async fn first_response(&mut self) {
        let _ = self.responses.wait_for(|n| *n > 0).await;
    }
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Subscribes to the server of `settings` and keeps `service`'s domains those of its last
/// valid response, for as long as the returned client lives. `on_outcome` hears of each
/// response. Fails at once only when the server's address is not a valid URI.
pub fn subscribe(
    settings: XdsSettings,
    service: EnvoyService,
    on_outcome: impl Fn(Outcome<'_>) + Send + Sync + 'static,
) -> Result<XdsClient, String> {
    let uri = if let (Some(rest), Some(_)) = (settings.server.strip_prefix("http://"), &settings.tls) {
        // TLS asked for: tonic speaks it only to an https:// address.
        format!("https://{rest}")
    } else if settings.server.contains("://") {
        settings.server.clone()
    } else if settings.tls.is_some() {
        format!("https://{}", settings.server)
    } else {
        format!("http://{}", settings.server)
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| format!("the xDS server {uri:?} is not a valid address: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if let Some(tls) = settings.tls.clone() {
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("xDS TLS: {e}"))?;
    }
    let mut headers = Vec::with_capacity(settings.headers.len());
    for (name, text) in &settings.headers {
        let key = name.to_ascii_lowercase().parse::<MetadataKey<Ascii>>();
        match (key, text.parse::<MetadataValue<Ascii>>()) {
            (Ok(key), Ok(value)) => headers.push((key, value)),
            _ => return Err(format!("{name}: {text:?} is not a valid header")),
        }
    }
    let (counted, responses) = watch::channel(0u64);
    let on_outcome = Arc::new(on_outcome);
    let run = Run { settings, headers, service, on_outcome, counted, acked: String::new() };
    let task = tokio::spawn(run.forever(endpoint));
    Ok(XdsClient { task, responses })
}

/// The client's state across streams.
struct Run<F> {
    settings: XdsSettings,
    /// `settings.headers`, checked.
    headers: Vec<(MetadataKey<Ascii>, MetadataValue<Ascii>)>,
    service: EnvoyService,
    on_outcome: Arc<F>,
    counted: watch::Sender<u64>,
    /// The last version ACKed, sent again when a new stream opens.
    acked: String,
}

/// How a stream ended.
enum Ended {
    /// After at least one response: the server worked, so the backoff starts over.
    AfterResponses(String),
    /// Before any.
    Early(String),
}

impl<F: Fn(Outcome<'_>) + Send + Sync + 'static> Run<F> {
    async fn forever(mut self, endpoint: Endpoint) {
        let server = endpoint.uri().to_string();
        ::metrics::gauge!(crate::metrics::XDS_CONNECTED).set(0.0);
        let mut wait = self.settings.backoff_initial;
        loop {
            let ended = self.stream(&endpoint).await;
            ::metrics::gauge!(crate::metrics::XDS_CONNECTED).set(0.0);
            let why = match ended {
                Ended::AfterResponses(why) => {
                    wait = self.settings.backoff_initial;
                    why
                }
                Ended::Early(why) => why,
            };
            let pause = jittered(wait);
            tracing::warn!(server = %server, reason = %why, retry_in = ?pause,
                "no xDS stream to the management server; the last good Envoy configuration stays");
            tokio::time::sleep(pause).await;
            wait = (wait * 2).min(self.settings.backoff_max);
        }
    }

    fn request(&self, nonce: &str, version: &str, error: Option<String>) -> DiscoveryRequest {
        let metadata = (!self.settings.node_metadata.is_empty()).then(|| Struct {
            fields: self
                .settings
                .node_metadata
                .iter()
                .map(|(k, v)| (k.clone(), ProtoValue { kind: Some(Kind::StringValue(v.clone())) }))
                .collect(),
        });
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(XdsNode { id: self.settings.node_id.clone(), metadata, ..Default::default() }),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce.to_owned(),
            // INVALID_ARGUMENT, as Envoy's own NACKs.
            error_detail: error.map(|message| RpcStatus { code: 3, message, details: Vec::new() }),
            ..Default::default()
        }
    }

    /// One stream: the subscription, then each response applied or refused and answered.
    async fn stream(&mut self, endpoint: &Endpoint) -> Ended {
        let channel: Channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => return Ended::Early(format!("cannot connect: {}", source_chain(&e))),
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.settings.max_message_bytes);
        let (tx, rx) = mpsc::channel(4);
        // A new stream: no nonce yet, the version last ACKed (empty at first).
        let _ = tx.try_send(self.request("", &self.acked, None));
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        for (key, value) in &self.headers {
            request.metadata_mut().append(key.clone(), value.clone());
        }
        let mut responses = match client.stream_aggregated_resources(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return Ended::Early(format!("the stream was refused: {status}")),
        };
        ::metrics::gauge!(crate::metrics::XDS_CONNECTED).set(1.0);
        tracing::info!(server = %endpoint.uri(), node_id = %self.settings.node_id,
            "subscribed to the Envoy configuration over xDS");
        let mut answered = false;
        loop {
            let response = match responses.message().await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    let why = "the server closed the stream".to_owned();
                    return if answered { Ended::AfterResponses(why) } else { Ended::Early(why) };
                }
                Err(status) => {
                    let why = format!("{status}");
                    return if answered { Ended::AfterResponses(why) } else { Ended::Early(why) };
                }
            };
            answered = true;
            let reply = self.handle(&response);
            self.counted.send_modify(|n| *n += 1);
            if tx.send(reply).await.is_err() {
                return Ended::AfterResponses("the request stream closed".into());
            }
        }
    }

    /// Applies `response` or refuses it; answers its ACK or NACK.
    fn handle(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let version = response.version_info.as_str();
        let result = if response.type_url != TYPE_URL {
            Err(EnvoyConfigError::new(
                "xDS response",
                format!("type {:?}, not {TYPE_URL}", response.type_url),
            ))
        } else {
            config_from_resources(&response.resources, self.settings.merge_domains)
        };
        match result {
            Ok(config) => {
                let names: Vec<&str> = config.domains.iter().map(|d| d.name.as_str()).collect();
                tracing::info!(version, domains = ?names, "Envoy configuration applied from xDS");
                for warning in &config.warnings {
                    tracing::warn!("Envoy configuration: {warning}");
                }
                (self.on_outcome)(Outcome::Applied { version, domains: &names });
                self.service.replace_domains(config.domains);
                self.acked = version.to_owned();
                self.request(&response.nonce, version, None)
            }
            Err(error) => {
                tracing::error!(version, error = %error,
                    "Envoy configuration from xDS refused (NACK); the last good one stays");
                (self.on_outcome)(Outcome::Refused { version, error: &error });
                self.request(&response.nonce, &self.acked, Some(error.to_string()))
            }
        }
    }
}

/// `wait` less up to a half of it, at random, so that many instances do not reconnect at once.
fn jittered(wait: Duration) -> Duration {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    // A cheap spread from the clock's low bits: 0 to 0.5.
    let fraction = f64::from(nanos % 1000) / 2000.0;
    wait.mul_f64(1.0 - fraction)
}

/// An error and its sources, on one line.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(rlc: &proto::RateLimitConfig) -> Any {
        Any { type_url: TYPE_URL.into(), value: rlc.encode_to_vec() }
    }

    fn policy(unit: i32, n: u32) -> Option<proto::RateLimitPolicy> {
        Some(proto::RateLimitPolicy { unit, requests_per_unit: n, ..Default::default() })
    }

    #[test]
    fn resources_become_the_domains_a_file_would_make() {
        let rlc = proto::RateLimitConfig {
            name: "edge-config".into(),
            domain: "edge".into(),
            descriptors: vec![
                proto::RateLimitDescriptor {
                    key: "path".into(),
                    value: "/api/*".into(),
                    rate_limit: policy(2, 10),
                    shadow_mode: true,
                    metadata: Some(Struct {
                        fields: [(
                            "owner".to_owned(),
                            ProtoValue { kind: Some(Kind::StringValue("yes".into())) },
                        )]
                        .into(),
                    }),
                    ..Default::default()
                },
                proto::RateLimitDescriptor {
                    key: "user".into(),
                    descriptors: vec![proto::RateLimitDescriptor {
                        key: "tier".into(),
                        value: "911".into(),
                        rate_limit: policy(7, 3),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                proto::RateLimitDescriptor {
                    key: "health".into(),
                    rate_limit: Some(proto::RateLimitPolicy { unlimited: true, ..Default::default() }),
                    ..Default::default()
                },
            ],
        };
        let config = config_from_resources(&[any(&rlc)], false).unwrap();
        assert_eq!(config.domains.len(), 1);
        let dump = config.domains[0].dump();
        assert!(
            dump.contains("edge.path_/api/*: unit=MINUTE requests_per_unit=10, shadow_mode: true"),
            "{dump}"
        );
        assert!(dump.contains("edge.user.tier_911: unit=WEEK requests_per_unit=3"), "{dump}");
        assert!(dump.contains("edge.health: unit=UNKNOWN requests_per_unit=0"), "{dump}");
        let (_, _, path) = config.domains[0].root.children().find(|(k, _, _)| *k == "path").unwrap();
        let metadata = path.metadata.as_ref().unwrap();
        assert_eq!(metadata.fields["owner"].kind, Some(Kind::StringValue("yes".into())), "text stays text");
    }

    #[test]
    fn a_bad_resource_is_refused_naming_it_and_the_reason() {
        let good = proto::RateLimitConfig { name: "a".into(), domain: "a".into(), ..Default::default() };
        let bad = proto::RateLimitConfig {
            name: "broken".into(),
            domain: "b".into(),
            descriptors: vec![proto::RateLimitDescriptor {
                key: "k".into(),
                rate_limit: policy(0, 5),
                ..Default::default()
            }],
        };
        let e = config_from_resources(&[any(&good), any(&bad)], false).unwrap_err().to_string();
        assert!(e.starts_with("xDS resource 'broken': "), "{e}");
        assert!(e.contains("invalid rate limit unit 'UNKNOWN'"), "{e}");

        let twice = proto::RateLimitConfig { name: "again".into(), domain: "a".into(), ..Default::default() };
        let e = config_from_resources(&[any(&good), any(&twice)], false).unwrap_err().to_string();
        assert!(e.contains("duplicate domain 'a'"), "{e}");
        assert!(config_from_resources(&[any(&good), any(&twice)], true).is_ok(), "merged on request");

        let wrong =
            Any { type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(), value: vec![] };
        let e = config_from_resources(&[wrong], false).unwrap_err().to_string();
        assert!(e.starts_with("xDS resource #0: type"), "{e}");
        let garbage = Any { type_url: TYPE_URL.into(), value: vec![0xff, 0xff] };
        assert!(config_from_resources(&[garbage], false).unwrap_err().to_string().contains("cannot decode"));

        let many = vec![any(&good); MAX_RESOURCES + 1];
        assert!(config_from_resources(&many, true).unwrap_err().to_string().contains("more than"));
        assert!(config_from_resources(&[], false).unwrap().domains.is_empty(), "none: no domains");
    }
}
