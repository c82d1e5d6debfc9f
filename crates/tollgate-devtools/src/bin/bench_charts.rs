//! Charts of `bench/compare`'s results: reads the `results.json` it wrote and writes two SVGs
//! into a directory, `bench-decisions.svg` (decisions per second) and `bench-redis-us.svg`
//! (Redis CPU microseconds per decision), one panel per algorithm, a group of bars per
//! concurrency, a bar per contender: Tollgate's two engines (the Lua library and the Redis
//! module), rate-limiter-flexible, limits and redis-cell. A contender it does not know is an
//! error, not a missing bar.
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
    #[serde(default)]
    settings: Settings,
}

#[derive(Default, Deserialize)]
struct Settings {
    /// Runs per case; each figure is the median of its runs.
    #[serde(default)]
    repeats: Option<u64>,
}

#[derive(Deserialize)]
struct Case {
    algorithm: String,
    contender: String,
    concurrency: u64,
    decisions_per_second: f64,
    redis_us_per_decision: Option<f64>,
}

/// The contenders in legend order (bench/compare's), with their colours: Tollgate's engines in
/// two blues, the peers apart.
const CONTENDERS: [(&str, &str, RGBColor); 5] = [
    ("tollgate (lua)", "Tollgate, Lua library (FCALL)", RGBColor(0x6b, 0xae, 0xd6)),
    ("tollgate (module)", "Tollgate, Redis module (TOLLGATE.DECIDE)", RGBColor(0x08, 0x45, 0x94)),
    ("rate-limiter-flexible", "rate-limiter-flexible (Node, ioredis)", RGBColor(0xff, 0x7f, 0x0e)),
    ("limits", "limits (Python)", RGBColor(0x2c, 0xa0, 0x2c)),
    ("redis-cell", "redis-cell (CL.THROTTLE)", RGBColor(0xd6, 0x27, 0x28)),
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
        "token_bucket" => "token bucket (redis-cell: its GCRA, the same admissions)".into(),
        "gcra" => "GCRA".into(),
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
    let results = parse(&text).with_context(|| format!("reading {}", input.display()))?;
    for path in charts(&results, &out)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// The results, refused when a case names a contender the charts do not know (it would have
/// no bar and no legend entry, and look absent).
fn parse(text: &str) -> anyhow::Result<Results> {
    let results: Results = serde_json::from_str(text)?;
    if let Some(case) = results.cases.iter().find(|c| !CONTENDERS.iter().any(|(id, ..)| *id == c.contender)) {
        anyhow::bail!("unknown contender {:?}", case.contender);
    }
    Ok(results)
}

/// Both charts into `out`; returns their paths.
fn charts(results: &Results, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
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
    let mut written = Vec::new();
    for metric in &metrics {
        let path = out.join(metric.file);
        draw(results, metric, &path).with_context(|| format!("drawing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
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
    let width = 560 * columns as u32;
    // The legend, one entry per contender present (and the seed's line), wrapped into as many
    // rows as the width needs: five contenders do not fit on one row of a one-panel chart.
    let mut entries: Vec<(String, ShapeStyle, bool)> = CONTENDERS
        .iter()
        .filter(|(id, ..)| results.cases.iter().any(|c| c.contender == *id))
        .map(|(_, label, colour)| ((*label).to_string(), colour.filled(), false))
        .collect();
    if metric.seed && seed_panel.is_some() && !results.seed_baseline.is_empty() {
        entries.push(("seed system, published (token bucket)".into(), BLACK.stroke_width(3), true));
    }
    let mut placed = Vec::with_capacity(entries.len());
    let (mut x, mut row) = (12i32, 0i32);
    for entry in entries {
        // Text of 14 px runs about 6.5 px a character.
        let advance = 40 + (entry.0.chars().count() as i32) * 13 / 2;
        if x > 12 && x + advance > width as i32 {
            (x, row) = (12, row + 1);
        }
        placed.push((x, 40 + 22 * row, entry));
        x += advance;
    }
    let (panel_height, header) = (330u32, 64 + 22 * (row as u32 + 1) - 8);
    let root = SVGBackend::new(path, (width, header + panel_height * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(header);
    let runs = match results.settings.repeats {
        Some(n) if n > 1 => format!(", each figure the median of {n} runs"),
        _ => String::new(),
    };
    top.draw(&Text::new(
        format!("{} ({}{runs})", metric.title, results.date),
        (12, 8),
        ("sans-serif", 18).into_font().color(&BLACK),
    ))?;
    for (x, y, (label, style, line)) in placed {
        if line {
            top.draw(&PathElement::new(vec![(x, y + 7), (x + 16, y + 7)], style))?;
        } else {
            top.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], style))?;
        }
        top.draw(&Text::new(label, (x + 20, y), ("sans-serif", 14).into_font()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A results.json as bench/compare writes it (the fields the charts read), one case per
    /// contender and level.
    fn results_json(contenders: &[&str]) -> String {
        let mut cases = Vec::new();
        for (i, contender) in contenders.iter().enumerate() {
            for (j, level) in [1, 100].into_iter().enumerate() {
                let algorithm = if *contender == "redis-cell" { "gcra" } else { "fixed_window" };
                cases.push(serde_json::json!({
                    "algorithm": algorithm, "contender": contender, "concurrency": level,
                    "decisions_per_second": 1000.0 * (10 * i + j + 11) as f64,
                    "redis_us_per_decision": (10 * i + j + 11) as f64,
                }));
            }
        }
        serde_json::json!({
            "date": "2026-01-01", "cases": cases, "settings": {"repeats": 3},
            "seed_baseline": {"1": 250.0, "100": 5000.0},
        })
        .to_string()
    }

    #[test]
    fn every_contender_gets_its_legend_entry_and_bars() {
        let all: Vec<&str> = CONTENDERS.iter().map(|(id, ..)| *id).collect();
        let results = parse(&results_json(&all)).unwrap();
        let out = std::env::temp_dir().join(format!("bench-charts-test-{}", std::process::id()));
        let written = charts(&results, &out).unwrap();
        let decisions = std::fs::read_to_string(&written[0]).unwrap();
        let redis_us = std::fs::read_to_string(&written[1]).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        for (_, label, _) in CONTENDERS {
            assert!(decisions.contains(label) && redis_us.contains(label), "no legend entry {label}");
        }
        // Each contender's colour: its legend swatch and one bar per level, on both charts.
        for (id, _, RGBColor(r, g, b)) in CONTENDERS {
            let fill = format!("fill=\"#{r:02X}{g:02X}{b:02X}\"");
            for svg in [&decisions, &redis_us] {
                assert_eq!(svg.matches(&fill).count(), 3, "{id}: legend and 2 bars ({fill})");
            }
        }
        assert!(decisions.contains("median of 3 runs"));
        assert!(decisions.contains("GCRA") && decisions.contains("fixed window"));
    }

    #[test]
    fn an_unknown_contender_is_refused() {
        let error = parse(&results_json(&["tollgate (lua)", "tollgate"])).err().unwrap();
        assert!(error.to_string().contains("unknown contender \"tollgate\""), "{error}");
    }
}
