//! The names of the metrics the limiter records (through the `metrics` facade; the server
//! installs the Prometheus exporter). Labels are policy names and fixed words, so their number
//! stays bounded. A limiter registers its backend's metrics ([`BREAKER_OPEN`],
//! [`BACKEND_SECONDS`]) when it is built, and a policy its [`DECISIONS`] and [`NEAR_LIMIT`]
//! counters at its first decision (rather than looking them up by their labels at every one):
//! install the recorder before building the limiter.

/// Counter: decisions, by `policy` and `outcome` (`allowed`, `denied`, `shadow_denied`).
pub const DECISIONS: &str = "tollgate_decisions_total";
/// Counter: decisions answered without the primary backend, by `policy` and `failure_policy`.
pub const DEGRADED: &str = "tollgate_degraded_decisions_total";
/// Counter: admitted requests after which some rule of the policy is above 80 % of its limit.
pub const NEAR_LIMIT: &str = "tollgate_near_limit_total";
/// Counter: requests held by the `delay` strategy, by `policy` and `result` (`admitted`,
/// `denied`, `queue_full`).
pub const DELAYED: &str = "tollgate_delayed_total";
/// Histogram: seconds per primary-backend call, by `backend`.
pub const BACKEND_SECONDS: &str = "tollgate_backend_duration_seconds";
/// Counter: primary-backend failures, by `backend` and `kind` (`timeout`, `unavailable`, `error`).
pub const BACKEND_ERRORS: &str = "tollgate_backend_errors_total";
/// Gauge: 1 while the circuit breaker is open (the primary backend is bypassed), by `backend`.
pub const BREAKER_OPEN: &str = "tollgate_breaker_open";
/// Counter: reloads of a configuration file, by `config` (`file`: --config, `envoy`:
/// --envoy-config, or each response of --envoy-xds-server) and `result` (`applied`,
/// `refused`). Recorded by the `tollgate` binary.
pub const CONFIG_RELOADS: &str = "tollgate_config_reloads_total";
/// Gauge: 0 while the last change of a configuration file was refused (the running
/// configuration is not the file's), 1 otherwise; by `config`. Recorded by the `tollgate` binary.
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "tollgate_config_last_reload_successful";
/// Counter: keys the memory backend forgot before they expired, to stay within its
/// `max_keys`, by `backend` (`memory`, or `local_fallback` for the limiter's own fallback).
/// Recorded by `tollgate-core`; named here with the others.
pub const MEMORY_EVICTIONS: &str = tollgate_core::EVICTIONS_METRIC;
/// Counter: decisions answered from a reserved block, without a backend call (or with the call
/// that reserved the block), by `policy`.
pub const RESERVED_DECISIONS: &str = "tollgate_reserved_decisions_total";
/// Counter: reservations of a block, by `policy` and `result` (`taken`, `refused`).
pub const RESERVE_BLOCKS: &str = "tollgate_reserve_blocks_total";
/// Counter: unused reserved units given back to the backend, by `policy`.
pub const RESERVE_RETURNED: &str = "tollgate_reserve_returned_units_total";
/// Counter: reserved units that expired unused (their window ended, or they could not be
/// given back), by `policy`.
pub const RESERVE_EXPIRED: &str = "tollgate_reserve_expired_units_total";
