//! Live decision data for the web console: per policy, allowed and denied checks per second over
//! the last 15 minutes, and the keys nearest their limits. Fed by `/v1/check` (and consumer
//! checks) after each decision; served by `GET /v1/admin/live/policies/{name}` (viewer).
//!
//! Memory is bounded whatever the traffic: at most [`MAX_POLICIES`] policies are tracked (the
//! one seen least recently makes room), each with [`WINDOW_SECS`] one-second buckets and at most
//! [`TOP_KEYS`] keys (each at most 512 bytes, the key bound). That is under 40 KiB per policy,
//! under 10 MiB in all. Peeks (`cost` 0) are not recorded. The data is per process: behind a
//! load balancer each instance shows its own share.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tollgate_core::RuleSet;
use tollgate_http::headers::ceil_millis;
use tollgate_limiter::Verdict;

/// Seconds of history kept per policy: 15 minutes of one-second buckets.
pub const WINDOW_SECS: u64 = 900;
/// Keys nearest their limits kept per policy.
pub const TOP_KEYS: usize = 20;
/// Policies tracked at once.
pub const MAX_POLICIES: usize = 256;

#[derive(Clone, Copy, Default)]
struct Bucket {
    sec: u64,
    allowed: u32,
    denied: u32,
    shadow_denied: u32,
}

struct Near {
    /// The key's hash, compared before the key itself: most recorded keys are not among these.
    hash: u64,
    key: String,
    rule: String,
    remaining: u64,
    limit: u64,
    expires_ms: u64,
}

impl Near {
    /// Whether this entry has a larger fraction left than `remaining / limit` (compared by
    /// cross-multiplication, exactly).
    fn above(&self, remaining: u64, limit: u64) -> bool {
        u128::from(self.remaining) * u128::from(limit) > u128::from(remaining) * u128::from(self.limit)
    }
}

struct PolicyLive {
    buckets: Vec<Bucket>,
    near: Vec<Near>,
    /// The index of the entry in `near` with the most room left, while `near` is unchanged:
    /// most decisions are of keys far from their limits, and are turned away by this one
    /// comparison rather than a scan of every entry.
    worst: Option<usize>,
    /// At most the earliest `expires_ms` in `near` (`u64::MAX` when empty): until then nothing
    /// has expired and nothing need be scanned.
    next_expiry: u64,
    last_sec: u64,
}

impl PolicyLive {
    fn new() -> Self {
        PolicyLive {
            buckets: vec![Bucket::default(); WINDOW_SECS as usize],
            near: Vec::new(),
            worst: None,
            next_expiry: u64::MAX,
            last_sec: 0,
        }
    }

    fn forget_expired(&mut self, now_ms: u64) {
        if self.next_expiry > now_ms {
            return;
        }
        self.near.retain(|n| n.expires_ms > now_ms);
        self.next_expiry = self.near.iter().map(|n| n.expires_ms).min().unwrap_or(u64::MAX);
        self.worst = None;
    }

    /// `near` changed: an entry of `expires_ms` was written.
    fn changed(&mut self, expires_ms: u64) {
        self.worst = None;
        self.next_expiry = self.next_expiry.min(expires_ms);
    }

    fn bucket(&mut self, sec: u64) -> &mut Bucket {
        let b = &mut self.buckets[(sec % WINDOW_SECS) as usize];
        if b.sec != sec {
            *b = Bucket { sec, ..Bucket::default() };
        }
        b
    }

    /// Keeps `key` among the nearest if it is near enough; call [`Self::forget_expired`] first.
    fn record_near(
        &mut self,
        key: &str,
        hash: u64,
        rule: impl Fn() -> String,
        remaining: u64,
        limit: u64,
        expires_ms: u64,
    ) {
        if let Some(n) = self.near.iter_mut().find(|n| n.hash == hash && n.key == key) {
            (n.remaining, n.limit, n.expires_ms) = (remaining, limit, expires_ms);
            n.rule = rule();
            self.changed(expires_ms);
            return;
        }
        // Allocates only for an entry kept.
        let entry = || Near { hash, key: key.to_owned(), rule: rule(), remaining, limit, expires_ms };
        if self.near.len() < TOP_KEYS {
            self.near.push(entry());
            self.changed(expires_ms);
            return;
        }
        // Replace the entry with the most room left, if this key has less.
        let worst = self.worst.or_else(|| {
            self.near
                .iter()
                .enumerate()
                .max_by(|(_, a), (_, b)| {
                    (u128::from(a.remaining) * u128::from(b.limit))
                        .cmp(&(u128::from(b.remaining) * u128::from(a.limit)))
                })
                .map(|(i, _)| i)
        });
        self.worst = worst;
        if let Some(i) = worst
            && self.near[i].above(remaining, limit)
        {
            self.near[i] = entry();
            self.changed(expires_ms);
        }
    }
}

/// The recorder: per policy, a ring of one-second buckets and the keys nearest their limits.
#[derive(Default)]
pub struct Live {
    policies: RwLock<HashMap<String, Arc<Mutex<PolicyLive>>, foldhash::fast::RandomState>>,
    /// Hashes keys for [`Near::hash`].
    keys: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

pub(crate) fn now_ms() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

impl Live {
    fn entry(&self, policy: &str, sec: u64) -> Arc<Mutex<PolicyLive>> {
        if let Some(p) = self.policies.read().unwrap_or_else(|e| e.into_inner()).get(policy) {
            return Arc::clone(p);
        }
        let mut map = self.policies.write().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(policy) && map.len() >= MAX_POLICIES {
            let stalest = map
                .iter()
                .min_by_key(|(_, p)| p.lock().map(|p| p.last_sec).unwrap_or(0))
                .map(|(name, _)| name.clone());
            if let Some(name) = stalest {
                map.remove(&name);
            }
        }
        let entry = map.entry(policy.to_owned()).or_insert_with(|| {
            let mut fresh = PolicyLive::new();
            fresh.last_sec = sec;
            Arc::new(Mutex::new(fresh))
        });
        Arc::clone(entry)
    }

    /// Records one decision of `policy` for `key` taking `cost` units. Peeks are ignored.
    pub fn record(&self, policy: &str, rules: &RuleSet, key: &str, cost: u64, verdict: &Verdict) {
        if cost == 0 {
            return;
        }
        self.record_at(policy, rules, key, verdict, now_ms());
    }

    fn record_at(&self, policy: &str, rules: &RuleSet, key: &str, verdict: &Verdict, now_ms: u64) {
        let sec = now_ms / 1000;
        // A policy already tracked is recorded under the map's read lock, without touching the
        // count of its entry's Arc (a cache line every thread would share).
        if let Some(entry) = self.policies.read().unwrap_or_else(|e| e.into_inner()).get(policy) {
            return self.record_in(
                &mut entry.lock().unwrap_or_else(|e| e.into_inner()),
                rules,
                key,
                verdict,
                now_ms,
            );
        }
        let entry = self.entry(policy, sec);
        self.record_in(&mut entry.lock().unwrap_or_else(|e| e.into_inner()), rules, key, verdict, now_ms);
    }

    fn record_in(&self, live: &mut PolicyLive, rules: &RuleSet, key: &str, verdict: &Verdict, now_ms: u64) {
        let sec = now_ms / 1000;
        live.last_sec = live.last_sec.max(sec);
        let bucket = live.bucket(sec);
        if verdict.shadow_denied {
            bucket.shadow_denied = bucket.shadow_denied.saturating_add(1);
        } else if verdict.allowed() {
            bucket.allowed = bucket.allowed.saturating_add(1);
        } else {
            bucket.denied = bucket.denied.saturating_add(1);
        }
        // The rule with the smallest fraction left.
        let tightest = verdict.decision.outcomes(rules).enumerate().filter(|(_, o)| o.limit() > 0).min_by(
            |(_, a), (_, b)| {
                (u128::from(a.remaining()) * u128::from(b.limit()))
                    .cmp(&(u128::from(b.remaining()) * u128::from(a.limit())))
            },
        );
        if let Some((index, o)) = tightest {
            let rule =
                || o.name().map_or_else(|| format!("{}.{index}", o.algorithm().as_str()), str::to_owned);
            let expires_ms = now_ms.saturating_add(ceil_millis(o.reset_after()).max(1));
            let hash = self.keys.hash_one(key);
            live.forget_expired(now_ms);
            live.record_near(key, hash, rule, o.remaining(), o.limit(), expires_ms);
        }
    }

    /// What `GET /v1/admin/live/policies/{name}` answers, as of `now_ms`; `None` when nothing
    /// was recorded for the policy.
    pub(crate) fn snapshot_at(&self, policy: &str, now_ms: u64) -> Option<LiveBody> {
        let entry = self.policies.read().unwrap_or_else(|e| e.into_inner()).get(policy).cloned()?;
        let mut body = LiveBody::empty(policy, now_ms);
        let (start, sec) = (body.start_sec, now_ms / 1000);
        let live = entry.lock().unwrap_or_else(|e| e.into_inner());
        for b in live.buckets.iter().filter(|b| b.sec >= start && b.sec <= sec) {
            let i = (b.sec - start) as usize;
            body.allowed[i] = b.allowed;
            body.denied[i] = b.denied;
            body.shadow_denied[i] = b.shadow_denied;
        }
        let mut near: Vec<&Near> = live.near.iter().filter(|n| n.expires_ms > now_ms).collect();
        near.sort_by(|a, b| {
            (u128::from(a.remaining) * u128::from(b.limit))
                .cmp(&(u128::from(b.remaining) * u128::from(a.limit)))
                .then_with(|| a.key.cmp(&b.key))
        });
        body.nearest = near
            .into_iter()
            .map(|n| NearBody {
                key: n.key.clone(),
                rule: n.rule.clone(),
                remaining: n.remaining,
                limit: n.limit,
                reset_in_ms: n.expires_ms - now_ms,
            })
            .collect();
        Some(body)
    }
}

/// One key near its limit.
#[derive(Debug, Serialize)]
pub struct NearBody {
    /// The key.
    pub key: String,
    /// Its rule with the smallest fraction left, at its last decision.
    pub rule: String,
    /// Units left in that rule after its last decision.
    pub remaining: u64,
    /// That rule's limit.
    pub limit: u64,
    /// Milliseconds until that rule is full again (the entry is dropped then).
    pub reset_in_ms: u64,
}

/// The recorder's bounds.
#[derive(Debug, Serialize)]
pub struct Bounds {
    /// Seconds of history.
    pub window_secs: u64,
    /// Keys kept per policy.
    pub top_keys: usize,
    /// Policies tracked at once.
    pub max_policies: usize,
}

impl LiveBody {
    /// No traffic: zeros throughout.
    pub(crate) fn empty(policy: &str, now_ms: u64) -> Self {
        LiveBody {
            policy: policy.to_owned(),
            now_ms,
            start_sec: (now_ms / 1000 + 1).saturating_sub(WINDOW_SECS),
            window_secs: WINDOW_SECS,
            allowed: vec![0; WINDOW_SECS as usize],
            denied: vec![0; WINDOW_SECS as usize],
            shadow_denied: vec![0; WINDOW_SECS as usize],
            nearest: Vec::new(),
            keys_withheld: false,
            bounds: Bounds { window_secs: WINDOW_SECS, top_keys: TOP_KEYS, max_policies: MAX_POLICIES },
        }
    }
}

/// `GET /v1/admin/live/policies/{name}` body.
#[derive(Debug, Serialize)]
pub struct LiveBody {
    /// The policy.
    pub policy: String,
    /// The server's clock, Unix epoch milliseconds.
    pub now_ms: u64,
    /// The Unix second of the first bucket (the last is the current second).
    pub start_sec: u64,
    /// Buckets per series.
    pub window_secs: u64,
    /// Admitted checks per second, oldest first.
    pub allowed: Vec<u32>,
    /// Refused checks per second.
    pub denied: Vec<u32>,
    /// Shadow-mode denials (admitted, but the rules refused) per second.
    pub shadow_denied: Vec<u32>,
    /// Keys nearest their limits, nearest first, at most `bounds.top_keys`.
    pub nearest: Vec<NearBody>,
    /// Whether `nearest` was emptied because the policy counts callers beyond the token's apps.
    pub keys_withheld: bool,
    /// The recorder's bounds.
    pub bounds: Bounds,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Backend, MemoryBackend, Period, Rule, RuleSet};

    use super::*;

    /// A real decision of one rule `r` (`limit` per `reset_ms`, from the first hit) leaving
    /// `remaining`, or denied at 0.
    fn verdict(allowed: bool, remaining: u64, limit: u64, reset_ms: u64) -> (RuleSet, Verdict) {
        let rules =
            RuleSet::new([
                Rule::fixed_window_from_first_hit(limit, Period::from_millis(reset_ms).unwrap()).named("r")
            ])
            .unwrap();
        let backend = MemoryBackend::new();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let decision = runtime.block_on(async {
            let taken = if allowed { limit - remaining } else { limit };
            let mut d = backend.check("k", &rules, taken).await.unwrap();
            if !allowed {
                d = backend.check("k", &rules, 1).await.unwrap();
            }
            d
        });
        assert_eq!((decision.allowed(), decision.remaining()), (allowed, remaining));
        (rules, Verdict { decision, degraded: false, shadow_denied: false, waited: Duration::ZERO })
    }

    /// Records `decided` (a [`verdict`]) at `now_ms`.
    fn record(live: &Live, policy: &str, key: &str, (rules, verdict): (RuleSet, Verdict), now_ms: u64) {
        live.record_at(policy, &rules, key, &verdict, now_ms);
    }

    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn buckets_count_per_second_and_forget_after_the_window() {
        let live = Live::default();
        record(&live, "p", "a", verdict(true, 5, 10, 1000), T0);
        record(&live, "p", "a", verdict(true, 4, 10, 1000), T0 + 10);
        record(&live, "p", "a", verdict(false, 0, 10, 1000), T0 + 1500);
        let s = live.snapshot_at("p", T0 + 1600).unwrap();
        let last = s.allowed.len() - 1;
        assert_eq!((s.allowed[last - 1], s.denied[last - 1]), (2, 0));
        assert_eq!((s.allowed[last], s.denied[last]), (0, 1));
        assert_eq!(s.allowed.iter().sum::<u32>(), 2);
        // 15 minutes later, the old buckets are outside the window.
        let later = live.snapshot_at("p", T0 + WINDOW_SECS * 1000 + 5000).unwrap();
        assert_eq!(later.allowed.iter().sum::<u32>() + later.denied.iter().sum::<u32>(), 0);
        // A bucket reused by a later second starts from zero.
        record(&live, "p", "a", verdict(true, 5, 10, 1000), T0 + WINDOW_SECS * 1000);
        let s = live.snapshot_at("p", T0 + WINDOW_SECS * 1000).unwrap();
        assert_eq!(s.allowed.iter().sum::<u32>(), 1);
    }

    #[test]
    fn nearest_keys_are_bounded_sorted_and_expire() {
        let live = Live::default();
        for i in 0..100u64 {
            record(&live, "p", &format!("k{i}"), verdict(true, i % 50, 50, 10_000 + i), T0);
        }
        let s = live.snapshot_at("p", T0 + 1).unwrap();
        assert_eq!(s.nearest.len(), TOP_KEYS);
        let remaining: Vec<u64> = s.nearest.iter().map(|n| n.remaining).collect();
        assert_eq!(remaining[..4], [0, 0, 1, 1]);
        assert!(remaining.iter().all(|r| *r < 10), "{remaining:?}");
        // A key seen again is updated, not duplicated.
        record(&live, "p", "k0", verdict(true, 49, 50, 10_000), T0 + 2);
        let s = live.snapshot_at("p", T0 + 3).unwrap();
        assert_eq!(s.nearest.iter().filter(|n| n.key == "k0").count(), 1);
        // After their reset, entries are gone.
        let s = live.snapshot_at("p", T0 + 20_000).unwrap();
        assert!(s.nearest.is_empty());
    }

    /// The nearest keys as the plain scan keeps them (each call forgets the expired, then
    /// updates the key, adds it, or replaces the entry with the most room left): what the kept
    /// worst entry and earliest expiry must not change.
    fn plain_record(
        near: &mut Vec<(String, u64, u64, u64)>,
        key: &str,
        remaining: u64,
        limit: u64,
        expires_ms: u64,
        now_ms: u64,
    ) {
        near.retain(|n| n.3 > now_ms);
        if let Some(n) = near.iter_mut().find(|n| n.0 == key) {
            (n.1, n.2, n.3) = (remaining, limit, expires_ms);
            return;
        }
        if near.len() < TOP_KEYS {
            near.push((key.to_owned(), remaining, limit, expires_ms));
            return;
        }
        let worst = near
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, b)| {
                (u128::from(a.1) * u128::from(b.2)).cmp(&(u128::from(b.1) * u128::from(a.2)))
            })
            .map(|(i, _)| i)
            .unwrap();
        if u128::from(near[worst].1) * u128::from(limit) > u128::from(remaining) * u128::from(near[worst].2) {
            near[worst] = (key.to_owned(), remaining, limit, expires_ms);
        }
    }

    proptest::proptest! {
        #[test]
        fn the_nearest_keys_are_those_a_plain_scan_keeps(
            calls in proptest::collection::vec((0u8..40, 0u64..20, 1u64..20, 1u64..2000, 0u64..300), 1..400)
        ) {
            let keys = foldhash::fast::RandomState::default();
            let (mut live, mut plain) = (PolicyLive::new(), Vec::new());
            let mut now = T0;
            for (key, remaining, limit, ttl, step) in calls {
                now += step;
                let key = format!("k{key}");
                live.forget_expired(now);
                live.record_near(&key, keys.hash_one(&key), || "r".to_owned(), remaining.min(limit), limit, now + ttl);
                plain_record(&mut plain, &key, remaining.min(limit), limit, now + ttl, now);
                let kept: Vec<_> = live.near.iter().map(|n| (n.key.clone(), n.remaining, n.limit, n.expires_ms)).collect();
                proptest::prop_assert_eq!(&kept, &plain);
            }
        }
    }

    #[test]
    fn policies_are_bounded() {
        let live = Live::default();
        for i in 0..(MAX_POLICIES as u64 + 10) {
            record(&live, &format!("p{i}"), "k", verdict(true, 1, 2, 1000), T0 + i * 1000);
        }
        assert_eq!(live.policies.read().unwrap().len(), MAX_POLICIES);
        assert!(live.snapshot_at("p0", T0).is_none(), "the stalest policy made room");
        assert!(live.snapshot_at(&format!("p{}", MAX_POLICIES + 9), T0 + 300_000).is_some());
    }
}
