//! Tollgate's rate-limit engine: rules, decisions, clocks, the algorithms, and the in-memory
//! backend. No I/O: the Redis backend (`tollgate-redis`) runs the same algorithms' Lua twins,
//! which live here beside their Rust forms (see [`algorithm::lua`]).
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
//! assert_eq!(decision.binding().name.as_deref(), Some("second"));
//!
//! let denied = backend.execute_now("api-key-42", &rules, Operation::Check { cost: 7 })?;
//! assert!(!denied.allowed());
//! assert_eq!(denied.remaining(), 6); // a denied request consumes nothing
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod algorithm;
mod backend;
mod batch;
mod clock;
mod decision;
mod error;
pub mod footprint;
pub mod limits;
mod memory;
mod operation;
mod period;
mod rule;
mod ruleset;

pub use backend::Backend;
pub use batch::{Part, groups, validate_batch};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{Acquisition, Decision, Lease, LeaseId, LeaseIdError, RuleOutcome};
pub use error::{BoxError, Error, KeyError, RuleError};
pub use footprint::StateFootprint;
pub use memory::{
    DEFAULT_MAX_KEYS, EVICTIONS_METRIC, MIN_MAX_KEYS, MemoryBackend, MemoryBackendBuilder, MemoryConfigError,
};
pub use operation::{Operation, validate_key};
pub use period::{Period, PeriodError};
pub use rule::{Algorithm, Align, Rule, RuleKind};
pub use ruleset::{RuleSet, StateSlot};

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
