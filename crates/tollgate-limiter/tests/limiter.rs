//! The limiter around a backend that can be made to fail: failure policies, the breaker, delay
//! and shadow. Time is tokio's paused clock, which the backend's clock follows, so nothing here
//! waits for real.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::{
    Backend, BatchPlan, Clock, Decision, Error, MemoryBackend, Operation, Part, Period, Rule, RuleSet,
    Timestamp,
};
use tollgate_limiter::{
    BreakerState, Check, FailurePolicy, LimitError, Limiter, LimiterSettings, Mode, OnLimit, Policy,
};

/// Wall time that follows tokio's (pausable) clock.
struct TokioClock {
    wall: Timestamp,
    start: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.wall.saturating_add(self.start.elapsed())
    }
}

/// A memory backend that fails on demand, counting the calls it gets; with `at_once` set it
/// also answers checks without awaiting ([`Backend::try_execute_now`]), as the memory backend
/// does.
struct Flaky {
    inner: MemoryBackend<TokioClock>,
    down: AtomicBool,
    calls: AtomicUsize,
    at_once: AtomicBool,
    /// Calls of `execute` (awaited).
    awaited: AtomicUsize,
}

impl Flaky {
    fn new() -> Arc<Self> {
        let clock = TokioClock {
            wall: Timestamp::from_micros(1_700_000_000_000_000),
            start: tokio::time::Instant::now(),
        };
        Arc::new(Flaky {
            inner: MemoryBackend::with_clock(clock),
            down: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            at_once: AtomicBool::new(false),
            awaited: AtomicUsize::new(0),
        })
    }

    fn fail(&self) -> Result<(), Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) { Err(Error::Unavailable("down".into())) } else { Ok(()) }
    }
}

#[async_trait]
impl Backend for Flaky {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        self.awaited.fetch_add(1, Ordering::Relaxed);
        self.fail()?;
        self.inner.execute_now(key, rules, op)
    }
    fn try_execute_now(
        &self,
        key: &str,
        rules: &RuleSet,
        op: Operation<'_>,
    ) -> Option<Result<Decision, Error>> {
        self.at_once
            .load(Ordering::Relaxed)
            .then(|| self.fail().and_then(|()| self.inner.execute_now(key, rules, op)))
    }
    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        self.awaited.fetch_add(1, Ordering::Relaxed);
        self.fail()?;
        self.inner.check_planned_now(batch)
    }
    fn try_check_planned_now(&self, batch: &BatchPlan<'_>) -> Option<Result<Vec<Decision>, Error>> {
        self.at_once
            .load(Ordering::Relaxed)
            .then(|| self.fail().and_then(|()| self.inner.check_planned_now(batch)))
    }
    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.fail()?;
        self.inner.reset_now(key, rules)
    }
    async fn ping(&self) -> Result<(), Error> {
        self.fail()
    }
}

fn policy(limit: u64) -> Policy {
    Policy::enforce("p", RuleSet::new([Rule::fixed_window(limit, Period::MINUTE)]).unwrap())
}

fn limiter(backend: &Arc<Flaky>, on_failure: FailurePolicy) -> Limiter {
    let settings = LimiterSettings { on_failure, ..LimiterSettings::default() };
    Limiter::new(backend.clone(), "flaky", settings)
}

#[tokio::test(start_paused = true)]
async fn local_fallback_decides_with_the_same_rules_and_says_degraded() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Local);
    let p = policy(2);
    assert!(!limiter.check("k", &p, 1).await.unwrap().degraded);
    backend.down.store(true, Ordering::Relaxed);
    let v = limiter.check("k", &p, 1).await.unwrap();
    assert!(v.degraded && v.allowed());
    assert!(limiter.check("k", &p, 1).await.unwrap().allowed());
    let v = limiter.check("k", &p, 1).await.unwrap();
    assert!(v.degraded && !v.allowed(), "the local limiter enforces the limit too");
}

/// A backend answering at once, and a limiter over it whose breaker opens after two failures.
fn answering_at_once(on_failure: FailurePolicy) -> (Arc<Flaky>, Limiter) {
    let backend = Flaky::new();
    backend.at_once.store(true, Ordering::Relaxed);
    let settings = LimiterSettings { on_failure, failure_threshold: 2, ..LimiterSettings::default() };
    let limiter = Limiter::new(backend.clone(), "flaky", settings);
    (backend, limiter)
}

#[tokio::test(start_paused = true)]
async fn a_batch_answered_at_once_is_taken_as_awaited_ones_are_and_fails_alike() {
    let (backend, limiter) = answering_at_once(FailurePolicy::Closed);
    let (one, three) = (policy(1), policy(3));
    let both = |a: &'static str| {
        [Check { key: a, policy: &one, cost: 1 }, Check { key: "shared", policy: &three, cost: 1 }]
    };
    assert!(limiter.check_all(&both("a")).await.unwrap().admitted);
    // "a" is spent: all or nothing, "shared" is not taken, at once as when awaited.
    let refused = limiter.check_all_now(&both("a")).expect("a memory backend answers at once").unwrap();
    assert!(!refused.admitted && refused.verdicts[1].allowed(), "{refused:?}");
    let each = limiter.check_each_now(&both("b")).unwrap().unwrap();
    assert!(each[0].allowed() && each[1].allowed());
    assert_eq!(each[1].decision.remaining(), 1, "shared was taken twice of three, not three times");
    assert_eq!(backend.awaited.load(Ordering::Relaxed), 0, "answered without `check_planned`");
    // Invalid input is refused at once, before the backend.
    let calls = backend.calls.load(Ordering::Relaxed);
    let too_much = [Check { key: "c", policy: &one, cost: 2 }];
    let Some(Err(LimitError::Invalid(refused))) = limiter.check_all_now(&too_much) else {
        panic!("not refused")
    };
    // A batch of one part is decided as a lone operation, but refused as its plan refuses it.
    let planned = BatchPlan::new(&[Part::new("c", &one.rules, 2)]).unwrap_err();
    assert_eq!(format!("{refused:?}"), format!("{planned:?}"));
    assert_eq!(backend.calls.load(Ordering::Relaxed), calls);
    let solo = [Check { key: "solo", policy: &one, cost: 1 }];
    assert!(limiter.check_all_now(&solo).unwrap().unwrap().admitted);
    assert!(!limiter.check_each_now(&solo).unwrap().unwrap()[0].allowed());
    assert_eq!(backend.calls.load(Ordering::Relaxed), calls + 2, "each asked the backend once");
    // Failures at once count as awaited ones do: the failure policy answers (closed: refused),
    // and the breaker opens at its threshold.
    backend.down.store(true, Ordering::Relaxed);
    for _ in 0..2 {
        assert!(matches!(limiter.check_all(&both("d")).await, Err(LimitError::Unavailable(_))));
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    // A backend that cannot answer at once is not asked, and nothing is counted.
    backend.at_once.store(false, Ordering::Relaxed);
    backend.down.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    let calls = backend.calls.load(Ordering::Relaxed);
    assert!(limiter.check_all_now(&both("e")).is_none() && limiter.check_each_now(&both("e")).is_none());
    assert_eq!(backend.calls.load(Ordering::Relaxed), calls);
    assert!(limiter.check_all(&both("e")).await.unwrap().admitted);
    assert_eq!(backend.awaited.load(Ordering::Relaxed), 1, "awaited instead");
}

#[tokio::test(start_paused = true)]
async fn an_answer_at_once_is_taken_as_awaited_ones_are_and_fails_alike() {
    let (backend, limiter) = answering_at_once(FailurePolicy::Local);
    let p = policy(3);
    let v = limiter.check("k", &p, 1).await.unwrap();
    assert!(v.allowed() && !v.degraded);
    assert_eq!(v.decision.remaining(), 2);
    assert_eq!(backend.awaited.load(Ordering::Relaxed), 0, "answered without `execute`");
    // Failures at once count as awaited ones do: answered by the failure policy, and the
    // breaker opens at its threshold.
    backend.down.store(true, Ordering::Relaxed);
    for _ in 0..2 {
        let v = limiter.check("k", &p, 1).await.unwrap();
        assert!(v.degraded && v.allowed());
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let asked = backend.calls.load(Ordering::Relaxed);
    for _ in 0..10 {
        assert!(limiter.check("k", &p, 1).await.unwrap().degraded);
    }
    // Only the probe (its `ping`) may have called.
    assert!(backend.calls.load(Ordering::Relaxed) <= asked + 1, "an open breaker asks nothing");
    // A backend that cannot answer at once is awaited.
    backend.at_once.store(false, Ordering::Relaxed);
    backend.down.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert!(!limiter.check("k", &p, 1).await.unwrap().degraded);
    assert_eq!(backend.awaited.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn open_admits_and_closed_refuses_while_down() {
    let backend = Flaky::new();
    backend.down.store(true, Ordering::Relaxed);
    let p = policy(1);
    let open = limiter(&backend, FailurePolicy::Open);
    for _ in 0..5 {
        let v = open.check("k", &p, 1).await.unwrap();
        assert!(v.allowed() && v.degraded);
        assert_eq!(v.decision.remaining(), 1);
    }
    let closed = limiter(&backend, FailurePolicy::Closed);
    assert!(matches!(closed.check("k", &p, 1).await, Err(LimitError::Unavailable(_))));
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_not_a_backend_failure() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Closed);
    for _ in 0..10 {
        assert!(matches!(limiter.check("", &policy(1), 1).await, Err(LimitError::Invalid(_))));
        assert!(matches!(limiter.check("k", &policy(1), 2).await, Err(LimitError::Invalid(_))));
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert_eq!(backend.calls.load(Ordering::Relaxed), 0, "refused before the backend");
}

#[tokio::test(start_paused = true)]
async fn breaker_stops_calling_a_dead_backend_and_closes_when_it_returns() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Local);
    let p = policy(1000);
    backend.down.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        limiter.check("k", &p, 1).await.unwrap();
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let calls = backend.calls.load(Ordering::Relaxed);
    for _ in 0..100 {
        assert!(limiter.check("k", &p, 1).await.unwrap().degraded);
    }
    // Only the probe (every 250 ms of the paused clock, none elapsed) may have called.
    assert!(backend.calls.load(Ordering::Relaxed) <= calls + 1);

    backend.down.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert!(!limiter.check("k", &p, 1).await.unwrap().degraded);
}

#[tokio::test(start_paused = true)]
async fn delay_holds_a_request_until_it_fits() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Closed);
    // One per 100 ms, no burst beyond one.
    let rules = RuleSet::new([Rule::gcra(10, Period::SECOND, 1)]).unwrap();
    let p =
        Policy::enforce("d", rules).with_on_limit(OnLimit::Delay { max_wait: Duration::from_millis(250) });
    assert!(limiter.check("k", &p, 1).await.unwrap().waited.is_zero());
    let v = limiter.check("k", &p, 1).await.unwrap();
    assert!(v.allowed());
    assert!(
        v.waited >= Duration::from_millis(99) && v.waited <= Duration::from_millis(110),
        "{:?}",
        v.waited
    );

    // Three more at once: the third would wait 300 ms, beyond max_wait, so it is denied after
    // waiting no more than max_wait.
    let (a, b, c) =
        tokio::join!(limiter.check("k", &p, 1), limiter.check("k", &p, 1), limiter.check("k", &p, 1));
    let waits: Vec<_> = [a, b, c].into_iter().map(|v| v.unwrap()).collect();
    assert_eq!(waits.iter().filter(|v| v.allowed()).count(), 2);
    assert!(waits.iter().all(|v| v.waited <= Duration::from_millis(250)));
}

#[tokio::test(start_paused = true)]
async fn delay_is_bounded_in_count() {
    let backend = Flaky::new();
    let settings = LimiterSettings { max_delayed: 1, ..LimiterSettings::default() };
    let limiter = Limiter::new(backend.clone(), "flaky", settings);
    let rules = RuleSet::new([Rule::gcra(1, Period::SECOND, 1)]).unwrap();
    let p = Policy::enforce("d", rules).with_on_limit(OnLimit::Delay { max_wait: Duration::from_secs(5) });
    limiter.check("k", &p, 1).await.unwrap();
    let (a, b) = tokio::join!(limiter.check("k", &p, 1), async {
        tokio::task::yield_now().await;
        limiter.check("k", &p, 1).await
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.allowed() && a.waited >= Duration::from_millis(999));
    assert!(!b.allowed() && b.waited.is_zero(), "the only slot was taken: denied at once");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_frees_its_slot() {
    let backend = Flaky::new();
    let settings = LimiterSettings { max_delayed: 1, ..LimiterSettings::default() };
    let limiter = Limiter::new(backend.clone(), "flaky", settings);
    let rules = RuleSet::new([Rule::gcra(1, Period::SECOND, 1)]).unwrap();
    let p = Policy::enforce("d", rules).with_on_limit(OnLimit::Delay { max_wait: Duration::from_secs(5) });
    limiter.check("k", &p, 1).await.unwrap();
    // The client goes away after 10 ms.
    let gone = tokio::time::timeout(Duration::from_millis(10), limiter.check("k", &p, 1)).await;
    assert!(gone.is_err());
    let v = limiter.check("k", &p, 1).await.unwrap();
    assert!(v.allowed() && !v.waited.is_zero(), "the slot was free again");
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_admits_and_reports_the_denial() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Closed);
    let p = policy(1).with_mode(Mode::Shadow);
    let first = limiter.check("k", &p, 1).await.unwrap();
    assert!(first.allowed() && !first.shadow_denied);
    let second = limiter.check("k", &p, 1).await.unwrap();
    assert!(second.allowed() && second.shadow_denied && !second.decision.allowed());
}

#[tokio::test(start_paused = true)]
async fn reset_fails_loudly_when_the_backend_is_down() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Open);
    backend.down.store(true, Ordering::Relaxed);
    assert!(matches!(limiter.reset("k", &policy(1).rules).await, Err(LimitError::Unavailable(_))));
}

/// Issue 18: the local fallback is bounded like the memory backend: past
/// `fallback_max_keys`, the soonest-expiring key is forgotten.
#[tokio::test(start_paused = true)]
async fn the_local_fallback_holds_at_most_fallback_max_keys() {
    let backend = Flaky::new();
    backend.down.store(true, Ordering::Relaxed);
    let settings = LimiterSettings {
        on_failure: FailurePolicy::Local,
        fallback_max_keys: tollgate_core::MIN_MAX_KEYS,
        ..LimiterSettings::default()
    };
    let limiter = Limiter::new(backend.clone(), "flaky", settings);
    // Windows open at each key's first request: "first" expires soonest.
    let rules = RuleSet::new([Rule::fixed_window_from_first_hit(1, Period::HOUR)]).unwrap();
    let p = Policy::enforce("p", rules);
    assert!(limiter.check("first", &p, 1).await.unwrap().allowed());
    assert!(!limiter.check("first", &p, 1).await.unwrap().allowed());
    for i in 0..tollgate_core::MIN_MAX_KEYS - 1 {
        assert!(limiter.check(&format!("k{i}"), &p, 1).await.unwrap().allowed());
    }
    assert!(!limiter.check("first", &p, 1).await.unwrap().allowed(), "at the cap, nothing is evicted");
    assert!(limiter.check("one-more", &p, 1).await.unwrap().allowed());
    let v = limiter.check("first", &p, 1).await.unwrap();
    assert!(v.degraded && v.allowed(), "\"first\" was evicted for \"one-more\"");
}

/// `check_each`: one backend call, each check decided alone and in order, where `check_all`
/// is all or nothing.
#[tokio::test(start_paused = true)]
async fn check_each_decides_every_check_alone_in_one_call() {
    let backend = Flaky::new();
    let limiter = limiter(&backend, FailurePolicy::Closed);
    let (one, two) = (policy(1), policy(2));
    let shadow = policy(1).with_mode(Mode::Shadow);
    let checks = [
        Check { key: "a", policy: &two, cost: 1 },
        Check { key: "b", policy: &one, cost: 1 },
        Check { key: "b", policy: &one, cost: 1 },
        Check { key: "s", policy: &shadow, cost: 1 },
        Check { key: "s", policy: &shadow, cost: 1 },
    ];
    let verdicts = limiter.check_each(&checks).await.unwrap();
    assert_eq!(backend.calls.load(Ordering::Relaxed), 1, "one backend call");
    let allowed: Vec<bool> = verdicts.iter().map(|v| v.decision.allowed()).collect();
    assert_eq!(allowed, [true, true, false, true, false], "the second check of b sees the first's unit");
    assert!(verdicts[4].shadow_denied && verdicts[4].allowed());
    // `a` was charged though `b` refused: `check_all` would have charged nothing.
    assert_eq!(limiter.peek("a", &two.rules).await.unwrap().decision.remaining(), 1);
    let joint = limiter.check_all(&checks[..2]).await.unwrap();
    assert!(!joint.admitted);
    assert_eq!(limiter.peek("a", &two.rules).await.unwrap().decision.remaining(), 1);

    // Bad input is refused before the backend, naming the check.
    let too_much = [Check { key: "a", policy: &two, cost: 1 }, Check { key: "c", policy: &one, cost: 5 }];
    let calls = backend.calls.load(Ordering::Relaxed);
    assert!(matches!(
        limiter.check_each(&too_much).await,
        Err(LimitError::Invalid(Error::InPart { part: 1, .. }))
    ));
    assert_eq!(backend.calls.load(Ordering::Relaxed), calls);
}
