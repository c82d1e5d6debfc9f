//! The machinery of `tollgate bench`: a load generator users point at their own Redis, Tollgate
//! server or Envoy-protocol service, reporting decisions per second, admitted and denied,
//! latency percentiles (HdrHistogram), and (against one Redis server) microseconds of Redis CPU
//! per decision. The command's arguments ([`BenchArgs`]) are defined here too; the `tollgate`
//! binary mounts them and calls [`run`].
//!
//! - `target`: one way of asking for a decision per kind of target.
//! - `load`: the workers, their pacing and key choice, and the progress bar.
//! - `report`: what a run measured ([`Summary`]), as JSON or a table, and Redis's CPU counters.

mod load;
mod report;
mod target;

use std::time::Duration;

use anyhow::bail;
use clap::{Args, ValueEnum};
use serde::Serialize;
use tollgate_core::Period;

pub use load::measure;
pub use report::Summary;

/// The algorithm the load is decided by.
///
/// Named as everywhere else in Tollgate (snake_case, as the API's JSON writes them); the
/// kebab-case spellings are accepted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BenchAlgorithm {
    /// Clock-aligned fixed window.
    #[value(alias = "fixed-window")]
    FixedWindow,
    /// Exact sliding window (a log).
    #[value(alias = "sliding-window-log")]
    SlidingWindowLog,
    /// Weighted two-window approximation.
    #[value(alias = "sliding-window-counter")]
    SlidingWindowCounter,
    /// Token bucket (capacity = limit, refilled at limit per period).
    #[value(alias = "token-bucket")]
    TokenBucket,
    /// GCRA (limit per period, burst = limit).
    Gcra,
}

impl BenchAlgorithm {
    /// Its name, as `--algorithm` and the JSON write it (`fixed_window`).
    pub fn as_str(self) -> &'static str {
        match self {
            BenchAlgorithm::FixedWindow => "fixed_window",
            BenchAlgorithm::SlidingWindowLog => "sliding_window_log",
            BenchAlgorithm::SlidingWindowCounter => "sliding_window_counter",
            BenchAlgorithm::TokenBucket => "token_bucket",
            BenchAlgorithm::Gcra => "gcra",
        }
    }
}

/// `tollgate bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to load: redis://host:port (Tollgate's Redis client path, in this process; any URL
    /// `tollgate serve --redis` takes), http://host:port (a `tollgate serve`'s POST /v1/check),
    /// or grpc://host:port (Envoy's ShouldRateLimit, in the domain `tollgate-bench`: the
    /// server's --envoy-config must declare that domain, a file holding `domain:
    /// tollgate-bench`, or the request's limit is ignored as upstream ignores it and every
    /// request is admitted).
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// The algorithm deciding each request [default: fixed_window for a grpc target, whose
    /// protocol can only ask for that; gcra otherwise].
    #[arg(long, value_enum)]
    pub algorithm: Option<BenchAlgorithm>,
    /// Requests each key may make per period.
    #[arg(long, default_value_t = 1000)]
    pub limit: u64,
    /// The period (1ms .. 1y). The grpc target needs a whole unit: 1s, 1m, 1h or 1d.
    #[arg(long, default_value = "1s")]
    pub period: Period,
    /// Size of the key space; each request picks a key at random.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Key churn: the key space slides steadily so that it is entirely new keys every DURATION
    /// (old keys go idle and expire), as users come and go. Off by default.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub churn: Option<Duration>,
    /// http target: check under this policy of the server's configuration instead of sending
    /// the rules (--algorithm, --limit, --period) with each request.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Requests per second at most, spread evenly over the workers (a steady load whatever the
    /// machine's other work); as fast as answers come without it.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Redis target: connections to open.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Redis target: most decisions per script call (1 = no coalescing).
    #[arg(long, default_value_t = 32)]
    pub coalesce: usize,
    /// Redis target: answer denials locally until they expire, as `tollgate serve` does by
    /// default (off here, so every decision reaches Redis unless asked).
    #[arg(long)]
    pub deny_cache: bool,
    /// Redis target: which engine decides inside Redis (auto, module or lua; module needs the
    /// Tollgate Redis module loaded).
    #[arg(long, default_value = "auto")]
    pub redis_engine: tollgate_redis::Engine,
    /// Print the summary as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// `--algorithm`, or the default for the target.
    pub fn algorithm(&self) -> BenchAlgorithm {
        match self.algorithm {
            Some(algorithm) => algorithm,
            None if self.target.starts_with("grpc://") => BenchAlgorithm::FixedWindow,
            None => BenchAlgorithm::Gcra,
        }
    }

    /// Refuses arguments no run can use, naming the flag.
    fn validate(&self) -> anyhow::Result<()> {
        if self.keys == 0 || self.concurrency == 0 {
            bail!("--keys and --concurrency must be above 0");
        }
        if self.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
            bail!("--rate must be a number of requests per second above 0");
        }
        if self.churn.is_some_and(|c| c.is_zero()) {
            bail!("--churn must be above 0");
        }
        if self.policy.is_some() && !self.target.starts_with("http://") {
            bail!("--policy names a policy of a server's configuration: it needs an http:// target");
        }
        Ok(())
    }
}

/// Runs the load and prints the summary.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    args.validate()?;
    let summary = measure(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        summary.print_table();
    }
    Ok(())
}
