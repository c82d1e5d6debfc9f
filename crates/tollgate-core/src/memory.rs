//! [`MemoryBackend`]: rule states in process memory, the embedded default.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use async_trait::async_trait;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::algorithm::State;
use crate::engine::{self, States};
use crate::limits::{MAX_BATCH_PARTS, MAX_RULES};
use crate::operation::validate_key;
use crate::plan::KeyRule;
use crate::ruleset::CompiledRule;
use crate::{Backend, BatchPlan, Clock, Decision, Error, Operation, Part, RuleSet, SystemClock};

/// The memory backend's hash: foldhash, seeded at random per map (and per process), so that
/// keys a caller chooses cannot be aimed at one bucket or one shard, at a fraction of
/// SipHash's cost.
type RandomState = foldhash::fast::RandomState;

/// Sweeps for expired state run at most once a second, and at most once per microsecond per key
/// held (10 s apart with 10 million keys), so their cost stays a small share of one core while
/// expired state lingers only briefly. Deciding whether one is due reads one shared atomic.
const MIN_MICROS_BETWEEN_SWEEPS: i64 = 1_000_000;

/// The default cap on keys held ([`MemoryBackendBuilder::max_keys`]). A key costs about 0.8 KB
/// with a few rules (more with sliding logs), so a million keys is under a gigabyte: enough for
/// a busy instance's distinct callers, and a bound a stranger inventing keys cannot pass.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The smallest cap on keys: a batch ([`Backend::check_batch`]) names up to
/// [`MAX_BATCH_PARTS`] keys, which must all be held at once (all or nothing), possibly in one
/// shard.
pub const MIN_MAX_KEYS: usize = MAX_BATCH_PARTS;

/// Counter: keys dropped by the memory backend before they expired, to stay within its
/// `max_keys`, by `backend` (`memory`, or `local_fallback` for the limiter's fallback).
pub const EVICTIONS_METRIC: &str = "tollgate_memory_evictions_total";

/// While keys are being evicted, a warning is logged at most this often (microseconds), with
/// the number evicted since the last one: enough to notice, never a flood.
const EVICTION_LOG_INTERVAL: i64 = 10_000_000;

/// One rule's state for a key, as held.
#[derive(Debug)]
struct HeldState {
    signature: Arc<str>,
    state: State,
    /// When `state` becomes the same as no state.
    expires_at: i64,
}

/// A key's states under every rule it has been checked with (usually one or two, kept inline
/// so a lookup touches one allocation less).
#[derive(Debug)]
struct Entry {
    states: SmallVec<[HeldState; 2]>,
    /// The latest of the states' expiries: the entry can go then.
    expires_at: i64,
    /// The expiry of this entry's newest (and lowest) record in its shard's `by_expiry`, at
    /// most `expires_at`; `i64::MAX` before its first.
    floor: i64,
    /// The [`RuleSet::id`] of the set whose rules `states` are, exactly and in its order, when
    /// known; 0 when not. Set when a run finds them so; reset by every change to which states
    /// are held (a state added or dropped).
    laid_out_for: u64,
}

impl Default for Entry {
    fn default() -> Self {
        Entry { states: SmallVec::new(), expires_at: i64::MIN, floor: i64::MAX, laid_out_for: 0 }
    }
}

/// Rule states in process memory: concurrent (keys spread over lock-striped shards), with an
/// injectable clock, and bounded under key churn: state that has expired (become the same as no
/// state) is dropped by a periodic sweep, so a stream of one-off keys does not grow memory
/// forever.
///
/// All the rules of one operation are decided under one shard lock, so a check is atomic
/// across its rules; a batch ([`check_batch_now`](MemoryBackend::check_batch_now)) holds the
/// locks of all its keys' shards, taken in ascending order so batches never deadlock. (The
/// shards are Tollgate's own rather than `dashmap`'s because a batch must lock several at
/// once, which dashmap offers only through an unsafe raw API.)
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet};
///
/// let clock = ManualClock::at_wall_clock_second();
/// let backend = MemoryBackend::with_clock(clock.clone());
/// let rules = RuleSet::new([Rule::token_bucket(2, 1, Period::SECOND)])?;
/// let check = Operation::Check { cost: 1 };
///
/// assert!(backend.execute_now("k", &rules, check)?.allowed());
/// assert!(backend.execute_now("k", &rules, check)?.allowed());
/// let denied = backend.execute_now("k", &rules, check)?;
/// assert!(!denied.allowed());
/// assert_eq!(denied.retry_after(), Duration::from_secs(1));
///
/// clock.advance(Duration::from_millis(500));
/// assert!(!backend.execute_now("k", &rules, check)?.allowed()); // half a token
/// clock.advance(Duration::from_millis(500));
/// assert!(backend.execute_now("k", &rules, check)?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MemoryBackend<C: Clock = SystemClock> {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    hasher: RandomState,
    clock: C,
    /// When the next sweep is due (microseconds since the epoch); `i64::MAX` while one runs.
    next_sweep: AtomicI64,
    max_keys: usize,
    /// The `backend` label of [`EVICTIONS_METRIC`].
    name: &'static str,
    evictions: AtomicU64,
    /// Evictions not yet logged, and when the last log line was written.
    unlogged_evictions: AtomicU64,
    last_eviction_log: AtomicI64,
}

impl MemoryBackend<SystemClock> {
    /// A backend on the system clock, holding at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }

    /// A builder, to choose the clock, the cap on keys and the metrics name.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        MemoryBackendBuilder { clock: SystemClock::new(), max_keys: DEFAULT_MAX_KEYS, name: "memory" }
    }
}

/// A [`MemoryBackend`] being configured: see [`MemoryBackend::builder`].
#[derive(Debug, Clone)]
pub struct MemoryBackendBuilder<C: Clock> {
    clock: C,
    max_keys: usize,
    name: &'static str,
}

/// A [`MemoryBackendBuilder`] setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryConfigError {
    /// `max_keys` is below [`MIN_MAX_KEYS`].
    #[error("max_keys = {max_keys} is below {MIN_MAX_KEYS}, the most keys one batch may name")]
    MaxKeysTooSmall {
        /// The value given.
        max_keys: usize,
    },
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// The clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<D: Clock>(self, clock: D) -> MemoryBackendBuilder<D> {
        MemoryBackendBuilder { clock, max_keys: self.max_keys, name: self.name }
    }

    /// Most keys held at once (default [`DEFAULT_MAX_KEYS`], at least [`MIN_MAX_KEYS`]). A new
    /// key past the cap evicts the held key whose state expires soonest, as it loses the
    /// least: a key about to be forgotten anyway. The keys are spread over lock-striped shards
    /// by a hash with a random seed, each shard holding its share of the cap, so the evicted
    /// key is the soonest-expiring one of the new key's shard (of the whole backend when
    /// `max_keys` is below 128, with one shard).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The `backend` label of the [`EVICTIONS_METRIC`] counter (default `memory`).
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The backend, or why not.
    pub fn build(self) -> Result<MemoryBackend<C>, MemoryConfigError> {
        if self.max_keys < MIN_MAX_KEYS {
            return Err(MemoryConfigError::MaxKeysTooSmall { max_keys: self.max_keys });
        }
        // As many shards as dashmap would use (four per core, a power of two), but no more
        // than leaves each shard room for a whole batch.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let room = self.max_keys / MIN_MAX_KEYS;
        let shards = (cores * 4).next_power_of_two().min(1 << room.ilog2());
        let (share, rest) = (self.max_keys / shards, self.max_keys % shards);
        let hasher = RandomState::default();
        Ok(MemoryBackend {
            shards: (0..shards)
                .map(|i| CachePadded::new(Mutex::new(Shard::new(share + usize::from(i < rest), &hasher))))
                .collect(),
            hasher,
            clock: self.clock,
            next_sweep: AtomicI64::new(i64::MIN),
            max_keys: self.max_keys,
            name: self.name,
            evictions: AtomicU64::new(0),
            unlogged_evictions: AtomicU64::new(0),
            last_eviction_log: AtomicI64::new(i64::MIN),
        })
    }
}

impl Default for MemoryBackend<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

/// A shard's keys and their entries: a hash table probed with the hash that chose the shard
/// (the backend's), so a decision hashes its key once.
#[derive(Debug)]
struct Keys {
    table: HashTable<(Arc<str>, Entry)>,
    /// The backend's, to place keys again when the table grows.
    hasher: RandomState,
}

impl Keys {
    /// A key's hash: the one the backend chose its shard by.
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn get(&self, hash: u64, key: &str) -> Option<&(Arc<str>, Entry)> {
        self.table.find(hash, |(name, _)| same_key(name, key))
    }

    #[inline(always)] // on every decision's path: a call there costs more than the probe
    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.table.find_mut(hash, |(name, _)| same_key(name, key)).map(|(_, entry)| entry)
    }

    fn contains(&self, hash: u64, key: &str) -> bool {
        self.get(hash, key).is_some()
    }

    /// Adds `key`, which is not held, with no state yet.
    fn insert(&mut self, hash: u64, key: &str) -> &mut Entry {
        let hasher = &self.hasher;
        let slot = self
            .table
            .insert_unique(hash, (key.into(), Entry::default()), |(name, _)| hasher.hash_one(&**name));
        &mut slot.into_mut().1
    }

    fn remove(&mut self, hash: u64, key: &str) {
        if let Ok(found) = self.table.find_entry(hash, |(name, _)| same_key(name, key)) {
            found.remove();
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// `a == b`. Keys of 8 to 16 bytes (most callers': `user:1234`, an IP address) are compared as
/// two overlapping words, without the call to `memcmp` that `==` makes, which costs more than
/// the comparison on the path of every decision.
#[inline(always)]
fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if (8..=16).contains(&n) {
        let word = |s: &[u8], at: usize| {
            s.get(at..at + 8).map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
        };
        return word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8);
    }
    a == b
}

/// A share of the keys, under one lock.
#[derive(Debug)]
struct Shard {
    map: Keys,
    /// Records `(expiry, key)`, soonest first, to find the key to evict in logarithmic time.
    /// Kept lazily: a record is added when a key is created or its expiry moves earlier (rare:
    /// a refund, a release, a reset), not when it moves later (most checks), so every key has
    /// a record at or below its expiry, the one at its `floor`; others are stale and skipped.
    /// Rebuilt from `map` when stale records outnumber the keys (checked on every record added
    /// and after every sweep), so it holds at most about twice as many records as keys.
    by_expiry: BinaryHeap<Reverse<(i64, Arc<str>)>>,
    /// Most keys this shard holds.
    cap: usize,
}

impl Shard {
    fn new(cap: usize, hasher: &RandomState) -> Self {
        let map = Keys { table: HashTable::new(), hasher: hasher.clone() };
        Shard { map, by_expiry: BinaryHeap::new(), cap }
    }

    /// Records `key`'s expiry if it moved below its last record (`hash` is the key's).
    fn index(&mut self, hash: u64, key: &str) {
        let Some((name, entry)) = self.map.get(hash, key) else { return };
        if entry.expires_at >= entry.floor {
            return;
        }
        let record = Reverse((entry.expires_at, name.clone()));
        if let Some(entry) = self.map.get_mut(hash, key) {
            entry.floor = entry.expires_at;
        }
        self.by_expiry.push(record);
        self.compact_index();
    }

    /// Rebuilds the index once stale records (of keys gone, or moved) outnumber the keys.
    fn compact_index(&mut self) {
        if self.by_expiry.len() > 2 * self.map.len() + MIN_MAX_KEYS {
            self.rebuild_index();
        }
    }

    /// One record per key, at its expiry: linear time, paid for by the records added since
    /// the last rebuild (more than the keys held).
    fn rebuild_index(&mut self) {
        let records: Vec<_> = self
            .map
            .table
            .iter_mut()
            .map(|(name, entry)| {
                entry.floor = entry.expires_at;
                Reverse((entry.expires_at, name.clone()))
            })
            .collect();
        self.by_expiry = BinaryHeap::from(records);
    }

    /// Evicts the soonest-expiring keys, except `protected` ones, until `incoming` new keys
    /// fit under the cap; returns how many went. Each record is looked at once (a stale one is
    /// dropped or moved up to its key's expiry), so the cost is amortised over the records
    /// added.
    fn make_room(&mut self, incoming: usize, protected: impl Fn(&str) -> bool) -> u64 {
        let mut evicted = 0;
        let mut kept = SmallVec::<[Reverse<(i64, Arc<str>)>; 8]>::new();
        while self.map.len() + incoming > self.cap {
            // Every key has a record, and the cap leaves room for a batch's protected keys.
            let Some(Reverse((at, name))) = self.by_expiry.pop() else { break };
            let hash = self.map.hash(&name);
            let Some(entry) = self.map.get_mut(hash, &name) else { continue };
            if at != entry.floor {
                continue; // an older record of a key that has a lower one
            }
            if protected(&name) {
                kept.push(Reverse((at, name)));
            } else if entry.expires_at > at {
                // The key's state lives longer now: its record moves there.
                entry.floor = entry.expires_at;
                self.by_expiry.push(Reverse((entry.expires_at, name)));
            } else {
                self.map.remove(hash, &name);
                evicted += 1;
            }
        }
        self.by_expiry.extend(kept);
        evicted
    }
}

/// The states of one operation's rules among a key's held states: rule `i` is
/// `held[index[i]]`.
struct Found<'a> {
    held: &'a mut [HeldState],
    index: &'a [usize; MAX_RULES],
}

impl States for Found<'_> {
    fn get(&mut self, rule: usize) -> &mut State {
        &mut self.held[self.index[rule]].state
    }

    fn expires(&mut self, rule: usize, at: Option<i64>) {
        self.held[self.index[rule]].expires_at = at.unwrap_or(i64::MIN);
    }
}

/// The states of one operation's rules when a key holds them in the rule set's order: rule `i`
/// is `held[i]`. Keeps the latest of their expiries, the key's when it holds no other state.
struct InOrder<'a> {
    held: &'a mut [HeldState],
    latest: i64,
}

impl States for InOrder<'_> {
    fn get(&mut self, rule: usize) -> &mut State {
        &mut self.held[rule].state
    }

    fn expires(&mut self, rule: usize, at: Option<i64>) {
        let at = at.unwrap_or(i64::MIN);
        self.held[rule].expires_at = at;
        self.latest = self.latest.max(at);
    }
}

/// A batch group's states, moved out of the map while the group runs.
struct Taken(SmallVec<[State; 8]>);

impl States for Taken {
    fn get(&mut self, index: usize) -> &mut State {
        &mut self.0[index]
    }
}

impl Entry {
    /// Finds (or creates) each rule's state.
    fn find(&mut self, rules: &RuleSet) -> [usize; MAX_RULES] {
        let mut index = [0; MAX_RULES];
        for (i, rule) in rules.compiled().iter().enumerate() {
            index[i] = self.find_one(rule, i);
        }
        index
    }

    /// Finds (or creates) one rule's state; `hint` is where it is likely to be (a key checked
    /// under one rule set holds its rules' states in the set's order).
    #[inline(always)] // the hint's hit, on every decision's path
    fn find_one(&mut self, rule: &CompiledRule, hint: usize) -> usize {
        // The same rule set's signatures are the same allocation: compare pointers first.
        if self.states.get(hint).is_some_and(|s| Arc::ptr_eq(&s.signature, &rule.signature)) {
            return hint;
        }
        self.find_or_add(rule)
    }

    /// [`find_one`](Self::find_one) past its hint: out of line, as a key's first check is.
    #[inline(never)]
    fn find_or_add(&mut self, rule: &CompiledRule) -> usize {
        let same =
            |s: &HeldState| Arc::ptr_eq(&s.signature, &rule.signature) || s.signature == rule.signature;
        match self.states.iter().position(same) {
            Some(at) => at,
            None => {
                self.laid_out_for = 0;
                self.states.push(HeldState {
                    signature: rule.signature.clone(),
                    state: rule.algorithm.new_state(),
                    expires_at: i64::MIN,
                });
                self.states.len() - 1
            }
        }
    }

    /// Runs a lone operation of several rules on this key's states ([`engine::run`]), and
    /// records when the entry expires.
    #[inline(never)] // out of the way of the one-rule path, whose code it would spread
    fn run(&mut self, rules: &RuleSet, op: Operation<'_>, now: i64, decision: &mut Decision) {
        let compiled = rules.compiled();
        // A key checked under one rule set holds its states in the set's order (the commonest
        // case): they are reached by position, without finding each and indexing through.
        // Known so from the last run (one comparison), or found so by comparing each.
        let states = &mut self.states[..];
        let each_in_place = |states: &[HeldState]| {
            compiled.iter().zip(states).all(|(rule, s)| Arc::ptr_eq(&s.signature, &rule.signature))
        };
        let laid_out = self.laid_out_for == rules.id();
        debug_assert!(!laid_out || (states.len() == compiled.len() && each_in_place(states)));
        let in_order = laid_out || (states.len() >= compiled.len() && each_in_place(states));
        if in_order {
            let alone = states.len() == compiled.len();
            let mut held = InOrder { held: states, latest: i64::MIN };
            engine::run(rules, op, now, &mut held, decision);
            // A key holding only this set's states (the commonest) expires with the latest.
            if alone {
                self.laid_out_for = rules.id();
                self.expires_at = held.latest;
                return;
            }
        } else {
            let index = self.find(rules);
            engine::run(rules, op, now, &mut Found { held: &mut self.states, index: &index }, decision);
        }
        self.refresh_expiry();
    }

    /// Runs a set of one rule on its state, `states[at]` (`run` answers when the state expires
    /// after, as [`engine::run_one`] does), and records the new expiry. (Several rules' are
    /// recorded by [`engine::run`], through [`InOrder`] or [`Found`].) The states are reached
    /// once: each access to a `SmallVec` asks whether it has spilled.
    #[inline(always)]
    fn run_one(&mut self, at: usize, run: impl FnOnce(&mut State) -> Option<i64>) {
        let states = &mut self.states[..];
        let alone = states.len() == 1;
        let Some(held) = states.get_mut(at) else { return };
        let expires_at = run(&mut held.state).unwrap_or(i64::MIN);
        held.expires_at = expires_at;
        // A key of one state (the commonest) expires with it: no search for the latest.
        if alone {
            self.expires_at = expires_at;
        } else {
            self.refresh_expiry();
        }
    }

    /// The entry can go when its last state has expired.
    fn refresh_expiry(&mut self) {
        self.expires_at = self.states.iter().map(|s| s.expires_at).max().unwrap_or(i64::MIN);
    }

    /// Drops expired states; false when none is left.
    fn prune(&mut self, now: i64) -> bool {
        let held = self.states.len();
        self.states.retain(|s| s.expires_at > now);
        if self.states.len() != held {
            self.laid_out_for = 0;
        }
        !self.states.is_empty()
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// A backend on `clock`, holding at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn with_clock(clock: C) -> Self {
        MemoryBackend::builder()
            .clock(clock)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// The key's hash, and the shard holding it.
    fn place(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, self.shard_of(hash))
    }

    /// The shard of a key of this hash. The table in the shard places keys by the hash's low
    /// bits and tells them apart by its top seven, so the shard is chosen by bits in between
    /// (a shard count is a power of two), which leaves the table's as spread as they were.
    fn shard_of(&self, hash: u64) -> usize {
        ((hash >> 32) as usize) & (self.shards.len() - 1)
    }

    /// Locks a shard. parking_lot's lock rather than std's: a decision takes one, and std's
    /// asks on taking and on leaving it whether the thread is panicking (to poison it), which
    /// costs more than the lock itself on this path. A panic while a lock was held cannot have
    /// left a state half-written (states are replaced whole), so poisoning would guard nothing.
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock()
    }

    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs `op` synchronously: the memory backend never waits, so callers outside async code
    /// can use this instead of [`Backend::execute`].
    pub fn execute_now(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        // The decision is built inside the result returned, every path returning that one
        // value: it is too large to move cheaply (a move into an `Ok` is a `memcpy` call).
        let mut result = Ok(Decision::building());
        if let Err(error) = op.validate(key, rules) {
            result = Err(error);
            return result;
        }
        let Ok(decision) = &mut result else { return result };
        let now = self.now();
        let mut evicted = 0;
        {
            let (hash, at) = self.place(key);
            let mut guard = self.lock(at);
            let shard = &mut *guard;
            // One probe of the map for a key held (the common case); a new key pays a second.
            let entry = match shard.map.get_mut(hash, key) {
                Some(entry) => entry,
                None => {
                    evicted = shard.make_room(1, |_| false);
                    shard.map.insert(hash, key)
                }
            };
            match rules.compiled() {
                // One rule (the commonest set): its state found and settled without an index.
                [rule] => {
                    let at = entry.find_one(rule, 0);
                    entry.run_one(at, |state| engine::run_one(rules, op, now, state, decision));
                }
                _ => entry.run(rules, op, now, decision),
            }
            if entry.expires_at < entry.floor {
                shard.index(hash, key);
            }
        }
        self.evicted(evicted, now);
        self.maybe_sweep(now);
        result
    }

    /// Forgets `key`'s state under `rules`, synchronously.
    pub fn reset_now(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        let (hash, at) = self.place(key);
        let mut shard = self.lock(at);
        if let Some(entry) = shard.map.get_mut(hash, key) {
            entry.states.retain(|held| !rules.signatures().any(|s| s == &*held.signature));
            entry.laid_out_for = 0;
            entry.refresh_expiry();
            if entry.states.is_empty() {
                shard.map.remove(hash, key);
            } else {
                shard.index(hash, key);
            }
        }
        Ok(())
    }

    /// Checks a batch synchronously: see [`Part`] and [`Backend::check_batch`]. All the batch's
    /// keys are locked for the whole batch, so it is atomic.
    pub fn check_batch_now(&self, parts: &[Part<'_>]) -> Result<Vec<Decision>, Error> {
        self.check_planned_now(&BatchPlan::new(parts)?)
    }

    /// [`check_batch_now`](Self::check_batch_now) of a batch already planned.
    pub fn check_planned_now(&self, plan: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        let parts = plan.parts();
        // A batch of one part is a lone operation: the same decision without the batch's
        // bookkeeping (an Envoy request of one descriptor comes this way).
        if let [part] = parts {
            return Ok(vec![self.execute_now(part.key, part.rules, part.op)?]);
        }
        let now = self.now();
        let places: SmallVec<[(u64, usize); 8]> = parts.iter().map(|p| self.place(p.key)).collect();
        let mut shard_ids: SmallVec<[usize; 8]> = places.iter().map(|&(_, shard)| shard).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        // Ascending order: two batches never wait on each other in a cycle.
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 8]> =
            shard_ids.iter().map(|&i| self.lock(i)).collect();
        // Room for the batch's new keys first, so that no key of the batch is evicted while its
        // state is out of the map (and the cap holds throughout).
        let guard_of = |shard: usize| shard_ids.binary_search(&shard).unwrap_or(0);
        let mut keys: SmallVec<[(usize, &str, u64); 8]> =
            parts.iter().zip(&places).map(|(p, &(hash, shard))| (guard_of(shard), p.key, hash)).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut evicted = 0;
        for (guard, shard) in guards.iter_mut().enumerate() {
            let mine = || keys.iter().filter(move |(g, _, _)| *g == guard);
            let incoming = mine().filter(|&&(_, key, hash)| !shard.map.contains(hash, key)).count();
            if incoming > 0 {
                evicted += shard.make_room(incoming, |name| mine().any(|&(_, key, _)| key == name));
            }
        }
        let mut decisions: Vec<Option<Decision>> = vec![None; parts.len()];
        for (members, group) in plan.planned() {
            // The group's states, moved out of their places while it runs.
            let mut taken = Taken(SmallVec::new());
            let mut at: SmallVec<[(usize, u64); 8]> = SmallVec::new();
            for planned in group.states() {
                let KeyRule { key, rule } = planned.place;
                let (hash, shard) = self.place(key);
                let guard = guard_of(shard);
                let shard = &mut guards[guard];
                if !shard.map.contains(hash, key) {
                    shard.map.insert(hash, key);
                }
                let Some(entry) = shard.map.get_mut(hash, key) else { unreachable!("inserted above") };
                let found = entry.find_one(rule, 0);
                let state = rule.algorithm.new_state();
                taken.0.push(std::mem::replace(&mut entry.states[found].state, state));
                at.push((guard, hash));
            }
            let rules_of = |p: usize| parts[members[p]].rules;
            engine::run_group(now, group, rules_of, &mut taken, |p, d| decisions[members[p]] = Some(d));
            for ((planned, &(guard, hash)), mut state) in group.states().iter().zip(&at).zip(taken.0) {
                let KeyRule { key, rule } = planned.place;
                let shard = &mut guards[guard];
                let Some(entry) = shard.map.get_mut(hash, key) else { continue };
                let found = entry.find_one(rule, 0);
                entry.states[found].expires_at = rule.algorithm.expires_at(&mut state).unwrap_or(i64::MIN);
                entry.states[found].state = state;
                entry.refresh_expiry();
                shard.index(hash, key);
            }
        }
        drop(guards);
        self.evicted(evicted, now);
        self.maybe_sweep(now);
        Ok(decisions
            .into_iter()
            .map(|d| d.unwrap_or_else(|| unreachable!("every part is in a group")))
            .collect())
    }

    /// Number of keys holding state (expired state included until swept).
    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).map.len()).sum()
    }

    /// Most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Keys evicted so far to stay within [`max_keys`](Self::max_keys).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Counts `evicted` keys in the metric, and logs them at most once per
    /// [`EVICTION_LOG_INTERVAL`].
    fn evicted(&self, evicted: u64, now: i64) {
        if evicted == 0 {
            return;
        }
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
        metrics::counter!(EVICTIONS_METRIC, "backend" => self.name).increment(evicted);
        self.unlogged_evictions.fetch_add(evicted, Ordering::Relaxed);
        let last = self.last_eviction_log.load(Ordering::Relaxed);
        if now >= last.saturating_add(EVICTION_LOG_INTERVAL)
            && self.last_eviction_log.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let count = self.unlogged_evictions.swap(0, Ordering::Relaxed);
            tracing::warn!(
                backend = self.name,
                evicted = count,
                max_keys = self.max_keys,
                "the memory backend is full: keys whose state expires soonest were forgotten early \
                 (raise [memory] max_keys, or use Redis)"
            );
        }
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops all expired state now; returns the number of keys left.
    pub fn sweep(&self) -> usize {
        let now = self.now();
        (0..self.shards.len())
            .map(|i| {
                let mut shard = self.lock(i);
                shard.map.table.retain(|(_, entry)| entry.prune(now));
                shard.compact_index();
                shard.map.len()
            })
            .sum()
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now().as_micros()).unwrap_or(i64::MAX)
    }

    fn maybe_sweep(&self, now: i64) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        // One caller claims the sweep; the others carry on.
        if now >= due
            && self.next_sweep.compare_exchange(due, i64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let left = self.sweep();
            let pause = MIN_MICROS_BETWEEN_SWEEPS.max(i64::try_from(left).unwrap_or(i64::MAX));
            self.next_sweep.store(now.saturating_add(pause), Ordering::Release);
        }
    }
}

#[async_trait]
impl<C: Clock> Backend for MemoryBackend<C> {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        self.execute_now(key, rules, op)
    }

    fn try_execute_now(
        &self,
        key: &str,
        rules: &RuleSet,
        op: Operation<'_>,
    ) -> Option<Result<Decision, Error>> {
        Some(self.execute_now(key, rules, op))
    }

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.reset_now(key, rules)
    }

    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        self.check_planned_now(batch)
    }

    fn try_check_planned_now(&self, batch: &BatchPlan<'_>) -> Option<Result<Vec<Decision>, Error>> {
        Some(self.check_planned_now(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::same_key;

    proptest::proptest! {
        /// The word-wise comparison answers as `==` does, at every length, for keys that differ
        /// in one byte anywhere (the words overlap for lengths 9 to 15) or not at all.
        #[test]
        fn keys_compare_as_equality_does(
            key in proptest::collection::vec(proptest::num::u8::ANY, 0..24),
            at in proptest::num::usize::ANY,
            flip in 1u8..,
            shorter in proptest::bool::ANY,
        ) {
            let a: String = key.iter().map(|&b| char::from(b'a' + b % 26)).collect();
            let mut b = a.clone().into_bytes();
            if !b.is_empty() {
                let at = at % b.len();
                b[at] = b'a' + (b[at] - b'a' + flip % 26) % 26;
            }
            if shorter {
                b.pop();
            }
            let b = String::from_utf8(b).expect("letters");
            proptest::prop_assert_eq!(same_key(&a, &b), a == b);
            proptest::prop_assert!(same_key(&a, &a));
        }
    }
}
