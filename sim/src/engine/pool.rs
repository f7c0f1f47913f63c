//! Under [`Admission::Node`], the node's pool decides memory: the [`Pool`] inside the node
//! (what `mqfqd` runs) says which idle containers keep their memory on a GPU, which are evicted
//! to the host, prefetched back or reclaimed. The executor plays what `mqfqd` talks to: the
//! shims (it carries out each order at once over the simulated PCIe link and reports it, and
//! reports a restore at admission), NVML (memory in use) and the platform (which container
//! serves a call). The node itself tells its core what the pool learns.
//!
//! The pool's keys are the executor's containers (`sim/c<n>`); the core's are invocations
//! (`sim/i<n>`, one burst each), since here the container is chosen after admission.
//!
//! [`Pool`]: scheduler_core::node::pool::Pool

use scheduler_core::node::pool::{Action, Outcome};
use scheduler_core::node::{ContainerKey, Input};
use scheduler_core::tiers::Tier;

use super::{EPS, Engine, Phase, ms};
use crate::node::NAMESPACE;
use crate::policy::{NodeDriver, Policy};

fn key(c: usize) -> ContainerKey {
    ContainerKey::new(NAMESPACE, &format!("c{c}")).expect("a valid key")
}

fn container(k: &ContainerKey) -> Option<usize> {
    k.id().strip_prefix('c')?.parse().ok()
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "MB clamped >= 0: its bytes fit u64"
)]
fn bytes(mb: f64) -> u64 {
    (mb.max(0.0) * 1024.0 * 1024.0) as u64
}

fn node(policy: &mut dyn Policy) -> &mut dyn NodeDriver {
    policy
        .node_mut()
        .expect("the node's pool under Admission::Node")
}

impl Engine<'_> {
    /// [`Engine::acquire`] under the node's pool: the container (an idle Hot one, else an idle
    /// Warm one, else a new one) is claimed and granted to the pool once (which makes room for
    /// a restore); a container that takes memory then shows the pool the memory in use with it,
    /// as the next sample would, and the pool relieves the pressure; the run waits while its
    /// memory does not fit.
    pub(super) fn acquire_node(&mut self, r: usize, force: bool, policy: &mut dyn Policy) {
        let (g, f, claimed, inv) = {
            let run = self.runs[r].as_ref().expect("run exists");
            (run.gpu, run.func, run.container, run.current)
        };
        let c = claimed.unwrap_or_else(|| {
            let c = self
                .idle_container(f, g, Tier::Hot)
                .or_else(|| self.idle_container(f, g, Tier::Warm))
                .unwrap_or_else(|| self.new_container(f, g));
            self.containers[c].busy = true;
            self.runs[r].as_mut().expect("run exists").container = Some(c);
            self.pool_grant(c, inv, policy);
            c
        });
        let was = self.containers[c].tier;
        let until = if was == Tier::Hot {
            self.containers[c].ready_ms.max(self.now)
        } else {
            let mem = if was == Tier::Warm {
                self.moved_mb(f)
            } else {
                self.hot_mb(f)
            };
            // What the pool's next sample would see: the memory with this container's.
            self.pool_need(g, mem, policy);
            if self.gpus[g].budget_mb - self.gpus[g].used_mb + EPS < mem {
                if !force {
                    self.runs[r].as_mut().expect("run exists").phase = Phase::WaitMem;
                    return;
                }
                self.audit.over_budget_admissions += 1;
            }
            let until = self.bring_in(c);
            if was == Tier::Warm {
                let g = self.containers[c].gpu;
                self.pool_restored(c, self.move_ms(g, mem) / 1e3, policy);
            }
            until
        };
        self.starting_up(r, until, was, policy);
    }

    /// Invocation `inv` runs in container `c`: the pool counts the hit and makes room when it
    /// restores (knowing the GPU's memory as it is now: here memory is taken at once, where a
    /// real container's allocations show in the next sample).
    pub(super) fn pool_grant(&mut self, c: usize, inv: usize, policy: &mut dyn Policy) {
        let g = self.containers[c].gpu;
        let memory = Input::Memory {
            gpu: super::gpu_index(g),
            used: self.used_bytes(g),
            total: bytes(self.cfg.mem_mb(g)),
        };
        let now = ms(self.now);
        let n = node(policy);
        n.step(memory, now);
        n.hit(inv, key(c), now);
        self.pool_orders(policy);
    }

    /// A container on GPU `g` is about to take `mb` more: the pool sees the memory in use with
    /// it (as its next sample would) and relieves the pressure.
    pub(super) fn pool_need(&mut self, g: usize, mb: f64, policy: &mut dyn Policy) {
        let memory = Input::Memory {
            gpu: super::gpu_index(g),
            used: bytes(self.gpus[g].used_mb + mb),
            total: bytes(self.cfg.mem_mb(g)),
        };
        let now = ms(self.now);
        let n = node(policy);
        n.step(memory, now);
        n.step(Input::Tick { host: None }, now);
        self.pool_orders(policy);
    }

    /// Container `c`'s lease ended; it stays, idle, holding its function's memory.
    pub(super) fn pool_release(&mut self, c: usize, policy: &mut dyn Policy) {
        let released = Input::Released {
            key: key(c),
            paused: true,
            bytes: bytes(self.moved_mb(self.containers[c].func)),
            native: None,
        };
        node(policy).step(released, ms(self.now));
        self.pool_orders(policy);
    }

    /// A restore the executor did at admission (the shim's own report at Resume).
    pub(super) fn pool_restored(&mut self, c: usize, seconds: f64, policy: &mut dyn Policy) {
        let report = Input::Report(Outcome {
            key: key(c),
            action: Action::Restore,
            ok: true,
            skipped: false,
            gone: false,
            bytes: bytes(self.moved_mb(self.containers[c].func)),
            seconds,
        });
        node(policy).step(report, ms(self.now));
        self.pool_orders(policy);
    }

    /// The sampling step's half for the pool, after the core's: its timers and pressure over
    /// the memory just sampled (as `mqfqd`'s sampling loop does).
    pub(super) fn pool_sample(&mut self, policy: &mut dyn Policy) {
        node(policy).step(Input::Tick { host: None }, ms(self.now));
        self.pool_orders(policy);
    }

    /// Carries out the pool's orders at once and reports each (a report may bring more).
    pub(super) fn pool_orders(&mut self, policy: &mut dyn Policy) {
        loop {
            let orders = node(policy).take_orders();
            if orders.is_empty() {
                return;
            }
            for o in orders {
                let c = container(&o.key).filter(|&c| c < self.containers.len());
                let (done, seconds) = match c {
                    Some(c) => self.carry_out(c, o.action),
                    None => (None, 0.0),
                };
                let report = Input::Report(Outcome {
                    key: o.key,
                    action: o.action,
                    ok: done.is_some(),
                    skipped: done.is_none(),
                    gone: c.is_none(),
                    bytes: done.unwrap_or(0),
                    seconds,
                });
                node(policy).step(report, ms(self.now));
            }
        }
    }

    /// One order on container `c`: the bytes moved and the seconds it took, or `None` when the
    /// container is not in a state the order applies to (a shim skips it).
    fn carry_out(&mut self, c: usize, action: Action) -> (Option<u64>, f64) {
        let ct = &self.containers[c];
        let (f, g) = (ct.func, ct.gpu);
        let mb = self.moved_mb(f);
        if !ct.alive || ct.busy {
            return (None, 0.0);
        }
        match (action, ct.tier) {
            (Action::Evict, Tier::Hot) => {
                self.containers[c].tier = Tier::Warm;
                self.gpus[g].used_mb -= mb;
                self.warm_moved(f, true);
                self.move_link(g, mb);
                (Some(bytes(mb)), self.move_ms(g, mb) / 1e3)
            }
            (Action::Prefetch, Tier::Warm) => {
                self.gpus[g].used_mb += mb;
                self.warm_moved(f, false);
                let end = self.move_link(g, mb);
                self.restored(end);
                let ct = &mut self.containers[c];
                ct.tier = Tier::Hot;
                ct.ready_ms = end;
                (Some(bytes(mb)), self.move_ms(g, mb) / 1e3)
            }
            (Action::Reclaim, tier) => {
                match tier {
                    Tier::Hot => self.gpus[g].used_mb -= self.hot_mb(f),
                    Tier::Warm => {
                        self.gpus[g].used_mb -= self.warm_mb(f);
                        self.warm_moved(f, false);
                    }
                    Tier::Cold => {}
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
}
