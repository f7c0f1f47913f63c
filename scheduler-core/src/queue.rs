//! The MQFQ-Sticky queue: one flow per function, virtual time, over-run threshold T, sticky TTL.
//!
//! # Tags and virtual time
//! Each flow keeps the start tag `S` of its head invocation and the finish tag `F` of the last one
//! it was charged for. When an empty flow gets work, `S = max(V, F)`; dispatching the head charges
//! it `c / w` (c = the function's EWMA service time, w = the flow's weight), so `F = S + c / w`,
//! and the next head starts at that `F`. Tags are assigned lazily at dispatch, which is equivalent
//! to assigning them at enqueue (a backlogged flow's `F` is never below `V`) and lets the charge
//! use the freshest estimate.
//!
//! The global virtual time `V` is the minimum `S` over backlogged flows, read from an ordered set
//! keyed by `S` (O(log n) per change, no scan). `V` never decreases: new tags start at `V` or
//! later, and corrections are clamped at `V`. When nothing is backlogged `V` keeps its value.
//!
//! # Eligibility and selection
//! A backlogged flow is eligible while `S − V ≤ T` (else it is Throttled). Among eligible flows the
//! dispatcher keeps serving the last-served (sticky) flow, then prefers flows whose memory is
//! resident on the GPU (kept in a second ordered set), then the lowest `S`. The lowest-`S` flow is
//! always eligible, so dispatch is O(log n) and never scans. Before all of these, the overtake
//! bound (`overtake`) serves an eligible flow whose head has waited past its due; that walks only
//! the flows whose head is overdue.
//!
//! # Fairness
//! With equal weights and every flow backlogged, the service two flows have been charged differs by
//! at most `T` plus one charge, and the service they have received by at most `T + D × c_max` while
//! up to `D` invocations run with estimated charges. At completion the flow is re-charged with the
//! measured service (`charge_correction`), so cold starts, restores and co-run slowdown are paid by
//! the flow that caused them rather than by everyone.
//!
//! # Stickiness
//! A flow whose queue drains stays Active for its TTL after its last service (anticipation: its
//! container and memory stay resident), then turns Inactive. The queue never holds a slot for an
//! anticipated arrival; the TTL decides residency and events for the pool, and (in the node's
//! memory admission) that a resident lingering flow's memory is kept from another flow's second
//! lease on the GPU, never from a first ([`MqfqQueue::keeps_room`]).

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;

use crate::config::{ConfigError, Overrun, QueueConfig, Selection, StickyTtl};
use crate::ewma::Ewma;
use crate::time::Time;

/// Index of a flow in its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FlowId(pub u32);

impl FlowId {
    fn ix(self) -> usize {
        self.0 as usize
    }
}

/// A virtual-time value with a total order (tags are always finite).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Vt(f64);

impl Eq for Vt {}

impl PartialOrd for Vt {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Vt {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A backlogged flow's place in an ordered set: its tag, its credit (ties), its index.
type Tag = (Vt, Vt, FlowId);

/// Hasher for ticket ids: they are sequential integers chosen by the queue itself (no hostile
/// input), so one multiply is enough and saves SipHash on the hot path.
#[derive(Debug, Default, Clone, Copy)]
struct TicketHasher(u64);

impl Hasher for TicketHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Outstanding tickets: flow, estimated charge, and the effective weight it was charged at.
type TicketMap = HashMap<u64, (FlowId, f64, f64), BuildHasherDefault<TicketHasher>>;

/// The state of a flow as the design names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowState {
    /// Backlogged and within T of V, running, or drained but within its sticky TTL.
    Active,
    /// Backlogged but more than T ahead of V.
    Throttled,
    /// Nothing queued, nothing running, TTL expired: no residency promised.
    Inactive,
}

/// Where a flow is in its life cycle. `Throttled` is not a phase: it depends on V and is derived
/// on demand, so a moving V never needs to touch every flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Inactive,
    /// Invocations queued (some may also be running).
    Backlogged,
    /// Queue empty, invocations running.
    Running,
    /// Queue empty, nothing running, sticky until `until`.
    Lingering {
        until: Time,
    },
}

/// A transition the pool manager acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FlowEvent {
    /// Inactive → Active: prefetch the flow's memory.
    Activated(FlowId),
    /// Active → Inactive (TTL expired): its memory may be evicted first.
    Deactivated(FlowId),
}

/// Errors of the queue API.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueError {
    /// `complete` with a ticket that is not outstanding (already completed, or from another queue).
    #[error("ticket {0} is not outstanding")]
    UnknownTicket(u64),
    /// A flow id that this queue never handed out.
    #[error("unknown flow {0:?}")]
    UnknownFlow(FlowId),
    /// A bad weight or charge.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Proof of a dispatch; hand it back to [`MqfqQueue::complete`] exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ticket {
    /// Unique per queue.
    pub id: u64,
    /// The flow served.
    pub flow: FlowId,
    /// Virtual start tag of the invocation.
    pub start: f64,
    /// Virtual finish tag (start + charge / weight).
    pub finish: f64,
    /// The estimated charge, in seconds.
    pub charge: f64,
    /// V at the moment of dispatch.
    pub v: f64,
}

/// An invocation taken off the queue.
#[derive(Debug)]
pub struct Dispatched<T> {
    /// What to hand back at completion.
    pub ticket: Ticket,
    /// The caller's item.
    pub item: T,
    /// When it was enqueued.
    pub enqueued_at: Time,
    /// It was served ahead of the fair order because the work dispatched since it arrived had
    /// passed its overtake bound (see [`QueueConfig::overtake_bound`]).
    pub overdue: bool,
}

#[derive(Debug)]
struct Pending<T> {
    item: T,
    at: Time,
    /// Arrival order across flows (FIFO selection).
    seq: u64,
    /// Its estimated work (the flow's charge when it was queued), seconds.
    work: f64,
    /// The dispatched-work count past which it is overdue (see [`overtake`]).
    due: f64,
}

#[derive(Debug)]
struct Flow<T> {
    key: String,
    weight: f64,
    pending: VecDeque<Pending<T>>,
    start: f64,
    finish: f64,
    /// Breaks ties between equal start tags: the finish tag the flow had when its start was
    /// set (below its start when it came back idle and took V). Among flows at the same start,
    /// the one served least recently goes first, whatever its index.
    credit: f64,
    phase: Phase,
    in_flight: u32,
    last_service: Option<Time>,
    last_arrival: Option<Time>,
    service: Ewma,
    iat: Ewma,
    charge_hint: Option<f64>,
    resident: bool,
    switch_cost: f64,
    gpu_time: f64,
    dispatched: u64,
    completed: u64,
    /// The tenant it belongs to (second level of fairness), if any.
    tenant: Option<String>,
    /// While Lingering, until when it still counts as short for the reserve and the memory room
    /// (see [`linger`]); `None` once its claim ended, and in every other phase.
    claim_until: Option<Time>,
    /// An expired flow's slot, free for reuse.
    vacant: bool,
}

/// The node's MQFQ-Sticky queue. `T` is the caller's item (an invocation, an admission request).
#[derive(Debug)]
pub struct MqfqQueue<T> {
    cfg: QueueConfig,
    flows: Vec<Flow<T>>,
    by_key: HashMap<String, FlowId>,
    long_backlog: BTreeSet<Tag>,
    resident_backlog: BTreeSet<Tag>,
    penalized: BTreeSet<Tag>,
    short_backlog: BTreeSet<Tag>,
    /// Backlogged flows by their head's arrival order (kept under FIFO selection only).
    fifo: BTreeSet<(u64, FlowId)>,
    /// Backlogged flows by when their head is overdue (kept with an overtake bound only).
    overdue: BTreeSet<(Vt, FlowId)>,
    /// Σ estimated work of every invocation dispatched, seconds.
    served_work: f64,
    /// Σ estimated work of the invocations queued, seconds.
    queued_work: f64,
    next_seq: u64,
    active_short: usize,
    expiries: BTreeSet<(Time, FlowId)>,
    /// When lingering flows' claims end, one entry per flow with a `claim_until`.
    claims: BTreeSet<(Time, FlowId)>,
    v: f64,
    sticky: Option<FlowId>,
    tau: Ewma,
    outstanding: TicketMap,
    next_ticket: u64,
    events: Vec<FlowEvent>,
    queued: usize,
    /// Tenants by name (see the `tenants` module).
    tenants: HashMap<String, tenants::Tenant>,
    /// Tenants with at least one backlogged flow.
    active_tenants: BTreeSet<String>,
    /// Σ weight of backlogged flows without a tenant, and how many there are.
    tenantless_w: f64,
    tenantless_n: usize,
    /// Slots of expired flows.
    free: Vec<FlowId>,
}

fn check_weight(w: f64) -> Result<(), ConfigError> {
    if w.is_finite() && w > 0.0 {
        Ok(())
    } else {
        Err(ConfigError {
            knob: "weight",
            value: w.to_string(),
            reason: "must be a finite number > 0",
        })
    }
}

impl<T> MqfqQueue<T> {
    /// A queue with validated knobs.
    ///
    /// # Errors
    /// [`ConfigError`] naming the bad knob.
    pub fn new(cfg: QueueConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let alpha = cfg.ewma_alpha;
        Ok(MqfqQueue {
            cfg,
            flows: Vec::new(),
            by_key: HashMap::new(),
            long_backlog: BTreeSet::new(),
            resident_backlog: BTreeSet::new(),
            penalized: BTreeSet::new(),
            short_backlog: BTreeSet::new(),
            fifo: BTreeSet::new(),
            overdue: BTreeSet::new(),
            served_work: 0.0,
            queued_work: 0.0,
            next_seq: 0,
            active_short: 0,
            expiries: BTreeSet::new(),
            claims: BTreeSet::new(),
            v: 0.0,
            sticky: None,
            tau: Ewma::new(alpha),
            outstanding: TicketMap::default(),
            next_ticket: 0,
            events: Vec::new(),
            queued: 0,
            tenants: HashMap::new(),
            active_tenants: BTreeSet::new(),
            tenantless_w: 0.0,
            tenantless_n: 0,
            free: Vec::new(),
        })
    }

    /// The knobs in force.
    #[must_use]
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// The flow for a function key, created (Inactive, weight 1, no tenant) on first use.
    ///
    /// # Panics
    /// Never in practice: panics only past 2^32 flows.
    pub fn flow(&mut self, key: &str) -> FlowId {
        if let Some(&id) = self.by_key.get(key) {
            return id;
        }
        let alpha = self.cfg.ewma_alpha;
        let fresh = Flow {
            key: key.to_owned(),
            weight: 1.0,
            pending: VecDeque::new(),
            start: self.v,
            finish: self.v,
            credit: self.v,
            phase: Phase::Inactive,
            in_flight: 0,
            last_service: None,
            last_arrival: None,
            service: Ewma::new(alpha),
            iat: Ewma::new(alpha),
            charge_hint: None,
            resident: false,
            switch_cost: 0.0,
            gpu_time: 0.0,
            dispatched: 0,
            completed: 0,
            tenant: None,
            claim_until: None,
            vacant: false,
        };
        let id = if let Some(id) = self.free.pop() {
            self.flows[id.ix()] = fresh;
            id
        } else {
            let id = FlowId(u32::try_from(self.flows.len()).expect("fewer than 2^32 flows"));
            self.flows.push(fresh);
            id
        };
        self.by_key.insert(key.to_owned(), id);
        id
    }

    /// The flow of a key, if it exists.
    #[must_use]
    pub fn lookup(&self, key: &str) -> Option<FlowId> {
        self.by_key.get(key).copied()
    }

    /// Number of flows in the queue (expired ones not counted).
    #[must_use]
    pub fn flow_count(&self) -> usize {
        self.by_key.len()
    }

    fn get(&self, id: FlowId) -> Result<&Flow<T>, QueueError> {
        self.flows
            .get(id.ix())
            .filter(|f| !f.vacant)
            .ok_or(QueueError::UnknownFlow(id))
    }

    /// Sets a flow's weight (affects charges from now on).
    ///
    /// # Errors
    /// Unknown flow, or a weight that is not finite and > 0.
    pub fn set_weight(&mut self, id: FlowId, weight: f64) -> Result<(), QueueError> {
        check_weight(weight)?;
        let backlogged = self.get(id)?.phase == Phase::Backlogged;
        if backlogged {
            self.index_remove(id);
            self.leave(id);
        }
        self.flows[id.ix()].weight = weight;
        if backlogged {
            self.join(id);
            self.index_insert(id);
        }
        Ok(())
    }

    /// Pins a flow's charge to a known service time (an operator's "service average"); `None`
    /// goes back to the measured EWMA.
    ///
    /// # Errors
    /// Unknown flow, or a charge that is not finite and > 0.
    pub fn set_charge_hint(&mut self, id: FlowId, secs: Option<f64>) -> Result<(), QueueError> {
        if let Some(s) = secs
            && !(s.is_finite() && s > 0.0)
        {
            return Err(ConfigError {
                knob: "charge",
                value: s.to_string(),
                reason: "must be a finite number > 0",
            }
            .into());
        }
        let backlogged = self.get(id)?.phase == Phase::Backlogged;
        let was_short = self.counts_short(id);
        if backlogged {
            self.index_remove(id);
        }
        self.flows[id.ix()].charge_hint = secs;
        if backlogged {
            self.index_insert(id);
        }
        self.recount(id, was_short);
        Ok(())
    }

    /// Tells the queue whether a flow's memory is resident on a GPU (so selection can prefer it),
    /// and what serving it costs when it is not (restore or cold start, seconds of service).
    ///
    /// # Errors
    /// Unknown flow, or a cost that is not finite and >= 0.
    pub fn set_residency(
        &mut self,
        id: FlowId,
        resident: bool,
        switch_cost_s: f64,
    ) -> Result<(), QueueError> {
        if !(switch_cost_s.is_finite() && switch_cost_s >= 0.0) {
            return Err(ConfigError {
                knob: "switch_cost",
                value: switch_cost_s.to_string(),
                reason: "must be a finite number >= 0",
            }
            .into());
        }
        let f = self.get(id)?;
        if f.resident == resident && f.switch_cost == switch_cost_s {
            return Ok(());
        }
        let backlogged = f.phase == Phase::Backlogged;
        if backlogged {
            self.index_remove(id);
        }
        let f = &mut self.flows[id.ix()];
        f.resident = resident;
        f.switch_cost = switch_cost_s;
        if backlogged {
            self.index_insert(id);
        }
        Ok(())
    }

    /// [`set_residency`](Self::set_residency) with no switch cost.
    ///
    /// # Errors
    /// Unknown flow.
    pub fn set_resident(&mut self, id: FlowId, resident: bool) -> Result<(), QueueError> {
        self.set_residency(id, resident, 0.0)
    }

    /// Global virtual time V.
    #[must_use]
    pub fn virtual_time(&self) -> f64 {
        self.v
    }

    /// The over-run threshold T in force now.
    #[must_use]
    pub fn overrun(&self) -> f64 {
        match self.cfg.overrun {
            Overrun::Fixed(t) => t,
            Overrun::TauMultiple(k) => k * self.tau.get_or(self.cfg.fallback_charge_s),
        }
    }

    /// Node-wide EWMA of measured service time (τ_avg), if any completion was measured.
    #[must_use]
    pub fn tau_avg(&self) -> Option<f64> {
        self.tau.get()
    }

    /// Invocations queued, all flows.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Invocations dispatched and not yet completed, all flows.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    /// The flow's sticky TTL in seconds, by the configured rule.
    #[must_use]
    pub fn ttl_of(&self, id: FlowId) -> f64 {
        let Some(f) = self.flows.get(id.ix()) else {
            return self.cfg.fallback_ttl_s;
        };
        let fb = self.cfg.fallback_ttl_s;
        match self.cfg.ttl {
            StickyTtl::Fixed(t) => t,
            StickyTtl::IatMultiple(k) => f.iat.get().map_or(fb, |x| k * x),
            StickyTtl::ExecMultiple(k) => f.service.get().map_or(fb, |x| k * x),
        }
    }

    fn charge_of(&self, f: &Flow<T>) -> f64 {
        f.charge_hint
            .or(f.service.get().filter(|c| *c > 0.0))
            .unwrap_or(self.cfg.fallback_charge_s)
    }

    /// The flow [`dispatch`](Self::dispatch) would serve now, without serving it.
    #[must_use]
    pub fn peek(&self) -> Option<FlowId> {
        self.fitting(u32::MAX, |_| true)
    }

    /// Takes the next invocation, by MQFQ-Sticky's rule, at time `now`. The caller has already
    /// checked that a concurrency slot is free.
    pub fn dispatch(&mut self, now: Time) -> Option<Dispatched<T>> {
        self.dispatch_slot(now, u32::MAX)
    }

    /// Like [`dispatch`](Self::dispatch), told how many slots are free on the GPU under its
    /// concurrency limit. `0` means only the short-slot reserve's slot is free (the dispatcher
    /// grants it above the limit while a short flow is Active, see
    /// [`QueueConfig::short_charge_s`]): it goes to the lowest-`S` eligible short flow, or to
    /// nobody. Any other count serves the longest-overdue eligible flow under the overtake bound,
    /// else the flow the fair order picks ([`peek`](Self::peek) names it), short or long, so a
    /// slot under the limit never stays empty while work is queued (work conservation).
    pub fn dispatch_slot(&mut self, now: Time, free_slots: u32) -> Option<Dispatched<T>> {
        self.dispatch_slot_fitting(now, free_slots, |_| true)
    }

    /// Serves the head of backlogged flow `id`; `overdue`: the overtake bound chose it.
    fn dispatch_flow(&mut self, now: Time, id: FlowId, overdue: bool) -> Option<Dispatched<T>> {
        let charge = self.charge_of(&self.flows[id.ix()]);
        let was_short = self.counts_short(id);
        let v = self.v;
        let eff = self.effective(id);
        self.index_remove(id);
        let f = &mut self.flows[id.ix()];
        let head = f.pending.pop_front()?;
        self.queued -= 1;
        self.queued_work = overtake::unqueued(self.queued_work, self.queued, head.work);
        // In the units its due was set in: the estimate it was queued with.
        self.served_work += head.work;
        let start = f.start;
        let finish = start + charge / eff;
        f.finish = finish;
        f.in_flight += 1;
        f.dispatched += 1;
        f.last_service = Some(now);
        let more = !f.pending.is_empty();
        if more {
            f.start = finish;
            f.credit = finish;
        } else {
            f.phase = Phase::Running;
        }
        if more {
            self.index_insert(id);
        } else {
            self.leave(id);
        }
        self.update_v();
        self.recount(id, was_short);
        self.sticky = Some(id);
        let ticket = Ticket {
            id: self.next_ticket,
            flow: id,
            start,
            finish,
            charge,
            v,
        };
        self.next_ticket += 1;
        self.outstanding.insert(ticket.id, (id, charge, eff));
        Some(Dispatched {
            ticket,
            item: head.item,
            enqueued_at: head.at,
            overdue,
        })
    }

    /// Takes the Activated / Deactivated events since the last call, in order.
    pub fn drain_events(&mut self) -> Vec<FlowEvent> {
        std::mem::take(&mut self.events)
    }

    /// The derived state of a flow.
    #[must_use]
    pub fn state(&self, id: FlowId) -> Option<FlowState> {
        let f = self.flows.get(id.ix()).filter(|f| !f.vacant)?;
        Some(match f.phase {
            Phase::Inactive => FlowState::Inactive,
            Phase::Backlogged
                if self.cfg.selection != Selection::Fifo && f.start - self.v > self.overrun() =>
            {
                FlowState::Throttled
            }
            _ => FlowState::Active,
        })
    }

    /// Whether memory admission keeps room for a flow against another flow's second lease on
    /// this GPU: it is Active (not Inactive, not Throttled: a flow held back by the over-run
    /// threshold would keep room it cannot use) and its memory is resident here (the pool said
    /// an idle container of it is Hot), or it has calls waiting (its next one needs its memory
    /// now).
    #[must_use]
    pub fn keeps_room(&self, id: FlowId) -> bool {
        self.flows
            .get(id.ix())
            .is_some_and(|f| self.claims_memory(f))
    }

    /// Whether a flow's memory is resident here, as the pool said.
    #[must_use]
    pub fn is_resident(&self, id: FlowId) -> bool {
        self.flows
            .get(id.ix())
            .is_some_and(|f| !f.vacant && f.resident)
    }

    /// The flows memory admission keeps room for (see [`MqfqQueue::keeps_room`]).
    pub fn room_keepers(&self) -> impl Iterator<Item = FlowId> + '_ {
        self.flows
            .iter()
            .zip(0u32..)
            .filter(|(f, _)| self.claims_memory(f))
            .map(|(_, i)| FlowId(i))
    }

    fn claims_memory(&self, f: &Flow<T>) -> bool {
        let throttled = f.phase == Phase::Backlogged
            && self.cfg.selection != Selection::Fifo
            && f.start - self.v > self.overrun();
        !f.vacant
            && !throttled
            && (f.phase == Phase::Backlogged || (f.resident && f.phase != Phase::Inactive))
    }

    /// The function key of a flow.
    #[must_use]
    pub fn key(&self, id: FlowId) -> Option<&str> {
        self.flows
            .get(id.ix())
            .filter(|f| !f.vacant)
            .map(|f| f.key.as_str())
    }
}

mod complete;
mod enqueue;
mod fit;
mod index;
mod linger;
#[cfg(test)]
pub(crate) use linger::CLAIM_IATS;
mod outside;
mod overtake;
mod short;
mod snapshot;
mod tenants;

pub use snapshot::{FlowSnapshot, WorkAhead};

#[cfg(test)]
mod tests;
