//! The module and the Lua twin are one engine: the same calls, at the same explicit times, get
//! the same replies; taking turns on the same keys (a deployment loading or losing the module)
//! changes no answer; and the module writes, key for key and field for field, what `execute`
//! writes over an in-memory store, so its `Store` over the module API is faithful.

mod common;

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{
    Call, Entry, Rng, call, connect, decide_lua, decide_module, dump, load_script, server_with_module,
};
use tollgate_core::{Lease, LeaseId, Operation, Part, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::{MapStore, RedisServer, Value};

fn rule_sets() -> Vec<RuleSet> {
    let ms = |n| Period::from_millis(n).unwrap();
    vec![
        RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap(),
        RuleSet::new([
            Rule::fixed_window(3, Period::SECOND),
            Rule::sliding_window_log(4, Period::SECOND),
            Rule::sliding_window_counter(6, Period::MINUTE),
            Rule::gcra(3, Period::SECOND, 2),
        ])
        .unwrap(),
        RuleSet::new([Rule::token_bucket(4, 2, Period::SECOND)]).unwrap(),
        RuleSet::new([Rule::concurrency(2, Period::SECOND), Rule::fixed_window(10, Period::MINUTE)]).unwrap(),
        RuleSet::new([Rule::fixed_window_from_first_hit(3, ms(700))]).unwrap(),
        RuleSet::new([Rule::sliding_window_log(3, ms(500))]).unwrap(),
    ]
}

/// One operation of a step, owning what it names.
#[derive(Clone, Debug)]
enum Op {
    Check(u64),
    Acquire(u64, LeaseId),
    Refund(u64),
    Release(Lease),
}

/// A step: parts (key, rule set, operation, joins) and the time it runs at.
#[derive(Clone, Debug)]
struct Step {
    parts: Vec<(String, usize, Op, bool)>,
    now: Timestamp,
}

/// Whether a backend would send `step`: every operation valid for its rules (no cost checked
/// on a concurrency rule: that is what `acquire` is for), and no group asking a state for more
/// than its rule's capacity.
fn valid(step: &[(String, usize, Op, bool)], sets: &[RuleSet]) -> bool {
    tollgate_core::BatchPlan::new(&parts_of(step, sets)).is_ok()
}

/// The parts of `step`: a part that does not join the one before starts the next group.
fn parts_of<'a>(step: &'a [(String, usize, Op, bool)], sets: &'a [RuleSet]) -> Vec<Part<'a>> {
    let mut group = 0;
    step.iter()
        .enumerate()
        .map(|(i, (key, set, op, joins))| {
            if i > 0 && !joins {
                group += 1;
            }
            let op = match op {
                Op::Check(cost) => Operation::Check { cost: *cost },
                Op::Acquire(cost, lease) => Operation::Acquire { cost: *cost, lease },
                Op::Refund(amount) => Operation::Refund { amount: *amount },
                Op::Release(lease) => Operation::Release { lease },
            };
            Part::operation(key, &sets[*set], op).in_group(group)
        })
        .collect()
}

/// A seeded script of valid steps over four keys and every rule set, time moving 0 to 400 ms
/// a step.
fn steps(seed: u64, count: usize, sets: &[RuleSet]) -> Vec<Step> {
    let mut rng = Rng(seed);
    let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    let mut now = start;
    let mut leases: Vec<(usize, String, Lease)> = Vec::new(); // (set, key, lease)
    let mut out = Vec::new();
    while out.len() < count {
        let i = out.len();
        let mut parts = Vec::new();
        let mut taken = Vec::new(); // leases this step releases, or acquires
        let width = 1 + rng.below(3) as usize;
        for p in 0..width {
            let key = format!("k{}", rng.below(4));
            let set = rng.below(sets.len() as u64) as usize;
            let joins = p > 0 && rng.one_in(2);
            let op = match rng.below(10) {
                0 if !leases.is_empty() => {
                    let (set, key, lease) = leases.swap_remove(rng.below(leases.len() as u64) as usize);
                    taken.push((set, key.clone(), lease.clone(), false));
                    parts.push((key, set, Op::Release(lease), joins));
                    continue;
                }
                1 | 2 if !taken.iter().any(|t| t.3) => {
                    let id: LeaseId = format!("lease-{i}-{p}").parse().unwrap();
                    let cost = 1 + rng.below(2);
                    taken.push((set, key.clone(), Lease { id: id.clone(), units: cost }, true));
                    Op::Acquire(cost, id)
                }
                3 => Op::Refund(rng.below(3)),
                _ => Op::Check(rng.below(4)),
            };
            parts.push((key, set, op, joins));
        }
        if !valid(&parts, sets) {
            // Put back the leases this step would have released; forget the ones it acquired.
            leases.extend(taken.into_iter().filter(|t| !t.3).map(|(set, key, lease, _)| (set, key, lease)));
            continue;
        }
        leases.extend(taken.into_iter().filter(|t| t.3).map(|(set, key, lease, _)| (set, key, lease)));
        now += rng.below(400_000);
        out.push(Step { parts, now: Timestamp::from_micros(now) });
    }
    out
}

fn to_call(step: &Step, sets: &[RuleSet]) -> Call {
    let parts = parts_of(&step.parts, sets);
    call(&parts, Some(step.now))
}

/// Every key either engine wrote has a TTL. The states themselves are compared by what they
/// answer (the replies), not field by field: the engine may store an equivalent state in
/// another form than the Lua (`execute` deletes the fields of a state whose window has
/// passed, and rolls a sliding window counter's window when it reads it; the Lua leaves the
/// former and rolls on writes; their TTLs may differ by the margin they add). Field by field,
/// the module is compared with `execute` itself (`the_module_writes_what_execute_writes_in_memory`).
fn assert_every_key_expires(dumps: [&BTreeMap<String, Entry>; 2]) {
    for (key, entry) in dumps.into_iter().flatten() {
        assert!(entry.ttl > 0, "{key}: no TTL ({entry:?})");
    }
}

/// The module's keys are those of `execute` over an in-memory store (the same engine, over a
/// store that behaves as Redis does by construction): the same keys, fields, members and
/// scores, and an expiry on every one. Keys about to expire are left out of the comparison,
/// as the two clocks may see them expire a moment apart.
fn assert_as_in_memory(memory: &MapStore, module: &BTreeMap<String, Entry>) {
    let live = |key: &[u8]| memory.expiry(key).is_none_or(|at| at - memory.now > 200_000);
    let mut expected = BTreeMap::new();
    for key in memory.keys().into_iter().filter(|k| live(k)) {
        let value: BTreeMap<String, String> = match memory.get(&key) {
            Some(Value::Hash(fields)) => fields.iter().map(|(f, v)| (text(f), v.to_string())).collect(),
            Some(Value::SortedSet(members)) => members.iter().map(|(m, s)| (text(m), score(*s))).collect(),
            other => panic!("execute wrote {other:?}"),
        };
        assert!(memory.expiry(&key).is_some(), "{}: execute set no expiry", text(&key));
        expected.insert(text(&key), value);
    }
    let got: BTreeMap<String, BTreeMap<String, String>> = module
        .iter()
        .filter(|(key, entry)| (entry.ttl < 0 || entry.ttl > 200) && live(key.as_bytes()))
        .map(|(key, entry)| {
            assert!(entry.ttl > 0, "{key}: no TTL in Redis");
            (key.clone(), entry.value.clone())
        })
        .collect();
    assert_eq!(expected, got);
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A score as Redis prints it (`inf`, integers without a fraction).
fn score(score: f64) -> String {
    if score.is_infinite() {
        if score > 0.0 { "inf".into() } else { "-inf".into() }
    } else if score.fract() == 0.0 && score.abs() < 1e17 {
        format!("{}", score as i64)
    } else {
        format!("{score}")
    }
}

#[test]
fn the_module_writes_what_execute_writes_in_memory() {
    let sets = rule_sets();
    let module_server = server_with_module(&[]);
    let mut module = connect(&module_server);
    let mut memory = MapStore::default();
    let real_now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
    for (i, step) in steps(0xd1ff, 400, &sets).iter().enumerate() {
        let call = to_call(step, &sets);
        // The in-memory store's clock is Redis's (real time), for expiries; the decision's
        // time is the call's `now`, in both.
        memory.now = real_now();
        let keys: Vec<&[u8]> = call.keys.iter().map(|k| k.as_bytes()).collect();
        let argv: Vec<&[u8]> = call.argv.iter().map(|a| a.as_bytes()).collect();
        let expected = tollgate_core::script::execute(&keys, &argv, &mut memory);
        let got = decide_module(&mut module, &call);
        match (&expected, &got) {
            (Ok(e), Ok(g)) => assert_eq!(e, g, "step {i}: {step:?}"),
            (Err(e), Err(g)) => {
                assert!(e.to_string().ends_with(g.detail().unwrap_or("?")), "step {i}: {e} / {g}")
            }
            _ => panic!("step {i}: in memory {expected:?}, module {got:?} ({step:?})"),
        }
        if i % 50 == 49 {
            memory.now = real_now();
            assert_as_in_memory(&memory, &dump(&mut module));
        }
    }
}

#[test]
fn the_module_answers_and_writes_as_the_lua_twin() {
    let sets = rule_sets();
    let lua_server = RedisServer::start();
    let module_server = server_with_module(&[]);
    let (mut lua, mut module) = (connect(&lua_server), connect(&module_server));
    let sha = load_script(&mut lua);
    let mut admitted = 0;
    for (i, step) in steps(0x5eed, 400, &sets).iter().enumerate() {
        let call = to_call(step, &sets);
        let expected = decide_lua(&mut lua, &sha, &call);
        let got = decide_module(&mut module, &call);
        match (&expected, &got) {
            (Ok(e), Ok(g)) => assert_eq!(e, g, "step {i}: {step:?}"),
            (Err(e), Err(g)) => assert_eq!(e.kind(), g.kind(), "step {i}: lua {e}, module {g}"),
            _ => panic!("step {i}: lua {expected:?}, module {got:?} ({step:?})"),
        }
        admitted += expected.map_or(0, |reply| reply[1..].chunks(4).filter(|r| r[0] == 1).count());
        if i % 50 == 49 {
            assert_every_key_expires([&dump(&mut lua), &dump(&mut module)]);
        }
    }
    assert!(admitted > 100, "the sequence admits often enough to mean something ({admitted})");
    assert_every_key_expires([&dump(&mut lua), &dump(&mut module)]);
}

#[test]
fn lua_and_module_taking_turns_on_the_same_keys_answer_as_lua_alone() {
    let sets = rule_sets();
    let lua_server = RedisServer::start();
    let mixed_server = server_with_module(&[]);
    let (mut lua, mut mixed) = (connect(&lua_server), connect(&mixed_server));
    let (sha, mixed_sha) = (load_script(&mut lua), load_script(&mut mixed));
    let mut rng = Rng(7);
    for (i, step) in steps(0xa17e, 400, &sets).iter().enumerate() {
        let call = to_call(step, &sets);
        let expected = decide_lua(&mut lua, &sha, &call).ok();
        // Runs of either engine, switching at random.
        let got = if rng.below(3) == 0 {
            decide_lua(&mut mixed, &mixed_sha, &call)
        } else {
            decide_module(&mut mixed, &call)
        };
        assert_eq!(expected, got.ok(), "step {i}: {step:?}");
    }
    assert_every_key_expires([&dump(&mut lua), &dump(&mut mixed)]);
}
