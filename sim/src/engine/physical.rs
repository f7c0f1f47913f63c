//! [`MemoryModel::Physical`], `none`: what a node runs without admission. Every call starts at
//! once, in an idle container of its function on the GPU or a new one; nothing evicts an idle
//! container's memory (plain runc and the NVIDIA toolkit know nothing of it) until the
//! platform's keep-alive ends it. Past the GPU's physical memory a start either fails — its
//! allocations do — or, with managed memory (`--none-memory uvm`), goes on oversubscribed, and
//! each run on an oversubscribed GPU first pages its share of the excess in over the PCIe link;
//! with `uvm-thrash`, a run whose co-runners' footprints and its own exceed the GPU pages its
//! whole footprint in, at the rate of fault-driven migration.
//!
//! [`MemoryModel::Physical`]: crate::policy::MemoryModel::Physical

use scheduler_core::node::admission::GpuReading;
use scheduler_core::tiers::Tier;

use super::{EPS, Engine, Model};
use crate::policy::Policy;
use crate::types::{NoneMemory, Record, UVM_FAULT_SHARE};

/// A run without admission.
#[derive(Clone, Copy, Debug)]
pub(in crate::engine) struct Physical;

impl Model for Physical {
    fn slots_free(_: &Engine<'_, Self>, _: usize) -> bool {
        true
    }

    /// No limit: one more than held, so a dispatch always finds a slot.
    fn limit(e: &Engine<'_, Self>, g: usize) -> u32 {
        e.gpus[g].slots.saturating_add(1)
    }

    /// What runs at once is the D in force.
    fn d_in_force(e: &Engine<'_, Self>, g: usize) -> u32 {
        e.gpus[g].slots
    }

    fn acquire(e: &mut Engine<'_, Self>, r: usize, _force: bool, policy: &mut dyn Policy) {
        e.acquire_physical(r, policy);
    }

    /// Nothing evicts: the container keeps its memory.
    fn released(_: &mut Engine<'_, Self>, _: usize, _: usize, _: usize, _: &mut dyn Policy) {}

    /// The platform's keep-alive ends idle containers (nothing keeps their memory on the host).
    fn sampled(e: &mut Engine<'_, Self>, nth: u64, _: &[GpuReading], policy: &mut dyn Policy) {
        if nth.is_multiple_of(10) {
            e.housekeeping(policy, true);
        }
    }
}

impl Engine<'_, Physical> {
    /// Gives run `r` a container under `none`, or fails it.
    fn acquire_physical(&mut self, r: usize, policy: &mut dyn Policy) {
        let (g, f) = self.run_site(r);
        let mem = self.hot_mb(f);
        let (c, until, tier) = if let Some(c) = self.idle_container(f, g, Tier::Hot) {
            (c, self.containers[c].ready_ms.max(self.now), Tier::Hot)
        } else if self.gpus[g].used_mb + mem <= self.cfg.mem_mb(g) + EPS
            || self.cfg.none_memory != NoneMemory::Fail
        {
            let c = self.new_container(f, g);
            (c, self.bring_in(c), Tier::Cold)
        } else {
            self.fail_start(r);
            return;
        };
        let until = until.max(self.page_in(r, g, mem));
        self.containers[c].busy = true;
        self.runs[r].as_mut().expect("run exists").container = Some(c);
        self.starting_up(r, until, tier, policy);
    }

    /// Run `r` on oversubscribed GPU `g` pages in its share of the excess first (`mem` × the
    /// fraction of the GPU's memory in use that does not fit); under `uvm-thrash`, its whole
    /// footprint at the fault-driven rate when the runs on `g` with it need more than `g` holds.
    /// Returns when that is done.
    fn page_in(&mut self, r: usize, g: usize, mem: f64) -> f64 {
        let (used, cap) = (self.gpus[g].used_mb, self.cfg.mem_mb(g));
        if used <= cap + EPS {
            return self.now;
        }
        if self.cfg.none_memory == NoneMemory::UvmThrash {
            let running: f64 = self
                .runs
                .iter()
                .enumerate()
                .filter_map(|(i, run)| run.as_ref().map(|run| (i, run)))
                .filter(|(i, run)| run.gpu == g && (run.container.is_some() || *i == r))
                .map(|(_, run)| self.hot_mb(run.func))
                .sum();
            if running > cap + EPS {
                return self.pcie_at(g, mem, UVM_FAULT_SHARE);
            }
        }
        self.pcie(g, mem * (used - cap) / used)
    }

    /// Run `r`'s call fails to start: its slot is given back and it is recorded as failed.
    fn fail_start(&mut self, r: usize) {
        let Some(run) = self.runs[r].take() else {
            return;
        };
        self.gpus[run.gpu].slots = self.gpus[run.gpu].slots.saturating_sub(1);
        self.audit.failed_starts += 1;
        // It never ran: no GPU, no end.
        self.records[run.current] = Some(Record {
            start_ms: self.now,
            end_ms: f64::NAN,
            tier: Tier::Cold,
            gpu: None,
        });
    }
}
