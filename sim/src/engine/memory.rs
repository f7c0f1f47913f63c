//! The simulated node's memory: which idle containers keep their memory on a GPU, eviction to
//! the host over PCIe, prefetch back, and the TTLs, decided by `scheduler_core`'s [`TierPolicy`]
//! (the pool's policy) over the executor's containers.

use scheduler_core::tiers::{ContainerView, Tier};

use super::{EPS, Engine, ms};
use crate::policy::{MemoryStyle, Policy};

impl Engine<'_> {
    /// Recomputes a function's best idle tier (what policies see at dispatch) and tells the
    /// policy when residency changes. Not under the node's pool: the core hears from the pool,
    /// and `mqfq-sticky` reads no pool view.
    pub(super) fn refresh(&mut self, f: usize, policy: &mut dyn Policy) {
        if self.admission == super::Admission::Node {
            return;
        }
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
        let mem = self.moved_mb(f);
        if !self.make_room(g, mem, false, policy) {
            return;
        }
        self.gpus[g].used_mb += mem;
        self.warm_moved(f, false);
        let end = self.move_link(g, mem);
        self.restored(end);
        let ct = &mut self.containers[c];
        ct.tier = Tier::Hot;
        ct.ready_ms = end;
        self.refresh(f, policy);
    }

    pub(super) fn housekeeping(&mut self, policy: &mut dyn Policy, mem: MemoryStyle) {
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
            if mem == MemoryStyle::KeepAlive {
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
