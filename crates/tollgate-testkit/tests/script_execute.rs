//! `script::execute` against hostile calls: argument vectors that are real calls with values
//! replaced, dropped or added at random, and keys of the wrong type or with corrupt states. It
//! must answer or refuse, never panic; and a refused call changes nothing.

use proptest::prelude::*;
use tollgate_core::script::{self, Arg, CallError, StateLocation, StoreError};
use tollgate_core::{Lease, LeaseId, Operation, Part, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::{MapStore, Value};

/// Values that sit on the edges of what the parser reads.
const TOKENS: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "2",
    "-2",
    "3",
    "5",
    "1000000",
    "r",
    "check",
    "acquire",
    "refund",
    "release",
    "abc",
    "1e3",
    " 1",
    "9007199254740991",
    "9007199254740992",
    "1000000000000",
    "1000000000001",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "lease-1",
    "b",
    "+inf",
];

fn one_of_each() -> RuleSet {
    let second = Period::SECOND;
    RuleSet::new([
        Rule::fixed_window(5, second),
        Rule::fixed_window_from_first_hit(5, second),
        Rule::sliding_window_log(5, second),
        Rule::sliding_window_counter(5, second),
        Rule::token_bucket(5, 3, second),
        Rule::gcra(7, Period::MINUTE, 2),
        Rule::concurrency(5, second),
    ])
    .unwrap()
}

/// A real call's keys and arguments: a few parts on two keys, in groups.
fn real_call(rules: &RuleSet) -> (Vec<String>, Vec<String>) {
    let id: LeaseId = "lease-1".parse().unwrap();
    let lease = Lease { id: id.clone(), units: 1 };
    let small = RuleSet::new([Rule::fixed_window(3, Period::SECOND)]).unwrap();
    let parts = [
        Part::operation("a", &small, Operation::Check { cost: 1 }),
        Part::operation("b", &small, Operation::Check { cost: 2 }).in_group(1),
        Part::operation("a", rules, Operation::Acquire { cost: 1, lease: &id }).in_group(2),
        Part::operation("b", rules, Operation::Check { cost: 0 }).in_group(2),
        Part::operation("a", rules, Operation::Release { lease: &lease }).in_group(3),
        Part::operation("b", rules, Operation::Refund { amount: 2 }).in_group(4),
    ];
    let keys = parts
        .iter()
        .flat_map(|p| {
            script::locations(p.rules).map(move |l| match l {
                StateLocation::Own { signature } => format!("{{{}}}:{signature}", p.key),
                StateLocation::SharedHash { .. } => format!("{{{}}}:{}", p.key, script::SHARED_HASH),
            })
        })
        .collect();
    let args = script::arguments(&parts, Some(Timestamp::from_micros(1_700_000_000_000_000)))
        .iter()
        .map(|a| match a {
            Arg::Int(n) => n.to_string(),
            Arg::Text(t) => (*t).to_owned(),
        })
        .collect();
    (keys, args)
}

#[derive(Clone, Debug)]
enum Edit {
    Replace(usize, usize),
    Remove(usize),
    Insert(usize, usize),
    Number(usize, i64),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, t)| Edit::Replace(at, t)),
        any::<usize>().prop_map(Edit::Remove),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, t)| Edit::Insert(at, t)),
        (any::<usize>(), any::<i64>()).prop_map(|(at, n)| Edit::Number(at, n)),
    ];
    proptest::collection::vec(edit, 0..6)
}

fn apply(args: &mut Vec<String>, edits: &[Edit]) {
    for edit in edits {
        let len = args.len().max(1);
        match *edit {
            Edit::Replace(at, t) if !args.is_empty() => args[at % len] = TOKENS[t].to_owned(),
            Edit::Remove(at) if !args.is_empty() => drop(args.remove(at % len)),
            Edit::Insert(at, t) => args.insert(at % (args.len() + 1), TOKENS[t].to_owned()),
            Edit::Number(at, n) if !args.is_empty() => args[at % len] = n.to_string(),
            _ => {}
        }
    }
}

/// Stored values no twin writes.
const EXTREMES: &[i64] = &[i64::MAX, i64::MIN, -1, 1 << 53, (1 << 53) - 1, 1 << 62, 0, 3];

/// A store where the call's keys already hold states (from the real call), and one key holds
/// another type, or extreme values, at random.
fn store(keys: &[String], args: &[String], plant: Option<(usize, usize)>) -> MapStore {
    let mut store = MapStore::default();
    store.now = 1_700_000_000_000_000;
    let k: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let a: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    script::execute(&k, &a, &mut store).expect("the real call runs");
    if let Some((at, how)) = plant {
        let key = keys[at % keys.len()].as_bytes();
        let extreme = EXTREMES[how % EXTREMES.len()];
        let value = match store.get(key).cloned() {
            _ if how % 7 == 0 => Value::Text(b"not a state".to_vec()),
            // One field of the hash, or one member's score, at an extreme; or a member of no
            // known form.
            Some(Value::Hash(mut hash)) => {
                let field = hash.keys().nth(how / EXTREMES.len() % hash.len().max(1)).cloned();
                hash.insert(field.unwrap_or_default(), extreme);
                Value::Hash(hash)
            }
            Some(Value::SortedSet(mut set)) => {
                match set.keys().nth(how / EXTREMES.len() % (set.len() + 1)).cloned() {
                    Some(member) => set.insert(member, extreme as f64),
                    None => set.insert(format!("x={extreme}").into_bytes(), extreme as f64),
                };
                Value::SortedSet(set)
            }
            _ => Value::Hash([(b"s".to_vec(), extreme)].into_iter().collect()),
        };
        store.put(key, value);
    }
    store
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn hostile_calls_are_answered_or_refused_without_a_change(
        edits in edits(),
        drop_keys in 0usize..3,
        plant in proptest::option::of((any::<usize>(), any::<usize>())),
    ) {
        let rules = one_of_each();
        let (mut keys, real) = real_call(&rules);
        let mut store = store(&keys, &real, plant);
        let mut args = real.clone();
        apply(&mut args, &edits);
        keys.truncate(keys.len() - drop_keys.min(keys.len()));
        let before = store.contents();
        let k: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let a: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        match script::execute(&k, &a, &mut store) {
            Ok(reply) => prop_assert!(!reply.is_empty()),
            Err(_) => prop_assert!(store.contents() == before, "a refused call changed the store"),
        }
    }
}

#[test]
fn the_real_call_runs_and_its_errors_name_the_argument() {
    let rules = one_of_each();
    let (keys, args) = real_call(&rules);
    let k: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let mut store = MapStore::default();
    let a: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let reply = script::execute(&k, &a, &mut store).unwrap();
    assert_eq!(reply.len(), 1 + 4 * keys.len());
    assert!(store.keys().iter().all(|key| store.expiry(key).is_some()), "every key written has a TTL");

    let mut bad = args.clone();
    bad[2] = "9".to_owned(); // the first rule's algorithm number
    let a: Vec<&[u8]> = bad.iter().map(|a| a.as_bytes()).collect();
    let error = script::execute(&k, &a, &mut store).unwrap_err();
    assert_eq!(
        error,
        CallError::Argument { index: 2, reason: "an unknown algorithm, or parameters out of range" }
    );
    assert_eq!(
        error.to_string(),
        "ERR tollgate: argument 2: an unknown algorithm, or parameters out of range"
    );

    let a: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    assert_eq!(
        script::execute(&k[1..], &a, &mut store),
        Err(CallError::Keys { expected: k.len(), got: k.len() - 1 })
    );

    // One key named for a hash-stored state and a sorted set (never by the backend): refused
    // before any write, where writing the first would leave the second failing on its type.
    let fixed_and_log =
        RuleSet::new([Rule::fixed_window(5, Period::SECOND), Rule::sliding_window_log(5, Period::SECOND)])
            .unwrap();
    let part = [Part::operation("k", &fixed_and_log, Operation::Check { cost: 1 })];
    let argv: Vec<String> = script::arguments(&part, Some(Timestamp::from_micros(1_700_000_000_000_000)))
        .iter()
        .map(|a| match a {
            Arg::Int(n) => n.to_string(),
            Arg::Text(t) => (*t).to_owned(),
        })
        .collect();
    let argv: Vec<&[u8]> = argv.iter().map(|a| a.as_bytes()).collect();
    let before = store.contents();
    let same_key: [&[u8]; 2] = [b"one", b"one"];
    assert_eq!(
        script::execute(&same_key, &argv, &mut store),
        Err(CallError::SharedKey { key: "one".into() })
    );
    assert!(store.contents() == before, "nothing written");

    store.put(k[0], Value::Text(b"x".to_vec()));
    let before = store.contents();
    assert_eq!(script::execute(&k, &a, &mut store), Err(CallError::Store(StoreError::WrongType)));
    assert!(store.contents() == before, "nothing written");
}
