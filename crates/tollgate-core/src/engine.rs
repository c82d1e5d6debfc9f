//! The engine: one group of operations run over its states, in the same phases in both forms
//! (the Rust ones here, run by the memory backend; the Lua ones in `script/engine.lua`, run
//! inside Redis):
//!
//! 1. *refresh* each state to `now` (roll windows over, drop expired entries);
//! 2. apply a refund or a release, if that is a part's operation;
//! 3. *decide* each state for the demand on it, at least 1, so that a peek (cost 0) answers
//!    "would one more unit be admitted";
//! 4. if every state admits, *consume* the demand on every state (all or nothing);
//! 5. *report* each part's rules: remaining units and time until full again.
//!
//! The engine never knows where states live: it reaches them through [`States`], by their
//! index in the group's plan. Nor does it know where the plan came from: [`phases`] runs any
//! [`Group`]. The memory backend runs a batch's [`GroupPlan`] over its map ([`run_group`]), a
//! lone operation's rules each on its algorithm's own type ([`run`], the phases taken apart per
//! state) and a set of one rule through [`phases`] on its algorithm's type ([`run_one`]), the
//! enum matched by [`AnyAlgorithm::visit`]; [`crate::script::execute`] runs a plan read from a
//! script call's arguments over states read from Redis (in a module).

use smallvec::SmallVec;

use crate::algorithm::{Admission, Algorithm, AnyAlgorithm, Machine, Report, State, Visit};
use crate::decision::{LeaseId, Row};
use crate::plan::GroupPlan;
use crate::ruleset::micros;
use crate::{Decision, Operation, RuleSet};

/// Access to the states of a group, by their index in its plan.
pub(crate) trait States<S = State> {
    /// The state at `index`, loaded (or no state at all, of the planned rule's algorithm).
    fn get(&mut self, index: usize) -> &mut S;

    /// When the state at `index` expires, now that [`run`] is done with it (what
    /// [`AnyAlgorithm::expires_at`] would answer, found on the way). By default not kept.
    fn expires(&mut self, index: usize, at: Option<i64>) {
        let _ = (index, at);
    }
}

/// One state a group works on, as the engine needs it: its rule's algorithm, the units the
/// group's parts ask of it together, and the lease an acquire takes them under.
pub(crate) struct Demand<'a, M = AnyAlgorithm> {
    pub algorithm: &'a M,
    pub units: u64,
    pub lease: Option<&'a LeaseId>,
}

/// One rule of one part of a group (an *entry*): its algorithm, the index of its state, and its
/// part's operation.
pub(crate) struct Entry<'a, M = AnyAlgorithm> {
    pub algorithm: &'a M,
    pub state: usize,
    pub op: Operation<'a>,
}

/// A group as [`phases`] runs it: its distinct states, with the demand on each (their indices
/// are those of [`States::get`]), and its *entries*, the rules of its parts, part after part,
/// each part's rules in order. Indexed rather than iterated, so that the phases walk them
/// without building anything.
pub(crate) trait Group<'a> {
    /// What the states are decided by: [`AnyAlgorithm`], or one algorithm's own type.
    type Machine: Machine + 'a;
    /// How many distinct states.
    fn states(&self) -> usize;
    /// The state at `at`, and what the group asks of it.
    fn demand(&self, at: usize) -> Demand<'a, Self::Machine>;
    /// How many entries.
    fn entries(&self) -> usize;
    /// The entry at `at`.
    fn entry(&self, at: usize) -> Entry<'a, Self::Machine>;
}

/// Runs a group's parts together, all or nothing, in the phases of the module doc: each state
/// is refreshed once, asked once for its demand, and consumed only if every state admits.
/// `emit` receives each entry's admission (its state's) and report, in order. The caller has
/// validated the group.
pub(crate) fn phases<'a, G: Group<'a>>(
    now: i64,
    group: &G,
    states: &mut impl States<<G::Machine as Machine>::State>,
    mut emit: impl FnMut(Admission, Report),
) {
    for at in 0..group.states() {
        group.demand(at).algorithm.refresh(states.get(at), now);
    }
    for at in 0..group.entries() {
        let entry = group.entry(at);
        match entry.op {
            Operation::Refund { amount } => entry.algorithm.refund(states.get(entry.state), now, amount),
            Operation::Release { lease } => {
                entry.algorithm.release(states.get(entry.state), now, &lease.id, lease.units);
            }
            Operation::Check { .. } | Operation::Acquire { .. } => {}
        }
    }
    // Pushed one by one: `collect` into a SmallVec costs more on the path of every decision.
    let mut admissions: SmallVec<[Admission; 8]> = SmallVec::new();
    for at in 0..group.states() {
        let demand = group.demand(at);
        admissions.push(demand.algorithm.decide(states.get(at), now, demand.units.max(1)));
    }
    if admissions.iter().all(|a| a.admits) {
        for at in 0..group.states() {
            let demand = group.demand(at);
            if demand.units > 0 {
                demand.algorithm.consume(states.get(at), now, demand.units, demand.lease);
            }
        }
    }
    for at in 0..group.entries() {
        let entry = group.entry(at);
        emit(admissions[entry.state], entry.algorithm.report(states.get(entry.state), now));
    }
}

impl<'a, P> Group<'a> for GroupPlan<'a, P> {
    type Machine = AnyAlgorithm;

    fn states(&self) -> usize {
        GroupPlan::states(self).len()
    }

    fn demand(&self, at: usize) -> Demand<'a> {
        let s = &GroupPlan::states(self)[at];
        Demand { algorithm: s.algorithm, units: s.demand, lease: s.lease }
    }

    fn entries(&self) -> usize {
        self.entry_count()
    }

    fn entry(&self, at: usize) -> Entry<'a> {
        let (part, state) = self.entry_at(at);
        let state = usize::from(state);
        // An entry's algorithm is its state's: entries share a state only under the same rule.
        Entry { algorithm: GroupPlan::states(self)[state].algorithm, state, op: self.parts()[part].op }
    }
}

/// A lone operation under a set of one rule (the commonest set): one state, decided by its
/// algorithm's own type, so that [`phases`], made for it, runs no loops and matches no enum.
struct One<'a, A> {
    algorithm: &'a A,
    op: Operation<'a>,
    units: u64,
    lease: Option<&'a LeaseId>,
}

impl<'a, A: Algorithm> Group<'a> for One<'a, A> {
    type Machine = A;

    fn states(&self) -> usize {
        1
    }

    fn demand(&self, _: usize) -> Demand<'a, A> {
        Demand { algorithm: self.algorithm, units: self.units, lease: self.lease }
    }

    fn entries(&self) -> usize {
        1
    }

    fn entry(&self, _: usize) -> Entry<'a, A> {
        Entry { algorithm: self.algorithm, state: 0, op: self.op }
    }
}

/// The one state of [`One`].
struct Held<'s, S>(&'s mut S);

impl<S> States<S> for Held<'_, S> {
    fn get(&mut self, _: usize) -> &mut S {
        self.0
    }
}

/// [`phases`] over [`One`], once its algorithm's type is known ([`AnyAlgorithm::visit`]).
struct RunOne<'a> {
    now: i64,
    op: Operation<'a>,
}

impl Visit for RunOne<'_> {
    /// The admission and report, and when the state expires after.
    type Output = (Admission, Report, Option<i64>);

    fn visit<A: Algorithm>(self, algorithm: &A, state: &mut A::State) -> Self::Output {
        let (units, lease) = demand_of(self.op);
        let one = One { algorithm, op: self.op, units, lease };
        let mut out = (Admission::ADMIT, Report { remaining: 0, reset_after: 0 });
        phases(self.now, &one, &mut Held(state), |admission, report| out = (admission, report));
        (out.0, out.1, algorithm.expires_at(state))
    }
}

/// The units an operation asks of each of its rules' states, and the lease it takes them under.
fn demand_of(op: Operation<'_>) -> (u64, Option<&LeaseId>) {
    match op {
        Operation::Check { cost } => (cost, None),
        Operation::Acquire { cost, lease } => (cost, Some(lease)),
        Operation::Refund { .. } | Operation::Release { .. } => (0, None),
    }
}

/// The first phases of one state of a lone operation, on its algorithm's own type
/// ([`AnyAlgorithm::visit`]): refresh, a refund or release, and the decision.
struct Prepare<'a> {
    now: i64,
    op: Operation<'a>,
    probe: u64,
}

impl Visit for Prepare<'_> {
    type Output = Admission;

    #[inline(always)] // once per rule of a set, as `Finish`
    fn visit<A: Algorithm>(self, algorithm: &A, state: &mut A::State) -> Admission {
        algorithm.refresh(state, self.now);
        match self.op {
            Operation::Refund { amount } => algorithm.refund(state, self.now, amount),
            Operation::Release { lease } => algorithm.release(state, self.now, &lease.id, lease.units),
            Operation::Check { .. } | Operation::Acquire { .. } => {}
        }
        algorithm.decide(state, self.now, self.probe)
    }
}

/// The last phases of one state of a lone operation, on its algorithm's own type: `units`
/// consumed (none unless every state admitted), the report, and when the state expires.
struct Finish<'a> {
    now: i64,
    units: u64,
    lease: Option<&'a LeaseId>,
}

impl Visit for Finish<'_> {
    type Output = (Report, Option<i64>);

    #[inline(always)] // once per rule of a set: a call costs as much as a report
    fn visit<A: Algorithm>(self, algorithm: &A, state: &mut A::State) -> Self::Output {
        if self.units > 0 {
            algorithm.consume(state, self.now, self.units, self.lease);
        }
        (algorithm.report(state, self.now), algorithm.expires_at(state))
    }
}

/// Runs one operation on a key's states under a rule set: a group of one part, whose rules
/// are states `0..n` in order (what a [`GroupPlan`] of that one part would say), and tells
/// `states` when each expires. Its rows go into `decision` (being built, see
/// [`Decision::building`]: a decision is too large to move cheaply), complete after. The
/// caller has validated the operation ([`Operation::validate`]). A set of one rule runs as
/// [`run_one`].
///
/// The phases are [`phases`]' in effect, each state's run apart on its algorithm's own type
/// (two matches of the enum per rule, not one per phase): a rule set holds no two rules of the
/// same parameters, so a lone operation's rules have a state each and no state's phases see
/// another's; all or nothing holds, as every state decides before any consumes.
pub(crate) fn run(
    rules: &RuleSet,
    op: Operation<'_>,
    now: i64,
    states: &mut impl States,
    decision: &mut Decision,
) {
    let (units, lease) = demand_of(op);
    let compiled = rules.compiled();
    let rows = decision.start_rows(compiled.len());
    let probe = units.max(1);
    // Each rule's row made as its state decides, its report filled in below.
    for (at, (rule, row)) in compiled.iter().zip(rows.iter_mut()).enumerate() {
        *row = rule.row(rule.algorithm.visit(states.get(at), Prepare { now, op, probe }));
    }
    let admitted = rows.iter().all(Row::allowed);
    let units = if admitted { units } else { 0 };
    // The binding rule found as the reports are filled in, not in a pass of its own.
    let mut binding = (0, Row::default());
    for (at, (rule, row)) in compiled.iter().zip(rows.iter_mut()).enumerate() {
        let (report, expires_at) = rule.algorithm.visit(states.get(at), Finish { now, units, lease });
        states.expires(at, expires_at);
        row.report(report.remaining, micros(report.reset_after));
        if at == 0 || row.binds_over(&binding.1, admitted) {
            binding = (at, *row);
        }
    }
    decision.bound(binding.0);
}

/// [`run`] under a set of one rule (the commonest set), on its one `state`: the rule's
/// algorithm matched once, its phases compiled for it. Returns when the state expires after
/// (what [`AnyAlgorithm::expires_at`] would answer, found on the way).
pub(crate) fn run_one(
    rules: &RuleSet,
    op: Operation<'_>,
    now: i64,
    state: &mut State,
    decision: &mut Decision,
) -> Option<i64> {
    let rule = &rules.compiled()[0];
    let (admission, report, expires_at) = rule.algorithm.visit(state, RunOne { now, op });
    let row = &mut decision.start_rows(1)[0];
    *row = rule.row(admission);
    row.report(report.remaining, micros(report.reset_after));
    decision.bound(0);
    expires_at
}

/// Runs a group's parts together ([`phases`]); `emit` receives each part's decision (by its
/// position in the group), made of its outcomes under its rules (`rules_of` the part). The
/// caller has validated the group ([`crate::BatchPlan::new`]).
pub(crate) fn run_group<'r, P>(
    now: i64,
    plan: &GroupPlan<'_, P>,
    rules_of: impl Fn(usize) -> &'r RuleSet,
    states: &mut impl States,
    mut emit: impl FnMut(usize, Decision),
) {
    let (mut part, mut rule) = (0, 0);
    let mut decision = Decision::building();
    phases(now, plan, states, |admission, report| {
        let rules = rules_of(part);
        if rule == 0 {
            decision.start_rows(rules.len());
        }
        let row = &mut decision.rows_mut()[rule];
        *row = rules.compiled()[rule].row(admission);
        row.report(report.remaining, micros(report.reset_after));
        rule += 1;
        if rule == rules.len() {
            decision.settle();
            emit(part, std::mem::replace(&mut decision, Decision::building()));
            (part, rule) = (part + 1, 0);
        }
    });
}
