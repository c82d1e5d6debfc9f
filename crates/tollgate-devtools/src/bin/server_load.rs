//! The load generator of `bench/compare-servers`: one client that drives any rate-limit
//! server the same way, so that Tollgate and its peers are measured by the same code.
//!
//! `--connections` tasks, each on a connection of its own with one request in flight, send
//! requests for `--duration` seconds, each for a key drawn at random (per task) of `--keys`:
//!
//! - `http://host:port`: HTTP/1.1 keep-alive (hyper), `--method` on `--path` with `--body`,
//!   in which `{key}` stands for the key's number (bodies are made once, before the run);
//! - `grpc://host:port`: Envoy's `ShouldRateLimit` (gRPC over HTTP/2) in `--domain`, one
//!   descriptor `--descriptor-key` = `--value` (`{key}` as above), hits_addend 1. Sent on `h2`
//!   itself, each request's message encoded once before the run: on two cores the client shares
//!   the machine with the server, and tonic's client (a `Buffer` task between caller and
//!   connection, the message encoded and the answer decoded through its codec on every call)
//!   cost as much as the servers measured, so that every server looked alike (about 20,000
//!   calls/s each on a 2-core Intel machine, each server at 0.9 of a core).
//!
//! With `--rate R` the load is open: the tasks together send `R` requests a second, each task
//! on a schedule of its own (staggered, so that the tasks do not start together), so that two
//! servers can be compared at the same load rather than each at its own saturation. A request
//! is sent when its time comes, or at once when the task is behind (its connection still busy
//! with the one before: the server is not keeping up; `behind` counts the requests sent more
//! than a millisecond late). Latency is measured from the request's sending, not from its
//! scheduled time: tokio's timer wakes a task on a millisecond tick, about a millisecond after
//! the time asked (measured here: a median of 1.4 ms from the scheduled time against 0.4 ms
//! from the sending, at 5,000/s), which would drown the servers' sub-millisecond differences.
//! A server that falls behind shows it in `behind`, and in a served rate below the offered one.
//!
//! Prints one JSON object: requests, requests per second, latency percentiles in µs, and the
//! outcomes (HTTP status codes, or the RLS overall codes OK and OVER_LIMIT); anything else
//! (another status or code, a transport error) counts as an error, whose first is kept.
//!
//! `cargo run --release -p tollgate-devtools --bin server_load -- --target http://127.0.0.1:8080
//!   --path /v1/check --body '{"key":"user-{key}","policy":"bench"}'`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// The load generator's arguments.
#[derive(Parser, Debug, Clone)]
#[command(about = "Drives a rate-limit server over HTTP or Envoy RLS gRPC; prints JSON")]
struct Args {
    /// http://host:port or grpc://host:port.
    #[arg(long)]
    target: String,
    /// HTTP method.
    #[arg(long, default_value = "POST")]
    method: String,
    /// HTTP path.
    #[arg(long, default_value = "/")]
    path: String,
    /// HTTP body; `{key}` stands for the key's number. Empty: no body.
    #[arg(long, default_value = "")]
    body: String,
    /// RLS domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// RLS descriptor entry's key.
    #[arg(long, default_value = "k")]
    descriptor_key: String,
    /// RLS descriptor entry's value; `{key}` stands for the key's number.
    #[arg(long, default_value = "user-{key}")]
    value: String,
    /// Connections, each with one request in flight (with `--streams`, tasks: see there).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// gRPC: tasks sharing one HTTP/2 connection, each with one request (stream) in flight: the
    /// `--connections` tasks open `connections / streams` connections (rounded up), as a proxy
    /// with a few connections and many calls on each does. A task whose call fails reconnects
    /// on a connection of its own.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Key space: keys are drawn at random of 0..keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Requests per second of all connections together (an open load); 0: each connection sends
    /// its next request as soon as the last is answered.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
}

/// The open load of `--rate`: `rate` a second over `tasks` tasks (none when `rate` is 0).
#[derive(Clone, Copy)]
struct Pace {
    rate: f64,
    tasks: usize,
}

impl Pace {
    /// Task `task`'s schedule, from now (a task connecting again starts a new one).
    fn schedule(self, task: usize) -> Option<Schedule> {
        Schedule::new(self.rate, self.tasks, task, Instant::now())
    }
}

/// A task's schedule under `--rate`: when each of its requests is due.
struct Schedule {
    next: Instant,
    interval: Duration,
}

impl Schedule {
    /// The schedule of task `task` of `tasks` sending `rate` a second together: one request every
    /// `tasks / rate` seconds, the tasks' first requests spread over one such interval. `None`
    /// for a closed load (`rate` 0).
    fn new(rate: f64, tasks: usize, task: usize, start: Instant) -> Option<Schedule> {
        if rate <= 0.0 {
            return None;
        }
        let interval = Duration::from_secs_f64(tasks as f64 / rate);
        Some(Schedule { next: start + interval.mul_f64(task as f64 / tasks as f64), interval })
    }

    /// Waits for the next request's time; returns whether the task was more than a millisecond
    /// past it already.
    async fn due(&mut self) -> bool {
        let at = self.next;
        self.next += self.interval;
        let behind = Instant::now() > at + Duration::from_millis(1);
        tokio::time::sleep_until(at.into()).await;
        behind
    }
}

/// What one task saw.
struct Tally {
    latencies: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
    errors: u64,
    first_error: Option<String>,
    /// Requests sent more than a millisecond after their scheduled time (`--rate`).
    behind: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            latencies: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"),
            outcomes: BTreeMap::new(),
            errors: 0,
            first_error: None,
            behind: 0,
        }
    }

    /// When the next request starts: now, under `--rate` once its time has come.
    async fn start(&mut self, schedule: &mut Option<Schedule>) -> Instant {
        if let Some(schedule) = schedule {
            self.behind += u64::from(schedule.due().await);
        }
        Instant::now()
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }

    fn merge(&mut self, other: Tally) {
        self.latencies.add(&other.latencies).expect("same bounds");
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.errors += other.errors;
        self.behind += other.behind;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// A task's key sequence: a 64-bit LCG, seeded by the task's number.
struct Keys {
    state: u64,
    keys: u64,
}

impl Keys {
    fn next(&mut self) -> usize {
        self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.state >> 33) % self.keys) as usize
    }
}

fn template(text: &str, key: u64) -> String {
    text.replace("{key}", &key.to_string())
}

async fn http_task(
    args: Args,
    authority: String,
    bodies: std::sync::Arc<Vec<Bytes>>,
    task: usize,
    deadline: Instant,
    pace: Pace,
) -> Tally {
    let mut tally = Tally::new();
    let mut keys = Keys { state: task as u64 + 1, keys: args.keys };
    let method: hyper::Method = args.method.parse().expect("checked in main");
    'connect: while Instant::now() < deadline {
        let stream = match tokio::net::TcpStream::connect(&authority).await {
            Ok(s) => s,
            Err(e) => {
                tally.error(format!("connect: {e}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => {
                tally.error(format!("handshake: {e}"));
                continue;
            }
        };
        tokio::spawn(conn);
        // The schedule starts once connected: connecting is not what is measured.
        let mut schedule = pace.schedule(task);
        while Instant::now() < deadline {
            let body = bodies[keys.next()].clone();
            let mut request = hyper::Request::builder()
                .method(method.clone())
                .uri(args.path.as_str())
                .header(hyper::header::HOST, authority.as_str());
            if !body.is_empty() {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            }
            let request = request.body(Full::new(body)).expect("a valid request");
            let start = tally.start(&mut schedule).await;
            let response = match sender.send_request(request).await {
                Ok(r) => r,
                Err(e) => {
                    tally.error(format!("request: {e}"));
                    continue 'connect;
                }
            };
            let status = response.status();
            if let Err(e) = response.into_body().collect().await {
                tally.error(format!("body: {e}"));
                continue 'connect;
            }
            tally.latencies.saturating_record(start.elapsed().as_micros() as u64);
            if status == hyper::StatusCode::OK || status == hyper::StatusCode::TOO_MANY_REQUESTS {
                *tally.outcomes.entry(status.as_u16().to_string()).or_default() += 1;
            } else {
                tally.error(format!("status {status}"));
            }
        }
    }
    tally
}

/// `ShouldRateLimit`'s messages, gRPC-framed (a zero byte, the length in four bytes, the
/// protobuf), one per key, made before the run.
fn grpc_frames(args: &Args) -> Vec<Bytes> {
    use prost::Message;
    (0..args.keys)
        .map(|k| {
            let message = RateLimitRequest {
                domain: args.domain.clone(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: args.descriptor_key.clone(),
                        value: template(&args.value, k),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            }
            .encode_to_vec();
            let mut frame = Vec::with_capacity(5 + message.len());
            frame.push(0);
            frame.extend_from_slice(&u32::try_from(message.len()).expect("a small message").to_be_bytes());
            frame.extend_from_slice(&message);
            Bytes::from(frame)
        })
        .collect()
}

/// One `ShouldRateLimit` call on an HTTP/2 connection: the answer's overall code, or what went
/// wrong.
async fn grpc_call(
    sender: &mut h2::client::SendRequest<Bytes>,
    uri: &hyper::Uri,
    frame: Bytes,
) -> Result<i32, String> {
    use prost::Message;
    let request = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri(uri.clone())
        .header(hyper::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request");
    std::future::poll_fn(|cx| sender.poll_ready(cx)).await.map_err(|e| format!("connection: {e}"))?;
    let (response, mut stream) = sender.send_request(request, false).map_err(|e| format!("request: {e}"))?;
    stream.send_data(frame, true).map_err(|e| format!("send: {e}"))?;
    let response = response.await.map_err(|e| format!("response: {e}"))?;
    let (head, mut body) = response.into_parts();
    if head.status != hyper::StatusCode::OK {
        return Err(format!("HTTP status {}", head.status));
    }
    let mut message = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("body: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    // A gRPC status is in the trailers, or in the headers of an answer with no message.
    let trailers = body.trailers().await.map_err(|e| format!("trailers: {e}"))?;
    let status =
        trailers.as_ref().and_then(|t| t.get("grpc-status")).or_else(|| head.headers.get("grpc-status"));
    match status.map(|s| s.as_bytes()) {
        Some(b"0") => {}
        Some(other) => return Err(format!("grpc-status {}", String::from_utf8_lossy(other))),
        None => return Err("no grpc-status".into()),
    }
    let payload = message.get(5..).ok_or("a message shorter than its frame")?;
    let answer = RateLimitResponse::decode(payload).map_err(|e| format!("decode: {e}"))?;
    Ok(answer.overall_code)
}

/// An HTTP/2 connection to `authority`, its connection task spawned.
async fn h2_connect(authority: &str) -> Result<h2::client::SendRequest<Bytes>, String> {
    let stream = tokio::net::TcpStream::connect(authority).await.map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = h2::client::handshake(stream).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Where gRPC tasks call, and what they send.
#[derive(Clone)]
struct GrpcTarget {
    authority: String,
    uri: hyper::Uri,
    /// One request message per key.
    frames: std::sync::Arc<Vec<Bytes>>,
}

async fn grpc_task(
    target: GrpcTarget,
    keys: u64,
    task: usize,
    deadline: Instant,
    pace: Pace,
    shared: Option<h2::client::SendRequest<Bytes>>,
) -> Tally {
    let GrpcTarget { authority, uri, frames } = target;
    let mut tally = Tally::new();
    let mut keys = Keys { state: task as u64 + 1, keys };
    let mut shared = shared;
    'connect: while Instant::now() < deadline {
        let mut sender = match shared.take() {
            Some(sender) => sender,
            None => match h2_connect(&authority).await {
                Ok(sender) => sender,
                Err(e) => {
                    tally.error(e);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        // The schedule starts once connected: connecting is not what is measured.
        let mut schedule = pace.schedule(task);
        while Instant::now() < deadline {
            let frame = frames[keys.next()].clone();
            let start = tally.start(&mut schedule).await;
            match grpc_call(&mut sender, &uri, frame).await {
                Ok(code) => {
                    tally.latencies.saturating_record(start.elapsed().as_micros() as u64);
                    match code {
                        1 => *tally.outcomes.entry("OK".into()).or_default() += 1,
                        2 => *tally.outcomes.entry("OVER_LIMIT".into()).or_default() += 1,
                        other => tally.error(format!("overall_code {other}")),
                    }
                }
                Err(what) => {
                    tally.error(what);
                    continue 'connect;
                }
            }
        }
    }
    tally
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.connections == 0 || args.streams == 0 || args.keys == 0 || args.duration <= 0.0 {
        bail!("--connections, --streams, --keys and --duration must be positive");
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a number of requests per second, or 0");
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.duration);
    let mut tasks = Vec::new();
    let pace = Pace { rate: args.rate, tasks: args.connections };
    if let Some(authority) = args.target.strip_prefix("http://") {
        let authority = authority.trim_end_matches('/').to_owned();
        args.method.parse::<hyper::Method>().context("--method")?;
        let bodies: Vec<Bytes> = (0..args.keys).map(|k| Bytes::from(template(&args.body, k))).collect();
        let bodies = std::sync::Arc::new(bodies);
        for task in 0..args.connections {
            tasks.push(tokio::spawn(http_task(
                args.clone(),
                authority.clone(),
                bodies.clone(),
                task,
                deadline,
                pace,
            )));
        }
    } else if let Some(authority) = args.target.strip_prefix("grpc://") {
        let authority = authority.trim_end_matches('/').to_owned();
        // Made once (a `Uri` is cloned by reference count), and checked here.
        let uri: hyper::Uri =
            format!("http://{authority}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
                .parse()
                .context("--target")?;
        let frames = std::sync::Arc::new(grpc_frames(&args));
        let mut shared = None;
        for task in 0..args.connections {
            if args.streams > 1 && task % args.streams == 0 {
                shared = Some(h2_connect(&authority).await.map_err(anyhow::Error::msg)?);
            }
            tasks.push(tokio::spawn(grpc_task(
                GrpcTarget { authority: authority.clone(), uri: uri.clone(), frames: frames.clone() },
                args.keys,
                task,
                deadline,
                pace,
                shared.clone(),
            )));
        }
    } else {
        bail!("--target must be http://host:port or grpc://host:port");
    }
    let mut all = Tally::new();
    for task in tasks {
        all.merge(task.await?);
    }
    let seconds = start.elapsed().as_secs_f64();
    let requests: u64 = all.outcomes.values().sum();
    let at = |q: f64| all.latencies.value_at_quantile(q);
    let report = serde_json::json!({
        "target": args.target,
        "connections": args.connections,
        "streams": args.streams,
        "rate": args.rate,
        "behind": all.behind,
        "seconds": seconds,
        "requests": requests,
        "per_second": requests as f64 / seconds,
        "latency_us": {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "p999": at(0.999), "max": all.latencies.max()},
        "outcomes": all.outcomes,
        "errors": all.errors,
        "first_error": all.first_error,
    });
    println!("{report}");
    Ok(())
}
