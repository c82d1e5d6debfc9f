//! A stranger's flood beside a steady legitimate client (issue 18's measure of "bounded cost").
//!
//! The stranger sends, as fast as this machine lets it, the most expensive requests an
//! unauthenticated caller can make: many sliding-log rules at their largest, big concurrency
//! leases, a fresh key on every request, and oversized bodies. Beside it, a legitimate client
//! checks its own key at a steady pace under a policy it never exceeds. Whatever the stranger
//! does, the legitimate client's answers must stay what the rate limit alone makes them: admitted,
//! decided by the real backend (never `degraded`), and Redis must not be filled.
//!
//! Each test prints `FIGURE name: value` lines (the closing note of issue 18 quotes them).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Tollgate;
use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

/// How long the flood lasts; the legitimate client also runs this long alone first.
const PHASE: Duration = Duration::from_secs(4);
/// Concurrent stranger connections: more than the two cores can serve, so the flood is the
/// machine's limit, not the client's.
const STRANGERS: usize = 32;
/// The legitimate client's pace: one check every 10 ms.
const LEGIT_EVERY: Duration = Duration::from_millis(10);

fn config(backend: &str) -> String {
    format!(
        r#"
{backend}

[policies.legit]
rules = [{{ algorithm = "fixed_window", limit = 1000000000, period = "1h" }}]
"#
    )
}

/// The stranger's `n`th request: a path and a body, cycling through the expensive shapes.
fn stranger_request(worker: usize, n: usize) -> (&'static str, Vec<u8>) {
    let key = format!("stranger-{worker}-{n}");
    let body = match n % 4 {
        // Sixteen sliding logs at the largest limit, each asked for all of it, over a year.
        0 => {
            let rule = json!({"algorithm": "sliding_window_log", "limit": 10_000, "period": "365d"});
            let rules: Vec<Value> =
                (0..16).map(|i| json!({"name": format!("r{i}"), "algorithm": rule["algorithm"], "limit": rule["limit"], "period": format!("{}d", 350 + i)})).collect();
            return (
                "/v1/check",
                json!({"key": key, "limits": rules, "cost": 10_000}).to_string().into_bytes(),
            );
        }
        // The largest concurrency lease, held for an hour.
        1 => {
            return (
                "/v1/acquire",
                json!({"key": key, "limit": 10_000, "lease": "1h", "cost": 10_000}).to_string().into_bytes(),
            );
        }
        // A cheap check of a fresh key: many keys, each kept for a day.
        2 => json!({"key": key, "limits": [{"algorithm": "fixed_window", "limit": 5, "period": "1d"}]}),
        // A body far over the limit.
        _ => return ("/v1/check", vec![b' '; 1 << 20]),
    };
    ("/v1/check", body.to_string().into_bytes())
}

/// What the legitimate client saw.
#[derive(Default)]
struct Seen {
    took: Vec<Duration>,
    degraded: usize,
    refused: Vec<String>,
}

impl Seen {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.took.clone();
        sorted.sort();
        sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
    }
}

/// The legitimate client: a check of its own key every [`LEGIT_EVERY`] for `phase`, on a thread
/// and runtime of its own so that the stranger's client work in this process does not delay it.
async fn legitimate(server: &Tollgate, phase: Duration) -> Seen {
    let url = server.url("/v1/check");
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(legitimate_on(url, phase))
    })
    .await
    .unwrap()
}

async fn legitimate_on(url: String, phase: Duration) -> Seen {
    let mut seen = Seen::default();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let end = Instant::now() + phase;
    let mut tick = tokio::time::interval(LEGIT_EVERY);
    while Instant::now() < end {
        tick.tick().await;
        let start = Instant::now();
        let r = client.post(&url).json(&json!({"key": "legit", "policy": "legit"})).send().await;
        seen.took.push(start.elapsed());
        match r {
            Ok(r) if r.status() == 200 => {
                let body: Value = r.json().await.unwrap();
                if body["degraded"] == true {
                    seen.degraded += 1;
                }
            }
            Ok(r) => seen.refused.push(format!("{} {}", r.status(), r.text().await.unwrap_or_default())),
            Err(e) => seen.refused.push(e.to_string()),
        }
    }
    seen
}

/// Starts the stranger's workers; they run until `stop` is set. Each request counts into `sent`.
fn flood(
    server: &Tollgate,
    stop: &Arc<AtomicBool>,
    sent: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..STRANGERS)
        .map(|w| {
            let (base, stop, sent) = (server.base.clone(), Arc::clone(stop), Arc::clone(sent));
            tokio::spawn(async move {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (path, body) = stranger_request(w, n);
                    n += 1;
                    let r = client
                        .post(format!("{base}{path}"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                    if let Ok(r) = r {
                        let _ = r.bytes().await;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the legitimate client alone, then beside the flood; returns both.
async fn measure(server: &Tollgate, label: &str) -> (Seen, Seen) {
    let alone = legitimate(server, PHASE).await;
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let workers = flood(server, &stop, &sent);
    let flooded = legitimate(server, PHASE).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let sent = sent.load(Ordering::Relaxed);
    println!("FIGURE {label} stranger requests: {sent} ({:.0}/s)", sent as f64 / PHASE.as_secs_f64());
    println!(
        "FIGURE {label} legitimate p50/p99 alone: {:.2} / {:.2} ms",
        ms(alone.percentile(0.5)),
        ms(alone.percentile(0.99))
    );
    println!(
        "FIGURE {label} legitimate p50/p99 flooded: {:.2} / {:.2} ms ({} checks)",
        ms(flooded.percentile(0.5)),
        ms(flooded.percentile(0.99)),
        flooded.took.len()
    );
    println!(
        "FIGURE {label} legitimate degraded share flooded: {:.2}% ({} of {})",
        100.0 * flooded.degraded as f64 / flooded.took.len() as f64,
        flooded.degraded,
        flooded.took.len()
    );
    (alone, flooded)
}

/// What must hold of the legitimate client, whatever the stranger sent.
fn assert_unharmed(alone: &Seen, flooded: &Seen) {
    for seen in [alone, flooded] {
        assert!(
            seen.refused.is_empty(),
            "the legitimate client was refused: {:?}",
            &seen.refused[..seen.refused.len().min(5)]
        );
        assert_eq!(seen.degraded, 0, "the legitimate client got degraded answers");
        assert!(seen.took.len() >= 20, "too few checks to judge: {}", seen.took.len());
    }
    // Both cores are shared with the stranger, so latency rises; a decision that waited out a
    // backend timeout or a breaker would take far longer than this.
    let p99 = flooded.percentile(0.99);
    assert!(p99 < Duration::from_secs(1), "legitimate p99 under the flood: {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_flood_does_not_harm_a_legitimate_client_on_redis() {
    let redis = RedisServer::start();
    // A generous Redis timeout: on two shared cores a call can wait on the scheduler for a
    // while; an answer degraded past a whole second means Redis itself was stalled.
    let backend = format!(
        "[backend]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"flood\"\ntimeout = \"1s\"\non_failure = \"local\"",
        redis.url()
    );
    let server = Tollgate::start(&config(&backend), &[]).await;
    // Redis may still be busy with the flood's last calls, so ask until it answers.
    let used = |r: &RedisServer| -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(info) = r.try_text(&["INFO", "memory"]) {
                return info
                    .lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
            }
            assert!(Instant::now() < deadline, "Redis did not answer INFO");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let before = used(&redis);
    let (alone, flooded) = measure(&server, "redis").await;
    let after = used(&redis);
    println!(
        "FIGURE redis used_memory: {:.1} MiB -> {:.1} MiB",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert_unharmed(&alone, &flooded);
    // Tens of thousands of fresh keys may stay (each a few hundred bytes, each with its TTL);
    // one request must not add megabytes.
    assert!(after - before < 16 << 20, "Redis grew by {} MiB", (after - before) >> 20);
    println!(
        "FIGURE redis degraded decisions, all callers: {}",
        server.metric("tollgate_degraded_decisions_total").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_flood_does_not_harm_a_legitimate_client_in_memory() {
    let server = Tollgate::start(&config("[backend]\nkind = \"memory\""), &[]).await;
    let (alone, flooded) = measure(&server, "memory").await;
    assert_unharmed(&alone, &flooded);
}
