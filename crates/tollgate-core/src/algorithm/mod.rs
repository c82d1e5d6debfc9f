//! The algorithms, as pure state machines over integer microseconds.
//!
//! Each algorithm lives in one module here (its Rust form, run by the memory backend) with its
//! Lua twin in a `.lua` file beside it (run inside Redis by `tollgate-redis`, see [`lua`]). The
//! twins compute the same numbers in the same order; differential tests hold them to it.
//!
//! An operation on a rule set runs in the same phases in both forms:
//! 1. *refresh* each rule's state to `now` (roll windows over, drop expired entries);
//! 2. apply a refund or a release, if that is the operation;
//! 3. *decide* each rule for the probe cost, `max(cost, 1)`, so that a peek (cost 0) answers
//!    "would one more unit be admitted";
//! 4. if every rule admits and the cost is above zero, *consume* on every rule (all or nothing);
//! 5. *report* each rule's remaining units and time until it is full again.
//!
//! Every state also knows when it *expires*: the moment it becomes indistinguishable from no
//! state at all. The memory backend drops it then; Redis keys carry it as their TTL.

mod concurrency;
mod fixed_window;
mod gcra;
pub mod lua;
mod sliding_window_counter;
mod sliding_window_log;
mod token_bucket;

use std::time::Duration;

use smallvec::SmallVec;

use crate::decision::{LeaseId, RuleOutcome};
use crate::rule::{Align, RuleKind};
use crate::{Decision, Operation, RuleSet};

pub(crate) use gcra::Inexact;

/// A rule's parameters, compiled to the integers its state machine works with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindowLog(sliding_window_log::SlidingWindowLog),
    SlidingWindowCounter(sliding_window_counter::SlidingWindowCounter),
    Gcra(gcra::Gcra),
    Concurrency(concurrency::Concurrency),
}

/// A rule's state for one key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum State {
    FixedWindow(fixed_window::State),
    SlidingWindowLog(sliding_window_log::State),
    SlidingWindowCounter(sliding_window_counter::State),
    Gcra(gcra::State),
    Concurrency(concurrency::State),
}

/// Whether a rule admits the probe cost, and if not, how long until it would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub admits: bool,
    pub retry_after: i64,
}

impl Verdict {
    pub const ADMIT: Verdict = Verdict { admits: true, retry_after: 0 };

    pub fn wait(micros: i64) -> Verdict {
        Verdict { admits: false, retry_after: micros }
    }
}

/// A rule's state as reported to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub remaining: u64,
    pub reset_after: i64,
}

/// `floor(a / b)` for `b > 0`, also for negative `a` (a clock set before the epoch in a test).
pub(crate) fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

fn micros(d: i64) -> Duration {
    Duration::from_micros(u64::try_from(d).unwrap_or(0))
}

fn to_i64(v: u64) -> i64 {
    // Every parameter is validated far below i64::MAX (see `limits`).
    i64::try_from(v).unwrap_or(i64::MAX)
}

// Dispatches on the algorithm, handing the body the matching state variant. A state of another
// variant cannot occur (a state is found by its rule's signature, which names the algorithm),
// but if it did it would be replaced by a fresh one rather than panic.
macro_rules! dispatch {
    ($algo:expr, $state:expr, |$a:ident, $s:ident| $body:expr) => {
        match $algo {
            Algo::FixedWindow($a) => {
                if !matches!($state, State::FixedWindow(_)) {
                    *$state = State::FixedWindow(Default::default());
                }
                let State::FixedWindow($s) = $state else { unreachable!() };
                $body
            }
            Algo::SlidingWindowLog($a) => {
                if !matches!($state, State::SlidingWindowLog(_)) {
                    *$state = State::SlidingWindowLog(Default::default());
                }
                let State::SlidingWindowLog($s) = $state else { unreachable!() };
                $body
            }
            Algo::SlidingWindowCounter($a) => {
                if !matches!($state, State::SlidingWindowCounter(_)) {
                    *$state = State::SlidingWindowCounter(Default::default());
                }
                let State::SlidingWindowCounter($s) = $state else { unreachable!() };
                $body
            }
            Algo::Gcra($a) => {
                if !matches!($state, State::Gcra(_)) {
                    *$state = State::Gcra(Default::default());
                }
                let State::Gcra($s) = $state else { unreachable!() };
                $body
            }
            Algo::Concurrency($a) => {
                if !matches!($state, State::Concurrency(_)) {
                    *$state = State::Concurrency(Default::default());
                }
                let State::Concurrency($s) = $state else { unreachable!() };
                $body
            }
        }
    };
}

impl Algo {
    /// Compiles a rule's parameters; the caller has range-checked them.
    pub(crate) fn compile(kind: &RuleKind) -> Result<Algo, Inexact> {
        Ok(match *kind {
            RuleKind::FixedWindow { limit, period, align } => {
                Algo::FixedWindow(fixed_window::FixedWindow::new(limit, period, align))
            }
            RuleKind::SlidingWindowLog { limit, period } => {
                Algo::SlidingWindowLog(sliding_window_log::SlidingWindowLog::new(limit, period))
            }
            RuleKind::SlidingWindowCounter { limit, period } => {
                Algo::SlidingWindowCounter(sliding_window_counter::SlidingWindowCounter::new(limit, period))
            }
            RuleKind::TokenBucket { capacity, refill, per } => {
                Algo::Gcra(token_bucket::compile(capacity, refill, per)?)
            }
            RuleKind::Gcra { limit, period, burst } => {
                Algo::Gcra(gcra::Gcra::new(burst, period.as_micros(), limit)?)
            }
            RuleKind::Concurrency { limit, lease } => {
                Algo::Concurrency(concurrency::Concurrency::new(limit, lease))
            }
        })
    }

    /// The state's identity: algorithm and parameters, so a changed rule never reads the state
    /// of the old one; and, where the stored form of an algorithm's state changed, its version.
    ///
    /// Sliding logs and concurrency leases are at version 2 (`swl2`, `cc2`): their Redis sets
    /// now hold one member per distinct time or per lease, where version 1 (`swl`, `cc`) held
    /// one per unit. An upgraded Tollgate never reads a version-1 set (it would miscount it, and
    /// a version-1 Tollgate still running beside it in a rolling upgrade would miscount a
    /// version-2 one); the old keys expire by their TTL, at most one period or lease later.
    pub(crate) fn signature(kind: &RuleKind) -> String {
        match *kind {
            RuleKind::FixedWindow { limit, period, align: Align::Clock } => {
                format!("fw:{limit}:{}", period.as_micros())
            }
            RuleKind::FixedWindow { limit, period, align: Align::FirstHit } => {
                format!("fwh:{limit}:{}", period.as_micros())
            }
            RuleKind::SlidingWindowLog { limit, period } => {
                format!("swl2:{limit}:{}", period.as_micros())
            }
            RuleKind::SlidingWindowCounter { limit, period } => {
                format!("swc:{limit}:{}", period.as_micros())
            }
            RuleKind::TokenBucket { capacity, refill, per } => {
                format!("tb:{capacity}:{refill}:{}", per.as_micros())
            }
            RuleKind::Gcra { limit, period, burst } => {
                format!("gcra:{limit}:{}:{burst}", period.as_micros())
            }
            RuleKind::Concurrency { limit, lease } => format!("cc2:{limit}:{}", lease.as_micros()),
        }
    }

    /// The most units the rule admits at once; also the `limit` it reports.
    /// The fields of the algorithm's state when it is a Redis hash (the `.lua` twin's
    /// `hstore` calls write exactly these); `None` for states that are sorted sets.
    pub(crate) fn hash_fields(&self) -> Option<&'static [&'static str]> {
        match self {
            Algo::FixedWindow(_) => Some(&["s", "c"]),
            Algo::SlidingWindowCounter(_) => Some(&["s", "p", "c"]),
            Algo::Gcra(_) => Some(&["t", "f"]),
            Algo::SlidingWindowLog(_) | Algo::Concurrency(_) => None,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        match self {
            Algo::FixedWindow(a) => a.limit,
            Algo::SlidingWindowLog(a) => a.limit,
            Algo::SlidingWindowCounter(a) => a.limit,
            Algo::Gcra(a) => a.capacity,
            Algo::Concurrency(a) => a.limit,
        }
    }

    pub(crate) fn new_state(&self) -> State {
        match self {
            Algo::FixedWindow(_) => State::FixedWindow(Default::default()),
            Algo::SlidingWindowLog(_) => State::SlidingWindowLog(Default::default()),
            Algo::SlidingWindowCounter(_) => State::SlidingWindowCounter(Default::default()),
            Algo::Gcra(_) => State::Gcra(Default::default()),
            Algo::Concurrency(_) => State::Concurrency(Default::default()),
        }
    }

    fn refresh(&self, state: &mut State, now: i64) {
        dispatch!(self, state, |a, s| a.refresh(s, now))
    }

    fn decide(&self, state: &mut State, now: i64, probe: u64) -> Verdict {
        dispatch!(self, state, |a, s| a.decide(s, now, probe))
    }

    // The mutations below match on the (rule, state) pair; `refresh` has already made the
    // state the rule's own variant, so the fallback arm never runs.

    fn consume(&self, state: &mut State, now: i64, cost: u64, lease: Option<&LeaseId>) {
        match (self, state) {
            (Algo::FixedWindow(a), State::FixedWindow(s)) => a.consume(s, now, cost),
            (Algo::SlidingWindowLog(a), State::SlidingWindowLog(s)) => a.consume(s, now, cost),
            (Algo::SlidingWindowCounter(a), State::SlidingWindowCounter(s)) => a.consume(s, cost),
            (Algo::Gcra(a), State::Gcra(s)) => a.consume(s, now, cost),
            // A check never reaches a concurrency rule with a cost (`Operation::validate`), so
            // a lease is always there.
            (Algo::Concurrency(a), State::Concurrency(s)) => {
                if let Some(id) = lease {
                    a.acquire(s, now, cost, id);
                }
            }
            _ => {}
        }
    }

    fn refund(&self, state: &mut State, now: i64, amount: u64) {
        match (self, state) {
            (Algo::FixedWindow(a), State::FixedWindow(s)) => a.refund(s, amount),
            (Algo::SlidingWindowLog(a), State::SlidingWindowLog(s)) => a.refund(s, amount),
            (Algo::SlidingWindowCounter(a), State::SlidingWindowCounter(s)) => a.refund(s, amount),
            (Algo::Gcra(a), State::Gcra(s)) => a.refund(s, now, amount),
            // Units held by leases are given back by release, not refund.
            _ => {}
        }
    }

    fn release(&self, state: &mut State, id: &LeaseId, units: u64) {
        if let (Algo::Concurrency(a), State::Concurrency(s)) = (self, state) {
            a.release(s, id, units);
        }
    }

    fn report(&self, state: &mut State, now: i64) -> Report {
        dispatch!(self, state, |a, s| a.report(s, now))
    }

    /// When the state becomes the same as no state; `None` if it already is.
    pub(crate) fn expires_at(&self, state: &mut State) -> Option<i64> {
        dispatch!(self, state, |a, s| a.expires_at(s))
    }
}

/// Access to the states an operation works on, by position.
pub(crate) trait States {
    fn get(&mut self, index: usize) -> &mut State;
}

/// One member of a group run by [`run_group`]: its rules, its operation, and for each of its
/// rules the position of that rule's state among the group's states (members naming the same
/// state share it).
pub(crate) struct Member<'a> {
    pub rules: &'a RuleSet,
    pub op: Operation<'a>,
    pub states: &'a [usize],
}

/// Positions `0..n` for a lone member, whose rules' states are all distinct.
pub(crate) const IDENTITY: [usize; crate::limits::MAX_RULES] = {
    let mut out = [0; crate::limits::MAX_RULES];
    let mut i = 0;
    while i < out.len() {
        out[i] = i;
        i += 1;
    }
    out
};

/// Runs one operation on a rule set's states: the phases in the module doc. The caller has
/// validated the operation ([`Operation::validate`]).
pub(crate) fn run(rules: &RuleSet, now: i64, op: &Operation<'_>, states: &mut impl States) -> Decision {
    let member = Member { rules, op: *op, states: &IDENTITY[..rules.len()] };
    let mut decision = None;
    run_group(now, std::slice::from_ref(&member), states, |_, d| decision = Some(d));
    decision.unwrap_or_else(|| Decision::admitted_unchecked(rules))
}

/// Runs a group's members together, all or nothing, in the phases of the module doc: each
/// state is refreshed once, asked once for the sum of the costs of the members naming it, and
/// consumed only if every state admits. `emit` receives each member's decision. The caller
/// has validated the group ([`crate::validate_batch`]).
pub(crate) fn run_group(
    now: i64,
    members: &[Member<'_>],
    states: &mut impl States,
    mut emit: impl FnMut(usize, Decision),
) {
    let count = members.iter().flat_map(|m| m.states.iter()).max().map_or(0, |&max| max + 1);
    let mut algos: SmallVec<[Option<&Algo>; 8]> = SmallVec::from_elem(None, count);
    let mut demand: SmallVec<[u64; 8]> = SmallVec::from_elem(0, count);
    let mut leases: SmallVec<[Option<&LeaseId>; 8]> = SmallVec::from_elem(None, count);
    for member in members {
        let (cost, lease) = match member.op {
            Operation::Check { cost } => (cost, None),
            Operation::Acquire { cost, lease } => (cost, Some(lease)),
            Operation::Refund { .. } | Operation::Release { .. } => (0, None),
        };
        for (rule, &at) in member.rules.compiled().iter().zip(member.states) {
            algos[at] = Some(&rule.algo);
            demand[at] += cost;
            if lease.is_some() {
                leases[at] = lease;
            }
        }
    }
    for (at, algo) in algos.iter().enumerate() {
        if let Some(algo) = algo {
            algo.refresh(states.get(at), now);
        }
    }
    for member in members {
        for (rule, &at) in member.rules.compiled().iter().zip(member.states) {
            match member.op {
                Operation::Refund { amount } => rule.algo.refund(states.get(at), now, amount),
                Operation::Release { lease } => rule.algo.release(states.get(at), &lease.id, lease.units),
                Operation::Check { .. } | Operation::Acquire { .. } => {}
            }
        }
    }
    let verdicts: SmallVec<[Verdict; 8]> = (0..count)
        .map(|at| match algos[at] {
            Some(algo) => algo.decide(states.get(at), now, demand[at].max(1)),
            None => Verdict::ADMIT,
        })
        .collect();
    if verdicts.iter().all(|v| v.admits) {
        for (at, algo) in algos.iter().enumerate() {
            if let Some(algo) = algo
                && demand[at] > 0
            {
                algo.consume(states.get(at), now, demand[at], leases[at]);
            }
        }
    }
    for (m, member) in members.iter().enumerate() {
        let outcomes = member
            .rules
            .compiled()
            .iter()
            .zip(member.states)
            .enumerate()
            .map(|(i, (rule, &at))| {
                let report = rule.algo.report(states.get(at), now);
                member.rules.outcome(i, verdicts[at], report)
            })
            .collect();
        emit(m, Decision::from_outcomes(outcomes));
    }
}

impl RuleSet {
    /// Rule `index`'s outcome as another decider reported it (a Tollgate server answering a
    /// remote client): the rule's name, algorithm and limit come from this set. `None` when the
    /// set has no rule `index`.
    pub fn reported_outcome(
        &self,
        index: usize,
        allowed: bool,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Option<RuleOutcome> {
        let rule = self.compiled().get(index)?;
        Some(RuleOutcome {
            name: rule.name.clone(),
            algorithm: rule.rule.algorithm(),
            allowed,
            limit: rule.algo.capacity(),
            remaining,
            reset_after,
            retry_after: if allowed { Duration::ZERO } else { retry_after },
        })
    }

    /// A rule's outcome from its verdict and report (shared by both backends).
    pub(crate) fn outcome(&self, index: usize, verdict: Verdict, report: Report) -> RuleOutcome {
        let rule = &self.compiled()[index];
        RuleOutcome {
            name: rule.name.clone(),
            algorithm: rule.rule.algorithm(),
            allowed: verdict.admits,
            limit: rule.algo.capacity(),
            remaining: report.remaining,
            reset_after: micros(report.reset_after),
            retry_after: if verdict.admits { Duration::ZERO } else { micros(verdict.retry_after) },
        }
    }
}
