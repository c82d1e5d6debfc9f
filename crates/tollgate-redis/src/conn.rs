//! Connections: multiplexed connections to one Redis, or one cluster-aware connection to a
//! Redis Cluster, behind one type the scripts and commands are sent on.
//!
//! A Redis Cluster URL lists seed nodes after the scheme, comma-separated:
//! `redis+cluster://[user:password@]host1:port1,host2:port2` (`rediss+cluster://` for TLS).
//! The cluster client of the `redis` crate finds the rest of the cluster, follows `MOVED` and
//! `ASK` redirections and re-reads the slot map after a fail-over. Every key of one check shares
//! a hash tag, so each script call lives in one slot and runs unchanged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::OnceCell;

/// Where operations go.
pub(crate) enum Connections {
    /// One Redis: operations spread over several multiplexed connections.
    Single { connections: Box<[ConnectionManager]>, next: AtomicUsize },
    /// A Redis Cluster: one multiplexed connection per node, owned by the cluster client,
    /// opened on first use (so a backend builds while the cluster is down).
    Cluster(Box<Cluster>),
}

pub(crate) struct Cluster {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
    calls_in_flight: usize,
}

/// One connection, of either kind.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The seed nodes of a `redis+cluster://` or `rediss+cluster://` URL as `redis://` /
/// `rediss://` URLs, or `None` for any other URL.
pub(crate) fn cluster_nodes(url: &str) -> Option<Vec<String>> {
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
    let hosts = hosts.trim_end_matches('/');
    Some(hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{credentials}{h}")).collect())
}

impl Connections {
    /// Connections for `url`, opened lazily. `timeout` bounds each call; `connections` is the
    /// number of multiplexed connections to a single Redis (a cluster gets one per node).
    pub(crate) fn open(url: &str, timeout: Duration, connections: usize) -> Result<Self, RedisError> {
        // Connecting (a TLS handshake, on a loaded machine) may take longer than a call is
        // allowed to; calls still give up after `timeout`, and the connection goes on.
        let connect_timeout = timeout.max(Duration::from_secs(1));
        if let Some(nodes) = cluster_nodes(url) {
            let client = ClusterClient::builder(nodes)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout)
                // A redirection or a fail-over is retried within the call's own timeout.
                .retries(3)
                .min_retry_wait(10)
                .max_retry_wait(timeout.as_millis().try_into().unwrap_or(u64::MAX))
                .build()?;
            let cluster = Cluster { client, connection: OnceCell::new(), calls_in_flight: connections };
            return Ok(Connections::Cluster(Box::new(cluster)));
        }
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(timeout);
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
        }
    }

    /// Every connection worth probing: each of a single Redis's, or the cluster's one.
    pub(crate) async fn all(&self) -> Result<Vec<Conn>, RedisError> {
        match self {
            Connections::Single { connections, .. } => {
                Ok(connections.iter().cloned().map(Conn::Single).collect())
            }
            Connections::Cluster(_) => Ok(vec![self.next().await?]),
        }
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
}
