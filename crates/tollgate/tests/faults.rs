//! Faults between the server and its Redis, and at its own front door: latency and dropped
//! connections injected by the testkit's [`FaultProxy`], Redis restarted empty, and a storm of
//! concurrent connections. Each test prints its measurements as `FIGURE name: value unit`
//! lines (`scripts/faults` collects them); each asserts that no count admitted by Redis ever
//! exceeds its limit.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Tollgate;
use serde_json::{Value, json};
use tollgate_testkit::{FaultProxy, RedisServer};

/// Held by each test for its whole run: the figures are measurements, so no test runs beside
/// another (the storm would slow everything near it), whatever `--test-threads` says.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The limit of policy `p`; policy `wide` never denies in these tests.
const LIMIT: usize = 20;

/// A Redis-backed server's config under the `local` failure policy. `timeout` bounds each Redis
/// call; the probe is fast so the return to Redis is quick to see.
fn config(redis_url: &str, timeout: &str) -> String {
    format!(
        r#"
[backend]
kind = "redis"
url = "{redis_url}"
prefix = "e2e"
timeout = "{timeout}"
on_failure = "local"
probe_interval = "100ms"

[policies.p]
rules = [{{ algorithm = "fixed_window", limit = {LIMIT}, period = "1h" }}]

[policies.wide]
rules = [{{ algorithm = "fixed_window", limit = 1000000000, period = "1h" }}]
"#
    )
}

fn check(key: &str, policy: &str) -> Value {
    json!({"key": key, "policy": policy})
}

fn figure(name: &str, value: Duration) {
    println!("FIGURE {name}: {:.2} ms", value.as_secs_f64() * 1000.0);
}

fn count(name: &str, value: usize) {
    println!("FIGURE {name}: {value}");
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Peeks (cost 0, on a key nothing else uses) until an answer is not degraded; the time it took.
async fn until_not_degraded(server: &Tollgate, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let (status, body) = server.check(json!({"key": "peek", "policy": "wide", "cost": 0})).await;
        if status == 200 && body["degraded"] == false {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "still degraded after {within:?}: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `checks` at once; each answer's status and whether it was degraded.
async fn concurrently(server: &Tollgate, body: Value, checks: usize) -> Vec<(u16, bool)> {
    let tasks: Vec<_> = (0..checks)
        .map(|_| {
            let (client, url, body) = (server.client.clone(), server.url("/v1/check"), body.clone());
            tokio::spawn(async move {
                let r = client.post(url).json(&body).send().await.expect("an answer");
                let status = r.status().as_u16();
                let body: Value = r.json().await.expect("a JSON body");
                (status, body["degraded"] == true)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Sends twice the limit of concurrent checks of a fresh key under `p`; asserts that Redis
/// decided every one and admitted exactly the limit.
async fn assert_exact(server: &Tollgate, key: &str) {
    let answers = concurrently(server, check(key, "p"), 2 * LIMIT).await;
    let admitted = answers.iter().filter(|(s, _)| *s == 200).count();
    let denied = answers.iter().filter(|(s, _)| *s == 429).count();
    assert!(answers.iter().all(|(_, degraded)| !degraded), "every answer from Redis: {answers:?}");
    assert_eq!((admitted, denied), (LIMIT, LIMIT), "{key}: {answers:?}");
}

/// One answer seen by the background load.
#[derive(Clone, Debug)]
struct Answer {
    at: Instant,
    key: String,
    /// The HTTP status, or 0 when the request itself failed.
    status: u16,
    degraded: bool,
    took: Duration,
}

/// Workers checking in a loop until stopped, every answer recorded. Worker `w`'s `n`th check
/// is `next(w, n)`: a key and a policy.
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

type Next = fn(usize, usize) -> (String, &'static str);

impl Load {
    fn start(server: &Tollgate, workers: usize, next: Next) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let workers = (0..workers)
            .map(|w| {
                let (client, url) = (server.client.clone(), server.url("/v1/check"));
                let (stop, answers) = (Arc::clone(&stop), Arc::clone(&answers));
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let (key, policy) = next(w, n);
                        n += 1;
                        let start = Instant::now();
                        let (status, degraded) =
                            match client.post(&url).json(&check(&key, policy)).send().await {
                                Ok(r) => {
                                    let status = r.status().as_u16();
                                    let body: Value = r.json().await.unwrap_or(Value::Null);
                                    (status, body["degraded"] == true)
                                }
                                Err(_) => (0, false),
                            };
                        let took = start.elapsed();
                        answers.lock().unwrap().push(Answer { at: start, key, status, degraded, took });
                    }
                })
            })
            .collect();
        Load { stop, answers, workers }
    }

    fn snapshot(&self) -> Vec<Answer> {
        self.answers.lock().unwrap().clone()
    }

    /// Waits until an answer started after `since` satisfies `what`; when it started.
    async fn until(&self, since: Instant, within: Duration, what: impl Fn(&Answer) -> bool) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            if let Some(a) = self.snapshot().iter().find(|a| a.at >= since && what(a)) {
                return a.at;
            }
            assert!(Instant::now() < deadline, "no such answer within {within:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.await.unwrap();
        }
        Arc::try_unwrap(self.answers).unwrap().into_inner().unwrap()
    }
}

#[tokio::test]
async fn latency_below_the_timeout_stays_exact_above_it_the_failure_policy_answers() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    // 400 ms: a loaded machine's healthy Redis plus the 40 ms added below fit well within it.
    let server = Tollgate::start(&config(&proxy.url(), "400ms"), &[]).await;
    until_not_degraded(&server, Duration::from_secs(5)).await;

    // 20 ms each way: every round trip to Redis takes 40 ms more, still under the timeout.
    proxy.set_latency(Duration::from_millis(20));
    let mut below = Vec::new();
    for i in 0..40u64 {
        let start = Instant::now();
        let (status, body) = server.check(check("slow", "wide")).await;
        below.push(start.elapsed());
        assert_eq!((status, &body["degraded"]), (200, &json!(false)), "{body}");
        assert_eq!(body["remaining"], json!(999_999_999 - i), "counted once each, in Redis");
    }
    let p50 = percentile(&below, 0.5);
    figure("latency_below_timeout_p50", p50);
    figure("latency_below_timeout_p99", percentile(&below, 0.99));
    assert!(p50 >= Duration::from_millis(40), "the proxy is in the path: p50 {p50:?}");
    assert_exact(&server, "slow-exact").await;
    assert!(redis.keys().contains(&"e2e:{slow-exact}:h".to_owned()), "{:?}", redis.keys());

    // 500 ms each way: no call can answer within 400 ms. The first few pay the timeout, then
    // the breaker answers at once.
    proxy.set_latency(Duration::from_millis(500));
    let mut above = Vec::new();
    for _ in 0..100 {
        let start = Instant::now();
        let (status, body) = server.check(check("slower", "wide")).await;
        above.push(start.elapsed());
        assert_eq!((status, &body["degraded"]), (200, &json!(true)), "{body}");
    }
    let (p50, p99, max) = (percentile(&above, 0.5), percentile(&above, 0.99), *above.iter().max().unwrap());
    let waited = above.iter().filter(|t| **t >= Duration::from_millis(300)).count();
    figure("latency_above_timeout_p50", p50);
    figure("latency_above_timeout_p99", p99);
    figure("latency_above_timeout_max", max);
    count("latency_above_timeout_waited", waited);
    assert!(max < Duration::from_millis(1400), "bounded by the 400 ms timeout: max {max:?}");
    assert!(p50 < Duration::from_millis(50), "the open breaker spares the wait: p50 {p50:?}");
    assert!((1..=10).contains(&waited), "only the calls before the breaker opened waited: {waited}");
    // The local limiter keeps limiting: the limit, then denials.
    for expected in [vec![200; LIMIT], vec![429; 3]].concat() {
        let (status, body) = server.check(check("slower-limited", "p")).await;
        assert_eq!((status, &body["degraded"]), (expected, &json!(true)), "{body}");
    }

    proxy.set_latency(Duration::ZERO);
    // Bytes already held keep their 500 ms; the next probe after them gets through.
    let back = until_not_degraded(&server, Duration::from_secs(5)).await;
    figure("latency_return", back);
    assert!(back < Duration::from_secs(2), "back on Redis within 2 s: {back:?}");
    // Redis kept what it counted before the fault (the denial may come from the deny cache,
    // so ask Redis whether the state is there), and is exact again.
    let ttl: i64 = redis.command(&["PTTL", "e2e:{slow-exact}:h"]);
    assert!(ttl > 0, "the count is still in Redis (PTTL {ttl})");
    let (status, body) = server.check(check("slow-exact", "p")).await;
    assert_eq!((status, &body["degraded"]), (429, &json!(false)), "{body}");
    assert_exact(&server, "slow-exact-after").await;
}

#[tokio::test]
async fn dropped_connections_under_load_answer_by_the_failure_policy_then_return() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    // 500 ms: no healthy call on a loaded machine takes as long, so before the faults every
    // answer is Redis's.
    let server = Tollgate::start(&config(&proxy.url(), "500ms"), &[]).await;
    until_not_degraded(&server, Duration::from_secs(5)).await;

    // Eight workers; every fourth check is on one limited key, the rest on a key of their own.
    let load = Load::start(&server, 8, |w, n| {
        if n.is_multiple_of(4) { ("drop-limited".to_owned(), "p") } else { (format!("drop-{w}"), "wide") }
    });
    let start = Instant::now();
    // The limited key is spent while Redis is healthy, before any fault.
    load.until(start, Duration::from_secs(10), |a| a.key == "drop-limited" && a.status == 429).await;

    // A blip: every connection to Redis closed at once; Tollgate reconnects at once.
    let accepted = proxy.connections_accepted();
    let blip = Instant::now();
    proxy.drop_all();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A gap: connections closed and new ones refused for 600 ms.
    let gap = Instant::now();
    proxy.refuse(true);
    proxy.drop_all();
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.refuse(false);
    let healed = Instant::now();
    let back = load.until(healed, Duration::from_secs(5), |a| a.status == 200 && !a.degraded).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = load.stop().await;
    assert!(proxy.connections_accepted() > accepted, "Tollgate reconnected through the proxy");

    let failed: Vec<&Answer> = answers.iter().filter(|a| ![200, 429].contains(&a.status)).collect();
    assert!(failed.is_empty(), "every request answered 200 or 429: {:?}", &failed[..failed.len().min(5)]);
    let in_gap: Vec<&Answer> = answers.iter().filter(|a| a.at >= gap && a.at < healed).collect();
    let degraded_in_gap = in_gap.iter().filter(|a| a.degraded).count();
    let degraded_in_blip = answers.iter().filter(|a| a.at >= blip && a.at < gap && a.degraded).count();
    let gap_times: Vec<Duration> = in_gap.iter().map(|a| a.took).collect();
    count("drop_answers", answers.len());
    count("drop_blip_degraded", degraded_in_blip);
    count("drop_gap_degraded", degraded_in_gap);
    figure("drop_gap_p50", percentile(&gap_times, 0.5));
    figure("drop_gap_p99", percentile(&gap_times, 0.99));
    figure("drop_return", back - healed);
    assert!(degraded_in_gap > 0, "the gap was felt: {} answers in it", in_gap.len());
    // One blip costs the calls it cut: each worker's call in flight when it hit, and its next
    // ones while they go to a connection whose close Tollgate has not seen yet (the backend's
    // two connections are seen closed one at a time), so at most eight workers x two; never a
    // probe interval of degraded answers (issue 18: 166 and 363 before the breaker counted
    // calls one fault failed together as one failure).
    assert!(degraded_in_blip <= 8 * 2, "one blip degraded {degraded_in_blip} answers");
    // Bounded by the 500 ms timeout (a call waiting on the reconnection), with a margin.
    assert!(percentile(&gap_times, 0.99) < Duration::from_millis(1500), "{gap_times:?}");
    assert!(back - healed < Duration::from_secs(2), "back on Redis within 2 s: {:?}", back - healed);
    // Redis was healthy until the blip (answers in flight then may have been cut off), and
    // admitted exactly the limit, all of it before.
    let before: Vec<&Answer> = answers.iter().filter(|a| a.at + a.took < blip && a.degraded).collect();
    assert!(before.is_empty(), "degraded before any fault: {:?}", &before[..before.len().min(5)]);
    let from_redis = answers.iter().filter(|a| a.key == "drop-limited" && a.status == 200 && !a.degraded);
    assert_eq!(from_redis.clone().count(), LIMIT);
    assert!(from_redis.clone().all(|a| a.at < blip));
    assert_exact(&server, "drop-exact-after").await;
}

#[tokio::test]
async fn redis_restarted_empty_restarts_counts_from_the_full_quota() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let server = Tollgate::start(&config(&redis.url(), "500ms"), &[]).await;
    until_not_degraded(&server, Duration::from_secs(5)).await;
    // One key spent (and denied: the deny cache holds that denial), one half spent.
    for _ in 0..LIMIT {
        assert_eq!(server.check(check("spent", "p")).await.0, 200);
    }
    assert_eq!(server.check(check("spent", "p")).await.0, 429);
    for _ in 0..LIMIT / 2 {
        assert_eq!(server.check(check("half", "p")).await.0, 200);
    }

    let load = Load::start(&server, 4, |w, _| (format!("restart-{w}"), "wide"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let restart = Instant::now();
    // Off the test's own thread, so the load goes on while Redis is down.
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    assert!(!redis.keys().contains(&"e2e:{spent}:h".to_owned()), "the new Redis starts empty");
    let back = until_not_degraded(&server, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answers = load.stop().await;
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(failed.is_empty(), "every request admitted: {:?}", &failed[..failed.len().min(5)]);
    count("restart_degraded", answers.iter().filter(|a| a.at >= restart && a.degraded).count());
    figure("restart_return", back);
    assert!(back < Duration::from_secs(2), "back on Redis within 2 s of the restart: {back:?}");

    // Both keys start again from the full quota, decided by Redis, exactly.
    for key in ["spent", "half"] {
        for remaining in (0..LIMIT).rev() {
            let (status, body) = server.check(check(key, "p")).await;
            assert_eq!((status, &body["degraded"]), (200, &json!(false)), "{key}: {body}");
            assert_eq!(body["remaining"], remaining, "{key}: {body}");
        }
        let (status, body) = server.check(check(key, "p")).await;
        assert_eq!((status, &body["degraded"]), (429, &json!(false)), "{key}: {body}");
    }
    assert_eq!(server.get_text("/healthz").await.0, 200);
    assert_eq!(server.get_text("/readyz").await.0, 200);
    assert!(!server.logs().contains("panicked"), "{}", server.logs());
}

/// Connections of the storm: each sends one check and reads the answer to the end.
const STORM: usize = 2000;

/// One HTTP/1.1 exchange on its own connection (`Connection: close`, so the answer ends with
/// the connection): the status and the JSON body.
async fn exchange(mut stream: tokio::net::TcpStream, body: &str) -> std::io::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12).and_then(|s| s.parse().ok());
    let body = text.split_once("\r\n\r\n").and_then(|(_, b)| serde_json::from_str(b).ok());
    match (status, body) {
        (Some(status), Some(body)) => Ok((status, body)),
        _ => Err(std::io::Error::other(format!("not an HTTP answer with a JSON body: {text:?}"))),
    }
}

/// The soft limit on open files of this process (and of the server it starts).
fn open_files_limit() -> usize {
    let out = std::process::Command::new("sh").args(["-c", "ulimit -n"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(usize::MAX) // "unlimited"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_connections_is_answered_and_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let limit = open_files_limit();
    assert!(
        limit >= STORM + 1000,
        "the storm opens {STORM} connections, each end in its own process: raise `ulimit -n` \
         (now {limit}) to {} or more (scripts/test and scripts/faults do)",
        STORM + 1000
    );
    let redis = RedisServer::start();
    // A timeout far above what a loaded machine takes: this test is about connections, and Redis
    // must stay healthy (a call that times out is answered by the local limiter, on its own
    // counts, and two seconds were seen on a loaded machine).
    let server = Tollgate::start(&config(&redis.url(), "20s"), &[]).await;
    until_not_degraded(&server, Duration::from_secs(5)).await;
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();

    // Every connection is open before any sends: then all send at once.
    let start = Instant::now();
    let barrier = Arc::new(tokio::sync::Barrier::new(STORM));
    // From ten client addresses (127.0.0.10 to .19, all this machine's), 200 connections
    // each: a storm of many clients, each within `max_connections_per_address`.
    let tasks: Vec<_> = (0..STORM)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let connect = async move {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(std::net::SocketAddr::from(([127, 0, 0, 10 + (i % 10) as u8], 0)))?;
                    socket.connect(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await
                };
                let connected = tokio::time::timeout(Duration::from_secs(20), connect).await;
                barrier.wait().await;
                let stream = match connected {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return Err(format!("connect: {e}")),
                    Err(_) => return Err("connect: timed out".to_owned()),
                };
                let sent = Instant::now();
                let body = r#"{"key": "storm", "policy": "p"}"#;
                match tokio::time::timeout(Duration::from_secs(30), exchange(stream, body)).await {
                    Ok(Ok((status, body))) => Ok((status, body["degraded"] == false, sent.elapsed(), sent)),
                    Ok(Err(e)) => Err(format!("exchange: {e}")),
                    Err(_) => Err("no answer within 30 s".to_owned()),
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let total = start.elapsed();
    let first_sent = answers.iter().filter_map(|a| a.as_ref().ok()).map(|a| a.3).min();

    let errors: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        errors.is_empty(),
        "{} of {STORM} connections failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    let answers: Vec<(u16, bool, Duration, Instant)> = answers.into_iter().map(Result::unwrap).collect();
    let times: Vec<Duration> = answers.iter().map(|a| a.2).collect();
    let admitted = answers.iter().filter(|a| a.0 == 200).count();
    let denied = answers.iter().filter(|a| a.0 == 429).count();
    count("storm_connections", STORM);
    count("storm_admitted", admitted);
    figure("storm_p50", percentile(&times, 0.5));
    figure("storm_p99", percentile(&times, 0.99));
    figure("storm_connect", first_sent.unwrap() - start);
    figure("storm_total", total);
    let degraded = answers.iter().filter(|a| !a.1).count();
    assert_eq!(degraded, 0, "every answer decided by Redis");
    assert_eq!((admitted, denied), (LIMIT, STORM - LIMIT), "only 200 and 429, exactly the limit admitted");

    // The server is still healthy and exact.
    assert_eq!(server.get_text("/healthz").await.0, 200);
    assert_exact(&server, "after-storm").await;
}
