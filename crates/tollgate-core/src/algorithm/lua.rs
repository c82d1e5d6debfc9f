//! The algorithms' Lua twins as one script, and its calling convention, for backends that run
//! the algorithms inside Redis (`tollgate-redis`). Nothing here talks to Redis.
//!
//! The script is assembled from the `.lua` file beside each algorithm's Rust module, with
//! `engine.lua` (the phases of an operation) last. One invocation runs one [`Operation`] on a
//! whole rule set, whatever the number of rules, atomically.

use super::{Algo, Report, Verdict, to_i64};
use crate::{Align, Decision, Operation, RuleSet, Timestamp};

/// The script's source.
pub const SCRIPT: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("fixed_window.lua"),
    include_str!("sliding_window_log.lua"),
    include_str!("sliding_window_counter.lua"),
    include_str!("gcra.lua"),
    include_str!("concurrency.lua"),
    include_str!("engine.lua"),
);

/// One of the script's arguments (`ARGV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg<'a> {
    /// A number.
    Int(i64),
    /// Text.
    Text(&'a str),
}

/// A reply that is not what the script returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unexpected reply from the rate-limit script: expected {expected} integers, got {got}")]
pub struct ReplyError {
    expected: usize,
    got: usize,
}

impl Algo {
    /// The algorithm's index in `engine.lua`'s `ALGORITHMS` and its four parameters.
    fn lua_args(&self) -> [i64; 5] {
        match self {
            Algo::FixedWindow(a) => [1, to_i64(a.limit), a.period, i64::from(a.align == Align::FirstHit), 0],
            Algo::SlidingWindowLog(a) => [2, to_i64(a.limit), a.period, 0, 0],
            Algo::SlidingWindowCounter(a) => [3, to_i64(a.limit), a.period, 0, 0],
            Algo::Gcra(a) => {
                let [quotient, remainder, den] = a.interval();
                [4, to_i64(a.capacity), quotient, remainder, den]
            }
            Algo::Concurrency(a) => [5, to_i64(a.limit), a.lease, 0, 0],
        }
    }
}

/// The script's arguments for `op` on `rules`; with `now` of `None` the script reads Redis's
/// clock. `KEYS` are the rules' state keys, in the rule set's order.
pub fn arguments<'a>(rules: &RuleSet, op: &Operation<'a>, now: Option<Timestamp>) -> Vec<Arg<'a>> {
    let (name, amount, lease_id, lease_units) = match *op {
        Operation::Check { cost } => ("check", cost, "", 0),
        Operation::Acquire { cost, lease } => ("acquire", cost, lease.as_str(), 0),
        Operation::Refund { amount } => ("refund", amount, "", 0),
        Operation::Release { lease } => ("release", 0, lease.id.as_str(), lease.units),
    };
    let mut args = Vec::with_capacity(5 + 5 * rules.len());
    args.push(Arg::Text(name));
    args.push(match now {
        Some(now) => Arg::Int(to_i64(now.as_micros())),
        None => Arg::Text(""),
    });
    args.push(Arg::Int(to_i64(amount)));
    args.push(Arg::Text(lease_id));
    args.push(Arg::Int(to_i64(lease_units)));
    for rule in rules.compiled() {
        args.extend(rule.algo.lua_args().map(Arg::Int));
    }
    args
}

/// The decision in the script's reply, and the time the script decided at.
pub fn decode(rules: &RuleSet, reply: &[i64]) -> Result<(Timestamp, Decision), ReplyError> {
    let expected = 1 + 4 * rules.len();
    if reply.len() != expected {
        return Err(ReplyError { expected, got: reply.len() });
    }
    let now = Timestamp::from_micros(u64::try_from(reply[0]).unwrap_or(0));
    let outcomes = reply[1..]
        .chunks_exact(4)
        .enumerate()
        .map(|(i, r)| {
            let verdict = Verdict { admits: r[0] == 1, retry_after: r[3] };
            let report = Report { remaining: u64::try_from(r[1]).unwrap_or(0), reset_after: r[2] };
            rules.outcome(i, verdict, report)
        })
        .collect();
    Ok((now, Decision::from_outcomes(outcomes)))
}
