//! What a run measured: [`Summary`], printed as JSON or a table; and Redis's own CPU counters
//! for the scripts the run called.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{BenchAlgorithm, BenchArgs};

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct Summary {
    target: String,
    algorithm: BenchAlgorithm,
    keys: u64,
    /// Seconds in which the whole key space is replaced, with --churn.
    churn_seconds: Option<f64>,
    concurrency: usize,
    /// The requests per second asked for, with --rate.
    rate: Option<f64>,
    seconds: f64,
    decisions: u64,
    decisions_per_second: f64,
    allowed: u64,
    denied: u64,
    errors: u64,
    latency_us: Latency,
    /// Redis target only: microseconds of Redis CPU per decision (`INFO commandstats`).
    redis_cpu_us_per_decision: Option<f64>,
    /// Redis target only: script calls per decision (below 1 when coalesced).
    redis_calls_per_decision: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: u64,
    p90: u64,
    p99: u64,
    max: u64,
}

/// The answers of a run, by kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tally {
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) errors: u64,
}

impl Tally {
    /// Answered requests (errors are not decisions).
    pub(crate) fn decisions(&self) -> u64 {
        self.allowed + self.denied
    }
}

/// Latencies from 1 us to 60 s, to 3 significant figures (longer ones count as 60 s).
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// `TOLLGATE.DECIDE` + `FCALL` + `EVALSHA` + `EVAL` calls (the Redis module's command, the
/// engine's library, or its scripts without Redis Functions) and their microseconds so far,
/// from `INFO commandstats`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScriptStats {
    calls: u64,
    usec: f64,
}

impl ScriptStats {
    /// The counters of the Redis server at `url`.
    pub(crate) async fn read(url: &str) -> anyhow::Result<ScriptStats> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await?;
        let mut stats = ScriptStats { calls: 0, usec: 0.0 };
        let engine_calls =
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_tollgate.decide:"];
        for line in info.lines().filter(|l| engine_calls.iter().any(|c| l.starts_with(c))) {
            for field in line.split(':').nth(1).unwrap_or("").split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => stats.calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => stats.usec += v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
        }
        Ok(stats)
    }
}

/// What Redis spent per decision between two readings of its counters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RedisCost {
    /// Microseconds of Redis CPU.
    cpu_us: f64,
    /// Script calls (below 1 when coalesced).
    calls: f64,
}

impl RedisCost {
    /// The cost of `decisions` from the counters `before` and `after`; `None` without any.
    pub(crate) fn between(before: ScriptStats, after: ScriptStats, decisions: u64) -> Option<RedisCost> {
        (decisions > 0).then(|| {
            let decisions = decisions as f64;
            RedisCost {
                cpu_us: (after.usec - before.usec) / decisions,
                calls: (after.calls - before.calls) as f64 / decisions,
            }
        })
    }
}

impl Summary {
    /// The summary of a run of `args` that took `seconds`.
    pub(crate) fn new(
        args: &BenchArgs,
        seconds: f64,
        tally: Tally,
        latency: &Histogram<u64>,
        redis: Option<RedisCost>,
    ) -> Summary {
        let decisions = tally.decisions();
        Summary {
            target: args.target.clone(),
            algorithm: args.algorithm(),
            keys: args.keys,
            churn_seconds: args.churn.map(|c| c.as_secs_f64()),
            concurrency: args.concurrency,
            rate: args.rate,
            seconds,
            decisions,
            decisions_per_second: decisions as f64 / seconds,
            allowed: tally.allowed,
            denied: tally.denied,
            errors: tally.errors,
            latency_us: Latency {
                p50: latency.value_at_quantile(0.50),
                p90: latency.value_at_quantile(0.90),
                p99: latency.value_at_quantile(0.99),
                max: latency.max(),
            },
            redis_cpu_us_per_decision: redis.map(|r| r.cpu_us),
            redis_calls_per_decision: redis.map(|r| r.calls),
        }
    }

    /// Prints the summary as a table of named rows.
    pub fn print_table(&self) {
        let s = self;
        let row = |name: &str, value: String| println!("{name:<28} {value}");
        row("target", s.target.clone());
        row("algorithm", s.algorithm.as_str().to_owned());
        row("keys / concurrency", format!("{} / {}", s.keys, s.concurrency));
        if let Some(churn) = s.churn_seconds {
            row("key churn", format!("a new key space every {churn:.0} s"));
        }
        row("decisions/s", format!("{:.0} ({} in {:.1} s)", s.decisions_per_second, s.decisions, s.seconds));
        row("allowed / denied / errors", format!("{} / {} / {}", s.allowed, s.denied, s.errors));
        let l = &s.latency_us;
        row("latency p50 / p90 / p99 / max", format!("{} / {} / {} / {} us", l.p50, l.p90, l.p99, l.max));
        if let (Some(cpu), Some(calls)) = (s.redis_cpu_us_per_decision, s.redis_calls_per_decision) {
            row("Redis CPU per decision", format!("{cpu:.2} us ({calls:.3} script calls per decision)"));
        }
    }
}
