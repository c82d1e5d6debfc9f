//! [`Operation`]: what a backend is asked to do to one key's state under a rule set.

use crate::decision::{Lease, LeaseId};
use crate::limits::{MAX_CONCURRENCY_LIMIT, MAX_COUNT, MAX_KEY_BYTES};
use crate::{Error, KeyError, RuleSet};

/// One operation on the state of a key under a rule set. Backends run it atomically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    /// Admit `cost` units if every rule allows it, consuming them from every rule; a cost of 0
    /// peeks (reports whether one unit would be admitted, and consumes nothing).
    Check {
        /// Units asked for.
        cost: u64,
    },
    /// A check in which concurrency rules hold the units under `lease` until released.
    Acquire {
        /// Units asked for.
        cost: u64,
        /// The lease the units will be held under.
        lease: &'a LeaseId,
    },
    /// Gives back `amount` units consumed for work that was cancelled (not below empty; leases
    /// are given back by `Release` instead). Reports as a peek.
    Refund {
        /// Units to give back.
        amount: u64,
    },
    /// Gives back a lease's units. Reports as a peek.
    Release {
        /// The lease.
        lease: &'a Lease,
    },
}

/// Checks that `key` can name a state.
pub fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        Err(KeyError::Empty)
    } else if key.len() > MAX_KEY_BYTES {
        Err(KeyError::TooLong { len: key.len(), max: MAX_KEY_BYTES })
    } else {
        Ok(())
    }
}

impl Operation<'_> {
    /// Checks the operation before any backend is touched: the key, the amounts, and that the
    /// cost can ever fit. Both backends call this, so both refuse the same input the same way.
    pub fn validate(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        let (amount, max) = match *self {
            Operation::Check { cost } | Operation::Acquire { cost, .. } => (cost, MAX_COUNT),
            Operation::Refund { amount } => (amount, MAX_COUNT),
            Operation::Release { lease } => (lease.units, MAX_CONCURRENCY_LIMIT),
        };
        if amount > max {
            return Err(Error::CostTooLarge { cost: amount, max });
        }
        let cost = match *self {
            Operation::Check { cost } | Operation::Acquire { cost, .. } => cost,
            Operation::Refund { .. } | Operation::Release { .. } => return Ok(()),
        };
        // The common case settled without visiting the rules: a cost every rule can hold, and
        // no lease asked of a check. Otherwise the rules in order name the first that refuses.
        let needs_lease = cost > 0 && matches!(self, Operation::Check { .. }) && rules.has_concurrency();
        if !needs_lease && cost <= rules.min_capacity() {
            return Ok(());
        }
        for (index, rule) in rules.compiled().iter().enumerate() {
            if cost > 0 && matches!(self, Operation::Check { .. }) && rule.algorithm.holds_leases() {
                return Err(Error::LeaseRequired { index });
            }
            let capacity = rule.algorithm.capacity();
            if cost > capacity {
                return Err(Error::CostExceedsCapacity {
                    index,
                    name: rule.name.clone(),
                    algorithm: rule.rule.algorithm(),
                    cost,
                    capacity,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_to_max_key_bytes_long() {
        assert!(matches!(validate_key(""), Err(KeyError::Empty)));
        assert!(validate_key("k").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok(), "the bound itself is allowed");
        let over = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(
            validate_key(&over),
            Err(KeyError::TooLong { len, max }) if len == MAX_KEY_BYTES + 1 && max == MAX_KEY_BYTES
        ));
    }

    #[test]
    fn the_first_rule_a_cost_exceeds_is_named() {
        use crate::{Period, Rule};
        let rules =
            RuleSet::new([Rule::fixed_window(4, Period::SECOND), Rule::fixed_window(3, Period::MINUTE)])
                .unwrap();
        let check = |cost| Operation::Check { cost }.validate("k", &rules);
        assert!(check(3).is_ok(), "within every rule");
        // Equal to the first rule's capacity (it fits there), beyond the second's.
        assert!(matches!(check(4), Err(Error::CostExceedsCapacity { index: 1, cost: 4, capacity: 3, .. })));
        assert!(matches!(check(5), Err(Error::CostExceedsCapacity { index: 0, cost: 5, capacity: 4, .. })));
    }
}
