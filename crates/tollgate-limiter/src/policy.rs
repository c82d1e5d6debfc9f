//! [`Policy`]: a named rule set with its mode and its strategy when a request is over the limit.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::Counter;
use serde::{Deserialize, Serialize};
use tollgate_core::{AlgorithmName, Period, RuleKind, RuleSet};

use crate::metrics as m;

/// Whether a policy's denials are enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Denials are answered as denials.
    #[default]
    Enforce,
    /// Requests are evaluated and counted, but always admitted; a would-be denial is reported
    /// (in the verdict and the metrics) so a new limit can be tried on live traffic first.
    Shadow,
}

/// What happens to a request over the limit: the policy's `on_limit`.
///
/// Configuration files and the management API write it as two fields, `on_limit = "reject"`
/// or `"delay"` (the kind alone: `tollgate_config::OnLimitKind`) and, with `delay`, `max_wait`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnLimit {
    /// Deny it at once.
    #[default]
    Reject,
    /// Hold it until it fits, if that is within `max_wait`; deny it otherwise.
    Delay {
        /// The longest a request is held.
        max_wait: Duration,
    },
}

/// Whether a policy's hot keys are answered from blocks of units reserved in advance (see
/// [`crate::reserve`]): the policy's `reserve`, written `"off"`, `"auto"` or `{ max = N }`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ReserveRepr", into = "ReserveRepr")]
pub enum Reserve {
    /// Every check asks the backend.
    #[default]
    Off,
    /// Blocks grow with a key's heat, up to `limit / (4 × instances seen)`.
    Auto,
    /// As `Auto`, and never above `max` units.
    Max(u64),
}

/// The written form of [`Reserve`]: a word, or a table with `max`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ReserveRepr {
    Word(String),
    Max(ReserveMax),
}

/// `{ max = N }`, nothing else: a misspelt key beside `max` is a mistake, not a comment.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveMax {
    max: u64,
}

impl TryFrom<ReserveRepr> for Reserve {
    type Error = String;

    fn try_from(repr: ReserveRepr) -> Result<Self, String> {
        match repr {
            ReserveRepr::Word(word) if word == "off" => Ok(Reserve::Off),
            ReserveRepr::Word(word) if word == "auto" => Ok(Reserve::Auto),
            ReserveRepr::Word(word) => {
                Err(format!("reserve = {word:?}: expected \"off\", \"auto\" or {{ max = N }}"))
            }
            ReserveRepr::Max(ReserveMax { max }) => Ok(Reserve::Max(max)),
        }
    }
}

/// The command-line form: `off`, `auto` or `max=N`.
impl std::str::FromStr for Reserve {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Reserve::Off),
            "auto" => Ok(Reserve::Auto),
            _ => s
                .strip_prefix("max=")
                .and_then(|n| n.parse().ok())
                .map(Reserve::Max)
                .ok_or_else(|| format!("{s:?}: expected off, auto or max=N (N a whole number of units)")),
        }
    }
}

impl From<Reserve> for ReserveRepr {
    fn from(reserve: Reserve) -> Self {
        match reserve {
            Reserve::Off => ReserveRepr::Word("off".into()),
            Reserve::Auto => ReserveRepr::Word("auto".into()),
            Reserve::Max(max) => ReserveRepr::Max(ReserveMax { max }),
        }
    }
}

/// Why a policy's rules cannot take reservations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// A rule's algorithm cannot honour a reserved block: a sliding log or a sliding window
    /// counter (a unit admitted later than it was counted would break its sliding bound), or
    /// a concurrency rule (its units are held by leases, not spent).
    #[error(
        "reserve cannot be used with rules[{index}], a {} rule: only fixed_window, token_bucket \
         and gcra rules can hand out reserved units without going over the limit",
        algorithm.as_str()
    )]
    Algorithm {
        /// The rule at fault.
        index: usize,
        /// Its algorithm.
        algorithm: AlgorithmName,
    },
    /// `{ max = 0 }`.
    #[error("reserve = {{ max = 0 }}: max must be at least 1 (use reserve = \"off\" for none)")]
    ZeroMax,
}

impl Reserve {
    /// Whether reservations are on.
    pub fn is_on(self) -> bool {
        self != Reserve::Off
    }

    /// Checks that `rules` can take reservations under this setting (always, when off).
    pub fn validate(self, rules: &RuleSet) -> Result<(), ReserveError> {
        if self == Reserve::Max(0) {
            return Err(ReserveError::ZeroMax);
        }
        if !self.is_on() {
            return Ok(());
        }
        match rules.rules().position(|r| !reservable(&r.kind)) {
            Some(index) => {
                let algorithm =
                    rules.rules().nth(index).map_or(AlgorithmName::Concurrency, |r| r.algorithm());
                Err(ReserveError::Algorithm { index, algorithm })
            }
            None => Ok(()),
        }
    }
}

/// Whether a rule of this kind can hand out units reserved earlier (see [`crate::reserve`]).
pub(crate) fn reservable(kind: &RuleKind) -> bool {
    matches!(kind, RuleKind::FixedWindow { .. } | RuleKind::TokenBucket { .. } | RuleKind::Gcra { .. })
}

/// A decision as the metrics and spans name it (the `outcome` label of
/// [`DECISIONS`](crate::metrics::DECISIONS)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    ShadowDenied,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
        }
    }
}

/// A policy's decision counters ([`DECISIONS`](crate::metrics::DECISIONS) by [`Outcome`], and
/// [`NEAR_LIMIT`](crate::metrics::NEAR_LIMIT)), each registered with the metrics recorder when
/// first counted rather than looked up by its labels at every decision, and shared by the
/// policy's clones (a policy kept and cloned for each request, as Envoy's descriptors are,
/// registers them once). Nothing is allocated until then, so a policy made for one request
/// costs what the lookup did.
#[derive(Clone, Default)]
pub(crate) struct PolicyCounters {
    /// The name the counters are labelled with: the policy's at its first count.
    name: OnceLock<Arc<str>>,
    /// By [`Outcome`] (its discriminant), then near-limit.
    counters: [OnceLock<Counter>; 4],
}

impl PolicyCounters {
    /// Counts a decision of `outcome` for the policy named `name`.
    pub(crate) fn count_decision(&self, name: &Arc<str>, outcome: Outcome) {
        let register =
            || metrics::counter!(m::DECISIONS, "policy" => Arc::clone(name), "outcome" => outcome.as_str());
        self.count(name, outcome as usize, register);
    }

    /// Counts an admission that left some rule within a fifth of its limit.
    pub(crate) fn count_near_limit(&self, name: &Arc<str>) {
        self.count(name, 3, || metrics::counter!(m::NEAR_LIMIT, "policy" => Arc::clone(name)));
    }

    /// The kept counter at `at`, registered at its first count; when the policy was renamed
    /// after its first count (a clone renamed), a counter looked up for this count alone.
    fn count(&self, name: &Arc<str>, at: usize, register: impl Fn() -> Counter) {
        if Arc::ptr_eq(self.name.get_or_init(|| Arc::clone(name)), name) {
            self.counters[at].get_or_init(&register).increment(1);
        } else {
            register().increment(1);
        }
    }
}

impl std::fmt::Debug for PolicyCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyCounters")
    }
}

/// Rules checked together, with a name, a [`Mode`] and an [`OnLimit`] strategy.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The policy's name (a metrics label: keep the number of names bounded).
    pub name: Arc<str>,
    /// What an optional human description says the policy is for.
    pub description: Option<String>,
    /// The rules.
    pub rules: RuleSet,
    /// Enforced or shadowed.
    pub mode: Mode,
    /// Reject, or delay.
    pub on_limit: OnLimit,
    /// Whether hot keys are answered from reserved blocks ([`Reserve::Off`] unless set).
    pub reserve: Reserve,
    /// Its metrics' counters.
    pub(crate) counters: Arc<PolicyCounters>,
}

impl Policy {
    /// An enforced policy that rejects at once: the common case.
    pub fn enforce(name: impl Into<Arc<str>>, rules: RuleSet) -> Self {
        Policy {
            name: name.into(),
            description: None,
            rules,
            mode: Mode::Enforce,
            on_limit: OnLimit::Reject,
            reserve: Reserve::Off,
            counters: Arc::default(),
        }
    }

    /// This policy with reservations set to `reserve` (see [`crate::reserve`]); refused when
    /// its rules cannot take them.
    pub fn with_reserve(mut self, reserve: Reserve) -> Result<Self, ReserveError> {
        reserve.validate(&self.rules)?;
        self.reserve = reserve;
        Ok(self)
    }

    /// This policy in `mode`.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// This policy with the `on_limit` strategy.
    pub fn with_on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// This policy with a description.
    pub fn with_description(mut self, description: Option<String>) -> Self {
        self.description = description;
        self
    }
}

/// The six periods of a consumer limit, from shortest, with their field names.
pub const PERIODS: [(&str, Period); 6] = [
    ("per_second", Period::SECOND),
    ("per_minute", Period::MINUTE),
    ("per_hour", Period::HOUR),
    ("per_day", Period::DAY),
    ("per_week", Period::WEEK),
    ("per_month", Period::MONTH_30_DAYS),
];

/// Six limits: requests per second, minute, hour, day, week and 30-day month; -1 is unlimited.
/// A consumer's limits, in the configuration's defaults and in the policy database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SixPeriods {
    /// Per second.
    pub per_second: i64,
    /// Per minute.
    pub per_minute: i64,
    /// Per hour.
    pub per_hour: i64,
    /// Per day.
    pub per_day: i64,
    /// Per week.
    pub per_week: i64,
    /// Per 30-day month.
    pub per_month: i64,
}

/// A [`SixPeriods`] value that is neither -1 (unlimited) nor 1 to
/// [`MAX_COUNT`](tollgate_core::limits::MAX_COUNT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {value}: a limit is -1 (unlimited) or 1 to {max}", max = tollgate_core::limits::MAX_COUNT)]
pub struct PeriodLimitError {
    /// The field at fault, such as `per_hour`.
    pub field: &'static str,
    /// Its value.
    pub value: i64,
}

impl SixPeriods {
    /// Everything unlimited.
    pub const UNLIMITED: SixPeriods =
        SixPeriods { per_second: -1, per_minute: -1, per_hour: -1, per_day: -1, per_week: -1, per_month: -1 };

    /// The values in [`PERIODS`] order.
    pub fn values(&self) -> [i64; 6] {
        [self.per_second, self.per_minute, self.per_hour, self.per_day, self.per_week, self.per_month]
    }

    /// From values in [`PERIODS`] order.
    pub fn from_values(v: [i64; 6]) -> Self {
        SixPeriods {
            per_second: v[0],
            per_minute: v[1],
            per_hour: v[2],
            per_day: v[3],
            per_week: v[4],
            per_month: v[5],
        }
    }

    /// Checks every value is -1 (unlimited) or 1 to 10^12.
    pub fn validate(&self) -> Result<(), PeriodLimitError> {
        let max = tollgate_core::limits::MAX_COUNT;
        for ((field, _), value) in PERIODS.iter().zip(self.values()) {
            let in_range = u64::try_from(value).is_ok_and(|v| (1..=max).contains(&v));
            if value != -1 && !in_range {
                return Err(PeriodLimitError { field, value });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_carry_the_name_they_were_made_with() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let rules = RuleSet::new([tollgate_core::Rule::fixed_window(5, Period::SECOND)]).unwrap();
            let policy = Policy::enforce("a", rules);
            policy.counters.count_decision(&policy.name, Outcome::Allowed);
            // A clone shares the counters; renamed, it labels its own decisions.
            let mut renamed = policy.clone();
            renamed.name = "b".into();
            renamed.counters.count_decision(&renamed.name, Outcome::Denied);
            renamed.counters.count_near_limit(&renamed.name);
            renamed.counters.count_near_limit(&renamed.name);
            policy.counters.count_decision(&policy.name, Outcome::Allowed);
            // A policy never counted takes the name it is first counted under.
            let mut fresh = Policy::enforce(
                "c",
                RuleSet::new([tollgate_core::Rule::fixed_window(1, Period::SECOND)]).unwrap(),
            );
            fresh.name = "d".into();
            fresh.counters.count_near_limit(&fresh.name);
        });
        let text = handle.render();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        let mut expected = vec![
            format!(r#"{}{{policy="a",outcome="allowed"}} 2"#, m::DECISIONS),
            format!(r#"{}{{policy="b",outcome="denied"}} 1"#, m::DECISIONS),
            format!(r#"{}{{policy="b"}} 2"#, m::NEAR_LIMIT),
            format!(r#"{}{{policy="d"}} 1"#, m::NEAR_LIMIT),
        ];
        let mut lines: Vec<String> = lines.into_iter().map(str::to_owned).collect();
        lines.sort();
        expected.sort();
        assert_eq!(lines, expected, "{text}");
    }
}
