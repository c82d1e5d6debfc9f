//! [`Policy`]: a named rule set with its mode and its strategy when a request is over the limit.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::{Period, RuleSet};

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
}

impl Policy {
    /// An enforced policy that rejects at once: the common case.
    pub fn enforce(name: impl Into<Arc<str>>, rules: RuleSet) -> Self {
        Policy { name: name.into(), description: None, rules, mode: Mode::Enforce, on_limit: OnLimit::Reject }
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
