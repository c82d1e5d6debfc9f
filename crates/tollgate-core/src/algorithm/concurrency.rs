//! Concurrency: at most `limit` units held at once, each under a lease that expires.
//!
//! `acquire` takes `cost` units under a fresh lease id and `release` gives them back. A lease
//! that is never released (its holder crashed) stops counting `lease` after it was taken, so
//! capacity cannot leak for longer than that.
//!
//! Lua twin: `concurrency.lua`. Redis state: a sorted set with two members per lease (never one
//! per unit), `"<lease id>"` and `"<lease id>=<units>"`, scored by the lease's expiry, and the
//! total of units held (see the `.lua` file).

use std::collections::BTreeMap;

use super::{
    Admission, Algorithm, Corrupt, Report, Stored, count_parameter, period_parameter, stored_integer, to_i64,
};
use crate::Period;
use crate::decision::LeaseId;
use crate::limits::{MAX_CONCURRENCY_LIMIT, MAX_COUNT};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Concurrency {
    pub limit: u64,
    pub lease: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    units: u64,
    expires_at: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    leases: BTreeMap<LeaseId, Held>,
    total: u64,
}

impl Concurrency {
    pub fn new(limit: u64, lease: Period) -> Self {
        Concurrency { limit, lease: to_i64(lease.as_micros()) }
    }
}

impl Algorithm for Concurrency {
    type State = State;
    const LUA_NAME: &'static str = "concurrency";
    const LUA_SOURCE: &'static str = include_str!("concurrency.lua");
    const HASH_FIELDS: Option<&'static [&'static str]> = None;
    const HOLDS_LEASES: bool = true;

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn lua_parameters(&self) -> [i64; 4] {
        [to_i64(self.limit), self.lease, 0, 0]
    }

    fn refresh(&self, s: &mut State, now: i64) {
        s.leases.retain(|_, held| held.expires_at > now);
        s.total = s.leases.values().map(|held| held.units).sum();
    }

    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        if s.total + probe <= self.limit {
            return Admission::ADMIT;
        }
        // Without releases, the cost fits once the `excess` soonest-expiring units have expired.
        let excess = s.total + probe - self.limit;
        let mut by_expiry: Vec<&Held> = s.leases.values().collect();
        by_expiry.sort_by_key(|held| held.expires_at);
        let mut seen = 0;
        for held in by_expiry {
            seen += held.units;
            if seen >= excess {
                return Admission::wait(held.expires_at - now);
            }
        }
        Admission::wait(self.lease) // unreachable: probe <= limit, so excess <= total
    }

    /// Takes the units under `lease`; without one, nothing.
    fn consume(&self, s: &mut State, now: i64, n: u64, lease: Option<&LeaseId>) {
        let Some(id) = lease else { return };
        s.leases.insert(id.clone(), Held { units: n, expires_at: now + self.lease });
        s.total += n;
    }

    fn release(&self, s: &mut State, _now: i64, id: &LeaseId, units: u64) {
        if let Some(held) = s.leases.get_mut(id) {
            let freed = units.min(held.units);
            held.units -= freed;
            s.total -= freed;
            if held.units == 0 {
                s.leases.remove(id);
            }
        }
    }

    fn report(&self, s: &State, now: i64) -> Report {
        Report {
            remaining: self.limit.saturating_sub(s.total),
            reset_after: Algorithm::expires_at(self, s).map_or(0, |t| t - now),
        }
    }

    fn expires_at(&self, s: &State) -> Option<i64> {
        s.leases.values().map(|held| held.expires_at).max()
    }

    fn from_lua_parameters([limit, lease, _, _]: [i64; 4]) -> Option<Self> {
        Some(Concurrency {
            limit: count_parameter(limit, MAX_CONCURRENCY_LIMIT)?,
            lease: period_parameter(lease)?,
        })
    }

    /// The leases from their `<id>=<units>` members (the `<id>` and `#<total>` members repeat
    /// what those say).
    fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
        let Stored::Members(members) = stored else {
            return Err(Corrupt("a hash where a sorted set was expected"));
        };
        let mut state = State::default();
        for (member, expiry) in members {
            let Some(eq) = member.iter().position(|&b| b == b'=') else { continue };
            let id = std::str::from_utf8(&member[..eq]).ok().and_then(|id| id.parse::<LeaseId>().ok());
            let units = std::str::from_utf8(&member[eq + 1..]).ok().and_then(|u| u.parse::<u64>().ok());
            let (Some(id), Some(units)) = (id, units.filter(|u| (1..=MAX_COUNT).contains(u))) else {
                return Err(Corrupt("a lease's member"));
            };
            if expiry.fract() != 0.0 || !expiry.is_finite() {
                return Err(Corrupt("a lease's expiry"));
            }
            let expires_at = stored_integer(*expiry as i64, "a lease's expiry")?;
            state.total += units;
            if state.total > crate::limits::MAX_EXACT {
                return Err(Corrupt("more units held than any limit"));
            }
            state.leases.insert(id, Held { units, expires_at });
        }
        Ok(state)
    }

    fn encode(&self, s: &State, _previous: &Stored) -> Stored {
        let mut out = Vec::with_capacity(2 * s.leases.len() + 1);
        for (id, held) in &s.leases {
            let expiry = held.expires_at as f64;
            out.push((id.as_str().as_bytes().to_vec(), expiry));
            out.push((format!("{id}={}", held.units).into_bytes(), expiry));
        }
        out.push((format!("#{}", s.total).into_bytes(), f64::INFINITY));
        Stored::Members(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_EXACT;

    /// A lease's `<id>=<units>` member, as the Lua twin writes it, with its expiry as score.
    fn member(units: u64, expiry: f64) -> (Vec<u8>, f64) {
        (format!("{}={units}", LeaseId::random()).into_bytes(), expiry)
    }

    /// What no Lua twin writes is refused: a fractional expiry, more units held than the
    /// engine's exact arithmetic allows. Up to that bound is read.
    #[test]
    fn a_stored_set_no_twin_could_write_is_corrupt() {
        let algorithm = Concurrency::new(10, Period::SECOND);
        let read = |members: Vec<(Vec<u8>, f64)>| algorithm.decode(&Stored::Members(members));
        assert_eq!(read(vec![member(1, 2.5)]), Err(Corrupt("a lease's expiry")));
        assert_eq!(read(vec![member(1, f64::INFINITY)]), Err(Corrupt("a lease's expiry")));
        assert_eq!(read(vec![member(3, 2e6)]).map(|s| s.leases.len()), Ok(1));

        // MAX_EXACT units in full leases of MAX_COUNT and one remainder, then one unit more.
        let full = MAX_EXACT / MAX_COUNT;
        let mut members: Vec<_> = (0..full).map(|_| member(MAX_COUNT, 2e6)).collect();
        members.push(member(MAX_EXACT % MAX_COUNT, 2e6));
        assert_eq!(read(members.clone()).map(|s| s.leases.len() as u64), Ok(full + 1));
        members.push(member(1, 2e6));
        assert_eq!(read(members), Err(Corrupt("more units held than any limit")));
    }
}
