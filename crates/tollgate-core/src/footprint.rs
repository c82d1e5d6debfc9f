//! The cost model of stored state: the most a rule's state for one key can take in a backend,
//! known from the rule's algorithm and parameters alone, before anything is stored.
//!
//! Callers that accept rules from strangers (the server's inline `limits`, an inline
//! concurrency rule of `/v1/acquire`) compare
//! [`RuleSet::worst_case_state`](crate::RuleSet::worst_case_state) with a budget and refuse
//! what would not fit. This is the one place the estimates live.
//!
//! What grows:
//! - A sliding log holds one entry per distinct microsecond at which units were admitted, each
//!   with at least one unit, and drops entries a period old: at most `min(limit, period in
//!   microseconds)` entries.
//! - A concurrency rule holds one entry per lease, each of at least one unit: at most `limit`
//!   leases (leases of one microsecond do not merge, so the period does not bound them).
//! - Fixed windows, sliding window counters, token buckets and GCRA hold two or three numbers
//!   whatever the traffic.
//!
//! The byte estimates are Redis's, which exceed the memory backend's for every algorithm
//! (there a log entry is 16 bytes in a ring buffer whose room is at most twice the most entries
//! it held, a lease an `Arc<str>` id and 16 bytes), so one figure bounds both. They were measured with `MEMORY USAGE` on Redis 7.0 with its default
//! encodings, at the sizes where sorted sets have left their compact listpack form (above 128
//! members) and cost the most per member; the key's own name (the prefix and the caller's key,
//! up to 512 bytes) is not counted.

use crate::{Rule, RuleKind};

/// Bytes per sliding-log entry: a sorted-set member holding a 16-digit time, its score, the
/// skip-list node and the dictionary entry (measured: 1,289,920 bytes for 10,000 entries, 129
/// per entry).
pub const LOG_ENTRY_BYTES: u64 = 130;

/// Bytes per concurrency lease: two sorted-set members (the 32-character id, and the id with
/// its units) with their scores, nodes and dictionary entries (measured: 2,898,176 bytes for
/// 10,000 leases, 290 per lease).
pub const LEASE_BYTES: u64 = 290;

/// Bytes of a sorted-set key of its own (a log's or a lease set's), besides its entries: the
/// key's object, its TTL entry, the signature ending its name, and the log's base member or
/// the lease set's total.
pub const OWN_KEY_BYTES: u64 = 160;

/// Bytes of a hash-stored rule's fields (fixed window, sliding window counter, token bucket,
/// GCRA) in its key's shared hash: two or three field names and numbers (measured: about 40
/// bytes per rule in a small hash; 64 leaves room for the hash's larger form).
pub const HASHED_RULE_BYTES: u64 = 64;

/// Bytes of the shared hash's key itself, counted once for a rule set with hash-stored rules.
pub const SHARED_HASH_BYTES: u64 = 100;

/// The most a rule's state for one key can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateFootprint {
    /// Entries stored: log entries, leases, or 1 for a state of a few fixed numbers.
    pub entries: u64,
    /// Bytes, by the estimates of this module.
    pub bytes: u64,
}

impl Rule {
    /// The most this rule's state for one key can take (see the [module](self)'s estimates).
    /// Computed from the parameters as given, valid or not (saturating), so a caller can size a
    /// rule before [`RuleSet::new`](crate::RuleSet::new) validates it.
    pub fn worst_case_state(&self) -> StateFootprint {
        match self.kind {
            RuleKind::SlidingWindowLog { limit, period } => {
                let entries = limit.min(period.as_micros());
                StateFootprint {
                    entries,
                    bytes: OWN_KEY_BYTES.saturating_add(entries.saturating_mul(LOG_ENTRY_BYTES)),
                }
            }
            RuleKind::Concurrency { limit, .. } => StateFootprint {
                entries: limit,
                bytes: OWN_KEY_BYTES.saturating_add(limit.saturating_mul(LEASE_BYTES)),
            },
            RuleKind::FixedWindow { .. }
            | RuleKind::SlidingWindowCounter { .. }
            | RuleKind::TokenBucket { .. }
            | RuleKind::Gcra { .. } => StateFootprint { entries: 1, bytes: HASHED_RULE_BYTES },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_CONCURRENCY_LIMIT, MAX_LOG_LIMIT};
    use crate::{Period, RuleSet};

    #[test]
    fn a_log_holds_at_most_its_limit_or_one_entry_per_microsecond() {
        let year = Period::from_secs(365 * 86_400).unwrap();
        assert_eq!(
            Rule::sliding_window_log(MAX_LOG_LIMIT, year).worst_case_state(),
            StateFootprint { entries: 10_000, bytes: 160 + 10_000 * 130 }
        );
        // a period of 1 ms has 1,000 distinct microseconds: no more entries than that
        let ms = Period::from_millis(1).unwrap();
        assert_eq!(Rule::sliding_window_log(5_000, ms).worst_case_state().entries, 1_000);
        assert_eq!(Rule::sliding_window_log(10, ms).worst_case_state().entries, 10);
    }

    #[test]
    fn a_concurrency_rule_holds_at_most_its_limit_in_leases() {
        let rule = Rule::concurrency(MAX_CONCURRENCY_LIMIT, Period::SECOND);
        assert_eq!(rule.worst_case_state(), StateFootprint { entries: 10_000, bytes: 160 + 10_000 * 290 });
    }

    #[test]
    fn constant_state_rules_cost_their_fields_whatever_the_parameters() {
        for rule in [
            Rule::fixed_window(1_000_000_000_000, Period::from_secs(365 * 86_400).unwrap()),
            Rule::sliding_window_counter(1, Period::SECOND),
            Rule::token_bucket(1_000_000, 1, Period::HOUR),
            Rule::gcra(10, Period::SECOND, 5),
        ] {
            assert_eq!(rule.worst_case_state(), StateFootprint { entries: 1, bytes: HASHED_RULE_BYTES });
        }
    }

    #[test]
    fn a_set_sums_its_rules_and_counts_the_shared_hash_once() {
        let year = Period::from_secs(365 * 86_400).unwrap();
        // Issue 18's request: 16 logs of 10,000 over about a year, 20.8 MB at worst.
        let attack = RuleSet::new(
            (0..16).map(|i| Rule::sliding_window_log(10_000, Period::from_secs(365 * 86_400 - i).unwrap())),
        )
        .unwrap();
        assert_eq!(attack.worst_case_state(), 16 * (160 + 10_000 * 130));
        let mixed = RuleSet::new([
            Rule::fixed_window(10, Period::SECOND),
            Rule::gcra(10, Period::SECOND, 5),
            Rule::sliding_window_log(100, year),
        ])
        .unwrap();
        assert_eq!(mixed.worst_case_state(), 2 * 64 + 100 + (160 + 100 * 130));
        let only_log = RuleSet::new([Rule::sliding_window_log(100, year)]).unwrap();
        assert_eq!(only_log.worst_case_state(), 160 + 100 * 130);
    }
}
