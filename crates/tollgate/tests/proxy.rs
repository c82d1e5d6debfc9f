//! `tollgate proxy` in front of a real upstream (an axum app in this process): limits enforced
//! before forwarding, bodies of several MiB intact both ways and streamed, X-Forwarded-*,
//! Forwarded and X-Real-IP headers, canonical paths (every spelling of a route gets its policy
//! and reaches the upstream as the path that was matched, or is refused), and the upstream's
//! failures answered 502 and 504.

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
        Proxy::start_with(upstream, CONFIG, ROUTES, extra).await
    }

    async fn start_with(upstream: &str, config: &str, routes: &str, extra: &[&str]) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tollgate.toml"), config).unwrap();
        std::fs::write(dir.path().join("routes.toml"), routes).unwrap();
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
                    "real_ip": h("x-real-ip"), "forwarded": h("forwarded"),
                    "original_url": h("x-original-url"), "rewrite_url": h("x-rewrite-url"),
                    "method_override": h("x-http-method-override"), "method": h("x-http-method"),
                    "override": h("x-method-override"),
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

/// A client whose connections come from `from` (any 127.0.0.0/8 address works on Linux).
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
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
    // The problem type's entry in the API's catalogue, not the tower layer's README section.
    assert_eq!(body["type"], "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#rate-limited");
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
async fn a_clients_own_forwarded_and_x_real_ip_are_replaced_unless_it_is_a_trusted_proxy() {
    let (up, _state) = upstream().await;
    let proxy = Proxy::start(&up, &[]).await;
    let port = proxy.base.rsplit(':').next().unwrap().to_owned();
    let send = |from: &str| {
        client_from(from)
            .get(proxy.url("/headers"))
            .header("forwarded", "for=198.51.100.1;host=evil.example;proto=https")
            .header("x-real-ip", "198.51.100.1")
            .header("x-original-url", "/login")
            .header("x-rewrite-url", "/login")
            .header("x-http-method-override", "POST")
            .header("x-http-method", "POST")
            .header("x-method-override", "POST")
            .send()
    };
    // 127.0.0.1 is not a trusted proxy (only 127.0.0.9 is): what it claims is replaced by what
    // this hop saw, and the path and method overrides are dropped.
    let r: Value = send("127.0.0.1").await.unwrap().json().await.unwrap();
    assert_eq!(r["real_ip"], "127.0.0.1");
    assert_eq!(r["forwarded"], format!("for=127.0.0.1;host=\"127.0.0.1:{port}\";proto=http"));
    for dropped in ["original_url", "rewrite_url", "method_override", "method", "override"] {
        assert_eq!(r[dropped], Value::Null, "{dropped}: {r}");
    }
    // A trusted proxy's are passed on, this hop's element appended to its Forwarded list.
    let r: Value = send("127.0.0.9").await.unwrap().json().await.unwrap();
    assert_eq!(r["real_ip"], "198.51.100.1");
    assert_eq!(
        r["forwarded"],
        format!(
            "for=198.51.100.1;host=evil.example;proto=https, for=127.0.0.9;host=\"127.0.0.1:{port}\";proto=http"
        )
    );
    assert_eq!(r["original_url"], "/login");
    assert_eq!(r["method_override"], "POST");
    // Without headers of its own, a client still gets this hop's.
    let r: Value = client().get(proxy.url("/headers")).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["real_ip"], "127.0.0.1");
    assert_eq!(r["forwarded"], format!("for=127.0.0.1;host=\"127.0.0.1:{port}\";proto=http"));
}

// ---------------------------------------------------------------------------------------------
// Canonical paths (issue 18)

const PATHS_CONFIG: &str = r#"
[policies.default]
rules = [{ name = "default", algorithm = "fixed_window", limit = 1000000, period = "1m" }]

[policies.login]
rules = [{ name = "login", algorithm = "fixed_window", limit = 1000000, period = "1m" }]
"#;

const PATHS_ROUTES: &str = r#"
default_policy = "default"

[[routes]]
path = "/login"
policy = "login"
"#;

/// An upstream that answers every request with the request target it received.
async fn recording_upstream() -> (String, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&hits);
    let app = Router::new().fallback(move |uri: axum::http::Uri| {
        counter.fetch_add(1, Ordering::Relaxed);
        async move { uri.to_string() }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), hits)
}

/// A raw `GET <target>` (HTTP clients normalise paths themselves): the status, the rule named
/// first in RateLimit-Policy, and the body.
async fn raw_get(base: &str, target: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let policy = head
        .lines()
        .find_map(|l| l.strip_prefix("ratelimit-policy: \""))
        .and_then(|v| v.split('"').next())
        .unwrap_or("")
        .to_owned();
    (status, policy, body.to_owned())
}

/// What a spelling must get: the rule (so the policy) that limited it and the target the
/// upstream received, or a 400 naming `path` (never reaching the upstream).
enum Expect {
    Forwarded(&'static str, &'static str),
    Refused,
}

async fn check_spellings(proxy: &Proxy, hits: &AtomicU64, table: &[(&str, Expect)]) {
    let mut wrong = Vec::new();
    for (target, expect) in table {
        let before = hits.load(Ordering::Relaxed);
        let (status, policy, body) = raw_get(&proxy.base, target).await;
        let reached = hits.load(Ordering::Relaxed) - before;
        match expect {
            Expect::Forwarded(want_policy, want_target) => {
                if (status, policy.as_str(), body.as_str(), reached) != (200, *want_policy, *want_target, 1) {
                    wrong.push(format!(
                        "{target}: expected {want_policy} and {want_target:?} upstream, got {status} {policy} {body:?} ({reached} reached the upstream)"
                    ));
                }
            }
            Expect::Refused => {
                let problem: Value = serde_json::from_str(&body).unwrap_or_default();
                if (status, &problem["field"], reached) != (400, &json!("path"), 0) {
                    wrong.push(format!("{target}: expected a 400 naming path, got {status} {body:?} ({reached} reached the upstream)"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} spellings answered wrongly:\n{}\n{}",
        wrong.len(),
        wrong.join("\n"),
        proxy.logs()
    );
}

/// Spellings nginx, Spring, werkzeug or Python's http.server serve as /login (or refuse), and
/// some they do not; as forwarded under the default `non_canonical_paths = "normalize"`.
fn spellings() -> Vec<(&'static str, Expect)> {
    use Expect::*;
    vec![
        ("/login", Forwarded("login", "/login")),
        ("//login", Forwarded("login", "/login")),
        ("/./login", Forwarded("login", "/login")),
        ("/%6Cogin", Forwarded("login", "/login")),
        ("/x/../login", Forwarded("login", "/login")),
        ("/login;x", Forwarded("login", "/login")),
        ("/..;/login", Forwarded("login", "/login")),
        ("/%2e%2e/login", Forwarded("login", "/login")),
        ("/x/%2E%2e/login", Forwarded("login", "/login")),
        ("/../../../login", Forwarded("login", "/login")),
        ("/login/", Forwarded("login", "/login/")),
        ("/login?x", Forwarded("login", "/login?x")),
        ("/login;jsessionid=0?next=/..", Forwarded("login", "/login?next=/..")),
        // The absolute form, as sent to a forward proxy.
        ("http://upstream.example/x/../login", Forwarded("login", "/login")),
        ("/%2Flogin", Refused),
        ("/x/..%2flogin", Refused),
        ("/login%00", Refused),
        ("/x\\..\\login", Refused),
        ("/%5c%5clogin", Refused),
        ("/%256Cogin", Refused),
        ("/%zz/login", Refused),
        ("/%ff/../login", Refused),
        ("/LOGIN", Forwarded("default", "/LOGIN")),
        ("/login.php", Forwarded("default", "/login.php")),
    ]
}

#[tokio::test]
async fn path_spellings_get_the_routes_policy_and_reach_the_upstream_as_matched() {
    let (up, hits) = recording_upstream().await;
    let proxy = Proxy::start_with(&up, PATHS_CONFIG, PATHS_ROUTES, &[]).await;
    check_spellings(&proxy, &hits, &spellings()).await;
    // A long path (60 KB) resolves like a short one.
    let long = format!("/{}login", "a/../".repeat(12_000));
    assert_eq!(raw_get(&proxy.base, &long).await, (200, "login".into(), "/login".into()));

    // Under an upstream prefix, no spelling climbs out of it.
    let proxy = Proxy::start_with(&format!("{up}/app"), PATHS_CONFIG, PATHS_ROUTES, &[]).await;
    use Expect::*;
    check_spellings(
        &proxy,
        &hits,
        &[
            ("/../admin", Forwarded("default", "/app/admin")),
            ("/x/%2e%2e/%2e%2e/login", Forwarded("login", "/app/login")),
            ("/..%2Fadmin", Refused),
        ],
    )
    .await;
}

#[tokio::test]
async fn path_spellings_under_reject_and_case_insensitive_matching() {
    let (up, hits) = recording_upstream().await;
    let routes = format!("non_canonical_paths = \"reject\"\n{PATHS_ROUTES}");
    let proxy = Proxy::start_with(&up, PATHS_CONFIG, &routes, &[]).await;
    // Only spellings forwarded unchanged pass; every other one is refused.
    let table: Vec<(&str, Expect)> = spellings()
        .into_iter()
        .map(|(target, expect)| match expect {
            Expect::Forwarded(_, forwarded) if forwarded == target => (target, expect),
            _ => (target, Expect::Refused),
        })
        .collect();
    check_spellings(&proxy, &hits, &table).await;
    let (status, _, body) = raw_get(&proxy.base, "//login").await;
    assert_eq!(status, 400);
    // The problem names the field and the form to send.
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        problem["type"],
        "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#invalid-request"
    );
    assert!(problem["detail"].as_str().unwrap().contains("\"/login\""), "{body}");

    let routes = format!("path_case = \"insensitive\"\n{PATHS_ROUTES}");
    let proxy = Proxy::start_with(&up, PATHS_CONFIG, &routes, &[]).await;
    use Expect::*;
    check_spellings(
        &proxy,
        &hits,
        &[
            ("/LOGIN", Forwarded("login", "/LOGIN")),
            ("//LoGiN/", Forwarded("login", "/LoGiN/")),
            ("/%4Cogin;x", Forwarded("login", "/Login")),
            ("/logins", Forwarded("default", "/logins")),
        ],
    )
    .await;
}

#[tokio::test]
async fn upstream_failures_are_502_and_504() {
    let dead = format!("http://127.0.0.1:{}", tollgate_testkit::free_port());
    let proxy = Proxy::start(&dead, &[]).await;
    let r = client().get(proxy.url("/anything")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#bad-gateway");

    let (up, _state) = upstream().await;
    let proxy = Proxy::start(&up, &["--upstream-timeout", "300ms"]).await;
    let start = Instant::now();
    let r = client().get(proxy.url("/slow")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], 504);
    assert_eq!(body["type"], "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#gateway-timeout");
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
