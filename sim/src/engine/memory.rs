//! Memory mechanics every model shares: the PCIe link, evicting an idle container to the host,
//! discarding one, the TTLs of `scheduler_core`'s [`TierPolicy`] over the executor's containers
//! (the executor's own models; under the node its pool keeps them), and the view of idle
//! containers policies read at dispatch.
//!
//! [`TierPolicy`]: scheduler_core::tiers::TierPolicy

use scheduler_core::tiers::{ContainerView, Tier};

use super::{Engine, Model, ms};
use crate::policy::Policy;

impl<M: Model> Engine<'_, M> {
    /// Function `f`'s idle containers changed (the model decides who hears of it).
    pub(super) fn refresh(&mut self, f: usize, policy: &mut dyn Policy) {
        M::refresh(self, f, policy);
    }

    /// Recomputes a function's best idle tier (what policies see at dispatch) and tells the
    /// policy when residency changes.
    pub(super) fn refresh_view(&mut self, f: usize, policy: &mut dyn Policy) {
        let mut best = Tier::Cold;
        let mut ready = f64::INFINITY;
        let mut restore = f64::INFINITY;
        for &c in &self.by_func[f] {
            let c = &self.containers[c];
            if c.busy {
                continue;
            }
            match c.tier {
                Tier::Hot => {
                    best = Tier::Hot;
                    ready = ready.min(c.ready_ms);
                }
                Tier::Warm => {
                    if best == Tier::Cold {
                        best = Tier::Warm;
                    }
                    restore = restore.min(self.move_ms(c.gpu, self.moved_mb(f)));
                }
                Tier::Cold => {}
            }
        }
        let startup = match best {
            Tier::Hot => (ready - self.now).max(0.0),
            Tier::Warm => restore,
            Tier::Cold => self.cold_ms(f),
        };
        let changed = (self.best[f] == Tier::Hot) != (best == Tier::Hot)
            || (best != Tier::Hot && (self.startup[f] - startup).abs() > 1e-9);
        self.startup[f] = startup;
        self.best[f] = best;
        if changed {
            let cost = if best == Tier::Hot { 0.0 } else { startup };
            policy.set_resident(f, best == Tier::Hot, cost);
        }
    }

    pub(super) fn pcie(&mut self, g: usize, mb: f64) -> f64 {
        self.pcie_at(g, mb, 1.0)
    }

    /// An evict or restore of `mb` on GPU `g`'s link, at the Warm backend's rate; returns when
    /// it is done.
    pub(super) fn move_link(&mut self, g: usize, mb: f64) -> f64 {
        self.pcie_at(g, mb, self.move_share(g))
    }

    /// [`Engine::pcie`] at `share` of the link's rate (fault-driven paging): the same bytes,
    /// `1 / share` times as long on the link.
    pub(super) fn pcie_at(&mut self, g: usize, mb: f64, share: f64) -> f64 {
        self.pcie_mb += mb;
        let dur = self.transfer_ms(g, mb) / share;
        let gpu = &mut self.gpus[g];
        let start = gpu.pcie_free_ms.max(self.now);
        gpu.pcie_free_ms = start + dur;
        gpu.pcie_free_ms
    }

    /// Brings idle Warm container `c`'s memory back over its GPU's link (a prefetch, room
    /// already made); returns when it is Hot again.
    pub(super) fn restore_idle(&mut self, c: usize) -> f64 {
        let (f, g) = (self.containers[c].func, self.containers[c].gpu);
        let mb = self.moved_mb(f);
        self.gpus[g].used_mb += mb;
        self.warm_moved(f, false);
        let end = self.move_link(g, mb);
        self.restored(end);
        let ct = &mut self.containers[c];
        ct.tier = Tier::Hot;
        ct.ready_ms = end;
        end
    }

    pub(super) fn evict(&mut self, c: usize, policy: &mut dyn Policy) {
        let (g, f) = {
            let ct = &mut self.containers[c];
            debug_assert!(ct.tier == Tier::Hot && !ct.busy);
            ct.tier = Tier::Warm;
            (ct.gpu, ct.func)
        };
        let mb = self.moved_mb(f);
        self.gpus[g].used_mb -= mb;
        self.warm_moved(f, true);
        self.move_link(g, mb);
        self.refresh(f, policy);
    }

    /// Container `c` (idle, Hot) is gone with its memory: its function's next call starts cold.
    pub(super) fn discard(&mut self, c: usize, policy: &mut dyn Policy) {
        let (g, f) = {
            let ct = &mut self.containers[c];
            debug_assert!(ct.tier == Tier::Hot && !ct.busy);
            ct.tier = Tier::Cold;
            ct.alive = false;
            (ct.gpu, ct.func)
        };
        self.gpus[g].used_mb -= self.hot_mb(f);
        self.by_func[f].retain(|&x| x != c);
        self.refresh(f, policy);
    }

    /// The TTLs: idle Hot containers past the hot TTL are evicted (or, with `keep_alive`, end:
    /// nothing keeps their memory on the host), Warm ones past the warm TTL dropped.
    pub(super) fn housekeeping(&mut self, policy: &mut dyn Policy, keep_alive: bool) {
        let now = ms(self.now);
        let mut evict = Vec::new();
        let mut drop = Vec::new();
        for (i, c) in self.containers.iter().enumerate() {
            if !c.alive {
                continue;
            }
            let view = ContainerView {
                id: i as u64,
                tier: c.tier,
                busy: c.busy,
                flow_active: false,
                bytes: 0,
                last_used: ms(c.last_used_ms),
                uses: c.uses,
                reload_cost_s: 0.0,
                priority: c.gdsf,
            };
            match self.tiers.expiry(&view, now) {
                Some(scheduler_core::tiers::TierMove::Evict) => evict.push(i),
                Some(scheduler_core::tiers::TierMove::Drop) => drop.push(i),
                _ => {}
            }
        }
        for c in evict {
            // Without a pool nothing keeps an idle container's memory on the host: the
            // keep-alive's end is the container's.
            if keep_alive {
                self.discard(c, policy);
            } else {
                self.evict(c, policy);
            }
        }
        for c in drop {
            let f = self.containers[c].func;
            // A Warm container's context (under `uvm`) leaves its GPU with it.
            if self.containers[c].tier == Tier::Warm {
                self.gpus[self.containers[c].gpu].used_mb -= self.warm_mb(f);
                self.warm_moved(f, false);
            }
            self.containers[c].alive = false;
            self.containers[c].tier = Tier::Cold;
            self.by_func[f].retain(|&x| x != c);
            self.refresh(f, policy);
        }
    }
}
