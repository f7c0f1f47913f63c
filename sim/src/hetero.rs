//! Heterogeneous nodes: GPUs of different models, functions that differ in how compute- or
//! memory-bound they are, and where each invocation is placed.
//!
//! A trace's `exec_ms` is measured on the reference model (an A30, the simulator's default
//! GPU). On another model the share `bw` of it that is bound by memory bandwidth scales with the
//! ratio of bandwidths and the rest with the ratio of FLOPS (the table of
//! `scheduler_core::placement::models`). Placement applies to `mqfq-sticky`, whose node core
//! admits an invocation on the GPU placement chose: `least-loaded` (the core's own routing),
//! `fitness` (`scheduler_core::placement`, what `mqfqd` runs at Create, fed each burst's time
//! and the function's SM and bandwidth shares as NVML's per-process samples would give them),
//! `round-robin` and `random`.

use scheduler_core::placement::GpuModel;
use scheduler_core::placement::models::{builtin, lookup};

use crate::trace::Trace;

/// The model a trace's `exec_ms` is measured on.
pub const REFERENCE: &str = "NVIDIA A30";

pub use crate::types::{PLACEMENTS, PlacementMode};

/// The models of `names` (NVML-style names; unknown ones stand in as the reference).
#[must_use]
pub fn models(names: &[String]) -> Vec<GpuModel> {
    let table = builtin();
    names.iter().map(|n| lookup(&table, n)).collect()
}

/// Per GPU: its host link's speed against the reference model's (the model table's
/// `pcie_gbps`); all 1 on a node without models.
#[must_use]
pub fn link_factors(names: &[String], gpus: usize) -> Vec<f64> {
    let reference = lookup(&builtin(), REFERENCE);
    let models = models(names);
    (0..gpus)
        .map(|g| {
            models
                .get(g)
                .map_or(1.0, |m| m.pcie_gbps / reference.pcie_gbps)
        })
        .collect()
}

/// `[gpu][function]`: how much longer (or shorter) each function's solo run is on each GPU
/// than on the reference model; all 1 on a node without models.
#[must_use]
pub fn exec_factors(names: &[String], gpus: usize, trace: &Trace) -> Vec<Vec<f64>> {
    let reference = lookup(&builtin(), REFERENCE);
    let models = models(names);
    (0..gpus)
        .map(|g| {
            trace
                .functions
                .iter()
                .map(|f| {
                    models.get(g).map_or(1.0, |m| {
                        (1.0 - f.bw) * reference.tflops / m.tflops
                            + f.bw * reference.mem_gbps / m.mem_gbps
                    })
                })
                .collect()
        })
        .collect()
}

/// Latency mean and standard deviation (s) of a run.
pub(crate) fn spread(trace: &Trace, out: &crate::SimOutput) -> (f64, f64) {
    let lat = crate::report::latencies_s(trace, out);
    #[expect(clippy::cast_precision_loss, reason = "invocation counts")]
    let n = lat.len().max(1) as f64;
    let mean = lat.iter().sum::<f64>() / n;
    let var = lat.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// How many calls ran on each GPU, in GPU order (`1200 / 2300`).
pub(crate) fn calls_per_gpu(out: &crate::SimOutput, gpus: usize) -> String {
    let mut n = vec![0_u64; gpus];
    for g in out.records.iter().filter_map(|r| r.gpu) {
        if let Some(c) = n.get_mut(g) {
            *c += 1;
        }
    }
    n.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
}

/// One `mqfq-sticky` run as the comparison tables report it.
pub(crate) struct StickyRun {
    pub(crate) summary: crate::Summary,
    pub(crate) mean_s: f64,
    pub(crate) std_s: f64,
    pub(crate) out: crate::SimOutput,
}

impl StickyRun {
    /// The cells the placement and the cluster tables both start a row with: mean, p99 and
    /// standard deviation of latency, short functions' mean, GPU busy.
    pub(crate) fn latency_cells(&self) -> String {
        let s = &self.summary;
        format!(
            "{:.2} | {:.2} | {:.2} | {} | {:.1} %",
            self.mean_s,
            s.p99_ms / 1e3,
            self.std_s,
            s.short_mean_ms
                .map_or_else(|| "-".into(), |v| format!("{:.2}", v / 1e3)),
            s.gpu_busy * 100.0,
        )
    }
}

/// `mqfq-sticky` over `trace` under each of `cfgs`, in order.
pub(crate) fn sticky_runs(
    trace: &Trace,
    cfgs: impl IntoIterator<Item = crate::SimConfig>,
    short_ms: f64,
) -> Result<Vec<StickyRun>, crate::SimError> {
    cfgs.into_iter()
        .map(|c| {
            c.validate()?;
            let out = crate::run_policy("mqfq-sticky", trace, &c)?;
            let (mean_s, std_s) = spread(trace, &out);
            Ok(StickyRun {
                summary: crate::summarize(trace, &out, short_ms),
                mean_s,
                std_s,
                out,
            })
        })
        .collect()
}

/// `mqfq-sticky` under every placement: a Markdown table with each one's mean, P99 and
/// standard deviation of completion time (arrival to end), GPU busy, and ratios to `fitness`.
///
/// # Errors
/// A bad knob.
pub fn report(
    trace: &Trace,
    cfg: &crate::SimConfig,
    short_ms: f64,
) -> Result<String, crate::SimError> {
    use std::fmt::Write as _;
    let rows: Vec<(PlacementMode, StickyRun, String)> = sticky_runs(
        trace,
        PLACEMENTS.map(|p| crate::SimConfig {
            placement: p,
            ..cfg.clone()
        }),
        short_ms,
    )?
    .into_iter()
    .zip(PLACEMENTS)
    .map(|(r, p)| {
        let calls = calls_per_gpu(&r.out, cfg.gpus);
        (p, r, calls)
    })
    .collect();
    let mut models = if cfg.gpu_models.is_empty() {
        format!("{} × reference ({REFERENCE})", cfg.gpus)
    } else {
        cfg.gpu_models.join(" + ")
    };
    if !cfg.gpu_mem_each_mb.is_empty() {
        let _ = write!(models, " ({} MB)", cfg.mem_label());
    }
    let mut t = format!(
        "node: {models}; {} invocations, {} functions\n\n\
         | placement | mean s | p99 s | std s | short mean s | GPU busy | busy time | mean / fitness | std / fitness | calls per GPU |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        trace.invocations.len(),
        trace.functions.len()
    );
    let (fm, fs) = rows
        .iter()
        .find(|r| r.0 == PlacementMode::Fitness)
        .map_or((f64::NAN, f64::NAN), |r| (r.1.mean_s, r.1.std_s));
    for (p, r, calls) in &rows {
        let _ = writeln!(
            t,
            "| {} | {} | {:.1} % | {:.2} | {:.2} | {calls} |",
            p.as_str(),
            r.latency_cells(),
            r.summary.gpu_busy_time * 100.0,
            r.mean_s / fm,
            r.std_s / fs
        );
    }
    Ok(t)
}

/// The design mix at load 0.8 with half of each kind's functions memory-bound, for `duration_s`,
/// on an A30 and an H100 (tests of placement across GPUs or nodes).
#[cfg(test)]
pub(crate) fn a30_and_h100(duration_s: f64) -> (Trace, crate::SimConfig) {
    let spec = crate::workload::MixSpec {
        gpus: 2,
        load: 0.8,
        memory_bound: 0.5,
        duration_s,
        ..crate::workload::MixSpec::default()
    };
    let cfg = crate::SimConfig {
        gpus: 2,
        gpu_models: vec!["NVIDIA A30".into(), "NVIDIA H100 80GB HBM3".into()],
        ..crate::SimConfig::default()
    };
    (crate::workload::design_mix(&spec).unwrap(), cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Function, Invocation};

    fn trace_of(bws: &[f64]) -> Trace {
        Trace {
            functions: bws
                .iter()
                .enumerate()
                .map(|(i, &bw)| Function {
                    name: format!("f{i}"),
                    mem_mb: 100.0,
                    cold_ms: Some(0.0),
                    tenant: None,
                    weight: 1.0,
                    util: 0.5,
                    bw,
                })
                .collect(),
            invocations: vec![Invocation {
                arrival_ms: 0.0,
                func: 0,
                exec_ms: 10.0,
            }],
        }
    }

    /// `functions` functions of `mem_mb` each, called in turn `calls` times, one every `gap_ms`,
    /// each run `exec_ms` long.
    fn in_turn(functions: usize, mem_mb: f64, calls: u32, gap_ms: f64, exec_ms: f64) -> Trace {
        let mut t = trace_of(&vec![0.5; functions]);
        for f in &mut t.functions {
            f.mem_mb = mem_mb;
        }
        t.invocations = (0..calls)
            .map(|i| Invocation {
                arrival_ms: f64::from(i) * gap_ms,
                func: usize::try_from(i).unwrap() % functions,
                exec_ms,
            })
            .collect();
        t
    }

    #[test]
    fn a_run_scales_with_flops_or_bandwidth_by_its_bound_share() {
        let t = trace_of(&[0.0, 1.0, 0.5]);
        let names = vec!["NVIDIA A30".to_owned(), "NVIDIA H100 80GB HBM3".to_owned()];
        let f = exec_factors(&names, 2, &t);
        assert_eq!(f[0], vec![1.0, 1.0, 1.0], "the reference runs as measured");
        assert!(
            (f[1][0] - 10.3 / 67.0).abs() < 1e-12,
            "compute-bound: FLOPS"
        );
        assert!(
            (f[1][1] - 933.0 / 3350.0).abs() < 1e-12,
            "memory-bound: bandwidth"
        );
        assert!((f[1][2] - (f[1][0] + f[1][1]) / 2.0).abs() < 1e-12);
        assert_eq!(exec_factors(&[], 2, &t), vec![vec![1.0; 3]; 2]);
    }

    #[test]
    fn placements_parse_and_a_model_list_must_match_the_gpus() {
        for p in PLACEMENTS {
            assert_eq!(p.as_str().parse::<PlacementMode>().unwrap(), p);
        }
        assert_eq!(
            "best".parse::<PlacementMode>().unwrap_err().knob,
            "placement"
        );
        let cfg = crate::SimConfig {
            gpus: 2,
            gpu_models: vec!["NVIDIA A30".into()],
            ..crate::SimConfig::default()
        };
        assert_eq!(cfg.validate().unwrap_err().knob, "gpu-models");
        for mems in [
            vec![24_576.0],
            vec![24_576.0, -1.0],
            vec![24_576.0, f64::NAN],
        ] {
            let cfg = crate::SimConfig {
                gpus: 2,
                gpu_mem_each_mb: mems.clone(),
                ..crate::SimConfig::default()
            };
            assert_eq!(cfg.validate().unwrap_err().knob, "gpu-mems-mb", "{mems:?}");
        }
    }

    /// Each GPU's own memory: a function too big for the first GPU is admitted over its budget
    /// there (unified memory oversubscription) and fits on the second.
    #[test]
    fn each_gpu_has_the_memory_it_is_given() {
        let mut t = trace_of(&[0.5]);
        t.functions[0].mem_mb = 4_000.0;
        t.invocations = (0..4)
            .map(|i| Invocation {
                arrival_ms: f64::from(i) * 100.0,
                func: 0,
                exec_ms: 10.0,
            })
            .collect();
        let over = |mems: Vec<f64>| {
            let cfg = crate::SimConfig {
                gpus: 2,
                gpu_mem_each_mb: mems,
                placement: PlacementMode::RoundRobin,
                ..crate::SimConfig::default()
            };
            let out = crate::run_policy("mqfq-sticky", &t, &cfg).unwrap();
            assert_eq!(out.audit.unfinished, 0);
            let on = |g| out.records.iter().filter(|r| r.gpu == Some(g)).count();
            assert_eq!((on(0), on(1)), (2, 2), "round-robin");
            out.audit.over_budget_admissions
        };
        assert_eq!(over(Vec::new()), 0, "24 GB each");
        assert!(over(vec![2_000.0, 24_576.0]) > 0, "2 GB on GPU 0");
        assert_eq!(over(vec![24_576.0, 8_000.0]), 0);
    }

    /// A restore moves a container's memory over its GPU's own link: an H100's PCIe 5.0 at twice
    /// the reference A30's PCIe 4.0.
    #[test]
    fn each_gpu_restores_over_its_own_models_link() {
        // Two 10 GB functions in turn on one 16 GB GPU: after their cold starts each call
        // evicts the other's memory and restores its own, 20 GB over the link.
        let t = in_turn(2, 10_000.0, 10, 5_000.0, 10.0);
        let startup_ms = |model: &str| {
            let cfg = crate::SimConfig {
                gpus: 1,
                gpu_mem_mb: 16_000.0,
                gpu_models: vec![model.into()],
                ..crate::SimConfig::default()
            };
            let out = crate::run_policy("mqfq-sticky", &t, &cfg).unwrap();
            assert_eq!(out.audit.unfinished, 0);
            let restores: Vec<f64> = out.records[2..]
                .iter()
                .map(|r| {
                    assert_eq!(r.tier, scheduler_core::tiers::Tier::Warm);
                    r.end_ms - r.start_ms
                })
                .collect();
            restores.iter().sum::<f64>() / 8.0
        };
        let (a30, h100) = (
            startup_ms("NVIDIA A30"),
            startup_ms("NVIDIA H100 80GB HBM3"),
        );
        // 20 GB at 12 GB/s on the A30 (1.67 s), at 24 GB/s on the H100.
        assert!((1_600.0..1_800.0).contains(&a30), "{a30}");
        assert!((h100 / a30 - 0.5).abs() < 0.05, "{h100} against {a30}");
    }

    /// Fitness reads where the pool holds each function's idle containers, as mqfqd does at
    /// Create: on two like GPUs each with room for two of four functions, calls go where their
    /// memory is, where least-loaded routing (and fitness without the pool) restores it.
    #[test]
    fn fitness_serves_calls_from_memory_already_on_the_gpu() {
        let t = in_turn(4, 8_000.0, 200, 2_000.0, 1_000.0);
        let not_hot = |p: PlacementMode| {
            let cfg = crate::SimConfig {
                gpus: 2,
                placement: p,
                ..crate::SimConfig::default()
            };
            let out = crate::run_policy("mqfq-sticky", &t, &cfg).unwrap();
            assert_eq!(out.audit.unfinished, 0);
            out.records
                .iter()
                .filter(|r| r.tier != scheduler_core::tiers::Tier::Hot)
                .count()
        };
        let (fit, least) = (
            not_hot(PlacementMode::Fitness),
            not_hot(PlacementMode::LeastLoaded),
        );
        assert!(fit * 4 < least, "fitness {fit}, least-loaded {least}");
    }

    #[test]
    fn on_an_a30_and_an_h100_fitness_beats_blind_placement() {
        let (t, cfg) = a30_and_h100(900.0);
        let mean = |p: PlacementMode| {
            let c = crate::SimConfig {
                placement: p,
                ..cfg.clone()
            };
            let out = crate::run_policy("mqfq-sticky", &t, &c).unwrap();
            assert_eq!(out.audit.double_completions, 0);
            spread(&t, &out).0
        };
        let fit = mean(PlacementMode::Fitness);
        for other in [PlacementMode::RoundRobin, PlacementMode::Random] {
            let m = mean(other);
            assert!(
                fit * 1.5 < m,
                "fitness {fit} s against {} {m} s",
                other.as_str()
            );
        }
    }
}
