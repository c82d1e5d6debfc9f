//! [`Part`]: one operation on one key's state in a batch that a backend decides in one atomic
//! step.

use crate::{Operation, RuleSet};

/// One operation on one key's state, as part of a batch that a backend decides in one atomic
/// step.
///
/// A batch is how several keys are decided together: the descriptors of one Envoy request, or
/// many callers' operations coalesced into one Redis call. Most parts are checks
/// ([`Part::new`]); any [`Operation`] can be one ([`Part::operation`]). Parts of the same
/// *group* are all or nothing: consumed only if every one of them is admitted. Groups are
/// decided one after another, in the order they first appear, so a later group sees an earlier
/// one's consumption. A state named by several parts of one group (the same key under the same
/// rule) is asked once, for the sum of their costs, so two parts never both spend one unit (see
/// [`BatchPlan`](crate::BatchPlan), which validates a batch and plans its groups). The same
/// type goes to a Redis script ([`script::arguments`](crate::script::arguments)), there with
/// each group's parts next to each other.
///
/// ```
/// use tollgate_core::{ManualClock, MemoryBackend, Part, Period, Rule, RuleSet};
///
/// let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
/// let per_user = RuleSet::new([Rule::fixed_window(5, Period::MINUTE)])?;
/// let per_path = RuleSet::new([Rule::fixed_window(1, Period::MINUTE)])?;
///
/// let batch = [Part::new("user:7", &per_user, 1), Part::new("path:/upload", &per_path, 1)];
/// let first = backend.check_batch_now(&batch)?;
/// assert!(first.iter().all(|d| d.allowed()));
///
/// // The path's one unit is spent: the batch is refused, and the user's unit is not taken.
/// let second = backend.check_batch_now(&batch)?;
/// assert!(second[0].allowed() && !second[1].allowed());
/// assert_eq!(second[0].remaining(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    /// The key whose state is checked.
    pub key: &'a str,
    /// The rules it is checked under.
    pub rules: &'a RuleSet,
    /// What is done to it.
    pub op: Operation<'a>,
    /// Parts with the same group are all or nothing together.
    pub group: u32,
}

impl<'a> Part<'a> {
    /// A check of `cost` units (0 peeks) in group 0 (with the batch's other group-0 parts, all
    /// or nothing).
    pub fn new(key: &'a str, rules: &'a RuleSet, cost: u64) -> Self {
        Part::operation(key, rules, Operation::Check { cost })
    }

    /// Any operation, in group 0.
    pub fn operation(key: &'a str, rules: &'a RuleSet, op: Operation<'a>) -> Self {
        Part { key, rules, op, group: 0 }
    }

    /// The same part in `group`.
    pub fn in_group(self, group: u32) -> Self {
        Part { group, ..self }
    }

    /// The units the part asks of each of its states: a check's or an acquire's cost, else 0.
    pub fn cost(&self) -> u64 {
        match self.op {
            Operation::Check { cost } | Operation::Acquire { cost, .. } => cost,
            Operation::Refund { .. } | Operation::Release { .. } => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Lease, LeaseId, Period, Rule};

    #[test]
    fn a_part_asks_its_cost_of_each_state_and_gives_back_nothing() {
        let rules = RuleSet::new([Rule::fixed_window(5, Period::MINUTE)]).unwrap();
        let id = LeaseId::random();
        let lease = Lease { id: id.clone(), units: 4 };
        assert_eq!(Part::new("k", &rules, 3).cost(), 3);
        assert_eq!(Part::operation("k", &rules, Operation::Acquire { cost: 2, lease: &id }).cost(), 2);
        assert_eq!(Part::operation("k", &rules, Operation::Refund { amount: 7 }).cost(), 0);
        assert_eq!(Part::operation("k", &rules, Operation::Release { lease: &lease }).cost(), 0);
        assert_eq!(Part::new("k", &rules, 3).in_group(9).group, 9);
    }
}
