//! Connections: multiplexed connections to one Redis, or one cluster-aware connection to a
//! Redis Cluster, behind one type the scripts and commands are sent on.
//!
//! A Redis Cluster URL lists seed nodes after the scheme, comma-separated:
//! `redis+cluster://[user:password@]host1:port1,host2:port2` (`rediss+cluster://` for TLS).
//! The cluster client of the `redis` crate finds the rest of the cluster, follows `MOVED` and
//! `ASK` redirections and re-reads the slot map after a fail-over; an `ASK` it fails to follow
//! is followed here ([`Connections::script`]). Every key of one check shares a hash tag, so each
//! script call lives in one slot and runs unchanged.
//!
//! A Sentinel URL lists the sentinels and names the service:
//! `redis+sentinel://[user:password@]host1:port1,host2:port2/service` (the credentials are the
//! Redis master's). The master is asked of the sentinels on first use and again after any
//! failed call, so a fail-over is followed within a call or two.
//!
//! Every connection speaks RESP3 (Redis 6 and later; Tollgate needs 7.0), whatever the URL
//! says, for one thing RESP2 cannot give: the client is told the moment a connection closes,
//! not at its next use. The redis crate then reconnects at once, so the first call after a
//! dropped connection does not fail on it; and the backend counts the loss
//! ([`Connections::open`]'s `lost`), so denials cached from a Redis that may have restarted
//! empty are dropped even when no call happens to fail.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo, PushKind,
    RedisError, RedisFuture, ServerErrorKind, Value,
};
use tokio::sync::OnceCell;

/// Where operations go.
pub(crate) enum Connections {
    /// One Redis: operations spread over several multiplexed connections.
    Single { connections: Box<[ConnectionManager]>, next: AtomicUsize },
    /// A Redis Cluster: one multiplexed connection per node, owned by the cluster client,
    /// opened on first use (so a backend builds while the cluster is down).
    Cluster(Box<Cluster>),
    /// A master found through Redis Sentinel, found again after a failed call.
    Sentinel(Box<Sentinel>),
}

pub(crate) struct Sentinel {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    calls_in_flight: usize,
    /// The master's connection, until a call fails; then when that was (re-asking the
    /// sentinels at most every 100 ms while the master is down).
    master: Mutex<(Option<ConnectionManager>, Option<Instant>)>,
}

pub(crate) struct Cluster {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
    calls_in_flight: usize,
    /// `redis://` or `rediss://`, with the URL's credentials: a node's URL less its address.
    node_url_prefix: String,
    config: ConnectionManagerConfig,
    /// Connections of our own to the nodes `ASK` redirections pointed at, by address.
    ask_targets: Mutex<HashMap<String, ConnectionManager>>,
}

/// Most attempts of one script call (see [`Connections::script`]), besides its timeout.
const SCRIPT_ATTEMPTS: usize = 8;

/// Most `ASK` targets kept connected; nodes come and go, so past this they are all dropped.
const ASK_TARGETS: usize = 16;

/// What to do when the node that runs a call lacks its code (see [`Connections::script`]).
#[derive(Clone, Copy)]
pub(crate) enum Missing<'a> {
    /// `EVALSHA` answered `NOSCRIPT`: send this instead (an `EVAL` with the script's body).
    Script(&'a (dyn Fn() -> Cmd + Sync)),
    /// `FCALL` answered that the function is not there: send `load` (`FUNCTION LOAD`) first,
    /// to the node that serves `key` (the call's first key, on a cluster).
    Library {
        /// The command that loads the library.
        load: &'a Cmd,
        /// A key of the call.
        key: &'a str,
    },
    /// The module's command: nothing can be loaded (a node without the module answers
    /// "unknown command", which the caller handles). On a cluster it is routed by `key`, the
    /// call's first key: the cluster client knows where EVALSHA's and FCALL's keys sit, not
    /// a module command's.
    Module {
        /// A key of the call.
        key: &'a str,
    },
}

/// Whether `error` says the node lacks the code `missing` would give it.
fn lacks_code(error: &RedisError, missing: &Missing<'_>) -> bool {
    match missing {
        Missing::Script(_) => error.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
        // Redis and Valkey: "ERR Function not found".
        Missing::Library { .. } => {
            error.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
                && error.detail().is_some_and(|d| d.starts_with("Function not found"))
        }
        Missing::Module { .. } => false,
    }
}

/// Whether `error`, the answer to `FCALL` or `FUNCTION LOAD`, says the server has no Redis
/// Functions (before Redis 7.0: "ERR unknown command 'FCALL'"), or that this user may not use
/// them: then scripts (`EVALSHA`) do the work.
pub(crate) fn functions_unavailable(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default();
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::ResponseError) => detail.starts_with("unknown command"),
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            let detail = detail.to_ascii_lowercase();
            detail.contains("'fcall'") || detail.contains("'function")
        }
        _ => false,
    }
}

/// In a `CLUSTER SLOTS` reply (`[[start, end, [host, port, ...], replicas...], ...]`), the
/// ranges whose master is the one serving `slot`; just `slot` when the reply does not say.
fn slots_of_master(map: &Value, slot: u16) -> Vec<RangeInclusive<u16>> {
    let entries: Vec<(RangeInclusive<u16>, &Value)> = match map {
        Value::Array(entries) => entries
            .iter()
            .filter_map(|entry| match entry {
                Value::Array(fields) => match fields.as_slice() {
                    [Value::Int(start), Value::Int(end), master, ..] => {
                        let start = u16::try_from(*start).ok()?;
                        let end = u16::try_from(*end).ok()?;
                        Some((start..=end, master))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    // A node is named by its host and port (the first two fields; later ones vary by version).
    let address = |master: &Value| match master {
        Value::Array(fields) => fields.get(..2).map(<[Value]>::to_vec),
        _ => None,
    };
    let Some(owner) = entries.iter().find(|(range, _)| range.contains(&slot)).and_then(|(_, m)| address(m))
    else {
        return vec![slot..=slot];
    };
    entries
        .into_iter()
        .filter(|(_, master)| address(master).as_ref() == Some(&owner))
        .map(|(r, _)| r)
        .collect()
}

/// One connection, of either kind.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// What a `redis+sentinel://` URL says: the sentinels' addresses, the service name, and the
/// master's user and password.
type SentinelParts = (Vec<ConnectionAddr>, String, Option<(String, String)>);

/// The parts of a `redis+sentinel://` URL, or `None` for any other URL.
pub(crate) fn sentinel_parts(url: &str) -> Option<Result<SentinelParts, String>> {
    let rest = url.strip_prefix("redis+sentinel://")?;
    Some((|| {
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (Some(credentials), rest),
            None => (None, rest),
        };
        let (hosts, service) = rest
            .split_once('/')
            .ok_or("a Sentinel URL names its service: redis+sentinel://host:port/service")?;
        let service = service.trim_end_matches('/');
        if service.is_empty() {
            return Err("a Sentinel URL names its service: redis+sentinel://host:port/service".to_owned());
        }
        let addresses = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                let (host, port) = h.rsplit_once(':').unwrap_or((h, "26379"));
                let port = port.parse::<u16>().map_err(|_| format!("{h:?} is not host:port"))?;
                Ok(ConnectionAddr::Tcp(host.to_owned(), port))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if addresses.is_empty() {
            return Err("a Sentinel URL lists at least one sentinel".to_owned());
        }
        let credentials = credentials.map(|c| match c.split_once(':') {
            Some((user, password)) => (user.to_owned(), password.to_owned()),
            None => (String::new(), c.to_owned()),
        });
        Ok((addresses, service.to_owned(), credentials))
    })())
}

/// The seed nodes of a `redis+cluster://` or `rediss+cluster://` URL as `redis://` /
/// `rediss://` URLs, or `None` for any other URL.
pub(crate) fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (prefix, hosts) = cluster_parts(url)?;
    Some(hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{prefix}{h}")).collect())
}

/// A cluster URL's node URL prefix (scheme and credentials) and its comma-separated hosts.
fn cluster_parts(url: &str) -> Option<(String, &str)> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else {
        ("rediss", url.strip_prefix("rediss+cluster://")?)
    };
    // Credentials, if any, are written once, before the first host, and hold for every node.
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), rest),
    };
    Some((format!("{scheme}://{credentials}"), hosts.trim_end_matches('/')))
}

/// A client for `url` that speaks RESP3 (see the module docs why).
fn resp3_client(url: impl IntoConnectionInfo) -> Result<redis::Client, RedisError> {
    let info = url.into_connection_info()?;
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}

impl Connections {
    /// Connections for `url`, opened lazily. `timeout` bounds each call; `connections` is the
    /// number of multiplexed connections to a single Redis (a cluster gets one per node).
    /// `lost` counts the connections seen to close (by the server, or the network), whether
    /// or not a call was on them.
    pub(crate) fn open(
        url: &str,
        timeout: Duration,
        connections: usize,
        lost: Arc<AtomicU64>,
    ) -> Result<Self, RedisError> {
        // Connecting (a TLS handshake, on a loaded machine) may take longer than a call is
        // allowed to; calls still give up after `timeout`, and the connection goes on.
        let connect_timeout = timeout.max(Duration::from_secs(1));
        let on_push = move |info: PushInfo| {
            // The library's own notice that a connection ended (Tollgate subscribes to nothing,
            // so it is the only push it gets).
            if info.kind == PushKind::Disconnection {
                lost.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout))
            // A failed connect is tried once more, 10 to 20 ms later (the redis crate's
            // default waits 100 ms or more): with connections re-opened the moment they
            // close, a call waits on that attempt, and a Redis that refuses connections
            // should cost a call milliseconds, not the second attempt's delay (the server's
            // drop test: p99 while refused 320 ms with the default, 33 to 49 ms with this).
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(timeout)
            .set_push_sender(on_push.clone());
        if let (Some(nodes), Some((node_url_prefix, _))) = (cluster_nodes(url), cluster_parts(url)) {
            let client = ClusterClient::builder(nodes)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout)
                // Script calls follow redirections in `Connections::script`, not here (see
                // there why); a fail-over is retried there too, within the call's timeout.
                .retries(0)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(on_push)
                .build()?;
            let cluster = Cluster {
                client,
                connection: OnceCell::new(),
                calls_in_flight: connections,
                node_url_prefix,
                config,
                ask_targets: Mutex::default(),
            };
            return Ok(Connections::Cluster(Box::new(cluster)));
        }
        if let Some(parts) = sentinel_parts(url) {
            let (addresses, service, credentials) = parts.map_err(|e| {
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "invalid Sentinel URL", e))
            })?;
            // Asking the sentinels is bounded by each call's own timeout.
            let mut builder = SentinelClientBuilder::new(addresses, service, SentinelServerType::Master)?
                .set_client_to_redis_protocol(ProtocolVersion::RESP3);
            if let Some((user, password)) = credentials {
                if !user.is_empty() {
                    builder = builder.set_client_to_redis_username(user);
                }
                builder = builder.set_client_to_redis_password(password);
            }
            let sentinel = Sentinel {
                sentinels: tokio::sync::Mutex::new(builder.build()?),
                config,
                calls_in_flight: connections,
                master: Mutex::new((None, None)),
            };
            return Ok(Connections::Sentinel(Box::new(sentinel)));
        }
        let client = resp3_client(url)?;
        let connections = (0..connections)
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Connections::Single { connections: connections.into(), next: AtomicUsize::new(0) })
    }

    /// Script calls that may be in flight at once (the coalescer's call slots).
    pub(crate) fn call_slots(&self) -> usize {
        match self {
            Connections::Single { connections, .. } => connections.len(),
            Connections::Cluster(cluster) => cluster.calls_in_flight,
            Connections::Sentinel(sentinel) => sentinel.calls_in_flight,
        }
    }

    /// Whether this is a Redis Cluster (a script call must then hold one slot's keys).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connections::Cluster(_))
    }

    /// The next connection to use (connecting to the cluster on first use).
    pub(crate) async fn next(&self) -> Result<Conn, RedisError> {
        match self {
            Connections::Single { connections, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % connections.len();
                Ok(Conn::Single(connections[i].clone()))
            }
            Connections::Cluster(cluster) => {
                let conn =
                    cluster.connection.get_or_try_init(|| cluster.client.get_async_connection()).await?;
                Ok(Conn::Cluster(conn.clone()))
            }
            Connections::Sentinel(sentinel) => sentinel.master().await.map(Conn::Single),
        }
    }

    /// Runs a call of the engine: `cmd`, and when the node that runs it answers that it lacks
    /// the code, what `missing` says: for a script (`EVALSHA`), `EVAL` with its body in its
    /// place; for a library's function (`FCALL`), `FUNCTION LOAD` on that node, then `cmd`
    /// again. Either once a call.
    ///
    /// On a cluster, redirections are followed here rather than by the cluster client, which
    /// follows `ASK` by sending `ASKING` and then the command as two requests on a connection
    /// that other calls share (redis-rs 1.8): another call's command can come between them and
    /// spend the node's one-time `ASKING` flag, the command then gets `MOVED` back to the old
    /// owner, which answers `ASK` again, and so on until the retries run out; under load the
    /// `MOVED` storm also stalled the client's slot map refreshes for seconds. Here `ASK` is
    /// followed on a connection of our own to the target, with `ASKING` and the command
    /// written together as one pipeline; `MOVED` and `READONLY` (the client re-reads the slot
    /// map on either) are tried again at once; `TRYAGAIN` (a check's keys split between two
    /// nodes for a moment while a slot migrates), `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` and a
    /// refused connection (a fail-over) after a short wait. All of it within the caller's
    /// timeout, and never after an error that leaves unknown whether the script ran.
    ///
    /// On a single Redis (or Sentinel's master), a refused connection is tried once more, on
    /// the same connection, which the refusal sent reconnecting: nothing was sent, so the
    /// script cannot run twice, and a connection that last failed while Redis was down (its
    /// error kept until the next use) does not fail the first call after Redis is back. Any
    /// other connection error (lost with the request maybe sent, a timeout) is returned.
    pub(crate) async fn script(&self, cmd: Cmd, missing: Missing<'_>) -> Result<Value, RedisError> {
        let (mut cmd, mut recovered, mut ask) = (cmd, false, None::<String>);
        let (mut last, mut refusal_retried) = (None::<Conn>, false);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match (self, &ask) {
                (Connections::Cluster(cluster), Some(target)) => cluster.asking(target, &cmd).await,
                _ => {
                    let mut conn = match last.take() {
                        Some(conn) => conn,
                        None => self.next().await?,
                    };
                    let result = match (&mut conn, &missing) {
                        (Conn::Cluster(cluster), Missing::Module { key }) => {
                            let route = Route::with_key(key, SlotAddr::Master);
                            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                            // A routed command answers a server error as a value, not an error.
                            cluster.route_command(cmd.clone(), routing).await.and_then(Value::extract_error)
                        }
                        _ => cmd.query_async::<Value>(&mut conn).await,
                    };
                    last = Some(conn);
                    result
                }
            };
            // A new connection for each attempt, unless kept below for a refusal.
            let tried_on = last.take();
            let mut error = match result {
                Ok(value) => return Ok(value),
                Err(error) if attempt >= SCRIPT_ATTEMPTS => return Err(error),
                Err(error) => error,
            };
            if !recovered && lacks_code(&error, &missing) {
                match missing {
                    // `EVAL` goes where the call goes and leaves the script there for the next
                    // `EVALSHA`. (`SCRIPT LOAD`, which the redis crate's `Script` sends, reaches
                    // only the masters a cluster client knows of: not a master that joined and
                    // is being handed a slot.)
                    Missing::Script(eval) => {
                        (cmd, recovered) = (eval(), true);
                        continue;
                    }
                    // Loaded where the call went: on the `ASK` target, or the master of the
                    // call's slot (which the cluster client knows, having sent the call there).
                    // `REPLACE`: calls that found it missing at the same time each load it, and
                    // all succeed.
                    Missing::Library { load, key } => {
                        let loaded = match (self, &ask, tried_on.clone()) {
                            (Connections::Cluster(cluster), Some(target), _) => {
                                cluster.asking(target, load).await.map(drop)
                            }
                            (_, _, Some(Conn::Cluster(mut conn))) => {
                                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                                    key,
                                    SlotAddr::Master,
                                ));
                                conn.route_command(load.clone(), RoutingInfo::SingleNode(route))
                                    .await
                                    .and_then(Value::extract_error)
                                    .map(drop)
                            }
                            (_, _, Some(mut conn)) => load.query_async::<()>(&mut conn).await,
                            (_, _, None) => load.query_async::<()>(&mut self.next().await?).await,
                        };
                        match loaded {
                            Ok(()) => {
                                recovered = true;
                                continue;
                            }
                            Err(load_error) => error = load_error,
                        }
                    }
                    // Never lacking code it could be given (see `lacks_code`).
                    Missing::Module { .. } => {}
                }
            }
            // Waits 20, 40, 80, then 100 ms.
            let pause = Duration::from_millis((10u64 << attempt.min(4)).min(100));
            match error.kind() {
                _ if !self.is_cluster() && error.is_connection_refusal() && !refusal_retried => {
                    (last, refusal_retried) = (tried_on, true);
                }
                _ if !self.is_cluster() => return Err(error),
                ErrorKind::Server(ServerErrorKind::Ask) => match error.redirect_node() {
                    Some((target, _)) => ask = Some(target.to_owned()),
                    None => return Err(error),
                },
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::ReadOnly) => ask = None,
                ErrorKind::Server(ServerErrorKind::TryAgain) => tokio::time::sleep(pause).await,
                ErrorKind::Server(
                    ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading,
                ) => {
                    ask = None;
                    tokio::time::sleep(pause).await;
                }
                _ if error.is_connection_refusal() => {
                    ask = None;
                    tokio::time::sleep(pause).await;
                }
                _ => return Err(error),
            }
        }
    }

    /// The hash slots served by the master that serves `key`, read from `CLUSTER SLOTS` (asked
    /// of that master): what `auto` marks when that master lacks the module, so that one
    /// refusal per master is paid, not one per slot. Empty off a Cluster.
    pub(crate) async fn slots_served_with(&self, key: &str) -> Result<Vec<RangeInclusive<u16>>, RedisError> {
        let Connections::Cluster(cluster) = self else { return Ok(Vec::new()) };
        let mut conn =
            cluster.connection.get_or_try_init(|| cluster.client.get_async_connection()).await?.clone();
        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        let map = conn
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").to_owned(), RoutingInfo::SingleNode(route))
            .await
            .and_then(Value::extract_error)?;
        Ok(slots_of_master(&map, crate::keys::slot(key)))
    }

    /// Tells the connections a call on them failed: a Sentinel set-up asks for the master again.
    pub(crate) fn failed(&self) {
        if let Connections::Sentinel(sentinel) = self {
            let mut master = sentinel.master.lock().unwrap_or_else(|e| e.into_inner());
            if master.0.take().is_some() {
                master.1 = Some(Instant::now());
            }
        }
    }

    /// Every connection worth probing: each of a single Redis's, or the cluster's one.
    pub(crate) async fn all(&self) -> Result<Vec<Conn>, RedisError> {
        match self {
            Connections::Single { connections, .. } => {
                Ok(connections.iter().cloned().map(Conn::Single).collect())
            }
            Connections::Cluster(_) | Connections::Sentinel(_) => Ok(vec![self.next().await?]),
        }
    }
}

impl Cluster {
    /// `ASKING` and `cmd` on the node at `target` (`host:port`), written together.
    async fn asking(&self, target: &str, cmd: &Cmd) -> Result<Value, RedisError> {
        let mut conn = {
            let mut targets = self.ask_targets.lock().unwrap_or_else(|e| e.into_inner());
            match targets.get(target) {
                Some(conn) => conn.clone(),
                None => {
                    if targets.len() >= ASK_TARGETS {
                        targets.clear();
                    }
                    let client = resp3_client(format!("{}{target}", self.node_url_prefix))?;
                    let conn = ConnectionManager::new_lazy_with_config(client, self.config.clone())?;
                    targets.entry(target.to_owned()).or_insert(conn).clone()
                }
            }
        };
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(cmd.clone());
        // The command's reply only (ASKING's is skipped).
        let mut replies = conn.req_packed_commands(&pipe, 1, 1).await?;
        let reply = replies.pop().ok_or_else(|| {
            RedisError::from((ErrorKind::UnexpectedReturnType, "no reply to a command after ASKING"))
        })?;
        reply.extract_error()
    }
}

impl Sentinel {
    /// The master's connection, asking the sentinels where it is when there is none.
    async fn master(&self) -> Result<ConnectionManager, RedisError> {
        let since_failure = {
            let master = self.master.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(conn) = &master.0 {
                return Ok(conn.clone());
            }
            master.1.map(|at| at.elapsed())
        };
        // Do not hammer the sentinels while the master is down.
        if let Some(since) = since_failure
            && since < Duration::from_millis(100)
        {
            tokio::time::sleep(Duration::from_millis(100) - since).await;
        }
        let client = self.sentinels.lock().await.async_get_client().await?;
        let conn = ConnectionManager::new_lazy_with_config(client, self.config.clone())?;
        let mut master = self.master.lock().unwrap_or_else(|e| e.into_inner());
        Ok(master.0.get_or_insert(conn).clone())
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_list_their_seed_nodes() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7000,10.0.0.2:7001"),
            Some(vec!["redis://10.0.0.1:7000".to_owned(), "redis://10.0.0.2:7001".to_owned()])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://app:s3cret@a:6380,b:6380/"),
            Some(vec!["rediss://app:s3cret@a:6380".to_owned(), "rediss://app:s3cret@b:6380".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379"), None);
    }

    /// The error a server answers with `reply` (RESP, as it comes on the wire).
    fn server_error(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(reply.as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn a_server_without_functions_is_told_from_a_node_without_the_library() {
        let load = redis::cmd("FUNCTION");
        let library = Missing::Library { load: &load, key: "k" };
        let eval = || redis::cmd("EVAL");
        let script = Missing::Script(&eval);
        // Redis 6 (and a Redis 7 with the command renamed away), Valkey alike.
        for reply in [
            "-ERR unknown command 'FCALL', with args beginning with: 'tollgate_x' '1' \r\n",
            "-ERR unknown command `FUNCTION`, with args beginning with: `LOAD`, \r\n",
            "-NOPERM User app has no permissions to run the 'fcall' command\r\n",
            "-NOPERM User app has no permissions to run the 'function|load' command\r\n",
        ] {
            let error = server_error(reply);
            assert!(functions_unavailable(&error), "{reply}");
            assert!(!lacks_code(&error, &library), "{reply}");
        }
        let missing = server_error("-ERR Function not found\r\n");
        assert!(lacks_code(&missing, &library) && !lacks_code(&missing, &script));
        assert!(!functions_unavailable(&missing), "a node without the library gets it loaded");
        let noscript = server_error("-NOSCRIPT No matching script. Please use EVAL.\r\n");
        assert!(lacks_code(&noscript, &script) && !lacks_code(&noscript, &library));
        assert!(!functions_unavailable(&noscript));
        // Nor any other error: a key's NOPERM, a script's own failure.
        for reply in [
            "-NOPERM No permissions to access a key\r\n",
            "-ERR user_script:1: Script attempted to access nonexistent global variable\r\n",
        ] {
            assert!(!functions_unavailable(&server_error(reply)), "{reply}");
        }
    }

    #[test]
    fn a_masters_slots_are_read_from_cluster_slots() {
        let node = |port: i64| Value::Array(vec![Value::BulkString(b"127.0.0.1".to_vec()), Value::Int(port)]);
        let range = |start: i64, end: i64, port: i64| {
            Value::Array(vec![Value::Int(start), Value::Int(end), node(port), node(port + 100)])
        };
        let map = Value::Array(vec![range(0, 99, 7001), range(100, 199, 7002), range(200, 16383, 7001)]);
        assert_eq!(slots_of_master(&map, 150), vec![100..=199]);
        assert_eq!(slots_of_master(&map, 5), vec![0..=99, 200..=16383]);
        assert_eq!(slots_of_master(&map, 16383), vec![0..=99, 200..=16383]);
        assert_eq!(
            slots_of_master(&Value::Nil, 7),
            vec![7..=7],
            "an answer that says nothing: the slot alone"
        );
        let unserved = Value::Array(vec![range(0, 99, 7001)]);
        assert_eq!(slots_of_master(&unserved, 500), vec![500..=500]);
    }

    #[test]
    fn sentinel_urls_list_sentinels_and_name_the_service() {
        let (addresses, service, credentials) =
            sentinel_parts("redis+sentinel://app:pw@s1:26379,s2:26380/mymaster").unwrap().unwrap();
        assert_eq!(
            addresses,
            [ConnectionAddr::Tcp("s1".into(), 26379), ConnectionAddr::Tcp("s2".into(), 26380)]
        );
        assert_eq!(service, "mymaster");
        assert_eq!(credentials, Some(("app".to_owned(), "pw".to_owned())));
        assert!(sentinel_parts("redis+sentinel://s1:26379").unwrap().is_err(), "no service");
        assert!(sentinel_parts("redis+sentinel://s1:x/m").unwrap().is_err(), "bad port");
        assert!(sentinel_parts("redis://h:1").is_none());
    }
}
