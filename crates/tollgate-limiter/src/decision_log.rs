//! The decision log: one structured log line per refused request, so that "why was I refused?"
//! has an answer in the logs (which policy, which rule, for whom, and for how long).
//!
//! Off unless configured. A flood of refusals must not become a flood of log lines (a caller
//! hammering a limit would otherwise fill the disk), so the log is both sampled (a share of the
//! refusals) and rate-limited itself, by Tollgate's own GCRA: at most `max_per_second` lines a
//! second, and as many at once. The refusals left out are counted, and the next line written
//! says how many (`suppressed`). Keys are written as a hash unless configured otherwise: they
//! are often API keys or addresses, which a log should not collect.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use tollgate_core::{Clock, Decision, MemoryBackend, Operation, Period, Rule, RuleSet, SystemClock};

use crate::Policy;
use crate::keyspace::secret_digest;

/// The `tracing` target of the decision log's lines (filter with
/// `RUST_LOG=info,tollgate::decisions=off` to silence them, or route them apart).
pub const TARGET: &str = "tollgate::decisions";

/// Most lines a second the decision log may be configured for.
pub const MAX_LINES_PER_SECOND: u32 = 10_000;

/// How a refused key is written in the decision log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoggedKey {
    /// `sha256:` and the first 32 hex digits of the key's SHA-256 (the default): the same key
    /// always gives the same hash, so one caller's refusals can be followed and matched with
    /// `printf %s KEY | sha256sum`, but the log holds no API key or address in clear. Not
    /// anonymous: a guessable key (an IPv4 address) can be found from its hash.
    #[default]
    Hash,
    /// The key as the request gave it.
    Plain,
}

impl LoggedKey {
    /// The name in the configuration (`hash`, `plain`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoggedKey::Hash => "hash",
            LoggedKey::Plain => "plain",
        }
    }
}

/// What the decision log writes, and how much of it.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionLogSettings {
    /// The share of refusals considered for a line, above 0 and at most 1 (every one). Taken
    /// evenly, not at random: at 0.1, every tenth refusal.
    pub sample_rate: f64,
    /// Most lines a second, and most at once (1 to [`MAX_LINES_PER_SECOND`]).
    pub max_per_second: u32,
    /// How keys are written.
    pub key: LoggedKey,
}

impl Default for DecisionLogSettings {
    fn default() -> Self {
        DecisionLogSettings { sample_rate: 1.0, max_per_second: 10, key: LoggedKey::Hash }
    }
}

/// Decision-log settings that cannot be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionLogError {
    /// `sample_rate` is not in (0, 1].
    #[error("sample_rate = {0} must be above 0 and at most 1")]
    SampleRate(f64),
    /// `max_per_second` is 0 or above [`MAX_LINES_PER_SECOND`].
    #[error("max_per_second = {0} must be between 1 and {MAX_LINES_PER_SECOND}")]
    MaxPerSecond(u32),
}

impl DecisionLogSettings {
    /// Checks the settings' bounds.
    pub fn validate(&self) -> Result<(), DecisionLogError> {
        if !(self.sample_rate > 0.0 && self.sample_rate <= 1.0) {
            return Err(DecisionLogError::SampleRate(self.sample_rate));
        }
        if !(1..=MAX_LINES_PER_SECOND).contains(&self.max_per_second) {
            return Err(DecisionLogError::MaxPerSecond(self.max_per_second));
        }
        Ok(())
    }
}

/// One refusal, as the decision log writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenialLine {
    /// The policy's name.
    pub policy: String,
    /// The rule that refused (the one making the caller wait longest), by name, or by its
    /// algorithm and position (`fixed_window.0`) as the API reports unnamed rules.
    pub rule: String,
    /// The key, hashed or plain as configured.
    pub key: String,
    /// Units asked for.
    pub cost: u64,
    /// That rule's limit.
    pub limit: u64,
    /// That rule's remaining units.
    pub remaining: u64,
    /// Milliseconds until the same request would be admitted, rounded up.
    pub retry_after_ms: u64,
    /// True when the answer came from the failure policy, not the backend.
    pub degraded: bool,
    /// True when the policy is in shadow mode: the request was let through all the same.
    pub shadow: bool,
    /// Refusals left out (sampled away or over the cap) since the previous line.
    pub suppressed: u64,
}

/// The log's state: its settings, its sampling count, its cap and the refusals left out.
pub(crate) struct DecisionLog<C: Clock = SystemClock> {
    settings: DecisionLogSettings,
    /// Refusals seen, for the sampling.
    seen: AtomicU64,
    /// Refusals left out since the last line.
    suppressed: AtomicU64,
    /// The cap on lines: a GCRA of `max_per_second` a second, as many at once, on a key of its
    /// own in a memory backend of its own.
    cap: MemoryBackend<C>,
    cap_rules: RuleSet,
}

impl DecisionLog<SystemClock> {
    /// A log with `settings` (validated by the caller; out-of-bound values are clamped).
    pub(crate) fn new(settings: DecisionLogSettings) -> Self {
        Self::with_clock(settings, SystemClock::new())
    }
}

impl<C: Clock> DecisionLog<C> {
    pub(crate) fn with_clock(settings: DecisionLogSettings, clock: C) -> Self {
        let per_second = u64::from(settings.max_per_second.clamp(1, MAX_LINES_PER_SECOND));
        let cap_rules = RuleSet::new([Rule::gcra(per_second, Period::SECOND, per_second)])
            .unwrap_or_else(|_| unreachable!("1 to 10,000 a second, as many at once, is a valid GCRA"));
        let cap = MemoryBackend::builder()
            .clock(clock)
            .max_keys(tollgate_core::MIN_MAX_KEYS)
            .name("decision_log")
            .build()
            .unwrap_or_else(|_| unreachable!("MIN_MAX_KEYS is allowed"));
        DecisionLog { settings, seen: AtomicU64::new(0), suppressed: AtomicU64::new(0), cap, cap_rules }
    }

    pub(crate) fn settings(&self) -> &DecisionLogSettings {
        &self.settings
    }

    /// The line to write for a refusal of `cost` units for `key` under `policy`, or None when
    /// it is sampled away or over the cap (then counted as suppressed). `decision` is the
    /// rules' own (a denial); `shadow` marks a shadow-mode policy's would-be refusal.
    pub(crate) fn line(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        decision: &Decision,
        degraded: bool,
        shadow: bool,
    ) -> Option<DenialLine> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        // The n-th refusal is taken when it carries the running share past a whole number:
        // exactly `sample_rate` of them, evenly spread.
        let rate = self.settings.sample_rate;
        let sampled = rate >= 1.0 || (n as f64 * rate).floor() > ((n - 1) as f64 * rate).floor();
        let admitted = sampled
            && self
                .cap
                .execute_now("decision-log", &self.cap_rules, Operation::Check { cost: 1 })
                .is_ok_and(|d| d.allowed());
        if !admitted {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // A denial's binding rule is the refusing rule with the longest wait.
        let index = decision.binding_index();
        let refusing = decision.outcomes(&policy.rules).nth(index)?;
        let rule = match refusing.name() {
            Some(name) => name.to_string(),
            None => format!("{}.{index}", refusing.algorithm()),
        };
        let key = match self.settings.key {
            LoggedKey::Hash => format!("sha256:{}", secret_digest(key.as_bytes())),
            LoggedKey::Plain => key.to_owned(),
        };
        let retry = decision.retry_after();
        let retry_after_ms = u64::try_from(retry.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Some(DenialLine {
            policy: policy.name.to_string(),
            rule,
            key,
            cost,
            limit: refusing.limit(),
            remaining: refusing.remaining(),
            retry_after_ms,
            degraded,
            shadow,
            suppressed: self.suppressed.swap(0, Ordering::Relaxed),
        })
    }
}

/// Writes `line` through `tracing` at INFO under [`TARGET`].
pub(crate) fn write(line: &DenialLine) {
    tracing::info!(
        target: TARGET,
        policy = %line.policy,
        rule = %line.rule,
        key = %line.key,
        cost = line.cost,
        limit = line.limit,
        remaining = line.remaining,
        retry_after_ms = line.retry_after_ms,
        degraded = line.degraded,
        shadow = line.shadow,
        suppressed = line.suppressed,
        "{}",
        if line.shadow { "request would be refused (shadow mode)" } else { "request refused" }
    );
}

/// The log in force, swapped whole when its settings change.
pub(crate) type Shared = arc_swap::ArcSwapOption<DecisionLog>;

/// Replaces the log in `shared` when `settings` differ from its own, keeping its counts (and
/// its cap's state) when they do not: a configuration reload that changed something else must
/// not reset the cap.
pub(crate) fn replace(shared: &Shared, settings: Option<DecisionLogSettings>) {
    let current = shared.load();
    if current.as_ref().map(|log| log.settings()) == settings.as_ref() {
        return;
    }
    shared.store(settings.map(|s| Arc::new(DecisionLog::new(s))));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{ManualClock, Timestamp};

    use super::*;

    fn denial() -> (Policy, Decision) {
        let rules = RuleSet::new([
            Rule::fixed_window(10, Period::SECOND).named("second"),
            Rule::fixed_window(100, Period::MINUTE),
        ])
        .unwrap();
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
        let memory = MemoryBackend::with_clock(clock);
        let check = Operation::Check { cost: 1 };
        for _ in 0..10 {
            assert!(memory.execute_now("k", &rules, check).unwrap().allowed());
        }
        let denied = memory.execute_now("k", &rules, check).unwrap();
        assert!(!denied.allowed());
        (Policy::enforce("api", rules), denied)
    }

    fn log(settings: DecisionLogSettings) -> (DecisionLog<ManualClock>, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_micros(5_000_000));
        (DecisionLog::with_clock(settings, clock.clone()), clock)
    }

    #[test]
    fn a_line_names_the_policy_the_rule_the_hashed_key_and_the_wait() {
        let (policy, decision) = denial();
        let (log, _) = log(DecisionLogSettings::default());
        let line = log.line("alice", &policy, 1, &decision, false, false).unwrap();
        assert_eq!(line.policy, "api");
        assert_eq!(line.rule, "second");
        // echo -n alice | sha256sum
        assert_eq!(line.key, "sha256:2bd806c97f0e00af1a1fc3328fa763a9");
        assert_eq!((line.limit, line.remaining, line.cost), (10, 0, 1));
        assert_eq!(line.retry_after_ms, 1000);
        assert!(!line.shadow && !line.degraded);
        assert_eq!(line.suppressed, 0);

        let plain = DecisionLogSettings { key: LoggedKey::Plain, ..DecisionLogSettings::default() };
        let (log, _) = self::log(plain);
        assert_eq!(log.line("alice", &policy, 1, &decision, false, true).unwrap().key, "alice");
    }

    #[test]
    fn unnamed_rules_are_named_as_the_api_names_them() {
        let rules = RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap();
        let memory = MemoryBackend::with_clock(ManualClock::new(Timestamp::from_micros(0)));
        let check = Operation::Check { cost: 1 };
        memory.execute_now("k", &rules, check).unwrap();
        let denied = memory.execute_now("k", &rules, check).unwrap();
        let (log, _) = log(DecisionLogSettings::default());
        let line = log.line("k", &Policy::enforce("p", rules), 1, &denied, false, false).unwrap();
        assert_eq!(line.rule, "fixed_window.0");
    }

    #[test]
    fn a_flood_writes_at_most_the_cap_and_counts_the_rest() {
        let (policy, decision) = denial();
        let settings = DecisionLogSettings { max_per_second: 5, ..DecisionLogSettings::default() };
        let (log, clock) = log(settings);
        // 10,000 refusals in one instant: the burst of 5, no more.
        let lines: Vec<DenialLine> =
            (0..10_000).filter_map(|_| log.line("k", &policy, 1, &decision, false, false)).collect();
        assert_eq!(lines.len(), 5);
        assert!(lines.iter().all(|l| l.suppressed == 0));
        // Over the next 10 s, 1,000 refusals a second: 5 a second.
        let mut written = Vec::new();
        for _ in 0..10_000 {
            clock.advance(Duration::from_millis(1));
            written.extend(log.line("k", &policy, 1, &decision, false, false));
        }
        assert_eq!(written.len(), 50, "5 a second for 10 s");
        // Every refusal is either written or counted in a later line.
        let counted: u64 = written.iter().map(|l| l.suppressed).sum();
        assert_eq!(5 + 50 + counted + log.suppressed.load(Ordering::Relaxed), 20_000);
    }

    #[test]
    fn sampling_takes_an_even_share() {
        let (policy, decision) = denial();
        let settings = DecisionLogSettings {
            sample_rate: 0.1,
            max_per_second: MAX_LINES_PER_SECOND,
            ..DecisionLogSettings::default()
        };
        let (log, _) = log(settings);
        let taken: Vec<usize> =
            (1..=100).filter(|_| log.line("k", &policy, 1, &decision, false, false).is_some()).collect();
        assert_eq!(taken, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
    }

    #[test]
    fn settings_out_of_bounds_are_refused() {
        let with = |sample_rate, max_per_second| {
            DecisionLogSettings { sample_rate, max_per_second, key: LoggedKey::Hash }.validate()
        };
        assert!(with(1.0, 1).is_ok());
        assert!(with(0.001, MAX_LINES_PER_SECOND).is_ok());
        assert_eq!(with(0.0, 10), Err(DecisionLogError::SampleRate(0.0)));
        assert_eq!(with(1.5, 10), Err(DecisionLogError::SampleRate(1.5)));
        assert!(with(f64::NAN, 10).is_err());
        assert_eq!(with(1.0, 0), Err(DecisionLogError::MaxPerSecond(0)));
        assert_eq!(with(1.0, 10_001), Err(DecisionLogError::MaxPerSecond(10_001)));
    }

    #[test]
    fn replacing_with_equal_settings_keeps_the_log() {
        let shared = Shared::empty();
        replace(&shared, Some(DecisionLogSettings::default()));
        let first = shared.load_full().unwrap();
        replace(&shared, Some(DecisionLogSettings::default()));
        assert!(Arc::ptr_eq(&first, &shared.load_full().unwrap()));
        replace(&shared, Some(DecisionLogSettings { max_per_second: 3, ..DecisionLogSettings::default() }));
        assert!(!Arc::ptr_eq(&first, &shared.load_full().unwrap()));
        replace(&shared, None);
        assert!(shared.load().is_none());
    }
}
