//! GPU memory as a resource the queue admits. A slot is not enough to run: a lease whose
//! function's memory does not fit beside the leases already held on its GPU would have the pool
//! evict memory that running work needs, and the PCIe link thrashes (a policy that grants more
//! co-runners than memory holds loses to FCFS by orders of magnitude). So each flow has a
//! footprint — what the pool measured of its containers, else a configured default — and a lease
//! is granted only where the footprints of the GPU's held leases plus its own fit its budget
//! (capacity less the pool's headroom), keeping room beside a long flow for the largest active
//! short flow — one whose footprint is at most a quarter of the budget: a short function that
//! big would hold a large part of the GPU for calls that seldom come (in the random sweep that
//! room was what most of the worst draws lost to; docs/PERFORMANCE.md §1a′). A GPU with nothing
//! held always takes the next lease (a function larger than the budget still runs, alone).
//!
//! Idle containers' memory does not count against a flow's first lease: the pool evicts them.
//! It does against a flow that already holds a lease on the GPU (a burst, in overtime or not, or
//! a Resume; not a Start, which lasts as long as its container): its next one must also leave
//! one footprint for every other flow whose memory the GPU should keep — an Active flow (not
//! Throttled: it could not use the room) whose memory is resident there (an idle container of it
//! is Hot on that GPU), or a flow with calls waiting there (its next call needs its memory now) —
//! but not for a flow that holds a lease there itself with nothing resident (its next call fits
//! in what its own lease frees; kept, two such flows held each other to one lease), the short
//! flow whose room is kept counted once. Growing one flow's concurrency otherwise evicted the
//! containers the other flows were about to use, each came back over PCIe at its next call, and
//! flows waiting for memory waited longer: fair queueing keeps every backlogged flow's working
//! set in play where FCFS serves one burst after another, and in the random sweep most draws
//! moved more PCIe bytes than FCFS (docs/PERFORMANCE.md §1a⁵; keeping room for every Active
//! flow, resident or not, held a flood to one lease and left its GPU 3 points less busy than
//! FCFS's). A first lease is never held back for the others' room, so every flow keeps at least
//! one lease's progress; late binding never moves a call on a looser test than its grant's.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Core, CoreError, Grant, Kind, invalid};
use crate::FlowId;
use crate::Time;
use crate::config::{ConfigError, QueueKnobs};

/// The largest share of a GPU's budget a short flow's footprint may have and still get room kept
/// for it beside long flows.
const SHORT_ROOM_MAX_SHARE: f64 = 0.25;

/// Functions whose footprints are kept; past it, a new function is charged the default.
const MAX_FOOTPRINTS: usize = 4096;

/// What a function is charged before the pool has measured it, MiB (`default_footprint_mb`).
pub const DEFAULT_FOOTPRINT_MB: u64 = 4096;
/// The largest `default_footprint_mb` accepted (1 TiB).
const MAX_FOOTPRINT_MB: u64 = 1 << 20;

/// The memory half of admission (`[queue]` `memory_admission`, `default_footprint_mb`, and the
/// pool's `gpu_headroom`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryAdmission {
    /// Fraction of each GPU's memory kept free (the pool's headroom), in [0, 1).
    pub headroom: f64,
    /// What a function the pool has not measured yet is charged, bytes (> 0).
    pub default_footprint: u64,
}

/// One GPU's memory as admission sees it (`mqfqctl status`, metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryView {
    /// Capacity less headroom, bytes (0: memory admission off or capacity unknown).
    pub budget: u64,
    /// Footprints of the leases held.
    pub held: u64,
    /// Room kept for the largest active short flow.
    pub reserved: u64,
    /// Footprints of the flows whose memory is kept here (see the module docs): kept from a flow
    /// that already holds a lease here (less its own, the short room's flow counted once), not
    /// from a first lease; an upper bound of what any one lease is weighed against (it may count
    /// the flow `reserved` is kept for).
    pub kept: u64,
    /// Whether work waits that only memory keeps from a free slot.
    pub blocked: bool,
}

impl MemoryAdmission {
    /// Memory admission as `[queue]`'s knobs ask (on unless `memory_admission = false`,
    /// charging `default_footprint_mb`, 4096 where not given), within capacity less `headroom`
    /// (the pool's): how `mqfqd` and the simulator both read them.
    ///
    /// # Errors
    /// A `default_footprint_mb` outside 1 MiB – 1 TiB (or a headroom outside [0, 1)).
    pub fn from_knobs(knobs: &QueueKnobs, headroom: f64) -> Result<Option<Self>, ConfigError> {
        if knobs.memory_admission == Some(false) {
            return Ok(None);
        }
        let mb = knobs.default_footprint_mb.unwrap_or(DEFAULT_FOOTPRINT_MB);
        MemoryAdmission::new(headroom, mb)
            .map(Some)
            .map_err(|e| match e {
                CoreError::Invalid {
                    field: "headroom", ..
                } => ConfigError::new("pool.headroom", headroom, "must be in [0, 1)"),
                _ => ConfigError::new("queue.default_footprint_mb", mb, "must be 1 to 1048576 MiB"),
            })
    }

    /// The knobs from the pool's headroom and a default footprint in MiB.
    ///
    /// # Errors
    /// A headroom outside [0, 1) or a default footprint outside 1 MiB – 1 TiB, named.
    pub fn new(headroom: f64, default_footprint_mb: u64) -> Result<Self, CoreError> {
        if !(headroom.is_finite() && (0.0..1.0).contains(&headroom)) {
            return Err(invalid("headroom", format!("{headroom} must be in [0, 1)")));
        }
        if !(1..=MAX_FOOTPRINT_MB).contains(&default_footprint_mb) {
            return Err(invalid(
                "default_footprint_mb",
                format!("{default_footprint_mb} must be 1 to {MAX_FOOTPRINT_MB} MiB"),
            ));
        }
        Ok(MemoryAdmission {
            headroom,
            default_footprint: default_footprint_mb << 20,
        })
    }
}

impl Core {
    /// Turns memory admission on with these knobs.
    ///
    /// # Errors
    /// A headroom outside [0, 1) or a zero default footprint, named.
    pub fn set_memory(&mut self, m: MemoryAdmission) -> Result<(), CoreError> {
        let checked = MemoryAdmission::new(m.headroom, 1)?;
        if m.default_footprint == 0 {
            return Err(invalid("default_footprint_mb", "must be > 0"));
        }
        self.memory = Some(MemoryAdmission {
            default_footprint: m.default_footprint,
            ..checked
        });
        Ok(())
    }

    /// What `function`'s containers hold on a GPU, bytes, as the pool measured it (0: unknown,
    /// ignored). Leases already held keep what they were charged. Any change may let waiting
    /// work fit — a smaller footprint directly, a larger one by taking a short flow past the
    /// share that has room kept for it: returns what that granted.
    pub fn set_footprint(&mut self, function: &str, bytes: u64, now: Time) -> Vec<Grant> {
        if bytes == 0 {
            return Vec::new();
        }
        if !self.footprints.contains_key(function) && self.footprints.len() >= MAX_FOOTPRINTS {
            return Vec::new();
        }
        let before = self.footprint(function);
        self.footprints.insert(function.to_owned(), bytes);
        if bytes != before {
            self.tick_all(now)
        } else {
            Vec::new()
        }
    }

    /// The footprints known, by function.
    #[must_use]
    pub fn footprints(&self) -> &BTreeMap<String, u64> {
        &self.footprints
    }

    /// What a lease of `function` is charged.
    pub(super) fn footprint(&self, function: &str) -> u64 {
        match (self.footprints.get(function), self.memory) {
            (Some(&b), _) => b,
            (None, Some(m)) => m.default_footprint,
            (None, None) => 0,
        }
    }

    /// A GPU's budget, bytes; 0 when memory admission is off or the capacity is unknown.
    fn budget(&self, slot: usize) -> u64 {
        let Some(m) = self.memory else { return 0 };
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "capacity times a share in (0, 1]: finite, >= 0, fits u64"
        )]
        #[expect(clippy::cast_precision_loss, reason = "GPU bytes: far below 2^52")]
        let b = (self.gpus[slot].info.memory_total as f64 * (1.0 - m.headroom)) as u64;
        b
    }

    /// Footprints of the leases held on a GPU.
    fn held(&self, slot: usize) -> u64 {
        let index = self.gpus[slot].info.index;
        self.leases
            .values()
            .filter(|l| l.gpu == index)
            .fold(0u64, |a, l| a.saturating_add(l.footprint))
    }

    /// The room a long flow leaves: the largest footprint among the GPU's active short flows,
    /// of those no larger than [`SHORT_ROOM_MAX_SHARE`] of its budget.
    fn short_room(&self, slot: usize) -> u64 {
        self.short_room_of(slot).0
    }

    /// [`Core::short_room`] and the short flow it is kept for.
    fn short_room_of(&self, slot: usize) -> (u64, Option<FlowId>) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a quarter of a budget: finite, >= 0, fits u64"
        )]
        #[expect(clippy::cast_precision_loss, reason = "GPU bytes: far below 2^52")]
        let cap = (self.budget(slot) as f64 * SHORT_ROOM_MAX_SHARE) as u64;
        let q = &self.gpus[slot].queue;
        q.active_short_ids()
            .filter_map(|id| q.key(id).map(|k| (self.footprint(k), id)))
            .filter(|&(b, _)| b <= cap)
            .max()
            .map_or((0, None), |(b, id)| (b, Some(id)))
    }

    /// What a lease on GPU `slot` is weighed against (see [`Beside`]); `None` when anything
    /// fits (memory admission off, capacity unknown, or nothing running there).
    fn beside(&self, slot: usize) -> Option<Beside<'_>> {
        let budget = self.budget(slot);
        if budget == 0 || self.gpus[slot].running == 0 {
            return None;
        }
        let (room, room_flow) = self.short_room_of(slot);
        Some(Beside {
            core: self,
            slot,
            budget,
            held: self.held(slot),
            room,
            room_flow,
            // A Start lease lasts as long as its container: it does not make its function's
            // other calls second leases (they would wait on the others' room for as long as it
            // lives). A burst in overtime does; it holds its memory, and its function gets no
            // slot it frees either (`overtime`).
            holding: self.holding(slot),
            kept: OnceCell::new(),
        })
    }

    /// Whether a lease of `flow` fits on GPU `slot` now (see the module docs).
    pub(super) fn fit_test(&self, slot: usize) -> impl Fn(FlowId) -> bool + '_ {
        let beside = self.beside(slot);
        move |flow| {
            beside.as_ref().is_none_or(|b| {
                let q = &self.gpus[slot].queue;
                q.key(flow)
                    .is_none_or(|function| b.fits(function, !q.is_short_flow(flow)))
            })
        }
    }

    /// Whether an admission of `function` moved to GPU `slot` fits its memory beside the leases
    /// held there, keeping the room of its active short flows (late binding; see `steal`): never
    /// looser than the test its grant there will pass (stricter for a short flow, whose grant
    /// keeps no room for short flows), so a move is never left waiting beside a free slot.
    pub(super) fn room_for(&self, slot: usize) -> impl Fn(&str) -> bool + '_ {
        let beside = self.beside(slot);
        move |function| beside.as_ref().is_none_or(|b| b.fits(function, true))
    }

    /// Whether waiting work could take a slot on GPU `slot` as far as memory goes (`free_slots`
    /// as [`crate::MqfqQueue::dispatch_slot`] takes it; a slot an overtime lease freed only for
    /// work that may take it, see `overtime`).
    pub(super) fn fits_waiting(&self, slot: usize, free_slots: u32) -> bool {
        let (fits, over) = (self.fit_test(slot), self.overtime_test(slot));
        self.gpus[slot]
            .queue
            .fitting(free_slots, |f| fits(f) && over(f))
            .is_some()
    }

    /// Footprints of the flows GPU `slot` keeps room for against a second lease, less those of
    /// flows holding a lease there (`holding`) with nothing resident there: such a flow's next
    /// call fits in what its own lease frees, and room kept for it would hold back every flow
    /// that holds a lease alike (its own footprint cancels out of each one's test).
    fn kept_bytes(&self, slot: usize, holding: &BTreeSet<&str>) -> u64 {
        let q = &self.gpus[slot].queue;
        q.room_keepers()
            .filter_map(|id| q.key(id).map(|k| (id, k)))
            .filter(|&(id, k)| q.is_resident(id) || !holding.contains(k))
            .fold(0u64, |a, (_, k)| a.saturating_add(self.footprint(k)))
    }

    /// The functions holding a lease other than a Start one on GPU `slot` (see [`Core::beside`]).
    fn holding(&self, slot: usize) -> BTreeSet<&str> {
        let index = self.gpus[slot].info.index;
        self.leases
            .values()
            .filter(|l| l.gpu == index && l.kind != Kind::Start)
            .map(|l| l.function.as_str())
            .collect()
    }

    /// One GPU's memory as admission sees it; `None` for a GPU the node lacks.
    #[must_use]
    pub fn memory_view(&self, index: u32) -> Option<MemoryView> {
        let s = self.gpus.iter().position(|g| g.info.index == index)?;
        let budget = self.budget(s);
        let g = &self.gpus[s];
        Some(MemoryView {
            budget,
            held: self.held(s),
            reserved: if budget == 0 { 0 } else { self.short_room(s) },
            kept: if budget == 0 {
                0
            } else {
                self.kept_bytes(s, &self.holding(s))
            },
            blocked: g.queue.queued() > 0 && self.free_under_d(s) > 0 && !self.fits_waiting(s, 1),
        })
    }
}

/// One GPU's memory as a lease there is weighed against it: its budget, the footprints held,
/// the room kept for its active short flows (and the flow it is kept for), the functions already
/// holding a lease (see [`Core::beside`]), and (worked out once, when first asked) the
/// footprints of the flows whose memory is kept (see the module docs).
struct Beside<'a> {
    core: &'a Core,
    slot: usize,
    budget: u64,
    held: u64,
    room: u64,
    room_flow: Option<FlowId>,
    holding: BTreeSet<&'a str>,
    kept: OnceCell<u64>,
}

impl Beside<'_> {
    /// Whether a lease of `function` fits: its footprint beside the leases held, keeping the
    /// short flows' room where `keep_room`; and, where `function` already holds a lease here,
    /// keeping one footprint for every other flow whose memory is kept here (see the module
    /// docs; the short flow the room is kept for counted once).
    fn fits(&self, function: &str, keep_room: bool) -> bool {
        let room = if keep_room { self.room } else { 0 };
        if !self.fits_with(function, room) {
            return false;
        }
        if !self.holding.contains(function) {
            return true;
        }
        let core = self.core;
        let q = &core.gpus[self.slot].queue;
        let own = q.lookup(function);
        let all = *self
            .kept
            .get_or_init(|| core.kept_bytes(self.slot, &self.holding));
        // Whether a flow is among those `all` counts (see [`Core::kept_bytes`]).
        let counted = |id| {
            q.keeps_room(id)
                && (q.is_resident(id) || q.key(id).is_none_or(|k| !self.holding.contains(k)))
        };
        let mut kept = all;
        if own.is_some_and(counted) {
            kept = kept.saturating_sub(core.footprint(function));
        }
        // The short flow whose room is kept is among them when it is counted.
        let room = match self.room_flow {
            Some(s) if own != Some(s) && counted(s) => 0,
            _ => room,
        };
        self.held
            .saturating_add(core.footprint(function))
            .saturating_add(room)
            .saturating_add(kept)
            <= self.budget
    }

    /// Whether a lease of `function` fits beside the leases held, leaving `room`.
    fn fits_with(&self, function: &str, room: u64) -> bool {
        self.held
            .saturating_add(self.core.footprint(function))
            .saturating_add(room)
            <= self.budget
    }
}

#[cfg(test)]
mod tests;
