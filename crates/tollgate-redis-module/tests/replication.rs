//! The command replicates its effects, never itself: a replica (which has not even loaded the
//! module) and the AOF get plain HSET, HDEL, ZADD, ZREM, DEL and PEXPIREAT, so they hold the
//! master's keys, fields, members and TTLs.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{call, check, connect, decide_module, dump, server_with_module};
use tollgate_core::script::Part;
use tollgate_core::{Lease, LeaseId, Operation, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::RedisServer;

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_replica_and_the_aof_hold_the_masters_keys_fields_and_ttls() {
    // No delay before a full sync: the replica attaches at once.
    let master = server_with_module(&["--appendonly", "yes", "--repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_until("the replica's link", || {
        replica.try_text(&["INFO", "replication"]).is_some_and(|info| info.contains("master_link_status:up"))
    });

    let sets = [
        RuleSet::new([
            Rule::fixed_window(3, Period::SECOND),
            Rule::sliding_window_log(4, Period::MINUTE),
            Rule::sliding_window_counter(6, Period::MINUTE),
            Rule::gcra(3, Period::SECOND, 2),
        ])
        .unwrap(),
        RuleSet::new([Rule::concurrency(2, Period::MINUTE), Rule::token_bucket(5, 1, Period::SECOND)])
            .unwrap(),
        RuleSet::new([Rule::fixed_window(2, Period::SECOND)]).unwrap(),
    ];
    let mut conn = connect(&master);
    let mut decide = |parts: &[Part<'_>], now: Option<Timestamp>| {
        decide_module(&mut conn, &call(parts, now)).unwrap_or_else(|e| panic!("{parts:?}: {e}"))
    };
    // Redis's clock: HSET, ZADD, PEXPIREAT.
    for key in ["a", "b", "c"] {
        for cost in [1, 2, 1] {
            decide(&[check(key, &sets[0], cost), check(key, &sets[2], 1)], None);
        }
    }
    let lease = Lease { id: "held".parse::<LeaseId>().unwrap(), units: 1 };
    decide(&[Part::alone("d", &sets[1], Operation::Acquire { cost: 1, lease: &lease.id })], None);
    decide(
        &[Part::alone("d", &sets[1], Operation::Acquire { cost: 1, lease: &"freed".parse().unwrap() })],
        None,
    );
    decide(
        &[Part::alone(
            "d",
            &sets[1],
            Operation::Release { lease: &Lease { id: "freed".parse().unwrap(), units: 1 } },
        )],
        None,
    );
    // A call an hour ahead finds the short windows passed: the engine deletes their fields (HDEL)
    // and rewrites the rest.
    let later = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64 + 3_600_000_000;
    decide(&[check("c", &sets[0], 0), check("c", &sets[2], 0)], Some(Timestamp::from_micros(later)));

    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut conn).unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    let (on_master, on_replica) = (dump(&mut conn), dump(&mut connect(&replica)));
    assert!(on_master.len() >= 6, "the decisions wrote keys: {on_master:?}");
    assert!(on_master.values().any(|e| e.kind == "zset"), "{on_master:?}");
    assert_eq!(on_master.keys().collect::<Vec<_>>(), on_replica.keys().collect::<Vec<_>>());
    for (key, m) in &on_master {
        let r = &on_replica[key];
        assert_eq!((&m.kind, &m.value), (&r.kind, &r.value), "{key}");
        assert!(m.ttl > 0 && r.ttl > 0, "{key}: a TTL on both (master {}, replica {})", m.ttl, r.ttl);
        // PEXPIREAT: the same absolute time on both, so the same TTL but for the read's delay.
        assert!((m.ttl - r.ttl).abs() <= 200, "{key}: TTL master {} vs replica {}", m.ttl, r.ttl);
    }

    // The AOF, likewise: the effects, not the command. (Polled: Redis may be finishing the
    // AOF it starts with, and appends to the file it then opens.)
    let aof = || -> String {
        std::fs::read_dir(master.dir().join("appendonlydir"))
            .map(|dir| {
                dir.filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let effects = ["HSET", "HDEL", "ZADD", "ZREM", "PEXPIREAT", "MULTI", "EXEC"];
    wait_until("the effects in the AOF", || effects.iter().all(|command| aof().contains(command)));
    assert!(!aof().to_lowercase().contains("tollgate.decide"), "the command itself is in the AOF");
}
