//! Edges of the engine that the shared scenarios do not reach, written against the memory
//! backend's public API: state that has expired is no state, exactness at the largest rates,
//! and what a clock set back finds. Many of these cases were found by `scripts/mutants` (a
//! change to the engine these tests did not notice); each asserts what the algorithm's
//! definition says, not what the code happened to do.

use std::time::Duration;

use tollgate_core::{
    Decision, LeaseId, ManualClock, MemoryBackend, Operation, Period, Rule, RuleOutcome, RuleReport, RuleSet,
    Timestamp,
};
use tollgate_testkit::conformance::one_of_each;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn set(rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new(rules).unwrap()
}

/// A backend on a clock stopped at a whole wall-clock second, and that clock.
fn backend() -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::at_wall_clock_second();
    (MemoryBackend::with_clock(clock.clone()), clock)
}

fn at(clock: &ManualClock, micros: u64) {
    clock.set(Timestamp::from_micros(micros));
}

fn now(clock: &ManualClock) -> u64 {
    tollgate_core::Clock::now(clock).as_micros()
}

/// Takes `cost` units: acquires them when the rules hold a concurrency rule, checks otherwise.
fn take(backend: &MemoryBackend<ManualClock>, key: &str, rules: &RuleSet, cost: u64) -> Decision {
    let id = LeaseId::random();
    let op = if rules.has_concurrency() && cost > 0 {
        Operation::Acquire { cost, lease: &id }
    } else {
        Operation::Check { cost }
    };
    backend.execute_now(key, rules, op).unwrap()
}

fn peek(backend: &MemoryBackend<ManualClock>, key: &str, rules: &RuleSet) -> Decision {
    backend.execute_now(key, rules, Operation::Check { cost: 0 }).unwrap()
}

/// A state that has expired is the same as no state, for every algorithm: once an operation
/// has seen it (refreshed it to now), nothing of it is left, so a clock set back afterwards
/// finds a fresh key, and a sweep holds nothing. (A sweep would drop it anyway; this is about
/// the state itself. Periods of 100 ms keep every step before the first sweep is due, 1 s in.)
#[test]
fn expired_state_once_seen_is_gone_even_if_the_clock_steps_back() {
    for rule in one_of_each(3, Period::from_millis(100).unwrap()) {
        let (backend, clock) = backend();
        let rules = set([rule.clone()]);
        let start = now(&clock);
        assert!(take(&backend, "k", &rules, 3).allowed(), "{rule:?}");
        // Every state has expired 200 ms on (the sliding counter's once its window has slid
        // wholly past: two clock windows).
        clock.advance(ms(300));
        let d = peek(&backend, "k", &rules);
        assert_eq!((d.remaining(), d.reset_after()), (3, Duration::ZERO), "{rule:?}");
        at(&clock, start + 50_000);
        let d = peek(&backend, "k", &rules);
        assert_eq!(
            (d.remaining(), d.reset_after()),
            (3, Duration::ZERO),
            "{rule:?}: the old state came back"
        );
        assert_eq!(backend.sweep(), 0, "{rule:?}");
    }
}

/// A refund that fills the bucket again leaves no state (GCRA's theoretical arrival time is
/// "now or earlier": the bucket is full), so a clock set back finds it full.
#[test]
fn a_bucket_refunded_to_full_is_no_state() {
    for rules in [set([Rule::gcra(10, Period::SECOND, 3)]), set([Rule::token_bucket(3, 10, Period::SECOND)])]
    {
        let (backend, clock) = backend();
        let start = now(&clock);
        assert_eq!(take(&backend, "k", &rules, 2).remaining(), 1);
        let d = backend.execute_now("k", &rules, Operation::Refund { amount: 2 }).unwrap();
        assert_eq!((d.remaining(), d.reset_after()), (3, Duration::ZERO));
        at(&clock, start - 50_000);
        let d = peek(&backend, "k", &rules);
        assert_eq!((d.remaining(), d.reset_after()), (3, Duration::ZERO));
    }
}

/// The emission interval is kept as a reduced fraction: a trillion tokens refilled at a
/// million a second is one token a microsecond, exact (unreduced, a trillion times a million
/// would pass the 2^53 that exact arithmetic is held to, and the rule would be refused).
#[test]
fn the_largest_buckets_at_whole_microsecond_rates_are_exact() {
    const TRILLION: u64 = 1_000_000_000_000;
    let rules = [
        Rule::token_bucket(TRILLION, 1_000_000, Period::SECOND),
        Rule::gcra(1_000_000, Period::SECOND, TRILLION),
        Rule::token_bucket(TRILLION, 2_000_000, "2s".parse().unwrap()),
    ];
    for rule in rules {
        let (backend, clock) = backend();
        let rules = RuleSet::new([rule.clone()]).unwrap_or_else(|e| panic!("{rule:?}: {e}"));
        let d = take(&backend, "k", &rules, TRILLION);
        assert!(d.allowed(), "{rule:?}");
        assert_eq!((d.remaining(), d.reset_after()), (0, Duration::from_secs(1_000_000)), "{rule:?}");
        clock.advance(Duration::from_micros(1_234_567));
        let d = peek(&backend, "k", &rules);
        assert_eq!(d.remaining(), 1_234_567, "{rule:?}");
        assert_eq!(d.reset_after(), Duration::from_micros(TRILLION - 1_234_567), "{rule:?}");
    }
}

/// Outcomes another decider reported (a remote Tollgate server) take the rules' names,
/// algorithms and limits from the set; a wait is reported only on a denial, rounded up to
/// whole microseconds, and never below one on a denial; one report per rule or no decision.
#[test]
fn reported_outcomes_are_completed_from_the_rule_set() {
    let rules =
        set([Rule::fixed_window(5, Period::SECOND), Rule::gcra(10, Period::SECOND, 3).named("burst")]);
    let (reset, retry) = (ms(300), ms(100));
    let report =
        |allowed, remaining, retry_after| RuleReport { allowed, remaining, reset_after: reset, retry_after };
    let d = Decision::from_reports(&rules, [report(true, 4, retry), report(false, 0, retry)]).unwrap();
    let [admitted, denied]: [RuleOutcome; 2] = d.outcomes(&rules).collect::<Vec<_>>().try_into().unwrap();
    assert_eq!(denied.name(), Some("burst"));
    assert_eq!(denied.algorithm().to_string(), "gcra");
    assert_eq!((denied.allowed(), denied.limit(), denied.remaining()), (false, 3, 0));
    assert_eq!((denied.reset_after(), denied.retry_after()), (reset, retry));
    assert_eq!((admitted.name(), admitted.algorithm().to_string()), (None, "fixed_window".to_string()));
    assert_eq!((admitted.allowed(), admitted.limit(), admitted.remaining()), (true, 5, 4));
    assert_eq!((admitted.reset_after(), admitted.retry_after()), (reset, Duration::ZERO));
    assert!(!d.allowed());
    assert_eq!((d.binding_index(), d.retry_after()), (1, retry));
    let d =
        Decision::from_reports(&rules, [report(true, 4, retry), report(false, 0, Duration::from_nanos(1))]);
    assert_eq!(d.map(|d| d.retry_after()), Some(Duration::from_micros(1)));
    let d = Decision::from_reports(&rules, [report(true, 4, retry), report(false, 0, Duration::ZERO)]);
    assert_eq!(d.map(|d| (d.allowed(), d.retry_after())), Some((false, Duration::from_micros(1))));
    assert!(Decision::from_reports(&rules, [report(true, 0, retry)]).is_none());
    assert!(Decision::from_reports(&rules, [report(true, 0, retry); 3]).is_none());
}

/// Sweeping drops only state that has expired, for every algorithm: a backend swept before
/// every operation decides exactly as one swept only on its own schedule (once a second).
#[test]
fn sweeps_never_change_a_decision() {
    for rule in one_of_each(5, Period::from_millis(700).unwrap()) {
        let clock = ManualClock::at_wall_clock_second();
        let swept = MemoryBackend::with_clock(clock.clone());
        let reference = MemoryBackend::with_clock(clock.clone());
        let rules = set([rule.clone()]);
        let costs = [2u64, 0, 1, 3, 0, 0, 2, 5, 1, 0, 4, 0, 0, 0, 1, 2, 0, 3, 0, 0, 0, 0, 0, 1];
        for (step, cost) in costs.into_iter().enumerate() {
            swept.sweep();
            let (got, want) = (take(&swept, "k", &rules, cost), take(&reference, "k", &rules, cost));
            assert_eq!(got, want, "{rule:?}, step {step}");
            clock.advance(ms(130));
        }
    }
}

/// `is_empty` and `len` count the keys holding state, expired state included until a sweep.
#[test]
fn a_backend_counts_the_keys_it_holds() {
    let (backend, clock) = backend();
    assert!(backend.is_empty());
    assert_eq!(backend.len(), 0);
    let rules = set([Rule::fixed_window(3, Period::SECOND)]);
    take(&backend, "a", &rules, 1);
    take(&backend, "b", &rules, 1);
    assert!(!backend.is_empty());
    assert_eq!(backend.len(), 2);
    clock.advance(ms(1000));
    assert_eq!(backend.len(), 2, "expired, not yet swept");
    assert_eq!(backend.sweep(), 0);
    assert!(backend.is_empty());
}

/// The cap holds exactly `max_keys` keys however it is split among the shards (here 1,001,
/// which no power-of-two number of shards divides): once every shard is full, the backend
/// holds `max_keys` keys, not one fewer or more.
#[test]
fn a_full_backend_holds_exactly_max_keys() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = MemoryBackend::builder().clock(clock).max_keys(1_001).build().unwrap();
    let rules = set([Rule::fixed_window(1, Period::HOUR)]);
    // Keys land in shards by a seeded hash: 20,000 fill every shard many times over.
    for i in 0..20_000 {
        take(&backend, &format!("k{i}"), &rules, 1);
    }
    assert_eq!(backend.len(), 1_001);
    assert_eq!(backend.evictions(), 20_000 - 1_001);
}
