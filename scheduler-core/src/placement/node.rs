//! The node's placement state: what mqfqd keeps between choices (functions' features, each
//! GPU's health) and the choice itself over the admission core's view of its GPUs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;

use super::features::{Bound, Class, FeatureConfig, Features, Sample, SampleError};
use super::fitness::{Choice, GpuView, Health, Need, PlacementError, WeightSchedule, choose};
use super::health::{HealthConfig, HealthSample, HealthTracker};
use super::models::{GpuModel, builtin, lookup};
use super::processes::{ProcessSamples, ProcessUse};
use crate::config::{ConfigError, reject};
use crate::node::admission;
use crate::queue::WorkAhead;
use crate::time::Time;

/// Everything placement is configured with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlacementConfig {
    /// Peak / off-peak weights.
    pub schedule: WeightSchedule,
    /// GPU models: the operator's first, then the built-in table.
    pub models: Vec<GpuModel>,
    /// GPUs new functions are probed on (empty: any candidate; the cleanest, readiest, then
    /// the one giving the probe the most FLOPS).
    pub probe_gpus: Vec<u32>,
    /// Measurement and classification.
    pub features: FeatureConfig,
    /// Failed and overloaded GPUs.
    pub health: HealthConfig,
    /// Critical Xids that say the GPU itself is failing (it needs a drain, a reset or a
    /// replacement): such a GPU takes no new container for `health.xid_recover_samples`. The
    /// others (an application's fault, a page fault, a channel torn down) are its work's.
    pub fatal_xids: Vec<u64>,
    /// What a cold start costs, seconds: where no idle container of a function is, a call
    /// there would start one (the pool measures restores, not cold starts).
    pub cold_start_s: f64,
}

/// Xids after which NVIDIA's catalog says to drain or reset the GPU: double-bit ECC (48),
/// row-remap failure (64), NVLink (74), fallen off the bus (79), uncontained ECC (95), GSP
/// timeout and error (119, 120).
pub const FATAL_XIDS: [u64; 7] = [48, 64, 74, 79, 95, 119, 120];

/// The default cold start: a GPU container's takes seconds; 3 s is the reference node's
/// (docs/SIMULATOR.md). An operator who measures theirs sets `placement.cold_start_s`.
pub const COLD_START_S: f64 = 3.0;

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            schedule: WeightSchedule::default(),
            models: builtin(),
            probe_gpus: Vec::new(),
            features: FeatureConfig::default(),
            health: HealthConfig::default(),
            fatal_xids: FATAL_XIDS.to_vec(),
            cold_start_s: COLD_START_S,
        }
    }
}

impl PlacementConfig {
    /// Checks every part, naming the first bad knob.
    ///
    /// # Errors
    /// A bad knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.schedule.validate()?;
        for m in &self.models {
            m.validate()?;
        }
        if self.probe_gpus.len() > 64 {
            return Err(reject(
                "placement.probe_gpus",
                self.probe_gpus.len(),
                "at most 64 GPUs",
            ));
        }
        if self.fatal_xids.len() > 256 {
            return Err(reject(
                "placement.fatal_xids",
                self.fatal_xids.len(),
                "at most 256 Xids",
            ));
        }
        if !(self.cold_start_s.is_finite() && (0.0..=3600.0).contains(&self.cold_start_s)) {
            return Err(reject(
                "placement.cold_start_s",
                self.cold_start_s,
                "must be a number of seconds, 0-3600",
            ));
        }
        self.features.validate()?;
        self.health.validate()
    }
}

/// How long a placement counts as work on its GPU: the container being created asks for its
/// slot at Start, and until then the core's queue does not show it, so Creates in a burst
/// would all choose the same GPU.
const PLACED_HOLD_S: f64 = 10.0;

/// At most this many recent placements are kept (a Create storm is bounded, not remembered).
const PLACED_MAX: usize = 1024;

/// Where a function has company: GPUs holding its idle memory, and GPUs running the functions
/// it names as partners (`io.mqfq.partners`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Near {
    /// GPUs where its memory is resident (a Hot container of it in the pool, idle or busy).
    pub resident: BTreeSet<u32>,
    /// GPUs where a partner runs or is resident.
    pub partners: BTreeSet<u32>,
    /// GPUs holding an idle container of it, and how long that container would take to serve
    /// a call, seconds (0 when its memory is resident, else its restore): the pool's
    /// [`crate::node::pool::Pool::start_costs`]. A GPU not listed would start one cold.
    pub start_s: BTreeMap<u32, f64>,
}

/// The node's placement state.
#[derive(Clone, Debug)]
pub struct Placement {
    cfg: PlacementConfig,
    features: Features,
    health: BTreeMap<u32, HealthTracker>,
    /// Recent choices, oldest first: (GPU, when).
    recent: VecDeque<(u32, Time)>,
    /// NVML's recent per-process samples, for bursts' utilization.
    processes: ProcessSamples,
}

impl Placement {
    /// Placement under `cfg`.
    ///
    /// # Errors
    /// A bad knob.
    pub fn new(cfg: PlacementConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Placement {
            features: Features::new(cfg.features),
            cfg,
            health: BTreeMap::new(),
            recent: VecDeque::new(),
            processes: ProcessSamples::new(),
        })
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &PlacementConfig {
        &self.cfg
    }

    /// The functions' features.
    #[must_use]
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// One ended burst of `function`'s work (admitted in `tenant`, if any).
    ///
    /// # Errors
    /// A reading out of range (dropped).
    pub fn observe_burst(
        &mut self,
        function: &str,
        tenant: Option<&str>,
        sample: &Sample,
        now: Time,
    ) -> Result<(), SampleError> {
        self.features.observe_in(function, tenant, sample, now)
    }

    /// Whether Xid `xid` says the GPU itself is failing.
    #[must_use]
    pub fn fatal_xid(&self, xid: u64) -> bool {
        self.cfg.fatal_xids.contains(&xid)
    }

    /// NVML's per-process samples on GPU `gpu`, taken at `now`.
    pub fn observe_processes(&mut self, gpu: u32, now: Time, samples: &[ProcessUse]) {
        self.processes.record(gpu, now, samples);
    }

    /// The SM and memory-bandwidth utilization of a burst's processes `pids` on `gpu` while
    /// its lease was held (`since` to `until`); `None` when NVML sampled none of them then.
    #[must_use]
    pub fn burst_use(
        &self,
        gpu: u32,
        pids: &[u32],
        since: Time,
        until: Time,
    ) -> Option<(f64, f64)> {
        self.processes.mean(gpu, pids, since, until)
    }

    /// One sampling period of GPU `index`; the change of its health, if any.
    pub fn observe_gpu(&mut self, index: u32, s: HealthSample) -> Option<(Health, Health)> {
        let cfg = self.cfg.health;
        self.health.entry(index).or_default().observe(s, &cfg)
    }

    /// GPU `index`'s health (healthy until a sample says otherwise).
    #[must_use]
    pub fn health(&self, index: u32) -> Health {
        self.health
            .get(&index)
            .map_or(Health::Healthy, HealthTracker::state)
    }

    /// A container was placed on `gpu` at `now`: for [`PLACED_HOLD_S`] it counts as one more
    /// admission there, so the next choices see it before its Start reaches the queue.
    pub fn placed(&mut self, gpu: u32, now: Time) {
        self.forget_placed(now);
        if self.recent.len() >= PLACED_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((gpu, now));
    }

    fn forget_placed(&mut self, now: Time) {
        while self
            .recent
            .front()
            .is_some_and(|&(_, at)| now.secs_since(at) >= PLACED_HOLD_S)
        {
            self.recent.pop_front();
        }
    }

    /// Per candidate: (seconds of work held or waiting there, the function's own service
    /// there), where the function's service is measured on at least one candidate. Its
    /// service where it was not measured is scaled from where it was by the speed of its
    /// kind of work; invocations of functions not yet measured, and placements not yet in the
    /// queue, count as one run of it each. Empty (placement counts runs) otherwise.
    fn work_in_seconds(
        &self,
        views: &[GpuView],
        ahead: &[(u32, WorkAhead)],
        class: Class,
        now: Time,
    ) -> BTreeMap<u32, (f64, f64)> {
        let Class::Known { bound, .. } = class else {
            return BTreeMap::new();
        };
        let speed = |index: u32| {
            views
                .iter()
                .find(|v| v.index == index)
                .map(|v| match bound {
                    Bound::Compute => v.model.tflops,
                    Bound::Memory => v.model.mem_gbps,
                })
                .filter(|s| *s > 0.0)
        };
        let chosen = || {
            ahead
                .iter()
                .filter(|(i, _)| views.iter().any(|v| v.index == *i))
        };
        // The function's service on a unit-speed GPU: the mean over where it was measured.
        let units: Vec<f64> = chosen()
            .filter_map(|(i, w)| Some(w.own_s? * speed(*i)?))
            .filter(|u| u.is_finite() && *u > 0.0)
            .collect();
        if units.is_empty() {
            return BTreeMap::new();
        }
        #[expect(clippy::cast_precision_loss, reason = "a handful of GPUs")]
        let unit = units.iter().sum::<f64>() / units.len() as f64;
        chosen()
            .filter_map(|(i, w)| {
                let own = w
                    .own_s
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .or_else(|| Some(unit / speed(*i)?))?;
                #[expect(clippy::cast_precision_loss, reason = "invocation counts")]
                let guessed = (w.unknown as f64 + f64::from(self.pending(*i, now))) * own;
                Some((*i, (w.known_s + guessed, own)))
            })
            .collect()
    }

    /// Placements on `gpu` still held at `now`.
    fn pending(&self, gpu: u32, now: Time) -> u32 {
        let n = self
            .recent
            .iter()
            .filter(|&&(g, at)| g == gpu && now.secs_since(at) < PLACED_HOLD_S)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Chooses among `candidates` (NVML indices) for `function`, from the core's view of its
    /// GPUs and the work each holds or waits for (`ahead`, [`admission::Core::work_ahead`] of
    /// the function's key), where the function's memory is resident and where the functions
    /// it names as partners run (`near`), the minute of the day, and the placements made in
    /// the last [`PLACED_HOLD_S`] before `now`.
    ///
    /// # Errors
    /// No usable candidate (none, unknown to the core, or all failed).
    #[expect(
        clippy::too_many_arguments,
        reason = "the choice's inputs, each from its owner"
    )]
    pub fn choose(
        &self,
        gpus: &[admission::GpuView],
        ahead: &[(u32, WorkAhead)],
        candidates: &[u32],
        function: &str,
        near: &Near,
        minute_of_day: u32,
        now: Time,
    ) -> Result<Choice, PlacementError> {
        let class = self.features.class(function);
        let mut views: Vec<GpuView> = candidates
            .iter()
            .filter_map(|&c| gpus.iter().find(|g| g.info.index == c))
            .map(|g| {
                let total = g.info.memory_total.max(1);
                #[expect(clippy::cast_precision_loss, reason = "memory sizes as fractions")]
                let memory_used = g.memory_used as f64 / total as f64;
                GpuView {
                    index: g.info.index,
                    model: lookup(&self.cfg.models, &g.info.name),
                    // The share of its slots in use, or its SM activity where the GPU has it and
                    // it is higher: busy-time reads 100 % with one small kernel and says nothing
                    // of room, and a GPU whose slots are all taken has no room now however idle
                    // its SMs look (light functions on a fast GPU).
                    utilization: {
                        let slots = f64::from(g.running) / f64::from(g.limit.max(1));
                        g.reading.sm_activity.map_or(slots, |sm| sm.max(slots))
                    },
                    utilization_stddev: self
                        .health
                        .get(&g.info.index)
                        .map_or(0.0, HealthTracker::load_stddev),
                    memory_used,
                    queue: g
                        .running
                        .saturating_add(u32::try_from(g.queued).unwrap_or(u32::MAX))
                        .saturating_add(self.pending(g.info.index, now)),
                    work_s: None,
                    limit: g.limit,
                    power: self
                        .health
                        .get(&g.info.index)
                        .and_then(HealthTracker::power),
                    health: self.health(g.info.index),
                    resident: near.resident.contains(&g.info.index),
                    start_s: near
                        .start_s
                        .get(&g.info.index)
                        .copied()
                        .unwrap_or(self.cfg.cold_start_s),
                    partner: near.partners.contains(&g.info.index),
                }
            })
            .collect();
        let work = self.work_in_seconds(&views, ahead, class, now);
        for v in &mut views {
            v.work_s = work.get(&v.index).copied();
        }
        let need = Need {
            class,
            features: self.features.get(function),
        };
        choose(
            &views,
            &need,
            self.cfg.schedule.at(minute_of_day),
            &self.cfg.probe_gpus,
        )
    }
}
