//! [`RuleSet`]: rules validated and compiled once, then checked together.

use std::sync::Arc;

use crate::algorithm::{self, Admission, AnyAlgorithm};
use crate::decision::Row;
use crate::limits::{MAX_CONCURRENCY_LIMIT, MAX_COUNT, MAX_LOG_LIMIT, MAX_NAME_BYTES, MAX_RULES};
use crate::{AlgorithmName, Rule, RuleError, RuleKind};

#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub(crate) rule: Rule,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) signature: Arc<str>,
    pub(crate) algorithm: AnyAlgorithm,
    /// `algorithm`'s capacity and `rule`'s algorithm name, kept: every outcome reports both,
    /// and each is a `match` to work out.
    pub(crate) capacity: u64,
    pub(crate) algorithm_name: AlgorithmName,
    /// In a packed set, the prefix of this rule's fields in the shared hash (`<id>.`); else "".
    pub(crate) field_prefix: Arc<str>,
}

impl CompiledRule {
    /// The rule's row from its state's admission, with no report yet ([`Row::report`] fills
    /// it in once every rule has decided).
    #[inline(always)]
    pub(crate) fn row(&self, admission: Admission) -> Row {
        Row::admitted_or_waiting(admission.retry_after.unsigned_abs())
    }
}

/// A stable 8-character id of a signature: 48 bits of its FNV-1a hash, base64url. Field names
/// in shared hashes use it instead of the (longer) signature. Never change this function:
/// stored state is found by it.
pub(crate) fn short_id(signature: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in signature.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..8).map(|i| ALPHABET[((hash >> (i * 6)) & 63) as usize] as char).collect()
}

/// Rules checked together, all or nothing: validated and compiled once, cheap to clone.
///
/// ```
/// use tollgate_core::{Period, Rule, RuleSet, RuleError};
///
/// let rules = RuleSet::new([
///     Rule::fixed_window(10, Period::SECOND).named("per-second"),
///     Rule::token_bucket(100, 1, Period::SECOND).named("bucket"),
/// ])?;
/// assert_eq!(rules.len(), 2);
///
/// let err = RuleSet::new([Rule::sliding_window_log(50_000, Period::MINUTE)]).unwrap_err();
/// assert!(matches!(err, RuleError::LogLimitTooLarge { .. }));
/// assert!(err.to_string().contains("use sliding_window_counter"));
/// # Ok::<(), RuleError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RuleSet {
    rules: Arc<[CompiledRule]>,
    has_concurrency: bool,
    /// The smallest capacity of the rules: a cost up to it fits every rule.
    min_capacity: u64,
    /// This set's identity, shared by its clones and by no other set (see [`RuleSet::id`]).
    id: u64,
}

/// The last [`RuleSet::id`] given.
static LAST_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn check_range(index: usize, field: &'static str, value: u64, min: u64, max: u64) -> Result<(), RuleError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(RuleError::OutOfRange { index, field, value, min, max })
    }
}

fn validate(index: usize, rule: &Rule) -> Result<(), RuleError> {
    if let Some(name) = &rule.name
        && name.len() > MAX_NAME_BYTES
    {
        return Err(RuleError::NameTooLong { index, len: name.len(), max: MAX_NAME_BYTES });
    }
    let count = |field, value| check_range(index, field, value, 1, MAX_COUNT);
    match rule.kind {
        RuleKind::FixedWindow { limit, .. } | RuleKind::SlidingWindowCounter { limit, .. } => {
            count("limit", limit)
        }
        RuleKind::SlidingWindowLog { limit, .. } => {
            count("limit", limit)?;
            if limit > MAX_LOG_LIMIT {
                return Err(RuleError::LogLimitTooLarge { index, limit, max: MAX_LOG_LIMIT });
            }
            Ok(())
        }
        RuleKind::TokenBucket { capacity, refill, .. } => {
            count("capacity", capacity)?;
            count("refill", refill)
        }
        RuleKind::Gcra { limit, burst, .. } => {
            count("limit", limit)?;
            count("burst", burst)
        }
        RuleKind::Concurrency { limit, .. } => check_range(index, "limit", limit, 1, MAX_CONCURRENCY_LIMIT),
    }
}

fn inexact(index: usize, kind: &RuleKind) -> RuleError {
    let (capacity, refill, per) = match *kind {
        RuleKind::TokenBucket { capacity, refill, per } => (capacity, refill, per),
        RuleKind::Gcra { limit, period, burst } => (burst, limit, period),
        // Only rate-based rules can be inexact.
        RuleKind::FixedWindow { .. }
        | RuleKind::SlidingWindowLog { .. }
        | RuleKind::SlidingWindowCounter { .. }
        | RuleKind::Concurrency { .. } => (0, 0, crate::Period::MIN),
    };
    RuleError::Inexact { index, algorithm: kind.algorithm(), capacity, refill, per_micros: per.as_micros() }
}

impl RuleSet {
    /// Validates and compiles `rules` (at least one, at most
    /// [`MAX_RULES`](crate::limits::MAX_RULES), no two alike).
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Result<Self, RuleError> {
        let rules: Vec<Rule> = rules.into_iter().collect();
        if rules.is_empty() {
            return Err(RuleError::Empty);
        }
        if rules.len() > MAX_RULES {
            return Err(RuleError::TooMany { count: rules.len(), max: MAX_RULES });
        }
        let mut compiled: Vec<CompiledRule> = Vec::with_capacity(rules.len());
        for (index, rule) in rules.into_iter().enumerate() {
            validate(index, &rule)?;
            let algorithm = algorithm::compile(&rule.kind).map_err(|_| inexact(index, &rule.kind))?;
            let signature: Arc<str> = algorithm::signature(&rule.kind).into();
            if let Some(first) = compiled.iter().position(|c| c.signature == signature) {
                return Err(RuleError::Duplicate { index, first });
            }
            let name = rule.name.as_deref().map(Arc::from);
            let (capacity, algorithm_name) = (algorithm.capacity(), rule.algorithm());
            compiled.push(CompiledRule {
                rule,
                name,
                signature,
                algorithm,
                capacity,
                algorithm_name,
                field_prefix: Arc::from(""),
            });
        }
        // Hash-stored rules keep their fields in one hash per key (a key per rule would cost
        // Redis far more memory than its few fields), named by the rule's id, so the same rule
        // finds the same state from any rule set, as in memory. Two ids of one set alike (a
        // 2^-48 chance) would share fields: that set keeps a key per rule instead.
        let hashed: Vec<usize> =
            (0..compiled.len()).filter(|&i| compiled[i].algorithm.hash_fields().is_some()).collect();
        let ids: Vec<String> = hashed.iter().map(|&i| short_id(&compiled[i].signature)).collect();
        if ids.iter().enumerate().all(|(i, id)| !ids[..i].contains(id)) {
            for (&i, id) in hashed.iter().zip(ids) {
                compiled[i].field_prefix = format!("{id}.").into();
            }
        }
        let has_concurrency = compiled.iter().any(|c| c.algorithm.holds_leases());
        let min_capacity = compiled.iter().map(|c| c.algorithm.capacity()).min().unwrap_or(0);
        // Relaxed: the ids need only be distinct.
        let id = LAST_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(RuleSet { rules: compiled.into(), has_concurrency, min_capacity, id })
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Always false: a rule set has at least one rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules, in the order given.
    pub fn rules(&self) -> impl ExactSizeIterator<Item = &Rule> {
        self.rules.iter().map(|c| &c.rule)
    }

    /// Each rule's state identity, in order: its algorithm and parameters (not its name), such as
    /// `fw:100:60000000`. Backends name a key's state for a rule by it, so a changed rule never
    /// reads the old rule's state.
    pub fn signatures(&self) -> impl ExactSizeIterator<Item = &str> {
        self.rules.iter().map(|c| &*c.signature)
    }

    /// Whether any rule is a concurrency rule.
    pub fn has_concurrency(&self) -> bool {
        self.has_concurrency
    }

    /// This set's identity: the same for its clones, different for every other set made in
    /// this process (never 0). The memory backend remembers which set a key's states are laid
    /// out for by it, instead of comparing each state with each rule on every decision.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The smallest capacity of the rules (a cost up to it fits every rule).
    pub(crate) fn min_capacity(&self) -> u64 {
        self.min_capacity
    }

    pub(crate) fn compiled(&self) -> &[CompiledRule] {
        &self.rules
    }

    /// The most bytes this set's state for one key can take: its rules' worst cases, and the
    /// shared hash of its hash-stored rules once. Every rule set one key is checked under adds
    /// its own (rules of equal parameters share their state). The estimates are
    /// [`crate::footprint`]'s.
    pub fn worst_case_state(&self) -> u64 {
        let mut bytes = 0u64;
        let mut hashed = false;
        for rule in self.compiled() {
            hashed |= rule.algorithm.hash_fields().is_some();
            bytes = bytes.saturating_add(rule.rule.worst_case_state().bytes);
        }
        if hashed { bytes.saturating_add(crate::footprint::SHARED_HASH_BYTES) } else { bytes }
    }
}

/// An algorithm's time as a decision's whole microseconds: they are never negative; zero if
/// one were.
pub(crate) fn micros(t: i64) -> u64 {
    u64::try_from(t).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Period;

    #[test]
    fn a_rule_name_may_be_max_name_bytes_long() {
        let named = |len| RuleSet::new([Rule::fixed_window(1, Period::SECOND).named("n".repeat(len))]);
        assert!(named(MAX_NAME_BYTES).is_ok(), "the bound itself is allowed");
        assert!(matches!(
            named(MAX_NAME_BYTES + 1),
            Err(RuleError::NameTooLong { index: 0, len, max: MAX_NAME_BYTES }) if len == MAX_NAME_BYTES + 1
        ));
    }

    #[test]
    fn refuses_bad_rule_sets_with_the_rule_and_field() {
        assert_eq!(RuleSet::new([]).unwrap_err(), RuleError::Empty);
        let many = (1..=33).map(|n| Rule::fixed_window(n, Period::SECOND));
        assert!(matches!(RuleSet::new(many), Err(RuleError::TooMany { count: 33, .. })));
        let err = RuleSet::new([Rule::fixed_window(1, Period::SECOND), Rule::gcra(10, Period::SECOND, 0)])
            .unwrap_err();
        assert_eq!(err, RuleError::OutOfRange { index: 1, field: "burst", value: 0, min: 1, max: MAX_COUNT });
        assert!(matches!(
            RuleSet::new([Rule::concurrency(10_001, Period::SECOND)]),
            Err(RuleError::OutOfRange { field: "limit", .. })
        ));
        assert!(matches!(
            RuleSet::new([Rule::token_bucket(1, MAX_COUNT + 1, Period::SECOND)]),
            Err(RuleError::OutOfRange { field: "refill", .. })
        ));
        assert!(matches!(
            RuleSet::new([Rule::fixed_window(1, Period::SECOND).named("x".repeat(129))]),
            Err(RuleError::NameTooLong { len: 129, .. })
        ));
    }

    #[test]
    fn same_parameters_are_a_duplicate_whatever_the_name() {
        let err = RuleSet::new([
            Rule::fixed_window(5, Period::SECOND).named("a"),
            Rule::sliding_window_log(5, Period::SECOND),
            Rule::fixed_window(5, Period::SECOND).named("b"),
        ])
        .unwrap_err();
        assert_eq!(err, RuleError::Duplicate { index: 2, first: 0 });
    }

    #[test]
    fn inexact_rates_are_refused_with_a_way_out() {
        let err = RuleSet::new([Rule::token_bucket(MAX_COUNT, 999_999_937, Period::SECOND)]).unwrap_err();
        assert!(matches!(err, RuleError::Inexact { index: 0, .. }), "{err}");
    }

    #[test]
    fn signatures_name_algorithm_and_parameters() {
        let set = RuleSet::new([
            Rule::fixed_window(100, Period::MINUTE),
            Rule::fixed_window_from_first_hit(100, Period::MINUTE),
            Rule::gcra(10, Period::SECOND, 2),
        ])
        .unwrap();
        let sigs: Vec<_> = set.signatures().collect();
        assert_eq!(sigs, ["fw:100:60000000", "fwh:100:60000000", "gcra:10:1000000:2"]);
    }
}
