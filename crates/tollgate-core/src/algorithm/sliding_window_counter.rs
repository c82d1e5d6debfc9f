//! Sliding window counter: about `limit` units per sliding `period`, in constant space.
//!
//! Counts are kept per clock-aligned window. The count over the sliding period ending now is
//! estimated as the previous window's count weighted by the share of it the sliding period
//! still covers, plus the current window's count (the approximation Cloudflare describes):
//!
//! `estimate = previous * (period - elapsed) / period + current`
//!
//! and a cost is admitted while `estimate + cost <= limit`.
//!
//! **Error bound.** The estimate assumes the previous window's units were spread evenly. It is
//! exact when they were; it is off by at most `previous` units otherwise. So: no clock window
//! ever holds more than `limit` units, and any sliding period holds fewer than `2 * limit`
//! (reached only when the previous window's units all came at its very end); with traffic
//! spread over the window the overshoot is a small fraction of `limit`. Use
//! `sliding_window_log` where exactness matters more than memory.
//!
//! The estimate is a double, computed in the same order by this module and its Lua twin (IEEE
//! arithmetic is deterministic), so both backends decide alike to the last unit.
//!
//! Lua twin: `sliding_window_counter.lua`. Redis state: a hash `{s = window start, p = previous
//! window's count, c = current window's count}`.

use smallvec::smallvec;

use super::{
    Admission, Algorithm, Corrupt, Report, Stored, count_parameter, fields, floor_div, period_parameter,
    to_i64,
};
use crate::Period;
use crate::decision::LeaseId;
use crate::limits::MAX_COUNT;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindowCounter {
    pub limit: u64,
    pub period: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    start: i64,
    previous: u64,
    current: u64,
}

impl SlidingWindowCounter {
    pub fn new(limit: u64, period: Period) -> Self {
        SlidingWindowCounter { limit, period: to_i64(period.as_micros()) }
    }

    /// Rolls `s` over to the window holding `at`.
    fn roll(&self, s: &State, at: i64) -> State {
        let start = floor_div(at, self.period) * self.period;
        if s.start == start {
            s.clone()
        } else if s.start == start - self.period {
            State { start, previous: s.current, current: 0 }
        } else {
            State { start, previous: 0, current: 0 }
        }
    }

    fn estimate(&self, s: &State, at: i64) -> f64 {
        let weight = (self.period - (at - s.start)) as f64 / self.period as f64;
        s.previous as f64 * weight + s.current as f64
    }

    fn admits_at(&self, s: &State, at: i64, probe: u64) -> bool {
        let rolled = self.roll(s, at);
        self.estimate(&rolled, at) + probe as f64 <= self.limit as f64
    }
}

impl Algorithm for SlidingWindowCounter {
    type State = State;
    const LUA_NAME: &'static str = "sliding_window_counter";
    const LUA_SOURCE: &'static str = include_str!("sliding_window_counter.lua");
    const HASH_FIELDS: Option<&'static [&'static str]> = Some(&["s", "p", "c"]);

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn lua_parameters(&self) -> [i64; 4] {
        [to_i64(self.limit), self.period, 0, 0]
    }

    fn refresh(&self, s: &mut State, now: i64) {
        *s = self.roll(s, now);
    }

    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        // Refreshed to `now` (as every state is before it decides): no roll to make first.
        if self.estimate(s, now) + probe as f64 <= self.limit as f64 {
            return Admission::ADMIT;
        }
        // Solve the estimate for the first admitting instant: within this window while the
        // current count leaves room, else in the next one (where this window's count becomes
        // the weighted previous one). Two windows on, the estimate is zero and any cost fits.
        let budget = (self.limit - probe) as f64;
        let period = self.period as f64;
        let at = if s.current as f64 <= budget {
            (s.start + self.period) as f64 - (budget - s.current as f64) * period / s.previous as f64
        } else {
            (s.start + 2 * self.period) as f64 - budget * period / s.current as f64
        };
        let mut at = (at.ceil() as i64).max(now);
        // The solution is exact up to rounding; step past any rounding by whole microseconds.
        for _ in 0..8 {
            if self.admits_at(s, at, probe) {
                break;
            }
            at += 1;
        }
        Admission::wait(at - now)
    }

    fn consume(&self, s: &mut State, _now: i64, n: u64, _lease: Option<&LeaseId>) {
        s.current += n;
    }

    /// Gives back `n` units, from the current window first.
    fn refund(&self, s: &mut State, _now: i64, n: u64) {
        let from_current = n.min(s.current);
        s.current -= from_current;
        s.previous = s.previous.saturating_sub(n - from_current);
    }

    fn report(&self, s: &State, now: i64) -> Report {
        let left = (self.limit as f64 - self.estimate(s, now)).floor().max(0.0);
        Report { remaining: left as u64, reset_after: self.expires_at(s).map_or(0, |t| t - now) }
    }

    /// The estimate reaches zero when the last window holding units has slid out.
    fn expires_at(&self, s: &State) -> Option<i64> {
        if s.current > 0 {
            Some(s.start + 2 * self.period)
        } else if s.previous > 0 {
            Some(s.start + self.period)
        } else {
            None
        }
    }

    fn from_lua_parameters([limit, period, _, _]: [i64; 4]) -> Option<Self> {
        Some(SlidingWindowCounter {
            limit: count_parameter(limit, MAX_COUNT)?,
            period: period_parameter(period)?,
        })
    }

    fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
        let [start, previous, current] = fields(stored, "a sliding window counter's start or counts")?;
        Ok(State { start, previous: previous as u64, current: current as u64 })
    }

    fn encode(&self, s: &State, _previous: &Stored) -> Stored {
        Stored::Fields(smallvec![s.start, to_i64(s.previous), to_i64(s.current)])
    }
}
