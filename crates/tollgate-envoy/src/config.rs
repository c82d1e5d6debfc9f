//! envoyproxy/ratelimit's YAML configuration, read and validated as upstream's loader
//! (`src/config/config_impl.go`) reads it, plus Tollgate's extensions: `algorithm`,
//! `unit_multiplier`, `burst`, and a list of `rate_limits` on one descriptor.
//!
//! What upstream does, and so what this does:
//! - Every key of the file, at every level, must be one of upstream's keys (or Tollgate's);
//!   `metadata`'s contents are free. An upstream key where upstream ignores it (`unit` on a
//!   descriptor) is accepted with a warning; Tollgate's own keys must be where they mean
//!   something.
//! - A descriptor is stored under its key joined to its value (`key_value`, or `key` without a
//!   value): two descriptors with the same join are duplicates.
//! - `unit` is case-insensitive; `unlimited: true` takes no valid unit; `requests_per_unit` 0
//!   or missing refuses every request (a block list); `replaces` may not be empty nor name its
//!   own limit, and may name a limit that exists nowhere; `share_threshold` needs a `*`.
//! - A `*` anywhere in a descriptor's `key_value` makes it a wildcard (each `*` matches any
//!   run of characters). At each level a request entry matches its exact `key_value`, else the
//!   first wildcard in file order, else its key alone.

use std::collections::HashMap;
use std::sync::OnceLock;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as ProtoValue};
use prost::Message as _;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_yaml_ng::Value;
use smallvec::SmallVec;
use tollgate_core::{Period, Rule, RuleSet};
use tollgate_limiter::Policy;

/// Most descriptor levels a configuration nests.
pub const MAX_DEPTH: usize = 16;

/// Most levels of maps and lists in one descriptor's `metadata`. Each level is three protobuf
/// messages deep in a response (Struct, map entry, Value), and protobuf decoders stop at 100
/// (prost, gRPC C-core, Go): past about 30 levels Envoy could not even read the answer.
pub const MAX_METADATA_DEPTH: usize = 16;

/// Largest `metadata` of one descriptor, encoded. Every admitted request carries it (merged
/// with the other descriptors'), so a file's typo cannot make each answer megabytes long.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// A time unit of upstream's `rate_limit.unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// The unit named `text`, in any case (`second`, `SECOND`, `Week`); `None` for anything
    /// else, `unknown` included (upstream's `UNKNOWN` is no unit).
    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's name in lower case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

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

/// What a limit does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// `unlimited: true`: admitted, not counted.
    Unlimited,
    /// `requests_per_unit` 0 or missing: refused, not counted.
    Block,
    /// Counted under this rule.
    Rule(Rule),
}

/// A validated limit.
#[derive(Clone, Debug)]
pub struct Limit {
    /// Its name, if any (what other limits' `replaces` name).
    pub name: Option<String>,
    /// Unlimited, a block, or a rule.
    pub kind: LimitKind,
    /// As written, for the response's `current_limit`.
    pub requests_per_unit: u32,
    /// As written; `None` only for an unlimited limit.
    pub unit: Option<Unit>,
    /// The window in seconds (`unit` x `unit_multiplier`; 0 when unlimited).
    pub window_secs: u64,
    /// Names this limit replaces.
    pub replaces: Vec<String>,
}

/// A wildcard child: its `key_value` and that text cut at each `*`.
#[derive(Clone, Debug)]
struct Wildcard {
    joined: String,
    parts: Vec<String>,
}

/// A validated node of the tree.
#[derive(Clone, Debug, Default)]
pub struct Node {
    /// Limits at this node: none, one, or Tollgate's `rate_limits` (all checked together).
    pub limits: Vec<Limit>,
    /// Counted, never refusing.
    pub shadow_mode: bool,
    /// Refuses the request only when every quota-mode descriptor of it is over its limit.
    pub quota_mode: bool,
    /// Metrics keyed by the request's values.
    pub detailed_metric: bool,
    /// Upstream's `value_to_metric`: the request's value in the stat key path at this level.
    pub value_to_metric: bool,
    /// Values matching this node's wildcard share one counter.
    pub share_threshold: bool,
    /// Upstream's `metadata`, as a protobuf Struct: sent in the response's dynamic metadata
    /// when this node's limit admits a request (`None` when absent or empty).
    pub metadata: Option<Struct>,
    /// The rule set of `limits`' rules, in order (`None` when it has none): made once, as the
    /// configuration is loaded, rather than at every request.
    rules: Option<RuleSet>,
    /// The policy checking `rules`, made at the first request ([`Node::policy`]).
    policy: OnceLock<Policy>,
    /// The descriptor's `key` and `value` as written (empty for a domain's root).
    key: String,
    value: Option<String>,
    /// Children by `key_value` (or `key`).
    children: HashMap<String, Node, foldhash::fast::RandomState>,
    /// The children whose `key_value` holds a `*`, in file order.
    wildcards: Vec<Wildcard>,
}

impl Node {
    /// The policy named `domain` (this node's) that checks its rules, `None` without rules:
    /// one kept per node, so that its metrics' counters are registered once, not per request.
    pub fn policy(&self, domain: &str) -> Option<&Policy> {
        let rules = self.rules.as_ref()?;
        Some(self.policy.get_or_init(|| Policy::enforce(domain, rules.clone())))
    }

    /// Whether nothing nests under this node.
    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }

    /// The descriptors nested here: each one's `key`, `value` (`None` when it has none) and
    /// node, in no particular order.
    pub fn children(&self) -> impl Iterator<Item = (&str, Option<&str>, &Node)> {
        self.children.values().map(|n| (n.key.as_str(), n.value.as_deref(), n))
    }
}

/// A validated domain.
#[derive(Clone, Debug)]
pub struct Domain {
    /// The domain.
    pub name: String,
    /// Its tree's root (no limits of its own).
    pub root: Node,
}

impl Domain {
    /// The domain as upstream's `/rlconfig` prints it: a line per limit,
    /// `<domain>.<key_value>...: unit=MINUTE requests_per_unit=10, shadow_mode: false,
    /// quota_mode: false` (an unlimited limit's unit is `UNKNOWN` and its count 0), in the
    /// order of the keys (upstream's is a Go map's, so any). A limit using Tollgate's
    /// extensions ends with them: `, algorithm: gcra, window: 30s`.
    pub fn dump(&self) -> String {
        let mut lines = Vec::new();
        dump_node(&self.root, &self.name, &mut lines);
        lines.sort();
        lines.concat()
    }
}

fn dump_node(node: &Node, path: &str, lines: &mut Vec<String>) {
    for (key, value, child) in node.children() {
        let full = match value {
            Some(v) => format!("{path}.{key}_{v}"),
            None => format!("{path}.{key}"),
        };
        for l in &child.limits {
            let unit = l.unit.map_or("UNKNOWN".to_owned(), |u| u.name().to_ascii_uppercase());
            let mut line = format!(
                "{full}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                l.requests_per_unit, child.shadow_mode, child.quota_mode
            );
            if let (LimitKind::Rule(rule), Some(u)) = (&l.kind, l.unit) {
                let algorithm = rule.algorithm();
                if algorithm != tollgate_core::AlgorithmName::FixedWindow || l.window_secs != u.seconds() {
                    line.push_str(&format!(
                        ", algorithm: {}, window: {}s",
                        algorithm.as_str(),
                        l.window_secs
                    ));
                }
            }
            line.push('\n');
            lines.push(line);
        }
        dump_node(child, &full, lines);
    }
}

/// Why a file is not a valid configuration: `origin:line: message` when the mistake is at a
/// place in the file (as tollgate-config's errors), else `origin: message`.
#[derive(Debug)]
pub struct EnvoyConfigError {
    /// The file.
    pub origin: String,
    /// The line (from 1) of the offending node of the file, when there is one.
    pub line: Option<usize>,
    /// Its column (from 1).
    pub column: Option<usize>,
    /// What is wrong, with where it is (the descriptor path, or the YAML parser's words).
    pub message: String,
}

impl EnvoyConfigError {
    /// A refusal of `origin` as a whole (no place in it).
    pub fn new(origin: impl Into<String>, message: impl Into<String>) -> EnvoyConfigError {
        EnvoyConfigError { origin: origin.into(), line: None, column: None, message: message.into() }
    }
}

impl std::fmt::Display for EnvoyConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for EnvoyConfigError {}

// -------------------------------------------------------------------------------------------
// Where a mistake is

/// A step from a node of the file to one inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The value under this key of a map.
    Field(&'static str),
    /// The value of a map's entry at this place (from 0, in file order).
    ValueOf(usize),
    /// The key of a map's entry at this place.
    KeyOf(usize),
    /// A list's item at this place.
    Index(usize),
}

/// A mistake in a file and the steps from the file's root to its node.
#[derive(Debug)]
struct Mistake {
    message: String,
    at: Vec<Step>,
}

impl Mistake {
    /// The same mistake, seen from `steps` above.
    fn under(mut self, steps: &[Step]) -> Mistake {
        self.at.splice(0..0, steps.iter().copied());
        self
    }
}

impl From<String> for Mistake {
    fn from(message: String) -> Mistake {
        Mistake { message, at: Vec::new() }
    }
}

/// The line and column (from 1) of the node `steps` lead to in `text`, or of the deepest node
/// on the way when they lead nowhere (a missing key: its map). Read again only when a file is
/// refused: serde_yaml_ng gives no places in a `Value`, but its errors carry the mark of the
/// node being read, so the walk fails on purpose at the node.
fn locate(text: &str, steps: &[Step]) -> Option<(usize, usize)> {
    let walked = Walk(steps).deserialize(serde_yaml_ng::Deserializer::from_str(text));
    let location = walked.err()?.location()?;
    Some((location.line(), location.column()))
}

/// Fails at the node its steps lead to (every visit it does not override fails).
struct Walk<'s>(&'s [Step]);

fn here<E: serde::de::Error>() -> E {
    E::custom("here")
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the node")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((&Step::Index(want), rest)) = self.0.split_first() else { return Err(here()) };
        for _ in 0..want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(here());
            }
        }
        seq.next_element_seed(Walk(rest))?.ok_or_else(here)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((&step, rest)) = self.0.split_first() else { return Err(here()) };
        for i in 0.. {
            let found = match step {
                Step::Field(name) => map.next_key_seed(KeyIs(name))?,
                Step::KeyOf(n) if n == i => map.next_key_seed(Walk(&[]))?.map(|()| false),
                Step::ValueOf(n) if n == i => map.next_key::<IgnoredAny>()?.map(|_| true),
                _ => map.next_key::<IgnoredAny>()?.map(|_| false),
            };
            match found {
                None => break,
                Some(true) => return map.next_value_seed(Walk(rest)),
                Some(false) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Err(here())
    }
}

/// Whether a map's key is this text.
struct KeyIs(&'static str);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyIs {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i128<E>(self, _: i128) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u128<E>(self, _: u128) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

// -------------------------------------------------------------------------------------------
// The file as written

/// A scalar's text as upstream reads it into a string field: `value: 911` is `"911"`.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Text;
    impl<'de> serde::de::Visitor<'de> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a scalar")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            // serde_yaml_ng hands a plain scalar's source text to `deserialize_str`.
            String::deserialize(d).map(Some)
        }
    }
    d.deserialize_option(Text)
}

/// A boolean as yaml.v2 (YAML 1.1) reads one: `true`, `yes`, `on`, `y` and their opposites;
/// empty or null is false.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    // Refused while the word is read, so that the parser's error has the word's line.
    struct Flag;
    impl<'de> Visitor<'de> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a boolean")
        }
        fn visit_none<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(Flag)
        }
        fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<bool, E> {
            match word {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => Ok(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
                    Ok(false)
                }
                _ => Err(E::custom(format!("{word:?} is not a boolean"))),
            }
        }
    }
    d.deserialize_option(Flag)
}

/// `replaces: [{name: ...}]`.
#[derive(Debug, Deserialize)]
struct ReplacesSpec {
    #[serde(default, deserialize_with = "text")]
    name: Option<String>,
}

/// One `rate_limit` (or one item of Tollgate's `rate_limits`).
#[derive(Debug, Default, Deserialize)]
struct RateLimitSpec {
    #[serde(default, deserialize_with = "text")]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default, deserialize_with = "flag")]
    unlimited: bool,
    #[serde(default, deserialize_with = "text")]
    name: Option<String>,
    #[serde(default)]
    replaces: Option<Vec<ReplacesSpec>>,
    #[serde(default)]
    unit_multiplier: Option<u64>,
    #[serde(default)]
    algorithm: Option<LimitAlgorithm>,
    #[serde(default)]
    burst: Option<u64>,
}

/// One node of the `descriptors` tree as written.
#[derive(Debug, Deserialize)]
struct DescriptorSpec {
    #[serde(default, deserialize_with = "text")]
    key: Option<String>,
    #[serde(default, deserialize_with = "text")]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitSpec>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimitSpec>>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorSpec>>,
    #[serde(default, deserialize_with = "flag")]
    shadow_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    quota_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    detailed_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    value_to_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    share_threshold: bool,
    #[serde(default)]
    metadata: Option<Value>,
}

/// A whole file: one domain.
#[derive(Debug, Deserialize)]
struct DomainSpec {
    #[serde(default, deserialize_with = "text")]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorSpec>>,
}

// -------------------------------------------------------------------------------------------
// Upstream's key check

/// Upstream's keys: valid anywhere in a file (upstream checks names, not places).
const UPSTREAM_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Where a mapping sits, for which keys mean something in it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Descriptor,
    RateLimit,
    Replaces,
    /// Under a key that holds no mapping in the format (upstream still checks its keys).
    Elsewhere,
}

impl Place {
    fn keys(self) -> &'static [&'static str] {
        match self {
            Place::Root => &["domain", "descriptors"],
            Place::Descriptor => &[
                "key",
                "value",
                "rate_limit",
                "rate_limits",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "detailed_metric",
                "value_to_metric",
                "share_threshold",
                "metadata",
            ],
            Place::RateLimit => &[
                "unit",
                "requests_per_unit",
                "unlimited",
                "name",
                "replaces",
                "unit_multiplier",
                "algorithm",
                "burst",
            ],
            Place::Replaces => &["name"],
            Place::Elsewhere => &[],
        }
    }

    /// Where the value under `key` sits.
    fn under(key: &str) -> Place {
        match key {
            "descriptors" => Place::Descriptor,
            "rate_limit" | "rate_limits" => Place::RateLimit,
            "replaces" => Place::Replaces,
            _ => Place::Elsewhere,
        }
    }
}

/// Tollgate's keys, valid only where they mean something.
const TOLLGATE_KEYS: [&str; 4] = ["rate_limits", "unit_multiplier", "algorithm", "burst"];

/// Checks every key of `map` and below as upstream's `validateYamlKeys` does; an upstream key
/// where it means nothing is a warning.
fn check_keys(
    map: &serde_yaml_ng::Mapping,
    place: Place,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<(), Mistake> {
    for (i, (k, v)) in map.iter().enumerate() {
        let refuse = |message: String| Err(Mistake { message, at: vec![Step::KeyOf(i)] });
        let Some(key) = k.as_str() else {
            return refuse(format!("config error, key is not of type string: {} (at {at})", scalar_text(k)));
        };
        let here = if at.is_empty() { key.to_owned() } else { format!("{at}.{key}") };
        let upstream = UPSTREAM_KEYS.contains(&key);
        if !upstream && !TOLLGATE_KEYS.contains(&key) {
            return refuse(format!("config error, unknown key '{key}' (at {here})"));
        }
        if place != Place::Elsewhere && !place.keys().contains(&key) {
            if !upstream {
                return refuse(format!("config error, '{key}' does not belong here (at {here})"));
            }
            warnings
                .push(format!("{here}: '{key}' means nothing here and is ignored, as upstream ignores it"));
        }
        if key == "metadata" {
            // Free-form, as upstream: whatever YAML holds becomes a protobuf Struct.
            continue;
        }
        let inner = if place == Place::Elsewhere { Place::Elsewhere } else { Place::under(key) };
        check_value(v, inner, &here, warnings).map_err(|m| m.under(&[Step::ValueOf(i)]))?;
    }
    Ok(())
}

fn check_value(v: &Value, place: Place, at: &str, warnings: &mut Vec<String>) -> Result<(), Mistake> {
    match v {
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                let Value::Mapping(map) = item else {
                    return Err(Mistake::from(format!(
                        "config error, yaml file contains list of type other than map: {} (at {at}[{i}])",
                        scalar_text(item)
                    ))
                    .under(&[Step::Index(i)]));
                };
                check_keys(map, place, &format!("{at}[{i}]"), warnings)
                    .map_err(|m| m.under(&[Step::Index(i)]))?;
            }
            Ok(())
        }
        Value::Mapping(map) => {
            // `rate_limit` holds one mapping; `descriptors` and `replaces` hold lists, and
            // upstream checks a mapping's keys wherever it sits.
            let place = if place == Place::RateLimit { place } else { Place::Elsewhere };
            check_keys(map, place, at, warnings)
        }
        // yaml.v2's leaf types: strings, integers (64-bit), booleans, null.
        Value::String(_) | Value::Bool(_) | Value::Null => Ok(()),
        Value::Number(n) if n.is_i64() => Ok(()),
        Value::Number(_) => {
            Err(format!("error checking config: {} is not an integer (at {at})", scalar_text(v)).into())
        }
        Value::Tagged(tagged) => check_value(&tagged.value, place, at, warnings),
    }
}

/// A short rendering of a YAML value for an error message.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a map".into(),
        Value::Tagged(t) => format!("{} {}", t.tag, scalar_text(&t.value)),
    }
}

/// A descriptor's `metadata` as upstream's `parseMetadata` makes it: a map (empty or null:
/// none), each value as `structpb` holds it (numbers as doubles, maps with their keys as text,
/// lists, strings, booleans, null), within [`MAX_METADATA_DEPTH`] and [`MAX_METADATA_BYTES`].
fn metadata(yaml: &Value) -> Result<Option<Struct>, String> {
    let refused = |why: String| format!("error parsing metadata: {why}");
    let fields = match yaml {
        Value::Null => return Ok(None),
        Value::Mapping(map) => fields(map, 1).map_err(refused)?,
        Value::Tagged(tagged) => return metadata(&tagged.value),
        other => return Err(refused(format!("{} is not a map", scalar_text(other)))),
    };
    if fields.is_empty() {
        return Ok(None);
    }
    let built = Struct { fields };
    let bytes = built.encoded_len();
    if bytes > MAX_METADATA_BYTES {
        return Err(refused(format!("{bytes} bytes encoded, more than {MAX_METADATA_BYTES}")));
    }
    Ok(Some(built))
}

fn fields(
    map: &serde_yaml_ng::Mapping,
    depth: usize,
) -> Result<std::collections::HashMap<String, ProtoValue>, String> {
    if depth > MAX_METADATA_DEPTH {
        return Err(format!("maps and lists nest deeper than {MAX_METADATA_DEPTH} levels"));
    }
    let mut out = std::collections::HashMap::with_capacity(map.len());
    for (k, v) in map {
        // Go's fmt.Sprintf("%v", key), as upstream's convertMap: any scalar key as its text.
        let key = match k {
            Value::Sequence(_) | Value::Mapping(_) => return Err("a key is a list or a map".into()),
            other => scalar_text(other),
        };
        out.insert(key, proto_value(v, depth)?);
    }
    Ok(out)
}

fn proto_value(v: &Value, depth: usize) -> Result<ProtoValue, String> {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Sequence(items) => {
            if depth >= MAX_METADATA_DEPTH {
                return Err(format!("maps and lists nest deeper than {MAX_METADATA_DEPTH} levels"));
            }
            let values = items.iter().map(|i| proto_value(i, depth + 1)).collect::<Result<_, _>>()?;
            Kind::ListValue(ListValue { values })
        }
        Value::Mapping(map) => Kind::StructValue(Struct { fields: fields(map, depth + 1)? }),
        Value::Tagged(tagged) => return proto_value(&tagged.value, depth),
    };
    Ok(ProtoValue { kind: Some(kind) })
}

// -------------------------------------------------------------------------------------------
// Building the tree

/// A `rate_limit` as upstream's loader checks it (its messages), then as Tollgate decides it:
/// unlimited, a block (0 requests), or a rule.
fn limit(spec: &RateLimitSpec) -> Result<Limit, Mistake> {
    let unit = unit(spec).map_err(|m| Mistake::from(m).under(&[Step::Field("unit")]))?;
    let replaces = replaces(spec)?;
    let name = spec.name.clone().filter(|n| !n.is_empty());
    let requests_per_unit = spec.requests_per_unit.unwrap_or(0);
    let Some(unit) = unit else {
        if spec.algorithm.is_some() || spec.unit_multiplier.is_some() || spec.burst.is_some() {
            return Err(
                String::from("an unlimited limit takes no algorithm, unit_multiplier nor burst").into()
            );
        }
        let kind = LimitKind::Unlimited;
        return Ok(Limit { name, kind, requests_per_unit, unit: None, window_secs: 0, replaces });
    };
    let period = window(unit, spec.unit_multiplier)
        .map_err(|m| Mistake::from(m).under(&[Step::Field("unit_multiplier")]))?;
    let kind = match requests_per_unit {
        0 => LimitKind::Block,
        n => LimitKind::Rule(rule(spec, u64::from(n), period, name.as_ref())?),
    };
    let window_secs = period.as_duration().as_secs();
    Ok(Limit { name, kind, requests_per_unit, unit: Some(unit), window_secs, replaces })
}

/// The limit's unit: `None` exactly when it is `unlimited`.
fn unit(spec: &RateLimitSpec) -> Result<Option<Unit>, String> {
    let unit_text = spec.unit.as_deref().unwrap_or("");
    let unit = Unit::parse(unit_text);
    if spec.unlimited && unit.is_some() {
        return Err("should not specify rate limit unit when unlimited".into());
    }
    if !spec.unlimited && unit.is_none() {
        return Err(format!("invalid rate limit unit '{unit_text}'"));
    }
    Ok(unit)
}

/// The names the limit replaces: none empty, nor its own.
fn replaces(spec: &RateLimitSpec) -> Result<Vec<String>, Mistake> {
    let replaces: Vec<String> =
        spec.replaces.iter().flatten().map(|r| r.name.clone().unwrap_or_default()).collect();
    for (i, r) in replaces.iter().enumerate() {
        let refuse =
            |m: &str| Err(Mistake::from(m.to_owned()).under(&[Step::Field("replaces"), Step::Index(i)]));
        if r.is_empty() {
            return refuse("should not have an empty replaces entry");
        }
        if Some(r) == spec.name.as_ref() {
            return refuse("replaces should not contain name of same descriptor");
        }
    }
    Ok(replaces)
}

/// The window: `unit` x `unit_multiplier`, at most a year.
fn window(unit: Unit, multiplier: Option<u64>) -> Result<Period, String> {
    let multiplier = multiplier.unwrap_or(1);
    if multiplier == 0 {
        return Err("unit_multiplier must be at least 1".into());
    }
    unit.seconds()
        .checked_mul(multiplier)
        .and_then(|s| Period::from_secs(s).ok())
        .ok_or_else(|| "the window (unit x unit_multiplier) must be at most a year".into())
}

/// The rule of `n` requests per `period` under the limit's algorithm, validated alone (bounds,
/// exactness); a node's limits are validated together when the tree is built.
fn rule(spec: &RateLimitSpec, n: u64, period: Period, name: Option<&String>) -> Result<Rule, String> {
    let rule = match spec.algorithm.unwrap_or_default() {
        LimitAlgorithm::FixedWindow => Rule::fixed_window(n, period),
        LimitAlgorithm::SlidingWindowLog => Rule::sliding_window_log(n, period),
        LimitAlgorithm::SlidingWindowCounter => Rule::sliding_window_counter(n, period),
        LimitAlgorithm::TokenBucket => Rule::token_bucket(spec.burst.unwrap_or(n), n, period),
        LimitAlgorithm::Gcra => Rule::gcra(n, period, spec.burst.unwrap_or(1)),
    };
    let rule = match name {
        Some(name) => rule.named(name.clone()),
        None => rule,
    };
    RuleSet::new([rule.clone()]).map_err(|e| e.to_string())?;
    Ok(rule)
}

/// One descriptor as written, validated, under `path` (upstream's dotted key path, such as
/// `edge.path_/api*.`).
fn node(path: &str, spec: &DescriptorSpec, joined: &str, depth: usize) -> Result<Node, Mistake> {
    let at = |m: String| format!("{m} (at '{path}{joined}')");
    // The same mistake, its message naming the descriptor, its place `steps` within it.
    let within = |steps: &[Step], m: Mistake| Mistake { message: at(m.message), at: m.at }.under(steps);
    if depth > MAX_DEPTH {
        return Err(at(format!("descriptors nest deeper than {MAX_DEPTH} levels")).into());
    }
    if spec.share_threshold && !joined.contains('*') {
        return Err(Mistake::from(at(format!(
            "share_threshold can only be used with wildcard values (containing '*'), but found key '{joined}'"
        )))
        .under(&[Step::Field("share_threshold")]));
    }
    let mut out = Node {
        key: spec.key.clone().unwrap_or_default(),
        value: spec.value.clone().filter(|v| !v.is_empty()),
        shadow_mode: spec.shadow_mode,
        quota_mode: spec.quota_mode,
        detailed_metric: spec.detailed_metric,
        value_to_metric: spec.value_to_metric,
        share_threshold: spec.share_threshold,
        metadata: spec
            .metadata
            .as_ref()
            .map(metadata)
            .transpose()
            .map_err(|m| within(&[Step::Field("metadata")], m.into()))?
            .flatten(),
        ..Node::default()
    };
    let list = spec.rate_limits.as_deref().unwrap_or_default();
    if spec.rate_limit.is_some() && !list.is_empty() {
        let both = "give rate_limit or rate_limits, not both".to_owned();
        return Err(within(&[Step::Field("rate_limits")], both.into()));
    }
    for (i, l) in spec.rate_limit.iter().chain(list).enumerate() {
        let place = if spec.rate_limit.is_some() {
            [Step::Field("rate_limit")].as_slice()
        } else {
            &[Step::Field("rate_limits"), Step::Index(i)]
        };
        let built = limit(l).map_err(|m| within(place, m))?;
        if built.kind == LimitKind::Unlimited && spec.rate_limit.is_none() {
            return Err(within(place, "rate_limits takes limits, not unlimited".to_owned().into()));
        }
        out.limits.push(built);
    }
    // A node's limits are checked together at every request: they must form a rule set.
    let rules: Vec<Rule> = out
        .limits
        .iter()
        .filter_map(|l| match &l.kind {
            LimitKind::Rule(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    if !rules.is_empty() {
        let set = RuleSet::new(rules)
            .map_err(|e| within(&[Step::Field("rate_limits")], format!("rate_limits: {e}").into()))?;
        out.rules = Some(set);
    }
    let inner = format!("{path}{joined}.");
    add_children(&mut out, &inner, spec.descriptors.as_deref().unwrap_or_default(), depth + 1)?;
    Ok(out)
}

/// Adds `specs` (a `descriptors` list) under `into` (a domain's root when files of one domain
/// are merged); a mistake's steps start at the `descriptors` key.
fn add_children(into: &mut Node, path: &str, specs: &[DescriptorSpec], depth: usize) -> Result<(), Mistake> {
    for (i, spec) in specs.iter().enumerate() {
        let item = [Step::Field("descriptors"), Step::Index(i)];
        let key = spec.key.as_deref().unwrap_or_default();
        if key.is_empty() {
            let place = if spec.key.is_some() { &[Step::Field("key")][..] } else { &[] };
            return Err(Mistake::from(format!("descriptor has empty key (under '{path}')"))
                .under(place)
                .under(&item));
        }
        let joined = match spec.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{key}_{v}"),
            _ => key.to_owned(),
        };
        if into.children.contains_key(&joined) {
            return Err(
                Mistake::from(format!("duplicate descriptor composite key '{path}{joined}'")).under(&item)
            );
        }
        let built = node(path, spec, &joined, depth).map_err(|m| m.under(&item))?;
        if joined.contains('*') {
            let parts = joined.split('*').map(str::to_owned).collect();
            into.wildcards.push(Wildcard { joined: joined.clone(), parts });
        }
        into.children.insert(joined, built);
    }
    Ok(())
}

/// A file being read: its refusals name it and, when `numbered`, the line of the mistake.
struct Source<'a> {
    text: &'a str,
    origin: &'a str,
    /// Whether the file's lines mean something to its author (not so for the YAML Tollgate
    /// writes of an xDS resource).
    numbered: bool,
}

impl Source<'_> {
    /// The refusal of the file for `mistake`, at its node's line and column.
    fn refuse(&self, mistake: Mistake) -> EnvoyConfigError {
        let place = if self.numbered { locate(self.text, &mistake.at) } else { None };
        EnvoyConfigError {
            origin: self.origin.to_owned(),
            line: place.map(|(line, _)| line),
            column: place.map(|(_, column)| column),
            message: mistake.message,
        }
    }

    /// The refusal for the YAML parser's error, at its line and column when it gives them.
    fn loading(&self, e: &serde_yaml_ng::Error) -> EnvoyConfigError {
        let mut message = format!("error loading config file: {e}");
        let place = e.location().filter(|_| self.numbered).map(|l| (l.line(), l.column()));
        if let Some((line, column)) = place {
            // Said once, in front.
            let said = format!(" at line {line} column {column}");
            if message.ends_with(&said) {
                message.truncate(message.len() - said.len());
            }
        }
        EnvoyConfigError {
            origin: self.origin.to_owned(),
            line: place.map(|(line, _)| line),
            column: place.map(|(_, column)| column),
            message,
        }
    }
}

/// Reads one file as upstream does: its keys checked, then its fields. Answers the domain's
/// name and descriptors, and warnings.
fn read(source: &Source<'_>) -> Result<(String, Vec<DescriptorSpec>, Vec<String>), EnvoyConfigError> {
    let (text, origin) = (source.text, source.origin);
    let loading = |e: serde_yaml_ng::Error| source.loading(&e);
    let mut warnings = Vec::new();
    let spec: DomainSpec = match serde_yaml_ng::from_str::<Value>(text).map_err(loading)? {
        Value::Mapping(map) => {
            check_keys(&map, Place::Root, "", &mut warnings).map_err(|m| source.refuse(m))?;
            serde_yaml_ng::from_str(text).map_err(loading)?
        }
        // An empty file (or one of comments) has no domain.
        Value::Null => DomainSpec { domain: None, descriptors: None },
        other => {
            let holds =
                format!("error loading config file: the file holds {}, not a map", scalar_text(&other));
            return Err(source.refuse(holds.into()));
        }
    };
    let name = spec.domain.unwrap_or_default();
    if name.is_empty() {
        let empty = Mistake::from("config file cannot have empty domain".to_owned());
        return Err(source.refuse(empty.under(&[Step::Field("domain")])));
    }
    let warnings = warnings.into_iter().map(|w| format!("{origin}: {w}")).collect();
    Ok((name, spec.descriptors.unwrap_or_default(), warnings))
}

impl Domain {
    /// Parses and validates one YAML file; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Domain, EnvoyConfigError> {
        let mut config = Config::default();
        config.add_file(text, origin, false)?;
        Ok(config.domains.pop().unwrap_or_else(|| unreachable!("a file adds one domain")))
    }
}

/// Every domain of a set of files, and what was noticed while reading them.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The domains, in the order their first file was read.
    pub domains: Vec<Domain>,
    /// Upstream keys found where they mean nothing (accepted, as upstream accepts them).
    pub warnings: Vec<String>,
}

impl Config {
    /// Adds one file's domain. A domain already read is refused, or with `merge` (upstream's
    /// `MERGE_DOMAIN_CONFIG`) gets this file's descriptors too (a descriptor defined by both is
    /// refused).
    ///
    /// A refusal names `origin`, the line and column of the mistake's node in `text`, and the
    /// reason.
    pub fn add_file(&mut self, text: &str, origin: &str, merge: bool) -> Result<(), EnvoyConfigError> {
        self.add(&Source { text, origin, numbered: true }, merge)
    }

    /// [`Config::add_file`] for YAML Tollgate wrote itself (an xDS resource's): its refusals
    /// name no line.
    pub(crate) fn add_written(
        &mut self,
        text: &str,
        origin: &str,
        merge: bool,
    ) -> Result<(), EnvoyConfigError> {
        self.add(&Source { text, origin, numbered: false }, merge)
    }

    fn add(&mut self, source: &Source<'_>, merge: bool) -> Result<(), EnvoyConfigError> {
        let (name, descriptors, warnings) = read(source)?;
        let err = |m: Mistake| source.refuse(m);
        let path = format!("{name}.");
        match self.domains.iter_mut().find(|d| d.name == name) {
            Some(_) if !merge => {
                let twice = Mistake::from(format!("duplicate domain '{name}' in config file"));
                return Err(err(twice.under(&[Step::Field("domain")])));
            }
            Some(domain) => add_children(&mut domain.root, &path, &descriptors, 1).map_err(err)?,
            None => {
                let mut root = Node::default();
                add_children(&mut root, &path, &descriptors, 1).map_err(err)?;
                self.domains.push(Domain { name, root });
            }
        }
        self.warnings.extend(warnings);
        Ok(())
    }
}

// -------------------------------------------------------------------------------------------
// Matching

/// Whether `text` matches a wildcard cut at its `*`s: it starts with the first part, ends with
/// the last, and holds the parts between in order (each `*` matches any run, empty included).
fn wildcard_match(parts: &[String], text: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == text);
    };
    if text.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let Some(mut rest) = text.strip_prefix(first.as_str()).and_then(|r| r.strip_suffix(last.as_str())) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// What a request descriptor matched: the node its entries lead to and, per entry, the
/// wildcard value that entry is counted under when its node shares a threshold.
#[derive(Debug)]
pub struct Match<'a> {
    /// The node of the last entry.
    pub node: &'a Node,
    /// Per entry: `Some(pattern)` when the entry matched a `share_threshold` wildcard.
    pub shared: Shared<'a>,
    /// Upstream's stat key path below the domain (`path_/login`, `user.tier_gold`): per level
    /// the matched descriptor's `key_value` (a wildcard's pattern), or its `key` alone, with
    /// the request's value where `value_to_metric` asks for it (upstream's `GetLimit`).
    pub stat_path: String,
}

/// Per entry of a descriptor, the wildcard it is counted under (inline for the usual one or
/// two entries: this is made for every descriptor of every request).
pub type Shared<'a> = SmallVec<[Option<&'a str>; 2]>;

/// The child of `node` an entry leads to: its exact `key_value`, else the first wildcard that
/// matches it, else its key alone. The wildcard's `key_value` when one matched.
fn step<'a>(
    node: &'a Node,
    key: &str,
    value: &str,
    joined: &mut String,
) -> Option<(&'a Node, Option<&'a str>)> {
    // `key_value`, written into the caller's buffer: one allocation for the whole walk.
    joined.clear();
    joined.push_str(key);
    joined.push('_');
    joined.push_str(value);
    if let Some(next) = node.children.get(joined.as_str()) {
        return Some((next, None));
    }
    if let Some(w) = node.wildcards.iter().find(|w| wildcard_match(&w.parts, joined)) {
        return node.children.get(&w.joined).map(|next| (next, Some(w.joined.as_str())));
    }
    node.children.get(key).map(|next| (next, None))
}

/// The node a request descriptor's entries lead to, level by level (exact, first wildcard, key
/// alone); `None` when an entry matches nothing, when the request is deeper than the
/// configuration, or when it has no entries.
pub fn find<'a>(root: &'a Node, entries: &[(&str, &str)]) -> Option<Match<'a>> {
    let mut node = root;
    let mut shared: Shared<'a> = smallvec::smallvec![None; entries.len()];
    let mut stat_path = String::new();
    let mut joined = String::new();
    for (i, &(key, value)) in entries.iter().enumerate() {
        let (next, wildcard) = step(node, key, value, &mut joined)?;
        let prefix = &joined[..key.len() + 1];
        if let Some(joined) = wildcard.filter(|_| next.share_threshold) {
            // The pattern's value part, as upstream trims the entry's key from it.
            shared[i] = Some(joined.strip_prefix(prefix).unwrap_or(joined));
        }
        // The value this level puts in the stat key path, as upstream chooses it.
        let stat_value = match wildcard {
            Some(_) if shared[i].is_some() => shared[i].unwrap_or_default(),
            Some(_) if next.value_to_metric => value,
            Some(joined) => joined.strip_prefix(prefix).unwrap_or(joined),
            // Matched by `key_value` (a descriptor with a value, or a key holding the join).
            None if next.value.is_some() || next.key != key => value,
            None if next.value_to_metric => value,
            None => "",
        };
        if i > 0 {
            stat_path.push('.');
        }
        stat_path.push_str(key);
        if !stat_value.is_empty() {
            stat_path.push('_');
            stat_path.push_str(stat_value);
        }
        if i + 1 < entries.len() && next.is_leaf() {
            return None;
        }
        node = next;
    }
    (!entries.is_empty()).then_some(Match { node, shared, stat_path })
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
    rate_limit: {unit: MINUTE, requests_per_unit: 5, name: login}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: path
    value: /api/admin*
    rate_limit: {unit: Hour, requests_per_unit: 10}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 100, replaces: [{name: login}]}
        shadow_mode: yes
      - key: plan
  - key: tenant
    value: acme
    rate_limits:
      - {unit: second, requests_per_unit: 30, unit_multiplier: 30, algorithm: sliding_window_counter}
      - {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 20}
"#;

    fn limits(d: &Domain, pairs: &[(&str, &str)]) -> Option<Vec<u32>> {
        find(&d.root, pairs).map(|m| m.node.limits.iter().map(|l| l.requests_per_unit).collect())
    }

    #[test]
    fn exact_then_the_first_wildcard_then_the_key_alone() {
        let d = Domain::from_yaml(UPSTREAM, "t.yaml").unwrap();
        assert_eq!(limits(&d, &[("remote_address", "10.0.0.1")]), Some(vec![10]), "key alone: any value");
        assert_eq!(limits(&d, &[("path", "/login")]), Some(vec![5]), "exact value");
        assert_eq!(limits(&d, &[("path", "/api/orders")]), Some(vec![1000]), "wildcard");
        assert_eq!(
            limits(&d, &[("path", "/api/admin/users")]),
            Some(vec![1000]),
            "the first wildcard in file order, not the longest"
        );
        assert_eq!(limits(&d, &[("path", "/elsewhere")]), None, "no match: no limit");
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "free")]), Some(vec![100]));
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "pro")]), Some(vec![]), "a node without a limit");
        assert_eq!(limits(&d, &[("user", "u1")]), Some(vec![]));
        assert_eq!(limits(&d, &[("user", "u1"), ("plan", "free"), ("deeper", "x")]), None);
        assert_eq!(limits(&d, &[("tenant", "acme")]), Some(vec![30, 100]));
        assert_eq!(limits(&d, &[]), None, "no entries, no limit");
    }

    #[test]
    fn wildcards_match_anywhere_in_a_value() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        let yes = |p: &str, t: &str| assert!(wildcard_match(&parts(p), t), "{p} should match {t}");
        let no = |p: &str, t: &str| assert!(!wildcard_match(&parts(p), t), "{p} should not match {t}");
        yes("k_bar*b", "k_barb");
        yes("k_bar*b", "k_barxyzb");
        no("k_bar*b", "k_barbx");
        no("k_bar*b", "k_bar");
        yes("k_foo*bar*baz", "k_foobarbaz");
        yes("k_foo*bar*baz", "k_foo1bar2baz");
        no("k_foo*bar*baz", "k_foobazbar");
        no("k_foo*bar*baz", "k_foobarba");
        // The middle part must lie between the first and the last: "ab" is not "a" + "b" + "ab".
        no("k_a*b*ab", "k_ab");
        yes("k_*", "k_");
        yes("k_x", "k_x");
        no("k_x", "k_y");
    }

    #[test]
    fn shared_thresholds_name_the_pattern() {
        let d = Domain::from_yaml(
            "domain: d\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: other\n    value: o*\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
            "s.yaml",
        )
        .unwrap();
        let m = find(&d.root, &[("files", "files/a.pdf")]).unwrap();
        assert_eq!(m.shared[..], [Some("files/*")]);
        let m = find(&d.root, &[("other", "o1")]).unwrap();
        assert_eq!(m.shared[..], [None], "without share_threshold each value counts apart");
    }

    #[test]
    fn extensions_build_the_engine_rules() {
        let d = Domain::from_yaml(UPSTREAM, "t.yaml").unwrap();
        let node = find(&d.root, &[("tenant", "acme")]).unwrap().node;
        let rules: Vec<_> = node.limits.iter().map(|l| l.kind.clone()).collect();
        assert_eq!(
            rules,
            [
                LimitKind::Rule(Rule::sliding_window_counter(30, Period::from_secs(30).unwrap())),
                LimitKind::Rule(Rule::gcra(100, Period::MINUTE, 20))
            ]
        );
        let health = find(&d.root, &[("path", "/health")]).unwrap().node;
        assert_eq!(health.limits[0].kind, LimitKind::Unlimited);
        let free = find(&d.root, &[("user", "u"), ("plan", "free")]).unwrap().node;
        assert!(free.shadow_mode, "yes is true, as yaml.v2 reads it");
        assert_eq!(free.limits[0].replaces, ["login"]);
    }

    #[test]
    fn scalars_are_read_as_their_text() {
        let d = Domain::from_yaml(
            "domain: 42\ndescriptors:\n  - key: code\n    value: 007\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "n.yaml",
        )
        .unwrap();
        assert_eq!(d.name, "42");
        assert!(find(&d.root, &[("code", "007")]).is_some(), "007 stays 007");
    }

    #[test]
    fn metadata_becomes_a_struct_as_upstream_builds_it() {
        let d = Domain::from_yaml(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {n: 3, f: 1.5, b: yes, t: true, s: text, z: null, 7: seven, l: [1, {x: y}]}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: empty\n    metadata: {}\n",
            "m.yaml",
        )
        .unwrap();
        let node = find(&d.root, &[("k", "v")]).unwrap().node;
        let m = node.metadata.as_ref().unwrap();
        let kind = |k: &str| m.fields[k].kind.clone().unwrap();
        assert_eq!(kind("n"), Kind::NumberValue(3.0), "numbers are doubles, as structpb holds them");
        assert_eq!(kind("f"), Kind::NumberValue(1.5));
        // YAML 1.2's booleans: `yes` stays text, where upstream's yaml.v2 (YAML 1.1) reads true.
        assert_eq!(kind("b"), Kind::StringValue("yes".into()));
        assert_eq!(kind("t"), Kind::BoolValue(true));
        assert_eq!(kind("s"), Kind::StringValue("text".into()));
        assert_eq!(kind("z"), Kind::NullValue(0));
        assert_eq!(kind("7"), Kind::StringValue("seven".into()), "a key as its text");
        let Kind::ListValue(list) = kind("l") else { panic!("a list") };
        assert_eq!(list.values.len(), 2);
        assert!(find(&d.root, &[("empty", "v")]).unwrap().node.metadata.is_none());
    }

    #[test]
    fn metadata_that_no_client_could_read_is_refused() {
        let bad = |yaml: &str| Domain::from_yaml(yaml, "b.yaml").unwrap_err().to_string();
        let e = bad("domain: d\ndescriptors:\n  - key: k\n    metadata: 5\n");
        assert!(e.contains("error parsing metadata: 5 is not a map (at 'd.k')"), "{e}");
        // Nested deeper than a protobuf decoder reads: refused, where upstream would send it.
        let deep = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {}1{}\n",
            "{a: ".repeat(17),
            "}".repeat(17)
        );
        assert!(bad(&deep).contains("nest deeper than 16"), "{}", bad(&deep));
        let lists = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}1{}}}\n",
            "[".repeat(16),
            "]".repeat(16)
        );
        assert!(bad(&lists).contains("nest deeper than 16"), "{}", bad(&lists));
        let fine = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {}1{}\n",
            "{a: ".repeat(16),
            "}".repeat(16)
        );
        Domain::from_yaml(&fine, "ok.yaml").unwrap();
        // Sent in every answer: bounded.
        let huge =
            format!("domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}}}\n", "x".repeat(70_000));
        assert!(bad(&huge).contains("more than 65536"), "{}", bad(&huge));
    }

    #[test]
    fn the_dump_prints_each_limit_as_upstream() {
        let d = Domain::from_yaml(UPSTREAM, "t.yaml").unwrap();
        let dump = d.dump();
        for line in [
            "edge.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false\n",
            "edge.path_/login: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n",
            "edge.path_/health: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
            "edge.user.plan_free: unit=DAY requests_per_unit=100, shadow_mode: true, quota_mode: false\n",
            "edge.tenant_acme: unit=SECOND requests_per_unit=30, shadow_mode: false, quota_mode: false, algorithm: sliding_window_counter, window: 30s\n",
            "edge.tenant_acme: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: gcra, window: 60s\n",
        ] {
            assert!(dump.contains(line), "{line} missing from:\n{dump}");
        }
        assert_eq!(dump.lines().count(), 8, "one line per limit; user and plan have none:\n{dump}");
        assert!(dump.lines().is_sorted(), "{dump}");
    }

    #[test]
    fn mistakes_are_refused_with_their_reason() {
        let bad = |yaml: &str| Domain::from_yaml(yaml, "b.yaml").unwrap_err().to_string();
        let e = bad(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        );
        assert!(e.starts_with("b.yaml:4: invalid rate limit unit 'fortnight' (at 'd.k')"), "{e}");
        assert!(
            bad("domain: d\ndescriptors:\n  - key: k\n    colour: red\n").contains("unknown key 'colour'")
        );
        let e = bad(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
        );
        assert!(e.starts_with("b.yaml:4:"), "the parser's line: {e}");
        assert!(!e.contains("line 4"), "said once: {e}");
        assert!(bad("domain: ''\n").contains("config file cannot have empty domain"));
        assert!(bad("").contains("config file cannot have empty domain"));
        assert!(bad("# nothing but a comment\n").contains("config file cannot have empty domain"));
        assert!(bad("- a\n").contains("not a map"));
    }

    /// The line of the mistake in `yaml`, with its message.
    fn refused_at(yaml: &str) -> (usize, String) {
        let e = Domain::from_yaml(yaml, "limits.yaml").unwrap_err();
        let message = e.to_string();
        let line = e.line.unwrap_or_else(|| panic!("no line: {message}"));
        assert!(e.column.is_some(), "{message}");
        let prefix = format!("limits.yaml:{line}: ");
        assert!(message.starts_with(&prefix), "{message}");
        (line, message)
    }

    #[test]
    fn refusals_name_the_line_of_the_mistake() {
        let head = "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n";
        for (tail, line, reason) in [
            // An unknown unit, in a nested descriptor: the unit's own line.
            (
                "  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          requests_per_unit: 1\n          unit: UNKNOWN\n",
                13,
                "invalid rate limit unit 'UNKNOWN' (at 'edge.a.b')",
            ),
            // No unit at all: the rate_limit's map.
            ("  - key: a\n    rate_limit: {requests_per_unit: 1}\n", 9, "invalid rate limit unit ''"),
            // A replaces entry without a name, or naming its own limit: the entry.
            (
                "  - key: a\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n      replaces:\n        - name: x\n        - name: ''\n",
                14,
                "should not have an empty replaces entry",
            ),
            (
                "  - key: a\n    rate_limit:\n      name: me\n      unit: hour\n      requests_per_unit: 1\n      replaces: [{name: me}]\n",
                13,
                "replaces should not contain name of same descriptor",
            ),
            // The second descriptor of the same key and value.
            (
                "  - key: other\n  - key: path\n    value: /login\n",
                9,
                "duplicate descriptor composite key 'edge.path_/login'",
            ),
            // An empty key, or none.
            ("  - key: x\n  - value: v\n    key: ''\n", 10, "descriptor has empty key (under 'edge.')"),
            ("  - value: v\n", 8, "descriptor has empty key"),
            // The parser's own refusals: a negative count, a word where a flag goes.
            (
                "  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: -1\n",
                11,
                "invalid type: integer `-1`, expected u32",
            ),
            ("  - key: a\n    shadow_mode: maybe\n", 9, "\"maybe\" is not a boolean"),
            // Upstream's key and type checks: the key, or the value.
            ("  - key: a\n    rate_limit: {unit: day}\n    colour: red\n", 10, "unknown key 'colour'"),
            ("  - key: a\n    burst: 3\n", 9, "'burst' does not belong here"),
            ("  - key: a\n    7: seven\n", 9, "key is not of type string"),
            ("  - just a word\n", 8, "list of type other than map"),
            ("  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1.5}\n", 9, "is not an integer"),
            // The rest of the checks.
            ("  - key: a\n    share_threshold: true\n", 9, "share_threshold can only be used with wildcard"),
            (
                "  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 1\n      unit_multiplier: 400\n",
                12,
                "at most a year",
            ),
            (
                "  - key: a\n    rate_limits:\n      - {unit: day, requests_per_unit: 1}\n      - {unlimited: true}\n",
                11,
                "not unlimited",
            ),
            ("  - key: a\n    metadata: [1]\n", 9, "is not a map"),
        ] {
            let (at, message) = refused_at(&format!("{head}{tail}"));
            assert!(message.contains(reason), "{message} lacks {reason}");
            assert_eq!(at, line, "{message}\n{head}{tail}");
        }
    }

    #[test]
    fn refusals_of_the_whole_file_name_its_domain_line() {
        let (line, e) = refused_at("# limits\n\ndomain: ''\ndescriptors: []\n");
        assert_eq!(line, 3, "{e}");
        let mut config = Config::default();
        config.add_file("domain: edge\ndescriptors:\n  - key: path\n", "a.yaml", false).unwrap();
        let e = config.add_file("# again\ndomain: edge\n", "b.yaml", false).unwrap_err().to_string();
        assert!(e.starts_with("b.yaml:2: duplicate domain 'edge'"), "{e}");
        // Merged, a descriptor the first file defined: the second file's line.
        let e = config.add_file("domain: edge\ndescriptors:\n  - key: k\n  - key: path\n", "b.yaml", true);
        let e = e.unwrap_err().to_string();
        assert!(e.starts_with("b.yaml:4: duplicate descriptor composite key 'edge.path'"), "{e}");
    }
}
