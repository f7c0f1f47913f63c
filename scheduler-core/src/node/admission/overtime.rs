//! The maximum burst hold. GPU work cannot be preempted from outside the process that submits
//! it, so a burst that never ends — a server that keeps its GPU busy, or a process that begins
//! and never says `end` — keeps its slot for as long as it likes; charging it as it runs
//! (`charge`) makes its flow's *other* work yield, but on a GPU limited to one slot, or one whose
//! slots all such bursts hold, nothing else would ever run. So a burst lease held longer than
//! the maximum hold is in **overtime**: it keeps running, still charged, still counted in its
//! GPU's memory and its tenant's share, but it no longer keeps others out — the GPU's limits
//! rise by one for each lease in overtime, and a slot above the normal limit goes only to work
//! of a flow that holds no overtime lease on that GPU. So a function's endless bursts free slots
//! for every other function but not for itself: a second endless burst of its own (it had taken
//! the raised slot, and starved the GPU's other work again) never gets one. Another function of
//! the same tenant may take it (a node whose pods share one namespace is one tenant, and its
//! other functions must not starve behind a runaway one); what bounds a tenant is its share of
//! the slots, in which overtime leases count, while other tenants' work waits. Start and resume
//! leases are container lifetimes gated by pausing, never in overtime.
//!
//! Marked at each sampling step (`Core::sample`), so the hold is bounded to within a sample
//! interval; the dispatch record has an `overtime` line for each.

use std::collections::{HashMap, HashSet};

use crate::FlowId;

use super::{Core, Kind, Record};
use crate::Time;

/// The default maximum hold of a burst lease, seconds (`[limits] max_burst_hold_s`).
pub const DEFAULT_MAX_BURST_HOLD_S: f64 = 60.0;

impl Core {
    /// Sets the maximum hold of a burst lease, seconds; `None` (or 0 in mqfqd.toml): no maximum.
    ///
    /// # Errors
    /// A hold that is not a finite number > 0.
    pub fn set_max_burst_hold(&mut self, secs: Option<f64>) -> Result<(), super::CoreError> {
        if let Some(s) = secs
            && !(s.is_finite() && s > 0.0)
        {
            return Err(super::invalid(
                "max_burst_hold_s",
                format!("{s} must be a finite number > 0"),
            ));
        }
        self.max_burst_hold = secs;
        Ok(())
    }

    /// Puts every burst lease held past the maximum hold in overtime (see the module docs).
    pub(super) fn mark_overtime(&mut self, now: Time) {
        let Some(max) = self.max_burst_hold else {
            return;
        };
        let due: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.kind == Kind::Burst && !l.overtime)
            .filter(|(_, l)| now.secs_since(l.since) >= max)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(l) = self.leases.get_mut(&id) else {
                continue;
            };
            l.overtime = true;
            let (gpu, key, function) = (l.gpu, l.key.clone(), l.function.clone());
            let held_s = now.secs_since(l.since);
            let slot = self.slot(gpu);
            self.gpus[slot].overtime += 1;
            let seq = self.next_seq();
            self.log.push(Record::Overtime {
                seq,
                t_ns: now.as_nanos(),
                gpu,
                key,
                function,
                lease: id,
                held_s,
            });
        }
    }

    /// How many slots GPU `slot`'s limits rise by: one for each lease there in overtime.
    pub(super) fn overtime_slots(&self, slot: usize) -> u32 {
        self.gpus[slot].overtime
    }

    /// How many of GPU `slot`'s overtime leases are long work (what the reserve counts).
    pub(super) fn overtime_long(&self, slot: usize) -> u32 {
        if self.gpus[slot].overtime == 0 {
            return 0;
        }
        let index = self.gpus[slot].info.index;
        let n = self
            .leases
            .values()
            .filter(|l| l.gpu == index && l.overtime && l.long)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// For GPU `slot`: whether a flow's work may take the next slot — any may below the normal
    /// limit; above it (a slot an overtime lease freed) only a flow holding no overtime lease
    /// there.
    pub(super) fn overtime_test(&self, slot: usize) -> impl Fn(FlowId) -> bool + '_ {
        let index = self.gpus[slot].info.index;
        let open = self.overtime_open(slot);
        let allows = self.overtime_allows(slot);
        let flow_of: HashMap<FlowId, &str> = if open {
            HashMap::new()
        } else {
            self.waiting
                .values()
                .filter(|w| w.gpu == index)
                .map(|w| (w.flow, w.function.as_str()))
                .collect()
        };
        move |flow| open || flow_of.get(&flow).is_none_or(|f| allows(f))
    }

    /// Whether GPU `slot`'s next slot is open to any work (below the normal limit, or no
    /// overtime lease there).
    fn overtime_open(&self, slot: usize) -> bool {
        let g = &self.gpus[slot];
        g.overtime == 0 || g.running < self.normal_limits_of(slot).1
    }

    /// [`Core::overtime_test`] by function: whether `function`'s work may take GPU `slot`'s
    /// next slot.
    pub(super) fn overtime_allows(&self, slot: usize) -> impl Fn(&str) -> bool + '_ {
        let index = self.gpus[slot].info.index;
        let open = self.overtime_open(slot);
        let over: HashSet<&str> = if open {
            HashSet::new()
        } else {
            self.leases
                .values()
                .filter(|l| l.gpu == index && l.overtime)
                .map(|l| l.function.as_str())
                .collect()
        };
        move |function| open || !over.contains(function)
    }
}

#[cfg(test)]
mod tests;
