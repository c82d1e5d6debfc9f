//! [`Limiter`]: decisions from the primary backend, or from the failure policy when it fails.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tollgate_core::{
    Backend, BatchPlan, Clock, Decision, Error, Lease, LeaseId, MemoryBackend, Operation, Part, RuleSet,
    SystemClock, Timestamp,
};
use tracing::Instrument as _;
use tracing::Level;
use tracing::field::Empty;
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};

use crate::breaker::{Breaker, BreakerState};
use crate::decision_log::{self, DecisionLog, DecisionLogSettings};
use crate::metrics as m;
use crate::policy::Outcome;
use crate::reserve::{self, Held, Leftover, Reservations, ReserveStats, Step};
use crate::traced::traced;
use crate::{Mode, OnLimit, Policy};

/// What to answer when the primary backend fails (or its breaker is open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Admit every request.
    Open,
    /// Refuse: operations fail with [`LimitError::Unavailable`].
    Closed,
    /// Decide from an in-process limiter with the same rules. With N instances, each admits up
    /// to the limit on its own, so up to N times the limit is admitted during an outage.
    #[default]
    Local,
}

impl FailurePolicy {
    /// The policy's name as written in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::Local => "local",
        }
    }
}

/// How a [`Limiter`] behaves around its primary backend.
#[derive(Clone, Debug)]
pub struct LimiterSettings {
    /// What to answer when the primary backend fails.
    pub on_failure: FailurePolicy,
    /// Failures in a row that open the circuit breaker.
    pub failure_threshold: u32,
    /// How often the breaker probes the backend while open.
    pub probe_interval: Duration,
    /// Most requests held at once by the `delay` strategy; beyond, they are denied at once.
    pub max_delayed: usize,
    /// Most keys the local fallback (the `local` failure policy's in-memory limiter) holds;
    /// past it, the keys whose state expires soonest are forgotten early. At least
    /// [`tollgate_core::MIN_MAX_KEYS`] (a smaller value is raised to it).
    pub fallback_max_keys: usize,
    /// The decision log (one line per refused request), or None for none (the default).
    /// [`Limiter::set_decision_log`] changes it later.
    pub decision_log: Option<DecisionLogSettings>,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            on_failure: FailurePolicy::Local,
            failure_threshold: 3,
            probe_interval: Duration::from_millis(250),
            max_delayed: 1024,
            fallback_max_keys: tollgate_core::DEFAULT_MAX_KEYS,
            decision_log: None,
        }
    }
}

/// The answer to a check under a policy.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The decision as the rules made it (in shadow mode, possibly a denial).
    pub decision: Decision,
    /// True when answered without the primary backend (failure policy `open` or `local`).
    pub degraded: bool,
    /// True when the policy is in shadow mode and the rules denied: answered as admitted.
    pub shadow_denied: bool,
    /// How long the `delay` strategy held the request.
    pub waited: Duration,
}

impl Verdict {
    /// Whether the request is to be let through (shadow denials are).
    pub fn allowed(&self) -> bool {
        self.decision.allowed() || self.shadow_denied
    }
}

/// One key's check in [`Limiter::check_all`].
#[derive(Clone, Copy, Debug)]
pub struct Check<'a> {
    /// The key.
    pub key: &'a str,
    /// The policy it is checked under.
    pub policy: &'a Policy,
    /// Units asked for; 0 peeks.
    pub cost: u64,
}

impl<'a> Check<'a> {
    /// The backend batch [`Limiter::check_all`] runs for `checks`: the enforced checks form
    /// group 0 (all or nothing), each shadow-mode check a group of its own.
    pub fn parts(checks: &[Check<'a>]) -> Vec<Part<'a>> {
        checks
            .iter()
            .zip(1..)
            .map(|(c, alone)| {
                let group = if c.policy.mode == Mode::Shadow { alone } else { 0 };
                Part::new(c.key, &c.policy.rules, c.cost).in_group(group)
            })
            .collect()
    }
}

/// The answer to [`Limiter::check_all`].
#[derive(Clone, Debug)]
pub struct JointVerdict {
    /// Whether the enforced checks were admitted (all of them, and consumed) or not (none).
    pub admitted: bool,
    /// Each check's verdict, in order: its own rules' decision (a check may be `allowed()`
    /// while another refused the whole), shadow denials marked.
    pub verdicts: Vec<Verdict>,
}

/// Why the limiter gave no verdict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The caller's input was refused before any backend was asked (bad key, impossible cost).
    #[error(transparent)]
    Invalid(Error),
    /// The primary backend failed and the failure policy is `closed`.
    #[error("the rate-limit backend is unavailable: {0}")]
    Unavailable(Error),
}

struct Inner {
    primary: Arc<dyn Backend>,
    backend_name: Arc<str>,
    fallback: MemoryBackend,
    breaker: Breaker,
    settings: LimiterSettings,
    delay_slots: Semaphore,
    decision_log: decision_log::Shared,
    reservations: Reservations,
    /// Times backend calls: quanta's clock, as `SystemClock`'s (a few instructions a read,
    /// against the hundred of `Instant::now`).
    timer: quanta::Clock,
    /// The backend calls' durations ([`m::BACKEND_SECONDS`], this limiter's `backend`),
    /// registered once, as the breaker's gauge, rather than looked up with its label each call.
    backend_seconds: metrics::Histogram,
}

/// Decisions under [`Policy`]s from a primary backend, with a failure policy, a circuit breaker
/// and the `delay` strategy. Cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.inner.backend_name)
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// What reservations make of one check.
enum Reserved {
    /// Answered from a block (the block, to put the units back if the answer is undone).
    Served(Decision, Held),
    /// Reserve this many units (more than the cost) with the check.
    Reserve(u64),
    /// The plain path: the check's own cost.
    Plain,
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout(_) => "timeout",
        Error::Unavailable(_) => "unavailable",
        _ => "error",
    }
}

impl Limiter {
    /// A limiter over `primary`, named `backend_name` in metrics and logs.
    pub fn new(primary: Arc<dyn Backend>, backend_name: &str, settings: LimiterSettings) -> Self {
        Self::with_clock(primary, backend_name, settings, SystemClock::new())
    }

    /// A limiter whose reserved blocks (see [`reserve`](crate::reserve)) expire by `clock`
    /// (tests move time by hand; give the backend the same clock).
    pub fn with_clock(
        primary: Arc<dyn Backend>,
        backend_name: &str,
        settings: LimiterSettings,
        clock: impl Clock,
    ) -> Self {
        let inner = Inner {
            primary,
            backend_name: backend_name.into(),
            fallback: MemoryBackend::builder()
                .max_keys(settings.fallback_max_keys.max(tollgate_core::MIN_MAX_KEYS))
                .name("local_fallback")
                .build()
                .unwrap_or_else(|_| unreachable!("max_keys is at least MIN_MAX_KEYS")),
            breaker: Breaker::new(settings.failure_threshold),
            delay_slots: Semaphore::new(settings.max_delayed),
            decision_log: decision_log::Shared::from(
                settings.decision_log.clone().map(|s| Arc::new(DecisionLog::new(s))),
            ),
            settings,
            reservations: Reservations::new(Arc::new(clock)),
            timer: quanta::Clock::new(),
            backend_seconds: metrics::histogram!(m::BACKEND_SECONDS, "backend" => backend_name.to_owned()),
        };
        metrics::gauge!(m::BREAKER_OPEN, "backend" => inner.backend_name.to_string()).set(0.0);
        Limiter { inner: Arc::new(inner) }
    }

    /// The primary backend's name.
    pub fn backend_name(&self) -> &str {
        &self.inner.backend_name
    }

    /// Which engine the primary backend decides with, if it has several (see
    /// [`Backend::engine`]).
    pub fn backend_engine(&self) -> Option<&'static str> {
        self.inner.primary.engine()
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.settings.on_failure
    }

    /// Turns the decision log on with `settings`, or off with None; a log whose settings are
    /// unchanged keeps its counts (a configuration reload calls this every time).
    pub fn set_decision_log(&self, settings: Option<DecisionLogSettings>) {
        decision_log::replace(&self.inner.decision_log, settings);
    }

    /// The decision log's settings, None while it is off.
    pub fn decision_log(&self) -> Option<DecisionLogSettings> {
        self.inner.decision_log.load().as_ref().map(|log| log.settings().clone())
    }

    /// Whether the primary backend is in use or bypassed.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// Asks the primary backend whether it answers now (a readiness check; does not touch the
    /// breaker).
    pub async fn ping(&self) -> Result<(), Error> {
        self.inner.primary.ping().await
    }

    /// Checks `cost` units (0 peeks) for `key` under `policy`, applying its mode and `on_limit`
    /// strategy, and records the outcome in the metrics.
    ///
    /// Under a policy with [`Reserve`](crate::Reserve) on, a hot key is answered from a block
    /// of units reserved in advance (see [`reserve`](crate::reserve)).
    pub async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Verdict, LimitError> {
        if let Some(answered) = self.check_now(key, policy, cost) {
            return answered;
        }
        // Boxed: the awaited path's state (a backend call, a reservation, a delay: about 1.5 KiB)
        // would otherwise size this future, and every caller's around it, for the in-process
        // answer as well, which the server then allocates and copies on each request.
        Box::pin(self.check_awaited(key, policy, cost)).await
    }

    /// [`check`](Self::check) when it was not answered now: in its span, if one is wanted.
    async fn check_awaited(&self, key: &str, policy: &Policy, cost: u64) -> Result<Verdict, LimitError> {
        let span = self.decision_span("check", || policy.name.to_string(), 1, cost);
        if span.is_disabled() {
            return self.check_untraced(key, policy, cost).await;
        }
        traced(span, self.check_untraced(key, policy, cost), |v| (outcome(v, true), v.degraded)).await
    }

    /// [`check`](Self::check) answered without awaiting, where it can be: on a backend that
    /// decides in process ([`Backend::try_execute_now`]: the memory backend), or by the failure
    /// policy while the breaker is open, under a policy that neither reserves nor delays, with
    /// no decision span wanted. `None` otherwise, having asked and counted nothing: the caller
    /// then awaits `check`, which answers alike. A caller on the hot path (the tower layer)
    /// spares the in-process answer a future.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
    /// use tollgate_limiter::{Limiter, LimiterSettings, Policy};
    ///
    /// let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default());
    /// let policy = Policy::enforce("p", RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap());
    /// assert!(limiter.check_now("k", &policy, 1).unwrap().unwrap().allowed());
    /// assert!(!limiter.check_now("k", &policy, 1).unwrap().unwrap().allowed());
    /// ```
    pub fn check_now(&self, key: &str, policy: &Policy, cost: u64) -> Option<Result<Verdict, LimitError>> {
        let reserves = policy.reserve.is_on() && cost > 0;
        if reserves || matches!(policy.on_limit, OnLimit::Delay { .. }) || debug_spans_wanted() {
            return None;
        }
        let (rules, op) = (&policy.rules, Operation::Check { cost });
        // Refused before the backend, as `decide` does.
        if let Err(e) = op.validate(key, rules) {
            return Some(Err(LimitError::Invalid(e)));
        }
        let primary = &*self.inner.primary;
        let decided = self.answer_now(
            || primary.try_execute_now(key, rules, op),
            || Decision::admitted_unchecked(rules),
            |fallback| fallback.execute_now(key, rules, op),
        )?;
        let verdict = match decided {
            Ok(decided) => self.verdict(policy, decided),
            Err(e) => return Some(Err(e)),
        };
        self.record(key, policy, cost, &verdict, true);
        Some(Ok(verdict))
    }

    /// [`check`](Self::check) itself, outside its span.
    async fn check_untraced(&self, key: &str, policy: &Policy, cost: u64) -> Result<Verdict, LimitError> {
        let op = Operation::Check { cost };
        let decided = match self.reserved(key, policy, cost).await? {
            Some(decided) => decided,
            None => self.decide(key, &policy.rules, op).await?,
        };
        let mut verdict = self.verdict(policy, decided);
        if let OnLimit::Delay { max_wait } = policy.on_limit
            && !verdict.allowed()
            && cost > 0
        {
            verdict = self.delay(key, policy, op, verdict, max_wait).await?;
        }
        self.record(key, policy, cost, &verdict, true);
        Ok(verdict)
    }

    /// Checks several keys in one backend call: the checks under enforcing policies are all
    /// or nothing (consumed only if every one is admitted), and each check under a shadow-mode
    /// policy is decided on its own (counted, never refusing). The `delay` strategy does not
    /// apply: a joint wait could hold one key's units while waiting for another's.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
    /// use tollgate_limiter::{Check, Limiter, LimiterSettings, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default());
    /// let per_user = Policy::enforce("user", RuleSet::new([Rule::fixed_window(5, Period::MINUTE)]).unwrap());
    /// let per_route = Policy::enforce("route", RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap());
    /// let both = [
    ///     Check { key: "alice", policy: &per_user, cost: 1 },
    ///     Check { key: "/upload", policy: &per_route, cost: 1 },
    /// ];
    /// assert!(limiter.check_all(&both).await.unwrap().admitted);
    /// let second = limiter.check_all(&both).await.unwrap();
    /// assert!(!second.admitted);
    /// assert_eq!(second.verdicts[0].decision.remaining(), 4); // alice's unit was not taken
    /// # }
    /// ```
    pub async fn check_all(&self, checks: &[Check<'_>]) -> Result<JointVerdict, LimitError> {
        if let Some(answered) = self.check_all_now(checks) {
            return answered;
        }
        // Boxed, as in `check`: the awaited path's state would size every caller's future.
        Box::pin(self.check_all_awaited(checks)).await
    }

    /// [`check_all`](Self::check_all) answered without awaiting, where it can be, as
    /// [`check_now`](Self::check_now) answers one check: `None`, having asked and counted
    /// nothing, under a policy that reserves, when a decision span is wanted, or on a backend
    /// that must be awaited.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
    /// use tollgate_limiter::{Check, Limiter, LimiterSettings, Policy};
    ///
    /// let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default());
    /// let once = Policy::enforce("once", RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap());
    /// let with = |other| [Check { key: "a", policy: &once, cost: 1 }, Check { key: other, policy: &once, cost: 1 }];
    /// assert!(limiter.check_all_now(&with("b")).unwrap().unwrap().admitted);
    /// assert!(!limiter.check_all_now(&with("c")).unwrap().unwrap().admitted); // "a" is spent
    /// assert!(limiter.check_now("c", &once, 1).unwrap().unwrap().allowed()); // so "c" was not taken
    /// ```
    pub fn check_all_now(&self, checks: &[Check<'_>]) -> Option<Result<JointVerdict, LimitError>> {
        let decided = self.decide_checks_now(checks, &Check::parts(checks))?;
        Some(decided.map(|decisions| self.joint_verdict(checks, decisions)))
    }

    /// [`check_all`](Self::check_all) when it was not answered now: in its span, if one is wanted.
    async fn check_all_awaited(&self, checks: &[Check<'_>]) -> Result<JointVerdict, LimitError> {
        let span = self.batch_span("check_all", checks);
        if span.is_disabled() {
            return self.check_all_untraced(checks).await;
        }
        traced(span, self.check_all_untraced(checks), |joint| {
            let degraded = joint.verdicts.iter().any(|v| v.degraded);
            (if joint.admitted { Outcome::Allowed } else { Outcome::Denied }, degraded)
        })
        .await
    }

    /// [`check_all`](Self::check_all) itself, outside its span.
    async fn check_all_untraced(&self, checks: &[Check<'_>]) -> Result<JointVerdict, LimitError> {
        let decisions = self.decide_checks(checks, &Check::parts(checks), true).await?;
        Ok(self.joint_verdict(checks, decisions))
    }

    /// The verdicts of a joint batch, recorded: an enforced check is taken only if all were
    /// admitted.
    fn joint_verdict(&self, checks: &[Check<'_>], decisions: Vec<(Decision, bool)>) -> JointVerdict {
        let verdicts: Vec<Verdict> =
            checks.iter().zip(decisions).map(|(c, d)| self.verdict(c.policy, d)).collect();
        let admitted = verdicts.iter().all(|v| v.allowed());
        for (check, verdict) in checks.iter().zip(&verdicts) {
            let taken = admitted || check.policy.mode == Mode::Shadow;
            self.record(check.key, check.policy, check.cost, verdict, taken);
        }
        JointVerdict { admitted, verdicts }
    }

    /// Checks several keys in one backend call, each decided on its own: a check is consumed
    /// when its own rules admit it, whatever the others answer (checks are decided in order,
    /// so a later check of the same key sees an earlier one's units). Shadow-mode checks are
    /// counted and never refuse, as in [`check`](Self::check); the `delay` strategy does not
    /// apply.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
    /// use tollgate_limiter::{Check, Limiter, LimiterSettings, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default());
    /// let per_user = Policy::enforce("user", RuleSet::new([Rule::fixed_window(5, Period::MINUTE)]).unwrap());
    /// let per_route = Policy::enforce("route", RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap());
    /// let both = [
    ///     Check { key: "alice", policy: &per_user, cost: 1 },
    ///     Check { key: "/upload", policy: &per_route, cost: 1 },
    /// ];
    /// limiter.check_each(&both).await.unwrap();
    /// let second = limiter.check_each(&both).await.unwrap();
    /// assert!(second[0].allowed() && !second[1].allowed());
    /// assert_eq!(second[0].decision.remaining(), 3); // alice was charged twice
    /// # }
    /// ```
    pub async fn check_each(&self, checks: &[Check<'_>]) -> Result<Vec<Verdict>, LimitError> {
        if let Some(answered) = self.check_each_now(checks) {
            return answered;
        }
        Box::pin(self.check_each_awaited(checks)).await
    }

    /// [`check_each`](Self::check_each) answered without awaiting, where it can be (as
    /// [`check_all_now`](Self::check_all_now)).
    pub fn check_each_now(&self, checks: &[Check<'_>]) -> Option<Result<Vec<Verdict>, LimitError>> {
        let decided = self.decide_checks_now(checks, &each_parts(checks))?;
        Some(decided.map(|decisions| self.each_verdicts(checks, decisions)))
    }

    /// [`check_each`](Self::check_each) when it was not answered now: in its span, if one is
    /// wanted.
    async fn check_each_awaited(&self, checks: &[Check<'_>]) -> Result<Vec<Verdict>, LimitError> {
        let span = self.batch_span("check_each", checks);
        if span.is_disabled() {
            return self.check_each_untraced(checks).await;
        }
        traced(span, self.check_each_untraced(checks), |verdicts| {
            let allowed = verdicts.iter().all(Verdict::allowed);
            (if allowed { Outcome::Allowed } else { Outcome::Denied }, verdicts.iter().any(|v| v.degraded))
        })
        .await
    }

    /// [`check_each`](Self::check_each) itself, outside its span.
    async fn check_each_untraced(&self, checks: &[Check<'_>]) -> Result<Vec<Verdict>, LimitError> {
        let decisions = self.decide_checks(checks, &each_parts(checks), false).await?;
        Ok(self.each_verdicts(checks, decisions))
    }

    /// The verdicts of a batch decided check by check, recorded.
    fn each_verdicts(&self, checks: &[Check<'_>], decisions: Vec<(Decision, bool)>) -> Vec<Verdict> {
        let verdicts: Vec<Verdict> =
            checks.iter().zip(decisions).map(|(c, d)| self.verdict(c.policy, d)).collect();
        for (check, verdict) in checks.iter().zip(&verdicts) {
            self.record(check.key, check.policy, check.cost, verdict, true);
        }
        verdicts
    }

    /// Like [`check`](Self::check), with concurrency rules holding the units under a new lease
    /// (returned when the request is admitted and the rules hold one).
    pub async fn acquire(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<(Verdict, Option<Lease>), LimitError> {
        let span = self.decision_span("acquire", || policy.name.to_string(), 1, cost);
        if span.is_disabled() {
            return self.acquire_untraced(key, policy, cost).await;
        }
        traced(span, self.acquire_untraced(key, policy, cost), |(v, _)| (outcome(v, true), v.degraded)).await
    }

    /// [`acquire`](Self::acquire) itself, outside its span.
    async fn acquire_untraced(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<(Verdict, Option<Lease>), LimitError> {
        let id = LeaseId::random();
        let op = Operation::Acquire { cost, lease: &id };
        let mut verdict = self.verdict(policy, self.decide(key, &policy.rules, op).await?);
        if let OnLimit::Delay { max_wait } = policy.on_limit
            && !verdict.allowed()
            && cost > 0
        {
            verdict = self.delay(key, policy, op, verdict, max_wait).await?;
        }
        self.record(key, policy, cost, &verdict, true);
        let taken = verdict.decision.allowed() && cost > 0 && policy.rules.has_concurrency();
        Ok((verdict, taken.then_some(Lease { id, units: cost })))
    }

    /// What a check of one unit would answer now, consuming nothing and recording no metrics
    /// (for reports such as a consumer's current usage).
    pub async fn peek(&self, key: &str, rules: &RuleSet) -> Result<Verdict, LimitError> {
        let (decision, degraded) = self.decide(key, rules, Operation::Check { cost: 0 }).await?;
        Ok(Verdict { decision, degraded, shadow_denied: false, waited: Duration::ZERO })
    }

    /// Gives back a lease's units (or some of them); reports the state after, as a peek.
    pub async fn release(&self, key: &str, rules: &RuleSet, lease: &Lease) -> Result<Verdict, LimitError> {
        let (decision, degraded) = self.decide(key, rules, Operation::Release { lease }).await?;
        Ok(Verdict { decision, degraded, shadow_denied: false, waited: Duration::ZERO })
    }

    /// Forgets `key`'s state under `rules`, in the primary backend and in the local fallback.
    /// Fails when the primary backend fails, whatever the failure policy: a reset that did not
    /// happen must not look as if it had.
    pub async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), LimitError> {
        tollgate_core::validate_key(key).map_err(|e| LimitError::Invalid(e.into()))?;
        self.inner.fallback.reset_now(key, rules).map_err(LimitError::Invalid)?;
        self.inner.primary.reset(key, rules).await.map_err(|e| {
            if e.is_backend_failure() { LimitError::Unavailable(e) } else { LimitError::Invalid(e) }
        })
    }

    /// What reservations did so far, and the units they hold now.
    pub fn reserve_stats(&self) -> ReserveStats {
        self.inner.reservations.stats()
    }

    /// Gives every reserved unit not yet admitted back to the backend, where the algorithm
    /// takes it back (see [`reserve`](crate::reserve)), and forgets the blocks; returns the
    /// units given back. For a graceful shutdown: checks made meanwhile start new blocks.
    pub async fn shutdown(&self) -> u64 {
        let leftovers = self.inner.reservations.drain_all();
        self.give_back(leftovers).await
    }

    /// A check answered with reservations, or None for the plain path. The flag is true for a
    /// degraded answer.
    async fn reserved(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Option<(Decision, bool)>, LimitError> {
        if !policy.reserve.is_on() || cost == 0 {
            return Ok(None);
        }
        Operation::Check { cost }.validate(key, &policy.rules).map_err(LimitError::Invalid)?;
        let size = match self.reserve_step(key, policy, cost).await {
            Reserved::Plain => return Ok(None),
            Reserved::Served(decision, _) => return Ok(Some((decision, false))),
            Reserved::Reserve(size) => size,
        };
        let sent = self.inner.reservations.now();
        let rules = &policy.rules;
        let answered = self
            .answer(
                self.inner.primary.execute(key, rules, Operation::Check { cost: size }),
                || Decision::admitted_unchecked(rules),
                |fallback| fallback.execute_now(key, rules, Operation::Check { cost }),
            )
            .await;
        let table = &self.inner.reservations;
        let Ok((reply, degraded)) = answered else {
            table.abandoned(key, policy);
            return answered.map(Some);
        };
        if degraded {
            table.abandoned(key, policy);
            // The failure policy answered for this check's own cost.
            return Ok(Some((reply, true)));
        }
        Ok(self.reservation_answered(key, policy, cost, size, sent, &reply).map(|d| (d, false)))
    }

    /// What the reservation table makes of a check of `cost` (above 0, reservations on): the
    /// units of ended blocks given back, the heartbeat sent when due.
    async fn reserve_step(&self, key: &str, policy: &Policy, cost: u64) -> Reserved {
        let table = &self.inner.reservations;
        // Units that cannot go back are counted now; refunds go on in the background, so that
        // this check does not wait for a sweep's round trips.
        let (refunds, lost): (Vec<_>, Vec<_>) = table.sweep_if_due().into_iter().partition(|l| l.refundable);
        self.give_back(lost).await;
        if !refunds.is_empty() {
            let limiter = self.clone();
            tokio::spawn(async move { limiter.give_back(refunds).await });
        }
        let (step, leftover) = table.step(key, policy, cost);
        if let Some(leftover) = leftover {
            self.give_back(vec![leftover]).await;
        }
        let size = match step {
            Step::Plain => return Reserved::Plain,
            Step::Served(decision, held) => {
                metrics::counter!(m::RESERVED_DECISIONS, "policy" => Arc::clone(&policy.name)).increment(1);
                return Reserved::Served(decision, held);
            }
            Step::Reserve { size, heartbeat } if heartbeat => {
                if self.inner.breaker.state() != BreakerState::Closed {
                    table.abandoned(key, policy);
                    return Reserved::Plain;
                }
                let primary = &self.inner.primary;
                match primary.heartbeat(key, &table.instance, reserve::HEARTBEAT_WINDOW).await {
                    Ok(instances) => table.instances_seen(key, policy, instances, size),
                    Err(_) => {
                        // The plain path meets the failure, and the failure policy answers it.
                        table.abandoned(key, policy);
                        return Reserved::Plain;
                    }
                }
            }
            Step::Reserve { size, .. } => size,
        };
        if size.max(1) <= cost {
            table.abandoned(key, policy);
            return Reserved::Plain;
        }
        Reserved::Reserve(size)
    }

    /// Records the backend's `reply` to a reservation of `size` units sent at `sent` for a
    /// check of `cost`: the check's decision from the new block, or None when the reservation
    /// was refused (the check then takes the plain path).
    fn reservation_answered(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        size: u64,
        sent: Timestamp,
        reply: &Decision,
    ) -> Option<Decision> {
        let table = &self.inner.reservations;
        let name = Arc::clone(&policy.name);
        if !reply.allowed() {
            metrics::counter!(m::RESERVE_BLOCKS, "policy" => name, "result" => "refused").increment(1);
            table.refused(key, policy, reply);
            return None;
        }
        metrics::counter!(m::RESERVE_BLOCKS, "policy" => name.clone(), "result" => "taken").increment(1);
        metrics::counter!(m::RESERVED_DECISIONS, "policy" => name).increment(1);
        Some(table.taken(key, policy, cost, size, sent, reply))
    }

    /// [`decide_checks`](Self::decide_checks) without awaiting, where it can be: no check
    /// reserves, no decision span is wanted, and the primary backend (or, its breaker open,
    /// the failure policy) answers at once. `None` otherwise, having asked nothing.
    fn decide_checks_now(
        &self,
        checks: &[Check<'_>],
        parts: &[Part<'_>],
    ) -> Option<Result<Vec<(Decision, bool)>, LimitError>> {
        if debug_spans_wanted() || checks.iter().any(|c| c.policy.reserve.is_on() && c.cost > 0) {
            return None;
        }
        let primary = &*self.inner.primary;
        if let [part] = parts {
            // A batch of one part (an Envoy request of one descriptor) is a lone operation: no
            // plan to make (its cost fits each rule, which `validate` sees, so it fits the
            // group), refused in the batch's words.
            if let Err(error) = part.op.validate(part.key, part.rules) {
                return Some(Err(LimitError::Invalid(Error::InPart { part: 0, error: Box::new(error) })));
            }
            let decided = self.answer_now(
                || primary.try_execute_now(part.key, part.rules, part.op),
                || Decision::admitted_unchecked(part.rules),
                |fallback| fallback.execute_now(part.key, part.rules, part.op),
            )?;
            return Some(decided.map(|(decision, degraded)| vec![(decision, degraded)]));
        }
        let plan = match BatchPlan::new(parts) {
            Ok(plan) => plan,
            Err(e) => return Some(Err(LimitError::Invalid(e))),
        };
        let decided = self.answer_now(
            || primary.try_check_planned_now(&plan),
            || plan.parts().iter().map(|p| Decision::admitted_unchecked(p.rules)).collect(),
            |fallback| fallback.check_planned_now(&plan),
        )?;
        Some(decided.map(|(decisions, degraded)| decisions.into_iter().map(|d| (d, degraded)).collect()))
    }

    /// The decisions of a batch of `checks` (`parts`: their parts as the batch groups them;
    /// with `joint`, group 0 is all or nothing), with reservations where the checks' policies
    /// have them on. A check a block holds is answered from it; one whose key is due a block
    /// reserves it within the batch (its part asks the block's size), and a check whose
    /// reservation is refused, or whose group was refused while one of its parts reserved, is
    /// asked again at its own cost in a second call. Units answered from blocks for a refused
    /// joint group are put back. The flag of each decision is true when degraded.
    async fn decide_checks(
        &self,
        checks: &[Check<'_>],
        parts: &[Part<'_>],
        joint: bool,
    ) -> Result<Vec<(Decision, bool)>, LimitError> {
        let plan = BatchPlan::new(parts).map_err(LimitError::Invalid)?;
        if !checks.iter().any(|c| c.policy.reserve.is_on() && c.cost > 0) {
            let (decisions, degraded) = self.decide_batch(&plan).await?;
            return Ok(decisions.into_iter().map(|d| (d, degraded)).collect());
        }
        let in_joint = |i: usize| joint && parts[i].group == 0;
        let mut answers: Vec<Option<(Decision, bool)>> = vec![None; checks.len()];
        let mut held = Vec::new();
        let mut sizes: Vec<u64> = parts.iter().map(Part::cost).collect();
        for (i, c) in checks.iter().enumerate() {
            if !c.policy.reserve.is_on() || c.cost == 0 {
                continue;
            }
            match self.reserve_step(c.key, c.policy, c.cost).await {
                Reserved::Served(decision, block) => {
                    answers[i] = Some((decision, false));
                    held.push((i, block));
                }
                Reserved::Reserve(size) => sizes[i] = size,
                Reserved::Plain => {}
            }
        }
        let decided = self.decide_pending(checks, parts, &sizes, &mut answers, in_joint).await;
        let admitted = decided.is_ok()
            && (0..checks.len())
                .filter(|&i| in_joint(i))
                .all(|i| answers[i].as_ref().is_some_and(|a| a.0.allowed()));
        // Units answered from blocks go back when their answer is undone: the batch failed, or
        // the joint group was refused.
        let table = &self.inner.reservations;
        let undone: Vec<Leftover> = held
            .into_iter()
            .filter(|&(i, _)| decided.is_err() || (in_joint(i) && !admitted))
            .filter_map(|(i, block)| table.put_back(checks[i].key, checks[i].policy, checks[i].cost, block))
            .collect();
        self.give_back(undone).await;
        decided?;
        Ok(answers.into_iter().map(|a| a.unwrap_or_else(|| unreachable!("every check answered"))).collect())
    }

    /// Decides the checks `answers` has no answer for (see [`decide_checks`](Self::decide_checks)),
    /// parts reserving where `sizes` exceeds their cost.
    async fn decide_pending(
        &self,
        checks: &[Check<'_>],
        parts: &[Part<'_>],
        sizes: &[u64],
        answers: &mut [Option<(Decision, bool)>],
        in_joint: impl Fn(usize) -> bool,
    ) -> Result<(), LimitError> {
        let table = &self.inner.reservations;
        let pending: Vec<usize> = (0..checks.len()).filter(|&i| answers[i].is_none()).collect();
        if pending.is_empty() {
            return Ok(());
        }
        let plain: Vec<Part<'_>> = pending.iter().map(|&i| parts[i]).collect();
        let sized: Vec<Part<'_>> = pending
            .iter()
            .map(|&i| Part::new(parts[i].key, parts[i].rules, sizes[i]).in_group(parts[i].group))
            .collect();
        let reserving: Vec<usize> = pending.iter().copied().filter(|&i| sizes[i] > parts[i].cost()).collect();
        let abandon =
            |which: &[usize]| which.iter().for_each(|&i| table.abandoned(checks[i].key, checks[i].policy));
        // Blocks too large for the batch's plan (the same key twice in a group): no blocks.
        let Ok(sized_plan) = BatchPlan::new(&sized) else {
            abandon(&reserving);
            return self.decide_into(&pending, &plain, answers).await;
        };
        let sent = table.now();
        let answered = self
            .answer(
                self.inner.primary.check_planned(&sized_plan),
                || plain.iter().map(|p| Decision::admitted_unchecked(p.rules)).collect(),
                |fallback| fallback.check_batch_now(&plain),
            )
            .await;
        let (decisions, degraded) = match answered {
            Ok(answer) => answer,
            Err(e) => {
                abandon(&reserving);
                return Err(e);
            }
        };
        if degraded {
            // The failure policy answered the checks' own costs.
            abandon(&reserving);
            pending.iter().zip(decisions).for_each(|(&i, d)| answers[i] = Some((d, true)));
            return Ok(());
        }
        let joint_refused = pending.iter().zip(&decisions).any(|(&i, d)| in_joint(i) && !d.allowed());
        let joint_reserved = reserving.iter().any(|&i| in_joint(i));
        let mut again = Vec::new();
        for (&i, reply) in pending.iter().zip(&decisions) {
            let c = &checks[i];
            if in_joint(i) && joint_refused && joint_reserved {
                // Nothing of the group was taken: asked again at their own costs.
                if sizes[i] > c.cost {
                    if reply.allowed() {
                        table.abandoned(c.key, c.policy)
                    } else {
                        table.refused(c.key, c.policy, reply)
                    }
                }
                again.push(i);
            } else if sizes[i] > c.cost {
                // A part deciding alone, or its group admitted: the block was taken, unless refused.
                match self.reservation_answered(c.key, c.policy, c.cost, sizes[i], sent, reply) {
                    Some(decision) => answers[i] = Some((decision, false)),
                    None => again.push(i),
                }
            } else {
                answers[i] = Some((reply.clone(), false));
            }
        }
        let retry: Vec<Part<'_>> = again.iter().map(|&i| parts[i]).collect();
        self.decide_into(&again, &retry, answers).await
    }

    /// Decides `parts` (the checks `which`) in one batch, as without reservations, into `answers`.
    async fn decide_into(
        &self,
        which: &[usize],
        parts: &[Part<'_>],
        answers: &mut [Option<(Decision, bool)>],
    ) -> Result<(), LimitError> {
        if which.is_empty() {
            return Ok(());
        }
        let plan = BatchPlan::new(parts).map_err(LimitError::Invalid)?;
        let (decisions, degraded) = self.decide_batch(&plan).await?;
        which.iter().zip(decisions).for_each(|(&i, d)| answers[i] = Some((d, degraded)));
        Ok(())
    }

    /// Gives `leftovers` back to the backend where they can go (the rest counted as expired);
    /// returns the units given back.
    async fn give_back(&self, leftovers: Vec<Leftover>) -> u64 {
        let table = &self.inner.reservations;
        let mut returned = 0;
        for leftover in leftovers {
            let op = Operation::Refund { amount: leftover.units };
            let given = leftover.refundable
                && self.inner.breaker.state() == BreakerState::Closed
                && self.inner.primary.execute(&leftover.key, &leftover.rules, op).await.is_ok();
            table.settled(leftover.units, given);
            let metric = if given { m::RESERVE_RETURNED } else { m::RESERVE_EXPIRED };
            metrics::counter!(metric, "policy" => leftover.policy).increment(leftover.units);
            if given {
                returned += leftover.units;
            }
        }
        returned
    }

    fn verdict(&self, policy: &Policy, (decision, degraded): (Decision, bool)) -> Verdict {
        let shadow_denied = policy.mode == Mode::Shadow && !decision.allowed();
        Verdict { decision, degraded, shadow_denied, waited: Duration::ZERO }
    }

    /// Holds a denied request until it fits, within `max_wait` and the bound on held requests.
    /// Dropping the future (the client went away) ends the wait and frees its slot.
    async fn delay(
        &self,
        key: &str,
        policy: &Policy,
        op: Operation<'_>,
        mut verdict: Verdict,
        max_wait: Duration,
    ) -> Result<Verdict, LimitError> {
        let name = Arc::clone(&policy.name);
        if verdict.decision.retry_after() > max_wait {
            return Ok(verdict);
        }
        let Ok(_slot) = self.inner.delay_slots.try_acquire() else {
            metrics::counter!(m::DELAYED, "policy" => name, "result" => "queue_full").increment(1);
            return Ok(verdict);
        };
        let start = Instant::now();
        let deadline = start + max_wait;
        loop {
            // Never spin: a denial always has a wait, but keep at least a millisecond.
            let wait = verdict.decision.retry_after().max(Duration::from_millis(1));
            if Instant::now() + wait > deadline {
                break;
            }
            tokio::time::sleep(wait).await;
            verdict = self.verdict(policy, self.decide(key, &policy.rules, op).await?);
            if verdict.allowed() {
                break;
            }
        }
        verdict.waited = start.elapsed();
        let result = if verdict.allowed() { "admitted" } else { "denied" };
        metrics::counter!(m::DELAYED, "policy" => name, "result" => result).increment(1);
        Ok(verdict)
    }

    /// Records a verdict in the metrics, and a refusal by its own rules in the decision log;
    /// `taken` is false for a check refused because another check of its batch was (counted as
    /// denied; the check that refused is the one logged).
    fn record(&self, key: &str, policy: &Policy, cost: u64, verdict: &Verdict, taken: bool) {
        if !verdict.decision.allowed()
            && let Some(log) = self.inner.decision_log.load().as_ref()
            && let Some(line) =
                log.line(key, policy, cost, &verdict.decision, verdict.degraded, verdict.shadow_denied)
        {
            decision_log::write(&line);
        }
        // Metric labels share the policy name (an Arc) rather than copying it per decision.
        let name = &policy.name;
        let outcome = outcome(verdict, taken);
        let near = verdict.decision.allowed()
            && verdict.decision.outcomes(&policy.rules).any(|r| r.remaining().saturating_mul(5) < r.limit());
        policy.counters.count_decision(name, outcome);
        if near {
            policy.counters.count_near_limit(name);
        }
        if verdict.degraded {
            let failure_policy = self.inner.settings.on_failure.as_str();
            metrics::counter!(m::DEGRADED, "policy" => Arc::clone(name), "failure_policy" => failure_policy)
                .increment(1);
        }
    }

    /// One operation: on the primary backend while its breaker is closed, else (or when it
    /// fails) by the failure policy. The flag is true for a degraded answer.
    async fn decide(
        &self,
        key: &str,
        rules: &RuleSet,
        op: Operation<'_>,
    ) -> Result<(Decision, bool), LimitError> {
        // Bad input is refused here, so it never counts as a backend failure nor reaches one.
        op.validate(key, rules).map_err(LimitError::Invalid)?;
        let primary = &*self.inner.primary;
        let decided = async move {
            match primary.try_execute_now(key, rules, op) {
                Some(decided) => decided,
                None => primary.execute(key, rules, op).await,
            }
        };
        self.answer(
            decided,
            || Decision::admitted_unchecked(rules),
            |fallback| fallback.execute_now(key, rules, op),
        )
        .await
    }

    /// A batch (validated and planned once, by the caller), as [`decide`](Self::decide) does
    /// one operation.
    async fn decide_batch(&self, batch: &BatchPlan<'_>) -> Result<(Vec<Decision>, bool), LimitError> {
        self.answer(
            self.inner.primary.check_planned(batch),
            || batch.parts().iter().map(|p| Decision::admitted_unchecked(p.rules)).collect(),
            |fallback| fallback.check_planned_now(batch),
        )
        .await
    }

    /// The primary backend's answer (`primary`, awaited only while the breaker is closed), or,
    /// when it fails or the breaker is open, the failure policy's: `open()` admits, `local`
    /// decides on the in-process fallback, `closed` refuses. The flag is true for a degraded
    /// answer.
    async fn answer<T>(
        &self,
        primary: impl Future<Output = Result<T, Error>>,
        open: impl FnOnce() -> T,
        local: impl FnOnce(&MemoryBackend) -> Result<T, Error>,
    ) -> Result<(T, bool), LimitError> {
        let inner = &self.inner;
        if inner.breaker.state() == BreakerState::Closed {
            let (ticket, start) = (inner.breaker.ticket(), inner.timer.now());
            // The backend call's span (docs/api.md, "Tracing"), at DEBUG as the decision's.
            let span = if debug_spans_wanted() {
                tracing::debug_span!(
                    "backend",
                    tollgate.backend = %inner.backend_name,
                    error.type = Empty,
                    otel.status_code = Empty,
                )
            } else {
                tracing::Span::none()
            };
            // Off, no wrapper: dropping an `Instrumented` enters its span, even a disabled one.
            let result = if span.is_disabled() {
                primary.await
            } else {
                let result = primary.instrument(span.clone()).await;
                if let Err(e) = &result {
                    span.record("error.type", error_kind(e));
                    span.record("otel.status_code", "ERROR");
                }
                result
            };
            return self.conclude(result, Call { ticket, start }, open, local);
        }
        self.by_failure_policy(breaker_open(), open, local)
    }

    /// [`answer`](Self::answer) from a backend that answers at once
    /// ([`Backend::try_execute_now`]), so without awaiting; `None` when the primary backend
    /// must be awaited (and nothing was asked of it).
    fn answer_now<T>(
        &self,
        primary: impl FnOnce() -> Option<Result<T, Error>>,
        open: impl FnOnce() -> T,
        local: impl FnOnce(&MemoryBackend) -> Result<T, Error>,
    ) -> Option<Result<(T, bool), LimitError>> {
        let inner = &self.inner;
        if inner.breaker.state() == BreakerState::Closed {
            let (ticket, start) = (inner.breaker.ticket(), inner.timer.now());
            let result = primary()?;
            return Some(self.conclude(result, Call { ticket, start }, open, local));
        }
        Some(self.by_failure_policy(breaker_open(), open, local))
    }

    /// The answer to a call of the primary backend that gave `result`: timed, told to the
    /// breaker (a success closes the run of failures, a backend failure is counted and opens
    /// it at its threshold, refused input is neither), and a failure answered by the failure
    /// policy.
    fn conclude<T>(
        &self,
        result: Result<T, Error>,
        call: Call,
        open: impl FnOnce() -> T,
        local: impl FnOnce(&MemoryBackend) -> Result<T, Error>,
    ) -> Result<(T, bool), LimitError> {
        let inner = &self.inner;
        inner.backend_seconds.record(inner.timer.now().saturating_duration_since(call.start).as_secs_f64());
        match result {
            Ok(answer) => {
                inner.breaker.record_success();
                Ok((answer, false))
            }
            Err(e) if !e.is_backend_failure() => Err(LimitError::Invalid(e)),
            Err(e) => {
                let backend = Arc::clone(&inner.backend_name);
                metrics::counter!(m::BACKEND_ERRORS, "backend" => backend, "kind" => error_kind(&e))
                    .increment(1);
                if inner.breaker.record_failure(call.ticket) {
                    tracing::warn!(backend = %inner.backend_name, error = %e,
                        "backend failing; circuit breaker open, answering by the failure policy");
                    self.spawn_probe();
                }
                self.by_failure_policy(e, open, local)
            }
        }
    }

    /// The failure policy's answer, the primary backend having failed with `failure` (or its
    /// breaker being open): `open()` admits, `local` decides on the in-process fallback,
    /// `closed` refuses.
    fn by_failure_policy<T>(
        &self,
        failure: Error,
        open: impl FnOnce() -> T,
        local: impl FnOnce(&MemoryBackend) -> Result<T, Error>,
    ) -> Result<(T, bool), LimitError> {
        match self.inner.settings.on_failure {
            FailurePolicy::Open => Ok((open(), true)),
            FailurePolicy::Closed => Err(LimitError::Unavailable(failure)),
            FailurePolicy::Local => Ok((local(&self.inner.fallback).map_err(LimitError::Invalid)?, true)),
        }
    }

    /// The span of one decision (docs/api.md, "Tracing"), `operation` naming the method; its
    /// parent is the caller's current span (the request's). `policies` is called only for a
    /// span that is on.
    fn decision_span(
        &self,
        operation: &'static str,
        policies: impl FnOnce() -> String,
        checks: usize,
        cost: u64,
    ) -> tracing::Span {
        if !debug_spans_wanted() {
            return tracing::Span::none();
        }
        tracing::debug_span!(
            "decision",
            tollgate.operation = operation,
            tollgate.policy = policies(),
            tollgate.checks = checks,
            tollgate.cost = cost,
            tollgate.backend = %self.inner.backend_name,
            tollgate.decision = Empty,
            tollgate.degraded = Empty,
            error.type = Empty,
            otel.status_code = Empty,
        )
    }

    /// [`decision_span`](Self::decision_span) of a batch: its policies comma-separated, its
    /// total cost.
    fn batch_span(&self, operation: &'static str, checks: &[Check<'_>]) -> tracing::Span {
        let names = || {
            let mut names: Vec<&str> = checks.iter().map(|c| &*c.policy.name).collect();
            names.dedup();
            names.join(",")
        };
        let cost = checks.iter().fold(0u64, |total, c| total.saturating_add(c.cost));
        self.decision_span(operation, names, checks.len(), cost)
    }

    /// Pings the backend every `probe_interval` until it answers, then closes the breaker.
    fn spawn_probe(&self) {
        if !self.inner.breaker.start_probe() {
            return;
        }
        metrics::gauge!(m::BREAKER_OPEN, "backend" => self.inner.backend_name.to_string()).set(1.0);
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(inner.settings.probe_interval).await;
                if inner.primary.ping().await.is_ok() {
                    // Probe slot first: a failure right after closing must be able to start
                    // the next probe.
                    inner.breaker.probe_ended();
                    inner.breaker.close();
                    metrics::gauge!(m::BREAKER_OPEN, "backend" => inner.backend_name.to_string()).set(0.0);
                    tracing::info!(backend = %inner.backend_name, "backend answers again; circuit breaker closed");
                    return;
                }
            }
        });
    }
}

/// A call of the primary backend: the breaker's ticket when it started, and when.
struct Call {
    ticket: u64,
    start: quanta::Instant,
}

/// What an open breaker answers in the backend's place.
fn breaker_open() -> Error {
    Error::Unavailable("circuit breaker open: the backend failed and is being probed".into())
}

/// Whether a subscriber may want the DEBUG spans (a decision's, a backend call's). Asked before
/// `debug_span!`, which, while no subscriber has ever been set, still builds a disabled span's
/// fields to hand them to the `log` crate (tracing's `log` feature, which a dependency turns on):
/// ~600 instructions a decision, the policy names' `String` among them, for nothing.
/// The parts of a batch decided check by check: each its own group.
fn each_parts<'a>(checks: &[Check<'a>]) -> Vec<Part<'a>> {
    checks
        .iter()
        .zip(0..)
        .map(|(c, group)| Part::new(c.key, &c.policy.rules, c.cost).in_group(group))
        .collect()
}

fn debug_spans_wanted() -> bool {
    Level::DEBUG <= STATIC_MAX_LEVEL && Level::DEBUG <= LevelFilter::current()
}

/// A verdict as the metrics and spans name it; `taken` is false for a check refused because
/// another check of its batch was.
fn outcome(verdict: &Verdict, taken: bool) -> Outcome {
    match (verdict.decision.allowed() && taken, verdict.shadow_denied) {
        (true, _) => Outcome::Allowed,
        (false, true) => Outcome::ShadowDenied,
        (false, false) => Outcome::Denied,
    }
}
