//! Quota reservations on a real Redis: several limiters, each with its own backend and
//! connections (as separate processes would be), race on one key of a private redis-server.
//! Never over the limit, the units held idle bound what is not admitted, most admissions never
//! reach Redis, and the key's heartbeat set counts the instances.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Backend, ManualClock, Period, Rule, RuleSet};
use tollgate_limiter::reserve::HOT_HITS;
use tollgate_limiter::{Limiter, LimiterSettings, Policy, Reserve};
use tollgate_redis::RedisBackend;
use tollgate_testkit::RedisServer;

const INSTANCES: usize = 4;
const TASKS: usize = 8;

fn backend(server: &RedisServer) -> Arc<RedisBackend> {
    Arc::new(RedisBackend::builder(server.url()).timeout(Duration::from_secs(10)).build().unwrap())
}

fn engine_calls(server: &RedisServer) -> u64 {
    ["tollgate.decide", "fcall", "evalsha", "eval"].iter().map(|c| server.calls(c)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_racing_on_one_key_never_admit_over_the_limit() {
    let server = RedisServer::start();
    let limit = 5_000;
    // One window for the whole test, wherever the clock is: it starts at the first hit.
    let rules = RuleSet::new([Rule::fixed_window_from_first_hit(limit, Period::HOUR)]).unwrap();
    let policy = Arc::new(Policy::enforce("global", rules.clone()).with_reserve(Reserve::Auto).unwrap());
    let limiters: Vec<Limiter> =
        (0..INSTANCES).map(|_| Limiter::new(backend(&server), "redis", LimiterSettings::default())).collect();
    let before = engine_calls(&server);
    let per_task = 3 * limit as usize / (INSTANCES * TASKS);
    let mut handles = Vec::new();
    for limiter in &limiters {
        for _ in 0..TASKS {
            let (limiter, policy) = (limiter.clone(), policy.clone());
            handles.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..per_task {
                    let verdict = limiter.check("global", &policy, 1).await.unwrap();
                    assert!(!verdict.degraded);
                    admitted += u64::from(verdict.allowed());
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for handle in handles {
        admitted += handle.await.unwrap();
    }
    let held: u64 = limiters.iter().map(|l| l.reserve_stats().held).sum();
    let served: u64 = limiters.iter().map(|l| l.reserve_stats().decisions).sum();
    assert!(admitted <= limit, "{admitted} admitted, limit {limit}");
    assert!(admitted + held >= limit, "{admitted} admitted, {held} held idle, limit {limit}");
    assert!(served * 10 > admitted * 8, "{served} of {admitted} admissions from blocks");
    // Every admission and every denial: the denials are answered by the deny cache.
    let decisions = (per_task * INSTANCES * TASKS) as u64;
    let calls = engine_calls(&server) - before;
    assert!(calls * 10 < decisions, "{calls} engine calls for {decisions} decisions");

    // Each limiter sent heartbeats under its own id: the key's set counts them all.
    let instances: u64 = server.command(&["ZCARD", "tollgate:{global}:instances"]);
    assert_eq!(instances, INSTANCES as u64);
    let ttl: i64 = server.command(&["PTTL", "tollgate:{global}:instances"]);
    assert!(ttl > 0, "the heartbeat set expires");

    // What the limiters still hold goes back (the window has most of its hour left).
    let mut returned = 0;
    for limiter in &limiters {
        returned += limiter.shutdown().await;
    }
    assert_eq!(returned, held);
    let peek = backend(&server).check("global", &rules, 0).await.unwrap();
    assert_eq!(peek.remaining(), limit - admitted, "Redis counts exactly what was admitted");
}

#[tokio::test]
async fn the_heartbeat_counts_instances_within_its_window() {
    let server = RedisServer::start();
    let clock = ManualClock::at_wall_clock_second();
    let backend = RedisBackend::builder(server.url()).clock(clock.clone()).build().unwrap();
    let window = Duration::from_secs(10);
    assert_eq!(backend.heartbeat("k", "a", window).await.unwrap(), 1);
    assert_eq!(backend.heartbeat("k", "b", window).await.unwrap(), 2);
    assert_eq!(backend.heartbeat("k", "a", window).await.unwrap(), 2, "an instance counts once");
    assert_eq!(backend.heartbeat("other", "a", window).await.unwrap(), 1, "per key");
    clock.advance(Duration::from_secs(6));
    assert_eq!(backend.heartbeat("k", "b", window).await.unwrap(), 2);
    // `a` was last seen 11 s ago, `b` 5 s ago.
    clock.advance(Duration::from_secs(5));
    assert_eq!(backend.heartbeat("k", "c", window).await.unwrap(), 2);
}

/// `scripts/bench-reserve`: Redis calls per decision and decisions per second on one hot key
/// (a global limit of 1 000 000 a minute or `BENCH_LIMIT`, 4 limiters of 16 tasks each), then over 100 000 cold
/// keys, with reservations off and on. Prints the figures; asserts nothing but that the limit
/// held.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: run by scripts/bench-reserve"]
async fn bench_reserve() {
    let decisions: usize =
        std::env::var("BENCH_DECISIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(400_000);
    let cold_keys: usize =
        std::env::var("BENCH_COLD_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let limit: u64 = std::env::var("BENCH_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    for reserve in [Reserve::Off, Reserve::Auto] {
        for (label, keys) in [("hot key", 1), ("cold keys", cold_keys)] {
            let server = RedisServer::start();
            let rules = RuleSet::new([Rule::fixed_window(limit, Period::MINUTE)]).unwrap();
            let policy = Arc::new(Policy::enforce("global", rules).with_reserve(reserve).unwrap());
            let limiters: Vec<Limiter> = (0..INSTANCES)
                .map(|_| Limiter::new(backend(&server), "redis", LimiterSettings::default()))
                .collect();
            let total = if keys == 1 { decisions } else { keys };
            let tasks = INSTANCES * 16;
            let start = std::time::Instant::now();
            let mut handles = Vec::new();
            for task in 0..tasks {
                let (limiter, policy) = (limiters[task % INSTANCES].clone(), policy.clone());
                handles.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for i in (task..total).step_by(tasks) {
                        let key = if keys == 1 { "global".to_owned() } else { format!("user:{i}") };
                        admitted += u64::from(limiter.check(&key, &policy, 1).await.unwrap().allowed());
                    }
                    admitted
                }));
            }
            let mut admitted = 0;
            for handle in handles {
                admitted += handle.await.unwrap();
            }
            let elapsed = start.elapsed().as_secs_f64();
            let calls = engine_calls(&server) + server.calls("zadd");
            let blocks: u64 = limiters.iter().map(|l| l.reserve_stats().blocks).sum();
            println!(
                "reserve={reserve:?} {label}: {total} decisions in {elapsed:.2}s = {:.0}/s; {calls} Redis calls \
                 ({:.4} per decision; {blocks} blocks); {admitted} admitted",
                total as f64 / elapsed,
                calls as f64 / total as f64,
            );
            if keys == 1 {
                assert!(admitted <= limit);
            }
        }
    }
}

/// The rules `bench_reserve_heat` measures, as `tollgate simulate --rules` writes them
/// (`scripts/bench-reserve-heat` simulates the same): a key under its limit at every rate.
fn heat_rules() -> [(&'static str, RuleSet); 2] {
    [
        ("fixed_window 1000000/1m", RuleSet::new([Rule::fixed_window(1_000_000, Period::MINUTE)]).unwrap()),
        (
            "gcra 100000/1s burst=100000",
            RuleSet::new([Rule::gcra(100_000, Period::SECOND, 100_000)]).unwrap(),
        ),
    ]
}

/// Waits, if the clock's current minute has less than `seconds` (and a margin) left, until the
/// next one starts: a run on a clock-aligned minute window then stays in one window, as in
/// `tollgate simulate`, whose traffic starts at a window's start.
async fn within_one_minute(seconds: f64) {
    if seconds + 2.0 >= 60.0 {
        return;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let left = 60.0 - now % 60.0;
    if left < seconds + 1.0 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }
}

/// `scripts/bench-reserve-heat`: Redis calls per decision against a key's heat. One key, 4
/// limiters (each with its own backend and connections), requests paced at fixed rates
/// (`BENCH_RATES`, over the 4 instances, dealt to them in turn; default 4 to 20 000 a second),
/// each rate for `BENCH_SECONDS` (default 10) of real time, with reserve = "off" and "auto",
/// under a fixed window of 1 000 000 a minute and a GCRA of 100 000 a second. Redis calls are
/// counted as in `bench_reserve` (the engine's script calls plus the heartbeats' `ZADD`, from
/// `INFO commandstats`, reset before each run; a fresh key and fresh limiters per run, warmed by
/// a check of another key first). Prints a table and, with `BENCH_CSV`, writes the figures there
/// for the chart. Asserts that every request was admitted (the key is under its limit) and that a
/// key hot on every instance takes blocks.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: run by scripts/bench-reserve-heat"]
async fn bench_reserve_heat() {
    let rates: Vec<u64> = std::env::var("BENCH_RATES")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|r| r.trim().parse().expect("BENCH_RATES: rates a second, comma-separated"))
                .collect()
        })
        .unwrap_or_else(|| vec![4, 16, 32, 64, 200, 1_000, 5_000, 20_000]);
    let seconds: f64 = std::env::var("BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10.0);
    let server = RedisServer::start();
    let mut csv = String::from(
        "rule,reserve,rate,seconds,decisions,calls,calls_per_decision,blocks,from_blocks,admitted,elapsed_s\n",
    );
    println!(
        "| rule | reserve | requests/s | decisions | Redis calls | calls per decision | blocks taken | from blocks | admitted |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (rule, (label, rules)) in heat_rules().into_iter().enumerate() {
        for reserve in [Reserve::Off, Reserve::Auto] {
            let policy = Arc::new(Policy::enforce("heat", rules.clone()).with_reserve(reserve).unwrap());
            for &rate in &rates {
                let key: Arc<str> = format!("heat:{rule}:{reserve:?}:{rate}").into();
                let limiters: Vec<Limiter> = (0..INSTANCES)
                    .map(|_| Limiter::new(backend(&server), "redis", LimiterSettings::default()))
                    .collect();
                for limiter in &limiters {
                    assert!(limiter.check("warm-up", &policy, 1).await.unwrap().allowed());
                }
                within_one_minute(seconds).await;
                let _: String = server.command(&["CONFIG", "RESETSTAT"]);
                let total = (rate as f64 * seconds).round() as u64;
                let start = tokio::time::Instant::now();
                let mut handles = Vec::with_capacity(total as usize);
                for n in 0..total {
                    let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
                    if due > tokio::time::Instant::now() {
                        tokio::time::sleep_until(due).await;
                    }
                    let (limiter, policy, key) =
                        (limiters[n as usize % INSTANCES].clone(), policy.clone(), key.clone());
                    handles.push(tokio::spawn(async move {
                        let verdict = limiter.check(&key, &policy, 1).await.unwrap();
                        assert!(!verdict.degraded, "answered without Redis");
                        verdict.allowed()
                    }));
                }
                let mut admitted = 0u64;
                for handle in handles {
                    admitted += u64::from(handle.await.unwrap());
                }
                let elapsed = start.elapsed().as_secs_f64();
                // Before the shutdown's refunds: the calls the traffic itself cost.
                let calls = engine_calls(&server) + server.calls("zadd");
                let blocks: u64 = limiters.iter().map(|l| l.reserve_stats().blocks).sum();
                let from_blocks: u64 = limiters.iter().map(|l| l.reserve_stats().decisions).sum();
                for limiter in &limiters {
                    limiter.shutdown().await;
                }
                let per = calls as f64 / total as f64;
                println!(
                    "| {label} | {reserve:?} | {rate} | {total} | {calls} | {per:.4} | {blocks} | {from_blocks} | {admitted} |"
                );
                csv.push_str(&format!(
                    "{label},{reserve:?},{rate},{seconds},{total},{calls},{per},{blocks},{from_blocks},{admitted},{elapsed:.3}\n"
                ));
                assert_eq!(admitted, total, "{label}, {reserve:?}, {rate}/s: the key is under its limit");
                if reserve == Reserve::Auto && rate >= 2 * u64::from(HOT_HITS) * INSTANCES as u64 {
                    assert!(
                        blocks > 0,
                        "{label}, {rate}/s: {} a second on each instance took no block",
                        rate / 4
                    );
                }
            }
        }
    }
    if let Ok(path) = std::env::var("BENCH_CSV") {
        std::fs::write(&path, csv).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}
