//! `mqfq-sticky` in the simulator: the node's own [`Node`] (admission core and pool joined, what
//! `mqfqd` runs) driven by the simulated node. Each invocation is one burst of a container
//! `sim/i<n>`: admitted at arrival, released at its end with the service it received; the
//! executor's utilization samples go in as `mqfqd`'s sampling loop sends them. The core picks the
//! GPU (at arrival, the least loaded; waiting work moves to another GPU that can start it: late
//! binding, on here because the executor runs each grant on the GPU it names), the limit in force
//! and the order; the executor runs what it grants. The pool's keys are the executor's containers (`sim/c<n>`, chosen after admission): the
//! executor tells the node which container a lease runs in ([`Input::Hit`]), carries out the
//! pool's orders and reports them, as the shims do.
//!
//! Every input can be kept with what the node answered ([`NodeMqfq::steps`]), so a test can feed
//! the same inputs to a node built the way `mqfqd` builds it and compare grants, pool orders and
//! dispatch records line for line.

use std::collections::{HashMap, VecDeque};

use scheduler_core::config::{ConcurrencyConfig, ConfigError, GpuMode, QueueConfig};
use scheduler_core::node::admission::{
    AdmitInfo, Core, CoreError, GpuInfo, GpuReading, Kind, Limits, MemoryAdmission, Record,
};
use scheduler_core::node::pool::{Order, Pool, PoolConfig};
use scheduler_core::node::{ContainerKey, Input, Node, Output, PooledEnd};
use scheduler_core::{FlowState, Time};

use crate::policy::{MemoryModel, NodeDriver, Policy, PoolView, Signal};
use crate::rng::SplitMix64;
use crate::trace::Trace;
use crate::types::PlacementMode;

/// The containerd namespace the simulator's containers are named in.
pub const NAMESPACE: &str = "sim";

/// One input the simulator gave the node, at its time, with the node's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The input.
    pub input: Input,
    /// When.
    pub now: Time,
    /// What the node decided (empty when it refused the input).
    pub output: Output,
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
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a memory size in MB, clamped >= 0: its bytes fit u64"
            )]
            memory_total: (memory_mb(g).max(0.0) * 1024.0 * 1024.0) as u64,
            mig: Vec::new(),
        })
        .collect()
}

/// The pool's knobs in the simulator: the node's tier knobs, reclaim on (a container past its
/// warm TTL is gone, as the executor's own memory model has it), host memory not modelled.
#[must_use]
pub fn pool_config(cfg: &crate::types::SimConfig) -> PoolConfig {
    PoolConfig {
        tiers: cfg.tiers.clone(),
        reclaim: true,
        host_headroom: 0.0,
    }
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
    node: Node,
    names: Vec<String>,
    leases: HashMap<usize, u64>,
    granted: VecDeque<(usize, usize)>,
    /// Pool orders not yet carried out by the executor.
    orders: VecDeque<Order>,
    steps: Option<Vec<Step>>,
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
    /// The node over `gpus` with these knobs; with `keep_steps`, every input is kept.
    ///
    /// # Errors
    /// A bad knob.
    pub fn new(
        trace: &Trace,
        gpus: Vec<GpuInfo>,
        queue: &QueueConfig,
        conc: &ConcurrencyConfig,
        pool: PoolConfig,
        keep_steps: bool,
    ) -> Result<Self, ConfigError> {
        let mut core = Core::new(gpus, queue, |_| conc.clone()).map_err(config_error)?;
        // The executor runs each grant on the GPU it names: waiting work may move.
        core.set_late_binding(true);
        let (names, _) = flow_names(trace);
        Ok(NodeMqfq {
            node: Node::new(core, Pool::new(pool)?),
            names,
            leases: HashMap::new(),
            granted: VecDeque::new(),
            orders: VecDeque::new(),
            steps: keep_steps.then(Vec::new),
            records: Vec::new(),
            placement: PlacementMode::LeastLoaded,
            placer: None,
            turn: 0,
            rng: SplitMix64::new(0x9e37_79b9),
            cluster: None,
        })
    }

    /// The core's knobs that [`Overrides::apply`] does not carry, as `mqfqd` sets them from
    /// the same `[queue]` knobs: memory admission (default on, within the pool's headroom),
    /// late binding (default on here: the executor runs each grant on the GPU it names) and
    /// the maximum burst hold (`[limits]`).
    ///
    /// # Errors
    /// A bad default footprint or hold.
    ///
    /// [`Overrides::apply`]: scheduler_core::config::Overrides::apply
    pub fn set_core_knobs(&mut self, cfg: &crate::types::SimConfig) -> Result<(), ConfigError> {
        let q = &cfg.overrides.queue;
        let memory = MemoryAdmission::from_knobs(q, cfg.tiers.headroom)?;
        let core = self.node.core_mut();
        if let Some(m) = memory {
            core.set_memory(m).map_err(config_error)?;
        }
        core.set_late_binding(q.late_binding_or(true));
        core.set_max_burst_hold(cfg.max_burst_hold_s)
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
            self.node.core().gpus().len(),
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
    fn candidates(&mut self, func: usize, now: Time) -> Vec<String> {
        if let Some(c) = self.cluster.as_mut() {
            let node = c.pick(&self.names[func], now);
            return c.gpus_of(node);
        }
        self.place(func, now)
            .map(|g| vec![g.to_string()])
            .unwrap_or_default()
    }

    /// The GPU `placement` puts `func`'s invocation on; `None`: the core routes it.
    fn place(&mut self, func: usize, now: Time) -> Option<u32> {
        if self.placement == PlacementMode::LeastLoaded {
            return None;
        }
        let gpus = self.node.core().gpus();
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
                let ahead = self.node.core().work_ahead(&self.names[func]);
                // Where its idle containers are, as mqfqd reads them from its pool at Create.
                let (resident, start_s) = self.node.pool().presence(&self.names[func]);
                let near = scheduler_core::placement::Near {
                    resident,
                    start_s,
                    ..Default::default()
                };
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

    /// Every input given to the node so far, with its answer (when kept).
    #[must_use]
    pub fn steps(&self) -> &[Step] {
        self.steps.as_deref().unwrap_or_default()
    }

    /// The core's dispatch record so far (when steps are kept).
    #[must_use]
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The node's pool.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        self.node.pool()
    }
}

impl NodeDriver for NodeMqfq {
    fn step(&mut self, input: Input, now: Time) {
        // Names, weights and GPUs come from a validated trace and leases from the node's own
        // grants: a refusal changes nothing and answers nothing.
        let output = self.node.step(&input, now).unwrap_or_default();
        for g in &output.grants {
            let inv = g.key.id().strip_prefix('i').and_then(|n| n.parse().ok());
            if let Some(inv) = inv {
                self.leases.insert(inv, g.lease);
                self.granted.push_back((inv, g.gpu as usize));
            }
        }
        self.orders.extend(output.orders.iter().cloned());
        let log = self.node.drain_log();
        if let Some(steps) = self.steps.as_mut() {
            self.records.extend(log);
            steps.push(Step { input, now, output });
        }
    }

    /// Invocation `inv`'s burst runs in the pooled container `container`: a pool hit.
    fn hit(&mut self, inv: usize, container: ContainerKey, now: Time) {
        if let Some(&lease) = self.leases.get(&inv) {
            let hit = Input::Hit {
                lease,
                container: Some(container),
            };
            self.step(hit, now);
        }
    }

    /// The lease ends in one input with its container's fate, as `mqfqd`'s release does.
    fn release(
        &mut self,
        inv: usize,
        trace: &Trace,
        service_ms: f64,
        pooled: Option<PooledEnd>,
        now: Time,
    ) {
        let Some(lease) = self.leases.remove(&inv) else {
            // Every run the executor ends was granted, and ends once.
            debug_assert!(false, "invocation {inv} ended without a lease");
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
        let release = Input::Release {
            lease,
            measured_s: Some(service_ms / 1e3),
            reason: "idle".into(),
            pooled,
        };
        self.step(release, now);
    }

    /// The pool's orders not yet carried out.
    fn take_orders(&mut self) -> Vec<Order> {
        self.orders.drain(..).collect()
    }
}

impl Policy for NodeMqfq {
    fn name(&self) -> &'static str {
        "mqfq-sticky"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, now: Time, _: &PoolView<'_>) {
        let mut info = admit_info(trace, inv);
        info.gpus = self.candidates(trace.invocations[inv].func, now);
        self.step(Input::Admit(info), now);
    }
    fn next(&mut self, _: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        None
    }
    fn granted(&mut self) -> Option<(usize, usize)> {
        self.granted.pop_front()
    }
    fn complete(&mut self, inv: usize, trace: &Trace, service_ms: f64, now: Time) {
        self.release(inv, trace, service_ms, None, now);
    }
    fn queued(&self) -> usize {
        self.node.core().waiting() + self.granted.len()
    }
    fn active(&self, func: usize) -> bool {
        self.node.core().flow_state(&self.names[func]) == Some(FlowState::Active)
    }
    fn sample(&mut self, samples: &[GpuReading], now: Time) {
        self.step(Input::Sample(samples.to_vec()), now);
        if let Some(c) = self.cluster.as_mut() {
            c.publish(self.node.core(), self.placer.as_ref(), now);
        }
    }
    fn tick(&mut self, _: Time) -> Vec<Signal> {
        // No timer of its own: as in `mqfqd`, sticky TTLs expire at the next call or sample,
        // and a flow turning Active prefetches through the node's own pool.
        Vec::new()
    }
    fn node_mut(&mut self) -> Option<&mut dyn NodeDriver> {
        Some(self)
    }
    fn model(&self) -> MemoryModel {
        MemoryModel::Node
    }
    fn node_limits(&self, gpu: usize) -> Limits {
        self.node
            .core()
            .limits(u32::try_from(gpu).unwrap_or(u32::MAX))
            .unwrap_or_default()
    }
    fn flow_state(&self, func: usize) -> Option<FlowState> {
        self.node.core().flow_state(&self.names[func])
    }
    fn api_writes(&self) -> Vec<u64> {
        self.cluster
            .as_ref()
            .map(|c| c.writes().to_vec())
            .unwrap_or_default()
    }
}
