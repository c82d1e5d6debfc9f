//! Quota reservations on a real Redis: several limiters, each with its own backend and
//! connections (as separate processes would be), race on one key of a private redis-server.
//! Never over the limit, the units held idle bound what is not admitted, most admissions never
//! reach Redis, and the key's heartbeat set counts the instances.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Backend, ManualClock, Period, Rule, RuleSet};
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
