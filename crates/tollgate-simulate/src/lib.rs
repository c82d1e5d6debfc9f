//! The machinery of `tollgate simulate`: replays a request pattern through each chosen rule on
//! a simulated clock and shows what each admits and denies over time: a text table, JSON, and an
//! SVG chart with one panel per rule, so users can choose an algorithm by seeing it. The command's
//! arguments ([`SimulateArgs`]) are defined here too; the `tollgate` binary mounts them and calls
//! [`run`]. This crate owns no server, backend or network code.
//!
//! Each rule gets its own engine: `tollgate_core`'s `MemoryBackend` on a `ManualClock` that is
//! set to each request's time before the request is checked. The decisions are therefore the
//! engine's own (the same code the server runs), and nothing sleeps: an hour of traffic takes as
//! long as its requests take to decide. See docs/simulate.md.
//!
//! - `rules` and `traffic`: the `--rules` and `--traffic` languages.
//! - `replay`: one rule's engine and clock over the traffic, and what it admitted.
//! - `reserve`: `--reserve` and `--instances`, a rule through the limiters `tollgate serve`
//!   decides with, several sharing one backend, with quota reservations on or off.
//! - `report`: the results, as the JSON output or the table; `chart`: the SVG.
//! - `time`: microseconds, the round steps of buckets and ticks, compact durations.

mod chart;
mod replay;
mod report;
mod reserve;
mod rules;
mod time;
mod traffic;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use report::{Report, print_table};
use time::{SECOND, round_step};
use tollgate_limiter::Reserve;
use traffic::{Traffic, format_micros};

/// Longest run: a year and a day, so that every simulated time stays far below 2^53 us.
const MAX_DURATION: u64 = 366 * 86_400 * SECOND;

/// Most time buckets per run: more would draw bars under half a pixel wide, in a heavy SVG.
const MAX_BUCKETS: u64 = 2_000;

/// `tollgate simulate` arguments.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The rules to compare, each simulated alone, in its own panel, against the same traffic:
    /// "fixed_window 100/1m", "sliding_window_log 100/1m", "sliding_window_counter 100/1m",
    /// "token_bucket 100/1m [capacity=N]", "gcra 100/1m burst=10", or a configuration rule
    /// as is ({ algorithm = "gcra", limit = 100, period = "1m", burst = 10 }). Repeat the flag
    /// or separate rules with commas; name=TEXT names a panel.
    #[arg(long = "rules", alias = "rule", value_name = "RULES", required = true)]
    rules: Vec<String>,
    /// The requests, in simulated time from 0: steady:50/s (evenly spaced), poisson:50/s
    /// (random, seeded), burst:100@59s (at once; ,every=1m repeats it), a CSV file of
    /// offset[,key[,cost]] lines; join patterns with +. Options: ,from=DUR ,to=DUR (steady,
    /// poisson), ,every=DUR (burst), ,seed=N (poisson), ,key=KEY ,cost=N (all).
    #[arg(long, value_name = "TRAFFIC")]
    traffic: Traffic,
    /// How much time to simulate (from 0; later requests are left out).
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The chart's time resolution (and the JSON's per-bucket counts) [default: a round
    /// duration giving at most 120 buckets].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    bucket: Option<Duration>,
    /// Write an SVG chart here: admitted and denied requests per bucket, one panel per rule.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print the results as JSON (for scripts) instead of a table.
    #[arg(long)]
    json: bool,
    /// Simulate quota reservations (a policy's `reserve`): auto, or max=N. Each rule is then
    /// shown twice, through --instances limiters sharing one backend: with reserve off, then
    /// on, with the backend calls per decision and the units held, given back and expired.
    #[arg(long, value_name = "auto|max=N", value_parser = reserve::parse_reserve)]
    reserve: Option<tollgate_limiter::Reserve>,
    /// With --reserve: the instances (limiters) sharing the backend, the requests dealt to
    /// them in turn.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "reserve")]
    instances: usize,
}

/// Runs the simulation and prints (and draws) its results.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let report = simulate(&args)?;
    if let Some(path) = &args.out {
        chart::draw(path, &report).with_context(|| format!("writing the chart {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn simulate(args: &SimulateArgs) -> anyhow::Result<Report> {
    let rules = rules::parse_all(&args.rules)?;
    let duration = u64::try_from(args.duration.as_micros()).unwrap_or(u64::MAX);
    if !(1_000..=MAX_DURATION).contains(&duration) {
        bail!("--duration must be between 1ms and 366 days");
    }
    let bucket = match args.bucket {
        Some(bucket) => {
            let bucket = u64::try_from(bucket.as_micros()).unwrap_or(u64::MAX);
            if bucket < 1_000 {
                bail!("--bucket must be at least 1ms");
            }
            if duration.div_ceil(bucket) > MAX_BUCKETS {
                bail!(
                    "--bucket {} cuts {} into {} buckets; at most {MAX_BUCKETS} are drawn (try --bucket {})",
                    format_micros(bucket),
                    format_micros(duration),
                    duration.div_ceil(bucket),
                    format_micros(round_step(duration, MAX_BUCKETS))
                );
            }
            bucket
        }
        None => round_step(duration, 120),
    };
    let requests = args.traffic.requests(duration).context("--traffic")?;
    let buckets = duration.div_ceil(bucket) as usize;
    let runs = match args.reserve {
        None => rules
            .iter()
            .map(|rule| replay::replay(rule, &requests, bucket, buckets))
            .collect::<Result<_, _>>()?,
        Some(on) => {
            // Every rule must take reservations before any is replayed.
            for rule in &rules {
                reserve::policy(rule, on)?;
            }
            let mut runs = Vec::new();
            for rule in &rules {
                let modes = if on.is_on() { vec![Reserve::Off, on] } else { vec![Reserve::Off] };
                for reserve in modes {
                    runs.push(reserve::replay(rule, &requests, bucket, buckets, reserve, args.instances)?);
                }
            }
            runs
        }
    };
    Ok(Report {
        traffic: args.traffic.text.clone(),
        duration_s: duration as f64 / SECOND as f64,
        duration,
        bucket,
        bucket_s: bucket as f64 / SECOND as f64,
        requests: requests.list.len() as u64,
        keys: requests.keys.len(),
        dropped: requests.dropped,
        chart: args.out.clone(),
        rules: runs,
    })
}
