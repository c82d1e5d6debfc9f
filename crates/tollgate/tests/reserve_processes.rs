//! Quota reservations across real processes (issue 21): four `tollgate serve` on one private
//! Redis, policies with `reserve = "auto"`, many concurrent HTTP clients asking well above the
//! limit. The limit holds, the units held idle bound what goes unadmitted, blocks were taken,
//! and a graceful shutdown gives the unused units back, so that Redis counts what was admitted.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Tollgate;
use serde_json::json;
use tollgate_testkit::RedisServer;

const PROCESSES: usize = 4;
const CLIENTS: usize = 16;
/// The fixed window's limit: one minute, opened by the first request (`align = "first_hit"`),
/// so the whole test falls in one window without waiting for a clock edge.
const LIMIT: u64 = 2_000;
/// The token bucket: this many units, refilled at REFILL a minute.
const CAPACITY: u64 = 1_000;
const REFILL: u64 = 60;

fn config(redis: &RedisServer) -> String {
    format!(
        r#"
[backend]
kind = "redis"
url = "{}"
prefix = "e2e"
timeout = "5s"
on_failure = "closed"

[policies.window]
rules = [{{ name = "minute", algorithm = "fixed_window", limit = {LIMIT}, period = "1m", align = "first_hit" }}]
reserve = "auto"

[policies.bucket]
rules = [{{ name = "bucket", algorithm = "token_bucket", capacity = {CAPACITY}, refill = {REFILL}, per = "1m" }}]
reserve = "auto"
"#,
        redis.url()
    )
}

/// Sends `requests` checks of `key` under `policy` from CLIENTS concurrent clients, each
/// turning over the servers; returns the admitted count. Anything but 200 or 429 fails.
async fn drive(servers: &[Tollgate], policy: &str, key: &str, requests: u64) -> u64 {
    let bases: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.url("/v1/check")).collect());
    let tickets = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (bases, tickets, admitted) = (bases.clone(), tickets.clone(), admitted.clone());
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        let body = json!({"key": key, "policy": policy});
        tasks.push(tokio::spawn(async move {
            let mut turn = client;
            while tickets.fetch_add(1, Ordering::Relaxed) < requests {
                turn += 1;
                let r = http.post(&bases[turn % bases.len()]).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let answer: serde_json::Value = r.json().await.unwrap();
                match status {
                    200 => {
                        assert_eq!(answer["allowed"], true, "{answer}");
                        assert_eq!(answer["degraded"], false, "{answer}");
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    429 => assert_eq!(answer["allowed"], false, "{answer}"),
                    _ => panic!("{status}: {answer}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

async fn sum(servers: &[Tollgate], series: &str) -> f64 {
    let mut total = 0.0;
    for server in servers {
        total += server.metric(series).await;
    }
    total
}

/// The fixed window's count in Redis: the field `<rule id>.c` of the key's hash
/// `e2e:{<key>}:h` (docs/architecture.md, "State identity"; fixed_window.lua).
fn redis_count(redis: &RedisServer, key: &str) -> u64 {
    let fields: Vec<(String, String)> = redis.command(&["HGETALL", &format!("e2e:{{{key}}}:h")]);
    let counts: Vec<u64> =
        fields.iter().filter(|(f, _)| f.ends_with(".c")).map(|(_, v)| v.parse().unwrap()).collect();
    assert_eq!(counts.len(), 1, "one fixed window's count in {fields:?}");
    counts[0]
}

#[tokio::test]
async fn processes_on_one_redis_never_admit_over_the_limit() {
    let redis = RedisServer::start();
    let config = config(&redis);
    let starting: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move { Tollgate::start(&config, &[]).await })
        })
        .collect();
    let mut servers = Vec::new();
    for server in starting {
        servers.push(server.await.unwrap());
    }

    // A token bucket, full at its first check: from then, at most its capacity plus what it
    // refilled.
    let start = Instant::now();
    let bucket_admitted = drive(&servers, "bucket", "hot-bucket", 2 * CAPACITY).await;
    let elapsed = start.elapsed();
    let refilled = (u128::from(REFILL) * elapsed.as_millis()).div_ceil(60_000) as u64;
    println!("bucket: {bucket_admitted} admitted of {} asked in {elapsed:?}", 2 * CAPACITY);
    assert!(
        bucket_admitted <= CAPACITY + refilled,
        "bucket: {bucket_admitted} admitted, capacity {CAPACITY} + {refilled} refilled"
    );
    // Each instance holds at most capacity / (4 x instances seen) idle.
    assert!(bucket_admitted >= CAPACITY / 2, "bucket: only {bucket_admitted} admitted");
    let bucket_blocks =
        sum(&servers, "tollgate_reserve_blocks_total{policy=\"bucket\",result=\"taken\"}").await;
    assert!(bucket_blocks > 0.0, "no bucket block was taken");

    // The fixed window, once the bucket's blocks have run their validity (1 s), so that the
    // held units the servers report are the window's alone.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let asked = 3 * LIMIT / 2;
    let admitted = drive(&servers, "window", "hot-window", asked).await;
    let mut held = 0.0;
    for server in &servers {
        held += server.metric("tollgate_reserve_held_units").await;
    }
    let held = held as u64;
    let reserved = sum(&servers, "tollgate_reserved_decisions_total{policy=\"window\"}").await;
    let blocks = sum(&servers, "tollgate_reserve_blocks_total{policy=\"window\",result=\"taken\"}").await;
    let counted = redis_count(&redis, "hot-window");
    println!(
        "window: {admitted} admitted of {asked} asked, {held} held idle, {reserved} answered from \
         {blocks} blocks, {counted} counted in Redis"
    );
    assert!(admitted <= LIMIT, "{admitted} admitted, limit {LIMIT}");
    assert!(admitted + held >= LIMIT, "{admitted} admitted + {held} held idle < limit {LIMIT}");
    assert!(held <= LIMIT / 4, "{held} held idle: more than a quarter of the limit");
    assert_eq!(counted, admitted + held, "Redis counts what was admitted and what is held");
    assert!(reserved > 0.0 && blocks > 0.0, "no decision answered from a block");
    let instances: u64 = redis.command(&["ZCARD", "e2e:{hot-window}:instances"]);
    assert_eq!(instances, PROCESSES as u64, "each process heartbeats the key");

    // A key asked for less than its limit: its last blocks are partly used when the traffic
    // stops, and those units are what a shutdown must give back. (A sweep may give back the
    // first key's idle units meanwhile: the sums below hold either way.)
    let warm_admitted = drive(&servers, "window", "warm-window", LIMIT / 2).await;
    assert_eq!(warm_admitted, LIMIT / 2, "under the limit, every request is admitted");
    let held = sum(&servers, "tollgate_reserve_held_units").await as u64;
    let counted = redis_count(&redis, "hot-window") + redis_count(&redis, "warm-window");
    println!("warm window: {warm_admitted} admitted, {held} held idle in all, {counted} counted in Redis");
    assert!(held > 0, "no unit held to give back");
    assert_eq!(counted, admitted + warm_admitted + held);

    // A graceful shutdown gives the held units back (the window has most of its minute left).
    for server in &mut servers {
        assert!(server.terminate().success(), "{}", server.logs());
    }
    assert_eq!(redis_count(&redis, "hot-window"), admitted, "Redis counts only what was admitted");
    assert_eq!(redis_count(&redis, "warm-window"), warm_admitted, "Redis counts only what was admitted");
}
