//! Scenarios every backend must pass identically, with time moved by hand.
//!
//! Each scenario takes a [`Harness`]: a backend whose clock is the harness's [`ManualClock`].
//! [`conformance_tests!`](crate::conformance_tests) turns the whole list into `#[tokio::test]`s
//! for one backend; `tollgate-core` runs them on the memory backend and `tollgate-redis` on
//! Redis, so the tables below are the shared definition of each algorithm's behaviour.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::limits::{MAX_BATCH_PARTS, MAX_COUNT};
use tollgate_core::{
    Backend, Clock, Decision, Error, KeyError, Lease, LeaseId, ManualClock, Operation, Part, Period, Rule,
    RuleSet, Timestamp,
};

/// A backend and the clock it decides by.
pub struct Harness<B> {
    /// The backend under test.
    pub backend: B,
    /// Its clock; scenarios move it.
    pub clock: ManualClock,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn period(text: &str) -> Period {
    text.parse().unwrap()
}

fn set(rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new(rules).unwrap()
}

/// One rule of every algorithm (both fixed-window alignments), each admitting `limit` units at
/// once and `limit` per `period` (`period` is also the concurrency rule's lease).
pub fn one_of_each(limit: u64, period: Period) -> Vec<Rule> {
    vec![
        Rule::fixed_window(limit, period),
        Rule::fixed_window_from_first_hit(limit, period),
        Rule::sliding_window_log(limit, period),
        Rule::sliding_window_counter(limit, period),
        Rule::token_bucket(limit, limit, period),
        Rule::gcra(limit, period, limit),
        Rule::concurrency(limit, period),
    ]
}

impl<B: Backend> Harness<B> {
    /// A harness for the backend `make` builds on a clock stopped at a whole wall-clock second.
    pub fn new(make: impl FnOnce(ManualClock) -> B) -> Self {
        let clock = ManualClock::at_wall_clock_second();
        Harness { backend: make(clock.clone()), clock }
    }

    /// A key no other scenario uses (several scenarios may share one Redis).
    pub fn key(&self, name: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Moves the clock forward to the next multiple of `period` since the epoch (or stays, if
    /// it is on one), then `offset` further.
    pub fn align(&self, period: Period, offset: Duration) {
        let now = self.clock.now().as_micros();
        let p = period.as_micros();
        let start = now.div_ceil(p) * p;
        self.clock.set(Timestamp::from_micros(start + offset.as_micros() as u64));
    }

    async fn check(&self, key: &str, rules: &RuleSet, cost: u64) -> Decision {
        self.backend.check(key, rules, cost).await.expect("check")
    }

    async fn batch(&self, parts: &[Part<'_>]) -> Vec<Decision> {
        self.backend.check_batch(parts).await.expect("check_batch")
    }

    /// Checks a rule set that may hold concurrency rules: acquires when `cost > 0`.
    async fn take(&self, key: &str, rules: &RuleSet, cost: u64) -> Decision {
        if rules.has_concurrency() && cost > 0 {
            self.backend.acquire(key, rules, cost).await.expect("acquire").decision
        } else {
            self.check(key, rules, cost).await
        }
    }
}

/// Clock-aligned fixed window: limit, retry at the window's end, and the double burst at the
/// boundary that fixed windows allow.
pub async fn fixed_window_clock_edges(h: &Harness<impl Backend>) {
    let rules = set([Rule::fixed_window(3, Period::SECOND)]);
    h.align(Period::SECOND, Duration::ZERO);
    let key = h.key("fw");
    for remaining in [2, 1, 0] {
        let d = h.check(&key, &rules, 1).await;
        assert!(d.allowed());
        assert_eq!((d.remaining(), d.reset_after()), (remaining, ms(1000)));
    }
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    assert_eq!((d.remaining(), d.retry_after(), d.binding(&rules).limit()), (0, ms(1000), 3));
    h.advance(ms(999));
    assert_eq!(h.check(&key, &rules, 1).await.retry_after(), ms(1));
    h.advance(ms(1));
    let d = h.check(&key, &rules, 1).await;
    assert!(d.allowed());
    assert_eq!(d.remaining(), 2);

    // The boundary burst: a full window just before the edge, another just after.
    let key = h.key("fw-burst");
    h.align(Period::SECOND, ms(999));
    assert!(h.check(&key, &rules, 3).await.allowed());
    h.advance(ms(1));
    assert!(h.check(&key, &rules, 3).await.allowed(), "6 = 2 x limit admitted within 1 ms");
}

/// First-hit fixed window: the window opens at the first request, not on the clock.
pub async fn fixed_window_first_hit(h: &Harness<impl Backend>) {
    let rules = set([Rule::fixed_window_from_first_hit(2, Period::SECOND)]);
    h.align(Period::SECOND, ms(300));
    let key = h.key("fwh");
    let d = h.check(&key, &rules, 0).await;
    assert!(d.allowed());
    assert_eq!((d.remaining(), d.reset_after()), (2, Duration::ZERO));
    let d = h.check(&key, &rules, 1).await;
    assert_eq!((d.remaining(), d.reset_after()), (1, ms(1000)));
    h.advance(ms(500));
    let d = h.check(&key, &rules, 1).await;
    assert_eq!((d.remaining(), d.reset_after()), (0, ms(500)));
    // 700 ms after the first hit a clock-aligned window would have rolled over; this one has not.
    h.advance(ms(200));
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), ms(300));
    h.advance(ms(300));
    let d = h.check(&key, &rules, 1).await;
    assert!(d.allowed());
    assert_eq!((d.remaining(), d.reset_after()), (1, ms(1000)));
}

/// Sliding log: exact; never more than the limit in any sliding period.
pub async fn sliding_window_log_is_exact(h: &Harness<impl Backend>) {
    let rules = set([Rule::sliding_window_log(3, Period::SECOND)]);
    let key = h.key("swl");
    for _ in 0..3 {
        assert!(h.check(&key, &rules, 1).await.allowed());
        h.advance(ms(300));
    }
    // t = 900 ms: full until the first unit (t = 0) leaves at t = 1000 ms.
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    assert_eq!((d.retry_after(), d.reset_after()), (ms(100), ms(700)));
    // Two units need the first two gone: t = 1300 ms.
    assert_eq!(h.check(&key, &rules, 2).await.retry_after(), ms(400));
    h.advance(ms(100));
    assert!(h.check(&key, &rules, 1).await.allowed());
    assert_eq!(h.check(&key, &rules, 1).await.retry_after(), ms(300));

    // Attempts every 10 ms for 3 s: never more than 3 in any second, and 3 in each.
    let key = h.key("swl-window");
    let mut admitted: Vec<u64> = Vec::new();
    for step in 0..300u64 {
        if h.check(&key, &rules, 1).await.allowed() {
            admitted.push(step * 10);
        }
        h.advance(ms(10));
    }
    for &t in &admitted {
        let in_window = admitted.iter().filter(|&&u| u + 1000 > t && u <= t).count();
        assert!(in_window <= 3, "{in_window} admitted in the second ending at {t} ms");
    }
    assert_eq!(admitted.len(), 9, "admitted at {admitted:?}");
}

/// Sliding counter: the previous window weighted by its overlap.
pub async fn sliding_window_counter_weights_previous_window(h: &Harness<impl Backend>) {
    let rules = set([Rule::sliding_window_counter(10, Period::SECOND)]);
    h.align(Period::SECOND, Duration::ZERO);
    let key = h.key("swc");
    assert!(h.check(&key, &rules, 10).await.allowed());
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    // Full again once the window has slid wholly past it: two windows on.
    assert_eq!(d.reset_after(), ms(2000));
    // 250 ms into the next window, the previous 10 weigh 7.5: 2 more fit.
    h.advance(ms(1250));
    let d = h.check(&key, &rules, 0).await;
    assert_eq!(d.remaining(), 2);
    assert_eq!(h.check(&key, &rules, 2).await.remaining(), 0);
    // One more fits when 10 * (1 - x) + 2 + 1 <= 10: x = 0.3, 50 ms from now.
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), ms(50));
    h.advance(ms(50));
    assert!(h.check(&key, &rules, 1).await.allowed());
}

/// Token bucket: continuous refill with no fraction lost, to the microsecond.
pub async fn token_bucket_refills_exactly(h: &Harness<impl Backend>) {
    // Three tokens a second: one every 333,333 1/3 us.
    let rules = set([Rule::token_bucket(3, 3, Period::SECOND)]);
    let key = h.key("tb");
    let d = h.check(&key, &rules, 3).await;
    assert_eq!((d.remaining(), d.reset_after()), (0, ms(1000)));
    h.advance(us(333_333));
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed(), "a third of a microsecond short of a token");
    assert_eq!(d.retry_after(), us(1));
    h.advance(us(1));
    assert_eq!(h.check(&key, &rules, 0).await.remaining(), 1);
    h.advance(us(999_999 - 333_334));
    assert_eq!(h.check(&key, &rules, 0).await.remaining(), 2);
    h.advance(us(1));
    let d = h.check(&key, &rules, 0).await;
    assert_eq!((d.remaining(), d.reset_after()), (3, Duration::ZERO));

    // Frequent callers still see the refill (floor()-based scripts lose it on every call).
    let rules = set([Rule::token_bucket(1, 1, Period::SECOND)]);
    let key = h.key("tb-frequent");
    let mut admitted = 0;
    for _ in 0..=300 {
        admitted += u32::from(h.check(&key, &rules, 1).await.allowed());
        h.advance(ms(10));
    }
    assert_eq!(admitted, 4, "at 0, 1, 2 and 3 s");
}

/// GCRA: a burst at once, then one per emission interval.
pub async fn gcra_spacing_and_burst(h: &Harness<impl Backend>) {
    let rules = set([Rule::gcra(10, Period::SECOND, 3)]);
    let key = h.key("gcra");
    for remaining in [2, 1, 0] {
        let d = h.check(&key, &rules, 1).await;
        assert!(d.allowed());
        assert_eq!((d.remaining(), d.binding(&rules).limit()), (remaining, 3));
    }
    let d = h.check(&key, &rules, 1).await;
    assert!(!d.allowed());
    assert_eq!((d.retry_after(), d.reset_after()), (ms(100), ms(300)));
    h.advance(ms(100));
    assert!(h.check(&key, &rules, 1).await.allowed());
    assert_eq!(h.check(&key, &rules, 1).await.retry_after(), ms(100));
    // At the sustained rate: one every 100 ms.
    let mut admitted = 0;
    for _ in 0..100 {
        h.advance(ms(10));
        admitted += u32::from(h.check(&key, &rules, 1).await.allowed());
    }
    assert_eq!(admitted, 10);
}

/// Concurrency: leases held, released, and expired.
pub async fn concurrency_leases(h: &Harness<impl Backend>) {
    let rules = set([Rule::concurrency(2, period("10s"))]);
    let key = h.key("cc");
    let a = h.backend.acquire(&key, &rules, 1).await.unwrap();
    assert_eq!(a.decision.remaining(), 1);
    let a = a.lease.expect("a lease");
    h.advance(ms(1000));
    let b = h.backend.acquire(&key, &rules, 1).await.unwrap();
    assert!(b.lease.is_some());
    let denied = h.backend.acquire(&key, &rules, 1).await.unwrap();
    assert!(!denied.decision.allowed() && denied.lease.is_none());
    // Without a release, the first lease frees a unit when it expires.
    assert_eq!(denied.decision.retry_after(), ms(9000));
    assert_eq!(denied.decision.reset_after(), ms(10_000));

    let after = h.backend.release(&key, &rules, &a).await.unwrap();
    assert_eq!(after.remaining(), 1);
    let c = h.backend.acquire(&key, &rules, 1).await.unwrap();
    assert!(c.decision.allowed());

    // Unreleased leases expire: nothing is held 10 s after the last acquire.
    h.advance(ms(10_000));
    let d = h.check(&key, &rules, 0).await;
    assert_eq!((d.remaining(), d.reset_after()), (2, Duration::ZERO));
    // Releasing an expired lease is harmless.
    h.backend.release(&key, &rules, &c.lease.unwrap()).await.unwrap();
    let two = h.backend.acquire(&key, &rules, 2).await.unwrap();
    assert_eq!(two.decision.remaining(), 0);
    assert_eq!(two.lease.unwrap().units, 2);

    match h.backend.check(&key, &rules, 1).await {
        Err(Error::LeaseRequired { index: 0 }) => {}
        other => panic!("expected LeaseRequired, got {other:?}"),
    }
}

/// A peek (cost 0) reports without consuming, for every algorithm.
pub async fn peek_consumes_nothing(h: &Harness<impl Backend>) {
    for rule in one_of_each(5, Period::HOUR) {
        let rules = set([rule.clone()]);
        let key = h.key("peek");
        assert!(h.take(&key, &rules, 4).await.allowed(), "{rule:?}");
        for _ in 0..3 {
            let d = h.check(&key, &rules, 0).await;
            assert!(d.allowed(), "{rule:?}");
            assert_eq!(d.remaining(), 1, "{rule:?}");
        }
        assert!(h.take(&key, &rules, 1).await.allowed(), "{rule:?}");
        let d = h.check(&key, &rules, 0).await;
        assert!(!d.allowed(), "{rule:?}: a peek at an exhausted rule says a unit would not fit");
        assert_eq!(d.remaining(), 0);
        assert!(d.retry_after() > Duration::ZERO);
    }
}

/// A key's state under a rule is the same whichever rule set the rule is checked in, and a
/// reset of one set leaves the other rules' state alone.
pub async fn a_rule_keeps_one_state_across_rule_sets(h: &Harness<impl Backend>) {
    let shared = Rule::fixed_window(5, Period::HOUR);
    let alone = set([shared.clone()]);
    let with_others =
        set([Rule::gcra(10, Period::HOUR, 4), shared.clone(), Rule::sliding_window_counter(9, Period::HOUR)]);
    let key = h.key("across");
    assert!(h.take(&key, &alone, 2).await.allowed());
    let d = h.take(&key, &with_others, 1).await;
    assert!(d.allowed());
    assert_eq!(
        d.outcomes(&with_others).nth(1).map(|o| o.remaining()),
        Some(2),
        "the fixed window counted 2 + 1"
    );
    assert_eq!(h.check(&key, &alone, 0).await.remaining(), 2);
    h.backend.reset(&key, &alone).await.unwrap();
    let d = h.check(&key, &with_others, 0).await;
    assert_eq!(d.outcomes(&with_others).map(|o| o.remaining()).collect::<Vec<_>>(), [3, 5, 8]);
}

/// Reset puts every algorithm back to full.
pub async fn reset_restores_full(h: &Harness<impl Backend>) {
    let rules = set(one_of_each(5, Period::HOUR));
    let key = h.key("reset");
    assert!(h.take(&key, &rules, 5).await.allowed());
    assert!(!h.take(&key, &rules, 1).await.allowed());
    h.backend.reset(&key, &rules).await.unwrap();
    let d = h.check(&key, &rules, 0).await;
    assert!(d.outcomes(&rules).all(|o| o.remaining() == 5 && o.reset_after().is_zero()), "{d:?}");
    assert!(h.take(&key, &rules, 5).await.allowed());
}

/// Refund gives units back (never beyond full); concurrency rules ignore it.
pub async fn refund_gives_back(h: &Harness<impl Backend>) {
    for rule in one_of_each(5, Period::HOUR).into_iter().filter(|r| r.algorithm().as_str() != "concurrency") {
        let rules = set([rule.clone()]);
        let key = h.key("refund");
        assert!(h.check(&key, &rules, 3).await.allowed());
        let d = h.backend.refund(&key, &rules, 2).await.unwrap();
        assert_eq!(d.remaining(), 4, "{rule:?}");
        let d = h.backend.refund(&key, &rules, 10).await.unwrap();
        assert_eq!((d.remaining(), d.reset_after()), (5, Duration::ZERO), "{rule:?}");
        assert!(h.check(&key, &rules, 5).await.allowed(), "{rule:?}");
    }
    let rules = set([Rule::concurrency(2, Period::HOUR)]);
    let key = h.key("refund-cc");
    h.backend.acquire(&key, &rules, 2).await.unwrap();
    assert_eq!(h.backend.refund(&key, &rules, 2).await.unwrap().remaining(), 0);
}

/// A cost that can never fit is an error, not a denial; so is bad input.
pub async fn bad_input_is_an_error(h: &Harness<impl Backend>) {
    for (index, rule) in one_of_each(5, Period::HOUR).into_iter().enumerate() {
        let rules = set([Rule::fixed_window(100, Period::HOUR), rule.clone().named("r")]);
        let key = h.key("cost");
        let err = if rules.has_concurrency() {
            h.backend.acquire(&key, &rules, 6).await.map(|a| a.decision)
        } else {
            h.backend.check(&key, &rules, 6).await
        };
        match err {
            Err(Error::CostExceedsCapacity { index: 1, cost: 6, capacity: 5, ref name, .. }) => {
                assert_eq!(name.as_deref(), Some("r"));
            }
            other => panic!("rule {index} {rule:?}: expected CostExceedsCapacity, got {other:?}"),
        }
        assert!(h.take(&key, &rules, 5).await.allowed(), "{rule:?}: a cost equal to capacity fits");
    }
    let rules = set([Rule::fixed_window(1, Period::SECOND)]);
    assert!(matches!(h.backend.check("", &rules, 1).await, Err(Error::InvalidKey(KeyError::Empty))));
    assert!(matches!(
        h.backend.check(&"k".repeat(513), &rules, 1).await,
        Err(Error::InvalidKey(KeyError::TooLong { len: 513, .. }))
    ));
    assert!(matches!(h.backend.refund("k", &rules, MAX_COUNT + 1).await, Err(Error::CostTooLarge { .. })));
}

/// Several rules: admitted only if all admit; a denial consumes from none.
pub async fn multi_rule_all_or_nothing(h: &Harness<impl Backend>) {
    let rules = set([
        Rule::fixed_window(5, Period::HOUR).named("hourly"),
        Rule::gcra(1, Period::SECOND, 2).named("rate"),
        Rule::sliding_window_log(4, Period::MINUTE).named("minute"),
    ]);
    let key = h.key("multi");
    let d = h.check(&key, &rules, 2).await;
    assert!(d.allowed());
    assert_eq!(d.binding(&rules).name(), Some("rate")); // 0 left
    let d = h.check(&key, &rules, 2).await;
    assert!(!d.allowed());
    let allowed: Vec<bool> = d.outcomes(&rules).map(|o| o.allowed()).collect();
    assert_eq!(allowed, [true, false, true]);
    assert_eq!(d.binding(&rules).name(), Some("rate"));
    assert_eq!(d.retry_after(), ms(2000));
    let remaining: Vec<u64> = d.outcomes(&rules).map(|o| o.remaining()).collect();
    assert_eq!(remaining, [3, 0, 2], "the denied check consumed nothing");
    h.advance(ms(2000));
    let d = h.check(&key, &rules, 2).await;
    assert!(d.allowed());
    // The minute log has 0 left now: it binds.
    assert_eq!(d.binding(&rules).name(), Some("minute"));
    assert_eq!(d.remaining(), 0);
}

/// After a denial, waiting `retry_after` is enough for the same cost, for every algorithm.
pub async fn retry_after_is_honest(h: &Harness<impl Backend>) {
    for rule in one_of_each(5, period("700ms")) {
        let rules = set([rule.clone()]);
        let key = h.key("retry");
        for (round, cost) in [1u64, 3, 2, 5, 1, 4, 2, 2, 3].into_iter().enumerate() {
            let d = h.take(&key, &rules, cost).await;
            if d.allowed() {
                h.advance(ms(37));
                continue;
            }
            h.advance(d.retry_after());
            assert!(
                h.take(&key, &rules, cost).await.allowed(),
                "{rule:?}, round {round}: not admitted {:?} later",
                d.retry_after()
            );
        }
    }
}

fn remaining(decisions: &[Decision]) -> Vec<u64> {
    decisions.iter().map(|d| d.remaining()).collect()
}

fn allowed(decisions: &[Decision]) -> Vec<bool> {
    decisions.iter().map(|d| d.allowed()).collect()
}

/// A batch's group is all or nothing across keys: one part denied, no part consumes; each part
/// reports its own rules.
pub async fn batch_is_all_or_nothing_across_keys(h: &Harness<impl Backend>) {
    let user = set([Rule::fixed_window(5, Period::HOUR), Rule::gcra(10, Period::SECOND, 10)]);
    let route = set([Rule::sliding_window_log(2, Period::MINUTE)]);
    let (alice, upload) = (h.key("alice"), h.key("upload"));
    let batch = [Part::new(&alice, &user, 1), Part::new(&upload, &route, 1)];
    for left in [1, 0] {
        let d = h.batch(&batch).await;
        assert_eq!(allowed(&d), [true, true]);
        assert_eq!(d[1].remaining(), left);
    }
    let d = h.batch(&batch).await;
    assert_eq!(allowed(&d), [true, false], "alice's rules admit, the route's refuse");
    assert_eq!(d[0].outcomes(&user).next().map(|o| o.remaining()), Some(3), "alice's unit was not taken");
    assert!(d[1].retry_after() > Duration::ZERO);
    assert_eq!(h.check(&alice, &user, 0).await.outcomes(&user).next().map(|o| o.remaining()), Some(3));
    // Alone, alice is still admitted.
    assert!(h.check(&alice, &user, 1).await.allowed());
}

/// Parts of one group naming the same state ask it for the sum of their costs; groups run in
/// order, each seeing the one before, and are independent of each other's denials.
pub async fn batch_sums_shared_states_and_orders_groups(h: &Harness<impl Backend>) {
    let five = Rule::fixed_window(5, Period::HOUR);
    let alone = set([five.clone()]);
    let with_rate = set([five, Rule::token_bucket(10, 1, Period::SECOND)]);
    let key = h.key("shared");
    let d = h.batch(&[Part::new(&key, &alone, 2), Part::new(&key, &with_rate, 2)]).await;
    assert_eq!(allowed(&d), [true, true]);
    assert_eq!(remaining(&d), [1, 1], "4 of the 5 taken once, not 2 twice");
    let d = h.batch(&[Part::new(&key, &alone, 1), Part::new(&key, &with_rate, 1)]).await;
    assert_eq!(allowed(&d), [false, false], "2 asked of 1 left");
    assert_eq!(remaining(&d), [1, 1]);
    // Group 1 takes the last unit; group 2 (same state) then finds none; group 3 (another key)
    // is admitted whatever group 2 answered.
    let other = h.key("other");
    let d = h
        .batch(&[
            Part::new(&key, &alone, 1).in_group(1),
            Part::new(&key, &alone, 1).in_group(2),
            Part::new(&other, &alone, 1).in_group(3),
        ])
        .await;
    assert_eq!(allowed(&d), [true, false, true]);
    assert_eq!(remaining(&d), [0, 0, 4]);
}

/// A batch of every algorithm, each part its own group, decides exactly as single checks do.
pub async fn batch_matches_single_checks(h: &Harness<impl Backend>) {
    let sets: Vec<RuleSet> = one_of_each(3, period("1s"))
        .into_iter()
        .filter(|r| r.algorithm() != tollgate_core::AlgorithmName::Concurrency)
        .map(|r| set([r]))
        .collect();
    let batched: Vec<String> = sets.iter().map(|_| h.key("batched")).collect();
    let single: Vec<String> = sets.iter().map(|_| h.key("single")).collect();
    for (round, cost) in [1u64, 2, 1, 3, 0, 1, 2].into_iter().enumerate() {
        let parts: Vec<Part<'_>> =
            sets.iter().zip(&batched).zip(0..).map(|((r, k), g)| Part::new(k, r, cost).in_group(g)).collect();
        let got = h.batch(&parts).await;
        for ((rules, key), d) in sets.iter().zip(&single).zip(&got) {
            let want = h.check(key, rules, cost).await;
            assert_eq!(d, &want, "round {round}, {:?}", rules.signatures().next());
        }
        h.advance(ms(230));
    }
}

/// Bad batches are refused before any state is touched, naming the part.
pub async fn batch_bad_input_is_an_error(h: &Harness<impl Backend>) {
    let rules = set([Rule::fixed_window(3, Period::MINUTE)]);
    let leases = set([Rule::concurrency(3, Period::MINUTE)]);
    let key = h.key("bad-batch");
    assert!(matches!(h.backend.check_batch(&[]).await, Err(Error::BatchSize { parts: 0, max: 64 })));
    let many: Vec<Part<'_>> = (0..65).map(|_| Part::new(&key, &rules, 1).in_group(7)).collect();
    assert!(matches!(h.backend.check_batch(&many).await, Err(Error::BatchSize { parts: 65, .. })));
    type Case<'a> = (Vec<Part<'a>>, fn(&Error) -> bool);
    let cases: [Case<'_>; 3] = [
        (vec![Part::new(&key, &rules, 1), Part::new("", &rules, 1)], |e| {
            matches!(e, Error::InvalidKey(KeyError::Empty))
        }),
        (vec![Part::new(&key, &rules, 1), Part::new(&key, &leases, 1)], |e| {
            matches!(e, Error::LeaseRequired { index: 0 })
        }),
        (vec![Part::new(&key, &rules, 2), Part::new(&key, &rules, 2)], |e| {
            matches!(e, Error::CostExceedsCapacity { cost: 4, capacity: 3, .. })
        }),
    ];
    for (parts, expected) in cases {
        match h.backend.check_batch(&parts).await {
            Err(Error::InPart { part: 1, error }) => assert!(expected(&error), "{error:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(h.check(&key, &rules, 0).await.remaining(), 3, "nothing was consumed");
}

/// A batch's bounds are inclusive: the most parts a batch may hold, and a group asking one state
/// for exactly what it holds, are accepted; a group's demand on a state adds up over all its
/// parts naming that state (not only the first two), and only theirs: parts of other keys
/// under the same rule ask their own states.
pub async fn batch_bounds_are_inclusive(h: &Harness<impl Backend>) {
    let rules = set([Rule::fixed_window(4, Period::MINUTE)]);
    let key = h.key("batch-bounds");
    let d = h.batch(&[Part::new(&key, &rules, 2), Part::new(&key, &rules, 2)]).await;
    assert_eq!(allowed(&d), [true, true], "2 + 2 of 4 fit");
    assert_eq!(remaining(&d), [0, 0]);

    let key = h.key("batch-three");
    let three = [Part::new(&key, &rules, 2), Part::new(&key, &rules, 1), Part::new(&key, &rules, 2)];
    match h.backend.check_batch(&three).await {
        Err(Error::InPart { part: 2, error }) => {
            assert!(matches!(*error, Error::CostExceedsCapacity { cost: 5, capacity: 4, .. }), "{error:?}")
        }
        other => panic!("2 + 1 + 2 asked of 4: {other:?}"),
    }
    assert_eq!(h.check(&key, &rules, 0).await.remaining(), 4, "nothing was consumed");

    let (a, b) = (h.key("batch-a"), h.key("batch-b"));
    let d = h.batch(&[Part::new(&a, &rules, 3), Part::new(&b, &rules, 3)]).await;
    assert_eq!(allowed(&d), [true, true], "two keys, one rule: 3 of 4 each");
    assert_eq!(remaining(&d), [1, 1]);

    let keys: Vec<String> = (0..MAX_BATCH_PARTS).map(|_| h.key("batch-most")).collect();
    let most: Vec<Part<'_>> = keys.iter().map(|k| Part::new(k, &rules, 1)).collect();
    let d = h.batch(&most).await;
    assert_eq!(d.len(), MAX_BATCH_PARTS);
    assert!(d.iter().all(|d| d.allowed() && d.remaining() == 3));
}

/// A release may give back part of a lease (never more than it holds); a lease given back
/// whole is gone, and with nothing held the rule is full and resets now.
pub async fn concurrency_partial_release(h: &Harness<impl Backend>) {
    let rules = set([Rule::concurrency(5, period("10s"))]);
    let key = h.key("cc-part");
    let three = h.backend.acquire(&key, &rules, 3).await.unwrap().lease.expect("a lease");
    h.advance(ms(1000));
    let one = h.backend.acquire(&key, &rules, 1).await.unwrap().lease.expect("a lease");
    let part = Lease { id: three.id.clone(), units: 2 };
    let d = h.backend.release(&key, &rules, &part).await.unwrap();
    assert_eq!((d.remaining(), d.reset_after()), (3, ms(10_000)), "1 + 1 held");
    let d = h.check(&key, &rules, 0).await;
    assert_eq!(d.remaining(), 3, "the lease holds 1 unit now");
    let d = h.backend.release(&key, &rules, &three).await.unwrap();
    assert_eq!(d.remaining(), 4, "only the unit left was given back");
    let d = h.backend.release(&key, &rules, &one).await.unwrap();
    assert_eq!((d.remaining(), d.reset_after()), (5, Duration::ZERO));
    // Both leases are gone: releasing them again changes nothing.
    h.backend.release(&key, &rules, &three).await.unwrap();
    assert_eq!(h.backend.acquire(&key, &rules, 5).await.unwrap().decision.remaining(), 0);
}

/// After a denial, `retry_after` is the first instant the same cost fits, for every
/// algorithm: a microsecond earlier it is still refused (and told to wait that microsecond).
pub async fn retry_after_is_the_first_admitting_instant(h: &Harness<impl Backend>) {
    for rule in one_of_each(5, period("700ms")) {
        let rules = set([rule.clone()]);
        let key = h.key("retry-first");
        for (round, cost) in [4u64, 3, 2, 5, 1, 4, 2, 2, 3, 5].into_iter().enumerate() {
            let d = h.take(&key, &rules, cost).await;
            if d.allowed() {
                h.advance(ms(61));
                continue;
            }
            let wait = d.retry_after();
            assert!(wait > us(1), "{rule:?}, round {round}: {wait:?}");
            h.advance(wait - us(1));
            let d = h.take(&key, &rules, cost).await;
            assert!(!d.allowed(), "{rule:?}, round {round}: admitted before {wait:?}");
            assert_eq!(d.retry_after(), us(1), "{rule:?}, round {round}");
            h.advance(us(1));
            assert!(h.take(&key, &rules, cost).await.allowed(), "{rule:?}, round {round}");
        }
    }
}

/// A batch may hold any operation: an acquire is all or nothing with the checks of its group
/// (its lease is not taken when a check refuses), and a release and a refund in a batch give
/// back as they do alone.
pub async fn batch_holds_any_operation(h: &Harness<impl Backend>) {
    let leases = set([Rule::concurrency(2, period("10s"))]);
    let route = set([Rule::fixed_window(1, Period::HOUR)]);
    let (worker, upload) = (h.key("worker"), h.key("upload"));
    let (first, second): (LeaseId, LeaseId) = ("first".parse().unwrap(), "second".parse().unwrap());
    let acquire = |lease| Operation::Acquire { cost: 1, lease };
    let held = |d: Decision| d.remaining();

    let d =
        h.batch(&[Part::operation(&worker, &leases, acquire(&first)), Part::new(&upload, &route, 1)]).await;
    assert_eq!(allowed(&d), [true, true]);
    assert_eq!((d[0].remaining(), d[1].remaining()), (1, 0));
    // The route refuses: the group takes nothing, so the second lease holds no unit.
    let d =
        h.batch(&[Part::operation(&worker, &leases, acquire(&second)), Part::new(&upload, &route, 1)]).await;
    assert_eq!(allowed(&d), [true, false]);
    assert_eq!(held(h.check(&worker, &leases, 0).await), 1, "only the first lease holds a unit");

    // A release and a refund, each its own group.
    let lease = Lease { id: first.clone(), units: 1 };
    let d = h
        .batch(&[
            Part::operation(&worker, &leases, Operation::Release { lease: &lease }),
            Part::operation(&upload, &route, Operation::Refund { amount: 1 }).in_group(1),
        ])
        .await;
    assert_eq!((d[0].remaining(), d[1].remaining()), (2, 1));
    assert_eq!(held(h.check(&worker, &leases, 0).await), 2);
    assert!(h.check(&upload, &route, 1).await.allowed(), "the refunded unit is there again");
    // An acquire is still refused a plain check's cost on a concurrency rule.
    match h.backend.check_batch(&[Part::new(&worker, &leases, 1)]).await {
        Err(Error::InPart { part: 0, error }) => assert!(matches!(*error, Error::LeaseRequired { index: 0 })),
        other => panic!("expected LeaseRequired in part 0, got {other:?}"),
    }
}

/// Expands to one `#[tokio::test]` per conformance scenario, each on a fresh harness built by
/// `make: FnOnce(ManualClock) -> impl Backend`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            fixed_window_clock_edges,
            fixed_window_first_hit,
            sliding_window_log_is_exact,
            sliding_window_counter_weights_previous_window,
            token_bucket_refills_exactly,
            gcra_spacing_and_burst,
            concurrency_leases,
            peek_consumes_nothing,
            reset_restores_full,
            refund_gives_back,
            bad_input_is_an_error,
            multi_rule_all_or_nothing,
            a_rule_keeps_one_state_across_rule_sets,
            retry_after_is_honest,
            batch_is_all_or_nothing_across_keys,
            batch_sums_shared_states_and_orders_groups,
            batch_matches_single_checks,
            batch_bad_input_is_an_error,
            batch_bounds_are_inclusive,
            concurrency_partial_release,
            retry_after_is_the_first_admitting_instant,
            batch_holds_any_operation
        );
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test]
            async fn $name() {
                let harness = $crate::conformance::Harness::new($make);
                $crate::conformance::$name(&harness).await;
            }
        )*
    };
}
