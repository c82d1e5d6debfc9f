//! Nanoseconds per decision of the memory backend, per algorithm, on 1 and 2 threads, with
//! governor's keyed limiter (a GCRA on DashMap) measured in the same run for reference.
//!
//! `cargo bench -p tollgate-core --bench memory`; figures go to docs/benchmarks.md.
//! On 2 threads the figure is wall time / decisions, i.e. the inverse of throughput.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime};
use governor::{Quota, RateLimiter};
use tollgate_core::{LeaseId, MemoryBackend, Operation, Period, Rule, RuleSet};

/// Distinct keys cycled through, so the map holds a realistic number of entries.
const KEYS: usize = 16_384;
/// Every rule admits this many per second per key: far above each key's share of the load, so
/// nearly every decision is an admission (the path that writes state).
const PER_SECOND: u64 = 1_000;

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("user:{i}")).collect()
}

fn cases() -> Vec<(&'static str, Rule)> {
    let s = Period::SECOND;
    vec![
        ("fixed_window", Rule::fixed_window(PER_SECOND, s)),
        ("sliding_window_log", Rule::sliding_window_log(PER_SECOND, s)),
        ("sliding_window_counter", Rule::sliding_window_counter(PER_SECOND, s)),
        ("token_bucket", Rule::token_bucket(PER_SECOND, PER_SECOND, s)),
        ("gcra", Rule::gcra(PER_SECOND, s, PER_SECOND)),
    ]
}

/// The key of a thread's `i`-th decision: each thread walks its own stretch of the key space,
/// so threads share no counter (which would bounce a cache line between cores).
fn key(keys: &[String], thread: usize, i: u64) -> &String {
    &keys[(thread * KEYS / 2 + i as usize) % KEYS]
}

/// Runs `op(thread, i)` `iters` times split over `threads` threads; returns the wall time.
fn on_threads(threads: usize, iters: u64, op: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..per_thread {
                    op(t, i);
                }
            });
        }
    });
    start.elapsed()
}

fn bench_threads(group: &mut BenchmarkGroup<'_, WallTime>, threads: usize, keys: &[String]) {
    for (name, rule) in cases() {
        let backend = MemoryBackend::new();
        let rules = RuleSet::new([rule]).unwrap();
        let op = |t: usize, i: u64| {
            black_box(backend.execute_now(key(keys, t, i), &rules, Operation::Check { cost: 1 }).unwrap());
        };
        group.bench_function(name, |b| b.iter_custom(|iters| on_threads(threads, iters, &op)));
    }

    // Concurrency: an acquire and its release, counted as one decision each.
    let backend = MemoryBackend::new();
    let rules = RuleSet::new([Rule::concurrency(100, Period::SECOND)]).unwrap();
    let op = |t: usize, i: u64| {
        let key = key(keys, t, i / 2);
        if i.is_multiple_of(2) {
            let id = LeaseId::random();
            black_box(backend.execute_now(key, &rules, Operation::Acquire { cost: 1, lease: &id }).unwrap());
            let lease = tollgate_core::Lease { id, units: 1 };
            black_box(backend.execute_now(key, &rules, Operation::Release { lease: &lease }).unwrap());
        }
    };
    group.bench_function("concurrency (acquire + release)", |b| {
        b.iter_custom(|iters| on_threads(threads, iters, &op))
    });

    // Five rules of different algorithms in one all-or-nothing check.
    let backend = MemoryBackend::new();
    let rules = RuleSet::new(cases().into_iter().map(|(_, r)| r)).unwrap();
    let op = |t: usize, i: u64| {
        black_box(backend.execute_now(key(keys, t, i), &rules, Operation::Check { cost: 1 }).unwrap());
    };
    group.bench_function("five rules at once", |b| b.iter_custom(|iters| on_threads(threads, iters, &op)));

    // Reference: governor's keyed GCRA with the same quota and keys.
    let limiter = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(PER_SECOND as u32).unwrap()));
    let op = |t: usize, i: u64| {
        let _ = black_box(limiter.check_key(key(keys, t, i)));
    };
    group.bench_function("governor keyed gcra (reference)", |b| {
        b.iter_custom(|iters| on_threads(threads, iters, &op))
    });
}

fn memory(c: &mut Criterion) {
    let keys = keys();
    for threads in [1, 2] {
        let mut group =
            c.benchmark_group(format!("memory/{threads} thread{}", if threads > 1 { "s" } else { "" }));
        group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
        bench_threads(&mut group, threads, &keys);
        group.finish();
    }
}

criterion_group!(benches, memory);
criterion_main!(benches);
