//! [`GroupPlan`]: a group's distinct states and the demand on each, worked out once; and
//! [`BatchPlan`], a validated batch's groups, each with its plan.
//!
//! A group is one or more parts decided together, all or nothing. Several parts of a group may
//! name the same state (the same key under the same rule): that state is refreshed once, asked
//! once for the sum of their costs, and consumed once, so two parts never both spend one unit.
//! The plan is what both backends run from: the memory backend moves the planned states out of
//! its map, the engine ([`crate::engine`]) runs the phases over them, and the Redis script gets
//! the same plan as arguments (see [`crate::script`]).

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::decision::LeaseId;
use crate::limits::{MAX_BATCH_PARTS, MAX_RULES};
use crate::ruleset::CompiledRule;
use crate::{Error, Operation, Part, RuleSet};

/// Beyond this many states, a plan finds a state by hash rather than by scanning.
const SCAN_STATES: usize = 16;

/// State indices `0..n`: the uses of a lone operation's rules, which are all distinct.
static IDENTITY: [u16; MAX_RULES] = {
    let mut out = [0; MAX_RULES];
    let mut i = 0;
    while i < MAX_RULES {
        out[i] = i as u16;
        i += 1;
    }
    out
};

/// One state a group works on: a key under a rule, and what the group asks of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlannedState<'a> {
    /// The key whose state it is.
    pub key: &'a str,
    /// The rule, of the first part naming the state.
    pub rule: &'a CompiledRule,
    /// The units the group's parts ask of it, together.
    pub demand: u64,
    /// The lease that an acquire takes the units under (the last acquiring part's).
    pub lease: Option<&'a LeaseId>,
}

/// One part of a group, as planned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlannedPart<'a> {
    pub rules: &'a RuleSet,
    pub op: Operation<'a>,
    /// Where this part's rules start in [`GroupPlan::uses`].
    start: usize,
}

/// The first state of a group asked for more than its rule's capacity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OverCapacity {
    /// The part (its position in the group) at which the demand passed the capacity.
    pub part: usize,
    /// The rule's position in that part's rule set.
    pub rule: usize,
    /// The demand so far.
    pub demand: u64,
}

/// A group's parts, its distinct states with the summed demand on each, and for each part's
/// rule the index of its state. Built in one pass over the parts' rules.
#[derive(Clone, Debug)]
pub(crate) struct GroupPlan<'a> {
    parts: SmallVec<[PlannedPart<'a>; 1]>,
    states: SmallVec<[PlannedState<'a>; 4]>,
    /// Each part's rules' state indices, part after part; empty in the plan of a lone
    /// operation, whose rules are states `0..n` ([`IDENTITY`]).
    uses: SmallVec<[u16; 8]>,
    over: Option<OverCapacity>,
}

fn cost_and_lease<'a>(op: &Operation<'a>) -> (u64, Option<&'a LeaseId>) {
    match *op {
        Operation::Check { cost } => (cost, None),
        Operation::Acquire { cost, lease } => (cost, Some(lease)),
        Operation::Refund { .. } | Operation::Release { .. } => (0, None),
    }
}

impl<'a> GroupPlan<'a> {
    /// The plan of a lone operation: each rule its own state (a rule set has no two alike).
    pub fn single(key: &'a str, rules: &'a RuleSet, op: Operation<'a>) -> Self {
        let (demand, lease) = cost_and_lease(&op);
        let mut plan =
            GroupPlan { parts: SmallVec::new(), states: SmallVec::new(), uses: SmallVec::new(), over: None };
        plan.parts.push(PlannedPart { rules, op, start: 0 });
        // Pushed one by one: cheaper than collecting, on the path of every lone operation.
        for rule in rules.compiled() {
            plan.states.push(PlannedState { key, rule, demand, lease });
        }
        plan
    }

    /// The plan of a group of `(key, rules, operation)` parts, in order.
    pub fn new(parts: impl IntoIterator<Item = (&'a str, &'a RuleSet, Operation<'a>)>) -> Self {
        let mut plan =
            GroupPlan { parts: SmallVec::new(), states: SmallVec::new(), uses: SmallVec::new(), over: None };
        // Built once the states outgrow a scan.
        let mut index: Option<HashMap<(&'a str, &'a str), u16>> = None;
        for (p, (key, rules, op)) in parts.into_iter().enumerate() {
            plan.parts.push(PlannedPart { rules, op, start: plan.uses.len() });
            let (cost, lease) = cost_and_lease(&op);
            for (r, rule) in rules.compiled().iter().enumerate() {
                let same = |s: &PlannedState<'_>| s.key == key && s.rule.signature == rule.signature;
                let found = match &index {
                    Some(index) => index.get(&(key, &*rule.signature)).copied(),
                    None => plan.states.iter().position(same).map(|at| at as u16),
                };
                let at = match found {
                    Some(at) => at,
                    None => {
                        let at = plan.states.len() as u16;
                        plan.states.push(PlannedState { key, rule, demand: 0, lease: None });
                        if let Some(index) = &mut index {
                            index.insert((key, &rule.signature), at);
                        } else if plan.states.len() > SCAN_STATES {
                            index = Some(
                                plan.states
                                    .iter()
                                    .enumerate()
                                    .map(|(i, s)| ((s.key, &*s.rule.signature), i as u16))
                                    .collect(),
                            );
                        }
                        at
                    }
                };
                let state = &mut plan.states[usize::from(at)];
                state.demand += cost;
                if lease.is_some() {
                    state.lease = lease;
                }
                if plan.over.is_none() && state.demand > state.rule.algorithm.capacity() {
                    plan.over = Some(OverCapacity { part: p, rule: r, demand: state.demand });
                }
                plan.uses.push(at);
            }
        }
        plan
    }

    /// The group's parts, in order.
    pub fn parts(&self) -> &[PlannedPart<'a>] {
        &self.parts
    }

    /// The distinct states, in the order parts first name them.
    pub fn states(&self) -> &[PlannedState<'a>] {
        &self.states
    }

    /// The state index of each of part `part`'s rules, in its rule set's order.
    pub fn uses(&self, part: usize) -> &[u16] {
        if self.uses.is_empty() {
            return &IDENTITY[..self.states.len()];
        }
        let start = self.parts[part].start;
        let end = self.parts.get(part + 1).map_or(self.uses.len(), |next| next.start);
        &self.uses[start..end]
    }

    /// How many rules the group's parts have together.
    pub fn entry_count(&self) -> usize {
        match self.parts.as_slice() {
            [single] if self.uses.is_empty() => single.rules.len(),
            _ => self.uses.len(),
        }
    }

    /// The part, and the rule within it, of the group's `at`-th rule (counting its parts'
    /// rules in order).
    pub fn entry_at(&self, at: usize) -> (usize, usize) {
        if self.uses.is_empty() {
            return (0, at);
        }
        let part = self.parts.partition_point(|p| p.start <= at) - 1;
        (part, at - self.parts[part].start)
    }

    /// The first state asked for more than it can ever hold, if any.
    pub fn over_capacity(&self) -> Option<OverCapacity> {
        self.over
    }
}

/// A batch of [`Part`]s, validated, with its groups in the order backends decide them (the
/// order in which groups first appear) and each group's plan. See [`Part`].
#[derive(Clone, Debug)]
pub struct BatchPlan<'a> {
    groups: Vec<(SmallVec<[usize; 4]>, GroupPlan<'a>)>,
}

impl<'a> BatchPlan<'a> {
    /// Checks a batch before any backend is touched, and plans it: its size, each part as a
    /// check (key, cost, no cost on a concurrency rule), and that each group's demand on every
    /// state fits the rule's capacity. An error about one part is [`Error::InPart`] (for a
    /// state asked too much, the part at which the group's demand on it passed the capacity).
    pub fn new(parts: &[Part<'a>]) -> Result<Self, Error> {
        if parts.is_empty() || parts.len() > MAX_BATCH_PARTS {
            return Err(Error::BatchSize { parts: parts.len(), max: MAX_BATCH_PARTS });
        }
        let in_part = |part: usize, error: Error| Error::InPart { part, error: Box::new(error) };
        for (i, part) in parts.iter().enumerate() {
            Operation::Check { cost: part.cost }.validate(part.key, part.rules).map_err(|e| in_part(i, e))?;
        }
        let mut members: Vec<(u32, SmallVec<[usize; 4]>)> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            match members.iter_mut().find(|(g, _)| *g == part.group) {
                Some((_, group)) => group.push(i),
                None => members.push((part.group, SmallVec::from_slice(&[i]))),
            }
        }
        let mut groups = Vec::with_capacity(members.len());
        for (_, group) in members {
            let plan = GroupPlan::new(group.iter().map(|&i| {
                let part = &parts[i];
                (part.key, part.rules, Operation::Check { cost: part.cost })
            }));
            if let Some(over) = plan.over_capacity() {
                let part = group[over.part];
                let rule = &parts[part].rules.compiled()[over.rule];
                let error = Error::CostExceedsCapacity {
                    index: over.rule,
                    name: rule.name.clone(),
                    algorithm: rule.rule.algorithm(),
                    cost: over.demand,
                    capacity: rule.algorithm.capacity(),
                };
                return Err(in_part(part, error));
            }
            groups.push((group, plan));
        }
        Ok(BatchPlan { groups })
    }

    /// Each group's parts (positions in the batch), group after group, in the order backends
    /// decide them.
    pub fn groups(&self) -> impl ExactSizeIterator<Item = &[usize]> {
        self.groups.iter().map(|(members, _)| &members[..])
    }

    /// Each group's parts with its plan.
    pub(crate) fn planned(&self) -> &[(SmallVec<[usize; 4]>, GroupPlan<'a>)] {
        &self.groups
    }
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
        let plan = BatchPlan::new(&parts).unwrap();
        let groups: Vec<Vec<usize>> = plan.groups().map(|g| g.to_vec()).collect();
        assert_eq!(groups, [vec![0, 2], vec![1]]);
    }

    #[test]
    fn a_group_asking_one_state_for_more_than_it_holds_is_refused() {
        let rules = RuleSet::new([Rule::fixed_window(3, Period::SECOND)]).unwrap();
        let joint = [Part::new("k", &rules, 2), Part::new("k", &rules, 2)];
        match BatchPlan::new(&joint) {
            Err(Error::InPart { part: 1, error }) => {
                assert!(matches!(*error, Error::CostExceedsCapacity { cost: 4, capacity: 3, .. }))
            }
            other => panic!("{other:?}"),
        }
        // In separate groups each asks alone.
        assert!(BatchPlan::new(&[joint[0], joint[1].in_group(1)]).is_ok());
        assert!(matches!(BatchPlan::new(&[]), Err(Error::BatchSize { parts: 0, .. })));
        let bad_key = [Part::new("k", &rules, 1), Part::new("", &rules, 1)];
        assert!(matches!(BatchPlan::new(&bad_key), Err(Error::InPart { part: 1, .. })));
    }

    #[test]
    fn parts_naming_one_state_share_it_and_add_up() {
        let one = RuleSet::new([Rule::fixed_window(9, Period::SECOND)]).unwrap();
        let two =
            RuleSet::new([Rule::gcra(5, Period::SECOND, 5), Rule::fixed_window(9, Period::SECOND)]).unwrap();
        let check = |cost| Operation::Check { cost };
        let plan = GroupPlan::new([("a", &one, check(1)), ("b", &one, check(2)), ("a", &two, check(3))]);
        assert_eq!(plan.states().len(), 3);
        assert_eq!(plan.uses(0), [0]);
        assert_eq!(plan.uses(1), [1]);
        assert_eq!(plan.uses(2), [2, 0]);
        let demand: Vec<u64> = plan.states().iter().map(|s| s.demand).collect();
        assert_eq!(demand, [4, 2, 3]);
    }

    #[test]
    fn many_states_are_found_by_hash_alike() {
        let rules = RuleSet::new([Rule::fixed_window(100, Period::SECOND)]).unwrap();
        let keys: Vec<String> = (0..40).map(|i| format!("k{}", i % 20)).collect();
        let plan = GroupPlan::new(keys.iter().map(|k| (k.as_str(), &rules, Operation::Check { cost: 1 })));
        assert_eq!(plan.states().len(), 20);
        assert!(plan.states().iter().all(|s| s.demand == 2));
        assert_eq!(plan.uses(25), [5]);
    }
}
