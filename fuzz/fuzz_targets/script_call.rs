//! A script call as `TOLLGATE.DECIDE` (the Redis module) receives it: `script::execute` over the
//! testkit's in-process store. The input is split at NUL bytes into keys and arguments (the
//! first value is how many keys), over a store where a real call already wrote states. Never
//! panics; a refused call changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::script::{self, Arg};
use tollgate_core::{Operation, Part, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::MapStore;

fuzz_target!(|data: &[u8]| {
    let mut values = data.split(|&b| b == 0);
    let keys = values.next().and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok()).unwrap_or(0);
    let values: Vec<&[u8]> = values.collect();
    let (keys, argv) = values.split_at(keys.min(values.len()));

    let mut store = MapStore::default();
    store.now = 1_700_000_000_000_000;
    seed(&mut store);
    let before = store.contents();
    if script::execute(keys, argv, &mut store).is_err() {
        assert!(store.contents() == before, "a refused call changed the store");
    }
});

/// States of every algorithm under the keys a fuzzed call is likely to name.
fn seed(store: &mut MapStore) {
    let second = Period::SECOND;
    let rules = RuleSet::new([
        Rule::fixed_window(5, second),
        Rule::sliding_window_log(5, second),
        Rule::sliding_window_counter(5, second),
        Rule::gcra(7, Period::MINUTE, 2),
    ])
    .expect("valid rules");
    let parts = [Part::operation("a", &rules, Operation::Check { cost: 2 })];
    let args: Vec<Vec<u8>> = script::arguments(&parts, Some(Timestamp::from_micros(1_700_000_000_000_000)))
        .iter()
        .map(|a| match a {
            Arg::Int(n) => n.to_string().into_bytes(),
            Arg::Text(t) => t.as_bytes().to_vec(),
        })
        .collect();
    let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let keys: [&[u8]; 4] = [b"a", b"b", b"c", b"a"];
    script::execute(&keys, &argv, store).expect("the seed call runs");
}
