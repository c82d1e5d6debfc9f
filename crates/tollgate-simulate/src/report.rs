//! What a simulation found: per rule and for the whole run, serialized as the JSON output or
//! printed as the table.

use std::path::PathBuf;

use serde::Serialize;
use tollgate_core::Rule;

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
}
