//! A private Redis Cluster: three masters and three replicas, six `redis-server` processes on
//! free loopback ports, joined by `redis-cli --cluster create`; masters can be added and slots
//! moved between them while clients run.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;
use crate::redis_server::{ANOTHER_FREE_PORT, wait};

/// A Redis Cluster of the test's own (3 masters, 3 replicas, node timeout 1 s so a fail-over
/// takes a couple of seconds), stopped when dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's cluster bus port (given explicitly, so not port + 10000).
    bus_ports: Vec<u16>,
    /// The extra arguments every node starts with, a master added later too.
    extra: Vec<String>,
}

/// The hash slot of a Redis key, as `CLUSTER KEYSLOT` computes it: CRC16 (XMODEM) of the key's
/// hash tag (the text between its first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// Starts one node in cluster mode, with `extra` arguments; answers it and its bus port.
fn start_node(extra: &[&str]) -> (RedisServer, u16) {
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        // A replica that last heard from its master a while ago (masters ping their replicas
        // only every 10 s) would refuse to take over.
        "--cluster-replica-validity-factor",
        "0",
        "--cluster-port",
        ANOTHER_FREE_PORT,
    ];
    args.extend_from_slice(extra);
    let node = RedisServer::start_with(&args);
    let bus = node
        .args()
        .iter()
        .skip_while(|a| *a != "--cluster-port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("the bus port chosen");
    (node, bus)
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until every node says it is `ok`.
    ///
    /// # Panics
    /// If `redis-server` or `redis-cli` is missing, or the cluster does not form within 30 s.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// [`start`](RedisCluster::start), every node with `extra` arguments (`--loadmodule ...`).
    ///
    /// # Panics
    /// As `start`.
    pub fn start_with(extra: &[&str]) -> RedisCluster {
        let (nodes, bus_ports): (Vec<RedisServer>, Vec<u16>) = (0..6).map(|_| start_node(extra)).unzip();
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
        let extra = extra.iter().map(|a| (*a).to_owned()).collect();
        let cluster = RedisCluster { nodes, bus_ports, extra };
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

    /// A node's cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i].command(&["CLUSTER", "MYID"])
    }

    /// Starts a seventh (eighth, ...) node, with the arguments the others got, joins it to the
    /// cluster as a master that serves no slot yet, and waits until every node knows it.
    /// Answers its index.
    ///
    /// # Panics
    /// If the cluster does not agree on the new node within 30 s.
    pub fn add_master(&mut self) -> usize {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let (node, bus) = start_node(&extra);
        let (seed_port, seed_bus) = (self.nodes[0].port().to_string(), self.bus_ports[0].to_string());
        let met: String = node.command(&["CLUSTER", "MEET", "127.0.0.1", &seed_port, &seed_bus]);
        assert_eq!(met, "OK");
        self.nodes.push(node);
        self.bus_ports.push(bus);
        let new = self.nodes.len() - 1;
        let id = self.node_id(new);
        let deadline = Instant::now() + Duration::from_secs(30);
        // Known by all, and past the handshake everywhere (the handshake's entry has another id).
        wait(deadline, "every node to know the new master", || {
            self.nodes.iter().filter(|n| n.is_alive()).all(|n| {
                n.try_text(&["CLUSTER", "NODES"]).is_some_and(|nodes| {
                    nodes.lines().any(|l| l.starts_with(&id) && !l.contains("handshake"))
                })
            })
        });
        self.wait_ok(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)));
        new
    }

    /// The master that serves `slot`, by each master's own account.
    ///
    /// # Panics
    /// If no running master claims it.
    pub fn owner(&self, slot: u16) -> usize {
        self.masters()
            .into_iter()
            .find(|&i| {
                let nodes: String = self.nodes[i].command(&["CLUSTER", "NODES"]);
                let me = nodes.lines().find(|l| l.contains("myself")).unwrap_or_default();
                // Fields 9 and on: slots and ranges ("0-5460", "7"); "[...]" are migrations.
                me.split(' ').skip(8).filter(|r| !r.starts_with('[')).any(|range| {
                    let (low, high) = range.split_once('-').unwrap_or((range, range));
                    matches!((low.parse::<u16>(), high.parse::<u16>()), (Ok(l), Ok(h)) if (l..=h).contains(&slot))
                })
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The keys node `i` holds in `slot` (at most 1000).
    pub fn keys_in_slot(&self, i: usize, slot: u16) -> Vec<String> {
        self.nodes[i].command(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"])
    }

    /// Starts moving `slot` from master `from` to master `to`: `to` is importing it, `from`
    /// migrating it. From now on `from` answers `ASK` for the slot's keys it no longer holds
    /// (and `TRYAGAIN` for a multi-key command whose keys are split), and `to` serves those
    /// keys to clients that say `ASKING`.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let importing: String =
            self.nodes[to].command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &self.node_id(from)]);
        let migrating: String =
            self.nodes[from].command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &self.node_id(to)]);
        assert_eq!((importing.as_str(), migrating.as_str()), ("OK", "OK"));
    }

    /// Moves up to `count` of the slot's keys from `from` to `to` in one `MIGRATE` (each key
    /// atomically); answers the keys it found to move (none once `from` holds no more), some of
    /// which a concurrent client may have deleted first.
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize, count: usize) -> Vec<String> {
        let keys: Vec<String> =
            self.nodes[from].command(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), &count.to_string()]);
        if keys.is_empty() {
            return keys;
        }
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let reply: String = self.nodes[from].command(&args);
        // NOKEY: none of the keys exists any more. A client deleted them between
        // GETKEYSINSLOT and MIGRATE (a reset under load does); nothing is left to move.
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE {keys:?}: {reply}");
        keys
    }

    /// Ends a migration: `to` serves `slot` (told first, so the slot always has an owner), then
    /// `from` and every other master learn it.
    pub fn finish_migration(&self, slot: u16, from: usize, to: usize) {
        let id = self.node_id(to);
        let others = self.masters().into_iter().filter(|&m| m != to && m != from);
        for i in [to, from].into_iter().chain(others) {
            let done: String = self.nodes[i].command(&["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &id]);
            assert_eq!(done, "OK", "SETSLOT NODE on node {i}");
        }
    }

    /// Moves `slot` and its keys from master `from` to master `to`, ten keys per `MIGRATE`, as
    /// `redis-cli --cluster reshard` does.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to);
        while !self.migrate_keys(slot, from, to, 10).is_empty() {}
        self.finish_migration(slot, from, to);
    }
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn key_slots_follow_the_hash_tag() {
        // As redis-server 7.0's `CLUSTER KEYSLOT` answers.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
        assert_eq!(key_slot(b"user1000"), 3443);
        assert_eq!(key_slot(b"foo{}{bar}"), 8363, "an empty tag: the whole key");
        assert_eq!(key_slot(b"tollgate:{mig-1}:h"), 6704);
        assert_eq!(key_slot(b"foo{{bar}}zap"), 4015, "the tag is \"{{bar\"");
    }
}
