//! A private `redis-server` for one test binary or one test.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own, on a free port of 127.0.0.1, without persistence, killed
/// when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// A loopback port that was free a moment ago, and that this process has not handed out before.
///
/// Chosen below the kernel's range of ephemeral ports (from a random place in the 12,288 ports
/// under it), not by `bind(0)`: a port from that range, once its probe socket is closed, can be
/// given by the kernel to any outgoing connection (a test's HTTP client, a Redis connection)
/// before the server meant to listen on it has started, and that server then fails with "address
/// in use". The kernel never picks ports below the range by itself. A process-wide record of the
/// ports already given keeps two asked for one server (HTTP and gRPC) apart.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (low, high) = below_ephemeral_ports();
    let span = u64::from(high - low);
    let start =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), std::process::id())
            % span;
    for step in 0..span {
        let port = low + ((start + step) % span) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    // Every port below the range taken (not seen): the kernel's choice, as before.
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free loopback port");
        if given.insert(port) {
            return port;
        }
    }
}

/// The 12,288 ports below the kernel's ephemeral range (`ip_local_port_range`; Linux's default
/// starts it at 32768), never below 1024.
fn below_ephemeral_ports() -> (u16, u16) {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = first_ephemeral.max(1024 + 1024);
    (high.saturating_sub(12_288).max(1024), high)
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    /// If `redis-server` is not installed (with how to install it), or does not start.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (such as `["--maxmemory", "10mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_at(None, extra)
    }

    /// The arguments the server was started with (after [`ANOTHER_FREE_PORT`] was replaced).
    pub(crate) fn args(&self) -> &[String] {
        &self.extra
    }

    /// Starts a server on `port` (when a client was configured for it before it existed).
    pub fn start_on(port: u16) -> RedisServer {
        Self::start_at(Some(port), &[])
    }

    fn start_at(port: Option<u16>, extra: &[&str]) -> RedisServer {
        let mut last_error = String::new();
        // A port found free can be taken before the server binds it; try a few.
        for _ in 0..5 {
            let port = port.unwrap_or_else(free_port);
            // Another port an argument needs (a cluster bus) is chosen afresh on every attempt
            // too: it can be taken the same way.
            let extra: Vec<String> = extra
                .iter()
                .map(|a| if *a == ANOTHER_FREE_PORT { free_port().to_string() } else { (*a).to_owned() })
                .collect();
            let args: Vec<&str> = extra.iter().map(String::as_str).collect();
            let dir = tempfile::tempdir().expect("temporary directory");
            let child = match spawn(port, dir.path(), &args) {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "redis-server is not installed, and the Redis tests need it{}. Install it \
                     with `apt-get install redis-server`, or run `scripts/test`, which does.",
                    if std::env::var("CI").as_deref() == Ok("true") { " (CI=true)" } else { "" }
                ),
                Err(e) => panic!("could not start redis-server: {e}"),
            };
            let mut server = RedisServer { child, port, _dir: dir, extra };
            match server.wait_ready(Duration::from_secs(10)) {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// Starts a fresh, empty server on the same port after [`kill`](Self::kill): Redis came
    /// back, having lost its state.
    ///
    /// # Panics
    /// If it does not start within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = spawn(self.port, self._dir.path(), &extra).expect("redis-server restarts");
        if let Err(e) = self.wait_ready(Duration::from_secs(10)) {
            panic!("redis-server did not restart: {e}");
        }
    }

    fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("it exited with {status}: {}", self.log()));
            }
            if self.try_command(&["PING"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("no answer to PING within {within:?}: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's data directory.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    fn try_command(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        // A signal (SIGCHLD, from a server of the test exiting) interrupts a read on a socket
        // with a timeout even where handlers restart system calls (signal(7)), and redis-rs
        // hands the EINTR back: the command is sent again on a new connection, a few times.
        // (The commands tests send here are idempotent: reads, and settings written again.)
        let mut interrupted = 0;
        loop {
            match self.send_command(args) {
                Err(e) if interrupted < 3 && e.is_io_error() && e.to_string().contains("(os error 4)") => {
                    interrupted += 1;
                }
                answer => return answer,
            }
        }
    }

    fn send_command(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
    }

    /// Runs one command on a fresh connection and returns its reply.
    ///
    /// # Panics
    /// If the command fails.
    pub fn command<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let value = self.try_command(args).unwrap_or_else(|e| panic!("redis command {args:?} failed: {e}"));
        redis::from_redis_value(value).unwrap_or_else(|e| panic!("redis reply to {args:?}: {e}"))
    }

    /// A field of `command`'s line in `INFO commandstats` (`calls`, `usec`, `failed_calls`,
    /// ...; a subcommand as `function|load`), 0 when the command has not been called. The
    /// module's key-API writes are not commands and do not show here.
    pub fn command_stat(&self, command: &str, field: &str) -> u64 {
        let info: String = self.command(&["INFO", "commandstats"]);
        let line = format!("cmdstat_{command}:");
        info.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix(field)?.strip_prefix('=')))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Calls of `command` the server has answered ([`command_stat`](Self::command_stat)).
    pub fn calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// Every key on the server (by `SCAN`).
    pub fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let (next, batch): (String, Vec<String>) = self.command(&["SCAN", &cursor, "COUNT", "1000"]);
            keys.extend(batch);
            if next == "0" {
                return keys;
            }
            cursor = next;
        }
    }

    fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process is still alive (not killed, not exited). A killed server has been
    /// waited for, so its process no longer exists.
    pub fn is_alive(&self) -> bool {
        Command::new("kill")
            .args(["-0", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A command's text reply (such as `INFO replication`), or `None` when the server does not
    /// answer.
    pub fn try_text(&self, args: &[&str]) -> Option<String> {
        match self.try_command(args) {
            Ok(value) => redis::from_redis_value(value).ok(),
            Err(_) => None,
        }
    }
}

/// Polls `ready` every 50 ms until it holds.
///
/// # Panics
/// If it does not hold by `deadline`.
pub(crate) fn wait(deadline: Instant, what: &str, mut ready: impl FnMut() -> bool) {
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An argument to [`RedisServer::start_with`] that stands for a free port other than the
/// server's own, chosen at each attempt to start it.
pub(crate) const ANOTHER_FREE_PORT: &str = "{another free port}";

fn spawn(port: u16, dir: &Path, extra: &[&str]) -> std::io::Result<Child> {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", &dir.join("redis.log").to_string_lossy()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // To a file, never a pipe nobody reads: a module's panic messages could fill it and
        // stall the server.
        .stderr(std::fs::File::create(dir.join("stderr.log"))?)
        .spawn()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume_quietly();
        self.kill();
    }
}

impl RedisServer {
    fn resume_quietly(&self) {
        let _ =
            Command::new("kill").args(["-CONT", &self.child.id().to_string()]).stderr(Stdio::null()).status();
    }
}

/// A backend together with the private Redis server it talks to, which stops when this drops.
pub struct OnServer<B> {
    /// The backend.
    pub backend: B,
    /// Its server.
    pub server: RedisServer,
}

#[async_trait::async_trait]
impl<B: tollgate_core::Backend> tollgate_core::Backend for OnServer<B> {
    async fn execute(
        &self,
        key: &str,
        rules: &tollgate_core::RuleSet,
        op: tollgate_core::Operation<'_>,
    ) -> Result<tollgate_core::Decision, tollgate_core::Error> {
        self.backend.execute(key, rules, op).await
    }

    async fn reset(&self, key: &str, rules: &tollgate_core::RuleSet) -> Result<(), tollgate_core::Error> {
        self.backend.reset(key, rules).await
    }

    async fn check_planned(
        &self,
        batch: &tollgate_core::BatchPlan<'_>,
    ) -> Result<Vec<tollgate_core::Decision>, tollgate_core::Error> {
        self.backend.check_planned(batch).await
    }

    async fn ping(&self) -> Result<(), tollgate_core::Error> {
        self.backend.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let (low, high) = below_ephemeral_ports();
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), ports.len(), "{ports:?}");
        for &port in &ports {
            assert!((low..high).contains(&port), "{port} outside {low}..{high}");
            TcpListener::bind(("127.0.0.1", port)).expect("free");
        }
        // What the kernel gives an outgoing connection or `bind(0)` lies above them.
        let kernels = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        assert!(kernels >= high, "{kernels} < {high}");
    }
}
