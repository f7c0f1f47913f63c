//! The simulator's figures: latency CDFs (log-scaled latency axis) and the concurrency limit over
//! time, one line per policy.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xd6, 0x27, 0x28),
];

/// One chart: its caption, axis names, where the legend goes, and one line per policy.
struct Chart<'a> {
    caption: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    legend: SeriesLabelPosition,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
}

/// Draws `chart` into an SVG file on the given axes (a log or a linear x range).
fn render<X>(path: &Path, x: X, y: std::ops::Range<f64>, chart: Chart<'_>) -> Result<()>
where
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |x: DrawingAreaErrorKind<_>| anyhow!("plot: {x}");
    root.fill(&WHITE).map_err(e)?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in chart.lines.into_iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        c.draw_series(LineSeries::new(pts, colour.stroke_width(2)))
            .map_err(e)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    c.configure_series_labels()
        .position(chart.legend)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Draws `series` (policy, sorted latencies in seconds) as CDFs into an SVG file.
///
/// # Errors
/// Empty input or a drawing failure.
#[expect(clippy::cast_precision_loss, reason = "point counts and indices")]
pub fn cdf(path: &Path, series: &[(&str, Vec<f64>)]) -> Result<()> {
    let lo = series
        .iter()
        .filter_map(|(_, v)| v.first().copied())
        .fold(f64::INFINITY, f64::min)
        .max(1e-3);
    let hi = series
        .iter()
        .filter_map(|(_, v)| v.last().copied())
        .fold(0.0, f64::max);
    if hi.is_nan() || hi <= lo {
        return Err(anyhow!("no latencies to plot"));
    }
    let lines = series
        .iter()
        .map(|(name, v)| {
            let n = v.len() as f64;
            // At most ~2000 points per line keeps the SVG small.
            let step = (v.len() / 2000).max(1);
            let pts = v
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(k, &x)| (x.max(lo), (k + 1) as f64 / n))
                .collect();
            (*name, pts)
        })
        .collect();
    let chart = Chart {
        caption: "Latency CDF per policy",
        x_desc: "latency (s, log scale)",
        y_desc: "fraction of invocations",
        legend: SeriesLabelPosition::LowerRight,
        lines,
    };
    render(path, (lo * 0.9..hi * 1.1).log_scale(), 0.0..1.0, chart)
}

/// Draws `series` (policy, `(seconds, limit)` at each change) as step lines into an SVG file:
/// the concurrency limit in force on GPU 0 over time.
///
/// # Errors
/// Empty input or a drawing failure.
#[expect(clippy::cast_precision_loss, reason = "a series index")]
pub fn limits(path: &Path, series: &[(&str, Vec<(f64, u32)>)]) -> Result<()> {
    let end = series
        .iter()
        .filter_map(|(_, v)| v.last().map(|p| p.0))
        .fold(0.0, f64::max);
    let top = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    if end <= 0.0 || top == 0 {
        return Err(anyhow!("no limits to plot"));
    }
    let lines = series
        .iter()
        .enumerate()
        .map(|(i, (name, v))| {
            // Steps: each value holds until the next change; a small vertical offset per policy
            // keeps equal lines apart.
            let off = 0.04 * i as f64;
            let mut pts = Vec::with_capacity(v.len() * 2 + 1);
            for (k, &(t, l)) in v.iter().enumerate() {
                if k > 0 {
                    pts.push((t, f64::from(v[k - 1].1) + off));
                }
                pts.push((t, f64::from(l) + off));
            }
            if let Some(&(_, l)) = v.last() {
                pts.push((end, f64::from(l) + off));
            }
            (*name, pts)
        })
        .collect();
    let chart = Chart {
        caption: "Concurrency limit in force on GPU 0",
        x_desc: "time (s)",
        y_desc: "limit ⌊D⌋",
        legend: SeriesLabelPosition::UpperRight,
        lines,
    };
    render(path, 0.0..end, 0.0..f64::from(top) + 1.0, chart)
}
