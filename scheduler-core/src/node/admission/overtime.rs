//! The maximum burst hold. GPU work cannot be preempted from outside the process that submits
//! it, so a burst that never ends — a server that keeps its GPU busy, or a process that begins
//! and never says `end` — keeps its slot for as long as it likes; charging it as it runs
//! (`charge`) makes its flow's *other* work yield, but on a GPU limited to one slot, or one whose
//! slots all such bursts hold, nothing else would ever run. So a burst lease held longer than
//! the maximum hold is in **overtime**: it keeps running, still charged, still counted in its
//! GPU's memory and its tenant's share, but it no longer keeps waiting work out — the GPU's
//! limits rise by one while it holds an overtime lease (by one, however many it holds: the GPU
//! co-runs at most one invocation more than its limit, so a tenant with many endless
//! containers cannot grow its share by overstaying). Start and resume leases are container
//! lifetimes gated by pausing, never in overtime.
//!
//! Marked at each sampling step (`Core::sample`), so the hold is bounded to within a sample
//! interval; the dispatch record has an `overtime` line for each.

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

    /// How many slots GPU `slot`'s limits rise by: one while it holds a lease in overtime.
    pub(super) fn overtime_slots(&self, slot: usize) -> u32 {
        u32::from(self.gpus[slot].overtime > 0)
    }
}

#[cfg(test)]
mod tests;
