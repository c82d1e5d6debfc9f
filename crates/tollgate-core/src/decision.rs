//! [`Decision`]: what a check answers, rule by rule, and [`Lease`]: what an acquire hands out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{AlgorithmName, RuleSet};

/// One rule's numbers in a decision: what its state answered. Its name, algorithm and limit
/// are the rule set's, joined to them by [`Decision::outcomes`]: a decision holds numbers only,
/// so that five rules fit in its 128 bytes and making one writes no shared reference count.
///
/// Times are whole microseconds (as the algorithms count them), half the size of a
/// [`Duration`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Row {
    remaining: u64,
    reset_after_micros: u64,
    /// Zero when the rule admits; at least 1 when it refuses (a refusal always has a wait), so
    /// that this one field also says which.
    retry_after_micros: u64,
}

impl Row {
    /// A rule's row from its state's admission, with no report yet ([`report`](Self::report)
    /// fills it in once every rule has decided).
    #[inline(always)]
    pub(crate) fn decided(admits: bool, retry_after_micros: u64) -> Row {
        let retry_after_micros = if admits { 0 } else { retry_after_micros.max(1) };
        Row { remaining: 0, reset_after_micros: 0, retry_after_micros }
    }

    /// A rule's row from the wait its state answered: zero when it admits, at least a
    /// microsecond when not (as an algorithm's [`Admission`](crate::algorithm::Admission)
    /// holds it).
    #[inline(always)]
    pub(crate) fn admitted_or_waiting(retry_after_micros: u64) -> Row {
        Row { remaining: 0, reset_after_micros: 0, retry_after_micros }
    }

    /// Sets the rule's report: its remaining units and time to full.
    #[inline(always)]
    pub(crate) fn report(&mut self, remaining: u64, reset_after_micros: u64) {
        (self.remaining, self.reset_after_micros) = (remaining, reset_after_micros);
    }

    pub(crate) fn allowed(&self) -> bool {
        self.retry_after_micros == 0
    }

    /// Whether this rule binds rather than `other`, an earlier one (the first of equals binds:
    /// see [`Decision`]), in a decision admitted or not.
    #[inline(always)]
    pub(crate) fn binds_over(&self, other: &Row, admitted: bool) -> bool {
        if admitted {
            // The fewest units left, then the longest time to full.
            self.remaining < other.remaining
                || (self.remaining == other.remaining && self.reset_after_micros > other.reset_after_micros)
        } else {
            // The longest wait (an admitting rule's is zero).
            self.retry_after_micros > other.retry_after_micros
        }
    }
}

/// Rules whose rows a decision holds without allocating: five rows and the bookkeeping make
/// 128 bytes, the most LLVM moves inline on x86-64 (eight 16-byte moves; past it a move is a
/// `memcpy` call, and a decision is moved on every answer).
const INLINE_ROWS: usize = 5;

/// A decision's rows and which binds.
#[derive(Clone, Debug)]
enum Rows {
    Inline { len: u8, binding: u8, rows: [Row; INLINE_ROWS] },
    Spilled { binding: u8, rows: Box<[Row]> },
}

/// One rule's part of a [`Decision`], joined to its rule ([`Decision::outcomes`]): the rule's
/// name, algorithm and limit, and its state's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleOutcome<'r> {
    name: Option<&'r str>,
    limit: u64,
    remaining: u64,
    reset_after_micros: u64,
    retry_after_micros: u64,
    algorithm: AlgorithmName,
}

impl<'r> RuleOutcome<'r> {
    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&'r str> {
        self.name
    }

    /// The rule's algorithm.
    pub fn algorithm(&self) -> AlgorithmName {
        self.algorithm
    }

    /// Whether this rule alone would admit the request.
    pub fn allowed(&self) -> bool {
        self.retry_after_micros == 0
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
}

/// One rule's answer as another decider reported it (a Tollgate server answering a remote
/// client): see [`Decision::from_reports`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleReport {
    /// Whether the rule admits.
    pub allowed: bool,
    /// Units left.
    pub remaining: u64,
    /// Time until the rule is back to full.
    pub reset_after: Duration,
    /// Time until the cost would be admitted (ignored when `allowed`).
    pub retry_after: Duration,
}

/// The answer to a check: admitted or not, with every rule's state.
///
/// A check is all-or-nothing: the request is admitted only if every rule admits it, and a denied
/// request consumes nothing. The headline [`remaining`](Decision::remaining),
/// [`reset_after`](Decision::reset_after) and [`retry_after`](Decision::retry_after) are those
/// of the most restrictive rule ([`binding`](Decision::binding)): when denied, the one that
/// makes the caller wait longest; when admitted, the one with the fewest units left.
///
/// A decision holds each rule's numbers, not the rule: its name, algorithm and limit come from
/// the [`RuleSet`] it was made under, joined by [`outcomes`](Decision::outcomes) and
/// [`binding`](Decision::binding).
///
/// ```
/// use tollgate_core::{MemoryBackend, Operation, Period, Rule, RuleSet};
///
/// let rules = RuleSet::new([
///     Rule::fixed_window(10, Period::SECOND).named("second"),
///     Rule::fixed_window(3, Period::MINUTE).named("minute"),
/// ])?;
/// let decision = MemoryBackend::new().execute_now("k", &rules, Operation::Check { cost: 1 })?;
/// assert_eq!(decision.remaining(), 2);
/// assert_eq!(decision.binding(&rules).name(), Some("minute"));
/// assert_eq!(decision.binding(&rules).limit(), 3);
/// let names: Vec<_> = decision.outcomes(&rules).map(|o| o.name()).collect();
/// assert_eq!(names, [Some("second"), Some("minute")]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Decision {
    rows: Rows,
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.rows() == other.rows() && self.binding_index() == other.binding_index()
    }
}

impl Eq for Decision {}

impl Decision {
    /// A decision being made where it will be returned (it is too large to move cheaply): its
    /// rows filled in place ([`start_rows`]), then [`settle`]d (or [`bound`] by a caller that
    /// found the binding rule on the way).
    ///
    /// [`start_rows`]: Self::start_rows
    /// [`settle`]: Self::settle
    /// [`bound`]: Self::bound
    #[inline(always)]
    pub(crate) fn building() -> Self {
        Decision { rows: Rows::Inline { len: 0, binding: 0, rows: [Row::default(); INLINE_ROWS] } }
    }

    /// `count` rows for the caller to fill in, every one (they may hold an earlier answer):
    /// inline up to [`INLINE_ROWS`], past them in one allocation.
    #[inline(always)]
    pub(crate) fn start_rows(&mut self, count: usize) -> &mut [Row] {
        match &mut self.rows {
            // Already inline (as `building` makes it): only the count changes.
            Rows::Inline { len, .. } if count <= INLINE_ROWS => *len = count as u8,
            rows if count <= INLINE_ROWS => {
                *rows = Rows::Inline { len: count as u8, binding: 0, rows: [Row::default(); INLINE_ROWS] };
            }
            rows => {
                *rows = Rows::Spilled { binding: 0, rows: vec![Row::default(); count].into_boxed_slice() }
            }
        }
        self.rows_mut()
    }

    /// The rows begun by [`start_rows`](Self::start_rows), to fill in.
    pub(crate) fn rows_mut(&mut self) -> &mut [Row] {
        match &mut self.rows {
            Rows::Inline { len, rows, .. } => &mut rows[..usize::from(*len)],
            Rows::Spilled { rows, .. } => rows,
        }
    }

    /// The rows, in the rule set's order.
    fn rows(&self) -> &[Row] {
        match &self.rows {
            Rows::Inline { len, rows, .. } => &rows[..usize::from(*len)],
            Rows::Spilled { rows, .. } => rows,
        }
    }

    /// Sets which rule binds, from the rows.
    ///
    /// # Panics
    /// If there are none: a rule set always has at least one rule.
    #[inline(always)]
    pub(crate) fn settle(&mut self) {
        let rows = self.rows();
        assert!(!rows.is_empty(), "a decision needs at least one rule");
        // One rule (the commonest set) binds by itself.
        let found = if rows.len() == 1 { 0 } else { Decision::binding_of(rows) as u8 };
        match &mut self.rows {
            Rows::Inline { binding, .. } | Rows::Spilled { binding, .. } => *binding = found,
        }
    }

    /// Sets the binding rule, `binding` (found by [`Row::binds_over`] as the rows were made).
    #[inline(always)]
    pub(crate) fn bound(&mut self, binding: usize) {
        match &mut self.rows {
            Rows::Inline { binding: at, .. } | Rows::Spilled { binding: at, .. } => *at = binding as u8,
        }
    }

    /// Which of several rows binds (see [`Decision`]).
    fn binding_of(rows: &[Row]) -> usize {
        let allowed = rows.iter().all(Row::allowed);
        // One pass, each rule against the binding so far; strictly ahead to take its place, so
        // the first of equals binds. (A `max_by_key` on tuples cost twice as much, on the path
        // of every decision of several rules.)
        let mut binding = 0;
        for (i, o) in rows.iter().enumerate().skip(1) {
            if o.binds_over(&rows[binding], allowed) {
                binding = i;
            }
        }
        binding
    }

    /// A decision from each rule's answer as another decider reported it, in the rule set's
    /// order; `None` unless there is one report per rule. Times are kept in whole
    /// microseconds, rounded up: a wait reported is never shortened.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Decision, Period, Rule, RuleReport, RuleSet};
    ///
    /// let rules = RuleSet::new([Rule::fixed_window(10, Period::SECOND)])?;
    /// let second = Duration::from_secs(1);
    /// let report = RuleReport { allowed: false, remaining: 0, reset_after: second, retry_after: second };
    /// let decision = Decision::from_reports(&rules, [report]).unwrap();
    /// assert!(!decision.allowed());
    /// assert_eq!(decision.binding(&rules).limit(), 10);
    /// assert!(Decision::from_reports(&rules, [report, report]).is_none());
    /// # Ok::<(), tollgate_core::RuleError>(())
    /// ```
    pub fn from_reports(rules: &RuleSet, reports: impl IntoIterator<Item = RuleReport>) -> Option<Self> {
        let micros = |d: Duration| u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX);
        let reports: Vec<RuleReport> = reports.into_iter().collect();
        if reports.len() != rules.len() {
            return None;
        }
        let mut decision = Decision::building();
        for (row, report) in decision.start_rows(reports.len()).iter_mut().zip(&reports) {
            *row = Row::decided(report.allowed, micros(report.retry_after));
            row.report(report.remaining, micros(report.reset_after));
        }
        decision.settle();
        Some(decision)
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
    pub fn admitted_unchecked(rules: &RuleSet) -> Self {
        let mut decision = Decision::building();
        for (row, rule) in decision.start_rows(rules.len()).iter_mut().zip(rules.compiled()) {
            *row = Row::decided(true, 0);
            row.report(rule.capacity, 0);
        }
        decision.settle();
        decision
    }

    /// This decision as it stands `since` later, each rule's waits that much shorter, with
    /// `units` more left (at most its limit; `rules` are the decision's): an answer given
    /// again, from a cached denial or from units reserved before. A refusal keeps a wait of at
    /// least a microsecond: it stays a refusal.
    pub fn later(&self, rules: &RuleSet, since: Duration, units: u64) -> Decision {
        let since = u64::try_from(since.as_micros()).unwrap_or(u64::MAX);
        let mut decision = Decision::building();
        let before = self.rows();
        for (at, (row, was)) in decision.start_rows(before.len()).iter_mut().zip(before).enumerate() {
            // Every row is made again, with or without its rule: a refusal stays one.
            let limit = rules.compiled().get(at).map_or(u64::MAX, |rule| rule.capacity);
            *row = Row::decided(was.allowed(), was.retry_after_micros.saturating_sub(since));
            row.report(
                was.remaining.saturating_add(units).min(limit),
                was.reset_after_micros.saturating_sub(since),
            );
        }
        decision.settle();
        decision
    }

    /// The binding rule's row.
    fn binding_row(&self) -> &Row {
        let (rows, binding) = match &self.rows {
            Rows::Inline { rows, binding, .. } => (&rows[..], *binding),
            Rows::Spilled { rows, binding } => (&rows[..], *binding),
        };
        &rows[usize::from(binding)]
    }

    /// Whether the request was admitted (by every rule: the binding rule admits only then).
    pub fn allowed(&self) -> bool {
        self.binding_row().allowed()
    }

    /// The binding rule's remaining units.
    pub fn remaining(&self) -> u64 {
        self.binding_row().remaining
    }

    /// The binding rule's time until it is back to full.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.binding_row().reset_after_micros)
    }

    /// Time until the same cost would be admitted by every rule (zero when admitted): the
    /// longest of the rules' waits, the binding rule's.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.binding_row().retry_after_micros)
    }

    /// How many rules the decision answers for.
    pub fn rule_count(&self) -> usize {
        self.rows().len()
    }

    /// The position of the most restrictive rule in the rule set.
    pub fn binding_index(&self) -> usize {
        match &self.rows {
            Rows::Inline { binding, .. } | Rows::Spilled { binding, .. } => usize::from(*binding),
        }
    }

    /// The most restrictive rule's outcome, joined to its rule in `rules` (the set the
    /// decision was made under).
    ///
    /// # Panics
    /// If `rules` has fewer rules than the decision.
    pub fn binding<'r>(&self, rules: &'r RuleSet) -> RuleOutcome<'r> {
        let at = self.binding_index();
        Decision::outcome(&rules.compiled()[at], self.binding_row())
    }

    /// Every rule's outcome, in the rule set's order, each joined to its rule in `rules` (the
    /// set the decision was made under; a set of other rules is read only as far as both go).
    pub fn outcomes<'d, 'r>(
        &'d self,
        rules: &'r RuleSet,
    ) -> impl ExactSizeIterator<Item = RuleOutcome<'r>> + Clone + use<'d, 'r> {
        rules.compiled().iter().zip(self.rows()).map(|(rule, row)| Decision::outcome(rule, row))
    }

    fn outcome<'r>(rule: &'r crate::ruleset::CompiledRule, row: &Row) -> RuleOutcome<'r> {
        RuleOutcome {
            name: rule.name.as_deref(),
            limit: rule.capacity,
            remaining: row.remaining,
            reset_after_micros: row.reset_after_micros,
            retry_after_micros: row.retry_after_micros,
            algorithm: rule.algorithm_name,
        }
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
    use crate::{Period, Rule};

    /// A decision of rows `(allowed, remaining, reset, retry)`, in seconds.
    fn decision(rows: &[(bool, u64, u64, u64)]) -> Decision {
        let mut d = Decision::building();
        for (row, &(allowed, remaining, reset, retry)) in d.start_rows(rows.len()).iter_mut().zip(rows) {
            *row = Row::decided(allowed, retry * 1_000_000);
            row.report(remaining, reset * 1_000_000);
        }
        d.settle();
        d
    }

    #[test]
    fn admitted_headline_is_the_rule_with_fewest_left() {
        let d = decision(&[(true, 5, 1, 0), (true, 2, 1, 0), (true, 2, 9, 0)]);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 2);
        assert_eq!(d.reset_after(), Duration::from_secs(9));
        assert_eq!(d.retry_after(), Duration::ZERO);
        assert_eq!(d.binding_index(), 2);
    }

    #[test]
    fn denied_headline_is_the_longest_wait() {
        let d = decision(&[(true, 0, 50, 0), (false, 0, 3, 3), (false, 1, 7, 7)]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(7));
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after(), Duration::from_secs(7));
    }

    #[test]
    fn a_refusal_always_has_a_wait_and_keeps_it_when_replayed() {
        let d = decision(&[(false, 0, 0, 0)]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Duration::from_micros(1));
        let rules = RuleSet::new([Rule::fixed_window(3, Period::SECOND)]).unwrap();
        let later = d.later(&rules, Duration::from_secs(5), 0);
        assert!(!later.allowed());
        assert_eq!(later.retry_after(), Duration::from_micros(1));
    }

    #[test]
    fn rows_past_the_inline_ones_are_kept_and_joined_to_their_rules() {
        let rules = RuleSet::new((1..=7).map(|limit| Rule::fixed_window(limit, Period::SECOND))).unwrap();
        let rows: Vec<_> = (0..7).map(|i| (true, 7 - i, 1, 0)).collect();
        let d = decision(&rows);
        assert_eq!(d.rule_count(), 7);
        assert_eq!(d.binding_index(), 6);
        let outcomes: Vec<_> = d.outcomes(&rules).map(|o| (o.limit(), o.remaining())).collect();
        assert_eq!(outcomes, (0..7).map(|i| (i + 1, 7 - i)).collect::<Vec<_>>());
        assert_eq!(d.binding(&rules).limit(), 7);
        let later = d.later(&rules, Duration::ZERO, 100);
        assert_eq!(
            later.outcomes(&rules).map(|o| o.remaining()).collect::<Vec<_>>(),
            (1..=7).collect::<Vec<_>>()
        );
    }

    proptest::proptest! {
        /// The one-pass search binds the rule the definition names: admitted, the fewest
        /// units left, then the longest time to full; denied, a refusing rule with the longest
        /// wait; the first of equals either way.
        #[test]
        fn the_binding_rule_is_the_definitions(
            rules in proptest::collection::vec((proptest::bool::ANY, 0u64..4, 0u64..4, 0u64..4), 2..9)
        ) {
            let d = decision(&rules);
            let allowed = rules.iter().all(|r| r.0);
            // A refusal's wait is at least a microsecond.
            let retry = |&(ok, _, _, retry): &(bool, u64, u64, u64)| if ok { 0 } else { (retry * 1_000_000).max(1) };
            let key = |i: &usize| {
                let r = &rules[*i];
                if allowed { (u64::MAX - r.1, r.2) } else { (u64::from(!r.0), retry(r)) }
            };
            let first_of_the_best = (0..rules.len()).rev().max_by_key(key).unwrap_or(0);
            proptest::prop_assert_eq!(d.allowed(), allowed);
            proptest::prop_assert_eq!(d.binding_index(), first_of_the_best);
        }
    }

    #[test]
    fn a_decision_of_five_rules_is_small_enough_to_move_without_a_memcpy_call() {
        // LLVM copies up to 128 bytes inline on x86-64 (eight 16-byte moves); a decision is
        // moved on every answer (into its `Ok`, out of the backend, into the response).
        assert!(std::mem::size_of::<Decision>() <= 128, "{}", std::mem::size_of::<Decision>());
        assert_eq!(INLINE_ROWS, 5);
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
        let rules = RuleSet::new([
            Rule::fixed_window(3, Period::SECOND).named("first"),
            Rule::gcra(3, Period::MINUTE, 3),
        ])
        .unwrap();
        let d = decision(&[(true, 3, 4, 0), (true, 3, 4, 0)]);
        assert_eq!(d.binding(&rules).name(), Some("first"));
    }
}
