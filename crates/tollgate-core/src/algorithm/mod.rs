//! The algorithms, as pure state machines over integer microseconds.
//!
//! Vocabulary: a [`RuleKind`] is what the user asked for (a token bucket of 10 refilled at 1 a
//! second); an [`Algorithm`] is the state machine a rule compiles to (that token bucket runs as
//! a GCRA); an [`AlgorithmName`](crate::AlgorithmName) is the user-facing tag of a rule kind
//! (`"token_bucket"`), as written in configuration and reported in outcomes.
//!
//! Each algorithm lives in one module here (its Rust form, run by the memory backend) with its
//! Lua twin in a `.lua` file beside it (run inside Redis by `tollgate-redis`, see
//! [`crate::script`]). The twins compute the same numbers in the same order; differential tests
//! hold them to it. An algorithm is listed once, in the `algorithms!` invocation below, which
//! generates the enum of compiled algorithms ([`AnyAlgorithm`]), the enum of their states
//! ([`State`]), the dispatch between them and the list of Lua twins; adding one is a line there
//! plus its module (and the rule kind that compiles to it, in [`compile`]).
//!
//! An operation runs in the phases of [`crate::engine`]: *refresh* each state to `now`, apply a
//! *refund* or *release*, *decide* each state for the demand on it, *consume* on every state if
//! all admit, *report* each. Every state also knows when it *expires*: the moment it becomes
//! indistinguishable from no state at all. The memory backend drops it then; Redis keys carry it
//! as their TTL.

mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_window_counter;
mod sliding_window_log;
mod token_bucket;

use std::fmt::Debug;

use smallvec::SmallVec;

use crate::decision::LeaseId;
use crate::rule::{Align, RuleKind};

pub(crate) use gcra::Inexact;

/// One algorithm: a state machine over one key's [`State`](Algorithm::State), and its Lua twin.
///
/// Every phase takes the state and `now` (microseconds since the epoch), whether or not this
/// algorithm needs the time, so the engine calls them all alike.
pub(crate) trait Algorithm: Clone + Debug + PartialEq + Eq {
    /// The state for one key; its `Default` is no state at all.
    type State: Clone + Debug + Default + PartialEq;

    /// The Lua twin's table name in the script (and its name in `ALGORITHMS` order).
    const LUA_NAME: &'static str;
    /// The Lua twin's source (`<module>.lua`), defining the table [`LUA_NAME`](Self::LUA_NAME).
    const LUA_SOURCE: &'static str;
    /// The fields of the state when Redis stores it as a hash (the Lua twin's `hstore` calls
    /// write exactly these); `None` for states stored as sorted sets, which keep a key each.
    const HASH_FIELDS: Option<&'static [&'static str]>;
    /// Whether units are held under leases until released: a check with a cost cannot take
    /// them (`Operation::validate` asks for an acquire).
    const HOLDS_LEASES: bool = false;

    /// The most units the rule admits at once; also the `limit` it reports.
    fn capacity(&self) -> u64;

    /// The four parameters the Lua twin's `load` takes after `now` (unused ones are 0).
    fn lua_parameters(&self) -> [i64; 4];

    /// Brings the state up to `now`: rolls windows over, drops expired entries.
    fn refresh(&self, state: &mut Self::State, now: i64);

    /// Whether `probe` units (at least 1) would be admitted now, and if not, how long until
    /// (at least a microsecond). The state has been [`refresh`](Self::refresh)ed to `now`.
    fn decide(&self, state: &Self::State, now: i64, probe: u64) -> Admission;

    /// Takes `units`, which [`decide`](Self::decide) admitted. `lease` is the lease the units
    /// are held under, for algorithms that hold units until released (concurrency), which take
    /// nothing without one (a check never reaches them with a cost: `Operation::validate`).
    fn consume(&self, state: &mut Self::State, now: i64, units: u64, lease: Option<&LeaseId>);

    /// Gives back `units` consumed for work that was cancelled, not below empty. By default
    /// nothing: algorithms holding units under leases give them back by
    /// [`release`](Self::release) instead.
    fn refund(&self, state: &mut Self::State, now: i64, units: u64) {
        let _ = (state, now, units);
    }

    /// Gives back up to `units` held under `lease`. By default nothing: only algorithms that
    /// hold units under leases have any to release.
    fn release(&self, state: &mut Self::State, now: i64, lease: &LeaseId, units: u64) {
        let _ = (state, now, lease, units);
    }

    /// The units left and the time until the state is full again.
    fn report(&self, state: &Self::State, now: i64) -> Report;

    /// When the state becomes the same as no state; `None` if it already is. (A property of
    /// the state alone: it takes no `now`.)
    fn expires_at(&self, state: &Self::State) -> Option<i64>;

    /// The algorithm of a rule sent to the Lua twin with these parameters (the inverse of
    /// [`lua_parameters`](Self::lua_parameters)), or `None` when they are out of the bounds a
    /// rule set could have sent, so that arithmetic on them can neither overflow nor divide by
    /// zero.
    fn from_lua_parameters(parameters: [i64; 4]) -> Option<Self>;

    /// The state from what the Lua twin stores in Redis ([`Stored::Fields`] in
    /// [`HASH_FIELDS`](Self::HASH_FIELDS) order, absent fields 0, for hash-stored states;
    /// [`Stored::Members`] for the others), as its `load` reads it, before any refresh.
    fn decode(&self, stored: &Stored) -> Result<Self::State, Corrupt>;

    /// What the Lua twin would store for `state`, which is not empty
    /// ([`expires_at`](Self::expires_at) is `Some`). `previous` is what was read (sorted sets
    /// keep the scores of the members that did not change, so that a write touches only what
    /// changed).
    fn encode(&self, state: &Self::State, previous: &Stored) -> Stored;
}

/// The phases of one state machine as [`crate::engine::phases`] runs them: [`AnyAlgorithm`] over
/// any [`State`] (a group of several rules), or one [`Algorithm`] over its own state (a lone
/// rule, its algorithm matched once rather than at every phase).
pub(crate) trait Machine {
    /// The state the phases work on.
    type State;
    fn refresh(&self, state: &mut Self::State, now: i64);
    fn decide(&self, state: &mut Self::State, now: i64, probe: u64) -> Admission;
    fn consume(&self, state: &mut Self::State, now: i64, units: u64, lease: Option<&LeaseId>);
    fn refund(&self, state: &mut Self::State, now: i64, units: u64);
    fn release(&self, state: &mut Self::State, now: i64, lease: &LeaseId, units: u64);
    fn report(&self, state: &mut Self::State, now: i64) -> Report;
}

impl<A: Algorithm> Machine for A {
    type State = A::State;

    fn refresh(&self, state: &mut A::State, now: i64) {
        Algorithm::refresh(self, state, now);
    }

    fn decide(&self, state: &mut A::State, now: i64, probe: u64) -> Admission {
        Algorithm::decide(self, state, now, probe)
    }

    fn consume(&self, state: &mut A::State, now: i64, units: u64, lease: Option<&LeaseId>) {
        Algorithm::consume(self, state, now, units, lease);
    }

    fn refund(&self, state: &mut A::State, now: i64, units: u64) {
        Algorithm::refund(self, state, now, units);
    }

    fn release(&self, state: &mut A::State, now: i64, lease: &LeaseId, units: u64) {
        Algorithm::release(self, state, now, lease, units);
    }

    fn report(&self, state: &mut A::State, now: i64) -> Report {
        Algorithm::report(self, state, now)
    }
}

impl Machine for AnyAlgorithm {
    type State = State;

    fn refresh(&self, state: &mut State, now: i64) {
        AnyAlgorithm::refresh(self, state, now);
    }

    fn decide(&self, state: &mut State, now: i64, probe: u64) -> Admission {
        AnyAlgorithm::decide(self, state, now, probe)
    }

    fn consume(&self, state: &mut State, now: i64, units: u64, lease: Option<&LeaseId>) {
        AnyAlgorithm::consume(self, state, now, units, lease);
    }

    fn refund(&self, state: &mut State, now: i64, units: u64) {
        AnyAlgorithm::refund(self, state, now, units);
    }

    fn release(&self, state: &mut State, now: i64, lease: &LeaseId, units: u64) {
        AnyAlgorithm::release(self, state, now, lease, units);
    }

    fn report(&self, state: &mut State, now: i64) -> Report {
        AnyAlgorithm::report(self, state, now)
    }
}

/// What runs on one algorithm of known type and its state: [`AnyAlgorithm::visit`] matches the
/// algorithm once and hands both here, so that the work is compiled for that algorithm.
pub(crate) trait Visit {
    type Output;
    fn visit<A: Algorithm>(self, algorithm: &A, state: &mut A::State) -> Self::Output;
}

/// A state as the Lua twins store it in Redis (see [`crate::script::execute`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stored {
    /// A hash-stored state's fields, in the algorithm's `HASH_FIELDS` order; 0 for an absent one.
    Fields(SmallVec<[i64; 3]>),
    /// A sorted set's members and scores, in Redis's order (by score, then member); none when
    /// there is no key.
    Members(Vec<(Vec<u8>, f64)>),
}

/// A stored state that no Lua twin could have written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Corrupt(pub &'static str);

/// The largest stored integer read back: the twins keep every value below 2^53 (see
/// `prelude.lua`); a larger one was not written by them, and would overflow the arithmetic.
const MAX_STORED: i64 = crate::limits::MAX_EXACT as i64;

/// `value` as a stored time or count: in `0..=2^53 - 1`.
pub(crate) fn stored_integer(value: i64, what: &'static str) -> Result<i64, Corrupt> {
    if (0..=MAX_STORED).contains(&value) { Ok(value) } else { Err(Corrupt(what)) }
}

/// The hash fields of `stored`, of an algorithm stored as a hash with `n` fields.
pub(crate) fn fields<const N: usize>(stored: &Stored, what: &'static str) -> Result<[i64; N], Corrupt> {
    let Stored::Fields(values) = stored else {
        return Err(Corrupt("a sorted set where a hash was expected"));
    };
    let mut out = [0; N];
    for (slot, &value) in out.iter_mut().zip(values.iter()) {
        *slot = stored_integer(value, what)?;
    }
    Ok(out)
}

/// The bounds of a parameter sent to a Lua twin: a count (a limit or capacity) up to `max`.
pub(crate) fn count_parameter(value: i64, max: u64) -> Option<u64> {
    u64::try_from(value).ok().filter(|&v| (1..=max).contains(&v))
}

/// The bounds of a period or lease duration sent to a Lua twin (see [`crate::Period`]).
pub(crate) fn period_parameter(value: i64) -> Option<i64> {
    let (min, max) = (crate::Period::MIN.as_micros(), crate::Period::MAX.as_micros());
    u64::try_from(value).ok().filter(|v| (min..=max).contains(v)).map(|_| value)
}

/// Whether a state admits the units asked of it, and if not, how long until it would: zero
/// when it admits, at least a microsecond when not (made by [`ADMIT`](Self::ADMIT) and
/// [`wait`](Self::wait) only, which hold it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    pub admits: bool,
    pub retry_after: i64,
}

impl Admission {
    pub const ADMIT: Admission = Admission { admits: true, retry_after: 0 };

    /// A refusal for `micros`. Every algorithm's wait is positive (its state refreshed, the
    /// moment it would admit lies ahead); at least one microsecond is kept all the same, as a
    /// refusal reported with no wait would read as an admission.
    pub fn wait(micros: i64) -> Admission {
        Admission { admits: false, retry_after: micros.max(1) }
    }
}

/// A state as reported to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub remaining: u64,
    pub reset_after: i64,
}

/// `floor(a / b)` for `b > 0`, also for negative `a` (a clock set before the epoch in a test).
pub(crate) fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

pub(crate) fn to_i64(v: u64) -> i64 {
    // Every parameter is validated far below i64::MAX (see `limits`).
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Generates, from one list of `Variant => module::Type`, the enum of compiled algorithms, the
/// enum of their states, the dispatch of every [`Algorithm`] method from the one to the other,
/// and the Lua twins in order (an algorithm's position + 1 is its number in the script's
/// `ALGORITHMS`).
macro_rules! algorithms {
    ($($variant:ident => $module:ident::$algorithm:ident,)+) => {
        /// A rule's parameters, compiled to one of the algorithms.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum AnyAlgorithm {
            $($variant($module::$algorithm),)+
        }

        /// One algorithm's state for one key.
        #[derive(Clone, Debug, PartialEq)]
        pub(crate) enum State {
            $($variant(<$module::$algorithm as Algorithm>::State),)+
        }

        /// Each algorithm's Lua table name and source, in the order of [`AnyAlgorithm`].
        pub(crate) const LUA_TWINS: [(&str, &str); [$(stringify!($variant)),+].len()] =
            [$((<$module::$algorithm as Algorithm>::LUA_NAME, <$module::$algorithm as Algorithm>::LUA_SOURCE),)+];

        $(
            impl From<$module::$algorithm> for AnyAlgorithm {
                fn from(algorithm: $module::$algorithm) -> Self {
                    AnyAlgorithm::$variant(algorithm)
                }
            }

            impl Stateful for $module::$algorithm {
                fn state_in(state: &mut State) -> &mut Self::State {
                    // A state is found by its rule's signature, which names the algorithm, so
                    // another variant cannot occur; if it did it is replaced, not a panic.
                    if !matches!(state, State::$variant(_)) {
                        *state = State::$variant(Default::default());
                    }
                    let State::$variant(s) = state else { unreachable!("made this variant above") };
                    s
                }
            }
        )+

        impl AnyAlgorithm {
            /// The algorithm's position in [`LUA_TWINS`].
            pub(crate) fn lua_index(&self) -> usize {
                let mut index = 0;
                $(
                    if let AnyAlgorithm::$variant(_) = self {
                        return index;
                    }
                    index += 1;
                )+
                index
            }

            /// No state at all, of this algorithm.
            pub(crate) fn new_state(&self) -> State {
                match self {
                    $(AnyAlgorithm::$variant(_) => State::$variant(Default::default()),)+
                }
            }

            /// See [`Algorithm::HASH_FIELDS`].
            pub(crate) fn hash_fields(&self) -> Option<&'static [&'static str]> {
                match self {
                    $(AnyAlgorithm::$variant(_) => <$module::$algorithm as Algorithm>::HASH_FIELDS,)+
                }
            }

            /// See [`Algorithm::HOLDS_LEASES`].
            pub(crate) fn holds_leases(&self) -> bool {
                match self {
                    $(AnyAlgorithm::$variant(_) => <$module::$algorithm as Algorithm>::HOLDS_LEASES,)+
                }
            }

            /// See [`Algorithm::capacity`].
            pub(crate) fn capacity(&self) -> u64 {
                match self {
                    $(AnyAlgorithm::$variant(a) => a.capacity(),)+
                }
            }

            /// See [`Algorithm::lua_parameters`].
            pub(crate) fn lua_parameters(&self) -> [i64; 4] {
                match self {
                    $(AnyAlgorithm::$variant(a) => a.lua_parameters(),)+
                }
            }

            /// See [`Algorithm::refresh`].
            pub(crate) fn refresh(&self, state: &mut State, now: i64) {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::refresh(a, $module::$algorithm::state_in(state), now),)+
                }
            }

            /// See [`Algorithm::decide`].
            pub(crate) fn decide(&self, state: &mut State, now: i64, probe: u64) -> Admission {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::decide(a, $module::$algorithm::state_in(state), now, probe),)+
                }
            }

            /// See [`Algorithm::consume`].
            pub(crate) fn consume(&self, state: &mut State, now: i64, units: u64, lease: Option<&LeaseId>) {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::consume(a, $module::$algorithm::state_in(state), now, units, lease),)+
                }
            }

            /// See [`Algorithm::refund`].
            pub(crate) fn refund(&self, state: &mut State, now: i64, units: u64) {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::refund(a, $module::$algorithm::state_in(state), now, units),)+
                }
            }

            /// See [`Algorithm::release`].
            pub(crate) fn release(&self, state: &mut State, now: i64, lease: &LeaseId, units: u64) {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::release(a, $module::$algorithm::state_in(state), now, lease, units),)+
                }
            }

            /// See [`Algorithm::report`].
            pub(crate) fn report(&self, state: &mut State, now: i64) -> Report {
                match self {
                    $(AnyAlgorithm::$variant(a) => Algorithm::report(a, $module::$algorithm::state_in(state), now),)+
                }
            }

            /// The algorithm numbered `number` in the script's `ALGORITHMS` (its position in
            /// [`LUA_TWINS`] + 1) with these parameters; see [`Algorithm::from_lua_parameters`].
            pub(crate) fn from_lua(number: i64, parameters: [i64; 4]) -> Option<AnyAlgorithm> {
                let mut at = 0;
                $(
                    at += 1;
                    if number == at {
                        return $module::$algorithm::from_lua_parameters(parameters).map(AnyAlgorithm::$variant);
                    }
                )+
                let _ = at;
                None
            }

            /// See [`Algorithm::decode`].
            pub(crate) fn decode(&self, stored: &Stored) -> Result<State, Corrupt> {
                match self {
                    $(AnyAlgorithm::$variant(a) => a.decode(stored).map(State::$variant),)+
                }
            }

            /// See [`Algorithm::encode`].
            pub(crate) fn encode(&self, state: &mut State, previous: &Stored) -> Stored {
                match self {
                    $(AnyAlgorithm::$variant(a) => a.encode($module::$algorithm::state_in(state), previous),)+
                }
            }

            /// See [`Algorithm::expires_at`].
            pub(crate) fn expires_at(&self, state: &mut State) -> Option<i64> {
                match self {
                    $(AnyAlgorithm::$variant(a) => a.expires_at($module::$algorithm::state_in(state)),)+
                }
            }

            /// Runs `visitor` on this algorithm, as its own type, and its variant of `state`.
            #[inline(always)]
            pub(crate) fn visit<V: Visit>(&self, state: &mut State, visitor: V) -> V::Output {
                match self {
                    $(AnyAlgorithm::$variant(a) => visitor.visit(a, $module::$algorithm::state_in(state)),)+
                }
            }
        }
    };
}

/// An algorithm's own variant of [`State`] (generated by `algorithms!`).
trait Stateful: Algorithm {
    fn state_in(state: &mut State) -> &mut Self::State;
}

algorithms! {
    FixedWindow => fixed_window::FixedWindow,
    SlidingWindowLog => sliding_window_log::SlidingWindowLog,
    SlidingWindowCounter => sliding_window_counter::SlidingWindowCounter,
    Gcra => gcra::Gcra,
    Concurrency => concurrency::Concurrency,
}

/// Compiles a rule's parameters to its algorithm; the caller has range-checked them.
pub(crate) fn compile(kind: &RuleKind) -> Result<AnyAlgorithm, Inexact> {
    Ok(match *kind {
        RuleKind::FixedWindow { limit, period, align } => {
            fixed_window::FixedWindow::new(limit, period, align).into()
        }
        RuleKind::SlidingWindowLog { limit, period } => {
            sliding_window_log::SlidingWindowLog::new(limit, period).into()
        }
        RuleKind::SlidingWindowCounter { limit, period } => {
            sliding_window_counter::SlidingWindowCounter::new(limit, period).into()
        }
        RuleKind::TokenBucket { capacity, refill, per } => {
            token_bucket::compile(capacity, refill, per)?.into()
        }
        RuleKind::Gcra { limit, period, burst } => gcra::Gcra::new(burst, period.as_micros(), limit)?.into(),
        RuleKind::Concurrency { limit, lease } => concurrency::Concurrency::new(limit, lease).into(),
    })
}

/// The state's identity: the rule kind and its parameters (not the algorithm: a token bucket
/// and a GCRA of the same rate share one, but not their states), so a changed rule never reads
/// the state of the old one; and, where the stored form of an algorithm's state changed, its
/// version.
///
/// Sliding logs and concurrency leases are at version 2 (`swl2`, `cc2`): their Redis sets now
/// hold one member per distinct time or per lease, where version 1 (`swl`, `cc`) held one per
/// unit. An upgraded Tollgate never reads a version-1 set (it would miscount it, and a
/// version-1 Tollgate still running beside it in a rolling upgrade would miscount a version-2
/// one); the old keys expire by their TTL, at most one period or lease later.
pub(crate) fn signature(kind: &RuleKind) -> String {
    match *kind {
        RuleKind::FixedWindow { limit, period, align: Align::Clock } => {
            format!("fw:{limit}:{}", period.as_micros())
        }
        RuleKind::FixedWindow { limit, period, align: Align::FirstHit } => {
            format!("fwh:{limit}:{}", period.as_micros())
        }
        RuleKind::SlidingWindowLog { limit, period } => format!("swl2:{limit}:{}", period.as_micros()),
        RuleKind::SlidingWindowCounter { limit, period } => format!("swc:{limit}:{}", period.as_micros()),
        RuleKind::TokenBucket { capacity, refill, per } => {
            format!("tb:{capacity}:{refill}:{}", per.as_micros())
        }
        RuleKind::Gcra { limit, period, burst } => format!("gcra:{limit}:{}:{burst}", period.as_micros()),
        RuleKind::Concurrency { limit, lease } => format!("cc2:{limit}:{}", lease.as_micros()),
    }
}
