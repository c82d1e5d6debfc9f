//! Differential property test: random sequences of (advance time, rule set, key, operation,
//! cost), and batches of checks, run against the memory backend and the Redis backend on the same explicit clock must
//! give identical decisions and identical errors.
//!
//! Cases: `PROPTEST_CASES` (default 256). A failure prints the shrunk sequence.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate_core::{
    Backend, Error, Lease, LeaseId, ManualClock, MemoryBackend, Operation, Part, Period, Rule, RuleSet,
};
use tollgate_redis::RedisBackend;
use tollgate_testkit::RedisServer;

fn ms(n: u64) -> Period {
    Period::from_millis(n).unwrap()
}

/// Rule sets with small limits and periods from milliseconds to seconds, so random walks hit
/// every branch: window edges, denials, refill, lease expiry, several rules at once.
fn rule_sets() -> Vec<RuleSet> {
    [
        vec![Rule::fixed_window(3, ms(10))],
        vec![Rule::fixed_window(5, ms(1000))],
        vec![Rule::fixed_window_from_first_hit(4, ms(250))],
        vec![Rule::sliding_window_log(4, ms(300))],
        vec![Rule::sliding_window_log(6, ms(2000))],
        vec![Rule::sliding_window_counter(5, ms(300))],
        vec![Rule::sliding_window_counter(7, ms(1000))],
        vec![Rule::token_bucket(4, 3, ms(1000))],
        vec![Rule::token_bucket(6, 7, ms(300))],
        vec![Rule::gcra(10, ms(1000), 3)],
        vec![Rule::gcra(3, ms(700), 1)],
        vec![Rule::concurrency(3, ms(400))],
        vec![
            Rule::fixed_window(6, ms(1000)),
            Rule::sliding_window_log(4, ms(500)),
            Rule::gcra(5, ms(1000), 3),
        ],
        vec![
            Rule::sliding_window_counter(6, ms(700)),
            Rule::token_bucket(5, 2, ms(300)),
            Rule::concurrency(4, ms(900)),
            Rule::fixed_window_from_first_hit(5, ms(400)),
        ],
    ]
    .into_iter()
    .map(|rules| RuleSet::new(rules).unwrap())
    .collect()
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Check {
        set: usize,
        key: usize,
        cost: u64,
    },
    Acquire {
        set: usize,
        key: usize,
        cost: u64,
    },
    Release {
        lease: usize,
    },
    Refund {
        set: usize,
        key: usize,
        amount: u64,
    },
    Reset {
        set: usize,
        key: usize,
    },
    /// Checks of several (set, key, cost, group) at once.
    Batch(Vec<(usize, usize, u64, u32)>),
}

fn step(sets: usize) -> impl Strategy<Value = Step> {
    let advance = prop_oneof![
        Just(0u64),
        1u64..1_000,           // microseconds
        1_000u64..400_000,     // up to 0.4 s
        400_000u64..3_000_000, // past whole windows
    ];
    let target = (0..sets, 0usize..2);
    prop_oneof![
        4 => advance.prop_map(Step::Advance),
        8 => (target.clone(), 0u64..=7).prop_map(|((set, key), cost)| Step::Check { set, key, cost }),
        3 => (target.clone(), 0u64..=4).prop_map(|((set, key), cost)| Step::Acquire { set, key, cost }),
        2 => (0usize..8).prop_map(|lease| Step::Release { lease }),
        1 => (target.clone(), 0u64..=5).prop_map(|((set, key), amount)| Step::Refund { set, key, amount }),
        1 => target.clone().prop_map(|(set, key)| Step::Reset { set, key }),
        3 => proptest::collection::vec((target, 0u64..=3, 0u32..3), 1..6)
            .prop_map(|parts| Step::Batch(parts.into_iter().map(|((s, k), c, g)| (s, k, c, g)).collect())),
    ]
}

fn same<T: PartialEq + std::fmt::Debug>(
    memory: Result<T, Error>,
    redis: Result<T, Error>,
) -> Result<(), String> {
    match (memory, redis) {
        (Ok(m), Ok(r)) if m == r => Ok(()),
        (Err(m), Err(r)) if m.to_string() == r.to_string() => Ok(()),
        (m, r) => Err(format!("memory: {m:?}\nredis:  {r:?}")),
    }
}

#[test]
fn memory_and_redis_decide_alike() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sets = rule_sets();
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256);
    let mut runner = TestRunner::new(Config { cases, ..Config::default() });
    let next_case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&proptest::collection::vec(step(sets.len()), 1..80), |steps| {
            let case = next_case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let clock = ManualClock::at_wall_clock_second();
            let memory = MemoryBackend::with_clock(clock.clone());
            let redis = runtime.block_on(async {
                RedisBackend::builder(server.url())
                    .clock(clock.clone())
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap()
            });
            let key = |k: usize| format!("case{case}:key{k}");
            let mut leases: Vec<(usize, usize, Lease)> = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                let outcome = runtime.block_on(async {
                    match *step {
                        Step::Advance(micros) => {
                            clock.advance(Duration::from_micros(micros));
                            Ok(())
                        }
                        Step::Check { set, key: k, cost } => {
                            let op = Operation::Check { cost };
                            same(
                                memory.execute(&key(k), &sets[set], op).await,
                                redis.execute(&key(k), &sets[set], op).await,
                            )
                        }
                        Step::Acquire { set, key: k, cost } => {
                            let id = LeaseId::random();
                            let op = Operation::Acquire { cost, lease: &id };
                            let m = memory.execute(&key(k), &sets[set], op).await;
                            let admitted = matches!(&m, Ok(d) if d.allowed() && cost > 0);
                            let r = redis.execute(&key(k), &sets[set], op).await;
                            if admitted {
                                leases.push((set, k, Lease { id, units: cost }));
                            }
                            same(m, r)
                        }
                        Step::Release { lease } if lease < leases.len() => {
                            let (set, k, ref lease) = leases[lease];
                            let op = Operation::Release { lease };
                            same(
                                memory.execute(&key(k), &sets[set], op).await,
                                redis.execute(&key(k), &sets[set], op).await,
                            )
                        }
                        Step::Release { .. } => Ok(()),
                        Step::Refund { set, key: k, amount } => {
                            let op = Operation::Refund { amount };
                            same(
                                memory.execute(&key(k), &sets[set], op).await,
                                redis.execute(&key(k), &sets[set], op).await,
                            )
                        }
                        Step::Batch(ref parts) => {
                            let keys: Vec<String> = parts.iter().map(|&(_, k, _, _)| key(k)).collect();
                            let batch: Vec<Part<'_>> = parts
                                .iter()
                                .zip(&keys)
                                .map(|(&(set, _, cost, group), k)| {
                                    Part::new(k, &sets[set], cost).in_group(group)
                                })
                                .collect();
                            same(memory.check_batch(&batch).await, redis.check_batch(&batch).await)
                        }
                        Step::Reset { set, key: k } => {
                            memory.reset(&key(k), &sets[set]).await.unwrap();
                            redis.reset(&key(k), &sets[set]).await.unwrap();
                            Ok(())
                        }
                    }
                });
                outcome.map_err(|e| TestCaseError::fail(format!("step {i} ({step:?}) differs:\n{e}")))?;
            }
            Ok(())
        })
        .unwrap();
}
