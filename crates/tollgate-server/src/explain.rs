//! The explain mode of `/v1/check` (`?explain=1`, or the header `Tollgate-Explain: 1`): for an
//! operator asking why a caller is refused, every rule's state for the request's key, read
//! without counting anything. It reveals any key's usage, so it needs a token (any role); a
//! token limited to some apps may explain only stored policies all of whose apps it holds.

use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_core::Operation;
use tollgate_http::Problem;
use tollgate_http::headers::{ceil_millis, rule_name};
use tollgate_limiter::{LimitError, Mode, Policy};
use utoipa::ToSchema;

use crate::auth::{Caller, store_problem};
use crate::decision::{RuleBody, limit_problem};
use crate::state::AppState;

/// The request header that asks for an explanation, as `?explain=1` does.
pub const EXPLAIN_HEADER: &str = "tollgate-explain";

/// Whether a `/v1/check` asks to be explained, and if so by whom: the extractor checks the
/// token before the body is read, so a stranger gets 401 (or 403) whatever it sent.
pub struct Explain(pub(crate) Option<Caller>);

/// `1` or `true` asks, `0` or `false` does not; anything else is a mistake naming `field`.
fn flag(field: &str, value: &str) -> Result<bool, Problem> {
    match value {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(Problem::invalid(field, format!("{field} is 1 or true (or 0 or false), not {value:?}"))),
    }
}

fn asked(parts: &Parts) -> Result<bool, Problem> {
    let mut asked = false;
    // Other query parameters are ignored, as they always were on /v1/check, and so is a query
    // that cannot be read unless it may be asking for an explanation.
    let pairs = match parts.uri.query().map(|_| Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)) {
        // Most checks carry no query: nothing to read.
        None => Vec::new(),
        Some(Ok(Query(pairs))) => pairs,
        Some(Err(e)) if parts.uri.query().is_some_and(|q| q.contains("explain")) => {
            return Err(Problem::invalid("explain", format!("the query cannot be read: {e}")));
        }
        Some(Err(_)) => Vec::new(),
    };
    for (name, value) in pairs.iter().filter(|(name, _)| name == "explain") {
        asked |= flag(name, value)?;
    }
    if let Some(value) = parts.headers.get(EXPLAIN_HEADER) {
        let value = value.to_str().map_err(|_| Problem::invalid(EXPLAIN_HEADER, "not ASCII"))?;
        asked |= flag(EXPLAIN_HEADER, value.trim())?;
    }
    Ok(asked)
}

impl FromRequestParts<AppState> for Explain {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        if !asked(parts).map_err(IntoResponse::into_response)? {
            return Ok(Explain(None));
        }
        let caller = Caller::from_request_parts(parts, state).await?;
        Ok(Explain(Some(caller)))
    }
}

/// The answer of the explain mode: always 200, whatever the rules say.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExplainBody {
    /// Always true: this is an explanation, and nothing was counted.
    pub explain: bool,
    /// The policy applied (`inline`, `consumer` or `anonymous` for those checks).
    pub policy: String,
    /// `enforce` or `shadow`.
    pub mode: &'static str,
    /// The key the state is kept under (`consumer:<id>` for a consumer).
    pub key: String,
    /// The units the request asks for.
    pub cost: u64,
    /// Whether a check of this cost would be let through now.
    pub allowed: bool,
    /// Shadow mode only: the rules would refuse it, but the request would be let through.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow_denied: bool,
    /// The rules that would refuse it now, in the policy's order (empty when none would).
    pub refused_by: Vec<String>,
    /// True when read from the failure policy's local limiter, not the backend.
    pub degraded: bool,
    /// Every rule's state, in the policy's order: `allowed` is whether the rule would admit
    /// this cost now, `remaining` the units it would admit, `retry_after_ms` the wait until one
    /// unit fits.
    pub rules: Vec<RuleBody<'static>>,
}

/// Refuses `caller` when its token is limited to some apps and the check is not under a
/// stored policy all of whose apps it holds: `named` is the policy the request named (None for
/// inline rules and consumer or anonymous checks, which count every app's callers).
async fn refused_scope(caller: &Caller, named: Option<&str>, state: &AppState) -> Result<(), Problem> {
    let token = &caller.token;
    if token.apps.is_none() {
        return Ok(());
    }
    let forbidden = || {
        Problem::forbidden(format!(
            "token {:?} is limited to some apps: it may explain only checks under stored policies \
             all of whose apps it holds",
            token.name
        ))
    };
    // The file's policies (which shadow stored ones of the same name) belong to every app.
    let Some(name) = named.filter(|name| state.config().policies.get(name).is_none()) else {
        return Err(forbidden());
    };
    match caller.store.get_policy(name).await {
        Ok(record) if token.may_change(&record.spec.apps) => Ok(()),
        Ok(_) | Err(tollgate_store::StoreError::NotFound { .. }) => Err(forbidden()),
        Err(e) => Err(store_problem(e)),
    }
}

/// What an explanation is of: the key, and the policy (None when every period of a consumer is
/// unlimited), which the request `named` or not (see [`refused_scope`]).
pub(crate) struct Subject<'a> {
    pub(crate) key: &'a str,
    pub(crate) policy: Option<Arc<Policy>>,
    pub(crate) named: Option<&'a str>,
}

/// The explanation of a check of `cost` units of `subject`, asked by `caller`. `field` is where
/// the rules came from, for errors.
pub(crate) async fn explain(
    state: &AppState,
    caller: &Caller,
    subject: Subject<'_>,
    cost: u64,
    field: &str,
) -> Result<Response, Problem> {
    refused_scope(caller, subject.named, state).await?;
    let key = subject.key;
    let Some(policy) = subject.policy else {
        // Nothing limits it: no rules to read.
        let body = ExplainBody {
            explain: true,
            policy: crate::decision::CONSUMER_POLICY.into(),
            mode: "enforce",
            key: key.into(),
            cost,
            allowed: true,
            shadow_denied: false,
            refused_by: Vec::new(),
            degraded: false,
            rules: Vec::new(),
        };
        return Ok(Json(body).into_response());
    };
    // The same refusals as a check (a key out of bounds, a cost no rule can ever take).
    Operation::Check { cost }
        .validate(key, &policy.rules)
        .map_err(|e| limit_problem(LimitError::Invalid(e), field))?;
    let verdict = state.limiter.peek(key, &policy.rules).await.map_err(|e| limit_problem(e, field))?;
    // A peek reports each rule's units left now; a rule admits `cost` units when that many
    // are left (each algorithm's admission is exactly that test), one unit at least.
    let need = cost.max(1);
    let rules: Vec<RuleBody<'static>> = policy
        .rules
        .rules()
        .zip(verdict.decision.outcomes(&policy.rules))
        .enumerate()
        .map(|(index, (rule, o))| RuleBody {
            name: rule_name(rule, index).into_owned().into(),
            algorithm: o.algorithm().as_str(),
            allowed: o.allowed() && o.remaining() >= need,
            limit: o.limit(),
            remaining: o.remaining(),
            reset_after_ms: ceil_millis(o.reset_after()),
            retry_after_ms: ceil_millis(o.retry_after()),
        })
        .collect();
    let refused_by: Vec<String> = rules.iter().filter(|r| !r.allowed).map(|r| r.name.to_string()).collect();
    let shadow = policy.mode == Mode::Shadow;
    let body = ExplainBody {
        explain: true,
        policy: policy.name.to_string(),
        mode: if shadow { "shadow" } else { "enforce" },
        key: key.into(),
        cost,
        allowed: refused_by.is_empty() || shadow,
        shadow_denied: shadow && !refused_by.is_empty(),
        refused_by,
        degraded: verdict.degraded,
        rules,
    };
    Ok(Json(body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_one_or_true() {
        assert!(flag("explain", "1").unwrap());
        assert!(flag("explain", "true").unwrap());
        assert!(!flag("explain", "0").unwrap());
        let e = flag("explain", "yes").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("explain"));
    }
}
