//! Issue 18: what one operation stores in Redis. Sliding logs keep one member per distinct time
//! and concurrency one per lease, never one per unit, so a check of cost 10,000 writes O(1)
//! members; logs and lease sets larger than the walks' batches decide exactly as the memory
//! backend does; and state stored in the old, per-unit format is never read. On both engines
//! (`name::on_lua`, `name::on_module`): they keep the same state.

mod engines;

use std::time::Duration;

use tollgate_core::{
    Backend, Clock, Decision, Error, Lease, LeaseId, ManualClock, MemoryBackend, Operation, Period, Rule,
    RuleSet,
};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::RedisServer;

use engines::{on_both_engines, server};

fn used_memory(server: &RedisServer) -> i64 {
    let info: String = server.command(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory")
}

fn memory_usage(server: &RedisServer, key: &str) -> i64 {
    server.command(&["MEMORY", "USAGE", key])
}

fn zcard(server: &RedisServer, key: &str) -> i64 {
    server.command(&["ZCARD", key])
}

fn backend(server: &RedisServer, engine: Engine, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(server.url())
        .engine(engine)
        .clock(clock.clone())
        .deny_cache(false)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

on_both_engines!(a_log_check_of_cost_10000_writes_one_entry);
async fn a_log_check_of_cost_10000_writes_one_entry(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let year = Period::from_secs(365 * 86_400).unwrap();
    // The attack of issue 18: 16 logs of limit 10,000 over periods near a year, cost 10,000.
    let rules = RuleSet::new(
        (0..16).map(|i| Rule::sliding_window_log(10_000, Period::from_secs(365 * 86_400 - i).unwrap())),
    )
    .unwrap();
    // Warm up first (the script loaded, the connection's buffers), so that only state is measured.
    redis.check("warm-up", &rules, 1).await.unwrap();
    let before = used_memory(&server);
    let started = std::time::Instant::now();
    let decision = redis.check("attacker", &rules, 10_000).await.unwrap();
    let took = started.elapsed();
    assert!(decision.allowed());
    let grown = used_memory(&server) - before;
    let keys = redis.state_keys("attacker", &rules);
    let mut stored = 0;
    for key in &keys {
        // the base and one entry: not 10,000 members
        assert_eq!(zcard(&server, key), 2, "{key}");
        let ttl: i64 = server.command(&["PTTL", key]);
        assert!(ttl > 0, "{key} has a TTL");
        stored += memory_usage(&server, key);
    }
    // 16 small sorted sets (listpack encoded), about a hundred bytes each, where the per-unit
    // logs took about 1.3 MB each (21 MB in all). used_memory also moves with the server's own
    // buffers (tens of KB), so its bound is loose; still 200 times below the per-unit 21 MB.
    assert!(stored < 16 * 200, "the 16 logs take {stored} bytes");
    assert!(grown < 100 * 1024, "used_memory grew by {grown} bytes");
    eprintln!("16 logs x cost 10,000: {stored} B in keys, used_memory +{grown} B, {took:?}");

    // Another second, another full-cost check: denied, nothing written.
    clock.advance(Duration::from_secs(1));
    assert!(!redis.check("attacker", &rules, 1).await.unwrap().allowed());
    let single = RuleSet::new([Rule::sliding_window_log(10_000, year)]).unwrap();
    for _ in 0..100 {
        clock.advance(Duration::from_micros(1));
        redis.check("one", &single, 100).await.unwrap();
    }
    // 100 checks at 100 distinct times: 100 entries and the base.
    assert_eq!(zcard(&server, &redis.state_keys("one", &single)[0]), 101);
}

on_both_engines!(an_acquire_of_10000_units_writes_one_lease);
async fn an_acquire_of_10000_units_writes_one_lease(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let rules = RuleSet::new([Rule::concurrency(10_000, Period::from_secs(3600).unwrap())]).unwrap();
    redis.acquire("warm-up", &rules, 1).await.unwrap();
    let before = used_memory(&server);
    let acquired = redis.acquire("holder", &rules, 10_000).await.unwrap();
    let grown = used_memory(&server) - before;
    let key = &redis.state_keys("holder", &rules)[0];
    // the lease's id, its units, and the total
    assert_eq!(zcard(&server, key), 3);
    let stored = memory_usage(&server, key);
    assert!(stored < 300, "the lease set takes {stored} bytes");
    assert!(grown < 100 * 1024, "used_memory grew by {grown} bytes");
    eprintln!("acquire of 10,000 units: {stored} B in the key, used_memory +{grown} B");
    let lease = acquired.lease.expect("admitted");
    redis.release("holder", &rules, &Lease { id: lease.id, units: 4_000 }).await.unwrap();
    assert_eq!(redis.acquire("holder", &rules, 4_000).await.unwrap().decision.remaining(), 0);
    assert_eq!(zcard(&server, key), 5, "two leases and the total");
}

/// Runs `op` on both backends and insists on the same answer.
async fn both(
    memory: &MemoryBackend<ManualClock>,
    redis: &RedisBackend,
    key: &str,
    rules: &RuleSet,
    op: Operation<'_>,
) -> Decision {
    let m: Result<Decision, Error> = memory.execute(key, rules, op).await;
    let r = redis.execute(key, rules, op).await;
    let (m, r) = (m.unwrap(), r.unwrap());
    assert_eq!(m, r, "{op:?}");
    m
}

on_both_engines!(long_logs_expire_refund_and_deny_as_in_memory);
async fn long_logs_expire_refund_and_deny_as_in_memory(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let memory = MemoryBackend::with_clock(clock.clone());
    let rules = RuleSet::new([Rule::sliding_window_log(1_000, Period::SECOND)]).unwrap();
    let check = |cost| Operation::Check { cost };
    // 300 entries of 1 to 5 units, 1 ms apart: more than every expiry batch (16, 32, 64, ...)
    for i in 0..300u64 {
        both(&memory, &redis, "log", &rules, check(1 + i % 5)).await;
        clock.advance(Duration::from_millis(1));
    }
    // denials deep in the log: the wait is the time of the entry that frees the excess
    for cost in [500, 999, 1000] {
        let d = both(&memory, &redis, "log", &rules, check(cost)).await;
        assert!(!d.allowed());
    }
    // refunds across many entries, newest first
    both(&memory, &redis, "log", &rules, Operation::Refund { amount: 37 }).await;
    both(&memory, &redis, "log", &rules, Operation::Refund { amount: 1 }).await;
    // expire 250 entries at once, then the rest one by one
    clock.advance(Duration::from_millis(950));
    both(&memory, &redis, "log", &rules, check(0)).await;
    for _ in 0..60 {
        clock.advance(Duration::from_millis(1));
        both(&memory, &redis, "log", &rules, check(2)).await;
    }
    clock.advance(Duration::from_secs(2));
    let d = both(&memory, &redis, "log", &rules, check(0)).await;
    assert_eq!(d.remaining(), 1_000);
    // refunding everything empties the log: the key goes
    both(&memory, &redis, "log", &rules, check(10)).await;
    both(&memory, &redis, "log", &rules, Operation::Refund { amount: 10 }).await;
    assert!(server.keys().is_empty(), "{:?}", server.keys());
}

on_both_engines!(many_leases_release_and_deny_as_in_memory);
async fn many_leases_release_and_deny_as_in_memory(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let memory = MemoryBackend::with_clock(clock.clone());
    let rules = RuleSet::new([Rule::concurrency(500, Period::SECOND)]).unwrap();
    let mut leases = Vec::new();
    // 100 leases of 1 to 4 units, 2 ms apart, several in one microsecond
    for i in 0..100u64 {
        let id = LeaseId::random();
        let cost = 1 + i % 4;
        let d = both(&memory, &redis, "cc", &rules, Operation::Acquire { cost, lease: &id }).await;
        assert!(d.allowed());
        leases.push(Lease { id, units: cost });
        if i % 3 == 0 {
            clock.advance(Duration::from_millis(2));
        }
    }
    // partial and whole releases from the middle
    for lease in leases.iter().skip(10).step_by(7) {
        let part = Lease { id: lease.id.clone(), units: 1 };
        both(&memory, &redis, "cc", &rules, Operation::Release { lease: &part }).await;
        both(&memory, &redis, "cc", &rules, Operation::Release { lease }).await;
    }
    // a denial whose walk crosses several batches
    for cost in [300, 450, 500] {
        let id = LeaseId::random();
        let d = both(&memory, &redis, "cc", &rules, Operation::Acquire { cost, lease: &id }).await;
        assert!(!d.allowed());
    }
    // leases expire in slices
    for _ in 0..20 {
        clock.advance(Duration::from_millis(20));
        both(&memory, &redis, "cc", &rules, Operation::Acquire { cost: 0, lease: &LeaseId::random() }).await;
    }
    clock.advance(Duration::from_secs(1));
    let d =
        both(&memory, &redis, "cc", &rules, Operation::Acquire { cost: 0, lease: &LeaseId::random() }).await;
    assert_eq!(d.remaining(), 500);
    assert!(server.keys().is_empty(), "{:?}", server.keys());
}

on_both_engines!(old_per_unit_state_is_never_read);
/// Logs and leases stored by a Tollgate before issue 18 (one member per unit) under the
/// version-1 names are never read: the new state has its own key, and the old key is left to
/// its TTL.
async fn old_per_unit_state_is_never_read(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let log = RuleSet::new([Rule::sliding_window_log(5, Period::MINUTE)]).unwrap();
    let lease = RuleSet::new([Rule::concurrency(5, Period::MINUTE)]).unwrap();
    let now = (clock.now().as_micros()).to_string();
    // A full log and a full lease set, as the per-unit format wrote them.
    let old_log = "tollgate:{k}:swl:5:60000000";
    let old_cc = "tollgate:{k}:cc:5:60000000";
    for i in 1..=5 {
        let _: i64 = server.command(&["ZADD", old_log, &now, &format!("{now}:{i:05}")]);
        let _: i64 = server.command(&["ZADD", old_cc, "9999999999999999", &format!("abc:{i}")]);
    }
    let _: i64 = server.command(&["PEXPIRE", old_log, "61000"]);
    let _: i64 = server.command(&["PEXPIRE", old_cc, "61000"]);
    assert_eq!(redis.state_keys("k", &log), ["tollgate:{k}:swl2:5:60000000"]);
    assert_eq!(redis.state_keys("k", &lease), ["tollgate:{k}:cc2:5:60000000"]);
    // Fresh state: the old members are neither counted nor misparsed.
    let d = redis.check("k", &log, 5).await.unwrap();
    assert!(d.allowed(), "{d:?}");
    let a = redis.acquire("k", &lease, 5).await.unwrap();
    assert!(a.decision.allowed());
    // The old keys are untouched, and expire by their TTL.
    assert_eq!(zcard(&server, old_log), 5);
    assert_eq!(zcard(&server, old_cc), 5);
    let ttl: i64 = server.command(&["PTTL", old_log]);
    assert!(ttl > 0 && ttl <= 61_000);
}

on_both_engines!(running_totals_are_rebased_before_they_lose_precision);
/// A log whose running totals have grown past 2^50 (years of traffic without ever emptying) is
/// rebased to 0 on its next call, and counts on exactly.
async fn running_totals_are_rebased_before_they_lose_precision(engine: Engine) {
    let server = server(engine);
    let clock = ManualClock::at_wall_clock_second();
    let redis = backend(&server, engine, &clock);
    let rules = RuleSet::new([Rule::sliding_window_log(1_000, Period::SECOND)]).unwrap();
    let key = &redis.state_keys("old", &rules)[0];
    let now = clock.now().as_micros();
    let base = 1u64 << 50;
    // base + 10, then 2 units at now - 2 ms and 3 at now - 1 ms
    let (b, t1, t2) = ((base + 10).to_string(), (base + 12).to_string(), (base + 15).to_string());
    let _: i64 = server.command(&[
        "ZADD",
        key,
        &b,
        "b",
        &t1,
        &(now - 2_000).to_string(),
        &t2,
        &(now - 1_000).to_string(),
    ]);
    let _: i64 = server.command(&["PEXPIRE", key, "5000"]);
    let d = redis.check("old", &rules, 1).await.unwrap();
    assert_eq!(d.remaining(), 1_000 - 6);
    let score = |member: &str| -> String { server.command(&["ZSCORE", key, member]) };
    assert_eq!(score("b"), "0");
    assert_eq!(score(&(now - 1_000).to_string()), "5");
    assert_eq!(score(&now.to_string()), "6");
    // the units of 2 ms ago leave first
    clock.advance(Duration::from_micros(998_001));
    assert_eq!(redis.check("old", &rules, 0).await.unwrap().remaining(), 1_000 - 4);
}
