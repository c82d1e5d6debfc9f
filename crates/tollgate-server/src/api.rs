//! The decision API: `/v1/check`, `/v1/acquire`, `/v1/release` and `/v1/reset`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use tollgate_config::rule_error_field;
use tollgate_core::limits::MAX_CONCURRENCY_LIMIT;
use tollgate_core::{Lease, LeaseId, Period, Rule, RuleSet};
use tollgate_limiter::{Policy, Verdict};
use utoipa::ToSchema;

use crate::consumers::{anonymous_target, check_target, consumer_target};
use crate::decision::{DecisionBody, INLINE_POLICY, limit_problem, respond};
use crate::explain::{Explain, Subject, explain};
use crate::state::AppState;
use tollgate_http::Problem;
use tollgate_http::extract::{ApiJson, JsonBody, borrowed_text, parse};

/// Most inline rules in one request.
pub const MAX_INLINE_RULES: usize = 16;

fn one() -> u64 {
    1
}

/// `POST /v1/check`: a key, and a policy name or inline rules.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest<'a> {
    /// Whose requests are counted: 1 to 512 bytes (an API key, a user id, an IP, ...), not
    /// starting with `consumer:`, `anonymous:`, `envoy:` or `envoy#` (Tollgate's own). Not
    /// with `consumer` or `anonymous_ip`, which name their own key.
    #[serde(default, borrow, deserialize_with = "borrowed_text")]
    #[schema(value_type = Option<String>)]
    pub key: Option<Cow<'a, str>>,
    /// Check a consumer's six-period limits (from the policy database) instead of a policy.
    #[serde(default)]
    pub consumer: Option<String>,
    /// Check the anonymous per-hour limit of this IP address instead of a policy.
    #[serde(default)]
    pub anonymous_ip: Option<String>,
    /// With `consumer`: the API or path of the request, selecting the scoped limit records
    /// that apply (those whose scope is a prefix of it).
    #[serde(default)]
    pub scope: Option<String>,
    /// A policy from the configuration. Give this or `limits`.
    #[serde(default, borrow, deserialize_with = "borrowed_text")]
    #[schema(value_type = Option<String>)]
    pub policy: Option<Cow<'a, str>>,
    /// Inline rules, at most 16, each `{"algorithm": ..., parameters}` as in the configuration
    /// file (`fixed_window`: limit, period; `sliding_window_log`: limit, period;
    /// `sliding_window_counter`: limit, period; `token_bucket`: capacity, refill, per; `gcra`:
    /// limit, period, burst), with an optional `name`. Durations are "250ms", "1s", "1h", "7d" or
    /// milliseconds. Refused (400, `state-too-large`) when one key's state under them could
    /// exceed `[server] max_request_state` (256 KiB by default: sliding logs take 130 bytes per
    /// unit of limit), and (403) when the server has `[server] inline_limits = false`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub limits: Option<Vec<Rule>>,
    /// Units this request takes (default 1); 0 only peeks.
    #[serde(default = "one")]
    pub cost: u64,
}

/// `POST /v1/acquire`: take units held at once under a lease.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Whose units are held.
    pub key: String,
    /// A policy with a concurrency rule. Give this or `limit` and `lease`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Inline: units held at once (1 to 10000, and within `[server] max_request_state`: 290
    /// bytes per lease, so about 900 by default).
    #[serde(default)]
    pub limit: Option<u64>,
    /// Inline: how long an unreleased lease holds its units ("30s").
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub lease: Option<Period>,
    /// Units to hold (default 1).
    #[serde(default = "one")]
    pub cost: u64,
}

/// `POST /v1/release`: give back a lease's units.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The key the lease was taken for.
    pub key: String,
    /// The policy it was taken under, or the same inline `limit` and `lease`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Inline: as given to acquire.
    #[serde(default)]
    pub limit: Option<u64>,
    /// Inline: as given to acquire.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub lease: Option<Period>,
    /// The `lease_id` acquire answered.
    pub lease_id: String,
    /// Units to give back (default: all the lease holds).
    #[serde(default)]
    pub cost: Option<u64>,
}

/// `POST /v1/reset`: forget a key's counters under a policy or inline rules.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    /// The key.
    pub key: String,
    /// A policy. Give this or `limits`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Inline rules, as in `/v1/check`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub limits: Option<Vec<Rule>>,
}

/// 200 or 429 with the decision body and the rate-limit headers.
fn decision_response(
    state: &AppState,
    policy: &Arc<Policy>,
    named: Option<&str>,
    verdict: &Verdict,
    lease_id: Option<String>,
) -> Response {
    // Inline rules come anew with each request: only a named policy's header values are kept.
    let fixed = named.map(|_| state.kept_headers.of(policy));
    let body = DecisionBody::new(policy, verdict, lease_id);
    respond(&state.config.load().server, policy, verdict, body, fixed.as_deref())
}

/// What a request will do with inline rules: store state under them (check, acquire), or only
/// shrink or drop it (release, reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InlineUse {
    /// Held to `[server] max_request_state`.
    Stores,
    /// Not held to it: state stored under a budget since lowered must still be releasable and
    /// resettable.
    Shrinks,
}

/// The one gate of inline rules: refused when the server takes none (403), invalid (400 naming
/// the rule's field), or, when the request stores state, when one key's state could exceed the
/// budget (400). `field` is where the rules were given.
fn inline_policy(
    state: &AppState,
    rules: Vec<Rule>,
    field: &str,
    to: InlineUse,
) -> Result<Arc<Policy>, Problem> {
    let server = &state.config.load().server;
    if !server.inline_limits {
        return Err(Problem::inline_limits_disabled(field));
    }
    if rules.len() > MAX_INLINE_RULES {
        return Err(Problem::invalid(
            field,
            format!("{} rules given; at most {MAX_INLINE_RULES} are allowed in one request", rules.len()),
        ));
    }
    let rules =
        RuleSet::new(rules).map_err(|e| Problem::invalid(rule_error_field(&e, field), e.to_string()))?;
    let footprint = rules.worst_case_state();
    if to == InlineUse::Stores && footprint > server.max_request_state {
        return Err(Problem::state_too_large(field, footprint, server.max_request_state));
    }
    Ok(Arc::new(Policy::enforce(INLINE_POLICY, rules)))
}

/// The policy a request names, or its inline rules.
fn resolve(
    state: &AppState,
    policy: Option<&str>,
    limits: Option<Vec<Rule>>,
    to: InlineUse,
) -> Result<Arc<Policy>, Problem> {
    match (policy, limits) {
        (Some(_), Some(_)) => {
            Err(Problem::invalid("limits", "give either a policy or inline limits, not both"))
        }
        (None, None) => Err(Problem::invalid("policy", "give a policy name, or inline rules in limits")),
        (Some(name), None) => state.policy(name).ok_or_else(|| Problem::unknown_policy(name)),
        (None, Some(rules)) => inline_policy(state, rules, "limits", to),
    }
}

/// The policy of a lease request: a named one, or an inline concurrency rule.
fn resolve_lease(
    state: &AppState,
    policy: Option<&str>,
    limit: Option<u64>,
    lease: Option<Period>,
    to: InlineUse,
) -> Result<Arc<Policy>, Problem> {
    let policy = match (policy, limit, lease) {
        (Some(_), Some(_), _) => {
            return Err(Problem::invalid("limit", "give either a policy or limit, not both"));
        }
        (Some(_), _, Some(_)) => {
            return Err(Problem::invalid("lease", "give either a policy or lease, not both"));
        }
        (Some(name), None, None) => resolve(state, Some(name), None, to)?,
        (None, Some(limit), Some(lease)) => {
            inline_policy(state, vec![Rule::concurrency(limit, lease).named("concurrency")], "limit", to)
                // a rule error names `limit[0].limit`: the request's field is `limit`
                .map_err(|p| Problem { field: Some("limit".into()), ..p })?
        }
        (None, None, _) => {
            return Err(Problem::invalid("policy", "give a policy name, or an inline limit and lease"));
        }
        (None, Some(_), None) => {
            return Err(Problem::invalid("lease", "an inline limit needs a lease, like \"30s\""));
        }
    };
    if !policy.rules.has_concurrency() {
        return Err(Problem::invalid(
            "policy",
            format!("policy {:?} has no concurrency rule: use /v1/check", policy.name),
        ));
    }
    Ok(policy)
}

fn rules_field(policy: Option<&str>) -> &'static str {
    if policy.is_some() { "policy" } else { "limits" }
}

/// Refuses a caller's key in one of Tollgate's own namespaces.
fn caller_key(key: &str) -> Result<&str, Problem> {
    match tollgate_limiter::keyspace::reserved_prefix(key) {
        Some(prefix) => Err(Problem::invalid(
            "key",
            format!(
                "keys starting with {prefix:?} are Tollgate's own (consumer, anonymous and Envoy \
                 checks count under them); choose another key"
            ),
        )),
        None => Ok(key),
    }
}

/// Checks (and takes) `cost` units for a key. With `?explain=1` (or `Tollgate-Explain: 1`) and
/// a token, counts nothing and answers each rule's state instead.
#[utoipa::path(
    post, path = "/v1/check", request_body = CheckRequest,
    params(
        ("explain" = Option<String>, Query, description = "1: explain instead of deciding (needs a token, any role); also the header Tollgate-Explain: 1"),
    ),
    responses(
        (status = 200, description = "Admitted; or, explained, each rule's state (ExplainBody)", body = DecisionBody),
        (status = 429, description = "Denied (same body)", body = DecisionBody),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Explain without a known token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Explain with a token limited to apps the policy reaches beyond", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Backend down, failure policy closed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn check(
    State(state): State<AppState>,
    Explain(explainer): Explain,
    JsonBody(body): JsonBody,
) -> Result<Response, Problem> {
    // Read here rather than by an extractor, so the key and policy name borrow the body.
    let req: CheckRequest<'_> = parse(&body)?;
    let subject = match (&req.consumer, &req.anonymous_ip) {
        (Some(_), Some(_)) => {
            return Err(Problem::invalid("anonymous_ip", "give consumer or anonymous_ip, not both"));
        }
        (Some(consumer), None) => Some(("consumer", consumer)),
        (None, Some(ip)) => Some(("anonymous_ip", ip)),
        (None, None) => None,
    };
    if let Some((field, value)) = subject {
        let others =
            [(req.key.is_some(), "key"), (req.policy.is_some(), "policy"), (req.limits.is_some(), "limits")];
        if let Some((_, other)) = others.iter().find(|(given, _)| *given) {
            return Err(Problem::invalid(
                *other,
                format!("{field} checks name their own key and limits: drop {other}"),
            ));
        }
        let target = match field {
            "consumer" => Some(consumer_target(&state, value, req.scope.as_deref())?),
            _ if req.scope.is_none() => Some(anonymous_target(&state, value)?),
            _ => None,
        };
        if let Some(target) = target {
            return match &explainer {
                Some(caller) => {
                    let subject = Subject { key: &target.key, policy: target.policy.clone(), named: None };
                    // Boxed, as below: explaining is rare, and its state would size every check.
                    Box::pin(explain(&state, caller, subject, req.cost, field)).await
                }
                None => check_target(&state, target, req.cost).await,
            };
        }
    }
    if req.scope.is_some() {
        return Err(Problem::invalid("scope", "scope applies to consumer checks only"));
    }
    let Some(key) = req.key else {
        return Err(Problem::invalid("key", "give a key (or a consumer, or an anonymous_ip)"));
    };
    caller_key(&key)?;
    let field = rules_field(req.policy.as_deref());
    let policy = resolve(&state, req.policy.as_deref(), req.limits, InlineUse::Stores)?;
    if let Some(caller) = &explainer {
        let subject = Subject { key: &key, policy: Some(policy), named: req.policy.as_deref() };
        return Box::pin(explain(&state, caller, subject, req.cost, field)).await;
    }
    let verdict = state.limiter.check(&key, &policy, req.cost).await.map_err(|e| limit_problem(e, field))?;
    state.live.record(&policy.name, &policy.rules, &key, req.cost, &verdict);
    Ok(decision_response(&state, &policy, req.policy.as_deref(), &verdict, None))
}

/// Takes units held at once; answers a lease id to release them with.
#[utoipa::path(
    post, path = "/v1/acquire", request_body = AcquireRequest,
    responses(
        (status = 200, description = "Admitted, with a lease_id", body = DecisionBody),
        (status = 429, description = "Denied", body = DecisionBody),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Backend down, failure policy closed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn acquire(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<Response, Problem> {
    caller_key(&req.key)?;
    let policy = resolve_lease(&state, req.policy.as_deref(), req.limit, req.lease, InlineUse::Stores)?;
    let (verdict, lease) = state
        .limiter
        .acquire(&req.key, &policy, req.cost)
        .await
        .map_err(|e| limit_problem(e, rules_field(req.policy.as_deref())))?;
    let lease_id = lease.map(|l| l.id.to_string());
    Ok(decision_response(&state, &policy, req.policy.as_deref(), &verdict, lease_id))
}

/// Gives back a lease's units.
#[utoipa::path(
    post, path = "/v1/release", request_body = ReleaseRequest,
    responses(
        (status = 200, description = "Released; the state after, as a peek", body = DecisionBody),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Backend down, failure policy closed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn release(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> Result<Response, Problem> {
    caller_key(&req.key)?;
    let policy = resolve_lease(&state, req.policy.as_deref(), req.limit, req.lease, InlineUse::Shrinks)?;
    let id: LeaseId = req
        .lease_id
        .parse()
        .map_err(|e: tollgate_core::LeaseIdError| Problem::invalid("lease_id", e.to_string()))?;
    let units = req.cost.unwrap_or(MAX_CONCURRENCY_LIMIT);
    if units == 0 || units > MAX_CONCURRENCY_LIMIT {
        return Err(Problem::invalid("cost", format!("cost must be between 1 and {MAX_CONCURRENCY_LIMIT}")));
    }
    let lease = Lease { id, units };
    let verdict = state
        .limiter
        .release(&req.key, &policy.rules, &lease)
        .await
        .map_err(|e| limit_problem(e, rules_field(req.policy.as_deref())))?;
    let mut response = decision_response(&state, &policy, req.policy.as_deref(), &verdict, None);
    // A release is never refused: the peek's status is informative only.
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().remove(axum::http::header::RETRY_AFTER);
    Ok(response)
}

/// Forgets a key's counters under a policy or inline rules.
#[utoipa::path(
    post, path = "/v1/reset", request_body = ResetRequest,
    responses(
        (status = 204, description = "Reset"),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Backend down: nothing was reset", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn reset(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ResetRequest>,
) -> Result<StatusCode, Problem> {
    caller_key(&req.key)?;
    let field = rules_field(req.policy.as_deref());
    let policy = resolve(&state, req.policy.as_deref(), req.limits, InlineUse::Shrinks)?;
    state.limiter.reset(&req.key, &policy.rules).await.map_err(|e| limit_problem(e, field))?;
    Ok(StatusCode::NO_CONTENT)
}
