//! The soak's chart and verdict: reads the CSV `scripts/soak` wrote (one row per sample:
//! seconds, Tollgate's RSS in KiB, Redis's `used_memory` in bytes, Redis's key count, decisions
//! so far), writes an SVG of the four over time, and says whether Tollgate's RSS and Redis's
//! memory are flat once warm: over the second half of the run (the first is warm-up: the key
//! space fills and the first churned keys expire), the least-squares trend may move each by at
//! most 5 % of its mean. Exits with 1 when either grows (or shrinks) more.
//!
//! Usage: `cargo run --release -p tollgate-devtools --bin soak_chart -- SOAK.csv OUT.svg`

use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use plotters::prelude::*;

/// Most a trend may move a memory figure over the second half, in % of its mean there.
const FLAT_PERCENT: f64 = 5.0;

/// One sample.
#[derive(Clone, Copy)]
struct Sample {
    seconds: f64,
    rss_kib: f64,
    redis_bytes: f64,
    keys: f64,
    decisions: f64,
}

/// One panel of the chart.
struct Series {
    title: &'static str,
    unit: &'static str,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Least-squares slope of `points` (per x unit).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

/// The trend's move over the second half of `points`, in % of the mean there.
fn second_half_growth(points: &[(f64, f64)]) -> (f64, f64) {
    let end = points.last().map_or(0.0, |p| p.0);
    let half: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0 >= end / 2.0).collect();
    let mean = half.iter().map(|p| p.1).sum::<f64>() / half.len() as f64;
    let span = half.last().map_or(0.0, |p| p.0) - half.first().map_or(0.0, |p| p.0);
    (mean, slope(&half) * span / mean * 100.0)
}

fn read(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<f64> = line
            .split(',')
            .map(|f| f.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("{}:{}: {line:?}", path.display(), n + 1))?;
        let [seconds, rss_kib, redis_bytes, keys, decisions] = fields[..] else {
            bail!("{}:{}: expected 5 fields, got {line:?}", path.display(), n + 1);
        };
        samples.push(Sample { seconds, rss_kib, redis_bytes, keys, decisions });
    }
    ensure!(samples.len() >= 8, "too few samples ({}) to judge", samples.len());
    Ok(samples)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(input), Some(output)) = (args.next(), args.next()) else {
        bail!("usage: soak_chart SOAK.csv OUT.svg");
    };
    let (input, output) = (PathBuf::from(input), PathBuf::from(output));
    let samples = read(&input)?;
    let minutes = |s: &Sample| s.seconds / 60.0;
    let mib = 1024.0 * 1024.0;
    // Decisions per second between one sample and the next.
    let rate: Vec<(f64, f64)> = samples
        .windows(2)
        .map(|w| {
            (minutes(&w[1]), (w[1].decisions - w[0].decisions) / (w[1].seconds - w[0].seconds).max(1e-9))
        })
        .collect();
    let series = [
        Series {
            title: "tollgate serve: RSS",
            unit: "MiB",
            colour: RGBColor(0x1f, 0x77, 0xb4),
            points: samples.iter().map(|s| (minutes(s), s.rss_kib / 1024.0)).collect(),
        },
        Series {
            title: "Redis: used_memory",
            unit: "MiB",
            colour: RGBColor(0xd6, 0x27, 0x28),
            points: samples.iter().map(|s| (minutes(s), s.redis_bytes / mib)).collect(),
        },
        Series {
            title: "Redis: keys",
            unit: "keys",
            colour: RGBColor(0x2c, 0xa0, 0x2c),
            points: samples.iter().map(|s| (minutes(s), s.keys)).collect(),
        },
        Series {
            title: "decisions per second",
            unit: "decisions/s",
            colour: RGBColor(0x7f, 0x7f, 0x7f),
            points: rate,
        },
    ];

    let mut flat = true;
    let total_minutes = samples.last().map_or(0.0, minutes);
    let decisions = samples.last().map_or(0.0, |s| s.decisions) - samples[0].decisions;
    println!(
        "{:.1} min, {} samples, {:.0} decisions ({:.0}/s)",
        total_minutes,
        samples.len(),
        decisions,
        decisions / (total_minutes * 60.0)
    );
    for (i, s) in series.iter().enumerate() {
        let (mean, growth) = second_half_growth(&s.points);
        let max = s.points.iter().map(|p| p.1).fold(0.0, f64::max);
        // Memory must be flat; keys and rate are shown for context.
        let judged = i < 2;
        let verdict = match (judged, growth.abs() <= FLAT_PERCENT) {
            (false, _) => "",
            (true, true) => "flat",
            (true, false) => "NOT FLAT",
        };
        flat &= !judged || growth.abs() <= FLAT_PERCENT;
        println!(
            "{:<22} second half: mean {:>10.1} {:<11} trend {:+6.2} %  (max {:.1})  {verdict}",
            s.title, mean, s.unit, growth, max
        );
    }
    draw(&series, total_minutes, &output).with_context(|| format!("drawing {}", output.display()))?;
    println!("{}", output.display());
    if flat {
        println!("memory is flat once warm (trend within {FLAT_PERCENT} % over the second half)");
        Ok(())
    } else {
        println!("memory is NOT flat once warm (a trend beyond {FLAT_PERCENT} % over the second half)");
        std::process::exit(1);
    }
}

fn draw(series: &[Series], total_minutes: f64, path: &Path) -> anyhow::Result<()> {
    let (width, panel_height, header) = (900u32, 210u32, 40u32);
    let root =
        SVGBackend::new(path, (width, header + panel_height * series.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(header);
    top.draw(&Text::new(
        format!(
            "Soak: tollgate serve on one Redis, {total_minutes:.0} min of steady load with key churn \
             (the second half, right of the dashed line, is judged)"
        ),
        (12, 12),
        ("sans-serif", 16).into_font().color(&BLACK),
    ))?;
    for (panel, s) in body.split_evenly((series.len(), 1)).iter().zip(series) {
        let top_value = s.points.iter().map(|p| p.1).fold(0.0f64, f64::max);
        let y_max = if top_value > 0.0 { top_value * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(panel)
            .caption(s.title, ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..total_minutes.max(1e-9), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .y_desc(s.unit)
            .y_label_formatter(&|y| match *y {
                y if y >= 10_000.0 => format!("{:.0}k", y / 1000.0),
                y if y >= 100.0 => format!("{y:.0}"),
                y => format!("{y:.1}"),
            })
            .label_style(("sans-serif", 12))
            .draw()?;
        chart.draw_series(AreaSeries::new(s.points.iter().copied(), 0.0, s.colour.mix(0.15)))?;
        chart.draw_series(LineSeries::new(s.points.iter().copied(), s.colour.stroke_width(2)))?;
        let half = total_minutes / 2.0;
        chart.draw_series(DashedLineSeries::new(
            [(half, 0.0), (half, y_max)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))?;
    }
    root.present()?;
    Ok(())
}
