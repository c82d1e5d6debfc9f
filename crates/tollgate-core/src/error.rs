//! Errors: [`RuleError`] when a rule set is built, [`Error`] when an operation runs.

use std::sync::Arc;
use std::time::Duration;

use crate::AlgorithmName;

/// A boxed error from a backend's client library, kept as the source of [`Error`] variants.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a list of rules is not a valid [`RuleSet`](crate::RuleSet).
///
/// Rule positions are zero-based indexes into the list given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// No rules at all.
    #[error("a rule set needs at least one rule")]
    Empty,
    /// More rules than [`MAX_RULES`](crate::limits::MAX_RULES).
    #[error("{count} rules given; at most {max} are allowed in one rule set")]
    TooMany {
        /// Rules given.
        count: usize,
        /// The maximum.
        max: usize,
    },
    /// A parameter outside its range.
    #[error("rule {index}: {field} = {value} is out of range ({min}..={max})")]
    OutOfRange {
        /// Position of the rule.
        index: usize,
        /// The parameter's name (`"limit"`, `"capacity"`, ...).
        field: &'static str,
        /// The value given.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A `sliding_window_log` limit above [`MAX_LOG_LIMIT`](crate::limits::MAX_LOG_LIMIT).
    #[error(
        "rule {index}: sliding_window_log stores one entry per admitted request, so its limit is \
         capped at {max} (got {limit}); use sliding_window_counter for larger limits"
    )]
    LogLimitTooLarge {
        /// Position of the rule.
        index: usize,
        /// The limit given.
        limit: u64,
        /// The cap.
        max: u64,
    },
    /// Token-bucket or GCRA parameters whose exact arithmetic would not fit in 53 bits.
    #[error(
        "rule {index}: {algorithm} with capacity {capacity} refilled at {refill} per {per_micros}us \
         is out of range: capacity x refill must stay below 2^53 once refill/per is reduced, and \
         refilling from empty must take under 100 years; use a smaller capacity or a faster refill"
    )]
    Inexact {
        /// Position of the rule.
        index: usize,
        /// `token_bucket` or `gcra`.
        algorithm: AlgorithmName,
        /// Capacity (the burst, for GCRA).
        capacity: u64,
        /// Units per interval.
        refill: u64,
        /// The interval in microseconds.
        per_micros: u64,
    },
    /// A name longer than [`MAX_NAME_BYTES`](crate::limits::MAX_NAME_BYTES).
    #[error("rule {index}: name is {len} bytes long; at most {max} are allowed")]
    NameTooLong {
        /// Position of the rule.
        index: usize,
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Two rules with the same algorithm and parameters: they would share (and double-count) one
    /// state.
    #[error("rule {index} repeats rule {first} (same algorithm and parameters)")]
    Duplicate {
        /// Position of the repeat.
        index: usize,
        /// Position of the first occurrence.
        first: usize,
    },
}

/// Why a key is not usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The empty string.
    #[error("key is empty")]
    Empty,
    /// Longer than [`MAX_KEY_BYTES`](crate::limits::MAX_KEY_BYTES).
    #[error("key is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
}

/// Why an operation did not produce a decision.
///
/// A denial is not an error: it is a [`Decision`](crate::Decision) whose `allowed()` is false.
/// The first variants are the caller's mistakes (bad input, answered before any backend is
/// touched); the last three are the backend's failures, which a server maps to its failure policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty or too long.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// A cost that no amount of waiting would let a rule admit.
    #[error(
        "cost {cost} can never be admitted: rule {index}{} ({algorithm}) has a capacity of {capacity}",
        name.as_deref().map(|n| format!(" \"{n}\"")).unwrap_or_default()
    )]
    CostExceedsCapacity {
        /// Position of the rule.
        index: usize,
        /// The rule's name, if it has one.
        name: Option<Arc<str>>,
        /// The rule's algorithm.
        algorithm: AlgorithmName,
        /// The cost asked for.
        cost: u64,
        /// The most the rule ever admits at once.
        capacity: u64,
    },
    /// A cost or refund amount above [`MAX_COUNT`](crate::limits::MAX_COUNT).
    #[error("cost {cost} exceeds the maximum of {max}")]
    CostTooLarge {
        /// The amount asked for.
        cost: u64,
        /// The maximum.
        max: u64,
    },
    /// `check` with a cost on a rule set holding a concurrency rule: units held at once can
    /// only be taken with `acquire`, which returns the lease that gives them back.
    #[error("rule {index} is a concurrency rule: take units with acquire(), which returns a lease")]
    LeaseRequired {
        /// Position of the concurrency rule.
        index: usize,
    },
    /// A batch with no parts, or more than [`MAX_BATCH_PARTS`](crate::limits::MAX_BATCH_PARTS).
    #[error("a batch holds 1 to {max} parts (got {parts})")]
    BatchSize {
        /// Parts given.
        parts: usize,
        /// The maximum.
        max: usize,
    },
    /// One part of a batch is refused.
    #[error("part {part}: {error}")]
    InPart {
        /// Position of the part.
        part: usize,
        /// Why it is refused.
        #[source]
        error: Box<Error>,
    },
    /// A batch whose group holds several parts, on a backend that cannot decide several keys in
    /// one atomic step.
    #[error("this backend cannot check several keys all or nothing")]
    JointUnsupported,
    /// The backend did not answer within its timeout.
    #[error("the backend did not answer within {0:?}")]
    Timeout(Duration),
    /// The backend could not be reached.
    #[error("the backend is unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// The backend answered with an error, or with something that is not a decision.
    #[error("the backend failed: {0}")]
    Backend(#[source] BoxError),
}

impl Error {
    /// True for the backend's failures ([`Timeout`](Error::Timeout),
    /// [`Unavailable`](Error::Unavailable), [`Backend`](Error::Backend)), false for bad input.
    pub fn is_backend_failure(&self) -> bool {
        matches!(self, Error::Timeout(_) | Error::Unavailable(_) | Error::Backend(_))
    }
}
