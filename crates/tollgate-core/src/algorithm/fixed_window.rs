//! Fixed window: at most `limit` units per window of `period`.
//!
//! Windows either sit on multiples of the period since the Unix epoch (`Align::Clock`: every key
//! rolls over at the same instant, as most INCR+EXPIRE limiters do) or open at a key's first
//! request (`Align::FirstHit`, as OBP-API and rate-limiter-flexible do). Either way a caller can
//! spend a whole window's limit at its end and another at the start of the next: up to
//! `2 * limit` in a span of a little more than one period. The sliding-window rules exist for
//! callers to whom that matters.
//!
//! Lua twin: `fixed_window.lua`. Redis state: a hash `{s = window start, c = count}`.

use smallvec::smallvec;

use super::{
    Admission, Algorithm, Corrupt, Report, Stored, count_parameter, fields, floor_div, period_parameter,
    to_i64,
};
use crate::decision::LeaseId;
use crate::limits::MAX_COUNT;
use crate::{Align, Period};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    pub limit: u64,
    pub period: i64,
    pub align: Align,
}

/// The current window's start and count; a count of zero is no window at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    start: i64,
    count: u64,
}

impl FixedWindow {
    pub fn new(limit: u64, period: Period, align: Align) -> Self {
        FixedWindow { limit, period: to_i64(period.as_micros()), align }
    }

    /// The end of the current window, or of the one a request now would open.
    fn window_end(&self, s: &State, now: i64) -> i64 {
        match self.align {
            Align::FirstHit if s.count == 0 => now + self.period,
            _ => s.start + self.period,
        }
    }
}

impl Algorithm for FixedWindow {
    type State = State;
    const LUA_NAME: &'static str = "fixed_window";
    const LUA_SOURCE: &'static str = include_str!("fixed_window.lua");
    const HASH_FIELDS: Option<&'static [&'static str]> = Some(&["s", "c"]);

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn lua_parameters(&self) -> [i64; 4] {
        [to_i64(self.limit), self.period, i64::from(self.align == Align::FirstHit), 0]
    }

    fn refresh(&self, s: &mut State, now: i64) {
        match self.align {
            Align::Clock => {
                let start = floor_div(now, self.period) * self.period;
                if s.start != start {
                    *s = State { start, count: 0 };
                }
            }
            Align::FirstHit => {
                if s.count > 0 && now >= s.start + self.period {
                    *s = State::default();
                }
            }
        }
    }

    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        if s.count + probe <= self.limit {
            Admission::ADMIT
        } else {
            // A fresh window admits any cost up to the limit.
            Admission::wait(self.window_end(s, now) - now)
        }
    }

    fn consume(&self, s: &mut State, now: i64, n: u64, _lease: Option<&LeaseId>) {
        if self.align == Align::FirstHit && s.count == 0 {
            s.start = now;
        }
        s.count += n;
    }

    fn refund(&self, s: &mut State, _now: i64, n: u64) {
        s.count = s.count.saturating_sub(n);
    }

    fn report(&self, s: &State, now: i64) -> Report {
        Report {
            remaining: self.limit.saturating_sub(s.count),
            reset_after: if s.count > 0 { self.window_end(s, now) - now } else { 0 },
        }
    }

    fn expires_at(&self, s: &State) -> Option<i64> {
        (s.count > 0).then_some(s.start + self.period)
    }

    fn from_lua_parameters([limit, period, first_hit, _]: [i64; 4]) -> Option<Self> {
        let align = match first_hit {
            0 => Align::Clock,
            1 => Align::FirstHit,
            _ => return None,
        };
        Some(FixedWindow {
            limit: count_parameter(limit, MAX_COUNT)?,
            period: period_parameter(period)?,
            align,
        })
    }

    fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
        let [start, count] = fields(stored, "a fixed window's start or count")?;
        Ok(State { start, count: count as u64 })
    }

    fn encode(&self, s: &State, _previous: &Stored) -> Stored {
        Stored::Fields(smallvec![s.start, to_i64(s.count)])
    }
}
