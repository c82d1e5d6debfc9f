//! [`Policy`]: a named rule set with its mode and its strategy when a request is over the limit.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::RuleSet;

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
