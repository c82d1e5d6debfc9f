//! What every decision route answers with: the decision body and its rate-limit headers, the
//! problems of a failed decision, and the names of the pseudo-policies the server reports
//! under. A leaf: it knows no handler and no state.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use smallvec::SmallVec;
use tollgate_config::ServerSettings;
use tollgate_core::Error as CoreError;
use tollgate_http::FixedHeaders;
use tollgate_http::Problem;
use tollgate_http::headers::{ceil_millis, content_length, rate_limit_headers, rule_name};
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
pub struct RuleBody<'a> {
    /// The rule's name, or its algorithm and position (`fixed_window.0`).
    #[schema(value_type = String)]
    pub name: Cow<'a, str>,
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
// Borrows the policy's names: an answer is written and dropped within its request.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionBody<'a> {
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
    pub policy: &'a str,
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
    /// Every rule's outcome, in the policy's order. Inline up to two rules: the list lives as
    /// long as its answer is written, and a heap allocation for it cost a check about 200
    /// instructions.
    #[schema(value_type = Vec<RuleBody>)]
    pub rules: SmallVec<[RuleBody<'a>; 2]>,
}

impl<'a> DecisionBody<'a> {
    pub(crate) fn new(policy: &'a Policy, verdict: &Verdict, lease_id: Option<String>) -> Self {
        let d = &verdict.decision;
        let rules = policy
            .rules
            .rules()
            .zip(d.outcomes(&policy.rules))
            .enumerate()
            .map(|(index, (rule, o))| RuleBody {
                name: rule_name(rule, index),
                algorithm: o.algorithm().as_str(),
                allowed: o.allowed(),
                limit: o.limit(),
                remaining: o.remaining(),
                reset_after_ms: ceil_millis(o.reset_after()),
                retry_after_ms: ceil_millis(o.retry_after()),
            })
            .collect();
        DecisionBody {
            allowed: verdict.allowed(),
            limit: d.binding(&policy.rules).limit(),
            remaining: d.remaining(),
            reset_after_ms: ceil_millis(d.reset_after()),
            retry_after_ms: ceil_millis(d.retry_after()),
            degraded: verdict.degraded,
            policy: &policy.name,
            shadow_denied: verdict.shadow_denied,
            delayed_ms: (!verdict.waited.is_zero()).then(|| ceil_millis(verdict.waited)),
            lease_id,
            message: None,
            rules,
        }
    }
}

impl DecisionBody<'_> {
    /// The body as JSON, byte for byte what `serde_json` writes of it (a test holds the two
    /// alike), written straight into one buffer sized up front. The generic serializer spent
    /// more on this one small body than the limiter spent on the decision: every key went
    /// through its escaping scan and the buffer grew twice.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let strings = self.policy.len()
            + self.lease_id.as_ref().map_or(0, String::len)
            + self.message.as_ref().map_or(0, String::len)
            + self.rules.iter().map(|r| r.name.len()).sum::<usize>();
        // Keys and numbers at their widest, and each string's quotes (escapes may grow it).
        let mut out = JsonOut(Vec::with_capacity(256 + 192 * self.rules.len() + strings));
        out.raw("{\"allowed\":");
        out.bool(self.allowed);
        out.figures([self.limit, self.remaining, self.reset_after_ms, self.retry_after_ms]);
        out.raw(",\"degraded\":");
        out.bool(self.degraded);
        out.raw(",\"policy\":");
        out.str(self.policy);
        if self.shadow_denied {
            out.raw(",\"shadow_denied\":true");
        }
        if let Some(ms) = self.delayed_ms {
            out.raw(",\"delayed_ms\":");
            out.u64(ms);
        }
        if let Some(id) = &self.lease_id {
            out.raw(",\"lease_id\":");
            out.str(id);
        }
        if let Some(message) = &self.message {
            out.raw(",\"message\":");
            out.str(message);
        }
        out.raw(",\"rules\":[");
        for (index, rule) in self.rules.iter().enumerate() {
            out.raw(if index == 0 { "{\"name\":" } else { ",{\"name\":" });
            out.str(&rule.name);
            out.raw(",\"algorithm\":");
            out.str(rule.algorithm);
            out.raw(",\"allowed\":");
            out.bool(rule.allowed);
            out.figures([rule.limit, rule.remaining, rule.reset_after_ms, rule.retry_after_ms]);
            out.raw("}");
        }
        out.raw("]}");
        out.0
    }
}

/// The few JSON pieces a decision body is made of.
struct JsonOut(Vec<u8>);

impl JsonOut {
    /// Literal JSON text (keys and punctuation: nothing in them needs escaping).
    fn raw(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }

    fn bool(&mut self, value: bool) {
        self.raw(if value { "true" } else { "false" });
    }

    fn u64(&mut self, value: u64) {
        self.raw(itoa::Buffer::new().format(value));
    }

    /// The four figures a decision and each of its rules report, in the order both declare them.
    fn figures(&mut self, [limit, remaining, reset_after_ms, retry_after_ms]: [u64; 4]) {
        let keyed = [
            (",\"limit\":", limit),
            (",\"remaining\":", remaining),
            (",\"reset_after_ms\":", reset_after_ms),
            (",\"retry_after_ms\":", retry_after_ms),
        ];
        for (key, value) in keyed {
            self.raw(key);
            self.u64(value);
        }
    }

    /// A string, quoted; escaped by `serde_json` itself when it holds anything to escape.
    fn str(&mut self, value: &str) {
        if value.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            self.0.push(b'"');
            self.raw(value);
            self.0.push(b'"');
        } else {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut self.0, value);
        }
    }
}

/// 200 or 429 with `body` and the rate-limit headers of `verdict`, as the `[server]` section
/// says (`reset_header`, `headers`); `fixed` holds the policy's unchanging header values when
/// they are kept (a named policy's, see [`KeptHeaders`]).
pub(crate) fn respond(
    server: &ServerSettings,
    policy: &Policy,
    verdict: &Verdict,
    body: DecisionBody<'_>,
    fixed: Option<&FixedHeaders>,
) -> Response {
    let status = if verdict.allowed() { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    let json = body.to_json();
    // Ours, so that axum does not format one into a new allocation for each answer.
    let length = content_length(json.len());
    let mut response = Response::new(Body::from(json));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    // Room for every header at once, Content-Length after them included: the map's
    // first allocation holds six, and growing it past that later rehashes it.
    headers.reserve(8);
    // First, as it always was: clients and the README's recipes see the same header order.
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    rate_limit_headers(
        headers,
        &policy.rules,
        &verdict.decision,
        server.reset_header,
        server.headers,
        !verdict.allowed(),
        fixed,
    );
    headers.insert(header::CONTENT_LENGTH, length);
    response
}

/// Named policies kept at most; past it the record starts over (a policy database that keeps
/// renaming policies cannot grow it).
const MAX_KEPT_HEADERS: usize = 1024;

/// The rate-limit header values that stay the same from one decision of a named policy to the
/// next (`RateLimit-Policy`, each rule's limit), formatted once per policy rather than on every
/// answer. Keyed by name and checked against the policy itself, so a reloaded policy of the
/// same name gets its own: the record holds a [`Weak`] of the policy it was made for, which keeps
/// that allocation's address from being reused while the entry exists.
#[derive(Default)]
pub(crate) struct KeptHeaders(ArcSwap<HashMap<Arc<str>, Kept, foldhash::fast::RandomState>>);

#[derive(Clone)]
struct Kept {
    policy: Weak<Policy>,
    headers: Arc<FixedHeaders>,
}

impl KeptHeaders {
    /// The fixed header values of `policy`, formatted now if this version of it has none yet.
    pub(crate) fn of(&self, policy: &Arc<Policy>) -> Arc<FixedHeaders> {
        if let Some(kept) = self.0.load().get(&policy.name)
            && std::ptr::eq(kept.policy.as_ptr(), Arc::as_ptr(policy))
        {
            return Arc::clone(&kept.headers);
        }
        let headers = Arc::new(FixedHeaders::new(&policy.rules));
        let kept = Kept { policy: Arc::downgrade(policy), headers: Arc::clone(&headers) };
        self.0.rcu(|map| {
            let mut map =
                if map.len() >= MAX_KEPT_HEADERS { HashMap::default() } else { HashMap::clone(map) };
            map.insert(Arc::clone(&policy.name), kept.clone());
            map
        });
        headers
    }
}

impl std::fmt::Debug for KeptHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptHeaders").field("policies", &self.0.load().len()).finish()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule_body() -> impl Strategy<Value = RuleBody<'static>> {
        let algorithms = prop::sample::select(vec!["fixed_window", "gcra", "concurrency"]);
        (".{0,12}", algorithms, any::<bool>(), any::<[u64; 4]>()).prop_map(
            |(name, algorithm, allowed, [limit, remaining, reset_after_ms, retry_after_ms])| RuleBody {
                name: name.into(),
                algorithm,
                allowed,
                limit,
                remaining,
                reset_after_ms,
                retry_after_ms,
            },
        )
    }

    /// A body, its policy's name leaked to borrow it for `'static` (a few bytes a case): a
    /// `SmallVec` of rules is invariant in their lifetime, so a body cannot borrow a shorter one
    /// after it is made.
    fn decision_body() -> impl Strategy<Value = DecisionBody<'static>> {
        let text = || {
            prop_oneof![Just(String::new()), "[a-z._-]{1,12}", ".{0,12}", "[\"\\\\\u{0}-\u{1f}\u{7f}é]{1,6}"]
        };
        (
            (any::<[bool; 3]>(), any::<[u64; 4]>(), text()),
            (any::<Option<u64>>(), prop::option::of(text()), prop::option::of(text())),
            prop::collection::vec(rule_body(), 0..4).prop_map(SmallVec::from_vec),
        )
            .prop_map(
                |(
                    (
                        [allowed, degraded, shadow_denied],
                        [limit, remaining, reset_after_ms, retry_after_ms],
                        policy,
                    ),
                    (delayed_ms, lease_id, message),
                    rules,
                )| {
                    DecisionBody {
                        allowed,
                        limit,
                        remaining,
                        reset_after_ms,
                        retry_after_ms,
                        degraded,
                        policy: Box::leak(policy.into_boxed_str()),
                        shadow_denied,
                        delayed_ms,
                        lease_id,
                        message,
                        rules,
                    }
                },
            )
    }

    fn policy(limit: u64) -> Arc<Policy> {
        use tollgate_core::{Period, Rule, RuleSet};
        let rules = RuleSet::new([Rule::fixed_window(limit, Period::MINUTE).named("w")]).unwrap();
        Arc::new(Policy::enforce("p", rules))
    }

    fn policy_header(fixed: &FixedHeaders, policy: &Policy) -> String {
        let decision = tollgate_core::Decision::admitted_unchecked(&policy.rules);
        let mut headers = axum::http::HeaderMap::new();
        let set = tollgate_http::HeaderSet::All;
        rate_limit_headers(
            &mut headers,
            &policy.rules,
            &decision,
            Default::default(),
            set,
            false,
            Some(fixed),
        );
        headers["ratelimit-policy"].to_str().unwrap().to_owned()
    }

    #[test]
    fn kept_headers_follow_each_version_of_a_named_policy() {
        let kept = KeptHeaders::default();
        let first = policy(5);
        let once = kept.of(&first);
        assert!(Arc::ptr_eq(&once, &kept.of(&first)), "formatted once per policy");
        assert_eq!(policy_header(&once, &first), r#""w";q=5;w=60"#);
        // Reloaded under the same name with another limit, while the old one is gone: the
        // record must not answer for it by name alone, nor by a reused address.
        drop(first);
        for limit in [7, 9] {
            let reloaded = policy(limit);
            let fixed = kept.of(&reloaded);
            assert_eq!(policy_header(&fixed, &reloaded), format!(r#""w";q={limit};w=60"#));
        }
    }

    proptest! {
        /// The hand-written body is the derived one, byte for byte: same keys, order, optional
        /// fields left out alike, strings escaped alike (quotes, backslashes, control bytes).
        #[test]
        fn the_written_body_is_what_serde_writes(body in decision_body()) {
            prop_assert_eq!(
                String::from_utf8(body.to_json()).unwrap(),
                serde_json::to_string(&body).unwrap()
            );
        }
    }
}
