//! What a simulation found: per rule and for the whole run, serialized as the JSON output or
//! printed as the table.

use std::path::PathBuf;

use serde::Serialize;
use tollgate_core::Rule;
use tollgate_limiter::Reserve;

use crate::time::seconds;

/// What one rule did with the traffic.
#[derive(Debug, Serialize)]
pub(crate) struct RuleRun {
    /// The rule's name, or its compact form.
    pub(crate) label: String,
    /// The rule as the configuration writes it.
    pub(crate) rule: Rule,
    /// Requests checked.
    pub(crate) requests: u64,
    /// Requests admitted.
    pub(crate) admitted: u64,
    /// Requests denied.
    pub(crate) denied: u64,
    /// Units admitted (the admitted requests' costs).
    pub(crate) admitted_units: u64,
    /// The most units admitted to one key in any span of 1 s.
    pub(crate) max_admitted_1s: u64,
    /// The rule's period (refill interval for a token bucket), in seconds.
    pub(crate) window_s: f64,
    /// The most units admitted to one key in any span of `window_s`.
    pub(crate) max_admitted_window: u64,
    /// Requests admitted in each bucket.
    pub(crate) admitted_per_bucket: Vec<u64>,
    /// Requests denied in each bucket.
    pub(crate) denied_per_bucket: Vec<u64>,
    /// With `--reserve`: what the limiters and their reservations did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reserve: Option<ReserveRun>,
}

/// A run through `--instances` limiters sharing one backend, with or without reservations.
#[derive(Debug, Serialize)]
pub(crate) struct ReserveRun {
    /// The policy's `reserve`: `"off"`, `"auto"` or `{"max": N}`.
    pub(crate) reserve: Reserve,
    /// Limiters sharing the backend, the requests dealt to them in turn.
    pub(crate) instances: usize,
    /// Calls to the backend: checks, reservations, refunds and heartbeats.
    pub(crate) backend_calls: u64,
    /// Backend calls per request.
    pub(crate) calls_per_decision: f64,
    /// Decisions answered from a reserved block (the reserving check included).
    pub(crate) reserved_decisions: u64,
    /// Blocks reserved, and reservations the backend refused.
    pub(crate) blocks: u64,
    pub(crate) refused: u64,
    /// Units reserved in all blocks.
    pub(crate) reserved_units: u64,
    /// Units held, not admitted, after the last request (given back as at a shutdown).
    pub(crate) held_at_end: u64,
    /// Unused units given back to the backend (those held at the end included, where the
    /// algorithm takes them back).
    pub(crate) returned: u64,
    /// Unused units that expired or could not go back.
    pub(crate) expired: u64,
}

impl RuleRun {
    /// Nothing decided yet, over `buckets` buckets.
    pub(crate) fn new(label: String, rule: &Rule, requests: u64, buckets: usize) -> Self {
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
            reserve: None,
        }
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The traffic as given.
    pub(crate) traffic: String,
    /// Simulated time, in seconds.
    pub(crate) duration_s: f64,
    /// Simulated time, in microseconds.
    #[serde(skip)]
    pub(crate) duration: u64,
    /// The bucket size, in microseconds.
    #[serde(skip)]
    pub(crate) bucket: u64,
    /// The bucket size, in seconds.
    pub(crate) bucket_s: f64,
    /// Requests in the traffic (within the duration).
    pub(crate) requests: u64,
    /// Distinct keys.
    pub(crate) keys: usize,
    /// CSV requests at or after the end, left out.
    pub(crate) dropped: usize,
    /// The SVG written, if any.
    pub(crate) chart: Option<PathBuf>,
    /// One entry per rule, in the order given.
    pub(crate) rules: Vec<RuleRun>,
}

/// Prints the report as the command's table.
pub(crate) fn print_table(report: &Report) {
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
    let reserved: Vec<(&RuleRun, &ReserveRun)> =
        report.rules.iter().filter_map(|r| Some((r, r.reserve.as_ref()?))).collect();
    let Some((_, first)) = reserved.first() else {
        return;
    };
    println!();
    println!(
        "{} sharing one backend, the requests dealt to them in turn",
        if first.instances == 1 { "1 instance".to_owned() } else { format!("{} instances", first.instances) }
    );
    println!();
    println!(
        "{:<width$}  {:>9}  {:>14}  {:>11}  {:>7}  {:>7}  {:>11}  {:>8}  {:>7}",
        "rule",
        "reserve",
        "calls/decision",
        "from blocks",
        "blocks",
        "refused",
        "held at end",
        "returned",
        "expired"
    );
    for (r, x) in reserved {
        println!(
            "{:<width$}  {:>9}  {:>14.4}  {:>11}  {:>7}  {:>7}  {:>11}  {:>8}  {:>7}",
            r.label,
            reserve_word(x.reserve),
            x.calls_per_decision,
            x.reserved_decisions,
            x.blocks,
            x.refused,
            x.held_at_end,
            x.returned,
            x.expired
        );
    }
}

/// `off`, `auto` or `max=N`, as `--reserve` writes it.
pub(crate) fn reserve_word(reserve: Reserve) -> String {
    match reserve {
        Reserve::Off => "off".into(),
        Reserve::Auto => "auto".into(),
        Reserve::Max(max) => format!("max={max}"),
    }
}
