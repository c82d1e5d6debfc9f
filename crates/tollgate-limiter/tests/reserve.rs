//! Quota reservations: several limiters (instances) sharing one memory backend and one manual
//! clock. Never over the limit (a property test over traffic, instance counts and block caps,
//! for each rule kind that takes reservations), bounded under-admission, cold keys on the
//! plain path, blocks answering through an outage, and units given back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use tollgate_core::{
    Backend, BatchPlan, Decision, Error, ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet,
    Timestamp,
};
use tollgate_limiter::reserve::{HOT_HITS, SWEEP_EVERY};
use tollgate_limiter::{Check, FailurePolicy, Limiter, LimiterSettings, Policy, Reserve};

/// The shared backend: a memory backend on the manual clock, counting calls, failing on demand.
struct Shared {
    inner: MemoryBackend<ManualClock>,
    calls: AtomicU64,
    down: AtomicBool,
    /// Yield before answering, so that concurrent checks interleave as they do over a network.
    yields: AtomicBool,
    /// What heartbeats answer; heartbeats sent.
    instances: AtomicU64,
    heartbeats: AtomicU64,
}

#[async_trait]
impl Backend for Shared {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.yields.load(Ordering::Relaxed) {
            tokio::task::yield_now().await;
        }
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable("down".into()));
        }
        self.inner.execute_now(key, rules, op)
    }
    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.yields.load(Ordering::Relaxed) {
            tokio::task::yield_now().await;
        }
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable("down".into()));
        }
        self.inner.check_planned_now(batch)
    }
    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.inner.reset_now(key, rules)
    }
    async fn heartbeat(&self, _key: &str, _instance: &str, _window: Duration) -> Result<u64, Error> {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
        Ok(self.instances.load(Ordering::Relaxed))
    }
}

struct World {
    clock: ManualClock,
    backend: Arc<Shared>,
    limiters: Vec<Limiter>,
}

impl World {
    fn new(instances: usize) -> World {
        // On a minute boundary, so clock-aligned windows start with the test.
        let clock = ManualClock::new(Timestamp::from_micros(1_700_000_040_000_000));
        let backend = Arc::new(Shared {
            inner: MemoryBackend::with_clock(clock.clone()),
            calls: AtomicU64::new(0),
            down: AtomicBool::new(false),
            yields: AtomicBool::new(false),
            instances: AtomicU64::new(1),
            heartbeats: AtomicU64::new(0),
        });
        let settings = LimiterSettings { on_failure: FailurePolicy::Closed, ..LimiterSettings::default() };
        let limiters = (0..instances)
            .map(|_| Limiter::with_clock(backend.clone(), "shared", settings.clone(), clock.clone()))
            .collect();
        World { clock, backend, limiters }
    }

    fn now(&self) -> u64 {
        use tollgate_core::Clock;
        self.clock.now().as_micros()
    }

    fn held(&self) -> u64 {
        self.limiters.iter().map(|l| l.reserve_stats().held).sum()
    }
}

fn policy(rule: Rule, reserve: Reserve) -> Policy {
    Policy::enforce("hot", RuleSet::new([rule]).unwrap()).with_reserve(reserve).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Fixed { limit: u64 },
    Bucket { capacity: u64, refill: u64 },
    Gcra { limit: u64, burst: u64 },
}

impl Kind {
    fn rule(self) -> Rule {
        match self {
            Kind::Fixed { limit } => Rule::fixed_window(limit, Period::SECOND),
            Kind::Bucket { capacity, refill } => Rule::token_bucket(capacity, refill, Period::SECOND),
            Kind::Gcra { limit, burst } => Rule::gcra(limit, Period::SECOND, burst),
        }
    }

    /// Checks the admissions (time in µs from the start, units) against the rule's bound:
    /// per one-second window for a fixed window; for a bucket and GCRA (full at the start),
    /// what they allow from the start to every admission.
    fn check(self, admitted: &[(u64, u64)]) -> Result<(), String> {
        let second = 1_000_000u128;
        let mut total = 0u128;
        let mut window = (u64::MAX, 0u128);
        for &(t, units) in admitted {
            total += u128::from(units);
            let t128 = u128::from(t);
            match self {
                Kind::Fixed { limit } => {
                    let w = t / 1_000_000;
                    window = if w == window.0 {
                        (w, window.1 + u128::from(units))
                    } else {
                        (w, u128::from(units))
                    };
                    if window.1 > u128::from(limit) {
                        return Err(format!("window {w}: {} admitted, limit {limit}", window.1));
                    }
                }
                Kind::Bucket { capacity, refill } => {
                    if total * second > u128::from(capacity) * second + u128::from(refill) * t128 {
                        return Err(format!(
                            "{total} admitted by {t} µs: over capacity {capacity} + {refill}/s"
                        ));
                    }
                }
                Kind::Gcra { limit, burst } => {
                    if total * second > u128::from(burst) * second + u128::from(limit) * t128 {
                        return Err(format!("{total} admitted by {t} µs: over burst {burst} + {limit}/s"));
                    }
                }
            }
        }
        Ok(())
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (1u64..400).prop_map(|limit| Kind::Fixed { limit }),
        (1u64..400, 1u64..400).prop_map(|(capacity, refill)| Kind::Bucket { capacity, refill }),
        (1u64..400, 1u64..400).prop_map(|(limit, burst)| Kind::Gcra { limit, burst }),
    ]
}

fn reserve() -> impl Strategy<Value = Reserve> {
    prop_oneof![Just(Reserve::Auto), (1u64..100).prop_map(Reserve::Max)]
}

/// Traffic: (instance, cost, microseconds to advance first), in bursts and lulls.
fn traffic() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    prop::collection::vec((0usize..8, 1u64..4, prop_oneof![8 => 0u64..2_000, 1 => 0u64..1_500_000]), 1..600)
}

/// Runs `traffic` through `instances` limiters; returns the admissions (µs from the start,
/// units) and, per admission, nothing else: the bound is checked by the caller.
async fn run(world: &World, policy: &Policy, traffic: &[(usize, u64, u64)]) -> Vec<(u64, u64)> {
    let start = world.now();
    let mut admitted = Vec::new();
    for &(instance, cost, advance) in traffic {
        world.clock.advance(Duration::from_micros(advance));
        let limiter = &world.limiters[instance % world.limiters.len()];
        let verdict = match limiter.check("k", policy, cost).await {
            Ok(verdict) => verdict,
            // A cost above the rule's capacity is refused as input.
            Err(tollgate_limiter::LimitError::Invalid(_)) => continue,
            Err(e) => panic!("{e}"),
        };
        if verdict.allowed() {
            admitted.push((world.now() - start, cost));
        }
        // Let a sweep's refunds (spawned) run.
        tokio::task::yield_now().await;
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// N instances on one backend never admit more than the rule allows, whatever the traffic,
    /// the number of instances and the cap on blocks; the plain path (reserve off) is checked
    /// against the same bound, so the bound is the rule's own.
    #[test]
    fn never_over_the_limit(kind in kind(), instances in 1usize..6, reserve in reserve(), traffic in traffic()) {
        let rt = runtime();
        let (with, plain) = rt.block_on(async {
            let with = run(&World::new(instances), &policy(kind.rule(), reserve), &traffic).await;
            let plain = run(&World::new(instances), &policy(kind.rule(), Reserve::Off), &traffic).await;
            (with, plain)
        });
        prop_assert_eq!(kind.check(&plain), Ok(()), "the bound is wrong: the plain path breaks it");
        prop_assert_eq!(kind.check(&with), Ok(()));
    }
}

/// How a check of the batch property test is sent.
#[derive(Clone, Copy, Debug)]
enum Form {
    Alone,
    /// `check_each` of the hot key and a second key.
    Each,
    /// `check_all` of the hot key and a second key.
    All,
}

fn form() -> impl Strategy<Value = Form> {
    prop_oneof![Just(Form::Alone), Just(Form::Each), Just(Form::All)]
}

/// Runs `traffic` through `instances` limiters, each check sent alone, in a `check_each` or in
/// a `check_all` beside a check of a second key ("j", same policy); returns the admissions of
/// each key.
async fn run_batches(
    world: &World,
    policy: &Policy,
    traffic: &[(usize, u64, u64, Form)],
) -> (Vec<(u64, u64)>, Vec<(u64, u64)>) {
    let start = world.now();
    let (mut hot, mut other) = (Vec::new(), Vec::new());
    for &(instance, cost, advance, form) in traffic {
        world.clock.advance(Duration::from_micros(advance));
        let limiter = &world.limiters[instance % world.limiters.len()];
        let checks = [Check { key: "k", policy, cost }, Check { key: "j", policy, cost: 1 }];
        let admitted = match form {
            Form::Alone => limiter.check("k", policy, cost).await.map(|v| [v.allowed(), false]),
            Form::Each => limiter.check_each(&checks).await.map(|v| [v[0].allowed(), v[1].allowed()]),
            Form::All => limiter.check_all(&checks).await.map(|j| [j.admitted, j.admitted]),
        };
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(tollgate_limiter::LimitError::Invalid(_)) => continue,
            Err(e) => panic!("{e}"),
        };
        let at = world.now() - start;
        if admitted[0] {
            hot.push((at, cost));
        }
        if admitted[1] {
            other.push((at, 1));
        }
        tokio::task::yield_now().await;
    }
    (hot, other)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// The same bound through batches: `check_each` and `check_all` answer from blocks and
    /// reserve within the batch, and an all-or-nothing batch refused puts its units back;
    /// neither key is ever over the rule's bound.
    #[test]
    fn never_over_the_limit_in_batches(
        kind in kind(),
        instances in 1usize..5,
        reserve in reserve(),
        traffic in prop::collection::vec(
            (0usize..8, 1u64..4, prop_oneof![8 => 0u64..2_000, 1 => 0u64..1_500_000], form()),
            1..500,
        ),
    ) {
        let rt = runtime();
        let (hot, other) = rt.block_on(run_batches(&World::new(instances), &policy(kind.rule(), reserve), &traffic));
        prop_assert_eq!(kind.check(&hot), Ok(()));
        prop_assert_eq!(kind.check(&other), Ok(()));
    }
}

/// A hot key checked through `check_each` and `check_all` is answered from blocks: far fewer
/// backend calls than batches, and the backend counted every unit admitted or held.
#[tokio::test]
async fn batches_are_answered_from_blocks() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let hot = policy(Rule::fixed_window(100_000, Period::MINUTE), Reserve::Auto);
    for all in [false, true] {
        for _ in 0..2_000 {
            let checks =
                [Check { key: "k", policy: &hot, cost: 1 }, Check { key: "g", policy: &hot, cost: 1 }];
            let admitted = if all {
                limiter.check_all(&checks).await.unwrap().admitted
            } else {
                limiter.check_each(&checks).await.unwrap().iter().all(|v| v.allowed())
            };
            assert!(admitted);
        }
    }
    let stats = limiter.reserve_stats();
    let calls = world.backend.calls.load(Ordering::Relaxed);
    assert!(calls < 100, "{calls} backend calls for 4,000 batches: {stats:?}");
    let counted: u64 = ["k", "g"]
        .iter()
        .map(|key| {
            100_000
                - world
                    .backend
                    .inner
                    .execute_now(key, &hot.rules, Operation::Check { cost: 0 })
                    .unwrap()
                    .remaining()
        })
        .sum();
    assert_eq!(counted, 8_000 + stats.held, "{stats:?}");
}

/// An all-or-nothing batch refused by another key takes nothing from the hot key's block: its
/// units are put back (and the block keeps answering), so the hot key loses no admission.
#[tokio::test]
async fn a_refused_joint_batch_puts_block_units_back() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let hot = policy(Rule::fixed_window(1_000, Period::MINUTE), Reserve::Max(64));
    let tight = Policy::enforce("tight", RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap());
    for _ in 0..100 {
        assert!(limiter.check("k", &hot, 1).await.unwrap().allowed());
    }
    assert!(limiter.check("full", &tight, 1).await.unwrap().allowed());
    let before = limiter.reserve_stats();
    assert!(before.held > 2, "{before:?}");
    let calls = world.backend.calls.load(Ordering::Relaxed);
    for _ in 0..50 {
        let joint = limiter
            .check_all(&[
                Check { key: "k", policy: &hot, cost: 2 },
                Check { key: "full", policy: &tight, cost: 1 },
            ])
            .await
            .unwrap();
        assert!(!joint.admitted);
        assert!(joint.verdicts[0].allowed() && !joint.verdicts[1].allowed());
    }
    let after = limiter.reserve_stats();
    assert_eq!(after.held, before.held, "the units went back into the block");
    assert_eq!(world.backend.calls.load(Ordering::Relaxed), calls + 50, "one call per batch");
    // What the backend counted is what was admitted plus what the block holds.
    let peek = world.backend.inner.execute_now("k", &hot.rules, Operation::Check { cost: 0 }).unwrap();
    assert_eq!(peek.remaining(), 1_000 - 100 - after.held);
}

/// With the backend down and the failure policy closed, a batch fails as a whole, and the units
/// its checks took from blocks go back into them.
#[tokio::test]
async fn a_failed_batch_puts_block_units_back() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let hot = policy(Rule::fixed_window(1_000, Period::MINUTE), Reserve::Max(64));
    for _ in 0..100 {
        limiter.check("k", &hot, 1).await.unwrap();
    }
    let held = limiter.reserve_stats().held;
    assert!(held > 1);
    world.backend.down.store(true, Ordering::Relaxed);
    let checks = [Check { key: "k", policy: &hot, cost: 1 }, Check { key: "cold", policy: &hot, cost: 1 }];
    assert!(limiter.check_each(&checks).await.is_err());
    assert!(limiter.check_all(&checks).await.is_err());
    assert_eq!(limiter.reserve_stats().held, held);
}

/// Steady traffic below the rate from 3 instances, for each kind: blocks are taken (so the
/// property test above exercises them), most admissions come from them, and the bound holds.
/// (Under overload a bucket stays near empty: reservations are refused and checks go plain.)
#[tokio::test]
async fn each_kind_takes_blocks_within_its_bound() {
    for kind in [
        Kind::Fixed { limit: 300 },
        Kind::Bucket { capacity: 300, refill: 200 },
        Kind::Gcra { limit: 200, burst: 300 },
    ] {
        let world = World::new(3);
        let traffic: Vec<(usize, u64, u64)> =
            (0..3_000).map(|i| (i % 3, 1 + (i % 2) as u64, 10_000)).collect();
        let admitted = run(&world, &policy(kind.rule(), Reserve::Auto), &traffic).await;
        assert_eq!(kind.check(&admitted), Ok(()));
        let blocks: u64 = world.limiters.iter().map(|l| l.reserve_stats().blocks).sum();
        let served: u64 = world.limiters.iter().map(|l| l.reserve_stats().decisions).sum();
        assert!(
            blocks > 10 && served > admitted.len() as u64 / 2,
            "{kind:?}: {blocks} blocks, {served} served"
        );
    }
}

/// Demand far above a fixed window's limit from 4 instances: every window admits at most the
/// limit, and at least the limit less the units held idle when it ended (from the instances'
/// reservation tables); most decisions are answered without the backend.
#[tokio::test]
async fn under_admission_is_bounded_by_the_units_held_idle() {
    let world = World::new(4);
    let limit = 2_000;
    let policy = policy(Rule::fixed_window(limit, Period::SECOND), Reserve::Auto);
    let mut admissions = 0u64;
    for window in 0..5u64 {
        let mut admitted = 0;
        let mut held_at_end = 0;
        // 10 000 requests over the second: 100 µs apart, round robin over the instances.
        for i in 0..10_000u64 {
            world.clock.advance(Duration::from_micros(if i == 0 { 0 } else { 100 }));
            let limiter = &world.limiters[(i % 4) as usize];
            if limiter.check("global", &policy, 1).await.unwrap().allowed() {
                admitted += 1;
                admissions += 1;
            }
            held_at_end = world.held();
        }
        assert!(admitted <= limit, "window {window}: {admitted} admitted");
        assert!(
            admitted + held_at_end >= limit,
            "window {window}: {admitted} admitted, {held_at_end} held idle, limit {limit}"
        );
        // On to the next window (10 000 × 100 µs less the first step is 999 900 µs).
        world.clock.advance(Duration::from_micros(100));
    }
    // Denials go to the backend (the Redis backend's deny cache answers most of them); the
    // admissions are mostly answered from blocks.
    let served: u64 = world.limiters.iter().map(|l| l.reserve_stats().decisions).sum();
    let blocks: u64 = world.limiters.iter().map(|l| l.reserve_stats().blocks).sum();
    assert!(served * 10 > admissions * 8, "{served} of {admissions} admissions from blocks");
    assert!(blocks * 20 < admissions, "{blocks} blocks for {admissions} admissions");
}

/// Once the limit is spent, a refused reservation sends the key down the plain path until the
/// refusal's retry-after: each denial costs one backend call, not a refused reservation and
/// then the plain check.
#[tokio::test]
async fn an_overloaded_key_costs_one_call_a_denial() {
    for rule in [Rule::fixed_window(1_000, Period::MINUTE), Rule::token_bucket(1_000, 10, Period::SECOND)] {
        let world = World::new(1);
        let limiter = &world.limiters[0];
        let policy = policy(rule.clone(), Reserve::Auto);
        let mut denied = 0;
        for _ in 0..5_000 {
            world.clock.advance(Duration::from_millis(1));
            denied += u64::from(!limiter.check("k", &policy, 1).await.unwrap().allowed());
        }
        let stats = limiter.reserve_stats();
        let calls = world.backend.calls.load(Ordering::Relaxed);
        assert!(denied > 3_000, "{rule:?}: {denied}");
        // A call per check not answered from a block, and per refused reservation.
        assert!(
            calls <= 5_000 - (stats.decisions - stats.blocks) + stats.refused,
            "{rule:?}: {calls} calls for {denied} denials: {stats:?}"
        );
        assert!(stats.refused < 60, "{rule:?}: {stats:?}");
    }
}

/// Concurrent checks that find a block empty at once take one block between them (the others
/// go plain meanwhile): the units held stay within the cap, not one cap per task.
#[tokio::test]
async fn concurrent_checks_do_not_stampede_into_many_blocks() {
    let world = World::new(1);
    world.backend.yields.store(true, Ordering::Relaxed);
    let limiter = world.limiters[0].clone();
    let policy = Arc::new(policy(Rule::fixed_window(100_000, Period::MINUTE), Reserve::Auto));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (limiter, policy) = (limiter.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..2_000 {
                admitted += u64::from(limiter.check("k", &policy, 1).await.unwrap().allowed());
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 32_000);
    let stats = limiter.reserve_stats();
    assert!(stats.held <= 100_000 / 4, "{stats:?}");
    assert!(stats.decisions > 16_000, "{stats:?}");
    let peek = world.backend.inner.execute_now("k", &policy.rules, Operation::Check { cost: 0 }).unwrap();
    assert_eq!(peek.remaining(), 100_000 - admitted - stats.held, "held = reserved, not admitted");
}

/// Keys checked fewer than HOT_HITS times per sweep period never get a block: every check is
/// one backend call, and the table stays empty.
#[tokio::test]
async fn cold_keys_stay_on_the_plain_path() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::fixed_window(1_000, Period::MINUTE), Reserve::Auto);
    let mut checks = 0;
    for round in 0..3 {
        for key in 0..2_000 {
            for _ in 0..(HOT_HITS - 1) / 2 {
                assert!(limiter.check(&format!("user:{key}"), &policy, 1).await.unwrap().allowed());
                checks += 1;
            }
        }
        world.clock.advance(SWEEP_EVERY * (round + 1));
    }
    let stats = limiter.reserve_stats();
    assert_eq!((stats.keys, stats.blocks, stats.decisions), (0, 0, 0), "{stats:?}");
    assert_eq!(world.backend.calls.load(Ordering::Relaxed), checks);
}

/// A hot key gets a block after HOT_HITS checks, and its blocks grow while it stays hot.
#[tokio::test]
async fn a_hot_key_gets_growing_blocks() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::fixed_window(10_000, Period::MINUTE), Reserve::Auto);
    for _ in 0..HOT_HITS - 1 {
        limiter.check("k", &policy, 1).await.unwrap();
    }
    assert_eq!(limiter.reserve_stats().blocks, 0);
    for _ in 0..1_000 {
        assert!(limiter.check("k", &policy, 1).await.unwrap().allowed());
    }
    let stats = limiter.reserve_stats();
    // Sizes 2, 4, ..., 512: 9 blocks hold 1022 units.
    assert!(stats.blocks <= 10, "{stats:?}");
    assert!(stats.decisions >= 1_000 - 10 && stats.held > 0, "{stats:?}");
    assert_eq!(world.backend.calls.load(Ordering::Relaxed), u64::from(HOT_HITS) - 1 + stats.blocks);
    // The backend counted every unit of the blocks.
    let peek = world.backend.inner.execute_now("k", &policy.rules, Operation::Check { cost: 0 }).unwrap();
    assert_eq!(peek.remaining(), 10_000 - u64::from(HOT_HITS - 1) - stats.reserved_units);
}

/// `{ max = N }` caps blocks at N, and `limit / 4` caps them under `auto`.
#[tokio::test]
async fn blocks_are_capped() {
    for (reserve, cap) in [(Reserve::Max(16), 16), (Reserve::Auto, 100)] {
        let world = World::new(1);
        let limiter = &world.limiters[0];
        let policy = policy(Rule::fixed_window(400, Period::MINUTE), reserve);
        for _ in 0..300 {
            limiter.check("k", &policy, 1).await.unwrap();
        }
        let stats = limiter.reserve_stats();
        assert!(stats.held < cap, "{reserve:?}: {stats:?}");
        let largest_possible = stats.reserved_units;
        assert!(largest_possible <= 300 + cap, "{reserve:?}: {stats:?}");
        assert!(stats.blocks >= (300 - 2 * cap) / cap, "{reserve:?}: {stats:?}");
    }
}

/// The cap shrinks with the instances the heartbeat reports: limit / (4 × instances); and
/// heartbeats go at most once a second per key.
#[tokio::test]
async fn the_cap_follows_the_instances_seen() {
    let world = World::new(1);
    world.backend.instances.store(5, Ordering::Relaxed);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::fixed_window(2_000, Period::MINUTE), Reserve::Auto);
    for _ in 0..1_500 {
        assert!(limiter.check("k", &policy, 1).await.unwrap().allowed());
    }
    let stats = limiter.reserve_stats();
    // Blocks of 2, 4, .., 64, then 100 (2000 / 20) each.
    assert!(stats.held < 100, "{stats:?}");
    assert!(stats.blocks >= (1_500 - 126) / 100 + 6, "{stats:?}");
    assert_eq!(world.backend.heartbeats.load(Ordering::Relaxed), 1, "the clock did not move");
    world.clock.advance(Duration::from_millis(1_100));
    for _ in 0..300 {
        limiter.check("k", &policy, 1).await.unwrap();
    }
    assert_eq!(world.backend.heartbeats.load(Ordering::Relaxed), 2);
}

/// While the backend is down, a block answers up to its units, not degraded; then the failure
/// policy (closed here) answers.
#[tokio::test]
async fn a_block_answers_through_an_outage() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::fixed_window(1_000, Period::MINUTE), Reserve::Max(64));
    for _ in 0..200 {
        limiter.check("k", &policy, 1).await.unwrap();
    }
    let held = limiter.reserve_stats().held;
    assert!(held > 0);
    world.backend.down.store(true, Ordering::Relaxed);
    for _ in 0..held {
        let verdict = limiter.check("k", &policy, 1).await.unwrap();
        assert!(verdict.allowed() && !verdict.degraded);
    }
    assert!(limiter.check("k", &policy, 1).await.is_err(), "beyond the block, the failure policy");
}

/// A fixed-window block ends with its window: units left then are counted as expired, never
/// spent in the next window, and the next window starts from a fresh reservation.
#[tokio::test]
async fn a_block_does_not_outlive_its_window() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::fixed_window(100, Period::SECOND), Reserve::Auto);
    for _ in 0..20 {
        limiter.check("k", &policy, 1).await.unwrap();
    }
    let held = limiter.reserve_stats().held;
    assert!(held > 0);
    world.clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.reserve_stats().held, 0);
    limiter.check("k", &policy, 1).await.unwrap();
    let stats = limiter.reserve_stats();
    assert_eq!(stats.expired, held, "{stats:?}");
    assert_eq!(stats.returned, 0, "a refund would land in the new window");
}

/// Shutdown gives unused units back: a token bucket's, and a fixed window's with time left.
#[tokio::test]
async fn shutdown_gives_unused_units_back() {
    for rule in [Rule::token_bucket(400, 1, Period::HOUR), Rule::fixed_window(400, Period::HOUR)] {
        let world = World::new(1);
        let limiter = &world.limiters[0];
        let policy = policy(rule, Reserve::Auto);
        for _ in 0..50 {
            assert!(limiter.check("k", &policy, 1).await.unwrap().allowed());
        }
        let held = limiter.reserve_stats().held;
        assert!(held > 0);
        assert_eq!(limiter.shutdown().await, held);
        let peek = world.backend.inner.execute_now("k", &policy.rules, Operation::Check { cost: 0 }).unwrap();
        assert_eq!(peek.remaining(), 350, "only what was admitted stays counted");
        assert_eq!(limiter.reserve_stats().keys, 0);
    }
}

/// An expired token-bucket block's units go back at the key's next check.
#[tokio::test]
async fn an_expired_bucket_block_is_refunded() {
    let world = World::new(1);
    let limiter = &world.limiters[0];
    let policy = policy(Rule::token_bucket(400, 1, Period::HOUR), Reserve::Auto);
    for _ in 0..50 {
        limiter.check("k", &policy, 1).await.unwrap();
    }
    let held = limiter.reserve_stats().held;
    assert!(held > 0);
    world.clock.advance(Duration::from_millis(1_500));
    limiter.check("k", &policy, 1).await.unwrap();
    // The check that found it (or the sweep it ran, in a task of its own) sent the refund.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.reserve_stats().returned, held);
}

#[test]
fn reserve_is_refused_for_rules_that_cannot_honour_it() {
    for rule in [
        Rule::sliding_window_log(10, Period::MINUTE),
        Rule::sliding_window_counter(10, Period::MINUTE),
        Rule::concurrency(10, Period::MINUTE),
    ] {
        let rules = RuleSet::new([Rule::fixed_window(5, Period::SECOND), rule.clone()]).unwrap();
        let e = Policy::enforce("p", rules.clone()).with_reserve(Reserve::Auto).unwrap_err();
        assert!(e.to_string().contains(&format!("rules[1], a {} rule", rule.algorithm().as_str())), "{e}");
        assert!(Policy::enforce("p", rules).with_reserve(Reserve::Off).is_ok());
    }
}
