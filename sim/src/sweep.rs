//! A seeded random workload sweep: a policy result counts only across workloads nobody tuned on.
//! Each draw is a catalogue and a node from wide ranges — 5–60 functions, footprints 0.2–20 GB,
//! solo times 10 ms–10 s (size and duration correlated or not; never past 85 % of the smallest
//! GPU), popularity skewed or not, one to
//! four tenants owning unequal shares of the functions, Poisson or bursty arrivals; one to four
//! GPUs of 16–80 GB, mixed; an offered load of 0.5–1.3 — and mqfq-sticky runs against fcfs on
//! it. Draw `i` of seed `s` is the same on every machine.

use serde::Serialize;

use crate::rng::SplitMix64;
use crate::trace::{Function, Invocation, Trace};
use crate::types::SimConfig;
use crate::{SimError, run_policy, summarize};

/// The GPU memories a node is drawn from, MB (16, 24, 40, 48 and 80 GB).
const GPU_MEMS_MB: [f64; 5] = [16_384.0, 24_576.0, 40_960.0, 49_152.0, 81_920.0];

/// What one draw was.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Draw {
    /// Its index in the sweep.
    pub index: u64,
    /// Functions in the catalogue.
    pub functions: usize,
    /// Each GPU's memory, MB.
    pub gpu_mems_mb: Vec<f64>,
    /// Offered load (GPU demand over the GPUs' capacity).
    pub load: f64,
    /// Bursty arrivals (else Poisson).
    pub bursty: bool,
    /// Footprint grows with solo time.
    pub correlated: bool,
    /// Tenants.
    pub tenants: usize,
    /// Footprints over the node's memory.
    pub memory_factor: f64,
}

/// One draw's trace and node.
///
/// # Panics
/// Never for `duration_s > 0` (the ranges are the module's own).
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "small function, GPU and window counts; windows ceils a positive, finite ratio"
)]
#[expect(
    clippy::too_many_lines,
    reason = "one seeded draw: the order of its random calls is each draw's identity"
)]
pub fn draw(seed: u64, index: u64, duration_s: f64) -> (Draw, Trace, SimConfig) {
    // Each draw's stream starts from (seed, index) hashed, so no two draws are one stream
    // shifted (SplitMix64 steps by the golden-ratio constant: seeding with `seed ^ index × it`
    // made draw i + 2 reuse draw i's numbers).
    let hash = |x: u64| SplitMix64::new(x).next_u64();
    let mut rng = SplitMix64::new(hash(seed) ^ hash(hash(index) ^ 0xA076_1D64_78BD_642F));
    let log_uniform = |rng: &mut SplitMix64, lo: f64, hi: f64| {
        (lo.ln() + rng.next_f64() * (hi.ln() - lo.ln())).exp()
    };
    let n = 5 + rng.below(56);
    let gpus = 1 + rng.below(4);
    let gpu_mems_mb: Vec<f64> = (0..gpus)
        .map(|_| GPU_MEMS_MB[rng.below(GPU_MEMS_MB.len())])
        .collect();
    // No footprint past what the smallest GPU admits (85 % of it): such a function cannot run
    // on real hardware at all.
    let largest_mb = 0.85 * gpu_mems_mb.iter().copied().fold(f64::INFINITY, f64::min);
    let load = 0.5 + 0.8 * rng.next_f64();
    let bursty = rng.next_f64() < 0.5;
    let correlated = rng.next_f64() < 0.5;
    let tenants = 1 + rng.below(4);
    let zipf = if rng.next_f64() < 0.5 {
        0.0
    } else {
        rng.next_f64() * 1.2
    };
    let mut functions = Vec::with_capacity(n);
    let mut exec = Vec::with_capacity(n);
    let mut popularity = Vec::with_capacity(n);
    for i in 0..n {
        let e = log_uniform(&mut rng, 10.0, 10_000.0);
        let mem = if correlated {
            // 10 ms ↦ 200 MB, 10 s ↦ 20 GB, within a factor of two either way.
            let base = 200.0 * (e / 10.0).powf(100f64.ln() / 1000f64.ln());
            (base * log_uniform(&mut rng, 0.5, 2.0)).clamp(200.0, 20_000.0)
        } else {
            log_uniform(&mut rng, 200.0, 20_000.0)
        };
        // Tenant skew: tenant 0 owns about half the functions, the others split the rest.
        let t = if tenants == 1 || rng.next_f64() < 0.5 {
            0
        } else {
            1 + rng.below(tenants - 1)
        };
        functions.push(Function {
            name: format!("fn-{i}"),
            mem_mb: mem.min(largest_mb).round(),
            cold_ms: None,
            tenant: (tenants > 1).then(|| format!("t{t}")),
            weight: 1.0,
            util: 0.2 + 0.8 * rng.next_f64(),
            bw: 0.0,
        });
        exec.push(e);
        popularity.push(1.0 / ((i + 1) as f64).powf(zipf));
    }
    let total_pop: f64 = popularity.iter().sum();
    // GPU-seconds per invocation, averaged by popularity.
    let demand: f64 = (0..n)
        .map(|i| popularity[i] / total_pop * exec[i] / 1e3 * functions[i].util)
        .sum();
    let rate = load * gpus as f64 / demand;
    let mut invs = Vec::new();
    let (burst, window_s) = if bursty {
        (4.0, 30.0)
    } else {
        (1.0, duration_s)
    };
    let windows = (duration_s / window_s).ceil() as usize;
    for i in 0..n {
        let r = rate * popularity[i] / total_pop * burst;
        for w in 0..windows {
            let w0 = w as f64 * window_s;
            let w1 = (w0 + window_s).min(duration_s);
            if burst > 1.0 && rng.next_f64() >= 1.0 / burst {
                continue;
            }
            let mut t = w0 + rng.exp(1.0 / r);
            while t < w1 {
                let e = exec[i] * (0.9 + 0.2 * rng.next_f64());
                invs.push(Invocation {
                    arrival_ms: (t * 1e6).round() / 1e3,
                    func: i,
                    exec_ms: (e * 1e3).round() / 1e3,
                });
                t += rng.exp(1.0 / r);
            }
        }
    }
    invs.sort_by(|a, b| {
        a.arrival_ms
            .total_cmp(&b.arrival_ms)
            .then(a.func.cmp(&b.func))
    });
    let footprints: f64 = functions.iter().map(|f| f.mem_mb).sum();
    let d = Draw {
        index,
        functions: n,
        memory_factor: footprints / gpu_mems_mb.iter().sum::<f64>(),
        gpu_mems_mb: gpu_mems_mb.clone(),
        load,
        bursty,
        correlated,
        tenants,
    };
    let cfg = SimConfig {
        gpus,
        gpu_mem_each_mb: gpu_mems_mb,
        ..SimConfig::default()
    };
    (
        d,
        Trace {
            functions,
            invocations: invs,
        },
        cfg,
    )
}

/// One draw's outcome: mqfq-sticky's figures over fcfs's (strong baselines) on it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    /// The draw.
    pub draw: Draw,
    /// Invocations in its trace.
    pub invocations: usize,
    /// Mean latency, mqfq-sticky / fcfs.
    pub mean_ratio: f64,
    /// P99 latency, mqfq-sticky / fcfs.
    pub p99_ratio: f64,
    /// PCIe bytes, mqfq-sticky / fcfs (`None`: fcfs moved none).
    pub pcie_ratio: Option<f64>,
    /// Short functions' mean latency, mqfq-sticky / fcfs (`None`: no short function).
    pub short_ratio: Option<f64>,
}

/// What a sweep changes of every draw's mqfq-sticky (`None`: the draw's own).
#[derive(Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// `short_charge_s`.
    pub short_charge_s: Option<f64>,
    /// `overtake_bound`.
    pub overtake_bound: Option<f64>,
    /// The maximum burst hold, seconds (0: none).
    pub max_burst_hold_s: Option<f64>,
}

/// Runs draw `index` of `seed` (`duration_s` of arrivals) under fcfs and mqfq-sticky, with
/// mqfq-sticky's `knobs` overridden where given.
///
/// # Errors
/// A run that fails ([`SimError`]).
pub fn run(
    seed: u64,
    index: u64,
    duration_s: f64,
    short_ms: f64,
    knobs: Knobs,
) -> Result<Outcome, SimError> {
    let (draw, trace, mut cfg) = draw(seed, index, duration_s);
    cfg.overrides.queue.short_charge_s = knobs.short_charge_s;
    cfg.overrides.queue.overtake_bound = knobs.overtake_bound;
    if let Some(hold) = knobs.max_burst_hold_s {
        cfg.max_burst_hold_s = Some(hold).filter(|&h| h > 0.0);
    }
    let fcfs = run_policy("fcfs", &trace, &cfg)?;
    let ours = run_policy("mqfq-sticky", &trace, &cfg)?;
    let (f, m) = (
        summarize(&trace, &fcfs, short_ms),
        summarize(&trace, &ours, short_ms),
    );
    Ok(Outcome {
        draw,
        invocations: trace.invocations.len(),
        mean_ratio: m.mean_ms / f.mean_ms,
        p99_ratio: m.p99_ms / f.p99_ms,
        pcie_ratio: (fcfs.pcie_mb > 0.0).then(|| ours.pcie_mb / fcfs.pcie_mb),
        short_ratio: m.short_mean_ms.zip(f.short_mean_ms).map(|(a, b)| a / b),
    })
}

/// The sweep's table: one line per draw, then the shares issue 34 asks for and the worst draws.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "draw counts")]
pub fn report(outcomes: &[Outcome]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "| draw | functions | GPUs (GB) | load | arrivals | size~time | tenants | memory / node | calls | mean / fcfs | P99 / fcfs | PCIe / fcfs | short / fcfs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ratio = |r: Option<f64>| r.map_or("—".to_owned(), |r| format!("{r:.3}"));
    for o in outcomes {
        let d = &o.draw;
        let gb: Vec<String> = d
            .gpu_mems_mb
            .iter()
            .map(|m| format!("{:.0}", m / 1024.0))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {} | {} | {} | {:.2} | {} | {:.3} | {:.3} | {} | {} |",
            d.index,
            d.functions,
            gb.join("+"),
            d.load,
            if d.bursty { "bursty" } else { "Poisson" },
            if d.correlated { "yes" } else { "no" },
            d.tenants,
            d.memory_factor,
            o.invocations,
            o.mean_ratio,
            o.p99_ratio,
            ratio(o.pcie_ratio),
            ratio(o.short_ratio),
        );
    }
    let n = outcomes.len().max(1) as f64;
    let share =
        |p: &dyn Fn(&Outcome) -> bool| 100.0 * outcomes.iter().filter(|o| p(o)).count() as f64 / n;
    let worst = outcomes
        .iter()
        .map(|o| o.mean_ratio)
        .fold(f64::NAN, f64::max);
    let _ = writeln!(
        out,
        "\n{} draws: mean ≤ 1.0× fcfs on {:.1} %, ≤ 1.5× on {:.1} % (worst {:.3}×); P99 ≤ 1.3× on {:.1} %; PCIe ≤ 1.0× on {:.1} % (of the draws where fcfs moved any)",
        outcomes.len(),
        share(&|o| o.mean_ratio <= 1.0),
        share(&|o| o.mean_ratio <= 1.5),
        worst,
        share(&|o| o.p99_ratio <= 1.3),
        100.0
            * outcomes
                .iter()
                .filter(|o| o.pcie_ratio.is_some_and(|r| r <= 1.0))
                .count() as f64
            / outcomes
                .iter()
                .filter(|o| o.pcie_ratio.is_some())
                .count()
                .max(1) as f64,
    );
    let mut by_mean: Vec<&Outcome> = outcomes.iter().collect();
    by_mean.sort_by(|a, b| b.mean_ratio.total_cmp(&a.mean_ratio));
    let worst: Vec<String> = by_mean
        .iter()
        .take(5)
        .map(|o| format!("{} ({:.3}×)", o.draw.index, o.mean_ratio))
        .collect();
    let _ = writeln!(out, "worst draws by mean: {}", worst.join(", "));
    out
}
