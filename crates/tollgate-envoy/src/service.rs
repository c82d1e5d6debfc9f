//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a [`Limiter`], answering
//! as envoyproxy/ratelimit's `src/service/ratelimit.go` answers.
//!
//! Each descriptor is charged on its own, as upstream charges it (one backend call for the
//! whole request, each check decided alone), unless [`Charging`] says otherwise: all or nothing
//! (a request refused by one enforced descriptor is charged to none), or upstream's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (the same, every limited descriptor taking part).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as ProtoValue};
use smallvec::SmallVec;
use tollgate_core::{Decision, Error as CoreError, Rule, RuleSet};
use tollgate_limiter::keyspace::envoy_key;
use tollgate_limiter::{Check, LimitError, Limiter, Mode, Policy, Reserve, Verdict};
use tonic::{Request, Response, Status};

use crate::config::{Domain, Limit, LimitKind, Node, Shared, Unit, find};
use crate::stats::{DEFAULT_STATS_MAX_KEY_PATHS, Hits, KeyPath, Stats, UpstreamCounts, names};

/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 16;
/// Longest domain, entry key or entry value, in bytes.
pub const MAX_TEXT_BYTES: usize = 256;

/// The names of the rate-limit response headers (upstream's `LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER` and `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit's header, `RateLimit-Limit` by default.
    pub limit: String,
    /// What remains, `RateLimit-Remaining` by default.
    pub remaining: String,
    /// Seconds to the reset, `RateLimit-Reset` by default.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Longest response header name accepted.
pub const MAX_HEADER_NAME_BYTES: usize = 128;

/// `name` as a response header name: an HTTP token (what Envoy and the http crate accept) of
/// at most [`MAX_HEADER_NAME_BYTES`], and none that would change how the response is framed or
/// routed (`content-length`, `transfer-encoding`, `connection` and the other hop-by-hop
/// headers, `host`), which Envoy would add to the client's response. Its case is kept.
pub fn header_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() > MAX_HEADER_NAME_BYTES {
        return Err(format!("a header name is 1 to {MAX_HEADER_NAME_BYTES} bytes"));
    }
    let parsed = axum::http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~)"))?;
    const FORBIDDEN: [&str; 9] = [
        "connection",
        "content-length",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    if FORBIDDEN.contains(&parsed.as_str()) {
        return Err(format!("{name} would change how the response is framed or routed"));
    }
    Ok(name.to_owned())
}

/// `text` as upstream's `NEAR_LIMIT_RATIO`: a number above 0, at most 1.
pub fn near_limit_ratio(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("{text:?} is not a ratio above 0 and at most 1 (such as 0.8)")),
    }
}

/// How the descriptors of one request are charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Charging {
    /// Each descriptor when its own limit admits it, whatever the others answer (upstream's
    /// default).
    #[default]
    Each,
    /// None when an enforced descriptor (not shadow or quota mode) refuses the request
    /// (Tollgate's behaviour); shadow and quota-mode descriptors are charged on their own.
    AllOrNothing,
    /// None when any limited descriptor is over its limit, shadow and quota-mode ones included:
    /// upstream's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, decided in one atomic step where
    /// upstream reads the counters, then increments them.
    StopWhenOverLimit,
}

/// The gRPC service: domains by name, swapped whole by reloads.
#[derive(Clone)]
pub struct EnvoyService {
    limiter: Limiter,
    domains: Arc<ArcSwap<BTreeMap<String, Domain>>>,
    response_headers: bool,
    header_names: Arc<HeaderNames>,
    near_limit_ratio: f32,
    dynamic_metadata: bool,
    global_shadow_mode: bool,
    global_quota_mode: bool,
    charging: Charging,
    reserve: Reserve,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for EnvoyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvoyService").field("charging", &self.charging).finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message.into())
}

impl EnvoyService {
    /// A service over `limiter` answering for `domains`.
    pub fn new(limiter: Limiter, domains: Vec<Domain>) -> Self {
        let map = domains.into_iter().map(|d| (d.name.clone(), d)).collect();
        EnvoyService {
            limiter,
            domains: Arc::new(ArcSwap::from_pointee(map)),
            response_headers: false,
            header_names: Arc::default(),
            near_limit_ratio: 0.8,
            dynamic_metadata: false,
            global_shadow_mode: false,
            global_quota_mode: false,
            charging: Charging::Each,
            reserve: Reserve::Off,
            stats: Arc::new(Stats::new(DEFAULT_STATS_MAX_KEY_PATHS)),
        }
    }

    /// At most `max` distinct label sets per family of hit counters (upstream's and
    /// Tollgate's); the hits of a new key path past the bound are counted under
    /// `key1="|overflow|"` (`descriptor="|overflow|"` for Tollgate's names).
    pub fn with_stats_max_key_paths(mut self, max: usize) -> Self {
        self.stats = Arc::new(Stats::new(max));
        self
    }

    /// With quota reservations (see [`tollgate_limiter::reserve`]) for descriptors whose
    /// rules can take them (fixed windows, token buckets, GCRA); others check every request.
    pub fn with_reserve(mut self, reserve: Reserve) -> Self {
        self.reserve = reserve;
        self
    }

    /// With `RateLimit-Limit`, `-Remaining` and `-Reset` in `response_headers_to_add`, for the
    /// descriptor closest to its limit (upstream's `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub fn with_response_headers(mut self, enabled: bool) -> Self {
        self.response_headers = enabled;
        self
    }

    /// The response headers' names (see [`header_name`] for what is accepted).
    pub fn with_header_names(mut self, names: HeaderNames) -> Self {
        self.header_names = Arc::new(names);
        self
    }

    /// Hits admitted with more than `ratio` of a limit used count as near the limit (upstream's
    /// `NEAR_LIMIT_RATIO`, 0.8 by default; see [`near_limit_ratio`]).
    pub fn with_near_limit_ratio(mut self, ratio: f32) -> Self {
        self.near_limit_ratio = ratio;
        self
    }

    /// Every request answered OK overall, as upstream's `SHADOW_MODE`: the descriptors'
    /// statuses, the headers, the metadata and the counting stay what they would be, only the
    /// overall code of a refused request becomes OK (and is counted in
    /// [`names::GLOBAL_SHADOW_MODE`]).
    pub fn with_global_shadow_mode(mut self, enabled: bool) -> Self {
        self.global_shadow_mode = enabled;
        self
    }

    /// Every descriptor in quota mode, as upstream's `QUOTA_MODE`: a descriptor over its limit
    /// answers OVER_LIMIT in its status, and the request is refused only when every descriptor
    /// of it is over its limit (an unmatched one is never over: it keeps the request OK; an
    /// unlimited one takes no part), a request's own limit included.
    pub fn with_global_quota_mode(mut self, enabled: bool) -> Self {
        self.global_quota_mode = enabled;
        self
    }

    /// With the request and the `metadata` of the descriptors that admitted it in the
    /// response's `dynamic_metadata` (upstream's `RESPONSE_DYNAMIC_METADATA`).
    pub fn with_dynamic_metadata(mut self, enabled: bool) -> Self {
        self.dynamic_metadata = enabled;
        self
    }

    /// How a request's descriptors are charged (by default each on its own, as upstream).
    pub fn with_charging(mut self, charging: Charging) -> Self {
        self.charging = charging;
        self
    }

    /// Whether `p` is charged only if the others are (see [`Charging`]).
    fn joins(&self, p: &Planned<'_>) -> bool {
        match self.charging {
            Charging::Each => false,
            Charging::AllOrNothing => p.enforced(),
            Charging::StopWhenOverLimit => true,
        }
    }

    /// Whether any domain is loaded.
    pub fn has_domains(&self) -> bool {
        !self.domains.load().is_empty()
    }

    /// The loaded domains as upstream's `/rlconfig` prints them, in name order.
    pub fn dump(&self) -> String {
        self.domains.load().values().map(Domain::dump).collect()
    }

    pub(crate) fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Replaces the domains (a reload).
    pub fn replace_domains(&self, domains: Vec<Domain>) {
        self.domains.store(Arc::new(domains.into_iter().map(|d| (d.name.clone(), d)).collect()));
    }
}

/// A list with an item per descriptor of a request: inline for the usual one descriptor (and
/// the heap past it), as a decision would otherwise make several allocations for one.
type PerDescriptor<T> = SmallVec<[T; 1]>;

/// A descriptor's entries, key and value, borrowed from the request (inline for one or two).
type Entries<'a> = SmallVec<[(&'a str, &'a str); 2]>;

/// One descriptor of the request, with what applies to it.
struct Planned<'a> {
    /// The request's entries, borrowed from it.
    entries: Entries<'a>,
    /// The limits that apply (none: not limited); the request's own override is owned.
    limits: SmallVec<[Cow<'a, Limit>; 1]>,
    unlimited: bool,
    shadow: bool,
    quota: bool,
    detailed: bool,
    /// Upstream's stat key path below the domain (see [`crate::config::Match::stat_path`]).
    stat_path: String,
    hits: u64,
    /// Per entry, the wildcard its value is counted under (`share_threshold`).
    shared: Shared<'a>,
    /// The matched node's `metadata` (none for a request's own limit, as upstream).
    metadata: Option<&'a Struct>,
    /// The matched node while `limits` are all its own: its policy checks them (made once);
    /// otherwise the check makes one.
    whole_node: Option<&'a Node>,
}

impl Planned<'_> {
    /// Whether its refusal refuses the request on its own.
    fn enforced(&self) -> bool {
        !self.shadow && !self.quota
    }

    /// Its key path in `domain`, as its hits are labelled.
    fn key_path<'p>(&'p self, domain: &'p str) -> KeyPath<'p> {
        KeyPath { domain, entries: &self.entries, detailed: self.detailed, stat_path: &self.stat_path }
    }
}

fn check_request(req: &RateLimitRequest) -> Result<(), Status> {
    if req.domain.is_empty() || req.domain.len() > MAX_TEXT_BYTES {
        return Err(invalid(format!("domain must be 1 to {MAX_TEXT_BYTES} bytes")));
    }
    // Upstream refuses an empty list too ("rate limit descriptor list must not be empty").
    if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(format!("1 to {MAX_DESCRIPTORS} descriptors per request")));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(format!("descriptors[{i}]: at most {MAX_ENTRIES} entries")));
        }
        if d.entries
            .iter()
            .any(|e| e.key.is_empty() || e.key.len() > MAX_TEXT_BYTES || e.value.len() > MAX_TEXT_BYTES)
        {
            return Err(invalid(format!(
                "descriptors[{i}]: entry keys are 1 to {MAX_TEXT_BYTES} bytes, values at most"
            )));
        }
        if let Some(o) = &d.limit
            && Unit::from_proto(o.unit).is_none()
        {
            return Err(invalid(format!("descriptors[{i}].limit.unit is unknown")));
        }
    }
    Ok(())
}

fn plan_one<'a>(d: &'a RateLimitDescriptor, domain: Option<&'a Domain>, request_hits: u64) -> Planned<'a> {
    let entries: Entries<'a> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
    let hits = d.hits_addend.as_ref().map_or(request_hits, |h| h.value);
    let mut planned = Planned {
        limits: SmallVec::new(),
        unlimited: false,
        shadow: false,
        quota: false,
        detailed: false,
        stat_path: String::new(),
        hits,
        shared: smallvec::smallvec![None; entries.len()],
        entries,
        metadata: None,
        whole_node: None,
    };
    // An unknown domain limits nothing, the request's own limit included (upstream's rule).
    let Some(domain) = domain else { return planned };
    // In a known domain the request's limit applies, to any descriptor, matched or not.
    if let Some(o) = &d.limit
        && let Some(unit) = Unit::from_proto(o.unit)
    {
        let window_secs = unit.seconds();
        let kind = match (o.requests_per_unit, tollgate_core::Period::from_secs(window_secs)) {
            (0, _) | (_, Err(_)) => LimitKind::Block,
            (n, Ok(period)) => LimitKind::Rule(Rule::fixed_window(u64::from(n), period)),
        };
        planned.limits.push(Cow::Owned(Limit {
            name: None,
            kind,
            requests_per_unit: o.requests_per_unit,
            unit: Some(unit),
            window_secs,
            replaces: Vec::new(),
        }));
        // Upstream's stat key for a request's own limit: every entry's key_value.
        planned.stat_path = joined_path(planned.entries.iter().copied());
        return planned;
    }
    if let Some(m) = find(&domain.root, &planned.entries) {
        planned.limits = m.node.limits.iter().map(Cow::Borrowed).collect();
        planned.unlimited = m.node.limits.iter().any(|l| l.kind == LimitKind::Unlimited);
        planned.shadow = m.node.shadow_mode;
        planned.quota = m.node.quota_mode;
        planned.detailed = m.node.detailed_metric;
        planned.stat_path = match m.node.detailed_metric {
            // detailed_metric: the request's values, a shared threshold's pattern for its own.
            // detailed_metric: every entry's key_value ("key_" too, as upstream writes it).
            true if m.shared.iter().all(Option::is_none) => {
                planned.entries.iter().map(|(k, v)| format!("{k}_{v}")).collect::<Vec<_>>().join(".")
            }
            // With a shared threshold, its pattern for its own entries.
            true => {
                joined_path(planned.entries.iter().zip(&m.shared).map(|(&(k, v), s)| (k, s.unwrap_or(v))))
            }
            false => m.stat_path,
        };
        planned.shared = m.shared;
        planned.metadata = m.node.metadata.as_ref();
        planned.whole_node = Some(m.node);
    }
    planned
}

/// `key_value` (or `key` when the value is empty) per entry, joined by `.`.
fn joined_path<'e>(entries: impl Iterator<Item = (&'e str, &'e str)>) -> String {
    let parts: Vec<String> =
        entries.map(|(k, v)| if v.is_empty() { k.to_owned() } else { format!("{k}_{v}") }).collect();
    parts.join(".")
}

/// `replaces`: a named limit is dropped when a limit matched by this request replaces it (an
/// unlimited one included, as upstream collects them before setting unlimited ones aside).
fn drop_replaced(planned: &mut [Planned<'_>]) {
    let replaced: HashSet<String> =
        planned.iter().flat_map(|p| p.limits.iter().flat_map(|l| l.replaces.iter().cloned())).collect();
    if replaced.is_empty() {
        return;
    }
    for p in planned.iter_mut().filter(|p| !p.unlimited) {
        let before = p.limits.len();
        p.limits.retain(|l| l.name.as_ref().is_none_or(|n| !replaced.contains(n)));
        if p.limits.len() < before {
            // The node's policy holds a limit dropped: the check makes its own.
            p.whole_node = None;
        }
    }
}

/// Seconds until the clock-aligned window of `unit` ends, as upstream computes a reset.
fn aligned_reset(unit: Option<Unit>) -> Duration {
    let Some(unit) = unit else { return Duration::ZERO };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    Duration::from_secs(unit.seconds() - now % unit.seconds())
}

fn status(code: Code, limit: Option<&Limit>, remaining: u64, reset: Duration) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|l| RateLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.map_or(0, Unit::proto),
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

/// What a descriptor gets, before the backend is asked.
enum Outcome {
    /// No limit applies: OK, not counted.
    Free,
    /// `unlimited`: OK, remaining u32::MAX, not counted.
    Unlimited,
    /// A limit of 0 (a block list, or a request's limit of 0): over the limit, not counted.
    Blocked(usize),
    /// Checked: its item in the batch.
    Checked(usize),
}

/// A request's descriptors sorted before the backend is asked (see [`EnvoyService::sort`]).
struct Sorted<'p, 'a> {
    /// Per descriptor.
    outcomes: PerDescriptor<Outcome>,
    /// The checks the backend decides, indexed by [`Outcome::Checked`].
    items: PerDescriptor<Item<'p, 'a>>,
    /// A descriptor charged with the others is refused up front (a block list).
    blocked: bool,
}

/// Each descriptor of `req` with the limits of `domain` that apply to it (less those another
/// matched limit replaces).
fn plan<'a>(req: &'a RateLimitRequest, domain: Option<&'a Domain>) -> PerDescriptor<Planned<'a>> {
    // hits_addend 0 means "not set": one hit, as upstream.
    let request_hits = if req.hits_addend == 0 { 1 } else { u64::from(req.hits_addend) };
    let mut planned: PerDescriptor<Planned<'a>> =
        req.descriptors.iter().map(|d| plan_one(d, domain, request_hits)).collect();
    drop_replaced(&mut planned);
    planned
}

/// One descriptor's status; counts its hits in the metrics when it was limited.
fn answer(
    domain: &str,
    p: &Planned<'_>,
    outcome: &Outcome,
    items: &[Item<'_, '_>],
    verdicts: &[Verdict],
    ratio: f32,
    stats: &Stats,
) -> DescriptorStatus {
    match outcome {
        Outcome::Free => status(Code::Ok, None, 0, Duration::ZERO),
        Outcome::Unlimited => status(Code::Ok, None, u64::from(u32::MAX), Duration::ZERO),
        Outcome::Blocked(at) => {
            let limit = p.limits[*at].as_ref();
            let hits = Hits { hits: p.hits, shadow: p.shadow, over: true, near: false };
            // A limit of 0: every hit over it, whatever the counter held.
            stats.count(p.key_path(domain), hits, &UpstreamCounts::new(0, 0, p.hits, ratio, p.shadow));
            let code = if p.shadow { Code::Ok } else { Code::OverLimit };
            status(code, Some(limit), 0, aligned_reset(limit.unit))
        }
        Outcome::Checked(at) => descriptor_status(domain, &items[*at], &verdicts[*at], ratio, stats),
    }
}

/// One checked descriptor: its check in the request's batch.
struct Item<'p, 'a> {
    planned: &'p Planned<'a>,
    key: String,
    policy: Policy,
    /// The limits with a rule, in the order of the rule set's rules.
    limited: SmallVec<[&'p Limit; 2]>,
    /// More hits than the limits can ever admit: over the limit whatever the state.
    impossible: bool,
    /// Charged only if the request's other enforced checks are admitted (all or nothing).
    together: bool,
    /// Whether its hits were spent (set by [`EnvoyService::check`]).
    charged: bool,
}

impl<'p, 'a> Item<'p, 'a> {
    /// The check of `p`, whose limits hold at least one rule and no block; `mode` places it in
    /// the limiter's batch (shadow: decided alone).
    fn new(domain: &str, p: &'p Planned<'a>, mode: Mode, reserve: Reserve) -> Result<Self, Status> {
        let limited: SmallVec<[&Limit; 2]> =
            p.limits.iter().map(AsRef::as_ref).filter(|l| matches!(l.kind, LimitKind::Rule(_))).collect();
        let policy = match p.whole_node.and_then(|node| node.policy(domain)) {
            Some(policy) => policy.clone(),
            None => {
                let rules = limited.iter().filter_map(|l| match &l.kind {
                    LimitKind::Rule(r) => Some(r.clone()),
                    _ => None,
                });
                Policy::enforce(domain, RuleSet::new(rules).map_err(|e| Status::internal(e.to_string()))?)
            }
        };
        // Values sharing a threshold are counted under their wildcard.
        let key = if p.shared.iter().any(Option::is_some) {
            let entries: Entries<'_> =
                p.entries.iter().zip(&p.shared).map(|(&(k, v), s)| (k, s.unwrap_or(v))).collect();
            envoy_key(domain, &entries)
        } else {
            envoy_key(domain, &p.entries)
        };
        Ok(Item {
            planned: p,
            key,
            policy: {
                let policy = policy.with_mode(mode);
                // Rules that cannot take reservations (sliding windows) check every request.
                if reserve.is_on() { policy.clone().with_reserve(reserve).unwrap_or(policy) } else { policy }
            },
            limited,
            impossible: false,
            together: mode == Mode::Enforce,
            charged: false,
        })
    }
}

impl EnvoyService {
    /// Decides one `ShouldRateLimit` request (the gRPC method, and `POST /json`): plans each
    /// descriptor, sorts out those answered without the backend, checks the rest in one limiter
    /// call, and answers.
    pub async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        check_request(&req)?;
        let domains = self.domains.load_full();
        let mut planned = plan(&req, domains.get(&req.domain));
        if self.global_quota_mode {
            for p in &mut planned {
                p.quota = true;
            }
        }
        let Sorted { outcomes, mut items, blocked } = self.sort(&req.domain, &planned)?;
        let verdicts = self.check(&mut items, blocked).await?;
        let statuses = planned
            .iter()
            .zip(&outcomes)
            .map(|(p, outcome)| {
                answer(&req.domain, p, outcome, &items, &verdicts, self.near_limit_ratio, &self.stats)
            })
            .collect();
        Ok(self.response(&req, &planned, &outcomes, statuses))
    }

    /// Each descriptor's [`Outcome`], and the checks of those the backend decides. `blocked`:
    /// a descriptor charged with the others is refused before any check.
    fn sort<'p, 'a>(&self, domain: &str, planned: &'p [Planned<'a>]) -> Result<Sorted<'p, 'a>, Status> {
        let mut sorted = Sorted {
            outcomes: SmallVec::with_capacity(planned.len()),
            items: SmallVec::new(),
            blocked: false,
        };
        for p in planned {
            let outcome = if p.unlimited {
                Outcome::Unlimited
            } else if let Some(at) = p.limits.iter().position(|l| l.kind == LimitKind::Block) {
                sorted.blocked |= self.joins(p);
                Outcome::Blocked(at)
            } else if p.limits.is_empty() {
                Outcome::Free
            } else {
                // check_all decides enforced checks together and shadow-mode ones alone.
                let alone = !self.joins(p) && (p.shadow || self.charging != Charging::Each);
                let mode = if alone { Mode::Shadow } else { Mode::Enforce };
                sorted.items.push(Item::new(domain, p, mode, self.reserve)?);
                Outcome::Checked(sorted.items.len() - 1)
            };
            sorted.outcomes.push(outcome);
        }
        Ok(sorted)
    }

    /// The response to the descriptors' `statuses`: over the limit when an enforced descriptor
    /// is, or when every quota-mode one is (upstream's rule); with the headers, when asked for.
    fn response(
        &self,
        req: &RateLimitRequest,
        planned: &[Planned<'_>],
        outcomes: &[Outcome],
        statuses: Vec<DescriptorStatus>,
    ) -> RateLimitResponse {
        // Whether each status refuses the request on its own, for the response headers.
        let mut refusing: PerDescriptor<bool> = SmallVec::with_capacity(statuses.len());
        let (mut failed, mut quota_total, mut quota_failed) = (0, 0, 0);
        for ((p, outcome), status) in planned.iter().zip(outcomes).zip(&statuses) {
            let over = status.code == Code::OverLimit as i32;
            // Upstream counts a descriptor without a limit as quota mode only globally.
            let free = matches!(outcome, Outcome::Free) && !self.global_quota_mode;
            if p.quota && !free && !matches!(outcome, Outcome::Unlimited) {
                quota_total += 1;
                quota_failed += usize::from(over);
                refusing.push(false);
            } else {
                failed += usize::from(over);
                refusing.push(over);
            }
        }
        let over = failed > 0 || (quota_total > 0 && quota_total == quota_failed);
        if over && self.global_shadow_mode {
            ::metrics::counter!(names::GLOBAL_SHADOW_MODE).increment(1);
        }
        let overall = if over && !self.global_shadow_mode { Code::OverLimit } else { Code::Ok };
        let headers = match self.response_headers {
            true => response_headers(&self.header_names, &statuses, &refusing),
            false => Vec::new(),
        };
        let metadata = self.dynamic_metadata.then(|| dynamic_metadata(req, planned, outcomes, &statuses));
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers,
            dynamic_metadata: metadata,
            ..Default::default()
        }
    }

    /// Checks the items in one limiter call: each alone, or all or nothing.
    ///
    /// An item asking more hits than its limits hold is over the limit whatever the state: the
    /// limiter refuses it before any backend call, so it is marked and the batch asked again
    /// with it only peeking. All or nothing, a refusal known up front (`blocked`: a block list,
    /// or such an item, among the descriptors charged together) leaves the others only peeking
    /// too.
    async fn check(&self, items: &mut [Item<'_, '_>], mut blocked: bool) -> Result<Vec<Verdict>, Status> {
        while !items.is_empty() {
            let checks: PerDescriptor<Check<'_>> = items
                .iter()
                .map(|i| {
                    let peek = i.impossible || (blocked && self.joins(i.planned));
                    Check { key: &i.key, policy: &i.policy, cost: if peek { 0 } else { i.planned.hits } }
                })
                .collect();
            let peeks: PerDescriptor<bool> = checks.iter().map(|c| c.cost == 0).collect();
            let answer = match self.charging {
                Charging::Each => self.limiter.check_each(&checks).await.map(|v| (true, v)),
                _ => self.limiter.check_all(&checks).await.map(|joint| (joint.admitted, joint.verdicts)),
            };
            // A `SmallVec` borrows what it holds until dropped: let go of the items here.
            drop(checks);
            match answer {
                Ok((admitted, verdicts)) => {
                    for ((item, verdict), peek) in items.iter_mut().zip(&verdicts).zip(peeks) {
                        let together = item.together && self.charging != Charging::Each;
                        item.charged = !peek && verdict.decision.allowed() && (admitted || !together);
                    }
                    return Ok(verdicts);
                }
                Err(LimitError::Invalid(CoreError::InPart { part, error }))
                    if matches!(*error, CoreError::CostExceedsCapacity { .. }) =>
                {
                    blocked |= self.joins(items[part].planned);
                    items[part].impossible = true;
                }
                Err(LimitError::Invalid(e)) => return Err(invalid(e.to_string())),
                Err(LimitError::Unavailable(e)) => return Err(Status::unavailable(e.to_string())),
                Err(e) => return Err(Status::internal(e.to_string())),
            }
        }
        Ok(Vec::new())
    }
}

/// A checked descriptor's status; counts its hits in the metrics. Over the limit, nothing
/// remains (upstream's answer), shadow mode or not.
fn descriptor_status(
    domain: &str,
    item: &Item<'_, '_>,
    verdict: &Verdict,
    ratio: f32,
    stats: &Stats,
) -> DescriptorStatus {
    let d = &verdict.decision;
    let p = item.planned;
    let over = item.impossible || !d.allowed();
    let rules = &item.policy.rules;
    let hits = Hits { hits: p.hits, shadow: p.shadow, over, near: near(d, rules, ratio) };
    // Upstream's counts from the binding rule's counter before these hits.
    let o = d.binding(rules);
    let used = o.limit().saturating_sub(o.remaining());
    let before = if item.charged { used.saturating_sub(p.hits) } else { used };
    stats.count(p.key_path(domain), hits, &UpstreamCounts::new(o.limit(), before, p.hits, ratio, p.shadow));
    let code = if over && !p.shadow { Code::OverLimit } else { Code::Ok };
    let limit = item.limited.get(d.binding_index()).copied();
    let remaining = if over { 0 } else { d.remaining() };
    status(code, limit, remaining, d.reset_after())
}

/// Upstream's near-limit test: more used than `floor(limit x ratio)`, computed in 32-bit floats
/// as upstream computes it (`float32(limit) * NEAR_LIMIT_RATIO`).
fn near(d: &Decision, rules: &RuleSet, ratio: f32) -> bool {
    d.outcomes(rules).any(|o| {
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold = (o.limit() as f32 * ratio).floor() as u64;
        o.limit().saturating_sub(o.remaining()) > threshold
    })
}

fn text(s: impl Into<String>) -> ProtoValue {
    ProtoValue { kind: Some(Kind::StringValue(s.into())) }
}

fn number(n: u64) -> ProtoValue {
    // structpb's numbers are doubles, as upstream sends them.
    #[allow(clippy::cast_precision_loss)]
    ProtoValue { kind: Some(Kind::NumberValue(n as f64)) }
}

fn list(values: Vec<ProtoValue>) -> ProtoValue {
    ProtoValue { kind: Some(Kind::ListValue(ListValue { values })) }
}

/// Most bytes of descriptors' `metadata` merged into one answer (their encoded sizes added):
/// past it, the metadata of the descriptors after is left out (upstream has no bound).
pub const MAX_MERGED_METADATA_BYTES: usize = 256 * 1024;

/// Upstream's `RESPONSE_DYNAMIC_METADATA` (`ratelimitToMetadata`): the request's `domain`, its
/// `descriptors` (each one's `entries` as `key=value`, its `limit` in protobuf's text format,
/// its `hitsAddend`), the request's `hitsAddend` when set, and `metadata`: the merged
/// `metadata` of each descriptor that a configured limit admitted (not an unlimited one, a
/// request's own limit, nor one over its limit; a shadow-mode one over its limit admits).
fn dynamic_metadata(
    req: &RateLimitRequest,
    planned: &[Planned<'_>],
    outcomes: &[Outcome],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_owned(), text(&req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut each = std::collections::HashMap::new();
            let entries = d.entries.iter().map(|e| text(format!("{}={}", e.key, e.value))).collect();
            each.insert("entries".to_owned(), list(entries));
            if let Some(limit) = &d.limit {
                each.insert("limit".to_owned(), text(override_text(limit.requests_per_unit, limit.unit)));
            }
            if let Some(hits) = &d.hits_addend {
                each.insert("hitsAddend".to_owned(), number(hits.value));
            }
            ProtoValue { kind: Some(Kind::StructValue(Struct { fields: each })) }
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(u64::from(req.hits_addend)));
    }
    let mut merged = Struct::default();
    let mut merged_bytes = 0;
    for ((p, outcome), status) in planned.iter().zip(outcomes).zip(statuses) {
        let admitted = matches!(outcome, Outcome::Checked(_) | Outcome::Blocked(_))
            && status.code != Code::OverLimit as i32;
        if let Some(metadata) = p.metadata.filter(|_| admitted) {
            // A request naming many descriptors with large metadata (or one such descriptor
            // many times) must not make its answer, and the work of merging, grow past this.
            let bytes = prost::Message::encoded_len(metadata);
            if merged_bytes + bytes > MAX_MERGED_METADATA_BYTES {
                tracing::debug!(domain = %req.domain, "dynamic metadata over its bound: the rest left out");
                break;
            }
            merged_bytes += bytes;
            merge(&mut merged, metadata);
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), ProtoValue { kind: Some(Kind::StructValue(merged)) });
    }
    Struct { fields }
}

/// A `RateLimitOverride` as Go's protobuf `String()` writes it (its text format: fields at
/// their default left out, the unit by name).
fn override_text(requests_per_unit: u32, unit: i32) -> String {
    let mut parts = Vec::new();
    if requests_per_unit != 0 {
        parts.push(format!("requests_per_unit:{requests_per_unit}"));
    }
    if unit != 0 {
        match Unit::from_proto(unit) {
            Some(u) => parts.push(format!("unit:{}", u.name().to_ascii_uppercase())),
            None => parts.push(format!("unit:{unit}")),
        }
    }
    parts.join(" ")
}

/// Upstream's `mergeMetadata`: keys of `from` missing in `into` are added; maps under one key
/// in both are merged; otherwise the first descriptor's value stays.
fn merge(into: &mut Struct, from: &Struct) {
    for (key, value) in &from.fields {
        match into.fields.get_mut(key) {
            None => {
                into.fields.insert(key.clone(), value.clone());
            }
            Some(ProtoValue { kind: Some(Kind::StructValue(mine)) }) => {
                if let Some(Kind::StructValue(theirs)) = &value.kind {
                    merge(mine, theirs);
                }
            }
            Some(_) => {}
        }
    }
}

/// Upstream's `LIMIT_RESPONSE_HEADERS_ENABLED` headers, `RateLimit-Limit` (the limit),
/// `RateLimit-Remaining` and `RateLimit-Reset` (seconds, rounded up), for the descriptor
/// closest to its limit: the last one refusing the request, else the limited one with the
/// fewest remaining (the first of equals).
fn response_headers(
    names: &HeaderNames,
    statuses: &[DescriptorStatus],
    refusing: &[bool],
) -> Vec<HeaderValue> {
    let limited = || statuses.iter().zip(refusing).filter(|(s, _)| s.current_limit.is_some());
    let chosen = match limited().rfind(|(_, refuses)| **refuses) {
        Some((s, _)) => s,
        None => match limited().min_by_key(|(s, _)| s.limit_remaining) {
            Some((s, _)) => s,
            None => return Vec::new(),
        },
    };
    let limit = chosen.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    let reset = chosen.duration_until_reset.as_ref().map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    let header = |key: &str, value: String| HeaderValue { key: key.to_owned(), value, raw_value: Vec::new() };
    vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, chosen.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_collide_through_separators() {
        let a = envoy_key("d", &[("k", "a|x=b")]);
        let b = envoy_key("d", &[("k", "a"), ("x", "b")]);
        assert_ne!(a, b);
        assert_eq!(b, "envoy:d|k=a|x=b");
    }

    #[test]
    fn long_keys_are_hashed_within_the_bound() {
        let owned: Vec<(String, String)> = (0..16).map(|i| (format!("k{i}"), "v".repeat(256))).collect();
        let mut entries: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let key = envoy_key("d", &entries);
        assert!(key.len() <= tollgate_core::limits::MAX_KEY_BYTES && key.starts_with("envoy#"), "{key}");
        let longer = format!("{}!", entries[15].1);
        entries[15].1 = &longer;
        assert_ne!(key, envoy_key("d", &entries));
    }

    #[test]
    fn header_names_are_tokens_that_leave_the_framing_alone() {
        assert_eq!(header_name("X-RateLimit-Limit").unwrap(), "X-RateLimit-Limit", "case is kept");
        for bad in ["", "with space", "colon:", "new\nline", "Content-Length", "transfer-encoding", "é"] {
            assert!(header_name(bad).is_err(), "{bad:?}");
        }
        assert!(header_name(&"x".repeat(MAX_HEADER_NAME_BYTES)).is_ok());
        assert!(header_name(&"x".repeat(MAX_HEADER_NAME_BYTES + 1)).is_err());
    }

    #[test]
    fn the_near_limit_ratio_is_above_zero_and_at_most_one() {
        assert_eq!(near_limit_ratio("0.8"), Ok(0.8));
        assert_eq!(near_limit_ratio("1"), Ok(1.0));
        for bad in ["0", "-0.5", "1.01", "NaN", "inf", "", "eighty"] {
            assert!(near_limit_ratio(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn merged_metadata_is_bounded() {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}}}\n    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n  - key: j\n    metadata: {{b: 1}}\n    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n",
            "x".repeat(60_000)
        );
        let domain = Domain::from_yaml(&yaml, "m.yaml").unwrap();
        let descriptor = |key: &str| RateLimitDescriptor {
            entries: vec![Entry { key: key.into(), value: "v".into() }],
            ..Default::default()
        };
        // The big one five times (only four fit), then the small one: left out too.
        let mut descriptors = vec![descriptor("k"); 5];
        descriptors.push(descriptor("j"));
        let req = RateLimitRequest { domain: "d".into(), descriptors, hits_addend: 0 };
        let planned = plan(&req, Some(&domain));
        let outcomes: Vec<Outcome> = (0..planned.len()).map(Outcome::Checked).collect();
        let statuses = vec![status(Code::Ok, None, 0, Duration::ZERO); planned.len()];
        let m = dynamic_metadata(&req, &planned, &outcomes, &statuses);
        let Some(Kind::StructValue(merged)) = &m.fields["metadata"].kind else { panic!("metadata") };
        assert!(
            merged.fields.contains_key("a") && !merged.fields.contains_key("b"),
            "{:?}",
            merged.fields.keys()
        );
        // Without the big ones, the small one is sent.
        let small =
            RateLimitRequest { domain: "d".into(), descriptors: vec![descriptor("j")], hits_addend: 0 };
        let planned = plan(&small, Some(&domain));
        let m = dynamic_metadata(&small, &planned, &[Outcome::Checked(0)], &statuses[..1]);
        let Some(Kind::StructValue(merged)) = &m.fields["metadata"].kind else { panic!("metadata") };
        assert!(merged.fields.contains_key("b"));
    }

    #[test]
    fn a_reset_ends_the_units_clock_aligned_window() {
        let reset = aligned_reset(Some(Unit::Minute));
        assert!(reset > Duration::ZERO && reset <= Duration::from_secs(60), "{reset:?}");
        assert_eq!(aligned_reset(None), Duration::ZERO);
    }
}
