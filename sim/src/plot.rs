//! Latency CDFs, one line per policy, log-scaled latency axis.

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

/// Draws `series` (policy, sorted latencies in seconds) as CDFs into an SVG file.
///
/// # Errors
/// Empty input or a drawing failure.
#[expect(clippy::cast_precision_loss)]
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
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |x: DrawingAreaErrorKind<_>| anyhow!("plot: {x}");
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency CDF per policy", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo * 0.9..hi * 1.1).log_scale(), 0.0..1.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("latency (s, log scale)")
        .y_desc("fraction of invocations")
        .draw()
        .map_err(e)?;
    for (i, (name, v)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let n = v.len() as f64;
        // At most ~2000 points per line keeps the SVG small.
        let step = (v.len() / 2000).max(1);
        let pts = v
            .iter()
            .enumerate()
            .step_by(step)
            .map(|(k, &x)| (x.max(lo), (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Draws `series` (policy, `(seconds, limit)` at each change) as step lines into an SVG file:
/// the concurrency limit in force on GPU 0 over time.
///
/// # Errors
/// Empty input or a drawing failure.
#[expect(clippy::cast_precision_loss)]
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
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |x: DrawingAreaErrorKind<_>| anyhow!("plot: {x}");
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Concurrency limit in force on GPU 0", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..f64::from(top) + 1.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("limit ⌊D⌋")
        .draw()
        .map_err(e)?;
    for (i, (name, v)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        // Steps: each value holds until the next change; a small vertical offset per policy
        // keeps equal lines apart.
        let off = 0.04 * i as f64;
        let mut pts = Vec::with_capacity(v.len() * 2);
        for (k, &(t, l)) in v.iter().enumerate() {
            let y = f64::from(l) + off;
            if k > 0 {
                pts.push((t, f64::from(v[k - 1].1) + off));
            }
            pts.push((t, y));
        }
        if let Some(&(_, l)) = v.last() {
            pts.push((end, f64::from(l) + off));
        }
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
