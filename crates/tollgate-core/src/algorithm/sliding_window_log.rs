//! Sliding window log: exactly at most `limit` units in any interval of `period`.
//!
//! The log keeps the time of every admitted unit for one period, so it never admits more than
//! `limit` in any sliding period, at the price of up to one entry per unit when units come one
//! per microsecond (hence [`MAX_LOG_LIMIT`](crate::limits::MAX_LOG_LIMIT)). An entry made at `t`
//! counts while `now < t + period`.
//!
//! The log counts units per time: one entry per distinct microsecond, never one per unit, so a
//! check of any cost adds at most one entry and a log holds at most `min(limit, period in
//! microseconds)` entries (see [`RuleSet::worst_case_state`](crate::RuleSet::worst_case_state)).
//! Entries are made at `max(now, newest entry)`: times only grow along the log, which the Lua
//! twin's running totals rely on, and a clock stepping back cannot date units earlier.
//!
//! Lua twin: `sliding_window_log.lua`. Redis state: a sorted set of one member per entry, its
//! time, scored by the running total of units admitted through it, and a base member scored by
//! the running total before the oldest entry (see the `.lua` file for why).

use std::collections::BTreeMap;

use super::{Admission, Algorithm, Report, to_i64};
use crate::Period;
use crate::decision::LeaseId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindowLog {
    pub limit: u64,
    pub period: i64,
}

/// Admitted units by time, and their total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    units: BTreeMap<i64, u64>,
    total: u64,
}

impl SlidingWindowLog {
    pub fn new(limit: u64, period: Period) -> Self {
        SlidingWindowLog { limit, period: to_i64(period.as_micros()) }
    }

    fn newest(s: &State) -> Option<i64> {
        s.units.last_key_value().map(|(&time, _)| time)
    }
}

impl Algorithm for SlidingWindowLog {
    type State = State;
    const LUA_NAME: &'static str = "sliding_window_log";
    const LUA_SOURCE: &'static str = include_str!("sliding_window_log.lua");
    const HASH_FIELDS: Option<&'static [&'static str]> = None;

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn lua_parameters(&self) -> [i64; 4] {
        [to_i64(self.limit), self.period, 0, 0]
    }

    fn refresh(&self, s: &mut State, now: i64) {
        // Entries at or before `now - period` have left the window.
        while let Some(oldest) = s.units.first_entry() {
            if *oldest.key() > now - self.period {
                break;
            }
            s.total -= oldest.remove();
        }
    }

    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        if s.total + probe <= self.limit {
            return Admission::ADMIT;
        }
        // The cost fits once the oldest `excess` units have left the window.
        let excess = s.total + probe - self.limit;
        let mut seen = 0;
        for (&time, &count) in &s.units {
            seen += count;
            if seen >= excess {
                return Admission::wait(time + self.period - now);
            }
        }
        Admission::wait(self.period) // unreachable: probe <= limit, so excess <= total
    }

    fn consume(&self, s: &mut State, now: i64, n: u64, _lease: Option<&LeaseId>) {
        let at = Self::newest(s).map_or(now, |newest| newest.max(now));
        *s.units.entry(at).or_default() += n;
        s.total += n;
    }

    /// Gives back the newest `n` units.
    fn refund(&self, s: &mut State, _now: i64, n: u64) {
        let mut left = n.min(s.total);
        s.total -= left;
        while left > 0 {
            let Some(mut newest) = s.units.last_entry() else { break };
            let taken = left.min(*newest.get());
            *newest.get_mut() -= taken;
            left -= taken;
            if *newest.get() == 0 {
                newest.remove();
            }
        }
    }

    fn report(&self, s: &State, now: i64) -> Report {
        Report {
            remaining: self.limit.saturating_sub(s.total),
            reset_after: Self::newest(s).map_or(0, |t| t + self.period - now),
        }
    }

    fn expires_at(&self, s: &State) -> Option<i64> {
        Self::newest(s).map(|t| t + self.period)
    }
}
