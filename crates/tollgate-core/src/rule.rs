//! [`Rule`]: one limit, by algorithm and parameters, as a caller or a configuration file writes it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Period;

/// One limit: an optional name (for reporting) and what it limits.
///
/// Rules are plain data; [`RuleSet::new`](crate::RuleSet::new) validates them. In JSON or TOML a
/// rule is written with its algorithm in the `algorithm` field:
///
/// ```
/// use tollgate_core::{Period, Rule};
///
/// let rule: Rule = serde_json::from_str(
///     r#"{"name": "burst", "algorithm": "fixed_window", "limit": 10, "period": "1s"}"#,
/// ).unwrap();
/// assert_eq!(rule, Rule::fixed_window(10, Period::SECOND).named("burst"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawRule")]
pub struct Rule {
    /// A name for reports and headers; optional, and not part of the rule's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The algorithm and its parameters.
    #[serde(flatten)]
    pub kind: RuleKind,
}

/// The algorithm of a [`Rule`] and its parameters.
///
/// Serialized with its algorithm in an `algorithm` field; read only as part of a [`Rule`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum RuleKind {
    /// At most `limit` units per window of length `period`.
    FixedWindow {
        /// Units admitted per window.
        limit: u64,
        /// Window length.
        period: Period,
        /// Where windows start.
        #[serde(default)]
        align: Align,
    },
    /// At most `limit` units in any interval of length `period`, exactly; stores one entry per
    /// distinct time units were admitted at (up to one per unit), so `limit` is capped at
    /// [`MAX_LOG_LIMIT`](crate::limits::MAX_LOG_LIMIT).
    SlidingWindowLog {
        /// Units admitted per sliding period.
        limit: u64,
        /// Length of the sliding period.
        period: Period,
    },
    /// Approximately `limit` units per sliding `period` in O(1) space: the previous clock window's
    /// count weighted by its overlap with the sliding period, plus the current window's count.
    SlidingWindowCounter {
        /// Units admitted per period.
        limit: u64,
        /// Length of the period.
        period: Period,
    },
    /// A bucket of `capacity` tokens, full at first, refilled continuously at `refill` tokens per
    /// `per`; a request takes `cost` tokens.
    TokenBucket {
        /// Most tokens the bucket holds.
        capacity: u64,
        /// Tokens added per `per`.
        refill: u64,
        /// The refill interval.
        per: Period,
    },
    /// Generic cell rate algorithm: a sustained rate of `limit` per `period` (one request every
    /// `period / limit`), with up to `burst` requests at once.
    Gcra {
        /// Requests per period at the sustained rate.
        limit: u64,
        /// The period of the rate.
        period: Period,
        /// Requests admitted at once from idle (at least 1).
        burst: u64,
    },
    /// At most `limit` units held at once by leases; a lease not released expires after `lease`.
    Concurrency {
        /// Units held at once.
        limit: u64,
        /// How long an unreleased lease holds its units.
        lease: Period,
    },
}

/// Where the windows of a fixed-window rule start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Align {
    /// On multiples of the period since the Unix epoch, the same for every key.
    #[default]
    Clock,
    /// At each key's first request after its previous window closed.
    FirstHit,
}

/// The algorithm of a rule, without its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlgorithmName {
    /// [`RuleKind::FixedWindow`].
    FixedWindow,
    /// [`RuleKind::SlidingWindowLog`].
    SlidingWindowLog,
    /// [`RuleKind::SlidingWindowCounter`].
    SlidingWindowCounter,
    /// [`RuleKind::TokenBucket`].
    TokenBucket,
    /// [`RuleKind::Gcra`].
    Gcra,
    /// [`RuleKind::Concurrency`].
    Concurrency,
}

impl AlgorithmName {
    /// The algorithm's name as written in configuration (`"fixed_window"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            AlgorithmName::FixedWindow => "fixed_window",
            AlgorithmName::SlidingWindowLog => "sliding_window_log",
            AlgorithmName::SlidingWindowCounter => "sliding_window_counter",
            AlgorithmName::TokenBucket => "token_bucket",
            AlgorithmName::Gcra => "gcra",
            AlgorithmName::Concurrency => "concurrency",
        }
    }
}

impl AlgorithmName {
    /// Every algorithm.
    pub const ALL: [AlgorithmName; 6] = [
        AlgorithmName::FixedWindow,
        AlgorithmName::SlidingWindowLog,
        AlgorithmName::SlidingWindowCounter,
        AlgorithmName::TokenBucket,
        AlgorithmName::Gcra,
        AlgorithmName::Concurrency,
    ];

    /// The parameters a rule of this algorithm takes: required ones, then optional ones.
    pub const fn parameters(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            AlgorithmName::FixedWindow => (&["limit", "period"], &["align"]),
            AlgorithmName::SlidingWindowLog | AlgorithmName::SlidingWindowCounter => {
                (&["limit", "period"], &[])
            }
            AlgorithmName::TokenBucket => (&["capacity", "refill", "per"], &[]),
            AlgorithmName::Gcra => (&["limit", "period", "burst"], &[]),
            AlgorithmName::Concurrency => (&["limit", "lease"], &[]),
        }
    }
}

const ALGORITHM_NAMES: &[&str] =
    &["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra", "concurrency"];

impl std::str::FromStr for AlgorithmName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        AlgorithmName::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| format!("unknown algorithm `{s}`, expected one of {}", ALGORITHM_NAMES.join(", ")))
    }
}

// Only a name: serde's derived enums would also take a number as the variant's position.
impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AlgorithmName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an algorithm name: {}", ALGORITHM_NAMES.join(", "))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AlgorithmName, E> {
                v.parse().map_err(|_| E::unknown_variant(v, ALGORITHM_NAMES))
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// A rule as written: every parameter of every algorithm, checked against the algorithm's
/// own list when turned into a [`Rule`]. A plain struct (not a tagged enum, which buffers its
/// fields) so that errors keep the path of the field at fault.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: Option<String>,
    algorithm: AlgorithmName,
    limit: Option<u64>,
    period: Option<Period>,
    align: Option<Align>,
    capacity: Option<u64>,
    refill: Option<u64>,
    per: Option<Period>,
    burst: Option<u64>,
    lease: Option<Period>,
}

impl TryFrom<RawRule> for Rule {
    type Error = String;

    fn try_from(raw: RawRule) -> Result<Rule, String> {
        let algorithm = raw.algorithm;
        let given = [
            ("limit", raw.limit.is_some()),
            ("period", raw.period.is_some()),
            ("align", raw.align.is_some()),
            ("capacity", raw.capacity.is_some()),
            ("refill", raw.refill.is_some()),
            ("per", raw.per.is_some()),
            ("burst", raw.burst.is_some()),
            ("lease", raw.lease.is_some()),
        ];
        let (required, optional) = algorithm.parameters();
        // The messages name the field the way serde's own do, so callers can point at it.
        if let Some((field, _)) =
            given.iter().find(|(f, set)| *set && !required.contains(f) && !optional.contains(f))
        {
            let all: Vec<&str> = required.iter().chain(optional).copied().collect();
            return Err(format!("unknown field `{field}`: {algorithm} takes {}", all.join(", ")));
        }
        if let Some(field) = required.iter().find(|f| !given.iter().any(|(g, set)| g == *f && *set)) {
            return Err(format!("missing field `{field}` ({algorithm} takes {})", required.join(", ")));
        }
        let (limit, period, per, lease) = (raw.limit.unwrap_or(0), raw.period, raw.per, raw.lease);
        let kind = match algorithm {
            AlgorithmName::FixedWindow => RuleKind::FixedWindow {
                limit,
                period: period.unwrap_or(Period::SECOND),
                align: raw.align.unwrap_or_default(),
            },
            AlgorithmName::SlidingWindowLog => {
                RuleKind::SlidingWindowLog { limit, period: period.unwrap_or(Period::SECOND) }
            }
            AlgorithmName::SlidingWindowCounter => {
                RuleKind::SlidingWindowCounter { limit, period: period.unwrap_or(Period::SECOND) }
            }
            AlgorithmName::TokenBucket => RuleKind::TokenBucket {
                capacity: raw.capacity.unwrap_or(0),
                refill: raw.refill.unwrap_or(0),
                per: per.unwrap_or(Period::SECOND),
            },
            AlgorithmName::Gcra => RuleKind::Gcra {
                limit,
                period: period.unwrap_or(Period::SECOND),
                burst: raw.burst.unwrap_or(0),
            },
            AlgorithmName::Concurrency => {
                RuleKind::Concurrency { limit, lease: lease.unwrap_or(Period::SECOND) }
            }
        };
        Ok(Rule { name: raw.name, kind })
    }
}

impl fmt::Display for AlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RuleKind {
    /// The algorithm of this rule.
    pub const fn algorithm(&self) -> AlgorithmName {
        match self {
            RuleKind::FixedWindow { .. } => AlgorithmName::FixedWindow,
            RuleKind::SlidingWindowLog { .. } => AlgorithmName::SlidingWindowLog,
            RuleKind::SlidingWindowCounter { .. } => AlgorithmName::SlidingWindowCounter,
            RuleKind::TokenBucket { .. } => AlgorithmName::TokenBucket,
            RuleKind::Gcra { .. } => AlgorithmName::Gcra,
            RuleKind::Concurrency { .. } => AlgorithmName::Concurrency,
        }
    }
}

impl Rule {
    fn of(kind: RuleKind) -> Self {
        Rule { name: None, kind }
    }

    /// `limit` units per clock-aligned window of `period`.
    pub fn fixed_window(limit: u64, period: Period) -> Self {
        Self::of(RuleKind::FixedWindow { limit, period, align: Align::Clock })
    }

    /// `limit` units per window of `period` that opens at a key's first request.
    pub fn fixed_window_from_first_hit(limit: u64, period: Period) -> Self {
        Self::of(RuleKind::FixedWindow { limit, period, align: Align::FirstHit })
    }

    /// Exactly `limit` units in any interval of `period`.
    pub fn sliding_window_log(limit: u64, period: Period) -> Self {
        Self::of(RuleKind::SlidingWindowLog { limit, period })
    }

    /// Approximately `limit` units per sliding `period`, in constant space.
    pub fn sliding_window_counter(limit: u64, period: Period) -> Self {
        Self::of(RuleKind::SlidingWindowCounter { limit, period })
    }

    /// A bucket of `capacity` tokens refilled at `refill` tokens per `per`.
    pub fn token_bucket(capacity: u64, refill: u64, per: Period) -> Self {
        Self::of(RuleKind::TokenBucket { capacity, refill, per })
    }

    /// GCRA: `limit` requests per `period`, `burst` at once.
    pub fn gcra(limit: u64, period: Period, burst: u64) -> Self {
        Self::of(RuleKind::Gcra { limit, period, burst })
    }

    /// At most `limit` units held at once; leases expire after `lease`.
    pub fn concurrency(limit: u64, lease: Period) -> Self {
        Self::of(RuleKind::Concurrency { limit, lease })
    }

    /// This rule with a name for reports.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The rule's algorithm.
    pub const fn algorithm(&self) -> AlgorithmName {
        self.kind.algorithm()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_json() {
        let rules = [
            Rule::fixed_window(10, Period::SECOND),
            Rule::fixed_window_from_first_hit(10, Period::MINUTE).named("x"),
            Rule::sliding_window_log(5, Period::HOUR),
            Rule::sliding_window_counter(100, Period::DAY),
            Rule::token_bucket(20, 5, Period::SECOND),
            Rule::gcra(10, Period::SECOND, 3),
            Rule::concurrency(4, Period::from_secs(30).unwrap()),
        ];
        for rule in rules {
            let json = serde_json::to_string(&rule).unwrap();
            assert!(json.contains(&format!("\"algorithm\":\"{}\"", rule.algorithm())), "{json}");
            assert_eq!(serde_json::from_str::<Rule>(&json).unwrap(), rule);
        }
    }

    #[test]
    fn unknown_parameters_are_refused() {
        let err = serde_json::from_str::<Rule>(
            r#"{"name": "x", "algorithm": "fixed_window", "limit": 1, "period": "1s", "perod": "2s"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `perod`"), "{err}");
        let err = serde_json::from_str::<Rule>(r#"{"algorithm": "leaky", "limit": 1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `leaky`"), "{err}");
    }

    #[test]
    fn parameters_must_belong_to_the_algorithm() {
        let err = |json: &str| serde_json::from_str::<Rule>(json).unwrap_err().to_string();
        let e = err(r#"{"algorithm": "fixed_window", "limit": 1, "period": "1s", "burst": 2}"#);
        assert!(e.starts_with("unknown field `burst`: fixed_window takes limit, period, align"), "{e}");
        let e = err(r#"{"algorithm": "gcra", "limit": 1, "period": "1s"}"#);
        assert!(e.starts_with("missing field `burst`"), "{e}");
        let e = err(r#"{"algorithm": 0, "limit": 1, "period": "1s"}"#);
        assert!(e.contains("invalid type: integer `0`, expected an algorithm name"), "{e}");
    }

    #[test]
    fn align_defaults_to_clock() {
        let rule: Rule =
            serde_json::from_str(r#"{"algorithm": "fixed_window", "limit": 1, "period": 1000}"#).unwrap();
        assert!(matches!(rule.kind, RuleKind::FixedWindow { align: Align::Clock, .. }));
    }
}
