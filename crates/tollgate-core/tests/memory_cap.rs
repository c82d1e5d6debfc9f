//! The memory backend's cap on keys (`max_keys`): the soonest-expiring key goes first, the
//! others keep exact counts, batches stay all or nothing, the count never passes the cap, and
//! every eviction is counted in the metric.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use proptest::prelude::*;
use tollgate_core::{
    EVICTIONS_METRIC, MIN_MAX_KEYS, ManualClock, MemoryBackend, MemoryConfigError, Operation, Part, Period,
    Rule, RuleSet,
};

/// Counters by name and labels, for this thread only (`metrics::with_local_recorder`).
#[derive(Default)]
struct Counters(Mutex<HashMap<String, Arc<AtomicU64>>>);

struct Handle(Arc<AtomicU64>);

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl Counters {
    fn get(&self, series: &str) -> u64 {
        self.0.lock().unwrap().get(series).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        let cell = self.0.lock().unwrap().entry(series).or_default().clone();
        Counter::from_arc(Arc::new(Handle(cell)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn capped(clock: &ManualClock, max_keys: usize) -> MemoryBackend<ManualClock> {
    MemoryBackend::builder().clock(clock.clone()).max_keys(max_keys).build().unwrap()
}

/// 100 tokens, one back per second: after taking `n`, the key's state expires in `n` seconds.
fn bucket() -> RuleSet {
    RuleSet::new([Rule::token_bucket(100, 1, Period::SECOND)]).unwrap()
}

fn take(backend: &MemoryBackend<ManualClock>, key: &str, cost: u64) -> u64 {
    let decision = backend.execute_now(key, &bucket(), Operation::Check { cost }).unwrap();
    assert!(decision.allowed(), "{key}: {decision:?}");
    decision.remaining()
}

#[test]
fn a_new_key_past_the_cap_evicts_the_soonest_expiring_one() {
    let clock = ManualClock::at_wall_clock_second();
    let counters = Counters::default();
    metrics::with_local_recorder(&counters, || {
        let backend = capped(&clock, MIN_MAX_KEYS);
        assert_eq!(backend.max_keys(), MIN_MAX_KEYS);
        // Key i takes 64 - i tokens, so key 63 expires soonest (in 1 s) and key 0 last (64 s).
        for i in 0..MIN_MAX_KEYS {
            take(&backend, &format!("k{i}"), (MIN_MAX_KEYS - i) as u64);
        }
        assert_eq!((backend.len(), backend.evictions()), (MIN_MAX_KEYS, 0));

        // The newcomer takes everything: it expires last (in 100 s).
        take(&backend, "newcomer", 100);
        assert_eq!(backend.len(), MIN_MAX_KEYS);
        assert_eq!(backend.evictions(), 1);
        assert_eq!(counters.get(&format!("{EVICTIONS_METRIC}{{backend=memory}}")), 1);

        // Every other key kept its exact count (a cost of 0 only looks).
        for i in 0..MIN_MAX_KEYS - 1 {
            let left =
                backend.execute_now(&format!("k{i}"), &bucket(), Operation::Check { cost: 0 }).unwrap();
            assert_eq!(left.remaining(), 100 - (MIN_MAX_KEYS - i) as u64, "k{i}");
        }
        // k63 was forgotten: it starts full, and coming back evicts the next soonest, k62.
        assert_eq!(take(&backend, "k63", 1), 99);
        assert_eq!(backend.evictions(), 2);
        assert_eq!(counters.get(&format!("{EVICTIONS_METRIC}{{backend=memory}}")), 2);
        assert_eq!(take(&backend, "k62", 1), 99, "k62 was evicted too");
        let newcomer = backend.execute_now("newcomer", &bucket(), Operation::Check { cost: 0 }).unwrap();
        assert_eq!(newcomer.remaining(), 0);
        assert_eq!(backend.len(), MIN_MAX_KEYS);
    });
}

#[test]
fn a_key_whose_state_lives_longer_now_is_not_evicted_by_its_old_expiry() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = capped(&clock, MIN_MAX_KEYS);
    for i in 0..MIN_MAX_KEYS {
        take(&backend, &format!("k{i}"), 10 + i as u64);
    }
    // k0 was the soonest to expire (10 s); it takes 80 more and now lasts the longest.
    take(&backend, "k0", 80);
    take(&backend, "newcomer", 1);
    let k0 = backend.execute_now("k0", &bucket(), Operation::Check { cost: 0 }).unwrap();
    assert_eq!(k0.remaining(), 10, "k0 kept its count");
    // k1 (11 s) went instead.
    assert_eq!(take(&backend, "k1", 1), 99);
}

#[test]
fn expired_state_goes_before_live_state() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = capped(&clock, MIN_MAX_KEYS);
    let year = RuleSet::new([Rule::fixed_window(10, Period::from_secs(365 * 86_400).unwrap())]).unwrap();
    for i in 0..MIN_MAX_KEYS - 1 {
        backend.execute_now(&format!("year{i}"), &year, Operation::Check { cost: 1 }).unwrap();
    }
    take(&backend, "brief", 1);
    clock.advance(Duration::from_secs(5)); // "brief" has expired, not yet swept
    for i in 0..3 {
        backend.execute_now(&format!("late{i}"), &year, Operation::Check { cost: 1 }).unwrap();
    }
    // "brief" went first, then the year-long keys that expire soonest (the first ones, at the
    // same window end: the lowest names).
    assert_eq!(backend.evictions(), 3);
    for i in 2..MIN_MAX_KEYS - 1 {
        let d = backend.execute_now(&format!("year{i}"), &year, Operation::Check { cost: 0 }).unwrap();
        assert_eq!(d.remaining(), 9, "year{i}");
    }
}

#[test]
fn a_batch_at_the_cap_keeps_its_own_keys_and_stays_all_or_nothing() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = capped(&clock, MIN_MAX_KEYS);
    // "old" expires soonest of all: a naive eviction for the batch's new keys would take it
    // while the batch holds its state.
    take(&backend, "old", 1);
    for i in 1..MIN_MAX_KEYS {
        take(&backend, &format!("k{i}"), 50);
    }
    let rules = bucket();
    let parts = [Part::new("old", &rules, 5), Part::new("fresh1", &rules, 5), Part::new("fresh2", &rules, 5)];
    let decisions = backend.check_batch_now(&parts).unwrap();
    assert!(decisions.iter().all(|d| d.allowed()));
    assert_eq!(backend.len(), MIN_MAX_KEYS);
    assert_eq!(backend.evictions(), 2);
    let old = backend.execute_now("old", &rules, Operation::Check { cost: 0 }).unwrap();
    assert_eq!(old.remaining(), 94, "the batch's consumption on \"old\" was kept");

    // A batch one of whose parts is denied consumes nothing, at the cap too.
    let parts = [Part::new("fresh3", &rules, 1), Part::new("k5", &rules, 60)];
    let decisions = backend.check_batch_now(&parts).unwrap();
    assert!(!decisions[1].allowed());
    assert_eq!(backend.len(), MIN_MAX_KEYS);
    let k5 = backend.execute_now("k5", &rules, Operation::Check { cost: 0 }).unwrap();
    assert_eq!(k5.remaining(), 50);
}

#[test]
fn a_cap_below_one_batch_is_refused() {
    let err = MemoryBackend::builder().max_keys(MIN_MAX_KEYS - 1).build().unwrap_err();
    assert_eq!(err, MemoryConfigError::MaxKeysTooSmall { max_keys: MIN_MAX_KEYS - 1 });
    assert!(err.to_string().contains("max_keys"), "{err}");
}

#[derive(Debug, Clone)]
enum Step {
    Check { key: u16, cost: u64 },
    Refund { key: u16 },
    Batch { keys: Vec<u16> },
    Reset { key: u16 },
    Advance { millis: u64 },
    Sweep,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..400u16, 0..40u64).prop_map(|(key, cost)| Step::Check { key, cost }),
        1 => (0..400u16).prop_map(|key| Step::Refund { key }),
        2 => prop::collection::vec(0..400u16, 1..20).prop_map(|keys| Step::Batch { keys }),
        1 => (0..400u16).prop_map(|key| Step::Reset { key }),
        2 => (0..3_000u64).prop_map(|millis| Step::Advance { millis }),
        1 => Just(Step::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, cases: 64, ..ProptestConfig::default() })]

    /// Whatever the operations, the keys held never pass the cap, and the key an operation
    /// was for is held after it (the caller's own state is never the one evicted).
    #[test]
    fn the_number_of_keys_never_exceeds_max_keys(
        max_keys in MIN_MAX_KEYS..300,
        steps in prop::collection::vec(step(), 1..400),
    ) {
        let clock = ManualClock::at_wall_clock_second();
        let backend = capped(&clock, max_keys);
        let rules = RuleSet::new([Rule::token_bucket(40, 1, Period::SECOND), Rule::fixed_window(100, Period::MINUTE)]).unwrap();
        for step in steps {
            match step {
                Step::Check { key, cost } => {
                    let key = format!("k{key}");
                    let taken = backend.execute_now(&key, &rules, Operation::Check { cost }).unwrap();
                    if taken.allowed() && cost > 0 {
                        let peek = backend.execute_now(&key, &rules, Operation::Check { cost: 0 }).unwrap();
                        prop_assert_eq!(peek.remaining(), taken.remaining(), "{} lost its state", key);
                    }
                }
                Step::Refund { key } => {
                    backend.execute_now(&format!("k{key}"), &rules, Operation::Refund { amount: 5 }).unwrap();
                }
                Step::Batch { keys } => {
                    let names: Vec<String> = keys.iter().map(|k| format!("k{k}")).collect();
                    let parts: Vec<Part<'_>> = names.iter().map(|k| Part::new(k, &rules, 1)).collect();
                    backend.check_batch_now(&parts).unwrap();
                }
                Step::Reset { key } => backend.reset_now(&format!("k{key}"), &rules).unwrap(),
                Step::Advance { millis } => clock.advance(Duration::from_millis(millis)),
                Step::Sweep => {
                    backend.sweep();
                }
            }
            prop_assert!(backend.len() <= max_keys, "{} keys held, cap {}", backend.len(), max_keys);
        }
    }
}
