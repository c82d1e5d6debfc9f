//! [`execute`]: a script call decided in Rust, over a [`Store`], for a Redis module.
//!
//! The call is read exactly as the script reads it (the layout in the [module docs](super)),
//! and decided by the engine's phases ([`crate::engine::phases`]) and the algorithms' Rust
//! forms, over states decoded from the keys and fields the Lua twins write. So a module and
//! the Lua can take turns on the same keys: each reads what the other wrote.
//!
//! Unlike the script, which writes as it goes, `execute` reads every state the call names
//! before it writes any, and writes each changed state once at the end: a call with a bad
//! argument or an unreadable key changes nothing.

use std::collections::HashMap;
use std::ops::Range;

use smallvec::SmallVec;

use super::store::{Store, StoreError};
use super::{OP_ACQUIRE, OP_CHECK, OP_REFUND, OP_RELEASE, OP_RUN, PART_HEADER, PER_RULE, RUN_HEADER};
use crate::algorithm::{AnyAlgorithm, State, Stored};
use crate::engine::{self, Demand, Entry, Group, States};
use crate::limits::{MAX_COUNT, MAX_EXACT};
use crate::{Lease, LeaseId, Operation};

/// A key outlives its state by this much, as in the Lua twins (`TTL_MARGIN_MS` in
/// `script/prelude.lua`, which says why).
const TTL_MARGIN_MS: i64 = 1000;

/// Beyond this many states in a call, they are found by hash rather than by scanning.
const SCAN_STATES: usize = 16;

/// A call that cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// An argument is missing or malformed; `index` is its position in `argv` (from 0).
    #[error("ERR tollgate: argument {index}: {reason}")]
    Argument {
        /// The argument's position in `argv`, from 0.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The number of keys does not match the parts' rules.
    #[error("ERR tollgate: the parts name {expected} keys, the call gave {got}")]
    Keys {
        /// Keys the parts' rules need.
        expected: usize,
        /// Keys given.
        got: usize,
    },
    /// A group asks a state for more units than its rule can ever hold.
    #[error("ERR tollgate: a group asks a state for more than its rule's capacity")]
    Capacity,
    /// A key is named for a sorted-set state and for another state too (the Lua's layout gives
    /// each sorted-set state a key of its own): writing both would mix them.
    #[error("ERR tollgate: key {key} is named for a sorted-set state and another state")]
    SharedKey {
        /// The key, lossily as text.
        key: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides a call given in the script's calling convention (`keys` and `argv` as the script
/// receives them: see the [module docs](super)) against `store`, and answers what the script
/// would: `now`, then per part and rule admitted, remaining, reset_after, retry_after. Nothing
/// is written unless every argument is valid and every state could be read.
///
/// ```
/// use tollgate_core::script::{self, Arg, Part, Store, StoreError};
/// use tollgate_core::{Operation, Period, Rule, RuleSet, Timestamp};
/// # use std::collections::HashMap;
/// # #[derive(Default)]
/// # struct Hashes(HashMap<(Vec<u8>, Vec<u8>), i64>);
/// # impl Store for Hashes {
/// #     fn now(&mut self) -> Result<i64, StoreError> { Ok(0) }
/// #     fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
/// #         for (o, f) in out.iter_mut().zip(fields) { *o = self.0.get(&(key.to_vec(), f.to_vec())).copied(); }
/// #         Ok(())
/// #     }
/// #     fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
/// #         for (f, v) in fields { self.0.insert((key.to_vec(), f.to_vec()), *v); }
/// #         Ok(())
/// #     }
/// #     fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
/// #         for f in fields { self.0.remove(&(key.to_vec(), f.to_vec())); }
/// #         Ok(())
/// #     }
/// #     fn sorted_set(&mut self, _: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> { Ok(vec![]) }
/// #     fn sorted_set_add(&mut self, _: &[u8], _: &[(f64, &[u8])]) -> Result<(), StoreError> { Ok(()) }
/// #     fn sorted_set_remove(&mut self, _: &[u8], _: &[&[u8]]) -> Result<(), StoreError> { Ok(()) }
/// #     fn delete(&mut self, _: &[u8]) -> Result<(), StoreError> { Ok(()) }
/// #     fn time_to_live(&mut self, _: &[u8]) -> Result<Option<i64>, StoreError> { Ok(None) }
/// #     fn set_time_to_live(&mut self, _: &[u8], _: i64) -> Result<(), StoreError> { Ok(()) }
/// # }
/// let rules = RuleSet::new([Rule::fixed_window(2, Period::SECOND)])?;
/// let parts = [Part::alone("user-1", &rules, Operation::Check { cost: 1 })];
/// // The arguments the script would get, as bytes.
/// let argv: Vec<Vec<u8>> = script::arguments(&parts, Some(Timestamp::from_micros(5_000_000)))
///     .iter()
///     .map(|arg| match arg {
///         Arg::Int(n) => n.to_string().into_bytes(),
///         Arg::Text(t) => t.as_bytes().to_vec(),
///     })
///     .collect();
/// let argv: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
/// let mut store = Hashes::default(); // any Store: a Redis module's keys, in practice
/// let keys: [&[u8]; 1] = [b"{user-1}:h"];
/// for remaining in [1, 0] {
///     let reply = script::execute(&keys, &argv, &mut store)?;
///     assert_eq!(reply, [5_000_000, 1, remaining, 1_000_000, 0]); // now, admitted, remaining, reset, retry
/// }
/// let denied = script::execute(&keys, &argv, &mut store)?;
/// assert_eq!(denied[1..], [0, 0, 1_000_000, 1_000_000]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn execute(keys: &[&[u8]], argv: &[&[u8]], store: &mut impl Store) -> Result<Vec<i64>, CallError> {
    let call = Call::parse(argv)?;
    if call.entries.len() != keys.len() {
        return Err(CallError::Keys { expected: call.entries.len(), got: keys.len() });
    }
    let now = match call.now {
        Some(now) => now,
        None => store.now()?,
    };
    let mut slots = Slots::default();
    // Read every state first, so that a failed read leaves the store as it was.
    for (entry, key) in call.entries.iter().zip(keys) {
        let rule = &call.rules[entry.rule];
        slots.find_or_read(store, key, rule.prefix, &rule.algorithm)?;
    }
    slots.check_sorted_sets_alone()?;
    let plans: Vec<GroupRun<'_>> = call
        .groups
        .iter()
        .map(|group| GroupRun::new(&call, keys, group.clone(), &slots))
        .collect::<Result<_, _>>()?;
    let mut reply = Vec::with_capacity(1 + 4 * call.entries.len());
    reply.push(now);
    for plan in &plans {
        engine::phases(now, plan, &mut SlotStates { slots: &mut slots, of_state: &plan.slots }, |a, r| {
            reply.extend([
                i64::from(a.admits),
                i64::try_from(r.remaining).unwrap_or(i64::MAX),
                r.reset_after,
            ]);
            reply.push(if a.admits { 0 } else { a.retry_after });
        });
    }
    slots.write(store, now)?;
    Ok(reply)
}

/// A distinct rule of the call.
struct CallRule<'c> {
    algorithm: AnyAlgorithm,
    prefix: &'c [u8],
}

/// A part's operation as read; its lease owned, to be lent to [`Operation`].
enum PartOp {
    Check { cost: u64 },
    Acquire { cost: u64, lease: LeaseId },
    Refund { amount: u64 },
    Release { lease: Lease },
}

impl PartOp {
    fn operation(&self) -> Operation<'_> {
        match self {
            PartOp::Check { cost } => Operation::Check { cost: *cost },
            PartOp::Acquire { cost, lease } => Operation::Acquire { cost: *cost, lease },
            PartOp::Refund { amount } => Operation::Refund { amount: *amount },
            PartOp::Release { lease } => Operation::Release { lease },
        }
    }
}

/// One rule entry of a part: its rule, its part's operation, and (from the group plan) the
/// group's entry that names the same state first, if another.
struct CallEntry {
    rule: usize,
    op: usize,
}

/// A call's arguments, read and checked.
struct Call<'c> {
    now: Option<i64>,
    rules: Vec<CallRule<'c>>,
    ops: Vec<PartOp>,
    entries: Vec<CallEntry>,
    /// Each group's entries (and keys), in order.
    groups: Vec<Range<usize>>,
}

/// Reads `argv` from `at` on.
struct Reader<'a, 'c> {
    argv: &'a [&'c [u8]],
    at: usize,
}

impl<'c> Reader<'_, 'c> {
    fn bad(&self, reason: &'static str) -> CallError {
        CallError::Argument { index: self.at, reason }
    }

    fn bytes(&mut self) -> Result<&'c [u8], CallError> {
        let value = self.argv.get(self.at).copied().ok_or_else(|| self.bad("missing"))?;
        self.at += 1;
        Ok(value)
    }

    fn int(&mut self) -> Result<i64, CallError> {
        let text = self.bytes()?;
        let parsed = std::str::from_utf8(text).ok().and_then(|t| t.parse::<i64>().ok());
        parsed.ok_or(CallError::Argument { index: self.at - 1, reason: "not an integer" })
    }

    /// An integer in `range`.
    fn int_in(
        &mut self,
        range: std::ops::RangeInclusive<i64>,
        reason: &'static str,
    ) -> Result<i64, CallError> {
        let value = self.int()?;
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(CallError::Argument { index: self.at - 1, reason })
        }
    }

    fn count(&mut self) -> Result<u64, CallError> {
        Ok(self.int_in(0..=MAX_COUNT as i64, "a count out of range")? as u64)
    }

    fn lease_id(&mut self) -> Result<LeaseId, CallError> {
        let text = self.bytes()?;
        let id = std::str::from_utf8(text).ok().and_then(|t| t.parse::<LeaseId>().ok());
        id.ok_or(CallError::Argument { index: self.at - 1, reason: "not a lease id" })
    }

    fn done(&self) -> bool {
        self.at >= self.argv.len()
    }
}

impl<'c> Call<'c> {
    fn parse(argv: &[&'c [u8]]) -> Result<Call<'c>, CallError> {
        let mut r = Reader { argv, at: 0 };
        let now = match r.bytes()? {
            b"" => None,
            _ => {
                r.at -= 1;
                Some(r.int_in(0..=MAX_EXACT as i64, "now out of range")?)
            }
        };
        // Each rule takes PER_RULE arguments: no more rules than arguments left can be sent.
        let most = (argv.len().saturating_sub(2) / PER_RULE) as i64;
        let count = r.int_in(0..=most, "more rules than arguments")?;
        let mut rules = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let at = r.at;
            let number = r.int()?;
            let parameters = [r.int()?, r.int()?, r.int()?, r.int()?];
            let algorithm = AnyAlgorithm::from_lua(number, parameters).ok_or(CallError::Argument {
                index: at,
                reason: "an unknown algorithm, or parameters out of range",
            })?;
            let prefix = r.bytes()?;
            rules.push(CallRule { algorithm, prefix });
        }
        let mut call = Call { now, rules, ops: Vec::new(), entries: Vec::new(), groups: Vec::new() };
        while !r.done() {
            let op = r.bytes()?;
            if op == OP_RUN.as_bytes() {
                call.read_run(&mut r)?;
            } else {
                r.at -= 1;
                call.read_part(&mut r)?;
            }
        }
        Ok(call)
    }

    fn rule_number(&self, r: &mut Reader<'_, 'c>) -> Result<usize, CallError> {
        Ok(r.int_in(1..=self.rules.len() as i64, "no such rule")? as usize - 1)
    }

    /// A run of lone checks: each its own group of one entry.
    fn read_run(&mut self, r: &mut Reader<'_, 'c>) -> Result<(), CallError> {
        let rule = self.rule_number(r)?;
        let left = r.argv.len().saturating_sub(r.at + 1) as i64;
        let count = r.int_in(0..=left, "more checks than arguments")?;
        for _ in 0..count {
            let cost = r.count()?;
            let entry = self.entries.len();
            self.ops.push(PartOp::Check { cost });
            self.entries.push(CallEntry { rule, op: self.ops.len() - 1 });
            self.groups.push(entry..entry + 1);
        }
        debug_assert_eq!(RUN_HEADER, 3);
        Ok(())
    }

    /// Any other part: its header, then its group plan.
    fn read_part(&mut self, r: &mut Reader<'_, 'c>) -> Result<(), CallError> {
        let header = r.at;
        let code = r.bytes()?;
        let amount = r.count()?;
        let op = if code == OP_CHECK.as_bytes() {
            r.bytes()?;
            PartOp::Check { cost: amount }
        } else if code == OP_ACQUIRE.as_bytes() {
            PartOp::Acquire { cost: amount, lease: r.lease_id()? }
        } else if code == OP_REFUND.as_bytes() {
            r.bytes()?;
            PartOp::Refund { amount }
        } else if code == OP_RELEASE.as_bytes() {
            PartOp::Release { lease: Lease { id: r.lease_id()?, units: 0 } }
        } else {
            return Err(CallError::Argument { index: header, reason: "an unknown operation" });
        };
        let units = r.count()?;
        let op = match op {
            PartOp::Release { lease } => PartOp::Release { lease: Lease { units, ..lease } },
            other => other,
        };
        let joins = r.int_in(0..=1, "joins is 0 or 1")? == 1;
        let left = r.argv.len().saturating_sub(r.at + 1) as i64;
        let count = r.int_in(1..=left, "more rules than arguments")?;
        debug_assert_eq!(r.at - header, PART_HEADER);
        self.ops.push(op);
        let first = self.entries.len();
        let group_start = match self.groups.last() {
            Some(group) if joins && group.end == first => group.start,
            _ => first,
        };
        for _ in 0..count {
            let at = r.at;
            let planned = r.int()?;
            let rule = if planned > 0 {
                r.at -= 1;
                self.rule_number(r)?
            } else {
                // -j: the state of the group's j-th entry, under its rule.
                let j = usize::try_from(planned.unsigned_abs()).unwrap_or(usize::MAX);
                let in_group = self.entries.len() - group_start;
                if j == 0 || j > in_group {
                    return Err(CallError::Argument { index: at, reason: "no such entry in the group" });
                }
                self.entries[group_start + j - 1].rule
            };
            self.entries.push(CallEntry { rule, op: self.ops.len() - 1 });
        }
        match self.groups.last_mut() {
            Some(group) if group_start < first => group.end = self.entries.len(),
            _ => self.groups.push(first..self.entries.len()),
        }
        Ok(())
    }
}

/// A state of the call: where it lives, what was read there, and its value.
struct Slot<'c> {
    key: &'c [u8],
    prefix: &'c [u8],
    algorithm: &'c AnyAlgorithm,
    /// What was read, decoded from nothing else (written back only if changed).
    stored: Stored,
    /// Whether anything was stored at all.
    present: bool,
    state: State,
}

/// Where a state lives: its key and its fields' prefix.
type Place<'c> = (&'c [u8], &'c [u8]);

/// The call's states, each read once, by key and field prefix (the same state in Redis).
#[derive(Default)]
struct Slots<'c> {
    slots: Vec<Slot<'c>>,
    index: Option<HashMap<Place<'c>, usize>>,
}

impl<'c> Slots<'c> {
    fn find(&self, key: &[u8], prefix: &[u8]) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(&(key, prefix)).copied(),
            None => self.slots.iter().position(|s| s.key == key && s.prefix == prefix),
        }
    }

    fn find_or_read(
        &mut self,
        store: &mut impl Store,
        key: &'c [u8],
        prefix: &'c [u8],
        algorithm: &'c AnyAlgorithm,
    ) -> Result<usize, StoreError> {
        if let Some(at) = self.find(key, prefix) {
            return Ok(at);
        }
        let (stored, present) = read(store, key, prefix, algorithm)?;
        let state = algorithm.decode(&stored).map_err(|corrupt| StoreError::Corrupt {
            key: String::from_utf8_lossy(key).into_owned(),
            what: corrupt.0.to_owned(),
        })?;
        self.slots.push(Slot { key, prefix, algorithm, stored, present, state });
        let at = self.slots.len() - 1;
        if let Some(index) = &mut self.index {
            index.insert((key, prefix), at);
        } else if self.slots.len() > SCAN_STATES {
            self.index = Some(self.slots.iter().enumerate().map(|(i, s)| ((s.key, s.prefix), i)).collect());
        }
        Ok(at)
    }

    /// Refuses a call that names a sorted-set state's key for another state too, before
    /// anything is written: the writes of one would break the other's (or fail on its type
    /// halfway through the call's writes).
    fn check_sorted_sets_alone(&self) -> Result<(), CallError> {
        let mut by_key: Vec<(&[u8], bool)> =
            self.slots.iter().map(|s| (s.key, s.algorithm.hash_fields().is_none())).collect();
        by_key.sort_unstable();
        for pair in by_key.windows(2) {
            let [(a, a_set), (b, b_set)] = pair else { continue };
            if a == b && (*a_set || *b_set) {
                return Err(CallError::SharedKey { key: String::from_utf8_lossy(a).into_owned() });
            }
        }
        Ok(())
    }

    /// Writes each changed state as the Lua twin would store it, with a TTL covering it.
    fn write(&mut self, store: &mut impl Store, now: i64) -> Result<(), StoreError> {
        for slot in &mut self.slots {
            let Slot { key, prefix, algorithm, stored, present, state } = slot;
            let fields = algorithm.hash_fields();
            let Some(expires_at) = algorithm.expires_at(state) else {
                if *present {
                    match fields {
                        Some(fields) if !prefix.is_empty() => {
                            let names = field_names(prefix, fields);
                            store.hash_delete(
                                key,
                                &names.iter().map(Vec::as_slice).collect::<SmallVec<[_; 3]>>(),
                            )?;
                        }
                        _ => store.delete(key)?,
                    }
                }
                continue;
            };
            let wanted = algorithm.encode(state, stored);
            if *present && wanted == *stored {
                continue;
            }
            let millis = (expires_at - now + 999).div_euclid(1000).max(1) + TTL_MARGIN_MS;
            match (&wanted, fields) {
                (Stored::Fields(values), Some(fields)) => {
                    let names = field_names(prefix, fields);
                    let pairs: SmallVec<[(&[u8], i64); 3]> =
                        names.iter().map(Vec::as_slice).zip(values.iter().copied()).collect();
                    store.hash_set(key, &pairs)?;
                    // A shared hash lives as long as its longest-lived state: its TTL only grows.
                    if !prefix.is_empty() && store.time_to_live(key)?.is_some_and(|ttl| ttl >= millis) {
                        continue;
                    }
                }
                (Stored::Members(members), _) => {
                    let before = match stored {
                        Stored::Members(before) => before.as_slice(),
                        Stored::Fields(_) => &[],
                    };
                    let gone: Vec<&[u8]> = before
                        .iter()
                        .filter(|(m, _)| !members.iter().any(|(n, _)| n == m))
                        .map(|(m, _)| m.as_slice())
                        .collect();
                    let changed: Vec<(f64, &[u8])> = members
                        .iter()
                        .filter(|(m, score)| !before.iter().any(|(n, s)| n == m && s == score))
                        .map(|(m, score)| (*score, m.as_slice()))
                        .collect();
                    if !gone.is_empty() {
                        store.sorted_set_remove(key, &gone)?;
                    }
                    if !changed.is_empty() {
                        store.sorted_set_add(key, &changed)?;
                    }
                }
                (Stored::Fields(_), None) => unreachable!("an algorithm without hash fields stores members"),
            }
            store.set_time_to_live(key, millis)?;
        }
        Ok(())
    }
}

/// The field names of a hash-stored state: its algorithm's fields, each after the prefix.
fn field_names(prefix: &[u8], fields: &[&str]) -> SmallVec<[Vec<u8>; 3]> {
    fields.iter().map(|f| [prefix, f.as_bytes()].concat()).collect()
}

/// What the Lua twin stored for a state, and whether there was anything.
fn read(
    store: &mut impl Store,
    key: &[u8],
    prefix: &[u8],
    algorithm: &AnyAlgorithm,
) -> Result<(Stored, bool), StoreError> {
    match algorithm.hash_fields() {
        Some(fields) => {
            let names = field_names(prefix, fields);
            let names: SmallVec<[&[u8]; 3]> = names.iter().map(Vec::as_slice).collect();
            let mut values: SmallVec<[Option<i64>; 3]> = SmallVec::from_elem(None, names.len());
            store.hash_get(key, &names, &mut values)?;
            let present = values.iter().any(Option::is_some);
            Ok((Stored::Fields(values.iter().map(|v| v.unwrap_or(0)).collect()), present))
        }
        None => {
            let members = store.sorted_set(key)?;
            let present = !members.is_empty();
            Ok((Stored::Members(members), present))
        }
    }
}

/// One group of the call, planned: its distinct states (each a slot) and the demand on each.
struct GroupRun<'a> {
    demands: SmallVec<[Demand<'a>; 4]>,
    entries: SmallVec<[Entry<'a>; 4]>,
    /// Each state's slot.
    slots: SmallVec<[usize; 4]>,
}

impl<'a> GroupRun<'a> {
    fn new(
        call: &'a Call<'_>,
        keys: &[&[u8]],
        group: Range<usize>,
        all: &Slots<'_>,
    ) -> Result<Self, CallError> {
        let mut run = GroupRun { demands: SmallVec::new(), entries: SmallVec::new(), slots: SmallVec::new() };
        for e in group {
            let entry = &call.entries[e];
            let rule = &call.rules[entry.rule];
            let op = call.ops[entry.op].operation();
            let slot = all.find(keys[e], rule.prefix).unwrap_or_else(|| unreachable!("every state was read"));
            let state = match run.slots.iter().position(|&s| s == slot) {
                Some(state) => state,
                None => {
                    run.slots.push(slot);
                    run.demands.push(Demand { algorithm: &rule.algorithm, units: 0, lease: None });
                    run.slots.len() - 1
                }
            };
            let demand = &mut run.demands[state];
            match op {
                Operation::Check { cost } => demand.units = demand.units.saturating_add(cost),
                Operation::Acquire { cost, lease } => {
                    demand.units = demand.units.saturating_add(cost);
                    demand.lease = Some(lease);
                }
                Operation::Refund { .. } | Operation::Release { .. } => {}
            }
            // Never sent by a rule set (BatchPlan refuses it), and beyond the bounds the
            // algorithms' exact arithmetic is checked for.
            if demand.units > demand.algorithm.capacity() {
                return Err(CallError::Capacity);
            }
            run.entries.push(Entry { algorithm: &rule.algorithm, state, op });
        }
        Ok(run)
    }
}

impl<'a> Group<'a> for GroupRun<'a> {
    fn states(&self) -> usize {
        self.demands.len()
    }

    fn demand(&self, at: usize) -> Demand<'a> {
        self.demands[at]
    }

    fn entries(&self) -> usize {
        self.entries.len()
    }

    fn entry(&self, at: usize) -> Entry<'a> {
        self.entries[at]
    }
}

/// A group's states, in the call's slots.
struct SlotStates<'s, 'c> {
    slots: &'s mut Slots<'c>,
    of_state: &'s [usize],
}

impl States for SlotStates<'_, '_> {
    fn get(&mut self, index: usize) -> &mut State {
        &mut self.slots.slots[self.of_state[index]].state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Period, Rule, RuleSet};

    #[test]
    fn every_rule_is_read_back_as_the_algorithm_it_compiled_to() {
        let odd = Period::from_millis(333).unwrap();
        let rules = RuleSet::new([
            Rule::fixed_window(7, odd),
            Rule::fixed_window_from_first_hit(7, Period::MAX),
            Rule::sliding_window_log(10_000, Period::MIN),
            Rule::sliding_window_counter(1_000_000_000_000, Period::DAY),
            Rule::token_bucket(5, 3, Period::SECOND),
            Rule::gcra(999_999_937, Period::MAX, 1),
            Rule::concurrency(10_000, odd),
        ])
        .unwrap();
        for rule in rules.compiled() {
            let number = rule.algorithm.lua_index() as i64 + 1;
            let read = AnyAlgorithm::from_lua(number, rule.algorithm.lua_parameters());
            assert_eq!(read.as_ref(), Some(&rule.algorithm), "{:?}", rule.rule);
        }
        assert_eq!(AnyAlgorithm::from_lua(0, [1, 1000, 0, 0]), None);
        assert_eq!(AnyAlgorithm::from_lua(6, [1, 1000, 0, 0]), None);
        assert_eq!(AnyAlgorithm::from_lua(1, [1, 0, 0, 0]), None, "a period of 0 divides by zero");
        assert_eq!(AnyAlgorithm::from_lua(1, [1, 1000, 2, 0]), None, "alignment is 0 or 1");
        assert_eq!(AnyAlgorithm::from_lua(4, [1, 0, 0, 1]), None, "an interval of 0");
        assert_eq!(AnyAlgorithm::from_lua(4, [1, 1, 5, 5]), None, "a remainder of a whole den");
        assert_eq!(AnyAlgorithm::from_lua(2, [10_001, 1000, 0, 0]), None, "a log beyond its limit");
    }
}
