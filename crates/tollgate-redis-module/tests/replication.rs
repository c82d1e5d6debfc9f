//! The command replicates its effects, never itself: a replica (which has not even loaded the
//! module) and the AOF get plain HSET, HDEL, ZADD, ZREM, DEL and PEXPIREAT, so they hold the
//! master's keys, fields, members and TTLs; and only what changed: one HSET per shared hash
//! written, a PEXPIREAT only when its TTL must grow (counted on the replica, which runs them).

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{call, check, connect, decide_module, dump, server_with_module};
use tollgate_core::{Lease, LeaseId, Operation, Part, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::RedisServer;

/// A master with the module and a replica of it (without), the link up.
fn master_and_replica(master_args: &[&str]) -> (RedisServer, RedisServer) {
    let mut args = vec!["--repl-diskless-sync-delay", "0"]; // no delay before a full sync
    args.extend_from_slice(master_args);
    let master = server_with_module(&args);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_until("the replica's link", || {
        replica.try_text(&["INFO", "replication"]).is_some_and(|info| info.contains("master_link_status:up"))
    });
    (master, replica)
}

/// The calls of `command` the replica ran, once it acknowledged every write `conn` made.
fn replica_calls(conn: &mut redis::Connection, replica: &RedisServer, command: &str) -> u64 {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(conn).unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    replica.calls(command)
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_replica_and_the_aof_hold_the_masters_keys_fields_and_ttls() {
    let (master, replica) = master_and_replica(&["--appendonly", "yes"]);

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
            decide(&[check(key, &sets[0], cost), check(key, &sets[2], 1).in_group(1)], None);
        }
    }
    let lease = Lease { id: "held".parse::<LeaseId>().unwrap(), units: 1 };
    decide(&[Part::operation("d", &sets[1], Operation::Acquire { cost: 1, lease: &lease.id })], None);
    decide(
        &[Part::operation("d", &sets[1], Operation::Acquire { cost: 1, lease: &"freed".parse().unwrap() })],
        None,
    );
    decide(
        &[Part::operation(
            "d",
            &sets[1],
            Operation::Release { lease: &Lease { id: "freed".parse().unwrap(), units: 1 } },
        )],
        None,
    );
    // A call an hour ahead finds the short windows passed: the engine deletes their fields (HDEL)
    // and rewrites the rest.
    let later = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64 + 3_600_000_000;
    decide(
        &[check("c", &sets[0], 0), check("c", &sets[2], 0).in_group(1)],
        Some(Timestamp::from_micros(later)),
    );

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

#[test]
fn a_ttl_is_written_only_when_it_must_grow() {
    let (master, replica) = master_and_replica(&[]);
    let mut conn = connect(&master);
    // Six clock-aligned windows in one shared hash, on Redis's clock: the first check gives the
    // new key its TTL (the month's), once; after that no check writes it again, whichever
    // windows roll over meanwhile (the month's end covers every other), and each check writes
    // its counts in one HSET.
    let periods =
        [Period::SECOND, Period::MINUTE, Period::HOUR, Period::DAY, Period::WEEK, Period::MONTH_30_DAYS];
    let six = RuleSet::new(periods.iter().map(|p| Rule::fixed_window(1000, *p))).unwrap();
    let key = common::state_keys("ttl", &six).remove(0);
    let decide = |conn: &mut redis::Connection, parts: &[Part<'_>]| {
        decide_module(conn, &call(parts, None)).unwrap_or_else(|e| panic!("{parts:?}: {e}"))
    };
    assert_eq!(decide(&mut conn, &[check("ttl", &six, 1)])[1], 1);
    assert_eq!(replica_calls(&mut conn, &replica, "pexpireat"), 1, "the new key got its TTL once");
    // The month's window ends at the next multiple of 30 days since the epoch; the key outlives
    // it by a second.
    let month = Period::MONTH_30_DAYS.as_micros() / 1000;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let expected = (now_ms / month + 1) * month - now_ms + 1000;
    let ttl: i64 = master.command(&["PTTL", &key]);
    assert!(
        ttl.abs_diff(expected as i64) < 5_000,
        "the TTL covers the month's window: {ttl} ms, not {expected}"
    );
    for _ in 0..10 {
        assert_eq!(decide(&mut conn, &[check("ttl", &six, 1)])[1], 1);
    }
    assert_eq!(
        replica_calls(&mut conn, &replica, "pexpireat"),
        1,
        "a TTL rewritten that covered every state"
    );
    assert_eq!(replica_calls(&mut conn, &replica, "hset"), 11, "one HSET per check");
    // A peek and a denial (of a full state) write nothing at all.
    let one = RuleSet::new([Rule::fixed_window(1, Period::HOUR)]).unwrap();
    assert_eq!(decide(&mut conn, &[check("one", &one, 1)])[1], 1);
    let (hsets, ttls) =
        (replica_calls(&mut conn, &replica, "hset"), replica_calls(&mut conn, &replica, "pexpireat"));
    assert_eq!(decide(&mut conn, &[check("one", &one, 0)])[1], 0);
    assert_eq!(decide(&mut conn, &[check("one", &one, 1)])[1], 0);
    assert_eq!(replica_calls(&mut conn, &replica, "hset"), hsets);
    assert_eq!(replica_calls(&mut conn, &replica, "pexpireat"), ttls);

    // A longer-lived state joins the key: its TTL must grow, and does, once.
    let second = RuleSet::new([Rule::fixed_window(1000, Period::SECOND)]).unwrap();
    let both = RuleSet::new([
        Rule::fixed_window(1000, Period::SECOND),
        Rule::fixed_window_from_first_hit(1000, Period::HOUR),
    ])
    .unwrap();
    assert_eq!(decide(&mut conn, &[check("grow", &second, 1)])[1], 1);
    let ttls = replica_calls(&mut conn, &replica, "pexpireat");
    let short: i64 = master.command(&["PTTL", &common::state_keys("grow", &second)[0]]);
    assert!(short <= 2000, "{short} ms");
    assert_eq!(decide(&mut conn, &[check("grow", &both, 1)])[1], 1);
    assert_eq!(replica_calls(&mut conn, &replica, "pexpireat"), ttls + 1, "the TTL grew once");
    let long: i64 = master.command(&["PTTL", &common::state_keys("grow", &both)[0]]);
    assert!(long > 3_500_000, "the TTL covers the hour from now: {long} ms");

    // GCRA's state moves forward with every admission, so its key's TTL grows with it and
    // always covers the state: a burst of 5 at 1 per 100 ms is full again 500 ms later.
    let gcra = RuleSet::new([Rule::gcra(10, Period::SECOND, 5)]).unwrap();
    let ttls = replica_calls(&mut conn, &replica, "pexpireat");
    for _ in 0..5 {
        assert_eq!(decide(&mut conn, &[check("g", &gcra, 1)])[1], 1);
    }
    assert_eq!(replica_calls(&mut conn, &replica, "pexpireat"), ttls + 5, "each admission moved the expiry");
    let ttl: i64 = master.command(&["PTTL", &common::state_keys("g", &gcra)[0]]);
    assert!(ttl > 400, "the TTL covers the state: {ttl} ms");
}
