//! [`Decision`]: what a check answers, rule by rule, and [`Lease`]: what an acquire hands out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::AlgorithmName;

/// A decision's outcomes, inline up to two rules (a limit, or a limit over two periods): the
/// common shapes are decided without allocating.
pub(crate) type Outcomes = SmallVec<[RuleOutcome; 2]>;

/// One rule's part of a [`Decision`].
///
/// Its times are kept in whole microseconds (as the algorithms count them), half the size of
/// a [`Duration`]: a decision is moved whole, and at this size a move is a few register
/// copies rather than a `memcpy` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleOutcome {
    name: Option<Arc<str>>,
    limit: u64,
    remaining: u64,
    reset_after_micros: u64,
    retry_after_micros: u64,
    algorithm: AlgorithmName,
    allowed: bool,
}

impl RuleOutcome {
    /// An outcome; a rule that admits has no wait, whatever `retry_after_micros` says.
    pub(crate) fn new(
        name: Option<Arc<str>>,
        algorithm: AlgorithmName,
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_micros: u64,
        retry_after_micros: u64,
    ) -> Self {
        let retry_after_micros = if allowed { 0 } else { retry_after_micros };
        RuleOutcome { name, limit, remaining, reset_after_micros, retry_after_micros, algorithm, allowed }
    }

    /// Sets the rule's report (its remaining units and time to full), once its state has
    /// consumed or not: an outcome is made when its rule decides, before the others have.
    #[inline(always)]
    pub(crate) fn report(&mut self, remaining: u64, reset_after_micros: u64) {
        (self.remaining, self.reset_after_micros) = (remaining, reset_after_micros);
    }

    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The rule's algorithm.
    pub fn algorithm(&self) -> AlgorithmName {
        self.algorithm
    }

    /// Whether this rule alone would admit the request.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The most units the rule admits at once (its `limit`; `capacity` for a token bucket and
    /// `burst` for GCRA).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units a request could still take now, after this decision.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the rule is back to full (zero when it is full).
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_micros)
    }

    /// Time until the same cost would be admitted by this rule (zero when it is).
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_micros)
    }

    /// This outcome as it stands `since` later, its waits that much shorter, with `units`
    /// more left (at most the limit): an answer given again, from a cached denial or from
    /// units reserved before.
    pub fn later(&self, since: Duration, units: u64) -> RuleOutcome {
        let since = u64::try_from(since.as_micros()).unwrap_or(u64::MAX);
        RuleOutcome {
            remaining: self.remaining.saturating_add(units).min(self.limit),
            reset_after_micros: self.reset_after_micros.saturating_sub(since),
            retry_after_micros: self.retry_after_micros.saturating_sub(since),
            ..self.clone()
        }
    }
}

/// The answer to a check: admitted or not, with every rule's state.
///
/// A check is all-or-nothing: the request is admitted only if every rule admits it, and a denied
/// request consumes nothing. The headline [`limit`](Decision::limit),
/// [`remaining`](Decision::remaining) and [`reset_after`](Decision::reset_after) are those of the
/// most restrictive rule ([`binding`](Decision::binding)): when denied, the one that makes the
/// caller wait longest; when admitted, the one with the fewest units left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    outcomes: Outcomes,
    /// Narrow, to keep a decision small: a list of 2^32 outcomes would take 240 GB.
    binding: u32,
    allowed: bool,
}

impl Decision {
    /// A decision from its rules' outcomes (in the rule set's order); admitted when every rule
    /// admits.
    ///
    /// # Panics
    /// If `outcomes` is empty: a rule set always has at least one rule.
    pub fn from_outcomes(outcomes: Vec<RuleOutcome>) -> Self {
        Decision::from_outcome_list(SmallVec::from_vec(outcomes))
    }

    /// [`from_outcomes`](Self::from_outcomes), from outcomes collected without allocating.
    pub(crate) fn from_outcome_list(outcomes: Outcomes) -> Self {
        let mut decision = Decision { outcomes, allowed: false, binding: 0 };
        decision.settle();
        decision
    }

    /// A decision being made where it will be returned (it is too large to move cheaply: each
    /// move is a `memcpy` call): its outcomes pushed in place ([`outcomes_mut`]), then
    /// [`settle`]d.
    ///
    /// [`outcomes_mut`]: Self::outcomes_mut
    /// [`settle`]: Self::settle
    #[inline(always)]
    pub(crate) fn building() -> Self {
        Decision { outcomes: Outcomes::new(), allowed: false, binding: 0 }
    }

    /// The outcomes of a decision [`building`](Self::building).
    pub(crate) fn outcomes_mut(&mut self) -> &mut Outcomes {
        &mut self.outcomes
    }

    /// Sets whether every rule admits and which binds, from the outcomes.
    ///
    /// # Panics
    /// If there are none: a rule set always has at least one rule.
    #[inline(always)]
    pub(crate) fn settle(&mut self) {
        assert!(!self.outcomes.is_empty(), "a decision needs at least one rule outcome");
        let (allowed, binding) = match &self.outcomes[..] {
            // One rule (the commonest set) binds by itself.
            [only] => (only.allowed, 0),
            outcomes => Decision::binding_of(outcomes),
        };
        (self.allowed, self.binding) = (allowed, binding as u32);
    }

    /// Whether every rule admits, and which of several binds (see [`Decision`]).
    fn binding_of(outcomes: &[RuleOutcome]) -> (bool, usize) {
        let allowed = outcomes.iter().all(|o| o.allowed);
        // One pass, each rule against the binding so far; strictly ahead to take its place, so
        // the first of equals binds. (A `max_by_key` on tuples of `Duration`s cost twice as
        // much, on the path of every decision of several rules.)
        let mut binding = 0;
        for (i, o) in outcomes.iter().enumerate().skip(1) {
            let b = &outcomes[binding];
            let ahead = if allowed {
                // Admitted: the fewest units left, then the longest time to full.
                o.remaining < b.remaining
                    || (o.remaining == b.remaining && o.reset_after_micros > b.reset_after_micros)
            } else {
                // Denied: a refusing rule, then the longest wait.
                (!o.allowed & b.allowed)
                    || (o.allowed == b.allowed && o.retry_after_micros > b.retry_after_micros)
            };
            if ahead {
                binding = i;
            }
        }
        (allowed, binding)
    }

    /// A decision admitting a request without consulting any state, every rule reported full:
    /// what a server answers when its backend is down and its failure policy is to admit.
    ///
    /// ```
    /// use tollgate_core::{Decision, Period, Rule, RuleSet};
    ///
    /// let rules = RuleSet::new([Rule::fixed_window(10, Period::SECOND)]).unwrap();
    /// let decision = Decision::admitted_unchecked(&rules);
    /// assert!(decision.allowed());
    /// assert_eq!(decision.remaining(), 10);
    /// ```
    pub fn admitted_unchecked(rules: &crate::RuleSet) -> Self {
        let outcomes = rules
            .compiled()
            .iter()
            .map(|rule| {
                let capacity = rule.algorithm.capacity();
                RuleOutcome::new(rule.name.clone(), rule.rule.algorithm(), true, capacity, capacity, 0, 0)
            })
            .collect();
        Decision::from_outcome_list(outcomes)
    }

    /// Whether the request was admitted (by every rule).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The most restrictive rule's outcome.
    pub fn binding(&self) -> &RuleOutcome {
        &self.outcomes[self.binding as usize]
    }

    /// The binding rule's limit.
    pub fn limit(&self) -> u64 {
        self.binding().limit
    }

    /// The binding rule's remaining units.
    pub fn remaining(&self) -> u64 {
        self.binding().remaining
    }

    /// The binding rule's time until it is back to full.
    pub fn reset_after(&self) -> Duration {
        self.binding().reset_after()
    }

    /// Time until the same cost would be admitted by every rule (zero when admitted): the
    /// longest of the rules' waits.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.outcomes.iter().map(|o| o.retry_after_micros).max().unwrap_or(0))
    }

    /// Every rule's outcome, in the rule set's order.
    pub fn rules(&self) -> &[RuleOutcome] {
        &self.outcomes
    }
}

/// The identity of a lease: 32 hexadecimal digits, random.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(Arc<str>);

impl LeaseId {
    /// A fresh random lease id.
    pub fn random() -> Self {
        LeaseId(uuid::Uuid::new_v4().simple().to_string().into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Text that is not a lease id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a lease id is 1 to 64 characters of A-Z, a-z, 0-9, '-' and '_'")]
pub struct LeaseIdError;

impl std::str::FromStr for LeaseId {
    type Err = LeaseIdError;

    /// Parses a lease id handed back by a client (ids are embedded in Redis member names, so
    /// only a safe alphabet is accepted).
    fn from_str(s: &str) -> Result<Self, LeaseIdError> {
        let valid = (1..=64).contains(&s.len())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid { Ok(LeaseId(s.into())) } else { Err(LeaseIdError) }
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Units held under the concurrency rules of a rule set; give them back with `release`.
///
/// A lease that is never released expires after each rule's `lease` duration, so a crashed
/// holder cannot keep capacity forever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease's identity.
    pub id: LeaseId,
    /// Units held (the cost it was acquired with).
    pub units: u64,
}

/// The answer to an acquire: the decision, and the lease when units were taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquisition {
    /// The decision, as a check would report it.
    pub decision: Decision,
    /// The lease, present when the request was admitted with a cost above zero under at least
    /// one concurrency rule.
    pub lease: Option<Lease>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(allowed: bool, remaining: u64, reset: u64, retry: u64) -> RuleOutcome {
        RuleOutcome::new(
            None,
            AlgorithmName::FixedWindow,
            allowed,
            10,
            remaining,
            reset * 1_000_000,
            retry * 1_000_000,
        )
    }

    #[test]
    fn admitted_headline_is_the_rule_with_fewest_left() {
        let d = Decision::from_outcomes(vec![
            outcome(true, 5, 1, 0),
            outcome(true, 2, 1, 0),
            outcome(true, 2, 9, 0),
        ]);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 2);
        assert_eq!(d.reset_after(), Duration::from_secs(9));
        assert_eq!(d.retry_after(), Duration::ZERO);
    }

    #[test]
    fn denied_headline_is_the_longest_wait() {
        let d = Decision::from_outcomes(vec![
            outcome(true, 0, 50, 0),
            outcome(false, 0, 3, 3),
            outcome(false, 1, 7, 7),
        ]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(7));
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after(), Duration::from_secs(7));
    }

    proptest::proptest! {
        /// The one-pass search binds the rule the definition names: admitted, the fewest
        /// units left, then the longest time to full; denied, a refusing rule with the longest
        /// wait; the first of equals either way.
        #[test]
        fn the_binding_rule_is_the_definitions(
            rules in proptest::collection::vec((proptest::bool::ANY, 0u64..4, 0u64..4, 0u64..4), 2..7)
        ) {
            let outcomes: Vec<RuleOutcome> =
                rules.iter().map(|&(allowed, left, reset, retry)| outcome(allowed, left, reset, retry)).collect();
            let allowed = outcomes.iter().all(|o| o.allowed);
            let key = |i: &usize| {
                let o = &outcomes[*i];
                if allowed {
                    (u64::MAX - o.remaining, o.reset_after())
                } else {
                    (u64::from(!o.allowed), o.retry_after())
                }
            };
            let first_of_the_best = (0..outcomes.len()).rev().max_by_key(key).unwrap_or(0);
            proptest::prop_assert_eq!(Decision::binding_of(&outcomes), (allowed, first_of_the_best));
        }
    }

    #[test]
    fn a_decision_of_two_rules_is_small_enough_to_move_without_a_memcpy_call() {
        // LLVM copies up to 128 bytes inline on x86-64 (eight 16-byte moves); a decision is
        // moved on every answer (into its `Ok`, out of the backend, into the response).
        assert!(std::mem::size_of::<Decision>() <= 128, "{}", std::mem::size_of::<Decision>());
    }

    #[test]
    fn lease_ids_round_trip_and_refuse_odd_text() {
        let id = LeaseId::random();
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(id.as_str().parse::<LeaseId>(), Ok(id));
        for bad in ["", "a:b", "x y", &"a".repeat(65)] {
            assert_eq!(bad.parse::<LeaseId>(), Err(LeaseIdError), "{bad:?}");
        }
    }

    #[test]
    fn ties_go_to_the_first_rule() {
        let mut a = outcome(true, 3, 4, 0);
        a.name = Some("first".into());
        let d = Decision::from_outcomes(vec![a, outcome(true, 3, 4, 0)]);
        assert_eq!(d.binding().name(), Some("first"));
    }
}
