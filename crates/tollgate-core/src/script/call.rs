//! [`execute`]: a script call decided in Rust, over a [`Store`], for a Redis module.
//!
//! The call is read exactly as the script reads it (the layout in the [module docs](super)),
//! and decided by the engine's phases ([`crate::engine::phases`]) and the algorithms' Rust
//! forms, over states decoded from the keys and fields the Lua twins write. So a module and
//! the Lua can take turns on the same keys: each reads what the other wrote.
//!
//! Unlike the script, which writes as it goes, `execute` reads every state the call names
//! before it writes any, and writes what changed once at the end, key by key: a call with a
//! bad argument or an unreadable key changes nothing, and a call that changed nothing (a
//! denial) writes nothing. A hash's fields, those of every state it holds, are read together
//! and written together (only the fields that changed), and its TTL is written once, only when
//! it must grow: each state remembers the expiry it was read with, as the Lua's `hstore` does.

use std::collections::HashMap;
use std::ops::Range;

use smallvec::SmallVec;

use super::store::{Store, StoreError};
use super::{OP_ACQUIRE, OP_CHECK, OP_REFUND, OP_RELEASE, OP_RUN, PART_HEADER, PER_RULE, RUN_HEADER};
use crate::algorithm::{AnyAlgorithm, State, Stored};
use crate::engine::{self, States};
use crate::limits::{MAX_COUNT, MAX_EXACT};
use crate::plan::{GroupPlan, PlannedState};
use crate::{Lease, LeaseId, Operation};

/// A key outlives its state by this much, as in the Lua twins (`TTL_MARGIN_MS` in
/// `script/prelude.lua`, which says why).
const TTL_MARGIN_MS: i64 = 1000;

/// Beyond this many states in a call, they are found by hash rather than by scanning.
const SCAN_STATES: usize = 16;

/// Beyond this many members, a sorted set's members are found by hash rather than by scanning
/// when the changes to write are worked out.
const SCAN_MEMBERS: usize = 16;

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
/// use tollgate_core::script::{self, Arg, Store, StoreError};
/// use tollgate_core::{Part, Period, Rule, RuleSet, Timestamp};
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
/// let parts = [Part::new("user-1", &rules, 1)];
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
    let mut reply = Vec::with_capacity(1 + 4 * keys.len());
    execute_into(keys, argv, store, &mut reply)?;
    Ok(reply)
}

/// [`execute`], with the reply appended to `reply` rather than returned, so that a caller can
/// keep it on the stack (a `SmallVec`): then a call of a few rules (up to 8 entries, 8 states
/// and 12 fields per key) allocates nothing. On an error, what was appended is a partial reply,
/// to be discarded; the store is as it was.
pub fn execute_into(
    keys: &[&[u8]],
    argv: &[&[u8]],
    store: &mut impl Store,
    reply: &mut impl Extend<i64>,
) -> Result<(), CallError> {
    let call = Call::parse(argv).map_err(CallError::from)?;
    if call.entries.len() != keys.len() {
        return Err(CallError::Keys { expected: call.entries.len(), got: keys.len() });
    }
    // Each entry's state, found or added once per place (key and prefix).
    let mut loaded = LoadedStates::default();
    let entry_state: Few<usize> = call
        .entries
        .iter()
        .zip(keys)
        .map(|(entry, key)| {
            let rule = &call.rules[entry.rule];
            loaded.find_or_add(key, rule.prefix, &rule.algorithm)
        })
        .collect();
    loaded.check_sorted_sets_alone()?;
    let now = match call.now {
        Some(now) => now,
        None => store.now()?,
    };
    // Read every state first, so that a failed read leaves the store as it was.
    loaded.read(store)?;
    reply.extend([now]);
    // Each group runs on the states in memory; nothing is written until every group ran, so a
    // group refused here (its capacity) leaves the store as it was.
    for group in &call.groups {
        let plan = plan_group(&call, &entry_state, group.clone())?;
        engine::phases(
            now,
            &plan,
            &mut GroupStates { loaded: &mut loaded, planned: plan.states() },
            |a, r| {
                reply.extend([
                    i64::from(a.admits),
                    i64::try_from(r.remaining).unwrap_or(i64::MAX),
                    r.reset_after,
                    if a.admits { 0 } else { a.retry_after },
                ]);
            },
        );
    }
    loaded.write(store, now, call.now.is_none())?;
    Ok(())
}

/// What a call of a few rules holds inline (on the stack): rules, parts, entries, groups and
/// states, each up to this many before they spill to the heap.
type Few<T> = SmallVec<[T; 8]>;

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

/// One entry of a part (one of its rules): its rule, and its part's operation (its index in
/// [`Call::ops`]).
struct CallEntry {
    rule: usize,
    op: usize,
}

/// A call's arguments, read and checked.
struct Call<'c> {
    now: Option<i64>,
    rules: Few<CallRule<'c>>,
    ops: Few<PartOp>,
    entries: Few<CallEntry>,
    /// Each group's entries (and keys), in order.
    groups: Few<Range<usize>>,
}

/// A malformed argument: [`CallError::Argument`], small and `Copy`, so that the reader's
/// results stay small and a failed check costs no drop.
#[derive(Clone, Copy, Debug)]
struct BadArgument {
    index: usize,
    reason: &'static str,
}

impl From<BadArgument> for CallError {
    fn from(BadArgument { index, reason }: BadArgument) -> Self {
        CallError::Argument { index, reason }
    }
}

/// Reads `argv` from `at` on.
struct Reader<'a, 'c> {
    argv: &'a [&'c [u8]],
    at: usize,
}

impl<'c> Reader<'_, 'c> {
    fn bad(&self, reason: &'static str) -> BadArgument {
        BadArgument { index: self.at, reason }
    }

    fn bytes(&mut self) -> Result<&'c [u8], BadArgument> {
        let value = self.argv.get(self.at).copied().ok_or_else(|| self.bad("missing"))?;
        self.at += 1;
        Ok(value)
    }

    fn int(&mut self) -> Result<i64, BadArgument> {
        let text = self.bytes()?;
        parse_int(text).ok_or(BadArgument { index: self.at - 1, reason: "not an integer" })
    }

    /// An integer in `range`.
    fn int_in(
        &mut self,
        range: std::ops::RangeInclusive<i64>,
        reason: &'static str,
    ) -> Result<i64, BadArgument> {
        let value = self.int()?;
        if range.contains(&value) { Ok(value) } else { Err(BadArgument { index: self.at - 1, reason }) }
    }

    fn count(&mut self) -> Result<u64, BadArgument> {
        Ok(self.int_in(0..=MAX_COUNT as i64, "a count out of range")? as u64)
    }

    fn lease_id(&mut self) -> Result<LeaseId, BadArgument> {
        let text = self.bytes()?;
        let id = std::str::from_utf8(text).ok().and_then(|t| t.parse::<LeaseId>().ok());
        id.ok_or(BadArgument { index: self.at - 1, reason: "not a lease id" })
    }

    fn done(&self) -> bool {
        self.at >= self.argv.len()
    }
}

/// A decimal integer as `str::parse::<i64>` reads one (an optional sign, then digits, within
/// `i64`), straight from bytes: a call's arguments are mostly integers, and this is about a
/// tenth of the cost of checking UTF-8 and then parsing. A [`Store`] reading Redis's text may
/// use it for its hash fields.
pub fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulated negative, so that i64::MIN fits.
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(digit))?;
    }
    if negative { Some(value) } else { value.checked_neg() }
}

impl<'c> Call<'c> {
    fn parse(argv: &[&'c [u8]]) -> Result<Call<'c>, BadArgument> {
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
        let mut rules = Few::with_capacity(count as usize);
        for _ in 0..count {
            let at = r.at;
            let number = r.int()?;
            let parameters = [r.int()?, r.int()?, r.int()?, r.int()?];
            let algorithm = AnyAlgorithm::from_lua(number, parameters).ok_or(BadArgument {
                index: at,
                reason: "an unknown algorithm, or parameters out of range",
            })?;
            let prefix = r.bytes()?;
            rules.push(CallRule { algorithm, prefix });
        }
        let mut call = Call { now, rules, ops: Few::new(), entries: Few::new(), groups: Few::new() };
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

    fn rule_number(&self, r: &mut Reader<'_, 'c>) -> Result<usize, BadArgument> {
        Ok(r.int_in(1..=self.rules.len() as i64, "no such rule")? as usize - 1)
    }

    /// A run of lone checks: each its own group of one entry.
    fn read_run(&mut self, r: &mut Reader<'_, 'c>) -> Result<(), BadArgument> {
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
    fn read_part(&mut self, r: &mut Reader<'_, 'c>) -> Result<(), BadArgument> {
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
            return Err(BadArgument { index: header, reason: "an unknown operation" });
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
                    return Err(BadArgument { index: at, reason: "no such entry in the group" });
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

/// A state of the call, loaded from the store: where it lives, what was read there, and its
/// value.
struct Loaded<'c> {
    key: &'c [u8],
    prefix: &'c [u8],
    algorithm: &'c AnyAlgorithm,
    /// The first state on the same key (this one's index if it is the first): the states of a
    /// key are read together, and written together, by that one.
    first_on_key: usize,
    /// The next state on the same key, in the order they were added.
    next_on_key: Option<usize>,
    /// The last state on the key (kept by its first state only), to add the next in O(1).
    last_on_key: usize,
    /// What was read, decoded from nothing else; written back only where it changed.
    stored: Stored,
    /// What was found: bit `i` for the hash field `i`; bit 0 for any member of a sorted set.
    found: u8,
    /// When the state as read expired (`None` when there was none): the key's TTL was made to
    /// cover it when it was written, as the Lua's `had` (see `hstore` in `prelude.lua`).
    had: Option<i64>,
    state: State,
}

impl Loaded<'_> {
    /// Whether the state lives in a hash (else in a sorted set of its own).
    fn in_hash(&self) -> bool {
        self.algorithm.hash_fields().is_some()
    }
}

/// Where a state lives: its key and its fields' prefix.
type Place<'c> = (&'c [u8], &'c [u8]);

/// The call's states, each read once, by key and field prefix (the same state in Redis).
#[derive(Default)]
struct LoadedStates<'c> {
    states: Few<Loaded<'c>>,
    /// Beyond [`SCAN_STATES`] states: each place's state, and each key's first state.
    index: Option<Index<'c>>,
}

/// Each place's state, and each key's first state (their indices).
type Index<'c> = (HashMap<Place<'c>, usize>, HashMap<&'c [u8], usize>);

/// A sorted set's changes: the members to remove, and those to add (score, member).
type MembersDiff<'a> = (Vec<&'a [u8]>, Vec<(f64, &'a [u8])>);

/// Field names, `prefix` + field each, in one buffer: a call of a few rules makes them on the
/// stack.
#[derive(Default)]
struct Names {
    bytes: SmallVec<[u8; 96]>,
    ends: SmallVec<[usize; 12]>,
}

impl Names {
    fn push(&mut self, prefix: &[u8], field: &str) {
        // (`extend` of bytes: short names copy faster byte by byte than through
        // `extend_from_slice`'s two calls to memmove)
        self.bytes.extend(prefix.iter().chain(field.as_bytes()).copied());
        self.ends.push(self.bytes.len());
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn slices(&self) -> SmallVec<[&[u8]; 12]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let name = &self.bytes[start..end];
                start = end;
                name
            })
            .collect()
    }
}

/// A key's TTL covering a state that expires at `expires_at`, as the Lua twins compute it
/// (`expire_at` in `prelude.lua`).
fn ttl_millis(expires_at: i64, now: i64) -> i64 {
    (expires_at - now + 999).div_euclid(1000).max(1) + TTL_MARGIN_MS
}

impl<'c> LoadedStates<'c> {
    fn find(&self, key: &[u8], prefix: &[u8]) -> Option<usize> {
        match &self.index {
            Some((places, _)) => places.get(&(key, prefix)).copied(),
            None => self.states.iter().position(|s| s.prefix == prefix && s.key == key),
        }
    }

    fn first_on(&self, key: &[u8]) -> Option<usize> {
        match &self.index {
            Some((_, keys)) => keys.get(key).copied(),
            None => self.states.iter().position(|s| s.key == key),
        }
    }

    /// The index of the state at `key` and `prefix`, added (not yet read) if new.
    fn find_or_add(&mut self, key: &'c [u8], prefix: &'c [u8], algorithm: &'c AnyAlgorithm) -> usize {
        if let Some(at) = self.find(key, prefix) {
            return at;
        }
        let at = self.states.len();
        let first_on_key = match self.first_on(key) {
            Some(first) => {
                let last = self.states[first].last_on_key;
                self.states[last].next_on_key = Some(at);
                self.states[first].last_on_key = at;
                first
            }
            None => at,
        };
        self.states.push(Loaded {
            key,
            prefix,
            algorithm,
            first_on_key,
            next_on_key: None,
            last_on_key: at,
            stored: Stored::Fields(SmallVec::new()),
            found: 0,
            had: None,
            state: algorithm.new_state(),
        });
        if let Some((places, keys)) = &mut self.index {
            places.insert((key, prefix), at);
            keys.entry(key).or_insert(at);
        } else if self.states.len() > SCAN_STATES {
            let places = self.states.iter().enumerate().map(|(i, s)| ((s.key, s.prefix), i)).collect();
            let keys = self.states.iter().map(|s| (s.key, s.first_on_key)).collect();
            self.index = Some((places, keys));
        }
        at
    }

    /// The states on the key whose first state is `first`, in order.
    fn on_key(&self, first: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(first), |&at| self.states[at].next_on_key)
    }

    /// Refuses a call that names a sorted-set state's key for another state too, before
    /// anything is read or written: the writes of one would break the other's (or fail on its
    /// type halfway through the call's writes).
    fn check_sorted_sets_alone(&self) -> Result<(), CallError> {
        for (at, loaded) in self.states.iter().enumerate() {
            if !loaded.in_hash() && (loaded.first_on_key != at || loaded.next_on_key.is_some()) {
                return Err(CallError::SharedKey { key: String::from_utf8_lossy(loaded.key).into_owned() });
            }
        }
        Ok(())
    }

    /// Reads every state: a hash's fields, those of all its states, in one `hash_get`; a
    /// sorted set whole. Then decodes each.
    fn read(&mut self, store: &mut impl Store) -> Result<(), StoreError> {
        for first in 0..self.states.len() {
            if self.states[first].first_on_key != first {
                continue;
            }
            let key = self.states[first].key;
            if !self.states[first].in_hash() {
                // A key of its own (check_sorted_sets_alone).
                let members = store.sorted_set(key)?;
                let loaded = &mut self.states[first];
                loaded.found = u8::from(!members.is_empty());
                loaded.stored = Stored::Members(members);
                continue;
            }
            let mut names = Names::default();
            for at in self.on_key(first) {
                let loaded = &self.states[at];
                for field in loaded.algorithm.hash_fields().unwrap_or_default() {
                    names.push(loaded.prefix, field);
                }
            }
            let mut values: SmallVec<[Option<i64>; 12]> = SmallVec::from_elem(None, names.ends.len());
            store.hash_get(key, &names.slices(), &mut values)?;
            let mut next = 0;
            let mut at = Some(first);
            while let Some(this) = at {
                let loaded = &mut self.states[this];
                let count = loaded.algorithm.hash_fields().unwrap_or_default().len();
                let read = &values[next..next + count];
                next += count;
                loaded.found = read
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_some())
                    .fold(0, |bits, (i, _)| bits | 1 << i);
                loaded.stored = Stored::Fields(read.iter().map(|v| v.unwrap_or(0)).collect());
                at = loaded.next_on_key;
            }
        }
        for loaded in &mut self.states {
            loaded.state =
                loaded.algorithm.decode(&loaded.stored).map_err(|corrupt| StoreError::Corrupt {
                    key: String::from_utf8_lossy(loaded.key).into_owned(),
                    what: corrupt.0.to_owned(),
                })?;
            if loaded.found != 0 {
                loaded.had = loaded.algorithm.expires_at(&mut loaded.state);
            }
        }
        Ok(())
    }

    /// Writes what changed, key by key, as the Lua twins would store it, with a TTL covering
    /// it. `clock_is_store`: `now` is the store's own clock (Redis's), which TTLs count on.
    fn write(&mut self, store: &mut impl Store, now: i64, clock_is_store: bool) -> Result<(), StoreError> {
        for first in 0..self.states.len() {
            if self.states[first].first_on_key != first {
                continue;
            }
            if self.states[first].in_hash() {
                self.write_hash(first, store, now, clock_is_store)?;
            } else {
                self.states[first].write_members(store, now)?;
            }
        }
        Ok(())
    }

    /// Writes the states of one hash: the fields that changed, in one `hash_set`; the fields of
    /// the states gone, in one `hash_delete`; then the key's TTL, once.
    ///
    /// A hash holding one state with no prefix is that state's own key: it is deleted with its
    /// state, and its TTL set to the state's, as the Lua's `expire_at`. A shared hash lives as
    /// long as its longest-lived state: its TTL only grows, and is left alone when every state
    /// written was read with an expiry at least as late (`had`: its TTL was made to cover that
    /// when it was written), on the store's own clock only (a `now` given by the caller may run
    /// behind it), as the Lua's `hstore`.
    fn write_hash(
        &mut self,
        first: usize,
        store: &mut impl Store,
        now: i64,
        clock_is_store: bool,
    ) -> Result<(), StoreError> {
        let key = self.states[first].key;
        let own = self.states[first].prefix.is_empty() && self.states[first].next_on_key.is_none();
        let (mut set, mut values, mut gone) =
            (Names::default(), SmallVec::<[i64; 12]>::new(), Names::default());
        // The latest expiry the key's TTL must cover after this call.
        let mut cover: Option<i64> = None;
        let mut at = Some(first);
        while let Some(this) = at {
            let Loaded { prefix, algorithm, stored, found, had, state, next_on_key, .. } =
                &mut self.states[this];
            at = *next_on_key;
            let fields = algorithm.hash_fields().unwrap_or_default();
            let Some(expires_at) = algorithm.expires_at(state) else {
                for (i, field) in fields.iter().enumerate() {
                    if *found & 1 << i != 0 {
                        gone.push(prefix, field);
                    }
                }
                continue;
            };
            let (Stored::Fields(wanted), Stored::Fields(before)) =
                (algorithm.encode(state, stored), &*stored)
            else {
                unreachable!("a hash-stored algorithm encodes fields")
            };
            let mut wrote = false;
            for (i, (field, (&value, &was))) in
                fields.iter().zip(wanted.iter().zip(before.iter())).enumerate()
            {
                if *found & 1 << i == 0 || value != was {
                    set.push(prefix, field);
                    values.push(value);
                    wrote = true;
                }
            }
            let covered = !own && clock_is_store && had.is_some_and(|had| had >= expires_at);
            if wrote && !covered {
                cover = Some(cover.map_or(expires_at, |c| c.max(expires_at)));
            }
        }
        if own && !gone.is_empty() {
            return store.delete(key);
        }
        if !set.is_empty() {
            let names = set.slices();
            let pairs: SmallVec<[(&[u8], i64); 12]> =
                names.iter().copied().zip(values.iter().copied()).collect();
            store.hash_set(key, &pairs)?;
        }
        if !gone.is_empty() {
            store.hash_delete(key, &gone.slices())?;
        }
        match cover {
            Some(expires_at) if own => store.set_time_to_live(key, ttl_millis(expires_at, now)),
            Some(expires_at) => store.extend_time_to_live(key, ttl_millis(expires_at, now)),
            None => Ok(()),
        }
    }
}

impl Loaded<'_> {
    /// Writes a sorted-set state (a key of its own): the members that changed, and a TTL
    /// covering the state; the key deleted when the state is gone.
    fn write_members(&mut self, store: &mut impl Store, now: i64) -> Result<(), StoreError> {
        let Loaded { key, algorithm, stored, found, state, .. } = self;
        let Some(expires_at) = algorithm.expires_at(state) else {
            return if *found != 0 { store.delete(key) } else { Ok(()) };
        };
        let wanted = algorithm.encode(state, stored);
        if *found != 0 && wanted == *stored {
            return Ok(());
        }
        let (Stored::Members(after), Stored::Members(before)) = (&wanted, &*stored) else {
            unreachable!("a sorted-set algorithm encodes members")
        };
        let (gone, changed) = members_diff(before, after, SCAN_MEMBERS);
        if !gone.is_empty() {
            store.sorted_set_remove(key, &gone)?;
        }
        if !changed.is_empty() {
            store.sorted_set_add(key, &changed)?;
        }
        store.set_time_to_live(key, ttl_millis(expires_at, now))
    }
}

/// What turns the sorted set `before` into `after`: the members to remove (in `before`, not in
/// `after`), and those to add or rescore (in `after`, not in `before` with the same score),
/// each in its set's order. Members are found by scanning up to `scan` members, by hash
/// beyond, so that a large set's diff is O(n), not O(n²).
fn members_diff<'a>(
    before: &'a [(Vec<u8>, f64)],
    after: &'a [(Vec<u8>, f64)],
    scan: usize,
) -> MembersDiff<'a> {
    let (gone, changed);
    if before.len().max(after.len()) <= scan {
        gone = before
            .iter()
            .filter(|(m, _)| !after.iter().any(|(n, _)| n == m))
            .map(|(m, _)| m.as_slice())
            .collect();
        changed = after
            .iter()
            .filter(|(m, score)| !before.iter().any(|(n, s)| n == m && s == score))
            .map(|(m, score)| (*score, m.as_slice()))
            .collect();
    } else {
        let was: HashMap<&[u8], f64> = before.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
        let kept: std::collections::HashSet<&[u8]> = after.iter().map(|(m, _)| m.as_slice()).collect();
        gone =
            before.iter().filter(|(m, _)| !kept.contains(m.as_slice())).map(|(m, _)| m.as_slice()).collect();
        changed = after
            .iter()
            .filter(|(m, score)| was.get(m.as_slice()) != Some(score))
            .map(|(m, score)| (*score, m.as_slice()))
            .collect();
    }
    (gone, changed)
}

/// One group of the call, planned ([`GroupPlan`]): its distinct states, each found by its
/// index among the call's loaded states (one per place in Redis, the same state for every
/// entry naming it), and the demand on each.
fn plan_group<'a>(
    call: &'a Call<'_>,
    entry_state: &[usize],
    group: Range<usize>,
) -> Result<GroupPlan<'a, usize>, CallError> {
    let mut plan = GroupPlan::empty();
    let mut part = None;
    for e in group {
        let entry = &call.entries[e];
        if part != Some(entry.op) {
            part = Some(entry.op);
            plan.add_part(call.ops[entry.op].operation());
        }
        plan.add_entry(entry_state[e], &call.rules[entry.rule].algorithm);
    }
    // Never sent by a rule set (BatchPlan refuses it), and beyond the bounds the algorithms'
    // exact arithmetic is checked for.
    if plan.over_capacity().is_some() {
        return Err(CallError::Capacity);
    }
    Ok(plan)
}

/// A group's states, each the loaded state its plan names.
struct GroupStates<'s, 'c> {
    loaded: &'s mut LoadedStates<'c>,
    planned: &'s [PlannedState<'s, usize>],
}

impl States for GroupStates<'_, '_> {
    fn get(&mut self, index: usize) -> &mut State {
        &mut self.loaded.states[self.planned[index].place].state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Period, Rule, RuleSet};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn integers_are_read_as_str_parse_reads_them(text in "[-+]?[0-9]{0,21}|[ -~]{0,8}", n in any::<i64>()) {
            prop_assert_eq!(parse_int(text.as_bytes()), text.parse::<i64>().ok());
            let n = n.to_string();
            prop_assert_eq!(parse_int(n.as_bytes()), n.parse::<i64>().ok());
        }
    }

    #[test]
    fn the_integers_at_the_edges_are_read() {
        for text in ["0", "-0", "+0", "9223372036854775807", "-9223372036854775808", "007"] {
            assert_eq!(parse_int(text.as_bytes()), text.parse::<i64>().ok(), "{text}");
        }
        for text in
            ["", "-", "+", "9223372036854775808", "-9223372036854775809", "1 ", " 1", "1e3", "--1", "٣"]
        {
            assert_eq!(parse_int(text.as_bytes()), None, "{text}");
        }
    }

    /// A sorted set as Redis keeps it: distinct members, each with a score.
    fn sorted_set() -> impl Strategy<Value = Vec<(Vec<u8>, f64)>> {
        // Few distinct members and scores, so that the two sets share many of each.
        proptest::collection::btree_map(proptest::collection::vec(0u8..4, 1..3), 0u8..3, 0..40)
            .prop_map(|set| set.into_iter().map(|(m, s)| (m, f64::from(s))).collect())
    }

    proptest! {
        #[test]
        fn a_sorted_sets_diff_is_the_same_scanned_and_indexed(before in sorted_set(), after in sorted_set()) {
            let scanned = members_diff(&before, &after, usize::MAX);
            let indexed = members_diff(&before, &after, 0);
            prop_assert_eq!(&scanned, &indexed);
            // And it is the diff: applied to `before`, it gives `after`.
            let mut set: std::collections::BTreeMap<&[u8], f64> =
                before.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
            for m in &scanned.0 {
                prop_assert!(set.remove(m).is_some(), "removes only members it had");
            }
            for (s, m) in &scanned.1 {
                set.insert(m, *s);
            }
            let wanted: std::collections::BTreeMap<&[u8], f64> =
                after.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
            prop_assert_eq!(set, wanted);
        }
    }

    #[test]
    fn a_large_sorted_sets_diff_is_indexed() {
        // 50,000 members, all rescored but one, half gone: scanned, this compares 10^9 pairs
        // (186 s in a debug build); indexed, 0.4 s.
        let before: Vec<(Vec<u8>, f64)> = (0..50_000u32).map(|i| (i.to_be_bytes().to_vec(), 1.0)).collect();
        let after: Vec<(Vec<u8>, f64)> = (25_000..75_000u32)
            .map(|i| (i.to_be_bytes().to_vec(), if i == 25_000 { 1.0 } else { 2.0 }))
            .collect();
        let started = std::time::Instant::now();
        let (gone, changed) = members_diff(&before, &after, SCAN_MEMBERS);
        assert_eq!((gone.len(), changed.len()), (25_000, 49_999));
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
    }

    /// The arguments the script is sent for `parts`, as text.
    fn sent(parts: &[crate::Part<'_>]) -> Vec<String> {
        let text = |a: &crate::script::Arg<'_>| match a {
            crate::script::Arg::Int(n) => n.to_string(),
            crate::script::Arg::Text(t) => (*t).to_owned(),
        };
        crate::script::arguments(parts, None).iter().map(text).collect()
    }

    fn argv(sent: &[String]) -> Vec<&[u8]> {
        sent.iter().map(|a| a.as_bytes()).collect()
    }

    /// What reading `sent` with argument `at` replaced by `value` refuses, and where.
    fn refused(sent: &[String], at: usize, value: &str) -> (usize, &'static str) {
        let mut argv = argv(sent);
        assert!(Call::parse(&argv).is_ok());
        argv[at] = value.as_bytes();
        match Call::parse(&argv) {
            Err(BadArgument { index, reason }) => (index, reason),
            Ok(_) => panic!("argument {at} = {value:?} was read"),
        }
    }

    /// The error names the argument at fault, counted from 0, whichever reader found it.
    #[test]
    fn a_bad_argument_is_named_by_its_position() {
        let rules = RuleSet::new([Rule::fixed_window(5, Period::SECOND)]).unwrap();
        let check = sent(&[crate::Part::new("k", &rules, 1)]);
        // A rule's parameter (read as an integer), the rule count (in a range), the cost.
        assert_eq!(refused(&check, 3, "x"), (3, "not an integer"));
        assert_eq!(refused(&check, 1, "x"), (1, "not an integer"));
        // One rule more than the arguments could hold: (12 - 2) / 6 = 1.
        assert_eq!(check.len(), 12);
        assert_eq!(refused(&check, 1, "2"), (1, "more rules than arguments"));
        // The run's count of checks (one cost follows it), then that cost.
        let last = check.len() - 1;
        assert_eq!(refused(&check, last - 1, "2"), (last - 1, "more checks than arguments"));
        assert_eq!(refused(&check, last, "-1"), (last, "a count out of range"));

        let (id, leases) =
            (crate::LeaseId::random(), RuleSet::new([Rule::concurrency(3, Period::SECOND)]).unwrap());
        let acquire =
            sent(&[crate::Part::operation("k", &leases, crate::Operation::Acquire { cost: 1, lease: &id })]);
        let at = acquire.iter().position(|a| a == id.as_str()).unwrap();
        assert_eq!(refused(&acquire, at, "not an id!"), (at, "not a lease id"));
    }

    /// A part joins the group before only when it says so; its rule count is bounded by the
    /// arguments left; a reference to an entry of its group must name one.
    #[test]
    fn parts_are_read_into_their_groups() {
        let leases = RuleSet::new([Rule::concurrency(3, Period::SECOND)]).unwrap();
        let ids = [crate::LeaseId::random(), crate::LeaseId::random(), crate::LeaseId::random()];
        let acquire = |i: usize| {
            crate::Part::operation("k", &leases, crate::Operation::Acquire { cost: 1, lease: &ids[i] })
        };
        let groups = |sent: &[String]| Call::parse(&argv(sent)).unwrap().groups.len();
        assert_eq!(groups(&sent(&[acquire(0), acquire(1).in_group(1)])), 2);
        // A lone group, then a joint one whose second part names the group's first entry (-1).
        let joint = sent(&[acquire(0), acquire(1).in_group(1), acquire(2).in_group(1)]);
        assert_eq!(groups(&joint), 2);
        let header = joint.iter().position(|a| a == ids[2].as_str()).unwrap();
        let (count, reference) = (header + 3, header + 4);
        assert_eq!(joint[reference], "-1");
        assert_eq!(refused(&joint, count, "2"), (count, "more rules than arguments"));
        for bad in ["0", "-2"] {
            assert_eq!(refused(&joint, reference, bad), (reference, "no such entry in the group"), "{bad}");
        }
    }

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
            // An emission interval under a microsecond: a quotient of 0 (1/3 µs).
            Rule::gcra(3_000_000, Period::SECOND, 1),
            Rule::concurrency(10_000, odd),
        ])
        .unwrap();
        assert_eq!(rules.compiled()[6].algorithm.lua_parameters()[1], 0, "the quotient");
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
        // A GCRA whose bucket takes longer to fill than any rule may (capacity x interval).
        let gcra = rules.compiled()[5].algorithm.lua_index() as i64 + 1;
        let half = (crate::limits::MAX_FILL_MICROS / 2 + 1) as i64;
        assert!(AnyAlgorithm::from_lua(gcra, [1, half, 0, 1]).is_some());
        assert_eq!(AnyAlgorithm::from_lua(gcra, [3, half, 0, 1]), None, "beyond the longest fill");
        // And one whose capacity x den passes exact arithmetic (10^16 > 2^53), though its
        // interval (10^-4 µs) and fill are small.
        assert!(AnyAlgorithm::from_lua(gcra, [900_000_000_000, 0, 1, 10_000]).is_some());
        assert_eq!(AnyAlgorithm::from_lua(gcra, [1_000_000_000_000, 0, 1, 10_000]), None, "inexact");
        assert_eq!(AnyAlgorithm::from_lua(2, [10_001, 1000, 0, 0]), None, "a log beyond its limit");
    }
}
