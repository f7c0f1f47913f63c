//! The simulator's public knobs, results and errors (the placement and cluster modes among
//! them, which `hetero` and `cluster` implement).

use serde::Serialize;

use scheduler_core::config::{ConfigError, GpuMode, Overrides, Profile, TierConfig};
use scheduler_core::tiers::Tier;
use scheduler_core::warm::Warm;

/// How the baseline policies (fcfs, batch, sjf, paella) run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Baselines {
    /// As strong as we can make them: the same dynamic D as ours, memory evicted only under
    /// pressure.
    #[default]
    Strong,
    /// As the seed's comparison ran them (the reference implementation's serial queues with
    /// hints on): the published gate (fixed D = 2, utilization estimate ≤ 0.95) and each
    /// container's memory pushed to the host after every use, so the next call restores it.
    Paper,
    /// What a node without a warm pool runs: a fixed D of 2, no utilization gate, and no
    /// container kept after its call — every call starts cold.
    Naive,
}

impl std::str::FromStr for Baselines {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "strong" => Ok(Baselines::Strong),
            "paper" => Ok(Baselines::Paper),
            "naive" => Ok(Baselines::Naive),
            _ => Err(ConfigError::new(
                "baselines",
                s,
                "must be strong, paper or naive",
            )),
        }
    }
}

/// How invocations that run at once on one GPU share it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Corun {
    /// Their kernels overlap (MPS; or streams of one context): k co-runners together get
    /// `1 + corun_gain·(k−1)` (at most `1 + corun_gain_max`) of one GPU's throughput.
    #[default]
    Overlap,
    /// Time slicing (a plain GPU's contexts of different processes, what plain runc gives):
    /// no overlap, and with two or more contexts a `cost` share of the GPU's time is lost to
    /// switching between them.
    TimeSlice {
        /// Share of the GPU's time lost to context switches with ≥ 2 contexts, in [0, 1).
        cost: f64,
    },
}

impl Corun {
    /// The share of one GPU's throughput `k` co-runners get together, before their demand.
    #[must_use]
    pub fn capacity(self, k: u32, gain: f64, gain_max: f64) -> f64 {
        match self {
            Corun::Overlap => 1.0 + (gain * f64::from(k.saturating_sub(1))).min(gain_max),
            Corun::TimeSlice { cost } if k > 1 => 1.0 - cost,
            Corun::TimeSlice { .. } => 1.0,
        }
    }

    /// Each co-runner's speed (1: as fast as alone) when their solo demands add up to
    /// `demand`: all at full speed while the GPU holds them, else its capacity shared out.
    #[must_use]
    pub fn speed(self, k: u32, demand: f64, gain: f64, gain_max: f64) -> f64 {
        let cap = self.capacity(k, gain, gain_max);
        if demand <= cap.min(1.0) {
            1.0
        } else {
            (cap / demand).min(1.0)
        }
    }
}

/// What a start past the GPU's memory does under `none` (no admission, no pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoneMemory {
    /// The container's allocations fail: the call fails to start (counted, never retried).
    #[default]
    Fail,
    /// Its memory is managed (UVM): the start goes on past physical memory, and each run on an
    /// oversubscribed GPU first pages its share of the excess in over the PCIe link.
    Uvm,
    /// As `Uvm`, and a call that starts while the calls running on its GPU (itself included) need
    /// more than it holds pages its whole footprint in — their faults evict each other's pages —
    /// on demand at a quarter of the link's rate (fault-driven migration, not a bulk prefetch).
    /// The co-runners already running are not charged again.
    UvmThrash,
}

/// Under [`NoneMemory::UvmThrash`], the share of the link's rate that fault-driven paging gets
/// (an assumption until the GPU check measures it).
pub const UVM_FAULT_SHARE: f64 = 0.25;

impl std::str::FromStr for NoneMemory {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "fail" => Ok(NoneMemory::Fail),
            "uvm" => Ok(NoneMemory::Uvm),
            "uvm-thrash" => Ok(NoneMemory::UvmThrash),
            _ => Err(ConfigError::new(
                "none-memory",
                s,
                "must be fail, uvm or uvm-thrash",
            )),
        }
    }
}

/// Simulator knobs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimConfig {
    /// GPUs (or MIG instances in `mig` mode).
    pub gpus: usize,
    /// Memory per GPU, MB.
    pub gpu_mem_mb: f64,
    /// Sharing mode (sets D_max).
    pub mode: GpuMode,
    /// Host↔GPU bandwidth, GB/s.
    pub pcie_gbps: f64,
    /// Cold start of functions whose trace rows give none, ms.
    pub cold_ms: f64,
    /// Capacity gain per extra co-runner.
    pub corun_gain: f64,
    /// Ceiling of the co-run gain.
    pub corun_gain_max: f64,
    /// How co-runners share a GPU (the gain above is the overlap's).
    pub corun: Corun,
    /// Utilization sample period, ms.
    pub sample_ms: f64,
    /// Whether the GPUs report SM activity (GPM, Hopper and later) besides busy-time; off for
    /// the default A30-class GPU.
    pub gpm: bool,
    /// Profile of `mqfq-sticky` (T, TTL, α).
    pub profile: Profile,
    /// Overrides on the profile.
    #[serde(skip)]
    pub overrides: Overrides,
    /// Tier knobs.
    pub tiers: TierConfig,
    /// How the baselines run.
    pub baselines: Baselines,
    /// Each GPU's model, NVML-style (`NVIDIA H100`); empty: every GPU the reference A30.
    pub gpu_models: Vec<String>,
    /// Each GPU's memory, MB (a node of different GPUs); empty: every GPU `gpu_mem_mb`.
    pub gpu_mem_each_mb: Vec<f64>,
    /// Where `mqfq-sticky` places each invocation.
    pub placement: PlacementMode,
    /// The fitness placement's weights at every hour (`None`: mqfqd's peak defaults).
    pub placement_weights: Option<scheduler_core::placement::Weights>,
    /// Nodes the GPUs are split into (1: one node).
    pub nodes: usize,
    /// How the cluster picks a node when there are several.
    pub cluster: ClusterMode,
    /// What `none` does past the GPU's memory.
    pub none_memory: NoneMemory,
    /// `mqfq-sticky`'s maximum burst hold, seconds (mqfqd's `[limits] max_burst_hold_s`; an
    /// invocation is a burst lease); `None`: none.
    pub max_burst_hold_s: Option<f64>,
    /// How idle containers' memory goes Warm (issue 36): the interposer's managed memory (`uvm`:
    /// the function's allocations move, its CUDA context stays on the GPU) or the driver's
    /// checkpoint API (`checkpoint`: the whole process moves, context included, at the
    /// checkpoint rate). Applies to every policy's warm pool; `off` is not modelled.
    pub warm: Warm,
    /// Each container's CUDA context on its GPU, MB (0: not modelled, as before issue 36).
    pub context_mb: f64,
    /// The driver's checkpoint / restore rate, GB/s (the link's rate bounds it).
    pub checkpoint_gbps: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            gpus: 1,
            gpu_mem_mb: 24_576.0,
            mode: GpuMode::Plain,
            pcie_gbps: 12.0,
            cold_ms: 3_000.0,
            corun_gain: 0.05,
            corun_gain_max: 0.15,
            corun: Corun::Overlap,
            sample_ms: 100.0,
            gpm: false,
            profile: Profile::Balanced,
            overrides: Overrides::default(),
            tiers: TierConfig::default(),
            baselines: Baselines::Strong,
            gpu_models: Vec::new(),
            gpu_mem_each_mb: Vec::new(),
            placement: PlacementMode::LeastLoaded,
            placement_weights: None,
            nodes: 1,
            cluster: ClusterMode::RoundRobin,
            none_memory: NoneMemory::Fail,
            max_burst_hold_s: Some(scheduler_core::node::admission::DEFAULT_MAX_BURST_HOLD_S),
            warm: Warm::Uvm,
            context_mb: 0.0,
            checkpoint_gbps: 8.0,
        }
    }
}

impl SimConfig {
    /// Checks every knob.
    ///
    /// # Errors
    /// [`ConfigError`] naming the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gpus == 0 || self.gpus > 4096 {
            return Err(ConfigError::new("gpus", self.gpus, "must be in 1..=4096"));
        }
        if self.nodes == 0 || !self.gpus.is_multiple_of(self.nodes) {
            return Err(ConfigError::new(
                "nodes",
                self.nodes,
                "must divide the number of GPUs",
            ));
        }
        let pos = |k, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError::new(k, v, "must be a finite number > 0"))
            }
        };
        let nonneg = |k, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(ConfigError::new(k, v, "must be a finite number >= 0"))
            }
        };
        pos("gpu-mem-mb", self.gpu_mem_mb)?;
        pos("pcie-gbps", self.pcie_gbps)?;
        nonneg("context-mb", self.context_mb)?;
        if self.warm == Warm::Off {
            return Err(ConfigError::new(
                "warm",
                "off",
                "the simulator models uvm and checkpoint",
            ));
        }
        pos("checkpoint-gbps", self.checkpoint_gbps)?;
        nonneg("cold-ms", self.cold_ms)?;
        nonneg("corun-gain", self.corun_gain)?;
        nonneg("corun-gain-max", self.corun_gain_max)?;
        if let Corun::TimeSlice { cost } = self.corun
            && !(cost.is_finite() && (0.0..1.0).contains(&cost))
        {
            return Err(ConfigError::new(
                "timeslice-cost",
                cost,
                "must be a number in [0, 1)",
            ));
        }
        pos("sample-ms", self.sample_ms)?;
        if !self.gpu_models.is_empty() && self.gpu_models.len() != self.gpus {
            return Err(ConfigError::new(
                "gpu-models",
                self.gpu_models.join(","),
                "must name one model per GPU (--gpus)",
            ));
        }
        if !self.gpu_mem_each_mb.is_empty() && self.gpu_mem_each_mb.len() != self.gpus {
            return Err(ConfigError::new(
                "gpu-mems-mb",
                self.gpu_mem_each_mb.len(),
                "must give one size per GPU (--gpus)",
            ));
        }
        for &m in &self.gpu_mem_each_mb {
            pos("gpu-mems-mb", m)?;
        }
        self.tiers.validate()
    }

    /// GPU `g`'s memory, MB.
    #[must_use]
    pub fn mem_mb(&self, g: usize) -> f64 {
        self.gpu_mem_each_mb
            .get(g)
            .copied()
            .unwrap_or(self.gpu_mem_mb)
    }

    /// The GPUs' memory, MB, as reports print it: one size, or each GPU's (`24576 / 81920`).
    #[must_use]
    pub fn mem_label(&self) -> String {
        if self.gpu_mem_each_mb.is_empty() {
            self.gpu_mem_mb.to_string()
        } else {
            let each: Vec<String> = self.gpu_mem_each_mb.iter().map(f64::to_string).collect();
            each.join(" / ")
        }
    }
}

/// What happened to one invocation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Record {
    /// When it got its slot (or, in a batch, when its turn came), ms.
    pub start_ms: f64,
    /// When it finished, ms.
    pub end_ms: f64,
    /// Tier of its container at dispatch.
    pub tier: Tier,
    /// The GPU it ran on (`None`: it never ran).
    pub gpu: Option<usize>,
}

/// Checks the simulator keeps on itself; the property tests assert on them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Audit {
    /// Dispatches that found more slots held than D allowed (must be 0).
    pub over_limit_dispatches: u64,
    /// Invocations completed more than once (must be 0).
    pub double_completions: u64,
    /// Invocations never completed (must be 0).
    pub unfinished: u64,
    /// Highest number of slots held on one GPU.
    pub max_slots_held: u32,
    /// Batches admitted over the memory budget because nothing else could free memory.
    pub over_budget_admissions: u64,
    /// Steps that ended with a GPU holding a slot free under the limit any work may take while
    /// work waited for it (0 for a work-conserving policy; the published utilization gate of
    /// `mqfq-paper` is not checked).
    pub idle_with_backlog: u64,
    /// Invocations that failed to start: under `none` with `--none-memory fail`, a start past
    /// the GPU's memory (0 for every admitting policy).
    pub failed_starts: u64,
}

/// What the Warm tier cost and held (the two backends' comparison, issue 36).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WarmStats {
    /// Warm containers brought back to their GPU (for a call, or prefetched ahead of one).
    pub restores: u64,
    /// Their restore time, summed, ms (from the order to the memory back: the link's queue and
    /// the move).
    pub restore_ms: f64,
    /// The most GPU memory Warm containers held at once, MB (their contexts under `uvm`).
    pub peak_warm_gpu_mb: f64,
    /// Of the restores for a call, those onto another GPU of the same model than the one the
    /// container was checkpointed on (`mqfqd`'s `restore_onto`: the node under `checkpoint` only).
    pub moved: u64,
}

/// Result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct SimOutput {
    /// Policy name.
    pub policy: String,
    /// One record per trace invocation, same order.
    pub records: Vec<Record>,
    /// ∫ utilization dt over all GPUs, ms.
    pub busy_ms: f64,
    /// Time in which anything executed, summed over GPUs (NVML's busy-time), ms.
    pub busy_time_ms: f64,
    /// First arrival to last completion, ms.
    pub makespan_ms: f64,
    /// GPUs simulated.
    pub gpus: usize,
    /// Self-checks.
    pub audit: Audit,
    /// Bytes moved over PCIe (evictions + restores), MB.
    pub pcie_mb: f64,
    /// The Warm tier's restores and what it held.
    pub warm: WarmStats,
    /// Time-averaged concurrency limit D per GPU.
    pub mean_d: f64,
    /// Time-averaged slots held per GPU.
    pub mean_slots: f64,
    /// GPU 0's limit in force over time: `(seconds since the first arrival, limit)` at each
    /// change.
    pub limits: Vec<(f64, u32)>,
    /// Writes of each node's published state (multi-node runs of `mqfq-sticky`).
    pub api_writes: Vec<u64>,
}

/// Errors of a simulation run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A bad knob.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The event loop stopped making progress (a bug; reported rather than looping forever).
    #[error("simulation made no progress at t = {0} ms")]
    Stuck(f64),
}

/// Where `mqfq-sticky` places each invocation on a node of several GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementMode {
    /// The node core's routing: the GPU with the least work over its limit.
    #[default]
    LeastLoaded,
    /// Fitness for the function's measured class (`scheduler_core::placement`).
    Fitness,
    /// GPUs in turn.
    RoundRobin,
    /// Uniformly at random (seeded).
    Random,
}

/// Every placement, in report order.
pub const PLACEMENTS: [PlacementMode; 4] = [
    PlacementMode::Fitness,
    PlacementMode::LeastLoaded,
    PlacementMode::RoundRobin,
    PlacementMode::Random,
];

impl PlacementMode {
    /// Its name on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementMode::LeastLoaded => "least-loaded",
            PlacementMode::Fitness => "fitness",
            PlacementMode::RoundRobin => "round-robin",
            PlacementMode::Random => "random",
        }
    }
}

impl std::str::FromStr for PlacementMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        PLACEMENTS
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                ConfigError::new(
                    "placement",
                    s,
                    "must be fitness, least-loaded, round-robin or random",
                )
            })
    }
}

/// How the cluster picks a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// The highest score of mqfq's extender.
    Extender,
    /// Nodes in turn.
    #[default]
    RoundRobin,
    /// Uniformly at random (seeded).
    Random,
}

/// Every mode, in report order.
pub const CLUSTER_MODES: [ClusterMode; 3] = [
    ClusterMode::Extender,
    ClusterMode::RoundRobin,
    ClusterMode::Random,
];

impl ClusterMode {
    /// Its name on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterMode::Extender => "extender",
            ClusterMode::RoundRobin => "round-robin",
            ClusterMode::Random => "random",
        }
    }
}

impl std::str::FromStr for ClusterMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        CLUSTER_MODES
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                ConfigError::new("cluster", s, "must be extender, round-robin or random")
            })
    }
}
