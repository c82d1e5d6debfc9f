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
//! index in the group's [`GroupPlan`]. The memory backend implements it over its map; a store
//! inside Redis (a module) could implement it over Redis keys.

use smallvec::SmallVec;

use crate::algorithm::{Admission, State};
use crate::plan::GroupPlan;
use crate::{Decision, Operation};

/// Access to the states of a group, by their index in its [`GroupPlan`]
/// ([`GroupPlan::states`]).
pub(crate) trait States {
    /// The state at `index`, loaded (or no state at all, of the planned rule's algorithm).
    fn get(&mut self, index: usize) -> &mut State;
}

/// Runs one operation on a key's states under a rule set: a group of one part, whose rules
/// are states `0..n` in order. The caller has validated the operation
/// ([`Operation::validate`]).
pub(crate) fn run(plan: &GroupPlan<'_>, now: i64, states: &mut impl States) -> Decision {
    let mut decision = None;
    run_group(now, plan, states, |_, d| decision = Some(d));
    decision.unwrap_or_else(|| unreachable!("a plan of one part emits one decision"))
}

/// Runs a group's parts together, all or nothing, in the phases of the module doc: each
/// state is refreshed once, asked once for the sum of the costs of the parts naming it, and
/// consumed only if every state admits. `emit` receives each part's decision (by its position
/// in the group). The caller has validated the group ([`crate::BatchPlan::new`]).
pub(crate) fn run_group(
    now: i64,
    plan: &GroupPlan<'_>,
    states: &mut impl States,
    mut emit: impl FnMut(usize, Decision),
) {
    let planned = plan.states();
    for (at, state) in planned.iter().enumerate() {
        state.rule.algorithm.refresh(states.get(at), now);
    }
    for (p, part) in plan.parts().iter().enumerate() {
        let rules = part.rules.compiled().iter().zip(plan.uses(p));
        match part.op {
            Operation::Refund { amount } => {
                for (rule, &at) in rules {
                    rule.algorithm.refund(states.get(usize::from(at)), now, amount);
                }
            }
            Operation::Release { lease } => {
                for (rule, &at) in rules {
                    rule.algorithm.release(states.get(usize::from(at)), now, &lease.id, lease.units);
                }
            }
            Operation::Check { .. } | Operation::Acquire { .. } => {}
        }
    }
    let admissions: SmallVec<[Admission; 8]> = planned
        .iter()
        .enumerate()
        .map(|(at, state)| state.rule.algorithm.decide(states.get(at), now, state.demand.max(1)))
        .collect();
    if admissions.iter().all(|a| a.admits) {
        for (at, state) in planned.iter().enumerate() {
            if state.demand > 0 {
                state.rule.algorithm.consume(states.get(at), now, state.demand, state.lease);
            }
        }
    }
    for (p, part) in plan.parts().iter().enumerate() {
        let outcomes = part
            .rules
            .compiled()
            .iter()
            .zip(plan.uses(p))
            .enumerate()
            .map(|(i, (rule, &at))| {
                let at = usize::from(at);
                let report = rule.algorithm.report(states.get(at), now);
                part.rules.outcome(i, admissions[at], report)
            })
            .collect();
        emit(p, Decision::from_outcomes(outcomes));
    }
}
