//! One rule's run: the traffic replayed through its own engine on a simulated clock, and what
//! it admitted.

use anyhow::Context;
use tollgate_core::{ManualClock, MemoryBackend, Operation, Rule, RuleSet, Timestamp};

use crate::report::RuleRun;
use crate::rules;
use crate::time::SECOND;
use crate::traffic::{Request, Requests, format_micros};

/// Where every rule's simulated clock starts: 2024-01-01T00:00:00Z, a whole number of days
/// since the Unix epoch (each rule then moves on to its next window edge: see [`start_of`]).
const BASE: u64 = 1_704_067_200 * SECOND;

/// Where a rule's clock starts: the first multiple of its period at or after [`BASE`], so that
/// clock-aligned windows start at simulated time 0 (then at every multiple of the period).
pub(crate) fn start_of(rule: &Rule) -> u64 {
    let period = rules::rate(rule).1.as_micros();
    BASE.div_ceil(period) * period
}

/// The most `(time, units)` falling in any span `(t - span, t]`, for times in ascending order.
fn max_in_span(admitted: &[(u64, u64)], span: u64) -> u64 {
    let (mut best, mut sum, mut first) = (0, 0, 0);
    for &(at, units) in admitted {
        sum += units;
        while admitted[first].0 + span <= at {
            sum -= admitted[first].1;
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

/// Replays `requests` through `rule` on its own engine and clock.
pub(crate) fn replay(
    rule: &Rule,
    requests: &Requests,
    bucket: u64,
    buckets: usize,
) -> anyhow::Result<RuleRun> {
    let set = RuleSet::new([rule.clone()]).with_context(|| rules::label(rule))?;
    let start = start_of(rule);
    let clock = ManualClock::new(Timestamp::from_micros(start));
    let engine = MemoryBackend::with_clock(clock.clone());
    let label = rules::label(rule);
    tally(label, rule, requests, bucket, buckets, |request, key| {
        clock.set(Timestamp::from_micros(start + request.at));
        Ok(engine.execute_now(key, &set, Operation::Check { cost: request.cost })?.allowed())
    })
}

/// Runs `requests` through `admits` (whether it admits a request of a key) and counts what it
/// admitted, per bucket and in the rule's spans.
pub(crate) fn tally(
    label: String,
    rule: &Rule,
    requests: &Requests,
    bucket: u64,
    buckets: usize,
    mut admits: impl FnMut(&Request, &str) -> anyhow::Result<bool>,
) -> anyhow::Result<RuleRun> {
    let mut run = RuleRun::new(label, rule, requests.list.len() as u64, buckets);
    let mut admitted_by_key: Vec<Vec<(u64, u64)>> = vec![Vec::new(); requests.keys.len()];
    for request in &requests.list {
        let key = &requests.keys[request.key];
        let admitted = admits(request, key).with_context(|| {
            format!(
                "{}: the request at {} (key {key:?}, cost {})",
                run.label,
                format_micros(request.at),
                request.cost
            )
        })?;
        let at = (request.at / bucket) as usize;
        if admitted {
            run.admitted += 1;
            run.admitted_units += request.cost;
            run.admitted_per_bucket[at] += 1;
            admitted_by_key[request.key].push((request.at, request.cost));
        } else {
            run.denied += 1;
            run.denied_per_bucket[at] += 1;
        }
    }
    let window = rules::rate(rule).1.as_micros();
    run.window_s = window as f64 / SECOND as f64;
    for admitted in &admitted_by_key {
        run.max_admitted_1s = run.max_admitted_1s.max(max_in_span(admitted, SECOND));
        run.max_admitted_window = run.max_admitted_window.max(max_in_span(admitted, window));
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_half_open_and_slide() {
        let s = SECOND;
        let admitted = [(0, 1), (s / 2, 1), (s, 1), (s + 1, 2), (3 * s, 1)];
        // (t - 1s, t]: at 1 s the one at 0 has left; at 1 s + 1 us the ones at 0.5, 1 and 1+ stay.
        assert_eq!(max_in_span(&admitted, s), 4);
        assert_eq!(max_in_span(&admitted, 1), 2);
        assert_eq!(max_in_span(&admitted, 10 * s), 6);
        assert_eq!(max_in_span(&[], s), 0);
    }

    #[test]
    fn each_rule_starts_on_one_of_its_window_edges() {
        use tollgate_core::Period;
        for rule in [
            Rule::fixed_window(1, Period::MINUTE),
            Rule::sliding_window_counter(1, "7s".parse().unwrap()),
            Rule::fixed_window(1, Period::MAX),
        ] {
            let start = start_of(&rule);
            let period = rules::rate(&rule).1.as_micros();
            assert_eq!(start % period, 0, "{rule:?}");
            assert!((BASE..BASE + period).contains(&start));
        }
    }
}
