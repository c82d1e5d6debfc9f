//! Rate-limit response headers: the de-facto `X-RateLimit-*` trio, `Retry-After`, and the IETF
//! draft's (draft-ietf-httpapi-ratelimit-headers) `RateLimit-Policy` and `RateLimit` structured
//! fields, one item per rule. The server and the tower layer both write them from here.

use std::borrow::Cow;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, header};
use serde::{Deserialize, Serialize};
use tollgate_core::{Decision, Rule, RuleKind, RuleSet};

/// How `X-RateLimit-Reset` is written (`[server] reset_header` in the configuration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetHeader {
    /// Seconds until the reset, rounded up (the IETF drafts' meaning).
    #[default]
    Delta,
    /// The reset as Unix epoch seconds (GitHub's meaning).
    Epoch,
}

/// Which rate-limit headers an answer carries (`Retry-After` on a refusal in any case).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderSet {
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`, and the IETF draft's `RateLimit-Policy`
    /// and `RateLimit`.
    #[default]
    All,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` only.
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` only (what GitHub and most limiters send).
    Legacy,
}

impl HeaderSet {
    fn legacy(self) -> bool {
        self != HeaderSet::Ietf
    }

    fn ietf(self) -> bool {
        self != HeaderSet::Legacy
    }
}

/// The headers [`rate_limit_headers`] writes, for `Access-Control-Expose-Headers`.
pub const RATE_LIMIT_HEADERS: &str =
    "retry-after, x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, ratelimit-policy, ratelimit";

/// Whole seconds in `d`, rounded up: a client told 0 would retry at once.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Whole milliseconds in `d`, rounded up (the JSON bodies' `*_ms` fields).
pub fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    u64::try_from(ms + u128::from(!d.as_nanos().is_multiple_of(1_000_000))).unwrap_or(u64::MAX)
}

/// The name a rule is reported under: its own, or its algorithm and position.
pub fn rule_name(rule: &Rule, index: usize) -> Cow<'_, str> {
    match &rule.name {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("{}.{index}", rule.algorithm())),
    }
}

/// [`rule_name`] as an RFC 8941 String, written into `out` without an allocation of its own.
fn write_rule_name(out: &mut String, rule: &Rule, index: usize) {
    match &rule.name {
        Some(name) => sf_string(out, name),
        None => {
            // Algorithm names are lower-case ASCII and `_`: nothing to escape.
            out.push('"');
            out.push_str(rule.algorithm().as_str());
            out.push('.');
            out.push_str(itoa::Buffer::new().format(index));
            out.push('"');
        }
    }
}

/// The time a rule's quota refers to: its period, or for bucket-like rules the time to refill
/// from empty. None for concurrency, which has no window.
fn window(kind: &RuleKind) -> Option<Duration> {
    let scaled = |per: Duration, num: u64, den: u64| {
        Duration::from_secs_f64(per.as_secs_f64() * num as f64 / den.max(1) as f64)
    };
    match kind {
        RuleKind::FixedWindow { period, .. }
        | RuleKind::SlidingWindowLog { period, .. }
        | RuleKind::SlidingWindowCounter { period, .. } => Some(period.as_duration()),
        RuleKind::TokenBucket { capacity, refill, per } => {
            Some(scaled(per.as_duration(), *capacity, *refill))
        }
        RuleKind::Gcra { limit, period, burst } => Some(scaled(period.as_duration(), *burst, *limit)),
        RuleKind::Concurrency { .. } => None,
    }
}

/// An RFC 8941 String: printable ASCII only, with `"` and `\` escaped.
fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// Numbers below this have header values made once per process (see [`number`]).
const SMALL_NUMBERS: usize = 1024;

/// `n` as a header value. A number below [`SMALL_NUMBERS`] (a reset or retry in seconds nearly
/// always is, and many limits and remainders) is a clone of a value made once over static
/// bytes, which neither allocates nor counts references; any other number is formatted anew.
fn number(n: u64) -> HeaderValue {
    static SMALL: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SMALL_NUMBERS);
        for i in 0..SMALL_NUMBERS {
            text.push_str(itoa::Buffer::new().format(i));
            ends.push(text.len());
        }
        // Once per process, about 3 KiB: the values' bytes must be 'static to be shared freely.
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}

/// `Content-Length` for a body of `len` bytes: a kept value for the usual small body (see
/// [`number`]), where axum would format one into an allocation of its own for each answer.
pub fn content_length(len: usize) -> HeaderValue {
    number(len as u64)
}

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const STATE: HeaderName = HeaderName::from_static("ratelimit");

/// `RateLimit-Policy` for `rules` (one item per rule: its name, quota and window). It depends
/// on the rules alone, so a caller whose rules are fixed (the tower layer) computes it once, in
/// [`FixedHeaders`].
pub fn policy_header(rules: &RuleSet) -> Option<HeaderValue> {
    let mut policy = String::with_capacity(32 * rules.len());
    let full = Decision::admitted_unchecked(rules);
    for (index, (rule, outcome)) in rules.rules().zip(full.outcomes(rules)).enumerate() {
        if index > 0 {
            policy.push_str(", ");
        }
        write_rule_name(&mut policy, rule, index);
        policy.push_str(";q=");
        policy.push_str(itoa::Buffer::new().format(outcome.limit()));
        if let Some(w) = window(&rule.kind) {
            policy.push_str(";w=");
            policy.push_str(itoa::Buffer::new().format(ceil_secs(w).max(1)));
        }
    }
    HeaderValue::try_from(policy).ok()
}

/// The header values that depend on a rule set alone, made once by a caller whose rules are
/// fixed (the tower layer) and handed to [`rate_limit_headers`]: `RateLimit-Policy`, and each
/// rule's limit for `X-RateLimit-Limit`. A kept value is cloned into a response (a reference
/// count), not formatted into a new allocation.
#[derive(Clone, Debug)]
pub struct FixedHeaders {
    policy: Option<HeaderValue>,
    /// Each rule's limit, and its header value, in the rule set's order.
    limits: Vec<(u64, HeaderValue)>,
}

impl FixedHeaders {
    /// The fixed headers of `rules`.
    pub fn new(rules: &RuleSet) -> Self {
        let limits = Decision::admitted_unchecked(rules)
            .outcomes(rules)
            .map(|outcome| (outcome.limit(), HeaderValue::from(outcome.limit())))
            .collect();
        FixedHeaders { policy: policy_header(rules), limits }
    }

    /// The `X-RateLimit-Limit` value of rule `index`, `limit` (formatted when the kept one
    /// is not that: a caller's rules other than these).
    fn limit(&self, index: usize, limit: u64) -> HeaderValue {
        match self.limits.get(index) {
            Some((kept, value)) if *kept == limit => value.clone(),
            _ => number(limit),
        }
    }
}

/// The IETF draft's `RateLimit-Policy` (kept in `fixed`, or computed) and `RateLimit`.
fn ietf_headers(headers: &mut HeaderMap, rules: &RuleSet, decision: &Decision, fixed: Option<&FixedHeaders>) {
    match fixed {
        Some(fixed) => {
            if let Some(policy) = &fixed.policy {
                headers.insert(POLICY, policy.clone());
            }
        }
        None => {
            if let Some(policy) = policy_header(rules) {
                headers.insert(POLICY, policy);
            }
        }
    }
    // Written into a buffer the thread keeps, then copied into a value of exactly its length:
    // one allocation. A `String` made into a value directly costs two when its capacity is not
    // its length (the bytes and `Bytes`' shared counter), and three when it grew on the way.
    STATE_BUFFER.with_borrow_mut(|state| {
        state.clear();
        for (index, (rule, outcome)) in rules.rules().zip(decision.outcomes(rules)).enumerate() {
            if index > 0 {
                state.push_str(", ");
            }
            write_rule_name(state, rule, index);
            state.push_str(";r=");
            state.push_str(itoa::Buffer::new().format(outcome.remaining()));
            state.push_str(";t=");
            state.push_str(itoa::Buffer::new().format(ceil_secs(outcome.reset_after())));
        }
        if let Ok(value) = HeaderValue::from_bytes(state.as_bytes()) {
            headers.insert(STATE, value);
        }
    });
}

thread_local! {
    // Bounded by a rule set's bounds: at most 32 rules of names of at most 128 bytes (256
    // escaped), about 10 KiB at the very worst.
    static STATE_BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Writes the headers of `set` describing `decision` under `rules` into `headers`; `denied`
/// adds `Retry-After` (whole seconds, rounded up, at least 1). `fixed` is [`FixedHeaders::new`]`(rules)`
/// when the caller keeps it, else what it holds is computed here.
pub fn rate_limit_headers(
    headers: &mut HeaderMap,
    rules: &RuleSet,
    decision: &Decision,
    reset: ResetHeader,
    set: HeaderSet,
    denied: bool,
    fixed: Option<&FixedHeaders>,
) {
    // Room for exactly the headers below, at once: growing the map one insert at a time
    // rehashes it several times (the most expensive part of writing them), and room for more
    // than needed can cross into the allocations malloc serves more slowly.
    let written = match set {
        HeaderSet::All => 5,
        HeaderSet::Ietf => 2,
        HeaderSet::Legacy => 3,
    };
    headers.reserve(written + usize::from(denied));
    if set.legacy() {
        let reset_secs = ceil_secs(decision.reset_after());
        let reset_value = match reset {
            ResetHeader::Delta => reset_secs,
            ResetHeader::Epoch => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                ceil_secs(now) + reset_secs
            }
        };
        let limit = decision.binding(rules).limit();
        let limit = match fixed {
            Some(fixed) => fixed.limit(decision.binding_index(), limit),
            None => number(limit),
        };
        headers.insert(X_LIMIT, limit);
        headers.insert(X_REMAINING, number(decision.remaining()));
        headers.insert(X_RESET, number(reset_value));
    }
    if set.ietf() {
        ietf_headers(headers, rules, decision, fixed);
    }
    if denied {
        let secs = ceil_secs(decision.retry_after()).max(1);
        headers.insert(header::RETRY_AFTER, number(secs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{ManualClock, MemoryBackend, Operation, Period};

    #[test]
    fn numbers_kept_or_formatted_are_the_same_values() {
        for n in (0..2 * SMALL_NUMBERS as u64).chain([u64::from(u32::MAX), u64::MAX]) {
            assert_eq!(number(n), HeaderValue::from(n), "{n}");
        }
    }

    #[test]
    fn one_item_per_rule_and_retry_after_rounded_up() {
        let rules = RuleSet::new([
            Rule::fixed_window(2, Period::SECOND).named("sec\"ond"),
            Rule::token_bucket(10, 5, Period::SECOND),
        ])
        .unwrap();
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        let mut d = backend.execute_now("k", &rules, Operation::Check { cost: 0 }).unwrap();
        for _ in 0..3 {
            d = backend.execute_now("k", &rules, Operation::Check { cost: 1 }).unwrap();
        }
        assert!(!d.allowed());
        let mut h = HeaderMap::new();
        rate_limit_headers(&mut h, &rules, &d, ResetHeader::Delta, HeaderSet::All, true, None);
        assert_eq!(h["ratelimit-policy"], r#""sec\"ond";q=2;w=1, "token_bucket.1";q=10;w=2"#);
        assert_eq!(h["ratelimit"], r#""sec\"ond";r=0;t=1, "token_bucket.1";r=8;t=1"#);
        assert_eq!(h["x-ratelimit-limit"], "2");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["retry-after"], "1");
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
    }

    #[test]
    fn kept_fixed_headers_write_what_computing_them_writes() {
        let rules = RuleSet::new([
            Rule::fixed_window(3, Period::SECOND).named("a"),
            Rule::fixed_window(50, Period::MINUTE),
        ])
        .unwrap();
        let fixed = FixedHeaders::new(&rules);
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        // Admitted with the first rule binding, then denied by it; then a decision whose
        // binding limit the kept values lack (a caller's mismatched rules) is still right.
        for cost in [1, 1, 1, 1] {
            let d = backend.execute_now("k", &rules, Operation::Check { cost }).unwrap();
            let (mut computed, mut kept) = (HeaderMap::new(), HeaderMap::new());
            rate_limit_headers(
                &mut computed,
                &rules,
                &d,
                ResetHeader::Delta,
                HeaderSet::All,
                !d.allowed(),
                None,
            );
            rate_limit_headers(
                &mut kept,
                &rules,
                &d,
                ResetHeader::Delta,
                HeaderSet::All,
                !d.allowed(),
                Some(&fixed),
            );
            assert_eq!(computed, kept);
            assert_eq!(kept["x-ratelimit-limit"], "3");
        }
        let other = RuleSet::new([Rule::fixed_window(7, Period::SECOND)]).unwrap();
        let d = backend.execute_now("k", &other, Operation::Check { cost: 1 }).unwrap();
        let mut h = HeaderMap::new();
        rate_limit_headers(&mut h, &other, &d, ResetHeader::Delta, HeaderSet::All, false, Some(&fixed));
        assert_eq!(h["x-ratelimit-limit"], "7");
    }

    #[test]
    fn each_set_writes_its_headers_and_retry_after_in_any() {
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        backend.execute_now("k", &rules, Operation::Check { cost: 1 }).unwrap();
        let denied = backend.execute_now("k", &rules, Operation::Check { cost: 1 }).unwrap();
        let names = |set| {
            let mut h = HeaderMap::new();
            rate_limit_headers(&mut h, &rules, &denied, ResetHeader::Delta, set, true, None);
            let mut names: Vec<String> = h.keys().map(|n| n.as_str().to_owned()).collect();
            names.sort_unstable();
            names
        };
        let legacy = ["retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"];
        let ietf = ["ratelimit", "ratelimit-policy", "retry-after"];
        assert_eq!(names(HeaderSet::Legacy), legacy);
        assert_eq!(names(HeaderSet::Ietf), ietf);
        let mut all: Vec<&str> = legacy.iter().chain(&ietf).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(names(HeaderSet::All), all);
    }

    #[test]
    fn the_state_buffer_starts_empty_for_each_answer() {
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        let state = |rules: &RuleSet| {
            let d = backend.execute_now("k", rules, Operation::Check { cost: 1 }).unwrap();
            let mut h = HeaderMap::new();
            rate_limit_headers(&mut h, rules, &d, ResetHeader::Delta, HeaderSet::Ietf, false, None);
            h["ratelimit"].to_str().unwrap().to_owned()
        };
        let long = "\"".repeat(tollgate_core::limits::MAX_NAME_BYTES);
        let long_rules = RuleSet::new([Rule::fixed_window(5, Period::SECOND).named(long)]).unwrap();
        let short = RuleSet::new([Rule::fixed_window(3, Period::SECOND).named("s")]).unwrap();
        assert_eq!(state(&short), r#""s";r=2;t=1"#);
        let escaped = "\\\"".repeat(tollgate_core::limits::MAX_NAME_BYTES);
        assert_eq!(state(&long_rules), format!("\"{escaped}\";r=4;t=1"));
        assert_eq!(state(&short), r#""s";r=1;t=1"#);
    }

    #[test]
    fn rounding_is_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_micros(2001)), 3);
    }

    #[test]
    fn one_item_per_rule_and_retry_after_at_least_one() {
        let rules = RuleSet::new([
            Rule::fixed_window(2, Period::SECOND).named("sec\"ond"),
            Rule::token_bucket(10, 5, Period::SECOND),
            Rule::concurrency(3, Period::MINUTE),
        ])
        .unwrap();
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        let mut d = backend.execute_now("k", &rules, Operation::Check { cost: 0 }).unwrap();
        for _ in 0..3 {
            d = backend
                .execute_now(
                    "k",
                    &rules,
                    Operation::Acquire { cost: 1, lease: &tollgate_core::LeaseId::random() },
                )
                .unwrap();
        }
        assert!(!d.allowed());
        let mut h = HeaderMap::new();
        rate_limit_headers(&mut h, &rules, &d, ResetHeader::Delta, HeaderSet::All, true, None);
        assert_eq!(
            h["ratelimit-policy"],
            r#""sec\"ond";q=2;w=1, "token_bucket.1";q=10;w=2, "concurrency.2";q=3"#
        );
        assert_eq!(
            h["ratelimit"],
            r#""sec\"ond";r=0;t=1, "token_bucket.1";r=8;t=1, "concurrency.2";r=1;t=60"#
        );
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["retry-after"], "1");
    }
}
