//! Slow, idle and oversized clients against the real `tollgate serve` and `tollgate proxy`
//! (issue 18): the header, body and idle timeouts, the connection cap, and the early 413.
//! Timeouts are configured short (hundreds of milliseconds); assertions leave wide margins.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Tollgate;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADER_TIMEOUT: Duration = Duration::from_millis(400);
const BODY_TIMEOUT: Duration = Duration::from_millis(600);
const IDLE_TIMEOUT: Duration = Duration::from_millis(700);
/// Far more than any timeout above, far less than the 30 s or more an unbounded server holds.
const MARGIN: Duration = Duration::from_secs(4);

fn config(max_connections: usize, idle: &str) -> String {
    format!(
        r#"
[server]
header_timeout = "{}ms"
body_timeout = "{}ms"
idle_timeout = "{idle}"
max_connections = {max_connections}

[policies.api]
rules = [{{ algorithm = "fixed_window", limit = 1000000, period = "1m" }}]
"#,
        HEADER_TIMEOUT.as_millis(),
        BODY_TIMEOUT.as_millis(),
    )
}

fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection (or `MARGIN` passes); returns what was read
/// and when the connection closed, from `since`.
async fn read_until_closed(stream: &mut TcpStream, since: Instant) -> (String, Option<Duration>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = since + MARGIN + MARGIN;
    loop {
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), None),
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), Some(since.elapsed())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one whole response (head and a Content-Length body) without waiting for the close.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text;
            }
        }
        let n =
            tokio::time::timeout(MARGIN, stream.read(&mut buf)).await.expect("a response in time").unwrap();
        assert!(n > 0, "closed before a whole response; got {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

const CHECK: &str = r#"{"key": "k", "policy": "api"}"#;

fn check_request(keep_alive: bool) -> String {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{CHECK}",
        CHECK.len(),
        if keep_alive { "" } else { "Connection: close\r\n" },
    )
}

#[tokio::test]
async fn half_a_head_is_cut_off_at_the_header_timeout() {
    let server = Tollgate::start(&config(100, "30s"), &[]).await;
    // Half a head, then nothing.
    let mut half = TcpStream::connect(addr(&server.base)).await.unwrap();
    let start = Instant::now();
    half.write_all(b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: appl").await.unwrap();
    // A head trickled a byte at a time: the timeout is a total, not a gap between bytes.
    let mut trickle = TcpStream::connect(addr(&server.base)).await.unwrap();
    let trickling = tokio::spawn(async move {
        let start = Instant::now();
        for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if trickle.write_all(&[*byte]).await.is_err() {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = read_until_closed(&mut trickle, start).await;
        start.elapsed()
    });
    // Nothing at all.
    let mut silent = TcpStream::connect(addr(&server.base)).await.unwrap();

    let (got, closed) = read_until_closed(&mut half, start).await;
    let closed = closed.unwrap_or_else(|| panic!("half a head still held after {:?}", MARGIN * 2));
    assert!(closed >= HEADER_TIMEOUT - Duration::from_millis(50), "closed early: {closed:?}");
    assert!(closed < HEADER_TIMEOUT + MARGIN, "closed after {closed:?}");
    assert!(got.is_empty(), "no answer to half a request: {got:?}");
    let (_, closed) = read_until_closed(&mut silent, start).await;
    assert!(closed.is_some_and(|c| c < HEADER_TIMEOUT + MARGIN), "a silent connection held: {closed:?}");
    let trickled = trickling.await.unwrap();
    assert!(trickled < HEADER_TIMEOUT + MARGIN, "a trickled head held for {trickled:?}");

    // A whole request is still answered.
    let (status, _) = server.check(serde_json::json!({"key": "k", "policy": "api"})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_slow_body_is_answered_408_and_closed_at_the_body_timeout() {
    let server = Tollgate::start(&config(100, "30s"), &[]).await;
    let mut slow = TcpStream::connect(addr(&server.base)).await.unwrap();
    let start = Instant::now();
    slow.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"key\"",
    )
    .await
    .unwrap();
    // A byte every 100 ms, well within any per-read gap, never the whole body in time.
    let (mut reader, mut writer) = slow.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(MARGIN * 2, reader.read_to_end(&mut got)).await;
    let elapsed = start.elapsed();
    trickle.abort();
    assert!(closed.is_ok(), "a slow body held the connection for {elapsed:?}");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.to_ascii_lowercase().contains("content-type: application/problem+json"), "{got}");
    assert!(got.contains("body_timeout"), "{got}");
    assert!(elapsed >= BODY_TIMEOUT - Duration::from_millis(50), "closed early: {elapsed:?}");
    assert!(elapsed < BODY_TIMEOUT + MARGIN, "closed after {elapsed:?}");
}

#[tokio::test]
async fn expect_continue_with_a_body_above_the_limit_gets_413_before_sending_it() {
    let server = Tollgate::start(&config(100, "30s"), &[]).await;
    for expect in [true, false] {
        let mut client = TcpStream::connect(addr(&server.base)).await.unwrap();
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n{}\r\n",
            if expect { "Expect: 100-continue\r\n" } else { "" },
        );
        client.write_all(head.as_bytes()).await.unwrap();
        // No body is sent: the answer must not wait for it.
        let response = read_response(&mut client).await;
        assert!(response.starts_with("HTTP/1.1 413"), "expect {expect}: {response}");
        assert!(!response.contains("100 Continue"), "{response}");
        assert!(
            response.to_ascii_lowercase().contains("content-type: application/problem+json"),
            "{response}"
        );
        assert!(response.contains("body-too-large"), "{response}");
        // And the connection is not kept waiting for the body.
        let (_, closed) = read_until_closed(&mut client, Instant::now()).await;
        assert!(closed.is_some(), "the connection stayed open after 413");
    }
    // At the limit, the body is read as usual.
    let body = format!("{{\"key\": \"k\", \"policy\": \"api\", \"pad\": \"{}\"}}", "x".repeat(100));
    let (status, problem) = {
        let r = server.post_raw("/v1/check", Some("application/json"), body).await;
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(status, 400, "{problem}"); // "pad" is an unknown field: read, parsed and refused
}

#[tokio::test]
async fn keep_alive_clients_keep_working_and_idle_ones_are_closed() {
    let server = Tollgate::start(&config(100, &format!("{}ms", IDLE_TIMEOUT.as_millis())), &[]).await;
    // One connection, a request every 150 ms for over 3 s: longer than every timeout.
    let mut busy = TcpStream::connect(addr(&server.base)).await.unwrap();
    let start = Instant::now();
    let mut answered = 0;
    let mut last_answer = start;
    while start.elapsed() < Duration::from_secs(3) {
        busy.write_all(check_request(true).as_bytes()).await.unwrap();
        let response = read_response(&mut busy).await;
        last_answer = Instant::now();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        answered += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(answered >= 10, "{answered}");

    // Then idle: closed after the idle timeout (longer than the header timeout: idle is not
    // a slow head).
    let (got, closed) = read_until_closed(&mut busy, last_answer).await;
    let closed = closed.unwrap_or_else(|| panic!("an idle connection was held past {:?}", MARGIN * 2));
    assert!(got.is_empty(), "{got:?}");
    assert!(
        closed >= IDLE_TIMEOUT - Duration::from_millis(50),
        "closed after {closed:?}, before the idle timeout"
    );
    assert!(closed < IDLE_TIMEOUT + MARGIN, "closed after {closed:?}");
}

#[tokio::test]
async fn past_the_connection_cap_new_clients_wait_until_a_slot_frees() {
    const CAP: usize = 6;
    let server = Tollgate::start(&config(CAP, "30s"), &[]).await;
    // Let the readiness poll's pooled connection go (it is idle: it is closed for room anyway).
    // CAP connections, each trickling a head that never ends: every slot is taken.
    let mut hogs = Vec::new();
    for _ in 0..CAP {
        let mut hog = TcpStream::connect(addr(&server.base)).await.unwrap();
        hog.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n").await.unwrap();
        hogs.push(hog);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A fresh client: the kernel completes its handshake (the backlog), the server answers
    // once a hog is cut off at the header timeout.
    let start = Instant::now();
    let mut fresh = TcpStream::connect(addr(&server.base)).await.unwrap();
    fresh.write_all(check_request(false).as_bytes()).await.unwrap();
    let response = read_response(&mut fresh).await;
    let waited = start.elapsed();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(waited < HEADER_TIMEOUT + MARGIN, "served after {waited:?}");
    assert!(
        waited >= HEADER_TIMEOUT / 2,
        "served after {waited:?}: the cap of {CAP} did not hold it until a slot freed"
    );
    for mut hog in hogs {
        let (_, closed) = read_until_closed(&mut hog, start).await;
        assert!(closed.is_some(), "a hog is still connected");
    }
}

#[tokio::test]
async fn at_the_cap_idle_keep_alive_connections_make_room_at_once() {
    const CAP: usize = 6;
    let server = Tollgate::start(&config(CAP, "30s"), &[]).await;
    // The readiness poll's pooled connection and CAP - 1 keep-alive clients, each served once
    // and now idle (the idle timeout is 30 s): the server is full.
    let mut idle = Vec::new();
    for _ in 0..CAP - 1 {
        let mut client = TcpStream::connect(addr(&server.base)).await.unwrap();
        client.write_all(check_request(true).as_bytes()).await.unwrap();
        assert!(read_response(&mut client).await.starts_with("HTTP/1.1 200"));
        idle.push(client);
    }
    // Full, but nobody waits: they keep their connections.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for client in &mut idle {
        client.write_all(check_request(true).as_bytes()).await.unwrap();
        assert!(read_response(client).await.starts_with("HTTP/1.1 200"));
    }
    let start = Instant::now();
    let mut fresh = TcpStream::connect(addr(&server.base)).await.unwrap();
    fresh.write_all(check_request(false).as_bytes()).await.unwrap();
    let response = read_response(&mut fresh).await;
    let waited = start.elapsed();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // Neither the idle timeout (30 s) nor the header timeout: an idle connection gave way.
    assert!(waited < HEADER_TIMEOUT, "served after {waited:?}");
}

/// A `tollgate proxy` process, killed when dropped.
struct Proxy {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_proxy(upstream: &str, config: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tollgate.toml"), config).unwrap();
    let port = tollgate_testkit::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("proxy")
        .args(["--upstream", upstream, "--listen", &format!("127.0.0.1:{port}")])
        .arg("--config")
        .arg(dir.path().join("tollgate.toml"))
        .env_remove("TOLLGATE_REDIS_URL")
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_ROUTES")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the tollgate binary starts");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(&addr).await.is_err() {
        assert!(Instant::now() < deadline, "the proxy did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Proxy { child, addr, _dir: dir }
}

#[tokio::test]
async fn the_proxy_cuts_off_slow_heads_and_slow_bodies_too() {
    // An upstream that reads whole bodies.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let app = axum::Router::new()
        .fallback(|body: axum::body::Bytes| async move { format!("{} bytes", body.len()) });
    tokio::spawn(async move { axum::serve(upstream, app).await });
    let mut text = config(100, "30s");
    text.push_str("\n[policies.default]\nrules = [{ algorithm = \"fixed_window\", limit = 1000000, period = \"1m\" }]\n");
    let proxy = start_proxy(&format!("http://{upstream_addr}"), &text).await;

    let mut half = TcpStream::connect(&proxy.addr).await.unwrap();
    let start = Instant::now();
    half.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nAccept: te").await.unwrap();
    let (_, closed) = read_until_closed(&mut half, start).await;
    assert!(closed.is_some_and(|c| c < HEADER_TIMEOUT + MARGIN), "the proxy held half a head: {closed:?}");

    let mut slow = TcpStream::connect(&proxy.addr).await.unwrap();
    let start = Instant::now();
    slow.write_all(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\nsome").await.unwrap();
    let (got, closed) = read_until_closed(&mut slow, start).await;
    let closed = closed.unwrap_or_else(|| panic!("the proxy held a slow body past {:?}", MARGIN * 2));
    assert!(closed < BODY_TIMEOUT + MARGIN, "closed after {closed:?}");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");

    // A whole upload goes through; no body cap on the proxy (it streams).
    let mut upload = TcpStream::connect(&proxy.addr).await.unwrap();
    let body = "x".repeat(200_000);
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    upload.write_all(request.as_bytes()).await.unwrap();
    let response = read_response(&mut upload).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("200000 bytes"), "{response}");
}

#[tokio::test]
async fn http2_with_prior_knowledge_still_works_and_idles_out() {
    use http_body_util::BodyExt as _;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let server = Tollgate::start(&config(100, &format!("{}ms", IDLE_TIMEOUT.as_millis())), &[]).await;
    let client: Client<_, String> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    for _ in 0..3 {
        let request = axum::http::Request::post(format!("{}/v1/check", server.base))
            .header("content-type", "application/json")
            .body(CHECK.to_owned())
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), axum::http::Version::HTTP_2);
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("\"allowed\":true"), "{body:?}");
    }
    // By hand: a connection that opens HTTP/2 and sends no request is closed like any other.
    let mut raw = TcpStream::connect(addr(&server.base)).await.unwrap();
    // The preface and an empty SETTINGS frame, then nothing.
    raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    let start = Instant::now();
    let (_, closed) = read_until_closed(&mut raw, start).await;
    let closed =
        closed.unwrap_or_else(|| panic!("an HTTP/2 connection without requests held past {:?}", MARGIN * 2));
    assert!(closed < HEADER_TIMEOUT.max(IDLE_TIMEOUT) + MARGIN, "closed after {closed:?}");
}

#[tokio::test]
async fn the_grpc_listener_has_the_same_bounds() {
    use http_body_util::BodyExt as _;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let port = tollgate_testkit::free_port();
    let grpc = format!("127.0.0.1:{port}");
    let server =
        Tollgate::start(&config(100, &format!("{}ms", IDLE_TIMEOUT.as_millis())), &["--grpc-listen", &grpc])
            .await;
    // Still a gRPC service: the standard health check answers SERVING (an empty
    // HealthCheckRequest; the reply is the message `status: SERVING`, field 1 = 1).
    let client: Client<_, String> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let request = axum::http::Request::post(format!("http://{grpc}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body("\0\0\0\0\0".to_owned())
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert_eq!(trailers.get("grpc-status").map(|v| v.to_str().unwrap()), Some("0"), "{trailers:?}");
    assert_eq!(&collected.to_bytes()[..], b"\0\0\0\0\x02\x08\x01");

    // Half an HTTP/2 preface, then nothing: closed at the header timeout, as on the HTTP port.
    let mut half = TcpStream::connect(&grpc).await.unwrap();
    let start = Instant::now();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let (_, closed) = read_until_closed(&mut half, start).await;
    let closed = closed.unwrap_or_else(|| panic!("half a preface held past {:?}", MARGIN * 2));
    assert!(closed < HEADER_TIMEOUT + MARGIN, "closed after {closed:?}");
    // A connection that opens HTTP/2 and sends no request is closed too.
    let mut idle = TcpStream::connect(&grpc).await.unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    let start = Instant::now();
    let (_, closed) = read_until_closed(&mut idle, start).await;
    let closed = closed.unwrap_or_else(|| panic!("an idle HTTP/2 connection held past {:?}", MARGIN * 2));
    assert!(closed < HEADER_TIMEOUT.max(IDLE_TIMEOUT) + MARGIN, "closed after {closed:?}");
    drop(server);
}

/// A connection from `source` to `addr` (127.0.0.x are all this machine's).
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let config = r#"
[server]
max_connections = 100
max_connections_per_address = 3

[policies.api]
rules = [{ algorithm = "fixed_window", limit = 1000000, period = "1m" }]
"#;
    let server = Tollgate::start(config, &[]).await;
    let addr = addr(&server.base);
    // 127.0.0.3 is this test's alone (the harness's own client keeps a connection from
    // 127.0.0.1). Three silent connections from it hold its share (the header timeout is 10 s).
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.3", &addr).await);
    }
    // A fourth from the same address is closed at once, without an answer.
    let mut fourth = connect_from("127.0.0.3", &addr).await;
    let start = Instant::now();
    let _ = fourth.write_all(check_request(false).as_bytes()).await;
    let (got, closed) = read_until_closed(&mut fourth, start).await;
    assert!(got.is_empty(), "the fourth connection was answered: {got:?}");
    let closed = closed.expect("the fourth connection was held");
    assert!(closed < Duration::from_secs(2), "closed only after {closed:?}");
    // Another address is served meanwhile.
    let mut other = connect_from("127.0.0.2", &addr).await;
    other.write_all(check_request(false).as_bytes()).await.unwrap();
    let answer = read_response(&mut other).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Once one of the three closes, the address may connect again (well before the header
    // timeout would have closed the other two).
    drop(held.pop());
    let deadline = Instant::now() + MARGIN;
    loop {
        let mut again = connect_from("127.0.0.3", &addr).await;
        again.write_all(check_request(false).as_bytes()).await.unwrap();
        let mut buf = [0u8; 12];
        if let Ok(Ok(12)) = tokio::time::timeout(MARGIN, again.read_exact(&mut buf)).await {
            assert_eq!(&buf, b"HTTP/1.1 200");
            break;
        }
        // The server may not have seen the close yet.
        assert!(Instant::now() < deadline, "the address's freed slot was not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The names of the server's threads serving connections (`tollgate-conn-N`), from /proc.
fn connection_thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("tollgate-conn-"))
        .collect();
    names.sort();
    names
}

/// `connection_threads`: connections on threads of their own (3 here), or on the shared
/// runtime (0). Either way the bounds hold, and many clients at once on several threads take
/// exactly the limit between them.
#[tokio::test]
async fn connections_are_served_on_the_configured_threads() {
    for (threads, names) in [(3, vec!["tollgate-conn-0", "tollgate-conn-1", "tollgate-conn-2"]), (0, vec![])]
    {
        let config = format!(
            "[server]\nheader_timeout = \"{}ms\"\nconnection_threads = {threads}\n\n\
             [policies.api]\nrules = [{{ algorithm = \"fixed_window\", limit = 100, period = \"1h\" }}]\n",
            HEADER_TIMEOUT.as_millis()
        );
        let server = Tollgate::start(&config, &[]).await;
        assert_eq!(connection_thread_names(server.pid()), names, "connection_threads = {threads}");
        assert!(server.logs().contains(&format!("connection_threads={threads}")), "{}", server.logs());

        // A silent connection is closed at the header timeout.
        let mut silent = TcpStream::connect(addr(&server.base)).await.unwrap();
        let start = Instant::now();
        let (_, closed) = read_until_closed(&mut silent, start).await;
        assert!(closed.is_some_and(|c| c < HEADER_TIMEOUT + MARGIN), "a silent connection held: {closed:?}");

        // 12 keep-alive clients, 20 checks each, all at once: exactly 100 admitted.
        let clients = (0..12).map(|_| {
            let addr = addr(&server.base);
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                let mut admitted = 0;
                for _ in 0..20 {
                    stream.write_all(check_request(true).as_bytes()).await.unwrap();
                    let answer = read_response(&mut stream).await;
                    assert!(
                        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.1 429"),
                        "{answer}"
                    );
                    admitted += usize::from(answer.starts_with("HTTP/1.1 200"));
                }
                admitted
            })
        });
        let mut admitted = 0;
        for client in clients.collect::<Vec<_>>() {
            admitted += client.await.unwrap();
        }
        assert_eq!(admitted, 100, "connection_threads = {threads}");
    }
}
