//! The chart of `scripts/bench-reserve-heat`: Redis calls per decision against a key's heat.
//! Reads the CSV the benchmark wrote (`bench_reserve_heat` in `crates/tollgate-redis/tests/reserve.rs`:
//! one row per rule, reserve mode and rate) and, optionally, a CSV of the same rates simulated
//! by `tollgate simulate --reserve auto` (`rule,reserve,rate,calls_per_decision`), and writes an
//! SVG with one log-log panel per rule: requests a second over the instances against Redis calls
//! per decision, a line per reserve mode measured, and the simulated ones dashed.
//!
//! Usage: `cargo run -p tollgate-devtools --bin reserve_heat_chart -- MEASURED.csv [SIMULATED.csv] OUT.svg`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use plotters::prelude::*;

/// One point: a rule, a reserve mode, a rate, what it cost.
#[derive(Clone, Debug, PartialEq)]
struct Point {
    rule: String,
    reserve: String,
    rate: f64,
    calls_per_decision: f64,
}

/// Reads `path`, a CSV with a header naming at least `rule`, `reserve`, `rate` and
/// `calls_per_decision`.
fn read(path: &Path) -> anyhow::Result<Vec<Point>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("in {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<Point>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().context("empty")?.split(',').map(str::trim).collect();
    let column =
        |name: &str| header.iter().position(|h| *h == name).with_context(|| format!("no column {name}"));
    let (rule, reserve, rate, per) =
        (column("rule")?, column("reserve")?, column("rate")?, column("calls_per_decision")?);
    let mut points = Vec::new();
    for (n, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        ensure!(
            fields.len() == header.len(),
            "line {}: {} fields, not {}",
            n + 2,
            fields.len(),
            header.len()
        );
        points.push(Point {
            rule: fields[rule].to_owned(),
            reserve: fields[reserve].to_lowercase(),
            rate: fields[rate].parse().with_context(|| format!("line {}: rate", n + 2))?,
            calls_per_decision: fields[per].parse().with_context(|| format!("line {}: calls", n + 2))?,
        });
    }
    ensure!(!points.is_empty(), "no rows");
    Ok(points)
}

/// A line of the chart: where it comes from, its points by rate.
struct Line {
    label: String,
    colour: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn lines_of(rule: &str, measured: &[Point], simulated: &[Point]) -> Vec<Line> {
    let mut lines = Vec::new();
    for (source, points, dashed) in [("Redis, measured", measured, false), ("simulated", simulated, true)] {
        let mut by_mode: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for p in points.iter().filter(|p| p.rule == rule) {
            by_mode.entry(p.reserve.as_str()).or_default().push((p.rate, p.calls_per_decision.max(1e-6)));
        }
        for (mode, mut points) in by_mode {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let colour = match (mode, dashed) {
                ("off", false) => RGBColor(0xff, 0x7f, 0x0e),
                ("off", true) => RGBColor(0xf5, 0xb8, 0x7a),
                (_, false) => RGBColor(0x08, 0x45, 0x94),
                (_, true) => RGBColor(0x6b, 0xae, 0xd6),
            };
            lines.push(Line { label: format!("reserve = \"{mode}\", {source}"), colour, dashed, points });
        }
    }
    lines
}

fn draw(measured: &[Point], simulated: &[Point], path: &Path) -> anyhow::Result<()> {
    let mut rules: Vec<&str> = Vec::new();
    for p in measured {
        if !rules.contains(&p.rule.as_str()) {
            rules.push(&p.rule);
        }
    }
    let all = || measured.iter().chain(simulated);
    let (x_min, x_max) = all().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.rate), hi.max(p.rate)));
    let y_min = all().map(|p| p.calls_per_decision.max(1e-6)).fold(1.0f64, f64::min);
    let y_min = 10f64.powf(y_min.log10().floor());
    let (width, panel, header) = (900u32, 420u32, 40u32);
    let root = SVGBackend::new(path, (width, header + panel * rules.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(header);
    top.draw(&Text::new(
        "Quota reservations: Redis calls per decision against a key's heat (one key, 4 instances)",
        (12, 12),
        ("sans-serif", 16).into_font().color(&BLACK),
    ))?;
    for (area, rule) in body.split_evenly((rules.len(), 1)).iter().zip(&rules) {
        let mut chart = ChartBuilder::on(area)
            .caption(*rule, ("sans-serif", 14))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((x_min / 1.5..x_max * 1.5).log_scale(), (y_min..2.0).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("requests a second, over the 4 instances")
            .y_desc("Redis calls per decision")
            .x_label_formatter(&|x| {
                if *x >= 1000.0 { format!("{:.0}k", x / 1000.0) } else { format!("{x:.0}") }
            })
            .y_label_formatter(&|y| format!("{y}"))
            .label_style(("sans-serif", 12))
            .draw()?;
        for line in lines_of(rule, measured, simulated) {
            let style = line.colour.stroke_width(2);
            let points = line.points.clone();
            if line.dashed {
                chart
                    .draw_series(DashedLineSeries::new(points, 6, 4, style))?
                    .label(line.label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
            } else {
                chart
                    .draw_series(LineSeries::new(points, style))?
                    .label(line.label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
                chart.draw_series(line.points.iter().map(|&p| Circle::new(p, 3, line.colour.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let (measured, simulated, output) = match &args[..] {
        [measured, output] => (read(measured)?, Vec::new(), output),
        [measured, simulated, output] => (read(measured)?, read(simulated)?, output),
        _ => bail!("usage: reserve_heat_chart MEASURED.csv [SIMULATED.csv] OUT.svg"),
    };
    draw(&measured, &simulated, output).with_context(|| format!("drawing {}", output.display()))?;
    println!("{}", output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEASURED: &str =
        "rule,reserve,rate,seconds,decisions,calls,calls_per_decision,blocks,from_blocks,admitted,elapsed_s
fixed_window 1000000/1m,Off,4,10,40,40,1,0,0,40,10.0
fixed_window 1000000/1m,Off,1000,10,10000,9000,0.9,0,0,10000,10.0
fixed_window 1000000/1m,Auto,4,10,40,40,1,0,0,40,10.0
fixed_window 1000000/1m,Auto,1000,10,10000,50,0.005,40,9950,10000,10.0
";
    const SIMULATED: &str = "rule,reserve,rate,calls_per_decision
fixed_window 1000000/1m,auto,4,1
fixed_window 1000000/1m,auto,1000,0.0018
";

    #[test]
    fn reads_the_columns_by_name() {
        let points = parse(MEASURED).unwrap();
        assert_eq!(points.len(), 4);
        assert_eq!(
            points[3],
            Point {
                rule: "fixed_window 1000000/1m".into(),
                reserve: "auto".into(),
                rate: 1000.0,
                calls_per_decision: 0.005
            }
        );
        assert!(parse("rule,reserve,rate\nx,off,1\n").is_err(), "a missing column is an error");
        assert!(parse(&format!("{MEASURED}x,off\n")).is_err(), "a short row is an error");
    }

    #[test]
    fn draws_a_line_per_mode_and_source() {
        let (measured, simulated) = (parse(MEASURED).unwrap(), parse(SIMULATED).unwrap());
        let lines = lines_of("fixed_window 1000000/1m", &measured, &simulated);
        let labels: Vec<&str> = lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "reserve = \"auto\", Redis, measured",
                "reserve = \"off\", Redis, measured",
                "reserve = \"auto\", simulated"
            ]
        );
        assert_eq!(lines[0].points, [(4.0, 1.0), (1000.0, 0.005)]);
        let dir = std::env::temp_dir().join(format!("reserve-heat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        draw(&measured, &simulated, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for label in labels {
            assert!(
                svg.contains(&label.replace('"', "&quot;")) || svg.contains(label),
                "no legend entry {label}"
            );
        }
        assert!(svg.contains("fixed_window 1000000/1m"));
    }
}
