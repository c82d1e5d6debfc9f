//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a [`Limiter`].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::{Decision, Error as CoreError, Rule, RuleSet};
use tollgate_limiter::keyspace::envoy_key;
use tollgate_limiter::{Check, JointVerdict, LimitError, Limiter, Mode, Policy, Verdict};
use tonic::{Request, Response, Status};

use crate::config::{Domain, Limit, Unit, find};

/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 16;
/// Longest domain, entry key or entry value, in bytes.
pub const MAX_TEXT_BYTES: usize = 256;

/// Metric names, upstream's where they exist, by `domain` and `descriptor` (the entry keys, or
/// keys and values for `detailed_metric` descriptors).
pub mod names {
    /// Counter: hits (the sum of hits_addend).
    pub const TOTAL_HITS: &str = "tollgate_envoy_total_hits";
    /// Counter: hits refused.
    pub const OVER_LIMIT: &str = "tollgate_envoy_over_limit";
    /// Counter: hits admitted with more than 80 % of a limit used.
    pub const NEAR_LIMIT: &str = "tollgate_envoy_near_limit";
    /// Counter: hits admitted.
    pub const WITHIN_LIMIT: &str = "tollgate_envoy_within_limit";
    /// Counter: hits a shadow-mode descriptor would have refused.
    pub const SHADOW_MODE: &str = "tollgate_envoy_shadow_mode";
}

/// The gRPC service: domains by name, swapped whole by reloads.
#[derive(Clone)]
pub struct EnvoyService {
    limiter: Limiter,
    domains: Arc<ArcSwap<BTreeMap<String, Domain>>>,
    response_headers: bool,
}

impl std::fmt::Debug for EnvoyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvoyService").finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message.into())
}

/// One descriptor, ready to decide.
struct Planned {
    entries: Vec<(String, String)>,
    limits: Vec<Limit>,
    shadow: bool,
    detailed: bool,
    hits: u64,
}

impl EnvoyService {
    /// A service over `limiter` answering for `domains`.
    pub fn new(limiter: Limiter, domains: Vec<Domain>) -> Self {
        let map = domains.into_iter().map(|d| (d.name.clone(), d)).collect();
        EnvoyService { limiter, domains: Arc::new(ArcSwap::from_pointee(map)), response_headers: false }
    }

    /// With `x-ratelimit-limit`, `-remaining` and `-reset` in `response_headers_to_add`, for the
    /// most restrictive descriptor (upstream's `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub fn with_response_headers(mut self, enabled: bool) -> Self {
        self.response_headers = enabled;
        self
    }

    /// Replaces the domains (a reload).
    pub fn replace_domains(&self, domains: Vec<Domain>) {
        self.domains.store(Arc::new(domains.into_iter().map(|d| (d.name.clone(), d)).collect()));
    }

    fn plan(&self, req: &RateLimitRequest) -> Result<Vec<Planned>, Status> {
        if req.domain.is_empty() || req.domain.len() > MAX_TEXT_BYTES {
            return Err(invalid(format!("domain must be 1 to {MAX_TEXT_BYTES} bytes")));
        }
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid(format!("at most {MAX_DESCRIPTORS} descriptors per request")));
        }
        let domains = self.domains.load();
        let domain = domains.get(&req.domain);
        // hits_addend 0 means "not set": one hit, as upstream.
        let request_hits = if req.hits_addend == 0 { 1 } else { u64::from(req.hits_addend) };
        req.descriptors.iter().enumerate().map(|(i, d)| plan_one(i, d, domain, request_hits)).collect()
    }
}

fn plan_one(
    i: usize,
    d: &RateLimitDescriptor,
    domain: Option<&Domain>,
    request_hits: u64,
) -> Result<Planned, Status> {
    if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
        return Err(invalid(format!("descriptors[{i}]: 1 to {MAX_ENTRIES} entries")));
    }
    if d.entries
        .iter()
        .any(|e| e.key.is_empty() || e.key.len() > MAX_TEXT_BYTES || e.value.len() > MAX_TEXT_BYTES)
    {
        return Err(invalid(format!(
            "descriptors[{i}]: entry keys are 1 to {MAX_TEXT_BYTES} bytes, values at most"
        )));
    }
    let entries: Vec<(String, String)> = d.entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect();
    let hits = d.hits_addend.as_ref().map_or(request_hits, |h| h.value);
    let node = domain.and_then(|dom| find(&dom.root, &entries));
    let (mut limits, shadow, detailed) = match node {
        Some(n) => (n.limits.clone(), n.shadow_mode, n.detailed_metric),
        None => (Vec::new(), false, false),
    };
    // A limit in the request overrides the configuration's (upstream's `limit` field).
    if let Some(o) = &d.limit {
        let unit = Unit::from_proto(o.unit)
            .ok_or_else(|| invalid(format!("descriptors[{i}].limit.unit is unknown")))?;
        let period = tollgate_core::Period::from_secs(unit.seconds()).map_err(|e| invalid(e.to_string()))?;
        let n = u64::from(o.requests_per_unit);
        let rule = (n > 0).then(|| Rule::fixed_window(n, period));
        let window_secs = unit.seconds();
        limits =
            vec![Limit { name: None, rule, requests_per_unit: n, unit, window_secs, replaces: Vec::new() }];
    }
    Ok(Planned { entries, limits, shadow, detailed, hits })
}

fn status(code: Code, limit: Option<&Limit>, remaining: u64, reset: std::time::Duration) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|l| RateLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(l.requests_per_unit).unwrap_or(u32::MAX),
            unit: l.unit.proto(),
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: (!reset.is_zero()).then(|| envoy_types::pb::google::protobuf::Duration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.into_inner()).await.map(Response::new)
    }
}

/// One limited descriptor: its check in the request's batch.
struct Item<'a> {
    planned: &'a Planned,
    labels: [(&'static str, String); 2],
    key: String,
    policy: Policy,
    /// The limits with a rule, in the order of the rule set's rules.
    limited: Vec<&'a Limit>,
    /// More hits than the limits can ever admit: over the limit whatever the state.
    impossible: bool,
}

impl Item<'_> {
    /// Enforced, not shadow mode: its refusal refuses the request.
    fn enforced(&self) -> bool {
        !self.planned.shadow
    }
}

/// Each limited descriptor becomes one check of a single batch: one backend call for the whole
/// request, the enforced descriptors all or nothing.
struct Batch<'a> {
    items: Vec<Item<'a>>,
    /// For each descriptor of the request, its item (`None`: no limit, not counted).
    of_descriptor: Vec<Option<usize>>,
}

/// `replaces`: a named limit is dropped when another limit of this request replaces it.
fn drop_replaced(planned: &mut [Planned]) {
    let replaced: HashSet<String> =
        planned.iter().flat_map(|p| p.limits.iter().flat_map(|l| l.replaces.iter().cloned())).collect();
    for p in planned {
        p.limits.retain(|l| l.name.as_ref().is_none_or(|n| !replaced.contains(n)));
    }
}

impl<'a> Batch<'a> {
    fn new(domain: &str, planned: &'a [Planned]) -> Result<Self, Status> {
        let mut batch = Batch { items: Vec::new(), of_descriptor: Vec::with_capacity(planned.len()) };
        for p in planned {
            // No limit, or only unlimited ones: OK, uncounted, no current limit (as upstream).
            let item = Item::new(domain, p)?;
            batch.of_descriptor.push(item.is_some().then_some(batch.items.len()));
            batch.items.extend(item);
        }
        Ok(batch)
    }
}

impl<'a> Item<'a> {
    /// The check of descriptor `p`, or `None` when none of its limits has a rule.
    fn new(domain: &str, p: &'a Planned) -> Result<Option<Self>, Status> {
        let rules: Vec<Rule> = p.limits.iter().filter_map(|l| l.rule.clone()).collect();
        if rules.is_empty() {
            return Ok(None);
        }
        let label = match p.detailed {
            true => p.entries.iter().map(|(k, v)| format!("{k}_{v}")).collect::<Vec<_>>().join("."),
            false => p.entries.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join("."),
        };
        let set = RuleSet::new(rules).map_err(|e| Status::internal(e.to_string()))?;
        let mode = if p.shadow { Mode::Shadow } else { Mode::Enforce };
        Ok(Some(Item {
            planned: p,
            labels: [("domain", domain.to_owned()), ("descriptor", label)],
            key: envoy_key(domain, &p.entries),
            policy: Policy::enforce(domain, set).with_mode(mode),
            limited: p.limits.iter().filter(|l| l.rule.is_some()).collect(),
            impossible: false,
        }))
    }
}

impl EnvoyService {
    /// Decides one `ShouldRateLimit` request (the gRPC method, and `POST /json`).
    pub async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let mut planned = self.plan(&req)?;
        drop_replaced(&mut planned);
        let mut batch = Batch::new(&req.domain, &planned)?;
        let joint = self.check(&mut batch.items).await?;
        let mut overall = Code::Ok;
        let mut statuses = Vec::with_capacity(planned.len());
        // Each status's window in seconds (0 when it has no limit), for the response headers.
        let mut windows = Vec::with_capacity(planned.len());
        for at in &batch.of_descriptor {
            let (status, window) = match (at, &joint) {
                (Some(at), Some(joint)) => descriptor_status(&batch.items[*at], &joint.verdicts[*at]),
                _ => (status(Code::Ok, None, 0, std::time::Duration::ZERO), 0),
            };
            if status.code == Code::OverLimit as i32 {
                overall = Code::OverLimit;
            }
            statuses.push(status);
            windows.push(window);
        }
        let headers = if self.response_headers { response_headers(&statuses, &windows) } else { Vec::new() };
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        })
    }

    /// Checks the batch in one limiter call (`None` when it is empty).
    ///
    /// An enforced descriptor over its limit whatever the state refuses the request: the others
    /// are only looked at. The same when the request asks one counter (two descriptors alike)
    /// for more than it holds. The limiter validates before any backend call: a descriptor
    /// over-asking is found there, marked, and the batch asked again with it (and, if enforced,
    /// the others) only peeking.
    async fn check(&self, items: &mut [Item<'_>]) -> Result<Option<JointVerdict>, Status> {
        let mut blocked = false;
        while !items.is_empty() {
            let checks: Vec<Check<'_>> = items
                .iter()
                .map(|i| {
                    let peek = i.impossible || (blocked && i.enforced());
                    Check { key: &i.key, policy: &i.policy, cost: if peek { 0 } else { i.planned.hits } }
                })
                .collect();
            match self.limiter.check_all(&checks).await {
                Ok(joint) => return Ok(Some(joint)),
                Err(LimitError::Invalid(CoreError::InPart { part, error }))
                    if matches!(*error, CoreError::CostExceedsCapacity { .. }) =>
                {
                    blocked |= items[part].enforced();
                    items[part].impossible = true;
                }
                Err(LimitError::Invalid(e)) => return Err(invalid(e.to_string())),
                Err(LimitError::Unavailable(e)) => return Err(Status::unavailable(e.to_string())),
                Err(e) => return Err(Status::internal(e.to_string())),
            }
        }
        Ok(None)
    }
}

/// A checked descriptor's status and its binding limit's window in seconds; counts its hits in
/// the metrics.
fn descriptor_status(item: &Item<'_>, verdict: &Verdict) -> (DescriptorStatus, u64) {
    let d = &verdict.decision;
    let over = item.impossible || !d.allowed();
    count_hits(item, over, d);
    let code = if over && item.enforced() { Code::OverLimit } else { Code::Ok };
    let binding = d.rules().iter().position(|o| o == d.binding()).unwrap_or(0);
    let limit = item.limited.get(binding).copied();
    let remaining = if item.impossible { 0 } else { d.remaining() };
    (status(code, limit, remaining, d.reset_after()), limit.map_or(0, |l| l.window_secs))
}

/// Upstream's hit counters: every hit, then shadow-mode, over, near (above 80 % used) or within.
fn count_hits(item: &Item<'_>, over: bool, d: &Decision) {
    let (labels, hits) = (&item.labels, item.planned.hits);
    ::metrics::counter!(names::TOTAL_HITS, labels).increment(hits);
    let name = if over && !item.enforced() {
        names::SHADOW_MODE
    } else if over {
        names::OVER_LIMIT
    } else if d.rules().iter().any(|o| o.remaining.saturating_mul(5) < o.limit) {
        names::NEAR_LIMIT
    } else {
        names::WITHIN_LIMIT
    };
    ::metrics::counter!(name, labels).increment(hits);
}

/// Upstream's headers for the most restrictive limited descriptor (the fewest remaining):
/// `x-ratelimit-limit: 10, 10;w=60`, `x-ratelimit-remaining`, `x-ratelimit-reset` (seconds,
/// rounded up).
fn response_headers(statuses: &[DescriptorStatus], windows: &[u64]) -> Vec<HeaderValue> {
    let Some((s, window)) = statuses
        .iter()
        .zip(windows)
        .filter(|(s, _)| s.current_limit.is_some())
        .min_by_key(|(s, _)| s.limit_remaining)
    else {
        return Vec::new();
    };
    let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    let header = |key: &str, value: String| HeaderValue { key: key.to_owned(), value, raw_value: Vec::new() };
    vec![
        header("x-ratelimit-limit", format!("{limit}, {limit};w={window}")),
        header("x-ratelimit-remaining", s.limit_remaining.to_string()),
        header("x-ratelimit-reset", reset.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_collide_through_separators() {
        let a = envoy_key("d", &[("k".into(), "a|x=b".into())]);
        let b = envoy_key("d", &[("k".into(), "a".into()), ("x".into(), "b".into())]);
        assert_ne!(a, b);
        assert_eq!(b, "envoy:d|k=a|x=b");
    }

    #[test]
    fn long_keys_are_hashed_within_the_bound() {
        let entries: Vec<(String, String)> = (0..16).map(|i| (format!("k{i}"), "v".repeat(256))).collect();
        let key = envoy_key("d", &entries);
        assert!(key.len() <= tollgate_core::limits::MAX_KEY_BYTES && key.starts_with("envoy#"), "{key}");
        let mut other = entries.clone();
        other[15].1.push('!');
        assert_ne!(key, envoy_key("d", &other));
    }
}
