//! The command as Redis sees it: the module loads under its name and version, the command's
//! flags and key specs are declared (so Redis Cluster routes it), a malformed `numkeys` is an
//! error reply, as `EVALSHA`'s is; a key is signalled modified (WATCH) only when a call wrote
//! it; and the server's memory stays flat over many calls on existing keys (no string leaked).

mod common;

use std::time::{Duration, Instant};

use common::{call, check, connect, decide_module, server_with_module};
use redis::Value;
use tollgate_core::{Lease, LeaseId, Operation, Part, Period, Rule, RuleSet, Timestamp};

/// Every scalar of a reply, depth first, as text.
fn flatten(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => out.push(text.clone()),
        Value::Int(n) => out.push(n.to_string()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| flatten(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => out.push(format!("{other:?}")),
    }
}

fn contains_run(haystack: &[String], run: &[&str]) -> bool {
    haystack.windows(run.len()).any(|w| w.iter().zip(run).all(|(a, b)| a == b))
}

fn error_of(result: redis::RedisResult<Value>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error reply, got {v:?}"),
    }
}

#[test]
fn the_module_loads_with_the_crates_name_and_version() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let modules: Value = redis::cmd("MODULE").arg("LIST").query(&mut conn).unwrap();
    let mut text = Vec::new();
    flatten(&modules, &mut text);
    let version: Vec<i64> = env!("CARGO_PKG_VERSION").split('.').map(|p| p.parse().unwrap()).collect();
    let expected = (version[0] * 10_000 + version[1] * 100 + version[2]).to_string();
    assert!(contains_run(&text, &["name", "tollgate", "ver", &expected]), "{text:?}");
}

#[test]
fn the_command_declares_its_flags_arity_and_key_specs() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg("TOLLGATE.DECIDE").query(&mut conn).unwrap();
    let Value::Array(commands) = &info else { panic!("COMMAND INFO: {info:?}") };
    let Some(Value::Array(entry)) = commands.first() else { panic!("no entry: {info:?}") };
    assert_eq!(entry[0], Value::BulkString(b"tollgate.decide".to_vec()));
    assert_eq!(entry[1], Value::Int(-2), "arity");
    let mut flags = Vec::new();
    flatten(&entry[2], &mut flags);
    for flag in ["write", "denyoom", "movablekeys"] {
        assert!(flags.iter().any(|f| f == flag), "flag {flag} in {flags:?}");
    }
    assert!(!flags.iter().any(|f| f == "fast"), "{flags:?}");
    let mut all = Vec::new();
    flatten(&info, &mut all);
    assert!(contains_run(&all, &["begin_search", "type", "index", "spec", "index", "1"]), "{all:?}");
    assert!(
        contains_run(
            &all,
            &["find_keys", "type", "keynum", "spec", "keynumidx", "0", "firstkey", "1", "keystep", "1"]
        ),
        "{all:?}"
    );
    assert!(contains_run(&all, &["flags", "RW", "access", "update"]), "{all:?}");

    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "TOLLGATE.DECIDE", "2", "tg:{a}:h", "tg:{a}:swl:1", "x", "2"])
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys, ["tg:{a}:h", "tg:{a}:swl:1"]);
    let none =
        error_of(redis::cmd("COMMAND").arg(&["GETKEYS", "TOLLGATE.DECIDE", "0", "x"]).query(&mut conn));
    assert!(none.contains("Invalid arguments") || none.contains("no key arguments"), "{none}");
}

#[test]
fn redis_cluster_routes_the_command_by_its_keys() {
    let server = server_with_module(&["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
    let mut conn = connect(&server);
    let _: () = redis::cmd("CLUSTER").arg(&["ADDSLOTSRANGE", "0", "16383"]).query(&mut conn).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(Instant::now() < deadline, "the one-node cluster is not ok: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Keys in two slots: Redis refuses the call before the module sees it.
    let cross =
        error_of(redis::cmd("TOLLGATE.DECIDE").arg(&["2", "tg:{a}:h", "tg:{b}:h", "x"]).query(&mut conn));
    assert!(cross.to_uppercase().contains("CROSSSLOT"), "{cross}");
    // One slot: the module answers (whatever it thinks of the arguments).
    let same =
        redis::cmd("TOLLGATE.DECIDE").arg(&["2", "tg:{a}:h", "tg:{a}:x", "x"]).query::<Value>(&mut conn);
    if let Err(e) = &same {
        let text = e.to_string().to_uppercase();
        assert!(!text.contains("CROSSSLOT") && !text.contains("MOVED"), "{e}");
    }
}

#[test]
fn a_malformed_numkeys_is_an_error_reply_as_evalshas() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let cases: [(&[&str], &str); 8] = [
        (&[], "wrong number of arguments"),
        (&["x"], "not an integer"),
        (&["1.5", "a"], "not an integer"),
        (&["+1", "a"], "not an integer"),
        (&["-1", "a"], "can't be negative"),
        (&["3", "a", "b"], "greater than number of args"),
        (&["9223372036854775807", "a"], "greater than number of args"),
        (&["99999999999999999999", "a"], "not an integer"),
    ];
    for (args, expected) in cases {
        let reply = error_of(redis::cmd("TOLLGATE.DECIDE").arg(args).query(&mut conn));
        assert!(reply.contains(expected), "{args:?}: {reply}");
    }
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
}

/// Whether a transaction WATCHing `key` on `watcher`, around `meanwhile` (run on another
/// connection), commits.
fn watched_transaction_commits(watcher: &mut redis::Connection, key: &str, meanwhile: impl FnOnce()) -> bool {
    let _: () = redis::cmd("WATCH").arg(key).query(watcher).unwrap();
    meanwhile();
    let _: () = redis::cmd("MULTI").query(watcher).unwrap();
    let _: () = redis::cmd("PING").query(watcher).unwrap();
    let exec: Value = redis::cmd("EXEC").query(watcher).unwrap();
    match exec {
        Value::Nil => false,
        Value::Array(replies) => {
            assert_eq!(replies.len(), 1, "{replies:?}");
            true
        }
        other => panic!("EXEC answered {other:?}"),
    }
}

#[test]
fn a_written_key_aborts_a_watched_transaction_and_a_denied_check_does_not() {
    let server = server_with_module(&[]);
    let (mut conn, mut watcher) = (connect(&server), connect(&server));
    // An explicit time: the decisions do not depend on when the test runs.
    let now = Some(Timestamp::from_micros(1_800_000_000_000_000));
    let rules = RuleSet::new([Rule::fixed_window(2, Period::HOUR), Rule::gcra(2, Period::HOUR, 2)]).unwrap();
    let key = common::state_keys("w", &rules).remove(0);
    let mut decide = |parts: &[Part<'_>]| decide_module(&mut conn, &call(parts, now)).unwrap();

    // Admitted: the states change, the key is written, the transaction aborts.
    let admitted = watched_transaction_commits(&mut watcher, &key, || {
        assert_eq!(decide(&[check("w", &rules, 1)])[1], 1);
    });
    assert!(!admitted, "a write must abort a transaction watching the key");

    // A peek (cost 0) changes nothing: no write, no signal.
    let peeked = watched_transaction_commits(&mut watcher, &key, || {
        assert_eq!(decide(&[check("w", &rules, 0)])[1], 1);
    });
    assert!(peeked, "a peek wrote the key");

    // The second unit, then a denial: the denial writes nothing and signals nothing.
    assert_eq!(decide(&[check("w", &rules, 1)])[1], 1);
    let before: Vec<String> = redis::cmd("HGETALL").arg(&key).query(&mut watcher).unwrap();
    let denied = watched_transaction_commits(&mut watcher, &key, || {
        assert_eq!(decide(&[check("w", &rules, 1)])[1], 0, "the third unit is denied");
    });
    assert!(denied, "a denied check aborted a transaction watching the key");
    let after: Vec<String> = redis::cmd("HGETALL").arg(&key).query(&mut watcher).unwrap();
    assert_eq!(before, after);

    // And a write after the denial aborts again (the signal is per call, not lost).
    let refunded = watched_transaction_commits(&mut watcher, &key, || {
        decide(&[Part::operation("w", &rules, Operation::Refund { amount: 1 })]);
    });
    assert!(!refunded, "a refund wrote the key");
}

/// The server's `used_memory`.
fn used_memory(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in {info}"))
}

#[test]
fn many_calls_on_existing_keys_leave_the_servers_memory_flat() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    // Every kind of state, on keys that exist from the first round on: each call reads hash
    // fields (values Redis hands over as new strings) and sorted sets (members, likewise), and
    // writes some of them back.
    let hashes = RuleSet::new([
        Rule::fixed_window(1_000_000, Period::HOUR),
        Rule::sliding_window_counter(1_000_000, Period::HOUR),
        Rule::gcra(1_000_000, Period::HOUR, 1_000_000),
    ])
    .unwrap();
    let log = RuleSet::new([Rule::sliding_window_log(10, Period::HOUR)]).unwrap();
    let leases = RuleSet::new([Rule::concurrency(10, Period::HOUR)]).unwrap();
    let held = Lease { id: "held".parse::<LeaseId>().unwrap(), units: 1 };
    let turn = Lease { id: "turn".parse::<LeaseId>().unwrap(), units: 1 };
    let now = 1_800_000_000_000_000;
    let keys: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let round = |conn: &mut redis::Connection, rounds: u64, first: u64| {
        for r in first..first + rounds {
            let mut pipe = redis::pipe();
            for key in &keys {
                // One microsecond apart: the log keeps its one entry (a second check at another
                // time would add one, and the set would grow, as it should).
                let at = Some(Timestamp::from_micros(now + r));
                let acquire = Operation::Acquire { cost: 1, lease: &turn.id };
                let release = Operation::Release { lease: &turn };
                let calls = [
                    call(&[check(key, &hashes, 1)], at),
                    call(&[check(key, &log, 0)], at),
                    call(&[Part::operation(key, &leases, acquire)], at),
                    call(&[Part::operation(key, &leases, release)], at),
                ];
                for c in calls {
                    pipe.cmd("TOLLGATE.DECIDE").arg(c.keys.len()).arg(&c.keys).arg(&c.argv);
                }
            }
            let replies: Vec<Vec<i64>> = pipe.query(conn).unwrap();
            assert!(replies.iter().all(|reply| reply.len() > 1), "{replies:?}");
        }
    };
    // The keys, each with a log entry and a lease held throughout.
    for key in &keys {
        let at = Some(Timestamp::from_micros(now));
        decide_module(&mut conn, &call(&[check(key, &log, 1)], at)).unwrap();
        let acquire = Operation::Acquire { cost: 1, lease: &held.id };
        decide_module(&mut conn, &call(&[Part::operation(key, &leases, acquire)], at)).unwrap();
    }
    round(&mut conn, 50, 1);
    let before = used_memory(&mut conn);
    let calls_per_round = 4 * keys.len() as i64;
    let rounds = 250;
    round(&mut conn, rounds, 51);
    let grown = used_memory(&mut conn) - before;
    let calls = calls_per_round * rounds as i64;
    // A string leaked per call is 16 bytes at the least (Redis's smallest allocation); the
    // states' own growth (a count's digits) is a few bytes per key.
    assert!(grown < calls * 4, "{grown} bytes more after {calls} calls ({} per call)", grown / calls);
    // The states are what the calls made of them.
    let counted =
        decide_module(&mut conn, &call(&[check("m0", &hashes, 0)], Some(Timestamp::from_micros(now + 400))));
    assert_eq!(counted.unwrap()[2], 1_000_000 - 300, "300 units taken");
}

#[test]
fn a_field_tollgate_did_not_write_is_refused_and_nothing_is_written() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let now = Some(Timestamp::from_micros(1_800_000_000_000_000));
    // One rule (two fields, read one by one) and six (twelve fields, read in one pass).
    let one = RuleSet::new([Rule::fixed_window(5, Period::HOUR)]).unwrap();
    let periods =
        [Period::SECOND, Period::MINUTE, Period::HOUR, Period::DAY, Period::WEEK, Period::MONTH_30_DAYS];
    let six = RuleSet::new(periods.iter().map(|p| Rule::fixed_window(5, *p))).unwrap();
    for (name, rules) in [("one", &one), ("six", &six)] {
        let key = common::state_keys(name, rules).remove(0);
        decide_module(&mut conn, &call(&[check(name, rules, 1)], now)).unwrap();
        let fields: Vec<String> = redis::cmd("HKEYS").arg(&key).query(&mut conn).unwrap();
        assert_eq!(fields.len(), 2 * rules.len(), "{fields:?}");
        // The last field (read last, whichever way) holds a value no twin writes.
        let _: () =
            redis::cmd("HSET").arg(&key).arg(&fields[fields.len() - 1]).arg("1.5").query(&mut conn).unwrap();
        let before: Vec<String> = redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap();
        let error = decide_module(&mut conn, &call(&[check(name, rules, 1)], now)).unwrap_err().to_string();
        assert!(error.contains("did not write") && error.contains("1.5"), "{name}: {error}");
        let after: Vec<String> = redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap();
        assert_eq!(before, after, "{name}");
    }
}
