//! A circuit breaker over the primary backend: after `threshold` failures in a row it opens, so
//! requests stop paying the backend's timeout, and a background probe closes it again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Whether the primary backend is being used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests go to the primary backend.
    Closed,
    /// The primary backend failed; requests get the failure policy until a probe succeeds.
    Open,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    failures: AtomicU32,
    open: AtomicBool,
    probing: AtomicBool,
}

impl Breaker {
    pub(crate) fn new(threshold: u32) -> Self {
        Breaker {
            threshold: threshold.max(1),
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        if self.open.load(Ordering::Acquire) { BreakerState::Open } else { BreakerState::Closed }
    }

    pub(crate) fn record_success(&self) {
        // A plain store would be a write on every decision; read first, it is almost always 0.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a failure; true when this one opened the breaker.
    pub(crate) fn record_failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }

    /// True for the one caller that should start the probe.
    pub(crate) fn start_probe(&self) -> bool {
        !self.probing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn probe_ended(&self) {
        self.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_failures_in_a_row() {
        let b = Breaker::new(3);
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        b.record_success();
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.record_failure(), "third in a row opens");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.record_failure(), "only one caller sees the opening");
        b.close();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn one_probe_at_a_time() {
        let b = Breaker::new(1);
        assert!(b.start_probe());
        assert!(!b.start_probe());
        b.probe_ended();
        assert!(b.start_probe());
    }
}
