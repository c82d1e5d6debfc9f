//! [`PolicySpec`]: a policy as written (in the file, or sent to the management API), and its
//! validation into a [`Policy`], with the field at fault named.
//!
//! One spec serves both places. Two of its fields, `apps` and `enabled`, belong to policies in
//! the database (the management API scopes and switches them); the file has no such fields
//! (its policies are global and always applied), so its loader leaves them at their defaults
//! and refuses them as unknown.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::{Period, Rule, RuleError, RuleSet};
use tollgate_limiter::{Mode, OnLimit, Policy, Reserve};

use crate::MAX_POLICY_NAME_BYTES;

/// Most apps one policy (or one management token) names.
pub const MAX_APPS: usize = 64;

/// Longest `max_wait` of a delaying policy: holding requests longer ties up connections.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The kind of [`OnLimit`] a policy is written with: `on_limit = "reject"` or `"delay"`. A
/// delay's bound is a field of its own (`max_wait`), so the written form names only the kind;
/// [`PolicySpec::build`] joins the two into the limiter's [`OnLimit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimitKind {
    /// [`OnLimit::Reject`]: deny at once.
    #[default]
    Reject,
    /// [`OnLimit::Delay`]: hold until it fits, up to `max_wait`.
    Delay,
}

/// A policy before validation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// What the policy is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The rules, checked together.
    pub rules: Vec<Rule>,
    /// `enforce` or `shadow`.
    #[serde(default)]
    pub mode: Mode,
    /// `reject` or `delay`.
    #[serde(default)]
    pub on_limit: OnLimitKind,
    /// With `delay`: the longest a request is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Period>,
    /// `"off"` (the default), `"auto"` or `{ max = N }`: hot keys answered from reserved
    /// blocks (see `tollgate_limiter::reserve`).
    #[serde(default, skip_serializing_if = "is_off")]
    pub reserve: Reserve,
    /// The apps the policy belongs to (database policies): tokens limited to some apps see and
    /// change only those policies. Empty: a global policy, changed only by unrestricted tokens.
    #[serde(default)]
    pub apps: Vec<String>,
    /// Whether the policy is applied (database policies): a disabled one is kept, and checks
    /// naming it get 404.
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

fn is_off(reserve: &Reserve) -> bool {
    !reserve.is_on()
}

/// Why a [`PolicySpec`] is not a valid policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SpecError {
    /// The field at fault: `name`, `rules`, `rules[2].burst`, `on_limit`, `max_wait`, `reserve`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Whether `name` can name a policy: 1 to 64 bytes of letters, digits, `_`, `-` and `.` (names
/// appear in URLs, headers and metric labels).
pub fn valid_policy_name(name: &str) -> bool {
    (1..=MAX_POLICY_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The field of a rule list (`list`, such as `rules` or `limits`) that a rule-set error is about.
pub fn rule_error_field(e: &RuleError, list: &str) -> String {
    match *e {
        RuleError::OutOfRange { index, field, .. } => format!("{list}[{index}].{field}"),
        RuleError::LogLimitTooLarge { index, .. } => format!("{list}[{index}].limit"),
        RuleError::NameTooLong { index, .. } => format!("{list}[{index}].name"),
        RuleError::Inexact { index, .. } | RuleError::Duplicate { index, .. } => format!("{list}[{index}]"),
        _ => list.to_owned(),
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError { field: field.into(), message: message.into() }
}

impl PolicySpec {
    /// The spec a valid policy came from (for listing file policies beside stored ones).
    pub fn of(policy: &Policy) -> PolicySpec {
        let (on_limit, max_wait) = match policy.on_limit {
            OnLimit::Reject => (OnLimitKind::Reject, None),
            // Exact (a max_wait is a Period, in whole microseconds), not truncated to milliseconds.
            OnLimit::Delay { max_wait } => (OnLimitKind::Delay, Period::try_from(max_wait).ok()),
        };
        PolicySpec {
            description: policy.description.clone(),
            rules: policy.rules.rules().cloned().collect(),
            mode: policy.mode,
            on_limit,
            max_wait,
            reserve: policy.reserve,
            apps: Vec::new(),
            enabled: true,
        }
    }

    /// Whether `apps` can scope a policy or a token: at most [`MAX_APPS`], each named as a
    /// policy is.
    pub fn valid_apps(apps: &[String]) -> bool {
        apps.len() <= MAX_APPS && apps.iter().all(|app| valid_policy_name(app))
    }

    /// Validates the spec into the policy called `name`.
    pub fn build(&self, name: &str) -> Result<Policy, SpecError> {
        if !valid_policy_name(name) {
            return Err(err(
                "name",
                format!("a policy name is 1 to {MAX_POLICY_NAME_BYTES} letters, digits, '_', '-' or '.'"),
            ));
        }
        if !PolicySpec::valid_apps(&self.apps) {
            return Err(err(
                "apps",
                format!(
                    "at most {MAX_APPS} apps, each 1 to {MAX_POLICY_NAME_BYTES} letters, digits, '_', '-' or '.'"
                ),
            ));
        }
        let rules = RuleSet::new(self.rules.iter().cloned())
            .map_err(|e| err(rule_error_field(&e, "rules"), e.to_string()))?;
        let on_limit = match (self.on_limit, self.max_wait) {
            (OnLimitKind::Reject, None) => OnLimit::Reject,
            (OnLimitKind::Reject, Some(_)) => {
                return Err(err("max_wait", "max_wait only applies with on_limit = \"delay\""));
            }
            (OnLimitKind::Delay, None) => {
                return Err(err("max_wait", "on_limit = \"delay\" needs a max_wait, such as \"500ms\""));
            }
            (OnLimitKind::Delay, Some(wait)) => {
                let max_wait = wait.as_duration();
                if max_wait > MAX_WAIT_LIMIT {
                    return Err(err(
                        "max_wait",
                        format!("max_wait must be at most {}s", MAX_WAIT_LIMIT.as_secs()),
                    ));
                }
                OnLimit::Delay { max_wait }
            }
        };
        self.reserve.validate(&rules).map_err(|e| err("reserve", e.to_string()))?;
        let mut policy = Policy::enforce(name, rules)
            .with_description(self.description.clone())
            .with_mode(self.mode)
            .with_on_limit(on_limit);
        // Validated above (`with_reserve` would check it again).
        policy.reserve = self.reserve;
        Ok(policy)
    }
}
