//! Token bucket: `capacity` tokens, full at first, refilled continuously at `refill` per `per`.
//!
//! A token bucket and GCRA are one algorithm seen from two sides: a bucket refilled at one
//! token per `T = per / refill` holding `capacity` tokens admits exactly what GCRA with emission
//! interval `T` and a burst of `capacity` admits. So the bucket is computed by `gcra.rs` (and, in
//! Redis, by `gcra.lua`): its state is the instant the bucket will be full again, which makes
//! refill exact to a fraction of a microsecond. Published scripts that store a token count and
//! add `floor(elapsed * rate)` lose the fraction on every call; a client calling more often than
//! once per token then never sees a refill at all.

use super::gcra::{Gcra, Inexact};
use crate::Period;

pub(crate) fn compile(capacity: u64, refill: u64, per: Period) -> Result<Gcra, Inexact> {
    Gcra::new(capacity, per.as_micros(), refill)
}
