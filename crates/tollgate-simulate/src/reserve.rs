//! `--reserve` and `--instances`: a rule replayed through `--instances` limiters
//! (`tollgate_limiter::Limiter`, the code `tollgate serve` decides with) sharing one memory
//! backend on the simulated clock, the requests dealt to them in turn, under a policy with
//! reservations on (issue 21) or off. What is reported is the limiters' own accounting
//! (`Limiter::reserve_stats`) and the calls the shared backend answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use tollgate_core::{
    Backend, BatchPlan, Clock, Decision, Error, ManualClock, MemoryBackend, Operation, Rule, RuleSet,
    Timestamp,
};
use tollgate_limiter::{Limiter, LimiterSettings, Policy, Reserve};

use crate::replay::{start_of, tally};
use crate::report::{ReserveRun, RuleRun, reserve_word};
use crate::rules;
use crate::traffic::Requests;

/// Most instances: each is a limiter with its own tables.
pub(crate) const MAX_INSTANCES: usize = 64;

/// `--reserve`: `auto`, `max=N` (or `off`).
pub(crate) fn parse_reserve(text: &str) -> Result<Reserve, String> {
    match text.trim() {
        "off" => Ok(Reserve::Off),
        "auto" => Ok(Reserve::Auto),
        other => {
            let max = other
                .strip_prefix("max=")
                .ok_or_else(|| format!("{other:?}: expected auto, max=N or off"))?
                .parse::<u64>()
                .map_err(|e| format!("{other:?}: max=N takes a whole number of units ({e})"))?;
            if max == 0 {
                return Err("max=0: max must be at least 1 (off is none)".into());
            }
            Ok(Reserve::Max(max))
        }
    }
}

/// The policy `rule` is simulated under with `reserve`; refused, with the configuration's
/// message, for rules that cannot take reservations.
pub(crate) fn policy(rule: &Rule, reserve: Reserve) -> anyhow::Result<Policy> {
    let label = rules::label(rule);
    let set = RuleSet::new([rule.clone()]).with_context(|| label.clone())?;
    Policy::enforce("simulate", set)
        .with_reserve(reserve)
        .with_context(|| format!("--reserve {}: {label}", reserve_word(reserve)))
}

/// The backend the instances share: the memory backend on the simulated clock, counting the
/// calls it answers, and knowing which instances sent heartbeats for a key (as the Redis
/// backend's per-key set does).
struct Shared {
    engine: MemoryBackend<ManualClock>,
    clock: ManualClock,
    calls: AtomicU64,
    /// key -> instance -> last heartbeat.
    heartbeats: Mutex<HashMap<String, HashMap<String, Timestamp>>>,
}

#[async_trait]
impl Backend for Shared {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.engine.execute_now(key, rules, op)
    }

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.engine.reset_now(key, rules)
    }

    async fn heartbeat(&self, key: &str, instance: &str, window: Duration) -> Result<u64, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let mut all = self.heartbeats.lock().unwrap_or_else(|e| e.into_inner());
        let seen = all.entry(key.to_owned()).or_default();
        seen.insert(instance.to_owned(), now);
        seen.retain(|_, at| now < at.saturating_add(window));
        Ok(seen.len() as u64)
    }

    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.engine.check_planned_now(batch)
    }
}

/// Replays `requests` through `rule` under `reserve`, on `instances` limiters sharing one
/// backend. The limiters run on a Tokio runtime of their own, in a thread of its own (the
/// command itself may be running on one).
pub(crate) fn replay(
    rule: &Rule,
    requests: &Requests,
    bucket: u64,
    buckets: usize,
    reserve: Reserve,
    instances: usize,
) -> anyhow::Result<RuleRun> {
    if !(1..=MAX_INSTANCES).contains(&instances) {
        bail!("--instances must be between 1 and {MAX_INSTANCES}");
    }
    let policy = policy(rule, reserve)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| replay_here(rule, requests, bucket, buckets, &policy, instances))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn replay_here(
    rule: &Rule,
    requests: &Requests,
    bucket: u64,
    buckets: usize,
    policy: &Policy,
    instances: usize,
) -> anyhow::Result<RuleRun> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let start = start_of(rule);
    let clock = ManualClock::new(Timestamp::from_micros(start));
    let backend = Arc::new(Shared {
        engine: MemoryBackend::with_clock(clock.clone()),
        clock: clock.clone(),
        calls: AtomicU64::new(0),
        heartbeats: Mutex::default(),
    });
    // Failures cannot happen here; `closed` would show one rather than hide it.
    let settings =
        LimiterSettings { on_failure: tollgate_limiter::FailurePolicy::Closed, ..Default::default() };
    let limiters: Vec<Limiter> = (0..instances)
        .map(|_| Limiter::with_clock(backend.clone(), "simulate", settings.clone(), clock.clone()))
        .collect();
    let label = match policy.reserve {
        Reserve::Off => rules::label(rule),
        reserve => format!("{} reserve={}", rules::label(rule), reserve_word(reserve)),
    };
    let mut turn = 0;
    let mut run = tally(label, rule, requests, bucket, buckets, |request, key| {
        clock.set(Timestamp::from_micros(start + request.at));
        let limiter = &limiters[turn % instances];
        turn += 1;
        runtime.block_on(async {
            let verdict = limiter.check(key, policy, request.cost).await?;
            // Refunds of expired blocks go on in tasks of their own: let them land now, as
            // they would within the next moments.
            tokio::task::yield_now().await;
            Ok::<_, anyhow::Error>(verdict.allowed())
        })
    })?;
    let held_at_end: u64 = limiters.iter().map(|l| l.reserve_stats().held).sum();
    runtime.block_on(async {
        for limiter in &limiters {
            limiter.shutdown().await;
        }
        tokio::task::yield_now().await;
    });
    let mut x = ReserveRun {
        reserve: policy.reserve,
        instances,
        backend_calls: backend.calls.load(Ordering::Relaxed),
        calls_per_decision: 0.0,
        reserved_decisions: 0,
        blocks: 0,
        refused: 0,
        reserved_units: 0,
        held_at_end,
        returned: 0,
        expired: 0,
    };
    for stats in limiters.iter().map(Limiter::reserve_stats) {
        x.reserved_decisions += stats.decisions;
        x.blocks += stats.blocks;
        x.refused += stats.refused;
        x.reserved_units += stats.reserved_units;
        x.returned += stats.returned;
        x.expired += stats.expired;
    }
    x.calls_per_decision = x.backend_calls as f64 / run.requests.max(1) as f64;
    run.reserve = Some(x);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_auto_max_or_off() {
        assert_eq!(parse_reserve("auto"), Ok(Reserve::Auto));
        assert_eq!(parse_reserve("off"), Ok(Reserve::Off));
        assert_eq!(parse_reserve("max=500"), Ok(Reserve::Max(500)));
        assert!(parse_reserve("max=0").unwrap_err().contains("at least 1"));
        assert!(parse_reserve("max=lots").unwrap_err().contains("whole number"));
        assert!(parse_reserve("on").unwrap_err().contains("expected auto, max=N or off"));
    }

    #[test]
    fn sliding_rules_refuse_reservations_with_the_configurations_message() {
        let rule = rules::parse("sliding_window_log 100/1m").unwrap();
        let e = format!("{:#}", policy(&rule, Reserve::Auto).unwrap_err());
        assert!(e.starts_with("--reserve auto: sliding_window_log 100/1m: reserve cannot be used"), "{e}");
        assert!(policy(&rule, Reserve::Off).is_ok());
    }
}
