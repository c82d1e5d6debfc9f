//! Charts of `bench/compare`'s results: reads the `results.json` it wrote and writes two SVGs
//! into a directory, `bench-decisions.svg` (decisions per second) and `bench-redis-us.svg`
//! (Redis CPU microseconds per decision), one panel per algorithm, a group of bars per
//! concurrency, a bar per contender.
//!
//! Usage: `cargo run --release -p tollgate-devtools --bin bench_charts -- RESULTS.json OUT_DIR`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

/// The parts of `results.json` the charts need.
#[derive(Deserialize)]
struct Results {
    date: String,
    cases: Vec<Case>,
    #[serde(default)]
    seed_baseline: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct Case {
    algorithm: String,
    contender: String,
    concurrency: u64,
    decisions_per_second: f64,
    redis_us_per_decision: Option<f64>,
}

/// The contenders in legend order, with their colours.
const CONTENDERS: [(&str, &str, RGBColor); 3] = [
    ("tollgate", "Tollgate", RGBColor(0x1f, 0x77, 0xb4)),
    ("rate-limiter-flexible", "rate-limiter-flexible (Node, ioredis)", RGBColor(0xff, 0x7f, 0x0e)),
    ("limits", "limits (Python)", RGBColor(0x2c, 0xa0, 0x2c)),
];

/// What one chart shows of a case.
struct Metric {
    file: &'static str,
    title: &'static str,
    axis: &'static str,
    value: fn(&Case) -> Option<f64>,
    /// Whether the seed system's published decisions/s belong on this chart.
    seed: bool,
}

fn algorithm_label(algorithm: &str) -> String {
    match algorithm {
        "fixed_window" => "fixed window".into(),
        "sliding_window_counter" => "sliding window counter".into(),
        "sliding_window_log" => "sliding window log (limits: moving window)".into(),
        "token_bucket" => "token bucket (Tollgate only)".into(),
        "gcra" => "GCRA (Tollgate only)".into(),
        other => other.replace('_', " "),
    }
}

/// 12345.6 -> "12.3k", 950 -> "950", 3.14159 -> "3.1".
fn short(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value >= 1000.0 {
        format!("{:.1}k", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(input), Some(out)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: bench_charts RESULTS.json OUT_DIR");
    };
    let (input, out) = (PathBuf::from(input), PathBuf::from(out));
    let text = std::fs::read_to_string(&input).with_context(|| format!("reading {}", input.display()))?;
    let results: Results =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", input.display()))?;
    std::fs::create_dir_all(&out)?;
    let metrics = [
        Metric {
            file: "bench-decisions.svg",
            title: "Decisions per second against one private Redis (higher is better)",
            axis: "decisions/s",
            value: |c| Some(c.decisions_per_second),
            seed: true,
        },
        Metric {
            file: "bench-redis-us.svg",
            title: "Redis CPU per decision, INFO commandstats (lower is better)",
            axis: "Redis µs per decision",
            value: |c| c.redis_us_per_decision,
            seed: false,
        },
    ];
    for metric in &metrics {
        let path = out.join(metric.file);
        draw(&results, metric, &path).with_context(|| format!("drawing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn draw(results: &Results, metric: &Metric, path: &Path) -> anyhow::Result<()> {
    let mut algorithms: Vec<&str> = Vec::new();
    let mut levels: Vec<u64> = Vec::new();
    for case in &results.cases {
        if !algorithms.contains(&case.algorithm.as_str()) {
            algorithms.push(&case.algorithm);
        }
        if !levels.contains(&case.concurrency) {
            levels.push(case.concurrency);
        }
    }
    levels.sort_unstable();
    anyhow::ensure!(!algorithms.is_empty(), "no cases in the results");
    // The seed's figures go on the token bucket's panel (its algorithm), else the fixed window's.
    let seed_panel = ["token_bucket", "fixed_window"].into_iter().find(|a| algorithms.contains(a));

    let columns = algorithms.len().min(2);
    let rows = algorithms.len().div_ceil(columns);
    let (width, panel_height, header) = (560 * columns as u32, 330u32, 78u32);
    let root = SVGBackend::new(path, (width, header + panel_height * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(header);
    top.draw(&Text::new(
        format!("{} ({})", metric.title, results.date),
        (12, 8),
        ("sans-serif", 18).into_font().color(&BLACK),
    ))?;
    // One legend for every panel.
    let mut x = 12;
    let mut entries: Vec<(String, ShapeStyle, bool)> = CONTENDERS
        .iter()
        .filter(|(id, ..)| results.cases.iter().any(|c| c.contender == *id))
        .map(|(_, label, colour)| ((*label).to_string(), colour.filled(), false))
        .collect();
    if metric.seed && seed_panel.is_some() && !results.seed_baseline.is_empty() {
        entries.push(("seed system, published (token bucket)".into(), BLACK.stroke_width(3), true));
    }
    for (label, style, line) in entries {
        if line {
            top.draw(&PathElement::new(vec![(x, 47), (x + 16, 47)], style))?;
        } else {
            top.draw(&Rectangle::new([(x, 40), (x + 14, 54)], style))?;
        }
        top.draw(&Text::new(label.clone(), (x + 20, 40), ("sans-serif", 14).into_font()))?;
        x += 40 + (label.chars().count() as i32) * 13 / 2;
    }

    let panels = body.split_evenly((rows, columns));
    for (panel, algorithm) in panels.iter().zip(&algorithms) {
        let cases: Vec<&Case> = results.cases.iter().filter(|c| c.algorithm == *algorithm).collect();
        let present: Vec<_> =
            CONTENDERS.iter().filter(|(id, ..)| cases.iter().any(|c| c.contender == *id)).collect();
        let seed: Vec<(usize, f64)> = if metric.seed && seed_panel == Some(algorithm) {
            levels
                .iter()
                .enumerate()
                .filter_map(|(i, level)| results.seed_baseline.get(&level.to_string()).map(|v| (i, *v)))
                .collect()
        } else {
            Vec::new()
        };
        let top_value = cases
            .iter()
            .filter_map(|c| (metric.value)(c))
            .chain(seed.iter().map(|(_, v)| *v))
            .fold(0.0f64, f64::max);
        let y_max = if top_value > 0.0 { top_value * 1.18 } else { 1.0 };
        let n = levels.len() as f64;
        let mut chart = ChartBuilder::on(panel)
            .caption(algorithm_label(algorithm), ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(62)
            .build_cartesian_2d(0.0..n, 0.0..y_max)?;
        // The x axis is categorical: its labels are drawn under each group below.
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_label_formatter(&|y| short(*y))
            .y_desc(metric.axis)
            .label_style(("sans-serif", 12))
            .draw()?;
        let slot = 0.8 / present.len().max(1) as f64;
        let value_style =
            ("sans-serif", 11).into_font().into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Bottom));
        for (i, level) in levels.iter().enumerate() {
            for (j, (id, _, colour)) in present.iter().enumerate() {
                let Some(value) = cases
                    .iter()
                    .find(|c| c.contender == *id && c.concurrency == *level)
                    .and_then(|c| (metric.value)(c))
                else {
                    continue;
                };
                let left = i as f64 + 0.1 + slot * j as f64;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(left + slot * 0.06, 0.0), (left + slot * 0.94, value)],
                    colour.filled(),
                )))?;
                chart.draw_series(std::iter::once(Text::new(
                    short(value),
                    (left + slot * 0.5, value + y_max * 0.01),
                    value_style.clone(),
                )))?;
            }
        }
        let centred =
            ("sans-serif", 13).into_font().into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, level) in levels.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            root.draw(&Text::new(format!("{level} in flight"), (x, y + 8), centred.clone()))?;
        }
        for (i, value) in &seed {
            let left = *i as f64 + 0.06;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(left, *value), (left + 0.88, *value)],
                BLACK.stroke_width(3),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}
