//! Explicit bounds on everything a caller controls, so that bad input gets a clear error
//! instead of a slow, huge or inexact computation.

/// Largest `limit`, `capacity`, `refill`, `burst` or `cost` (10^12).
///
/// Far below 2^53, so sums of counts stay exact in the Lua twins, whose numbers are doubles.
pub const MAX_COUNT: u64 = 1_000_000_000_000;

/// Largest `limit` of a `sliding_window_log` rule: the log stores one entry per distinct time
/// a unit was admitted at, so up to one per unit when units come one per microsecond (see
/// [`footprint`](crate::footprint) for what that costs, and the budget servers hold inline
/// rules to).
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Largest `limit` of a `concurrency` rule: leases are stored one entry per lease, so up to one
/// per unit when every lease holds one.
pub const MAX_CONCURRENCY_LIMIT: u64 = 10_000;

/// Most rules in one [`RuleSet`](crate::RuleSet).
pub const MAX_RULES: usize = 32;

/// Most parts in one batch ([`Part`](crate::Part)): an Envoy request's descriptors, or
/// coalesced checks.
pub const MAX_BATCH_PARTS: usize = 64;

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;

/// Longest rule name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Largest exact integer of a double (2^53 - 1): the bound for every intermediate value the
/// algorithms compute, so the Rust and Lua twins agree to the last unit.
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;

/// Longest time a token bucket or GCRA may take to refill from empty (100 years).
pub(crate) const MAX_FILL_MICROS: u64 = 100 * 31_557_600 * 1_000_000;
