//! Quota reservations: a hot key answered in process from a block of units reserved from the
//! backend in advance, never admitting more than the limit.
//!
//! # How
//! A policy with [`Reserve`] on keeps, per key this instance sees hot, a *block*: units the
//! backend already counted (one `Check { cost: size }`, consuming exactly what `size` checks
//! of one unit would). A check whose cost the block holds is answered from it, with no backend
//! call; otherwise the limiter reserves a new block and answers from that. A refused
//! reservation is followed by the plain check of the request's own cost, so asking for a block
//! too large never loses an admission. Every admitted unit was counted by the backend before it
//! was admitted, which is why reservations never admit more than the rules allow (for the
//! rule kinds below).
//!
//! Batches ([`Limiter::check_each`](crate::Limiter::check_each), [`check_all`](crate::Limiter::check_all))
//! take the same steps per check: a check its block holds is answered from it, and a check due a
//! block reserves it as its part of the batch's one call (a refusal asks the check's own cost in
//! a second call). An all-or-nothing batch refused after all puts the units its checks took from
//! blocks back into them: into the same block, or one ending no later, else they are given back
//! as a block's leftovers are.
//!
//! # Which rules
//! - **Fixed window**: a block is valid until its window ends, the decision's `reset_after`
//!   counted from when the reservation was *sent* (the backend decided later, so the block
//!   never outlives the real window, whatever the clocks of the two hosts). Units of window W
//!   are only admitted in W: the limit holds per window exactly.
//! - **Token bucket and GCRA**: a block is valid for the time the rule takes to refill from
//!   empty to full (`capacity / rate`, `burst / rate`), at most [`RATE_VALIDITY`] (1 s): a
//!   unit held longer is older than anything the bucket itself remembers. Every admitted unit
//!   left the bucket no later than it was admitted, so from the bucket's start the admitted
//!   count never exceeds what the bucket allowed. Over an interval starting later, a unit taken
//!   before it and admitted within it can add to the bucket's own burst: at most the units held
//!   at the interval's start (with `auto`, at most a quarter of the capacity across instances).
//!   A validity of the time to refill the block alone would remove that, and with it any use
//!   of a block below overload, where each instance sees less than the whole rate.
//! - **Sliding log, sliding window counter, concurrency**: refused by [`Reserve::validate`]. A
//!   sliding bound counts a unit at the time it was taken, and a reserved unit admitted later
//!   would be outside the window the algorithm checked; the reply does not say when a sliding
//!   counter's clock window ends; concurrency units are held by leases, not spent.
//!
//! # Size
//! A key starts on the plain path (no table entry, no behaviour change). A *doorkeeper* (a
//! small count-min sketch indexed by a hash of policy and key, cleared every [`SWEEP_EVERY`]) lets
//! a key into the table once it has been checked [`HOT_HITS`] times within one sweep period,
//! with a block size of 2. The size doubles each time a block runs out while still valid (the
//! key is hot here), halves when a block expires with units left (it cooled) or a reservation is
//! refused (and is cut to what the backend reported left; the key then takes the plain path
//! until the refusal's retry-after, so that an overloaded key costs one call a check, not two), and the key goes back to the plain
//! path when it reaches 1. One reservation per key is in flight per instance at a time
//! ([`IN_FLIGHT`]): checks the block cannot answer meanwhile take the plain path. It is capped at `limit / (4 × instances seen)` (`limit` being the
//! smallest rule's limit, capacity or burst), and by `max` with `{ max = N }`: across instances,
//! at most a quarter of the limit is held idle. Instances are counted by a heartbeat to the
//! backend ([`Backend::heartbeat`](tollgate_core::Backend::heartbeat)), sent before a block
//! larger than 1 when the last one is older than [`HEARTBEAT_EVERY`].
//!
//! # Giving back
//! Unused units of an expired token-bucket or GCRA block are refunded (the next check of the
//! key, or the sweep, sends the refund). A fixed window's units are refunded only while its
//! window has more than [`REFUND_MARGIN`] left (on [`Limiter::shutdown`](crate::Limiter::shutdown)
//! or when an idle key is swept): a refund reaching the backend after the window turned would
//! add units to the next window. Units that cannot go back are counted as expired.
//!
//! # Memory and failure
//! The table holds at most [`MAX_KEYS`] keys (beyond, keys stay on the plain path); the sweep,
//! run by a check at most every [`SWEEP_EVERY`], drops expired and idle blocks. A block already
//! reserved keeps answering while the backend is down (those units were granted: not counted as
//! degraded); past it, the failure policy answers.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tollgate_core::{Clock, Decision, RuleKind, RuleSet, Timestamp};

use crate::policy::reservable;
use crate::{Policy, Reserve};

/// Most keys holding blocks at once, per limiter.
pub const MAX_KEYS: usize = 10_000;
/// Checks within one sweep period that make a key hot enough for a table entry.
pub const HOT_HITS: u32 = 8;
/// How often expired blocks are dropped and the doorkeeper is cleared.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Longest validity of a token-bucket or GCRA block.
pub const RATE_VALIDITY: Duration = Duration::from_secs(1);
/// A block unused this long is given back by the sweep.
pub const IDLE_AFTER: Duration = Duration::from_secs(5);
/// Least time between two heartbeats of one key.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// An instance counts as sharing a key for this long after its heartbeat.
pub const HEARTBEAT_WINDOW: Duration = Duration::from_secs(10);
/// While a reservation of a key is in flight (for at most this long: a check dropped while
/// waiting never clears its mark), other checks of the key on this instance that the block
/// cannot answer take the plain path instead of reserving too: concurrent checks finding a
/// block empty at once would otherwise each take a block, holding many times the cap idle.
pub const IN_FLIGHT: Duration = Duration::from_secs(1);
/// A fixed window's units are refunded only while the window has at least this long left.
pub const REFUND_MARGIN: Duration = Duration::from_secs(1);

const SHARDS: usize = 16;
/// The doorkeeper: two rows of this many 8-bit counters (128 KiB), a key being as hot as the
/// smaller of its two; with 100 000 keys of one check a second, about 3 % of them would pass
/// for hot (and cost a 2-unit block before cooling back).
const DOORKEEPER_SLOTS: usize = 65_536;

/// Counts of what reservations did, since the limiter started (also in the metrics), and the
/// units held now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReserveStats {
    /// Keys holding a table entry now.
    pub keys: usize,
    /// Units held now in blocks still valid: counted by the backend, not yet admitted.
    pub held: u64,
    /// Blocks reserved.
    pub blocks: u64,
    /// Reservations the backend refused.
    pub refused: u64,
    /// Units reserved in all blocks.
    pub reserved_units: u64,
    /// Decisions answered from a block.
    pub decisions: u64,
    /// Unused units given back to the backend.
    pub returned: u64,
    /// Unused units that expired (or could not be given back).
    pub expired: u64,
}

#[derive(Default)]
struct Counters {
    blocks: AtomicU64,
    refused: AtomicU64,
    reserved_units: AtomicU64,
    decisions: AtomicU64,
    returned: AtomicU64,
    expired: AtomicU64,
}

/// One key's block.
struct Entry {
    /// The rules the units were reserved under (a policy reloaded with other rules has another
    /// state in the backend: its entry is dropped).
    rules: RuleSet,
    /// The size of the next block.
    size: u64,
    /// Units left in the block.
    units: u64,
    /// The block answers until then.
    expires: Timestamp,
    /// The earliest end of a fixed window of the rules, if any: refunds must land before it.
    window_end: Option<Timestamp>,
    /// The reservation's reply and when it was sent, to report decisions from.
    reply: Option<(Decision, Timestamp)>,
    last_used: Timestamp,
    /// Instances sharing the key, from the last heartbeat (1 until then).
    instances: u64,
    heartbeat: Option<Timestamp>,
    /// When this instance's reservation in flight for the key was started, if one is.
    reserving: Option<Timestamp>,
    /// Until when the key takes the plain path after a refused reservation (the refusal's
    /// retry-after): reserving again sooner would be refused again, a second call per check.
    refused_until: Option<Timestamp>,
}

impl Entry {
    /// A key's entry before its first block: empty, expired at `now`.
    fn empty(rules: &RuleSet, size: u64, now: Timestamp, reserving: Option<Timestamp>) -> Self {
        Entry {
            rules: rules.clone(),
            size,
            units: 0,
            expires: now,
            window_end: None,
            reply: None,
            last_used: now,
            instances: 1,
            heartbeat: None,
            reserving,
            refused_until: None,
        }
    }
}

/// Units taken out of a block that ended, to give back (or count as expired).
#[derive(Debug)]
pub(crate) struct Leftover {
    pub(crate) policy: Arc<str>,
    pub(crate) key: Box<str>,
    pub(crate) rules: RuleSet,
    pub(crate) units: u64,
    /// Whether the backend can take them back.
    pub(crate) refundable: bool,
}

/// The block a decision was answered from, to put its units back if the decision is undone
/// (an all-or-nothing batch refused by another check).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    expires: Timestamp,
    window_end: Option<Timestamp>,
}

/// What a check does.
pub(crate) enum Step {
    /// Answered from the block.
    Served(Decision, Held),
    /// Reserve `size` units (more than the cost), then answer from them; send a heartbeat first
    /// when `heartbeat`.
    Reserve { size: u64, heartbeat: bool },
    /// Check the cost alone, as without reservations.
    Plain,
}

type Shard = HashMap<Arc<str>, HashMap<Box<str>, Entry>>;

/// The reservation table of one limiter.
pub(crate) struct Reservations {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    doorkeeper: Box<[AtomicU8]>,
    clock: Arc<dyn Clock>,
    /// This instance's id in heartbeats.
    pub(crate) instance: Box<str>,
    next_sweep: AtomicU64,
    counters: Counters,
}

/// The smallest limit among `rules` (a fixed window's limit, a bucket's capacity, GCRA's burst).
fn smallest_limit(rules: &RuleSet) -> u64 {
    rules
        .rules()
        .map(|r| match r.kind {
            RuleKind::FixedWindow { limit, .. } | RuleKind::SlidingWindowLog { limit, .. } => limit,
            RuleKind::SlidingWindowCounter { limit, .. } | RuleKind::Concurrency { limit, .. } => limit,
            RuleKind::TokenBucket { capacity, .. } => capacity,
            RuleKind::Gcra { burst, .. } => burst,
        })
        .min()
        .unwrap_or(1)
}

/// The largest block of `policy` for a key shared by `instances`.
pub(crate) fn cap(policy: &Policy, instances: u64) -> u64 {
    let auto = smallest_limit(&policy.rules) / instances.max(1).saturating_mul(4);
    match policy.reserve {
        Reserve::Off => 1,
        Reserve::Auto => auto,
        Reserve::Max(max) => auto.min(max),
    }
}

/// Until when a block reserved at `sent` answers, and the end of the earliest
/// fixed window among its rules.
fn validity(rules: &RuleSet, reply: &Decision, sent: Timestamp) -> (Timestamp, Option<Timestamp>) {
    let mut expires = Duration::MAX;
    let mut window: Option<Duration> = None;
    // The time to refill `units` at `refill` per `per`, at most RATE_VALIDITY.
    let refill_time = |units: u64, refill: u64, per: Duration| {
        let micros = u128::from(units) * per.as_micros() / u128::from(refill.max(1));
        Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)).min(RATE_VALIDITY)
    };
    for (rule, outcome) in rules.rules().zip(reply.outcomes(rules)) {
        let valid = match rule.kind {
            RuleKind::FixedWindow { .. } => {
                window = Some(window.map_or(outcome.reset_after(), |w| w.min(outcome.reset_after())));
                outcome.reset_after()
            }
            RuleKind::TokenBucket { capacity, refill, per } => {
                refill_time(capacity, refill, per.as_duration())
            }
            RuleKind::Gcra { limit, period, burst } => refill_time(burst, limit, period.as_duration()),
            // Never reserved (refused by validation, and no entry is made for them).
            _ => Duration::ZERO,
        };
        expires = expires.min(valid);
    }
    (sent.saturating_add(expires), window.map(|w| sent.saturating_add(w)))
}

/// A decision answered from a block: the reservation's reply, with the block's units counted
/// as remaining and the waits shortened by the time since.
fn report(rules: &RuleSet, reply: &Decision, sent: Timestamp, units: u64, now: Timestamp) -> Decision {
    reply.later(rules, now.saturating_duration_since(sent), units)
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock leaves counts, not broken invariants: go on.
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reservations {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Reservations {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            doorkeeper: (0..2 * DOORKEEPER_SLOTS).map(|_| AtomicU8::new(0)).collect(),
            instance: tollgate_core::LeaseId::random().to_string().into(),
            next_sweep: AtomicU64::new(clock.now().saturating_add(SWEEP_EVERY).as_micros()),
            clock,
            counters: Counters::default(),
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn hash(&self, policy: &str, key: &str) -> u64 {
        self.hasher.hash_one((policy, key))
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash as usize) % SHARDS]
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).values().map(HashMap::len).sum::<usize>()).sum()
    }

    /// What a check of `cost` (above 0) on `key` under `policy` (reservations on) does, and the
    /// units of a block that ended, to give back.
    pub(crate) fn step(&self, key: &str, policy: &Policy, cost: u64) -> (Step, Option<Leftover>) {
        let now = self.now();
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        let Some(entry) = shard.get_mut(&policy.name).and_then(|keys| keys.get_mut(key)) else {
            drop(shard);
            return (self.doorkeeper(hash, key, policy, now), None);
        };
        if !entry.rules.signatures().eq(policy.rules.signatures()) {
            // Reloaded with other rules: the units belong to another state. Forget them.
            let units = entry.units;
            remove(&mut shard, &policy.name, key);
            self.counters.expired.fetch_add(units, Ordering::Relaxed);
            return (Step::Plain, None);
        }
        entry.last_used = now;
        if now < entry.expires && entry.units >= cost {
            entry.units -= cost;
            self.counters.decisions.fetch_add(1, Ordering::Relaxed);
            let (reply, sent) = entry.reply.as_ref().unwrap_or_else(|| unreachable!("a block has a reply"));
            let held = Held { expires: entry.expires, window_end: entry.window_end };
            return (Step::Served(report(&policy.rules, reply, *sent, entry.units, now), held), None);
        }
        if entry.reserving.is_some_and(|since| now < since.saturating_add(IN_FLIGHT))
            || entry.refused_until.is_some_and(|until| now < until)
        {
            return (Step::Plain, None);
        }
        let mut leftover = None;
        if now >= entry.expires {
            if entry.units > 0 {
                // It cooled: units were left when the block ended.
                leftover = Some(Leftover {
                    policy: Arc::clone(&policy.name),
                    key: key.into(),
                    rules: entry.rules.clone(),
                    units: std::mem::take(&mut entry.units),
                    refundable: refundable(entry.window_end, now),
                });
                entry.size = (entry.size / 2).max(1);
            }
        } else {
            // Ran out while valid: hot here.
            entry.size = entry.size.saturating_mul(2);
        }
        entry.size = entry.size.min(cap(policy, entry.instances)).max(1);
        let size = entry.size;
        if size <= cost {
            // Back to the plain path; after a refusal the entry stays until the sweep, so that
            // the doorkeeper does not let the key straight back in to be refused again.
            if size <= 1 && entry.units == 0 && entry.refused_until.is_none() {
                remove(&mut shard, &policy.name, key);
            }
            return (Step::Plain, leftover);
        }
        let heartbeat = entry.heartbeat.is_none_or(|at| now >= at.saturating_add(HEARTBEAT_EVERY));
        entry.reserving = Some(now);
        (Step::Reserve { size, heartbeat }, leftover)
    }

    /// A check of a key with no entry: counted in the doorkeeper, and let in once hot.
    fn doorkeeper(&self, hash: u64, key: &str, policy: &Policy, now: Timestamp) -> Step {
        let bump = |slot: usize| {
            let counter = &self.doorkeeper[slot];
            // Saturates rather than wraps: a key stays hot until the sweep clears it.
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
            u32::from(counter.load(Ordering::Relaxed))
        };
        let first = (hash >> 32) as usize % DOORKEEPER_SLOTS;
        let second = DOORKEEPER_SLOTS + (hash & 0xffff_ffff) as usize % DOORKEEPER_SLOTS;
        let hits = bump(first).min(bump(second));
        let size = cap(policy, 1).min(2);
        if hits < HOT_HITS || size < 2 || !policy.rules.rules().all(|r| reservable(&r.kind)) {
            return Step::Plain;
        }
        if self.len() >= MAX_KEYS {
            return Step::Plain;
        }
        let entry = Entry::empty(&policy.rules, size, now, Some(now));
        let mut shard = lock(self.shard(hash));
        shard.entry(Arc::clone(&policy.name)).or_default().entry(key.into()).or_insert(entry);
        Step::Reserve { size, heartbeat: true }
    }

    /// Records a heartbeat's answer: `instances` share `key`. Returns the size to reserve now.
    pub(crate) fn instances_seen(&self, key: &str, policy: &Policy, instances: u64, size: u64) -> u64 {
        let now = self.now();
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        let cap = cap(policy, instances);
        if let Some(entry) = shard.get_mut(&policy.name).and_then(|keys| keys.get_mut(key)) {
            entry.instances = instances.max(1);
            entry.heartbeat = Some(now);
            entry.size = entry.size.min(cap).max(1);
        }
        size.min(cap)
    }

    /// Records a block of `size` units reserved at `sent` (the reply `reply`), `cost` of them
    /// admitted at once; returns the decision to answer.
    pub(crate) fn taken(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        size: u64,
        sent: Timestamp,
        reply: &Decision,
    ) -> Decision {
        let now = self.now();
        let (expires, window_end) = validity(&policy.rules, reply, sent);
        self.counters.blocks.fetch_add(1, Ordering::Relaxed);
        self.counters.reserved_units.fetch_add(size, Ordering::Relaxed);
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        let entry = shard
            .entry(Arc::clone(&policy.name))
            .or_default()
            .entry(key.into())
            .or_insert_with(|| Entry::empty(&policy.rules, size, now, None));
        if now < entry.expires && entry.units > 0 {
            // Units of a block still valid (another check reserved meanwhile) join this one; a
            // window-bound block keeps the earlier end.
            if window_end.is_some() {
                entry.expires = entry.expires.min(expires);
                entry.window_end = entry.window_end.min(window_end).or(window_end);
            } else {
                entry.expires = expires;
            }
        } else {
            entry.expires = expires;
            entry.window_end = window_end;
        }
        entry.units = entry.units.saturating_add(size - cost);
        entry.reserving = None;
        entry.reply = Some((reply.clone(), sent));
        entry.last_used = now;
        self.counters.decisions.fetch_add(1, Ordering::Relaxed);
        report(&policy.rules, reply, sent, entry.units, now)
    }

    /// Puts `units` answered from the block `held` back into the key's block, when that block
    /// still answers and would admit them no later than `held` would have (it is the same
    /// block, or one ending no later); otherwise returns them to give back.
    pub(crate) fn put_back(&self, key: &str, policy: &Policy, units: u64, held: Held) -> Option<Leftover> {
        let now = self.now();
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        if let Some(entry) = shard.get_mut(&policy.name).and_then(|keys| keys.get_mut(key))
            && entry.rules.signatures().eq(policy.rules.signatures())
            && now < entry.expires
            && entry.expires <= held.expires
            && entry.window_end <= held.window_end
        {
            entry.units = entry.units.saturating_add(units);
            return None;
        }
        Some(Leftover {
            policy: Arc::clone(&policy.name),
            key: key.into(),
            rules: policy.rules.clone(),
            units,
            refundable: refundable(held.window_end, now),
        })
    }

    /// Records a refused reservation (the reply `reply`): smaller blocks next.
    pub(crate) fn refused(&self, key: &str, policy: &Policy, reply: &Decision) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let left = reply.outcomes(&policy.rules).map(|o| o.remaining()).min().unwrap_or(0);
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        if let Some(entry) = shard.get_mut(&policy.name).and_then(|keys| keys.get_mut(key)) {
            entry.size = (entry.size / 2).min(left).max(1);
            entry.reserving = None;
            entry.refused_until = Some(self.now().saturating_add(reply.retry_after()));
        }
    }

    /// Records that the reservation [`step`](Self::step) asked for was not made (the heartbeat
    /// failed, the failure policy answered, or the block would not exceed the cost).
    pub(crate) fn abandoned(&self, key: &str, policy: &Policy) {
        let hash = self.hash(&policy.name, key);
        let mut shard = lock(self.shard(hash));
        if let Some(entry) = shard.get_mut(&policy.name).and_then(|keys| keys.get_mut(key)) {
            entry.reserving = None;
        }
    }

    /// Records units given back (`returned`) or lost (`!returned`).
    pub(crate) fn settled(&self, units: u64, returned: bool) {
        let counter = if returned { &self.counters.returned } else { &self.counters.expired };
        counter.fetch_add(units, Ordering::Relaxed);
    }

    /// When a sweep is due (at most one caller gets true per period): drops expired blocks and
    /// those idle for [`IDLE_AFTER`], clears the doorkeeper, and returns the units to give back.
    pub(crate) fn sweep_if_due(&self) -> Vec<Leftover> {
        let now = self.now();
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now.as_micros() < due
            || self
                .next_sweep
                .compare_exchange(
                    due,
                    now.saturating_add(SWEEP_EVERY).as_micros(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return Vec::new();
        }
        for slot in &self.doorkeeper {
            slot.store(0, Ordering::Relaxed);
        }
        self.drain(|entry| now >= entry.expires || now >= entry.last_used.saturating_add(IDLE_AFTER))
    }

    /// Every block, taken out of the table (on shutdown).
    pub(crate) fn drain_all(&self) -> Vec<Leftover> {
        self.drain(|_| true)
    }

    fn drain(&self, drop_it: impl Fn(&Entry) -> bool) -> Vec<Leftover> {
        let now = self.now();
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            for (policy, keys) in shard.iter_mut() {
                keys.retain(|key, entry| {
                    if !drop_it(entry) {
                        return true;
                    }
                    if entry.units > 0 {
                        // An expired block's units were already outside their window, or ran
                        // their validity: refundable only where the algorithm takes them back.
                        let refundable = refundable(entry.window_end, now);
                        out.push(Leftover {
                            policy: Arc::clone(policy),
                            key: key.clone(),
                            rules: entry.rules.clone(),
                            units: entry.units,
                            refundable,
                        });
                    }
                    false
                });
            }
            shard.retain(|_, keys| !keys.is_empty());
        }
        out
    }

    pub(crate) fn stats(&self) -> ReserveStats {
        let now = self.now();
        let (mut keys, mut held) = (0, 0);
        for shard in &self.shards {
            for entry in lock(shard).values().flat_map(HashMap::values) {
                keys += 1;
                if now < entry.expires {
                    held += entry.units;
                }
            }
        }
        let c = &self.counters;
        ReserveStats {
            keys,
            held,
            blocks: c.blocks.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            reserved_units: c.reserved_units.load(Ordering::Relaxed),
            decisions: c.decisions.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
        }
    }
}

/// Whether unused units can go back now: always for rate rules (a refund only refills the
/// bucket, never past full), and for fixed windows while the earliest one has more than
/// [`REFUND_MARGIN`] left (a refund landing in the next window would add to it).
fn refundable(window_end: Option<Timestamp>, now: Timestamp) -> bool {
    window_end.is_none_or(|end| now.saturating_add(REFUND_MARGIN) < end)
}

fn remove(shard: &mut Shard, policy: &str, key: &str) {
    if let Some(keys) = shard.get_mut(policy) {
        keys.remove(key);
        if keys.is_empty() {
            shard.remove(policy);
        }
    }
}
