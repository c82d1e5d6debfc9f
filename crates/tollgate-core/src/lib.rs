//! Tollgate's rate-limit engine. It owns:
//! - the rule model: [`Rule`], [`RuleKind`], [`RuleSet`] (validated and compiled once), with the
//!   bounds in [`limits`];
//! - the algorithms, as pure state machines (private), and the engine that runs an operation or
//!   a batch's group over their states in phases (private; batches are planned by
//!   [`BatchPlan`]);
//! - the [`Backend`] trait, its requests ([`Operation`], [`Part`]) and answers ([`Decision`]),
//!   clocks ([`Clock`]) and errors;
//! - the in-memory backend ([`MemoryBackend`]);
//! - the algorithms' Lua twins and the engine's Lua form, with their calling convention
//!   ([`script`]), for backends that run the engine inside Redis.
//!
//! It does no I/O: the Redis backend (`tollgate-redis`) connects, names keys and sends
//! [`script`]'s arguments; the limiter (`tollgate-limiter`) adds policies and failure handling.
//!
//! ```
//! use tollgate_core::{ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet};
//!
//! // 10 a second and 100 a minute, checked together: all or nothing.
//! let rules = RuleSet::new([
//!     Rule::fixed_window(10, Period::SECOND).named("second"),
//!     Rule::sliding_window_counter(100, Period::MINUTE).named("minute"),
//! ])?;
//! let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
//!
//! let decision = backend.execute_now("api-key-42", &rules, Operation::Check { cost: 4 })?;
//! assert!(decision.allowed());
//! assert_eq!(decision.remaining(), 6);
//! assert_eq!(decision.binding(&rules).name(), Some("second"));
//!
//! let denied = backend.execute_now("api-key-42", &rules, Operation::Check { cost: 7 })?;
//! assert!(!denied.allowed());
//! assert_eq!(denied.remaining(), 6); // a denied request consumes nothing
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod algorithm;
mod backend;
mod batch;
mod clock;
mod decision;
mod engine;
mod error;
pub mod footprint;
pub mod limits;
mod memory;
mod operation;
mod period;
mod plan;
mod rule;
mod ruleset;
pub mod script;

pub use backend::Backend;
pub use batch::Part;
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{Acquisition, Decision, Lease, LeaseId, LeaseIdError, RuleOutcome, RuleReport};
pub use error::{BoxError, Error, KeyError, RuleError};
pub use footprint::StateFootprint;
pub use memory::{
    DEFAULT_MAX_KEYS, EVICTIONS_METRIC, MIN_MAX_KEYS, MemoryBackend, MemoryBackendBuilder, MemoryConfigError,
};
pub use operation::{Operation, validate_key};
pub use period::{Period, PeriodError};
pub use plan::BatchPlan;
pub use rule::{AlgorithmName, Align, Rule, RuleKind};
pub use ruleset::RuleSet;

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
