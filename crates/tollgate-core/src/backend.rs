//! [`Backend`]: where rule states live. Implemented by [`MemoryBackend`](crate::MemoryBackend)
//! here and by `tollgate_redis::RedisBackend`; both give identical decisions.

use async_trait::async_trait;

use crate::decision::{Acquisition, Lease, LeaseId};
use crate::{BatchPlan, Decision, Error, Operation, Part, RuleSet};

/// A store of rule states that runs [`Operation`]s atomically.
///
/// Backends implement [`execute`](Backend::execute) and [`reset`](Backend::reset); the other
/// methods are conveniences over them.
///
/// ```
/// use tollgate_core::{Backend, MemoryBackend, Period, Rule, RuleSet};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let backend = MemoryBackend::new();
/// let rules = RuleSet::new([Rule::fixed_window(2, Period::MINUTE)]).unwrap();
/// assert!(backend.check("user:7", &rules, 1).await.unwrap().allowed());
/// assert!(backend.check("user:7", &rules, 1).await.unwrap().allowed());
/// let denied = backend.check("user:7", &rules, 1).await.unwrap();
/// assert!(!denied.allowed());
/// assert!(denied.retry_after() > std::time::Duration::ZERO);
/// # }
/// ```
#[async_trait]
pub trait Backend: Send + Sync {
    /// Runs `op` on `key`'s state under `rules`, atomically.
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error>;

    /// [`execute`](Backend::execute) without awaiting, for a backend that decides in process
    /// (the memory backend); `None`, the default, for one that must await I/O, whose callers
    /// then await `execute`. A caller on the hot path tries this first and so spares the
    /// in-process answer `execute`'s boxed future.
    fn try_execute_now(
        &self,
        key: &str,
        rules: &RuleSet,
        op: Operation<'_>,
    ) -> Option<Result<Decision, Error>> {
        let _ = (key, rules, op);
        None
    }

    /// Forgets `key`'s state under `rules` (every rule back to full; leases dropped).
    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error>;

    /// Which engine decides, for a backend that has more than one (the Redis backend: `module`
    /// where the Tollgate Redis module is loaded, else `lua`); `None` for the others.
    fn engine(&self) -> Option<&'static str> {
        None
    }

    /// Checks that the backend answers (within its timeout); a health probe. Backends that are
    /// always there, like the in-process one, keep this default.
    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Records that `instance` (a limiter process) holds reservations on `key`, and answers
    /// how many instances did so within the last `window`, this one included (at least 1).
    /// A limiter sizes its reserved blocks by it, so that the units held idle across all
    /// instances stay a bounded share of the limit. The default, for backends that only one
    /// process uses (the in-process one), answers 1.
    async fn heartbeat(&self, key: &str, instance: &str, window: std::time::Duration) -> Result<u64, Error> {
        let _ = (key, instance, window);
        Ok(1)
    }

    /// Decides several parts in one atomic step (see [`Part`]; most are checks, any
    /// [`Operation`] can be one): the parts of a group are admitted all or nothing; groups are decided in the order they first appear. Returns each
    /// part's decision, in the parts' order: its own rules' verdicts (so a part can be
    /// `allowed()` while its group was refused for another part), with what remains after the
    /// batch.
    ///
    /// It validates and plans the batch ([`BatchPlan::new`]), then decides it with
    /// [`check_planned`](Self::check_planned), which is what a backend implements: callers
    /// that plan first (the limiter) call `check_planned` directly, so a backend overriding
    /// this method instead would not be asked.
    async fn check_batch(&self, parts: &[Part<'_>]) -> Result<Vec<Decision>, Error> {
        self.check_planned(&BatchPlan::new(parts)?).await
    }

    /// [`check_batch`](Self::check_batch) of a batch its caller has validated and planned, so
    /// that a batch is planned once however many layers it passes (a limiter validates before
    /// its backend decides).
    ///
    /// The default decides a batch whose groups are single parts, one `execute` each, and
    /// refuses joint groups with [`Error::JointUnsupported`]; both of Tollgate's backends
    /// decide any batch in one step.
    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        if batch.groups().any(|group| group.len() > 1) {
            return Err(Error::JointUnsupported);
        }
        let mut decisions = Vec::with_capacity(batch.parts().len());
        for part in batch.parts() {
            decisions.push(self.execute(part.key, part.rules, part.op).await?);
        }
        Ok(decisions)
    }

    /// [`check_planned`](Self::check_planned) without awaiting, for a backend that decides in
    /// process; `None`, the default, for one that must await I/O. As
    /// [`try_execute_now`](Self::try_execute_now), for a batch: an Envoy request comes this way.
    fn try_check_planned_now(&self, batch: &BatchPlan<'_>) -> Option<Result<Vec<Decision>, Error>> {
        let _ = batch;
        None
    }

    /// Admits `cost` units if every rule allows, all or nothing; a cost of 0 peeks.
    async fn check(&self, key: &str, rules: &RuleSet, cost: u64) -> Result<Decision, Error> {
        self.execute(key, rules, Operation::Check { cost }).await
    }

    /// Like [`check`](Backend::check), and concurrency rules hold the units under a new lease
    /// until [`release`](Backend::release)d or expired.
    async fn acquire(&self, key: &str, rules: &RuleSet, cost: u64) -> Result<Acquisition, Error> {
        let id = LeaseId::random();
        let decision = self.execute(key, rules, Operation::Acquire { cost, lease: &id }).await?;
        let taken = decision.allowed() && cost > 0 && rules.has_concurrency();
        let lease = taken.then_some(Lease { id, units: cost });
        Ok(Acquisition { decision, lease })
    }

    /// Gives back a lease's units; reports the state after, as a peek.
    async fn release(&self, key: &str, rules: &RuleSet, lease: &Lease) -> Result<Decision, Error> {
        self.execute(key, rules, Operation::Release { lease }).await
    }

    /// Gives back `amount` units consumed for cancelled work; reports the state after, as a peek.
    async fn refund(&self, key: &str, rules: &RuleSet, amount: u64) -> Result<Decision, Error> {
        self.execute(key, rules, Operation::Refund { amount }).await
    }
}
