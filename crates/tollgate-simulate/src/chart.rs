//! The SVG chart: one panel per rule, admitted (green) and denied (red) requests stacked per
//! time bucket, the rule's sustained rate as a dashed line and, for clock-aligned windows, the
//! window edges. Every panel shares the same axes, so panels compare at a glance.

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::combinators::{BindKeyPoints, WithKeyPoints};
use plotters::coord::types::RangedCoordu64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{Report, RuleRun};
use crate::rules;
use crate::time::{SECOND, round_step, seconds};
use crate::traffic::format_micros;

const WIDTH: u32 = 960;
/// The line above the panels: the traffic.
const HEADER: u32 = 34;
/// One rule's panel, its title and caption included.
const PANEL: u32 = 240;
/// A panel's title and caption.
const PANEL_HEAD: u32 = 46;

const ADMITTED: RGBColor = RGBColor(46, 140, 80);
const DENIED: RGBColor = RGBColor(226, 110, 100);
const RATE: RGBColor = RGBColor(40, 40, 40);
const EDGE: RGBColor = RGBColor(130, 130, 130);
const CAPTION: RGBColor = RGBColor(90, 90, 90);

/// Thousandths of a request: the vertical axis's unit.
const MILLI: u64 = 1_000;

/// Most window edges drawn; more would be a grey wash, not a guide.
const MAX_EDGES: u64 = 60;

/// Writes the chart of `report` to `path`.
pub fn draw(path: &Path, report: &Report) -> anyhow::Result<()> {
    let panels = report.rules.len() as u32;
    let root = SVGBackend::new(path, (WIDTH, HEADER + PANEL * panels)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(HEADER);
    let title = format!(
        "traffic {} for {}: {} requests; bars are requests per {}",
        report.traffic,
        seconds(report.duration_s),
        report.requests,
        seconds(report.bucket_s)
    );
    header.draw_text(&title, &("sans-serif", 17).into_font().color(&BLACK), (12, 12))?;
    // The traffic is the same for every rule, so every panel gets the same height: the busiest
    // bucket, with a little headroom.
    let busiest = report.rules.first().map_or(0, |run| {
        run.admitted_per_bucket.iter().zip(&run.denied_per_bucket).map(|(a, d)| a + d).max().unwrap_or(0)
    });
    let y_max = busiest + busiest / 10 + 1;
    for (area, run) in body.split_evenly((report.rules.len(), 1)).iter().zip(&report.rules) {
        panel(area, run, report, y_max)?;
    }
    root.present()?;
    Ok(())
}

/// A panel's plotting area: time and thousandths of a request, each ticked at round values.
type Chart<'a, DB> =
    ChartContext<'a, DB, Cartesian2d<WithKeyPoints<RangedCoordu64>, WithKeyPoints<RangedCoordu64>>>;

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    run: &RuleRun,
    report: &Report,
    y_max: u64,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (head, plot) = area.split_vertically(PANEL_HEAD);
    title(&head, run, report)?;
    let guides = Guides::of(run, report, y_max);
    legend(&head, guides.edges.is_some(), guides.rate_label.as_deref())?;
    let mut chart = axes(&plot, report, y_max)?;
    bars(&mut chart, run, report)?;
    guides.draw(&mut chart, report.duration, y_max)
}

/// The rule's name, and a caption of what it admitted.
fn title<DB: DrawingBackend>(
    head: &DrawingArea<DB, Shift>,
    run: &RuleRun,
    report: &Report,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    head.draw_text(
        &run.label,
        &("sans-serif", 19).into_font().style(FontStyle::Bold).color(&BLACK),
        (12, 8),
    )?;
    let mut caption = format!(
        "{} admitted, {} denied; at most {} admitted in any {}",
        run.admitted,
        run.denied,
        run.max_admitted_window,
        seconds(run.window_s)
    );
    if run.window_s != 1.0 {
        caption += &format!(", {} in any 1s", run.max_admitted_1s);
    }
    if report.keys > 1 {
        caption += " (to one key)";
    }
    if let Some(x) = &run.reserve {
        caption += &format!("; {:.3} backend calls per decision", x.calls_per_decision);
        if x.reserve.is_on() {
            caption += &format!(", {} blocks", x.blocks);
        }
    }
    head.draw_text(&caption, &("sans-serif", 15).into_font().color(&CAPTION), (12, 29))?;
    Ok(())
}

/// The dashed lines over a panel's bars.
struct Guides {
    /// The period of the rule's clock-aligned windows, when it has them and they are few
    /// enough to draw.
    edges: Option<u64>,
    /// The sustained rate in thousandths of a request per bucket: what the rule admits in the
    /// long run under overload; `None` when it is above every bar.
    rate: Option<u64>,
    /// The rate as the legend writes it: `10/1s`.
    rate_label: Option<String>,
}

impl Guides {
    fn of(run: &RuleRun, report: &Report, y_max: u64) -> Self {
        let (count, period) = rules::rate(&run.rule);
        let edges = rules::clock_windows(&run.rule)
            .map(|p| p.as_micros())
            .filter(|p| report.duration / p <= MAX_EDGES);
        let rate = u128::from(count) * u128::from(report.bucket) * u128::from(MILLI)
            / u128::from(period.as_micros());
        let rate = u64::try_from(rate).ok().filter(|&rate| rate <= y_max * MILLI);
        let rate_label =
            rate.map(|_| format!("{count}/{}", format_micros(period.as_micros()).replace(' ', "")));
        Guides { edges, rate, rate_label }
    }

    fn draw<DB: DrawingBackend>(
        &self,
        chart: &mut Chart<'_, DB>,
        duration: u64,
        y_max: u64,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        if let Some(every) = self.edges {
            for t in (1..).map(|k| k * every).take_while(|&t| t < duration) {
                chart.draw_series(DashedLineSeries::new(
                    [(t, 0), (t, y_max * MILLI)],
                    3,
                    3,
                    EDGE.stroke_width(1),
                ))?;
            }
        }
        if let Some(rate) = self.rate {
            chart.draw_series(DashedLineSeries::new(
                [(0, rate), (duration, rate)],
                6,
                4,
                RATE.stroke_width(2),
            ))?;
        }
        Ok(())
    }
}

/// The panel's axes and mesh. Time runs in microseconds (the simulation's own unit), ticked at
/// round durations; requests in thousandths, so that a rate of 1.67 per bucket is drawn where it
/// is, and ticked at whole requests.
fn axes<'a, DB: DrawingBackend>(
    plot: &'a DrawingArea<DB, Shift>,
    report: &Report,
    y_max: u64,
) -> anyhow::Result<Chart<'a, DB>>
where
    DB::ErrorType: 'static,
{
    let duration = report.duration;
    let step = [1, 2, 5].into_iter().flat_map(|m| (0..18).map(move |e| m * 10u64.pow(e)));
    let step = step.filter(|s| y_max.div_ceil(*s) <= 5).min().unwrap_or(1);
    let y_ticks: Vec<u64> = (0..=y_max / step).map(|k| k * step * MILLI).collect();
    let tick = round_step(duration, 10);
    let ticks: Vec<u64> = (0..=duration / tick).map(|k| k * tick).collect();
    let mut chart = ChartBuilder::on(plot)
        .margin_left(8)
        .margin_right(24)
        .margin_bottom(4)
        .x_label_area_size(22)
        .y_label_area_size(48)
        .build_cartesian_2d(
            (0..duration).with_key_points(ticks),
            (0..y_max * MILLI).with_key_points(y_ticks),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(format!("per {}", seconds(report.bucket_s)))
        .x_label_formatter(&|t| tick_label(*t))
        .y_label_formatter(&|y| (y / MILLI).to_string())
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;
    Ok(chart)
}

/// Admitted (green) and denied (red) requests, stacked per bucket.
fn bars<DB: DrawingBackend>(chart: &mut Chart<'_, DB>, run: &RuleRun, report: &Report) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (duration, bucket) = (report.duration, report.bucket);
    // A small gap between bars while they are wide enough to show one.
    let gap = if run.admitted_per_bucket.len() <= 200 { bucket / 8 } else { 0 };
    let span = |i: usize| (i as u64 * bucket, ((i as u64 + 1) * bucket - gap).min(duration));
    let bars = run.admitted_per_bucket.iter().zip(&run.denied_per_bucket).enumerate();
    chart.draw_series(bars.clone().filter(|(_, (a, _))| **a > 0).map(|(i, (a, _))| {
        let (x0, x1) = span(i);
        Rectangle::new([(x0, 0), (x1, a * MILLI)], ADMITTED.filled())
    }))?;
    chart.draw_series(bars.filter(|(_, (_, d))| **d > 0).map(|(i, (a, d))| {
        let (x0, x1) = span(i);
        Rectangle::new([(x0, a * MILLI), (x1, (a + d) * MILLI)], DENIED.filled())
    }))?;
    Ok(())
}

/// The key, at the right of a panel's title: admitted, denied, the rate line, window edges.
fn legend<DB: DrawingBackend>(
    head: &DrawingArea<DB, Shift>,
    edges: bool,
    rate: Option<&str>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let style = ("sans-serif", 14).into_font().color(&BLACK);
    let mut x = WIDTH as i32 - if edges { 480 } else { 380 };
    let y = 12;
    for (color, text) in [(ADMITTED, "admitted"), (DENIED, "denied")] {
        head.draw(&Rectangle::new([(x, y), (x + 11, y + 11)], color.filled()))?;
        head.draw_text(text, &style, (x + 15, y))?;
        x += 25 + 7 * text.len() as i32;
    }
    if let Some(rate) = rate {
        let label = format!("sustained rate {rate}");
        head.draw(&DashedPathElement::new([(x, y + 6), (x + 22, y + 6)], 6, 4, RATE.stroke_width(2)))?;
        head.draw_text(&label, &style, (x + 26, y))?;
        x += 36 + 7 * label.len() as i32;
    }
    if edges {
        head.draw(&DashedPathElement::new([(x + 5, y - 1), (x + 5, y + 12)], 3, 3, EDGE.stroke_width(1)))?;
        head.draw_text("window edge", &style, (x + 12, y))?;
    }
    Ok(())
}

/// An axis time: `1m30s`, `1.5s`, `250ms`.
fn tick_label(micros: u64) -> String {
    if (SECOND..60 * SECOND).contains(&micros) && !micros.is_multiple_of(SECOND) {
        format!("{}s", micros as f64 / SECOND as f64)
    } else {
        format_micros(micros).replace(' ', "")
    }
}
