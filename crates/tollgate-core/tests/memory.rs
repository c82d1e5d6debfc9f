//! Memory-backend specifics: bounded memory under key churn (exactness under threads: tollgate-testkit's tests/memory_conformance.rs).

use std::time::Duration;

use tollgate_core::{ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet};

#[test]
fn memory_stays_bounded_under_key_churn() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = MemoryBackend::with_clock(clock.clone());
    let rules = RuleSet::new([
        Rule::fixed_window(10, Period::SECOND),
        Rule::sliding_window_log(5, Period::SECOND),
        Rule::gcra(10, Period::SECOND, 5),
    ])
    .unwrap();
    // 200,000 one-off keys over 200 s of simulated time, 1,000 new keys per second.
    let mut most = 0;
    for i in 0..200_000u64 {
        let key = format!("visitor:{i}");
        assert!(backend.execute_now(&key, &rules, Operation::Check { cost: 1 }).unwrap().allowed());
        clock.advance(Duration::from_millis(1));
        most = most.max(backend.len());
    }
    // States expire 1 s after their key's request; sweeps run every simulated second.
    assert!(most <= 2_000, "held up to {most} keys");
    clock.advance(Duration::from_secs(2));
    assert_eq!(backend.sweep(), 0);
}

#[test]
fn expired_state_is_swept_and_live_state_is_kept() {
    let clock = ManualClock::at_wall_clock_second();
    let backend = MemoryBackend::with_clock(clock.clone());
    let short = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
    let long = RuleSet::new([Rule::fixed_window(1, Period::HOUR)]).unwrap();
    backend.execute_now("short", &short, Operation::Check { cost: 1 }).unwrap();
    backend.execute_now("long", &long, Operation::Check { cost: 1 }).unwrap();
    backend.execute_now("both", &short, Operation::Check { cost: 1 }).unwrap();
    backend.execute_now("both", &long, Operation::Check { cost: 1 }).unwrap();
    // A peek at a key with no state leaves nothing that outlives the next sweep.
    backend.execute_now("peeked", &long, Operation::Check { cost: 0 }).unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.sweep(), 2);
    // "both" kept its live hourly state.
    assert!(!backend.execute_now("both", &long, Operation::Check { cost: 1 }).unwrap().allowed());
    assert!(backend.execute_now("both", &short, Operation::Check { cost: 1 }).unwrap().allowed());
    clock.advance(Duration::from_secs(3600));
    assert_eq!(backend.sweep(), 0);
}
