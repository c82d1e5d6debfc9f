//! A circuit breaker over the primary backend: after `threshold` failures in a row it opens, so
//! requests stop paying the backend's timeout, and a background probe closes it again.
//!
//! "In a row" means one attempt after another: calls that were in flight together when one
//! fault hit them all count as one failure. A connection to Redis dropped under load fails
//! every call on it at once (a coalesced batch fails all its callers), and the client has
//! reconnected by the next call; counted one by one, that single blip opened the breaker and
//! gave a whole probe interval of degraded answers (113 in the drop test, issue 18). A backend
//! that is really down still opens it: each new attempt fails again, `threshold` times.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

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
    /// Failures counted so far, ever: a call takes it as its [`ticket`](Self::ticket) when it
    /// starts, and its failure counts only if none was counted since.
    counted: AtomicU64,
    open: AtomicBool,
    probing: AtomicBool,
}

impl Breaker {
    pub(crate) fn new(threshold: u32) -> Self {
        Breaker {
            threshold: threshold.max(1),
            failures: AtomicU32::new(0),
            counted: AtomicU64::new(0),
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

    /// What a call takes before it asks the backend, to hand to
    /// [`record_failure`](Self::record_failure) if it fails.
    pub(crate) fn ticket(&self) -> u64 {
        self.counted.load(Ordering::Acquire)
    }

    /// Counts the failure of a call that started with `ticket`, unless a failure was counted
    /// since it started (the same fault, seen by another call in flight with it); true when
    /// this one opened the breaker.
    pub(crate) fn record_failure(&self, ticket: u64) -> bool {
        if self.counted.compare_exchange(ticket, ticket + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
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

    /// A call that starts, then fails.
    fn fail(b: &Breaker) -> bool {
        b.record_failure(b.ticket())
    }

    #[test]
    fn opens_after_threshold_failures_in_a_row() {
        let b = Breaker::new(3);
        assert!(!fail(&b));
        assert!(!fail(&b));
        b.record_success();
        assert!(!fail(&b));
        assert!(!fail(&b));
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(fail(&b), "third in a row opens");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!fail(&b), "only one caller sees the opening");
        b.close();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn calls_in_flight_together_when_a_fault_hits_count_it_once() {
        let b = Breaker::new(3);
        // Eight calls in flight when the connection drops: one failure, not eight.
        let tickets: Vec<u64> = (0..8).map(|_| b.ticket()).collect();
        assert!(tickets.iter().all(|&t| !b.record_failure(t)));
        assert_eq!(b.state(), BreakerState::Closed);
        // Calls started after it that fail too are the next failures in a row.
        let (second, third) = (b.ticket(), b.ticket());
        assert!(!b.record_failure(second));
        assert!(!b.record_failure(third), "started with the second: the same fault");
        assert!(fail(&b), "a third attempt, after the second failed, opens");
        assert_eq!(b.state(), BreakerState::Open);
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
