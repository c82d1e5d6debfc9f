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

use std::collections::VecDeque;

use super::{
    Admission, Algorithm, Corrupt, Report, Stored, count_parameter, period_parameter, stored_integer, to_i64,
};
use crate::Period;
use crate::decision::LeaseId;
use crate::limits::MAX_LOG_LIMIT;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindowLog {
    pub limit: u64,
    pub period: i64,
}

/// Admitted units by time, and their total.
///
/// Times only grow along the log, so it is a queue: entries leave from the front, are made at
/// the back, and a ring buffer holds them in 16 bytes each, side by side (a B-tree took about
/// twice that, spread over nodes a decision walked down to reach either end).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// `(time, units)`, oldest first, one entry per distinct time.
    units: VecDeque<(i64, u64)>,
    total: u64,
}

impl SlidingWindowLog {
    pub fn new(limit: u64, period: Period) -> Self {
        SlidingWindowLog { limit, period: to_i64(period.as_micros()) }
    }

    fn newest(s: &State) -> Option<i64> {
        s.units.back().map(|&(time, _)| time)
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
        while let Some(&(time, units)) = s.units.front() {
            if time > now - self.period {
                break;
            }
            s.total -= units;
            s.units.pop_front();
        }
        // A log that was long once gives its room back when it is a quarter full, so a burst
        // does not hold memory for good (halving at a quarter keeps the cost amortised).
        if s.units.capacity() > MIN_KEPT_ROOM && s.units.len() < s.units.capacity() / 4 {
            s.units.shrink_to(s.units.len() * 2);
        }
    }

    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        if s.total + probe <= self.limit {
            return Admission::ADMIT;
        }
        // The cost fits once the oldest `excess` units have left the window.
        let excess = s.total + probe - self.limit;
        let mut seen = 0;
        for &(time, count) in &s.units {
            seen += count;
            if seen >= excess {
                return Admission::wait(time + self.period - now);
            }
        }
        Admission::wait(self.period) // unreachable: probe <= limit, so excess <= total
    }

    fn consume(&self, s: &mut State, now: i64, n: u64, _lease: Option<&LeaseId>) {
        let at = Self::newest(s).map_or(now, |newest| newest.max(now));
        match s.units.back_mut() {
            Some((newest, units)) if *newest == at => *units += n,
            _ => s.units.push_back((at, n)),
        }
        s.total += n;
    }

    /// Gives back the newest `n` units.
    fn refund(&self, s: &mut State, _now: i64, n: u64) {
        let mut left = n.min(s.total);
        s.total -= left;
        while left > 0 {
            let Some((_, units)) = s.units.back_mut() else { break };
            let taken = left.min(*units);
            *units -= taken;
            left -= taken;
            if *units == 0 {
                s.units.pop_back();
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

    fn from_lua_parameters([limit, period, _, _]: [i64; 4]) -> Option<Self> {
        Some(SlidingWindowLog {
            limit: count_parameter(limit, MAX_LOG_LIMIT)?,
            period: period_parameter(period)?,
        })
    }

    /// The base member's score, then each entry's running total (see the `.lua` file).
    fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
        let Stored::Members(members) = stored else {
            return Err(Corrupt("a hash where a sorted set was expected"));
        };
        let mut members = members.iter();
        let mut state = State::default();
        let Some((first, base)) = members.next() else { return Ok(state) };
        if first.as_slice() != BASE {
            return Err(Corrupt("a sliding log without its base member"));
        }
        let mut before = score(*base)?;
        for (member, total) in members {
            let time = std::str::from_utf8(member).ok().and_then(|t| t.parse::<i64>().ok());
            let time = stored_integer(
                time.ok_or(Corrupt("a sliding log entry's time"))?,
                "a sliding log entry's time",
            )?;
            let total = score(*total)?;
            let newest = Self::newest(&state);
            if total <= before || newest.is_some_and(|newest| newest >= time) {
                return Err(Corrupt("a sliding log out of order"));
            }
            state.units.push_back((time, (total - before) as u64));
            state.total += (total - before) as u64;
            before = total;
        }
        Ok(state)
    }

    /// Keeps the scores of the entries that did not change: the oldest entry keeps its score
    /// when it was stored before with the same units, and the base follows from it (as the Lua
    /// moves the base up when it drops entries), unless the totals pass [`REBASE_AT`].
    fn encode(&self, s: &State, previous: &Stored) -> Stored {
        let previous = match previous {
            Stored::Members(members) => members.as_slice(),
            Stored::Fields(_) => &[],
        };
        let mut base = previous.first().map_or(0.0, |(_, score)| *score);
        if let Some(&(oldest, units)) = s.units.front() {
            let name = oldest.to_string();
            if let Some((_, total)) = previous.iter().find(|(member, _)| member.as_slice() == name.as_bytes())
            {
                base = total - units as f64;
            }
        }
        if base < 0.0 || base + s.total as f64 >= REBASE_AT {
            base = 0.0;
        }
        let mut out = Vec::with_capacity(s.units.len() + 1);
        out.push((BASE.to_vec(), base));
        let mut total = base;
        for &(time, units) in &s.units {
            total += units as f64;
            out.push((time.to_string().into_bytes(), total));
        }
        Stored::Members(out)
    }
}

/// Entries a log keeps room for however short it gets (a quarter of a kilobyte).
const MIN_KEPT_ROOM: usize = 16;

/// The base member of a log (see the `.lua` file).
const BASE: &[u8] = b"b";

/// Running totals are rebased to 0 beyond this, as the Lua twin does (`REBASE_AT`).
const REBASE_AT: f64 = (1u64 << 50) as f64;

/// A running total read back: a whole number below 2^53.
fn score(value: f64) -> Result<i64, Corrupt> {
    if value.fract() != 0.0 || !(0.0..=crate::limits::MAX_EXACT as f64).contains(&value) {
        return Err(Corrupt("a sliding log's running total"));
    }
    Ok(value as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(members: &[(&str, f64)]) -> Stored {
        Stored::Members(members.iter().map(|(m, s)| (m.as_bytes().to_vec(), *s)).collect())
    }

    fn state(units: &[(i64, u64)]) -> State {
        State { units: units.iter().copied().collect(), total: units.iter().map(|(_, u)| u).sum() }
    }

    /// A log that grew long in a burst gives its room back once most of it has left the
    /// window, and still counts exactly.
    #[test]
    fn a_log_drained_after_a_burst_gives_its_room_back() {
        let algorithm = SlidingWindowLog::new(1_000, Period::SECOND);
        let mut s = State::default();
        for t in 0..1_000 {
            algorithm.consume(&mut s, t, 1, None);
        }
        assert!(s.units.capacity() >= 1_000);
        // 10 microseconds' entries (990..999) are still in the window at 1,000,989.
        algorithm.refresh(&mut s, 1_000_989);
        assert_eq!((s.units.len(), s.total), (10, 10));
        assert!(s.units.capacity() < 64, "room kept: {}", s.units.capacity());
        assert_eq!(algorithm.report(&s, 1_000_989).remaining, 990);
        assert_eq!(SlidingWindowLog::newest(&s), Some(999));
    }

    /// Entries whose running totals do not grow, or whose times do not, no twin wrote.
    #[test]
    fn a_log_out_of_order_is_corrupt() {
        let algorithm = SlidingWindowLog::new(10, Period::SECOND);
        let out_of_order = Err(Corrupt("a sliding log out of order"));
        assert_eq!(algorithm.decode(&log(&[("b", 10.0), ("5", 10.0)])), out_of_order);
        assert_eq!(algorithm.decode(&log(&[("b", 0.0), ("5", 1.0), ("4", 2.0)])), out_of_order);
        assert_eq!(
            algorithm.decode(&log(&[("b", 10.0), ("4", 11.0), ("5", 13.0)])),
            Ok(state(&[(4, 1), (5, 2)]))
        );
        // A running total is a whole number in 0..=2^53 - 1.
        let total = Err(Corrupt("a sliding log's running total"));
        for bad in [0.5, -1.0, 2f64.powi(53)] {
            assert_eq!(algorithm.decode(&log(&[("b", bad)])), total, "{bad}");
        }
    }

    /// An entry kept keeps its score (the base follows it, as the Lua moves the base up), so
    /// a module writes only what changed; the totals are rebased to 0 past REBASE_AT.
    #[test]
    fn entries_kept_keep_their_scores() {
        let algorithm = SlidingWindowLog::new(10, Period::SECOND);
        // 4 dropped, 5 kept, 6 added.
        let previous = log(&[("b", 100.0), ("4", 101.0), ("5", 103.0)]);
        let encoded = algorithm.encode(&state(&[(5, 2), (6, 4)]), &previous);
        assert_eq!(encoded, log(&[("b", 101.0), ("5", 103.0), ("6", 107.0)]));

        let high = log(&[("b", REBASE_AT - 2.0), ("5", REBASE_AT - 1.0)]);
        assert_eq!(
            algorithm.encode(&state(&[(5, 1), (6, 1)]), &high),
            log(&[("b", 0.0), ("5", 1.0), ("6", 2.0)])
        );
        assert_eq!(algorithm.encode(&state(&[]), &log(&[("b", REBASE_AT)])), log(&[("b", 0.0)]));
    }
}
