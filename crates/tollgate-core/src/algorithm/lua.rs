//! The algorithms' Lua twins as scripts, and their calling convention, for backends that run
//! the algorithms inside Redis (`tollgate-redis`). Nothing here talks to Redis.
//!
//! A script is `prelude.lua`, the `.lua` file beside each algorithm's Rust module that the rule
//! sets use, and `engine.lua` (the phases of an operation) last. One invocation runs a batch of
//! [`ScriptPart`]s (one [`Operation`] on a whole rule set each, or a batch's checks of several
//! keys), whatever the number of rules, atomically.
//!
//! There is one script [`Variant`] per set of algorithms used, because Lua defines every
//! function of a script on every call: defining all five algorithms costs Redis about 8 us per
//! call, several times the work of a fixed-window check.

use std::sync::OnceLock;

use super::{Algo, Report, Verdict, to_i64};
use crate::{Align, Decision, Operation, RuleSet, Timestamp};

/// Each algorithm's Lua table name and source. Its position + 1 is its number in the script's
/// `ALGORITHMS` (the first script argument of each rule); [`Algo::lua_index`] is the one place
/// that maps a rule to it.
const ALGORITHMS: [(&str, &str); 5] = [
    ("fixed_window", include_str!("fixed_window.lua")),
    ("sliding_window_log", include_str!("sliding_window_log.lua")),
    ("sliding_window_counter", include_str!("sliding_window_counter.lua")),
    ("gcra", include_str!("gcra.lua")),
    ("concurrency", include_str!("concurrency.lua")),
];

/// The script a rule set needs: the prelude, the algorithms it uses, the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant(u8);

impl Variant {
    /// How many variants there are (`0..COUNT` covers every [`index`](Variant::index)).
    pub const COUNT: usize = 1 << ALGORITHMS.len();
    /// The variant with every algorithm.
    pub const ALL: Variant = Variant((Self::COUNT - 1) as u8);

    /// The variant `rules` needs.
    pub fn of(rules: &RuleSet) -> Variant {
        Variant(rules.compiled().iter().fold(0, |mask, rule| mask | 1 << rule.algo.lua_index()))
    }

    /// A dense index, for caching one prepared script per variant.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The script's source, assembled on first use.
    pub fn source(self) -> &'static str {
        static SOURCES: [OnceLock<String>; Variant::COUNT] = [const { OnceLock::new() }; Variant::COUNT];
        SOURCES[self.index()].get_or_init(|| {
            let mut source = String::from(include_str!("prelude.lua"));
            for (i, (name, lua)) in ALGORITHMS.iter().enumerate() {
                if self.0 & (1 << i) != 0 {
                    source.push_str(lua);
                    source.push_str(&format!("ALGORITHMS[{}] = {name}\n", i + 1));
                }
            }
            source.push_str(include_str!("engine.lua"));
            source
        })
    }
}

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
    /// The algorithm's position in [`ALGORITHMS`].
    fn lua_index(&self) -> usize {
        match self {
            Algo::FixedWindow(_) => 0,
            Algo::SlidingWindowLog(_) => 1,
            Algo::SlidingWindowCounter(_) => 2,
            Algo::Gcra(_) => 3,
            Algo::Concurrency(_) => 4,
        }
    }

    /// The algorithm's number in the script's `ALGORITHMS` and its four parameters.
    fn lua_args(&self) -> [i64; 5] {
        let number = self.lua_index() as i64 + 1;
        let [a, b, c, d] = match self {
            Algo::FixedWindow(a) => [to_i64(a.limit), a.period, i64::from(a.align == Align::FirstHit), 0],
            Algo::SlidingWindowLog(a) => [to_i64(a.limit), a.period, 0, 0],
            Algo::SlidingWindowCounter(a) => [to_i64(a.limit), a.period, 0, 0],
            Algo::Gcra(a) => {
                let [quotient, remainder, den] = a.interval();
                [to_i64(a.capacity), quotient, remainder, den]
            }
            Algo::Concurrency(a) => [to_i64(a.limit), a.lease, 0, 0],
        };
        [number, a, b, c, d]
    }
}

/// One part of a script call: an operation on a rule set, and whether it is all or nothing
/// with the part before it (in its group).
#[derive(Clone, Copy, Debug)]
pub struct ScriptPart<'a> {
    /// The rules.
    pub rules: &'a RuleSet,
    /// The operation.
    pub op: Operation<'a>,
    /// True when the part is in the previous part's group.
    pub joins: bool,
}

impl<'a> ScriptPart<'a> {
    /// A part starting its own group.
    pub fn alone(rules: &'a RuleSet, op: Operation<'a>) -> Self {
        ScriptPart { rules, op, joins: false }
    }
}

impl Variant {
    /// The variant that holds every algorithm of `parts`.
    pub fn of_parts(parts: &[ScriptPart<'_>]) -> Variant {
        Variant(parts.iter().fold(0, |mask, part| mask | Variant::of(part.rules).0))
    }
}

/// The script's arguments for `parts`, decided in one call; with `now` of `None` the script
/// reads Redis's clock. `KEYS` are each part's state keys, part after part, each in its rule
/// set's order: for rules whose [`StateSlot`](crate::StateSlot) is shared, the same hash key
/// each time. The parts of a group must be consecutive (`joins`).
///
/// Each distinct rule is sent once and parts name rules by number, and consecutive lone checks
/// of one rule (single-rule `check` parts in groups of their own, as a coalesced batch is) are
/// sent as one run of costs: Redis pays for every argument (see `engine.lua`).
pub fn arguments<'a>(parts: &[ScriptPart<'a>], now: Option<Timestamp>) -> Vec<Arg<'a>> {
    // The distinct rules (algorithm and parameters, field prefix), and each part's rule numbers.
    let mut rules: Vec<([i64; 5], &'a str)> = Vec::new();
    let mut numbers: Vec<i64> = Vec::with_capacity(parts.iter().map(|p| p.rules.len()).sum());
    for part in parts {
        for rule in part.rules.compiled() {
            let entry = (rule.algo.lua_args(), &*rule.field_prefix);
            let i = rules.iter().position(|r| *r == entry).unwrap_or_else(|| {
                rules.push(entry);
                rules.len() - 1
            });
            numbers.push(i as i64 + 1);
        }
    }
    let mut args = Vec::with_capacity(2 + 6 * rules.len() + 6 * parts.len() + numbers.len());
    args.push(match now {
        Some(now) => Arg::Int(to_i64(now.as_micros())),
        None => Arg::Text(""),
    });
    args.push(Arg::Int(rules.len() as i64));
    for (values, prefix) in &rules {
        args.extend(values.map(Arg::Int));
        args.push(Arg::Text(prefix));
    }
    let mut numbers = numbers.into_iter();
    let mut run: Option<(i64, usize)> = None; // a run's rule number and where its count is
    for (i, part) in parts.iter().enumerate() {
        let lone_check = match part.op {
            Operation::Check { cost } if part.rules.len() == 1 && !part.joins => {
                parts.get(i + 1).is_none_or(|next| !next.joins).then_some(cost)
            }
            _ => None,
        };
        if let Some(cost) = lone_check {
            let rule = numbers.next().unwrap_or_default();
            match run {
                Some((r, count_at)) if r == rule => {
                    if let Arg::Int(count) = &mut args[count_at] {
                        *count += 1;
                    }
                }
                _ => {
                    args.extend([Arg::Text("r"), Arg::Int(rule), Arg::Int(1)]);
                    run = Some((rule, args.len() - 1));
                }
            }
            args.push(Arg::Int(to_i64(cost)));
            continue;
        }
        run = None;
        let (name, amount, lease_id, lease_units) = match part.op {
            Operation::Check { cost } => ("check", cost, "", 0),
            Operation::Acquire { cost, lease } => ("acquire", cost, lease.as_str(), 0),
            Operation::Refund { amount } => ("refund", amount, "", 0),
            Operation::Release { lease } => ("release", 0, lease.id.as_str(), lease.units),
        };
        args.push(Arg::Text(name));
        args.push(Arg::Int(to_i64(amount)));
        args.push(Arg::Text(lease_id));
        args.push(Arg::Int(to_i64(lease_units)));
        args.push(Arg::Int(i64::from(part.joins)));
        args.push(Arg::Int(part.rules.len() as i64));
        args.extend(numbers.by_ref().take(part.rules.len()).map(Arg::Int));
    }
    args
}

/// Each part's decision in the script's reply, and the time the script decided at.
pub fn decode(parts: &[ScriptPart<'_>], reply: &[i64]) -> Result<(Timestamp, Vec<Decision>), ReplyError> {
    let expected = 1 + 4 * parts.iter().map(|p| p.rules.len()).sum::<usize>();
    if reply.len() != expected {
        return Err(ReplyError { expected, got: reply.len() });
    }
    let now = Timestamp::from_micros(u64::try_from(reply[0]).unwrap_or(0));
    let mut values = reply[1..].chunks_exact(4);
    let decisions = parts
        .iter()
        .map(|part| {
            let outcomes = (0..part.rules.len())
                .zip(values.by_ref())
                .map(|(i, r)| {
                    let verdict = Verdict { admits: r[0] == 1, retry_after: r[3] };
                    let report = Report { remaining: u64::try_from(r[1]).unwrap_or(0), reset_after: r[2] };
                    part.rules.outcome(i, verdict, report)
                })
                .collect();
            Decision::from_outcomes(outcomes)
        })
        .collect();
    Ok((now, decisions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Period, Rule};

    #[test]
    fn a_variant_holds_only_the_algorithms_used() {
        let rules = RuleSet::new([
            Rule::fixed_window(1, Period::SECOND),
            Rule::token_bucket(1, 1, Period::SECOND),
            Rule::fixed_window_from_first_hit(2, Period::SECOND),
        ])
        .unwrap();
        let source = Variant::of(&rules).source();
        assert!(source.contains("ALGORITHMS[1] = fixed_window"));
        assert!(source.contains("ALGORITHMS[4] = gcra"));
        assert!(!source.contains("ALGORITHMS[2]") && !source.contains("ALGORITHMS[5]"));
        assert!(source.ends_with("return reply\n"));
        let all = Variant::ALL.source();
        assert!((1..=5).all(|n| all.contains(&format!("ALGORITHMS[{n}] = "))));
    }

    #[test]
    fn rules_are_sent_once_and_lone_checks_as_runs() {
        let one = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let two =
            RuleSet::new([Rule::fixed_window(5, Period::SECOND), Rule::gcra(3, Period::MINUTE, 2)]).unwrap();
        let check = |cost| Operation::Check { cost };
        let parts = [
            ScriptPart::alone(&one, check(1)),
            ScriptPart::alone(&one, check(2)),
            // a group of two: not lone, though single-rule
            ScriptPart::alone(&one, check(3)),
            ScriptPart { rules: &one, op: check(4), joins: true },
            ScriptPart::alone(&two, check(5)),
            ScriptPart::alone(&one, check(6)),
        ];
        let args = arguments(&parts, Some(Timestamp::from_micros(7)));
        let text: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::Int(n) => n.to_string(),
                Arg::Text(t) => format!("'{t}'"),
            })
            .collect();
        // now, two distinct rules (the two sets share the fixed window: same parameters and field
        // prefix), the fixed window
        assert_eq!(text[..7], ["7", "2", "1", "5", "1000000", "0", "0"]);
        assert!(text[7].ends_with(".'"), "a hash field prefix: {}", text[7]);
        assert_eq!(text[8], "4", "the second rule is GCRA");
        let parts_args = text[14..].join(" ");
        assert_eq!(
            parts_args,
            "'r' 1 2 1 2 'check' 3 '' 0 0 1 1 'check' 4 '' 0 1 1 1 'check' 5 '' 0 0 2 1 2 'r' 1 1 6"
        );
    }
}
