//! Properties of the algorithms over random traffic (memory backend; the differential test in
//! tollgate-redis holds Redis to the same decisions).

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Clock, ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet};

/// Random traffic: (gap before the request in microseconds, cost).
fn traffic() -> impl Strategy<Value = Vec<(u64, u64)>> {
    proptest::collection::vec(
        (prop_oneof![0u64..2_000, 2_000u64..300_000, 300_000u64..1_500_000], 1u64..=4),
        1..300,
    )
}

/// Runs `traffic` through `rule`; returns (time in us since start, cost) of each admission.
fn admitted(rule: Rule, traffic: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let clock = ManualClock::at_wall_clock_second();
    let start = clock.now().as_micros();
    let backend = MemoryBackend::with_clock(clock.clone());
    let rules = RuleSet::new([rule]).unwrap();
    let mut out = Vec::new();
    for &(gap, cost) in traffic {
        clock.advance(Duration::from_micros(gap));
        if backend.execute_now("k", &rules, Operation::Check { cost }).unwrap().allowed() {
            out.push((clock.now().as_micros() - start, cost));
        }
    }
    out
}

/// Units admitted in `(end - span, end]` for every admission time `end`, the largest.
fn most_in_any(span: u64, admitted: &[(u64, u64)]) -> u64 {
    admitted
        .iter()
        .map(|&(end, _)| admitted.iter().filter(|&&(t, _)| t <= end && t + span > end).map(|&(_, c)| c).sum())
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sliding_log_never_exceeds_its_limit_in_any_period(traffic in traffic()) {
        let got = admitted(Rule::sliding_window_log(7, Period::SECOND), &traffic);
        prop_assert!(most_in_any(1_000_000, &got) <= 7);
    }

    #[test]
    fn sliding_counter_stays_within_its_documented_bound(traffic in traffic()) {
        let got = admitted(Rule::sliding_window_counter(7, Period::SECOND), &traffic);
        prop_assert!(most_in_any(1_000_000, &got) < 14, "under 2 x limit in any sliding period");
        // At most the limit within any one clock window (the clock started on a whole second).
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for &(t, c) in &got {
            *per_window.entry(t / 1_000_000).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= 7), "{per_window:?}");
    }

    #[test]
    fn fixed_window_never_exceeds_twice_its_limit(traffic in traffic()) {
        let got = admitted(Rule::fixed_window(7, Period::SECOND), &traffic);
        prop_assert!(most_in_any(1_000_000, &got) <= 14);
    }

    /// GCRA and the token bucket: over any interval of length d, at most
    /// capacity + d / T units (T = period / rate), however the traffic arrives.
    #[test]
    fn rate_rules_admit_at_most_burst_plus_rate(traffic in traffic()) {
        for (rule, capacity, interval) in [
            (Rule::gcra(3, Period::SECOND, 4), 4u64, 1_000_000.0 / 3.0),
            (Rule::token_bucket(5, 7, Period::SECOND), 5, 1_000_000.0 / 7.0),
        ] {
            let got = admitted(rule, &traffic);
            for (i, &(a, _)) in got.iter().enumerate() {
                let mut units = 0;
                for &(b, c) in &got[i..] {
                    units += c;
                    let allowed = capacity as f64 + (b - a) as f64 / interval;
                    prop_assert!(units as f64 <= allowed + 1e-9, "{units} units in {}us", b - a);
                }
            }
        }
    }
}
