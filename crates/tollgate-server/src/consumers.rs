//! Per-consumer checks (`{"consumer": ...}`: six clock-aligned windows, second to month, in one
//! atomic backend call), anonymous checks (`{"anonymous_ip": ...}`: one hourly window per
//! address), and a consumer's live usage (`GET /v1/consumers/{id}/call-limits`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use dashmap::DashMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_core::{Period, Rule, RuleSet};
use tollgate_limiter::keyspace::{anonymous_key, consumer_key};
use tollgate_limiter::{PERIODS, Policy, Verdict};
use tollgate_store::{aggregate, validate_consumer_id};

use crate::auth::AsViewer;
use crate::decision::{ANONYMOUS_POLICY, CONSUMER_POLICY, DecisionBody, limit_problem, respond};
use crate::state::AppState;
use tollgate_http::Problem;
use tollgate_http::extract::Path;
use tollgate_http::headers::ceil_secs;

fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

/// The limits in force for a consumer: per period, a count or `None` (unlimited).
fn limits_of(state: &AppState, consumer: &str, scope: Option<&str>) -> [Option<u64>; 6] {
    let consumers = state.consumers.load();
    let records = consumers.get(consumer).map_or(&[][..], Vec::as_slice);
    aggregate(records, now_ms(), scope, state.config().consumers.defaults)
}

/// The rules of limits over the six periods, reported as policy `name`: one clock-aligned fixed
/// window per limited period, named after it. `None` when every period is unlimited. Compiled once per distinct set of limits (consumers
/// share a handful), not on every check.
fn consumer_policy(name: &'static str, limits: [Option<u64>; 6]) -> Option<Arc<Policy>> {
    type Key = (&'static str, [Option<u64>; 6]);
    static COMPILED: LazyLock<DashMap<Key, Arc<Policy>>> = LazyLock::new(DashMap::new);
    if let Some(policy) = COMPILED.get(&(name, limits)) {
        return Some(Arc::clone(&policy));
    }
    let rules: Vec<Rule> = PERIODS
        .iter()
        .zip(limits)
        .filter_map(|((name, period), limit)| Some(Rule::fixed_window(limit?, *period).named(*name)))
        .collect();
    // Counts are capped at MAX_COUNT by the aggregation and periods are fixed: always valid.
    let policy = Arc::new(Policy::enforce(name, RuleSet::new(rules).ok()?));
    // Bounded: distinct limit sets are few; if records make them many, start over.
    if COMPILED.len() >= 4096 {
        COMPILED.clear();
    }
    COMPILED.insert((name, limits), Arc::clone(&policy));
    Some(policy)
}

/// "second", "minute", ... for a period of [`PERIODS`].
fn unit(period: Period) -> &'static str {
    match PERIODS.iter().position(|(_, p)| *p == period) {
        Some(0) => "second",
        Some(1) => "minute",
        Some(2) => "hour",
        Some(3) => "day",
        Some(4) => "week",
        _ => "month",
    }
}

/// The message of a denial: the shortest period that refused (rules are in period order).
fn denial_message(policy: &Policy, verdict: &Verdict, whom: &str) -> Option<String> {
    if verdict.allowed() {
        return None;
    }
    policy.rules.rules().zip(verdict.decision.outcomes(&policy.rules)).find(|(_, o)| !o.allowed()).map(
        |(rule, o)| {
            let period = match rule.kind {
                tollgate_core::RuleKind::FixedWindow { period, .. } => period,
                _ => Period::HOUR,
            };
            format!("Too Many Requests. We only allow {} requests per {} {whom}.", o.limit(), unit(period))
        },
    )
}

/// Every period unlimited: admitted without a backend call, with no limits to report.
#[derive(Serialize)]
struct Unlimited {
    allowed: bool,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: u64,
    retry_after_ms: u64,
    degraded: bool,
    policy: &'static str,
    rules: [(); 0],
}

async fn decide(
    state: &AppState,
    key: &str,
    policy: &Policy,
    cost: u64,
    whom: &str,
) -> Result<Response, Problem> {
    let verdict = state.limiter.check(key, policy, cost).await.map_err(|e| limit_problem(e, "consumer"))?;
    state.live.record(&policy.name, &policy.rules, key, cost, &verdict);
    let mut body = DecisionBody::new(policy, &verdict, None);
    body.message = denial_message(policy, &verdict, whom);
    Ok(respond(&state.config.load().server, policy, &verdict, body, None))
}

/// What a consumer or anonymous check counts: its key, its policy (None when every period is
/// unlimited), and whom a denial's message names.
pub(crate) struct Target {
    pub(crate) key: String,
    pub(crate) policy: Option<Arc<Policy>>,
    whom: &'static str,
}

/// `{"consumer": ...}`: the consumer's key and the limits in force for it.
pub(crate) fn consumer_target(
    state: &AppState,
    consumer: &str,
    scope: Option<&str>,
) -> Result<Target, Problem> {
    validate_consumer_id("consumer", consumer).map_err(|e| Problem::invalid("consumer", e.to_string()))?;
    if let Some(scope) = scope {
        validate_consumer_id("scope", scope).map_err(|e| Problem::invalid("scope", e.to_string()))?;
    }
    Ok(Target {
        key: consumer_key(consumer),
        policy: consumer_policy(CONSUMER_POLICY, limits_of(state, consumer, scope)),
        whom: "for this consumer",
    })
}

/// `{"anonymous_ip": ...}`: the address's key and the anonymous hourly limit.
pub(crate) fn anonymous_target(state: &AppState, ip: &str) -> Result<Target, Problem> {
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| Problem::invalid("anonymous_ip", format!("{ip:?} is not an IPv4 or IPv6 address")))?;
    let per_hour = state.config().consumers.anonymous_per_hour;
    let hourly = [None, None, Some(per_hour), None, None, None];
    let policy = consumer_policy(ANONYMOUS_POLICY, hourly).ok_or_else(Problem::internal)?;
    Ok(Target { key: anonymous_key(ip), policy: Some(policy), whom: "from an anonymous caller" })
}

/// `POST /v1/check {"consumer": ...}` or `{"anonymous_ip": ...}`: the decision on `target`.
pub(crate) async fn check_target(state: &AppState, target: Target, cost: u64) -> Result<Response, Problem> {
    let Some(policy) = target.policy else {
        let body = Unlimited {
            allowed: true,
            limit: None,
            remaining: None,
            reset_after_ms: 0,
            retry_after_ms: 0,
            degraded: false,
            policy: CONSUMER_POLICY,
            rules: [],
        };
        return Ok(Json(body).into_response());
    };
    decide(state, &target.key, &policy, cost, target.whom).await
}

/// One period's live state.
#[derive(Debug, Serialize)]
pub struct PeriodState {
    /// Calls counted in the current window (-1 when the period is unlimited).
    pub calls_made: i64,
    /// Seconds until the window resets (-1 when unlimited; 0 when nothing is counted).
    pub reset_in_seconds: i64,
}

/// `GET /v1/consumers/{id}/call-limits` body.
#[derive(Debug, Serialize)]
pub struct CallLimits {
    /// The consumer.
    pub consumer_id: String,
    /// The limits in force now (unscoped), per period; -1 is unlimited.
    pub limits: BTreeMap<&'static str, i64>,
    /// Per period: calls made and time to reset, read from the backend now.
    pub current_state: BTreeMap<&'static str, PeriodState>,
    /// Whether the counts came from the failure policy's local limiter, not the backend.
    pub degraded: bool,
}

/// A consumer's configured limits and live usage (any token role).
#[utoipa::path(get, path = "/v1/consumers/{consumer}/call-limits", params(("consumer" = String, Path)), responses((status = 200, description = "`limits` and per period `calls_made`, `reset_in_seconds`"), (status = 401, body = Problem, content_type = "application/problem+json"), (status = 403, body = Problem, content_type = "application/problem+json")))]
pub async fn call_limits(
    State(state): State<AppState>,
    AsViewer(_caller): AsViewer,
    Path(consumer): Path<String>,
) -> Result<Json<CallLimits>, Problem> {
    validate_consumer_id("consumer", &consumer).map_err(|e| Problem::invalid("consumer", e.to_string()))?;
    let limits = limits_of(&state, &consumer, None);
    let mut body = CallLimits {
        consumer_id: consumer.clone(),
        limits: BTreeMap::new(),
        current_state: BTreeMap::new(),
        degraded: false,
    };
    let unlimited = || PeriodState { calls_made: -1, reset_in_seconds: -1 };
    for ((name, _), limit) in PERIODS.iter().zip(limits) {
        body.limits.insert(*name, limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        body.current_state.insert(*name, unlimited());
    }
    if let Some(policy) = consumer_policy(CONSUMER_POLICY, limits) {
        let verdict = state
            .limiter
            .peek(&consumer_key(&consumer), &policy.rules)
            .await
            .map_err(|e| limit_problem(e, "consumer"))?;
        body.degraded = verdict.degraded;
        for (rule, outcome) in policy.rules.rules().zip(verdict.decision.outcomes(&policy.rules)) {
            if let Some(name) = rule.name.as_deref().and_then(|n| PERIODS.iter().find(|(p, _)| *p == n)) {
                let made = outcome.limit().saturating_sub(outcome.remaining());
                body.current_state.insert(
                    name.0,
                    PeriodState {
                        calls_made: i64::try_from(made).unwrap_or(i64::MAX),
                        reset_in_seconds: i64::try_from(ceil_secs(outcome.reset_after())).unwrap_or(i64::MAX),
                    },
                );
            }
        }
    }
    Ok(Json(body))
}
