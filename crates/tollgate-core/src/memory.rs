//! [`MemoryBackend`]: rule states in process memory, the embedded default.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use crossbeam_utils::CachePadded;
use smallvec::SmallVec;

use crate::algorithm::{self, Member, State, States};
use crate::limits::MAX_RULES;
use crate::operation::validate_key;
use crate::{Backend, Clock, Decision, Error, Operation, Part, RuleSet, SystemClock, validate_batch};

/// Sweeps for expired state run at most once a second, and at most once per microsecond per key
/// held (10 s apart with 10 million keys), so their cost stays a small share of one core while
/// expired state lingers only briefly. Deciding whether one is due reads one shared atomic.
const MIN_MICROS_BETWEEN_SWEEPS: i64 = 1_000_000;

/// One rule's state for a key.
#[derive(Debug)]
struct Slot {
    signature: Arc<str>,
    state: State,
    /// When `state` becomes the same as no state.
    expires_at: i64,
}

/// A key's states under every rule it has been checked with (usually one or two, kept inline
/// so a lookup touches one allocation less).
#[derive(Debug, Default)]
struct Entry {
    slots: SmallVec<[Slot; 2]>,
    /// The latest of the slots' expiries: the entry can go then.
    expires_at: i64,
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
}

impl MemoryBackend<SystemClock> {
    /// A backend on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }
}

impl Default for MemoryBackend<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

type Shard = HashMap<Box<str>, Entry>;

/// The states of one operation's rules among a key's slots: rule `i` is `slots[index[i]]`.
struct Found<'a> {
    slots: &'a mut [Slot],
    index: &'a [usize; MAX_RULES],
}

impl States for Found<'_> {
    fn get(&mut self, rule: usize) -> &mut State {
        &mut self.slots[self.index[rule]].state
    }
}

/// A batch group's states, moved out of their slots while the group runs.
struct Taken(SmallVec<[State; 8]>);

impl States for Taken {
    fn get(&mut self, index: usize) -> &mut State {
        &mut self.0[index]
    }
}

impl Entry {
    /// Finds (or creates) each rule's slot.
    fn find(&mut self, rules: &RuleSet) -> [usize; MAX_RULES] {
        let mut index = [0; MAX_RULES];
        for (i, rule) in rules.compiled().iter().enumerate() {
            index[i] = self.find_one(rule);
        }
        index
    }

    /// Finds (or creates) one rule's slot.
    fn find_one(&mut self, rule: &crate::ruleset::CompiledRule) -> usize {
        // The same rule set's signatures are the same allocation: compare pointers first.
        let same = |s: &Slot| Arc::ptr_eq(&s.signature, &rule.signature) || s.signature == rule.signature;
        match self.slots.iter().position(same) {
            Some(at) => at,
            None => {
                self.slots.push(Slot {
                    signature: rule.signature.clone(),
                    state: rule.algo.new_state(),
                    expires_at: i64::MIN,
                });
                self.slots.len() - 1
            }
        }
    }

    /// Records the new expiry of the rules' slots.
    fn settle(&mut self, rules: &RuleSet, index: &[usize; MAX_RULES]) {
        for (i, rule) in rules.compiled().iter().enumerate() {
            let slot = &mut self.slots[index[i]];
            slot.expires_at = rule.algo.expires_at(&mut slot.state).unwrap_or(i64::MIN);
        }
        self.refresh_expiry();
    }

    /// The entry can go when its last slot has expired.
    fn refresh_expiry(&mut self) {
        self.expires_at = self.slots.iter().map(|s| s.expires_at).max().unwrap_or(i64::MIN);
    }

    /// Drops expired slots; false when none is left.
    fn prune(&mut self, now: i64) -> bool {
        self.slots.retain(|s| s.expires_at > now);
        !self.slots.is_empty()
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// A backend on `clock`.
    pub fn with_clock(clock: C) -> Self {
        // As many shards as dashmap would use: four per core, a power of two.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let shards = (cores * 4).next_power_of_two();
        MemoryBackend {
            shards: (0..shards).map(|_| CachePadded::new(Mutex::new(Shard::default()))).collect(),
            hasher: RandomState::new(),
            clock,
            next_sweep: AtomicI64::new(i64::MIN),
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        // Shard count is a power of two: mask the hash.
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    /// Locks a shard. A panic while one was held cannot have left a state half-written (states
    /// are replaced whole), so a poisoned lock is used as is.
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs `op` synchronously: the memory backend never waits, so callers outside async code
    /// can use this instead of [`Backend::execute`].
    pub fn execute_now(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        op.validate(key, rules)?;
        let now = self.now();
        let decision = {
            let mut shard = self.lock(self.shard_of(key));
            if !shard.contains_key(key) {
                shard.insert(key.into(), Entry::default());
            }
            let Some(entry) = shard.get_mut(key) else { unreachable!("inserted above") };
            let index = entry.find(rules);
            let decision =
                algorithm::run(rules, now, &op, &mut Found { slots: &mut entry.slots, index: &index });
            entry.settle(rules, &index);
            decision
        };
        self.maybe_sweep(now);
        Ok(decision)
    }

    /// Forgets `key`'s state under `rules`, synchronously.
    pub fn reset_now(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        let mut shard = self.lock(self.shard_of(key));
        if let Some(entry) = shard.get_mut(key) {
            entry.slots.retain(|slot| !rules.signatures().any(|s| s == &*slot.signature));
            entry.refresh_expiry();
            if entry.slots.is_empty() {
                shard.remove(key);
            }
        }
        Ok(())
    }

    /// Checks a batch synchronously: see [`Part`] and [`Backend::check_batch`]. All the batch's
    /// keys are locked for the whole batch, so it is atomic.
    pub fn check_batch_now(&self, parts: &[Part<'_>]) -> Result<Vec<Decision>, Error> {
        validate_batch(parts)?;
        let now = self.now();
        let mut shard_ids: SmallVec<[usize; 8]> = parts.iter().map(|p| self.shard_of(p.key)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        // Ascending order: two batches never wait on each other in a cycle.
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 8]> =
            shard_ids.iter().map(|&i| self.lock(i)).collect();
        let mut decisions: Vec<Option<Decision>> = vec![None; parts.len()];
        for members in crate::groups(parts) {
            // The group's distinct states (key and rule), moved out of their slots while it runs.
            let mut places: SmallVec<[(usize, &str, &crate::ruleset::CompiledRule); 8]> = SmallVec::new();
            let mut positions: SmallVec<[SmallVec<[usize; 4]>; 4]> = SmallVec::new();
            for &p in &members {
                let part = &parts[p];
                let guard = shard_ids.binary_search(&self.shard_of(part.key)).unwrap_or(0);
                let at = part
                    .rules
                    .compiled()
                    .iter()
                    .map(|rule| {
                        let same = |(_, k, r): &(usize, &str, &crate::ruleset::CompiledRule)| {
                            *k == part.key && r.signature == rule.signature
                        };
                        places.iter().position(same).unwrap_or_else(|| {
                            places.push((guard, part.key, rule));
                            places.len() - 1
                        })
                    })
                    .collect();
                positions.push(at);
            }
            let mut taken = Taken(SmallVec::new());
            for &(guard, key, rule) in &places {
                let shard = &mut guards[guard];
                let entry = shard.entry(key.into()).or_default();
                let slot = entry.find_one(rule);
                taken.0.push(std::mem::replace(&mut entry.slots[slot].state, rule.algo.new_state()));
            }
            let group: SmallVec<[Member<'_>; 4]> = members
                .iter()
                .zip(&positions)
                .map(|(&p, at)| Member {
                    rules: parts[p].rules,
                    op: Operation::Check { cost: parts[p].cost },
                    states: at,
                })
                .collect();
            algorithm::run_group(now, &group, &mut taken, |m, d| decisions[members[m]] = Some(d));
            for (&(guard, key, rule), mut state) in places.iter().zip(taken.0) {
                let Some(entry) = guards[guard].get_mut(key) else { continue };
                let slot = entry.find_one(rule);
                entry.slots[slot].expires_at = rule.algo.expires_at(&mut state).unwrap_or(i64::MIN);
                entry.slots[slot].state = state;
                entry.refresh_expiry();
            }
        }
        drop(guards);
        self.maybe_sweep(now);
        Ok(decisions
            .into_iter()
            .map(|d| d.unwrap_or_else(|| unreachable!("every part is in a group")))
            .collect())
    }

    /// Number of keys holding state (expired state included until swept).
    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
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
                shard.retain(|_, entry| entry.prune(now));
                shard.len()
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

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.reset_now(key, rules)
    }

    async fn check_batch(&self, parts: &[Part<'_>]) -> Result<Vec<Decision>, Error> {
        self.check_batch_now(parts)
    }
}
