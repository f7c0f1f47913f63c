//! The node's admission decisions, without I/O: per-GPU MQFQ-Sticky queues and concurrency limits,
//! leases, waiting admissions, re-registration, and the dispatch record. `mqfqd` serves it over
//! its socket; the simulator's `mqfq-sticky` drives the very same object.
//!
//! Every operation takes `now` and first expires sticky TTLs up to it, so the dispatch record
//! (enqueue, dispatch, release, withdraw, adopt, charge — with times and the free slots each
//! dispatch was given; `overtime` lines change no queue) is enough to replay the queue's decisions
//! exactly; the integration tests do that.
//!
//! Each GPU has its own queue and limit; an admission is routed at arrival to the least loaded
//! GPU among those the container was given. A container given several GPUs is gated on one of
//! them (gang admission across GPUs is not implemented; see docs/ARCHITECTURE.md).

use std::collections::{BTreeMap, HashMap};

use crate::concurrency::{ConcurrencyController, Reading, Signals};
use crate::config::{ConcurrencyConfig, GpuMode, QueueConfig};
use crate::queue::FlowEvent;
use crate::{FlowId, MqfqQueue, Ticket, Time};
use serde::{Deserialize, Serialize};

use super::ContainerKey;

/// Errors of the admission core; each names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// A request field is missing or out of range.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The protocol field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The container named a GPU this node does not have.
    #[error("unknown GPU {0:?} (not an index, UUID or MIG device of this node)")]
    UnknownGpu(String),
    /// The container already waits for admission.
    #[error("container {0} is already waiting for admission")]
    AlreadyWaiting(ContainerKey),
    /// Release of a lease that is not held.
    #[error("lease {0} is not held")]
    UnknownLease(u64),
    /// A shim asked for more than its share of the daemon.
    #[error("{what}: at most {limit} per shim ([limits] in mqfqd.toml)")]
    Limit {
        /// What is capped.
        what: &'static str,
        /// The cap.
        limit: usize,
    },
    /// Bad scheduler knobs.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
}

/// One GPU as the monitor described it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Plain, MPS or MIG (sets D_max).
    pub mode: GpuMode,
    /// Framebuffer size in bytes.
    pub memory_total: u64,
    /// MIG device UUIDs (`MIG-…`) on this GPU.
    pub mig: Vec<String>,
}

/// One GPU's sample, as the monitor read it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GpuReading {
    /// NVML index.
    pub index: u32,
    /// Busy-time and SM activity over the period.
    pub signals: Signals,
    /// Framebuffer bytes in use.
    pub memory_used: u64,
}

/// What an admission is for: a task's start, its resume after a pause, or a burst of GPU work
/// in a running container (seen by its CUDA interposer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Task Start.
    Start,
    /// Task Resume.
    Resume,
    /// A burst of GPU work.
    Burst,
}

impl Kind {
    /// The name in metrics and the dispatch record.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Start => "start",
            Kind::Resume => "resume",
            Kind::Burst => "burst",
        }
    }
}

/// An admission request, validated by [`Core::admit`].
#[derive(Clone, Debug, PartialEq)]
pub struct AdmitInfo {
    /// containerd namespace.
    pub namespace: String,
    /// Container id.
    pub container_id: String,
    /// Function key.
    pub function: String,
    /// The tenant in force (the operator's policy decided it); `None`: none.
    pub tenant: Option<String>,
    /// That tenant's weight; 0 means 1.
    pub tenant_weight: f64,
    /// Flow weight in force; 0 means 1.
    pub weight: f64,
    /// Requested GPUs as named by the container; empty means all.
    pub gpus: Vec<String>,
    /// Start or Resume.
    pub kind: Kind,
    /// The shim's pid.
    pub shim_pid: u32,
}

impl AdmitInfo {
    /// The container's key.
    ///
    /// # Errors
    /// An empty namespace or id, or one holding a `/` (the error names the field).
    pub fn key(&self) -> Result<ContainerKey, CoreError> {
        ContainerKey::new(&self.namespace, &self.container_id).map_err(|e| CoreError::Invalid {
            field: e.field,
            reason: format!("{:?} must be non-empty without '/'", e.value),
        })
    }

    /// The queue's flow for it: the function, scoped by the tenant (`tenant/function`), so a
    /// function key named in one tenant never joins another tenant's flow.
    #[must_use]
    pub fn flow_key(&self) -> String {
        match &self.tenant {
            Some(t) => format!("{t}/{}", self.function),
            None => self.function.clone(),
        }
    }
}

/// What a registration did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registration {
    /// `(key, lease)` for every running container the shim listed.
    pub leases: Vec<(ContainerKey, u64)>,
    /// `(key, lease)` of leases the shim held but no longer lists: released.
    pub released: Vec<(ContainerKey, u64)>,
    /// What the freed slots dispatched.
    pub grants: Vec<Grant>,
}

/// A dispatched admission.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// The container.
    pub key: ContainerKey,
    /// The lease.
    pub lease: u64,
    /// The GPU it counts against.
    pub gpu: u32,
    /// Time queued.
    pub waited_ns: u64,
}

/// A running container a shim re-registers.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningInfo {
    /// Its identity, as at admission.
    pub info: AdmitInfo,
    /// The lease it holds from this daemon, if any (0 = none).
    pub lease: u64,
}

#[derive(Debug)]
struct Gpu {
    info: GpuInfo,
    queue: MqfqQueue<ContainerKey>,
    conc: ConcurrencyController,
    running: u32,
    long_running: u32,
    /// Leases held in overtime (see `overtime`).
    overtime: u32,
    memory_used: u64,
}

#[derive(Clone, Debug)]
struct Waiting {
    gpu: u32,
    flow: FlowId,
    function: String,
    tenant: Option<String>,
    shim_pid: u32,
    kind: Kind,
    /// The GPUs it may run on (late binding moves it among them).
    candidates: Vec<u32>,
    /// What it asked with, and the weight in force (to join a flow on another GPU).
    info: AdmitInfo,
    weight: f64,
    /// When it arrived.
    since: Time,
}

/// A held lease.
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    /// Container key.
    pub key: ContainerKey,
    /// Function.
    pub function: String,
    /// Its tenant, if any.
    pub tenant: Option<String>,
    /// GPU.
    pub gpu: u32,
    /// Holder shim's pid.
    pub shim_pid: u32,
    /// When it was granted.
    pub since: Time,
    /// What it was asked for.
    pub kind: Kind,
    ticket: Ticket,
    /// What it has been charged so far, seconds (the dispatch estimate, then each charge of a
    /// burst that keeps running).
    charged: f64,
    long: bool,
    /// The registration epoch it was granted in (see [`Core::register`]).
    epoch: u64,
    /// The GPU memory it is charged, bytes (its function's footprint at grant).
    footprint: u64,
    /// A burst held past the maximum hold: it no longer keeps waiting work out (`overtime`).
    pub overtime: bool,
}

/// A read-only view of one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuView {
    /// What the monitor said.
    pub info: GpuInfo,
    /// D.
    pub d: f64,
    /// Limit in force.
    pub limit: u32,
    /// Leases held.
    pub running: u32,
    /// What its last sample saw (busy-time, SM activity, slowdown).
    pub reading: Reading,
    /// Last memory sample.
    pub memory_used: u64,
    /// Its queue's V.
    pub virtual_time: f64,
    /// Admissions waiting.
    pub queued: usize,
    /// Its memory as admission sees it.
    pub memory: MemoryView,
}

/// A GPU's limits in force (see [`Core::limits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Any admission is granted while fewer leases than this are held (⌊D⌋, one less at D_max
    /// while the short-slot reserve is in force).
    pub any: u32,
    /// No admission is granted at or above this many leases (`any` plus the reserve's slot).
    pub slots: u32,
    /// Slots free to any work now (`Core::free_under_d`: a running short lease holds the
    /// reserve's slot); 0 when only the reserve's slot, or none, is free.
    pub free: u32,
    /// Admissions waiting for this GPU.
    pub queued: usize,
    /// Whether waiting work may take the reserve's slot (above `any`, below `slots`) now: a
    /// short flow's head within the over-run threshold, whose memory fits.
    pub reserve_waiting: bool,
    /// Work waits, and none of it that may take a slot fits the GPU's memory beside the leases
    /// held: a free slot stays free for memory, not for want of work.
    pub memory_bound: bool,
}

/// The daemon's admission state.
#[derive(Debug)]
pub struct Core {
    queue_cfg: QueueConfig,
    gpus: Vec<Gpu>,
    waiting: HashMap<ContainerKey, Waiting>,
    leases: BTreeMap<u64, Lease>,
    lease_of: HashMap<ContainerKey, u64>,
    next_lease: u64,
    seq: u64,
    log: Vec<Record>,
    fail_open_starts: u64,
    hold: Time,
    /// Waiting work may move to another of its GPUs (`steal`); off: it stays where routed.
    late_binding: bool,
    /// Flows that turned Active since the last [`Core::drain_activated`]: (GPU, function).
    activated: Vec<(u32, String)>,
    /// Per-shim caps: waiting admissions, registered containers.
    limits: (usize, usize),
    /// Waiting admissions per shim.
    waiting_of: HashMap<u32, usize>,
    /// Counts registrations; a lease remembers the count it was granted at.
    epoch: u64,
    /// The epoch of each shim's last registration.
    registered_at: HashMap<u32, u64>,
    /// Memory admission's knobs; `None`: slots alone gate.
    memory: Option<MemoryAdmission>,
    /// Each function's footprint as the pool measured it, bytes.
    footprints: BTreeMap<String, u64>,
    /// How long a burst lease may keep waiting work out, seconds (`overtime`); `None`: for ever.
    max_burst_hold: Option<f64>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> CoreError {
    CoreError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl Core {
    /// A core for `gpus`, with the queue knobs and, per GPU mode, the concurrency knobs.
    ///
    /// # Errors
    /// Invalid knobs; no GPU.
    pub fn new(
        gpus: Vec<GpuInfo>,
        queue_cfg: &QueueConfig,
        conc: impl Fn(GpuMode) -> ConcurrencyConfig,
    ) -> Result<Self, CoreError> {
        if gpus.is_empty() {
            return Err(invalid("gpus", "the node has no GPU to gate"));
        }
        let gpus = gpus
            .into_iter()
            .map(|info| {
                Ok(Gpu {
                    queue: MqfqQueue::new(queue_cfg.clone())?,
                    conc: ConcurrencyController::new(conc(info.mode))?,
                    info,
                    running: 0,
                    long_running: 0,
                    overtime: 0,
                    memory_used: 0,
                })
            })
            .collect::<Result<Vec<_>, CoreError>>()?;
        Ok(Core {
            queue_cfg: queue_cfg.clone(),
            gpus,
            waiting: HashMap::new(),
            leases: BTreeMap::new(),
            lease_of: HashMap::new(),
            next_lease: 1,
            seq: 0,
            log: Vec::new(),
            fail_open_starts: 0,
            hold: Time::ZERO,
            late_binding: false,
            activated: Vec::new(),
            limits: (usize::MAX, usize::MAX),
            waiting_of: HashMap::new(),
            epoch: 0,
            registered_at: HashMap::new(),
            memory: None,
            footprints: BTreeMap::new(),
            max_burst_hold: Some(overtime::DEFAULT_MAX_BURST_HOLD_S),
        })
    }

    /// Caps what one shim may have: waiting admissions and registered containers.
    pub fn set_limits(&mut self, waiters_per_shim: usize, containers_per_shim: usize) {
        self.limits = (waiters_per_shim, containers_per_shim);
    }

    /// The registered-containers cap per shim.
    #[must_use]
    pub fn containers_per_shim(&self) -> usize {
        self.limits.1
    }

    fn waiting_insert(&mut self, key: ContainerKey, w: Waiting) {
        *self.waiting_of.entry(w.shim_pid).or_default() += 1;
        self.waiting.insert(key, w);
    }

    fn waiting_remove(&mut self, key: &ContainerKey) -> Option<Waiting> {
        let w = self.waiting.remove(key)?;
        if let Some(n) = self.waiting_of.get_mut(&w.shim_pid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.waiting_of.remove(&w.shim_pid);
            }
        }
        Some(w)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn tick(&mut self, now: Time) {
        for slot in 0..self.gpus.len() {
            self.gpus[slot].queue.tick(now);
            self.collect_events(slot);
        }
    }

    /// Keeps the flows that turned Active (the pool prefetches their memory).
    fn collect_events(&mut self, slot: usize) {
        let g = &mut self.gpus[slot];
        for e in g.queue.drain_events() {
            if let FlowEvent::Activated(f) = e
                && let Some(k) = g.queue.key(f)
            {
                self.activated.push((g.info.index, k.to_owned()));
            }
        }
    }

    /// The flows that turned Active since the last call, as (GPU, function).
    pub fn drain_activated(&mut self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.activated)
    }

    /// The limits in force on a GPU: `(any, slots)`. Any work may take a slot while fewer than
    /// `any` run; `slots` bounds everything. Without the short-slot reserve both are ⌊D⌋. While
    /// a short flow is Active, the reserve adds a slot for short flows only above the long
    /// invocations running (and at least a second slot); it lives under D_max, so there `any`
    /// is at most D_max − 1. A GPU limited to one slot (MIG) has no reserve. Both rise by one
    /// for each burst lease on the GPU in overtime (see `overtime`).
    fn limits_of(&self, slot: usize) -> (u32, u32) {
        let (any, slots) = self.normal_limits_of(slot);
        // A burst in overtime no longer keeps waiting work out.
        let extra = self.overtime_slots(slot);
        (any + extra, slots + extra)
    }

    /// [`Core::limits_of`] before overtime raises them. The reserve sits above the long work
    /// running that is not in overtime (an overtime lease's slot is given back separately, and
    /// counted in the reserve too it let the overstaying function through above the reserve).
    fn normal_limits_of(&self, slot: usize) -> (u32, u32) {
        let g = &self.gpus[slot];
        let d = g.conc.limit();
        let d_max = g.conc.config().d_max;
        if self.reserve_on(slot) {
            let long = g.long_running.saturating_sub(self.overtime_long(slot));
            (d.min(d_max - 1), d.max(long + 1).clamp(2, d_max))
        } else {
            (d, d)
        }
    }

    /// Slots of GPU `slot` free to any work under ⌊D⌋ and the limit in force (0: only the
    /// reserve's slot is free, if any). A short lease that runs, not in overtime (an overtime lease's slot is given back
    /// through the limits already), is taken to hold the reserve's slot, so the slots under ⌊D⌋
    /// are those the others hold: short leases turning over on every slot keep none of them from
    /// the fair order.
    pub(super) fn free_under_d(&self, slot: usize) -> u32 {
        let (any, limit) = self.limits_of(slot);
        self.free_within(slot, any, limit)
    }

    /// [`Core::free_under_d`] with GPU `slot`'s limits already read (`any`, `limit`).
    pub(super) fn free_within(&self, slot: usize, any: u32, limit: u32) -> u32 {
        let g = &self.gpus[slot];
        let overtime_short = g.overtime.saturating_sub(self.overtime_long(slot));
        let shorts = g
            .running
            .saturating_sub(g.long_running)
            .saturating_sub(overtime_short);
        let used = if shorts > 0 && self.reserve_on(slot) {
            g.running - 1
        } else {
            g.running
        };
        any.saturating_sub(used)
            .min(limit.saturating_sub(g.running))
    }

    /// Whether GPU `slot` keeps its short-slot reserve now: a short flow is Active there.
    fn reserve_on(&self, slot: usize) -> bool {
        let g = &self.gpus[slot];
        self.queue_cfg.short_charge_s > 0.0
            && g.conc.config().d_max >= 2
            && g.queue.active_short_flows() > 0
    }

    /// The order admissions are granted in (`policy` in mqfqd.toml).
    #[must_use]
    pub fn order(&self) -> crate::config::GrantOrder {
        crate::config::GrantOrder::of(&self.queue_cfg)
    }

    /// Dispatches nothing before `until`: a restarted daemon first lets the shims re-register
    /// the containers that are running, so that it does not hand their slots out again.
    pub fn hold_until(&mut self, until: Time) {
        self.hold = until;
    }

    /// Records which shim holds a freshly granted lease (the server knows the caller).
    pub fn set_holder(&mut self, lease: u64, shim_pid: u32) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.shim_pid = shim_pid;
        }
    }

    /// The shim pid that asked for a waiting admission.
    #[must_use]
    pub fn waiter_pid(&self, key: &ContainerKey) -> Option<u32> {
        self.waiting.get(key).map(|w| w.shim_pid)
    }

    /// The end of a sample period on one GPU: D moves on what it saw (and on the admissions
    /// that ended since the last one), and a higher limit may dispatch.
    pub fn observe(&mut self, reading: &GpuReading, now: Time) -> Vec<Grant> {
        self.tick(now);
        let slot = self.slot(reading.index);
        // Work that waits for memory does not ask for more slots: D grows only where a slot
        // would be used, never past what memory admits.
        let memory_bound = self.gpus[slot].queue.queued() > 0 && !self.fits_waiting(slot, 1);
        let g = &mut self.gpus[slot];
        let waiting = g.queue.queued() > 0 && !memory_bound;
        g.conc.observe_with(reading.signals, waiting, !memory_bound);
        g.memory_used = reading.memory_used;
        self.pump_all(now)
    }

    /// Expires sticky TTLs and dispatches what is due (a timer calls this).
    pub fn tick_all(&mut self, now: Time) -> Vec<Grant> {
        self.tick(now);
        self.pump_all(now)
    }

    /// Takes the dispatch record since the last call.
    pub fn drain_log(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.log)
    }

    /// The leases held.
    pub fn leases(&self) -> impl Iterator<Item = (u64, &Lease)> {
        self.leases.iter().map(|(&id, l)| (id, l))
    }

    /// One lease.
    #[must_use]
    pub fn lease(&self, id: u64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// The lease a container holds.
    #[must_use]
    pub fn lease_of(&self, key: &ContainerKey) -> Option<u64> {
        self.lease_of.get(key).copied()
    }

    /// Admissions waiting.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Starts let through without a lease, as shims reported them.
    #[must_use]
    pub fn fail_open_starts(&self) -> u64 {
        self.fail_open_starts
    }

    /// The GPUs.
    #[must_use]
    pub fn gpus(&self) -> Vec<GpuView> {
        (0..self.gpus.len())
            .map(|s| {
                let g = &self.gpus[s];
                GpuView {
                    info: g.info.clone(),
                    d: g.conc.d(),
                    limit: self.limits_of(s).1,
                    running: g.running,
                    reading: g.conc.last(),
                    memory_used: g.memory_used,
                    virtual_time: g.queue.virtual_time(),
                    queued: g.queue.queued(),
                    memory: self.memory_view(g.info.index).unwrap_or_default(),
                }
            })
            .collect()
    }
}

mod admit;
mod charge;
mod dispatch;
mod flows;
mod memory;
mod overtime;
mod record;
mod register;
mod release;
mod route;
mod share;
mod steal;

pub use memory::{DEFAULT_FOOTPRINT_MB, MemoryAdmission, MemoryView};
pub use overtime::DEFAULT_MAX_BURST_HOLD_S;
pub use record::Record;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
