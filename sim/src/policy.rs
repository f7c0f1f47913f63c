//! Queueing policies the simulator compares, all on the same executor (same GPUs, same D slots,
//! same memory model). A policy only orders work; the executor places it.
//!
//! | name | rule |
//! |---|---|
//! | `fcfs` | arrival order; an arrival joins the tail batch if it is the same function |
//! | `batch` | one batch per function; dispatch the function with the oldest head, all of it |
//! | `sjf` | shortest estimated time first (EWMA service + expected startup at arrival) |
//! | `paella` | per-function FIFOs; smallest head estimate, unless a deficit ≥ 25 (SRPT + fairness) |
//! | `mqfq-paper` | MQFQ-Sticky as published: T = 5 s, TTL = 1.5 × EWMA exec, D = 2 with the 95 % utilization gate, no charge correction, eager eviction |
//! | `mqfq-sticky` | ours, as `mqfqd` runs it: the node's admission core and pool (`node.rs`) — profile T and TTL, dynamic D per GPU, short-slot reserve, measured-charge correction, resident preference — with lazy eviction and prefetch on activation |
//! | `none` | no admission (the reference, not compared by default): every call starts at once; idle containers keep their memory until the keep-alive; a start past the GPU's memory fails or pages |

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::trace::Trace;
use scheduler_core::config::{ConfigError, Overrun, QueueConfig, Selection, StickyTtl};
use scheduler_core::ewma::Ewma;
use scheduler_core::node::admission::{GpuReading, Limits};
use scheduler_core::node::pool::Order;
use scheduler_core::node::{ContainerKey, Input, PooledEnd};
use scheduler_core::queue::{FlowEvent, FlowId, FlowState, MqfqQueue, Ticket};
use scheduler_core::tiers::Tier;
use scheduler_core::time::Time;

/// Every policy name, in the order `compare` prints them.
pub const POLICIES: [&str; 6] = [
    "fcfs",
    "batch",
    "sjf",
    "paella",
    "mqfq-paper",
    "mqfq-sticky",
];

/// The memory model a policy runs on: who admits work onto the GPUs and who moves container
/// memory. The executor has one path per model (`engine/node.rs`, `engine/budget.rs`,
/// `engine/physical.rs`) and parts nowhere else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryModel {
    /// `mqfqd`'s `Node`: its core grants (GPU, limit, order) and its pool's orders move memory;
    /// the executor runs what [`Policy::granted`] hands it and carries the orders out.
    Node,
    /// The executor's own slots and memory: each GPU's budget, idle containers evicted to the
    /// host by [`scheduler_core::tiers::TierPolicy`] under pressure and at their TTLs.
    Budget {
        /// How slots are granted.
        gate: Gate,
        /// What happens to a container's memory around its calls.
        style: MemoryStyle,
    },
    /// No admission and no memory manager (`none`): every call starts at once; idle containers
    /// keep their memory until the platform's keep-alive ends them; past the GPU's physical
    /// memory a start fails or pages (`--none-memory`).
    Physical,
}

/// How the executor grants slots under [`MemoryModel::Budget`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gate {
    /// D from the dynamic concurrency controller.
    Dynamic,
    /// Fixed D plus the published utilization gate (smoothed utilization estimate ≤ limit).
    Fixed {
        /// Fixed D.
        d: u32,
        /// Gate on the estimated utilization, in [0, 1].
        util_limit: f64,
    },
}

/// The published implementation's admission: fixed D = 2 and its utilization gate.
pub const PUBLISHED_GATE: Gate = Gate::Fixed {
    d: 2,
    util_limit: 0.95,
};

/// The naive comparison's admission: a fixed D of 2 and no utilization gate.
pub const NAIVE_GATE: Gate = Gate::Fixed {
    d: 2,
    util_limit: 1.0,
};

/// What happens to a container's memory around its calls under [`MemoryModel::Budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryStyle {
    /// Evict only under pressure; no prefetch.
    Lazy,
    /// Evict a flow's memory as soon as it is not Active; prefetch on activation.
    EagerPrefetch,
    /// Push a container's memory to the host after every use (the seed's baselines).
    EvictAfterUse,
    /// Keep nothing: a container is gone after its call, so every call starts cold (no warm
    /// pool: `--baselines naive`).
    ColdEveryCall,
}

/// What the executor tells a policy about memory.
#[derive(Debug)]
pub struct PoolView<'a> {
    /// Best tier of an idle container per function (Hot beats Warm beats Cold).
    pub best: &'a [Tier],
    /// Expected startup per function for its best tier, ms.
    pub startup_ms: &'a [f64],
}

/// A flow state change the executor acts on (prefetch, eviction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The function's flow turned Active.
    Activated(usize),
    /// The function's flow turned Inactive.
    Deactivated(usize),
}

/// What the executor does with the node of a policy under [`MemoryModel::Node`]: gives it inputs
/// as `mqfqd`'s shims and sampling loop would, and carries out its pool's orders.
pub trait NodeDriver {
    /// One input at `now`; its grants join the policy's queue, its orders wait for
    /// [`NodeDriver::take_orders`].
    fn step(&mut self, input: Input, now: Time);
    /// Invocation `inv`'s burst runs in the pooled container `container`: a pool hit.
    fn hit(&mut self, inv: usize, container: ContainerKey, now: Time);
    /// Invocation `inv`'s lease ended after `service_ms`, with what became of its container.
    fn release(
        &mut self,
        inv: usize,
        trace: &Trace,
        service_ms: f64,
        pooled: Option<PooledEnd>,
        now: Time,
    );
    /// The pool's orders not yet carried out.
    fn take_orders(&mut self) -> Vec<Order>;
}

/// A queueing policy.
pub trait Policy {
    /// Its name.
    fn name(&self) -> &'static str;
    /// An invocation arrived.
    fn arrive(&mut self, inv: usize, trace: &Trace, now: Time, view: &PoolView<'_>);
    /// The next batch to run on one slot (run back to back on one container), if any.
    /// `free_slots` is the most free slots any GPU has now.
    fn next(
        &mut self,
        trace: &Trace,
        now: Time,
        view: &PoolView<'_>,
        free_slots: u32,
    ) -> Option<Vec<usize>>;
    /// Under [`MemoryModel::Node`]: the next invocation granted, with its GPU.
    fn granted(&mut self) -> Option<(usize, usize)> {
        None
    }
    /// Under [`MemoryModel::Node`]: the limits in force on a GPU and the work waiting for it.
    fn node_limits(&self, _gpu: usize) -> Limits {
        Limits::default()
    }
    /// A sampling step: `(GPU, utilization, memory used in bytes)` for every GPU.
    fn sample(&mut self, _samples: &[GpuReading], _now: Time) {}
    /// An invocation finished after holding its slot for `service_ms`.
    fn complete(&mut self, inv: usize, trace: &Trace, service_ms: f64, now: Time);
    /// Invocations waiting.
    fn queued(&self) -> usize;
    /// Whether the function counts as active for memory decisions.
    fn active(&self, func: usize) -> bool;
    /// Time-driven work (sticky TTLs); returns flow signals.
    fn tick(&mut self, _now: Time) -> Vec<Signal> {
        Vec::new()
    }
    /// When `tick` next has work.
    fn next_timer(&self) -> Option<Time> {
        None
    }
    /// Residency of a function's memory changed; `switch_ms` is what serving it would cost in
    /// startup (0 when resident).
    fn set_resident(&mut self, _func: usize, _resident: bool, _switch_ms: f64) {}
    /// Under [`MemoryModel::Node`]: the node, whose pool's orders the executor carries out.
    fn node_mut(&mut self) -> Option<&mut dyn NodeDriver> {
        None
    }
    /// The memory model it runs on.
    fn model(&self) -> MemoryModel {
        MemoryModel::Budget {
            gate: Gate::Dynamic,
            style: MemoryStyle::Lazy,
        }
    }
    /// Flow snapshot for reports (MQFQ policies only).
    fn flow_state(&self, _func: usize) -> Option<FlowState> {
        None
    }
    /// Writes of each node's published state (multi-node runs); empty on one node.
    fn api_writes(&self) -> Vec<u64> {
        Vec::new()
    }
}

/// Per-function service estimates shared by the estimate-based baselines.
#[derive(Debug)]
struct Estimates {
    ewma: Vec<Ewma>,
    fallback_ms: f64,
}

impl Estimates {
    fn new(n: usize, fallback_ms: f64) -> Self {
        Estimates {
            ewma: vec![Ewma::new(0.1); n],
            fallback_ms,
        }
    }
    fn exec(&self, f: usize) -> f64 {
        self.ewma[f].get_or(self.fallback_ms)
    }
    fn observe(&mut self, f: usize, ms: f64) {
        self.ewma[f].observe(ms);
    }
}

/// First come, first served, with adjacent same-function arrivals coalesced into one batch.
#[derive(Debug, Default)]
pub struct Fcfs {
    batches: VecDeque<(usize, Vec<usize>)>,
    queued: usize,
    waiting: HashMap<usize, usize>,
}

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, _: Time, _: &PoolView<'_>) {
        let f = trace.invocations[inv].func;
        match self.batches.back_mut() {
            Some((bf, b)) if *bf == f => b.push(inv),
            _ => self.batches.push_back((f, vec![inv])),
        }
        self.queued += 1;
        *self.waiting.entry(f).or_default() += 1;
    }
    fn next(&mut self, _: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        let (f, b) = self.batches.pop_front()?;
        self.queued -= b.len();
        if let Some(w) = self.waiting.get_mut(&f) {
            *w -= b.len();
        }
        Some(b)
    }
    fn complete(&mut self, _: usize, _: &Trace, _: f64, _: Time) {}
    fn queued(&self) -> usize {
        self.queued
    }
    fn active(&self, func: usize) -> bool {
        self.waiting.get(&func).is_some_and(|w| *w > 0)
    }
}

/// No admission at all, what a node runs today with plain runc and the NVIDIA toolkit: every
/// call starts at once, in an idle container of its function or a new one; idle containers keep
/// their memory until the platform's keep-alive ends them; a start past the GPU's memory fails
/// or pages (`--none-memory`). A reference point, not a policy to run.
#[derive(Debug, Default)]
pub struct NoAdmission {
    waiting: VecDeque<usize>,
    per_function: HashMap<usize, usize>,
}

impl Policy for NoAdmission {
    fn name(&self) -> &'static str {
        "none"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, _: Time, _: &PoolView<'_>) {
        self.waiting.push_back(inv);
        *self
            .per_function
            .entry(trace.invocations[inv].func)
            .or_default() += 1;
    }
    fn next(&mut self, trace: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        let inv = self.waiting.pop_front()?;
        if let Some(n) = self.per_function.get_mut(&trace.invocations[inv].func) {
            *n -= 1;
        }
        Some(vec![inv])
    }
    fn complete(&mut self, _: usize, _: &Trace, _: f64, _: Time) {}
    fn queued(&self) -> usize {
        self.waiting.len()
    }
    fn active(&self, func: usize) -> bool {
        self.per_function.get(&func).is_some_and(|n| *n > 0)
    }
    fn model(&self) -> MemoryModel {
        MemoryModel::Physical
    }
}

/// One unbounded batch per function; the function whose head waited longest goes first, whole.
#[derive(Debug)]
pub struct OldestBatch {
    queues: Vec<VecDeque<usize>>,
    queued: usize,
}

impl OldestBatch {
    /// The policy over a trace of `n` functions.
    #[must_use]
    pub fn new(n: usize) -> Self {
        OldestBatch {
            queues: vec![VecDeque::new(); n],
            queued: 0,
        }
    }
}

impl Policy for OldestBatch {
    fn name(&self) -> &'static str {
        "batch"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, _: Time, _: &PoolView<'_>) {
        self.queues[trace.invocations[inv].func].push_back(inv);
        self.queued += 1;
    }
    fn next(&mut self, _: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        // Invocation indices are in arrival order, so the smallest head is the oldest.
        let f = (0..self.queues.len())
            .filter(|&f| !self.queues[f].is_empty())
            .min_by_key(|&f| self.queues[f][0])?;
        let b: Vec<usize> = self.queues[f].drain(..).collect();
        self.queued -= b.len();
        Some(b)
    }
    fn complete(&mut self, _: usize, _: &Trace, _: f64, _: Time) {}
    fn queued(&self) -> usize {
        self.queued
    }
    fn active(&self, func: usize) -> bool {
        !self.queues[func].is_empty()
    }
}

/// Total order on estimates (never NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Est(f64);
impl Eq for Est {}
impl PartialOrd for Est {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Est {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Shortest estimated job first, estimated at arrival (service EWMA + expected startup).
#[derive(Debug)]
pub struct Sjf {
    heap: BinaryHeap<Reverse<(Est, usize)>>,
    est: Estimates,
    waiting: Vec<usize>,
}

impl Sjf {
    /// The policy over a trace of `n` functions.
    #[must_use]
    pub fn new(n: usize) -> Self {
        Sjf {
            heap: BinaryHeap::new(),
            est: Estimates::new(n, 500.0),
            waiting: vec![0; n],
        }
    }
}

impl Policy for Sjf {
    fn name(&self) -> &'static str {
        "sjf"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, _: Time, view: &PoolView<'_>) {
        let f = trace.invocations[inv].func;
        let e = self.est.exec(f) + view.startup_ms[f];
        self.heap.push(Reverse((Est(e), inv)));
        self.waiting[f] += 1;
    }
    fn next(&mut self, trace: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        let Reverse((_, inv)) = self.heap.pop()?;
        self.waiting[trace.invocations[inv].func] -= 1;
        Some(vec![inv])
    }
    fn complete(&mut self, inv: usize, trace: &Trace, service_ms: f64, _: Time) {
        self.est.observe(trace.invocations[inv].func, service_ms);
    }
    fn queued(&self) -> usize {
        self.heap.len()
    }
    fn active(&self, func: usize) -> bool {
        self.waiting[func] > 0
    }
}

/// Paella-style SRPT with a deficit fairness threshold.
#[derive(Debug)]
pub struct Paella {
    queues: Vec<VecDeque<(usize, f64)>>,
    deficit: Vec<f64>,
    seen: Vec<bool>,
    n_seen: usize,
    est: Estimates,
    queued: usize,
}

/// Paella's deficit threshold.
const PAELLA_THRESHOLD: f64 = 25.0;

impl Paella {
    /// The policy over a trace of `n` functions.
    #[must_use]
    pub fn new(n: usize) -> Self {
        Paella {
            queues: vec![VecDeque::new(); n],
            deficit: vec![0.0; n],
            seen: vec![false; n],
            n_seen: 0,
            est: Estimates::new(n, 500.0),
            queued: 0,
        }
    }
}

impl Policy for Paella {
    fn name(&self) -> &'static str {
        "paella"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, _: Time, view: &PoolView<'_>) {
        let f = trace.invocations[inv].func;
        if !self.seen[f] {
            self.seen[f] = true;
            self.n_seen += 1;
        }
        let e = self.est.exec(f) + view.startup_ms[f];
        self.queues[f].push_back((inv, e));
        self.queued += 1;
    }
    fn next(&mut self, _: &Trace, _: Time, _: &PoolView<'_>, _: u32) -> Option<Vec<usize>> {
        let nonempty = (0..self.queues.len()).filter(|&f| !self.queues[f].is_empty());
        let starving = nonempty
            .clone()
            .find(|&f| self.deficit[f] >= PAELLA_THRESHOLD);
        let f = match starving {
            Some(f) => f,
            None => nonempty.min_by(|&a, &b| {
                self.queues[a][0]
                    .1
                    .total_cmp(&self.queues[b][0].1)
                    .then(self.queues[a][0].0.cmp(&self.queues[b][0].0))
            })?,
        };
        let (inv, _) = self.queues[f].pop_front()?;
        self.queued -= 1;
        #[expect(clippy::cast_precision_loss, reason = "a function count")]
        let share = 1.0 / self.n_seen.max(1) as f64;
        for g in 0..self.queues.len() {
            if g == f {
                self.deficit[g] -= 1.0 - share;
            } else if !self.queues[g].is_empty() {
                self.deficit[g] += share;
            }
        }
        Some(vec![inv])
    }
    fn complete(&mut self, inv: usize, trace: &Trace, service_ms: f64, _: Time) {
        self.est.observe(trace.invocations[inv].func, service_ms);
    }
    fn queued(&self) -> usize {
        self.queued
    }
    fn active(&self, func: usize) -> bool {
        !self.queues[func].is_empty()
    }
}

/// MQFQ-Sticky as published, over the shared [`MqfqQueue`] with the executor's slots (a
/// baseline: ours is `NodeMqfq` in `node.rs`, the node's own core).
#[derive(Debug)]
pub struct Mqfq {
    q: MqfqQueue<usize>,
    flows: Vec<FlowId>,
    by_flow: HashMap<FlowId, usize>,
    tickets: HashMap<usize, Ticket>,
}

impl Mqfq {
    fn with(trace: &Trace, cfg: QueueConfig) -> Result<Self, ConfigError> {
        let mut q = MqfqQueue::new(cfg)?;
        let mut flows = Vec::new();
        let mut by_flow = HashMap::new();
        for (i, f) in trace.functions.iter().enumerate() {
            let id = q.flow(&f.name);
            q.set_weight(id, f.weight).map_err(|_| ConfigError {
                knob: "weight",
                value: f.weight.to_string(),
                reason: "must be a finite number > 0",
            })?;
            flows.push(id);
            by_flow.insert(id, i);
        }
        Ok(Mqfq {
            q,
            flows,
            by_flow,
            tickets: HashMap::new(),
        })
    }

    /// As published: T = 5 s, TTL = 1.5 × EWMA exec, charge T/10 while unknown, never corrected,
    /// sticky selection without residency preference.
    ///
    /// # Errors
    /// A bad trace weight.
    pub fn paper(trace: &Trace) -> Result<Self, ConfigError> {
        let cfg = QueueConfig {
            overrun: Overrun::Fixed(5.0),
            ttl: StickyTtl::ExecMultiple(1.5),
            fallback_ttl_s: 2.0,
            fallback_charge_s: 0.5,
            ewma_alpha: 0.1,
            charge_correction: false,
            selection: Selection::Sticky,
            short_charge_s: 0.0,
            overtake_bound: 0.0,
        };
        Self::with(trace, cfg)
    }

    /// The queue, for inspection.
    #[must_use]
    pub fn queue(&self) -> &MqfqQueue<usize> {
        &self.q
    }
}

impl Policy for Mqfq {
    fn name(&self) -> &'static str {
        "mqfq-paper"
    }
    fn arrive(&mut self, inv: usize, trace: &Trace, now: Time, _: &PoolView<'_>) {
        let f = trace.invocations[inv].func;
        // Flows were created for every function of the trace, so this cannot fail.
        let _ = self.q.enqueue(self.flows[f], inv, now);
    }
    fn next(&mut self, _: &Trace, now: Time, _: &PoolView<'_>, free: u32) -> Option<Vec<usize>> {
        let d = self.q.dispatch_slot(now, free)?;
        self.tickets.insert(d.item, d.ticket);
        Some(vec![d.item])
    }
    fn complete(&mut self, inv: usize, _: &Trace, service_ms: f64, now: Time) {
        if let Some(t) = self.tickets.remove(&inv) {
            let _ = self.q.complete(&t, Some(service_ms / 1e3), now);
        }
    }
    fn queued(&self) -> usize {
        self.q.queued()
    }
    fn active(&self, func: usize) -> bool {
        matches!(self.q.state(self.flows[func]), Some(FlowState::Active))
    }
    fn tick(&mut self, now: Time) -> Vec<Signal> {
        self.q.tick(now);
        self.q
            .drain_events()
            .into_iter()
            .filter_map(|e| match e {
                FlowEvent::Activated(id) => self.by_flow.get(&id).map(|&f| Signal::Activated(f)),
                FlowEvent::Deactivated(id) => {
                    self.by_flow.get(&id).map(|&f| Signal::Deactivated(f))
                }
            })
            .collect()
    }
    fn next_timer(&self) -> Option<Time> {
        self.q.next_expiry()
    }
    fn set_resident(&mut self, func: usize, resident: bool, switch_ms: f64) {
        let _ = self
            .q
            .set_residency(self.flows[func], resident, switch_ms.max(0.0) / 1e3);
    }
    fn model(&self) -> MemoryModel {
        MemoryModel::Budget {
            gate: PUBLISHED_GATE,
            style: MemoryStyle::EagerPrefetch,
        }
    }
    fn flow_state(&self, func: usize) -> Option<FlowState> {
        self.q.state(self.flows[func])
    }
}
