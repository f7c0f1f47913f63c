//! Turning a run into numbers: latency percentiles, per-function slowdown, Jain's fairness index,
//! GPU busy fraction, throughput, tier counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

pub use crate::fairness::jain;
use crate::fairness::{Share, gpu_share};
use crate::trace::Trace;
use crate::types::{Audit, SimOutput};
use scheduler_core::tiers::Tier;

/// Per-function figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionStats {
    /// Function name.
    pub name: String,
    /// Invocations.
    pub count: usize,
    /// Mean solo exec time, ms.
    pub exec_ms: f64,
    /// Mean latency (arrival to end), ms.
    pub mean_ms: f64,
    /// P99 latency, ms.
    pub p99_ms: f64,
    /// Mean of latency / exec.
    pub mean_slowdown: f64,
}

/// Invocations by container tier at dispatch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TierCounts {
    /// Ran on a Hot container.
    pub hot: usize,
    /// Needed a restore from host memory.
    pub warm: usize,
    /// Needed a cold start.
    pub cold: usize,
}

/// The JSON summary `mqfq-sim run` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Policy.
    pub policy: String,
    /// Invocations.
    pub invocations: usize,
    /// Mean latency, ms.
    pub mean_ms: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// P99 latency, ms.
    pub p99_ms: f64,
    /// Mean latency of short functions (mean exec below the threshold), ms.
    pub short_mean_ms: Option<f64>,
    /// Mean latency of the other functions, ms.
    pub long_mean_ms: Option<f64>,
    /// Threshold between short and long functions, ms of exec.
    pub short_threshold_ms: f64,
    /// Jain's index over per-function mean slowdown (1 = perfectly even).
    pub jain_slowdown: f64,
    /// The worst function's mean slowdown over the best one's.
    pub slowdown_spread: f64,
    /// GPU-time share against the weighted fair share while backlogged (see [`crate::fairness`]).
    pub share: Share,
    /// Fraction of GPU capacity in use over the makespan (∫U dt / (makespan × GPUs)).
    pub gpu_busy: f64,
    /// Fraction of the makespan in which anything executed (NVML's `utilization.gpu`, what
    /// `nvidia-smi` shows as GPU utilization).
    pub gpu_busy_time: f64,
    /// Completed invocations per second of makespan.
    pub throughput_per_s: f64,
    /// Tier counts.
    pub tiers: TierCounts,
    /// MB moved over PCIe.
    pub pcie_mb: f64,
    /// The Warm tier's restores and what it held.
    pub warm: crate::types::WarmStats,
    /// Makespan, s.
    pub makespan_s: f64,
    /// Time-averaged D per GPU.
    pub mean_d: f64,
    /// Time-averaged slots held per GPU.
    pub mean_slots: f64,
    /// Mean latency per tenant, ms (tenants given in the trace only).
    pub per_tenant_mean_ms: BTreeMap<String, f64>,
    /// Per function.
    pub per_function: Vec<FunctionStats>,
    /// The simulator's self-checks.
    pub audit: Audit,
}

/// Nearest-rank percentile of sorted data (`p` in 0..=100); NaN for empty input.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "a sample count; the rank is >= 1 and clamped to it"
)]
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[expect(clippy::cast_precision_loss, reason = "a sample count")]
fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Each completed invocation's latency (arrival to end), seconds, in trace order.
#[must_use]
pub fn latencies_s(trace: &Trace, out: &SimOutput) -> Vec<f64> {
    trace
        .invocations
        .iter()
        .zip(&out.records)
        .map(|(i, r)| (r.end_ms - i.arrival_ms) / 1e3)
        .filter(|x| x.is_finite())
        .collect()
}

/// Summarizes a run; `short_threshold_ms` splits short from long functions by mean exec time.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "GPU and invocation counts")]
pub fn summarize(trace: &Trace, out: &SimOutput, short_threshold_ms: f64) -> Summary {
    let n = trace.functions.len();
    let mut lat_by_f: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut slow_by_f: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut exec_by_f: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut all = Vec::with_capacity(out.records.len());
    let mut tiers = TierCounts::default();
    let mut tenants: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (inv, r) in trace.invocations.iter().zip(&out.records) {
        if !r.end_ms.is_finite() {
            continue;
        }
        let lat = r.end_ms - inv.arrival_ms;
        all.push(lat);
        lat_by_f[inv.func].push(lat);
        slow_by_f[inv.func].push(lat / inv.exec_ms);
        exec_by_f[inv.func].push(inv.exec_ms);
        if let Some(t) = &trace.functions[inv.func].tenant {
            tenants.entry(t.clone()).or_default().push(lat);
        }
        match r.tier {
            Tier::Hot => tiers.hot += 1,
            Tier::Warm => tiers.warm += 1,
            Tier::Cold => tiers.cold += 1,
        }
    }
    let mut per_function = Vec::new();
    let (mut short, mut long) = (Vec::new(), Vec::new());
    let mut slowdowns = Vec::new();
    for f in 0..n {
        let Some(m) = mean(&lat_by_f[f]) else {
            continue;
        };
        let exec = mean(&exec_by_f[f]).unwrap_or(f64::NAN);
        let mut sorted = lat_by_f[f].clone();
        sorted.sort_by(f64::total_cmp);
        let sd = mean(&slow_by_f[f]).unwrap_or(f64::NAN);
        slowdowns.push(sd);
        if exec < short_threshold_ms {
            short.extend_from_slice(&lat_by_f[f]);
        } else {
            long.extend_from_slice(&lat_by_f[f]);
        }
        per_function.push(FunctionStats {
            name: trace.functions[f].name.clone(),
            count: lat_by_f[f].len(),
            exec_ms: exec,
            mean_ms: m,
            p99_ms: percentile(&sorted, 99.0),
            mean_slowdown: sd,
        });
    }
    let mut sorted = all.clone();
    sorted.sort_by(f64::total_cmp);
    let makespan_s = out.makespan_ms / 1e3;
    Summary {
        policy: out.policy.clone(),
        invocations: all.len(),
        mean_ms: mean(&all).unwrap_or(f64::NAN),
        p50_ms: percentile(&sorted, 50.0),
        p99_ms: percentile(&sorted, 99.0),
        short_mean_ms: mean(&short),
        long_mean_ms: mean(&long),
        short_threshold_ms,
        jain_slowdown: jain(&slowdowns),
        slowdown_spread: slowdowns.iter().copied().fold(f64::NAN, f64::max)
            / slowdowns.iter().copied().fold(f64::NAN, f64::min),
        share: gpu_share(trace, &out.records),
        gpu_busy: if out.makespan_ms > 0.0 {
            out.busy_ms / (out.makespan_ms * out.gpus as f64)
        } else {
            0.0
        },
        gpu_busy_time: if out.makespan_ms > 0.0 {
            out.busy_time_ms / (out.makespan_ms * out.gpus as f64)
        } else {
            0.0
        },
        throughput_per_s: if makespan_s > 0.0 {
            all.len() as f64 / makespan_s
        } else {
            0.0
        },
        tiers,
        pcie_mb: out.pcie_mb,
        warm: out.warm,
        makespan_s,
        mean_d: out.mean_d,
        mean_slots: out.mean_slots,
        per_tenant_mean_ms: tenants
            .into_iter()
            .filter_map(|(k, v)| mean(&v).map(|m| (k, m)))
            .collect(),
        per_function,
        audit: out.audit,
    }
}

/// The per-invocation CSV: `function,arrival_ms,start_ms,end_ms,tier`, one row per trace row.
#[must_use]
pub fn per_invocation_csv(trace: &Trace, out: &SimOutput) -> String {
    let mut s = String::from("function,arrival_ms,start_ms,end_ms,tier\n");
    for (inv, r) in trace.invocations.iter().zip(&out.records) {
        let tier = match r.tier {
            Tier::Hot => "hot",
            Tier::Warm => "warm",
            Tier::Cold => "cold",
        };
        let _ = writeln!(
            s,
            "{},{:.3},{:.3},{:.3},{}",
            trace.functions[inv.func].name, inv.arrival_ms, r.start_ms, r.end_ms, tier
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_jain() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(jain(&[2.0, 2.0, 2.0]), 1.0);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
    }
}
