//! Tollgate's configuration file: the TOML model (server, backend, named policies), its
//! validation, with the line of every mistake, and [`watch`]ing the file to reload it.
//!
//! The file is documented field by field in `tollgate.example.toml` at the repository's root,
//! which is also the configuration used when none is given ([`Config::builtin`]).
//!
//! ```
//! use tollgate_config::Config;
//!
//! let config = Config::from_toml(r#"
//!     [policies.api]
//!     rules = [{ algorithm = "fixed_window", limit = 10, period = "1s" }]
//! "#, "inline")?;
//! assert_eq!(config.policies.get("api").unwrap().rules.len(), 1);
//!
//! let err = Config::from_toml(r#"
//!     [policies.api]
//!     rules = [{ algorithm = "fixed_window", limit = 0, period = "1s" }]
//! "#, "inline").unwrap_err();
//! assert_eq!(err.line(), Some(3));
//! # Ok::<(), tollgate_config::ConfigError>(())
//! ```

mod model;
mod redis_url;
mod spec;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_http::{HeaderSet, ResetHeader};
use tollgate_limiter::{LimiterSettings, Policy, SixPeriods};

pub use redis_url::{NotARedisUrl, RedisTopology};
pub use spec::{
    MAX_APPS, MAX_WAIT_LIMIT, OnLimitKind, PolicySpec, SpecError, rule_error_field, valid_policy_name,
};
pub use watch::{Watcher, watch, watch_path};

/// The example configuration shipped at the repository's root, used when no file is given.
pub const EXAMPLE_TOML: &str = include_str!("../../../tollgate.example.toml");

/// Longest policy name, in bytes.
pub const MAX_POLICY_NAME_BYTES: usize = 64;

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `[server]` section.
    pub server: ServerSettings,
    /// The `[backend]` section.
    pub backend: BackendSettings,
    /// The `[memory]` section.
    pub memory: MemorySettings,
    /// The named policies.
    pub policies: Policies,
    /// The `[consumers]` section.
    pub consumers: ConsumerSettings,
    /// The `[tracing]` section.
    pub tracing: TracingSettings,
}

/// The `[consumers]` section: limits for `{"consumer": ...}` and `{"anonymous_ip": ...}` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerSettings {
    /// Limits of consumers that have no active limit record.
    pub defaults: SixPeriods,
    /// Requests per hour from one anonymous IP address.
    pub anonymous_per_hour: u64,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        ConsumerSettings { defaults: SixPeriods::UNLIMITED, anonymous_per_hour: 1000 }
    }
}

/// The `[server]` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSettings {
    /// Address of the HTTP API.
    pub listen: SocketAddr,
    /// How `X-RateLimit-Reset` is written.
    pub reset_header: ResetHeader,
    /// Which rate-limit headers a decision's answer carries.
    pub headers: HeaderSet,
    /// Logs as JSON lines instead of text.
    pub json_logs: bool,
    /// Most requests held at once by `on_limit = "delay"` policies.
    pub max_delayed: usize,
    /// The most bytes the state of one key under a request's inline rules may take at worst
    /// ([`RuleSet::worst_case_state`](tollgate_core::RuleSet::worst_case_state)); a request
    /// whose inline `limits` (or inline concurrency `limit` and `lease`) could store more is
    /// refused. Policies from the file or the database are not held to it.
    pub max_request_state: u64,
    /// Whether requests may bring their own rules (`limits` in `/v1/check` and `/v1/reset`,
    /// `limit` and `lease` in `/v1/acquire` and `/v1/release`). When false, only configured and
    /// stored policies are applied.
    pub inline_limits: bool,
    /// Bounds on HTTP connections and requests (`tollgate serve` and `tollgate proxy`).
    pub connections: ConnectionSettings,
}

/// Bounds on HTTP connections and requests, so that slow or idle clients cannot hold the
/// server's connections: the `[server]` keys `header_timeout`, `body_timeout`, `idle_timeout`
/// and `max_connections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Longest wait for a request's head, from the connection's opening or from the first
    /// byte after it went idle. Default 10 s: a head is a few hundred bytes, sent in one
    /// round trip even on a poor mobile link, yet a client trickling one must not hold a
    /// connection for minutes.
    pub header_timeout: Duration,
    /// Longest wait for a request's whole body, from the server's first wait for its bytes
    /// (right after the head: handlers read the body at once). Default 30 s: the API's bodies
    /// are at most 64 KiB, a second's upload on slow links; the proxy streams uploads of any
    /// size, so raise it there for large ones.
    pub body_timeout: Duration,
    /// Longest a keep-alive connection stays open with no request in flight and nothing
    /// received. Default 75 s (nginx's): longer than the 60 s idle timeout of common load
    /// balancers, so that they close first and never send a request on a connection we are
    /// closing.
    pub idle_timeout: Duration,
    /// Most connections open at once; past it new connections wait in the listen backlog
    /// (4,096) and idle ones are closed to make room. Default 10,000: well under the usual
    /// 65,536 open files, at about 10 KB of buffers each (100 MB).
    pub max_connections: usize,
    /// Most connections open at once from one client address (IPv6: one /64, what one host
    /// is usually given); past it, a new connection from that address is closed at once, so
    /// one client cannot take the whole `max_connections` and make everyone else wait. 0
    /// turns it off. Default 1,000: far above what a service's connection pool or Envoy
    /// opens, a tenth of the default `max_connections`. Raise it (or turn it off) when a
    /// load balancer or NAT puts many clients behind one address.
    pub max_connections_per_address: usize,
    /// Threads that serve connections (`connection_threads`). Default: one per core.
    pub threads: ConnectionThreadCount,
}

/// How many threads serve the listeners' connections: `[server] connection_threads`, a number
/// (0: none of their own).
///
/// Each connection thread runs its own event loop, and a connection stays on the one it was
/// handed to for life: its task, socket, timers and (HTTP/2) stream tasks never move between
/// cores. `Shared` serves connections as tasks of Tokio's work-stealing runtime instead (with
/// the server's other work), where they do; it measured slower on both decision paths, most on many
/// HTTP/2 calls over few connections (docs/benchmarks.md, "Connection threads").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnectionThreadCount {
    /// One per core (what the OS lets the process use).
    #[default]
    PerCore,
    /// This many.
    Exactly(std::num::NonZeroUsize),
    /// None: connections are tasks of the shared runtime (`connection_threads = 0`).
    Shared,
}

impl ConnectionThreadCount {
    /// Most threads `connection_threads` may ask for.
    pub const MAX: usize = 1024;

    /// The number of threads to start (0 for `Shared`).
    pub fn resolve(self) -> usize {
        match self {
            ConnectionThreadCount::PerCore => std::thread::available_parallelism().map_or(1, usize::from),
            ConnectionThreadCount::Exactly(n) => n.get(),
            ConnectionThreadCount::Shared => 0,
        }
    }
}

impl ConnectionSettings {
    /// Most connections allowed (`max_connections` above is refused).
    pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            max_connections: 10_000,
            max_connections_per_address: 1_000,
            threads: ConnectionThreadCount::PerCore,
        }
    }
}

/// The `[memory]` section: the in-memory backend, and the local fallback the limiter uses
/// while Redis fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySettings {
    /// Most keys held; past it, the keys whose state expires soonest are forgotten early
    /// (default [`tollgate_core::DEFAULT_MAX_KEYS`]).
    pub max_keys: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        MemorySettings { max_keys: tollgate_core::DEFAULT_MAX_KEYS }
    }
}

/// The `[tracing]` section: OpenTelemetry spans of each request, decision and backend call,
/// sent over OTLP (gRPC). Off unless an endpoint is given.
#[derive(Clone, Debug, PartialEq)]
pub struct TracingSettings {
    /// The OTLP collector's gRPC endpoint (`http://host:4317`, or `https://` for TLS); None
    /// turns tracing off (the default), and no exporter is made.
    pub otlp_endpoint: Option<String>,
    /// The share of traces started here that are sampled, 0 to 1 (default 1). A request
    /// carrying a W3C `traceparent` follows its caller's sampling decision instead.
    pub sample_ratio: f64,
    /// The `service.name` of the spans (default `tollgate`).
    pub service_name: String,
    /// How long finished spans wait to be sent together (default 5 s; the SDK's
    /// `OTEL_BSP_SCHEDULE_DELAY`). What is waiting is sent at shutdown too.
    pub export_delay: Duration,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "tollgate".into(),
            export_delay: Duration::from_secs(5),
        }
    }
}

impl TracingSettings {
    /// Longest [`export_delay`](Self::export_delay).
    pub const MAX_EXPORT_DELAY: Duration = Duration::from_secs(60);

    /// Whether spans are exported.
    pub fn enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }

    /// Refuses an OTLP endpoint that is not an `http://` or `https://` URL with a host (the
    /// reason, for an error naming where the value came from).
    pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
        let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://"));
        let authority = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
        match authority {
            _ if endpoint.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                Err(format!("{endpoint:?} has spaces or control characters"))
            }
            Some(host) if !host.is_empty() && !host.starts_with(':') && !host.contains('@') => Ok(()),
            Some(_) => Err(format!("{endpoint:?} has no host (write it as http://host:4317)")),
            None => {
                Err(format!("{endpoint:?} is not an http:// or https:// URL (write it as http://host:4317)"))
            }
        }
    }
}

/// The default `[server] max_request_state`: 256 KiB.
///
/// Rules with constant state (fixed window, sliding window counter, token bucket, GCRA) take
/// about 64 bytes each, so any inline set of them fits many times over. The state that grows
/// is a sliding log's (130 bytes per entry, up to its limit) and a concurrency rule's (290
/// bytes per lease, up to its limit): 256 KiB holds logs totalling about 2,000 entries, or
/// about 900 leases, per key. Issue 18's request (16 logs of 10,000 over a year, 20.8 MB per
/// key at worst) is refused, as is an inline concurrency limit of 10,000 (2.9 MB). Larger
/// limits belong in a configured policy, which an operator sized on purpose; a key this size
/// is still one Redis expires or deletes in well under a millisecond.
pub const DEFAULT_MAX_REQUEST_STATE: u64 = 256 * 1024;

/// The values `[server] max_request_state` may take: from 1 KiB, below which even a few fixed
/// windows would not fit, to 1 GiB.
pub const MAX_REQUEST_STATE_RANGE: std::ops::RangeInclusive<u64> = 1024..=1 << 30;

/// Where rule states live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// In this process (the default; no server needed; per instance).
    #[default]
    Memory,
    /// In Redis, shared by every instance.
    Redis,
}

impl BackendKind {
    /// The name in the file (`memory`, `redis`), also the limiter's `backend` metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
        }
    }
}

/// Which engine decides inside Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisEngine {
    /// The module's command wherever a node has the module loaded, the Lua elsewhere (the
    /// default).
    #[default]
    Auto,
    /// The Tollgate Redis module only: a node without it is an error.
    Module,
    /// The Lua twins only, even where the module is loaded.
    Lua,
}

impl RedisEngine {
    /// The name in the file and on the command line (`auto`, `module`, `lua`).
    pub fn as_str(self) -> &'static str {
        match self {
            RedisEngine::Auto => "auto",
            RedisEngine::Module => "module",
            RedisEngine::Lua => "lua",
        }
    }
}

impl std::str::FromStr for RedisEngine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(RedisEngine::Auto),
            "module" => Ok(RedisEngine::Module),
            "lua" => Ok(RedisEngine::Lua),
            other => Err(format!("the Redis engine is auto, module or lua (got {other:?})")),
        }
    }
}

/// The `[backend]` section.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    /// Memory or Redis.
    pub kind: BackendKind,
    /// The Redis URL (`redis://` or `rediss://`, with `user:password@` if needed), or a Redis
    /// Cluster's seed nodes (`redis+cluster://host1:port1,host2:port2`), or Sentinel's
    /// (`redis+sentinel://host1:port1,host2:port2/service`).
    pub url: Option<String>,
    /// Prefix of every Redis key.
    pub prefix: String,
    /// Which engine decides inside Redis.
    pub engine: RedisEngine,
    /// Longest wait for one Redis call.
    pub timeout: Duration,
    /// Redis connections (each multiplexed).
    pub connections: usize,
    /// Most operations coalesced into one Redis script call (1: none).
    pub coalesce: usize,
    /// Whether denials are answered locally until they expire.
    pub deny_cache: bool,
    /// Failure policy and circuit breaker.
    pub limiter: LimiterSettings,
}

impl BackendSettings {
    /// Switches to Redis at `url` (what `--redis` does).
    pub fn use_redis(&mut self, url: impl Into<String>) -> Result<(), ConfigError> {
        let url = url.into();
        RedisTopology::of_url(&url).map_err(|e| ConfigError::at("--redis", None, e.to_string()))?;
        self.kind = BackendKind::Redis;
        self.url = Some(url);
        Ok(())
    }
}

/// Named policies, by name.
#[derive(Clone, Debug, Default)]
pub struct Policies(BTreeMap<String, Arc<Policy>>);

impl Policies {
    /// The policy called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.0.get(name)
    }

    /// Every policy, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<Policy>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The number of policies.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A configuration that cannot be used, with where the mistake is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or not a valid configuration.
    #[error("{origin}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// The file (or `builtin`, `--redis`, ...).
        origin: String,
        /// The line of the mistake, when known (1-based).
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    fn at(origin: &str, line: Option<usize>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { origin: origin.into(), line, message: message.into() }
    }

    /// The line of the mistake, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } => *line,
            ConfigError::Read { .. } => None,
        }
    }
}

impl Config {
    /// The file's policies whose state for one key could take more than
    /// `[server] max_request_state` at worst, with that figure. They are applied all the same
    /// (the budget holds only a stranger's inline rules; an operator's policy is sized on
    /// purpose), but worth a warning: a caller with many keys can fill each one.
    pub fn policies_over_budget(&self) -> Vec<(&str, u64)> {
        self.policies
            .iter()
            .map(|(name, policy)| (name, policy.rules.worst_case_state()))
            .filter(|&(_, bytes)| bytes > self.server.max_request_state)
            .collect()
    }

    /// Parses and validates `text`; `origin` names it in errors (a path, or `builtin`).
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        model::parse(text, origin)
    }

    /// Reads, parses and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// The configuration used when no file is given: `tollgate.example.toml`, built in.
    pub fn builtin() -> Config {
        Self::from_toml(EXAMPLE_TOML, "builtin").expect("the example configuration is valid")
    }

    /// The limiter's settings: the backend's failure handling, the server's delay bound and
    /// the memory cap for the local fallback.
    pub fn limiter_settings(&self) -> LimiterSettings {
        LimiterSettings {
            max_delayed: self.server.max_delayed,
            fallback_max_keys: self.memory.max_keys,
            ..self.backend.limiter.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_valid_and_uses_memory() {
        let config = Config::builtin();
        assert_eq!(config.backend.kind, BackendKind::Memory);
        assert_eq!(config.server.listen, "127.0.0.1:8080".parse().unwrap());
        assert!(config.policies.len() >= 4);
    }
}
