//! [`MemoryBackend`]: rule states in process memory, the embedded default.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use dashmap::DashMap;
use smallvec::SmallVec;

use crate::algorithm::{self, State, States};
use crate::limits::MAX_RULES;
use crate::operation::validate_key;
use crate::{Backend, Clock, Decision, Error, Operation, RuleSet, SystemClock};

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

/// Rule states in process memory: concurrent (sharded by [`DashMap`]), with an injectable
/// clock, and bounded under key churn: state that has expired (become the same as no state) is
/// dropped by a periodic sweep, so a stream of one-off keys does not grow memory forever.
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

impl Entry {
    /// Finds (or creates) each rule's slot.
    fn find(&mut self, rules: &RuleSet) -> [usize; MAX_RULES] {
        let mut index = [0; MAX_RULES];
        for (i, rule) in rules.compiled().iter().enumerate() {
            // The same rule set's signatures are the same allocation: compare pointers first.
            let same = |s: &Slot| Arc::ptr_eq(&s.signature, &rule.signature) || s.signature == rule.signature;
            let at = match self.slots.iter().position(same) {
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
            index[i] = at;
        }
        index
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
        MemoryBackend { map: DashMap::new(), clock, next_sweep: AtomicI64::new(i64::MIN) }
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
            let mut entry = match self.map.get_mut(key) {
                Some(entry) => entry,
                None => self.map.entry(key.into()).or_default(),
            };
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
        self.map.remove_if_mut(key, |_, entry| {
            entry.slots.retain(|slot| !rules.signatures().any(|s| s == &*slot.signature));
            entry.refresh_expiry();
            entry.slots.is_empty()
        });
        Ok(())
    }

    /// Number of keys holding state (expired state included until swept).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops all expired state now; returns the number of keys left.
    pub fn sweep(&self) -> usize {
        let now = self.now();
        self.map.retain(|_, entry| entry.prune(now));
        self.map.len()
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
}
