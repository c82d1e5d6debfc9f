//! GCRA, the generic cell rate algorithm, with exact rational time; also the engine of the
//! token bucket (see `token_bucket.rs`).
//!
//! One unit is emitted every `T = period / rate`; a bucket of `capacity` units is full when idle.
//! Instead of a token count the state is the *theoretical arrival time* `tat`: the instant the
//! bucket will be full again. At `now` the bucket holds `capacity - (tat - now) / T` units; a
//! cost `n` is admitted if `max(tat, now) + n*T - now <= capacity*T`, and then `tat` becomes
//! `max(tat, now) + n*T`. No refill loop, no stored token count, nothing lost to `floor()`.
//!
//! `T` is rarely a whole number of microseconds (1 s / 3), so times are kept exactly as a whole
//! number of microseconds plus a fraction `frac / den` of one, where `T = num / den` reduced.
//! Every product stays below 2^53 (checked when the rule is built), so the Lua twin, whose
//! numbers are doubles, computes the same values.
//!
//! Lua twin: `gcra.lua`. Redis state: a hash `{t = tat's whole microseconds, f = its fraction}`.

use std::cmp::Ordering;

use smallvec::smallvec;

use super::{Admission, Algorithm, Corrupt, Report, Stored, count_parameter, fields, to_i64};
use crate::decision::LeaseId;
use crate::limits::{MAX_COUNT, MAX_EXACT, MAX_FILL_MICROS};

/// A span or instant: `whole + frac / den` microseconds, `0 <= frac < den`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Micros {
    whole: i64,
    frac: i64,
}

/// In order of `whole`, then `frac`: compared as one 128-bit number (`frac` is never negative),
/// without the branches of a field-by-field comparison; a decision compares several.
impl Ord for Micros {
    fn cmp(&self, other: &Micros) -> Ordering {
        self.wide().cmp(&other.wide())
    }
}

impl PartialOrd for Micros {
    fn partial_cmp(&self, other: &Micros) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Micros {
    const ZERO: Micros = Micros { whole: 0, frac: 0 };

    fn whole(whole: i64) -> Micros {
        Micros { whole, frac: 0 }
    }

    /// `whole * 2^64 + frac`, ordered as `self` is.
    fn wide(self) -> i128 {
        (i128::from(self.whole) << 64) | i128::from(self.frac as u64)
    }

    /// The smallest whole number of microseconds at or after this.
    fn ceil(self) -> i64 {
        self.whole + i64::from(self.frac > 0)
    }
}

/// Parameters whose exact arithmetic would not fit in 53 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Inexact;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    pub capacity: u64,
    /// `T = quotient + remainder / den` microseconds.
    quotient: i64,
    remainder: i64,
    den: i64,
    /// `T * den`, the reduced numerator.
    num: i64,
    /// `T` and `capacity * T`, kept: every decision asks for them, and working them out takes
    /// divisions.
    interval: Micros,
    full: Micros,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// When the bucket is full again; zero when it is full now.
    tat: Micros,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Gcra {
    /// A bucket of `capacity` units refilled at `units` per `per_micros` microseconds.
    pub fn new(capacity: u64, per_micros: u64, units: u64) -> Result<Gcra, Inexact> {
        let g = gcd(per_micros, units);
        let (num, den) = (per_micros / g, units / g);
        let exact = u128::from(capacity) * u128::from(den) <= u128::from(MAX_EXACT)
            && u128::from(capacity) * u128::from(num) / u128::from(den) <= u128::from(MAX_FILL_MICROS);
        if !exact {
            return Err(Inexact);
        }
        let (num, den) = (to_i64(num), to_i64(den));
        Ok(Gcra::with_interval(capacity, num / den, num % den, den, num))
    }

    /// The rule of `capacity` units and `T = quotient + remainder / den = num / den`, whose
    /// bounds the caller has checked.
    fn with_interval(capacity: u64, quotient: i64, remainder: i64, den: i64, num: i64) -> Gcra {
        let mut gcra = Gcra {
            capacity,
            quotient,
            remainder,
            den,
            num,
            interval: Micros { whole: quotient, frac: remainder },
            full: Micros::ZERO,
        };
        gcra.full = gcra.times_exactly(capacity);
        gcra
    }

    /// Whether `T` is a whole number of microseconds (the common rule: 1,000 a second is one
    /// every 1,000 µs), so that every time is whole (`frac` is below `den`, 1) and the phases
    /// can skip the fractions' carries and the general division; they compute the same values.
    #[inline(always)]
    fn whole(&self) -> bool {
        self.den == 1
    }

    /// `k * T`, exactly.
    fn times(&self, k: u64) -> Micros {
        // The common costs, without a division.
        match k {
            1 => self.interval,
            _ if k == self.capacity => self.full,
            _ => self.times_exactly(k),
        }
    }

    fn times_exactly(&self, k: u64) -> Micros {
        let k = to_i64(k);
        let parts = k * self.remainder;
        Micros { whole: k * self.quotient + parts / self.den, frac: parts % self.den }
    }

    fn add(&self, a: Micros, b: Micros) -> Micros {
        let frac = a.frac + b.frac;
        let carry = i64::from(frac >= self.den);
        Micros { whole: a.whole + b.whole + carry, frac: frac - carry * self.den }
    }

    /// `a - b`, for `a >= b`.
    fn sub(&self, a: Micros, b: Micros) -> Micros {
        let frac = a.frac - b.frac;
        let borrow = i64::from(frac < 0);
        Micros { whole: a.whole - b.whole - borrow, frac: frac + borrow * self.den }
    }

    /// Time until the bucket is full: `max(tat - now, 0)`.
    fn debt(&self, s: &State, now: i64) -> Micros {
        let now = Micros::whole(now);
        if s.tat > now { self.sub(s.tat, now) } else { Micros::ZERO }
    }

    /// `T` as `[quotient, remainder, den]`: `quotient + remainder / den` microseconds.
    pub fn interval(&self) -> [i64; 3] {
        [self.quotient, self.remainder, self.den]
    }

    // The phases with fractions of a microsecond, for any `T` (the Lua twin's arithmetic): out
    // of line, so that the phases' whole case is small enough to inline.

    #[inline(never)]
    fn decide_exact(&self, s: &State, now: i64, probe: u64) -> Admission {
        let needed = self.add(self.debt(s, now), self.times(probe));
        let room = self.full;
        if needed <= room { Admission::ADMIT } else { Admission::wait(self.sub(needed, room).ceil()) }
    }

    #[inline(never)]
    fn consume_exact(&self, s: &mut State, now: i64, n: u64) {
        let debt = self.add(self.debt(s, now), self.times(n));
        s.tat = self.add(debt, Micros::whole(now));
    }

    #[inline(never)]
    fn report_exact(&self, s: &State, now: i64) -> Report {
        let debt = self.debt(s, now);
        Report { remaining: self.capacity - self.units_owed(debt), reset_after: debt.ceil() }
    }

    /// Units short of full: the smallest `k` with `k * T >= debt`, at most `capacity`.
    fn units_owed(&self, debt: Micros) -> u64 {
        if debt >= self.full {
            return self.capacity;
        }
        // `debt / T = (whole * den + frac) / num`, rounded up (every figure is at least zero).
        // Below `capacity * T` the numerator is below `capacity * num`, which fits in 64 bits
        // for every rule but those of huge capacities and intervals with large denominators;
        // those divide in 128 bits.
        let [whole, frac, den, num] = [debt.whole, debt.frac, self.den, self.num].map(i64::unsigned_abs);
        let owed = match whole.checked_mul(den).and_then(|d| d.checked_add(frac)) {
            Some(scaled) => scaled.div_ceil(num),
            None => {
                let scaled = u128::from(whole) * u128::from(den) + u128::from(frac);
                u64::try_from(scaled.div_ceil(u128::from(num))).unwrap_or(u64::MAX)
            }
        };
        owed.min(self.capacity)
    }
}

impl Algorithm for Gcra {
    type State = State;
    const LUA_NAME: &'static str = "gcra";
    const LUA_SOURCE: &'static str = include_str!("gcra.lua");
    const HASH_FIELDS: Option<&'static [&'static str]> = Some(&["t", "f"]);

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn lua_parameters(&self) -> [i64; 4] {
        let [quotient, remainder, den] = self.interval();
        [to_i64(self.capacity), quotient, remainder, den]
    }

    fn refresh(&self, s: &mut State, now: i64) {
        if s.tat <= Micros::whole(now) {
            s.tat = Micros::ZERO;
        }
    }

    #[inline]
    fn decide(&self, s: &State, now: i64, probe: u64) -> Admission {
        if self.whole() {
            let needed = (s.tat.whole - now).max(0) + self.times(probe).whole;
            let room = self.full.whole;
            return if needed <= room { Admission::ADMIT } else { Admission::wait(needed - room) };
        }
        self.decide_exact(s, now, probe)
    }

    #[inline]
    fn consume(&self, s: &mut State, now: i64, n: u64, _lease: Option<&LeaseId>) {
        if self.whole() {
            s.tat.whole = s.tat.whole.max(now) + self.times(n).whole;
            return;
        }
        self.consume_exact(s, now, n);
    }

    fn refund(&self, s: &mut State, now: i64, n: u64) {
        // The debt is at most `capacity` units: giving back more fills the bucket just the
        // same, and keeps `times` within the bounds its exactness was checked for.
        let n = n.min(self.capacity);
        let (debt, back) = (self.debt(s, now), self.times(n));
        s.tat = if debt > back { self.add(self.sub(debt, back), Micros::whole(now)) } else { Micros::ZERO };
    }

    #[inline]
    fn report(&self, s: &State, now: i64) -> Report {
        if self.whole() {
            let debt = (s.tat.whole - now).max(0);
            // `T` is `num` whole microseconds: the units owed are `debt / T`, rounded up.
            let owed = if debt >= self.full.whole {
                self.capacity
            } else {
                debt.unsigned_abs().div_ceil(self.num.unsigned_abs())
            };
            return Report { remaining: self.capacity - owed, reset_after: debt };
        }
        self.report_exact(s, now)
    }

    fn expires_at(&self, s: &State) -> Option<i64> {
        match s.tat.cmp(&Micros::ZERO) {
            Ordering::Greater => Some(s.tat.ceil()),
            _ => None,
        }
    }

    fn from_lua_parameters([capacity, quotient, remainder, den]: [i64; 4]) -> Option<Self> {
        let capacity = count_parameter(capacity, MAX_COUNT)?;
        if quotient < 0 || den < 1 || !(0..den).contains(&remainder) {
            return None;
        }
        // `T = num / den` with the bounds `new` checks, so every product stays exact.
        let num = i128::from(quotient) * i128::from(den) + i128::from(remainder);
        let (capacity_wide, den_wide) = (i128::from(capacity), i128::from(den));
        let exact = num >= 1
            && capacity_wide * den_wide <= i128::from(MAX_EXACT)
            && capacity_wide * num / den_wide <= i128::from(MAX_FILL_MICROS);
        exact.then(|| Gcra::with_interval(capacity, quotient, remainder, den, num as i64))
    }

    fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
        let [whole, frac] = fields(stored, "a GCRA's time")?;
        if frac >= self.den {
            return Err(Corrupt("a GCRA's fraction of a microsecond"));
        }
        Ok(State { tat: Micros { whole, frac } })
    }

    fn encode(&self, s: &State, _previous: &Stored) -> Stored {
        Stored::Fields(smallvec![s.tat.whole, s.tat.frac])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_third_of_a_second_is_exact() {
        let g = Gcra::new(3, 1_000_000, 3).unwrap();
        assert_eq!(g.times(1), Micros { whole: 333_333, frac: 1 });
        assert_eq!(g.times(3), Micros::whole(1_000_000));
        assert_eq!(g.add(g.times(2), g.times(1)), Micros::whole(1_000_000));
        assert_eq!(g.sub(g.times(3), g.times(1)), g.times(2));
    }

    proptest::proptest! {
        /// With `T` a whole number of microseconds the phases take their short path; it decides,
        /// consumes and reports what the exact arithmetic (the Lua twin's) does, from any state.
        #[test]
        fn whole_intervals_answer_as_the_exact_arithmetic_does(
            capacity in 1u64..100_000,
            interval in 1u64..10_000_000,
            tat in 0i64..2_000_000_000_000,
            now in -1_000_000i64..1_000_000_000_000,
            probe in 1u64..100_000,
        ) {
            let Ok(g) = Gcra::new(capacity, interval * capacity, capacity) else { return Ok(()) };
            proptest::prop_assert!(g.whole());
            // A state the rule could hold: at most a full bucket's time ahead of now.
            let tat = Micros::whole(tat.min(now.max(0) + g.full.whole));
            let probe = probe.min(capacity);
            let mut s = State { tat };
            g.refresh(&mut s, now);
            proptest::prop_assert_eq!(g.decide(&s, now, probe), g.decide_exact(&s, now, probe));
            proptest::prop_assert_eq!(g.report(&s, now), g.report_exact(&s, now));
            let (mut short, mut exact) = (s.clone(), s.clone());
            g.consume(&mut short, now, probe, None);
            g.consume_exact(&mut exact, now, probe);
            proptest::prop_assert_eq!(&short, &exact);
            proptest::prop_assert_eq!(g.report(&short, now), g.report_exact(&exact, now));
        }

        /// The one-number comparison orders times as comparing `whole`, then `frac`, would.
        #[test]
        fn times_compare_whole_then_fraction(
            a in (proptest::num::i64::ANY, 0..i64::MAX),
            b in (proptest::num::i64::ANY, 0..i64::MAX),
        ) {
            let (x, y) = (Micros { whole: a.0, frac: a.1 }, Micros { whole: b.0, frac: b.1 });
            proptest::prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            // Near ties, where the fraction decides.
            let z = Micros { whole: a.0, frac: b.1 };
            proptest::prop_assert_eq!(x.cmp(&z), a.1.cmp(&b.1));
        }
    }

    #[test]
    fn refuses_parameters_beyond_exact_range() {
        assert_eq!(Gcra::new(1_000_000_000_000, 1_000_001, 999_999_937), Err(Inexact));
        assert!(Gcra::new(1_000, 86_400_000_000, 7).is_ok());
        // A million tokens at 7 a day would take 390 years to refill.
        assert_eq!(Gcra::new(1_000_000, 86_400_000_000, 7), Err(Inexact));
    }

    #[test]
    fn a_bucket_full_again_is_refreshed_to_no_state() {
        // Two units a second, both spent at 0: full again at 1 s.
        let g = Gcra::new(2, 1_000_000, 2).unwrap();
        let mut s = State::default();
        g.consume(&mut s, 0, 2, None);
        g.refresh(&mut s, 999_999);
        assert_eq!(g.expires_at(&s), Some(1_000_000), "not full yet: kept");
        g.refresh(&mut s, 1_000_000);
        // The same as no state: the memory backend drops it, a module deletes its fields.
        assert_eq!(s, State::default());
        assert_eq!(g.expires_at(&s), None);
        assert_eq!(g.encode(&s, &Stored::Fields(smallvec![])), Stored::Fields(smallvec![0, 0]));
    }

    #[test]
    fn the_lua_twin_is_sent_the_exact_interval() {
        // T = 1 s / 3 = 333,333 + 1/3 microseconds.
        let g = Gcra::new(3, 1_000_000, 3).unwrap();
        assert_eq!(g.interval(), [333_333, 1, 3]);
        assert_eq!(g.lua_parameters(), [3, 333_333, 1, 3]);
        assert_eq!(Gcra::from_lua_parameters(g.lua_parameters()), Some(g));
        // A whole number of microseconds: no fraction.
        assert_eq!(Gcra::new(10, 1_000_000, 10).unwrap().interval(), [100_000, 0, 1]);
    }

    proptest::proptest! {
        /// The division `units_owed` makes (in 64 bits, or 128 where 64 would overflow) gives
        /// the smallest `k` whose `k * T` covers the debt, as stepping through every `k` does.
        #[test]
        fn units_owed_is_the_first_k_to_cover_the_debt(
            // Spread over every magnitude: a random number shifted right by a random amount.
            (capacity, capacity_shift) in (1u64..1 << 24, 0u32..24),
            (per_micros, per_micros_shift) in (1u64..1 << 56, 0u32..56),
            (units, units_shift) in (1u64..1 << 40, 0u32..40),
            at in 0.0f64..=1.0,
            frac_of in 0.0f64..1.0,
        ) {
            let capacity = (capacity >> capacity_shift).max(1);
            let per_micros = (per_micros >> per_micros_shift).max(1);
            let units = (units >> units_shift).max(1);
            let Ok(g) = Gcra::new(capacity, per_micros, units) else { return Ok(()) };
            let full = g.times_exactly(capacity);
            let whole = (full.whole as f64 * at) as i64;
            let debt = Micros { whole, frac: ((g.den as f64 * frac_of) as i64).min(g.den - 1) };
            // `k * T` grows with `k`: the first to cover the debt by halving.
            let (mut low, mut high) = (0, capacity);
            while low < high {
                let mid = low + (high - low) / 2;
                if g.times_exactly(mid) >= debt { high = mid } else { low = mid + 1 }
            }
            proptest::prop_assert_eq!(g.units_owed(debt), low);
            proptest::prop_assert_eq!(g.times(1), g.times_exactly(1));
            proptest::prop_assert_eq!(g.times(capacity), full);
        }
    }

    #[test]
    fn units_owed_divides_in_128_bits_where_64_would_overflow() {
        // About 100 years to fill 1,000 units with a denominator of 7,919: the debt's whole
        // microseconds times the denominator pass 2^64.
        let g = Gcra::new(1_000, 3_155_760_000_000 * 7_919 - 1, 7_919).unwrap();
        assert_eq!(g.den, 7_919);
        let debt = g.sub(g.times_exactly(999), Micros { whole: 0, frac: 1 });
        assert!(debt.whole.unsigned_abs().checked_mul(g.den.unsigned_abs()).is_none());
        assert_eq!(g.units_owed(debt), 999);
        assert_eq!(g.units_owed(g.times_exactly(999)), 999);
        assert_eq!(g.units_owed(g.add(g.times_exactly(999), Micros { whole: 0, frac: 1 })), 1_000);
    }

    #[test]
    fn units_owed_is_the_exact_ceiling() {
        let g = Gcra::new(10, 1_000_000, 3).unwrap();
        for k in 0..10 {
            let t = g.times(k);
            assert_eq!(g.units_owed(t), k);
            assert_eq!(g.units_owed(g.add(t, Micros { whole: 0, frac: 1 })), k + 1);
        }
    }
}
