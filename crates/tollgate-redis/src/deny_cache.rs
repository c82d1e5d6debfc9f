//! A local cache of denials: a key denied until time T is answered here until T, without a
//! Redis call (envoyproxy/ratelimit's over-limit cache, made exact).
//!
//! T is the denial's own `retry_after`, the earliest instant at which the same cost would be
//! admitted, counted from when the request was *sent* (Redis decided after that), so the cache
//! never holds a denial past the moment Redis would admit. Under a flood of denied requests,
//! Redis load falls by the cache's hit rate. What it cannot see: a `reset` or `refund` of the
//! key made through another instance, which lets that key in earlier there than here (this
//! instance forgets its own entries on its own reset and refund). Rule sets with concurrency
//! leases are never cached, since a release elsewhere frees units at any moment.
//!
//! Each entry is tied to the backend's count of connection failures when its request was
//! sent, and holds only while that count stays the same: after a lost connection, Redis may
//! be a new, empty one (restarted, or a replica promoted), and its own answer is asked for.
//! The count moves when a call fails on a lost connection, and also when the client is told a
//! connection closed (RESP3's disconnection notice, conn.rs) with no call on it: a Redis
//! restarted while every answer came from this cache closes its connections, so its denials
//! go then, not at their `retry_after` (issue 18).
//!
//! An expired entry goes when its key is asked about again, and at most a second after it
//! expired otherwise: with keys that come and go (users, IPs), most are never asked about
//! again, and the cache would fill to [`CAPACITY`] with dead entries (the soak, docs/soak.md,
//! saw the server's memory climb by 20 MiB in six minutes that way).

use std::sync::Mutex;
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;
use tollgate_core::{Decision, RuleSet};

/// Entries held at most; when full, expired ones are dropped, and new denials are not cached
/// until there is room.
pub(crate) const CAPACITY: usize = 100_000;

/// Checks answered from the cache, without a Redis call.
pub(crate) const HITS_METRIC: &str = "tollgate_redis_deny_cache_hits_total";

/// How often a `put` drops every expired entry.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Denied {
    /// When the same cost is admitted again.
    until: Instant,
    /// The cost denied (1 for a peek): a smaller one may fit sooner.
    probe: u64,
    sent: Instant,
    /// The backend's connection failures when the request was sent.
    epoch: u64,
    decision: Decision,
}

pub(crate) struct DenyCache {
    map: DashMap<Box<str>, Denied>,
    /// When expired entries were last dropped.
    swept: Mutex<Instant>,
}

/// The cache key: the caller's key and the rule set's signatures (a changed rule set is
/// another entry, as it is another state).
fn id(key: &str, rules: &RuleSet) -> String {
    let mut id = String::with_capacity(key.len() + 24 * rules.len());
    id.push_str(key);
    for signature in rules.signatures() {
        id.push('\u{1f}');
        id.push_str(signature);
    }
    id
}

impl DenyCache {
    pub(crate) fn new() -> Self {
        DenyCache { map: DashMap::new(), swept: Mutex::new(Instant::now()) }
    }

    /// The cached denial for `cost` on `key` under `rules`, its waits shortened by the time
    /// since it was decided; `None` when Redis must decide (as it must for a denial cached
    /// before the latest connection failure, `epoch` being their count now).
    pub(crate) fn get(&self, key: &str, rules: &RuleSet, cost: u64, epoch: u64) -> Option<Decision> {
        if self.map.is_empty() {
            return None;
        }
        let id = id(key, rules);
        let now = Instant::now();
        let hit = {
            let entry = self.map.get(id.as_str())?;
            (now < entry.until && cost.max(1) >= entry.probe && entry.epoch == epoch)
                .then(|| entry.decision.later(rules, now - entry.sent, 0))
        };
        if hit.is_none() {
            self.map.remove_if(id.as_str(), |_, d| d.until <= now || d.epoch != epoch);
        }
        hit
    }

    /// Remembers `decision` (made for a request sent at `sent`, when the backend had seen
    /// `epoch` connection failures) if it is a cacheable denial.
    pub(crate) fn put(
        &self,
        key: &str,
        rules: &RuleSet,
        cost: u64,
        sent: Instant,
        epoch: u64,
        decision: &Decision,
    ) {
        let wait = decision.retry_after();
        if decision.allowed() || rules.has_concurrency() || wait < Duration::from_millis(1) {
            return;
        }
        let now = Instant::now();
        // One caller sweeps at a time; the others go on.
        let sweep = self.swept.try_lock().is_ok_and(|mut swept| {
            let due = now.duration_since(*swept) >= SWEEP_EVERY || self.map.len() >= CAPACITY;
            if due {
                *swept = now;
            }
            due
        });
        if sweep {
            self.map.retain(|_, d| d.until > now);
        }
        if self.map.len() >= CAPACITY {
            return;
        }
        let denied =
            Denied { until: sent + wait, probe: cost.max(1), sent, epoch, decision: decision.clone() };
        self.map.insert(id(key, rules).into(), denied);
    }

    /// Forgets `key`'s denial under `rules` (its state changed here: a reset or a refund).
    pub(crate) fn forget(&self, key: &str, rules: &RuleSet) {
        if !self.map.is_empty() {
            self.map.remove(id(key, rules).as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::{Period, Rule, RuleReport};

    use super::*;

    fn denied(retry_after: Duration) -> Decision {
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        let report = RuleReport { allowed: false, remaining: 0, reset_after: retry_after, retry_after };
        Decision::from_reports(&rules, [report]).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn expired_denials_of_keys_never_asked_again_are_dropped() {
        let cache = DenyCache::new();
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        for n in 0..1000 {
            cache.put(
                &format!("gone-{n}"),
                &rules,
                1,
                Instant::now(),
                0,
                &denied(Duration::from_millis(500)),
            );
        }
        cache.put("long", &rules, 1, Instant::now(), 0, &denied(Duration::from_secs(60)));
        assert_eq!(cache.map.len(), 1001);
        // Within the second, no sweep: the expired entries are still there.
        tokio::time::advance(Duration::from_millis(600)).await;
        cache.put("other", &rules, 1, Instant::now(), 0, &denied(Duration::from_secs(60)));
        assert_eq!(cache.map.len(), 1002);
        // A second after the last sweep, the next denial sweeps: only the live ones stay.
        tokio::time::advance(Duration::from_millis(500)).await;
        cache.put("third", &rules, 1, Instant::now(), 0, &denied(Duration::from_secs(60)));
        assert_eq!(cache.map.len(), 3);
        assert!(cache.get("long", &rules, 1, 0).is_some_and(|d| !d.allowed()));
        assert!(cache.get("gone-1", &rules, 1, 0).is_none());
    }
}
