//! The hit counters of limited descriptors, in Tollgate's names and in upstream's (the
//! Prometheus names its statsd_exporter mapping gives), with the bound on their label sets.
//!
//! A descriptor's label sets are a stranger's to choose (`detailed_metric`, `value_to_metric`
//! and a request's own limit put its values in them), so at most `max` of each family get a
//! series of their own; the hits of the rest are counted under [`OVERFLOW_KEY`]. A label set's
//! counters are registered with the recorder once and kept with it: registering one (building
//! the metric's key, hashing it, finding it in the registry) cost more than the rest of a
//! descriptor's answer, on every request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use metrics::Counter;
use thread_local::ThreadLocal;

/// Metric names, upstream's where they exist, by `domain` and `descriptor` (the entry keys, or
/// keys and values for `detailed_metric` descriptors).
pub mod names {
    /// Counter: hits (the sum of hits_addend).
    pub const TOTAL_HITS: &str = "tollgate_envoy_total_hits";
    /// Counter: hits refused.
    pub const OVER_LIMIT: &str = "tollgate_envoy_over_limit";
    /// Counter: hits admitted with more than the near-limit ratio of a limit used (upstream's
    /// `NEAR_LIMIT_RATIO`, 0.8 by default).
    pub const NEAR_LIMIT: &str = "tollgate_envoy_near_limit";
    /// Counter: hits admitted.
    pub const WITHIN_LIMIT: &str = "tollgate_envoy_within_limit";
    /// Counter: hits a shadow-mode descriptor would have refused.
    pub const SHADOW_MODE: &str = "tollgate_envoy_shadow_mode";
    /// Counter: requests over the limit answered OK by the global shadow mode (upstream's
    /// `global_shadow_mode`).
    pub const GLOBAL_SHADOW_MODE: &str = "tollgate_envoy_global_shadow_mode";
    /// Gauge: 1 while the xDS stream to the management server is open, 0 while it is being
    /// reconnected (`--envoy-xds-server`).
    pub const XDS_CONNECTED: &str = "tollgate_envoy_xds_connected";

    /// Upstream's names as its Prometheus mapping exports them (`USE_PROMETHEUS`, or the
    /// statsd_exporter mapping it ships), by `domain`, `key1` and (for a key path of two
    /// levels or more) `key2`, counted as upstream counts them (see [`super::UpstreamCounts`]).
    pub mod upstream {
        /// Counter: hits of a limited descriptor.
        pub const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
        /// Counter: hits over the limit (shadow-mode ones included).
        pub const OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
        /// Counter: hits past the near-limit threshold and within the limit.
        pub const NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
        /// Counter: hits of requests the descriptor admitted (near ones included).
        pub const WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
        /// Counter: hits over the limit of a shadow-mode descriptor.
        pub const SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
    }
}

/// The `key1` label of the hits of key paths past the bound (see
/// [`EnvoyService::with_stats_max_key_paths`]): `|` never appears in a key path's labels
/// (upstream's stat names turn it into `_`).
pub const OVERFLOW_KEY: &str = "|overflow|";

/// Distinct key paths counted by default, per family of names.
pub const DEFAULT_STATS_MAX_KEY_PATHS: usize = 10_000;

/// Upstream's counting of one descriptor's hits (its `base_limiter.go`), from the counter
/// before and after the hits, whether or not they were charged.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct UpstreamCounts {
    /// The part of the hits past the limit.
    pub over: u64,
    /// The part past `floor(limit x ratio)` and up to the limit.
    pub near: u64,
    /// Every hit, when the limit admitted them all; none otherwise.
    pub within: u64,
    /// `over` again, for a shadow-mode descriptor.
    pub shadow: u64,
}

impl UpstreamCounts {
    /// `hits` on a counter at `before` under `limit`, as upstream splits them.
    pub fn new(limit: u64, before: u64, hits: u64, ratio: f32, shadow: bool) -> Self {
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let near_at = (limit as f32 * ratio).floor() as u64;
        let after = before.saturating_add(hits);
        let mut c = UpstreamCounts::default();
        if after > limit {
            if before >= limit {
                c.over = hits;
            } else {
                c.over = after - limit;
                c.near = limit - near_at.max(before);
            }
            if shadow {
                c.shadow = c.over;
            }
        } else {
            if after > near_at {
                c.near = if before >= near_at { hits } else { after - near_at };
            }
            c.within = hits;
        }
        c
    }
}

/// Upstream's stat name sanitising (`SanitizeStatName`): `:` and `|` become `_`, and so do
/// the dots of anything shaped like an IPv4 address (1 to 3 digits, four times).
pub(crate) fn sanitize_stat_name(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = s.replace([':', '|'], "_").into_bytes();
    let mut i = 0;
    while i < b.len() {
        match ipv4_at(b, i) {
            Some(end) => {
                for o in &mut out[i..end] {
                    if *o == b'.' {
                        *o = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Where an IPv4-shaped run starting at `i` ends, preferring longer groups as a regular
/// expression's greedy `\d{1,3}` does.
fn ipv4_at(b: &[u8], i: usize) -> Option<usize> {
    fn group(b: &[u8], i: usize, left: usize) -> Option<usize> {
        let digits = b[i..].iter().take(3).take_while(|c| c.is_ascii_digit()).count();
        (1..=digits).rev().find_map(|n| {
            let end = i + n;
            if left == 0 {
                return Some(end);
            }
            (b.get(end) == Some(&b'.')).then_some(()).and_then(|()| group(b, end + 1, left - 1))
        })
    }
    group(b, i, 3)
}

/// What became of a limited descriptor's hits, for Tollgate's families.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hits {
    pub hits: u64,
    pub shadow: bool,
    pub over: bool,
    pub near: bool,
}

/// A limited descriptor's key path, as its labels are made of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyPath<'a> {
    pub domain: &'a str,
    /// The request's entries, key and value.
    pub entries: &'a [(&'a str, &'a str)],
    /// `detailed_metric`: the values are part of Tollgate's `descriptor` label.
    pub detailed: bool,
    /// Upstream's stat key path.
    pub stat_path: &'a str,
}

/// Both families' series, by label set, registered as they are first hit.
#[derive(Debug)]
pub(crate) struct Stats {
    max: usize,
    legacy: Family,
    upstream: Family,
}

/// One family's series: those admitted under the bound, by their id, and the overflow series
/// of each domain; and each thread's copy of the admitted ones it has counted.
#[derive(Debug, Default)]
struct Family {
    shared: RwLock<Shared>,
    /// Read on every count instead of `shared`: taking a read lock and cloning the series'
    /// `Arc` are writes to lines every thread writes. Holds admitted series only (at most
    /// `max` a thread), which are never taken back.
    seen: ThreadLocal<Seen>,
}

/// A thread's admitted series, on cache lines of its own: `ThreadLocal` keeps threads' values
/// side by side, and each lookup writes the `RefCell`'s borrow flag.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Seen(RefCell<HashMap<String, Arc<Series>, foldhash::fast::RandomState>>);

/// What every thread shares of a family.
#[derive(Debug, Default)]
struct Shared {
    admitted: HashMap<String, Arc<Series>>,
    overflow: HashMap<String, Arc<Series>>,
}

/// The counters of one label set, each registered on its first use.
#[derive(Debug)]
struct Series {
    labels: Vec<(&'static str, String)>,
    names: &'static [&'static str; 5],
    counters: [OnceLock<Counter>; 5],
}

impl Series {
    fn new(labels: Vec<(&'static str, String)>, names: &'static [&'static str; 5]) -> Arc<Series> {
        Arc::new(Series { labels, names, counters: Default::default() })
    }

    fn increment(&self, family: usize, by: u64) {
        let counter =
            self.counters[family].get_or_init(|| metrics::counter!(self.names[family], &self.labels));
        // Registered above; adding nothing would still write to a counter every thread shares.
        if by > 0 {
            counter.increment(by);
        }
    }
}

/// Tollgate's families, in [`Series`] order.
const LEGACY: [&str; 5] =
    [names::TOTAL_HITS, names::SHADOW_MODE, names::OVER_LIMIT, names::NEAR_LIMIT, names::WITHIN_LIMIT];
/// Upstream's families, in [`Series`] order.
const UPSTREAM: [&str; 5] = [
    names::upstream::TOTAL_HITS,
    names::upstream::OVER_LIMIT,
    names::upstream::NEAR_LIMIT,
    names::upstream::WITHIN_LIMIT,
    names::upstream::SHADOW_MODE,
];

impl Stats {
    /// At most `max` label sets per family.
    pub(crate) fn new(max: usize) -> Self {
        Stats { max, legacy: Family::default(), upstream: Family::default() }
    }

    /// Counts a limited descriptor's hits in both families: Tollgate's every hit, then
    /// shadow-mode, over, near or within; upstream's as [`UpstreamCounts`] splits them.
    pub(crate) fn count(&self, path: KeyPath<'_>, hits: Hits, c: &UpstreamCounts) {
        let family = match (hits.over, hits.shadow) {
            (true, true) => 1,
            (true, false) => 2,
            (false, _) if hits.near => 3,
            (false, _) => 4,
        };
        self.legacy_series(path, |legacy| {
            legacy.increment(0, hits.hits);
            legacy.increment(family, hits.hits);
        });
        self.upstream_series(path, |series| {
            for (family, by) in [hits.hits, c.over, c.near, c.within, c.shadow].into_iter().enumerate() {
                // Every family of a key path is registered, as upstream creates them together.
                series.increment(family, by);
            }
        });
    }

    /// Tollgate's series of `path`: labelled `domain` and `descriptor` (the entry keys, or
    /// `key_value`s when detailed, joined by `.`).
    fn legacy_series(&self, path: KeyPath<'_>, f: impl FnOnce(&Series)) {
        let domain = path.domain;
        with_id(|id| {
            id.push_str(domain);
            id.push('\n');
            for (i, (k, v)) in path.entries.iter().enumerate() {
                if i > 0 {
                    id.push('.');
                }
                id.push_str(k);
                if path.detailed {
                    id.push('_');
                    id.push_str(v);
                }
            }
            let label = &id[domain.len() + 1..];
            let labels = || vec![("domain", domain.to_owned()), ("descriptor", label.to_owned())];
            let overflow = || vec![("domain", domain.to_owned()), ("descriptor", OVERFLOW_KEY.to_owned())];
            self.series(&self.legacy, id, domain, labels, overflow, &LEGACY, f)
        })
    }

    /// Upstream's series of `path`: [`upstream_labels`] of its stat key path. Known by the
    /// path before sanitising (two paths that sanitise alike share one series, each taking a
    /// place under the bound).
    fn upstream_series(&self, path: KeyPath<'_>, f: impl FnOnce(&Series)) {
        let domain = path.domain;
        with_id(|id| {
            id.push_str(domain);
            id.push('\n');
            id.push_str(path.stat_path);
            let labels = || upstream_labels(domain, path.stat_path);
            let overflow = || {
                let mut labels = upstream_labels(domain, "");
                labels.truncate(1);
                labels.push(("key1", OVERFLOW_KEY.to_owned()));
                labels
            };
            self.series(&self.upstream, id, domain, labels, overflow, &UPSTREAM, f)
        })
    }

    /// Calls `f` with the series of `id` in `family`: known, or new while there is room, or
    /// else the domain's overflow series.
    #[allow(clippy::too_many_arguments)]
    fn series(
        &self,
        family: &Family,
        id: &str,
        domain: &str,
        labels: impl FnOnce() -> Vec<(&'static str, String)>,
        overflow: impl FnOnce() -> Vec<(&'static str, String)>,
        names: &'static [&'static str; 5],
        f: impl FnOnce(&Series),
    ) {
        // Known label sets, the usual case, only read, and from this thread's own map.
        let seen = family.seen.get_or_default();
        if let Some(series) = seen.0.try_borrow().ok().as_ref().and_then(|seen| seen.get(id)) {
            return f(series);
        }
        let (series, admitted) = self.shared_series(&family.shared, id, domain, labels, overflow, names);
        if admitted && let Ok(mut seen) = seen.0.try_borrow_mut() {
            seen.insert(id.to_owned(), Arc::clone(&series));
        }
        f(&series);
    }

    /// The series of `id` from the map every thread shares, and whether it is `id`'s own.
    fn shared_series(
        &self,
        shared: &RwLock<Shared>,
        id: &str,
        domain: &str,
        labels: impl FnOnce() -> Vec<(&'static str, String)>,
        overflow: impl FnOnce() -> Vec<(&'static str, String)>,
        names: &'static [&'static str; 5],
    ) -> (Arc<Series>, bool) {
        if let Some(series) = shared.read().unwrap_or_else(PoisonError::into_inner).admitted.get(id) {
            return (Arc::clone(series), true);
        }
        let mut shared = shared.write().unwrap_or_else(PoisonError::into_inner);
        let shared = &mut *shared;
        if let Some(series) = shared.admitted.get(id) {
            return (Arc::clone(series), true);
        }
        if shared.admitted.len() < self.max {
            let series = Series::new(labels(), names);
            shared.admitted.insert(id.to_owned(), Arc::clone(&series));
            return (series, true);
        }
        // Domains are the configuration's (an unknown one limits nothing), so these are few.
        let series =
            shared.overflow.entry(domain.to_owned()).or_insert_with(|| Series::new(overflow(), names));
        (Arc::clone(series), false)
    }
}

/// Calls `f` with an empty buffer this thread keeps for series ids: a known series is found
/// without allocating.
fn with_id<R>(f: impl FnOnce(&mut String) -> R) -> R {
    thread_local! {
        static ID: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    ID.with(|id| match id.try_borrow_mut() {
        Ok(mut id) => {
            id.clear();
            f(&mut id)
        }
        Err(_) => f(&mut String::new()),
    })
}

/// Upstream's Prometheus labels of a stat key path, as its mapping makes them: the stat name
/// `<domain>.<key path>` sanitised and split at its dots into `domain`, `key1` and, when there
/// are more levels, `key2` (deeper levels are not labelled).
pub fn upstream_labels(domain: &str, stat_path: &str) -> Vec<(&'static str, String)> {
    let name = sanitize_stat_name(&format!("{domain}.{stat_path}"));
    let mut parts = name.split('.');
    let mut labels = vec![("domain", parts.next().unwrap_or_default().to_owned())];
    labels.push(("key1", parts.next().unwrap_or_default().to_owned()));
    if let Some(key2) = parts.next() {
        labels.push(("key2", key2.to_owned()));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_names_are_sanitised_as_upstream() {
        assert_eq!(sanitize_stat_name("edge.remote_address_10.0.0.1"), "edge.remote_address_10_0_0_1");
        assert_eq!(sanitize_stat_name("a:b|c.1234.5.6.7.8"), "a_b_c.1234_5_6_7.8");
        assert_eq!(sanitize_stat_name("v1.2.3"), "v1.2.3");
        assert_eq!(
            upstream_labels("edge", "user.tier_gold.more"),
            vec![
                ("domain", "edge".to_owned()),
                ("key1", "user".to_owned()),
                ("key2", "tier_gold".to_owned())
            ]
        );
    }

    #[test]
    fn threads_keep_admitted_series_only() {
        let stats = Stats::new(1);
        let hits = Hits { hits: 1, shadow: false, over: false, near: false };
        let path = |entries| KeyPath { domain: "edge", entries, detailed: true, stat_path: "user" };
        let (a, b) = ([("user", "a")], [("user", "b")]);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..3 {
                        stats.count(path(&a), hits, &UpstreamCounts::default());
                        stats.count(path(&b), hits, &UpstreamCounts::default());
                    }
                });
            }
        });
        let mut stats = stats;
        let shared = stats.legacy.shared.get_mut().unwrap();
        assert_eq!(shared.admitted.keys().collect::<Vec<_>>(), ["edge\nuser_a"]);
        assert_eq!(shared.overflow.keys().collect::<Vec<_>>(), ["edge"]);
        let seen: Vec<Vec<String>> =
            stats.legacy.seen.iter_mut().map(|seen| seen.0.get_mut().keys().cloned().collect()).collect();
        // b's hits went to the overflow series, which no thread keeps: a stranger's label sets
        // past the bound cost no thread any memory.
        // (One map or two: a thread that ends hands its slot to the next.)
        assert!(!seen.is_empty() && seen.iter().all(|keys| keys == &["edge\nuser_a"]), "{seen:?}");
    }

    #[test]
    fn hits_are_split_as_upstreams_base_limiter_splits_them() {
        let c = |before, hits| UpstreamCounts::new(10, before, hits, 0.8, false);
        let counts = |c: UpstreamCounts| [c.over, c.near, c.within, c.shadow];
        assert_eq!(counts(c(0, 7)), [0, 0, 7, 0]);
        assert_eq!(counts(c(7, 2)), [0, 1, 2, 0]);
        assert_eq!(counts(c(8, 2)), [0, 2, 2, 0]);
        assert_eq!(counts(c(9, 3)), [2, 1, 0, 0]);
        assert_eq!(counts(c(5, 10)), [5, 2, 0, 0]);
        assert_eq!(counts(c(10, 4)), [4, 0, 0, 0]);
        assert_eq!(counts(UpstreamCounts::new(10, 9, 3, 0.8, true)), [2, 1, 0, 2]);
        assert_eq!(counts(UpstreamCounts::new(0, 0, 3, 0.8, false)), [3, 0, 0, 0]);
    }
}
