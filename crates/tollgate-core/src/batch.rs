//! [`Part`]: one key's check in a batch that a backend decides in one atomic step.
//!
//! A batch is how several keys are checked together: the descriptors of one Envoy request, or
//! many callers' checks coalesced into one Redis call. Parts of the same *group* are all or
//! nothing: consumed only if every one of them is admitted. Groups are decided one after
//! another, in the order they first appear, so a later group sees an earlier one's
//! consumption. A state named by several parts of one group (the same key under the same rule)
//! is asked once, for the sum of their costs, so two parts never both spend one unit.

use smallvec::SmallVec;

use crate::limits::MAX_BATCH_PARTS;
use crate::{Error, RuleSet};

/// One key's check in a batch; see the [module docs](self).
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
    /// Units asked for; 0 peeks.
    pub cost: u64,
    /// Parts with the same group are all or nothing together.
    pub group: u32,
}

impl<'a> Part<'a> {
    /// A part in group 0 (with the batch's other group-0 parts, all or nothing).
    pub fn new(key: &'a str, rules: &'a RuleSet, cost: u64) -> Self {
        Part { key, rules, cost, group: 0 }
    }

    /// The same part in `group`.
    pub fn in_group(self, group: u32) -> Self {
        Part { group, ..self }
    }
}

/// The parts' positions, group by group: groups in the order they first appear, each group's
/// parts in their order. Backends decide groups in this order.
pub fn groups(parts: &[Part<'_>]) -> Vec<SmallVec<[usize; 4]>> {
    let mut groups: Vec<(u32, SmallVec<[usize; 4]>)> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == part.group) {
            Some((_, members)) => members.push(i),
            None => groups.push((part.group, SmallVec::from_slice(&[i]))),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// Checks a batch before any backend is touched: its size, each part as a check (key, cost,
/// no cost on a concurrency rule), and that each group's demand on every state fits the rule's
/// capacity. Errors about one part are [`Error::InPart`].
pub fn validate_batch(parts: &[Part<'_>]) -> Result<(), Error> {
    if parts.is_empty() || parts.len() > MAX_BATCH_PARTS {
        return Err(Error::BatchSize { parts: parts.len(), max: MAX_BATCH_PARTS });
    }
    let in_part = |part: usize, error: Error| Error::InPart { part, error: Box::new(error) };
    for (i, part) in parts.iter().enumerate() {
        crate::Operation::Check { cost: part.cost }
            .validate(part.key, part.rules)
            .map_err(|e| in_part(i, e))?;
    }
    // Several parts of one group naming the same state: their costs add up.
    for members in groups(parts) {
        if members.len() < 2 {
            continue;
        }
        for (n, &i) in members.iter().enumerate() {
            let part = &parts[i];
            for (index, rule) in part.rules.compiled().iter().enumerate() {
                let demand: u64 = members[..=n]
                    .iter()
                    .map(|&j| &parts[j])
                    .filter(|p| p.key == part.key && p.rules.signatures().any(|s| s == &*rule.signature))
                    .map(|p| p.cost)
                    .sum();
                let capacity = rule.algo.capacity();
                if demand > capacity {
                    let error = Error::CostExceedsCapacity {
                        index,
                        name: rule.name.clone(),
                        algorithm: rule.rule.algorithm(),
                        cost: demand,
                        capacity,
                    };
                    return Err(in_part(i, error));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Period, Rule};

    #[test]
    fn groups_keep_first_appearance_order() {
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        let parts = [
            Part::new("a", &rules, 1).in_group(5),
            Part::new("b", &rules, 1),
            Part::new("c", &rules, 1).in_group(5),
        ];
        let groups: Vec<Vec<usize>> = groups(&parts).into_iter().map(|g| g.to_vec()).collect();
        assert_eq!(groups, [vec![0, 2], vec![1]]);
    }

    #[test]
    fn a_group_asking_one_state_for_more_than_it_holds_is_refused() {
        let rules = RuleSet::new([Rule::fixed_window(3, Period::SECOND)]).unwrap();
        let joint = [Part::new("k", &rules, 2), Part::new("k", &rules, 2)];
        match validate_batch(&joint) {
            Err(Error::InPart { part: 1, error }) => {
                assert!(matches!(*error, Error::CostExceedsCapacity { cost: 4, capacity: 3, .. }))
            }
            other => panic!("{other:?}"),
        }
        // In separate groups each asks alone.
        assert!(validate_batch(&[joint[0], joint[1].in_group(1)]).is_ok());
        assert!(matches!(validate_batch(&[]), Err(Error::BatchSize { parts: 0, .. })));
        let bad_key = [Part::new("k", &rules, 1), Part::new("", &rules, 1)];
        assert!(matches!(validate_batch(&bad_key), Err(Error::InPart { part: 1, .. })));
    }
}
