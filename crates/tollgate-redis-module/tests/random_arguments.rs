//! Bad arguments are error replies, never a crash: a module-loaded server takes 10,000 random
//! argument vectors (seeded, so a failure replays) after real decisions wrote keys, and is then
//! alive, with those keys as they were. And a key of another type is WRONGTYPE, with nothing
//! written.

mod common;

use std::collections::BTreeMap;

use common::{Rng, call, check, connect, decide_module, dump, server_with_module};
use tollgate_core::script::{OP_ACQUIRE, OP_CHECK, OP_REFUND, OP_RELEASE, OP_RUN};
use tollgate_core::{LeaseId, Operation, Part, Period, Rule, RuleSet};

const VECTORS: usize = 10_000;

fn rule_sets() -> Vec<RuleSet> {
    vec![
        RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap(),
        RuleSet::new([
            Rule::fixed_window(3, Period::SECOND),
            Rule::sliding_window_log(4, Period::MINUTE),
            Rule::sliding_window_counter(6, Period::MINUTE),
            Rule::gcra(3, Period::SECOND, 2),
        ])
        .unwrap(),
        RuleSet::new([Rule::concurrency(2, Period::MINUTE), Rule::token_bucket(4, 2, Period::SECOND)])
            .unwrap(),
    ]
}

/// A random argument: numbers of every size and sign, the layout's words, text of any bytes
/// (NUL, CR LF, invalid UTF-8), empty, now and then long.
fn random_arg(rng: &mut Rng) -> Vec<u8> {
    match rng.below(16) {
        0 => Vec::new(),
        1 => rng.below(10).to_string().into_bytes(),
        2 => (rng.next() as i64).to_string().into_bytes(),
        3 => format!("-{}", rng.below(1000)).into_bytes(),
        4 => {
            ["99999999999999999999999", "9223372036854775807", "-9223372036854775808", "18446744073709551616"]
                [rng.below(4) as usize]
                .into()
        }
        5 => ["inf", "-inf", "nan", "1e308", "0.5", "1.0", "+1", " 1", "0x10", "1e3"][rng.below(10) as usize]
            .into(),
        6 => [OP_RUN, OP_CHECK, OP_ACQUIRE, OP_REFUND, OP_RELEASE][rng.below(5) as usize].into(),
        7 => (0..rng.below(12)).map(|_| rng.next() as u8).collect(),
        8 if rng.one_in(50) => vec![b'x'; 1 + rng.below(70_000) as usize],
        9 => format!("fz:{{k{}}}:h", rng.below(4)).into_bytes(),
        10 => b"\0\r\n*1\r\n$4\r\nPING\r\n".to_vec(),
        _ => rng.below(200).to_string().into_bytes(),
    }
}

/// A valid call on the fuzz keys, whose arguments a mutation then damages.
fn valid_call(rng: &mut Rng, sets: &[RuleSet]) -> Vec<Vec<u8>> {
    let keys: Vec<String> = (0..3).map(|i| format!("fz{i}")).collect();
    let lease: LeaseId = "fuzz".parse().unwrap();
    let parts: Vec<Part<'_>> = (0..1 + rng.below(3) as u32)
        .map(|group| {
            let key = &keys[rng.below(3) as usize];
            let rules = &sets[rng.below(sets.len() as u64) as usize];
            match rng.below(3) {
                0 => Part::operation(key, rules, Operation::Acquire { cost: 1, lease: &lease }),
                _ => check(key, rules, rng.below(3)),
            }
            .in_group(group)
        })
        .collect();
    let call = call(&parts, None);
    let mut args = vec![call.keys.len().to_string().into_bytes()];
    args.extend(call.keys.into_iter().map(String::into_bytes));
    args.extend(call.argv.into_iter().map(String::into_bytes));
    args
}

/// A random argument vector (after the command's name): wholly random, or a valid call with
/// one to three arguments replaced, dropped or added, or its numkeys changed.
fn random_vector(rng: &mut Rng, sets: &[RuleSet]) -> Vec<Vec<u8>> {
    if rng.one_in(2) {
        let count = if rng.one_in(100) { rng.below(2_000) } else { rng.below(14) };
        let mut args: Vec<Vec<u8>> = (0..count).map(|_| random_arg(rng)).collect();
        if !args.is_empty() && rng.one_in(2) {
            args[0] = rng.below(count + 2).to_string().into_bytes(); // a plausible numkeys
        }
        return args;
    }
    let mut args = valid_call(rng, sets);
    for _ in 0..1 + rng.below(3) {
        if args.is_empty() {
            args.push(random_arg(rng));
        }
        let at = rng.below(args.len() as u64) as usize;
        match rng.below(5) {
            0 => args[at] = random_arg(rng),
            1 => {
                args.remove(at);
            }
            2 => args.insert(at, random_arg(rng)),
            3 => args.truncate(at),
            _ => args[0] = random_arg(rng),
        }
    }
    args
}

#[test]
fn ten_thousand_random_argument_vectors_leave_the_server_alive_and_its_keys_intact() {
    let sets = rule_sets();
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    // Real decisions write real keys (and one plain key no call may touch).
    for key in ["real-1", "real-2"] {
        for set in &sets {
            let op = if set.len() == 2 {
                Operation::Acquire { cost: 1, lease: &"r".parse().unwrap() }
            } else {
                Operation::Check { cost: 1 }
            };
            decide_module(&mut conn, &call(&[Part::operation(key, set, op)], None)).unwrap();
        }
    }
    let _: () = redis::cmd("SET").arg("plain").arg("value").query(&mut conn).unwrap();
    let before = dump(&mut conn);
    assert!(before.len() >= 7, "{before:?}");

    let mut rng = Rng(0x70_11_9a_7e);
    let (mut errors, mut decided) = (0, 0);
    for i in 0..VECTORS {
        let mut args = random_vector(&mut rng, &sets);
        // Random text never names a real key (the real keys' tags are not in the alphabet above,
        // but a key copied from nowhere could still equal one by chance: rule it out).
        for arg in &mut args {
            if before.contains_key(String::from_utf8_lossy(arg).as_ref()) {
                *arg = b"x".to_vec();
            }
        }
        match redis::cmd("TOLLGATE.DECIDE").arg(&args).query::<redis::Value>(&mut conn) {
            Ok(_) => decided += 1,
            Err(e) if e.to_string().contains("internal error") => {
                panic!("vector {i} panicked inside the module ({e}): {:?}", printable(&args))
            }
            Err(e) if !e.is_connection_dropped() && !e.is_io_error() => errors += 1,
            Err(e) => panic!("vector {i} broke the connection ({e}): {:?}", printable(&args)),
        }
    }
    assert!(server.is_alive(), "redis-server died");
    let pong: String = redis::cmd("PING").query(&mut connect(&server)).unwrap();
    assert_eq!(pong, "PONG");
    eprintln!("{errors} error replies, {decided} decisions");
    assert!(
        errors > VECTORS / 2 && decided > 50,
        "the vectors reach both ends: {errors} errors, {decided} decided"
    );

    let after = dump(&mut conn);
    for (key, entry) in &before {
        let now = after.get(key).unwrap_or_else(|| panic!("{key} is gone"));
        assert_eq!((&entry.kind, &entry.value), (&now.kind, &now.value), "{key} changed");
    }
}

#[test]
fn a_key_of_another_type_is_wrongtype_and_nothing_is_written() {
    let sets = rule_sets();
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    // Set 1's sliding window log keeps its own sorted set; make it a string, and the shared
    // hash a list: each is refused, and the call writes nothing, not even its other states.
    for (wrong, kind) in [("tg:{w}:swl2:4:60000000", "SET"), ("tg:{w}:h", "RPUSH")] {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        let _: () = redis::cmd(kind).arg(wrong).arg("v").query(&mut conn).unwrap();
        let before: BTreeMap<_, _> = dump_values(&mut conn);
        let call = call(&[check("w", &sets[1], 1)], None);
        assert!(call.keys.iter().any(|k| k == wrong), "{:?}", call.keys);
        let err = decide_module(&mut conn, &call).unwrap_err();
        assert!(err.to_string().to_uppercase().contains("WRONGTYPE"), "{err}");
        assert_eq!(dump_values(&mut conn), before, "the refused call wrote");
    }
}

/// Keys and their types (a list is not in `dump`'s repertoire).
fn dump_values(conn: &mut redis::Connection) -> BTreeMap<String, String> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    keys.into_iter().map(|k| (k.clone(), redis::cmd("TYPE").arg(&k).query(conn).unwrap())).collect()
}

fn printable(args: &[Vec<u8>]) -> Vec<String> {
    args.iter().map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned()).collect()
}
