//! A private Redis Sentinel set-up: one master, one replica and three sentinels watching them
//! as the service `mymaster`, all on free loopback ports.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::wait;
use crate::{RedisServer, free_port};

/// The service name the sentinels know the master by.
pub const SERVICE: &str = "mymaster";

/// A master, its replica and three sentinels (quorum 2, master declared down after 1 s), stopped
/// when dropped.
pub struct RedisSentinel {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<(Child, u16, tempfile::TempDir)>,
}

impl RedisSentinel {
    /// Starts the five processes and waits until the replica is in sync and the sentinels
    /// have found each other (`SENTINEL CKQUORUM`).
    ///
    /// # Panics
    /// If a process does not start, or the set-up is not ready within 30 s.
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(&[])
    }

    /// [`start`](RedisSentinel::start), the master and the replica with `extra` arguments
    /// (`--loadmodule ...`).
    ///
    /// # Panics
    /// As `start`.
    pub fn start_with(extra: &[&str]) -> RedisSentinel {
        let master = RedisServer::start_with(extra);
        let port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &port];
        replica_args.extend_from_slice(extra);
        let replica = RedisServer::start_with(&replica_args);
        let deadline = Instant::now() + Duration::from_secs(30);
        wait(deadline, "the replica to sync", || {
            replica.try_text(&["INFO", "replication"]).is_some_and(|i| i.contains("master_link_status:up"))
        });
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let dir = tempfile::tempdir().expect("temporary directory");
                let conf = dir.path().join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n\
                         sentinel down-after-milliseconds {SERVICE} 1000\n\
                         sentinel failover-timeout {SERVICE} 5000\n",
                        dir = dir.path().display(),
                        master = master.port(),
                    ),
                )
                .expect("sentinel.conf");
                let child = Command::new("redis-server")
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server starts in sentinel mode");
                (child, port, dir)
            })
            .collect();
        let setup = RedisSentinel { master, replica, sentinels };
        wait(deadline, "the sentinels to find each other", || {
            setup.sentinel_ports().iter().all(|&port| {
                sentinel_command(port, &["SENTINEL", "CKQUORUM", SERVICE])
                    .is_some_and(|r| r.starts_with("OK 3"))
            })
        });
        setup
    }

    /// `redis+sentinel://` naming the three sentinels and the service.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinel_ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(_, port, _)| *port).collect()
    }

    /// The master the set-up started with.
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The replica the set-up started with.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Waits until the sentinels have promoted the replica.
    ///
    /// # Panics
    /// If that takes longer than `within`.
    pub fn wait_promoted(&self, within: Duration) {
        wait(Instant::now() + within, "the replica to be promoted", || {
            self.replica.try_text(&["INFO", "replication"]).is_some_and(|i| i.contains("role:master"))
        });
    }
}

fn sentinel_command(port: u16, args: &[&str]) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<String>(&mut conn).ok()
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
