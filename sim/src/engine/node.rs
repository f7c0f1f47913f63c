//! [`MemoryModel::Node`]: `mqfqd`'s `Node` decides. Its core grants (which invocation, on which
//! GPU, under which limits) and the [`Pool`] inside it says which idle containers keep their
//! memory on a GPU, which are evicted to the host, prefetched back or reclaimed. The executor
//! plays what `mqfqd` talks to: the shims (it carries out each order at once over the simulated
//! PCIe link and reports it, and reports a restore at admission), NVML (memory in use, each
//! sample) and the platform (which container serves a call). The node itself tells its core
//! what the pool learns.
//!
//! The pool's keys are the executor's containers (`sim/c<n>`); the core's are invocations
//! (`sim/i<n>`, one burst each), since here the container is chosen after admission.
//!
//! [`MemoryModel::Node`]: crate::policy::MemoryModel::Node
//! [`Pool`]: scheduler_core::node::pool::Pool

use scheduler_core::concurrency::Signals;
use scheduler_core::node::admission::{GpuReading, Limits};
use scheduler_core::node::pool::{Action, Outcome};
use scheduler_core::node::{ContainerKey, Input, PooledEnd};
use scheduler_core::tiers::Tier;
use scheduler_core::warm::Warm;

use super::{EPS, Engine, Model, Phase, gpu_index, ms};
use crate::node::NAMESPACE;
use crate::policy::{NodeDriver, Policy};

/// A run under the node: the limits in force per GPU, as its core last said.
#[derive(Debug)]
pub(in crate::engine) struct NodePool {
    limits: Vec<Limits>,
    /// The burst that just ended, `(invocation, service in ms)`: its lease ends with its
    /// container, when the run gives the container back.
    ended: Option<(usize, f64)>,
}

impl NodePool {
    pub(in crate::engine) fn new(gpus: usize) -> Self {
        NodePool {
            limits: vec![Limits::default(); gpus],
            ended: None,
        }
    }
}

impl Model for NodePool {
    fn slots_free(e: &Engine<'_, Self>, g: usize) -> bool {
        e.gpus[g].slots < e.model.limits[g].slots
    }

    fn limit(e: &Engine<'_, Self>, g: usize) -> u32 {
        e.model.limits[g].slots
    }

    fn start(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        for g in 0..e.gpus.len() {
            e.model.limits[g] = policy.node_limits(g);
        }
    }

    fn acquire(e: &mut Engine<'_, Self>, r: usize, force: bool, policy: &mut dyn Policy) {
        e.acquire_node(r, force, policy);
    }

    /// The node measures a burst itself (its core's release carries the service).
    fn exec_began(_: &mut Engine<'_, Self>, _: usize, _: usize) {}

    /// As in `mqfqd`, a lease's end reaches the node in one input with what became of its
    /// container: held until the run gives the container back.
    fn exec_ended(
        e: &mut Engine<'_, Self>,
        _: usize,
        inv: usize,
        service_ms: f64,
        p: &mut dyn Policy,
    ) {
        if let Some((before, service_ms)) = e.model.ended.replace((inv, service_ms)) {
            // A burst whose run went on in the same container (no run does under the node).
            node(p).release(before, e.trace, service_ms, None, ms(e.now));
        }
    }

    fn released(e: &mut Engine<'_, Self>, c: usize, _: usize, _: usize, policy: &mut dyn Policy) {
        if let Some(ended) = e.model.ended.take() {
            e.pool_release(c, ended, policy);
        }
    }

    /// The pool's orders are carried out (a flow that turned Active prefetches there); the
    /// policy's own flow signals move nothing.
    fn signals(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        e.pool_orders(policy);
        let _ = policy.tick(ms(e.now));
    }

    /// Runs what the node's core granted, on the GPU it chose.
    fn dispatch(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        while let Some((inv, g)) = policy.granted() {
            if g >= e.gpus.len() {
                e.audit.over_limit_dispatches += 1;
                continue;
            }
            e.start_run(g, vec![inv], policy);
        }
        for g in 0..e.gpus.len() {
            e.model.limits[g] = policy.node_limits(g);
        }
    }

    /// A slot is idle where work waits that memory does not hold back and a slot is free to
    /// any work (a running short lease holds the reserve's), or the short-slot reserve's is
    /// free with a short flow waiting.
    fn idle_slot(e: &Engine<'_, Self>, _: &dyn Policy) -> bool {
        e.model.limits.iter().zip(&e.gpus).any(|(l, g)| {
            (l.queued > 0 && !l.memory_bound && l.free > 0 && g.slots < l.slots)
                || (l.reserve_waiting && g.slots < l.slots)
        })
    }

    /// The node's core and then its pool sample (as `mqfqd`'s sampling loop does).
    fn sampled(e: &mut Engine<'_, Self>, _: u64, readings: &[GpuReading], policy: &mut dyn Policy) {
        policy.sample(readings, ms(e.now));
        e.pool_sample(policy);
    }

    /// The node's core and pool sample through the gap (spread over it), so the pool's TTLs
    /// move containers one tier at a time as they would.
    #[expect(clippy::cast_precision_loss, reason = "at most 64 samples")]
    fn idle_gap(
        e: &mut Engine<'_, Self>,
        (from, resume): (f64, f64),
        n: u64,
        idle: Signals,
        policy: &mut dyn Policy,
    ) {
        let step = (resume - from) / n as f64;
        for j in 0..n {
            e.advance(from + step * j as f64);
            let readings: Vec<GpuReading> = (0..e.gpus.len())
                .map(|g| GpuReading {
                    index: gpu_index(g),
                    signals: idle,
                    memory_used: e.used_bytes(g),
                })
                .collect();
            policy.sample(&readings, ms(e.now));
            e.pool_sample(policy);
        }
    }

    /// The core hears residency from the pool, and `mqfq-sticky` reads no pool view.
    fn refresh(_: &mut Engine<'_, Self>, _: usize, _: &mut dyn Policy) {}
}

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
        .expect("a policy on the node's model has a node")
}

impl Engine<'_, NodePool> {
    /// A run's container under the node's pool: the container (an idle Hot one, else an idle
    /// Warm one, else one Warm on another GPU that a checkpoint restore can move here, else a
    /// new one) is claimed and granted to the pool once (which makes room for a restore); a
    /// container that takes memory then shows the pool the memory in use with it, as the next
    /// sample would, and the pool relieves the pressure; the run waits while its memory does
    /// not fit.
    pub(super) fn acquire_node(&mut self, r: usize, force: bool, policy: &mut dyn Policy) {
        let (g, f, claimed, inv) = {
            let run = self.runs[r].as_ref().expect("run exists");
            (run.gpu, run.func, run.container, run.current)
        };
        let c = claimed.unwrap_or_else(|| {
            let c = self
                .idle_container(f, g, Tier::Hot)
                .or_else(|| self.idle_container(f, g, Tier::Warm))
                .or_else(|| self.movable_warm(f, g))
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
            let mut until = self.bring_in(c);
            if was == Tier::Warm {
                let g = self.containers[c].gpu;
                if std::mem::take(&mut self.containers[c].moving) {
                    // Restored here only once its checkpoint on the other GPU is done.
                    self.warm.moved += 1;
                    let after = self.containers[c].evicted_until_ms + self.move_ms(g, mem);
                    until = until.max(after);
                }
                self.pool_restored(c, self.move_ms(g, mem) / 1e3, policy);
            }
            until
        };
        self.starting_up(r, until, was, policy);
    }

    /// An idle Warm container of `f` on another GPU that `mqfqd` would have the driver restore
    /// onto GPU `g` (`AdmitResponse.restore_onto`), moved there: under `--warm checkpoint` only
    /// (all its memory, context included, is on the host), between whole GPUs of one model (the
    /// same name and memory: NVML's name tells the memory variants apart). The readiest one.
    fn movable_warm(&mut self, f: usize, g: usize) -> Option<usize> {
        let whole = self.cfg.mode != scheduler_core::GpuMode::Mig;
        if self.cfg.warm != Warm::Checkpoint || !whole {
            return None;
        }
        let model = |i: usize| {
            (
                self.cfg.gpu_models.get(i).map(String::as_str),
                self.cfg.mem_mb(i).to_bits(),
            )
        };
        let c = self.by_func[f]
            .iter()
            .copied()
            .filter(|&c| {
                let c = &self.containers[c];
                c.gpu != g && !c.busy && c.tier == Tier::Warm && model(c.gpu) == model(g)
            })
            .min_by(|&a, &b| {
                self.containers[a]
                    .ready_ms
                    .total_cmp(&self.containers[b].ready_ms)
            })?;
        self.containers[c].gpu = g;
        self.containers[c].moving = true;
        Some(c)
    }

    /// Invocation `inv` runs in container `c`: the pool counts the hit and makes room when it
    /// restores (knowing the GPU's memory as it is now: here memory is taken at once, where a
    /// real container's allocations show in the next sample).
    pub(super) fn pool_grant(&mut self, c: usize, inv: usize, policy: &mut dyn Policy) {
        let g = self.containers[c].gpu;
        let memory = Input::Memory {
            gpu: gpu_index(g),
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
            gpu: gpu_index(g),
            used: bytes(self.gpus[g].used_mb + mb),
            total: bytes(self.cfg.mem_mb(g)),
        };
        let now = ms(self.now);
        let n = node(policy);
        n.step(memory, now);
        n.step(Input::Tick { host: None }, now);
        self.pool_orders(policy);
    }

    /// Invocation `inv`'s lease ended after `service_ms` in container `c`; the container stays,
    /// idle, holding its function's memory.
    pub(super) fn pool_release(
        &mut self,
        c: usize,
        (inv, service_ms): (usize, f64),
        policy: &mut dyn Policy,
    ) {
        let pooled = PooledEnd {
            key: key(c),
            paused: true,
            bytes: bytes(self.moved_mb(self.containers[c].func)),
            native: None,
            resident: None,
        };
        node(policy).release(inv, self.trace, service_ms, Some(pooled), ms(self.now));
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
                self.containers[c].evicted_until_ms = self.move_link(g, mb);
                (Some(bytes(mb)), self.move_ms(g, mb) / 1e3)
            }
            (Action::Prefetch, Tier::Warm) => {
                self.restore_idle(c);
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
