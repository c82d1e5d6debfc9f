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

mod chart;
mod rules;
mod traffic;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use tollgate_core::{ManualClock, MemoryBackend, Operation, Rule, RuleSet, Timestamp};

use traffic::{Requests, Traffic, format_micros};

const SECOND: u64 = 1_000_000;

/// Where every rule's simulated clock starts: 2024-01-01T00:00:00Z, a whole number of days
/// since the Unix epoch (each rule then moves on to its next window edge: see [`start_of`]).
const BASE: u64 = 1_704_067_200 * SECOND;

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
}

/// Round bucket (and axis tick) sizes, in microseconds.
const ROUND_STEPS: [u64; 27] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    SECOND,
    2 * SECOND,
    5 * SECOND,
    10 * SECOND,
    15 * SECOND,
    30 * SECOND,
    60 * SECOND,
    2 * 60 * SECOND,
    5 * 60 * SECOND,
    10 * 60 * SECOND,
    15 * 60 * SECOND,
    30 * 60 * SECOND,
    3_600 * SECOND,
    2 * 3_600 * SECOND,
    6 * 3_600 * SECOND,
    12 * 3_600 * SECOND,
    86_400 * SECOND,
    7 * 86_400 * SECOND,
];

/// The smallest round step that cuts `span` into at most `most` pieces.
fn round_step(span: u64, most: u64) -> u64 {
    ROUND_STEPS.into_iter().find(|&step| span.div_ceil(step) <= most).unwrap_or(30 * 86_400 * SECOND)
}

/// What one rule did with the traffic.
#[derive(Debug, Serialize)]
pub struct RuleRun {
    /// The rule's name, or its compact form.
    label: String,
    /// The rule as the configuration writes it.
    rule: Rule,
    /// Requests checked.
    requests: u64,
    /// Requests admitted.
    admitted: u64,
    /// Requests denied.
    denied: u64,
    /// Units admitted (the admitted requests' costs).
    admitted_units: u64,
    /// The most units admitted to one key in any span of 1 s.
    max_admitted_1s: u64,
    /// The rule's period (refill interval for a token bucket), in seconds.
    window_s: f64,
    /// The most units admitted to one key in any span of `window_s`.
    max_admitted_window: u64,
    /// Requests admitted in each bucket.
    admitted_per_bucket: Vec<u64>,
    /// Requests denied in each bucket.
    denied_per_bucket: Vec<u64>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The traffic as given.
    traffic: String,
    /// Simulated time, in seconds.
    duration_s: f64,
    /// Simulated time, in microseconds.
    #[serde(skip)]
    duration: u64,
    /// The bucket size, in microseconds.
    #[serde(skip)]
    bucket: u64,
    /// The bucket size, in seconds.
    bucket_s: f64,
    /// Requests in the traffic (within the duration).
    requests: u64,
    /// Distinct keys.
    keys: usize,
    /// CSV requests at or after the end, left out.
    dropped: usize,
    /// The SVG written, if any.
    chart: Option<PathBuf>,
    /// One entry per rule, in the order given.
    rules: Vec<RuleRun>,
}

/// Where a rule's clock starts: the first multiple of its period at or after [`BASE`], so that
/// clock-aligned windows start at simulated time 0 (then at every multiple of the period).
fn start_of(rule: &Rule) -> u64 {
    let period = rules::rate(rule).1.as_micros();
    BASE.div_ceil(period) * period
}

/// The most `(time, units)` falling in any span `(t - span, t]`, for times in ascending order.
fn max_in_span(admitted: &[(u64, u64)], span: u64) -> u64 {
    let (mut best, mut sum, mut first) = (0, 0, 0);
    for &(at, units) in admitted {
        sum += units;
        while admitted[first].0 + span <= at {
            sum -= admitted[first].1;
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

impl RuleRun {
    /// Nothing decided yet, over `buckets` buckets.
    fn new(label: String, rule: &Rule, requests: u64, buckets: usize) -> Self {
        RuleRun {
            label,
            rule: rule.clone(),
            requests,
            admitted: 0,
            denied: 0,
            admitted_units: 0,
            max_admitted_1s: 0,
            window_s: 0.0,
            max_admitted_window: 0,
            admitted_per_bucket: vec![0; buckets],
            denied_per_bucket: vec![0; buckets],
        }
    }
}

/// Replays `requests` through `rule` on its own engine and clock.
fn replay(rule: &Rule, requests: &Requests, bucket: u64, buckets: usize) -> anyhow::Result<RuleRun> {
    let label = rules::label(rule);
    let set = RuleSet::new([rule.clone()]).with_context(|| label.clone())?;
    let start = start_of(rule);
    let clock = ManualClock::new(Timestamp::from_micros(start));
    let engine = MemoryBackend::with_clock(clock.clone());
    let mut run = RuleRun::new(label, rule, requests.list.len() as u64, buckets);
    let mut admitted_by_key: Vec<Vec<(u64, u64)>> = vec![Vec::new(); requests.keys.len()];
    for request in &requests.list {
        clock.set(Timestamp::from_micros(start + request.at));
        let key = &requests.keys[request.key];
        let decision =
            engine.execute_now(key, &set, Operation::Check { cost: request.cost }).with_context(|| {
                format!(
                    "{}: the request at {} (key {key:?}, cost {})",
                    run.label,
                    format_micros(request.at),
                    request.cost
                )
            })?;
        let at = (request.at / bucket) as usize;
        if decision.allowed() {
            run.admitted += 1;
            run.admitted_units += request.cost;
            run.admitted_per_bucket[at] += 1;
            admitted_by_key[request.key].push((request.at, request.cost));
        } else {
            run.denied += 1;
            run.denied_per_bucket[at] += 1;
        }
    }
    let window = rules::rate(rule).1.as_micros();
    run.window_s = window as f64 / SECOND as f64;
    for admitted in &admitted_by_key {
        run.max_admitted_1s = run.max_admitted_1s.max(max_in_span(admitted, SECOND));
        run.max_admitted_window = run.max_admitted_window.max(max_in_span(admitted, window));
    }
    Ok(run)
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
    let runs = rules.iter().map(|rule| replay(rule, &requests, bucket, buckets)).collect::<Result<_, _>>()?;
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

/// Seconds as a compact duration: `1m30s`, `250ms`.
fn seconds(s: f64) -> String {
    format_micros((s * SECOND as f64).round() as u64).replace(' ', "")
}

fn print_table(report: &Report) {
    let keys = if report.keys == 1 { "1 key".to_owned() } else { format!("{} keys", report.keys) };
    println!(
        "traffic {} for {}: {} requests, {keys}{}",
        report.traffic,
        seconds(report.duration_s),
        report.requests,
        if report.dropped > 0 {
            format!(" ({} after the end left out)", report.dropped)
        } else {
            String::new()
        }
    );
    if let Some(chart) = &report.chart {
        let buckets = report.rules.first().map_or(0, |r| r.admitted_per_bucket.len());
        println!("chart   {} ({buckets} buckets of {})", chart.display(), seconds(report.bucket_s));
    }
    println!();
    let width = report.rules.iter().map(|r| r.label.len()).max().unwrap_or(0).max(4);
    println!(
        "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  max in window",
        "rule", "requests", "admitted", "denied", "max in 1s"
    );
    for r in &report.rules {
        println!(
            "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {} in {}",
            r.label,
            r.requests,
            r.admitted,
            r.denied,
            r.max_admitted_1s,
            r.max_admitted_window,
            seconds(r.window_s)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_half_open_and_slide() {
        let s = SECOND;
        let admitted = [(0, 1), (s / 2, 1), (s, 1), (s + 1, 2), (3 * s, 1)];
        // (t - 1s, t]: at 1 s the one at 0 has left; at 1 s + 1 us the ones at 0.5, 1 and 1+ stay.
        assert_eq!(max_in_span(&admitted, s), 4);
        assert_eq!(max_in_span(&admitted, 1), 2);
        assert_eq!(max_in_span(&admitted, 10 * s), 6);
        assert_eq!(max_in_span(&[], s), 0);
    }

    #[test]
    fn buckets_are_round_and_few() {
        assert_eq!(round_step(120 * SECOND, 120), SECOND);
        assert_eq!(round_step(10 * SECOND, 120), 100_000);
        assert_eq!(round_step(180 * SECOND, 120), 2 * SECOND);
        assert_eq!(round_step(3_600 * SECOND, 120), 30 * SECOND);
        assert_eq!(round_step(1_000, 120), 1_000);
    }

    #[test]
    fn each_rule_starts_on_one_of_its_window_edges() {
        use tollgate_core::Period;
        for rule in [
            Rule::fixed_window(1, Period::MINUTE),
            Rule::sliding_window_counter(1, "7s".parse().unwrap()),
            Rule::fixed_window(1, Period::MAX),
        ] {
            let start = start_of(&rule);
            let period = rules::rate(&rule).1.as_micros();
            assert_eq!(start % period, 0, "{rule:?}");
            assert!((BASE..BASE + period).contains(&start));
        }
    }
}
