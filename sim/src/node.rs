//! `mqfq-sticky` in the simulator: the node's own admission core
//! ([`scheduler_core::node::admission::Core`], what `mqfqd` runs) driven by the simulated node.
//! Each invocation is one burst of a container `sim/i<n>`: admitted at arrival, released at its
//! end with the service it received; the executor's utilization samples go through
//! [`Core::sample`] as `mqfqd`'s sampling loop sends them, and what the executor knows of a
//! function's memory goes to [`Core::set_residency`] as `mqfqd`'s pool tells it. The core picks
//! the GPU (at arrival, the least loaded), the limit in force and the order; the executor runs
//! what it grants.
//!
//! Every call into the core can be kept ([`NodeMqfq::inputs`]), so a test can feed the same
//! calls to a core built the way `mqfqd` builds it and compare the dispatch records.

use std::collections::{HashMap, VecDeque};

use scheduler_core::config::{ConcurrencyConfig, ConfigError, GpuMode, QueueConfig};
use scheduler_core::node::admission::{
    AdmitInfo, Core, CoreError, GpuInfo, GpuReading, Grant, Kind, Limits, Record,
};
use scheduler_core::{FlowState, Time};

use crate::hetero::PlacementMode;
use crate::policy::{Admission, MemoryStyle, Policy, PoolView, Signal};
use crate::rng::SplitMix64;
use crate::trace::Trace;

/// The containerd namespace the simulator's containers are named in.
pub const NAMESPACE: &str = "sim";

/// One call the simulator made into the core, with its time.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// An invocation arrived.
    Admit(AdmitInfo, Time),
    /// A burst ended after `measured_s` of service.
    Release {
        /// Its lease.
        lease: u64,
        /// Service received, seconds.
        measured_s: f64,
        /// When.
        now: Time,
    },
    /// A sampling step: each GPU's reading.
    Sample(Vec<GpuReading>, Time),
    /// What a function's containers hold, as the pool measured it.
    Footprint {
        /// The function's flow.
        function: String,
        /// Bytes.
        bytes: u64,
        /// When.
        now: Time,
    },
    /// A function's memory became resident or not.
    Residency {
        /// The function's flow.
        function: String,
        /// Resident.
        resident: bool,
        /// What serving it costs when not, seconds.
        cost_s: f64,
    },
}

/// The simulated GPUs as the daemon's monitor would describe them.
#[must_use]
pub fn gpu_infos(gpus: usize, memory_mb: impl Fn(usize) -> f64, mode: GpuMode) -> Vec<GpuInfo> {
    (0..gpus)
        .map(|g| GpuInfo {
            index: u32::try_from(g).unwrap_or(u32::MAX),
            uuid: format!("GPU-sim-{g}"),
            name: "simulated".into(),
            mode,
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            memory_total: (memory_mb(g).max(0.0) * 1024.0 * 1024.0) as u64,
            mig: Vec::new(),
        })
        .collect()
}

/// A function's name as a container asks with it: its trace name when the node would accept
/// it, else `f<index>`.
fn function_name(trace: &Trace, func: usize) -> String {
    let name = &trace.functions[func].name;
    if scheduler_core::node::is_key(name) {
        name.clone()
    } else {
        format!("f{func}")
    }
}

/// A function's tenant, when the trace gives one the node would accept.
fn tenant(trace: &Trace, func: usize) -> Option<String> {
    trace.functions[func]
        .tenant
        .clone()
        .filter(|t| scheduler_core::node::is_key(t))
}

/// A function's flow name: its name, scoped by its tenant (`tenant/function`) as the node's
/// core scopes it.
#[must_use]
pub fn flow_name(trace: &Trace, func: usize) -> String {
    let name = function_name(trace, func);
    match tenant(trace, func) {
        Some(t) => format!("{t}/{name}"),
        None => name,
    }
}

/// Every function's flow name, and the way back from a name to the function.
#[must_use]
pub fn flow_names(trace: &Trace) -> (Vec<String>, HashMap<String, usize>) {
    let names: Vec<String> = (0..trace.functions.len())
        .map(|f| flow_name(trace, f))
        .collect();
    let by_name = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    (names, by_name)
}

/// What an arrival asks of the core.
#[must_use]
pub fn admit_info(trace: &Trace, inv: usize) -> AdmitInfo {
    let f = trace.invocations[inv].func;
    AdmitInfo {
        namespace: NAMESPACE.into(),
        container_id: format!("i{inv}"),
        function: function_name(trace, f),
        tenant: tenant(trace, f),
        tenant_weight: 0.0,
        weight: trace.functions[f].weight,
        gpus: Vec::new(),
        kind: Kind::Burst,
        shim_pid: 0,
    }
}

/// MQFQ-Sticky as the node runs it.
#[derive(Debug)]
pub struct NodeMqfq {
    core: Core,
    names: Vec<String>,
    by_name: HashMap<String, usize>,
    leases: HashMap<usize, u64>,
    granted: VecDeque<(usize, usize)>,
    inputs: Option<Vec<Input>>,
    records: Vec<Record>,
    placement: PlacementMode,
    placer: Option<scheduler_core::placement::Placement>,
    turn: usize,
    rng: SplitMix64,
    cluster: Option<crate::cluster::Cluster>,
}

fn config_error(e: CoreError) -> ConfigError {
    match e {
        CoreError::Config(c) => c,
        CoreError::Invalid { field, reason } => ConfigError {
            knob: field,
            value: reason,
            reason: "the node's core refused it",
        },
        other => ConfigError {
            knob: "gpus",
            value: other.to_string(),
            reason: "the node's core refused them",
        },
    }
}

impl NodeMqfq {
    /// The node's core over `gpus` with these knobs; with `keep_inputs`, every call is kept.
    ///
    /// # Errors
    /// A bad knob.
    pub fn new(
        trace: &Trace,
        gpus: Vec<GpuInfo>,
        queue: &QueueConfig,
        conc: &ConcurrencyConfig,
        keep_inputs: bool,
    ) -> Result<Self, ConfigError> {
        let core = Core::new(gpus, queue, |_| conc.clone()).map_err(config_error)?;
        let (names, by_name) = flow_names(trace);
        Ok(NodeMqfq {
            core,
            names,
            by_name,
            leases: HashMap::new(),
            granted: VecDeque::new(),
            inputs: keep_inputs.then(Vec::new),
            records: Vec::new(),
            placement: PlacementMode::LeastLoaded,
            placer: None,
            turn: 0,
            rng: SplitMix64::new(0x9e37_79b9),
            cluster: None,
        })
    }

    /// Memory admission as `cfg` asks (mqfqd's default: on, with the pool's headroom), and the
    /// maximum burst hold (`[limits]`, which mqfqd applies with it).
    ///
    /// # Errors
    /// A bad default footprint or hold.
    pub fn set_memory(&mut self, cfg: &crate::types::SimConfig) -> Result<(), ConfigError> {
        let Some(mb) = cfg.memory_admission else {
            return Ok(());
        };
        let m = scheduler_core::node::admission::MemoryAdmission::new(cfg.tiers.headroom, mb)
            .map_err(config_error)?;
        self.core.set_memory(m).map_err(config_error)?;
        self.core
            .set_max_burst_hold(cfg.max_burst_hold_s)
            .map_err(config_error)
    }

    /// Places each invocation by `mode` (default: the core's least-loaded routing);
    /// `weights` replace the default weights at every hour (the simulator has no time of day);
    /// `cold_start_s` is the node's cold start, as its operator would set it.
    ///
    /// # Errors
    /// Bad weights or cold start.
    pub fn set_placement(
        &mut self,
        mode: PlacementMode,
        weights: Option<scheduler_core::placement::Weights>,
        cold_start_s: f64,
    ) -> Result<(), ConfigError> {
        self.placement = mode;
        let mut cfg = scheduler_core::placement::PlacementConfig {
            cold_start_s,
            ..Default::default()
        };
        if let Some(w) = weights {
            cfg.schedule.peak = w;
            cfg.schedule.off_peak = w;
        }
        self.placer = match mode {
            PlacementMode::Fitness => Some(scheduler_core::placement::Placement::new(cfg)?),
            _ => None,
        };
        Ok(())
    }

    /// Splits the GPUs into `nodes` nodes, each invocation going to the node `mode` picks
    /// (the node's core then routes it among that node's GPUs).
    ///
    /// # Errors
    /// The GPUs do not split evenly.
    pub fn set_cluster(
        &mut self,
        mode: crate::cluster::ClusterMode,
        nodes: usize,
    ) -> Result<(), ConfigError> {
        self.cluster = Some(crate::cluster::Cluster::new(
            mode,
            nodes,
            self.core.gpus().len(),
        )?);
        // The nodes publish each function's class: learned as `mqfqd` learns it.
        if self.placer.is_none() {
            self.placer = Some(scheduler_core::placement::Placement::new(
                scheduler_core::placement::PlacementConfig::default(),
            )?);
        }
        Ok(())
    }

    /// The GPUs `func`'s invocation may go to; empty: any (the core routes it).
    fn candidates(&mut self, func: usize, now: Time, view: &PoolView<'_>) -> Vec<String> {
        if let Some(c) = self.cluster.as_mut() {
            let node = c.pick(&self.names[func], now);
            return c.gpus_of(node);
        }
        self.place(func, now, view)
            .map(|g| vec![g.to_string()])
            .unwrap_or_default()
    }

    /// The GPU `placement` puts `func`'s invocation on; `None`: the core routes it.
    fn place(&mut self, func: usize, now: Time, view: &PoolView<'_>) -> Option<u32> {
        if self.placement == PlacementMode::LeastLoaded {
            return None;
        }
        let gpus = self.core.gpus();
        let n = gpus.len();
        if n < 2 {
            return None;
        }
        let pick = match self.placement {
            PlacementMode::LeastLoaded => return None,
            PlacementMode::RoundRobin => {
                self.turn = self.turn.wrapping_add(1);
                self.turn % n
            }
            PlacementMode::Random => self.rng.below(n),
            PlacementMode::Fitness => {
                let all: Vec<u32> = gpus.iter().map(|g| g.info.index).collect();
                // The peak weights (minute 720, noon): the simulator has no time of day.
                let ahead = self.core.work_ahead(&self.names[func]);
                // Where its idle containers are, as mqfqd reads them from its pool at Create.
                let near = view.pool.map_or_else(Default::default, |p| {
                    let (resident, start_s) = p.presence(&self.names[func]);
                    scheduler_core::placement::Near {
                        resident,
                        start_s,
                        ..Default::default()
                    }
                });
                let c = self.placer.as_ref()?.choose(
                    &gpus,
                    &ahead,
                    &all,
                    &self.names[func],
                    &near,
                    720,
                    now,
                );
                return c.ok().map(|c| c.gpu);
            }
        };
        Some(gpus[pick].info.index)
    }

    /// Every call made into the core so far (when kept).
    #[must_use]
    pub fn inputs(&self) -> &[Input] {
        self.inputs.as_deref().unwrap_or_default()
    }

    /// The core's dispatch record so far (when inputs are kept).
    #[must_use]
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    fn keep(&mut self, input: Input) {
        if let Some(v) = self.inputs.as_mut() {
            v.push(input);
        }
    }

    fn take(&mut self, grants: Vec<Grant>) {
        for g in grants {
            let inv = g.key.id().strip_prefix('i').and_then(|n| n.parse().ok());
            if let Some(inv) = inv {
                self.leases.insert(inv, g.lease);
                self.granted.push_back((inv, g.gpu as usize));
            }
        }
        let log = self.core.drain_log();
        if self.inputs.is_some() {
            self.records.extend(log);
        }
    }
}

impl Policy for NodeMqfq {
    fn name(&self) -> &'static str {
        "mqfq-sticky"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, now: Time, view: &PoolView<'_>) {
        let mut info = admit_info(trace, inv);
        info.gpus = self.candidates(trace.invocations[inv].func, now, view);
        // Names, weights and GPUs come from a validated trace: the core accepts them.
        let grants = self.core.admit(&info, now).unwrap_or_default();
        self.keep(Input::Admit(info, now));
        self.take(grants);
    }
    fn next(&mut self, _: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        None
    }
    fn granted(&mut self) -> Option<(usize, usize)> {
        self.granted.pop_front()
    }
    fn complete(&mut self, inv: usize, trace: &Trace, service_ms: f64, now: Time) {
        let Some(lease) = self.leases.remove(&inv) else {
            return;
        };
        if let Some(p) = self.placer.as_mut() {
            // What NVML's per-process samples would say of the burst: its SM and bandwidth shares.
            let f = &trace.functions[trace.invocations[inv].func];
            let s = scheduler_core::placement::Sample {
                burst_ms: service_ms,
                sm: Some(f.util * (1.0 - f.bw)),
                dram: Some(f.util * f.bw),
                footprint_mib: Some(f.mem_mb),
                transfer_bytes: None,
            };
            let _ = p.observe_burst(
                &self.names[trace.invocations[inv].func],
                f.tenant.as_deref(),
                &s,
                now,
            );
        }
        let measured_s = service_ms / 1e3;
        let grants = self
            .core
            .release(lease, Some(measured_s), "idle", now)
            .unwrap_or_default();
        self.keep(Input::Release {
            lease,
            measured_s,
            now,
        });
        self.take(grants);
    }
    fn queued(&self) -> usize {
        self.core.waiting() + self.granted.len()
    }
    fn active(&self, func: usize) -> bool {
        self.core.flow_state(&self.names[func]) == Some(FlowState::Active)
    }
    fn sample(&mut self, samples: &[GpuReading], now: Time) {
        let grants = self.core.sample(samples, now);
        self.keep(Input::Sample(samples.to_vec(), now));
        self.take(grants);
        if let Some(c) = self.cluster.as_mut() {
            c.publish(&self.core, self.placer.as_ref(), now);
        }
    }
    fn tick(&mut self, _: Time) -> Vec<Signal> {
        // No timer of its own: as in `mqfqd`, sticky TTLs expire at the next call or sample.
        self.core
            .drain_activated()
            .into_iter()
            .filter_map(|(gpu, f)| {
                self.by_name.get(&f).map(|&func| Signal::ActivatedOn {
                    func,
                    gpu: gpu as usize,
                })
            })
            .collect()
    }
    fn set_resident(&mut self, func: usize, resident: bool, switch_ms: f64) {
        let cost_s = switch_ms.max(0.0) / 1e3;
        let function = self.names[func].clone();
        let _ = self.core.set_residency(&function, resident, cost_s);
        self.keep(Input::Residency {
            function,
            resident,
            cost_s,
        });
    }
    fn set_footprint(&mut self, func: usize, bytes: u64, now: Time) {
        let function = self.names[func].clone();
        let grants = self.core.set_footprint(&function, bytes, now);
        self.take(grants);
        self.keep(Input::Footprint {
            function,
            bytes,
            now,
        });
    }
    fn admission(&self) -> Admission {
        Admission::Node
    }
    fn node_limits(&self, gpu: usize) -> Limits {
        self.core
            .limits(u32::try_from(gpu).unwrap_or(u32::MAX))
            .unwrap_or_default()
    }
    fn memory(&self) -> MemoryStyle {
        MemoryStyle::LazyPrefetch
    }
    fn flow_state(&self, func: usize) -> Option<FlowState> {
        self.core.flow_state(&self.names[func])
    }
    fn api_writes(&self) -> Vec<u64> {
        self.cluster
            .as_ref()
            .map(|c| c.writes().to_vec())
            .unwrap_or_default()
    }
}
