//! Each concurrency law in closed loop over a measured table: what D a GPU would settle at.
//!
//! The GPU check (`tests/gpu/run.sh`, step 6) measures, for 1, 2, 4, 8 concurrent invocations
//! of a small kernel, NVML's busy-time, GPM's SM activity, the bursts completed per second and
//! each burst's time. Here the daemon's own controller ([`ConcurrencyController`]) is fed what
//! such a GPU would show at the limit it chooses — a backlogged node, every slot in use — and the
//! limits it settles at are reported beside the throughput and burst time the table gives there.

use std::fmt::Write as _;

use scheduler_core::concurrency::{ConcurrencyController, Law, Signals};
use scheduler_core::config::{ConcurrencyConfig, ConfigError, GpuMode};

/// One measured row: `n` concurrent invocations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Concurrent invocations.
    pub n: u32,
    /// NVML busy-time, 0–1.
    pub busy: f64,
    /// GPM SM activity, 0–1 (NaN: not measured).
    pub sm: f64,
    /// Bursts completed per second, all invocations together.
    pub bursts_per_s: f64,
    /// Mean time of one burst, ms.
    pub burst_ms: f64,
}

/// The table's problems, with the line at fault.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A line that does not parse.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No usable row, or no row for one invocation alone.
    #[error("the table needs a row for streams = 1 and finite busy, bursts_per_s, burst_ms")]
    NoBase,
}

/// Parses `streams,busy,sm,dram,bursts_per_s,burst_ms` (header first; `nan` allowed in sm and
/// dram). Rows whose busy, throughput or burst time is not finite are skipped (a failed run).
///
/// # Errors
/// [`TableError`] naming the line.
pub fn parse(text: &str) -> Result<Vec<Row>, TableError> {
    let mut rows = Vec::new();
    for (i, l) in text.lines().enumerate().skip(1) {
        let line = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() != 6 {
            return Err(TableError::Line {
                line,
                reason: format!("expected 6 fields, got {}", f.len()),
            });
        }
        let num = |k: usize| -> Result<f64, TableError> {
            f[k].parse::<f64>().map_err(|e| TableError::Line {
                line,
                reason: format!("field {}: {e}", k + 1),
            })
        };
        let n = f[0].parse::<u32>().map_err(|e| TableError::Line {
            line,
            reason: format!("streams: {e}"),
        })?;
        let row = Row {
            n,
            busy: num(1)?,
            sm: num(2)?,
            bursts_per_s: num(4)?,
            burst_ms: num(5)?,
        };
        if n > 0
            && row.busy.is_finite()
            && row.bursts_per_s.is_finite()
            && row.burst_ms.is_finite()
            && row.burst_ms > 0.0
        {
            rows.push(row);
        }
    }
    rows.sort_by_key(|r| r.n);
    rows.dedup_by_key(|r| r.n);
    if rows.first().is_none_or(|r| r.n != 1) {
        return Err(TableError::NoBase);
    }
    Ok(rows)
}

/// The table at `n`: linear between measured rows; past the last, bursts take longer in
/// proportion (time slicing), throughput and busy-time stay, SM activity grows to at most 1.
#[must_use]
pub fn at(rows: &[Row], n: u32) -> Row {
    let last = rows[rows.len() - 1];
    if n >= last.n {
        let k = f64::from(n) / f64::from(last.n);
        return Row {
            n,
            burst_ms: last.burst_ms * k,
            sm: (last.sm * k).min(1.0),
            ..last
        };
    }
    let hi = rows.iter().position(|r| r.n >= n).unwrap_or(0);
    let (b, a) = (rows[hi], rows[hi.saturating_sub(1)]);
    if b.n == n || a.n == b.n {
        return Row { n, ..b };
    }
    let t = f64::from(n - a.n) / f64::from(b.n - a.n);
    let mix = |x: f64, y: f64| x + t * (y - x);
    Row {
        n,
        busy: mix(a.busy, b.busy),
        sm: mix(a.sm, b.sm),
        bursts_per_s: mix(a.bursts_per_s, b.bursts_per_s),
        burst_ms: mix(a.burst_ms, b.burst_ms),
    }
}

/// Where one law settled.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The law, as named on the command line.
    pub law: &'static str,
    /// Limits in force over the second half of the run.
    pub limits: Vec<u32>,
    /// Their mean.
    pub mean_limit: f64,
    /// Bursts per second the table gives at those limits (mean).
    pub bursts_per_s: f64,
    /// Burst time there (mean), ms.
    pub burst_ms: f64,
}

/// Runs `law` for `samples` periods on a backlogged GPU that behaves as `rows` says, from the
/// plain mode's defaults with `d_max`. `gpm`: whether SM activity is shown to the controller.
///
/// # Errors
/// Bad knobs.
pub fn closed_loop(
    rows: &[Row],
    law: Law,
    gpm: bool,
    d_max: u32,
    samples: usize,
) -> Result<Vec<u32>, ConfigError> {
    let mut cfg = ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2);
    cfg.law = law;
    cfg.d_max = d_max.max(1);
    cfg.d_initial = cfg.d_initial.min(f64::from(cfg.d_max));
    let mut c = ConcurrencyController::new(cfg)?;
    let mut id = 0u64;
    let mut limits = Vec::with_capacity(samples);
    // The function's first invocation runs alone, as on an idle node.
    let mut n = 1;
    for _ in 0..samples {
        let r = at(rows, n);
        for k in 0..n {
            c.admitted(id + u64::from(k), true);
        }
        for k in 0..n {
            c.released(id + u64::from(k), "f", "", Some(r.burst_ms / 1e3));
        }
        id += u64::from(n);
        let signals = Signals {
            busy: Some(r.busy),
            sm_activity: (gpm && r.sm.is_finite()).then_some(r.sm),
        };
        c.observe(signals, true);
        n = c.limit();
        limits.push(n);
    }
    Ok(limits)
}

/// Every law over the table, with and without SM activity where the table has it.
///
/// # Errors
/// Bad knobs.
pub fn compare(rows: &[Row], d_max: u32, samples: usize) -> Result<Vec<Outcome>, ConfigError> {
    let has_sm = rows.iter().any(|r| r.sm.is_finite());
    let mut runs = vec![
        ("busy-time", Law::BusyTime, false),
        ("interference", Law::Interference, false),
    ];
    if has_sm {
        runs.push(("interference+gpm", Law::Interference, true));
    }
    runs.into_iter()
        .map(|(name, law, gpm)| {
            let all = closed_loop(rows, law, gpm, d_max, samples)?;
            let limits = all[all.len() / 2..].to_vec();
            #[expect(clippy::cast_precision_loss, reason = "a sample count")]
            let k = limits.len().max(1) as f64;
            let mean =
                |f: &dyn Fn(&Row) -> f64| limits.iter().map(|&l| f(&at(rows, l))).sum::<f64>() / k;
            Ok(Outcome {
                law: name,
                mean_limit: limits.iter().map(|&l| f64::from(l)).sum::<f64>() / k,
                bursts_per_s: mean(&|r| r.bursts_per_s),
                burst_ms: mean(&|r| r.burst_ms),
                limits,
            })
        })
        .collect()
}

/// The comparison as Markdown.
#[must_use]
pub fn report(rows: &[Row], outcomes: &[Outcome]) -> String {
    let mut t = String::from(
        "| streams | busy | SM | bursts/s | burst ms | slowdown |\n|---|---|---|---|---|---|\n",
    );
    let base = rows[0].burst_ms;
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {:.2} | {:.3} | {:.1} | {:.3} | {:.2}× |",
            r.n,
            r.busy,
            r.sm,
            r.bursts_per_s,
            r.burst_ms,
            r.burst_ms / base
        );
    }
    t.push_str(
        "\n| controller | limit settled at (mean) | range | bursts/s there | burst ms there |\n|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let lo = o.limits.iter().min().copied().unwrap_or(0);
        let hi = o.limits.iter().max().copied().unwrap_or(0);
        let _ = writeln!(
            t,
            "| {} | {:.2} | {lo}–{hi} | {:.1} | {:.3} |",
            o.law, o.mean_limit, o.bursts_per_s, o.burst_ms
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU whose busy-time reads 100 % from one invocation on, whose SMs are 30 % busy per
    /// invocation, and where bursts keep their speed up to 3 at a time, then time-slice.
    const TABLE: &str = "streams,busy,sm,dram,bursts_per_s,burst_ms\n\
        1,1.0,0.10,nan,100,10\n2,1.0,0.20,nan,200,10\n4,1.0,0.40,nan,300,13.3\n\
        8,1.0,0.40,nan,300,26.7\n";

    #[test]
    fn busy_time_pins_d_and_interference_finds_the_knee() {
        let rows = parse(TABLE).unwrap();
        assert_eq!(at(&rows, 3).burst_ms, (10.0 + 13.3) / 2.0);
        assert_eq!(at(&rows, 16).burst_ms, 26.7 * 2.0);
        let out = compare(&rows, 8, 600).unwrap();
        let by = |l: &str| out.iter().find(|o| o.law == l).unwrap();
        assert_eq!(by("busy-time").limits.iter().max(), Some(&1));
        let ours = by("interference");
        assert!(ours.mean_limit >= 3.0, "{ours:?}");
        assert!(ours.limits.iter().all(|&l| l <= 6), "{ours:?}");
        assert!(ours.bursts_per_s > 2.5 * by("busy-time").bursts_per_s);
        let gpm = by("interference+gpm");
        assert!(gpm.limits.iter().all(|&l| l <= 6), "{gpm:?}");
        assert!(report(&rows, &out).contains("| busy-time | 1.00 | 1–1 |"));
    }

    #[test]
    fn a_table_without_its_base_row_or_with_bad_lines_is_refused() {
        assert!(matches!(
            parse("h\n2,1,nan,nan,10,1\n"),
            Err(TableError::NoBase)
        ));
        let e = parse("h\n1,1,x,nan,10,1\n").unwrap_err();
        assert!(e.to_string().contains("line 2: field 3"), "{e}");
        assert!(
            parse("h\n1,1,0\n")
                .unwrap_err()
                .to_string()
                .contains("6 fields")
        );
        // A failed run (NaN throughput) is skipped, not fatal.
        let rows = parse("h\n1,1,nan,nan,10,1\n2,1,nan,nan,nan,nan\n").unwrap();
        assert_eq!(rows.len(), 1);
    }
}
