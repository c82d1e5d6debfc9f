//! Tollgate's Redis backend: rule states in Redis, decided by the algorithms' Lua twins.
//!
//! One operation is one call of the engine, whatever the number of rules, so a multi-rule check
//! is atomic: `FCALL` of Tollgate's Redis Functions library (Redis 7.0+; see
//! [`script::library`](tollgate_core::script::library)), which defines the engine once per
//! node rather than once per call, and which the backend `FUNCTION LOAD`s on a node that
//! answers that it has not got it (after a restart, `FUNCTION FLUSH`, on a master that joined a
//! cluster); on a server without Functions, a script call (`EVALSHA`; `EVAL` with the script's
//! body when the node has not got it). The library is named after its code, so Tollgate
//! versions sharing a Redis each call their own. The engine takes `now` from Redis's `TIME`, so
//! instances with skewed clocks agree; every key it writes gets a TTL in the same step; all keys
//! of one check share a hash tag, so it runs unchanged on Redis Cluster. The Lua itself lives in `tollgate-core`, beside each algorithm's Rust form;
//! this crate only connects, names keys and maps errors.
//!
//! ```no_run
//! use tollgate_core::{Backend, Period, Rule, RuleSet};
//! use tollgate_redis::RedisBackend;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::builder("redis://127.0.0.1:6379")
//!     .prefix("myapp")
//!     .timeout(std::time::Duration::from_millis(100))
//!     .build()?;
//! let rules = RuleSet::new([Rule::gcra(10, Period::SECOND, 5)])?;
//! let decision = backend.check("user:42", &rules, 1).await?;
//! println!("allowed: {}, remaining: {}", decision.allowed(), decision.remaining());
//! # Ok(()) }
//! ```

mod coalesce;
mod conn;
mod deny_cache;
mod engine;
mod keys;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::{Cmd, RedisError, Script, ServerErrorKind, Value};
use tollgate_core::limits::MAX_BATCH_PARTS;
use tollgate_core::script::{self, Arg, StateLocation, Variant};
use tollgate_core::{Backend, BatchPlan, Clock, Decision, Error, Operation, Part, RuleSet, validate_key};
use tracing::Instrument as _;
use tracing::field::Empty;

use crate::coalesce::Coalescer;
use crate::conn::{Connections, Missing};
use crate::deny_cache::DenyCache;

pub use engine::{Engine, EngineError};
pub use keys::PrefixError;

/// The reset script's source (see the file for its arguments).
const RESET_LUA: &str = include_str!("reset.lua");

/// The reset script, with its SHA1 computed once.
static RESET_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RESET_LUA));

/// The engine's Redis Functions library (see [`script::library`]), named after its code.
static LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::named(library_name()));

/// A library's name (also its function's) and the source that loads it.
struct Library {
    name: String,
    source: String,
}

impl Library {
    fn named(name: String) -> Library {
        let source = script::library(&name);
        Library { name, source }
    }
}

/// `tollgate_` and the first 12 hex digits of the SHA1 of the library's code: another
/// Tollgate version's library, with other code, has another name, so both live in one Redis
/// (each instance calls its own), and a library of that name is this very code.
fn library_name() -> String {
    let hash = Script::new(script::library_code()).get_hash().to_owned();
    format!("tollgate_{}", &hash[..12])
}

/// Why a backend could not be configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL is not a Redis URL.
    #[error("invalid Redis URL: {0}")]
    Url(#[source] RedisError),
    /// The key prefix is unusable.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// Zero connections, or more than 64.
    #[error("connections must be between 1 and 64 (got {0})")]
    Connections(usize),
    /// A zero timeout.
    #[error("the timeout must be above zero")]
    Timeout,
    /// A batch size of 0, or above the engine's bound on parts per batch.
    #[error("coalesce must be between 1 (off) and {max} operations per call (got {0})", max = MAX_BATCH_PARTS)]
    Coalesce(usize),
}

/// Settings for a [`RedisBackend`]; start with [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    connections: usize,
    coalesce: usize,
    deny_cache: bool,
    engine: Engine,
    clock: Option<Arc<dyn Clock>>,
}

impl RedisBackendBuilder {
    /// Which engine decides inside Redis (default [`Engine::Auto`]: the Tollgate Redis
    /// module's `TOLLGATE.DECIDE` where Redis has it loaded, else the Lua). Both use the same
    /// keys and state encoding, so the module can be loaded or unloaded under load. With
    /// [`Engine::Module`], check with [`RedisBackend::require_module`] before serving.
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Namespace for every key (default `tollgate`): keys are `<prefix>:{<key>}:<rule>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Longest wait for Redis on one operation, connecting included (default 250 ms). A dead or
    /// hung Redis gives [`Error::Timeout`] or [`Error::Unavailable`] within it, never a hang.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Multiplexed connections to spread operations over (default 2).
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }

    /// Coalesce concurrent operations into script calls of up to `parts` operations each
    /// (default 32; 1 turns coalescing off). Nothing waits to fill a batch: an operation that
    /// finds a free connection goes at once, alone; while every connection has a call in
    /// flight, the operations arriving meanwhile go together in the next. Each operation stays
    /// its own all-or-nothing group, so results are those of separate calls, while Redis pays
    /// a script call's fixed costs once per batch.
    pub fn coalesce(mut self, parts: usize) -> Self {
        self.coalesce = parts;
        self
    }

    /// Answer a key denied until T locally until T (default on): T is the denial's own
    /// `retry_after`, counted from when the request was sent, so no answer differs from what
    /// Redis would say, except after a reset or refund of that key through another instance.
    /// Every cached denial is dropped when a connection to Redis is lost or seen to close (a
    /// restarted Redis may have lost the counts behind it).
    /// Rule sets with concurrency leases are never cached. Off when a clock is injected (the
    /// cache runs on real time).
    pub fn deny_cache(mut self, enabled: bool) -> Self {
        self.deny_cache = enabled;
        self
    }

    /// Decide at `clock`'s time instead of Redis's `TIME` (for tests that move time by hand).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The backend. Connections are opened on first use, so this succeeds while Redis is down;
    /// call it within a Tokio runtime.
    pub fn build(self) -> Result<RedisBackend, ConfigError> {
        keys::validate_prefix(&self.prefix)?;
        if !(1..=64).contains(&self.connections) {
            return Err(ConfigError::Connections(self.connections));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        if !(1..=MAX_BATCH_PARTS).contains(&self.coalesce) {
            return Err(ConfigError::Coalesce(self.coalesce));
        }
        let connection_failures = Arc::new(AtomicU64::new(0));
        let connections =
            Connections::open(&self.url, self.timeout, self.connections, Arc::clone(&connection_failures))
                .map_err(ConfigError::Url)?;
        // A script call on Redis Cluster may hold only one slot's keys, and operations of
        // different keys rarely share one: on a cluster each operation goes alone.
        let cluster = connections.is_cluster();
        let coalesce = if cluster { 1 } else { self.coalesce };
        let deny_cache = (self.deny_cache && self.clock.is_none()).then(DenyCache::new);
        let client = Arc::new(Client {
            connections,
            scripts: std::array::from_fn(|_| OnceLock::new()),
            functions: AtomicBool::new(true),
            engine: engine::Choice::new(self.engine, cluster),
            prefix: self.prefix.into(),
            timeout: self.timeout,
            clock: self.clock,
            connection_failures,
        });
        let coalescer = (coalesce > 1).then(|| Coalescer::start(Arc::clone(&client), coalesce));
        Ok(RedisBackend { client, coalescer, deny_cache })
    }
}

/// Rule states in Redis. See the [crate docs](crate).
pub struct RedisBackend {
    client: Arc<Client>,
    /// Present when operations are coalesced into batches.
    coalescer: Option<Coalescer>,
    /// Present when denials are answered locally until they expire.
    deny_cache: Option<DenyCache>,
}

/// The backend's side of Redis, which every operation (and the coalescer) uses: connections,
/// prepared scripts, key names, timeout, clock.
pub(crate) struct Client {
    connections: Connections,
    /// One prepared script (source and SHA1) per variant, made on first use: the fallback
    /// when Redis has no Functions.
    scripts: [OnceLock<Script>; Variant::COUNT],
    /// Whether calls go to the library (`FCALL`): until a node says it has no Redis Functions
    /// (before 7.0), then scripts for the backend's life. Tollgate's Redis nodes are one
    /// version, so one answer holds for all.
    functions: AtomicBool,
    /// The engine chosen, and what `auto` learnt of the module.
    engine: engine::Choice,
    prefix: Arc<str>,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    /// Connection failures seen so far: calls that failed on a lost connection, and
    /// connections the client saw close, even with no call on them (a Redis restarted while
    /// every answer came from the deny cache). A connection that failed may come back to a
    /// Redis that lost its state (restarted empty, or a replica promoted before it had every
    /// write), so a denial cached before the latest failure is no longer trusted.
    connection_failures: Arc<AtomicU64>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("connections", &self.client.connections.call_slots())
            .field("cluster", &self.client.connections.is_cluster())
            .field("prefix", &self.client.prefix)
            .field("timeout", &self.client.timeout)
            .field("coalesce", &self.coalescer.as_ref().map(Coalescer::max_parts))
            .field("explicit_clock", &self.client.clock.is_some())
            .finish()
    }
}

/// Maps a client error to Tollgate's: unreachable or not-serving-now Redis is `Unavailable`
/// (the failure policy's business), anything else is a `Backend` failure.
fn map_error(err: RedisError, timeout: Duration) -> Error {
    let unavailable = matches!(
        err.kind(),
        redis::ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    );
    if err.is_timeout() {
        Error::Timeout(timeout)
    } else if unavailable || err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
        Error::Unavailable(Box::new(err))
    } else {
        Error::Backend(Box::new(err))
    }
}

impl RedisBackend {
    /// Settings for a backend on `url` (`redis://`, `rediss://`, with `user:password@` if needed).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            prefix: "tollgate".into(),
            timeout: Duration::from_millis(250),
            connections: 2,
            coalesce: 32,
            deny_cache: true,
            engine: Engine::default(),
            clock: None,
        }
    }

    /// Checks that every node the backend reaches has the Tollgate Redis module loaded (its
    /// `TOLLGATE.DECIDE`), as [`Engine::Module`] needs: a server configured so refuses to
    /// start without it.
    pub async fn require_module(&self) -> Result<(), Error> {
        for conn in self.client.bounded(self.client.connections.all()).await? {
            let mut conn = conn.clone();
            let info: Value = self
                .client
                .bounded(async move {
                    redis::cmd("COMMAND").arg("INFO").arg(engine::MODULE_COMMAND).query_async(&mut conn).await
                })
                .await?;
            let missing = match &info {
                Value::Array(entries) => entries.iter().all(|e| matches!(e, Value::Nil)),
                _ => true,
            };
            if missing {
                return Err(Error::Backend(
                    "the Tollgate Redis module is not loaded (redis-server --loadmodule \
                     libtollgate_redis_module.so), and the engine is \"module\""
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The Redis keys holding `key`'s state under `rules`, in the rules' order: hash-stored
    /// rules (fixed window, sliding window counter, token bucket, GCRA) have fields in one hash
    /// per key, `<prefix>:{<key>}:h`, prefixed by the rule's id; sorted-set rules (sliding log,
    /// concurrency) have a key each, `<prefix>:{<key>}:<signature>`.
    pub fn state_keys(&self, key: &str, rules: &RuleSet) -> Vec<String> {
        self.client.state_keys(key, rules)
    }
}

impl Client {
    fn state_keys(&self, key: &str, rules: &RuleSet) -> Vec<String> {
        let tagged = keys::tagged(&self.prefix, key);
        script::locations(rules)
            .map(|location| match location {
                StateLocation::Own { signature } => keys::state_key(&tagged, signature),
                StateLocation::SharedHash { .. } => keys::state_key(&tagged, script::SHARED_HASH),
            })
            .collect()
    }

    /// Runs `parts` in one script call.
    pub(crate) async fn run(&self, parts: &[Part<'_>]) -> Result<Vec<Decision>, Error> {
        let args = script::arguments(parts, self.clock.as_ref().map(|c| c.now()));
        self.send(parts, args).await
    }

    /// Runs a planned batch in one script call, its groups planned once (by `batch`); the
    /// decisions are in the order the parts are sent: group after group.
    pub(crate) async fn run_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        let (parts, args) = script::batch_arguments(batch, self.clock.as_ref().map(|c| c.now()));
        self.send(&parts, args).await
    }

    /// Sends `parts` with their arguments `args` in one script call.
    async fn send(&self, parts: &[Part<'_>], args: Vec<Arg<'_>>) -> Result<Vec<Decision>, Error> {
        let variant = Variant::of_parts(parts);
        let keys: Vec<String> = parts.iter().flat_map(|part| self.state_keys(part.key, part.rules)).collect();
        // `verb [script] numkeys KEYS ARGV`: the module's command takes no script.
        let call = |verb: &str, script: Option<&str>| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(keys.len()).arg(&keys);
            for arg in &args {
                match arg {
                    Arg::Int(n) => cmd.arg(n),
                    Arg::Text(s) => cmd.arg(s),
                };
            }
            cmd
        };
        let key = keys.first().map_or("", String::as_str);
        metrics::counter!(engine::OPERATIONS_METRIC).increment(parts.len() as u64);
        let reply = self.bounded(self.call(call, key, variant)).await?;
        let reply: Vec<i64> = redis::from_redis_value(reply).map_err(|e| Error::Backend(Box::new(e)))?;
        let (_, decisions) = script::decode(parts, &reply).map_err(|e| Error::Backend(Box::new(e)))?;
        Ok(decisions)
    }

    /// Sends a call of the engine, made by `call(verb, function or script)`, whose first key is
    /// `key`: `FCALL` of the library while the server has Redis Functions, `EVALSHA` of
    /// `variant`'s script (the fallback) once it is seen not to.
    async fn call(
        &self,
        call: impl Fn(&str, Option<&str>) -> Cmd + Sync,
        key: &str,
        variant: Variant,
    ) -> Result<Value, RedisError> {
        let slot = if self.engine.per_slot() { keys::slot(key) } else { 0 };
        if self.engine.module_first(slot) {
            let sent =
                self.connections.script(call(engine::MODULE_COMMAND, None), Missing::Module { key }).await;
            match sent {
                Err(e) if engine::is_unknown_command(&e) && self.engine.engine() == Engine::Auto => {
                    // On a Cluster, every slot of the master that refused (a map we cannot read
                    // marks this slot alone, and the next slot asks again).
                    let slots = if self.engine.per_slot() {
                        self.connections.slots_served_with(key).await.unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    self.engine.module_missing(slots.into_iter().flatten().chain([slot]));
                }
                Err(e) => return Err(e),
                Ok(reply) => {
                    self.engine.module_answered(slot);
                    metrics::counter!(engine::CALLS_METRIC, "engine" => "module").increment(1);
                    return Ok(reply);
                }
            }
        }
        metrics::counter!(engine::CALLS_METRIC, "engine" => "lua").increment(1);
        if self.functions.load(Ordering::Relaxed) {
            let library = &*LIBRARY;
            let load = redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&library.source).to_owned();
            let missing = Missing::Library { load: &load, key };
            match self.connections.script(call("FCALL", Some(&library.name)), missing).await {
                Err(e) if conn::functions_unavailable(&e) => self.functions.store(false, Ordering::Relaxed),
                result => return result,
            }
        }
        let prepared = self.scripts[variant.index()].get_or_init(|| Script::new(variant.source()));
        let eval = || call("EVAL", Some(variant.source()));
        self.connections.script(call("EVALSHA", Some(prepared.get_hash())), Missing::Script(&eval)).await
    }

    /// `result`, recorded on its [`redis_span`]: the engine that answered, or the error.
    fn traced<T>(&self, span: &tracing::Span, result: Result<T, Error>) -> Result<T, Error> {
        if span.is_disabled() {
            return result;
        }
        match &result {
            Ok(_) => {
                span.record("tollgate.engine", self.engine.current());
            }
            Err(e) => {
                let kind = match e {
                    Error::Timeout(_) => "timeout",
                    Error::Unavailable(_) => "unavailable",
                    _ => "error",
                };
                span.record("error.type", kind);
                span.record("otel.status_code", "ERROR");
            }
        }
        result
    }

    /// Runs `fut` within the timeout, mapping errors.
    async fn bounded<T>(&self, fut: impl Future<Output = Result<T, RedisError>>) -> Result<T, Error> {
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => result.map_err(|e| map_error(e, self.timeout)),
            Err(_) => Err(Error::Timeout(self.timeout)),
        };
        if let Err(e @ (Error::Timeout(_) | Error::Unavailable(_))) = &result {
            // Behind Sentinel, the master may have moved (a demoted one answers READONLY).
            self.connections.failed();
            // A timeout alone says nothing of Redis's state; a lost connection may.
            if matches!(e, Error::Unavailable(_)) {
                self.connection_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        op.validate(key, rules)?;
        let check = match op {
            Operation::Check { cost } => Some(cost),
            Operation::Refund { .. } => {
                if let Some(cache) = &self.deny_cache {
                    cache.forget(key, rules);
                }
                None
            }
            Operation::Acquire { .. } | Operation::Release { .. } => None,
        };
        // Read before the call: a failure during it makes what it decides untrusted too.
        let epoch = self.client.connection_failures.load(Ordering::Relaxed);
        if let (Some(cache), Some(cost)) = (&self.deny_cache, check)
            && let Some(denied) = cache.get(key, rules, cost, epoch)
        {
            metrics::counter!(deny_cache::HITS_METRIC).increment(1);
            return Ok(denied);
        }
        let sent = tokio::time::Instant::now();
        let span = redis_span(operation_name(op), 1, self.coalescer.is_some());
        let decided = async {
            match &self.coalescer {
                Some(coalescer) => coalescer.execute(key, rules, op).await,
                None => {
                    let mut decisions = self.client.run(&[Part::operation(key, rules, op)]).await?;
                    Ok(decisions.pop().unwrap_or_else(|| unreachable!("one part, one decision")))
                }
            }
        };
        let decision = self.client.traced(&span, decided.instrument(span.clone()).await)?;
        if let (Some(cache), Some(cost)) = (&self.deny_cache, check) {
            cache.put(key, rules, cost, sent, epoch, &decision);
        }
        Ok(decision)
    }

    /// One script call for the whole batch (a batch of one part: as a lone operation). On
    /// Redis Cluster a call may hold one slot's keys only, and the keys of different parts
    /// share no hash tag: there each group is split by key, one call per key, so a group is all
    /// or nothing within each key, and across keys the calls are made one after another (as
    /// envoyproxy/ratelimit charges every descriptor).
    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        let parts = batch.parts();
        if let [part] = parts {
            // A batch of one part (an Envoy request of one descriptor) goes the way of a lone
            // operation: coalesced with other callers' into shared calls, and a denial answered
            // by the denial cache.
            return Ok(vec![self.execute(part.key, part.rules, part.op).await?]);
        }
        // The script wants each group's parts together: they are sent group by group.
        let cluster = self.client.connections.is_cluster();
        let calls: Vec<Vec<usize>> = if cluster {
            batch.groups().flat_map(|group| split_by_key(parts, group.iter().copied())).collect()
        } else {
            vec![batch.groups().flatten().copied().collect()]
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; parts.len()];
        for order in calls {
            let span = redis_span("check_batch", order.len(), false);
            let decided = if !cluster {
                // The batch's own groups, with the plans it was validated by.
                self.client.run_planned(batch).instrument(span.clone()).await
            } else {
                let sent: Vec<Part<'_>> = order.iter().map(|&i| parts[i]).collect();
                self.client.run(&sent).instrument(span.clone()).await
            };
            let decided = self.client.traced(&span, decided)?;
            for (&i, decision) in order.iter().zip(decided) {
                decisions[i] = Some(decision);
            }
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    fn engine(&self) -> Option<&'static str> {
        Some(self.client.engine.current())
    }

    /// One pipeline on the key's slot: `ZADD` this instance at now (ms), `ZREMRANGEBYSCORE`
    /// the instances not seen within `window`, `PEXPIRE` the set by `window` (a key nobody
    /// reserves on goes), `ZCARD`. Now is the injected clock's, else this host's: scores are
    /// only compared with `window`, which is long beside clock skews.
    async fn heartbeat(&self, key: &str, instance: &str, window: Duration) -> Result<u64, Error> {
        validate_key(key)?;
        let set = keys::state_key(&keys::tagged(&self.client.prefix, key), keys::INSTANCES);
        let now = self.client.clock.as_ref().map_or_else(
            || tollgate_core::Timestamp::from_system_time(std::time::SystemTime::now()),
            |clock| clock.now(),
        );
        let now_ms = now.as_micros() / 1000;
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD").arg(&set).arg(now_ms).arg(instance).ignore();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&set)
            .arg("-inf")
            .arg(format!("({}", now_ms.saturating_sub(window_ms)))
            .ignore();
        pipe.cmd("PEXPIRE").arg(&set).arg(window_ms).ignore();
        pipe.cmd("ZCARD").arg(&set);
        let (count,): (u64,) = self
            .client
            .bounded(async {
                let mut conn = self.client.connections.next().await?;
                pipe.query_async(&mut conn).await
            })
            .await?;
        Ok(count.max(1))
    }

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        if let Some(cache) = &self.deny_cache {
            cache.forget(key, rules);
        }
        // Own keys go; in a shared hash only this set's fields do (other rule sets of the same
        // key may keep theirs there). One script call, sent as a check is: atomic, so a reset
        // is never half done, and on a cluster it follows `ASK`, `MOVED`, `TRYAGAIN` and a
        // fail-over as a check does (a `MULTI` sent by the cluster client followed none of
        // them: its retries are off, see `Connections::open`).
        let keys = self.client.state_keys(key, rules);
        let mut args: Vec<String> = Vec::new();
        for location in script::locations(rules) {
            match location {
                StateLocation::Own { .. } => args.push("0".to_owned()),
                StateLocation::SharedHash { prefix, fields } => {
                    args.push(fields.len().to_string());
                    args.extend(fields.iter().map(|f| format!("{prefix}{f}")));
                }
            }
        }
        let call = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(keys.len()).arg(&keys).arg(&args);
            cmd
        };
        let eval = || call("EVAL", RESET_LUA);
        let evalsha = call("EVALSHA", RESET_SCRIPT.get_hash());
        let span = redis_span("reset", 1, false);
        let reset = self.client.bounded(self.client.connections.script(evalsha, Missing::Script(&eval)));
        let reset = reset.instrument(span.clone()).await;
        self.client.traced(&span, reset)?;
        Ok(())
    }

    /// `PING` on every connection, each within the timeout: a connection that failed earlier
    /// reconnects on its next use, so a probe that passes leaves them all usable.
    async fn ping(&self) -> Result<(), Error> {
        let mut result = Ok(());
        for conn in self.client.bounded(self.client.connections.all()).await? {
            let conn = &conn;
            let ping = || {
                let mut conn = conn.clone();
                self.client.bounded(async move { redis::cmd("PING").query_async::<()>(&mut conn).await })
            };
            // A connection that failed before answers its first use with the old error and
            // reconnects; one retry (not after a timeout, which would only double the wait)
            // sees the new connection.
            let pinged = match ping().await {
                Err(e) if !matches!(e, Error::Timeout(_)) => ping().await,
                other => other,
            };
            result = result.and(pinged);
        }
        result
    }
}

/// The span of one call to Redis (docs/api.md, "Tracing"): `operation` is Tollgate's
/// (check, acquire, release, refund, check_batch, reset), `parts` the operations the call
/// carries. At DEBUG, as the limiter's spans: with tracing off its callsite is disabled. With
/// coalescing it covers the wait for the batch this operation joined, and says so; a denial
/// answered from the deny cache makes no call, and no span.
fn redis_span(operation: &'static str, parts: usize, coalesced: bool) -> tracing::Span {
    tracing::debug_span!(
        "redis",
        otel.kind = "client",
        db.system.name = "redis",
        tollgate.operation = operation,
        tollgate.parts = parts,
        tollgate.coalesced = coalesced,
        tollgate.engine = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// An operation's name, as [`redis_span`] records it.
fn operation_name(op: Operation<'_>) -> &'static str {
    match op {
        Operation::Check { .. } => "check",
        Operation::Acquire { .. } => "acquire",
        Operation::Release { .. } => "release",
        Operation::Refund { .. } => "refund",
    }
}

/// The parts of one group (indices into `parts`), split by key in the order keys first appear.
fn split_by_key(parts: &[Part<'_>], group: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
    let mut by_key: Vec<Vec<usize>> = Vec::new();
    for i in group {
        match by_key.iter_mut().find(|same| parts[same[0]].key == parts[i].key) {
            Some(same) => same.push(i),
            None => by_key.push(vec![i]),
        }
    }
    by_key
}
