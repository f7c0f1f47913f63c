//! [`MemoryModel::Budget`]: the executor's own slots and memory, as the baselines run. Slots
//! come from the dynamic concurrency controller or a fixed D with the published utilization
//! gate; a container's memory counts against its GPU's budget, room is made by evicting idle
//! containers to the host ([`TierPolicy`]'s victims), and the style says what else happens to
//! it around its calls (evict after use, start every call cold, evict and prefetch with its
//! flow).
//!
//! [`MemoryModel::Budget`]: crate::policy::MemoryModel::Budget
//! [`TierPolicy`]: scheduler_core::tiers::TierPolicy

use scheduler_core::node::admission::GpuReading;
use scheduler_core::tiers::{ContainerView, Tier};

use super::{EPS, Engine, Model, Phase, ms};
use crate::policy::{Gate, MemoryStyle, Policy, Signal};

/// The gate and the style of a run under [`MemoryModel::Budget`].
///
/// [`MemoryModel::Budget`]: crate::policy::MemoryModel::Budget
#[derive(Clone, Copy, Debug)]
pub(in crate::engine) struct Budget {
    pub(in crate::engine) gate: Gate,
    pub(in crate::engine) style: MemoryStyle,
}

impl Model for Budget {
    fn slots_free(e: &Engine<'_, Self>, g: usize) -> bool {
        let gpu = &e.gpus[g];
        match e.model.gate {
            Gate::Dynamic => gpu.slots < gpu.conc.limit(),
            Gate::Fixed { d, util_limit } => {
                gpu.slots < d.min(gpu.conc.config().d_max) && gpu.gate_est <= util_limit
            }
        }
    }

    fn limit(e: &Engine<'_, Self>, g: usize) -> u32 {
        match e.model.gate {
            Gate::Dynamic => e.gpus[g].conc.limit(),
            Gate::Fixed { d, .. } => d.min(e.gpus[g].conc.config().d_max),
        }
    }

    fn acquire(e: &mut Engine<'_, Self>, r: usize, force: bool, policy: &mut dyn Policy) {
        let (g, f) = e.run_site(r);
        let (c, until, tier) = if let Some(c) = e.idle_container(f, g, Tier::Hot) {
            (c, e.containers[c].ready_ms.max(e.now), Tier::Hot)
        } else {
            let warm = e.idle_container(f, g, Tier::Warm);
            let need = if warm.is_some() {
                e.moved_mb(f)
            } else {
                e.hot_mb(f)
            };
            if !e.make_room(g, need, true, policy) {
                if !force {
                    e.runs[r].as_mut().expect("run exists").phase = Phase::WaitMem;
                    return;
                }
                e.audit.over_budget_admissions += 1;
            }
            let c = warm.unwrap_or_else(|| e.new_container(f, g));
            let tier = e.containers[c].tier;
            (c, e.bring_in(c), tier)
        };
        e.containers[c].busy = true;
        e.runs[r].as_mut().expect("run exists").container = Some(c);
        e.starting_up(r, until, tier, policy);
    }

    fn released(e: &mut Engine<'_, Self>, c: usize, g: usize, f: usize, policy: &mut dyn Policy) {
        if let Gate::Fixed { .. } = e.model.gate {
            // The published gate's estimate gives back the released run's share.
            let gpu = &mut e.gpus[g];
            gpu.gate_est = if gpu.slots == 0 {
                0.0
            } else {
                gpu.gate_est * f64::from(gpu.slots) / f64::from(gpu.slots + 1)
            };
        }
        match e.model.style {
            MemoryStyle::ColdEveryCall => e.discard(c, policy),
            MemoryStyle::EvictAfterUse => e.evict(c, policy),
            MemoryStyle::EagerPrefetch if !policy.active(f) => e.evict(c, policy),
            MemoryStyle::EagerPrefetch | MemoryStyle::Lazy => {}
        }
    }

    /// The eager style prefetches a flow that turned Active and evicts one that went Inactive.
    fn signals(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        for s in policy.tick(ms(e.now)) {
            if e.model.style != MemoryStyle::EagerPrefetch {
                continue;
            }
            match s {
                Signal::Activated(f) => e.prefetch(f, policy),
                Signal::Deactivated(f) => {
                    let idle: Vec<usize> = e.by_func[f]
                        .iter()
                        .copied()
                        .filter(|&c| !e.containers[c].busy && e.containers[c].tier == Tier::Hot)
                        .collect();
                    for c in idle {
                        e.evict(c, policy);
                    }
                }
            }
        }
    }

    /// The published gate counts a dispatch into its utilization estimate at once.
    fn dispatched(e: &mut Engine<'_, Self>, g: usize) {
        if let Gate::Fixed { .. } = e.model.gate {
            let gpu = &mut e.gpus[g];
            gpu.gate_est = if gpu.slots == 0 {
                gpu.gate_est + 0.5
            } else {
                gpu.gate_est + gpu.gate_est / f64::from(gpu.slots)
            };
        }
    }

    fn sampled(e: &mut Engine<'_, Self>, nth: u64, _: &[GpuReading], policy: &mut dyn Policy) {
        if nth.is_multiple_of(10) {
            e.housekeeping(policy, false);
        }
    }
}

impl Engine<'_, Budget> {
    /// Frees memory on GPU `g` so `need` MB fit; `active_ok` allows evicting active flows'
    /// containers. Returns false (and evicts nothing) if it cannot.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "ids are container indices; footprints in MB, >= 0: their bytes fit u64"
    )]
    pub(super) fn make_room(
        &mut self,
        g: usize,
        need: f64,
        active_ok: bool,
        policy: &mut dyn Policy,
    ) -> bool {
        let free = self.gpus[g].budget_mb - self.gpus[g].used_mb;
        if need <= free + EPS {
            return true;
        }
        let bw = self.gpus[g].link_gbps * self.move_share(g);
        let cands: Vec<ContainerView> = self
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.alive && c.gpu == g && c.tier == Tier::Hot && !c.busy)
            .filter(|(_, c)| active_ok || !policy.active(c.func))
            .map(|(i, c)| {
                let mb = self.moved_mb(c.func);
                ContainerView {
                    id: i as u64,
                    tier: c.tier,
                    busy: c.busy,
                    flow_active: policy.active(c.func),
                    bytes: (mb * 1024.0 * 1024.0) as u64,
                    last_used: ms(c.last_used_ms),
                    uses: c.uses,
                    reload_cost_s: mb / bw / 1e3,
                    priority: c.gdsf,
                }
            })
            .collect();
        let freeable: f64 = cands
            .iter()
            .map(|c| self.moved_mb(self.containers[c.id as usize].func))
            .sum();
        if free + freeable + EPS < need {
            return false;
        }
        let to_bytes = |mb: f64| (mb.max(0.0) * 1024.0 * 1024.0) as u64;
        let victims = self
            .tiers
            .choose_victims(&cands, to_bytes(need), to_bytes(free));
        for v in victims {
            self.evict(v as usize, policy);
        }
        true
    }

    /// Brings `f`'s most recently used idle Warm container back, making room for it.
    pub(super) fn prefetch(&mut self, f: usize, policy: &mut dyn Policy) {
        if self.best[f] == Tier::Hot {
            return;
        }
        let warm = self.by_func[f]
            .iter()
            .copied()
            .filter(|&c| !self.containers[c].busy && self.containers[c].tier == Tier::Warm)
            .max_by(|&a, &b| {
                self.containers[a]
                    .last_used_ms
                    .total_cmp(&self.containers[b].last_used_ms)
            });
        let Some(c) = warm else { return };
        let g = self.containers[c].gpu;
        if !self.make_room(g, self.moved_mb(f), false, policy) {
            return;
        }
        self.restore_idle(c);
        self.refresh(f, policy);
    }
}
