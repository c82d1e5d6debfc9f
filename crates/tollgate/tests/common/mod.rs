//! Runs the real `tollgate` binary for end-to-end tests: a private config file, a free port,
//! logs kept for assertions, killed when dropped.

#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Tollgate {
    child: Child,
    pub base: String,
    pub client: reqwest::Client,
    dir: tempfile::TempDir,
}

impl Tollgate {
    /// Starts `tollgate serve --config <config>` with `extra` arguments and waits until
    /// `/healthz` answers.
    pub async fn start(config: &str, extra: &[&str]) -> Tollgate {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tollgate.toml"), config).unwrap();
        Self::start_in(dir, extra, true, &[]).await
    }

    /// Like [`start`](Self::start), with extra environment variables.
    pub async fn start_with_env(config: &str, extra: &[&str], env: &[(&str, &str)]) -> Tollgate {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tollgate.toml"), config).unwrap();
        Self::start_in(dir, extra, true, env).await
    }

    /// Starts `tollgate serve` on the built-in configuration.
    pub async fn start_builtin(extra: &[&str]) -> Tollgate {
        Self::start_in(tempfile::tempdir().unwrap(), extra, false, &[]).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        extra: &[&str],
        with_config: bool,
        env: &[(&str, &str)],
    ) -> Tollgate {
        let port = tollgate_testkit::free_port();
        let log = std::fs::File::create(dir.path().join("tollgate.log")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("serve").args(["--listen", &format!("127.0.0.1:{port}")]);
        if with_config {
            cmd.arg("--config").arg(dir.path().join("tollgate.toml"));
        }
        if !extra.contains(&"--grpc-listen") {
            cmd.args(["--grpc-listen", &format!("127.0.0.1:{}", tollgate_testkit::free_port())]);
        }
        if !extra.contains(&"--database") {
            cmd.arg("--database").arg(format!("sqlite://{}", dir.path().join("tollgate.db").display()));
        }
        let child = cmd
            .args(extra)
            // Tracing is on only where a test turns it on.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED")
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .env_remove("TOLLGATE_CONFIG")
            .env_remove("TOLLGATE_REDIS_URL")
            .env_remove("TOLLGATE_LISTEN")
            .env_remove("TOLLGATE_DATABASE_URL")
            .env_remove("TOLLGATE_GRPC_LISTEN")
            .env_remove("TOLLGATE_ENVOY_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the tollgate binary starts");
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        let mut server = Tollgate { child, base: format!("http://127.0.0.1:{port}"), client, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("tollgate exited with {status}:\n{}", server.logs());
            }
            if let Ok(r) = server.client.get(server.url("/healthz")).send().await
                && r.status() == 200
            {
                return server;
            }
            assert!(Instant::now() < deadline, "tollgate did not answer /healthz:\n{}", server.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("tollgate.toml")
    }

    /// Replaces the config file the way an editor does (write aside, rename over).
    pub fn rewrite_config(&self, text: &str) {
        let tmp = self.dir.path().join("tollgate.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.config_path()).unwrap();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tollgate.log")).unwrap_or_default()
    }

    /// POSTs `body` as JSON to `path`.
    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client.post(self.url(path)).json(body).send().await.unwrap()
    }

    /// POSTs raw bytes with a content type.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut req = self.client.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        req.send().await.unwrap()
    }

    /// `POST /v1/check`: status and body.
    pub async fn check(&self, body: Value) -> (u16, Value) {
        let r = self.post("/v1/check", &body).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// The sum of the Prometheus samples whose line starts with `series` (0 when none).
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.get_text("/metrics").await;
        text.lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM without waiting for the exit.
    pub fn signal_term(&self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "tollgate did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tollgate token create` against `database`: the printed secret.
pub fn bootstrap_token(database: &str, name: &str, role: &str, apps: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(["token", "create", "--name", name, "--role", role, "--database", database]);
    if let Some(apps) = apps {
        cmd.args(["--apps", apps]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(secret.starts_with("tg_"), "{secret}");
    secret
}

/// Sleeps past the end of the current clock-aligned window of `period_secs` if fewer than
/// `margin_secs` of it remain, so a test's requests all fall in one window.
pub async fn inside_window(period_secs: u64, margin_secs: u64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let into = now.as_millis() % (u128::from(period_secs) * 1000);
    let left = u128::from(period_secs) * 1000 - into;
    if left < u128::from(margin_secs) * 1000 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 50)).await;
    }
}

/// Checks the shape every RFC 9457 answer has (its content type; `type`, `title` and `detail`;
/// a `status` member equal to the HTTP status), adding what is wrong to `wrong`. Returns the
/// body when it is JSON, for the caller's own checks.
pub fn problem_shape(
    status: u16,
    content_type: Option<&str>,
    text: &str,
    wrong: &mut Vec<String>,
) -> Option<Value> {
    if content_type != Some("application/problem+json") {
        wrong.push(format!("content-type {content_type:?}"));
    }
    match serde_json::from_str::<Value>(text) {
        Err(e) => {
            wrong.push(format!("body is not JSON ({e})"));
            None
        }
        Ok(body) => {
            for member in ["type", "title", "detail"] {
                if body[member].as_str().is_none_or(str::is_empty) {
                    wrong.push(format!("{member} missing or empty"));
                }
            }
            if body["status"].as_u64() != Some(u64::from(status)) {
                wrong.push(format!("status member {} is not the HTTP status {status}", body["status"]));
            }
            Some(body)
        }
    }
}

/// Polls `probe` every 50 ms until it is true, for at most `within`.
pub async fn eventually<F: Future<Output = bool>>(within: Duration, mut probe: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
