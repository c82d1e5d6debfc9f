//! [`GroupPlan`]: a group's distinct states and the demand on each, worked out once; and
//! [`BatchPlan`], a validated batch's groups, each with its plan.
//!
//! A group is one or more parts decided together, all or nothing. Several parts of a group may
//! name the same state (the same key under the same rule): that state is refreshed once, asked
//! once for the sum of their costs, and consumed once, so two parts never both spend one unit.
//! The plan is the one place this is worked out, and what every form of the engine runs from:
//! - [`BatchPlan::new`] validates a batch by its groups' plans (a state asked more than its
//!   rule's capacity);
//! - the memory backend moves the planned states out of its map and the engine
//!   ([`crate::engine`]) runs the phases over them;
//! - [`crate::script::arguments`] sends a group's plan to the Redis script, and
//!   [`crate::script::execute`] (the Redis module) plans the group it reads back, states found
//!   by their place in Redis;
//! - the script's Lua (`script/engine.lua`, the first step of its `run`) follows the plan it
//!   was sent, in the same steps as [`GroupPlan::add_entry`].

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use smallvec::SmallVec;

use crate::algorithm::AnyAlgorithm;
use crate::decision::LeaseId;
use crate::limits::MAX_BATCH_PARTS;
use crate::ruleset::CompiledRule;
use crate::{Error, Operation, Part, RuleSet};

/// Beyond this many states, a plan finds a state by hash rather than by scanning.
const SCAN_STATES: usize = 16;

/// A state's place for the memory backend (and for validation): a key under a rule, the same
/// state as another place with the same key and rule signature.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyRule<'a> {
    /// The key whose state it is.
    pub key: &'a str,
    /// The rule, of the first part naming the state.
    pub rule: &'a CompiledRule,
}

impl PartialEq for KeyRule<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.rule.signature == other.rule.signature
    }
}

impl Eq for KeyRule<'_> {}

impl Hash for KeyRule<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.key, &*self.rule.signature).hash(state);
    }
}

/// One state a group works on: its place (`P`: where its backend finds it), its algorithm,
/// and what the group asks of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlannedState<'a, P> {
    /// Where the state is: [`KeyRule`] for the memory backend, the call's state index for
    /// [`crate::script::execute`].
    pub place: P,
    /// The algorithm of the first entry naming the state.
    pub algorithm: &'a AnyAlgorithm,
    /// The units the group's parts ask of it, together.
    pub demand: u64,
    /// The lease that an acquire takes the units under (the last acquiring part's).
    pub lease: Option<&'a LeaseId>,
}

/// One part of a group, as planned: its operation, and where its entries start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlannedPart<'a> {
    pub op: Operation<'a>,
    /// Where this part's entries start in [`GroupPlan::uses`].
    start: usize,
}

/// The first state of a group asked for more than its rule's capacity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OverCapacity {
    /// The part (its position in the group) at which the demand passed the capacity.
    pub part: usize,
    /// The entry's position in that part (its rule's position in the part's rule set).
    pub rule: usize,
    /// The demand so far.
    pub demand: u64,
}

/// A group's parts, its distinct states with the summed demand on each, and for each *entry*
/// (a rule of a part; the parts' rules in order) the index of its state. Built in one pass:
/// [`add_part`](Self::add_part), then [`add_entry`](Self::add_entry) for each of its rules.
#[derive(Clone, Debug)]
pub(crate) struct GroupPlan<'a, P = KeyRule<'a>> {
    parts: SmallVec<[PlannedPart<'a>; 1]>,
    states: SmallVec<[PlannedState<'a, P>; 4]>,
    /// Each entry's state index, part after part.
    uses: SmallVec<[u16; 8]>,
    /// Each place's state index, once the states outgrow a scan.
    index: Option<HashMap<P, u16>>,
    over: Option<OverCapacity>,
}

/// The units an operation asks of each of its states, and the lease it takes them under.
fn cost_and_lease<'a>(op: &Operation<'a>) -> (u64, Option<&'a LeaseId>) {
    match *op {
        Operation::Check { cost } => (cost, None),
        Operation::Acquire { cost, lease } => (cost, Some(lease)),
        Operation::Refund { .. } | Operation::Release { .. } => (0, None),
    }
}

impl<'a> GroupPlan<'a> {
    /// The plan of a group of `(key, rules, operation)` parts, in order.
    pub fn new(parts: impl IntoIterator<Item = (&'a str, &'a RuleSet, Operation<'a>)>) -> Self {
        let mut plan = GroupPlan::empty();
        for (key, rules, op) in parts {
            plan.add_part(op);
            for rule in rules.compiled() {
                plan.add_entry(KeyRule { key, rule }, &rule.algorithm);
            }
        }
        plan
    }
}

impl<'a, P: Copy + Eq + Hash> GroupPlan<'a, P> {
    /// A plan of no parts yet.
    pub fn empty() -> Self {
        GroupPlan {
            parts: SmallVec::new(),
            states: SmallVec::new(),
            uses: SmallVec::new(),
            index: None,
            over: None,
        }
    }

    /// Starts the next part, whose entries [`add_entry`](Self::add_entry) adds.
    pub fn add_part(&mut self, op: Operation<'a>) {
        self.parts.push(PlannedPart { op, start: self.uses.len() });
    }

    /// Adds an entry of the last part: the state at `place` under `algorithm`. The state is
    /// the group's first at that place, or a new one (the steps the Lua's plan takes: see
    /// `run` in `script/engine.lua`): the part's cost is added to its demand, an acquire's
    /// lease becomes its lease, and the first state whose demand passes its capacity is noted
    /// ([`over_capacity`](Self::over_capacity)). Returns the state's index.
    pub fn add_entry(&mut self, place: P, algorithm: &'a AnyAlgorithm) -> u16 {
        let Some(part) = self.parts.last() else { unreachable!("add_part comes first") };
        let (cost, lease) = cost_and_lease(&part.op);
        let found = match &self.index {
            Some(index) => index.get(&place).copied(),
            None => self.states.iter().position(|s| s.place == place).map(|at| at as u16),
        };
        let at = match found {
            Some(at) => at,
            None => {
                let at = self.states.len() as u16;
                self.states.push(PlannedState { place, algorithm, demand: 0, lease: None });
                if let Some(index) = &mut self.index {
                    index.insert(place, at);
                } else if self.states.len() > SCAN_STATES {
                    self.index =
                        Some(self.states.iter().enumerate().map(|(i, s)| (s.place, i as u16)).collect());
                }
                at
            }
        };
        let state = &mut self.states[usize::from(at)];
        // Saturating: a script call's costs are read, not validated against a rule set.
        state.demand = state.demand.saturating_add(cost);
        if lease.is_some() {
            state.lease = lease;
        }
        if self.over.is_none() && state.demand > state.algorithm.capacity() {
            let part = self.parts.len() - 1;
            let rule = self.uses.len() - self.parts[part].start;
            self.over = Some(OverCapacity { part, rule, demand: state.demand });
        }
        self.uses.push(at);
        at
    }
}

impl<'a, P> GroupPlan<'a, P> {
    /// The group's parts, in order.
    pub fn parts(&self) -> &[PlannedPart<'a>] {
        &self.parts
    }

    /// The distinct states, in the order parts first name them.
    pub fn states(&self) -> &[PlannedState<'a, P>] {
        &self.states
    }

    /// The state index of each of part `part`'s entries, in order.
    pub fn uses(&self, part: usize) -> &[u16] {
        let start = self.parts[part].start;
        let end = self.parts.get(part + 1).map_or(self.uses.len(), |next| next.start);
        &self.uses[start..end]
    }

    /// How many entries the group has (its parts' rules together).
    pub fn entry_count(&self) -> usize {
        self.uses.len()
    }

    /// The part of the group's `at`-th entry, and the entry's state index.
    pub fn entry_at(&self, at: usize) -> (usize, u16) {
        let part = self.parts.partition_point(|p| p.start <= at) - 1;
        (part, self.uses[at])
    }

    /// The first state asked for more than it can ever hold, if any.
    pub fn over_capacity(&self) -> Option<OverCapacity> {
        self.over
    }
}

/// A batch of [`Part`]s, validated, with its groups in the order backends decide them (the
/// order in which groups first appear) and each group's plan. See [`Part`]. Built once, by
/// whoever validates the batch first, and handed to the backend
/// ([`Backend::check_planned`](crate::Backend::check_planned)), which decides from it.
#[derive(Clone, Debug)]
pub struct BatchPlan<'a> {
    parts: &'a [Part<'a>],
    groups: Vec<(SmallVec<[usize; 4]>, GroupPlan<'a>)>,
}

impl<'a> BatchPlan<'a> {
    /// Checks a batch before any backend is touched, and plans it: its size, each part's
    /// operation ([`Operation::validate`]), and that each group's demand on every
    /// state fits the rule's capacity. An error about one part is [`Error::InPart`] (for a
    /// state asked too much, the part at which the group's demand on it passed the capacity).
    pub fn new(parts: &'a [Part<'a>]) -> Result<Self, Error> {
        if parts.is_empty() || parts.len() > MAX_BATCH_PARTS {
            return Err(Error::BatchSize { parts: parts.len(), max: MAX_BATCH_PARTS });
        }
        let in_part = |part: usize, error: Error| Error::InPart { part, error: Box::new(error) };
        for (i, part) in parts.iter().enumerate() {
            part.op.validate(part.key, part.rules).map_err(|e| in_part(i, e))?;
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
                (part.key, part.rules, part.op)
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
        Ok(BatchPlan { parts, groups })
    }

    /// The batch's parts, in the caller's order.
    pub fn parts(&self) -> &'a [Part<'a>] {
        self.parts
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
