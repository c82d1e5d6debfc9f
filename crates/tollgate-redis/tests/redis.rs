//! The Redis backend against private redis-servers: exactness under concurrency, a TTL on every
//! key and nothing left behind, transparent script reloads, and fast errors from a dead or hung
//! Redis. Each test but the script reload runs on both engines (`name::on_lua`,
//! `name::on_module`).

mod engines;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Error, Part, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::RedisServer;
use tollgate_testkit::conformance::one_of_each;

use engines::{engine_calls, on_both_engines, server};

fn backend(server: &RedisServer, engine: Engine, connections: usize) -> RedisBackend {
    RedisBackend::builder(server.url())
        .engine(engine)
        .connections(connections)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn p(text: &str) -> Period {
    text.parse().unwrap()
}

/// 64 tasks race `total` requests of cost 1 at one key; returns how many were admitted.
async fn race(backend: &Arc<RedisBackend>, key: &str, rules: &RuleSet, total: usize) -> usize {
    race_via(backend, key, rules, total, false).await
}

/// [`race`], each check sent as a batch of one part when `batches`.
async fn race_via(
    backend: &Arc<RedisBackend>,
    key: &str,
    rules: &RuleSet,
    total: usize,
    batches: bool,
) -> usize {
    const TASKS: usize = 64;
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (backend, rules, key) = (backend.clone(), rules.clone(), key.to_owned());
        let mine = total / TASKS + usize::from(task < total % TASKS);
        handles.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..mine {
                let allowed = if rules.has_concurrency() {
                    backend.acquire(&key, &rules, 1).await.unwrap().decision.allowed()
                } else if batches {
                    backend.check_batch(&[Part::new(&key, &rules, 1)]).await.unwrap()[0].allowed()
                } else {
                    backend.check(&key, &rules, 1).await.unwrap().allowed()
                };
                admitted += usize::from(allowed);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for handle in handles {
        admitted += handle.await.unwrap();
    }
    admitted
}

on_both_engines!(
    exactly_the_limit_is_admitted_under_concurrency,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn exactly_the_limit_is_admitted_under_concurrency(engine: Engine) {
    let server = server(engine);
    let backend = Arc::new(backend(&server, engine, 4));
    // 1,000 per (about) a year: nothing refills or rolls over during the test.
    for rule in one_of_each(1000, p("1y")) {
        let rules = RuleSet::new([rule.clone()]).unwrap();
        let admitted = race(&backend, &format!("race:{}", rule.algorithm()), &rules, 5000).await;
        assert_eq!(admitted, 1000, "{rule:?}");
    }

    // Several rules: the tightest binds, and every rule consumed exactly that much.
    let y = p("1y");
    let rules = RuleSet::new([
        Rule::sliding_window_log(2000, y),
        Rule::fixed_window(1000, y),
        Rule::token_bucket(1500, 1500, y),
        Rule::gcra(3000, y, 3000),
    ])
    .unwrap();
    assert_eq!(race(&backend, "race:multi", &rules, 5000).await, 1000);
    let peek = backend.check("race:multi", &rules, 0).await.unwrap();
    let remaining: Vec<u64> = peek.outcomes(&rules).map(|o| o.remaining()).collect();
    assert_eq!(remaining, [1000, 0, 500, 2000]);
}

on_both_engines!(
    exactly_the_limit_is_admitted_at_one_frozen_instant,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn exactly_the_limit_is_admitted_at_one_frozen_instant(engine: Engine) {
    // Every request at the same microsecond: the log's per-instant ordinals must not collide.
    let server = server(engine);
    let clock = tollgate_core::ManualClock::at_wall_clock_second();
    let backend = Arc::new(
        RedisBackend::builder(server.url())
            .engine(engine)
            .connections(4)
            .timeout(Duration::from_secs(10))
            .clock(clock)
            .build()
            .unwrap(),
    );
    // Minute-long states: the keys' TTLs run on Redis's clock while the test's stands still, and
    // a second-long state's key could expire before the race ends on a loaded machine.
    for rule in [Rule::sliding_window_log(1000, Period::MINUTE), Rule::concurrency(1000, Period::MINUTE)] {
        let rules = RuleSet::new([rule.clone()]).unwrap();
        let admitted = race(&backend, &format!("frozen:{}", rule.algorithm()), &rules, 5000).await;
        assert_eq!(admitted, 1000, "{rule:?}");
    }
}

on_both_engines!(
    every_key_has_a_ttl_and_none_outlives_its_state,
    flavor = "multi_thread",
    worker_threads = 2
);
async fn every_key_has_a_ttl_and_none_outlives_its_state(engine: Engine) {
    let server = server(engine);
    let backend = Arc::new(backend(&server, engine, 2));
    let ms = |n| Period::from_millis(n).unwrap();
    let sets: Vec<RuleSet> = [
        vec![Rule::fixed_window(3, ms(200)), Rule::gcra(10, ms(300), 2)],
        vec![Rule::fixed_window_from_first_hit(3, ms(250))],
        vec![Rule::sliding_window_log(4, ms(300)), Rule::sliding_window_counter(5, ms(200))],
        vec![Rule::token_bucket(5, 2, ms(100))],
        vec![Rule::concurrency(3, ms(300))],
    ]
    .into_iter()
    .map(|r| RuleSet::new(r).unwrap())
    .collect();

    let running = Arc::new(AtomicBool::new(true));
    let mut load = Vec::new();
    for task in 0..8 {
        let (backend, sets, running) = (backend.clone(), sets.clone(), running.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0usize;
            while running.load(Ordering::Relaxed) {
                let rules = &sets[i % sets.len()];
                let key = format!("leak:{}", (i * 7 + task) % 50);
                let cost = (i % 3) as u64;
                if rules.has_concurrency() {
                    let a = backend.acquire(&key, rules, cost).await.unwrap();
                    if let (Some(lease), true) = (a.lease, i.is_multiple_of(2)) {
                        backend.release(&key, rules, &lease).await.unwrap();
                    }
                } else if i.is_multiple_of(11) {
                    backend.refund(&key, rules, 1).await.unwrap();
                } else {
                    backend.check(&key, rules, cost).await.unwrap();
                }
                i += 1;
            }
            i
        }));
    }
    // While the load runs, scan: no key may lack a TTL.
    let start = Instant::now();
    let mut seen = 0;
    while start.elapsed() < Duration::from_millis(1500) {
        for key in server.keys() {
            let ttl: i64 = server.command(&["PTTL", &key]);
            assert_ne!(ttl, -1, "{key} has no TTL");
            seen += 1;
        }
    }
    running.store(false, Ordering::Relaxed);
    let mut operations = 0;
    for task in load {
        operations += task.await.unwrap();
    }
    assert!(seen > 0 && operations > 100, "the load ran ({operations} operations, {seen} keys seen)");

    // Every state here is stale within 2 x 300 ms; keys outlive it by a 1 s margin at most.
    tokio::time::sleep(Duration::from_millis(600 + 1000 + 900)).await;
    assert_eq!(server.keys(), Vec::<String>::new(), "keys left behind");
}

/// The Lua's own: its scripts reloaded.
#[tokio::test]
async fn script_flush_is_invisible() {
    let server = RedisServer::start();
    let backend = backend(&server, Engine::Lua, 1);
    let rules = RuleSet::new([Rule::fixed_window(5, Period::HOUR)]).unwrap();
    assert_eq!(backend.check("k", &rules, 1).await.unwrap().remaining(), 4);
    let _: () = server.command(&["SCRIPT", "FLUSH"]);
    assert_eq!(backend.check("k", &rules, 1).await.unwrap().remaining(), 3);
}

on_both_engines!(a_stopped_redis_errors_within_the_timeout);
async fn a_stopped_redis_errors_within_the_timeout(engine: Engine) {
    let mut server = server(engine);
    let timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(server.url()).engine(engine).timeout(timeout).build().unwrap();
    let rules = RuleSet::new([Rule::gcra(10, Period::SECOND, 10)]).unwrap();
    assert!(backend.check("k", &rules, 1).await.unwrap().allowed());
    server.kill();
    for _ in 0..3 {
        let start = Instant::now();
        let err = backend.check("k", &rules, 1).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_backend_failure(), "{err:?}");
        assert!(matches!(err, Error::Unavailable(_) | Error::Timeout(_)), "{err:?}");
        assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
    }
}

on_both_engines!(a_hung_redis_times_out_and_recovers);
async fn a_hung_redis_times_out_and_recovers(engine: Engine) {
    let server = server(engine);
    let timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(server.url()).engine(engine).timeout(timeout).build().unwrap();
    let rules = RuleSet::new([Rule::fixed_window(10, Period::HOUR)]).unwrap();
    assert!(backend.check("k", &rules, 1).await.unwrap().allowed());
    server.pause();
    let start = Instant::now();
    let err = backend.check("k", &rules, 1).await.unwrap_err();
    let took = start.elapsed();
    server.resume();
    assert!(matches!(err, Error::Timeout(t) if t == timeout), "{err:?}");
    assert!(took >= timeout && took < timeout + Duration::from_millis(500), "took {took:?}");
    // Back to normal once Redis answers again (the timed-out check may or may not have run).
    let mut recovered = None;
    for _ in 0..20 {
        if let Ok(d) = backend.check("k", &rules, 1).await {
            recovered = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let d = recovered.expect("no answer after Redis resumed");
    assert!(d.allowed() && d.remaining() <= 8);
}

on_both_engines!(keys_are_prefixed_tagged_and_named_by_rule);
async fn keys_are_prefixed_tagged_and_named_by_rule(engine: Engine) {
    let server = server(engine);
    let backend = RedisBackend::builder(server.url()).engine(engine).prefix("app").build().unwrap();
    let rules =
        RuleSet::new([Rule::fixed_window(5, Period::SECOND), Rule::sliding_window_log(1, Period::SECOND)])
            .unwrap();
    backend.check("user:{1}", &rules, 1).await.unwrap();
    let mut keys = server.keys();
    keys.sort();
    assert_eq!(keys, ["app:{user:%7B1%7D}:h", "app:{user:%7B1%7D}:swl2:1:1000000"]);
    assert_eq!(keys, {
        let mut k = backend.state_keys("user:{1}", &rules);
        k.sort();
        k
    });
    // Both keys hash to one cluster slot (asked of a cluster-enabled node).
    let node = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let slots: Vec<i64> = keys.iter().map(|k| node.command(&["CLUSTER", "KEYSLOT", k])).collect();
    assert_eq!(slots[0], slots[1]);
    let other: i64 = node.command(&["CLUSTER", "KEYSLOT", "app:{user:2}:h"]);
    assert_ne!(slots[0], other, "the tag, not the prefix, picks the slot");
    backend.reset("user:{1}", &rules).await.unwrap();
    assert!(server.keys().is_empty());
}

on_both_engines!(hash_stored_rules_of_a_set_share_one_hash);
async fn hash_stored_rules_of_a_set_share_one_hash(engine: Engine) {
    let server = server(engine);
    let backend = RedisBackend::builder(server.url()).engine(engine).build().unwrap();
    // The per-consumer shape: six clock-aligned windows.
    let periods =
        [Period::SECOND, Period::MINUTE, Period::HOUR, Period::DAY, Period::WEEK, Period::MONTH_30_DAYS];
    let six = RuleSet::new(periods.iter().map(|p| Rule::fixed_window(100, *p))).unwrap();
    for _ in 0..3 {
        assert!(backend.check("acme", &six, 1).await.unwrap().allowed());
    }
    assert_eq!(server.keys(), ["tollgate:{acme}:h"]);
    let fields: Vec<String> = server.command(&["HKEYS", "tollgate:{acme}:h"]);
    assert_eq!(fields.len(), 12, "{fields:?}");
    // The hash lives as long as its longest-lived state: the month's window.
    let ttl: i64 = server.command(&["PTTL", "tollgate:{acme}:h"]);
    assert!(ttl > 86_400_000, "{ttl}");
    assert!(ttl <= 30 * 86_400_000 + 1000, "{ttl}");
    let usage: i64 = server.command(&["MEMORY", "USAGE", "tollgate:{acme}:h"]);
    println!("six periods of one consumer: {usage} bytes");

    // Another set on the same key shares the hash; a reset of one set leaves the other's.
    let other =
        RuleSet::new([Rule::gcra(10, Period::SECOND, 5), Rule::sliding_window_counter(50, Period::MINUTE)])
            .unwrap();
    assert!(backend.check("acme", &other, 1).await.unwrap().allowed());
    let fields: Vec<String> = server.command(&["HKEYS", "tollgate:{acme}:h"]);
    assert_eq!(fields.len(), 12 + 2 + 3);
    backend.reset("acme", &six).await.unwrap();
    let fields: Vec<String> = server.command(&["HKEYS", "tollgate:{acme}:h"]);
    assert_eq!(fields.len(), 5, "{fields:?}");
    assert_eq!(backend.check("acme", &six, 0).await.unwrap().remaining(), 100);
    assert_eq!(
        backend.check("acme", &other, 0).await.unwrap().outcomes(&other).nth(1).unwrap().remaining(),
        49
    );
    backend.reset("acme", &other).await.unwrap();
    assert!(server.keys().is_empty(), "an emptied hash is gone");
}

/// TTLs written on `replica` so far: the expire commands its master sent it. Both engines'
/// writes reach a replica as commands (a script's effects, the module's replicated calls), while
/// the module's own writes through Redis's key API are not counted in the master's
/// `INFO commandstats`.
fn ttl_writes(replica: &RedisServer) -> u64 {
    ["pexpireat", "pexpire", "expireat", "expire"].iter().map(|c| replica.calls(c)).sum()
}

/// A field of `INFO replication`.
fn replication(server: &RedisServer, field: &str) -> Option<String> {
    let info = server.try_text(&["INFO", "replication"])?;
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::to_owned)
}

/// Waits until `replica` has applied everything `master` has sent so far.
fn caught_up(master: &RedisServer, replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sent = replication(master, "master_repl_offset");
        if sent.is_some() && replication(replica, "master_repl_offset") == sent {
            return;
        }
        assert!(Instant::now() < deadline, "the replica did not catch up");
        std::thread::sleep(Duration::from_millis(5));
    }
}

on_both_engines!(a_ttl_is_only_written_when_it_must_grow);
async fn a_ttl_is_only_written_when_it_must_grow(engine: Engine) {
    let server = server(engine);
    // The TTLs written are counted on a replica (a plain one: the module replicates plain
    // commands, and a replica needs no module).
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &server.port().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while replication(&replica, "master_link_status").as_deref() != Some("up") {
        assert!(Instant::now() < deadline, "the replica did not sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let backend = backend(&server, engine, 1);
    // Six clock-aligned windows: within one second none of their ends moves, so after the first
    // check the key's TTL already covers every state and no check writes it again.
    let periods =
        [Period::SECOND, Period::MINUTE, Period::HOUR, Period::DAY, Period::WEEK, Period::MONTH_30_DAYS];
    let six = RuleSet::new(periods.iter().map(|p| Rule::fixed_window(1000, *p))).unwrap();
    // Start just after a second's edge, so ten quick checks share the second's window.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    tokio::time::sleep(Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos()))).await;
    assert!(backend.check("ttl", &six, 1).await.unwrap().allowed());
    caught_up(&server, &replica);
    let first = ttl_writes(&replica);
    // a new key: one TTL write per rule at most (each longer window lengthens the TTL once)
    assert!((1..=6).contains(&first), "the new key got its TTL ({first} writes)");
    for _ in 0..10 {
        assert!(backend.check("ttl", &six, 1).await.unwrap().allowed());
    }
    caught_up(&server, &replica);
    assert_eq!(ttl_writes(&replica), first, "no TTL rewritten within the second");
    // Every check was the engine's: a module call each, or the Lua's six reads.
    match engine {
        Engine::Module => assert_eq!(server.calls("tollgate.decide"), 11),
        _ => assert_eq!(server.calls("hmget"), 11 * 6),
    }

    // GCRA's state moves forward with every admission, so its key's TTL grows with it and
    // always covers the state: a burst of 5 at 1 per 100 ms is full again 500 ms later.
    let gcra = RuleSet::new([Rule::gcra(10, Period::SECOND, 5)]).unwrap();
    for _ in 0..5 {
        assert!(backend.check("g", &gcra, 1).await.unwrap().allowed());
    }
    let ttl: i64 = server.command(&["PTTL", "tollgate:{g}:h"]);
    assert!(ttl > 400, "the TTL covers the state: {ttl} ms");
}

on_both_engines!(
    concurrent_operations_are_coalesced_and_stay_exact,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn concurrent_operations_are_coalesced_and_stay_exact(engine: Engine) {
    let server = server(engine);
    let rules = RuleSet::new([Rule::fixed_window(1000, p("1y")), Rule::gcra(3000, p("1y"), 1500)]).unwrap();
    for (coalesce, name) in [(32, "coalesced"), (1, "alone")] {
        let backend = Arc::new(
            RedisBackend::builder(server.url())
                .engine(engine)
                .connections(1)
                .coalesce(coalesce)
                .deny_cache(false) // every operation reaches Redis: count the calls
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        );
        // Lone checks, then batches of one part (an Envoy request of one descriptor), which
        // take the same way.
        for (batches, key) in [(false, name.to_owned()), (true, format!("{name}-batches"))] {
            let before = engine_calls(&server);
            assert_eq!(race_via(&backend, &key, &rules, 3000, batches).await, 1000, "{key}");
            let calls = engine_calls(&server) - before;
            if coalesce == 1 {
                assert_eq!(calls, 3000, "{key}: one call per operation");
            } else {
                // 64 callers on one connection: most operations share a call.
                assert!(calls < 1500, "{key}: {calls} script calls for 3,000 coalesced operations");
            }
            let left = backend.check(&key, &rules, 0).await.unwrap();
            assert_eq!(left.outcomes(&rules).next().unwrap().remaining(), 0, "{key}");
            assert_eq!(
                left.outcomes(&rules).nth(1).unwrap().remaining(),
                500,
                "{key}: 1,000 taken from the bucket, no more"
            );
        }
    }
}

on_both_engines!(denials_are_answered_locally_until_they_expire);
async fn denials_are_answered_locally_until_they_expire(engine: Engine) {
    let server = server(engine);
    let backend =
        RedisBackend::builder(server.url()).engine(engine).timeout(Duration::from_secs(5)).build().unwrap();
    // One a second from the first hit: the denial's wait is under a second, counted from the hit.
    let rules = RuleSet::new([Rule::fixed_window_from_first_hit(1, Period::SECOND)]).unwrap();
    assert!(backend.check("flood", &rules, 1).await.unwrap().allowed());
    let first = backend.check("flood", &rules, 1).await.unwrap();
    assert!(!first.allowed());
    let calls = engine_calls(&server);
    let mut last_wait = first.retry_after();
    for _ in 0..50 {
        let d = backend.check("flood", &rules, 1).await.unwrap();
        assert!(!d.allowed());
        assert!(d.retry_after() <= last_wait, "the wait counts down");
        last_wait = d.retry_after();
    }
    assert_eq!(engine_calls(&server), calls, "denials answered without Redis");
    // A peek asks for one unit, as the cached denial: also answered here. Another key, or
    // another rule set, goes to Redis.
    assert!(!backend.check("flood", &rules, 0).await.unwrap().allowed());
    assert_eq!(engine_calls(&server), calls);
    let other = RuleSet::new([Rule::fixed_window_from_first_hit(2, Period::SECOND)]).unwrap();
    assert!(backend.check("flood", &other, 1).await.unwrap().allowed());
    assert_eq!(engine_calls(&server), calls + 1);

    // Once the wait has passed, Redis decides again and admits.
    tokio::time::sleep(last_wait + Duration::from_millis(50)).await;
    assert!(backend.check("flood", &rules, 1).await.unwrap().allowed());

    // A reset through this instance forgets the denial at once.
    assert!(!backend.check("flood", &rules, 1).await.unwrap().allowed());
    backend.reset("flood", &rules).await.unwrap();
    assert!(backend.check("flood", &rules, 1).await.unwrap().allowed());

    // Leases are never cached: a release elsewhere may free a unit at any moment.
    let leases = RuleSet::new([Rule::concurrency(1, Period::MINUTE)]).unwrap();
    let held = backend.acquire("lease", &leases, 1).await.unwrap().lease.unwrap();
    let before = engine_calls(&server);
    assert!(!backend.acquire("lease", &leases, 1).await.unwrap().decision.allowed());
    backend.release("lease", &leases, &held).await.unwrap();
    assert!(backend.acquire("lease", &leases, 1).await.unwrap().decision.allowed());
    assert_eq!(engine_calls(&server), before + 3);
}

on_both_engines!(a_denial_cached_before_redis_restarted_empty_is_not_kept);
async fn a_denial_cached_before_redis_restarted_empty_is_not_kept(engine: Engine) {
    let mut server = server(engine);
    let backend = RedisBackend::builder(server.url())
        .engine(engine)
        .connections(1)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let rules = RuleSet::new([Rule::fixed_window(1, Period::HOUR)]).unwrap();
    assert!(backend.check("spent", &rules, 1).await.unwrap().allowed());
    assert!(!backend.check("spent", &rules, 1).await.unwrap().allowed());
    let calls = engine_calls(&server);
    assert!(!backend.check("spent", &rules, 1).await.unwrap().allowed());
    assert_eq!(engine_calls(&server), calls, "the denial is cached: an hour without asking Redis");

    server.restart();
    // The first call on the old connection finds it lost; the next reaches the new Redis.
    let err = backend.check("other", &rules, 1).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(backend.check("other", &rules, 1).await.unwrap().allowed());
    // That Redis knows nothing of "spent": its answer, not the cached denial, counts.
    let d = backend.check("spent", &rules, 1).await.unwrap();
    assert!(d.allowed(), "{d:?}");
    assert!(!backend.check("spent", &rules, 1).await.unwrap().allowed(), "and it is exact again");
}
