//! `tollgate proxy` in front of a real upstream (an axum app in this process): limits enforced
//! before forwarding, bodies of several MiB intact both ways and streamed, X-Forwarded-*
//! headers, and the upstream's failures answered 502 and 504.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use http_body::Frame;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

const CONFIG: &str = r#"
[policies.default]
rules = [{ algorithm = "fixed_window", limit = 1000, period = "1m" }]

[policies.tight]
rules = [{ name = "minute", algorithm = "fixed_window", limit = 2, period = "1m", align = "first_hit" }]
"#;

const ROUTES: &str = r#"
default_policy = "default"
key = { kind = "client_ip", trusted_proxies = ["127.0.0.9"] }

[[routes]]
path = "/limited"
policy = "tight"
"#;

/// A `tollgate proxy` process, killed when dropped.
struct Proxy {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Proxy {
    async fn start(upstream: &str, extra: &[&str]) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tollgate.toml"), CONFIG).unwrap();
        std::fs::write(dir.path().join("routes.toml"), ROUTES).unwrap();
        let port = tollgate_testkit::free_port();
        let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("proxy")
            .args(["--upstream", upstream, "--listen", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(dir.path().join("tollgate.toml"))
            .arg("--routes")
            .arg(dir.path().join("routes.toml"))
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("TOLLGATE_REDIS_URL")
            .env_remove("TOLLGATE_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the tollgate binary starts");
        let mut proxy = Proxy { child, base: format!("http://127.0.0.1:{port}"), dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!("tollgate proxy exited with {status}:\n{}", proxy.logs());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return proxy;
            }
            assert!(Instant::now() < deadline, "tollgate proxy did not listen:\n{}", proxy.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A body fed chunk by chunk from a channel: the test decides when each chunk is sent.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

#[derive(Clone, Default)]
struct Upstream {
    hits: Arc<AtomicU64>,
    /// The sender of `/stream`'s body, once a request asked for it.
    stream: Arc<Mutex<Option<mpsc::Sender<Bytes>>>>,
}

async fn echo(State(u): State<Upstream>, req: Request) -> Response {
    u.hits.fetch_add(1, Ordering::Relaxed);
    // Streams the request body back as it arrives.
    Response::new(req.into_body())
}

/// `n` MiB of a pattern that shows any reordered or lost byte.
fn pattern(mib: usize) -> Vec<u8> {
    (0..mib * 1024 * 1024).map(|i| (i % 251) as u8 ^ (i >> 16) as u8).collect()
}

async fn upstream() -> (String, Upstream) {
    let state = Upstream::default();
    let app = Router::new()
        .route("/echo", post(echo))
        .route(
            "/limited",
            get(|State(u): State<Upstream>| async move {
                u.hits.fetch_add(1, Ordering::Relaxed);
                "upstream"
            }),
        )
        .route("/big", get(|| async { pattern(6) }))
        .route(
            "/headers",
            get(|headers: HeaderMap| async move {
                let h = |n: &str| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
                axum::Json(json!({
                    "xff": h("x-forwarded-for"), "proto": h("x-forwarded-proto"),
                    "host": h("host"), "forwarded_host": h("x-forwarded-host"), "x_trace": h("x-trace"),
                }))
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route(
            "/stream",
            get(|State(u): State<Upstream>| async move {
                let (tx, rx) = mpsc::channel(4);
                tx.send(Bytes::from_static(b"first chunk;")).await.unwrap();
                *u.stream.lock().await = Some(tx);
                Response::new(Body::new(ChannelBody(rx)))
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), state)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

#[tokio::test]
async fn limits_are_enforced_before_the_upstream() {
    let (up, state) = upstream().await;
    let proxy = Proxy::start(&up, &[]).await;
    let c = client();
    for _ in 0..2 {
        let r = c.get(proxy.url("/limited")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["ratelimit-policy"], r#""minute";q=2;w=60"#);
        assert_eq!(r.text().await.unwrap(), "upstream");
    }
    let r = c.get(proxy.url("/limited")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(r.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["policy"], "tight");
    // The refused request never reached the upstream.
    assert_eq!(state.hits.load(Ordering::Relaxed), 2);
    // Spoofing from an untrusted client does not escape (only 127.0.0.9 is a trusted proxy).
    let r = c.get(proxy.url("/limited")).header("x-forwarded-for", "203.0.113.5").send().await.unwrap();
    assert_eq!(r.status(), 429);
}

#[tokio::test]
async fn bodies_of_several_mib_pass_intact_both_ways() {
    let (up, _state) = upstream().await;
    let proxy = Proxy::start(&up, &[]).await;
    let c = client();
    let sent = pattern(8);
    let r = c.post(proxy.url("/echo")).body(sent.clone()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-ratelimit-remaining"));
    let back = r.bytes().await.unwrap();
    assert_eq!(back.len(), sent.len());
    assert!(back == sent, "the echoed body differs");

    let r = c.get(proxy.url("/big")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let got = r.bytes().await.unwrap();
    assert_eq!(got.len(), 6 * 1024 * 1024);
    assert!(got == pattern(6), "the downloaded body differs");
}

#[tokio::test]
async fn responses_stream_before_the_upstream_finishes() {
    let (up, state) = upstream().await;
    let proxy = Proxy::start(&up, &[]).await;
    let mut r = client().get(proxy.url("/stream")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The first chunk arrives while the upstream still holds the rest: nothing is buffered.
    assert_eq!(r.chunk().await.unwrap().unwrap(), "first chunk;");
    let tx = state.stream.lock().await.take().unwrap();
    tx.send(Bytes::from_static(b"second")).await.unwrap();
    drop(tx);
    let mut rest = Vec::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"second");
}

#[tokio::test]
async fn forwarded_headers_are_appended_and_written() {
    let (up, _state) = upstream().await;
    let proxy = Proxy::start(&up, &[]).await;
    let c = client();
    let r: Value = c
        .get(proxy.url("/headers"))
        .header("x-forwarded-for", "198.51.100.1")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "evil.example")
        .header("x-trace", "abc")
        .header("connection", "x-trace")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The client's chain is kept and its peer address appended; Proto and Host come from this
    // hop (the client is not a trusted proxy); Host is the upstream's; headers named in
    // Connection are not forwarded.
    assert_eq!(r["xff"], "198.51.100.1, 127.0.0.1");
    assert_eq!(r["proto"], "http");
    let port = proxy.base.rsplit(':').next().unwrap();
    assert_eq!(r["forwarded_host"], format!("127.0.0.1:{port}"));
    assert_eq!(r["host"], up.trim_start_matches("http://"));
    assert_eq!(r["x_trace"], Value::Null);
}

#[tokio::test]
async fn upstream_failures_are_502_and_504() {
    let dead = format!("http://127.0.0.1:{}", tollgate_testkit::free_port());
    let proxy = Proxy::start(&dead, &[]).await;
    let r = client().get(proxy.url("/anything")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["content-type"], "application/problem+json");

    let (up, _state) = upstream().await;
    let proxy = Proxy::start(&up, &["--upstream-timeout", "300ms"]).await;
    let start = Instant::now();
    let r = client().get(proxy.url("/slow")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], 504);
}

#[tokio::test]
async fn a_routes_file_with_a_mistake_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("routes.toml"), "default_policy = \"nope\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--routes"])
        .arg(dir.path().join("routes.toml"))
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("default_policy") && stderr.contains("nope"), "{stderr}");
}
