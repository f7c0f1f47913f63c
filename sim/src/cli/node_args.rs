//! The node's flags, shared by `run`, `compare`, `placements` and `cluster`, and the
//! [`SimConfig`] they make.

use anyhow::{Context, Result, bail};
use clap::Args;
use scheduler_core::config::{ConcurrencyKnobs, Overrides, QueueKnobs, TierConfig};
use scheduler_core::{GpuMode, Profile};

use crate::SimConfig;
use crate::types::Corun;

#[derive(Debug, Args)]
pub(super) struct NodeArgs {
    /// GPUs (MIG instances in mig mode).
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Memory per GPU, MB.
    #[arg(long, default_value_t = 24_576.0)]
    gpu_mem_mb: f64,
    /// plain, mps or mig.
    #[arg(long, default_value = "plain")]
    mode: String,
    /// light, balanced or throughput (mqfq-sticky's T, TTL and α).
    #[arg(long, default_value = "balanced")]
    profile: String,
    /// Host↔GPU bandwidth, GB/s.
    #[arg(long, default_value_t = 12.0)]
    pcie_gbps: f64,
    /// How idle containers' memory goes Warm: `uvm` (the interposer's managed memory; the CUDA
    /// context stays on the GPU) or `checkpoint` (the driver's checkpoint API: all of it moves).
    #[arg(long, default_value = "uvm")]
    warm: String,
    /// Each container's CUDA context on its GPU, MB (0: not modelled).
    #[arg(long, default_value_t = 0.0)]
    context_mb: f64,
    /// Under `--warm checkpoint`: the driver's checkpoint / restore rate, GB/s (an assumption
    /// from users' reports until the GPU check measures it; the link's rate bounds it).
    #[arg(long, default_value_t = 8.0)]
    checkpoint_gbps: f64,
    /// Cold start for functions without `cold_ms`, ms.
    #[arg(long, default_value_t = 3000.0)]
    cold_ms: f64,
    /// Override T, virtual seconds.
    #[arg(long)]
    overrun_s: Option<f64>,
    /// Override the sticky TTL, seconds.
    #[arg(long)]
    ttl_s: Option<f64>,
    /// Override T as a multiple of τ_avg.
    #[arg(long)]
    overrun_tau: Option<f64>,
    /// Override the sticky TTL as a multiple of the flow's inter-arrival time.
    #[arg(long)]
    ttl_iat: Option<f64>,
    /// Charge of a function whose service time is still unknown, s.
    #[arg(long)]
    fallback_charge_s: Option<f64>,
    /// Flows charged at most this are short for the slot reserve, s (0 = reserve off).
    #[arg(long)]
    short_charge_s: Option<f64>,
    /// How far the fair order may overtake a queued call, × the work queued ahead of it at
    /// arrival (0 = off).
    #[arg(long)]
    overtake_bound: Option<f64>,
    /// Gain α of the concurrency controller.
    #[arg(long)]
    alpha: Option<f64>,
    /// Target utilization of the concurrency controller.
    #[arg(long)]
    u_target: Option<f64>,
    /// Override D_max.
    #[arg(long)]
    d_max: Option<u32>,
    /// What moves D: `interference` (mqfqd's controller, the default) or `busy-time` (the
    /// published law on NVML busy-time alone, for comparison).
    #[arg(long)]
    d_law: Option<String>,
    /// Hold D at this many slots on every GPU, for every policy with a dynamic D (not with
    /// --d-max or --d-law): what is left of a gap is the order's and the memory's.
    #[arg(long)]
    fixed_d: Option<u32>,
    /// The order mqfq-sticky's core grants in: `mqfq-sticky` (the default) or `fifo` (also
    /// `fcfs`: arrival order, no short-slot reserve — mqfqd's `policy = "fcfs"`), same gate, D
    /// and pool.
    #[arg(long)]
    order: Option<String>,
    /// Most slowdown a run should suffer from its co-runners.
    #[arg(long)]
    slowdown_target: Option<f64>,
    /// What mqfq-sticky charges a function's memory before the pool has measured it, MiB
    /// (mqfqd's `[queue] default_footprint_mb`).
    #[arg(long, default_value_t = scheduler_core::node::admission::DEFAULT_FOOTPRINT_MB)]
    default_footprint_mb: u64,
    /// mqfq-sticky's maximum burst hold, seconds (mqfqd's `[limits] max_burst_hold_s`; 0: none):
    /// an invocation held longer no longer keeps the next one out.
    #[arg(long, default_value_t = scheduler_core::node::admission::DEFAULT_MAX_BURST_HOLD_S)]
    max_burst_hold_s: f64,
    /// mqfq-sticky grants on slots alone, not on GPU memory (mqfqd's `memory_admission =
    /// false`): what admitting memory is worth.
    #[arg(long)]
    no_memory_admission: bool,
    /// mqfq-sticky's waiting work stays on the GPU it was routed to (mqfqd's default,
    /// `[queue] late_binding = false`): what moving it is worth.
    #[arg(long)]
    no_late_binding: bool,
    /// Under `none`, a start past the GPU's memory: `fail` (its allocations fail; counted) or
    /// `uvm` (managed memory: it goes on, and runs page the excess in over PCIe).
    #[arg(long, default_value = "fail")]
    none_memory: String,
    /// The GPUs report SM activity (GPM: Hopper and later); without it, only busy-time and the
    /// measured slowdown (the default A30-class GPU has no GPM).
    #[arg(long)]
    gpm: bool,
    /// How invocations running at once share a GPU: `overlap` (kernels overlap, a small
    /// throughput gain: MPS, or streams of one context) or `time-slice` (a plain GPU's
    /// processes: no overlap, `--timeslice-cost` lost to switching).
    #[arg(long, default_value = "overlap")]
    corun: String,
    /// Under `--corun time-slice`: the share of GPU time lost to context switches with two or
    /// more contexts (default 0.05: an assumption until the GPU check's concbench measures it).
    #[arg(long)]
    timeslice_cost: Option<f64>,
    /// Fraction of GPU memory kept free.
    #[arg(long, default_value_t = 0.15)]
    headroom: f64,
    /// Idle Hot containers are evicted after this long, s.
    #[arg(long, default_value_t = 1800.0)]
    hot_ttl_s: f64,
    /// Warm containers are dropped after this long, s.
    #[arg(long, default_value_t = 7200.0)]
    warm_ttl_s: f64,
    /// Each GPU's model, NVML-style names separated by commas (`NVIDIA A30,NVIDIA H100`), one
    /// per GPU; default: every GPU the reference A30.
    #[arg(long, value_delimiter = ',')]
    gpu_models: Vec<String>,
    /// Each GPU's memory, MB, separated by commas, one per GPU (`24576,81920`); default: every
    /// GPU `--gpu-mem-mb`.
    #[arg(long, value_delimiter = ',')]
    gpu_mems_mb: Vec<f64>,
    /// Where mqfq-sticky places each invocation: least-loaded (the default), fitness,
    /// round-robin or random. Not for `placements`, which runs each.
    #[arg(long)]
    pub(super) placement: Option<String>,
    /// The fitness placement's weights, `name=value` pairs separated by commas (fitness,
    /// locality, queue, balance, energy, affinity; the others keep mqfqd's peak defaults), to
    /// try weights offline before putting them in `[placement.peak]`.
    #[arg(long)]
    placement_weights: Option<String>,
    /// Functions with mean exec below this are "short" in reports, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub(super) short_ms: f64,
    /// How fcfs, batch, sjf and paella run: `strong` (our dynamic D, evict under pressure),
    /// `paper` (as the seed compared against: D = 2 behind the published utilization gate,
    /// memory pushed to the host after every use) or `naive` (D = 2, no warm pool: every call
    /// starts cold).
    #[arg(long, default_value = "strong")]
    baselines: String,
}

/// `--order`: `mqfq-sticky`, or `fifo` / `fcfs` (mqfqd's `policy = "fcfs"`).
fn parse_order(text: &str) -> Result<scheduler_core::config::GrantOrder> {
    use scheduler_core::config::GrantOrder;
    match text {
        "mqfq-sticky" => Ok(GrantOrder::MqfqSticky),
        "fifo" | "fcfs" => Ok(GrantOrder::Fcfs),
        other => bail!("--order: {other:?} is not an order (mqfq-sticky or fifo)"),
    }
}

/// `fitness=1,queue=2`: the named weights over mqfqd's peak defaults.
pub(super) fn parse_weights(text: &str) -> Result<scheduler_core::placement::Weights> {
    let mut w = scheduler_core::placement::Weights::default();
    for pair in text.split(',') {
        let (name, value) = pair
            .split_once('=')
            .with_context(|| format!("--placement-weights: {pair:?} is not name=value"))?;
        let v: f64 = value
            .trim()
            .parse()
            .with_context(|| format!("--placement-weights: {name} = {value:?} is not a number"))?;
        let slot = match name.trim() {
            "fitness" => &mut w.fitness,
            "locality" => &mut w.locality,
            "queue" => &mut w.queue,
            "balance" => &mut w.balance,
            "energy" => &mut w.energy,
            "affinity" => &mut w.affinity,
            other => bail!(
                "--placement-weights: unknown weight {other:?} (fitness, locality, queue, balance, energy, affinity)"
            ),
        };
        if !(v.is_finite() && v >= 0.0) {
            bail!("--placement-weights: {name} = {v} must be a finite number >= 0");
        }
        *slot = v;
    }
    w.validate("--placement-weights")?;
    Ok(w)
}

impl NodeArgs {
    pub(super) fn config(&self) -> Result<SimConfig> {
        let cfg = SimConfig {
            gpus: self.gpus,
            gpu_mem_mb: self.gpu_mem_mb,
            mode: self.mode.parse::<GpuMode>()?,
            pcie_gbps: self.pcie_gbps,
            warm: self.warm.parse()?,
            context_mb: self.context_mb,
            checkpoint_gbps: self.checkpoint_gbps,
            cold_ms: self.cold_ms,
            profile: self.profile.parse::<Profile>()?,
            overrides: Overrides {
                queue: QueueKnobs {
                    overrun_s: self.overrun_s,
                    overrun_tau: self.overrun_tau,
                    ttl_s: self.ttl_s,
                    ttl_iat: self.ttl_iat,
                    fallback_charge_s: self.fallback_charge_s,
                    short_charge_s: self.short_charge_s,
                    overtake_bound: self.overtake_bound,
                    memory_admission: self.no_memory_admission.then_some(false),
                    default_footprint_mb: Some(self.default_footprint_mb),
                    late_binding: self.no_late_binding.then_some(false),
                },
                concurrency: ConcurrencyKnobs {
                    alpha: self.alpha,
                    u_target: self.u_target,
                    d_max: self.d_max,
                    slowdown_target: self.slowdown_target,
                    d_initial: None,
                },
                law: self.d_law.as_deref().map(str::parse).transpose()?,
                order: self.order.as_deref().map(parse_order).transpose()?,
                fixed_d: self.fixed_d,
            },
            gpm: self.gpm,
            tiers: TierConfig {
                headroom: self.headroom,
                hot_ttl_s: self.hot_ttl_s,
                warm_ttl_s: self.warm_ttl_s,
                ..TierConfig::default()
            },
            baselines: self.baselines.parse()?,
            gpu_models: self.gpu_models.clone(),
            gpu_mem_each_mb: self.gpu_mems_mb.clone(),
            placement: self
                .placement
                .as_deref()
                .unwrap_or("least-loaded")
                .parse()?,
            placement_weights: self
                .placement_weights
                .as_deref()
                .map(parse_weights)
                .transpose()?,
            none_memory: self.none_memory.parse()?,
            corun: match (self.corun.as_str(), self.timeslice_cost) {
                ("overlap", None) => Corun::Overlap,
                ("overlap", Some(_)) => {
                    bail!("timeslice-cost: only with --corun time-slice")
                }
                ("time-slice", cost) => Corun::TimeSlice {
                    cost: cost.unwrap_or(0.05),
                },
                (other, _) => bail!("corun: {other:?} must be overlap or time-slice"),
            },
            max_burst_hold_s: Some(self.max_burst_hold_s).filter(|&s| s != 0.0),
            ..SimConfig::default()
        };
        cfg.validate()?;
        let (mut q, mut c) = (cfg.profile.queue(), cfg.profile.concurrency(cfg.mode));
        cfg.overrides.apply(&mut q, &mut c, cfg.mode)?;
        Ok(cfg)
    }
}
