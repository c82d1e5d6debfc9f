//! The algorithms' Lua twins as scripts, and their calling convention, for backends that run
//! the engine inside Redis (`tollgate-redis`). Nothing here talks to Redis.
//!
//! A script is a comment giving the argument layout, `script/prelude.lua`, the `.lua` twin
//! beside each algorithm's Rust module that the rule sets use, and `script/engine.lua` (the
//! phases of the engine, `engine.rs`) last. The layout is defined once, by this module's
//! constants: `engine.lua` names them (`PER_RULE`, `OP_CHECK`, ...), each name is replaced by
//! its value when the script is assembled, and the heading comment gives the values. One
//! invocation runs a batch of [`Part`]s (an [`Operation`] on one key's state under a whole
//! rule set each, the parts of a group next to each other), whatever the number of rules,
//! atomically.
//!
//! On Redis 7.0 and later the backend loads one Redis Functions [`library`] per node, with
//! every algorithm: `FUNCTION LOAD` defines its functions once, and each call (`FCALL`) runs
//! only the engine's body. Before 7.0 it falls back to scripts (`EVALSHA`), one [`Variant`] per
//! set of algorithms used, because Lua defines every function of a script on every call:
//! defining all five algorithms costs Redis about 8 us per call, several times the work of a
//! fixed-window check. Both run the same code, through the engine's `decide(KEYS, ARGV)`.
//!
//! # Arguments
//!
//! `KEYS` are each part's state keys, part after part, each in its rule set's order (see
//! [`locations`]). `ARGV`, built by [`arguments`], is:
//! - `now` in microseconds (`''`: Redis's own clock);
//! - the number of distinct rules, then `PER_RULE` values per rule: its algorithm (its number
//!   in the script's `ALGORITHMS`), its four parameters, and the prefix of its fields in the key's
//!   shared hash (`''` when the key is its own). Rules are sent once however many parts name
//!   them, because Redis pays for every argument;
//! - the parts, each in one of two forms:
//!   - a run of lone checks (single-rule checks, each its own group, of one rule, as a coalesced
//!     batch is): [`OP_RUN`], the rule's number, how many checks, then each check's cost
//!     (`RUN_HEADER` values, then one per check);
//!   - any other part: its operation code, amount (the cost, or the refund), lease id, lease
//!     units, joins (1 when the part is in the previous part's group), its number of rules
//!     (`PART_HEADER` values), then one value per rule: the *group plan* (see
//!     `GroupPlan`, in `plan.rs`). A positive value is the rule's number, and the rule's state
//!     is the group's first use of it; a negative value `-j` means the rule's state is the one
//!     the group's `j`-th rule entry (counting the rules of the group's parts from 1) named
//!     first: the same key under the same rule, loaded once and asked once for the summed
//!     demand.
//!
//! The reply is `now`, then per part and rule: admitted (1 or 0), remaining, reset_after,
//! retry_after, times in microseconds.

mod call;
mod store;

use std::sync::OnceLock;

use smallvec::SmallVec;

use crate::algorithm::{LUA_TWINS, to_i64};
use crate::decision::Row;
use crate::plan::GroupPlan;
use crate::ruleset::{CompiledRule, micros};
use crate::{BatchPlan, Decision, Operation, Part, RuleSet, Timestamp};

pub use call::{CallError, execute, execute_into, parse_int};
pub use store::{Store, StoreError};

/// Values per distinct rule in the arguments: algorithm number, its parameters, field prefix.
pub(crate) const PER_RULE: usize = 2 + LUA_PARAMETERS;
/// Parameters of a rule's algorithm (see the algorithm trait's `lua_parameters`).
const LUA_PARAMETERS: usize = 4;
/// Values heading a part other than a run: operation code, amount, lease id, lease units,
/// joins, number of rules.
pub(crate) const PART_HEADER: usize = 6;
/// Values heading a run of lone checks: [`OP_RUN`], rule number, number of checks.
pub(crate) const RUN_HEADER: usize = 3;
/// Where (in `ARGV`, counted from 1 as Lua does) the first rule's values start, after `now`
/// and the number of rules.
const RULES_AT: usize = 3;
/// In a call of one lone check, the most common call, which the script reads without a loop
/// (`lone` in `engine.lua`): where its rule's field prefix is, after the rule's number and
/// parameters.
const LONE_PREFIX: usize = RULES_AT + 1 + LUA_PARAMETERS;
/// In a call of one lone check: where its cost is, the call's last argument (after the one
/// rule and [`RUN_HEADER`]).
const LONE_COST: usize = RULES_AT + PER_RULE + RUN_HEADER;
/// The operation code of a run of lone checks.
pub const OP_RUN: &str = "r";
/// The operation code of [`Operation::Check`].
pub const OP_CHECK: &str = "check";
/// The operation code of [`Operation::Acquire`].
pub const OP_ACQUIRE: &str = "acquire";
/// The operation code of [`Operation::Refund`].
pub const OP_REFUND: &str = "refund";
/// The operation code of [`Operation::Release`].
pub const OP_RELEASE: &str = "release";

/// The layout's constants as Lua values, by the names `engine.lua` uses for them.
fn layout() -> [(&'static str, String); 11] {
    [
        ("RULES_AT", RULES_AT.to_string()),
        ("LONE_PREFIX", LONE_PREFIX.to_string()),
        ("LONE_COST", LONE_COST.to_string()),
        ("PER_RULE", PER_RULE.to_string()),
        ("PART_HEADER", PART_HEADER.to_string()),
        ("RUN_HEADER", RUN_HEADER.to_string()),
        ("OP_RUN", format!("'{OP_RUN}'")),
        ("OP_CHECK", format!("'{OP_CHECK}'")),
        ("OP_ACQUIRE", format!("'{OP_ACQUIRE}'")),
        ("OP_REFUND", format!("'{OP_REFUND}'")),
        ("OP_RELEASE", format!("'{OP_RELEASE}'")),
    ]
}

/// A comment heading the script with the layout's values, for a reader of the script.
fn header() -> String {
    let values: Vec<String> = layout().iter().map(|(name, value)| format!("{name} = {value}")).collect();
    format!("-- Generated by tollgate-core's script.rs. Argument layout: {}.\n", values.join(", "))
}

/// `engine.lua` with each of the layout's names replaced by its value. Literals rather than
/// Lua locals: a local the engine's functions capture costs Redis about 1,700 instructions a
/// call (measured with scripts/bench-redis-cpu --instructions), more than 1% of a check.
fn engine() -> String {
    let mut source = String::from(include_str!("script/engine.lua"));
    for (name, value) in layout() {
        source = replace_word(&source, name, &value);
    }
    source
}

/// `text` with each occurrence of the identifier `word` (not within a longer one) replaced.
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back().or_else(|| out.chars().next_back());
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// The header, the prelude, the algorithms `mask` holds (bit `i` for `LUA_TWINS[i]`), the
/// engine: everything that defines `decide(KEYS, ARGV)`, which a script calls and a library
/// registers.
fn definitions(mask: u8) -> String {
    let mut source = header();
    source.push_str(include_str!("script/prelude.lua"));
    for (i, (name, lua)) in LUA_TWINS.iter().enumerate() {
        if mask & (1 << i) != 0 {
            source.push_str(lua);
            source.push_str(&format!("ALGORITHMS[{}] = {name}\n", i + 1));
        }
    }
    source.push_str(&engine());
    source
}

/// The script a rule set needs: the header, the prelude, the algorithms it uses, the engine.
/// For Redis without Functions (before 7.0): see [`library`] for the library that replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant(u8);

impl Variant {
    /// How many variants there are (`0..COUNT` covers every [`index`](Variant::index)).
    pub const COUNT: usize = 1 << LUA_TWINS.len();
    /// The variant with every algorithm.
    pub const ALL: Variant = Variant((Self::COUNT - 1) as u8);

    /// The variant `rules` needs.
    pub fn of(rules: &RuleSet) -> Variant {
        Variant(rules.compiled().iter().fold(0, |mask, rule| mask | 1 << rule.algorithm.lua_index()))
    }

    /// The variant that holds every algorithm of `parts`.
    pub fn of_parts(parts: &[Part<'_>]) -> Variant {
        Variant(parts.iter().fold(0, |mask, part| mask | Variant::of(part.rules).0))
    }

    /// A dense index, for caching one prepared script per variant.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The script's source, assembled on first use.
    pub fn source(self) -> &'static str {
        static SOURCES: [OnceLock<String>; Variant::COUNT] = [const { OnceLock::new() }; Variant::COUNT];
        SOURCES[self.index()].get_or_init(|| {
            let mut source = definitions(self.0);
            source.push_str("return decide(KEYS, ARGV)\n");
            source
        })
    }
}

/// The code of the Redis Functions library (Redis 7.0+): the prelude, every algorithm and the
/// engine, which `FUNCTION LOAD` defines once, so that a call (`FCALL`) runs only the engine's
/// body, where a script defines every function anew on every call. Its [`library`] source
/// names it; the caller derives the name from a hash of this code, so that libraries of
/// different Tollgate versions live side by side in one Redis. Same arguments, reply and
/// stored states as the scripts.
pub fn library_code() -> &'static str {
    static CODE: OnceLock<String> = OnceLock::new();
    CODE.get_or_init(|| definitions(Variant::ALL.0))
}

/// The source to `FUNCTION LOAD`: [`library_code`] as the library `name`, whose one function,
/// also called `name` (function names are shared by every library of a Redis), decides a call:
/// `FCALL <name> <number of keys> <keys> <arguments>` as a script's `EVALSHA` would. `name` is
/// letters, digits and underscores (Redis's rule for both names).
pub fn library(name: &str) -> String {
    format!("#!lua name={name}\n{}redis.register_function('{name}', decide)\n", library_code())
}

/// Where a rule's state lives in Redis, relative to its key's hash tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateLocation<'a> {
    /// A key of its own, named by the rule's signature.
    Own {
        /// The rule's signature.
        signature: &'a str,
    },
    /// Fields of the hash [`SHARED_HASH`] shared by the rule sets' hash-stored rules.
    SharedHash {
        /// The prefix of this rule's field names (`<id>.`, the id derived from the signature).
        prefix: &'a str,
        /// The rule's field names, to be prefixed.
        fields: &'static [&'static str],
    },
}

/// The name, after the hash tag, of the hash that hash-stored rules share (signatures always
/// hold a `:`, so none is this).
pub const SHARED_HASH: &str = "h";

/// Where each rule's state lives, in order: rules stored as hashes have fields in one hash per
/// key; the others (sorted sets) keep keys of their own.
pub fn locations(rules: &RuleSet) -> impl ExactSizeIterator<Item = StateLocation<'_>> {
    rules.compiled().iter().map(|c| match c.algorithm.hash_fields() {
        Some(fields) if !c.field_prefix.is_empty() => {
            StateLocation::SharedHash { prefix: &c.field_prefix, fields }
        }
        _ => StateLocation::Own { signature: &c.signature },
    })
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

/// A distinct rule as sent: its algorithm's number and parameters, and its field prefix.
type SentRule<'a> = ([i64; 1 + LUA_PARAMETERS], &'a str);

fn sent_rule(rule: &CompiledRule) -> SentRule<'_> {
    let [p1, p2, p3, p4] = rule.algorithm.lua_parameters();
    ([rule.algorithm.lua_index() as i64 + 1, p1, p2, p3, p4], &rule.field_prefix)
}

/// The script's arguments for `parts` (see the [module docs](self)), decided in one call; with
/// `now` of `None` the script reads Redis's clock. The parts of a group must be next to each
/// other: a part joins the group of the part before it when their `group` numbers are equal.
pub fn arguments<'a>(parts: &[Part<'a>], now: Option<Timestamp>) -> Vec<Arg<'a>> {
    arguments_with(parts, now, |group| {
        first_uses(&GroupPlan::new(group.iter().map(|p| (p.key, p.rules, p.op))))
    })
}

/// The script's arguments for a planned batch, decided in one call, with the batch's parts in
/// the order they are sent (group after group, as the script wants them): [`arguments`]
/// without planning the groups again.
pub fn batch_arguments<'a>(batch: &BatchPlan<'a>, now: Option<Timestamp>) -> (Vec<Part<'a>>, Vec<Arg<'a>>) {
    let parts: Vec<Part<'a>> = batch.groups().flatten().map(|&i| batch.parts()[i]).collect();
    let mut plans = batch.planned().iter().map(|(_, plan)| plan);
    // Called once per joint group, in order (groups of one part need no plan).
    let mut next_joint = || loop {
        match plans.next() {
            Some(plan) if plan.parts().len() > 1 => return first_uses(plan),
            Some(_) => continue,
            None => unreachable!("one plan per joint group"),
        }
    };
    let args = arguments_with(&parts, now, |_| next_joint());
    (parts, args)
}

/// [`arguments`], with the plan of each joint group (given its parts, in order) from `plan_of`.
fn arguments_with<'a>(
    parts: &[Part<'a>],
    now: Option<Timestamp>,
    mut plan_of: impl FnMut(&[Part<'a>]) -> SmallVec<[i64; 16]>,
) -> Vec<Arg<'a>> {
    let joins = |i: usize| i > 0 && i < parts.len() && parts[i - 1].group == parts[i].group;
    // The distinct rules, and each part's rule numbers.
    let mut rules: Vec<SentRule<'a>> = Vec::new();
    let mut numbers: Vec<i64> = Vec::with_capacity(parts.iter().map(|p| p.rules.len()).sum());
    for part in parts {
        for rule in part.rules.compiled() {
            let entry = sent_rule(rule);
            let i = rules.iter().position(|r| *r == entry).unwrap_or_else(|| {
                rules.push(entry);
                rules.len() - 1
            });
            numbers.push(i as i64 + 1);
        }
    }
    let mut args = Vec::with_capacity(2 + PER_RULE * rules.len() + PART_HEADER * parts.len() + numbers.len());
    args.push(match now {
        Some(now) => Arg::Int(to_i64(now.as_micros())),
        None => Arg::Text(""),
    });
    args.push(Arg::Int(rules.len() as i64));
    debug_assert_eq!(args.len() + 1, RULES_AT);
    for (values, prefix) in &rules {
        args.extend(values.map(Arg::Int));
        args.push(Arg::Text(prefix));
    }
    let mut numbers = numbers.into_iter();
    let mut run: Option<(i64, usize)> = None; // a run's rule number and where its count is
    // A group of several parts: its plan, as each of its rule entries' value.
    let mut plan: SmallVec<[i64; 16]> = SmallVec::new();
    let mut planned = 0; // entries of `plan` sent
    for (i, part) in parts.iter().enumerate() {
        let joint = joins(i + 1);
        let lone_check = match part.op {
            Operation::Check { cost } if part.rules.len() == 1 && !joins(i) && !joint => Some(cost),
            Operation::Check { .. }
            | Operation::Acquire { .. }
            | Operation::Refund { .. }
            | Operation::Release { .. } => None,
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
                    args.extend([Arg::Text(OP_RUN), Arg::Int(rule), Arg::Int(1)]);
                    run = Some((rule, args.len() - 1));
                }
            }
            args.push(Arg::Int(to_i64(cost)));
            continue;
        }
        run = None;
        if !joins(i) {
            plan.clear();
            planned = 0;
            if joint {
                let end = (i + 1..parts.len()).find(|&n| !joins(n)).unwrap_or(parts.len());
                plan = plan_of(&parts[i..end]);
            }
        }
        let (code, amount, lease_id, lease_units) = match part.op {
            Operation::Check { cost } => (OP_CHECK, cost, "", 0),
            Operation::Acquire { cost, lease } => (OP_ACQUIRE, cost, lease.as_str(), 0),
            Operation::Refund { amount } => (OP_REFUND, amount, "", 0),
            Operation::Release { lease } => (OP_RELEASE, 0, lease.id.as_str(), lease.units),
        };
        args.push(Arg::Text(code));
        args.push(Arg::Int(to_i64(amount)));
        args.push(Arg::Text(lease_id));
        args.push(Arg::Int(to_i64(lease_units)));
        args.push(Arg::Int(i64::from(joins(i))));
        args.push(Arg::Int(part.rules.len() as i64));
        for number in numbers.by_ref().take(part.rules.len()) {
            // A later use of a state points at the group's first (see the module docs).
            let sent = match plan.get(planned) {
                Some(&first) if first < 0 => first,
                _ => number,
            };
            planned += 1;
            args.push(Arg::Int(sent));
        }
    }
    args
}

/// For each rule entry of a group's `plan` (its parts' rules in order): 0 when it is the first
/// to name its state, else `-j` for the group's `j`-th entry (from 1), which named it first.
fn first_uses(plan: &GroupPlan<'_>) -> SmallVec<[i64; 16]> {
    let mut first: SmallVec<[Option<i64>; 16]> = SmallVec::from_elem(None, plan.states().len());
    let mut out = SmallVec::new();
    for p in 0..plan.parts().len() {
        for &state in plan.uses(p) {
            let entry = out.len() as i64 + 1;
            let first = &mut first[usize::from(state)];
            match *first {
                Some(j) => out.push(-j),
                None => {
                    *first = Some(entry);
                    out.push(0);
                }
            }
        }
    }
    out
}

/// Each part's decision in the script's reply, and the time the script decided at.
pub fn decode(parts: &[Part<'_>], reply: &[i64]) -> Result<(Timestamp, Vec<Decision>), ReplyError> {
    let expected = 1 + 4 * parts.iter().map(|p| p.rules.len()).sum::<usize>();
    if reply.len() != expected {
        return Err(ReplyError { expected, got: reply.len() });
    }
    let now = Timestamp::from_micros(u64::try_from(reply[0]).unwrap_or(0));
    let mut values = reply[1..].chunks_exact(4);
    let decisions = parts
        .iter()
        .map(|part| {
            let mut decision = Decision::building();
            let rows = decision.start_rows(part.rules.len());
            for (row, r) in rows.iter_mut().zip(values.by_ref()) {
                // Read from a reply: a refusal's wait is made at least a microsecond here.
                *row = Row::decided(r[0] == 1, micros(r[3]));
                row.report(u64::try_from(r[1]).unwrap_or(0), micros(r[2]));
            }
            decision.settle();
            decision
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
        assert!(source.ends_with("return decide(KEYS, ARGV)\n"));
        assert!(source.starts_with("-- Generated by"));
        assert!(source.contains(&format!("at = at + {PER_RULE}\n")));
        let engine = engine();
        assert!(layout().iter().all(|(name, _)| !engine.contains(name)), "every name replaced");
        let all = Variant::ALL.source();
        assert!((1..=5).all(|n| all.contains(&format!("ALGORITHMS[{n}] = "))));
    }

    #[test]
    fn the_library_holds_every_algorithm_and_registers_decide_under_its_name() {
        let source = library("tollgate_0123456789ab");
        assert!(source.starts_with("#!lua name=tollgate_0123456789ab\n-- Generated by"));
        assert!(source.ends_with("redis.register_function('tollgate_0123456789ab', decide)\n"));
        assert!((1..=5).all(|n| source.contains(&format!("ALGORITHMS[{n}] = "))));
        // the scripts' code, but called through the registered function, not run on load
        assert!(!library_code().trim_end().ends_with("return decide(KEYS, ARGV)"));
        assert!(Variant::ALL.source().starts_with(library_code()));
    }

    #[test]
    fn rules_are_sent_once_and_lone_checks_as_runs() {
        let one = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let two =
            RuleSet::new([Rule::fixed_window(5, Period::SECOND), Rule::gcra(3, Period::MINUTE, 2)]).unwrap();
        let check = |cost| Operation::Check { cost };
        let parts = [
            Part::operation("k", &one, check(1)),
            Part::operation("k", &one, check(2)).in_group(1),
            // a group of two: not lone, though single-rule
            Part::operation("k", &one, check(3)).in_group(2),
            Part::operation("k2", &one, check(4)).in_group(2),
            Part::operation("k", &two, check(5)).in_group(3),
            Part::operation("k", &one, check(6)).in_group(4),
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

    #[test]
    fn hash_stored_rules_share_one_hash() {
        let alone = RuleSet::new([
            Rule::fixed_window(1, Period::SECOND),
            Rule::sliding_window_log(1, Period::SECOND),
        ])
        .unwrap();
        let placed: Vec<_> = locations(&alone).collect();
        assert!(matches!(placed[0], StateLocation::SharedHash { prefix: "-BgJSBhJ.", fields: ["s", "c"] }));
        assert!(matches!(placed[1], StateLocation::Own { .. }));
        let six = RuleSet::new([
            Rule::fixed_window(1, Period::SECOND),
            Rule::sliding_window_log(1, Period::SECOND),
            Rule::sliding_window_counter(1, Period::MINUTE),
            Rule::gcra(1, Period::SECOND, 1),
        ])
        .unwrap();
        let placed: Vec<_> = locations(&six).collect();
        assert!(matches!(placed[1], StateLocation::Own { signature: "swl2:1:1000000" }));
        let prefixes: Vec<_> = placed
            .iter()
            .filter_map(|s| match s {
                StateLocation::SharedHash { prefix, .. } => Some(*prefix),
                StateLocation::Own { .. } => None,
            })
            .collect();
        assert_eq!(prefixes.len(), 3);
        assert!(prefixes.iter().all(|p| p.len() == 9 && p.ends_with('.')));
    }

    #[test]
    fn only_whole_words_are_replaced() {
        assert_eq!(
            replace_word("OP_RUN OP_RUNS xOP_RUN (OP_RUN)", "OP_RUN", "'r'"),
            "'r' OP_RUNS xOP_RUN ('r')"
        );
    }

    /// The Lua reads a lone check (the most common call) at fixed places, `LONE_PREFIX` and
    /// `LONE_COST` (1-based, as `ARGV`): they must be where the arguments put the rule's field
    /// prefix and the cost, and the call must end with the cost.
    #[test]
    fn a_lone_check_puts_its_prefix_and_cost_where_the_lua_reads_them() {
        let rules = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let args = arguments(&[Part::new("k", &rules, 7)], None);
        assert_eq!(args.len(), LONE_COST);
        assert_eq!(args[LONE_COST - 1], Arg::Int(7));
        let prefix = &rules.compiled()[0].field_prefix;
        assert!(!prefix.is_empty());
        assert_eq!(args[LONE_PREFIX - 1], Arg::Text(prefix));
    }

    #[test]
    fn a_planned_batch_sends_what_its_parts_in_group_order_send() {
        let one = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let two =
            RuleSet::new([Rule::gcra(3, Period::MINUTE, 2), Rule::fixed_window(5, Period::SECOND)]).unwrap();
        // A lone group first: its plan is not one a joint group may be sent with.
        let batch = [
            Part::new("d", &two, 1).in_group(9),
            Part::new("a", &one, 1).in_group(7),
            Part::new("b", &two, 2).in_group(3),
            Part::new("a", &two, 1).in_group(7),
            Part::new("c", &one, 1).in_group(4),
            Part::new("b", &one, 1).in_group(3),
            Part::new("a", &one, 1).in_group(7),
        ];
        let plan = BatchPlan::new(&batch).unwrap();
        let now = Some(Timestamp::from_micros(9));
        let (sent, args) = batch_arguments(&plan, now);
        let keys: Vec<&str> = sent.iter().map(|p| p.key).collect();
        assert_eq!(keys, ["d", "a", "a", "a", "b", "b", "c"]);
        assert_eq!(args, arguments(&sent, now));
    }

    #[test]
    fn a_group_sends_its_plan() {
        let one = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let two =
            RuleSet::new([Rule::gcra(3, Period::MINUTE, 2), Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let check = |cost| Operation::Check { cost };
        let parts = [
            Part::operation("a", &one, check(1)),
            Part::operation("b", &one, check(1)),
            Part::operation("a", &two, check(1)),
            Part::operation("a", &two, check(1)).in_group(1),
        ];
        let args = arguments(&parts, Some(Timestamp::from_micros(7)));
        let tail: Vec<i64> = args
            .iter()
            .filter_map(|a| match a {
                Arg::Int(n) => Some(*n),
                Arg::Text(_) => None,
            })
            .collect();
        // ... per part: amount, lease units, joins, count, then its values: "a" under the fixed
        // window (rule 1) is entry 1 of the group; part 3's fixed window is the same state
        let parts_args = &tail[tail.len() - 22..];
        assert_eq!(parts_args, [1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 2, 2, -1, 1, 0, 0, 2, 2, 1]);
    }
}
