//! Under [`Admission::Node`], the node's pool decides memory: [`Pool`] (what `mqfqd` runs) says
//! which idle containers keep their memory on a GPU, which are evicted to the host, prefetched
//! back or reclaimed. The executor plays what `mqfqd` talks to: the shims (it carries out each
//! order at once over the simulated PCIe link and reports it, and reports a restore at
//! admission), NVML (each sample's memory in use) and the platform (which container serves a
//! call). What the pool then knows of each function's memory goes to the admission core, as
//! `mqfqd`'s `pool_settle` sends it.
//!
//! The pool's keys are the executor's containers (`sim/c<n>`); the core's are invocations
//! (`sim/i<n>`, one burst each), since here the container is chosen after admission.

use std::collections::HashMap;

use scheduler_core::node::ContainerKey;
use scheduler_core::node::pool::{Action, Outcome, Pool, PoolConfig};
use scheduler_core::tiers::Tier;

use super::{Engine, ms};
use crate::node::{NAMESPACE, flow_names};
use crate::policy::Policy;
use crate::trace::Trace;
use crate::types::SimConfig;

/// The pool and what the core was last told of each function.
#[derive(Debug)]
pub(super) struct NodePool {
    pool: Pool,
    names: Vec<String>,
    by_name: HashMap<String, usize>,
    told: Vec<Option<(bool, f64)>>,
    footprint_told: Vec<u64>,
}

impl NodePool {
    /// The pool with [`pool_config`].
    pub(super) fn new(
        trace: &Trace,
        cfg: &SimConfig,
    ) -> Result<Self, scheduler_core::config::ConfigError> {
        let pool = Pool::new(pool_config(cfg))?;
        let (names, by_name) = flow_names(trace);
        Ok(NodePool {
            pool,
            told: vec![None; names.len()],
            footprint_told: vec![0; names.len()],
            names,
            by_name,
        })
    }

    /// The pool itself.
    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }
}

/// The pool's knobs in the simulator: the node's tier knobs, reclaim on (a container past its
/// warm TTL is gone, as the executor's own memory model has it), host memory not modelled.
#[must_use]
pub fn pool_config(cfg: &SimConfig) -> PoolConfig {
    PoolConfig {
        tiers: cfg.tiers.clone(),
        reclaim: true,
        host_headroom: 0.0,
    }
}

fn key(c: usize) -> ContainerKey {
    ContainerKey::new(NAMESPACE, &format!("c{c}")).expect("a valid key")
}

fn container(k: &ContainerKey) -> Option<usize> {
    k.id().strip_prefix('c')?.parse().ok()
}

#[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn bytes(mb: f64) -> u64 {
    (mb.max(0.0) * 1024.0 * 1024.0) as u64
}

impl Engine<'_> {
    fn node_pool(&mut self) -> &mut NodePool {
        self.pool
            .as_mut()
            .expect("the node's pool under Admission::Node")
    }

    /// Container `c` got a lease: the pool counts the hit and makes room when it restores
    /// (knowing the GPU's memory as it is now: here memory is taken at once, where a real
    /// container's allocations show in the next sample).
    pub(super) fn pool_grant(&mut self, c: usize, policy: &mut dyn Policy) {
        let (f, g) = (self.containers[c].func, self.containers[c].gpu);
        let (used, total) = (self.used_bytes(g), bytes(self.cfg.mem_mb(g)));
        let now = ms(self.now);
        let p = self.node_pool();
        p.pool.observe_memory(super::gpu_index(g), used, total);
        let name = p.names[f].clone();
        p.pool.granted(&key(c), &name, super::gpu_index(g), 0, now);
        self.pool_orders(policy);
    }

    /// A container on GPU `g` is about to take `mb` more: the pool sees the memory in use with
    /// it (as its next sample would) and relieves the pressure.
    pub(super) fn pool_need(&mut self, g: usize, mb: f64, policy: &mut dyn Policy) {
        let used = bytes(self.gpus[g].used_mb + mb);
        let total = bytes(self.cfg.mem_mb(g));
        let now = ms(self.now);
        let p = self.node_pool();
        p.pool.observe_memory(super::gpu_index(g), used, total);
        p.pool.tick(now, None);
        self.pool_orders(policy);
    }

    /// Container `c`'s lease ended; it stays, idle, holding its function's memory.
    pub(super) fn pool_release(&mut self, c: usize, policy: &mut dyn Policy) {
        let b = bytes(self.mem(self.containers[c].func));
        let now = ms(self.now);
        self.node_pool().pool.released(&key(c), true, b, now);
        self.pool_sync(policy);
    }

    /// A restore the executor did at admission (the shim's own report at Resume).
    pub(super) fn pool_restored(&mut self, c: usize, seconds: f64) {
        let b = bytes(self.mem(self.containers[c].func));
        let now = ms(self.now);
        self.node_pool().pool.report(
            &Outcome {
                key: key(c),
                action: Action::Restore,
                ok: true,
                skipped: false,
                gone: false,
                bytes: b,
                seconds,
            },
            now,
        );
    }

    /// The sampling step's half for the pool: memory in use per GPU, then its timers and
    /// pressure (as `mqfqd`'s sampling loop does after the core's step).
    pub(super) fn pool_sample(&mut self, policy: &mut dyn Policy) {
        let used: Vec<(u64, u64)> = (0..self.gpus.len())
            .map(|g| (self.used_bytes(g), bytes(self.cfg.mem_mb(g))))
            .collect();
        let now = ms(self.now);
        let p = self.node_pool();
        for (g, (u, total)) in used.into_iter().enumerate() {
            p.pool.observe_memory(super::gpu_index(g), u, total);
        }
        p.pool.tick(now, None);
        self.pool_orders(policy);
    }

    /// A flow turned Active on GPU `g`: the pool prefetches its Warm containers there.
    pub(super) fn pool_activated(&mut self, g: usize, f: usize, policy: &mut dyn Policy) {
        let now = ms(self.now);
        let p = self.node_pool();
        let name = p.names[f].clone();
        p.pool.activated(super::gpu_index(g), &name, now);
        self.pool_orders(policy);
    }

    /// Carries out the pool's orders at once and reports each, then tells the core.
    fn pool_orders(&mut self, policy: &mut dyn Policy) {
        let orders = self.node_pool().pool.take_orders();
        for o in orders {
            let c = container(&o.key).filter(|&c| c < self.containers.len());
            let (done, seconds) = match c {
                Some(c) => self.carry_out(c, o.action),
                None => (None, 0.0),
            };
            let outcome = Outcome {
                key: o.key,
                action: o.action,
                ok: done.is_some(),
                skipped: done.is_none(),
                gone: c.is_none(),
                bytes: done.unwrap_or(0),
                seconds,
            };
            let now = ms(self.now);
            self.node_pool().pool.report(&outcome, now);
        }
        self.pool_sync(policy);
    }

    /// One order on container `c`: the bytes moved and the seconds it took, or `None` when the
    /// container is not in a state the order applies to (a shim skips it).
    fn carry_out(&mut self, c: usize, action: Action) -> (Option<u64>, f64) {
        let ct = &self.containers[c];
        let (f, g) = (ct.func, ct.gpu);
        let mb = self.mem(f);
        if !ct.alive || ct.busy {
            return (None, 0.0);
        }
        match (action, ct.tier) {
            (Action::Evict, Tier::Hot) => {
                self.containers[c].tier = Tier::Warm;
                self.gpus[g].used_mb -= mb;
                self.pcie(g, mb);
                (Some(bytes(mb)), self.transfer_ms(g, mb) / 1e3)
            }
            (Action::Prefetch, Tier::Warm) => {
                self.gpus[g].used_mb += mb;
                let end = self.pcie(g, mb);
                let ct = &mut self.containers[c];
                ct.tier = Tier::Hot;
                ct.ready_ms = end;
                (Some(bytes(mb)), self.transfer_ms(g, mb) / 1e3)
            }
            (Action::Reclaim, tier) => {
                if tier == Tier::Hot {
                    self.gpus[g].used_mb -= mb;
                }
                let ct = &mut self.containers[c];
                ct.alive = false;
                ct.tier = Tier::Cold;
                self.by_func[f].retain(|&x| x != c);
                (Some(0), 0.0)
            }
            _ => (None, 0.0),
        }
    }

    /// What the pool knows of each function's memory, to the core when it changed.
    fn pool_sync(&mut self, policy: &mut dyn Policy) {
        let p = self.node_pool();
        let mut tell = Vec::new();
        for (name, resident, cost_s) in p.pool.residency() {
            let Some(&f) = p.by_name.get(&name) else {
                continue;
            };
            if p.told[f] != Some((resident, cost_s)) {
                p.told[f] = Some((resident, cost_s));
                tell.push((f, resident, cost_s));
            }
        }
        let mut sizes = Vec::new();
        for (name, bytes) in p.pool.footprints() {
            if let Some(&f) = p.by_name.get(&name)
                && p.footprint_told[f] != bytes
            {
                p.footprint_told[f] = bytes;
                sizes.push((f, bytes));
            }
        }
        for (f, resident, cost_s) in tell {
            policy.set_resident(f, resident, cost_s * 1e3);
        }
        let now = ms(self.now);
        for (f, bytes) in sizes {
            policy.set_footprint(f, bytes, now);
        }
    }
}
