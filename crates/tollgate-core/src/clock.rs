//! Time as the algorithms see it: a [`Timestamp`] read from a [`Clock`].
//!
//! Every algorithm takes `now` from a clock it is given, never from the system directly, so
//! tests move time by hand ([`ManualClock`]) instead of sleeping through windows.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: whole microseconds since the Unix epoch.
///
/// Microseconds because that is what Redis `TIME` gives, and because every value the algorithms
/// compute stays below 2^53, the largest integer a Lua number (a double) holds exactly; the Lua
/// twins of the algorithms therefore compute bit for bit what the Rust ones do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// The timestamp of a [`SystemTime`] (times before the epoch clamp to it).
    pub fn from_system_time(time: SystemTime) -> Self {
        let micros = time.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros();
        Timestamp(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// This timestamp moved `by` into the future (saturating).
    pub fn saturating_add(self, by: Duration) -> Self {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(by))
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let time = UNIX_EPOCH + Duration::from_micros(self.0);
        write!(f, "{}", humantime::format_rfc3339_micros(time))
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The production clock: monotonic, anchored to the wall clock once, at creation.
///
/// Clock-aligned windows need epoch time, but a wall clock can step backwards (NTP); this clock
/// reads the wall clock once and then only advances with a monotonic clock, so it never goes
/// back. The monotonic clock is `quanta`'s (governor's too): the CPU's invariant time-stamp
/// counter where it has one (a few instructions, against the hundred of `clock_gettime` behind
/// [`Instant`](std::time::Instant), on the path of every decision), `clock_gettime` elsewhere.
/// The counter's rate is calibrated once per process, in under a millisecond: measured here it
/// ran 1.5 parts per million slow against `Instant`, so a window is that much longer, and over a
/// long uptime the windows' alignment drifts from the wall clock by about 0.13 s a day.
#[derive(Clone, Debug)]
pub struct SystemClock {
    anchor_wall: Timestamp,
    monotonic: quanta::Clock,
    /// The counter's raw reading at `anchor_wall` (scaled to nanoseconds only as a difference).
    anchor: u64,
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    pub fn new() -> Self {
        let monotonic = quanta::Clock::new();
        SystemClock {
            anchor_wall: Timestamp::from_system_time(SystemTime::now()),
            anchor: monotonic.raw(),
            monotonic,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // The raw counter and one scaling of the difference: no `Duration`s on the way.
        let elapsed_nanos = self.monotonic.delta_as_nanos(self.anchor, self.monotonic.raw());
        Timestamp::from_micros(self.anchor_wall.as_micros().saturating_add(elapsed_nanos / 1_000))
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
/// let view = clock.clone();
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(view.now(), Timestamp::from_micros(1_250_000));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.as_micros())))
    }

    /// A clock stopped at the current wall-clock time, rounded down to a whole second (so that
    /// tests start on a realistic, epoch-sized timestamp and on a window boundary of any period
    /// that divides a second).
    pub fn at_wall_clock_second() -> Self {
        let now = Timestamp::from_system_time(SystemTime::now()).as_micros();
        Self::new(Timestamp::from_micros(now - now % 1_000_000))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to `to` (which may be earlier than the current time).
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.as_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_near_wall_clock_and_monotonic() {
        let clock = SystemClock::new();
        let wall = Timestamp::from_system_time(SystemTime::now());
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        assert!(a.as_micros().abs_diff(wall.as_micros()) < 5_000_000);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_micros(10));
        assert_eq!(clock.now().as_micros(), 10);
        clock.advance(Duration::from_micros(5));
        assert_eq!(clock.now().as_micros(), 15);
        clock.set(Timestamp::from_micros(3));
        assert_eq!(clock.now().as_micros(), 3);
    }
}
