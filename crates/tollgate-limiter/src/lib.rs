//! Policies enforced against a backend, the way a service needs them: what to answer when the
//! backend fails (admit, refuse, or decide locally), a circuit breaker so a dead backend is not
//! paid for on every request, the `delay` strategy that holds a request until it fits, shadow
//! mode, and the [`decision_log`] (a line per refused request, sampled and capped). Knows
//! nothing of HTTP or of Redis: it drives any [`tollgate_core::Backend`].
//! Also the policy vocabulary every front end shares: consumer limits ([`SixPeriods`]) and the
//! [`keyspace`] of Tollgate's own keys.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
//! use tollgate_limiter::{Limiter, LimiterSettings, Policy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limiter = Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default());
//! let rules = RuleSet::new([Rule::fixed_window(1, Period::MINUTE)]).unwrap();
//! let policy = Policy::enforce("login", rules);
//!
//! assert!(limiter.check("alice", &policy, 1).await.unwrap().allowed());
//! let verdict = limiter.check("alice", &policy, 1).await.unwrap();
//! assert!(!verdict.allowed());
//! assert!(!verdict.degraded);
//! # }
//! ```

mod breaker;
pub mod decision_log;
pub mod keyspace;
mod limiter;
pub mod metrics;
mod policy;
pub mod reserve;
mod traced;

pub use breaker::BreakerState;
pub use decision_log::{DecisionLogError, DecisionLogSettings, LoggedKey};
pub use limiter::{Check, FailurePolicy, JointVerdict, LimitError, Limiter, LimiterSettings, Verdict};
pub use policy::{Mode, OnLimit, PERIODS, PeriodLimitError, Policy, Reserve, ReserveError, SixPeriods};
pub use reserve::ReserveStats;
