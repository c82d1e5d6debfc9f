//! The hit counters of limited descriptors, in Tollgate's names and in upstream's (the
//! Prometheus names its statsd_exporter mapping gives), with the bound on their label sets.
//!
//! A descriptor's label sets are a stranger's to choose (`detailed_metric`, `value_to_metric`
//! and a request's own limit put its values in them), so at most `max` of each family get a
//! series of their own; the hits of the rest are counted under [`OVERFLOW_KEY`]. A label set's
//! counters are registered with the recorder once and kept with it: registering one (building
//! the metric's key, hashing it, finding it in the registry) cost more than the rest of a
//! descriptor's answer, on every request.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use metrics::Counter;

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
    legacy: RwLock<Family>,
    upstream: RwLock<Family>,
}

/// One family's series: those admitted under the bound, by their id, and the overflow series
/// of each domain.
#[derive(Debug, Default)]
struct Family {
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
        Stats { max, legacy: RwLock::default(), upstream: RwLock::default() }
    }

    /// Counts a limited descriptor's hits in both families: Tollgate's every hit, then
    /// shadow-mode, over, near or within; upstream's as [`UpstreamCounts`] splits them.
    pub(crate) fn count(&self, path: KeyPath<'_>, hits: Hits, c: &UpstreamCounts) {
        let legacy = self.legacy_series(path);
        legacy.increment(0, hits.hits);
        let family = match (hits.over, hits.shadow) {
            (true, true) => 1,
            (true, false) => 2,
            (false, _) if hits.near => 3,
            (false, _) => 4,
        };
        legacy.increment(family, hits.hits);
        let series = self.upstream_series(path);
        for (family, by) in [hits.hits, c.over, c.near, c.within, c.shadow].into_iter().enumerate() {
            // Every family of a key path is registered, as upstream creates them together.
            series.increment(family, by);
        }
    }

    /// Tollgate's series of `path`: labelled `domain` and `descriptor` (the entry keys, or
    /// `key_value`s when detailed, joined by `.`).
    fn legacy_series(&self, path: KeyPath<'_>) -> Arc<Series> {
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
            self.series(&self.legacy, id, domain, labels, overflow, &LEGACY)
        })
    }

    /// Upstream's series of `path`: [`upstream_labels`] of its stat key path. Known by the
    /// path before sanitising (two paths that sanitise alike share one series, each taking a
    /// place under the bound).
    fn upstream_series(&self, path: KeyPath<'_>) -> Arc<Series> {
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
            self.series(&self.upstream, id, domain, labels, overflow, &UPSTREAM)
        })
    }

    /// The series of `id` in `family`: known, or new while there is room, or else the
    /// domain's overflow series.
    fn series(
        &self,
        family: &RwLock<Family>,
        id: &str,
        domain: &str,
        labels: impl FnOnce() -> Vec<(&'static str, String)>,
        overflow: impl FnOnce() -> Vec<(&'static str, String)>,
        names: &'static [&'static str; 5],
    ) -> Arc<Series> {
        // Known label sets, the usual case, only read.
        if let Some(series) = family.read().unwrap_or_else(PoisonError::into_inner).admitted.get(id) {
            return Arc::clone(series);
        }
        let mut family = family.write().unwrap_or_else(PoisonError::into_inner);
        let family = &mut *family;
        if let Some(series) = family.admitted.get(id) {
            return Arc::clone(series);
        }
        if family.admitted.len() < self.max {
            let series = Series::new(labels(), names);
            family.admitted.insert(id.to_owned(), Arc::clone(&series));
            return series;
        }
        // Domains are the configuration's (an unknown one limits nothing), so these are few.
        Arc::clone(family.overflow.entry(domain.to_owned()).or_insert_with(|| Series::new(overflow(), names)))
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
