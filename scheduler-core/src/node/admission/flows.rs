//! What the rest of the node tells the admission core about flows, and asks of it: whether a
//! function's memory is resident (the pool knows; MQFQ-Sticky's selection prefers resident flows
//! and stays with them), a flow's state, when the next sticky TTL expires, the limit in force,
//! every flow's snapshot, and the work each GPU holds for placement.

use std::collections::BTreeMap;

use crate::{FlowState, Time};

use super::{Core, CoreError, GpuReading, Grant, Limits, invalid};

impl Core {
    /// Tells every GPU's queue whether `function`'s memory is resident there, and what serving
    /// it costs when it is not (restore or cold start, seconds). A function no queue has seen is
    /// ignored (its flow starts out not resident). Memory that stops being resident frees the
    /// room a flow already running kept for it (see `memory`): returns what that granted.
    ///
    /// # Errors
    /// A cost that is not finite and >= 0.
    pub fn set_residency(
        &mut self,
        function: &str,
        resident: bool,
        switch_cost_s: f64,
        now: Time,
    ) -> Result<Vec<Grant>, CoreError> {
        let all = self
            .gpus
            .iter()
            .map(|g| (g.info.index, (resident, switch_cost_s)))
            .collect();
        Ok(if self.set_residency_by_gpu(function, &all)? {
            self.pump_all(now)
        } else {
            Vec::new()
        })
    }

    /// [`Core::set_residency`] per GPU, dispatching nothing (the caller does, once it has told
    /// the core everything): `by_gpu` maps a GPU's index to whether `function`'s memory is
    /// resident there and what serving it there costs; a GPU not in it holds none of it (not
    /// resident, cost unknown: 0). Returns whether its memory stopped being resident anywhere
    /// (which may end room memory admission kept, see `memory`: dispatch then).
    ///
    /// # Errors
    /// A cost that is not finite and >= 0; nothing changes then.
    pub fn set_residency_by_gpu(
        &mut self,
        function: &str,
        by_gpu: &BTreeMap<u32, (bool, f64)>,
    ) -> Result<bool, CoreError> {
        if let Some((_, c)) = by_gpu.values().find(|(_, c)| !(c.is_finite() && *c >= 0.0)) {
            return Err(invalid(
                "switch_cost",
                format!("{c} must be a finite number >= 0"),
            ));
        }
        let mut freed = false;
        for g in &mut self.gpus {
            if let Some(f) = g.queue.lookup(function) {
                let (resident, cost) = by_gpu.get(&g.info.index).copied().unwrap_or((false, 0.0));
                // Memory no longer resident may end room kept for the flow (or, for one that
                // holds a lease here, the room counted for it): dispatch to be sure.
                freed |= g.queue.is_resident(f) && !resident;
                // The flow exists and the cost was checked: nothing can fail here.
                let _ = g.queue.set_residency(f, resident, cost);
            }
        }
        Ok(freed)
    }

    /// The state of `function`'s flow: Active if it is Active on any GPU, else Throttled if it is
    /// throttled on any, else Inactive; `None` when no queue has it.
    #[must_use]
    pub fn flow_state(&self, function: &str) -> Option<FlowState> {
        let rank = |s: FlowState| match s {
            FlowState::Active => 2,
            FlowState::Throttled => 1,
            FlowState::Inactive => 0,
        };
        self.gpus
            .iter()
            .filter_map(|g| g.queue.lookup(function).and_then(|f| g.queue.state(f)))
            .max_by_key(|&s| rank(s))
    }

    /// One sampling step of the node, as `mqfqd` runs it every `sample_interval_ms` (and the
    /// simulator every `sample_ms`): charges long-running bursts and puts those past the maximum
    /// hold in overtime, expires sticky TTLs, then feeds each GPU's reading. Returns what it
    /// granted.
    pub fn sample(&mut self, samples: &[GpuReading], now: Time) -> Vec<Grant> {
        self.charge_running(now);
        self.mark_overtime(now);
        let mut grants = self.tick_all(now);
        for r in samples {
            grants.extend(self.observe(r, now));
        }
        grants
    }

    /// When a sticky TTL next expires on any GPU (a timer should call [`Core::tick_all`] then).
    #[must_use]
    pub fn next_timer(&self) -> Option<Time> {
        self.gpus.iter().filter_map(|g| g.queue.next_expiry()).min()
    }

    /// The limits in force on GPU `index` and the admissions waiting for it; `None` for a GPU
    /// the node lacks.
    #[must_use]
    pub fn limits(&self, index: u32) -> Option<Limits> {
        let s = self.gpus.iter().position(|g| g.info.index == index)?;
        let (any, slots) = self.limits_of(s);
        let g = &self.gpus[s];
        Some(Limits {
            any,
            slots,
            free: self.free_under_d(s),
            queued: g.queue.queued(),
            reserve_waiting: g.queue.reserve_eligible() && self.fits_waiting(s, 0),
            memory_bound: g.queue.queued() > 0 && !self.fits_waiting(s, 1),
        })
    }

    /// Each GPU's work held or waiting, for placing `key`'s next invocation (see
    /// [`crate::queue::MqfqQueue::work_ahead`]), by GPU index.
    #[must_use]
    pub fn work_ahead(&self, key: &str) -> Vec<(u32, crate::queue::WorkAhead)> {
        self.gpus
            .iter()
            .map(|g| (g.info.index, g.queue.work_ahead(key)))
            .collect()
    }

    /// Every flow on every GPU, with its GPU index.
    #[must_use]
    pub fn flows(&self) -> Vec<(u32, crate::queue::FlowSnapshot)> {
        self.gpus
            .iter()
            .flat_map(|g| g.queue.snapshots().into_iter().map(|f| (g.info.index, f)))
            .collect()
    }

    /// Text for a flow state.
    #[must_use]
    pub fn state_name(s: FlowState) -> &'static str {
        match s {
            FlowState::Active => "active",
            FlowState::Throttled => "throttled",
            FlowState::Inactive => "inactive",
        }
    }
}
