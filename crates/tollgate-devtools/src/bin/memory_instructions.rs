//! Runs `n` memory-backend decisions of one shape, for `scripts/bench-memory-instructions` to
//! count their instructions under callgrind (a figure that repeats on a noisy machine, where
//! wall-clock time does not).
//!
//! `memory_instructions <fixed_window|gcra|sliding_window_log|concurrency|five_rules|governor> <n>`
//!
//! `governor` is the reference of issue 19's targets: governor's keyed limiter (a GCRA on a
//! DashMap) with the same keys, every decision admitted as Tollgate's are, counted by the same
//! harness so the ratios hold.
//!
//! The decisions run inside `decisions_*` functions, which the script has callgrind count alone
//! (`--toggle-collect`): set-up, such as governor's clock calibrating itself for a time that
//! varies from run to run, stays out of the figure.

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate_core::{Lease, LeaseId, MemoryBackend, Operation, Period, Rule, RuleSet};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [shape, n] = args.as_slice() else {
        return Err("usage: memory_instructions <shape> <decisions>".into());
    };
    let n: usize = n.parse()?;
    // Keys made before the decisions, so that both runs of the script pay the same setup.
    let keys: Vec<String> = (0..16_384).map(|i| format!("user:{i}")).collect();
    if shape == "governor" {
        let per_second = NonZeroU32::new(1000).ok_or("a zero quota")?;
        let limiter = RateLimiter::keyed(Quota::per_second(per_second));
        decisions_governor(&limiter, &keys, n);
        return Ok(());
    }
    // Periods of an hour, so that no state expires during a count: under valgrind a key comes
    // round again only after a second or more, and a state of a one-second rule would expire
    // in between, be swept and be made again (a cost a real run at full speed pays about once
    // per key per second, not once per visit). Every decision of a count is admitted, as
    // governor's are; the algorithms' work does not depend on the rate. (A concurrency rule's
    // state is empty after each release whatever its lease: it keeps the one-second lease it
    // was counted with before.)
    let s = Period::HOUR;
    let rules = RuleSet::new(match shape.as_str() {
        "fixed_window" => vec![Rule::fixed_window(1000, s)],
        "gcra" => vec![Rule::gcra(1000, s, 1000)],
        "sliding_window_log" => vec![Rule::sliding_window_log(1000, s)],
        "concurrency" => vec![Rule::concurrency(100, Period::SECOND)],
        "five_rules" => vec![
            Rule::fixed_window(1000, s),
            Rule::sliding_window_log(1000, s),
            Rule::sliding_window_counter(1000, s),
            Rule::token_bucket(1000, 1000, s),
            Rule::gcra(1000, s, 1000),
        ],
        other => return Err(format!("unknown shape {other:?}").into()),
    })?;
    let backend = MemoryBackend::new();
    decisions_tollgate(&backend, &rules, &keys, n)
}

/// Governor's decisions (counted by the script).
#[inline(never)]
fn decisions_governor(limiter: &DefaultKeyedRateLimiter<String>, keys: &[String], n: usize) {
    for i in 0..n {
        let _ = std::hint::black_box(limiter.check_key(&keys[i % keys.len()]));
    }
}

/// Tollgate's decisions (counted by the script).
#[inline(never)]
fn decisions_tollgate(
    backend: &MemoryBackend,
    rules: &RuleSet,
    keys: &[String],
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    for i in 0..n {
        let key = &keys[i % keys.len()];
        if rules.has_concurrency() {
            // A lease taken and given back: one decision of a concurrency rule's life.
            let id = LeaseId::random();
            std::hint::black_box(backend.execute_now(
                key,
                rules,
                Operation::Acquire { cost: 1, lease: &id },
            )?);
            let lease = Lease { id, units: 1 };
            std::hint::black_box(backend.execute_now(key, rules, Operation::Release { lease: &lease })?);
        } else {
            std::hint::black_box(backend.execute_now(key, rules, Operation::Check { cost: 1 })?);
        }
    }
    Ok(())
}
