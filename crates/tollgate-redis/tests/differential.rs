//! Differential property test: random sequences of (advance time, rule set, key, operation,
//! cost), and batches of checks, run against the memory backend, the Redis backend (the Lua
//! twins) and `script::execute` over an in-process store (the Rust engine as the Redis module
//! runs it), on the same explicit clock, must give identical decisions and identical errors.
//!
//! The first test also runs the Redis backend on the Tollgate Redis module's engine. A second
//! test has the Lua twins, the module and `execute` (over the same Redis, command by command)
//! take turns at random on the same keys: each must read what the others wrote, so the
//! sequence still decides as the memory backend does.
//!
//! Cases: `PROPTEST_CASES` (default 256). A failure prints the shrunk sequence.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate_core::{
    Backend, Decision, Lease, LeaseId, ManualClock, MemoryBackend, Operation, Part, Period, Rule, RuleSet,
};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::{RedisServer, RedisStore, ScriptBackend};

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

/// A step's answer: its decisions, or its error as text (errors are compared by message).
type Answer = Result<Vec<Decision>, String>;

/// Runs `step` on `backend`; `lease` is the lease a release gives back, `id` the one an acquire
/// takes.
async fn answer(
    backend: &dyn Backend,
    sets: &[RuleSet],
    key: &dyn Fn(usize) -> String,
    step: &Step,
    id: &LeaseId,
    lease: Option<&(usize, usize, Lease)>,
) -> Option<Answer> {
    let one = |r: Result<Decision, tollgate_core::Error>| Some(r.map(|d| vec![d]).map_err(|e| e.to_string()));
    match *step {
        Step::Advance(_) => None,
        Step::Check { set, key: k, cost } => {
            one(backend.execute(&key(k), &sets[set], Operation::Check { cost }).await)
        }
        Step::Acquire { set, key: k, cost } => {
            one(backend.execute(&key(k), &sets[set], Operation::Acquire { cost, lease: id }).await)
        }
        Step::Release { .. } => {
            let (set, k, lease) = lease?;
            one(backend.execute(&key(*k), &sets[*set], Operation::Release { lease }).await)
        }
        Step::Refund { set, key: k, amount } => {
            one(backend.execute(&key(k), &sets[set], Operation::Refund { amount }).await)
        }
        Step::Batch(ref parts) => {
            let keys: Vec<String> = parts.iter().map(|&(_, k, _, _)| key(k)).collect();
            let batch: Vec<Part<'_>> = parts
                .iter()
                .zip(&keys)
                .map(|(&(set, _, cost, group), k)| Part::new(k, &sets[set], cost).in_group(group))
                .collect();
            Some(backend.check_batch(&batch).await.map_err(|e| e.to_string()))
        }
        Step::Reset { set, key: k } => {
            backend.reset(&key(k), &sets[set]).await.unwrap();
            None
        }
    }
}

/// Runs random sequences: each step on the memory backend and on those of the backends `others`
/// makes that `pick` picks for it (by their number and the step's random choice), whose
/// answers must all be the memory's.
fn run_sequences(
    runtime: &tokio::runtime::Runtime,
    others: impl Fn(&ManualClock, u64) -> Vec<Box<dyn Backend>>,
    pick: impl Fn(usize, u8) -> bool,
) {
    let sets = rule_sets();
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256);
    let mut runner = TestRunner::new(Config { cases, ..Config::default() });
    let next_case = std::sync::atomic::AtomicU64::new(0);
    let steps = proptest::collection::vec((step(sets.len()), any::<u8>()), 1..80);
    runner
        .run(&steps, |steps| {
            let case = next_case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let clock = ManualClock::at_wall_clock_second();
            let memory = MemoryBackend::with_clock(clock.clone());
            let others = others(&clock, case);
            let key = |k: usize| format!("case{case}:key{k}");
            let mut leases: Vec<(usize, usize, Lease)> = Vec::new();
            for (i, (step, choice)) in steps.iter().enumerate() {
                if let Step::Advance(micros) = *step {
                    clock.advance(Duration::from_micros(micros));
                }
                let id = LeaseId::random();
                let lease = match *step {
                    Step::Release { lease } => leases.get(lease).cloned(),
                    _ => None,
                };
                let expected = runtime.block_on(answer(&memory, &sets, &key, step, &id, lease.as_ref()));
                for (n, other) in others.iter().enumerate() {
                    if !pick(n, *choice) {
                        continue;
                    }
                    let got = runtime.block_on(answer(other.as_ref(), &sets, &key, step, &id, lease.as_ref()));
                    if got != expected {
                        return Err(TestCaseError::fail(format!(
                            "step {i} ({step:?}) differs on backend {n}:\nmemory: {expected:?}\nother:  {got:?}"
                        )));
                    }
                }
                if let (Step::Acquire { set, key: k, cost }, Some(Ok(d))) = (step, &expected)
                    && *cost > 0
                    && d[0].allowed()
                {
                    leases.push((*set, *k, Lease { id, units: *cost }));
                }
            }
            Ok(())
        })
        .unwrap();
}

fn redis_backend(server: &RedisServer, clock: &ManualClock, engine: Engine) -> RedisBackend {
    RedisBackend::builder(server.url())
        .engine(engine)
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[test]
fn memory_lua_module_and_execute_decide_alike() {
    let lua_server = RedisServer::start();
    let module_server = RedisServer::with_module(&[]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let others = |clock: &ManualClock, _| -> Vec<Box<dyn Backend>> {
        let lua = runtime.block_on(async { redis_backend(&lua_server, clock, Engine::Lua) });
        let module = runtime.block_on(async { redis_backend(&module_server, clock, Engine::Module) });
        vec![Box::new(lua), Box::new(module), Box::new(ScriptBackend::with_clock(clock.clone()))]
    };
    run_sequences(&runtime, others, |_, _| true);
}

#[test]
fn lua_module_and_execute_take_turns_on_the_same_keys() {
    let server = RedisServer::with_module(&[]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let others = |clock: &ManualClock, _| -> Vec<Box<dyn Backend>> {
        let lua = runtime.block_on(async { redis_backend(&server, clock, Engine::Lua) });
        let module = runtime.block_on(async { redis_backend(&server, clock, Engine::Module) });
        let naming = runtime.block_on(async { redis_backend(&server, clock, Engine::Lua) });
        let store = RedisStore::open(&server.url());
        let execute = ScriptBackend::with_store(
            clock.clone(),
            store,
            Box::new(move |key: &str, rules: &RuleSet| naming.state_keys(key, rules)),
        );
        vec![Box::new(lua), Box::new(module), Box::new(execute)]
    };
    // Each step on one of the three, at random.
    run_sequences(&runtime, others, |n, choice| n == usize::from(choice % 3));
    // Whoever wrote a key gave it a TTL (-1: none; -2: expired since KEYS listed it).
    let keys: Vec<String> = server.command(&["KEYS", "*"]);
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = server.command(&["PTTL", &key]);
        assert!(ttl != -1, "{key} has no TTL");
    }
}
