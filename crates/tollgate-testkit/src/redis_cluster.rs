//! A private Redis Cluster: three masters and three replicas, six `redis-server` processes on
//! free loopback ports, joined by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::wait;
use crate::{RedisServer, free_port};

/// A Redis Cluster of the test's own (3 masters, 3 replicas, node timeout 1 s so a fail-over
/// takes a couple of seconds), stopped when dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until every node says it is `ok`.
    ///
    /// # Panics
    /// If `redis-server` or `redis-cli` is missing, or the cluster does not form within 30 s.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    // A replica that last heard from its master a while ago (masters ping their
                    // replicas only every 10 s) would refuse to take over.
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli (from the redis-tools package) is needed: {e}"));
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Waits until every running node reports `cluster_state:ok`.
    ///
    /// # Panics
    /// If that takes longer than `within`.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.is_alive()).all(|n| {
                n.try_text(&["CLUSTER", "INFO"]).is_some_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            if Instant::now() > deadline {
                let states: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| match n.try_text(&["CLUSTER", "INFO"]) {
                        Some(info) => format!("{}: {}", n.port(), info.lines().next().unwrap_or_default()),
                        None => format!("{}: no answer", n.port()),
                    })
                    .collect();
                panic!("the cluster did not become ok within {within:?}: {states:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `count` running nodes are masters and the cluster is `ok` (after a master
    /// was stopped: until its replica has taken over).
    ///
    /// # Panics
    /// If that takes longer than `within`.
    pub fn wait_masters(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        wait(deadline, &format!("{count} masters"), || self.masters().len() == count);
        self.wait_ok(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)));
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node, masters and replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node at `i`, to stop or pause it.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Indices of the running nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let node = &self.nodes[i];
                node.is_alive()
                    && node
                        .try_text(&["INFO", "replication"])
                        .is_some_and(|info| info.contains("role:master"))
            })
            .collect()
    }
}
