//! [`MemoryBackend`]: rule states in process memory, the embedded default.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use dashmap::DashMap;

use crate::algorithm::{self, State, States};
use crate::limits::MAX_RULES;
use crate::operation::validate_key;
use crate::{Backend, Clock, Decision, Error, Operation, RuleSet, SystemClock};

/// Sweeps for expired keys run after at least this many operations, and after at least as many
/// operations as there were keys at the last sweep, so sweeping costs O(1) per operation.
const MIN_OPS_BETWEEN_SWEEPS: u64 = 4096;

/// One rule's state for a key.
#[derive(Debug)]
struct Slot {
    signature: Arc<str>,
    state: State,
    /// When `state` becomes the same as no state.
    expires_at: i64,
}

/// A key's states under every rule it has been checked with.
#[derive(Debug, Default)]
struct Entry {
    slots: Vec<Slot>,
    /// The latest of the slots' expiries: the entry can go then.
    expires_at: i64,
}

/// Rule states in process memory: concurrent (sharded by [`DashMap`]), with an injectable
/// clock, and bounded under key churn: a key's state is dropped once it has expired, on its next
/// use or by a periodic sweep, so a stream of one-off keys does not grow memory forever.
///
/// All the rules of one operation are decided under one shard lock, so a check is atomic
/// across its rules.
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
    map: DashMap<Box<str>, Entry>,
    clock: C,
    operations: AtomicU64,
    next_sweep: AtomicU64,
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

/// The states of one operation's rules, found (or created) among a key's slots.
struct Found<'a> {
    slots: &'a mut [Slot],
    index: [usize; MAX_RULES],
}

impl States for Found<'_> {
    fn get(&mut self, rule: usize) -> &mut State {
        &mut self.slots[self.index[rule]].state
    }
}

impl Entry {
    fn find(&mut self, rules: &RuleSet) -> Found<'_> {
        let mut index = [0; MAX_RULES];
        for (i, rule) in rules.compiled().iter().enumerate() {
            index[i] = match self.slots.iter().position(|s| s.signature == rule.signature) {
                Some(at) => at,
                None => {
                    self.slots.push(Slot {
                        signature: rule.signature.clone(),
                        state: rule.algo.new_state(),
                        expires_at: i64::MIN,
                    });
                    self.slots.len() - 1
                }
            };
        }
        Found { slots: &mut self.slots, index }
    }

    /// Records the new expiry of the rules' slots and drops every slot that has expired.
    fn settle(&mut self, rules: &RuleSet, now: i64) {
        for rule in rules.compiled() {
            if let Some(slot) = self.slots.iter_mut().find(|s| s.signature == rule.signature) {
                slot.expires_at = rule.algo.expires_at(&mut slot.state).unwrap_or(i64::MIN);
            }
        }
        self.slots.retain(|s| s.expires_at > now);
        self.expires_at = self.slots.iter().map(|s| s.expires_at).max().unwrap_or(i64::MIN);
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// A backend on `clock`.
    pub fn with_clock(clock: C) -> Self {
        MemoryBackend {
            map: DashMap::new(),
            clock,
            operations: AtomicU64::new(0),
            next_sweep: AtomicU64::new(MIN_OPS_BETWEEN_SWEEPS),
        }
    }

    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs `op` synchronously: the memory backend never waits, so callers outside async code
    /// can use this instead of [`Backend::execute`].
    pub fn execute_now(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        op.validate(key, rules)?;
        let now = i64::try_from(self.clock.now().as_micros()).unwrap_or(i64::MAX);
        let (decision, emptied) = {
            let mut entry = match self.map.get_mut(key) {
                Some(entry) => entry,
                None => self.map.entry(key.into()).or_default(),
            };
            let decision = algorithm::run(rules, now, &op, &mut entry.find(rules));
            entry.settle(rules, now);
            (decision, entry.slots.is_empty())
        };
        if emptied {
            self.map.remove_if(key, |_, entry| entry.slots.is_empty());
        }
        self.maybe_sweep(now);
        Ok(decision)
    }

    /// Forgets `key`'s state under `rules`, synchronously.
    pub fn reset_now(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        let now = i64::try_from(self.clock.now().as_micros()).unwrap_or(i64::MAX);
        if let Some(mut entry) = self.map.get_mut(key) {
            entry.slots.retain(|slot| !rules.signatures().any(|s| s == &*slot.signature));
            entry.settle(rules, now);
        }
        self.map.remove_if(key, |_, entry| entry.slots.is_empty());
        Ok(())
    }

    /// Number of keys holding state (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops every key whose state has expired; returns the number of keys left.
    pub fn sweep(&self) -> usize {
        let now = i64::try_from(self.clock.now().as_micros()).unwrap_or(i64::MAX);
        self.map.retain(|_, entry| entry.expires_at > now);
        self.map.len()
    }

    fn maybe_sweep(&self, now: i64) {
        let done = self.operations.fetch_add(1, Ordering::Relaxed) + 1;
        let due = self.next_sweep.load(Ordering::Relaxed);
        // One caller claims the sweep; the others carry on.
        if done >= due
            && self.next_sweep.compare_exchange(due, u64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            self.map.retain(|_, entry| entry.expires_at > now);
            let left = self.map.len() as u64;
            self.next_sweep.store(done + left.max(MIN_OPS_BETWEEN_SWEEPS), Ordering::Release);
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
}
