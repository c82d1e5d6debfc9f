//! What every decision route answers with: the decision body and its rate-limit headers, the
//! problems of a failed decision, and the names of the pseudo-policies the server reports
//! under. A leaf: it knows no handler and no state.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_config::ServerSettings;
use tollgate_core::Error as CoreError;
use tollgate_http::Problem;
use tollgate_http::headers::{ceil_millis, rate_limit_headers, rule_name};
use tollgate_limiter::{LimitError, Policy, Verdict};
use utoipa::ToSchema;

/// The policy name reported for inline rules.
pub const INLINE_POLICY: &str = "inline";
/// The policy name consumer checks are reported (and labelled in metrics) under.
pub const CONSUMER_POLICY: &str = "consumer";
/// The policy name anonymous checks are reported under.
pub const ANONYMOUS_POLICY: &str = "anonymous";

/// One rule's part of a decision.
#[derive(Debug, Serialize, ToSchema)]
pub struct RuleBody {
    /// The rule's name, or its algorithm and position (`fixed_window.0`).
    pub name: String,
    /// The rule's algorithm.
    pub algorithm: &'static str,
    /// Whether this rule alone admits the request.
    pub allowed: bool,
    /// The most units the rule admits at once.
    pub limit: u64,
    /// Units left after this decision.
    pub remaining: u64,
    /// Milliseconds until the rule is full again, rounded up.
    pub reset_after_ms: u64,
    /// Milliseconds until the same cost would be admitted by this rule, rounded up.
    pub retry_after_ms: u64,
}

/// The answer to a check or acquire: the same body on 200 and 429.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionBody {
    /// Whether to let the request through (true for shadow-mode denials).
    pub allowed: bool,
    /// The most restrictive rule's limit.
    pub limit: u64,
    /// The most restrictive rule's remaining units.
    pub remaining: u64,
    /// Milliseconds until the most restrictive rule is full again.
    pub reset_after_ms: u64,
    /// Milliseconds until the same cost would be admitted (0 when admitted).
    pub retry_after_ms: u64,
    /// True when answered without the primary backend (its failure policy answered).
    pub degraded: bool,
    /// The policy applied (`inline` for inline rules).
    pub policy: String,
    /// Shadow mode only: the rules denied, but the request is let through.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow_denied: bool,
    /// `on_limit = "delay"`: milliseconds the request was held before this answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_ms: Option<u64>,
    /// Acquire only: the lease to hand back to `/v1/release`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Consumer and anonymous checks, when denied: which period refused, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every rule's outcome, in the policy's order.
    pub rules: Vec<RuleBody>,
}

impl DecisionBody {
    pub(crate) fn new(policy: &Policy, verdict: &Verdict, lease_id: Option<String>) -> Self {
        let d = &verdict.decision;
        let rules = policy
            .rules
            .rules()
            .zip(d.rules())
            .enumerate()
            .map(|(index, (rule, o))| RuleBody {
                name: rule_name(rule, index),
                algorithm: o.algorithm.as_str(),
                allowed: o.allowed,
                limit: o.limit,
                remaining: o.remaining,
                reset_after_ms: ceil_millis(o.reset_after),
                retry_after_ms: ceil_millis(o.retry_after),
            })
            .collect();
        DecisionBody {
            allowed: verdict.allowed(),
            limit: d.limit(),
            remaining: d.remaining(),
            reset_after_ms: ceil_millis(d.reset_after()),
            retry_after_ms: ceil_millis(d.retry_after()),
            degraded: verdict.degraded,
            policy: policy.name.to_string(),
            shadow_denied: verdict.shadow_denied,
            delayed_ms: (!verdict.waited.is_zero()).then(|| ceil_millis(verdict.waited)),
            lease_id,
            message: None,
            rules,
        }
    }
}

/// 200 or 429 with `body` and the rate-limit headers of `verdict`, as the `[server]` section
/// says (`reset_header`, `headers`).
pub(crate) fn respond(
    server: &ServerSettings,
    policy: &Policy,
    verdict: &Verdict,
    body: DecisionBody,
) -> Response {
    let status = if verdict.allowed() { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    let mut response = (status, Json(body)).into_response();
    rate_limit_headers(
        response.headers_mut(),
        &policy.rules,
        &verdict.decision,
        server.reset_header,
        server.headers,
        !verdict.allowed(),
        None,
    );
    response
}

/// A limiter error as an answer. `rules_field` is where the rules came from (`policy` or
/// `limits`).
pub(crate) fn limit_problem(e: LimitError, rules_field: &str) -> Problem {
    match e {
        LimitError::Unavailable(e) => {
            Problem::unavailable(format!("{e}; the failure policy is closed, so no decision was made"))
        }
        LimitError::Invalid(e) => match e {
            CoreError::InvalidKey(_) => Problem::invalid("key", e.to_string()),
            CoreError::CostExceedsCapacity { .. } | CoreError::CostTooLarge { .. } => {
                Problem::invalid("cost", e.to_string())
            }
            CoreError::LeaseRequired { .. } => {
                Problem::invalid(rules_field, format!("{e}; use /v1/acquire and /v1/release"))
            }
            other => Problem::invalid(rules_field, other.to_string()),
        },
        _ => Problem::internal(),
    }
}
