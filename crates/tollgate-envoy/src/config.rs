//! envoyproxy/ratelimit's YAML configuration: `domain`, nested `descriptors`, `rate_limit` with
//! `unit` and `requests_per_unit`, `unlimited`, `name`, `replaces`, `shadow_mode`,
//! `detailed_metric`; and Tollgate's extensions: `algorithm`, `unit_multiplier`, `burst`, and a
//! list of `rate_limits` on one descriptor.

use std::collections::BTreeMap;

use serde::Deserialize;
use tollgate_core::{Period, Rule, RuleSet};

/// Most descriptor levels a configuration nests.
pub const MAX_DEPTH: usize = 16;

/// A time unit of upstream's `rate_limit.unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The envoy proto's number for the unit (`RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of an envoy proto number; `None` for UNKNOWN.
    pub fn from_proto(n: i32) -> Option<Unit> {
        Some(match n {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// Which engine algorithm a limit uses (Tollgate's extension; upstream has only the fixed
/// window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitAlgorithm {
    /// A clock-aligned fixed window of `unit` x `unit_multiplier` (upstream's behaviour).
    #[default]
    FixedWindow,
    /// An exact sliding window (at most 10,000 requests per window).
    SlidingWindowLog,
    /// An approximate sliding window in constant space.
    SlidingWindowCounter,
    /// A bucket of `burst` (default `requests_per_unit`) refilled at `requests_per_unit` per window.
    TokenBucket,
    /// GCRA: `requests_per_unit` per window, evenly spaced, `burst` at once (default 1).
    Gcra,
}

/// `replaces: [{name: ...}]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaces {
    /// The name of the limit replaced.
    pub name: String,
}

/// One `rate_limit` (or one item of Tollgate's `rate_limits`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// The window's unit.
    #[serde(default)]
    pub unit: Option<Unit>,
    /// Requests per window.
    #[serde(default)]
    pub requests_per_unit: Option<u64>,
    /// Never limited (and not counted).
    #[serde(default)]
    pub unlimited: bool,
    /// A name other limits can `replace`.
    #[serde(default)]
    pub name: Option<String>,
    /// Limits this one replaces when both apply to one request.
    #[serde(default)]
    pub replaces: Vec<Replaces>,
    /// Tollgate: the window is `unit` x this (windows such as 30 s or 5 min).
    #[serde(default)]
    pub unit_multiplier: Option<u64>,
    /// Tollgate: the algorithm.
    #[serde(default)]
    pub algorithm: LimitAlgorithm,
    /// Tollgate: the burst of `token_bucket` and `gcra`.
    #[serde(default)]
    pub burst: Option<u64>,
}

/// One node of the `descriptors` tree as written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorSpec {
    /// The entry key to match.
    pub key: String,
    /// The value to match; absent: any value (each counted apart). A trailing `*` matches any
    /// value with that prefix.
    #[serde(default)]
    pub value: Option<String>,
    /// The limit at this node.
    #[serde(default)]
    pub rate_limit: Option<RateLimitSpec>,
    /// Tollgate: several limits at this node, all-or-nothing.
    #[serde(default)]
    pub rate_limits: Vec<RateLimitSpec>,
    /// Deeper levels.
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
    /// Evaluated and counted, never refusing.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Metrics keyed by the full descriptor values (upstream's meaning).
    #[serde(default)]
    pub detailed_metric: bool,
    /// Accepted for compatibility with newer upstream files; metrics always use the key path.
    #[serde(default)]
    pub value_to_metric: bool,
}

/// A whole file: one domain.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainSpec {
    /// The domain requests name.
    pub domain: String,
    /// The top-level descriptors.
    #[serde(default)]
    pub descriptors: Vec<DescriptorSpec>,
}

/// A validated limit.
#[derive(Clone, Debug)]
pub struct Limit {
    /// Its name, if any.
    pub name: Option<String>,
    /// `None`: unlimited.
    pub rule: Option<Rule>,
    /// As written, for the response's `current_limit`.
    pub requests_per_unit: u64,
    /// As written.
    pub unit: Unit,
    /// The window in seconds (`unit` x `unit_multiplier`).
    pub window_secs: u64,
    /// Names this limit replaces.
    pub replaces: Vec<String>,
}

/// A validated node of the tree.
#[derive(Clone, Debug, Default)]
pub struct Node {
    /// Limits at this node (all-or-nothing).
    pub limits: Vec<Limit>,
    /// Never refusing.
    pub shadow_mode: bool,
    /// Metrics with values.
    pub detailed_metric: bool,
    /// Children by `key` then exact `value`.
    pub exact: BTreeMap<(String, String), Node>,
    /// Children by `key` and value prefix (`value: "abc*"`), longest prefix first.
    pub prefix: Vec<(String, String, Node)>,
    /// Children by `key` alone (any value).
    pub any: BTreeMap<String, Node>,
}

/// A validated domain.
#[derive(Clone, Debug)]
pub struct Domain {
    /// The domain.
    pub name: String,
    /// Its tree's root (no limits of its own).
    pub root: Node,
}

/// Why a file is not a valid configuration.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct EnvoyConfigError {
    /// The file.
    pub origin: String,
    /// What is wrong, with the descriptor path.
    pub message: String,
}

fn limit(path: &str, spec: &RateLimitSpec) -> Result<Limit, String> {
    let at = |m: String| format!("{path}: {m}");
    let unit = spec.unit.ok_or_else(|| at("rate_limit needs a unit".into()))?;
    if spec.unlimited {
        return Ok(Limit {
            name: spec.name.clone(),
            rule: None,
            requests_per_unit: 0,
            unit,
            window_secs: unit.seconds(),
            replaces: spec.replaces.iter().map(|r| r.name.clone()).collect(),
        });
    }
    let n = spec.requests_per_unit.ok_or_else(|| at("rate_limit needs requests_per_unit".into()))?;
    let multiplier = spec.unit_multiplier.unwrap_or(1);
    if multiplier == 0 {
        return Err(at("unit_multiplier must be at least 1".into()));
    }
    let period = unit
        .seconds()
        .checked_mul(multiplier)
        .and_then(|s| Period::from_secs(s).ok())
        .ok_or_else(|| at("the window (unit x unit_multiplier) must be at most a year".into()))?;
    let rule = match spec.algorithm {
        LimitAlgorithm::FixedWindow => Rule::fixed_window(n, period),
        LimitAlgorithm::SlidingWindowLog => Rule::sliding_window_log(n, period),
        LimitAlgorithm::SlidingWindowCounter => Rule::sliding_window_counter(n, period),
        LimitAlgorithm::TokenBucket => Rule::token_bucket(spec.burst.unwrap_or(n), n, period),
        LimitAlgorithm::Gcra => Rule::gcra(n, period, spec.burst.unwrap_or(1)),
    };
    let rule = match &spec.name {
        Some(name) => rule.named(name.clone()),
        None => rule,
    };
    // Validated alone here (limits, exactness); sets are built per request.
    RuleSet::new([rule.clone()]).map_err(|e| at(e.to_string()))?;
    Ok(Limit {
        name: spec.name.clone(),
        rule: Some(rule),
        requests_per_unit: n,
        unit,
        window_secs: period.as_duration().as_secs(),
        replaces: spec.replaces.iter().map(|r| r.name.clone()).collect(),
    })
}

fn node(path: &str, spec: &DescriptorSpec, depth: usize) -> Result<Node, String> {
    if depth > MAX_DEPTH {
        return Err(format!("{path}: descriptors nest deeper than {MAX_DEPTH} levels"));
    }
    let mut out =
        Node { shadow_mode: spec.shadow_mode, detailed_metric: spec.detailed_metric, ..Node::default() };
    if spec.rate_limit.is_some() && !spec.rate_limits.is_empty() {
        return Err(format!("{path}: give rate_limit or rate_limits, not both"));
    }
    for l in spec.rate_limit.iter().chain(&spec.rate_limits) {
        out.limits.push(limit(path, l)?);
    }
    // The node's limits are checked together at every request: they must form a rule set.
    let rules: Vec<Rule> = out.limits.iter().filter_map(|l| l.rule.clone()).collect();
    if !rules.is_empty() {
        RuleSet::new(rules).map_err(|e| format!("{path}: rate_limits: {e}"))?;
    }
    children(path, &spec.descriptors, depth + 1, &mut out)?;
    Ok(out)
}

fn children(path: &str, specs: &[DescriptorSpec], depth: usize, into: &mut Node) -> Result<(), String> {
    for child in specs {
        let child_path = match &child.value {
            Some(v) => format!("{path}/{}={v}", child.key),
            None => format!("{path}/{}", child.key),
        };
        let built = node(&child_path, child, depth)?;
        let duplicate = match &child.value {
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_owned();
                let dup = into.prefix.iter().any(|(k, p, _)| *k == child.key && *p == prefix);
                into.prefix.push((child.key.clone(), prefix, built));
                dup
            }
            Some(v) => into.exact.insert((child.key.clone(), v.clone()), built).is_some(),
            None => into.any.insert(child.key.clone(), built).is_some(),
        };
        if duplicate {
            return Err(format!("{child_path}: the same descriptor is defined twice"));
        }
    }
    // Most specific first: the longest prefix wins.
    into.prefix.sort_by_key(|(_, prefix, _)| std::cmp::Reverse(prefix.len()));
    Ok(())
}

impl Domain {
    /// Parses and validates one YAML file; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Domain, EnvoyConfigError> {
        let err = |message: String| EnvoyConfigError { origin: origin.to_owned(), message };
        let spec: DomainSpec = serde_yaml_ng::from_str(text).map_err(|e| err(e.to_string()))?;
        if spec.domain.is_empty() {
            return Err(err("domain must not be empty".into()));
        }
        let mut root = Node::default();
        children(&spec.domain, &spec.descriptors, 1, &mut root).map_err(err)?;
        Ok(Domain { name: spec.domain, root })
    }
}

/// The node a request descriptor's entries lead to, most specific match at each level: an
/// exact value, then the longest matching `prefix*`, then the key alone.
pub fn find<'a>(root: &'a Node, entries: &[(String, String)]) -> Option<&'a Node> {
    let mut node = root;
    for (key, value) in entries {
        node = node
            .exact
            .get(&(key.clone(), value.clone()))
            .or_else(|| {
                node.prefix
                    .iter()
                    .find(|(k, p, _)| k == key && value.starts_with(p.as_str()))
                    .map(|(_, _, n)| n)
            })
            .or_else(|| node.any.get(key))?;
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: path
    value: /api/admin*
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: /health
    rate_limit: {unit: second, unlimited: true}
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 100, replaces: [{name: login}]}
        shadow_mode: true
      - key: plan
  - key: tenant
    value: acme
    rate_limits:
      - {unit: second, requests_per_unit: 30, unit_multiplier: 30, algorithm: sliding_window_counter}
      - {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 20}
"#;

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn limits(d: &Domain, pairs: &[(&str, &str)]) -> Option<Vec<u64>> {
        find(&d.root, &entries(pairs)).map(|n| n.limits.iter().map(|l| l.requests_per_unit).collect())
    }

    #[test]
    fn the_most_specific_descriptor_wins() {
        let d = Domain::from_yaml(UPSTREAM, "t.yaml").unwrap();
        assert_eq!(limits(&d, &[("remote_address", "10.0.0.1")]), Some(vec![10]), "key alone: any value");
        assert_eq!(limits(&d, &[("path", "/login")]), Some(vec![5]), "exact value");
        assert_eq!(limits(&d, &[("path", "/api/orders")]), Some(vec![1000]), "prefix");
        assert_eq!(limits(&d, &[("path", "/api/admin/users")]), Some(vec![10]), "the longest prefix");
        assert_eq!(limits(&d, &[("path", "/elsewhere")]), None, "no match: no limit");
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "free")]), Some(vec![100]));
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "pro")]), Some(vec![]), "a node without a limit");
        assert_eq!(limits(&d, &[("user", "u1")]), Some(vec![]));
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "free"), ("deeper", "x")]), None);
        assert_eq!(limits(&d, &[("tenant", "acme")]), Some(vec![30, 100]));
    }

    #[test]
    fn extensions_build_the_engine_rules() {
        let d = Domain::from_yaml(UPSTREAM, "t.yaml").unwrap();
        let node = find(&d.root, &entries(&[("tenant", "acme")])).unwrap();
        let rules: Vec<_> = node.limits.iter().map(|l| l.rule.clone().unwrap()).collect();
        assert_eq!(rules[0], Rule::sliding_window_counter(30, Period::from_secs(30).unwrap()));
        assert_eq!(rules[1], Rule::gcra(100, Period::MINUTE, 20));
        let health = find(&d.root, &entries(&[("path", "/health")])).unwrap();
        assert!(health.limits[0].rule.is_none(), "unlimited");
        let free = find(&d.root, &entries(&[("user", "u"), ("plan", "free")])).unwrap();
        assert!(free.shadow_mode);
        assert_eq!(free.limits[0].replaces, ["login"]);
    }

    #[test]
    fn mistakes_are_refused_with_their_descriptor() {
        let bad = |yaml: &str| Domain::from_yaml(yaml, "b.yaml").unwrap_err().to_string();
        assert!(
            bad("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")
                .contains("d/k: rate_limit needs requests_per_unit")
        );
        assert!(bad("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").contains("fortnight"));
        assert!(bad("domain: d\ndescriptors:\n  - key: k\n    colour: red\n").contains("colour"));
        assert!(
            bad("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n")
                .contains("defined twice")
        );
        assert!(bad("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n").contains("at most a year"));
        assert!(bad("domain: ''\n").contains("domain must not be empty"));
    }
}
